"""Secondary indexes on a shard, without Kafka: the decider and the fold over a real RocksDB
store, the build's state machine (protocol/index_build.py) step by step, with writes between
the steps, and replay of the changelog (whole and compacted) into a fresh store."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.indexes import IndexSpec, entries, key_prefix
from libs.errors import CommandError
from libs.store import Store
from schemas import Tombstone
from schemas import config as c
from schemas import ddl as dd
from schemas import indexes as ix
from schemas import shard as s
from services.shard.decide import ShardDecider
from services.shard.documents import ShardDocuments, changelog_key
from services.shard.protocol import index_build
from tests.shard_harness import ShardHarness


class Shard(ShardHarness):
    """The shared harness (tests/shard_harness.py: it keeps the changelog, for the replay
    tests), with index builds run to their end."""

    def build(self, ns: str, *specs: dict, build_id: str = "b1", limit: int = 3, between=None) -> list[dict]:
        """BuildIndexes, then steps (calling `between` before each) until every one is done."""
        _, result = self.run(ix.BuildIndexes(ns=ns, indexes=list(specs), buildId=build_id))
        replies = []
        for spec in specs:
            name = IndexSpec.parse(spec).name
            while True:
                if between is not None:
                    between()
                _, r = self.run(ix.IndexBuildStep(ns=ns, name=name, buildId=build_id, limit=limit))
                replies.append(r)
                if r["done"]:
                    break
        return replies

    def insert(self, ns: str, *docs, ordered: bool = True):
        return self.run(s.Insert(ns=ns, docs=list(docs), ordered=ordered, routing=self.routing(ns)))[1]

    def entries(self, ns: str, name: str) -> list:
        return [(k, key, _id) for k, key, _id in self.documents.scan_index(ns, name)]


def expected_entries(shard: Shard, ns: str, spec: dict) -> list:
    """A fresh rebuild: every document's entries, in entry order."""
    index = IndexSpec.parse(spec)
    out = {}
    for _, doc in shard.documents.scan(ns):
        for k, key in entries(index, doc)[0].items():
            out[k] = (k, key, doc["_id"])
    return [out[k] for k in sorted(out)]


def replay(path, log: list, *, compacted: bool = False) -> ShardDocuments:
    """A fresh store folded from `log` (compacted: only the last record of each key, at its place)."""
    if compacted:
        last = {}
        for i, e in enumerate(log):
            k = changelog_key(e)
            if k is not None:
                last[k] = i
        log = [e for i, e in enumerate(log) if (k := changelog_key(e)) is None or last[k] == i]
        log = [e for e in log if not isinstance(e, Tombstone)]
    store = Store(path)
    docs = ShardDocuments()
    docs.load(store)
    for i, e in enumerate(log):
        docs.apply(e, i)
        if i % 7 == 0:
            store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
    store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
    docs.load(store)
    return docs


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    yield sh
    sh.store.close()


A = {"key": {"a": 1}, "name": "a_1"}


# ------------------------------------------------------------------ the build


def test_a_build_indexes_every_existing_document_in_steps_and_ends_ready(shard):
    shard.insert("d.c", *({"_id": i, "a": i % 4, "b": [i, i + 1] if i % 5 == 0 else i} for i in range(10)))
    shard.commit()
    replies = shard.build("d.c", A, {"key": {"b": -1, "a": 1}}, limit=3)
    assert [r["state"] for r in replies[:4]] == ["building"] * 3 + ["ready"]
    assert replies[3]["scanned"] == 10 and replies[3]["total"] == 10
    assert shard.entries("d.c", "a_1") == expected_entries(shard, "d.c", A)
    assert shard.entries("d.c", "b_-1_a_1") == expected_entries(shard, "d.c", {"key": {"b": -1, "a": 1}})
    listed = {i["spec"]["name"]: i for i in shard.run(ix.ListIndexes(ns="d.c"))[1]["indexes"]}
    assert listed["_id_"]["implicit"] and listed["a_1"]["state"] == "ready"
    assert listed["b_-1_a_1"]["multikey"] and not listed["a_1"]["multikey"]


