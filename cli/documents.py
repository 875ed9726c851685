"""shardlog insert / find / count / explain / update / delete — documents, through a router like any client."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.markup import escape

from cli.context import CliContext, JsonOpt, parse_documents
from domain.bsonvalues import to_record
from libs.client import AsyncCluster, AsyncCollection, ShardlogError

documents_app = typer.Typer()


def _collection(c: AsyncCluster, ns: str) -> AsyncCollection:
    db, _, coll = ns.partition(".")
    return c[db][coll]


def _filter(cx: CliContext, text: str) -> dict[str, Any]:
    return cx.parse_ejson(text, "the filter")


def _read_docs(cx: CliContext, docs: str | None, file: str | None) -> list[dict[str, Any]]:
    """The documents of DOCS, or of --file (`-`: standard input): an argument is limited in size
    by the system (a 200 KB document is "Argument list too long"), a file is not."""
    if (docs is None) == (file is None):
        cx.bad_value("give the documents as an argument or with --file PATH (- for standard input), not both")
    if file is None:
        assert docs is not None
        return cx.parse(parse_documents, docs, "the documents")
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except (OSError, UnicodeDecodeError) as e:
        cx.bad_value(f"cannot read {file}: {e}")
    return cx.parse(parse_documents, text, "standard input" if file == "-" else file)


@documents_app.command("insert")
def insert(
    ctx: typer.Context,
    ns: str,
    docs: str | None = typer.Argument(
        None, help="a document in (relaxed or canonical) Extended JSON, or an array of them"
    ),
    file: str | None = typer.Option(
        None, "--file", "-f", help="read the documents from a file (- for stdin): an array, or one per line"
    ),
    unordered: bool = typer.Option(False, help="keep going past a refused document"),
    json_out: bool = JsonOpt,
) -> None:
    """Insert documents through a router; a batch that fails in part says which documents went in."""
    cx = CliContext.of(ctx)
    many = _read_docs(cx, docs, file)

    async def go(c: AsyncCluster) -> tuple[list[Any], dict[str, Any] | None]:
        try:
            return await _collection(c, ns).insert_many(many, ordered=not unordered), None
        except ShardlogError as e:
            if len(many) > 1 and e.details.get("writeErrors"):
                return [], e.details
            raise

    ids, failed = cx.with_client(go)
    if failed is not None:
        _bulk_failure(cx, failed, len(many), ordered=not unordered)
    if cx.json:
        cx.print_json({"inserted": len(ids), "insertedIds": ids})
    else:
        cx.out.print(
            f"inserted {len(ids)} document(s): {', '.join(json.dumps(to_record(i)) for i in ids[:10])}"
            f"{' …' if len(ids) > 10 else ''}"
        )


def _bulk_failure(cx: CliContext, result: dict[str, Any], total: int, *, ordered: bool) -> NoReturn:
    """A batch refused in part, as MongoDB's BulkWriteError: how many went in (nInserted) and the
    refused documents by index.  Ordered, the batch stopped at its first refusal: the documents
    before it went in, none after; unordered, every document but the refused ones went in."""
    errors = result["writeErrors"]
    n = result.get("inserted", 0)
    first = errors[0]
    why = f"{first['code']}: {first['errmsg']}"
    if ordered:
        message = (
            f"ordered insert stopped at document {first['index']} ({why}): {n} of {total} inserted, "
            f"{total - first['index'] - 1} not attempted"
        )
    else:
        shown = ", ".join(str(e["index"]) for e in errors[:10]) + (" …" if len(errors) > 10 else "")
        message = f"unordered insert refused document(s) {shown} (first: {why}): {n} of {total} inserted"
    cx.fail(message, code="BulkWriteError", details={"nInserted": n, "writeErrors": errors})


@documents_app.command("find")
def find(
    ctx: typer.Context,
    ns: str,
    filter: str = typer.Argument("{}", help='a filter, e.g. \'{"age": {"$gt": 30}}\''),
    sort: str | None = typer.Option(None, help="e.g. '{\"age\": -1}'"),
    skip: int = typer.Option(0, min=0),
    limit: int = typer.Option(0, min=0, help="0: no limit"),
    projection: str | None = typer.Option(None),
    at_cluster_time: str | None = typer.Option(
        None, "--at-cluster-time", help="read as of this ClusterTime, SECONDS[,INCREMENT] (a snapshot read)"
    ),
    snapshot: bool = typer.Option(False, "--snapshot", help="a snapshot read at the cluster's time; says which"),
    json_out: bool = JsonOpt,
) -> None:
    """Query documents through a router (merge-sorted across shards with --sort); with
    --snapshot or --at-cluster-time, every shard as of one cluster time."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    srt = cx.parse_ejson(sort, "--sort") if sort is not None else None
    proj = cx.parse_ejson(projection, "--projection") if projection is not None else None
    at = _cluster_time(cx, at_cluster_time) if at_cluster_time is not None else None
    read_at: list[int] = []

    async def go(c: AsyncCluster) -> list[dict[str, Any]]:
        session = c.start_session(snapshot=True) if snapshot or at is not None else None
        if session is not None:
            session.snapshot_time = at
        found = _collection(c, ns).find(flt, sort=srt, skip=skip, limit=limit, projection=proj, session=session)
        docs = await found.to_list()
        if session is not None and session.snapshot_time is not None:
            read_at.append(session.snapshot_time)
        return docs

    docs = cx.with_client(go)
    when = {"t": read_at[0] >> 32, "i": read_at[0] & 0xFFFFFFFF} if read_at else None
    if cx.json:
        cx.print_json({"docs": docs, **({"atClusterTime": when} if when else {})})
    else:
        for d in docs:
            cx.out.print_json(json.dumps(to_record(d)))
        at_text = f" at ClusterTime {when['t']},{when['i']}" if when else ""
        cx.out.print(f"[dim]{len(docs)} document(s){at_text}[/dim]")


