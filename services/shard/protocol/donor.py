"""The donor's migration document: the states of a range (or, for movePrimary, a
database's unsharded collections) leaving this shard, and the requests that move it.

The donor's coordinator (`services/shard/donor.py`) sends these to its own shard; each
is decided here and recorded in the changelog with its reply, in one transaction, so a
crash leaves the whole step or none of it and replay rebuilds where the migration stood.

    request                      expects                      leaves
    StartDonation                (no migration here)          cloning, with a pending range-deletion task
                                 (this one registered)        as it was (a retry: "joined")
    StartPrimaryMove             (no migration here)          critical (no mods phase: writes wait from the start)
                                 (this one registered)        as it was (a retry: "joined")
    EnterCriticalSection         cloning                      critical: writes to the range refused
                                 critical, committing         as it was (a retry)
    EnterCriticalSection(reads)  critical                     committing: reads refused too
                                 committing                   as it was (a retry)
    RecordDecision               cloning, critical,           decided, with the decision; the task ready
                                 committing                   (committed) or removed (aborted)
                                 decided the same way         as it was (a retry)
                                 (no document)                (none): decided and forgotten already
    ForgetMigration              decided                      (forgotten)
                                 (no document)                (none)

Refusals: a start while another migration is registered (ConflictingOperationInProgress),
at another epoch (StaleEpoch) or for a range or database this shard does not own
(StaleConfig); a step for a migration with no donor document here (NoSuchMigration);
a step out of order, after the decision, or a decision contradicting the recorded one
(IllegalOperation).

While the document is `critical`, writes to the range are refused with a retriable
StaleConfig (the router waits for the next ConfigTime, the commit or the abort, and
retries); while it is `committing`, reads are refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from domain.catalog import Migration
from domain.protocol import ErrorCode, record_bytes
from domain.shardkey import from_ejson, to_ejson
from libs.errors import CommandError
from schemas import Record
from schemas import shard as s
from services.shard.documents import shard_key_part
from services.shard.protocol import range_deletion
from services.shard.protocol.common import (
    DONORS,
    Doc,
    Role,
    Shard,
    Step,
    document,
    joined,
    primary_move_record,
    range_keys,
    range_move_record,
    stale_owner,
    unsharded_removals,
)


class DonorState(StrEnum):
    CLONING = "cloning"  # registered: the range is cloned to the recipient, then the writes made meanwhile
    CRITICAL = "critical"  # writes to the range wait; the last writes are transferred, the clone committed
    COMMITTING = "committing"  # reads wait too; the commit is with the config server
    DECIDED = "decided"  # committed or aborted: the critical section is over


BLOCKS_WRITES = frozenset({DonorState.CRITICAL, DonorState.COMMITTING})
BLOCKS_READS = frozenset({DonorState.COMMITTING})
UNDECIDED = frozenset({DonorState.CLONING, DonorState.CRITICAL, DonorState.COMMITTING})


# ------------------------------------------------------------ before the start


@dataclass(frozen=True)
class DonatedRange:
    """[min, max) of a donation: as encoded shard keys, and as the Extended JSON bounds."""

    lo: bytes
    hi: bytes
    min: Doc
    max: Doc


class CannotDonate(Exception):
    """The requested range may not be donated: the migration aborts, saying why (and, when
    the range is one shard-key value too big to move, its chunk is marked jumbo)."""

    def __init__(self, code: ErrorCode, reason: str, jumbo: bool = False):
        super().__init__(f"{code}: {reason}")
        self.code, self.reason, self.jumbo = code, reason, jumbo


# The stored bytes of a collection's documents with shard keys in [lo, hi).
StoredSize = Callable[[str, bytes, bytes], int]


def donation_range(shard: Shard, m: Migration, stored_size: StoredSize) -> DonatedRange:
    """The range the coordinator asks StartDonation for: the requested [min, max), or, when
    the request left max open, up to one max chunk size of data from min, cut at a shard-key
    boundary.  A range over twice the max chunk size is refused unless forced."""
    coll = shard.catalog.collections.get(m.ns)
    if coll is None or coll.epoch != m.epoch:
        raise CannotDonate(ErrorCode.StaleEpoch, f"{m.ns} changed since the migration was requested")
    lo = coll.pattern.encode_bound(from_ejson(m.min))
    chunk = coll.chunks[coll.chunk_index(lo)]
    if chunk.shard != shard.id:
        raise CannotDonate(ErrorCode.StaleConfig, f"{shard.id} does not own {m.min} any more")
    limit = coll.settings.maxChunkSizeBytes or shard.catalog.settings.maxChunkSizeBytes
    if m.max is not None:
        hi = coll.pattern.encode_bound(from_ejson(m.max))
        size = stored_size(m.ns, lo, hi)
        if size > 2 * limit and not m.force_jumbo:
            raise CannotDonate(
                ErrorCode.ChunkTooBig,
                f"[{m.min}, {m.max}) holds {size} bytes, over twice the max "
                f"chunk size ({limit}); move it with --force-jumbo",
            )
        return DonatedRange(lo, hi, m.min, m.max)
    # Only min: cut up to one max chunk size of data from it, at a shard-key boundary.
    total, prev_key = 0, None
    for k, doc in shard.documents.scan(m.ns, lo, chunk.max_key):
        skey = shard_key_part(k, doc)
        if total >= limit and skey != prev_key:
            return DonatedRange(lo, skey, m.min, to_ejson(coll.pattern.extract(doc)))
        total += record_bytes(doc)
        prev_key = skey
    if total > 2 * limit and not m.force_jumbo:
        one_key = prev_key is not None and all(
            shard_key_part(k, d) == prev_key for k, d in shard.documents.scan(m.ns, lo, chunk.max_key)
        )
        if one_key:
            raise CannotDonate(
                ErrorCode.ChunkTooBig,
                f"every document of [{m.min}, ...) has the same shard key "
                f"value, so the chunk cannot be split; it is marked jumbo",
                jumbo=True,
            )
        raise CannotDonate(ErrorCode.ChunkTooBig, f"{total} bytes from {m.min}, over twice the max chunk size")
    return DonatedRange(lo, chunk.max_key, m.min, to_ejson(chunk.max))


# ------------------------------------------------------------------- requests


def start_donation(shard: Shard, req: s.StartDonation) -> Step:
    if (retry := joined(shard, req.id)) is not None:
        return retry
    coll = shard.catalog.collections.get(req.ns)
    if coll is None or coll.epoch != req.epoch:
        raise CommandError(ErrorCode.StaleEpoch, f"{req.ns} is not at epoch {req.epoch} on {shard.id}")
    lo, hi = range_keys(shard.catalog, req.ns, req.min, req.max)
    chunk = coll.chunks[coll.chunk_index(lo)]
    if chunk.shard != shard.id or not (chunk.min_key <= lo < hi <= chunk.max_key):
        raise stale_owner(shard, f"{shard.id} does not own all of the range of migration {req.id}")
    return Step(
        [
            range_move_record(
                req.id, Role.DONOR, req.ns, req.epoch, req.min, req.max, req.recipient, DonorState.CLONING.value
            ),
            range_deletion.pending(shard, req.id, req.ns, req.epoch, req.min, req.max, f"donated to {req.recipient}"),
        ],
        {"id": req.id, "state": DonorState.CLONING.value},
    )


def start_primary_move(shard: Shard, req: s.StartPrimaryMove) -> Step:
    if (retry := joined(shard, req.id)) is not None:
        return retry
    db = shard.catalog.databases.get(req.db)
    if db is None or db.primary != shard.id:
        raise stale_owner(shard, f"{shard.id} is not the primary of {req.db}")
    return Step(
        [primary_move_record(req.id, Role.PRIMARY_DONOR, req.db, req.recipient, DonorState.CRITICAL.value)],
        {"id": req.id, "state": DonorState.CRITICAL.value},
    )


def enter_critical_section(shard: Shard, req: s.EnterCriticalSection) -> Step:
    m = document(shard, req.id, DONORS, "donor")
    state = DonorState(m.state)
    if req.reads:
        if state is DonorState.CLONING:
            raise CommandError(
                ErrorCode.IllegalOperation, f"migration {req.id} blocks writes before it blocks reads (it is {state})"
            )
        target = DonorState.COMMITTING
    else:
        target = DonorState.CRITICAL if state is DonorState.CLONING else state
    if state is target:
        return Step([], {"id": req.id, "state": state.value})
    return Step([m.model_copy(update={"state": target.value})], {"id": req.id, "state": target.value})


def record_decision(shard: Shard, req: s.RecordDecision, now: float) -> Step:
    m = shard.documents.migrations.get(req.id)
    if m is None or m.role not in DONORS:
        return Step([], {"id": req.id, "state": "forgotten"})  # decided and forgotten already
    decision = "committed" if req.committed else "aborted"
    if m.decision is not None:
        if m.decision != decision:
            raise CommandError(ErrorCode.IllegalOperation, f"migration {req.id} was already {m.decision}")
        return Step([], {"id": req.id, "state": m.state})
    events: list[Record] = [m.model_copy(update={"state": DonorState.DECIDED.value, "decision": decision})]
    if Role(m.role) is Role.PRIMARY_DONOR and req.committed:
        # Our copies of the unsharded collections are the old primary's: delete them now
        # (they are never read again: routers and this shard send them to the new primary).
        events += unsharded_removals(shard, m.ns)
    task = shard.documents.range_tasks.get(req.id)
    if task is not None:
        if req.committed:  # the donor's copy is orphaned now
            events.append(range_deletion.ready(task, now, req.configTime))
        else:
            events.append(s.RangeDeletionRemoved(id=req.id))
    return Step(events, {"id": req.id, "state": DonorState.DECIDED.value, "decision": decision})


def forget_migration(shard: Shard, req: s.ForgetMigration) -> Step:
    """The donor forgets its document once decided; a recipient's is forgotten whatever its
    state (FinishReceipt is its usual end)."""
    m = shard.documents.migrations.get(req.id)
    if m is None:
        return Step([], {"id": req.id, "state": "forgotten"})
    if m.role in DONORS and m.decision is None:
        raise CommandError(ErrorCode.IllegalOperation, f"migration {req.id} is not decided yet")
    return Step([s.MigrationForgotten(id=req.id)], {"id": req.id, "state": "forgotten"})


# ------------------------------------------------------------ the critical section


def blocked_ranges(shard: Shard, ns: str, reads: bool) -> list[tuple[bytes, bytes]]:
    """Ranges of `ns` this shard may not serve now: its donations in their critical section."""
    states = BLOCKS_READS if reads else BLOCKS_WRITES
    return [
        range_keys(shard.catalog, m.ns, m.min, m.max)
        for m in shard.documents.migrations.values()
        if m.ns == ns and Role(m.role) is Role.DONOR and m.state in states and m.decision is None
    ]


def primary_blocked(shard: Shard, ns: str, reads: bool) -> bool:
    """An unsharded collection whose database's primary is moving away: writes wait from the
    start of the move (it has no mods phase), reads once it commits."""
    db = ns.partition(".")[0]
    states = BLOCKS_READS if reads else BLOCKS_WRITES
    return any(
        Role(m.role) is Role.PRIMARY_DONOR and m.ns == db and m.state in states and m.decision is None
        for m in shard.documents.migrations.values()
    )


def critical_section_wait(shard: Shard, ns: str, what: str) -> CommandError:
    """The refusal of a read or write the critical section holds: retriable, the router waits
    for the next ConfigTime (the commit or the abort) and retries."""
    return CommandError(
        ErrorCode.StaleConfig,
        f"{shard.id}: {what} of {ns} waits for a migration's critical section",
        {"shard": shard.id, "configTime": shard.catalog.config_time + 1, "critical": True},
    )
