"""A shard's part in a multi-document transaction (issue 33, docs/decisions/0020), as pure
transitions of its record, `TxnRecorded`, keyed by the session:

    state         statement               PrepareTransaction     CommitTransaction          AbortTransaction
    (none)        -> in-progress (begin)  NoSuchTransaction      NoSuchTransaction          NoSuchTransaction
    in-progress   -> in-progress (+writes) -> prepared (a stamp) -> committed (one stamp)   -> aborted
    prepared      PreparedTransaction...  prepared (same vote)   -> committed (at commitAt) -> aborted
    committed     TransactionCommitted    TransactionCommitted   committed (a retry: same)  TransactionCommitted
    aborted       NoSuchTransaction       NoSuchTransaction      NoSuchTransaction          aborted (a retry: same)

A statement with a newer txnNumber begins afresh (the older transaction's writes are dropped
with its record, as MongoDB aborts it); an older one is TransactionTooOld.  Only a prepared
transaction's coordinator ends it: its statements, and the lifetime reaper, leave it be.

The coordinator of a two-phase commit (`TxnCoordinatorRecorded`, on the first participant that
wrote), and what its driver (services/shard/coordinator.py) does in each state:

    preparing   PrepareTransaction to every participant; all vote yes -> committing (commitAt:
                the largest prepare stamp); any votes no -> aborting
    committing  CommitTransaction(commitAt) to every participant, until each answers -> done
    aborting    AbortTransaction to every participant, until each answers -> done
    done        the decision kept, for a retried commitTransaction

Nothing here reads a store or a clock: the shard's decider (services/shard/decide.py) and the
driver pass them in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from domain import clock as vclock
from domain.catalog import Collection
from domain.protocol import ErrorCode
from domain.shardkey import encode_value
from libs.errors import CommandError
from schemas import Record
from schemas import shard as s

OPEN = ("in-progress", "prepared")


def begin_statement(current: s.TxnRecorded | None, txn: s.Txn, now: float) -> s.TxnRecorded:
    """The record a statement of `txn` runs in: the open one, or a new one."""
    if current is not None and current.state == "prepared" and current.txnNumber != txn.txnNumber:
        raise CommandError(
            ErrorCode.PreparedTransactionInProgress,
            f"transaction {current.txnNumber} of session {txn.lsid} is prepared: only its coordinator ends it",
        )
    if current is None or current.txnNumber < txn.txnNumber:
        return s.TxnRecorded(
            lsid=txn.lsid, txnNumber=txn.txnNumber, readAt=txn.readAt, state="in-progress", startedAt=now
        )
    if current.txnNumber > txn.txnNumber:
        raise CommandError(
            ErrorCode.TransactionTooOld,
            f"Cannot start transaction {txn.txnNumber} on session {txn.lsid} because a newer transaction "
            f"{current.txnNumber} has already started",
        )
    if current.state == "committed":
        raise CommandError(
            ErrorCode.TransactionCommitted,
            f"Transaction with {{ txnNumber: {txn.txnNumber} }} has been committed.",
        )
    if current.state == "aborted":
        raise no_such_transaction(txn.lsid, txn.txnNumber, "has been aborted")
    if current.state == "prepared":
        raise CommandError(ErrorCode.PreparedTransactionInProgress, "Cannot run a statement in a prepared transaction")
    return current


def with_writes(record: s.TxnRecorded, events: Iterable[Record]) -> s.TxnRecorded:
    """The record with a statement's document writes folded in: one entry per document, its
    final image (so that one commit stamp never writes a key twice)."""
    writes = {(w.ns, encode_value(w.id)): w for w in record.writes}
    changed = False
    for e in events:
        if isinstance(e, s.DocumentWritten):
            w = s.TxnWrite(ns=e.ns, skey=e.skey, id=e.doc["_id"], doc=e.doc)
        elif isinstance(e, s.DocumentRemoved):
            w = s.TxnWrite(ns=e.ns, skey=e.skey, id=e.id)
        else:
            continue
        key = (w.ns, encode_value(w.id))
        writes.pop(key, None)  # re-inserted last: the order of last writes is the commit's
        writes[key] = w
        changed = True
    return record.model_copy(update={"writes": list(writes.values())}) if changed else record


def pending(record: s.TxnRecorded, ts: int | None = None) -> list[Record]:
    """The record's writes as the changelog events that apply them (stamped `ts` at commit;
    unstamped to lay them over the snapshot while a statement is decided)."""
    out: list[Record] = []
    for w in record.writes:
        if w.doc is not None:
            out.append(s.DocumentWritten(ns=w.ns, skey=w.skey, doc=w.doc, ts=ts))
        else:
            out.append(s.DocumentRemoved(ns=w.ns, skey=w.skey, id=w.id, ts=ts))
    return out


def _known(current: s.TxnRecorded | None, lsid: str, txn_number: int) -> s.TxnRecorded:
    if current is None or current.txnNumber != txn_number:
        too_old = current is not None and current.txnNumber > txn_number
        raise no_such_transaction(lsid, txn_number, "is not the session's" if too_old else "is unknown here")
    if current.state == "aborted":
        raise no_such_transaction(lsid, txn_number, "has been aborted")
    return current


def prepare(current: s.TxnRecorded | None, req: s.PrepareTransaction, ts: int | None) -> tuple[list[Record], int]:
    """The events of this participant's vote to commit, stamped `ts`, and its prepare stamp."""
    current = _known(current, req.lsid, req.txnNumber)
    if current.state == "committed":
        raise CommandError(
            ErrorCode.TransactionCommitted, f"Transaction with {{ txnNumber: {req.txnNumber} }} has been committed."
        )
    if current.state == "prepared":
        return [], current.prepareAt or 0
    return [current.model_copy(update={"state": "prepared", "prepareAt": ts})], ts or 0


