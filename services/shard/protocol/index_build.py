"""A secondary index on this shard: its build (MongoDB's hybrid build, without a side table)
and its removal, as an enumerated state machine; the writes' side (unique keys, multikey).

An index's state is its latest `IndexRecorded` (services/shard/documents.py folds it and keeps
the entries).  The shard's command processor serializes writes and build steps, so a build
never blocks writes: every write decided after the build began keeps the index right itself
(its entries go in the same batch as the document), and the steps index the documents that
were there before, in key order, `limit` at a time.  The last step is the short exclusive
one: it indexes what is left and, for a unique index, rechecks the keys that two documents may
hold.  Those are found as they arise, as MongoDB's duplicate-key tracker does: each step looks
up each key it indexes (one seek), and so does each write while the index builds; a write is
never refused for a key a building index has twice (the other document may go before the end).

    request          expects                          leaves
    BuildIndexes     (no index `name`)                building (scannedTo "", total: the
                                                      documents now); ready at once if there
                                                      are none
                     building, same index             as it was ("joined": the build goes on)
                     ready, same index                as it was ("all indexes already exist")
                     failed, same index               building again (a new build, this buildId)
                     another index of that name, or   refused, nothing recorded
                     that index under another name    (IndexKeySpecsConflict / IndexOptionsConflict)
    IndexBuildStep   building (this buildId)          building, scannedTo the last of the next
                                                      `limit` documents; or, when fewer are
                                                      left: ready, or failed with the error
                                                      (DuplicateKey 11000 for a unique index
                                                      with two documents under one key, or a
                                                      document it cannot index, e.g.
                                                      CannotIndexParallelArrays 171)
                     anything else                    as it was (the step of a build that is
                                                      over, dropped or replaced: nothing)
    DropIndexes      any state                        (removed): IndexRemoved and a tombstone;
                                                      `_id_` is refused (InvalidOptions 72), so
                                                      is the shard key's (CannotDropShardKeyIndex)
                     (no index `name`)                IndexNotFound (27), unless missingOk
    ListIndexes      (read-only)                      the implicit indexes, then each index with
                                                      its state and progress
    a write          building or ready                multikey once a document made it so;
                                                      a ready unique index refuses a second
                                                      `_id` under a key (DuplicateKey); a
                                                      building one notes the key (dupPrefixes)

`failed` keeps no entries (the fold deletes them): no half index.  The DDL coordinator rolls
a failed build back with DropIndexes(missingOk) on every shard.  The driver
(services/shard/indexes.py) sends the steps, and after a restart resumes every build still
`building` from its `scannedTo`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, Protocol

from domain.catalog import Catalog
from domain.indexes import (
    ID_INDEX,
    ID_INDEX_NAME,
    IndexSpec,
    check_new,
    check_unique_with_shard_key,
    duplicate_key_error,
    entries,
    key_prefix,
)
from domain.protocol import ErrorCode
from domain.shardkey import ShardKeyError, encode_value, shell_form
from libs.errors import CommandError
from schemas import Record, Tombstone
from schemas import indexes as ix
from services.shard.documents import index_changelog_key
from services.shard.protocol.common import Step

Doc = dict[str, Any]

DEFAULT_STEP_LIMIT = 1000  # documents per IndexBuildStep (SHARDLOG_INDEX_BUILD_BATCH)
# Keys a unique build remembers to recheck; past this, its last step checks the whole index
# (a build over data full of duplicates fails anyway, so the slow path is the rare one).
MAX_DUP_CANDIDATES = 1000


class IndexState(StrEnum):
    BUILDING = "building"  # writes keep it; steps index the documents that were there before
    READY = "ready"  # every document is in it; unique keys are enforced by writes
    FAILED = "failed"  # a step found a duplicate or a document it cannot index: no entries


class IndexDocuments(Protocol):
    """What these transitions read of the shard's documents (services.shard.documents)."""

    @property
    def indexes(self) -> Mapping[str, Mapping[str, Any]]: ...  # ns -> name -> documents.Index

    def scan(self, ns: str, lo: bytes = b"", hi: bytes | None = None) -> Iterator[tuple[bytes, Doc]]: ...

    def count_documents(self, ns: str) -> int: ...

    def scan_index(
        self, ns: str, name: str, lo: bytes = b"", hi: bytes | None = None, reverse: bool = False
    ) -> Iterator[tuple[bytes, tuple[Any, ...], Any]]: ...

    def index_duplicate(self, ns: str, spec: IndexSpec, key: tuple[Any, ...], doc_id: Any) -> bool: ...

    def index_holders(self, ns: str, name: str, prefix: bytes) -> dict[bytes, tuple[Any, ...]]: ...


