"""The cluster catalog: shards, databases, sharded collections with their chunks
and zones, and settings — the fold of `config.events`.

`Catalog.apply` is the only way the catalog changes, and it only applies facts
(events); deciding what those facts are is `decide.py`'s job.  The same class
serves the config server (persisted in RocksDB, entity per key) and any reader
that wants "the catalog as of ConfigTime N" (in memory, from a replay).
"""

from __future__ import annotations

import base64
import bisect
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from domain.bsonvalues import from_record, to_record
from domain.clock import ClusterTimeKey, VectorClock
from domain.ddl import Coordinator, Phase, extend_bound
from domain.index_ddl import listed_indexes
from domain.indexes import IndexSpec
from domain.settings import ClusterSettings, CollectionSettings
from domain.shardkey import (
    EXACT_INT,
    NUMBER_TAG,
    NUMBER_TIE,
    KeyPattern,
    from_ejson,
    pack_negated_number,
    simple_bound_key,
    to_ejson,
)
from domain.versions import ChunkVersion, DatabaseVersion, collection_version
from libs.dispatch import Dispatch
from libs.store import Store
from schemas import Record
from schemas import config as ev
from schemas import ddl as dd


@dataclass(frozen=True)
class MigrationOutcome:
    """How a migration (or primary move) ended: committed, or aborted with the error's
    `code` (an ErrorCode name; None when no code applies, and in logs older than the
    field) and `reason`."""

    committed: bool
    code: str | None = None
    reason: str | None = None

    def text(self) -> str:
        """The one-line form of `Catalog.outcomes`: "committed" or "aborted: [<code>: ]<reason>"."""
        if self.committed:
            return "committed"
        return f"aborted: {self.code}: {self.reason}" if self.code else f"aborted: {self.reason}"


class Chunk:
    """A chunk: [min, max) (bounds with MinKey/MaxKey sentinels, and their order-preserving
    encodings `min_key` / `max_key`) owned by `shard` at `version`.

    A replay builds one per split piece and merge, millions of them, and reads few: the
    version is kept as its (major, minor) `pair` and `epoch` and made a ChunkVersion only when
    read, and the bounds of a chunk folded from its document (`from_doc`) are parsed only when
    read.  `min_doc` / `max_doc` are the bounds as the event wrote them (Extended JSON), which is
    what the store keeps, and what a later event's bounds are compared with (None: not known,
    the store keeps `to_ejson` of the bounds)."""

    __slots__ = (
        "_min",
        "_max",
        "min_key",
        "max_key",
        "shard",
        "pair",
        "epoch",
        "jumbo",
        "min_doc",
        "max_doc",
        "_version",
    )

    def __init__(
        self,
        min: dict[str, Any],
        max: dict[str, Any],
        min_key: bytes,
        max_key: bytes,
        shard: str,
        version: ChunkVersion,
        jumbo: bool = False,
    ) -> None:
        self._min: dict[str, Any] | None = min  # None: parsed from min_doc when first read
        self._max: dict[str, Any] | None = max
        self.min_key, self.max_key, self.shard = min_key, max_key, shard
        self.pair, self.epoch = (version.major, version.minor), version.epoch
        self._version: ChunkVersion | None = version  # None: built from pair and epoch when first read
        self.jumbo = jumbo
        self.min_doc: dict[str, Any] | None = None
        self.max_doc: dict[str, Any] | None = None

    @classmethod
    def folded(
        cls,
        min: dict[str, Any],
        max: dict[str, Any],
        min_key: bytes,
        max_key: bytes,
        shard: str,
        pair: tuple[int, int],
        epoch: str,
        jumbo: bool,
        min_doc: dict[str, Any] | None,
        max_doc: dict[str, Any] | None,
    ) -> Chunk:
        """A chunk from an event's document: no ChunkVersion yet (`pair` must be >= 0)."""
        ch = _new_chunk(cls)
        ch._min, ch._max, ch.min_key, ch.max_key, ch.shard = min, max, min_key, max_key, shard
        ch.pair, ch.epoch, ch._version, ch.jumbo, ch.min_doc, ch.max_doc = pair, epoch, None, jumbo, min_doc, max_doc
        return ch

    @classmethod
    def from_doc(cls, doc: ev.ChunkDoc, min_key: bytes, max_key: bytes, epoch: str) -> Chunk:
        """The chunk of an event's document whose keys the caller knows (they must be
        `encode_bound(from_ejson(doc.min / doc.max))`): bounds parsed when first read."""
        return _folded_chunk(doc, min_key, max_key, epoch)

    @property
    def min(self) -> dict[str, Any]:
        if self._min is None:
            self._min = from_ejson(self.min_doc)
        return self._min

    @property
    def max(self) -> dict[str, Any]:
        if self._max is None:
            self._max = from_ejson(self.max_doc)
        return self._max

    @property
    def version(self) -> ChunkVersion:
        if self._version is None:
            self._version = ChunkVersion(self.pair[0], self.pair[1], self.epoch)
        return self._version

    def _fields(self) -> tuple[Any, ...]:
        return (self.min, self.max, self.min_key, self.max_key, self.shard, self.pair, self.epoch, self.jumbo)

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, Chunk) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable (jumbo), as the dataclass it was

    def __repr__(self) -> str:
        return (
            f"Chunk(min={self.min!r}, max={self.max!r}, shard={self.shard!r}, "
            f"version={self.version}, jumbo={self.jumbo})"
        )

    def doc(self) -> ev.ChunkDoc:
        return ev.ChunkDoc(
            min=to_ejson(self.min), max=to_ejson(self.max), shard=self.shard, version=self.pair, jumbo=self.jumbo
        )

    def stored_doc(self) -> ev.ChunkDoc:
        """The document the store keeps: the bounds as the event wrote them, when known."""
        return ev.ChunkDoc(
            min=self.min_doc if self.min_doc is not None else to_ejson(self.min),
            max=self.max_doc if self.max_doc is not None else to_ejson(self.max),
            shard=self.shard,
            version=self.pair,
            jumbo=self.jumbo,
        )


_new_chunk = object.__new__


def _folded_chunk(doc: ev.ChunkDoc, min_key: bytes, max_key: bytes, epoch: str) -> Chunk:
    """`Chunk.from_doc`, a plain function: a replay makes one per split piece and merge."""
    ch = _new_chunk(Chunk)
    ch._min = ch._max = ch._version = None
    ch.min_key, ch.max_key, ch.shard, ch.pair, ch.epoch = min_key, max_key, doc.shard, doc.version, epoch
    ch.jumbo, ch.min_doc, ch.max_doc = doc.jumbo, doc.min, doc.max
    return ch


def _plain_json_str(s: str) -> bool:
    """Whether JSON writes `s` as itself between quotes (pydantic and json alike)."""
    return s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


# The same few shard names and shard key fields, asked of every chunk a replay writes.
_plain_name = functools.lru_cache(maxsize=1024)(_plain_json_str)


def _one_field_json(bound: dict[str, Any] | None) -> str | None:
    """JSON of a one-field bound holding an int, a plain string or MinKey/MaxKey (`{"x":5}`), as
    pydantic writes it; None for any other bound."""
    if bound is None or len(bound) != 1:
        return None
    ((name, v),) = bound.items()
    if type(name) is not str or not _plain_name(name):
        return None
    if type(v) is int:
        return f'{{"{name}":{v}}}'
    if type(v) is str and _plain_json_str(v):
        return f'{{"{name}":"{v}"}}'
    if type(v) is dict and len(v) == 1:
        ((wrapper, one),) = v.items()
        if (wrapper == "$minKey" or wrapper == "$maxKey") and type(one) is int and one == 1:
            return f'{{"{name}":{{"{wrapper}":1}}}}'
    return None


