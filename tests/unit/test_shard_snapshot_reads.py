"""A shard's reads at a past cluster time (issue 32; docs/decisions/0019): a Find with
`readConcern: {level: "snapshot", atClusterTime: T}` sees exactly the writes stamped at or
before T, of the ranges this shard owned at T, including documents since deleted or moved away;
a T before what the shard or the routing history remembers is refused with MongoDB's codes."""

from __future__ import annotations

from typing import Any

import pytest

from domain.clock import LogicalTime, VectorClock
from domain.protocol import ErrorCode
from libs.commands import stamp
from libs.errors import CommandError
from schemas import Record
from schemas import config as c
from schemas import shard as s
from services.config.decide import decide as config_decide
from services.shard import history
from services.shard.decide import ShardDecider
from services.shard.documents import ShardDocuments
from tests.shard_harness import ShardHarness

NS = "d.c"
WALL = 1_800_000_000


class StampingShard(ShardHarness):
    """Shard a, its events stamped by a vector clock as the processor stamps them, each request
    committed at once."""

    def __init__(self, path: Any) -> None:
        self.wall = float(WALL)
        self.clock = VectorClock(wall=lambda: self.wall)  # one clock for the catalog and the shard
        self.log_stamped: list[Record] = []  # the changelog as the processor writes it
        super().__init__(path)

    def make_decider(self) -> Any:
        self.documents.clock = self.clock
        return ShardDecider(self.shard_id, self.catalog, self.documents, clock=self.clock)

    def config(self, cmd: Record) -> Any:
        """As the config server: its events stamped."""
        dec = config_decide(self.catalog, cmd)
        self.catalog_apply([stamp(self.clock, e) for e in dec.events])
        return dec.result

    def write(self, req: Record) -> int:
        """Decide, stamp, apply and commit `req`, a second after the last write; its last stamp."""
        self.wall += 1
        dec = self.decider.decide(req)
        events = [stamp(self.clock, e) for e in dec.events]
        for e in events:
            self.documents.apply(e, -1)
        self.log_stamped += events
        self.commit()
        return max(getattr(e, "ts", 0) or 0 for e in events)

    def find_at(self, at: int, **fields: Any) -> list[dict]:
        rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(at).to_ejson()}
        found = self.decider.decide(s.Find(ns=NS, readConcern=rc, routing=self.routing(NS), **fields)).result
        return found["docs"]


@pytest.fixture
def shard(tmp_path):
    sh = StampingShard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    history.begin(sh.store, 0)
    yield sh
    sh.close()


def test_a_read_at_a_past_time_sees_exactly_the_writes_stamped_up_to_it(shard):
    r = shard.routing(NS)
    t0 = shard.clock.tick()
    t1 = shard.write(s.Insert(ns=NS, docs=[{"_id": i, "n": 0} for i in range(4)], routing=r))
    t2 = shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"n": 1}}, routing=r))
    t3 = shard.write(s.Delete(ns=NS, filter={"_id": 2}, routing=r))
    t4 = shard.write(s.Insert(ns=NS, docs=[{"_id": 9, "n": 9}], routing=r))
    assert t1 < t2 < t3 < t4
    assert shard.find_at(t0) == []
    assert len(shard.find_at(t1 - 1)) == 3, "one stamp per document: the last one's is t1"
    assert shard.find_at(t1) == [{"_id": i, "n": 0} for i in range(4)]
    assert shard.find_at(t2) == [{"_id": 0, "n": 0}, {"_id": 1, "n": 1}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0}]
    assert [d["_id"] for d in shard.find_at(t3)] == [0, 1, 3]
    assert [d["_id"] for d in shard.find_at(t4, filter={"n": {"$gte": 1}}, sort={"n": -1})] == [9, 1]
    latest = shard.decider.decide(s.Find(ns=NS, routing=r)).result["docs"]
    assert shard.find_at(t4 + 1) == latest


