"""The balancer's own log (services/balancer/state.py, schemas/balancer.py): typed actions
read the JSON earlier versions wrote as plain dicts, and the state folds and persists them."""

from __future__ import annotations

import json

import pytest

from domain.catalog import Catalog
from libs.errors import CommandError
from libs.store import Checkpoint, Store
from schemas import Codec
from schemas import balancer as b
from schemas import config as ev
from services.balancer.state import BalancerState, event_key

B = {"x": 1}
# Every action shape the balancer wrote before actions were typed, as it wrote them.
OLD_ACTIONS = [
    {"id": "s1", "kind": "split", "ns": "d.c", "chunk": {"min": B, "max": {"x": 9}}, "at": [{"x": 5}]},
    {"id": "a1", "kind": "autoSplit", "ns": "d.c", "min": B, "max": B, "shard": "s0", "limit": 10, "edge": None},
    {"id": "m1", "kind": "migration", "ns": "d.c", "from": "s0", "to": "s1", "min": B, "max": None, "reason": "drain"},
    {"id": "p1", "kind": "movePrimary", "ns": "db", "from": "s0", "to": "s1"},
    {"id": "r1", "kind": "removeShard", "ns": "", "shard": "s0"},
    {
        "id": "m2",
        "by": "defragmentation",
        "ns": "d.c",
        "min": B,
        "max": B,
        "kind": "migration",
        "from": "s0",
        "to": "s1",
        "reason": "defragmentation",
    },
    {"id": "g1", "by": "defragmentation", "ns": "d.c", "min": B, "max": B, "kind": "merge", "shard": "s0"},
    {
        "id": "z1",
        "by": "defragmentation",
        "ns": "d.c",
        "min": B,
        "max": B,
        "kind": "dataSize",
        "shard": "s0",
        "after": 7,
    },
    {"id": "g2", "kind": "merge", "by": "autoMerge", "ns": "d.c", "shard": "s0", "min": B, "max": B},
]


@pytest.mark.parametrize("old", OLD_ACTIONS, ids=lambda a: f"{a['kind']}/{a.get('by', 'round')}")
def test_an_action_written_by_earlier_versions_replays_and_is_written_the_same(old):
    raw = json.dumps({"type": "ActionIssued", "v": 1, "round": 3, "action": old}).encode()
    e = b.events.decode(raw)
    assert e.action.kind == old["kind"] and e.action.secondary == ("by" in old)
    assert json.loads(Codec.encode(e))["action"] == old and e.action.to_json() == old
    assert event_key(e) == b"a/" + old["id"].encode()


def test_the_state_folds_issued_and_finished_actions_and_reloads_them(tmp_path):
    st = BalancerState()
    for i, old in enumerate(OLD_ACTIONS):
        st.apply(b.events.decode(json.dumps({"type": "ActionIssued", "v": 1, "round": i, "action": old}).encode()), i)
    st.apply(b.ActionFinished(id="m1", ok=False, code="ChunkTooBig", error="too big"), 99)
    assert st.recent_failures == [{**OLD_ACTIONS[2], "round": 2, "error": "too big", "code": "ChunkTooBig"}]
    assert st.busy_shards() == {"s0", "s1"}
    store = Store(tmp_path / "db")
    store.commit(st.drain_changes().items(), Checkpoint("t", 0, 100, 0))
    again = BalancerState()
    again.load(store)
    store.close()
    assert again.in_flight == st.in_flight and "m1" not in again.in_flight
    issued = [{**a, "round": i} for i, a in enumerate(OLD_ACTIONS) if a["id"] != "m1"]
    assert sorted(again.document()["inFlight"], key=lambda a: a["id"]) == sorted(issued, key=lambda a: a["id"])
    assert sorted(a.id for a in again.in_flight.values() if a.secondary) == ["g1", "g2", "m2", "z1"]


def test_commands_are_decided_by_type():
    st = BalancerState()
    d = st.decide(b.IssueActions(round=1, actions=[b.RemoveShardAction(id="r1", ns="", shard="s0")]))
    assert [e.type for e in d.events] == ["ActionIssued"] and d.result == {"issued": 1}
    for e in d.events:
        st.apply(e, 0)
    assert st.decide(b.IssueActions(round=1, actions=[st.in_flight["r1"]])).result == {"issued": 0}
    assert st.decide(b.FinishAction(id="nope", ok=True)).result == {"id": "nope", "finished": False}
    with pytest.raises(CommandError):
        st.decide(ev.GetMigration(id="x"))


def test_a_migration_outcome_is_structured_fields():
    cat = Catalog(track_changes=False)
    cat.apply(ev.MigrationAborted(id="m1", ns="d.c", reason="holds 3 bytes", code="ChunkTooBig"), 0)
    cat.apply(ev.MigrationAborted(id="m2", ns="d.c", reason="StaleConfig: written before codes were fields"), 1)
    one, two = cat.outcome("m1"), cat.outcome("m2")
    assert (one.committed, one.code, one.reason) == (False, "ChunkTooBig", "holds 3 bytes")
    assert cat.outcomes["m1"] == "aborted: ChunkTooBig: holds 3 bytes"  # the one-line form, as before
    assert (two.code, two.reason) == (None, "StaleConfig: written before codes were fields")
    assert cat.outcomes["m2"] == "aborted: StaleConfig: written before codes were fields"
    assert cat.outcome("m3") is None
