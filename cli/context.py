"""What every shardlog command shares: the context the root callback builds (cluster address and name,
reply timeout, output mode, consoles), stored in typer's `ctx.obj`, and the ways a command talks to
the cluster and reports.

Output contract: for humans on the consoles, or one JSON line with `--json`; an error is one line
(`error: Code: message` on stderr, or `{"ok": false, "code": ..., "error": ...}` on stdout) and a
non-zero exit, 2 for bad input.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn, TypeVar

import bson
import typer
from aiokafka.errors import KafkaError, KafkaTimeoutError
from bson.errors import InvalidDocument
from rich.console import Console
from rich.markup import escape

from domain.bsonvalues import RecordFormError, from_record, to_record, type_name
from domain.catalog import Catalog
from domain.follower import replay_catalog
from domain.protocol import ErrorCode
from domain.shardkey import shell_form, shell_range
from libs import kafka, tracing
from libs.client import AsyncCluster, ShardlogError
from libs.errors import CommandError
from libs.requests import Requester, RequestTimeout
from libs.topics import Topics
from schemas import Record
from schemas.reply import Reply

T = TypeVar("T")

CLIENT_ID = "shardlog-cli"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


@dataclass
class CliContext:
    bootstrap: str
    cluster: str
    timeout: float
    json: bool = False  # set by the command's --json option as it is parsed, before the command runs
    out: Console = field(default_factory=Console)
    err: Console = field(default_factory=lambda: Console(stderr=True))

    @staticmethod
    def of(ctx: typer.Context) -> CliContext:
        cx = ctx.find_object(CliContext)
        if cx is None:
            raise RuntimeError("no CliContext: invoke the command through cli.main:app")
        return cx

    @cached_property
    def topics(self) -> Topics:
        """The cluster's topic names; a bad --cluster fails here, before any I/O, in the command's output mode."""
        try:
            return Topics(self.cluster)
        except ValueError as e:
            self.fail(str(e), code=ErrorCode.BadValue, exit_code=2)

    # ------------------------------------------------------------ reporting

    def fail(
        self, message: str, *, code: str = "Error", exit_code: int = 1, details: dict[str, Any] | None = None
    ) -> NoReturn:
        """One line: `error: Code: message` on stderr, or with --json the error object (with `details`) on stdout."""
        if self.json:
            print(json.dumps({"ok": False, "code": code, "error": message, **to_record(details or {})}))
        else:
            # (escaped: a message quoting the input, e.g. `[`, is text, not rich markup)
            self.err.print(f"[red]error[/red]: {escape(code)}: {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(exit_code)

    def bad_value(self, message: str) -> NoReturn:
        """Bad input from the command line: BadValue, exit 2."""
        self.fail(message, code=ErrorCode.BadValue, exit_code=2)

    def refused(self, reply: Reply) -> None:
        """Fail with the reply's error if the service refused."""
        if not reply.ok:
            self.fail(reply.error or "", code=reply.code or "Error")

    def build(self, make: Callable[..., T], *args: Any, **kw: Any) -> T:
        """A config record from domain/sharding_commands (the builder the wire edge shares);
        input it refuses is bad input: its code, exit 2."""
        try:
            return make(*args, **kw)
        except CommandError as e:
            self.fail(e.message, code=e.code, exit_code=2)

    def parse(self, parse: Callable[[str, str], T], text: str, what: str) -> T:
        """A JSON argument read by one of this module's parse_* functions; input it refuses is bad
        input: its code (FailedToParse, TypeMismatch, BadValue), exit 2."""
        return self.build(parse, text, what)

    def parse_json(self, text: str, what: str) -> dict[str, Any]:
        """A key pattern, range bound or find document in its record form (``{"$minKey": 1}`` as it is)."""
        return self.parse(parse_object, text, what)

    def parse_ejson(self, text: str, what: str) -> dict[str, Any]:
        """A document, filter, update, sort or projection in (relaxed or canonical) Extended JSON."""
        return self.parse(parse_document, text, what)

    def print_json(self, doc: dict[str, Any]) -> None:
        """The --json answer: one line, `ok` first; BSON values as relaxed Extended JSON."""
        answer = {"ok": True, **doc}
        try:
            print(json.dumps(to_record(answer)))
        except RecordFormError:  # not documents (e.g. int keys): plain JSON as before
            print(json.dumps(answer))

    # ------------------------------------------------------------ talking to the cluster

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run the command's I/O; a timeout or an unreachable broker is one clear error."""
        # aiokafka logs what it then raises ("Unable connect to ..."): the raise is our one line.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        try:
            return asyncio.run(coro)
        except RequestTimeout as e:
            self.fail(str(e), code=ErrorCode.Timeout)
        except (TimeoutError, KafkaTimeoutError) as e:
            # A wait that ran out (TimeoutError is an OSError): "Kafka is down" only if it is; else
            # Kafka answered and a service behind it did not, e.g. a shard added but never started.
            if not self._kafka_answers():
                self.fail(f"cannot reach Kafka at {self.bootstrap}: {e}", code=ErrorCode.KafkaUnavailable)
            self.fail(
                f"no answer in time ({type(e).__name__}: {e or 'timed out'}): Kafka at {self.bootstrap} is "
                f"reachable, but a service the request needs (a shard, a router) is not running or not answering; "
                f"see `shardlog status` and `make status`",
                code=ErrorCode.ShardUnavailable,
            )
        except (OSError, KafkaError) as e:
            self.fail(f"cannot reach Kafka at {self.bootstrap}: {e}", code=ErrorCode.KafkaUnavailable)

    def run_live(self, live: Any, coro: Coroutine[Any, Any, T]) -> T:
        """`run`, with a rich Live progress display (None: none) shown meanwhile; a
        CommandError is the command's one error line."""
        try:
            if live:
                live.start()
            return self.run(coro)
        except CommandError as e:
            self.fail(e.message, code=e.code)
        finally:
            if live:
                live.stop()

    def _kafka_answers(self) -> bool:
        async def probe() -> None:
            await asyncio.wait_for(kafka.missing_topics(self.bootstrap, [self.topics.config_commands]), 5)

        try:
            asyncio.run(probe())
        except Exception:
            return False
        return True

    def requester(self) -> Requester:
        """A requester whose replies come back on the cluster's CLI inbox."""
        return Requester(self.bootstrap, self.topics.cli_replies, client_id=CLIENT_ID)

    async def ask(self, r: Requester, topic: str, request: Record, timeout: float | None = None) -> dict[str, Any]:
        """One request on an open requester: the result, or fail with the refusal."""
        reply = await r.request(topic, request, timeout=timeout or self.timeout)
        self.refused(reply)
        return reply.result or {}

    def request(self, topic: str, request: Record) -> dict[str, Any]:
        """One request to a service's inbox (a shard's, the balancer's): its result, or fail."""

        async def go() -> dict[str, Any]:
            async with self.requester() as r:
                return await self.ask(r, topic, request)

        return self.run(go())

    def command(self, command: Record, span_name: str | None = None) -> Reply:
        """Send a config server command, traced as one span; fail if refused."""
        reply = self.run(self._config_request(command, span_name or f"shardlog {command.type}"))
        self.refused(reply)
        return reply

    def send(self, command: Record, human: Callable[[dict[str, Any]], None]) -> None:
        """Send a config command and print its reply: `human(result)` and the ConfigTime, or the JSON."""
        reply = self.command(command)
        if self.json:
            self.print_json({"configTime": reply.configTime, **(reply.result or {})})
        else:
            human(reply.result or {})
            self.out.print(f"[dim]ConfigTime {reply.configTime}[/dim]")

    async def _config_request(self, command: Record, span_name: str) -> Reply:
        await self.check_cluster()
        tracing.setup("shardlog-cli")
        with tracing.tracer.start_as_current_span(span_name, attributes={"shardlog.command": command.type}):
            async with self.requester() as r:
                try:
                    return await r.request(self.topics.config_commands, command, timeout=self.timeout)
                finally:
                    tracing.shutdown()

    async def check_cluster(self) -> None:
        """Fail at once, clearly, if the cluster's topics do not exist (rather than wait on them)."""
        missing = await kafka.missing_topics(self.bootstrap, [self.topics.config_commands, self.topics.cli_replies])
        if missing:
            self.fail(
                f"cluster {self.cluster!r} has no topics at {self.bootstrap} ({', '.join(missing)} missing): is it "
                f"started? (`make up`, or `shardlog topics create`)",
                code=ErrorCode.ClusterNotFound,
            )

    def catalog(self, at: int | None = None) -> Catalog:
        """The catalog replayed from the config events (as of ConfigTime `at`)."""
        return self.run(replay_catalog(self.bootstrap, self.topics.config_events, until=at))

    def with_client(self, fn: Callable[[AsyncCluster], Awaitable[T]], *, retry_writes: bool = True) -> T:
        """Run fn(async cluster) through the routers; a refusal is one clear line."""

        async def go() -> T:
            async with AsyncCluster(
                self.bootstrap, self.topics.cluster, timeout=self.timeout, retry_writes=retry_writes
            ) as c:
                return await fn(c)

        try:
            return self.run(go())
        except ShardlogError as e:
            self.fail(e.message, code=e.code)