def test_a_collection_without_documents_has_its_index_ready_at_once(shard):
    _, r = shard.run(ix.BuildIndexes(ns="d.e", indexes=[A], buildId="b1"))
    assert r["indexes"] == [{"name": "a_1", "state": "ready", "joined": False}]
    assert r["numIndexesBefore"] == 1 and r["numIndexesAfter"] == 2
    shard.insert("d.e", {"_id": 1, "a": 5})
    assert [key for _, key, _ in shard.entries("d.e", "a_1")] == [(5,)]


def test_the_same_index_again_is_joined_or_already_there_and_conflicts_are_refused(shard):
    shard.insert("d.c", {"_id": 1, "a": 1})
    _, r = shard.run(ix.BuildIndexes(ns="d.c", indexes=[A], buildId="b1"))
    assert r["indexes"][0]["state"] == "building"
    events, r = shard.run(ix.BuildIndexes(ns="d.c", indexes=[A], buildId="b1"))
    assert events == [] and r["indexes"][0]["joined"]
    shard.build("d.c", A)
    events, r = shard.run(ix.BuildIndexes(ns="d.c", indexes=[A], buildId="b2"))
    assert events == [] and r["note"] == "all indexes already exist"
    with pytest.raises(CommandError) as e:
        shard.run(ix.BuildIndexes(ns="d.c", indexes=[{"key": {"b": 1}, "name": "a_1"}], buildId="b3"))
    assert e.value.code == "IndexKeySpecsConflict"
    with pytest.raises(CommandError) as e:
        shard.run(ix.BuildIndexes(ns="d.c", indexes=[{"key": {"a": 1}, "name": "other"}], buildId="b3"))
    assert e.value.code == "IndexOptionsConflict"


def test_a_unique_index_needs_the_shard_key_as_its_prefix(shard):
    shard.config(c.ShardCollection(ns="d.s", key={"k": 1}))
    with pytest.raises(CommandError) as e:
        shard.run(ix.BuildIndexes(ns="d.s", indexes=[{"key": {"a": 1}, "unique": True}], buildId="b"))
    assert e.value.code == "CannotCreateIndex"
    _, r = shard.run(ix.BuildIndexes(ns="d.s", indexes=[{"key": {"k": 1, "a": 1}, "unique": True}], buildId="b"))
    assert r["indexes"][0]["state"] == "ready"


def test_writes_between_the_steps_keep_the_index_right(shard):
    rng = random.Random(7)
    shard.insert("d.c", *({"_id": i, "a": rng.randrange(5)} for i in range(40)))
    shard.commit()
    next_id = iter(range(100, 1000))

    def write():
        op = rng.randrange(4)
        if op == 0:
            shard.insert("d.c", {"_id": next(next_id), "a": rng.choice([rng.randrange(5), [1, 2], None])})
        elif op == 1:
            shard.run(
                s.Update(
                    ns="d.c",
                    filter={"_id": rng.randrange(40)},
                    update={"$set": {"a": rng.randrange(9)}},
                    routing=shard.routing("d.c"),
                )
            )
        elif op == 2:
            shard.run(s.Delete(ns="d.c", filter={"_id": rng.randrange(40)}, routing=shard.routing("d.c")))
        else:
            shard.commit()

    shard.build("d.c", A, limit=4, between=write)
    for _ in range(20):
        write()
    shard.commit()
    assert shard.entries("d.c", "a_1") == expected_entries(shard, "d.c", A)


def test_a_unique_build_that_finds_a_duplicate_fails_and_leaves_no_entry(shard):
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(10)), {"_id": 99, "a": 7})
    shard.commit()
    spec = {"key": {"a": 1}, "unique": True}
    replies = shard.build("d.c", spec, limit=4)
    last = replies[-1]
    assert last["state"] == "failed"
    assert last["error"]["code"] == "DuplicateKey" and last["error"]["keyValue"] == {"a": 7}
    assert "index: a_1 dup key: { a: 7 }" in last["error"]["errmsg"]
    shard.commit()
    assert shard.entries("d.c", "a_1") == []
    shard.insert("d.c", {"_id": 100, "a": 500})  # a failed index is not maintained
    assert shard.entries("d.c", "a_1") == []
    shard.run(ix.DropIndexes(ns="d.c", names=["a_1"], missingOk=True))
    assert "a_1" not in shard.documents.indexes.get("d.c", {})


