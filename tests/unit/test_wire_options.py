"""issue 38 §1: every field of a CRUD command is honoured or refused before the command runs
(services/router/wire/options.py): an unknown field is IDLUnknownField (40415), an option
shardlog does not implement is NotImplemented (238) unless its value changes nothing, and the
generic arguments (maxTimeMS, writeConcern, readConcern, apiVersion) are checked for every
command.  Driven through the command table with no cluster attached: a command that passes
every check reaches its handler, which then says it has no cluster (CommandNotFound)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import services.router.wire  # noqa: F401  (registers every command)
from domain.protocol import ErrorCode
from libs.errors import CommandError
from services.router.wire.commands import SERVER_COMMANDS, CommandTable, Connection
from services.router.wire.options import Fields, check_write_concern, write_concern_error

REACHED_HANDLER = 59  # CommandNotFound: the handler ran and found no cluster attached


def reply(cmd: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(SERVER_COMMANDS(Connection(id=1, peer="test"), {**cmd, "$db": cmd.get("$db", "app")}))


def code(cmd: dict[str, Any]) -> int:
    r = reply(cmd)
    assert r["ok"] == 0, r
    return int(r["code"])


@pytest.mark.parametrize(
    "cmd",
    [
        {"find": "c", "bogus": 1},
        {"insert": "c", "documents": [{}], "upsert": True},
        {"update": "c", "updates": [{"q": {}, "u": {}}], "multi": True},  # multi belongs in a statement
        {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "justOne": True},
        {"count": "c", "filter": {}},  # count's filter is `query`
        {"distinct": "c", "key": "a", "filter": {}},
        {"findAndModify": "c", "query": {}, "remove": True, "returnDocument": "after"},
        {"aggregate": "c", "pipeline": [], "cursor": {}, "maxTime": 5},
        {"aggregate": "c", "pipeline": [], "cursor": {"batchSize": 1, "size": 2}},
        {"getMore": 1, "collection": "c", "batchsize": 1},
        {"killCursors": "c", "cursors": [], "all": True},
        {"explain": {"find": "c", "bogus": 1}},
    ],
)
def test_an_unknown_field_is_idl_unknown_field(cmd: dict[str, Any]) -> None:
    r = reply(cmd)
    assert (r["ok"], r["code"], r["codeName"]) == (0, 40415, "IDLUnknownField"), r
    assert "is an unknown field" in r["errmsg"]


@pytest.mark.parametrize(
    "cmd",
    [
        {"find": "c", "collation": {"locale": "fr", "strength": 1}},
        {"find": "c", "min": {"a": 1}, "hint": {"a": 1}},
        {"find": "c", "max": {"a": 1}, "hint": {"a": 1}},
        {"find": "c", "returnKey": True},
        {"find": "c", "showRecordId": True},
        {"find": "c", "tailable": True},
        {"find": "c", "allowPartialResults": True},
        {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "collation": {"locale": "en"}}]},
        {"delete": "c", "deletes": [{"q": {}, "limit": 1, "collation": {"locale": "en"}}]},
        {"count": "c", "collation": {"locale": "en"}},
        {"distinct": "c", "key": "a", "collation": {"locale": "en"}},
        {"findAndModify": "c", "remove": True, "collation": {"locale": "en"}},
        {"aggregate": "c", "pipeline": [], "cursor": {}, "collation": {"locale": "en"}},
        {"explain": {"find": "c", "collation": {"locale": "en"}}},
    ],
)
def test_an_option_shardlog_does_not_implement_is_refused(cmd: dict[str, Any]) -> None:
    r = reply(cmd)
    assert (r["ok"], r["code"], r["codeName"]) == (0, 238, "NotImplemented"), r
    assert "not supported by shardlog" in r["errmsg"]


@pytest.mark.parametrize(
    "cmd",
    [
        {"find": "c", "collation": {"locale": "simple"}, "returnKey": False, "showRecordId": False},
        {"find": "c", "noCursorTimeout": True, "allowDiskUse": True, "let": {"x": 1}, "min": {}},
        {"update": "c", "updates": [{"q": {}, "u": {}, "arrayFilters": [], "collation": {"locale": "simple"}}]},
        {"insert": "c", "documents": [{}], "bypassDocumentValidation": True, "writeConcern": {"w": "majority"}},
        {"insert": "c", "documents": [{}], "writeConcern": {"w": 1, "j": True, "wtimeout": 100}},
        {"find": "c", "maxTimeMS": 1000, "comment": "why", "apiVersion": "1", "apiStrict": True},
        {"find": "c", "readConcern": {"level": "majority"}},
        {"insert": "c", "documents": [{}], "readConcern": {"level": "local"}},  # a causal session's write
        {"aggregate": "c", "pipeline": [], "cursor": {"batchSize": 5}, "hint": "a_1", "let": {}},
    ],
)
def test_a_neutral_or_honoured_value_reaches_the_handler(cmd: dict[str, Any]) -> None:
    assert code(cmd) == REACHED_HANDLER


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ({"find": "c", "maxTimeMS": -1}, 2),
        ({"find": "c", "maxTimeMS": "x"}, 2),
        ({"find": "c", "writeConcern": {"w": 1}}, 72),  # a read takes no writeConcern
        ({"insert": "c", "documents": [{}], "readConcern": {"level": "majority"}}, 72),
        ({"insert": "c", "documents": [{}], "readConcern": {"level": "snapshot"}}, 72),
        ({"insert": "c", "documents": [{}], "writeConcern": {"w": 3}}, 100),
        ({"insert": "c", "documents": [{}], "writeConcern": {"w": "dc1"}}, 79),
        ({"insert": "c", "documents": [{}], "writeConcern": {"w": 1, "x": 1}}, 9),
        ({"find": "c", "apiVersion": "2"}, 322),
        ({"find": "c", "apiStrict": True}, 72),  # apiStrict without apiVersion
        ({"distinct": "c", "key": "a", "apiVersion": "1", "apiStrict": True}, 323),
        ({"find": "c", "let": 5}, 14),
        ({"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "sort": {"a": 1}, "multi": True}]}, 72),
    ],
)
def test_generic_arguments_are_checked_for_every_command(cmd: dict[str, Any], expected: int) -> None:
    assert code(cmd) == expected


def test_write_concern_shapes() -> None:
    for ok in ({}, {"w": 0}, {"w": 1}, {"w": "majority", "wtimeout": 0}, {"j": False}):
        check_write_concern("insert", ok)
    for bad in (5, {"w": True}, {"w": -1}, {"j": "yes"}, {"wtimeout": "x"}):
        with pytest.raises(CommandError):
            check_write_concern("insert", bad)
    # Malformed beats unsatisfiable: a decision with {w: 10, wtimeout: "x"} is refused, not applied.
    with pytest.raises(CommandError) as e:
        check_write_concern("commitTransaction", {"w": 10, "wtimeout": "x"})
    assert e.value.code == ErrorCode.FailedToParse
    assert write_concern_error("commitTransaction", {"writeConcern": {"w": 10, "wtimeout": "x"}}) is None
    assert write_concern_error("commitTransaction", {"writeConcern": {"w": 10}}).code == (
        ErrorCode.UnsatisfiableWriteConcern
    )


def test_max_time_ms_is_enforced() -> None:
    """A command still running when its maxTimeMS passes is answered MaxTimeMSExpired (50); one
    that finishes in time is answered as usual."""
    table = CommandTable("test")
    never = asyncio.Event()

    @table.register("stuck", fields=Fields("stuck", {}))
    async def _stuck(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        await never.wait()  # nothing sets it: only maxTimeMS ends this command
        return {}

    @table.register("quick", fields=Fields("quick", {}))
    async def _quick(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    async def run(cmd: dict[str, Any]) -> dict[str, Any]:
        return await table(Connection(id=1, peer="test"), {**cmd, "$db": "app"})

    r = asyncio.run(run({"stuck": 1, "maxTimeMS": 20}))
    assert (r["ok"], r["code"], r["codeName"]) == (0, 50, "MaxTimeMSExpired")
    assert asyncio.run(run({"quick": 1, "maxTimeMS": 60_000})) == {"done": True, "ok": 1.0}
    assert asyncio.run(run({"quick": 1, "maxTimeMS": 0}))["ok"] == 1.0  # 0: no limit
