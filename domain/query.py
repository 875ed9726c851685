"""Document operations of a shard, with MongoDB semantics: filters, sort, projection
and updates.  Pure: no I/O.  Every comparison goes through ``domain.shardkey``'s
ordering (``encode_value`` bytes / ``compare_values``).

Supported
---------
* Filters (:func:`compile_filter`): implicit equality, ``$eq $ne $gt $gte $lt $lte $in $nin
  $exists $not $and $or $nor``, ``$regex``/``$options`` (and regular expressions in equality,
  ``$in``, ``$nin``, ``$not``), ``$type``, ``$size``, ``$all``, ``$elemMatch``, ``$mod``,
  ``$bitsAllSet $bitsAnySet $bitsAllClear $bitsAnyClear``, ``$expr`` (the pipeline's
  expressions, ``domain/aggregation.py``), ``$comment``, ``$alwaysTrue``/``$alwaysFalse``; dotted
  paths.  MongoDB's array rules: a path reaching an array tests the array itself and each
  element; ``a.b`` fans out over the subdocuments of an array ``a``; ``$size`` and
  ``$elemMatch`` look at the array as a value.  ``$ne``/``$nin``/``$not`` negate the whole
  path.  Equality is value equality (``1 == 1.0 == Int64(1) == Decimal128("1")``, ``true !=
  1``); ``$gt``-style operators only match values of the operand's canonical type, except
  MinKey/MaxKey operands.  A missing field equals null for ``$eq``/``$in``/``$gte``/``$lte``.
* Targeting (``Matcher.equality_on / in_values_on / bounds_on``), see :class:`Matcher`.
* Sort (:func:`sort_key`, :func:`merge_sorted`): ``{field: 1 | -1, ...}``; through arrays by
  the smallest (ascending) or largest (descending) value, as MongoDB.
* Projection (:func:`apply_projection`): inclusion or exclusion, dotted paths, ``_id``,
  ``$slice``, ``$elemMatch``.
* Updates (:func:`check_update`, :func:`apply_update`, :func:`update_stored`,
  :func:`upsert_document`): ``$set $unset $inc $setOnInsert $mul $min $max $rename
  $currentDate $push $addToSet $pop $pull $pullAll $bit``, the positional ``$``, ``$[]`` and
  ``$[<identifier>]`` with arrayFilters, replacement documents, pipelines (``$set $addFields
  $project $unset $replaceRoot $replaceWith``), ``_id`` immutability, upsert seeding.
  ``$inc``/``$mul`` widen as MongoDB does (SafeNum): int32 stays int32 unless it overflows
  (then ``Int64``), with an ``Int64`` an ``Int64``, with a double a double, with a
  ``Decimal128`` a ``Decimal128`` (a double rounded to 15 digits first); an int64 overflow is
  refused.
* :func:`get_path`: plain dotted lookup (objects only) returning :data:`MISSING`.

Refused, never answered differently (issue 38 §1)
-------------------------------------------------
What MongoDB has and shardlog does not evaluate is refused by name with
``QueryFeatureNotAllowed`` (224), whatever the data: ``$where $text $jsonSchema $sampleRate``
and the geospatial operators; a positional ``$`` whose array the query's conditions match at
different elements (MongoDB's pick depends on its evaluation order); projection ``$meta``, the
projection's positional ``$``, literals and expressions; ``$natural``/``$meta`` sorts.
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
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar, Literal, NamedTuple

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


def _collect(value: Any, parts: tuple[str, ...], i: int, out: list[Any], expand: bool = True) -> None:
    if i == len(parts):
        out.append(value)
        if expand and isinstance(value, list):
            out.extend(value)  # a leaf array: the array and each element
        return
    part = parts[i]
    if isinstance(value, dict):
        if part in value:
            _collect(value[part], parts, i + 1, out, expand)
        else:
            out.append(MISSING)
    elif isinstance(value, list):
        if _is_index(part):
            # MongoDB reads a number as the array's position and as a field of its subdocuments.
            idx = int(part)
            found = idx < len(value)
            if found:
                _collect(value[idx], parts, i + 1, out, expand)
            for element in value:
                if isinstance(element, dict) and part in element:
                    found = True
                    _collect(element[part], parts, i + 1, out, expand)
            if not found:
                out.append(MISSING)
        else:
            for element in value:  # subdocuments only: not scalars, not nested arrays
                if isinstance(element, dict):
                    _collect(element, parts, i, out, expand)
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
        "$geoWithin",
        "$geoIntersects",
        "$near",
        "$nearSphere",
        "$within",
        "$jsonSchema",
        "$_internalSchemaType",
    }
)
_UNSUPPORTED_TOP_LEVEL = frozenset({"$where", "$text", "$jsonSchema", "$sampleRate"})


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

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(_hit(self.op, c, e, self.value, self.enc) for c, e in cands)


@dataclass(frozen=True)
class _In:
    values: tuple[Any, ...]
    encs: frozenset[bytes]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        # Equality is byte equality of encodings (NaN included); missing equals null.
        return any(e in self.encs if e is not None else None in self.values for _, e in cands)


@dataclass(frozen=True)
class _Exists:
    want: bool

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(e is not None for _, e in cands) == self.want


@dataclass(frozen=True)
class _Not:
    tests: tuple[Any, ...]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return not all(t.test(cands, whole) for t in self.tests)


@dataclass(frozen=True)
class _AllOf:
    """$all: every test holds (an empty $all matches nothing)."""

    tests: tuple[Any, ...]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return bool(self.tests) and all(t.test(cands, whole) for t in self.tests)


@dataclass(frozen=True)
class _AnyOf:
    """$in with regular expressions: one of the tests holds."""

    tests: tuple[Any, ...]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(t.test(cands, whole) for t in self.tests)


_REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE, "u": 0}
_REGEX_MASK = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE


@dataclass(frozen=True)
class _Regex:
    """$regex: a string matching the pattern, or a stored regular expression equal to it."""

    source: Regex[Any]
    compiled: re.Pattern[str]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        for v, _ in cands:
            if isinstance(v, str) and not isinstance(v, Code):
                if self.compiled.search(v):
                    return True
            elif isinstance(v, Regex):
                if v.pattern == self.source.pattern and _flags(v) == _flags(self.source):
                    return True
        return False


def _flags(r: Regex[Any]) -> int:
    flags = r.flags
    if isinstance(flags, str):
        return _regex_flags(flags)
    return int(flags) & _REGEX_MASK


def _regex_flags(options: str) -> int:
    flags = 0
    for ch in options:
        if ch not in _REGEX_FLAGS:
            raise QueryError(f"invalid flag in regex options: {ch}", "Location51108")
        flags |= _REGEX_FLAGS[ch]
    return flags


def _make_regex(pattern: Any, options: str, path: str) -> _Regex:
    if isinstance(pattern, Regex):
        if options:
            raise QueryError("options set in both $regex and $options", "BadValue")
        source = pattern
    elif isinstance(pattern, str):
        source = Regex(pattern, _regex_flags(options))
    else:
        raise QueryError(f"$regex has to be a string, not {type_name(pattern)} (on {path!r})", "BadValue")
    if "\x00" in source.pattern:
        raise QueryError("Regular expression cannot contain an embedded null byte", "Location51091")
    try:
        compiled = re.compile(_pcre_to_python(source.pattern), _flags(source))
    except re.error as e:
        raise QueryError(f"Regular expression is invalid: {e}", "Location51091") from None
    return _Regex(source, compiled)


# MongoDB matches with PCRE2 in UTF mode without UCP: \d \w \s and \b know ASCII only (Python's
# know Unicode), and \Z also matches before a final newline.  The pattern is rewritten so Python's
# `re` answers as PCRE does; an escape the two read differently and that cannot be rewritten is
# refused, never matched otherwise.
_WORD = "A-Za-z0-9_"
_SPACE = "\\t\\n\\x0b\\x0c\\r "
_OUTSIDE = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "w": f"[{_WORD}]",
    "W": f"[^{_WORD}]",
    "s": f"[{_SPACE}]",
    "S": f"[^{_SPACE}]",
    "b": f"(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}]))",
    "B": f"(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}]))",
    "Z": "(?=\\n?\\Z)",
    "z": "\\Z",
}
_INSIDE = {"d": "0-9", "w": _WORD, "s": _SPACE}
_PCRE_ONLY = set("hHvVRXKGpPNgkEQC")  # escapes PCRE reads otherwise (or Python lacks)


def _pcre_to_python(pattern: str) -> str:
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            esc = pattern[i + 1]
            if esc in _PCRE_ONLY:
                raise QueryError(
                    f"Regular expression is invalid: \\{esc} is not supported by shardlog", "Location51091"
                )
            if in_class and esc in "DWSBZz":  # (\\b in a class is a backspace, in both)
                raise QueryError(
                    f"Regular expression is invalid: \\{esc} inside a character class is not supported by shardlog",
                    "Location51091",
                )
            table = _INSIDE if in_class else _OUTSIDE
            out.append(table.get(esc, ch + esc))
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            for lead in ("^", "]"):  # a ']' first in a class is a character, not its end
                if i < len(pattern) and pattern[i] == lead:
                    out.append(lead)
                    i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# BSON type numbers by MongoDB's aliases ($type), "number" being the four numeric types.
_TYPE_NUMBERS: dict[str, tuple[int, ...]] = {
    "double": (1,),
    "string": (2,),
    "object": (3,),
    "array": (4,),
    "binData": (5,),
    "undefined": (6,),
    "objectId": (7,),
    "bool": (8,),
    "date": (9,),
    "null": (10,),
    "regex": (11,),
    "dbPointer": (12,),
    "javascript": (13,),
    "symbol": (14,),
    "javascriptWithScope": (15,),
    "int": (16,),
    "timestamp": (17,),
    "long": (18,),
    "decimal": (19,),
    "minKey": (-1,),
    "maxKey": (127,),
    "number": (1, 16, 18, 19),
}
_KNOWN_TYPE_NUMBERS = frozenset(n for ns in _TYPE_NUMBERS.values() for n in ns)


def _bson_type(v: Any) -> int:
    if isinstance(v, Code):
        return 13 if v.scope is None else 15
    name = type_name(v)
    return _TYPE_NUMBERS[name][0] if name in _TYPE_NUMBERS else 0


@dataclass(frozen=True)
class _Type:
    numbers: frozenset[int]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(e is not None and _bson_type(v) in self.numbers for v, e in cands)


def _parse_type(path: str, arg: Any) -> _Type:
    items = arg if isinstance(arg, list) else [arg]
    numbers: set[int] = set()
    for item in items:
        if isinstance(item, str):
            if item not in _TYPE_NUMBERS:
                raise QueryError(f"Unknown type name alias: {item}", "BadValue")
            numbers.update(_TYPE_NUMBERS[item])
        elif _is_number(item):
            if isinstance(item, float) and not item.is_integer() or int(_as_float(item)) not in _KNOWN_TYPE_NUMBERS:
                raise QueryError(f"Invalid numerical type code: {item}", "BadValue")
            numbers.add(int(_as_float(item)))
        else:
            raise QueryError(f"type must be represented as a number or a string (on {path!r})", "TypeMismatch")
    if not numbers and not items:
        raise QueryError(f"{path} must match at least one type", "FailedToParse")
    return _Type(frozenset(numbers))


def _as_float(v: Any) -> float:
    return float(v.to_decimal()) if isinstance(v, Decimal128) else float(v)


@dataclass(frozen=True)
class _Size:
    """$size: the value itself (not its elements) is an array of that length."""

    n: int
    whole_values: ClassVar[bool] = True

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(isinstance(v, list) and len(v) == self.n for v in whole or ())


def _parse_size(arg: Any) -> _Size:
    if not _is_number(arg):
        raise QueryError("$size needs a number", "BadValue")
    f = _as_float(arg)
    if f != f or not float(f).is_integer():
        raise QueryError("$size must be a whole number", "BadValue")
    if f < 0:
        raise QueryError("$size may not be negative", "BadValue")
    return _Size(int(f))


@dataclass(frozen=True)
class _ElemMatch:
    """$elemMatch: some element of an array value matches; `tests` (operators on the element
    itself) or `root` (a filter on the element, a subdocument)."""

    tests: tuple[Any, ...] | None
    root: Any
    whole_values: ClassVar[bool] = True

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(isinstance(v, list) and any(self.element_matches(el) for el in v) for v in whole or ())

    def element_matches(self, el: Any) -> bool:
        if self.tests is not None:
            return all(t.test([(el, encode_value(el))], [el]) for t in self.tests)
        return isinstance(el, dict) and bool(self.root.matches(el))


_FILTER_LEVEL = frozenset({"$and", "$or", "$nor", "$expr", "$where", "$text", "$comment", "$jsonSchema"})


def _parse_elem_match(path: str, arg: Any, depth: int) -> _ElemMatch:
    if not isinstance(arg, dict):
        raise QueryError("$elemMatch needs an Object", "BadValue")
    if arg and all(isinstance(k, str) and k.startswith("$") and k not in _FILTER_LEVEL for k in arg):
        return _ElemMatch(_parse_operators(path, arg, depth + 1), None)
    return _ElemMatch(None, _parse(arg, depth + 1))


@dataclass(frozen=True)
class _Mod:
    divisor: int
    remainder: int

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        for v, _ in cands:
            if _is_number(v):
                f = _as_float(v) if not isinstance(v, int) else v
                if isinstance(f, float) and (f != f or f in (math.inf, -math.inf)):
                    continue
                n = int(v.to_decimal()) if isinstance(v, Decimal128) else int(f)
                r = abs(n) % abs(self.divisor)  # C's %: the sign of the dividend
                if (-r if n < 0 else r) == self.remainder:
                    return True
        return False


def _parse_mod(arg: Any) -> _Mod:
    if not isinstance(arg, list):
        raise QueryError("malformed mod, needs to be an array", "BadValue")
    if len(arg) < 2:
        raise QueryError("malformed mod, not enough elements", "BadValue")
    if len(arg) > 2:
        raise QueryError("malformed mod, too many elements", "BadValue")
    for x, what in zip(arg, ("divisor", "remainder")):
        if not _is_number(x):
            raise QueryError(f"malformed mod, {what} not a number", "BadValue")
        if _as_float(x) != _as_float(x) or _as_float(x) in (math.inf, -math.inf):
            raise QueryError(f"malformed mod, {what} value is invalid :: caused by :: {x}", "BadValue")
    divisor, remainder = (int(_as_float(x)) for x in arg)
    if divisor == 0:
        raise QueryError("divisor cannot be 0", "BadValue")
    return _Mod(divisor, remainder)


@dataclass(frozen=True)
class _Bits:
    """$bitsAllSet / $bitsAnySet / $bitsAllClear / $bitsAnyClear: bit positions of an integral
    number (two's complement, 64 bits, sign-extended) or of binary data (little-endian)."""

    op: str
    positions: frozenset[int]

    def test(self, cands: _Cands, whole: list[Any] | None = None) -> bool:
        return any(self._one(v) for v, e in cands if e is not None)

    def _one(self, v: Any) -> bool:
        if isinstance(v, bytes):

            def bit(i: int) -> bool:
                return i // 8 < len(v) and bool(v[i // 8] >> (i % 8) & 1)
        elif _is_number(v):
            f = _as_float(v)
            if f != f or not float(f).is_integer() or not -(2.0**63) <= f < 2.0**63:
                return False
            n = int(v.to_decimal()) if isinstance(v, Decimal128) else int(v)

            def bit(i: int) -> bool:
                return bool((n >> min(i, 63)) & 1)  # beyond bit 63: the sign
        else:
            return False
        hits = [bit(i) for i in self.positions]
        if self.op == "$bitsAllSet":
            return all(hits)
        if self.op == "$bitsAnySet":
            return any(hits)
        if self.op == "$bitsAllClear":
            return not any(hits)
        return not all(hits)  # $bitsAnyClear


def _parse_bits(op: str, arg: Any) -> _Bits:
    positions: set[int] = set()
    if isinstance(arg, bytes):
        positions = {i for i in range(len(arg) * 8) if arg[i // 8] >> (i % 8) & 1}
    elif isinstance(arg, list):
        for x in arg:
            if not _is_number(x) or not float(_as_float(x)).is_integer():
                raise QueryError(f"bit positions must be an integer but got: {_short(x)}", "BadValue")
            if _as_float(x) < 0:
                raise QueryError(f"bit positions must be >= 0 but got: {_short(x)}", "BadValue")
            positions.add(int(_as_float(x)))
    elif _is_number(arg):
        f = _as_float(arg)
        if f != f or not float(f).is_integer():
            raise QueryError(f"{op} cannot represent {arg} as a 64-bit integer", "BadValue")
        if f < 0:
            raise QueryError(f"{op} must be non-negative, got {arg}", "BadValue")
        n = int(f)
        positions = {i for i in range(n.bit_length()) if n >> i & 1}
    else:
        raise QueryError(f"{op} takes an Array, a number, or a BinData but received: {_short(arg)}", "BadValue")
    return _Bits(op, frozenset(positions))


@dataclass(frozen=True)
class _Expr:
    """$expr: an aggregation expression over the document, true by MongoDB's truthiness."""

    spec: Any
    evaluate: Any
    op: ClassVar[str] = "$expr"  # walked like a _Logic node by targeting and the planner
    children: ClassVar[tuple[Any, ...]] = ()

    def matches(self, doc: Document) -> bool:
        from domain.aggregation import truthy  # the pipeline's module imports this one

        try:
            return truthy(self.evaluate(doc))
        except ValueError as e:
            raise _as_query_error(e) from None


def _as_query_error(e: ValueError) -> QueryError:
    code = getattr(e, "code", 2)
    name = getattr(e, "code_name", None) or f"Location{code}"
    return QueryError(getattr(e, "message", str(e)), name)


def _parse_expr(spec: Any) -> _Expr:
    from domain.aggregation import compile_expression

    try:
        return _Expr(spec, compile_expression(spec))
    except ValueError as e:
        raise _as_query_error(e) from None


def _needs_whole(test: Any) -> bool:
    if getattr(test, "whole_values", False):
        return True
    return any(_needs_whole(t) for t in getattr(test, "tests", None) or ())


def _whole(doc: Document, parts: tuple[str, ...]) -> list[Any]:
    """The values at the path, a leaf array as one value (what $size and $elemMatch look at)."""
    out: list[Any] = []
    _collect(doc, parts, 0, out, expand=False)
    return out


@dataclass(frozen=True)
class _Field:
    path: str
    parts: tuple[str, ...]
    tests: tuple[Any, ...]
    whole: bool = False  # a test reads arrays as values ($size, $elemMatch)

    def matches(self, doc: Document) -> bool:
        cands = _candidates(doc, self.parts)
        whole = _whole(doc, self.parts) if self.whole else None
        return all(t.test(cands, whole) for t in self.tests)


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
            # an empty $and holds for every document, an empty $or for none
            nodes.append(_Logic("$and" if key == "$alwaysTrue" else "$or", ()))
        elif key == "$expr":
            nodes.append(_parse_expr(value))
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
                tests = _parse_operators(key, value, depth)
            elif isinstance(value, Regex):
                tests = (_make_regex(value, "", key),)  # {a: /x/} matches as a pattern
            else:
                tests = (_Cmp("$eq", value, _encode(value, f"value of {key!r}")),)
            nodes.append(_Field(key, parts, tests, any(_needs_whole(t) for t in tests)))
    return _Logic("$and", tuple(nodes))


def _parse_in(path: str, op: str, arg: Any) -> Any:
    """$in / $nin's values: equality to each, a regular expression matching as a pattern."""
    if not isinstance(arg, list):
        raise QueryError(f"{op} needs an array")
    plain: list[Any] = []
    patterns: list[Any] = []
    for v in arg:
        if _is_operator_object(v):
            raise QueryError(f"cannot nest $ under {op}")
        if isinstance(v, Regex):
            patterns.append(_make_regex(v, "", path))
        else:
            plain.append(v)
    values = _In(tuple(plain), frozenset(_encode(v, f"{op} on {path!r}") for v in plain))
    return _AnyOf((values, *patterns)) if patterns else values


def _parse_all(path: str, arg: Any, depth: int) -> _AllOf:
    """$all: equality to every value (a regular expression as a pattern), or every $elemMatch."""
    if not isinstance(arg, list):
        raise QueryError("$all needs an array", "BadValue")
    elem = [isinstance(v, dict) and bool(v) and next(iter(v)) == "$elemMatch" for v in arg]
    if any(elem) and not all(elem):
        raise QueryError("$all/$elemMatch has to be consistent", "BadValue")
    tests: list[Any] = []
    for v in arg:
        if isinstance(v, dict) and v and next(iter(v)) == "$elemMatch":
            tests.append(_parse_elem_match(path, v["$elemMatch"], depth))
        elif _is_operator_object(v):
            raise QueryError("no $ expressions in $all", "BadValue")
        elif isinstance(v, Regex):
            tests.append(_make_regex(v, "", path))
        else:
            tests.append(_Cmp("$eq", v, _encode(v, f"$all on {path!r}")))
    return _AllOf(tuple(tests))


def _parse_operators(path: str, ops: Document, depth: int = 0) -> tuple[Any, ...]:
    if depth > MAX_NESTING_DEPTH:
        raise QueryError(f"filter nested deeper than {MAX_NESTING_DEPTH} levels")
    tests: list[Any] = []
    for op, arg in ops.items():
        if op in _CMP:
            tests.append(_Cmp(op, arg, _encode(arg, f"{op} on {path!r}")))
        elif op == "$regex":
            options = ops.get("$options", "")
            if not isinstance(options, str):
                raise QueryError("$options has to be a string", "BadValue")
            tests.append(_make_regex(arg, options, path))
        elif op == "$options":
            if "$regex" not in ops:
                raise QueryError("$options needs a $regex", "BadValue")
        elif op == "$type":
            tests.append(_parse_type(path, arg))
        elif op == "$size":
            tests.append(_parse_size(arg))
        elif op == "$mod":
            tests.append(_parse_mod(arg))
        elif op in ("$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear"):
            tests.append(_parse_bits(op, arg))
        elif op == "$elemMatch":
            tests.append(_parse_elem_match(path, arg, depth))
        elif op == "$all":
            tests.append(_parse_all(path, arg, depth))
        elif op == "$ne":
            if isinstance(arg, Regex):
                raise QueryError("Can't have regex as arg to $ne.", "BadValue")
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
                tests.append(_Not((_make_regex(arg, "", path),)))
                continue
            if not _is_operator_object(arg):
                raise QueryError(
                    f"$not on {path!r} needs a non-empty operator object such as {{'$gt': 5}}, got {_short(arg)}"
                )
            tests.append(_Not(_parse_operators(path, arg, depth + 1)))
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
    if not ranges or any(r is None for r in ranges):
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


@dataclass(frozen=True)
class _ProjectionPlan:
    tree: PathTree
    inclusive: bool
    slices: tuple[tuple[tuple[str, ...], int, int | None], ...]  # (path, skip or count, limit)
    elem_matches: tuple[tuple[str, Any], ...]  # (top-level field, _ElemMatch)


def _parse_slice(path: str, arg: Any) -> tuple[int, int | None]:
    """$slice: n (the first n, or the last -n) or [skip, limit] (skip from the end if negative)."""
    if _is_number(arg):
        return int(_as_float(arg)), None
    if isinstance(arg, list) and len(arg) == 2 and all(_is_number(x) for x in arg):
        skip, limit = (int(_as_float(x)) for x in arg)
        if limit <= 0:
            raise QueryError(f"$slice limit must be positive (on {path!r})", "BadValue")
        return skip, limit
    raise QueryError("$slice only supports numbers and [skip, limit] arrays", "BadValue")


def _projection_plan(projection: Any) -> _ProjectionPlan:
    if not isinstance(projection, dict):
        raise QueryError(f"a projection must be an object, got {_short(projection)}")
    flags: dict[str, bool] = {}
    slices: list[tuple[tuple[str, ...], int, int | None]] = []
    elem_matches: list[tuple[str, Any]] = []
    for path, flag in projection.items():
        parts = _split_path(path, "projection")
        if isinstance(flag, dict) and len(flag) == 1 and "$slice" in flag:
            slices.append((parts, *_parse_slice(path, flag["$slice"])))
        elif isinstance(flag, dict) and len(flag) == 1 and "$elemMatch" in flag:
            if len(parts) > 1:
                raise QueryError("Cannot use $elemMatch projection on a nested field.", "BadValue")
            elem_matches.append((path, _parse_elem_match(path, flag["$elemMatch"], 0)))
            flags[path] = True  # an $elemMatch projection includes its field
        elif type(flag) not in (bool, int, float):
            raise _unsupported(f"the projection {{{path!r}: {_short(flag)}}}: $meta, literals and expressions")
        else:
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
    paths = [tuple(p.split(".")) for p in flags]
    if inclusive:
        paths += [parts for parts, _, _ in slices]  # a sliced field is kept by an inclusion too
    tree = _path_tree(paths, lambda p: f"projection path collision at {p!r}")
    return _ProjectionPlan(tree, inclusive, tuple(slices), tuple(elem_matches))


def _sliced(value: list[Any], skip: int, limit: int | None) -> list[Any]:
    if limit is None:
        return value[:skip] if skip >= 0 else value[skip:]
    start = skip if skip >= 0 else max(0, len(value) + skip)
    return value[start : start + limit]


def _slice_at(node: Any, parts: tuple[str, ...], skip: int, limit: int | None) -> None:
    """Slice the array at ``parts`` in the projected document (arrays of subdocuments fan out)."""
    if isinstance(node, list):
        for element in node:
            if isinstance(element, dict):
                _slice_at(element, parts, skip, limit)
        return
    if not isinstance(node, dict) or parts[0] not in node:
        return
    if len(parts) == 1:
        if isinstance(node[parts[0]], list):
            node[parts[0]] = _sliced(node[parts[0]], skip, limit)
        return
    _slice_at(node[parts[0]], parts[1:], skip, limit)


def apply_projection(doc: Document, projection: Document | None) -> Document:
    """A new document: ``doc`` projected (None or ``{}``: a copy of all of it).

    Inclusion ``{a: 1, "b.c": 1}`` keeps those paths (and ``_id`` unless ``_id: 0``) in
    the document's field order; exclusion ``{a: 0}`` drops them.  Dotted paths fan out
    over arrays of subdocuments; with inclusion, scalars inside such arrays are dropped.
    ``{a: {$slice: n | [skip, limit]}}`` slices an array (and keeps the field in either mode);
    ``{a: {$elemMatch: ...}}`` keeps only the first element that matches (the field is left out
    when none does).
    """
    if projection is None or projection == {}:
        return copy.deepcopy(doc)
    plan = _projection_plan(projection)
    if not isinstance(doc, dict):
        raise QueryError(f"documents must be objects, got {type(doc).__name__}")
    projected: Document = _include(doc, plan.tree) if plan.inclusive else _exclude(doc, plan.tree)
    for parts, skip, limit in plan.slices:
        _slice_at(projected, parts, skip, limit)
    for name, test in plan.elem_matches:
        hit = [v for v in (doc.get(name),) if isinstance(v, list)]
        first = next((el for el in (hit[0] if hit else ()) if test.element_matches(el)), MISSING)
        if first is MISSING:
            projected.pop(name, None)
        else:
            projected[name] = [copy.deepcopy(first)]
    return projected


# ----------------------------------------------------------------------------- updates

_UPDATE_OPERATORS = (
    "$set",
    "$unset",
    "$inc",
    "$setOnInsert",
    "$mul",
    "$min",
    "$max",
    "$rename",
    "$currentDate",
    "$push",
    "$addToSet",
    "$pop",
    "$pull",
    "$pullAll",
    "$bit",
)
_UNSUPPORTED_UPDATE_OPERATORS: frozenset[str] = frozenset()


def is_update_operator_doc(update: Document | list[Any]) -> bool:
    """True for an operator update (``{"$set": ...}``), False for a replacement document
    (``{}`` included).  As MongoDB, the first field decides: a replacement may not hold a
    top-level ``$`` field (DollarPrefixedFieldName), an operator update's other fields are
    modifiers (an unknown one: FailedToParse, from :func:`check_update`)."""
    if isinstance(update, list):
        return False  # a pipeline-style update: see _run_pipeline
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
    if parts.count("$") > 1:
        raise QueryError(f"Too many positional (i.e. '$') elements found in path '{path}'", "BadValue")
    if parts[0] == "$":
        raise QueryError(
            f"Cannot have positional (i.e. '$') element in the first component in path '{path}'", "BadValue"
        )
    for p in parts:
        if p == "$":
            continue  # the element the query matched (see _positional)
        if p.startswith("$[") and p.endswith("]"):
            if p != "$[]" and not _IDENTIFIER.fullmatch(p[2:-1]):
                raise QueryError(
                    f"The array filter identifier in '{path}' must be an alphanumeric string beginning with a "
                    f"lowercase letter, found '{p[2:-1]}'",
                    "BadValue",
                )
            continue  # $[] / $[<identifier>]: every element, or those the identifier's filter matches
        if p.startswith("$"):
            raise QueryError(
                f"The dollar ($) prefixed field '{p}' in '{path}' is not valid for storage.", "DollarPrefixedFieldName"
            )
    return parts


_IDENTIFIER = re.compile(r"[a-z][a-zA-Z0-9]*")
ArrayFilters = dict[str, "Matcher"]


def _filter_identifiers(flt: Document) -> set[str]:
    ids: set[str] = set()
    for k, v in flt.items():
        if k in ("$and", "$or", "$nor") and isinstance(v, list):
            for sub in v:
                if isinstance(sub, dict):
                    ids |= _filter_identifiers(sub)
        elif isinstance(k, str) and not k.startswith("$"):
            ids.add(k.split(".")[0])
    return ids


def compile_array_filters(filters: Any) -> ArrayFilters:
    """arrayFilters: one filter per identifier, each on fields `<id>` or `<id>.<path>` (an element
    matches when the filter matches the document {<id>: element})."""
    if filters is None:
        return {}
    if not isinstance(filters, list):
        raise QueryError(f"arrayFilters must be an array, not {type_name(filters)}", "TypeMismatch")
    out: ArrayFilters = {}
    for flt in filters:
        if not isinstance(flt, dict):
            raise QueryError(f"arrayFilters entries must be objects, not {type_name(flt)}", "TypeMismatch")
        ids = _filter_identifiers(flt)
        if not ids:
            raise QueryError("Cannot use an expression without a top-level field name in arrayFilters", "FailedToParse")
        if len(ids) > 1:
            a, b = sorted(ids)[:2]
            raise QueryError(
                f"Error parsing array filter :: caused by :: Expected a single top-level field name, found '{a}' "
                f"and '{b}'",
                "FailedToParse",
            )
        ident = ids.pop()
        if not _IDENTIFIER.fullmatch(ident):
            raise QueryError(
                "The top-level field name must be an alphanumeric string beginning with a lowercase letter, "
                f"found '{ident}'",
                "BadValue",
            )
        if ident in out:
            raise QueryError(
                f"Found multiple array filters with the same top-level field name {ident}", "FailedToParse"
            )
        out[ident] = compile_filter(flt)
    return out


def _parse_edits(update: Document, filters: ArrayFilters | None = None) -> list[_Edit]:
    """The edits of an operator update, every one checked: what MongoDB refuses before it
    reads a document is refused here, whether or not anything matches."""
    filters = filters or {}
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
            if op in ("$set", "$setOnInsert") and parts == ("_id",):
                check_id_value(arg, insert=False)
            edits.append((parts, op, _check_argument(op, path, parts, arg)))
    used = {p[2:-1] for parts, _, _ in edits for p in parts if p.startswith("$[") and p != "$[]"}
    for ident in sorted(used - set(filters)):
        path = next(".".join(parts) for parts, _, _ in edits if f"$[{ident}]" in parts)
        raise QueryError(f"No array filter found for identifier '{ident}' in path '{path}'", "BadValue")
    for ident in sorted(set(filters) - used):
        raise QueryError(
            f"The array filter for identifier '{ident}' was not used in the update {_short(update)}", "FailedToParse"
        )
    touched = [parts for parts, _, _ in edits] + [arg for _, op, arg in edits if op == "$rename"]
    conflict = _first_conflict(touched)
    if conflict:
        raise QueryError(
            f"Updating the path '{conflict[1]}' would create a conflict at '{conflict[0]}'",
            "ConflictingUpdateOperators",
        )
    return edits


def _check_argument(op: str, path: str, parts: tuple[str, ...], arg: Any) -> Any:
    """One modifier's argument, checked as MongoDB checks it (the form the apply step takes)."""
    if op == "$inc" and not _is_number(arg):
        raise QueryError(f"Cannot increment with non-numeric argument: {{{path}: {_short(arg)}}}", "TypeMismatch")
    if op == "$mul" and not _is_number(arg):
        raise QueryError(f"Cannot multiply with non-numeric argument: {{{path}: {_short(arg)}}}", "TypeMismatch")
    if op == "$rename":
        if not isinstance(arg, str):
            raise QueryError(f"The 'to' field for $rename must be a string: {path}: {_short(arg)}", "BadValue")
        target = _update_path(op, arg)
        if target == parts:
            raise QueryError(f"The source and target field for $rename must differ: {path}: {_short(arg)}", "BadValue")
        if target[: len(parts)] == parts or parts[: len(target)] == target:
            raise QueryError(
                f"The source and target field for $rename must not be on the same path: {path}: {_short(arg)}",
                "BadValue",
            )
        if any(_is_index(p) or p.startswith("$") for p in (*parts, *target)):
            raise QueryError("The source and target field for $rename cannot be array elements", "BadValue")
        return target
    if op == "$currentDate":
        if arg is True or (isinstance(arg, dict) and arg.get("$type") == "date" and len(arg) == 1):
            return "date"
        if isinstance(arg, dict) and arg.get("$type") == "timestamp" and len(arg) == 1:
            return "timestamp"
        if isinstance(arg, dict) and "$type" in arg and len(arg) == 1:
            raise QueryError("The '$type' string field is required to be 'date' or 'timestamp'", "BadValue")
        raise QueryError(
            f"{_short(arg)} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}}).",
            "BadValue",
        )
    if op == "$pop":
        if not _is_number(arg) or _as_float(arg) not in (1.0, -1.0):
            raise QueryError(f"$pop expects 1 or -1, found: {_short(arg)}", "FailedToParse")
        return int(_as_float(arg))
    if op == "$pullAll" and not isinstance(arg, list):
        raise QueryError(f"$pullAll requires an array argument but was given a {type_name(arg)}", "BadValue")
    if op in ("$push", "$addToSet"):
        return _parse_push(op, arg)
    if op == "$pull":
        return _parse_pull(arg)
    if op == "$bit":
        return _parse_bit(path, arg)
    return arg


@dataclass(frozen=True)
class _PushSpec:
    each: tuple[Any, ...]
    position: int | None = None
    slice: int | None = None
    sort: Any = None  # 1 / -1 (the values themselves) or a sort spec (subdocuments)


_PUSH_MODIFIERS = ("$each", "$slice", "$sort", "$position")


def _whole_number(v: Any, what: str) -> int:
    if not _is_number(v) or not float(_as_float(v)).is_integer():
        raise QueryError(
            f"The value for {what} must be an integer value but was given type: {type_name(v)}", "BadValue"
        )
    return int(_as_float(v))


def _parse_push(op: str, arg: Any) -> _PushSpec:
    """$push / $addToSet's value: one value, or {$each: [...]} with $push's modifiers."""
    if not isinstance(arg, dict) or "$each" not in arg:
        return _PushSpec((arg,))  # one value (a document without $each is a value, as MongoDB's)
    for k in arg:
        if k not in _PUSH_MODIFIERS or (op == "$addToSet" and k != "$each"):
            raise QueryError(f"Unrecognized clause in {op}: {k}", "BadValue")
    each = arg["$each"]
    if not isinstance(each, list):
        raise QueryError(
            f"The argument to $each in {op} must be an array but it was of type: {type_name(each)}", "BadValue"
        )
    position = _whole_number(arg["$position"], "$position") if "$position" in arg else None
    slice_ = _whole_number(arg["$slice"], "$slice") if "$slice" in arg else None
    sort = arg.get("$sort")
    if "$sort" in arg:
        if _is_number(sort) and _as_float(sort) in (1.0, -1.0):
            sort = int(_as_float(sort))
        elif isinstance(sort, dict) and sort:
            _sort_fields(sort)
        else:
            raise QueryError(
                "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields",
                "BadValue",
            )
    return _PushSpec(tuple(each), position, slice_, sort)


@dataclass(frozen=True)
class _PullSpec:
    matcher: Any  # a compiled filter on subdocument elements, or field tests on each element
    tests: tuple[Any, ...] | None


def _parse_pull(arg: Any) -> _PullSpec:
    """$pull's condition: a value (equality), a regular expression, operators on the element,
    or a filter on subdocument elements."""
    if isinstance(arg, Regex):
        return _PullSpec(None, (_make_regex(arg, "", "$pull"),))
    if isinstance(arg, dict) and arg:
        if all(isinstance(k, str) and k.startswith("$") and k not in _FILTER_LEVEL for k in arg):
            return _PullSpec(None, _parse_operators("$pull", arg))
        return _PullSpec(compile_filter(arg), None)
    return _PullSpec(None, (_Cmp("$eq", arg, _encode(arg, "$pull")),))


def _pull_hit(spec: _PullSpec, element: Any) -> bool:
    if spec.tests is not None:
        return all(t.test([(element, encode_value(element))], [element]) for t in spec.tests)
    return isinstance(element, dict) and bool(spec.matcher.matches(element))


def _parse_bit(path: str, arg: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(arg, dict) or not arg:
        raise QueryError(
            f"The $bit modifier is not compatible with a {type_name(arg)}. You must pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}}}",
            "BadValue",
        )
    out = []
    for how, mask in arg.items():
        if how not in ("and", "or", "xor"):
            raise QueryError(
                f"The $bit modifier only supports 'and', 'or', and 'xor', not '{how}' which is an unknown operator: {{{how}: {_short(mask)}}}",
                "BadValue",
            )
        if isinstance(mask, bool) or not isinstance(mask, int):
            raise QueryError(
                f"The $bit modifier field must be an Integer(32/64 bit); a '{type_name(mask)}' is not supported here: {{{how}: {_short(mask)}}}",
                "BadValue",
            )
        out.append((how, mask))
    return tuple(out)


def _pipeline(update: list[Any]) -> list[Any]:
    """A pipeline-style update's stages, parsed: only the stages MongoDB allows in an update."""
    from domain.aggregation import UPDATE_STAGES, PipelineError, parse  # the pipeline's module imports this one

    for raw in update:
        if isinstance(raw, dict) and len(raw) == 1 and (name := next(iter(raw))) not in UPDATE_STAGES:
            raise QueryError(f"{name} is not allowed to be used within an update", "InvalidOptions")
    try:
        return parse(update)
    except PipelineError as e:
        raise _as_query_error(e) from None


def _run_pipeline(doc: Document, update: list[Any]) -> Document:
    """What a pipeline-style update makes of ``doc``: the stages run over it; ``_id`` may not
    change (a result without one keeps the document's)."""
    from domain.aggregation import PipelineError, run

    try:
        (new,) = run(_pipeline(update), [doc])
    except PipelineError as e:
        raise _as_query_error(e) from None
    if "_id" in doc:
        if "_id" not in new:
            new = {"_id": copy.deepcopy(doc["_id"]), **new}
        elif compare_values(new["_id"], doc["_id"]) != 0:
            raise QueryError(
                "Performing an update on the path '_id' would modify the immutable field '_id'", "ImmutableField"
            )
    return new


def check_update(update: Any, array_filters: Any = None) -> None:
    """Refuse a malformed update the way MongoDB does, before (and whatever) it matches: an
    unknown modifier (FailedToParse), an operator shardlog does not have, a bad path, a
    conflict, a non-numeric $inc, a replacement with a top-level $ field or an invalid _id, a
    pipeline with a stage an update may not hold."""
    filters = compile_array_filters(array_filters)
    if filters and (isinstance(update, list) or not is_update_operator_doc(update)):
        raise QueryError("arrayFilters may only be specified with an update operator document", "FailedToParse")
    if isinstance(update, list):
        _pipeline(update)
    elif is_update_operator_doc(update):
        _parse_edits(update, filters)
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


def _add(current: Any, by: Any, path: str, op: str = "$inc") -> Any:
    """``current + by`` (``*`` for $mul) with MongoDB's type widening (SafeNum)."""
    if isinstance(current, Decimal128) or isinstance(by, Decimal128):

        def as_decimal(v: Any) -> Any:
            if isinstance(v, Decimal128):
                return v.to_decimal()
            if isinstance(v, float):
                return _double_to_decimal(v)
            return _DECIMAL128.create_decimal(int(v))

        combine = _DECIMAL128.multiply if op == "$mul" else _DECIMAL128.add
        return Decimal128(combine(as_decimal(current), as_decimal(by)))
    if isinstance(current, float) or isinstance(by, float):
        return float(current) * float(by) if op == "$mul" else float(current) + float(by)
    result = int(current) * int(by) if op == "$mul" else int(current) + int(by)
    if not INT64_MIN <= result <= INT64_MAX:
        raise QueryError(
            f"Failed to apply {op} operations to current value ({_short(current)}) for document "
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


def _mul(doc: Document, parts: tuple[str, ...], by: Any) -> None:
    parent = _parent_for_write(doc, parts)
    name = parts[-1]
    current = _child(parent, name)
    if current is MISSING:  # MongoDB: a zero of the multiplier's type
        zero: Any = Decimal128("0") if isinstance(by, Decimal128) else (0.0 if isinstance(by, float) else by * 0)
        _put(parent, name, Int64(0) if isinstance(by, Int64) else zero, ".".join(parts[:-1]))
        return
    if not _is_number(current):
        raise QueryError(
            f"Cannot apply $mul to a value of non-numeric type. {{_id: {_short(doc.get('_id'))}}} has the field "
            f"'{name}' of non-numeric type {type_name(current)}",
            "TypeMismatch",
        )
    _put(parent, name, _add(current, by, ".".join(parts), "$mul"), ".".join(parts[:-1]))


def _extreme(keep_smaller: bool) -> Callable[[Document, tuple[str, ...], Any], None]:
    def apply(doc: Document, parts: tuple[str, ...], value: Any) -> None:
        parent = _parent_for_write(doc, parts)
        current = _child(parent, parts[-1])
        c = None if current is MISSING else compare_values(value, current)
        if c is None or (c < 0 if keep_smaller else c > 0):
            _put(parent, parts[-1], copy.deepcopy(value), ".".join(parts[:-1]))

    return apply


def _rename(doc: Document, parts: tuple[str, ...], target: tuple[str, ...]) -> None:
    holder = _value_at(doc, parts[:-1])
    if not isinstance(holder, dict) or parts[-1] not in holder:
        return  # nothing to rename
    if isinstance(_value_at(doc, target[:-1]), list):
        raise QueryError("The destination field for $rename may not be on a path that contains an array", "BadValue")
    value = holder.pop(parts[-1])
    _put(_parent_for_write(doc, target), target[-1], value, ".".join(target[:-1]))


def _now() -> datetime:
    """Now, as a BSON date holds it (milliseconds, UTC, naive as the drivers decode it)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _current_date(doc: Document, parts: tuple[str, ...], kind: str) -> None:
    now = _now()
    value = Timestamp(int(now.timestamp()), 1) if kind == "timestamp" else now
    _put(_parent_for_write(doc, parts), parts[-1], value, ".".join(parts[:-1]))


def _array_at(doc: Document, parts: tuple[str, ...], op: str, create: bool) -> list[Any] | None:
    """The array an array operator edits (created empty when missing and `create`), None
    when missing; a value that is not an array is refused as MongoDB refuses it."""
    parent = _parent_for_write(doc, parts) if create else _value_at(doc, parts[:-1])
    current = _child(parent, parts[-1]) if isinstance(parent, (dict, list)) else MISSING
    if current is MISSING:
        if not create:
            return None
        current = []
        _put(parent, parts[-1], current, ".".join(parts[:-1]))
    elif not isinstance(current, list):
        raise QueryError(
            f"The field '{'.'.join(parts)}' must be an array but is of type {type_name(current)} in document "
            f"{{_id: {_short(doc.get('_id'))}}}",
            "BadValue",
        )
    else:
        current = list(current)  # edited in place below: never the stored document's list
        _put(parent, parts[-1], current, ".".join(parts[:-1]))
    return current


def _push(doc: Document, parts: tuple[str, ...], spec: _PushSpec) -> None:
    arr = _array_at(doc, parts, "$push", create=True)
    assert arr is not None
    values = [copy.deepcopy(v) for v in spec.each]
    if spec.position is None:
        arr.extend(values)
    else:
        at = spec.position if spec.position >= 0 else max(0, len(arr) + spec.position)
        arr[at:at] = values
    if spec.sort is not None:
        if isinstance(spec.sort, int):
            key = sort_key({"v": spec.sort})
            arr.sort(key=lambda v: key({"v": v}))
        else:
            key = sort_key(spec.sort)
            arr.sort(key=lambda v: key(v if isinstance(v, dict) else {}))
    if spec.slice is not None:
        arr[:] = (
            arr[: spec.slice] if spec.slice >= 0 else arr[len(arr) + spec.slice :] if -spec.slice < len(arr) else arr
        )


def _add_to_set(doc: Document, parts: tuple[str, ...], spec: _PushSpec) -> None:
    arr = _array_at(doc, parts, "$addToSet", create=True)
    assert arr is not None
    present = {encode_value(v) for v in arr}
    for v in spec.each:
        enc = encode_value(v)
        if enc not in present:
            present.add(enc)
            arr.append(copy.deepcopy(v))


def _pop(doc: Document, parts: tuple[str, ...], end: int) -> None:
    arr = _array_at(doc, parts, "$pop", create=False)
    if arr:
        arr.pop(-1 if end == 1 else 0)


def _pull(doc: Document, parts: tuple[str, ...], spec: _PullSpec) -> None:
    arr = _array_at(doc, parts, "$pull", create=False)
    if arr is not None:
        arr[:] = [v for v in arr if not _pull_hit(spec, v)]


def _pull_all(doc: Document, parts: tuple[str, ...], values: list[Any]) -> None:
    arr = _array_at(doc, parts, "$pullAll", create=False)
    if arr is not None:
        gone = {encode_value(v) for v in values}
        arr[:] = [v for v in arr if encode_value(v) not in gone]


def _bit(doc: Document, parts: tuple[str, ...], ops: tuple[tuple[str, int], ...]) -> None:
    parent = _parent_for_write(doc, parts)
    current = _child(parent, parts[-1])
    value = 0 if current is MISSING else current
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(
            f"Cannot apply $bit to a value of non-integral type.{{_id: {_short(doc.get('_id'))}}} has the field "
            f"{parts[-1]} of non-integer type {type_name(value)}",
            "BadValue",
        )
    long = _is_long(value) or any(_is_long(m) for _, m in ops)
    n = int(value)
    for how, mask in ops:
        n = n & mask if how == "and" else n | mask if how == "or" else n ^ mask
    n = (n + 2**63) % 2**64 - 2**63 if long else (n + 2**31) % 2**32 - 2**31
    _put(parent, parts[-1], Int64(n) if long else n, ".".join(parts[:-1]))


_APPLY: dict[str, Callable[[Document, tuple[str, ...], Any], None]] = {
    "$set": _set,
    "$setOnInsert": _set,
    "$unset": _unset,
    "$inc": _inc,
    "$mul": _mul,
    "$min": _extreme(keep_smaller=True),
    "$max": _extreme(keep_smaller=False),
    "$rename": _rename,
    "$currentDate": _current_date,
    "$push": _push,
    "$addToSet": _add_to_set,
    "$pop": _pop,
    "$pull": _pull,
    "$pullAll": _pull_all,
    "$bit": _bit,
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


_NO_POSITIONAL_MATCH = "The positional operator did not find the match needed from the query."


def _with_value(doc: Any, parts: tuple[str, ...], value: Any) -> Any:
    """``doc`` with the value at ``parts`` (objects only) replaced: the objects on the way copied."""
    if not parts:
        return value
    return {**doc, parts[0]: _with_value(doc[parts[0]], parts[1:], value)}


def _positional(doc: Document, query: Matcher | None, raw: tuple[str, ...]) -> tuple[str, ...]:
    """The path with its `$` replaced by the position of the array element the query matched
    (MongoDB's positional operator).  The query's conditions on the array (top level and inside
    `$and`) each name their first matching element; when they name different ones MongoDB's
    choice depends on the order it evaluates them in, so that is refused rather than guessed."""
    at = raw.index("$")
    array_parts = raw[:at]
    prefix = ".".join(array_parts)
    arr = get_path(doc, prefix)
    conditions = [
        f
        for f in _conjuncts(query._root if query is not None else _Logic("$and", ()))
        if isinstance(f, _Field) and (f.path == prefix or f.path.startswith(prefix + "."))
    ]
    if not isinstance(arr, list) or not conditions:
        raise QueryError(_NO_POSITIONAL_MATCH, "BadValue")
    firsts = set()
    for f in conditions:
        first = next((i for i, el in enumerate(arr) if f.matches(_with_value(doc, array_parts, [el]))), None)
        if first is None:
            raise QueryError(_NO_POSITIONAL_MATCH, "BadValue")
        firsts.add(first)
    if len(firsts) > 1:
        raise _unsupported(
            f"the positional $ in '{'.'.join(raw)}' when the query's conditions on '{prefix}' match different elements"
        )
    return (*array_parts, str(firsts.pop()), *raw[at + 1 :])


def _conjuncts(node: Any) -> list[Any]:
    if isinstance(node, _Logic) and node.op == "$and":
        return [x for c in node.children for x in _conjuncts(c)]
    return [node]


def _expand(doc: Document, parts: tuple[str, ...], filters: ArrayFilters) -> list[tuple[str, ...]]:
    """The concrete paths of a path with `$[]` / `$[<identifier>]`: one per element it names."""
    out: list[tuple[str, ...]] = [()]
    for p in parts:
        if not (p.startswith("$[") and p.endswith("]")):
            out = [prefix + (p,) for prefix in out]
            continue
        ident = p[2:-1]
        expanded = []
        for prefix in out:
            arr = _value_at(doc, prefix)
            if arr is MISSING:
                raise QueryError(
                    f"The path '{'.'.join(prefix)}' must exist in the document in order to apply array updates.",
                    "BadValue",
                )
            if not isinstance(arr, list):
                raise QueryError(
                    f"Cannot apply array updates to non-array element {prefix[-1]}: {_short(arr)}", "BadValue"
                )
            expanded += [
                (*prefix, str(i)) for i, el in enumerate(arr) if not ident or filters[ident].matches({ident: el})
            ]
        out = expanded
    return out


def _apply_edits(
    base: Document,
    update: Document,
    is_upsert_insert: bool,
    *,
    copy_on_write: bool,
    filters: ArrayFilters | None = None,
    match_filter: Document | None = None,
) -> tuple[Document, list[tuple[str, ...]]]:
    """The operator update applied, and the paths it edited.  ``copy_on_write``: the result
    shares every object it does not edit with ``base`` (which neither may be mutated after)."""
    filters = filters or {}
    edits = _parse_edits(update, filters)
    copied: set[int] = set()
    result = dict(base) if copy_on_write else copy.deepcopy(base)
    applied: list[tuple[str, ...]] = []
    query: Matcher | None = None
    for raw, op, arg in sorted(edits, key=lambda e: _path_order(e[0])):  # MongoDB 5.0+: path order
        if op == "$setOnInsert" and not is_upsert_insert:
            continue
        if "$" in raw:  # the element the query matched, in the document as it was
            if query is None and match_filter is not None and not is_upsert_insert:
                query = compile_filter(match_filter)
            raw = _positional(base, query, raw)
        for parts in _expand(result, raw, filters) if any(p.startswith("$[") for p in raw) else [raw]:
            if copy_on_write:
                _copy_parents(result, parts, copied)
                if op == "$rename":
                    _copy_parents(result, arg, copied)
            _APPLY[op](result, parts, arg)
            applied.append(parts)
            if op == "$rename":
                applied.append(arg)
    if "_id" in base and ("_id" not in result or compare_values(result["_id"], base["_id"]) != 0):
        raise QueryError(
            "Performing an update on the path '_id' would modify the immutable field '_id'", "ImmutableField"
        )
    return result, applied


def update_stored(
    doc: Document, update: Document | list[Any], array_filters: Any = None, match_filter: Document | None = None
) -> Document | None:
    """What ``update`` turns a stored document into, or None when it changes nothing (MongoDB's
    equality of BSON values: true is not 1).  As :func:`apply_update`, inputs never mutated, but
    an operator update copies only the objects it edits and compares only the values it wrote:
    the rest of the new document is the stored one's (neither may be mutated afterwards)."""
    if not isinstance(doc, dict):
        raise QueryError(f"documents must be objects, got {type(doc).__name__}")
    if isinstance(update, list):
        new = _run_pipeline(doc, update)
        return None if encode_value(new) == encode_value(doc) else new
    if not is_update_operator_doc(update):
        new = _replace(doc, update)
        return None if encode_value(new) == encode_value(doc) else new
    new, paths = _apply_edits(
        doc,
        update,
        False,
        copy_on_write=True,
        filters=compile_array_filters(array_filters),
        match_filter=match_filter,  # the query: what a positional $ names
    )
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


Update = Document | list[Any]  # operators or a replacement, or a pipeline of stages


def apply_update(
    doc: Document,
    update: Update,
    *,
    is_upsert_insert: bool = False,
    query: Document | None = None,
    array_filters: Any = None,
    match_filter: Document | None = None,
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
    operators = isinstance(update, list) or is_update_operator_doc(update)  # a pipeline seeds as operators do
    base = doc
    if is_upsert_insert and query is not None:
        seed = _upsert_seed(query)
        if not operators:
            seed = {"_id": seed["_id"]} if "_id" in seed else {}
        base = {**seed, **{k: v for k, v in doc.items() if k not in seed}}
    if isinstance(update, list):
        result = _run_pipeline(base, update)
    else:
        filters = compile_array_filters(array_filters)
        result = (
            _apply_edits(
                base, update, is_upsert_insert, copy_on_write=False, filters=filters, match_filter=match_filter
            )[0]
            if operators
            else _replace(base, update)
        )
    return _id_first(result) if is_upsert_insert else result


def upsert_document(query: Document, update: Update, array_filters: Any = None) -> Document:
    """The document an upsert inserts when ``query`` matches nothing: the query's
    equality fields (top level and inside ``$and``, dotted paths expanded) with the
    operator update applied (``$setOnInsert`` included), or for a replacement the
    replacement plus the query's ``_id`` if it pins one.  The caller adds an ``_id``
    if the result has none."""
    return apply_update({}, update, is_upsert_insert=True, query=query, array_filters=array_filters)
