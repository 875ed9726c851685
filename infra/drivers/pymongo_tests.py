#!/usr/bin/env python3
"""The MongoDB drivers' specification tests as pymongo's source distribution ships them, with
pymongo's own unified-format runner (its `test` package): the transactions tests run against a
shardlog cluster (tests/integration/test_transactions_spec.py).

    python infra/drivers/pymongo_tests.py fetch   # the sdist's tests into the cache (once; offline afterwards)
    python infra/drivers/pymongo_tests.py dir     # where they are: DIR/test is pymongo's `test` package

`fetch` runs pip (the Python it runs under: the virtualenv's, so the sdist is the pymongo that is
installed) to download pymongo's sdist from PyPI, checked against the SHA-256 pinned below, and
unpacks the runner (the `test` package's top-level modules) and the spec directories SPEC_DIRS
into ~/.cache/shardlog/pymongo-<version>-tests/sdist (SHARDLOG_CACHE), through a scratch dir renamed
when complete, like the other fetchers here.  A new pymongo needs its sdist's digest here.

Standard library only (and pip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

# pymongo's sdist per version: its SHA-256 (PyPI's), checked by pip --require-hashes.
SDISTS = {"4.20.0": "f773b0aec28687587cdeda490463a82debc4566a4a3620dcc8dada9d2c0a1acd"}
SPEC_DIRS = ("transactions", "transactions-convenient-api")
ROOT_CACHE = Path(os.environ.get("SHARDLOG_CACHE", Path.home() / ".cache" / "shardlog"))


def version() -> str:
    return metadata.version("pymongo")


def cache_dir() -> Path:
    return ROOT_CACHE / f"pymongo-{version()}-tests"


def wanted(name: str, top: str) -> bool:
    """The runner's modules (test/*.py and test/asynchronous/*.py, which it imports too) and the
    spec directories' files."""
    parts = name.split("/")
    if parts[0] != top or len(parts) < 3 or parts[1] != "test":
        return False
    runner = parts[-1].endswith(".py") and (len(parts) == 3 or (len(parts) == 4 and parts[2] == "asynchronous"))
    return runner or parts[2] in SPEC_DIRS


def fetch() -> Path:
    out = cache_dir()
    if (out / ".complete").exists():
        return out / "sdist"
    v = version()
    if v not in SDISTS:
        sys.exit(f"pymongo_tests: no pinned SHA-256 for pymongo {v}'s sdist; add it to SDISTS in {__file__}")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"pymongo_tests: fetching pymongo {v}'s sdist with pip, its tests into {out}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        req = Path(scratch) / "requirements.txt"
        req.write_text(f"pymongo=={v} --hash=sha256:{SDISTS[v]}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            + ["--require-hashes", "-r", str(req), "-d", scratch],
            check=True,
        )
        top = f"pymongo-{v}"
        with tarfile.open(Path(scratch) / f"{top}.tar.gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and wanted(m.name, top)]
            tar.extractall(tmp, members=members, filter="data")
    (tmp / top).rename(tmp / "sdist")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    (out / ".complete").touch()
    return out / "sdist"


def main(argv: list[str]) -> int:
    if argv == ["fetch"]:
        print(fetch())
        return 0
    if argv == ["dir"]:
        print(cache_dir() / "sdist")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
