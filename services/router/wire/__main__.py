"""Run the wire skeleton alone (no Kafka): `python -m services.router.wire --port 27017`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from services.router.wire.server import DEFAULT_PORT, WireServer, WireSettings


async def main(host: str, port: int, settings: WireSettings) -> None:
    server = WireServer(host, port, compressors=settings.compressors, max_connections=settings.max_connections)
    await server.start()
    print(f"shardlog wire skeleton: mongodb://{host}:{server.port}/?directConnection=true", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--compressors",
        help="comma-separated: zlib, noop; 'disabled' for none (default: $SHARDLOG_ROUTER_COMPRESSORS or zlib)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    env = dict(os.environ)
    if args.compressors is not None:
        env["SHARDLOG_ROUTER_COMPRESSORS"] = args.compressors
    asyncio.run(main(args.host, args.port, WireSettings.from_env(env)))
