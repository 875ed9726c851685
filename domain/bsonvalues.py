"""Documents as BSON values in memory and as Extended JSON in records (docs/decisions/0016).

The codec is ``schemas.bsonjson`` (the bottom layer, so record shapes can use it); this
module is what the domain and services import.  Its :func:`from_record` gives
``{"$minKey": 1}`` / ``{"$maxKey": 1}`` as this domain's MIN_KEY / MAX_KEY singletons,
which services compare by identity.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bson import Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from domain.shardkey import MAX_KEY, MIN_KEY
from schemas import bsonjson
from schemas.bsonjson import LONG_JSON_OPTIONS, RECORD_JSON_OPTIONS, RecordFormError, to_record

__all__ = [
    "LONG_JSON_OPTIONS",
    "RECORD_JSON_OPTIONS",
    "RecordFormError",
    "from_record",
    "to_record",
    "type_name",
]


def from_record(value: Any) -> Any:
    """The value of ``bson`` types a record form stands for (inverse of ``to_record``);
    MinKey / MaxKey as ``domain.shardkey``'s sentinels.  :class:`RecordFormError` for a
    malformed Extended JSON wrapper (``{"$oid": "zz"}``)."""
    return bsonjson.from_record(value, keys=(MIN_KEY, MAX_KEY))


def type_name(value: Any) -> str:
    """MongoDB's alias of a value's BSON type (as `$type` names it), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if -(2**31) <= value < 2**31 else "long"
    for kind, name in _TYPE_NAMES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (float, "double"),
    (str, "string"),
    (dict, "object"),
    (list, "array"),
    (ObjectId, "objectId"),
    (datetime, "date"),
    (DatetimeMS, "date"),
    (Decimal128, "decimal"),
    (Timestamp, "timestamp"),
    (Regex, "regex"),
    (MinKey, "minKey"),
    (MaxKey, "maxKey"),
    (bytes, "binData"),
)
