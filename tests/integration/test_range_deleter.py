"""The range deleter against a real broker: after a committed migration the donor's
orphans go — only after orphanCleanupDelaySecs, in batches of rangeDeleterBatchSize,
resuming after a crash — and `shardlog range-deletions` says why a task waits."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from schemas import config as c
from schemas import shard as s
from services.range_deleter.server import RangeDeleter
from tests.conftest import async_wait_until, cli, read_records, wait_until
from tests.integration.test_migration import MAXK, client_run, move, shard_state, stored_ids

pytestmark = pytest.mark.kafka

N, SPLIT, BATCH = 300, 150, 40  # the donor keeps [0, 150) and orphans [150, 300): 4 batches of 40
NS = "rd.c"


def migrate(cl) -> str:
    """N documents on s0, [SPLIT, max) moved to s1; returns the donor's task id."""
    cl.command(c.CreateDatabase(db="rd", primary="s0"))
    cl.command(c.ShardCollection(ns=NS, key={"k": 1}))
    cl.command(c.SplitChunk(ns=NS, at=[{"k": SPLIT}]))
    client_run(cl, lambda client: client["rd"]["c"].insert_many([{"_id": i, "k": i} for i in range(N)]))
    assert move(cl, c.MoveRange(ns=NS, min={"k": SPLIT}, max={"k": MAXK}, to="s1")) == "committed"
    (task,) = shard_state(cl, "s0")["rangeDeletions"]
    assert not task["pending"] and task["left"] == N - SPLIT
    return task["id"]


@contextlib.contextmanager
def running_deleter(cl):
    """A RangeDeleter as a task on the cluster's loop, past its first round."""
    rd = RangeDeleter(cl.settings)

    async def start():
        task = asyncio.create_task(rd.run())
        await async_wait_until(lambda: rd.status.rounds or task.done(), 60, "the range deleter's first round")
        if task.done():
            task.result()  # it failed: say why
        return task

    task = cl.call(start())
    try:
        yield rd
    finally:

        async def stop():
            if task.done() and not task.cancelled():
                task.result()  # a crash during the test must not go unnoticed
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        cl.call(stop())


def task_events(cl, sid: str, tid: str) -> list:
    """The shard's changelog records of one task, as (timestamp ms, event)."""
    out = []
    for r in read_records(cl.settings.bootstrap, cl.settings.topics.shard_changelog(sid)):
        if r.value is None:
            continue  # a tombstone of a transactions-table record
        e = s.changelog.decode(r.value)
        if isinstance(e, (s.RangeDeletionRecorded, s.RangeDeletionRemoved)) and e.id == tid:
            out.append((r.timestamp, e))
    return out


def progress(events) -> list[int]:
    """The task's recorded `deleted` counts, batch by batch."""
    return [e.deleted for _, e in events if isinstance(e, s.RangeDeletionRecorded) and e.deleted]


def orphans_gone(cl) -> bool:
    return not cl.shards["s0"].documents.range_tasks and stored_ids(cl, "s0", NS) == set(range(SPLIT))


def assert_cluster_intact(cl) -> None:
    assert stored_ids(cl, "s0", NS) == set(range(SPLIT)), "the donor keeps exactly what it owns"
    assert stored_ids(cl, "s1", NS) == set(range(SPLIT, N)), "the recipient's documents are untouched"

    async def read(client):
        coll = client["rd"]["c"]
        return await coll.count_documents({}), sorted(d["_id"] for d in await coll.find({}).to_list())

    assert client_run(cl, read) == (N, list(range(N)))


