"""The config server against a real broker: commands, refusals, dead letters,
crash recovery (kill -9), standby takeover and zombie fencing."""

from __future__ import annotations

import asyncio
import collections
import json
import signal

import pytest
from typer.testing import CliRunner

from cli.main import app
from libs.commands import CORRELATION_ID
from libs.requests import Requester
from schemas import config as c
from tests.conftest import (
    active_and_standby,
    async_wait_until,
    cli,
    group_offset_and_log_end,
    read_events,
    read_records,
    wait_group_stable,
)

pytestmark = pytest.mark.kafka


def request_all(settings, commands, timeout=60.0):
    async def go():
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            return [await r.request(settings.topics.config_commands, cmd, timeout=timeout) for cmd in commands]

    return asyncio.run(go())


def test_cli_commands_and_status(settings, config_server):
    # Recorded directly: the CLI's add-shard asks the shard's process to answer, and none runs here.
    request_all(settings, [c.AddShard(shard="s0"), c.AddShard(shard="s1")])
    r = cli(settings, "shard-collection", "app.users", "--key", '{"_id": "hashed"}', "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chunks"] == 4
    r = cli(settings, "shard-collection", "app.orders", "--key", '{"cust": 1, "ts": 1}')
    assert r.returncode == 0, r.stderr
    r = cli(settings, "split", "app.orders", "--at", '{"cust": 10, "ts": 0}', "--at", '{"cust": 20, "ts": 0}')
    assert r.returncode == 0, r.stderr
    r = cli(settings, "zone", "add-shard", "s1", "eu")
    assert r.returncode == 0, r.stderr
    r = cli(
        settings,
        "zone",
        "add-range",
        "app.orders",
        "--min",
        '{"cust": 10, "ts": 0}',
        "--max",
        '{"cust": 20, "ts": 0}',
        "--zone",
        "eu",
    )
    assert r.returncode == 0, r.stderr
    r = cli(
        settings, "settings", "set", "balancerWindow", '{"start": "23:00", "stop": "06:00", "timeZone": "Europe/Paris"}'
    )
    assert r.returncode == 0, r.stderr

    status = json.loads(cli(settings, "status", "--verbose", "--json").stdout)
    assert [s["id"] for s in status["shards"]] == ["s0", "s1"]
    assert status["shards"][1]["zones"] == ["eu"]
    orders = next(x for x in status["collections"] if x["ns"] == "app.orders")
    # docs/reference/catalog-and-versions.md: splitting the (1, 0) chunk into three gives <1, 1>, <1, 2>, <1, 3>.
    assert orders["chunkCount"] == 3 and orders["version"] == [1, 3]
    assert [tuple(ch["version"]) for ch in orders["chunks"]] == [(1, 1), (1, 2), (1, 3)]
    assert orders["zones"] == [{"zone": "eu", "min": {"cust": 10, "ts": 0}, "max": {"cust": 20, "ts": 0}}]
    assert status["settings"]["balancerWindow"] == {"start": "23:00", "stop": "06:00", "timeZone": "Europe/Paris"}
    human = cli(settings, "status")
    assert human.returncode == 0 and "app.users" in human.stdout and "s1" in human.stdout
    # The catalog as of an earlier ConfigTime does not have what came later.
    early = json.loads(cli(settings, "status", "--at", "4", "--json").stdout)  # keys 0-1, marker, s0 at 3
    assert [s["id"] for s in early["shards"]] == ["s0"] and early["collections"] == []


