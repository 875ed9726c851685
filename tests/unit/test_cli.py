"""The shardlog CLI without a broker: its command tree, and the error shapes of input it refuses
before any I/O (one stderr line for humans, one JSON line with --json, in the command's own mode)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

# The cluster is never reached: every case fails on its input first.
BASE = ["--bootstrap", "127.0.0.1:1", "--cluster", "unit"]

TOP_LEVEL = [
    "dead-letters",
    "add-shard",
    "remove-shard",
    "create-database",
    "shard-collection",
    "split",
    "merge",
    "insert",
    "find",
    "count",
    "explain",
    "update",
    "delete",
    "status",
    "range-deletions",
    "sessions",
    "move-range",
    "move-chunk",
    "move-primary",
    "abort-move-primary",
    "set-allow-migrations",
    "defragment",
    "drop-collection",
    "drop-database",
    "rename-collection",
    "refine-shard-key",
    "dashboard",
    "top",
    "zone",
    "settings",
    "topics",
    "workload",
    "balancer",
    "ddl",
    "index",
]


def invoke(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


def test_the_command_tree_and_its_order():
    root = typer.main.get_command(app)
    assert root.list_commands(typer.Context(root)) == TOP_LEVEL  # the order `shardlog --help` shows
    assert invoke("--help").exit_code == 0
    for group in ("zone", "settings", "topics", "workload", "balancer", "index"):
        assert invoke(group, "--help").exit_code == 0, group


REFUSED = [
    (("--cluster", "bad name", "status"), "BadValue", "invalid cluster name 'bad name'"),
    (("shard-collection", "a.b", "--key", "{bad"), "FailedToParse", "invalid JSON for --key"),
    (("shard-collection", "a.b", "--key", "[1]"), "TypeMismatch", "--key must be a document"),
    (("shard-collection", "a.b", "--key", "{}"), "BadValue", "the shard key must be a non-empty object"),
    (("split", "a.b"), "BadValue", "give --at POINT (repeatable) or --find DOC"),
    (("find", "a.b", "[1]"), "TypeMismatch", "the filter must be a document"),
    (("balancer", "window", "--start", "01:00"), "BadValue", "give --start, --stop and --time-zone"),
    (("workload", "run", "ycsb-z", "--ops", "1"), "BadValue", "unknown workload 'ycsb-z'"),
    (("index", "create", "a.b", '{"x": "text"}'), "CannotCreateIndex", "text indexes are not supported"),
    (("index", "create", "a.b", "{bad"), "FailedToParse", "invalid JSON for KEY"),
    (("index", "create", "a.b", '{"x": 1}', "--sparse", "--partial", '{"x": 1}'), "CannotCreateIndex", "sparse"),
    (("index", "create", "a.system.b", '{"x": 1}'), "InvalidNamespace", "invalid collection name"),
    (("index", "drop", "a.b"), "BadValue", "give one of NAME, --all or --key"),
    (("index", "drop", "a.b", "x_1", "--all"), "BadValue", "give one of NAME, --all or --key"),
    (("index", "drop", "a.b", "--key", "{}"), "IndexNotFound", "can't find index with key"),
    (
        ("workload", "load", "ycsb", "--records", "1", "--ns", "nodot"),
        "InvalidNamespace",
        "expected 'database.collection'",
    ),
]


@pytest.mark.parametrize("args,code,message", REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_refused_input_is_one_line_or_one_json_document(args, code, message):
    human = invoke(*args)
    assert human.exit_code == 2
    lines = [ln for ln in human.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: ") and message in lines[0], human.stderr
    as_json = invoke(*args, "--json")
    assert as_json.exit_code == 2
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["code"] == code and message in doc["error"], as_json.stdout


def test_each_invocation_has_its_own_context():
    """No state survives an invocation: a --json run does not make the next run JSON."""
    assert json.loads(invoke("split", "a.b", "--json").stdout)["code"] == "BadValue"
    r = invoke("split", "a.b")
    assert r.stdout == "" and r.stderr.startswith("error: BadValue:")
