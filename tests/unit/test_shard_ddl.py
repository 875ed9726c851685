"""The shard's side of the DDL coordinators, without Kafka: critical sections, drops as range
deletions (and their replay), rename and rekey batches.  Decided by the shard's own decider
over a real document store and a catalog built by the config server's own decisions, with
the catalog's DDL changes applied as the coordinator's commit leaves them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.ddl import Phase, next_phase
from domain.protocol import ErrorCode
from domain.shardkey import KeyPattern, encode_value
from libs.errors import CommandError
from libs.store import META, Store
from schemas import Record
from schemas import config as c
from schemas import ddl as d
from schemas import shard as s
from services.shard.decide import ShardDecider
from services.shard.documents import UNSHARDED_KEY, ShardDocuments, changelog_key, shard_key_part
from services.shard.statistics import CountingDocuments
from tests.shard_harness import ShardHarness

DB, NS, UNSHARDED, OTHER_DB_NS = "d", "d.c", "d.u", "d2.x"  # d2: a database whose name starts like d's
PATTERN = KeyPattern.parse({"k": 1})
REFINED = KeyPattern.parse({"k": 1, "j": 1})
DDL = "ddl-1"


def keyed(k: int, ns: str = NS, **more) -> s.DocumentWritten:
    doc = {"_id": k, "k": k, **more}
    return s.DocumentWritten(ns=ns, skey=PATTERN.encode_doc(doc).hex(), doc=doc)


def plain(i: int, ns: str = UNSHARDED) -> s.DocumentWritten:
    return s.DocumentWritten(ns=ns, skey=UNSHARDED_KEY.hex(), doc={"_id": i, "v": i})


def task(mid: str, ns: str = NS) -> s.RangeDeletionRecorded:
    return s.RangeDeletionRecorded(id=mid, ns=ns, epoch="", min={"k": 100}, max={"k": 150}, pending=False)


class Shard(ShardHarness):
    """Shard `shard_id` of a cluster of a and b: database d (primary a) with the unsharded d.u
    and d.c sharded on k, [MinKey, 100) on a and [100, MaxKey) on b; database d2 (primary a)
    with the unsharded d2.x (the shared harness, tests/shard_harness.py)."""

    def __init__(self, tmp_path, shard_id: str = "a", documents: ShardDocuments | None = None):
        top = {"k": {"$maxKey": 1}}
        setup = [
            c.CreateDatabase(db=DB, primary="a"),
            c.CreateDatabase(db="d2", primary="a"),
            c.CreateCollection(ns=UNSHARDED),
            c.CreateCollection(ns=OTHER_DB_NS),
            c.ShardCollection(ns=NS, key={"k": 1}),
            c.SplitChunk(ns=NS, at=[{"k": 100}]),
        ]
        self.tmp_path = tmp_path
        self.faults: list[str] = []
        super().__init__(tmp_path, shard_id, setup=setup, documents=documents)
        mid = self.config(c.MoveRange(ns=NS, min={"k": 100}, max=top, to="b"))["id"]
        self.config(c.CommitMigration(id=mid, min={"k": 100}, max=top))
        self.decider.ddl.fault = self.faults.append

    def run(self, req: Record) -> tuple[list[Record], dict]:
        events, result = super().run(req)
        return events, result or {}


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    yield sh
    sh.close()


def crud(sh: Shard, ns: str) -> list[Record]:
    r = sh.routing(ns)
    return [
        s.Find(ns=ns, filter={}, routing=r),
        s.Count(ns=ns, filter={}, routing=r),
        s.Insert(ns=ns, docs=[{"_id": 1000, "k": 5}], routing=r),
        s.Update(ns=ns, filter={"_id": 1}, update={"$set": {"x": 1}}, routing=r),
        s.Delete(ns=ns, filter={"_id": 1}, routing=r),
        s.FindAndModify(ns=ns, query={"_id": 1}, remove=True, routing=r),
    ]


# ------------------------------------------------------------------ the critical section


def test_the_critical_section_refuses_every_crud_request_on_its_namespaces_until_the_exit(shard):
    shard.given(keyed(1), plain(1))
    events, reply = shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[NS]))
    assert [e.type for e in events] == ["DDLCriticalSectionRecorded"] and reply["critical"] is True
    assert shard.faults == ["ddl.shard.EnterDDLCriticalSection"]
    for req in crud(shard, NS):
        with pytest.raises(CommandError) as err:
            shard.run(req)
        assert err.value.code == ErrorCode.StaleConfig, req.type
        # The migration critical section's shape: the router waits for the next ConfigTime.
        assert err.value.info == {"shard": "a", "configTime": shard.catalog.config_time + 1, "critical": True}
    assert shard.run(s.Count(ns=UNSHARDED, filter={}, routing=shard.routing(UNSHARDED)))[1] == {"n": 1}

    assert shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[NS])) == ([], reply)  # a retry
    events, reply = shard.run(d.ExitDDLCriticalSection(id=DDL))
    assert [e.type for e in events] == ["DDLCriticalSectionRemoved"] and reply["critical"] is False
    assert shard.run(s.Count(ns=NS, filter={}, routing=shard.routing(NS)))[1] == {"n": 1}
    assert shard.run(d.ExitDDLCriticalSection(id=DDL)) == ([], reply)  # a retry
    assert shard.faults == ["ddl.shard.EnterDDLCriticalSection", "ddl.shard.ExitDDLCriticalSection"]  # not on retries


def test_a_database_section_holds_every_collection_of_it_and_survives_a_restart(shard, tmp_path):
    shard.run(d.EnterDDLCriticalSection(id=DDL, db=DB))
    shard.commit()
    again = ShardDocuments()
    again.load(shard.store)  # a restart: the section is loaded from the store
    decider = ShardDecider("a", shard.catalog, again)
    for ns in (NS, UNSHARDED, "d.new"):
        with pytest.raises(CommandError) as err:
            decider.decide(s.Count(ns=ns, filter={}, routing=shard.routing(ns)))
        assert err.value.code == ErrorCode.StaleConfig and err.value.info["critical"] is True
    assert decider.decide(s.Count(ns=OTHER_DB_NS, filter={}, routing=shard.routing(OTHER_DB_NS))).result == {"n": 0}


@pytest.mark.parametrize(
    "req",
    [
        d.EnterDDLCriticalSection(id=DDL),
        d.DropLocalData(id=DDL),
        d.DropLocalData(id=DDL, ns=NS, db=DB),
    ],
    ids=["enter-nothing", "drop-nothing", "drop-both"],
)
def test_requests_naming_nothing_to_act_on_are_refused_and_change_nothing(shard, req):
    shard.given(keyed(1))
    before = shard.stored()
    with pytest.raises(CommandError) as err:
        shard.run(req)
    assert err.value.code == ErrorCode.BadValue
    shard.commit()
    assert shard.stored() == before and shard.faults == []


def test_entering_again_with_other_namespaces_is_refused(shard):
    shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[NS]))
    with pytest.raises(CommandError) as err:
        shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[UNSHARDED]))
    assert err.value.code == ErrorCode.BadValue


def advance(sh: Shard, cid: str, to: Phase) -> None:
    """The coordinator's checkpoints up to phase `to`, as the config server records them."""
    while cid in sh.catalog.ddl and (at := sh.catalog.ddl[cid].phase) != to:
        sh.config(d.AdvanceDDL(id=cid, phase=at, to=next_phase(at, sh.catalog.ddl[cid].op)))


