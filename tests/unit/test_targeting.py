"""domain.targeting on hand-made catalogs: which shards a query or a new
document goes to.  Concrete cases for every kind of filter, and a property:
whatever the chunk layout and the filter, every document the filter matches
lives in a chunk whose owner is targeted (soundness).  Pure: no Kafka."""

from __future__ import annotations

import itertools

from bson import Int64, ObjectId, Regex
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.catalog import Catalog
from domain.query import compile_filter
from domain.shardkey import INT64_MAX, INT64_MIN, MAX_KEY, MIN_KEY, KeyPattern, encode_value, hash_value, to_ejson
from domain.targeting import for_document, for_query
from schemas import config as c

SHARDS = ("s0", "s1", "s2", "s3", "s4")  # s4 never owns a chunk
NS = "db.c"
EPOCH = "6b0000000000000000000001"


def make_catalog(key: dict, bounds: list[dict], owners: list[str], primary: str = "s4") -> Catalog:
    """A catalog with SHARDS, database `db` (primary `primary`) and `db.c` sharded on `key`
    with chunks [bounds[i], bounds[i+1]) owned by owners[i]; bounds hold sentinels."""
    assert len(bounds) == len(owners) + 1
    chunks = [
        c.ChunkDoc(min=to_ejson(lo), max=to_ejson(hi), shard=owner, version=(1, i))
        for i, (lo, hi, owner) in enumerate(zip(bounds, bounds[1:], owners))
    ]
    events = [
        *(c.ShardAdded(shard=s) for s in SHARDS),
        c.DatabaseCreated(db="db", primary=primary, uuid="u-db"),
        c.CollectionSharded(ns=NS, key=key, unique=False, epoch=EPOCH, uuid="u-c", chunks=chunks),
    ]
    cat = Catalog(track_changes=False)
    for offset, e in enumerate(events):
        cat.apply(e, offset)
    return cat


def owner_by_scan(cat: Catalog, key: dict) -> str:
    """The reference: the chunk with min <= key < max, found by a linear scan."""
    coll = cat.collections[NS]
    enc = coll.pattern.encode_bound(key)
    hits = [ch.shard for ch in coll.chunks if ch.min_key <= enc < ch.max_key]
    assert len(hits) == 1, f"chunks do not partition the key space at {key}"
    return hits[0]


def owners_overlapping(cat: Catalog, lo: dict, hi: dict) -> set[str]:
    """The reference: owners of chunks intersecting the inclusive key range [lo, hi]."""
    coll = cat.collections[NS]
    elo, ehi = coll.pattern.encode_bound(lo), coll.pattern.encode_bound(hi)
    return {ch.shard for ch in coll.chunks if ch.min_key <= ehi and elo < ch.max_key}


def targets(cat: Catalog, flt: dict, ns: str = NS) -> set[str]:
    return set(for_query(cat, ns, flt).shards)


# ------------------------------------------------------------ a single-field key

K = {"k": 1}
K_BOUNDS = [{"k": MIN_KEY}, {"k": 0}, {"k": 10}, {"k": 20}, {"k": 30}, {"k": MAX_KEY}]
K_OWNERS = ["s0", "s1", "s2", "s3", "s0"]  # s0 owns both ends; s4 owns nothing
ALL = {"s0", "s1", "s2", "s3"}


def k_catalog() -> Catalog:
    return make_catalog(K, K_BOUNDS, K_OWNERS)


def test_equality_on_the_full_key_targets_exactly_the_owner():
    cat = k_catalog()
    for v, owner in [
        (5, "s1"),
        (0, "s1"),
        (-1, "s0"),
        (10, "s2"),
        (29.5, "s3"),
        (30, "s0"),
        ("str", "s0"),
        (None, "s0"),
    ]:
        t = for_query(cat, NS, {"k": v})
        assert t.shards == (owner,) and t.sharded and "equality" in t.reason, (v, t)
        assert for_query(cat, NS, {"k": {"$eq": v}, "x": {"$gt": 3}}).shards == (owner,)
        assert for_query(cat, NS, {"$and": [{"k": v}, {"y": 1}]}).shards == (owner,)


