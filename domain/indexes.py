"""Secondary indexes: what one is (`IndexSpec`, parsed and checked as MongoDB checks a
createIndexes spec) and the entries it holds for a document (`index_keys`, `entry_key`).

Shared by the config server (the catalog's list of a collection's indexes, the DDL that creates
and drops them), the shards (entries kept in the same write batch as the documents, builds,
unique checks), the routers and the CLI (createIndexes / listIndexes / dropIndexes) and the
query planner (domain/planner.py: bounds are ranges of `entry_key` prefixes).

**Keys, as MongoDB generates them.**  For each indexed path the values found along it, fanning
out over arrays of subdocuments on the way (domain/query.py's path rule); a leaf array gives one
key per element (an empty array is indexed as itself, `[]`, where MongoDB uses `undefined`: both
sort apart from null and are matched by no scalar predicate); a missing path gives null.  A
compound index takes the product; two array paths in one document are CannotIndexParallelArrays
(171).  A sparse index skips a document that has none of its paths; a partial index one that its
`partialFilterExpression` does not match.  An index into which some document put more than one
key is multikey: the planner then neither intersects bounds from two predicates on one path nor
sorts or covers with it (as MongoDB).

**Entries, as bytes.**  `entry_key(spec, key, _id)` is each value's order-preserving, prefix-free
encoding (domain.shardkey.encode_value) in index order, every byte complemented for a descending
(-1) field, then the `_id`'s encoding: entries sort in the index's order, and a range of keys is a
range of bytes.  Because the encoding is prefix-free, complementing it reverses the order of a
field without touching the fields after it.  A unique index checks `key_prefix(spec, key)` (the
entry without `_id`): another `_id` under the same prefix is a DuplicateKey (11000).

Unique indexes of a sharded collection must have the shard key as a prefix (seed 003, MongoDB's
`CannotCreateIndex`), because each shard checks only its own documents.
"""

from __future__ import annotations

import datetime
import itertools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.datetime_ms import DatetimeMS

from domain.bsonvalues import to_record
from domain.protocol import ErrorCode
from domain.query import MISSING, QueryError, compile_filter
from domain.shardkey import MAX_KEY, MIN_KEY, ShardKeyError, encode_value, shell_form
from libs.errors import CommandError

MAX_INDEXES = 64  # per collection, the _id index included (MongoDB's limit)
MAX_INDEX_FIELDS = 32  # MongoDB's compound index limit
ID_INDEX_NAME = "_id_"

_COMPLEMENT = bytes(range(255, -1, -1))
# The options of a createIndexes spec (issue 38 §1, never silently wrong): each one MongoDB
# defines is honoured, or refused with NotImplemented (238) naming it unless its value is the
# one that changes nothing; a field MongoDB does not define is InvalidIndexSpecificationOption.
# Honoured: key, name, unique, sparse, partialFilterExpression, v (2; 1 is refused: its looser
# key rules are not shardlog's), background (a no-op since MongoDB 4.2, as here), ns (checked
# against the collection by domain/sharding_commands.create_indexes).
_ACCEPTED = {"key", "name", "unique", "sparse", "partialFilterExpression", "v", "background", "ns"}


def _simple_collation(value: Any) -> bool:
    """`{locale: "simple"}`: binary comparison, what an index without a collation does."""
    return isinstance(value, dict) and value.get("locale") == "simple" and len(value) == 1


def _false(value: Any) -> bool:
    return value is False or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


