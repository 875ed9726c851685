"""Router (any number of instances): routes client operations by shard key from a
routing-table cache projected from config.events, and merges shard replies.

Reads:   MongoDB clients on TCP (the wire edge, `wire/`; SHARDLOG_ROUTER_PORT, default 27017)
         <cluster>.router.requests  (Kafka clients' operations; one consumer group for all routers)
         <cluster>.inbox.router-<instance>          (shard and config server replies)
         <cluster>.inbox.router-<instance>-cursors  (getMore for this router's cursors)
         <cluster>.config.events    (the routing-table cache)
Writes:  <cluster>.shard.<id>.requests, <cluster>.config.commands (implicit database creation,
         the wire's admin commands), replies to each operation's `reply-to` or TCP connection
         <cluster>.metrics          (operations per second, by type and namespace, with their
                                     client-seen latency: libs/metrics.py; fire-and-forget)

- `route.py`      one operation: target (`domain/targeting.py`), send, merge, StaleConfig retries
- `server.py`     the wiring: the Kafka front and the wire edge share one OperationRouter
- `wire/`         the MongoDB wire protocol (OP_MSG, commands, aggregate, admin, config db)
"""
