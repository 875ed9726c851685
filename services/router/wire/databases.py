"""Database and server introspection: listDatabases, listCollections, dbStats, collStats,
serverStatus (a truthful subset), create / drop where the catalog allows."""

from __future__ import annotations
