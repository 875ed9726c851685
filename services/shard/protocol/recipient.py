"""The recipient's migration document: the states of a range (or, for movePrimary, a
database's unsharded collections) arriving on this shard, and the requests that move it.

The donor's coordinator sends these to the recipient; each is decided here and recorded
in the recipient's changelog with its reply, in one transaction.

    request                 expects                 leaves
    StartReceipt            (no migration here)     cloning, with a pending range-deletion task,
                                                    and the donor's indexes it lacked, ready
                            (this one registered)   as it was (a retry: "joined")
    StartPrimaryReceipt     (no migration here)     cloning, with the donor's indexes it lacked
                            (this one registered)   as it was (a retry: "joined")
    TransferBatch           cloning                 cloning, with the batch's documents written
                                                    (clone: `stored`, the bulk clone, or `written`)
                                                    or written and removed (mods), and its
                                                    sessions' statements merged (retryable.merge_all)
    CommitClone             cloning                 clone-committed: every document of the range is here
                            clone-committed         as it was (a retry)
    FinishReceipt           any                     (forgotten); the task removed (committed) or
                                                    ready (aborted: our partial copy is orphaned)
                            (no document)           (none): finished already
    ForgetMigration         any                     (forgotten)  (donor.forget_migration)

Refusals: a start while another migration is registered (ConflictingOperationInProgress),
for a migration the config server does not show active (NoSuchMigration), or while an
overlapping range of ours still has orphans to delete (RangeDeletionPending: the donor
retries); a step for a migration with no recipient document here (NoSuchMigration); a
batch after the clone was committed (IllegalOperation); a primary move's batch naming a
collection of another database (BadValue).

The fault points returned name where a crash test may kill the recipient (before the
decision is committed): `migration.registered`, `migration.cloning`,
`migration.catching_up`, `migration.clone_committed`, `migration.range_tasks_updated`.
"""

from __future__ import annotations

from enum import StrEnum

from domain.protocol import ErrorCode
from libs.errors import CommandError
from libs.faults import reintroduced
from schemas import Record
from schemas import shard as s
from services.shard.documents import UNSHARDED_END, UNSHARDED_KEY, StoredDocument
from services.shard.protocol import index_build, range_deletion, retryable
from services.shard.protocol.common import (
    RECIPIENTS,
    Role,
    Shard,
    Step,
    document,
    joined,
    overlaps,
    primary_move_record,
    range_keys,
    range_move_record,
    unsharded_removals,
)


class RecipientState(StrEnum):
    CLONING = "cloning"  # registered: receiving the clone, then the writes made on the donor meanwhile
    CLONE_COMMITTED = "clone-committed"  # every document of the range is here; the decision is the donor's


def _not_active(shard: Shard, mid: str) -> CommandError:
    return CommandError(
        ErrorCode.NoSuchMigration,
        f"migration {mid} is not active ({shard.catalog.outcomes.get(mid, 'unknown')})",
    )


def start_receipt(shard: Shard, req: s.StartReceipt) -> Step:
    if (retry := joined(shard, req.id)) is not None:
        return retry
    if req.id not in shard.catalog.migrations:
        raise _not_active(shard, req.id)
    lo, hi = range_keys(shard.catalog, req.ns, req.min, req.max)
    for task in shard.documents.range_tasks.values():
        if reintroduced("range-deletion-deletes-owned"):
            break
        if task.ns == req.ns and overlaps(lo, hi, *range_keys(shard.catalog, task.ns, task.min, task.max)):
            # The recipient first waits for its own overlapping range deletion.
            raise CommandError(
                ErrorCode.RangeDeletionPending,
                f"{shard.id} still has orphans to delete in an overlapping range (task {task.id}); retry later",
                {"task": task.id, "pending": task.pending},
            )
    # The collection's indexes this shard lacks, before the first document arrives (seed 000
    # step 3): from then on every cloned document is indexed as it is written.
    indexes = index_build.missing_indexes(shard.documents.indexes, req.ns, req.indexes, f"migration:{req.id}")
    return Step(
        [
            *indexes,
            range_move_record(
                req.id, Role.RECIPIENT, req.ns, req.epoch, req.min, req.max, req.donor, RecipientState.CLONING.value
            ),
            range_deletion.pending(
                shard, req.id, req.ns, req.epoch, req.min, req.max, f"received from {req.donor}, not committed"
            ),
        ],
        {"id": req.id, "state": RecipientState.CLONING.value},
        fault="migration.registered",  # (a kill here: the step is decided again after restart)
    )


