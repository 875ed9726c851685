"""The shard's session reaper: which sessions' records may go (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.shard.sessions import forgettable

T = 1800.0  # the default timeout, seconds


def test_expired_and_not_live_sessions_are_forgotten():
    entries = [("old", 0.0), ("recent", 5000.0), ("old-but-live", 0.0), ("edge", 5000.0 - T)]
    live = {"old-but-live"}
    assert forgettable(entries, live.__contains__, now_s=5000.0, timeout_s=T) == ["edge", "old"]


def test_a_recent_write_keeps_a_session_missing_from_the_store():
    """Not yet flushed by its router (or ended a moment ago): its last write protects it."""
    assert forgettable([("new", 4999.0)], lambda _: False, now_s=5000.0, timeout_s=T) == []


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 10_000)), max_size=30),
    st.sets(st.sampled_from("abcdef")),
    st.floats(0, 20_000),
)
def test_never_a_live_session_nor_a_recent_write(entries, live, now):
    out = forgettable(entries, live.__contains__, now_s=now, timeout_s=T)
    assert out == sorted(set(out))
    for lsid in out:
        assert lsid not in live
        assert any(e == lsid and w <= now - T for e, w in entries)
    for lsid, w in entries:
        if w <= now - T and lsid not in live:
            assert lsid in out