def test_a_duplicate_written_during_a_unique_build_fails_it(shard):
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(10)))
    done = []

    def dup():
        if not done:
            shard.insert("d.c", {"_id": 50, "a": 3})  # not checked while building
            done.append(1)

    replies = shard.build("d.c", {"key": {"a": 1}, "unique": True}, limit=4, between=dup)
    assert replies[-1]["state"] == "failed"
    assert shard.entries("d.c", "a_1") == []


def test_a_duplicate_gone_before_the_end_lets_a_unique_build_succeed(shard):
    """As MongoDB's hybrid build: a write is not refused for a key a building index holds
    twice, and the build fails only if the key is still held twice at its end."""
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(10)))
    steps = iter(range(100))

    def between():
        n = next(steps)
        if n == 1:
            assert shard.insert("d.c", {"_id": 50, "a": 3})["inserted"] == 1
            assert shard.documents.indexes["d.c"]["a_1"].record.dupPrefixes  # noted for the end
        elif n == 2:
            shard.run(s.Delete(ns="d.c", filter={"_id": 3}, routing=shard.routing("d.c")))

    replies = shard.build("d.c", {"key": {"a": 1}, "unique": True}, limit=4, between=between)
    assert replies[-1]["state"] == "ready"
    record = shard.documents.indexes["d.c"]["a_1"].record
    assert record.dupPrefixes == [] and not record.dupOverflow
    shard.commit()
    assert shard.entries("d.c", "a_1") == expected_entries(shard, "d.c", {"key": {"a": 1}})
    assert shard.insert("d.c", {"_id": 51, "a": 3})["writeErrors"]  # ready: enforced


def test_a_write_into_the_scanned_part_that_duplicates_a_key_fails_the_build(shard):
    """The steps never see again a document behind `scannedTo`: the write itself notes the key."""
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(6)))
    shard.commit()
    shard.run(ix.BuildIndexes(ns="d.c", indexes=[{"key": {"a": 1}, "unique": True}], buildId="b"))
    shard.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b", limit=3))  # _ids 0, 1, 2
    shard.run(s.Update(ns="d.c", filter={"_id": 0}, update={"$set": {"a": 2}}, routing=shard.routing("d.c")))
    while not (r := shard.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b", limit=3))[1])["done"]:
        pass
    assert r["state"] == "failed" and r["error"]["keyValue"] == {"a": 2}


def test_a_unique_builds_last_step_reads_only_the_keys_it_must_recheck(shard):
    """The exclusive last step is short: it rechecks the noted keys, it does not read the index."""
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(200)))
    shard.commit()
    shard.run(ix.BuildIndexes(ns="d.c", indexes=[{"key": {"a": 1}, "unique": True}], buildId="b"))
    read: list[int] = []
    scan_index = shard.documents.scan_index

    def counted(*args, **kwargs):
        for item in scan_index(*args, **kwargs):
            read[-1] += 1
            yield item

    shard.documents.scan_index = counted  # type: ignore[method-assign]
    shard.insert("d.c", {"_id": 500, "a": 150})  # a key to recheck: _id 150 is not indexed yet
    while True:
        read.append(0)
        _, r = shard.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b", limit=64))
        if r["done"]:
            break
    assert r["state"] == "failed" and r["error"]["keyValue"] == {"a": 150}
    # Last step: 201 - 3 * 64 = 9 documents, each one seek; then one key's two holders.
    assert read[-1] <= 9 + 2, read


def test_a_document_the_index_cannot_take_fails_the_build_and_is_refused_once_ready(shard):
    shard.insert("d.c", {"_id": 1, "a": [1, 2], "b": [3, 4]})
    replies = shard.build("d.c", {"key": {"a": 1, "b": 1}})
    assert replies[-1]["state"] == "failed" and replies[-1]["error"]["code"] == "CannotIndexParallelArrays"
    shard.run(ix.DropIndexes(ns="d.c", names=["a_1_b_1"]))
    shard.run(s.Delete(ns="d.c", filter={}, multi=True, routing=shard.routing("d.c")))
    shard.build("d.c", {"key": {"a": 1, "b": 1}})
    r = shard.insert("d.c", {"_id": 2, "a": [1, 2], "b": [3, 4]})
    assert r["writeErrors"][0]["code"] == "CannotIndexParallelArrays"


# ------------------------------------------------------------------ unique writes


@pytest.fixture
def unique(shard):
    shard.insert("d.c", {"_id": 1, "a": 1}, {"_id": 2, "a": 2})
    shard.build("d.c", {"key": {"a": 1}, "unique": True})
    return shard


