"""shardlog — the operator's entry point.

Every subcommand prints for humans, or JSON with `--json`; an error exits
non-zero with one line.  Cluster address from --bootstrap / $KAFKA_BOOTSTRAP,
cluster name (topic prefix) from --cluster / $SHARDLOG_CLUSTER.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from domain.protocol import ErrorCode
from domain.shardkey import to_ejson
from libs import kafka, tracing
from libs.requests import Requester, RequestTimeout
from libs.topics import Topics
from schemas import Record
from schemas import config as c
from schemas.reply import Reply

app = typer.Typer(
    help="Operate a shardlog cluster.", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
)
zone_app = typer.Typer(help="Zones: tag shards, pin key ranges to them.", no_args_is_help=True)
settings_app = typer.Typer(help="Cluster and collection settings.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics of the cluster.", no_args_is_help=True)
app.add_typer(zone_app, name="zone")
app.add_typer(settings_app, name="settings")
app.add_typer(topics_app, name="topics")


def _register_workload() -> None:
    from cli.workload import workload_app  # after `app` exists: it looks cli.main up lazily

    app.add_typer(workload_app, name="workload")


out = Console()
err = Console(stderr=True)

JsonOpt = typer.Option(False, "--json", help="machine-readable output")


@dataclass
class Ctx:
    bootstrap: str
    cluster: str
    timeout: float

    @property
    def topics(self) -> Topics:
        return Topics(self.cluster)


_ctx: Ctx | None = None


@app.callback()
def main(
    bootstrap: str = typer.Option(None, "--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"),
    cluster: str = typer.Option("shardlog", "--cluster", envvar="SHARDLOG_CLUSTER", help="cluster name (topic prefix)"),
    timeout: float = typer.Option(30.0, "--timeout", help="seconds to wait for a reply"),
) -> None:
    global _ctx
    _ctx = Ctx(bootstrap or "127.0.0.1:9092", cluster, timeout)
    try:
        Topics(cluster)
    except ValueError as e:
        fail(str(e), code=ErrorCode.BadValue, as_json=False, exit_code=2)


# ----------------------------------------------------------------- helpers


def fail(message: str, *, code: str = "Error", as_json: bool, exit_code: int = 1) -> None:
    if as_json:
        print(json.dumps({"ok": False, "code": code, "error": message}))
    else:
        err.print(f"[red]error[/red]: {code}: {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(exit_code)


def parse_json(text: str, what: str, as_json: bool) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        fail(
            f"invalid JSON for {what}: {e.msg} at column {e.colno}",
            code=ErrorCode.BadValue,
            as_json=as_json,
            exit_code=2,
        )


def run(coro):
    try:
        return asyncio.run(coro)
    except RequestTimeout as e:
        fail(str(e), code=ErrorCode.Timeout, as_json="--json" in sys.argv)
    except (OSError, kafka_errors()) as e:
        fail(
            f"cannot reach Kafka at {_ctx.bootstrap}: {e}",
            code=ErrorCode.KafkaUnavailable,
            as_json="--json" in sys.argv,
        )


def kafka_errors():
    from aiokafka.errors import KafkaError

    return KafkaError


async def _request(command: Record, span_name: str) -> Reply:
    await _check_cluster()
    tracing.setup("shardlog-cli")
    with tracing.tracer.start_as_current_span(span_name, attributes={"shardlog.command": command.type}):
        async with Requester(_ctx.bootstrap, _ctx.topics.cli_replies, client_id="shardlog-cli") as r:
            try:
                return await r.request(_ctx.topics.config_commands, command, timeout=_ctx.timeout)
            finally:
                tracing.shutdown()


async def _check_cluster() -> None:
    """Fail at once, clearly, if the cluster's topics do not exist (rather than wait on them)."""
    missing = await kafka.missing_topics(_ctx.bootstrap, [_ctx.topics.config_commands, _ctx.topics.cli_replies])
    if missing:
        fail(
            f"cluster {_ctx.cluster!r} has no topics at {_ctx.bootstrap} ({', '.join(missing)} missing): is it "
            f"started? (`make up`, or `shardlog topics create`)",
            code=ErrorCode.ClusterNotFound,
            as_json="--json" in sys.argv,
        )


