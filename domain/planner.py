"""The query planner of a shard (issue 15): which index answers a query, over which bounds, and
whether it also gives the sort order or every projected field.  Pure: no I/O.  The executor
(domain/query_plan.py) runs the plan it returns.

Candidates
----------
* The collection's *ready* secondary indexes (a building index misses documents: the caller
  passes only ready ones), each with its multikey flag.
* The shard key's index, implicit: the documents are stored in shard-key order, so it is a
  *clustered* index whose scan is the caller's targeted range scan (``domain.targeting``).
* COLLSCAN.  (A filter setting ``_id`` to a value, without a hint, is the shard's IDHACK,
  before any planning.)

Bounds
------
Per index field a union of intervals of values (``Interval``), from domain/query.py's range
machinery (``_range_of_test``: type-bracketed ranges, ``_intersect``, ``_union``): points for
equality and ``$in``, a range for ``$gt/$gte/$lt/$lte``, ``$or`` as the union of its branches
when every branch constrains the field, nothing (``[MinKey, MaxKey]``) for ``$ne/$nin/$not/
$exists/$nor``, for an operand that is an array (an array is compared as a whole, while the
index holds its elements), and for MinKey/MaxKey operands on a multikey index.

* A multikey index never intersects two predicates on one field (each may match another
  element of the array): it takes the most selective one.
* On a multikey index a predicate that matches a missing field (equality to null, ``$in`` with
  null, ``$gte/$lte: null``) bounds nothing on a dotted path: ``{a: [{b: 1}, {c: 1}]}`` matches
  ``{"a.b": null}`` but puts only the key 1 into ``a.b`` (domain.indexes' key generation, where
  MongoDB would add null).

The byte ranges over ``domain.indexes.entry_key`` (``Plan.ranges``) are the equality prefix's
points (their cartesian product, at most ``MAX_SCAN_POINTS`` of them, beyond which a field's
points become their hull), then one field's intervals, then nothing: the later fields' bounds
are checked on each key's values before the document is fetched (MongoDB's keysExamined >
docsExamined).  Each end is written so that a Decimal128 continuing a number's encoding
(domain.shardkey: an extra 0xFF byte, 0x00 complemented) falls on the right side of it.

Sparse and partial indexes
--------------------------
A sparse index only when the filter cannot match a document without any of its fields: some
field of the index has bounds that exclude null (every matching document then holds a value
there, so the index holds it).  A partial index only when the filter implies its
``partialFilterExpression``: each of the partial filter's conjuncts follows from one of the
query's (top level and ``$and``): the same predicate, or a narrower one on the same path
(``{x: {$gt: 10}}`` implies ``{x: {$gt: 5}}``, ``{x: 3}`` implies ``{x: {$in: [3, 4]}}``,
any predicate that needs a value implies ``$exists: true``); ``$or``/``$nor`` conjuncts only
when the query has the same one.

Sort and covering
-----------------
An index gives the sort when it is not multikey (a multikey index holds a document once per
element, and the scan's order is not MongoDB's smallest/largest-element order), the sort's fields follow the index's fields in order, skipping only fields
bounded to one point, all in the index's directions or all reversed (then the scan runs
backward); ``_id`` may follow the last index field (entries end with the ``_id``).  No field
with a numeric path component (``a.0``) gives a sort or covers: the index reads a position of
an array there, a sort or projection does not.

A projection is covered when it is an inclusion, the index is not multikey, and every field the
filter, the projection (and an in-memory sort) read is a field of the index (``_id`` always is:
entries end with it).  A key holding null may stand for a missing field, so the executor fetches
the document for such a key (counted in docsExamined) instead of guessing.

Ranking
-------
MongoDB runs every candidate plan for a trial period and keeps the one that produced the most
results per unit of work.  shardlog ranks statically, by what the bounds and the plan promise
(candidates sorted by this tuple, best first):

1. the most leading index fields bounded to points (equality / ``$in``): each one narrows the
   scan by a factor, and the empty set (an unsatisfiable filter) counts as points;
2. then a bounded range on the next field;
3. then the sort given by the index (no blocking in-memory sort, and a limit stops the scan);
4. then no fetch: a covered plan, or the clustered shard-key index (the documents themselves);
5. then the fewest index fields (smaller keys, fewer bytes per key examined);
6. then the name, so the choice is deterministic.

An index that bounds nothing is a candidate only when it gives the sort or covers the query; if
no candidate remains the plan is COLLSCAN.  The static rule cannot see data skew (an equality on
a value most documents hold): that is what MongoDB's trials find and what ``hint`` overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from bson import Decimal128

from domain.indexes import ID_INDEX_NAME, IndexSpec, encode_field
from domain.protocol import ErrorCode
from domain.query import (
    Matcher,
    _Cmp,
    _conjuncts,
    _Exists,
    _Field,
    _In,
    _intersect,
    _Range,
    _range_of,
    _range_of_test,
    _sort_fields,
    _union,
    compile_filter,
)
from domain.shardkey import MAX_KEY, MIN_KEY, compare_values, encode_value, hash_value, is_max_key, is_min_key
from libs.errors import CommandError

IDHACK = "IDHACK"  # a Plan's hint when the shard reads one document by its _id (MongoDB's IDHACK)
MAX_SCAN_POINTS = 4096  # points of an equality prefix's product before a field becomes its hull

__all__ = [
    "FULL",
    "IDHACK",
    "MAX_SCAN_POINTS",
    "Candidate",
    "IndexInfo",
    "Interval",
    "Plan",
    "byte_ranges",
    "choose",
    "field_bounds",
    "format_bounds",
    "implies",
    "is_numeric_path",
]


# ------------------------------------------------------------------------------ intervals


@dataclass(frozen=True)
class Interval:
    """Values v with lo <(=) v <(=) hi in MongoDB's order (domain.shardkey)."""

    lo: Any
    lo_inclusive: bool
    hi: Any
    hi_inclusive: bool

    @property
    def is_point(self) -> bool:
        return self.lo_inclusive and self.hi_inclusive and encode_value(self.lo) == encode_value(self.hi)

    @cached_property
    def _ends(self) -> tuple[bytes, bytes]:
        return encode_value(self.lo), encode_value(self.hi)

    def contains(self, v: Any) -> bool:
        return self.contains_encoded(encode_value(v))

    def contains_encoded(self, enc: bytes) -> bool:
        """`contains` for a value's encoding (domain.shardkey.encode_value): byte comparisons only."""
        lo, hi = self._ends
        return (enc > lo or (enc == lo and self.lo_inclusive)) and (enc < hi or (enc == hi and self.hi_inclusive))

    @property
    def is_empty(self) -> bool:
        c = compare_values(self.lo, self.hi)
        return c > 0 or (c == 0 and not (self.lo_inclusive and self.hi_inclusive))


