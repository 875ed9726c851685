"""One way to act on a record by its type: a table from record class to handler.

Every fold of events (`apply`) and every decision on commands (`decide`) in shardlog
dispatches through one of these, so a reader finds each handler by the record it names:

    on_event = Dispatch[Catalog, None]("catalog event")

    class Catalog:
        def apply(self, e, offset):
            on_event(self, e)

        @on_event.register(ev.ShardAdded)
        def _shard_added(self, e: ev.ShardAdded) -> None: ...

A record with no handler raises `Unhandled`, never passes silently (`handles` asks first).  Subclasses are matched exactly: records are flat, one class per type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

Owner = TypeVar("Owner")
Result = TypeVar("Result")
Handler = Callable[..., Any]
H = TypeVar("H", bound=Handler)  # a handler keeps its own signature through `register`


class Unhandled(LookupError):
    """A record this table has no handler for."""


class Dispatch(Generic[Owner, Result]):
    def __init__(self, what: str) -> None:
        self.what = what  # for the error: "catalog event", "balancer command", ...
        self.table: dict[type, Handler] = {}

    def register(self, *types: type) -> Callable[[H], H]:
        def add(fn: H) -> H:
            for t in types:
                if t in self.table:
                    raise ValueError(f"{self.what}: {t.__name__} has two handlers")
                self.table[t] = fn
            return fn

        return add

    def handles(self, record: object) -> bool:
        return type(record) in self.table

    def __call__(self, owner: Owner, record: object, *args: Any) -> Result:
        fn = self.table.get(type(record))
        if fn is None:
            raise Unhandled(f"no handler for {self.what} {type(record).__name__}")
        result: Result = fn(owner, record, *args)
        return result
