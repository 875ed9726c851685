"""Documents as BSON values in memory and as Extended JSON in records (docs/decisions/0016).

The codec is ``schemas.bsonjson`` (the bottom layer, so record shapes can use it); this
module is what the domain and services import.  Its :func:`from_record` gives
``{"$minKey": 1}`` / ``{"$maxKey": 1}`` as this domain's MIN_KEY / MAX_KEY singletons,
which services compare by identity.
"""

from __future__ import annotations

from typing import Any

from domain.shardkey import MAX_KEY, MIN_KEY
from schemas import bsonjson
from schemas.bsonjson import LONG_JSON_OPTIONS, RECORD_JSON_OPTIONS, RecordFormError, to_record

__all__ = [
    "LONG_JSON_OPTIONS",
    "RECORD_JSON_OPTIONS",
    "RecordFormError",
    "from_record",
    "to_record",
]


def from_record(value: Any) -> Any:
    """The value of ``bson`` types a record form stands for (inverse of ``to_record``);
    MinKey / MaxKey as ``domain.shardkey``'s sentinels.  :class:`RecordFormError` for a
    malformed Extended JSON wrapper (``{"$oid": "zz"}``)."""
    return bsonjson.from_record(value, keys=(MIN_KEY, MAX_KEY))