FULL = Interval(MIN_KEY, True, MAX_KEY, True)
Bounds = tuple[Interval, ...]  # one field's: disjoint, ascending; () is nothing


def _point(v: Any) -> Interval:
    return Interval(v, True, v, True)


def _intervals(r: _Range | None) -> Bounds:
    if r is None:
        return (FULL,)
    if r.values is not None:
        return tuple(_point(v) for v in sorted(r.values, key=encode_value))
    if r.bounds is None:
        return (FULL,)
    iv = Interval(*r.bounds)
    return () if iv.is_empty else (iv,)


def is_numeric_path(path: str) -> bool:
    """A path with a numeric component (`a.0`): an index reads an array's position there."""
    return any(p.isascii() and p.isdigit() for p in path.split("."))


def _is_array(v: Any) -> bool:
    return isinstance(v, list)


def _test_range(test: Any, multikey: bool, dotted: bool) -> _Range | None:
    """One predicate's range, or None where it must not bound the field (see the module doc)."""
    if isinstance(test, _Cmp):
        v = test.value
        if _is_array(v):
            return None
        if multikey and (is_min_key(v) or is_max_key(v)):
            return None
        if multikey and dotted and v is None:
            return None
        return _range_of_test(test)
    if isinstance(test, _In):
        if any(_is_array(v) for v in test.values):
            return None
        if multikey and any(is_min_key(v) or is_max_key(v) for v in test.values):
            return None
        if multikey and dotted and any(v is None for v in test.values):
            return None
        return _range_of_test(test)
    return None


def _selectivity(r: _Range) -> tuple[int, int]:
    return (0, len(r.values)) if r.values is not None else (1, 0)


def _combine(ranges: Iterable[_Range | None], multikey: bool) -> _Range | None:
    kept = [r for r in ranges if r is not None]
    if not kept:
        return None
    if not multikey:
        return _intersect(kept)
    return min(kept, key=_selectivity)  # one predicate only: each may hold for another element


