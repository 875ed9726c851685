"""Auto-splitting (docs/reference/auto-split.md), pure: when to split a chunk, where
(splitVector), when it is jumbo, and the top-chunk optimisation.

A chunk's documents are given as (key, size) pairs in shard-key order.  Keys only need
`==` (equal shard keys equal); encoded shard-key bytes are safest.  A split point is the
key of the first document of a new piece, i.e. that piece's min bound, so documents with
equal keys always land in one piece.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_CHUNK_OBJECTS = 250_000  # MongoDB splitVector's default cap on documents per piece

Doc = tuple[Any, int]  # (shard key, size in bytes)


@dataclass(frozen=True)
class SplitVector:
    points: list[Any]  # ascending split points (shard keys); [] when the chunk is not split
    jumbo: bool = False  # over the max size but every document has one shard key


@dataclass(frozen=True)
class TopChunkPlan:
    points: list[Any]  # the split points with the top-chunk optimisation applied
    move: tuple[Any, Any] | None  # [min, max) of the new top (or bottom) chunk to move off the hot shard


def needs_split(
    data_size: int, max_chunk_size: int, *, enabled: bool, split_in_progress: bool = False, jumbo: bool = False
) -> bool:
    """Auto-split (off by default: the collection's `autoSplit`) a chunk grown to the
    max chunk size, unless a split of it is already in progress; a jumbo chunk is not retried."""
    return enabled and not split_in_progress and not jumbo and data_size >= max_chunk_size


def _groups(docs: Sequence[Doc]) -> list[tuple[int, int]]:
    """[start, end) index runs of documents with one key: never cut inside one."""
    out: list[tuple[int, int]] = []
    for i, (key, _) in enumerate(docs):
        if i and key == docs[i - 1][0]:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def split_points(
    docs: Iterable[Doc], max_chunk_size: int, *, max_chunk_objects: int = MAX_CHUNK_OBJECTS
) -> SplitVector:
    """MongoDB's splitVector: nothing below the max chunk size; jumbo when every document
    has the same key; else a new piece every k documents, k chosen so that a piece of
    average-sized documents is half the max chunk size (at most `max_chunk_objects`).
    A run of equal keys is never cut: a piece ends before a run that would overfill it,
    and a run longer than k becomes a piece of its own."""
    docs = list(docs)
    total = sum(size for _, size in docs)
    if not docs or total < max_chunk_size:
        return SplitVector([])
    groups = _groups(docs)
    if len(groups) == 1:
        return SplitVector([], jumbo=True)
    per_piece = max(1, min(max_chunk_objects, (max_chunk_size * len(docs)) // (2 * total)))
    points: list[Any] = []
    count = 0
    for start, end in groups:
        if count and count + (end - start) > per_piece:
            points.append(docs[start][0])
            count = 0
        count += end - start
    return SplitVector(points)


def median_point(docs: Iterable[Doc]) -> Any | None:
    """`shardlog split NS --find DOC` without `--at`: the key boundary nearest the middle
    document (splitVector with force: half the documents each side); None when every
    document has one key (or there is none)."""
    docs = list(docs)
    boundaries = [start for start, _ in _groups(docs)[1:]]
    if not boundaries:
        return None
    best = min(boundaries, key=lambda b: (abs(2 * b - len(docs)), b))  # ties: the lower boundary
    return docs[best][0]


def pieces(chunk_min: Any, chunk_max: Any, points: Sequence[Any]) -> list[tuple[Any, Any]]:
    """The chunks [min, max) a split at `points` makes."""
    bounds = [chunk_min, *points, chunk_max]
    return list(zip(bounds, bounds[1:]))


def top_chunk(
    docs: Iterable[Doc],
    points: Sequence[Any],
    *,
    chunk_min: Any,
    chunk_max: Any,
    is_bottom: bool,
    is_top: bool,
    hashed: bool,
) -> TopChunkPlan:
    """The top-chunk optimisation (docs/reference/auto-split.md).  Splitting the collection's first (or last) chunk
    of an ordered (not hashed) key, inserts are assumed to go on descending (ascending)
    below (above) every key: the lowest (highest) key gets a chunk of its own, which is
    moved off this, the hot, shard.  As MongoDB, the bottom chunk is checked first.
    The extreme piece is added to the split points (MongoDB replaces the first/last one),
    so the other pieces stay about half the max chunk size."""
    docs = list(docs)
    points = list(points)
    if hashed or not points or not docs:
        return TopChunkPlan(points, None)
    groups = _groups(docs)
    if len(groups) < 2:
        return TopChunkPlan(points, None)
    if is_bottom:
        second = docs[groups[1][0]][0]  # the lowest key alone: [min, second key)
        if points[0] != second:
            points.insert(0, second)
        return TopChunkPlan(points, (chunk_min, second))
    if is_top:
        last = docs[groups[-1][0]][0]  # the highest key alone: [last key, max)
        if points[-1] != last:
            points.append(last)
        return TopChunkPlan(points, (last, chunk_max))
    return TopChunkPlan(points, None)
