"""issue 31 §1: the pure domain loads neither Kafka's client nor OpenTelemetry (CommandError and
the header names live in modules of their own, libs/errors.py and libs/headers.py), so the
simulator and the unit tests can import it without them.  Each module is imported in a fresh
interpreter: another test's imports cannot hide a regression."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[2] / "domain"
# Readers of Kafka that live in domain/ for now (issue 37 moves them out): not pure by nature.
KAFKA_READERS = {"follower", "logical_sessions", "shard_statistics"}
PURE = sorted(p.stem for p in DOMAIN.glob("*.py") if p.stem != "__init__" and p.stem not in KAFKA_READERS)

PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('aiokafka', 'opentelemetry'))}))
"""


@pytest.mark.parametrize("module", PURE)
def test_a_pure_domain_module_loads_no_kafka_client_and_no_tracing(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, f"domain.{module}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=DOMAIN.parent,
    ).stdout
    assert out.strip() == "[]", f"domain.{module} loads {out.strip()}"
