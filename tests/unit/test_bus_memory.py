"""The bus contract (tests/bus_contract.py) on the in-memory bus."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus import TopicSpec
from libs.bus.memory import MemoryBus
from tests.bus_contract import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_memory_bus_keeps_the_contract(case):
    asyncio.run(case(MemoryBus(), "mem"))


def test_a_poll_cancelled_while_its_listener_runs_leaves_no_revocation_half_done():
    """aiokafka runs the rebalance listener in its coordinator, so cancelling a `getmany` does
    not cut `on_revoked` short; the memory bus must not either (a processor cancels its fetch
    when its transaction ends: cut short, the member had given the partition up while its
    owner, never told, went on believing it its own and fenced the new owner, over and over)."""

    async def main() -> None:
        bus = MemoryBus()
        await bus.create_topics([TopicSpec("t", partitions=2)])
        entered, release = asyncio.Event(), asyncio.Event()

        class Slow:
            def __init__(self) -> None:
                self.revoked: list[set[int]] = []

            async def on_revoked(self, partitions) -> None:
                entered.set()
                await release.wait()  # e.g. waiting for the processor's lock
                self.revoked.append(set(partitions))

            async def on_assigned(self, partitions) -> None:
                pass

        slow = Slow()
        a = bus.member("g", "t", client_id="a", listener=slow, session_timeout_ms=6000)
        await a.start()
        await a.poll(timeout_s=0)
        assert a.assignment() == {0, 1}
        b = bus.member("g", "t", client_id="b", listener=Slow(), session_timeout_ms=6000)
        await b.start()  # a must give partition 1 up: it revokes both (eager), then takes 0 back
        poll = asyncio.ensure_future(a.poll(timeout_s=0))
        await entered.wait()
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        release.set()
        await a.poll(timeout_s=0)  # waits for the rebalance under way
        assert slow.revoked == [{0, 1}], "the listener was told the whole revocation"
        await b.poll(timeout_s=0)
        await a.poll(timeout_s=0)
        assert a.assignment() == {0} and b.assignment() == {1}

    asyncio.run(main())
