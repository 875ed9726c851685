"""`make up` / `make down` on a real broker: every service starts, replays and
reports ready; a second `up` is harmless; `down` stops everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.kafka


def run(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "infra.cluster", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def test_up_twice_then_down(bootstrap, tmp_path):
    cluster = f"up{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "PYTHONPATH": str(ROOT)}
    data = tmp_path / "cluster"
    try:
        first = run("up", "--data", str(data), "--cluster", cluster, env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        for name in ("config", "shard-s0", "shard-s1", "shard-s2", "router", "balancer", "range-deleter", "dashboard"):
            assert f"{name}" in first.stdout and "ready" in first.stdout
        assert "The cluster page (shards, chunks, migrations, balancer): http://127.0.0.1:" in first.stdout
        pids = {p.stem: int(p.read_text()) for p in (data / "pids").glob("*.pid")}
        assert len(pids) == 8
        second = run("up", "--data", str(data), "--cluster", cluster, env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert second.stdout.count("already running") == 8
        assert {p.stem: int(p.read_text()) for p in (data / "pids").glob("*.pid")} == pids
        status = subprocess.run(
            [sys.executable, "-m", "cli.main", "--bootstrap", bootstrap, "--cluster", cluster, "status", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert [s["id"] for s in json.loads(status.stdout)["shards"]] == ["s0", "s1", "s2"]
    finally:
        down = run("down", "--data", str(data), env=env)
    assert down.returncode == 0, down.stderr
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
