"""Helpers of the test_traces_* files: spans recorded in-process by the SDK's in-memory
exporter, and questions about them (one trace, who is whose parent)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@contextmanager
def recorded() -> Iterator[Spans]:
    """Every span finished in this process while the block runs (the SDK's provider is installed
    once per process; the API's no-op tracer would record nothing)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield Spans(exporter)
    finally:
        exporter.clear()
        exporter.shutdown()


class Spans:
    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def clear(self) -> None:
        self.exporter.clear()

    def named(self, name: str, trace_id: int | None = None) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name and (trace_id is None or s.context.trace_id == trace_id)]

    def one(self, name: str, trace_id: int | None = None) -> ReadableSpan:
        found = self.named(name, trace_id)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names(trace_id)}"
        return found[0]

    def names(self, trace_id: int | None = None) -> list[str]:
        return sorted({s.name for s in self.all() if trace_id is None or s.context.trace_id == trace_id})

    def trace_of(self, span: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.all() if s.context.trace_id == span.context.trace_id]

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        return [
            s
            for s in self.all()
            if s.parent is not None
            and s.parent.span_id == parent.context.span_id
            and (name is None or s.name == name or s.name.startswith(name))
        ]

    def ancestors(self, span: ReadableSpan) -> list[ReadableSpan]:
        """Its parent, the parent's parent, ... as far as recorded spans go."""
        by_id = {s.context.span_id: s for s in self.all()}
        out = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            out.append(span)
        return out


def is_parent(parent: ReadableSpan, child: ReadableSpan) -> bool:
    return (
        child.parent is not None
        and child.parent.span_id == parent.context.span_id
        and child.context.trace_id == parent.context.trace_id
    )
