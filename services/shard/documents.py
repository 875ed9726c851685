"""A shard's documents: the fold of its changelog, laid out in RocksDB for
ordered range scans by (collection, shard-key value, _id), with an index to
find a document by _id.

    d/<ns>\\0<shard key><_id>  -> the document (relaxed Extended JSON: decision 0016)
    i/<ns>\\0<_id>             -> its shard key (to find it by _id)
    k/<ns>\\0<index>\\0<entry>  -> a secondary index's entry (domain.indexes.entry_key): the
                                 entry's key values then its _id, in record form
    n/<ns>\\0<index>           -> the index's latest IndexRecorded (spec, state, build progress)
    x/<lsid>/<txnNumber>/<part> -> a transactions-table record (retryable writes apply once)
    m/<migration id>          -> this shard's migration document (donor or recipient)
    t/<migration id>          -> a range-deletion task
    c/<ddl id>                -> a DDL coordinator's critical section on this shard
    r/<ddl id>\\0<ns or db>    -> a DropLocalData done for that DDL (a retry drops nothing again)
    \x00meta/clock            -> the largest ClusterTime stamped on a write (the clock resumes there)
    h/..., w/..., \x00meta/history/...  -> what each write replaced, for reads at a past cluster
                                 time (services/shard/history.py, docs/decisions/0019)

Migration documents, range-deletion tasks, DDL critical sections and drops, and the
transactions table (one entry per live session, its latest txnNumber's records) are also
kept in memory.

A dropped collection (LocalDataDropped) is deleted as ranges of keys, `d/<ns>\\0...`,
`i/<ns>\\0...`, `k/<ns>\\0...` and `n/<ns>\\0...` (for a database, every `d/<db>.` ... key): its pending writes leave
the overlay, the ranges stay pending until the batch commits, where they are deleted before
the batch's writes (`drain_range_deletions`, `Store.commit`), and reads meanwhile skip them.

Shard keys and _ids are `domain.shardkey` order-preserving encodings, so a
chunk [min, max) is one contiguous key range.  Writes decided in the current
batch sit in an overlay until the batch commits; reads see them.

**Secondary indexes (issue 15).**  An index is state of this fold: its latest
`IndexRecorded` (kept under `n/`, and in memory in `indexes`) and its entries (`k/`).  Entries
are never changelog records: every DocumentWritten / DocumentRemoved of a namespace with an
index that is building or ready replaces the old document's entries with the new one's in the
same batch, whatever decided it (a client's write, a migration's clone or catch-up, a range
deletion, a rename, a refine).  Folding an `IndexRecorded`:

    building, scannedTo K   index the existing documents up to K (after the previous
                            record's scannedTo, if it is this build's; else from the start)
    ready                   index the documents after the build's last scannedTo (a replay of
                            a compacted log, with no building record before it: all of them)
    failed                  delete every entry (no half index)

and `IndexRemoved` deletes the entries and the state.  Entry puts are idempotent, so replay
of the compacted changelog rebuilds the same entries as the live fold wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from domain.bsonvalues import from_record, to_record
from domain.clock import VectorClock
from domain.indexes import IndexSpec, entries, key_prefix
from domain.shardkey import ShardKeyError, encode_value
from libs.dispatch import Dispatch
from libs.errors import CommandError
from libs.store import META, Store
from schemas import Record, Tombstone
from schemas import ddl as dd
from schemas import indexes as ix
from schemas import shard as ev
from services.shard import history

DOCS, IDS, SESSIONS, MIGRATIONS, TASKS = b"d/", b"i/", b"x/", b"m/", b"t/"
SECTIONS, DROPS = b"c/", b"r/"
TXNS = b"y/"  # multi-document transactions (decisions/0020): y/<lsid> -> TxnRecorded
COORDINATORS = b"z/"  # two-phase commits coordinated here: z/<lsid>/<txnNumber> -> TxnCoordinatorRecorded
XACT_KEY, COORD_KEY = b"xact/", b"coord/"  # changelog keys of those: <prefix><lsid>
INDEX_ENTRIES, INDEX_STATES = b"k/", b"n/"
INDEX_KEY = b"idx/"  # changelog keys of index states: idx/<ns>\0<name>
TXN_KEY = b"txn/"  # changelog keys of transactions-table records: txn/<lsid>/<txnNumber>/<part>
# Documents of unsharded collections are ordered by _id alone, under a prefix below every
# encoded shard key (tags start at 0x10): a collection sharded later finds them there.
UNSHARDED_KEY, UNSHARDED_END = b"\x00", b"\x01"
CLOCK = META + b"clock"


def encode_doc(doc: dict[str, Any]) -> bytes:
    """A document as stored: its record form, compact (a plain JSON document is its own JSON,
    as stores written before BSON types hold it)."""
    return json.dumps(to_record(doc), separators=(",", ":")).encode()


def decode_doc(raw: bytes) -> dict[str, Any]:
    """The document a stored value holds, its BSON values back."""
    doc: dict[str, Any] = from_record(json.loads(raw))
    return doc


def shard_key_part(key: bytes, doc: dict) -> bytes:
    """The shard-key part of a document's key as `scan` yields it (shard key + _id)."""
    return key[: len(key) - len(encode_value(doc["_id"]))]


def ns_prefix(ns: str) -> bytes:
    return ns.encode() + b"\x00"


def doc_key(ns: str, skey: bytes, id_enc: bytes) -> bytes:
    return DOCS + ns_prefix(ns) + skey + id_enc


def coordinator_key(lsid: str, txn_number: int) -> bytes:
    """The changelog key of a two-phase commit's coordinator (a tombstone removes it when done)."""
    return COORD_KEY + f"{lsid}/{txn_number}".encode()


