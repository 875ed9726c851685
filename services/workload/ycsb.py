"""YCSB core workloads, reproduced from brianfrankcooper/YCSB (pure: no I/O,
standard library only).

What is reproduced, and from where (``site.ycsb`` package):

- ``Utils.fnvhash64``                      -> :func:`fnvhash64`
- ``CoreWorkload.buildKeyName``            -> :func:`build_key_name`
- ``generator.UniformLongGenerator``       -> :class:`UniformGenerator`
- ``generator.ZipfianGenerator``           -> :class:`ZipfianGenerator`
- ``generator.ScrambledZipfianGenerator``  -> :class:`ScrambledZipfianGenerator`
- ``generator.SkewedLatestGenerator``      -> :class:`SkewedLatestGenerator`
- ``generator.CounterGenerator``           -> :class:`CounterGenerator`
- ``generator.AcknowledgedCounterGenerator`` -> :class:`AcknowledgedCounterGenerator`
- ``generator.DiscreteGenerator``          -> :class:`DiscreteGenerator`
- ``generator.ConstantIntegerGenerator``   -> :class:`ConstantIntegerGenerator`
- ``workloads/workload{a..f}``             -> :data:`WORKLOADS`
- ``workloads.CoreWorkload``               -> :class:`CoreWorkload`
  (``init`` / ``doInsert`` / ``doTransaction*`` / ``nextKeynum``)

Randomness: every generator takes ``rng``, a :class:`random.Random` (or an
int seed, or None for an unseeded one).  Generators built by
:class:`CoreWorkload` share the workload's ``rng``, so a seed fixes the whole
operation stream.  The numbers differ from Java's (different PRNG); the
distributions and the algorithms are the same.

Deliberate differences from YCSB (the distributions are unaffected):

- Field values are random printable ASCII drawn uniformly from the 64
  characters 0x20..0x5F, generated in bulk.  YCSB's ``RandomByteIterator``
  packs 6 chars per 32-bit int with masks 31/63/95 + ' ' (0x20..0x7F, which
  includes DEL).  Sizes are exact.
- ``UniformGenerator`` uses ``rng.randint`` (unbiased) where YCSB does
  ``abs(nextLong()) % interval`` (a negligible modulo bias).
- ``AcknowledgedCounterGenerator`` keeps pending acknowledgements in a set
  rather than a 2^20-slot ring; it refuses values more than ``window_size``
  ahead of the acknowledged limit (YCSB's "Too many unacknowledged insertion
  keys"), double acknowledgements and values never handed out.
- Only the request distributions ``uniform``, ``zipfian`` and ``latest`` are
  supported (not ``hotspot``, ``sequential``, ``exponential``).

YCSB quirks that ARE kept, on purpose:

- ``ZipfianGenerator.nextLong(itemcount)``, when ``itemcount`` grew, updates
  zeta incrementally but recomputes ``eta`` with the item count given at
  construction (``2.0 / items``), not the new one.
- ``ScrambledZipfianGenerator`` draws from a ZipfianGenerator(0, ITEM_COUNT)
  (so ITEM_COUNT + 1 items) with the precomputed ZETAN, then maps the value
  through ``fnvhash64(v) % itemcount`` (Java remainder).
- The zipfian key chooser spans ``insertstart .. insertstart + insertcount +
  expectednewkeys`` (inclusive, so one more than the key count even with no
  inserts) where ``expectednewkeys = int(operationcount * insertproportion *
  2.0)``; keynums above the acknowledged insert counter are redrawn.
- 'latest' is ``last - zipfian(last)`` where ``last`` is the acknowledged
  counter, so it returns keynums in ``1 .. last`` (keynum 0 only when
  ``last`` is 0); its zipfian starts over ``recordcount - 1`` items.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FNV_OFFSET_BASIS_64",
    "FNV_PRIME_64",
    "fnvhash64",
    "build_key_name",
    "build_values",
    "field_length_generator",
    "random_field_value",
    "NumberGenerator",
    "ConstantIntegerGenerator",
    "UniformGenerator",
    "UniformLongGenerator",
    "ZIPFIAN_CONSTANT",
    "zetastatic",
    "ZipfianGenerator",
    "ScrambledZipfianGenerator",
    "CounterGenerator",
    "AcknowledgedCounterGenerator",
    "SkewedLatestGenerator",
    "DiscreteGenerator",
    "OperationKind",
    "Operation",
    "Workload",
    "WORKLOADS",
    "REQUEST_DISTRIBUTIONS",
    "CoreWorkload",
    "LoadComplete",
]

RngLike = random.Random | int | None


def _rng(rng: RngLike) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    return random.Random(rng)


# --------------------------------------------------------------------------
# Java long arithmetic helpers

_MASK64 = (1 << 64) - 1
_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1


def _to_signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _java_abs(x: int) -> int:
    """Math.abs(long): abs(Long.MIN_VALUE) overflows back to MIN_VALUE."""
    return x if x == _LONG_MIN else abs(x)


def _java_rem(a: int, b: int) -> int:
    """Java's % on longs: truncating division, remainder has the sign of a."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _java_d2l(x: float) -> int:
    """Java's (long) cast of a double: NaN -> 0, saturating, truncating."""
    if x != x:
        return 0
    if x >= 9.223372036854775807e18:
        return _LONG_MAX
    if x <= -9.223372036854775808e18:
        return _LONG_MIN
    return int(x)


