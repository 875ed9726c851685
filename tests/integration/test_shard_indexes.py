"""Secondary indexes on real shards against a real broker, driven through the shards' own
requests (BuildIndexes, ListIndexes, DropIndexes, as the config server's DDL coordinator
sends them): a build on a loaded collection while a client writes, unique
builds and unique writes, a migration's recipient that builds the index before it clones,
range deletion, drop and rename; kill -9 of a shard mid-build, and a shard that lost its
store rebuilding the same entries from its changelog.

Every check compares the entries the shard keeps (`k/` keys of its RocksDB store) with a
fresh rebuild from its documents (domain.indexes.entries), key by key."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import signal
import threading
import time

import pymongo
import pytest

from domain.indexes import IndexSpec, entries
from libs.requests import Requester
from libs.service import ServiceSettings
from libs.store import Store
from schemas import config as c
from schemas import indexes as ix
from schemas import shard as s
from services.shard.documents import ShardDocuments
from tests.conftest import ProcessCluster, wait_until

pytestmark = pytest.mark.kafka


def ask(cl, sid: str, req):
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(cl.settings.topics.shard_requests(sid), req, timeout=30)

    return cl.call(go())


def index_state(cl, sid: str, ns: str, name: str) -> dict:
    rep = ask(cl, sid, ix.ListIndexes(ns=ns))
    assert rep.ok, rep
    return next((i for i in rep.result["indexes"] if i["spec"]["name"] == name), {})


def finished(cl, sid: str, ns: str, name: str, timeout: float = 120) -> dict:
    """ListIndexes until the index is ready or failed (as the DDL coordinator polls)."""
    return wait_until(
        lambda: (i := index_state(cl, sid, ns, name)).get("state") in ("ready", "failed") and i,
        timeout,
        f"index {name} of {ns} on {sid} to finish",
    )


def kept_and_rebuilt(cl, sid: str, ns: str, spec: dict) -> tuple[list, list]:
    """(the shard's entries of the index, a fresh rebuild from its documents), read on its loop."""
    index = IndexSpec.parse(spec)

    async def go():
        docs = cl.shards[sid].documents
        kept = list(docs.scan_index(ns, index.name))
        rebuilt: dict = {}
        for _, doc in docs.scan(ns):
            for k, key in entries(index, doc)[0].items():
                rebuilt[k] = (k, key, doc["_id"])
        return kept, [rebuilt[k] for k in sorted(rebuilt)]

    return cl.call(go())


def stored_keys(cl, sid: str, prefix: bytes) -> list[bytes]:
    async def go():
        return [k for k, _ in cl.shards[sid].documents.store.scan(prefix)]

    return cl.call(go())


class Writer(threading.Thread):
    """A client inserting, updating and deleting through the router until stopped."""

    def __init__(self, coll, start_id: int, ids: int):
        super().__init__(daemon=True)
        self.coll, self.next_id, self.ids = coll, start_id, ids
        self.stop_event = threading.Event()
        self.done = 0  # writes completed (acknowledged by the router)
        self.error: BaseException | None = None  # what stopped the writer early, if anything

    def run(self):
        try:
            self._write()
        except BaseException as e:  # noqa: BLE001  (reported by the test, not lost in the thread)
            self.error = e

    def _write(self):
        i = 0
        while not self.stop_event.is_set():
            i += 1
            if i % 3 == 0:
                self.coll.insert_one({"_id": self.next_id, "k": self.next_id % 1000, "a": i % 17, "t": [i % 3, 5]})
                self.next_id += 1
            elif i % 3 == 1:
                self.coll.update_one({"_id": (i * 7919) % self.ids}, {"$set": {"a": i % 23}})
            else:
                self.coll.delete_one({"_id": (i * 104729) % self.ids})
            self.done += 1

    def stop(self):
        self.stop_event.set()
        self.join(30)


def test_a_build_on_a_loaded_collection_while_a_client_writes_indexes_every_document_once(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="ib", primary="s0"))
    cl.command(c.CreateCollection(ns="ib.c"))
    cl.shards["s0"].index_builder.limit = 100  # many steps, with the writer's writes between them
    client = cl.mongo_client()
    coll = client["ib"]["c"]
    coll.insert_many([{"_id": i, "k": i % 1000, "a": i % 13, "t": [i % 4, i % 5]} for i in range(3000)])
    writer = Writer(coll, 10_000, 3000)
    writer.start()
    wait_until(lambda: writer.done > 20, 30, "the writer to write")
    specs = [{"key": {"a": 1, "_id": -1}, "name": "a_id"}, {"key": {"t": 1}}]
    rep = ask(cl, "s0", ix.BuildIndexes(ns="ib.c", indexes=specs, buildId="it-1"))
    assert rep.ok and [i["state"] for i in rep.result["indexes"]] == ["building", "building"], rep
    under_way = wait_until(
        lambda: (i := index_state(cl, "s0", "ib.c", "a_id")).get("scanned", 0) > 0 and i, 60, "the build's progress"
    )
    writes_at_first_step = writer.done  # writes completed once the build has stepped at least once
    states = [finished(cl, "s0", "ib.c", n) for n in ("a_id", "t_1")]
    writes_at_ready = writer.done  # ... and once both indexes are ready
    wait_until(lambda: writer.done > 200, 60, "more writes after the build")
    writer.stop()
    assert writer.error is None, writer.error
    # The build was seen mid-way (its steps left), so the writes counted between the two
    # readings were made while it was running: it did not block them.
    assert under_way["state"] == "building", under_way
    assert writes_at_ready > writes_at_first_step, (writes_at_first_step, writes_at_ready)
    assert [st["state"] for st in states] == ["ready", "ready"], states
    assert states[1]["multikey"] and not states[0]["multikey"]
    for spec in specs:
        kept, rebuilt = kept_and_rebuilt(cl, "s0", "ib.c", spec)
        assert len(kept) > 1000 and kept == rebuilt


