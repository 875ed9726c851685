"""Records of the data path: client -> router (`router.requests`) and router ->
shard (`shard.<id>.requests`) share the request models (a router adds `routing`);
`shard.<id>.changelog` holds a shard's documents.

Records of a shard: `shard.<id>.requests` in (CRUD from routers), and
`shard.<id>.changelog` out (the shard's documents; compacted by document identity).

Every data request carries the router's `Routing`: the ConfigTime it routed
at and the version it believes this shard has for the collection, so the
shard can answer StaleConfig instead of serving from a different placement.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field

from schemas import Codec, Record

Doc = dict[str, Any]


class Routing(Record):
    """What the router believed when it chose this shard.

    `epoch` None: the router thinks the collection is unsharded, so this shard
    must be its database's primary.  Otherwise `version` is the (major, minor)
    of this shard's version for the collection.
    """

    type: Literal["Routing"] = "Routing"
    v: Literal[1] = 1
    configTime: int
    epoch: str | None = None
    version: tuple[int, int] | None = None


# ---------------------------------------------------------------- requests


class Insert(Record):
    type: Literal["Insert"] = "Insert"
    v: Literal[1] = 1
    ns: str
    docs: list[Doc]
    ordered: bool = True
    opId: str | None = None  # a retried write with the same opId is applied once
    routing: Routing | None = None  # None: from a client to a router


class Find(Record):
    type: Literal["Find"] = "Find"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)
    sort: Doc | None = None
    skip: int = Field(0, ge=0)
    limit: int = Field(0, ge=0)  # 0: no limit
    projection: Doc | None = None
    batchSize: int = Field(101, ge=1)
    routing: Routing | None = None  # None: from a client to a router


class GetMore(Record):
    type: Literal["GetMore"] = "GetMore"
    v: Literal[1] = 1
    cursorId: int
    batchSize: int = Field(101, ge=1)


class Count(Record):
    type: Literal["Count"] = "Count"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)
    routing: Routing | None = None  # None: from a client to a router


class Update(Record):
    type: Literal["Update"] = "Update"
    v: Literal[1] = 1
    ns: str
    filter: Doc
    update: Doc
    multi: bool = False
    upsert: bool = False
    opId: str | None = None
    routing: Routing | None = None  # None: from a client to a router


class Delete(Record):
    type: Literal["Delete"] = "Delete"
    v: Literal[1] = 1
    ns: str
    filter: Doc
    multi: bool = False
    opId: str | None = None
    routing: Routing | None = None  # None: from a client to a router


class Explain(Record):
    """Which shards a query targets and why (answered by a router)."""

    type: Literal["Explain"] = "Explain"
    v: Literal[1] = 1
    ns: str
    filter: Doc = Field(default_factory=dict)


ShardRequest = Annotated[Union[Insert, Find, GetMore, Count, Update, Delete, Explain], Field(discriminator="type")]
REQUESTS = (Insert, Find, GetMore, Count, Update, Delete, Explain)

# --------------------------------------------------------------- changelog


class DocumentWritten(Record):
    """The document as it now is.  `skey` is the hex of its encoded shard key,
    so replay places it without consulting the catalog."""

    type: Literal["DocumentWritten"] = "DocumentWritten"
    v: Literal[1] = 1
    ns: str
    skey: str
    doc: Doc


class DocumentRemoved(Record):
    type: Literal["DocumentRemoved"] = "DocumentRemoved"
    v: Literal[1] = 1
    ns: str
    skey: str
    id: Any


class WriteRecorded(Record):
    """The result of a write with an opId, so that a retry returns it instead of writing again."""

    type: Literal["WriteRecorded"] = "WriteRecorded"
    v: Literal[1] = 1
    opId: str
    result: Doc


ShardEvent = Annotated[Union[DocumentWritten, DocumentRemoved, WriteRecorded], Field(discriminator="type")]
EVENTS = (DocumentWritten, DocumentRemoved, WriteRecorded)

requests = Codec("shard.requests", ShardRequest, REQUESTS)
changelog = Codec("shard.changelog", ShardEvent, EVENTS)
