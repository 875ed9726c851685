"""A shard's documents: the fold of its changelog, laid out in RocksDB for
ordered range scans by (collection, shard-key value, _id), with an index to
find a document by _id.

    d/<ns>\\0<shard key><_id>  -> the document (JSON)
    i/<ns>\\0<_id>             -> its shard key (to find it by _id)
    o/<opId>                  -> a recorded write's result (retried writes apply once)
    m/<migration id>          -> this shard's migration document (donor or recipient)
    t/<migration id>          -> a range-deletion task
    \x00meta/clock            -> the largest ClusterTime stamped on a write (the clock resumes there)

Migration documents and range-deletion tasks are few: they are also kept in memory.

Shard keys and _ids are `domain.shardkey` order-preserving encodings, so a
chunk [min, max) is one contiguous key range.  Writes decided in the current
batch sit in an overlay until the batch commits; reads see them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from domain.clock import VectorClock
from domain.shardkey import encode_value
from libs.dispatch import Dispatch
from libs.store import META, Store
from schemas import Record
from schemas import shard as ev

DOCS, IDS, OPS, MIGRATIONS, TASKS = b"d/", b"i/", b"o/", b"m/", b"t/"
# Documents of unsharded collections are ordered by _id alone, under a prefix below every
# encoded shard key (tags start at 0x10): a collection sharded later finds them there.
UNSHARDED_KEY, UNSHARDED_END = b"\x00", b"\x01"
CLOCK = META + b"clock"


def shard_key_part(key: bytes, doc: dict) -> bytes:
    """The shard-key part of a document's key as `scan` yields it (shard key + _id)."""
    return key[: len(key) - len(encode_value(doc["_id"]))]


def ns_prefix(ns: str) -> bytes:
    return ns.encode() + b"\x00"


def doc_key(ns: str, skey: bytes, id_enc: bytes) -> bytes:
    return DOCS + ns_prefix(ns) + skey + id_enc


def id_key(ns: str, id_enc: bytes) -> bytes:
    return IDS + ns_prefix(ns) + id_enc


def changelog_key(event: Record) -> bytes | None:
    """Kafka key of a changelog record: compaction keeps the latest per document / opId."""
    if isinstance(event, (ev.DocumentWritten, ev.DocumentRemoved)):
        doc_id = event.doc["_id"] if isinstance(event, ev.DocumentWritten) else event.id
        return b"doc/" + ns_prefix(event.ns) + encode_value(doc_id)
    if isinstance(event, ev.WriteRecorded):
        return b"op/" + event.opId.encode()
    if isinstance(event, (ev.MigrationRecorded, ev.MigrationForgotten)):
        return b"mig/" + event.id.encode()
    if isinstance(event, (ev.RangeDeletionRecorded, ev.RangeDeletionRemoved)):
        return b"rdel/" + event.id.encode()
    return None


# The fold of the changelog: one handler per event type.
on_event: Dispatch[ShardDocuments, None] = Dispatch("shard changelog event")