def test_a_late_enter_of_a_ddl_past_its_block_crud_phase_is_refused_and_holds_nothing(shard):
    """Seed 10036: a config server cut off from the bus retried its EnterDDLCriticalSection of a
    refine (its producer held it until the partition healed); the standby that took over ran the
    DDL to its end, enter, rekey and exit; then the late enter arrived.  Served, it held db.c on
    the shard for ever (no coordinator left to send the exit): every CRUD request on it refused
    with StaleConfig, each router operation retried until it gave up."""
    shard.given(keyed(1))
    cid = shard.config(d.DropCollection(ns=UNSHARDED))["id"]
    advance(shard, cid, Phase.BLOCK_CRUD)
    enter = d.EnterDDLCriticalSection(id=cid, namespaces=[UNSHARDED])
    assert shard.run(enter)[1]["critical"] is True
    assert shard.run(enter) == ([], {"id": cid, "critical": True})  # a retry within the phase: as it was
    advance(shard, cid, Phase.APPLY)
    with pytest.raises(CommandError) as err:
        shard.run(enter)  # the phase is over: not from a coordinator that runs it
    assert err.value.code == ErrorCode.IllegalOperation and "past blockCRUD" in err.value.message
    advance(shard, cid, Phase.RELEASE)
    shard.run(d.ExitDDLCriticalSection(id=cid))
    advance(shard, cid, Phase.DONE)
    assert cid not in shard.catalog.ddl
    before = list(shard.log)
    with pytest.raises(CommandError) as err:
        shard.run(enter)
    assert err.value.code == ErrorCode.IllegalOperation and "has finished" in err.value.message
    assert shard.log == before and shard.documents.ddl_sections == {}
    assert shard.run(s.Count(ns=NS, filter={}, routing=shard.routing(NS)))[1] == {"n": 1}


