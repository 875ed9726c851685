#!/usr/bin/env python3
"""Zipkin, the tracing UI `make up` starts: its server's executable jar from Maven Central.

    python infra/zipkin/local.py fetch                       # the jar into the cache (once; offline afterwards)
    python infra/zipkin/local.py start  [--dir D] [--port P]  # waits for /health
    python infra/zipkin/local.py stop   [--dir D]
    python infra/zipkin/local.py status [--dir D] [--json]

One JVM (JDK 17) with in-memory storage: traces are a view of recent work, not data, so a
restart forgets them and nothing is written to disk but D/zipkin.log and D/zipkin.pid.  The
UI is at http://127.0.0.1:P/zipkin/ and spans are accepted at /api/v2/spans.  Settings (env):
ZIPKIN_PORT (9411; 0: any free port), ZIPKIN_HEAP (-Xmx256m), ZIPKIN_MEM_MAX_SPANS (50000: the oldest traces
go first), SHARDLOG_CACHE (the cache, ~/.cache/shardlog).

Standard library only, so it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ZIPKIN_VERSION = "3.6.1"
MAVEN = os.environ.get("SHARDLOG_MAVEN_REPO", "https://repo1.maven.org/maven2")
JAR_URL = f"{MAVEN}/io/zipkin/zipkin-server/{ZIPKIN_VERSION}/zipkin-server-{ZIPKIN_VERSION}-exec.jar"
CACHE = Path(os.environ.get("SHARDLOG_CACHE", Path.home() / ".cache" / "shardlog")) / f"zipkin-{ZIPKIN_VERSION}"
JAR = CACHE / f"zipkin-server-{ZIPKIN_VERSION}-exec.jar"
DEFAULT_DIR = ROOT / ".shardlog" / "zipkin"
DEFAULT_PORT = int(os.environ.get("ZIPKIN_PORT", "9411"))
HEAP = os.environ.get("ZIPKIN_HEAP", "-Xmx256m")
MAX_SPANS = os.environ.get("ZIPKIN_MEM_MAX_SPANS", "50000")


def fetch() -> Path:
    """Download the jar into the cache, checked against the SHA-256 Maven Central publishes;
    a second call is a no-op."""
    if JAR.exists():
        return JAR
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"local zipkin: fetching {JAR_URL} into {CACHE}", flush=True)
    with urllib.request.urlopen(f"{JAR_URL}.sha256", timeout=60) as r:
        want = r.read().decode().split()[0].strip().lower()
    tmp = JAR.with_suffix(".partial")
    digest = hashlib.sha256()
    with urllib.request.urlopen(JAR_URL, timeout=60) as r, open(tmp, "wb") as out:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != want:
        tmp.unlink(missing_ok=True)
        sys.exit(f"local zipkin: {JAR_URL} has SHA-256 {digest.hexdigest()}, Maven Central says {want}; not kept")
    tmp.rename(JAR)  # last: a partial download is never taken for the jar
    return JAR


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def pid(d: Path) -> int | None:
    try:
        p = int((d / "zipkin.pid").read_text())
    except (OSError, ValueError):
        return None
    return p if _alive(p) else None


def port(d: Path) -> int | None:
    try:
        return int((d / "zipkin.port").read_text())
    except (OSError, ValueError):
        return None


def healthy(p: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{p}/health", timeout=timeout) as r:
            return bool(r.status == 200 and json.loads(r.read()).get("status") == "UP")
    except (OSError, ValueError, urllib.error.URLError):
        return False


def ui_url(p: int) -> str:
    return f"http://127.0.0.1:{p}/zipkin/"


def spans_url(p: int) -> str:
    return f"http://127.0.0.1:{p}/api/v2/spans"


def start(d: Path, p: int = DEFAULT_PORT, timeout: float = 120.0) -> int:
    """Start Zipkin on 127.0.0.1:p unless it runs already; return its port once /health says UP."""
    d = d.resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (running := pid(d)) is not None and (q := port(d)) is not None:
        print(f"local zipkin: up (pid {running}) at {ui_url(q)}, left as it is")
        return q
    java = shutil.which("java") or sys.exit("local zipkin: java (JDK 17) is needed")
    if p == 0:  # any free port (tests run side by side, next to a dev cluster on 9411)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
    if healthy(p, 0.5):
        sys.exit(f"local zipkin: port {p} already answers /health (another Zipkin?); set ZIPKIN_PORT or stop it")
    jar = fetch()
    env = {**os.environ, "STORAGE_TYPE": "mem", "MEM_MAX_SPANS": MAX_SPANS, "QUERY_PORT": str(p)}
    with open(d / "zipkin.log", "ab") as out:
        proc = subprocess.Popen(
            [java, *HEAP.split(), "-XX:+UseSerialGC", "-Djava.awt.headless=true", "-jar", str(jar),
             "--server.address=127.0.0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    (d / "zipkin.pid").write_text(str(proc.pid))
    (d / "zipkin.port").write_text(str(p))
    t0 = time.monotonic()
    while not healthy(p):
        if proc.poll() is not None:
            sys.exit(f"local zipkin: exited with {proc.returncode}; see {d / 'zipkin.log'}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            sys.exit(f"local zipkin: not healthy after {timeout:.0f}s; see {d / 'zipkin.log'}")
        time.sleep(0.3)
    print(f"local zipkin: Zipkin {ZIPKIN_VERSION} ready at {ui_url(p)} (pid {proc.pid}, {time.monotonic() - t0:.1f}s)")
    return p


def stop(d: Path, timeout: float = 20.0) -> None:
    d = d.resolve()
    running = pid(d)
    if running is None:
        print("local zipkin: not running")
    else:
        os.kill(running, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(running) and time.monotonic() < deadline:
            time.sleep(0.1)
        how = "stopped"
        if _alive(running):
            os.kill(running, signal.SIGKILL)
            how = f"killed (no clean stop within {timeout:.0f}s)"
        print(f"local zipkin: {how} (pid {running}); its traces are gone (in-memory storage)")
    (d / "zipkin.pid").unlink(missing_ok=True)


def status(d: Path) -> dict:
    d = d.resolve()
    p, q = pid(d), port(d)
    return {"running": p is not None, "pid": p, "port": q, "ui": ui_url(q) if p and q else None}


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("action", choices=["fetch", "start", "stop", "status"])
    a.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="pid, port and log files")
    a.add_argument("--port", type=int, default=DEFAULT_PORT, help="the UI's and the span collector's port")
    a.add_argument("--json", action="store_true", help="with status: JSON")
    args = a.parse_args()
    if args.action == "fetch":
        print(f"local zipkin: jar at {fetch()}")
    elif args.action == "start":
        start(args.dir, args.port)
    elif args.action == "stop":
        stop(args.dir)
    else:
        st = status(args.dir)
        if args.json:
            print(json.dumps(st))
        else:
            print(
                f"local zipkin: running (pid {st['pid']}) at {st['ui']}"
                if st["running"]
                else "local zipkin: not running"
            )
        if not st["running"]:
            sys.exit(1)


if __name__ == "__main__":
    main()
