"""Aggregation pipelines with MongoDB semantics, and their split between the shards and the
router as mongos splits them.  Pure: no I/O.

:func:`parse` validates a pipeline (MongoDB's error codes and messages, raised as
:class:`PipelineError`), :func:`run` runs parsed stages over an iterable of documents,
:func:`split` cuts a pipeline into what the shards can answer as one `find` (a
:class:`ShardPart`: filter, sort, skip, limit, projection) and what the router runs over the
merged stream (a :class:`MergePart`).

Supported
---------
Stages: ``$match`` (domain.query filters), ``$project`` (inclusion, exclusion, computed
fields), ``$addFields`` / ``$set``, ``$unset``, ``$sort``, ``$limit``, ``$skip``, ``$count``,
``$unwind`` (string or ``{path, includeArrayIndex, preserveNullAndEmptyArrays}``), ``$group``
(``_id`` any expression; ``$sum $avg $min $max $first $last $push $addToSet $count``).

Expressions: field paths ``"$a.b"`` (fanning out over arrays, as MongoDB's), ``$$ROOT`` /
``$$CURRENT``, literals, ``$literal``, object and array literals, and ``$add $subtract
$multiply $divide $concat $toUpper $toLower $cond $ifNull $eq $ne $gt $gte $lt $lte $cmp
$and $or $not $size $arrayElemAt``.  Any other ``$name`` is refused with MongoDB's
InvalidPipelineOperator (168) "Unrecognized expression"; a MongoDB stage not listed above
with Location40324 (what a MongoDB server lacking that stage answers), so a client that
falls back on 40324 falls back here too.

Comparisons use domain.shardkey's BSON order; in expressions a missing value sorts below
null (``{$eq: ["$nofield", null]}`` is false), as in MongoDB.  ``$sort`` and the sort of the
shards' find share ``domain.query.sort_key`` (and its documented deviations for arrays).
``$group`` emits groups in the order their first document arrived; ``$addToSet`` keeps
first-seen order (MongoDB leaves both unspecified).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from domain.bsonvalues import type_name as bson_type_name
from domain.protocol import ErrorCode
from domain.query import MISSING, QueryError, apply_projection, compile_filter, get_path, sort_key
from domain.shardkey import INT64_MAX, INT64_MIN, ShardKeyError, encode_value

Document = dict[str, Any]
Expr = Callable[[Document], Any]  # evaluates against the current document; MISSING if absent

__all__ = [
    "MergePart",
    "PipelineError",
    "ShardPart",
    "Stage",
    "parse",
    "run",
    "split",
]

MAX_PIPELINE_LENGTH = 1000  # MongoDB's internalPipelineLengthLimit


class PipelineError(ValueError):
    """A pipeline MongoDB would refuse (or that fails while running): MongoDB's code number
    and name (``Location<n>`` for the numbered assertions that have no name) and message."""

    def __init__(self, code: int, message: str, code_name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.code_name = code_name or f"Location{code}"
        self.message = message


# MongoDB's named codes used here (src/mongo/base/error_codes.yml).
BAD_VALUE = (2, "BadValue")
FAILED_TO_PARSE = (9, "FailedToParse")
TYPE_MISMATCH = (14, "TypeMismatch")
INVALID_PIPELINE_OPERATOR = (168, "InvalidPipelineOperator")


def _fail(code: int | tuple[int, str], message: str) -> PipelineError:
    if isinstance(code, tuple):
        return PipelineError(code[0], message, code[1])
    return PipelineError(code, message)


# ------------------------------------------------------------------------------ values


def type_name(v: Any) -> str:
    """MongoDB's name of a value's BSON type, for error messages ("missing" for no value)."""
    return "missing" if v is MISSING else bson_type_name(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nullish(v: Any) -> bool:
    return v is None or v is MISSING


def _truthy(v: Any) -> bool:
    """MongoDB's coercion to bool: false, null, missing and zero are false; all else true."""
    if _nullish(v) or v is False:
        return False
    if _is_number(v):
        return bool(v) and not (isinstance(v, float) and math.isnan(v))
    return True


truthy = _truthy  # what $expr in a find filter counts as a match (domain/query.py)


def _key(v: Any) -> bytes:
    """The comparison key of a value: BSON order, missing below everything (even MinKey)."""
    if v is MISSING:
        return b""
    try:
        return encode_value(v)
    except ShardKeyError as e:
        raise _fail(BAD_VALUE, str(e)) from None


def _compare(a: Any, b: Any) -> int:
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