def set_json_mode(ctx: typer.Context, value: bool) -> bool:
    """--json, recorded in the context as it is parsed: an error raised anywhere in the command comes out as JSON."""
    cx = ctx.find_object(CliContext)
    if cx is not None:
        cx.json = value
    return value


JsonOpt = typer.Option(False, "--json", help="machine-readable output", callback=set_json_mode)


def bound(doc: Any) -> str:
    """A shard-key value, key pattern or range bound as mongosh writes it: `{ x: MaxKey }`."""
    return shell_form(doc)


def chunk_range(lo: Any, hi: Any) -> str:
    """[min, max) as sh.status() writes a chunk: `{ x: 1000 } -->> { x: MaxKey }`."""
    return shell_range(lo, hi)


# ------------------------------------------------------------------ JSON arguments
# Every JSON argument of every command is read here, checked for the shape it needs, and refused
# as MongoDB would (FailedToParse for text that is not JSON, TypeMismatch for the wrong type,
# BadValue for a value BSON cannot hold), before any I/O.  Numbers are read as the Extended JSON
# parsers read them: an integer that fits int64 stays one, a larger one is a double; NaN,
# Infinity and 1e400 are doubles (MongoDB keeps them; JSON has no word for them).

_INT64 = range(-(2**63), 2**63)


