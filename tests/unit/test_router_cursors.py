"""The router's cursors (services/router/route.py): a cursor times out after CURSOR_TIMEOUT_S
idle, counted from its last getMore as MongoDB counts it; find's noCursorTimeout keeps it; and
the namespace a getMore must name is kept with it."""

from __future__ import annotations

import pytest

from domain.protocol import CURSOR_TIMEOUT_S
from libs.errors import CommandError
from schemas import shard as s
from services.router import route
from services.router.route import OperationRouter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(route.time, "monotonic", c)
    return c


def router() -> OperationRouter:
    return OperationRouter(None, None, None, "cursors", None)  # type: ignore[arg-type]


def test_a_cursor_read_now_and_then_outlives_the_idle_timeout(clock: Clock) -> None:
    r = router()
    cid = r.open_cursor([{"_id": i} for i in range(10)], 1)["cursorId"]
    for _ in range(5):  # each getMore inside the timeout: alive for 2.5 timeouts in all
        clock.now += CURSOR_TIMEOUT_S / 2
        r.open_cursor([], 1)  # any new cursor reaps the idle ones first
        assert r.get_more(s.GetMore(cursorId=cid, batchSize=1))["docs"]
    clock.now += CURSOR_TIMEOUT_S + 1
    r.open_cursor([], 1)
    with pytest.raises(CommandError) as e:
        r.get_more(s.GetMore(cursorId=cid, batchSize=1))
    assert e.value.code == "CursorNotFound"


def test_no_cursor_timeout_keeps_an_idle_cursor_until_killed(clock: Clock) -> None:
    r = router()
    kept = r.open_cursor([{"_id": i} for i in range(3)], 1)["cursorId"]
    dropped = r.open_cursor([{"_id": i} for i in range(3)], 1)["cursorId"]
    r.tag_cursor(kept, "db.c", no_timeout=True)
    r.tag_cursor(dropped, "db.c")
    clock.now += 10 * CURSOR_TIMEOUT_S
    r.open_cursor([], 1)
    assert kept in r.cursors and dropped not in r.cursors
    assert r.get_more(s.GetMore(cursorId=kept, batchSize=1))["docs"] == [{"_id": 1}]
    assert r.cursors[kept].ns == "db.c" and r.cursors[kept].no_timeout  # kept across getMores
    assert r.kill_cursors([kept]) == ([kept], [])
