"""The router's side of multi-document transactions (issue 33, docs/decisions/0020): per
session, the open transaction — its number, its snapshot `readAt`, its participants in the
order first reached and which of them wrote — as pure transitions of `SessionTxn`, and the thin
driver (`TransactionRouter`) that sends participants their `AbortTransaction` /
`CommitTransaction`.

    state         statement (start)        statement (continue)   commit                     abort
    (none)        -> in-progress           NoSuchTransaction      NoSuchTransaction          NoSuchTransaction
    in-progress   newer: abort it, start   -> in-progress (+shard) -> committed / aborted    -> aborted
    committed     newer: start             TransactionCommitted   committed (a retry: ok)    TransactionCommitted
    aborted       newer: start             NoSuchTransaction      NoSuchTransaction          NoSuchTransaction

A lower txnNumber than the session's is TransactionTooOld; startTransaction on the session's
current number is ConflictingOperationInProgress (mongos's answers).  Any error of a statement
aborts the transaction on every participant (as mongos does).  Commit: no writer, ok at once
(read-only participants are ended with an abort); one writer, CommitTransaction to it; more,
two-phase commit: CoordinateCommitTransaction to the first writer (the recoveryToken's shard),
asked again until it has decided.  A commit this router never saw (another router ran the
transaction) asks the recoveryToken's shard for the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import shard as s

log = logging.getLogger(__name__)

# How long a commit waits for two-phase commit's decision before answering that its result is
# unknown (the client asks again: the coordinator keeps deciding meanwhile).
COMMIT_DECISION_WAIT_S = 30.0
# The first ask for two-phase commit's decision comes after its prepares could have answered:
# each ask is a batch on the coordinator's shard, and asked too early they queue ahead of the
# coordinator's own steps (a decision recorded in 45 ms with 2 ms asks, 10 ms with 60 ms).
FIRST_DECISION_POLL_S = 0.03


class TxnState(enum.Enum):
    IN_PROGRESS = "in-progress"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Participant:
    shard: str
    wrote: bool = False


@dataclass(frozen=True)
class TxnArgs:
    """A command's transaction fields (services/router/wire/transactions.py parses them)."""

    txn_number: int
    start: bool = False
    read_concern: dict[str, Any] | None = None  # only on the first statement


@dataclass(frozen=True)
class SessionTxn:
    """One session's latest transaction, as this router knows it."""

    lsid: str
    txn_number: int
    read_at: int
    state: TxnState = TxnState.IN_PROGRESS
    participants: tuple[Participant, ...] = ()

    @property
    def writers(self) -> tuple[str, ...]:
        return tuple(p.shard for p in self.participants if p.wrote)

    @property
    def recovery_shard(self) -> str | None:
        """The first shard written to: the client's recoveryToken names it (decision 0020)."""
        return next(iter(self.writers), None)

    def txn(self) -> s.Txn:
        return s.Txn(lsid=self.lsid, txnNumber=self.txn_number, readAt=self.read_at)


# ------------------------------------------------------------------ pure transitions


def no_such_transaction(txn_number: int, why: str) -> CommandError:
    return CommandError(ErrorCode.NoSuchTransaction, f"Transaction with {{ txnNumber: {txn_number} }} {why}")


def committed_error(txn_number: int) -> CommandError:
    return CommandError(
        ErrorCode.TransactionCommitted, f"Transaction with {{ txnNumber: {txn_number} }} has been committed."
    )


def _too_old(lsid: str, txn_number: int, current: int) -> CommandError:
    return CommandError(
        ErrorCode.TransactionTooOld,
        f"txnNumber {txn_number} is less than last txnNumber {current} seen in session {lsid}",
    )


def begins(current: SessionTxn | None, lsid: str, args: TxnArgs) -> SessionTxn | None:
    """Check a statement against the session's transaction: the transaction a start supersedes
    (to abort, if still open) is returned; raises MongoDB's error for a statement out of turn.
    A start is then made with `started`, a continuation reads `current`."""
    if current is not None and args.txn_number < current.txn_number:
        raise _too_old(lsid, args.txn_number, current.txn_number)
    if args.start:
        if current is not None and args.txn_number == current.txn_number:
            raise CommandError(
                ErrorCode.ConflictingOperationInProgress,
                f"txnNumber {args.txn_number} for session {lsid} already started",
            )
        return current if current is not None and current.state is TxnState.IN_PROGRESS else None
    if current is None or args.txn_number > current.txn_number:
        raise no_such_transaction(
            args.txn_number, f"cannot be continued on session {lsid}: it was never started (startTransaction)"
        )
    if current.state is TxnState.COMMITTED:
        raise committed_error(args.txn_number)
    if current.state is TxnState.ABORTED:
        raise no_such_transaction(args.txn_number, "has been aborted.")
    return None