def _error(e: CommandError) -> dict[str, Any]:
    """A failed build's error as recorded and answered: `{"code": "DuplicateKey", "errmsg": ...,
    "keyPattern": ..., "keyValue": ...}` (a CommandError's code, message and info)."""
    return {"code": str(e.code), "errmsg": e.message, **(e.info or {})}


def error_of(error: Mapping[str, Any]) -> CommandError:
    """The CommandError a failed build recorded (the DDL coordinator answers the client with it)."""
    info = {k: v for k, v in error.items() if k not in ("code", "errmsg")}
    return CommandError(error.get("code", ErrorCode.CannotCreateIndex), str(error.get("errmsg", "")), info or None)


def state_of(record: ix.IndexRecorded) -> IndexState:
    return IndexState(record.state)


def shard_key_index(catalog: Catalog, ns: str) -> IndexSpec | None:
    """The implicit index of a sharded collection's shard key (None: unsharded)."""
    coll = catalog.collections.get(ns)
    if coll is None:
        return None
    key = tuple(coll.pattern.spec.items())
    name = "_".join(f"{f}_{d}" for f, d in key)
    # A hashed field's direction is "hashed": never equal to an ascending or descending spec.
    return IndexSpec.make(name, key, unique=coll.unique)  # type: ignore[arg-type]


def implicit_indexes(catalog: Catalog, ns: str) -> list[IndexSpec]:
    """`_id_`, and the shard key's index of a sharded collection: listed, never stored."""
    skey = shard_key_index(catalog, ns)
    return [ID_INDEX] if skey is None or skey.key == ID_INDEX.key else [ID_INDEX, skey]


def _records(documents: IndexDocuments, ns: str) -> dict[str, ix.IndexRecorded]:
    return {name: index.record for name, index in documents.indexes.get(ns, {}).items()}


def _spec(record: ix.IndexRecorded) -> IndexSpec:
    return IndexSpec.parse(record.spec)


# ------------------------------------------------------------------ BuildIndexes


def build_indexes(catalog: Catalog, documents: IndexDocuments, req: ix.BuildIndexes) -> Step:
    """Record each requested index as building (or ready for an empty collection), joining a
    build of the same index; refuse the whole request if any one conflicts."""
    specs = [IndexSpec.parse(raw) for raw in req.indexes]
    if not specs:
        raise CommandError(ErrorCode.BadValue, "Must specify at least one index")
    shard_key = dict(req.shardKey) if req.shardKey is not None else None
    if shard_key is None and (coll := catalog.collections.get(req.ns)) is not None:
        shard_key = dict(coll.pattern.spec)
    records = _records(documents, req.ns)
    before = len(implicit_indexes(catalog, req.ns)) + sum(1 for r in records.values() if r.state != "failed")
    events: list[Record] = []
    replies: list[dict[str, Any]] = []
    total: int | None = None
    seen: list[IndexSpec] = []
    for spec in specs:
        check_unique_with_shard_key(spec, shard_key)
        existing = [*implicit_indexes(catalog, req.ns), *(_spec(r) for r in records.values()), *seen]
        if check_new(existing, spec):
            record = records.get(spec.name)
            if record is not None and state_of(record) is IndexState.FAILED:
                pass  # built again below
            else:
                now = record.state if record is not None else IndexState.READY.value
                replies.append({"name": spec.name, "state": now, "joined": record is not None and now == "building"})
                continue
        if total is None:
            total = documents.count_documents(req.ns)
        begins = IndexState.READY if total == 0 else IndexState.BUILDING
        events.append(
            ix.IndexRecorded(ns=req.ns, spec=spec.to_mongo(), state=begins.value, buildId=req.buildId, total=total)
        )
        replies.append({"name": spec.name, "state": begins.value, "joined": False})
        seen.append(spec)
    after = before + len(seen)
    reply: dict[str, Any] = {"ns": req.ns, "indexes": replies, "numIndexesBefore": before, "numIndexesAfter": after}
    if not events:
        reply["note"] = "all indexes already exist"
    return Step(events, reply, "index.build_recorded" if events else None)


