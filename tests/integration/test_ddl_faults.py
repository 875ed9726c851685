"""kill -9 at every phase of a DDL coordinator, and in a shard doing its part (issue 13,
section 3; decision 0018: coordinators resume by replay).

One cluster of real processes (config server, shards s0, s1, s2, a router) serves the whole
matrix; each case makes a fresh database with a sharded collection whose documents lie on all
three shards, restarts the victim with a fault point armed, starts the DDL, waits for the victim
to die, restarts it without the fault, waits until the coordinator is done, then checks:

- the DDL succeeded (a crash never rolls it back: it resumes at its checkpointed phase) and
  the catalog changed exactly once (its change event and DDLFinished once each);
- every shard's documents, folded from its changelog, match the catalog: nothing left of a
  dropped collection or database; after a rename (over an existing target: dropTarget) or a
  refine, every document is readable once through the router and stored only on the shard
  that owns it, and nothing of the replaced target is left;
- no critical section is left on any shard (folded from its changelog) and CRUD works.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from domain.follower import replay_catalog
from domain.shardkey import encode_value
from libs.client import AsyncCluster
from libs.requests import Requester, RequestTimeout
from libs.service import ServiceSettings
from schemas import config as c
from schemas import ddl as d
from schemas import shard as s
from tests.conftest import ProcessCluster, read_events, read_records, wait_until

pytestmark = pytest.mark.kafka

DOCS = 200
SHARDS = ("s0", "s1", "s2")
MAXK = {"$maxKey": 1}
OPS = ["dropCollection", "dropDatabase", "renameCollection", "refineCollectionShardKey"]
PHASES = ["freezeMigrations", "blockCRUD", "commit", "applyOnShards", "releaseCRUD"]
CASES = (
    [("config", f"ddl.{phase}@{op}", op) for phase in PHASES for op in OPS]
    + [
        # Just before the point of no return's transaction, and after every shard's work.
        ("config", "ddl.commit.done@renameCollection", "renameCollection"),
        ("config", "ddl.applyOnShards.done@refineCollectionShardKey", "refineCollectionShardKey"),
    ]
    + [
        ("s1", "ddl.shard.DropLocalData", "dropCollection"),
        ("s1", "ddl.shard.RenameLocalBatch", "renameCollection"),
        ("s2", "ddl.shard.RekeyLocalBatch", "refineCollectionShardKey"),
    ]
)
SERVICES = {
    "config": ("services.config", (), "config", "active"),
    **{sid: ("services.shard", ("--shard-id", sid), f"shard-{sid}", "active") for sid in SHARDS},
    "router": ("services.router", ("--instance", "r1"), "router-r1", None),
}
_numbers = itertools.count()


class Cluster(ProcessCluster):
    services = SERVICES


@pytest.fixture(scope="module")
def procs(bootstrap, tmp_path_factory):
    from libs import kafka
    from libs.topics import Topics

    name = f"tdf{int(time.time()) % 100000}"
    asyncio.run(kafka.ensure_topics(bootstrap, Topics(name).core()))
    cl = Cluster(
        ServiceSettings(bootstrap, name, tmp_path_factory.mktemp("ddlfaults") / "data", session_timeout_ms=6000)
    )
    cl.start("config")
    for sid in SHARDS:
        cl.config(c.AddShard(shard=sid))
    for service in (*SHARDS, "router"):
        cl.start(service)
    yield cl
    cl.stop_all()


def client(settings, fn, timeout: float = 120):
    async def go():
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=timeout) as ac:
            return await fn(ac)

    return asyncio.run(go())


def coll(ac: AsyncCluster, ns: str):
    db, name = ns.split(".", 1)
    return ac[db][name]


def migrated(cl: Cluster, ns: str, lo: dict, hi: dict, to: str) -> None:
    mid = cl.config(c.MoveRange(ns=ns, min=lo, max=hi, to=to)).result["id"]
    t = cl.settings.topics
    wait_until(
        lambda: cl.ask(t.config_commands, c.GetMigration(id=mid)).result["state"] != "active", 90, f"the move to {to}"
    )
    assert cl.ask(t.config_commands, c.GetMigration(id=mid)).result["state"] == "committed"


def setup(cl: Cluster, db: str) -> str:
    """`db`.c sharded on k over three shards (empty ranges moved, then loaded: no orphans), and
    an unsharded `db`.u of 20 documents (the target a rename replaces)."""
    ns = f"{db}.c"
    cl.config(c.CreateDatabase(db=db, primary="s0"))
    cl.config(c.ShardCollection(ns=ns, key={"k": 1}))
    cl.config(c.SplitChunk(ns=ns, at=[{"k": 70}, {"k": 140}]))
    migrated(cl, ns, {"k": 70}, {"k": 140}, "s1")
    migrated(cl, ns, {"k": 140}, {"k": MAXK}, "s2")

    async def load(ac):
        await coll(ac, ns).insert_many([{"_id": i, "k": i, "b": i % 3} for i in range(DOCS)])
        await coll(ac, f"{db}.u").insert_many([{"_id": 1000 + i, "u": True} for i in range(20)])

    client(cl.settings, load)
    return ns


def request_for(op: str, ns: str):
    db = ns.split(".")[0]
    return {
        "dropCollection": d.DropCollection(ns=ns),
        "dropDatabase": d.DropDatabase(db=db),
        "renameCollection": d.RenameCollection(ns=ns, to=f"{db}.u", dropTarget=True),
        "refineCollectionShardKey": d.RefineCollectionShardKey(ns=ns, key={"k": 1, "b": 1}),
    }[op]


def shard_state(settings, sid: str) -> tuple[dict[str, dict], set[str]]:
    """A shard's documents (ns -> {_id key: doc}) and open DDL critical sections, folded from
    its changelog (orphans included)."""
    docs: dict[str, dict] = {}
    sections: set[str] = set()
    for rec in read_records(settings.bootstrap, settings.topics.shard_changelog(sid)):
        if rec.value is None:
            continue
        e = s.changelog.decode(rec.value)
        if isinstance(e, s.DocumentWritten):
            docs.setdefault(e.ns, {})[encode_value(e.doc["_id"])] = e.doc
        elif isinstance(e, s.DocumentRemoved):
            docs.get(e.ns, {}).pop(encode_value(e.id), None)
        elif isinstance(e, d.LocalDataDropped):
            for ns in [n for n in docs if n == e.ns or (e.db is not None and n.partition(".")[0] == e.db)]:
                del docs[ns]
        elif isinstance(e, d.DDLCriticalSectionRecorded):
            sections.add(e.id)
        elif isinstance(e, d.DDLCriticalSectionRemoved):
            sections.discard(e.id)
    return docs, sections


async def started(settings, cmd) -> str:
    """Start the DDL; the config server may die before it answers: the same request again
    joins the coordinator it started (or starts it)."""
    deadline = time.monotonic() + 180
    async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
        while True:
            try:
                reply = await r.request(settings.topics.config_commands, cmd, timeout=30)
                break
            except RequestTimeout:
                assert time.monotonic() < deadline, f"{cmd.type} never answered"
    assert reply.ok and reply.result["started"], reply
    return str(reply.result["id"])


async def outcome(settings, ddl_id: str, timeout: float = 120) -> dict:
    async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
        deadline = time.monotonic() + timeout
        while True:
            try:
                rep = await r.request(settings.topics.config_commands, d.GetDDL(id=ddl_id), timeout=30)
            except RequestTimeout:
                rep = None
            if rep is not None and rep.result["state"] == "done":
                return dict(rep.result)
            assert time.monotonic() < deadline, f"DDL {ddl_id} not done after the restart: {rep and rep.result}"
            await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    "victim,fault,op",
    CASES,
    ids=[f"{v}-{f.removeprefix('ddl.').replace('@', '-').replace('.', '_')}" for v, f, _ in CASES],
)
def test_kill9_during_a_ddl(procs, victim, fault, op):
    cl, settings = procs, procs.settings
    db = f"f{next(_numbers)}x{int(time.time()) % 1000}"
    ns = setup(cl, db)
    proc = cl.start(victim, fault)
    before = read_events(settings.bootstrap, settings.topics.config_events)

    async def scenario():
        request = asyncio.create_task(started(settings, request_for(op, ns)))
        await asyncio.to_thread(
            wait_until, lambda: proc.proc.poll() is not None, 120, f"{victim} to hit {fault}", 0.05, proc.tail
        )
        assert proc.proc.returncode == -9, f"{victim} exited with {proc.proc.returncode}:\n{proc.tail()}"
        await asyncio.to_thread(cl.start, victim)  # restarted, without the fault
        ddl_id = await request
        return ddl_id, await outcome(settings, ddl_id)

    ddl_id, result = asyncio.run(scenario())
    assert result["ok"] is True, f"{op} rolled back: {result}\n{cl.procs['config'].tail()}"

    # The catalog changed exactly once.
    events = [e for o, e in read_events(settings.bootstrap, settings.topics.config_events) if o > before[-1][0]]
    change = {
        "dropCollection": d.CollectionDropped,
        "dropDatabase": d.DatabaseDropped,
        "renameCollection": d.CollectionRenamed,
        "refineCollectionShardKey": d.ShardKeyRefined,
    }[op]
    assert len([e for e in events if isinstance(e, change)]) == 1, [e.type for e in events]
    assert len([e for e in events if isinstance(e, d.DDLFinished) and e.id == ddl_id]) == 1
    catalog = asyncio.run(replay_catalog(settings.bootstrap, settings.topics.config_events))
    assert ddl_id not in catalog.ddl

    states = {sid: shard_state(settings, sid) for sid in SHARDS}
    for sid, (_, sections) in states.items():
        assert not sections, f"{sid} still holds DDL critical sections {sections}"
    held = {sid: {ns_: set(docs) for ns_, docs in st[0].items() if docs} for sid, st in states.items()}

    if op == "dropCollection":
        assert ns not in catalog.collections and catalog.uuid_of(ns) is None
        assert all(ns not in h for h in held.values()), held
        assert all(len(h.get(f"{db}.u", ())) == (20 if sid == "s0" else 0) for sid, h in held.items())
        live = ns
    elif op == "dropDatabase":
        assert db not in catalog.databases and not [n for n in catalog.collections if n.startswith(db + ".")]
        assert all(not any(n.startswith(db + ".") for n in h) for h in held.values()), held
        live = ns
    else:
        live = ns if op == "refineCollectionShardKey" else f"{db}.u"
        if op == "renameCollection":
            assert ns not in catalog.collections and all(ns not in h for h in held.values()), held
        else:
            assert catalog.collections[ns].pattern.spec == {"k": 1, "b": 1}
        target = catalog.collections[live]
        docs = client(settings, lambda ac: coll(ac, live).find({}).to_list())
        assert sorted(x["_id"] for x in docs) == list(range(DOCS)), "a document lost or doubled, or the target's kept"
        for sid, st in states.items():
            for doc in st[0].get(live, {}).values():
                owner = target.chunks[target.chunk_index(target.pattern.encode_doc(doc))].shard
                assert owner == sid, f"{doc['_id']} stored on {sid}, owned by {owner}"
        assert sum(len(st[0].get(live, {})) for st in states.values()) == DOCS

    # No critical section left: CRUD on the namespace is served.
    async def crud(ac):
        await coll(ac, live).insert_one({"_id": "after", "k": 1, "b": 1})
        return await coll(ac, live).find_one({"_id": "after"})

    assert client(settings, crud, timeout=30) == {"_id": "after", "k": 1, "b": 1}
