"""A service's RocksDB store, whose every write batch carries the consumed offset.

State and checkpoint are written in one `WriteBatch`, so they can never
disagree: after a crash the store is exactly "the fold of the log up to the
checkpoint".  Keys under `\\x00meta/` are the runtime's own.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

log = logging.getLogger(__name__)

META = b"\x00meta/"


@dataclass(frozen=True)
class Checkpoint:
    """Where a projection stands in its log: the next offset to read, a
    fingerprint (CRC-32 of the value) of the last record applied, so a log
    that was recreated under the store is recognised, and the command position
    the log's writer recorded up to there (`command_end`: the offset after the
    last command its committed transactions took; None: none recorded, or a
    store written before it was kept)."""

    topic: str
    partition: int
    next_offset: int
    last_fingerprint: int | None = None
    command_end: int | None = None

    def to_bytes(self) -> bytes:
        # Without a command position, as an earlier version wrote it (and can read it back).
        fields = {k: v for k, v in self.__dict__.items() if k != "command_end" or v is not None}
        return json.dumps(fields).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Checkpoint:
        # Fields a later version adds are ignored, the ones an earlier one lacked take their default.
        fields = json.loads(raw)
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = Rdict(str(self.path), Options(raw_mode=True))
        except Exception as e:  # corrupt store: keep it aside for inspection, rebuild by replay
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error("store %s cannot be opened (%s); moved to %s, rebuilding from the log", self.path, e, aside)
            shutil.move(str(self.path), str(aside))
            self.db = Rdict(str(self.path), Options(raw_mode=True))

    @staticmethod
    def _ckpt_key(topic: str, partition: int) -> bytes:
        return META + f"checkpoint/{topic}/{partition}".encode()

    def checkpoint(self, topic: str, partition: int = 0) -> Checkpoint | None:
        raw = self.db.get(self._ckpt_key(topic, partition))
        return Checkpoint.from_bytes(raw) if raw is not None else None

    def checkpoint_any(self) -> Checkpoint | None:
        """The checkpoint of a store that follows a single log."""
        for _, raw in self.scan(META + b"checkpoint/"):
            return Checkpoint.from_bytes(raw)
        return None

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            yield k, it.value()
            it.next()

    def commit(
        self,
        changes: Iterable[tuple[bytes, bytes | None]],
        checkpoint: Checkpoint | None,
        range_deletions: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """Delete every key in each [start, stop) of `range_deletions`, then apply `changes`
        (value None deletes) and move the checkpoint, atomically.  The ranges go first: a key
        written in the same batch after its range was deleted survives."""
        wb = WriteBatch(raw_mode=True)
        for start, stop in range_deletions:
            wb.delete_range(start, stop)
        for k, v in changes:
            if v is None:
                wb.delete(k)
            else:
                wb.put(k, v)
        if checkpoint is not None:
            wb.put(self._ckpt_key(checkpoint.topic, checkpoint.partition), checkpoint.to_bytes())
        self.db.write(wb)

    def close(self) -> None:
        self.db.close()

    def destroy(self) -> None:
        self.db.close()
        Rdict.destroy(str(self.path))
