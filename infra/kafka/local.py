#!/usr/bin/env python3
"""A single-node KRaft Apache Kafka broker on 127.0.0.1, from Maven Central jars.

    python infra/kafka/local.py fetch            # jars into the cache (once; offline afterwards)
    python infra/kafka/local.py start [--dir D]  # format + start on free ports, print bootstrap
    python infra/kafka/local.py stop  [--dir D]
    python infra/kafka/local.py status [--dir D]

Standard library only, so it runs before the virtualenv exists.  The broker's
bootstrap address is written to `<dir>/bootstrap`; its pid to `<dir>/kafka.pid`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KAFKA_VERSION = "4.1.1"
CACHE = Path(os.environ.get("SHARDLOG_CACHE", Path.home() / ".cache" / "shardlog")) / f"kafka-{KAFKA_VERSION}"
LIBS = CACHE / "libs"
DEFAULT_DIR = ROOT / ".shardlog" / "kafka"
HEAP = os.environ.get("KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m")
JVM_FLAGS = [
    "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
]

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
        ["mvn", "-B", "-q", "-f", str(HERE / "pom.xml"), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
        check=True,
    )
    shutil.rmtree(LIBS, ignore_errors=True)
    tmp.rename(LIBS)
    marker.touch()
    return LIBS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _pid(d: Path) -> int | None:
    try:
        pid = int((d / "kafka.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _properties(d: Path, port: int, cport: int) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{cport}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(d / "data"),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "min.insync.replicas": "1",
        "default.replication.factor": "1",
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
        # One node is both controller and broker: on a starved 2-core machine a late heartbeat
        # must not fence the only broker (its partitions would have no leader for a while).
        "broker.session.timeout.ms": "60000",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _ready(port: int, log: Path) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass
    except OSError:
        return False
    try:
        return "Kafka Server started" in log.read_text(errors="replace")
    except OSError:
        return False


def start(d: Path, timeout: float = 90.0) -> str:
    d.mkdir(parents=True, exist_ok=True)
    if (pid := _pid(d)) is not None:
        bootstrap = (d / "bootstrap").read_text().strip()
        print(f"local kafka: already running (pid {pid}) at {bootstrap}")
        return bootstrap
    libs = fetch()
    shutil.rmtree(d / "data", ignore_errors=True)
    for f in ("server.log", "bootstrap", "kafka.pid"):
        (d / f).unlink(missing_ok=True)
    port, cport = _free_port(), _free_port()
    props = d / "server.properties"
    props.write_text(_properties(d, port, cport))
    (d / "log4j2.yaml").write_text(LOG4J2)
    cp = f"{libs}/*"
    java = shutil.which("java") or sys.exit("local kafka: java (JDK 17) is needed")
    common = [f"-Dkafka.logs.dir={d}", f"-Dlog4j2.configurationFile={d / 'log4j2.yaml'}", "-cp", cp]
    subprocess.run(
        [java, *common, "kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}", "-c", str(props)],
        check=True, stdout=subprocess.DEVNULL,
    )
    with open(d / "stdout.log", "wb") as out:
        proc = subprocess.Popen(
            [java, *HEAP.split(), *JVM_FLAGS, *common, "kafka.Kafka", str(props)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    (d / "kafka.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not _ready(port, d / "server.log"):
        if proc.poll() is not None:
            sys.exit(f"local kafka: broker exited with {proc.returncode}; see {d / 'server.log'}")
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"local kafka: broker not ready after {timeout:.0f}s; see {d / 'server.log'}")
        time.sleep(0.2)
    bootstrap = f"127.0.0.1:{port}"
    (d / "bootstrap").write_text(bootstrap + "\n")
    print(f"local kafka: Apache Kafka {KAFKA_VERSION} ready at {bootstrap} (pid {proc.pid}, logs {d})")
    return bootstrap


def _cluster_id() -> str:
    # Kafka wants a base64url-encoded 16-byte UUID.
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def stop(d: Path, timeout: float = 30.0) -> None:
    pid = _pid(d)
    if pid is None:
        print("local kafka: not running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    (d / "kafka.pid").unlink(missing_ok=True)
    print(f"local kafka: stopped (pid {pid})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["fetch", "start", "stop", "status"])
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="broker data directory")
    a = p.parse_args()
    if a.action == "fetch":
        print(f"local kafka: jars in {fetch()}")
    elif a.action == "start":
        start(a.dir)
    elif a.action == "stop":
        stop(a.dir)
    else:
        pid = _pid(a.dir)
        if pid is None:
            print("local kafka: not running")
            sys.exit(1)
        print(f"local kafka: running (pid {pid}) at {(a.dir / 'bootstrap').read_text().strip()}")


if __name__ == "__main__":
    main()
