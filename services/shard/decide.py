"""A shard's decisions: a CRUD request and the shard's state (its documents and
its view of the catalog) in; changelog events and a reply out — or an error.

Every data request is first checked against the catalog: the router must have
routed with this shard's current version of the collection (else StaleConfig,
with the shard's version and ConfigTime so the router knows what to wait for),
and only documents in chunks this shard owns are ever read or written
(the ownership filter).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from domain import clock as vclock
from domain import planner, query_plan, targeting
from domain.bsonvalues import to_record
from domain.catalog import Catalog, Collection
from domain.indexes import ID_INDEX, IndexSpec, duplicate_key_error
from domain.protocol import CURSOR_TIMEOUT_S, MAX_BATCH_BYTES, ErrorCode, check_document_size, record_bytes
from domain.query import (
    MISSING,
    QueryError,
    apply_projection,
    apply_update,
    check_insert_document,
    check_update,
    compile_filter,
    get_path,
    sort_key,
    update_stored,
    upsert_document,
)
from domain.session import shard_session
from domain.shardkey import (
    InvalidKeyPattern,
    KeyPattern,
    ShardKeyError,
    ShardKeyTooLarge,
    encode_value,
    from_ejson,
    shell_form,
    to_ejson,
)
from libs.commands import CommandError, Decision
from libs.dispatch import Dispatch
from libs.ids import new_object_id
from schemas import Record, Tombstone
from schemas import ddl as dd
from schemas import shard as s
from services.shard import transactions
from services.shard.ddl import REQUESTS as DDL_REQUESTS
from services.shard.ddl import DDLDecider
from services.shard.documents import (
    COORD_KEY,
    TXN_KEY,
    UNSHARDED_END,
    UNSHARDED_KEY,
    ShardDocuments,
    changelog_key,
    document_changelog_key,
    id_key,
    shard_key_part,
)
from services.shard.indexes import REQUESTS as INDEX_REQUESTS
from services.shard.indexes import IndexDecider
from services.shard.migrations import REQUESTS as MIGRATION_REQUESTS
from services.shard.migrations import MigrationDecider
from services.shard.protocol import index_build, retryable

WRITES = (s.Insert, s.Update, s.Delete, s.FindAndModify)
# How long an unsharded collection's writes wait after its documents were checked for a
# shardCollection: the config server decides it right after; a refused one lets go then.
SHARDING_HOLD_S = 5.0
# A shard counts as serving clients for this long after their last request: a migration's
# throttle (migrationThrottleUnderLoad) stays on through the gaps of a steady load.
CLIENT_ACTIVITY_HOLD_S = 1.0

on_request: Dispatch[ShardDecider, Decision] = Dispatch("shard request")


class ClientActivity:
    """When this shard last decided a client's request (a read or write of documents: not a
    migration's, a DDL's, an index build's or the session reaper's).  A migration's throttle
    (migrationThrottleUnderLoad) holds back while it was lately."""

    def __init__(self, clock: Callable[[], float] = lambda: time.monotonic()):  # (read at each call: see wall)
        self.clock = clock
        self.last = -math.inf

    def note(self) -> None:
        self.last = self.clock()

    def within(self, seconds: float) -> bool:
        """Whether a client's request was decided in the last `seconds`."""
        return self.clock() - self.last < seconds


def reply_with_events(req: Record) -> bool:
    """May the reply leave with the request's events, before their acks (one phase)?  Not
    EnterCriticalSection's: the donor reads the changelog position after its events in it
    (docs/reference/command-processor.md)."""
    return not isinstance(req, s.EnterCriticalSection)


def plain_read(req: Record) -> bool:
    """A read the processor may answer outside its transaction when it heads a batch: a Find or
    Count without afterClusterTime (MongoDB's readConcern "local"); a causally consistent read
    ticks the clock, so it stays inside (docs/reference/command-processor.md)."""
    if not isinstance(req, (s.Find, s.Count)) or getattr(req, "txn", None) is not None:
        return False  # (a transaction's read may begin its record: decisions/0020)
    try:
        return vclock.parse_after_cluster_time(req.readConcern) is None
    except CommandError:
        return False  # refused inside the transaction, as ever


class PointReads:
    """Which plain reads may be answered while the shard's transaction is in flight
    (libs.commands.PointReads; docs/reference/command-processor.md): a Find by `_id` value (the
    IDHACK path of `_query`: it reads that one document, the catalog and the migrations' state)
    when no uncommitted event changes that document.  Documents are named by their changelog key;
    a session's records change nothing such a read sees; any other event (a migration's, a DDL's,
    an index's) may, so it holds every point read back until the commit."""

    @staticmethod
    def key(req: Record) -> bytes | None:
        if not isinstance(req, s.Find) or req.hint is not None or req.readConcern is not None or req.txn is not None:
            return None  # (a snapshot read must not miss the in-flight batch's writes stamped before it)
        flt = req.filter
        if "_id" not in flt or isinstance(flt["_id"], dict):
            return None
        try:
            return document_changelog_key(req.ns, encode_value(flt["_id"]))
        except Exception:  # not a value the IDHACK path takes: the transaction decides it
            return None

    @staticmethod
    def changed(event: Record) -> tuple[bytes, ...] | None:
        if isinstance(event, (s.DocumentWritten, s.DocumentRemoved)):
            return (changelog_key(event) or b"",)
        if isinstance(event, (s.RetryableWriteRecorded, s.NoopWritten, s.TxnRecorded, s.TxnCoordinatorRecorded)) or (
            isinstance(event, Tombstone) and event.key.startswith((TXN_KEY, COORD_KEY))
        ):
            return ()
        return None


@dataclass
class Cursor:
    docs: Iterator[dict]
    ns: str = ""
    config_time: int = 0  # the ConfigTime the query started at: range deletion waits for older ones
    created: float = field(default_factory=lambda: time.monotonic())


