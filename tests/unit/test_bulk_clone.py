"""The bulk clone of a migration (docs/reference/chunk-migration.md, "the bulk clone"):
the DocumentWritten records a recipient splices from stored bytes are real records, folding
them in bulk leaves the store their replay leaves, and the donor's window of batches in flight."""

from __future__ import annotations

import datetime
import math
import uuid

import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Regex, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.shardkey import KeyPattern, encode_value
from libs.store import Store
from schemas import Codec
from schemas import shard as s
from services.shard.documents import (
    ClonedDocuments,
    ShardDocuments,
    changelog_key,
    encode_doc,
    namespace_json,
    written_record,
)
from services.shard.protocol.clone_window import CloneWindow

NS = "db.coll"
UTC = datetime.UTC

# One document per BSON type a clone must carry unchanged.
DOCUMENTS = [
    {"_id": ObjectId("65a1b2c3d4e5f60718293a4b"), "k": 1, "oid": ObjectId()},
    {"_id": 2, "k": Int64(2**40), "small": Int64(3)},
    {"_id": 3, "k": 3, "d": Decimal128("1.10"), "nan": Decimal128("NaN"), "inf": Decimal128("-Infinity")},
    {"_id": 4, "k": 4, "at": datetime.datetime(2024, 2, 29, 12, 0, 0, 123000, tzinfo=UTC)},
    {"_id": 5, "k": 5, "bin": Binary(b"\x00\x01\xff", 0x80), "raw": b"\x00bytes", "u": Binary(uuid.uuid4().bytes, 4)},
    {"_id": 6, "k": 6, "ts": Timestamp(1_700_000_000, 7)},
    {"_id": 7, "k": 7, "re": Regex("^a.*é$", "im")},
    {"_id": 8, "k": 8, "text": 'naïve café ✓ \U0001f600 \x00nul "quote" \\ back', "ключ": "значение"},
    {"_id": 9, "k": 9, "neg_zero": -0.0, "nan": math.nan, "inf": math.inf, "big": 2**62},
    {"_id": {"a": 1, "b": [1, "x"]}, "k": 10, "nested": {"deep": [{"x": None}, True, 1.5]}},
    {"_id": "s\x00tr", "k": -11.5, "empty": {}, "list": []},
]


def _stored(doc: dict, pattern: KeyPattern) -> tuple[bytes, bytes, bytes]:
    """(shard key, _id encoding, stored value), as the donor's store holds the document."""
    return pattern.encode_doc(doc), encode_value(doc["_id"]), encode_doc(doc)


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN and -0.0 told from 0.0 (`==` does neither)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Decimal128) and isinstance(b, Decimal128):
        return str(a) == str(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: repr(d["_id"])[:20])
@pytest.mark.parametrize("ts", [None, 7_000_000_000 << 32 | 3])
def test_a_spliced_record_decodes_to_the_document(doc: dict, ts: int | None) -> None:
    pattern = KeyPattern.parse({"k": 1})
    skey, id_enc, raw = _stored(doc, pattern)
    value = written_record(namespace_json(NS), skey, raw, ts)
    spliced = s.changelog.decode(value)
    made = s.DocumentWritten(ts=ts, ns=NS, skey=skey.hex(), doc=doc)
    assert isinstance(spliced, s.DocumentWritten)
    assert (spliced.ts, spliced.ns, spliced.skey) == (made.ts, made.ns, made.skey)
    assert _same(spliced.doc, doc)
    # The record the per-document path writes decodes to the same (compared as JSON: NaN != NaN)
    assert Codec.encode(s.changelog.decode(Codec.encode(made))) == Codec.encode(spliced)
    # Its Kafka key is the one compaction keeps the document's latest record under.
    keys, values = _cloned([(skey, id_enc, raw)], ts)
    assert keys == [changelog_key(made)] and values == [value]


