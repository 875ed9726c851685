"""Records of the data path: client -> router (`router.requests`) and router ->
shard (`shard.<id>.requests`) share the request models (a router adds `routing`);
`shard.<id>.changelog` holds a shard's documents.

Records of a shard: `shard.<id>.requests` in (CRUD from routers), and
`shard.<id>.changelog` out (the shard's documents; compacted by document identity).

Every data request carries the router's `Routing`: the ConfigTime it routed
at and the version it believes this shard has for the collection, so the
shard can answer StaleConfig instead of serving from a different placement.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import Codec, Record
from schemas.bsonjson import BsonDoc, BsonValue, RecordForm
from schemas.ddl import (
    DDLCriticalSectionRecorded,
    DDLCriticalSectionRemoved,
    DropLocalData,
    EnterDDLCriticalSection,
    ExitDDLCriticalSection,
    LocalDataDropped,
    RekeyLocalBatch,
    RenameLocalBatch,
)
from schemas.indexes import (
    INDEX_EVENTS,
    INDEX_REQUESTS,
    BuildIndexes,
    DropIndexes,
    IndexBuildStep,
    IndexRecorded,
    IndexRemoved,
    ListIndexes,
)

# Documents, filters, updates, sorts, projections and results: BSON values in memory, relaxed
# Extended JSON in the record (docs/decisions/0016).
Doc = BsonDoc
# Shard-key bounds: Extended JSON in memory too (``{"x": {"$minKey": 1}}``), read with
# domain.shardkey.from_ejson, as the config server's chunk bounds.
Bound = RecordForm

# Session fields of client operations (docs/decisions/0014, 0015).  They are typed loosely here on
# purpose: a malformed lsid, txnNumber or $clusterTime must get MongoDB's error (TypeMismatch,
# BadValue, ...) from the domain's parsers, not a dead letter.
#   lsid         {"id": "<uuid>"}: the logical session
#   txnNumber    int >= 0: the retryable write's number within its session (writes only)
#   stmtIds      router -> shard only: the statement ids of this part (an insert: one per document)
#   clusterTime  a client's signed $clusterTime: {"clusterTime": <ts>, "signature": {"hash", "keyId"}}
#   readConcern  reads: {"afterClusterTime": <ts>} (a causally consistent session)


class Routing(Record):
    """What the router believed when it chose this shard.

    `epoch` None: the router thinks the collection is unsharded, so this shard
    must be its database's primary.  Otherwise `version` is the (major, minor)
    of this shard's version for the collection.
    """

    type: Literal["Routing"] = "Routing"
    v: Literal[1] = 1
    configTime: int
    epoch: str | None = None
    version: tuple[int, int] | None = None


class Txn(Record):
    """Router -> shard: the multi-document transaction a statement belongs to (issue 33,
    docs/decisions/0020).  Every statement of one transaction, on every shard, carries the same
    snapshot; the shard keeps the statement's writes aside until CommitTransaction."""

    type: Literal["Txn"] = "Txn"
    v: Literal[1] = 1
    lsid: str  # the session's uuid
    txnNumber: int = Field(ge=0)
    readAt: int = Field(ge=0)  # the transaction's snapshot: a packed cluster time


# ---------------------------------------------------------------- requests


class Insert(Record):
    type: Literal["Insert"] = "Insert"
    v: Literal[1] = 1
    ns: str
    docs: list[Doc]
    ordered: bool = True
    routing: Routing | None = None  # None: from a client to a router
    txn: Txn | None = None  # router -> shard: a statement of this transaction (issue 33)
    lsid: Any = None
    txnNumber: Any = None
    stmtIds: Any = None
    clusterTime: Any = None
    # document i is the retryable-write statement firstStmtId + i (a bulkWrite's inserts follow
    # its other operations in one statement numbering)
    firstStmtId: int = Field(0, ge=0, le=2**31 - 1)


class Find(Record):
    type: Literal["Find"] = "Find"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)
    sort: Doc | None = None
    skip: int = Field(0, ge=0)
    limit: int = Field(0, ge=0)  # 0: no limit
    projection: Doc | None = None
    batchSize: int = Field(101, ge=1)
    routing: Routing | None = None  # None: from a client to a router
    txn: Txn | None = None  # router -> shard: a statement of this transaction (issue 33)
    lsid: Any = None
    clusterTime: Any = None
    readConcern: Any = None
    hint: Any = None  # an index name or key pattern, or {"$natural": 1} (domain/planner.py)


