"""Seeded schedules of the whole cluster under faults, each checked against the invariants
(tests/sim/schedule.py). `make sim SEED=n` reruns one; SIM_SCHEDULES sets how many run here."""

from __future__ import annotations

import os

import pytest

from tests.sim import schedule

SCHEDULES = int(os.environ.get("SIM_SCHEDULES", "40"))
FIRST_SEED = int(os.environ.get("SIM_FIRST_SEED", "0"))


@pytest.fixture(autouse=True)
def quiet_services(monkeypatch):
    monkeypatch.setenv("SHARDLOG_ROUTER_PORT", "off")  # no MongoDB edge: clients use the bus
    monkeypatch.setenv("SHARDLOG_METRICS", "off")


def test_a_schedule_without_faults_keeps_every_invariant(tmp_path):
    out = schedule.run(0, tmp_path, faults_on=False)
    assert out.stats["simulatedS"] > 0 and any("settled" in e for e in out.events), out


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SCHEDULES))
def test_a_seeded_schedule_under_faults_keeps_every_invariant(tmp_path, seed):
    schedule.run(seed, tmp_path)
