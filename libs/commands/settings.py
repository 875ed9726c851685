"""The command processor's knobs (docs/reference/settings.md), read once from the environment."""

from __future__ import annotations

import os

# How long the offsets of reads answered outside any transaction may stay uncommitted when no
# transaction comes to carry them: a takeover answers at most this much again (harmlessly).  Also
# how far the consumer group's offset may lag the position recorded in the changelog.
READ_OFFSETS_COMMIT_S = float(os.environ.get("SHARDLOG_READ_OFFSETS_COMMIT_S", "1"))
# An inbox's partition for the replies sent outside any transaction (plain reads), when it has
# more than one: a read_committed reader stops at the first open transaction of a partition, and
# the transactions of every processor replying to that inbox keep its first partition busy.
UNTRANSACTED_REPLIES_PARTITION = 1
# How long a reply waits for its inbox's metadata before the inbox counts as gone (deleted with
# its router or client: a read answered again after a restart may name one), and how long it then
# stays gone: waiting the producer's 40 s for every such reply would hold every command back.
INBOX_WAIT_S = float(os.environ.get("SHARDLOG_INBOX_WAIT_S", "2"))
GONE_INBOX_S = 5 * INBOX_WAIT_S
# The transactional producer's retry backoff: a transaction begun while the broker still writes
# the previous one's markers is refused (CONCURRENT_TRANSACTIONS, ~a third of a busy shard's
# transactions) and retried after this backoff; the markers take a few ms.
TRANSACTION_RETRY_BACKOFF_MS = int(os.environ.get("SHARDLOG_TRANSACTION_RETRY_BACKOFF_MS", "3"))
