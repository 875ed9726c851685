"""What a MongoDB operator hits on day one, the small differences and the text (issue 18, points 9 and 12)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.balancer import violation_line
from cli.main import app
from cli.migrations import aborted_message, moved_line
from cli.status import status_document
from domain import sharding_commands as sc
from domain.catalog import Catalog
from domain.protocol import ErrorCode, split_ns
from domain.settings import Window, in_window
from domain.shardkey import MAX_KEY, MIN_KEY, shell_form, shell_range
from libs.errors import CommandError
from schemas import config as c
from services.balancer import policy
from services.config.decide import decide


def apply(cat: Catalog, cmd: c.Record) -> tuple[list, dict]:
    d = decide(cat, cmd)
    for e in d.events:
        cat.apply(e, cat.config_time)
    return d.events, d.result


def refused(cat: Catalog, cmd: c.Record) -> CommandError:
    with pytest.raises(CommandError) as e:
        decide(cat, cmd)
    return e.value


def sharded(key: dict | None = None) -> Catalog:
    cat = Catalog(track_changes=False)
    for s in ("s0", "s1"):
        apply(cat, c.AddShard(shard=s))
    apply(cat, c.ShardCollection(ns="d.x", key=key or {"k": 1}))
    return cat


# ---------------------------------------------------------------- point 9: namespaces


@pytest.mark.parametrize("ns", ["db..c", "db...", "db..", "db.", ".c", "db"])
def test_an_empty_or_dotted_collection_name_is_an_invalid_namespace(ns):
    with pytest.raises(CommandError) as e:
        split_ns(ns)
    assert (e.value.code, ErrorCode.InvalidNamespace.number) == ("InvalidNamespace", 73)
    with pytest.raises(CommandError) as e:  # a wire command naming it the same way
        sc.namespace({"shardCollection": ns})
    assert e.value.code == "InvalidNamespace"


@given(st.text(min_size=1, max_size=20).map(lambda s: "." + s))
def test_no_collection_name_starts_with_a_dot(coll):
    with pytest.raises(CommandError):
        split_ns(f"db.{coll}")


def test_the_config_server_creates_nothing_for_db_dot_dot_c():
    cat = sharded()
    err = refused(cat, c.CreateCollection(ns="db..c"))
    assert err.code == "InvalidNamespace" and "db" not in cat.databases
    assert refused(cat, c.ShardCollection(ns="db..c", key={"k": 1})).code == "InvalidNamespace"


def test_dotted_names_inside_a_collection_name_stay_valid():
    assert split_ns("db.c.d") == ("db", "c.d")
    assert split_ns("db.c.") == ("db", "c.")


# ---------------------------------------------------------------- point 9: zones


def test_removing_a_zone_range_that_is_not_there_is_ok():
    cat = sharded()
    apply(cat, c.AddShardToZone(shard="s0", zone="EU"))
    events, result = apply(cat, c.RemoveZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}))
    assert events == [] and result == {"ns": "d.x", "zone": None}
    apply(cat, c.AssignZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}, zone="EU"))
    assert apply(cat, c.RemoveZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}))[0] != []
    assert apply(cat, c.RemoveZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}))[0] == []  # again: ok
    assert cat.collections["d.x"].zones == []


# ---------------------------------------------------------------- point 9: the balancing window


@pytest.mark.parametrize(
    ("given_", "stored"), [("8:00", "08:00"), ("08:00", "08:00"), ("0:05", "00:05"), ("23:59", "23:59")]
)
def test_a_window_accepts_h_mm_as_mongodb_writes_it(given_, stored):
    cat = sharded()
    _, result = apply(
        cat,
        c.SetSetting(
            key="balancerWindow",
            value={"start": given_, "stop": "23:59" if stored != "23:59" else "01:00", "timeZone": "UTC"},
        ),
    )
    assert result["value"]["start"] == stored
    assert cat.settings.balancerWindow is not None and cat.settings.balancerWindow.start == stored


def test_h_mm_compares_as_a_time_of_day():
    w = Window(start="8:00", stop="17:00", timeZone="UTC")  # "8:00" > "17:00" as text: wrapped by mistake
    assert in_window(w, dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC))
    assert not in_window(w, dt.datetime(2026, 1, 1, 7, 59, tzinfo=dt.UTC))


def test_a_window_whose_start_equals_its_stop_is_refused():
    cat = sharded()
    for start, stop in (("08:00", "08:00"), ("8:00", "08:00")):
        err = refused(cat, c.SetSetting(key="balancerWindow", value={"start": start, "stop": stop, "timeZone": "UTC"}))
        assert err.code == "BadValue" and "empty window" in err.message
    assert cat.settings.balancerWindow is None


# ---------------------------------------------------------------- point 9: status --at


def test_status_at_a_negative_config_time_is_one_line():
    r = CliRunner().invoke(app, ["--bootstrap", "127.0.0.1:1", "--cluster", "unit", "status", "--at", "-5"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "BadValue" in lines[0] and "--at" in lines[0], r.output
    assert "Traceback" not in r.output


# ---------------------------------------------------------------- point 12: the text


def test_bounds_in_mongosh_form():
    assert shell_range({"x": 1000}, {"x": MAX_KEY}) == "{ x: 1000 } -->> { x: MaxKey }"
    assert shell_form({"x": MIN_KEY, "a.b": "eu"}) == "{ x: MinKey, 'a.b': 'eu' }"
    assert shell_form({"x": {"$maxKey": 1}}) == "{ x: MaxKey }"  # Extended JSON in, same text
    assert (
        shell_form({"u": {"$numberLong": "5"}, "l": [1, None, True], "e": {}})
        == "{ u: Long('5'), l: [ 1, null, true ], e: {} }"
    )


def test_refusals_print_bounds_as_mongosh_does_not_as_python():
    cat = sharded()
    apply(cat, c.SplitChunk(ns="d.x", at=[{"k": 10}]))
    err = refused(cat, c.SplitChunk(ns="d.x", at=[{"k": 10}]))
    assert "{'" not in err.message and "$minKey" not in err.message, err.message
    err = refused(cat, c.MergeChunks(ns="d.x", min={"k": 5}, max={"k": 10}))
    assert "min { k: 5 } is not the lower bound of a chunk" in err.message
    err = refused(cat, c.SplitChunk(ns="d.x", at=[{"j": 10}]))
    assert "{'" not in err.message and "['k']" not in err.message, err.message


def test_status_lists_chunk_ranges_without_verbose():
    cat = sharded()
    apply(cat, c.SplitChunk(ns="d.x", at=[{"k": 1000}]))
    doc = status_document(cat, True)
    ranges = [shell_range(ch["min"], ch["max"]) for ch in doc["collections"][0]["chunks"]]
    assert ranges == ["{ k: MinKey } -->> { k: 1000 }", "{ k: 1000 } -->> { k: MaxKey }"]


def test_the_status_command_prints_them(tmp_path, monkeypatch):
    from cli import status as status_cli

    printed: list[str] = []

    class Out:
        def print(self, x, **kw):
            printed.append(str(x))

    cat = sharded()
    apply(cat, c.SplitChunk(ns="d.x", at=[{"k": 1000}]))
    coll = status_document(cat, True)["collections"][0]
    status_cli._print_collection(Out(), coll, verbose=False)  # type: ignore[arg-type]
    text = "\n".join(printed)
    assert "{ k: MinKey } -->> { k: 1000 } on : s0 Timestamp(" in text
    assert "{ k: 1000 } -->> { k: MaxKey } on : s0 Timestamp(" in text


def test_a_jumbo_violation_says_jumbo_once_with_its_range():
    s = {
        "shards": [{"id": "s0"}, {"id": "s1"}],
        "collections": [
            {
                "ns": "d.x",
                "key": {"k": 1},
                "chunks": [
                    {"min": {"k": {"$minKey": 1}}, "max": {"k": 5}, "shard": "s0", "sizeBytes": 1, "jumbo": True},
                    {"min": {"k": 5}, "max": {"k": {"$maxKey": 1}}, "shard": "s1", "sizeBytes": 1},
                ],
            }
        ],
    }
    (v,) = [v for v in policy.violations(s, "d.x") if v.reason == "jumbo"]
    line = violation_line(v.to_json())
    assert line.count("jumbo") == 1, line
    assert line.startswith("  jumbo { k: MinKey } -->> { k: 5 } on s0: the balancer does not move it")


def test_an_abort_says_aborted_once():
    # The config server's outcome text is "aborted: <code>: <reason>"; a summary without a reason field.
    msg = aborted_message(
        "m1",
        {
            "outcome": "aborted: ConflictingOperationInProgress: migrations are off",
            "min": {"x": 1},
            "max": {"x": {"$maxKey": 1}},
        },
    )
    assert (
        msg == "migration m1 ({ x: 1 } -->> { x: MaxKey }) aborted: ConflictingOperationInProgress: migrations are off"
    )
    msg = aborted_message("m1", {"outcome": "aborted: x", "code": "C", "reason": "migrations are off"})
    assert msg.count("aborted") == 1 and msg.endswith("aborted: migrations are off")


def test_a_move_summary_has_its_range_and_a_duration():
    line = moved_line(
        "d.x",
        "s0",
        "s1",
        {"min": {"x": 1000}, "max": {"x": {"$maxKey": 1}}, "progress": {"cloned": 3, "mods": 0}},
        2.345,
        False,
    )
    assert line == "moved { x: 1000 } -->> { x: MaxKey } of d.x s0 -> s1: 3 documents cloned, 0 modifications, 2.3 s"
    assert "?" not in line


@pytest.mark.parametrize(
    "args", [["workload", "run", "ycsb-a", "--ops", "1"], ["workload", "load", "ycsb", "--records", "1"]]
)
def test_the_cli_refuses_db_dot_dot_c_before_any_io(args):
    r = CliRunner().invoke(app, ["--bootstrap", "127.0.0.1:1", "--cluster", "unit", *args, "--ns", "db..c"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "InvalidNamespace" in lines[0] and "'db..c'" in lines[0], r.output