def test_range_on_the_key_targets_only_overlapping_chunks():
    cat = k_catalog()
    t = for_query(cat, NS, {"k": {"$gte": 3, "$lt": 15}})
    assert set(t.shards) == {"s1", "s2"} and "range" in t.reason
    assert targets(cat, {"k": {"$gte": 12, "$lte": 18}}) == {"s2"}
    assert targets(cat, {"k": {"$gt": 21}}) == {"s3", "s0"}  # to +inf: the last chunk too
    assert targets(cat, {"k": {"$lt": 5}}) == {"s0", "s1"}
    # Inclusive or not, a superset of the owners is fine; the owner itself must be there.
    assert targets(cat, {"k": {"$gt": 9, "$lt": 10}}) >= {"s1"}
    # A range over strings only reaches chunks that can hold strings (here the last one).
    assert targets(cat, {"k": {"$gte": "a", "$lt": "m"}}) == {"s0"}
    for t in ({"s1", "s2"}, {"s2"}, {"s3", "s0"}):
        assert t < ALL, "the test layout must make the right answer a strict subset"


def test_in_on_the_full_key_targets_the_owners_of_those_points():
    cat = k_catalog()
    t = for_query(cat, NS, {"k": {"$in": [5, 25, 7]}})
    assert set(t.shards) == {"s1", "s3"} and "$in" in t.reason
    assert targets(cat, {"k": {"$in": [5]}}) == {"s1"}
    assert targets(cat, {"k": {"$in": [5, 15], "$gte": 10}}) == {"s2"}  # intersected with the range


def test_a_filter_without_key_constraint_targets_every_shard_owning_chunks():
    cat = k_catalog()
    for flt in (
        {},
        {"x": 1},
        {"k": {"$ne": 5}},
        {"k": {"$nin": [1, 2]}},
        {"k": {"$exists": True}},
        {"k": {"$not": {"$gt": 5}}},
        {"$nor": [{"k": 5}]},
        {"$or": [{"k": 5}, {"x": 1}]},
    ):
        t = for_query(cat, NS, flt)
        assert set(t.shards) == ALL and "s4" not in t.shards, (flt, t)


def test_an_or_on_the_key_is_answered_conservatively():
    cat = k_catalog()
    must = {owner_by_scan(cat, {"k": 5}), owner_by_scan(cat, {"k": 15})}
    assert targets(cat, {"$or": [{"k": 5}, {"k": 15}]}) >= must
    assert targets(cat, {"$or": [{"k": {"$lt": 2}}, {"k": {"$gt": 12, "$lt": 14}}]}) >= {"s0", "s1", "s2"}
    assert targets(cat, {"$or": [{"k": 5}, {"x": 1}]}) == ALL


# ----------------------------------------------------------------- a compound key

AB = {"a": 1, "b": 1}
AB_BOUNDS = [
    {"a": MIN_KEY, "b": MIN_KEY},
    {"a": 1, "b": 0},
    {"a": 1, "b": 100},
    {"a": 2, "b": MIN_KEY},
    {"a": 3, "b": 50},
    {"a": MAX_KEY, "b": MAX_KEY},
]
AB_OWNERS = ["s0", "s1", "s2", "s3", "s1"]


def test_equality_on_a_key_prefix_targets_chunks_overlapping_that_prefix():
    cat = make_catalog(AB, AB_BOUNDS, AB_OWNERS)
    for v in (1, 2, 3, 0, 7):
        want = owners_overlapping(cat, {"a": v, "b": MIN_KEY}, {"a": v, "b": MAX_KEY})
        t = for_query(cat, NS, {"a": v})
        assert set(t.shards) == want and "prefix" in t.reason, (v, t)
    assert targets(cat, {"a": 1}) == {"s0", "s1", "s2"}  # s3 holds a=2: a strict subset
    assert targets(cat, {"a": 2}) == {"s3"}
    assert targets(cat, {"a": 3}) == {"s3", "s1"}
    assert targets(cat, {"a": 1, "b": 50}) == {"s1"}  # the full key: one owner
    assert targets(cat, {"a": 1, "b": {"$gte": 100}}) == {"s2"}  # prefix equality, then a range
    assert targets(cat, {"b": 50}) == ALL  # not a prefix


