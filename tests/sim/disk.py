"""The simulated processes' disk: each RocksDB store (`libs.store.Store`) as a sorted map in
memory, so that a schedule's dozens of store opens and closes cost nothing (on /dev/shm a
RocksDB open and close took ~4 ms: a quarter of a schedule's time).

`Store`'s own code runs unchanged (its checkpoints, its write batches, its prefix scans): only
the engine under it, `Store.db`, is replaced by `MemoryDB`, which keeps what the services rely
on from RocksDB:

- a write batch applies atomically, its range deletions first, in order;
- keys iterate in bytewise order, and an iterator reads the store as it was when the iterator
  was made (RocksDB's implicit snapshot), whatever is written meanwhile;
- what a process wrote survives its crash (`kill -9` loses no write RocksDB acknowledged), and
  is gone when the simulator loses the store (`SimDisk.lose`);
- one process at a time: opening a store that is open raises, as RocksDB's lock does, and a
  closed store refuses every operation (`DbClosedError`).

`python -m tests.sim --rocksdb` runs the schedules on RocksDB itself (/dev/shm) instead."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rocksdict import DbClosedError

from libs import store as store_module


class _File:
    """One store's contents: a dict and its keys in order. A write replaces both (copy on
    write), so an iterator made before it keeps reading the old ones."""

    __slots__ = ("data", "keys", "open")

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []
        self.open = False


class MemoryWriteBatch:
    """`rocksdict.WriteBatch`'s operations that `Store.commit` uses, recorded in order."""

    def __init__(self, raw_mode: bool = True) -> None:
        self.ops: list[tuple[int, bytes, bytes | None]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append((0, key, value))

    def delete(self, key: bytes) -> None:
        self.ops.append((1, key, None))

    def delete_range(self, start: bytes, stop: bytes) -> None:
        self.ops.append((2, start, stop))


class MemoryIter:
    """`rocksdict.RdictIter` over a snapshot: seek, seek_for_prev, valid, key, value, next, prev."""

    __slots__ = ("_data", "_keys", "_i")

    def __init__(self, data: dict[bytes, bytes], keys: list[bytes]) -> None:
        self._data, self._keys, self._i = data, keys, -1

    def seek_to_first(self) -> None:
        self._i = 0

    def seek_to_last(self) -> None:
        self._i = len(self._keys) - 1

    def seek(self, key: bytes) -> None:
        self._i = bisect.bisect_left(self._keys, key)

    def seek_for_prev(self, key: bytes) -> None:
        self._i = bisect.bisect_right(self._keys, key) - 1

    def valid(self) -> bool:
        return 0 <= self._i < len(self._keys)

    def key(self) -> bytes:
        return self._keys[self._i]

    def value(self) -> bytes:
        return self._data[self._keys[self._i]]

    def next(self) -> None:
        self._i += 1

    def prev(self) -> None:
        self._i -= 1


class MemoryDB:
    """The `rocksdict.Rdict` of one open store: get (a key, or a list of them), iter, write, close."""

    def __init__(self, file: _File) -> None:
        if file.open:
            raise OSError("IO error: lock hold by current process: the store is open")  # as RocksDB says it
        file.open = True
        self._file: _File | None = file

    def _open(self) -> _File:
        if self._file is None:
            raise DbClosedError("DB instance already closed")
        return self._file

    def get(self, key: Any, default: Any = None) -> Any:
        data = self._open().data
        if isinstance(key, list):
            return [data.get(k, default) for k in key]
        return data.get(key, default)

    def iter(self, *args: Any) -> MemoryIter:
        f = self._open()
        return MemoryIter(f.data, f.keys)

    def write(self, batch: MemoryWriteBatch, *args: Any) -> None:
        f = self._open()
        data, keys, copied = dict(f.data), f.keys, False
        for op, key, arg in batch.ops:
            if op == 0:
                assert arg is not None
                if key not in data:
                    if not copied:
                        keys, copied = list(keys), True
                    bisect.insort(keys, key)
                data[key] = arg
            elif op == 1:
                if key in data:
                    if not copied:
                        keys, copied = list(keys), True
                    del data[key]
                    del keys[bisect.bisect_left(keys, key)]
            else:
                assert arg is not None
                lo, hi = bisect.bisect_left(keys, key), bisect.bisect_left(keys, arg)
                if lo < hi:
                    if not copied:
                        keys, copied = list(keys), True
                    for k in keys[lo:hi]:
                        del data[k]
                    del keys[lo:hi]
        f.data, f.keys = data, keys

    def close(self) -> None:
        if self._file is not None:
            self._file.open = False
            self._file = None


class SimDisk:
    """Every store of one schedule, by path; kept across crashes, gone with `lose`."""

    def __init__(self) -> None:
        self.files: dict[str, _File] = {}

    def open(self, path: Path) -> MemoryDB:
        return MemoryDB(self.files.setdefault(str(path), _File()))

    def lose(self, directory: Path) -> None:
        """Every store under `directory` (a crashed process's: none of them is open) is gone."""
        prefix = str(directory) + "/"
        for name in [n for n in self.files if n.startswith(prefix)]:
            assert not self.files[name].open, f"{name} is open"
            del self.files[name]

    def paths(self, pattern: str, under: Path) -> list[Path]:
        """The stores under `under` whose path matches `pattern` (a glob, as `Path.glob`), in order."""
        depth, found = len(Path(pattern).parts), []
        for name in self.files:
            path = Path(name)
            if (
                path.is_relative_to(under)
                and len((rel := path.relative_to(under)).parts) == depth
                and rel.match(pattern)
            ):
                found.append(path)
        return sorted(found)

    def contents(self, path: Path) -> dict[bytes, bytes]:
        return dict(self.files[str(path)].data)


@contextmanager
def simulated_disk(disk: SimDisk) -> Iterator[SimDisk]:
    """While it lasts, every `Store` opened lives on `disk` instead of RocksDB."""
    Store = store_module.Store
    saved = (Store.__init__, Store.destroy, store_module.WriteBatch)

    def init(self: store_module.Store, path: str | Path) -> None:
        self.path = Path(path)
        self.db = disk.open(self.path)  # type: ignore[assignment]

    def destroy(self: store_module.Store) -> None:
        self.db.close()
        disk.files.pop(str(self.path), None)

    Store.__init__ = init  # type: ignore[method-assign]
    Store.destroy = destroy  # type: ignore[method-assign]
    store_module.WriteBatch = MemoryWriteBatch  # type: ignore[misc,assignment]
    try:
        yield disk
    finally:
        Store.__init__, Store.destroy, store_module.WriteBatch = saved  # type: ignore[method-assign,misc]
