"""Span export never holds up the data path: a full queue or a tracing UI that is down
costs spans, and every one of them is counted (libs.tracing.dropped_spans)."""

from __future__ import annotations

import socket
import threading

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from libs import tracing
from tests.conftest import wait_until


class Stuck(SpanExporter):
    """An exporter whose first export waits until released: a tracing UI that hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []

    def export(self, spans):
        self.batches.append(len(spans))
        self.release.wait(30)
        return SpanExportResult.SUCCESS


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


def test_spans_turned_away_by_a_full_queue_are_counted():
    stuck = Stuck()
    processor = tracing.CountedBatchSpanProcessor(
        tracing.CountedExporter(stuck, "a stuck UI"), max_queue_size=4, max_export_batch_size=1
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    before = tracing.dropped_spans()
    tracer.start_span("first").end()
    wait_until(lambda: stuck.batches, 10, "the worker to hand the first span to the (stuck) exporter")
    for i in range(4):  # fills the queue (4) while the exporter hangs
        tracer.start_span(f"queued {i}").end()
    assert tracing.dropped_spans() == before
    for i in range(3):  # each of these finds the queue full
        tracer.start_span(f"dropped {i}").end()
    assert tracing.dropped_spans() == before + 3
    stuck.release.set()
    provider.shutdown()
    # The exporter got the first span and the four queued ones: 3 lost, 3 counted.
    assert sum(stuck.batches) == 5
    assert tracing.dropped_spans() == before + 3


def test_a_zipkin_that_is_down_costs_the_batch_counted_never_an_exception(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_ZIPKIN_ENDPOINT", f"http://127.0.0.1:{_closed_port()}/api/v2/spans")
    processor = tracing.make_processor("zipkin")
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    before = tracing.dropped_spans()
    with tracer.start_as_current_span("write"):
        with tracer.start_as_current_span("send"):
            pass  # ending a span returns at once whatever the UI does
    assert provider.force_flush(10_000)
    assert tracing.dropped_spans() == before + 2
    provider.shutdown()


def test_the_zipkin_exporter_follows_the_standard_endpoint_variable(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_ZIPKIN_ENDPOINT", "http://zipkin:9411/api/v2/spans")
    processor = tracing.make_processor("zipkin")
    counted = processor.span_exporter
    assert isinstance(counted, tracing.CountedExporter)
    assert counted.inner.endpoint == "http://zipkin:9411/api/v2/spans"
    monkeypatch.delenv("OTEL_EXPORTER_ZIPKIN_ENDPOINT")
    default = tracing.make_processor("zipkin")
    assert default.span_exporter.inner.endpoint == tracing.ZIPKIN_ENDPOINT
    processor.shutdown()
    default.shutdown()
