"""Issue 18, points 1, 2 and 9: a unique shard key enforced on its shard, sharding refused when
existing documents cannot be keyed, and shardCollection re-run as MongoDB answers it.  The
shard's decider over a real RocksDB store (tests/unit/test_shard_decide.Shard)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from bson import Decimal128, Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import CommandError
from schemas import config as c
from schemas import shard as s
from tests.unit.test_shard_decide import Shard


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    yield sh
    sh.store.close()


def _sharded(shard: Shard, ns: str, key: dict, unique: bool = True) -> None:
    shard.config(c.ShardCollection(ns=ns, key=key, unique=unique))


def _insert(shard: Shard, ns: str, docs: list[dict], ordered: bool = True) -> dict:
    return shard.run(s.Insert(ns=ns, docs=docs, ordered=ordered, routing=shard.routing(ns)))[1]


def _count(shard: Shard, ns: str, flt: dict | None = None) -> int:
    return shard.run(s.Count(ns=ns, filter=flt or {}, routing=shard.routing(ns)))[1]["n"]


def test_a_second_document_with_a_unique_key_is_refused_in_mongodbs_shape(shard):
    _sharded(shard, "d.u", {"email": 1})
    assert _insert(shard, "d.u", [{"_id": 1, "email": "c"}])["inserted"] == 1
    result = _insert(shard, "d.u", [{"_id": 2, "email": "c"}])
    assert result["inserted"] == 0
    assert result["writeErrors"] == [
        {
            "index": 0,
            "code": "DuplicateKey",
            "errmsg": 'E11000 duplicate key error collection: d.u index: email_1 dup key: { email: "c" }',
            "keyPattern": {"email": 1},  # as MongoDB's writeErrors element carries them
            "keyValue": {"email": "c"},
        }
    ]
    assert _count(shard, "d.u") == 1


def test_equal_numbers_of_different_types_are_one_key(shard):
    _sharded(shard, "d.n", {"k": 1})
    _insert(shard, "d.n", [{"_id": 1, "k": 1}])
    for i, same in enumerate([1.0, Int64(1), Decimal128("1.00")], start=2):
        assert _insert(shard, "d.n", [{"_id": i, "k": same}])["writeErrors"][0]["code"] == "DuplicateKey"
    # A decimal whose encoding continues that of the nearest double is another key.
    _insert(shard, "d.n", [{"_id": 10, "k": 0.3}])
    assert _insert(shard, "d.n", [{"_id": 11, "k": Decimal128("0.3")}])["inserted"] == 1


def test_a_non_unique_key_takes_duplicates(shard):
    _sharded(shard, "d.m", {"email": 1}, unique=False)
    assert _insert(shard, "d.m", [{"_id": 1, "email": "c"}, {"_id": 2, "email": "c"}])["inserted"] == 2


def test_a_compound_unique_key_within_one_ordered_batch_stops_at_the_duplicate(shard):
    _sharded(shard, "d.o", {"a": 1, "b": 1})
    docs = [{"_id": 1, "a": 1, "b": "x"}, {"_id": 2, "a": 1, "b": "x"}, {"_id": 3, "a": 1, "b": "y"}]
    result = _insert(shard, "d.o", docs)
    assert result["inserted"] == 1
    assert [(e["index"], e["code"]) for e in result["writeErrors"]] == [(1, "DuplicateKey")]
    assert 'index: a_1_b_1 dup key: { a: 1, b: "x" }' in result["writeErrors"][0]["errmsg"]
    assert _count(shard, "d.o") == 1


def test_a_compound_unique_key_within_one_unordered_batch_inserts_the_others(shard):
    _sharded(shard, "d.un", {"a": 1, "b": 1})
    docs = [{"_id": 1, "a": 1, "b": "x"}, {"_id": 2, "a": 1, "b": "x"}, {"_id": 3, "a": 1, "b": "y"}]
    result = _insert(shard, "d.un", docs, ordered=False)
    assert result["inserted"] == 2
    assert [(e["index"], e["code"]) for e in result["writeErrors"]] == [(1, "DuplicateKey")]
    assert _count(shard, "d.un") == 2


@pytest.mark.parametrize("kind", ["update", "findAndModify"])
def test_an_upsert_into_a_taken_unique_key_is_refused(shard, kind):
    ns = f"d.up{kind}"
    _sharded(shard, ns, {"email": 1})
    _insert(shard, ns, [{"_id": 1, "email": "c", "n": 1}])
    routing = shard.routing(ns)
    if kind == "update":
        req = s.Update(ns=ns, filter={"email": "c", "n": 2}, update={"$set": {"m": 1}}, upsert=True, routing=routing)
    else:
        req = s.FindAndModify(
            ns=ns, query={"email": "c", "n": 2}, update={"$set": {"m": 1}}, upsert=True, routing=routing
        )
    with pytest.raises(CommandError) as e:
        shard.run(req)
    assert e.value.code == "DuplicateKey" and "index: email_1" in e.value.message
    assert _count(shard, ns) == 1


def test_an_update_keeping_the_key_is_no_duplicate(shard):
    _sharded(shard, "d.keep", {"email": 1})
    _insert(shard, "d.keep", [{"_id": 1, "email": "c"}])
    _, result = shard.run(
        s.Update(ns="d.keep", filter={"email": "c"}, update={"$set": {"n": 1}}, routing=shard.routing("d.keep"))
    )
    assert result == {"matched": 1, "modified": 1}


_keys = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, 0.3, 2.0, float("nan")]),
    st.sampled_from([Decimal128("0.3"), Decimal128("1"), Decimal128("0.5"), Decimal128("NaN")]),
    st.sampled_from(["", "a", "a\x00", "ab"]),
    st.none(),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_keys, min_size=1, max_size=8))
def test_a_unique_key_admits_each_value_once_whatever_its_type(values):
    """Each insert is refused exactly when an equal value (MongoDB's comparison) went in before."""
    from domain.shardkey import encode_value

    with tempfile.TemporaryDirectory() as tmp:
        shard = Shard(Path(tmp))
        try:
            shard.config(c.CreateDatabase(db="d", primary="a"))
            _sharded(shard, "d.p", {"k": 1})
            taken: set[bytes] = set()
            for i, v in enumerate(values):
                result = _insert(shard, "d.p", [{"_id": i, "k": v}])
                assert (result["inserted"] == 0) == (encode_value(v) in taken), (v, result)
                taken.add(encode_value(v))
        finally:
            shard.store.close()


# ------------------------------------------------- point 2: existing documents, checked first


def _check(shard: Shard, ns: str, key: dict, unique: bool = False) -> dict:
    return shard.run(s.CheckShardKey(ns=ns, key=key, unique=unique))[1]


def test_existing_documents_with_an_array_key_are_refused_before_sharding(shard):
    _insert(shard, "d.arr", [{"_id": 1, "k": [1, 2]}, {"_id": 2, "k": 3}])
    with pytest.raises(CommandError) as e:
        _check(shard, "d.arr", {"k": 1})
    assert e.value.code == "InvalidOptions"
    assert "couldn't find valid index for shard key" in e.value.message and "{ _id: 1 }" in e.value.message
    assert _count(shard, "d.arr") == 2  # still unsharded and usable


@pytest.mark.parametrize("key", [{"a.b": 1}, {"x": 1, "a.b": 1}])
def test_an_array_on_a_dotted_path_is_refused_too(shard, key):
    _insert(shard, "d.dot", [{"_id": 1, "x": 1, "a": [{"b": 1}]}])
    with pytest.raises(CommandError) as e:
        _check(shard, "d.dot", key)
    assert e.value.code == "InvalidOptions"


def test_an_existing_key_over_the_size_limit_is_refused(shard):
    _insert(shard, "d.big", [{"_id": 1, "k": "x" * 600}])
    with pytest.raises(CommandError) as e:
        _check(shard, "d.big", {"k": 1})
    assert e.value.code == "ShardKeyTooLarge" and "{ _id: 1 }" in e.value.message


def test_missing_key_fields_are_null_and_allowed(shard):
    _insert(shard, "d.miss", [{"_id": 1}, {"_id": 2, "k": None}, {"_id": 3, "k": 1}])
    assert _check(shard, "d.miss", {"k": 1}) == {"documents": 3}
    with pytest.raises(CommandError) as e:  # two nulls cannot be unique
        _check(shard, "d.miss", {"k": 1}, unique=True)
    assert e.value.code == "DuplicateKey" and "dup key: { k: null }" in e.value.message


def test_existing_duplicates_refuse_a_unique_key(shard):
    _insert(shard, "d.dup", [{"_id": 1, "e": "c"}, {"_id": 2, "e": "d"}, {"_id": 3, "e": "c"}])
    assert _check(shard, "d.dup", {"e": 1}) == {"documents": 3}
    with pytest.raises(CommandError) as e:
        _check(shard, "d.dup", {"e": 1}, unique=True)
    assert e.value.message == 'E11000 duplicate key error collection: d.dup index: e_1 dup key: { e: "c" }'


def test_valid_existing_documents_shard_and_stay_found(shard):
    _insert(shard, "d.ok", [{"_id": i, "k": i % 3} for i in range(6)])
    assert _check(shard, "d.ok", {"k": 1}) == {"documents": 6}
    _sharded(shard, "d.ok", {"k": 1}, unique=False)
    assert _count(shard, "d.ok", {"k": 1}) == 2


def test_writes_during_a_donations_catch_up_still_check_the_unique_key(shard):
    """While the donor clones and catches up it still owns the range and decides every write
    to it, so the recipient can never be sent two documents with one key."""
    _sharded(shard, "d.mig", {"k": 1})
    epoch = shard.catalog.collections["d.mig"].epoch
    shard.config(c.SplitChunk(ns="d.mig", at=[{"k": 100}]))
    lo, hi = {"k": 0}, {"k": 100}
    shard.catalog.apply(
        c.MigrationRequested(id="m1", ns="d.mig", epoch=epoch, min=lo, max=hi, donor="a", recipient="b"),
        shard.catalog.config_time,
    )
    _insert(shard, "d.mig", [{"_id": 1, "k": 1}])
    shard.documents.apply(
        s.MigrationRecorded(id="m1", role="donor", ns="d.mig", epoch=epoch, min=lo, max=hi, peer="b", state="cloning"),
        -1,
    )
    assert _insert(shard, "d.mig", [{"_id": 2, "k": 1}])["writeErrors"][0]["code"] == "DuplicateKey"
    assert _insert(shard, "d.mig", [{"_id": 3, "k": 2}])["inserted"] == 1
    assert _count(shard, "d.mig") == 2


def test_the_router_and_the_cli_ask_the_primary_unless_there_is_nothing_to_check(shard):
    from domain import sharding_commands as sc

    record = c.ShardCollection(ns="d.t", key={"k": 1}, unique=True)
    assert sc.existing_documents_check(shard.catalog, record) is None  # nothing written yet
    _insert(shard, "d.t", [{"_id": 1, "k": 1}])
    shard.config(c.CreateCollection(ns="d.t"))  # as the router records it on the first write
    assert sc.existing_documents_check(shard.catalog, record) == (
        "a",
        s.CheckShardKey(ns="d.t", key={"k": 1}, unique=True),
    )
    assert sc.existing_documents_check(shard.catalog, c.ShardCollection(ns="new.t", key={"k": 1})) is None
    _sharded(shard, "d.t", {"k": 1})
    assert sc.existing_documents_check(shard.catalog, record) is None  # the config server answers


def test_writes_wait_while_the_checked_shard_collection_is_decided(shard):
    """No document slips in between the primary's check and the catalog change: the checked
    collection's writes are refused retriably (a critical section's StaleConfig) until the
    collection is sharded, or the hold lapses (a refused shardCollection)."""
    from services.shard.decide import SHARDING_HOLD_S

    now = [1000.0]
    shard.decider.wall = lambda: now[0]
    _insert(shard, "d.h", [{"_id": 1, "k": 1}])
    _check(shard, "d.h", {"k": 1})
    for req in (
        s.Insert(ns="d.h", docs=[{"_id": 2, "k": [1, 2]}], routing=shard.routing("d.h")),
        s.Update(ns="d.h", filter={"_id": 1}, update={"$set": {"k": [3]}}, routing=shard.routing("d.h")),
        s.Delete(ns="d.h", filter={"_id": 1}, routing=shard.routing("d.h")),
    ):
        with pytest.raises(CommandError) as e:
            shard.run(req)
        assert e.value.code == "StaleConfig" and e.value.info["critical"], e.value.message
    assert _count(shard, "d.h") == 1  # reads are served
    now[0] += SHARDING_HOLD_S  # the shardCollection was refused: the hold lapses
    assert _insert(shard, "d.h", [{"_id": 2, "k": 2}])["inserted"] == 1

    _check(shard, "d.h", {"k": 1})
    _sharded(shard, "d.h", {"k": 1}, unique=False)  # decided: writes go on under the shard key
    assert _insert(shard, "d.h", [{"_id": 3, "k": 3}])["inserted"] == 1
