"""A shard's history: what each document key held before every write, so that a read at a past
cluster time sees exactly the writes stamped at or before it (docs/decisions/0019).

    h/<key><ts>   -> the value `key` held just before the write stamped `ts` (TAG_ABSENT: none)
    w/<ts><key>   -> b"" (the same entry, ordered by time: reclaim walks it)
    \\x00meta/history/from -> the oldest cluster time a read may ask for

`key` is a document store key (`d/...`, `i/...`), prefix-free, so the entries of one key are
exactly those under `h/<key>` that are 8 bytes longer; `ts` is 8 bytes big-endian, so they come
in time order.  The value of `key` at T is the entry with the smallest ts > T (the value before
the first write after T), or, with no such entry, the latest state.  Everything here is pure but
`reclaim`, which deletes from a store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, MutableMapping
from itertools import groupby

from libs.faults import fault_point
from libs.store import META, Store

log = logging.getLogger(__name__)

HISTORY, BY_TIME = b"h/", b"w/"
HISTORY_FROM = META + b"history/from"
DROPPED = META + b"history/dropped/"  # + a namespace or database: when its data was last dropped
TAG_ABSENT, TAG_VALUE = b"\x00", b"\x01"
TS_BYTES = 8


def _ts(ts: int) -> bytes:
    return ts.to_bytes(TS_BYTES, "big")


def record(changes: MutableMapping[bytes, bytes | None], key: bytes, prior: bytes | None, ts: int) -> None:
    """Into a batch's `changes`: `key` held `prior` (None: nothing) before the write stamped `ts`.
    A second write of the same key at the same stamp (one event changing a key twice) keeps the
    first prior: the value before the event."""
    entry = HISTORY + key + _ts(ts)
    if entry not in changes:
        changes[entry] = TAG_ABSENT if prior is None else TAG_VALUE + prior
        changes[BY_TIME + _ts(ts) + key] = b""


def skipped(changes: MutableMapping[bytes, bytes | None], ts: int) -> None:
    """Into a batch's `changes`: the write stamped `ts` kept no history (a window of 0), so reads
    may start only at it."""
    changes[HISTORY_FROM] = _ts(ts)


def _entries(history: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, int, bytes | None]]:
    """(key, ts, prior) of each `h/` entry, in key then time order."""
    for hk, hv in history:
        body = hk[len(HISTORY) :]
        yield body[:-TS_BYTES], int.from_bytes(body[-TS_BYTES:], "big"), (hv[1:] if hv[:1] == TAG_VALUE else None)


def value_before_next_write(
    entries: Iterator[tuple[bytes, int, bytes | None]], at: int
) -> Iterator[tuple[bytes, bool, bytes | None]]:
    """Per key with history: (key, changed since `at`, its value at `at` if changed)."""
    for key, group in groupby(entries, key=lambda e: e[0]):
        later = next((prior for _, ts, prior in group if ts > at), _UNCHANGED)
        if later is _UNCHANGED:
            yield key, False, None
        else:
            yield key, True, later  # type: ignore[misc]


_UNCHANGED = object()


def as_of(
    latest: Iterator[tuple[bytes, bytes]], history: Iterator[tuple[bytes, bytes]], at: int
) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs of a key range at cluster time `at`, in key order: `latest` is the
    range's latest state and `history` its `h/` entries, both in key order."""
    past = value_before_next_write(_entries(history), at)
    pending = next(past, None)
    for key, value in latest:
        while pending is not None and pending[0] < key:
            if pending[1] and pending[2] is not None:  # since deleted or moved away
                yield pending[0], pending[2]
            pending = next(past, None)
        if pending is not None and pending[0] == key:
            changed, before = pending[1], pending[2]
            pending = next(past, None)
            if changed:
                if before is not None:
                    yield key, before
                continue
        yield key, value
    while pending is not None:
        if pending[1] and pending[2] is not None:
            yield pending[0], pending[2]
        pending = next(past, None)


def value_at(latest: bytes | None, history: Iterator[tuple[bytes, bytes]], at: int) -> bytes | None:
    """One key's value at `at`: `history` is its `h/` entries."""
    for _, changed, before in value_before_next_write(_entries(history), at):
        if changed:
            return before
    return latest


