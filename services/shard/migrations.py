"""A shard's decisions in the migration protocol (seed 004) and for range deletion.

The donor's coordinator (`donor.py`) drives a migration by sending these requests
to its own shard and to the recipient; each is decided here, against the shard's
migration documents and range-deletion tasks, and recorded in the changelog in
the same transaction as its reply — so a crash leaves either the whole step or
none of it, and replay rebuilds where the migration stood.

The critical section is a state of the donor's migration document: while it is
"critical" writes to the range are refused with a retriable StaleConfig (the
router waits for the next ConfigTime, the commit or the abort, and retries), and
while "committing" reads are refused too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from domain.protocol import ErrorCode
from domain.shardkey import from_ejson
from libs.commands import CommandError, Decision
from libs.faults import fault_point
from schemas import Record
from schemas import shard as s
from services.shard.documents import UNSHARDED_END, UNSHARDED_KEY, shard_key_part

if TYPE_CHECKING:
    from services.shard.decide import ShardDecider

BLOCKS_WRITES = ("critical", "committing")
BLOCKS_READS = ("committing",)


def overlaps(a_lo: bytes, a_hi: bytes, b_lo: bytes, b_hi: bytes) -> bool:
    return a_lo < b_hi and b_lo < a_hi


class MigrationDecisions:
    """Mixed into ShardDecider: the migration and range-deletion requests."""

    # --------------------------------------------------------- critical section

    def _range_keys(self: ShardDecider, ns: str, lo: dict, hi: dict) -> tuple[bytes, bytes]:
        coll = self.catalog.collections.get(ns)
        if coll is None:
            raise CommandError(ErrorCode.NamespaceNotFound, f"{ns} is not sharded")
        return coll.pattern.encode_bound(from_ejson(lo)), coll.pattern.encode_bound(from_ejson(hi))

    def blocked_ranges(self: ShardDecider, ns: str, reads: bool) -> list[tuple[bytes, bytes]]:
        """Ranges of `ns` this shard may not serve now: its donations in their critical section."""
        states = BLOCKS_READS if reads else BLOCKS_WRITES
        return [
            self._range_keys(m.ns, m.min, m.max)
            for m in self.documents.migrations.values()
            if m.ns == ns and m.role == "donor" and m.state in states and m.decision is None
        ]

    def primary_blocked(self: ShardDecider, ns: str, reads: bool) -> bool:
        """An unsharded collection whose database's primary is moving away: writes wait from
        the start of the move (it has no mods phase), reads once it commits."""
        db = ns.partition(".")[0]
        states = BLOCKS_READS if reads else ("critical", "committing")
        return any(
            m.role == "primary-donor" and m.ns == db and m.state in states and m.decision is None
            for m in self.documents.migrations.values()
        )

    def _critical(self: ShardDecider, ns: str, what: str) -> CommandError:
        # Retriable: the router waits for the next ConfigTime (the commit or the abort) and retries.
        return CommandError(
            ErrorCode.StaleConfig,
            f"{self.shard_id}: {what} of {ns} waits for a migration's critical section",
            {"shard": self.shard_id, "configTime": self.catalog.config_time + 1, "critical": True},
        )

    # ------------------------------------------------------------------ donor

    def start_donation(self: ShardDecider, req: s.StartDonation) -> Decision:
        if (mine := self._busy(req.id)) is not None:
            return Decision([], {"id": req.id, "state": mine.state, "joined": True})
        coll = self.catalog.collections.get(req.ns)
        if coll is None or coll.epoch != req.epoch:
            raise CommandError(ErrorCode.StaleEpoch, f"{req.ns} is not at epoch {req.epoch} on {self.shard_id}")
        lo, hi = self._range_keys(req.ns, req.min, req.max)
        chunk = coll.chunks[coll.chunk_index(lo)]
        if chunk.shard != self.shard_id or not (chunk.min_key <= lo < hi <= chunk.max_key):
            raise CommandError(
                ErrorCode.StaleConfig,
                f"{self.shard_id} does not own all of the range of migration {req.id}",
                {"shard": self.shard_id, "configTime": self.catalog.config_time},
            )
        common = dict(id=req.id, ns=req.ns, epoch=req.epoch, min=req.min, max=req.max)
        return Decision(
            [
                s.MigrationRecorded(**common, role="donor", peer=req.recipient, state="cloning"),
                s.RangeDeletionRecorded(**common, why=f"donated to {req.recipient}"),
            ],
            {"id": req.id, "state": "cloning"},
        )

    def start_primary_move(self: ShardDecider, req: s.StartPrimaryMove) -> Decision:
        if (mine := self._busy(req.id)) is not None:
            return Decision([], {"id": req.id, "state": mine.state, "joined": True})
        db = self.catalog.databases.get(req.db)
        if db is None or db.primary != self.shard_id:
            raise CommandError(
                ErrorCode.StaleConfig,
                f"{self.shard_id} is not the primary of {req.db}",
                {"shard": self.shard_id, "configTime": self.catalog.config_time},
            )
        return Decision(
            [
                s.MigrationRecorded(
                    id=req.id,
                    role="primary-donor",
                    ns=req.db,
                    epoch="",
                    min={},
                    max={},
                    peer=req.recipient,
                    state="critical",
                )
            ],
            {"id": req.id, "state": "critical"},
        )

    def start_primary_receipt(self: ShardDecider, req: s.StartPrimaryReceipt) -> Decision:
        if (mine := self._busy(req.id)) is not None:
            return Decision([], {"id": req.id, "state": mine.state, "joined": True})
        if req.id not in self.catalog.migrations:
            raise CommandError(ErrorCode.NoSuchMigration, f"primary move {req.id} is not active")
        fault_point("migration.registered")
        return Decision(
            [
                s.MigrationRecorded(
                    id=req.id,
                    role="primary-recipient",
                    ns=req.db,
                    epoch="",
                    min={},
                    max={},
                    peer=req.donor,
                    state="cloning",
                )
            ],
            {"id": req.id, "state": "cloning"},
        )

    def _unsharded_removals(self: ShardDecider, db: str) -> list[Record]:
        """Removals of every document of `db`'s unsharded collections held here."""
        d = self.catalog.databases.get(db)
        out: list[Record] = []
        for ns in sorted(d.collections if d else ()):
            for _k, doc in self.documents.scan(ns, UNSHARDED_KEY, UNSHARDED_END):
                out.append(s.DocumentRemoved(ns=ns, skey=UNSHARDED_KEY.hex(), id=doc["_id"]))
        return out

    def enter_critical_section(self: ShardDecider, req: s.EnterCriticalSection) -> Decision:
        m = self._migration(req.id, "donor")
        state = "committing" if req.reads else "critical"
        return Decision([m.model_copy(update={"state": state})], {"id": req.id, "state": state})

    def record_decision(self: ShardDecider, req: s.RecordDecision) -> Decision:
        m = self.documents.migrations.get(req.id)
        if m is None or m.role not in ("donor", "primary-donor"):
            return Decision([], {"id": req.id, "state": "forgotten"})  # decided and forgotten already
        decision = "committed" if req.committed else "aborted"
        if m.decision is not None:
            if m.decision != decision:
                raise CommandError(ErrorCode.IllegalOperation, f"migration {req.id} was already {m.decision}")
            return Decision([], {"id": req.id, "state": m.state})
        events: list[Record] = [m.model_copy(update={"state": "decided", "decision": decision})]
        if m.role == "primary-donor" and req.committed:
            # Our copies of the unsharded collections are the old primary's: delete them now
            # (they are never read again: routers and this shard send them to the new primary).
            events += self._unsharded_removals(m.ns)
        task = self.documents.range_tasks.get(req.id)
        if task is not None:
            if req.committed:  # the donor's copy is orphaned now
                events.append(
                    task.model_copy(update={"pending": False, "readyAt": time.time(), "configTime": req.configTime})
                )
            else:
                events.append(s.RangeDeletionRemoved(id=req.id))
        return Decision(events, {"id": req.id, "state": "decided", "decision": decision})

    # -------------------------------------------------------------- recipient

    def start_receipt(self: ShardDecider, req: s.StartReceipt) -> Decision:
        if (mine := self._busy(req.id)) is not None:
            return Decision([], {"id": req.id, "state": mine.state, "joined": True})
        if req.id not in self.catalog.migrations:
            raise CommandError(
                ErrorCode.NoSuchMigration,
                f"migration {req.id} is not active ({self.catalog.outcomes.get(req.id, 'unknown')})",
            )
        lo, hi = self._range_keys(req.ns, req.min, req.max)
        for task in self.documents.range_tasks.values():
            if task.ns == req.ns and overlaps(lo, hi, *self._range_keys(task.ns, task.min, task.max)):
                # seed 004: the recipient first waits for its own overlapping range deletion
                raise CommandError(
                    ErrorCode.RangeDeletionPending,
                    f"{self.shard_id} still has orphans to delete in an "
                    f"overlapping range (task {task.id}); retry later",
                    {"task": task.id, "pending": task.pending},
                )
        fault_point("migration.registered")  # (a kill here: the step is decided again after restart)
        common = dict(id=req.id, ns=req.ns, epoch=req.epoch, min=req.min, max=req.max)
        return Decision(
            [
                s.MigrationRecorded(**common, role="recipient", peer=req.donor, state="cloning"),
                s.RangeDeletionRecorded(**common, why=f"received from {req.donor}, not committed"),
            ],
            {"id": req.id, "state": "cloning"},
        )

    def transfer_batch(self: ShardDecider, req: s.TransferBatch) -> Decision:
        m = self._migration(req.id, "recipient")
        if m.state != "cloning":
            raise CommandError(
                ErrorCode.IllegalOperation, f"migration {req.id} is {m.state}; no more documents accepted"
            )
        fault_point("migration.cloning" if req.phase == "clone" else "migration.catching_up")
        events: list[Record] = []
        if m.role == "primary-recipient":  # whole unsharded collections of the database
            if not req.ns or req.ns.partition(".")[0] != m.ns:
                raise CommandError(
                    ErrorCode.BadValue, f"a batch of primary move {req.id} must name a collection of {m.ns}"
                )
            events += [s.DocumentWritten(ns=req.ns, skey=UNSHARDED_KEY.hex(), doc=w["doc"]) for w in req.written]
            events.append(m.model_copy(update={"cloned": m.cloned + len(req.written)}))
            return Decision(events, {"id": req.id, "applied": len(events) - 1})
        lo, hi = self._range_keys(m.ns, m.min, m.max)
        for w in req.written:
            skey = bytes.fromhex(w["skey"])
            if lo <= skey < hi:
                events.append(s.DocumentWritten(ns=m.ns, skey=w["skey"], doc=w["doc"]))
        for r in req.removed:
            if lo <= bytes.fromhex(r["skey"]) < hi and self.documents.find_by_id(m.ns, r["id"]) is not None:
                events.append(s.DocumentRemoved(ns=m.ns, skey=r["skey"], id=r["id"]))
        counted = (
            {"cloned": m.cloned + len(req.written)}
            if req.phase == "clone"
            else {"mods": m.mods + len(req.written) + len(req.removed)}
        )
        events.append(m.model_copy(update=counted))
        return Decision(events, {"id": req.id, "applied": len(events) - 1, **counted})

    def commit_clone(self: ShardDecider, req: s.CommitClone) -> Decision:
        m = self._migration(req.id, "recipient")
        if m.state == "clone-committed":
            return Decision([], {"id": req.id, "state": m.state})
        fault_point("migration.clone_committed")
        return Decision([m.model_copy(update={"state": "clone-committed"})], {"id": req.id, "state": "clone-committed"})

    def finish_receipt(self: ShardDecider, req: s.FinishReceipt) -> Decision:
        m = self.documents.migrations.get(req.id)
        if m is None or m.role not in ("recipient", "primary-recipient"):
            return Decision([], {"id": req.id, "state": "forgotten"})
        fault_point("migration.range_tasks_updated")
        events: list[Record] = [s.MigrationForgotten(id=req.id)]
        if m.role == "primary-recipient" and not req.committed:
            events += self._unsharded_removals(m.ns)  # the aborted move's copies
        task = self.documents.range_tasks.get(req.id)
        if task is not None:
            if req.committed:  # the documents are ours now
                events.append(s.RangeDeletionRemoved(id=req.id))
            else:  # an aborted migration's copies are orphans
                events.append(
                    task.model_copy(
                        update={
                            "pending": False,
                            "readyAt": time.time(),
                            "configTime": self.catalog.config_time,
                            "why": f"migration from {m.peer} aborted",
                        }
                    )
                )
        return Decision(events, {"id": req.id, "state": "forgotten"})

    # ------------------------------------------------------------------ both

    def forget_migration(self: ShardDecider, req: s.ForgetMigration) -> Decision:
        m = self.documents.migrations.get(req.id)
        if m is None:
            return Decision([], {"id": req.id, "state": "forgotten"})
        if m.role in ("donor", "primary-donor") and m.decision is None:
            raise CommandError(ErrorCode.IllegalOperation, f"migration {req.id} is not decided yet")
        return Decision([s.MigrationForgotten(id=req.id)], {"id": req.id, "state": "forgotten"})

    def list_migrations(self: ShardDecider, req: s.ListMigrations) -> Decision:
        tasks = []
        for t in self.documents.range_tasks.values():
            left = self._docs_in_range(t) if t.ns in self.catalog.collections else None
            tasks.append(
                {
                    **t.model_dump(exclude={"type", "v"}),
                    "shard": self.shard_id,
                    "left": left,
                    "waiting": self._waiting_for(t),
                }
            )
        return Decision(
            [],
            {
                "shard": self.shard_id,
                "migrations": [m.model_dump(exclude={"type", "v"}) for m in self.documents.migrations.values()],
                "rangeDeletions": tasks,
                "progress": dict(self.progress),
            },
        )

    def _busy(self: ShardDecider, mid: str) -> s.MigrationRecorded | None:
        """This migration's document if it is already registered; refuses if another one is."""
        for m in self.documents.migrations.values():
            if m.id == mid:
                return m
            raise CommandError(
                ErrorCode.ConflictingOperationInProgress,
                f"{self.shard_id} already takes part in migration {m.id} ({m.role}, {m.state}); "
                f"a shard runs one migration at a time",
            )
        return None

    def _migration(self: ShardDecider, mid: str, role: str) -> s.MigrationRecorded:
        m = self.documents.migrations.get(mid)
        if m is None or m.role not in (role, f"primary-{role}"):
            raise CommandError(ErrorCode.NoSuchMigration, f"{self.shard_id} has no {role} document for migration {mid}")
        if m.decision is not None:
            raise CommandError(ErrorCode.IllegalOperation, f"migration {mid} was already {m.decision}")
        return m

    # -------------------------------------------------------------- deletion

    def _docs_in_range(self: ShardDecider, task: s.RangeDeletionRecorded) -> int:
        lo, hi = self._range_keys(task.ns, task.min, task.max)
        return self.documents.count_range(task.ns, lo, hi)

    def _waiting_for(self: ShardDecider, task: s.RangeDeletionRecorded) -> str | None:
        """Why the task may not delete now (None: it may), apart from the cleanup delay,
        which the range deleter keeps."""
        if task.pending:
            return "its migration is not decided yet"
        self._expire_cursors()  # an abandoned cursor stops holding the range after the cursor timeout
        open_before = [c for c in self.cursors.values() if c.ns == task.ns and c.config_time < task.configTime]
        if open_before:
            return (
                f"{len(open_before)} quer{'y' if len(open_before) == 1 else 'ies'} started before the migration "
                f"committed still read{'s' if len(open_before) == 1 else ''} the range"
            )
        return None

    def delete_range_batch(self: ShardDecider, req: s.DeleteRangeBatch) -> Decision:
        task = self.documents.range_tasks.get(req.task)
        if task is None:
            return Decision([], {"task": req.task, "deleted": 0, "done": True})
        if task.ns not in self.catalog.collections:  # dropped since: nothing of it is ours to keep
            return Decision([s.RangeDeletionRemoved(id=task.id)], {"task": req.task, "deleted": 0, "done": True})
        if (why := self._waiting_for(task)) is not None:
            return Decision([], {"task": req.task, "deleted": 0, "done": False, "waiting": why})
        lo, hi = self._range_keys(task.ns, task.min, task.max)
        coll = self.catalog.collections.get(task.ns)
        events: list[Record] = []
        for k, doc in self.documents.scan(task.ns, lo, hi):
            skey = shard_key_part(k, doc)
            if self._owns(coll, skey):
                continue  # never delete what this shard owns (the range came back)
            events.append(s.DocumentRemoved(ns=task.ns, skey=skey.hex(), id=doc["_id"]))
            if len(events) >= req.limit:
                break
        deleted = task.deleted + len(events)
        done = len(events) < req.limit
        events.append(s.RangeDeletionRemoved(id=task.id) if done else task.model_copy(update={"deleted": deleted}))
        return Decision(events, {"task": req.task, "deleted": len(events) - 1, "total": deleted, "done": done})
