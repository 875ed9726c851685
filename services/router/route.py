"""Routing one client operation: target shards from the routing-table cache,
send each its part with the routing it was chosen by, merge the replies.

StaleConfig from a shard means our cache is behind (or ahead): wait until the
cache reaches the shard's ConfigTime, re-target, retry — at most
MAX_STALE_RETRIES times (MongoDB's 10), then fail clearly.  A shard that
fails or does not answer fails the whole operation: no silently short results.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from domain import clock as vclock
from domain import targeting
from domain.bsonvalues import from_record
from domain.ddl import ddl_lock_wait
from domain.follower import CatalogFollower
from domain.logical_sessions import check_lsids, session_id
from domain.protocol import (
    CONFIG_TIME,
    CURSOR_TIMEOUT_S,
    MAX_BATCH_BYTES,
    ErrorCode,
    check_document_size,
    record_bytes,
    split_ns,
)
from domain.query import (
    QueryError,
    apply_projection,
    check_insert_document,
    check_update,
    compile_filter,
    merge_sorted,
    sort_key,
)
from domain.session import RetryableWrite, client_session
from domain.shardkey import ShardKeyError, ShardKeyTooLarge
from libs import tracing
from libs.dispatch import Dispatch
from libs.errors import CommandError
from libs.ids import new_object_id
from libs.metrics import OperationCounters, measured
from libs.requests import Requester, RequestTimeout
from libs.topics import Topics
from schemas import config as cfg
from schemas import shard as s
from services.router.sessions import LogicalSessionCache
from services.router.transactions import (
    Statement,
    TransactionRouter,
    TxnArgs,
    check_read_concern,
    current_statement,
    resent_start,
)

MAX_STALE_RETRIES = 10
SHARD_TIMEOUT_S = 30.0
CRITICAL_WAIT_S = 10.0  # how long one retry waits for a critical section to end
AFTER_CLUSTER_TIME_WAIT_S = 10.0  # how long a causally consistent read waits for the catalog to catch up
WRITE_CONFLICT_RETRY_S = 60.0  # MongoDB's transactionLifetimeLimitSeconds: no transaction holds a lock longer
WRITE_CONFLICT_BACKOFF_S = (0.005, 0.1)  # the first and the longest pause between two tries
# A read or write that met a prepared transaction's documents (two-phase commit, decision 0020):
# nothing was applied, and the answer waits for the coordinator's decision, which follows at once.
PREPARE_CONFLICT = "PrepareConflict"


def write_conflict_retry() -> float:
    """How long a write outside any transaction is retried while an open transaction holds a
    document it writes (the shard answers WriteConflict; decision 0020): SHARDLOG_WRITE_CONFLICT_RETRY_S
    seconds (default 60), less if the command's maxTimeMS ends first."""
    raw = os.environ.get("SHARDLOG_WRITE_CONFLICT_RETRY_S", "")
    try:
        return max(0.0, float(raw)) if raw else WRITE_CONFLICT_RETRY_S
    except ValueError:
        return WRITE_CONFLICT_RETRY_S


# The largest operationTime of the shards one client operation reached (docs/decisions/0014).
_operation_time: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("operation_time", default=None)

# The shards one client operation reached, for its routing span.
_targets: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("targets", default=None)


class Stale(Exception):
    def __init__(self, config_time: int, critical: bool = False):
        self.config_time = config_time
        self.critical = critical  # a migration's critical section: the commit or abort is the next ConfigTime


@dataclass
class RouterCursor:
    docs: list[dict]
    created: float  # when it was last used: a cursor idle for CURSOR_TIMEOUT_S is dropped
    session: str | None = None  # the id of the lsid it was opened under: killSessions kills it
    ns: str | None = None  # what a getMore must name (the wire's check); None: not checked
    no_timeout: bool = False  # find's noCursorTimeout: kept until exhausted or killed


WRITES = (s.Insert, s.Update, s.Delete, s.FindAndModify)
# What a statement inside a transaction may be (the wire refuses the rest with 263 first).
TXN_STATEMENTS = (*WRITES, s.Find, s.GetMore)


def _session_fields(req: Any, stmt_ids: list[int]) -> dict[str, Any]:
    """What a shard part carries of the client's session (docs/decisions/0015): the lsid and
    txnNumber as sent, and the statement ids of the part (only for a retryable write)."""
    write: RetryableWrite | None = client_session(req)
    return {
        "lsid": req.lsid,
        "txnNumber": req.txnNumber,
        "stmtIds": stmt_ids if write is not None else None,
    }


# Client operations that are routed by shard key (and retried on StaleConfig).
on_operation: Dispatch[OperationRouter, Awaitable[dict]] = Dispatch("client operation")


