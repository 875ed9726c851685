"""The vector clock (docs/decisions/0014): LogicalTime, VectorClock, signed cluster times,
afterClusterTime, key rotation, and where the services fold and check them."""

from __future__ import annotations

import base64
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import clock as vc
from domain.catalog import Catalog
from libs.client import AsyncCluster, ClientSession
from libs.commands import CommandError, stamp, stamped
from libs.store import Store
from schemas import config as c
from schemas import shard as s
from schemas.reply import Reply
from services.config.decide import decide
from services.router.route import OperationRouter
from services.shard.documents import ShardDocuments

u32 = st.integers(0, vc.MAX_INC)
times = st.builds(lambda t, i: vc.LogicalTime(t, i).packed, st.integers(1, 2**31), u32)
KEY = bytes(range(20))
NOW = 1_800_000_000.0


def code_of(fn, *args) -> str:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return e.value.code


# ------------------------------------------------------------------ LogicalTime


@given(u32, u32)
def test_pack_and_unpack_round_trip(secs, inc):
    t = vc.LogicalTime(secs, inc)
    assert vc.LogicalTime.unpack(t.packed) == t
    assert vc.parse_timestamp(t.to_ejson(), "x") == t.packed
    assert vc.to_ejson(t.packed) == {"$timestamp": {"t": secs, "i": inc}}


@given(u32, u32, u32, u32)
def test_packed_order_is_logical_order(a, b, x, y):
    assert (vc.LogicalTime(a, b) < vc.LogicalTime(x, y)) == (vc.LogicalTime(a, b).packed < vc.LogicalTime(x, y).packed)


@pytest.mark.parametrize(
    "raw",
    [None, 5, "5", {"t": 1, "i": 1}, {"$timestamp": 5}, {"$timestamp": {"t": 1}}, {"$timestamp": {"t": -1, "i": 0}},
     {"$timestamp": {"t": 2**32, "i": 0}}, {"$timestamp": {"t": True, "i": 0}}, {"$timestamp": {"t": 1.5, "i": 0}},
     {"$timestamp": {"t": 1, "i": 0, "x": 0}}],
)  # fmt: skip
def test_a_malformed_timestamp_is_a_type_mismatch(raw):
    assert code_of(vc.parse_timestamp, raw, "afterClusterTime") == "TypeMismatch"


# ------------------------------------------------------------------ VectorClock

ops = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.floats(0, 2**31)),
        st.tuples(st.just("advance"), st.tuples(times | st.just(0), times | st.just(0), times | st.just(0))),
    ),
    max_size=60,
)


@given(ops)
def test_the_clock_never_goes_back_and_keeps_its_order(steps):
    clock = vc.VectorClock(wall=lambda: 0)
    before = clock.now()
    for kind, arg in steps:
        if kind == "tick":
            t = clock.tick(arg)
            assert t > before.cluster and t >> 32 >= int(arg)  # a tick is new, and not behind the wall clock
        else:
            clock.advance(*arg)
            assert clock.cluster_time >= max(arg)  # gossip is never lost
        now = clock.now()
        assert all(n >= b for n, b in zip(now, before))  # monotonic, component by component
        assert now.cluster >= now.config >= now.topology  # ClusterTime >= ConfigTime >= TopologyTime
        before = now


def test_tick_takes_the_wall_clock_seconds_or_the_next_increment():
    clock = vc.VectorClock(wall=lambda: 100.7)
    assert clock.tick() == vc.LogicalTime(100, 1).packed
    assert clock.tick() == vc.LogicalTime(100, 2).packed
    clock.advance(vc.LogicalTime(500, vc.MAX_INC).packed)  # a time from the future, gossiped
    assert clock.tick() == vc.LogicalTime(501, 1).packed  # the increment overflows into the seconds
    assert clock.tick(600) == vc.LogicalTime(600, 1).packed


def test_gossip_headers_round_trip_and_garbage_advances_nothing():
    clock = vc.VectorClock()
    clock.advance(30, 20, 10)
    other = vc.VectorClock()
    other.gossip_in(clock.gossip_out())
    assert other.now() == (30, 20, 10)
    for junk in (None, b"", b"1,2", b"a,b,c", b"-1,0,0", b"99999999999999999999999,0,0"):
        other.gossip_in(junk)
    assert other.now() == (30, 20, 10)


# ------------------------------------------------------------------ signatures


@given(times, times, st.binary(min_size=1, max_size=32))
def test_a_signature_verifies_only_with_its_key_and_time(t, other_t, other_key):
    proof = vc.sign(KEY, t)
    assert vc.verify(KEY, t, proof)
    assert vc.verify(other_key, t, proof) == (other_key == KEY)
    assert vc.verify(KEY, other_t, proof) == (other_t == t)


