"""services/router/wire/gossip.py: a snapshot read's time chosen once per command at the wire
edge (issue 32 §3), and the config database refusing snapshot reads."""

from __future__ import annotations

import pytest
from bson import Timestamp

from domain.protocol import ErrorCode
from libs.errors import CommandError
from services.router.wire.gossip import pinned_read_concern, refuse_snapshot_of_config, snapshot_time

NOW = (1_800_000_000 << 32) | 7


def test_a_snapshot_read_without_a_time_reads_at_the_routers():
    rc = pinned_read_concern({"level": "snapshot"}, NOW)
    assert snapshot_time(rc) == Timestamp(1_800_000_000, 7)


def test_a_named_time_is_kept():
    rc = pinned_read_concern({"level": "snapshot", "atClusterTime": Timestamp(5, 1)}, NOW)
    assert snapshot_time(rc) == Timestamp(5, 1)


def test_a_causal_snapshot_read_reads_at_the_routers_time_which_is_after_it():
    rc = pinned_read_concern({"level": "snapshot", "afterClusterTime": Timestamp(1_700_000_000, 1)}, NOW)
    assert rc == {"level": "snapshot", "atClusterTime": {"$timestamp": {"t": 1_800_000_000, "i": 7}}}


@pytest.mark.parametrize(
    "rc",
    [
        {"level": "snapshot", "afterClusterTime": Timestamp(1_900_000_000, 1)},  # nobody handed it out
        {"level": "snapshot", "afterClusterTime": "soon"},  # malformed: the router says why
        {"level": "local"},
        None,
    ],
)
def test_anything_else_is_left_for_the_router_to_judge(rc):
    pinned = pinned_read_concern(rc, NOW)
    assert snapshot_time(pinned) is None
    assert pinned is None if rc is None else set(pinned) == set(rc)


def test_the_config_database_refuses_a_snapshot_read_and_only_that():
    with pytest.raises(CommandError) as e:
        refuse_snapshot_of_config("config.chunks", {"level": "snapshot", "atClusterTime": Timestamp(5, 1)})
    assert e.value.code == ErrorCode.InvalidOptions  # 72 on the wire
    refuse_snapshot_of_config("config.chunks", {"level": "local"})
    refuse_snapshot_of_config("app.chunks", {"level": "snapshot"})