def _field_range(node: Any, path: str, multikey: bool) -> _Range | None:
    dotted = "." in path
    if isinstance(node, _Field):
        if node.path != path:
            return None
        return _combine((_test_range(t, multikey, dotted) for t in node.tests), multikey)
    if node.op == "$and":
        return _combine((_field_range(c, path, multikey) for c in node.children), multikey)
    if node.op == "$or":
        return _union([_field_range(c, path, multikey) for c in node.children])
    return None  # $nor


def field_bounds(matcher: Matcher, path: str, *, multikey: bool = False) -> Bounds:
    """The intervals holding, for every document the filter matches, at least one of the keys
    it puts into an index on `path` (a multikey one if `multikey`)."""
    return _intervals(_field_range(matcher._root, path, multikey))


# ------------------------------------------------------------------------------ byte ranges


def _start(iv: Interval, direction: int) -> bytes:
    if direction > 0:
        enc = encode_field(iv.lo, 1)
        return enc if iv.lo_inclusive else enc + b"\xff"
    enc = encode_field(iv.hi, -1)
    return enc + (b"\x01" if iv.hi_inclusive else b"\xff")


def _end(iv: Interval, direction: int) -> bytes:
    if direction > 0:
        enc = encode_field(iv.hi, 1)
        return enc + b"\xff" if iv.hi_inclusive else enc
    enc = encode_field(iv.lo, -1)
    return enc + (b"\xff" if iv.lo_inclusive else b"\x01")


def _hull(bounds: Bounds) -> Bounds:
    return (Interval(bounds[0].lo, bounds[0].lo_inclusive, bounds[-1].hi, bounds[-1].hi_inclusive),)


def byte_ranges(spec: IndexSpec, bounds: Sequence[Bounds]) -> list[tuple[bytes, bytes]]:
    """[lo, hi) ranges of entry keys holding every entry whose key values lie in `bounds`, in
    ascending byte order (the index's order), disjoint."""
    prefixes = [b""]
    for (_, direction), ivs in zip(spec.key, bounds, strict=True):
        if not ivs:
            return []
        if all(iv.is_point for iv in ivs):
            if len(prefixes) * len(ivs) <= MAX_SCAN_POINTS:
                prefixes = [p + encode_field(iv.lo, direction) for p in prefixes for iv in ivs]
                continue
            ivs = _hull(ivs)
        out = [(p + _start(iv, direction), p + _end(iv, direction)) for p in prefixes for iv in ivs]
        return sorted(out)
    # Every field a point: the entries are the prefix followed by an _id (a tag, 0x10..0xF0).
    return sorted((p + b"\x01", p + b"\xff") for p in prefixes)


# ------------------------------------------------------------------------------ eligibility


def _excludes_null(r: _Range | None) -> bool:
    if r is None:
        return False
    if r.values is not None:
        return all(v is not None for v in r.values)
    return r.bounds is not None and not Interval(*r.bounds).contains(None)


def _admits(test: Any, value: Any, missing: bool = False) -> bool:
    """Does `test` hold for one candidate value (or a missing field)?"""
    cands = [(value, None)] if missing else [(value, encode_value(value))]
    return bool(test.test(cands))


def _test_implies(q: Any, p: Any) -> bool:
    """Every candidate value satisfying `q` satisfies `p` (so, path by path, `q` implies `p`)."""
    if q == p:
        return True
    if isinstance(p, _Exists):
        if not p.want:
            return False
        if isinstance(q, _Cmp):
            return q.value is not None
        if isinstance(q, _In):
            return all(v is not None for v in q.values)
        return False
    if not isinstance(p, (_Cmp, _In)):
        return False
    points: tuple[Any, ...] | None = None
    if isinstance(q, _Cmp) and q.op == "$eq":
        points = (q.value,)
    elif isinstance(q, _In):
        points = q.values
    if points is not None:
        for v in points:
            if not _admits(p, v):
                return False
            if v is None and not _admits(p, None, missing=True):
                return False
        return True
    if not (isinstance(q, _Cmp) and isinstance(p, _Cmp)):
        return False
    qv, pv = q.value, p.value
    if any(x is None or is_min_key(x) or is_max_key(x) for x in (qv, pv)):
        return False
    if q.enc[0] != p.enc[0] or _nan(qv) or _nan(pv):
        return False
    c = compare_values(qv, pv)
    if q.op in ("$gt", "$gte") and p.op in ("$gt", "$gte"):
        return c > 0 or (c == 0 and (p.op == "$gte" or q.op == "$gt"))
    if q.op in ("$lt", "$lte") and p.op in ("$lt", "$lte"):
        return c < 0 or (c == 0 and (p.op == "$lte" or q.op == "$lt"))
    return False


