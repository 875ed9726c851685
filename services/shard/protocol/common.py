"""What every role's transitions share: the shard they read, the step they return, the
roles of a migration document, and the lookups that refuse with an error code."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from domain.catalog import Catalog, Collection
from domain.protocol import ErrorCode
from domain.shardkey import from_ejson
from libs.commands import CommandError, Decision
from schemas import Record
from schemas import ddl as d
from schemas import shard as s
from services.shard.documents import UNSHARDED_END, UNSHARDED_KEY, SessionEntry, StoredDocument

Doc = dict[str, Any]
Reply = dict[str, Any]


class Role(StrEnum):
    """`MigrationRecorded.role`: which side of which kind of migration the document is."""

    DONOR = "donor"
    RECIPIENT = "recipient"
    PRIMARY_DONOR = "primary-donor"  # movePrimary: the database's unsharded collections
    PRIMARY_RECIPIENT = "primary-recipient"


DONORS = frozenset({Role.DONOR, Role.PRIMARY_DONOR})
RECIPIENTS = frozenset({Role.RECIPIENT, Role.PRIMARY_RECIPIENT})


class Documents(Protocol):
    """What a transition reads of the shard's documents (`services.shard.documents`)."""

    @property
    def migrations(self) -> Mapping[str, s.MigrationRecorded]: ...

    @property
    def range_tasks(self) -> Mapping[str, s.RangeDeletionRecorded]: ...

    @property
    def sessions(self) -> Mapping[str, SessionEntry]: ...

    @property
    def ddl_sections(self) -> Mapping[str, d.DDLCriticalSectionRecorded]: ...

    @property
    def ddl_drops(self) -> Mapping[str, frozenset[str]]: ...

    @property
    def indexes(self) -> Mapping[str, Mapping[str, Any]]: ...  # ns -> name -> documents.Index

    def find_by_id(self, ns: str, doc_id: Any) -> tuple[bytes, Doc] | None: ...

    def scan(self, ns: str, lo: bytes = b"", hi: bytes | None = None) -> Iterator[tuple[bytes, Doc]]: ...


@dataclass(frozen=True)
class Shard:
    """The shard a transition decides on: its id, its view of the catalog, its documents."""

    id: str
    catalog: Catalog
    documents: Documents


@dataclass
class Step:
    """A transition's outcome: the changelog events that record it, the reply, and the
    fault point (crash tests) the driver fires before the decision is committed."""

    events: list[Record] = field(default_factory=list)
    reply: Reply = field(default_factory=dict)
    fault: str | None = None
    # A bulk clone batch's documents, written before `events` (DocumentWritten records spliced
    # from their stored bytes: MigrationDecider makes them the decision's BulkEvents).
    cloned: tuple[str, list[StoredDocument]] | None = None

    def decision(self, fire: Callable[[str], None]) -> Decision:
        """The step as a command processor's decision, its fault point fired first."""
        if self.fault is not None:
            fire(self.fault)
        return Decision(self.events, self.reply)


def overlaps(a_lo: bytes, a_hi: bytes, b_lo: bytes, b_hi: bytes) -> bool:
    return a_lo < b_hi and b_lo < a_hi


def range_keys(catalog: Catalog, ns: str, lo: Doc, hi: Doc) -> tuple[bytes, bytes]:
    """[lo, hi) of a sharded collection as encoded shard keys."""
    coll = catalog.collections.get(ns)
    if coll is None:
        raise CommandError(ErrorCode.NamespaceNotFound, f"{ns} is not sharded")
    return coll.pattern.encode_bound(from_ejson(lo)), coll.pattern.encode_bound(from_ejson(hi))


def owns(shard: Shard, coll: Collection | None, skey: bytes) -> bool:
    """Whether this shard owns the shard key (an unsharded collection's documents are all its)."""
    return coll is None or coll.chunks[coll.chunk_index(skey)].shard == shard.id


def stale_owner(shard: Shard, what: str) -> CommandError:
    return CommandError(ErrorCode.StaleConfig, what, {"shard": shard.id, "configTime": shard.catalog.config_time})


def joined(shard: Shard, mid: str) -> Step | None:
    """A start request for a migration already registered here answers with its state
    (a retry); one for another migration is refused: a shard takes part in one at a time."""
    for m in shard.documents.migrations.values():
        if m.id == mid:
            return Step([], {"id": mid, "state": m.state, "joined": True})
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"{shard.id} already takes part in migration {m.id} ({m.role}, {m.state}); "
            f"a shard runs one migration at a time",
        )
    return None


def document(shard: Shard, mid: str, roles: frozenset[Role], role_name: str) -> s.MigrationRecorded:
    """This shard's undecided migration document `mid` in one of `roles`."""
    m = shard.documents.migrations.get(mid)
    if m is None or m.role not in roles:
        raise CommandError(ErrorCode.NoSuchMigration, f"{shard.id} has no {role_name} document for migration {mid}")
    if m.decision is not None:
        raise CommandError(ErrorCode.IllegalOperation, f"migration {mid} was already {m.decision}")
    return m


def range_move_record(
    mid: str, role: Role, ns: str, epoch: str, lo: Doc, hi: Doc, peer: str, state: str
) -> s.MigrationRecorded:
    """A chunk migration's document: [lo, hi) of `ns` at `epoch`, with the other shard as `peer`."""
    return s.MigrationRecorded(id=mid, role=role.value, ns=ns, epoch=epoch, min=lo, max=hi, peer=peer, state=state)


def primary_move_record(mid: str, role: Role, db: str, peer: str, state: str) -> s.MigrationRecorded:
    """A movePrimary's migration document: the database's unsharded collections, no range."""
    return s.MigrationRecorded(id=mid, role=role.value, ns=db, epoch="", min={}, max={}, peer=peer, state=state)


def unsharded_removals(shard: Shard, db: str) -> list[Record]:
    """Removals of every document of `db`'s unsharded collections held here."""
    d = shard.catalog.databases.get(db)
    out: list[Record] = []
    for ns in sorted(d.collections if d else ()):
        for _k, doc in shard.documents.scan(ns, UNSHARDED_KEY, UNSHARDED_END):
            out.append(s.DocumentRemoved(ns=ns, skey=UNSHARDED_KEY.hex(), id=doc["_id"]))
    return out
