"""The bus contract (tests/bus_contract.py) on the in-memory bus."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus.memory import MemoryBus
from tests.bus_contract import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_memory_bus_keeps_the_contract(case):
    asyncio.run(case(MemoryBus(), "mem"))
