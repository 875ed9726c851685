"""Records of the DDL coordinators (docs/decisions/0018, domain/ddl.py).

Config side: the client's requests (`DropCollection` ... `RefineCollectionShardKey`), the
coordinator's checkpoints (`AdvanceDDL`) and the events they become (`DDLStarted`,
`DDLPhaseReached`, `DDLFinished`, and the catalog changes made at a point of no return).
They travel on `config.commands` / `config.events` (schemas.config lists them).

Shard side: what a coordinator asks of each shard that takes part (`EnterDDLCriticalSection`
... `RekeyLocalBatch`) and the changelog events recording it.  They travel on
`shard.<id>.requests` / `shard.<id>.changelog` (schemas.shard lists them).
"""

from __future__ import annotations

from typing import Any, Literal

from schemas import Record
from schemas.bsonjson import BsonDoc

DDLOp = Literal[
    "dropCollection", "dropDatabase", "renameCollection", "refineCollectionShardKey", "createIndexes", "dropIndexes"
]

# ---------------------------------------------------------------- config commands


class DropCollection(Record):
    """Drop a collection, sharded or not.  A missing collection answers ok (`dropped` False)."""

    type: Literal["DropCollection"] = "DropCollection"
    v: Literal[1] = 1
    ns: str


class DropDatabase(Record):
    """Drop every collection of a database, then the database.  A missing one answers ok."""

    type: Literal["DropDatabase"] = "DropDatabase"
    v: Literal[1] = 1
    db: str


class RenameCollection(Record):
    """Rename `ns` to `to` within its database; `dropTarget` drops an existing `to` first."""

    type: Literal["RenameCollection"] = "RenameCollection"
    v: Literal[1] = 1
    ns: str
    to: str
    dropTarget: bool = False


class RefineCollectionShardKey(Record):
    """Extend a sharded collection's key with more fields (the old key is its prefix)."""

    type: Literal["RefineCollectionShardKey"] = "RefineCollectionShardKey"
    v: Literal[1] = 1
    ns: str
    key: dict[str, Any]


class CreateCollectionIndexes(Record):
    """createIndexes: build `indexes` (createIndexes specs, `{"key": {...}, "name": ...}`) on
    every shard that owns chunks of `ns` and its database's primary, then list them in the
    catalog.  A missing collection is created first; indexes that already exist are ok."""

    type: Literal["CreateCollectionIndexes"] = "CreateCollectionIndexes"
    v: Literal[1] = 1
    ns: str
    indexes: list[BsonDoc]


class DropCollectionIndexes(Record):
    """dropIndexes: `index` is "*" (every index but `_id_` and the shard key's), a name, a key
    pattern, or a list of names."""

    type: Literal["DropCollectionIndexes"] = "DropCollectionIndexes"
    v: Literal[1] = 1
    ns: str
    index: str | list[str] | BsonDoc


class AdvanceDDL(Record):
    """The coordinator's checkpoint: coordinator `id`, in phase `phase`, has done that phase's
    work; record phase `to`.  `to` "done" finishes it (with `code`/`reason`: it failed before
    its point of no return and was rolled back).  A checkpoint already recorded answers ok
    again (a retry)."""

    type: Literal["AdvanceDDL"] = "AdvanceDDL"
    v: Literal[1] = 1
    id: str
    phase: str
    to: str
    code: str | None = None
    reason: str | None = None
    result: dict[str, Any] = {}


class GetDDL(Record):
    """Read-only: coordinator `id` (running, or how it ended), or every running one."""

    type: Literal["GetDDL"] = "GetDDL"
    v: Literal[1] = 1
    id: str | None = None


# ------------------------------------------------------------------ config events


class DDLStarted(Record):
    """The coordinator's state document: written before anything changes.  `locks` are the
    database then the namespaces it holds, in order of acquisition."""

    type: Literal["DDLStarted"] = "DDLStarted"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    op: DDLOp
    ns: str  # the namespace (the database, for dropDatabase)
    params: dict[str, Any] = {}  # the request's other fields: to, dropTarget, key
    locks: list[str]
    phase: str
    shards: list[str]  # the shards that take part (every shard of the cluster when it started)
    startedAt: float


class DDLPhaseReached(Record):
    """A checkpoint: the coordinator is in `phase` (its work not yet done).  Phase "rollback"
    carries why (`code`, `reason`)."""

    type: Literal["DDLPhaseReached"] = "DDLPhaseReached"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    phase: str
    code: str | None = None
    reason: str | None = None
    info: dict[str, Any] | None = None  # rollback: the error's details (DuplicateKey's keyPattern, keyValue)