class ShardDecider:
    def __init__(
        self,
        shard_id: str,
        catalog: Catalog,
        documents: ShardDocuments,
        clock: vclock.VectorClock | None = None,
        *,
        # time.time looked up at each call, not bound at import: the simulator's clock is
        # time.time while a schedule runs (a bound default kept the real one there)
        wall: Callable[[], float] = lambda: time.time(),
    ):
        self.shard_id, self.catalog, self.documents = shard_id, catalog, documents
        self.clock = clock  # the vector clock (docs/decisions/0014)
        self.wall = wall  # the wall clock: a retryable write's last-write time
        # The retryable write being decided (docs/decisions/0015) and the statements it executed.
        self._begun: retryable.Begun | None = None
        self._statements: list[s.Statement] = []
        self.cursors: dict[int, Cursor] = {}
        self.served: collections.Counter = collections.Counter()  # (request type, ns) -> requests decided
        self._cursor_ids = itertools.count(int.from_bytes(os.urandom(4), "big") << 16)
        self._keyed: set[tuple[str, str]] = set()  # (ns, epoch) known to hold no unsharded-layout documents
        # Unsharded collections whose documents were just checked for a shardCollection: their
        # writes wait until it is decided (or this hold lapses), so none slips in unchecked.
        self._sharding: dict[str, float] = {}  # ns -> wall-clock end of the hold
        self.client_activity = ClientActivity()
        # The migration and range-deletion requests (range deletion waits for our older queries).
        self.migrations = MigrationDecider(
            shard_id,
            catalog,
            documents,
            open_queries=self._queries_open_before,
            client_busy=lambda: self.client_activity.within(CLIENT_ACTIVITY_HOLD_S),
        )
        # The DDL coordinators' requests (critical sections, drops, renames, refines).
        self.ddl = DDLDecider(shard_id, catalog, documents)
        # Secondary indexes: their builds, drops and listing (services/shard/indexes.py).
        self.indexes = IndexDecider(catalog, documents)
        # The index records the write being decided changed (made multikey, or gave a unique
        # build a key to recheck), recorded with it.
        self._index_records: dict[tuple[str, str], Record] = {}

    @property
    def progress(self) -> dict[str, dict[str, Any]]:
        """Live progress of this shard's donations, by migration id (the donor's coordinator reports it)."""
        return self.migrations.progress

    def decide(self, req: Record) -> Decision:
        if not on_request.handles(req):
            raise CommandError(ErrorCode.CommandNotFound, f"unknown shard request {req.type!r}")
        self.served[(req.type, getattr(req, "ns", None))] += 1
        if not (
            self.migrations.handles(req)
            or self.ddl.handles(req)
            or self.indexes.handles(req)
            or isinstance(req, s.ForgetSessions)
        ):
            self.client_activity.note()
        self._begun, self._statements = None, []
        self._index_records = {}
        if isinstance(req, transactions.TXN_STATEMENTS) and req.txn is not None:
            return transactions.decide_statement(self, req, lambda r: on_request(self, r))
        if isinstance(req, (*WRITES, s.Count)):
            transactions.refuse_if_prepared(self, req.ns)  # (the router asks again)
        elif isinstance(req, (s.EnterCriticalSection, dd.EnterDDLCriticalSection)):
            transactions.refuse_critical_section_if_prepared(self, req)
        if isinstance(req, WRITES) and (write := shard_session(req)) is not None:
            # TransactionTooOld here; a retry learns which of its statements ran already.
            self._begun = retryable.begin(self.documents.sessions.get(write.lsid), write)
        try:
            # A DDL request reads the documents as they are (RekeyLocalBatch rewrites any layout).
            # A snapshot read reads the committed past, documents not rekeyed yet included (_find_at).
            rekey = [] if self.ddl.handles(req) or _snapshot(req) else self._rekey_events(getattr(req, "ns", None))
            if rekey:
                decision = self._after(rekey, req)
            else:
                decision = on_request(self, req)
            if isinstance(req, WRITES):
                transactions.refuse_if_held(self, decision.events)  # the router retries it
            if self._begun is not None and self._statements:
                # Recorded in the same transaction as the writes; a newer txnNumber's first record
                # replaces the session's older ones (tombstones first).
                decision.events[:0] = list(self._begun.tombstones)
                decision.events += retryable.record(self._begun, self._statements, self.wall())
            if self._index_records:
                decision.events += list(self._index_records.values())
            return decision
        finally:
            self._begun, self._statements = None, []
            self._index_records = {}

    def _statement(self) -> int:
        """The statement id of a single-statement write being decided (its index in a wire
        batch of updates or deletes; 0 otherwise)."""
        ids = self._begun.write.stmt_ids if self._begun is not None else ()
        return ids[0] if ids else 0

    def _retried(self, stmt_id: int) -> s.Statement | None:
        """The recorded statement if the write being decided is a retry of an executed one."""
        return self._begun.executed.get(stmt_id) if self._begun is not None else None

    def _executed(self, stmt_id: int, ns: str, skey: bytes | None, result: dict, image: dict | None = None) -> None:
        """Note a statement of a retryable write as executed (nothing for a plain write).  An
        update or delete is recorded even when it matched nothing (skey None): one without the
        shard key tries shards in turn, and a retry must not find a match the first did not."""
        if self._begun is not None:
            hexkey = skey.hex() if skey is not None else None
            self._statements.append(s.Statement(stmtId=stmt_id, ns=ns, skey=hexkey, result=result, image=image))

    @on_request.register(s.CommitTransaction)
    def commit_transaction(self, req: s.CommitTransaction) -> Decision:
        return transactions.commit(self, req)

    @on_request.register(s.PrepareTransaction)
    def prepare_transaction(self, req: s.PrepareTransaction) -> Decision:
        return transactions.prepare(self, req)

    @on_request.register(s.CoordinateCommitTransaction)
    def coordinate_commit_transaction(self, req: s.CoordinateCommitTransaction) -> Decision:
        return transactions.coordinate(self, req)

    @on_request.register(s.AdvanceTxnCoordinator)
    def advance_txn_coordinator(self, req: s.AdvanceTxnCoordinator) -> Decision:
        return transactions.advance(self, req)

    @on_request.register(s.AbortTransaction)
    def abort_transaction(self, req: s.AbortTransaction) -> Decision:
        return transactions.abort(self, req)

    @on_request.register(s.ForgetSessions)
    def forget_sessions(self, req: s.ForgetSessions) -> Decision:
        """The session reaper's removal of expired sessions' records (tombstones)."""
        events, forgotten = retryable.forget(self.documents.sessions, req.lsids, req.before)
        ended, ended_lsids = transactions.forget(self, req.lsids, req.before)
        forgotten += [lsid for lsid in ended_lsids if lsid not in forgotten]
        return Decision(events + ended, {"forgotten": forgotten})

    def _rekey_events(self, ns: str | None) -> list[Record]:
        """A collection sharded after it was written to still has its documents under the
        unsharded layout on this (primary) shard: rewrite them under their shard keys."""
        coll = self.catalog.collections.get(ns) if ns else None
        if coll is None or (ns, coll.epoch) in self._keyed:
            return []
        events = [
            s.DocumentWritten(ns=ns, skey=coll.pattern.encode_doc(doc).hex(), doc=doc)
            for _, doc in self.documents.scan(ns, UNSHARDED_KEY, UNSHARDED_END)
        ]
        if not events:
            self._keyed.add((ns, coll.epoch))
        return events

    def _after(self, events: list[Record], req: Record) -> Decision:
        """Decide `req` on the state after `events`, which become part of its decision.  The
        state is put back after deciding: the processor applies the decision's events, stamped,
        and only that fold records their history (decisions/0019)."""
        saved = self.documents.tentative()
        for e in events:
            self.documents.apply(e, -1)
        try:
            decision = on_request(self, req)
        finally:
            self.documents.restore(saved)
        decision.events[:0] = events
        return decision

    @on_request.register(*MIGRATION_REQUESTS)
    def _migration_request(self, req: Record) -> Decision:
        return self.migrations.decide(req)

    @on_request.register(*INDEX_REQUESTS)
    def _index_request(self, req: Record) -> Decision:
        return self.indexes.decide(req)

    @on_request.register(*DDL_REQUESTS)
    def _ddl_request(self, req: Record) -> Decision:
        decision = self.ddl.decide(req)
        if isinstance(req, dd.EnterDDLCriticalSection) and decision.events:  # (not a retry)
            decision.events += transactions.ended_by_ddl(self, req)
        # Cursors of a dropped or renamed-away collection end, as MongoDB kills them.
        if isinstance(req, dd.DropLocalData):
            self._forget_cursors(lambda ns: ns == req.ns if req.ns is not None else ns.partition(".")[0] == req.db)
        elif isinstance(req, dd.RenameLocalBatch):
            self._forget_cursors(lambda ns: ns == req.ns)
        return decision

    def _forget_cursors(self, of: Callable[[str], bool]) -> None:
        for cid in [cid for cid, c in self.cursors.items() if of(c.ns)]:
            del self.cursors[cid]

    # ---------------------------------------------------------------- routing

    def _placement(self, ns: str, routing: s.Routing | None) -> Collection | None:
        """The sharded collection (None: unsharded, on this primary) if the router's view is current."""
        if routing is None:
            raise CommandError(ErrorCode.BadValue, "a shard serves only routed requests (send this to a router)")
        if (held := self.ddl.critical_section_wait(ns)) is not None:
            raise held  # every CRUD request passes here: a DDL holding `ns` refuses it
        coll = self.catalog.collections.get(ns)
        if coll is None:
            db = self.catalog.databases.get(ns.partition(".")[0])
            if routing.epoch is not None or db is None or db.primary != self.shard_id:
                self._stale(ns, routing, None)
            return None
        mine = coll.shard_version(self.shard_id)
        if routing.epoch != coll.epoch or routing.version != mine.pair:
            self._stale(ns, routing, coll)
        return coll

    def _stale(self, ns: str, routing: s.Routing, coll: Collection | None):
        here = coll.shard_version(self.shard_id) if coll else None
        raise CommandError(
            ErrorCode.StaleConfig,
            f"{self.shard_id}: routing for {ns} is stale (router at ConfigTime "
            f"{routing.configTime}, shard at {self.catalog.config_time})",
            {
                "shard": self.shard_id,
                "configTime": self.catalog.config_time,
                "epoch": coll.epoch if coll else None,
                "version": list(here.pair) if here else None,
            },
        )

    def _write_blocked(self, coll: Collection | None, ns: str) -> list[tuple[bytes, bytes]]:
        """Key ranges of `ns` where writes wait for a critical section (everything, for an
        unsharded collection whose primary is moving)."""
        if coll is None:
            if (held := self._held_for_sharding(ns)) is not None:
                raise held
            return [(b"", b"\xff" * 16)] if self.migrations.primary_blocked(ns, reads=False) else []
        return self.migrations.blocked_ranges(ns, reads=False)

    def _owned_ranges(self, coll: Collection | None) -> list[tuple[bytes, bytes | None]]:
        if coll is None:
            return [(b"", None)]
        return [(c.min_key, c.max_key) for c in coll.chunks if c.shard == self.shard_id]

    def _owns(self, coll: Collection | None, skey: bytes) -> bool:
        return coll is None or coll.chunks[coll.chunk_index(skey)].shard == self.shard_id

    def _shard_key(self, coll: Collection | None, doc: dict) -> bytes:
        if coll is None:
            return UNSHARDED_KEY
        missing = [f for f in coll.pattern.fields if get_path(doc, f) is MISSING]
        if missing:
            raise CommandError(
                ErrorCode.ShardKeyNotFound, f"document is missing shard key field(s) {missing} of {coll.pattern.spec}"
            )
        try:
            key = coll.pattern.extract(doc)
            coll.pattern.check_size(key)
            return coll.pattern.encode_bound(key)
        except ShardKeyError as e:
            code = ErrorCode.ShardKeyTooLarge if isinstance(e, ShardKeyTooLarge) else ErrorCode.BadValue
            raise CommandError(code, str(e)) from None

    # ------------------------------------------------------------------ reads

    def _matching(self, coll: Collection | None, ns: str, flt: dict, hint: Any = None) -> Iterator[tuple[bytes, dict]]:
        """(shard key, document) of every owned document matching the filter, found by the plan
        `hint` asks for (None: the planner's choice).  The plan is chosen now: a bad filter or a
        hint naming no index (BadValue) is refused before the first document is read."""
        plan, access = self._query(coll, ns, flt, hint=hint)
        return query_plan.matching(plan, access)

    # ---- issue 15: the query planner (domain/planner.py, domain/query_plan.py) ------------------
    # Every read path (Find, Count, Explain, and the filters of Update, Delete, FindAndModify) plans
    # here: an index scan over a ready secondary index, the shard key's ranges (targeting), or the
    # owned ranges (COLLSCAN); the executor fetches, re-checks the filter and the ownership filter.

    def _ready_indexes(self, ns: str) -> list[planner.IndexInfo]:
        """The ready secondary indexes of `ns` (a building one misses documents)."""
        named = getattr(self.documents, "indexes", {}).get(ns, {})
        return [
            planner.IndexInfo(index.spec, bool(index.record.multikey))
            for index in named.values()
            if index.record.state == "ready"
        ]

    def _query(
        self,
        coll: Collection | None,
        ns: str,
        flt: dict,
        *,
        sort: dict | None = None,
        projection: dict | None = None,
        hint: Any = None,
    ) -> tuple[planner.Plan, query_plan.Access]:
        """The plan of a query and how it reaches this shard's documents: refusals (a bad filter, a
        critical section) now, the reading lazily.  A filter on `_id` by value is the IDHACK
        (`plan.hint == IDHACK`): at most one document, by its _id."""
        try:
            matcher = compile_filter(flt)
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        if coll is None and self.migrations.primary_blocked(ns, reads=True):
            raise self.migrations.critical_section_wait(ns, "a read")
        blocked = self.migrations.blocked_ranges(ns, reads=True) if coll is not None else []

        def location(doc: dict) -> bytes:
            return self.documents.get(id_key(ns, encode_value(doc["_id"]))) or b""

        def locate(doc_id: Any) -> bytes | None:
            return self.documents.get(id_key(ns, encode_value(doc_id)))

        # Ownership as of this request, not as of each getMore: a cursor opened before a
        # migration's commit goes on reading the moved range, whose deletion waits for it.
        owned_at_start = sorted(self._owned_ranges(coll))
        starts = [lo for lo, _ in owned_at_start]

        def owned(skey: bytes) -> bool:
            i = bisect.bisect_right(starts, skey) - 1
            if i < 0:
                return False
            hi = owned_at_start[i][1]
            return hi is None or skey < hi

        if "_id" in flt and not isinstance(flt["_id"], dict) and hint is None:  # fast path by _id
            hit = self.documents.find_by_id(ns, flt["_id"])
            if hit is not None and self._owns(coll, hit[0]) and matcher.matches(hit[1]):
                if any(lo <= hit[0] < hi for lo, hi in blocked):
                    raise self.migrations.critical_section_wait(ns, "a read")
            plan = self._choose(matcher, sort, projection, [], None, planner.IDHACK)
            return plan, query_plan.Access(self.documents, ns, lambda: [hit] if hit else [], location, owned)
        ranges = self._owned_ranges(coll)
        if coll is not None and (wanted := targeting.key_ranges(coll, matcher)) is not None:
            # Scan only where the filter can match: the critical section of another range,
            # and the rest of the shard's data, stay out of it.
            ranges = [
                (max(lo, w_lo), min(hi, w_hi))
                for lo, hi in ranges
                for w_lo, w_hi in wanted
                if max(lo, w_lo) < min(hi, w_hi)
            ]
        if any(
            lo < b_hi and b_lo < (hi if hi is not None else b"\xff" * 8) for lo, hi in ranges for b_lo, b_hi in blocked
        ):
            raise self.migrations.critical_section_wait(ns, "a read")

        def collscan() -> Iterator[tuple[bytes, dict]]:
            for lo, hi in ranges:
                for k, doc in self.documents.scan(ns, lo, hi):
                    yield shard_key_part(k, doc), doc

        shard_key = coll.pattern.spec if coll is not None else None
        plan = self._choose(matcher, sort, projection, self._ready_indexes(ns), shard_key, hint)
        access = query_plan.Access(self.documents, ns, collscan, location, owned, locate if coll is not None else None)
        return plan, access

    @staticmethod
    def _choose(matcher, sort, projection, indexes, shard_key, hint) -> planner.Plan:
        try:
            if hint == planner.IDHACK:
                return planner.Plan(matcher, sort, projection, None, hint=planner.IDHACK)
            return planner.choose(
                matcher, sort=sort, projection=projection, indexes=indexes, shard_key=shard_key, hint=hint
            )
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None

    # ---- end of issue 15's planner block ---------------------------------------------------------

    def _read_after(self, req: s.Find | s.Count) -> None:
        """Causal consistency (docs/decisions/0014): this shard is the single writer of its
        documents, so its state at its tip holds every write stamped up to its ClusterTime;
        advancing the clock to afterClusterTime is the no-op write that makes this read's
        operationTime cover it.  The catalog must be as new as the router's, though: the
        processor waited for it, and a read that still finds it behind is refused, not served."""
        after = vclock.parse_after_cluster_time(req.readConcern)
        if isinstance(req.readConcern, dict) and req.readConcern.get("level") == "snapshot":
            raise CommandError(
                ErrorCode.InvalidOptions,
                f'Command {req.type.lower()} does not support {{ readConcern: {{ level: "snapshot" }} }}',
            )
        if after is None:
            return
        if self.clock is not None:
            self.clock.advance(after)
        if req.routing is not None and req.routing.configTime > self.catalog.config_time:
            raise CommandError(
                ErrorCode.MaxTimeMSExpired,
                f"{self.shard_id}: catalog at ConfigTime {self.catalog.config_time} did not reach the router's "
                f"{req.routing.configTime} in time for a read after {vclock.LogicalTime.unpack(after)}",
            )

    @on_request.register(s.Find)
    def find(self, req: s.Find) -> Decision:
        if (at := vclock.parse_at_cluster_time(req.readConcern)) is not None:
            return self._find_at(req, at)
        self._read_after(req)
        transactions.refuse_read_if_prepared(self, req.ns)
        coll = self._placement(req.ns, req.routing)
        try:
            if req.projection is not None:
                apply_projection({}, req.projection)  # refuse a bad projection before reading anything
            plan, access = self._query(
                coll, req.ns, req.filter, sort=req.sort, projection=req.projection, hint=req.hint
            )
            # issue 15: the plan sorts (unless its index gives the order), skips, limits, projects
            docs = query_plan.run(plan, access, skip=req.skip, limit=req.limit)
            first = next(docs, None)  # starts the scan now: ownership and blocking as of this request
            docs = itertools.chain([first] if first is not None else [], docs)
            return Decision([], self._batch(docs, req.batchSize, req.ns))
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None

    def _find_at(self, req: s.Find, at: int) -> Decision:
        """A snapshot read at cluster time `at` (docs/decisions/0019): the committed documents
        as they were then, of the ranges this shard owned then.  Answered as a plain read, at
        the head of a batch: every write decided before is committed, and the clock advanced to
        `at` stamps every later one after it."""
        coll = self.catalog.collections.get(req.ns)
        if coll is not None:
            vclock.check_chunk_history(req.ns, at, coll.history_from)
        vclock.check_history_kept(at, self.documents.readable_from(req.ns))
        if req.routing is None:
            raise CommandError(ErrorCode.BadValue, "a shard serves only routed requests (send this to a router)")
        if req.routing.configTime > self.catalog.config_time:  # its routing history may lack a migration
            raise CommandError(
                ErrorCode.MaxTimeMSExpired,
                f"{self.shard_id}: catalog at ConfigTime {self.catalog.config_time} did not reach the router's "
                f"{req.routing.configTime} in time for a read at {vclock.LogicalTime.unpack(at)}",
            )
        if coll is not None and (
            req.routing.epoch != coll.epoch or req.routing.version != coll.shard_version(self.shard_id).pair
        ):
            # The router's catalog may lack a migration of this shard's ranges stamped at or before
            # `at`: it caught up to the end of config.events when it picked `at`, but a config
            # server whose clock had not seen `at` can stamp a commit at or before it afterwards
            # (seed 229).  It then targeted this donor and not the recipient, and our routing at
            # `at` leaves the range out: a read of nobody's.  As any routed read, StaleConfig; the
            # router catches up to our ConfigTime and targets again (MongoDB checks the shard
            # version of an atClusterTime read too).
            self._stale(req.ns, req.routing, coll)
        if (held := self.ddl.critical_section_wait(req.ns)) is not None:
            raise held
        transactions.refuse_read_if_prepared(self, req.ns, at)
        if self.clock is not None:
            self.clock.advance(at)
        try:
            matcher = compile_filter(req.filter)
            if req.projection is not None:
                apply_projection({}, req.projection)
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        ns = req.ns
        owned: list[tuple[bytes, bytes | None]] = (
            [(lo, hi) for lo, hi, shard in coll.routing_at(at) if shard == self.shard_id]
            if coll is not None
            else [(b"", None)]
        )

        def still_readable() -> None:
            """A cursor's later range is read after reclaim may have moved on (decisions/0019)."""
            vclock.check_history_kept(at, self.documents.readable_from(ns))

        def collscan() -> Iterator[tuple[bytes, dict]]:
            for lo, hi in owned:
                still_readable()
                for k, doc in self.documents.scan_at(ns, at, lo, hi):
                    yield shard_key_part(k, doc), doc
            if coll is not None and owned:
                # Documents written before the collection was sharded and not rekeyed yet (on its
                # primary): each where its shard key puts it, if this shard owned that then.
                still_readable()
                for _, doc in self.documents.scan_at(ns, at, UNSHARDED_KEY, UNSHARDED_END):
                    key = coll.pattern.encode_doc(doc)
                    if any(lo <= key and (hi is None or key < hi) for lo, hi in owned):
                        yield key, doc

        # A collection scan of the past: the secondary indexes hold only the latest entries.
        shard_key = coll.pattern.spec if coll is not None else None
        plan = self._choose(matcher, req.sort, req.projection, [], shard_key, None)
        try:
            docs = query_plan.run(plan, query_plan.Access(self.documents, ns, collscan), skip=req.skip, limit=req.limit)
            return Decision(self._noop_write_if_needed(at), self._batch(docs, req.batchSize, ns))
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None

    def _noop_write_if_needed(self, at: int) -> list[Record]:
        """A read at `at` ahead of every stamp logged here: the clock advanced to it only in
        memory, so a restart (or a standby taking over) would resume below it and could stamp a
        later write at or before `at`, changing what this read saw.  MongoDB writes a no-op to its
        oplog for such a read; so do we, in the read's batch, before its reply leaves."""
        if self.clock is None or at <= self.documents.max_ts:
            return []
        return [s.NoopWritten()]

    def _batch(self, docs: Iterator[dict], size: int, ns: str = "", config_time: int | None = None) -> dict:
        """Up to `size` documents and MAX_BATCH_BYTES (at least one document); the rest stays
        behind a cursor."""
        out, total = [], 0
        rest: dict | None = None
        for d in docs:
            n = record_bytes(d)
            if out and (len(out) >= size or total + n > MAX_BATCH_BYTES):
                rest = d
                break
            out.append(d)
            total += n
        if rest is None:
            return {"docs": out, "cursorId": 0}
        self._expire_cursors()
        cursor_id = next(self._cursor_ids)
        self.cursors[cursor_id] = Cursor(
            itertools.chain([rest], docs), ns, self.catalog.config_time if config_time is None else config_time
        )
        return {"docs": out, "cursorId": cursor_id}

    def _expire_cursors(self) -> None:
        now = time.monotonic()
        for cid in [cid for cid, c in self.cursors.items() if now - c.created > CURSOR_TIMEOUT_S]:
            del self.cursors[cid]

    def _queries_open_before(self, ns: str, config_time: int) -> int:
        """Queries of `ns` routed before `config_time` still open here (an abandoned cursor
        stops counting after the cursor timeout)."""
        self._expire_cursors()
        return sum(1 for c in self.cursors.values() if c.ns == ns and c.config_time < config_time)

    @on_request.register(s.GetMore)
    def get_more(self, req: s.GetMore) -> Decision:
        cursor = self.cursors.pop(req.cursorId, None)
        if cursor is None:
            raise CommandError(
                ErrorCode.CursorNotFound,
                f"cursor {req.cursorId} not found on {self.shard_id} (exhausted, expired, or the shard restarted)",
            )
        return Decision([], self._batch(cursor.docs, req.batchSize, cursor.ns, cursor.config_time))

    @on_request.register(s.Count)
    def count(self, req: s.Count) -> Decision:
        self._read_after(req)
        coll = self._placement(req.ns, req.routing)
        # issue 15: `{_id: 1}` lets a covered plan count from the index's keys, without fetching
        plan, access = self._query(coll, req.ns, req.filter, projection={"_id": 1}, hint=req.hint)
        return Decision([], {"n": sum(1 for _ in query_plan.matching(plan, access))})

    @on_request.register(s.Explain)
    def explain(self, req: s.Explain) -> Decision:
        """issue 15: this shard's plan for a query and its execution (MongoDB's explain, one shard's
        part: queryPlanner and executionStats)."""
        coll = self._placement(req.ns, req.routing)
        started = time.monotonic()
        stats = query_plan.ExecStats()
        try:
            if req.projection is not None:
                apply_projection({}, req.projection)
            plan, access = self._query(
                coll, req.ns, req.filter, sort=req.sort, projection=req.projection, hint=req.hint
            )
            if req.verbosity != "queryPlanner":
                for _ in query_plan.run(plan, access, skip=req.skip, limit=req.limit, stats=stats):
                    pass
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        counts = {**stats.as_dict(), "executionTimeMillis": int((time.monotonic() - started) * 1000)}
        out = planner.explain(plan, counts if req.verbosity != "queryPlanner" else None)
        out["queryPlanner"]["namespace"] = req.ns
        out["summary"] = planner.describe(plan)
        return Decision([], out)

    @on_request.register(s.CheckShardKey)
    def check_shard_key(self, req: s.CheckShardKey) -> Decision:
        """Whether this primary's documents of `ns`, unsharded, can be sharded by `req.key`: a
        collection sharded anyway would have its documents rekeyed on its next request, and one
        that cannot be keyed would refuse every request from then on."""
        try:
            pattern = KeyPattern.parse(req.key)
        except InvalidKeyPattern as e:
            raise CommandError(ErrorCode.InvalidOptions, f"invalid shard key: {e}") from None
        if req.ns in self.catalog.collections:
            return Decision([], {"documents": 0})  # sharded already: the config server answers
        docs = (doc for _, doc in self.documents.scan(req.ns, UNSHARDED_KEY, UNSHARDED_END))
        n = check_existing_documents(req.ns, pattern, req.unique, docs)
        self._sharding[req.ns] = self.wall() + SHARDING_HOLD_S
        return Decision([], {"documents": n})

    def _held_for_sharding(self, ns: str) -> CommandError | None:
        """The refusal of a write to unsharded `ns` while a shardCollection of it is being decided:
        retriable, as a critical section's (the next ConfigTime is its commit)."""
        end = self._sharding.get(ns)
        if end is None:
            return None
        if self.wall() >= end or ns in self.catalog.collections:
            del self._sharding[ns]
            return None
        return CommandError(
            ErrorCode.StaleConfig,
            f"{self.shard_id}: a write of {ns} waits for its shardCollection to be decided",
            {"shard": self.shard_id, "configTime": self.catalog.config_time + 1, "critical": True},
        )

    @on_request.register(s.SplitVector)
    def split_vector(self, req: s.SplitVector) -> Decision:
        """Split points of the chunk holding `find` from this shard's documents (docs/reference/auto-split.md)."""
        from domain import splitvector as autosplit

        coll = self.catalog.collections.get(req.ns)
        if coll is None:
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {req.ns!r} is not sharded")
        if (req.find is None) == (req.chunkMin is None):
            raise CommandError(
                ErrorCode.BadValue, "SplitVector needs exactly one of find (a document) and chunkMin (a bound)"
            )
        try:
            key = (
                coll.pattern.encode_doc(req.find)
                if req.find is not None
                else coll.pattern.encode_bound(from_ejson(req.chunkMin))
            )
        except (ShardKeyError, ValueError) as e:
            raise CommandError(ErrorCode.BadValue, f"{'find' if req.find is not None else 'chunkMin'}: {e}") from None
        chunk = coll.chunks[coll.chunk_index(key)]
        if chunk.shard != self.shard_id:
            raise CommandError(
                ErrorCode.StaleConfig,
                f"{self.shard_id} does not own that chunk",
                {"shard": self.shard_id, "configTime": self.catalog.config_time},
            )
        docs = [
            (to_ejson(coll.pattern.extract(d)), record_bytes(d))
            for _, d in self.documents.scan(req.ns, chunk.min_key, chunk.max_key)
        ]
        bounds = {"min": to_ejson(chunk.min), "max": to_ejson(chunk.max)}
        if req.median:
            point = autosplit.median_point(docs)
            return Decision(
                [],
                {
                    "chunk": bounds,
                    "points": [point] if point is not None else [],
                    "jumbo": point is None and len(docs) > 0,
                    "documents": len(docs),
                },
            )
        vector = autosplit.split_points(docs, req.maxChunkSizeBytes)
        points = vector.points
        if req.edge is not None and not vector.jumbo:  # the extreme key gets a chunk of its own
            points = autosplit.top_chunk(
                docs,
                points,
                chunk_min=bounds["min"],
                chunk_max=bounds["max"],
                is_bottom=req.edge == "bottom",
                is_top=req.edge == "top",
                hashed=coll.pattern.is_hashed,
            ).points
        return Decision(
            [],
            {
                "chunk": bounds,
                "points": points,
                "jumbo": vector.jumbo,
                "documents": len(docs),
                "bytes": sum(n for _, n in docs),
            },
        )

    # ----------------------------------------------------------------- writes

    @on_request.register(s.Insert)
    def insert(self, req: s.Insert) -> Decision:
        coll = self._placement(req.ns, req.routing)
        events: list[Record] = []
        errors: list[dict] = []
        seen: set[bytes] = set()
        stmt_ids = self._begun.write.stmt_ids if self._begun is not None else ()
        retried = 0
        for i, doc in enumerate(req.docs):
            stmt = stmt_ids[i] if stmt_ids else None
            if stmt is not None and self._retried(stmt) is not None:
                retried += 1  # inserted by an earlier attempt: answered as inserted, not DuplicateKey
                continue
            try:
                event = self._insert_one(coll, req.ns, doc, seen)
            except CommandError as e:
                if e.code == ErrorCode.StaleConfig:
                    raise  # the router re-targets the whole request
                errors.append({"index": i, "code": e.code, "errmsg": e.message, **_key_info(e)})
                if req.ordered:
                    break
                continue
            events.append(event)
            if stmt is not None:
                self._executed(stmt, req.ns, bytes.fromhex(event.skey), {"n": 1})
        # Pending writes are visible to later documents of this batch through the overlay,
        # but only the events decide what happens: apply nothing here.
        return Decision(events, {"inserted": len(events) + retried, "writeErrors": errors})

    def _insert_one(self, coll, ns: str, doc: Any, seen: set[bytes]) -> s.DocumentWritten:
        if coll is None and (held := self._held_for_sharding(ns)) is not None:
            raise held
        if not isinstance(doc, dict):
            raise CommandError(ErrorCode.BadValue, "a document must be a JSON object")
        doc = doc if "_id" in doc else {"_id": new_object_id(), **doc}
        check_document_size(doc)
        try:
            check_insert_document(doc)
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        skey = self._shard_key(coll, doc)
        if not self._owns(coll, skey):
            raise CommandError(
                ErrorCode.StaleConfig,
                f"{self.shard_id} does not own the chunk of {shell_form(doc['_id'])}",
                {"shard": self.shard_id, "configTime": self.catalog.config_time},
            )
        if (
            coll is not None
            and any(lo <= skey < hi for lo, hi in self.migrations.blocked_ranges(ns, reads=False))
            or coll is None
            and self.migrations.primary_blocked(ns, reads=False)
        ):
            raise self.migrations.critical_section_wait(ns, "a write")
        id_enc = encode_value(doc["_id"])
        existing = self.documents.find_by_id(ns, doc["_id"])
        if id_enc in seen or (existing is not None and self._owns(coll, existing[0])):  # an orphan is no duplicate
            raise duplicate_key(ns, "_id_", {"_id": doc["_id"]})
        if coll is not None and coll.unique:
            # Equal keys route to one shard, so this shard's check is the cluster's.  The key we
            # own, so every document under it is ours (no orphan); `seen` holds the batch's.
            unique = b"k" + skey
            if unique in seen or self.documents.has_shard_key(ns, skey):
                raise duplicate_key(ns, index_name(coll.pattern.spec), coll.pattern.extract(doc))
            seen.add(unique)
        self._check_indexes(ns, doc, seen)
        seen.add(id_enc)
        return s.DocumentWritten(ns=ns, skey=skey.hex(), doc=doc)

    def _check_indexes(self, ns: str, doc: dict, seen: set[bytes]) -> None:
        """A write of `doc` that a secondary index cannot take is refused: a document it cannot
        index, a second `_id` under a key of a ready unique index (DuplicateKey)."""
        if self.documents.indexes.get(ns):
            index_build.check_write(self.documents, ns, doc, seen, self._index_records)

    @on_request.register(s.Update)
    def update(self, req: s.Update) -> Decision:
        coll = self._placement(req.ns, req.routing)
        stmt = self._statement()
        if (done := self._retried(stmt)) is not None:
            return Decision([], {**done.result, "retried": True})
        decision, skey = self._update(coll, req)
        self._executed(stmt, req.ns, skey, dict(decision.result or {}))
        return decision

    def _update(self, coll: Collection | None, req: s.Update) -> tuple[Decision, bytes | None]:
        """The update's decision, and the shard key of the (first) document it matched or upserted."""
        events: list[Record] = []
        matched = modified = 0
        first: bytes | None = None
        seen: set[bytes] = set()  # the unique keys the update's documents take
        try:
            check_update(req.update, req.arrayFilters)  # refused whether or not anything matches, as MongoDB
            blocked = self._write_blocked(coll, req.ns)
            for skey, doc in self._update_targets(coll, req):
                if any(lo <= skey < hi for lo, hi in blocked):
                    raise self.migrations.critical_section_wait(req.ns, "an update")
                matched += 1
                first = skey if first is None else first
                # Copy-on-write, comparing only the written fields (MongoDB equality: true is not 1).
                if (new := update_stored(doc, req.update, req.arrayFilters, req.filter)) is not None:
                    self._check_key_unchanged(coll, skey, doc, new)
                    check_document_size(new)
                    self._check_indexes(req.ns, new, seen)
                    events.append(s.DocumentWritten(ns=req.ns, skey=skey.hex(), doc=new))
                    modified += 1
                if not req.multi:
                    break
            if matched == 0 and req.upsert:
                new = upsert_document(req.filter, req.update, req.arrayFilters)
                new = new if "_id" in new else {"_id": new_object_id(), **new}
                event = self._insert_one(coll, req.ns, new, set())
                return Decision([event], {"matched": 0, "modified": 0, "upsertedId": new["_id"]}), bytes.fromhex(
                    event.skey
                )
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        return Decision(events, {"matched": matched, "modified": modified}), first

    def _update_targets(self, coll: Collection | None, req: s.Update) -> Iterator[tuple[bytes, dict]]:
        """The documents an update changes, in order; with a sort (an updateOne's, MongoDB 8.0),
        the first matching document in that order alone."""
        if not req.sort:
            return self._matching(coll, req.ns, req.filter, req.hint)
        first = self._first_match(coll, req.ns, req.filter, req.sort, req.hint)
        return iter([first] if first is not None else [])

    def _first_match(
        self, coll: Collection | None, ns: str, flt: dict, sort: dict | None, hint: Any
    ) -> tuple[bytes, dict] | None:
        """(shard key, document) of the first matching document in `sort` order (any, without
        one); an index may give the order, a hint picks the plan, as a find's."""
        plan, access = self._query(coll, ns, flt, sort=sort, hint=hint)
        matching = query_plan.matching(plan, access)
        if sort and not plan.sort_provided:
            return min(matching, key=lambda hit: sort_key(sort)(hit[1]), default=None)
        return next(matching, None)

    def _check_key_unchanged(self, coll, skey: bytes, old: dict, new: dict) -> None:
        if coll is None:
            return
        if any(_enc(get_path(old, f)) != _enc(get_path(new, f)) for f in coll.pattern.fields):
            raise CommandError(
                ErrorCode.ImmutableField,
                f"an update may not change the shard key {coll.pattern.spec} (document {json.dumps(to_record(old.get('_id')))})",
            )

    @on_request.register(s.Delete)
    def delete(self, req: s.Delete) -> Decision:
        coll = self._placement(req.ns, req.routing)
        stmt = self._statement()
        if (done := self._retried(stmt)) is not None:
            return Decision([], {**done.result, "retried": True})
        events: list[s.DocumentRemoved] = []
        blocked = self._write_blocked(coll, req.ns)
        for skey, doc in self._matching(coll, req.ns, req.filter, req.hint):
            if any(lo <= skey < hi for lo, hi in blocked):
                raise self.migrations.critical_section_wait(req.ns, "a delete")
            events.append(s.DocumentRemoved(ns=req.ns, skey=skey.hex(), id=doc["_id"]))
            if not req.multi:
                break
        result = {"deleted": len(events)}
        self._executed(stmt, req.ns, bytes.fromhex(events[0].skey) if events else None, result)
        return Decision(list(events), result)

    @on_request.register(s.FindAndModify)
    def find_and_modify(self, req: s.FindAndModify) -> Decision:
        """The first matching document in sort order, updated, replaced or removed, returned
        before or after; a retry returns the recorded image (projected as asked now)."""
        coll = self._placement(req.ns, req.routing)
        check_find_and_modify(req)
        if (done := self._retried(0)) is not None:
            return Decision([], {**_fam_reply(done.image, done.result, req.fields), "retried": True})
        try:
            if req.fields is not None:
                apply_projection({}, req.fields)  # a bad projection is refused before writing
            if req.update is not None:
                check_update(req.update, req.arrayFilters)  # refused whether or not anything matches
            decision, skey, image, last_error = self._find_and_modify(coll, req)
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
        self._executed(0, req.ns, skey, last_error, image)
        decision.result = _fam_reply(image, last_error, req.fields)
        return decision

    def _find_and_modify(
        self, coll: Collection | None, req: s.FindAndModify
    ) -> tuple[Decision, bytes | None, dict | None, dict]:
        """(decision, shard key of the document, the image to return, lastErrorObject)."""
        blocked = self._write_blocked(coll, req.ns)
        found = self._first_match(coll, req.ns, req.query, req.sort, req.hint)
        if found is not None:
            skey, doc = found
            if any(lo <= skey < hi for lo, hi in blocked):
                raise self.migrations.critical_section_wait(req.ns, "a findAndModify")
            if req.remove:
                return (
                    Decision([s.DocumentRemoved(ns=req.ns, skey=skey.hex(), id=doc["_id"])]),
                    skey,
                    doc,
                    {"n": 1},
                )
            assert req.update is not None
            new = apply_update(doc, req.update, array_filters=req.arrayFilters, match_filter=req.query)
            events: list[Record] = []
            if encode_value(new) != encode_value(doc):
                self._check_key_unchanged(coll, skey, doc, new)
                check_document_size(new)
                self._check_indexes(req.ns, new, set())
                events.append(s.DocumentWritten(ns=req.ns, skey=skey.hex(), doc=new))
            return Decision(events), skey, new if req.new else doc, {"n": 1, "updatedExisting": True}
        if req.upsert and req.update is not None:
            new = upsert_document(req.query, req.update, req.arrayFilters)
            new = new if "_id" in new else {"_id": new_object_id(), **new}
            event = self._insert_one(coll, req.ns, new, set())
            last_error = {"n": 1, "updatedExisting": False, "upserted": new["_id"]}
            return Decision([event]), bytes.fromhex(event.skey), new if req.new else None, last_error
        return Decision([]), None, None, {"n": 0} if req.remove else {"n": 0, "updatedExisting": False}