def chunk_json(ch: Chunk) -> bytes:
    """What the store keeps of a chunk: `ch.stored_doc().model_dump_json()`, byte for byte (a
    property test holds it to that), written directly for the bounds a range-sharded replay is
    made of."""
    lo_doc, hi_doc = ch.min_doc, ch.max_doc
    if lo_doc is not None and hi_doc is not None and len(lo_doc) == 1 == len(hi_doc):
        # The usual chunk, {field: int} bounds: _one_field_json's first case, inlined.
        ((lo_name, lo_v),) = lo_doc.items()
        ((hi_name, hi_v),) = hi_doc.items()
        if type(lo_v) is int and type(hi_v) is int and lo_name == hi_name and type(lo_name) is str:
            if _plain_name(lo_name) and _plain_name(ch.shard):
                major, minor = ch.pair
                return (
                    f'{{"type":"Chunk","v":1,"min":{{"{lo_name}":{lo_v}}},"max":{{"{lo_name}":{hi_v}}},'
                    f'"shard":"{ch.shard}","version":[{major},{minor}],"jumbo":{"true" if ch.jumbo else "false"}}}'
                ).encode()
    lo, hi = _one_field_json(lo_doc), _one_field_json(hi_doc)
    if lo is not None and hi is not None and _plain_name(ch.shard):
        major, minor = ch.pair
        return (
            f'{{"type":"Chunk","v":1,"min":{lo},"max":{hi},"shard":"{ch.shard}",'
            f'"version":[{major},{minor}],"jumbo":{"true" if ch.jumbo else "false"}}}'
        ).encode()
    return ch.stored_doc().model_dump_json().encode()


def _same_json(a: dict[str, Any] | None, b: dict[str, Any], field: str) -> bool:
    """Whether two one-field bounds are the same JSON (same field, same types, equal values), so
    they parse to identical bounds; False when not sure (any other shape).  `field`: the one
    field they are expected to have (the shard key's), checked first, as a replay's usual bound
    is `{field: int}`."""
    if a is None:
        return False
    va = a.get(field)
    t = type(va)
    if t is int or t is str:  # dict equality after the types: 1 == 1.0 == True
        return type(b.get(field)) is t and va == b[field] and len(a) == 1 and len(b) == 1
    if a != b or len(a) != 1:
        return False
    (va,) = a.values()
    (vb,) = b.values()
    t = type(va)
    if t is not type(vb):
        return False
    if t is int or t is str:
        return True
    if t is dict and len(va) == 1:  # a wrapper such as {"$minKey": 1}
        (xa,) = va.values()
        (xb,) = vb.values()
        tx = type(xa)
        return tx is type(xb) and (tx is int or tx is str)
    return False


@dataclass
class ZoneRange:
    min: dict[str, Any]
    max: dict[str, Any]
    min_key: bytes
    max_key: bytes
    zone: str


def bounds_pattern(bound: dict[str, Any]) -> KeyPattern:
    """The ascending pattern over a bound's own fields: how the zone ranges of a namespace not
    (yet) sharded are ordered, there being no shard key to order them by."""
    return KeyPattern(tuple(bound))


@dataclass
class Collection:
    """A sharded collection: its key, chunks and zones, and its placement history (seed 001,
    "The historical routing table"): the migrations committed within
    minSnapshotHistoryWindowInSeconds, from which the routing table at any time since
    `history_from` is the current one with those after that time undone."""

    ns: str
    pattern: KeyPattern
    unique: bool
    epoch: str
    uuid: str
    chunks: list[Chunk] = field(default_factory=list)  # sorted by min_key, contiguous, covering the key space
    zones: list[ZoneRange] = field(default_factory=list)  # sorted by min_key, non-overlapping
    settings: CollectionSettings = field(default_factory=CollectionSettings)
    placements: list[Placement] = field(default_factory=list)  # committed migrations, oldest first
    history_from: int = 0  # the oldest cluster time whose routing the placements can tell

    mins: list[bytes] = field(default_factory=list)  # chunks[i].min_key, kept beside for bisect
    # The shard key's field when it has one (None: compound): the fold's fast paths take only those.
    single_field: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.single_field = self.pattern.fields[0] if len(self.pattern.fields) == 1 else None

    def chunk_index(self, key: bytes) -> int:
        """Index of the chunk whose [min, max) contains the encoded key: O(log chunks)."""
        return max(bisect.bisect_right(self.mins, key) - 1, 0)

    # Versions are read on every routed request: computed once per change of the chunks
    # (every change goes through replace_chunks).
    _versions: dict[str, ChunkVersion] | None = field(default=None, repr=False, compare=False)

    def replace_chunks(self, lo: int, hi: int, new: list[Chunk]) -> None:
        """chunks[lo:hi] = new, keeping the bisect index in step."""
        self.chunks[lo:hi] = new
        self.mins[lo:hi] = [c.min_key for c in new]
        self._versions = None

    def _shard_versions(self) -> dict[str, ChunkVersion]:
        if self._versions is None:
            # Each shard's highest chunk by (major, minor): only those chunks' versions are built.
            top: dict[str, Chunk] = {}
            for c in self.chunks:
                if (t := top.get(c.shard)) is None or t.pair < c.pair:
                    top[c.shard] = c
            self._versions = {s: c.version for s, c in top.items()}
        return self._versions

    def version(self) -> ChunkVersion:
        return collection_version(self._shard_versions().values())

    def shard_version(self, shard: str) -> ChunkVersion:
        return self._shard_versions().get(shard) or ChunkVersion(0, 0, self.epoch)

    def chunks_per_shard(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.chunks:
            out[c.shard] = out.get(c.shard, 0) + 1
        return out

    def placed(self, p: Placement, window_s: int) -> None:
        """A migration committed at `p.ts`: remember it, and forget those older than the window
        before it (the routing before them is no longer known)."""
        self.placements.append(p)
        cutoff = p.ts - (window_s << 32)
        while self.placements and self.placements[0].ts < cutoff:
            self.history_from = max(self.history_from, self.placements.pop(0).ts)

    def routing_at(self, at: int) -> list[tuple[bytes, bytes, str]]:
        """The (min_key, max_key, shard) ranges of the routing table at cluster time `at`
        (which must not be older than `history_from`): the current chunks with every migration
        committed after `at` undone, newest first."""
        ranges = [(c.min_key, c.max_key, c.shard) for c in self.chunks]
        for p in reversed(self.placements):
            if p.ts <= at:
                break
            ranges = _assign(ranges, p.min_key, p.max_key, p.donor)
        return ranges

    def owner_at(self, key: bytes, at: int) -> str:
        """The shard that owned the encoded shard key `key` at cluster time `at`."""
        owner = self.chunks[self.chunk_index(key)].shard
        for p in reversed(self.placements):
            if p.ts <= at:
                break
            if p.min_key <= key < p.max_key:
                owner = p.donor
        return owner

    def moved_since(self, key: bytes, at: int) -> int | None:
        """When the range holding the encoded shard key `key` last migrated after cluster time
        `at` (None: it stayed where it was; `at` must not be older than `history_from`)."""
        for p in reversed(self.placements):
            if p.ts <= at:
                break
            if p.min_key <= key < p.max_key:
                return p.ts
        return None

    def chunk_history(self, ch: Chunk) -> list[tuple[int, str]]:
        """(validAfter, shard) of the chunk's range, newest first, as `config.chunks` shows it:
        each migration of a range holding it, back to the oldest remembered, whose donor held it
        since `history_from`."""
        out: list[tuple[int, str]] = []
        shard = ch.shard
        for p in reversed(self.placements):
            if p.max_key <= ch.min_key or ch.max_key <= p.min_key:
                continue  # another range's
            if p.min_key <= ch.min_key and ch.max_key <= p.max_key and p.recipient == shard:
                out.append((p.ts, shard))
                shard = p.donor
                continue
            # Part of it moved then (it is a merge of ranges that came apart): whole on `shard`
            # only since, as MongoDB's merge starts a chunk's history afresh.
            out.append((p.ts, shard))
            return out
        out.append((self.history_from, shard))
        return out


@dataclass(frozen=True)
class Placement:
    """A migration as the routing history keeps it: [min_key, max_key) went from donor to
    recipient at cluster time `ts`."""

    ts: int
    min_key: bytes
    max_key: bytes
    donor: str
    recipient: str

    def record(self) -> list[Any]:
        return [self.ts, self.min_key.hex(), self.max_key.hex(), self.donor, self.recipient]

    @classmethod
    def of(cls, r: list[Any]) -> Placement:
        return cls(r[0], bytes.fromhex(r[1]), bytes.fromhex(r[2]), r[3], r[4])


def _assign(ranges: list[tuple[bytes, bytes, str]], lo: bytes, hi: bytes, shard: str) -> list[tuple[bytes, bytes, str]]:
    """`ranges` (contiguous, sorted) with [lo, hi) given to `shard`, pieces cut where needed."""
    out: list[tuple[bytes, bytes, str]] = []
    for a, b, s in ranges:
        if b <= lo or hi <= a:  # no overlap (encoded bounds compare as bytes, MaxKey's too)
            out.append((a, b, s))
            continue
        if a < lo:
            out.append((a, lo, s))
        out.append((max(a, lo), min(b, hi), shard))
        if hi < b:
            out.append((hi, b, s))
    return merge_adjacent(out)


def merge_adjacent(ranges: list[tuple[bytes, bytes, str]]) -> list[tuple[bytes, bytes, str]]:
    """Contiguous (min, max, shard) ranges with neighbours on the same shard made one."""
    merged: list[tuple[bytes, bytes, str]] = []
    for a, b, s in ranges:
        if merged and merged[-1][2] == s and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b, s)
        else:
            merged.append((a, b, s))
    return merged


