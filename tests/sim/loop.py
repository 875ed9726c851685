"""A seeded, simulated-time event loop: the simulator's only scheduler.

- **Simulated time.** The loop's clock (and, while a schedule runs, `time.time`, `time.monotonic`
  and their `_ns` forms) is a number the loop moves on: when no callback is ready it jumps to the
  next timer instead of sleeping, so a 30 s session timeout costs nothing. Nothing waits on real
  I/O: the memory bus is the only transport.
- **Seeded order.** Before each pass the ready callbacks are shuffled with the schedule's seeded
  generator: tasks that asyncio would run in arrival order run in an order the seed picks, so
  one seed is one interleaving, and the next seed another.
- **Deadlock is an error.** Nothing ready and no timer set means every task waits for something
  that cannot happen: the run stops with `Deadlock` rather than hanging.

Same seed, same process start (PYTHONHASHSEED fixed: `make sim` sets it): the same schedule.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

EPOCH = 1_800_000_000.0  # where simulated wall-clock time starts (2027-01-15): fixed, so runs repeat


class Deadlock(RuntimeError):
    """Every task waits, no callback is ready and no timer is set."""


class _NoIO(selectors.DefaultSelector):
    """The loop's selector: registrations kept (the loop's self-pipe), but `select` never blocks;
    it moves simulated time on by the loop's timeout instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: SimLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        assert loop is not None
        if timeout is None:
            raise Deadlock("no task can run and no timer is set: every task waits for something that cannot happen")
        loop.now += max(timeout, 0.0)
        return super().select(0)


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self, seed: int) -> None:
        selector = _NoIO()
        super().__init__(selector)
        selector.loop = self
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.passes = 0

    def time(self) -> float:
        return self.now

    def _run_once(self) -> None:
        ready = self._ready  # type: ignore[attr-defined]
        if len(ready) > 1:
            shuffled = list(ready)
            self.rng.shuffle(shuffled)
            ready.clear()
            ready.extend(shuffled)
        self.passes += 1
        super()._run_once()  # type: ignore[misc]


@contextmanager
def simulated_process(loop: SimLoop) -> Iterator[None]:
    """While a schedule runs: the process's clocks are the loop's, and its random ids come from
    the seed (a uuid4 picks a router's inbox name, an object id, a migration id)."""
    ids = random.Random(loop.seed ^ 0x5EED)
    saved = (time.time, time.time_ns, time.monotonic, time.monotonic_ns, uuid.uuid4)
    time.time = lambda: EPOCH + loop.now
    time.time_ns = lambda: int((EPOCH + loop.now) * 1e9)
    time.monotonic = lambda: loop.now
    time.monotonic_ns = lambda: int(loop.now * 1e9)
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    try:
        yield
    finally:
        time.time, time.time_ns, time.monotonic, time.monotonic_ns, uuid.uuid4 = saved


def run(seed: int, main: Callable[[SimLoop], Awaitable[T]]) -> T:
    """Run `main(loop)` to completion on a fresh simulated loop seeded with `seed`."""
    loop = SimLoop(seed)
    try:
        with simulated_process(loop):
            return loop.run_until_complete(_main(loop, main))
    finally:
        _cancel_all(loop)
        loop.close()


async def _main(loop: SimLoop, main: Callable[[SimLoop], Awaitable[T]]) -> T:
    return await main(loop)


def _cancel_all(loop: SimLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        try:
            with simulated_process(loop):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except Deadlock:
            pass


def stats(loop: SimLoop) -> dict[str, Any]:
    return {"seed": loop.seed, "simulatedS": round(loop.now, 3), "passes": loop.passes}
