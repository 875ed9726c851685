"""Bad input and many connections against a LIVE router in a cluster (issue 14, section 3).

Every bad frame gets MongoDB's error reply, or a closed connection where mongod closes it (a
length it cannot trust, an unknown opcode, its "connection fatal" parse errors), and touches
nothing else: other connections and the router keep serving, and no document of a frame that
was refused is ever written.  The frames carry `insert` commands on a namespace checked
afterwards through the Kafka client path: today the wire answers them CommandNotFound, once
wire CRUD lands they run; the assertion (only documents of frames that parse whole may exist)
holds either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import struct
import threading
import tracemalloc
import zlib
from collections import Counter
from itertools import count
from typing import Any

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.client import AsyncCluster
from services.router.wire import frames as f
from tests.conftest import kafka_client_task, wait_until

pytestmark = pytest.mark.kafka

DB, COLL = "fuzz", "c"
NS = f"{DB}.{COLL}"


# ------------------------------------------------------------------ helpers


def _address(data_cluster) -> tuple[str, int]:
    wire = data_cluster.router.wire
    assert wire is not None
    return data_cluster.router.wire_host, wire.port


def _connect(addr: tuple[str, int], timeout: float = 5) -> socket.socket:
    sock = socket.create_connection(addr, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_frame(sock: socket.socket) -> bytes | None:
    """One whole frame, or None if the server closed the connection (EOF or reset)."""
    buf = b""
    try:
        while len(buf) < 16:
            chunk = sock.recv(16 - len(buf))
            if not chunk:
                return None
            buf += chunk
        (length,) = struct.unpack_from("<i", buf)
        while len(buf) < length:
            chunk = sock.recv(min(length - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
    except ConnectionResetError:
        return None
    return buf


def _reply(sock: socket.socket, request_id: int) -> dict[str, Any] | None:
    frame = _read_frame(sock)
    if frame is None:
        return None
    header, msg = f.parse_reply(frame)
    assert header.response_to == request_id
    if isinstance(msg, f.OpReply):
        return msg.documents[0]
    assert isinstance(msg, f.OpMsg)
    return msg.body


def _command(sock: socket.socket, doc: dict, request_id: int = 1) -> dict[str, Any]:
    sock.sendall(f.build_op_msg(request_id, 0, doc))
    body = _reply(sock, request_id)
    assert body is not None, "the server closed the connection"
    return body


def _closed(sock: socket.socket) -> bool:
    """The server closed this connection (without a reply)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _insert(request_id: int, ids: list[str], **kw: Any) -> bytes:
    docs = [{"_id": i, "fz": True, "pad": "x" * 20} for i in ids]
    return f.build_op_msg(
        request_id, 0, {"insert": COLL, "ordered": True, "$db": DB}, sequences={"documents": docs}, **kw
    )


def _documents(data_cluster) -> list[dict]:
    """Every document of NS, read through the Kafka client path (not the wire)."""

    async def go():
        async with AsyncCluster(data_cluster.settings.bootstrap, data_cluster.settings.cluster, timeout=60) as cl:
            return [d async for d in cl[DB][COLL].find({})]

    return asyncio.run(go())


def _seed(data_cluster) -> None:
    async def go():
        async with AsyncCluster(data_cluster.settings.bootstrap, data_cluster.settings.cluster, timeout=60) as cl:
            await cl[DB][COLL].insert_one({"_id": "seed"})

    asyncio.run(go())


def _inserted_ids(frame: bytes) -> list[Any]:
    """The `_id`s the bytes would insert into NS if they run: the server reads a stream, so
    each message that parses whole (our parser, which the server uses) counts, up to the first
    that does not: a mutated length can leave a valid insert followed by garbage."""
    ids: list[Any] = []
    rest = memoryview(frame)
    while len(rest) >= f.HEADER_SIZE:
        try:
            header = f.parse_header(rest[: f.HEADER_SIZE])
            if header.length > len(rest):
                break
            msg = f.parse_message(header, rest[f.HEADER_SIZE : header.length])
            cmd = msg.command() if isinstance(msg, f.OpMsg) else {}
        except f.ProtocolError:
            break
        if cmd.get("insert") == COLL and cmd.get("$db") == DB and isinstance(cmd.get("documents"), list):
            ids.extend(d.get("_id", NO_ID) for d in cmd["documents"] if isinstance(d, dict))
        rest = rest[header.length :]
    return ids


