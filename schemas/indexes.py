"""Records of secondary indexes on a shard (issue 15): the requests a shard takes on
`shard.<id>.requests` and the state it keeps in `shard.<id>.changelog`.

An index is named by its namespace and name; its specification travels in MongoDB's listIndexes
form (`{"v": 2, "key": {...}, "name": ..., "unique": true, ...}`), read with
domain.indexes.IndexSpec.parse.

    BuildIndexes     (DDL coordinator -> shard)   record the builds (state building) and answer at
                                                  once; the shard's own driver then scans
    IndexBuildStep   (shard -> itself)            index the next batch of existing documents; the
                                                  last step checks uniqueness and marks it ready
    DropIndexes      (DDL coordinator -> shard)   remove indexes (and abort their builds)
    ListIndexes      (anyone -> shard, read-only) the indexes with their state and build progress

    IndexRecorded    (changelog, compacted by key `idx/<ns>\\0<name>`)  an index's latest state
    IndexRemoved     (changelog, a tombstone's companion)               it is gone: entries deleted

Entries (domain.indexes.entry_key) are not changelog records: they are kept by the shard's fold
in the same write batch as the documents they index, so replaying the changelog rebuilds them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas import Record
from schemas.bsonjson import BsonDoc

IndexState = Literal["building", "ready", "failed"]


class BuildIndexes(Record):
    """Start building `indexes` on `ns` (joined when the same `buildId` already builds them;
    an index already ready with the same options is answered as ready)."""

    type: Literal["BuildIndexes"] = "BuildIndexes"
    v: Literal[1] = 1
    ns: str
    indexes: list[BsonDoc]
    buildId: str  # the DDL coordinator's id
    # the collection's shard key (None: unsharded), for the unique-prefix rule on the shard too
    shardKey: BsonDoc | None = None


class IndexBuildStep(Record):
    type: Literal["IndexBuildStep"] = "IndexBuildStep"
    v: Literal[1] = 1
    ns: str
    name: str
    buildId: str
    limit: int = Field(1000, ge=1)  # documents scanned per step


class DropIndexes(Record):
    """Remove the named indexes of `ns` (`["*"]`: every index but `_id_`); a missing one is
    IndexNotFound unless `missingOk`."""

    type: Literal["DropIndexes"] = "DropIndexes"
    v: Literal[1] = 1
    ns: str
    names: list[str]
    missingOk: bool = False


class ListIndexes(Record):
    type: Literal["ListIndexes"] = "ListIndexes"
    v: Literal[1] = 1
    ns: str


class IndexRecorded(Record):
    type: Literal["IndexRecorded"] = "IndexRecorded"
    v: Literal[1] = 1
    ns: str
    spec: BsonDoc  # listIndexes form
    state: IndexState
    buildId: str = ""
    # building: existing documents are indexed up to and including this document key (hex of
    # the `d/` key; "" none yet).  Writes since the build began maintain the index themselves.
    scannedTo: str = ""
    scanned: int = 0  # documents scanned so far
    total: int = 0  # documents in the collection when the build began (progress)
    multikey: bool = False
    error: BsonDoc | None = None  # failed: {"code": ..., "errmsg": ...}
    # building, unique: the keys (hex of domain.indexes.key_prefix) that two documents may hold,
    # as the steps and the writes found them; the last step rechecks only these.  Overflow:
    # too many to list, the last step checks the whole index.
    dupPrefixes: list[str] = []
    dupOverflow: bool = False


class IndexRemoved(Record):
    type: Literal["IndexRemoved"] = "IndexRemoved"
    v: Literal[1] = 1
    ns: str
    name: str


INDEX_REQUESTS = (BuildIndexes, IndexBuildStep, DropIndexes, ListIndexes)
INDEX_EVENTS = (IndexRecorded, IndexRemoved)