class DDLFinished(Record):
    """The state document removed and the locks released (in reverse order): ok, or rolled
    back with `code` and `reason`."""

    type: Literal["DDLFinished"] = "DDLFinished"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    ok: bool
    code: str | None = None
    reason: str | None = None
    result: dict[str, Any] = {}


class CollectionDropped(Record):
    """`ns` (sharded, or tracked unsharded) is gone from the catalog, its zones with it."""

    type: Literal["CollectionDropped"] = "CollectionDropped"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str


class DatabaseDropped(Record):
    """`db` and every collection of it are gone; its database version with them."""

    type: Literal["DatabaseDropped"] = "DatabaseDropped"
    v: Literal[1] = 1
    ts: int | None = None
    db: str


class CollectionRenamed(Record):
    """`ns` is now `to` (a `to` that existed was dropped first).  A sharded collection keeps its
    uuid, chunks and zones under a new epoch; an unsharded one keeps its uuid."""

    type: Literal["CollectionRenamed"] = "CollectionRenamed"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    to: str
    epoch: str | None = None  # sharded only


class ShardKeyRefined(Record):
    """`ns`'s key is now `key` (the old one is its prefix): a new epoch, every chunk keeps its
    major/minor, chunk and zone bounds extended with MinKey for the new fields."""

    type: Literal["ShardKeyRefined"] = "ShardKeyRefined"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    key: dict[str, Any]
    epoch: str


class IndexesCreated(Record):
    """`ns`'s catalog entry lists `indexes` too (listIndexes form, Extended JSON): they are
    built on every shard that owned chunks of it (createIndexes' point of no return)."""

    type: Literal["IndexesCreated"] = "IndexesCreated"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    indexes: list[BsonDoc]


class IndexesDropped(Record):
    """`ns`'s catalog entry no longer lists the indexes `names` (dropIndexes' point of no
    return: the shards drop them next)."""

    type: Literal["IndexesDropped"] = "IndexesDropped"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    names: list[str]


# ---------------------------------------------------------------- shard requests


class EnterDDLCriticalSection(Record):
    """Block reads and writes of `namespaces` (or of every collection of `db`) on this shard
    until ExitDDLCriticalSection(id): they are refused with a retriable StaleConfig."""

    type: Literal["EnterDDLCriticalSection"] = "EnterDDLCriticalSection"
    v: Literal[1] = 1
    id: str
    namespaces: list[str] = []
    db: str | None = None


class ExitDDLCriticalSection(Record):
    type: Literal["ExitDDLCriticalSection"] = "ExitDDLCriticalSection"
    v: Literal[1] = 1
    id: str


class DropLocalData(Record):
    """Delete this shard's documents of `ns` (or of every collection of `db`), with their
    range-deletion tasks.  Idempotent."""

    type: Literal["DropLocalData"] = "DropLocalData"
    v: Literal[1] = 1
    id: str
    ns: str | None = None
    db: str | None = None


class RenameLocalBatch(Record):
    """Move up to `limit` of this shard's documents of `ns` to `to`; the reply says how many
    moved and whether `ns` is empty here (`done`).  Repeated until done."""

    type: Literal["RenameLocalBatch"] = "RenameLocalBatch"
    v: Literal[1] = 1
    id: str
    ns: str
    to: str
    limit: int = 2000


class RekeyLocalBatch(Record):
    """Rewrite up to `limit` of this shard's documents of `ns` under the collection's current
    (refined) shard key, scanning from `after` (hex of a stored key; None: the start); the
    reply gives the next `after` and `done`.  Repeated until done."""

    type: Literal["RekeyLocalBatch"] = "RekeyLocalBatch"
    v: Literal[1] = 1
    id: str
    ns: str
    after: str | None = None
    limit: int = 2000


# ------------------------------------------------------------ shard changelog events


class DDLCriticalSectionRecorded(Record):
    type: Literal["DDLCriticalSectionRecorded"] = "DDLCriticalSectionRecorded"
    v: Literal[1] = 1
    id: str
    namespaces: list[str] = []
    db: str | None = None


class DDLCriticalSectionRemoved(Record):
    type: Literal["DDLCriticalSectionRemoved"] = "DDLCriticalSectionRemoved"
    v: Literal[1] = 1
    id: str


class LocalDataDropped(Record):
    """Every document of `ns` (or of `db`'s collections) written before this record is gone: one
    range deletion in RocksDB, replayed as such (its changelog key is unique, so compaction
    keeps it after the documents it deletes)."""

    type: Literal["LocalDataDropped"] = "LocalDataDropped"
    v: Literal[1] = 1
    ts: int | None = None
    id: str
    ns: str | None = None
    db: str | None = None
