"""The shardlog client, shaped like pymongo: `Cluster` -> database -> collection.

    async with AsyncCluster("127.0.0.1:9092", cluster="shardlog") as c:
        users = c["app"]["users"]
        await users.insert_one({"name": "ada"})
        async for doc in users.find({"age": {"$gt": 30}}, sort={"age": 1}): ...

    with Cluster("127.0.0.1:9092") as c:           # the same, synchronous
        c["app"]["users"].count_documents({})

Operations go to the routers through `router.requests`; replies come back to
this client's own inbox topic (created on connect, deleted on close).  A write
carries an operation id, and documents get their `_id` here when they have
none, so a retry after a timeout or a dead router is applied once.

_id uniqueness across shards holds only when the shard key includes _id, as in
MongoDB: each shard enforces it for its own documents.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypedDict, TypeVar, Unpack

from domain.protocol import MAX_DOCUMENT_BYTES, doc_bytes
from libs import kafka, tracing
from libs.ids import new_object_id
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import shard as s
from schemas.reply import Reply

# Documents, filters, updates, sorts, projections and results are JSON objects (Extended JSON values).
Document = dict[str, Any]
T = TypeVar("T")


class FindOneOptions(TypedDict, total=False):
    sort: Document | None
    skip: int
    projection: Document | None
    batch_size: int


class FindOptions(FindOneOptions, total=False):
    limit: int


class ClusterOptions(TypedDict, total=False):
    timeout: float
    attempt_timeout: float


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


class ClientSession:
    """A logical session, as a driver's (docs/decisions/0015): its `lsid` names it to the cluster.

    Retryable writes number their attempts with `txn_number` (a retry reuses the number, so the
    shards apply the write once); a causally consistent session reads after `operation_time`,
    the time of its last operation (docs/decisions/0014).  The cluster hands out implicit
    sessions from a pool for writes that name none; `AsyncCluster.start_session()` makes an
    explicit one.  A session is used by one operation at a time.
    """

    def __init__(self, *, causal_consistency: bool = True, implicit: bool = False) -> None:
        self.lsid: Document = {"id": str(uuid.uuid4())}
        self.txn_number = 0
        self.causal_consistency = causal_consistency
        self.implicit = implicit
        self.operation_time: int | None = None  # packed LogicalTime of this session's last operation
        self.last_use = time.monotonic()
        self.ended = False

    def next_txn_number(self) -> int:
        """The number of the next retryable write on this session (its retries reuse it)."""
        self.txn_number += 1
        self.last_use = time.monotonic()
        return self.txn_number

    def advance_operation_time(self, t: int | None) -> None:
        if t is not None and (self.operation_time is None or t > self.operation_time):
            self.operation_time = t


class AsyncCluster:
    def __init__(
        self, bootstrap: str, cluster: str = "shardlog", *, timeout: float = 30.0, attempt_timeout: float = 10.0
    ) -> None:
        self.bootstrap, self.topics = bootstrap, Topics(cluster)
        self.timeout, self.attempt_timeout = timeout, attempt_timeout
        self.inbox = self.topics.inbox(f"client-{uuid.uuid4().hex[:12]}")
        self._requester: Requester | None = None

    async def connect(self) -> AsyncCluster:
        await kafka.ensure_topics(self.bootstrap, [TopicSpec(self.inbox, config=SHORT_LIVED)])
        self._requester = Requester(self.bootstrap, self.inbox, client_id="shardlog-client")
        await self._requester.start()
        return self

    async def close(self) -> None:
        if self._requester:
            await self._requester.stop()
            self._requester = None
            await kafka.delete_topics(self.bootstrap, [self.inbox])

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

    async def call(self, req: Record, *, topic: str | None = None) -> Document:
        """Send an operation, retrying the same operation (same opId) until the deadline.
        One operation is one trace: router and shard spans hang below this one."""
        with tracing.tracer.start_as_current_span(
            f"shardlog.client {req.type}", attributes={"db.namespace": getattr(req, "ns", "") or ""}
        ):
            return await self._call(req, topic)

    async def _call(self, req: Record, topic: str | None) -> Document:
        if self._requester is None:
            raise RuntimeError("not connected: use `async with AsyncCluster(...)` or `await connect()` first")
        deadline = time.monotonic() + self.timeout
        key = (getattr(req, "opId", None) or uuid.uuid4().hex).encode()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationTimeout("Timeout", f"no answer from the routers within {self.timeout:g}s")
            # A getMore is not retried: a slow first attempt may already have consumed the batch.
            once = isinstance(req, s.GetMore)
            try:
                reply: Reply = await self._requester.request(
                    topic or self.topics.router_requests,
                    req,
                    key=key,
                    timeout=left if once else min(self.attempt_timeout, left),
                )
            except RequestTimeout:
                if once:
                    raise OperationTimeout("Timeout", f"no answer to getMore within {self.timeout:g}s") from None
                continue  # a router may have died with it: send it again
            if reply.ok:
                return reply.result or {}
            raise error_for(reply.code or "Error", reply.error or "", reply.result)


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

    async def insert_one(self, doc: Document) -> Any:
        doc = _prepared(doc)
        result = await self.cluster.call(s.Insert(ns=self.ns, docs=[doc]))
        _raise_write_errors(result)
        return doc["_id"]

    async def insert_many(self, docs: list[Document], *, ordered: bool = True) -> list[Any]:
        docs = [_prepared(d) for d in docs]
        result = await self.cluster.call(s.Insert(ns=self.ns, docs=docs, ordered=ordered))
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
    ) -> AsyncCursor:
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
            ),
        )

    async def find_one(self, filter: Document | None = None, **kw: Unpack[FindOneOptions]) -> Document | None:
        async for doc in self.find(filter, limit=1, **kw):
            return doc
        return None

    async def count_documents(self, filter: Document | None = None) -> int:
        n: int = (await self.cluster.call(s.Count(ns=self.ns, filter=filter or {})))["n"]
        return n

    async def update_one(self, filter: Document, update: Document, *, upsert: bool = False) -> Document:
        return await self.cluster.call(s.Update(ns=self.ns, filter=filter, update=update, upsert=upsert))

    async def update_many(self, filter: Document, update: Document, *, upsert: bool = False) -> Document:
        return await self.cluster.call(s.Update(ns=self.ns, filter=filter, update=update, multi=True, upsert=upsert))

    async def delete_one(self, filter: Document) -> int:
        deleted: int = (await self.cluster.call(s.Delete(ns=self.ns, filter=filter)))["deleted"]
        return deleted

    async def delete_many(self, filter: Document) -> int:
        result = await self.cluster.call(s.Delete(ns=self.ns, filter=filter, multi=True))
        deleted: int = result["deleted"]
        return deleted

    async def explain(self, filter: Document | None = None) -> Document:
        return await self.cluster.call(s.Explain(ns=self.ns, filter=filter or {}))


class AsyncCursor:
    """Fetches in batches: the first with the find, the rest with getMore from the router holding it."""

    shards: list[str]  # the shards the find went to, once the first batch is in

    def __init__(self, cluster: AsyncCluster, find: s.Find) -> None:
        self.cluster, self._find = cluster, find
        self._buffer: list[Document] = []
        self._cursor_id: int | None = None
        self._topic: str | None = None

    def __aiter__(self) -> AsyncIterator[Document]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Document]:
        first = await self.cluster.call(self._find)
        self.shards = first.get("shards", [])
        batch, cid, topic = first["docs"], first["cursorId"], first.get("cursorTopic")
        while True:
            for doc in batch:
                yield doc
            if not cid:
                return
            more = await self.cluster.call(s.GetMore(cursorId=cid, batchSize=self._find.batchSize), topic=topic)
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
