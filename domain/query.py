"""Document operations of a shard, with MongoDB semantics: filters, sort, projection
and updates.  Pure: no I/O.  Every comparison goes through ``domain.shardkey``'s
ordering (``encode_value`` bytes / ``compare_values``).

Supported
---------
* Filters (:func:`compile_filter`): implicit equality ``{a: v}``, ``$eq $ne $gt $gte
  $lt $lte $in $nin $exists``, ``$not`` on an operator object, ``$and $or $nor`` (top
  level and nested), dotted paths.  MongoDB's array rules: a path reaching an array
  tests the array itself and each element; ``a.b`` fans out over the subdocuments of
  an array ``a`` (not over nested arrays, not over scalar elements); a numeric
  component indexes an array.  ``$ne``/``$nin``/``$not`` negate the whole path, so
  ``{a: {$ne: 1}}`` does not match ``a: [1, 2]``.  Equality is value equality
  (``1 == 1.0 == Int64(1) == Decimal128("1")``, ``true != 1``); ``$gt``-style operators
  only match values of the operand's canonical type (numbers with numbers, dates with
  dates, ObjectIds with ObjectIds, ...), except MinKey/MaxKey operands.
  NaN equals NaN and is neither below nor above anything.  A missing field (or a
  path through a scalar) equals null for ``$eq``/``$in``/``$gte``/``$lte``; ``$exists``
  tells them apart.
* Targeting (``Matcher.equality_on / in_values_on / bounds_on``), see :class:`Matcher`.
* Sort (:func:`sort_key`, :func:`merge_sorted`): ``{field: 1 | -1, ...}``; through arrays by
  the smallest (ascending) or largest (descending) value, as MongoDB.
* Projection (:func:`apply_projection`): inclusion or exclusion, dotted paths, ``_id``.
* Updates (:func:`apply_update`, :func:`upsert_document`): ``$set $unset $inc
  $setOnInsert``, replacement documents, ``_id`` immutability, upsert seeding.
  ``$inc`` widens as MongoDB does: int32 + int32 stays int32 unless it overflows (then
  ``Int64``); with an ``Int64`` it is an ``Int64``; with a double a double; with a
  ``Decimal128`` a ``Decimal128`` (a double rounded to 15 digits first); an int64
  overflow is refused.
* :func:`get_path`: plain dotted lookup (objects only) returning :data:`MISSING`.

Refused, never answered differently (issue 38 §1)
-------------------------------------------------
Operators MongoDB has that shardlog does not evaluate are refused by name with
``QueryFeatureNotAllowed`` (224), whatever the data: ``$regex $type $all $elemMatch $size $mod
$expr $where $text $jsonSchema $sampleRate``, geo and bitwise operators; a regular expression
(``bson.Regex``) as an implicit equality, in ``$in``/``$nin``/``$ne`` or under ``$not`` (MongoDB
matches it as a pattern there; ``{$eq: regex}``, which compares regex values, is supported);
the update operators ``$push $addToSet $pull $pullAll $pop $min $max $mul $rename $currentDate
$bit``, positional ``$``/``$[]``/``$[<id>]`` paths and pipeline-style updates; projection
operators (``$slice $elemMatch $meta``, literals, expressions); ``$natural``/``$meta`` sorts.
An unknown operator gets MongoDB's answer: ``unknown operator: $x`` (BadValue, 2) in a filter,
``Unknown modifier: $x`` (FailedToParse, 9) in an update.  :func:`check_update` refuses what
MongoDB refuses of an update before reading a document.

Numeric path components: a filter reads ``a.0`` as the array's first element and as the field
``"0"`` of its subdocuments; an update's ``a.0`` is the position (padding with nulls as
MongoDB), ``$unset`` of an element leaves a null.  Update fields apply in MongoDB 5.0's order:
component by component, numerically when both components are numbers.

Deviations from MongoDB (refused, not answered otherwise)
---------------------------------------------------------
* ``{a: {$gt: 1, b: 2}}`` (operators mixed with fields) is refused; MongoDB reads it
  as an operator object or an exact object depending on the first key.
* ``$exists`` takes a boolean or number only.
"""

from __future__ import annotations

import copy
import functools
import heapq
import math
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, NamedTuple

from bson import Code, DatetimeMS, Decimal128, Int64, ObjectId, Regex, Timestamp
from bson.decimal128 import create_decimal128_context

from domain.bsonvalues import type_name
from domain.shardkey import (
    INT64_MAX,
    INT64_MIN,
    MAX_KEY,
    MAX_NESTING_DEPTH,
    MIN_KEY,
    ShardKeyError,
    compare_values,
    encode_value,
    is_max_key,
    is_min_key,
)

# A document, filter, update, sort or projection: a dict of ``bson`` values
# (docs/decisions/0016; plain JSON values are a subset).
Document = dict[str, Any]

__all__ = [
    "MISSING",
    "NOT_CONSTRAINED",
    "Bounds",
    "Matcher",
    "QueryError",
    "apply_projection",
    "apply_update",
    "check_insert_document",
    "check_update",
    "compile_filter",
    "get_path",
    "is_update_operator_doc",
    "merge_sorted",
    "sort_key",
    "upsert_document",
]


class QueryError(ValueError):
    """A malformed filter, sort, projection or update, or an update that cannot apply.
    `code`: MongoDB's name for it (BadValue; FailedToParse for an unknown update modifier;
    ImmutableField for an update of `_id`; QueryFeatureNotAllowed for an operator MongoDB has
    and shardlog does not evaluate, refused rather than answered wrongly)."""

    def __init__(self, message: str, code: str = "BadValue") -> None:
        super().__init__(message)
        self.code = code