def index_name(spec: dict[str, Any]) -> str:
    """MongoDB's default name of an index on `spec`: `email_1`, `a_1_b_1`, `x_hashed`."""
    return "_".join(f"{f}_{k}" for f, k in spec.items())


def duplicate_key(ns: str, index: str, key: dict[str, Any]) -> CommandError:
    """MongoDB's DuplicateKey: `E11000 duplicate key error collection: db.c index: email_1 dup key: { email: "c" }`,
    for the `_id_` index or a unique shard key's (secondary indexes: index_build.check_write);
    one shape for every index (domain.indexes.duplicate_key_error)."""
    spec = ID_INDEX if index == ID_INDEX.name else IndexSpec.make(index, tuple((f, 1) for f in key), unique=True)
    return duplicate_key_error(ns, spec, tuple(key.values()))


def check_existing_documents(ns: str, pattern: KeyPattern, unique: bool, docs: Iterable[dict]) -> int:
    """How many documents there are, each keyable by `pattern` (a missing field is null, as in
    MongoDB 4.4+), or MongoDB's refusal of the first that is not: an array is what makes the
    shard key's index multikey (InvalidOptions), a key too large as an insert's, and with
    `unique` a second document with a key value is the unique index's build failing."""
    keys: set[bytes] = set()
    n = 0
    for doc in docs:
        n += 1
        doc_id = json.dumps(to_record(doc.get("_id")))
        try:
            key = pattern.extract(doc)
            pattern.check_size(key)
            encoded = pattern.encode_bound(key)
        except ShardKeyTooLarge as e:
            raise CommandError(ErrorCode.ShardKeyTooLarge, f"document {{ _id: {doc_id} }}: {e}") from None
        except ShardKeyError as e:
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"couldn't find valid index for shard key {json.dumps(pattern.spec)}: document "
                f"{{ _id: {doc_id} }} in {ns}: {e}",
            ) from None
        if unique:
            if encoded in keys:
                raise duplicate_key(ns, index_name(pattern.spec), key)
            keys.add(encoded)
    return n


