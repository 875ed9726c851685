"""libs.tracing's helpers for span creation: semantic-convention attributes, and a stored
traceparent that continues a trace (what migrations and range-deletion tasks record)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from libs import tracing


def test_db_attributes_split_a_namespace_into_database_and_collection():
    assert tracing.db_attributes("app.users.archive", "insert") == {
        "db.system": "shardlog",
        "db.operation.name": "insert",
        "db.namespace": "app",
        "db.collection.name": "users.archive",
    }
    assert tracing.db_attributes("app", "movePrimary") == {
        "db.system": "shardlog",
        "db.operation.name": "movePrimary",
        "db.namespace": "app",
    }
    assert "db.namespace" not in tracing.db_attributes(None, "ping")


def test_a_stored_traceparent_continues_its_trace_and_an_empty_one_starts_a_new_trace():
    tracer = TracerProvider().get_tracer("test")  # a private SDK tracer: records, leaves the global alone
    assert tracing.traceparent() == ""  # no current span
    with tracer.start_as_current_span("request") as request:
        stored = tracing.traceparent()
    ctx = request.get_span_context()
    assert stored.startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    with tracer.start_as_current_span("later", context=tracing.context_of(stored)) as later:
        assert later.get_span_context().trace_id == ctx.trace_id
        assert later.parent is not None and later.parent.span_id == ctx.span_id
        # ROOT ignores the current span: a new trace.
        with tracer.start_as_current_span("round", context=tracing.context_of("")) as root:
            assert root.parent is None and root.get_span_context().trace_id != ctx.trace_id
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_what_is_sent_untraced_records_no_span_downstream():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracing.untraced():
        carried = tracing.traceparent()
        with tracer.start_as_current_span("send"):
            pass
    assert carried.endswith("-00"), "the context travels, marked not sampled"
    with tracer.start_as_current_span("process", context=tracing.context_of(carried)) as downstream:
        assert not downstream.is_recording()
    assert exporter.get_finished_spans() == ()