def test_range_on_the_first_field_of_a_compound_key():
    cat = make_catalog(AB, AB_BOUNDS, AB_OWNERS)
    assert targets(cat, {"a": {"$gte": 2, "$lte": 2.5}}) == {"s3"}  # [{2,Min}, {2.5,Max}] meets one chunk
    # Exclusive ends are taken as inclusive (a superset is safe): a < 3 reaches the chunk from {3, 50} too.
    assert targets(cat, {"a": {"$gte": 2, "$lt": 3}}) == {"s3", "s1"}
    assert targets(cat, {"a": {"$gte": 3.5}}) == {"s1"}
    assert targets(cat, {"a": {"$gt": 3}}) == {"s1", "s3"}  # from {3, MinKey}: the chunk below {3, 50} too
    assert targets(cat, {"a": {"$lte": 0.5}}) == {"s0"}
    assert targets(cat, {"a": {"$lt": 1}}) == {"s0", "s1", "s2"}  # to {1, MaxKey}: every a=1 chunk too


# ------------------------------------------------------------------ a hashed key

H = {"k": "hashed"}
H_BOUNDS = [{"k": MIN_KEY}, {"k": -(2**62)}, {"k": 0}, {"k": 2**62}, {"k": MAX_KEY}]
H_OWNERS = ["s0", "s1", "s2", "s3"]


def test_equality_on_a_hashed_key_targets_the_owner_of_the_hash():
    cat = make_catalog(H, H_BOUNDS, H_OWNERS)
    seen = set()
    for v in [*range(40), "x", None, 2.5]:
        owner = owner_by_scan(cat, {"k": hash_value(v)})
        assert for_query(cat, NS, {"k": v}).shards == (owner,), v
        seen.add(owner)
    assert seen == ALL, "the values must land on every chunk for the test to mean something"
    t = for_query(cat, NS, {"k": {"$in": [1, 2, 3]}})
    assert set(t.shards) == {owner_by_scan(cat, {"k": hash_value(v)}) for v in (1, 2, 3)}


def test_an_id_query_on_a_hashed_id_takes_the_shortcut_to_the_same_owner_as_the_general_path():
    """{_id: v} on {_id: "hashed"} skips compiling the filter; {$and: [{_id: v}]} cannot, so it
    is the general path's answer for the same query."""
    cat = make_catalog({"_id": "hashed"}, [{"_id": b["k"]} for b in H_BOUNDS], H_OWNERS)
    seen = set()
    for v in [*range(40), *(f"user{i}" for i in range(40)), 2.5, -1.0, True, ObjectId(), Int64(7)]:
        short, general = for_query(cat, NS, {"_id": v}), for_query(cat, NS, {"$and": [{"_id": v}]})
        assert short == general, v
        assert short.shards == (owner_by_scan(cat, {"_id": hash_value(v)}),) and short.full_key
        seen.add(short.shards)
    assert len(seen) == len(H_OWNERS), "the values must land on every chunk for the test to mean something"
    # What is not a plain value keeps the general path's meaning.
    for flt in ({"_id": {"$in": [1, 2]}}, {"_id": [1, 2]}, {"_id": {"a": 1}}, {"_id": None}):
        assert for_query(cat, NS, flt) == for_query(cat, NS, {"$and": [flt]}), flt
    # a regex matches as a pattern: no one owner, every shard is asked
    by_pattern = for_query(cat, NS, {"_id": Regex("^u")})
    assert set(by_pattern.shards) == set(H_OWNERS) and not by_pattern.full_key


def test_a_range_on_a_hashed_key_targets_every_shard():
    cat = make_catalog(H, H_BOUNDS, H_OWNERS)
    assert targets(cat, {"k": {"$gte": 1, "$lt": 3}}) == ALL
    assert targets(cat, {"k": {"$gt": 0}}) == ALL


# ------------------------------------------------------- unsharded, missing, documents