def test_a_late_drop_of_a_finished_ddl_is_refused_and_deletes_nothing_written_since(shard):
    """The same late delivery of a DropLocalData would delete the collection created and
    written again after the drop ended (the exit forgot the drop)."""
    cid = shard.config(d.DropCollection(ns=UNSHARDED))["id"]
    advance(shard, cid, Phase.APPLY)
    drop = d.DropLocalData(id=cid, ns=UNSHARDED)
    shard.run(drop)
    advance(shard, cid, Phase.RELEASE)
    shard.run(d.ExitDDLCriticalSection(id=cid))
    advance(shard, cid, Phase.DONE)
    shard.config(c.CreateCollection(ns=UNSHARDED))
    shard.given(plain(1))
    with pytest.raises(CommandError) as err:
        shard.run(drop)
    assert err.value.code == ErrorCode.IllegalOperation
    assert shard.ids(UNSHARDED) == [1]


def test_an_enter_of_a_ddl_rolling_back_is_refused(shard):
    """A rollback leaves the sections; an enter still on its way (a retry of the blockCRUD
    phase, which gather does not cancel when another shard refused) must not take one again."""
    cid = shard.config(d.DropCollection(ns=UNSHARDED))["id"]
    advance(shard, cid, Phase.BLOCK_CRUD)
    shard.config(d.AdvanceDDL(id=cid, phase=Phase.BLOCK_CRUD, to=Phase.ROLLBACK, code="X", reason="why"))
    with pytest.raises(CommandError) as err:
        shard.run(d.EnterDDLCriticalSection(id=cid, namespaces=[UNSHARDED]))
    assert err.value.code == ErrorCode.IllegalOperation and "rolling back" in err.value.message
    assert shard.documents.ddl_sections == {}


# ------------------------------------------------------------------------------ drops


def test_a_drop_deletes_committed_and_pending_documents_but_not_later_writes(shard):
    shard.given(
        *(keyed(k) for k in range(10)), plain(1), plain(2), plain(3, OTHER_DB_NS), task("t1"), task("t2", UNSHARDED)
    )
    shard.run(s.Insert(ns=NS, docs=[{"_id": 50, "k": 50}], routing=shard.routing(NS)))  # pending in the batch
    events, reply = shard.run(d.DropLocalData(id=DDL, ns=NS))
    assert [e.type for e in events] == ["LocalDataDropped", "RangeDeletionRemoved"] and reply["dropped"] is True
    assert shard.faults == ["ddl.shard.DropLocalData"]
    assert set(shard.documents.range_tasks) == {"t2"}
    # Reads in the same batch see nothing of the dropped collection.
    assert shard.ids(NS) == [] and shard.documents.find_by_id(NS, 3) is None
    assert shard.documents.count_range(NS, b"", b"\xff") == 0
    shard.given(keyed(7))  # written after the drop, in the same batch: survives its range deletion
    assert shard.ids(NS) == [7]
    assert shard.ids(UNSHARDED) == [1, 2] and shard.ids(OTHER_DB_NS) == [3]
    assert [k for k in shard.stored() if k.startswith((b"d/d.c\x00", b"i/d.c\x00"))] == [
        b"d/d.c\x00" + PATTERN.encode_doc({"k": 7}) + encode_value(7),
        b"i/d.c\x00" + encode_value(7),
    ]
    # A retry drops nothing (what came later stays) and records nothing.
    assert shard.run(d.DropLocalData(id=DDL, ns=NS)) == ([], reply)
    assert shard.ids(NS) == [7]


