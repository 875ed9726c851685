"""The drivers' transactions specification tests (mongodb/specifications source/transactions and
source/transactions-convenient-api, unified format) against a shardlog cluster, as pymongo's
source distribution ships them and run by pymongo's own runner (its `test.unified_format`):
`make pymongo-tests` (a step of `make test`) puts the sdist's tests in the cache.

The runner is pymongo's, untouched: each spec test here is one of its unittest cases, run
alone, on one cluster for the module.  The runner learns the deployment from `client_context`,
which pymongo fills by asking the server (getCmdLineOpts, and a probe for a second mongos on the
next port); here it is filled with the same answers from the router (`describe`), less those
two: the router has no getCmdLineOpts, and the next port may be anybody's.

Every spec test runs unless SKIPS names it, or its file, with the reason; a test pymongo's
runner skips by itself is a failure until it is listed there.  After each test no transaction
may be left open on a shard (pymongo's runner would send killAllSessions, which shardlog does
not have: what a failed test leaves open is aborted here, so it cannot hold documents against
the tests after it)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import unittest
from typing import Any

import pytest

from infra.drivers import pymongo_tests

pytestmark = pytest.mark.kafka

SDIST = pymongo_tests.cache_dir() / "sdist"
SPEC_DIRS = ("transactions/unified", "transactions-convenient-api/unified")

FAIL_POINT = (
    "needs a fail point (configureFailPoint failCommand, a test command): shardlog has none, so the "
    "driver's reaction to an injected error (labels, retries, pinning) cannot be provoked"
)
HANDSHAKE = (
    "needs auth (runOnRequirements auth: true; shardlog has no users) and a failCommand fail point on saslContinue"
)
REPL_ONLY = "runOnRequirements: replicaset topology only; shardlog's router is a mongos (sharded)"
NO_COUNT = (
    "pymongo has no count() (its runner skips the test); the router's 263 for count in a "
    "transaction is tested in test_transactions_wire.py"
)
DDL_IN_TXN = (
    "gap: create / createIndexes do not run in a transaction here (263); MongoDB 4.4+ runs them "
    "on a collection the transaction creates, visible at commit"
)
IMPLICIT_CREATE = (
    "gap: a transaction's insert into a missing collection creates it at once through the config "
    "server (OperationRouter._ensure_collection), visible before commit and kept on abort; "
    "MongoDB's implicit creation is part of the transaction"
)

# Why a spec file, or one test of it ("file": reason, or ("file", "description"): reason), does
# not run here.  Files are named under pymongo's test/ directory.
SKIPS: dict[str | tuple[str, str], str] = {
    "transactions/unified/backpressure-retryable-abort.json": FAIL_POINT,
    "transactions/unified/backpressure-retryable-commit.json": FAIL_POINT,
    "transactions/unified/backpressure-retryable-reads.json": FAIL_POINT,
    "transactions/unified/backpressure-retryable-writes.json": FAIL_POINT,
    ("transactions/unified/count.json", "count"): NO_COUNT,
    ("transactions/unified/create-collection.json", "explicitly create collection using create command"): DDL_IN_TXN,
    ("transactions/unified/create-collection.json", "implicitly create collection using insert"): IMPLICIT_CREATE,
    "transactions/unified/create-index.json": DDL_IN_TXN,
    "transactions/unified/do-not-retry-read-in-transaction.json": FAIL_POINT,
    "transactions/unified/error-labels-blockConnection.json": FAIL_POINT,
    "transactions/unified/error-labels-errorLabels.json": FAIL_POINT,
    ("transactions/unified/error-labels.json", "NotWritablePrimary errors contain transient label"): FAIL_POINT,
    ("transactions/unified/error-labels.json", "WriteConflict errors contain transient label"): FAIL_POINT,
    ("transactions/unified/error-labels.json", "NoSuchTransaction errors contain transient label"): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "NoSuchTransaction errors on commit contain transient label",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add TransientTransactionError label to connection errors, but do not add RetryableWriteError label",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add RetryableWriteError and UnknownTransactionCommitResult labels to connection errors",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "do not add RetryableWriteError label to writeConcernError ShutdownInProgress that occurs within transaction",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add UnknownTransactionCommitResult label to writeConcernError WriteConcernTimeout",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add UnknownTransactionCommitResult label to writeConcernError WriteConcernTimeout with wtimeout",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "omit UnknownTransactionCommitResult label from writeConcernError UnsatisfiableWriteConcern",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "omit UnknownTransactionCommitResult label from writeConcernError UnknownReplWriteConcern",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "do not add UnknownTransactionCommitResult label to MaxTimeMSExpired inside transactions",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add UnknownTransactionCommitResult label to MaxTimeMSExpired",
    ): FAIL_POINT,
    (
        "transactions/unified/error-labels.json",
        "add UnknownTransactionCommitResult label to writeConcernError MaxTimeMSExpired",
    ): FAIL_POINT,
    "transactions/unified/mongos-pin-auto.json": FAIL_POINT,
    "transactions/unified/mongos-recovery-token-errorLabels.json": FAIL_POINT,
    ("transactions/unified/mongos-recovery-token.json", "commitTransaction retry fails on new mongos"): FAIL_POINT,
    ("transactions/unified/mongos-recovery-token.json", "abortTransaction sends recoveryToken"): FAIL_POINT,
    ("transactions/unified/mongos-unpin.json", "unpin after TransientTransactionError error on commit"): FAIL_POINT,
    ("transactions/unified/mongos-unpin.json", "unpin after non-transient error on abort"): FAIL_POINT,
    ("transactions/unified/mongos-unpin.json", "unpin after TransientTransactionError error on abort"): FAIL_POINT,
    ("transactions/unified/pin-mongos.json", "remain pinned after non-transient error on commit"): FAIL_POINT,
    ("transactions/unified/pin-mongos.json", "unpin after transient error within a transaction"): FAIL_POINT,
    ("transactions/unified/pin-mongos.json", "unpin after transient error within a transaction and commit"): FAIL_POINT,
    "transactions/unified/retryable-abort-errorLabels.json": FAIL_POINT,
    "transactions/unified/retryable-abort-handshake.json": HANDSHAKE,
    "transactions/unified/retryable-abort.json": FAIL_POINT,
    "transactions/unified/retryable-commit-errorLabels.json": FAIL_POINT,
    "transactions/unified/retryable-commit-handshake.json": HANDSHAKE,
    "transactions/unified/retryable-commit.json": FAIL_POINT,
    ("transactions/unified/retryable-writes.json", "writes are not retried"): FAIL_POINT,
    "transactions/unified/transaction-options-repl.json": REPL_ONLY,
    (
        "transactions-convenient-api/unified/callback-retry.json",
        "callback succeeds after multiple connection errors",
    ): FAIL_POINT,
    "transactions-convenient-api/unified/commit-retry-errorLabels.json": FAIL_POINT,
    "transactions-convenient-api/unified/commit-retry.json": FAIL_POINT,
    "transactions-convenient-api/unified/commit-transienttransactionerror-4.2.json": FAIL_POINT,
    "transactions-convenient-api/unified/commit-transienttransactionerror.json": FAIL_POINT,
    "transactions-convenient-api/unified/commit-writeconcernerror.json": FAIL_POINT,
}


def spec_tests() -> dict[str, list[str]]:
    """The descriptions of the tests of every spec file (none when the sdist is not fetched)."""
    out = {}
    for d in SPEC_DIRS:
        for f in sorted((SDIST / "test" / d).glob("*.json")):
            out[f"{d}/{f.name}"] = [t["description"] for t in json.loads(f.read_text())["tests"]]
    return out


def scenarios() -> list:
    """(file, description) of every spec test, with its skip mark if SKIPS names it."""
    out = []
    for name, descriptions in spec_tests().items():
        for description in descriptions:
            reason = SKIPS.get((name, description)) or SKIPS.get(name)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            out.append(pytest.param(name, description, marks=marks, id=f"{name}::{description}"))
    return out


def test_the_spec_tests_are_fetched_and_every_skip_names_one():
    tests = spec_tests()
    assert tests, f"no pymongo tests in {SDIST}: `make pymongo-tests` (a step of `make test`) fetches them"
    for key in SKIPS:
        name, description = (key, None) if isinstance(key, str) else key
        assert name in tests and (description is None or description in tests[name]), f"SKIPS names no test: {key}"


@pytest.fixture(scope="module")
def spec(bootstrap, tmp_path_factory):
    """A cluster (three shards, a router) for the module, and pymongo's runner's test class per
    spec file, its client_context describing the router."""
    from libs import kafka
    from libs.service import ServiceSettings
    from libs.topics import Topics
    from tests.conftest import InProcessCluster

    name = f"tspec{int(time.time() * 1000) % 10**8}"
    asyncio.run(kafka.ensure_topics(bootstrap, Topics(name).core()))
    data = tmp_path_factory.mktemp("spec") / "data"
    cluster = InProcessCluster(ServiceSettings(bootstrap, name, data, session_timeout_ms=6000))
    sys.path.insert(0, str(SDIST))
    saved_env = {k: os.environ.get(k) for k in ("DB_IP", "DB_PORT")}
    try:
        assert cluster.router.wire is not None
        classes, ctx, knobs = load_runner(cluster.router.wire_host, cluster.router.wire.port)
        knobs.enable()  # what pymongo's conftest does around its tests
        try:
            yield classes, cluster
        finally:
            knobs.disable()
            ctx.client.close()
    finally:
        sys.path.remove(str(SDIST))
        for k, v in saved_env.items():  # pymongo's `test` package, and what it read, go with the module
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for mod in [m for m in sys.modules if m == "test" or m.startswith("test.")]:
            del sys.modules[mod]
        cluster.stop()
        asyncio.run(asyncio.wait_for(kafka.delete_cluster_topics(bootstrap, name), 20))


def load_runner(host: str, port: int) -> tuple[dict[str, type], Any, Any]:
    """pymongo's `test` package imported from the sdist (its runner, `client_context` and the
    knobs its conftest enables), and the runner's class per spec file."""
    os.environ["DB_IP"], os.environ["DB_PORT"] = host, str(port)  # read as pymongo's `test` is imported
    loaded = sys.modules.get("test")
    assert loaded is None or str(SDIST) in str(loaded.__file__), f"another `test` package is imported: {loaded}"
    import test as pm
    from test import unified_format
    from test.helpers import global_knobs
    from test.utils_shared import snake_to_camel

    describe(pm.client_context, host, port)
    classes = {}
    for d in SPEC_DIRS:  # one call per directory: both name their classes after "unified" and the file
        generated = unified_format.generate_test_classes(str(SDIST / "test" / d), module=__name__)
        for f in (SDIST / "test" / d).glob("*.json"):
            cls = snake_to_camel("Test_{}_{}".format("unified", f.stem.replace("-", "_").replace(".", "_")))
            classes[f"{d}/{f.name}"] = generated[cls]
    return classes, pm.client_context, global_knobs


