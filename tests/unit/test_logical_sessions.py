"""The sessions store's fold, the router's logical session cache, and lsid checks (pure)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.logical_sessions import SessionCache, SessionsView, check_lsid, check_lsids, expired, timeout_ms
from domain.protocol import ErrorCode
from domain.settings import ClusterSettings, validated
from libs.errors import CommandError
from libs.topics import Topics
from schemas import Codec
from schemas.sessions import Session

MIN = 60_000


def lsid() -> dict:
    return {"id": str(uuid.uuid4())}


def test_settings_defaults_and_fractions():
    s = ClusterSettings()
    assert s.logicalSessionTimeoutMinutes == 30 and s.logicalSessionRefreshMillis == 300_000
    assert timeout_ms(s) == 30 * MIN
    short = validated(ClusterSettings, s, "logicalSessionTimeoutMinutes", 0.05)
    assert timeout_ms(short) == 3000  # fractions of a minute: tests use seconds
    for bad in (0, -1):
        with pytest.raises(ValueError, match="logicalSessionTimeoutMinutes"):
            validated(ClusterSettings, s, "logicalSessionTimeoutMinutes", bad)
    with pytest.raises(ValueError, match="logicalSessionRefreshMillis"):
        validated(ClusterSettings, s, "logicalSessionRefreshMillis", 0)


def test_the_sessions_topic_is_a_compacted_core_topic():
    t = Topics("c")
    spec = next(s for s in t.core() if s.name == t.sessions)
    assert t.sessions == "c.sessions" and spec.config["cleanup.policy"] == "compact"


def test_expired_is_older_than_the_timeout():
    assert not expired(1000, now=1999, timeout=1000)
    assert expired(1000, now=2000, timeout=1000)


def test_the_view_folds_upserts_and_tombstones():
    a, b = lsid(), lsid()
    view = SessionsView()
    view.apply(a["id"].encode(), Codec.encode(Session(lsid=a, lastUse=100)))
    view.apply(b["id"].encode(), Codec.encode(Session(lsid=b, lastUse=100)))
    view.apply(a["id"].encode(), Codec.encode(Session(lsid=a, lastUse=500)))
    view.apply(b["id"].encode(), None)
    view.apply(b"junk", b"not json")  # unreadable: skipped, not fatal
    assert set(view.sessions) == {a["id"]} and view.sessions[a["id"]].lastUse == 500
    assert view.is_live(a["id"], now=1000, timeout=1000) and not view.is_live(a["id"], now=1500, timeout=1000)
    assert not view.is_live(b["id"], now=0, timeout=1000)


def test_a_flush_writes_sessions_used_since_the_last_one():
    cache, a, b = SessionCache(), lsid(), lsid()
    cache.use(a, 100)
    cache.use(b, 200)
    first = cache.flush(300, MIN, {})
    assert {s.lsid["id"]: s.lastUse for s in first.upserts} == {a["id"]: 100, b["id"]: 200}
    assert first.tombstones == []
    assert cache.flush(400, MIN, {}).upserts == []  # nothing used since
    cache.use(a, 500)
    assert [(s.lsid, s.lastUse) for s in cache.flush(600, MIN, {}).upserts] == [(a, 500)]


def test_a_flush_leaves_a_later_use_in_the_store_alone():
    cache, a = SessionCache(), lsid()
    cache.use(a, 100)
    assert cache.flush(300, MIN, {a["id"]: Session(lsid=a, lastUse=250)}).upserts == []


def test_a_flush_tombstones_expired_sessions_of_the_store_and_drops_expired_ones_from_the_cache():
    cache, mine, other, fresh = SessionCache(), lsid(), lsid(), lsid()
    cache.use(mine, 0)
    store = {
        mine["id"]: Session(lsid=mine, lastUse=0),
        other["id"]: Session(lsid=other, lastUse=10),
        fresh["id"]: Session(lsid=fresh, lastUse=50_000),
    }
    plan = cache.flush(MIN + 20, MIN, store)
    assert plan.tombstones == sorted([mine["id"], other["id"]])  # the fresh one stays
    assert plan.upserts == [] and cache.sessions == {}


def test_a_session_used_here_is_not_tombstoned_even_when_the_store_has_it_expired():
    cache, a = SessionCache(), lsid()
    cache.use(a, MIN + 10)
    plan = cache.flush(MIN + 20, MIN, {a["id"]: Session(lsid=a, lastUse=0)})
    assert plan.tombstones == [] and [s.lastUse for s in plan.upserts] == [MIN + 10]


def test_ended_sessions_leave_the_cache():
    cache, a, b = SessionCache(), lsid(), lsid()
    cache.use(a, 1)
    cache.use(b, 1)
    cache.end([a["id"], str(uuid.uuid4())])
    assert set(cache.sessions) == {b["id"]}


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10 * MIN)), max_size=40), st.integers(0, 12 * MIN))
def test_flush_invariants(uses, now):
    """Whatever the uses: nothing upserted is expired, nothing tombstoned is still cached, and an
    upsert carries the latest use the cache saw."""
    ids = [lsid() for _ in range(6)]
    cache = SessionCache()
    latest: dict[str, int] = {}
    for i, t in uses:
        t = min(t, now)
        cache.use(ids[i], t)
        latest[ids[i]["id"]] = max(latest.get(ids[i]["id"], -1), t)
    store = {x["id"]: Session(lsid=x, lastUse=0) for x in ids[:3]}
    plan = cache.flush(now, 5 * MIN, store)
    for s in plan.upserts:
        assert not expired(s.lastUse, now, 5 * MIN) and s.lastUse == latest[s.lsid["id"]]
    assert not set(plan.tombstones) & set(cache.sessions)
    assert all(not expired(c.last_use, now, 5 * MIN) for c in cache.sessions.values())


@pytest.mark.parametrize(
    "bad, code",
    [
        ("abc", ErrorCode.TypeMismatch),
        ([{"id": 1}], ErrorCode.TypeMismatch),
        (["x"], ErrorCode.TypeMismatch),
        ([{}], ErrorCode.IDLFailedToParse),
        ([{"id": "not-a-uuid"}], ErrorCode.BadValue),
        ([{"id": str(uuid.uuid4()), "extra": 1}], ErrorCode.IDLUnknownField),
        ([None], ErrorCode.TypeMismatch),
        ([{"id": str(uuid.uuid4())}, None], ErrorCode.TypeMismatch),  # one bad lsid refuses them all
    ],
)
def test_malformed_lsids_get_mongodbs_errors(bad, code):
    with pytest.raises(CommandError) as e:
        check_lsids(bad, "endSessions")
    assert e.value.code == code


def test_a_well_formed_lsid_is_normalised():
    u = uuid.uuid4()
    assert check_lsid({"id": str(u).upper()}) == {"id": str(u)}
    assert check_lsids([], "endSessions") == []
