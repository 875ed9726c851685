"""Which shards a query or a document goes to — pure functions over the catalog.

- equality on the full shard key (or the hashed field) -> the one owning shard
- equality / range on a shard-key prefix -> the shards owning overlapping chunks
- anything else -> every shard owning chunks of the collection
- an unsharded collection -> its database's primary
Chunk lookups bisect the chunk list: O(log chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson import ObjectId

from domain.catalog import Catalog, Collection
from domain.query import NOT_CONSTRAINED, Document, Matcher, compile_filter
from domain.shardkey import MAX_KEY, MIN_KEY, KeyPattern, hash_value

MAX_IN_POINTS = 1000  # beyond this many $in values, scanning overlapping chunks is cheaper
# Filter values that can only mean equality (not an operator object, array, regex, ...).
_PLAIN_SCALARS = frozenset({str, int, float, ObjectId})


@dataclass(frozen=True)
class Targets:
    shards: tuple[str, ...]
    reason: str  # for explain: why these shards
    sharded: bool
    full_key: bool = False  # the filter pins the whole shard key (equality or a small $in)


def for_query(catalog: Catalog, ns: str, flt: Document) -> Targets:
    coll = catalog.collections.get(ns)
    if coll is None:
        db = catalog.databases.get(ns.partition(".")[0])
        if db is None:
            return Targets((), "the database does not exist", False)
        return Targets((db.primary,), f"unsharded collection: database primary {db.primary}", False)
    pattern = coll.pattern
    if pattern.fields == ("_id",) and pattern.hashed_field == "_id" and len(flt) == 1:
        # The commonest query of a collection sharded on {_id: "hashed"}, by one _id: straight to
        # the owner of its hash (the general path below, without compiling the filter).
        v = flt.get("_id", flt)
        if type(v) in _PLAIN_SCALARS:
            owner = owner_of(coll, {"_id": hash_value(v)})
            return Targets((owner,), f"equality on the full shard key {pattern.spec}", True, full_key=True)
    matcher = compile_filter(flt)
    points = _points(matcher, pattern)
    if points is not None:
        shards = sorted({owner_of(coll, p) for p in points})
        what = "equality" if len(points) == 1 else f"$in of {len(points)} values"
        return Targets(tuple(shards), f"{what} on the full shard key {pattern.spec}", True, full_key=len(points) == 1)
    lo, hi, prefix = _range(matcher, pattern)
    if prefix:
        shards = sorted(owners_between(coll, pattern.encode_bound(lo), pattern.encode_bound(hi)))
        return Targets(tuple(shards), f"range on shard key prefix {list(prefix)}: chunks overlapping", True)
    shards = sorted({c.shard for c in coll.chunks})
    return Targets(tuple(shards), "no shard key constraint: every shard owning chunks", True)


def _points(matcher: Matcher, pattern: KeyPattern) -> list[Document] | None:
    """The full shard keys the filter pins (equality or small $in on every field), else None."""
    choices: list[list[Any]] = []
    for f in pattern.fields:
        eq = matcher.equality_on(f)
        values: list[Any] | None
        if eq is not NOT_CONSTRAINED:
            values = [eq]
        else:
            values = matcher.in_values_on(f)
            if not values:
                return None
        if f == pattern.hashed_field:
            values = [hash_value(v) for v in values]
        choices.append(values)
    keys: list[Document] = [{}]
    for f, values in zip(pattern.fields, choices):
        keys = [{**k, f: v} for k in keys for v in values]
        if len(keys) > MAX_IN_POINTS:
            return None
    return keys


def _range(matcher: Matcher, pattern: KeyPattern) -> tuple[Document, Document, tuple[str, ...]]:
    """Inclusive bounds [lo, hi] on the shard key implied by equality on a prefix and,
    optionally, a range on the next field; `prefix` names the constrained fields."""
    lo: Document = {}
    hi: Document = {}
    prefix: list[str] = []
    for f in pattern.fields:
        eq = matcher.equality_on(f)
        if eq is not NOT_CONSTRAINED:
            lo[f] = hi[f] = hash_value(eq) if f == pattern.hashed_field else eq
            prefix.append(f)
            continue
        if f == pattern.hashed_field:
            break  # a range over values is scattered over hash space
        bounds = matcher.bounds_on(f)
        if bounds is not None:  # inclusive either way: a superset of the chunks is safe
            lo[f], hi[f] = bounds.lo, bounds.hi
            prefix.append(f)
        break
    for f in pattern.fields[len(lo) :]:
        lo.setdefault(f, MIN_KEY)
        hi.setdefault(f, MAX_KEY)
    return lo, hi, tuple(prefix)


def key_ranges(coll: Collection, matcher: Matcher) -> list[tuple[bytes, bytes]] | None:
    """Encoded shard-key ranges [lo, hi) that hold every document the filter can match
    (a superset), or None when the filter does not constrain the shard key.  A shard
    scans only these (intersected with what it owns)."""
    pattern = coll.pattern
    points = _points(matcher, pattern)
    if points is not None:  # encodings are prefix-free: one full key is one key prefix
        keys = sorted({pattern.encode_bound(p) for p in points})
        return [(k, _after_prefix(k)) for k in keys]
    lo, hi, prefix = _range(matcher, pattern)
    if not prefix:
        return None
    return [(pattern.encode_bound(lo), _after_prefix(pattern.encode_bound(hi)))]


def _after_prefix(key: bytes) -> bytes:
    """The smallest key above every key that starts with `key` (hi is inclusive)."""
    return key + b"\xff" * 16


def owner_of(coll: Collection, key: Document) -> str:
    return coll.chunks[coll.chunk_index(coll.pattern.encode_bound(key))].shard


def owners_between(coll: Collection, lo: bytes, hi: bytes) -> set[str]:
    """Shards owning a chunk that intersects the inclusive key range [lo, hi]."""
    first, last = coll.chunk_index(lo), coll.chunk_index(hi)
    return {c.shard for c in coll.chunks[first : last + 1]}


def for_document(catalog: Catalog, ns: str, doc: Document) -> tuple[str | None, Collection | None]:
    """The shard a new document goes to (and the collection, None if unsharded)."""
    coll = catalog.collections.get(ns)
    if coll is None:
        db = catalog.databases.get(ns.partition(".")[0])
        return (db.primary if db else None), None
    return owner_of(coll, coll.pattern.extract(doc)), coll