def resent_start(current: SessionTxn | None, txn_number: int) -> int | None:
    """The client library's start of a transaction this router already started, sent again
    because its answer was lost: the snapshot it was given (the client has run nothing in it
    yet, so the same one serves).  None: not a resend.  (The wire's second startTransaction is
    refused: drivers never resend one.)"""
    if (
        current is not None
        and current.txn_number == txn_number
        and current.state is TxnState.IN_PROGRESS
        and not current.participants
    ):
        return current.read_at
    return None


def started(lsid: str, args: TxnArgs, read_at: int) -> SessionTxn:
    return SessionTxn(lsid=lsid, txn_number=args.txn_number, read_at=read_at)


def reached(txn: SessionTxn, shard: str, wrote: bool) -> SessionTxn:
    """`txn` after a statement reached `shard` (and wrote there or not).  A second shard that
    wrote makes the commit a two-phase one."""
    known = next((p for p in txn.participants if p.shard == shard), None)
    if known is None:
        return replace(txn, participants=(*txn.participants, Participant(shard, wrote)))
    if wrote and not known.wrote:
        return replace(
            txn, participants=tuple(Participant(p.shard, p.wrote or p.shard == shard) for p in txn.participants)
        )
    return txn


def ended(txn: SessionTxn, state: TxnState) -> SessionTxn:
    return replace(txn, state=state)


@dataclass(frozen=True)
class CommitPlan:
    writers: tuple[str, ...]  # one: it commits; more: two-phase commit, coordinated by the first
    end: tuple[str, ...]  # read-only participants: ended with an abort (nothing to commit there)
    recovering: bool = False  # this router never saw the transaction: its recoveryToken names the coordinator


def commit_plan(current: SessionTxn | None, txn_number: int, token: Any = None) -> CommitPlan:
    """What committing `txn_number` takes; MongoDB's error for a commit out of turn.  A retried
    commit of a committed transaction asks again (the writer, or the coordinator, answers the
    same).  A commit of a transaction this router does not know (another router ran it, or
    this one restarted) asks the shard its recoveryToken names for the outcome."""
    if current is None or txn_number > current.txn_number:
        return CommitPlan((_recovery_shard(token, txn_number),), (), recovering=True)
    txn = _this(current, txn_number)
    if txn.state is TxnState.ABORTED:
        raise no_such_transaction(txn_number, "has been aborted.")
    end = () if txn.state is TxnState.COMMITTED else tuple(p.shard for p in txn.participants if not p.wrote)
    return CommitPlan(txn.writers, end)


def _recovery_shard(token: Any, txn_number: int) -> str:
    """The shard a client's recoveryToken names, or mongos's error for a token without one."""
    if token is None:
        raise CommandError(
            "Location50940",
            f"Cannot recover the transaction decision without a recoveryToken (txnNumber {txn_number})",
        )
    shard = token.get("recoveryShardId") if isinstance(token, dict) else None
    if not isinstance(shard, str) or not shard:
        raise no_such_transaction(
            txn_number,
            "is unknown here and its recovery token is empty, meaning the transaction only performed "
            "reads and can be safely retried",
        )
    return shard


def recovered(lsid: str, txn_number: int, coordinator: str) -> SessionTxn:
    """What a recovered commit teaches: the transaction committed (asking again asks its
    recovery shard again, which answers the same)."""
    return SessionTxn(lsid, txn_number, 0, TxnState.COMMITTED, (Participant(coordinator, True),))


def abort_plan(current: SessionTxn | None, txn_number: int) -> tuple[str, ...]:
    """The participants to abort `txn_number` on; MongoDB's error for an abort out of turn."""
    txn = _this(current, txn_number)
    if txn.state is TxnState.COMMITTED:
        raise committed_error(txn_number)
    if txn.state is TxnState.ABORTED:
        raise no_such_transaction(txn_number, "has been aborted.")
    return tuple(p.shard for p in txn.participants)


def _this(current: SessionTxn | None, txn_number: int) -> SessionTxn:
    if current is not None and txn_number < current.txn_number:
        raise _too_old(current.lsid, txn_number, current.txn_number)
    if current is None or txn_number != current.txn_number:
        raise no_such_transaction(txn_number, "is unknown: no known command has been sent by this router for it")
    return current


def wrote(req: Any, result: dict[str, Any]) -> bool:
    """Whether a shard's reply to a statement says it wrote there (its writes wait aside)."""
    if isinstance(req, s.Insert):
        return bool(result.get("inserted"))
    if isinstance(req, s.Update):
        return bool(result.get("matched")) or "upsertedId" in result
    if isinstance(req, s.Delete):
        return bool(result.get("deleted"))
    if isinstance(req, s.FindAndModify):
        return bool((result.get("lastErrorObject") or {}).get("n"))
    return False


