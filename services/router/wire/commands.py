"""The commands a router answers on its own, with no Kafka: the handshake (`hello` and its
legacy spellings) and the server commands drivers and `mongosh` send on connect.  A table
from command name to handler, like `libs.dispatch.Dispatch` but keyed by the command's name
(the first key of the command document) rather than by record type, since a wire command
arrives as a BSON document, not as a record.  Issue 14 adds CRUD and the admin commands
here, each handler calling the router (`OperationRouter.handle`) or the config server.

A handler is ``async def handler(conn, cmd) -> dict``: `conn` is the connection's state
(:class:`Connection`), `cmd` the command document (OP_MSG sequences already folded in,
`$db` present).  It returns the reply's fields (``ok: 1`` is added) or raises
:class:`WireCommandError` / `libs.commands.CommandError`; anything else is an InternalError
reply, logged.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, StatusCode

from domain.bsonvalues import type_name
from domain.protocol import ErrorCode
from libs import tracing
from libs.errors import CommandError
from services.router.wire.frames import (
    COMPRESSORS,
    MAX_BSON_OBJECT_SIZE,
    MAX_MESSAGE_SIZE_BYTES,
    MAX_WRITE_BATCH_SIZE,
)
from services.router.wire.gossip import reply_cluster_time, reply_timestamp, wire_cluster_time
from services.router.wire.options import HONOURED, Fields, check_generic, max_time_ms, write_concern_error

if TYPE_CHECKING:
    from services.router.wire.edge import RouterEdge

# What we tell drivers we are.  Wire version 25 is MongoDB 8.0 (the current long-term-support
# release): every driver that can talk to 8.0 can talk to us, and nothing newer is promised.
# pymongo 4.20 and the Node driver 7.x accept 9 (4.4) to 29 (9.0).
MIN_WIRE_VERSION = 0
MAX_WIRE_VERSION = 25
COMPATIBLE_VERSION = "8.0.0"  # buildInfo.version: the MongoDB release whose behaviour we follow
FEATURE_COMPATIBILITY_VERSION = "8.0"
SHARDLOG_VERSION = "0.1.0"

# Commands a driver never compresses (OP_COMPRESSED spec); their replies are not compressed either.
NO_COMPRESSION = frozenset(
    {
        "hello",
        "ismaster",
        "saslstart",
        "saslcontinue",
        "getnonce",
        "authenticate",
        "createuser",
        "updateuser",
        "copydbsaslstart",
        "copydbgetnonce",
        "copydb",
    }
)

# MongoDB's numbers and names for the codes used here that domain.protocol.ErrorCode lacks.
UNAUTHORIZED = (13, "Unauthorized")
CLIENT_METADATA_CANNOT_BE_MUTATED = (186, "ClientMetadataCannotBeMutated")
UNSUPPORTED_OP_QUERY_COMMAND = (352, "UnsupportedOpQueryCommand")
MISSING_DB = (40571, "Location40571")  # "OP_MSG requests require a $db argument"


class WireCommandError(Exception):
    """An `{ok: 0}` reply: MongoDB's code number and name, and the message."""

    def __init__(self, code: tuple[int, str], message: str) -> None:
        super().__init__(message)
        self.code, self.code_name = code
        self.message = message

    @classmethod
    def of(cls, code: ErrorCode, message: str) -> WireCommandError:
        return cls((code.number or ErrorCode.InternalError.number or 1, str(code)), message)


def error_reply(code: int, code_name: str, message: str) -> dict[str, Any]:
    """MongoDB's shape of a failed command."""
    return {"ok": 0.0, "errmsg": message, "code": code, "codeName": code_name}