# ----------------------------------------------------------------- IndexBuildStep


def build_step(documents: IndexDocuments, req: ix.IndexBuildStep) -> Step:
    """Index the next `limit` documents after `scannedTo`; the last step checks the unique
    keys and records the index ready, or failed."""
    index = documents.indexes.get(req.ns, {}).get(req.name)
    record: ix.IndexRecorded | None = index.record if index is not None else None
    if record is None or state_of(record) is not IndexState.BUILDING or record.buildId != req.buildId:
        state = record.state if record is not None else "removed"
        return Step([], {"ns": req.ns, "name": req.name, "state": state, "done": True})
    spec = _spec(record)
    after = bytes.fromhex(record.scannedTo) if record.scannedTo else None
    taken: list[tuple[bytes, Doc]] = []
    for k, doc in documents.scan(req.ns, after or b""):
        if after is not None and k == after:
            continue
        taken.append((k, doc))
        if len(taken) >= req.limit:
            break
    multikey = record.multikey
    pending: dict[bytes, tuple[Any, ...]] = {}  # the last step's own entries, not in the store yet
    # A unique index: this step's keys (prefix -> encoded _id -> key), and the keys to recheck.
    batch: dict[bytes, dict[bytes, tuple[Any, ...]]] = {}
    candidates = _Candidates(record)
    last = len(taken) < req.limit
    for _, doc in taken:
        try:
            found, made_multikey = entries(spec, doc)
        except (CommandError, ShardKeyError) as e:
            error = e if isinstance(e, CommandError) else CommandError(ErrorCode.CannotCreateIndex, str(e))
            message = (
                f"Index build failed: {spec.name}: document {{ _id: {shell_form(doc.get('_id'))} }}: {error.message}"
            )
            return _failed(record, CommandError(error.code, message, error.info))
        multikey = multikey or made_multikey
        if last:
            pending.update({entry: (*key, doc["_id"]) for entry, key in found.items()})
        if spec.unique:
            mine = encode_value(doc["_id"])
            for key in found.values():
                prefix = key_prefix(spec, key)
                held = batch.setdefault(prefix, {})
                held[mine] = key
                if len(held) > 1 or documents.index_duplicate(req.ns, spec, key, doc["_id"]):
                    candidates.add(prefix)
    scanned = record.scanned + len(taken)
    progress = {"ns": req.ns, "name": req.name, "scanned": scanned, "total": record.total}
    if not last:
        step = record.model_copy(
            update={"scannedTo": taken[-1][0].hex(), "scanned": scanned, "multikey": multikey, **candidates.fields()}
        )
        return Step([step], {**progress, "state": IndexState.BUILDING.value, "done": False}, "index.build_step")
    if spec.unique:
        if candidates.overflow:
            dup = first_duplicate(documents, req.ns, spec, pending)
        else:
            dup = recheck(documents, req.ns, spec, candidates.prefixes, batch)
        if dup is not None:
            return _failed(record, duplicate_key_error(req.ns, spec, dup))
    ready = record.model_copy(
        update={
            "state": IndexState.READY.value,
            "scannedTo": taken[-1][0].hex() if taken else record.scannedTo,
            "scanned": scanned,
            "multikey": multikey,
            "dupPrefixes": [],
            "dupOverflow": False,
        }
    )
    return Step([ready], {**progress, "state": IndexState.READY.value, "done": True}, "index.build_ready")