def test_a_ready_unique_index_refuses_a_second_document_under_a_key(unique):
    r = unique.insert("d.c", {"_id": 3, "a": 1})
    err = r["writeErrors"][0]
    assert err["code"] == "DuplicateKey" and "index: a_1 dup key: { a: 1 }" in err["errmsg"]


def test_duplicates_within_one_batch_ordered_and_unordered(unique):
    r = unique.insert("d.c", {"_id": 3, "a": 3}, {"_id": 4, "a": 3}, {"_id": 5, "a": 5})
    assert r["inserted"] == 1 and [e["index"] for e in r["writeErrors"]] == [1]
    r = unique.insert("d.c", {"_id": 6, "a": 6}, {"_id": 7, "a": 6}, {"_id": 8, "a": 8}, ordered=False)
    assert r["inserted"] == 2 and [e["index"] for e in r["writeErrors"]] == [1]


def test_updates_and_upserts_are_checked_and_the_error_carries_key_pattern_and_value(unique):
    with pytest.raises(CommandError) as e:
        unique.run(s.Update(ns="d.c", filter={"_id": 2}, update={"$set": {"a": 1}}, routing=unique.routing("d.c")))
    assert e.value.code == "DuplicateKey" and e.value.info == {"keyPattern": {"a": 1}, "keyValue": {"a": 1}}
    with pytest.raises(CommandError):
        unique.run(
            s.Update(ns="d.c", filter={"_id": 9}, update={"$set": {"a": 2}}, upsert=True, routing=unique.routing("d.c"))
        )
    # The same document keeping its key is no duplicate of itself.
    unique.run(s.Update(ns="d.c", filter={"_id": 2}, update={"$set": {"x": 1}}, routing=unique.routing("d.c")))
    with pytest.raises(CommandError):
        unique.run(
            s.FindAndModify(ns="d.c", query={"_id": 2}, update={"$set": {"a": 1}}, routing=unique.routing("d.c"))
        )
    # A key freed by a delete may be taken again.
    unique.run(s.Delete(ns="d.c", filter={"_id": 1}, routing=unique.routing("d.c")))
    assert unique.insert("d.c", {"_id": 3, "a": 1})["inserted"] == 1


def test_the_shard_keys_unique_check_and_the_id_check_have_the_same_shape(shard):
    r = shard.insert("d.c", {"_id": 1}, {"_id": 1})
    assert r["writeErrors"][0]["code"] == "DuplicateKey"
    assert "index: _id_ dup key: { _id: 1 }" in r["writeErrors"][0]["errmsg"]


# ------------------------------------------------------------------ drop, list, multikey


def test_drop_indexes_refusals_and_star(shard):
    shard.config(c.ShardCollection(ns="d.s", key={"k": 1}))
    shard.run(ix.BuildIndexes(ns="d.s", indexes=[A, {"key": {"b": 1}}], buildId="b"))
    for names, code in ((["_id_"], "InvalidOptions"), (["k_1"], "CannotDropShardKeyIndex"), (["zz"], "IndexNotFound")):
        with pytest.raises(CommandError) as e:
            shard.run(ix.DropIndexes(ns="d.s", names=names))
        assert e.value.code == code
    events, r = shard.run(ix.DropIndexes(ns="d.s", names=["zz"], missingOk=True))
    assert events == [] and r["dropped"] == []
    events, r = shard.run(ix.DropIndexes(ns="d.s", names=["*"]))
    assert r["dropped"] == ["a_1", "b_1"] and r["nIndexesWas"] == 4
    assert sum(isinstance(e, Tombstone) for e in events) == 2
    assert shard.documents.indexes.get("d.s") is None


def test_a_write_that_makes_an_index_multikey_records_it(shard):
    shard.build("d.e", A)
    events, _ = shard.run(
        s.Insert(ns="d.e", docs=[{"_id": 1, "a": [1, 2]}, {"_id": 2, "a": [3]}], routing=shard.routing("d.e"))
    )
    recorded = [e for e in events if isinstance(e, ix.IndexRecorded)]
    assert len(recorded) == 1 and recorded[0].multikey and recorded[0].state == "ready"
    assert shard.documents.indexes["d.e"]["a_1"].record.multikey
    events, _ = shard.run(s.Insert(ns="d.e", docs=[{"_id": 3, "a": [4, 5]}], routing=shard.routing("d.e")))
    assert not any(isinstance(e, ix.IndexRecorded) for e in events)