def test_a_range_moved_away_is_still_read_at_a_time_before_its_migration(shard):
    shard.config(c.ShardCollection(ns=NS, key={"k": 1}))
    shard.config(c.SplitChunk(ns=NS, at=[{"k": 10}]))
    r = shard.routing(NS)
    t1 = shard.write(s.Insert(ns=NS, docs=[{"_id": k, "k": k} for k in (1, 5, 15, 20)], routing=r))
    coll = shard.catalog.collections[NS]
    moved = next(ch for ch in coll.chunks if ch.min == {"k": 10})
    doc = moved.doc().model_copy(update={"shard": "b", "version": (moved.pair[0] + 1, 0)})
    shard.wall += 1
    committed = shard.clock.tick()
    shard.catalog_apply(
        [c.MigrationCommitted(id="m", ns=NS, epoch=coll.epoch, donor="a", recipient="b", chunks=[doc], ts=committed)]
    )
    # The range deleter removes the orphans afterwards.
    shard.wall += 1
    for k in (15, 20):
        shard.documents.apply(stamp(shard.clock, s.DocumentRemoved(ns=NS, skey=_skey(shard, k), id=k)), -1)
    shard.commit()
    assert [d["k"] for d in shard.find_at(t1)] == [1, 5, 15, 20], "owned at t1: the moved range too"
    assert [d["k"] for d in shard.find_at(committed)] == [1, 5], "after the commit, b's"
    assert [d["k"] for d in shard.find_at(shard.clock.cluster_time)] == [1, 5]


def test_a_read_routed_without_a_migration_stamped_before_its_time_is_stale(shard):
    """Seed 229 (STATISTICS_LAYOUT_POLL_S = 0.5): a router picks T, catches up to the end of
    config.events and targets the donor alone; a config server whose clock had not seen T then
    commits the migration stamped before T.  The donor, which knows the commit by the time the
    read reaches it, must not answer for its own ranges only (the router never asks the
    recipient): StaleConfig, as for any read routed with another version of this shard."""
    shard.config(c.ShardCollection(ns=NS, key={"k": 1}))
    shard.config(c.SplitChunk(ns=NS, at=[{"k": 10}]))
    r = shard.routing(NS)
    shard.write(s.Insert(ns=NS, docs=[{"_id": k, "k": k} for k in (1, 5, 15, 20)], routing=r))
    shard.wall += 1
    at = shard.clock.tick()  # the router's ClusterTime, handed out before the commit was stamped
    before = shard.routing(NS)  # and its routing: the catalog had no commit yet
    coll = shard.catalog.collections[NS]
    moved = next(ch for ch in coll.chunks if ch.min == {"k": 10})
    doc = moved.doc().model_copy(update={"shard": "b", "version": (moved.pair[0] + 1, 0)})
    shard.catalog_apply(
        [c.MigrationCommitted(id="m", ns=NS, epoch=coll.epoch, donor="a", recipient="b", chunks=[doc], ts=at - 1)]
    )
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(at).to_ejson()}
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=before))
    assert e.value.code == ErrorCode.StaleConfig
    assert e.value.info["configTime"] == shard.catalog.config_time, "the router catches up to the commit"
    # Routed again with the commit, the donor reads what it owned at T; the router asks b as well.
    assert [d["k"] for d in shard.find_at(at)] == [1, 5]
    assert "b" in {sh for _, _, sh in shard.catalog.collections[NS].routing_at(at)}


