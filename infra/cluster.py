"""`make up` / `make down` / `make reset`: a local Kafka and a demo cluster as background processes.

    python -m infra.cluster up    [--data .shardlog] [--cluster shardlog] [--brokers N] [--no-tracing]
    python -m infra.cluster down  [--data .shardlog]
    python -m infra.cluster reset [--data .shardlog]
    python -m infra.cluster status [--data .shardlog] [--json]

Logs in <data>/logs/<service>.log, pids in <data>/pids/, service stores in
<data>/services/, the brokers in <data>/kafka/.  `up` starts whatever is not
running (the brokers included: after `down`, a crash or a kill -9) and leaves
the rest alone; every service resumes from its store's checkpoint.  `down`
stops everything and keeps every byte.  Only `reset` deletes data.  Unless
--no-tracing (`make up TRACING=0`), `up` also starts Zipkin (infra/zipkin/local.py,
in <data>/zipkin/) and the services it starts export their spans to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL_KAFKA = ROOT / "infra" / "kafka" / "local.py"
LOCAL_ZIPKIN = ROOT / "infra" / "zipkin" / "local.py"
SHARDS = ("s0", "s1", "s2")  # the default: `make up SHARDS=N` starts s0 .. s<N-1>


def shard_ids(n: int | None = None) -> tuple[str, ...]:
    """The shards `make up` runs: s0 .. s<n-1> (at least the default three)."""
    return tuple(f"s{i}" for i in range(max(n or len(SHARDS), 1)))


def _shard_count(data: Path, shards: int | None) -> int:
    """SHARDS=N is remembered in the data directory, so a later `make up` restarts every shard."""
    f = data / "shards"
    if shards is not None:
        if shards < 1:
            raise SystemExit("make up: SHARDS must be at least 1")
        data.mkdir(parents=True, exist_ok=True)
        known = int(f.read_text()) if f.exists() else len(SHARDS)
        if shards < known:
            raise SystemExit(
                f"make up: this cluster has {known} shards; remove one with `shardlog remove-shard` (SHARDS only adds)"
            )
        f.write_text(str(shards))
        return shards
    return int(f.read_text()) if f.exists() else len(SHARDS)


KAFKA_PORT = int(os.environ.get("KAFKA_PORT", "9092"))  # the first broker's port, chosen when formatting


ROUTER_PORT = int(os.environ.get("SHARDLOG_ROUTER_PORT", "27017"))  # the first router's wire port; 0: any free one


def services(routers: int = 1, shards: tuple[str, ...] = SHARDS) -> dict[str, list[str]]:
    """Service name -> `python -m` arguments.  Router i listens on ROUTER_PORT + i (its own
    port, as each mongos has); the first is `router`, the others `router-2`, `router-3`, ..."""
    out = {"config": ["services.config"]}
    out.update({f"shard-{s}": ["services.shard", "--shard-id", s] for s in shards})
    for i in range(routers):
        port = str(ROUTER_PORT + i if ROUTER_PORT else 0)
        out["router" if i == 0 else f"router-{i + 1}"] = ["services.router", "--port", port] + (
            ["--instance", str(i + 1)] if i else []
        )
    out.update({"balancer": ["services.balancer"], "range-deleter": ["services.range_deleter"]})
    out["dashboard"] = ["services.dashboard"]  # its port: SHARDLOG_DASHBOARD_PORT (default 8090)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _external() -> str | None:
    """A broker the user runs (KAFKA_BOOTSTRAP): `up`/`down`/`reset` leave it alone."""
    return os.environ.get("KAFKA_BOOTSTRAP") or None


def _local_kafka(action: str, data: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LOCAL_KAFKA), action, "--dir", str(data / "kafka"), *args])


def _bootstrap(data: Path, brokers: int | None) -> str:
    if (b := _external()) is not None:
        return b
    args = ["--port", str(KAFKA_PORT), *(["--brokers", str(brokers)] if brokers else [])]
    if _local_kafka("start", data, *args).returncode != 0:
        raise SystemExit("make up: the local Kafka did not start (the line above says why)")
    return (data / "kafka" / "bootstrap").read_text().strip()


def _zipkin(data: Path) -> int | None:
    """Start the tracing UI (or find it running): its port, or None when it could not start,
    which costs the traces, never the cluster."""
    zipkin = subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "start", "--dir", str(data / "zipkin")])
    st = subprocess.run(
        [sys.executable, str(LOCAL_ZIPKIN), "status", "--dir", str(data / "zipkin"), "--json"],
        capture_output=True,
        text=True,
    )
    port = json.loads(st.stdout).get("port") if zipkin.returncode == 0 and st.stdout.strip() else None
    if port is None:
        print("make up: Zipkin did not start (the line above says why); the cluster runs without tracing")
    return port


def _tracing_env(zipkin_port: int | None) -> dict[str, str]:
    """The services export to our Zipkin, unless the user chose an exporter of their own."""
    if zipkin_port is None or "OTEL_TRACES_EXPORTER" in os.environ:
        return {}
    return {
        "OTEL_TRACES_EXPORTER": "zipkin",
        "OTEL_EXPORTER_ZIPKIN_ENDPOINT": f"http://127.0.0.1:{zipkin_port}/api/v2/spans",
    }


async def _add_shards(bootstrap: str, cluster: str, shards: tuple[str, ...] = SHARDS) -> None:
    from libs import kafka
    from libs.requests import Requester
    from libs.topics import Topics
    from schemas.config import AddShard

    t = Topics(cluster)
    await kafka.ensure_topics(bootstrap, [*t.core(), *(s for sh in shards for s in t.for_shard(sh))])
    async with Requester(bootstrap, t.cli_replies, client_id="make-up") as r:
        for s in shards:
            reply = await r.request(t.config_commands, AddShard(shard=s), timeout=60)
            if not reply.ok and reply.code != "ShardAlreadyExists":
                raise SystemExit(f"make up: add-shard {s}: {reply.code}: {reply.error}")


def _ready(data: Path, name: str, pid: int) -> dict | None:
    """The service's readiness report, once it serves: services with a role (one active instance)
    are ready when active, the others once they have replayed."""
    try:
        info = json.loads((data / "services" / f"{name}.ready").read_text())
    except (OSError, ValueError):
        return None
    if info.get("pid") != pid or info.get("role", "active") != "active":
        return None
    return info


def _why(log: Path, lines: int = 4) -> str:
    """The end of a service's log: the error that stopped it."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(f"    {line[:4000]}" for line in tail)


