"""shardlog status — the catalog as the operator sees it (like sh.status())."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cli.context import CliContext, JsonOpt, bound, chunk_range
from domain.catalog import Catalog, Collection
from domain.shardkey import to_ejson

status_app = typer.Typer()


def status_document(cat: Catalog, verbose: bool) -> dict[str, Any]:
    """The catalog as one JSON document: shards, databases, collections, migrations, settings."""
    shards = [
        {
            "id": s.id,
            "state": "draining" if s.draining else "active",
            "zones": sorted(s.zones),
            "chunks": cat.chunk_count(s.id),
        }
        for s in sorted(cat.shards.values(), key=lambda s: s.id)
    ]
    dbs = [
        {"db": d.name, "primary": d.primary, "version": {"uuid": d.version.uuid, "lastMod": d.version.last_mod}}
        for d in sorted(cat.databases.values(), key=lambda d: d.name)
    ]
    colls = [_collection_document(coll, verbose) for coll in sorted(cat.collections.values(), key=lambda c: c.ns)]
    migrations = [m.record() for m in cat.migrations.values()]
    # Zone ranges of namespaces not sharded yet: they take effect when the namespace is sharded.
    unsharded_zones = [
        {"ns": ns, "zone": z.zone, "min": to_ejson(z.min), "max": to_ejson(z.max)}
        for ns in sorted(cat.unsharded_zones)
        for z in cat.unsharded_zones[ns]
    ]
    doc = {
        "configTime": cat.config_time,
        "shards": shards,
        "databases": dbs,
        "collections": colls,
        "unshardedZones": unsharded_zones,
        "migrations": migrations,
        "settings": cat.settings.model_dump(),
    }
    if verbose:  # every collection with created indexes, sharded or not: what listIndexes shows
        doc["indexes"] = {ns: [s.to_mongo() for s in cat.index_list(ns)] for ns in sorted(cat.indexes)}
    return doc


def _collection_document(coll: Collection, verbose: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ns": coll.ns,
        "key": coll.pattern.spec,
        "unique": coll.unique,
        "epoch": coll.epoch,
        "version": list(coll.version().pair),
        "chunkCount": len(coll.chunks),
        "chunksPerShard": coll.chunks_per_shard(),
        "zones": [{"zone": z.zone, "min": to_ejson(z.min), "max": to_ejson(z.max)} for z in coll.zones],
    }
    if verbose:  # each chunk with its placement history, newest first (who held it since when)
        doc["chunks"] = [
            {
                **ch.doc().model_dump(exclude={"type", "v"}),
                "history": [{"validAfter": _time(t), "shard": shard} for t, shard in coll.chunk_history(ch)],
            }
            for ch in coll.chunks
        ]
    return doc


def _time(packed: int) -> dict[str, int]:
    return {"t": packed >> 32, "i": packed & 0xFFFFFFFF}


MAX_CHUNKS_LISTED = 20  # sh.status() lists a collection's chunks up to this many without verbose


@status_app.command("status")
def status(
    ctx: typer.Context,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="list every chunk"),
    at: int | None = typer.Option(None, "--at", help="the catalog as of this ConfigTime"),
    json_out: bool = JsonOpt,
) -> None:
    """Shards, databases and sharded collections (like sh.status())."""
    cx = CliContext.of(ctx)
    if at is not None and at < 0:
        cx.bad_value(f"--at must be a ConfigTime (an offset of the config events, >= 0), not {at}")
    # The human form lists chunks when a collection has few (as sh.status()); JSON only with --verbose.
    doc = status_document(cx.catalog(at), verbose or not cx.json)
    if cx.json:
        cx.print_json(doc)
        return
    out = cx.out
    out.print(f"[bold]shardlog cluster[/bold] {cx.cluster!r} at ConfigTime {doc['configTime']}")
    t = Table("shard", "state", "zones", "chunks", title="shards")
    for s in doc["shards"]:
        t.add_row(s["id"], s["state"], ", ".join(s["zones"]) or "-", str(s["chunks"]))
    out.print(t)
    t = Table("database", "primary", "version", title="databases")
    for d in doc["databases"]:
        t.add_row(d["db"], d["primary"], f"{d['version']['uuid']}|{d['version']['lastMod']}")
    out.print(t)
    for coll in doc["collections"]:
        _print_collection(out, coll, verbose)
    for ns, indexes in (doc.get("indexes") or {}).items() if verbose else ():
        out.print(f"[bold]{ns}[/bold] indexes: " + ", ".join(f"{i['name']} {bound(i['key'])}" for i in indexes))
    for z in doc["unshardedZones"]:
        out.print(f"{z['ns']} (not sharded yet) zone {z['zone']}: {chunk_range(z['min'], z['max'])}")
    for m in doc["migrations"]:
        out.print(
            f"migration {m['id']}: {m['ns']} "
            f"{chunk_range(m['min'], m['max']) if m['max'] else bound(m['min']) + ' -->> ...'} "
            f"{m['donor']} -> {m['recipient']} in progress"
        )


def _print_collection(out: Console, coll: dict[str, Any], verbose: bool) -> None:
    out.print(
        f"[bold]{coll['ns']}[/bold] key {json.dumps(coll['key'])}"
        f"{' unique' if coll['unique'] else ''}  version {coll['version'][0]}|{coll['version'][1]}"
        f"||{coll['epoch']}  {coll['chunkCount']} chunks: "
        + ", ".join(f"{s} {n}" for s, n in sorted(coll["chunksPerShard"].items()))
    )
    for z in coll["zones"]:
        out.print(f"  zone {z['zone']}: {chunk_range(z['min'], z['max'])}")
    chunks = coll.get("chunks", [])
    if not verbose and len(chunks) > MAX_CHUNKS_LISTED:
        out.print(f"  too many chunks to print ({len(chunks)}), use --verbose to list them")
        return
    for ch in chunks:
        out.print(
            f"  {chunk_range(ch['min'], ch['max'])} on : {ch['shard']} "
            f"Timestamp({ch['version'][0]}, {ch['version'][1]})" + (" jumbo" if ch["jumbo"] else "")
        )