class _Candidates:
    """The keys a unique build must recheck at its end: an ordered set of key prefixes that
    gives up listing (overflow) past MAX_DUP_CANDIDATES."""

    def __init__(self, record: ix.IndexRecorded):
        self.overflow = record.dupOverflow
        self._hex: dict[str, None] = dict.fromkeys(record.dupPrefixes)
        self.changed = False

    def add(self, prefix: bytes) -> None:
        if self.overflow or (h := prefix.hex()) in self._hex:
            return
        self.changed = True
        if len(self._hex) >= MAX_DUP_CANDIDATES:
            self.overflow, self._hex = True, {}
        else:
            self._hex[h] = None

    @property
    def prefixes(self) -> list[bytes]:
        return sorted(bytes.fromhex(h) for h in self._hex)

    def fields(self) -> dict[str, Any]:
        return {"dupPrefixes": list(self._hex), "dupOverflow": self.overflow}


def recheck(
    documents: IndexDocuments,
    ns: str,
    spec: IndexSpec,
    prefixes: list[bytes],
    batch: Mapping[bytes, Mapping[bytes, tuple[Any, ...]]],
) -> tuple[Any, ...] | None:
    """The first of `prefixes` (in index order) that two documents hold now: the stored
    entries under it plus the last step's own (`batch`), one seek each."""
    for prefix in prefixes:
        holders = {**documents.index_holders(ns, spec.name, prefix), **batch.get(prefix, {})}
        if len(holders) > 1:
            return next(iter(holders.values()))
    return None


def _failed(record: ix.IndexRecorded, error: CommandError) -> Step:
    failed = record.model_copy(update={"state": IndexState.FAILED.value, "error": _error(error)})
    reply = {
        "ns": record.ns,
        "name": _spec(record).name,
        "state": IndexState.FAILED.value,
        "done": True,
        "error": _error(error),
    }
    return Step([failed], reply, "index.build_failed")


def first_duplicate(
    documents: IndexDocuments, ns: str, spec: IndexSpec, pending: Mapping[bytes, tuple[Any, ...]]
) -> tuple[Any, ...] | None:
    """The first key (in index order) that two documents hold in `spec`: the stored entries
    and `pending` ones (entry -> key values then _id), merged in entry order."""
    stored = ((entry, key) for entry, key, _ in documents.scan_index(ns, spec.name))
    extra = ((entry, value[:-1]) for entry, value in sorted(pending.items()))
    previous_entry: bytes | None = None
    previous_prefix: bytes | None = None
    for entry, key in heapq.merge(stored, extra, key=lambda t: t[0]):
        if entry == previous_entry:
            continue  # the same entry, stored and pending
        prefix = key_prefix(spec, tuple(key))
        if prefix == previous_prefix:
            return tuple(key)
        previous_entry, previous_prefix = entry, prefix
    return None


# ------------------------------------------------------------------ DropIndexes


def drop_indexes(catalog: Catalog, documents: IndexDocuments, req: ix.DropIndexes) -> Step:
    records = _records(documents, req.ns)
    skey = shard_key_index(catalog, req.ns)
    names = sorted(records) if req.names == ["*"] else list(req.names)
    for name in names:
        if name == ID_INDEX_NAME:
            raise CommandError(ErrorCode.InvalidOptions, "cannot drop _id index")
        if skey is not None and name == skey.name and name not in records:
            raise CommandError(
                ErrorCode.CannotDropShardKeyIndex,
                f"cannot drop index {name!r}: it is the shard key's index of {req.ns}",
            )
        if name not in records and not req.missingOk:
            raise CommandError(ErrorCode.IndexNotFound, f"index not found with name [{name}]")
    events: list[Record] = []
    dropped: list[str] = []
    for name in names:
        if name in records:
            events += [ix.IndexRemoved(ns=req.ns, name=name), Tombstone(key=index_changelog_key(req.ns, name))]
            dropped.append(name)
    reply = {"ns": req.ns, "dropped": dropped, "nIndexesWas": len(implicit_indexes(catalog, req.ns)) + len(records)}
    return Step(events, reply, "index.dropped" if events else None)


# ------------------------------------------------------------------ ListIndexes


