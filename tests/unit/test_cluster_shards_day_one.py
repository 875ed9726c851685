"""Issue 18, point 7: `make up SHARDS=N` runs s0 .. s<N-1>, remembered for the next `make up`."""

from __future__ import annotations

import pytest

from infra.cluster import _shard_count, services, shard_ids


def test_shards_default_to_three_and_grow_with_shards(tmp_path):
    assert shard_ids(_shard_count(tmp_path, None)) == ("s0", "s1", "s2")
    assert shard_ids(_shard_count(tmp_path, 4)) == ("s0", "s1", "s2", "s3")
    assert _shard_count(tmp_path, None) == 4  # the next `make up` restarts s3 too
    assert "shard-s3" in services(shards=shard_ids(4)) and "shard-s3" not in services()


def test_shards_only_add(tmp_path):
    _shard_count(tmp_path, 5)
    with pytest.raises(SystemExit, match="remove-shard"):
        _shard_count(tmp_path, 3)
    with pytest.raises(SystemExit, match="at least 1"):
        _shard_count(tmp_path, 0)