def id_key(ns: str, id_enc: bytes) -> bytes:
    return IDS + ns_prefix(ns) + id_enc


def dropped_target(event: dd.LocalDataDropped) -> str:
    """What a LocalDataDropped dropped: a namespace, or a database (whose name has no dot)."""
    return event.ns if event.ns is not None else event.db or ""


def dropped_ranges(ns: str | None = None, db: str | None = None) -> list[tuple[bytes, bytes]]:
    """The [start, stop) key ranges holding the documents (their _id index, their secondary
    indexes' entries and states) of `ns`, or of every collection of `db`."""
    name = ns_prefix(ns) if ns is not None else f"{db}.".encode()
    return [(p + name, _after_prefix(p + name)) for p in (DOCS, IDS, INDEX_ENTRIES, INDEX_STATES)]


def index_base(ns: str, name: str) -> bytes:
    """The prefix of every entry of index `name` of `ns`."""
    return INDEX_ENTRIES + ns_prefix(ns) + name.encode() + b"\x00"


def index_state_key(ns: str, name: str) -> bytes:
    return INDEX_STATES + ns_prefix(ns) + name.encode()


def index_changelog_key(ns: str, name: str) -> bytes:
    """The changelog key of an index's state (what its removal's tombstone names)."""
    return INDEX_KEY + ns_prefix(ns) + name.encode()


def encode_entry_value(key: tuple[Any, ...], doc_id: Any) -> bytes:
    return json.dumps(to_record([*key, doc_id]), separators=(",", ":")).encode()


def decode_entry_value(raw: bytes) -> tuple[tuple[Any, ...], Any]:
    """(key values, _id) of a stored entry."""
    values = from_record(json.loads(raw))
    return tuple(values[:-1]), values[-1]


@dataclass(frozen=True)
class Index:
    """A secondary index of a namespace on this shard: its latest record and its spec."""

    record: ix.IndexRecorded
    spec: IndexSpec

    @property
    def state(self) -> str:
        return self.record.state

    @property
    def maintained(self) -> bool:
        """Writes keep its entries: it is building or ready."""
        return self.record.state in ("building", "ready")

    @classmethod
    def of(cls, record: ix.IndexRecorded) -> Index:
        return cls(record, IndexSpec.parse(record.spec))


def document_entries(spec: IndexSpec, doc: dict[str, Any] | None) -> dict[bytes, tuple[Any, ...]]:
    """The entries `doc` puts into `spec` (none for no document, or one that cannot be indexed:
    a write of one is refused when decided, so only a log written otherwise holds it)."""
    if doc is None:
        return {}
    try:
        return entries(spec, doc)[0]
    except (CommandError, ShardKeyError):
        return {}


def record_suffix(lsid: str, txn_number: int, part: str) -> bytes:
    return f"{lsid}/{txn_number}/{part}".encode()


def record_key(lsid: str, txn_number: int, part: str) -> bytes:
    """The changelog key of a transactions-table record (what its tombstone names)."""
    return TXN_KEY + record_suffix(lsid, txn_number, part)


@dataclass(frozen=True)
class SessionEntry:
    """One session's entry in the transactions table: its latest txnNumber and that
    txnNumber's records on this shard, by part.  Replaced, never changed in place."""

    lsid: str
    txn_number: int
    records: dict[str, ev.RetryableWriteRecorded] = field(default_factory=dict)

    @property
    def last_write_at(self) -> float:
        return max((r.lastWriteAt for r in self.records.values()), default=0.0)

    def executed(self) -> dict[int, ev.Statement]:
        """The statements executed under txn_number, by id.  A statement recorded twice (an update
        tried here and matching nothing, then its matching record migrated in) is the one that
        wrote a document."""
        out: dict[int, ev.Statement] = {}
        for part in sorted(self.records):
            for st in self.records[part].statements:
                if st.stmtId not in out or (out[st.stmtId].skey is None and st.skey is not None):
                    out[st.stmtId] = st
        return out


def document_changelog_key(ns: str, id_enc: bytes) -> bytes:
    """The changelog key of a document's DocumentWritten / DocumentRemoved records."""
    return b"doc/" + ns_prefix(ns) + id_enc


def changelog_key(event: Record) -> bytes | None:
    """Kafka key of a changelog record: compaction keeps the latest per document / session record."""
    if isinstance(event, (ev.DocumentWritten, ev.DocumentRemoved)):
        doc_id = event.doc["_id"] if isinstance(event, ev.DocumentWritten) else event.id
        return document_changelog_key(event.ns, encode_value(doc_id))
    if isinstance(event, ev.RetryableWriteRecorded):
        return record_key(event.lsid, event.txnNumber, event.part)
    if isinstance(event, Tombstone):
        return event.key
    if isinstance(event, (ev.MigrationRecorded, ev.MigrationForgotten)):
        return b"mig/" + event.id.encode()
    if isinstance(event, (ev.RangeDeletionRecorded, ev.RangeDeletionRemoved)):
        return b"rdel/" + event.id.encode()
    if isinstance(event, (dd.DDLCriticalSectionRecorded, dd.DDLCriticalSectionRemoved)):
        return b"ddlcs/" + event.id.encode()
    if isinstance(event, ix.IndexRecorded):
        return index_changelog_key(event.ns, IndexSpec.parse(event.spec).name)
    if isinstance(event, ix.IndexRemoved):
        return index_changelog_key(event.ns, event.name)
    if isinstance(event, ev.TxnRecorded):
        return XACT_KEY + event.lsid.encode()
    if isinstance(event, ev.TxnCoordinatorRecorded):
        return coordinator_key(event.lsid, event.txnNumber)
    if isinstance(event, ev.NoopWritten):
        return b"noop"  # each one stamped later than the last: compaction keeps the latest
    if isinstance(event, dd.LocalDataDropped):
        # One key per drop, never written again: compaction keeps it after the documents it deletes.
        return b"drop/" + event.id.encode() + b"/" + dropped_target(event).encode()
    return None


