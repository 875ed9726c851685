"""The simulator's loop (tests/sim/loop.py): simulated time, one schedule per seed, deadlocks
reported, not hung."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.sim import loop as sim
from tests.sim import schedule


def test_simulated_time_jumps_to_the_next_timer_and_the_clocks_follow_it():
    async def main(loop: sim.SimLoop):
        wall, mono = time.time(), time.monotonic()
        await asyncio.sleep(3600)  # an hour of simulated time
        return time.time() - wall, time.monotonic() - mono, loop.time()

    began = time.perf_counter()
    wall, mono, now = sim.run(1, main)
    assert wall == mono == now == 3600
    assert time.perf_counter() - began < 5, "an hour of simulated time must not take real time"


def test_a_task_waiting_for_what_never_comes_is_a_deadlock_not_a_hang():
    async def main(loop: sim.SimLoop):
        await asyncio.Event().wait()

    with pytest.raises(sim.Deadlock):
        sim.run(1, main)


def test_the_seed_orders_ready_tasks_and_repeats_its_order():
    async def main(loop: sim.SimLoop):
        order: list[int] = []

        async def one(i: int):
            order.append(i)

        await asyncio.gather(*(one(i) for i in range(8)))
        return order

    assert sim.run(5, main) == sim.run(5, main)
    assert len({tuple(sim.run(seed, main)) for seed in range(6)}) > 1, "different seeds, different orders"


def test_a_schedule_with_faults_repeats_exactly_from_its_seed(sim_dir):
    first = schedule.run(3, sim_dir / "a")
    again = schedule.run(3, sim_dir / "b")
    assert first.plan.crashes or first.plan.fault_points, "seed 3 injects faults"
    assert (first.events, first.stats) == (again.events, again.stats)


def test_the_services_clocks_are_the_loops():
    """A clock a service binds as a default argument at import (`wall=time.time`) kept the real
    one under the simulator: sessions recorded 48 days old were reaped at once, and real-time
    deadlines outlived the schedule. Each must read the simulated clock."""
    from domain.clock import VectorClock
    from services.shard.decide import ClientActivity, Cursor

    async def main(loop: sim.SimLoop):
        await asyncio.sleep(42)
        return VectorClock().wall(), ClientActivity().clock(), Cursor(iter([])).created

    wall, activity, created = sim.run(1, main)
    assert wall == sim.EPOCH + 42
    assert activity == created == 42


def test_the_simulated_disk_runs_the_schedule_rocksdb_runs(sim_dir):
    """tests/sim/disk.py stands in for RocksDB: the same seed gives the same schedule on both."""
    on_disk = schedule.run(8, sim_dir / "memory")
    on_rocksdb = schedule.run(8, sim_dir / "rocksdb", rocksdb=True)
    assert (on_disk.events, on_disk.stats) == (on_rocksdb.events, on_rocksdb.stats)