def up(
    data: Path,
    cluster: str,
    brokers: int | None = None,
    timeout: float = 180.0,
    routers: int = 1,
    shards: int | None = None,
    tracing: bool = True,
) -> None:
    data = data.resolve()
    shard_names = shard_ids(_shard_count(data, shards))
    t0 = time.monotonic()
    bootstrap = _bootstrap(data, brokers)
    zipkin_port = _zipkin(data) if tracing else None
    for d in ("logs", "pids", "services"):
        (data / d).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": bootstrap,
        "SHARDLOG_CLUSTER": cluster,
        "SHARDLOG_DATA_DIR": str(data / "services"),
        "PYTHONPATH": str(ROOT),
        **_tracing_env(zipkin_port),
        # The cluster page links to this Zipkin (its port may not be the default).
        **({"SHARDLOG_TRACING_UI_URL": f"http://127.0.0.1:{zipkin_port}/zipkin"} if zipkin_port else {}),
        **({k: os.environ[k] for k in ("SHARDLOG_TRACING_UI_URL",) if k in os.environ}),
    }
    asyncio.run(_ensure_core_topics(bootstrap, cluster))
    started: dict[str, tuple[int, float]] = {}
    uris: dict[str, str] = {}
    pages: dict[str, str] = {}  # the dashboard's URL
    for name, argv in services(routers, shard_names).items():
        pidfile = data / "pids" / f"{name}.pid"
        if (pid := _pid(pidfile)) is not None:
            info = _ready(data, name, pid) or {}
            if info.get("uri"):
                uris[name] = info["uri"]
            if info.get("url"):
                pages[name] = info["url"]
            where = info.get("uri") or info.get("url")
            print(f"  {name:14} already running (pid {pid}{', ' + where if where else ''})")
            continue
        (data / "services" / f"{name}.ready").unlink(missing_ok=True)
        with open(data / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pidfile.write_text(str(proc.pid))
        started[name] = (proc.pid, time.monotonic())
    deadline = time.monotonic() + timeout
    for name, (pid, since) in started.items():
        log = data / "logs" / f"{name}.log"
        while (info := _ready(data, name, pid)) is None:
            failed = (
                f"{name} exited"
                if not _alive(pid)
                else f"{name} not ready after {timeout:.0f}s"
                if time.monotonic() > deadline
                else None
            )
            if failed:
                # Leave nothing half up: stop what this run started (what already ran keeps running).
                for other, (opid, _) in started.items():
                    if _alive(opid):
                        os.killpg(opid, signal.SIGTERM)
                    (data / "pids" / f"{other}.pid").unlink(missing_ok=True)
                raise SystemExit(
                    f"make up: {failed}; the end of {log}:\n{_why(log, 1)}\n"
                    f"(stopped the {len(started)} services this run started)"
                )
            time.sleep(0.1)
        at = f", ConfigTime {info['configTime']}" if "configTime" in info else ""
        if info.get("uri"):
            uris[name] = info["uri"]
            at += f", {info['uri']}"
        if info.get("url"):
            pages[name] = info["url"]
            at += f", {info['url']}"
        print(f"  {name:14} ready (pid {pid}, {time.monotonic() - since:.1f}s{at})")
    asyncio.run(_add_shards(bootstrap, cluster, shard_names))
    print(f"""
shardlog cluster {cluster!r} is up in {time.monotonic() - t0:.1f}s: Kafka at {bootstrap}, config server,
shards {", ".join(shard_names)}, {len(uris) or routers} router(s), balancer, range-deleter, dashboard.  Logs: {data / "logs"}

  The cluster page (shards, chunks, migrations, balancer): {pages.get("dashboard", "(see make status)")}

  MongoDB clients (pymongo, mongosh, drivers) connect to a router: {"  ".join(uris.values()) or "(see make status)"}
  mongosh {next(iter(uris.values()), "mongodb://127.0.0.1:27017/")} --eval 'sh.status()'
  {f"Traces (Zipkin): http://127.0.0.1:{zipkin_port}/zipkin/" if zipkin_port else "Traces: off (make up TRACING=0, or Zipkin did not start)"}

  export KAFKA_BOOTSTRAP={bootstrap} SHARDLOG_CLUSTER={cluster}{"".join(f" {k}={v}" for k, v in _tracing_env(zipkin_port).items())}
  .venv/bin/shardlog status
  .venv/bin/shardlog shard-collection app.users --key '{{"_id": "hashed"}}'
  .venv/bin/shardlog insert app.users '[{{"_id": 1, "name": "ada"}}, {{"_id": 2, "name": "bob"}}]'
  .venv/bin/shardlog find app.users '{{}}' --sort '{{"_id": 1}}'
  .venv/bin/shardlog status --verbose
  make down      # stop; every document is kept for the next `make up`
  make reset     # stop and delete every document, the catalog and the broker's data
""")


async def _ensure_core_topics(bootstrap: str, cluster: str) -> None:
    from libs import kafka
    from libs.topics import Topics

    await kafka.ensure_topics(bootstrap, Topics(cluster).core())


def _stop_services(data: Path) -> None:
    pidfiles = sorted((data / "pids").glob("*.pid")) if (data / "pids").exists() else []
    running = {f: pid for f in pidfiles if (pid := _pid(f)) is not None}
    for pid in running.values():  # all at once: each waits for its own clean stop
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in running.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for f in pidfiles:
        if (pid := running.get(f)) is not None:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
            print(f"  {f.stem:14} stopped")
        f.unlink(missing_ok=True)


def down(data: Path) -> None:
    data = data.resolve()
    _stop_services(data)
    if _external() is None:
        _local_kafka("stop", data)
    subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "stop", "--dir", str(data / "zipkin")])
    print(f"stopped; the data stays in {data} for the next `make up` (`make reset` deletes it)")


