"""The donor's migration coordinator (docs/reference/chunk-migration.md): drives one migration at a time,
from the config server's MigrationRequested to the forgotten migration document.

    register donation (+ pending range-deletion task)  -> StartDonation to ourselves
    register receipt on the recipient                   -> StartReceipt (waits out its overlapping deletions)
    clone the range from RocksDB in batches             -> TransferBatch(clone)
    transfer the writes made meanwhile                  -> TransferBatch(mods), read from our own changelog
    (both carry the transactions-table statements about documents of the range: session migration)
    critical section: writes to the range blocked       -> EnterCriticalSection, then the last mods
    the recipient commits the clone                     -> CommitClone
    critical section: reads blocked too; commit         -> EnterCriticalSection(reads), CommitMigration to config
    record the decision (task ready / removed)          -> RecordDecision, once our catalog shows the outcome
    the recipient drops or readies its task             -> FinishReceipt
    forget                                              -> ForgetMigration

Every step's effect is a record in a changelog, so a coordinator that starts and
finds a migration document without a decision is a restart: it asks the config
server to abort, and the answer ("aborted", or "committed" if the commit got in
first) is the decision it finishes with.  The changelog is also the mod log:
the writes made on the donor since the clone began are read back from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka.errors import KafkaTimeoutError
from opentelemetry import trace

from domain.catalog import Catalog, Migration
from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.protocol import record_bytes as _size
from domain.shardkey import key_length
from libs import aio, kafka, tracing
from libs.bus import Bus, BusError, partition_reader
from libs.faults import fault_point, reintroduced
from libs.requests import Requester, RequestTimeout
from libs.service import seconds_from_env
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Codec, RecordError
from schemas import config as cfg
from schemas import shard as s
from schemas.reply import Reply
from services.shard.documents import UNSHARDED_END, UNSHARDED_KEY, SessionEntry, decode_doc, shard_key_part
from services.shard.protocol import index_build, retryable
from services.shard.protocol.clone_window import CloneWindow
from services.shard.protocol.common import DONORS, RECIPIENTS, Documents, Shard
from services.shard.protocol.donor import CannotDonate, donation_range
from services.shard.protocol.donor import DonatedRange as Range

log = logging.getLogger(__name__)

CLONE_BATCH_DOCS = 2000
CLONE_BATCH_BYTES = 2 * 1024 * 1024
# migrationThrottleUnderLoad: while either shard serves clients (within the last
# CLIENT_ACTIVITY_HOLD_S, as its replies say), one clone batch of at most this many bytes is in flight.
THROTTLED_BATCH_BYTES = 512 * 1024
# A stored value longer than this goes decoded (TransferBatch.written), not as a JSON string.
STORED_VALUE_MAX = kafka.MAX_RECORD_BYTES // 4
CATCH_UP_MODS = 200  # enter the critical section once a pass of mods is this small
MAX_CATCH_UP_PASSES = 20
REQUEST_TIMEOUT_S = 10.0
STEP_DEADLINE_ENV = "SHARDLOG_MIGRATION_STEP_DEADLINE_S"


# Every wait of a migration is bounded by this: a peer that does not answer a step, or a
# catch-up pass that does not reach its target, for this long aborts the migration.
STEP_DEADLINE_S = seconds_from_env(STEP_DEADLINE_ENV, 120.0)
RECEIPT_WAIT_S = 60.0  # the recipient's overlapping range deletions get this long to finish (then abort,
# saying why: moving a range back within orphanCleanupDelaySecs has to wait for it)


class MigrationAborted(Exception):
    """The migration cannot commit: `code` (an ErrorCode, when one applies) and `reason`."""

    def __init__(self, reason: str, jumbo: bool = False, code: ErrorCode | None = None):
        super().__init__(f"{code}: {reason}" if code else reason)
        self.reason, self.jumbo, self.code = reason, jumbo, code


def _why(e: Exception) -> tuple[ErrorCode | None, str]:
    """(code, reason) of what stopped a migration."""
    if isinstance(e, MigrationAborted):
        return e.code, e.reason
    return ErrorCode.InternalError, f"{type(e).__name__}: {e}"


def _code(name: str | None) -> ErrorCode | None:
    try:
        return ErrorCode(name) if name else None
    except ValueError:
        return None


class NotActive(RuntimeError):
    pass


class DonorDocuments(Documents, Protocol):
    """What the coordinator reads of its own shard's documents (`CountingDocuments`)."""

    def scan_stored(self, ns: str, after: bytes, hi: bytes, *, inclusive: bool) -> Iterator[tuple[bytes, dict]]: ...

    def scan_stored_raw(
        self, ns: str, after: bytes, hi: bytes, *, inclusive: bool
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def range_sizes(self, ns: str, lo: bytes, hi: bytes) -> Iterator[int]: ...

    def stored_sessions(self) -> Iterator[SessionEntry]: ...


@dataclass(frozen=True)
class DonorDeps:
    """Exactly what the coordinator needs of its shard."""

    shard_id: str
    topics: Topics  # the shards' requests (ourselves, the recipient), the config server's, our changelog
    bus: Bus  # to read our changelog back: the mods
    requester: Requester  # asks, with replies to the coordinator's own inbox
    follower: CatalogFollower  # the catalog view: ownership, requested migrations, outcomes, ConfigTime
    active: asyncio.Event  # set while this instance is the shard's active one (its processor's)
    documents: DonorDocuments
    changelog_position: Callable[[], int]  # the changelog offset our documents show
    progress: dict[str, dict[str, Any]]  # live progress of our donations, shown by ListMigrations
    client_busy: Callable[[], bool] = lambda: False  # our shard served clients lately (the clone's throttle)


class DonorCoordinator:
    def __init__(self, deps: DonorDeps):
        self.shard_id, self.follower, self.topics = deps.shard_id, deps.follower, deps.topics
        self.requester, self.documents, self.active = deps.requester, deps.documents, deps.active
        self.bus, self.changelog_position, self.progress = deps.bus, deps.changelog_position, deps.progress
        self.client_busy = deps.client_busy
        self._current: Migration | None = None  # the donation under way, before its decision (`_running`)
        self.prepare_waits = 0  # critical sections a prepared transaction made ask again (tests, logs)

    @property
    def catalog(self) -> Catalog:
        return self.follower.catalog

    # ---------------------------------------------------------------- loop

    async def run(self) -> None:
        await self.bus.create_topics([TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        await self.requester.start()
        try:
            while True:
                await self.active.wait()
                work = self._next_work()
                if work is None:
                    try:
                        await self.follower.wait_for(self.follower.config_time + 1, 1.0)
                    except TimeoutError:
                        pass
                    continue
                try:
                    await work
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("shard %s: migration step failed; will resume from the recorded state", self.shard_id)
                    await asyncio.sleep(1.0)  # a failing peer is not retried in a tight loop
        finally:
            await self.requester.stop()

    def _next_work(self):
        docs = self.documents.migrations
        for m in list(docs.values()):
            if m.role in DONORS:
                return self.resume(m)
            if m.role in RECIPIENTS and m.id in self.catalog.outcomes:
                # The donor is gone or its FinishReceipt was lost: the config server's outcome decides.
                return self._ask_self(s.FinishReceipt(id=m.id, committed=self.catalog.outcomes[m.id] == "committed"))
        for m in self.catalog.migrations.values():
            if m.donor == self.shard_id and not any(d.id == m.id for d in docs.values()):
                return self.move_primary(m) if m.kind == "primary" else self.donate(m)
        return None

    # ------------------------------------------------------------ requests

    async def _ask(self, topic: str, req, *, deadline: float | None = None, retry: tuple[str, ...] = ()) -> dict:
        """A request that must be answered: retried on timeout (and on the `retry` codes) until
        the deadline (the requests are idempotent); a refusal raises MigrationAborted."""
        deadline = deadline or time.monotonic() + STEP_DEADLINE_S
        headers = [("config-time", str(self.follower.config_time).encode())]
        while True:
            self._check_active(self._current)
            try:
                reply = await self.requester.request(topic, req, timeout=REQUEST_TIMEOUT_S, headers=headers)
            except RequestTimeout:
                if time.monotonic() > deadline:
                    raise MigrationAborted(f"{topic} did not answer {req.type} within {STEP_DEADLINE_S:g}s") from None
                continue
            except BusError as e:  # e.g. a leader election on a busy broker: the request is idempotent
                if not (e.retriable or isinstance(e, KafkaTimeoutError)) or time.monotonic() > deadline:
                    raise
                log.info("shard %s: %s to %s failed (%r); retrying", self.shard_id, req.type, topic, e)
                await asyncio.sleep(0.5)
                continue
            if reply.ok:
                return reply.result or {}
            if reply.code in retry and time.monotonic() < deadline:
                self._progress(getattr(req, "id", ""), waiting=reply.error)
                await asyncio.sleep(0.5)  # e.g. the recipient's range deletion: no event tells us it ended
                continue
            raise MigrationAborted(f"{req.type} refused: {reply.code}: {reply.error}") from None

    async def _ask_self(self, req) -> dict:
        return await self._ask(self.topics.shard_requests(self.shard_id), req)

    async def _ask_recipient(self, m, req, **kw) -> dict:
        return await self._ask(self.topics.shard_requests(m.recipient), req, **kw)

    def _check_active(self, m: Migration | None = None) -> None:
        if not self.active.is_set():
            raise NotActive(f"shard {self.shard_id} is no longer the active instance")
        if m is not None and m.id not in self.catalog.migrations:
            # Decided without us (setAllowMigrations false, an operator's abort): stop at once.
            outcome = self.catalog.outcome(m.id)
            raise MigrationAborted(
                outcome.reason if outcome and outcome.reason else f"migration {m.id} is no longer active",
                code=_code(outcome.code if outcome else None) or ErrorCode.ConflictingOperationInProgress,
            )
        coll = self.catalog.collections.get(m.ns) if m is not None and m.kind == "range" else None
        if m is not None and m.kind == "range" and (coll is None or not coll.settings.allowMigrations):
            raise MigrationAborted(
                f"migrations of {m.ns} were disallowed (setAllowMigrations false)",
                code=ErrorCode.ConflictingOperationInProgress,
            )
        if m is not None and (c := self.catalog.ddl_holding(m.ns)) is not None:
            raise MigrationAborted(
                f"{c.op} of {c.ns} ({c.id}) froze the collection's migrations",
                code=ErrorCode.ConflictingOperationInProgress,
            )

    def _progress(self, mid: str, **kw) -> None:
        self.progress.setdefault(mid, {}).update(kw)

    # ------------------------------------------------------------- traces
    # A migration continues the trace of the request that started it (the traceparent the config
    # server recorded with it): "migration donate" is its span here, each phase a child span.

    def _trace(self, name: str, m: Migration | None, mid: str) -> AbstractContextManager[trace.Span]:
        """The span of one run of migration `mid` on this donor, in the migration's trace."""
        parent = m.traceparent if m is not None else ""
        attributes: dict[str, Any] = {"shardlog.shard": self.shard_id, "shardlog.migration.id": mid}
        if m is not None:
            attributes |= tracing.db_attributes(m.ns, "moveRange" if m.kind == "range" else "movePrimary")
            attributes |= {"shardlog.migration.donor": m.donor, "shardlog.migration.recipient": m.recipient}
            if m.kind == "range":
                attributes |= {"shardlog.chunk.min": _ejson(m.min), "shardlog.chunk.max": _ejson(m.max)}
        return tracing.span(f"migration {name}", attributes, context=tracing.context_of(parent))

    @staticmethod
    def _phase(name: str, **attributes: Any) -> AbstractContextManager[trace.Span]:
        """A protocol phase: a child span of the migration's span (sizes set as it goes)."""
        return tracing.span(f"migration {name}", attributes)

    # ------------------------------------------------------------- donate

    async def donate(self, m: Migration) -> None:
        """A migration the config server asked of us: run it from the start."""
        # set-allow-migrations false (or a DDL, or the config server's abort) ends it at its next step.
        with self._trace("donate", m, m.id), self._running(m):
            await self._donate(m)

    @contextmanager
    def _running(self, m: Migration) -> Iterator[None]:
        """`m` is the migration under way until its decision: each step first checks that the
        config server has not decided it without us (`_check_active`).  A run that ends before
        its decision leaves none under way, however it ends: one cut short by NotActive (another
        instance took the shard over and resumes the migration) must not leave it behind, or
        once this instance is active again every step it sends is checked against that migration,
        decided long since, and refused: a migration it resumes never records its decision, and
        its range-deletion task stays pending for ever (seed 5328)."""
        self._current = m
        try:
            yield
        finally:
            self._current = None

    async def _donate(self, m: Migration) -> None:
        t0 = time.monotonic()
        self._progress(
            m.id, phase="preparing", cloned=0, mods=0, bytes=0, ns=m.ns, recipient=m.recipient, started=time.time()
        )
        try:
            rng = self._range(m)
            self._progress(m.id, min=rng.min, max=rng.max)
            await self._ask_self(
                s.StartDonation(id=m.id, ns=m.ns, epoch=m.epoch, min=rng.min, max=rng.max, recipient=m.recipient)
            )
            fault_point("migration.registered")
            await self._ask_recipient(
                m,
                s.StartReceipt(
                    id=m.id,
                    ns=m.ns,
                    epoch=m.epoch,
                    min=rng.min,
                    max=rng.max,
                    donor=self.shard_id,
                    indexes=index_build.ready_specs(self.documents.indexes, m.ns),  # built there before the clone
                ),
                deadline=time.monotonic() + RECEIPT_WAIT_S,
                retry=("RangeDeletionPending",),
            )
            await self._transfer(m, rng)
            committed, at = await self._commit(m, rng)
        except (MigrationAborted, Exception) as e:
            if isinstance(e, NotActive):
                raise  # the instance that took over resumes the migration
            self._current = None
            code, reason = _why(e)
            text = f"{code}: {reason}" if code else reason
            log.warning(
                "shard %s: migration %s aborted: %s",
                self.shard_id,
                m.id,
                text,
                exc_info=not isinstance(e, MigrationAborted),
            )
            self._progress(m.id, phase="aborting", reason=text)
            # Safe whatever step failed: the config server answers "committed" if the commit got in.
            committed, at = await self._abort(m.id, reason, getattr(e, "jumbo", False), code)
        self._current = None
        await self._finish(m.id, m.recipient, committed, at)
        self._progress(m.id, phase="done", committed=committed, seconds=round(time.monotonic() - t0, 3))

    async def move_primary(self, m: Migration) -> None:
        """movePrimary: copy the database's unsharded collections to the new primary with
        their writes blocked throughout (there is no mods phase), then commit."""
        # An abort by the config server (its bound, abort-move-primary) ends it at its next step.
        with self._trace("move primary", m, m.id), self._running(m):
            await self._move_primary(m)

    async def _move_primary(self, m: Migration) -> None:
        t0 = time.monotonic()
        self._progress(
            m.id,
            phase="cloning",
            cloned=0,
            mods=0,
            bytes=0,
            ns=m.ns,
            recipient=m.recipient,
            started=time.time(),
            kind="primary",
        )
        try:
            await self._ask_self(s.StartPrimaryMove(id=m.id, db=m.ns, recipient=m.recipient))
            self._progress(m.id, criticalSince=time.time())
            db = self.catalog.databases.get(m.ns)
            indexes = {
                ns: index_build.ready_specs(self.documents.indexes, ns) for ns in sorted(db.collections if db else ())
            }
            await self._ask_recipient(
                m,
                s.StartPrimaryReceipt(
                    id=m.id, db=m.ns, donor=self.shard_id, indexes={ns: i for ns, i in indexes.items() if i}
                ),
            )
            cloned = 0
            for ns in sorted(db.collections if db else ()):
                everything = Range(UNSHARDED_KEY, UNSHARDED_END, {}, {})
                async for written in self._clone_batches(ns, everything):
                    await self._ask_recipient(m, s.TransferBatch(id=m.id, phase="clone", ns=ns, written=written))
                    cloned += len(written)
                    self._progress(m.id, cloned=cloned)
                for sessions in self._session_batches(ns, everything):  # writes are blocked: no mods
                    await self._ask_recipient(m, s.TransferBatch(id=m.id, phase="clone", ns=ns, sessions=sessions))
            await self._ask_recipient(m, s.CommitClone(id=m.id))
            await self._ask_self(s.EnterCriticalSection(id=m.id, reads=True))
            reply = await self.requester.request(
                self.topics.config_commands, cfg.CommitPrimaryMove(id=m.id), timeout=STEP_DEADLINE_S
            )
            if not reply.ok:
                raise MigrationAborted(f"commit refused: {reply.code}: {reply.error}")
            committed, at = True, reply.configTime or 0
        except (MigrationAborted, Exception) as e:
            if isinstance(e, NotActive):
                raise
            code, reason = _why(e)
            log.warning(
                "shard %s: primary move %s of %s aborted: %s",
                self.shard_id,
                m.id,
                m.ns,
                f"{code}: {reason}" if code else reason,
            )
            committed, at = await self._abort(m.id, reason, code=code)
        self._current = None
        await self._finish(m.id, m.recipient, committed, at)
        self._progress(m.id, phase="done", committed=committed, seconds=round(time.monotonic() - t0, 3))

    async def resume(self, doc: s.MigrationRecorded) -> None:
        """A migration document we find on (re)start: finish it as decided, or decide it.
        Its trace continues while the catalog still holds the migration (and its traceparent)."""
        with self._trace("resume", self.catalog.migrations.get(doc.id), doc.id):
            await self._resume(doc)

    async def _resume(self, doc: s.MigrationRecorded) -> None:
        if doc.decision is None:
            outcome = self.catalog.outcomes.get(doc.id)
            if outcome is None:
                committed, at = await self._abort(doc.id, "the donor restarted during the migration")
            else:
                committed, at = outcome == "committed", self.follower.config_time
            log.info(
                "shard %s: recovered migration %s: %s", self.shard_id, doc.id, "committed" if committed else "aborted"
            )
        else:
            committed, at = doc.decision == "committed", 0
        await self._finish(doc.id, doc.peer, committed, at)

    # ------------------------------------------------------------- phases

    def _range(self, m: Migration) -> Range:
        try:
            return donation_range(
                Shard(self.shard_id, self.catalog, self.documents),
                m,
                lambda ns, lo, hi: sum(self.documents.range_sizes(ns, lo, hi)),
            )
        except CannotDonate as e:
            raise MigrationAborted(e.reason, e.jumbo, code=e.code) from None

    async def _transfer(self, m: Migration, rng: Range) -> None:
        """Clone, then mods until nearly caught up, then the critical section and the last mods."""
        start = self.changelog_position()  # the changelog offset the clone is at least as new as
        self._progress(m.id, phase="cloning")
        mods = _ModReader(self, m, rng, start)
        async with mods:  # its reader opens while the clone runs
            with self._phase("clone") as clone:
                cloned = await self._bulk_clone(m, rng)
                # Every clone batch is acknowledged (the barrier): only now the sessions and the mods.
                # The records of retryable writes to the range, as committed now; the catch-up below
                # sends the ones written since `start` (a record sent twice merges to the same).
                for sessions in self._session_batches(m.ns, rng):
                    self._check_active(m)
                    if reintroduced("migration-forgets-sessions"):
                        break
                    await self._ask_recipient(m, s.TransferBatch(id=m.id, phase="clone", sessions=sessions))
                clone.set_attributes({"shardlog.documents": cloned, "shardlog.bytes": self.progress[m.id]["bytes"]})
            self._progress(m.id, phase="catching up")
            with self._phase("catch-up") as catch_up:
                passes = 0
                for passes in range(1, MAX_CATCH_UP_PASSES + 1):  # noqa: B007 (the count is the attribute)
                    self._check_active(m)
                    if reintroduced("migration-without-catch-up"):
                        break
                    n = await mods.transfer_until(None)
                    fault_point("migration.catching_up")
                    if n < CATCH_UP_MODS:
                        break
                catch_up.set_attributes(
                    {"shardlog.documents": mods.total, "shardlog.bytes": mods.bytes, "shardlog.passes": passes}
                )
            with self._phase("critical section") as critical:
                before = (mods.total, mods.bytes)
                reply = await self._ask_self_with_offset(s.EnterCriticalSection(id=m.id))
                self._progress(m.id, phase="critical section", criticalSince=time.time())
                fault_point("migration.critical_section")
                if not reintroduced("migration-without-catch-up"):
                    await mods.transfer_until(reply)  # every write to the range before the critical section
                critical.set_attributes(
                    {"shardlog.documents": mods.total - before[0], "shardlog.bytes": mods.bytes - before[1]}
                )
                await self._ask_recipient(m, s.CommitClone(id=m.id))
        self._progress(m.id, phase="committing")
        fault_point("migration.clone_committed")

    async def _ask_self_with_offset(self, req) -> int:
        """Send to our own processor; the changelog offset just past the recorded step.  The
        critical section waits for prepared transactions of the collection to be decided (as
        MongoDB's does: decisions/0020), asking again for up to STEP_DEADLINE_S."""
        deadline, pause = time.monotonic() + STEP_DEADLINE_S, 0.005
        while True:
            reply = await self.requester.request(
                self.topics.shard_requests(self.shard_id), req, timeout=STEP_DEADLINE_S
            )
            if reply.ok or reply.code != ErrorCode.PrepareConflict or time.monotonic() > deadline:
                break
            self._check_active()
            self.prepare_waits += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
        if not reply.ok:
            raise MigrationAborted(f"{req.type} refused: {reply.code}: {reply.error}")
        return reply.configTime or 0  # a shard's reply names its changelog position

    # ------------------------------------------------------------- the bulk clone

    async def _bulk_clone(self, m: Migration, rng: Range) -> int:
        """Send the range's stored documents as they are (TransferBatch.stored), up to
        migrationCloneBatchesInFlight batches unacknowledged, the next batch scanned while they
        are; return once every batch is acknowledged (the barrier).  A reply late for
        REQUEST_TIMEOUT_S sends every unacknowledged batch again, in order; no reply for
        STEP_DEADLINE_S aborts.  Throttled (migrationThrottleUnderLoad) while either shard
        serves clients: one batch of at most THROTTLED_BATCH_BYTES in flight."""
        topic = self.topics.shard_requests(m.recipient)
        window: CloneWindow[tuple[bytes, int, int]] = CloneWindow(1)  # (request, documents, bytes)
        replies: dict[asyncio.Future[Reply], tuple[int, trace.Span]] = {}
        batches = self._stored_batches(m.ns, rng)
        next(batches)  # primed: each send(max bytes) now answers a batch
        cloned, peer_busy, scanned_all = 0, False, False
        deadline = time.monotonic() + STEP_DEADLINE_S
        try:
            while True:
                settings = self.catalog.settings
                throttled = settings.migrationThrottleUnderLoad and (peer_busy or self.client_busy())
                window.limit = 1 if throttled else settings.migrationCloneBatchesInFlight
                while not scanned_all and window.open():
                    self._check_active(m)
                    batch = batches.send(THROTTLED_BATCH_BYTES if throttled else CLONE_BATCH_BYTES)
                    if batch is None:
                        scanned_all = True
                        break
                    stored, size = batch
                    request = Codec.encode(_clone_request(m.id, stored))
                    seq = window.sent((request, len(stored), size))
                    await self._send_clone_batch(topic, seq, request, len(stored), size, replies)
                    await asyncio.sleep(0)  # the replies' reader runs between two scans
                if window.drained():
                    return cloned
                done, _ = await asyncio.wait(replies, timeout=REQUEST_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
                self._check_active(m)
                if not done:
                    if time.monotonic() > deadline:
                        raise MigrationAborted(f"{topic} did not answer a clone batch within {STEP_DEADLINE_S:g}s")
                    for fut, (_, span) in replies.items():
                        self.requester.forget(fut)
                        span.end()
                    replies.clear()
                    for seq, (request, docs, size) in window.timed_out():
                        await self._send_clone_batch(topic, seq, request, docs, size, replies)
                    continue
                for fut in done:
                    seq, span = replies.pop(fut)
                    span.end()
                    reply = fut.result()
                    if not reply.ok:
                        raise MigrationAborted(f"TransferBatch refused: {reply.code}: {reply.error}")
                    acked = window.acked(seq)
                    if acked is None:
                        continue  # a batch sent twice: its first reply counted
                    deadline = time.monotonic() + STEP_DEADLINE_S
                    peer_busy = bool((reply.result or {}).get("busy"))
                    cloned += acked[1]
                    self._progress(m.id, cloned=cloned, bytes=self.progress[m.id]["bytes"] + acked[2])
                    fault_point("migration.cloning")
        finally:
            batches.close()
            for fut, (_, span) in replies.items():
                self.requester.forget(fut)
                span.end()

    async def _send_clone_batch(
        self,
        topic: str,
        seq: int,
        request: bytes,
        docs: int,
        size: int,
        replies: dict[asyncio.Future[Reply], tuple[int, trace.Span]],
    ) -> None:
        """Send one clone batch under its span (ended by its reply), retrying a broker's retriable error."""
        span = tracing.tracer.start_span(
            "migration clone batch", attributes={"shardlog.documents": docs, "shardlog.bytes": size}
        )
        headers = [("config-time", str(self.follower.config_time).encode())]
        deadline = time.monotonic() + STEP_DEADLINE_S
        with trace.use_span(span, end_on_exit=False):
            while True:
                try:
                    fut = await self.requester.send(topic, request, headers=headers)
                    break
                except BusError as e:
                    if not (e.retriable or isinstance(e, KafkaTimeoutError)) or time.monotonic() > deadline:
                        span.end()
                        raise
                    log.info("shard %s: a clone batch to %s failed (%r); retrying", self.shard_id, topic, e)
                    await asyncio.sleep(0.5)
        replies[fut] = (seq, span)

    def _stored_batches(
        self, ns: str, rng: Range
    ) -> Generator[tuple[list[tuple[str, int, str]], int] | None, int, None]:
        """The range's stored documents in batches of at most CLONE_BATCH_DOCS documents and the
        bytes sent in (`send(max bytes)`); None once the range is scanned.  One iterator over the
        committed store throughout (RocksDB's snapshot of it): nothing is decoded, each key is
        split into shard key and _id by `key_length` alone."""
        it = self.documents.scan_stored_raw(ns, rng.lo, rng.hi, inclusive=True)
        limit = yield None  # primed by the first send
        for k, v in it:
            stored, size = [(k.hex(), _shard_key_length(k), v.decode())], len(v)
            for k, v in it:
                stored.append((k.hex(), _shard_key_length(k), v.decode()))
                size += len(v)
                if len(stored) >= CLONE_BATCH_DOCS or size >= limit:
                    break
            limit = yield stored, size
        while True:
            yield None

    async def _clone_batches(self, ns: str, rng: Range):
        after = rng.lo
        first = True
        while True:
            self._check_active()
            batch, size, last = [], 0, None
            for k, doc in self.documents.scan_stored(ns, after, rng.hi, inclusive=first):
                skey = shard_key_part(k, doc)
                batch.append({"skey": skey.hex(), "doc": doc})
                size += _size(doc)
                last = k
                if len(batch) >= CLONE_BATCH_DOCS or size >= CLONE_BATCH_BYTES:
                    break
            if not batch:
                return
            yield batch
            after, first = last, False
            await asyncio.sleep(0)

    def _session_batches(self, ns: str, rng: Range) -> Iterator[list[s.SessionStatements]]:
        """The committed transactions-table statements about documents of the range, in batches."""
        batch: list[s.SessionStatements] = []
        for entry in self.documents.stored_sessions():
            found = retryable.in_range(entry, ns, rng.lo, rng.hi)
            if found is not None:
                batch.append(found)
            if len(batch) >= CLONE_BATCH_DOCS:
                yield batch
                batch = []
        if batch:
            yield batch

    async def _commit(self, m: Migration, rng: Range) -> tuple[bool, int]:
        with self._phase("commit") as span:
            committed, at = await self._commit_step(m, rng)
            span.set_attribute("shardlog.migration.committed", committed)
            return committed, at

    async def _commit_step(self, m: Migration, rng: Range) -> tuple[bool, int]:
        await self._ask_self(s.EnterCriticalSection(id=m.id, reads=True))
        self._check_active()
        fut = await self.requester.send(
            self.topics.config_commands, cfg.CommitMigration(id=m.id, min=rng.min, max=rng.max)
        )
        fault_point("migration.commit_sent")
        try:
            reply = await aio.wait_for(fut, STEP_DEADLINE_S)
        except TimeoutError:
            return await self._abort(m.id, "the config server did not answer the commit")
        if not reply.ok:
            return await self._abort(m.id, f"commit refused: {reply.code}: {reply.error}")
        fault_point("migration.commit_applied")
        return True, reply.configTime or 0

    async def _abort(
        self, mid: str, reason: str, jumbo: bool = False, code: ErrorCode | None = None
    ) -> tuple[bool, int]:
        """Ask the config server to abort; its answer is the decision (it may have committed)."""
        self._current = None  # the abort itself must not be refused for the migration it ends
        with self._phase("abort", **{"shardlog.migration.reason": reason}) as span:
            result = await self._ask(
                self.topics.config_commands,
                cfg.AbortMigration(id=mid, reason=reason, jumbo=jumbo, code=code),
                deadline=time.monotonic() + STEP_DEADLINE_S,  # then the run loop resumes from the recorded state
            )
            span.set_attribute("shardlog.migration.committed", result.get("outcome") == "committed")
        return result.get("outcome") == "committed", self.follower.config_time

    async def _finish(self, mid: str, recipient: str, committed: bool, at: int) -> None:
        with self._phase("finish", **{"shardlog.migration.committed": committed}):
            await self._finish_steps(mid, recipient, committed, at)

    async def _finish_steps(self, mid: str, recipient: str, committed: bool, at: int) -> None:
        # Our catalog must show the outcome before the critical section ends, so that
        # the requests it held are decided against the new ownership.
        await self.follower.wait_for(at, STEP_DEADLINE_S)
        await self._ask_self(s.RecordDecision(id=mid, committed=committed, configTime=self.follower.config_time))
        since = self.progress.get(mid, {}).get("criticalSince")
        if since is not None:  # the critical section ends with the recorded decision
            self._progress(mid, criticalMs=round((time.time() - since) * 1000, 1))
        fault_point("migration.decision_recorded")
        await self._ask(
            self.topics.shard_requests(recipient),
            s.FinishReceipt(id=mid, committed=committed),
            deadline=time.monotonic() + STEP_DEADLINE_S,  # then the run loop resumes from the recorded state
        )
        fault_point("migration.range_tasks_updated")
        await self._ask_self(s.ForgetMigration(id=mid))


def _clone_request(mid: str, stored: list[tuple[str, int, str]]) -> s.TransferBatch:
    """A clone batch: its documents' stored bytes, but for a document so large that its value,
    escaped as a JSON string (at most twice as long), might not fit a record: that one goes
    decoded, as the per-document path sends it (its record form fits, MAX_DOCUMENT_RECORD_BYTES)."""
    if all(len(v) <= STORED_VALUE_MAX for _, _, v in stored):
        return s.TransferBatch(id=mid, phase="clone", stored=stored)
    written = [{"skey": k[: 2 * n], "doc": decode_doc(v.encode())} for k, n, v in stored if len(v) > STORED_VALUE_MAX]
    small = [e for e in stored if len(e[2]) <= STORED_VALUE_MAX]
    return s.TransferBatch(id=mid, phase="clone", stored=small, written=written)


def _shard_key_length(key: bytes) -> int:
    """The length of the shard-key part of a stored document's key (shard key values, then the
    _id's encoding): every value but the last."""
    at, last = 0, 0
    while at < len(key):
        last = at
        at += key_length(key, at)
    return last


def _ejson(bound: dict[str, Any] | None) -> str:
    """A chunk bound as a span attribute (Extended JSON; None: the collection's end)."""
    return json.dumps(bound, separators=(",", ":"), default=str) if bound is not None else "MaxKey"


class _ModReader:
    """Reads our own changelog from the clone's start and forwards the writes to the range."""

    def __init__(self, coordinator: DonorCoordinator, m: Migration, rng: Range, start: int):
        self.c, self.m, self.rng = coordinator, m, rng
        self.topic = coordinator.topics.shard_changelog(coordinator.shard_id)
        self.start = start
        self.total = 0
        self.bytes = 0  # of the changelog records forwarded

    async def __aenter__(self):
        # Opened in the background (a consumer takes ~0.1 s to start): the first pass waits for it.
        self._reader = partition_reader(
            self.c.bus, self.topic, start=self.start, client_id=f"shard-{self.c.shard_id}-mods"
        )
        self._opening = asyncio.create_task(aio.wait_for(self._reader.__aenter__(), STEP_DEADLINE_S))
        return self

    async def __aexit__(self, *exc):
        try:
            await self._opening
        except Exception:
            return  # it never opened
        await self._reader.__aexit__(*exc)

    async def _opened(self) -> None:
        self.reader = await self._opening

    async def _position(self) -> int:
        # aiokafka's position() waits for a valid position with no limit of its own.
        return await aio.wait_for(self.reader.position(), REQUEST_TIMEOUT_S)

    async def transfer_until(self, end: int | None) -> int:
        """Forward the range's writes up to `end` (None: the log's end now); how many."""
        await self._opened()
        target = end if end is not None else await self.reader.log_end()
        deadline = time.monotonic() + STEP_DEADLINE_S
        written, removed, n, size = [], [], 0, 0
        sessions: list[s.SessionStatements] = []

        async def flush():
            nonlocal written, removed, size, sessions
            if written or removed or sessions:
                await self.c._ask_recipient(
                    self.m,
                    s.TransferBatch(id=self.m.id, phase="mods", written=written, removed=removed, sessions=sessions),
                )
                self.total += len(written) + len(removed)
                self.bytes += size
                self.c._progress(self.m.id, mods=self.total)
            written, removed, size, sessions = [], [], 0, []

        async def on_batch(records):
            nonlocal n, size
            # Every fetched record is forwarded, even past the target: skipping one would lose
            # it, since the next pass starts after it.  (Past the critical section's record
            # there is no write to the range: they are refused.)
            for rec in records:
                if rec.value is None:
                    # A tombstone (Tombstone(key)): a session record replaced by a newer txnNumber,
                    # whose record follows, or forgotten by the reaper; the recipient's own reaper
                    # forgets what it received of an expired session.
                    continue
                try:
                    e = s.changelog.decode(rec.value)
                except RecordError:
                    continue
                if isinstance(e, s.RetryableWriteRecorded):
                    if reintroduced("migration-forgets-sessions"):
                        continue
                    found = retryable.record_in_range(e, self.m.ns, self.rng.lo, self.rng.hi)
                    if found is not None:
                        sessions.append(found)
                        if len(sessions) >= CLONE_BATCH_DOCS:
                            await flush()
                    continue
                if (
                    isinstance(e, (s.DocumentWritten, s.DocumentRemoved))
                    and e.ns == self.m.ns
                    and self.rng.lo <= bytes.fromhex(e.skey) < self.rng.hi
                ):
                    if isinstance(e, s.DocumentWritten):
                        written.append({"skey": e.skey, "doc": e.doc})
                    else:
                        removed.append({"skey": e.skey, "id": e.id})
                    n += 1
                    size += len(rec.value)
                    if len(written) + len(removed) >= CLONE_BATCH_DOCS or size >= CLONE_BATCH_BYTES:
                        await flush()

        # A pass to the log's end (end None) stops one short of it rather than wait 100 ms for
        # nothing: read_committed stops before the last commit marker, and a record left there is
        # the next pass's (the consumer keeps its position; the last pass goes to an exact `end`).
        stop = target if end is not None else target - 1
        while await self._position() < stop:
            # Bounded, and an abort (setAllowMigrations false, a DDL, the config server's
            # decision) ends the pass at once rather than after the log reaches the target.
            self.c._check_active(self.m)
            if time.monotonic() > deadline:
                raise MigrationAborted(
                    f"the mods of migration {self.m.id} did not reach changelog offset {target} within "
                    f"{STEP_DEADLINE_S:g}s ({STEP_DEADLINE_ENV})",
                    code=ErrorCode.ExceededTimeLimit,
                )
            batch = await self.reader.fetch(max_records=5000, timeout_s=0.1)
            await on_batch(batch)
            if end is None and not batch:
                # read_committed may stop one short of the end (a commit marker): good enough for a pass
                if await self._position() >= target - 1:
                    break
        await flush()
        return n