# option -> (what shardlog lacks, the value that changes nothing or None)
_NOT_SUPPORTED: dict[str, tuple[str, Any]] = {
    "expireAfterSeconds": ("TTL indexes (documents would never expire)", None),
    "collation": ("collations other than {locale: 'simple'}", _simple_collation),
    "hidden": ("hidden indexes (the planner would still use it)", _false),
    "wildcardProjection": ("wildcard indexes", None),
    "weights": ("text indexes", None),
    "default_language": ("text indexes", None),
    "language_override": ("text indexes", None),
    "textIndexVersion": ("text indexes", None),
    "2dsphereIndexVersion": ("geospatial indexes", None),
    "bits": ("geospatial indexes", None),
    "min": ("geospatial indexes", None),
    "max": ("geospatial indexes", None),
    "bucketSize": ("geoHaystack indexes", None),
    "storageEngine": ("storage engine options", lambda v: v == {}),
    "clustered": ("clustered indexes", _false),
    "prepareUnique": ("prepareUnique", _false),
}
# The options MongoDB defines for an index spec: what `ignoreUnknownIndexOptions` keeps.
KNOWN_OPTIONS = frozenset(_ACCEPTED | set(_NOT_SUPPORTED))
_NAME_TYPES = {"text": "text", "2d": "2d", "2dsphere": "2dsphere", "hashed": "hashed", "geoHaystack": "geoHaystack"}


def _fail(code: ErrorCode, message: str) -> CommandError:
    return CommandError(code, message)


@dataclass(frozen=True)
class IndexSpec:
    """One index of a collection.  `key`: (path, 1 | -1) in index order."""

    name: str
    key: tuple[tuple[str, int], ...]
    unique: bool = False
    sparse: bool = False
    partial: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    _partial_canon: str | None = field(default=None, repr=False)

    # ------------------------------------------------------------- parse, print

    @classmethod
    def parse(cls, spec: Any) -> IndexSpec:
        """A createIndexes `indexes` element (`{"key": {...}, "name": ..., "unique": ...}`),
        checked as MongoDB checks it; CommandError with MongoDB's code otherwise."""
        if not isinstance(spec, dict):
            raise _fail(ErrorCode.TypeMismatch, f"an index specification must be an object, got {shell_form(spec)}")
        for option in spec:
            if option in _NOT_SUPPORTED:
                what, neutral = _NOT_SUPPORTED[option]
                if neutral is not None and neutral(spec[option]):
                    continue  # the value that changes nothing: as if it were not given
                raise _fail(
                    ErrorCode.NotImplemented,
                    f"index option {option!r} = {shell_form(spec[option])}: {what} is not supported by shardlog",
                )
            if option not in _ACCEPTED:
                raise _fail(
                    ErrorCode.InvalidIndexSpecificationOption,
                    f"The field '{option}' is not valid for an index specification. Specification: {shell_form(spec)}",
                )
        if "key" not in spec:
            raise _fail(
                ErrorCode.FailedToParse,
                f"The 'key' field is a required property of an index specification: {shell_form(spec)}",
            )
        key = parse_key(spec["key"])
        name = spec.get("name", default_name(key))
        if not isinstance(name, str):
            raise _fail(ErrorCode.TypeMismatch, f"The field 'name' must be a string, got {shell_form(name)}")
        if not name:
            raise _fail(ErrorCode.CannotCreateIndex, "index name cannot be empty")
        if name == "*":
            raise _fail(ErrorCode.BadValue, "The index name '*' is not valid")
        if "\x00" in name:
            raise _fail(ErrorCode.CannotCreateIndex, "index name cannot contain NUL bytes")
        flags = {}
        for option in ("unique", "sparse", "background"):
            if option in spec and not isinstance(spec[option], (bool, int, float)):
                raise _fail(
                    ErrorCode.TypeMismatch, f"The field '{option}' must be a boolean, got {shell_form(spec[option])}"
                )
            flags[option] = bool(spec.get(option, False))
        if "v" in spec and spec["v"] == 1 and not isinstance(spec["v"], bool):
            raise _fail(
                ErrorCode.NotImplemented,
                "index option 'v' = 1: version 1 indexes are not supported by shardlog (use 2)",
            )
        if "v" in spec and (isinstance(spec["v"], bool) or spec["v"] != 2):
            raise _fail(ErrorCode.CannotCreateIndex, f"index version {shell_form(spec['v'])} is not supported (use 2)")
        partial = spec.get("partialFilterExpression")
        if partial is not None:
            if not isinstance(partial, dict):
                raise _fail(ErrorCode.TypeMismatch, "partialFilterExpression must be an object")
            if flags["sparse"]:
                raise _fail(ErrorCode.CannotCreateIndex, 'cannot mix "partialFilterExpression" and "sparse" options')
            try:
                compile_filter(partial)
            except QueryError as e:
                raise _fail(ErrorCode.CannotCreateIndex, f"invalid partialFilterExpression: {e}") from None
        if name == ID_INDEX_NAME and key != (("_id", 1),):
            raise _fail(ErrorCode.BadValue, "The index name '_id_' is reserved for the _id index")
        if key == (("_id", 1),) and (flags["sparse"] or partial is not None):
            raise _fail(ErrorCode.CannotCreateIndex, "The _id index cannot be sparse or partial")
        return cls.make(name, key, unique=flags["unique"], sparse=flags["sparse"], partial=partial)

    @classmethod
    def make(
        cls,
        name: str,
        key: tuple[tuple[str, int], ...],
        *,
        unique: bool = False,
        sparse: bool = False,
        partial: Mapping[str, Any] | None = None,
    ) -> IndexSpec:
        canon = None if partial is None else repr(encode_value(dict(partial)))
        return cls(name, tuple(key), unique, sparse, partial, canon)

    def to_mongo(self) -> dict[str, Any]:
        """As listIndexes shows it: `{"v": 2, "key": {...}, "name": ..., "unique": true, ...}`."""
        out: dict[str, Any] = {"v": 2, "key": dict(self.key), "name": self.name}
        if self.unique and self.name != ID_INDEX_NAME:
            out["unique"] = True
        if self.sparse:
            out["sparse"] = True
        if self.partial is not None:
            out["partialFilterExpression"] = dict(self.partial)
        return out

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.key)

    def same_options(self, other: IndexSpec) -> bool:
        """The same index but for its name (what MongoDB calls an equivalent index)."""
        return (self.key, self.unique, self.sparse, self._partial_canon) == (
            other.key,
            other.unique,
            other.sparse,
            other._partial_canon,
        )