def send(command: Record, as_json: bool, human) -> None:
    """Send a config command, print its reply; exit 1 on a refusal."""
    reply = run(_request(command, f"shardlog {command.type}"))
    if not reply.ok:
        fail(reply.error or "", code=reply.code or "Error", as_json=as_json)
    if as_json:
        print(json.dumps({"ok": True, "configTime": reply.configTime, **(reply.result or {})}))
    else:
        human(reply.result or {})
        out.print(f"[dim]ConfigTime {reply.configTime}[/dim]")


def b(doc: Any) -> str:
    return json.dumps(to_ejson(doc), separators=(",", ":"))


# ------------------------------------------------------------------ topics


@topics_app.command("create")
def topics_create(json_out: bool = JsonOpt) -> None:
    """Create the cluster's core topics (idempotent)."""
    created = run(kafka.ensure_topics(_ctx.bootstrap, _ctx.topics.core()))
    if json_out:
        print(json.dumps({"ok": True, "created": created}))
    else:
        out.print(f"created {', '.join(created)}" if created else "all topics already exist")


@app.command("dead-letters")
def dead_letters(limit: int = typer.Option(20, help="show the last N"), json_out: bool = JsonOpt) -> None:
    """Records that did not parse, with the reason and where they came from."""

    async def read():
        got = []

        async def take(records):
            got.extend(records)

        # commit markers take offsets too: start twice as far back
        await kafka.read_to_end(
            _ctx.bootstrap, _ctx.topics.dead_letters, take, start=-limit * 2, client_id="shardlog-cli"
        )
        return got[-limit:]

    rows = []
    for r in run(read()):
        h = {k: v.decode(errors="replace") for k, v in r.headers or ()}
        rows.append(
            {
                "offset": r.offset,
                "timestamp": r.timestamp,
                "reason": h.get("dlq.reason"),
                "from": f"{h.get('dlq.topic')}@{h.get('dlq.offset')}",
                "value": (r.value or b"")[:200].decode(errors="replace"),
            }
        )
    if json_out:
        print(json.dumps({"ok": True, "deadLetters": rows}))
        return
    t = Table("offset", "from", "reason", "value", title=f"dead letters of {_ctx.cluster!r}")
    for row in rows:
        t.add_row(str(row["offset"]), row["from"], row["reason"] or "", row["value"])
    out.print(t if rows else "no dead letters")


# ------------------------------------------------------------------ shards


@app.command("add-shard")
def add_shard(shard: str, json_out: bool = JsonOpt) -> None:
    """Add a shard to the cluster."""
    send(c.AddShard(shard=shard), json_out, lambda r: out.print(f"added shard {r['shardAdded']}"))


@app.command("remove-shard")
def remove_shard(
    shard: str,
    status_only: bool = typer.Option(False, "--status", help="what remains, an estimate of time left, what blocks it"),
    json_out: bool = JsonOpt,
) -> None:
    """Start draining a shard (the balancer moves its chunks and databases, then removes it);
    --status shows what remains."""
    if status_only:
        return _removal_status(shard, json_out)

    def human(r):
        rem = r.get("remaining")
        msg = {
            "completed": f"shard {r['shard']} removed",
            "started": f"draining shard {r['shard']}",
            "ongoing": f"shard {r['shard']} is still draining",
        }[r["state"]]
        if rem:
            msg += f": {rem['chunks']} chunks left, primary of {len(rem['dbs'])} databases {rem['dbs']}"
        out.print(msg)

    send(c.RemoveShard(shard=shard), json_out, human)