@dataclass
class Connection:
    """One client connection's state, as the command handlers see it."""

    id: int  # hello's connectionId
    peer: str  # "host:port" (whatsmyuri)
    compressors: tuple[str, ...] = ()  # what this server offers
    handshake_done: bool = False
    client: dict[str, Any] | None = None  # the handshake's client metadata
    compressor: str | None = None  # negotiated: what the server compresses replies with
    opened: float = field(default_factory=time.monotonic)
    edge: RouterEdge | None = None  # the router's parts; None in the Kafka-less skeleton
    command: str = ""  # the name of the command being answered
    operation_time: int = 0  # the command being answered: the largest operationTime of what it ran

    def cluster(self) -> RouterEdge:
        """The router's parts, for a command that needs the cluster."""
        if self.edge is None:
            raise WireCommandError.of(
                ErrorCode.CommandNotFound,
                f"no such command: '{self.command}' (this wire server is not attached to a cluster)",
            )
        return self.edge


Handler = Callable[[Connection, dict[str, Any]], Awaitable[dict[str, Any]]]
# How a command that carries transaction fields runs (services/router/wire/transactions.py):
# (conn, name, cmd, run the handler on a command) -> reply
InTransaction = Callable[
    [Connection, str, dict[str, Any], Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]],
    Awaitable[dict[str, Any]],
]


@dataclass(frozen=True)
class Entry:
    handler: Handler
    admin_only: bool  # MongoDB refuses it outside the admin database
    # the fields the command defines (services/router/wire/options.py), checked before it runs;
    # None: the handler's parser checks them itself (the admin commands: domain/sharding_commands.py)
    fields: Fields | None = None


# A driver's monitoring sends these every few seconds on every connection: not operations, no trace.
UNTRACED = frozenset({"hello", "isMaster", "ismaster"})


def _namespace(db: str, target: Any) -> str:
    """db.coll when the command names a collection (insert: "c"), else the database."""
    return f"{db}.{target}" if isinstance(target, str) and target else db


