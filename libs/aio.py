"""asyncio helpers the runtime needs on Python 3.11.

`wait_for` replaces `asyncio.wait_for`, which on 3.11 can swallow a cancellation that arrives
as the awaited operation completes (CPython gh-86296, fixed in 3.12 by building it on
`asyncio.timeout`). A swallowed cancellation leaves a service loop running after its task was
cancelled once, so a stopping service hangs. `asyncio.timeout` keeps the cancellation count
and re-raises it, so this one never swallows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """Await `aw`, bounded by `timeout` seconds (None: unbounded); TimeoutError when it runs out.
    `aw` is cancelled on timeout, as with asyncio.wait_for."""
    async with asyncio.timeout(timeout):
        return await aw
