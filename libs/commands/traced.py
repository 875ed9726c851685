"""The spans around a command's way through the processor (docs/reference/observability.md,
"What a trace shows").  The steps of a batch's transaction do no tracing of their own: the batch
runs each command's steps inside `BatchTrace.command` and its event writes inside
`BatchTrace.transaction`, so that the traceparent the steps inject names the right span."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from libs import tracing
from schemas import Record

if TYPE_CHECKING:
    from libs.bus import Message
    from libs.commands.batch import Pending


def consumer_span(name: str, rec: Message, command: Record | None) -> trace.Span:
    """A command's span, in the trace its sender's headers name: its consumption and decision (and
    for a command in a transaction, the parent of that transaction's span).  Not made current."""
    span = tracing.tracer.start_span(
        f"{name} {command.type}" if command is not None else f"{name} process",
        context=tracing.extract(rec.headers),
        kind=trace.SpanKind.CONSUMER,
        attributes=tracing.record_attributes(rec),
    )
    if command is not None:
        name_command(span, name, command)
    return span


def name_command(span: trace.Span, name: str, command: Record) -> None:
    span.update_name(f"{name} {command.type}")
    if span.is_recording():
        span.set_attributes(tracing.db_attributes(getattr(command, "ns", None), command.type))


class BatchTrace:
    """Per command of a batch, its span and below it a span of the batch's transaction, in that
    command's trace: both end when the transaction does (`end`)."""

    def __init__(self, name: str, transactional_id: str, commands: list[Pending]) -> None:
        self.name, self.transactional_id, self.commands = name, transactional_id, commands
        self.began = time.time_ns()
        self.spans: list[trace.Span] = []
        self.transactions: list[trace.Span] = []

    @contextmanager
    def command(self, c: Pending) -> Iterator[None]:
        """The command's span made current (the plain-read pass's, if it began one)."""
        head = c.head
        span = head.span if head is not None and head.span is not None else None
        if span is None:
            span = consumer_span(self.name, c.rec, head.command if head is not None else None)
        self.spans.append(span)
        with trace.use_span(span, end_on_exit=False):
            yield
        decided = c.decided
        if decided is not None:
            if head is None and decided.command is not None:  # decoded in the transaction
                name_command(span, self.name, decided.command)
            if not decided.reply.ok:
                span.set_attribute("shardlog.error", decided.reply.code or "")

    @contextmanager
    def transaction(self, c: Pending) -> Iterator[None]:
        """The batch's transaction as this command's trace sees it: its events are written
        inside it (their producer spans are its children)."""
        txn = tracing.tracer.start_span(
            f"{self.name} transaction",
            start_time=self.began,
            attributes={
                "messaging.system": tracing.KAFKA,
                "shardlog.transaction.id": self.transactional_id,
                "shardlog.transaction.commands": len(self.commands),
            },
        )
        self.transactions.append(txn)
        with trace.use_span(txn, end_on_exit=False):
            yield
        if c.decided is not None and c.decided.reply.ok:
            txn.set_attribute("shardlog.transaction.events", c.event_count)

    @staticmethod
    @contextmanager
    def producing(topic: str, **attributes: AttributeValue) -> Iterator[None]:
        with tracing.producer_span(topic, **attributes):
            yield

    def end(self, error: BaseException | None) -> None:
        """The transaction ended (`error`: it failed): every span of the batch ends."""
        for t in self.transactions:
            if error is not None:
                t.record_exception(error)
                t.set_status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            t.end()
        for s in self.spans:
            s.end()
        for c in self.commands:  # a plain-read pass's span of a command never reached
            if c.head is not None and c.head.span is not None and c.head.span not in self.spans:
                c.head.span.end()