class CommandTable:
    """Command name -> handler.  Names match exactly, as in MongoDB, where legacy spellings
    (`isMaster`/`ismaster`, `buildInfo`/`buildinfo`) are registered as aliases."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.table: dict[str, Entry] = {}
        self.transactions: InTransaction | None = None  # set by wire/transactions.py

    def register(
        self, *names: str, admin_only: bool = False, fields: Fields | None = None
    ) -> Callable[[Handler], Handler]:
        def add(fn: Handler) -> Handler:
            for name in names:
                if name in self.table:
                    raise ValueError(f"{self.what}: {name} has two handlers")
                self.table[name] = Entry(fn, admin_only, fields)
            return fn

        return add

    def handles(self, name: str) -> bool:
        return name in self.table

    async def __call__(self, conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        """The reply document for `cmd` (never raises for a command-level failure)."""
        if not cmd:
            return error_reply(*numbered(ErrorCode.FailedToParse), "empty command document")
        name = next(iter(cmd))
        db = cmd.get("$db")  # checked first, as mongod does while parsing the request
        if not isinstance(db, str) or not db:
            return error_reply(*MISSING_DB, "OP_MSG requests require a $db argument")
        entry = self.table.get(name)
        if entry is None:
            return error_reply(*numbered(ErrorCode.CommandNotFound), f"no such command: '{name}'")
        if db == "local":  # mongos's own check, before any command runs
            return error_reply(*numbered(ErrorCode.IllegalOperation), "Can't use 'local' database through mongos")
        if entry.admin_only and db != "admin":
            return error_reply(*UNAUTHORIZED, f"{name} may only be run against the admin database.")
        if name in UNTRACED:
            return await self._run(conn, name, entry, cmd)
        # One wire command is one trace: its root, a server span, parents the routing span.
        with tracing.span(
            f"wire {name}",
            tracing.db_attributes(_namespace(db, cmd.get(name)), name),
            kind=SpanKind.SERVER,
            context=tracing.ROOT,
        ) as span:
            reply = await self._run(conn, name, entry, cmd)
            if span.is_recording() and not reply["ok"]:
                span.set_status(StatusCode.ERROR, str(reply.get("codeName", "")))
                span.set_attribute("db.response.status_code", str(reply.get("code", "")))
            return reply

    async def _run(self, conn: Connection, name: str, entry: Entry, cmd: dict[str, Any]) -> dict[str, Any]:
        conn.command, conn.operation_time = name, 0
        if conn.edge is not None:
            conn.edge.routing.begin_operation()
        try:
            # Every field is honoured or refused before anything runs (options.py).
            check_generic(name, cmd)
            if entry.fields is not None:
                entry.fields.check(cmd)
            if conn.edge is not None and "$clusterTime" in cmd:
                # Gossip in once per command, before it runs: a refused time refuses the command.
                conn.edge.routing.gossip_in(wire_cluster_time(cmd["$clusterTime"]))
            reply = await self._handle(conn, name, entry, cmd)
            reply = {**reply, "ok": 1.0} if "ok" not in reply else reply
            if (wce := write_concern_error(name, cmd)) is not None:  # the decision is applied
                number, code_name = command_error_code(wce.code)
                reply["writeConcernError"] = {"code": number, "codeName": code_name, "errmsg": wce.message}
        except WireCommandError as e:
            reply = error_reply(e.code, e.code_name, e.message)
        except CommandError as e:
            number, code_name = command_error_code(e.code)
            reply = error_reply(number, code_name, e.message if code_name == e.code else f"{e.code}: {e.message}")
            if e.code == ErrorCode.DuplicateKey and e.info:  # as mongod: the index's key and the value
                reply.update({k: e.info[k] for k in ("keyPattern", "keyValue") if k in e.info})
        if not reply["ok"] and (labels := error_labels(name, cmd, reply["code"])):
            reply["errorLabels"] = labels
        return self._times(conn, reply)

    async def _handle(self, conn: Connection, name: str, entry: Entry, cmd: dict[str, Any]) -> dict[str, Any]:
        """The handler's reply; a command with transaction fields runs as a transaction's."""
        ms = max_time_ms(cmd)
        if self.transactions is not None and conn.edge is not None and in_transaction(cmd):
            return await self.transactions(conn, name, cmd, lambda c: self._within_max_time(conn, entry, c, ms))
        return await self._within_max_time(conn, entry, cmd, ms)

    @staticmethod
    async def _within_max_time(conn: Connection, entry: Entry, cmd: dict[str, Any], ms: int) -> dict[str, Any]:
        """The handler's reply, or MaxTimeMSExpired once `maxTimeMS` has passed (as mongos: a write
        the shards already took stays taken; the client learns it did not finish in time)."""
        if not ms:
            return await entry.handler(conn, cmd)
        deadline = asyncio.timeout(ms / 1000)
        try:
            async with deadline:
                return await entry.handler(conn, cmd)
        except TimeoutError:
            if not deadline.expired():
                raise  # the handler's own timeout, not maxTimeMS
            raise WireCommandError.of(ErrorCode.MaxTimeMSExpired, "operation exceeded time limit") from None

    @staticmethod
    def _times(conn: Connection, reply: dict[str, Any]) -> dict[str, Any]:
        """Every reply of a router on a cluster carries operationTime and $clusterTime, as the
        Kafka front's replies do (docs/decisions/0014): the largest time of the shards the
        command reached, else the router's ClusterTime; the ClusterTime signed."""
        if conn.edge is None:
            return reply
        routing = conn.edge.routing
        reached = max(conn.operation_time, routing.reached_time())
        reply["operationTime"] = reply_timestamp(reached or routing.clock.cluster_time)
        reply["$clusterTime"] = reply_cluster_time(routing.signed_cluster_time())
        return reply


# Retryable writes (docs/decisions/0015): the commands, and the codes of failures a driver
# retries with the same txnNumber (MongoDB's RetriableError category, and the network-like
# failures of our own Kafka hops: a shard or Kafka that did not answer applied the statement
# at most once, and the retry is answered from the shard's record if it did).
RETRYABLE_WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})
RETRYABLE_CODES = frozenset({6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})


def retryable_write_error(name: str, cmd: dict[str, Any], code: int) -> bool:
    """Whether mongos labels this failure RetryableWriteError: a retryable write (a txnNumber
    outside a transaction) that failed with a retryable code."""
    return (
        name in RETRYABLE_WRITE_COMMANDS
        and cmd.get("txnNumber") is not None
        and "startTransaction" not in cmd
        and "autocommit" not in cmd
        and code in RETRYABLE_CODES
    )


