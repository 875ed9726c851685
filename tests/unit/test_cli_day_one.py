"""The CLI's JSON arguments (issue 18, points 5, 6 and 10), without a broker: every JSON argument of
every command, whatever JSON (or not-JSON) it is given, ends in one error line or gets past its
parse; the parse keeps NaN, Infinity and Extended JSON; documents come from an argument, a file or
standard input, as one document, an array or JSON Lines."""

from __future__ import annotations

import json
import math

import pytest
from bson import Decimal128, Int64, ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.context import parse_document, parse_documents, parse_object
from cli.main import app
from libs.errors import CommandError

# An invalid cluster name is refused where the cluster is first needed, after every argument is
# parsed and before any I/O: that refusal means "the arguments were good".
BASE = ["--bootstrap", "127.0.0.1:1", "--cluster", "bad name"]
PARSED = "invalid cluster name"

# Every command with a JSON argument, the argument given as V (the others valid).
COMMANDS: list[tuple[str, ...]] = [
    ("insert", "a.b", "V"),
    ("find", "a.b", "V"),
    ("find", "a.b", "{}", "--sort", "V"),
    ("find", "a.b", "{}", "--projection", "V"),
    ("count", "a.b", "V"),
    ("explain", "a.b", "V"),
    ("update", "a.b", "V", '{"$set": {"x": 1}}'),
    ("update", "a.b", "{}", "V", "--multi"),
    ("delete", "a.b", "V"),
    ("shard-collection", "a.b", "--key", "V"),
    ("split", "a.b", "--at", "V"),
    ("split", "a.b", "--find", "V"),
    ("merge", "a.b", "--min", "V", "--max", '{"x": 1}'),
    ("merge", "a.b", "--min", '{"x": 1}', "--max", "V"),
    ("move-range", "a.b", "--min", "V", "--to", "s1"),
    ("move-range", "a.b", "--min", '{"x": 1}', "--max", "V", "--to", "s1"),
    ("move-chunk", "a.b", "--find", "V", "--to", "s1"),
    ("refine-shard-key", "a.b", "V"),
    ("zone", "add-range", "a.b", "--min", "V", "--max", '{"x": 1}', "--zone", "Z"),
    ("zone", "add-range", "a.b", "--min", '{"x": 1}', "--max", "V", "--zone", "Z"),
    ("zone", "remove-range", "a.b", "--min", "V", "--max", '{"x": 1}'),
    ("settings", "set", "chunkSize", "V"),
]


