"""The cost of observability: YCSB-A ops/s with span export to a live Zipkin, against none.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_tracing.py [--records 10000] [--ops 20000]
                                                                [--concurrency 32] [--repeat 2]

Two clusters of the same size, each config + 3 shards + router r1 as processes (as in
bench_sessions.py), up side by side on the broker of $KAFKA_BOOTSTRAP under fresh cluster names:
`traced`, whose services export every span to a Zipkin this bench starts (infra/zipkin/local.py,
the one `make up` runs; OTEL_TRACES_EXPORTER=zipkin), and `untraced` (OTEL_TRACES_EXPORTER=none:
the no-op tracer, context still propagated).  The client is this process (untraced in both).
Each is loaded with the same records, warmed up, then runs alternate (untraced, traced, ...)
with the same seed and operation stream; the median run's ops/s, p50 and p99 of each, their
ratio, and the spans the traced services dropped (their log's "spans dropped" lines).
The aim: traced ops/s at least 90 % of untraced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import _events as E
from bench_sessions import NS_COLL, NS_DB, Cluster, alternating_ycsb_a, pooled, ratio_of

from libs.client import AsyncCluster
from libs.kafka import delete_cluster_topics
from libs.topics import Topics
from services.workload import runner

ROOT = E.ROOT
LOCAL_ZIPKIN = ROOT / "infra" / "zipkin" / "local.py"


class TracedCluster(Cluster):
    def __init__(self, bootstrap: str, tmp: Path, name: str, tracing_env: dict[str, str]):
        tmp.mkdir()
        super().__init__(bootstrap, ("s0", "s1", "s2"), tmp)
        self.cluster = E.cluster_name(f"benchtr{name}")
        self.t = Topics(self.cluster)
        # Two routers side by side: each on a free wire port (the client speaks Kafka anyway).
        self.env.update({"SHARDLOG_CLUSTER": self.cluster, "SHARDLOG_ROUTER_PORT": "0", **tracing_env})
        self.env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)


def dropped(c: Cluster) -> int:
    """Spans the cluster's services reported dropped (the last count each logged)."""
    total = 0
    for log in c.logs.glob("*.log"):
        counts = re.findall(r"(\d+) dropped so far", log.read_text(errors="replace"))
        total += int(counts[-1]) if counts else 0
    return total


async def bench(args, bootstrap: str, tmp: Path, zipkin: str) -> None:
    clusters = {
        "untraced": TracedCluster(bootstrap, tmp / "untraced", "off", {"OTEL_TRACES_EXPORTER": "none"}),
        "traced": TracedCluster(
            bootstrap,
            tmp / "traced",
            "on",
            {"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_ZIPKIN_ENDPOINT": f"{zipkin}/api/v2/spans"},
        ),
    }
    print(
        f"tracing benchmark: {args.records:,} records, {args.ops:,} ops of YCSB-A per run, concurrency "
        f"{args.concurrency}, {args.repeat} run(s) each way, alternating; Zipkin at {zipkin}/zipkin/"
    )
    try:
        for c in clusters.values():
            await c.start()
        async with (
            AsyncCluster(bootstrap, clusters["untraced"].cluster) as off,
            AsyncCluster(bootstrap, clusters["traced"].cluster) as on,
        ):
            clients = {"untraced": off, "traced": on}
            for name, cl in clients.items():
                load = await runner.load(
                    cl[NS_DB][NS_COLL], "a", args.records, concurrency=args.concurrency, seed=args.seed
                )
                print(f"  {name:8s} load: {load.operations:,} records in {load.elapsed_s:.2f}s")
            results = await alternating_ycsb_a(clients, args)
        with urllib.request.urlopen(f"{zipkin}/api/v2/services", timeout=10) as r:
            services = json.loads(r.read())
        assert {"shardlog-router", "shardlog-shard-s0"} <= set(services), f"Zipkin got no spans: {services}"
        figures = {name: pooled(reps) for name, reps in results.items()}
        on, off = figures["traced"], figures["untraced"]
        ratio = ratio_of(on, off)
        lost = dropped(clusters["traced"])
        print(
            f"\n  traced / untraced: ops/s x{ratio['ops_s']:.3f} ({(1 - ratio['ops_s']) * 100:+.1f} % cost), "
            f"p50 x{ratio['p50']:.2f}, p99 x{ratio['p99']:.2f} (median of {args.repeat} run(s) each); "
            f"spans dropped by the traced services: {lost:,}; aim: cost under 10 %"
        )
        E.result_line(
            "tracing.cost",
            records=args.records,
            ops=args.ops,
            concurrency=args.concurrency,
            traced=on,
            untraced=off,
            ratio=ratio,
            droppedSpans=lost,
        )
    finally:
        for c in clusters.values():
            c.stop()
            await delete_cluster_topics(bootstrap, c.cluster)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--ops", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    bootstrap = E.bootstrap()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    zdir = tmp / "zipkin"
    try:
        subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "start", "--dir", str(zdir), "--port", "0"], check=True)
        zipkin = f"http://127.0.0.1:{(zdir / 'zipkin.port').read_text().strip()}"
        asyncio.run(bench(args, bootstrap, tmp, zipkin))
    finally:
        subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "stop", "--dir", str(zdir)])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
