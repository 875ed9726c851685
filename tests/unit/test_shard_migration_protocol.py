"""The shard's side of the migration protocol, role by role, without Kafka: every transition
of the donor, the recipient and range deletion, and every refusal, as a table of
(migration documents and tasks the shard holds, request) -> (state left, events, fault point
fired) or the error code.  Decided by the MigrationDecider over a real document store and a
catalog built by the config server's own decisions, with the clock and fault points injected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from domain.catalog import Migration
from domain.protocol import ErrorCode
from domain.shardkey import KeyPattern
from libs.errors import CommandError
from libs.store import Store
from schemas import Record
from schemas import config as c
from schemas import shard as s
from services.config.decide import decide as config_decide
from services.shard.decide import ShardDecider
from services.shard.documents import UNSHARDED_KEY
from services.shard.migrations import MigrationDecider
from services.shard.protocol.donor import CannotDonate, DonorState, donation_range
from services.shard.protocol.range_deletion import TaskState, state_of
from services.shard.protocol.recipient import RecipientState
from tests.shard_harness import ShardHarness

NOW = 1_700_000_000.0
DB, NS, UNSHARDED = "d", "d.c", "d.u"
MID, OTHER = "m1", "m0"
LO, HI = {"k": 0}, {"k": 50}  # inside the chunk [MinKey, 100), owned by shard a
CURRENT = "<the collection's epoch>"  # a request's epoch, filled in from the catalog
PATTERN = KeyPattern.parse({"k": 1})
ABSENT = "(absent)"
UNCHANGED = "(unchanged)"

CLONING, CRITICAL, COMMITTING, DECIDED = (str(x) for x in DonorState)
R_CLONING, CLONE_COMMITTED = (str(x) for x in RecipientState)


def doc(k: int, ns: str = NS) -> s.DocumentWritten:
    d = {"_id": k, "k": k}
    return s.DocumentWritten(ns=ns, skey=PATTERN.encode_doc(d).hex(), doc=d)


def unsharded(i: int) -> s.DocumentWritten:
    return s.DocumentWritten(ns=UNSHARDED, skey=UNSHARDED_KEY.hex(), doc={"_id": i})


def mig(role: str, state: str, *, mid: str = MID, decision: str | None = None) -> s.MigrationRecorded:
    primary = role.startswith("primary-")
    return s.MigrationRecorded(
        id=mid,
        role=role,
        ns=DB if primary else NS,
        epoch="",
        min={} if primary else LO,
        max={} if primary else HI,
        peer="b" if "donor" in role else "a",
        state=state,
        decision=decision,
    )


def task(*, pending: bool = True, mid: str = MID, lo: dict = LO, hi: dict = HI, ns: str = NS, **kw: Any):
    return s.RangeDeletionRecorded(id=mid, ns=ns, epoch="", min=lo, max=hi, pending=pending, **kw)


def skey(k: int) -> str:
    return PATTERN.encode_doc({"_id": k, "k": k}).hex()


OPEN: list[Store] = []


@pytest.fixture(autouse=True)
def _close_stores():
    yield
    while OPEN:
        OPEN.pop().close()


class Shard(ShardHarness):
    """One shard's MigrationDecider over a real store; the catalog shows shards a and b,
    database d (primary a, with the unsharded d.u), d.c sharded on k with chunks
    [MinKey, 100) and [100, MaxKey) on a, and migration m1 of [0, 50) from a to b requested
    (the shared harness, tests/shard_harness.py, with the clock and fault points injected)."""

    def __init__(self, tmp_path, shard_id: str):
        self.faults: list[str] = []
        self.open_queries = 0
        setup = [
            c.CreateDatabase(db=DB, primary="a"),
            c.CreateCollection(ns=UNSHARDED),
            c.ShardCollection(ns=NS, key={"k": 1}),
            c.SplitChunk(ns=NS, at=[{"k": 100}]),
        ]
        super().__init__(tmp_path, shard_id, setup=setup)
        OPEN.append(self.store)
        self.epoch = self.catalog.collections[NS].epoch
        self.catalog_apply(
            [c.MigrationRequested(id=MID, ns=NS, epoch=self.epoch, min=LO, max=HI, donor="a", recipient="b")]
        )

    def make_decider(self) -> MigrationDecider:
        return MigrationDecider(
            self.shard_id,
            self.catalog,
            self.documents,
            open_queries=lambda ns, config_time: self.open_queries,
            clock=lambda: NOW,
            fault=self.faults.append,
        )

    def run(self, req: Record) -> tuple[list[Record], dict]:
        if getattr(req, "epoch", None) == CURRENT:
            req = req.model_copy(update={"epoch": self.epoch})
        events, result = super().run(req)
        return events, result or {}

    def state(self, mid: str = MID) -> str:
        m = self.documents.migrations.get(mid)
        return ABSENT if m is None else m.state

    def task_state(self, mid: str = MID) -> str:
        t = self.documents.range_tasks.get(mid)
        return ABSENT if t is None else str(state_of(t))


@dataclass
class Ok:
    events: list[str]  # the types of the events recorded, in order
    state: str = UNCHANGED  # the migration document's state after (ABSENT: forgotten)
    task: str = UNCHANGED  # the range-deletion task's state after (ABSENT: removed)
    fault: str | None = None  # the fault point fired while deciding
    reply: dict = field(default_factory=dict)  # entries the reply must hold


@dataclass
class Refused:
    code: ErrorCode


@dataclass
class Case:
    name: str
    shard: str  # "a" (the donor, the primary of d) or "b" (the recipient)
    given: list[Record]
    request: Record
    expect: Ok | Refused


def check(tmp_path, case: Case) -> Shard:
    sh = Shard(tmp_path, case.shard)
    sh.given(*case.given)
    before_state, before_task = sh.state(), sh.task_state()
    if isinstance(case.expect, Refused):
        with pytest.raises(CommandError) as err:
            sh.run(case.request)
        assert err.value.code == case.expect.code
        assert sh.faults == []  # a refused step reaches no fault point
        assert (sh.state(), sh.task_state()) == (before_state, before_task)
        return sh
    events, reply = sh.run(case.request)
    want = case.expect
    assert [e.type for e in events] == want.events
    assert sh.state() == (before_state if want.state == UNCHANGED else want.state)
    assert sh.task_state() == (before_task if want.task == UNCHANGED else want.task)
    assert sh.faults == ([want.fault] if want.fault else [])
    assert {k: reply.get(k) for k in want.reply} == want.reply
    return sh


def named(table: tuple[Case, ...], name: str) -> Case:
    return next(t for t in table if t.name == name)


def cases(*table: Case):
    return pytest.mark.parametrize("case", table, ids=[t.name for t in table])


START_DONATION = s.StartDonation(id=MID, ns=NS, epoch=CURRENT, min=LO, max=HI, recipient="b")
START_RECEIPT = s.StartReceipt(id=MID, ns=NS, epoch=CURRENT, min=LO, max=HI, donor="a")

# ------------------------------------------------------------------------ donor

DONOR = (
    Case(
        "start donation: cloning, with a pending task",
        "a",
        [],
        START_DONATION,
        Ok(["MigrationRecorded", "RangeDeletionRecorded"], CLONING, str(TaskState.PENDING), reply={"state": CLONING}),
    ),
    Case(
        "start donation again: joined",
        "a",
        [mig("donor", CRITICAL), task()],
        START_DONATION,
        Ok([], reply={"joined": True, "state": CRITICAL}),
    ),
    Case(
        "start donation during another migration",
        "a",
        [mig("recipient", R_CLONING, mid=OTHER)],
        START_DONATION,
        Refused(ErrorCode.ConflictingOperationInProgress),
    ),
    Case(
        "start donation at another epoch",
        "a",
        [],
        START_DONATION.model_copy(update={"epoch": "old"}),
        Refused(ErrorCode.StaleEpoch),
    ),
    Case(
        "start donation of an unsharded collection",
        "a",
        [],
        START_DONATION.model_copy(update={"ns": UNSHARDED}),
        Refused(ErrorCode.StaleEpoch),
    ),
    Case("start donation of a range we do not own", "b", [], START_DONATION, Refused(ErrorCode.StaleConfig)),
    Case(
        "start donation of a range over two chunks",
        "a",
        [],
        START_DONATION.model_copy(update={"max": {"k": 150}}),
        Refused(ErrorCode.StaleConfig),
    ),
    Case(
        "start primary move: writes wait from the start",
        "a",
        [],
        s.StartPrimaryMove(id=MID, db=DB, recipient="b"),
        Ok(["MigrationRecorded"], CRITICAL, ABSENT, reply={"state": CRITICAL}),
    ),
    Case(
        "start primary move again: joined",
        "a",
        [mig("primary-donor", COMMITTING)],
        s.StartPrimaryMove(id=MID, db=DB, recipient="b"),
        Ok([], reply={"joined": True, "state": COMMITTING}),
    ),
    Case(
        "start primary move on a shard that is not the primary",
        "b",
        [],
        s.StartPrimaryMove(id=MID, db=DB, recipient="a"),
        Refused(ErrorCode.StaleConfig),
    ),
    Case(
        "start primary move during another migration",
        "a",
        [mig("donor", CLONING, mid=OTHER)],
        s.StartPrimaryMove(id=MID, db=DB, recipient="b"),
        Refused(ErrorCode.ConflictingOperationInProgress),
    ),
    Case(
        "enter the critical section: writes wait",
        "a",
        [mig("donor", CLONING)],
        s.EnterCriticalSection(id=MID),
        Ok(["MigrationRecorded"], CRITICAL, reply={"state": CRITICAL}),
    ),
    Case(
        "enter the critical section again",
        "a",
        [mig("donor", CRITICAL)],
        s.EnterCriticalSection(id=MID),
        Ok([], CRITICAL, reply={"state": CRITICAL}),
    ),
    Case(
        "enter the critical section (writes) once reads wait too: no step back",
        "a",
        [mig("donor", COMMITTING)],
        s.EnterCriticalSection(id=MID),
        Ok([], COMMITTING, reply={"state": COMMITTING}),
    ),
    Case(
        "block reads: committing",
        "a",
        [mig("donor", CRITICAL)],
        s.EnterCriticalSection(id=MID, reads=True),
        Ok(["MigrationRecorded"], COMMITTING, reply={"state": COMMITTING}),
    ),
    Case(
        "block reads again",
        "a",
        [mig("donor", COMMITTING)],
        s.EnterCriticalSection(id=MID, reads=True),
        Ok([], COMMITTING, reply={"state": COMMITTING}),
    ),
    Case(
        "block reads of a primary move",
        "a",
        [mig("primary-donor", CRITICAL)],
        s.EnterCriticalSection(id=MID, reads=True),
        Ok(["MigrationRecorded"], COMMITTING),
    ),
    Case(
        "block reads before writes",
        "a",
        [mig("donor", CLONING)],
        s.EnterCriticalSection(id=MID, reads=True),
        Refused(ErrorCode.IllegalOperation),
    ),
    Case(
        "enter the critical section of an unknown migration",
        "a",
        [],
        s.EnterCriticalSection(id=MID),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "enter the critical section as the recipient",
        "b",
        [mig("recipient", R_CLONING)],
        s.EnterCriticalSection(id=MID),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "enter the critical section once decided",
        "a",
        [mig("donor", DECIDED, decision="aborted")],
        s.EnterCriticalSection(id=MID),
        Refused(ErrorCode.IllegalOperation),
    ),
    Case(
        "record a commit: decided, the task ready",
        "a",
        [mig("donor", COMMITTING), task()],
        s.RecordDecision(id=MID, committed=True, configTime=42),
        Ok(
            ["MigrationRecorded", "RangeDeletionRecorded"],
            DECIDED,
            str(TaskState.READY),
            reply={"state": DECIDED, "decision": "committed"},
        ),
    ),
    Case(
        "record an abort while cloning: decided, the task removed",
        "a",
        [mig("donor", CLONING), task()],
        s.RecordDecision(id=MID, committed=False),
        Ok(["MigrationRecorded", "RangeDeletionRemoved"], DECIDED, ABSENT, reply={"decision": "aborted"}),
    ),
    Case(
        "record an abort in the critical section",
        "a",
        [mig("donor", CRITICAL), task()],
        s.RecordDecision(id=MID, committed=False),
        Ok(["MigrationRecorded", "RangeDeletionRemoved"], DECIDED, ABSENT),
    ),
    Case(
        "record the same decision again",
        "a",
        [mig("donor", DECIDED, decision="committed"), task(pending=False)],
        s.RecordDecision(id=MID, committed=True),
        Ok([], DECIDED, reply={"state": DECIDED}),
    ),
    Case(
        "record a decision contradicting the recorded one",
        "a",
        [mig("donor", DECIDED, decision="aborted")],
        s.RecordDecision(id=MID, committed=True),
        Refused(ErrorCode.IllegalOperation),
    ),
    Case(
        "record a decision already forgotten",
        "a",
        [],
        s.RecordDecision(id=MID, committed=True),
        Ok([], ABSENT, ABSENT, reply={"state": "forgotten"}),
    ),
    Case(
        "record a decision on the recipient: nothing of ours",
        "b",
        [mig("recipient", R_CLONING)],
        s.RecordDecision(id=MID, committed=True),
        Ok([], R_CLONING, reply={"state": "forgotten"}),
    ),
    Case(
        "record a committed primary move: our unsharded copies go",
        "a",
        [mig("primary-donor", COMMITTING), unsharded(1), unsharded(2)],
        s.RecordDecision(id=MID, committed=True),
        Ok(["MigrationRecorded", "DocumentRemoved", "DocumentRemoved"], DECIDED, ABSENT),
    ),
    Case(
        "record an aborted primary move: our unsharded copies stay",
        "a",
        [mig("primary-donor", CRITICAL), unsharded(1)],
        s.RecordDecision(id=MID, committed=False),
        Ok(["MigrationRecorded"], DECIDED, ABSENT),
    ),
    Case(
        "forget a decided donation",
        "a",
        [mig("donor", DECIDED, decision="committed"), task(pending=False)],
        s.ForgetMigration(id=MID),
        Ok(["MigrationForgotten"], ABSENT, reply={"state": "forgotten"}),
    ),
    Case(
        "forget an undecided donation",
        "a",
        [mig("donor", COMMITTING)],
        s.ForgetMigration(id=MID),
        Refused(ErrorCode.IllegalOperation),
    ),
    Case("forget an unknown migration", "a", [], s.ForgetMigration(id=MID), Ok([], ABSENT, ABSENT)),
    Case(
        "forget a receipt, whatever its state",
        "b",
        [mig("recipient", R_CLONING)],
        s.ForgetMigration(id=MID),
        Ok(["MigrationForgotten"], ABSENT),
    ),
)


@cases(*DONOR)
def test_donor(tmp_path, case: Case):
    check(tmp_path, case)


def test_a_committed_donation_readies_its_task_at_the_injected_time_after_the_commit(tmp_path):
    sh = check(tmp_path, named(DONOR, "record a commit: decided, the task ready"))
    t = sh.documents.range_tasks[MID]
    assert (t.pending, t.readyAt, t.configTime) == (False, NOW, 42)
    assert sh.documents.migrations[MID].decision == "committed"


# -------------------------------------------------------------------- recipient

RECIPIENT = (
    Case(
        "start receipt: cloning, with a pending task",
        "b",
        [],
        START_RECEIPT,
        Ok(
            ["MigrationRecorded", "RangeDeletionRecorded"],
            R_CLONING,
            str(TaskState.PENDING),
            "migration.registered",
            {"state": R_CLONING},
        ),
    ),
    Case(
        "start receipt again: joined",
        "b",
        [mig("recipient", CLONE_COMMITTED), task()],
        START_RECEIPT,
        Ok([], reply={"joined": True, "state": CLONE_COMMITTED}),
    ),
    Case(
        "start receipt during another migration",
        "b",
        [mig("donor", CLONING, mid=OTHER)],
        START_RECEIPT,
        Refused(ErrorCode.ConflictingOperationInProgress),
    ),
    Case(
        "start receipt of a migration the config server does not show active",
        "b",
        [],
        START_RECEIPT.model_copy(update={"id": "m9"}),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "start receipt of an unsharded collection",
        "b",
        [],
        START_RECEIPT.model_copy(update={"ns": UNSHARDED}),
        Refused(ErrorCode.NamespaceNotFound),
    ),
    Case(
        "start receipt over an overlapping range still to delete",
        "b",
        [task(mid=OTHER, lo={"k": 40}, hi={"k": 60}, pending=False)],
        START_RECEIPT,
        Refused(ErrorCode.RangeDeletionPending),
    ),
    Case(
        "start receipt next to a range still to delete",
        "b",
        [task(mid=OTHER, lo={"k": 50}, hi={"k": 60}, pending=False)],
        START_RECEIPT,
        Ok(
            ["MigrationRecorded", "RangeDeletionRecorded"],
            R_CLONING,
            str(TaskState.PENDING),
            "migration.registered",
        ),
    ),
    Case(
        "start primary receipt",
        "b",
        [],
        s.StartPrimaryReceipt(id=MID, db=DB, donor="a"),
        Ok(["MigrationRecorded"], R_CLONING, ABSENT, "migration.registered"),
    ),
    Case(
        "start receipt with the donor's indexes: those it lacks recorded ready before the document",
        "b",
        [],
        START_RECEIPT.model_copy(
            update={"indexes": [{"v": 2, "key": {"_id": 1}, "name": "_id_"}, {"v": 2, "key": {"a": 1}, "name": "a_1"}]}
        ),
        Ok(
            ["IndexRecorded", "MigrationRecorded", "RangeDeletionRecorded"],
            R_CLONING,
            str(TaskState.PENDING),
            "migration.registered",
        ),
    ),
    Case(
        "start primary receipt with the donor's indexes of its collections",
        "b",
        [],
        s.StartPrimaryReceipt(
            id=MID, db=DB, donor="a", indexes={UNSHARDED: [{"v": 2, "key": {"a": -1}, "name": "a_-1"}]}
        ),
        Ok(["IndexRecorded", "MigrationRecorded"], R_CLONING, ABSENT, "migration.registered"),
    ),
    Case(
        "start primary receipt again: joined",
        "b",
        [mig("primary-recipient", R_CLONING)],
        s.StartPrimaryReceipt(id=MID, db=DB, donor="a"),
        Ok([], reply={"joined": True}),
    ),
    Case(
        "start primary receipt of a move that is not active",
        "b",
        [],
        s.StartPrimaryReceipt(id="m9", db=DB, donor="a"),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "a clone batch: the range's documents, counted",
        "b",
        [mig("recipient", R_CLONING)],
        s.TransferBatch(
            id=MID,
            phase="clone",
            written=[{"skey": skey(k), "doc": {"_id": k, "k": k}} for k in (0, 49, 50)],
        ),
        Ok(
            ["DocumentWritten", "DocumentWritten", "MigrationRecorded"],
            R_CLONING,
            fault="migration.cloning",
            reply={"applied": 2, "cloned": 3},
        ),
    ),
    Case(
        "a batch of mods: writes, and removals of documents we hold",
        "b",
        [mig("recipient", R_CLONING), doc(1)],
        s.TransferBatch(
            id=MID,
            phase="mods",
            written=[{"skey": skey(2), "doc": {"_id": 2, "k": 2}}],
            removed=[{"skey": skey(1), "id": 1}, {"skey": skey(3), "id": 3}],
        ),
        Ok(
            ["DocumentWritten", "DocumentRemoved", "MigrationRecorded"],
            R_CLONING,
            fault="migration.catching_up",
            reply={"applied": 2, "mods": 3},
        ),
    ),
    Case(
        "a batch after the clone was committed",
        "b",
        [mig("recipient", CLONE_COMMITTED)],
        s.TransferBatch(id=MID, phase="mods"),
        Refused(ErrorCode.IllegalOperation),
    ),
    Case(
        "a batch of an unknown migration",
        "b",
        [],
        s.TransferBatch(id=MID, phase="clone"),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "a batch sent to the donor",
        "a",
        [mig("donor", CLONING)],
        s.TransferBatch(id=MID, phase="clone"),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "a primary move's batch of its database's collection",
        "b",
        [mig("primary-recipient", R_CLONING)],
        s.TransferBatch(id=MID, phase="clone", ns=UNSHARDED, written=[{"doc": {"_id": 1}}, {"doc": {"_id": 2}}]),
        Ok(
            ["DocumentWritten", "DocumentWritten", "MigrationRecorded"],
            R_CLONING,
            fault="migration.cloning",
            reply={"applied": 2},
        ),
    ),
    Case(
        "a primary move's batch of another database",
        "b",
        [mig("primary-recipient", R_CLONING)],
        s.TransferBatch(id=MID, phase="clone", ns="e.u", written=[{"doc": {"_id": 1}}]),
        Refused(ErrorCode.BadValue),
    ),
    Case(
        "commit the clone",
        "b",
        [mig("recipient", R_CLONING)],
        s.CommitClone(id=MID),
        Ok(["MigrationRecorded"], CLONE_COMMITTED, fault="migration.clone_committed"),
    ),
    Case(
        "commit the clone again",
        "b",
        [mig("recipient", CLONE_COMMITTED)],
        s.CommitClone(id=MID),
        Ok([], CLONE_COMMITTED, reply={"state": CLONE_COMMITTED}),
    ),
    Case(
        "commit the clone of an unknown migration",
        "b",
        [],
        s.CommitClone(id=MID),
        Refused(ErrorCode.NoSuchMigration),
    ),
    Case(
        "finish a committed receipt: the documents are ours, the task goes",
        "b",
        [mig("recipient", CLONE_COMMITTED), task()],
        s.FinishReceipt(id=MID, committed=True),
        Ok(["MigrationForgotten", "RangeDeletionRemoved"], ABSENT, ABSENT, "migration.range_tasks_updated"),
    ),
    Case(
        "finish an aborted receipt: our copies are orphans, the task ready",
        "b",
        [mig("recipient", R_CLONING), task()],
        s.FinishReceipt(id=MID, committed=False),
        Ok(
            ["MigrationForgotten", "RangeDeletionRecorded"],
            ABSENT,
            str(TaskState.READY),
            "migration.range_tasks_updated",
        ),
    ),
    Case(
        "finish an aborted primary receipt: our copies go",
        "b",
        [mig("primary-recipient", R_CLONING), unsharded(1)],
        s.FinishReceipt(id=MID, committed=False),
        Ok(["MigrationForgotten", "DocumentRemoved"], ABSENT, ABSENT, "migration.range_tasks_updated"),
    ),
    Case(
        "finish a receipt already finished",
        "b",
        [],
        s.FinishReceipt(id=MID, committed=True),
        Ok([], ABSENT, ABSENT, reply={"state": "forgotten"}),
    ),
    Case(
        "finish a receipt on the donor: nothing of ours",
        "a",
        [mig("donor", DECIDED, decision="committed")],
        s.FinishReceipt(id=MID, committed=True),
        Ok([], DECIDED, reply={"state": "forgotten"}),
    ),
)


@cases(*RECIPIENT)
def test_recipient(tmp_path, case: Case):
    check(tmp_path, case)


def test_an_aborted_receipt_readies_its_task_at_the_injected_time_and_says_why(tmp_path):
    sh = check(tmp_path, named(RECIPIENT, "finish an aborted receipt: our copies are orphans, the task ready"))
    t = sh.documents.range_tasks[MID]
    assert (t.pending, t.readyAt, t.configTime) == (False, NOW, sh.catalog.config_time)
    assert t.why == "migration from a aborted"


# --------------------------------------------------------------- range deletion

ORPHANS = [doc(1), doc(2), doc(3)]  # on b, in [0, 50), which a owns

RANGE_DELETION = (
    Case(
        "delete a range with no task: done",
        "b",
        [],
        s.DeleteRangeBatch(task=MID),
        Ok([], reply={"deleted": 0, "done": True}),
    ),
    Case(
        "delete a range whose migration is not decided",
        "b",
        [task(), *ORPHANS],
        s.DeleteRangeBatch(task=MID),
        Ok([], task=str(TaskState.PENDING), reply={"done": False, "waiting": "its migration is not decided yet"}),
    ),
    Case(
        "delete the last orphans: the task goes",
        "b",
        [task(pending=False), *ORPHANS],
        s.DeleteRangeBatch(task=MID, limit=10),
        Ok(
            ["DocumentRemoved"] * 3 + ["RangeDeletionRemoved"],
            task=ABSENT,
            reply={"deleted": 3, "total": 3, "done": True},
        ),
    ),
    Case(
        "delete a batch of orphans: the task counts them",
        "b",
        [task(pending=False, deleted=5), *ORPHANS],
        s.DeleteRangeBatch(task=MID, limit=2),
        Ok(
            ["DocumentRemoved"] * 2 + ["RangeDeletionRecorded"],
            task=str(TaskState.READY),
            reply={"deleted": 2, "total": 7, "done": False},
        ),
    ),
    Case(
        "delete a range that came back: what we own stays",
        "a",
        [task(pending=False), *ORPHANS],
        s.DeleteRangeBatch(task=MID),
        Ok(["RangeDeletionRemoved"], task=ABSENT, reply={"deleted": 0, "done": True}),
    ),
    Case(
        "delete a range of a collection dropped since",
        "b",
        [task(pending=False, ns="d.gone")],
        s.DeleteRangeBatch(task=MID),
        Ok(["RangeDeletionRemoved"], task=ABSENT, reply={"deleted": 0, "done": True}),
    ),
)


@cases(*RANGE_DELETION)
def test_range_deletion(tmp_path, case: Case):
    check(tmp_path, case)


@pytest.mark.parametrize(
    ("open_queries", "waiting"),
    [
        (0, None),
        (1, "1 query started before the migration committed still reads the range"),
        (2, "2 queries started before the migration committed still read the range"),
    ],
)
def test_a_ready_range_waits_for_the_queries_routed_before_its_commit(tmp_path, open_queries, waiting):
    sh = Shard(tmp_path, "b")
    sh.given(task(pending=False, configTime=7), *ORPHANS)
    sh.open_queries = open_queries
    events, reply = sh.run(s.DeleteRangeBatch(task=MID))
    assert reply.get("waiting") == waiting
    assert len(events) == (0 if waiting else 4)
    listed = sh.run(s.ListMigrations())[1]["rangeDeletions"]
    assert [(t["id"], t["waiting"]) for t in listed] == ([(MID, waiting)] if waiting else [])


# ------------------------------------------------------------- critical section

WRITES, READS = False, True


@pytest.mark.parametrize(
    ("document", "writes_blocked", "reads_blocked"),
    [
        (mig("donor", CLONING), False, False),
        (mig("donor", CRITICAL), True, False),
        (mig("donor", COMMITTING), True, True),
        (mig("donor", DECIDED, decision="committed"), False, False),
        (mig("recipient", R_CLONING), False, False),
    ],
    ids=["cloning", "critical", "committing", "decided", "recipient"],
)
def test_a_donation_blocks_its_range_in_its_critical_section(tmp_path, document, writes_blocked, reads_blocked):
    sh = Shard(tmp_path, "a")
    sh.given(document)
    rng = (PATTERN.encode_bound(LO), PATTERN.encode_bound(HI))
    assert sh.decider.blocked_ranges(NS, WRITES) == ([rng] if writes_blocked else [])
    assert sh.decider.blocked_ranges(NS, READS) == ([rng] if reads_blocked else [])
    assert sh.decider.blocked_ranges("d.other", WRITES) == []


@pytest.mark.parametrize(
    ("state", "writes_blocked", "reads_blocked"),
    [(CRITICAL, True, False), (COMMITTING, True, True), (DECIDED, False, False)],
)
def test_a_primary_move_blocks_the_databases_unsharded_collections(tmp_path, state, writes_blocked, reads_blocked):
    sh = Shard(tmp_path, "a")
    sh.given(mig("primary-donor", state, decision="committed" if state == DECIDED else None))
    assert sh.decider.primary_blocked(UNSHARDED, WRITES) is writes_blocked
    assert sh.decider.primary_blocked(UNSHARDED, READS) is reads_blocked
    assert sh.decider.primary_blocked("e.u", WRITES) is False


def test_a_write_into_a_critical_section_is_refused_retriably_by_the_shard(tmp_path):
    sh = Shard(tmp_path, "a")
    shard = ShardDecider("a", sh.catalog, sh.documents)
    shard.migrations = sh.decider
    sh.given(mig("donor", CRITICAL))
    coll = sh.catalog.collections[NS]
    routing = s.Routing(configTime=sh.catalog.config_time, epoch=coll.epoch, version=coll.shard_version("a").pair)
    with pytest.raises(CommandError) as err:
        shard.decide(s.Insert(ns=NS, docs=[{"_id": 1, "k": 1}], routing=routing))
    assert err.value.code == ErrorCode.StaleConfig
    assert err.value.info == {"shard": "a", "configTime": sh.catalog.config_time + 1, "critical": True}
    sh.given(*shard.decide(s.Insert(ns=NS, docs=[{"_id": 60, "k": 60}], routing=routing)).events)  # outside: served
    assert shard.decide(s.Count(ns=NS, filter={}, routing=routing)).result == {"n": 1}  # reads are still served


# ------------------------------------------------------------- a whole migration


def test_a_migration_walks_both_roles_from_start_to_forgotten(tmp_path):
    """The requests the donor's coordinator sends, in order, each leaving the state the
    next one expects; the documents arrive on the recipient and leave the donor."""
    donor_shard, recipient_shard = Shard(tmp_path, "a"), Shard(tmp_path, "b")
    donor_shard.given(doc(1), doc(2), doc(60))
    donor_shard.run(START_DONATION)
    recipient_shard.run(START_RECEIPT)
    batch = [{"skey": skey(k), "doc": {"_id": k, "k": k}} for k in (1, 2)]
    recipient_shard.run(s.TransferBatch(id=MID, phase="clone", written=batch))
    donor_shard.run(s.EnterCriticalSection(id=MID))
    recipient_shard.run(s.CommitClone(id=MID))
    donor_shard.run(s.EnterCriticalSection(id=MID, reads=True))
    assert (donor_shard.state(), recipient_shard.state()) == (COMMITTING, CLONE_COMMITTED)
    donor_shard.run(s.RecordDecision(id=MID, committed=True, configTime=9))
    recipient_shard.run(s.FinishReceipt(id=MID, committed=True))
    donor_shard.run(s.ForgetMigration(id=MID))
    assert (donor_shard.state(), recipient_shard.state()) == (ABSENT, ABSENT)
    assert (donor_shard.task_state(), recipient_shard.task_state()) == (str(TaskState.READY), ABSENT)
    assert [d["_id"] for _, d in recipient_shard.documents.scan(NS)] == [1, 2]
    assert recipient_shard.faults == [
        "migration.registered",
        "migration.cloning",
        "migration.clone_committed",
        "migration.range_tasks_updated",
    ]
    assert donor_shard.faults == []


# ------------------------------------------------------- the range a donation takes

MB = 1024 * 1024
PAD = "x" * (300 * 1024)


def big(k: int, _id: int | None = None, pad: str = PAD) -> s.DocumentWritten:
    d = {"_id": k if _id is None else _id, "k": k, "pad": pad}
    return s.DocumentWritten(ns=NS, skey=PATTERN.encode_doc(d).hex(), doc=d)


@dataclass
class Donation:
    name: str
    shard: str
    given: list[Record]
    max: dict | None  # the requested max (None: the donor cuts one max chunk size)
    expect: dict | str  # the range's max bound, or the reason's start
    stored: int = 0  # bytes the store reports for a requested [min, max)
    epoch: str = CURRENT
    force: bool = False
    jumbo: bool = False


DONATIONS = (
    Donation("the requested range", "a", [], HI, HI),
    Donation("a requested range over twice the max chunk size", "a", [], HI, "ChunkTooBig", stored=3 * MB),
    Donation("a requested range over twice the max chunk size, forced", "a", [], HI, HI, stored=3 * MB, force=True),
    Donation("one max chunk size from min, cut at a key", "a", [big(k) for k in range(10)], None, {"k": 4}),
    Donation("the rest of the chunk when it is small", "a", [doc(1), doc(2)], None, {"k": 100}),
    Donation(
        "one key too big to split: jumbo",
        "a",
        [big(5, i) for i in range(8)],
        None,
        "ChunkTooBig: every document",
        jumbo=True,
    ),
    Donation(
        "too big after its first key",
        "a",
        [doc(1), *(big(5, 10 + i) for i in range(8))],
        None,
        "ChunkTooBig: ",
    ),
    Donation("a collection sharded again since", "a", [], HI, "StaleEpoch", epoch="old"),
    Donation("a range we do not own", "b", [], HI, "StaleConfig"),
)


@pytest.mark.parametrize("case", DONATIONS, ids=[d.name for d in DONATIONS])
def test_the_range_a_donation_takes(tmp_path, case: Donation):
    sh = Shard(tmp_path, case.shard)
    sh.catalog_apply(config_decide(sh.catalog, c.SetSetting(key="maxChunkSizeBytes", value=MB, ns=NS)).events)
    sh.given(*case.given)
    epoch = sh.epoch if case.epoch == CURRENT else case.epoch
    m = Migration(MID, NS, epoch, LO, case.max, "a", "b", force_jumbo=case.force)

    def sizes(ns: str, lo: bytes, hi: bytes) -> int:
        return case.stored

    if isinstance(case.expect, str):
        with pytest.raises(CannotDonate) as err:
            donation_range(sh.decider.shard, m, sizes)
        assert str(err.value).startswith(case.expect)
        assert err.value.code == case.expect.split(":")[0]
        assert err.value.jumbo is case.jumbo
        return
    rng = donation_range(sh.decider.shard, m, sizes)
    assert (rng.min, rng.max) == (LO, case.expect)
    assert (rng.lo, rng.hi) == (PATTERN.encode_bound(LO), PATTERN.encode_bound(case.expect))
