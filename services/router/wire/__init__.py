"""The router's wire-protocol edge (issue 14): what pymongo, mongosh and other MongoDB
drivers connect to, as they connect to a mongos.

Reads:   TCP connections from MongoDB clients (default port 27017): OP_MSG, OP_QUERY (the
         legacy first handshake only), OP_COMPRESSED (noop / zlib, when offered)
Writes:  replies on the same connections: OP_MSG, OP_REPLY (to OP_QUERY); to Kafka only
         through the router's own parts (`edge.py`): shard requests and config commands

- `frames.py`    pure framing and codec: headers, OP_MSG sections and checksum (CRC-32C),
                 OP_QUERY / OP_REPLY, OP_COMPRESSED, size limits; BSON is pymongo's `bson`
- `commands.py`  the command table: handshake (`hello` / `isMaster`) and server commands
                 answered without Kafka; CommandNotFound (59) for everything else
- `edge.py`      the router's parts a handler reaches the cluster through (RouterEdge)
- `crud.py`      insert / update / delete / find / getMore / killCursors / count / distinct /
                 findAndModify
- `aggregate.py` aggregate: pushdown to the shards, the rest on the router
- `bulk.py`      bulkWrite (MongoDB 8.0): several namespaces, per-operation results in a cursor
- `options.py`   every command's fields: honoured, or refused (never accepted and ignored)
- `admin.py`     sharding administration (addShard, shardCollection, moveRange, balancer, zones)
- `config_db.py` the read-only `config` database from the catalog projection
- `databases.py` listDatabases, listCollections, dbStats, collStats, serverStatus
- `ddl.py`       drop, dropDatabase, renameCollection, refineCollectionShardKey, currentOp
- `indexes.py`   createIndexes, dropIndexes, listIndexes
- `transactions.py` multi-document transactions: their fields on statements, commitTransaction /
                 abortTransaction, what a transaction refuses (263), TransientTransactionError and
                 UnknownTransactionCommitResult labels
- `server.py`    the asyncio streams server: one task per connection, no threads
- `__main__.py`  `python -m services.router.wire --port 27017`: the skeleton alone, for trying a client

Design note: docs/design/wire-protocol.md.
"""

# Each module registers its commands in commands.SERVER_COMMANDS when imported.
from services.router.wire import (  # noqa: E402, F401
    admin,
    aggregate,
    bulk,
    config_db,
    crud,
    databases,
    ddl,
    indexes,
    transactions,
)
