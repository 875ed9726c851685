"""`make up` / `make down`: a local broker and a demo cluster as background processes.

    python -m infra.cluster up   [--data .shardlog] [--cluster shardlog]
    python -m infra.cluster down [--data .shardlog]

Logs in <data>/logs/<service>.log, pids in <data>/pids/, service stores in
<data>/services/.  `up` twice is harmless: what runs is left running.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL_KAFKA = ROOT / "infra" / "kafka" / "local.py"
SHARDS = ("s0", "s1", "s2")


def services() -> dict[str, list[str]]:
    out = {"config": ["services.config"]}
    out.update({f"shard-{s}": ["services.shard", "--shard-id", s] for s in SHARDS})
    out.update({"router": ["services.router"], "balancer": ["services.balancer"],
                "range-deleter": ["services.range_deleter"]})
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


def _bootstrap(data: Path) -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"]
    subprocess.run([sys.executable, str(LOCAL_KAFKA), "start", "--dir", str(data / "kafka")], check=True)
    return (data / "kafka" / "bootstrap").read_text().strip()


async def _add_shards(bootstrap: str, cluster: str) -> None:
    from libs import kafka
    from libs.requests import Requester
    from libs.topics import Topics
    from schemas.config import AddShard

    t = Topics(cluster)
    await kafka.ensure_topics(bootstrap, [*t.core(), *(s for sh in SHARDS for s in t.for_shard(sh))])
    async with Requester(bootstrap, t.cli_replies, client_id="make-up") as r:
        for s in SHARDS:
            reply = await r.request(t.config_commands, AddShard(shard=s), timeout=60)
            if not reply.ok and reply.code != "ShardAlreadyExists":
                raise SystemExit(f"make up: add-shard {s}: {reply.code}: {reply.error}")


def up(data: Path, cluster: str, timeout: float = 120.0) -> None:
    data = data.resolve()
    bootstrap = _bootstrap(data)
    for d in ("logs", "pids", "services"):
        (data / d).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "SHARDLOG_CLUSTER": cluster,
           "SHARDLOG_DATA_DIR": str(data / "services"), "PYTHONPATH": str(ROOT)}
    asyncio.run(_ensure_core_topics(bootstrap, cluster))
    started: dict[str, int] = {}
    for name, argv in services().items():
        pidfile = data / "pids" / f"{name}.pid"
        if (pid := _pid(pidfile)) is not None:
            print(f"  {name:14} already running (pid {pid})")
            continue
        (data / "services" / f"{name}.ready").unlink(missing_ok=True)
        with open(data / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        pidfile.write_text(str(proc.pid))
        started[name] = proc.pid
    deadline = time.monotonic() + timeout
    for name, pid in started.items():
        ready = data / "services" / f"{name}.ready"
        while not (ready.exists() and json.loads(ready.read_text()).get("pid") == pid):
            if not _alive(pid):
                raise SystemExit(f"make up: {name} exited; see {data / 'logs' / (name + '.log')}")
            if time.monotonic() > deadline:
                raise SystemExit(f"make up: {name} not ready after {timeout:.0f}s; see {data / 'logs' / (name + '.log')}")
            time.sleep(0.2)
        print(f"  {name:14} ready (pid {pid})")
    asyncio.run(_add_shards(bootstrap, cluster))
    print(f"""
shardlog cluster {cluster!r} is up: Kafka at {bootstrap}, config server, shards {', '.join(SHARDS)},
router, balancer, range-deleter.  Logs: {data / 'logs'}

  export KAFKA_BOOTSTRAP={bootstrap} SHARDLOG_CLUSTER={cluster}
  .venv/bin/shardlog status
  .venv/bin/shardlog shard-collection app.users --key '{{"_id": "hashed"}}'
  .venv/bin/shardlog insert app.users '[{{"_id": 1, "name": "ada"}}, {{"_id": 2, "name": "bob"}}]'
  .venv/bin/shardlog find app.users '{{}}' --sort '{{"_id": 1}}'
  .venv/bin/shardlog status --verbose
  make down
""")


async def _ensure_core_topics(bootstrap: str, cluster: str) -> None:
    from libs import kafka
    from libs.topics import Topics
    await kafka.ensure_topics(bootstrap, Topics(cluster).core())


def down(data: Path) -> None:
    data = data.resolve()
    for pidfile in sorted((data / "pids").glob("*.pid")) if (data / "pids").exists() else []:
        pid = _pid(pidfile)
        if pid is not None:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
            print(f"  {pidfile.stem:14} stopped")
        pidfile.unlink(missing_ok=True)
    if not os.environ.get("KAFKA_BOOTSTRAP"):
        subprocess.run([sys.executable, str(LOCAL_KAFKA), "stop", "--dir", str(data / "kafka")], check=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--data", type=Path, default=ROOT / ".shardlog")
    p.add_argument("--cluster", default=os.environ.get("SHARDLOG_CLUSTER", "shardlog"))
    a = p.parse_args()
    up(a.data, a.cluster) if a.action == "up" else down(a.data)


if __name__ == "__main__":
    main()