def test_orphans_wait_for_the_delay_then_go_in_batches(data_cluster, settings, monkeypatch):
    cl = data_cluster
    with running_deleter(cl) as rd:
        tid = migrate(cl)
        donor = ("s0", tid)

        # Held for orphanCleanupDelaySecs (900 s by default): seen, explained, not touched.
        def listed_ready():
            return next((t for t in rd.status.tasks if (t["shard"], t["id"]) == donor and not t["pending"]), None)

        seen = cl.call(async_wait_until(listed_ready, 30, "the deleter to list the donor's task as decided"))
        assert seen["waitingFor"].startswith("orphanCleanupDelaySecs: ") and seen["waitingFor"].endswith(" s left")
        rounds = rd.status.rounds
        cl.call(async_wait_until(lambda: rd.status.rounds >= rounds + 3, 30, "three more rounds of the deleter"))
        assert cl.shards["s0"].decider.served[("DeleteRangeBatch", None)] == 0
        assert stored_ids(cl, "s0", NS) == set(range(N)), "no orphan may go before orphanCleanupDelaySecs"

        r = cli(settings, "range-deletions", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["ok"] and out["unanswered"] == {}
        (row,) = out["tasks"]
        assert row["shard"] == "s0" and row["ns"] == NS and row["state"] == "ready"
        assert row["left"] == N - SPLIT and row["deleted"] == 0 and row["why"] == "donated to s1"
        assert row["waiting"].startswith("orphanCleanupDelaySecs: ")
        monkeypatch.setenv("COLUMNS", "160")  # rich folds long cells on the default 80 columns
        human = cli(settings, "range-deletions", "--shard", "s0")
        assert human.returncode == 0 and "orphanCleanupDelaySecs: " in human.stdout, human.stdout
        assert json.loads(cli(settings, "range-deletions", "--shard", "s1", "--json").stdout)["tasks"] == []

        # Settings apply live: smaller batches, then a short delay, and the deletion runs.
        cl.command(c.SetSetting(key="rangeDeleterBatchSize", value=BATCH))
        cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=1))
        cl.call(async_wait_until(lambda: orphans_gone(cl), 60, "the donor's orphans to be deleted"))
        cl.call(
            async_wait_until(
                lambda: not rd.status.tasks and rd.status.current is None, 30, "the deleter to see the task gone"
            )
        )

    assert_cluster_intact(cl)
    assert shard_state(cl, "s0")["rangeDeletions"] == [] and shard_state(cl, "s1")["rangeDeletions"] == []
    # Batch by batch: progress recorded at 40, 80, 120, then the last 30 and the task removed.
    events = task_events(cl, "s0", tid)
    assert progress(events) == [BATCH, 2 * BATCH, 3 * BATCH]
    assert isinstance(events[-1][1], s.RangeDeletionRemoved)
    assert cl.shards["s0"].decider.served[("DeleteRangeBatch", None)] == 4
    ready = next(e for _, e in events if isinstance(e, s.RangeDeletionRecorded) and not e.pending)
    first_batch = next(ts for ts, e in events if getattr(e, "deleted", 0) == BATCH)
    assert first_batch / 1000 >= ready.readyAt + 1, "deleted before orphanCleanupDelaySecs"


def test_a_deleter_killed_between_batches_resumes_where_it_stopped(data_cluster, settings, spawn):
    cl = data_cluster
    cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=1))
    cl.command(c.SetSetting(key="rangeDeleterBatchSize", value=BATCH))
    tid = migrate(cl)

    killed = spawn(
        settings,
        "services.range_deleter",
        ready_name="range-deleter",
        env={"SHARDLOG_FAULTS": "range_deleter.mid_deletion=kill"},
    )
    wait_until(lambda: killed.proc.poll() is not None, 60, "the range deleter to be killed after its first batch")
    assert killed.proc.returncode == -9, killed.tail()
    (task,) = shard_state(cl, "s0")["rangeDeletions"]
    assert task["deleted"] == BATCH and task["left"] == N - SPLIT - BATCH, "a batch and its progress commit together"

    with running_deleter(cl):
        cl.call(async_wait_until(lambda: orphans_gone(cl), 60, "the restarted deleter to finish the task"))
    assert_cluster_intact(cl)
    assert progress(task_events(cl, "s0", tid)) == [BATCH, 2 * BATCH, 3 * BATCH], "resumed, not restarted"


def test_range_deletions_of_an_unknown_shard_is_one_line_error(settings):
    r = cli(settings, "range-deletions", "--shard", "nope")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == "error: ShardNotFound: shard 'nope' does not exist"
    r = cli(settings, "range-deletions", "--shard", "nope", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout) == {"ok": False, "code": "ShardNotFound", "error": "shard 'nope' does not exist"}