def start_primary_receipt(shard: Shard, req: s.StartPrimaryReceipt) -> Step:
    if (retry := joined(shard, req.id)) is not None:
        return retry
    if req.id not in shard.catalog.migrations:
        raise CommandError(ErrorCode.NoSuchMigration, f"primary move {req.id} is not active")
    indexes = [
        event
        for ns, specs in sorted(req.indexes.items())
        if ns.partition(".")[0] == req.db
        for event in index_build.missing_indexes(shard.documents.indexes, ns, specs, f"migration:{req.id}")
    ]
    return Step(
        [
            *indexes,
            primary_move_record(req.id, Role.PRIMARY_RECIPIENT, req.db, req.donor, RecipientState.CLONING.value),
        ],
        {"id": req.id, "state": RecipientState.CLONING.value},
        fault="migration.registered",
    )


def transfer_batch(shard: Shard, req: s.TransferBatch) -> Step:
    m = document(shard, req.id, RECIPIENTS, "recipient")
    if RecipientState(m.state) is not RecipientState.CLONING:
        raise CommandError(ErrorCode.IllegalOperation, f"migration {req.id} is {m.state}; no more documents accepted")
    fault = "migration.cloning" if req.phase == "clone" else "migration.catching_up"
    events: list[Record] = []
    if Role(m.role) is Role.PRIMARY_RECIPIENT:  # whole unsharded collections of the database
        if not req.ns or req.ns.partition(".")[0] != m.ns:
            raise CommandError(ErrorCode.BadValue, f"a batch of primary move {req.id} must name a collection of {m.ns}")
        events += [s.DocumentWritten(ns=req.ns, skey=UNSHARDED_KEY.hex(), doc=w["doc"]) for w in req.written]
        applied = len(events)
        events += retryable.merge_all(shard.documents.sessions, req.sessions, req.ns, UNSHARDED_KEY, UNSHARDED_END)
        events.append(m.model_copy(update={"cloned": m.cloned + len(req.written)}))
        return Step(events, {"id": req.id, "applied": applied}, fault)
    lo, hi = range_keys(shard.catalog, m.ns, m.min, m.max)
    cloned: list[StoredDocument] = []
    for key_hex, n, value in req.stored:  # the bulk clone: the donor's stored bytes, decoded by neither side
        key = bytes.fromhex(key_hex)
        if not 0 < n < len(key):
            raise CommandError(ErrorCode.BadValue, f"a stored document's shard key length {n} does not fit its key")
        if lo <= key[:n] < hi:
            cloned.append((key[:n], key[n:], value.encode()))
    for w in req.written:
        if lo <= bytes.fromhex(w["skey"]) < hi:
            events.append(s.DocumentWritten(ns=m.ns, skey=w["skey"], doc=w["doc"]))
    for r in req.removed:
        if lo <= bytes.fromhex(r["skey"]) < hi and shard.documents.find_by_id(m.ns, r["id"]) is not None:
            events.append(s.DocumentRemoved(ns=m.ns, skey=r["skey"], id=r["id"]))
    # Session migration: the transactions-table records of writes to the range, so that a retry
    # arriving here after the commit returns the recorded result (higher txnNumber wins).
    applied = len(events) + len(cloned)
    events += retryable.merge_all(shard.documents.sessions, req.sessions, m.ns, lo, hi)
    counted = (
        {"cloned": m.cloned + len(req.written) + len(req.stored)}
        if req.phase == "clone"
        else {"mods": m.mods + len(req.written) + len(req.removed)}
    )
    events.append(m.model_copy(update=counted))
    return Step(events, {"id": req.id, "applied": applied, **counted}, fault, (m.ns, cloned) if cloned else None)


def commit_clone(shard: Shard, req: s.CommitClone) -> Step:
    m = document(shard, req.id, RECIPIENTS, "recipient")
    if RecipientState(m.state) is RecipientState.CLONE_COMMITTED:
        return Step([], {"id": req.id, "state": m.state})
    done = RecipientState.CLONE_COMMITTED.value
    return Step([m.model_copy(update={"state": done})], {"id": req.id, "state": done}, "migration.clone_committed")


def finish_receipt(shard: Shard, req: s.FinishReceipt, now: float) -> Step:
    m = shard.documents.migrations.get(req.id)
    if m is None or m.role not in RECIPIENTS:
        return Step([], {"id": req.id, "state": "forgotten"})
    events: list[Record] = [s.MigrationForgotten(id=req.id)]
    if Role(m.role) is Role.PRIMARY_RECIPIENT and not req.committed:
        events += unsharded_removals(shard, m.ns)  # the aborted move's copies
    task = shard.documents.range_tasks.get(req.id)
    if task is not None:
        if req.committed:  # the documents are ours now
            events.append(s.RangeDeletionRemoved(id=req.id))
        else:  # an aborted migration's copies are orphans
            events.append(
                range_deletion.ready(task, now, shard.catalog.config_time, why=f"migration from {m.peer} aborted")
            )
    return Step(events, {"id": req.id, "state": "forgotten"}, "migration.range_tasks_updated")
