"""Run simulated schedules from the command line (`make sim`, `make sim-long`).

    python -m tests.sim --seed 42              one schedule; its events; exit 1 if it breaks an invariant
    python -m tests.sim --seed 42 --shrink     the smallest plan of seed 42 that still fails
    python -m tests.sim --schedules 100000     seeds 0.. (or --first N..), a progress line every 30 s
    python -m tests.sim --bug NAME ...         with a known bug put back (libs.faults.KNOWN_BUGS)
    python -m tests.sim --schedules 2000 --jobs 2   the seeds shared out among 2 worker processes
    python -m tests.sim --rocksdb ...          the stores in RocksDB rather than the simulated disk

`--json` prints one JSON line per failure and a summary line instead of text. A seed repeats
its schedule exactly when PYTHONHASHSEED is fixed (the Makefile sets it to 0)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--schedules", type=int, default=100, help="how many seeds to run (without --seed)")
    p.add_argument("--first", type=int, default=0, help="the first seed (without --seed)")
    p.add_argument("--shrink", action="store_true", help="with --seed: shrink its failing plan")
    p.add_argument("--bug", action="append", default=[], help="a known bug to put back (repeatable)")
    p.add_argument("--no-faults", action="store_true", help="the workload without crashes")
    p.add_argument("--keep-going", action="store_true", help="run every seed even after a failure")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text")
    p.add_argument("--jobs", type=int, default=1, help="worker processes sharing the seeds (without --seed)")
    p.add_argument("--rocksdb", action="store_true", help="the stores in RocksDB, not the simulated disk")
    args = p.parse_args(argv)

    # The services' own logging would drown the schedule; their MongoDB edge and metrics are off.
    logging.disable(logging.CRITICAL)
    os.environ.setdefault("SHARDLOG_ROUTER_PORT", "off")
    os.environ.setdefault("SHARDLOG_METRICS", "off")
    from libs import faults
    from tests.sim import pool, schedule

    faults.reintroduce(set(args.bug))
    say = (lambda obj: print(json.dumps(obj), flush=True)) if args.json else (lambda obj: None)
    text = (lambda line: None) if args.json else (lambda line: print(line, flush=True))

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # RocksDB stores in memory: faster to open
    if args.seed is not None:
        with tempfile.TemporaryDirectory(prefix="shardlog-sim-", dir=shm) as tmp:
            data = Path(tmp)
            if args.shrink:
                plan, failure = schedule.shrink(args.seed, data, progress=text)
                text(failure)
                say({"seed": args.seed, "shrunk": str(plan), "failure": failure})
                return 1
            try:
                out = schedule.run(args.seed, data / "run", faults_on=not args.no_faults, rocksdb=args.rocksdb)
            except schedule.Violation as e:
                text(str(e))
                say({"seed": args.seed, "failure": str(e)})
                say({"schedules": 1, "failed": 1, "bugs": sorted(args.bug)})
                return 1
            text("\n".join([schedule.describe(out.plan, out.events), f"kept every invariant: {out.stats}"]))
            say({"schedules": 1, "failed": 0, "bugs": sorted(args.bug)})
            return 0
    seeds = range(args.first, args.first + args.schedules)
    began = last_report = time.monotonic()
    ran = failed = 0
    results = pool.run_seeds(
        seeds,
        jobs=args.jobs,
        faults_on=not args.no_faults,
        rocksdb=args.rocksdb,
        bugs=args.bug,
        keep_going=args.keep_going,
    )
    for result in results:
        ran += 1
        if result.failure is not None:
            failed += 1
            text(result.failure)
            say({"seed": result.seed, "failure": result.failure})
        if time.monotonic() - last_report >= 30:
            last_report = time.monotonic()
            text(f"{ran} schedules, {failed} failed, {ran / (last_report - began):.1f}/s")
    elapsed = time.monotonic() - began
    summary = {
        "schedules": ran,
        "failed": failed,
        "seconds": round(elapsed, 1),
        "jobs": args.jobs,
        "bugs": sorted(args.bug),
    }
    jobs = f"{args.jobs} job{'s' if args.jobs > 1 else ''}"
    text(f"{ran} schedules ({failed} failed) in {elapsed:.1f}s, {ran / elapsed:.2f}/s ({jobs})")
    say(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
