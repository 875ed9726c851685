"""The record form of documents: BSON values in memory, relaxed Extended JSON in records
(docs/decisions/0016).  Here, at the bottom layer, so that record shapes can use it;
``domain.bsonvalues`` is what the domain and services import.

In memory a document is a dict of Python values of pymongo's ``bson`` package, as
``bson.decode`` gives them at the wire edge: str, int (int32; an int outside the int32
range is written as int64), ``bson.Int64``, float, ``bson.Decimal128``, bool, None, dict,
list, ``bytes`` (binData subtype 0), ``bson.Binary``, ``bson.ObjectId``, aware UTC
``datetime`` (``bson.DatetimeMS`` outside Python's range), ``bson.Timestamp``,
``bson.Regex``, ``bson.DBRef``, ``bson.Code``, ``bson.MinKey`` / ``bson.MaxKey`` (the
domain's MIN_KEY / MAX_KEY are subclasses).  Plain JSON values are a subset.

In a record (a Kafka message, a shard's store) the same document is relaxed Extended
JSON, built by ``bson.json_util`` with the options below: JSON's own types as they are
(so a plain JSON document is its own record form, byte for byte), a wrapper only where
JSON has no type (``{"$oid": ...}``, ``{"$date": ...}``, ``{"$numberDecimal": ...}``,
``{"$binary": ...}``, ``{"$timestamp": ...}``, ``{"$regularExpression": ...}``,
``{"$minKey": 1}``, ...), and ``{"$numberLong": "5"}`` for every ``Int64`` (relaxed mode
would write 5 and read back an int32).  ``to_record`` / ``from_record`` convert between
the two; ``from_record(to_record(v)) == v`` with the same types.
"""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Mapping
from typing import Annotated, Any

from bson import DBRef, Int64, MaxKey, MinKey
from bson.binary import UuidRepresentation
from bson.codec_options import DatetimeConversion
from bson.errors import InvalidId
from bson.json_util import JSONMode, JSONOptions, default, object_pairs_hook
from pydantic import PlainSerializer, PlainValidator, ValidationInfo, WithJsonSchema

__all__ = [
    "BsonDoc",
    "BsonValue",
    "RECORD_CONTEXT",
    "RecordForm",
    "LONG_JSON_OPTIONS",
    "RECORD_JSON_OPTIONS",
    "RecordFormError",
    "from_record",
    "to_record",
]


class RecordFormError(ValueError):
    """A value with no BSON type, or Extended JSON that does not parse."""


# What records are written and read with: relaxed mode (plain JSON numbers, ISO-8601
# dates from 1970 on), binary subtypes kept as they are (a subtype 4 UUID stays a
# Binary, no UUID representation is imposed), dates read back aware in UTC, dates
# outside Python's range as DatetimeMS rather than an error.
RECORD_JSON_OPTIONS = JSONOptions(
    json_mode=JSONMode.RELAXED,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    document_class=dict,
    tz_aware=True,
    tzinfo=datetime.UTC,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)
# Canonical mode, used for Int64 alone: {"$numberLong": "5"}.
LONG_JSON_OPTIONS = JSONOptions(
    json_mode=JSONMode.CANONICAL,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    document_class=dict,
    tz_aware=True,
    tzinfo=datetime.UTC,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)

_JSON_SCALARS = (str, bool, type(None))
_PLAIN = frozenset((str, bool, type(None), int))  # their own record form, whatever the depth
MAX_NESTING_DEPTH = 100  # MongoDB's nesting limit for documents (domain.shardkey's too)


def _to(v: Any, depth: int) -> Any:
    if depth > MAX_NESTING_DEPTH:
        raise RecordFormError(f"value nested deeper than {MAX_NESTING_DEPTH} levels")
    t = type(v)
    if t in _JSON_SCALARS or t is int:
        return v
    if t is float:
        return v if math.isfinite(v) else default(v, RECORD_JSON_OPTIONS)  # {"$numberDouble": "NaN"}
    if isinstance(v, Mapping):
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                if not isinstance(k, str):
                    raise RecordFormError(f"field names must be strings, got {k!r}")
                k = str(k)  # a str subclass (a StrEnum) as its text
            out[k] = x if type(x) in _PLAIN else _to(x, depth + 1)
        return out
    if isinstance(v, (list, tuple)):
        return [x if type(x) in _PLAIN else _to(x, depth + 1) for x in v]
    if isinstance(v, Int64):
        return default(v, LONG_JSON_OPTIONS)
    if isinstance(v, enum.Enum):  # a StrEnum (an error code) or IntEnum in a reply
        return _to(v.value, depth)
    if isinstance(v, DBRef):
        return _to(dict(v.as_doc()), depth + 1)  # {"$ref", "$id", ...}: its $id may be a typed value
    try:
        return default(v, RECORD_JSON_OPTIONS)  # MinKey/MaxKey included: they are bson's
    except (TypeError, ValueError):  # ValueError: a uuid.UUID, which needs a UUID representation
        text = repr(v)
        raise RecordFormError(
            f"value of type {type(v).__name__} has no BSON type: {text[:77] + '...' if len(text) > 80 else text}"
        ) from None