def invoke(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


def one_line(args: list[str]) -> tuple[str, str]:
    """Run the command in both output modes: each must end in one error (never a traceback); its code and message."""
    human = invoke(*args)
    assert isinstance(human.exception, SystemExit) and human.exit_code != 0, (args, human.exception)
    lines = [ln for ln in human.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, human.stderr)
    as_json = invoke(*args, "--json")
    assert isinstance(as_json.exception, SystemExit) and as_json.exit_code == human.exit_code, (args, as_json.stderr)
    answer = json.loads(as_json.stdout)
    assert answer["ok"] is False and lines[0] == f"error: {answer['code']}: {answer['error']}", (answer, lines)
    return answer["code"], answer["error"]


@pytest.mark.parametrize(
    "args,code",
    [
        (("insert", "a.b", "42"), "TypeMismatch"),
        (("insert", "a.b", "[1, 2]"), "TypeMismatch"),
        (("insert", "a.b", "[]"), "InvalidLength"),
        (("insert", "a.b", '{"_id": {"$oid": "zz"}}'), "FailedToParse"),
        (("insert", "a.b", '{"x": {"$numberLong": "5"'), "FailedToParse"),
        (("insert", "a.b", '{"a\\u0000b": 1}'), "BadValue"),
        (("find", "a.b", "{}", "--projection", "[1]"), "TypeMismatch"),
        (("find", "a.b", '{"$oid": "65a1b2c3d4e5f60718293a4b"}'), "TypeMismatch"),
        (("zone", "add-range", "a.b", "--min", "[]", "--max", "{}", "--zone", "Z"), "TypeMismatch"),
        (("update", "a.b", "{}", "[1]"), "TypeMismatch"),
        (("delete", "a.b", "null"), "TypeMismatch"),
        (("insert", "a.b", '{"x": 1}', "--file", "-"), "BadValue"),
        (("insert", "a.b"), "BadValue"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else a,
)
def test_the_issue_s_inputs_are_one_line_errors(args, code):
    assert one_line(list(args))[0] == code


def test_good_arguments_get_past_their_parse():
    for args in [
        ("insert", "a.b", '{"uid": NaN, "big": 1e400}'),
        ("update", "a.b", '{"uid": {"$numberLong": "5"}}', '{"$set": {"n": -Infinity}}', "--upsert"),
        ("delete", "a.b", '{"at": {"$date": "2024-01-01T00:00:00Z"}}', "--multi"),
        ("zone", "add-range", "a.b", "--min", '{"x": {"$minKey": 1}}', "--max", '{"x": 0}', "--zone", "Z"),
    ]:
        code, message = one_line(list(args))
        assert (code, PARSED) == ("BadValue", message[: len(PARSED)]), (args, message)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
_keys = st.one_of(st.text(max_size=6), st.sampled_from(["$oid", "$numberLong", "$date", "$minKey", "$set", "_id", "x"]))
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=8,
)
_text = st.one_of(_json.map(json.dumps), st.text(max_size=12))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command=st.sampled_from(COMMANDS), text=_text)
def test_any_json_in_any_argument_is_one_line_error_or_parsed(command, text):
    # A leading blank keeps "-0" an argument rather than an unknown option (the shell user writes `--`).
    code, message = one_line([f" {text}" if a == "V" else a for a in command])
    assert code in ("FailedToParse", "TypeMismatch", "BadValue", "InvalidLength", "InvalidOptions"), (code, message)


@given(text=_text)
def test_the_parse_gives_the_shape_or_a_command_error(text):
    for parse in (parse_document, parse_object):
        try:
            assert isinstance(parse(text, "V"), dict)
        except CommandError as e:
            assert e.code in ("FailedToParse", "TypeMismatch", "BadValue"), e
    try:
        docs = parse_documents(text, "V")
        assert docs and all(isinstance(d, dict) for d in docs)
    except CommandError as e:
        assert e.code in ("FailedToParse", "TypeMismatch", "BadValue", "InvalidLength"), e


def test_nan_infinity_big_numbers_and_extended_json_are_kept():
    doc = parse_document(
        '{"n": NaN, "i": 1e400, "m": -Infinity, "l": {"$numberLong": "5"}, "d": {"$numberDouble": "NaN"},'
        ' "big": 123456789012345678901234567890, "o": {"$oid": "65a1b2c3d4e5f60718293a4b"},'
        ' "dec": {"$numberDecimal": "1.5"}, "i64": 9223372036854775807}',
        "V",
    )
    assert math.isnan(doc["n"]) and math.isnan(doc["d"]) and doc["i"] == math.inf and doc["m"] == -math.inf
    assert type(doc["l"]) is Int64 and doc["l"] == 5
    assert doc["big"] == 1.2345678901234568e29 and type(doc["big"]) is float  # beyond int64: a double, as mongosh
    assert doc["o"] == ObjectId("65a1b2c3d4e5f60718293a4b") and doc["dec"] == Decimal128("1.5")
    assert doc["i64"] == 2**63 - 1 and type(doc["i64"]) is int


def test_documents_as_one_an_array_or_lines():
    assert parse_documents('{"a": 1}', "V") == [{"a": 1}]
    assert parse_documents('[{"a": 1}, {"a": 2}]', "V") == [{"a": 1}, {"a": 2}]
    assert parse_documents('{\n  "a": 1\n}\n', "V") == [{"a": 1}]  # one document over several lines
    assert parse_documents('{"a": 1}\n\n{"a": {"$numberLong": "2"}}\n', "V") == [{"a": 1}, {"a": Int64(2)}]
    with pytest.raises(CommandError) as e:
        parse_documents('{"a": 1}\n[2]\n', "V")
    assert e.value.code == "TypeMismatch" and "line 2 of V" in e.value.message


def test_documents_from_a_file_and_stdin(tmp_path):
    path = tmp_path / "docs.json"
    path.write_text('[{"a": 1}, 7]')
    code, message = one_line(["insert", "a.b", "--file", str(path)])
    assert code == "TypeMismatch" and "document 1 of" in message
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert one_line(["insert", "a.b", "--file", str(path)])[1].startswith(PARSED)
    assert one_line(["insert", "a.b", "--file", str(tmp_path / "none.json")])[0] == "BadValue"
    r = CliRunner().invoke(app, [*BASE, "insert", "a.b", "--file", "-"], input='{"a": 1}\n5\n')
    assert r.exit_code == 2 and "line 2 of standard input" in r.stderr, r.stderr


def test_an_unreachable_broker_is_one_line():
    r = CliRunner().invoke(app, ["--bootstrap", "127.0.0.1:1", "--cluster", "unit", "find", "a.b"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: KafkaUnavailable: "), r.stderr
