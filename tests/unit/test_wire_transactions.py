"""services/router/wire/transactions.py: a transaction's fields on the wire, what a transaction
refuses, commitTransaction / abortTransaction and the error labels drivers act on (issue 33),
through the command table with a stand-in for the router."""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import pytest
from bson import Int64, Timestamp

from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import shard as s
from services.router.transactions import TransactionRouter, TxnArgs, current_statement
from services.router.wire.commands import SERVER_COMMANDS, Connection, transaction_labels
from services.router.wire.transactions import refuse_in_transaction, txn_args

LSID = {"id": uuid.UUID("0b0b0b0b-0000-4000-8000-000000000001")}
AT = (1_800_000_000 << 32) | 3


def _code(fn, *args) -> str:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return e.value.code


# ------------------------------------------------------------------ parsing (pure)


def test_a_statements_fields():
    assert txn_args({"find": "c", "txnNumber": Int64(3), "autocommit": False, "lsid": LSID}) == TxnArgs(3)
    first = {"insert": "c", "txnNumber": 1, "autocommit": False, "startTransaction": True, "lsid": LSID}
    assert txn_args(first) == TxnArgs(1, start=True)
    rc = {"level": "snapshot", "atClusterTime": Timestamp(5, 1)}
    assert txn_args({**first, "readConcern": rc}).read_concern == {
        "level": "snapshot",
        "atClusterTime": {"$timestamp": {"t": 5, "i": 1}},
    }


BASE = {"find": "c", "txnNumber": 1, "autocommit": False, "lsid": LSID}


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        ({**BASE, "autocommit": True}, ErrorCode.InvalidOptions),  # "Specifying autocommit=true is not allowed."
        ({"find": "c", "txnNumber": 1, "startTransaction": True, "lsid": LSID}, ErrorCode.InvalidOptions),
        ({"find": "c", "autocommit": False, "lsid": LSID}, ErrorCode.InvalidOptions),  # no txnNumber
        ({**BASE, "lsid": None}, ErrorCode.InvalidOptions),
        ({**BASE, "startTransaction": False}, ErrorCode.InvalidOptions),
        ({**BASE, "readConcern": {"level": "snapshot"}}, ErrorCode.InvalidOptions),  # not the first statement
        ({**BASE, "startTransaction": True, "readConcern": {"level": "available"}}, ErrorCode.InvalidOptions),
        (
            {**BASE, "startTransaction": True, "readConcern": {"atClusterTime": Timestamp(1, 1)}},
            ErrorCode.InvalidOptions,
        ),
        ({**BASE, "autocommit": 0}, ErrorCode.TypeMismatch),
        ({**BASE, "txnNumber": -1}, ErrorCode.BadValue),
    ],
)
def test_malformed_transaction_fields_get_mongodbs_codes(cmd, code):
    assert _code(txn_args, cmd) == code


@pytest.mark.parametrize(
    ("name", "cmd", "code"),
    [
        ("count", {"count": "c", "$db": "app"}, ErrorCode.OperationNotSupportedInTransaction),
        ("createIndexes", {"createIndexes": "c", "$db": "app"}, ErrorCode.OperationNotSupportedInTransaction),
        ("drop", {"drop": "c", "$db": "app"}, ErrorCode.OperationNotSupportedInTransaction),
        ("find", {"find": "c", "$db": "config"}, ErrorCode.OperationNotSupportedInTransaction),
        ("insert", {"insert": "c", "$db": "app", "writeConcern": {"w": 1}}, ErrorCode.InvalidOptions),
        ("aggregate", {"aggregate": "c", "pipeline": [{"$out": "d"}], "$db": "app"}, 263),
    ],
)
def test_what_a_transaction_refuses(name, cmd, code):
    with pytest.raises(CommandError) as e:
        refuse_in_transaction(name, cmd)
    assert e.value.code == code or ErrorCode(e.value.code).number == code


def test_a_transactions_statements_are_accepted():
    for name in ("find", "getMore", "insert", "update", "delete", "findAndModify", "aggregate", "distinct"):
        refuse_in_transaction(name, {name: "c", "$db": "app", "pipeline": [{"$match": {}}]})


