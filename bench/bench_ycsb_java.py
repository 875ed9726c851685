"""YCSB's own engine + the MongoDB Java driver through the router's wire edge, beside `shardlog workload`, on one cluster.

Issue 14, section 4.  The cluster is bench_wire.py's (config, 3 shards, router r1 with its
wire edge on a free port, every one a process, on $KAFKA_BOOTSTRAP under a fresh name), with
two collections sharded alike on {_id: "hashed"}: `ycsb.usertable` for `shardlog workload`
(Python, our Kafka client; 100-character string fields) and `ycsb.usertable_java` for the
Java YCSB (`infra/ycsb/ycsb.py`, site.ycsb.Client + our binding shardlog.ycsb.MongoWireClient;
100-byte binary fields, as YCSB's MongoDB binding writes them), so each reads what it wrote.

1. load: `shardlog workload load ycsb --records N -c 32 --json` and
   `ycsb.py load --records N --threads 16 -p table=usertable_java --json`, one after the other.
2. per concurrency (default 1 and 32): `shardlog workload run ycsb-a --ops O -c C --json` and
   `ycsb.py run --ops O --threads C --json` (workload A: 50/50 read/update, zipfian), each
   alone, then both at the same time.

Both tools' own final JSON lines are recorded; the figures printed are ops/s and read/update
p50/p99 per run, and every error (YCSB: any Return= other than OK, exit status 3; shardlog
workload: total_errors).  Needs `make ycsb-java` (Maven, once) and `java`.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_ycsb_java.py [--records 10000] [--ops 5000] [--concurrency 1,32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _events as E
from bench_wire import NS_COLL, NS_DB, WireCluster

from libs.kafka import delete_cluster_topics

ROOT = E.ROOT
JAVA_COLL = "usertable_java"
YCSB = [sys.executable, str(ROOT / "infra" / "ycsb" / "ycsb.py")]
SHARDLOG = [sys.executable, "-m", "cli.main"]


def last_json(text: str, key: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{") and key in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


class Runner:
    def __init__(self, bootstrap: str, cluster: str, uri: str, logs: Path):
        self.env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "SHARDLOG_CLUSTER": cluster, "PYTHONPATH": str(ROOT)}
        self.url = uri.rstrip("/") + f"/{NS_DB}?w=1"
        self.logs = logs
        self.n = 0

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen, Path]:
        self.n += 1
        log = self.logs / f"{self.n:02d}-{name}.log"
        with open(log, "wb") as err:
            p = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
        return p, log

    def shardlog(self, *args: str) -> list[str]:
        return [*SHARDLOG, "workload", *args, "--ns", f"{NS_DB}.{NS_COLL}", "--json"]

    def ycsb(self, phase: str, *args: str) -> list[str]:
        props = ["-p", f"table={JAVA_COLL}", "-p", "hdrhistogram.percentiles=50,95,99"]
        return [*YCSB, phase, "--url", self.url, *props, "--json", *args]


def finish(name: str, p: subprocess.Popen, log: Path) -> dict:
    out = p.communicate()[0].decode(errors="replace")
    log.with_suffix(".out").write_text(out)
    if name.startswith("ycsb"):
        line = last_json(out, '"ycsb"')
        rep = line.get("report", {})
        o = rep.get("OVERALL", {})

        def lat(section: str, pct: str) -> float | None:
            v = rep.get(section, {}).get(f"{pct}PercentileLatency(us)")
            return round(v / 1000, 2) if v is not None else None

        ops = int(sum(rep.get(s, {}).get("Operations", 0) for s in ("READ", "UPDATE", "INSERT")))
        return {
            "tool": "ycsb-java",
            "rc": p.returncode,
            "ops": ops,
            "ops_s": round(o.get("Throughput(ops/sec)", 0.0), 1),
            "read_p50_ms": lat("READ", "50th"),
            "read_p99_ms": lat("READ", "99th"),
            "update_p50_ms": lat("UPDATE", "50th"),
            "update_p99_ms": lat("UPDATE", "99th"),
            "insert_p50_ms": lat("INSERT", "50th"),
            "errors": line.get("failures", {}) if line else {"no JSON line": 1},
            "report": rep,
        }
    line = last_json(out, '"phase"')
    kinds = line.get("kinds", {})

    def klat(kind: str, pct: str) -> float | None:
        k = kinds.get(kind)
        return round(k["latency_ms"][pct], 2) if k else None

    return {
        "tool": "shardlog-workload",
        "rc": p.returncode,
        "ops": line.get("operations", 0),
        "ops_s": line.get("throughput_ops_s", 0.0),
        "read_p50_ms": klat("read", "p50"),
        "read_p99_ms": klat("read", "p99"),
        "update_p50_ms": klat("update", "p50"),
        "update_p99_ms": klat("update", "p99"),
        "insert_p50_ms": klat("insert_many", "p50"),
        "errors": line.get("errors", {}) if line else {"no JSON line": {"": 1}},
        "report": line,
    }


def together(r: Runner, jobs: dict[str, list[str]]) -> dict[str, dict]:
    started = {name: r.start(name, argv) for name, argv in jobs.items()}
    return {name: finish(name, p, log) for name, (p, log) in started.items()}


def show(phase: str, name: str, f: dict) -> None:
    def ms(v: float | None) -> str:
        return f"{v:7.2f}" if v is not None else "      -"

    bad = f["rc"] != 0 or f["errors"]
    print(
        f"  {phase:18s} {name:18s} {f['ops']:7,} ops {f['ops_s']:8,.0f} ops/s   read p50 {ms(f['read_p50_ms'])} "
        f"p99 {ms(f['read_p99_ms'])}   update p50 {ms(f['update_p50_ms'])} p99 {ms(f['update_p99_ms'])}"
        + (f"   FAILED rc={f['rc']} errors={f['errors']}" if bad else "   errors 0"),
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000, help="records each tool loads (default 10,000)")
    p.add_argument("--ops", type=int, default=5_000, help="workload-A operations per run (default 5,000)")
    p.add_argument("--concurrency", default="1,32", help="threads / operations in flight (default 1,32)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores, both tools' output)")
    args = p.parse_args()
    concurrency = [int(x) for x in args.concurrency.split(",")]
    subprocess.run([*YCSB, "fetch"], check=True, stdout=subprocess.DEVNULL)  # make ycsb-java (no-op when built)
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-ycsb-java-"))
    (tmp / "runs").mkdir()
    cl = WireCluster(bootstrap, cluster, tmp, raw=False, collections=(NS_COLL, JAVA_COLL))
    runs: list[dict] = []
    t0 = time.monotonic()
    print(
        f"YCSB Java beside shardlog workload: cluster {cluster}; {args.records:,} records each; "
        f"workload A, {args.ops:,} ops per run; concurrency {concurrency}"
    )
    try:
        asyncio.run(cl.start())
        r = Runner(bootstrap, cluster, cl.uri, tmp / "runs")
        load = {
            "shardlog-workload": together(
                r, {"shardlog-workload": r.shardlog("load", "ycsb", "--records", str(args.records), "-c", "32")}
            )["shardlog-workload"],
            "ycsb-java": together(r, {"ycsb-java": r.ycsb("load", "--records", str(args.records), "--threads", "16")})[
                "ycsb-java"
            ],
        }
        for name, f in load.items():
            show("load", name, f)
            runs.append({"phase": "load", "concurrency": None, **f})
        for c in concurrency:
            sl = r.shardlog(
                "run", "ycsb-a", "--ops", str(args.ops), "--records", str(args.records), "-c", str(c), "--seed", "1"
            )
            yj = r.ycsb("run", "--records", str(args.records), "--ops", str(args.ops), "--threads", str(c))
            for phase, jobs in (
                (f"alone c={c}", {"shardlog-workload": sl}),
                (f"alone c={c}", {"ycsb-java": yj}),
                (f"together c={c}", {"shardlog-workload": sl, "ycsb-java": yj}),
            ):
                for name, f in together(r, jobs).items():
                    show(phase, name, f)
                    runs.append({"phase": phase, "concurrency": c, **f})
    finally:
        cl.stop()
        try:
            asyncio.run(delete_cluster_topics(bootstrap, cluster))
        except Exception as e:  # clean-up must not hide the figures
            print(f"warning: could not delete the topics of {cluster}: {e}", file=sys.stderr)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [f"{x['phase']} {x['tool']}" for x in runs if x["rc"] != 0 or x["errors"]]
    print(f"{len(runs)} runs in {time.monotonic() - t0:.0f}s wall; " + (f"FAILED: {failed}" if failed else "no errors"))
    E.result_line(
        "ycsb-java",
        records=args.records,
        ops=args.ops,
        runs=[{k: v for k, v in x.items() if k != "report"} for x in runs],
        failed=failed,
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
