"""services.workload.ycsb: the YCSB core workload generators (pure, seeded)."""

from __future__ import annotations

import collections
import random
import struct

import pytest

from services.workload.ycsb import (
    WORKLOADS,
    AcknowledgedCounterGenerator,
    CoreWorkload,
    CounterGenerator,
    DiscreteGenerator,
    LoadComplete,
    ScrambledZipfianGenerator,
    SkewedLatestGenerator,
    UniformGenerator,
    Workload,
    ZipfianGenerator,
    build_key_name,
    build_values,
    fnvhash64,
    zetastatic,
)

# ---------------------------------------------------------------- fnvhash64


def _fnv1a64_reference(value: int) -> int:
    """FNV-1a 64 from its definition, over the long's 8 bytes little-endian
    (YCSB feeds the low byte first), then Java's abs of the signed result."""
    h = 0xCBF29CE484222325
    for byte in struct.pack("<q", value):
        h ^= byte
        h = (h * 0x100000001B3) % 2**64
    signed = h - 2**64 if h >= 2**63 else h
    return signed if signed == -(2**63) else abs(signed)


@pytest.mark.parametrize(
    "value", [0, 1, 2, 3, 255, 256, 999, 1000, 123456789, 2**31 - 1, 2**62, 2**63 - 1, -1, -(2**63)]
)
def test_fnvhash64_matches_reference(value):
    assert fnvhash64(value) == _fnv1a64_reference(value)


def test_fnvhash64_ycsb_known_values():
    # The first keys of every YCSB load with insertorder=hashed, e.g. the
    # BasicDB output "INSERT usertable user6284781860667377211 [...]".
    assert fnvhash64(0) == 6284781860667377211
    assert fnvhash64(1) == 8517097267634966620
    assert fnvhash64(2) == 1820151046732198393


def test_key_names():
    assert build_key_name(0) == "user6284781860667377211"
    assert build_key_name(1) == "user8517097267634966620"
    assert build_key_name(5, ordered_inserts=True) == "user5"
    assert build_key_name(5, ordered_inserts=True, zeropadding=8) == "user00000005"
    assert build_key_name(123456789, ordered_inserts=True, zeropadding=3) == "user123456789"
    for k in range(200):
        name = build_key_name(k)
        assert name.startswith("user") and name[4:].isdigit()


# ---------------------------------------------------------------- generators


def test_zipfian_head_matches_theory():
    n, samples = 1000, 100_000
    gen = ZipfianGenerator(0, n - 1, rng=random.Random(1))
    zeta = sum(1 / (i + 1) ** 0.99 for i in range(n))
    assert gen.zetan == pytest.approx(zeta, rel=1e-12)
    counts = collections.Counter(gen.next_value() for _ in range(samples))
    assert min(counts) >= 0 and max(counts) <= n - 1
    # P(0) = 1/zeta(n) and P(1) = 0.5^theta/zeta(n) exactly in Gray's algorithm
    assert counts[0] / samples == pytest.approx(1 / zeta, rel=0.04)
    assert counts[1] / samples == pytest.approx(0.5**0.99 / zeta, rel=0.06)
    head = [counts[i] for i in range(8)]
    assert head == sorted(head, reverse=True) and len(set(head)) == 8
    assert counts.most_common(1)[0][0] == 0


def test_zipfian_offset_range():
    gen = ZipfianGenerator(10, 19, rng=random.Random(4))
    vals = [gen.next_value() for _ in range(5000)]
    assert min(vals) == 10 and max(vals) <= 19
    assert collections.Counter(vals).most_common(1)[0][0] == 10


def test_zipfian_zeta_grows_incrementally():
    gen = ZipfianGenerator.for_items(100, rng=random.Random(5))
    assert gen.zetan == zetastatic(0, 100, 0.99)
    vals = [gen.next_long(200) for _ in range(5000)]
    assert gen.countforzeta == 200
    assert gen.zetan == pytest.approx(zetastatic(0, 200, 0.99), rel=1e-14)
    assert max(vals) < 200 and any(v >= 100 for v in vals)
    # shrinking keeps the larger zeta (YCSB's allowitemcountdecrease=false)
    gen.next_long(150)
    assert gen.countforzeta == 200