BAD_INPUTS = [
    (("add-shard", "s0"), "ShardAlreadyExists"),
    (("add-shard", "bad name!"), "BadValue"),
    (("remove-shard", "nope"), "ShardNotFound"),
    (("create-database", "bad.db"), "InvalidNamespace"),
    (("create-database", "admin"), "InvalidNamespace"),
    (("shard-collection", "nodot", "--key", '{"x": 1}'), "InvalidNamespace"),
    (("shard-collection", "app.c", "--key", '{"x": -1}'), "InvalidOptions"),
    (("shard-collection", "app.c", "--key", '{"$x": 1}'), "InvalidOptions"),
    (("shard-collection", "app.c", "--key", '{"x": "hashed", "y": "hashed"}'), "InvalidOptions"),
    (("shard-collection", "app.c", "--key", "{bad json"), "FailedToParse"),
    (("shard-collection", "app.sharded", "--key", '{"y": 1}'), "AlreadyInitialized"),
    (("shard-collection", "app.sharded", "--key", '{"x": 1}', "--unique"), "AlreadyInitialized"),
    (("split", "app.missing", "--at", '{"x": 1}'), "NamespaceNotFound"),
    (("split", "app.sharded", "--at", '{"y": 1}'), "BadValue"),
    (("split", "app.sharded", "--at", '{"x": 5}', "--at", '{"x": 1}'), "BadValue"),
    (("merge", "app.sharded", "--min", '{"x": 3}', "--max", '{"x": 7}'), "BadValue"),
    (("zone", "add-shard", "ghost", "eu"), "ShardNotFound"),
    (
        ("zone", "add-range", "app.sharded", "--min", '{"x": 1}', "--max", '{"x": 2}', "--zone", "nozone"),
        "ZoneNotFound",
    ),
    (("settings", "set", "noSuchKnob", "1"), "BadValue"),
    (("settings", "set", "maxChunkSizeBytes", "5"), "BadValue"),
    (("settings", "set", "balancerWindow", '{"start": "23:00", "stop": "06:00", "timeZone": "Mars/Base"}'), "BadValue"),
    (("settings", "set", "maxChunkSizeBytes", "1048576", "--ns", "app.missing"), "NamespaceNotFound"),
]


def test_bad_input_gets_a_clear_error_and_no_event(settings, config_server):
    assert request_all(settings, [c.AddShard(shard="s0"), c.ShardCollection(ns="app.sharded", key={"x": 1})])[-1].ok
    before = read_events(settings.bootstrap, settings.topics.config_events)
    for args, code in BAD_INPUTS:
        r = cli(settings, *args)
        assert r.returncode != 0, f"{args} should fail"
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and code in lines[0], f"{args}: expected one line with {code}, got {r.stderr!r}"
        # The --json flavour, in-process (same code, no interpreter start-up).
        j = CliRunner().invoke(app, ["--bootstrap", settings.bootstrap, "--cluster", settings.cluster, *args, "--json"])
        assert j.exit_code != 0 and json.loads(j.stdout)["code"] == code, (args, j.stdout)
    after = read_events(settings.bootstrap, settings.topics.config_events)
    assert [e for _, e in after] == [e for _, e in before], "a refused command appended an event"


def test_malformed_records_go_to_dead_letters_and_the_server_carries_on(settings, config_server):
    t = settings.topics
    garbage = [
        b"not json",
        b"[1, 2]",
        b'{"type": "NoSuchCommand", "v": 1}',
        b'{"type": "AddShard", "v": 99, "shard": "x"}',
        b'{"type": "AddShard", "v": 1}',
        b'{"type": "AddShard", "v": 1, "shard": "s0", "extra": true}',
    ]

    async def go():
        async with Requester(settings.bootstrap, t.cli_replies) as r:
            replies = [await r.request(t.config_commands, raw, timeout=30) for raw in garbage]
            ok = await r.request(t.config_commands, c.AddShard(shard="s0"), timeout=30)
            return replies, ok

    replies, ok = asyncio.run(go())
    assert all(not rep.ok and rep.code == "BadRecord" for rep in replies)
    assert "unknown record type 'NoSuchCommand'" in replies[2].error
    assert "schema version 99" in replies[3].error
    assert "shard" in replies[4].error and "extra" in replies[5].error
    assert ok.ok, "a valid command after the garbage must still be served"

    dl = read_records(settings.bootstrap, t.dead_letters)
    assert [r.value for r in dl] == garbage
    reasons = [dict(r.headers)["dlq.reason"].decode() for r in dl]
    assert all(reasons) and "not JSON" in reasons[0]
    assert [e.type for _, e in read_events(settings.bootstrap, t.config_events)] == ["ShardAdded"]
    listed = json.loads(cli(settings, "dead-letters", "--json").stdout)["deadLetters"]
    assert [d["reason"] for d in listed] == reasons and listed[0]["from"].startswith(t.config_commands)


def _burst(settings, n: int, on_progress):
    """Send n ShardCollection commands (each creates a database too) pipelined; collect replies."""

    async def go():
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            futures = [
                await r.send(settings.topics.config_commands, c.ShardCollection(ns=f"db{i}.coll", key={"x": 1}))
                for i in range(n)
            ]
            acked = {}
            pending = set(range(n))
            while pending:
                for i in list(pending):
                    if futures[i].done():
                        acked[i] = futures[i].result()
                        pending.discard(i)
                on_progress(len(acked))
                await asyncio.sleep(0.02)
            return acked

    return go()


