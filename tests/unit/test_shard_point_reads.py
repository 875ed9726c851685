"""Which shard reads may be answered while a transaction is in flight, and which events hold
them back (services.shard.decide.PointReads; docs/reference/command-processor.md)."""

from __future__ import annotations

from domain.shardkey import encode_value
from schemas import Tombstone
from schemas import shard as s
from services.shard.decide import PointReads, plain_read
from services.shard.documents import document_changelog_key, record_key


def test_a_find_by_id_value_reads_that_document_and_nothing_else_is_a_point_read():
    key = PointReads.key(s.Find(ns="db.c", filter={"_id": "user1"}))
    assert key == document_changelog_key("db.c", encode_value("user1"))
    assert PointReads.key(s.Find(ns="db.c", filter={"_id": "user1", "k": 3})) == key, "more fields: still by _id"
    assert PointReads.key(s.Find(ns="db.c", filter={"_id": {"$gt": 1}})) is None, "an operator is a range"
    assert PointReads.key(s.Find(ns="db.c", filter={"_id": 1}, hint={"_id": 1})) is None, "a hint plans otherwise"
    assert PointReads.key(s.Find(ns="db.c", filter={"k": 1})) is None
    assert PointReads.key(s.Count(ns="db.c", filter={"_id": 1})) is None


def test_a_hinted_count_or_write_by_id_is_no_point_read():
    """A Count with a hint is a plain read (answered outside the transaction, but planned by the
    shard with its hint: test_shard_planner), never a point read; a write is neither."""
    by_id = {"_id": 1}
    count = s.Count(ns="db.c", filter=by_id, hint="a_1")
    assert plain_read(count) and PointReads.key(count) is None
    for write in [
        s.Update(ns="db.c", filter=by_id, update={"$set": {"x": 1}}, hint="a_1"),
        s.Delete(ns="db.c", filter=by_id, hint="a_1"),
        s.FindAndModify(ns="db.c", query=by_id, remove=True, hint="a_1"),
    ]:
        assert not plain_read(write) and PointReads.key(write) is None, write.type


def test_a_document_event_changes_its_document_a_session_record_none_anything_else_everything():
    written = s.DocumentWritten(ns="db.c", skey="00", doc={"_id": "user1", "v": 1})
    removed = s.DocumentRemoved(ns="db.c", skey="00", id="user2")
    assert PointReads.changed(written) == (PointReads.key(s.Find(ns="db.c", filter={"_id": "user1"})),)
    assert PointReads.changed(removed) == (document_changelog_key("db.c", encode_value("user2")),)
    recorded = s.RetryableWriteRecorded(lsid="l", txnNumber=2, part="0", statements=[], lastWriteAt=0.0)
    assert PointReads.changed(recorded) == ()
    assert PointReads.changed(Tombstone(key=record_key("l", 1, "0"))) == ()
    assert PointReads.changed(Tombstone(key=b"mig/x")) is None
    assert PointReads.changed(s.MigrationForgotten(id="m")) is None