class GetMore(Record):
    type: Literal["GetMore"] = "GetMore"
    v: Literal[1] = 1
    cursorId: int
    batchSize: int = Field(101, ge=1)
    lsid: Any = None
    clusterTime: Any = None


class Count(Record):
    type: Literal["Count"] = "Count"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)
    routing: Routing | None = None  # None: from a client to a router
    lsid: Any = None
    clusterTime: Any = None
    readConcern: Any = None
    # an index name or key pattern, or {"$natural": 1}: the shards' planner takes it (domain/planner.py)
    hint: Any = None


class Update(Record):
    type: Literal["Update"] = "Update"
    v: Literal[1] = 1
    ns: str
    filter: Doc
    update: Doc | list[Doc]  # operators, a replacement, or a pipeline of stages
    multi: bool = False
    upsert: bool = False
    routing: Routing | None = None  # None: from a client to a router
    txn: Txn | None = None  # router -> shard: a statement of this transaction (issue 33)
    lsid: Any = None
    txnNumber: Any = None
    stmtIds: Any = None
    clusterTime: Any = None
    # an index name or key pattern, or {"$natural": 1}: the shards' planner takes it (domain/planner.py)
    hint: Any = None
    # MongoDB 8.0's updateOne / replaceOne sort: the first matching document in this order is the one
    sort: Doc | None = None
    arrayFilters: list[Doc] | None = None  # the filters of the update's $[<identifier>] paths
    # the statement's index in its client's batch (the wire protocol's update/delete command):
    # its retryable-write statement id, which the router sends the shard in stmtIds
    stmtId: int = Field(0, ge=0, le=2**31 - 1)


class Delete(Record):
    type: Literal["Delete"] = "Delete"
    v: Literal[1] = 1
    ns: str
    filter: Doc
    multi: bool = False
    routing: Routing | None = None  # None: from a client to a router
    txn: Txn | None = None  # router -> shard: a statement of this transaction (issue 33)
    lsid: Any = None
    txnNumber: Any = None
    stmtIds: Any = None
    clusterTime: Any = None
    # an index name or key pattern, or {"$natural": 1}: the shards' planner takes it (domain/planner.py)
    hint: Any = None
    # the statement's index in its client's batch (the wire protocol's update/delete command):
    # its retryable-write statement id, which the router sends the shard in stmtIds
    stmtId: int = Field(0, ge=0, le=2**31 - 1)


class FindAndModify(Record):
    """Change (or remove) one document and return it, before or after (MongoDB's findAndModify):
    the first document `query` matches in `sort` order; `update` (operators or a replacement)
    or `remove`; `new` returns the post-image; `upsert` inserts when nothing matches; `fields`
    projects the returned document."""

    type: Literal["FindAndModify"] = "FindAndModify"
    v: Literal[1] = 1
    ns: str
    query: Doc = Field(default_factory=dict)
    sort: Doc | None = None
    update: Doc | list[Doc] | None = None  # operators, a replacement, or a pipeline of stages
    arrayFilters: list[Doc] | None = None  # the filters of the update's $[<identifier>] paths
    remove: bool = False
    new: bool = False
    upsert: bool = False
    fields: Doc | None = None
    routing: Routing | None = None  # None: from a client to a router
    txn: Txn | None = None  # router -> shard: a statement of this transaction (issue 33)
    lsid: Any = None
    txnNumber: Any = None
    stmtIds: Any = None
    clusterTime: Any = None
    # an index name or key pattern, or {"$natural": 1}: the shards' planner takes it (domain/planner.py)
    hint: Any = None


class Explain(Record):
    """Which shards a query targets and why (a router), and each shard's plan and execution
    (the router asks each targeted shard with `routing`: domain/planner.py's explain)."""

    type: Literal["Explain"] = "Explain"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)
    sort: Doc | None = None
    projection: Doc | None = None
    skip: int = Field(0, ge=0)
    limit: int = Field(0, ge=0)  # 0: no limit
    hint: Any = None
    # MongoDB's: "queryPlanner" plans only; "executionStats" / "allPlansExecution" also run the
    # winning plan for its counts
    verbosity: Literal["queryPlanner", "executionStats", "allPlansExecution"] = "allPlansExecution"
    routing: Routing | None = None  # None: from a client to a router