# A stored document, undecoded: (encoded shard key, encoded _id, stored value).  What a
# migration's bulk clone carries from the donor's store to the recipient's (`apply_bulk`).
StoredDocument = tuple[bytes, bytes, bytes]


def namespace_json(ns: str) -> bytes:
    """A namespace as a JSON string, as `written_record` takes it (once per clone batch)."""
    return json.dumps(ns, ensure_ascii=False).encode()


def written_record(ns_json: bytes, skey: bytes, raw: bytes, ts: int | None) -> bytes:
    """A DocumentWritten record spliced from a stored document's bytes, without a Record or a
    decode: the JSON `Codec.encode(DocumentWritten(ts, ns, skey.hex(), decode_doc(raw)))`
    decodes as (the stored value is the document's record form, as the record's `doc`).
    `ns_json` is `namespace_json(ns)`."""
    stamp = b"null" if ts is None else str(ts).encode()
    return b'{"type":"DocumentWritten","v":1,"ts":%b,"ns":%b,"skey":"%b","doc":%b}' % (
        stamp,
        ns_json,
        skey.hex().encode(),
        raw,
    )


class ClonedDocuments:
    """A bulk clone batch's documents as the changelog records them (`libs.commands.BulkEvents`):
    one DocumentWritten each, spliced from the stored bytes (`written_record`) and folded by
    `apply_bulk`.  The statistics' bytes written do not count them (only `apply` counts):
    a migration moves data, it writes none, and its count would grow with the range."""

    kind = "DocumentWritten"

    def __init__(self, documents: ShardDocuments, ns: str, docs: list[StoredDocument]):
        self.documents, self.ns, self.docs = documents, ns, docs
        self._ticks: list[int] | None = None

    def __len__(self) -> int:
        return len(self.docs)

    def encode(self, ticks: list[int] | None) -> tuple[list[bytes], list[bytes]]:
        ns_json, key_base = namespace_json(self.ns), document_changelog_key(self.ns, b"")
        stamps: list[int] | list[None] = ticks if ticks is not None else [None] * len(self.docs)
        self._ticks = ticks or None
        keys = [key_base + id_enc for _, id_enc, _ in self.docs]
        values = [written_record(ns_json, skey, raw, ts) for (skey, _, raw), ts in zip(self.docs, stamps)]
        return keys, values

    def apply(self) -> None:
        self.documents.apply_bulk(self.ns, self.docs, self._ticks)


# The fold of the changelog: one handler per event type.
on_event: Dispatch[ShardDocuments, None] = Dispatch("shard changelog event")