def _number(text: str) -> int | float:
    if len(text) <= 20:  # digits of int64, and a sign; longer is a double, never Python's 4300-digit error
        n = int(text)
        if n in _INT64:
            return n
    return float(text)


def parse_value(text: str, what: str) -> Any:
    """Any JSON value, as it is (no Extended JSON conversion)."""
    try:
        return json.loads(text, parse_int=_number)
    except json.JSONDecodeError as e:
        raise CommandError(
            ErrorCode.FailedToParse, f"invalid JSON for {what}: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise CommandError(ErrorCode.FailedToParse, f"invalid JSON for {what}: nested too deeply") from None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"{what} must be a document (a JSON object), not {type_name(value)}")
    return value


def parse_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object kept in its record form: a shard key pattern, a range bound, a --find document
    (``{"$minKey": 1}`` stays as it is; the config builders read it so)."""
    return _object(parse_value(text, what), what)


def _bson(value: Any, what: str) -> Any:
    """The Extended JSON value as BSON values, refused if BSON cannot hold it."""
    try:
        out = from_record(value)
    except RecordFormError as e:
        raise CommandError(ErrorCode.FailedToParse, f"invalid Extended JSON for {what}: {e}") from None
    if isinstance(out, dict):
        try:
            bson.encode(out)
        except (InvalidDocument, OverflowError, UnicodeEncodeError, ValueError) as e:
            raise CommandError(ErrorCode.BadValue, f"{what} cannot be stored as BSON: {e}") from None
    return out


def _document(value: Any, what: str) -> dict[str, Any]:
    doc = _bson(_object(value, what), what)
    if not isinstance(doc, dict):  # {"$oid": ...}: a value, not a document
        raise CommandError(ErrorCode.TypeMismatch, f"{what} must be a document, not {type_name(doc)}")
    return doc


def parse_document(text: str, what: str) -> dict[str, Any]:
    """A document, filter, update, sort or projection: a JSON object in relaxed or canonical
    Extended JSON (``{"$numberLong": "5"}``, ``{"$oid": ...}``, ``{"$date": ...}``,
    ``{"$numberDouble": "NaN"}`` ... become BSON values, decision 0016)."""
    return _document(parse_value(text, what), what)


def parse_documents(text: str, what: str) -> list[dict[str, Any]]:
    """Documents to insert: one document, a JSON array of them, or one document per line (JSON Lines;
    blank lines skipped)."""
    try:
        value = parse_value(text, what)
    except CommandError:
        lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
        if len(lines) < 2:
            raise
        return [parse_document(ln, f"line {n} of {what}") for n, ln in lines]
    if not isinstance(value, list):
        if not isinstance(value, dict):
            raise CommandError(
                ErrorCode.TypeMismatch, f"{what} must be a document or an array of documents, not {type_name(value)}"
            )
        return [_document(value, what)]
    if not value:
        raise CommandError(ErrorCode.InvalidLength, f"{what}: an empty array has no document to insert")
    return [_document(d, f"document {i} of {what}") for i, d in enumerate(value)]
