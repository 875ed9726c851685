"""Moving ranges against a real broker: the migration protocol end to end, with the
cluster serving traffic, and orphans left for the range deleter."""

from __future__ import annotations

import asyncio

import pytest

from libs.client import AsyncCluster
from libs.requests import Requester
from schemas import config as c
from schemas import shard as s
from tests.conftest import async_wait_until

pytestmark = pytest.mark.kafka

MINK, MAXK = {"$minKey": 1}, {"$maxKey": 1}


def client_run(cluster, fn):
    async def go():
        async with AsyncCluster(cluster.settings.bootstrap, cluster.settings.cluster, timeout=60) as cl:
            return await fn(cl)

    return asyncio.run(go())


def move(cluster, cmd: c.MoveRange, timeout: float = 90) -> str:
    """MoveRange, then wait for the config server's outcome; returns it."""
    reply = cluster.command(cmd)
    assert "id" in reply.result, f"{cmd.type} started no migration: {reply.result}"
    mid = reply.result["id"]

    async def outcome():
        async with Requester(cluster.settings.bootstrap, cluster.settings.topics.cli_replies) as r:
            while True:
                rep = await r.request(cluster.settings.topics.config_commands, c.GetMigration(id=mid), timeout=30)
                if rep.result["state"] != "active":
                    await cluster.router.follower.wait_for(rep.configTime or 0, 30)
                    if rep.result["state"] == "aborted":  # say why: the donor's progress keeps the reason
                        donor = next(
                            (
                                sh.decider.progress[mid]
                                for sh in cluster.shards.values()
                                if "reason" in sh.decider.progress.get(mid, {})
                            ),
                            {},
                        )
                        return f"aborted: {donor.get('reason', 'no reason recorded')}"
                    return rep.result["state"]
                await asyncio.sleep(0.1)

    return cluster.call(asyncio.wait_for(outcome(), timeout))


def shard_state(cluster, sid: str) -> dict:
    async def go():
        async with Requester(cluster.settings.bootstrap, cluster.settings.topics.cli_replies) as r:
            rep = await r.request(cluster.settings.topics.shard_requests(sid), s.ListMigrations(), timeout=30)
            assert rep.ok, rep
            return rep.result

    return cluster.call(go())


def stored_ids(cluster, sid: str, ns: str) -> set:
    """Every _id physically stored on a shard (orphans included)."""
    docs = cluster.shards[sid].documents
    return {d["_id"] for _, d in docs.scan(ns)}