@dataclass
class Shard:
    id: str
    draining: bool = False
    zones: set[str] = field(default_factory=set)


@dataclass
class Migration:
    """An active migration as the config server knows it (docs/reference/chunk-migration.md)."""

    id: str
    ns: str
    epoch: str
    min: dict[str, Any]  # Extended JSON, as requested
    max: dict[str, Any] | None
    donor: str
    recipient: str
    force_jumbo: bool = False
    kind: str = "range"  # or "primary": a database's unsharded collections (ns is the database)
    traceparent: str = ""  # the trace of the request that started it (W3C), "" if none

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ns": self.ns,
            "epoch": self.epoch,
            "min": self.min,
            "max": self.max,
            "donor": self.donor,
            "recipient": self.recipient,
            "forceJumbo": self.force_jumbo,
            "kind": self.kind,
            "traceparent": self.traceparent,
        }


@dataclass
class Database:
    name: str
    primary: str
    version: DatabaseVersion
    collections: set[str] = field(default_factory=set)  # tracked unsharded collections (full ns)
    uuids: dict[str, str] = field(default_factory=dict)  # their uuids (none in logs older than them)


on_event: Dispatch[Catalog, None] = Dispatch("catalog event")


class Catalog:
    """In-memory catalog; with `track_changes`, also the entity writes to persist.

    A replay folds millions of splits and merges: those reuse the bounds the catalog already
    parsed (only a split point is parsed), and a chunk written is kept as the chunk until
    `drain_changes`, which serialises each key once per batch however often it was written.
    `fast_fold = False` (a subclass's) parses and serialises every event's chunks as they come:
    the reference the fast paths are tested against (the same store bytes, the same catalog)."""

    fast_fold = True

    def __init__(self, track_changes: bool = True, clock: VectorClock | None = None) -> None:
        self.track_changes = track_changes
        # With a clock: every stamped event applied advances it (docs/decisions/0014).
        self.clock = clock
        self.shards: dict[str, Shard] = {}
        self.databases: dict[str, Database] = {}
        self.collections: dict[str, Collection] = {}
        # Zone ranges of namespaces not sharded (yet), by ns: sorted by min_key, ordered by
        # `bounds_pattern`; they become the collection's zones when it is sharded.
        self.unsharded_zones: dict[str, list[ZoneRange]] = {}
        # When each namespace or database last changed in a way no routing history covers (a
        # drop, a rename, a primary moved): a snapshot read at an earlier time is refused
        # (SnapshotUnavailable), never answered from the wrong shards (issue 32).
        self.changed_at: dict[str, int] = {}
        self.settings = ClusterSettings()
        self.migrations: dict[str, Migration] = {}  # active, by id
        self.outcomes: dict[str, str] = {}  # finished migrations: "committed" or "aborted: <reason>"
        self.aborts: dict[str, MigrationOutcome] = {}  # aborted ones, with their code and reason
        self.config_time = 0  # offset after the last applied event, when known
        # ConfigTime as a logical time: the stamp of the last event; TopologyTime: of the last
        # ShardAdded / ShardRemoved (packed LogicalTimes; 0 in logs older than the stamps).
        self.config_ts = 0
        self.topology_ts = 0
        self.keys: dict[int, ClusterTimeKey] = {}  # cluster-time signing keys, every one ever made
        self.ddl: dict[str, Coordinator] = {}  # running DDL coordinators, by id (domain/ddl.py)
        self.ddl_outcomes: dict[str, dict[str, Any]] = {}  # finished ones: ok, code, reason, result
        # Each collection's secondary indexes (sharded or not), in creation order; `_id_` and the
        # shard key's are implicit (domain/index_ddl.py), never here.
        self.indexes: dict[str, list[IndexSpec]] = {}
        self._vector_dirty = False
        self._changes: dict[bytes, bytes | None] = {}
        # Chunk writes, by namespace then min_key (the chunk's store key is built once per batch,
        # in drain_changes: a replay writes ~2 per event, mostly to keys written before).  A
        # chunk's pending write is the Chunk itself (drain_changes serialises it).
        self._chunk_changes: dict[str, dict[bytes, bytes | Chunk | None]] = {}

    # ------------------------------------------------------------- queries

    def active_shards(self) -> list[str]:
        return sorted(s.id for s in self.shards.values() if not s.draining)

    def chunk_count(self, shard: str) -> int:
        return sum(1 for c in self.collections.values() for ch in c.chunks if ch.shard == shard)

    def primary_of(self, shard: str) -> list[str]:
        return sorted(d.name for d in self.databases.values() if d.primary == shard)

    def migration_of(self, shard: str) -> Migration | None:
        """The active migration (or primary move) this shard takes part in, if any."""
        return next((m for m in self.migrations.values() if shard in (m.donor, m.recipient)), None)

    def ddl_holding(self, ns: str) -> Coordinator | None:
        """The running DDL coordinator that holds `ns` (a namespace or a database), if any."""
        return next((c for c in self.ddl.values() if c.covers(ns)), None)

    def ddl_of_database(self, db: str) -> Coordinator | None:
        """The running DDL coordinator of database `db` (one at a time per database)."""
        return next((c for c in self.ddl.values() if c.db == db), None)

    def index_list(self, ns: str) -> list[IndexSpec]:
        """The indexes `ns` lists (listIndexes): `_id_`, the shard key's, then the created ones."""
        coll = self.collections.get(ns)
        return listed_indexes(
            self.indexes.get(ns, []), coll.pattern.spec if coll else None, coll.unique if coll else False
        )

    def index_shards(self, ns: str) -> list[str]:
        """The shards that hold `ns`'s indexes: those that own chunks of it, and its database's
        primary (which holds it when unsharded)."""
        out = set(self.collections[ns].chunks_per_shard()) if ns in self.collections else set()
        if (db := self.databases.get(ns.partition(".")[0])) is not None:
            out.add(db.primary)
        return sorted(out)

    def uuid_of(self, ns: str) -> str | None:
        """The uuid of a collection, sharded or tracked unsharded."""
        if (coll := self.collections.get(ns)) is not None:
            return coll.uuid
        db = self.databases.get(ns.partition(".")[0])
        return db.uuids.get(ns) if db is not None else None

    def zone_in_use(self, zone: str) -> bool:
        return any(z.zone == zone for c in self.collections.values() for z in c.zones) or any(
            z.zone == zone for zs in self.unsharded_zones.values() for z in zs
        )

    def zone_ranges(self, ns: str) -> list[ZoneRange]:
        """The zone ranges of `ns`, sharded or not."""
        if (coll := self.collections.get(ns)) is not None:
            return coll.zones
        return self.unsharded_zones.get(ns, [])

    def zone_targets(self, zone: str, exclude: str | None = None) -> list[str]:
        """The shards that may take the zone's data: in the zone and not draining."""
        return sorted(s.id for s in self.shards.values() if zone in s.zones and not s.draining and s.id != exclude)

    # ---------------------------------------------------------- persistence

    def _put(self, key: bytes, value: object) -> None:  # a JSON value; None deletes the key
        if self.track_changes:
            self._changes[key] = None if value is None else json.dumps(value, separators=(",", ":")).encode()

    def drain_changes(self) -> dict[bytes, bytes | None]:
        if self._vector_dirty:
            self._put(b"vector", [self.config_ts, self.topology_ts])
            self._vector_dirty = False
        out, self._changes = self._changes, {}
        for ns, pending in self._chunk_changes.items():
            prefix = self._chunk_key(ns, b"")
            for k, v in pending.items():
                out[prefix + k] = chunk_json(v) if type(v) is Chunk else v  # type: ignore[assignment]
        self._chunk_changes = {}
        return out

    def _chunk_writes(self, ns: str) -> dict[bytes, bytes | Chunk | None]:
        """The pending chunk writes of `ns` in this batch, by min_key."""
        pending = self._chunk_changes.get(ns)
        if pending is None:
            pending = self._chunk_changes[ns] = {}
        return pending

    def _put_chunk_key(self, ns: str, min_key: bytes, value: bytes | Chunk | None) -> None:
        if self.track_changes:
            self._chunk_writes(ns)[min_key] = value

    @staticmethod
    def _chunk_key(ns: str, min_key: bytes) -> bytes:
        return b"chunk/" + ns.encode() + b"\x00" + min_key

    @staticmethod
    def _zone_key(ns: str, min_key: bytes) -> bytes:
        return b"zone/" + ns.encode() + b"\x00" + min_key

    @staticmethod
    def _unsharded_zone_key(ns: str, min_key: bytes) -> bytes:
        return b"uzone/" + ns.encode() + b"\x00" + min_key

    def _put_zone(self, ns: str, z: ZoneRange) -> None:
        key = self._zone_key(ns, z.min_key) if ns in self.collections else self._unsharded_zone_key(ns, z.min_key)
        self._put(key, {"min": to_ejson(z.min), "max": to_ejson(z.max), "zone": z.zone})

    def _put_shard(self, s: Shard) -> None:
        self._put(b"shard/" + s.id.encode(), {"draining": s.draining, "zones": sorted(s.zones)})

    def _put_collection(self, c: Collection) -> None:
        self._put(
            b"coll/" + c.ns.encode(),
            {
                "key": c.pattern.spec,
                "unique": c.unique,
                "epoch": c.epoch,
                "uuid": c.uuid,
                "settings": c.settings.model_dump(),
                "historyFrom": c.history_from,
                "placements": [p.record() for p in c.placements],
            },
        )

    def _put_indexes(self, ns: str) -> None:
        specs = self.indexes.get(ns)
        self._put(b"idx/" + ns.encode(), [to_record(s.to_mongo()) for s in specs] if specs else None)

    def _put_chunk(self, ns: str, ch: Chunk, doc: ev.ChunkDoc | None = None) -> None:
        """Write chunk `ch`: its stored document is the event's `doc` when given (the same as
        `ch.stored_doc()`)."""
        if self.track_changes:
            # Serialised once per key per batch, by drain_changes (the reference: at once).
            value = ch if self.fast_fold else (doc or ch.stored_doc()).model_dump_json().encode()
            self._chunk_writes(ns)[ch.min_key] = value

    def load(self, store: Store) -> None:
        """Rebuild the in-memory catalog from the store's entities (no replay needed)."""
        # Through the instance, so that a subclass resets its own state too (bench_replay's TimedCatalog).
        self.__init__(self.track_changes, self.clock)  # type: ignore[misc]
        for k, v in store.scan(b"shard/"):
            d = json.loads(v)
            self.shards[k[6:].decode()] = Shard(k[6:].decode(), d["draining"], set(d["zones"]))
        for _k, v in store.scan(b"db/"):
            d = json.loads(v)
            self.databases[d["name"]] = Database(
                d["name"],
                d["primary"],
                DatabaseVersion(d["uuid"], d["lastMod"]),
                set(d.get("collections", ())),
                dict(d.get("uuids", {})),
            )
        for k, v in store.scan(b"coll/"):
            d = json.loads(v)
            ns = k[5:].decode()
            self.collections[ns] = Collection(
                ns,
                KeyPattern.parse(d["key"]),
                d["unique"],
                d["epoch"],
                d["uuid"],
                settings=CollectionSettings(**d["settings"]),
                placements=[Placement.of(r) for r in d.get("placements", ())],
                history_from=d.get("historyFrom", 0),
            )
        for k, v in store.scan(b"chunk/"):
            ns = k[6 : k.index(b"\x00", 6)].decode()
            coll = self.collections[ns]
            ch = self._chunk(coll, ev.ChunkDoc.model_validate_json(v))
            coll.replace_chunks(len(coll.chunks), len(coll.chunks), [ch])
        for k, v in store.scan(b"zone/"):
            ns = k[5 : k.index(b"\x00", 5)].decode()
            coll = self.collections[ns]
            d = json.loads(v)
            coll.zones.append(self._zone(coll, d["min"], d["max"], d["zone"]))
        for k, v in store.scan(b"uzone/"):  # in key order: by ns, then min_key
            d = json.loads(v)
            lo = from_ejson(d["min"])
            self.unsharded_zones.setdefault(k[6 : k.index(b"\x00", 6)].decode(), []).append(
                self._zone_of(bounds_pattern(lo), lo, from_ejson(d["max"]), d["zone"])
            )
        for _k, v in store.scan(b"mig/"):
            d = json.loads(v)
            self.migrations[d["id"]] = Migration(
                d["id"],
                d["ns"],
                d["epoch"],
                d["min"],
                d["max"],
                d["donor"],
                d["recipient"],
                d["forceJumbo"],
                d.get("kind", "range"),
                d.get("traceparent", ""),
            )
        for k, v in store.scan(b"outcome/"):
            self.outcomes[k[8:].decode()] = json.loads(v)
        for k, v in store.scan(b"abort/"):
            d = json.loads(v)
            self.aborts[k[6:].decode()] = MigrationOutcome(False, d["code"], d["reason"])
        for _k, v in store.scan(b"ddl/"):
            c = Coordinator.from_record(json.loads(v))
            self.ddl[c.id] = c
        for k, v in store.scan(b"ddlout/"):
            self.ddl_outcomes[k[7:].decode()] = json.loads(v)
        for k, v in store.scan(b"idx/"):
            self.indexes[k[4:].decode()] = [IndexSpec.parse(from_record(r)) for r in json.loads(v)]
        for k, v in store.scan(b"nschg/"):
            self.changed_at[k[6:].decode()] = json.loads(v)
        if (raw := store.get(b"settings")) is not None:
            self.settings = ClusterSettings.model_validate_json(raw)
        for _k, v in store.scan(b"ckey/"):
            d = json.loads(v)
            self.keys[d["keyId"]] = ClusterTimeKey(d["keyId"], base64.b64decode(d["key"]), d["expiresAt"])
        if (raw := store.get(b"vector")) is not None:
            self.config_ts, self.topology_ts = json.loads(raw)
            if self.clock is not None:  # a restart resumes the clock from the stamps it has seen
                self.clock.advance(self.config_ts, self.config_ts, self.topology_ts)
        ckpt = store.checkpoint_any()
        self.config_time = ckpt.next_offset if ckpt else 0

    # -------------------------------------------------------------- folding

    @staticmethod
    def _chunk(coll: Collection, doc: ev.ChunkDoc) -> Chunk:
        """The chunk of an event's document, every bound parsed."""
        lo, hi = from_ejson(doc.min), from_ejson(doc.max)
        version = ChunkVersion(doc.version[0], doc.version[1], coll.epoch)  # refuses a negative version
        ch = Chunk.folded(
            lo,
            hi,
            coll.pattern.encode_bound(lo),
            coll.pattern.encode_bound(hi),
            doc.shard,
            version.pair,
            coll.epoch,
            doc.jumbo,
            doc.min,
            doc.max,
        )
        ch._version = version
        return ch

    @staticmethod
    def _zone(coll: Collection, lo: dict[str, Any], hi: dict[str, Any], zone: str) -> ZoneRange:
        return Catalog._zone_of(coll.pattern, from_ejson(lo), from_ejson(hi), zone)

    @staticmethod
    def _zone_of(pattern: KeyPattern, lo: dict[str, Any], hi: dict[str, Any], zone: str) -> ZoneRange:
        return ZoneRange(lo, hi, pattern.encode_bound(lo), pattern.encode_bound(hi), zone)

    def _forget_unsharded_zones(self, ns: str) -> list[ZoneRange]:
        zones = self.unsharded_zones.pop(ns, [])
        for z in zones:
            self._put(self._unsharded_zone_key(ns, z.min_key), None)
        return zones

    def apply(self, e: Record, offset: int) -> None:
        # on_event(self, e), its table read here: one call less on a replay's every event.
        handler = _EVENT_HANDLERS.get(type(e))
        if handler is None:
            on_event(self, e)  # raises Unhandled
        else:
            handler(self, e)
        if offset >= 0:
            self.config_time = offset + 1
        # Fold the event's stamp: ConfigTime's logical value, TopologyTime's on a change of
        # shards.  Inlined, with a set lookup on the exact type (event models are never
        # subclassed) rather than isinstance against a tuple: this runs for every replayed event.
        ts: int | None = getattr(e, "ts", None)
        if ts is not None:
            self.config_ts = ts
            if type(e) in _TOPOLOGY_EVENTS:
                self.topology_ts = ts
            self._vector_dirty = True  # persisted once per batch, in drain_changes
            if self.clock is not None:
                self.clock.advance(ts, ts, self.topology_ts)

    @on_event.register(ev.ClusterTimeKeyCreated)
    def _on_ClusterTimeKeyCreated(self, e: ev.ClusterTimeKeyCreated) -> None:
        self.keys[e.keyId] = ClusterTimeKey(e.keyId, base64.b64decode(e.key), e.expiresAt)
        self._put(b"ckey/" + str(e.keyId).encode(), {"keyId": e.keyId, "key": e.key, "expiresAt": e.expiresAt})

    @on_event.register(ev.ShardAdded)
    def _on_ShardAdded(self, e: ev.ShardAdded) -> None:
        self.shards[e.shard] = s = Shard(e.shard)
        self._put_shard(s)

    @on_event.register(ev.ShardDraining)
    def _on_ShardDraining(self, e: ev.ShardDraining) -> None:
        s = self.shards[e.shard]
        s.draining = True
        self._put_shard(s)

    @on_event.register(ev.ShardRemoved)
    def _on_ShardRemoved(self, e: ev.ShardRemoved) -> None:
        del self.shards[e.shard]
        self._put(b"shard/" + e.shard.encode(), None)

    @on_event.register(ev.DatabaseCreated)
    def _on_DatabaseCreated(self, e: ev.DatabaseCreated) -> None:
        self.databases[e.db] = db = Database(e.db, e.primary, DatabaseVersion(e.uuid, e.lastMod))
        self._put_database(db)

    def _put_database(self, d: Database) -> None:
        self._put(
            b"db/" + d.name.encode(),
            {
                "name": d.name,
                "primary": d.primary,
                "uuid": d.version.uuid,
                "lastMod": d.version.last_mod,
                "collections": sorted(d.collections),
                "uuids": d.uuids,
            },
        )

    @on_event.register(ev.CollectionCreated)
    def _on_CollectionCreated(self, e: ev.CollectionCreated) -> None:
        db = self.databases[e.ns.partition(".")[0]]
        db.collections.add(e.ns)
        if e.uuid is not None:
            db.uuids[e.ns] = e.uuid
        self._put_database(db)

    @on_event.register(ev.CollectionSharded)
    def _on_CollectionSharded(self, e: ev.CollectionSharded) -> None:
        if (old := self.collections.get(e.ns)) is not None:  # a new incarnation replaces the old one
            for ch in old.chunks:
                self._put_chunk_key(e.ns, ch.min_key, None)
            for z in old.zones:
                self._put(self._zone_key(e.ns, z.min_key), None)
        if (db := self.databases.get(e.ns.partition(".")[0])) is not None and e.ns in db.collections:
            db.collections.discard(e.ns)  # tracked as sharded from now on
            db.uuids.pop(e.ns, None)
            self._put_database(db)
        coll = Collection(e.ns, KeyPattern.parse(e.key), e.unique, e.epoch, e.uuid, history_from=e.ts or 0)
        coll.replace_chunks(0, 0, [self._chunk(coll, d) for d in e.chunks])
        self.collections[e.ns] = coll
        self._put_collection(coll)
        for ch, doc in zip(coll.chunks, e.chunks):
            self._put_chunk(e.ns, ch, doc)
        # Ranges assigned before the collection was sharded are its zones now (the decision
        # checked that they name the shard key's fields).
        for z in self._forget_unsharded_zones(e.ns):
            coll.zones.append(self._zone_of(coll.pattern, z.min, z.max, z.zone))
            self._put_zone(e.ns, coll.zones[-1])

    @on_event.register(ev.ChunkSplit)
    def _on_ChunkSplit(self, e: ev.ChunkSplit) -> None:
        """A split into two pieces is folded with the parent's keys reused: only the split point
        is encoded, nothing parsed, when every bound is a one-field int, string or MinKey/MaxKey
        bound and the pieces' outer bounds are the parent's; any other split, `_split_parsed`."""
        coll = self.collections[e.ns]
        docs = e.chunks
        if not self.fast_fold or len(docs) != 2:
            return self._split_parsed(coll, e)
        d0, d1 = docs
        field = coll.single_field
        if field is None:  # a compound shard key
            return self._split_parsed(coll, e)
        at_doc = d0.max
        v = at_doc.get(field)
        if type(v) is int and 0 < v <= EXACT_INT and len(at_doc) == 1:  # simple_bound_key's first case, inlined
            at_key = pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE)
        elif (at_key := simple_bound_key(field, at_doc)) is None:  # type: ignore[assignment]
            return self._split_parsed(coll, e)
        # Each bound below is the same JSON as the one it must be (so it parses the same), or
        # has the same key.  The usual bound, {field: int}, is compared inline: the types, then
        # dict equality (1 == 1.0 == True), and one field only (the others' types unchecked).
        m1 = d1.min
        t = type(at_doc[field])
        if not (
            ((t is int or t is str) and m1 == at_doc and type(m1[field]) is t)
            or _same_json(at_doc, m1, field)
            or simple_bound_key(field, m1) == at_key
        ):
            return self._split_parsed(coll, e)
        i = bisect.bisect_right(coll.mins, at_key) - 1
        if i < 0:
            return self._split_parsed(coll, e)
        chunks = coll.chunks
        parent = chunks[i]
        lo_key, hi_key = parent.min_key, parent.max_key
        if not lo_key < at_key < hi_key:
            return self._split_parsed(coll, e)
        # The outer bounds: a positive int's key is packed (the event is at hand, the parent's
        # documents are not), any other bound compared with the parent's JSON, else encoded.
        # The same check twice, written out: a helper call per bound costs replay ~0.1 µs/event.
        m0 = d0.min
        v = m0.get(field)
        if not (
            (pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE) == lo_key and len(m0) == 1)
            if type(v) is int and 0 < v <= EXACT_INT
            else (_same_json(parent.min_doc, m0, field) or simple_bound_key(field, m0) == lo_key)
        ):
            return self._split_parsed(coll, e)
        x1 = d1.max
        v = x1.get(field)
        if not (
            (pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE) == hi_key and len(x1) == 1)
            if type(v) is int and 0 < v <= EXACT_INT
            else (_same_json(parent.max_doc, x1, field) or simple_bound_key(field, x1) == hi_key)
        ):
            return self._split_parsed(coll, e)
        p0, p1 = d0.version, d1.version
        if not (p0[0] >= 0 <= p0[1] and p1[0] >= 0 <= p1[1]):
            return self._split_parsed(coll, e)  # which refuses them
        epoch = coll.epoch
        a, b = _new_chunk(Chunk), _new_chunk(Chunk)  # _folded_chunk twice, inlined
        a._min = a._max = a._version = b._min = b._max = b._version = None
        a.min_key, a.max_key, a.shard, a.pair, a.epoch = lo_key, at_key, d0.shard, p0, epoch
        a.jumbo, a.min_doc, a.max_doc = d0.jumbo, m0, at_doc
        b.min_key, b.max_key, b.shard, b.pair, b.epoch = at_key, hi_key, d1.shard, p1, epoch
        b.jumbo, b.min_doc, b.max_doc = d1.jumbo, m1, x1
        chunks[i : i + 1] = (a, b)
        coll.mins.insert(i + 1, at_key)  # mins[i] is lo_key already
        coll._versions = None
        if self.track_changes:
            pending = self._chunk_changes.get(coll.ns) or self._chunk_writes(coll.ns)
            pending[lo_key] = a
            pending[at_key] = b

    def _split_parsed(self, coll: Collection, e: ev.ChunkSplit) -> None:
        new = [self._chunk(coll, d) for d in e.chunks]
        i = coll.chunk_index(new[0].min_key)
        coll.replace_chunks(i, i + 1, new)
        for ch, doc in zip(new, e.chunks):
            self._put_chunk(e.ns, ch, doc)

    @on_event.register(ev.ChunksMerged)
    def _on_ChunksMerged(self, e: ev.ChunksMerged) -> None:
        """A merge is placed by its bounds' keys, encoded straight from their JSON, nothing
        parsed, when both are one-field int, string or MinKey/MaxKey bounds that are a first
        chunk's min and a last chunk's max; any other merge, `_merge_parsed`."""
        coll = self.collections[e.ns]
        if not self.fast_fold:
            return self._merge_parsed(coll, e)
        d = e.chunk
        field = coll.single_field
        if field is None:  # a compound shard key
            return self._merge_parsed(coll, e)
        lo_doc, hi_doc = d.min, d.max
        # simple_bound_key, its first case inlined
        v = lo_doc.get(field)
        if type(v) is int and 0 < v <= EXACT_INT and len(lo_doc) == 1:
            lo_key: bytes | None = pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE)
        else:
            lo_key = simple_bound_key(field, lo_doc)
        v = hi_doc.get(field)
        if type(v) is int and 0 < v <= EXACT_INT and len(hi_doc) == 1:
            hi_key: bytes | None = pack_negated_number(NUMBER_TAG, -v, NUMBER_TIE)
        else:
            hi_key = simple_bound_key(field, hi_doc)
        pair = d.version
        if lo_key is None or hi_key is None or not pair[0] >= 0 <= pair[1]:
            return self._merge_parsed(coll, e)  # which refuses a negative version
        chunks = coll.chunks
        lo = bisect.bisect_right(coll.mins, lo_key) - 1
        if lo < 0 or chunks[lo].min_key != lo_key:
            return self._merge_parsed(coll, e)
        hi, n = lo, len(chunks)
        while hi < n and chunks[hi].max_key <= hi_key:
            hi += 1
        if hi == lo or chunks[hi - 1].max_key != hi_key:
            return self._merge_parsed(coll, e)
        m = _new_chunk(Chunk)  # _folded_chunk, inlined
        m._min = m._max = m._version = None
        m.min_key, m.max_key, m.shard, m.pair, m.epoch = lo_key, hi_key, d.shard, pair, coll.epoch
        m.jumbo, m.min_doc, m.max_doc = d.jumbo, lo_doc, hi_doc
        if self.track_changes:
            pending = self._chunk_changes.get(coll.ns) or self._chunk_writes(coll.ns)
            for ch in chunks[lo + 1 : hi]:
                pending[ch.min_key] = None
            pending[lo_key] = m
        chunks[lo:hi] = (m,)
        del coll.mins[lo + 1 : hi]  # mins[lo] is lo_key already
        coll._versions = None

    def _merge_parsed(self, coll: Collection, e: ev.ChunksMerged) -> None:
        merged = self._chunk(coll, e.chunk)
        lo = coll.chunk_index(merged.min_key)
        hi = lo
        while hi < len(coll.chunks) and coll.chunks[hi].max_key <= merged.max_key:
            hi += 1
        for ch in coll.chunks[lo + 1 : hi]:
            self._put_chunk_key(e.ns, ch.min_key, None)
        coll.replace_chunks(lo, hi, [merged])
        self._put_chunk(e.ns, merged, e.chunk)

    @on_event.register(ev.ShardZoneAdded)
    def _on_ShardZoneAdded(self, e: ev.ShardZoneAdded) -> None:
        s = self.shards[e.shard]
        s.zones.add(e.zone)
        self._put_shard(s)

    @on_event.register(ev.ShardZoneRemoved)
    def _on_ShardZoneRemoved(self, e: ev.ShardZoneRemoved) -> None:
        s = self.shards[e.shard]
        s.zones.discard(e.zone)
        self._put_shard(s)

    @on_event.register(ev.ZoneRangeAssigned)
    def _on_ZoneRangeAssigned(self, e: ev.ZoneRangeAssigned) -> None:
        if (coll := self.collections.get(e.ns)) is None:  # a namespace not sharded (yet)
            lo = from_ejson(e.min)
            z = self._zone_of(bounds_pattern(lo), lo, from_ejson(e.max), e.zone)
            bisect.insort(self.unsharded_zones.setdefault(e.ns, []), z, key=lambda r: r.min_key)
            self._put_zone(e.ns, z)
            return
        z = self._zone(coll, e.min, e.max, e.zone)
        bisect.insort(coll.zones, z, key=lambda r: r.min_key)
        self._put(self._zone_key(e.ns, z.min_key), {"min": e.min, "max": e.max, "zone": e.zone})

    @on_event.register(ev.ZoneRangeRemoved)
    def _on_ZoneRangeRemoved(self, e: ev.ZoneRangeRemoved) -> None:
        if (coll := self.collections.get(e.ns)) is None:
            lo = from_ejson(e.min)
            key = bounds_pattern(lo).encode_bound(lo)
            zones = [z for z in self.unsharded_zones.pop(e.ns, []) if z.min_key != key]
            if zones:
                self.unsharded_zones[e.ns] = zones
            self._put(self._unsharded_zone_key(e.ns, key), None)
            return
        key = coll.pattern.encode_bound(from_ejson(e.min))
        coll.zones = [z for z in coll.zones if z.min_key != key]
        self._put(self._zone_key(e.ns, key), None)

    @on_event.register(ev.PrimaryMoveRequested)
    def _on_PrimaryMoveRequested(self, e: ev.PrimaryMoveRequested) -> None:
        # A primary move is a migration of the database's unsharded collections: `ns` is the db.
        m = Migration(e.id, e.db, "", {}, None, e.donor, e.recipient, kind="primary")
        self.migrations[e.id] = m
        self._put(b"mig/" + e.id.encode(), m.record())

    def _changed(self, name: str, ts: int | None) -> None:
        if ts is not None and ts > self.changed_at.get(name, 0):
            self.changed_at[name] = ts
            self._put(b"nschg/" + name.encode(), ts)

    def snapshot_floor(self, ns: str) -> int:
        """The oldest cluster time at which `ns` may be read at a snapshot (0: any)."""
        return max(self.changed_at.get(ns, 0), self.changed_at.get(ns.partition(".")[0], 0))

    @on_event.register(ev.PrimaryMoved)
    def _on_PrimaryMoved(self, e: ev.PrimaryMoved) -> None:
        self._changed(e.db, e.ts)
        db = self.databases[e.db]
        db.primary, db.version = e.primary, DatabaseVersion(db.version.uuid, e.lastMod)
        self._put_database(db)
        self._finish_migration(e.id, MigrationOutcome(True))

    @on_event.register(ev.PrimaryMoveAborted)
    def _on_PrimaryMoveAborted(self, e: ev.PrimaryMoveAborted) -> None:
        self._finish_migration(e.id, MigrationOutcome(False, e.code, e.reason))

    @on_event.register(ev.MigrationRequested)
    def _on_MigrationRequested(self, e: ev.MigrationRequested) -> None:
        m = Migration(e.id, e.ns, e.epoch, e.min, e.max, e.donor, e.recipient, e.forceJumbo, traceparent=e.traceparent)
        self.migrations[e.id] = m
        self._put(b"mig/" + e.id.encode(), m.record())

    def _finish_migration(self, mid: str, outcome: MigrationOutcome) -> None:
        self.migrations.pop(mid, None)
        self._put(b"mig/" + mid.encode(), None)
        self.outcomes[mid] = outcome.text()
        self._put(b"outcome/" + mid.encode(), outcome.text())
        if not outcome.committed:
            self.aborts[mid] = outcome
            self._put(b"abort/" + mid.encode(), {"code": outcome.code, "reason": outcome.reason})

    def outcome(self, mid: str) -> MigrationOutcome | None:
        """How migration `mid` ended; None while it runs (or if unknown)."""
        text = self.outcomes.get(mid)
        if text is None:
            return None
        if text == "committed":
            return MigrationOutcome(True)
        # No abort record: decided before the catalog kept them (the reason is the whole text).
        return self.aborts.get(mid) or MigrationOutcome(False, None, text.removeprefix("aborted: "))

    @on_event.register(ev.MigrationCommitted)
    def _on_MigrationCommitted(self, e: ev.MigrationCommitted) -> None:
        coll = self.collections[e.ns]
        for doc in e.chunks:  # the moved chunk and the donor's control chunk: same bounds, new owner/version
            ch = self._chunk(coll, doc)
            i = coll.chunk_index(ch.min_key)
            coll.replace_chunks(i, i + 1, [ch])
            self._put_chunk(e.ns, ch, doc)
            if doc.shard == e.recipient and e.ts is not None:
                window = self.settings.minSnapshotHistoryWindowInSeconds
                coll.placed(Placement(e.ts, ch.min_key, ch.max_key, e.donor, e.recipient), window)
                self._put_collection(coll)
        self._finish_migration(e.id, MigrationOutcome(True))

    @on_event.register(ev.MigrationAborted)
    def _on_MigrationAborted(self, e: ev.MigrationAborted) -> None:
        self._finish_migration(e.id, MigrationOutcome(False, e.code, e.reason))

    @on_event.register(ev.ChunkMarkedJumbo)
    def _on_ChunkMarkedJumbo(self, e: ev.ChunkMarkedJumbo) -> None:
        coll = self.collections[e.ns]
        ch = coll.chunks[coll.chunk_index(coll.pattern.encode_bound(from_ejson(e.min)))]
        ch.jumbo = True
        ch._min, ch._max = ch.min, ch.max  # parsed from the documents, which are forgotten:
        ch.min_doc = ch.max_doc = None  # stored as `doc()` writes the bounds from now on
        self._put_chunk(e.ns, ch)

    @on_event.register(ev.SettingChanged)
    def _on_SettingChanged(self, e: ev.SettingChanged) -> None:
        if e.ns is None:
            data = self.settings.model_dump()
            data.pop(e.key) if e.value is None else data.__setitem__(e.key, e.value)
            self.settings = ClusterSettings.model_validate(data)
            self._put(b"settings", self.settings.model_dump())
        else:
            coll = self.collections[e.ns]
            data = coll.settings.model_dump()
            data.pop(e.key) if e.value is None else data.__setitem__(e.key, e.value)
            coll.settings = CollectionSettings.model_validate(data)
            self._put_collection(coll)

    # ------------------------------------------------------ DDL coordinators

    @on_event.register(dd.DDLStarted)
    def _on_DDLStarted(self, e: dd.DDLStarted) -> None:
        c = self.ddl[e.id] = Coordinator.started(e)
        self._put(b"ddl/" + e.id.encode(), c.state())

    @on_event.register(dd.DDLPhaseReached)
    def _on_DDLPhaseReached(self, e: dd.DDLPhaseReached) -> None:
        c = self.ddl[e.id]
        c.phase, c.code, c.reason, c.info = Phase(e.phase), e.code, e.reason, e.info
        self._put(b"ddl/" + e.id.encode(), c.state())

    @on_event.register(dd.DDLFinished)
    def _on_DDLFinished(self, e: dd.DDLFinished) -> None:
        c = self.ddl.pop(e.id)
        self._put(b"ddl/" + e.id.encode(), None)
        out = {**c.record(), "state": "done", "phase": "done", "ok": e.ok, "code": e.code, "reason": e.reason}
        out["result"] = e.result
        self.ddl_outcomes[e.id] = out
        self._put(b"ddlout/" + e.id.encode(), out)

    # ------------------------------------------------------ indexes

    @on_event.register(dd.IndexesCreated)
    def _on_IndexesCreated(self, e: dd.IndexesCreated) -> None:
        specs = self.indexes.setdefault(e.ns, [])
        names = {s.name for s in specs}
        specs.extend(s for s in map(IndexSpec.parse, e.indexes) if s.name not in names)
        self._put_indexes(e.ns)

    @on_event.register(dd.IndexesDropped)
    def _on_IndexesDropped(self, e: dd.IndexesDropped) -> None:
        specs = [s for s in self.indexes.pop(e.ns, []) if s.name not in e.names]
        if specs:
            self.indexes[e.ns] = specs
        self._put_indexes(e.ns)

    def _forget_collection(self, ns: str) -> None:
        """`ns` gone from the catalog, sharded (with its chunks and zones) or tracked unsharded.
        Its zone ranges go too, sharded or not, as MongoDB's drop removes the namespace's tags;
        and its indexes."""
        self._forget_unsharded_zones(ns)
        if self.indexes.pop(ns, None) is not None:
            self._put_indexes(ns)
        if (coll := self.collections.pop(ns, None)) is not None:
            for ch in coll.chunks:
                self._put_chunk_key(ns, ch.min_key, None)
            for z in coll.zones:
                self._put(self._zone_key(ns, z.min_key), None)
            self._put(b"coll/" + ns.encode(), None)
        if (db := self.databases.get(ns.partition(".")[0])) is not None and ns in db.collections:
            db.collections.discard(ns)
            db.uuids.pop(ns, None)
            self._put_database(db)

    @on_event.register(dd.CollectionDropped)
    def _on_CollectionDropped(self, e: dd.CollectionDropped) -> None:
        self._changed(e.ns, e.ts)
        self._forget_collection(e.ns)

    @on_event.register(dd.DatabaseDropped)
    def _on_DatabaseDropped(self, e: dd.DatabaseDropped) -> None:
        self._changed(e.db, e.ts)
        for ns in [n for n in [*self.collections, *self.unsharded_zones, *self.indexes] if n.partition(".")[0] == e.db]:
            self._forget_collection(ns)
        if self.databases.pop(e.db, None) is not None:
            self._put(b"db/" + e.db.encode(), None)

    def _replace_collection(
        self, old: Collection, new: Collection, chunks: list[Chunk], zones: list[ZoneRange]
    ) -> None:
        """`old` becomes `new` (renamed or rekeyed): its indexes go with it."""
        indexes = self.indexes.pop(old.ns, None)
        self._put_indexes(old.ns)
        self._forget_collection(old.ns)
        if indexes is not None:
            self.indexes[new.ns] = indexes
            self._put_indexes(new.ns)
        new.replace_chunks(0, 0, chunks)
        new.zones = sorted(zones, key=lambda z: z.min_key)
        self.collections[new.ns] = new
        self._put_collection(new)
        for ch in new.chunks:
            self._put_chunk(new.ns, ch)
        for z in new.zones:
            self._put(
                self._zone_key(new.ns, z.min_key), {"min": to_ejson(z.min), "max": to_ejson(z.max), "zone": z.zone}
            )

    @on_event.register(dd.CollectionRenamed)
    def _on_CollectionRenamed(self, e: dd.CollectionRenamed) -> None:
        self._changed(e.ns, e.ts)
        self._changed(e.to, e.ts)
        self._forget_collection(e.to)  # dropTarget (the decision checked it was asked for)
        if (coll := self.collections.get(e.ns)) is not None:
            epoch = e.epoch or coll.epoch
            new = Collection(
                e.to, coll.pattern, coll.unique, epoch, coll.uuid, settings=coll.settings, history_from=e.ts or 0
            )
            chunks = [
                Chunk(
                    c.min,
                    c.max,
                    c.min_key,
                    c.max_key,
                    c.shard,
                    ChunkVersion(c.version.major, c.version.minor, epoch),
                    c.jumbo,
                )
                for c in coll.chunks
            ]
            self._replace_collection(coll, new, chunks, list(coll.zones))
            return
        db = self.databases[e.ns.partition(".")[0]]
        uuid = db.uuids.get(e.ns)
        indexes = self.indexes.pop(e.ns, None)
        self._put_indexes(e.ns)
        self._forget_collection(e.ns)
        if indexes is not None:
            self.indexes[e.to] = indexes
            self._put_indexes(e.to)
        db.collections.add(e.to)
        if uuid is not None:
            db.uuids[e.to] = uuid
        self._put_database(db)

    @on_event.register(dd.ShardKeyRefined)
    def _on_ShardKeyRefined(self, e: dd.ShardKeyRefined) -> None:
        coll = self.collections[e.ns]
        pattern = KeyPattern.parse(e.key)
        added = pattern.fields[len(coll.pattern.fields) :]
        new = Collection(e.ns, pattern, coll.unique, e.epoch, coll.uuid, settings=coll.settings, history_from=e.ts or 0)
        chunks = []
        for c in coll.chunks:
            lo, hi = extend_bound(c.min, added), extend_bound(c.max, added)
            version = ChunkVersion(c.version.major, c.version.minor, e.epoch)
            chunks.append(Chunk(lo, hi, pattern.encode_bound(lo), pattern.encode_bound(hi), c.shard, version, c.jumbo))
        zones = []
        for z in coll.zones:
            lo, hi = extend_bound(z.min, added), extend_bound(z.max, added)
            zones.append(ZoneRange(lo, hi, pattern.encode_bound(lo), pattern.encode_bound(hi), z.zone))
        self._replace_collection(coll, new, chunks, zones)

    # --------------------------------------------------------------- views

    def iter_chunks(self, ns: str) -> Iterator[Chunk]:
        yield from self.collections[ns].chunks


_EVENT_HANDLERS = on_event.table
_TOPOLOGY_EVENTS = frozenset({ev.ShardAdded, ev.ShardRemoved})