def _nan(v: Any) -> bool:
    return (isinstance(v, float) and v != v) or (isinstance(v, Decimal128) and v.to_decimal().is_nan())


def implies(query: Matcher, partial: Matcher) -> bool:
    """Whether every document `query` matches is matched by `partial` (conservatively: False
    when it cannot tell)."""
    q_conj = _conjuncts(query._root)
    q_fields: dict[str, list[Any]] = {}
    for c in q_conj:
        if isinstance(c, _Field):
            q_fields.setdefault(c.path, []).extend(c.tests)
    for c in _conjuncts(partial._root):
        if isinstance(c, _Field):
            tests = q_fields.get(c.path, [])
            if not all(any(_test_implies(q, p) for q in tests) for p in c.tests):
                return False
        elif c not in q_conj:
            return False
    return True


def _filter_paths(node: Any, out: set[str]) -> set[str]:
    if isinstance(node, _Field):
        out.add(node.path)
    elif node.op == "$expr":
        out.add("$expr")  # it reads any field: no index covers it
    else:
        for c in node.children:
            _filter_paths(c, out)
    return out


# ------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class IndexInfo:
    """A ready index of the collection, as the shard knows it."""

    spec: IndexSpec
    multikey: bool = False
    clustered: bool = False  # the shard key's index: the documents themselves, in key order
    hashed_field: str | None = None  # clustered and hashed: bounds on this field are hashes

    @classmethod
    def shard_key(cls, pattern: Mapping[str, Any]) -> IndexInfo:
        """The implicit index of a shard key pattern (`{"x": 1}`, `{"h": "hashed"}`)."""
        key = tuple((f, 1) for f in pattern)
        hashed = next((f for f, k in pattern.items() if k == "hashed"), None)
        name = "_".join(f"{f}_{k}" for f, k in pattern.items())
        return cls(IndexSpec.make(name, key), False, True, hashed)


@dataclass(frozen=True)
class Candidate:
    index: IndexInfo
    bounds: tuple[Bounds, ...]
    direction: Literal[1, -1]
    sort_provided: bool
    covered: bool
    rank: tuple[Any, ...]

    @property
    def name(self) -> str:
        return self.index.spec.name

    @property
    def useful(self) -> bool:
        n_eq, has_range = -self.rank[0], -self.rank[1]
        return bool(n_eq or has_range or self.sort_provided or self.covered)


@dataclass(frozen=True)
class Plan:
    """What the executor runs.  `index` None: COLLSCAN (over the caller's targeted ranges)."""

    matcher: Matcher
    sort: Mapping[str, Any] | None
    projection: Mapping[str, Any] | None
    winner: Candidate | None
    rejected: tuple[Candidate, ...] = ()
    sharded: bool = False
    hint: Any = None
    # filled for an IXSCAN over a secondary index
    ranges: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)

    @property
    def stage(self) -> str:
        return "COLLSCAN" if self.winner is None else "IXSCAN"

    @property
    def index(self) -> IndexInfo | None:
        return None if self.winner is None else self.winner.index

    @property
    def sort_provided(self) -> bool:
        return self.sort is None or (self.winner is not None and self.winner.sort_provided)

    @property
    def covered(self) -> bool:
        return self.winner is not None and self.winner.covered

    @property
    def needed_paths(self) -> tuple[str, ...]:
        """For a covered plan: the index fields to rebuild a document from."""
        return _needed(self.matcher, self.sort, self.projection, self.sort_provided) or ()


def _inclusion_paths(projection: Mapping[str, Any] | None) -> list[str] | None:
    """The paths an inclusion projection keeps (`_id` left out), None for any other projection."""
    if not projection or any(isinstance(f, dict) for f in projection.values()):
        return None  # $slice / $elemMatch read more than the index holds
    flags = {p: bool(f) for p, f in projection.items()}
    others = {p: f for p, f in flags.items() if p != "_id"}
    if others and not all(others.values()):
        return None
    if not others and not flags.get("_id", False):
        return None
    return list(others)


