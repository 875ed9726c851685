"""The wire skeleton (services/router/wire/server.py) on a localhost port, no Kafka: the real
pymongo driver connects and runs server commands; raw and fuzzed frames hurt only their own
connection."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient
from pymongo.errors import ConfigurationError, OperationFailure

from services.router.wire import frames as f
from services.router.wire.commands import SERVER_COMMANDS, CommandTable
from services.router.wire.server import WireServer, WireSettings


class Running:
    """A WireServer on its own event loop in a thread (pymongo is a blocking client)."""

    def __init__(self, **kwargs) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = WireServer(port=0, **kwargs)
        self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.port

    def client(self, **options) -> MongoClient:
        return MongoClient(
            "127.0.0.1",
            self.port,
            directConnection=True,
            serverSelectionTimeoutMS=2000,
            connectTimeoutMS=2000,
            **options,
        )

    def call(self, fn):
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(10)

    def stop(self) -> None:
        self.call(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def wire() -> Iterator[Running]:
    running = Running()
    yield running
    running.stop()


def _send(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(frame)


def _recv_frame(sock: socket.socket) -> bytes | None:
    """One whole frame, or None if the server closed the connection."""
    try:
        return _read_frame(sock)
    except ConnectionResetError:  # closed with our request unread
        return None


def _read_frame(sock: socket.socket) -> bytes | None:
    head = b""
    while len(head) < 16:
        chunk = sock.recv(16 - len(head))
        if not chunk:
            return None
        head += chunk
    (length,) = struct.unpack_from("<i", head)
    rest = b""
    while len(rest) < length - 16:
        chunk = sock.recv(length - 16 - len(rest))
        if not chunk:
            return None
        rest += chunk
    return head + rest


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _command(sock: socket.socket, doc: dict, request_id: int = 1, **kw) -> dict:
    _send(sock, f.build_op_msg(request_id, 0, doc, **kw))
    frame = _recv_frame(sock)
    assert frame is not None, "the server closed the connection"
    header, msg = f.parse_reply(frame)
    assert header.response_to == request_id and isinstance(msg, f.OpMsg)
    return msg.body


# ------------------------------------------------------------------ pymongo


def test_pymongo_connects_pings_reads_server_info_and_gets_command_not_found(wire):
    with wire.client() as client:
        assert client.admin.command("ping")["ok"] == 1.0
        info = client.server_info()  # pymongo sends `buildinfo`, lower case
        assert info["version"] == "8.0.0" and info["versionArray"][:2] == [8, 0]
        with pytest.raises(OperationFailure) as e:
            client.admin.command("frobnicate", 1)
        assert e.value.code == 59 and e.value.details["codeName"] == "CommandNotFound"
        assert "frobnicate" in str(e.value)
        desc = client.topology_description.server_descriptions()[("127.0.0.1", wire.port)]
        assert desc.server_type_name == "Mongos" and desc.max_wire_version == 25
        # Sessions are not advertised, so the driver refuses them (when first used) rather than
        # sending lsid / txnNumber and relying on them.
        with pytest.raises(ConfigurationError, match="[Ss]essions are not supported"):
            with client.start_session() as session:
                client.admin.command("ping", session=session)


def test_server_commands_answer_as_mongos(wire):
    with wire.client() as client:
        hello = client.admin.command("hello")
        assert hello["msg"] == "isdbgrid" and hello["isWritablePrimary"] is True
        assert (hello["maxBsonObjectSize"], hello["maxMessageSizeBytes"], hello["maxWriteBatchSize"]) == (
            16 * 1024 * 1024,
            48_000_000,
            100_000,
        )
        assert "logicalSessionTimeoutMinutes" not in hello and isinstance(hello["connectionId"], int)
        assert client.admin.command("isMaster")["ismaster"] is True
        fcv = client.admin.command({"getParameter": 1, "featureCompatibilityVersion": 1})
        assert fcv["featureCompatibilityVersion"] == {"version": "8.0"}
        with pytest.raises(OperationFailure) as e:
            client.admin.command({"getParameter": "foo"})
        assert e.value.code == 72
        assert client.admin.command("whatsmyuri")["you"].startswith("127.0.0.1:")
        assert client.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == []
        assert client.admin.command({"getLog": "startupWarnings"})["log"] == []
        assert client.admin.command("endSessions", [])["ok"] == 1.0
        assert client.admin.command("hostInfo")["system"]["numCores"] >= 1
        with pytest.raises(OperationFailure) as e:
            client.test.command({"getLog": "global"})
        assert e.value.code == 13  # admin only, as in MongoDB
        with pytest.raises(OperationFailure) as e:
            client.test.c.insert_one({"a": 1})  # CRUD is issue 14's
        assert e.value.code == 59 and "insert" in str(e.value)


def test_wire_settings_from_the_environment():
    assert WireSettings.from_env({}) == WireSettings(("zlib",), 1_000_000)
    assert WireSettings.from_env({"SHARDLOG_ROUTER_COMPRESSORS": "disabled"}).compressors == ()
    assert WireSettings.from_env({"SHARDLOG_ROUTER_COMPRESSORS": ""}).compressors == ()
    assert WireSettings.from_env({"SHARDLOG_ROUTER_COMPRESSORS": "noop, zlib"}).compressors == ("noop", "zlib")
    assert WireSettings.from_env({"SHARDLOG_ROUTER_MAX_CONNECTIONS": "7"}).max_connections == 7
    for bad in ({"SHARDLOG_ROUTER_COMPRESSORS": "snappy"}, {"SHARDLOG_ROUTER_MAX_CONNECTIONS": "0"}):
        with pytest.raises(ValueError):
            WireSettings.from_env(bad)


def test_a_connection_over_the_limit_is_closed_at_once():
    running = Running(max_connections=2)
    try:
        with _connect(running.port) as a, _connect(running.port) as b:
            assert _command(a, {"ping": 1, "$db": "admin"})["ok"] == 1.0
            assert _command(b, {"ping": 1, "$db": "admin"})["ok"] == 1.0
            with _connect(running.port) as c:
                _send(c, f.build_op_msg(1, 0, {"ping": 1, "$db": "admin"}))
                assert _recv_frame(c) is None
            assert running.server.connections_rejected == 1
            assert _command(a, {"ping": 1, "$db": "admin"}, 2)["ok"] == 1.0
        with _connect(running.port) as d:  # room again once they closed
            deadline = time.monotonic() + 5
            while running.server.open_connections > 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _command(d, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    finally:
        running.stop()


def test_zlib_is_negotiated_when_offered():
    running = Running(compressors=("zlib",))
    try:
        with running.client(compressors="zlib") as client:
            assert client.admin.command("ping")["ok"] == 1.0
            assert client.server_info()["ok"] == 1.0
        assert running.server.compressed_requests >= 2  # ping and buildinfo came zlib-compressed
    finally:
        running.stop()


# ------------------------------------------------------------------ raw frames


def test_legacy_op_query_handshake_and_nothing_else(wire):
    with _connect(wire.port) as sock:
        _send(sock, f.build_op_query(11, {"ismaster": 1, "helloOk": True, "client": {"driver": {"name": "t"}}}))
        header, reply = f.parse_reply(_recv_frame(sock))
        assert header.op_code == f.OP_REPLY and header.response_to == 11 and isinstance(reply, f.OpReply)
        (doc,) = reply.documents
        assert doc["helloOk"] is True and doc["ismaster"] is True and doc["msg"] == "isdbgrid"
        _send(sock, f.build_op_query(12, {"find": "c"}, collection="test.$cmd"))
        _, reply = f.parse_reply(_recv_frame(sock))
        assert isinstance(reply, f.OpReply) and reply.documents[0]["code"] == 352
        _send(sock, f.build_op_query(13, {"a": 1}, collection="test.c"))
        _, reply = f.parse_reply(_recv_frame(sock))
        assert isinstance(reply, f.OpReply) and reply.documents[0]["codeName"] == "UnsupportedOpQueryCommand"
        # hello carries client metadata only in the first handshake
        body = _command(sock, {"hello": 1, "client": {"driver": {"name": "t"}}, "$db": "admin"}, 14)
        assert body["code"] == 186


def test_more_to_come_gets_no_reply_and_checksums_are_checked(wire):
    with _connect(wire.port) as sock:
        _send(sock, f.build_op_msg(21, 0, {"ping": 1, "$db": "admin"}, flags=f.MSG_MORE_TO_COME))
        assert _command(sock, {"ping": 1, "$db": "admin"}, 22)["ok"] == 1.0  # the first reply answers 22
        assert _command(sock, {"ping": 1, "$db": "admin"}, 23, checksum=True)["ok"] == 1.0
        # a request with a checksum gets a reply with one (as from mongod)
        _send(sock, f.build_op_msg(24, 0, {"ping": 1, "$db": "admin"}, checksum=True))
        header, msg = f.parse_reply(_recv_frame(sock))
        assert isinstance(msg, f.OpMsg) and msg.checksum is not None and msg.body["ok"] == 1.0
        # a broken message with moreToCome gets no reply either
        _send(sock, struct.pack("<iiiiI", 23, 25, 0, f.OP_MSG, f.MSG_MORE_TO_COME) + b"\x00\xff\xff")
        assert _command(sock, {"ping": 1}, 26)["code"] == 40571  # no $db
        assert _command(sock, {"ping": 1, "$db": "admin"}, 27)["ok"] == 1.0  # still in step
        bad = bytearray(f.build_op_msg(28, 0, {"ping": 1, "$db": "admin"}, checksum=True))
        bad[-2] ^= 0x40
        _send(sock, bytes(bad))
        assert _recv_frame(sock) is None  # ChecksumMismatch: mongod closes the connection


def test_a_bad_frame_closes_only_its_connection(wire):
    with _connect(wire.port) as good, _connect(wire.port) as bad:
        assert _command(good, {"ping": 1, "$db": "admin"})["ok"] == 1.0
        _send(bad, struct.pack("<iiii", f.MAX_MESSAGE_SIZE_BYTES + 1, 1, 0, f.OP_MSG))  # over the limit
        assert _recv_frame(bad) is None
        assert _command(good, {"ping": 1, "$db": "admin"}, 2)["ok"] == 1.0
    with _connect(wire.port) as bad:
        _send(bad, struct.pack("<iiii", 20, 1, 0, 2002) + b"\x00" * 4)  # OP_INSERT: gone from MongoDB
        assert _recv_frame(bad) is None


# ------------------------------------------------------------------ fuzz against the live server

_SEEDS = [
    f.build_op_msg(1, 0, {"ping": 1, "$db": "admin"}),
    f.build_op_msg(2, 0, {"insert": "c", "$db": "t"}, sequences={"documents": [{"a": 1}]}, checksum=True),
    f.build_op_query(3, {"isMaster": 1}),
    f.compress(f.build_op_msg(4, 0, {"hello": 1, "$db": "admin"}), "zlib"),
]


@st.composite
def _garbage(draw):
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=120))
    frame = bytearray(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(frame) - 1))
        op = draw(st.sampled_from(["flip", "truncate", "insert"]))
        if op == "flip":
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del frame[max(i, 1) :]
        else:
            frame[i:i] = draw(st.binary(min_size=1, max_size=6))
    if len(frame) >= 4 and draw(st.booleans()):
        frame[0:4] = struct.pack("<i", len(frame))
    return bytes(frame)


def _throw(port: int, frame: bytes) -> None:
    """Send one garbage frame, then half-close: whatever the server does (reply, error reply,
    close) must end with the connection closed by us or by it, within the timeout."""
    with _connect(port) as sock:
        sock.settimeout(2)
        _send(sock, frame)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except (ConnectionResetError, TimeoutError):
            pass


def test_fuzzed_frames_hurt_only_their_own_connection(caplog):
    caplog.set_level(logging.INFO, logger="services.router.wire")
    running = Running()
    try:
        with running.client() as client, _connect(running.port) as bystander:
            assert _command(bystander, {"ping": 1, "$db": "admin"})["ok"] == 1.0
            assert client.admin.command("ping")["ok"] == 1.0  # the driver's monitor and pool connections
            baseline = running.server.open_connections

            @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(_garbage())
            def throw(frame):
                _throw(running.port, frame)

            throw()
            assert client.admin.command("ping")["ok"] == 1.0  # a normal client still works
            assert _command(bystander, {"ping": 1, "$db": "admin"}, 2)["ok"] == 1.0  # and an open connection
            deadline = time.monotonic() + 5
            while running.server.open_connections > baseline and time.monotonic() < deadline:
                time.sleep(0.05)
            assert running.server.open_connections == baseline  # no connection task leaked
            # every bad frame was a ProtocolError (logged at INFO), never an unexpected exception
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
            assert running.server.protocol_errors > 0
    finally:
        running.stop()


def test_a_handler_bug_is_an_internal_error_reply_not_a_dead_connection():
    table = CommandTable("test commands")
    table.table.update(SERVER_COMMANDS.table)  # the server commands, plus two broken ones

    @table.register("unencodable")
    async def _unencodable(conn, cmd):
        return {"value": object()}

    @table.register("boom")
    async def _boom(conn, cmd):
        raise RuntimeError("boom")

    running = Running(commands=table)
    try:
        with running.client() as client:
            for name in ("unencodable", "boom"):
                with pytest.raises(OperationFailure) as e:
                    client.admin.command(name)
                assert e.value.code == 1 and e.value.details["codeName"] == "InternalError"
            assert client.admin.command("ping")["ok"] == 1.0
    finally:
        running.stop()
