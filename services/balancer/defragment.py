"""Collection defragmentation (docs/reference/defragmentation-and-auto-merge.md), pure: one collection's
state machine through MongoDB's three phases.

1. mergeAndMeasureChunks: merge every run of consecutive chunks of one shard (and one
   zone), then ask for the data size of every chunk that has none.
2. moveAndMergeChunks: a chunk smaller than 25% of the max chunk size moves to the shard
   of a consecutive chunk chosen by MongoDB's recipient scoring, then merges with it;
   until no small chunk has a sibling left.
3. mergeChunks: phase 1 again without data sizes.

The state is plain data (`to_json`/`from_json`), so the balancer records it as events
and replays it.  `next_actions` issues work, `on_result` folds an outcome in: a
retriable error re-issues the same action; a non-retriable one restarts phase 1 or 3
from its beginning and phase 2 from phase 1 (as MongoDB does), once the
actions already in flight have answered.

Actions are plain dicts: {"type": "merge"|"dataSize"|"move", "ns", "shard", "min",
"max"} and "to" for a move ("shard" is the owner, or the donor of a move).

Bounds must be hashable and sort like the shard key (encoded shard-key bytes are best;
JSON keeps them as {"$hex": ...}).  Snapshots must show the outcome of every result
already folded in (the balancer waits for the catalog to reach the ConfigTime of the
last outcome): phases are built from them.  The functions never change the state given:
each returns a new one (copying the containers it changes, sharing the rest).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict, cast

from domain.protocol import ErrorCode
from services.balancer.automerge import ChunkInfo, Straddling, ZoneRangeT, chunk_zones, runs

MERGE_AND_MEASURE = "mergeAndMeasureChunks"
MOVE_AND_MERGE = "moveAndMergeChunks"
MERGE = "mergeChunks"
FINISHED = "finished"
_NEXT = {MERGE_AND_MEASURE: MOVE_AND_MERGE, MOVE_AND_MERGE: MERGE, MERGE: FINISHED}
# Phases 1 and 3 restart themselves; phase 2 restarts from phase 1 (docs/reference/defragmentation-and-auto-merge.md).
_RESTART = {MERGE_AND_MEASURE: MERGE_AND_MEASURE, MOVE_AND_MERGE: MERGE_AND_MEASURE, MERGE: MERGE}

MAX_OUTSTANDING = 50  # MongoDB: up to 50 operations outstanding on the secondary thread
SMALL_CHUNK_PCT = 25  # MongoDB: a chunk under 25% of the max chunk size is small

# MongoDB retries its RetriableError category plus StaleConfig/StaleShardVersion; ours adds
# the project's transient refusals (a shard's one migration at a time, a pending range deletion).
RETRIABLE_CODES: frozenset[str] = frozenset(
    {
        ErrorCode.StaleConfig,
        ErrorCode.StaleShardVersion,
        ErrorCode.ShardUnavailable,
        ErrorCode.HostUnreachable,
        ErrorCode.NetworkTimeout,
        ErrorCode.ExceededTimeLimit,
        ErrorCode.LockBusy,
        ErrorCode.PrimarySteppedDown,
        ErrorCode.ShutdownInProgress,
        ErrorCode.InterruptedDueToReplStateChange,
        ErrorCode.ConflictingOperationInProgress,
        ErrorCode.RangeDeletionPending,
        ErrorCode.Timeout,
    }
)


def is_retriable(code: str | None) -> bool:
    return code in RETRIABLE_CODES


@dataclass(frozen=True)
class Snapshot:
    """The collection as the balancer sees it now."""

    chunks: Sequence[ChunkInfo]  # key order, all of the collection; `size` when the catalog has one
    max_chunk_size: int
    zone_ranges: Sequence[ZoneRangeT] | None = None  # None: use each chunk's `zone`
    shard_sizes: Mapping[str, int] | None = None  # data per shard; None: the sum of its chunks' sizes
    draining: frozenset[str] = frozenset()  # shards that may not receive chunks


Action = dict[str, Any]  # {"type": "merge" | "dataSize" | "move", "ns", "shard", "min", "max"[, "to"]}


class TableChunk(TypedDict):
    """A chunk of phase 2's own routing table."""

    min: Any
    max: Any
    shard: str
    size: int
    zone: str | None
    straddles: bool


