"""Every Kafka record in shardlog is a pydantic model defined here.

One module per topic family (`schemas.config` for `config.commands` /
`config.events` and replies).  Each record carries a `type` discriminator and a
schema version `v`; a record that does not parse — bad JSON, unknown type,
wrong version, wrong fields — raises `RecordError` with the reason, which the
runtime turns into a dead letter.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from schemas.bsonjson import RECORD_CONTEXT

__all__ = ["Record", "RecordError", "Codec", "Tombstone"]


class Record(BaseModel):
    """Base of every record: immutable, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    SCHEMA_VERSION: ClassVar[int] = 1
    if TYPE_CHECKING:
        # Every record declares both as Literal fields; named here (for the type checker only, so
        # pydantic sees no new field) so that code generic over records can read them.
        type: str
        v: int


class Tombstone(Record):
    """The removal of everything a compacted log holds under `key`: written as a null value
    under that key (never encoded as JSON), so compaction drops the key's records; replay
    folds a null value back into this (docs/decisions/0015)."""

    type: Literal["Tombstone"] = "Tombstone"
    v: Literal[1] = 1
    key: bytes


class RecordError(ValueError):
    """A record that cannot be decoded; `reason` says why in one line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _no_constant(name: str) -> NoReturn:
    # NaN and Infinity are not JSON; a record carrying them could not be written back faithfully.
    raise ValueError(f"{name} is not a JSON number")


R = TypeVar("R", bound=Record, covariant=True)  # a codec of some records is a codec of records


class Codec(Generic[R]):
    """Encodes and decodes one topic family's records (a discriminated union on `type`)."""

    def __init__(self, name: str, union: Any, members: tuple[type[Record], ...]):
        # `union` is R as a runtime object (an Annotated discriminated union); the variable
        # holding the codec names R, e.g. `events: Codec[ConfigEvent] = Codec(...)`.
        self.name = name
        self._adapter: TypeAdapter[R] = TypeAdapter(union)
        self._versions = {m.model_fields["type"].default: m.SCHEMA_VERSION for m in members}
        self.members = members

    def decode(self, raw: bytes | None) -> R:
        # Fast path: pydantic parses and validates in one pass.  It would accept the
        # non-JSON constants NaN/Infinity, so records mentioning them take the careful path.
        if raw is not None and b"NaN" not in raw and b"Infinity" not in raw:
            try:
                record = self._adapter.validate_json(raw)
                if record.v == self._versions[record.type]:
                    return record
            except (ValidationError, ValueError):
                pass  # fall through to the careful path, which says why
        return self._decode_explained(raw)

    def _decode_explained(self, raw: bytes | None) -> R:
        if raw is None:
            raise RecordError(f"{self.name}: empty record")
        try:
            obj = json.loads(raw, parse_constant=_no_constant)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RecordError(f"{self.name}: not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
        except ValueError as e:
            raise RecordError(f"{self.name}: {e}") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{self.name}: a record must be a JSON object")
        kind = obj.get("type")
        if kind not in self._versions:
            raise RecordError(f"{self.name}: unknown record type {kind!r}")
        want = self._versions[kind]
        if obj.get("v") != want:
            raise RecordError(f"{self.name}: {kind} has schema version {obj.get('v')!r}, this build reads v{want}")
        try:
            return self._adapter.validate_python(obj, context={RECORD_CONTEXT: True})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"][1:]) or "record"
            raise RecordError(f"{self.name}: {kind}.{where}: {first['msg']}") from None

    @staticmethod
    def encode(record: Record) -> bytes:
        return record.model_dump_json().encode()