def test_error_labels():
    assert transaction_labels("insert", 112) == ["TransientTransactionError"]  # WriteConflict
    assert transaction_labels("find", 251) == ["TransientTransactionError"]  # NoSuchTransaction
    assert transaction_labels("find", 89) == ["TransientTransactionError"]  # a shard did not answer
    assert transaction_labels("update", 91) == ["TransientTransactionError"]  # ShutdownInProgress: retriable
    assert transaction_labels("insert", 11000) == []  # DuplicateKey
    assert transaction_labels("count", 263) == []
    assert transaction_labels("commitTransaction", 89) == ["RetryableWriteError", "UnknownTransactionCommitResult"]
    assert transaction_labels("commitTransaction", 50) == ["UnknownTransactionCommitResult"]  # MaxTimeMSExpired
    assert transaction_labels("commitTransaction", 251) == ["TransientTransactionError"]
    assert transaction_labels("commitTransaction", 112) == ["TransientTransactionError"]
    assert transaction_labels("abortTransaction", 89) == ["RetryableWriteError"]


# ------------------------------------------------------------------ through the command table


class Sessions:
    def use(self, lsid: Any) -> dict[str, Any]:
        return lsid


class Clock:
    cluster_time = AT


class Routing:
    """What the wire handlers reach: handle() answers as shard "sh1" (or the shard a document's
    `shard` field names) and notes the statement's participant as OperationRouter._ask does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.handled: list[Any] = []
        self.transactions = TransactionRouter(self._ask)
        self.sessions, self.clock = Sessions(), Clock()
        self.refuse: str | None = None

    async def _ask(self, shard: str, req: Any) -> dict:
        self.sent.append((shard, req))
        return {"decision": "commit", "commitAt": AT} if req.type == "CoordinateCommitTransaction" else {}

    async def snapshot_time(self, rc: dict) -> int:
        return AT

    async def handle(self, req: Any) -> dict:
        statement = current_statement.get()
        self.handled.append((req, statement.txn if statement else None))
        if self.refuse:
            raise CommandError(self.refuse, "refused")
        if isinstance(req, s.Insert):
            shard = req.docs[0].get("shard", "sh1")
            result = {"inserted": len(req.docs), "writeErrors": []}
            if statement is not None:
                statement.reached(shard, req, result)
            return result
        return {"docs": [], "cursorId": 0}

    def begin_operation(self) -> None: ...

    def gossip_in(self, raw: Any) -> None: ...

    def reached_time(self) -> int:
        return 0

    def signed_cluster_time(self) -> dict:
        signature = {"hash": {"$binary": {"base64": base64.b64encode(bytes(20)).decode()}}, "keyId": 0}
        return {"clusterTime": {"$timestamp": {"t": AT >> 32, "i": 3}}, "signature": signature}

    def open_cursor(self, docs: list, batch: int, session: Any = None) -> dict:
        return {"docs": docs, "cursorId": 0}

    def tag_cursor(self, cursor_id: int, ns: str) -> None: ...


class Edge:
    def __init__(self) -> None:
        self.routing = Routing()


def _wire(edge: Edge, cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    conn = Connection(id=1, peer="test", edge=edge)  # type: ignore[arg-type]

    async def run() -> list[dict[str, Any]]:
        return [await SERVER_COMMANDS(conn, cmd) for cmd in cmds]

    return asyncio.run(run())


def _stmt(n: int, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**body, "$db": body.get("$db", "app"), "lsid": LSID, "txnNumber": Int64(n), "autocommit": False, **extra}


def _end(name: str, n: int) -> dict[str, Any]:
    return {name: 1, "$db": "admin", "lsid": LSID, "txnNumber": Int64(n), "autocommit": False, "recoveryToken": {}}


def test_a_transaction_over_the_wire():
    edge = Edge()
    replies = _wire(
        edge,
        [
            _stmt(1, {"insert": "c", "documents": [{"_id": 1}]}, startTransaction=True),
            _stmt(1, {"count": "c"}),  # refused, the transaction untouched
            _stmt(1, {"find": "c", "filter": {}}),
            _end("commitTransaction", 1),
            _end("commitTransaction", 1),  # retried: ok again
        ],
    )
    assert [r["ok"] for r in replies] == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert replies[0]["recoveryToken"] == {"recoveryShardId": "sh1"}
    assert replies[1]["code"] == 263 and "errorLabels" not in replies[1]
    assert replies[1]["errmsg"] == "Cannot run 'count' in a multi-document transaction."
    txns = {txn for _, txn in edge.routing.handled}
    assert txns == {s.Txn(lsid=str(LSID["id"]), txnNumber=1, readAt=AT)}  # every statement, one snapshot
    assert [(shard, req.type) for shard, req in edge.routing.sent] == [
        ("sh1", "CommitTransaction"),
        ("sh1", "CommitTransaction"),
    ]


def test_a_statement_error_aborts_and_is_labelled():
    edge = Edge()
    first = _stmt(1, {"insert": "c", "documents": [{"_id": 1}]}, startTransaction=True)
    edge.routing.refuse = None
    replies = _wire(edge, [first])
    edge.routing.refuse = ErrorCode.WriteConflict
    replies += _wire(edge, [_stmt(1, {"insert": "c", "documents": [{"_id": 2}]})])
    edge.routing.refuse = None
    replies += _wire(edge, [_stmt(1, {"find": "c"}), _end("commitTransaction", 1), _end("abortTransaction", 1)])
    assert replies[1]["code"] == 112 and replies[1]["errorLabels"] == ["TransientTransactionError"]
    assert [(shard, req.type) for shard, req in edge.routing.sent] == [("sh1", "AbortTransaction")]
    assert replies[2]["code"] == 251 and replies[2]["errorLabels"] == ["TransientTransactionError"]
    assert replies[3]["code"] == 251  # the commit of an aborted transaction
    assert replies[4]["code"] == 251


def test_two_writing_shards_commit_through_their_coordinator_the_first():
    edge = Edge()
    replies = _wire(
        edge,
        [
            _stmt(1, {"insert": "c", "documents": [{"_id": 1}]}, startTransaction=True),
            _stmt(1, {"insert": "c", "documents": [{"_id": 2, "shard": "sh2"}]}),
            _end("commitTransaction", 1),
        ],
    )
    assert [r["ok"] for r in replies] == [1.0, 1.0, 1.0]
    assert replies[1]["recoveryToken"] == {"recoveryShardId": "sh1"}
    coordinate = [
        (shard, req.participants) for shard, req in edge.routing.sent if req.type == "CoordinateCommitTransaction"
    ]
    assert coordinate == [("sh1", ["sh1", "sh2"])]


def test_write_and_read_concerns_inside_a_transaction():
    edge = Edge()
    first = _stmt(1, {"insert": "c", "documents": [{}]}, startTransaction=True, readConcern={"level": "snapshot"})
    replies = _wire(
        edge,
        [
            first,  # a write may carry the transaction's readConcern
            _stmt(1, {"find": "c"}, readConcern={"level": "snapshot"}),
            _stmt(1, {"insert": "c", "documents": [{}]}, writeConcern={"w": "majority"}),
            {**_end("commitTransaction", 1), "writeConcern": {"w": "majority"}},
        ],
    )
    assert [r["ok"] for r in replies] == [1.0, 0.0, 0.0, 1.0]
    assert replies[1]["code"] == 72 and replies[2]["code"] == 72
    assert replies[1]["errmsg"] == "Only the first command in a transaction may specify a readConcern"
    assert "errorLabels" not in replies[1], "refused before it ran: the transaction goes on (and commits)"


def test_a_decision_is_applied_whatever_its_write_concern_and_reports_what_it_cannot_satisfy():
    """MongoDB applies commit / abort, then waits for the write concern: w above the nodes (or
    a tag set) is a writeConcernError in an ok reply, not a refusal that leaves the transaction
    open (the drivers' spec: "write concern error on commit", "abort does not apply writeConcern")."""
    edge = Edge()
    start = _stmt(1, {"insert": "c", "documents": [{}]}, startTransaction=True)
    replies = _wire(
        edge,
        [
            start,
            {**_end("commitTransaction", 1), "writeConcern": {"w": 10}},
            _stmt(2, {"insert": "c", "documents": [{}]}, startTransaction=True),
            {**_end("abortTransaction", 2), "writeConcern": {"w": "dc-east"}},
            _stmt(3, {"insert": "c", "documents": [{}]}, startTransaction=True),
            {**_end("commitTransaction", 3), "writeConcern": {"w": -1}},  # malformed: refused first
            {"insert": "c", "documents": [{}], "$db": "app", "writeConcern": {"w": 10}},  # outside: refused
        ],
    )
    assert [r["ok"] for r in replies] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert replies[1]["writeConcernError"] == {
        "code": 100,
        "codeName": "UnsatisfiableWriteConcern",
        "errmsg": "Not enough data-bearing nodes to satisfy w:10",
    }
    assert "errorLabels" not in replies[1]
    assert replies[3]["writeConcernError"]["code"] == 79  # UnknownReplWriteConcern
    assert [r.get("code") for r in replies[5:]] == [9, 100]
    assert [(shard, req.type) for shard, req in edge.routing.sent] == [
        ("sh1", "CommitTransaction"),
        ("sh1", "AbortTransaction"),
    ]


def test_a_client_bulk_write_is_a_statement_and_its_failed_operation_aborts_the_transaction():
    """bulkWrite runs on admin, its namespaces in nsInfo: a transaction runs it (MongoDB 8.0), and
    an operation's error (reported in its cursor, nErrors) aborts the transaction as a write
    error of insert does."""
    edge = Edge()

    def bulk(n: int, op: dict[str, Any], db: str = "app") -> dict[str, Any]:
        body = {"bulkWrite": 1, "ops": [op], "nsInfo": [{"ns": f"{db}.c"}], "$db": "admin"}
        return _stmt(n, body, startTransaction=True)

    insert = {"insert": 0, "document": {"_id": 1}}
    update = {"update": 0, "filter": {"_id": 1}, "updateMods": {"$set": {"x": 1}}, "multi": False}
    replies = _wire(edge, [bulk(1, insert), bulk(2, insert, db="config")])
    edge.routing.refuse = ErrorCode.DuplicateKey
    replies += _wire(edge, [bulk(3, update)])
    edge.routing.refuse = None
    replies += _wire(edge, [_stmt(3, {"find": "c"})])
    assert replies[0]["ok"] == 1.0 and replies[0]["nInserted"] == 1
    assert [txn.txnNumber for _, txn in edge.routing.handled[:1]] == [1]  # run as the transaction's
    assert replies[1]["code"] == 263  # the config database, named by nsInfo: refused, nothing ends
    assert replies[2]["ok"] == 1.0 and replies[2]["nErrors"] == 1
    assert replies[3]["code"] == 251  # the failed operation aborted transaction 3
    assert [(shard, req.type, req.txnNumber) for shard, req in edge.routing.sent] == [
        ("sh1", "AbortTransaction", 1),  # superseded by 3 (3 reached no shard before failing)
    ]


def test_commit_and_abort_out_of_turn():
    edge = Edge()
    replies = _wire(
        edge,
        [
            _end("commitTransaction", 4),  # never started here
            {"commitTransaction": 1, "$db": "admin", "lsid": LSID},  # not in a transaction
            {**_end("commitTransaction", 4), "$db": "app"},
            _stmt(2, {"find": "c"}),  # no startTransaction
            _stmt(3, {"find": "c"}, startTransaction=True, autocommit=True),
        ],
    )
    assert [r["code"] for r in replies] == [251, 72, 13, 251, 72]
    assert replies[0]["errorLabels"] == ["TransientTransactionError"]


def test_an_older_txn_number_and_a_statement_after_the_commit_change_nothing():
    """mongos's TransactionTooOld (225) for a txnNumber below the session's, and mongod's
    TransactionCommitted (256) for a statement or an abort of a committed transaction: not
    TransientTransactionError (running it again would not help), nothing sent to a shard, and
    the session's transaction left as it was."""
    edge = Edge()
    replies = _wire(
        edge,
        [
            _stmt(5, {"insert": "c", "documents": [{"_id": 1}]}, startTransaction=True),
            _stmt(4, {"find": "c"}),
            _stmt(4, {"insert": "c", "documents": [{"_id": 2}]}, startTransaction=True),
            _end("commitTransaction", 4),
            _stmt(5, {"find": "c"}),  # still open
            _end("commitTransaction", 5),
            _stmt(5, {"insert": "c", "documents": [{"_id": 3}]}),
            _end("abortTransaction", 5),
            _end("commitTransaction", 5),  # a retried commit: still ok
        ],
    )
    assert [r.get("code") for r in replies] == [None, 225, 225, 225, None, None, 256, 256, None]
    assert not [r for r in replies if "errorLabels" in r]
    assert [req.type for req, _ in edge.routing.handled] == ["Insert", "Find"], "only transaction 5's statements"
    assert [(shard, req.type) for shard, req in edge.routing.sent] == [
        ("sh1", "CommitTransaction"),
        ("sh1", "CommitTransaction"),
    ]
