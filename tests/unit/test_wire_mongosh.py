"""mongosh (MongoDB's shell, from the npm registry via `make mongosh`) against the wire
skeleton: its legacy OP_QUERY handshake, its start-up commands, a ping."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_wire_server import Running

ROOT = Path(__file__).resolve().parents[2]


def _mongosh() -> str:
    """The pinned mongosh, installed by `make mongosh` (a no-op once it is in the cache)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("mongosh needs Node.js and npm, and this machine has neither node nor npm on PATH")
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "mongosh", "print-mongosh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"make mongosh failed:\n{done.stdout}\n{done.stderr}"
    path = done.stdout.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), f"make mongosh did not leave an executable at {path}"
    return path


@pytest.fixture(scope="module")
def mongosh() -> str:
    return _mongosh()


def _eval(mongosh: str, port: int, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [mongosh, f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=5000", "--quiet", "--norc", "--eval", script],
        capture_output=True,
        text=True,
        timeout=60,
        # --quiet skips mongosh's update check; this keeps its telemetry off: tests talk to localhost only
        env={**os.environ, "MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING": "1"},
    )


def test_mongosh_pings_the_skeleton(mongosh):
    running = Running()
    try:
        done = _eval(mongosh, running.port, "db.runCommand({ping: 1}).ok")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1"
        done = _eval(mongosh, running.port, "const h = db.hello(); print(h.msg, h.maxWireVersion, db.version())")
        assert done.stdout.strip() == "isdbgrid 25 8.0.0", done.stderr
    finally:
        running.stop()


def test_mongosh_talks_zlib_when_the_router_offers_it(mongosh):
    running = Running(compressors=("zlib",))
    try:
        script = "print(db.runCommand({ping: 1}).ok, db.adminCommand({buildInfo: 1}).version)"
        done = subprocess.run(
            [
                mongosh,
                f"mongodb://127.0.0.1:{running.port}/?serverSelectionTimeoutMS=5000&compressors=zlib",
                "--quiet",
                "--norc",
                "--eval",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING": "1"},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1 8.0.0"
        # the Node driver negotiated zlib and compressed its commands (not the handshake)
        assert running.server.compressed_requests >= 2
    finally:
        running.stop()