def commit(current: s.TxnRecorded | None, req: s.CommitTransaction, ts: int | None) -> tuple[list[Record], int]:
    """The events of committing `req`'s transaction with stamp `ts` (a prepared one: the
    coordinator's `commitAt`; none for a retried commit), and its commit stamp."""
    current = _known(current, req.lsid, req.txnNumber)
    if current.state == "committed":
        return [], current.commitAt or 0
    if current.state == "prepared":
        if req.commitAt is None or (current.prepareAt is not None and req.commitAt < current.prepareAt):
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"a prepared transaction commits at its coordinator's commitTimestamp, no earlier than its "
                f"prepare timestamp {current.prepareAt}",
            )
        ts = req.commitAt
    elif req.commitAt is not None:
        raise CommandError(ErrorCode.InvalidOptions, "commitTimestamp is for a prepared transaction only")
    done = current.model_copy(update={"state": "committed", "writes": [], "commitAt": ts})
    return [*pending(current, ts), done], ts or 0


def abort(current: s.TxnRecorded | None, req: s.AbortTransaction) -> list[Record]:
    if current is None or current.txnNumber != req.txnNumber:
        raise no_such_transaction(req.lsid, req.txnNumber, "is unknown here")
    if current.state == "committed":
        raise CommandError(
            ErrorCode.TransactionCommitted, f"Transaction with {{ txnNumber: {req.txnNumber} }} has been committed."
        )
    if current.state == "aborted":
        return []
    return [current.model_copy(update={"state": "aborted", "writes": []})]


def check_not_moved(coll: Collection | None, skey: bytes, read_at: int) -> None:
    """MongoDB's throwIfMovedSince: a transaction writes only where the owner at its snapshot
    still is, so that its reads (sent to the owners at its snapshot) see its writes, and its
    commit applies nothing the snapshot's owner did not hold.  An unsharded collection's
    primary moving is a catalog change (the snapshot floor)."""
    if coll is None:
        return
    vclock.check_chunk_history(coll.ns, read_at, coll.history_from)
    if (moved := coll.moved_since(skey, read_at)) is not None:
        raise CommandError(
            ErrorCode.MigrationConflict,
            f"Chunk of {coll.ns} has moved since timestamp: {vclock.LogicalTime.unpack(read_at)}, most recently "
            f"at timestamp: {vclock.LogicalTime.unpack(moved)}",
        )


def ended_by_ddl(records: Iterable[s.TxnRecorded], namespaces: Iterable[str], db: str | None) -> list[Record]:
    """A DDL's critical section ends the transactions in progress that wrote in its namespaces
    (or its database), rather than wait for them as MongoDB's drop does (up to their lifetime
    limit): their next statement or commit is NoSuchTransaction, with the
    TransientTransactionError label.  A prepared one is waited for (its coordinator decides)."""
    held = set(namespaces)

    def covered(ns: str) -> bool:
        return ns in held or (db is not None and ns.partition(".")[0] == db)

    return [
        r.model_copy(update={"state": "aborted", "writes": []})
        for r in records
        if r.state == "in-progress" and any(covered(w.ns) for w in r.writes)
    ]