def check_exactly_once(settings, n: int) -> None:
    events = [e for _, e in read_events(settings.bootstrap, settings.topics.config_events)]
    created = collections.Counter(e.db for e in events if e.type == "DatabaseCreated")
    sharded = collections.Counter(e.ns for e in events if e.type == "CollectionSharded")
    for i in range(n):
        assert created[f"db{i}"] == 1, f"db{i} created {created[f'db{i}']} times"
        assert sharded[f"db{i}.coll"] == 1, f"db{i}.coll sharded {sharded[f'db{i}.coll']} times"
    # Never half-applied: each CollectionSharded comes right after its own DatabaseCreated.
    for a, b in zip(events, events[1:]):
        if b.type == "CollectionSharded":
            assert a.type == "DatabaseCreated" and b.ns == f"{a.db}.coll"


def test_kill9_during_a_burst_loses_nothing_and_applies_once(settings, spawn):
    n = 300
    srv = spawn(settings, "services.config", ready_name="config")
    srv.wait_ready(role="active")
    assert request_all(settings, [c.AddShard(shard="s0")])[0].ok
    state = {"killed": False, "restarted": None}

    def on_progress(acked: int) -> None:
        if not state["killed"] and acked >= 60:
            srv.kill9()  # mid-burst: some commands acked, some in flight, some not yet read
            state["killed"] = True
            state["acked_at_kill"] = acked
            state["restarted"] = spawn(settings, "services.config", ready_name="config")

    acked = asyncio.run(asyncio.wait_for(_burst(settings, n, on_progress), 180))
    assert state["killed"] and state["acked_at_kill"] < n, "the kill must land mid-burst"
    assert all(rep.ok for rep in acked.values()), [r for r in acked.values() if not r.ok][:3]
    check_exactly_once(settings, n)
    # The restarted server's store equals a fresh replay of the log.
    state["restarted"].wait_ready(role="active")
    state["restarted"].stop()
    assert_store_matches_replay(settings, settings.data_dir / "config-0" / "catalog")


def assert_store_matches_replay(settings, store_path):
    from cli.status import status_document
    from domain.catalog import Catalog
    from domain.follower import replay_catalog
    from libs.store import Store

    store = Store(store_path)
    try:
        durable = Catalog()
        durable.load(store)
    finally:
        store.close()
    fresh = asyncio.run(replay_catalog(settings.bootstrap, settings.topics.config_events))
    a, b = status_document(durable, verbose=True), status_document(fresh, verbose=True)
    a.pop("configTime"), b.pop("configTime")
    assert a == b


def test_standby_takes_over_when_the_active_config_server_dies(settings, spawn):
    active = spawn(settings, "services.config", ready_name="config")
    active.wait_ready(role="active")
    standby = spawn(settings, "services.config", "--instance", "1", ready_name="config-1")
    standby.wait_ready(role="standby")
    first = request_all(settings, [c.AddShard(shard=f"a{i}") for i in range(20)])
    assert all(r.ok for r in first)
    active.kill9()
    second = request_all(settings, [c.AddShard(shard=f"b{i}") for i in range(20)], timeout=90)
    assert all(r.ok for r in second)
    standby.wait_ready(role="active", timeout=5)
    names = collections.Counter(e.shard for _, e in read_events(settings.bootstrap, settings.topics.config_events))
    assert names == collections.Counter([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)])


