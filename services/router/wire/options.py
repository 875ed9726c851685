"""Every field a command may carry, and what shardlog does with it (issue 38 §1: never silently
wrong).  A field is either honoured with MongoDB's semantics, or refused with MongoDB's error;
nothing is accepted and ignored:

- a field the command does not define: IDLUnknownField (40415), "BSON field 'find.foo' is an
  unknown field.", as MongoDB's IDL parser answers;
- a field MongoDB defines that shardlog does not implement (yet): NotImplemented (238), naming
  the field, unless its value is the one that changes nothing (`collation: {locale: "simple"}`,
  `returnKey: false`, ...), which is accepted since the answer is MongoDB's either way;
- the generic arguments any command may carry (`lsid`, `maxTimeMS`, `writeConcern`, ...) are
  checked here once for every command (:func:`check_generic`), and `maxTimeMS` is enforced by
  the command table.

Each command's table is declared where its handler is registered (``register(..., fields=)``);
the command table checks a command against it before the handler runs, so a refused option
changes nothing.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.bsonvalues import type_name
from domain.protocol import ErrorCode
from domain.sharding_commands import GENERIC_FIELDS
from libs.errors import CommandError

# A rule for one field: None (honoured as it is), or a function of the value that returns None
# when the value is honoured and the reason it is refused otherwise.
Rule = Callable[[Any], str | None] | None

HONOURED: Rule = None


def refused(reason: str) -> Rule:
    """MongoDB has it, shardlog does not: refused whatever its value."""
    return lambda _value: reason


def refused_unless(neutral: Callable[[Any], bool], reason: str) -> Rule:
    """Refused unless the value is one that changes nothing (its default)."""
    return lambda value: None if neutral(value) else reason


def _falsy(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (int, float)) and value == 0)


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def simple_collation(value: Any) -> bool:
    """No collation, or MongoDB's "simple" one (binary comparison: what shardlog does)."""
    return value is None or value == {} or (isinstance(value, dict) and value.get("locale") == "simple")


COLLATION: Rule = refused_unless(
    simple_collation, "collation other than {locale: 'simple'} (shardlog compares strings by their bytes)"
)


def only_if_false(what: str) -> Rule:
    return refused_unless(_falsy, what)


def only_if_empty(what: str) -> Rule:
    return refused_unless(_empty, what)


def _let(value: Any) -> str | None:
    # let's variables are read by $expr and pipeline updates only, which shardlog refuses: a
    # well-formed `let` changes nothing.  A malformed one is refused as MongoDB refuses it.
    if not isinstance(value, dict):
        raise CommandError(
            ErrorCode.TypeMismatch, f"BSON field 'let' is the wrong type '{type_name(value)}', expected type 'object'"
        )
    return None


LET: Rule = _let


@dataclass(frozen=True)
class Fields:
    """The fields one command (or one statement of a batch) defines beside the generic arguments.
    `name`: how MongoDB's errors name it ('find', 'update.updates')."""

    name: str
    rules: Mapping[str, Rule] = field(default_factory=dict)

    def check(self, doc: Mapping[str, Any], *, skip_first: bool = True, generic: bool = True) -> None:
        """IDLUnknownField for a field the command does not define, NotImplemented for one
        shardlog refuses.  `skip_first`: the command's own name (its first field) is not checked;
        `generic`: the generic arguments are allowed beside the command's own fields."""
        keys = iter(doc)
        if skip_first:
            next(keys, None)
        for key in keys:
            if key in self.rules:
                rule = self.rules[key]
                if rule is not None and (why := rule(doc[key])) is not None:
                    raise CommandError(
                        ErrorCode.NotImplemented, f"BSON field '{self.name}.{key}': {why} is not supported by shardlog"
                    )
            elif not generic or key not in GENERIC_ARGUMENTS:
                raise CommandError(ErrorCode.IDLUnknownField, f"BSON field '{self.name}.{key}' is an unknown field.")

    def check_statement(self, doc: Mapping[str, Any]) -> None:
        """A statement of a batch (an update's or delete's entry): no generic arguments there."""
        self.check(doc, skip_first=False, generic=False)


