"""The range deleter's policy (services/range_deleter/deleter.py): pure, no Kafka."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.settings import ClusterSettings
from services.range_deleter import deleter

NOW = 1_000_000.0
DELAY = ClusterSettings(orphanCleanupDelaySecs=900)


def task(id="m1", shard="s0", pending=False, readyAt=NOW - 1000, deleted=0, waiting=None, **kw) -> dict:
    return {
        "id": id,
        "shard": shard,
        "ns": "db.c",
        "epoch": "e",
        "min": {"k": 0},
        "max": {"k": 10},
        "pending": pending,
        "readyAt": None if pending else readyAt,
        "configTime": 5,
        "deleted": deleted,
        "why": "donated to s1",
        "left": 10,
        "waiting": waiting,
        **kw,
    }


def test_nothing_to_do():
    p = deleter.plan([], DELAY, NOW)
    assert p.next is None and p.waiting == {}


def test_a_pending_task_is_never_chosen():
    p = deleter.plan([task(pending=True, waiting="its migration is not decided yet")], DELAY, NOW)
    assert p.next is None
    assert p.waiting[("s0", "m1")] == "pending: its migration is not decided"
    assert deleter.state(task(pending=True)) == "pending"


def test_a_task_waits_for_the_cleanup_delay_with_the_seconds_left():
    t = task(readyAt=NOW - 88.5)
    p = deleter.plan([t], DELAY, NOW)
    assert p.next is None
    assert p.waiting[("s0", "m1")] == "orphanCleanupDelaySecs: 812 s left"
    assert deleter.plan([t], ClusterSettings(orphanCleanupDelaySecs=88), NOW).next == t  # a lowered delay applies


def test_the_shards_own_reason_and_the_services_are_given():
    t = task(waiting="1 query started before the migration committed still reads the range")
    assert deleter.plan([t], DELAY, NOW).waiting[("s0", "m1")] == t["waiting"]
    both = deleter.plan([task(readyAt=NOW, waiting="open query")], DELAY, NOW, {("s0", "m1"): "batch failed"})
    assert both.waiting[("s0", "m1")] == "orphanCleanupDelaySecs: 900 s left; open query; batch failed"
    assert both.next is None


def test_a_task_in_progress_resumes_first_then_the_oldest():
    old, started, new = (
        task("old", readyAt=NOW - 5000),
        task("started", "s1", readyAt=NOW - 1000, deleted=128),
        task("new", "s2", readyAt=NOW - 2000),
    )
    p = deleter.plan([old, started, new], DELAY, NOW)
    assert p.next is started and deleter.state(started) == "deleting"
    assert p.waiting == {
        ("s0", "old"): "queued behind task started on s1",
        ("s1", "started"): None,
        ("s2", "new"): "queued behind task started on s1",
    }
    assert deleter.plan([old, new], DELAY, NOW).next is old and deleter.state(old) == "ready"


def test_the_same_migration_names_a_task_on_two_shards():
    donor, recipient = task("m", "s0"), task("m", "s1", pending=True)
    p = deleter.plan([donor, recipient], DELAY, NOW)
    assert p.next is donor and p.waiting[("s1", "m")].startswith("pending")


tasks = st.lists(
    st.builds(
        task,
        id=st.sampled_from(["a", "b", "c", "d"]),
        shard=st.sampled_from(["s0", "s1", "s2"]),
        pending=st.booleans(),
        readyAt=st.floats(NOW - 2000, NOW + 100),
        deleted=st.sampled_from([0, 0, 1, 500]),
        waiting=st.sampled_from([None, None, "2 queries started before the migration committed still read the range"]),
    ),
    unique_by=lambda t: (t["shard"], t["id"]),
    max_size=8,
)


@given(tasks, st.integers(0, 3000))
def test_the_chosen_task_may_be_deleted_and_is_first_in_line(ts, delay):
    settings = ClusterSettings(orphanCleanupDelaySecs=delay)
    p = deleter.plan(ts, settings, NOW)
    eligible = [t for t in ts if deleter.waiting_for(t, settings, NOW) is None]
    assert set(p.waiting) == {deleter.key(t) for t in ts}
    assert [k for k, why in p.waiting.items() if why is None] == ([deleter.key(p.next)] if p.next else [])
    if not eligible:
        assert p.next is None
        return
    n = p.next
    assert not n["pending"] and n["waiting"] is None and n["readyAt"] + delay <= NOW
    assert all(not t["deleted"] for t in eligible) or n["deleted"], "a task in progress goes first"
    assert all(n["readyAt"] <= t["readyAt"] for t in eligible if bool(t["deleted"]) == bool(n["deleted"]))
