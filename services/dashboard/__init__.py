"""Dashboard: the live figures of the cluster.

Reads:   <cluster>.metrics      (per-second summaries of shards and routers; `figures.py`, a faust
                                 app with windowed tables, RocksDB-backed)
Writes:  <cluster>.dashboard.figures-summaries-changelog  (faust's changelog of those tables)
         <cluster>.deadletter   (metric records that do not parse)

- `figures.py`    the last minute's ops/s, p50/p99 and ops by type per shard, collection, router
"""
