"""A shard's decisions, without Kafka: the decider over a real RocksDB store and a catalog
built by the config server's own decisions (events applied as the processor would)."""

from __future__ import annotations

import pytest

from domain.protocol import MAX_BATCH_BYTES, record_bytes
from libs.errors import CommandError
from schemas import config as c
from schemas import shard as s
from services.router.route import _batch_length
from tests.shard_harness import ShardHarness


class Shard(ShardHarness):
    """Shard a of a cluster of a and b (the shared harness, tests/shard_harness.py)."""


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    yield sh
    sh.store.close()


def test_reply_batches_stay_under_the_byte_cap_and_the_cursor_returns_the_rest(shard):
    big = "x" * (3 * 1024 * 1024)
    shard.run(s.Insert(ns="d.big", docs=[{"_id": i, "pad": big} for i in range(5)], routing=shard.routing("d.big")))
    _, first = shard.run(s.Find(ns="d.big", filter={}, batchSize=100, routing=shard.routing("d.big")))
    assert sum(record_bytes(d) for d in first["docs"]) <= MAX_BATCH_BYTES
    assert first["cursorId"] != 0 and len(first["docs"]) == 2
    seen, cursor = [d["_id"] for d in first["docs"]], first["cursorId"]
    while cursor:
        _, more = shard.run(s.GetMore(cursorId=cursor, batchSize=100))
        assert sum(record_bytes(d) for d in more["docs"]) <= MAX_BATCH_BYTES
        seen += [d["_id"] for d in more["docs"]]
        cursor = more["cursorId"]
    assert seen == list(range(5))


def test_a_router_batch_holds_at_least_one_document_and_at_most_the_byte_cap():
    big = {"pad": "y" * (5 * 1024 * 1024)}
    assert _batch_length([big] * 4, 100) == 1  # 2 x 5 MB > 8 MB
    assert _batch_length([{"pad": "z" * (9 * 1024 * 1024)}], 100) == 1  # a lone large document still goes
    assert _batch_length([{"a": 1}] * 10, 3) == 3
    assert _batch_length([], 3) == 0


LSID = {"id": "00000000-0000-4000-8000-000000000001"}


def test_a_write_that_changed_nothing_is_recorded_so_a_retry_cannot_match_later(shard):
    ns = "d.u"
    update = s.Update(
        ns=ns,
        filter={"x": 1},
        update={"$set": {"y": 1}},
        lsid=LSID,
        txnNumber=1,
        stmtIds=[0],
        routing=shard.routing(ns),
    )
    events, result = shard.run(update)
    assert result == {"matched": 0, "modified": 0}
    assert [e.type for e in events] == ["RetryableWriteRecorded"]
    shard.run(s.Insert(ns=ns, docs=[{"_id": 1, "x": 1}], routing=shard.routing(ns)))
    events, result = shard.run(update)
    assert events == [] and result["retried"] and result["matched"] == 0  # the retry keeps its first answer
    _, found = shard.run(s.Find(ns=ns, filter={"_id": 1}, routing=shard.routing(ns)))
    assert "y" not in found["docs"][0]


def test_documents_written_before_sharding_are_found_under_their_shard_keys_after(shard):
    ns = "d.later"
    shard.config(c.CreateCollection(ns=ns))
    shard.run(s.Insert(ns=ns, docs=[{"_id": i, "k": 10 - i} for i in range(10)], routing=shard.routing(ns)))
    result = shard.config(c.ShardCollection(ns=ns, key={"k": 1}))
    assert result["existing"]
    events, found = shard.run(s.Find(ns=ns, filter={"k": {"$gte": 5}}, sort={"k": 1}, routing=shard.routing(ns)))
    assert [d["k"] for d in found["docs"]] == [5, 6, 7, 8, 9, 10]
    assert sum(e.type == "DocumentWritten" for e in events) == 10  # re-keyed within this decision
    events, counted = shard.run(s.Count(ns=ns, filter={}, routing=shard.routing(ns)))
    assert counted == {"n": 10} and events == []  # once only
    with pytest.raises(CommandError) as e:  # an unsharded route is stale now
        shard.decider.decide(s.Count(ns=ns, filter={}, routing=s.Routing(configTime=0)))
    assert e.value.code == "StaleConfig"


def test_a_refused_request_leaves_no_tentative_rekey_behind(shard):
    ns = "d.later"
    shard.config(c.CreateCollection(ns=ns))
    shard.run(s.Insert(ns=ns, docs=[{"_id": 1, "k": 1}], routing=shard.routing(ns)))
    shard.config(c.ShardCollection(ns=ns, key={"k": 1}))
    before = shard.documents.tentative()
    with pytest.raises(CommandError):
        shard.decider.decide(s.Find(ns=ns, filter={"$bogus": 1}, routing=shard.routing(ns)))
    assert shard.documents.tentative() == before
    _, found = shard.run(s.Find(ns=ns, filter={}, routing=shard.routing(ns)))
    assert found["docs"] == [{"_id": 1, "k": 1}]
