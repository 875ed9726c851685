"""The DDL coordinator (seed 001, "Sharding DDL Coordinator"; docs/decisions/0018): one state
machine for every DDL — dropCollection, dropDatabase, renameCollection, refineCollectionShardKey.

The state document is `DDLStarted` in `config.events`; every checkpoint is `DDLPhaseReached`;
completion is `DDLFinished`, which releases the locks.  All three are folded by the catalog, so
a restarted (or standby) config server finds every unfinished coordinator at the phase it had
checkpointed and runs that phase again: each phase's work is idempotent.

    phase              expects (entering it)                   work (then AdvanceDDL to the next)
    freezeMigrations   the database's lock held (DDLStarted)   wait until no migration of the locked
                                                               namespaces runs (the catalog refuses
                                                               new ones and their commits)
    blockCRUD          no migration of the namespaces          every shard enters a critical section:
                                                               CRUD on the namespaces waits
    commit             CRUD blocked everywhere                 nothing: the advance to applyOnShards
                                                               carries the catalog change, in the
                                                               same transaction (point of no return)
    applyOnShards      the catalog changed                     every shard drops / renames / rekeys
                                                               its documents
    releaseCRUD        the shards' documents match             every shard leaves the critical section
    done               (DDLFinished: the locks released, in reverse order)
    rollback           before the point of no return, an       every shard leaves the critical section,
                       error the coordinator cannot retry      then DDLFinished with the error

The index DDLs (docs/reference/indexes.md) block no CRUD and take their own phases (ORDERS):

    createIndexes      freezeMigrations -> buildIndexes -> commit -> done
        buildIndexes   BuildIndexes on every shard that owns chunks and the primary, then
                       ListIndexes until each is ready (or failed: rollback)
        commit         nothing: the advance to done carries IndexesCreated (point of no return)
        rollback       DropIndexes (missingOk) of the new indexes on every shard
    dropIndexes        freezeMigrations -> commit -> applyOnShards -> done
        commit         nothing: the advance to applyOnShards carries IndexesDropped
        applyOnShards  DropIndexes (missingOk) on every shard

Pure: the catalog and a request in, events (or a CommandError) out.  The async driver that does
each phase's work is services/config/coordinator.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from domain.bsonvalues import to_record
from domain.index_ddl import check_drop_target
from domain.indexes import IndexSpec
from domain.protocol import ErrorCode, check_db_name, split_ns
from domain.shardkey import MAX_KEY, MIN_KEY, InvalidKeyPattern, KeyPattern
from libs.errors import CommandError
from schemas import Record
from schemas import ddl as d


class Phase(StrEnum):
    FREEZE = "freezeMigrations"
    BLOCK_CRUD = "blockCRUD"
    BUILD = "buildIndexes"
    COMMIT = "commit"
    APPLY = "applyOnShards"
    RELEASE = "releaseCRUD"
    DONE = "done"
    ROLLBACK = "rollback"


ORDER = [Phase.FREEZE, Phase.BLOCK_CRUD, Phase.COMMIT, Phase.APPLY, Phase.RELEASE, Phase.DONE]
POINT_OF_NO_RETURN = Phase.APPLY  # reached: the catalog has changed, the DDL only goes forward

# The index DDLs block no CRUD: writes go on while the shards build (they maintain the index
# themselves), and a dropped index is simply no longer used.
ORDERS: dict[str, list[Phase]] = {
    "createIndexes": [Phase.FREEZE, Phase.BUILD, Phase.COMMIT, Phase.DONE],
    "dropIndexes": [Phase.FREEZE, Phase.COMMIT, Phase.APPLY, Phase.DONE],
}
# The phase whose checkpoint carries the catalog change: createIndexes lists the indexes only
# once every shard has built them (its advance to done carries IndexesCreated).
POINTS_OF_NO_RETURN: dict[str, Phase] = {"createIndexes": Phase.DONE}


def order_of(op: str) -> list[Phase]:
    return ORDERS.get(op, ORDER)


def point_of_no_return(op: str) -> Phase:
    return POINTS_OF_NO_RETURN.get(op, POINT_OF_NO_RETURN)


def next_phase(phase: Phase, op: str = "dropCollection") -> Phase:
    if phase == Phase.ROLLBACK:
        return Phase.DONE
    order = order_of(op)
    return order[order.index(phase) + 1]


def before_point_of_no_return(phase: Phase, op: str = "dropCollection") -> bool:
    if phase in (Phase.ROLLBACK, Phase.DONE):
        return False
    order = order_of(op)
    return order.index(phase) < order.index(point_of_no_return(op))


@dataclass
class Coordinator:
    """A running DDL coordinator: its state document and the phase it last checkpointed."""

    id: str
    op: str
    ns: str  # the namespace; the database for dropDatabase
    params: dict[str, Any]
    locks: list[str]  # the database, then the namespaces
    phase: Phase
    shards: list[str]
    started_at: float
    code: str | None = None  # why it rolls back
    reason: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] | None = None  # rollback: the error's details

    @property
    def db(self) -> str:
        return self.locks[0]

    def namespaces(self) -> list[str]:
        """The collections it changes (empty for dropDatabase: the whole database)."""
        return self.locks[1:]

    def covers(self, ns: str) -> bool:
        """Does this coordinator hold `ns` (a namespace, or a database name)?"""
        if "." not in ns:
            return ns == self.db
        return ns in self.locks[1:] or (self.op == "dropDatabase" and ns.partition(".")[0] == self.db)

    def same_request(self, op: str, ns: str, params: dict[str, Any]) -> bool:
        return (self.op, self.ns, self.params) == (op, ns, params)

    def record(self) -> dict[str, Any]:
        """As GetDDL and the status commands show it."""
        return {
            "id": self.id,
            "op": self.op,
            "ns": self.ns,
            "params": self.params,
            "state": "running",
            "phase": str(self.phase),
            "shards": self.shards,
            "startedAt": self.started_at,
            **({"code": self.code, "reason": self.reason} if self.phase == Phase.ROLLBACK else {}),
            **({"info": self.info} if self.info else {}),
        }

    def state(self) -> dict[str, Any]:
        """The persisted state document (the config server's store: restarts without replay)."""
        return {
            "id": self.id,
            "op": self.op,
            "ns": self.ns,
            "params": self.params,
            "locks": self.locks,
            "phase": str(self.phase),
            "shards": self.shards,
            "startedAt": self.started_at,
            "code": self.code,
            "reason": self.reason,
            **({"info": self.info} if self.info else {}),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Coordinator:
        return cls(
            r["id"],
            r["op"],
            r["ns"],
            r["params"],
            r["locks"],
            Phase(r["phase"]),
            r["shards"],
            r["startedAt"],
            r.get("code"),
            r.get("reason"),
            info=r.get("info"),
        )

    @classmethod
    def started(cls, e: d.DDLStarted) -> Coordinator:
        return cls(e.id, e.op, e.ns, dict(e.params), list(e.locks), Phase(e.phase), list(e.shards), e.startedAt)


@dataclass(frozen=True)
class Request:
    """A client's DDL request, normalised: what joins a running coordinator is the same op on
    the same namespace with the same params."""

    op: str
    ns: str
    params: dict[str, Any]
    locks: list[str]


def request_of(cmd: Record) -> Request:
    """The request a DDL command asks for, with its names checked (InvalidNamespace)."""
    if isinstance(cmd, d.DropCollection):
        db, _ = split_ns(cmd.ns)
        return Request("dropCollection", cmd.ns, {}, [db, cmd.ns])
    if isinstance(cmd, d.DropDatabase):
        check_db_name(cmd.db)
        return Request("dropDatabase", cmd.db, {}, [cmd.db])
    if isinstance(cmd, d.RenameCollection):
        db, _ = split_ns(cmd.ns)
        to_db, _ = split_ns(cmd.to)
        if to_db != db:
            raise CommandError(
                ErrorCode.CommandFailed,
                f"source and destination collections must be on the same database ({cmd.ns} -> {cmd.to})",
            )
        if cmd.to == cmd.ns:
            raise CommandError(ErrorCode.IllegalOperation, f"cannot rename {cmd.ns} to itself")
        return Request("renameCollection", cmd.ns, {"to": cmd.to, "dropTarget": cmd.dropTarget}, [db, cmd.ns, cmd.to])
    if isinstance(cmd, d.RefineCollectionShardKey):
        db, _ = split_ns(cmd.ns)
        return Request("refineCollectionShardKey", cmd.ns, {"key": dict(cmd.key)}, [db, cmd.ns])
    if isinstance(cmd, d.CreateCollectionIndexes):
        db, _ = split_ns(cmd.ns)
        if not cmd.indexes:
            raise CommandError(ErrorCode.BadValue, "Must specify at least one index.")
        specs = [IndexSpec.parse(spec) for spec in cmd.indexes]
        return Request("createIndexes", cmd.ns, {"indexes": [to_record(s.to_mongo()) for s in specs]}, [db, cmd.ns])
    if isinstance(cmd, d.DropCollectionIndexes):
        db, _ = split_ns(cmd.ns)
        return Request("dropIndexes", cmd.ns, {"index": check_drop_target(cmd.index)}, [db, cmd.ns])
    raise CommandError(ErrorCode.CommandNotFound, f"{cmd.type} is not a DDL")


def refined_pattern(old: KeyPattern, spec: dict[str, Any]) -> KeyPattern:
    """The refined key, checked: a valid pattern that extends `old` with at least one field
    (InvalidOptions otherwise, as MongoDB answers)."""
    try:
        new = KeyPattern.parse(spec)
    except InvalidKeyPattern as e:
        raise CommandError(ErrorCode.InvalidOptions, f"invalid shard key: {e}") from None
    old_items, new_items = list(old.spec.items()), list(new.spec.items())
    if len(new_items) <= len(old_items) or new_items[: len(old_items)] != old_items:
        raise CommandError(
            ErrorCode.InvalidOptions,
            f"the new shard key {new.spec} must extend the current one {old.spec} with at least one field",
        )
    return new


def extend_bound(bound: dict[str, Any], new_fields: Sequence[str]) -> dict[str, Any]:
    """A chunk or zone bound of the old key as a bound of the refined key: MinKey for the new
    fields (seed 001's version table: refining keeps every chunk, bounds extended), except the
    global max, which stays the global max (MaxKey in every field), so the chunks still cover
    the whole key space."""
    fill = MAX_KEY if bound and all(v == MAX_KEY for v in bound.values()) else MIN_KEY
    return {**bound, **{f: fill for f in new_fields}}


DDL_LOCK_WAIT_S = 30.0


def ddl_lock_wait() -> float:
    """How long a caller waits for a database's DDL lock (a running coordinator) before giving
    up with ConflictingOperationInProgress: SHARDLOG_DDL_LOCK_WAIT seconds (default 30)."""
    raw = os.environ.get("SHARDLOG_DDL_LOCK_WAIT", "")
    try:
        return max(0.0, float(raw)) if raw else DDL_LOCK_WAIT_S
    except ValueError:
        return DDL_LOCK_WAIT_S