def test_an_unsharded_collection_goes_to_its_database_primary():
    cat = make_catalog(K, K_BOUNDS, K_OWNERS, primary="s2")
    t = for_query(cat, "db.other", {"k": 5})
    assert t.shards == ("s2",) and not t.sharded
    assert for_document(cat, "db.other", {"_id": 1, "k": 5}) == ("s2", None)


def test_a_missing_database_has_no_shards():
    cat = make_catalog(K, K_BOUNDS, K_OWNERS)
    t = for_query(cat, "nodb.c", {"k": 5})
    assert t.shards == () and not t.sharded
    assert for_document(cat, "nodb.c", {"_id": 1}) == (None, None)


def test_for_document_picks_the_owner_of_the_chunk_holding_its_key():
    for key, bounds, owners, docs in [
        (K, K_BOUNDS, K_OWNERS, [{"k": v} for v in (-5, 0, 9.99, 10, 20, 30, 1e9, "s", None)] + [{}]),
        (
            AB,
            AB_BOUNDS,
            AB_OWNERS,
            [{"a": a, "b": b} for a in (0, 1, 2, 3, 4) for b in (-1, 0, 50, 100, 200)] + [{"a": 1}, {"b": 1}],
        ),
        (H, H_BOUNDS, H_OWNERS, [{"k": v} for v in range(20)]),
    ]:
        cat = make_catalog(key, bounds, owners)
        coll = cat.collections[NS]
        for doc in docs:
            shard, got = for_document(cat, NS, {"_id": 1, **doc})
            assert got is coll
            assert shard == owner_by_scan(cat, coll.pattern.extract(doc)), (key, doc)


# ------------------------------------------------------------------- soundness

MISSING = object()  # a document without the field
SPECIALS = [None, 2.5, -0.5, "a", "m", True]
DOMAIN = [*range(-5, 6), *SPECIALS]  # every value a key field of a test document takes
VALUES = st.one_of(st.integers(-6, 6), st.integers(-6, 6), st.sampled_from(SPECIALS))
OPS = ("$gt", "$gte", "$lt", "$lte")
PATTERNS = [{"k": 1}, {"a": 1, "b": 1}, {"k": "hashed"}, {"a": 1, "h": "hashed"}]
PROPERTY = settings(max_examples=200, deadline=None)


def _field_clause(draw, f: str) -> dict:
    kind = draw(st.sampled_from(["eq", "eq", "in", "in", "range", "range2", "range2", "ne", "nin", "exists", "not"]))
    v = draw(VALUES)
    if kind == "eq":
        return {f: v} if draw(st.booleans()) else {f: {"$eq": v}}
    if kind == "in":
        return {f: {"$in": draw(st.lists(VALUES, min_size=1, max_size=4))}}
    if kind == "range":
        return {f: {draw(st.sampled_from(OPS)): v}}
    if kind == "range2":
        return {f: {draw(st.sampled_from(OPS[:2])): v, draw(st.sampled_from(OPS[2:])): draw(VALUES)}}
    if kind == "ne":
        return {f: {"$ne": v}}
    if kind == "nin":
        return {f: {"$nin": [v]}}
    if kind == "exists":
        return {f: {"$exists": draw(st.booleans())}}
    return {f: {"$not": {draw(st.sampled_from(OPS)): v}}}


@st.composite
def filters(draw, fields: tuple[str, ...]) -> dict:
    """Equality / $in / ranges on key fields (mostly), conditions on the non-key field
    x, operators that constrain nothing, and sometimes an $or of such clauses."""

    def clause():
        f = draw(st.sampled_from([*fields, *fields, *fields, "x"]))
        return _field_clause(draw, f)

    clauses = [clause() for _ in range(draw(st.integers(0, 3)))]
    if draw(st.integers(0, 3)) == 0:
        clauses.append({"$or": [clause() for _ in range(draw(st.integers(1, 3)))]})
    if draw(st.integers(0, 3)) == 0:
        return {"$and": clauses} if clauses else {}
    flt: dict = {}
    for cl in clauses:  # merge into one object where fields do not collide
        ((name, value),) = cl.items()
        if name in flt:
            flt.setdefault("$and", []).append(cl)
        else:
            flt[name] = value
    return flt


