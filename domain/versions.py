"""Chunk, shard, collection and database version arithmetic (docs/reference/catalog-and-versions.md), as pure functions.

A chunk version is (major, minor, epoch): the major moves when a chunk changes
shards, the minor when chunks are split or merged, and the epoch names one
incarnation of the collection.  Versions of different epochs are not ordered.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from libs.ids import new_hex_id


@dataclass(frozen=True)
class ChunkVersion:
    major: int
    minor: int
    epoch: str

    def __post_init__(self) -> None:
        if self.major < 0 or self.minor < 0:
            raise ValueError(f"chunk version components must be >= 0, got {self.major}|{self.minor}")

    @property
    def pair(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def same_epoch(self, other: ChunkVersion) -> bool:
        return self.epoch == other.epoch

    def older_than(self, other: ChunkVersion) -> bool:
        if not self.same_epoch(other):
            raise ValueError("versions of different epochs are not comparable")
        return self.pair < other.pair

    def __str__(self) -> str:
        return f"{self.major}|{self.minor}||{self.epoch}"


def new_epoch() -> str:
    """An ObjectId-like epoch."""
    return new_hex_id()


def new_uuid() -> str:
    return str(uuid.uuid4())


def initial_versions(epoch: str, n: int) -> list[ChunkVersion]:
    """A new collection's n chunks: (1, 0), (1, 1), ... (1, n-1)."""
    if n < 1:
        raise ValueError("a collection has at least one chunk")
    return [ChunkVersion(1, i, epoch) for i in range(n)]


def collection_version(chunk_versions: Iterable[ChunkVersion]) -> ChunkVersion:
    """The highest chunk version of the collection."""
    return max(chunk_versions, key=lambda v: v.pair)


def shard_version(chunk_versions_on_shard: Iterable[ChunkVersion], epoch: str) -> ChunkVersion:
    """The highest chunk version on one shard; (0, 0, epoch) when it owns no chunk."""
    return max(chunk_versions_on_shard, key=lambda v: v.pair, default=ChunkVersion(0, 0, epoch))


def split_versions(coll: ChunkVersion, pieces: int) -> list[ChunkVersion]:
    """Splitting a chunk into n pieces: <M_cv, m_cv + 1> ... <M_cv, m_cv + n>."""
    if pieces < 2:
        raise ValueError("a split makes at least two chunks")
    return [ChunkVersion(coll.major, coll.minor + i, coll.epoch) for i in range(1, pieces + 1)]


def merge_version(coll: ChunkVersion) -> ChunkVersion:
    """Merging chunks: the merged chunk gets <M_cv, m_cv + 1>."""
    return ChunkVersion(coll.major, coll.minor + 1, coll.epoch)


def migration_versions(coll: ChunkVersion, donor_keeps_chunks: bool) -> tuple[ChunkVersion, ChunkVersion | None]:
    """Moving a chunk: it gets <M_cv + 1, 0>; the donor's control chunk, if it has
    one left, <M_cv + 1, 1>.  A donor with no chunk left is at (0, 0)."""
    moved = ChunkVersion(coll.major + 1, 0, coll.epoch)
    control = ChunkVersion(coll.major + 1, 1, coll.epoch) if donor_keeps_chunks else None
    return moved, control


@dataclass(frozen=True)
class DatabaseVersion:
    uuid: str
    last_mod: int

    def __str__(self) -> str:
        return f"{self.uuid}|{self.last_mod}"


def new_database_version() -> DatabaseVersion:
    return DatabaseVersion(new_uuid(), 1)


def moved_primary(v: DatabaseVersion) -> DatabaseVersion:
    """Changing a database's primary shard bumps lastMod, keeps the uuid."""
    return DatabaseVersion(v.uuid, v.last_mod + 1)


def hashed_split_points(num_chunks: int) -> list[int]:
    """Evenly spaced points over the signed 64-bit hash space, symmetric around 0,
    as MongoDB presplits an empty collection with a hashed key."""
    if num_chunks < 1:
        raise ValueError("numInitialChunks must be at least 1")
    int64_max = 2**63 - 1
    interval = (int64_max // num_chunks) * 2
    points: list[int] = []
    current = 0
    if num_chunks % 2 == 0:
        points.append(0)
        current += interval
    else:
        current += interval // 2
    for _ in range((num_chunks - 1) // 2):
        points.extend((current, -current))
        current += interval
    return sorted(points)