class CommitTransaction(Record):
    """Router -> shard (one participant wrote), or coordinator -> participant (two-phase commit,
    with the decided `commitAt`): apply the transaction's writes here, all stamped with one
    cluster time (reply `{"committedAt": ts}`); a retry of a committed one answers the same.
    Unknown, aborted or superseded: NoSuchTransaction."""

    type: Literal["CommitTransaction"] = "CommitTransaction"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)
    commitAt: int | None = None  # a prepared transaction's: the largest prepare stamp


class PrepareTransaction(Record):
    """A transaction's coordinator -> each participant that wrote (two-phase commit): its vote.
    Ok: `{"prepareTimestamp": ts}`, and its writes are held until the coordinator's decision
    (a prepared participant never decides alone); an error is a vote to abort."""

    type: Literal["PrepareTransaction"] = "PrepareTransaction"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)


class CoordinateCommitTransaction(Record):
    """Router -> the transaction's coordinator, its first participant that wrote: commit on
    `participants` by two-phase commit.  The first one records the coordinator; every one (a
    retry, or another router with the recoveryToken) answers what is known: `{"decision":
    "commit", "commitAt": ts}`, `{"decision": "abort", "why": ...}`, `{"decision": null}` while
    the votes are still out (ask again)."""

    type: Literal["CoordinateCommitTransaction"] = "CoordinateCommitTransaction"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)
    participants: list[str] = Field(default_factory=list)  # empty: only asking for the outcome


class AdvanceTxnCoordinator(Record):
    """The coordinator's driver -> its own shard: record the coordinator's next state (the
    decision before any participant learns it, then that it is done)."""

    type: Literal["AdvanceTxnCoordinator"] = "AdvanceTxnCoordinator"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)
    state: Literal["committing", "aborting", "done"]
    commitAt: int | None = None
    why: str = ""


class AbortTransaction(Record):
    """Router -> shard: drop the transaction's writes here (its locks released).  Unknown:
    NoSuchTransaction; committed: TransactionCommitted."""

    type: Literal["AbortTransaction"] = "AbortTransaction"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)


class StartTransaction(Record):
    """Client -> router only (the Kafka client library; the wire's drivers start one with
    `startTransaction` on their first statement): open transaction `txnNumber` of the session,
    at the snapshot `readConcern` names (its atClusterTime, else the router's time).  Reply
    `{"readAt": ts}`; the transaction's statements then carry `txn` = (lsid, txnNumber, readAt),
    and CommitTransaction / AbortTransaction end it through the same router (the session's
    requests share a partition of router.requests)."""

    type: Literal["StartTransaction"] = "StartTransaction"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int = Field(ge=0)
    readConcern: Any = None
    clusterTime: Any = None


class EndSessions(Record):
    """MongoDB's endSessions: the sessions leave the routers' caches and the sessions store;
    their retryable-write records are reaped by the shards after the session timeout."""

    type: Literal["EndSessions"] = "EndSessions"
    v: Literal[1] = 1
    lsids: Any = None  # [{"id": "<uuid>"}, ...], checked by the router (TypeMismatch, BadValue)


class KillSessions(Record):
    """MongoDB's killSessions: as EndSessions, and the router's cursors opened under them are killed."""

    type: Literal["KillSessions"] = "KillSessions"
    v: Literal[1] = 1
    lsids: Any = None


# ------------------------------------------------- migrations and range deletion (docs/reference/chunk-migration.md)
# Sent by a donor's migration coordinator (to itself and to the recipient), by the range
# deleter, or by the CLI.  Bounds are shard-key documents in Extended JSON.


class StartDonation(Record):
    type: Literal["StartDonation"] = "StartDonation"
    v: Literal[1] = 1
    id: str
    ns: str
    epoch: str
    min: Bound
    max: Bound
    recipient: str


class StartReceipt(Record):
    type: Literal["StartReceipt"] = "StartReceipt"
    v: Literal[1] = 1
    id: str
    ns: str
    epoch: str
    min: Bound
    max: Bound
    donor: str
    # The donor's indexes of `ns` (listIndexes form, ready ones, implicit ones left out): the
    # recipient builds those it lacks before it clones (seed 000 step 3).
    indexes: list[BsonDoc] = Field(default_factory=list)


class StartPrimaryMove(Record):
    """movePrimary on the old primary: register it; writes to the database's unsharded
    collections are blocked from now until the decision."""

    type: Literal["StartPrimaryMove"] = "StartPrimaryMove"
    v: Literal[1] = 1
    id: str
    db: str
    recipient: str