ID_INDEX = IndexSpec.make(ID_INDEX_NAME, (("_id", 1),))


def parse_key(key: Any) -> tuple[tuple[str, int], ...]:
    """An index key pattern (`{"a": 1, "b.c": -1}`): ascending or descending fields only."""
    if not isinstance(key, dict):
        raise _fail(ErrorCode.TypeMismatch, f"The field 'key' must be an object, got {shell_form(key)}")
    if not key:
        raise _fail(ErrorCode.CannotCreateIndex, "Index keys cannot be empty.")
    if len(key) > MAX_INDEX_FIELDS:
        raise _fail(ErrorCode.CannotCreateIndex, f"Index key pattern has more than {MAX_INDEX_FIELDS} fields")
    out: list[tuple[str, int]] = []
    for path, direction in key.items():
        _check_key_path(path)
        if isinstance(direction, str):
            kind = _NAME_TYPES.get(direction)
            what = f"{kind} indexes" if kind else f"index type {direction!r}"
            raise _fail(
                ErrorCode.CannotCreateIndex, f"{what} are not supported by shardlog (ascending 1 or descending -1)"
            )
        if isinstance(direction, bool) or not isinstance(direction, (int, float)) or direction != direction:
            raise _fail(
                ErrorCode.CannotCreateIndex,
                f"Values in the index key pattern must be numbers, got {shell_form(direction)} for {path!r}",
            )
        if direction == 0:
            raise _fail(
                ErrorCode.CannotCreateIndex, f"Values in v:2 index key pattern cannot be of value 0 (field {path!r})"
            )
        out.append((path, 1 if direction > 0 else -1))
    return tuple(out)


