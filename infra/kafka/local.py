#!/usr/bin/env python3
"""Apache Kafka in KRaft mode on 127.0.0.1, from Maven Central jars: one broker or several.

    python infra/kafka/local.py fetch                         # jars into the cache (once; offline afterwards)
    python infra/kafka/local.py start [--dir D] [--brokers N] [--port P]
    python infra/kafka/local.py stop   [--dir D]
    python infra/kafka/local.py status [--dir D] [--json]
    python infra/kafka/local.py reset  [--dir D]              # stop, then delete every broker's data

Kafka is shardlog's source of truth, so a directory is formatted once, on its
first start, and keeps its logs, cluster id and listener ports from then on:
`stop` then `start` brings back every record.  `start` (re)starts whichever
nodes are not running (after a crash or a kill -9 too) and leaves running ones
alone.  Only `reset` deletes data.

Each node is both broker and controller (combined mode); with `--brokers 3`
the three form one KRaft quorum.  Layout of D:

    cluster.json           cluster id, node ids and ports, fsync policy (written when formatted)
    bootstrap              "127.0.0.1:P1,127.0.0.1:P2,..." (every broker: any one alive is enough)
    node-<id>/             server.properties, data/, server.log, stdout.log, kafka.pid

Standard library only, so it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KAFKA_VERSION = "4.1.1"
CACHE = Path(os.environ.get("SHARDLOG_CACHE", Path.home() / ".cache" / "shardlog")) / f"kafka-{KAFKA_VERSION}"
LIBS = CACHE / "libs"
DEFAULT_DIR = ROOT / ".shardlog" / "kafka"
HEAP = os.environ.get("KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m")
JVM_FLAGS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]
FSYNC_POLICIES = ("always", "os")

LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    RollingFile:
      name: server
      fileName: "${sys:kafka.logs.dir}/server.log"
      filePattern: "${sys:kafka.logs.dir}/server.log.%i"
      PatternLayout: {pattern: "[%d] %p %m (%c)%n"}
      SizeBasedTriggeringPolicy: {size: 20MB}
      DefaultRolloverStrategy: {max: 2}
  Loggers:
    Root:
      level: INFO
      AppenderRef: [{ref: server}]
"""


def fetch() -> Path:
    """Copy the broker's runtime jars into the cache; a second call is a no-op."""
    marker = LIBS / ".complete"
    if marker.exists():
        return LIBS
    if shutil.which("mvn") is None:
        sys.exit("local kafka: Maven (mvn) is needed to fetch the Kafka jars")
    tmp = CACHE / "libs.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"local kafka: fetching Apache Kafka {KAFKA_VERSION} jars with Maven into {LIBS}", flush=True)
    subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(HERE / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ],
        check=True,
    )
    shutil.rmtree(LIBS, ignore_errors=True)
    tmp.rename(LIBS)
    marker.touch()
    return LIBS


# ----------------------------------------------------------------- the layout


@dataclass(frozen=True)
class Node:
    id: int
    port: int  # PLAINTEXT: clients and replication
    controller_port: int  # CONTROLLER: the KRaft quorum


@dataclass(frozen=True)
class Layout:
    cluster_id: str
    nodes: tuple[Node, ...]
    fsync: str = "always"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def save(self, d: Path) -> None:
        tmp = d / "cluster.json.tmp"
        tmp.write_text(
            json.dumps(
                {"cluster_id": self.cluster_id, "fsync": self.fsync, "nodes": [asdict(n) for n in self.nodes]}, indent=1
            )
            + "\n"
        )
        tmp.replace(d / "cluster.json")

    @classmethod
    def load(cls, d: Path) -> Layout | None:
        try:
            raw = json.loads((d / "cluster.json").read_text())
        except FileNotFoundError:
            return None
        return cls(raw["cluster_id"], tuple(Node(**n) for n in raw["nodes"]), raw.get("fsync", "always"))


