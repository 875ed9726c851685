"""The shard's transactions table (docs/decisions/0015, docs/reference: "Retryable writes",
"Session Migration"): what a retryable write may skip, what it records, and how records
arrive with a migration and leave with their session.  Pure: the table is
`services/shard/documents.py`'s fold (`SessionEntry` per lsid), time is passed in.

    a write under (lsid, txnNumber)     the session's entry               outcome
    txnNumber > entry's (or no entry)   -                                 runs; the old records tombstoned
    txnNumber == entry's                its executed statements           those are skipped, their results returned
    txnNumber < entry's                 -                                 TransactionTooOld
    migrated statements (merge)         higher txnNumber wins; equal: the union of statements
    ForgetSessions(lsids, before)       last write older than `before`    every record tombstoned

Records are `RetryableWriteRecorded`, written in the same transaction as the writes they
describe and keyed by (lsid, txnNumber, part), so compaction keeps one per key and a
tombstone drops it from the changelog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from domain.protocol import ErrorCode
from domain.session import RetryableWrite
from libs.errors import CommandError
from schemas import Record, Tombstone
from schemas import shard as s
from services.shard.documents import SessionEntry, record_key


@dataclass(frozen=True)
class Begun:
    """A retryable write, admitted: the statements already executed under its txnNumber (to
    skip, returning their recorded results) and the tombstones of the session's older records
    (the write's decision starts with them)."""

    write: RetryableWrite
    executed: Mapping[int, s.Statement] = field(default_factory=dict)
    tombstones: tuple[Tombstone, ...] = ()
    parts: frozenset[str] = frozenset()  # parts already used under this txnNumber


def tombstones(entry: SessionEntry) -> tuple[Tombstone, ...]:
    return tuple(Tombstone(key=record_key(entry.lsid, entry.txn_number, p)) for p in sorted(entry.records))


def begin(entry: SessionEntry | None, write: RetryableWrite) -> Begun:
    if entry is None:
        return Begun(write)
    if write.txn_number < entry.txn_number:
        raise CommandError(
            ErrorCode.TransactionTooOld,
            f"Cannot start transaction {write.txn_number} on session {write.lsid} because a newer "
            f"transaction {entry.txn_number} has already started",
        )
    if write.txn_number == entry.txn_number:
        return Begun(write, entry.executed(), (), frozenset(entry.records))
    return Begun(write, {}, tombstones(entry))


def _part(statements: Iterable[s.Statement], used: frozenset[str], prefix: str = "") -> str:
    """A record's part: its first statement id, made unique among the txnNumber's parts."""
    base = f"{prefix}{min(st.stmtId for st in statements)}"
    part, n = base, 0
    while part in used:
        n += 1
        part = f"{base}.{n}"
    return part


def record(begun: Begun, statements: list[s.Statement], now: float) -> list[Record]:
    """The events that record `statements` (executed now) after the write's own events: none
    when nothing was executed.  The tombstones of older records go first in the decision."""
    if not statements:
        return []
    w = begun.write
    return [
        s.RetryableWriteRecorded(
            lsid=w.lsid,
            txnNumber=w.txn_number,
            part=_part(statements, begun.parts),
            statements=statements,
            lastWriteAt=now,
        )
    ]


def merge(entry: SessionEntry | None, incoming: s.SessionStatements) -> list[Record]:
    """Migrated statements of one session: a higher txnNumber replaces ours, a lower one is
    dropped, an equal one adds the statements we lack (or that wrote a document where ours
    matched nothing)."""
    if entry is not None and incoming.txnNumber < entry.txn_number:
        return []
    if entry is None or incoming.txnNumber > entry.txn_number:
        new, olds, used = list(incoming.statements), tombstones(entry) if entry else (), frozenset[str]()
    else:
        have = entry.executed()
        new = [
            st
            for st in incoming.statements
            if st.stmtId not in have or (have[st.stmtId].skey is None and st.skey is not None)
        ]
        olds, used = (), frozenset(entry.records)
    if not new:
        return list(olds)
    return [
        *olds,
        s.RetryableWriteRecorded(
            lsid=incoming.lsid,
            txnNumber=incoming.txnNumber,
            part=_part(new, used, prefix="m"),
            statements=new,
            lastWriteAt=incoming.lastWriteAt,
        ),
    ]


def after(entry: SessionEntry | None, events: Iterable[Record]) -> SessionEntry | None:
    """The session's entry once `events` (its records and tombstones) are folded, as the shard's
    fold does it (`ShardDocuments`)."""
    for e in events:
        if isinstance(e, Tombstone) and entry is not None:
            kept = {p: r for p, r in entry.records.items() if record_key(entry.lsid, entry.txn_number, p) != e.key}
            entry = SessionEntry(entry.lsid, entry.txn_number, kept) if kept else None
        elif isinstance(e, s.RetryableWriteRecorded):
            if entry is not None and e.txnNumber < entry.txn_number:
                continue
            same = entry is not None and entry.txn_number == e.txnNumber
            records = dict(entry.records) if entry is not None and same else {}
            entry = SessionEntry(e.lsid, e.txnNumber, {**records, e.part: e})
    return entry


def merge_all(
    sessions: Mapping[str, SessionEntry], incoming: Iterable[s.SessionStatements], ns: str, lo: bytes, hi: bytes
) -> list[Record]:
    """A migration batch's statements, merged in order into the recipient's table: only those
    about documents of [lo, hi) of `ns` (the range it receives)."""
    overlay: dict[str, SessionEntry | None] = {}
    events: list[Record] = []
    for batch in incoming:
        wanted = [
            st for st in batch.statements if st.ns == ns and st.skey is not None and lo <= bytes.fromhex(st.skey) < hi
        ]
        if not wanted:
            continue
        entry = overlay[batch.lsid] if batch.lsid in overlay else sessions.get(batch.lsid)
        merged = merge(entry, batch.model_copy(update={"statements": wanted}))
        overlay[batch.lsid] = after(entry, merged)
        events += merged
    return events


def in_range(entry: SessionEntry, ns: str, lo: bytes, hi: bytes) -> s.SessionStatements | None:
    """The session's statements about documents of [lo, hi) of `ns` (what a migration carries)."""
    statements = [
        st
        for st in entry.executed().values()
        if st.ns == ns and st.skey is not None and lo <= bytes.fromhex(st.skey) < hi
    ]
    if not statements:
        return None
    return s.SessionStatements(
        lsid=entry.lsid, txnNumber=entry.txn_number, lastWriteAt=entry.last_write_at, statements=statements
    )


def record_in_range(event: s.RetryableWriteRecorded, ns: str, lo: bytes, hi: bytes) -> s.SessionStatements | None:
    """As `in_range`, for one record read back from the changelog (a migration's catch-up)."""
    entry = SessionEntry(event.lsid, event.txnNumber, {event.part: event})
    return in_range(entry, ns, lo, hi)


def forget(sessions: Mapping[str, SessionEntry], lsids: Iterable[str], before: float) -> tuple[list[Record], list[str]]:
    """Tombstones for every record of the named sessions whose last write here is older than
    `before` (re-checked now: a session that wrote since the reaper looked is kept), and the
    lsids forgotten."""
    events: list[Record] = []
    forgotten: list[str] = []
    for lsid in dict.fromkeys(lsids):
        entry = sessions.get(lsid)
        if entry is not None and entry.last_write_at < before:
            events += tombstones(entry)
            forgotten.append(lsid)
    return events, forgotten
