"""Shard (one active process per shard id): owns its documents, in RocksDB as
the fold of its changelog; serves CRUD from routers, checking their routing
against its own view of the catalog.

Reads:   <cluster>.shard.<id>.requests   (CRUD from routers; exactly once, group commit)
         <cluster>.config.events         (its catalog: versions and chunk ownership)
Writes:  <cluster>.shard.<id>.changelog  (every write, before it is acknowledged; compacted)
         replies to each request's `reply-to`, <cluster>.deadletter

- `documents.py`   the document store layout and the fold of the changelog
- `decide.py`      requests -> changelog events + replies (versions, ownership filter)
- `protocol/`      the migration protocol's donor, recipient and range-deletion sides:
                   states and pure transitions, one module per role
- `migrations.py`  the MigrationDecider: those transitions with the clock and fault points
- `donor.py`       the donor's coordinator: drives a migration (async, typed dependencies)
- `statistics.py`  chunk statistics for the balancer
- `server.py`      the wiring
"""
