"""Run the wire skeleton alone (no Kafka): `python -m services.router.wire --port 27017`."""

from __future__ import annotations

import argparse
import asyncio
import logging

from services.router.wire.server import DEFAULT_PORT, WireServer


async def main(host: str, port: int, compressors: tuple[str, ...]) -> None:
    server = WireServer(host, port, compressors=compressors)
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
    parser.add_argument("--compressors", default="", help="comma-separated: zlib, noop (default: none)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    offered = tuple(c for c in args.compressors.split(",") if c)
    asyncio.run(main(args.host, args.port, offered))
