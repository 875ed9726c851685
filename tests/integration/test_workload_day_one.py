"""A workload run after another continues YCSB's key sequence (issue 18, point 11)."""

from __future__ import annotations

import pytest

from schemas import config as c
from services.workload import runner
from tests.integration.test_workload import NS, client_run

pytestmark = pytest.mark.kafka


def test_ycsb_e_after_ycsb_d_inserts_no_key_twice(data_cluster):
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    client_run(data_cluster, lambda coll: runner.load(coll, "d", 100, concurrency=4, batch_size=50, seed=1))
    # Both told the records loaded, as the README's example does: the second must not insert
    # the first one's keys again (DuplicateKey) but continue after them.
    d = client_run(data_cluster, lambda coll: runner.run(coll, "ycsb-d", 300, concurrency=4, record_count=100, seed=2))
    e = client_run(data_cluster, lambda coll: runner.run(coll, "ycsb-e", 300, concurrency=4, record_count=100, seed=3))
    assert d.inserted > 0 and e.inserted > 0, (d.inserted, e.inserted)
    assert d.errors == {} and e.errors == {}, (d.errors, e.errors)
    assert client_run(data_cluster, lambda coll: coll.count_documents({})) == 100 + d.inserted + e.inserted
