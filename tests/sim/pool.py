"""Many schedules at once: seeds shared out among worker processes (`jobs`), results merged.

Each worker is a fresh interpreter (spawned: nothing of this process's threads or state comes
along), which imports the services once and runs whole schedules one after the other, a chunk
of consecutive seeds at a time; a schedule depends only on its seed (and PYTHONHASHSEED, which
the workers inherit from the environment), not on the worker that runs it or on what it ran
before. A failure is reported with its seed and its
Violation, whose text says how to rerun it (`make sim SEED=n`)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from libs import faults
from tests.sim import schedule

CHUNK = 10  # seeds a worker takes at a time: few messages, and the last chunks still balance


@dataclass(frozen=True)
class Result:
    seed: int
    failure: str | None  # the Violation's text (schedule and rerun command), None if kept
    crashed: bool = False  # the schedule crashed a process
    settled: bool = False  # the cluster settled and the invariants were checked
    stats: dict[str, object] | None = None


def _scratch() -> Path:
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # RocksDB (--rocksdb) opens faster there
    return Path(tempfile.mkdtemp(prefix="shardlog-sim-", dir=shm))


def run_one(seed: int, data_dir: Path, *, faults_on: bool = True, rocksdb: bool = False) -> Result:
    try:
        out = schedule.run(seed, data_dir / str(seed), faults_on=faults_on, rocksdb=rocksdb)
    except schedule.Violation as e:
        return Result(seed, str(e))
    finally:
        shutil.rmtree(data_dir / str(seed), ignore_errors=True)
    return Result(
        seed,
        None,
        crashed=any("crash" in e for e in out.events),
        settled=any("settled" in e for e in out.events),
        stats=out.stats,
    )


def _worker() -> None:
    """A worker's start: quiet services (no MongoDB edge, no metrics, no logging), as the CLI."""
    logging.disable(logging.CRITICAL)
    os.environ["SHARDLOG_ROUTER_PORT"] = "off"
    os.environ["SHARDLOG_METRICS"] = "off"


def _chunk(args: tuple[list[int], bool, bool, frozenset[str], bool]) -> list[Result]:
    seeds, faults_on, rocksdb, bugs, keep_going = args
    faults.reintroduce(set(bugs))
    data = _scratch()
    out: list[Result] = []
    try:
        for seed in seeds:
            out.append(run_one(seed, data, faults_on=faults_on, rocksdb=rocksdb))
            if out[-1].failure is not None and not keep_going:
                break
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return out


def run_seeds(
    seeds: Iterable[int],
    *,
    jobs: int = 1,
    faults_on: bool = True,
    rocksdb: bool = False,
    bugs: Iterable[str] = (),
    keep_going: bool = False,
) -> Iterator[Result]:
    """Each seed's result, in the order the seeds finish (in seed order with one job). Without
    `keep_going` it stops after the first failure (the other workers are stopped)."""
    seeds, bugs = list(seeds), frozenset(bugs)
    if jobs <= 1 or len(seeds) <= CHUNK:
        saved = {b for b in faults.KNOWN_BUGS if faults.reintroduced(b)}
        faults.reintroduce(set(bugs))
        data = _scratch()
        try:
            for seed in seeds:
                result = run_one(seed, data, faults_on=faults_on, rocksdb=rocksdb)
                yield result
                if result.failure is not None and not keep_going:
                    return
        finally:
            shutil.rmtree(data, ignore_errors=True)
            faults.reintroduce(saved)
        return
    chunks = [(seeds[i : i + CHUNK], faults_on, rocksdb, bugs, keep_going) for i in range(0, len(seeds), CHUNK)]
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_worker) as pool:
        for results in pool.imap_unordered(_chunk, chunks):
            yield from results
            if not keep_going and any(r.failure is not None for r in results):
                pool.terminate()
                return
