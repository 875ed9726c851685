"""Hosting a service: settings from the environment, logging, readiness, signals.

A service is an asyncio component with `run()`; a host process runs one
(compose, production, crash tests) or several (a light `make up`).  Readiness
is reported by writing `<data_dir>/<name>.ready` (JSON: pid, ConfigTime) once
the service has replayed its logs — for the launcher, never between services.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from libs import tracing
from libs.projection import CheckpointMismatch
from libs.topics import Topics

if TYPE_CHECKING:
    from libs.bus import Bus


@dataclass(frozen=True)
class ServiceSettings:
    bootstrap: str
    cluster: str
    data_dir: Path
    session_timeout_ms: int = 10_000
    # The transport: None is the Kafka broker at `bootstrap`; the simulator gives every service
    # of its cluster one in-memory bus (libs.bus.memory).
    transport: Bus | None = field(default=None, compare=False, repr=False)

    @property
    def topics(self) -> Topics:
        return Topics(self.cluster)

    @property
    def bus(self) -> Bus:
        from libs.bus import connect

        return self.transport if self.transport is not None else connect(self.bootstrap)

    @classmethod
    def from_env(
        cls,
        *,
        bootstrap: str | None = None,
        cluster: str | None = None,
        data_dir: str | Path | None = None,
        session_timeout_ms: int | None = None,
    ) -> ServiceSettings:
        """Each setting from its argument when given (not None), else from the environment."""
        env = os.environ.get
        timeout_ms = int(env("SHARDLOG_SESSION_TIMEOUT_MS", "10000"))
        return cls(
            bootstrap=bootstrap if bootstrap is not None else env("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
            cluster=cluster if cluster is not None else env("SHARDLOG_CLUSTER", "shardlog"),
            data_dir=Path(data_dir if data_dir is not None else env("SHARDLOG_DATA_DIR", ".shardlog/data")),
            session_timeout_ms=session_timeout_ms if session_timeout_ms is not None else timeout_ms,
        )


def seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name` (unset or empty: the
    default); anything else refuses to start the service, rather than running with a bound the
    operator did not mean."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def count_from_env(name: str, default: int) -> int:
    """A positive whole number from the environment variable `name` (unset or empty: the
    default); anything else refuses to start the service, as `seconds_from_env` does."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1")
    return value


def common_args(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP)")
    p.add_argument("--cluster", help="cluster name, the topic prefix (default: $SHARDLOG_CLUSTER or 'shardlog')")
    p.add_argument("--data-dir", help="where this service keeps its RocksDB (default: $SHARDLOG_DATA_DIR)")
    return p


def settings_from(args: argparse.Namespace) -> ServiceSettings:
    return ServiceSettings.from_env(bootstrap=args.bootstrap, cluster=args.cluster, data_dir=args.data_dir)


def report_ready(settings: ServiceSettings, name: str, **info: object) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / f"{name}.ready"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **info}))
    tmp.replace(path)
    logging.getLogger(name).info("%s ready %s", name, info)


def clear_ready(settings: ServiceSettings, name: str) -> None:
    (settings.data_dir / f"{name}.ready").unlink(missing_ok=True)


_failures: list[str] = []

T = TypeVar("T")


def supervised(task: asyncio.Task[T], what: str, *, stop_owner: bool = True) -> asyncio.Task[T]:
    """A background task whose failure must not go unnoticed: it is logged and stops the
    task that started it (the service), rather than leave the service running without it."""
    owner = asyncio.current_task() if stop_owner else None

    def check(t: asyncio.Task[T]) -> None:
        if t.cancelled() or t.exception() is None:
            return
        logging.getLogger(__name__).critical("%s failed; stopping", what, exc_info=t.exception())
        _failures.append(what)
        if owner is not None:
            owner.cancel(f"{what} failed")

    task.add_done_callback(check)
    return task


def run_service(name: str, main: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Run `main()` (a coroutine function) until SIGTERM/SIGINT; exit cleanly."""
    logging.basicConfig(
        level=os.environ.get("SHARDLOG_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    # A reply inbox deleted by a departed client stays in the producer's metadata for a
    # while and is reported at ERROR on every refresh: noise, since sends to it fail loudly anyway.
    logging.getLogger("aiokafka.cluster").setLevel(logging.CRITICAL)
    tracing.setup(f"shardlog-{name}")

    async def guarded() -> None:
        task = asyncio.create_task(main())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            tracing.shutdown()

    try:
        asyncio.run(guarded())
    except CheckpointMismatch as e:
        # A refusal with its own explanation and way out: one line, no traceback to dig through.
        logging.getLogger(__name__).critical("%s", e)
        raise SystemExit(2) from None
    if _failures:
        raise SystemExit(f"{name}: stopped because {', '.join(_failures)} failed")