def test_a_time_older_than_the_history_is_refused(shard):
    r = shard.routing(NS)
    t1 = shard.write(s.Insert(ns=NS, docs=[{"_id": 1}], routing=r))
    shard.store.commit([(history.HISTORY_FROM, (t1 + 1).to_bytes(8, "big"))], None)
    with pytest.raises(CommandError) as e:
        shard.find_at(t1)
    assert e.value.code == "SnapshotTooOld" and "older than the oldest available timestamp" in e.value.message
    shard.wall += 5
    shard.config(c.ShardCollection(ns="d.s", key={"k": 1}))
    sharded_at = shard.catalog.collections["d.s"].history_from
    assert sharded_at > t1 + 1
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(sharded_at - 1).to_ejson()}
    with pytest.raises(CommandError) as e:  # the collection's routing before it was sharded is not known
        shard.decider.decide(s.Find(ns="d.s", readConcern=rc, routing=shard.routing("d.s")))
    assert e.value.code == "StaleChunkHistory"


@pytest.mark.parametrize(
    "rc",
    [
        {"level": "local", "atClusterTime": {"$timestamp": {"t": 1, "i": 1}}},
        {
            "level": "snapshot",
            "atClusterTime": {"$timestamp": {"t": 1, "i": 1}},
            "afterClusterTime": {"$timestamp": {"t": 1, "i": 1}},
        },
        {"level": "snapshot", "atClusterTime": "yesterday"},
        {"level": "snapshot", "atClusterTime": {"$timestamp": {"t": 0, "i": 0}}},
    ],
)
def test_a_malformed_snapshot_read_concern_is_refused_and_changes_nothing(shard, rc):
    shard.write(s.Insert(ns=NS, docs=[{"_id": 1}], routing=shard.routing(NS)))
    before = dict(shard.store.scan(b""))
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=shard.routing(NS)))
    assert e.value.code in ("InvalidOptions", "TypeMismatch", "BadValue"), e.value.code
    assert dict(shard.store.scan(b"")) == before


def _skey(shard: StampingShard, k: int) -> str:
    coll = shard.catalog.collections[NS]
    return coll.pattern.encode_bound({"k": k}).hex()


def test_a_shard_refuses_a_snapshot_count_as_mongodb_does(shard):
    rc = {"level": "snapshot", "atClusterTime": {"$timestamp": {"t": WALL, "i": 1}}}
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.Count(ns=NS, readConcern=rc, routing=shard.routing(NS)))
    assert e.value.code == "InvalidOptions" and "does not support" in e.value.message


def test_a_window_of_zero_keeps_no_history_and_refuses_reads_before_its_last_write(shard):
    r = shard.routing(NS)
    t1 = shard.write(s.Insert(ns=NS, docs=[{"_id": 1, "v": 1}], routing=r))
    shard.documents.keeps_history = lambda: False
    t2 = shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 2}}, routing=r))
    assert not any(
        k.startswith(history.HISTORY) and k[-8:] == t2.to_bytes(8, "big") for k, _ in shard.store.scan(b"h/")
    )
    with pytest.raises(CommandError) as e:
        shard.find_at(t1)  # would have missed the unrecorded update
    assert e.value.code == "SnapshotTooOld"
    assert shard.find_at(t2) == [{"_id": 1, "v": 2}]


def test_documents_not_rekeyed_yet_are_read_at_a_time_and_the_rekey_keeps_their_history(shard):
    r = shard.routing(NS)
    shard.write(s.Insert(ns=NS, docs=[{"_id": i, "k": i} for i in range(3)], routing=r))
    shard.wall += 5
    shard.config(c.ShardCollection(ns=NS, key={"k": 1}))
    shard.wall += 5
    before = shard.clock.tick()
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(before).to_ejson()}
    dec = shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=shard.routing(NS)))
    assert [type(e) for e in dec.events] == [s.NoopWritten], "a snapshot read does not rekey (its no-op aside)"
    assert dec.result["docs"] == [{"_id": i, "k": i} for i in range(3)]
    rekeyed = shard.write(s.Find(ns=NS, routing=shard.routing(NS)))  # the rekey, stamped, as the processor folds it
    assert rekeyed > before
    assert shard.find_at(before) == shard.find_at(rekeyed) == [{"_id": i, "k": i} for i in range(3)]
    # the fold alone wrote the history: a fresh replay of the stamped log writes the same entries
    replay = StampingShard(shard.path / "replay")
    for e in shard.log_stamped:
        replay.documents.apply(e, -1)
    replay.commit()
    assert dict(replay.store.scan(b"h/")) == dict(shard.store.scan(b"h/"))
    replay.close()