def _check_key_path(path: Any) -> None:
    """MongoDB's field-name checks of a key pattern (index_key_validate.cpp), with its messages
    and code CannotCreateIndex: no empty path or component (`a..b`, `.a`, `a.`), no component
    starting with `$` (`$a`, `a.$b`).  MongoDB lets a DBRef's `$ref` / `$id` / `$db` through
    after the first component; shardlog refuses them too, as its key generation does not look
    inside a DBRef."""
    if not isinstance(path, str) or not path:
        raise _fail(ErrorCode.CannotCreateIndex, "Index keys cannot be an empty field.")
    if path == "_fts":
        raise _fail(ErrorCode.CannotCreateIndex, "Index key contains an illegal field name: '_fts'")
    for part in path.split("."):
        if not part:
            raise _fail(ErrorCode.CannotCreateIndex, "Index keys cannot contain an empty field.")
        if part.startswith("$"):
            raise _fail(
                ErrorCode.CannotCreateIndex, "Index key contains an illegal field name: field name starts with '$'."
            )


def default_name(key: tuple[tuple[str, int], ...]) -> str:
    """MongoDB's generated name: `a_1_b.c_-1`."""
    return "_".join(f"{path}_{direction}" for path, direction in key)


def check_unique_with_shard_key(spec: IndexSpec, shard_key: Mapping[str, Any] | None) -> None:
    """A unique index of a sharded collection must start with the shard key's fields
    (seed 003); the _id index is exempt.  Unsharded collections (None) may have any."""
    if not spec.unique or shard_key is None or spec.name == ID_INDEX_NAME:
        return
    fields = list(shard_key)
    hashed = any(v == "hashed" for v in shard_key.values())
    if hashed or list(spec.paths[: len(fields)]) != fields:
        raise _fail(
            ErrorCode.CannotCreateIndex,
            f"cannot create unique index over {shell_form(dict(spec.key))} with shard key pattern {shell_form(dict(shard_key))}",
        )


def check_new(existing: list[IndexSpec], new: IndexSpec) -> bool:
    """True when `new` is already there (createIndexes answers ok, "all indexes already exist");
    False when it may be created; else MongoDB's conflict: the same name for another key
    (IndexKeySpecsConflict) or other options (IndexOptionsConflict), the same index under another
    name (IndexOptionsConflict), too many indexes (CannotCreateIndex).  Indexes on one key pattern
    may coexist when their options (unique, sparse, partialFilterExpression: MongoDB's index
    signature) differ."""
    for index in existing:
        if index.name == new.name:
            if index.same_options(new):
                return True
            if index.key != new.key:
                raise _fail(
                    ErrorCode.IndexKeySpecsConflict,
                    "An existing index has the same name as the requested index. When index names are not "
                    "specified, they are auto generated and can cause conflicts. Please refer to our "
                    f"documentation. Requested index: {shell_form(new.to_mongo())}, existing index: "
                    f"{shell_form(index.to_mongo())}",
                )
            raise _fail(
                ErrorCode.IndexOptionsConflict, f"Index with name: {index.name} already exists with different options"
            )
        if index.same_options(new):
            raise _fail(ErrorCode.IndexOptionsConflict, f"Index already exists with a different name: {index.name}")
    if len(existing) >= MAX_INDEXES:
        raise _fail(ErrorCode.CannotCreateIndex, f"add index fails, too many indexes (at most {MAX_INDEXES})")
    return False


# ------------------------------------------------------------------ keys of a document


def _is_position(part: str) -> bool:
    return part.isascii() and part.isdigit() and str(int(part)) == part


def _values_at(value: Any, parts: list[str], i: int, out: list[Any], arrays: list[int]) -> None:
    """The values at parts[i:] under `value` (MongoDB's key generation for one path): arrays of
    subdocuments are fanned out, a leaf array gives each element; `arrays` counts fan-outs."""
    if i == len(parts):
        if isinstance(value, list):
            arrays.append(1)
            out.extend(value if value else [[]])
        else:
            out.append(value)
        return
    part = parts[i]
    if isinstance(value, dict):
        if part in value:
            _values_at(value[part], parts, i + 1, out, arrays)
        return
    if isinstance(value, list):
        if _is_position(part) and int(part) < len(value):
            _values_at(value[int(part)], parts, i + 1, out, arrays)
            return
        arrays.append(1)
        for element in value:  # subdocuments only: not scalars, not nested arrays
            if isinstance(element, dict):
                _values_at(element, parts, i, out, arrays)


