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
        # Out of the store at the reply (a later operation on it may bring it back, as in MongoDB).
        assert (await asyncio.to_thread(store_state, one_shard.settings))[killed.lsid["id"]] is None
        gone = opened[killed.lsid["id"]]
        with pytest.raises(ShardlogError) as e:
            await cl.call(s.GetMore(cursorId=gone["cursorId"], lsid=killed.lsid), topic=gone["cursorTopic"])
        assert e.value.code == "CursorNotFound"
        kept = opened[other.lsid["id"]]
        more = await cl.call(s.GetMore(cursorId=kept["cursorId"], batchSize=100), topic=kept["cursorTopic"])
        assert [d["_id"] for d in more["docs"]] == list(range(2, 10))

    run(one_shard, go)


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


def test_expired_sessions_records_leave_the_shard_and_are_compacted_from_its_changelog(one_shard):
    """N sessions x M retryable writes; with a short timeout the idle sessions expire: their
    transactions-table records leave the shard's state (memory and RocksDB) and, once the
    changelog compacts, the log itself; a session kept live by reads keeps its records."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    settings, shard = one_shard.settings, one_shard.shards["s0"]
    changelog = settings.topics.shard_changelog("s0")

    async def aggressive_compaction():
        # AlterConfigs replaces a topic's whole configuration: keep what it has (compaction!).
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, changelog)])
            entries = described.to_object()["resources"][0]["config_entries"]
            config = {
                e["config_names"]: e["config_value"] for e in entries if e["config_source"] == 1
            }  # the topic's own
            assert config["cleanup.policy"] == "compact"
            config |= {"segment.ms": "500", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "500"}
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, changelog, config)])
        finally:
            await admin.close()

    asyncio.run(aggressive_compaction())
    n, m = 4, 3
    expiring = [ClientSession() for _ in range(n)]
    live = ClientSession()

    async def write(cl, x: ClientSession, i: int) -> None:
        for txn in range(1, m + 1):
            u = s.Update(ns="app.c", filter={"_id": i}, update={"$inc": {"n": 1}}, upsert=True)
            result = await cl.call(u.model_copy(update={"lsid": x.lsid, "txnNumber": txn}))
            assert result["matched"] + ("upsertedId" in result) == 1

    def txn_keys(ids: set[str]) -> list:
        """Every changelog record (values and tombstones) of these sessions' records, from the start."""
        return [
            r
            for r in read_records(settings.bootstrap, changelog)
            if r.key and r.key.startswith(b"txn/") and r.key[4:].split(b"/")[0].decode() in ids
        ]

    async def go(cl):
        for i, x in enumerate([*expiring, live]):
            await write(cl, x, i)
        ids = {x.lsid["id"] for x in expiring}
        assert ids | {live.lsid["id"]} <= set(shard.documents.sessions)
        assert await asyncio.to_thread(txn_keys, ids), "the retryable writes left no record in the changelog"
        await asyncio.to_thread(one_shard.command, c.SetSetting(key="logicalSessionTimeoutMinutes", value=0.03))

        async def keep_live_and_tick():  # reads keep `live` in the store; plain writes roll segments
            while True:
                await cl.call(s.Count(ns="app.c", lsid=live.lsid))
                await cl["app"]["ticks"].update_one({"_id": 0}, {"$inc": {"n": 1}}, upsert=True)
                await asyncio.sleep(0.3)

        ticker = asyncio.create_task(keep_live_and_tick())
        try:

            def stored() -> set[str]:
                return {k.split(b"/")[1].decode() for k, _ in shard.store.scan(b"x/")}

            # Gone from memory at the decision, from RocksDB once its transaction committed.
            await async_wait_until(
                lambda: not ids & (set(shard.documents.sessions) | stored()),
                30,
                "the shard to forget the expired sessions (memory and RocksDB)",
            )
            assert live.lsid["id"] in shard.documents.sessions and live.lsid["id"] in stored()
            left: list = []

            def compacted() -> bool:
                left[:] = txn_keys(ids)
                return not left

            deadline = asyncio.get_running_loop().time() + 120
            while not await asyncio.to_thread(compacted):
                if asyncio.get_running_loop().time() > deadline:
                    pytest.fail(
                        f"after 120s the changelog {changelog} still holds {len(left)} records or tombstones of the "
                        f"expired sessions (broker log cleaner: segment.ms, log.cleaner.backoff.ms); first: "
                        f"{left[0].key!r} value={'tombstone' if left[0].value is None else 'record'}"
                    )
                await asyncio.sleep(2)
        finally:
            ticker.cancel()
        # The live session's records are still in the log and still answer a retry.
        assert await asyncio.to_thread(txn_keys, {live.lsid["id"]})
        u = s.Update(ns="app.c", filter={"_id": n}, update={"$inc": {"n": 1}}, lsid=live.lsid, txnNumber=m)
        await cl.call(u)
        assert (await cl["app"]["c"].find_one({"_id": n}))["n"] == m  # the retry applied nothing

    run(one_shard, go)


def test_close_ends_the_pooled_implicit_sessions(one_shard):
    router = one_shard.router.sessions
    used: list[str] = []

    async def go(cl):
        await cl["app"]["c"].insert_one({"_id": 1})  # a retryable write on an implicit session
        used.extend(x.lsid["id"] for x in cl._pool)
        assert used, "the write did not run on a pooled implicit session"
        await async_wait_until(lambda: set(used) <= set(router.store.view.sessions), 10, "the session in the store")

    run(one_shard, go)  # leaving `async with` closes the client
    state = store_state(one_shard.settings)
    assert all(state[sid] is None for sid in used), "close() left its implicit sessions in the store"
