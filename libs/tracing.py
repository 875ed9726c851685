"""W3C trace context in Kafka record headers, and span export (Zipkin or OTLP) from OTEL_* variables.

Each hop opens its own spans (producer, consumer/process) from the context in
the record's headers, so one client operation is one trace across services.
Replay never opens spans: it is history, not work.

Export never touches the data path: finished spans go to a bounded in-memory queue
(BatchSpanProcessor) that a background thread ships in batches.  A span that finds
the queue full, or whose batch the tracing UI did not take (down, slow, refusing),
is dropped and counted: `dropped_spans()`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

log = logging.getLogger(__name__)
tracer = trace.get_tracer("shardlog")

Headers = Sequence[tuple[str, bytes]]

ZIPKIN_ENDPOINT = "http://127.0.0.1:9411/api/v2/spans"  # OTEL_EXPORTER_ZIPKIN_ENDPOINT's default here
EXPORTERS = ("zipkin", "otlp", "none")

_dropped = 0
_dropped_lock = threading.Lock()


def dropped_spans() -> int:
    """Spans this process finished but did not deliver: the export queue was full, or the
    tracing UI did not take their batch.  Never reset; the metrics helper reports it."""
    return _dropped


def _drop(n: int) -> None:
    global _dropped
    with _dropped_lock:
        _dropped += n


class CountedExporter(SpanExporter):
    """An exporter whose failures are counted drops, never exceptions: a tracing UI that is
    down costs its spans and one log line a minute, and the next batch tries again."""

    def __init__(self, inner: SpanExporter, what: str) -> None:
        self.inner, self.what = inner, what
        self._warned_at = -1e9

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
            error = "" if result == SpanExportResult.SUCCESS else "refused"
        except Exception as e:  # connection refused, timeout, ...: the UI's problem, not ours
            result, error = SpanExportResult.FAILURE, f"{type(e).__name__}: {e}"
        if result != SpanExportResult.SUCCESS:
            _drop(len(spans))
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                log.warning(
                    "tracing: %d spans dropped, %s did not take them (%s); %d dropped so far",
                    len(spans),
                    self.what,
                    error[:200],
                    _dropped,
                )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountedBatchSpanProcessor(BatchSpanProcessor):
    """BatchSpanProcessor (queue size OTEL_BSP_MAX_QUEUE_SIZE, batch OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    every OTEL_BSP_SCHEDULE_DELAY ms) that counts the spans its full queue turns away."""

    def __init__(self, exporter: SpanExporter, **kw: int) -> None:
        super().__init__(exporter, **kw)  # type: ignore[arg-type]
        # The SDK's queue is a deque with a maxlen: at the bound, adding one span drops another.
        self._queue = self._batch_processor._queue
        self.max_queue_size = self._queue.maxlen or 0

    def on_end(self, span: ReadableSpan) -> None:
        if span.context and span.context.trace_flags.sampled and len(self._queue) >= self.max_queue_size:
            _drop(1)
        super().on_end(span)


def setup(service_name: str) -> None:
    """Install a tracer provider that exports spans, as OTEL_TRACES_EXPORTER says.

    zipkin: JSON v2 to OTEL_EXPORTER_ZIPKIN_ENDPOINT (default http://127.0.0.1:9411/api/v2/spans,
    what `make up` starts); otlp: OTLP/HTTP with the exporter's own OTEL_EXPORTER_OTLP_* variables;
    none: no export.  Unset: otlp when an OTLP endpoint is set, else none.  Honours
    OTEL_SDK_DISABLED, OTEL_SERVICE_NAME and the batch processor's OTEL_BSP_* variables.
    Without export spans are not recorded, yet still carry context across hops.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return  # already set up (tests install their own)
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if _has_endpoint() else "none").strip().lower()
    if exporter not in ("zipkin", "otlp"):
        if exporter != "none":
            log.warning("tracing: OTEL_TRACES_EXPORTER=%r is not one of %s; not exporting", exporter, EXPORTERS)
        # Nothing to export: keep the API's no-op tracer.  It still passes the incoming
        # traceparent on, so traces stay whole across hops, at no recording cost.
        return
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(make_processor(exporter))
    trace.set_tracer_provider(provider)