class StartPrimaryReceipt(Record):
    type: Literal["StartPrimaryReceipt"] = "StartPrimaryReceipt"
    v: Literal[1] = 1
    id: str
    db: str
    donor: str
    # The donor's indexes of the database's unsharded collections, by namespace (as StartReceipt's).
    indexes: dict[str, list[BsonDoc]] = Field(default_factory=dict)


class _Nested(BaseModel):
    """A part of a record (no type or schema version of its own): immutable, strict about fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Statement(_Nested):
    """One executed statement of a retryable write (docs/decisions/0015): its id, the shard key
    (hex) of the document it wrote or matched (None: none, e.g. an update that matched nothing),
    its result, and for findAndModify the pre- or post-image its reply returned."""

    stmtId: int
    ns: str
    skey: str | None = None
    result: Doc = Field(default_factory=dict)
    image: Doc | None = None


class SessionStatements(_Nested):
    """Statements of one session's retryable write, as a migration carries them."""

    lsid: str
    txnNumber: int
    lastWriteAt: float
    statements: list[Statement]


class ForgetSessions(Record):
    """From the shard's own session reaper: remove the transactions-table records of these
    sessions (by lsid uuid) whose last write is older than `before` (unix seconds), checked
    again when decided."""

    type: Literal["ForgetSessions"] = "ForgetSessions"
    v: Literal[1] = 1
    lsids: list[str]
    before: float


class TransferBatch(Record):
    """Documents for the recipient: the clone (phase "clone") or the writes made on the
    donor since it began (phase "mods"), in changelog order."""

    type: Literal["TransferBatch"] = "TransferBatch"
    v: Literal[1] = 1
    id: str
    ns: str | None = None  # a primary move names the collection of each batch
    phase: Literal["clone", "mods"]
    written: list[Doc] = Field(default_factory=list)  # {"skey": hex, "doc": {...}}
    removed: list[Doc] = Field(default_factory=list)  # {"skey": hex, "id": ...}
    # Transactions-table statements about documents of the range (session migration)
    sessions: list[SessionStatements] = Field(default_factory=list)
    # The clone of a range as the donor stores it, decoded by neither side (chunk-migration.md,
    # "the bulk clone"): per document [hex of its store key (shard key + _id encoding), the
    # shard key's length in bytes, its stored value (compact relaxed Extended JSON)].
    stored: list[tuple[str, int, str]] = Field(default_factory=list)


class CommitClone(Record):
    type: Literal["CommitClone"] = "CommitClone"
    v: Literal[1] = 1
    id: str


class EnterCriticalSection(Record):
    """Block writes to the range (and with `reads`, reads too) until the decision."""

    type: Literal["EnterCriticalSection"] = "EnterCriticalSection"
    v: Literal[1] = 1
    id: str
    reads: bool = False


class RecordDecision(Record):
    type: Literal["RecordDecision"] = "RecordDecision"
    v: Literal[1] = 1
    id: str
    committed: bool
    configTime: int = 0  # where the commit is in config.events


class FinishReceipt(Record):
    type: Literal["FinishReceipt"] = "FinishReceipt"
    v: Literal[1] = 1
    id: str
    committed: bool


class ForgetMigration(Record):
    type: Literal["ForgetMigration"] = "ForgetMigration"
    v: Literal[1] = 1
    id: str


class SplitVector(Record):
    """Read-only: split points for the chunk holding `find`'s shard key (a document), or the
    chunk starting at `chunkMin` (a bound in Extended JSON, MinKey included; what the balancer
    sends), chosen from this shard's documents (MongoDB's splitVector), or the median
    point with `median`."""

    type: Literal["SplitVector"] = "SplitVector"
    v: Literal[1] = 1
    ns: str
    find: Doc | None = None
    chunkMin: Bound | None = None
    maxChunkSizeBytes: int = Field(128 * 1024 * 1024, ge=1)
    median: bool = False
    # the chunk is the collection's first/last of an ordered key: MongoDB's top-chunk optimisation
    edge: Literal["top", "bottom"] | None = None


class CheckShardKey(Record):
    """Read-only, to a database's primary before `ns`, unsharded there, is sharded by `key`:
    refused (MongoDB's error) if an existing document cannot be keyed by it (an array, a key
    over the size limit) or, with `unique`, two documents share a key value."""

    type: Literal["CheckShardKey"] = "CheckShardKey"
    v: Literal[1] = 1
    ns: str
    key: Doc
    unique: bool = False