class Pair(TypedDict):
    """A move-and-merge in flight: bounds as [min, max] lists (JSON)."""

    chunk: list[Any]
    sibling: list[Any]
    merged: list[Any]
    to: str


@dataclass
class DefragState:
    ns: str
    phase: str = MERGE_AND_MEASURE
    built: bool = False  # the phase's work has been computed from a snapshot
    restart_phase: str | None = None  # set by a non-retriable error or stop: enter it once nothing is in flight
    stopped: bool = False
    pending: list[Action] = field(default_factory=list)  # to issue (and retriable actions to issue again)
    outstanding: list[Action] = field(default_factory=list)  # issued, awaiting on_result
    sizes: dict[str, int] = field(default_factory=dict)  # bytes measured, by range_key (MongoDB: in config.chunks)
    # phase 2's own routing table and bookkeeping (MongoDB: it works from the phase-1 sizes)
    chunks: list[TableChunk] | None = None  # {"min", "max", "shard", "zone", "size", "straddles"}
    pairs: list[Pair] = field(default_factory=list)  # move-and-merge in flight: {"chunk", "sibling", "merged", "to"}
    shard_sizes: dict[str, int] = field(default_factory=dict)
    draining: list[str] = field(default_factory=list)
    max_chunk_size: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: {"merges": 0, "dataSizes": 0, "moves": 0, "retries": 0, "restarts": 0}
    )


# --------------------------------------------------------------------------- lifecycle


def _copy(s: DefragState) -> DefragState:
    return replace(
        s,
        pending=list(s.pending),
        outstanding=list(s.outstanding),
        sizes=dict(s.sizes),
        chunks=None if s.chunks is None else list(s.chunks),
        pairs=list(s.pairs),
        shard_sizes=dict(s.shard_sizes),
        draining=list(s.draining),
        counters=dict(s.counters),
    )


def start(ns: str) -> DefragState:
    """`shardlog defragment NS start`."""
    return DefragState(ns)


def stop(state: DefragState) -> DefragState:
    """`shardlog defragment NS stop`: issue nothing more; finished once in-flight actions answer."""
    s = _copy(state)
    if s.phase != FINISHED:
        s.stopped, s.pending, s.restart_phase = True, [], FINISHED
        _drained(s)
    return s


def resume(state: DefragState) -> DefragState:
    """After a balancer restart the answers to in-flight actions are lost: rebuild the current
    phase from the catalog, as MongoDB does from the phase it persisted."""
    s = _copy(state)
    s.outstanding = []
    if s.restart_phase is not None:
        _enter(s, s.restart_phase)
    elif s.phase != FINISHED:
        _enter(s, s.phase)
    return s


def blocks_balancing(state: DefragState) -> bool:
    """A collection being defragmented is not balanced meanwhile, as in MongoDB."""
    return state.phase != FINISHED


def _enter(s: DefragState, phase: str) -> None:
    s.phase, s.built, s.restart_phase = phase, False, None
    s.pending, s.pairs, s.chunks = [], [], None
    if phase == FINISHED:
        s.sizes = {}  # MongoDB clears the measured sizes when defragmentation ends


def _drained(s: DefragState) -> None:
    if s.restart_phase is not None and not s.outstanding:
        _enter(s, s.restart_phase)


# ------------------------------------------------------------------------------ sizes


def range_key(lo: Any, hi: Any) -> str:
    return json.dumps(_enc([lo, hi]), separators=(",", ":"))


def known_size(state: DefragState, lo: Any, hi: Any) -> int | None:
    """The data size measured for the chunk [lo, hi), if any."""
    return state.sizes.get(range_key(lo, hi))


def _small(s: DefragState, size: int) -> bool:
    return size * 100 < s.max_chunk_size * SMALL_CHUNK_PCT  # strictly less, exact in integers


# ----------------------------------------------------------------------------- building


