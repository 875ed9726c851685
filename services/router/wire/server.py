"""The router's TCP edge: an asyncio streams server (one task per connection, no threads)
that reads frames, answers commands from a :class:`~services.router.wire.commands.CommandTable`
and writes replies.  No Kafka here yet: issue 14 gives the table CRUD handlers that call the
router.

Per connection, requests are answered in order, one at a time (the protocol is
request-response; a driver never pipelines on one connection).  A frame that cannot be read
closes that connection only; a message that was read whole but is malformed gets MongoDB's
error reply and the connection goes on.  OP_QUERY is answered only for the legacy handshake
(`isMaster`), as by a current mongos; `moreToCome` requests get no reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from domain.protocol import ErrorCode
from services.router.wire.commands import (
    NO_COMPRESSION,
    SERVER_COMMANDS,
    UNSUPPORTED_OP_QUERY_COMMAND,
    CommandTable,
    Connection,
    error_reply,
    numbered,
)
from services.router.wire.frames import (
    HEADER_SIZE,
    MAX_MESSAGE_SIZE_BYTES,
    OP_QUERY,
    Header,
    OpMsg,
    OpQuery,
    OpReply,
    ProtocolError,
    build_op_msg,
    build_op_reply,
    compress,
    parse_header,
    parse_message,
)

if TYPE_CHECKING:
    from services.router.wire.edge import RouterEdge

log = logging.getLogger(__name__)

DEFAULT_PORT = 27017
OP_QUERY_COMMANDS = frozenset({"isMaster", "ismaster"})  # what a current mongos still takes over OP_QUERY


class WireServer:
    """``await start()``, then ``port``; ``await close()`` drops every connection."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        commands: CommandTable = SERVER_COMMANDS,
        compressors: tuple[str, ...] = (),  # offered in the handshake: "zlib", "noop" or none
        max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
        edge: RouterEdge | None = None,  # the router's parts: without, only server commands answer
    ) -> None:
        self.edge = edge
        self.host, self._port = host, port
        self.commands = commands
        self.compressors = compressors
        self.max_message_size = max_message_size
        self._server: asyncio.Server | None = None
        self._conn_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections_opened = 0
        self.protocol_errors = 0
        self.compressed_requests = 0

    @property
    def port(self) -> int:
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self._port, limit=2**16)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> WireServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def open_connections(self) -> int:
        return len(self._handlers)

    # ------------------------------------------------------------------ one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections_opened += 1
        peer = writer.get_extra_info("peername")
        conn = Connection(
            id=next(self._conn_ids),
            peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
            compressors=self.compressors,
            edge=self.edge,
        )
        try:
            while True:
                try:
                    head = await reader.readexactly(HEADER_SIZE)
                except asyncio.IncompleteReadError:
                    return  # the client went away (between frames or mid-header)
                header = parse_header(head, self.max_message_size)
                body = await reader.readexactly(header.length - HEADER_SIZE)
                reply = await self._answer(conn, header, body)
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
        except ProtocolError as e:
            self.protocol_errors += 1
            log.info("wire: closing connection %d from %s: %s", conn.id, conn.peer, e.message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("wire: connection %d from %s failed", conn.id, conn.peer)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, conn: Connection, header: Header, body: bytes) -> bytes | None:
        """The reply frame to one message, or None (moreToCome).  Raises ProtocolError when
        the connection must be closed."""
        request_id = header.request_id
        try:
            message = parse_message(header, body)
        except ProtocolError as e:
            if e.close:
                raise
            self.protocol_errors += 1
            doc = error_reply(e.code, e.code_name, e.message)
            if header.op_code == OP_QUERY:
                return build_op_reply(self._reply_id(), request_id, [doc])
            return build_op_msg(self._reply_id(), request_id, doc)
        if isinstance(message, OpReply):
            raise ProtocolError("a client sent OP_REPLY", close=True)
        if message.compressor is not None:
            self.compressed_requests += 1
        if isinstance(message, OpQuery):
            doc = await self._op_query(conn, message)
            return self._maybe_compress(conn, self._frame(build_op_reply, request_id, doc), message)
        try:
            cmd = message.command()
        except ProtocolError as e:
            doc = error_reply(e.code, e.code_name, e.message)
        else:
            doc = await self._run(conn, cmd)
        if message.more_to_come:
            return None  # the sender wants no reply; errors are dropped (OP_MSG spec)
        # exhaustAllowed: one reply without moreToCome is always allowed (OP_MSG spec).
        return self._maybe_compress(conn, self._frame(build_op_msg, request_id, doc), message)

    async def _op_query(self, conn: Connection, q: OpQuery) -> dict[str, Any]:
        db, dot, coll = q.full_collection_name.partition(".")
        query = q.query
        if "$query" in query and isinstance(query["$query"], dict):
            query = query["$query"]  # a read preference wrapped the command (legacy form)
        name = next(iter(query), "")
        if coll != "$cmd" or not dot or name not in OP_QUERY_COMMANDS:
            what = name if coll == "$cmd" else f"find on {q.full_collection_name}"
            return error_reply(
                *UNSUPPORTED_OP_QUERY_COMMAND,
                f"Unsupported OP_QUERY command: {what}. The client driver may require an upgrade.",
            )
        return await self._run(conn, {**query, "$db": db})

    async def _run(self, conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.commands(conn, cmd)
        except Exception as e:
            log.exception("wire: command %r failed", next(iter(cmd), ""))
            return error_reply(*numbered(ErrorCode.InternalError), f"internal error: {type(e).__name__}: {e}")

    def _maybe_compress(self, conn: Connection, frame: bytes, request: OpMsg | OpQuery) -> bytes:
        """Compress a reply the way its request came (the OP_COMPRESSED spec lets the server
        choose), never a handshake reply."""
        if request.compressor is None or conn.compressor is None:
            return frame
        body = request.query if isinstance(request, OpQuery) else request.body
        if next(iter(body), "").lower() in NO_COMPRESSION:
            return frame
        return compress(frame, conn.compressor)

    def _frame(self, build: Callable[..., bytes], request_id: int, doc: dict[str, Any]) -> bytes:
        """The reply frame; a reply BSON cannot carry (a handler's bug) becomes InternalError."""
        payload: Any = [doc] if build is build_op_reply else doc
        try:
            return build(self._reply_id(), request_id, payload)
        except Exception as e:
            log.exception("wire: reply to request %d cannot be encoded", request_id)
            error = error_reply(*numbered(ErrorCode.InternalError), f"reply cannot be encoded as BSON: {e}")
            return build(self._reply_id(), request_id, [error] if build is build_op_reply else error)

    def _reply_id(self) -> int:
        return next(self._request_ids) & 0x7FFFFFFF