def _needed(
    matcher: Matcher, sort: Mapping[str, Any] | None, projection: Mapping[str, Any] | None, sort_provided: bool
) -> tuple[str, ...] | None:
    proj = _inclusion_paths(projection)
    if proj is None:
        return None
    paths = set(proj) | _filter_paths(matcher._root, set())
    if sort and not sort_provided:
        paths |= set(sort)
    paths.discard("_id")
    return tuple(sorted(paths))


def _covers(info: IndexInfo, needed: tuple[str, ...] | None) -> bool:
    if needed is None or info.multikey or info.clustered:
        return False
    have = set(info.spec.paths)
    if not set(needed) <= have:
        return False
    if any(is_numeric_path(p) for p in needed):
        return False
    parts = sorted(tuple(p.split(".")) for p in needed)
    return not any(b[: len(a)] == a for a, b in zip(parts, parts[1:]))  # no path inside another


def _sort_direction(info: IndexInfo, bounds: Sequence[Bounds], sort: Mapping[str, Any] | None) -> Literal[1, -1] | None:
    """The scan direction giving `sort`, or None if the index cannot give it."""
    if not sort or info.multikey or info.clustered:
        return None
    wanted = [(p, -1 if desc else 1) for p, desc in _sort_fields(dict(sort))]
    if any(is_numeric_path(p) for p, _ in wanted):
        return None
    factor = 0
    j = 0
    for (path, direction), ivs in zip(info.spec.key, bounds, strict=True):
        if j < len(wanted) and wanted[j][0] == path:
            f = wanted[j][1] * direction
            if factor and f != factor:
                return None
            factor, j = f, j + 1
        elif len(ivs) == 1 and ivs[0].is_point or not ivs:
            continue  # one value only: it does not change the order
        else:
            return None
    if j < len(wanted) and wanted[j][0] == "_id" and j == len(wanted) - 1:  # entries end with _id ascending
        f = wanted[j][1]
        if factor and f != factor:
            return None
        factor, j = f, j + 1
    if j < len(wanted):
        return None
    return 1 if factor >= 0 else -1


def _rank(info: IndexInfo, bounds: Sequence[Bounds], sort_provided: bool, covered: bool) -> tuple[Any, ...]:
    n_eq = 0
    for ivs in bounds:
        if all(iv.is_point for iv in ivs):  # () too: nothing can match
            n_eq += 1
        else:
            break
    has_range = n_eq < len(bounds) and bounds[n_eq] != (FULL,)
    no_fetch = covered or info.clustered
    # Sorted ascending: best first.
    return (-n_eq, -int(has_range), -int(sort_provided), -int(no_fetch), len(info.spec.key), info.spec.name)


def _candidate(
    info: IndexInfo,
    matcher: Matcher,
    sort: Mapping[str, Any] | None,
    projection: Mapping[str, Any] | None,
) -> Candidate:
    bounds = tuple(field_bounds(matcher, p, multikey=info.multikey) for p in info.spec.paths)
    if info.hashed_field is not None:
        bounds = tuple(
            _hashed(b) if p == info.hashed_field else b for p, b in zip(info.spec.paths, bounds, strict=True)
        )
    direction = _sort_direction(info, bounds, sort)
    provided = direction is not None
    covered = _covers(info, _needed(matcher, sort, projection, provided))
    return Candidate(info, bounds, direction or 1, provided, covered, _rank(info, bounds, provided, covered))


def _hashed(b: Bounds) -> Bounds:
    if b and all(iv.is_point for iv in b):
        hashes = sorted({hash_value(iv.lo) for iv in b})
        return tuple(_point(h) for h in hashes)
    return (FULL,) if b else ()


def _eligible(info: IndexInfo, matcher: Matcher) -> bool:
    spec = info.spec
    if spec.sparse and not any(_excludes_null(_range_of(matcher._root, p)) for p in spec.paths):
        return False
    if spec.partial is not None and not implies(matcher, compile_filter(dict(spec.partial))):
        return False
    return True


def _hinted(hint: Any, indexes: Sequence[IndexInfo]) -> IndexInfo | None | Literal["natural"]:
    """The index `hint` names (a name or a key pattern), "natural" for `{$natural: ±1}`, else
    BadValue as MongoDB."""
    if isinstance(hint, Mapping) and len(hint) == 1 and "$natural" in hint:
        return "natural"
    for info in indexes:
        if isinstance(hint, str) and info.spec.name == hint:
            return info
        if isinstance(hint, Mapping) and tuple(hint.items()) == info.spec.key:
            return info
    if hint == ID_INDEX_NAME or (isinstance(hint, Mapping) and dict(hint) == {"_id": 1}):
        return "natural"  # the _id index: the documents (by shard key) serve it, as a scan
    raise CommandError(ErrorCode.BadValue, "hint provided does not correspond to an existing index")