class _Marker:
    """A named singleton; pickles and copies as itself."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


MISSING: Any = _Marker("MISSING")
"""What :func:`get_path` returns for an absent field."""
NOT_CONSTRAINED: Any = _Marker("NOT_CONSTRAINED")
"""What :meth:`Matcher.equality_on` returns when the filter does not pin the path."""


def _unsupported(what: str) -> QueryError:
    """MongoDB has it, shardlog does not evaluate it: refused, whatever the data (issue 38)."""
    return QueryError(f"{what} is not supported by shardlog", "QueryFeatureNotAllowed")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------- paths


def _split_path(path: Any, what: str) -> tuple[str, ...]:
    if not isinstance(path, str) or not path:
        raise QueryError(f"{what} field names must be non-empty strings, got {_short(path)}")
    parts = tuple(path.split("."))
    if "" in parts:
        raise QueryError(f"{what} field {path!r} has an empty path component")
    if any(p.startswith("$") for p in parts):
        raise _unsupported(f"{what} field {path!r}: a '$' path component (positional operators)")
    return parts


def get_path(doc: Any, path: str) -> Any:
    """The value at dotted ``path`` (``"a.b.c"``) through nested objects, or
    :data:`MISSING`.  No fan-out over arrays: a path through a non-object is missing."""
    value = doc
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _is_index(part: str) -> bool:
    return part.isascii() and part.isdigit() and str(int(part)) == part


def _collect(value: Any, parts: tuple[str, ...], i: int, out: list[Any]) -> None:
    if i == len(parts):
        out.append(value)
        if isinstance(value, list):
            out.extend(value)  # a leaf array: the array and each element
        return
    part = parts[i]
    if isinstance(value, dict):
        if part in value:
            _collect(value[part], parts, i + 1, out)
        else:
            out.append(MISSING)
    elif isinstance(value, list):
        if _is_index(part):
            # MongoDB reads a number as the array's position and as a field of its subdocuments.
            idx = int(part)
            found = idx < len(value)
            if found:
                _collect(value[idx], parts, i + 1, out)
            for element in value:
                if isinstance(element, dict) and part in element:
                    found = True
                    _collect(element[part], parts, i + 1, out)
            if not found:
                out.append(MISSING)
        else:
            for element in value:  # subdocuments only: not scalars, not nested arrays
                if isinstance(element, dict):
                    _collect(element, parts, i, out)
    else:
        out.append(MISSING)  # a path through a scalar is missing


def _candidates(doc: Document, parts: tuple[str, ...]) -> list[tuple[Any, bytes | None]]:
    """The values a leaf predicate tests, each with its encoding (None: missing)."""
    out: list[Any] = []
    _collect(doc, parts, 0, out)
    return [(v, None if v is MISSING else encode_value(v)) for v in out]


def _encode(value: Any, where: str) -> bytes:
    try:
        return encode_value(value)
    except ShardKeyError as e:
        raise QueryError(f"{where}: {e}") from None


# ----------------------------------------------------------------------------- filters

_CMP: dict[str, Callable[[int], bool]] = {
    "$eq": lambda c: c == 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
}
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$not")
# MongoDB's other operators: refused by name (QueryFeatureNotAllowed), never taken for unknown.
_UNSUPPORTED_OPERATORS = frozenset(
    {
        "$regex",
        "$options",
        "$type",
        "$all",
        "$elemMatch",
        "$size",
        "$mod",
        "$bitsAllSet",
        "$bitsAnySet",
        "$bitsAllClear",
        "$bitsAnyClear",
        "$geoWithin",
        "$geoIntersects",
        "$near",
        "$nearSphere",
        "$within",
        "$jsonSchema",
        "$_internalSchemaType",
    }
)
_UNSUPPORTED_TOP_LEVEL = frozenset({"$expr", "$where", "$text", "$jsonSchema", "$sampleRate"})


def _is_nan(v: Any) -> bool:
    return (isinstance(v, float) and v != v) or (isinstance(v, Decimal128) and v.to_decimal().is_nan())


def _hit(op: str, cand: Any, cenc: bytes | None, v: Any, venc: bytes) -> bool:
    """Does one candidate satisfy ``op v``?  (MongoDB's ComparisonMatchExpression.)"""
    if cenc is None:  # missing behaves as null, for the operators that admit equality
        return v is None and op in ("$eq", "$gte", "$lte")
    if cenc[0] != venc[0]:  # the first byte is the canonical type
        if is_min_key(v):
            return op in ("$gt", "$gte")
        if is_max_key(v):
            return op in ("$lt", "$lte")
        return False
    if _is_nan(cand) != _is_nan(v):
        return False
    return _CMP[op]((cenc > venc) - (cenc < venc))


_Cands = list[tuple[Any, bytes | None]]


@dataclass(frozen=True)
class _Cmp:
    op: str
    value: Any
    enc: bytes

    def test(self, cands: _Cands) -> bool:
        return any(_hit(self.op, c, e, self.value, self.enc) for c, e in cands)


@dataclass(frozen=True)
class _In:
    values: tuple[Any, ...]
    encs: frozenset[bytes]

    def test(self, cands: _Cands) -> bool:
        # Equality is byte equality of encodings (NaN included); missing equals null.
        return any(e in self.encs if e is not None else None in self.values for _, e in cands)


@dataclass(frozen=True)
class _Exists:
    want: bool

    def test(self, cands: _Cands) -> bool:
        return any(e is not None for _, e in cands) == self.want


@dataclass(frozen=True)
class _Not:
    tests: tuple[Any, ...]

    def test(self, cands: _Cands) -> bool:
        return not all(t.test(cands) for t in self.tests)


@dataclass(frozen=True)
class _Field:
    path: str
    parts: tuple[str, ...]
    tests: tuple[Any, ...]

    def matches(self, doc: Document) -> bool:
        cands = _candidates(doc, self.parts)
        return all(t.test(cands) for t in self.tests)


@dataclass(frozen=True)
class _Const:
    """$alwaysTrue / $alwaysFalse."""

    value: bool

    def matches(self, doc: Document) -> bool:
        return self.value


@dataclass(frozen=True)
class _Logic:
    op: str  # "$and" | "$or" | "$nor"
    children: tuple[Any, ...]

    def matches(self, doc: Document) -> bool:
        if self.op == "$and":
            return all(c.matches(doc) for c in self.children)
        hit = any(c.matches(doc) for c in self.children)
        return hit if self.op == "$or" else not hit


def _is_operator_object(value: Any) -> bool:
    """True for ``{"$gt": 1, ...}``, False for any other value; mixing raises."""
    if not isinstance(value, dict) or not value:
        return False
    dollar = [isinstance(k, str) and k.startswith("$") for k in value]
    if all(dollar):
        return True
    if any(dollar):
        raise QueryError(
            f"cannot mix operators and plain fields in {_short(value)}: use either "
            "an operator object like {'$gt': 1} or a plain value to compare exactly"
        )
    return False


def _parse(flt: Any, depth: int = 0) -> _Logic:
    if not isinstance(flt, dict):
        raise QueryError(f"a filter must be an object, got {type(flt).__name__}: {_short(flt)}")
    if depth > MAX_NESTING_DEPTH:
        raise QueryError(f"filter nested deeper than {MAX_NESTING_DEPTH} levels")
    nodes: list[Any] = []
    for key, value in flt.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(value, list) or not value or not all(isinstance(x, dict) for x in value):
                raise QueryError(f"{key} needs a non-empty array of objects, got {_short(value)}")
            nodes.append(_Logic(key, tuple(_parse(x, depth + 1) for x in value)))
        elif key == "$comment":
            continue  # MongoDB's: a note for the logs, matching everything
        elif key in ("$alwaysTrue", "$alwaysFalse"):
            if type(value) not in (int, float) or value != 1:
                raise QueryError(f"{key} must be an integer value of 1")
            nodes.append(_Const(key == "$alwaysTrue"))
        elif key in _UNSUPPORTED_TOP_LEVEL:
            raise _unsupported(f"the query operator {key}")
        elif isinstance(key, str) and key.startswith("$"):
            raise QueryError(
                f"unknown top level operator: {key}. If you have a field name that starts with a '$' symbol, "
                "consider using $getField or $setField."
            )
        else:
            parts = _split_path(key, "filter")
            if _is_operator_object(value):
                tests = _parse_operators(key, value)
            else:
                _no_regex(key, "equality", value)
                tests = (_Cmp("$eq", value, _encode(value, f"value of {key!r}")),)
            nodes.append(_Field(key, parts, tests))
    return _Logic("$and", tuple(nodes))


def _no_regex(path: str, where: str, v: Any) -> None:
    """MongoDB matches a regex in these places as a pattern, which is not supported; an
    equality on the regex value would give different answers, so refuse it."""
    if isinstance(v, Regex):
        raise _unsupported(
            f"{where} on {path!r} with a regular expression ({_short(v)}): regular expression matching"
        )


def _parse_in(path: str, op: str, arg: Any) -> _In:
    if not isinstance(arg, list):
        raise QueryError(f"{op} on {path!r} needs an array, got {_short(arg)}")
    for v in arg:
        if _is_operator_object(v):
            raise QueryError(f"{op} on {path!r}: cannot nest operators inside {op}, got {_short(v)}")
        _no_regex(path, op, v)
    return _In(tuple(arg), frozenset(_encode(v, f"{op} on {path!r}") for v in arg))


def _parse_operators(path: str, ops: Document) -> tuple[Any, ...]:
    tests: list[Any] = []
    for op, arg in ops.items():
        if op in _CMP:
            tests.append(_Cmp(op, arg, _encode(arg, f"{op} on {path!r}")))
        elif op == "$ne":
            _no_regex(path, op, arg)
            tests.append(_Not((_Cmp("$eq", arg, _encode(arg, f"$ne on {path!r}")),)))
        elif op in ("$in", "$nin"):
            test = _parse_in(path, op, arg)
            tests.append(test if op == "$in" else _Not((test,)))
        elif op == "$exists":
            if type(arg) not in (bool, int, float):
                raise QueryError(f"$exists on {path!r} needs true or false, got {_short(arg)}")
            tests.append(_Exists(bool(arg)))
        elif op == "$not":
            if isinstance(arg, Regex):
                raise _unsupported(f"$not on {path!r} with a regular expression")
            if not _is_operator_object(arg):
                raise QueryError(
                    f"$not on {path!r} needs a non-empty operator object such as {{'$gt': 5}}, got {_short(arg)}"
                )
            tests.append(_Not(_parse_operators(path, arg)))
        elif op in _UNSUPPORTED_OPERATORS:
            raise _unsupported(f"the query operator {op} (on {path!r})")
        else:
            raise QueryError(f"unknown operator: {op}")
    return tuple(tests)


# --------------------------------------------------------------------------- targeting


class Bounds(NamedTuple):
    """A range of values in MongoDB order; ``lo``/``hi`` are values (``None`` is null)."""

    lo: Any
    lo_inclusive: bool
    hi: Any
    hi_inclusive: bool


# The smallest value of each BSON-only type, in MongoDB's order: the ends of brackets.
_LEAST_BINARY = b""
_LEAST_OBJECT_ID = ObjectId(bytes(12))
_LEAST_DATE = DatetimeMS(INT64_MIN)
_LEAST_TIMESTAMP = Timestamp(0, 0)
_LEAST_REGEX: Regex[str] = Regex("")
_LEAST_CODE = Code("")
_LEAST_CODE_WITH_SCOPE = Code("", {})


def _bracket(v: Any) -> Bounds:
    """The range of ``v``'s canonical type: where ``$gt/$lt v`` can match."""
    if is_min_key(v) or is_max_key(v):
        return Bounds(MIN_KEY, True, MAX_KEY, True)
    if v is None:
        return Bounds(None, True, None, True)
    if isinstance(v, bool):
        return Bounds(False, True, True, True)  # booleans sort below dates
    if isinstance(v, (int, float, Decimal128)):  # NaN sorts lowest but only matches NaN operands
        return Bounds(v if _is_nan(v) else -math.inf, True, math.inf, True)
    if isinstance(v, Code):  # before str: Code is a str subclass
        if v.scope is None:
            return Bounds(_LEAST_CODE, True, _LEAST_CODE_WITH_SCOPE, False)
        return Bounds(_LEAST_CODE_WITH_SCOPE, True, MAX_KEY, False)
    if isinstance(v, str):
        return Bounds("", True, {}, False)
    if isinstance(v, dict):
        return Bounds({}, True, [], False)
    if isinstance(v, list):
        return Bounds([], True, _LEAST_BINARY, False)  # arrays sort below binData
    if isinstance(v, bytes):
        return Bounds(_LEAST_BINARY, True, _LEAST_OBJECT_ID, False)
    if isinstance(v, ObjectId):
        return Bounds(_LEAST_OBJECT_ID, True, False, False)
    if isinstance(v, Timestamp):
        return Bounds(_LEAST_TIMESTAMP, True, _LEAST_REGEX, False)
    if isinstance(v, Regex):
        return Bounds(_LEAST_REGEX, True, _LEAST_CODE, False)
    return Bounds(_LEAST_DATE, True, _LEAST_TIMESTAMP, False)  # dates (encode_value checked the type)


def _within(v: Any, b: Bounds) -> bool:
    lo, hi = compare_values(v, b.lo), compare_values(v, b.hi)
    return (lo > 0 or (lo == 0 and b.lo_inclusive)) and (hi < 0 or (hi == 0 and b.hi_inclusive))


def _hull(values: Iterable[Any]) -> Bounds:
    ordered = sorted(values, key=encode_value)
    return Bounds(ordered[0], True, ordered[-1], True)


def _pick(
    a: tuple[Any, bool], b: tuple[Any, bool], larger: bool, tie: Callable[[bool, bool], bool]
) -> tuple[Any, bool]:
    """The larger (or smaller) of two (value, inclusive) ends; ``tie`` merges the
    inclusive flags of equal values."""
    c = compare_values(a[0], b[0])
    if c == 0:
        return a[0], tie(a[1], b[1])
    return a if (c > 0) == larger else b


def _bounds_and(a: Bounds | None, b: Bounds | None) -> Bounds | None:
    """Intersection (None: unconstrained)."""
    if a is None or b is None:
        return a if b is None else b
    lo = _pick(a[:2], b[:2], larger=True, tie=operator.and_)
    hi = _pick(a[2:], b[2:], larger=False, tie=operator.and_)
    return Bounds(*lo, *hi)


def _bounds_or(a: Bounds | None, b: Bounds | None) -> Bounds | None:
    """Smallest range holding both (None: unconstrained)."""
    if a is None or b is None:
        return None
    lo = _pick(a[:2], b[:2], larger=False, tie=operator.or_)
    hi = _pick(a[2:], b[2:], larger=True, tie=operator.or_)
    return Bounds(*lo, *hi)


@dataclass(frozen=True)
class _Range:
    """What a (sub)filter implies about the value at one path for every matching
    document with no array along that path (missing counts as null): it lies within
    ``bounds`` (None: anywhere) and, unless ``values`` is None, equals one of them."""

    bounds: Bounds | None
    values: tuple[Any, ...] | None


def _make_range(bounds: Bounds | None, values: Iterable[Any] | None) -> _Range:
    if values is None:
        return _Range(bounds, None)
    kept: dict[bytes, Any] = {}
    for v in values:  # dedup by value (1 == 1.0) and drop values outside the bounds
        if bounds is None or _within(v, bounds):
            kept.setdefault(encode_value(v), v)
    vs = tuple(kept.values())
    return _Range(_hull(vs) if vs else bounds, vs)


def _range_of_test(test: Any) -> _Range | None:
    if isinstance(test, _Cmp):
        v = test.value
        if test.op == "$eq":
            return _make_range(None, (v,))
        lo, lo_inc, hi, hi_inc = _bracket(v)
        if test.op in ("$gt", "$gte"):
            return _Range(Bounds(v, test.op == "$gte", hi, hi_inc), None)
        return _Range(Bounds(lo, lo_inc, v, test.op == "$lte"), None)
    if isinstance(test, _In):
        return _make_range(None, test.values)
    return None  # $ne, $nin, $not, $exists: no range


def _intersect(ranges: Iterable[_Range | None]) -> _Range | None:
    result: _Range | None = None
    for r in ranges:
        if r is None:
            continue
        if result is None:
            result = r
            continue
        bounds = _bounds_and(result.bounds, r.bounds)
        if result.values is None or r.values is None:
            values = result.values if r.values is None else r.values
        else:
            other = {encode_value(v) for v in r.values}
            values = tuple(v for v in result.values if encode_value(v) in other)
        result = _make_range(bounds, values)
    return result


def _union(ranges: list[_Range | None]) -> _Range | None:
    if any(r is None for r in ranges):
        return None  # some branch does not constrain the path
    result = ranges[0]
    for r in ranges[1:]:
        assert result is not None and r is not None
        values = None if result.values is None or r.values is None else result.values + r.values
        result = _make_range(_bounds_or(result.bounds, r.bounds), values)
    return result


def _range_of(node: Any, path: str) -> _Range | None:
    if isinstance(node, _Field):
        return _intersect(_range_of_test(t) for t in node.tests) if node.path == path else None
    if isinstance(node, _Const):
        return None
    if node.op == "$and":
        return _intersect(_range_of(c, path) for c in node.children)
    if node.op == "$or":
        return _union([_range_of(c, path) for c in node.children])
    return None  # $nor


class Matcher:
    """A compiled filter.

    ``matches(doc)`` evaluates it.  The targeting helpers describe the value at a
    dotted ``path`` (matched literally against the filter's field names) for every
    document the filter matches; they are conservative: they never claim a
    constraint that could fail, for documents with no array along ``path`` (shard
    keys never hold arrays) and a missing field counted as null (as
    ``KeyPattern.extract`` does).  They look at top-level fields, into ``$and`` at any
    depth, and into ``$or`` only when every branch constrains the path (the union);
    ``$nor``, ``$not``, ``$ne``, ``$nin`` and ``$exists`` constrain nothing.
    """

    __slots__ = ("filter", "_root")

    def __init__(self, filter: Document, root: _Logic) -> None:
        self.filter = filter
        self._root = root

    def __repr__(self) -> str:
        return f"Matcher({_short(self.filter, 200)})"

    def matches(self, doc: Document) -> bool:
        if not isinstance(doc, dict):
            raise QueryError(f"documents must be objects, got {type(doc).__name__}")
        return self._root.matches(doc)

    def equality_on(self, path: str) -> Any:
        """The one value ``path`` must equal (by ``compare_values``) -- from ``{path: v}``,
        ``$eq``, a one-value ``$in`` or intersections -- else :data:`NOT_CONSTRAINED`.
        ``None`` means null-or-missing.  The value may be an array, which only arrays
        match: for array-free documents such a filter matches nothing."""
        r = _range_of(self._root, path)
        if r is None or r.values is None or len(r.values) != 1:
            return NOT_CONSTRAINED
        return r.values[0]

    def in_values_on(self, path: str) -> list[Any] | None:
        """The finite set of values ``path`` must equal one of (deduplicated, in filter
        order), from equality, ``$in`` and their intersections and ``$or`` unions; None
        if not finite.  ``[]`` means no array-free document matches."""
        r = _range_of(self._root, path)
        return None if r is None or r.values is None else list(r.values)

    def bounds_on(self, path: str) -> Bounds | None:
        """A range ``(lo, lo_inclusive, hi, hi_inclusive)`` holding the value at ``path``,
        or None if unconstrained.  ``$gt``-style bounds stop at the edge of the operand's
        type (``{$gt: 5}`` -> ``(5, False, inf, True)``; ``{$lt: "m"}`` -> ``("", True,
        "m", False)``) because other types never match.  The range may be empty
        (``lo > hi``) when no array-free document can match."""
        r = _range_of(self._root, path)
        return None if r is None else r.bounds


def compile_filter(filter: Document) -> Matcher:
    """Validate and compile a MongoDB filter; :class:`QueryError` if malformed."""
    return Matcher(filter, _parse(filter))


# -------------------------------------------------------------------------------- sort

_COMPLEMENT = bytes(range(255, -1, -1))


def _sort_fields(spec: Any) -> list[tuple[str, bool]]:
    if not isinstance(spec, dict) or not spec:
        raise QueryError(f"a sort must be a non-empty object of field: 1 | -1, got {_short(spec)}")
    fields = []
    for path, direction in spec.items():
        _split_path(path, "sort")
        if type(direction) not in (int, float) or direction not in (1, -1):
            raise QueryError(f"sort direction for {path!r} must be 1 or -1, got {_short(direction)}")
        fields.append((path, direction == -1))
    return fields


# An empty array at a sort path sorts below null (MongoDB's undefined), above MinKey.
_EMPTY_ARRAY_KEY = b"\x18"


def _sort_values(value: Any, parts: tuple[str, ...], i: int, out: list[bytes]) -> None:
    """The encodings a document's sort key at ``parts`` is chosen from, as MongoDB generates
    them: a leaf array gives its elements (an empty one sorts below null), arrays of
    subdocuments fan out, and a missing field, or a scalar the path goes through, is null."""
    if i == len(parts):
        if isinstance(value, list):
            if not value:
                out.append(_EMPTY_ARRAY_KEY)
            out.extend(encode_value(v) for v in value)
        else:
            out.append(encode_value(value))
        return
    part = parts[i]
    if isinstance(value, dict):
        if part in value:
            _sort_values(value[part], parts, i + 1, out)
        else:
            out.append(encode_value(None))
    elif isinstance(value, list):
        if _is_index(part) and int(part) < len(value):
            _sort_values(value[int(part)], parts, i + 1, out)
        elif not value:
            out.append(encode_value(None))
        else:
            for element in value:
                _sort_values(element, parts, i, out) if isinstance(element, dict) else out.append(encode_value(None))
    else:
        out.append(encode_value(None))


def sort_key(spec: Document) -> Callable[[Document], tuple[bytes, ...]]:
    """A ``key=`` function for ``sorted()`` ordering documents by ``spec`` in MongoDB
    order; a missing field sorts as null.  Through arrays, as MongoDB: an ascending field sorts
    by the smallest value at its path, a descending one by the largest.

    Each field is its ``encode_value`` bytes and a 0x00, complemented when
    descending.  The only encodings that are a proper prefix of another continue with
    0xFF (a decimal's extra precision), so with the 0x00 two different fields differ
    at a byte both have and complementing exactly reverses their order."""
    fields = [(path, tuple(path.split(".")), descending) for path, descending in _sort_fields(spec)]

    def key(doc: Document) -> tuple[bytes, ...]:
        out = []
        for path, parts, descending in fields:
            v = get_path(doc, path)
            if isinstance(v, list) or (v is MISSING and len(parts) > 1):
                found: list[bytes] = []  # an array on the way: the smallest or largest value
                _sort_values(doc, parts, 0, found)
                enc = max(found) if descending else min(found)
            else:
                enc = encode_value(None if v is MISSING else v)
            # The 0x00 terminator: a decimal's encoding may extend a nearby number's with
            # bytes above 0x00 (domain.shardkey), so the reversal must not see a prefix.
            enc += b"\x00"
            out.append(enc.translate(_COMPLEMENT) if descending else enc)
        return tuple(out)

    return key


def merge_sorted(streams: Iterable[Iterable[Document]], spec: Document) -> Iterator[Document]:
    """Merge document streams each sorted by ``spec`` into one sorted stream (stable:
    ties come in stream order).  The spec is validated at once."""
    return heapq.merge(*streams, key=sort_key(spec))


# -------------------------------------------------------------------------- projection


# A set of dotted paths as a tree: each name maps to True where a path ends, else to the subtree.
PathTree = dict[str, "PathTree | Literal[True]"]


def _path_tree(paths: Iterable[tuple[str, ...]], conflict: Callable[[str], str]) -> PathTree:
    """``[("a", "b"), ("c",)]`` -> ``{"a": {"b": True}, "c": True}``; a path that is a
    prefix of (or equal to) another raises ``QueryError(conflict(path))``."""
    tree: PathTree = {}
    for parts in paths:
        node = tree
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if child is True:
                raise QueryError(conflict(".".join(parts)))
            node = child
        if parts[-1] in node:
            raise QueryError(conflict(".".join(parts)))
        node[parts[-1]] = True
    return tree


def _include(value: Any, tree: PathTree) -> Any:
    if isinstance(value, list):  # scalars inside arrays are dropped, as in MongoDB
        return [_include(x, tree) for x in value if isinstance(x, (dict, list))]
    out = {}
    for k, v in value.items():
        sub = tree.get(k)
        if sub is True:
            out[k] = copy.deepcopy(v)
        elif sub is not None and isinstance(v, (dict, list)):
            out[k] = _include(v, sub)
    return out


def _exclude(value: Any, tree: PathTree) -> Any:
    if isinstance(value, list):
        return [_exclude(x, tree) if isinstance(x, (dict, list)) else x for x in value]
    out = {}
    for k, v in value.items():
        sub = tree.get(k)
        if sub is True:
            continue
        out[k] = _exclude(v, sub) if sub is not None and isinstance(v, (dict, list)) else copy.deepcopy(v)
    return out


def _projection_plan(projection: Any) -> tuple[PathTree, bool]:
    if not isinstance(projection, dict):
        raise QueryError(f"a projection must be an object, got {_short(projection)}")
    flags: dict[str, bool] = {}
    for path, flag in projection.items():
        _split_path(path, "projection")
        if type(flag) not in (bool, int, float):
            raise _unsupported(
                f"the projection {{{path!r}: {_short(flag)}}}: $slice, $elemMatch, $meta, literals and expressions"
            )
        flags[path] = bool(flag)
    id_flag = flags.pop("_id", None)
    modes = set(flags.values())
    if len(modes) > 1:
        raise QueryError(
            f"projection {_short(projection)} mixes inclusion and exclusion "
            "(only _id may be excluded from an inclusion projection)"
        )
    inclusive = modes.pop() if modes else bool(id_flag)
    if id_flag is not False and inclusive:
        flags["_id"] = True  # _id is included unless excluded explicitly
    elif id_flag is False and not inclusive:
        flags["_id"] = False
    tree = _path_tree((tuple(p.split(".")) for p in flags), lambda p: f"projection path collision at {p!r}")
    return tree, inclusive


def apply_projection(doc: Document, projection: Document | None) -> Document:
    """A new document: ``doc`` projected (None or ``{}``: a copy of all of it).

    Inclusion ``{a: 1, "b.c": 1}`` keeps those paths (and ``_id`` unless ``_id: 0``) in
    the document's field order; exclusion ``{a: 0}`` drops them.  Dotted paths fan out
    over arrays of subdocuments; with inclusion, scalars inside such arrays are dropped.
    """
    if projection is None or projection == {}:
        return copy.deepcopy(doc)
    tree, inclusive = _projection_plan(projection)
    if not isinstance(doc, dict):
        raise QueryError(f"documents must be objects, got {type(doc).__name__}")
    projected: Document = _include(doc, tree) if inclusive else _exclude(doc, tree)
    return projected


# ----------------------------------------------------------------------------- updates

_UPDATE_OPERATORS = ("$set", "$unset", "$inc", "$setOnInsert")
# MongoDB's other update operators: refused by name (QueryFeatureNotAllowed), not "unknown".
_UNSUPPORTED_UPDATE_OPERATORS = frozenset(
    {"$push", "$addToSet", "$pull", "$pullAll", "$pop", "$min", "$max", "$mul", "$rename", "$currentDate", "$bit"}
)


def is_update_operator_doc(update: Document) -> bool:
    """True for an operator update (``{"$set": ...}``), False for a replacement document
    (``{}`` included).  As MongoDB, the first field decides: a replacement may not hold a
    top-level ``$`` field (DollarPrefixedFieldName), an operator update's other fields are
    modifiers (an unknown one: FailedToParse, from :func:`check_update`)."""
    if isinstance(update, list):
        raise _unsupported("a pipeline-style update (an array of stages)")
    if not isinstance(update, dict):
        raise QueryError(f"an update must be an object, got {type(update).__name__}", "FailedToParse")
    if not update:
        return False
    first = next(iter(update))
    if isinstance(first, str) and first.startswith("$"):
        return True
    for k in update:
        if isinstance(k, str) and k.startswith("$"):
            raise QueryError(
                f"The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context of an update's "
                "replacement document. Consider using an aggregation pipeline with $replaceWith.",
                "DollarPrefixedFieldName",
            )
    return False


_Edit = tuple[tuple[str, ...], str, Any]


def _update_path(op: str, path: Any) -> tuple[str, ...]:
    """A modifier's field path, with MongoDB's refusals."""
    if not isinstance(path, str) or not path:
        raise QueryError("An empty update path is not valid.", "EmptyFieldName")
    parts = tuple(path.split("."))
    if "" in parts:
        raise QueryError(
            f"The update path '{path}' contains an empty field name, which is not allowed.", "EmptyFieldName"
        )
    for p in parts:
        if p == "$" or (p.startswith("$[") and p.endswith("]")):
            raise _unsupported(f"the positional path {path!r} in {op} ($, $[] and $[<identifier>])")
        if p.startswith("$"):
            raise QueryError(
                f"The dollar ($) prefixed field '{p}' in '{path}' is not valid for storage.", "DollarPrefixedFieldName"
            )
    return parts


def _parse_edits(update: Document) -> list[_Edit]:
    """The edits of an operator update, every one checked: what MongoDB refuses before it
    reads a document is refused here, whether or not anything matches."""
    edits: list[_Edit] = []
    for op, fields in update.items():
        if op in _UNSUPPORTED_UPDATE_OPERATORS:
            raise _unsupported(f"the update operator {op}")
        if op not in _UPDATE_OPERATORS:
            raise QueryError(
                f"Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array",
                "FailedToParse",
            )
        if not isinstance(fields, dict):
            raise QueryError(
                f"Modifiers operate on fields but we found type {type_name(fields)} instead. For example: "
                f"{{$mod: {{<field>: ...}}}} not {{{op}: {_short(fields)}}}",
                "FailedToParse",
            )
        for path, arg in fields.items():
            parts = _update_path(op, path)
            if op == "$inc" and not _is_number(arg):
                raise QueryError(
                    f"Cannot increment with non-numeric argument: {{{path}: {_short(arg)}}}", "TypeMismatch"
                )
            if op in ("$set", "$setOnInsert") and parts == ("_id",):
                check_id_value(arg, insert=False)
            edits.append((parts, op, arg))
    conflict = _first_conflict([parts for parts, _, _ in edits])
    if conflict:
        raise QueryError(
            f"Updating the path '{conflict[1]}' would create a conflict at '{conflict[0]}'", "ConflictingUpdateOperators"
        )
    return edits


def check_update(update: Any) -> None:
    """Refuse a malformed update the way MongoDB does, before (and whatever) it matches: an
    unknown modifier (FailedToParse), an operator shardlog does not have, a bad path, a
    conflict, a non-numeric $inc, a replacement with a top-level $ field or an invalid _id."""
    if is_update_operator_doc(update):
        _parse_edits(update)
    elif "_id" in update:
        check_id_value(update["_id"], insert=False)


def _dollar_field(value: Any) -> str | None:
    """The first '$'-prefixed field name anywhere in an _id value, or None."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("$"):
                return k
            if (found := _dollar_field(v)) is not None:
                return found
    elif isinstance(value, list):
        for v in value:
            if (found := _dollar_field(v)) is not None:
                return found
    return None


def check_id_value(value: Any, *, insert: bool) -> None:
    """MongoDB's rules for a document's _id: not an array or a regular expression, no
    '$'-prefixed field inside.  `insert`: the insert's wording and code (BadValue), else an
    update's (InvalidIdField)."""
    for kind, name in ((list, "array"), (Regex, "regex")):
        if isinstance(value, kind):
            if insert:
                raise QueryError(f"can't use an {name} for _id" if name == "array" else f"can't use a {name} for _id")
            raise QueryError(f"The '_id' value cannot be of type {name}", "InvalidIdField")
    if (field := _dollar_field(value)) is not None:
        raise QueryError(
            f"_id fields may not contain '$'-prefixed fields: {field} is not valid for storage.",
            "DollarPrefixedFieldName",
        )


def check_insert_document(doc: Document) -> None:
    """What MongoDB refuses of a document to insert, beyond its size: an invalid _id."""
    if "_id" in doc:
        check_id_value(doc["_id"], insert=True)


def _id_first(doc: Document) -> Document:
    if "_id" not in doc or next(iter(doc)) == "_id":
        return doc
    return {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Decimal128 arithmetic as MongoDB does it: 34 digits, ties to even, overflow to infinity.
_DECIMAL128 = create_decimal128_context()
_DOUBLE_TO_DECIMAL = _DECIMAL128.copy()
_DOUBLE_TO_DECIMAL.prec = 15  # MongoDB's Decimal128(double): 15 significant digits


def _double_to_decimal(v: float) -> Any:
    """MongoDB's Decimal128(double, kRoundTo15Digits): exactly 15 significant digits
    (1.0 -> 1.00000000000000); zero, infinities and NaN as they are."""
    d = _DOUBLE_TO_DECIMAL.create_decimal_from_float(v)
    if not d.is_finite() or not d:
        return d
    return d.quantize(Decimal(1).scaleb(d.adjusted() - 14), context=_DOUBLE_TO_DECIMAL)


def _is_long(v: int) -> bool:
    """An int64 in BSON: an Int64, or an int outside the int32 range (bson writes it as int64)."""
    return isinstance(v, Int64) or not _INT32_MIN <= v <= _INT32_MAX


def _add(current: Any, by: Any, path: str) -> Any:
    """``current + by`` with MongoDB's type widening (SafeNum)."""
    if isinstance(current, Decimal128) or isinstance(by, Decimal128):

        def as_decimal(v: Any) -> Any:
            if isinstance(v, Decimal128):
                return v.to_decimal()
            if isinstance(v, float):
                return _double_to_decimal(v)
            return _DECIMAL128.create_decimal(int(v))

        return Decimal128(_DECIMAL128.add(as_decimal(current), as_decimal(by)))
    if isinstance(current, float) or isinstance(by, float):
        return float(current) + float(by)
    result = int(current) + int(by)
    if not INT64_MIN <= result <= INT64_MAX:
        raise QueryError(
            f"Failed to apply $inc operations to current value ({_short(current)}) for document "
            f"(field {path!r}): the result overflows a signed 64-bit integer",
            "BadValue",
        )
    if _is_long(current) or _is_long(by) or not _INT32_MIN <= result <= _INT32_MAX:
        return Int64(result)
    return result


_MAX_PADDING = 1_500_000  # MongoDB's limit on the nulls an update may add to reach an array position


def _child(node: Any, part: str) -> Any:
    """The value under ``part`` of an object, or of an array when ``part`` is a position; else MISSING."""
    if isinstance(node, dict):
        return node.get(part, MISSING)
    if isinstance(node, list) and _is_index(part) and int(part) < len(node):
        return node[int(part)]
    return MISSING


def _value_at(doc: Any, parts: tuple[str, ...]) -> Any:
    """The value an update path names (positions index arrays), or MISSING."""
    node = doc
    for p in parts:
        node = _child(node, p)
        if node is MISSING:
            return MISSING
    return node


def _put(node: Any, part: str, value: Any, where: str) -> None:
    """Write ``value`` under ``part`` of an object, or at a position of an array, padding the
    array with nulls as MongoDB does; a field name on an array is PathNotViable."""
    if isinstance(node, dict):
        node[part] = value
        return
    if not _is_index(part):
        raise QueryError(f"Cannot create field '{part}' in element {{{where}: {_short(node)}}}", "PathNotViable")
    i = int(part)
    if i >= len(node):
        if i - len(node) > _MAX_PADDING:
            raise QueryError(f"can't backfill array to larger than {_MAX_PADDING} elements", "BadValue")
        node.extend([None] * (i + 1 - len(node)))
    node[i] = value


def _parent_for_write(doc: Document, parts: tuple[str, ...]) -> Any:
    """The object or array holding ``parts[-1]``, creating missing intermediate objects;
    a position indexes an array.  A path through a scalar (or null) is PathNotViable."""
    node: Any = doc
    for i, p in enumerate(parts[:-1]):
        child = _child(node, p)
        if child is MISSING:
            child = {}
            _put(node, p, child, parts[i - 1] if i else p)
        elif not isinstance(child, (dict, list)):
            raise QueryError(
                f"Cannot create field '{parts[i + 1]}' in element {{{p}: {_short(child)}}}", "PathNotViable"
            )
        node = child
    return node


def _set(doc: Document, parts: tuple[str, ...], value: Any) -> None:
    _put(_parent_for_write(doc, parts), parts[-1], copy.deepcopy(value), ".".join(parts[:-1]))


def _unset(doc: Document, parts: tuple[str, ...], _: Any = None) -> None:
    node = _value_at(doc, parts[:-1])
    if isinstance(node, dict):
        node.pop(parts[-1], None)
    elif isinstance(node, list) and _child(node, parts[-1]) is not MISSING:
        node[int(parts[-1])] = None  # MongoDB's $unset of an array element leaves a null in its place


def _inc(doc: Document, parts: tuple[str, ...], by: int | float) -> None:
    parent = _parent_for_write(doc, parts)
    name = parts[-1]
    current = _child(parent, name)
    if current is MISSING:
        _put(parent, name, by, ".".join(parts[:-1]))
        return
    if not _is_number(current):
        raise QueryError(
            f"Cannot apply $inc to a value of non-numeric type. {{_id: {_short(doc.get('_id'))}}} has the field "
            f"'{parts[-1]}' of non-numeric type {type_name(current)}",
            "TypeMismatch",
        )
    _put(parent, name, _add(current, by, ".".join(parts)), ".".join(parts[:-1]))


_APPLY: dict[str, Callable[[Document, tuple[str, ...], Any], None]] = {
    "$set": _set,
    "$setOnInsert": _set,
    "$unset": _unset,
    "$inc": _inc,
}


def _first_conflict(paths: list[tuple[str, ...]]) -> tuple[str, str] | None:
    """Two paths that are equal or one a prefix of the other.  After sorting, a path's
    extensions directly follow it, so neighbours suffice."""
    ordered = sorted(paths)
    for a, b in zip(ordered, ordered[1:]):
        if b[: len(a)] == a:
            return ".".join(a), ".".join(b)
    return None


def _compare_parts(a: str, b: str) -> int:
    """MongoDB's order of two path components: numerically when both are numbers, else as strings."""
    if _is_index(a) and _is_index(b):
        return (int(a) > int(b)) - (int(a) < int(b))
    return (a > b) - (a < b)


_PART_ORDER = functools.cmp_to_key(_compare_parts)


def _path_order(parts: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(_PART_ORDER(p) for p in parts)


def _apply_operators(base: Document, update: Document, is_upsert_insert: bool) -> Document:
    result, _ = _apply_edits(base, update, is_upsert_insert, copy_on_write=False)
    return result


def _copy_parents(doc: Document, parts: tuple[str, ...], copied: set[int]) -> None:
    """Give ``doc`` copies of the objects and arrays on the way to ``parts[-1]``, so that
    editing there leaves the original's untouched."""
    node: Any = doc
    for p in parts[:-1]:
        child = _child(node, p)
        if not isinstance(child, (dict, list)):
            return  # missing (created fresh by the edit) or refused by it
        if id(child) not in copied:
            child = dict(child) if isinstance(child, dict) else list(child)
            if isinstance(node, dict):
                node[p] = child
            else:
                node[int(p)] = child
            copied.add(id(child))
        node = child


def _apply_edits(
    base: Document, update: Document, is_upsert_insert: bool, *, copy_on_write: bool
) -> tuple[Document, list[tuple[str, ...]]]:
    """The operator update applied, and the paths it edited.  ``copy_on_write``: the result
    shares every object it does not edit with ``base`` (which neither may be mutated after)."""
    edits = _parse_edits(update)
    copied: set[int] = set()
    result = dict(base) if copy_on_write else copy.deepcopy(base)
    applied: list[tuple[str, ...]] = []
    for parts, op, arg in sorted(edits, key=lambda e: _path_order(e[0])):  # MongoDB 5.0+: path order
        if op != "$setOnInsert" or is_upsert_insert:
            if copy_on_write:
                _copy_parents(result, parts, copied)
            _APPLY[op](result, parts, arg)
            applied.append(parts)
    if "_id" in base and ("_id" not in result or compare_values(result["_id"], base["_id"]) != 0):
        raise QueryError(
            "Performing an update on the path '_id' would modify the immutable field '_id'", "ImmutableField"
        )
    return result, applied


def update_stored(doc: Document, update: Document) -> Document | None:
    """What ``update`` turns a stored document into, or None when it changes nothing (MongoDB's
    equality of BSON values: true is not 1).  As :func:`apply_update`, inputs never mutated, but
    an operator update copies only the objects it edits and compares only the values it wrote:
    the rest of the new document is the stored one's (neither may be mutated afterwards)."""
    if not isinstance(doc, dict):
        raise QueryError(f"documents must be objects, got {type(doc).__name__}")
    if not is_update_operator_doc(update):
        new = _replace(doc, update)
        return None if encode_value(new) == encode_value(doc) else new
    new, paths = _apply_edits(doc, update, False, copy_on_write=True)
    for parts in paths:
        before, after = _value_at(doc, parts), _value_at(new, parts)
        if before is MISSING or after is MISSING:
            if before is not after:
                return new
        elif encode_value(before) != encode_value(after):
            return new
    return None


def _replace(base: Document, replacement: Document) -> Document:
    if "_id" in replacement:
        check_id_value(replacement["_id"], insert=False)
    result = copy.deepcopy(replacement)
    if "_id" in base:
        if "_id" not in result:
            result["_id"] = copy.deepcopy(base["_id"])
        elif compare_values(result["_id"], base["_id"]) != 0:
            raise QueryError(
                "After applying the update, the (immutable) field '_id' was found to have "
                f"been altered to _id: {_short(result['_id'])}",
                "ImmutableField",
            )
    return _id_first(result)


def _query_equalities(flt: Document) -> Iterator[tuple[str, Any]]:
    """(path, value) pinned by equality at the top level and inside ``$and``."""
    for key, value in flt.items():
        if key == "$and":
            for sub in value:
                yield from _query_equalities(sub)
        elif key.startswith("$"):
            continue  # $or / $nor pin nothing
        elif not _is_operator_object(value):
            yield key, value
        elif "$eq" in value:
            yield key, value["$eq"]


def _upsert_seed(query: Document) -> Document:
    compile_filter(query)  # validate
    pinned = list(_query_equalities(query))
    conflict = _first_conflict([tuple(p.split(".")) for p, _ in pinned])
    if conflict:
        raise QueryError(
            f"cannot infer the upserted document from the query: paths {conflict[0]!r} "
            f"and {conflict[1]!r} are both matched by equality"
        )
    seed: Document = {}
    for path, value in pinned:
        _set(seed, tuple(path.split(".")), value)
    return seed


def apply_update(
    doc: Document, update: Document, *, is_upsert_insert: bool = False, query: Document | None = None
) -> Document:
    """The document ``update`` turns ``doc`` into: a new dict, inputs never mutated.

    Operator updates: ``$set``, ``$unset``, ``$inc`` (numbers only; a missing field is
    set to the increment) and ``$setOnInsert`` (applied only when
    ``is_upsert_insert``); dotted paths create intermediate objects; paths are applied
    in sorted order and may not overlap.  A replacement keeps ``doc``'s ``_id``.
    Changing ``_id`` raises :class:`QueryError`.

    ``is_upsert_insert``: ``doc`` is the document an upsert inserts.  With ``query``
    (the upsert's filter) too, the document starts from the query's equality fields
    (only its ``_id`` for a replacement), ``doc`` supplying fields the query does not
    pin (e.g. a generated ``_id``), and the result has ``_id`` first.  ``query`` is
    ignored otherwise.
    """
    if not isinstance(doc, dict):
        raise QueryError(f"documents must be objects, got {type(doc).__name__}")
    operators = is_update_operator_doc(update)
    base = doc
    if is_upsert_insert and query is not None:
        seed = _upsert_seed(query)
        if not operators:
            seed = {"_id": seed["_id"]} if "_id" in seed else {}
        base = {**seed, **{k: v for k, v in doc.items() if k not in seed}}
    result = _apply_operators(base, update, is_upsert_insert) if operators else _replace(base, update)
    return _id_first(result) if is_upsert_insert else result


def upsert_document(query: Document, update: Document) -> Document:
    """The document an upsert inserts when ``query`` matches nothing: the query's
    equality fields (top level and inside ``$and``, dotted paths expanded) with the
    operator update applied (``$setOnInsert`` included), or for a replacement the
    replacement plus the query's ``_id`` if it pins one.  The caller adds an ``_id``
    if the result has none."""
    return apply_update({}, update, is_upsert_insert=True, query=query)
