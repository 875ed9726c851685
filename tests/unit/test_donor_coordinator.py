"""The donor's migration coordinator (services/shard/donor.py) between two activations of its
instance, without Kafka: its requests to its own shard are decided by the shard's decider over
a real store (tests/shard_harness.py), its requests elsewhere answered ok, its catalog changed
by the config server's own decisions.  The whole cluster is the simulator's (tests/sim/)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from domain.catalog import Catalog
from libs.requests import RequestTimeout
from libs.topics import Topics
from schemas import Record
from schemas import config as c
from schemas import shard as s
from schemas.reply import Reply
from services.shard.donor import DonorCoordinator, DonorDeps, NotActive
from services.shard.statistics import CountingDocuments
from tests.shard_harness import ShardHarness

DB, NS = "d", "d.c"
LO, HI = {"k": 0}, {"k": 50}  # inside the chunk [MinKey, 100), owned by shard a
CUT_OFF, RESUMED = "m0", "m1"
TOPICS = Topics("t")


class Follower:
    """The catalog view: the harness's catalog, already at every ConfigTime asked for."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    @property
    def config_time(self) -> int:
        return self.catalog.config_time

    async def wait_for(self, config_time: int, timeout: float = 30.0) -> None:
        pass


class Requester:
    """Requests to shard a decided by the harness (and committed), as its processor would; any
    other answered ok.  `before[type]` runs before a request of that type is answered."""

    inbox = "t.inbox.test"

    def __init__(self, shard: ShardHarness) -> None:
        self.shard = shard
        self.sent: list[Record] = []
        self.before: dict[str, Callable[[], None]] = {}

    async def request(self, topic: str, req: Record, *, timeout: float, headers: Any = None) -> Reply:
        self.sent.append(req)
        if (hook := self.before.pop(req.type, None)) is not None:
            hook()
        if topic != TOPICS.shard_requests(self.shard.shard_id):
            return Reply(ok=True, result={})
        _, result = self.shard.run(req)
        self.shard.commit()
        return Reply(ok=True, result=result)


@pytest.fixture
def shard(tmp_path):
    setup = [
        c.CreateDatabase(db=DB, primary="a"),
        c.ShardCollection(ns=NS, key={"k": 1}),
        c.SplitChunk(ns=NS, at=[{"k": 100}]),
    ]
    h = ShardHarness(tmp_path, "a", setup=setup, documents=CountingDocuments())
    yield h
    h.close()


def requested(shard: ShardHarness, mid: str) -> None:
    epoch = shard.catalog.collections[NS].epoch
    shard.catalog_apply([c.MigrationRequested(id=mid, ns=NS, epoch=epoch, min=LO, max=HI, donor="a", recipient="b")])


async def test_a_donation_cut_short_by_a_takeover_does_not_hold_back_the_migration_resumed_later(shard):
    """Seed 5328: shard a's instance is cut off in migration m0 and a standby takes over; it
    aborts m0 and commits m1 (a balancer round's), but crashes before recording m1's decision.
    The first instance, active again, resumes m1 as the catalog decided it: it must record the
    decision (its range-deletion task ready), not check each step against m0, whose run ended
    with NotActive (every step refused, the task pending for ever)."""
    active = asyncio.Event()
    active.set()
    requester = Requester(shard)
    coordinator = DonorCoordinator(
        DonorDeps(
            shard_id="a",
            topics=TOPICS,
            bus=None,  # only the mods read it
            requester=requester,
            follower=Follower(shard.catalog),
            active=active,
            documents=shard.documents,
            changelog_position=lambda: 0,
            progress={},
        )
    )

    # m0 registered on a; then the instance is cut off: no answer from b, and it is a standby now.
    requested(shard, CUT_OFF)

    def cut_off() -> None:
        active.clear()
        raise RequestTimeout("no reply from t.shard.b.requests within 10s")

    requester.before["StartReceipt"] = cut_off
    with pytest.raises(NotActive):
        await coordinator.donate(shard.catalog.migrations[CUT_OFF])
    assert shard.documents.migrations[CUT_OFF].decision is None

    # The standby's turn: m0 aborted and forgotten; m1 registered and committed; then it crashes.
    shard.config(c.AbortMigration(id=CUT_OFF, reason="the donor restarted during the migration"))
    shard.run(s.RecordDecision(id=CUT_OFF, committed=False, configTime=shard.catalog.config_time))
    shard.run(s.ForgetMigration(id=CUT_OFF))
    requested(shard, RESUMED)
    epoch = shard.catalog.collections[NS].epoch
    shard.run(s.StartDonation(id=RESUMED, ns=NS, epoch=epoch, min=LO, max=HI, recipient="b"))
    shard.run(s.EnterCriticalSection(id=RESUMED))
    shard.run(s.EnterCriticalSection(id=RESUMED, reads=True))
    shard.commit()
    assert shard.config(c.CommitMigration(id=RESUMED, min=LO, max=HI))["outcome"] == "committed"
    assert shard.catalog.outcomes[RESUMED] == "committed"

    # The first instance is active again and finds m1's document, undecided.
    active.set()
    await coordinator.resume(shard.documents.migrations[RESUMED])

    decided = [r for r in requester.sent if isinstance(r, s.RecordDecision) and r.id == RESUMED]
    assert [r.committed for r in decided] == [True]
    task = shard.documents.range_tasks[RESUMED]
    assert not task.pending and task.why == "donated to b"
    assert RESUMED not in shard.documents.migrations  # finished and forgotten
