"""The shared domain: what every service and the CLI mean by a catalog, a chunk, a version,
a shard key, a query and an error, with no I/O of its own beyond following the catalog log.

- `catalog.py`     the catalog (shards, databases, collections, chunks, zones, migrations,
                   settings) as the fold of config.events
- `versions.py`    chunk, shard, collection and database version arithmetic
- `settings.py`    cluster and collection settings, their defaults and validation
- `follower.py`    a durable, tailing copy of the catalog; the catalog as of a ConfigTime
- `targeting.py`   which shards a document or a filter goes to
- `shardkey.py`    key patterns, key encoding and order, hashing, Extended JSON bounds
- `query.py`       filters, sort, projection and update operators
- `splitvector.py` where to split a chunk (splitVector), jumbo chunks, the top-chunk move
- `protocol.py`    headers, size limits, name rules and the error codes of replies

Services import `libs`, `domain` and `schemas`, never each other (pyproject's import contracts).
"""
