"""A batch's commands as the processor carries them: what is known of each before its
transaction (`Head`), and what the transaction's steps fill in (`Pending`)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

from opentelemetry import trace

from libs import tracing
from libs.bus import Message
from libs.commands.decision import Decided
from schemas import Record
from schemas.reply import Reply


@dataclass
class Head:
    """A command already decoded before its transaction (and decided, with its span, by the
    plain-read pass when it turned out to write)."""

    command: Record
    span: trace.Span | None = None
    decided: Decided | None = None


@dataclass
class Pending:
    """One command of the batch, as the steps fill it in."""

    rec: Message
    head: Head | None
    decided: Decided | None = None
    acks: list[tuple[Awaitable[int], int]] = field(default_factory=list)  # (ack, records past the one it names)
    event_count: int = 0
    reply: Reply | None = None
    reply_to: str | None = None  # None: no reply waits for the acks (none asked, sent early, or gone)
    reply_headers: tracing.Headers = field(default_factory=list)
    position: int = 0  # the changelog position its reply names