NO_ID = object()  # a document that parsed without an `_id` (a mutated key name): the router gives it an ObjectId


def _own_tasks(data_cluster) -> list[str]:
    """The coroutine of each task on the cluster's loop that the Kafka client library did not
    create (its connections and fetches come and go on the broker's schedule, not ours)."""

    async def names():
        return sorted(
            getattr(t.get_coro(), "__qualname__", repr(t.get_coro()))
            for t in asyncio.all_tasks()
            if not kafka_client_task(t)
        )

    return data_cluster.call(names())


def _wire_counts(data_cluster) -> tuple[int, int]:
    """(our tasks on the cluster's loop, connection tasks of the wire server)."""
    names = _own_tasks(data_cluster)
    return len(names), names.count("WireServer._serve")


def _tasks_back(data_cluster, before: list[str]) -> None:
    """Wait until the loop holds no more of our tasks than `before` did (give or take two
    transient ones); on failure, name the coroutines that stayed."""
    wait_until(
        lambda: _wire_counts(data_cluster)[0] <= len(before) + 2,
        30,
        "the loop's tasks back to baseline",
        detail=lambda: f"tasks beyond the baseline: {Counter(_own_tasks(data_cluster)) - Counter(before)}",
    )


def _wire_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("services.router.wire") and r.levelno >= logging.WARNING
    ]


# ------------------------------------------------------------------ each kind of bad input


def test_each_kind_of_bad_input_gets_mongods_answer_and_writes_nothing(data_cluster, caplog):
    caplog.set_level(logging.INFO, logger="services.router.wire")
    _seed(data_cluster)
    wire = data_cluster.router.wire
    with _wire_insert(wire):
        _each_kind_of_bad_input(data_cluster, caplog)