def _action(s: DefragState, kind: str, shard: str, lo: Any, hi: Any, **extra: Any) -> Action:
    return {"type": kind, "ns": s.ns, "shard": shard, "min": lo, "max": hi, **extra}


def _build(s: DefragState, snap: Snapshot) -> None:
    s.built, s.max_chunk_size = True, snap.max_chunk_size
    chunks = list(snap.chunks)
    zones = chunk_zones(chunks, snap.zone_ranges)
    size_of = [s.sizes.get(range_key(c.min, c.max), c.size) for c in chunks]
    if s.phase in (MERGE_AND_MEASURE, MERGE):
        eligible = [not isinstance(z, Straddling) for z in zones]
        found = runs(chunks, zones, eligible)
        s.pending = [_action(s, "merge", chunks[i].shard, chunks[i].min, chunks[j - 1].max) for i, j in found]
        if s.phase == MERGE_AND_MEASURE:
            in_run = {k for i, j in found for k in range(i, j)}
            s.pending += [
                _action(s, "dataSize", c.shard, c.min, c.max)
                for k, c in enumerate(chunks)
                if k not in in_run and size_of[k] is None
            ]
        return
    # MOVE_AND_MERGE needs every size; MongoDB goes back to phase 1 when one is missing.
    if any(n is None for n in size_of):
        s.counters["restarts"] += 1
        _enter(s, MERGE_AND_MEASURE)
        return
    s.chunks = [
        {
            "min": c.min,
            "max": c.max,
            "shard": c.shard,
            "size": cast(int, n),  # not None: a missing size returned above
            "zone": None if isinstance(z, Straddling) else z,
            "straddles": isinstance(z, Straddling),
        }
        for c, z, n in zip(chunks, zones, size_of)
    ]
    if snap.shard_sizes is not None:
        s.shard_sizes = dict(snap.shard_sizes)
    else:
        s.shard_sizes = {}
        for c in s.chunks:
            s.shard_sizes[c["shard"]] = s.shard_sizes.get(c["shard"], 0) + c["size"]
    s.draining = sorted(snap.draining)


# ----------------------------------------------------------------- phase 2: move and merge


def _busy(s: DefragState) -> set[tuple[Any, ...]]:
    """Chunks in a move-and-merge now."""
    return {tuple(p[k]) for p in s.pairs for k in ("chunk", "sibling")}


def _migrating(s: DefragState) -> set[str]:
    """Shards in a migration now: a shard takes part in one migration at a time."""
    return {sh for a in s.pending + s.outstanding if a["type"] == "move" for sh in (a["shard"], a["to"])}


def _index(s: DefragState, lo: Any) -> int:
    assert s.chunks is not None, "phase 2 reads its routing table, built on entering the phase"
    i = bisect.bisect_left(s.chunks, lo, key=lambda c: c["min"])
    assert s.chunks[i]["min"] == lo, "phase 2's routing table lost a chunk"
    return i


def _siblings(s: DefragState, i: int) -> list[int]:
    """Consecutive chunks a small chunk may join: same zone, a recipient that may receive."""
    assert s.chunks is not None, "phase 2 reads its routing table, built on entering the phase"
    c, out = s.chunks[i], []
    for k in (i + 1, i - 1):  # right first: MongoDB's first candidate, kept on a tie
        if 0 <= k < len(s.chunks):
            sib = s.chunks[k]
            if (
                not sib["straddles"]
                and sib["zone"] == c["zone"]
                and (sib["shard"] == c["shard"] or sib["shard"] not in s.draining)
            ):
                out.append(k)
    return out


def score(s: DefragState, chunk: TableChunk, sibling: TableChunk, other: TableChunk | None) -> int:
    """MongoDB's recipient scoring, one bit per question, the first weighing the most:
    on the chunk's own shard? chunk smaller than the sibling? merged chunk no longer small?
    recipient holding less data than the other possible recipient?"""
    merged = chunk["size"] + sibling["size"]
    less_data = other is not None and (s.shard_sizes.get(sibling["shard"], 0) < s.shard_sizes.get(other["shard"], 0))
    return (
        8 * (sibling["shard"] == chunk["shard"])
        + 4 * (chunk["size"] < sibling["size"])
        + 2 * (not _small(s, merged))
        + 1 * less_data
    )


