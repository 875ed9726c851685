"""One CLI command is one trace spanning the CLI and the config server."""

from __future__ import annotations

import json

import pytest
from opentelemetry.trace import SpanKind
from typer.testing import CliRunner

from tests.integration.traces import recorded

pytestmark = pytest.mark.kafka


@pytest.fixture
def spans():
    with recorded() as rec:
        yield rec.exporter


def test_one_cli_command_is_one_trace_across_cli_and_config_server(settings, spans, config_server):
    from cli.main import app

    spans.clear()  # activation of the server emits nothing, but be sure
    # A settings change: a command only the config server takes part in (add-shard would also
    # ask the shard's process to answer first).
    result = CliRunner().invoke(
        app,
        [
            "--bootstrap",
            settings.bootstrap,
            "--cluster",
            settings.cluster,
            "settings",
            "set",
            "orphanCleanupDelaySecs",
            "5",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["value"] == 5
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    root = by_name["shardlog SetSetting"]
    send_cmd = by_name[f"send {settings.topics.config_commands}"]
    process = by_name["config SetSetting"]
    send_event = by_name[f"send {settings.topics.config_events}"]
    assert root.parent is None
    assert {s.context.trace_id for s in (root, send_cmd, process, send_event)} == {root.context.trace_id}
    assert send_cmd.parent.span_id == root.context.span_id and send_cmd.kind == SpanKind.PRODUCER
    # The config server's span continues the context carried in the record's headers.
    assert process.parent.span_id == send_cmd.context.span_id and process.kind == SpanKind.CONSUMER
    # The event is written inside the config server's Kafka transaction, a child of its processing.
    transaction = by_name["config transaction"]
    assert transaction.parent.span_id == process.context.span_id
    assert send_event.parent.span_id == transaction.context.span_id
    # The reply's receipt continues the config server's context.
    assert by_name["receive reply"].parent.span_id == process.context.span_id
    # Replay and activation opened no spans of their own: every span belongs to this trace.
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
