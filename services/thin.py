"""Hosting for services whose behaviour later issues fill in: each one starts,
replays its logs (the catalog from config.events), reports ready, and follows."""

from __future__ import annotations

import asyncio
import logging

from libs import kafka
from libs.service import ServiceSettings, clear_ready, common_args, report_ready, run_service, settings_from
from libs.topics import TopicSpec
from services.config.follower import CatalogFollower


async def run_following_catalog(settings: ServiceSettings, name: str, topics: list[TopicSpec] = ()) -> None:
    await kafka.ensure_topics(settings.bootstrap, [*settings.topics.core(), *topics])
    follower = CatalogFollower(settings, name)
    at = await follower.start()
    report_ready(settings, name, configTime=at)
    try:
        while True:
            await asyncio.sleep(3600)
    finally:
        clear_ready(settings, name)
        await follower.stop()
        logging.getLogger(name).info("%s stopped at ConfigTime %d", name, follower.config_time)


def main(name: str) -> None:
    """Entry point of a service that only follows the catalog for now."""
    settings = settings_from(common_args(f"shardlog {name}").parse_args())
    run_service(name, lambda: run_following_catalog(settings, name))
