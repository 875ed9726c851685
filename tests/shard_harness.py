"""One shard's decisions as its command processor makes them, without the processor or Kafka:
the shared harness of the shard's unit tests (decide, DDL, indexes, the migration protocol).

A catalog built by the config server's own pure `decide`, a real RocksDB store, a shard
decider over them; `run` decides a request and applies its events as the processor does (not
committed yet), `given` applies events already in the changelog, `commit` writes what is
pending to the store; every event is kept in `log`, the changelog in order. The whole cluster
with its processors, on the in-memory bus, is the simulator's (tests/sim/)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from domain.catalog import Catalog
from libs.store import META, Store
from schemas import Record
from schemas import config as c
from schemas import shard as s
from services.config.decide import decide as config_decide
from services.shard.decide import ShardDecider
from services.shard.documents import ShardDocuments


class ShardHarness:
    def __init__(
        self,
        path: Path,
        shard_id: str = "a",
        *,
        setup: Iterable[Record] = (),
        shards: tuple[str, ...] = ("a", "b"),
        documents: ShardDocuments | None = None,
    ) -> None:
        """Shards `shards` added, then the config commands of `setup` decided and applied."""
        self.path, self.shard_id = path, shard_id
        self.catalog = Catalog(track_changes=False)
        for sid in shards:
            self.config(c.AddShard(shard=sid))
        for cmd in setup:
            self.config(cmd)
        self.store = Store(path / f"docs-{shard_id}")
        self.documents = documents if documents is not None else ShardDocuments()
        self.documents.load(self.store)
        self.decider = self.make_decider()
        self.log: list[Record] = []

    def make_decider(self) -> Any:
        """The decider under test (a subclass may build another, with its own clock or faults)."""
        return ShardDecider(self.shard_id, self.catalog, self.documents)

    # ------------------------------------------------------------ the catalog

    def config(self, cmd: Record) -> Any:
        """Decide a config command and apply its events to the catalog; its result."""
        dec = config_decide(self.catalog, cmd)
        self.catalog_apply(dec.events)
        return dec.result

    def catalog_apply(self, events: Iterable[Record]) -> None:
        for e in events:
            self.catalog.apply(e, self.catalog.config_time)

    def routing(self, ns: str) -> s.Routing:
        """What a router with the current catalog sends with a request for `ns`."""
        coll = self.catalog.collections.get(ns)
        if coll is None:
            return s.Routing(configTime=self.catalog.config_time)
        return s.Routing(
            configTime=self.catalog.config_time, epoch=coll.epoch, version=coll.shard_version(self.shard_id).pair
        )

    # ------------------------------------------------------------ the shard

    def run(self, req: Record) -> tuple[list[Record], Any]:
        """Decide and apply as the command processor does (not committed yet): (events, result)."""
        dec = self.decider.decide(req)
        for e in dec.events:
            self.documents.apply(e, -1)
        self.log += dec.events
        return dec.events, dec.result

    def given(self, *events: Record) -> None:
        """Events already in the changelog (committed)."""
        for e in events:
            self.documents.apply(e, -1)
            self.log.append(e)
        self.commit()

    def commit(self) -> None:
        self.store.commit(self.documents.drain_changes().items(), None, self.documents.drain_range_deletions())

    def ids(self, ns: str) -> list[Any]:
        return sorted(doc["_id"] for _, doc in self.documents.scan(ns))

    def stored(self) -> dict[bytes, bytes]:
        """The store's contents but the runtime's own keys."""
        return {k: v for k, v in self.store.scan(b"") if not k.startswith(META)}

    def close(self) -> None:
        self.store.close()