def test_a_database_drop_deletes_every_collection_of_it_and_no_other_database(shard):
    shard.given(*(keyed(k) for k in range(5)), plain(1), plain(2, "d.v"), plain(3, OTHER_DB_NS), task("t1"))
    events, _ = shard.run(d.DropLocalData(id=DDL, db=DB))
    assert [e.type for e in events] == ["LocalDataDropped", "RangeDeletionRemoved"]
    shard.commit()
    assert shard.ids(NS) == shard.ids(UNSHARDED) == shard.ids("d.v") == [] and shard.ids(OTHER_DB_NS) == [3]
    assert not any(k.startswith((b"d/d.", b"i/d.")) for k in shard.stored())


def test_the_exit_forgets_the_drops_so_a_drop_is_remembered_only_while_its_ddl_runs(shard):
    shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[NS]))
    shard.run(d.DropLocalData(id=DDL, ns=NS))
    shard.commit()
    reloaded = ShardDocuments()
    reloaded.load(shard.store)
    assert reloaded.ddl_drops == {DDL: frozenset({NS})}
    shard.run(d.ExitDDLCriticalSection(id=DDL))
    shard.commit()
    reloaded.load(shard.store)
    assert reloaded.ddl_drops == {} and reloaded.ddl_sections == {}
    assert not any(k.startswith((b"c/", b"r/")) for k in shard.stored())


def replayed(tmp_path, name: str, log: list[Record], every: int) -> dict[bytes, bytes]:
    """The store a changelog replay leaves, committing every `every` events."""
    store = Store(tmp_path / name)
    try:
        docs = ShardDocuments()
        docs.load(store)
        for i, e in enumerate(log, 1):
            docs.apply(e, i)
            if i % every == 0:
                store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
        store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
        return {k: v for k, v in store.scan(b"") if not k.startswith(META)}
    finally:
        store.close()


def compacted(log: list[Record]) -> list[Record]:
    """What log compaction may leave: the last record of each key, in log order."""
    last = {changelog_key(e): i for i, e in enumerate(log)}
    return [e for i, e in enumerate(log) if last[changelog_key(e)] == i]


def test_replaying_a_drop_from_the_changelog_gives_the_same_store(shard, tmp_path):
    shard.given(*(keyed(k) for k in range(20)), plain(1), task("t1"))
    shard.run(d.EnterDDLCriticalSection(id=DDL, namespaces=[NS, UNSHARDED]))
    shard.run(d.DropLocalData(id=DDL, ns=NS))
    shard.run(d.DropLocalData(id=DDL, db=DB))
    shard.given(keyed(5), keyed(6, extra=1))  # a collection recreated after the drop
    shard.commit()
    shard.run(d.ExitDDLCriticalSection(id=DDL))
    shard.given(keyed(6, extra=2))
    want = shard.stored()
    assert shard.ids(NS) == [5, 6] and shard.ids(UNSHARDED) == []
    assert all(changelog_key(e) is not None for e in shard.log)
    for every in (1, 3, len(shard.log)):
        assert replayed(tmp_path, f"replay-{every}", shard.log, every) == want
    # Compaction keeps each drop (its key is unique) after the documents it deletes.
    assert replayed(tmp_path, "compacted", compacted(shard.log), 1) == want


def test_statistics_forget_a_dropped_collection(tmp_path):
    sh = Shard(tmp_path, documents=CountingDocuments())
    try:
        docs = sh.documents
        assert isinstance(docs, CountingDocuments)
        sh.run(s.Insert(ns=NS, docs=[{"_id": 1, "k": 1}], routing=sh.routing(NS)))
        sh.commit()
        sh.run(s.Insert(ns=NS, docs=[{"_id": 2, "k": 2}], routing=sh.routing(NS)))
        sh.run(s.Insert(ns=OTHER_DB_NS, docs=[{"_id": 1}], routing=sh.routing(OTHER_DB_NS)))
        sh.run(d.DropLocalData(id=DDL, ns=NS))
        assert list(docs.range_sizes(NS, b"", b"\xff")) == []
        sh.commit()
        assert {ns for ns, _ in docs.take_written()} == {OTHER_DB_NS}
    finally:
        sh.close()


# ----------------------------------------------------------------------------- rename


