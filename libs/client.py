"""The shardlog client, shaped like pymongo: `Cluster` -> database -> collection.

    async with AsyncCluster("127.0.0.1:9092", cluster="shardlog") as c:
        users = c["app"]["users"]
        await users.insert_one({"name": "ada"})
        async for doc in users.find({"age": {"$gt": 30}}, sort={"age": 1}): ...

    with Cluster("127.0.0.1:9092") as c:           # the same, synchronous
        c["app"]["users"].count_documents({})

Operations go to the routers through `router.requests`; replies come back to
this client's own inbox topic (created on connect, deleted on close).  Writes
are retryable writes, as a driver's with retryWrites=true (docs/decisions/0015):
each runs on a logical session (an implicit one from a pool, or `session=`)
under the session's next txnNumber, and a retry after a timeout or a dead
router reuses that number, so the shards apply it once.  Documents get their
`_id` here when they have none.  `AsyncCluster(..., retry_writes=False)` sends
writes without lsid or txnNumber, once.  Multi updates and deletes are not
retryable (as in MongoDB): they are sent once.

_id uniqueness across shards holds only when the shard key includes _id, as in
MongoDB: each shard enforces it for its own documents.

Multi-document transactions (issue 33, decision 0020), on an explicit session:

    async def transfer(session):
        await accounts.update_one({"_id": "a"}, {"$inc": {"v": -10}}, session=session)
        await accounts.update_one({"_id": "b"}, {"$inc": {"v": 10}}, session=session)
    await c.with_transaction(c.start_session(), transfer)

or `start_transaction(session)` / `commit_transaction(session)` / `abort_transaction(session)`.
Statements are sent once (the transaction is what is retried); an operation a transaction does
not run (count_documents) is refused with OperationNotSupportedInTransaction.

Every operation carries the largest signed `$clusterTime` the client has seen;
with `session=c.start_session(causal_consistency=True)`, reads wait for the
session's earlier operations (readConcern afterClusterTime), whichever router
serves them (docs/decisions/0014).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from enum import Enum
from typing import Any, TypedDict, TypeVar, Unpack

from opentelemetry.trace import SpanKind

from domain.clock import parse_timestamp, to_ejson
from domain.protocol import MAX_DOCUMENT_BYTES, doc_bytes
from libs import aio, tracing
from libs.bus import Bus, UnknownTopic, connect
from libs.ids import new_object_id
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import shard as s
from schemas.bsonjson import from_record
from schemas.reply import Reply

# Documents, filters, updates, sorts, projections and results are dicts of BSON values (pymongo's
# bson package: ObjectId, datetime, Int64, Decimal128, ...), as pymongo gives them (decision 0016).
Document = dict[str, Any]
T = TypeVar("T")


async def shard_unreachable(
    requester: Requester, bus: str | Bus, topics: Topics, shard: str, wait: float
) -> str | None:
    """Why `shard`'s process cannot be reached (None: it answered a request on its requests
    topic within `wait` seconds).  addShard asks this first, as mongos connects to a new shard."""
    topic = topics.shard_requests(shard)
    hint = f"start its process first (`make up SHARDS=...`, or `python -m services.shard --shard-id {shard}`)"
    try:
        await connect(bus).partitions_for(topic)
    except UnknownTopic:
        return f"couldn't connect to new shard {shard}: HostUnreachable: no shard process {shard} ever ran; {hint}"
    try:
        await requester.request(topic, s.ListMigrations(), timeout=wait)
    except RequestTimeout:
        return f"couldn't connect to new shard {shard}: HostUnreachable: it did not answer within {wait:g}s; {hint}"
    return None


class FindOneOptions(TypedDict, total=False):
    sort: Document | None
    skip: int
    projection: Document | None
    batch_size: int
    session: ClientSession | None
    at_cluster_time: int | None  # a snapshot read at this packed ClusterTime (issue 32)


class FindOptions(FindOneOptions, total=False):
    limit: int


class ClusterOptions(TypedDict, total=False):
    timeout: float
    attempt_timeout: float
    retry_writes: bool


class ReturnDocument(Enum):
    """Which document find_one_and_update / find_one_and_replace return (pymongo's names)."""

    BEFORE = False
    AFTER = True


# An implicit session idle this long is not reused: the cluster may expire it at
# logicalSessionTimeoutMinutes (30), and a driver discards it a minute before.
IMPLICIT_SESSION_IDLE_S = 29 * 60


class ShardlogError(Exception):
    """An operation the cluster refused: `code` (MongoDB's name) and a message."""

    def __init__(self, code: str, message: str, details: Document | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = code, message, details or {}


class DuplicateKeyError(ShardlogError): ...


class ShardKeyError(ShardlogError): ...


class StaleConfigError(ShardlogError): ...


class InvalidNamespace(ShardlogError): ...


class DocumentTooLarge(ShardlogError): ...


class OperationTimeout(ShardlogError, TimeoutError): ...


class BulkWriteError(ShardlogError):
    """Some documents of an insert_many were refused; `details` has `writeErrors` and `inserted`."""


_ERRORS = {
    "DuplicateKey": DuplicateKeyError,
    "ShardKeyNotFound": ShardKeyError,
    "ShardKeyTooLarge": ShardKeyError,
    "ImmutableField": ShardKeyError,
    "StaleConfig": StaleConfigError,
    "InvalidNamespace": InvalidNamespace,
    "DocumentTooLarge": DocumentTooLarge,
}


def error_for(code: str, message: str, details: Document | None = None) -> ShardlogError:
    return _ERRORS.get(code, ShardlogError)(code, message, details)


# A transaction that failed with one of these may be run again from its start (MongoDB's
# TransientTransactionError label); `with_transaction` does.
TRANSIENT_TRANSACTION_CODES = frozenset(
    {"WriteConflict", "NoSuchTransaction", "SnapshotTooOld", "SnapshotUnavailable", "StaleChunkHistory"}
    | {"MigrationConflict", "PreparedTransactionInProgress", "StaleConfig", "ShardUnavailable", "Timeout"}
    | {"KafkaUnavailable"}
)
# A commit whose answer did not come: it may have been applied; asking again tells.
UNKNOWN_COMMIT_CODES = frozenset({"ShardUnavailable", "Timeout", "KafkaUnavailable"})
WITH_TRANSACTION_TIMEOUT_S = 120.0  # as the drivers' withTransaction


TRANSACTION_ENDS = (s.CommitTransaction, s.AbortTransaction)


class ClientTransaction:
    """A session's multi-document transaction (issue 33, decision 0020), started on a router
    (`AsyncCluster.start_transaction`): its number and the snapshot it reads at."""

    def __init__(self, txn_number: int, read_at: int) -> None:
        self.txn_number, self.read_at = txn_number, read_at
        self.state = "in-progress"  # then "committed" or "aborted"


class ClientSession:
    """A logical session, as a driver's (docs/decisions/0015): its `lsid` names it to the cluster.

    Retryable writes number their attempts with `txn_number` (a retry reuses the number, so the
    shards apply the write once); a causally consistent session reads after `operation_time`,
    the time of its last operation (docs/decisions/0014).  The cluster hands out implicit
    sessions from a pool for writes that name none; `AsyncCluster.start_session()` makes an
    explicit one.  A session is used by one operation at a time.
    """

    def __init__(self, *, causal_consistency: bool = True, implicit: bool = False, snapshot: bool = False) -> None:
        if snapshot and causal_consistency:
            raise ValueError("a session is either causally consistent or a snapshot session, not both (as pymongo)")
        self.lsid: Document = {"id": str(uuid.uuid4())}
        self.txn_number = 0
        self.causal_consistency = causal_consistency
        # A snapshot session (MongoDB 5.0's): every find reads at the time of its first
        # (`snapshot_time`, packed; None until the first answers).
        self.snapshot = snapshot
        self.snapshot_time: int | None = None
        self.implicit = implicit
        self.operation_time: int | None = None  # packed LogicalTime of this session's last operation
        self.last_use = time.monotonic()
        self.ended = False
        self.transaction: ClientTransaction | None = None  # the latest, open or ended

    @property
    def in_transaction(self) -> bool:
        return self.transaction is not None and self.transaction.state == "in-progress"

    def next_txn_number(self) -> int:
        """The number of the next retryable write on this session (its retries reuse it)."""
        self.txn_number += 1
        self.last_use = time.monotonic()
        return self.txn_number

    def advance_operation_time(self, t: int | None) -> None:
        if t is not None and (self.operation_time is None or t > self.operation_time):
            self.operation_time = t


END_SESSIONS_ON_CLOSE_S = 5.0  # close() does not wait longer for the routers to end its sessions


class AsyncCluster:
    def __init__(
        self,
        bus: str | Bus,
        cluster: str = "shardlog",
        *,
        timeout: float = 30.0,
        attempt_timeout: float = 10.0,
        retry_writes: bool = True,
    ) -> None:
        self.bus, self.topics = connect(bus), Topics(cluster)
        self.timeout, self.attempt_timeout = timeout, attempt_timeout
        self.retry_writes = retry_writes
        self.inbox = self.topics.inbox(f"client-{uuid.uuid4().hex[:12]}")
        self._requester: Requester | None = None
        self._pool: list[ClientSession] = []  # idle implicit sessions, the most recently used last
        # The largest signed $clusterTime any reply carried: sent with every operation (gossip).
        self.cluster_time: Document | None = None
        self._cluster_time_value = 0

    def start_session(self, *, causal_consistency: bool | None = None, snapshot: bool = False) -> ClientSession:
        """An explicit session: pass it as `session=` to run operations on it, one at a time;
        with causal consistency (the default but for a snapshot session), its reads see its
        earlier operations whichever router serves them (docs/decisions/0014); a snapshot
        session reads every find at the cluster time of its first (issue 32)."""
        causal = not snapshot if causal_consistency is None else causal_consistency
        return ClientSession(causal_consistency=causal, snapshot=snapshot)

    def _checkout(self) -> ClientSession:
        """An implicit session for one operation: the most recently used idle one, or a new one."""
        now = time.monotonic()
        while self._pool:
            session = self._pool.pop()
            if now - session.last_use < IMPLICIT_SESSION_IDLE_S:
                return session
        return ClientSession(implicit=True)

    def _checkin(self, session: ClientSession) -> None:
        if not session.ended:
            session.last_use = time.monotonic()
            self._pool.append(session)

    async def write(self, req: Record, *, session: ClientSession | None = None, retryable: bool = True) -> Document:
        """Send a write on a session (docs/decisions/0015): a retryable one under the session's
        next txnNumber, retried with the same number until the deadline; a multi write (not
        retryable) or any write with retry_writes=False, once.  In the session's transaction:
        a statement of it, sent once (the transaction is what is retried)."""
        if session is not None and session.in_transaction:
            return await self.call(req.model_copy(update={"lsid": dict(session.lsid)}), retry=False, session=session)
        if not self.retry_writes:
            return await self.call(req, retry=False, session=session)
        used = session if session is not None else self._checkout()
        try:
            fields: dict[str, Any] = {"lsid": dict(used.lsid)}
            if retryable:
                fields["txnNumber"] = used.next_txn_number()
            return await self.call(req.model_copy(update=fields), retry=retryable, session=used)
        finally:
            if session is None:
                self._checkin(used)

    def _gossip(self, req: Record, session: ClientSession | None) -> Record:
        """The operation with our $clusterTime and, for a causally consistent session's read,
        readConcern.afterClusterTime = the session's operationTime."""
        update: dict[str, Any] = {}
        if self.cluster_time is not None and "clusterTime" in type(req).model_fields:
            update["clusterTime"] = self.cluster_time
        if session is not None and session.in_transaction and not isinstance(req, (s.GetMore, *TRANSACTION_ENDS)):
            update["txn"] = _statement_of(req, session)
            return req.model_copy(update=update)
        # (a Count too: the cluster refuses a snapshot count, as MongoDB, rather than count the latest)
        if session is not None and session.snapshot and isinstance(req, (s.Find, s.Count)) and req.readConcern is None:
            rc: Document = {"level": "snapshot"}
            if session.snapshot_time is not None:
                rc["atClusterTime"] = to_ejson(session.snapshot_time)
            update["readConcern"] = rc
        elif (
            session is not None
            and session.causal_consistency
            and session.operation_time is not None
            and isinstance(req, (s.Find, s.Count))
            and req.readConcern is None
        ):
            update["readConcern"] = {"afterClusterTime": to_ejson(session.operation_time)}
        return req.model_copy(update=update) if update else req

    def _gossip_out(self, reply: Reply, session: ClientSession | None) -> None:
        if reply.clusterTime is not None:
            try:
                t = parse_timestamp(reply.clusterTime.get("clusterTime"), "$clusterTime")
                # Unsigned (keyId 0: no key existed yet) a time is no proof another router would
                # accept: sending it could only get an operation refused (KeyNotFound).
                if not reply.clusterTime["signature"]["keyId"]:
                    t = 0
            except Exception:  # a reply we cannot read the time of teaches nothing
                t = 0
            if t > self._cluster_time_value:
                self.cluster_time, self._cluster_time_value = reply.clusterTime, t
        if session is not None:
            session.advance_operation_time(reply.operationTime)
            if session.snapshot and session.snapshot_time is None and isinstance(reply.result, dict):
                at = reply.result.get("atClusterTime")
                if isinstance(at, int):  # the time the session's first read was at
                    session.snapshot_time = at

    async def connect(self) -> AsyncCluster:
        await self.bus.create_topics([TopicSpec(self.inbox, config=SHORT_LIVED)])
        self._requester = Requester(self.bus, self.inbox, client_id="shardlog-client")
        await self._requester.start()
        return self

    async def close(self) -> None:
        """End the pooled implicit sessions (as a driver does on close: the cluster can forget them
        at once rather than after the session timeout), then disconnect."""
        if self._requester and self._pool:
            pooled, self._pool = self._pool, []
            try:
                await aio.wait_for(self.end_sessions(pooled), min(self.timeout, END_SESSIONS_ON_CLOSE_S))
            except (ShardlogError, TimeoutError):
                pass  # the sessions expire on their own after logicalSessionTimeoutMinutes
        if self._requester:
            await self._requester.stop()
            self._requester = None
            await self.bus.delete_topics([self.inbox])

    async def __aenter__(self) -> AsyncCluster:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getitem__(self, db: str) -> AsyncDatabase:
        return AsyncDatabase(self, db)

    async def end_sessions(self, sessions: list[ClientSession]) -> None:
        """MongoDB's endSessions: the cluster forgets these sessions (their retryable-write records
        go once the session timeout has passed); they must not be used again."""
        if sessions:
            await self.call(s.EndSessions(lsids=[x.lsid for x in sessions]))
        for x in sessions:
            x.ended = True

    async def kill_sessions(self, sessions: list[ClientSession]) -> Document:
        """MongoDB's killSessions: as end_sessions, and the routers' cursors opened under them are killed."""
        result = await self.call(s.KillSessions(lsids=[x.lsid for x in sessions]))
        for x in sessions:
            x.ended = True
        return result

    # -------------------------------------------------------------- transactions

    async def start_transaction(self, session: ClientSession, *, at_cluster_time: int | None = None) -> int:
        """Start a multi-document transaction on `session` (its router picks the snapshot: the
        router's time, or `at_cluster_time`): the session's operations are its statements until
        `commit_transaction` or `abort_transaction`.  The snapshot time it reads at."""
        if session.in_transaction:
            raise ShardlogError("IllegalOperation", "Transaction already in progress")
        number = session.next_txn_number()
        rc = None if at_cluster_time is None else {"level": "snapshot", "atClusterTime": to_ejson(at_cluster_time)}
        req = s.StartTransaction(lsid=str(session.lsid["id"]), txnNumber=number, readConcern=rc)
        result = await self.call(req, session=session)
        session.transaction = ClientTransaction(number, int(result["readAt"]))
        return session.transaction.read_at

    async def commit_transaction(self, session: ClientSession) -> None:
        """Commit the session's transaction (again after a commit whose answer was lost: the
        router answers a retried commit with the same outcome)."""
        txn = session.transaction
        if txn is None or txn.state == "aborted":
            raise ShardlogError("NoSuchTransaction", "no transaction started on this session")
        await self.call(s.CommitTransaction(lsid=str(session.lsid["id"]), txnNumber=txn.txn_number), session=session)
        txn.state = "committed"

    async def abort_transaction(self, session: ClientSession) -> None:
        """Abort the session's transaction: nothing of it is applied."""
        txn = session.transaction
        if txn is None or txn.state != "in-progress":
            raise ShardlogError("NoSuchTransaction", "no transaction in progress on this session")
        txn.state = "aborted"
        try:
            await self.call(s.AbortTransaction(lsid=str(session.lsid["id"]), txnNumber=txn.txn_number), session=session)
        except ShardlogError as e:
            if e.code != "NoSuchTransaction":  # ended already (a statement's error aborted it)
                raise

    async def with_transaction(
        self, session: ClientSession, callback: Callable[[ClientSession], Coroutine[Any, Any, T]]
    ) -> T:
        """Run `callback(session)` in a transaction and commit it, starting again from the
        beginning while it fails with a transient error (a WriteConflict: another transaction
        wrote first), for up to 120 s, as the drivers' withTransaction."""
        deadline = time.monotonic() + WITH_TRANSACTION_TIMEOUT_S
        pause = 0.005
        while True:
            await self.start_transaction(session)
            try:
                result = await callback(session)
            except BaseException as e:
                if session.in_transaction:
                    await self._abort_quietly(session)
                if (
                    isinstance(e, ShardlogError)
                    and e.code in TRANSIENT_TRANSACTION_CODES
                    and time.monotonic() < deadline
                ):
                    # A pause before the next attempt, growing: the writer it lost to (or the
                    # migration it met) needs time to finish, not a tight loop of retries.
                    await asyncio.sleep(random.uniform(0, pause))
                    pause = min(pause * 2, 0.5)
                    continue
                raise
            if await self._commit_until_known(session, deadline):
                return result

    async def _commit_until_known(self, session: ClientSession, deadline: float) -> bool:
        """Commit; asked again while the outcome is unknown (the router answers a retried commit
        the same).  False: the transaction aborted with a transient error (run it again)."""
        while True:
            try:
                await self.commit_transaction(session)
                return True
            except ShardlogError as e:
                if time.monotonic() >= deadline or e.code not in TRANSIENT_TRANSACTION_CODES:
                    raise
                if e.code not in UNKNOWN_COMMIT_CODES:
                    assert session.transaction is not None
                    session.transaction.state = "aborted"
                    return False

    async def _abort_quietly(self, session: ClientSession) -> None:
        try:
            await self.abort_transaction(session)
        except (ShardlogError, TimeoutError):
            pass  # the shards' lifetime reaper ends what the abort did not reach

    async def call(
        self,
        req: Record,
        *,
        topic: str | None = None,
        session: ClientSession | None = None,
        retry: bool = True,
    ) -> Document:
        """Send an operation, retrying the same request (a write: the same lsid and txnNumber)
        until the deadline; with `retry` False, once.  One operation is one trace: router and
        shard spans hang below this one."""
        with tracing.span(
            f"shardlog.client {req.type}",
            tracing.db_attributes(getattr(req, "ns", None), req.type),
            kind=SpanKind.CLIENT,
        ):
            return await self._call(req, topic, session, retry)

    async def _call(
        self, req: Record, topic: str | None, session: ClientSession | None = None, retry: bool = True
    ) -> Document:
        if self._requester is None:
            raise RuntimeError("not connected: use `async with AsyncCluster(...)` or `await connect()` first")
        deadline = time.monotonic() + self.timeout
        lsid = getattr(req, "lsid", None)
        # One session's operations share a partition of router.requests (they run one at a time anyway).
        key = (str(lsid["id"]) if isinstance(lsid, dict) and "id" in lsid else uuid.uuid4().hex).encode()
        req = self._gossip(req, session)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationTimeout("Timeout", f"no answer from the routers within {self.timeout:g}s")
            # A getMore is not retried: a slow first attempt may already have consumed the batch.
            # Nor is a write that is not retryable, or a statement of a transaction: a second
            # attempt could apply it twice.
            once = isinstance(req, s.GetMore) or not retry or getattr(req, "txn", None) is not None
            try:
                reply: Reply = await self._requester.request(
                    topic or self.topics.router_requests,
                    req,
                    key=key,
                    timeout=left if once else min(self.attempt_timeout, left),
                )
            except RequestTimeout:
                if once:
                    raise OperationTimeout("Timeout", f"no answer to {req.type} within {self.timeout:g}s") from None
                continue  # a router may have died with it: send it again
            self._gossip_out(reply, session)
            if reply.ok:
                result: Document = from_record(reply.result or {})  # BSON values back (decision 0016)
                return result
            raise error_for(reply.code or "Error", reply.error or "", from_record(reply.result))


def _statement_of(req: Record, session: ClientSession) -> s.Txn:
    """The transaction a session's operation is a statement of; an operation a transaction
    does not run is refused here, as MongoDB refuses it (it would run outside the transaction)."""
    txn = session.transaction
    assert txn is not None
    if "txn" not in type(req).model_fields:
        raise ShardlogError(
            "OperationNotSupportedInTransaction", f"Cannot run '{req.type}' in a multi-document transaction."
        )
    return s.Txn(lsid=str(session.lsid["id"]), txnNumber=txn.txn_number, readAt=txn.read_at)


class AsyncDatabase:
    def __init__(self, cluster: AsyncCluster, name: str) -> None:
        self.cluster, self.name = cluster, name

    def __getitem__(self, coll: str) -> AsyncCollection:
        return AsyncCollection(self.cluster, f"{self.name}.{coll}")


def _prepared(doc: Document) -> Document:
    """The document with an _id (so a retry inserts it once), refused here if over 16 MB."""
    doc = doc if "_id" in doc else {"_id": new_object_id(), **doc}
    size = doc_bytes(doc)
    if size > MAX_DOCUMENT_BYTES:
        raise DocumentTooLarge(
            "DocumentTooLarge", f"document is {size} bytes; the limit is {MAX_DOCUMENT_BYTES} (16 MB)"
        )
    return doc


class AsyncCollection:
    def __init__(self, cluster: AsyncCluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns

    async def insert_one(self, doc: Document, *, session: ClientSession | None = None) -> Any:
        doc = _prepared(doc)
        result = await self.cluster.write(s.Insert(ns=self.ns, docs=[doc]), session=session)
        _raise_write_errors(result)
        return doc["_id"]

    async def insert_many(
        self, docs: list[Document], *, ordered: bool = True, session: ClientSession | None = None
    ) -> list[Any]:
        docs = [_prepared(d) for d in docs]
        result = await self.cluster.write(s.Insert(ns=self.ns, docs=docs, ordered=ordered), session=session)
        _raise_write_errors(result, many=True)
        return [d["_id"] for d in docs]

    def find(
        self,
        filter: Document | None = None,
        *,
        sort: Document | None = None,
        skip: int = 0,
        limit: int = 0,
        projection: Document | None = None,
        batch_size: int = 101,
        session: ClientSession | None = None,
        at_cluster_time: int | None = None,
    ) -> AsyncCursor:
        """`at_cluster_time`: a snapshot read at that packed ClusterTime (issue 32)."""
        read_concern = (
            None if at_cluster_time is None else {"level": "snapshot", "atClusterTime": to_ejson(at_cluster_time)}
        )
        return AsyncCursor(
            self.cluster,
            s.Find(
                ns=self.ns,
                filter=filter or {},
                sort=sort,
                skip=skip,
                limit=limit,
                projection=projection,
                batchSize=batch_size,
                readConcern=read_concern,
            ),
            session,
        )

    async def find_one(self, filter: Document | None = None, **kw: Unpack[FindOneOptions]) -> Document | None:
        async for doc in self.find(filter, limit=1, **kw):
            return doc
        return None

    async def count_documents(self, filter: Document | None = None, *, session: ClientSession | None = None) -> int:
        n: int = (await self.cluster.call(s.Count(ns=self.ns, filter=filter or {}), session=session))["n"]
        return n

    async def update_one(
        self, filter: Document, update: Document, *, upsert: bool = False, session: ClientSession | None = None
    ) -> Document:
        req = s.Update(ns=self.ns, filter=filter, update=update, upsert=upsert)
        return await self.cluster.write(req, session=session)

    async def update_many(
        self, filter: Document, update: Document, *, upsert: bool = False, session: ClientSession | None = None
    ) -> Document:
        if not update or not all(k.startswith("$") for k in update):
            # MongoDB's refusal too (the router does not check it yet: it would replace every match)
            raise ShardlogError("FailedToParse", "multi update is not supported for replacement-style update")
        req = s.Update(ns=self.ns, filter=filter, update=update, multi=True, upsert=upsert)
        return await self.cluster.write(req, session=session, retryable=False)

    async def delete_one(self, filter: Document, *, session: ClientSession | None = None) -> int:
        deleted: int = (await self.cluster.write(s.Delete(ns=self.ns, filter=filter), session=session))["deleted"]
        return deleted

    async def delete_many(self, filter: Document, *, session: ClientSession | None = None) -> int:
        req = s.Delete(ns=self.ns, filter=filter, multi=True)
        deleted: int = (await self.cluster.write(req, session=session, retryable=False))["deleted"]
        return deleted

    async def find_one_and_update(
        self,
        filter: Document,
        update: Document,
        *,
        projection: Document | None = None,
        sort: Document | None = None,
        upsert: bool = False,
        return_document: ReturnDocument = ReturnDocument.BEFORE,
        session: ClientSession | None = None,
    ) -> Document | None:
        """Update the first matching document (in `sort` order) and return it as it was, or
        with ReturnDocument.AFTER as it is now; None when nothing matched (and no upsert)."""
        if not update or not all(k.startswith("$") for k in update):
            raise ValueError("update only works with $ operators")
        return await self._find_and_modify(
            filter,
            update=update,
            fields=projection,
            sort=sort,
            upsert=upsert,
            new=return_document.value,
            session=session,
        )

    async def find_one_and_replace(
        self,
        filter: Document,
        replacement: Document,
        *,
        projection: Document | None = None,
        sort: Document | None = None,
        upsert: bool = False,
        return_document: ReturnDocument = ReturnDocument.BEFORE,
        session: ClientSession | None = None,
    ) -> Document | None:
        """Replace the first matching document (keeping its _id) and return it before or after."""
        if any(k.startswith("$") for k in replacement):
            raise ValueError("replacement can not include $ operators")
        return await self._find_and_modify(
            filter,
            update=replacement,
            fields=projection,
            sort=sort,
            upsert=upsert,
            new=return_document.value,
            session=session,
        )

    async def find_one_and_delete(
        self,
        filter: Document,
        *,
        projection: Document | None = None,
        sort: Document | None = None,
        session: ClientSession | None = None,
    ) -> Document | None:
        """Delete the first matching document (in `sort` order) and return it."""
        return await self._find_and_modify(filter, remove=True, fields=projection, sort=sort, session=session)

    async def _find_and_modify(
        self, query: Document, *, session: ClientSession | None, **options: Any
    ) -> Document | None:
        req = s.FindAndModify(ns=self.ns, query=query, **options)
        value: Document | None = (await self.cluster.write(req, session=session))["value"]
        return value

    async def explain(
        self,
        filter: Document | None = None,
        *,
        sort: Document | None = None,
        projection: Document | None = None,
        limit: int = 0,
        hint: Any = None,
    ) -> Document:
        """Which shards the query targets and why, and each shard's plan and its counts
        (`plans`: queryPlanner, executionStats, summary)."""
        req = s.Explain(ns=self.ns, filter=filter or {}, sort=sort, projection=projection, limit=limit, hint=hint)
        return await self.cluster.call(req)


class AsyncCursor:
    """Fetches in batches: the first with the find, the rest with getMore from the router holding it."""

    shards: list[str]  # the shards the find went to, once the first batch is in

    def __init__(self, cluster: AsyncCluster, find: s.Find, session: ClientSession | None = None) -> None:
        self.cluster, self._find, self.session = cluster, find, session
        self._buffer: list[Document] = []
        self._cursor_id: int | None = None
        self._topic: str | None = None

    def __aiter__(self) -> AsyncIterator[Document]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Document]:
        first = await self.cluster.call(self._find, session=self.session)
        self.shards = first.get("shards", [])
        batch, cid, topic = first["docs"], first["cursorId"], first.get("cursorTopic")
        while True:
            for doc in batch:
                yield doc
            if not cid:
                return
            more = await self.cluster.call(
                s.GetMore(cursorId=cid, batchSize=self._find.batchSize), topic=topic, session=self.session
            )
            batch, cid = more["docs"], more["cursorId"]

    async def to_list(self) -> list[Document]:
        return [d async for d in self]


def _raise_write_errors(result: Document, many: bool = False) -> None:
    errors = result.get("writeErrors") or []
    if not errors:
        return
    first = errors[0]
    if many and (result.get("inserted") or len(errors) > 1):
        raise BulkWriteError(
            "BulkWriteError", f"{len(errors)} document(s) refused; first: {first['code']}: {first['errmsg']}", result
        )
    raise error_for(first["code"], first["errmsg"], result)


# ------------------------------------------------------------------ synchronous flavour


class Cluster:
    """The synchronous client: the async one on a private event loop in a background thread."""

    def __init__(self, bootstrap: str, cluster: str = "shardlog", **kw: Unpack[ClusterOptions]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="shardlog-client")
        self._thread.start()
        self._async = AsyncCluster(bootstrap, cluster, **kw)
        self._run(self._async.connect())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, db: str) -> Database:
        return Database(self, db)

    def start_session(self, *, causal_consistency: bool | None = None, snapshot: bool = False) -> ClientSession:
        return self._async.start_session(causal_consistency=causal_consistency, snapshot=snapshot)


class Database:
    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster, self.name = cluster, name

    def __getitem__(self, coll: str) -> Collection:
        return Collection(self.cluster, AsyncCollection(self.cluster._async, f"{self.name}.{coll}"))


class Collection:
    def __init__(self, cluster: Cluster, inner: AsyncCollection) -> None:
        self._cluster, self._inner = cluster, inner
        self.ns = inner.ns

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """AsyncCollection's coroutine methods, run to completion (insert_one, update_many, ...)."""
        method = getattr(self._inner, name)

        def call(*args: Any, **kw: Any) -> Any:
            return self._cluster._run(method(*args, **kw))

        return call

    def find(self, filter: Document | None = None, **kw: Unpack[FindOptions]) -> Iterator[Document]:
        cursor = self._inner.find(filter, **kw).__aiter__()

        async def next_document() -> Document:  # a coroutine, as run_coroutine_threadsafe wants
            return await cursor.__anext__()

        while True:
            try:
                yield self._cluster._run(next_document())
            except StopAsyncIteration:
                return

    def find_one(self, filter: Document | None = None, **kw: Unpack[FindOneOptions]) -> Document | None:
        return self._cluster._run(self._inner.find_one(filter, **kw))