def _number(v: int | float) -> int | float:
    """An integer result past int64 becomes a double, as MongoDB's overflowing long does."""
    if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:
        return float(v)
    return v


def _walk(value: Any, parts: Sequence[str]) -> Any:
    """A field path's value: MongoDB's expression semantics, fanning out over arrays (an
    array yields the array of its subdocuments' values, missing ones left out)."""
    for i, part in enumerate(parts):
        if isinstance(value, dict):
            value = value.get(part, MISSING)
        elif isinstance(value, list):
            rest = parts[i:]
            out = [_walk(x, rest) for x in value if isinstance(x, (dict, list))]
            return [x for x in out if x is not MISSING]
        else:
            return MISSING
    return value


def _check_field_path(path: str) -> tuple[str, ...]:
    """A field path without its leading '$'; MongoDB's FieldPath errors."""
    if path == "":
        raise _fail(40352, "FieldPath cannot be constructed with empty string")
    parts = tuple(path.split("."))
    for p in parts:
        if p == "":
            raise _fail(15998, "FieldPath field names may not be empty strings.")
        if p.startswith("$"):
            raise _fail(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
    return parts


def _field_name(name: Any, where: str) -> tuple[str, ...]:
    """A field name on the left of a stage's spec (dotted: a nested path)."""
    if not isinstance(name, str) or name == "":
        raise _fail(40352, "FieldPath cannot be constructed with empty string")
    if name.startswith("$"):
        raise _fail(
            16410, f"FieldPath field names may not start with '$'. Consider using $getField or $setField. ({where})"
        )
    return _check_field_path(name)


def _set_path(doc: Document, parts: Sequence[str], value: Any) -> None:
    """Set a (dotted) field as $addFields does: an array along the way gets the field in each
    subdocument element; any other non-object along the way is replaced by an object."""
    head, rest = parts[0], parts[1:]
    if not rest:
        if value is MISSING:
            doc.pop(head, None)
        else:
            doc[head] = value
        return
    cur = doc.get(head, MISSING)
    if isinstance(cur, list):
        for x in cur:
            if isinstance(x, dict):
                _set_path(x, rest, value)
        return
    if not isinstance(cur, dict):
        if value is MISSING:
            return
        cur = doc[head] = {}
    _set_path(cur, rest, value)


# -------------------------------------------------------------------------- expressions


def _args(op: str, arg: Any) -> list[Any]:
    return list(arg) if isinstance(arg, list) else [arg]


def _arity(op: str, args: list[Any], n: int) -> None:
    if len(args) != n:
        raise _fail(16020, f"Expression {op} takes exactly {n} arguments. {len(args)} were passed in.")


def _arith_add(vals: list[Any]) -> Any:
    total: int | float = 0
    for v in vals:
        if _nullish(v):
            return None
        if not _is_number(v):
            raise _fail(16554, f"$add only supports numeric or date types, not {type_name(v)}")
        total += v
    return _number(total)


def _arith_multiply(vals: list[Any]) -> Any:
    product: int | float = 1
    for v in vals:
        if _nullish(v):
            return None
        if not _is_number(v):
            raise _fail(16555, f"$multiply only supports numeric types, not {type_name(v)}")
        product *= v
    return _number(product)


def _subtract(a: Any, b: Any) -> Any:
    if _nullish(a) or _nullish(b):
        return None
    if not (_is_number(a) and _is_number(b)):
        raise _fail(16556, f"cant $subtract a {type_name(b)} from a {type_name(a)}")
    return _number(a - b)


def _divide(a: Any, b: Any) -> Any:
    if _nullish(a) or _nullish(b):
        return None
    if not (_is_number(a) and _is_number(b)):
        raise _fail(16609, f"$divide only supports numeric types, not {type_name(a)} and {type_name(b)}")
    if b == 0:
        raise _fail(16608, "can't $divide by zero")
    return float(a) / float(b)


def _concat(vals: list[Any]) -> Any:
    out = []
    for v in vals:
        if _nullish(v):
            return None
        if not isinstance(v, str):
            raise _fail(16702, f"$concat only supports strings, not {type_name(v)}")
        out.append(v)
    return "".join(out)


def _to_string(op: str, v: Any) -> str:
    if _nullish(v):
        return ""
    if isinstance(v, str):
        return v
    if _is_number(v):
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return repr(v) if isinstance(v, float) else str(v)
    raise _fail(16007, f"can't convert from BSON type {type_name(v)} to String")


def _size(v: Any) -> Any:
    if not isinstance(v, list):
        raise _fail(17124, f"The argument to $size must be an array. Type of argument is {type_name(v)}")
    return len(v)


def _array_elem_at(arr: Any, idx: Any) -> Any:
    if _nullish(arr) or _nullish(idx):
        return None
    if not isinstance(arr, list):
        raise _fail(28689, f"$arrayElemAt's first argument must be an array, but is {type_name(arr)}")
    if not _is_number(idx):
        raise _fail(28690, f"$arrayElemAt's second argument must be a numeric value, but is {type_name(idx)}")
    if isinstance(idx, float) and not idx.is_integer() or not -(2**31) <= idx < 2**31:
        raise _fail(28691, f"$arrayElemAt's second argument must be representable as a 32-bit integer: {idx}")
    i = int(idx)
    if i >= len(arr) or i < -len(arr):
        return MISSING
    return arr[i]


_COMPARISONS: dict[str, Callable[[int], Any]] = {
    "$eq": lambda c: c == 0,
    "$ne": lambda c: c != 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
    "$cmp": lambda c: c,
}

EXPRESSION_OPERATORS = frozenset(
    {
        "$literal",
        "$add",
        "$subtract",
        "$multiply",
        "$divide",
        "$concat",
        "$toUpper",
        "$toLower",
        "$cond",
        "$ifNull",
        "$and",
        "$or",
        "$not",
        "$size",
        "$arrayElemAt",
        *_COMPARISONS,
    }
)


def _const(v: Any) -> Expr:
    return lambda doc: v


def compile_expression(spec: Any) -> Expr:
    """An aggregation expression as a function of the current document."""
    if isinstance(spec, str):
        if spec.startswith("$$"):
            return _variable(spec[2:])
        if spec.startswith("$"):
            parts = _check_field_path(spec[1:])
            return lambda doc: _walk(doc, parts)
        return _const(spec)
    if isinstance(spec, list):
        items = [compile_expression(x) for x in spec]
        return lambda doc: [None if (v := e(doc)) is MISSING else v for e in items]
    if isinstance(spec, dict):
        if spec and next(iter(spec)).startswith("$"):
            if len(spec) != 1:
                raise _fail(
                    15983,
                    "an expression specification must contain exactly one field, the name of the "
                    f"expression. Found {len(spec)} fields in {_short(spec)}",
                )
            ((op, arg),) = spec.items()
            return _operator(op, arg)
        fields = []
        for name, sub in spec.items():
            if not isinstance(name, str) or name == "":
                raise _fail(16412, "FieldPath field names may not be empty strings.")
            if name.startswith("$"):
                raise _fail(16404, f"FieldPath field names may not start with '$'. Got: {name}")
            if "." in name:
                raise _fail(16412, f"FieldPath field names may not contain '.'. Got: {name}")
            fields.append((name, compile_expression(sub)))

        def obj(doc: Document) -> Any:
            out = {}
            for name, e in fields:
                v = e(doc)
                if v is not MISSING:
                    out[name] = v
            return out

        return obj
    return _const(copy.deepcopy(spec))


def _variable(name: str) -> Expr:
    base, _, rest = name.partition(".")
    if base not in ("ROOT", "CURRENT"):
        raise _fail(17276, f"Use of undefined variable: {base}")
    if not rest:
        return lambda doc: doc
    parts = _check_field_path(rest)
    return lambda doc: _walk(doc, parts)


def _operator(op: str, arg: Any) -> Expr:
    if op not in EXPRESSION_OPERATORS:
        raise _fail(INVALID_PIPELINE_OPERATOR, f"Unrecognized expression '{op}'")
    if op == "$literal":
        return _const(copy.deepcopy(arg))
    if op == "$cond":
        return _cond(arg)
    args = [compile_expression(a) for a in _args(op, arg)]

    def vals(doc: Document) -> list[Any]:
        return [a(doc) for a in args]

    if op == "$add":
        return lambda doc: _arith_add(vals(doc))
    if op == "$multiply":
        return lambda doc: _arith_multiply(vals(doc))
    if op == "$concat":
        return lambda doc: _concat(vals(doc))
    if op == "$and":
        return lambda doc: all(_truthy(a(doc)) for a in args)
    if op == "$or":
        return lambda doc: any(_truthy(a(doc)) for a in args)
    if op == "$ifNull":
        if len(args) < 2:
            raise _fail(1257300, f"$ifNull needs at least two arguments, had: {len(args)}")

        def if_null(doc: Document) -> Any:
            for a in args[:-1]:
                v = a(doc)
                if not _nullish(v):
                    return v
            return args[-1](doc)

        return if_null
    if op in ("$not", "$toUpper", "$toLower", "$size"):
        _arity(op, args, 1)
        (one,) = args
        if op == "$not":
            return lambda doc: not _truthy(one(doc))
        if op == "$size":
            return lambda doc: _size(one(doc))
        if op == "$toUpper":
            return lambda doc: _to_string(op, one(doc)).upper()
        return lambda doc: _to_string(op, one(doc)).lower()
    _arity(op, args, 2)
    a, b = args
    if op == "$subtract":
        return lambda doc: _subtract(a(doc), b(doc))
    if op == "$divide":
        return lambda doc: _divide(a(doc), b(doc))
    if op == "$arrayElemAt":
        return lambda doc: _array_elem_at(a(doc), b(doc))
    test = _COMPARISONS[op]
    return lambda doc: test(_compare(a(doc), b(doc)))


def _cond(arg: Any) -> Expr:
    if isinstance(arg, dict):
        for k in arg:
            if k not in ("if", "then", "else"):
                raise _fail(17083, f"Unrecognized parameter to $cond: {k}")
        for k, code in (("if", 17080), ("then", 17081), ("else", 17082)):
            if k not in arg:
                raise _fail(code, f"Missing '{k}' parameter to $cond")
        parts = [arg["if"], arg["then"], arg["else"]]
    else:
        parts = _args("$cond", arg)
        _arity("$cond", parts, 3)
    cond, then, other = (compile_expression(p) for p in parts)
    return lambda doc: then(doc) if _truthy(cond(doc)) else other(doc)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------ accumulators


class _Acc:
    """One group's state of one accumulator."""

    def add(self, v: Any) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        raise NotImplementedError


class _Sum(_Acc):
    def __init__(self) -> None:
        self.total: int | float = 0

    def add(self, v: Any) -> None:
        if _is_number(v):  # non-numbers are ignored, as MongoDB's $sum does
            self.total += v

    def result(self) -> Any:
        return _number(self.total)


class _Avg(_Acc):
    def __init__(self) -> None:
        self.total: float = 0.0
        self.n = 0

    def add(self, v: Any) -> None:
        if _is_number(v):
            self.total += v
            self.n += 1

    def result(self) -> Any:
        return self.total / self.n if self.n else None


class _Extreme(_Acc):
    def __init__(self, sign: int) -> None:
        self.sign = sign
        self.best: Any = MISSING

    def add(self, v: Any) -> None:
        if _nullish(v):
            return  # $min / $max ignore null and missing
        if self.best is MISSING or _compare(v, self.best) * self.sign > 0:
            self.best = v

    def result(self) -> Any:
        return None if self.best is MISSING else self.best


class _First(_Acc):
    def __init__(self) -> None:
        self.value: Any = MISSING
        self.seen = False

    def add(self, v: Any) -> None:
        if not self.seen:
            self.value, self.seen = v, True

    def result(self) -> Any:
        return None if self.value is MISSING else self.value


class _Last(_First):
    def add(self, v: Any) -> None:
        self.value, self.seen = v, True


class _Push(_Acc):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def add(self, v: Any) -> None:
        if v is not MISSING:
            self.items.append(v)

    def result(self) -> Any:
        return self.items


class _AddToSet(_Push):
    def __init__(self) -> None:
        super().__init__()
        self.keys: set[bytes] = set()

    def add(self, v: Any) -> None:
        if v is not MISSING:
            k = _key(v)
            if k not in self.keys:
                self.keys.add(k)
                self.items.append(v)


class _Count(_Sum):
    def add(self, v: Any) -> None:
        self.total += 1


ACCUMULATORS: dict[str, Callable[[], _Acc]] = {
    "$sum": _Sum,
    "$avg": _Avg,
    "$min": lambda: _Extreme(-1),
    "$max": lambda: _Extreme(1),
    "$first": _First,
    "$last": _Last,
    "$push": _Push,
    "$addToSet": _AddToSet,
    "$count": _Count,
}


# ------------------------------------------------------------------------------ stages


Runner = Callable[[Iterable[Document]], Iterator[Document]]


@dataclass(frozen=True)
class Stage:
    """One parsed stage: its name, its spec as sent, and how to run it."""

    name: str
    spec: Any
    run: Runner = field(compare=False, repr=False)

    def as_doc(self) -> Document:
        return {self.name: self.spec}


# Stages MongoDB has and shardlog does not: refused with the code of a server lacking them.
KNOWN_UNSUPPORTED = frozenset(
    {
        "$out",
        "$merge",
        "$lookup",
        "$graphLookup",
        "$unionWith",
        "$facet",
        "$bucket",
        "$bucketAuto",
        "$sortByCount",
        "$sample",
        "$geoNear",
        "$redact",
        "$densify",
        "$fill",
        "$setWindowFields",
        "$collStats",
        "$indexStats",
        "$currentOp",
        "$listSessions",
        "$listLocalSessions",
        "$planCacheStats",
        "$changeStream",
        "$documents",
        "$search",
        "$searchMeta",
        "$vectorSearch",
        "$shardedDataDistribution",
    }
)


def parse(pipeline: Any) -> list[Stage]:
    """Validate a pipeline; :class:`PipelineError` with MongoDB's code for the first fault."""
    if not isinstance(pipeline, list):
        raise _fail(TYPE_MISMATCH, "'pipeline' option must be specified as an array")
    if len(pipeline) > MAX_PIPELINE_LENGTH:
        raise _fail(FAILED_TO_PARSE, f"Pipeline length must be no longer than {MAX_PIPELINE_LENGTH} stages.")
    stages = []
    for raw in pipeline:
        if not isinstance(raw, dict):
            raise _fail(TYPE_MISMATCH, "Each element of the 'pipeline' array must be an object")
        if len(raw) != 1:
            raise _fail(40323, "A pipeline stage specification object must contain exactly one field.")
        ((name, spec),) = raw.items()
        parser = _STAGES.get(name)
        if parser is None:
            if name in KNOWN_UNSUPPORTED:
                raise _fail(40324, f"Unrecognized pipeline stage name: '{name}' (not supported by shardlog)")
            raise _fail(40324, f"Unrecognized pipeline stage name: '{name}'")
        stages.append(Stage(name, spec, parser(spec)))
    return stages


def run(stages: Iterable[Stage], docs: Iterable[Document]) -> list[Document]:
    """The pipeline's output over `docs` (which are not modified)."""
    stream: Iterable[Document] = docs
    for st in stages:
        stream = st.run(stream)
    try:
        return list(stream)
    except (QueryError, ShardKeyError) as e:  # a value the query engine cannot compare
        raise _fail(BAD_VALUE, str(e)) from None


def _match(spec: Any) -> Runner:
    if not isinstance(spec, dict):
        raise _fail(15959, "the match filter must be an expression in an object")
    try:
        matcher = compile_filter(spec)
    except QueryError as e:
        raise _query_error(e) from None
    return lambda docs: (d for d in docs if matcher.matches(d))


def _query_error(e: QueryError) -> PipelineError:
    """A filter's refusal with the query language's code (its number where MongoDB has one)."""
    if e.code.startswith("Location") and e.code[8:].isdigit():
        return _fail(int(e.code[8:]), str(e))
    try:
        number = ErrorCode(e.code).number
    except ValueError:
        number = None
    return _fail((number, e.code) if number is not None else BAD_VALUE, str(e))


def _limit(spec: Any) -> Runner:
    n = _whole(spec, "$limit", 5107201)
    if n == 0:
        raise _fail(15958, "the limit must be positive")
    return lambda docs: itertools.islice(docs, n)


def _skip(spec: Any) -> Runner:
    n = _whole(spec, "$skip", 5107200)
    return lambda docs: itertools.islice(docs, n, None)


def _whole(spec: Any, stage: str, code: int) -> int:
    if not _is_number(spec):
        raise _fail(code, f"invalid argument to {stage} stage: Expected a number in: {stage}: {_short(spec)}")
    if isinstance(spec, float) and not spec.is_integer():
        raise _fail(code, f"invalid argument to {stage} stage: Expected an integer: {stage}: {spec}")
    if spec < 0:
        raise _fail(code, f"invalid argument to {stage} stage: Expected a non-negative number in: {stage}: {spec}")
    if spec > INT64_MAX:
        raise _fail(code, f"invalid argument to {stage} stage: Cannot represent as a 64-bit integer: {stage}: {spec}")
    return int(spec)


def _sort(spec: Any) -> Runner:
    if not isinstance(spec, dict):
        raise _fail(15973, "the $sort key specification must be an object")
    if not spec:
        raise _fail(15976, "$sort stage must have at least one sort key")
    for path, direction in spec.items():
        _field_name(path, "$sort")
        if not _is_number(direction) or direction not in (1, -1):
            raise _fail(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")
    key = sort_key(spec)
    return lambda docs: iter(sorted(docs, key=key))


def _count(spec: Any) -> Runner:
    if not isinstance(spec, str):
        raise _fail(40156, "the count field must be a non-empty string")
    if not spec:
        raise _fail(40157, "the count field must be a non-empty string")
    if spec.startswith("$"):
        raise _fail(40158, "the count field cannot be a $-prefixed path")
    if "." in spec:
        raise _fail(40160, "the count field cannot contain '.'")

    def count(docs: Iterable[Document]) -> Iterator[Document]:
        n = sum(1 for _ in docs)
        if n:  # no input, no output document, as in MongoDB
            yield {spec: n}

    return count


def _unwind(spec: Any) -> Runner:
    index_field: str | None = None
    preserve = False
    if isinstance(spec, str):
        path = spec
    elif isinstance(spec, dict):
        if "path" not in spec:
            raise _fail(28812, "no path specified to $unwind stage")
        path = spec["path"]
        if not isinstance(path, str):
            raise _fail(28808, "expected a string as the path for $unwind stage, got " + type_name(path))
        for k, v in spec.items():
            if k == "path":
                continue
            if k == "preserveNullAndEmptyArrays":
                if not isinstance(v, bool):
                    raise _fail(
                        28809,
                        "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got "
                        + type_name(v),
                    )
                preserve = v
            elif k == "includeArrayIndex":
                if not isinstance(v, str):
                    raise _fail(
                        28810,
                        "expected a non-empty string for the includeArrayIndex option to $unwind stage, got "
                        + type_name(v),
                    )
                if not v:
                    raise _fail(28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage")
                if v.startswith("$"):
                    raise _fail(
                        28822, f"includeArrayIndex option to $unwind stage should not be prefixed with a '$': {v}"
                    )
                index_field = v
            else:
                raise _fail(28811, f"unrecognized option to $unwind stage: {k}")
    else:
        raise _fail(
            15981, f"expected either a string or an object as specification for $unwind stage, got {type_name(spec)}"
        )
    if not path.startswith("$"):
        raise _fail(28818, f"path option to $unwind stage should be prefixed with a '$': {path}")
    parts = _check_field_path(path[1:])
    index_parts = _check_field_path(index_field) if index_field is not None else None

    def out(doc: Document, value: Any, index: Any) -> Document:
        d = copy.deepcopy(doc)
        _set_path(d, parts, value)
        if index_parts is not None:
            _set_path(d, index_parts, index)
        return d

    def unwind(docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            v = get_path(doc, ".".join(parts))
            if isinstance(v, list):
                if v:
                    for i, x in enumerate(v):
                        yield out(doc, x, i)
                elif preserve:
                    yield out(doc, MISSING, None)
            elif _nullish(v):
                if preserve:
                    yield out(doc, v, None)
            else:
                yield out(doc, v, None)

    return unwind


def _group(spec: Any) -> Runner:
    if not isinstance(spec, dict):
        raise _fail(15947, "a group's fields must be specified in an object")
    if "_id" not in spec:
        raise _fail(15955, "a group specification must include an _id")
    id_expr = compile_expression(spec["_id"])
    accs: list[tuple[str, Callable[[], _Acc], Expr]] = []
    for name, acc in spec.items():
        if name == "_id":
            continue
        if name.startswith("$"):
            raise _fail(40236, f"The field name '{name}' cannot be an operator name")
        if "." in name:
            raise _fail(40235, f"The field name '{name}' cannot contain '.'")
        if not isinstance(acc, dict):
            raise _fail(40234, f"The field '{name}' must be an accumulator object")
        if len(acc) != 1:
            raise _fail(40238, f"The field '{name}' must specify one accumulator")
        ((op, arg),) = acc.items()
        make = ACCUMULATORS.get(op)
        if make is None:
            raise _fail(15952, f"unknown group operator '{op}'")
        if isinstance(arg, list) and op != "$count":
            raise _fail(40237, f"The {op} accumulator is a unary operator")
        if op == "$count" and arg != {}:
            raise _fail(FAILED_TO_PARSE, "$count takes no arguments, i.e. $count:{}")
        accs.append((name, make, compile_expression(arg)))

    def group(docs: Iterable[Document]) -> Iterator[Document]:
        groups: dict[bytes, tuple[Any, list[_Acc]]] = {}
        for doc in docs:
            gid = id_expr(doc)
            gid = None if gid is MISSING else gid
            k = _key(gid)
            entry = groups.get(k)
            if entry is None:
                entry = groups[k] = (gid, [make() for _, make, _ in accs])
            for (_, _, expr), state in zip(accs, entry[1]):
                state.add(expr(doc))
        for gid, states in groups.values():
            out: Document = {"_id": gid}
            for (name, _, _), state in zip(accs, states):
                out[name] = state.result()
            yield out

    return group


@dataclass(frozen=True)
class _Projection:
    """A parsed $project: plain inclusion/exclusion flags and computed fields (dotted paths)."""

    flags: dict[str, bool]
    computed: list[tuple[tuple[str, ...], Expr]]

    def plain(self) -> Document | None:
        """The projection as a find projection, if it has no computed fields."""
        if self.computed:
            return None
        return {k: 1 if v else 0 for k, v in self.flags.items()}


def _flatten(spec: Document, prefix: str, out: list[tuple[str, Any]], stage: str) -> None:
    for name, value in spec.items():
        if not isinstance(name, str) or name == "":
            raise _fail(40352, "FieldPath cannot be constructed with empty string")
        if name.startswith("$"):
            raise _fail(
                16410, f"Invalid {stage} :: caused by :: FieldPath field names may not start with '$'. Got: {name}"
            )
        path = f"{prefix}.{name}" if prefix else name
        _check_field_path(path)
        if isinstance(value, dict) and value and not next(iter(value)).startswith("$"):
            _flatten(value, path, out, stage)
        else:
            out.append((path, value))


def _parse_projection(spec: Any) -> _Projection:
    if not isinstance(spec, dict):
        raise _fail(15969, "$project specification must be an object")
    if not spec:
        raise _fail(51272, "Invalid $project :: caused by :: projection specification must have at least one field")
    fields: list[tuple[str, Any]] = []
    _flatten(spec, "", fields, "$project")
    flags: dict[str, bool] = {}
    computed: list[tuple[tuple[str, ...], Expr]] = []
    for path, value in fields:
        if isinstance(value, bool) or _is_number(value):
            flags[path] = bool(value)
        else:
            try:
                computed.append((tuple(path.split(".")), compile_expression(value)))
            except PipelineError as e:
                raise PipelineError(e.code, f"Invalid $project :: caused by :: {e.message}", e.code_name) from None
    included = [p for p, v in flags.items() if v and p != "_id"]
    excluded = [p for p, v in flags.items() if not v and p != "_id"]
    if excluded and (included or computed):
        raise _fail(
            31254,
            f"Invalid $project :: caused by :: Cannot do exclusion on field {excluded[0]} in inclusion projection",
        )
    paths = [p for p, _ in fields]
    _check_collisions(paths)
    return _Projection(flags, computed)


def _check_collisions(paths: list[str]) -> None:
    seen: set[str] = set()
    for p in sorted(paths):
        parts = p.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in seen:
                raise _fail(31250, f"Invalid $project :: caused by :: Path collision at {p}")
        seen.add(p)


def _project(spec: Any) -> Runner:
    proj = _parse_projection(spec)
    plain = {k: (1 if v else 0) for k, v in proj.flags.items()}
    if not proj.computed:
        return lambda docs: (apply_projection(d, plain) for d in docs)
    # Inclusion with computed fields: included fields in the document's order (and _id
    # unless excluded), then the computed ones in the spec's order.
    keep = {k: 1 for k, v in plain.items() if v and k != "_id"}
    with_id = bool(plain.get("_id", 1))

    def project(docs: Iterable[Document]) -> Iterator[Document]:
        for d in docs:
            out = apply_projection(d, {**keep, "_id": 1 if with_id else 0}) if keep else {}
            if not keep and with_id and "_id" in d:
                out["_id"] = copy.deepcopy(d["_id"])
            for parts, e in proj.computed:
                _set_path(out, parts, e(d))
            yield out

    return project


def _add_fields(spec: Any, stage: str = "$addFields") -> Runner:
    if not isinstance(spec, dict):
        raise _fail(40272, f"{stage} specification stage must be an object, got {type_name(spec)}")
    fields: list[tuple[str, Any]] = []
    _flatten(spec, "", fields, stage)
    _check_collisions([p for p, _ in fields])
    computed = [(tuple(p.split(".")), compile_expression(v)) for p, v in fields]

    def add(docs: Iterable[Document]) -> Iterator[Document]:
        for d in docs:
            out = copy.deepcopy(d)
            for parts, e in computed:
                _set_path(out, parts, e(d))
            yield out

    return add


def _unset(spec: Any) -> Runner:
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list):
        raise _fail(31002, "$unset specification must be a string or an array")
    if not names:
        raise _fail(31119, "$unset specification must be a string or an array with at least one field")
    for n in names:
        if not isinstance(n, str):
            raise _fail(31120, "$unset specification must be a string or an array containing only string values")
        _field_name(n, "$unset")
    _check_collisions(names)
    excl = {n: 0 for n in names}
    return lambda docs: (apply_projection(d, excl) for d in docs)


def _replace_root(spec: Any, stage: str = "$replaceRoot") -> Runner:
    """$replaceRoot {newRoot: <expression>} / $replaceWith <expression>: the expression's value,
    which must be a document, is the whole document."""
    if stage == "$replaceRoot":
        if not isinstance(spec, dict):
            raise _fail(40228, f"expected an object as specification for $replaceRoot stage, got {type_name(spec)}")
        if set(spec) != {"newRoot"}:
            unknown = next((k for k in spec if k != "newRoot"), None)
            if unknown is not None:
                raise _fail(40415, f"BSON field '$replaceRoot.{unknown}' is an unknown field.")
            raise _fail(40414, "BSON field '$replaceRoot.newRoot' is missing but a required field")
        spec = spec["newRoot"]
    expr = compile_expression(spec)

    def replace(docs: Iterable[Document]) -> Iterator[Document]:
        for d in docs:
            new = expr(d)
            if not isinstance(new, dict):
                raise _fail(
                    40228,
                    f"'newRoot' expression must evaluate to an object, but resulting value was: "
                    f"{_short(None if new is MISSING else new)}. Type of resulting value: "
                    f"'{'missing' if new is MISSING else type_name(new)}'.",
                )
            yield copy.deepcopy(new)

    return replace


# The stages a pipeline-style update may hold (MongoDB's): each maps one document to one.
UPDATE_STAGES = frozenset({"$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"})


_STAGES: dict[str, Callable[[Any], Runner]] = {
    "$match": _match,
    "$project": _project,
    "$addFields": _add_fields,
    "$set": lambda spec: _add_fields(spec, "$set"),
    "$unset": _unset,
    "$replaceRoot": _replace_root,
    "$replaceWith": lambda spec: _replace_root(spec, "$replaceWith"),
    "$sort": _sort,
    "$limit": _limit,
    "$skip": _skip,
    "$count": _count,
    "$unwind": _unwind,
    "$group": _group,
}


# ------------------------------------------------------------------------------- split


@dataclass(frozen=True)
class ShardPart:
    """What the shards answer, as one find: filter, then sort, skip, limit, projection."""

    filter: Document
    sort: Document | None = None
    skip: int = 0
    limit: int = 0  # 0: none
    projection: Document | None = None

    def as_pipeline(self) -> list[Document]:
        """The same as pipeline stages (explain's shardsPart)."""
        out: list[Document] = [{"$match": self.filter}] if self.filter else []
        if self.sort is not None:
            out.append({"$sort": self.sort})
        if self.skip:
            out.append({"$skip": self.skip})
        if self.limit:
            out.append({"$limit": self.limit})
        if self.projection is not None:
            out.append({"$project": self.projection})
        return out


@dataclass(frozen=True)
class MergePart:
    """What the router runs over the shards' merged stream."""

    stages: list[Stage]

    def run(self, docs: Iterable[Document]) -> list[Document]:
        return run(self.stages, docs)

    def as_pipeline(self) -> list[Document]:
        return [st.as_doc() for st in self.stages]


def split(stages: Sequence[Stage]) -> tuple[ShardPart, MergePart]:
    """Cut a parsed pipeline as mongos does: the leading $match stages become the find's
    filter ($and of them); then, in find's own order, a $sort, a $skip, a $limit and a
    plain inclusion/exclusion $project, each only if it comes next.  The rest runs on the
    router.  Find's skip and limit apply after its sort, so a $limit before a $skip is not
    pushed down, nor anything past it."""
    i = 0
    filters: list[Document] = []
    while i < len(stages) and stages[i].name == "$match":
        filters.append(stages[i].spec)
        i += 1
    flt: Document = {} if not filters else filters[0] if len(filters) == 1 else {"$and": filters}
    sort: Document | None = None
    skip = limit = 0
    projection: Document | None = None
    if i < len(stages) and stages[i].name == "$sort":
        sort = stages[i].spec
        i += 1
    if i < len(stages) and stages[i].name == "$skip":
        skip = _whole(stages[i].spec, "$skip", 5107200)
        i += 1
    if i < len(stages) and stages[i].name == "$limit":
        limit = _whole(stages[i].spec, "$limit", 5107201)
        i += 1
    if i < len(stages) and stages[i].name == "$project":
        plain = _parse_projection(stages[i].spec).plain()
        if plain is not None:
            projection = plain
            i += 1
    return ShardPart(flt, sort, skip, limit, projection), MergePart(list(stages[i:]))
