"""Identifiers minted by shardlog."""

from __future__ import annotations

import os
import time

from bson import ObjectId


def new_object_id() -> ObjectId:
    """A new ObjectId (what a router, a shard's upsert or the client library gives a document
    without an _id, as mongos and the drivers do): a ``bson.ObjectId``, stored as ``{"$oid": ...}``
    in records (docs/decisions/0016)."""
    return ObjectId()


def new_hex_id() -> str:
    """An ObjectId-like id as 24 hex characters (4 bytes of seconds, 8 random bytes): names
    of things that are strings in records (collection epochs)."""
    return f"{int(time.time()):08x}{os.urandom(8).hex()}"
