"""Seeded schedules of the whole cluster under faults, each checked against the invariants
(tests/sim/schedule.py); and the simulator finds the past bugs put back (libs.faults.KNOWN_BUGS).
`make sim SEED=n` reruns one schedule. SIM_SCHEDULES sets how many run here (CI: 2,000) and
SIM_JOBS in how many worker processes (default: 2, or 1 on a single core)."""

from __future__ import annotations

import os

import pytest

from libs import faults
from tests.sim import pool, schedule

SCHEDULES = int(os.environ.get("SIM_SCHEDULES", "2000"))
JOBS = int(os.environ.get("SIM_JOBS", str(min(2, os.cpu_count() or 1))))
# How many seeds each past bug may take to be found (see docs/reference/simulator.md for the
# seeds that find each one as the plans stand).
BUG_BUDGET = 100
# (reads past a prepared transaction show only when a read lands in the prepare window: rarer)
BUDGETS = {"txn-reads-past-prepare": 300}


def test_a_schedule_without_faults_keeps_every_invariant(sim_dir):
    out = schedule.run(0, sim_dir, faults_on=False)
    assert not out.plan.crashes and not out.plan.fault_points
    assert any("settled" in e for e in out.events), out.events


@pytest.mark.timeout(900)  # ~6 minutes for 2,000 on 2 free cores; a busy machine takes longer
def test_seeded_schedules_under_faults_keep_every_invariant():
    crashed = settled = 0
    for result in pool.run_seeds(range(SCHEDULES), jobs=JOBS):
        if result.failure is not None:
            pytest.fail(f"seed {result.seed}: {result.failure}", pytrace=False)
        crashed += result.crashed
        settled += result.settled
    assert settled == SCHEDULES, f"only {settled} of {SCHEDULES} schedules ran to their invariants"
    assert crashed >= SCHEDULES // 2, f"only {crashed} of {SCHEDULES} schedules crashed anything"


@pytest.mark.parametrize("bug", sorted(faults.KNOWN_BUGS))
def test_the_simulator_finds_a_past_bug_put_back(bug):
    budget = BUDGETS.get(bug, BUG_BUDGET)
    for result in pool.run_seeds(range(budget), jobs=JOBS, bugs={bug}):
        if result.failure is not None:
            assert "invariant" in result.failure and f"make sim SEED={result.seed}" in result.failure
            return
    pytest.fail(f"{bug} ({faults.KNOWN_BUGS[bug]}) not found in {budget} schedules")