def to_record(value: Any) -> Any:
    """The record form (JSON-able: dict, list, str, int, float, bool, None) of a value
    of ``bson`` types, at any depth.  Raises :class:`RecordFormError` for a value with
    no BSON type (a set, an arbitrary object, a non-str field name)."""
    return _to(value, 0)


def _from(v: Any, depth: int, keys: tuple[Any, Any] | None) -> Any:
    if isinstance(v, dict):
        if depth > MAX_NESTING_DEPTH:
            raise RecordFormError(f"record nested deeper than {MAX_NESTING_DEPTH} levels")
        plain = {k: _from(x, depth + 1, keys) if isinstance(x, (dict, list)) else x for k, x in v.items()}
        if not any(isinstance(k, str) and k.startswith("$") for k in plain):
            return plain  # every wrapper has a "$" key: the common case skips json_util
        pairs = list(plain.items())
        try:
            out = object_pairs_hook(pairs, RECORD_JSON_OPTIONS)
        except (TypeError, ValueError, KeyError, InvalidId, OverflowError) as e:
            raise RecordFormError(f"malformed Extended JSON {dict(pairs)!r:.200}: {e}") from None
        if keys is not None and isinstance(out, (MinKey, MaxKey)):
            return keys[0] if isinstance(out, MinKey) else keys[1]
        return out
    if isinstance(v, list):
        if depth > MAX_NESTING_DEPTH:
            raise RecordFormError(f"record nested deeper than {MAX_NESTING_DEPTH} levels")
        return [_from(x, depth + 1, keys) if isinstance(x, (dict, list)) else x for x in v]
    return v


def from_record(value: Any, *, keys: tuple[Any, Any] | None = None) -> Any:
    """The value of ``bson`` types a record form stands for (inverse of
    :func:`to_record`).  Plain JSON comes back as it is; ``{"$minKey": 1}`` /
    ``{"$maxKey": 1}`` become ``bson.MinKey()`` / ``bson.MaxKey()``, or ``keys``' two
    values when given.  Raises :class:`RecordFormError` for a malformed wrapper
    (``{"$oid": "zz"}``)."""
    return _from(value, 0, keys)


# ------------------------------------------------------------------ record shapes
# Fields of records that carry documents (or values of documents) are declared with these
# types: BSON values in memory, relaxed Extended JSON in the record.  Decoding a record
# (pydantic's JSON mode, or Python mode with RECORD_CONTEXT: ``schemas.Codec``) applies
# ``from_record``; building a record in Python keeps the values given (already BSON
# values); ``model_dump_json`` applies ``to_record``.

RECORD_CONTEXT = "record-form"  # validation context key: the input is a decoded record


def _from_record_form(value: Any, info: ValidationInfo) -> bool:
    return info.mode == "json" or bool(info.context and info.context.get(RECORD_CONTEXT))


def _validate_doc(value: Any, info: ValidationInfo) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be an object (a document)")
    out = from_record(value) if _from_record_form(value, info) else value
    if not isinstance(out, dict):  # {"$oid": ...} where a document belongs
        raise ValueError(f"must be a document, got a {type(out).__name__}")
    return out


def _validate_value(value: Any, info: ValidationInfo) -> Any:
    return from_record(value) if _from_record_form(value, info) else value


_serialize = PlainSerializer(to_record, return_type=Any, when_used="json")

BsonDoc = Annotated[
    dict[str, Any],
    PlainValidator(_validate_doc),
    _serialize,
    WithJsonSchema({"type": "object", "additionalProperties": True, "description": "relaxed Extended JSON"}),
]
"""A document of BSON values (a document, filter, update, sort, projection, result)."""

BsonValue = Annotated[
    Any,
    PlainValidator(_validate_value),
    _serialize,
    WithJsonSchema({"description": "a BSON value as relaxed Extended JSON"}),
]
"""Any one BSON value (a document's _id)."""

RecordForm = Annotated[dict[str, Any], _serialize]
"""A JSON object kept in its record form in memory (a chunk bound as ``{"x": {"$minKey": 1}}``,
a config reply), which may also be given BSON values: they are written as Extended JSON."""