def test_scrambled_zipfian_spreads_hot_keys_but_keeps_skew():
    n, samples = 10_000, 100_000
    gen = ScrambledZipfianGenerator(0, n - 1, rng=random.Random(2))
    counts = collections.Counter(gen.next_value() for _ in range(samples))
    assert 0 <= min(counts) and max(counts) < n
    # the hottest item is zipfian item 0, hashed
    assert counts.most_common(1)[0][0] == fnvhash64(0) % n
    top10 = sorted(k for k, _ in counts.most_common(10))
    assert all(b - a > 1 for a, b in zip(top10, top10[1:]))  # not consecutive
    assert top10[-1] - top10[0] > n // 4  # spread over the key space
    top1pct = sum(c for _, c in counts.most_common(n // 100))
    assert top1pct / samples > 0.15  # uniform would give 1%


def test_scrambled_zipfian_offset():
    gen = ScrambledZipfianGenerator(1000, 1999, rng=random.Random(3))
    vals = [gen.next_value() for _ in range(2000)]
    assert min(vals) >= 1000 and max(vals) <= 1999


def test_uniform_covers_range_evenly():
    buckets, samples = 100, 100_000
    gen = UniformGenerator(0, buckets - 1, rng=random.Random(3))
    counts = collections.Counter(gen.next_value() for _ in range(samples))
    assert set(counts) == set(range(buckets))
    expected = samples / buckets
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(buckets))
    assert chi2 < 160  # df=99: the 99.99th percentile is ~150


def test_skewed_latest_favours_recent():
    counter = CounterGenerator(0)
    for _ in range(1000):
        counter.next_value()
    gen = SkewedLatestGenerator(counter, rng=random.Random(6))
    vals = [gen.next_value() for _ in range(20_000)]
    assert max(vals) == 999 and min(vals) >= 0
    counts = collections.Counter(vals)
    assert counts.most_common(1)[0][0] == 999
    assert sum(1 for v in vals if v >= 990) / len(vals) > 0.3  # 1% of items
    # the counter moves on: so does the hot spot
    for _ in range(500):
        counter.next_value()
    vals = [gen.next_value() for _ in range(5000)]
    assert collections.Counter(vals).most_common(1)[0][0] == 1499
    assert max(vals) == 1499


def test_acknowledged_counter():
    c = AcknowledgedCounterGenerator(10)
    assert c.last_value() == 9
    issued = [c.next_value() for _ in range(5)]
    assert issued == [10, 11, 12, 13, 14]
    assert c.last_value() == 9
    c.acknowledge(12)
    assert c.last_value() == 9
    c.acknowledge(10)
    assert c.last_value() == 10
    c.acknowledge(11)
    assert c.last_value() == 12
    c.acknowledge(14)
    assert c.last_value() == 12
    c.acknowledge(13)
    assert c.last_value() == 14
    with pytest.raises(ValueError):
        c.acknowledge(13)  # twice
    with pytest.raises(ValueError):
        c.acknowledge(15)  # never handed out
    small = AcknowledgedCounterGenerator(0, window_size=4)
    for _ in range(6):
        small.next_value()
    with pytest.raises(RuntimeError):
        small.acknowledge(5)


def test_discrete_generator():
    d = DiscreteGenerator(rng=random.Random(7))
    d.add_value(3, "x")
    d.add_value(1, "y")
    counts = collections.Counter(d.next_value() for _ in range(10_000))
    assert counts["x"] / 10_000 == pytest.approx(0.75, abs=0.02)
    assert d.last_value() in ("x", "y")


# ---------------------------------------------------------------- records


def test_build_values_sizes():
    rng = random.Random(8)
    values = build_values(rng)
    assert list(values) == [f"field{i}" for i in range(10)]
    for v in values.values():
        assert len(v) == 100 and v.isprintable() and v.isascii()
    assert len(set(values.values())) == 10
    varied = build_values(rng, fieldcount=3, fieldlength=50, field_length_distribution="uniform")
    assert len(varied) == 3 and all(1 <= len(v) <= 50 for v in varied.values())


# ---------------------------------------------------------------- workloads


def test_workload_definitions():
    assert WORKLOADS["a"].proportions() == {"read": 0.5, "update": 0.5, "insert": 0, "scan": 0, "readmodifywrite": 0}
    assert (WORKLOADS["d"].read, WORKLOADS["d"].insert, WORKLOADS["d"].request_distribution) == (0.95, 0.05, "latest")
    e = WORKLOADS["e"]
    assert (e.scan, e.insert, e.maxscanlength, e.scanlengthdistribution) == (0.95, 0.05, 100, "uniform")
    for w in WORKLOADS.values():
        assert (w.fieldcount, w.fieldlength, w.readallfields, w.writeallfields, w.insertorder) == (
            10,
            100,
            True,
            False,
            "hashed",
        )
        assert w.request_distribution == ("latest" if w.name == "d" else "zipfian")
    assert WORKLOADS["a"].with_request_distribution("uniform").request_distribution == "uniform"
    with pytest.raises(ValueError):
        WORKLOADS["a"].with_request_distribution("hotspot")


SPEC = {
    "a": {"read": 0.5, "update": 0.5},
    "b": {"read": 0.95, "update": 0.05},
    "c": {"read": 1.0},
    "d": {"read": 0.95, "insert": 0.05},
    "e": {"scan": 0.95, "insert": 0.05},
    "f": {"read": 0.5, "readmodifywrite": 0.5},
}


@pytest.mark.parametrize("name", sorted(SPEC))
def test_operation_mix(name):
    n = 20_000
    wl = CoreWorkload(WORKLOADS[name], 1000, random.Random(100 + ord(name)))
    kinds = collections.Counter()
    for _ in range(n):
        op = wl.next_operation()
        kinds[op.kind] += 1
        assert op.key == build_key_name(op.keynum)
        if op.kind == "insert":
            wl.acknowledge_insert(op.keynum)
    assert set(kinds) == set(SPEC[name])
    for kind, p in SPEC[name].items():
        assert kinds[kind] / n == pytest.approx(p, abs=0.02), kind


def test_operation_shapes():
    rng = random.Random(9)
    a = CoreWorkload("a", 1000, rng)
    seen = set()
    for _ in range(500):
        op = a.next_operation()
        seen.add(op.kind)
        assert 0 <= op.keynum < 1000  # the zipfian range has one extra keynum: redrawn
        if op.kind == "read":
            assert op.fields is None and op.values is None  # readallfields=true
        else:
            assert op.kind == "update"
            ((fname, value),) = op.values.items()  # writeallfields=false: one field
            assert fname in a.fieldnames and len(value) == 100
    assert seen == {"read", "update"}
    e = CoreWorkload("e", 1000, random.Random(10))
    lengths = []
    for _ in range(2000):
        op = e.next_operation()
        if op.kind == "scan":
            assert 1 <= op.scan_length <= 100 and op.values is None
            lengths.append(op.scan_length)
        else:
            assert op.kind == "insert" and len(op.values) == 10
            assert all(len(v) == 100 for v in op.values.values())
            e.acknowledge_insert(op.keynum)
    assert min(lengths) == 1 and max(lengths) == 100
    f = CoreWorkload("f", 1000, random.Random(11))
    rmw = [op for op in (f.next_operation() for _ in range(200)) if op.kind == "readmodifywrite"]
    assert rmw and all(op.fields is None and len(op.values) == 1 for op in rmw)


@pytest.mark.parametrize("name", ["d", "e"])
def test_inserts_use_new_keys_not_returned_before_ack(name):
    record_count = 500
    wl = CoreWorkload(name, record_count, random.Random(12), operation_count=4000)
    loaded = {build_key_name(k) for k in range(record_count)}
    pending: list[int] = []
    unacked: set[int] = set()
    inserted: list[int] = []
    rng = random.Random(13)
    for i in range(4000):
        op = wl.next_operation()
        if op.kind == "insert":
            assert op.key not in loaded
            inserted.append(op.keynum)
            pending.append(op.keynum)
            unacked.add(op.keynum)
        else:
            assert op.keynum not in unacked
            assert op.keynum <= wl.acknowledged_limit()
        # acknowledge late and out of order
        if len(pending) > 5 or (pending and i % 7 == 0):
            k = pending.pop(rng.randrange(len(pending)))
            wl.acknowledge_insert(k)
            unacked.discard(k)
    assert inserted == list(range(record_count, record_count + len(inserted)))
    assert len(inserted) > 100


def test_latest_reads_recent_inserts():
    wl = CoreWorkload("d", 1000, random.Random(14))
    reads = []
    for _ in range(10_000):
        op = wl.next_operation()
        if op.kind == "insert":
            wl.acknowledge_insert(op.keynum)
        else:
            reads.append((op.keynum, wl.acknowledged_limit()))
    assert wl.acknowledged_limit() > 1300
    near_latest = sum(1 for k, last in reads if last - k < 10)
    assert near_latest / len(reads) > 0.3
    assert sum(1 for k, _ in reads if k >= 1000) / len(reads) > 0.5  # mostly keys inserted during the run


def test_load_phase_and_overrides():
    wl = CoreWorkload("a", 5, random.Random(15))
    assert [wl.next_insert_key() for _ in range(5)] == [build_key_name(k) for k in range(5)]
    with pytest.raises(LoadComplete):
        wl.next_insert_key()
    part = CoreWorkload("a", 10, random.Random(16), insert_start=5, insert_count=3)
    ops = list(part.load_operations())
    assert [op.keynum for op in ops] == [5, 6, 7]
    assert all(op.kind == "insert" and len(op.values) == 10 for op in ops)
    uni = CoreWorkload("c", 1000, random.Random(17), request_distribution="uniform")
    keys = collections.Counter(uni.next_operation().keynum for _ in range(5000))
    assert keys.most_common(1)[0][1] < 20 and max(keys) <= 999
    ordered = CoreWorkload(WORKLOADS["c"].replace(insertorder="ordered"), 100, random.Random(18))
    assert ordered.next_insert_key() == "user0"
    with pytest.raises(ValueError):
        CoreWorkload("a", 0, random.Random(19))
    with pytest.raises(ValueError):
        Workload(request_distribution="exponential")


def test_deterministic_with_seed():
    def run(seed):
        wl = CoreWorkload("e", 1000, seed)
        out = []
        for _ in range(300):
            op = wl.next_operation()
            if op.kind == "insert":
                wl.acknowledge_insert(op.keynum)
            out.append(op)
        return out

    assert run(21) == run(21)
    assert run(21) != run(22)