# Our codes whose MongoDB counterpart has another name: what mongos answers in their place.
# A shard or Kafka that did not answer in time is mongos's NetworkTimeout to a shard host.
WIRE_NAMES: dict[str, tuple[int, str]] = {
    ErrorCode.DocumentTooLarge: (10334, "BSONObjectTooLarge"),
    ErrorCode.ShardUnavailable: (89, "NetworkTimeout"),
    ErrorCode.Timeout: (89, "NetworkTimeout"),
    ErrorCode.KafkaUnavailable: (6, "HostUnreachable"),
}


# Multi-document transactions (docs/decisions/0020): the commands that end one, and the codes
# of MongoDB's isTransientTransactionError (the whole transaction may be retried from the start):
# WriteConflict, LockTimeout, PreparedTransactionInProgress, ShardCannotRefreshDueToLocksHeld, the
# snapshot errors (SnapshotTooOld, SnapshotUnavailable, StaleChunkHistory, MigrationConflict), the
# retargeting ones (StaleConfig, StaleShardVersion, StaleEpoch, StaleDbVersion), NoSuchTransaction.
ENDS = frozenset({"commitTransaction", "abortTransaction"})
TRANSIENT_CODES = frozenset({112, 24, 267, 343, 239, 246, 250, 272, 13388, 63, 150, 249, 251})
# A commit nobody knows the outcome of: MongoDB's retriable errors, the time limits, and a
# write concern that was not satisfied.
UNKNOWN_COMMIT_CODES = RETRYABLE_CODES | {50, 64}  # MaxTimeMSExpired, WriteConcernFailed


def transaction_labels(name: str, code: int) -> list[str]:
    """The errorLabels of a failed command of a transaction (MongoDB's getErrorLabels)."""
    labels: list[str] = []
    if name in ENDS and code in RETRYABLE_CODES:
        labels.append("RetryableWriteError")  # commit and abort are retryable writes
    # A statement that failed with a retryable code (a shard or Kafka that did not answer): the
    # router aborted the transaction, so starting it again is safe (MongoDB's rule too).
    if code in TRANSIENT_CODES or (name not in ENDS and code in RETRYABLE_CODES):
        labels.append("TransientTransactionError")
    if name == "commitTransaction" and code in UNKNOWN_COMMIT_CODES:
        labels.append("UnknownTransactionCommitResult")
    return labels


def in_transaction(cmd: dict[str, Any]) -> bool:
    """Whether a command claims a multi-document transaction (wire/transactions.py checks how)."""
    return "autocommit" in cmd or "startTransaction" in cmd


def error_labels(name: str, cmd: dict[str, Any], code: int) -> list[str]:
    """The errorLabels of a failed command: a retryable write's, or a transaction's
    (wire/transactions.py)."""
    if in_transaction(cmd) or name in ENDS:
        return transaction_labels(name, code)
    return ["RetryableWriteError"] if retryable_write_error(name, cmd, code) else []


def command_error_code(code: str) -> tuple[int, str]:
    """MongoDB's (number, name) for a `CommandError` code; shardlog's own codes (no number)
    go out as InternalError (our name leads the message), never as a made-up number."""
    if code in WIRE_NAMES:
        return WIRE_NAMES[code]
    try:
        known = ErrorCode(code)
    except ValueError:
        # MongoDB's numbered assertions without a name travel as "Location<n>" (the query
        # language's and the pipeline's): their number is MongoDB's.
        if code.startswith("Location") and code[8:].isdigit():
            return int(code[8:]), code
        return numbered(ErrorCode.InternalError)
    return numbered(known) if known.number is not None else numbered(ErrorCode.InternalError)


def numbered(code: ErrorCode) -> tuple[int, str]:
    """(number, name) of one of domain.protocol's codes that MongoDB has."""
    assert code.number is not None, f"{code} has no MongoDB number"
    return code.number, str(code)


SERVER_COMMANDS = CommandTable("router wire command")


# ------------------------------------------------------------------ handshake