def _size(path: Path) -> str:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
    return f"{total / 1e6:.1f} MB"


def reset(data: Path) -> None:
    """Stop everything, then delete the service stores, the logs and the local brokers' data."""
    data = data.resolve()
    _stop_services(data)
    subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "stop", "--dir", str(data / "zipkin")])
    doomed = [
        (data / "services", "every service's store (catalog, documents, tasks, checkpoints)"),
        (data / "logs", "service logs"),
        (data / "pids", "pid files"),
    ]
    if _external() is None:
        _local_kafka("stop", data)
        doomed.insert(0, (data / "kafka", "the local brokers' data: every topic, consumer offset and transaction"))
    else:
        print(
            f"the broker at {_external()} is not ours: the cluster's topics on it are kept, and the services "
            f"will rebuild their stores from them on the next `make up`"
        )
    for path, what in doomed:
        if path.exists():
            size = _size(path)
            shutil.rmtree(path)
            print(f"  deleted {path} ({size}): {what}")
    print("reset: the next `make up` starts an empty cluster")


def status(data: Path, as_json: bool) -> None:
    data = data.resolve()
    out = {"services": {}, "kafka": None, "zipkin": None}
    extra = sorted(f.stem for f in (data / "pids").glob("router-*.pid")) if (data / "pids").exists() else []
    shards = shard_ids(_shard_count(data, None))
    for name in [*services(shards=shards), *extra]:
        out["services"][name] = _pid(data / "pids" / f"{name}.pid")
    if _external() is None:
        st = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), "status", "--dir", str(data / "kafka"), "--json"],
            capture_output=True,
            text=True,
        )
        out["kafka"] = json.loads(st.stdout) if st.stdout.strip() else None
    zk = subprocess.run(
        [sys.executable, str(LOCAL_ZIPKIN), "status", "--dir", str(data / "zipkin"), "--json"],
        capture_output=True,
        text=True,
    )
    out["zipkin"] = json.loads(zk.stdout) if zk.stdout.strip() else None
    if as_json:
        print(json.dumps(out))
        return
    for name, pid in out["services"].items():
        print(f"  {name:14} {f'running (pid {pid})' if pid else 'not running'}")
    for b in (out["kafka"] or {}).get("brokers", []):
        state = f"running (pid {b['pid']})" if b["running"] else "not running"
        print(f"  {'kafka-' + str(b['id']):14} {state} at 127.0.0.1:{b['port']}")
    zk_state = out["zipkin"] or {}
    zk_line = f"running (pid {zk_state['pid']}) at {zk_state['ui']}" if zk_state.get("running") else "not running"
    print(f"  {'zipkin':14} {zk_line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "reset", "status"])
    p.add_argument("--data", type=Path, default=ROOT / ".shardlog")
    p.add_argument("--cluster", default=os.environ.get("SHARDLOG_CLUSTER", "shardlog"))
    p.add_argument("--brokers", type=int, help="local Kafka brokers, when the data directory is new (default 1)")
    p.add_argument("--routers", type=int, default=1, help="routers to start, each on its own wire port (default 1)")
    p.add_argument("--shards", type=int, help="shards to run, s0 .. s<N-1> (default 3; remembered; only adds)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-tracing", action="store_true", help="up: start no Zipkin; the services export no spans")
    a = p.parse_args()
    if a.action == "up":
        up(a.data, a.cluster, a.brokers, routers=a.routers, shards=a.shards, tracing=not a.no_tracing)
    elif a.action == "down":
        down(a.data)
    elif a.action == "reset":
        reset(a.data)
    else:
        status(a.data, a.json)


if __name__ == "__main__":
    main()