def history_range(start: bytes, stop: bytes) -> tuple[bytes, bytes]:
    """The `h/` keys of the document keys in [start, stop)."""
    return HISTORY + start, HISTORY + stop


def history_of(key: bytes) -> bytes:
    """The prefix of one key's `h/` entries."""
    return HISTORY + key


def reclaim(store: Store, before: int, limit: int = 10_000) -> tuple[int, bool]:
    """Delete up to `limit` entries stamped before `before` and move the oldest readable time up
    to it; returns (entries deleted, done: none older is left)."""
    it = store.db.iter()
    it.seek(BY_TIME)
    deletes: list[bytes] = []
    done = True
    while it.valid():
        k = it.key()
        if not k.startswith(BY_TIME) or int.from_bytes(k[2 : 2 + TS_BYTES], "big") >= before:
            break
        if len(deletes) // 2 >= limit:
            done = False
            break
        ts, key = k[2 : 2 + TS_BYTES], k[2 + TS_BYTES :]
        deletes += [k, HISTORY + key + ts]
        it.next()
    reached = before if done else int.from_bytes(deletes[-2][2 : 2 + TS_BYTES], "big")
    current = readable_from(store)
    changes: list[tuple[bytes, bytes | None]] = [(k, None) for k in deletes]
    if reached > current:
        changes.append((HISTORY_FROM, _ts(reached)))
    store.commit(changes, None)
    return len(deletes) // 2, done


def readable_from(store: Store) -> int:
    """The oldest cluster time whose reads the history can answer."""
    raw = store.get(HISTORY_FROM)
    return int.from_bytes(raw, "big") if raw is not None else 0


def dropped(changes: MutableMapping[bytes, bytes | None], target: str, ts: int) -> None:
    """Into a batch's `changes`: every document of `target` (a namespace or a database) was
    deleted at `ts` without history."""
    changes[DROPPED + target.encode()] = _ts(ts)


def readable_from_ns(get: Callable[[bytes], bytes | None], ns: str) -> int:
    """The oldest cluster time at which `ns` may be read: after the history's start and after
    the last drop of the collection or its database."""
    floors = [get(HISTORY_FROM), get(DROPPED + ns.encode()), get(DROPPED + ns.partition(".")[0].encode())]
    return max((int.from_bytes(raw, "big") for raw in floors if raw is not None), default=0)


def is_history(key: bytes) -> bool:
    """Is this a history key?  A fresh replay rebuilds the entries the log still has (every one,
    but for what compaction removed), not the readable times a live store moved on."""
    return key.startswith(HISTORY) or key.startswith(BY_TIME) or key.startswith(META + b"history/")


def begin(store: Store, at: int) -> bool:
    """A store with no readable time yet (new, rebuilt by replay, or written before history was
    kept) can answer reads from `at` on, the time it has caught up to: what it folded before may
    lack what compaction removed.  Returns whether it began here."""
    if store.get(HISTORY_FROM) is not None:
        return False
    store.commit([(HISTORY_FROM, _ts(at))], None)
    return True


class Reclaimer:
    """Deletes, every `every_s`, the history older than the window (`window_s()`, the catalog's
    minSnapshotHistoryWindowInSeconds), `batch` entries at a time with the event loop let go
    between batches; counts what it deleted."""

    def __init__(self, store: Store, window_s: Callable[[], float], every_s: float, batch: int = 10_000) -> None:
        self.store, self.window_s, self.every_s, self.batch = store, window_s, every_s, batch
        self.reclaimed = 0  # entries deleted since start
        self.passes = 0

    def cutoff(self, wall: float) -> int:
        """The cluster time `window_s()` before `wall`: entries stamped before it are past use."""
        return max(0, int(wall - self.window_s())) << 32

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.reclaim_once(time.time())

    async def reclaim_once(self, wall: float) -> int:
        before, deleted, done = self.cutoff(wall), 0, False
        while not done:
            n, done = reclaim(self.store, before, self.batch)
            deleted += n
            if not done:  # a crash here leaves part reclaimed, HISTORY_FROM where that part ends
                fault_point("history.mid_reclaim")
            await asyncio.sleep(0)
        self.reclaimed += deleted
        self.passes += 1
        if deleted:
            log.info("history: %d entries older than %s reclaimed", deleted, before >> 32)
        return deleted
