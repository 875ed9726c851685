"""Identifiers minted by shardlog."""

from __future__ import annotations

import os
import time


def new_object_id() -> str:
    """An ObjectId-like id: 4 bytes of seconds, 8 random bytes, as 24 hex characters
    (a string: shardlog documents are JSON, which has no ObjectId type)."""
    return f"{int(time.time()):08x}{os.urandom(8).hex()}"