def _cloned(docs, ts):
    cloned = ClonedDocuments(ShardDocuments(), NS, docs)
    return cloned.encode([ts] * len(docs) if ts is not None else None)


def test_a_non_ascii_namespace_splices_too() -> None:
    ns = "dé.cöll"
    doc = {"_id": 1, "k": 1}
    skey, _, raw = _stored(doc, KeyPattern.parse({"k": 1}))
    record = s.changelog.decode(written_record(namespace_json(ns), skey, raw, 5))
    assert isinstance(record, s.DocumentWritten) and record.ns == ns


def _fold(tmp_path, name: str, fold) -> dict[bytes, bytes]:
    """The store a fold leaves, committed: every key and value."""
    store = Store(tmp_path / name)
    documents = ShardDocuments()
    documents.load(store)
    fold(documents)
    store.commit(documents.drain_changes().items(), None, documents.drain_range_deletions())
    out = dict(store.scan(b""))
    store.close()
    return out


def test_bulk_fold_and_replay_of_the_spliced_records_leave_the_same_store(tmp_path) -> None:
    pattern = KeyPattern.parse({"k": 1})
    docs = [_stored(d, pattern) for d in DOCUMENTS]
    ticks = [(1_700_000_000 << 32) + i for i in range(1, len(docs) + 1)]
    # An earlier copy of one document under another shard key: the clone moves it.
    moved = dict(DOCUMENTS[1], k=-99)
    earlier = s.DocumentWritten(ts=1, ns=NS, skey=pattern.encode_doc(moved).hex(), doc=moved)

    def bulk(documents: ShardDocuments) -> None:
        documents.apply(earlier, -1)
        cloned = ClonedDocuments(documents, NS, docs)
        keys, values = cloned.encode(ticks)
        bulk.values = values  # type: ignore[attr-defined]
        cloned.apply()

    def replay(documents: ShardDocuments) -> None:
        documents.apply(earlier, 0)
        for value in bulk.values:  # type: ignore[attr-defined]
            documents.apply(s.changelog.decode(value), 0)

    bulk_store = _fold(tmp_path, "bulk", bulk)
    assert bulk_store == _fold(tmp_path, "replay", replay)
    assert not any(k.startswith(b"d/" + NS.encode() + b"\x00" + pattern.encode_doc(moved)) for k in bulk_store)


def test_bulk_fold_keeps_secondary_indexes(tmp_path) -> None:
    """A namespace with an index being kept takes the per-document fold: the same entries."""
    from schemas import indexes as ix

    index = ix.IndexRecorded(ns=NS, spec={"key": {"x": 1}, "name": "x_1"}, state="ready")
    pattern = KeyPattern.parse({"k": 1})
    docs = [{"_id": i, "k": i, "x": 10 - i} for i in range(5)]
    stored = [_stored(d, pattern) for d in docs]

    def bulk(documents: ShardDocuments) -> None:
        documents.apply(index, -1)
        cloned = ClonedDocuments(documents, NS, stored)
        cloned.encode([9] * len(stored))
        cloned.apply()

    def per_document(documents: ShardDocuments) -> None:
        documents.apply(index, -1)
        for d in docs:
            documents.apply(s.DocumentWritten(ts=9, ns=NS, skey=pattern.encode_doc(d).hex(), doc=d), -1)

    assert _fold(tmp_path, "bulk", bulk) == _fold(tmp_path, "one", per_document)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "_id": st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5), st.binary(max_size=4)),
                "k": st.one_of(st.integers(-5, 5), st.floats(), st.text(max_size=3)),
                "v": st.one_of(st.none(), st.floats(), st.text(max_size=8), st.lists(st.integers(), max_size=3)),
            }
        ),
        max_size=8,
        unique_by=lambda d: encode_value(d["_id"]),
    )
)
def test_spliced_records_decode_as_the_models(docs: list[dict]) -> None:
    pattern = KeyPattern.parse({"k": 1})
    for i, doc in enumerate(docs):
        skey, _, raw = _stored(doc, pattern)
        made = s.DocumentWritten(ts=i, ns=NS, skey=skey.hex(), doc=doc)
        spliced = s.changelog.decode(written_record(namespace_json(NS), skey, raw, i))
        assert isinstance(spliced, s.DocumentWritten) and _same(spliced.doc, made.doc)
        assert encode_doc(spliced.doc) == raw  # replay stores the bytes the donor stored