def path_values(doc: Mapping[str, Any], path: str) -> tuple[list[Any], bool]:
    """(the distinct index values at `path`, whether an array was met): missing -> [MISSING]."""
    out: list[Any] = []
    arrays: list[int] = []
    _values_at(doc, path.split("."), 0, out, arrays)
    if not out:
        return [MISSING], bool(arrays)
    seen: dict[bytes, Any] = {}
    for v in out:
        seen.setdefault(encode_value(v), v)
    return list(seen.values()), bool(arrays)


def index_keys(spec: IndexSpec, doc: Mapping[str, Any]) -> tuple[list[tuple[Any, ...]], bool]:
    """The keys `doc` puts into `spec` (values in index order, missing as None), and whether
    it made the index multikey.  [] for a sparse index the document has none of the paths of,
    or a partial index whose filter it does not match.  CommandError
    CannotIndexParallelArrays when two paths hold arrays; ShardKeyError (from the encoding) for
    a value nested too deep."""
    if spec.partial is not None and not compile_filter(dict(spec.partial)).matches(dict(doc)):
        return [], False
    per_path: list[list[Any]] = []
    array_paths: list[str] = []
    for path in spec.paths:
        values, through_array = path_values(doc, path)
        if through_array:
            array_paths.append(path)
        per_path.append(values)
    if len(array_paths) > 1:
        raise _fail(
            ErrorCode.CannotIndexParallelArrays,
            f"cannot index parallel arrays [{array_paths[1]}] [{array_paths[0]}]",
        )
    if spec.sparse and all(v == [MISSING] for v in per_path):
        return [], False
    keys = [tuple(None if v is MISSING else v for v in combo) for combo in itertools.product(*per_path)]
    return keys, bool(array_paths)


# ------------------------------------------------------------------ entries as bytes


def encode_field(value: Any, direction: int) -> bytes:
    """One field of an entry: the value's encoding, complemented when descending."""
    raw = encode_value(value)
    return raw if direction > 0 else raw.translate(_COMPLEMENT)


def key_prefix(spec: IndexSpec, key: tuple[Any, ...]) -> bytes:
    """An entry without its `_id`: what a unique index must hold once."""
    return b"".join(encode_field(v, d) for v, (_, d) in zip(key, spec.key, strict=True))


def entry_key(spec: IndexSpec, key: tuple[Any, ...], _id: Any) -> bytes:
    """An entry: the key's fields in index order (descending ones complemented), then `_id`."""
    return key_prefix(spec, key) + encode_value(_id)


def entries(spec: IndexSpec, doc: Mapping[str, Any]) -> tuple[dict[bytes, tuple[Any, ...]], bool]:
    """entry bytes -> key values for every key of `doc`, and whether it is multikey."""
    keys, multikey = index_keys(spec, doc)
    _id = doc.get("_id")
    return {entry_key(spec, k, _id): k for k in keys}, multikey


# A regex's flags as the server stores them (letters in this order).
_REGEX_FLAGS = (
    (re.IGNORECASE, "i"),
    (re.LOCALE, "l"),
    (re.MULTILINE, "m"),
    (re.DOTALL, "s"),
    (re.UNICODE, "u"),
    (re.VERBOSE, "x"),
)


def _server_double(x: float) -> str:
    """A double as the server prints one (StringBuilder::appendDoubleNice): `%.16g`, then `.0`
    when that has no `.`, `E` or `N` (so 2.0 -> `2.0`, 1e+20 -> `1e+20.0`)."""
    text = "%.16g" % x  # noqa: UP031 -- C's printf format, as the server's snprintf
    return text if any(c in text for c in ".EN") else text + ".0"