def node_dir(d: Path, node: Node) -> Path:
    return d / f"node-{node.id}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _choose_ports(brokers: int, base: int) -> list[Node]:
    """Ports base, base+1 for node 1, base+2, base+3 for node 2, ...; free ephemeral ports when
    base is 0 or one of those is taken (a throwaway test broker, another Kafka on 9092)."""
    wanted = [base + i for i in range(2 * brokers)] if base else []
    if wanted and all(_port_free(p) for p in wanted):
        ports = wanted
    else:
        if wanted:
            print(f"local kafka: ports {wanted[0]}-{wanted[-1]} are not all free; using free ports instead")
        ports = []
        while len(ports) < 2 * brokers:
            if (p := _free_port()) not in ports:
                ports.append(p)
    return [Node(i + 1, ports[2 * i], ports[2 * i + 1]) for i in range(brokers)]


def _properties(d: Path, layout: Layout, node: Node) -> str:
    n = len(layout.nodes)
    rf = min(3, n)
    min_isr = 2 if rf >= 3 else 1
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.id),
        "controller.quorum.voters": ",".join(f"{x.id}@127.0.0.1:{x.controller_port}" for x in layout.nodes),
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(node_dir(d, node) / "data"),
        # Kafka's own topics (consumer offsets: our command processors' progress; transaction
        # state) are as replicated as ours: losing them would re-decide committed commands.
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "min.insync.replicas": str(min_isr),
        "default.replication.factor": str(rf),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.partitions": "1",
        "log.cleaner.dedupe.buffer.size": "16777216",
        # Topics are created deliberately by `shardlog topics create` / the runtime:
        # a missing topic is an error we can test, not a silent default.
        "auto.create.topics.enable": "false",
        # Tests create many small topics; keep segments small so disk stays small.
        "log.segment.bytes": str(64 * 1024 * 1024),
        "transaction.max.timeout.ms": "900000",
        # A broker that misses heartbeats for this long is fenced: its partitions have no leader
        # until its next heartbeat unfences it (clients retry through that).  The same timeout
        # bounds a restart after a kill -9: the restarted node cannot register until the old
        # registration's session has expired, and a controller that starts gives every
        # registered broker a fresh session.  Kafka's default is 9 s; 60 s (to spare a starved
        # node a fencing) made a restart wait a minute.  5 s with a heartbeat every 0.5 s takes
        # a stall of ten missed heartbeats to fence, and a restart waits 5 s.
        "broker.session.timeout.ms": os.environ.get("KAFKA_BROKER_SESSION_TIMEOUT_MS", "5000"),
        "broker.heartbeat.interval.ms": "500",
        # A clean stop hands leadership over first; do not let that wait longer than `stop` does.
        "controlled.shutdown.enable": "true",
    }
    if layout.fsync == "always":
        # Acknowledge a write only once it is on disk (every partition, Kafka's own topics too):
        # a power loss then costs no acknowledged write.  See the README, "Durability".
        props["log.flush.interval.messages"] = "1"
    return "".join(f"{k}={v}\n" for k, v in props.items())