def _jdiv(a: float, b: float) -> float:
    """Java double division (x/0.0 is +-inf or NaN instead of an exception)."""
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _jpow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except (OverflowError, ValueError):
        return math.nan if a < 0 else math.inf


# --------------------------------------------------------------------------
# Hashing and key names

FNV_OFFSET_BASIS_64 = 0xCBF29CE484222325
FNV_PRIME_64 = 1099511628211


def fnvhash64(value: int) -> int:
    """YCSB's ``Utils.fnvhash64``: FNV-1a over the 8 bytes of the (signed,
    64-bit) long, least significant byte first, then ``Math.abs`` of the
    signed result (which leaves Long.MIN_VALUE negative, as in Java)."""
    val = _to_signed64(value)
    h = FNV_OFFSET_BASIS_64
    for _ in range(8):
        octet = val & 0xFF
        val >>= 8  # arithmetic shift, like Java's >>
        h ^= octet
        h = (h * FNV_PRIME_64) & _MASK64
    return _java_abs(_to_signed64(h))


def build_key_name(keynum: int, ordered_inserts: bool = False, zeropadding: int = 1) -> str:
    """YCSB's ``CoreWorkload.buildKeyName``: "user" + (fnvhash64(keynum)
    unless ordered inserts), left-padded with zeros to ``zeropadding`` digits
    (the default, 1, means no padding)."""
    if not ordered_inserts:
        keynum = fnvhash64(keynum)
    value = str(keynum)
    return "user" + "0" * max(0, zeropadding - len(value)) + value


# --------------------------------------------------------------------------
# Number generators


