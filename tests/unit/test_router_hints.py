"""A client's `hint` on a count, update, delete or findAndModify reaches every shard part the
router sends (services/router/route.py): the broadcast of a multi write or a count, the shards a
single-document write tries in turn, and the parts sent again after a StaleConfig.  The shards'
planner takes it (tests/unit/test_shard_planner.py)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from schemas import shard as s
from services.router.route import OperationRouter, Stale
from tests.unit.test_targeting import ALL, NS, k_catalog

NO_MATCH: dict[str, dict] = {
    "Count": {"n": 1},
    "Update": {"matched": 0, "modified": 0},
    "Delete": {"deleted": 0},
    "FindAndModify": {"value": None, "lastErrorObject": {"n": 0, "updatedExisting": False}},
}


class Shards:
    """The shards as the router sees them through `_ask`: the first part sent is refused with
    StaleConfig, every other matches nothing (so a single-document write tries every target)."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, Any]] = []

    async def ask(self, shard: str, part: Any) -> dict:
        self.parts.append((shard, part))
        if len(self.parts) == 1:
            raise Stale(0)
        return dict(NO_MATCH[part.type])


def router() -> tuple[OperationRouter, Shards]:
    async def wait_for(config_time: int, timeout: float) -> None:
        return None

    follower = types.SimpleNamespace(catalog=k_catalog(), config_time=7, wait_for=wait_for)
    r = OperationRouter(None, follower, None, "cursors", None)  # type: ignore[arg-type]
    shards = Shards()
    r._ask = shards.ask  # type: ignore[method-assign]
    return r, shards


@pytest.mark.parametrize("hint", ["a_1", {"a": 1}, {"$natural": 1}])
@pytest.mark.parametrize(
    "req",
    [
        s.Count(ns=NS, filter={"a": 3}),
        s.Update(ns=NS, filter={"a": 3}, update={"$set": {"x": 1}}, multi=True),
        s.Update(ns=NS, filter={"a": 3}, update={"$set": {"x": 1}}),  # tried shard by shard
        s.Delete(ns=NS, filter={"a": 3}, multi=True),
        s.Delete(ns=NS, filter={"a": 3}, stmtId=4),
        s.FindAndModify(ns=NS, query={"a": 3}, remove=True),
    ],
    ids=["count", "updateMany", "updateOne", "deleteMany", "deleteOne", "findAndModify"],
)
async def test_every_shard_part_carries_the_hint(req, hint):
    r, shards = router()
    await r.handle(req.model_copy(update={"hint": hint}))
    assert r.stale_retries == 1
    sent = [shard for shard, _ in shards.parts]
    # The first attempt (refused: StaleConfig) and the retry each reach every shard: no shard key in
    # the filter.  (A broadcast sends all at once; a single-document write stops at the refusal.)
    first = 1 if req.type in ("Update", "Delete", "FindAndModify") and not getattr(req, "multi", False) else 4
    assert len(sent) == first + 4 and set(sent[first:]) == ALL
    for shard, part in shards.parts:
        assert type(part) is type(req) and part.hint == hint, (shard, part)
        assert part.routing is not None and part.routing.configTime == 7
        assert part.model_dump(exclude={"hint", "routing", "stmtIds", "lsid", "txnNumber"}) == req.model_dump(
            exclude={"hint", "routing", "stmtIds", "lsid", "txnNumber"}
        )


@pytest.mark.parametrize("req", [s.Count(ns=NS), s.Delete(ns=NS, filter={}, multi=True)])
async def test_no_hint_stays_no_hint(req):
    r, shards = router()
    await r.handle(req)
    assert shards.parts and all(part.hint is None for _, part in shards.parts)
