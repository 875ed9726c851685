"""Projection: fold one partition of a log into a RocksDB store.

The consumed offset goes into the same write batch as the state it produced,
so a restart resumes exactly where the store stands; with it goes the command position the
log's writer records in its records (`COMMAND_END`), so that a new owner of the commands knows
where they resume (docs/reference/command-processor.md).  A missing store replays
from the start; a store whose checkpoint the log cannot vouch for (topic
recreated, records deleted) is refused rather than silently diverging.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Protocol

from libs import aio
from libs.bus import Bus, Message, Reader, catch_up, connect
from libs.store import Checkpoint, Store
from schemas import Codec, Record, RecordError, Tombstone

log = logging.getLogger(__name__)

# How long a fetch of the log may wait for records at the broker (aiokafka's default is 500 ms).
# A seek (activation, rewind) waits for the fetch in flight, so this bounds a take-over's pause.
PROJECTION_FETCH_WAIT_MS = 100
# While catching up, the store is written once per this many bytes of records applied (and at the
# end): bounds the pending changes a state holds in memory (Projection.catch_up).
CATCH_UP_COMMIT_BYTES = 16 * 1024 * 1024
# Records decoded before the state folds them, in a replay's loop: a few, not the whole fetch.
# Fold cost per config event (bench_replay, offline): 1 at a time 2.9-3.1 µs, 16 2.2-2.5 µs,
# 128 4.5 µs (the decoded group no longer fits the caches).
DECODE_GROUP = 16
# The record header in which a command processor writes, on the events of a transaction, the offset
# after the last command that transaction takes (libs.commands; docs/reference/command-processor.md).
COMMAND_END = "cmd-end"


def recorded_command_end(records: list[Message]) -> int | None:
    """The last command position the records carry (None: none does).  Positions grow along the
    log, so the last one found from the end is the largest."""
    for rec in reversed(records):
        for k, v in rec.headers or ():
            if k == COMMAND_END:
                return int(v)
    return None


class State(Protocol):
    """What a projection folds into.  `apply` must be deterministic.  A null value in the log
    (a compaction tombstone) arrives as `schemas.Tombstone(key)`, as its writer decided it.

    A state that deletes whole key ranges (a dropped collection's documents) also has
    `drain_range_deletions() -> list[tuple[bytes, bytes]]`: the [start, stop) ranges deleted
    since the last call, written before the batch's changes (`Store.commit`)."""

    def load(self, store: Store) -> None: ...

    def apply(self, event: Record, offset: int) -> None: ...

    def drain_changes(self) -> dict[bytes, bytes | None]: ...


def fingerprint(value: bytes | None) -> int:
    """What a checkpoint remembers of the last record it applied (to recognise a recreated log)."""
    return zlib.crc32(value or b"")


class CheckpointMismatch(RuntimeError):
    """The store's checkpoint does not belong to the log it is asked to follow."""


class Projection:
    def __init__(
        self,
        bus: str | Bus,
        topic: str,
        codec: Codec[Record],
        state: State,
        store: Store,
        *,
        partition: int = 0,
        name: str = "projection",
    ) -> None:
        self.bus, self.topic, self.codec, self.state, self.store = connect(bus), topic, codec, state, store
        self.partition = partition
        self.name = name
        self.position = 0  # next offset to apply: for config.events, the ConfigTime reached
        self.last_fingerprint: int | None = None
        # The command position the log records up to `position` (None: none yet): where the
        # writer's commands resume, if its consumer group's offset is behind.
        self.command_end: int | None = None
        self.skipped = 0
        self._reader: Reader | None = None
        self._advanced = asyncio.Condition()
        self._waiting = 0  # callers in wait_for: only they need telling that the position moved
        self._running = asyncio.Event()  # cleared by pause(): follow() applies nothing
        self._running.set()

    async def start(self) -> None:
        self.state.load(self.store)
        ckpt = self.store.checkpoint(self.topic, self.partition)
        self._reader = r = self.bus.reader(
            self.topic, self.partition, client_id=f"{self.name}-projection", fetch_wait_ms=PROJECTION_FETCH_WAIT_MS
        )
        await r.start()
        # Seek before any await: otherwise the consumer starts fetching from the log's
        # start, and the fingerprint read waits behind a fetch it throws away.
        r.seek(max(ckpt.next_offset - 1, 0) if ckpt else 0)
        if ckpt is None:
            log.info("%s: no checkpoint in %s: replaying %s from offset 0", self.name, self.store.path, self.topic)
            return
        try:
            await self._verify(ckpt)
        except CheckpointMismatch:
            await self.stop()
            raise
        self.position, self.last_fingerprint, self.command_end = (
            ckpt.next_offset,
            ckpt.last_fingerprint,
            ckpt.command_end,
        )
        r.seek(ckpt.next_offset)
        log.info("%s: resuming %s from its checkpoint at offset %d", self.name, self.topic, ckpt.next_offset)

    @property
    def reader(self) -> Reader:
        """The reader of the log, between `start()` and `stop()`."""
        if self._reader is None:
            raise RuntimeError(f"{self.name}: not started")
        return self._reader

    async def _verify(self, ckpt: Checkpoint) -> None:
        r = self.reader
        start = await r.log_start()
        end = await r.log_end()
        where = f"{self.name}: store {self.store.path} is at offset {ckpt.next_offset} of {self.topic}"
        # Never rebuild from a shorter log on our own: that would silently drop what the store
        # holds and the log lost.  Say what happened and the command for each way out.
        way_out = (
            f" Refusing to start rather than rebuild from a shorter log. If the loss is accepted, "
            f"`make reset` starts an empty cluster (it deletes every store and the local broker's data); "
            f"to rebuild only this store from what the log holds now: rm -rf {self.store.path}"
        )
        if ckpt.next_offset > end:
            raise CheckpointMismatch(
                f"{where}, but the log ends at {end}: the log it was built from is gone (the broker's data "
                f"was deleted or reformatted, or the topic recreated).{way_out}"
            )
        if ckpt.next_offset < start:
            raise CheckpointMismatch(
                f"{where}, but the log now starts at {start}: records it has not applied were deleted.{way_out}"
            )
        if ckpt.next_offset == 0 or ckpt.last_fingerprint is None:
            return
        # Fingerprint: the last record applied must still be where the store saw it.
        r.seek(ckpt.next_offset - 1)
        records = await r.fetch(max_records=1, timeout_s=2.0)
        if (
            records
            and records[0].offset == ckpt.next_offset - 1
            and fingerprint(records[0].value) != ckpt.last_fingerprint
        ):
            raise CheckpointMismatch(
                f"{where}, but the record before it is not the one the store applied: the topic was recreated.{way_out}"
            )

    def reset(self) -> None:
        """Forget in-memory state: reload it from the store and resume reading at its checkpoint."""
        self.state.load(self.store)
        ckpt = self.store.checkpoint(self.topic, self.partition)
        self.position = ckpt.next_offset if ckpt else 0
        self.last_fingerprint = ckpt.last_fingerprint if ckpt else None
        self.command_end = ckpt.command_end if ckpt else None
        self.reader.seek(self.position)

    def rewind(self) -> None:
        """Resume reading at the position the in-memory state stands at, without reloading it.

        Every batch `poll` and `advance` apply is committed to the store with its checkpoint,
        `catch_up` commits all it applied before it returns, and a failed transaction calls
        `reset()`, so the state *is* the store at `position`: an O(1) seek replaces an O(state)
        reload (what made a take-over slow).
        Should the store's checkpoint disagree, this falls back to `reset()`."""
        ckpt = self.store.checkpoint(self.topic, self.partition)
        stored = ckpt.next_offset if ckpt else 0
        if stored != self.position:
            log.warning(
                "%s: state at offset %d but its store at %d: reloading from the store", self.name, self.position, stored
            )
            self.reset()
            return
        self.reader.seek(self.position)

    async def stop(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def _apply_batch(self, records: list[Message]) -> None:
        self._fold(records)
        self._commit()

    def _fold(self, records: list[Message]) -> None:
        """Apply the records to the state and move the position past them, in memory only: the
        store is written by `_commit`."""
        # Bound once per batch, not looked up on every record of a replay.
        apply, decode = self.state.apply, self.codec.decode
        # Decoded DECODE_GROUP at a time, then applied: decoding is pure, and alternating the
        # codec and the fold record by record costs each the other's caches (bench_replay).
        for start in range(0, len(records), DECODE_GROUP):
            group = records[start : start + DECODE_GROUP]
            events: list[Record | None] = []  # one per record of the group; None: skipped
            for rec in group:
                if rec.value is None and rec.key:  # a tombstone: what the processor wrote as Tombstone(key)
                    events.append(Tombstone(key=rec.key))
                    continue
                try:
                    events.append(decode(rec.value))
                except RecordError as e:
                    # Only one writer appends to an event log, so this is a bug or a foreign
                    # producer: skip it loudly rather than stop the world.
                    self.skipped += 1
                    events.append(None)
                    log.error(
                        "%s: skipping undecodable record at %s@%d: %s", self.name, self.topic, rec.offset, e.reason
                    )
            for rec, event in zip(group, events):
                if event is not None:
                    apply(event, rec.offset)
        last = records[-1]
        self._move_to(last.offset + 1, fingerprint(last.value), recorded_command_end(records))

    def advance(self, next_offset: int, last_fingerprint: int | None, command_end: int | None = None) -> None:
        """Persist the state's pending changes with the new position (and the command position
        recorded up to it, when these records carry one), in one batch."""
        self._move_to(next_offset, last_fingerprint, command_end)
        self._commit()

    def _move_to(self, next_offset: int, last_fingerprint: int | None, command_end: int | None) -> None:
        self.position, self.last_fingerprint = next_offset, last_fingerprint
        if command_end is not None:
            self.command_end = command_end

    def _commit(self) -> None:
        """Write the state's pending changes and the checkpoint of the position, in one batch."""
        drain_ranges = getattr(self.state, "drain_range_deletions", None)
        ranges: list[tuple[bytes, bytes]] = drain_ranges() if drain_ranges is not None else []
        self.store.commit(
            self.state.drain_changes().items(),
            Checkpoint(self.topic, self.partition, self.position, self.last_fingerprint, self.command_end),
            ranges,
        )
        if self._waiting:  # (one who starts waiting later looks at the position first)
            asyncio.get_running_loop().call_soon(self._notify)

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._advanced:
                self._advanced.notify_all()

        asyncio.ensure_future(wake())

    async def catch_up(self) -> int:
        """Apply everything committed to the log up to now; returns the position reached.

        The store is written once per CATCH_UP_COMMIT_BYTES of records and at the end, not per
        fetch: a replay's events rewrite the same keys again and again, and only each key's last
        value need be written.  Nothing reads the store of a state still catching up, and a crash
        loses only work the next start redoes from the last checkpoint."""
        committed, uncommitted, folding = self.position, 0, False  # the store's position, bytes since

        async def fold(records: list[Message]) -> None:
            nonlocal committed, uncommitted, folding
            folding = True
            self._fold(records)
            folding = False
            uncommitted += sum(len(r.value or b"") for r in records)
            if uncommitted >= CATCH_UP_COMMIT_BYTES:
                self._commit()
                committed, uncommitted = self.position, 0
            # A fetch of buffered records returns without yielding: let the loop's other tasks
            # (the fetcher, a group's heartbeat) run between two folds of a long replay.
            await asyncio.sleep(0)

        try:
            await catch_up(self.reader, fold)
        finally:
            # Also when cancelled between two fetches; not when a fold failed half-way (its
            # changes are partial: whoever handles the error reloads the state).
            if self.position != committed and not folding:
                self._commit()
        return self.position

    async def poll(self, timeout_ms: int = 500) -> None:
        """Apply whatever the log has beyond the position, waiting up to `timeout_ms` for it."""
        if records := await self.reader.fetch(max_records=5000, timeout_s=timeout_ms / 1000):
            await self._apply_batch(records)

    async def follow(self) -> None:
        """Tail the log forever (until cancelled)."""
        wait = self.bus.idle_wait_s or 0.5  # an empty fetch only fetches again
        while True:
            await self._running.wait()
            records = await self.reader.fetch(max_records=5000, timeout_s=wait)
            if not self._running.is_set():  # paused while fetching: as if never fetched
                self.reader.seek(self.position)
                continue
            if records:
                await self._apply_batch(records)

    def pause(self) -> None:
        """Stop applying the log in `follow()` from now until `resume()` (tests make a lagging
        reader with it)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def log_end(self) -> int:
        """The log's stable end as of now (read_committed)."""
        return await self.reader.log_end()

    async def fetched_to(self) -> int:
        """How far the consumer has read: past the transaction markers `position` never counts."""
        consumed = await self.reader.position()
        return max(self.position, consumed)

    async def wait_for(self, offset: int, timeout: float) -> None:
        """Block until the projection has applied every record below `offset`."""

        async def reached() -> None:
            self._waiting += 1
            try:
                async with self._advanced:
                    await self._advanced.wait_for(lambda: self.position >= offset)
            finally:
                self._waiting -= 1

        await aio.wait_for(reached(), timeout)