def _cluster_time(cx: CliContext, text: str) -> int:
    """A ClusterTime from the command line: SECONDS or SECONDS,INCREMENT (packed)."""
    secs, _, inc = text.partition(",")
    try:
        t, i = int(secs), int(inc or 0)
        if not (0 < t < 2**32 and 0 <= i < 2**32):
            raise ValueError
    except ValueError:
        cx.fail(f"--at-cluster-time must be SECONDS[,INCREMENT], not {text!r}", code="BadValue")
    return t << 32 | i


@documents_app.command("count")
def count(ctx: typer.Context, ns: str, filter: str = typer.Argument("{}"), json_out: bool = JsonOpt) -> None:
    """Count matching documents through a router."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    n = cx.with_client(lambda c: _collection(c, ns).count_documents(flt))
    cx.print_json({"n": n}) if cx.json else cx.out.print(str(n))


@documents_app.command("explain")
def explain(
    ctx: typer.Context,
    ns: str,
    filter: str = typer.Argument("{}"),
    sort: str = typer.Option(None, "--sort", help="a sort, e.g. '{\"a\": -1}'"),
    hint: str = typer.Option(None, "--hint", help="an index name, or a key pattern as JSON"),
    json_out: bool = JsonOpt,
) -> None:
    """Which shards a query targets and why, and each shard's plan: the index it uses (or
    COLLSCAN), keys and documents examined."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    order = cx.parse_ejson(sort, "the sort") if sort else None
    hinted: Any = cx.parse_ejson(hint, "the hint") if hint and hint.lstrip().startswith("{") else hint
    r = cx.with_client(lambda c: _collection(c, ns).explain(flt, sort=order, hint=hinted))
    if cx.json:
        cx.print_json(r)
        return
    cx.out.print(f"{r['ns']}: {', '.join(r['shards']) or 'no shard'} — {r['reason']} (ConfigTime {r['configTime']})")
    for p in r.get("plans", []):
        stats = p.get("executionStats", {})
        cx.out.print(
            f"  {p['shard']}: {escape(p.get('summary', '?'))} — keys examined {stats.get('totalKeysExamined', 0)}, "
            f"documents examined {stats.get('totalDocsExamined', 0)}, returned {stats.get('nReturned', 0)}"
        )


@documents_app.command("update")
def update(
    ctx: typer.Context,
    ns: str,
    filter: str = typer.Argument(..., help="which documents, e.g. '{\"uid\": 5}'"),
    update: str = typer.Argument(..., help='update operators (\'{"$set": {"x": 1}}\') or a replacement document'),
    multi: bool = typer.Option(False, "--multi", help="every matching document (without: the first one)"),
    upsert: bool = typer.Option(False, "--upsert", help="insert a document when none matches"),
    json_out: bool = JsonOpt,
) -> None:
    """Update (or replace) matching documents through a router: matched, modified and upserted counts."""
    cx = CliContext.of(ctx)
    flt, upd = _filter(cx, filter), cx.parse_ejson(update, "the update")

    async def go(c: AsyncCluster) -> dict[str, Any]:
        coll = _collection(c, ns)
        return await (coll.update_many if multi else coll.update_one)(flt, upd, upsert=upsert)

    r = cx.with_client(go)
    answer = {"matched": r.get("matched", 0), "modified": r.get("modified", 0), "upserted": int("upsertedId" in r)}
    if "upsertedId" in r:
        answer["upsertedId"] = r["upsertedId"]
    if cx.json:
        cx.print_json(answer)
    else:
        upserted = f", upserted _id {json.dumps(to_record(r['upsertedId']))}" if "upsertedId" in r else ""
        cx.out.print(f"matched {answer['matched']}, modified {answer['modified']}{upserted}")


@documents_app.command("delete")
def delete(
    ctx: typer.Context,
    ns: str,
    filter: str = typer.Argument(..., help="which documents ('{}': any)"),
    multi: bool = typer.Option(False, "--multi", help="every matching document (without: the first one)"),
    json_out: bool = JsonOpt,
) -> None:
    """Delete matching documents through a router: the number deleted."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)

    async def go(c: AsyncCluster) -> int:
        coll = _collection(c, ns)
        return await (coll.delete_many if multi else coll.delete_one)(flt)

    n = cx.with_client(go)
    cx.print_json({"deleted": n}) if cx.json else cx.out.print(f"deleted {n} document(s)")
