"""CRUD over the wire: insert, update, delete, find / getMore / killCursors, count, distinct,
findAndModify.  Each command document becomes the client operation record the Kafka front
takes (`schemas.shard`), run by `RouterEdge.routing.handle`; results and errors come back
in the drivers' shapes (n, nModified, upserted, writeErrors with MongoDB's codes)."""

from __future__ import annotations
