#!/usr/bin/env python3
"""YCSB's core workload engine driving the MongoDB Java driver, through our binding.

    python infra/ycsb/ycsb.py fetch          # build + jars into the cache (once; offline afterwards)
    python infra/ycsb/ycsb.py classpath      # the java -cp argument
    python infra/ycsb/ycsb.py load [options] # site.ycsb.Client -load
    python infra/ycsb/ycsb.py run  [options] # site.ycsb.Client -t

    options: --url mongodb://127.0.0.1:27017/ycsb?w=1  --workload infra/ycsb/workloads/workloada
             --records N  --ops N  --threads N  --db shardlog.ycsb.MongoWireClient  --status
             --json  -p key=value (any YCSB or binding property, repeatable)

`fetch` (`make ycsb-java`) runs Maven's `package` on infra/ycsb/pom.xml: it downloads
site.ycsb:core and org.mongodb:mongodb-driver-sync from Maven Central, compiles
shardlog.ycsb.MongoWireClient and copies the binding's jar and every runtime jar into
~/.cache/shardlog/ycsb-<version>-<digest>/libs.  The digest covers the pom and the binding's
sources, so a changed binding gets a fresh dir; an unchanged one is a no-op.  `load` / `run`
need only `java` and that dir.

YCSB prints its figures (`[OVERALL], Throughput(ops/sec), ...`, `[READ], 99thPercentileLatency(us),
...`) to stdout; `--json` adds one last line `{"ycsb": ...}` with them parsed, for bench/ scripts.
The exit status is YCSB's, or 3 when `--json` finds a failed operation (a Return= other than OK).

Standard library only, like infra/kafka/local.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
YCSB_VERSION = "0.17.0"
ROOT_CACHE = Path(os.environ.get("SHARDLOG_CACHE", Path.home() / ".cache" / "shardlog"))
SOURCES = [HERE / "pom.xml", *sorted((HERE / "src").rglob("*.java"))]
DEFAULT_URL = "mongodb://127.0.0.1:27017/ycsb?w=1"
DEFAULT_DB = "shardlog.ycsb.MongoWireClient"
DEFAULT_WORKLOAD = HERE / "workloads" / "workloada"
# The driver's own log (slf4j-simple, stderr): warnings and errors only; YCSB_JAVA_OPTS replaces it all.
JAVA_OPTS = os.environ.get(
    "YCSB_JAVA_OPTS",
    "-Xms128m -Xmx512m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.showDateTime=true",
).split()


def cache_dir() -> Path:
    digest = hashlib.sha256()
    for f in SOURCES:
        digest.update(f.relative_to(HERE).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return ROOT_CACHE / f"ycsb-{YCSB_VERSION}-{digest.hexdigest()[:12]}"


def libs() -> Path:
    return cache_dir() / "libs"


def fetch() -> Path:
    """Build the binding and copy the runtime classpath into the cache; a second call is a no-op."""
    out = libs()
    if (out / ".complete").exists():
        return out
    if shutil.which("mvn") is None:
        sys.exit("ycsb: Maven (mvn) is needed to fetch YCSB and the MongoDB Java driver")
    tmp = cache_dir().with_name(cache_dir().name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"ycsb: fetching YCSB {YCSB_VERSION} + the MongoDB Java driver with Maven, building the binding into {out}")
    subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(HERE / "pom.xml"),
            "package",
            f"-Dycsb.out={tmp / 'libs'}",
            f"-Dycsb.build={tmp / 'build'}",
        ],
        check=True,
    )
    shutil.rmtree(tmp / "build")
    shutil.rmtree(cache_dir(), ignore_errors=True)
    tmp.rename(cache_dir())
    (out / ".complete").touch()
    return out


def classpath() -> str:
    out = libs()
    if not (out / ".complete").exists():
        sys.exit(f"ycsb: {out} is not built; run `make ycsb-java` (or `{sys.argv[0]} fetch`) first")
    return f"{out}/*"


# ------------------------------------------------------------------ running


def command(args: argparse.Namespace) -> list[str]:
    cmd = ["java", *JAVA_OPTS, "-cp", classpath(), "site.ycsb.Client", "-load" if args.phase == "load" else "-t"]
    cmd += ["-db", args.db, "-P", str(args.workload), "-threads", str(args.threads)]
    props = {"mongodb.url": args.url}
    if args.records is not None:
        props["recordcount"] = str(args.records)
    if args.ops is not None:
        props["operationcount"] = str(args.ops)
    for kv in args.prop:
        key, sep, value = kv.partition("=")
        if not sep:
            sys.exit(f"ycsb: -p {kv}: expected key=value")
        props[key] = value
    for key, value in props.items():
        cmd += ["-p", f"{key}={value}"]
    if args.status:
        cmd.append("-s")
    return cmd


LINE = re.compile(r"^\[([^\]]+)\], ([^,]+), (.+)$")


def parse(stdout: str) -> dict[str, dict[str, float | int]]:
    """YCSB's text report, `[SECTION], metric, value` lines, as {section: {metric: number}}."""
    report: dict[str, dict[str, float | int]] = {}
    for line in stdout.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        section, metric, raw = m.groups()
        try:
            value: float | int = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                continue
        report.setdefault(section, {})[metric.strip()] = value
    return report


def failures(report: dict[str, dict[str, float | int]]) -> dict[str, int]:
    """Operations YCSB counted with a Return= other than OK (or BATCHED_OK), per section."""
    bad: dict[str, int] = {}
    for section, metrics in report.items():
        for metric, value in metrics.items():
            if metric.startswith("Return=") and metric not in ("Return=OK", "Return=BATCHED_OK") and value:
                bad[f"{section} {metric}"] = int(value)
    return bad


def run(args: argparse.Namespace) -> int:
    cmd = command(args)
    print("ycsb:", " ".join(cmd), file=sys.stderr, flush=True)
    if not args.json:
        return subprocess.run(cmd).returncode
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(proc.stdout)
    report = parse(proc.stdout)
    bad = failures(report)
    line = {
        "ycsb": args.phase,
        "workload": Path(args.workload).name,
        "db": args.db,
        "threads": args.threads,
        "returncode": proc.returncode,
        "failures": bad,
        "report": report,
    }
    print(json.dumps(line), flush=True)
    return proc.returncode or (3 if bad else 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="build the binding and cache the runtime jars (idempotent)")
    sub.add_parser("classpath", help="print the java -cp argument")
    sub.add_parser("dir", help="print the cache dir")
    for phase in ("load", "run"):
        r = sub.add_parser(phase, help=f"site.ycsb.Client {'-load' if phase == 'load' else '-t'}")
        r.set_defaults(phase=phase)
        r.add_argument("--url", default=DEFAULT_URL, help=f"mongodb.url (default {DEFAULT_URL})")
        r.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD, help="a YCSB workload properties file")
        r.add_argument("--records", type=int, help="recordcount (default: the workload file's)")
        r.add_argument("--ops", type=int, help="operationcount (default: the workload file's)")
        r.add_argument("--threads", type=int, default=1)
        r.add_argument("--db", default=DEFAULT_DB, help=f"the YCSB DB class (default {DEFAULT_DB})")
        r.add_argument("--status", action="store_true", help="YCSB's -s: a status line every 10 s on stderr")
        r.add_argument("--json", action="store_true", help='end with one {"ycsb": ...} JSON line')
        r.add_argument("-p", dest="prop", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.cmd == "fetch":
        print(fetch())
        return 0
    if args.cmd == "classpath":
        print(classpath())
        return 0
    if args.cmd == "dir":
        print(cache_dir())
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
