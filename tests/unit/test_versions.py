"""domain.versions: chunk, shard, collection and database version arithmetic.

Unit tests pin the rules taken from MongoDB's sharding internals; property tests
replay random splits, merges and migrations on a model collection (a list of
(shard, version) chunks) and check the invariants every router and shard relies on.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.versions import (
    ChunkVersion,
    DatabaseVersion,
    collection_version,
    hashed_split_points,
    initial_versions,
    merge_version,
    migration_versions,
    moved_primary,
    new_database_version,
    new_epoch,
    new_uuid,
    shard_version,
    split_versions,
)

PROPERTY = settings(max_examples=200, deadline=None)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
E = "0123456789abcdef01234567"


def v(major: int, minor: int, epoch: str = E) -> ChunkVersion:
    return ChunkVersion(major, minor, epoch)


# ------------------------------------------------------------ ChunkVersion


def test_chunk_version_basics():
    a = v(2, 3)
    assert a.pair == (2, 3)
    assert str(a) == f"2|3||{E}"
    assert a == v(2, 3) and hash(a) == hash(v(2, 3))
    assert a.same_epoch(v(9, 9)) and not a.same_epoch(v(2, 3, "other"))


@pytest.mark.parametrize("major,minor", [(-1, 0), (0, -1), (-5, -5)])
def test_chunk_version_rejects_negatives(major, minor):
    with pytest.raises(ValueError, match="must be >= 0"):
        ChunkVersion(major, minor, E)


def test_chunk_version_is_immutable():
    with pytest.raises(AttributeError):
        v(1, 0).major = 2  # type: ignore[misc]


def test_older_than_orders_major_then_minor():
    assert v(1, 5).older_than(v(2, 0))
    assert v(1, 0).older_than(v(1, 1))
    assert not v(2, 0).older_than(v(1, 99))
    assert not v(1, 1).older_than(v(1, 1))


def test_versions_of_different_epochs_are_not_comparable():
    with pytest.raises(ValueError, match="different epochs"):
        v(1, 0, "a").older_than(v(2, 0, "b"))
    with pytest.raises(ValueError, match="different epochs"):
        v(5, 0, "a").older_than(v(1, 0, "b"))


@PROPERTY
@given(
    st.tuples(st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.integers(0, 50), st.integers(0, 50)),
    st.text(min_size=1, max_size=4),
    st.text(min_size=1, max_size=4),
)
def test_older_than_is_tuple_order_within_an_epoch_and_refused_across(p, q, e1, e2):
    a, b = ChunkVersion(*p, e1), ChunkVersion(*q, e2)
    if e1 == e2:
        assert a.older_than(b) == (p < q)
        assert not (a.older_than(b) and b.older_than(a))
    else:
        with pytest.raises(ValueError):
            a.older_than(b)


# ------------------------------------------------------- epochs and uuids


def test_new_epoch_is_objectid_like_and_fresh():
    before = int(time.time())
    e = new_epoch()
    after = int(time.time())
    assert re.fullmatch(r"[0-9a-f]{24}", e)
    assert before <= int(e[:8], 16) <= after
    assert len({new_epoch() for _ in range(100)}) == 100


def test_new_uuid_is_a_uuid4():
    u = new_uuid()
    assert uuid.UUID(u).version == 4 and str(uuid.UUID(u)) == u
    assert new_uuid() != u


# ------------------------------------------------- collection and shard versions


def test_initial_versions():
    assert [x.pair for x in initial_versions(E, 1)] == [(1, 0)]
    vs = initial_versions(E, 4)
    assert [x.pair for x in vs] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert all(x.epoch == E for x in vs)
    assert collection_version(vs) == v(1, 3)


@pytest.mark.parametrize("n", [0, -1])
def test_initial_versions_needs_a_chunk(n):
    with pytest.raises(ValueError, match="at least one chunk"):
        initial_versions(E, n)


def test_collection_version_is_the_highest():
    assert collection_version([v(1, 7), v(2, 0), v(1, 9)]) == v(2, 0)
    with pytest.raises(ValueError):
        collection_version([])


def test_shard_version():
    assert shard_version([v(1, 2), v(3, 1), v(3, 0)], E) == v(3, 1)
    assert shard_version([], E) == v(0, 0)
    assert shard_version(iter(()), "ep").epoch == "ep"


def test_split_versions():
    assert [x.pair for x in split_versions(v(3, 4), 2)] == [(3, 5), (3, 6)]
    assert [x.pair for x in split_versions(v(1, 0), 4)] == [(1, 1), (1, 2), (1, 3), (1, 4)]
    assert all(x.epoch == E for x in split_versions(v(1, 0), 3))
    for pieces in (1, 0, -3):
        with pytest.raises(ValueError, match="at least two"):
            split_versions(v(1, 0), pieces)


def test_merge_version():
    assert merge_version(v(4, 9)) == v(4, 10)


def test_migration_versions():
    moved, control = migration_versions(v(3, 7), donor_keeps_chunks=True)
    assert (moved, control) == (v(4, 0), v(4, 1))
    moved, control = migration_versions(v(3, 7), donor_keeps_chunks=False)
    assert (moved, control) == (v(4, 0), None)


# ------------------------------------------------------ database versions


def test_database_versions():
    d = new_database_version()
    assert d.last_mod == 1 and uuid.UUID(d.uuid).version == 4
    m = moved_primary(d)
    assert m == DatabaseVersion(d.uuid, 2) and moved_primary(m).last_mod == 3
    assert str(m) == f"{d.uuid}|2"
    assert new_database_version().uuid != d.uuid
    with pytest.raises(AttributeError):
        d.last_mod = 5  # type: ignore[misc]


@PROPERTY
@given(st.integers(0, 30))
def test_each_primary_move_bumps_last_mod_by_one(moves):
    d = new_database_version()
    for _ in range(moves):
        d2 = moved_primary(d)
        assert d2.uuid == d.uuid and d2.last_mod == d.last_mod + 1
        d = d2
    assert d.last_mod == 1 + moves


# ----------------------------------------------- hashed presplit points


def test_hashed_split_points_small():
    assert hashed_split_points(1) == []
    assert hashed_split_points(2) == [0]
    third = INT64_MAX // 3
    assert hashed_split_points(3) == [-third, third]
    q = (INT64_MAX // 4) * 2
    assert hashed_split_points(4) == [-q, 0, q]


def test_hashed_split_points_match_mongodb():
    # What MongoDB shows for {x: "hashed"} presplit on 6 shards (2 chunks each).
    step = 1537228672809129300
    assert hashed_split_points(12) == [i * step for i in range(-5, 6)]
    assert hashed_split_points(12)[0] == -7686143364045646500


@pytest.mark.parametrize("n", [0, -1, -100])
def test_hashed_split_points_need_a_chunk(n):
    with pytest.raises(ValueError, match="at least 1"):
        hashed_split_points(n)


@PROPERTY
@given(st.integers(1, 300) | st.integers(1, 3 * 8192))
def test_hashed_split_points_properties(n):
    points = hashed_split_points(n)
    assert len(points) == n - 1
    assert points == sorted(set(points))  # sorted, distinct
    assert all(INT64_MIN < p < INT64_MAX for p in points)
    assert all(type(p) is int for p in points)
    assert set(points) == {-p for p in points}  # symmetric around 0
    assert (0 in points) == (n % 2 == 0)
    if n == 1:
        return
    interval = (INT64_MAX // n) * 2
    gaps = [b - a for a, b in zip(points, points[1:])]
    assert all(g == interval for g in gaps)  # evenly spaced
    # The two outer chunks share the rounding remainder, equally (counting MaxKey's side inclusive).
    low, high = points[0] - INT64_MIN, INT64_MAX - points[-1] + 1
    assert low == high == interval + INT64_MAX % n + 1
    assert low - interval <= n


# --------------------------------------------- model collection: random histories

SHARDS = ("s0", "s1", "s2")

# An operation on the model: ("split", chunk index, pieces) | ("merge", start, length)
# | ("move", chunk index, recipient shard, control-chunk choice).
op = st.one_of(
    st.tuples(st.just("split"), st.integers(0, 10_000), st.integers(2, 5)),
    st.tuples(st.just("merge"), st.integers(0, 10_000), st.integers(2, 4)),
    st.tuples(st.just("move"), st.integers(0, 10_000), st.sampled_from(SHARDS), st.integers(0, 10_000)),
)


def shard_versions(chunks: list[tuple[str, ChunkVersion]], epoch: str) -> dict[str, ChunkVersion]:
    return {s: shard_version((cv for sh, cv in chunks if sh == s), epoch) for s in SHARDS}


def apply_op(chunks: list[tuple[str, ChunkVersion]], o) -> tuple[list[tuple[str, ChunkVersion]], str | None]:
    """The model after `o` (chunks in key order), and the kind applied (None: not applicable)."""
    cv = collection_version(x for _, x in chunks)
    kind = o[0]
    if kind == "split":
        i = o[1] % len(chunks)
        shard = chunks[i][0]
        return chunks[:i] + [(shard, x) for x in split_versions(cv, o[2])] + chunks[i + 1 :], kind
    if kind == "merge":
        i = o[1] % len(chunks)
        run = chunks[i : i + o[2]]
        if len(run) < 2 or len({s for s, _ in run}) != 1:
            return chunks, None  # merging needs >= 2 contiguous chunks on one shard
        return chunks[:i] + [(run[0][0], merge_version(cv))] + chunks[i + len(run) :], kind
    i, to = o[1] % len(chunks), o[2]
    donor = chunks[i][0]
    if to == donor:
        return chunks, None
    left = [j for j, (s, _) in enumerate(chunks) if s == donor and j != i]
    moved, control = migration_versions(cv, donor_keeps_chunks=bool(left))
    out = list(chunks)
    out[i] = (to, moved)
    if left:
        j = left[o[3] % len(left)]  # any chunk the donor keeps may become its control chunk
        out[j] = (donor, control)
    return out, kind


@PROPERTY
@given(st.integers(1, 6), st.sampled_from(SHARDS), st.lists(op, max_size=40))
def test_random_histories_keep_version_invariants(n0, first_shard, ops):
    epoch = new_epoch()
    chunks = [
        (SHARDS[(i + SHARDS.index(first_shard)) % len(SHARDS)], x) for i, x in enumerate(initial_versions(epoch, n0))
    ]
    for o in ops:
        before_cv = collection_version(x for _, x in chunks)
        before_sv = shard_versions(chunks, epoch)
        after, kind = apply_op(chunks, o)
        if kind is None:
            continue
        cv = collection_version(x for _, x in after)
        sv = shard_versions(after, epoch)

        # versions stay unique within the collection, all in its epoch
        assert len({x.pair for _, x in after}) == len(after)
        assert all(x.epoch == epoch for _, x in after)
        # every operation strictly raises the collection version
        assert before_cv.older_than(cv)
        if kind in ("split", "merge"):
            assert cv.major == before_cv.major  # split and merge keep the major
            assert cv.minor > before_cv.minor
            changed = {s for s in SHARDS if sv[s] != before_sv[s]}
            assert len(changed) == 1 and sv[next(iter(changed))] == cv  # only the owner's version, to the new cv
            delta = len(after) - len(chunks)
            assert (delta >= 1) if kind == "split" else (delta <= -1)
        else:
            donor, to = chunks[o[1] % len(chunks)][0], o[2]
            assert cv.major == before_cv.major + 1 and cv.minor in (0, 1)  # migration: major + 1, exactly
            assert sv[to] == ChunkVersion(before_cv.major + 1, 0, epoch)  # the recipient: the moved chunk's version
            if any(s == donor for s, _ in after):
                assert sv[donor] == ChunkVersion(before_cv.major + 1, 1, epoch) == cv
            else:
                assert sv[donor] == ChunkVersion(0, 0, epoch)
            assert len(after) == len(chunks)
        # a shard's version never decreases, except a donor emptied to (0, 0)
        for s in SHARDS:
            if sv[s].older_than(before_sv[s]):
                assert kind == "move" and s == chunks[o[1] % len(chunks)][0] and sv[s].pair == (0, 0)
        # the collection version is the highest shard version
        assert cv == max(sv.values(), key=lambda x: x.pair)
        chunks = after


def test_migration_recipient_and_donor_versions_by_hand():
    # s0: (1,0) (1,1); s1: (1,2).  Move s1's only chunk to s0: s1 -> (0,0), s0 -> (2,0) the moved chunk.
    chunks = [("s0", v(1, 0)), ("s0", v(1, 1)), ("s1", v(1, 2))]
    after, kind = apply_op(chunks, ("move", 2, "s0", 0))
    assert kind == "move"
    sv = shard_versions(after, E)
    assert sv["s1"] == v(0, 0) and sv["s0"] == v(2, 0)
    # Move one of s0's chunks to s1: recipient (3,0), donor's control chunk (3,1).
    after2, _ = apply_op(after, ("move", 0, "s1", 0))
    sv2 = shard_versions(after2, E)
    assert sv2["s1"] == v(3, 0) and sv2["s0"] == v(3, 1)
    assert collection_version(x for _, x in after2) == v(3, 1)
