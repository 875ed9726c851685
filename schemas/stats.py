"""Records of `shard.stats`: each shard's periodic statistics for the balancer.

The topic is compacted and keyed by shard id, so the latest report of every
shard survives.  A report describes the chunks the shard owned at `configTime`
(per its catalog): how many documents each holds, their stored size, and how
many bytes of documents were written into it since the shard's previous report.
Bounds travel as MongoDB Extended JSON (`{"$minKey": 1}`), as in `schemas.config.ChunkDoc`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas import Codec, Record
from schemas.config import Bound


class ChunkStatistics(Record):
    """One chunk [min, max) of `ns` owned by the reporting shard."""

    type: Literal["ChunkStatistics"] = "ChunkStatistics"
    v: Literal[1] = 1
    ns: str
    min: Bound
    max: Bound
    documents: int = Field(ge=0)
    dataSizeBytes: int = Field(ge=0)  # sum of the documents' stored JSON sizes
    bytesWrittenSinceLastReport: int = Field(ge=0)  # stored JSON bytes of documents written (inserted or updated)


class CollectionStatistics(Record):
    """Totals over the chunks of one collection owned by the reporting shard."""

    type: Literal["CollectionStatistics"] = "CollectionStatistics"
    v: Literal[1] = 1
    ns: str
    epoch: str  # the collection incarnation the chunks belong to
    chunks: int = Field(ge=0)
    documents: int = Field(ge=0)
    dataSizeBytes: int = Field(ge=0)
    bytesWrittenSinceLastReport: int = Field(ge=0)


class ShardStatistics(Record):
    type: Literal["ShardStatistics"] = "ShardStatistics"
    v: Literal[1] = 1
    shard: str
    configTime: int = Field(ge=0)  # the catalog the chunk list was taken from
    timestamp: float  # Unix seconds when the report was computed
    windowSeconds: float = Field(ge=0)  # the time bytesWrittenSinceLastReport covers
    chunks: list[ChunkStatistics]
    collections: list[CollectionStatistics]


statistics: Codec[ShardStatistics] = Codec("shard.stats", ShardStatistics, (ShardStatistics,))