def keyring(*expires: int) -> dict[int, vc.ClusterTimeKey]:
    return {
        i + 1: vc.ClusterTimeKey(i + 1, bytes([i + 1]) * 20, vc.LogicalTime(e, 0).packed) for i, e in enumerate(expires)
    }


def test_the_signing_key_is_the_first_to_expire_after_the_time():
    keys = keyring(100, 200, 300)
    assert vc.signing_key(keys, vc.LogicalTime(50, 1).packed).key_id == 1
    assert vc.signing_key(keys, vc.LogicalTime(150, 1).packed).key_id == 2
    assert vc.signing_key(keys, vc.LogicalTime(400, 1).packed).key_id == 3  # all expired: the newest
    assert vc.signing_key({}, 5) is None


def test_a_signed_cluster_time_parses_back_and_before_any_key_is_the_dummy():
    t = vc.LogicalTime(150, 7).packed
    keys = keyring(100, 200)
    doc = vc.signed_cluster_time(t, keys)
    parsed = vc.parse_signed_cluster_time(doc)
    assert (parsed.time, parsed.key_id) == (t, 2) and vc.verify(keys[2].key, t, parsed.proof)
    dummy = vc.signed_cluster_time(t, {})
    assert dummy["signature"] == {
        "hash": {"$binary": {"base64": base64.b64encode(bytes(20)).decode(), "subType": "00"}},
        "keyId": 0,
    }


def signed(t: int, key: bytes = KEY, key_id: int = 1) -> dict:
    return {
        "clusterTime": vc.to_ejson(t),
        "signature": {
            "hash": {"$binary": {"base64": base64.b64encode(vc.sign(key, t)).decode(), "subType": "00"}},
            "keyId": key_id,
        },
    }


@pytest.mark.parametrize(
    "raw, code",
    [
        ("x", "TypeMismatch"),
        ({}, "NoSuchKey"),
        ({"clusterTime": 5, "signature": {}}, "TypeMismatch"),
        ({"clusterTime": vc.to_ejson(5)}, "NoSuchKey"),
        ({"clusterTime": vc.to_ejson(5), "signature": []}, "TypeMismatch"),
        ({"clusterTime": vc.to_ejson(5), "signature": {"keyId": 1}}, "NoSuchKey"),
        ({"clusterTime": vc.to_ejson(5), "signature": {"hash": "abc", "keyId": 1}}, "TypeMismatch"),
        ({"clusterTime": vc.to_ejson(5), "signature": {"hash": {"$binary": {"base64": "!!", "subType": "00"}}, "keyId": 1}}, "TypeMismatch"),
        ({"clusterTime": vc.to_ejson(5), "signature": {"hash": {"$binary": {"base64": "AAAA", "subType": "00"}}, "keyId": 1}}, "UnsupportedFormat"),
        ({**signed(5), "signature": {**signed(5)["signature"], "keyId": "1"}}, "TypeMismatch"),
        ({**signed(5), "signature": {**signed(5)["signature"], "keyId": -1}}, "TypeMismatch"),
        ({"clusterTime": vc.to_ejson(5), "signature": {"hash": signed(5)["signature"]["hash"]}}, "NoSuchKey"),
    ],
)  # fmt: skip
def test_a_malformed_cluster_time_gets_mongodbs_error(raw, code):
    assert code_of(vc.parse_signed_cluster_time, raw) == code


def test_validating_a_clients_cluster_time():
    own = vc.LogicalTime(int(NOW), 5).packed
    keys = {1: vc.ClusterTimeKey(1, KEY, vc.LogicalTime(int(NOW) + 1000, 0).packed)}
    drift = 3600

    def check(doc):
        return vc.validate_cluster_time(vc.parse_signed_cluster_time(doc), own, keys, NOW, drift)

    ahead = own + 10
    assert check(signed(ahead)) == ahead  # signed by a key of the cluster
    assert check(signed(own - 1, key=b"forged" * 4)) == own - 1  # not above ours: nothing to vouch for
    with pytest.raises(CommandError) as e:
        check(signed(ahead, key=b"forged" * 4))
    assert e.value.code == "TimeProofMismatch"
    assert code_of(check, vc.signed_cluster_time(ahead, {})) == "KeyNotFound"  # unsigned (the dummy)
    assert code_of(check, signed(ahead, key_id=9)) == "KeyNotFound"
    too_far = vc.LogicalTime(int(NOW) + drift + 1, 0).packed
    assert code_of(check, signed(too_far)) == "ClusterTimeFailsRateLimiter"  # even when correctly signed
    assert check(signed(vc.LogicalTime(int(NOW) + drift, 0).packed))