def hello_reply(conn: Connection, cmd: dict[str, Any], legacy: bool) -> dict[str, Any]:
    """mongos's answer to hello / isMaster.  `logicalSessionTimeoutMinutes` only on a cluster
    (the Kafka-less skeleton keeps no sessions).  Not advertised: `topologyVersion` (so drivers
    poll every 10 s instead of streaming awaitable hellos), `saslSupportedMechs` (no
    authentication)."""
    first = not conn.handshake_done
    if "client" in cmd and not first:
        raise WireCommandError(
            CLIENT_METADATA_CANNOT_BE_MUTATED, "The client metadata document may only be sent in the first hello"
        )
    reply: dict[str, Any] = {}
    if legacy and cmd.get("helloOk") is True:
        reply["helloOk"] = True
    reply["ismaster" if legacy else "isWritablePrimary"] = True
    reply.update(
        msg="isdbgrid",
        maxBsonObjectSize=MAX_BSON_OBJECT_SIZE,
        maxMessageSizeBytes=MAX_MESSAGE_SIZE_BYTES,
        maxWriteBatchSize=MAX_WRITE_BATCH_SIZE,
        localTime=datetime.now(UTC),
        connectionId=conn.id,
        minWireVersion=MIN_WIRE_VERSION,
        maxWireVersion=MAX_WIRE_VERSION,
        readOnly=False,
    )
    if conn.edge is not None:
        # Sessions and retryable writes are honoured on a cluster (docs/decisions/0015).
        reply["logicalSessionTimeoutMinutes"] = session_timeout_minutes(
            conn.edge.follower.catalog.settings.logicalSessionTimeoutMinutes
        )
    if first:
        conn.handshake_done = True
        client = cmd.get("client")
        conn.client = client if isinstance(client, dict) else None
        offered = cmd.get("compression")
        if isinstance(offered, list):
            common = [c for c in offered if isinstance(c, str) and c in conn.compressors and c in COMPRESSORS]
            if common:
                reply["compression"] = common
                conn.compressor = common[0]
    return reply


def session_timeout_minutes(minutes: float) -> int:
    """hello's logicalSessionTimeoutMinutes is an int32: a setting below a minute says 1 (a
    driver then expires its pooled sessions later than the cluster, which only costs a fresh lsid)."""
    return max(1, int(minutes))


# hello's fields (MongoDB's hello.idl), all honoured: drivers send many on every handshake.
# `topologyVersion` / `maxAwaitTimeMS` ask for an awaitable hello; no reply of ours carries a
# topologyVersion, so any one a client sends is another process's and MongoDB answers at once,
# as here.  `saslSupportedMechs` / `speculativeAuthenticate`: there are no users, so the reply
# names no mechanisms and carries no speculative answer, as MongoDB's does for an unknown user
# (the driver then authenticates the usual way).  `loadBalanced: true`: a mongos not behind a
# load balancer answers without a `serviceId`, as here, and the driver refuses it (MongoDB's
# load_balancer_support.cpp raises LoadBalancerSupportMismatch only for a connection that came
# through its load-balancer port without the option).  `forShell`, `hostInfo`,
# `hangUpOnStepDown` and `internalClient` change nothing on a mongos.
#
# The handshake is tolerant, as MongoDB's is: drivers add hello fields that every server must
# take (pymongo 4.20 sends `backpressure: "2"` to any server, saying it understands overload
# errors, which shardlog never sends), so a field hello does not define is not refused.
HELLO_FIELDS = {
    "client": HONOURED,
    "compression": HONOURED,
    "helloOk": HONOURED,
    "topologyVersion": HONOURED,
    "maxAwaitTimeMS": HONOURED,
    "saslSupportedMechs": HONOURED,
    "speculativeAuthenticate": HONOURED,
    "loadBalanced": HONOURED,
    "forShell": HONOURED,
    "hostInfo": HONOURED,
    "hangUpOnStepDown": HONOURED,
    "internalClient": HONOURED,
}


