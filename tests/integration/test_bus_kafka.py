"""The bus contract (tests/bus_contract.py) on a real broker: the in-memory bus is checked
against the same cases (tests/unit/test_bus_memory.py)."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus.kafka import KafkaBus
from tests.bus_contract import CASES

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_kafka_bus_keeps_the_contract(case, bootstrap, cluster):
    asyncio.run(case(KafkaBus(bootstrap), cluster))  # topics named <cluster>.…: the fixture deletes them
