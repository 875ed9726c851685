"""Issue 18, point 4: a migration raced by setAllowMigrations(false) ends, every time.

Seen once on a `make up` cluster: `move-range ... --force-jumbo` and, 0.25 s later,
`set-allow-migrations NS false`; both hung for over ten minutes, the donor "catching up".
Here the two race many times, at varying delays: each move ends (committed, or aborted with
ConflictingOperationInProgress) and no document is lost or doubled."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from schemas import config as c
from tests.conftest import ROOT, wait_until
from tests.integration.test_migration import client_run

pytestmark = pytest.mark.kafka

MAXK = {"$maxKey": 1}
DOCS = 3000
BOUND_S = 60  # far above a healthy move or abort here; the bug was "forever"


def _outcome(cl, mid: str) -> dict:
    return cl.command(c.GetMigration(id=mid)).result


def _donor_done(cl, mid: str) -> bool:
    return any(sh.decider.progress.get(mid, {}).get("phase") == "done" for sh in cl.shards.values())


def _check_documents(cl) -> None:
    async def ids(client):
        return [d["_id"] for d in await client["bdb"]["b"].find({}).to_list()]

    found = client_run(cl, ids)
    assert len(found) == DOCS and set(found) == set(range(DOCS)), (
        f"{len(found)} documents, {len(set(found))} distinct; expected {DOCS}"
    )


def _setup(cl) -> None:
    cl.command(c.SetSetting(key="maxChunkSizeBytes", value=1024 * 1024))  # 3 MB: only --force-jumbo moves it
    cl.command(c.CreateDatabase(db="bdb", primary="s0"))
    cl.command(c.ShardCollection(ns="bdb.b", key={"x": 1}))
    cl.command(c.SplitChunk(ns="bdb.b", at=[{"x": 1000}]))
    pad = "p" * 1000
    client_run(cl, lambda client: client["bdb"]["b"].insert_many([{"_id": i, "x": i, "v": pad} for i in range(DOCS)]))


def test_set_allow_migrations_false_ends_a_running_move_every_time(data_cluster):
    cl = data_cluster
    _setup(cl)
    outcomes = []
    for i, delay in enumerate([0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 0.25, 0.25, 0.25]):
        owner = cl.router.follower.catalog.collections["bdb.b"].chunks[1].shard
        to = "s1" if owner == "s0" else "s0"
        cl.command(c.SetSetting(ns="bdb.b", key="allowMigrations", value=True))
        started = cl.command(c.MoveRange(ns="bdb.b", min={"x": 1000}, max={"x": MAXK}, to=to, forceJumbo=True)).result
        mid = started["id"]
        time.sleep(delay)  # the race itself (not synchronisation): disallow at a different step each time
        stopped = cl.command(c.SetSetting(ns="bdb.b", key="allowMigrations", value=False)).result
        # The config server decides at once: either the commit got in first or the abort did.
        state = _outcome(cl, mid)
        assert state["state"] != "active", f"iteration {i}: migration {mid} still active after setAllowMigrations"
        if state["state"] == "committed":
            assert mid not in stopped.get("aborted", [])
        else:
            assert stopped["aborted"] == [mid]
            assert state["code"] == "ConflictingOperationInProgress", state
            assert "setAllowMigrations" in state["reason"], state
        # ... and the donor ends its side (critical section, decision, forgetting) within the bound.
        wait_until(
            lambda mid=mid: _donor_done(cl, mid), BOUND_S, f"iteration {i} (delay {delay}): the donor to finish {mid}"
        )
        wait_until(
            lambda: all(not sh.documents.migrations for sh in cl.shards.values()),  # noqa: B023
            BOUND_S,
            f"iteration {i}: every shard to forget migration {mid}",
        )
        outcomes.append(state["state"])
        _check_documents(cl)
    assert any(o.startswith("aborted") for o in outcomes), outcomes  # the race was run, not only missed


def test_move_range_cli_returns_the_abort_rather_than_hang(data_cluster):
    """The issue's commands as an operator types them: move-range in the background, then
    set-allow-migrations; both return, the move with ConflictingOperationInProgress.  The move
    goes back to s0 right after a move away, so it is still running (waiting for s0's orphans
    of the range, orphanCleanupDelaySecs) when the migrations are stopped."""
    cl = data_cluster
    _setup(cl)
    first = cl.command(c.MoveRange(ns="bdb.b", min={"x": 1000}, max={"x": MAXK}, to="s1", forceJumbo=True))
    wait_until(lambda: _outcome(cl, first.result["id"])["state"] == "committed", BOUND_S, "the move to s1")
    base = [sys.executable, "-m", "cli.main", "--bootstrap", cl.settings.bootstrap, "--cluster", cl.settings.cluster]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    move = subprocess.Popen(
        [*base, "move-range", "bdb.b", "--min", '{"x":1000}', "--max", '{"x":{"$maxKey":1}}', "--to", "s0"]
        + ["--force-jumbo", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        mid = wait_until(lambda: next(iter(cl.config.catalog.migrations), None), BOUND_S, "move-range to start")
        wait_until(
            lambda: "waiting" in cl.shards["s1"].decider.progress.get(mid, {}),
            BOUND_S,
            "the move back to wait for s0's range deletion",
        )
        stop = subprocess.run(
            [*base, "set-allow-migrations", "bdb.b", "false", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BOUND_S,
        )
        assert stop.returncode == 0, stop.stderr
        assert json.loads(stop.stdout.strip().splitlines()[-1])["aborted"] == [mid], stop.stdout
        out, err = move.communicate(timeout=BOUND_S)
    finally:
        move.kill()
    assert move.returncode == 1, out + err
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["ok"] is False and answer["code"] == "ConflictingOperationInProgress", answer
    assert "setAllowMigrations" in answer["error"], answer
    assert cl.router.follower.catalog.collections["bdb.b"].chunks[1].shard == "s1"  # did not move
    _check_documents(cl)


# ------------------------------------------------------------------ point 7: shards that do not answer


def test_add_shard_refuses_a_shard_with_no_process_and_records_nothing(data_cluster, monkeypatch):
    from tests.conftest import cli

    cl = data_cluster
    monkeypatch.setenv("SHARDLOG_ADD_SHARD_WAIT_S", "2")
    r = cli(cl.settings, "add-shard", "s9", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    assert answer["code"] == "OperationFailed" and "HostUnreachable" in answer["error"], answer
    assert "s9" not in cl.config.catalog.shards
    ok = cli(cl.settings, "add-shard", "s1", "--json")  # a running shard: answers, then "already exists"
    assert json.loads(ok.stdout.strip().splitlines()[-1])["code"] == "ShardAlreadyExists", ok.stdout


def test_a_move_primary_whose_donor_never_runs_is_bounded_and_abortable(settings, monkeypatch):
    from tests.conftest import InProcessCluster, cli

    monkeypatch.setenv("SHARDLOG_MOVE_PRIMARY_TIMEOUT_S", "3")
    cl = InProcessCluster(settings)
    try:
        cl.command(c.AddShard(shard="s9"))  # recorded raw: a shard whose process is gone
        cl.command(c.CreateDatabase(db="pdb", primary="s9"))
        mid = cl.command(c.MovePrimary(db="pdb", to="s0")).result["id"]
        wait_until(lambda: _outcome(cl, mid)["state"] != "active", 60, "the config server to bound the movePrimary")
        state = _outcome(cl, mid)
        assert state["code"] == "ExceededTimeLimit" and "SHARDLOG_MOVE_PRIMARY_TIMEOUT_S" in state["reason"], state
        assert cl.config.catalog.databases["pdb"].primary == "s9"  # stays on its old primary
        # The operator's way out, before the bound: abort-move-primary.
        mid2 = cl.command(c.MovePrimary(db="pdb", to="s1")).result["id"]
        r = cli(settings, "abort-move-primary", "pdb", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1])["id"] == mid2
        state = _outcome(cl, mid2)
        assert state["state"].startswith("aborted") and state["code"] == "Interrupted", state
        assert cl.config.catalog.databases["pdb"].primary == "s9"
        none = cli(settings, "abort-move-primary", "pdb", "--json")
        assert json.loads(none.stdout.strip().splitlines()[-1])["code"] == "NoSuchMigration"
    finally:
        cl.stop()


def test_a_write_to_a_shard_with_no_process_is_not_reported_as_kafka_unreachable(data_cluster):
    """Issue 18, point 7: a database whose primary has no process hangs writes; the CLI said
    "KafkaUnavailable: cannot reach Kafka" though Kafka was fine."""
    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.AddShard(shard="s9"))  # recorded raw: a shard whose process never ran
    cl.command(c.CreateDatabase(db="gone", primary="s9"))
    r = cli(cl.settings, "--timeout", "3", "insert", "gone.c", '{"_id": 1}', "--json")
    assert r.returncode != 0, r.stdout
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    assert answer["code"] != "KafkaUnavailable" and "cannot reach Kafka" not in answer["error"], answer
    assert answer["code"] in ("ShardUnavailable", "Timeout", "HostUnreachable", "ExceededTimeLimit"), answer