# ------------------------------------------------------------------ afterClusterTime


@pytest.mark.parametrize(
    "rc, code",
    [
        (5, "TypeMismatch"),
        ({"afterClusterTime": 5}, "TypeMismatch"),
        ({"afterClusterTime": vc.to_ejson(0)}, "InvalidOptions"),
        ({"afterClusterTime": vc.to_ejson(5), "atClusterTime": vc.to_ejson(5)}, "InvalidOptions"),
        ({"level": "linearizable"}, "InvalidOptions"),
        ({"level": "local", "atClusterTime": vc.to_ejson(5)}, "InvalidOptions"),
    ],
)
def test_a_malformed_read_concern_gets_mongodbs_error(rc, code):
    assert code_of(vc.parse_after_cluster_time, rc) == code


def test_a_snapshot_read_concern_names_its_time_at_a_shard():
    assert vc.parse_at_cluster_time({"level": "snapshot", "atClusterTime": vc.to_ejson(5)}) == 5
    assert vc.parse_at_cluster_time({"level": "majority"}) is None and vc.parse_at_cluster_time(None) is None
    assert code_of(vc.parse_at_cluster_time, {"level": "snapshot"}) == "InvalidOptions"  # the router picks it


def test_after_cluster_time_in_the_future_is_refused():
    assert vc.parse_after_cluster_time(None) is None
    assert vc.parse_after_cluster_time({"level": "majority"}) is None
    assert vc.parse_after_cluster_time({"afterClusterTime": vc.to_ejson(77)}) == 77
    vc.check_after_cluster_time(77, 77)
    assert code_of(vc.check_after_cluster_time, 78, 77) == "InvalidOptions"


# ------------------------------------------------------------------ keys


def test_keys_to_create_one_valid_now_and_the_next():
    day = 86_400
    first = vc.keys_to_create({}, NOW, 90 * day)
    assert [k for k, _ in first] == [1, 2]
    assert [e >> 32 for _, e in first] == [int(NOW) + 90 * day, int(NOW) + 180 * day]
    keys = {k: vc.ClusterTimeKey(k, b"k" * 20, e) for k, e in first}
    assert vc.keys_to_create(keys, NOW + 89 * day, 90 * day) == []  # both exist
    later = vc.keys_to_create(keys, NOW + 91 * day, 90 * day)  # the first expired: only one valid
    assert later == [(3, vc.LogicalTime(int(NOW) + 270 * day, 0).packed)]
    assert [k for k, _ in vc.keys_to_create(keys, NOW + 1000 * day, 90 * day)] == [3, 4]  # all expired


def test_the_config_server_makes_due_keys_once_and_every_follower_keeps_them(tmp_path):
    cat = Catalog()
    d = decide(cat, c.RotateClusterTimeKeys())
    assert [e.keyId for e in d.events] == [1, 2] and d.result == {"created": [1, 2]}
    for e in d.events:
        assert len(base64.b64decode(e.key)) == 20
        cat.apply(e, -1)
    assert decide(cat, c.RotateClusterTimeKeys()).events == []  # nothing due: the timer may ask again
    assert cat.keys[1].key == base64.b64decode(d.events[0].key)
    store = Store(tmp_path / "cat")
    store.commit(cat.drain_changes().items(), None)
    loaded = Catalog()
    loaded.load(store)
    assert loaded.keys == cat.keys


# ------------------------------------------------------------------ folding stamps


def test_the_catalog_folds_config_time_and_topology_time_and_a_restart_resumes_them(tmp_path):
    clock = vc.VectorClock()
    cat = Catalog(clock=clock)
    cat.apply(c.ShardAdded(shard="a", ts=10), 0)
    cat.apply(c.DatabaseCreated(db="d", primary="a", uuid="u", ts=20), 1)
    assert (cat.config_ts, cat.topology_ts) == (20, 10)
    assert clock.now() == (20, 20, 10)
    cat.apply(c.ShardRemoved(shard="a", ts=30), 2)
    assert (cat.config_ts, cat.topology_ts) == (30, 30) and clock.now() == (30, 30, 30)
    cat.apply(c.ShardAdded(shard="b"), 3)  # a log older than the stamps: nothing to fold
    assert cat.config_ts == 30
    store = Store(tmp_path / "cat")
    store.commit(cat.drain_changes().items(), None)
    restarted = vc.VectorClock()
    loaded = Catalog(clock=restarted)
    loaded.load(store)
    assert (loaded.config_ts, loaded.topology_ts) == (30, 30) and restarted.now() == (30, 30, 30)