class ShardDocuments:
    def __init__(self) -> None:
        self.store: Store | None = None
        self._changes: dict[bytes, bytes | None] = {}
        self.migrations: dict[str, ev.MigrationRecorded] = {}
        self.range_tasks: dict[str, ev.RangeDeletionRecorded] = {}
        self.sessions: dict[str, SessionEntry] = {}  # the transactions table, by lsid
        self.ddl_sections: dict[str, dd.DDLCriticalSectionRecorded] = {}  # by DDL id
        self.ddl_drops: dict[str, frozenset[str]] = {}  # DDL id -> the namespaces and databases it dropped here
        self._range_deletions: list[tuple[bytes, bytes]] = []  # pending, for the open batch
        self.indexes: dict[str, dict[str, Index]] = {}  # secondary indexes: ns -> name -> index
        self.clock: VectorClock | None = None  # advanced by every stamp folded (docs/decisions/0014)
        # Whether writes keep what they replace for reads at a past time (decisions/0019): the
        # shard server asks its catalog (minSnapshotHistoryWindowInSeconds > 0).
        self.keeps_history: Callable[[], bool] = lambda: True
        self.max_ts = 0  # the largest stamp folded, persisted with the fold
        # Multi-document transactions (decisions/0020): the latest record of each session's, and
        # the documents (id keys) its open transaction holds, by the session holding them.
        self.txns: dict[str, ev.TxnRecorded] = {}
        self.txn_locks: dict[bytes, str] = {}
        self.prepared: dict[str, ev.TxnRecorded] = {}  # the prepared ones (reads meeting them wait)
        # two-phase commits led here, until done: (lsid, txnNumber) -> record
        self.coordinators: dict[tuple[str, int], ev.TxnCoordinatorRecorded] = {}
        self.on_coordinator: Callable[[], None] = lambda: None  # wakes the coordinator's driver

    # ------------------------------------------------------------ State protocol

    def load(self, store: Store) -> None:
        self.store = store
        self._changes = {}
        self.max_ts = int(raw) if (raw := store.get(CLOCK)) is not None else 0
        if self.clock is not None:
            self.clock.advance(self.max_ts)
        self.migrations = {
            k[2:].decode(): ev.MigrationRecorded.model_validate_json(v) for k, v in store.scan(MIGRATIONS)
        }
        self.range_tasks = {
            k[2:].decode(): ev.RangeDeletionRecorded.model_validate_json(v) for k, v in store.scan(TASKS)
        }
        self.sessions = {}
        for _, v in store.scan(SESSIONS):
            self._remember(ev.RetryableWriteRecorded.model_validate_json(v))
        self.ddl_sections = {
            k[len(SECTIONS) :].decode(): dd.DDLCriticalSectionRecorded.model_validate_json(v)
            for k, v in store.scan(SECTIONS)
        }
        drops: dict[str, set[str]] = {}
        for k, _ in store.scan(DROPS):
            ddl_id, _, target = k[len(DROPS) :].decode().partition("\0")
            drops.setdefault(ddl_id, set()).add(target)
        self.ddl_drops = {ddl_id: frozenset(targets) for ddl_id, targets in drops.items()}
        self.indexes = {}
        for _, v in store.scan(INDEX_STATES):
            index = Index.of(ix.IndexRecorded.model_validate_json(v))
            self.indexes.setdefault(index.record.ns, {})[index.spec.name] = index
        self.txns, self.txn_locks, self.prepared = {}, {}, {}
        for _, v in store.scan(TXNS):
            self._hold(ev.TxnRecorded.model_validate_json(v))
        self.coordinators = {
            (r.lsid, r.txnNumber): r
            for r in (ev.TxnCoordinatorRecorded.model_validate_json(v) for _, v in store.scan(COORDINATORS))
        }
        self._range_deletions = []

    def tentative(self):
        """The batch's pending state as it is, to `restore` if a tentative apply is abandoned."""
        return (
            dict(self._changes),
            dict(self.migrations),
            dict(self.range_tasks),
            dict(self.sessions),
            dict(self.ddl_sections),
            dict(self.ddl_drops),
            list(self._range_deletions),
            {ns: dict(named) for ns, named in self.indexes.items()},
            (dict(self.txns), dict(self.txn_locks), dict(self.prepared), dict(self.coordinators)),
        )

    def restore(self, saved) -> None:
        changes, migrations, tasks, sessions, sections, drops, deletions, indexes, txns = saved
        self.txns, self.txn_locks, self.prepared, self.coordinators = txns
        self._changes, self.migrations, self.range_tasks, self.sessions = changes, migrations, tasks, sessions
        self.ddl_sections, self.ddl_drops, self._range_deletions = sections, drops, deletions
        self.indexes = indexes

    def drain_changes(self) -> dict[bytes, bytes | None]:
        out, self._changes = self._changes, {}
        return out

    def drain_range_deletions(self) -> list[tuple[bytes, bytes]]:
        """The key ranges deleted in the open batch: `Store.commit` deletes them before its changes."""
        out, self._range_deletions = self._range_deletions, []
        return out

    def apply(self, event: Record, offset: int) -> None:
        on_event(self, event)

    @on_event.register(ev.DocumentWritten)
    def _document_written(self, event: ev.DocumentWritten) -> None:
        id_enc = encode_value(event.doc["_id"])
        skey = bytes.fromhex(event.skey)
        ik = id_key(event.ns, id_enc)
        old = self.get(ik)
        maintained = self._maintained(event.ns)
        old_key = doc_key(event.ns, old, id_enc) if old is not None else None
        keep = event.ts is not None and self._keep_history(event.ts)
        raw = self.get(old_key) if old_key is not None and (maintained or keep) else None
        if maintained:
            self._reindex(event.ns, maintained, decode_doc(raw) if raw is not None else None, event.doc)
        new_key = doc_key(event.ns, skey, id_enc)
        if keep and event.ts is not None:  # what the write replaces, for reads at an earlier time
            if old_key is not None and old_key != new_key:
                history.record(self._changes, old_key, raw, event.ts)
            history.record(self._changes, new_key, raw if old_key == new_key else None, event.ts)
            if old != skey:
                history.record(self._changes, ik, old, event.ts)
        if old_key is not None and old_key != new_key:
            self._changes[old_key] = None
        self._changes[new_key] = encode_doc(event.doc)
        self._changes[ik] = skey
        if event.ts is not None:
            self._stamped(event.ts)

    def apply_bulk(self, ns: str, docs: list[StoredDocument], ticks: list[int] | None) -> None:
        """Fold the DocumentWritten records of `docs` (a migration's clone batch, `written_record`),
        the i-th stamped ticks[i], without decoding them: what `_document_written` does for each,
        with one multi-get of their _id entries.  A namespace with secondary indexes being kept
        takes the per-document fold (its entries need the documents' values)."""
        if self._maintained(ns):
            for i, (skey, _, raw) in enumerate(docs):
                ts = ticks[i] if ticks else None
                self._document_written(ev.DocumentWritten(ns=ns, skey=skey.hex(), doc=decode_doc(raw), ts=ts))
            return
        prefix = ns_prefix(ns)
        id_keys = [IDS + prefix + id_enc for _, id_enc, _ in docs]
        olds = self._get_many(id_keys)
        changes = self._changes
        base = DOCS + prefix
        if ticks and self._keep_history(ticks[-1]):  # what each replaces, as `_document_written` records it
            self._record_bulk(base, docs, olds, ticks)
        for (skey, id_enc, raw), ik, old in zip(docs, id_keys, olds):
            if old is not None and old != skey:
                changes[base + old + id_enc] = None
            changes[base + skey + id_enc] = raw
            changes[ik] = skey
        if ticks:
            self._stamped(ticks[-1])

    def _record_bulk(self, base: bytes, docs: list[StoredDocument], olds: list[bytes | None], ticks: list[int]) -> None:
        """The history of a clone batch's writes: what each replaces (mostly nothing: an orphan
        left by an earlier migration is the exception), one multi-get for the replaced."""
        replaced = [base + old + id_enc for (_, id_enc, _), old in zip(docs, olds) if old is not None]
        priors = dict(zip(replaced, self._get_many(replaced))) if replaced else {}
        for (skey, id_enc, _), old, ts in zip(docs, olds, ticks):
            new_key = base + skey + id_enc
            old_key = base + old + id_enc if old is not None else None
            if old_key is not None and old_key != new_key:
                history.record(self._changes, old_key, priors[old_key], ts)
            history.record(self._changes, new_key, priors[old_key] if old_key == new_key else None, ts)
            if old != skey:
                history.record(self._changes, IDS + base[len(DOCS) :] + id_enc, old, ts)

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """`get` of each key, the store's in one multi-get."""
        out: list[bytes | None] = [None] * len(keys)
        missing: list[int] = []
        for i, k in enumerate(keys):
            if k in self._changes:
                out[i] = self._changes[k]
            elif not (self._range_deletions and _within(k, self._range_deletions)):
                missing.append(i)
        if missing:
            for i, v in zip(missing, self.store.db.get([keys[i] for i in missing])):
                out[i] = v
        return out

    @on_event.register(ev.DocumentRemoved)
    def _document_removed(self, event: ev.DocumentRemoved) -> None:
        id_enc = encode_value(event.id)
        key, ik = doc_key(event.ns, bytes.fromhex(event.skey), id_enc), id_key(event.ns, id_enc)
        maintained = self._maintained(event.ns)
        keep = event.ts is not None and self._keep_history(event.ts)
        raw = self.get(key) if maintained or keep else None
        if maintained:
            self._reindex(event.ns, maintained, decode_doc(raw) if raw is not None else None, None)
        if keep and event.ts is not None:
            history.record(self._changes, key, raw, event.ts)
            history.record(self._changes, ik, self.get(ik), event.ts)
        self._changes[key] = None
        self._changes[ik] = None
        if event.ts is not None:
            self._stamped(event.ts)

    # ------------------------------------------------------------ indexes

    def _maintained(self, ns: str) -> list[Index]:
        return [i for i in self.indexes.get(ns, {}).values() if i.maintained]

    def _reindex(self, ns: str, indexes: list[Index], old: dict | None, new: dict | None) -> None:
        """Replace `old`'s entries in `indexes` with `new`'s (either may be None)."""
        for index in indexes:
            base = index_base(ns, index.spec.name)
            before = document_entries(index.spec, old)
            after = document_entries(index.spec, new)
            for entry in before.keys() - after.keys():
                self._changes[base + entry] = None
            for entry, key in after.items():
                self._changes[base + entry] = encode_entry_value(key, new["_id"])  # type: ignore[index]

    def _index_documents(self, ns: str, spec: IndexSpec, after: bytes | None, upto: bytes | None) -> None:
        """Put the entries of the documents of `ns` whose key is in (after, upto] (None: no
        bound) into `spec`'s entries."""
        base = index_base(ns, spec.name)
        hi = upto + b"\x00" if upto is not None else None  # the smallest key after `upto`
        for k, doc in self.scan(ns, after or b"", hi):
            if after is not None and k == after:
                continue
            for entry, key in document_entries(spec, doc).items():
                self._changes[base + entry] = encode_entry_value(key, doc["_id"])

    def _delete_entries(self, ns: str, name: str) -> None:
        start = index_base(ns, name)
        rng = (start, _after_prefix(start))
        self._changes = {k: v for k, v in self._changes.items() if not _within(k, [rng])}
        self._range_deletions.append(rng)

    @on_event.register(ix.IndexRecorded)
    def _index_recorded(self, event: ix.IndexRecorded) -> None:
        index = Index.of(event)
        named = self.indexes.setdefault(event.ns, {})
        prev = named.get(index.spec.name)
        same_build = prev is not None and prev.state == "building" and prev.record.buildId == event.buildId
        scanned = bytes.fromhex(prev.record.scannedTo) if same_build and prev and prev.record.scannedTo else None
        if event.state == "failed":
            self._delete_entries(event.ns, index.spec.name)
        elif event.state == "building":
            if not same_build and prev is not None and prev.state != "failed":
                self._delete_entries(event.ns, index.spec.name)  # another build's entries (not ours)
            if event.scannedTo and (scanned is None or bytes.fromhex(event.scannedTo) > scanned):
                self._index_documents(event.ns, index.spec, scanned, bytes.fromhex(event.scannedTo))
        elif prev is None or prev.state != "ready":  # ready: the rest of the documents
            self._index_documents(event.ns, index.spec, scanned, None)
        named[index.spec.name] = index
        self._changes[index_state_key(event.ns, index.spec.name)] = event.model_dump_json().encode()

    @on_event.register(ix.IndexRemoved)
    def _index_removed(self, event: ix.IndexRemoved) -> None:
        named = self.indexes.get(event.ns, {})
        named.pop(event.name, None)
        if not named:
            self.indexes.pop(event.ns, None)
        self._delete_entries(event.ns, event.name)
        self._changes[index_state_key(event.ns, event.name)] = None

    def _keep_history(self, ts: int) -> bool:
        """Does the write stamped `ts` keep history?  One that does not moves the oldest readable
        time past it, in the same batch: a read at an earlier time would miss it."""
        if self.keeps_history():
            return True
        current = self.get(history.HISTORY_FROM)  # (reclaim may have moved it further: never back)
        if current is None or int.from_bytes(current, "big") < ts:
            history.skipped(self._changes, ts)
        return False

    def _stamped(self, ts: int) -> None:
        if ts > self.max_ts:
            self.max_ts = ts
            self._changes[CLOCK] = str(ts).encode()  # in the same batch as the write it stamps
            if self.clock is not None:
                self.clock.advance(ts)

    @on_event.register(ev.NoopWritten)
    def _noop_written(self, event: ev.NoopWritten) -> None:
        if event.ts is not None:
            self._stamped(event.ts)

    @on_event.register(ev.RetryableWriteRecorded)
    def _retryable_write_recorded(self, event: ev.RetryableWriteRecorded) -> None:
        old = self.sessions.get(event.lsid)
        if old is not None and event.txnNumber > old.txn_number:
            # A newer txnNumber replaces the session's records (their tombstones come first, so
            # this only keeps a log without them, e.g. a hand-made one, from leaving stale keys).
            for part in old.records:
                self._changes[SESSIONS + record_suffix(old.lsid, old.txn_number, part)] = None
        if self._remember(event):
            self._changes[SESSIONS + record_suffix(event.lsid, event.txnNumber, event.part)] = (
                event.model_dump_json().encode()
            )

    def _remember(self, event: ev.RetryableWriteRecorded) -> bool:
        old = self.sessions.get(event.lsid)
        if old is not None and event.txnNumber < old.txn_number:
            return False  # an older txnNumber's record never replaces a newer one
        records = dict(old.records) if old is not None and old.txn_number == event.txnNumber else {}
        records[event.part] = event
        self.sessions[event.lsid] = SessionEntry(event.lsid, event.txnNumber, records)
        return True

    @on_event.register(Tombstone)
    def _tombstone(self, event: Tombstone) -> None:
        if event.key.startswith(XACT_KEY):  # an expired session's ended transaction
            lsid = event.key[len(XACT_KEY) :].decode()
            self._changes[TXNS + lsid.encode()] = None
            self.txns.pop(lsid, None)
            return
        if event.key.startswith(COORD_KEY):  # a two-phase commit's coordinator, done
            suffix = event.key[len(COORD_KEY) :]
            self._changes[COORDINATORS + suffix] = None
            lsid, _, number = suffix.decode().rpartition("/")
            self.coordinators.pop((lsid, int(number)), None)
            return
        if not event.key.startswith(TXN_KEY):
            return  # only transactions-table records are removed by tombstones
        suffix = event.key[len(TXN_KEY) :]
        self._changes[SESSIONS + suffix] = None
        try:
            lsid, txn, part = suffix.decode().split("/", 2)
            txn_number = int(txn)
        except ValueError:
            return
        entry = self.sessions.get(lsid)
        if entry is None or entry.txn_number != txn_number or part not in entry.records:
            return
        records = {p: r for p, r in entry.records.items() if p != part}
        if records:
            self.sessions[lsid] = SessionEntry(lsid, txn_number, records)
        else:
            del self.sessions[lsid]

    @on_event.register(ev.TxnRecorded)
    def _txn_recorded(self, event: ev.TxnRecorded) -> None:
        self._hold(event)
        self._changes[TXNS + event.lsid.encode()] = event.model_dump_json().encode()

    def _hold(self, event: ev.TxnRecorded) -> None:
        """The session's transaction as `event` leaves it: an open one holds the documents it
        wrote; an ended one (or one replaced by a newer) holds nothing."""
        old = self.txns.get(event.lsid)
        if old is not None:
            for w in old.writes:
                if self.txn_locks.get(held := id_key(w.ns, encode_value(w.id))) == event.lsid:
                    del self.txn_locks[held]
        self.txns[event.lsid] = event
        if event.state == "prepared":
            self.prepared[event.lsid] = event
        else:
            self.prepared.pop(event.lsid, None)
        if event.state in ("in-progress", "prepared"):
            for w in event.writes:
                self.txn_locks[id_key(w.ns, encode_value(w.id))] = event.lsid

    @on_event.register(ev.TxnCoordinatorRecorded)
    def _txn_coordinator_recorded(self, event: ev.TxnCoordinatorRecorded) -> None:
        self.coordinators[(event.lsid, event.txnNumber)] = event
        self._changes[COORDINATORS + f"{event.lsid}/{event.txnNumber}".encode()] = event.model_dump_json().encode()
        self.on_coordinator()

    def prepared_in(self, ns: str, at: int | None = None) -> bool:
        """Does a prepared transaction hold documents of `ns` (prepared at or before `at`)?  A read
        that could meet them waits for the decision: what it would see depends on it."""
        return bool(self.prepared) and any(
            (at is None or (t.prepareAt or 0) <= at) and any(w.ns == ns for w in t.writes)
            for t in self.prepared.values()
        )

    def txn_holder(self, ns: str, doc_id: Any) -> str | None:
        """The session whose open transaction wrote this document, if any."""
        return self.txn_locks.get(id_key(ns, encode_value(doc_id))) if self.txn_locks else None

    @on_event.register(ev.MigrationRecorded)
    def _migration_recorded(self, event: ev.MigrationRecorded) -> None:
        self.migrations[event.id] = event
        self._changes[MIGRATIONS + event.id.encode()] = event.model_dump_json().encode()

    @on_event.register(ev.MigrationForgotten)
    def _migration_forgotten(self, event: ev.MigrationForgotten) -> None:
        self.migrations.pop(event.id, None)
        self._changes[MIGRATIONS + event.id.encode()] = None

    @on_event.register(ev.RangeDeletionRecorded)
    def _range_deletion_recorded(self, event: ev.RangeDeletionRecorded) -> None:
        self.range_tasks[event.id] = event
        self._changes[TASKS + event.id.encode()] = event.model_dump_json().encode()

    @on_event.register(ev.RangeDeletionRemoved)
    def _range_deletion_removed(self, event: ev.RangeDeletionRemoved) -> None:
        self.range_tasks.pop(event.id, None)
        self._changes[TASKS + event.id.encode()] = None

    @on_event.register(dd.DDLCriticalSectionRecorded)
    def _ddl_section_recorded(self, event: dd.DDLCriticalSectionRecorded) -> None:
        self.ddl_sections[event.id] = event
        self._changes[SECTIONS + event.id.encode()] = event.model_dump_json().encode()

    @on_event.register(dd.DDLCriticalSectionRemoved)
    def _ddl_section_removed(self, event: dd.DDLCriticalSectionRemoved) -> None:
        """The DDL is over here: its section, and the memory of what it dropped, go."""
        self.ddl_sections.pop(event.id, None)
        self._changes[SECTIONS + event.id.encode()] = None
        for target in self.ddl_drops.pop(event.id, frozenset()):
            self._changes[_drop_key(event.id, target)] = None

    @on_event.register(dd.LocalDataDropped)
    def _local_data_dropped(self, event: dd.LocalDataDropped) -> None:
        ranges = dropped_ranges(event.ns, event.db)
        self._changes = {k: v for k, v in self._changes.items() if not _within(k, ranges)}
        self._range_deletions += ranges
        if event.ns is not None:
            self.indexes.pop(event.ns, None)
        else:
            for ns in [ns for ns in self.indexes if ns.partition(".")[0] == event.db]:
                del self.indexes[ns]
        target = dropped_target(event)
        self.ddl_drops[event.id] = self.ddl_drops.get(event.id, frozenset()) | {target}
        self._changes[_drop_key(event.id, target)] = b""
        if event.ts is not None:
            history.dropped(self._changes, target, event.ts)
            self._stamped(event.ts)

    # ------------------------------------------------------------------- reads

    def get(self, key: bytes) -> bytes | None:
        if key in self._changes:
            return self._changes[key]
        if self._range_deletions and _within(key, self._range_deletions):
            return None
        return self.store.get(key)

    def find_by_id(self, ns: str, doc_id: Any) -> tuple[bytes, dict] | None:
        """(shard key, document) of the document with this _id, if any."""
        id_enc = encode_value(doc_id)
        skey = self.get(id_key(ns, id_enc))
        if skey is None:
            return None
        raw = self.get(doc_key(ns, skey, id_enc))
        return (skey, decode_doc(raw)) if raw is not None else None

    def stored_sessions(self) -> Iterator[SessionEntry]:
        """The transactions table as committed (no pending records of the open batch): what a
        migration's clone may send, since a record still pending could yet be aborted."""
        entry: SessionEntry | None = None
        for _, v in self.store.scan(SESSIONS):
            r = ev.RetryableWriteRecorded.model_validate_json(v)
            if entry is not None and entry.lsid != r.lsid:
                yield entry
                entry = None
            if entry is None or r.txnNumber > entry.txn_number:
                entry = SessionEntry(r.lsid, r.txnNumber, {r.part: r})
            elif r.txnNumber == entry.txn_number:
                entry.records[r.part] = r
        if entry is not None:
            yield entry

    def session_last_writes(self) -> Iterator[tuple[str, float]]:
        """(lsid, its last write's wall time) of every session in the transactions table: what
        the session reaper compares with the sessions store."""
        for lsid, entry in list(self.sessions.items()):
            yield lsid, entry.last_write_at
        for lsid, record in list(self.txns.items()):  # sessions that only ran transactions here
            if lsid not in self.sessions and record.state in ("committed", "aborted"):
                yield lsid, record.startedAt

    def scan(self, ns: str, lo: bytes = b"", hi: bytes | None = None) -> Iterator[tuple[bytes, dict]]:
        """(shard key + _id encoding, document) for shard keys in [lo, hi), in key order,
        the batch's pending writes included."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, (base + hi) if hi is not None else _after_prefix(base)
        for k, v in self._merged(start, stop):
            yield k[len(base) :], decode_doc(v)

    def _merged(self, start: bytes, stop: bytes, *, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """The keys in [start, stop) with their values, the open batch's pending writes and
        range deletions included, in key order (or reversed)."""
        pending = sorted(((k, v) for k, v in self._changes.items() if start <= k < stop), reverse=reverse)
        stored = self._stored(start, stop, reverse=reverse)
        p = 0

        def before(a: bytes, b: bytes) -> bool:
            return a > b if reverse else a < b

        for k, v in stored:
            while p < len(pending) and before(pending[p][0], k):
                if pending[p][1] is not None:
                    yield pending[p][0], pending[p][1]  # type: ignore[misc]
                p += 1
            if p < len(pending) and pending[p][0] == k:
                v = pending[p][1]  # type: ignore[assignment]
                p += 1
            if v is not None:
                yield k, v
        for k, pv in pending[p:]:
            if pv is not None:
                yield k, pv

    # ------------------------------------------------------------ reads at a past cluster time

    def readable_from(self, ns: str) -> int:
        """The oldest cluster time at which `ns` may be read here (docs/decisions/0019)."""
        return history.readable_from_ns(self.get, ns)

    def scan_at(self, ns: str, at: int, lo: bytes = b"", hi: bytes | None = None) -> Iterator[tuple[bytes, dict]]:
        """`scan` of the documents as they were at cluster time `at`, the batch's pending writes
        included (a snapshot read decided inside a transaction answers in it: its reply is
        visible only with them)."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, (base + hi) if hi is not None else _after_prefix(base)
        past = self._merged(*history.history_range(start, stop))
        latest = self._merged(start, stop)
        for k, v in history.as_of(latest, past, at):
            yield k[len(base) :], decode_doc(v)

    def changed_since(self, ns: str, at: int) -> Iterator[tuple[dict | None, dict | None]]:
        """(as it was at `at`, as it is now) of every document of `ns` written after cluster
        time `at` (its history's by-time entries; a window of 0 keeps none, and every write
        since is then unseen here: transactions refuse such a snapshot as SnapshotTooOld)."""
        doc_prefix = DOCS + ns_prefix(ns)
        seen: set[bytes] = set()
        start = history.BY_TIME + (at + 1).to_bytes(history.TS_BYTES, "big")
        for k, _ in self._merged(start, _after_prefix(history.BY_TIME)):
            key = k[len(history.BY_TIME) + history.TS_BYTES :]
            if not key.startswith(doc_prefix) or key in seen:
                continue
            seen.add(key)
            latest = self.get(key)
            h = history.history_of(key)
            own = ((hk, hv) for hk, hv in self._merged(h, _after_prefix(h)) if len(hk) == len(h) + history.TS_BYTES)
            before = history.value_at(latest, own, at)
            yield (
                decode_doc(before) if before is not None else None,
                decode_doc(latest) if latest is not None else None,
            )

    # ------------------------------------------------------------ index reads (the planner's API)

    def get_by_id(self, ns: str, _id: Any) -> dict | None:
        """The document of `ns` with this _id, if any (pending writes included)."""
        hit = self.find_by_id(ns, _id)
        return hit[1] if hit is not None else None

    def scan_index(
        self, ns: str, name: str, lo: bytes = b"", hi: bytes | None = None, reverse: bool = False
    ) -> Iterator[tuple[bytes, tuple[Any, ...], Any]]:
        """(entry key, key values, _id) of the entries of index `name` of `ns` whose entry key
        (domain.indexes.entry_key) is in [lo, hi) (hi None or b"": to the end), in the index's
        order or reversed, the batch's pending writes included."""
        base = index_base(ns, name)
        start = base + lo
        stop = base + hi if hi else _after_prefix(base)
        for k, v in self._merged(start, stop, reverse=reverse):
            key, doc_id = decode_entry_value(v)
            yield k[len(base) :], key, doc_id

    def index_holders(self, ns: str, name: str, prefix: bytes) -> dict[bytes, tuple[Any, ...]]:
        """The entries of index `name` under the key prefix `prefix` (domain.indexes.key_prefix),
        one seek: each holder's encoded `_id` -> its key values."""
        return {entry[len(prefix) :]: key for entry, key, _ in self.scan_index(ns, name, prefix, _prefix_end(prefix))}

    def index_duplicate(self, ns: str, spec: IndexSpec, key: tuple[Any, ...], doc_id: Any) -> bool:
        """Whether another document than `doc_id` has `key` in unique index `spec`: one seek.
        The encoding of a key is prefix-free, so the entries under its prefix are exactly the
        entries of that key."""
        prefix = key_prefix(spec, key)
        mine = encode_value(doc_id)
        for entry, _, _ in self.scan_index(ns, spec.name, prefix, _prefix_end(prefix)):
            if entry[len(prefix) :] != mine:
                return True
        return False

    def has_shard_key(self, ns: str, skey: bytes) -> bool:
        """Whether a document of `ns` has exactly this encoded shard key: one seek, as a unique
        index's lookup.  Its documents are keyed `skey + _id`, and an _id's encoding starts with
        a tag below 0xFF, the byte that continues a number's encoding (a longer key)."""
        return next(self.scan(ns, skey, skey + b"\xff"), None) is not None

    def count_range(self, ns: str, lo: bytes, hi: bytes) -> int:
        """Documents with a shard key in [lo, hi), pending writes included, without decoding them."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, base + hi
        pending = {k: v for k, v in self._changes.items() if start <= k < stop}
        stored = sum(1 for k, _ in self._stored(start, stop) if k not in pending)
        return stored + sum(1 for v in pending.values() if v is not None)

    def count_documents(self, ns: str) -> int:
        """The documents of `ns`, pending writes included, without decoding them."""
        base = DOCS + ns_prefix(ns)
        return sum(1 for _ in self._merged(base, _after_prefix(base)))

    def scan_stored(self, ns: str, after: bytes, hi: bytes, *, inclusive: bool) -> Iterator[tuple[bytes, dict]]:
        """Like `scan`, but only what is committed (no pending writes), from `after` on."""
        for k, v in self.scan_stored_raw(ns, after, hi, inclusive=inclusive):
            yield k, decode_doc(v)

    def scan_stored_raw(self, ns: str, after: bytes, hi: bytes, *, inclusive: bool) -> Iterator[tuple[bytes, bytes]]:
        """`scan_stored` with the stored values as they are (a migration's bulk clone)."""
        base = DOCS + ns_prefix(ns)
        n = len(base)
        first = base + after
        for k, v in self._stored(first, base + hi, committed=True):
            if not inclusive and k == first:
                continue
            yield k[n:], v

    def _stored(
        self, start: bytes, stop: bytes, *, committed: bool = False, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """The store's keys in [start, stop) (descending if `reverse`); unless `committed`,
        without those the open batch deleted as ranges."""
        deleted = [] if committed else [(lo, hi) for lo, hi in self._range_deletions if lo < stop and start < hi]
        it = self.store.db.iter()
        if not reverse:
            it.seek(start)
            while it.valid():
                k = it.key()
                if k >= stop:
                    break
                if deleted and _within(k, deleted):
                    # Skip to the end of the deleted range rather than read through it.
                    it.seek(max(hi for lo, hi in deleted if lo <= k < hi))
                    continue
                yield k, it.value()
                it.next()
            return
        it.seek_for_prev(stop)
        while it.valid():
            k = it.key()
            if k >= stop:
                it.prev()
                continue
            if k < start:
                break
            if deleted and _within(k, deleted):
                it.seek_for_prev(min(lo for lo, hi in deleted if lo <= k < hi))
                if it.valid() and _within(it.key(), deleted):
                    it.prev()
                continue
            yield k, it.value()
            it.prev()


def _within(key: bytes, ranges: list[tuple[bytes, bytes]]) -> bool:
    return any(lo <= key < hi for lo, hi in ranges)


def _drop_key(ddl_id: str, target: str) -> bytes:
    return DROPS + ddl_id.encode() + b"\0" + target.encode()


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def _after_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix`."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
