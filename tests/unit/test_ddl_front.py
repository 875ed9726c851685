"""The DDL commands' front (issue 13): the wire's command documents -> the DDL request records,
with MongoDB's codes for bad input; the replies mongos gives; the currentOp entries of running
coordinators; the start-and-await loop the wire and the CLI share, against a scripted config
server; and the CLI's refusals and --json shape without a broker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.ddl import outcome_line, progress_line, run_document, target
from cli.main import app
from domain import ddl_client
from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import Record
from schemas import ddl as d
from schemas.reply import Reply


def refused(fn, *args) -> CommandError:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return e.value


def code_of(fn, *args) -> int | None:
    return ErrorCode(refused(fn, *args).code).number


# ------------------------------------------------------------------ parsing command documents


def test_drop_names_the_collection_of_the_command_database():
    assert sc.parse_drop({"drop": "c", "$db": "app", "writeConcern": {"w": 1}, "lsid": {}}) == d.DropCollection(
        ns="app.c"
    )


@pytest.mark.parametrize(
    "cmd,code",
    [
        ({"drop": 1, "$db": "app"}, 73),  # InvalidNamespace
        ({"drop": "", "$db": "app"}, 73),
        ({"drop": "system.views", "$db": "app"}, 73),
        ({"drop": "c", "$db": "admin"}, 73),
        ({"drop": "c", "$db": "app", "force": True}, 40415),  # IDLUnknownField
    ],
)
def test_drop_refuses(cmd, code):
    assert code_of(sc.parse_drop, cmd) == code


def test_drop_database():
    assert sc.parse_drop_database({"dropDatabase": 1, "$db": "app"}) == d.DropDatabase(db="app")
    assert code_of(sc.parse_drop_database, {"dropDatabase": 1, "$db": "admin"}) == 20  # IllegalOperation
    assert code_of(sc.parse_drop_database, {"dropDatabase": 1, "$db": "local"}) == 20
    assert code_of(sc.parse_drop_database, {"dropDatabase": "yes", "$db": "app"}) == 14  # TypeMismatch
    assert code_of(sc.parse_drop_database, {"dropDatabase": 1, "$db": "app", "x": 1}) == 40415


def test_rename_collection():
    cmd = {"renameCollection": "app.a", "to": "app.b", "dropTarget": True, "$db": "admin"}
    assert sc.parse_rename_collection(cmd) == d.RenameCollection(ns="app.a", to="app.b", dropTarget=True)
    plain = {"renameCollection": "app.a", "to": "app.b", "stayTemp": False, "$db": "admin"}
    assert sc.parse_rename_collection(plain).dropTarget is False


@pytest.mark.parametrize(
    "fields,code",
    [
        ({"to": "other.b"}, 125),  # CommandFailed: across databases
        ({"to": "app.a"}, 20),  # IllegalOperation: to itself
        ({}, 40414),  # IDLFailedToParse: `to` missing
        ({"to": 5}, 14),  # TypeMismatch
        ({"to": "nodot"}, 73),  # InvalidNamespace
        ({"to": "app.b", "dropTarget": "yes"}, 14),
        ({"to": "app.b", "collation": {}}, 40415),
        ({"to": "app.system.x"}, 73),
    ],
)
def test_rename_collection_refuses(fields, code):
    assert code_of(sc.parse_rename_collection, {"renameCollection": "app.a", **fields, "$db": "admin"}) == code


def test_rename_collection_source_must_be_a_namespace():
    assert code_of(sc.parse_rename_collection, {"renameCollection": "a", "to": "a.b", "$db": "admin"}) == 73
    assert code_of(sc.parse_rename_collection, {"renameCollection": 3, "to": "a.b", "$db": "admin"}) == 73


def test_refine_collection_shard_key():
    cmd = {"refineCollectionShardKey": "app.c", "key": {"x": 1, "y": 1}, "$db": "admin"}
    assert sc.parse_refine_collection_shard_key(cmd) == d.RefineCollectionShardKey(ns="app.c", key={"x": 1, "y": 1})
    base = {"refineCollectionShardKey": "app.c", "$db": "admin"}
    assert code_of(sc.parse_refine_collection_shard_key, base) == 40414
    assert code_of(sc.parse_refine_collection_shard_key, {**base, "key": [1]}) == 14
    assert code_of(sc.parse_refine_collection_shard_key, {**base, "key": {}}) == 2  # BadValue
    assert code_of(sc.parse_refine_collection_shard_key, {**base, "key": {"x": "up"}}) == 72  # InvalidOptions
    assert code_of(sc.parse_refine_collection_shard_key, {**base, "key": {"x": 1}, "unique": True}) == 40415


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_rename_is_refused_or_stays_in_its_database(a: str, b: str):
    """Whatever the names, a rename that parses renames within one database."""
    try:
        r = sc.parse_rename_collection({"renameCollection": f"app.{a}", "to": b, "$db": "admin"})
    except CommandError as e:
        assert ErrorCode(e.code).number in (20, 73, 125)
    else:
        assert r.to.partition(".")[0] == "app" and r.to != r.ns


# ------------------------------------------------------------------ replies and currentOp


def test_replies_as_mongos_gives_them():
    assert sc.drop_reply({"ns": "app.c", "dropped": True}) == {"ns": "app.c", "nIndexesWas": 1}
    assert sc.drop_reply({"ns": "app.c", "dropped": True, "nIndexesWas": 3})["nIndexesWas"] == 3
    assert sc.drop_reply({"id": None, "started": False, "ns": "app.c", "dropped": False}) == {}
    assert sc.drop_database_reply({"db": "app", "dropped": True, "collections": ["app.c"]}) == {"dropped": "app"}
    assert sc.drop_database_reply({"id": None, "started": False, "dropped": False}) == {
        "info": "database does not exist"
    }


def test_outcome_of_a_finished_coordinator():
    assert sc.ddl_outcome({"state": "done", "ok": True, "result": {"ns": "a.b", "to": "a.c"}}) == {
        "ns": "a.b",
        "to": "a.c",
    }
    e = refused(
        sc.ddl_outcome,
        {"state": "done", "ok": False, "op": "renameCollection", "ns": "a.b", "code": "NamespaceExists", "reason": "x"},
    )
    assert e.code == "NamespaceExists" and "renameCollection of a.b failed: x" in e.message


RUNNING = {
    "id": "7d2f0c4e-0000-4000-8000-000000000001",
    "op": "renameCollection",
    "ns": "app.a",
    "params": {"to": "app.b", "dropTarget": True},
    "state": "running",
    "phase": "applyOnShards",
    "shards": ["shard-a", "shard-b"],
    "startedAt": 1000.0,
}


def test_current_op_entry_of_a_coordinator():
    e = sc.current_op_entry(RUNNING, now=1002.5)
    assert e == {
        "type": "op",
        "desc": "RenameCollectionCoordinator",
        "op": "command",
        "ns": "app.a",
        "command": {"renameCollection": "app.a", "to": "app.b", "dropTarget": True},
        "currentPhase": "applyOnShards",
        "active": True,
        "secs_running": 2,
        "microsecs_running": 2_500_000,
        "opid": RUNNING["id"],
        "shards": ["shard-a", "shard-b"],
    }
    for op, desc in sc.COORDINATOR_DESC.items():
        assert sc.current_op_entry({**RUNNING, "op": op, "params": {}}, 1000.0)["desc"] == desc


def test_current_op_filter_keeps_only_the_query():
    cmd = {"currentOp": 1, "$all": True, "$ownOps": False, "desc": {"$regex": "Coordinator"}, "$db": "admin"}
    assert sc.current_op_filter(cmd) == {"desc": {"$regex": "Coordinator"}}


# ------------------------------------------------------------------ the start-and-await loop


class ScriptedConfig:
    """The config server's side of the contract: `busy` refusals first, then a start reply,
    then GetDDL answers in turn (the last one repeated)."""

    def __init__(self, start: dict[str, Any], states: list[dict[str, Any]], busy: int = 0, code: str = "") -> None:
        self.start, self.states, self.busy, self.code = start, states, busy, code
        self.sent: list[Record] = []

    async def send(self, record: Record, timeout: float) -> Reply:
        self.sent.append(record)
        if isinstance(record, d.GetDDL):
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return Reply(ok=True, result=state, configTime=40 + len(self.sent))
        if self.busy:
            self.busy -= 1
            return Reply(ok=False, code="ConflictingOperationInProgress", error="dropDatabase of app holds app")
        if self.code:
            return Reply(ok=False, code=self.code, error="no")
        return Reply(ok=True, result=self.start, configTime=7)


STARTED = {"id": "c1", "op": "dropCollection", "ns": "app.c", "started": True, "joined": False}


def state(phase: str, **done: Any) -> dict[str, Any]:
    base = {**RUNNING, "id": "c1", "op": "dropCollection", "ns": "app.c", "params": {}, "phase": phase}
    return {**base, "state": "done", "phase": "done", **done} if done else base


async def test_run_awaits_the_coordinator_and_records_its_phases():
    cfg = ScriptedConfig(
        STARTED,
        [
            state("freezeMigrations"),
            state("blockCRUD"),
            state("blockCRUD"),
            state("applyOnShards"),
            state("done", ok=True, result={"ns": "app.c", "dropped": True}),
        ],
    )
    seen: list[str] = []
    run = await ddl_client.run_ddl(
        cfg.send, d.DropCollection(ns="app.c"), timeout=5, on_state=lambda s: seen.append(s["phase"])
    )
    assert run.result == {"ns": "app.c", "dropped": True} and run.id == "c1" and not run.joined
    assert run.phases == ["freezeMigrations", "blockCRUD", "applyOnShards", "done"]
    assert seen[-1] == "done" and run.config_time == 40 + len(cfg.sent)
    assert [type(r).__name__ for r in cfg.sent].count("DropCollection") == 1


async def test_a_no_op_is_its_start_reply():
    noop = {"id": None, "op": "dropCollection", "ns": "app.c", "started": False, "dropped": False}
    cfg = ScriptedConfig(noop, [state("x")])
    run = await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=5)
    assert run.id is None and run.result == noop and len(cfg.sent) == 1 and run.config_time == 7


async def test_joined_is_reported():
    cfg = ScriptedConfig({**STARTED, "joined": True}, [state("done", ok=True, result={"ns": "app.c"})])
    assert (await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=5)).joined


async def test_the_database_lock_is_waited_for_then_taken():
    cfg = ScriptedConfig(STARTED, [state("done", ok=True, result={})], busy=2)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=5, lock_wait=5)
    assert [type(r) for r in cfg.sent][:3] == [d.DropCollection] * 3
    assert loop.time() - began >= 2 * ddl_client.LOCK_RETRY_S


async def test_the_lock_wait_is_bounded():
    cfg = ScriptedConfig(STARTED, [state("x")], busy=1000)
    with pytest.raises(CommandError) as e:
        await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=5, lock_wait=0.5)
    assert e.value.code == "ConflictingOperationInProgress" and "SHARDLOG_DDL_LOCK_WAIT" in e.value.message
    assert 2 <= len(cfg.sent) <= 4  # every 0.2 s for 0.5 s


async def test_other_refusals_are_not_retried():
    cfg = ScriptedConfig(STARTED, [state("x")], code="NamespaceExists")
    with pytest.raises(CommandError) as e:
        await ddl_client.run_ddl(cfg.send, d.RenameCollection(ns="a.b", to="a.c"), timeout=5)
    assert e.value.code == "NamespaceExists" and len(cfg.sent) == 1


async def test_a_rolled_back_coordinator_is_its_error():
    cfg = ScriptedConfig(STARTED, [state("rollback"), state("done", ok=False, code="StaleConfig", reason="gone")])
    with pytest.raises(CommandError) as e:
        await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=5)
    assert e.value.code == "StaleConfig" and "gone" in e.value.message


async def test_waiting_is_bounded_and_says_the_ddl_goes_on():
    cfg = ScriptedConfig(STARTED, [state("applyOnShards")])
    with pytest.raises(CommandError) as e:
        await ddl_client.run_ddl(cfg.send, d.DropCollection(ns="app.c"), timeout=0.4)
    assert e.value.code == ErrorCode.ExceededTimeLimit and "shardlog ddl status c1" in e.value.message


async def test_no_reply_is_exceeded_time_limit():
    async def silent(record: Record, timeout: float) -> Reply:
        raise TimeoutError("no reply")

    with pytest.raises(CommandError) as e:
        await ddl_client.run_ddl(silent, d.DropDatabase(db="app"), timeout=1)
    assert e.value.code == ErrorCode.ExceededTimeLimit


def test_lock_wait_setting(monkeypatch):
    from domain.ddl import ddl_lock_wait

    monkeypatch.setenv("SHARDLOG_DDL_LOCK_WAIT", "2.5")
    assert ddl_lock_wait() == 2.5
    monkeypatch.delenv("SHARDLOG_DDL_LOCK_WAIT")
    assert ddl_lock_wait() == 30.0


# ------------------------------------------------------------------ the CLI without a broker

BASE = ["--bootstrap", "127.0.0.1:1", "--cluster", "unit"]


def invoke(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


REFUSED = [
    (("rename-collection", "app.a", "other.b"), "CommandFailed", "same database"),
    (("rename-collection", "app.a", "app.a"), "IllegalOperation", "to itself"),
    (("drop-collection", "nodot"), "InvalidNamespace", "expected 'database.collection'"),
    (("drop-database", "admin"), "IllegalOperation", "Cannot drop 'admin' database"),
    (("refine-shard-key", "app.c", "{bad"), "FailedToParse", "invalid JSON for KEY"),
    (("refine-shard-key", "app.c", '{"x": "up"}'), "InvalidOptions", "invalid shard key"),
]


@pytest.mark.parametrize("args,code,message", REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_cli_refuses_before_any_io(args, code, message):
    human = invoke(*args)
    assert human.exit_code == 2 and human.stderr.startswith(f"error: {code}: ") and message in human.stderr
    doc = json.loads(invoke(*args, "--json").stdout)
    assert doc["ok"] is False and doc["code"] == code and message in doc["error"]


def test_the_ddl_group():
    assert invoke("ddl", "--help").exit_code == 0
    assert "status" in invoke("ddl", "--help").stdout


def test_cli_json_document_of_a_run():
    run = ddl_client.DDLRun({"ns": "a.b", "to": "a.c"}, "c1", 12, False, ["freezeMigrations", "done"])
    assert run_document(run) == {
        "ns": "a.b",
        "to": "a.c",
        "id": "c1",
        "joined": False,
        "phases": ["freezeMigrations", "done"],
        "configTime": 12,
    }
    noop = ddl_client.DDLRun({"id": None, "started": False, "op": "dropCollection", "ns": "a.b", "dropped": False})
    assert run_document(noop) == {
        "op": "dropCollection",
        "ns": "a.b",
        "dropped": False,
        "id": None,
        "joined": False,
        "phases": [],
        "configTime": None,
    }


def test_cli_status_lines():
    assert target(RUNNING) == "app.a -> app.b (dropTarget)"
    refine = {**RUNNING, "op": "refineCollectionShardKey", "params": {"key": {"x": 1, "y": 1}}}
    assert target(refine) == "app.a key { x: 1, y: 1 }"
    assert (
        progress_line(RUNNING, 1003.0) == "renameCollection app.a -> app.b (dropTarget) [applyOnShards] 3.0s (7d2f0c4e)"
    )
    assert outcome_line({"ok": True, "result": {"ns": "a.b"}}) == "done: ok { ns: 'a.b' }"
    assert (
        outcome_line({"ok": False, "code": "NamespaceExists", "reason": "r"}) == "done: rolled back, NamespaceExists: r"
    )
