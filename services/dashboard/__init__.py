"""Dashboard (any number of instances; each serves its own page): the live cluster page and
its JSON snapshot over HTTP (SHARDLOG_DASHBOARD_PORT, default 8090).

Reads:   <cluster>.config.events       (the catalog: shards, chunks, zones, migrations; its own follower)
         <cluster>.shard.stats         (every shard's data size and documents)
         its inbox <cluster>.inbox.dashboard (the answers to its status queries)
         <cluster>.metrics             (figures.py, a faust app with RocksDB-backed windowed
                                        tables: the last minute's ops/s and latency)
Writes:  <cluster>.shard.<id>.requests (ListMigrations: the donors' live progress, range-deletion tasks)
         <cluster>.balancer.commands   (GetBalancerState)
         <cluster>.dashboard.figures-summaries-changelog  (faust's changelog of those tables)
         <cluster>.deadletter          (metric records that do not parse)
It changes nothing: every query is read-only, bounded by a short timeout, and sent only while a
page asks (docs/reference/observability.md, "The cluster page").

- `snapshot.py`  the cluster picture, pure: assembled from the catalog, statistics and answers
- `figures.py`   the last minute's ops/s, p50/p99 and ops by type per shard, collection, router
- `server.py`    the service: gathering, the HTTP server
- `static/`      the page: our own HTML, CSS and JS (no CDN, no build step)
"""