def test_scan_index_bounds_and_reverse_see_pending_writes(shard):
    shard.build("d.e", A)
    shard.insert("d.e", *({"_id": i, "a": i} for i in range(6)))
    shard.commit()
    shard.insert("d.e", {"_id": 10, "a": 2.5})
    shard.run(s.Delete(ns="d.e", filter={"_id": 4}, routing=shard.routing("d.e")))
    spec = IndexSpec.parse(A)
    from domain.indexes import key_prefix

    lo, hi = key_prefix(spec, (2,)), key_prefix(spec, (5,))
    forward = [key for _, key, _ in shard.documents.scan_index("d.e", "a_1", lo, hi)]
    assert forward == [(2,), (2.5,), (3,)]
    backward = [_id for _, _, _id in shard.documents.scan_index("d.e", "a_1", lo, hi, reverse=True)]
    assert backward == [3, 10, 2]
    everything = [_id for _, _, _id in shard.documents.scan_index("d.e", "a_1", reverse=True)]
    assert everything == [5, 3, 10, 2, 1, 0]
    assert shard.documents.get_by_id("d.e", 10) == {"_id": 10, "a": 2.5}
    assert shard.documents.get_by_id("d.e", 4) is None


# ------------------------------------------------------------------ the other write paths


def test_dropping_the_collection_or_the_database_leaves_no_entry_and_no_index(shard):
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(5)))
    shard.build("d.c", A)
    shard.commit()
    shard.run(dd.DropLocalData(id="x1", ns="d.c"))
    shard.commit()
    assert shard.entries("d.c", "a_1") == [] and "d.c" not in shard.documents.indexes
    assert list(shard.store.scan(b"k/")) == [] and list(shard.store.scan(b"n/")) == []
    shard.insert("d.c2", *({"_id": i, "a": i} for i in range(5)))
    shard.build("d.c2", A)
    shard.run(dd.DropLocalData(id="x2", db="d"))
    shard.commit()
    assert list(shard.store.scan(b"k/")) == [] and list(shard.store.scan(b"n/")) == []


def test_a_rename_moves_the_index_and_its_entries(shard):
    shard.insert("d.c", *({"_id": i, "a": i} for i in range(7)))
    shard.build("d.c", A)
    shard.commit()
    # The catalog as the rename's coordinator leaves it: d.c gone, d.r there (unsharded, primary a).
    shard.catalog.apply(dd.CollectionRenamed(ns="d.c", to="d.r"), shard.catalog.config_time)
    while True:
        _, r = shard.run(dd.RenameLocalBatch(id="r1", ns="d.c", to="d.r", limit=3))
        if r["done"]:
            break
    shard.commit()
    assert "d.c" not in shard.documents.indexes and shard.documents.indexes["d.r"]["a_1"].state == "ready"
    assert [_id for _, _, _id in shard.documents.scan_index("d.r", "a_1")] == list(range(7))
    assert list(shard.store.scan(b"k/d.c\x00")) == []


def test_range_deletion_and_a_recipients_clone_keep_the_entries(shard):
    shard.config(c.ShardCollection(ns="d.s", key={"k": 1}))
    # The recipient side: the donor's indexes arrive with StartReceipt, before any document.
    coll = shard.catalog.collections["d.s"]
    shard.build("d.s", A)
    assert shard.documents.indexes["d.s"]["a_1"].state == "ready"
    shard.insert("d.s", *({"_id": i, "k": i, "a": -i} for i in range(5)))
    shard.commit()
    assert len(shard.entries("d.s", "a_1")) == 5
    # A document removed by a range deletion (any DocumentRemoved) takes its entries along.
    shard.documents.apply(s.DocumentRemoved(ns="d.s", skey=coll.pattern.encode_doc({"k": 3}).hex(), id=3), -1)
    shard.commit()
    assert [_id for _, _, _id in shard.entries("d.s", "a_1")] == [4, 2, 1, 0]


