"""A shard's migration and range-deletion requests: the driver of `protocol`'s transitions.

The donor's coordinator (`donor.py`) drives a migration by sending requests to its own
shard and to the recipient, and the range deleter sends DeleteRangeBatch; each is decided
by its role's pure transition (`protocol/donor.py`, `recipient.py`, `range_deletion.py`)
against the shard's migration documents and range-deletion tasks, and recorded in the
changelog in the same transaction as its reply.

What a transition may not do itself is done here: read the clock, count the shard's
open queries (its cursors) and fire the fault point it names, while the request is
decided, so before its transaction commits, as the crash tests expect.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from domain.catalog import Catalog
from domain.protocol import record_bytes
from libs.commands import CommandError, Decision
from libs.dispatch import Dispatch
from libs.faults import fault_point
from schemas import Record
from schemas import shard as s
from services.shard.documents import ClonedDocuments, ShardDocuments
from services.shard.protocol import donor, range_deletion, recipient
from services.shard.protocol.common import Shard, range_keys
from services.shard.protocol.range_deletion import OpenQueries

on_request: Dispatch[MigrationDecider, Decision] = Dispatch("shard migration request")


class MigrationDecider:
    """The migration and range-deletion requests of one shard; composed into ShardDecider."""

    def __init__(
        self,
        shard_id: str,
        catalog: Catalog,
        documents: ShardDocuments,
        open_queries: OpenQueries,
        *,
        clock: Callable[[], float] = lambda: time.time(),  # (looked up at each call: the simulator's)
        fault: Callable[[str], None] = fault_point,
        client_busy: Callable[[], bool] = lambda: False,
    ):
        self.shard = Shard(shard_id, catalog, documents)
        self.documents = documents
        self.open_queries, self.clock, self.fault = open_queries, clock, fault
        # Whether clients' requests were served lately: a clone batch's reply tells the donor,
        # whose throttle (migrationThrottleUnderLoad) holds back while either shard is busy.
        self.client_busy = client_busy
        self.progress: dict[str, dict[str, Any]] = {}  # live progress of this shard's donations, by migration id

    @staticmethod
    def handles(req: Record) -> bool:
        return on_request.handles(req)

    def decide(self, req: Record) -> Decision:
        return on_request(self, req)

    # ------------------------------------------------ the critical section, for CRUD

    def blocked_ranges(self, ns: str, reads: bool) -> list[tuple[bytes, bytes]]:
        return donor.blocked_ranges(self.shard, ns, reads)

    def primary_blocked(self, ns: str, reads: bool) -> bool:
        return donor.primary_blocked(self.shard, ns, reads)

    def critical_section_wait(self, ns: str, what: str) -> CommandError:
        return donor.critical_section_wait(self.shard, ns, what)

    # ------------------------------------------------------------------- donor

    @on_request.register(s.StartDonation)
    def _start_donation(self, req: s.StartDonation) -> Decision:
        return donor.start_donation(self.shard, req).decision(self.fault)

    @on_request.register(s.StartPrimaryMove)
    def _start_primary_move(self, req: s.StartPrimaryMove) -> Decision:
        return donor.start_primary_move(self.shard, req).decision(self.fault)

    @on_request.register(s.EnterCriticalSection)
    def _enter_critical_section(self, req: s.EnterCriticalSection) -> Decision:
        return donor.enter_critical_section(self.shard, req).decision(self.fault)

    @on_request.register(s.RecordDecision)
    def _record_decision(self, req: s.RecordDecision) -> Decision:
        return donor.record_decision(self.shard, req, now=self.clock()).decision(self.fault)

    @on_request.register(s.ForgetMigration)
    def _forget_migration(self, req: s.ForgetMigration) -> Decision:
        return donor.forget_migration(self.shard, req).decision(self.fault)

    # --------------------------------------------------------------- recipient

    @on_request.register(s.StartReceipt)
    def _start_receipt(self, req: s.StartReceipt) -> Decision:
        return recipient.start_receipt(self.shard, req).decision(self.fault)

    @on_request.register(s.StartPrimaryReceipt)
    def _start_primary_receipt(self, req: s.StartPrimaryReceipt) -> Decision:
        return recipient.start_primary_receipt(self.shard, req).decision(self.fault)

    @on_request.register(s.TransferBatch)
    def _transfer_batch(self, req: s.TransferBatch) -> Decision:
        span = trace.get_current_span()  # the recipient's span of this batch, in the migration's trace
        if span.is_recording():
            span.set_attributes(
                {
                    "shardlog.migration.id": req.id,
                    "shardlog.migration.phase": req.phase,
                    "shardlog.documents": len(req.written) + len(req.removed) + len(req.stored),
                    "shardlog.bytes": sum(record_bytes(w["doc"]) for w in req.written)
                    + sum(len(v.encode()) for _, _, v in req.stored),
                }
            )
        step = recipient.transfer_batch(self.shard, req)
        decision = step.decision(self.fault)
        if step.cloned is not None:
            decision.bulk = ClonedDocuments(self.documents, *step.cloned)
        if req.phase == "clone" and decision.result is not None:
            decision.result["busy"] = self.client_busy()
        return decision

    @on_request.register(s.CommitClone)
    def _commit_clone(self, req: s.CommitClone) -> Decision:
        return recipient.commit_clone(self.shard, req).decision(self.fault)

    @on_request.register(s.FinishReceipt)
    def _finish_receipt(self, req: s.FinishReceipt) -> Decision:
        return recipient.finish_receipt(self.shard, req, now=self.clock()).decision(self.fault)

    # ---------------------------------------------------------- range deletion

    @on_request.register(s.DeleteRangeBatch)
    def _delete_range_batch(self, req: s.DeleteRangeBatch) -> Decision:
        decision = range_deletion.delete_batch(self.shard, req, self.open_queries).decision(self.fault)
        span = trace.get_current_span()
        if span.is_recording() and decision.result:
            span.set_attributes({"shardlog.task.id": req.task, "shardlog.documents": decision.result.get("deleted", 0)})
        return decision

    # ------------------------------------------------------------------ status

    @on_request.register(s.ListMigrations)
    def _list_migrations(self, req: s.ListMigrations) -> Decision:
        """Read-only: the migration documents, the range-deletion tasks (with the documents
        left to delete and what each waits for) and the live progress of donations."""
        shard = self.shard
        tasks = []
        for t in self.documents.range_tasks.values():
            left = None
            if t.ns in shard.catalog.collections:
                lo, hi = range_keys(shard.catalog, t.ns, t.min, t.max)
                left = self.documents.count_range(t.ns, lo, hi)
            open_before = self.open_queries(t.ns, t.configTime) if not t.pending else 0
            tasks.append(
                {
                    **t.model_dump(exclude={"type", "v"}),
                    "shard": shard.id,
                    "left": left,
                    "waiting": range_deletion.waiting_for(t, open_before),
                }
            )
        return Decision(
            [],
            {
                "shard": shard.id,
                "migrations": [m.model_dump(exclude={"type", "v"}) for m in self.documents.migrations.values()],
                "rangeDeletions": tasks,
                "progress": dict(self.progress),
            },
        )


REQUESTS: tuple[type, ...] = tuple(on_request.table)
