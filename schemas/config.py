"""Records of the config server: `config.commands` in, `config.events` out, replies.

Events carry the facts decided by the config server (new chunk versions,
epochs, uuids) so that every projection applies them without re-deciding.
Shard-key bounds travel as MongoDB Extended JSON (`{"$minKey": 1}`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from schemas import Codec, Record
from schemas.bsonjson import RecordForm
from schemas.ddl import (
    AdvanceDDL,
    CollectionDropped,
    CollectionRenamed,
    CreateCollectionIndexes,
    DatabaseDropped,
    DDLFinished,
    DDLPhaseReached,
    DDLStarted,
    DropCollection,
    DropCollectionIndexes,
    DropDatabase,
    GetDDL,
    IndexesCreated,
    IndexesDropped,
    RefineCollectionShardKey,
    RenameCollection,
    ShardKeyRefined,
)

Bound = RecordForm  # a full shard-key document, Extended JSON (BSON values given are written as it)


class ChunkDoc(Record):
    """A chunk as the catalog records it: [min, max) owned by `shard` at version (major, minor)."""

    type: Literal["Chunk"] = "Chunk"
    v: Literal[1] = 1
    min: Bound
    max: Bound
    shard: str
    version: tuple[int, int]
    jumbo: bool = False


class BalancerWindow(Record):
    type: Literal["BalancerWindow"] = "BalancerWindow"
    v: Literal[1] = 1
    start: str  # "HH:MM"
    stop: str
    timeZone: str  # IANA name, e.g. "Europe/Paris"; explicit on purpose


# ---------------------------------------------------------------- commands


class AddShard(Record):
    type: Literal["AddShard"] = "AddShard"
    v: Literal[1] = 1
    shard: str


class RemoveShard(Record):
    type: Literal["RemoveShard"] = "RemoveShard"
    v: Literal[1] = 1
    shard: str


class CreateDatabase(Record):
    type: Literal["CreateDatabase"] = "CreateDatabase"
    v: Literal[1] = 1
    db: str
    primary: str | None = None  # None: the shard with the least data


class CreateCollection(Record):
    """Track an unsharded collection (routers send it before its first write), so that
    sharding it later knows it may hold documents."""

    type: Literal["CreateCollection"] = "CreateCollection"
    v: Literal[1] = 1
    ns: str


class ShardCollection(Record):
    type: Literal["ShardCollection"] = "ShardCollection"
    v: Literal[1] = 1
    ns: str
    key: dict[str, Any]
    unique: bool = False
    numInitialChunks: int | None = None  # hashed keys only


class SplitChunk(Record):
    type: Literal["SplitChunk"] = "SplitChunk"
    v: Literal[1] = 1
    ns: str
    at: list[Bound]


class MergeChunks(Record):
    type: Literal["MergeChunks"] = "MergeChunks"
    v: Literal[1] = 1
    ns: str
    min: Bound
    max: Bound


class AddShardToZone(Record):
    type: Literal["AddShardToZone"] = "AddShardToZone"
    v: Literal[1] = 1
    shard: str
    zone: str


class RemoveShardFromZone(Record):
    type: Literal["RemoveShardFromZone"] = "RemoveShardFromZone"
    v: Literal[1] = 1
    shard: str
    zone: str


class AssignZoneRange(Record):
    type: Literal["AssignZoneRange"] = "AssignZoneRange"
    v: Literal[1] = 1
    ns: str
    min: Bound
    max: Bound
    zone: str


class RemoveZoneRange(Record):
    type: Literal["RemoveZoneRange"] = "RemoveZoneRange"
    v: Literal[1] = 1
    ns: str
    min: Bound
    max: Bound


class MoveRange(Record):
    """Move [min, max) to shard `to` (splitting first if it is a sub-range of a chunk);
    `max` None: the donor cuts up to one max chunk size of data from `min`."""

    type: Literal["MoveRange"] = "MoveRange"
    v: Literal[1] = 1
    ns: str
    min: Bound
    max: Bound | None = None
    to: str
    forceJumbo: bool = False
    waitForDelete: bool = False


class CommitMigration(Record):
    """From the donor, in its critical section: [min, max) now belongs to the recipient."""

    type: Literal["CommitMigration"] = "CommitMigration"
    v: Literal[1] = 1
    id: str
    min: Bound
    max: Bound


class AbortMigration(Record):
    """From the donor (or its recovery): the migration will not commit.  Answers the
    outcome if it was already decided, so recovery learns "did the chunk move?"."""

    type: Literal["AbortMigration"] = "AbortMigration"
    v: Literal[1] = 1
    id: str
    reason: str
    jumbo: bool = False  # the range could not be split: mark its chunk jumbo
    code: str | None = None  # why, as an error code name (ErrorCode) when one applies


class GetMigration(Record):
    """State of a migration: active, committed or aborted (read-only)."""

    type: Literal["GetMigration"] = "GetMigration"
    v: Literal[1] = 1
    id: str | None = None
    ns: str | None = None  # every active migration of a collection (or all, with neither)


class MovePrimary(Record):
    """Make `to` the primary of `db`: its unsharded collections move there."""

    type: Literal["MovePrimary"] = "MovePrimary"
    v: Literal[1] = 1
    db: str
    to: str


class CommitPrimaryMove(Record):
    type: Literal["CommitPrimaryMove"] = "CommitPrimaryMove"
    v: Literal[1] = 1
    id: str


class AbortPrimaryMove(Record):
    type: Literal["AbortPrimaryMove"] = "AbortPrimaryMove"
    v: Literal[1] = 1
    id: str
    reason: str
    code: str | None = None


class MarkJumbo(Record):
    """The chunk holding `min` cannot be split (one shard-key value): flag it jumbo."""

    type: Literal["MarkJumbo"] = "MarkJumbo"
    v: Literal[1] = 1
    ns: str
    min: Bound


class SetSetting(Record):
    """Set a cluster setting, or a collection's when `ns` is given (value None resets)."""

    type: Literal["SetSetting"] = "SetSetting"
    v: Literal[1] = 1
    key: str
    value: Any = None
    ns: str | None = None