def test_a_recipient_records_the_indexes_it_lacks_before_the_clone(shard):
    events = index_build.missing_indexes(
        shard.documents.indexes,
        "d.n",
        [{"v": 2, "key": {"_id": 1}, "name": "_id_"}, {"v": 2, "key": {"a": 1}, "name": "a_1"}],
        "migration:m1",
    )
    assert [e.state for e in events] == ["ready"] and events[0].spec["name"] == "a_1"
    for e in events:
        shard.documents.apply(e, -1)
    shard.documents.apply(s.DocumentWritten(ns="d.n", skey="00", doc={"_id": 1, "a": 9}), -1)
    assert [key for _, key, _ in shard.entries("d.n", "a_1")] == [(9,)]
    assert (
        index_build.missing_indexes(shard.documents.indexes, "d.n", [{"v": 2, "key": {"a": 1}, "name": "a_1"}], "m2")
        == []
    )
    assert index_build.ready_specs(shard.documents.indexes, "d.n") == [{"v": 2, "key": {"a": 1}, "name": "a_1"}]


# ------------------------------------------------------------------ replay


def test_replay_of_the_changelog_whole_and_compacted_rebuilds_the_same_entries(shard, tmp_path):
    rng = random.Random(3)
    shard.insert("d.c", *({"_id": i, "a": rng.randrange(6), "b": [rng.randrange(3)]} for i in range(30)))
    shard.commit()

    def write():
        i = rng.randrange(60)
        if rng.random() < 0.5:
            shard.run(
                s.Update(
                    ns="d.c",
                    filter={"_id": i},
                    update={"$set": {"a": rng.randrange(6)}},
                    upsert=True,
                    routing=shard.routing("d.c"),
                )
            )
        else:
            shard.run(s.Delete(ns="d.c", filter={"_id": i}, routing=shard.routing("d.c")))

    shard.build("d.c", A, {"key": {"b": 1, "a": -1}}, limit=4, between=write)
    for _ in range(10):
        write()
    shard.commit()
    want = {n: shard.entries("d.c", n) for n in ("a_1", "b_1_a_-1")}
    for compacted in (False, True):
        docs = replay(tmp_path / f"replay-{compacted}", shard.log, compacted=compacted)
        for name, expected in want.items():
            assert list(docs.scan_index("d.c", name)) == expected, (compacted, name)
        assert {n: i.state for n, i in docs.indexes["d.c"].items()} == {"a_1": "ready", "b_1_a_-1": "ready"}


def test_replay_of_a_build_cut_short_resumes_from_scanned_to(shard, tmp_path):
    shard.insert("d.c", *({"_id": i, "a": i % 3} for i in range(10)))
    shard.run(ix.BuildIndexes(ns="d.c", indexes=[A], buildId="b1"))
    shard.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b1", limit=4))
    docs = replay(tmp_path / "cut", shard.log, compacted=True)
    record = docs.indexes["d.c"]["a_1"].record
    assert record.state == "building" and record.scanned == 4
    assert len(list(docs.scan_index("d.c", "a_1"))) == 4
    # The restarted shard's builder goes on from there.
    again = Shard.__new__(Shard)
    again.catalog, again.documents, again.log = shard.catalog, docs, []
    again.decider = ShardDecider("a", shard.catalog, docs)
    while not again.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b1", limit=4))[1]["done"]:
        pass
    assert len(list(docs.scan_index("d.c", "a_1"))) == 10


# ------------------------------------------------------------------ property


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "update", "delete", "commit", "step"]),
        st.integers(0, 15),
        st.one_of(st.integers(0, 4), st.lists(st.integers(0, 4), max_size=3), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    initial=st.lists(st.one_of(st.integers(0, 4), st.none(), st.lists(st.integers(0, 4), max_size=3)), max_size=20),
    program=ops,
    limit=st.integers(1, 5),
)
def test_property_entries_equal_a_fresh_rebuild_whatever_the_writes_between_steps(
    tmp_path_factory, initial, program, limit
):
    sh = Shard(tmp_path_factory.mktemp("p"))
    sh.config(c.CreateDatabase(db="d", primary="a"))
    try:
        sh.insert("d.c", *({"_id": i, "a": v} for i, v in enumerate(initial)))
        sh.commit()
        sh.run(ix.BuildIndexes(ns="d.c", indexes=[{"key": {"a": -1}}], buildId="b"))
        for op, i, v in program:
            if op == "insert":
                sh.insert("d.c", {"_id": 100 + i, "a": v})
            elif op == "update":
                sh.run(s.Update(ns="d.c", filter={"_id": i}, update={"$set": {"a": v}}, routing=sh.routing("d.c")))
            elif op == "delete":
                sh.run(s.Delete(ns="d.c", filter={"_id": i}, routing=sh.routing("d.c")))
            elif op == "commit":
                sh.commit()
            else:
                sh.run(ix.IndexBuildStep(ns="d.c", name="a_-1", buildId="b", limit=limit))
        while not sh.run(ix.IndexBuildStep(ns="d.c", name="a_-1", buildId="b", limit=limit))[1]["done"]:
            pass
        sh.commit()
        want = expected_entries(sh, "d.c", {"key": {"a": -1}})
        assert sh.entries("d.c", "a_-1") == want
        assert list(replay(sh.path / "r", sh.log, compacted=True).scan_index("d.c", "a_-1")) == want
    finally:
        sh.store.close()


