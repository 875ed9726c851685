"""shardlog insert / find / count / explain — documents, through a router like any client."""

from __future__ import annotations

import json
from typing import Any

import typer

from cli.context import CliContext, JsonOpt
from domain.bsonvalues import to_record
from libs.client import AsyncCluster, AsyncCollection

documents_app = typer.Typer()


def _collection(c: AsyncCluster, ns: str) -> AsyncCollection:
    db, _, coll = ns.partition(".")
    return c[db][coll]


def _filter(cx: CliContext, text: str) -> dict[str, Any]:
    flt = cx.parse_ejson(text, "the filter")
    if not isinstance(flt, dict):
        cx.bad_value('a filter must be a JSON object such as {"x": 1}')
    return flt


@documents_app.command("insert")
def insert(
    ctx: typer.Context,
    ns: str,
    docs: str = typer.Argument(..., help="a document in (relaxed) Extended JSON, or an array of them"),
    unordered: bool = typer.Option(False, help="keep going past a refused document"),
    json_out: bool = JsonOpt,
) -> None:
    """Insert documents through a router."""
    cx = CliContext.of(ctx)
    value = cx.parse_ejson(docs, "the document")
    many = value if isinstance(value, list) else [value]
    ids = cx.with_client(lambda c: _collection(c, ns).insert_many(many, ordered=not unordered))
    if cx.json:
        cx.print_json({"inserted": len(ids), "insertedIds": ids})
    else:
        cx.out.print(
            f"inserted {len(ids)} document(s): {', '.join(json.dumps(to_record(i)) for i in ids[:10])}"
            f"{' …' if len(ids) > 10 else ''}"
        )


@documents_app.command("find")
def find(
    ctx: typer.Context,
    ns: str,
    filter: str = typer.Argument("{}", help='a filter, e.g. \'{"age": {"$gt": 30}}\''),
    sort: str | None = typer.Option(None, help="e.g. '{\"age\": -1}'"),
    skip: int = typer.Option(0, min=0),
    limit: int = typer.Option(0, min=0, help="0: no limit"),
    projection: str | None = typer.Option(None),
    json_out: bool = JsonOpt,
) -> None:
    """Query documents through a router (merge-sorted across shards with --sort)."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    srt = cx.parse_ejson(sort, "--sort") if sort else None
    proj = cx.parse_ejson(projection, "--projection") if projection else None

    async def go(c: AsyncCluster) -> list[dict[str, Any]]:
        return await _collection(c, ns).find(flt, sort=srt, skip=skip, limit=limit, projection=proj).to_list()

    docs = cx.with_client(go)
    if cx.json:
        cx.print_json({"docs": docs})
    else:
        for d in docs:
            cx.out.print_json(json.dumps(to_record(d)))
        cx.out.print(f"[dim]{len(docs)} document(s)[/dim]")


@documents_app.command("count")
def count(ctx: typer.Context, ns: str, filter: str = typer.Argument("{}"), json_out: bool = JsonOpt) -> None:
    """Count matching documents through a router."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    n = cx.with_client(lambda c: _collection(c, ns).count_documents(flt))
    cx.print_json({"n": n}) if cx.json else cx.out.print(str(n))


@documents_app.command("explain")
def explain(ctx: typer.Context, ns: str, filter: str = typer.Argument("{}"), json_out: bool = JsonOpt) -> None:
    """Which shards a query targets, and why."""
    cx = CliContext.of(ctx)
    flt = _filter(cx, filter)
    r = cx.with_client(lambda c: _collection(c, ns).explain(flt))
    if cx.json:
        cx.print_json(r)
    else:
        cx.out.print(
            f"{r['ns']}: {', '.join(r['shards']) or 'no shard'} — {r['reason']} (ConfigTime {r['configTime']})"
        )
