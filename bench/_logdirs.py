"""The size on disk of a topic's partitions, from the brokers (Kafka's DescribeLogDirs, v1).

aiokafka has no describe_log_dirs; this is the request and response of API key 35, version 1
(the oldest Kafka 4 still serves), sent through aiokafka's admin client.  Sizes are what
`kafka-log-dirs.sh --describe` shows: the bytes of every segment of the partition, summed
over the brokers holding a copy.
"""

from __future__ import annotations

from typing import Union

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Int64, Schema, String


class DescribeLogDirsResponse_v1(Response):
    API_KEY = 35
    API_VERSION = 1
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            Array(
                ("error_code", Int16),
                ("log_dir", String("utf-8")),
                (
                    "topics",
                    Array(
                        ("name", String("utf-8")),
                        (
                            "partitions",
                            Array(
                                ("partition_index", Int32),
                                ("partition_size", Int64),
                                ("offset_lag", Int64),
                                ("is_future_key", Boolean),
                            ),
                        ),
                    ),
                ),
            ),
        ),
    )


class DescribeLogDirsRequest_v1(RequestStruct):
    API_KEY = 35
    API_VERSION = 1
    RESPONSE_TYPE = DescribeLogDirsResponse_v1
    SCHEMA = Schema(("topics", Array(("topic", String("utf-8")), ("partitions", Array(Int32)))))


class DescribeLogDirsRequest(Request[Union[DescribeLogDirsRequest_v1]]):  # noqa: UP007 (aiokafka reads the union)
    API_KEY = 35

    def __init__(self, topics: list[tuple[str, list[int]]]):
        self.topics = topics

    def build(self, request_struct_class):
        return request_struct_class(self.topics)


async def topic_bytes(bootstrap: str, topic: str, partitions: int = 1) -> int:
    """Bytes on disk of `topic` (every partition, every broker's copy)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        total = 0
        brokers = (await admin.describe_cluster())["brokers"]
        for b in brokers:
            resp = await admin._send_request_to_node(
                b["node_id"], DescribeLogDirsRequest([(topic, list(range(partitions)))])
            )
            for _err, _dir, topics in resp.results:
                for name, parts in topics:
                    if name == topic:
                        total += sum(p[1] for p in parts)
        return total
    finally:
        await admin.close()
