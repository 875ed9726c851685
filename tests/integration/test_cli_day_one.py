"""The shardlog CLI's documents against a real cluster (issue 18, points 5, 6 and 10): bad input is
one line and changes nothing, NaN / Infinity / Extended JSON survive the round trip, update and
delete, documents from a file or stdin, and what an ordered or unordered bulk failure reports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from bson import Int64

from tests.conftest import ROOT, cli

pytestmark = pytest.mark.kafka


def cli_in(settings, *args: str, stdin: str) -> subprocess.CompletedProcess:
    """The real command line with `stdin` on its standard input."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "--bootstrap", settings.bootstrap, "--cluster", settings.cluster, *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def one_line_error(r: subprocess.CompletedProcess, code: str) -> None:
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: "), r.stderr


def test_bad_input_is_one_line_and_changes_nothing(settings, data_cluster):
    assert cli(settings, "insert", "bad.c", '{"_id": 0, "x": 1}').returncode == 0
    for args, code in [
        (("insert", "bad.c", "42"), "TypeMismatch"),
        (("insert", "bad.c", "[1, 2]"), "TypeMismatch"),
        (("insert", "bad.c", '[{"_id": 1}, 2]'), "TypeMismatch"),
        (("insert", "bad.c", '{"_id": {"$oid": "zz"}}'), "FailedToParse"),
        (("find", "bad.c", "{}", "--projection", "[1]"), "TypeMismatch"),
        (("find", "bad.c", "{}", "--sort", '"x"'), "TypeMismatch"),
        (("update", "bad.c", "{}", "[1]"), "TypeMismatch"),
        (("delete", "bad.c", "7"), "TypeMismatch"),
        (("zone", "add-range", "bad.c", "--min", "[]", "--max", "{}", "--zone", "Z"), "TypeMismatch"),
    ]:
        one_line_error(cli(settings, *args), code)
        as_json = cli(settings, *args, "--json")
        assert as_json.returncode != 0 and "Traceback" not in as_json.stderr, as_json.stderr
        answer = json.loads(as_json.stdout)
        assert answer["ok"] is False and answer["code"] == code, answer
    # well-formed documents the cluster refuses: its error, one line
    for args in [
        ("update", "bad.c", "{}", '{"$nope": {"x": 1}}'),
        ("update", "bad.c", "{}", '{"$set": {"x": 2}, "y": 1}'),
        ("update", "bad.c", "{}", '{"y": 1}', "--multi"),  # MongoDB: no multi replacement
        ("find", "bad.c", "{}", "--sort", '{"x": "up"}'),
        ("find", "bad.c", '{"x": {"$in": 5}}'),
        ("insert", "bad.c", '{"_id": 0}'),
        ("delete", "bad.c", '{"$where": "x"}'),
    ]:
        r = cli(settings, *args)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (args, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
    r = cli(settings, "find", "bad.c", "--json")
    assert json.loads(r.stdout)["docs"] == [{"_id": 0, "x": 1}], r.stdout


def test_nan_infinity_and_extended_json_are_kept(settings, data_cluster):
    docs = [
        '{"_id": 1, "region": "eu", "uid": NaN}',
        '{"_id": 2, "uid": 1e400}',
        '{"_id": 3, "uid": -Infinity}',
        '{"_id": 4, "uid": {"$numberLong": "5"}}',
        '{"_id": 5, "uid": {"$numberDouble": "NaN"}, "at": {"$date": "2024-01-02T03:04:05Z"}, '
        '"o": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "d": {"$numberDecimal": "1.5"}}',
    ]
    for d in docs:
        r = cli(settings, "insert", "cdb.c", d)
        assert r.returncode == 0, r.stderr
    coll = data_cluster.mongo_client()["cdb"]["c"]
    stored = {d["_id"]: d for d in coll.find({})}
    assert math.isnan(stored[1]["uid"]) and math.isnan(stored[5]["uid"]), stored
    assert stored[2]["uid"] == math.inf and stored[3]["uid"] == -math.inf, stored
    assert type(stored[4]["uid"]) is Int64 and stored[4]["uid"] == 5, stored
    assert str(stored[5]["o"]) == "65a1b2c3d4e5f60718293a4b" and str(stored[5]["d"]) == "1.5", stored
    # a plain 5 matches the int64 5; NaN matches NaN, as in MongoDB
    found = json.loads(cli(settings, "find", "cdb.c", '{"uid": 5}', "--json").stdout)["docs"]
    assert found == [{"_id": 4, "uid": {"$numberLong": "5"}}], found
    nan = json.loads(cli(settings, "find", "cdb.c", '{"uid": NaN}', "--sort", '{"_id": 1}', "--json").stdout)
    assert [d["_id"] for d in nan["docs"]] == [1, 5], nan
    assert nan["docs"][0]["uid"] == {"$numberDouble": "NaN"}, nan
    inf = json.loads(cli(settings, "find", "cdb.c", '{"_id": 2}', "--json").stdout)["docs"]
    assert inf == [{"_id": 2, "uid": {"$numberDouble": "Infinity"}}], inf
    human = cli(settings, "find", "cdb.c", '{"_id": 3}')
    assert '"$numberDouble": "-Infinity"' in human.stdout, human.stdout

    # updates keep them too
    r = cli(settings, "update", "cdb.c", '{"_id": 4}', '{"$set": {"v": Infinity, "w": {"$numberLong": "9"}}}')
    assert r.returncode == 0, r.stderr
    doc = coll.find_one({"_id": 4})
    assert doc["v"] == math.inf and type(doc["w"]) is Int64 and doc["w"] == 9, doc

    # as shard-key values: routed, split on and found
    assert cli(settings, "shard-collection", "cdb.s", "--key", '{"uid": 1}').returncode == 0
    assert cli(settings, "split", "cdb.s", "--at", '{"uid": 5}').returncode == 0
    r = cli(
        settings,
        "insert",
        "cdb.s",
        '[{"_id": 1, "uid": NaN}, {"_id": 2, "uid": Infinity}, '
        '{"_id": 3, "uid": {"$numberLong": "5"}}, {"_id": 4, "uid": -1e400}]',
    )
    assert r.returncode == 0, r.stderr
    up = json.loads(cli(settings, "find", "cdb.s", '{"uid": {"$gte": 5}}', "--sort", '{"uid": 1}', "--json").stdout)
    assert [d["_id"] for d in up["docs"]] == [3, 2], up
    low = json.loads(cli(settings, "find", "cdb.s", '{"uid": {"$lt": 5}}', "--json").stdout)
    assert [d["_id"] for d in low["docs"]] == [4], low  # NaN is below every number but matches no range


def test_update_and_delete(settings, data_cluster):
    r = cli(settings, "insert", "u.c", '[{"_id": 1, "g": "a"}, {"_id": 2, "g": "a"}, {"_id": 3, "g": "b"}]')
    assert r.returncode == 0, r.stderr

    one = json.loads(cli(settings, "update", "u.c", '{"g": "a"}', '{"$set": {"n": 1}}', "--json").stdout)
    assert (one["matched"], one["modified"]) == (1, 1), one
    many = cli(settings, "update", "u.c", '{"g": "a"}', '{"$set": {"n": 2}}', "--multi", "--json")
    assert (json.loads(many.stdout)["matched"], json.loads(many.stdout)["modified"]) == (2, 2), many.stdout
    same = json.loads(cli(settings, "update", "u.c", '{"g": "a"}', '{"$set": {"n": 2}}', "--multi", "--json").stdout)
    assert (same["matched"], same["modified"]) == (2, 0), same
    up = json.loads(cli(settings, "update", "u.c", '{"_id": 9}', '{"$set": {"g": "z"}}', "--upsert", "--json").stdout)
    assert (up["matched"], up["modified"], up["upsertedId"]) == (0, 0, 9), up
    human = cli(settings, "update", "u.c", '{"_id": 3}', '{"$inc": {"n": 1}}')
    assert human.returncode == 0 and "matched 1, modified 1" in human.stdout, human.stdout

    gone = json.loads(cli(settings, "delete", "u.c", '{"g": "a"}', "--json").stdout)
    assert gone["deleted"] == 1, gone
    rest = cli(settings, "delete", "u.c", "{}", "--multi")
    assert rest.returncode == 0 and "deleted 3 document(s)" in rest.stdout, rest.stdout
    assert json.loads(cli(settings, "count", "u.c", "--json").stdout)["n"] == 0


def test_documents_from_a_file_or_stdin(settings, data_cluster, tmp_path):
    big = {"_id": "big", "blob": "x" * 200_000}  # over the command line's limit for one argument
    path = tmp_path / "docs.json"
    path.write_text(json.dumps([big, {"_id": "small"}]))
    r = cli(settings, "insert", "f.c", "--file", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["inserted"] == 2
    lines = '{"_id": 1}\n{"_id": 2, "n": {"$numberLong": "7"}}\n\n{"_id": 3}\n'
    r = cli_in(settings, "insert", "f.c", "--file", "-", "--json", stdin=lines)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["insertedIds"] == [1, 2, 3]
    assert json.loads(cli(settings, "count", "f.c", "--json").stdout)["n"] == 5
    doc = data_cluster.mongo_client()["f"]["c"].find_one({"_id": "big"})
    assert doc == big
    bad = cli_in(settings, "insert", "f.c", "--file", "-", stdin='{"_id": 4}\n[5]\n')
    one_line_error(bad, "TypeMismatch")
    assert "line 2" in bad.stderr, bad.stderr


def test_ordered_and_unordered_bulk_failures_say_which_documents_went_in(settings, data_cluster):
    assert cli(settings, "insert", "b.c", '{"_id": 2}').returncode == 0
    batch = '[{"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 2}, {"_id": 4}]'

    ordered = cli(settings, "insert", "b.c", batch, "--json")
    assert ordered.returncode != 0
    o = json.loads(ordered.stdout)
    assert o["ok"] is False and o["code"] == "BulkWriteError", o
    assert o["nInserted"] == 1 and [(e["index"], e["code"]) for e in o["writeErrors"]] == [(1, "DuplicateKey")], o
    human = cli(settings, "insert", "b2.c", '[{"_id": 1}, {"_id": 1}, {"_id": 2}]')
    one_line_error(human, "BulkWriteError")
    assert "ordered insert stopped at document 1" in human.stderr and "1 of 3 inserted" in human.stderr, human.stderr

    unordered = cli(settings, "insert", "b3.c", batch, "--unordered", "--json")
    u = json.loads(unordered.stdout)
    assert u["ok"] is False and u["nInserted"] == 4, u
    assert [(e["index"], e["code"]) for e in u["writeErrors"]] == [(3, "DuplicateKey")], u
    human = cli(settings, "insert", "b4.c", batch, "--unordered")
    one_line_error(human, "BulkWriteError")
    assert "unordered insert refused document(s) 3" in human.stderr and "4 of 5 inserted" in human.stderr, human.stderr
    ids = sorted(d["_id"] for d in data_cluster.mongo_client()["b"]["c"].find({}))
    assert ids == [1, 2]
