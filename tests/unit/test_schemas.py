"""Records: exported JSON Schemas are current, and decoding refuses bad records with a reason."""

from __future__ import annotations

import json

import jsonschema
import pytest

from schemas import Codec, RecordError
from schemas import config as c
from schemas.export import OUT, render


def test_exported_json_schemas_are_up_to_date():
    files = render()
    on_disk = {p.name: p.read_text() for p in OUT.glob("*.schema.json")}
    assert on_disk == files, "schemas/json is stale: run `make schemas` and commit the result"


def test_every_record_validates_against_its_exported_schema():
    schema = json.loads((OUT / "config.events.schema.json").read_text())
    ev = c.CollectionSharded(
        ns="a.b",
        key={"x": 1},
        unique=False,
        epoch="e",
        uuid="u",
        chunks=[c.ChunkDoc(min={"x": {"$minKey": 1}}, max={"x": {"$maxKey": 1}}, shard="s0", version=(1, 0))],
    )
    jsonschema.validate(json.loads(Codec.encode(ev)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "CollectionSharded", "v": 1, "ns": "a.b"}, schema)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (None, "empty record"),
        (b"\xff\xfe", "not JSON"),
        (b"{", "not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"v": 1}', "unknown record type None"),
        (b'{"type": "Bogus", "v": 1}', "unknown record type 'Bogus'"),
        (b'{"type": "AddShard"}', "schema version None"),
        (b'{"type": "AddShard", "v": 2, "shard": "s"}', "schema version 2, this build reads v1"),
        (b'{"type": "AddShard", "v": 1}', "AddShard.shard: Field required"),
        (b'{"type": "AddShard", "v": 1, "shard": 5}', "AddShard.shard"),
        (b'{"type": "AddShard", "v": 1, "shard": "s", "x": 1}', "AddShard.x: Extra inputs"),
    ],
)
def test_bad_records_are_refused_with_a_reason(raw, reason):
    with pytest.raises(RecordError) as e:
        c.commands.decode(raw)
    assert reason in e.value.reason


def test_round_trip():
    for cmd in (
        c.AddShard(shard="s0"),
        c.SplitChunk(ns="a.b", at=[{"x": 1}]),
        c.SetSetting(key="balancerWindow", value={"start": "01:00", "stop": "02:00", "timeZone": "UTC"}),
    ):
        assert c.commands.decode(Codec.encode(cmd)) == cmd