def _each_kind_of_bad_input(data_cluster, caplog) -> None:
    addr = _address(data_cluster)
    wire = data_cluster.router.wire
    client = data_cluster.mongo_client()
    assert client.admin.command("ping")["ok"] == 1.0
    bystander = _connect(addr)
    assert _command(bystander, {"hello": 1, "$db": "admin"})["msg"] == "isdbgrid"
    ping = {"ping": 1, "$db": "admin"}

    def answered(frame: bytes, request_id: int, code: int, *, then_closed: bool = False) -> None:
        """`frame` gets an error reply with `code`; the connection then goes on (a ping on it
        works) or, with then_closed, is closed."""
        with _connect(addr) as sock:
            sock.sendall(frame)
            body = _reply(sock, request_id)
            assert body is not None and body["ok"] == 0 and body["code"] == code, body
            assert isinstance(body["errmsg"], str) and body["codeName"]
            if then_closed:
                assert _closed(sock)
            else:
                assert _command(sock, ping, request_id + 1)["ok"] == 1.0

    def closed(frame: bytes, *, half_close: bool = False) -> None:
        """The server closes the connection without a reply."""
        with _connect(addr) as sock:
            sock.sendall(frame)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            assert _closed(sock)

    good = _insert(1, ["a1", "a2", "a3"])
    body_at = 16 + 4  # after the header and the flag bits

    # Lengths: below a header, above the limit, shorter than what follows, longer than what came.
    closed(struct.pack("<iiii", 8, 1, 0, f.OP_MSG) + good[16:])
    closed(struct.pack("<iiii", f.MAX_MESSAGE_SIZE_BYTES + 1, 1, 0, f.OP_MSG) + good[16:])
    closed(struct.pack("<iiii", -5, 1, 0, f.OP_MSG))
    closed(struct.pack("<i", len(good) + 100) + good[4:], half_close=True)  # "longer": the rest never comes
    closed(good[: len(good) // 2], half_close=True)  # truncated frame
    closed(good[:10], half_close=True)  # truncated header
    # A length that is too small but still a message: the body the header claims is cut
    # short; what follows is read as the next header, which is garbage: closed.
    short = bytearray(good)
    struct.pack_into("<i", short, 0, len(good) - 30)
    with _connect(addr) as sock:
        sock.sendall(bytes(short))
        sock.shutdown(socket.SHUT_WR)
        frame = _read_frame(sock)
        if frame is not None:  # an error reply to the cut message (InvalidBSON), then the close
            _, msg = f.parse_reply(frame)
            assert isinstance(msg, f.OpMsg) and msg.body["ok"] == 0
        assert _closed(sock)

    # Unknown and legacy opcodes (OP_INSERT 2002 is gone from MongoDB): closed.
    for op in (2002, 2010, 9999):
        closed(struct.pack("<iiii", len(good), 2, 0, op) + good[16:])

    # Truncated BSON (a document shorter than its own length) and invalid BSON.
    seq_doc = bytearray(_insert(3, ["b1"]))
    cut = bytearray(good)
    cut[body_at + 1 : body_at + 5] = struct.pack("<i", 5000)  # the body claims 5000 bytes
    answered(bytes(cut), 1, 22)
    bad = bytearray(f.build_op_msg(4, 0, {"insert": COLL, "$db": DB, "documents": [{"_id": "b2", "x": 1}]}))
    j = bad.index(b"\x10x\x00")  # the int32 element "x"
    bad[j] = 0x7E  # no such BSON type
    answered(bytes(bad), 4, 22)
    struct.pack_into("<i", seq_doc, len(seq_doc) - len(bson.encode({"_id": "b1", "fz": True, "pad": "x" * 20})), 3)
    answered(bytes(seq_doc), 3, 22)  # a sequence document with an impossible length

    # A document over the size limit, in a message under it: BSONObjectTooLarge, connection kept.
    too_big = {"_id": "c2", "pad": "x" * (f.MAX_DOCUMENT_INTERNAL_SIZE + 1)}
    huge = f.build_op_msg(5, 0, {"insert": COLL, "$db": DB}, sequences={"documents": [{"_id": "c1"}, too_big]})
    answered(huge, 5, 10334)

    # Command documents of the wrong shape.
    answered(f.build_op_msg(6, 0, {}), 6, 9)  # empty: FailedToParse
    answered(f.build_op_msg(7, 0, {"insert": COLL, "documents": [{"_id": "d1"}]}), 7, 40571)  # no $db
    answered(f.build_op_msg(8, 0, {"insert": COLL, "documents": [{"_id": "d2"}], "$db": 5}), 8, 40571)
    answered(
        f.build_op_msg(9, 0, {"insert": COLL, "documents": [], "$db": DB}, sequences={"documents": [{"_id": "d3"}]}),
        9,
        40433,
    )

    # OP_MSG with two kind-0 sections, with no kind-0 section, a duplicate sequence.
    body_doc = bson.encode({"insert": COLL, "$db": DB})
    two = struct.pack("<iiiiI", 20 + 2 * (1 + len(body_doc)), 10, 0, f.OP_MSG, 0) + (b"\x00" + body_doc) * 2
    answered(two, 10, 40430)
    payload = b"documents\x00" + bson.encode({"_id": "g1"})
    seq = b"\x01" + struct.pack("<i", 4 + len(payload)) + payload  # a kind-1 section
    only_seq = struct.pack("<iiiiI", 20 + len(seq), 11, 0, f.OP_MSG, 0) + seq
    answered(only_seq, 11, 40587)
    dup = b"\x00" + body_doc + seq + seq
    answered(struct.pack("<iiiiI", 20 + len(dup), 12, 0, f.OP_MSG, 0) + dup, 12, 40431)

    # Unknown section kind: answered (mongod's 40432), then closed (the OP_MSG spec's MUST).
    kind = bytearray(good)
    kind[body_at] = 2
    answered(bytes(kind), 1, 40432, then_closed=True)

    # Unknown required flag bits, a checksum mismatch, a third document sequence: mongod's
    # connection-fatal parse errors: closed without a reply.
    flagged = bytearray(good)
    struct.pack_into("<I", flagged, 16, 1 << 7)
    closed(bytes(flagged))
    bad_sum = bytearray(_insert(13, ["e1"], checksum=True))
    bad_sum[-1] ^= 0x01
    closed(bytes(bad_sum))
    three = f.build_op_msg(
        14, 0, {"insert": COLL, "$db": DB}, sequences={"documents": [{"_id": "e2"}], "a": [{}], "b": [{}]}
    )
    closed(three)
    # Bad compression: an unknown compressor id and a zlib bomb's declared size: error replies.
    inner = _insert(15, ["f1"])
    bomb_body = struct.pack("<iiB", f.OP_MSG, 10, 2) + zlib.compress(inner[16:])
    answered(struct.pack("<iiii", 16 + len(bomb_body), 15, 0, f.OP_COMPRESSED) + bomb_body, 15, 17)
    snappy_body = struct.pack("<iiB", f.OP_MSG, len(inner) - 16, 1) + inner[16:]
    answered(struct.pack("<iiii", 16 + len(snappy_body), 16, 0, f.OP_COMPRESSED) + snappy_body, 16, 17)

    # A broken message with moreToCome gets no reply, and the connection is still in step.
    with _connect(addr) as sock:
        broken = bytearray(good)
        struct.pack_into("<I", broken, 16, f.MSG_MORE_TO_COME)
        broken[body_at + 1 : body_at + 5] = struct.pack("<i", 5000)
        sock.sendall(bytes(broken))
        assert _command(sock, ping, 17)["ok"] == 1.0

    # Everything else kept serving: the bystander, a driver, the Kafka path.  The same insert
    # sent whole is written (the control); nothing of the refused ones was.
    assert _command(bystander, ping, 2)["ok"] == 1.0
    bystander.close()
    assert client.admin.command("ping")["ok"] == 1.0
    with _connect(addr) as sock:
        sock.sendall(_insert(18, ["ok1", "ok2"]))
        assert _reply(sock, 18)["n"] == 2  # (a real insert adds fields; n is the count)
    assert sorted(d["_id"] for d in _documents(data_cluster)) == ["ok1", "ok2", "seed"]
    assert wire.protocol_errors >= 20
    assert _wire_warnings(caplog) == []


# ------------------------------------------------------------------ fuzz


_ids = count()


def _zlib_stored(frame: bytes) -> bytes:
    """`frame` in OP_COMPRESSED with zlib at level 0 (stored blocks): a valid zlib stream whose
    size does not depend on the content, so every run draws the same mutations (hypothesis
    insists); deflate-coded streams are fuzzed by the unit tests."""
    header = f.parse_header(frame)
    body = struct.pack("<iiB", header.op_code, len(frame) - 16, 2) + zlib.compress(frame[16:], 0)
    return struct.pack("<iiii", 16 + len(body), header.request_id, 0, f.OP_COMPRESSED) + body


def _templates() -> list[bytes]:
    """Valid insert frames on NS in the shapes drivers send them, each with `_id`s never used
    before (so a document found later names the one frame it came from)."""

    def ids(k: int) -> list[str]:
        return [f"t{next(_ids):07d}" for _ in range(k)]  # fixed width: same frame sizes each run

    as_array = f.build_op_msg(
        1, 0, {"insert": COLL, "documents": [{"_id": i, "fz": True} for i in ids(3)], "ordered": True, "$db": DB}
    )
    return [
        _insert(1, ids(3)),
        _insert(2, ids(2), checksum=True),
        _insert(3, ids(2), flags=f.MSG_MORE_TO_COME),  # w:0
        as_array,
        _zlib_stored(_insert(4, ids(2))),
        f.build_op_query(5, {"insert": COLL, "documents": [{"_id": i} for i in ids(1)]}, collection=f"{DB}.$cmd"),
    ]


@st.composite
def _mutated_inserts(draw):
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(min_size=1, max_size=200))  # plain noise
    frame = bytearray(draw(st.sampled_from(_templates())))
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["flip", "truncate", "length", "section-length", "kind", "flags", "splice"]))
        if what == "flip":
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif what == "truncate":
            del frame[draw(st.integers(1, len(frame) - 1)) :]
        elif what == "length":  # the header's messageLength
            frame[0:4] = struct.pack(
                "<i",
                draw(
                    st.sampled_from(
                        [0, 15, 16, 17, -1, len(frame) - 1, len(frame) + 1, 2**31 - 1, f.MAX_MESSAGE_SIZE_BYTES + 1]
                    )
                ),
            )
        elif what == "section-length" and len(frame) > 28:  # a BSON or sequence length inside
            j = draw(st.integers(21, len(frame) - 4))
            frame[j : j + 4] = struct.pack("<i", draw(st.sampled_from([0, 4, 5, 2**31 - 1, -1, len(frame)])))
        elif what == "kind" and len(frame) > 20:  # the first section's kind byte
            frame[20] = draw(st.integers(0, 3))
        elif what == "flags" and len(frame) >= 20:
            frame[16:20] = struct.pack("<I", draw(st.sampled_from([1, 2, 4, 1 << 15, 1 << 16, 1 << 31, 0xFFFF])))
        elif what == "splice":
            i = draw(st.integers(0, len(frame)))
            frame[i:i] = draw(st.binary(min_size=1, max_size=8))
        if len(frame) < 2:
            break
    if len(frame) >= 4 and draw(st.booleans()):
        frame[0:4] = struct.pack("<i", len(frame))  # keep the outer length right half the time
    return bytes(frame)