def test_a_unique_build_with_a_duplicate_fails_with_no_entry_left_and_unique_writes_are_enforced(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="iu", primary="s0"))
    cl.command(c.CreateCollection(ns="iu.c"))
    client = cl.mongo_client()
    coll = client["iu"]["c"]
    coll.insert_many([{"_id": i, "email": f"u{i}@x"} for i in range(500)] + [{"_id": 999, "email": "u250@x"}])
    spec = {"key": {"email": 1}, "unique": True}
    assert ask(cl, "s0", ix.BuildIndexes(ns="iu.c", indexes=[spec], buildId="u-1")).ok
    failed = finished(cl, "s0", "iu.c", "email_1")
    assert failed["state"] == "failed" and failed["error"]["code"] == "DuplicateKey", failed
    assert failed["error"]["keyValue"] == {"email": "u250@x"}
    assert stored_keys(cl, "s0", b"k/iu.c\x00") == []
    rep = ask(cl, "s0", ix.DropIndexes(ns="iu.c", names=["email_1"], missingOk=True))  # the coordinator's rollback
    assert rep.ok and rep.result["dropped"] == ["email_1"], rep

    coll.delete_one({"_id": 999})
    assert ask(cl, "s0", ix.BuildIndexes(ns="iu.c", indexes=[spec], buildId="u-2")).ok
    assert finished(cl, "s0", "iu.c", "email_1")["state"] == "ready"
    with pytest.raises(pymongo.errors.DuplicateKeyError) as e:
        coll.insert_one({"_id": 1000, "email": "u7@x"})
    assert e.value.code == 11000 and 'index: email_1 dup key: { email: "u7@x" }' in str(e.value)
    assert e.value.details.get("keyValue") == {"email": "u7@x"}

    # Concurrent inserts of the same keys: exactly one document per key gets in.
    results: list = []

    def insert(worker: int):
        for k in range(30):
            try:
                coll.insert_one({"_id": f"w{worker}-{k}", "email": f"new{k}@x"})
                results.append(k)
            except pymongo.errors.DuplicateKeyError:
                pass

    threads = [threading.Thread(target=insert, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(30))
    assert coll.count_documents({"email": {"$in": [f"new{k}@x" for k in range(30)]}}) == 30
    kept, rebuilt = kept_and_rebuilt(cl, "s0", "iu.c", spec)
    assert kept == rebuilt and len(kept) == 530


def test_a_migrations_recipient_builds_the_index_before_it_clones_and_range_deletion_takes_the_entries(
    data_cluster,
):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="im", primary="s0"))
    cl.command(c.ShardCollection(ns="im.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="im.c", at=[{"k": 500}]))
    client = cl.mongo_client()
    client["im"]["c"].insert_many([{"_id": i, "k": i, "a": i % 10} for i in range(1000)])
    spec = {"key": {"a": 1}}
    assert ask(cl, "s0", ix.BuildIndexes(ns="im.c", indexes=[spec], buildId="m-1", shardKey={"k": 1})).ok
    assert finished(cl, "s0", "im.c", "a_1")["state"] == "ready"
    assert index_state(cl, "s1", "im.c", "a_1") == {}  # s1 owns no chunk: no index yet

    mid = cl.command(c.MoveRange(ns="im.c", min={"k": 500}, max={"k": {"$maxKey": 1}}, to="s1")).result["id"]

    def committed():
        rep = ask_config(cl, c.GetMigration(id=mid))
        return rep.ok and rep.result["state"] == "committed"

    wait_until(committed, 90, "the move")
    assert index_state(cl, "s1", "im.c", "a_1")["state"] == "ready"
    kept, rebuilt = kept_and_rebuilt(cl, "s1", "im.c", spec)
    assert len(kept) == 500 and kept == rebuilt

    # The donor's orphans go with their entries (DeleteRangeBatch, as the range deleter sends it).
    def task_ready():
        task = cl.shards["s0"].documents.range_tasks.get(mid)
        return task is not None and not task.pending

    wait_until(task_ready, 30, "the donor's range-deletion task to be ready")

    def delete_batch():
        rep = ask(cl, "s0", s.DeleteRangeBatch(task=mid, limit=200))
        assert rep.ok, rep
        return rep.result["done"]

    wait_until(delete_batch, 60, "the range deletion")
    kept, rebuilt = kept_and_rebuilt(cl, "s0", "im.c", spec)
    assert len(kept) == 500 and kept == rebuilt


def ask_config(cl, req):
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(cl.settings.topics.config_commands, req, timeout=30)

    return cl.call(go())


def test_drop_and_rename_leave_no_stray_entry(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="idr", primary="s0"))
    for coll_name in ("gone", "old"):
        cl.command(c.CreateCollection(ns=f"idr.{coll_name}"))
    client = cl.mongo_client()
    client["idr"]["gone"].insert_many([{"_id": i, "a": i} for i in range(50)])
    client["idr"]["old"].insert_many([{"_id": i, "a": -i} for i in range(50)])
    for ns in ("idr.gone", "idr.old"):
        assert ask(cl, "s0", ix.BuildIndexes(ns=ns, indexes=[{"key": {"a": 1}}], buildId=f"b-{ns}")).ok
        assert finished(cl, "s0", ns, "a_1")["state"] == "ready"

    client["idr"].drop_collection("gone")  # the DDL coordinator: DropLocalData on the shards
    wait_until(lambda: stored_keys(cl, "s0", b"k/idr.gone\x00") == [], 30, "the dropped collection's entries to go")
    assert stored_keys(cl, "s0", b"n/idr.gone\x00") == []

    client.admin.command("renameCollection", "idr.old", to="idr.new")
    wait_until(lambda: stored_keys(cl, "s0", b"k/idr.old\x00") == [], 30, "the old name's entries to go")
    assert index_state(cl, "s0", "idr.new", "a_1")["state"] == "ready"
    kept, rebuilt = kept_and_rebuilt(cl, "s0", "idr.new", {"key": {"a": 1}})
    assert len(kept) == 50 and kept == rebuilt


# ------------------------------------------------------------------ kill -9 and a lost store

_numbers = itertools.count()


class Cluster(ProcessCluster):
    services = {
        "config": ("services.config", (), "config", "active"),
        "shard": ("services.shard", ("--shard-id", "s0"), "shard-s0", "active"),
    }

    def spawn_shard(self, fault: str | None = None):
        """A new shard process (the running one stops first), 25 documents per build step,
        killing itself (SIGKILL) at the fault point `fault` if given; not waited for."""
        from tests.conftest import ServiceProcess

        if "shard" in self.procs:
            self.procs["shard"].stop()
        env = {"SHARDLOG_INDEX_BUILD_BATCH": "25", "SHARDLOG_FAULTS": f"{fault}=kill" if fault else ""}
        p = self.procs["shard"] = ServiceProcess(
            self.settings, "services.shard", "--shard-id", "s0", ready_name="shard-s0", env=env
        )
        return p

    def start_shard(self, fault: str | None = None):
        p = self.spawn_shard(fault)
        p.wait_ready(timeout=90, role="active")
        return p

    def shard(self, req):
        reply = self.ask(self.settings.topics.shard_requests("s0"), req, timeout=30)
        assert reply.ok, reply
        return reply.result


def died_at(p, point: str, timeout: float = 120) -> None:
    """Wait for the shard to kill itself at fault point `point` (SIGKILL: exit status -9)."""
    wait_until(lambda: p.proc.poll() is not None, timeout, f"the shard to die at {point}", detail=p.tail)
    assert p.proc.returncode == -signal.SIGKILL, (p.proc.returncode, p.tail())


def stored_entries(data_dir, ns: str, spec: dict) -> tuple[list, list]:
    """(entries, fresh rebuild) read from the stopped shard's store."""
    store = Store(data_dir / "shard-s0" / "documents")
    try:
        docs = ShardDocuments()
        docs.load(store)
        index = IndexSpec.parse(spec)
        kept = list(docs.scan_index(ns, index.name))
        rebuilt: dict = {}
        for _, doc in docs.scan(ns):
            for k, key in entries(index, doc)[0].items():
                rebuilt[k] = (k, key, doc["_id"])
        return kept, [rebuilt[k] for k in sorted(rebuilt)]
    finally:
        store.close()


def stored_index(data_dir, ns: str, name: str) -> tuple[ix.IndexRecorded | None, int]:
    """(the index's record, the number of its entry keys) in the stopped shard's store."""
    store = Store(data_dir / "shard-s0" / "documents")
    try:
        docs = ShardDocuments()
        docs.load(store)
        index = docs.indexes.get(ns, {}).get(name)
        prefix = b"k/" + ns.encode() + b"\x00" + name.encode() + b"\x00"
        return (index.record if index is not None else None), sum(1 for _ in store.scan(prefix))
    finally:
        store.close()


def process_cluster(bootstrap, tmp_path) -> tuple[Cluster, object]:
    from libs import kafka
    from libs.topics import Topics

    name = f"ik{next(_numbers)}{int(time.time()) % 100000}"
    asyncio.run(kafka.ensure_topics(bootstrap, Topics(name).core()))
    data_dir = tmp_path / "data"
    return Cluster(ServiceSettings(bootstrap, name, data_dir, session_timeout_ms=6000)), data_dir


def test_kill9_mid_build_resumes_and_a_lost_store_rebuilds_the_same_entries(bootstrap, tmp_path):
    """The shard kills itself at two fixed points of a build (fault points, not a race): at its
    first step (nothing scanned yet) and at its last, exclusive step (everything scanned, not
    ready).  Each time the store says `building`; the restarted shard resumes from there."""
    cl, data_dir = process_cluster(bootstrap, tmp_path)
    try:
        cl.start("config")
        cl.config(c.AddShard(shard="s0"))
        at = cl.config(c.CreateDatabase(db="ik", primary="s0")).configTime
        shard = cl.start_shard(fault="index.build_step")
        routing = s.Routing(configTime=at)
        for part in range(6):
            docs = [{"_id": i, "a": (i * 37) % 101, "b": [i % 3, "x"]} for i in range(part * 500, (part + 1) * 500)]
            assert cl.shard(s.Insert(ns="ik.c", docs=docs, routing=routing))["inserted"] == 500
        spec = {"key": {"b": 1, "a": -1}}
        built = cl.shard(ix.BuildIndexes(ns="ik.c", indexes=[spec], buildId="k-1"))
        assert [i["state"] for i in built["indexes"]] == ["building"], built

        # 1. Killed deciding the first step: recorded building, nothing scanned, no entry.
        died_at(shard, "index.build_step")
        record, n_entries = stored_index(data_dir, "ik.c", "b_1_a_-1")
        assert record is not None and record.state == "building", record
        assert (record.scanned, record.scannedTo, record.total, n_entries) == (0, "", 3000, 0), (record, n_entries)

        # 2. Restarted: the build resumes and is killed at its last step (the one that would
        #    record it ready): every step before it recorded, still building.
        shard = cl.spawn_shard(fault="index.build_ready")
        died_at(shard, "index.build_ready")
        record, n_entries = stored_index(data_dir, "ik.c", "b_1_a_-1")
        assert record is not None and record.state == "building", record
        assert record.scanned == 3000 and record.scannedTo != "", record
        assert n_entries == 3000 * 2  # two entries per document (b is [i % 3, "x"]): all of them, once
        kept, rebuilt = stored_entries(data_dir, "ik.c", spec)
        assert kept == rebuilt

        # 3. Restarted without a fault: it resumes from its scannedTo (not from the start: the
        #    count of documents scanned does not go past the documents) while writes go on.
        shard = cl.start_shard()

        def listed():
            return next(i for i in cl.shard(ix.ListIndexes(ns="ik.c"))["indexes"] if i["spec"]["name"] == "b_1_a_-1")

        cl.shard(s.Insert(ns="ik.c", docs=[{"_id": 5000 + i, "a": i, "b": i} for i in range(50)], routing=routing))
        cl.shard(s.Delete(ns="ik.c", filter={"_id": {"$lt": 40}}, multi=True, routing=routing))
        done = wait_until(lambda: (i := listed())["state"] != "building" and i, 120, "the resumed build")
        assert done["state"] == "ready" and 3000 <= done["scanned"] <= 3050, done
        shard.stop()
        kept, rebuilt = stored_entries(data_dir, "ik.c", spec)
        assert len(kept) == (3000 - 40) * 2 + 50 and kept == rebuilt

        # The store is lost: the shard replays its changelog and has the same entries.
        shutil.rmtree(data_dir / "shard-s0" / "documents")
        shard = cl.start_shard()
        assert listed()["state"] == "ready"
        shard.stop()
        again, _ = stored_entries(data_dir, "ik.c", spec)
        assert again == kept
    finally:
        cl.stop_all()


def test_kill9_at_a_unique_builds_failing_step_rolls_back_cleanly(bootstrap, tmp_path):
    """A unique build over a duplicate: the shard kills itself deciding the step that records
    the build failed.  It died `building`, with the earlier steps' entries in its store (a half
    index); restarted, the build resumes, fails again on the same key, keeps no entry, and the
    coordinator's rollback (DropIndexes missingOk) leaves no trace of it."""
    cl, data_dir = process_cluster(bootstrap, tmp_path)
    try:
        cl.start("config")
        cl.config(c.AddShard(shard="s0"))
        at = cl.config(c.CreateDatabase(db="iku", primary="s0")).configTime
        shard = cl.start_shard(fault="index.build_failed")
        routing = s.Routing(configTime=at)
        docs = [{"_id": i, "email": f"u{i}@x"} for i in range(300)] + [{"_id": 999, "email": "u123@x"}]
        assert cl.shard(s.Insert(ns="iku.c", docs=docs, routing=routing))["inserted"] == 301
        spec = {"key": {"email": 1}, "unique": True}
        cl.shard(ix.BuildIndexes(ns="iku.c", indexes=[spec], buildId="ku-1"))

        died_at(shard, "index.build_failed")
        record, n_entries = stored_index(data_dir, "iku.c", "email_1")
        assert record is not None and record.state == "building", record
        assert record.scanned == 300 and n_entries == 300, (record, n_entries)  # 12 steps of 25: a half index

        shard = cl.start_shard()

        def listed():
            return next(
                (i for i in cl.shard(ix.ListIndexes(ns="iku.c"))["indexes"] if i["spec"]["name"] == "email_1"), None
            )

        failed = wait_until(lambda: (i := listed()) is not None and i["state"] != "building" and i, 120, "the build")
        assert failed["state"] == "failed" and failed["error"]["code"] == "DuplicateKey", failed
        assert failed["error"]["keyValue"] == {"email": "u123@x"}
        dropped = cl.shard(ix.DropIndexes(ns="iku.c", names=["email_1"], missingOk=True))  # the rollback
        assert dropped["dropped"] == ["email_1"], dropped
        assert listed() is None
        shard.stop()
        record, n_entries = stored_index(data_dir, "iku.c", "email_1")
        assert (record, n_entries) == (None, 0)
        store = Store(data_dir / "shard-s0" / "documents")
        try:
            assert [k for k, _ in store.scan(b"k/iku.c\x00")] == [] and [k for k, _ in store.scan(b"n/iku.c\x00")] == []
        finally:
            store.close()
    finally:
        cl.stop_all()
