"""The router's wire-protocol edge (issue 14): what pymongo, mongosh and other MongoDB
drivers connect to, as they connect to a mongos.

Reads:   TCP connections from MongoDB clients (default port 27017): OP_MSG, OP_QUERY (the
         legacy first handshake only), OP_COMPRESSED (noop / zlib, when offered)
Writes:  replies on the same connections: OP_MSG, OP_REPLY (to OP_QUERY); nothing to Kafka yet

- `frames.py`    pure framing and codec: headers, OP_MSG sections and checksum (CRC-32C),
                 OP_QUERY / OP_REPLY, OP_COMPRESSED, size limits; BSON is pymongo's `bson`
- `commands.py`  the command table: handshake (`hello` / `isMaster`) and server commands
                 answered without Kafka; CommandNotFound (59) for everything else
- `server.py`    the asyncio streams server: one task per connection, no threads
- `__main__.py`  `python -m services.router.wire --port 27017`: the skeleton alone, for trying a client

Design note: docs/design/wire-protocol.md.
"""