def _throw(addr: tuple[str, int], frame: bytes) -> None:
    """One frame on a fresh connection, then half-close: whatever the server does (reply,
    error reply, close) must end with the connection closed within the timeout."""
    with _connect(addr, timeout=10) as sock:
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


@contextlib.contextmanager
def _wire_insert(wire):
    """The wire's `insert`: the real one once wire CRUD is merged, else a minimal stand-in for
    this test (the documents straight to `routing.handle(Insert)`), so that frames which
    parse whole really write and the "nothing of a refused frame" check has teeth today."""
    from schemas import shard as s

    if wire.commands.handles("insert"):
        yield False
        return

    async def insert(conn, cmd):
        ns = f"{cmd['$db']}.{cmd['insert']}"
        ordered = cmd.get("ordered", True) is not False
        result = await conn.cluster().routing.handle(s.Insert(ns=ns, docs=cmd["documents"], ordered=ordered))
        return {"n": result["inserted"]}

    wire.commands.register("insert")(insert)
    try:
        yield True
    finally:
        del wire.commands.table["insert"]


def test_fuzzed_insert_frames_hurt_nothing_and_write_only_what_parsed(data_cluster, caplog):
    caplog.set_level(logging.INFO, logger="services.router.wire")
    _seed(data_cluster)
    addr = _address(data_cluster)
    wire = data_cluster.router.wire
    client = data_cluster.mongo_client()
    assert client.admin.command("ping")["ok"] == 1.0
    bystander = _connect(addr)
    assert _command(bystander, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    _, serving_before = _wire_counts(data_cluster)
    may_exist: list[Any] = ["seed"]  # the _ids of frames that parsed whole (they may have run)
    thrown = 0

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_mutated_inserts())
    def throw(frame):
        nonlocal thrown
        may_exist.extend(_inserted_ids(frame))
        _throw(addr, frame)
        thrown += 1

    with _wire_insert(wire) as stand_in:
        throw()
        # the stand-in writes: the valid templates did insert (so the check below can fail)
        valid = [i for i in may_exist if isinstance(i, str) and i.startswith("t")]
        found = [d["_id"] for d in _documents(data_cluster)]
        if stand_in:
            assert len(valid) >= 10 and any(i in valid for i in found), (len(valid), found[:5])
    assert thrown == 200
    # A normal client still works, an open connection too, and the Kafka path (which read `found`).
    assert client.admin.command("ping")["ok"] == 1.0
    assert _command(bystander, {"ping": 1, "$db": "admin"}, 2)["ok"] == 1.0
    bystander.close()
    assert "seed" in found
    # Only documents of frames that parsed whole exist: nothing of a refused frame, no partial
    # write of one.  (Compared with ==: a mutated _id may be of any type.)
    unexplained = [i for i in found if not any(i == m and type(i) is type(m) for m in may_exist)]
    generated = [i for i in unexplained if isinstance(i, bson.ObjectId)]
    assert len(generated) <= may_exist.count(NO_ID), (generated, may_exist.count(NO_ID))
    assert [i for i in unexplained if i not in generated] == []
    if not stand_in:  # wire CRUD merged: a driver reads what the Kafka path sees
        assert sorted(map(str, (d["_id"] for d in client[DB][COLL].find({})))) == sorted(map(str, found))
    wait_until(lambda: _wire_counts(data_cluster)[1] <= serving_before, 10, "fuzz connections to close")
    assert wire.protocol_errors > 0
    assert _wire_warnings(caplog) == []


