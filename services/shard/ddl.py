"""A shard's DDL requests: the driver of `protocol/ddl.py`'s transitions.

The config server's DDL coordinator (services/config/coordinator.py) sends these; each is
decided by its pure transition against the shard's documents and catalog and recorded in the
changelog in the same transaction as its reply.  Fault points (`ddl.shard.<request type>`)
fire here, while the request is decided, so before its transaction commits.
"""

from __future__ import annotations

from collections.abc import Callable

from domain.catalog import Catalog
from libs.commands import CommandError, Decision
from libs.dispatch import Dispatch
from libs.faults import fault_point
from schemas import Record
from schemas import ddl as d
from services.shard.documents import ShardDocuments
from services.shard.protocol import ddl
from services.shard.protocol.common import Shard

on_request: Dispatch[DDLDecider, Decision] = Dispatch("shard DDL request")


class DDLDecider:
    """The DDL requests of one shard; composed into ShardDecider."""

    def __init__(
        self,
        shard_id: str,
        catalog: Catalog,
        documents: ShardDocuments,
        *,
        fault: Callable[[str], None] = fault_point,
    ):
        self.shard = Shard(shard_id, catalog, documents)
        self.fault = fault

    @staticmethod
    def handles(req: Record) -> bool:
        return on_request.handles(req)

    def decide(self, req: Record) -> Decision:
        return on_request(self, req)

    # ------------------------------------------------ the critical section, for CRUD

    def critical_section_wait(self, ns: str) -> CommandError | None:
        """The refusal of any CRUD request on `ns` while a DDL's critical section holds it."""
        section = ddl.section_holding(self.shard, ns)
        return ddl.critical_section_wait(self.shard, ns, section) if section is not None else None

    # ---------------------------------------------------------------- requests

    @on_request.register(d.EnterDDLCriticalSection)
    def _enter(self, req: d.EnterDDLCriticalSection) -> Decision:
        return ddl.enter_critical_section(self.shard, req).decision(self.fault)

    @on_request.register(d.ExitDDLCriticalSection)
    def _exit(self, req: d.ExitDDLCriticalSection) -> Decision:
        return ddl.exit_critical_section(self.shard, req).decision(self.fault)

    @on_request.register(d.DropLocalData)
    def _drop(self, req: d.DropLocalData) -> Decision:
        return ddl.drop_local_data(self.shard, req).decision(self.fault)

    @on_request.register(d.RenameLocalBatch)
    def _rename(self, req: d.RenameLocalBatch) -> Decision:
        return ddl.rename_local_batch(self.shard, req).decision(self.fault)

    @on_request.register(d.RekeyLocalBatch)
    def _rekey(self, req: d.RekeyLocalBatch) -> Decision:
        return ddl.rekey_local_batch(self.shard, req).decision(self.fault)


REQUESTS: tuple[type, ...] = tuple(on_request.table)