class ListMigrations(Record):
    """This shard's migration documents, range-deletion tasks and live progress (read-only)."""

    type: Literal["ListMigrations"] = "ListMigrations"
    v: Literal[1] = 1


class DeleteRangeBatch(Record):
    type: Literal["DeleteRangeBatch"] = "DeleteRangeBatch"
    v: Literal[1] = 1
    task: str
    limit: int = Field(128, ge=1)


MIGRATION_REQUESTS = (
    StartDonation,
    StartReceipt,
    StartPrimaryMove,
    StartPrimaryReceipt,
    TransferBatch,
    CommitClone,
    EnterCriticalSection,
    RecordDecision,
    FinishReceipt,
    ForgetMigration,
    ListMigrations,
    DeleteRangeBatch,
    SplitVector,
    CheckShardKey,
)
SESSION_REQUESTS = (ForgetSessions,)
# A DDL coordinator's requests to the shards that take part (schemas/ddl.py).
DDL_REQUESTS = (EnterDDLCriticalSection, ExitDDLCriticalSection, DropLocalData, RenameLocalBatch, RekeyLocalBatch)


ShardRequest = Annotated[
    Insert
    | Find
    | GetMore
    | Count
    | Update
    | Delete
    | FindAndModify
    | Explain
    | CommitTransaction
    | PrepareTransaction
    | CoordinateCommitTransaction
    | AdvanceTxnCoordinator
    | AbortTransaction
    | StartTransaction
    | EndSessions
    | KillSessions
    | StartDonation
    | StartReceipt
    | StartPrimaryMove
    | StartPrimaryReceipt
    | TransferBatch
    | CommitClone
    | EnterCriticalSection
    | RecordDecision
    | FinishReceipt
    | ForgetMigration
    | ListMigrations
    | DeleteRangeBatch
    | SplitVector
    | CheckShardKey
    | ForgetSessions
    | EnterDDLCriticalSection
    | ExitDDLCriticalSection
    | DropLocalData
    | RenameLocalBatch
    | RekeyLocalBatch
    | BuildIndexes
    | IndexBuildStep
    | DropIndexes
    | ListIndexes,
    Field(discriminator="type"),
]
REQUESTS = (
    Insert,
    Find,
    GetMore,
    Count,
    Update,
    Delete,
    FindAndModify,
    Explain,
    CommitTransaction,
    PrepareTransaction,
    CoordinateCommitTransaction,
    AdvanceTxnCoordinator,
    AbortTransaction,
    StartTransaction,
    EndSessions,
    KillSessions,
    *MIGRATION_REQUESTS,
    *SESSION_REQUESTS,
    *DDL_REQUESTS,
    *INDEX_REQUESTS,
)
# What clients may send to a router (the rest is between services).

# --------------------------------------------------------------- changelog


class DocumentWritten(Record):
    """The document as it now is.  `skey` is the hex of its encoded shard key,
    so replay places it without consulting the catalog."""

    type: Literal["DocumentWritten"] = "DocumentWritten"
    v: Literal[1] = 1
    ts: int | None = None  # the ClusterTime the shard stamped the write with (docs/decisions/0014)
    ns: str
    skey: str
    doc: Doc


class DocumentRemoved(Record):
    type: Literal["DocumentRemoved"] = "DocumentRemoved"
    v: Literal[1] = 1
    ts: int | None = None
    ns: str
    skey: str
    id: BsonValue


class RetryableWriteRecorded(Record):
    """Statements executed under a session's txnNumber (the shard's transactions table), written
    in the same transaction as the writes they describe, so that a retry returns the recorded
    results instead of writing again.  One session's records share its latest txnNumber; a
    record is keyed by (lsid, txnNumber, part) and removed with a tombstone."""

    type: Literal["RetryableWriteRecorded"] = "RetryableWriteRecorded"
    v: Literal[1] = 1
    lsid: str  # the session's uuid
    txnNumber: int
    part: str  # tells this record from the session's others under the same txnNumber
    statements: list[Statement]
    lastWriteAt: float  # unix seconds: when the session last wrote here (the reaper's input)
    ts: int | None = None  # the ClusterTime stamp (docs/decisions/0014)


class MigrationRecorded(Record):
    """A shard's migration document (donor's coordinator state or recipient's receipt)."""

    type: Literal["MigrationRecorded"] = "MigrationRecorded"
    v: Literal[1] = 1
    id: str
    role: Literal["donor", "recipient", "primary-donor", "primary-recipient"]
    ns: str
    epoch: str
    min: Bound
    max: Bound
    peer: str  # the other shard
    # A donor's: cloning, critical, committing, decided; a recipient's: cloning, clone-committed
    # (services/shard/protocol: DonorState, RecipientState).
    state: str
    decision: Literal["committed", "aborted"] | None = None
    cloned: int = 0
    mods: int = 0