class ShardDocuments:
    def __init__(self) -> None:
        self.store: Store | None = None
        self._changes: dict[bytes, bytes | None] = {}
        self.migrations: dict[str, ev.MigrationRecorded] = {}
        self.range_tasks: dict[str, ev.RangeDeletionRecorded] = {}
        self.clock: VectorClock | None = None  # advanced by every stamp folded (docs/decisions/0014)
        self.max_ts = 0  # the largest stamp folded, persisted with the fold

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

    def tentative(self):
        """The batch's pending state as it is, to `restore` if a tentative apply is abandoned."""
        return dict(self._changes), dict(self.migrations), dict(self.range_tasks)

    def restore(self, saved) -> None:
        changes, migrations, tasks = saved
        self._changes, self.migrations, self.range_tasks = changes, migrations, tasks

    def drain_changes(self) -> dict[bytes, bytes | None]:
        out, self._changes = self._changes, {}
        return out

    def apply(self, event: Record, offset: int) -> None:
        on_event(self, event)

    @on_event.register(ev.DocumentWritten)
    def _document_written(self, event: ev.DocumentWritten) -> None:
        id_enc = encode_value(event.doc["_id"])
        skey = bytes.fromhex(event.skey)
        old = self.get(id_key(event.ns, id_enc))
        if old is not None and old != skey:
            self._changes[doc_key(event.ns, old, id_enc)] = None
        self._changes[doc_key(event.ns, skey, id_enc)] = json.dumps(event.doc, separators=(",", ":")).encode()
        self._changes[id_key(event.ns, id_enc)] = skey
        if event.ts is not None:
            self._stamped(event.ts)

    @on_event.register(ev.DocumentRemoved)
    def _document_removed(self, event: ev.DocumentRemoved) -> None:
        id_enc = encode_value(event.id)
        self._changes[doc_key(event.ns, bytes.fromhex(event.skey), id_enc)] = None
        self._changes[id_key(event.ns, id_enc)] = None
        if event.ts is not None:
            self._stamped(event.ts)

    def _stamped(self, ts: int) -> None:
        if ts > self.max_ts:
            self.max_ts = ts
            self._changes[CLOCK] = str(ts).encode()  # in the same batch as the write it stamps
            if self.clock is not None:
                self.clock.advance(ts)

    @on_event.register(ev.WriteRecorded)
    def _write_recorded(self, event: ev.WriteRecorded) -> None:
        self._changes[OPS + event.opId.encode()] = json.dumps(event.result).encode()

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

    # ------------------------------------------------------------------- reads

    def get(self, key: bytes) -> bytes | None:
        if key in self._changes:
            return self._changes[key]
        return self.store.get(key)

    def find_by_id(self, ns: str, doc_id: Any) -> tuple[bytes, dict] | None:
        """(shard key, document) of the document with this _id, if any."""
        id_enc = encode_value(doc_id)
        skey = self.get(id_key(ns, id_enc))
        if skey is None:
            return None
        raw = self.get(doc_key(ns, skey, id_enc))
        return (skey, json.loads(raw)) if raw is not None else None

    def recorded(self, op_id: str) -> dict | None:
        raw = self.get(OPS + op_id.encode())
        return json.loads(raw) if raw is not None else None

    def scan(self, ns: str, lo: bytes = b"", hi: bytes | None = None) -> Iterator[tuple[bytes, dict]]:
        """(shard key + _id encoding, document) for shard keys in [lo, hi), in key order,
        the batch's pending writes included."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, (base + hi) if hi is not None else _after_prefix(base)
        pending = sorted((k, v) for k, v in self._changes.items() if start <= k < stop)
        stored = self._stored(start, stop)
        p = 0
        for k, v in stored:
            while p < len(pending) and pending[p][0] < k:
                if pending[p][1] is not None:
                    yield pending[p][0][len(base) :], json.loads(pending[p][1])
                p += 1
            if p < len(pending) and pending[p][0] == k:
                v = pending[p][1]
                p += 1
            if v is not None:
                yield k[len(base) :], json.loads(v)
        for k, v in pending[p:]:
            if v is not None:
                yield k[len(base) :], json.loads(v)

    def count_range(self, ns: str, lo: bytes, hi: bytes) -> int:
        """Documents with a shard key in [lo, hi), pending writes included, without decoding them."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, base + hi
        pending = {k: v for k, v in self._changes.items() if start <= k < stop}
        stored = sum(1 for k, _ in self._stored(start, stop) if k not in pending)
        return stored + sum(1 for v in pending.values() if v is not None)

    def scan_stored(self, ns: str, after: bytes, hi: bytes, *, inclusive: bool) -> Iterator[tuple[bytes, dict]]:
        """Like `scan`, but only what is committed (no pending writes), from `after` on."""
        base = DOCS + ns_prefix(ns)
        for k, v in self._stored(base + after, base + hi):
            if not inclusive and k == base + after:
                continue
            yield k[len(base) :], json.loads(v)

    def _stored(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self.store.db.iter()
        it.seek(start)
        while it.valid():
            k = it.key()
            if k >= stop:
                break
            yield k, it.value()
            it.next()


def _after_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix`."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
