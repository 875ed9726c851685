"""Logical sessions against a real broker (docs/decisions/0015): the router's session cache
flushes to the sessions store, endSessions / killSessions end sessions (killSessions kills
their cursors), malformed lsids change nothing, idle sessions expire from the store."""

from __future__ import annotations

import asyncio
import json

import pytest

from libs.client import AsyncCluster, ClientSession, ShardlogError
from schemas import config as c
from schemas import shard as s
from schemas.sessions import sessions as session_codec
from tests.conftest import InProcessCluster, async_wait_until, cli, read_records

pytestmark = pytest.mark.kafka

REFRESH_MS = 200


@pytest.fixture
def one_shard(settings):
    cluster = InProcessCluster(settings, shards=("s0",))
    cluster.command(c.SetSetting(key="logicalSessionRefreshMillis", value=REFRESH_MS))
    yield cluster
    cluster.stop()


def store_state(settings) -> dict[str, dict | None]:
    """The sessions store as its topic says: the last value per session id (None: a tombstone)."""
    out: dict[str, dict | None] = {}
    for rec in read_records(settings.bootstrap, settings.topics.sessions):
        out[rec.key.decode()] = None if rec.value is None else session_codec.decode(rec.value).model_dump()
    return out


def run(cluster, fn):
    async def go():
        async with AsyncCluster(cluster.settings.bootstrap, cluster.settings.cluster, timeout=60) as cl:
            return await fn(cl)

    return asyncio.run(go())


def test_used_sessions_reach_the_store_and_end_sessions_removes_them(one_shard):
    a, b = ClientSession(), ClientSession()
    router = one_shard.router.sessions

    async def use(cl):
        for x in (a, b):
            await cl.call(s.Count(ns="app.c", lsid=x.lsid))
        await async_wait_until(
            lambda: {a.lsid["id"], b.lsid["id"]} <= set(router.store.view.sessions),
            10,
            "both sessions flushed to the store and read back",
        )

    run(one_shard, use)
    state = store_state(one_shard.settings)
    assert state[a.lsid["id"]]["lsid"] == a.lsid and state[b.lsid["id"]]["lastUse"] > 0

    async def end(cl):
        await cl.end_sessions([a])

    run(one_shard, end)
    # The reply comes after the tombstone is acknowledged: the store no longer has a.
    state = store_state(one_shard.settings)
    assert state[a.lsid["id"]] is None and state[b.lsid["id"]] is not None
    assert a.lsid["id"] not in router.cache.sessions and b.lsid["id"] in router.cache.sessions
    # The operator's view: `shardlog sessions` lists the live ones.
    out = cli(one_shard.settings, "sessions", "--json")
    assert out.returncode == 0, out.stderr
    listed = {r["lsid"]["id"]: r for r in json.loads(out.stdout)["sessions"]}
    assert b.lsid["id"] in listed and a.lsid["id"] not in listed and not listed[b.lsid["id"]]["expired"]


MALFORMED = [
    ("not-a-list", "TypeMismatch"),
    ([{"id": "not-a-uuid"}], "BadValue"),
    (["just-a-string"], "TypeMismatch"),
    ([{}], "IDLFailedToParse"),
]


def test_malformed_lsids_are_refused_and_change_nothing(one_shard):
    live = ClientSession()
    router = one_shard.router.sessions
    t = one_shard.settings.topics

    async def go(cl):
        await cl.call(s.Count(ns="app.c", lsid=live.lsid))
        await async_wait_until(lambda: live.lsid["id"] in router.store.view.sessions, 10, "the session in the store")
        before = len(await asyncio.to_thread(read_records, one_shard.settings.bootstrap, t.sessions))
        for lsids, code in MALFORMED:
            for kind in (s.EndSessions, s.KillSessions):
                # A valid lsid next to a malformed one: all or nothing, the valid one stays too.
                with pytest.raises(ShardlogError) as e:
                    await cl.call(kind(lsids=[live.lsid, *lsids] if isinstance(lsids, list) else lsids))
                assert e.value.code == code, (kind, lsids)
        # An operation with a malformed lsid is refused the same way, before it is routed.
        with pytest.raises(ShardlogError) as e:
            await cl.call(s.Count(ns="app.c", lsid={"id": 42}))
        assert e.value.code == "TypeMismatch"
        assert await cl["app"]["c"].count_documents({}) == 0  # the router keeps serving
        return before

    before = run(one_shard, go)
    records = read_records(one_shard.settings.bootstrap, t.sessions)
    assert all(r.value is not None for r in records[before:]), "a refused endSessions wrote a tombstone"
    assert live.lsid["id"] in router.cache.sessions and store_state(one_shard.settings)[live.lsid["id"]]


def test_kill_sessions_kills_the_cursors_opened_under_them(one_shard):
    killed, other = ClientSession(), ClientSession()

    async def go(cl):
        await cl["app"]["c"].insert_many([{"_id": i} for i in range(10)])
        opened = {}
        for x in (killed, other):
            first = await cl.call(s.Find(ns="app.c", batchSize=2, lsid=x.lsid))
            assert first["cursorId"] and len(first["docs"]) == 2
            opened[x.lsid["id"]] = first
        result = await cl.kill_sessions([killed])
        assert result == {"ended": 1, "cursorsKilled": 1}
        gone = opened[killed.lsid["id"]]
        with pytest.raises(ShardlogError) as e:
            await cl.call(s.GetMore(cursorId=gone["cursorId"], lsid=killed.lsid), topic=gone["cursorTopic"])
        assert e.value.code == "CursorNotFound"
        kept = opened[other.lsid["id"]]
        more = await cl.call(s.GetMore(cursorId=kept["cursorId"], batchSize=100), topic=kept["cursorTopic"])
        assert [d["_id"] for d in more["docs"]] == list(range(2, 10))

    run(one_shard, go)
    assert store_state(one_shard.settings)[killed.lsid["id"]] is None


def test_idle_sessions_expire_from_the_store(one_shard):
    one_shard.command(c.SetSetting(key="logicalSessionTimeoutMinutes", value=0.03))  # 1.8 s
    idle = [ClientSession() for _ in range(3)]
    router = one_shard.router.sessions

    async def go(cl):
        for x in idle:
            await cl.call(s.Count(ns="app.c", lsid=x.lsid))
        ids = {x.lsid["id"] for x in idle}
        await async_wait_until(lambda: ids <= set(router.store.view.sessions), 10, "the sessions in the store")
        # Idle for the timeout: the cache drops them and a refresh tombstones them in the store.
        await async_wait_until(
            lambda: not ids & set(router.store.view.sessions) and not ids & set(router.cache.sessions),
            15,
            "the idle sessions to leave the store and the cache",
        )

    run(one_shard, go)
    state = store_state(one_shard.settings)
    assert all(state[x.lsid["id"]] is None for x in idle)
