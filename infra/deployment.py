"""A local deployment driven the way `make up/down/reset` drive it, on a data directory of its
own with brokers on free ports: for the tests and benchmarks that stop, kill and restart
brokers (tests/test_durability.py, bench/bench_durability.py).  The caller decides what a
failure means (an assertion, an exit)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from infra.kafka import local

ROOT = Path(__file__).resolve().parent.parent


class LocalDeployment:
    def __init__(self, data: Path, cluster: str, brokers: int | None = None, env: dict[str, str] | None = None):
        self.data, self.cluster, self.brokers = data, cluster, brokers
        # Never someone else's broker: KAFKA_BOOTSTRAP would make `up` start none.
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"},
            "KAFKA_PORT": "0",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }

    def python(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *argv], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def cluster_action(self, action: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`python -m infra.cluster ACTION` on this deployment; `up` with its broker count."""
        if action == "up" and self.brokers:
            args = ("--brokers", str(self.brokers), *args)
        return self.python(
            "-m", "infra.cluster", action, "--data", str(self.data), "--cluster", self.cluster, *args, timeout=timeout
        )

    def shardlog(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """The `shardlog` CLI against this deployment."""
        return self.python(
            "-m", "cli.main", "--bootstrap", self.bootstrap, "--cluster", self.cluster, *args, timeout=timeout
        )

    def local_kafka(self, *args: str) -> subprocess.CompletedProcess:
        return self.python(str(ROOT / "infra" / "kafka" / "local.py"), *args, "--dir", str(self.kafka_dir))

    @property
    def kafka_dir(self) -> Path:
        return self.data / "kafka"

    @property
    def bootstrap(self) -> str:
        return (self.kafka_dir / "bootstrap").read_text().strip()

    def broker_pids(self) -> dict[int, int]:
        """Node id -> the pid its pid file names (alive or not)."""
        return {int(f.parent.name.split("-")[1]): int(f.read_text()) for f in self.kafka_dir.glob("node-*/kafka.pid")}

    def service_pids(self) -> dict[str, int]:
        return {f.stem: int(f.read_text()) for f in (self.data / "pids").glob("*.pid")}

    def controller_leader(self) -> int | None:
        return local.controller_leader(self.kafka_dir)


def partition_leaders(bootstrap: str, topics: list[str]) -> dict[str, dict]:
    """Partition 0 of each topic: its leader, replicas and in-sync replicas (node ids)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def go() -> dict[str, dict]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            out = {}
            for t in await admin.describe_topics(topics):
                p = t["partitions"][0]
                out[t["topic"]] = {"leader": p["leader"], "replicas": p["replicas"], "isr": p["isr"]}
            return out
        finally:
            await admin.close()

    return asyncio.run(go())


def topic_config(bootstrap: str, topic: str, name: str) -> str:
    """One configuration value of a topic, as the brokers report it."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def go() -> str:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (res,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {name: None})])
            return str(res.to_object()["resources"][0]["config_entries"][0]["config_value"])
        finally:
            await admin.close()

    return asyncio.run(go())
