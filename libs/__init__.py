"""The shared runtime every shardlog service stands on.

- `topics`     topic names of one cluster (the contract) and their creation
- `bus`        the transport seam: what services do with Kafka, on a broker (`bus.kafka`) or in memory (`bus.memory`)
- `kafka`      aiokafka clients with the settings exactly-once needs
- `store`      RocksDB store whose write batches carry the consumed offset
- `projection` fold a partition into a store; resume from the checkpoint
- `commands`   command processor: decide, emit events + replies, commit in one transaction
- `requests`   send a request to a topic and await its reply on an inbox
- `tracing`    W3C trace context in record headers, span export (Zipkin or OTLP) from OTEL_* variables
- `faults`     named fault points for crash tests
- `aio`        `wait_for` that never swallows a cancellation (Python 3.11)
- `service`    hosting: settings, readiness, signal handling
- `shardkey`   pure shard-key ordering, encoding and hashing
"""
