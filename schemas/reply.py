"""Replies, sent to the requester's inbox topic with the request's correlation id."""

from __future__ import annotations

from typing import Any, Literal

from schemas import Codec, Record
from schemas.bsonjson import RecordForm


class Reply(Record):
    """`ok` with a result, or an error `code` (MongoDB's names where one exists) and a one-line message.

    `configTime` is the offset of `config.events` after which the effect is
    visible: a reader whose projection has reached it sees the change.
    """

    type: Literal["Reply"] = "Reply"
    v: Literal[1] = 1
    ok: bool
    code: str | None = None
    error: str | None = None
    configTime: int | None = None
    # To clients (docs/decisions/0014): the time of the operation (a packed LogicalTime: seconds
    # << 32 | increment) and the router's signed $clusterTime.
    operationTime: int | None = None
    clusterTime: dict[str, Any] | None = None
    # Kept in record form when decoded (a config reply's bounds stay {"$minKey": 1}); a data
    # reply's documents are BSON values when built and read back with from_record by the
    # router and libs.client (docs/decisions/0016).
    result: RecordForm | None = None


replies: Codec[Reply] = Codec("reply", Reply, (Reply,))
