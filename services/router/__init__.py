"""Router (any number of instances): routes client operations by shard key from a
routing-table cache projected from config.events, and merges shard replies.

Reads:   <cluster>.router.requests  (client operations; one consumer group for all routers)
         <cluster>.inbox.router-<instance>          (shard and config server replies)
         <cluster>.inbox.router-<instance>-cursors  (getMore for this router's cursors)
         <cluster>.config.events    (the routing-table cache)
Writes:  <cluster>.shard.<id>.requests, <cluster>.config.commands (implicit database creation),
         replies to each operation's `reply-to`

- `route.py`      one operation: target (`domain/targeting.py`), send, merge, StaleConfig retries
- `server.py`     the wiring
"""