def _removal_status(shard: str, json_out: bool) -> None:
    from domain.settings import in_window
    from services.balancer.draining import removal_status

    cat, commits = run(_drain_history(shard))
    if shard not in cat.shards:
        fail(f"shard {shard!r} does not exist (removed already?)", code=ErrorCode.ShardNotFound, as_json=json_out)
    doc = removal_status(cat, shard)
    if not in_window(cat.settings.balancerWindow, dt.datetime.now(dt.UTC)):
        w = cat.settings.balancerWindow
        doc["blockers"].append(
            {"reason": "outsideWindow", "detail": f"outside the balancing window {w.start}-{w.stop} {w.timeZone}"}
        )
    if not doc["draining"]:
        doc["blockers"].insert(0, {"reason": "notDraining", "detail": f"run `shardlog remove-shard {shard}` to start"})
    # Estimate from the pace so far: chunks moved off the shard since draining began.
    if commits["since"] is not None and commits["moved"]:
        per_chunk = (commits["now"] - commits["since"]) / commits["moved"]
        doc["estimatedSecondsLeft"] = round(per_chunk * (doc["chunks"] + len(doc["databases"])), 1)
    else:
        doc["estimatedSecondsLeft"] = None
    doc["movedSoFar"] = commits["moved"]
    if json_out:
        print(json.dumps({"ok": True, **doc}))
        return
    dbs = f" {', '.join(doc['databases'])}" if doc["databases"] else ""
    left = doc["estimatedSecondsLeft"]
    out.print(
        f"shard {shard}: {'draining' if doc['draining'] else 'not draining'}; {doc['chunks']} chunk(s) left, "
        f"primary of {len(doc['databases'])} database(s){dbs}; {doc['movedSoFar']} chunk(s) moved so far"
        + (f"; about {left:.0f} s left" if left is not None else "")
    )
    for b_ in doc["blockers"]:
        out.print(f"  blocked: {b_['reason']}: {b_['detail']}")


async def _drain_history(shard: str):
    """The catalog, and when draining began and how many chunks have left since (Kafka timestamps)."""
    from domain.catalog import Catalog
    from schemas import config as cfg_schema

    cat = Catalog(track_changes=False)
    since, moved, last = None, 0, None

    async def take(records):
        nonlocal since, moved, last
        for rec in records:
            e = cfg_schema.events.decode(rec.value)
            cat.apply(e, rec.offset)
            if e.type == "ShardDraining" and e.shard == shard:
                since, moved = rec.timestamp / 1000, 0
            elif e.type == "MigrationCommitted" and e.donor == shard and since is not None:
                moved += 1
                last = rec.timestamp / 1000

    await kafka.read_to_end(_ctx.bootstrap, _ctx.topics.config_events, take, client_id="shardlog-cli")
    import time as _time

    return cat, {"since": since, "moved": moved, "now": _time.time(), "last": last}


@app.command("create-database")
def create_database(
    db: str,
    primary: str | None = typer.Option(None, help="primary shard (default: least data)"),
    json_out: bool = JsonOpt,
) -> None:
    """Create a database; its unsharded collections live on its primary shard."""
    send(
        c.CreateDatabase(db=db, primary=primary),
        json_out,
        lambda r: out.print(f"database {r['db']} {'created' if r['created'] else 'exists'}, primary {r['primary']}"),
    )


@app.command("shard-collection")
def shard_collection(
    ns: str,
    key: str = typer.Option(..., help='shard key pattern, e.g. \'{"x": 1}\' or \'{"_id": "hashed"}\''),
    unique: bool = typer.Option(False, help="enforce uniqueness of the shard key"),
    num_initial_chunks: int | None = typer.Option(None, help="hashed keys: initial chunks"),
    json_out: bool = JsonOpt,
) -> None:
    """Shard a collection by a range, compound or hashed key."""
    pattern = parse_json(key, "--key", json_out)
    if not isinstance(pattern, dict):
        fail('--key must be a JSON object such as {"x": 1}', code=ErrorCode.BadValue, as_json=json_out, exit_code=2)
    send(
        c.ShardCollection(ns=ns, key=pattern, unique=unique, numInitialChunks=num_initial_chunks),
        json_out,
        lambda r: out.print(f"sharded {r['ns']}: {r['chunks']} chunk(s), epoch {r['epoch']}"),
    )