class OperationRouter:
    def __init__(
        self,
        topics: Topics,
        follower: CatalogFollower,
        requester: Requester,
        cursor_topic: str,
        sessions: LogicalSessionCache,
        clock: vclock.VectorClock | None = None,
        metrics: OperationCounters | None = None,
    ):
        self.topics, self.follower, self.requester = topics, follower, requester
        self.metrics = metrics or OperationCounters()  # every operation and its client-seen time
        self.sessions = sessions
        # Never ticked here: advanced by the catalog, the shards' replies and clients' signed times.
        self.clock = clock or vclock.VectorClock()
        self.causal_refreshes = 0  # reads after a ClusterTime that made the catalog catch up first
        self.topology_refreshes = 0
        self._topology_refresh: asyncio.Task | None = None
        self._signed: tuple[int, int, dict] | None = None  # (time, keys made, $clusterTime): the last signed
        self.cursor_topic = cursor_topic
        self.cursors: dict[int, RouterCursor] = {}
        self._cursor_ids = itertools.count(int.from_bytes(os.urandom(4), "big") << 16)
        self.stale_retries = 0
        self.write_conflict_retries = 0  # tries again of writes that met an open transaction's document
        self.transactions = TransactionRouter(self._ask_past_critical_sections)
        self._creating: dict[str, asyncio.Future] = {}

    @property
    def catalog(self):
        return self.follower.catalog

    @measured
    async def handle(self, req) -> dict:
        """The result of one client operation; raises CommandError.  Traced as the routing span
        "route <type>", with the shards the operation reached (`shardlog.shards`)."""
        targets: set[str] = set()
        _targets.set(targets)
        with tracing.span(f"route {req.type}", tracing.db_attributes(getattr(req, "ns", None), req.type)) as span:
            try:
                return await self._handle(req)
            finally:
                if targets and span.is_recording():
                    span.set_attribute("shardlog.shards", sorted(targets))

    async def _handle(self, req) -> dict:
        _operation_time.set([0])
        if getattr(req, "routing", None) is not None:
            raise CommandError(ErrorCode.BadValue, "clients do not send routing; routers add it")
        if isinstance(req, (s.StartTransaction, s.CommitTransaction, s.AbortTransaction)):
            return await self._transaction_command(req)
        if (txn := getattr(req, "txn", None)) is not None:
            # the client library's statement of the transaction it started (StartTransaction)
            if current_statement.get() is not None:
                raise CommandError(ErrorCode.BadValue, "a statement names its transaction once")
            self.sessions.use({"id": txn.lsid})
            statement = self.transactions.continues(txn)
            return await self.transactions.run(statement, lambda: self._handle(req.model_copy(update={"txn": None})))
        if (statement := current_statement.get()) is not None:
            req = _in_transaction(req, statement)
        # A refused $clusterTime refuses the operation: nothing is sent.
        self._gossip_in(getattr(req, "clusterTime", None))
        if isinstance(req, (s.EndSessions, s.KillSessions)):
            return await self.end_sessions(req)
        if getattr(req, "lsid", None) is not None:
            self.sessions.use(req.lsid)  # a malformed lsid is refused here, before anything is sent
        if isinstance(req, s.GetMore):  # a cursor this router holds: no routing, nothing stale
            return self.get_more(req)
        if not on_operation.handles(req):
            raise CommandError(ErrorCode.CommandNotFound, f"{req.type} is not a client operation")
        split_ns(req.ns)  # InvalidNamespace before anything is sent
        if isinstance(req, WRITES):
            client_session(req)  # a malformed lsid or txnNumber, or stmtIds, refused before anything is sent
        if isinstance(req, s.Find) and _snapshot(req.readConcern):
            req = req.model_copy(update={"readConcern": await self._snapshot_at(req.readConcern)})
        elif isinstance(req, (s.Find, s.Count)):
            await self._read_after(req.readConcern)
        stale: Stale | None = None
        for attempt in range(MAX_STALE_RETRIES):
            try:
                if stale is None:
                    self._check_transaction_snapshot(req)
                    return await on_operation(self, req)
                # Each retry is a span of its own (the wait for the catalog and the re-routed
                # attempt), so a trace shows where a StaleConfig cost its time.
                with tracing.span(
                    "router StaleConfig retry",
                    {
                        "shardlog.retry.attempt": attempt,
                        "shardlog.stale.config_time": stale.config_time,
                        "shardlog.stale.critical_section": stale.critical,
                        "shardlog.routed_at": self.follower.config_time,
                    },
                ):
                    await self._wait_out(stale, attempt)
                    self._check_transaction_snapshot(req)
                    return await on_operation(self, req)
            except Stale as e:
                self.stale_retries += 1
                stale = e
            except QueryError as e:
                raise CommandError(e.code, str(e)) from None
        raise CommandError(
            ErrorCode.StaleConfig, f"routing for {req.ns} was still stale after {MAX_STALE_RETRIES} retries"
        )

    def _check_transaction_snapshot(self, req: Any) -> None:
        """A transaction's statement on a namespace dropped or renamed (or whose database was
        dropped or moved its primary) since its snapshot is SnapshotUnavailable, before anything
        is sent or created (an insert would create the collection again), on every attempt: a
        DDL's critical section makes the statement wait, and the DDL may have happened since."""
        if (txn := getattr(req, "txn", None)) is not None:
            vclock.check_snapshot_floor(txn.readAt, self.catalog.snapshot_floor(req.ns))

    async def _transaction_command(self, req: s.StartTransaction | s.CommitTransaction | s.AbortTransaction) -> dict:
        """The client library's start, commit and abort of a session's transaction (the wire's
        are services/router/wire/transactions.py): the same per-session state."""
        self._gossip_in(getattr(req, "clusterTime", None))
        self.sessions.use({"id": req.lsid})
        if isinstance(req, s.CommitTransaction):
            return await self.transactions.commit(req.lsid, req.txnNumber)
        if isinstance(req, s.AbortTransaction):
            return await self.transactions.abort(req.lsid, req.txnNumber)
        rc = None if req.readConcern is None else check_read_concern(req.readConcern)
        # One start of a session at a time: a resend that arrives while the first is still
        # picking its snapshot then finds it, rather than starting it again at another.
        async with self.transactions.starting(req.lsid):
            if (again := resent_start(self.transactions.sessions.get(req.lsid), req.txnNumber)) is not None:
                return {"readAt": again}
            args = TxnArgs(req.txnNumber, start=True, read_concern=rc)
            statement = await self.transactions.begin(req.lsid, args, self.snapshot_time)
            return {"readAt": statement.txn.readAt}

    # ------------------------------------------------------------ the clock

    def gossip_in(self, raw: Any) -> None:
        """A client's $clusterTime, for an edge that checks it once per command (the wire)."""
        self._gossip_in(raw)

    def _gossip_in(self, raw: Any) -> None:
        """Advance to a client's $clusterTime: above ours only if signed by a key of the cluster,
        and never beyond the drift limit (docs/decisions/0014)."""
        if raw is None:
            return
        t = vclock.validate_cluster_time(
            vclock.parse_signed_cluster_time(raw),
            self.clock.cluster_time,
            self.catalog.keys,
            time.time(),
            self.catalog.settings.maxAcceptableLogicalClockDriftSecs,
        )
        self.clock.advance(t)

    async def _read_after(self, read_concern: Any) -> None:
        """A causally consistent read: a time nobody handed out is refused; a time after our
        catalog's ConfigTime stamp may follow config events we have not applied (the database
        the session wrote to, say), so the catalog first catches up to the end of config.events
        — bounded: MaxTimeMSExpired rather than an answer from a stale catalog."""
        after = vclock.parse_after_cluster_time(read_concern)
        if _snapshot(read_concern):  # (a snapshot find does not come here)
            raise CommandError(
                ErrorCode.InvalidOptions, 'Command count does not support { readConcern: { level: "snapshot" } }'
            )
        if after is None:
            return
        await self._catalog_at(after)

    async def _snapshot_at(self, read_concern: dict) -> dict:
        """A snapshot read's time (issue 32): the one it names, or this router's ClusterTime (every
        write acknowledged through it is stamped at or before); a time nobody has handed out is
        refused.  The catalog first catches up to it: the routing at that time needs every
        migration committed before it."""
        after = vclock.parse_after_cluster_time(read_concern)  # (and the read concern's shape)
        if after is not None:  # a causal snapshot session: at a time at least that
            vclock.check_after_cluster_time(after, self.clock.cluster_time)
        if "atClusterTime" in read_concern:
            at = vclock.parse_at_cluster_time(read_concern)
            assert at is not None
            if at > self.clock.cluster_time:
                raise CommandError(
                    ErrorCode.InvalidOptions,
                    f"readConcern atClusterTime value {vclock.LogicalTime.unpack(at)} must not be greater than "
                    f"the current clusterTime {vclock.LogicalTime.unpack(self.clock.cluster_time)}",
                )
        else:
            at = self.clock.cluster_time
        await self._catalog_at(at)
        return {"level": "snapshot", "atClusterTime": vclock.to_ejson(at)}

    async def snapshot_time(self, read_concern: dict) -> int:
        """A transaction's readAt (decision 0020): chosen as a snapshot read's time is."""
        at = vclock.parse_at_cluster_time(await self._snapshot_at(read_concern))
        assert at is not None
        return at

    async def _catalog_at(self, after: int) -> None:
        """A read after (or at) `after`: a time nobody handed out is refused; a time after our
        catalog's ConfigTime stamp may follow config events we have not applied, so the catalog
        first catches up to the end of config.events (bounded: MaxTimeMSExpired)."""
        vclock.check_after_cluster_time(after, self.clock.cluster_time)
        if after <= self.catalog.config_ts:
            return
        self.causal_refreshes += 1
        try:
            await self.follower.refresh(AFTER_CLUSTER_TIME_WAIT_S)
        except TimeoutError:
            raise CommandError(
                ErrorCode.MaxTimeMSExpired,
                f"the router's catalog did not reach the end of config.events within {AFTER_CLUSTER_TIME_WAIT_S:g}s "
                f"for a read after {vclock.LogicalTime.unpack(after)}",
            ) from None

    def begin_operation(self) -> None:
        """A new client command starts (the wire edge: one task per connection runs many)."""
        _operation_time.set([0])

    def reached_time(self) -> int:
        """The largest operationTime of the shards the last operation reached (0: none)."""
        box = _operation_time.get()
        return box[0] if box else 0

    def operation_time(self) -> int:
        """This operation's operationTime: the largest of the shards it reached, else our ClusterTime."""
        box = _operation_time.get()
        return (box[0] if box else 0) or self.clock.cluster_time

    def signed_cluster_time(self) -> dict:
        """`$clusterTime` for a client reply, signed with the current key."""
        t, made = self.clock.cluster_time, len(self.catalog.keys)
        if self._signed is None or self._signed[:2] != (t, made):
            self._signed = (t, made, vclock.signed_cluster_time(t, self.catalog.keys))
        return self._signed[2]

    def _topology_news(self) -> None:
        """Gossip showed a TopologyTime our catalog has not applied: catch up in the background."""
        if self.clock.now().topology <= self.catalog.topology_ts:
            return
        if self._topology_refresh is None or self._topology_refresh.done():
            self.topology_refreshes += 1

            async def refresh() -> None:
                try:
                    await self.follower.refresh(SHARD_TIMEOUT_S)
                except TimeoutError:
                    pass

            self._topology_refresh = asyncio.ensure_future(refresh())

    # ------------------------------------------------------------ plumbing

    def _routing(self, ns: str, shard: str) -> s.Routing:
        coll = self.catalog.collections.get(ns)
        at = self.follower.config_time
        if coll is None:
            return s.Routing(configTime=at)
        return s.Routing(configTime=at, epoch=coll.epoch, version=coll.shard_version(shard).pair)

    async def _ask(self, shard: str, req) -> dict:
        """Send a request to one shard; its result, or Stale / CommandError.  A statement of a
        transaction notes the shard as a participant.  A write outside any transaction that meets
        an open transaction's document (WriteConflict), or anything that meets a prepared one's
        (PrepareConflict), is sent again (nothing was applied: the same statement ids are safe)
        until the holder ends or write_conflict_retry() passes, as MongoDB's operation waits for
        the lock."""
        statement = current_statement.get() if getattr(req, "txn", None) is not None else None
        deadline, pause = 0.0, WRITE_CONFLICT_BACKOFF_S[0]
        while True:
            try:
                result = await self._ask_once(shard, req)
            except CommandError as e:
                if statement is not None and e.code != PREPARE_CONFLICT:
                    statement.reached(shard, req, None)
                if not _waits(e.code, req, statement is not None):
                    raise
                deadline = deadline or time.monotonic() + write_conflict_retry()
                if time.monotonic() + pause > deadline:
                    raise
                self.write_conflict_retries += 1
                await asyncio.sleep(pause)
                pause = min(pause * 2, WRITE_CONFLICT_BACKOFF_S[1])
                continue
            if statement is not None:
                statement.reached(shard, req, result)
            return result

    async def _wait_out(self, stale: Stale, attempt: int) -> None:
        """Behind the shard: wait to reach it.  Held by a critical section: wait for the next
        ConfigTime (the migration's commit or abort) — but not for long at first: after an abort
        the donor lets go with no new ConfigTime at all."""
        timeout = min(CRITICAL_WAIT_S, 0.05 * 2 ** (attempt - 1)) if stale.critical else SHARD_TIMEOUT_S
        try:
            await self.follower.wait_for(stale.config_time, timeout)
        except TimeoutError:
            pass

    async def _ask_past_critical_sections(self, shard: str, req) -> dict:
        """A transaction's commit, abort or ask for two-phase commit's decision, which no
        retargeting changes: asked again
        once a migration's critical section it met has ended (the commit then finds whether the
        range moved)."""
        for attempt in range(1, MAX_STALE_RETRIES + 1):
            try:
                return await self._ask(shard, req)
            except Stale as stale:
                await self._wait_out(stale, attempt)
        raise CommandError(
            ErrorCode.StaleConfig, f"{req.type} on {shard} met a critical section {MAX_STALE_RETRIES} times"
        )

    async def _ask_once(self, shard: str, req) -> dict:
        if (targets := _targets.get()) is not None:
            targets.add(shard)
        routed_at = self.follower.config_time
        headers = [(CONFIG_TIME, str(routed_at).encode())]
        try:
            reply = await self.requester.request(
                self.topics.shard_requests(shard), req, timeout=SHARD_TIMEOUT_S, headers=headers
            )
        except RequestTimeout:
            raise CommandError(
                ErrorCode.ShardUnavailable, f"shard {shard} did not answer within {SHARD_TIMEOUT_S:g}s"
            ) from None
        if reply.operationTime and (box := _operation_time.get()) is not None and reply.operationTime > box[0]:
            box[0] = reply.operationTime
        self._topology_news()
        if reply.ok:
            result: dict = from_record(reply.result or {})  # documents' BSON values back (decision 0016)
            return result
        if reply.code == ErrorCode.StaleConfig:
            info = reply.result or {}
            if info.get("critical"):
                # Held by a critical section: what ends it is the first ConfigTime after the one
                # we routed at (the commit or abort), which may have arrived meanwhile.
                raise Stale(max(int(info.get("configTime") or 0), routed_at + 1), True)
            raise Stale(int(info.get("configTime") or 0))
        raise CommandError(reply.code or "Error", reply.error or "", from_record(reply.result))

    async def _ask_all(self, parts: list[tuple[str, Any]]) -> list[dict]:
        results = await asyncio.gather(*(self._ask(shard, req) for shard, req in parts), return_exceptions=True)
        stale = [r for r in results if isinstance(r, Stale)]
        if stale:
            raise Stale(max(r.config_time for r in stale), any(r.critical for r in stale))
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    async def _ensure_collection(self, ns: str) -> None:
        """Before the first write to an unsharded collection, the catalog tracks it (creating its
        database if needed, as MongoDB does), so that sharding it later knows it holds data."""
        db = self.catalog.databases.get(ns.partition(".")[0])
        if ns in self.catalog.collections or (db is not None and ns in db.collections):
            return
        if ns not in self._creating:  # concurrent first writes share one request
            self._creating[ns] = asyncio.ensure_future(self._create_collection(ns))
        try:
            await asyncio.shield(self._creating[ns])
        finally:
            if self._creating.get(ns) is not None and self._creating[ns].done():
                self._creating.pop(ns, None)

    async def _create_collection(self, ns: str) -> None:
        # A DDL coordinator holding the namespace (a drop under way) makes the first write wait
        # for it, as MongoDB's writes wait for the DDL lock: bounded by SHARDLOG_DDL_LOCK_WAIT.
        deadline = time.monotonic() + ddl_lock_wait()
        while True:
            reply = await self.requester.request(
                self.topics.config_commands, cfg.CreateCollection(ns=ns), timeout=SHARD_TIMEOUT_S
            )
            if reply.code != ErrorCode.ConflictingOperationInProgress or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        if not reply.ok:
            raise CommandError(reply.code or "Error", reply.error or "")
        await self.follower.wait_for(reply.configTime or 0, SHARD_TIMEOUT_S)

    # -------------------------------------------------------------- writes

    @on_operation.register(s.Insert)
    async def insert(self, req: s.Insert) -> dict:
        await self._ensure_collection(req.ns)
        errors: list[dict] = []
        runs: list[tuple[str, list[int]]] = []  # (shard, indexes into docs), in order
        docs = []
        for i, doc in enumerate(req.docs):
            try:
                doc = _with_id(doc)
                check_document_size(doc)
                shard, _ = targeting.for_document(self.catalog, req.ns, doc)
                if shard is None:
                    raise CommandError(ErrorCode.NamespaceNotFound, f"database of {req.ns} does not exist")
            except (CommandError, ShardKeyError) as e:
                errors.append(_write_error(i, e))
                if req.ordered:
                    break
                docs.append(None)
                continue
            docs.append(doc)
            if req.ordered and runs and runs[-1][0] == shard:
                runs[-1][1].append(i)
            elif not req.ordered and (run := next((r for r in runs if r[0] == shard), None)):
                run[1].append(i)
            else:
                runs.append((shard, [i]))
        parts = [
            (
                shard,
                s.Insert(
                    ns=req.ns,
                    docs=[docs[i] for i in idx],
                    ordered=req.ordered,
                    routing=self._routing(req.ns, shard),
                    txn=req.txn,
                    # statement i is the client's document i, whichever shard holds it
                    **_session_fields(req, [req.firstStmtId + i for i in idx]),
                ),
            )
            for shard, idx in runs
        ]
        if req.ordered:  # one run after another, stopping at the first error
            results = []
            for shard, part in parts:
                results.append(await self._ask(shard, part))
                if results[-1]["writeErrors"]:
                    break
        else:
            results = await self._ask_all(parts)
        inserted = 0
        for (_, idx), result in zip(runs, results):
            inserted += result["inserted"]
            errors += [{**e, "index": idx[e["index"]]} for e in result["writeErrors"]]
        errors.sort(key=lambda e: e["index"])
        return {"inserted": inserted, "writeErrors": errors}

    @on_operation.register(s.Update)
    async def update(self, req: s.Update) -> dict:
        if req.upsert:
            await self._ensure_collection(req.ns)
        t = targeting.for_query(self.catalog, req.ns, req.filter)
        if not t.shards and not req.upsert:
            _refuse_malformed(req)  # no shard will look at it: refused here, as MongoDB would
            return {"matched": 0, "modified": 0}
        if req.upsert and t.sharded and not t.full_key:
            raise CommandError(
                ErrorCode.ShardKeyNotFound,
                "an upsert on a sharded collection must pin the full shard key (or _id) by equality in its filter",
            )
        if req.sort and len(t.shards) > 1:
            raise CommandError(
                ErrorCode.ShardKeyNotFound,
                "an updateOne with a sort on a sharded collection must target one shard: pin the shard key in its filter",
            )
        return await self._write_targets(
            req,
            t,
            lambda a, b: {
                "matched": a["matched"] + b["matched"],
                "modified": a["modified"] + b["modified"],
                **({"upsertedId": b["upsertedId"]} if "upsertedId" in b else {}),
            },
            done=lambda r: r["matched"] > 0,
        )

    @on_operation.register(s.Delete)
    async def delete(self, req: s.Delete) -> dict:
        t = targeting.for_query(self.catalog, req.ns, req.filter)
        if not t.shards:
            _refuse_malformed(req)
            return {"deleted": 0}
        return await self._write_targets(
            req, t, lambda a, b: {"deleted": a["deleted"] + b["deleted"]}, done=lambda r: r["deleted"] > 0
        )

    async def _write_targets(self, req, t: targeting.Targets, add, done) -> dict:
        """A multi write goes to every target at once; a single-document write without a
        single target tries the targets one after another and stops at the first that
        matched, so at most one document changes (our answer to updateOne without
        the shard key)."""

        def part(shard):
            # A single-document write is the same statement (0, or its index in a wire batch) on every
            # shard it tries: each records it, so a retry finds no match the first attempt did not.
            stmt = getattr(req, "stmtId", 0)
            return req.model_copy(update={"routing": self._routing(req.ns, shard), **_session_fields(req, [stmt])})

        if getattr(req, "multi", False):
            results = await self._ask_all([(shard, part(shard)) for shard in t.shards])
        else:
            results = []
            for shard in t.shards:
                results.append(await self._ask(shard, part(shard)))
                if done(results[-1]):
                    break
        total = results[0]
        for r in results[1:]:
            total = add(total, r)
        return {k: v for k, v in total.items() if k != "retried"}

    @on_operation.register(s.FindAndModify)
    async def find_and_modify(self, req: s.FindAndModify) -> dict:
        """Routed like a single-document write: the owning shard, or the candidates in turn
        until one matched (with a sort, the collection must be targeted to one shard)."""
        if req.upsert:
            await self._ensure_collection(req.ns)
        t = targeting.for_query(self.catalog, req.ns, req.query)
        if not t.shards and not req.upsert:
            _refuse_malformed(req)
            return {"value": None, "lastErrorObject": {"n": 0} if req.remove else {"n": 0, "updatedExisting": False}}
        if req.upsert and t.sharded and not t.full_key:
            raise CommandError(
                ErrorCode.ShardKeyNotFound,
                "a findAndModify upsert on a sharded collection must pin the full shard key (or _id) by equality",
            )
        if req.sort and len(t.shards) > 1:
            raise CommandError(
                ErrorCode.ShardKeyNotFound,
                "a findAndModify with a sort on a sharded collection must target one shard: "
                "pin the shard key in its query",
            )
        return await self._write_targets(
            req, t, lambda a, b: b if b["lastErrorObject"]["n"] else a, done=lambda r: r["lastErrorObject"]["n"] > 0
        )

    # --------------------------------------------------------------- reads

    @on_operation.register(s.Find)
    async def find(self, req: s.Find) -> dict:
        # In a transaction: routed with the routing table at its snapshot, as a snapshot read.
        at = req.txn.readAt if req.txn is not None else vclock.parse_at_cluster_time(req.readConcern)
        t = targeting.for_query(self.catalog, req.ns, req.filter) if at is None else self._targets_at(req.ns, at)
        docs: list[dict] = []
        if not t.shards:
            _refuse_malformed(req)
        if t.shards:
            # Shards apply the limit of skip+limit; the router skips after merging.  With a sort,
            # the projection waits for the merge (it might drop the sort fields).
            want = req.skip + req.limit if req.limit else 0
            parts = [
                (
                    shard,
                    s.Find(
                        ns=req.ns,
                        filter=req.filter,
                        sort=req.sort,
                        limit=want,
                        projection=None if req.sort else req.projection,
                        batchSize=10_000,
                        routing=self._routing(req.ns, shard),
                        readConcern=req.readConcern,
                        hint=req.hint,
                        txn=req.txn,
                    ),
                )
                for shard in t.shards
            ]
            streams = [await self._drain(shard, first) for (shard, _), first in zip(parts, await self._ask_all(parts))]
            merged = merge_sorted(streams, req.sort) if req.sort else itertools.chain(*streams)
            docs = list(itertools.islice(merged, req.skip, want or None))
            if req.sort and req.projection is not None:
                docs = [apply_projection(d, req.projection) for d in docs]
        out = self._first_batch(docs, req.batchSize, t, session_id(req.lsid) if req.lsid is not None else None)
        return out if at is None or req.txn is not None else {**out, "atClusterTime": at}

    def _targets_at(self, ns: str, at: int) -> targeting.Targets:
        """Every shard that owned a range of `ns` at cluster time `at` (the historical routing
        table); an unsharded collection's primary shard, as now: a time before the primary moved,
        or the namespace was dropped or renamed, is refused (SnapshotUnavailable)."""
        vclock.check_snapshot_floor(at, self.catalog.snapshot_floor(ns))
        coll = self.catalog.collections.get(ns)
        if coll is None:
            return targeting.for_query(self.catalog, ns, {})
        vclock.check_chunk_history(ns, at, coll.history_from)
        shards = tuple(sorted({shard for _, _, shard in coll.routing_at(at)}))
        return targeting.Targets(shards, f"the owners at {vclock.LogicalTime.unpack(at)}", True)

    async def _drain(self, shard: str, first: dict) -> list[dict]:
        docs, cursor = list(first["docs"]), first["cursorId"]
        while cursor:
            more = await self._ask(shard, s.GetMore(cursorId=cursor, batchSize=10_000))
            docs += more["docs"]
            cursor = more["cursorId"]
        return docs

    def _first_batch(self, docs: list[dict], size: int, t: targeting.Targets, session: str | None = None) -> dict:
        self._expire()
        n = _batch_length(docs, size)
        if n == len(docs):
            return {"docs": docs, "cursorId": 0, "shards": list(t.shards)}
        cid = next(self._cursor_ids)
        self.cursors[cid] = RouterCursor(docs[n:], time.monotonic(), session)
        return {"docs": docs[:n], "cursorId": cid, "cursorTopic": self.cursor_topic, "shards": list(t.shards)}

    def open_cursor(
        self, docs: list[dict], batch_size: int, shards: tuple[str, ...] = (), session: str | None = None
    ) -> dict:
        """A cursor over results the router made itself (an aggregation's merge, the config
        database): the first batch, and the rest for getMore, as find's."""
        return self._first_batch(docs, batch_size, targeting.Targets(shards, "router", False), session)

    def get_more(self, req: s.GetMore) -> dict:
        cur = self.cursors.pop(req.cursorId, None)
        if cur is None:
            raise CommandError(
                ErrorCode.CursorNotFound,
                f"cursor {req.cursorId} not found (exhausted, expired, or the router restarted)",
            )
        n = _batch_length(cur.docs, req.batchSize)
        batch, rest = cur.docs[:n], cur.docs[n:]
        if rest:  # used now: the idle timeout starts again, as MongoDB's
            self.cursors[req.cursorId] = RouterCursor(rest, time.monotonic(), cur.session, cur.ns, cur.no_timeout)
        return {"docs": batch, "cursorId": req.cursorId if rest else 0, "cursorTopic": self.cursor_topic}

    def tag_cursor(self, cursor_id: int, ns: str, no_timeout: bool = False) -> None:
        """Name the namespace a cursor's getMores must give, and keep it past the idle timeout."""
        cur = self.cursors.get(cursor_id)
        if cur is not None:
            cur.ns, cur.no_timeout = ns, no_timeout

    def kill_cursors(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """MongoDB's killCursors on this router's cursors: (killed, not found), in the order asked."""
        killed, missing = [], []
        for cid in ids:
            (killed if self.cursors.pop(cid, None) is not None else missing).append(cid)
        return killed, missing

    def _expire(self) -> None:
        now = time.monotonic()
        for cid in [
            c for c, cur in self.cursors.items() if not cur.no_timeout and now - cur.created > CURSOR_TIMEOUT_S
        ]:
            del self.cursors[cid]

    # ------------------------------------------------------------ sessions

    async def end_sessions(self, req: s.EndSessions | s.KillSessions) -> dict:
        """endSessions / killSessions: every lsid is checked before anything changes; the sessions
        leave the cache and the store, and killSessions also kills their cursors here."""
        lsids = check_lsids(req.lsids, "endSessions" if isinstance(req, s.EndSessions) else "killSessions")
        killed = 0
        if isinstance(req, s.KillSessions):
            ids = {session_id(lsid) for lsid in lsids}
            doomed = [cid for cid, cur in self.cursors.items() if cur.session in ids]
            for cid in doomed:
                del self.cursors[cid]
            killed = len(doomed)
        await self.sessions.end(lsids)
        self.transactions.forget([session_id(lsid) for lsid in lsids])
        return {"ended": len(lsids), **({"cursorsKilled": killed} if isinstance(req, s.KillSessions) else {})}

    @on_operation.register(s.Count)
    async def count(self, req: s.Count) -> dict:
        t = targeting.for_query(self.catalog, req.ns, req.filter)
        if not t.shards:
            _refuse_malformed(req)
        parts = [
            (
                shard,
                s.Count(
                    ns=req.ns,
                    filter=req.filter,
                    routing=self._routing(req.ns, shard),
                    readConcern=req.readConcern,
                    hint=req.hint,  # the shards' planner takes it, as a find's
                ),
            )
            for shard in t.shards
        ]
        return {"n": sum(r["n"] for r in await self._ask_all(parts)), "shards": list(t.shards)}

    @on_operation.register(s.Explain)
    async def explain(self, req: s.Explain) -> dict:
        compile_filter(req.filter)  # refuse a bad filter here too
        t = targeting.for_query(self.catalog, req.ns, req.filter)
        # issue 15: each targeted shard's plan and execution (domain/planner.py's explain); the
        # shards apply skip + limit, as for a find
        want = req.skip + req.limit if req.limit else 0
        parts = [
            (shard, req.model_copy(update={"skip": 0, "limit": want, "routing": self._routing(req.ns, shard)}))
            for shard in t.shards
        ]
        plans = [{"shard": shard, **r} for (shard, _), r in zip(parts, await self._ask_all(parts))]
        return {
            "ns": req.ns,
            "shards": list(t.shards),
            "reason": t.reason,
            "sharded": t.sharded,
            "configTime": self.follower.config_time,
            "plans": plans,
        }


def _waits(code: str, req: Any, in_transaction: bool) -> bool:
    """Whether a shard's refusal is a lock to wait for: a prepared transaction's, or (outside
    any transaction: inside one, first writer wins) an open transaction's document."""
    if code == PREPARE_CONFLICT:
        return True
    return code == ErrorCode.WriteConflict and not in_transaction and isinstance(req, WRITES)


def _in_transaction(req: Any, statement: Statement) -> Any:
    """A client operation run as a statement of a transaction: it carries `txn` to the shards
    (the transaction's snapshot replaces any read concern; its writes are not retryable writes:
    the transaction is the unit a client retries)."""
    if not isinstance(req, TXN_STATEMENTS):
        raise CommandError(
            ErrorCode.OperationNotSupportedInTransaction, f"Cannot run '{req.type}' in a multi-document transaction."
        )
    if isinstance(req, s.GetMore):
        return req  # the router's own cursor: read in full by the statement that opened it
    update: dict[str, Any] = {"txn": statement.txn}
    update.update({"readConcern": None} if isinstance(req, s.Find) else {"txnNumber": None, "stmtIds": None})
    return req.model_copy(update=update)


def _refuse_malformed(req: Any) -> None:
    """What a shard would refuse of a request no shard will see (its database does not exist):
    the filter, sort, projection and update, so the answer does not depend on the data."""
    compile_filter(getattr(req, "filter", None) or getattr(req, "query", None) or {})
    if getattr(req, "sort", None):
        sort_key(req.sort)
    for projection in (getattr(req, "projection", None), getattr(req, "fields", None)):
        if projection is not None:
            apply_projection({}, projection)
    if getattr(req, "update", None) is not None:
        check_update(req.update)


def _batch_length(docs: list[dict], size: int) -> int:
    """How many of `docs` make one reply: at most `size` and MAX_BATCH_BYTES, at least one."""
    total = 0
    for i, d in enumerate(docs[:size]):
        total += record_bytes(d)
        if i and total > MAX_BATCH_BYTES:
            return i
    return min(len(docs), size)


def _with_id(doc: Any) -> dict:
    if not isinstance(doc, dict):
        raise CommandError(ErrorCode.BadValue, "a document must be a JSON object")
    # A client library supplies _id so retries are idempotent; a bare client gets one here.
    if "_id" not in doc:
        return {"_id": new_object_id(), **doc}
    try:
        check_insert_document(doc)  # an invalid _id is refused as MongoDB refuses it, before targeting
    except QueryError as e:
        raise CommandError(e.code, str(e)) from None
    return doc


def _write_error(i: int, e: Exception) -> dict:
    if isinstance(e, CommandError):
        return {"index": i, "code": e.code, "errmsg": e.message}
    code = ErrorCode.ShardKeyTooLarge if isinstance(e, ShardKeyTooLarge) else ErrorCode.ShardKeyNotFound
    return {"index": i, "code": code, "errmsg": str(e)}


def _snapshot(read_concern: Any) -> bool:
    return isinstance(read_concern, dict) and read_concern.get("level") == "snapshot"
