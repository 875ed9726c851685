"""Which requesters' inboxes exist.  A reply waits for its inbox's metadata a bounded time; an
inbox not found by then (deleted with its router or client: a read answered again after a
restart may name one) counts as gone for a while, and every reply to it is dropped: nobody waits."""

from __future__ import annotations

import logging
import time

from libs import aio
from libs.bus import BusError, Producer
from libs.commands.settings import GONE_INBOX_S, INBOX_WAIT_S

log = logging.getLogger(__name__)


class Inboxes:
    def __init__(self, name: str) -> None:
        self.name = name
        self._gone: dict[str, float] = {}  # inbox -> until when (monotonic) it counts as gone

    def gone(self, inbox: str) -> bool:
        return bool(self._gone) and time.monotonic() < self._gone.get(inbox, 0.0)

    async def partitions(self, producer: Producer, inbox: str) -> set[int] | None:
        """The inbox's partitions (known after the first: no pause), or None when it is gone."""
        if self.gone(inbox):
            return None
        try:
            partitions: set[int] = await aio.wait_for(producer.partitions_for(inbox), INBOX_WAIT_S)
            return partitions
        except (TimeoutError, BusError):
            log.warning("%s: inbox %s not found within %gs: its replies are dropped", self.name, inbox, INBOX_WAIT_S)
            self._gone[inbox] = time.monotonic() + GONE_INBOX_S
            return None
