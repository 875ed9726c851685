"""The router's wire edge inside a live cluster: pymongo reaches the router it runs in."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kafka


def test_pymongo_connects_to_a_live_router(data_cluster):
    client = data_cluster.mongo_client()
    hello = client.admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert client.admin.command("ping")["ok"] == 1.0
    assert data_cluster.router.wire is not None and data_cluster.router.wire.connections_opened >= 1
