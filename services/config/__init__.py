"""Config server: owns the cluster catalog (shards, databases, collections,
chunks with versions, zones, settings).  One active instance.

Reads:   <cluster>.config.commands   (from the CLI, routers, shards, balancer)
Writes:  <cluster>.config.events     (single writer; its offset is the ConfigTime)
         replies to each command's `reply-to` topic
         <cluster>.deadletter        (commands that do not parse)

- `decide.py`    commands -> events (pure); the catalog it decides against, its versions
                 and settings are the shared `domain` package's (`domain/catalog.py`, ...)
- `server.py`    the wiring: projection + command processor
"""
