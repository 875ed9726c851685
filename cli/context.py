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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn, TypeVar

import typer
from aiokafka.errors import KafkaError, KafkaTimeoutError
from rich.console import Console

from domain.bsonvalues import RecordFormError, from_record, to_record
from domain.catalog import Catalog
from domain.follower import replay_catalog
from domain.protocol import ErrorCode
from domain.shardkey import shell_form, shell_range
from libs import kafka, tracing
from libs.client import AsyncCluster, ShardlogError
from libs.commands import CommandError
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

    def fail(self, message: str, *, code: str = "Error", exit_code: int = 1) -> NoReturn:
        if self.json:
            print(json.dumps({"ok": False, "code": code, "error": message}))
        else:
            self.err.print(f"[red]error[/red]: {code}: {message}", highlight=False, soft_wrap=True)
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

    def parse_json(self, text: str, what: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            self.bad_value(f"invalid JSON for {what}: {e.msg} at column {e.colno}")

    def parse_ejson(self, text: str, what: str) -> Any:
        """A document, filter or value given as (relaxed or canonical) Extended JSON: ``{"$oid":
        ...}``, ``{"$date": ...}``, ``{"$numberLong": ...}`` become BSON values (decision 0016)."""
        value = self.parse_json(text, what)
        try:
            return from_record(value)
        except RecordFormError as e:
            self.bad_value(f"invalid Extended JSON for {what}: {e}")

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
