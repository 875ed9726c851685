"""A shard's history (docs/decisions/0019) against the model issue 32 states: for random writes,
deletes and reclaims, a read at any retained cluster time T equals a replay of the writes stamped
at or before T.  Against a real RocksDB store."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.store import Store
from services.shard import history as h

KEYS = [b"d/a\x00" + bytes([i]) for i in range(6)]

# A write: (key index, value or None for a delete); stamps are given in order, one per write.
writes = st.lists(st.tuples(st.integers(0, len(KEYS) - 1), st.one_of(st.none(), st.binary(min_size=0, max_size=3))))


def model(log: list[tuple[int, bytes, bytes | None]], at: int) -> dict[bytes, bytes]:
    """A replay of the writes stamped at or before `at`."""
    state: dict[bytes, bytes] = {}
    for ts, key, value in log:
        if ts > at:
            break
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def fold(store: Store, ops: list[tuple[int, bytes | None]], batch_size: int) -> list[tuple[int, bytes, bytes | None]]:
    """Fold the writes as a shard does: in batches, each key's prior read through the batch's
    pending changes, history recorded beside the write."""
    log = []
    stamps = itertools.count(10, 3)
    for start in range(0, len(ops), batch_size):
        changes: dict[bytes, bytes | None] = {}
        for i, value in ops[start : start + batch_size]:
            key, ts = KEYS[i], next(stamps)
            prior = changes[key] if key in changes else store.get(key)
            h.record(changes, key, prior, ts)
            changes[key] = value
            log.append((ts, key, value))
        store.commit(changes.items(), None)
    return log


def read_at(store: Store, at: int) -> dict[bytes, bytes]:
    latest = ((k, v) for k, v in store.scan(b"d/"))
    start, stop = h.history_range(b"d/", b"d0")
    past = ((k, v) for k, v in store.scan(h.HISTORY) if start <= k < stop)
    return dict(h.as_of(latest, past, at))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "db")
    yield s
    s.close()


@settings(max_examples=80, deadline=None)
@given(ops=writes, batch_size=st.integers(1, 5), cut=st.integers(0, 200))
def test_a_read_at_any_retained_time_equals_a_replay_up_to_it(tmp_path_factory, ops, batch_size, cut):
    store = Store(tmp_path_factory.mktemp("history") / "db")
    try:
        log = fold(store, ops, batch_size)
        last = log[-1][0] if log else 10
        h.reclaim(store, cut, limit=3)  # partly: the readable time moves only as far as it got
        oldest = h.readable_from(store)
        for at in range(oldest, last + 2):
            assert read_at(store, at) == model(log, at), f"at {at} (readable from {oldest})"
            for key in KEYS:
                one = h.value_at(store.get(key), iter(list(store.scan(h.history_of(key)))), at)
                assert one == model(log, at).get(key), (at, key)
    finally:
        store.close()


def test_reclaim_deletes_only_what_is_older_than_its_bound_and_says_where_reads_may_start(store):
    log = fold(store, [(0, b"x"), (0, b"y"), (1, b"z"), (0, None)], 1)  # stamps 10, 13, 16, 19
    assert [ts for ts, _, _ in log] == [10, 13, 16, 19]
    assert h.readable_from(store) == 0
    deleted, done = h.reclaim(store, 14)
    assert (deleted, done) == (2, True) and h.readable_from(store) == 14
    assert read_at(store, 14) == {KEYS[0]: b"y"} and read_at(store, 16) == {KEYS[0]: b"y", KEYS[1]: b"z"}
    assert read_at(store, 19) == {KEYS[1]: b"z"}
    assert len(list(store.scan(h.BY_TIME))) == 2
    deleted, done = h.reclaim(store, 100, limit=1)
    assert (deleted, done) == (1, False) and h.readable_from(store) == 16
    assert h.reclaim(store, 10) == (0, True) and h.readable_from(store) == 16, "the readable time never goes back"


def test_history_keys_are_told_apart_from_the_state():
    changes: dict[bytes, bytes | None] = {}
    h.record(changes, KEYS[0], None, 5)
    h.record(changes, KEYS[0], b"again", 5)  # the same event changing the key twice keeps the first prior
    assert all(h.is_history(k) for k in changes) and not h.is_history(KEYS[0])
    assert changes[h.history_of(KEYS[0]) + (5).to_bytes(8, "big")] == h.TAG_ABSENT
