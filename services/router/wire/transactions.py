"""Multi-document transactions over the wire (issue 33, docs/decisions/0020): the transaction
fields of a command (`lsid`, `txnNumber`, `autocommit: false`, `startTransaction: true`,
`readConcern` on the first statement), the commands MongoDB refuses inside a transaction (263,
the transaction left as it was), `commitTransaction` / `abortTransaction`, and the error labels
drivers act on (`TransientTransactionError`: retry the whole transaction;
`UnknownTransactionCommitResult`: retry the commit).

The parsers and label rules are pure; `run_statement` is the thin driver the command table
calls for a command that carries `autocommit` (services/router/transactions.py keeps the
session's transaction)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from domain.logical_sessions import session_id
from domain.protocol import ErrorCode
from libs.errors import CommandError
from services.router.transactions import TxnArgs, check_read_concern
from services.router.wire.commands import ENDS, SERVER_COMMANDS, Connection, in_transaction
from services.router.wire.gossip import wire_lsid, wire_read_concern
from services.router.wire.options import HONOURED, Fields

# The commands a transaction may run (MongoDB's list, less what shardlog does not route in one:
# create / createIndexes on a new collection).
STATEMENTS = frozenset(
    {"find", "getMore", "killCursors", "insert", "update", "delete", "findAndModify", "findandmodify"}
    | {"aggregate", "distinct", "bulkWrite"}
)
NO_TRANSACTION_DATABASES = ("config", "admin", "local")

# ------------------------------------------------------------------ parsing (pure)


def _invalid(message: str) -> CommandError:
    return CommandError(ErrorCode.InvalidOptions, message)


def txn_args(cmd: dict[str, Any]) -> TxnArgs:
    """A transaction statement's fields, checked as MongoDB's initializeOperationSessionInfo
    checks them."""
    autocommit = cmd.get("autocommit")
    if autocommit is None:
        raise _invalid("'startTransaction' field requires 'autocommit' field to also be specified")
    if not isinstance(autocommit, bool):
        raise CommandError(ErrorCode.TypeMismatch, "BSON field 'autocommit' is the wrong type, expected type 'bool'")
    txn_number = cmd.get("txnNumber")
    if txn_number is None:
        raise _invalid("'autocommit' field requires a transaction number to also be specified")
    if autocommit:
        raise _invalid("Specifying autocommit=true is not allowed.")
    if isinstance(txn_number, bool) or not isinstance(txn_number, int):
        raise CommandError(ErrorCode.TypeMismatch, "BSON field 'txnNumber' is the wrong type, expected type 'long'")
    if txn_number < 0:
        raise CommandError(ErrorCode.BadValue, f"TxnNumber cannot be negative, but it was {txn_number}")
    if cmd.get("lsid") is None:
        raise _invalid("Transaction number requires a sessionId to also be specified")
    start = cmd.get("startTransaction", False)
    if start is not True and "startTransaction" in cmd:
        raise _invalid("Specifying startTransaction=false is not allowed.")
    return TxnArgs(int(txn_number), start, _read_concern(cmd, start))


def _read_concern(cmd: dict[str, Any], start: bool) -> dict[str, Any] | None:
    rc = cmd.get("readConcern")
    if rc is None:
        return None
    if not start:
        raise _invalid("Only the first command in a transaction may specify a readConcern")
    out: dict[str, Any] = check_read_concern(wire_read_concern(rc))
    return out


def refuse_in_transaction(name: str, cmd: dict[str, Any]) -> None:
    """What MongoDB refuses inside a transaction, before it touches the transaction (which stays
    usable): 263 for a command or database a transaction does not run, InvalidOptions for a
    statement's writeConcern."""
    if name not in STATEMENTS:
        raise CommandError(
            ErrorCode.OperationNotSupportedInTransaction, f"Cannot run '{name}' in a multi-document transaction."
        )
    for db in _databases(name, cmd):
        if db in NO_TRANSACTION_DATABASES:
            raise CommandError(
                ErrorCode.OperationNotSupportedInTransaction,
                f"Cannot run command against the '{db}' database in a transaction.",
            )
    if "writeConcern" in cmd:
        raise _invalid("writeConcern is not allowed within a multi-statement transaction")
    if name == "aggregate":
        for stage in cmd.get("pipeline") or []:
            if isinstance(stage, dict) and ({"$out", "$merge"} & set(stage)):
                raise CommandError(
                    ErrorCode.OperationNotSupportedInTransaction,
                    f"{next(iter(stage))} cannot be used in a transaction",
                )


def _databases(name: str, cmd: dict[str, Any]) -> list[Any]:
    """The databases a statement touches: its `$db`, but bulkWrite's (run on admin) are its
    nsInfo namespaces' (a malformed entry is left to bulkWrite's own checks)."""
    if name != "bulkWrite":
        return [cmd.get("$db")]
    infos = cmd.get("nsInfo")
    entries = infos if isinstance(infos, list) else []
    return [e["ns"].split(".", 1)[0] for e in entries if isinstance(e, dict) and isinstance(e.get("ns"), str)]


# ------------------------------------------------------------------ the driver

Run = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _session(conn: Connection, cmd: dict[str, Any]) -> str:
    return session_id(conn.cluster().routing.sessions.use(wire_lsid(cmd.get("lsid"))))


async def run_statement(conn: Connection, name: str, cmd: dict[str, Any], run: Run) -> dict[str, Any]:
    """Run a command that carries transaction fields: commit and abort as they are; any other
    as a statement of the session's transaction, its error aborting it everywhere."""
    args = txn_args(cmd)
    if name in ENDS:
        return await run(cmd)
    refuse_in_transaction(name, cmd)
    routing = conn.cluster().routing
    statement = await routing.transactions.begin(_session(conn, cmd), args, routing.snapshot_time)
    # the transaction's snapshot is its read concern: the command reads no other
    reply = await routing.transactions.run(statement, lambda: run({k: v for k, v in cmd.items() if k != "readConcern"}))
    return {**reply, "recoveryToken": statement.recovery_token()}


def _end_args(conn: Connection, name: str, cmd: dict[str, Any]) -> tuple[str, int]:
    if not in_transaction(cmd):
        raise _invalid(f"{name} must be run within a transaction")
    args = txn_args(cmd)
    if args.start:
        raise _invalid(f"{name} cannot start a transaction")
    return _session(conn, cmd), args.txn_number


END_FIELDS = {"recoveryToken": HONOURED}


@SERVER_COMMANDS.register("commitTransaction", admin_only=True, fields=Fields("commitTransaction", END_FIELDS))
async def _commit_transaction(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    lsid, txn_number = _end_args(conn, "commitTransaction", cmd)
    return await conn.cluster().routing.transactions.commit(lsid, txn_number, cmd.get("recoveryToken"))


@SERVER_COMMANDS.register("abortTransaction", admin_only=True, fields=Fields("abortTransaction", END_FIELDS))
async def _abort_transaction(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    lsid, txn_number = _end_args(conn, "abortTransaction", cmd)
    return await conn.cluster().routing.transactions.abort(lsid, txn_number)


SERVER_COMMANDS.transactions = run_statement
