"""Small pure pieces of the runtime: topic names, fault-point matching, settings validation."""

from __future__ import annotations

import importlib

import pytest

from libs.topics import Topics


def test_topic_names_carry_the_cluster_prefix():
    t = Topics("prod-eu")
    assert t.config_events == "prod-eu.config.events" and t.config_commands == "prod-eu.config.commands"
    assert t.shard_changelog("s0") == "prod-eu.shard.s0.changelog"
    assert {s.name for s in t.core()} >= {t.config_events, t.config_commands, t.dead_letters}
    events = next(s for s in t.core() if s.name == t.config_events)
    assert events.partitions == 1 and events.config["retention.ms"] == "-1"  # kept forever: it is the catalog
    assert next(s for s in t.for_shard("s0") if "changelog" in s.name).config["cleanup.policy"] == "compact"


@pytest.mark.parametrize("bad", ["", "a b", "a.b", "x" * 65, "é"])
def test_invalid_cluster_names_are_refused(bad):
    with pytest.raises(ValueError, match="invalid cluster name"):
        Topics(bad)


def test_fault_points_fire_only_where_aimed(monkeypatch):
    import libs.faults as faults

    monkeypatch.setenv("SHARDLOG_FAULTS", "a.step=raise,b.step@needle=raise")
    importlib.reload(faults)
    try:
        with pytest.raises(faults.FaultInjected):
            faults.fault_point("a.step")
        faults.fault_point("b.step", tag="hay")  # no needle: nothing happens
        with pytest.raises(faults.FaultInjected):
            faults.fault_point("b.step", tag="hay needle hay")
        faults.fault_point("c.step")
    finally:
        monkeypatch.delenv("SHARDLOG_FAULTS")
        importlib.reload(faults)
    assert faults._PLAN == {}