def make_processor(exporter: str) -> CountedBatchSpanProcessor:
    """The batch processor for `exporter` (zipkin|otlp), its drops counted."""
    inner: SpanExporter
    if exporter == "zipkin":
        from opentelemetry.exporter.zipkin.json import ZipkinExporter

        endpoint = os.environ.get("OTEL_EXPORTER_ZIPKIN_ENDPOINT") or ZIPKIN_ENDPOINT
        inner, what = ZipkinExporter(endpoint=endpoint), f"Zipkin at {endpoint}"
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        inner, what = OTLPSpanExporter(), "the OTLP endpoint"
    return CountedBatchSpanProcessor(CountedExporter(inner, what))


def shutdown() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(5000)


def _has_endpoint() -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def inject(headers: list[tuple[str, bytes]] | None = None) -> list[tuple[str, bytes]]:
    """Headers plus the current span's traceparent (and tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    out = list(headers or [])
    out.extend((k, v.encode()) for k, v in carrier.items())
    return out


def extract(headers: Headers | None) -> otel_context.Context:
    carrier = {k: v.decode(errors="replace") for k, v in (headers or ()) if k in ("traceparent", "tracestate")}
    return propagate.extract(carrier)


# ------------------------------------------------------------ span creation
# (docs/reference/observability.md, "What a trace shows": the span names and attributes)

# db.system: "shardlog", not "mongodb".  These spans are the database's own, server side; the
# "mongodb" value promises MongoDB's server, whose behaviour and attributes backends assume.
DB_SYSTEM = "shardlog"
KAFKA = "kafka"
ROOT = otel_context.Context()  # an empty context: a span started in it begins a trace of its own


def traceparent() -> str:
    """The current span's context as a W3C traceparent, for a record that outlives the request
    ("" when there is no valid context).  Works under the no-op tracer too (it passes context on)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def context_of(parent: str) -> otel_context.Context:
    """A context that continues a stored traceparent; a new trace's root context when empty."""
    return propagate.extract({"traceparent": parent}) if parent else ROOT


def db_attributes(ns: str | None, operation: str) -> dict[str, AttributeValue]:
    """OpenTelemetry's database attributes of an operation on namespace `db.coll` (or a database)."""
    out: dict[str, AttributeValue] = {"db.system": DB_SYSTEM, "db.operation.name": operation}
    if ns:
        db, dot, coll = ns.partition(".")
        out["db.namespace"] = db
        if dot:
            out["db.collection.name"] = coll
    return out


def record_attributes(rec: object) -> dict[str, AttributeValue]:
    """The messaging attributes of a consumed Kafka record (topic, partition, offset)."""
    return {
        "messaging.system": KAFKA,
        "messaging.operation.type": "process",
        "messaging.destination.name": getattr(rec, "topic", ""),
        "messaging.destination.partition.id": str(getattr(rec, "partition", 0)),
        "messaging.kafka.offset": getattr(rec, "offset", -1),
    }


@contextmanager
def span(
    name: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: otel_context.Context | None = None,
    links: Sequence[trace.Link] = (),
) -> Iterator[trace.Span]:
    """A span made current for the block: a child of the current span, or of `context`
    (ROOT: a trace's root; context_of(traceparent): a stored trace continued)."""
    with tracer.start_as_current_span(name, context=context, kind=kind, links=links, attributes=attributes) as s:
        yield s


@contextmanager
def untraced() -> Iterator[None]:
    """Background polling that should not fill the tracing UI: what is sent in the block carries
    a traceparent that is not sampled, so no hop records spans for it (the SDK's default sampler
    follows the parent's decision)."""
    ctx = trace.SpanContext(
        trace_id=random.getrandbits(128) or 1,
        span_id=random.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
    )
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def process_span(name: str, headers: Headers | None, **attributes: AttributeValue) -> Iterator[trace.Span]:
    """A consumer-side span for handling one record, child of the sender's span."""
    with tracer.start_as_current_span(
        name,
        context=extract(headers),
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": KAFKA, "messaging.operation.type": "process", **attributes},
    ) as span:
        yield span


@contextmanager
def producer_span(topic: str, **attributes: AttributeValue) -> Iterator[trace.Span]:
    with tracer.start_as_current_span(
        f"send {topic}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": KAFKA,
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            **attributes,
        },
    ) as span:
        yield span
