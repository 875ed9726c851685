"""Shard keys: MongoDB's value ordering, an order-preserving byte encoding, hashing
and key patterns.  Pure, no I/O; values are Python values of pymongo's ``bson``
package (docs/decisions/0016), of which plain JSON values are a subset.

Ordering (MongoDB's BSON comparison order of canonical types)::

    MinKey < null < numbers < strings < objects < arrays < binData < ObjectId
           < booleans < dates < timestamps < regular expressions < code
           < code with scope < MaxKey

* numbers (int, ``bson.Int64``, float, ``bson.Decimal128``): by exact value, whatever
  the type (``2**53 + 1 > 2.0**53``, ``1 == 1.0 == Int64(1) == Decimal128("1.0")``,
  ``-0.0 == 0.0``, ``Decimal128("0.1") != 0.1``); NaN (double or decimal) equals NaN
  and sorts below every other number.  Integers must fit in signed 64 bits, as in
  MongoDB (NumberLong).
* strings: by their UTF-8 bytes (simple binary collation).
* objects: field by field in insertion order; per field first the canonical type of
  the value, then the field name, then the value; a prefix sorts first.  A
  ``bson.DBRef`` is the object it stands for.
* arrays: element by element; a prefix sorts first.
* binData (``bytes`` is subtype 0, ``bson.Binary``): by length, then subtype, then bytes.
* ObjectId: by its 12 bytes.  booleans: false < true.
* dates (aware or naive-as-UTC ``datetime``, ``bson.DatetimeMS``): by signed
  milliseconds since the epoch.  timestamps (``bson.Timestamp``): by (time, inc).
* regular expressions (``bson.Regex``): by pattern, then options, as C strings.
* code (``bson.Code``): by its text; code with a scope after all code without, by
  text and then scope.

``encode_value`` maps a value to bytes whose ``bytes`` order is exactly that order.
The encodings are prefix-free, with one exception kept for compatibility: a number
that needs more precision than a double and an integer tie (a decimal such as
``Decimal128("0.1")``) continues the encoding of a nearby number with a byte 0xFF,
which is above every tag and ``_END``; so in any concatenation (compound keys,
objects, arrays, shard key + ``_id``) the order is still the tuple order.  Only a
reversal of the bytes (``domain.query.sort_key`` descending) must terminate each
encoding first.  Chunk ranges are therefore plain byte ranges:
``encode_bound(min) <= encode_doc(doc) < encode_bound(max)``.  The encoding is
persisted and hashed (``hash_value``), so changing the bytes of an existing encoding
changes chunk ownership: new types only ever get new tags.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bson
import bson.max_key
import bson.min_key
from bson import Binary, DatetimeMS, Decimal128, ObjectId, Regex, Timestamp
from bson.json_util import JSONOptions, default

from schemas import bsonjson

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
    "is_max_key",
    "is_min_key",
    "to_ejson",
    "simple_bound_key",
    "to_ejson_bound",
    "EXACT_INT",
    "NUMBER_TAG",
    "NUMBER_TIE",
    "pack_negated_number",
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


class MinKey(_Sentinel, bson.min_key.MinKey):
    """Sorts below every other value (MongoDB's MinKey).  A ``bson.MinKey`` too, so
    ``bson.encode`` writes it and it equals ``bson.MinKey()`` (and hashes alike)."""

    __slots__ = ()
    _name = "MIN_KEY"
    _hash = hash(bson.min_key.MinKey())  # equal values hash equal


class MaxKey(_Sentinel, bson.max_key.MaxKey):
    """Sorts above every other value (MongoDB's MaxKey); a ``bson.MaxKey`` too."""

    __slots__ = ()
    _name = "MAX_KEY"
    _hash = hash(bson.max_key.MaxKey())


MIN_KEY = MinKey()
MAX_KEY = MaxKey()

_EJSON_SENTINELS: dict[str, _Sentinel] = {"$minKey": MIN_KEY, "$maxKey": MAX_KEY}
# Exactly these types (not subclasses such as bson.Int64 or bson.Code) are their own value.
_PLAIN_SCALARS = frozenset({int, str, float, bool, type(None)})


def is_min_key(v: Any) -> bool:
    """MIN_KEY or any ``bson.MinKey()`` (what the wire decodes)."""
    return isinstance(v, bson.min_key.MinKey)


def is_max_key(v: Any) -> bool:
    return isinstance(v, bson.max_key.MaxKey)


def from_ejson(value: Any) -> Any:
    """The in-memory value of a shard-key value or bound in Extended JSON (decision 0016):
    ``{"$minKey": 1}`` / ``{"$maxKey": 1}`` and ``bson.MinKey()`` / ``bson.MaxKey()`` (at
    any depth) become the sentinels, other wrappers (``{"$oid": ...}``, ``{"$date": ...}``)
    their BSON values; values already BSON values are returned as they are (containers are
    copied)."""
    t = type(value)
    if t in _PLAIN_SCALARS:  # nothing to convert
        return value
    if t is dict and len(value) == 1:  # a one-field bound {"x": 5}: replay's hot path
        ((name, one),) = value.items()
        if type(one) in _PLAIN_SCALARS and type(name) is str and not name.startswith("$"):
            return {name: one}
    if is_min_key(value):
        return MIN_KEY
    if is_max_key(value):
        return MAX_KEY
    if isinstance(value, dict):
        if len(value) == 1:
            ((name, one),) = value.items()
            if name in _EJSON_SENTINELS:
                # A malformed sentinel would otherwise silently become an object,
                # sorting between strings and arrays: a wrong chunk bound.
                if type(one) not in (int, float) or one != 1:
                    raise ShardKeyError(f"Extended JSON {name} must be 1, got {one!r}")
                return _EJSON_SENTINELS[name]
        out = {k: from_ejson(v) for k, v in value.items()}
        if any(isinstance(k, str) and k.startswith("$") for k in out):  # maybe a wrapper
            try:
                return bsonjson.from_record(out)
            except bsonjson.RecordFormError as e:
                raise ShardKeyError(str(e)) from None
        return out
    if isinstance(value, list):
        return [from_ejson(v) for v in value]
    return value


def to_ejson(value: Any) -> Any:
    """Inverse of :func:`from_ejson`: relaxed Extended JSON (``schemas.bsonjson.to_record``),
    sentinels as ``{"$minKey": 1}`` etc.  A value with no BSON type (in an error message about
    bad input) is left as it is."""
    if isinstance(value, dict):
        return {k: to_ejson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_ejson(v) for v in value]
    if type(value) in (str, int, bool, type(None)):
        return value
    try:
        return bsonjson.to_record(value)
    except bsonjson.RecordFormError:
        return value


# One wrapper key of relaxed Extended JSON -> how mongosh writes the value.
_SHELL_WRAPPERS: dict[str, Callable[[str], str]] = {
    "$oid": lambda v: f"ObjectId('{v}')",
    "$numberLong": lambda v: f"Long('{v}')",
    "$numberDecimal": lambda v: f"Decimal128('{v}')",
    "$numberDouble": str,  # NaN, Infinity, -Infinity
    "$uuid": lambda v: f"UUID('{v}')",
    "$symbol": lambda v: _shell_string(v),
}


def _shell_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _shell_key(k: str) -> str:
    return k if k.isidentifier() else _shell_string(k)


def _shell(v: Any) -> str:
    if isinstance(v, dict):
        if len(v) == 1:
            ((k, inner),) = v.items()
            if k in ("$minKey", "$maxKey"):
                return "MinKey" if k == "$minKey" else "MaxKey"
            if k in _SHELL_WRAPPERS and isinstance(inner, str):
                return _SHELL_WRAPPERS[k](inner)
            if k == "$date":
                return f"ISODate('{inner}')" if isinstance(inner, str) else f"ISODate({_shell(inner)})"
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{_shell_key(k)}: {_shell(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[ " + ", ".join(_shell(x) for x in v) + " ]" if v else "[]"
    if isinstance(v, str):
        return _shell_string(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))  # mongosh prints the double 5.0 as 5
    return str(v)


def shell_form(value: Any) -> str:
    """A key, bound or document as mongosh writes it: `{ x: 1000 }`, `{ x: MaxKey }`,
    `{ region: 'eu', uid: Long('5') }` (for messages and the CLI's human output)."""
    return _shell(to_ejson(value))


def shell_range(lo: Any, hi: Any) -> str:
    """A chunk's [min, max) as sh.status() prints it: `{ x: 1000 } -->> { x: MaxKey }`."""
    return f"{shell_form(lo)} -->> {shell_form(hi)}"


# ---------------------------------------------------------------------------- encoding

# One tag byte per value, in canonical-type order.  _END closes objects and arrays and
# sorts below every tag, so a prefix object/array sorts first.  The tags of the JSON
# types are persisted (chunk bounds, store keys, hashes); the BSON-only types were given
# tags in the gaps, in MongoDB's order (docs/decisions/0016).  Every tag stays below
# _CONTINUE.
_END = 0x00
_MINKEY = 0x10
_NULL = 0x20
_NUMBER = 0x30
_STRING = 0x40
_OBJECT = 0x50
_ARRAY = 0x60
_BINARY = 0x64
_OBJECTID = 0x68
_BOOL = 0x70
_DATE = 0x78
_TIMESTAMP = 0x80
_REGEX = 0x88
_CODE = 0x90  # JavaScript code (bson.Code without a scope)
_CODE_WITH_SCOPE = 0x98  # bson.Code with a scope: the code, then the scope as an object
_MAXKEY = 0xF0
_CONTINUE = 0xFF  # a number's extra precision follows (decimals only)

_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_TIE_BIAS = 0x8000
# Below the image of -inf (0x000F_FFFF_...), i.e. below every other number.
_NAN_BODY = bytes(8) + _TIE_BIAS.to_bytes(2, "big")
_DOUBLE_MAX = sys.float_info.max
# Exact decimal arithmetic: x - image spans at most ~12,400 digits for a Decimal128.
_EXACT = decimal.Context(
    prec=20000, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX, traps=[decimal.Inexact, decimal.InvalidOperation]
)
_DATE_BIAS = 1 << 63

# The options the regex options string is read with (json_util writes MongoDB's letters).
_JSON_OPTIONS = JSONOptions()


def _tag_of(v: Any) -> int:
    if v is None:
        return _NULL
    if v is True or v is False:  # before int: bool is an int subclass
        return _BOOL
    if isinstance(v, (int, float, Decimal128)):  # int includes bson.Int64
        return _NUMBER
    if isinstance(v, bson.Code):  # before str: Code is a str subclass
        return _CODE if v.scope is None else _CODE_WITH_SCOPE
    if isinstance(v, str):
        return _STRING
    if isinstance(v, (dict, bson.DBRef)):
        return _OBJECT
    if isinstance(v, list):
        return _ARRAY
    if isinstance(v, bytes):  # bson.Binary is a bytes subclass
        return _BINARY
    if isinstance(v, ObjectId):
        return _OBJECTID
    if isinstance(v, (datetime.datetime, DatetimeMS)):
        return _DATE
    if isinstance(v, Timestamp):
        return _TIMESTAMP
    if isinstance(v, Regex):
        return _REGEX
    if is_min_key(v):
        return _MINKEY
    if is_max_key(v):
        return _MAXKEY
    text = repr(v)
    if len(text) > 80:
        text = text[:77] + "..."
    raise ShardKeyError(
        f"unsupported shard key value of type {type(v).__name__}: {text} (expected null, bool, a number, "
        "str, dict, list, binary, ObjectId, datetime, Timestamp, Regex, Code, MinKey or MaxKey)"
    )


def _image_bytes(image: float) -> bytes:
    bits: int
    (bits,) = struct.unpack(">Q", struct.pack(">d", image))
    # Negative: invert all bits (larger magnitude sorts lower); positive: set the sign.
    bits = bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT
    return bits.to_bytes(8, "big")


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
    return _image_bytes(image) + (tie + _TIE_BIAS).to_bytes(2, "big")


def _tie_bytes(k: int) -> bytes:
    """The integer part of a tie: two bytes ``k + 0x8000`` as for int64 (|k| <= 512
    there), 0xFFFF / 0x0000 and a length-prefixed magnitude beyond 15 bits."""
    if -0x7FFF <= k <= 0x7FFE:
        return (k + _TIE_BIAS).to_bytes(2, "big")
    m = abs(k)
    raw = m.to_bytes((m.bit_length() + 7) // 8, "big")
    if k > 0:
        return b"\xff\xff" + len(raw).to_bytes(2, "big") + raw
    return b"\x00\x00" + (0xFFFF - len(raw)).to_bytes(2, "big") + bytes(255 - b for b in raw)


def _fraction_bytes(f: decimal.Decimal) -> bytes:
    """A fraction 0 < f < 1 as its decimal digits, two per byte (1..100), then 0x00:
    no trailing zeros, so byte order is numeric order and no encoding is a prefix."""
    sign, digits, exponent = f.as_tuple()
    assert sign == 0 and isinstance(exponent, int) and exponent < 0
    text = "".join(map(str, digits)).rjust(-exponent, "0").rstrip("0")
    if len(text) % 2:
        text += "0"
    return bytes(int(text[i : i + 2]) + 1 for i in range(0, len(text), 2)) + b"\x00"


def _decimal_body(v: Decimal128) -> bytes:
    """A Decimal128 as a number: the same image and tie as the equal int or double
    (so equal values encode equal), extended where neither holds it exactly: the tie
    is x - image = k + f with an integer k and a fraction 0 < f < 1, written as the
    integer tie of k, then 0xFF and the digits of f.  Beyond the double range the
    image is +-DBL_MAX and the tie an integer as large as needed."""
    x = v.to_decimal()
    if x.is_nan():
        return _NAN_BODY
    if x.is_infinite():
        return _image_bytes(-math.inf if x.is_signed() else math.inf) + _TIE_BIAS.to_bytes(2, "big")
    image = float(x)  # correctly rounded, as float(int)
    if math.isinf(image):
        image = math.copysign(_DOUBLE_MAX, image)
    if image == 0.0:
        image = 0.0  # -0.0 == 0.0
    r = _EXACT.subtract(x, decimal.Decimal(image))
    k = int(r.to_integral_value(rounding=decimal.ROUND_FLOOR))
    f = _EXACT.subtract(r, decimal.Decimal(k))
    body = _image_bytes(image) + _tie_bytes(k)
    return body + bytes([_CONTINUE]) + _fraction_bytes(f) if f else body


def _date_ms(v: datetime.datetime | DatetimeMS) -> int:
    """Milliseconds since the epoch, as BSON stores a date (a naive datetime is UTC)."""
    return int(v if isinstance(v, DatetimeMS) else DatetimeMS(v))


def _binary_parts(v: bytes) -> tuple[int, bytes]:
    return (v.subtype if isinstance(v, Binary) else 0), bytes(v)


def _regex_parts(v: Regex[Any]) -> tuple[str, str]:
    if not isinstance(v.pattern, str):
        raise ShardKeyError(f"regular expression patterns must be str, got {v.pattern!r}")
    options: str = default(v, _JSON_OPTIONS)["$regularExpression"]["options"]
    return v.pattern, options


def _string_body(s: str) -> bytes:
    try:
        raw = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ShardKeyError(f"string {s!r} is not valid Unicode: {e.reason}") from None
    # 0x00 -> 0x00 0xFF keeps byte order; 0x00 0x00 ends the string below any content.
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _write_body(out: bytearray, tag: int, v: Any, depth: int) -> None:
    if tag == _NUMBER:
        out += _decimal_body(v) if isinstance(v, Decimal128) else _number_body(v)
    elif tag == _STRING:
        out += _string_body(v)
    elif tag == _BOOL:
        out.append(1 if v else 0)
    elif tag == _OBJECT or tag == _ARRAY:
        if depth >= MAX_NESTING_DEPTH:
            raise ShardKeyError(f"value nested deeper than {MAX_NESTING_DEPTH} levels")
        if tag == _OBJECT:
            for name, x in (v.as_doc() if isinstance(v, bson.DBRef) else v).items():
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
    elif tag == _BINARY:
        subtype, raw = _binary_parts(v)
        out += len(raw).to_bytes(4, "big") + bytes([subtype]) + raw  # self-delimiting
    elif tag == _OBJECTID:
        out += v.binary
    elif tag == _DATE:
        out += (_date_ms(v) + _DATE_BIAS).to_bytes(8, "big")
    elif tag == _TIMESTAMP:
        out += v.time.to_bytes(4, "big") + v.inc.to_bytes(4, "big")
    elif tag == _REGEX:
        pattern, options = _regex_parts(v)
        out += _string_body(pattern) + _string_body(options)
    elif tag == _CODE:
        out += _string_body(v)
    elif tag == _CODE_WITH_SCOPE:
        out += _string_body(v)
        _write_body(out, _OBJECT, v.scope, depth)
    # null, MinKey, MaxKey: the tag says it all.


# Integers a double holds exactly: their tie is 0, so the whole encoding (tag, image, tie)
# is one struct (_exact_int).
_EXACT_INT = 2**53
_pack_double = struct.Struct(">d").pack
_unpack_bits = struct.Struct(">Q").unpack
_pack_number = struct.Struct(">BQH").pack


# `_exact_int` of 0 < v <= 2**53: v's double with the sign bit set is the double -v, so the
# whole key is one pack of -v (0 is not: -0 is the int 0, whose double has no sign bit).
_pack_negated = struct.Struct(">BdH").pack
# For a caller that folds millions of bounds and inlines simple_bound_key's first case:
# encode_value(v) == pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE) for every int 0 < v <= EXACT_INT.
pack_negated_number, NUMBER_TAG, NUMBER_TIE, EXACT_INT = _pack_negated, _NUMBER, _TIE_BIAS, _EXACT_INT


def _exact_int(v: int) -> bytes:
    """`encode_value` of an int with |v| <= 2**53 (the same bytes, in one pack)."""
    (bits,) = _unpack_bits(_pack_double(v))
    return _pack_number(_NUMBER, bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT, _TIE_BIAS)


def encode_value(v: Any) -> bytes:
    """Order-preserving, prefix-free encoding of one value (see module docstring)."""
    if type(v) is int and -_EXACT_INT <= v <= _EXACT_INT:  # chunk bounds' usual value
        return _exact_int(v)
    out = bytearray()
    tag = _tag_of(v)
    out.append(tag)
    _write_body(out, tag, v, 0)
    return bytes(out)


def simple_bound_key(field: str | None, bound: Any) -> bytes | None:
    """The key (`encode_bound`) of an Extended JSON bound `{field: v}` with v an int, a string or
    `{"$minKey": 1}` / `{"$maxKey": 1}`, straight from the JSON (no `from_ejson`: a replay's
    hot path); None for any other bound, which the caller parses."""
    if len(bound) != 1:
        return None
    v = bound.get(field)  # None (no key) when the one field is another: not simple
    t = type(v)
    if t is int:
        if 0 < v <= _EXACT_INT:  # a range-sharded replay's usual bound: one pack (_positive_int_key)
            return _pack_negated(_NUMBER, -v, _TIE_BIAS)
        if -_EXACT_INT <= v <= _EXACT_INT:
            return _exact_int(v)
        return encode_value(v) if INT64_MIN <= v <= INT64_MAX else None
    if t is str:
        return encode_value(v)
    if t is dict and len(v) == 1:
        ((wrapper, one),) = v.items()
        if type(one) is int and one == 1:
            return _SENTINEL_KEYS.get(wrapper)
    return None


_SENTINEL_KEYS = {"$minKey": bytes([_MINKEY]), "$maxKey": bytes([_MAXKEY])}


def key_length(key: bytes, start: int = 0) -> int:
    """The length of the one encoded value at `start` of `key` (a concatenation of
    ``encode_value`` encodings: a shard key, then an _id), read off the bytes alone: a
    migration's donor splits a stored key into its shard key and _id without decoding
    anything.  ValueError for bytes that are no encoding."""
    end = _skip_value(key, start, 0)
    if end > len(key):
        raise ValueError(f"truncated key encoding at byte {start}")
    return end - start


def _skip_string(key: bytes, i: int) -> int:
    """Just past a string body (0x00 0xFF is an escaped NUL; 0x00 0x00 ends it)."""
    while True:
        j = key.index(b"\x00", i)
        if key[j + 1 : j + 2] == b"\x00":
            return j + 2
        if key[j + 1 : j + 2] != b"\xff":
            raise ValueError(f"bad string encoding at byte {j}")
        i = j + 2


def _skip_body(key: bytes, tag: int, i: int, depth: int) -> int:
    if tag == _NUMBER:
        i += 8  # the image
        tie = key[i : i + 2]
        i += 2
        if tie == b"\xff\xff":
            i += 2 + int.from_bytes(key[i : i + 2], "big")
        elif tie == b"\x00\x00":
            i += 2 + 0xFFFF - int.from_bytes(key[i : i + 2], "big")
        if key[i : i + 1] == bytes([_CONTINUE]):  # a decimal's fraction digits, then 0x00
            i = key.index(b"\x00", i + 1) + 1
        return i
    if tag == _STRING or tag == _CODE:
        return _skip_string(key, i)
    if tag == _BOOL:
        return i + 1
    if tag == _OBJECT or tag == _ARRAY:
        if depth >= MAX_NESTING_DEPTH:
            raise ValueError(f"key nested deeper than {MAX_NESTING_DEPTH} levels")
        while key[i] != _END:
            t = key[i]
            i += 1
            if tag == _OBJECT:
                i = _skip_string(key, i)  # the field name
            i = _skip_body(key, t, i, depth + 1)
        return i + 1
    if tag == _BINARY:
        return i + 5 + int.from_bytes(key[i : i + 4], "big")
    if tag == _OBJECTID:
        return i + 12
    if tag == _DATE or tag == _TIMESTAMP:
        return i + 8
    if tag == _REGEX:
        return _skip_string(key, _skip_string(key, i))
    if tag == _CODE_WITH_SCOPE:
        return _skip_body(key, _OBJECT, _skip_string(key, i), depth)
    if tag in (_NULL, _MINKEY, _MAXKEY):
        return i
    raise ValueError(f"no value has tag 0x{tag:02x}")


def _skip_value(key: bytes, i: int, depth: int) -> int:
    try:
        return _skip_body(key, key[i], i + 1, depth)
    except IndexError:
        raise ValueError(f"truncated key encoding at byte {i}") from None


def compare_values(a: Any, b: Any) -> int:
    """-1, 0 or 1 as ``a`` sorts before, equal to or after ``b``."""
    ea, eb = encode_value(a), encode_value(b)
    return (ea > eb) - (ea < eb)


def _md5_int64(data: bytes) -> int:
    digest = hashlib.md5(data, usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


# MongoDB's canonical type numbers (canonicalizeBSONType), which its hash starts with.
_MONGO_CANONICAL = {_BINARY: 30, _OBJECTID: 35, _DATE: 45, _TIMESTAMP: 47, _REGEX: 50, _CODE: 60}


def _mongo_hash(tag: int, v: Any) -> int:
    """MongoDB's BSONElementHasher::hash64 of a top-level scalar, seed 0: md5 of the
    seed (int32), the canonical type (int32) and the element's BSON value bytes, the
    first 8 bytes of the digest little-endian."""
    if tag == _BINARY:
        subtype, raw = _binary_parts(v)
        value = struct.pack("<i", len(raw)) + bytes([subtype]) + raw
    elif tag == _OBJECTID:
        value = v.binary
    elif tag == _DATE:
        value = struct.pack("<q", _date_ms(v))
    elif tag == _TIMESTAMP:
        value = struct.pack("<II", v.inc, v.time)  # BSON: increment first
    elif tag == _CODE:
        raw = str(v).encode() + b"\x00"
        value = struct.pack("<i", len(raw)) + raw  # a BSON string
    else:
        pattern, options = _regex_parts(v)
        value = pattern.encode() + b"\x00" + options.encode() + b"\x00"
    return _md5_int64(struct.pack("<ii", 0, _MONGO_CANONICAL[tag]) + value)


def hash_value(v: Any) -> int:
    """Deterministic signed 64-bit hash, stable across processes and releases, so
    values that compare equal hash equal.  Chunk bounds of hashed shard keys live in
    this space.

    The JSON types (and numbers of every type, objects and arrays of anything, code
    with a scope) hash as md5 of the encoding, first 8 bytes little-endian.  binData,
    ObjectId, dates, timestamps, regular expressions and code hash as MongoDB hashes
    them (``_mongo_hash``),
    so a hashed ``_id`` of ObjectIds has MongoDB's hash values."""
    tag = _tag_of(v)
    if tag in _MONGO_CANONICAL:
        return _mongo_hash(tag, v)
    return _md5_int64(encode_value(v))


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
            raise InvalidKeyPattern(f"shard key pattern must be a non-empty object, got {shell_form(spec)}")
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
                f"bound {shell_form(bound)} must name exactly the shard key fields {', '.join(self.fields)} in that order"
            )
        result = {name: from_ejson(v) for name, v in bound.items()}
        for name, v in result.items():
            if name == self.hashed_field:
                if not (v is MIN_KEY or v is MAX_KEY or (type(v) in (int, bson.Int64) and INT64_MIN <= v <= INT64_MAX)):
                    raise ShardKeyError(
                        f"bound value for hashed field {name!r} must be a signed 64-bit "
                        f"integer (a hash) or MinKey/MaxKey, got {shell_form(v)}"
                    )
            elif isinstance(v, list):
                raise ShardKeyError(f"shard key values cannot be arrays (field {name!r})")
        check_size(result)  # also rejects unsupported value types
        return result

    def encode_bound(self, bound: dict[str, Any]) -> bytes:
        """Byte image of a validated bound (or extracted key): sorts like the bound."""
        try:
            if len(self.fields) == 1:
                return encode_value(bound[self.fields[0]])
            return b"".join(encode_value(bound[f]) for f in self.fields)
        except KeyError as e:
            raise ShardKeyError(f"bound {shell_form(bound)} lacks shard key field {e.args[0]!r}") from None

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