def _new_pairs(s: DefragState, room: int) -> list[Action]:
    """Start up to `room` move-and-merges: shards holding the most data first, on each its
    smallest chunk first; a chunk whose siblings are all unfit waits or is left as it is."""
    chunks = s.chunks
    assert chunks is not None, "phase 2 reads its routing table, built on entering the phase"
    out: list[Action] = []
    busy, migrating = _busy(s), _migrating(s)
    small: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(chunks):
        if not c["straddles"] and _small(s, c["size"]) and (c["min"], c["max"]) not in busy:
            small.setdefault(c["shard"], []).append((c["size"], i))
    for shard in sorted(small, key=lambda sh: (-s.shard_sizes.get(sh, 0), sh)):
        for _, i in sorted(small[shard]):
            if len(out) >= room:
                return out
            c = chunks[i]
            if (c["min"], c["max"]) in busy:
                continue  # became the sibling of an earlier pair
            fit = [
                k
                for k in _siblings(s, i)
                if (chunks[k]["min"], chunks[k]["max"]) not in busy
                and (chunks[k]["shard"] == shard or not {shard, chunks[k]["shard"]} & migrating)
            ]
            if not fit:
                continue

            def rank(k: int) -> tuple[int, bool]:  # used at once, within this iteration
                other = next((chunks[o] for o in fit if o != k), None)  # noqa: B023
                return score(s, c, chunks[k], other), k > i  # noqa: B023 (a tie keeps the right sibling)

            sib = chunks[best := max(fit, key=rank)]
            merged = [sib["min"], c["max"]] if best < i else [c["min"], sib["max"]]
            s.pairs.append(
                {
                    "chunk": [c["min"], c["max"]],
                    "sibling": [sib["min"], sib["max"]],
                    "merged": merged,
                    "to": sib["shard"],
                }
            )
            busy |= {(c["min"], c["max"]), (sib["min"], sib["max"])}
            if sib["shard"] == shard:  # MongoDB's question 1: no move needed, merge straight away
                out.append(_action(s, "merge", shard, *merged))
            else:
                out.append(_action(s, "move", shard, c["min"], c["max"], to=sib["shard"]))
                migrating |= {shard, sib["shard"]}
    return out


def _apply_move(s: DefragState, a: Action) -> None:
    assert s.chunks is not None, "phase 2 reads its routing table, built on entering the phase"
    s.counters["moves"] += 1
    pair = next(p for p in s.pairs if p["chunk"] == [a["min"], a["max"]])
    i = _index(s, a["min"])
    c = s.chunks[i] = {**s.chunks[i], "shard": a["to"]}  # a new dict: older states share the old one
    s.shard_sizes[a["shard"]] = s.shard_sizes.get(a["shard"], 0) - c["size"]
    s.shard_sizes[a["to"]] = s.shard_sizes.get(a["to"], 0) + c["size"]
    s.pending.append(_action(s, "merge", pair["to"], *pair["merged"]))  # then merge with the sibling


def _apply_pair_merge(s: DefragState, a: Action) -> None:
    assert s.chunks is not None, "phase 2 reads its routing table, built on entering the phase"
    pair = next(p for p in s.pairs if p["merged"] == [a["min"], a["max"]])
    s.pairs.remove(pair)
    i = _index(s, a["min"])
    left, right = s.chunks[i], s.chunks[i + 1]
    merged: TableChunk = {**left, "max": right["max"], "size": left["size"] + right["size"], "shard": pair["to"]}
    s.chunks[i : i + 2] = [merged]
    s.sizes[range_key(merged["min"], merged["max"])] = merged["size"]


def _remaining_small(s: DefragState) -> int:
    if s.chunks is None:
        return 0
    return sum(1 for i, c in enumerate(s.chunks) if not c["straddles"] and _small(s, c["size"]) and _siblings(s, i))


# ------------------------------------------------------------------------------- steps