class RotateClusterTimeKeys(Record):
    """Make the signing keys that are due: one valid now and the next (the active config
    server sends it to itself on a timer; docs/decisions/0014)."""

    type: Literal["RotateClusterTimeKeys"] = "RotateClusterTimeKeys"
    v: Literal[1] = 1


ConfigCommand = Annotated[
    AddShard
    | RemoveShard
    | CreateDatabase
    | CreateCollection
    | ShardCollection
    | SplitChunk
    | MergeChunks
    | AddShardToZone
    | RemoveShardFromZone
    | AssignZoneRange
    | RemoveZoneRange
    | SetSetting
    | MoveRange
    | CommitMigration
    | AbortMigration
    | GetMigration
    | MovePrimary
    | CommitPrimaryMove
    | AbortPrimaryMove
    | MarkJumbo
    | RotateClusterTimeKeys
    | DropCollection
    | DropDatabase
    | RenameCollection
    | RefineCollectionShardKey
    | CreateCollectionIndexes
    | DropCollectionIndexes
    | AdvanceDDL
    | GetDDL,
    Field(discriminator="type"),
]
COMMANDS = (
    AddShard,
    RemoveShard,
    CreateDatabase,
    CreateCollection,
    ShardCollection,
    SplitChunk,
    MergeChunks,
    AddShardToZone,
    RemoveShardFromZone,
    AssignZoneRange,
    RemoveZoneRange,
    SetSetting,
    MoveRange,
    CommitMigration,
    AbortMigration,
    GetMigration,
    MovePrimary,
    CommitPrimaryMove,
    AbortPrimaryMove,
    MarkJumbo,
    RotateClusterTimeKeys,
    DropCollection,
    DropDatabase,
    RenameCollection,
    RefineCollectionShardKey,
    CreateCollectionIndexes,
    DropCollectionIndexes,
    AdvanceDDL,
    GetDDL,
)

# ------------------------------------------------------------------ events


class ShardAdded(Record):
    type: Literal["ShardAdded"] = "ShardAdded"
    v: Literal[1] = 1
    ts: int | None = None  # the ClusterTime the config server stamped it with (docs/decisions/0014)
    shard: str


class ShardDraining(Record):
    type: Literal["ShardDraining"] = "ShardDraining"
    v: Literal[1] = 1
    ts: int | None = None
    shard: str


class ShardRemoved(Record):
    type: Literal["ShardRemoved"] = "ShardRemoved"
    v: Literal[1] = 1
    ts: int | None = None
    shard: str


class DatabaseCreated(Record):
    type: Literal["DatabaseCreated"] = "DatabaseCreated"
    v: Literal[1] = 1
    ts: int | None = None
    db: str
    primary: str
    uuid: str
    lastMod: int = 1


class CollectionCreated(Record):
    """An unsharded collection exists (on its database's primary) and may hold documents."""

    type: Literal["CollectionCreated"] = "CollectionCreated"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    uuid: str | None = None  # None in logs older than the field


class CollectionSharded(Record):
    type: Literal["CollectionSharded"] = "CollectionSharded"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    key: dict[str, Any]
    unique: bool
    epoch: str
    uuid: str
    chunks: list[ChunkDoc]


class ChunkSplit(Record):
    """The chunk [min, max) became `chunks` (same shard, bumped minors)."""

    type: Literal["ChunkSplit"] = "ChunkSplit"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    epoch: str
    min: Bound
    max: Bound
    chunks: list[ChunkDoc]


class ChunksMerged(Record):
    """Every chunk inside [chunk.min, chunk.max) became the one `chunk`."""

    type: Literal["ChunksMerged"] = "ChunksMerged"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    epoch: str
    chunk: ChunkDoc


class ShardZoneAdded(Record):
    type: Literal["ShardZoneAdded"] = "ShardZoneAdded"
    v: Literal[1] = 1
    ts: int | None = None
    shard: str
    zone: str