short_keys = st.binary(min_size=1, max_size=3).map(lambda b: bytes(1 + x % 5 for x in b))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stored=st.sets(short_keys, max_size=40),
    pending=st.dictionaries(short_keys, st.sampled_from([None, b"p"]), max_size=6),
    deleted=st.lists(st.tuples(short_keys, short_keys), max_size=2),
    bounds=st.tuples(short_keys, short_keys),
)
def test_property_the_merged_view_forward_and_reversed_is_the_store_with_the_open_batch(
    tmp_path_factory, stored, pending, deleted, bounds
):
    """Pending writes and range deletions over committed keys, in both directions (what
    scan_index(reverse=True) reads)."""
    store = Store(tmp_path_factory.mktemp("m") / "s")
    try:
        store.commit([(k, b"v") for k in stored], None)
        docs = ShardDocuments()
        docs.load(store)
        docs._range_deletions = [(lo, hi) for lo, hi in deleted if lo < hi]
        docs._changes = dict(pending)
        start, stop = sorted(bounds)
        model = {k: b"v" for k in stored if not any(lo <= k < hi for lo, hi in docs._range_deletions)}
        for k, v in pending.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        want = sorted((k, v) for k, v in model.items() if start <= k < stop)
        assert list(docs._merged(start, stop)) == want
        assert list(docs._merged(start, stop, reverse=True)) == want[::-1]
    finally:
        store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(4, 16),
    program=st.lists(
        st.tuples(
            st.sampled_from(["insert", "update", "update", "delete", "commit", "step", "step"]),
            st.integers(0, 15),
            st.one_of(st.integers(0, 15), st.none()),
        ),
        max_size=40,
    ),
    limit=st.integers(1, 3),
)
def test_property_a_unique_build_fails_exactly_when_a_key_is_held_twice_at_its_end(tmp_path_factory, n, program, limit):
    """The documents start with distinct keys: only the writes between the steps make duplicates."""
    sh = Shard(tmp_path_factory.mktemp("u"))
    sh.config(c.CreateDatabase(db="d", primary="a"))
    spec = {"key": {"a": 1}, "unique": True}
    index = IndexSpec.parse(spec)

    def held_twice() -> bool:
        holders: dict = {}
        for _, key, _id in expected_entries(sh, "d.c", {"key": {"a": 1}}):
            holders.setdefault(key_prefix(index, key), set()).add(_id)
        return any(len(ids) > 1 for ids in holders.values())

    def step() -> bool:
        twice = held_twice()  # the documents as the step sees them
        r = sh.run(ix.IndexBuildStep(ns="d.c", name="a_1", buildId="b", limit=limit))[1]
        if r["done"]:
            assert r["state"] == ("failed" if twice else "ready"), r
        return r["done"]

    try:
        sh.insert("d.c", *({"_id": i, "a": i} for i in range(n)))
        sh.commit()
        sh.run(ix.BuildIndexes(ns="d.c", indexes=[spec], buildId="b"))
        for op, i, v in program:
            if op == "insert":
                sh.insert("d.c", {"_id": 100 + i, "a": v})
            elif op == "update":
                sh.run(s.Update(ns="d.c", filter={"_id": i}, update={"$set": {"a": v}}, routing=sh.routing("d.c")))
            elif op == "delete":
                sh.run(s.Delete(ns="d.c", filter={"_id": i}, routing=sh.routing("d.c")))
            elif op == "commit":
                sh.commit()
            elif step():
                return
        while not step():
            pass
    finally:
        sh.store.close()
