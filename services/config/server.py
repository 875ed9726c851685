"""The config server: a projection of config.events (the catalog) driving a
command processor on config.commands."""

from __future__ import annotations

from domain.catalog import Catalog
from libs import kafka
from libs.commands import CommandProcessor
from libs.projection import Projection
from libs.service import ServiceSettings, clear_ready, report_ready
from libs.store import Store
from schemas import config as schema
from services.config.decide import decide

NAME = "config"


class ConfigServer:
    def __init__(self, settings: ServiceSettings, *, instance: str = "0", max_batch: int = 500):
        self.settings = settings
        t = settings.topics
        self.catalog = Catalog()
        self.store = Store(settings.data_dir / f"config-{instance}" / "catalog")
        self.projection = Projection(
            settings.bootstrap, t.config_events, schema.events, self.catalog, self.store, name=NAME
        )
        self.processor = CommandProcessor(
            bootstrap=settings.bootstrap,
            command_topic=t.config_commands,
            command_codec=schema.commands,
            projection=self.projection,
            decide=lambda cmd: decide(self.catalog, cmd),
            dead_letters=t.dead_letters,
            group_id=settings.topics.group("config"),
            name=NAME,
            max_batch=max_batch,
            session_timeout_ms=settings.session_timeout_ms,
            on_role=self._report,
        )
        self.instance = instance

    def _report(self, role: str) -> None:
        report_ready(self.settings, self.ready_name, role=role, configTime=self.projection.position)

    @property
    def ready_name(self) -> str:
        return NAME if self.instance == "0" else f"{NAME}-{self.instance}"

    async def run(self) -> None:
        await kafka.ensure_topics(self.settings.bootstrap, self.settings.topics.core())
        await self.projection.start()
        at = await self.projection.catch_up()
        # Ready = replayed and in the group; active or standing by.
        report_ready(self.settings, self.ready_name, role="standby", configTime=at)
        try:
            await self.processor.run()
        finally:
            clear_ready(self.settings, self.ready_name)
            await self.projection.stop()
            self.store.close()