def choose(
    flt: Mapping[str, Any] | Matcher,
    *,
    sort: Mapping[str, Any] | None = None,
    projection: Mapping[str, Any] | None = None,
    indexes: Sequence[IndexInfo] = (),
    shard_key: Mapping[str, Any] | None = None,
    hint: Any = None,
) -> Plan:
    """The plan for a query on one shard: the best candidate by the ranking rule (module doc), or
    COLLSCAN.  `indexes`: the collection's ready secondary indexes; `shard_key`: its pattern
    (None: unsharded).  QueryError for a bad filter or sort; CommandError BadValue for a hint
    naming no index, or an index that cannot answer the query (sparse, partial)."""
    matcher = flt if isinstance(flt, Matcher) else compile_filter(dict(flt))
    if sort:
        _sort_fields(dict(sort))  # a bad sort is refused whatever the plan
    infos = list(indexes)
    if shard_key is not None:
        infos.append(IndexInfo.shard_key(shard_key))
    sharded = shard_key is not None
    if hint is not None and hint != {}:
        target = _hinted(hint, infos)
        if target == "natural":
            return Plan(matcher, sort, projection, None, (), sharded, hint)
        assert isinstance(target, IndexInfo)
        if not _eligible(target, matcher):
            raise CommandError(
                ErrorCode.BadValue,
                f"hint provided names index {target.spec.name!r}, which cannot answer this query "
                "(a sparse or partial index missing documents the filter matches)",
            )
        cand = _candidate(target, matcher, sort, projection)
        return _plan(matcher, sort, projection, cand, (), sharded, hint)
    cands = sorted(
        (c for c in (_candidate(i, matcher, sort, projection) for i in infos if _eligible(i, matcher)) if c.useful),
        key=lambda c: c.rank,
    )
    if not cands:
        return Plan(matcher, sort, projection, None, (), sharded)
    return _plan(matcher, sort, projection, cands[0], tuple(cands[1:]), sharded, None)


def _plan(
    matcher: Matcher,
    sort: Mapping[str, Any] | None,
    projection: Mapping[str, Any] | None,
    cand: Candidate,
    rejected: tuple[Candidate, ...],
    sharded: bool,
    hint: Any,
) -> Plan:
    ranges: tuple[tuple[bytes, bytes], ...] = ()
    if not cand.index.clustered:
        ranges = tuple(byte_ranges(cand.index.spec, cand.bounds))
    return Plan(matcher, sort, projection, cand, rejected, sharded, hint, ranges)


# ------------------------------------------------------------------------------ explain


def _bound_text(v: Any) -> str:
    """A bound as MongoDB's explain prints it: 5, 2.5, inf.0, "abc", null, MinKey, { a: 1 }."""
    from domain.shardkey import shell_form

    if is_min_key(v):
        return "MinKey"
    if is_max_key(v):
        return "MaxKey"
    if isinstance(v, float):
        if v != v:
            return "nan.0"
        if v in (float("inf"), float("-inf")):
            return "inf.0" if v > 0 else "-inf.0"
        return repr(v)
    if isinstance(v, str) and type(v) is str:
        import json

        return json.dumps(v, ensure_ascii=False)
    return shell_form(v)


def _interval_text(iv: Interval, reverse: bool) -> str:
    if reverse:
        return (
            f"{'[' if iv.hi_inclusive else '('}{_bound_text(iv.hi)}, "
            f"{_bound_text(iv.lo)}{']' if iv.lo_inclusive else ')'}"
        )
    return (
        f"{'[' if iv.lo_inclusive else '('}{_bound_text(iv.lo)}, {_bound_text(iv.hi)}{']' if iv.hi_inclusive else ')'}"
    )


def format_bounds(cand: Candidate) -> dict[str, list[str]]:
    """`indexBounds` in MongoDB's string form, each field's intervals in scan order: a
    descending field, or a backward scan, lists them from the top."""
    out: dict[str, list[str]] = {}
    for (path, direction), ivs in zip(cand.index.spec.key, cand.bounds, strict=True):
        reverse = direction * cand.direction < 0
        ordered = list(reversed(ivs)) if reverse else list(ivs)
        out[path] = [_interval_text(iv, reverse) for iv in ordered]
    return out