# MongoDB's generic arguments: any command may carry them (checked by check_generic); the one list
# the sharding commands' parsers use too.
GENERIC_ARGUMENTS = GENERIC_FIELDS

# Reads: a writeConcern on them is refused, as MongoDB refuses it.
READ_COMMANDS = frozenset(
    {
        "find",
        "getMore",
        "count",
        "distinct",
        "explain",
        "killCursors",
        "listCollections",
        "listIndexes",
        "listDatabases",
    }
)
# The commands that read with a readConcern (MongoDB refuses one elsewhere outside transactions).
READ_CONCERN_COMMANDS = frozenset({"find", "aggregate", "count", "distinct", "explain"})
# The commands of MongoDB's Stable API, version 1 (apiStrict refuses the others).
API_V1_COMMANDS = frozenset(
    {
        "abortTransaction",
        "aggregate",
        "authenticate",
        "bulkWrite",
        "collMod",
        "commitTransaction",
        "count",
        "create",
        "createIndexes",
        "delete",
        "drop",
        "dropDatabase",
        "dropIndexes",
        "endSessions",
        "find",
        "findAndModify",
        "getMore",
        "hello",
        "insert",
        "killCursors",
        "listCollections",
        "listDatabases",
        "listIndexes",
        "ping",
        "refreshSessions",
        "saslContinue",
        "saslStart",
        "update",
    }
)
WRITE_CONCERN_FIELDS = frozenset({"w", "j", "wtimeout", "fsync", "wtimeoutMS", "getLastError", "provenance"})
MAX_TIME_MS_MAX = 2**31 - 1


def max_time_ms(cmd: Mapping[str, Any]) -> int:
    """The command's maxTimeMS (0: none), checked as MongoDB checks it."""
    if "maxTimeMS" not in cmd:
        return 0
    value = cmd["maxTimeMS"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(ErrorCode.BadValue, f"maxTimeMS must be a number, not {type_name(value)}")
    if isinstance(value, float) and not value.is_integer():
        raise CommandError(ErrorCode.BadValue, "maxTimeMS has a fractional component")
    if not 0 <= value <= MAX_TIME_MS_MAX:
        raise CommandError(
            ErrorCode.BadValue, f"{int(value)} value for maxTimeMS is out of range [0, {MAX_TIME_MS_MAX}]"
        )
    return int(value)


def check_write_concern(name: str, wc: Any) -> None:
    """A writeConcern shardlog can honour: an acknowledged write is committed to Kafka (acks=all,
    fsync'd), which is what w:1, w:"majority" and j:true promise on one node; w:0 is a write
    nobody waits for.  A number of nodes above 1 or a tag set cannot be promised: refused as
    a one-node replica set refuses it."""
    if not isinstance(wc, dict):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field '{name}.writeConcern' is the wrong type '{type_name(wc)}', expected type 'object'",
        )
    for key in wc:
        if key not in WRITE_CONCERN_FIELDS:
            raise CommandError(ErrorCode.FailedToParse, f"unrecognized write concern field: {key}")
    w = wc.get("w", 1)
    if isinstance(w, bool) or not isinstance(w, (int, float, str)):
        raise CommandError(ErrorCode.FailedToParse, f"w has to be a number or string; found: {type_name(w)}")
    if isinstance(w, (int, float)) and (w < 0 or w > 50):
        raise CommandError(
            ErrorCode.FailedToParse, f"w has to be a non-negative number and not greater than 50; found: {w}"
        )
    for key in ("j", "fsync"):
        if key in wc and not isinstance(wc[key], (bool, int, float)):
            raise CommandError(ErrorCode.FailedToParse, f"{key} must be numeric or a boolean value")
    for key in ("wtimeout", "wtimeoutMS"):
        if key in wc and (isinstance(wc[key], bool) or not isinstance(wc[key], (int, float))):
            raise CommandError(ErrorCode.FailedToParse, f"{key} must be a number")
    # Well formed; what one node cannot satisfy last (for a decision, a writeConcernError after it).
    if isinstance(w, (int, float)):
        if w > 1:
            raise CommandError(
                ErrorCode.UnsatisfiableWriteConcern, f"Not enough data-bearing nodes to satisfy w:{int(w)}"
            )
    elif w != "majority":
        raise CommandError(ErrorCode.UnknownReplWriteConcern, f"Unrecognized write concern mode: {w}")


