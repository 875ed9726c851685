"""Shard keys: MongoDB's value ordering, an order-preserving byte encoding, hashing
and key patterns.  Pure: standard library only, no I/O.

Ordering (MongoDB's BSON comparison, restricted to the JSON values we support)::

    MinKey < null < numbers < strings < objects < arrays < booleans < MaxKey

* numbers: int and float compare by exact value (``2**53 + 1 > 2.0**53``,
  ``1 == 1.0``, ``-0.0 == 0.0``); NaN equals NaN and sorts below every other number.
  Integers must fit in signed 64 bits, as in MongoDB (NumberLong).
* strings: by their UTF-8 bytes (simple binary collation).
* objects: field by field in insertion order; per field first the canonical type of
  the value, then the field name, then the value; a prefix sorts first.
* arrays: element by element; a prefix sorts first.
* booleans: false < true.

``encode_value`` maps a value to bytes whose ``bytes`` order is exactly that order
and which are prefix-free, so the concatenated encodings of a compound key sort like
the tuple of its values.  Chunk ranges are therefore plain byte ranges:
``encode_bound(min) <= encode_doc(doc) < encode_bound(max)``.  The encoding is
persisted and hashed (``hash_value``), so changing it changes chunk ownership.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "InvalidKeyPattern",
    "KeyPattern",
    "MAX_KEY",
    "MAX_NESTING_DEPTH",
    "MAX_SHARD_KEY_BYTES",
    "MAX_SHARD_KEY_FIELDS",
    "MIN_KEY",
    "MaxKey",
    "MinKey",
    "ShardKeyError",
    "check_size",
    "compare_values",
    "encode_value",
    "from_ejson",
    "hash_value",
    "to_ejson",
    "to_ejson_bound",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_SHARD_KEY_BYTES = 512
MAX_SHARD_KEY_FIELDS = 32  # MongoDB's compound index limit
MAX_NESTING_DEPTH = 100  # MongoDB's nesting limit for documents; also bounds recursion


class ShardKeyError(ValueError):
    """A value or bound that cannot be (part of) a shard key."""


class ShardKeyTooLarge(ShardKeyError):
    """A shard key over MAX_SHARD_KEY_BYTES encoded."""


class InvalidKeyPattern(ValueError):
    """A malformed shard key pattern such as ``{"x": -1}``."""


# --------------------------------------------------------------------------- sentinels


class _Sentinel:
    """Singleton base: identity equality, stable hash, survives copy and pickle."""

    __slots__ = ()
    _instance: _Sentinel | None = None
    _name = ""
    _hash = 0

    def __new__(cls) -> _Sentinel:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return self._name

    def __hash__(self) -> int:
        return self._hash  # a constant: str hashes are salted per process

    def __reduce__(self) -> str:
        return self._name  # unpickles to the module-level singleton

    def __copy__(self) -> _Sentinel:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _Sentinel:
        return self


class MinKey(_Sentinel):
    """Sorts below every other value (MongoDB's MinKey)."""

    __slots__ = ()
    _name = "MIN_KEY"
    _hash = -0x6D696E6B6579  # "minkey"


class MaxKey(_Sentinel):
    """Sorts above every other value (MongoDB's MaxKey)."""

    __slots__ = ()
    _name = "MAX_KEY"
    _hash = 0x6D61786B6579  # "maxkey"


MIN_KEY = MinKey()
MAX_KEY = MaxKey()

_EJSON_SENTINELS: dict[str, _Sentinel] = {"$minKey": MIN_KEY, "$maxKey": MAX_KEY}


def from_ejson(value: Any) -> Any:
    """Replace Extended JSON ``{"$minKey": 1}`` / ``{"$maxKey": 1}`` (at any depth)
    by the sentinels; everything else is returned as is (containers are copied)."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((name, one),) = value.items()
            if name in _EJSON_SENTINELS:
                # A malformed sentinel would otherwise silently become an object,
                # sorting between strings and arrays: a wrong chunk bound.
                if type(one) not in (int, float) or one != 1:
                    raise ShardKeyError(f"Extended JSON {name} must be 1, got {one!r}")
                return _EJSON_SENTINELS[name]
        return {k: from_ejson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_ejson(v) for v in value]
    return value


def to_ejson(value: Any) -> Any:
    """Inverse of :func:`from_ejson`: sentinels become ``{"$minKey": 1}`` etc."""
    if value is MIN_KEY:
        return {"$minKey": 1}
    if value is MAX_KEY:
        return {"$maxKey": 1}
    if isinstance(value, dict):
        return {k: to_ejson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_ejson(v) for v in value]
    return value


# ---------------------------------------------------------------------------- encoding

# One tag byte per value, in canonical-type order.  _END closes objects and arrays and
# sorts below every tag, so a prefix object/array sorts first.
_END = 0x00
_MINKEY = 0x10
_NULL = 0x20
_NUMBER = 0x30
_STRING = 0x40
_OBJECT = 0x50
_ARRAY = 0x60
_BOOL = 0x70
_MAXKEY = 0xF0

_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_TIE_BIAS = 0x8000
# Below the image of -inf (0x000F_FFFF_...), i.e. below every other number.
_NAN_BODY = bytes(8) + _TIE_BIAS.to_bytes(2, "big")


def _tag_of(v: Any) -> int:
    if v is None:
        return _NULL
    if v is True or v is False:  # before int: bool is an int subclass
        return _BOOL
    if isinstance(v, (int, float)):
        return _NUMBER
    if isinstance(v, str):
        return _STRING
    if isinstance(v, dict):
        return _OBJECT
    if isinstance(v, list):
        return _ARRAY
    if v is MIN_KEY:
        return _MINKEY
    if v is MAX_KEY:
        return _MAXKEY
    text = repr(v)
    if len(text) > 80:
        text = text[:77] + "..."
    raise ShardKeyError(
        f"unsupported shard key value of type {type(v).__name__}: {text} "
        "(expected null, bool, int, float, str, dict, list, MinKey or MaxKey)"
    )


def _number_body(v: int | float) -> bytes:
    """Sortable float64 image, then a 2-byte tie-break ``v - image`` for integers the
    image rounds.  Rounding is monotonic, so (image, tie) orders exactly; for int64
    ``|tie| <= 512`` (half an ulp below 2**63), so two bytes always suffice."""
    if isinstance(v, float):
        if v != v:
            return _NAN_BODY
        image = v if v != 0.0 else 0.0  # -0.0 == 0.0
        tie = 0
    else:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ShardKeyError(f"integer {v} is outside the signed 64-bit range MongoDB can store")
        image = float(v)
        tie = v - int(image)
    bits: int
    (bits,) = struct.unpack(">Q", struct.pack(">d", image))
    # Negative: invert all bits (larger magnitude sorts lower); positive: set the sign.
    bits = bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT
    return bits.to_bytes(8, "big") + (tie + _TIE_BIAS).to_bytes(2, "big")


def _string_body(s: str) -> bytes:
    try:
        raw = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ShardKeyError(f"string {s!r} is not valid Unicode: {e.reason}") from None
    # 0x00 -> 0x00 0xFF keeps byte order; 0x00 0x00 ends the string below any content.
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _write_body(out: bytearray, tag: int, v: Any, depth: int) -> None:
    if tag == _NUMBER:
        out += _number_body(v)
    elif tag == _STRING:
        out += _string_body(v)
    elif tag == _BOOL:
        out.append(1 if v else 0)
    elif tag == _OBJECT or tag == _ARRAY:
        if depth >= MAX_NESTING_DEPTH:
            raise ShardKeyError(f"value nested deeper than {MAX_NESTING_DEPTH} levels")
        if tag == _OBJECT:
            for name, x in v.items():
                if not isinstance(name, str):
                    raise ShardKeyError(f"object field names must be strings, got {name!r}")
                # MongoDB compares type, then field name, then value.
                t = _tag_of(x)
                out.append(t)
                out += _string_body(name)
                _write_body(out, t, x, depth + 1)
        else:
            for x in v:
                t = _tag_of(x)
                out.append(t)
                _write_body(out, t, x, depth + 1)
        out.append(_END)
    # null, MinKey, MaxKey: the tag says it all.


def encode_value(v: Any) -> bytes:
    """Order-preserving, prefix-free encoding of one value (see module docstring)."""
    out = bytearray()
    tag = _tag_of(v)
    out.append(tag)
    _write_body(out, tag, v, 0)
    return bytes(out)


def compare_values(a: Any, b: Any) -> int:
    """-1, 0 or 1 as ``a`` sorts before, equal to or after ``b``."""
    ea, eb = encode_value(a), encode_value(b)
    return (ea > eb) - (ea < eb)


def hash_value(v: Any) -> int:
    """Deterministic signed 64-bit hash, stable across processes and releases (md5 of
    the encoding, first 8 bytes little-endian), so values that compare equal hash
    equal.  Chunk bounds of hashed shard keys live in this space."""
    digest = hashlib.md5(encode_value(v), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def check_size(key: dict[str, Any]) -> None:
    """Raise :class:`ShardKeyError` if the encoded key exceeds MAX_SHARD_KEY_BYTES."""
    size = sum(len(encode_value(v)) for v in key.values())
    if size > MAX_SHARD_KEY_BYTES:
        raise ShardKeyTooLarge(f"shard key is {size} bytes encoded, more than the {MAX_SHARD_KEY_BYTES}-byte limit")


def to_ejson_bound(bound: dict[str, Any]) -> dict[str, Any]:
    """A bound in Extended JSON form, e.g. ``{"x": {"$minKey": 1}}``."""
    return {name: to_ejson(v) for name, v in bound.items()}


# ------------------------------------------------------------------------ key patterns


def _check_field_name(name: Any) -> None:
    if not isinstance(name, str):
        raise InvalidKeyPattern(f"shard key field names must be strings, got {name!r}")
    if not name:
        raise InvalidKeyPattern("shard key field name must not be empty")
    if "\0" in name:
        raise InvalidKeyPattern(f"shard key field {name!r} must not contain a NUL character")
    segments = name.split(".")
    if "" in segments:
        raise InvalidKeyPattern(
            f"shard key field {name!r} has an empty path component (no leading, trailing or doubled dots)"
        )
    if any(s.startswith("$") for s in segments):
        raise InvalidKeyPattern(f"shard key field {name!r} must not start with '$' (in any path component)")


@dataclass(frozen=True)
class KeyPattern:
    """A validated shard key pattern such as ``{"region": 1, "user_id": "hashed"}``.

    Build with :meth:`parse`.  Bounds and extracted keys are dicts naming exactly
    ``fields`` in order; for ``hashed_field`` they hold :func:`hash_value` results."""

    fields: tuple[str, ...]
    hashed_field: str | None = None
    _paths: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_paths", tuple(tuple(f.split(".")) for f in self.fields))

    @classmethod
    def parse(cls, spec: Any) -> KeyPattern:
        if not isinstance(spec, dict) or not spec:
            raise InvalidKeyPattern(f"shard key pattern must be a non-empty object, got {spec!r}")
        if len(spec) > MAX_SHARD_KEY_FIELDS:
            raise InvalidKeyPattern(f"a shard key can have at most {MAX_SHARD_KEY_FIELDS} fields, got {len(spec)}")
        hashed: list[str] = []
        for name, kind in spec.items():
            _check_field_name(name)
            if kind == "hashed":
                hashed.append(name)
            elif type(kind) in (int, float) and kind == 1:  # type(): True is not 1 here
                pass
            else:
                hint = " (descending shard keys are not supported)" if kind == -1 else ""
                raise InvalidKeyPattern(
                    f'shard key fields must be ascending (1) or "hashed", got {kind!r} for field {name!r}{hint}'
                )
        if len(hashed) > 1:
            raise InvalidKeyPattern(f"a shard key can have at most one hashed field, got {len(hashed)}: {hashed}")
        return cls(tuple(spec), hashed[0] if hashed else None)

    @property
    def spec(self) -> dict[str, int | str]:
        """The normalised pattern, e.g. ``{"x": 1, "y": "hashed"}`` (a fresh dict)."""
        return {f: "hashed" if f == self.hashed_field else 1 for f in self.fields}

    @property
    def is_hashed(self) -> bool:
        return self.hashed_field is not None

    def __repr__(self) -> str:
        return f"KeyPattern({self.spec!r})"

    def global_min(self) -> dict[str, MinKey]:
        return {f: MIN_KEY for f in self.fields}

    def global_max(self) -> dict[str, MaxKey]:
        return {f: MAX_KEY for f in self.fields}

    def validate_bound(self, bound: Any) -> dict[str, Any]:
        """Check a chunk bound or split point (Extended JSON accepted) and return it
        with sentinels.  Hashed-field values are positions in hash space: int64 or
        MinKey/MaxKey."""
        if not isinstance(bound, dict) or tuple(bound) != self.fields:
            raise ShardKeyError(
                f"bound {bound!r} must name exactly the shard key fields {list(self.fields)} in that order"
            )
        result = {name: from_ejson(v) for name, v in bound.items()}
        for name, v in result.items():
            if name == self.hashed_field:
                if not (v is MIN_KEY or v is MAX_KEY or (type(v) is int and INT64_MIN <= v <= INT64_MAX)):
                    raise ShardKeyError(
                        f"bound value for hashed field {name!r} must be a signed 64-bit "
                        f"integer (a hash) or MinKey/MaxKey, got {v!r}"
                    )
            elif isinstance(v, list):
                raise ShardKeyError(f"shard key values cannot be arrays (field {name!r})")
        check_size(result)  # also rejects unsupported value types
        return result

    def encode_bound(self, bound: dict[str, Any]) -> bytes:
        """Byte image of a validated bound (or extracted key): sorts like the bound."""
        try:
            return b"".join(encode_value(bound[f]) for f in self.fields)
        except KeyError as e:
            raise ShardKeyError(f"bound {bound!r} lacks shard key field {e.args[0]!r}") from None

    def extract(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The shard key of a document.  Missing fields are null, as in MongoDB; the
        hashed field yields ``hash_value`` of its value."""
        if not isinstance(doc, dict):
            raise ShardKeyError(f"document must be an object, got {type(doc).__name__}")
        key: dict[str, Any] = {}
        for name, path in zip(self.fields, self._paths):
            v: Any = doc
            for segment in path:
                if isinstance(v, list):
                    break  # reported below
                if not isinstance(v, dict) or segment not in v:
                    v = None  # a path through a scalar is missing too
                    break
                v = v[segment]
            if isinstance(v, list):
                raise ShardKeyError(f"shard key values cannot be arrays (field {name!r})")
            key[name] = hash_value(v) if name == self.hashed_field else v
        return key

    def encode_doc(self, doc: dict[str, Any]) -> bytes:
        return self.encode_bound(self.extract(doc))

    # Pattern-independent, offered here too for call sites holding a pattern.
    check_size = staticmethod(check_size)
    to_ejson_bound = staticmethod(to_ejson_bound)
