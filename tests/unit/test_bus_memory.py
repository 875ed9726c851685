"""The bus contract (tests/bus_contract.py) on the in-memory bus."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus.memory import MemoryBus
from libs.topics import TopicSpec
from tests.bus_contract import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_memory_bus_keeps_the_contract(case):
    asyncio.run(case(MemoryBus(), "mem"))


def test_a_poll_given_up_during_a_rebalance_still_lets_the_listener_finish():
    """The command processor gives up a fetch when its transaction ends first; if that fetch was
    telling the listener its partition is revoked, the listener must still finish (aiokafka
    runs it in the coordinator's task), or its owner would think itself assigned forever."""

    async def case() -> None:
        bus = MemoryBus()
        await bus.create_topics([TopicSpec("t", partitions=1)])
        lock = asyncio.Lock()
        revoked_fully = asyncio.Event()

        class Slow:
            async def on_revoked(self, revoked) -> None:
                async with lock:  # as the processor's: held by a transaction
                    revoked_fully.set()

            async def on_assigned(self, assigned) -> None:
                pass

        member = bus.member("g", "t", client_id="m", listener=Slow())
        await member.start()
        await member.poll(timeout_s=0)
        assert member.assignment() == {0}
        bus._groups["g"].members.remove(member)  # evicted while silent
        await lock.acquire()
        fetch = asyncio.ensure_future(member.poll(timeout_s=0))
        await asyncio.sleep(0.01)
        fetch.cancel()  # the transaction ended first
        await asyncio.gather(fetch, return_exceptions=True)
        lock.release()
        await asyncio.wait_for(revoked_fully.wait(), 5)

    asyncio.run(case())