def describe(ctx: Any, host: str, port: int) -> None:
    """pymongo's ClientContext._init_client, with the router's answers, less getCmdLineOpts and
    the second-mongos probe."""
    import pymongo
    from test.version import Version

    client: pymongo.MongoClient = pymongo.MongoClient(host, port)
    ctx.client, ctx.connected = client, True
    ctx.connection_attempts = [f"the shardlog router at {host}:{port}"]  # init() is then a no-op
    ctx.server_status = client.admin.command("serverStatus")
    ctx._hello = client.admin.command("isMaster")
    ctx.sessions_enabled = "logicalSessionTimeoutMinutes" in ctx._hello
    ctx.nodes, ctx.w = {(host, port)}, 1
    ctx.version = Version.from_client(client)
    ctx.server_parameters = client.admin.command("getParameter", "*")
    ctx.test_commands_enabled = bool(ctx.server_parameters.get("enableTestCommands"))
    ctx.is_mongos = ctx._hello.get("msg") == "isdbgrid"
    ctx.mongoses = [(host, port)] if ctx.is_mongos else []


@pytest.mark.parametrize("path,description", scenarios())
def test_spec(spec, path, description):
    """One spec test, run alone by pymongo's runner: it passes, or this fails with the runner's
    report (a skip of its own included); and it leaves no transaction open on any shard."""
    from tests.conftest import wait_until

    classes, cluster = spec
    method = "test_{}".format(description.strip(". ").replace(" ", "_").replace(".", "_"))
    result = unittest.TestResult()
    try:
        classes[path](method).run(result)
        for _, reason in result.skipped:
            pytest.fail(f"pymongo's runner skipped it ({reason}): list it in SKIPS with why")
        problems = [text for _, text in result.errors + result.failures]
        assert not problems, "\n".join(problems)
        assert result.testsRun == 1 and result.wasSuccessful()
        wait_until(
            lambda: not open_transactions(cluster),
            5,
            "the test's transactions to end on every shard once its sessions are closed",
            detail=lambda: f"open: {open_transactions(cluster)}",
        )
    finally:
        abort_open_transactions(cluster)


def open_transactions(cluster) -> list[tuple[str, str, int]]:
    """(shard, lsid, txnNumber) of every transaction in progress on a shard."""
    return [
        (sid, r.lsid, r.txnNumber)
        for sid, shard in cluster.shards.items()
        for r in list(shard.documents.txns.values())
        if r.state == "in-progress"
    ]


def abort_open_transactions(cluster) -> None:
    """What a failed test left open, aborted so that it holds no document against the next test
    (pymongo's runner sends killAllSessions for this, which shardlog does not have)."""
    from schemas import shard as s

    ask = cluster.router.routing.transactions.ask
    for sid, lsid, number in open_transactions(cluster):
        cluster.call(ask(sid, s.AbortTransaction(lsid=lsid, txnNumber=number)))
