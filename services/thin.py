"""Hosting for services whose behaviour later issues fill in: each one starts,
replays its logs (the catalog from config.events), reports ready, and follows."""
from __future__ import annotations

import asyncio
import logging

from libs import kafka
from libs.service import ServiceSettings, clear_ready, report_ready
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