def _ixscan(cand: Candidate) -> dict[str, Any]:
    spec = cand.index.spec
    node: dict[str, Any] = {
        "stage": "IXSCAN",
        "keyPattern": dict(spec.key) if cand.index.hashed_field is None else _hashed_pattern(cand.index),
        "indexName": spec.name,
        "isMultiKey": cand.index.multikey,
        "isUnique": spec.unique,
        "isSparse": spec.sparse,
        "isPartial": spec.partial is not None,
        "indexVersion": 2,
        "direction": "forward" if cand.direction > 0 else "backward",
        "indexBounds": format_bounds(cand),
    }
    if cand.index.clustered:
        node["isShardKey"] = True  # shardlog: the shard key's index is the documents' own order
    return node


def _hashed_pattern(info: IndexInfo) -> dict[str, Any]:
    return {p: "hashed" if p == info.hashed_field else d for p, d in info.spec.key}


def _stages(plan: Plan, cand: Candidate | None, stats: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The stage tree of `cand` (None: COLLSCAN), innermost first, as MongoDB nests it."""
    flt = plan.matcher.filter
    if cand is None and plan.hint == IDHACK:
        node: dict[str, Any] = {"stage": "IDHACK"}
        if stats is not None:
            node["keysExamined"] = stats.get("docsExamined", 0)
            node["docsExamined"] = stats.get("docsExamined", 0)
    elif cand is None:
        node = {"stage": "COLLSCAN", "direction": "forward"}
        if flt:
            node["filter"] = flt
        if stats is not None:
            node["docsExamined"] = stats.get("docsExamined", 0)
    else:
        node = _ixscan(cand)
        if stats is not None:
            node["keysExamined"] = stats.get("keysExamined", 0)
        if not cand.covered:
            node = {"stage": "FETCH", **({"filter": flt} if flt else {}), "inputStage": node}
            if stats is not None:
                node["docsExamined"] = stats.get("docsExamined", 0)
    if plan.sharded:
        node = {"stage": "SHARDING_FILTER", "inputStage": node}
    sort_provided = plan.sort is None or (cand is not None and cand.sort_provided)
    if plan.sort and not sort_provided:
        node = {"stage": "SORT", "sortPattern": dict(plan.sort), "type": "simple", "inputStage": node}
    if plan.projection:
        covered = cand is not None and cand.covered
        stage = "PROJECTION_COVERED" if covered else "PROJECTION_SIMPLE"
        node = {"stage": stage, "transformBy": dict(plan.projection), "inputStage": node}
    return node


def explain(plan: Plan, stats: Mapping[str, int] | None = None) -> dict[str, Any]:
    """queryPlanner (winningPlan, rejectedPlans) and, given the executor's counts,
    executionStats, in MongoDB's shape (one shard's)."""
    out: dict[str, Any] = {
        "queryPlanner": {
            "plannerVersion": 1,
            "parsedQuery": plan.matcher.filter,
            "indexFilterSet": False,
            "winningPlan": _stages(plan, plan.winner),
            "rejectedPlans": [_stages(plan, c) for c in plan.rejected],
        }
    }
    if plan.hint is not None and plan.hint != IDHACK:
        out["queryPlanner"]["hint"] = plan.hint
    if stats is not None:
        out["executionStats"] = {
            "executionSuccess": True,
            "nReturned": stats.get("nReturned", 0),
            "executionTimeMillis": stats.get("executionTimeMillis", 0),
            "totalKeysExamined": stats.get("keysExamined", 0),
            "totalDocsExamined": stats.get("docsExamined", 0),
            "executionStages": _stages(plan, plan.winner, stats),
        }
    return out


def describe(plan: Plan) -> str:
    """One line for humans: `IXSCAN a_1 {a: ["[5, 5]"]}` / `COLLSCAN`."""
    if plan.winner is None:
        return "IDHACK" if plan.hint == IDHACK else "COLLSCAN"
    extra = " covered" if plan.covered else ""
    extra += " sorted" if plan.sort and plan.sort_provided else ""
    bounds = ", ".join(f"{p}: {' ∪ '.join(ivs) or 'none'}" for p, ivs in format_bounds(plan.winner).items())
    return f"IXSCAN {plan.winner.name} {{{bounds}}}{extra}"
