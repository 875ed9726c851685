"""The simulator's tests: their services' stores in memory (/dev/shm when there is one: RocksDB
opens and closes there several times faster, and a schedule starts a dozen stores), and the
services' MongoDB edge and metrics off (clients use the bus)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sim_dir() -> Iterator[Path]:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="shardlog-sim-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def quiet_services(monkeypatch):
    monkeypatch.setenv("SHARDLOG_ROUTER_PORT", "off")
    monkeypatch.setenv("SHARDLOG_METRICS", "off")


@pytest.fixture(autouse=True)
def no_bug_left_behind() -> Iterator[None]:
    from libs import faults

    yield
    faults.reintroduce(set())