def test_a_shard_persists_its_largest_stamp_with_the_fold_and_resumes_from_it(tmp_path):
    store = Store(tmp_path / "docs")
    docs = ShardDocuments()
    docs.clock = vc.VectorClock()
    docs.load(store)
    docs.apply(s.DocumentWritten(ns="d.x", skey="00", doc={"_id": 1}, ts=5), -1)
    docs.apply(s.DocumentRemoved(ns="d.x", skey="00", id=1, ts=9), -1)
    assert docs.clock.cluster_time == 9
    store.commit(docs.drain_changes().items(), None)
    again = ShardDocuments()
    again.clock = vc.VectorClock(wall=lambda: 0)
    again.load(store)
    assert again.max_ts == 9 and again.clock.tick() == 10  # never a stamp it gave out before


def test_the_processor_stamps_only_events_with_a_ts_field():
    clock = vc.VectorClock(wall=lambda: 100)
    written = stamp(clock, s.DocumentWritten(ns="d.x", skey="00", doc={"_id": 1}))
    assert written.ts == vc.LogicalTime(100, 1).packed
    recorded = s.MigrationForgotten(id="m")
    assert not stamped(recorded) and stamp(clock, recorded) is recorded
    assert all("ts" in e.model_fields for e in c.EVENTS)  # every config event is stamped


# ------------------------------------------------------------------ the router's checks


def router(keys=None) -> OperationRouter:
    cat = Catalog(track_changes=False)
    cat.keys = keys or {}
    follower = types.SimpleNamespace(catalog=cat, config_time=0)
    return OperationRouter(None, follower, None, "cursors", None, clock=vc.VectorClock())  # type: ignore[arg-type]


def test_a_router_refuses_a_forged_unsigned_or_runaway_cluster_time_and_changes_nothing():
    import time

    now = int(time.time())
    r = router({1: vc.ClusterTimeKey(1, KEY, vc.LogicalTime(now + 1000, 0).packed)})
    r.clock.advance(vc.LogicalTime(now, 1).packed)
    before = r.clock.now()
    ahead = vc.LogicalTime(now, 50).packed
    for doc, code in [
        (signed(ahead, key=b"x" * 20), "TimeProofMismatch"),
        (vc.signed_cluster_time(ahead, {}), "KeyNotFound"),
        (signed(vc.LogicalTime(now + 2 * 31_536_000, 0).packed), "ClusterTimeFailsRateLimiter"),
        ({"clusterTime": "now"}, "TypeMismatch"),
    ]:
        assert code_of(r._gossip_in, doc) == code
        assert r.clock.now() == before
    r._gossip_in(signed(ahead))
    assert r.clock.cluster_time == ahead


def test_a_router_signs_the_cluster_time_it_returns():
    r = router()
    r.clock.advance(vc.LogicalTime(7, 1).packed)
    assert r.signed_cluster_time()["signature"]["keyId"] == 0  # no key yet: MongoDB's dummy
    r.catalog.keys = keyring(10, 20)
    doc = r.signed_cluster_time()
    parsed = vc.parse_signed_cluster_time(doc)
    assert parsed.key_id == 1 and vc.verify(r.catalog.keys[1].key, parsed.time, parsed.proof)
    assert r.operation_time() == vc.LogicalTime(7, 1).packed  # no shard reached: the router's time


async def test_a_router_refuses_a_read_after_a_time_it_has_not_seen():
    r = router()
    r.clock.advance(100)
    with pytest.raises(CommandError) as e:
        await r._read_after({"afterClusterTime": vc.to_ejson(101)})
    assert e.value.code == "InvalidOptions" and r.causal_refreshes == 0
    r.catalog.config_ts = 100
    await r._read_after({"afterClusterTime": vc.to_ejson(100)})  # the catalog is as new: no refresh
    assert r.causal_refreshes == 0


@pytest.mark.parametrize("rc", [{"level": "snapshot"}, {"level": "linearizable"}])
async def test_a_router_refuses_a_count_at_a_snapshot_or_an_unknown_level(rc):
    r = router()
    with pytest.raises(CommandError) as e:
        await r._read_after(rc)
    assert e.value.code == "InvalidOptions"


