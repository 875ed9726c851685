"""Shard (one active process per shard id): owns its documents, in RocksDB as
the fold of its changelog; serves CRUD from routers, checking their routing
against its own view of the catalog; donates and receives chunk ranges.

Reads:   <cluster>.shard.<id>.requests   (CRUD from routers, migration steps from donors and
                                          from its own coordinator, range deletion batches,
                                          index build steps from its own index builder;
                                          exactly once, group commit)
         <cluster>.config.events         (its catalog: versions and chunk ownership)
         <cluster>.shard.<id>.changelog  (the donor re-reads its own writes to a range in
                                          migration, to forward them to the recipient)
         <cluster>.inbox.shard-<id>-migrations  (replies to its migration coordinator)
         <cluster>.inbox.shard-<id>-indexes     (replies to its index builder)
Writes:  <cluster>.shard.<id>.changelog  (every write, before it is acknowledged; compacted)
         <cluster>.shard.<recipient>.requests  (a donation: clone batches, mods, commit of the clone)
         <cluster>.config.commands       (CommitMigration / AbortMigration, CommitPrimaryMove ...)
         <cluster>.shard.stats           (chunk sizes and writes, for the balancer; compacted)
         <cluster>.metrics               (requests decided per second, by type and namespace, with
                                          their latency: libs/metrics.py; fire-and-forget)
         replies to each request's `reply-to`, <cluster>.deadletter

- `documents.py`     the document store layout and the fold of the changelog
- `decide.py`        requests -> changelog events + replies (versions, ownership filter)
- `protocol/`        the migration protocol's donor, recipient and range-deletion roles as
                     pure state machines (states, the state each request expects and leaves)
- `migrations.py`    the driver of those transitions inside `decide` (clock, fault points)
- `indexes.py`       secondary indexes: BuildIndexes, IndexBuildStep, DropIndexes, ListIndexes
                     (`protocol/index_build.py`) and the builder that steps unfinished builds
- `donor.py`         the donor's coordinator: drives a migration step by step over Kafka
- `statistics.py`    the periodic statistics report
- `server.py`        the wiring
"""
