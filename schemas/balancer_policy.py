"""The balancer policy's input and output: a cluster snapshot and one round's plan.

Not Kafka records: the shapes `services/balancer/policy.py` reads and writes, and that
`shardlog balancer plan` takes from a file and prints (their JSON Schemas are exported as
`balancer.snapshot` and `balancer.plan`).  These models check shapes only; the policy's
`Snapshot` adds the checks that need the shard-key encoding (key pattern, bounds, zones).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from typing_extensions import TypedDict

MB = 1024 * 1024

Bound = dict[str, Any]  # Extended JSON, e.g. {"x": {"$minKey": 1}}


# ------------------------------------------------------------------------ the snapshot


class Settings(BaseModel):
    """Cluster settings the policy reads."""

    maxChunkSizeBytes: int = Field(128 * MB, ge=1, description="the cluster's max chunk size (default 128 MiB)")


class ShardInfo(BaseModel):
    """A shard: its zones, whether it drains, is free this round, and its capacity weight."""

    id: str = Field(min_length=1)
    draining: bool = Field(False, description="being removed: its chunks move off, it receives none")
    zones: list[str] = []
    available: bool = Field(True, description="false: already busy this round (e.g. in a migration)")
    weight: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="capacity weight: a weight-2 shard aims for twice the data of a weight-1 one",
    )


class ChunkDoc(TypedDict):  # not a model: 100k of them validate about three times faster
    """A chunk [min, max) of the routing table, its owner, its data size and jumbo flag."""

    min: Bound
    max: Bound
    shard: str
    sizeBytes: Annotated[int, Field(ge=0, description="data size of the chunk")]
    jumbo: NotRequired[bool]


class ZoneRangeDoc(BaseModel):
    """A key range [min, max) pinned to the shards of `zone`."""

    zone: str = Field(min_length=1)
    min: Bound
    max: Bound


class CollectionDoc(BaseModel):
    """A sharded collection: shard key, chunks, zone ranges, optional max chunk size."""

    ns: str = Field(min_length=1)
    key: dict[str, Any] = Field(description='shard key pattern, e.g. {"x": 1}')
    maxChunkSizeBytes: int | None = Field(None, ge=1, description="overrides the cluster's when set")
    balancerEnabled: bool = Field(True, description="false: no splits nor migrations for the collection")
    allowMigrations: bool = Field(True, description="false: no splits nor migrations for the collection")
    chunks: list[ChunkDoc] = Field(
        description="the routing table: contiguous from MinKey to MaxKey (any order is accepted, key order is fastest)"
    )
    zones: list[ZoneRangeDoc] = []

    # Set by the policy's validation: the parsed key pattern (domain.shardkey.KeyPattern) and
    # the zone ranges sorted, with their encoded bounds.
    _pattern: Any = PrivateAttr()
    _zones: list[tuple[bytes, bytes, ZoneRangeDoc]] = PrivateAttr()

    def max_chunk_size(self, settings: Settings) -> int:
        return self.maxChunkSizeBytes or settings.maxChunkSizeBytes


class Snapshot(BaseModel):
    """What one balancing round looks at.  Bounds are Extended JSON (``{"$minKey": 1}``);
    extra fields are ignored."""

    settings: Settings = Settings(maxChunkSizeBytes=128 * MB)
    shards: list[ShardInfo]
    collections: list[CollectionDoc] = []


# ---------------------------------------------------------------------------- the plan


class ChunkRange(BaseModel):
    min: Bound
    max: Bound


class Split(BaseModel):
    """Split `chunk` at zone boundaries."""

    ns: str
    chunk: ChunkRange
    at: list[Bound] = Field(description="the zone boundaries strictly inside the chunk, ascending")


MigrationReason = Literal["drain", "zoneViolation", "chunksImbalance"]


class Migration(BaseModel):
    """Move [min, max) from the donor ("from") to the recipient ("to"); a drain may force a jumbo chunk."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    ns: str
    donor: str = Field(alias="from")
    recipient: str = Field(alias="to")
    min: Bound
    max: Bound | None = Field(description="null: the donor cuts up to one max chunk size of data from min")
    reason: MigrationReason


class Plan(BaseModel):
    """One round's actions: the splits first, then the migrations (each shard at most once)."""

    splits: list[Split]
    migrations: list[Migration]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)