def test_a_rename_moves_the_owned_documents_in_batches_and_drops_the_orphans(shard):
    # On a: k < 100 owned; k >= 100 orphans a migration to b left.
    shard.given(*(keyed(k) for k in range(0, 200, 4)), task("t1"))
    with pytest.raises(CommandError) as err:  # the catalog has not renamed d.c yet
        shard.run(d.RenameLocalBatch(id=DDL, ns=NS, to="d.r", limit=10))
    assert err.value.code == ErrorCode.StaleConfig and shard.faults == []
    shard.catalog_apply([d.CollectionRenamed(ns=NS, to="d.r", epoch="e2")])
    shard.run(d.DropLocalData(id=DDL, ns="d.r"))
    moved = removed = batches = 0
    while True:
        events, reply = shard.run(d.RenameLocalBatch(id=DDL, ns=NS, to="d.r", limit=10))
        shard.commit()
        batches += 1
        assert ("RangeDeletionRemoved" in [e.type for e in events]) == (batches == 1)
        moved, removed = moved + reply["moved"], removed + reply["removed"]
        if reply["done"]:
            break
    assert (moved, removed, batches) == (25, 25, 6)
    assert shard.ids(NS) == [] and shard.ids("d.r") == list(range(0, 100, 4))
    assert shard.documents.range_tasks == {}
    assert all(shard_key_part(k, doc) == PATTERN.encode_doc(doc) for k, doc in shard.documents.scan("d.r"))
    # A retried drop of the target, after the batches, keeps what they moved in.
    assert shard.run(d.DropLocalData(id=DDL, ns="d.r"))[0] == []
    assert shard.ids("d.r") == list(range(0, 100, 4))
    assert shard.run(d.RenameLocalBatch(id=DDL, ns=NS, to="d.r", limit=10)) == (
        [],
        {"id": DDL, "moved": 0, "removed": 0, "done": True},
    )
    # The renamed collection serves under its new routing.
    assert shard.run(s.Count(ns="d.r", filter={"k": {"$lt": 50}}, routing=shard.routing("d.r")))[1] == {"n": 13}


@pytest.mark.parametrize(("shard_id", "kept"), [("a", [1, 2, 3]), ("b", [])])
def test_an_unsharded_rename_moves_everything_to_the_primary_only(tmp_path, shard_id, kept):
    sh = Shard(tmp_path, shard_id)
    try:
        sh.given(plain(1), plain(2), plain(3))
        sh.catalog_apply([d.CollectionRenamed(ns=UNSHARDED, to="d.v")])
        _, reply = sh.run(d.RenameLocalBatch(id=DDL, ns=UNSHARDED, to="d.v", limit=10))
        assert reply == {"id": DDL, "moved": len(kept), "removed": 3 - len(kept), "done": True}
        assert sh.ids(UNSHARDED) == [] and sh.ids("d.v") == kept
    finally:
        sh.close()


# ------------------------------------------------------------------------------ rekey


def test_a_rekey_rewrites_under_the_refined_key_resumably_and_idempotently(shard, tmp_path):
    docs = [keyed(k, j=k % 3) if k % 2 else keyed(k) for k in range(0, 60)] + [keyed(k) for k in (120, 130)]
    shard.given(*docs, task("t1"))
    shard.catalog_apply([d.ShardKeyRefined(ns=NS, key={"k": 1, "j": 1}, epoch="e2")])
    after, rewritten, removed, batches = None, 0, 0, 0
    while True:
        events, reply = shard.run(d.RekeyLocalBatch(id=DDL, ns=NS, after=after, limit=7))
        shard.commit()
        batches += 1
        if batches == 2:
            # A restart between batches: the next one resumes from `after` over the stored state.
            again = ShardDocuments()
            again.load(shard.store)
            shard.documents = again
            shard.decider = ShardDecider("a", shard.catalog, again)
        assert ("RangeDeletionRemoved" in [e.type for e in events]) == (batches == 1)
        rewritten, removed, after = rewritten + reply["rewritten"], removed + reply["removed"], reply["after"]
        if reply["done"]:
            break
    assert (rewritten, removed) == (60, 2)
    assert shard.ids(NS) == list(range(60))
    for k, doc in shard.documents.scan(NS):
        # A missing new field is null in the key, as in MongoDB.
        assert shard_key_part(k, doc) == REFINED.encode_bound({"k": doc["k"], "j": doc.get("j")})
    assert len({doc["_id"] for _, doc in shard.documents.scan(NS)}) == 60  # no stale copies under old keys
    # Idempotent: the same pass again, from the start, rewrites nothing and records nothing.
    before = shard.stored()
    after, n = None, 0
    while True:
        events, reply = shard.run(d.RekeyLocalBatch(id=DDL, ns=NS, after=after, limit=7))
        assert events == [] and reply["rewritten"] == reply["removed"] == 0
        n, after = n + 1, reply["after"]
        if reply["done"]:
            break
    shard.commit()
    assert shard.stored() == before
    # Targeted reads under the refined key find them.
    assert shard.run(s.Find(ns=NS, filter={"k": 5, "j": 2}, routing=shard.routing(NS)))[1]["docs"] == [
        {"_id": 5, "k": 5, "j": 2}
    ]


