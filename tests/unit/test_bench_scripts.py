"""Every benchmark starts as bench/README.md says to run it (`.venv/bin/python bench/bench_x.py`,
from the repository, no PYTHONPATH): its imports resolve and its options parse.  Two of them
once could not find the repository's packages, which only `make bench` (not CI) would show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "bench").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_benchmark_starts_and_explains_its_options(script, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH, no broker
    out = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