async def test_a_router_picks_a_snapshot_reads_time_and_refuses_one_nobody_handed_out():
    r = router()
    r.clock.advance(vc.LogicalTime(100, 3).packed)
    r.catalog.config_ts = vc.LogicalTime(100, 3).packed
    picked = await r._snapshot_at({"level": "snapshot"})
    assert picked == {"level": "snapshot", "atClusterTime": vc.to_ejson(vc.LogicalTime(100, 3).packed)}
    named = {"level": "snapshot", "atClusterTime": vc.to_ejson(vc.LogicalTime(90, 1).packed)}
    assert await r._snapshot_at(named) == named
    with pytest.raises(CommandError) as e:
        await r._snapshot_at({"level": "snapshot", "atClusterTime": vc.to_ejson(vc.LogicalTime(100, 4).packed)})
    assert e.value.code == "InvalidOptions" and "must not be greater than the current clusterTime" in e.value.message
    assert r.causal_refreshes == 0


async def test_a_router_whose_catalog_cannot_catch_up_answers_max_time_ms_expired_not_stale_data():
    r = router()
    r.clock.advance(100)

    async def never(timeout: float) -> None:
        raise TimeoutError

    r.follower.refresh = never
    with pytest.raises(CommandError) as e:
        await r._read_after({"afterClusterTime": vc.to_ejson(100)})  # newer than its catalog's stamp (0)
    assert e.value.code == "MaxTimeMSExpired" and r.causal_refreshes == 1


# ------------------------------------------------------------------ the client


def test_the_client_sends_its_cluster_time_and_a_causal_sessions_read_waits_for_its_writes():
    cl = AsyncCluster("unused:9092")
    session = cl.start_session()
    find = s.Find(ns="d.x")
    assert cl._gossip(find, session) == find  # nothing seen yet: nothing to send
    keys = keyring(10**6)
    reply_ct = vc.signed_cluster_time(vc.LogicalTime(50, 2).packed, keys)
    cl._gossip_out(Reply(ok=True, operationTime=vc.LogicalTime(50, 1).packed, clusterTime=reply_ct), session)
    cl._gossip_out(Reply(ok=True, clusterTime=vc.signed_cluster_time(vc.LogicalTime(40, 1).packed, keys)), None)
    cl._gossip_out(Reply(ok=True, clusterTime=vc.signed_cluster_time(vc.LogicalTime(60, 1).packed, {})), None)
    assert cl.cluster_time == reply_ct  # the largest signed one seen is kept (an unsigned one proves nothing)
    sent = cl._gossip(find, session)
    assert sent.clusterTime == reply_ct
    assert sent.readConcern == {"afterClusterTime": vc.to_ejson(vc.LogicalTime(50, 1).packed)}
    assert cl._gossip(find, ClientSession(causal_consistency=False)).readConcern is None
    insert = cl._gossip(s.Insert(ns="d.x", docs=[]), session)
    assert insert.clusterTime == reply_ct  # writes gossip too, without a read concern


def test_a_shard_reads_after_a_time_by_advancing_to_it_but_never_with_an_older_catalog():
    from services.shard.decide import ShardDecider

    cat = Catalog(track_changes=False)
    cat.apply(c.ShardAdded(shard="a"), 0)
    cat.apply(c.DatabaseCreated(db="d", primary="a", uuid="u"), 1)
    clock = vc.VectorClock()
    docs = ShardDocuments()
    docs.load(types.SimpleNamespace(get=lambda k: None, scan=lambda p: iter(()), db=None))  # type: ignore[arg-type]
    shard = ShardDecider("a", cat, docs, clock=clock)
    after = {"afterClusterTime": vc.to_ejson(vc.LogicalTime(500, 3).packed)}
    behind = s.Routing(configTime=cat.config_time + 1)
    with pytest.raises(CommandError) as e:
        shard.decide(s.Count(ns="d.x", routing=behind, readConcern=after))
    assert e.value.code == "MaxTimeMSExpired"
    assert clock.cluster_time == vc.LogicalTime(500, 3).packed  # its no-op write: its time covers the read's
    with pytest.raises(CommandError) as e:
        shard.decide(s.Find(ns="d.x", routing=behind, readConcern={"afterClusterTime": "soon"}))
    assert e.value.code == "TypeMismatch"


def test_a_router_refuses_a_snapshot_read_from_before_a_namespace_changed():
    r = router()
    r.catalog.changed_at["d.c"] = vc.LogicalTime(100, 0).packed
    with pytest.raises(CommandError) as e:
        r._targets_at("d.c", vc.LogicalTime(99, 5).packed)
    assert e.value.code == "SnapshotUnavailable" and "pending collection catalog changes" in e.value.message