# The commands that decide a transaction: MongoDB applies the decision, then waits for the write
# concern, so a write concern it cannot satisfy is a `writeConcernError` in an ok reply (the
# drivers' transactions spec, "write concern error on commit"), not a refusal that would leave
# the transaction open.
DECISIONS = frozenset({"commitTransaction", "abortTransaction"})
UNSATISFIABLE = frozenset({ErrorCode.UnsatisfiableWriteConcern, ErrorCode.UnknownReplWriteConcern})


def write_concern_error(name: str, cmd: Mapping[str, Any]) -> CommandError | None:
    """The error a decision's (commitTransaction / abortTransaction) well-formed write concern
    meets once the decision is applied: a number of nodes above 1 or a tag set; else None."""
    if name not in DECISIONS or "writeConcern" not in cmd:
        return None
    try:
        check_write_concern(name, cmd["writeConcern"])
    except CommandError as e:
        if e.code in UNSATISFIABLE:
            return e
    return None


def _short_rc(rc: Any) -> str:
    return f"readConcern {rc!r}"[:120]


def check_generic(name: str, cmd: Mapping[str, Any]) -> None:
    """The generic arguments of any command, checked once before it runs."""
    max_time_ms(cmd)
    if "apiVersion" in cmd:
        version = cmd["apiVersion"]
        if not isinstance(version, str):
            raise CommandError(
                ErrorCode.TypeMismatch,
                f"BSON field 'apiVersion' is the wrong type '{type_name(version)}', expected type 'string'",
            )
        if version != "1":
            raise CommandError(ErrorCode.APIVersionError, f'API version must be "1", got "{version}"')
        for key in ("apiStrict", "apiDeprecationErrors"):
            if key in cmd and not isinstance(cmd[key], bool):
                raise CommandError(
                    ErrorCode.TypeMismatch,
                    f"BSON field '{key}' is the wrong type '{type_name(cmd[key])}', expected type 'bool'",
                )
        if cmd.get("apiStrict") is True and name not in API_V1_COMMANDS:
            raise CommandError(
                ErrorCode.APIStrictError, f"Provided apiStrict:true, but the command {name} is not in API Version 1"
            )
    else:
        for key in ("apiStrict", "apiDeprecationErrors"):
            if key in cmd:
                raise CommandError(ErrorCode.InvalidOptions, f"Provided {key} without a corresponding API version")
    if "writeConcern" in cmd:
        if name in READ_COMMANDS:
            raise CommandError(ErrorCode.InvalidOptions, f"Command {name} does not support writeConcern")
        if write_concern_error(name, cmd) is None:  # (a decision's is reported after it: below)
            check_write_concern(name, cmd["writeConcern"])
    rc = cmd.get("readConcern")
    if rc is not None and name not in READ_CONCERN_COMMANDS and "startTransaction" not in cmd:
        # (a transaction's first statement names the transaction's: wire/transactions.py checks it)
        # A causally consistent session's driver sends {afterClusterTime} (level local) with any
        # command: a write, applied on its shard's newest state, already follows that time.
        # Any other level promises what a write outside a transaction does not do.
        if not isinstance(rc, dict) or rc.get("level", "local") != "local" or set(rc) - {"level", "afterClusterTime"}:
            raise CommandError(
                ErrorCode.InvalidOptions, f"Command {name} does not support {_short_rc(rc)} outside a transaction"
            )