def no_such_transaction(lsid: str, txn_number: int, why: str) -> CommandError:
    return CommandError(
        ErrorCode.NoSuchTransaction,
        f"Transaction with {{ txnNumber: {txn_number} }} {why} (session {lsid})",
    )


def write_conflict(what: str) -> CommandError:
    return CommandError(
        ErrorCode.WriteConflict,
        "WriteConflict error: this operation conflicted with another operation. Please retry your "
        f"operation or multi-document transaction. ({what})",
    )


# ------------------------------------------------------------------ the coordinator


def coordinate(
    current: s.TxnCoordinatorRecorded | None, mine: s.TxnRecorded | None, req: s.CoordinateCommitTransaction
) -> tuple[list[Record], dict[str, Any]]:
    """Begin two-phase commit (the first request), or answer what is known of it: from the
    coordinator while it runs, from this shard's own part once it is done and gone (`mine`:
    the coordinator is a participant, so its own record tells the outcome, as MongoDB's).  A
    router recovering a commit (no participants) of a transaction no coordinator ever began here
    ends this shard's part with an abort, so that its answer stays true: nothing commits it
    later (its other participants cannot commit without a coordinator)."""
    if current is not None:
        return [], outcome(current)
    if mine is not None and mine.txnNumber == req.txnNumber and mine.state == "committed":
        return [], {"decision": "commit", "commitAt": mine.commitAt}
    if mine is not None and mine.txnNumber == req.txnNumber and mine.state == "aborted":
        return [], {"decision": "abort", "why": "it was aborted"}
    if not req.participants:
        if mine is not None and mine.txnNumber == req.txnNumber and mine.state == "in-progress":
            ended = mine.model_copy(update={"state": "aborted", "writes": []})
            return [ended], {"decision": "abort", "why": "no commit of it was ever begun"}
        return [], {"decision": "abort", "why": "it is unknown to its recovery shard"}
    if mine is not None and mine.txnNumber > req.txnNumber:
        raise no_such_transaction(req.lsid, req.txnNumber, "is not the session's")
    begun = s.TxnCoordinatorRecorded(
        lsid=req.lsid, txnNumber=req.txnNumber, participants=list(req.participants), state="preparing"
    )
    return [begun], {"decision": None}


def outcome(record: s.TxnCoordinatorRecorded) -> dict[str, Any]:
    """What a (retried) commitTransaction learns from the coordinator: the decision, None while
    the votes are out."""
    if record.decision == "abort":
        return {"decision": "abort", "why": record.why}
    if record.decision == "commit":
        return {"decision": "commit", "commitAt": record.commitAt}
    return {"decision": None}


def advance(current: s.TxnCoordinatorRecorded | None, req: s.AdvanceTxnCoordinator, removal: Record) -> list[Record]:
    """The coordinator's next state: a decision only from `preparing`; `done` (its `removal`)
    only after one."""
    if current is None:
        if req.state == "done":
            return []  # a retry: gone already
        raise no_such_transaction(req.lsid, req.txnNumber, "has no coordinator here")
    if req.state == current.state:
        return []  # a retry
    if req.state in ("committing", "aborting"):
        if current.state != "preparing":
            raise CommandError(
                ErrorCode.ConflictingOperationInProgress,
                f"the coordinator of transaction {req.txnNumber} has decided already ({current.decision})",
            )
        decision = "commit" if req.state == "committing" else "abort"
        update = {"state": req.state, "decision": decision, "commitAt": req.commitAt, "why": req.why}
        return [current.model_copy(update=update)]
    if current.state == "preparing":
        raise CommandError(ErrorCode.ConflictingOperationInProgress, "a coordinator is done only after its decision")
    return [removal]


def decision_of(votes: dict[str, int | None]) -> tuple[str, int | None]:
    """`votes`: each participant's prepare stamp, None for a vote to abort.  All yes: commit
    at the largest prepare stamp (after every participant's, so no reader at an earlier time
    on any of them misses it); any no: abort."""
    if any(ts is None for ts in votes.values()):
        return "aborting", None
    return "committing", max(t for t in votes.values() if t is not None)