class NumberGenerator:
    """Base: ``next_value()`` draws, ``last_value()`` is the previous draw."""

    _last: int | None = None

    def next_value(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def last_value(self) -> int:
        if self._last is None:
            self.next_value()
        return self._last  # type: ignore[return-value]

    def _set_last(self, v: int) -> int:
        self._last = v
        return v

    def __iter__(self) -> Iterator[int]:
        while True:
            yield self.next_value()


class ConstantIntegerGenerator(NumberGenerator):
    def __init__(self, value: int) -> None:
        self.value = value
        self._last = value

    def next_value(self) -> int:
        return self.value


class UniformGenerator(NumberGenerator):
    """YCSB's ``UniformLongGenerator(lb, ub)``: uniform over [lo, hi]."""

    def __init__(self, lo: int, hi: int, *, rng: RngLike = None) -> None:
        if hi < lo:
            raise ValueError(f"empty range [{lo}, {hi}]")
        self.lo, self.hi = lo, hi
        self.rng = _rng(rng)

    def next_value(self) -> int:
        return self._set_last(self.rng.randint(self.lo, self.hi))

    def mean(self) -> float:
        return (self.lo + self.hi) / 2.0


UniformLongGenerator = UniformGenerator

ZIPFIAN_CONSTANT = 0.99


def zetastatic(st: int, n: int, theta: float, initialsum: float = 0.0) -> float:
    """``ZipfianGenerator.zetastatic``: initialsum + sum_{i=st}^{n-1} 1/(i+1)^theta,
    summed left to right like YCSB (so the incremental and from-scratch
    results are bit-identical)."""
    s = initialsum
    for i in range(st, n):
        s += 1 / math.pow(i + 1, theta)
    return s


class ZipfianGenerator(NumberGenerator):
    """YCSB's ``ZipfianGenerator`` (Gray et al., "Quickly Generating
    Billion-Record Synthetic Databases", SIGMOD 1994) over [lo, hi]: lo is
    the most popular item, lo+1 the next, and so on.

    ``next_long(itemcount)`` draws over ``itemcount`` items; when it grew
    since zeta was last computed, zeta is extended incrementally (cheap).
    When it shrank, the old zeta is kept unless ``allow_itemcount_decrease``.
    """

    def __init__(
        self,
        lo: int,
        hi: int,
        constant: float = ZIPFIAN_CONSTANT,
        *,
        zetan: float | None = None,
        rng: RngLike = None,
        allow_itemcount_decrease: bool = False,
    ) -> None:
        self.rng = _rng(rng)
        self.items = hi - lo + 1
        self.base = lo
        self.zipfianconstant = constant
        self.theta = constant
        self.zeta2theta = zetastatic(0, 2, self.theta)
        self.alpha = 1.0 / (1.0 - self.theta)
        self.zetan = zetastatic(0, self.items, self.theta) if zetan is None else zetan
        self.countforzeta = self.items
        self.allow_itemcount_decrease = allow_itemcount_decrease
        self.eta = self._eta()

    @classmethod
    def for_items(cls, items: int, constant: float = ZIPFIAN_CONSTANT, *, rng: RngLike = None) -> ZipfianGenerator:
        """YCSB's ``ZipfianGenerator(long items)``: items 0 .. items-1."""
        return cls(0, items - 1, constant, rng=rng)

    def _eta(self) -> float:
        # YCSB uses the construction-time ``items`` here, also after zeta grew.
        num = 1 - _jpow(_jdiv(2.0, self.items), 1 - self.theta)
        return _jdiv(num, 1 - _jdiv(self.zeta2theta, self.zetan))

    def next_long(self, itemcount: int) -> int:
        if itemcount != self.countforzeta:
            if itemcount > self.countforzeta:
                self.zetan = zetastatic(self.countforzeta, itemcount, self.theta, self.zetan)
                self.countforzeta = itemcount
                self.eta = self._eta()
            elif self.allow_itemcount_decrease:
                self.zetan = zetastatic(0, itemcount, self.theta)
                self.countforzeta = itemcount
                self.eta = self._eta()
        u = self.rng.random()
        uz = u * self.zetan
        if uz < 1.0:
            return self._set_last(self.base)
        if uz < 1.0 + math.pow(0.5, self.theta):
            return self._set_last(self.base + 1)
        ret = self.base + _java_d2l(itemcount * _jpow(self.eta * u - self.eta + 1, self.alpha))
        return self._set_last(ret)

    def next_value(self) -> int:
        return self.next_long(self.items)

    def probability_of_first(self) -> float:
        """P(next value == lo) = 1 / zeta(n, theta), exactly, by construction."""
        return 1.0 / self.zetan


class ScrambledZipfianGenerator(NumberGenerator):
    """YCSB's ``ScrambledZipfianGenerator`` over [lo, hi]: a zipfian over a
    fixed space of ITEM_COUNT (+1) items with the precomputed ZETAN, mapped
    to ``lo + fnvhash64(v) % (hi - lo + 1)``, so the popular items are
    scattered over the range and the popularity ranking does not move when
    the range grows."""

    ZETAN = 26.46902820178302
    USED_ZIPFIAN_CONSTANT = 0.99
    ITEM_COUNT = 10_000_000_000

    def __init__(self, lo: int, hi: int, constant: float = ZIPFIAN_CONSTANT, *, rng: RngLike = None) -> None:
        if constant != self.USED_ZIPFIAN_CONSTANT:
            # YCSB would compute zeta over 10^10 items from scratch (hours).
            raise NotImplementedError("ScrambledZipfianGenerator only has ZETAN precomputed for constant 0.99")
        if hi < lo:
            raise ValueError(f"empty range [{lo}, {hi}]")
        self.min, self.max = lo, hi
        self.itemcount = hi - lo + 1
        self.rng = _rng(rng)
        self.gen = ZipfianGenerator(0, self.ITEM_COUNT, constant, zetan=self.ZETAN, rng=self.rng)

    def next_value(self) -> int:
        v = self.gen.next_value()
        return self._set_last(self.min + _java_rem(fnvhash64(v), self.itemcount))

    def mean(self) -> float:
        return (self.min + self.max) / 2.0


class CounterGenerator(NumberGenerator):
    """YCSB's ``CounterGenerator``: start, start+1, ...; ``last_value()`` is
    the last value handed out (start - 1 before the first)."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def next_value(self) -> int:
        v = self._next
        self._next += 1
        return v

    def last_value(self) -> int:
        return self._next - 1

    def peek_next(self) -> int:
        return self._next


class AcknowledgedCounterGenerator(CounterGenerator):
    """YCSB's ``AcknowledgedCounterGenerator``: hands out start, start+1, ...
    but ``last_value()`` is the highest value v such that every value from
    start up to v has been acknowledged (start - 1 before that)."""

    WINDOW_SIZE = 1 << 20

    def __init__(self, start: int = 0, *, window_size: int = WINDOW_SIZE) -> None:
        super().__init__(start)
        self.start = start
        self.window_size = window_size
        self._limit = start - 1
        self._pending: set[int] = set()

    def acknowledge(self, value: int) -> None:
        if value < self.start or value >= self._next:
            raise ValueError(f"acknowledge({value}): never handed out")
        if value <= self._limit or value in self._pending:
            raise ValueError(f"acknowledge({value}): already acknowledged")
        if value - self._limit > self.window_size:
            raise RuntimeError("Too many unacknowledged insertion keys.")
        self._pending.add(value)
        while self._limit + 1 in self._pending:
            self._pending.remove(self._limit + 1)
            self._limit += 1

    def last_value(self) -> int:
        return self._limit

    def last_issued(self) -> int:
        return self._next - 1

    def unacknowledged(self) -> int:
        """Values handed out and not yet folded into ``last_value()``."""
        return self._next - 1 - self._limit


class SkewedLatestGenerator(NumberGenerator):
    """YCSB's ``SkewedLatestGenerator``: ``last - zipfian.next_long(last)``
    where ``last = counter.last_value()``, so the most recently
    (acknowledged-)inserted items are the most popular."""

    def __init__(self, counter: CounterGenerator, *, rng: RngLike = None) -> None:
        self.basis = counter
        self.rng = _rng(rng)
        self.zipfian = ZipfianGenerator.for_items(counter.last_value(), rng=self.rng)

    def next_value(self) -> int:
        mx = self.basis.last_value()
        return self._set_last(mx - self.zipfian.next_long(mx))


class DiscreteGenerator:
    """YCSB's ``DiscreteGenerator``: values with weights, normalised on each
    draw, chosen by walking the list in insertion order."""

    def __init__(self, *, rng: RngLike = None) -> None:
        self.rng = _rng(rng)
        self.values: list[tuple[float, str]] = []
        self._last: str | None = None

    def add_value(self, weight: float, value: str) -> None:
        self.values.append((weight, value))

    def next_value(self) -> str:
        total = 0.0
        for w, _ in self.values:
            total += w
        val = self.rng.random()
        for w, v in self.values:
            pw = w / total
            if val < pw:
                self._last = v
                return v
            val -= pw
        # floating-point leftovers: YCSB asserts; the last value is the answer
        self._last = self.values[-1][1]
        return self._last

    def last_value(self) -> str:
        if self._last is None:
            self.next_value()
        return self._last  # type: ignore[return-value]


# --------------------------------------------------------------------------
# Records

FIELD_LENGTH_DISTRIBUTIONS = ("constant", "uniform", "zipfian")

# 64 printable characters, 0x20 (space) .. 0x5F ('_'): one per random byte & 63.
_VALUE_TABLE = bytes(0x20 + (b & 63) for b in range(256))


def random_field_value(rng: random.Random, length: int) -> str:
    """``length`` random printable ASCII characters (YCSB's RandomByteIterator
    analogue; see the module docstring)."""
    if length <= 0:
        return ""
    return rng.randbytes(length).translate(_VALUE_TABLE).decode("ascii")


def field_length_generator(
    distribution: str = "constant",
    fieldlength: int = 100,
    minfieldlength: int = 1,
    *,
    rng: RngLike = None,
) -> NumberGenerator:
    """``CoreWorkload.getFieldLengthGenerator`` (without "histogram")."""
    if distribution == "constant":
        return ConstantIntegerGenerator(fieldlength)
    if distribution == "uniform":
        return UniformGenerator(minfieldlength, fieldlength, rng=rng)
    if distribution == "zipfian":
        return ZipfianGenerator(minfieldlength, fieldlength, rng=rng)
    raise ValueError(f"Unknown field length distribution {distribution!r}")


def _field_names(fieldcount: int, prefix: str = "field") -> list[str]:
    return [f"{prefix}{i}" for i in range(fieldcount)]


def build_values(
    rng: random.Random,
    fieldcount: int = 10,
    fieldlength: int = 100,
    field_length_distribution: str | NumberGenerator = "constant",
    *,
    minfieldlength: int = 1,
    fieldnameprefix: str = "field",
) -> dict[str, str]:
    """``CoreWorkload.buildValues``: all fields field0..field{n-1}, each a
    random printable string whose length comes from the field length
    distribution (or generator) given."""
    gen = (
        field_length_generator(field_length_distribution, fieldlength, minfieldlength, rng=rng)
        if isinstance(field_length_distribution, str)
        else field_length_distribution
    )
    return {name: random_field_value(rng, gen.next_value()) for name in _field_names(fieldcount, fieldnameprefix)}


# --------------------------------------------------------------------------
# Workloads

OperationKind = Literal["read", "update", "insert", "scan", "readmodifywrite"]
REQUEST_DISTRIBUTIONS = ("uniform", "zipfian", "latest")


@dataclass(frozen=True)
class Workload:
    """The CoreWorkload properties (YCSB names, defaults as in CoreWorkload;
    the WORKLOADS entries set what the workloada..f files set)."""

    name: str = "custom"
    read: float = 0.95  # readproportion
    update: float = 0.05  # updateproportion
    insert: float = 0.0  # insertproportion
    scan: float = 0.0  # scanproportion
    readmodifywrite: float = 0.0  # readmodifywriteproportion
    request_distribution: str = "uniform"  # requestdistribution
    recordcount: int = 1000
    operationcount: int = 1000
    fieldcount: int = 10
    fieldlength: int = 100
    minfieldlength: int = 1
    field_length_distribution: str = "constant"  # fieldlengthdistribution
    readallfields: bool = True
    readallfieldsbyname: bool = False
    writeallfields: bool = False
    insertorder: str = "hashed"  # "hashed" | "ordered"
    zeropadding: int = 1
    minscanlength: int = 1
    maxscanlength: int = 1000
    scanlengthdistribution: str = "uniform"  # "uniform" | "zipfian"
    fieldnameprefix: str = "field"
    table: str = "usertable"

    def __post_init__(self) -> None:
        if self.request_distribution not in REQUEST_DISTRIBUTIONS:
            raise ValueError(
                f"Unknown request distribution {self.request_distribution!r} "
                f"(supported: {', '.join(REQUEST_DISTRIBUTIONS)})"
            )
        if self.insertorder not in ("hashed", "ordered"):
            raise ValueError(f"insertorder must be 'hashed' or 'ordered', not {self.insertorder!r}")
        if self.scanlengthdistribution not in ("uniform", "zipfian"):
            raise ValueError(f"Distribution {self.scanlengthdistribution!r} not allowed for scan length")
        if self.field_length_distribution not in FIELD_LENGTH_DISTRIBUTIONS:
            raise ValueError(f"Unknown field length distribution {self.field_length_distribution!r}")
        if min(self.read, self.update, self.insert, self.scan, self.readmodifywrite) < 0:
            raise ValueError("operation proportions must be >= 0")
        if self.read + self.update + self.insert + self.scan + self.readmodifywrite <= 0:
            raise ValueError("at least one operation proportion must be > 0")

    @property
    def ordered_inserts(self) -> bool:
        return self.insertorder != "hashed"

    def proportions(self) -> dict[str, float]:
        return {
            "read": self.read,
            "update": self.update,
            "insert": self.insert,
            "scan": self.scan,
            "readmodifywrite": self.readmodifywrite,
        }

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def with_request_distribution(self, dist: str) -> Workload:
        return self.replace(request_distribution=dist)


WORKLOADS: dict[str, Workload] = {
    # A: update heavy (session store recording recent actions)
    "a": Workload(name="a", read=0.5, update=0.5, request_distribution="zipfian"),
    # B: read mostly (photo tagging)
    "b": Workload(name="b", read=0.95, update=0.05, request_distribution="zipfian"),
    # C: read only (user profile cache)
    "c": Workload(name="c", read=1.0, update=0.0, request_distribution="zipfian"),
    # D: read latest (user status updates)
    "d": Workload(name="d", read=0.95, update=0.0, insert=0.05, request_distribution="latest"),
    # E: short ranges (threaded conversations)
    "e": Workload(
        name="e",
        read=0.0,
        update=0.0,
        scan=0.95,
        insert=0.05,
        request_distribution="zipfian",
        maxscanlength=100,
        scanlengthdistribution="uniform",
    ),
    # F: read-modify-write (user database)
    "f": Workload(name="f", read=0.5, update=0.0, readmodifywrite=0.5, request_distribution="zipfian"),
}


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation for a router.

    - read: ``fields`` is the field names to read, None for all fields.
    - update: ``values`` is the fields to set (one field unless writeallfields).
    - insert: ``values`` is the whole record; the caller must call
      ``CoreWorkload.acknowledge_insert(keynum)`` once it completed (YCSB
      acknowledges whether or not the insert succeeded).
    - scan: ``scan_length`` records from ``key`` on, ``fields`` as for read.
    - readmodifywrite: read ``fields`` of ``key``, then update with ``values``.
    """

    kind: OperationKind
    key: str
    keynum: int
    fields: tuple[str, ...] | None = None
    values: dict[str, str] | None = field(default=None, hash=False)
    scan_length: int | None = None


class LoadComplete(Exception):
    """The load phase handed out all its insert keys."""


_OP_NAMES = (
    ("read", "READ"),
    ("update", "UPDATE"),
    ("insert", "INSERT"),
    ("scan", "SCAN"),
    ("readmodifywrite", "READMODIFYWRITE"),
)


class CoreWorkload:
    """YCSB's ``CoreWorkload`` for one client: the load phase
    (:meth:`next_insert_key` / :meth:`next_load_operation`) and the
    transaction phase (:meth:`next_operation` + :meth:`acknowledge_insert`).

    ``record_count`` overrides ``workload.recordcount``; ``operation_count``
    (default ``workload.operationcount``) only sizes the zipfian key space
    for expected inserts, as in YCSB.  ``insert_start``/``insert_count`` are
    YCSB's insertstart/insertcount for splitting a load among clients.
    """

    def __init__(
        self,
        workload: Workload | str,
        record_count: int | None = None,
        rng: RngLike = None,
        *,
        operation_count: int | None = None,
        insert_start: int = 0,
        insert_count: int | None = None,
        request_distribution: str | None = None,
    ) -> None:
        if isinstance(workload, str):
            workload = WORKLOADS[workload.lower()]
        if request_distribution is not None:
            workload = workload.with_request_distribution(request_distribution)
        self.workload = w = workload
        self.rng = _rng(rng)
        self.recordcount = w.recordcount if record_count is None else record_count
        if self.recordcount < 1:
            raise ValueError("record_count must be >= 1")
        self.operationcount = w.operationcount if operation_count is None else operation_count
        self.insertstart = insert_start
        self.insertcount = self.recordcount - insert_start if insert_count is None else insert_count
        if self.insertcount < 1 or self.recordcount < self.insertstart + self.insertcount:
            raise ValueError("Invalid combination of insertstart, insertcount and recordcount.")

        self.fieldnames = _field_names(w.fieldcount, w.fieldnameprefix)
        self.fieldlengthgenerator = field_length_generator(
            w.field_length_distribution, w.fieldlength, w.minfieldlength, rng=self.rng
        )
        self.orderedinserts = w.ordered_inserts
        self.zeropadding = w.zeropadding

        self.keysequence = CounterGenerator(self.insertstart)
        self.operationchooser = DiscreteGenerator(rng=self.rng)
        props = w.proportions()
        for kind, _ in _OP_NAMES:
            if props[kind] > 0:
                self.operationchooser.add_value(props[kind], kind)

        self.transactioninsertkeysequence = AcknowledgedCounterGenerator(self.recordcount)
        dist = w.request_distribution
        if dist == "uniform":
            self.keychooser: NumberGenerator = UniformGenerator(
                self.insertstart, self.insertstart + self.insertcount - 1, rng=self.rng
            )
        elif dist == "zipfian":
            expectednewkeys = int(self.operationcount * w.insert * 2.0)  # 2 is YCSB's fudge factor
            self.keychooser = ScrambledZipfianGenerator(
                self.insertstart, self.insertstart + self.insertcount + expectednewkeys, rng=self.rng
            )
        else:  # latest
            self.keychooser = SkewedLatestGenerator(self.transactioninsertkeysequence, rng=self.rng)

        self.fieldchooser = UniformGenerator(0, w.fieldcount - 1, rng=self.rng)
        if w.scanlengthdistribution == "uniform":
            self.scanlength: NumberGenerator = UniformGenerator(w.minscanlength, w.maxscanlength, rng=self.rng)
        else:
            self.scanlength = ZipfianGenerator(w.minscanlength, w.maxscanlength, rng=self.rng)

    # -- keys and values ---------------------------------------------------

    def key_name(self, keynum: int) -> str:
        return build_key_name(keynum, self.orderedinserts, self.zeropadding)

    def build_values(self) -> dict[str, str]:
        """All fields (``CoreWorkload.buildValues``)."""
        return {name: random_field_value(self.rng, self.fieldlengthgenerator.next_value()) for name in self.fieldnames}

    def build_single_value(self) -> dict[str, str]:
        """One random field (``CoreWorkload.buildSingleValue``)."""
        name = self.fieldnames[self.fieldchooser.next_value()]
        return {name: random_field_value(self.rng, self.fieldlengthgenerator.next_value())}

    def _write_values(self) -> dict[str, str]:
        return self.build_values() if self.workload.writeallfields else self.build_single_value()

    def _read_fields(self, *, for_read: bool) -> tuple[str, ...] | None:
        if not self.workload.readallfields:
            return (self.fieldnames[self.fieldchooser.next_value()],)
        if for_read and self.workload.readallfieldsbyname:
            return tuple(self.fieldnames)
        return None

    # -- load phase --------------------------------------------------------

    @property
    def load_remaining(self) -> int:
        return self.insertstart + self.insertcount - self.keysequence.peek_next()

    def next_insert_keynum(self) -> int:
        if self.load_remaining <= 0:
            raise LoadComplete(f"all {self.insertcount} load keys handed out")
        return self.keysequence.next_value()

    def next_insert_key(self) -> str:
        """Load phase: the key for keynums insertstart, insertstart+1, ...
        (``doInsert``); raises :class:`LoadComplete` after insertcount keys."""
        return self.key_name(self.next_insert_keynum())

    def next_load_operation(self) -> Operation:
        """Load phase: an insert with a full record (``doInsert``)."""
        keynum = self.next_insert_keynum()
        return Operation("insert", self.key_name(keynum), keynum, values=self.build_values())

    def load_operations(self) -> Iterator[Operation]:
        while self.load_remaining > 0:
            yield self.next_load_operation()

    # -- transaction phase -------------------------------------------------

    def next_keynum(self) -> int:
        """``CoreWorkload.nextKeynum``: redraw while the keynum is beyond the
        acknowledged transaction-insert counter."""
        limit = self.transactioninsertkeysequence.last_value()
        while True:
            keynum = self.keychooser.next_value()
            if keynum <= limit:
                return keynum

    def next_operation(self) -> Operation:
        kind = self.operationchooser.next_value()
        if kind == "read":
            keynum = self.next_keynum()
            return Operation("read", self.key_name(keynum), keynum, fields=self._read_fields(for_read=True))
        if kind == "update":
            keynum = self.next_keynum()
            return Operation("update", self.key_name(keynum), keynum, values=self._write_values())
        if kind == "insert":
            keynum = self.transactioninsertkeysequence.next_value()
            return Operation("insert", self.key_name(keynum), keynum, values=self.build_values())
        if kind == "scan":
            keynum = self.next_keynum()
            length = self.scanlength.next_value()
            return Operation(
                "scan", self.key_name(keynum), keynum, fields=self._read_fields(for_read=False), scan_length=length
            )
        keynum = self.next_keynum()
        fields = self._read_fields(for_read=False)
        return Operation("readmodifywrite", self.key_name(keynum), keynum, fields=fields, values=self._write_values())

    def acknowledge_insert(self, keynum: int) -> None:
        """Mark a transaction-phase insert as done, so that key choosers may
        return it (and 'latest' moves on once all earlier ones are done)."""
        self.transactioninsertkeysequence.acknowledge(keynum)

    def acknowledged_limit(self) -> int:
        """The highest keynum the key choosers may return."""
        return self.transactioninsertkeysequence.last_value()