def next_actions(
    state: DefragState, snapshot: Snapshot, limit: int = MAX_OUTSTANDING
) -> tuple[DefragState, list[Action]]:
    """The actions to issue now (they become outstanding), moving to the next phase when one
    is done; at most `limit` in flight."""
    s = _copy(state)
    issued: list[Action] = []
    for _ in range(8):  # a few empty phases may pass in one call; each step below makes progress
        if s.phase == FINISHED or s.restart_phase is not None:
            break  # finished, or an aborted phase waits for its in-flight actions
        if not s.built:
            _build(s, snapshot)
            continue
        while len(s.outstanding) < limit and s.pending:
            a = s.pending.pop(0)
            s.outstanding.append(a)
            issued.append(a)
        if s.phase == MOVE_AND_MERGE and len(s.outstanding) < limit:
            new = _new_pairs(s, limit - len(s.outstanding))
            s.outstanding += new
            issued += new
        if issued or s.outstanding or s.pending:
            break
        _enter(s, _NEXT[s.phase])  # nothing left to do nor in flight: the phase is complete
    return s, issued


def on_result(
    state: DefragState,
    action: Mapping[str, Any],
    ok: bool,
    error_code: str | None = None,
    *,
    data_size: int | None = None,
) -> DefragState:
    """Fold in the outcome of an issued action (`data_size` answers a dataSize).  An answer
    to an action not in flight (already folded in, or issued before a restart) is ignored."""
    s = _copy(state)
    a = dict(action)
    if a not in s.outstanding:
        return s
    s.outstanding.remove(a)
    if ok and a["type"] == "dataSize":
        if data_size is None:
            raise ValueError("a successful dataSize answers with data_size")
        s.sizes[range_key(a["min"], a["max"])] = data_size  # a fact even if the phase was aborted
        s.counters["dataSizes"] += 1
    if s.restart_phase is not None:  # aborted or stopping: only waiting for the answers
        _drained(s)
        return s
    if ok:
        if a["type"] == "merge":
            s.counters["merges"] += 1
            if s.phase == MERGE_AND_MEASURE:  # measure the chunk just created
                s.pending.append(_action(s, "dataSize", a["shard"], a["min"], a["max"]))
            elif s.phase == MOVE_AND_MERGE:
                _apply_pair_merge(s, a)
        elif a["type"] == "move":
            _apply_move(s, a)
    elif is_retriable(error_code):
        s.counters["retries"] += 1
        s.pending.insert(0, a)  # retriable: issue the same operation again
    else:
        s.counters["restarts"] += 1
        s.pending, s.pairs, s.restart_phase = [], [], _RESTART[s.phase]
        _drained(s)
    return s


def status(state: DefragState) -> dict[str, Any]:
    """Progress for `shardlog defragment NS status` (MongoDB's currentPhase / remainingChunksToProcess)."""
    s = state
    if s.phase == MOVE_AND_MERGE and s.chunks is not None:
        remaining = _remaining_small(s)
    else:
        remaining = len(s.pending) + len(s.outstanding)
    return {
        "ns": s.ns,
        "currentPhase": s.phase,
        "state": "finished"
        if s.phase == FINISHED
        else "stopping"
        if s.stopped
        else "restarting"
        if s.restart_phase is not None
        else "running",
        "stopped": s.stopped,
        "remainingChunksToProcess": remaining,
        "outstanding": len(s.outstanding),
        "pending": len(s.pending),
        **s.counters,
    }


# --------------------------------------------------------------------------------- JSON


def _enc(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"$hex": v.hex()}
    if isinstance(v, dict):
        return {k: _enc(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if len(v) == 1 and "$hex" in v:
            return bytes.fromhex(v["$hex"])
        return {k: _dec(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_dec(x) for x in v]
    return v


def to_json(state: DefragState) -> dict[str, Any]:
    """Plain JSON (bytes bounds as {"$hex": ...}) for an event; `from_json` gives it back."""
    return cast(dict[str, Any], _enc(asdict(state)))


def from_json(data: Mapping[str, Any]) -> DefragState:
    return DefragState(**_dec(dict(data)))


def encode_action(action: Mapping[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], _enc(dict(action)))


def decode_action(data: Mapping[str, Any]) -> Action:
    return cast(Action, _dec(dict(data)))