# ------------------------------------------------------------ processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def node_pid(d: Path, node: Node) -> int | None:
    try:
        pid = int((node_dir(d, node) / "kafka.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _java_common(nd: Path) -> list[str]:
    java = shutil.which("java") or sys.exit("local kafka: java (JDK 17) is needed")
    return [java, f"-Dkafka.logs.dir={nd}", f"-Dlog4j2.configurationFile={nd / 'log4j2.yaml'}", "-cp", f"{fetch()}/*"]


def _format(d: Path, layout: Layout) -> None:
    for node in layout.nodes:
        nd = node_dir(d, node)
        nd.mkdir(parents=True, exist_ok=True)
        (nd / "server.properties").write_text(_properties(d, layout, node))
        (nd / "log4j2.yaml").write_text(LOG4J2)
        subprocess.run(
            [
                *_java_common(nd),
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                f"--cluster-id={layout.cluster_id}",
                "-c",
                str(nd / "server.properties"),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    layout.save(d)  # last: a directory without it is not formatted (a crash during format starts over)


def _adopt_legacy(d: Path) -> Layout | None:
    """A directory from before restarts kept data (one node: D/server.properties, D/data):
    move it into node-1/ with its ports and cluster id rather than lose its records."""
    props, data = d / "server.properties", d / "data"
    if not (props.exists() and (data / "meta.properties").exists()):
        return None
    conf = dict(line.split("=", 1) for line in props.read_text().splitlines() if "=" in line)
    meta = dict(line.split("=", 1) for line in (data / "meta.properties").read_text().splitlines() if "=" in line)
    port = int(conf["advertised.listeners"].rsplit(":", 1)[1])
    cport = int(conf["controller.quorum.voters"].rsplit(":", 1)[1])
    layout = Layout(meta["cluster.id"].strip(), (Node(1, port, cport),))
    nd = node_dir(d, layout.nodes[0])
    nd.mkdir(parents=True, exist_ok=True)
    data.rename(nd / "data")
    for f in ("server.properties", "log4j2.yaml", "server.log", "stdout.log", "kafka.pid", "bootstrap"):
        (d / f).unlink(missing_ok=True)
    (nd / "server.properties").write_text(_properties(d, layout, layout.nodes[0]))
    (nd / "log4j2.yaml").write_text(LOG4J2)
    layout.save(d)
    print(f"local kafka: moved the broker's data in {d} into {nd} (the layout that keeps it across restarts)")
    return layout


def _started_since(log: Path, offset: int) -> bool:
    try:
        with open(log, "rb") as f:
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0  # the log rolled over since
            f.seek(offset)
            return b"Kafka Server started" in f.read()
    except OSError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start(d: Path, brokers: int | None = None, port: int = 0, fsync: str | None = None, timeout: float = 120.0) -> str:
    """Start every node of the cluster in `d` that is not running; format `d` on its first start."""
    d = d.resolve()
    d.mkdir(parents=True, exist_ok=True)
    layout = Layout.load(d) or _adopt_legacy(d)
    if layout is None:
        n = brokers or 1
        layout = Layout(_cluster_id(), tuple(_choose_ports(n, port)), fsync or "always")
        print(f"local kafka: formatting a new {n}-broker cluster in {d}")
        _format(d, layout)
    elif brokers is not None and brokers != len(layout.nodes):
        sys.exit(
            f"local kafka: {d} holds a {len(layout.nodes)}-broker cluster with its data; it cannot become a "
            f"{brokers}-broker one in place. Run with BROKERS={len(layout.nodes)}, or `make reset` "
            f"(deletes every document) and start again with BROKERS={brokers}."
        )
    elif fsync is not None and fsync != layout.fsync:
        layout = Layout(layout.cluster_id, layout.nodes, fsync)
        layout.save(d)
    launched: dict[Node, tuple[subprocess.Popen, int]] = {}  # node -> (process, server.log size at launch)
    for node in layout.nodes:
        nd = node_dir(d, node)
        if (pid := node_pid(d, node)) is not None:
            print(f"local kafka: broker {node.id} already running (pid {pid}) at 127.0.0.1:{node.port}")
            continue
        for p in (node.port, node.controller_port):
            if not _port_free(p):
                sys.exit(
                    f"local kafka: port {p} of broker {node.id} is in use by another program. The broker keeps "
                    f"its ports (clients and `KAFKA_BOOTSTRAP` know them): stop that program, or `make reset` "
                    f"(deletes every document) to start over on new ports."
                )
        # Written anew each start, so changed settings (fsync, timeouts) apply to existing data too.
        (nd / "server.properties").write_text(_properties(d, layout, node))
        (nd / "log4j2.yaml").write_text(LOG4J2)
        log = nd / "server.log"
        offset = log.stat().st_size if log.exists() else 0
        with open(nd / "stdout.log", "ab") as out:
            java, *common = _java_common(nd)
            proc = subprocess.Popen(
                [java, *HEAP.split(), *JVM_FLAGS, *common, "kafka.Kafka", str(nd / "server.properties")],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (nd / "kafka.pid").write_text(str(proc.pid))
        launched[node] = (proc, offset)
    (d / "bootstrap").write_text(layout.bootstrap + "\n")
    deadline = time.monotonic() + timeout
    waiting = dict(launched)
    t0 = time.monotonic()
    while waiting:
        for node, (proc, offset) in list(waiting.items()):
            log = node_dir(d, node) / "server.log"
            if _accepts(node.port) and _started_since(log, offset):
                print(
                    f"local kafka: broker {node.id} ready at 127.0.0.1:{node.port} (pid {proc.pid}, "
                    f"{time.monotonic() - t0:.1f}s)"
                )
                del waiting[node]
            elif proc.poll() is not None:
                sys.exit(f"local kafka: broker {node.id} exited with {proc.returncode}; see {log}")
        if waiting and time.monotonic() > deadline:
            for proc, _ in waiting.values():
                proc.kill()
            sys.exit(
                f"local kafka: broker(s) {sorted(n.id for n in waiting)} not ready after {timeout:.0f}s; see {d}/node-*/server.log"
            )
        time.sleep(0.2)
    print(
        f"local kafka: Apache Kafka {KAFKA_VERSION}, {len(layout.nodes)} broker(s), ready at {layout.bootstrap} "
        f"(data in {d}, fsync {layout.fsync})"
    )
    return layout.bootstrap


def _cluster_id() -> str:
    # Kafka wants a base64url-encoded 16-byte UUID.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def stop(d: Path, timeout: float = 60.0, node_ids: list[int] | None = None) -> None:
    """SIGTERM (a clean, controlled shutdown) to every running node at once; SIGKILL after `timeout`."""
    layout = Layout.load(d)
    if layout is None:
        print("local kafka: not running")
        return
    pids = {
        n: pid for n in layout.nodes if (node_ids is None or n.id in node_ids) and (pid := node_pid(d, n)) is not None
    }
    if not pids:
        print("local kafka: not running")
        return
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for node, pid in pids.items():
        how = "stopped"
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            how = f"killed (no clean stop within {timeout:.0f}s)"
        (node_dir(d, node) / "kafka.pid").unlink(missing_ok=True)
        print(f"local kafka: broker {node.id} {how} (pid {pid})")


def controller_leader(d: Path) -> int | None:
    """The KRaft controller leader as a running node's quorum-state file records it, if alive."""
    layout = Layout.load(d)
    for node in layout.nodes if layout else ():
        if node_pid(d, node) is None:
            continue
        try:
            leader = json.loads((node_dir(d, node) / "data" / "__cluster_metadata-0" / "quorum-state").read_text())
        except (OSError, ValueError):
            continue
        lid = leader.get("leaderId", -1)
        if any(n.id == lid and node_pid(d, n) is not None for n in layout.nodes):
            return lid
    return None


def status(d: Path) -> dict:
    layout = Layout.load(d)
    if layout is None:
        return {"formatted": False, "dir": str(d), "brokers": []}
    pids = {n: node_pid(d, n) for n in layout.nodes}
    return {
        "formatted": True,
        "dir": str(d),
        "clusterId": layout.cluster_id,
        "bootstrap": layout.bootstrap,
        "fsync": layout.fsync,
        "brokers": [
            {
                "id": n.id,
                "port": n.port,
                "controllerPort": n.controller_port,
                "pid": pid,
                "running": pid is not None,
            }
            for n, pid in pids.items()
        ],
    }


def reset(d: Path) -> None:
    d = d.resolve()
    stop(d)
    if d.exists():
        shutil.rmtree(d)
        print(f"local kafka: deleted {d} (every broker's logs: all topics, offsets and transactions)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["fetch", "start", "stop", "status", "reset"])
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the cluster's directory")
    p.add_argument("--brokers", type=int, help="number of brokers when formatting (default 1); must match after")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="first listener port when formatting (node i: port+2(i-1), controller +1); 0: free ports",
    )
    p.add_argument(
        "--fsync",
        choices=FSYNC_POLICIES,
        help="always: acknowledge only what is on disk (default); os: leave flushing to the OS",
    )
    p.add_argument("--node", type=int, action="append", help="with stop: only these node ids")
    p.add_argument("--json", action="store_true", help="with status: JSON")
    a = p.parse_args()
    if a.brokers is not None and a.brokers < 1:
        p.error("--brokers must be at least 1")
    if a.action == "fetch":
        print(f"local kafka: jars in {fetch()}")
    elif a.action == "start":
        start(a.dir, a.brokers, a.port, a.fsync)
    elif a.action == "stop":
        stop(a.dir, node_ids=a.node)
    elif a.action == "reset":
        reset(a.dir)
    else:
        st = status(a.dir)
        if a.json:
            print(json.dumps(st))
        elif not st["formatted"]:
            print(f"local kafka: no cluster in {a.dir}")
        else:
            for b in st["brokers"]:
                state = f"running (pid {b['pid']})" if b["running"] else "not running"
                print(f"local kafka: broker {b['id']} at 127.0.0.1:{b['port']} {state}")
        if not st["brokers"] or not all(b["running"] for b in st["brokers"]):
            sys.exit(1)


if __name__ == "__main__":
    main()
