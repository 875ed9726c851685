"""The names of the Kafka record headers services agree on.  No imports, so the pure domain can
name a header without loading Kafka's client (domain/clock.py gossips in `VECTOR_TIME`)."""

REPLY_TO, CORRELATION_ID = "reply-to", "correlation-id"
VECTOR_TIME = "vector-time"  # the vector clock's gossip on every request and reply (docs/decisions/0014)
