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


# --- volunteer node -----------------------------------------------------------------

KEYSTORE_SCRYPT_N = 2**18
"""scrypt cost of a new keystore: geth's "standard" setting (~0.5 s, 256 MiB to unlock),
paid once per node start."""

DOCTOR_CONNECT_TIMEOUT_S = 5.0
"""doctor gives each server (NATS, RPC) 5 s: a healthy one answers in milliseconds, and a
volunteer should not wait long to learn that one is down."""

DOCTOR_MIN_FREE_BYTES = 2 * 1024**3
"""doctor warns under 2 GiB free in data_dir: checkpoints of a 0.5B model with optimizer
state take ~6 GB; even the tiny model needs room for a few."""

METRICS_STOP_TIMEOUT_S = 5.0
"""The metrics HTTP server's shutdown waits at most 5 s for in-flight scrapes."""

SERVER_START_TIMEOUT_S = 20.0
"""nats-server and anvil listen within ~0.1 s; 20 s covers a cold disk and a busy CI box."""

SERVER_STOP_TIMEOUT_S = 10.0
"""After SIGTERM a child server gets 10 s (JetStream flushes its store) before SIGKILL."""
