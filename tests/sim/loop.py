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
import heapq
import math
import random
import selectors
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from libs.bus.memory import PROCESS

T = TypeVar("T")

EPOCH = 1_800_000_000.0  # where simulated wall-clock time starts (2027-01-15): fixed, so runs repeat


class Deadlock(RuntimeError):
    """Every task waits, no callback is ready and no timer is set."""


class Runaway(RuntimeError):
    """A schedule ran past `SimLoop.limit_s` of simulated time or `limit_passes` passes:
    something waits in a loop for what never comes, or spins (a schedule takes well under two
    simulated minutes and ~10,000 passes)."""


class _NoIO(selectors.DefaultSelector):
    """The loop's selector, never asked: nothing waits on real I/O (`SimLoop._run_once`)."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        raise AssertionError("the simulated loop polls no file descriptor")


class SimLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop with its own `_run_once`: no I/O poll, simulated time, the ready
    callbacks shuffled, and timers in a heap of `(when, sequence, handle)` tuples (compared in C,
    where asyncio's heap of handles calls a Python `__lt__` a million times a minute). Timers due
    at the same instant run in the order they were set, then join the shuffle."""

    def __init__(self, seed: int) -> None:
        super().__init__(_NoIO())
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.passes = 0
        self.limit_s = 3600.0
        self.limit_passes = 1_000_000  # a schedule takes ~10,000
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._timer_seq = 0
        self._cancelled_timers = 0
        self.frozen: dict[str, int] = {}  # simulated processes whose callbacks wait: how many freezes
        self._held: list[tuple[str, asyncio.Handle]] = []  # their callbacks, in the order they came

    def freeze(self, process: str) -> None:
        """SIGSTOP for one simulated process (`libs.bus.memory.PROCESS`): none of its callbacks
        runs (its tasks, its timers) until `thaw`, wherever each stands: mid-step, with its
        transaction open, its group session lapsing. Unlike a crash, it then carries on.
        Freezes overlap: the process runs again when the last one ends."""
        self.frozen[process] = self.frozen.get(process, 0) + 1

    def thaw(self, process: str, *, every: bool = False) -> None:
        """End one freeze of `process` (`every`: all of them, as when it is killed)."""
        left = 0 if every else self.frozen.get(process, 0) - 1
        if left > 0:
            self.frozen[process] = left
            return
        self.frozen.pop(process, None)
        kept = []
        for owner, handle in self._held:
            if owner == process:
                self._ready.append(handle)  # type: ignore[attr-defined]
            else:
                kept.append((owner, handle))
        self._held = kept

    def _hold_frozen(self, ready: Any) -> None:
        """Set the frozen processes' ready callbacks aside."""
        runnable = []
        for handle in ready:
            owner = handle._context.get(PROCESS)
            if owner in self.frozen:
                self._held.append((owner, handle))
            else:
                runnable.append(handle)
        if len(runnable) != len(ready):
            ready.clear()
            ready.extend(runnable)

    def time(self) -> float:
        return self.now

    def call_at(
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        when = self.now + delay
        if delay > 0 and when <= self.now:
            # A wait shorter than the clock's resolution still lets some time pass, as a real
            # clock does: `while left > 0: sleep(left)` over float seconds must not spin forever.
            when = math.nextafter(self.now, math.inf)
        return self.call_at(when, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        if handle._scheduled:  # type: ignore[attr-defined]
            self._cancelled_timers += 1

    def _run_once(self) -> None:
        timers, ready = self._timers, self._ready  # type: ignore[attr-defined]
        if len(timers) > 100 and self._cancelled_timers * 2 > len(timers):
            kept = []
            for entry in timers:
                if entry[2]._cancelled:  # type: ignore[attr-defined]
                    entry[2]._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._timers = timers = kept
            self._cancelled_timers = 0
        else:
            while timers and timers[0][2]._cancelled:  # type: ignore[attr-defined]
                self._cancelled_timers -= 1
                heapq.heappop(timers)[2]._scheduled = False  # type: ignore[attr-defined]
        if self.frozen:
            self._hold_frozen(ready)
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not timers:
                raise Deadlock("no task can run and no timer is set: every task waits for something that cannot happen")
            self.now = max(self.now, timers[0][0])  # nothing to do until the next timer: jump there
            if self.now > self.limit_s:
                raise Runaway(f"still running after {self.limit_s:g} simulated seconds")
        while timers and timers[0][0] <= self.now:
            handle = heapq.heappop(timers)[2]
            handle._scheduled = False  # type: ignore[attr-defined]
            ready.append(handle)
        if self.frozen:
            self._hold_frozen(ready)
        if len(ready) == 2:  # the commonest shuffle, one random bit (random.shuffle is Python code)
            if self.rng.getrandbits(1):
                ready.rotate()
        elif len(ready) > 2:
            shuffled = list(ready)
            self.rng.shuffle(shuffled)
            ready.clear()
            ready.extend(shuffled)
        self.passes += 1
        if self.passes > self.limit_passes:
            raise Runaway(f"still running after {self.limit_passes} passes (at {self.now:.3f} simulated seconds)")
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def close(self) -> None:
        self._timers.clear()
        super().close()


@contextmanager
def simulated_process(loop: SimLoop) -> Iterator[None]:
    """While a schedule runs: the process's clocks are the loop's, and its random ids come from
    the seed (a uuid4 picks a router's inbox name, an object id, a migration id), as do the
    draws of the `random` module itself (a client's jittered backoff)."""
    ids = random.Random(loop.seed ^ 0x5EED)
    saved = (time.time, time.time_ns, time.monotonic, time.monotonic_ns, uuid.uuid4)
    drawn = random.getstate()
    random.seed(loop.seed ^ 0xB0FF)
    time.time = lambda: EPOCH + loop.now
    time.time_ns = lambda: int((EPOCH + loop.now) * 1e9)
    time.monotonic = lambda: loop.now
    time.monotonic_ns = lambda: int(loop.now * 1e9)
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    try:
        yield
    finally:
        time.time, time.time_ns, time.monotonic, time.monotonic_ns, uuid.uuid4 = saved
        random.setstate(drawn)


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