class TolerantFields(Fields):
    """A table whose rules apply to the fields it names; other fields are let through (hello)."""

    def check(self, doc: Mapping[str, Any], *, skip_first: bool = True, generic: bool = True) -> None:
        known = {k: v for i, (k, v) in enumerate(doc.items()) if (i or not skip_first) and k in self.rules}
        super().check(known, skip_first=False, generic=generic)


@SERVER_COMMANDS.register("hello", fields=TolerantFields("hello", HELLO_FIELDS))
async def _hello(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return hello_reply(conn, cmd, legacy=False)


@SERVER_COMMANDS.register("isMaster", "ismaster", fields=TolerantFields("isMaster", HELLO_FIELDS))
async def _is_master(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return hello_reply(conn, cmd, legacy=True)


# ------------------------------------------------------------------ server commands


@SERVER_COMMANDS.register("ping", fields=Fields("ping"))
async def _ping(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return {}


def build_info() -> dict[str, Any]:
    major, minor, patch = (int(x) for x in COMPATIBLE_VERSION.split("."))
    return {
        "version": COMPATIBLE_VERSION,
        "gitVersion": f"shardlog-{SHARDLOG_VERSION}",
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": [major, minor, patch, 0],
        "bits": 64,
        "debug": False,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": [],
        "buildEnvironment": {"target_os": platform.system().lower(), "target_arch": platform.machine()},
        # Not MongoDB's: says what answers.  (mongosh's "genuine MongoDB" check looks for a
        # `ferretdb` field here and for `documentdb_api` in a getParameter error, nothing else.)
        "shardlog": {"version": SHARDLOG_VERSION},
    }


@SERVER_COMMANDS.register("buildInfo", "buildinfo", fields=Fields("buildInfo"))
async def _build_info(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return build_info()


def parameters() -> dict[str, Any]:
    return {"featureCompatibilityVersion": {"version": FEATURE_COMPATIBILITY_VERSION}}


# getParameter's fields are the parameters asked for (any name): its handler reads them.
@SERVER_COMMANDS.register("getParameter", admin_only=True)
async def _get_parameter(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    known = parameters()
    if cmd["getParameter"] == "*":
        return known
    wanted = [k for k in cmd if k != "getParameter" and not k.startswith("$") and k != "comment"]
    found = {k: known[k] for k in wanted if k in known}
    if not found:
        raise WireCommandError.of(ErrorCode.InvalidOptions, "no option found to get")
    return found


@SERVER_COMMANDS.register("whatsmyuri", fields=Fields("whatsmyuri"))
async def _whatsmyuri(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return {"you": conn.peer}


@SERVER_COMMANDS.register("connectionStatus", fields=Fields("connectionStatus", {"showPrivileges": HONOURED}))
async def _connection_status(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"authenticatedUsers": [], "authenticatedUserRoles": []}
    if cmd.get("showPrivileges"):
        info["authenticatedUserPrivileges"] = []
    return {"authInfo": info}


@SERVER_COMMANDS.register("getLog", admin_only=True, fields=Fields("getLog"))
async def _get_log(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    which = cmd["getLog"]
    if not isinstance(which, str):
        raise WireCommandError.of(
            ErrorCode.TypeMismatch,
            f"BSON field 'getLog' is the wrong type '{type_name(which)}', expected type 'string'",
        )
    if which == "*":
        return {"names": ["global", "startupWarnings"]}
    if which not in ("global", "startupWarnings"):
        raise WireCommandError.of(ErrorCode.InvalidOptions, f"no RamLog named: {which}")
    return {"totalLinesWritten": 0, "log": []}


@SERVER_COMMANDS.register("hostInfo", admin_only=True, fields=Fields("hostInfo"))
async def _host_info(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    try:
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        mem_mb = 0
    return {
        "system": {
            "currentTime": datetime.now(UTC),
            "hostname": socket.gethostname(),
            "cpuAddrSize": 64,
            "memSizeMB": mem_mb,
            "numCores": os.cpu_count() or 1,
            "cpuArch": platform.machine(),
            "numaEnabled": False,
        },
        "os": {"type": platform.system(), "name": platform.system(), "version": platform.release()},
        "extra": {},
    }
