"""shardlog shard-collection / split / merge — sharding a collection and shaping its chunks by hand."""

from __future__ import annotations

from typing import Any

import typer

from cli.context import CliContext, JsonOpt, chunk_range
from domain import sharding_commands as sc
from libs.errors import CommandError
from schemas import shard as s

chunks_app = typer.Typer()


@chunks_app.command("shard-collection")
def shard_collection(
    ctx: typer.Context,
    ns: str,
    key: str = typer.Option(..., help='shard key pattern, e.g. \'{"x": 1}\' or \'{"_id": "hashed"}\''),
    unique: bool = typer.Option(False, help="enforce uniqueness of the shard key"),
    num_initial_chunks: int | None = typer.Option(None, help="hashed keys: initial chunks"),
    json_out: bool = JsonOpt,
) -> None:
    """Shard a collection by a range, compound or hashed key."""
    cx = CliContext.of(ctx)
    pattern = cx.parse_json(key, "--key")
    record = cx.build(sc.shard_collection, ns, pattern, unique, num_initial_chunks)
    if (check := sc.existing_documents_check(cx.catalog(), record)) is not None:
        primary, request = check  # refused, nothing changes: the collection stays unsharded
        cx.request(cx.topics.shard_requests(primary), request)
    cx.send(
        record,
        lambda r: cx.out.print(
            f"{'already sharded with this key' if r.get('alreadySharded') else 'sharded'} {r['ns']}: "
            f"{r['chunks']} chunk(s), epoch {r['epoch']}"
        ),
    )


@chunks_app.command("split")
def split(
    ctx: typer.Context,
    ns: str,
    at: list[str] | None = typer.Option(None, help="split point (full shard key); repeat for several"),
    find: str | None = typer.Option(
        None, "--find", help="without --at: split the chunk holding this document at its median shard-key value"
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Split a chunk at given points, or (--find) at the median of its documents."""
    cx = CliContext.of(ctx)
    if at:
        points = [cx.parse_json(p, "--at") for p in at]
    elif find is not None:
        points = _median_point(cx, ns, cx.parse_json(find, "--find"))
    else:
        cx.bad_value("give --at POINT (repeatable) or --find DOC")
    cx.send(
        cx.build(sc.split, ns, points),
        lambda r: cx.out.print(
            f"split into {len(r['chunks'])} chunks: " + ", ".join(chunk_range(x["min"], x["max"]) for x in r["chunks"])
        ),
    )


def _median_point(cx: CliContext, ns: str, doc: Any) -> list[Any]:
    """Ask the chunk's owner for the median shard-key value of its documents (docs/reference/auto-split.md)."""
    owner = cx.build(sc.chunk_holding, cx.catalog(), ns, doc).shard
    result = cx.request(cx.topics.shard_requests(owner), s.SplitVector(ns=ns, find=doc, median=True))
    try:
        points: list[Any] = sc.median_points(result)
    except CommandError as e:
        cx.fail(e.message, code=e.code)
    return points


@chunks_app.command("merge")
def merge(
    ctx: typer.Context,
    ns: str,
    min: str = typer.Option(..., "--min"),
    max: str = typer.Option(..., "--max"),
    json_out: bool = JsonOpt,
) -> None:
    """Merge the contiguous chunks of [min, max) (all on one shard) into one."""
    cx = CliContext.of(ctx)
    lo, hi = cx.parse_json(min, "--min"), cx.parse_json(max, "--max")
    cx.send(
        cx.build(sc.merge, ns, lo, hi),
        lambda r: cx.out.print(
            f"merged {r['merged']} chunks into {chunk_range(r['chunk']['min'], r['chunk']['max'])}"
            if r["merged"]
            else "already a single chunk: nothing to merge"
        ),
    )
