"""The command processor stays readable (issue 31 §1): each step a function short enough to see
whole, and the modules a decider imports free of Kafka's client and OpenTelemetry."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "libs" / "commands"
MAX_BODY_LINES = 40


def test_no_function_of_the_command_processor_is_longer_than_40_lines():
    long = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
                lines = body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
                if lines > MAX_BODY_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"split these into named steps: {long}"


def test_a_decider_imports_the_processor_package_without_kafka_or_tracing():
    probe = (
        "import sys; from libs.commands import CommandError, Decision, Policy, stamped; "
        "print(sorted(m for m in ('aiokafka', 'opentelemetry') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; import domain.catalog, domain.ddl; print('aiokafka' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "False"