def server_form(value: Any) -> str:
    """A value as mongod's BSONElement::toString writes it in an errmsg (the `dup key` of a
    DuplicateKey): `{ a: 1, b.c: "x" }`, field names bare, strings in double quotes unescaped
    (cut to 150 bytes and `..."` past 159), `ObjectId('...')`, a double always with a point,
    a long as a plain number, `new Date(<ms>)`, `Timestamp(s, i)`, `/re/flags`,
    `BinData(<subtype>, <HEX>)` or `UUID("...")`.  Not mongosh's form (domain.shardkey.shell_form:
    single quotes, `Long('5')`, `ISODate(...)`)."""
    v = value
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if v is MIN_KEY or isinstance(v, bson.MinKey):
        return "MinKey"
    if v is MAX_KEY or isinstance(v, bson.MaxKey):
        return "MaxKey"
    if isinstance(v, int):  # bson.Int64 too
        return str(int(v))
    if isinstance(v, float):
        return _server_double(v)
    if isinstance(v, bson.Decimal128):
        return str(v)
    if isinstance(v, bson.Code):  # before str: Code is a str subclass
        if v.scope is not None:
            return f"CodeWScope( {v}, {server_form(dict(v.scope))})"
        return str(v) if len(v.encode()) <= 80 else v.encode()[:70].decode(errors="ignore") + "..."
    if isinstance(v, str):
        raw = v.encode()
        return f'"{v}"' if len(raw) <= 159 else '"' + raw[:150].decode(errors="ignore") + '..."'
    if isinstance(v, bson.DBRef):
        v = v.as_doc()
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k}: {server_form(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, (list, tuple)):
        return "[ " + ", ".join(server_form(x) for x in v) + " ]" if v else "[]"
    if isinstance(v, bson.ObjectId):
        return f"ObjectId('{v}')"
    if isinstance(v, (datetime.datetime, DatetimeMS)):
        return f"new Date({int(DatetimeMS(v)) if isinstance(v, datetime.datetime) else int(v)})"
    if isinstance(v, bson.Timestamp):
        return f"Timestamp({v.time}, {v.inc})"
    if isinstance(v, (bson.Regex, re.Pattern)):
        flags = v.flags if isinstance(v.flags, int) else 0
        return f"/{v.pattern}/" + "".join(letter for flag, letter in _REGEX_FLAGS if flags & flag)
    if isinstance(v, uuid.UUID):
        return f'UUID("{v}")'
    if isinstance(v, bson.Binary):
        if v.subtype == bson.binary.UUID_SUBTYPE and len(v) == 16:
            return f'UUID("{uuid.UUID(bytes=bytes(v))}")'
        data = bytes(v)
        return (
            f"BinData({v.subtype}, {data[:70].hex().upper()}...)"
            if len(data) > 80
            else f"BinData({v.subtype}, {data.hex().upper()})"
        )
    return shell_form(v)


def duplicate_key_message(ns: str, spec: IndexSpec, key: tuple[Any, ...]) -> str:
    """MongoDB's errmsg of a DuplicateKey: `E11000 duplicate key error collection: db.c index:
    email_1 dup key: { email: "a@x" }`, the key as the server prints a document (`server_form`)."""
    dup = server_form(dict(zip(spec.paths, key, strict=True)))
    return f"E11000 duplicate key error collection: {ns} index: {spec.name} dup key: {dup}"


def duplicate_key_info(spec: IndexSpec, key: tuple[Any, ...]) -> dict[str, Any]:
    """The `keyPattern` and `keyValue` a DuplicateKey error carries (pymongo shows them)."""
    return {"keyPattern": dict(spec.key), "keyValue": to_record(dict(zip(spec.paths, key, strict=True)))}


def duplicate_key_error(ns: str, spec: IndexSpec, key: tuple[Any, ...]) -> CommandError:
    return CommandError(ErrorCode.DuplicateKey, duplicate_key_message(ns, spec, key), duplicate_key_info(spec, key))


__all__ = [
    "ID_INDEX",
    "ID_INDEX_NAME",
    "MAX_INDEXES",
    "IndexSpec",
    "ShardKeyError",
    "check_new",
    "check_unique_with_shard_key",
    "default_name",
    "duplicate_key_error",
    "duplicate_key_info",
    "duplicate_key_message",
    "encode_field",
    "entries",
    "entry_key",
    "index_keys",
    "key_prefix",
    "parse_key",
    "path_values",
    "server_form",
]