# ------------------------------------------------------------------ many connections


def _threads() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


IDLE, BUSY = 1000, 64


def test_a_thousand_idle_and_64_busy_connections_leak_no_thread_or_task(data_cluster):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (IDLE + BUSY) + 1024  # both ends live in this process, plus the cluster's files
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    addr = _address(data_cluster)
    wire = data_cluster.router.wire
    names_before = _own_tasks(data_cluster)
    tasks_before, serving_before = len(names_before), names_before.count("WireServer._serve")
    threads_before, py_threads_before = _threads(), threading.active_count()
    tracemalloc.start()  # Python allocations: RSS barely moves (the allocator reuses freed pages)
    traced_before, _ = tracemalloc.get_traced_memory()

    idle: list[socket.socket] = []
    try:
        for i in range(IDLE):
            sock = _connect(addr)
            idle.append(sock)
            sock.sendall(f.build_op_msg(i + 1, 0, {"hello": 1, "$db": "admin"}))
        for i, sock in enumerate(idle):
            body = _reply(sock, i + 1)
            assert body is not None and body["ok"] == 1.0
        traced_idle, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        per_idle = (traced_idle - traced_before) / IDLE

        # 64 busy connections, driven by one client thread (asyncio), while the idle ones stay.
        stop = threading.Event()
        done: list[int] = []

        async def busy_one(k: int) -> int:
            # our own socket: asyncio.open_connection(host, port) would resolve the address on
            # executor threads, which the thread count below would then see
            reader, writer = await asyncio.open_connection(sock=_connect(addr))
            n = 0
            try:
                while not stop.is_set() or n == 0:
                    cmd = {"ping": 1, "$db": "admin"} if n % 2 else {"hello": 1, "$db": "admin"}
                    writer.write(f.build_op_msg(n + 1, 0, cmd))
                    head = await reader.readexactly(16)
                    (length,) = struct.unpack_from("<i", head)
                    _, msg = f.parse_reply(head + await reader.readexactly(length - 16))
                    assert isinstance(msg, f.OpMsg) and msg.body["ok"] == 1.0
                    n += 1
            finally:
                writer.close()
                await writer.wait_closed()
            return n

        def busy() -> None:
            async def all_busy():
                return await asyncio.gather(*(busy_one(k) for k in range(BUSY)))

            done.extend(asyncio.run(all_busy()))

        driver = threading.Thread(target=busy, name="busy-clients")
        driver.start()
        try:
            wait_until(
                lambda: _wire_counts(data_cluster)[1] >= serving_before + IDLE + BUSY,
                30,
                "1,064 connections open on the router",
            )
            assert wire.open_connections >= IDLE + BUSY
            tasks_held, serving_held = _wire_counts(data_cluster)
            threads_held = _threads()
        finally:
            stop.set()
            driver.join(60)
        assert not driver.is_alive() and len(done) == BUSY and min(done) >= 1
        # One task per connection, and no thread per connection: the only new thread is the
        # test's own busy-client driver (whose asyncio loop may add a selector thread or none).
        assert serving_held - serving_before >= IDLE + BUSY
        assert threads_held <= threads_before + 4, (threads_before, threads_held)
        assert threading.active_count() <= py_threads_before + 1
        # The idle ones still answer after the busy storm.
        for i in (0, IDLE // 2, IDLE - 1):
            assert _command(idle[i], {"ping": 1, "$db": "admin"}, 10_000 + i)["ok"] == 1.0
    finally:
        for sock in idle:
            sock.close()

    wait_until(lambda: _wire_counts(data_cluster)[1] <= serving_before, 30, "every connection task to end")
    _tasks_back(data_cluster, names_before)
    assert wire.open_connections == serving_before
    print(
        f"\n{IDLE} idle + {BUSY} busy connections: {tasks_held - tasks_before} more tasks, "
        f"{threads_held - threads_before} more OS threads; Python memory per idle connection "
        f"~{per_idle / 1024:.1f} KiB (server task, streams, transport, Connection; and this test's socket)"
    )
    assert per_idle < 64 * 1024, f"{per_idle:.0f} bytes per idle connection"


def test_clients_that_disconnect_mid_operation_leave_no_task(data_cluster):
    """A command that goes to the shards through Kafka, its client gone before the answer:
    the command finishes, its reply goes nowhere, its task ends."""
    from schemas import shard as s

    _seed(data_cluster)
    addr = _address(data_cluster)
    wire = data_cluster.router.wire
    name = "_wireRobustnessCount"
    finished: list[int] = []

    async def slow_count(conn, cmd):  # a test-only command: a count through the router
        result = await conn.cluster().routing.handle(s.Count(ns=NS, filter={}))
        finished.append(result["n"])
        return {"n": result["n"]}

    wire.commands.register(name)(slow_count)
    try:
        names_before = _own_tasks(data_cluster)
        serving_before = names_before.count("WireServer._serve")
        with _connect(addr) as sock:  # the command works with its client there
            assert _command(sock, {name: 1, "$db": DB})["n"] == 1
        for k in range(20):
            with _connect(addr) as sock:
                sock.sendall(f.build_op_msg(k + 1, 0, {name: 1, "$db": DB}))
            # and a client that goes away half-way through sending a frame
            with _connect(addr) as sock:
                sock.sendall(f.build_op_msg(k + 1, 0, {name: 1, "$db": DB})[:20])
        wait_until(lambda: len(finished) >= 21, 30, "the abandoned commands to finish")
        wait_until(lambda: _wire_counts(data_cluster)[1] <= serving_before, 10, "their connection tasks to end")
        _tasks_back(data_cluster, names_before)
        assert finished.count(1) == len(finished)  # each counted the seed document, nothing more
        assert wire.open_connections == serving_before
        assert data_cluster.mongo_client().admin.command("ping")["ok"] == 1.0
    finally:
        del wire.commands.table[name]


def test_the_router_offers_zlib_by_default_and_pymongo_uses_it(data_cluster):
    wire = data_cluster.router.wire
    assert wire.compressors == ("zlib",)  # SHARDLOG_ROUTER_COMPRESSORS unset: the default
    before = wire.compressed_requests
    zipped = data_cluster.mongo_client(compressors="zlib")
    assert zipped.admin.command("ping")["ok"] == 1.0
    assert zipped.server_info()["version"] == "8.0.0"
    assert wire.compressed_requests >= before + 2  # ping and buildinfo arrived zlib-compressed
    zipped_count = wire.compressed_requests
    plain = data_cluster.mongo_client()  # a client that asks for nothing sends nothing compressed
    assert plain.admin.command("ping")["ok"] == 1.0 and plain.server_info()["ok"] == 1.0
    assert wire.compressed_requests == zipped_count
    with _connect(_address(data_cluster)) as sock:
        hello = _command(sock, {"hello": 1, "compression": ["snappy", "zstd", "zlib"], "$db": "admin"})
        assert hello["compression"] == ["zlib"]  # the intersection, in the client's order
    with _connect(_address(data_cluster)) as sock:
        assert "compression" not in _command(sock, {"hello": 1, "compression": ["none"], "$db": "admin"})