def list_indexes(catalog: Catalog, documents: IndexDocuments, req: ix.ListIndexes) -> dict[str, Any]:
    out: list[dict[str, Any]] = [
        {"spec": spec.to_mongo(), "state": IndexState.READY.value, "implicit": True}
        for spec in implicit_indexes(catalog, req.ns)
    ]
    for name in sorted(documents.indexes.get(req.ns, {})):
        r = documents.indexes[req.ns][name].record
        item: dict[str, Any] = {
            "spec": dict(r.spec),
            "state": r.state,
            "buildId": r.buildId,
            "scanned": r.scanned,
            "total": r.total,
            "multikey": r.multikey,
        }
        if r.error is not None:
            item["error"] = dict(r.error)
        out.append(item)
    return {"ns": req.ns, "indexes": out}


# ------------------------------------------------------------------ writes


def check_write(
    documents: IndexDocuments, ns: str, doc: Doc, seen: set[bytes], records: dict[tuple[str, str], Any]
) -> None:
    """Refuse a write of `doc` to `ns` that an index cannot take: a document it cannot index
    (e.g. CannotIndexParallelArrays), or, for a ready unique index, a key another document
    holds, here or earlier in the same request (`seen`, updated).  A building unique index
    notes such a key for its last step instead.  The index records a write changes (multikey,
    noted keys) are put in `records` (by (ns, name)), to record with the write."""
    named = documents.indexes.get(ns, {})
    for name, index in named.items():
        record: ix.IndexRecorded = index.record
        state = state_of(record)
        if state is IndexState.FAILED:
            continue
        spec: IndexSpec = index.spec
        try:
            found, made_multikey = entries(spec, doc)
        except ShardKeyError as e:
            raise CommandError(ErrorCode.CannotCreateIndex, f"cannot index {spec.name}: {e}") from None
        changed = records.get((ns, name), record)
        if made_multikey and not changed.multikey:
            changed = changed.model_copy(update={"multikey": True})
        if spec.unique:
            keys = {key_prefix(spec, k): k for k in found.values()}
            marks = {prefix: b"u/" + name.encode() + b"\x00" + prefix for prefix in keys}
            held = [
                p for p, k in keys.items() if marks[p] in seen or documents.index_duplicate(ns, spec, k, doc["_id"])
            ]
            if held and state is IndexState.READY:
                raise duplicate_key_error(ns, spec, keys[held[0]])
            if held:  # building: its last step rechecks these keys
                candidates = _Candidates(changed)
                for prefix in held:
                    candidates.add(prefix)
                if candidates.changed:
                    changed = changed.model_copy(update=candidates.fields())
            seen.update(marks.values())
        if changed is not record:
            records[(ns, name)] = changed


def missing_indexes(
    indexes: Mapping[str, Mapping[str, Any]], ns: str, wanted: list[Doc], build_id: str
) -> list[Record]:
    """The indexes of `wanted` (a donor's, listIndexes form) that this shard lacks, recorded
    ready: a migration's recipient has them before it clones (seed 000 step 3).  The fold
    indexes the documents it already holds of `ns` (normally none: a shard that owns chunks of
    `ns` got the index when it was created).  `indexes`: the shard's, ns -> name -> Index."""
    records = {name: index.record for name, index in indexes.get(ns, {}).items()}
    events: list[Record] = []
    for raw in wanted:
        spec = IndexSpec.parse(raw)
        if spec.name == ID_INDEX_NAME:
            continue
        record = records.get(spec.name)
        if record is not None and state_of(record) is not IndexState.FAILED:
            continue  # building or ready here already
        events.append(ix.IndexRecorded(ns=ns, spec=spec.to_mongo(), state=IndexState.READY.value, buildId=build_id))
    return events


def ready_specs(indexes: Mapping[str, Mapping[str, Any]], ns: str) -> list[Doc]:
    """The ready indexes of `ns` here (`indexes`: ns -> name -> Index), listIndexes form:
    what a donor tells its recipient."""
    return [dict(i.record.spec) for _, i in sorted(indexes.get(ns, {}).items()) if i.record.state == "ready"]