# --------------------------------------------------------------- the window


def test_the_window_bounds_the_batches_in_flight() -> None:
    w: CloneWindow[str] = CloneWindow(2)
    assert w.open() and w.drained()
    a, b = w.sent("a"), w.sent("b")
    assert not w.open() and w.in_flight == 2
    assert w.acked(b) == "b"  # replies come in any order
    assert w.open()
    c = w.sent("c")
    assert not w.open()
    assert w.acked(a) == "a" and w.acked(c) == "c" and w.drained()


def test_a_late_or_repeated_reply_is_ignored() -> None:
    w: CloneWindow[str] = CloneWindow(4)
    a = w.sent("a")
    assert w.acked(a) == "a"
    assert w.acked(a) is None  # the reply to a resend of an acknowledged batch
    assert w.acked(99) is None and w.drained()


def test_a_timeout_resends_every_unacknowledged_batch_in_order() -> None:
    w: CloneWindow[str] = CloneWindow(4)
    seqs = [w.sent(x) for x in "abcd"]
    w.acked(seqs[1])
    assert list(w.timed_out()) == [(seqs[0], "a"), (seqs[2], "c"), (seqs[3], "d")]
    assert w.in_flight == 3  # still unacknowledged until their replies come
    w.acked(seqs[2])
    assert [b for _, b in w.timed_out()] == ["a", "d"]


def test_a_smaller_limit_throttles_without_dropping_what_is_in_flight() -> None:
    """The throttle drops the limit to one while batches are in flight: the next is sent
    once every one of them is acknowledged."""
    w: CloneWindow[str] = CloneWindow(4)
    seqs = [w.sent(x) for x in "abc"]
    w.limit = 1
    assert not w.open()
    w.acked(seqs[0])
    w.acked(seqs[1])
    assert not w.open()
    w.acked(seqs[2])
    assert w.open()
    w.sent("d")
    assert not w.open()


def test_a_limit_below_one_still_sends() -> None:
    w: CloneWindow[str] = CloneWindow(0)
    assert w.open()


# --------------------------------------------------------------- the donor's batches


def test_the_donor_splits_a_stored_key_into_shard_key_and_id() -> None:
    from services.shard.donor import _shard_key_length

    for pattern, doc in [
        (KeyPattern.parse({"k": 1}), {"_id": ObjectId(), "k": Decimal128("0.1")}),
        (KeyPattern.parse({"a": 1, "b": 1}), {"_id": {"x": "y\x00"}, "a": "s", "b": {"c": [1, 2]}}),
        (KeyPattern.parse({"k": "hashed"}), {"_id": -0.0, "k": 5}),
    ]:
        skey, id_enc, _ = _stored(doc, pattern)
        assert _shard_key_length(skey + id_enc) == len(skey)


def test_a_huge_document_goes_decoded(monkeypatch) -> None:
    from services.shard import donor

    monkeypatch.setattr(donor, "STORED_VALUE_MAX", 40)
    pattern = KeyPattern.parse({"k": 1})
    small, big = {"_id": 1, "k": 1}, {"_id": 2, "k": 2, "text": "x" * 50}
    stored = []
    for doc in (small, big):
        skey, id_enc, raw = _stored(doc, pattern)
        stored.append(((skey + id_enc).hex(), len(skey), raw.decode()))
    req = donor._clone_request("m", stored)
    assert req.stored == stored[:1]
    assert req.written == [{"skey": pattern.encode_doc(big).hex(), "doc": big}]