def test_move_a_range_while_writing(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="m", primary="s0"))
    cl.command(c.ShardCollection(ns="m.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="m.c", at=[{"k": 500}]))

    async def load(client):
        await client["m"]["c"].insert_many([{"_id": i, "k": i, "v": "x" * 100} for i in range(1000)])

    client_run(cl, load)

    # Write to the moving range while it moves: every acknowledged write must be on the recipient.
    async def writer(client, stop: asyncio.Event, acked: dict):
        coll = client["m"]["c"]
        n = 0
        while not stop.is_set():
            k = 500 + n % 500
            await coll.update_one({"k": k}, {"$set": {"w": n}})
            acked[k] = n
            n += 1

    async def scenario(client):
        stop, acked = asyncio.Event(), {}
        task = asyncio.create_task(writer(client, stop, acked))
        await asyncio.sleep(0.3)
        outcome = await asyncio.to_thread(move, cl, c.MoveRange(ns="m.c", min={"k": 500}, max={"k": MAXK}, to="s1"))
        stop.set()
        await task
        docs = {d["k"]: d for d in await client["m"]["c"].find({"k": {"$gte": 500}}).to_list()}
        return outcome, acked, docs, await client["m"]["c"].count_documents({})

    outcome, acked, docs, total = client_run(cl, scenario)
    assert outcome == "committed"
    assert total == 1000  # nothing lost or doubled, though the donor still holds orphans
    assert acked, "the writer made no progress during the migration"
    for k, n in acked.items():
        assert docs[k].get("w", -1) >= n, f"acknowledged write {n} to k={k} is missing"
    coll = cl.router.follower.catalog.collections["m.c"]
    assert [(ch.shard, ch.version.pair) for ch in coll.chunks] == [("s0", (2, 1)), ("s1", (2, 0))]
    assert set(range(500, 1000)) <= stored_ids(cl, "s1", "m.c")
    # the donor keeps its copy as a ready range-deletion task; the recipient's is gone
    (task,) = shard_state(cl, "s0")["rangeDeletions"]
    assert not task["pending"] and task["left"] == 500
    assert shard_state(cl, "s1")["rangeDeletions"] == []
    assert shard_state(cl, "s0")["migrations"] == [] and shard_state(cl, "s1")["migrations"] == []


def test_one_migration_per_shard_a_retry_joins_and_disallowing_migrations_aborts(data_cluster):
    """Move a range to s1 and straight back: s0 still has the range's orphans to delete (the
    cleanup delay is 15 minutes), so the migration back waits on s0.  Meanwhile a second
    migration touching s0 or s1 is refused, a retry of the same one joins it, and
    set-allow-migrations false aborts it and returns once it is gone."""
    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.CreateDatabase(db="m", primary="s0"))
    cl.command(c.ShardCollection(ns="m.d", key={"k": 1}))
    cl.command(c.SplitChunk(ns="m.d", at=[{"k": 0}]))
    client_run(cl, lambda client: client["m"]["d"].insert_many([{"_id": i, "k": i} for i in range(-20, 20)]))
    assert move(cl, c.MoveRange(ns="m.d", min={"k": 0}, to="s1")) == "committed"
    back = cl.command(c.MoveRange(ns="m.d", min={"k": 0}, to="s0")).result
    assert cl.command(c.MoveRange(ns="m.d", min={"k": 0}, to="s0")).result == {**back, "joined": True}

    async def refused():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(
                cl.settings.topics.config_commands, c.MoveRange(ns="m.d", min={"k": MINK}, to="s2"), timeout=30
            )

    rep = cl.call(refused())
    assert not rep.ok and rep.code == "ConflictingOperationInProgress" and "one migration" in rep.error
    cl.call(
        async_wait_until(
            lambda: (
                "RangeDeletionPending" in str(cl.shards["s1"].decider.progress.get(back["id"], {}).get("waiting", ""))
                or "orphans" in str(cl.shards["s1"].decider.progress.get(back["id"], {}).get("waiting", ""))
            ),
            30,
            "the migration back to wait for s0's range deletion",
        )
    )
    done = cli(cl.settings, "set-allow-migrations", "m.d", "false", "--json")
    assert done.returncode == 0, done.stderr
    assert back["id"] in done.stdout
    state = cl.command(c.GetMigration(id=back["id"])).result["state"]
    assert state.startswith("aborted"), state
    assert cl.router.follower.catalog.collections["m.d"].chunks[1].shard == "s1"  # did not move
    count = client_run(cl, lambda client: client["m"]["d"].count_documents({}))
    assert count == 40


def test_ycsb_a_during_repeated_migrations_back_and_forth(data_cluster):
    """YCSB-A (50% reads, 50% updates, scrambled zipfian keys) through the router while the
    range moves s0 -> s1 -> s0 ...: no client-visible error; every acknowledged $inc is
    applied exactly once; nothing lost or duplicated."""
    from services.range_deleter.server import RangeDeleter
    from services.workload.ycsb import ScrambledZipfianGenerator

    cl = data_cluster
    records, moves = 400, 4
    cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=0))
    cl.command(c.CreateDatabase(db="y", primary="s0"))
    cl.command(c.ShardCollection(ns="y.t", key={"k": 1}))
    cl.command(c.SplitChunk(ns="y.t", at=[{"k": records // 2}]))
    deleter = asyncio.run_coroutine_threadsafe(RangeDeleter(cl.settings).run(), cl.loop)

    async def scenario(client):
        coll = client["y"]["t"]
        await coll.insert_many([{"_id": i, "k": i, "n": 0, "f": "x" * 100} for i in range(records)])
        acked = {i: 0 for i in range(records)}
        stop, errors, ops = asyncio.Event(), [], [0]

        async def worker(seed: int):
            keys = ScrambledZipfianGenerator(0, records - 1, rng=seed)
            while not stop.is_set():
                k = keys.next_value()
                try:
                    if ops[0] % 2:
                        doc = await coll.find_one({"k": k})
                        assert doc is not None and doc["k"] == k, f"read of k={k} returned {doc}"
                    else:
                        r = await coll.update_one({"k": k}, {"$inc": {"n": 1}})
                        assert r["matched"] == 1, r
                        acked[k] += 1
                except Exception as e:  # a client-visible error fails the test
                    errors.append(repr(e))
                ops[0] += 1

        workers = [asyncio.create_task(worker(i)) for i in range(6)]
        outcomes, aborted = [], []
        for i in range(moves):
            to = "s1" if i % 2 == 0 else "s0"
            for _attempt in range(3):  # an abort (e.g. a busy broker) is legitimate; the balancer would retry too
                outcome = await asyncio.to_thread(move, cl, c.MoveRange(ns="y.t", min={"k": records // 2}, to=to), 180)
                if outcome == "committed":
                    break
                aborted.append(outcome)
            outcomes.append(outcome)
            if outcome != "committed":
                break  # the assertion below says why
        stop.set()
        await asyncio.gather(*workers)
        docs = await coll.find({}, sort={"k": 1}).to_list()
        return outcomes, aborted, acked, errors, docs, ops[0]

    try:
        outcomes, aborted, acked, errors, docs, n_ops = client_run(cl, scenario)
    finally:
        deleter.cancel()
    assert errors == [], f"client-visible errors during migrations: {errors[:5]}"
    assert outcomes == ["committed"] * moves, (outcomes, aborted)
    assert len(aborted) <= moves // 2, f"most moves aborted: {aborted}"
    assert n_ops > 0
    assert [d["k"] for d in docs] == list(range(records)), "a document was lost or duplicated"
    for d in docs:
        assert d["n"] == acked[d["k"]], f"k={d['k']}: {acked[d['k']]} increments acknowledged, {d['n']} applied"


def test_a_query_started_before_the_commit_sees_the_moved_documents_and_holds_their_deletion(data_cluster):
    cl = data_cluster
    cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=0))
    cl.command(c.CreateDatabase(db="q", primary="s0"))
    cl.command(c.ShardCollection(ns="q.c", key={"k": 1}))

    async def load(client):
        await client["q"]["c"].insert_many([{"_id": i, "k": i} for i in range(300)])

    client_run(cl, load)

    async def ask(sid, req):
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            rep = await r.request(cl.settings.topics.shard_requests(sid), req, timeout=30)
            assert rep.ok, rep
            return rep.result

    coll = cl.router.follower.catalog.collections["q.c"]
    routing = s.Routing(
        configTime=cl.router.follower.config_time, epoch=coll.epoch, version=coll.shard_version("s0").pair
    )
    first = cl.call(ask("s0", s.Find(ns="q.c", filter={}, sort=None, batchSize=50, routing=routing)))
    assert len(first["docs"]) == 50 and first["cursorId"]
    assert move(cl, c.MoveRange(ns="q.c", min={"k": MINK}, to="s1")) == "committed"
    # After the commit, a new query on the donor is stale; the old cursor still reads everything.
    (task,) = shard_state(cl, "s0")["rangeDeletions"]
    assert "quer" in (task["waiting"] or ""), task
    seen, cursor = [d["_id"] for d in first["docs"]], first["cursorId"]
    while cursor:
        more = cl.call(ask("s0", s.GetMore(cursorId=cursor, batchSize=50)))
        seen += [d["_id"] for d in more["docs"]]
        cursor = more["cursorId"]
    assert sorted(seen) == list(range(300))
    (task,) = shard_state(cl, "s0")["rangeDeletions"]
    assert task["waiting"] is None  # the query is over: the range may go
    assert client_run(cl, lambda client: client["q"]["c"].count_documents({})) == 300


def test_cli_move_chunk_too_big_and_jumbo(data_cluster):
    import json

    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.CreateDatabase(db="j", primary="s0"))
    cl.command(c.ShardCollection(ns="j.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="j.c", at=[{"k": 100}]))
    cl.command(c.SetSetting(ns="j.c", key="maxChunkSizeBytes", value=1024 * 1024))
    pad = "p" * 100_000
    # [MinKey, 100): 30 documents of ~100 KB over distinct keys; [100, MaxKey): one key value, ~3 MB
    client_run(
        cl,
        lambda client: client["j"]["c"].insert_many(
            [{"_id": i, "k": i, "pad": pad} for i in range(30)]
            + [{"_id": 1000 + i, "k": 500, "pad": pad} for i in range(30)]
        ),
    )
    # An explicit range over twice the max chunk size: refused unless forced.
    too_big = cli(
        cl.settings,
        "move-range",
        "j.c",
        "--min",
        '{"k": {"$minKey": 1}}',
        "--max",
        '{"k": 100}',
        "--to",
        "s1",
        "--json",
    )
    assert too_big.returncode == 1 and json.loads(too_big.stdout)["code"] == "ChunkTooBig", too_big.stdout
    # Only --min: the donor cuts about one max chunk size (1 MB, ~10 documents) from it.
    cut = cli(cl.settings, "move-range", "j.c", "--min", '{"k": {"$minKey": 1}}', "--to", "s1", "--json")
    assert cut.returncode == 0, cut.stdout + cut.stderr
    summary = json.loads(cut.stdout)
    assert summary["outcome"] == "committed" and 8 <= summary["progress"]["cloned"] <= 12, summary
    moved = cl.router.follower.catalog.collections["j.c"].chunks[0]
    assert moved.shard == "s1" and 8 <= moved.max["k"] <= 12
    # One shard-key value over twice the max chunk size cannot be split: jumbo, and the user is told why.
    jumbo = cli(cl.settings, "move-chunk", "j.c", "--find", '{"k": 500}', "--to", "s2")
    assert jumbo.returncode == 1 and "ChunkTooBig" in jumbo.stderr and "--force-jumbo" in jumbo.stderr, jumbo.stderr
    only_min = cli(cl.settings, "move-range", "j.c", "--min", '{"k": 100}', "--to", "s2")
    assert only_min.returncode == 1 and "jumbo" in only_min.stderr, only_min.stderr
    assert cl.command(c.GetMigration()).result["active"] == []
    cl.call(cl.router.follower.wait_for(cl.shards["s0"].follower.config_time, 30))
    big = cl.router.follower.catalog.collections["j.c"].chunks[-1]
    assert big.jumbo and big.shard == "s0"
    refused = cli(cl.settings, "move-chunk", "j.c", "--find", '{"k": 500}', "--to", "s2", "--json")
    assert (
        json.loads(refused.stdout)["code"] == "ChunkTooBig" and "--force-jumbo" in json.loads(refused.stdout)["error"]
    )
    forced = cli(cl.settings, "move-chunk", "j.c", "--find", '{"k": 500}', "--to", "s2", "--force-jumbo", "--json")
    assert forced.returncode == 0 and json.loads(forced.stdout)["outcome"] == "committed", forced.stdout
    assert client_run(cl, lambda client: client["j"]["c"].count_documents({})) == 60


def test_move_primary_moves_the_unsharded_collections_and_writes_wait_not_fail(data_cluster):
    import json

    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.CreateDatabase(db="p", primary="s0"))

    async def scenario(client):
        notes = client["p"]["notes"]
        await notes.insert_many([{"_id": i, "t": f"note {i}"} for i in range(200)])
        await client["p"]["todo"].insert_one({"_id": 1, "t": "buy milk"})
        stop, acked, errors = asyncio.Event(), [], []

        async def writer():
            n = 1000
            while not stop.is_set():
                try:
                    await notes.insert_one({"_id": n, "t": "during the move"})
                    acked.append(n)
                except Exception as e:
                    errors.append(repr(e))
                n += 1

        task = asyncio.create_task(writer())
        moved = await asyncio.to_thread(cli, cl.settings, "move-primary", "p", "--to", "s2", "--json")
        stop.set()
        await task
        return moved, acked, errors, await notes.find({}).to_list(), await client["p"]["todo"].count_documents({})

    moved, acked, errors, docs, todo = client_run(cl, scenario)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert json.loads(moved.stdout)["primary"] == "s2"
    assert errors == [] and acked, errors[:3]
    ids = sorted(d["_id"] for d in docs)
    assert ids == sorted(list(range(200)) + acked), "a document was lost or doubled by the primary move"
    assert todo == 1
    cl.call(cl.router.follower.wait_for(cl.shards["s0"].follower.config_time, 30))
    assert cl.router.follower.catalog.databases["p"].primary == "s2"
    assert stored_ids(cl, "s0", "p.notes") == set()  # the old primary's copies are gone
    assert stored_ids(cl, "s2", "p.notes") == set(ids)


def test_move_range_wait_for_delete_returns_once_the_donor_deleted_its_copy(data_cluster):
    import json

    from services.range_deleter.server import RangeDeleter
    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=2))  # the CLI must wait out the delay too
    cl.command(c.CreateDatabase(db="w", primary="s0"))
    cl.command(c.ShardCollection(ns="w.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="w.c", at=[{"k": 100}]))
    client_run(cl, lambda client: client["w"]["c"].insert_many([{"_id": i, "k": i} for i in range(300)]))
    deleter = asyncio.run_coroutine_threadsafe(RangeDeleter(cl.settings).run(), cl.loop)
    try:
        done = cli(
            cl.settings,
            "move-range",
            "w.c",
            "--min",
            '{"k": 100}',
            "--to",
            "s1",
            "--wait-for-delete",
            "--json",
            timeout=120,
        )
        left_on_donor = {i for i in stored_ids(cl, "s0", "w.c") if i >= 100}  # read before anything else runs
    finally:
        deleter.cancel()
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "committed"
    assert left_on_donor == set(), f"move-range --wait-for-delete returned with {len(left_on_donor)} orphans left"
    assert shard_state(cl, "s0")["rangeDeletions"] == []
    assert stored_ids(cl, "s1", "w.c") == set(range(100, 300))
