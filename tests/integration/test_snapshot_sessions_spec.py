"""The drivers' snapshot-sessions specification scenarios (mongodb/specifications,
source/sessions/tests/snapshot-sessions.yml), written here as pymongo calls against the router:
what each read returns, and the read concern pymongo sends (no atClusterTime on a session's first
read; the time the server named on every later one, which pymongo takes from our replies: a
cursor's `atClusterTime` for find and aggregate, the top-level one for distinct).  The scenarios
that need `snapshotTime` as a session option are left out: pymongo 4.20 does not offer it."""

from __future__ import annotations

import itertools

import pytest
from pymongo import ReturnDocument, monitoring
from pymongo.errors import InvalidOperation

pytestmark = pytest.mark.kafka

_names = itertools.count()


class Started(monitoring.CommandListener):
    """The commands pymongo sends, as commandStartedEvent sees them (writes ignored, as the spec's
    ignoreCommandMonitoringEvents does)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict]] = []

    def started(self, event) -> None:
        if event.command_name in ("find", "aggregate", "distinct"):
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event) -> None: ...

    def failed(self, event) -> None: ...

    def read_concerns(self) -> list[str]:
        """Per read: "first" (snapshot, no atClusterTime), "pinned" (snapshot with it), "none"."""
        out = []
        for _, cmd in self.commands:
            rc = cmd.get("readConcern")
            out.append("none" if rc is None else "pinned" if "atClusterTime" in rc else "first")
            assert rc is None or rc["level"] == "snapshot", rc
        return out


@pytest.fixture
def spec(data_cluster):
    """client0 with its listener, collection0 holding {_id 1, x 11} and {_id 2, x 11}, and two
    snapshot sessions."""
    listener = Started()
    client = data_cluster.mongo_client(event_listeners=[listener])
    coll = client.database0[f"collection{next(_names)}"]
    coll.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 11}])
    listener.commands.clear()
    with client.start_session(snapshot=True) as s0, client.start_session(snapshot=True) as s1:
        yield coll, s0, s1, listener


def inc(coll, _id: int) -> dict:
    return coll.find_one_and_update({"_id": _id}, {"$inc": {"x": 1}}, return_document=ReturnDocument.AFTER)


def test_find_operation_with_snapshot(spec):
    coll, s0, s1, seen = spec
    assert list(coll.find({"_id": 1}, session=s0)) == [{"_id": 1, "x": 11}]
    assert inc(coll, 1) == {"_id": 1, "x": 12}
    assert list(coll.find({"_id": 1}, session=s1)) == [{"_id": 1, "x": 12}]
    assert inc(coll, 1) == {"_id": 1, "x": 13}
    assert list(coll.find({"_id": 1})) == [{"_id": 1, "x": 13}]
    assert list(coll.find({"_id": 1}, session=s0)) == [{"_id": 1, "x": 11}]
    assert list(coll.find({"_id": 1}, session=s1)) == [{"_id": 1, "x": 12}]
    assert seen.read_concerns() == ["first", "first", "none", "pinned", "pinned"]


def test_distinct_operation_with_snapshot(spec):
    coll, s0, s1, seen = spec
    assert coll.distinct("x", {}, session=s0) == [11]
    assert inc(coll, 2) == {"_id": 2, "x": 12}
    assert sorted(coll.distinct("x", {}, session=s1)) == [11, 12]
    assert inc(coll, 2) == {"_id": 2, "x": 13}
    assert sorted(coll.distinct("x", {})) == [11, 13]
    assert coll.distinct("x", {}, session=s0) == [11]
    assert sorted(coll.distinct("x", {}, session=s1)) == [11, 12]
    assert seen.read_concerns() == ["first", "first", "none", "pinned", "pinned"]


def test_aggregate_operation_with_snapshot(spec):
    coll, s0, s1, seen = spec
    match = [{"$match": {"_id": 1}}]
    assert list(coll.aggregate(match, session=s0)) == [{"_id": 1, "x": 11}]
    assert inc(coll, 1) == {"_id": 1, "x": 12}
    assert list(coll.aggregate(match, session=s1)) == [{"_id": 1, "x": 12}]
    assert inc(coll, 1) == {"_id": 1, "x": 13}
    assert list(coll.aggregate(match)) == [{"_id": 1, "x": 13}]
    assert list(coll.aggregate(match, session=s0)) == [{"_id": 1, "x": 11}]
    assert list(coll.aggregate(match, session=s1)) == [{"_id": 1, "x": 12}]
    assert seen.read_concerns() == ["first", "first", "none", "pinned", "pinned"]


def test_count_documents_operation_with_snapshot(spec):
    coll, s0, _, seen = spec
    assert coll.count_documents({}, session=s0) == 2
    coll.insert_one({"_id": 3, "x": 33})
    assert coll.count_documents({}, session=s0) == 2
    assert [name for name, _ in seen.commands] == ["aggregate", "aggregate"]
    assert seen.read_concerns() == ["first", "pinned"]


def test_mixed_operation_with_snapshot(spec):
    coll, s0, _, seen = spec
    assert list(coll.find({"_id": 1}, session=s0)) == [{"_id": 1, "x": 11}]
    assert inc(coll, 1) == {"_id": 1, "x": 12}
    assert list(coll.find({"_id": 1})) == [{"_id": 1, "x": 12}]
    assert list(coll.aggregate([{"$match": {"_id": 1}}], session=s0)) == [{"_id": 1, "x": 11}]
    assert coll.distinct("x", {}, session=s0) == [11]
    assert [name for name, _ in seen.commands] == ["find", "find", "aggregate", "distinct"]
    assert seen.read_concerns() == ["first", "none", "pinned", "pinned"]


def test_write_commands_with_snapshot_session_do_not_affect_snapshot_reads(spec):
    coll, s0, _, seen = spec
    list(coll.find({}, session=s0))
    coll.insert_one({"_id": 22, "x": 33})
    coll.update_one({"_id": 1}, {"$inc": {"x": 1}})
    assert list(coll.find({"_id": 1}, session=s0)) == [{"_id": 1, "x": 11}]
    assert seen.read_concerns() == ["first", "pinned"]


def test_start_transaction_fails_in_snapshot_session(spec):
    _, s0, _, _ = spec
    with pytest.raises(InvalidOperation, match="Transactions are not supported in snapshot sessions"):
        s0.start_transaction()


# snapshot-sessions-unsupported-ops.yml: the server refuses, and nothing changes.
UNSUPPORTED = {
    "insertOne": lambda coll, s: coll.insert_one({"_id": 22, "x": 22}, session=s),
    "insertMany": lambda coll, s: coll.insert_many([{"_id": 22, "x": 22}, {"_id": 33, "x": 33}], session=s),
    "deleteOne": lambda coll, s: coll.delete_one({}, session=s),
    "updateOne": lambda coll, s: coll.update_one({"_id": 1}, {"$inc": {"x": 1}}, session=s),
    "findOneAndUpdate": lambda coll, s: coll.find_one_and_update({"_id": 1}, {"$inc": {"x": 1}}, session=s),
    "listDatabases": lambda coll, s: coll.database.client.list_database_names(session=s),
    "listCollections": lambda coll, s: coll.database.list_collection_names(session=s),
    "listIndexes": lambda coll, s: list(coll.list_indexes(session=s)),
    "runCommand insert": lambda coll, s: coll.database.command("insert", coll.name, documents=[{}], session=s),
}


@pytest.mark.parametrize("op", list(UNSUPPORTED))
def test_the_server_refuses_what_a_snapshot_session_may_not_do(spec, op):
    from pymongo.errors import OperationFailure

    coll, s0, _, _ = spec
    with pytest.raises(OperationFailure) as e:
        UNSUPPORTED[op](coll, s0)
    assert e.value.code in (72, 263), e.value.details  # InvalidOptions / OperationNotSupportedInTransaction
    assert list(coll.find({}).sort("_id", 1)) == [{"_id": 1, "x": 11}, {"_id": 2, "x": 11}]