class MigrationForgotten(Record):
    type: Literal["MigrationForgotten"] = "MigrationForgotten"
    v: Literal[1] = 1
    id: str


class RangeDeletionRecorded(Record):
    """A range-deletion task: pending until its migration is decided, then ready."""

    type: Literal["RangeDeletionRecorded"] = "RangeDeletionRecorded"
    v: Literal[1] = 1
    id: str  # the migration's id
    ns: str
    epoch: str
    min: Bound
    max: Bound
    pending: bool = True
    readyAt: float | None = None  # unix time the task became ready
    configTime: int = 0  # queries routed before this ConfigTime may still read the range
    deleted: int = 0
    why: str = ""  # donor after commit / recipient after abort
    traceparent: str = ""  # the migration's trace: the task's deletion batches are spans of it


class RangeDeletionRemoved(Record):
    type: Literal["RangeDeletionRemoved"] = "RangeDeletionRemoved"
    v: Literal[1] = 1
    id: str


class TxnWrite(_Nested):
    """The final image of one document a transaction wrote (`doc` None: it removed it)."""

    ns: str
    skey: str  # hex of the encoded shard key, as DocumentWritten's
    id: BsonValue
    doc: Doc | None = None


class TxnRecorded(Record):
    """A shard's part in a multi-document transaction (docs/decisions/0020): its snapshot, where
    it stands, and the documents it wrote here, kept aside until commit.  Keyed by the session:
    a newer transaction's record replaces the older one's."""

    type: Literal["TxnRecorded"] = "TxnRecorded"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int
    readAt: int
    state: Literal["in-progress", "prepared", "committed", "aborted"]
    writes: list[TxnWrite] = Field(default_factory=list)
    startedAt: float  # unix seconds: the lifetime limit counts from here
    commitAt: int | None = None  # the one stamp its writes were applied with
    prepareAt: int | None = None  # two-phase commit: its vote's stamp


class TxnCoordinatorRecorded(Record):
    """A two-phase commit's coordinator, on its shard (docs/decisions/0020): the participants,
    then the decision, recorded before any participant learns it; replay resumes it.  Keyed by
    the session."""

    type: Literal["TxnCoordinatorRecorded"] = "TxnCoordinatorRecorded"
    v: Literal[1] = 1
    lsid: str
    txnNumber: int
    participants: list[str]
    state: Literal["preparing", "committing", "aborting", "done"]
    decision: Literal["commit", "abort"] | None = None
    commitAt: int | None = None
    why: str = ""  # an abort's reason


class NoopWritten(Record):
    """MongoDB's no-op oplog write before a read at a later cluster time: a snapshot read at T
    ahead of every stamp this shard has logged.  Its stamp (> T) makes the clock's advance
    durable, so no write after a restart is stamped at or before a time already read."""

    type: Literal["NoopWritten"] = "NoopWritten"
    v: Literal[1] = 1
    ts: int | None = None


ShardEvent = Annotated[
    DocumentWritten
    | DocumentRemoved
    | RetryableWriteRecorded
    | MigrationRecorded
    | MigrationForgotten
    | RangeDeletionRecorded
    | RangeDeletionRemoved
    | TxnRecorded
    | TxnCoordinatorRecorded
    | NoopWritten
    | DDLCriticalSectionRecorded
    | DDLCriticalSectionRemoved
    | LocalDataDropped
    | IndexRecorded
    | IndexRemoved,
    Field(discriminator="type"),
]
EVENTS = (
    DocumentWritten,
    DocumentRemoved,
    RetryableWriteRecorded,
    MigrationRecorded,
    MigrationForgotten,
    RangeDeletionRecorded,
    RangeDeletionRemoved,
    TxnRecorded,
    TxnCoordinatorRecorded,
    NoopWritten,
    DDLCriticalSectionRecorded,
    DDLCriticalSectionRemoved,
    LocalDataDropped,
    *INDEX_EVENTS,
)

requests: Codec[ShardRequest] = Codec("shard.requests", ShardRequest, REQUESTS)
changelog: Codec[ShardEvent] = Codec("shard.changelog", ShardEvent, EVENTS)
