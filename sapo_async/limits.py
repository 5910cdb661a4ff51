"""Default timeouts, sizes and caps, in one place, each with the reason for its value.

Every wait in sapo_async has a timeout and every buffer a bound; their defaults live here
so they can be reviewed together. Configs may override most of them per node.
Sections are per area; keep each constant's one-line "why".
"""

from __future__ import annotations

# --- actors -------------------------------------------------------------------------

ACTOR_START_TIMEOUT_S = 30.0
"""An actor that is not serving within 30 s is broken (nats-server start-up is ~0.1 s,
model loading is done before actors start)."""

ACTOR_DRAIN_TIMEOUT_S = 10.0
"""Drain must fit inside a typical SIGTERM grace period (docker/k8s default: 10 to 30 s)."""

DEFAULT_MAILBOX_SIZE = 64
"""Bounded mailboxes give backpressure; 64 groups is several rounds of a node's output."""


# --- transport ----------------------------------------------------------------------

MAX_GROUP_BYTES = 256 * 1024
"""A group of 8 completions of <= 512 tokens is ~30 KB; 256 KiB leaves room and stays far
below NATS's 1 MiB default max_payload (hivemind died at 16 KiB records: never sit near a
limit)."""

PUBLISH_ACK_TIMEOUT_S = 5.0
"""JetStream acks in well under 10 ms on loopback; 5 s covers a leader election."""

DUPLICATE_WINDOW_S = 120.0
"""JetStream de-duplicates by Nats-Msg-Id within this window (server default 2 min)."""


# --- collector ----------------------------------------------------------------------

BUFFER_MAX_GROUPS = 4096
"""Verified external groups kept; 8 nodes x 8 groups x 64 rounds of history."""

BUFFER_MAX_AGE_S = 600.0
"""External groups older than 10 minutes are too off-policy to train on."""

MAX_ROUND_LAG = 8
"""Drop groups whose producer round is more than 8 behind the newest seen from it."""


# --- generation and training --------------------------------------------------------

PROBE_MAX_LOGPROB_DIFF = 0.05
"""vLLM vs trainer mean |delta log-prob| above this means the weight sync failed; bf16
kernels differ by ~0.01 on healthy syncs."""


# --- ledger -------------------------------------------------------------------------

LEDGER_RETRY_BASE_S = 0.5
"""First retry of a failed chain call after 0.5 s, doubling."""

LEDGER_RETRY_MAX_S = 30.0
"""Retries back off to at most 30 s, so a returning RPC is used within half a minute."""

LEDGER_TX_TIMEOUT_S = 60.0
"""A transaction not mined within a minute is retried (anvil mines instantly; L2s ~2 s)."""

LEDGER_RPC_TIMEOUT_S = 10.0
"""One JSON-RPC request; a healthy endpoint answers in milliseconds, so 10 s means it is gone."""

LEDGER_VIEW_PAGE = 256
"""Addresses or rounds read per view call: keeps each eth_call far below RPC gas caps."""

LEDGER_MAX_ATTEMPTS_LOGGED = 3
"""Failed sends of one commitment logged at warning level before the recorder goes quiet."""

LEDGER_EMBEDDED_TX_GAS = 5_000_000
"""Gas limit of embedded-chain transactions (skips py-evm's slow estimate); a commitment that
credits the maximum 64 producers uses ~1.3M, and unused gas is refunded."""