def check_find_and_modify(req: s.FindAndModify) -> None:
    """MongoDB's refusals of a findAndModify's options (FailedToParse)."""
    if req.remove and req.update is not None:
        raise CommandError(ErrorCode.FailedToParse, "Cannot specify both an update and remove=true")
    if not req.remove and req.update is None:
        raise CommandError(ErrorCode.FailedToParse, "Either an update or remove=true must be specified")
    if req.remove and req.upsert:
        raise CommandError(ErrorCode.FailedToParse, "Cannot specify both upsert=true and remove=true")
    if req.remove and req.new:
        raise CommandError(
            ErrorCode.FailedToParse,
            "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document",
        )


def _fam_reply(image: dict | None, last_error: dict, fields: dict | None) -> dict:
    """findAndModify's reply: the document (projected) or null, and its lastErrorObject."""
    value = apply_projection(image, fields) if image is not None and fields is not None else image
    return {"value": value, "lastErrorObject": last_error}


def _key_info(e: CommandError) -> dict[str, Any]:
    """A DuplicateKey's keyPattern and keyValue, for its writeErrors element."""
    return {k: e.info[k] for k in ("keyPattern", "keyValue") if e.info and k in e.info}


def _enc(v: Any) -> bytes:
    return b"" if v is MISSING else encode_value(v)


def _snapshot(req: Record) -> bool:
    rc = getattr(req, "readConcern", None)
    return isinstance(req, s.Find) and isinstance(rc, dict) and rc.get("level") == "snapshot"