READ_CONCERN_LEVELS = ("local", "majority", "snapshot")


def check_read_concern(rc: Any) -> dict[str, Any]:
    """A transaction's read concern (its first statement's), refused as MongoDB refuses it."""
    if not isinstance(rc, dict):
        raise CommandError(ErrorCode.TypeMismatch, "BSON field 'readConcern' is the wrong type, expected type 'object'")
    if rc.get("level", "local") not in READ_CONCERN_LEVELS:
        raise CommandError(
            ErrorCode.InvalidOptions,
            "The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run "
            "in a transaction",
        )
    if "atClusterTime" in rc and rc.get("level") != "snapshot":
        raise CommandError(ErrorCode.InvalidOptions, "readConcern atClusterTime is only allowed with level 'snapshot'")
    return rc


def read_at(read_concern: dict[str, Any] | None) -> dict[str, Any]:
    """The snapshot read concern the first statement's `readAt` is chosen by (decision 0019's
    rule: the client's atClusterTime, else the router's time, after any afterClusterTime):
    every level a transaction takes reads at one snapshot here."""
    rc = read_concern or {}
    return {"level": "snapshot", **{k: rc[k] for k in ("atClusterTime", "afterClusterTime") if k in rc}}


# ------------------------------------------------------------------ the driver

# The statement being run in a transaction, for OperationRouter: it stamps `txn` on what it
# sends and notes which shards each part reached.
current_statement: contextvars.ContextVar[Statement | None] = contextvars.ContextVar("txn_statement", default=None)

Ask = Callable[[str, Any], Awaitable[dict]]


@dataclass
class Statement:
    """One command's run inside a transaction."""

    router: TransactionRouter
    lsid: str
    txn: s.Txn

    def reached(self, shard: str, req: Any, result: dict[str, Any] | None) -> None:
        """A part of this statement reached `shard` (result None: it failed there)."""
        self.router.reached(self.lsid, shard, result is not None and wrote(req, result))

    def recovery_token(self) -> dict[str, Any]:
        txn = self.router.sessions.get(self.lsid)
        shard = txn.recovery_shard if txn is not None else None
        return {"recoveryShardId": shard} if shard is not None else {}