def test_the_heir_resumes_where_the_changelog_records_while_the_group_lags(settings, spawn):
    """A transaction that writes events records its command offsets on them, not in the consumer
    group (docs/reference/command-processor.md).  The servers' own group commits are held off, so
    the group lags every command the active one answered; after its kill -9 the standby resumes
    where the changelog says: no command is answered twice and none is lost; it gives the group
    that position when it stops."""
    held_off = {"SHARDLOG_READ_OFFSETS_COMMIT_S": "3600"}
    first = spawn(settings, "services.config", ready_name="config", env=held_off)
    first.wait_ready(role="active")
    second = spawn(settings, "services.config", "--instance", "1", ready_name="config-1", env=held_off)
    wait_group_stable(settings, "config", 2)  # the second's joining revokes (and commits): before the writes
    active, heir = active_and_standby(first, second)
    assert all(r.ok for r in request_all(settings, [c.AddShard(shard=f"a{i}") for i in range(20)]))
    committed, end = group_offset_and_log_end(settings, "config", settings.topics.config_commands)
    assert committed < end, "the group lags: the transactions recorded their offsets in the changelog"
    active.kill9()
    assert all(r.ok for r in request_all(settings, [c.AddShard(shard=f"b{i}") for i in range(20)], timeout=90))
    heir.wait_ready(role="active", timeout=5)
    names = collections.Counter(e.shard for _, e in read_events(settings.bootstrap, settings.topics.config_events))
    assert names == collections.Counter([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)])
    # Answered once: one reply per request on the requesters' inbox (the heir deciding an AddShard
    # again would have answered it a second time, refused).
    replies = collections.Counter(
        dict(r.headers or ()).get(CORRELATION_ID) for r in read_records(settings.bootstrap, settings.topics.cli_replies)
    )
    assert len(replies) == 40 and set(replies.values()) == {1}, replies.most_common(3)
    # An owner that stops gives the group where it stands.
    heir.stop()
    committed, end = group_offset_and_log_end(settings, "config", settings.topics.config_commands)
    assert committed == end


def test_a_zombie_config_server_cannot_append(settings, spawn):
    # The first server freezes itself (SIGSTOP) inside the transaction of one command.
    zombie = spawn(
        settings,
        "services.config",
        ready_name="config",
        env={"SHARDLOG_FAULTS": "config.before_commit@zombie-shard=stop"},
    )
    zombie.wait_ready(role="active")
    assert request_all(settings, [c.AddShard(shard="before")])[0].ok
    heir = spawn(settings, "services.config", "--instance", "1", ready_name="config-1")
    heir.wait_ready(role="standby")

    async def go():
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            fut = await r.send(settings.topics.config_commands, c.AddShard(shard="zombie-shard"))
            # The zombie froze before committing; the heir takes over after the session
            # timeout, fences it, and decides the command again.
            reply = await asyncio.wait_for(fut, 90)
            assert reply.ok, reply
            await async_wait_until(
                lambda: heir.ready_info() and heir.ready_info().get("role") == "active",
                10,
                "the heir to report itself active",
            )
            zombie.signal(signal.SIGCONT)  # the zombie wakes up and tries to commit
            # Its commit fails and it stands by (its readiness file says so): the transaction's
            # outcome, not the wording of a log line, is what the test waits for.
            await async_wait_until(
                lambda: (zombie.ready_info() or {}).get("role") == "standby",
                60,
                "the zombie to stand by after its failed commit",
                detail=lambda: zombie.tail(80),
            )
            assert "transaction failed (ProducerFenced" in zombie.tail(400), zombie.tail(80)
            after = await r.request(settings.topics.config_commands, c.AddShard(shard="after"), timeout=60)
            assert after.ok

    asyncio.run(go())
    shards = [e.shard for _, e in read_events(settings.bootstrap, settings.topics.config_events)]
    assert shards == ["before", "zombie-shard", "after"]


def test_a_reply_to_a_requester_that_is_gone_is_dropped_and_the_server_carries_on(settings, config_server):
    """A request whose requester is gone (its inbox deleted: a router stopped while its request
    waited uncommitted, e.g. across `make down`/`up`) must not wedge the processor: the command
    takes effect, its reply is dropped, and the next request is answered."""
    from libs import kafka
    from libs.commands import CORRELATION_ID, REPLY_TO
    from schemas import Codec

    async def go():
        p = kafka.producer(settings.bootstrap)
        await p.start()
        try:
            await p.send_and_wait(
                settings.topics.config_commands,
                Codec.encode(c.SetSetting(key="rangeDeleterBatchSize", value=77)),
                headers=[(REPLY_TO, settings.topics.inbox("router-gone").encode()), (CORRELATION_ID, b"gone")],
            )
        finally:
            await p.stop()
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            return await r.request(settings.topics.config_commands, c.SetSetting(key="balancerEnabled", value=False))

    # Bounded by the requester's 30 s: aiokafka alone would wait ~40 s for the missing inbox, then
    # fail the transaction, and the same batch would fail again after every re-activation.
    assert asyncio.run(go()).ok
    changed = [
        e for _, e in read_events(settings.bootstrap, settings.topics.config_events) if e.type == "SettingChanged"
    ]
    assert ("rangeDeleterBatchSize", 77) in [(e.key, e.value) for e in changed], "the gone requester's command applies"
