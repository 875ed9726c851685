"""Projection against a real broker: kill -9 mid-stream, restart, and compare
with a fresh full replay; refuse a store whose log was recreated; rebuild a
missing store."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from domain.catalog import Catalog
from libs import kafka
from libs import projection as projection_mod
from libs.projection import CheckpointMismatch, Projection
from libs.store import Store
from schemas import Codec
from schemas import config as c

pytestmark = pytest.mark.kafka


def catalog_events(n_rounds: int, start: int = 0):
    """A long, valid stream whose end state depends on every event: shards, a
    collection, then ever more splits (every third round merging the last two
    chunks back), with growing versions, zone tags and setting changes."""
    epoch = "6b0000000000000000000001"
    lo, top = {"x": {"$minKey": 1}}, {"x": {"$maxKey": 1}}
    if start == 0:
        yield c.ShardAdded(shard="s0")
        yield c.ShardAdded(shard="s1")
        yield c.DatabaseCreated(db="db", primary="s0", uuid="u-1")
        yield c.CollectionSharded(
            ns="db.c",
            key={"x": 1},
            unique=False,
            epoch=epoch,
            uuid="u-2",
            chunks=[c.ChunkDoc(min=lo, max=top, shard="s0", version=(1, 0))],
        )
    mins = [lo]  # lower bounds of the chunks, in order; the last chunk ends at MaxKey
    minor = 0
    for i in range(start, start + n_rounds):
        at = {"x": i}
        yield c.ChunkSplit(
            ns="db.c",
            epoch=epoch,
            min=mins[-1],
            max=top,
            chunks=[
                c.ChunkDoc(min=mins[-1], max=at, shard="s0", version=(1, minor + 1)),
                c.ChunkDoc(min=at, max=top, shard="s0", version=(1, minor + 2)),
            ],
        )
        mins.append(at)
        minor += 2
        if i % 3 == 2:
            mins.pop()
            yield c.ChunksMerged(
                ns="db.c", epoch=epoch, chunk=c.ChunkDoc(min=mins[-1], max=top, shard="s0", version=(1, minor + 1))
            )
            minor += 1
        if i % 50 == 0:
            yield c.SettingChanged(key="rangeDeleterBatchSize", value=100 + i)
            yield c.ShardZoneAdded(shard="s1", zone=f"z{i}")


async def produce(bootstrap: str, topic: str, events, txn_id: str, per_txn: int = 500) -> int:
    """Append events in transactions (as the config server does), so the log has commit markers."""
    p = kafka.producer(bootstrap, transactional_id=txn_id)
    await p.start()
    count = 0
    try:
        batch = []
        for e in events:
            batch.append(Codec.encode(e))
            if len(batch) == per_txn:
                count += await _txn(p, topic, batch)
                batch = []
        if batch:
            count += await _txn(p, topic, batch)
    finally:
        await p.stop()
    return count


async def _txn(p, topic, values) -> int:
    async with p.transaction():
        futs = [await p.send(topic, v) for v in values]
        await asyncio.gather(*futs)
    return len(values)


def durable_entities(path) -> dict:
    store = Store(path)
    try:
        return {k: v for k, v in store.scan(b"") if not k.startswith(b"\x00")}
    finally:
        store.close()


async def fresh_replay(bootstrap: str, topic: str, path) -> tuple[dict, int]:
    store = Store(path)
    proj = Projection(bootstrap, topic, c.events, Catalog(), store, name="fresh")
    await proj.start()
    at = await proj.catch_up()
    await proj.stop()
    store.close()
    return durable_entities(path), at


def test_kill9_mid_stream_then_restart_equals_a_fresh_replay(settings, spawn, tmp_path):
    topic = settings.topics.config_events
    rounds = 6000  # ~12k events
    # A shard service follows config.events into its own store: the projection under test.
    follower = spawn(settings, "services.shard", "--shard-id", "s0", ready_name="shard-s0")
    follower.wait_ready()
    events = list(catalog_events(rounds))
    half = len(events) // 2
    asyncio.run(produce(settings.bootstrap, topic, events[:half], f"{settings.cluster}.writer"))
    # Kill it while it is still folding the stream: more events keep arriving after the kill.
    follower.kill9()
    asyncio.run(produce(settings.bootstrap, topic, events[half:], f"{settings.cluster}.writer"))
    restarted = spawn(settings, "services.shard", "--shard-id", "s0", ready_name="shard-s0")
    info = restarted.wait_ready()
    restarted.stop()
    store_path = settings.data_dir / "shard-s0" / "catalog"
    fresh, end = asyncio.run(fresh_replay(settings.bootstrap, topic, tmp_path / "fresh"))
    assert info["configTime"] == end, "the restarted projection must reach the end of the log"
    assert durable_entities(store_path) == fresh
    assert sum(k.startswith(b"chunk/") for k in fresh) > rounds // 2  # the state is the whole history's


def test_checkpoint_ahead_of_a_recreated_log_is_refused(settings, tmp_path):
    topic = settings.topics.config_events
    path = tmp_path / "store"

    async def go():
        await produce(settings.bootstrap, topic, catalog_events(20), f"{settings.cluster}.w1")
        store = Store(path)
        proj = Projection(settings.bootstrap, topic, c.events, Catalog(), store)
        await proj.start()
        await proj.catch_up()
        await proj.stop()
        store.close()
        # The topic is deleted and recreated, then a shorter history is written.
        await kafka.delete_topics(settings.bootstrap, [topic])
        # Deletion is asynchronous: until the broker forgets the topic, ensure_topics finds it and
        # creates nothing, and the next records would land after the old ones. Retry until it is ours.
        for _ in range(200):
            try:
                if topic in await kafka.ensure_topics(settings.bootstrap, settings.topics.core()):
                    break
            except Exception:
                pass  # still being deleted: creating it is refused for a moment
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"{topic} was not deleted and created again in 200 attempts")
        await produce(settings.bootstrap, topic, catalog_events(3), f"{settings.cluster}.w2")
        store = Store(path)
        proj = Projection(settings.bootstrap, topic, c.events, Catalog(), store)
        try:
            with pytest.raises(CheckpointMismatch, match="the log it was built from is gone") as refused:
                await proj.start()
            # The error names the commands that resolve it: an explicit reset, or rebuilding this store.
            assert "`make reset`" in str(refused.value) and f"rm -rf {path}" in str(refused.value)
        finally:
            await proj.stop()
            store.close()
        # Same again with a longer history: the fingerprint of the last applied record catches it.
        await produce(settings.bootstrap, topic, catalog_events(40, start=500), f"{settings.cluster}.w3")
        store = Store(path)
        proj = Projection(settings.bootstrap, topic, c.events, Catalog(), store)
        try:
            with pytest.raises(CheckpointMismatch, match="not the one the store applied"):
                await proj.start()
        finally:
            await proj.stop()
            store.close()

    asyncio.run(go())


def test_a_missing_store_is_rebuilt_from_the_log(settings, tmp_path):
    topic = settings.topics.config_events

    async def go():
        await produce(settings.bootstrap, topic, catalog_events(200), f"{settings.cluster}.w")
        first, end = await fresh_replay(settings.bootstrap, topic, tmp_path / "a")
        shutil.rmtree(tmp_path / "a")
        again, end2 = await fresh_replay(settings.bootstrap, topic, tmp_path / "a")
        assert (again, end2) == (first, end)
        # And a restart from the checkpoint applies nothing twice.
        third, end3 = await fresh_replay(settings.bootstrap, topic, tmp_path / "a")
        assert (third, end3) == (first, end)

    asyncio.run(go())


def test_rewind_resumes_at_the_state_without_reloading_and_reloads_if_the_store_disagrees(settings, tmp_path):
    """What a take-over relies on: rewind() keeps the folded state (no O(state) reload) and
    resumes exactly at its position, so nothing is applied twice; a store whose checkpoint is not
    the state's position makes it fall back to a reload."""
    topic = settings.topics.config_events
    events = list(catalog_events(300))
    half = len(events) // 2

    async def go():
        await produce(settings.bootstrap, topic, events[:half], f"{settings.cluster}.w1")
        store = Store(tmp_path / "store")
        catalog = Catalog()
        loads = 0
        load = catalog.load

        def counted(s):
            nonlocal loads
            loads += 1
            load(s)

        catalog.load = counted
        proj = Projection(settings.bootstrap, topic, c.events, catalog, store)
        await proj.start()
        await proj.catch_up()
        assert loads == 1
        at = proj.position
        proj.rewind()
        assert (loads, proj.position) == (1, at), "a rewind with an agreeing store must not reload"
        await produce(settings.bootstrap, topic, events[half:], f"{settings.cluster}.w1")
        end = await proj.catch_up()
        await proj.stop()
        store.close()
        return end, durable_entities(tmp_path / "store")

    end, entities = asyncio.run(go())
    fresh, fresh_end = asyncio.run(fresh_replay(settings.bootstrap, topic, tmp_path / "fresh"))
    assert (end, entities) == (fresh_end, fresh), "rewind then catch-up must equal one fresh replay"

    async def disagreeing():
        store = Store(tmp_path / "store")
        proj = Projection(settings.bootstrap, topic, c.events, Catalog(), store)
        await proj.start()
        await proj.catch_up()
        proj.position -= 5  # as if the state were behind its store: rewind must not trust it
        proj.rewind()
        reloaded = proj.position
        await proj.stop()
        store.close()
        return reloaded

    assert asyncio.run(disagreeing()) == end, "a disagreeing store must be reloaded, resuming at its checkpoint"