class ShardZoneRemoved(Record):
    type: Literal["ShardZoneRemoved"] = "ShardZoneRemoved"
    v: Literal[1] = 1
    ts: int | None = None
    shard: str
    zone: str


class ZoneRangeAssigned(Record):
    type: Literal["ZoneRangeAssigned"] = "ZoneRangeAssigned"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    min: Bound
    max: Bound
    zone: str


class ZoneRangeRemoved(Record):
    type: Literal["ZoneRangeRemoved"] = "ZoneRangeRemoved"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    min: Bound
    max: Bound


class MigrationRequested(Record):
    type: Literal["MigrationRequested"] = "MigrationRequested"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    ns: str
    epoch: str
    min: Bound
    max: Bound | None
    donor: str
    recipient: str
    forceJumbo: bool = False
    # The W3C traceparent of the request that started it: the donor's and recipient's spans,
    # later and after restarts, continue that trace ("" when it was not traced).
    traceparent: str = ""


class MigrationCommitted(Record):
    """[min, max) moved from donor to recipient: `chunks` are the moved chunk and, if the
    donor keeps any, its control chunk with their new versions."""

    type: Literal["MigrationCommitted"] = "MigrationCommitted"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    ns: str
    epoch: str
    donor: str
    recipient: str
    chunks: list[ChunkDoc]


class MigrationAborted(Record):
    type: Literal["MigrationAborted"] = "MigrationAborted"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    ns: str
    reason: str
    code: str | None = None  # an error code name (ErrorCode) when one applies; absent in older logs


class ChunkMarkedJumbo(Record):
    type: Literal["ChunkMarkedJumbo"] = "ChunkMarkedJumbo"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    epoch: str
    min: Bound


class PrimaryMoveRequested(Record):
    type: Literal["PrimaryMoveRequested"] = "PrimaryMoveRequested"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    db: str
    donor: str
    recipient: str


class PrimaryMoved(Record):
    """The database's primary is now `primary`; its version's lastMod is bumped."""

    type: Literal["PrimaryMoved"] = "PrimaryMoved"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    db: str
    primary: str
    lastMod: int


class PrimaryMoveAborted(Record):
    type: Literal["PrimaryMoveAborted"] = "PrimaryMoveAborted"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    db: str
    reason: str
    code: str | None = None


class SettingChanged(Record):
    type: Literal["SettingChanged"] = "SettingChanged"
    v: Literal[1] = 1
    ts: int | None = None
    key: str
    value: Any = None
    ns: str | None = None


class ClusterTimeKeyCreated(Record):
    """A key to sign cluster times with, valid until `expiresAt` (a packed LogicalTime);
    `key` is its 20 random bytes, base64.  Every follower of config.events holds the keys."""

    type: Literal["ClusterTimeKeyCreated"] = "ClusterTimeKeyCreated"
    v: Literal[1] = 1
    ts: int | None = None
    keyId: int
    key: str
    expiresAt: int


ConfigEvent = Annotated[
    ShardAdded
    | ShardDraining
    | ShardRemoved
    | DatabaseCreated
    | CollectionCreated
    | CollectionSharded
    | ChunkSplit
    | ChunksMerged
    | ShardZoneAdded
    | ShardZoneRemoved
    | ZoneRangeAssigned
    | ZoneRangeRemoved
    | SettingChanged
    | MigrationRequested
    | MigrationCommitted
    | MigrationAborted
    | ChunkMarkedJumbo
    | PrimaryMoveRequested
    | PrimaryMoved
    | PrimaryMoveAborted
    | ClusterTimeKeyCreated
    | DDLStarted
    | DDLPhaseReached
    | DDLFinished
    | CollectionDropped
    | DatabaseDropped
    | CollectionRenamed
    | ShardKeyRefined
    | IndexesCreated
    | IndexesDropped,
    Field(discriminator="type"),
]
EVENTS = (
    ShardAdded,
    ShardDraining,
    ShardRemoved,
    DatabaseCreated,
    CollectionCreated,
    CollectionSharded,
    ChunkSplit,
    ChunksMerged,
    ShardZoneAdded,
    ShardZoneRemoved,
    ZoneRangeAssigned,
    ZoneRangeRemoved,
    SettingChanged,
    MigrationRequested,
    MigrationCommitted,
    MigrationAborted,
    ChunkMarkedJumbo,
    PrimaryMoveRequested,
    PrimaryMoved,
    PrimaryMoveAborted,
    ClusterTimeKeyCreated,
    DDLStarted,
    DDLPhaseReached,
    DDLFinished,
    CollectionDropped,
    DatabaseDropped,
    CollectionRenamed,
    ShardKeyRefined,
    IndexesCreated,
    IndexesDropped,
)

commands: Codec[ConfigCommand] = Codec("config.commands", ConfigCommand, COMMANDS)
events: Codec[ConfigEvent] = Codec("config.events", ConfigEvent, EVENTS)
