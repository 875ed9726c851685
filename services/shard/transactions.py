"""The shard's driver of its transaction records (protocol/transaction.py; decisions/0020):
how a statement of a transaction is decided on the snapshot with the transaction's own writes
laid over it, what conflicts, and what a commit checks before it stamps.

A statement is decided by the shard's ordinary request code, on the documents as the
transaction sees them: its own pending writes applied tentatively (and taken back after), every
document written by others since the snapshot checked first (a statement that could touch one
is a WriteConflict: first writer wins), and the documents another open transaction holds
refused.  The writes it decides become the transaction's record, not documents."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from domain import clock as vclock
from domain.protocol import ErrorCode
from domain.query import QueryError, compile_filter
from domain.shardkey import ShardKeyError, encode_value
from libs.commands import CommandError, Decision
from libs.faults import fault_point, reintroduced
from schemas import Record, Tombstone
from schemas import ddl as dd
from schemas import shard as s
from services.shard.documents import XACT_KEY, coordinator_key
from services.shard.protocol import transaction as txns

if TYPE_CHECKING:
    from services.shard.decide import ShardDecider

TXN_STATEMENTS = (s.Insert, s.Update, s.Delete, s.FindAndModify, s.Find)


def decide_statement(d: ShardDecider, req: Any, run: Callable[[Record], Decision]) -> Decision:
    """`req` (a statement carrying `txn`) decided in its transaction: its reply, and the
    transaction's record with the statement's writes (the only event, beside a rekey's or a
    snapshot read's no-op)."""
    txn: s.Txn = req.txn
    record = txns.begin_statement(d.documents.txns.get(txn.lsid), txn, d.wall())
    vclock.check_snapshot_floor(record.readAt, d.catalog.snapshot_floor(req.ns))
    vclock.check_history_kept(record.readAt, d.documents.readable_from(req.ns))
    rekey = d._rekey_events(req.ns)
    saved = d.documents.tentative()
    try:
        for e in [*rekey, *txns.pending(record)]:
            d.documents.apply(e, -1)
        if isinstance(req, s.Find):
            decision = _find(d, req, record.readAt)
        else:
            _refuse_if_written_since(d, req, record.readAt)
            decision = run(req)
            _refuse_if_moved(d, decision.events, record.readAt)
            _refuse_if_held(d, decision.events, txn.lsid)
    finally:
        d.documents.restore(saved)
    writes = [e for e in decision.events if isinstance(e, (s.DocumentWritten, s.DocumentRemoved))]
    others = [e for e in decision.events if not isinstance(e, (s.DocumentWritten, s.DocumentRemoved))]
    after = txns.with_writes(record, writes)
    recorded = [after] if after is not d.documents.txns.get(txn.lsid) else []
    return Decision([*rekey, *others, *recorded], decision.result)


def _find(d: ShardDecider, req: s.Find, read_at: int) -> Decision:
    """A read in the transaction: the snapshot with its own writes, read in full now (a later
    getMore would no longer see them laid over the snapshot)."""
    decision = d._find_at(req, read_at)
    cursor_id = (decision.result or {}).get("cursorId", 0)
    if cursor_id and (cursor := d.cursors.get(cursor_id)) is not None:
        cursor.docs = iter(list(cursor.docs))
    return decision


def _refuse_if_written_since(d: ShardDecider, req: Any, read_at: int) -> None:
    """First writer wins: a statement that could touch a document written by others since the
    snapshot (it matches as it was or as it is, or an insert reuses its _id) conflicts.  One
    that came with a migration since is MigrationConflict (the snapshot's owner was another)."""
    changed = list(d.documents.changed_since(req.ns, read_at))
    if not changed or reintroduced("txn-first-writer-does-not-win"):
        return
    if isinstance(req, s.Insert):
        ids = {encode_value(doc["_id"]) for doc in req.docs if isinstance(doc, dict) and "_id" in doc}
        hits = [v for pair in changed for v in pair if v is not None and encode_value(v["_id"]) in ids]
    else:
        flt = req.query if isinstance(req, s.FindAndModify) else req.filter
        try:
            matcher = compile_filter(flt)
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        hits = [v for pair in changed for v in pair if v is not None and matcher.matches(v)]
    if not hits:
        return
    if (coll := d.catalog.collections.get(req.ns)) is not None:
        for doc in hits:
            try:
                key = coll.pattern.encode_doc(doc)
            except ShardKeyError:
                continue  # not placeable under the key: it did not come with a migration
            txns.check_not_moved(coll, key, read_at)
    raise txns.write_conflict(f"a document of {req.ns} was written after the transaction's snapshot")


def _refuse_if_moved(d: ShardDecider, events: Iterable[Record], read_at: int) -> None:
    """A write to a range that migrated since the snapshot is MigrationConflict: the transaction's
    reads go to the owners at its snapshot, which would not see it."""
    for e in events:
        if isinstance(e, (s.DocumentWritten, s.DocumentRemoved)):
            txns.check_not_moved(d.catalog.collections.get(e.ns), bytes.fromhex(e.skey), read_at)


def _refuse_if_held(d: ShardDecider, events: Iterable[Record], lsid: str | None) -> None:
    """A write to a document another open transaction wrote conflicts (for a write outside any
    transaction, `lsid` None, the router retries it until the holder ends)."""
    if not d.documents.txn_locks or (lsid is not None and reintroduced("txn-first-writer-does-not-win")):
        return
    for e in events:
        if isinstance(e, s.DocumentWritten):
            holder = d.documents.txn_holder(e.ns, e.doc["_id"])
        elif isinstance(e, s.DocumentRemoved):
            holder = d.documents.txn_holder(e.ns, e.id)
        else:
            continue
        if holder is not None and holder != lsid:
            raise txns.write_conflict(f"a document of {e.ns} is written by an open transaction")


def refuse_if_held(d: ShardDecider, events: Iterable[Record]) -> None:
    """Writes outside any transaction meet the documents open transactions hold."""
    _refuse_if_held(d, events, None)


def commit(d: ShardDecider, req: s.CommitTransaction) -> Decision:
    """Every write of the transaction stamped with one tick (a prepared one's: the coordinator's
    commitAt), if the shard may still apply them all: no written document's range migrated and
    no namespace it wrote was dropped or renamed since the snapshot, and no critical section
    holds one.  Otherwise an error, the transaction still open: the router aborts it.  (A
    prepared one was checked when it voted.)"""
    if req.commitAt is not None:
        fault_point("txn.participant.committing")
    current, ts = _stamp_if_applicable(d, req.lsid, req.txnNumber)
    events, committed_at = txns.commit(current, req, ts)
    return Decision(events, {"committedAt": committed_at})


def prepare(d: ShardDecider, req: s.PrepareTransaction) -> Decision:
    """This participant's vote: yes (a prepare stamp, its writes held until the decision) if it
    may still apply them all, as a commit checks; no (an error) otherwise."""
    fault_point("txn.participant.preparing")  # (dies before its batch commits: the vote is asked again)
    current, ts = _stamp_if_applicable(d, req.lsid, req.txnNumber)
    events, prepared_at = txns.prepare(current, req, ts)
    return Decision(events, {"prepareTimestamp": prepared_at})


def _stamp_if_applicable(d: ShardDecider, lsid: str, txn_number: int) -> tuple[s.TxnRecorded | None, int | None]:
    """The session's record, and a fresh stamp if it is this transaction in progress and the
    shard may still apply all its writes (else the check's error); no stamp otherwise (a retry,
    or a state the pure transition answers)."""
    current = d.documents.txns.get(lsid)
    if current is None or current.txnNumber != txn_number or current.state != "in-progress":
        return current, None
    _check_still_applicable(d, current)
    return current, d.clock.tick() if d.clock is not None else None


def coordinate(d: ShardDecider, req: s.CoordinateCommitTransaction) -> Decision:
    if req.participants and d.shard_id not in req.participants:
        raise CommandError(ErrorCode.InvalidOptions, f"{d.shard_id} coordinates only transactions it takes part in")
    current = d.documents.coordinators.get((req.lsid, req.txnNumber))
    events, result = txns.coordinate(current, d.documents.txns.get(req.lsid), req)
    return Decision(events, result)


def advance(d: ShardDecider, req: s.AdvanceTxnCoordinator) -> Decision:
    removal = Tombstone(key=coordinator_key(req.lsid, req.txnNumber))
    return Decision(txns.advance(d.documents.coordinators.get((req.lsid, req.txnNumber)), req, removal), {})


def refuse_if_prepared(d: ShardDecider, ns: str, at: int | None = None) -> None:
    """A read that could meet a prepared transaction's documents waits for its decision (the
    router asks again): read now, it could see the documents before the commit at a time
    after the commit's stamp."""
    if d.documents.prepared_in(ns, at):
        raise CommandError(
            ErrorCode.PrepareConflict, f"a prepared transaction holds documents of {ns}: waiting for its decision"
        )


def refuse_read_if_prepared(d: ShardDecider, ns: str, at: int | None = None) -> None:
    """A find's wait for prepared transactions (the mutation `txn-reads-past-prepare` skips it:
    reads only, writes and critical sections still wait)."""
    if not reintroduced("txn-reads-past-prepare"):
        refuse_if_prepared(d, ns, at)


def _check_still_applicable(d: ShardDecider, record: s.TxnRecorded) -> None:
    """Nothing of the transaction lands where its snapshot no longer holds: in a namespace
    dropped or renamed since (SnapshotUnavailable; a DDL's critical section ends such a
    transaction already), or in a range that migrated since (MigrationConflict)."""
    for w in record.writes:
        coll = d.catalog.collections.get(w.ns)
        skey = bytes.fromhex(w.skey)
        vclock.check_snapshot_floor(record.readAt, d.catalog.snapshot_floor(w.ns))
        vclock.check_history_kept(record.readAt, d.documents.readable_from(w.ns))
        txns.check_not_moved(coll, skey, record.readAt)
        if coll is not None and any(lo <= skey < hi for lo, hi in d.migrations.blocked_ranges(w.ns, reads=False)):
            raise d.migrations.critical_section_wait(w.ns, "a transaction's commit")
        if coll is None and d.migrations.primary_blocked(w.ns, reads=False):
            raise d.migrations.critical_section_wait(w.ns, "a transaction's commit")


def abort(d: ShardDecider, req: s.AbortTransaction) -> Decision:
    return Decision(txns.abort(d.documents.txns.get(req.lsid), req), {})


def forget(d: ShardDecider, lsids: Iterable[str], before: float) -> tuple[list[Record], list[str]]:
    """The session reaper's removal of expired sessions' ended transactions (an open one stays:
    the lifetime reaper or its coordinator ends it first), and their sessions."""
    gone = [
        lsid
        for lsid in dict.fromkeys(lsids)
        if (r := d.documents.txns.get(lsid)) is not None
        and r.state in ("committed", "aborted")
        and r.startedAt < before
    ]
    return [Tombstone(key=XACT_KEY + lsid.encode()) for lsid in gone], gone


def ended_by_ddl(d: ShardDecider, req: dd.EnterDDLCriticalSection) -> list[Record]:
    """The aborts, recorded with a DDL's critical section, of the transactions in progress that
    wrote in its namespaces."""
    return txns.ended_by_ddl(d.documents.txns.values(), req.namespaces, req.db)


def refuse_critical_section_if_prepared(
    d: ShardDecider, req: s.EnterCriticalSection | dd.EnterDDLCriticalSection
) -> None:
    """A critical section waits for the prepared transactions of its namespaces: a DDL's
    coordinator and a migration's donor ask again (PrepareConflict).  Committed after the section, their writes would land in a
    range given away or a collection dropped."""
    if not d.documents.prepared:
        return
    if isinstance(req, s.EnterCriticalSection):
        m = d.documents.migrations.get(req.id)
        namespaces = [m.ns] if m is not None else []
    else:
        namespaces = list(req.namespaces)
        if req.db is not None:
            namespaces += [
                w.ns for t in d.documents.prepared.values() for w in t.writes if w.ns.startswith(req.db + ".")
            ]
    for ns in namespaces:
        refuse_if_prepared(d, ns)