@app.command("split")
def split(
    ns: str,
    at: list[str] | None = typer.Option(None, help="split point (full shard key); repeat for several"),
    find: str | None = typer.Option(
        None, "--find", help="without --at: split the chunk holding this document at its median shard-key value"
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Split a chunk at given points, or (--find) at the median of its documents."""
    if at:
        points = [parse_json(p, "--at", json_out) for p in at]
    elif find is not None:
        points = _median_point(ns, parse_json(find, "--find", json_out), json_out)
    else:
        fail("give --at POINT (repeatable) or --find DOC", code=ErrorCode.BadValue, as_json=json_out, exit_code=2)
    send(
        c.SplitChunk(ns=ns, at=points),
        json_out,
        lambda r: out.print(
            f"split into {len(r['chunks'])} chunks: "
            + ", ".join(f"[{b(x['min'])}, {b(x['max'])})" for x in r["chunks"])
        ),
    )


def _median_point(ns: str, doc: Any, as_json: bool) -> list:
    """Ask the chunk's owner for the median shard-key value of its documents (seed 001)."""
    from schemas import shard as s

    cat = _catalog(None, as_json)
    coll = cat.collections.get(ns)
    if coll is None:
        fail(f"collection {ns!r} is not sharded", code=ErrorCode.NamespaceNotFound, as_json=as_json)
    try:
        owner = coll.chunks[coll.chunk_index(coll.pattern.encode_doc(doc))].shard
    except Exception as e:
        fail(f"--find: {e}", code=ErrorCode.BadValue, as_json=as_json, exit_code=2)

    async def ask():
        async with Requester(_ctx.bootstrap, _ctx.topics.cli_replies, client_id="shardlog-cli") as r:
            return await r.request(
                _ctx.topics.shard_requests(owner), s.SplitVector(ns=ns, find=doc, median=True), timeout=_ctx.timeout
            )

    reply = run(ask())
    if not reply.ok:
        fail(reply.error or "", code=reply.code or "Error", as_json=as_json)
    if not reply.result["points"]:
        why = (
            "every document has the same shard key value (a jumbo chunk)"
            if reply.result["jumbo"]
            else "the chunk holds no document"
        )
        fail(f"cannot split the chunk: {why}", code=ErrorCode.CannotSplit, as_json=as_json)
    return reply.result["points"]


@app.command("merge")
def merge(
    ns: str, min: str = typer.Option(..., "--min"), max: str = typer.Option(..., "--max"), json_out: bool = JsonOpt
) -> None:
    """Merge the contiguous chunks of [min, max) (all on one shard) into one."""
    lo, hi = parse_json(min, "--min", json_out), parse_json(max, "--max", json_out)
    send(
        c.MergeChunks(ns=ns, min=lo, max=hi),
        json_out,
        lambda r: out.print(
            f"merged {r['merged']} chunks into [{b(r['chunk']['min'])}, {b(r['chunk']['max'])})"
            if r["merged"]
            else "already a single chunk: nothing to merge"
        ),
    )


# --------------------------------------------------------------- documents


def _with_client(fn, as_json: bool):
    """Run fn(async cluster) through the routers; a refusal is one clear line."""
    from libs.client import AsyncCluster, ShardlogError

    async def go():
        async with AsyncCluster(_ctx.bootstrap, _ctx.cluster, timeout=_ctx.timeout) as c:
            return await fn(c)

    try:
        return run(go())
    except ShardlogError as e:
        fail(e.message, code=e.code, as_json=as_json)


def _filter(text: str, as_json: bool) -> dict:
    flt = parse_json(text, "the filter", as_json)
    if not isinstance(flt, dict):
        fail('a filter must be a JSON object such as {"x": 1}', code=ErrorCode.BadValue, as_json=as_json, exit_code=2)
    return flt


@app.command("insert")
def insert(
    ns: str,
    docs: str = typer.Argument(..., help="a JSON document, or an array of them"),
    unordered: bool = typer.Option(False, help="keep going past a refused document"),
    json_out: bool = JsonOpt,
) -> None:
    """Insert documents through a router."""
    value = parse_json(docs, "the document", json_out)
    many = value if isinstance(value, list) else [value]
    db, coll = ns.partition(".")[0], ns.partition(".")[2]
    ids = _with_client(lambda c: c[db][coll].insert_many(many, ordered=not unordered), json_out)
    if json_out:
        print(json.dumps({"ok": True, "inserted": len(ids), "insertedIds": ids}))
    else:
        out.print(
            f"inserted {len(ids)} document(s): {', '.join(json.dumps(i) for i in ids[:10])}"
            f"{' …' if len(ids) > 10 else ''}"
        )


@app.command("find")
def find(
    ns: str,
    filter: str = typer.Argument("{}", help='a filter, e.g. \'{"age": {"$gt": 30}}\''),
    sort: str | None = typer.Option(None, help="e.g. '{\"age\": -1}'"),
    skip: int = typer.Option(0, min=0),
    limit: int = typer.Option(0, min=0, help="0: no limit"),
    projection: str | None = typer.Option(None),
    json_out: bool = JsonOpt,
) -> None:
    """Query documents through a router (merge-sorted across shards with --sort)."""
    flt = _filter(filter, json_out)
    srt = parse_json(sort, "--sort", json_out) if sort else None
    proj = parse_json(projection, "--projection", json_out) if projection else None
    db, coll = ns.partition(".")[0], ns.partition(".")[2]

    async def go(c):
        return await c[db][coll].find(flt, sort=srt, skip=skip, limit=limit, projection=proj).to_list()

    docs = _with_client(go, json_out)
    if json_out:
        print(json.dumps({"ok": True, "docs": docs}))
    else:
        for d in docs:
            out.print_json(json.dumps(d))
        out.print(f"[dim]{len(docs)} document(s)[/dim]")


@app.command("count")
def count(ns: str, filter: str = typer.Argument("{}"), json_out: bool = JsonOpt) -> None:
    """Count matching documents through a router."""
    flt = _filter(filter, json_out)
    db, coll = ns.partition(".")[0], ns.partition(".")[2]
    n = _with_client(lambda c: c[db][coll].count_documents(flt), json_out)
    print(json.dumps({"ok": True, "n": n})) if json_out else out.print(str(n))


@app.command("explain")
def explain(ns: str, filter: str = typer.Argument("{}"), json_out: bool = JsonOpt) -> None:
    """Which shards a query targets, and why."""
    flt = _filter(filter, json_out)
    db, coll = ns.partition(".")[0], ns.partition(".")[2]
    r = _with_client(lambda c: c[db][coll].explain(flt), json_out)
    if json_out:
        print(json.dumps({"ok": True, **r}))
    else:
        out.print(f"{r['ns']}: {', '.join(r['shards']) or 'no shard'} — {r['reason']} (ConfigTime {r['configTime']})")


# ------------------------------------------------------------------- zones


@zone_app.command("add-shard")
def zone_add_shard(shard: str, zone: str, json_out: bool = JsonOpt) -> None:
    """Tag SHARD with ZONE."""
    send(
        c.AddShardToZone(shard=shard, zone=zone),
        json_out,
        lambda r: out.print(f"shard {r['shard']} zones: {', '.join(r['zones']) or '-'}"),
    )


@zone_app.command("remove-shard")
def zone_remove_shard(shard: str, zone: str, json_out: bool = JsonOpt) -> None:
    """Untag SHARD from ZONE."""
    send(
        c.RemoveShardFromZone(shard=shard, zone=zone),
        json_out,
        lambda r: out.print(f"shard {r['shard']} zones: {', '.join(r['zones']) or '-'}"),
    )


@zone_app.command("add-range")
def zone_add_range(
    ns: str,
    min: str = typer.Option(..., "--min"),
    max: str = typer.Option(..., "--max"),
    zone: str = typer.Option(...),
    json_out: bool = JsonOpt,
) -> None:
    """Pin the key range [min, max) of NS to ZONE."""
    lo, hi = parse_json(min, "--min", json_out), parse_json(max, "--max", json_out)
    send(
        c.AssignZoneRange(ns=ns, min=lo, max=hi, zone=zone),
        json_out,
        lambda r: out.print(f"{r['ns']} [{min}, {max}) -> zone {r['zone']}"),
    )


@zone_app.command("remove-range")
def zone_remove_range(
    ns: str, min: str = typer.Option(..., "--min"), max: str = typer.Option(..., "--max"), json_out: bool = JsonOpt
) -> None:
    """Unpin the key range [min, max) of NS."""
    lo, hi = parse_json(min, "--min", json_out), parse_json(max, "--max", json_out)
    send(
        c.RemoveZoneRange(ns=ns, min=lo, max=hi),
        json_out,
        lambda r: out.print(f"{r['ns']} [{min}, {max}) no longer in zone {r['zone']}"),
    )


# ---------------------------------------------------------------- settings


def _value(text: str) -> Any:
    """A setting value: JSON if it parses (numbers, true/false, objects), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@settings_app.command("set")
def settings_set(
    key: str,
    value: str = typer.Argument(..., help="JSON value; 'null' resets to the default"),
    ns: str | None = typer.Option(None, help="set for this collection only"),
    json_out: bool = JsonOpt,
) -> None:
    """Set a cluster setting (or a collection's with --ns)."""
    send(
        c.SetSetting(key=key, value=_value(value), ns=ns),
        json_out,
        lambda r: out.print(
            f"{r['key']} = {json.dumps(r['value'])}"
            + (f" for {r['ns']}" if r["ns"] else "")
            + ("" if r["changed"] else " (unchanged)")
        ),
    )


@settings_app.command("get")
def settings_get(
    ns: str | None = typer.Option(None, help="this collection's settings"), json_out: bool = JsonOpt
) -> None:
    """Show cluster settings (or a collection's with --ns)."""
    cat = _catalog(None, json_out)
    if ns is not None:
        if ns not in cat.collections:
            fail(f"collection {ns!r} is not sharded", code=ErrorCode.NamespaceNotFound, as_json=json_out)
        values = cat.collections[ns].settings.model_dump()
    else:
        values = cat.settings.model_dump()
    if json_out:
        print(json.dumps({"ok": True, "configTime": cat.config_time, "ns": ns, "settings": values}))
        return
    t = Table("setting", "value", title=f"settings{' of ' + ns if ns else ''} at ConfigTime {cat.config_time}")
    for k, v in values.items():
        t.add_row(k, json.dumps(v))
    out.print(t)


# ------------------------------------------------------------------ status


def _catalog(at: int | None, as_json: bool):
    from domain.follower import replay_catalog

    return run(replay_catalog(_ctx.bootstrap, _ctx.topics.config_events, until=at))


def status_document(cat, verbose: bool) -> dict:
    shards = []
    for s in sorted(cat.shards.values(), key=lambda s: s.id):
        shards.append(
            {
                "id": s.id,
                "state": "draining" if s.draining else "active",
                "zones": sorted(s.zones),
                "chunks": cat.chunk_count(s.id),
            }
        )
    dbs = [
        {"db": d.name, "primary": d.primary, "version": {"uuid": d.version.uuid, "lastMod": d.version.last_mod}}
        for d in sorted(cat.databases.values(), key=lambda d: d.name)
    ]
    colls = []
    for coll in sorted(cat.collections.values(), key=lambda c: c.ns):
        doc = {
            "ns": coll.ns,
            "key": coll.pattern.spec,
            "unique": coll.unique,
            "epoch": coll.epoch,
            "version": list(coll.version().pair),
            "chunkCount": len(coll.chunks),
            "chunksPerShard": coll.chunks_per_shard(),
            "zones": [{"zone": z.zone, "min": to_ejson(z.min), "max": to_ejson(z.max)} for z in coll.zones],
        }
        if verbose:
            doc["chunks"] = [ch.doc().model_dump(exclude={"type", "v"}) for ch in coll.chunks]
        colls.append(doc)
    migrations = [m.record() for m in cat.migrations.values()]
    return {
        "configTime": cat.config_time,
        "shards": shards,
        "databases": dbs,
        "collections": colls,
        "migrations": migrations,
        "settings": cat.settings.model_dump(),
    }


@app.command("status")
def status(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="list every chunk"),
    at: int | None = typer.Option(None, "--at", help="the catalog as of this ConfigTime"),
    json_out: bool = JsonOpt,
) -> None:
    """Shards, databases and sharded collections (like sh.status())."""
    doc = status_document(_catalog(at, json_out), verbose)
    if json_out:
        print(json.dumps({"ok": True, **doc}))
        return
    out.print(f"[bold]shardlog cluster[/bold] {_ctx.cluster!r} at ConfigTime {doc['configTime']}")
    t = Table("shard", "state", "zones", "chunks", title="shards")
    for s in doc["shards"]:
        t.add_row(s["id"], s["state"], ", ".join(s["zones"]) or "-", str(s["chunks"]))
    out.print(t)
    t = Table("database", "primary", "version", title="databases")
    for d in doc["databases"]:
        t.add_row(d["db"], d["primary"], f"{d['version']['uuid']}|{d['version']['lastMod']}")
    out.print(t)
    for coll in doc["collections"]:
        out.print(
            f"[bold]{coll['ns']}[/bold] key {json.dumps(coll['key'])}"
            f"{' unique' if coll['unique'] else ''}  version {coll['version'][0]}|{coll['version'][1]}"
            f"||{coll['epoch']}  {coll['chunkCount']} chunks: "
            + ", ".join(f"{s} {n}" for s, n in sorted(coll["chunksPerShard"].items()))
        )
        for z in coll["zones"]:
            out.print(f"  zone {z['zone']}: [{b(z['min'])}, {b(z['max'])})")
        if verbose:
            t = Table("min", "max", "shard", "version", "jumbo")
            for ch in coll["chunks"]:
                t.add_row(
                    b(ch["min"]),
                    b(ch["max"]),
                    ch["shard"],
                    f"{ch['version'][0]}|{ch['version'][1]}",
                    "yes" if ch["jumbo"] else "",
                )
            out.print(t)
    for m in doc["migrations"]:
        out.print(
            f"migration {m['id']}: {m['ns']} [{b(m['min'])}, {b(m['max']) if m['max'] else '...'}) "
            f"{m['donor']} -> {m['recipient']} in progress"
        )


_register_workload()


def _register_range_deletions() -> None:
    from cli.range_deletions import range_deletions  # looks cli.main up lazily, as cli.workload does

    app.command("range-deletions")(range_deletions)


_register_range_deletions()


def _register_migrations() -> None:
    from cli import migrations

    migrations.register(app, lambda: _ctx, sys.modules[__name__])


_register_migrations()


def _register_balancer() -> None:
    from cli import balancer

    balancer.register(app, sys.modules[__name__])


_register_balancer()

if __name__ == "__main__":
    app()