def test_a_rekey_of_an_unsharded_collection_is_refused(shard):
    with pytest.raises(CommandError) as err:
        shard.run(d.RekeyLocalBatch(id=DDL, ns=UNSHARDED))
    assert err.value.code == ErrorCode.NamespaceNotSharded


# --------------------------------------------------------- drops and replay, generated

NAMESPACES = ("d.a", "d.b", "e.a")
OP = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMESPACES), st.integers(0, 3), st.integers(0, 9)),
    st.tuples(st.just("remove"), st.sampled_from(NAMESPACES), st.integers(0, 3)),
    st.tuples(st.just("drop"), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("dropdb"), st.sampled_from(("d", "e"))),
)


def as_events(ops) -> tuple[list[Record], dict[tuple[str, int], int]]:
    """The changelog the operations leave, and the documents (ns, _id) -> v a model says remain."""
    log: list[Record] = []
    model: dict[tuple[str, int], int] = {}
    for i, op in enumerate(ops):
        if op[0] == "write":
            _, ns, doc_id, v = op
            log.append(s.DocumentWritten(ns=ns, skey=UNSHARDED_KEY.hex(), doc={"_id": doc_id, "v": v}))
            model[(ns, doc_id)] = v
        elif op[0] == "remove":
            _, ns, doc_id = op
            log.append(s.DocumentRemoved(ns=ns, skey=UNSHARDED_KEY.hex(), id=doc_id))
            model.pop((ns, doc_id), None)
        elif op[0] == "drop":
            log.append(d.LocalDataDropped(id=f"x{i}", ns=op[1]))
            model = {k: v for k, v in model.items() if k[0] != op[1]}
        else:
            log.append(d.LocalDataDropped(id=f"x{i}", db=op[1]))
            model = {k: v for k, v in model.items() if k[0].partition(".")[0] != op[1]}
    return log, model


def folded(path, log: list[Record], commits: set[int]) -> tuple[dict[tuple[str, int], int], dict[bytes, bytes]]:
    """The documents (read back, during the last batch and after it) and the store a fold of
    `log` leaves, committing after the events whose index is in `commits`."""
    store = Store(path)
    try:
        docs = ShardDocuments()
        docs.load(store)
        for i, e in enumerate(log):
            docs.apply(e, i)
            if i in commits:
                store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
        pending = {(ns, doc["_id"]): doc["v"] for ns in NAMESPACES for _, doc in docs.scan(ns)}
        for (ns, doc_id), v in pending.items():  # the _id index agrees, before the commit too
            assert docs.find_by_id(ns, doc_id) == (UNSHARDED_KEY, {"_id": doc_id, "v": v})
        store.commit(docs.drain_changes().items(), None, docs.drain_range_deletions())
        after = {(ns, doc["_id"]): doc["v"] for ns in NAMESPACES for _, doc in docs.scan(ns)}
        assert after == pending
        return after, {k: v for k, v in store.scan(b"") if not k.startswith(META)}
    finally:
        store.close()


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OP, max_size=25), commits=st.sets(st.integers(0, 24)))
def test_any_fold_of_writes_and_drops_replays_to_the_same_store(ops, commits):
    log, model = as_events(ops)
    with tempfile.TemporaryDirectory() as tmp:
        docs, want = folded(Path(tmp) / "live", log, commits)
        assert docs == model
        # A replay in one batch, and one of what compaction may leave, give the same store.
        assert folded(Path(tmp) / "replay", log, set())[1] == want
        assert folded(Path(tmp) / "compacted", compacted(log), set(range(25)))[1] == want