@st.composite
def layouts(draw):
    """(pattern spec, chunk bounds, owners): random split points, random owners."""
    spec = draw(st.sampled_from(PATTERNS))
    pattern = KeyPattern.parse(spec)
    hashes = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from([hash_value(v) for v in DOMAIN]))
    if spec == {"k": "hashed"}:
        points = [{"k": p} for p in draw(st.lists(hashes, max_size=6))]
    elif spec == {"a": 1, "h": "hashed"}:
        points = [{"a": a, "h": h} for a, h in draw(st.lists(st.tuples(VALUES, hashes), max_size=6))]
    else:
        points = [{f: draw(VALUES) for f in pattern.fields} for _ in range(draw(st.integers(0, 6)))]
    unique = {pattern.encode_bound(p): p for p in points}
    unique.pop(pattern.encode_bound(pattern.global_min()), None)
    inner = [unique[k] for k in sorted(unique)]
    bounds = [pattern.global_min(), *inner, pattern.global_max()]
    owners = draw(st.lists(st.sampled_from(SHARDS[:4]), min_size=len(bounds) - 1, max_size=len(bounds) - 1))
    return spec, bounds, owners


def all_documents(fields: tuple[str, ...]) -> list[dict]:
    """Every combination of DOMAIN values (or absence) for the key fields, with
    varying values of the non-key field x."""
    docs = []
    for i, values in enumerate(itertools.product([*DOMAIN, MISSING], repeat=len(fields))):
        doc = {"_id": i, **{f: v for f, v in zip(fields, values) if v is not MISSING}}
        if i % 4:
            doc["x"] = DOMAIN[i % len(DOMAIN)]
        docs.append(doc)
    return docs


@PROPERTY
@given(data=st.data())
def test_every_matching_document_lives_on_a_targeted_shard(data):
    spec, bounds, owners = data.draw(layouts())
    cat = make_catalog(spec, bounds, owners)
    coll = cat.collections[NS]
    flt = data.draw(filters(coll.pattern.fields))
    t = for_query(cat, NS, flt)
    assert set(t.shards) <= set(owners), "only shards owning chunks are ever targeted"
    matcher = compile_filter(flt)
    for doc in all_documents(coll.pattern.fields):
        if matcher.matches(doc):
            owner = owner_by_scan(cat, coll.pattern.extract(doc))
            assert owner in t.shards, f"{doc} matches {flt} but lives on {owner}, not in {t.shards} ({t.reason})"


@PROPERTY
@given(data=st.data())
def test_for_document_and_full_key_equality_pick_the_owner(data):
    spec, bounds, owners = data.draw(layouts())
    cat = make_catalog(spec, bounds, owners)
    coll = cat.collections[NS]
    doc = {"_id": 1, **{f: data.draw(VALUES) for f in coll.pattern.fields}}
    owner = owner_by_scan(cat, coll.pattern.extract(doc))
    assert for_document(cat, NS, doc) == (owner, coll)
    extra = data.draw(st.dictionaries(st.just("x"), VALUES))
    key_only = {f: doc[f] for f in coll.pattern.fields}
    assert for_query(cat, NS, {**key_only, **extra}).shards == (owner,)


@PROPERTY
@given(data=st.data())
def test_every_matching_document_lies_in_the_key_ranges_a_shard_scans(data):
    from domain.targeting import key_ranges

    spec, bounds, owners = data.draw(layouts())
    coll = make_catalog(spec, bounds, owners).collections[NS]
    flt = data.draw(filters(coll.pattern.fields))
    matcher = compile_filter(flt)
    ranges = key_ranges(coll, matcher)
    if ranges is None:
        return  # the whole key space is scanned
    for doc in all_documents(coll.pattern.fields):
        if matcher.matches(doc):
            # a shard's document key is the shard key's encoding followed by the _id's
            stored = coll.pattern.encode_doc(doc) + encode_value(doc["_id"])
            assert any(lo <= stored < hi for lo, hi in ranges), f"{doc} matches {flt} outside {ranges}"
