"""The RocksDB store: state and checkpoint in one batch; a corrupt store is moved aside."""

from __future__ import annotations

import json

from libs.store import Checkpoint, Store


def test_changes_and_checkpoint_commit_together(tmp_path):
    s = Store(tmp_path / "db")
    s.commit([(b"a", b"1"), (b"b", b"2")], Checkpoint("t", 0, 5, 123))
    s.commit([(b"a", None), (b"c", b"3")], Checkpoint("t", 0, 9, 456))
    s.close()
    s = Store(tmp_path / "db")
    assert {k: v for k, v in s.scan(b"") if not k.startswith(b"\x00")} == {b"b": b"2", b"c": b"3"}
    assert s.checkpoint("t", 0) == Checkpoint("t", 0, 9, 456)
    assert s.checkpoint("t", 1) is None and s.checkpoint_any() == Checkpoint("t", 0, 9, 456)
    assert list(s.scan(b"b")) == [(b"b", b"2")]
    s.close()


def test_a_corrupt_store_is_moved_aside_and_starts_empty(tmp_path):
    path = tmp_path / "db"
    s = Store(path)
    s.commit([(b"k", b"v")], Checkpoint("t", 0, 1, 1))
    s.close()
    for f in path.iterdir():  # clobber every file RocksDB needs to open
        if f.is_file():
            f.write_bytes(b"\x00garbage")
    s = Store(path)
    try:
        assert s.checkpoint("t", 0) is None and list(s.scan(b"")) == []
        assert [p.name.startswith("db.corrupt-") for p in tmp_path.iterdir()].count(True) == 1
    finally:
        s.close()


def test_a_checkpoint_keeps_the_recorded_command_position(tmp_path):
    s = Store(tmp_path / "db")
    s.commit([], Checkpoint("t", 0, 7, 1, command_end=42))
    s.close()
    s = Store(tmp_path / "db")
    assert s.checkpoint("t", 0) == Checkpoint("t", 0, 7, 1, 42)
    s.close()


def test_a_checkpoint_written_before_the_command_position_was_kept_has_none(tmp_path):
    s = Store(tmp_path / "db")
    key = Store._ckpt_key("t", 0)
    s.db[key] = json.dumps({"topic": "t", "partition": 0, "next_offset": 7, "last_fingerprint": 1}).encode()
    assert s.checkpoint("t", 0) == Checkpoint("t", 0, 7, 1, None)
    # and one written by a later version, with a field this one does not know, still reads
    s.db[key] = json.dumps({"topic": "t", "partition": 0, "next_offset": 8, "command_end": 3, "later": 1}).encode()
    assert s.checkpoint("t", 0) == Checkpoint("t", 0, 8, None, 3)
    s.close()


def test_a_checkpoint_without_a_command_position_is_written_as_before():
    assert json.loads(Checkpoint("t", 0, 7, 1).to_bytes()) == {
        "topic": "t",
        "partition": 0,
        "next_offset": 7,
        "last_fingerprint": 1,
    }