@dataclass
class TransactionRouter:
    """Per-session transactions of one router; `ask(shard, request)` is OperationRouter._ask."""

    ask: Ask
    sessions: dict[str, SessionTxn] = field(default_factory=dict)
    # sessions being started: their lock and how many starts hold or wait for it
    _starts: dict[str, tuple[asyncio.Lock, list[int]]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def starting(self, lsid: str) -> AsyncIterator[None]:
        """Hold the session's start: the client library's starts of one session one at a time."""
        lock, users = self._starts.setdefault(lsid, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._starts[lsid]

    async def begin(self, lsid: str, args: TxnArgs, snapshot: Callable[[dict], Awaitable[int]]) -> Statement:
        """Check a statement and open its transaction if it starts one (`snapshot(rc)`: the
        readAt a read concern picks); the statement to run the command in."""
        superseded = begins(self.sessions.get(lsid), lsid, args)
        if superseded is not None:  # a newer transaction of the session: the old one ends everywhere
            await self._abort_on(superseded, tuple(p.shard for p in superseded.participants))
            self.sessions[lsid] = ended(superseded, TxnState.ABORTED)
        if args.start:
            self.sessions[lsid] = started(lsid, args, await snapshot(read_at(args.read_concern)))
        return Statement(self, lsid, self.sessions[lsid].txn())

    def continues(self, txn: s.Txn) -> Statement:
        """A statement of a transaction the client library started (StartTransaction) and names
        by its `txn`: it must be this router's open one, at the snapshot it was given."""
        begins(self.sessions.get(txn.lsid), txn.lsid, TxnArgs(txn.txnNumber))
        current = self.sessions[txn.lsid]
        if current.read_at != txn.readAt:
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"transaction {txn.txnNumber} reads at {current.read_at}, not at {txn.readAt}",
            )
        return Statement(self, txn.lsid, current.txn())

    async def run(self, statement: Statement, fn: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Run a command as `statement`: what it sends carries the transaction; its error (or a
        write error in its reply, as mongod's: bulkWrite counts its `nErrors`) aborts the
        transaction on every participant."""
        token = current_statement.set(statement)
        try:
            result = await fn()
        except Exception:
            await self.failed(statement)
            raise
        finally:
            current_statement.reset(token)
        if result.get("writeErrors") or result.get("nErrors"):  # (bulkWrite's are in its cursor)
            await self.failed(statement)
        return result

    def reached(self, lsid: str, shard: str, did_write: bool) -> None:
        txn = self.sessions.get(lsid)
        if txn is None:
            return
        self.sessions[lsid] = reached(txn, shard, did_write)

    async def failed(self, statement: Statement) -> None:
        """A statement's error: the transaction aborts on every participant (mongos's rule)."""
        txn = self.sessions.get(statement.lsid)
        if txn is None or txn.txn_number != statement.txn.txnNumber or txn.state is not TxnState.IN_PROGRESS:
            return
        self.sessions[statement.lsid] = ended(txn, TxnState.ABORTED)
        await self._abort_on(txn, tuple(p.shard for p in txn.participants))

    async def commit(self, lsid: str, txn_number: int, token: Any = None) -> dict[str, Any]:
        current = self.sessions.get(lsid)
        plan = commit_plan(current, txn_number, token)
        if plan.recovering:
            await self._outcome(plan.writers[0], s.CoordinateCommitTransaction(lsid=lsid, txnNumber=txn_number))
            self.sessions[lsid] = recovered(lsid, txn_number, plan.writers[0])
            return {}
        assert current is not None
        await self._abort_on(current, plan.end)  # read-only: nothing to commit there
        try:
            if len(plan.writers) == 1:
                await self.ask(plan.writers[0], s.CommitTransaction(lsid=lsid, txnNumber=txn_number))
            elif plan.writers:
                coordinate = s.CoordinateCommitTransaction(
                    lsid=lsid, txnNumber=txn_number, participants=list(plan.writers)
                )
                await self._outcome(plan.writers[0], coordinate)
        except CommandError as e:
            if not unknown_commit_result(e.code):  # refused: the transaction is over everywhere
                self.sessions[lsid] = ended(current, TxnState.ABORTED)
                await self._abort_on(current, tuple(p.shard for p in current.participants))
            raise
        self.sessions[lsid] = ended(current, TxnState.COMMITTED)
        return {}

    async def _outcome(self, coordinator: str, req: s.CoordinateCommitTransaction) -> None:
        """Two-phase commit's outcome from its coordinator: asked again (without the
        participants) until it has decided; an abort is NoSuchTransaction, as mongos answers;
        no decision within COMMIT_DECISION_WAIT_S is an unknown commit result."""
        deadline = time.monotonic() + COMMIT_DECISION_WAIT_S
        pause = FIRST_DECISION_POLL_S
        while True:
            result = await self.ask(coordinator, req)
            decision = result.get("decision")
            if decision == "commit":
                return
            if decision == "abort":
                raise no_such_transaction(req.txnNumber, f"has been aborted ({result.get('why', '')}).")
            if time.monotonic() > deadline:
                raise CommandError(
                    ErrorCode.ExceededTimeLimit,
                    f"the coordinator {coordinator} of transaction {req.txnNumber} has not decided within "
                    f"{COMMIT_DECISION_WAIT_S:.0f} s",
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
            req = s.CoordinateCommitTransaction(lsid=req.lsid, txnNumber=req.txnNumber)

    async def abort(self, lsid: str, txn_number: int) -> dict[str, Any]:
        current = self.sessions.get(lsid)
        shards = abort_plan(current, txn_number)
        assert current is not None
        self.sessions[lsid] = ended(current, TxnState.ABORTED)
        await self._abort_on(current, shards)
        return {}

    def forget(self, lsids: list[str]) -> None:
        """Ended sessions (endSessions / killSessions) take their transaction with them (an
        open one is left to the shards' lifetime reaper)."""
        for lsid in lsids:
            self.sessions.pop(lsid, None)

    async def _abort_on(self, txn: SessionTxn, shards: tuple[str, ...]) -> None:
        """AbortTransaction to each shard; best effort: a shard that does not know the
        transaction (never wrote there, or already ended) is fine, and one that does not answer
        aborts it at its lifetime limit."""
        for shard in shards:
            try:
                await self.ask(shard, s.AbortTransaction(lsid=txn.lsid, txnNumber=txn.txn_number))
            except CommandError as e:
                if e.code != ErrorCode.NoSuchTransaction:
                    log.warning("abort of transaction %s:%d on %s: %s", txn.lsid, txn.txn_number, shard, e)


# Failures after which nobody knows whether a commit was applied: the client retries it
# (UnknownTransactionCommitResult), and the writer answers a retried commit the same.
UNKNOWN_COMMIT_RESULT = frozenset(
    {
        ErrorCode.ShardUnavailable,
        ErrorCode.Timeout,
        ErrorCode.KafkaUnavailable,
        ErrorCode.NetworkTimeout,
        ErrorCode.HostUnreachable,
        ErrorCode.MaxTimeMSExpired,
        ErrorCode.ExceededTimeLimit,
        ErrorCode.ShutdownInProgress,
        ErrorCode.PrimarySteppedDown,
        ErrorCode.InterruptedDueToReplStateChange,
    }
)


def unknown_commit_result(code: str) -> bool:
    return code in UNKNOWN_COMMIT_RESULT