def test_a_snapshot_read_inside_a_transaction_sees_the_batchs_writes_stamped_before_it(shard):
    r = shard.routing(NS)
    shard.write(s.Insert(ns=NS, docs=[{"_id": 1, "v": 0}], routing=r))
    shard.wall += 1
    pending = [
        stamp(shard.clock, e)
        for e in shard.decider.decide(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=r)).events
    ]
    for e in pending:
        shard.documents.apply(e, -1)  # decided in this batch, not committed: the read's reply commits with it
    assert shard.find_at(shard.clock.cluster_time) == [{"_id": 1, "v": 1}]


def test_a_cursor_whose_history_is_reclaimed_meanwhile_fails_rather_than_read_later_writes(shard):
    shard.config(c.ShardCollection(ns=NS, key={"k": 1}))
    shard.config(c.SplitChunk(ns=NS, at=[{"k": 10}, {"k": 20}]))
    shard.write(s.Insert(ns=NS, docs=[{"_id": k, "k": k, "v": 0} for k in (1, 2, 25)], routing=shard.routing(NS)))
    coll = shard.catalog.collections[NS]
    moved = next(ch for ch in coll.chunks if ch.min == {"k": 10})
    doc = moved.doc().model_copy(update={"shard": "b", "version": (moved.pair[0] + 1, 0)})
    shard.wall += 1
    shard.catalog_apply(
        [
            c.MigrationCommitted(
                id="m", ns=NS, epoch=coll.epoch, donor="a", recipient="b", chunks=[doc], ts=shard.clock.tick()
            )
        ]
    )
    at = shard.clock.tick()
    shard.wall += 1
    updated = shard.write(s.Update(ns=NS, filter={"_id": 25}, update={"$set": {"v": 1}}, routing=shard.routing(NS)))
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(at).to_ejson()}
    first = shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=shard.routing(NS), batchSize=1)).result
    assert [d["v"] for d in first["docs"]] == [0]
    history.reclaim(shard.store, updated + 1)  # the window passes while the cursor is open
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.GetMore(cursorId=first["cursorId"], batchSize=100))
    assert e.value.code == "SnapshotTooOld"


def test_a_read_ahead_of_every_logged_stamp_logs_a_noop_so_a_restart_never_stamps_at_or_before_it(shard):
    r = shard.routing(NS)
    written = shard.write(s.Insert(ns=NS, docs=[{"_id": 1, "v": 0}], routing=r))
    shard.wall += 5
    at = shard.clock.tick()  # a router's cluster time, ahead of this shard's last write
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(at).to_ejson()}
    decision = shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=r))
    assert decision.result["docs"] == [{"_id": 1, "v": 0}]
    assert [type(e) for e in decision.events] == [s.NoopWritten]
    noop = stamp(shard.clock, decision.events[0])
    assert noop.ts > at > written
    shard.documents.apply(noop, -1)
    shard.commit()
    # A read at a time already covered by the log writes nothing more.
    assert shard.decider.decide(s.Find(ns=NS, readConcern=rc, routing=r)).events == []

    # The shard restarts on a host whose wall clock is behind `at` (clock skew): its clock
    # resumes from the logged no-op, so the next write is stamped after the time read.
    restarted = ShardDocuments()
    restarted.clock = VectorClock(wall=lambda: float(WALL))
    restarted.load(shard.store)
    assert restarted.clock.cluster_time >= noop.ts
    decider = ShardDecider("a", shard.catalog, restarted, clock=restarted.clock)
    update = decider.decide(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=r))
    assert all(stamp(restarted.clock, e).ts > at for e in update.events if hasattr(e, "ts"))