def test_catch_up_writes_its_store_per_commit_bytes_and_by_its_end(settings, tmp_path, monkeypatch):
    """A replay writes its store once per CATCH_UP_COMMIT_BYTES of records applied (each written
    key's last value), not once per fetch, and everything it applied by the time it returns; a
    catch-up cancelled between two fetches commits what it applied, one whose fold fails half-way
    commits nothing of that fetch.  Each store then resumes to the same state as a fresh replay."""
    topic = settings.topics.config_events
    events = list(catalog_events(12_000))  # ~16k events: several fetches of at most 5,000 records
    total = sum(len(Codec.encode(e)) for e in events)
    asyncio.run(produce(settings.bootstrap, topic, events, f"{settings.cluster}.w"))
    fresh, end = asyncio.run(fresh_replay(settings.bootstrap, topic, tmp_path / "fresh"))

    def instrumented(proj: Projection, store: Store) -> tuple[list[int], list[int]]:
        """(bytes of each fold, folds before each commit) as the catch-up goes."""
        folds: list[int] = []
        commits: list[int] = []
        fold, commit = proj._fold, store.commit

        def counted_fold(records):
            fold(records)
            folds.append(sum(len(r.value or b"") for r in records))

        def counted_commit(*args):
            commit(*args)
            commits.append(len(folds))

        proj._fold, store.commit = counted_fold, counted_commit
        return folds, commits

    async def replay(path, limit: int, catalog: Catalog | None = None) -> tuple[list[int], list[int], int]:
        monkeypatch.setattr(projection_mod, "CATCH_UP_COMMIT_BYTES", limit)
        store = Store(path)
        proj = Projection(settings.bootstrap, topic, c.events, catalog or Catalog(), store)
        folds, commits = instrumented(proj, store)
        try:
            await proj.start()
            await proj.catch_up()
            assert store.checkpoint(topic).next_offset == proj.position == end
            return folds, commits, proj.position
        finally:
            await proj.stop()
            store.close()

    # One write at the end, however many fetches, when the limit is not reached.
    folds, commits, _ = asyncio.run(replay(tmp_path / "whole", total * 2))
    assert len(folds) >= 3 and commits == [len(folds)], (folds, commits)
    assert durable_entities(tmp_path / "whole") == fresh
    # A third of the log: each write but the last covers at least the limit and at most the
    # limit plus the fetch that reached it (what a state holds pending is bounded).
    limit = total // 3
    folds, commits, _ = asyncio.run(replay(tmp_path / "thirds", limit))
    since = 0
    for i, at in enumerate(commits):
        written = sum(folds[since:at])
        assert written <= limit + folds[at - 1], (folds, commits)
        assert i == len(commits) - 1 or written >= limit, (folds, commits)
        since = at
    assert commits[-1] == len(folds) and 2 <= len(commits) < len(folds), (folds, commits)
    assert durable_entities(tmp_path / "thirds") == fresh

    class Stopping(Catalog):
        """Cancels the catch-up (or fails) once AFTER events are applied (class attributes:
        `load` re-runs `__init__`)."""

        AFTER, FAIL, applied = 7_000, False, 0

        def apply(self, e, offset: int) -> None:
            super().apply(e, offset)
            Stopping.applied += 1
            if Stopping.applied == self.AFTER:
                if self.FAIL:
                    raise RuntimeError("a fold that fails half-way")
                asyncio.current_task().cancel()  # lands at the catch-up's next fetch

    async def stopped(path, fail: bool) -> tuple[int, int | None, list[int]]:
        monkeypatch.setattr(projection_mod, "CATCH_UP_COMMIT_BYTES", total * 2)
        store = Store(path)
        Stopping.FAIL, Stopping.applied = fail, 0
        proj = Projection(settings.bootstrap, topic, c.events, Stopping(), store)
        folds, _ = instrumented(proj, store)
        try:
            await proj.start()
            with pytest.raises(RuntimeError if fail else asyncio.CancelledError):
                await proj.catch_up()

            ckpt = store.checkpoint(topic)
            return proj.position, ckpt.next_offset if ckpt else None, folds
        finally:
            await proj.stop()
            store.close()

    position, stored, folds = asyncio.run(stopped(tmp_path / "cancelled", fail=False))
    assert 7_000 <= position < end and stored == position, "what was applied before the cancel is committed"
    position, stored, folds = asyncio.run(stopped(tmp_path / "failed", fail=True))
    assert stored is None and len(folds) >= 1, "nothing of a half-folded fetch (nor, under the limit, before it)"
    for path in ("cancelled", "failed"):
        resumed, at = asyncio.run(fresh_replay(settings.bootstrap, topic, tmp_path / path))
        assert (resumed, at) == (fresh, end), f"the {path} store resumes to the fresh replay's state"
