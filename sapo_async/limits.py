"""Default timeouts, sizes, caps and round settings, in one place, each with its reason.

Every wait in sapo_async has a timeout and every buffer a bound; their defaults live here
so they can be reviewed together. Configs may override most of them per node.
Sections are per area; keep each constant's one-line "why".
"""

from __future__ import annotations

from typing import Final

# --- actors -------------------------------------------------------------------------

ACTOR_START_TIMEOUT_S = 30.0
"""An actor that is not serving within 30 s is broken (nats-server start-up is ~0.1 s,
model loading is done before actors start)."""

ACTOR_DRAIN_TIMEOUT_S = 10.0
"""Drain must fit inside a typical SIGTERM grace period (docker/k8s default: 10 to 30 s)."""


# --- transport ----------------------------------------------------------------------

MAX_GROUP_BYTES = 256 * 1024
"""A group of 8 completions of <= 512 tokens is ~30 KB; 256 KiB leaves room and stays far
below NATS's 1 MiB default max_payload (hivemind died at 16 KiB records: never sit near a
limit)."""

PUBLISH_ACK_TIMEOUT_S = 5.0
"""JetStream acks in well under 10 ms on loopback; 5 s covers a leader election."""

DUPLICATE_WINDOW_S = 120.0
"""JetStream de-duplicates by Nats-Msg-Id within this window (server default 2 min)."""

STREAM_MAX_AGE_S = 3600.0
"""The stream keeps an hour: six times the collector's buffer age, so a node that joins or
restarts can start from "the last N minutes" without the stream growing without bound."""

STREAM_MAX_BYTES = 512 * 1024 * 1024
"""512 MiB per swarm stream: an hour of 64 nodes x 8 groups/min x 16 KB fits ~8 times."""

FETCH_BATCH = 64
"""Messages per pull request: amortises the request round trip, still one round of a node."""

FETCH_TIMEOUT_S = 1.0
"""A pull request waits at most 1 s: the consumer loop's liveness check runs this often."""

CONSUMER_INACTIVE_THRESHOLD_S = 300.0
"""A non-durable consumer unused for 5 minutes is removed by the server (a node died)."""

CONSUMER_SLOTS = 6
"""Consumer names a credential bound to an owner may use (``<owner>-0`` ..
``<owner>-5``, enumerated in its broker permissions: NATS subjects have no partial-token
wildcards). A volunteer cannot delete consumers, so an old one holds its name until
``CONSUMER_INACTIVE_THRESHOLD_S`` unused: six cover a start, a restart and a repair or a
shard rotation inside that window."""

EPHEMERAL_DELETE_TIMEOUT_S = 1.0
"""Deleting a closed ephemeral consumer is a courtesy (the server drops it after
CONSUMER_INACTIVE_THRESHOLD_S anyway): it must not hold up a shutdown while NATS is down."""

SHARD_ROTATE_S = 300.0
"""A node reading k of S shards moves to the next k every 5 minutes: long next to a round
(~10-60 s, so a buffer fills from one shard set), short enough that a node cycles through
all S/k sets within hours (every producer stays reachable); one consumer re-created per
node per 5 min is nothing for the servers."""

SHARD_INGRESS_FACTOR = 4
"""c: a node wants about c x J external groups per round to choose J from (room for groups
it drops for zero advantage or rejects); shard plans aim ingress at that."""

CONSUMER_REPLACE_AFTER_FAILURES = 3
"""A consumer whose server cannot answer for it three stall checks in a row (its server
died) is replaced by a new one that resumes after the last sequence seen."""

CONSUMER_STALL_CHECKS = 3
"""After 3 empty fetches in a row the consumer asks the server whether it is still alive
and bound (nats.py issue #504: a pull subscription can go silent after a restart)."""

CONSUMER_REPAIR_BASE_S = 0.5
"""A consumer re-creation the server refused is tried again after 0.5 s, doubling: a
deleted consumer is back within a second when the stream is still there."""

CONSUMER_REPAIR_MAX_S = 30.0
"""Repairs back off to one try per 30 s: a stream the operator removed and re-creates is
picked up within half a minute, without hammering the server meanwhile."""

RETRY_JITTER = 0.5
"""Every retry waits its schedule's delay times a random 1 to 1.5: nodes that lost the same
server at the same instant drift half a delay apart per attempt instead of returning in
lock-step, and no wait is shorter than the schedule, so each retry window below still holds."""

STREAM_RECHECK_S = 10.0
"""How often a node whose swarm stream was deleted (and which may not recreate it) looks
whether it is back; meanwhile its publishes fail at once instead of waiting on retries."""

STREAM_CREATE_TIMEOUT_S = 5.0
"""A stream info or create request while the stream is missing: the server answers in
milliseconds when idle and refuses a forbidden create by not answering. Not 1 s: a clean-
clone CI run (2026-12-03) saw a permitted create on a busy machine take longer, and the
node took it for a refusal; a node that may not create waits this long once."""

PUBLISH_RETRIES = 5
"""A publish is tried 5 times with backoff (0.2 s doubling: ~6 s), covering a server restart."""

PUBLISH_RETRY_BASE_S = 0.2
"""First publish retry after 0.2 s; a restarting embedded nats-server is back in ~0.2 s."""

PUBLISH_RETRY_MAX_S = 5.0
"""Publish retries back off to at most 5 s apart: a group waiting longer is stale anyway."""

CONNECT_TIMEOUT_S = 5.0
"""Connecting to NATS on loopback takes milliseconds; 5 s covers a remote server."""

SERVER_START_TIMEOUT_S = 20.0
"""nats-server and anvil answer within ~0.1 s; 20 s covers a cold disk and a loaded 2-core
CI machine."""

SERVER_STOP_TIMEOUT_S = 10.0
"""After SIGTERM (SIGINT for anvil) a child server gets 10 s before SIGKILL: nats-server
flushes its JetStream store and anvil dumps its state in well under a second."""

SERVER_POLL_BASE_S = 0.01
"""A starting child server is first probed after 10 ms: it is often ready within ~0.1 s."""

SERVER_POLL_MAX_S = 0.2
"""Probes of a starting child back off to one every 0.2 s, so a slow start costs no CPU."""


NATS_JOIN_TIMEOUT_S = 120.0
"""A joining node retries NATS for 2 minutes (a cluster electing its JetStream leader, a
volunteer's flaky link) before it gives up with a clear error."""

NATS_JOIN_BACKOFF_BASE_S = 0.5
"""A joining node first retries NATS after half a second (a server still starting)."""

NATS_JOIN_BACKOFF_MAX_S = 10.0
"""...and at least every 10 s after that, so a recovered server is found quickly."""

NODE_TEARDOWN_TIMEOUT_S = 300.0
"""Leaving writes a checkpoint (weights plus optimizer state: seconds for the tiny model,
about a minute for a 1.5B model on a slow disk) and closes the journal and transport."""

SWARM_LAND_TIMEOUT_S = 60.0
"""A node's last commitments land within a second on the embedded chain; 60 s is a hang."""


# --- collector ----------------------------------------------------------------------

BUFFER_MAX_GROUPS = 4096
"""Verified external groups kept; 8 nodes x 8 groups x 64 rounds of history."""

BUFFER_MAX_AGE_S = 600.0
"""External groups older than 10 minutes are too off-policy to train on."""

MAX_ROUND_LAG = 8
"""Drop groups whose producer round is more than 8 behind the newest seen from it."""

MAX_CLOCK_SKEW_S = 60.0
"""A group stamped more than a minute in the future is rejected: a forged future time would
otherwise keep it from ever ageing out."""

SIGNER_CACHE_SIZE = 16384
"""Recovered signers memoised per process (~200 B each, ~3 MB): covers the buffer several
times over, so nodes sharing a process recover each group's signature once."""

DECODE_CACHE_SIZE = 1024
"""Decoded envelopes memoised per process: nodes sharing a process read a message within
moments of each other, so a short memory catches the repeats."""

DECODE_CACHE_MAX_BYTES = 64 * 1024
"""Only messages up to 64 KiB are memoised, so the decode cache holds at most 64 MiB."""

SEEN_HASHES_MAX = 65536
"""Rollout hashes remembered for duplicate rejection (16x the buffer); entries older than the
buffer age are forgotten anyway, since staleness rejects those replays."""

PRODUCERS_REMEMBERED = 2 * BUFFER_MAX_GROUPS
"""Producers each per-producer memory keeps (the quarantine's verdicts, the stock-lead
record's windows, the collector's newest round per producer), the least recently seen
forgotten first: keys are free, so without a bound a stranger who signs each group with a
new key grows them for ever. Entries come only from groups the node admitted or judged, at
most BUFFER_MAX_GROUPS of them held at once, so a producer seen within the last two
buffers' worth of other producers is kept whatever the flood; a forgotten one starts again
as a new key would. Measured full under a one-key-a-group flood
(tests/unit/test_producer_memory.py): the verdicts 8.3 MB (~1 KB a producer: a window of
64 is allocated whole), the lead record's windows 3.7 MB, the newest rounds 2.5 MB."""

PRODUCER_ROUNDS_REMEMBERED = 2 * BUFFER_MAX_GROUPS
"""(producer, producer round) pairs the producer-round cap counts admitted groups of, the
least recently admitted or claimed forgotten first. Forgetting one gives its producer a new
quota for that round, which it could have had anyway from its next round or a new key (the
cap bounds a round, not a person); a round being flooded now is touched by its every group
and is the last one forgotten. 2.9 MB full (~0.35 KB a pair)."""

QUARANTINED_MAX = 16384
"""Producers held in quarantine at once, apart from the verdicts so that no flood of fresh
keys can free one; when more are quarantined, those whose quarantine ends soonest are
released first. Filling it takes 8 dropped verified groups per key (the fewest verdicts a
producer is judged on), 131,072 judged groups within one quarantine's time; 5.6 MB full
(~0.35 KB a producer)."""


# --- generation and training --------------------------------------------------------

PROBE_MAX_LOGPROB_DIFF = 0.05
"""vLLM vs trainer mean |delta log-prob| above this means the weight sync failed; bf16
kernels differ by ~0.01 on healthy syncs."""

# --- gpu generation (vLLM) ----------------------------------------------------------

VLLM_GENERATE_TIMEOUT_S = 600.0
"""One round (8 x 8 completions of <= 512 tokens) takes seconds on vLLM; ten minutes
means the engine is wedged, and the backend is marked failed rather than waited on."""

VLLM_WEIGHT_SYNC_TIMEOUT_S = 300.0
"""A CUDA-IPC sync of a 0.5B model is sub-second; 5 min covers a 7B layerwise reload."""

VLLM_SLEEP_TIMEOUT_S = 120.0
"""Sleep/wake moves at most the weights over PCIe (~1 GB for 0.5B at >= 10 GB/s)."""

VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.3
"""Engine share of the GPU when colocated: the trainer's fp32 weights, grads and AdamW
state of a 0.5B model need ~8 GB, so the engine must leave most of the card alone."""


# --- ledger -------------------------------------------------------------------------

LEDGER_RETRY_BASE_S = 0.5
"""First retry of a failed chain call after 0.5 s, doubling."""

LEDGER_RETRY_MAX_S = 30.0
"""Retries back off to at most 30 s, so a returning RPC is used within half a minute."""

JOURNAL_LOCK_RETRY_BASE_S = 0.5
"""A journal another process holds locked is tried again after 0.5 s, doubling (each try
itself waits up to SQLite's 5 s busy timeout)."""

JOURNAL_LOCK_RETRY_MAX_S = 10.0
"""... to at most 10 s: a node stopping while the journal is locked leaves within ~15 s."""

LEDGER_TX_TIMEOUT_S = 60.0
"""A transaction not mined within a minute is retried (anvil mines instantly; L2s ~2 s)."""

LEDGER_RPC_TIMEOUT_S = 10.0
"""One JSON-RPC request; a healthy endpoint answers in milliseconds, so 10 s means it is gone."""

LEDGER_VIEW_PAGE = 256
"""Addresses or rounds read per view call: keeps each eth_call far below RPC gas caps."""

LEDGER_SETTLE_INTERVAL_S = 1.0
"""How often an idle recorder with open credit claims looks again for their producer rounds:
a producer lands its round seconds after sharing it (one block on an L2, 12 s on Ethereum),
and each look costs two view calls per claim, so once a second is prompt and cheap."""

LEDGER_SETTLE_MAX_DEFER_S = 60.0
"""Longest a recorder defers settling its open claims for pending commitments of its own:
commitments go first, but at a 12 s block time a fast node always has a batch in flight, and
its claims waited for the node to stop (the 4-node chaos run settled 11 of its claims while
running). Past this, one settle pass runs between two commitment batches (one block)."""

LEDGER_CLAIM_LAPSE_S = 3600.0
"""An open claim whose producer round is still not on chain after an hour stops being polled:
its producer died between sharing and committing, or is offline for long. The claim stays on
chain, so anyone (the producer itself, once back) can still settle it; nothing is withdrawn."""

LEDGER_MAX_PENDING = 64
"""Default bound of a node's pending commitments (``[ledger] max_pending``) before its rounds
pause until they land. A backlog is at least rounds per second times the wait for a block
(Little's law): at 12 s blocks a tiny-model node (~2 rounds/s) holds one batch in flight and
fills the next meanwhile, ~25 each, so 64 (one full batch, ``LEDGER_BATCH_DEPTH``) lets it
keep its pace; a real model's round (~17 s) never comes near it. Above it the chain is
unreachable or slower than the rounds, and pausing keeps the journal and the credit a node
owes its peers from growing without bound (nothing is dropped: the journal is on disk)."""

LEDGER_BACKLOG_CHECK_S = 5.0
"""How long a paused node waits for its backlog to shrink before logging again that it is
still paused (the pause itself lasts until the commitments land)."""

LEDGER_CONNECT_TIMEOUT_S = 120.0
"""How long a starting node keeps retrying an RPC endpoint that does not answer (the default
of ``[ledger] connect_timeout_s``): as long as NATS gets (``NATS_JOIN_TIMEOUT_S``), so a
volunteer's node started during a chain restart or a provider's blip comes up by itself."""

STARTUP_RETRY_BASE_S = 0.5
"""First pause between start-up checks of a server that did not answer."""

STARTUP_RETRY_MAX_S = 10.0
"""Longest pause between start-up checks: a server back up is seen within ten seconds."""

LEDGER_MAX_ATTEMPTS_LOGGED = 3
"""Failed sends of one commitment logged at warning level before the recorder goes quiet."""

LEDGER_EMBEDDED_TX_GAS = 5_000_000
"""Gas limit of embedded-chain transactions (skips py-evm's slow estimate); a commitment that
credits the maximum 64 producers uses ~1.3M, and unused gas is refunded."""

LEDGER_EMBEDDED_BLOCK_GAS = 25_000_000
"""Most gas an embedded-chain transaction asks for: eth-tester's blocks hold ~30M, and a
transaction above the block's limit is refused outright (a batch of commitments asks
``LEDGER_EMBEDDED_TX_GAS`` per commitment up to this)."""

LEDGER_GAS_HEADROOM_PER_USAGE = 25_000
"""Gas added to a commitment's estimate per usage entry. An entry estimated as a claim (its
producer round not on chain yet, ~37.6k) costs ~44k as a credit when that round lands first in
the same block, more when it writes a fresh counter; without headroom the transaction runs out
of gas and reverts without a reason (at 12 s blocks, a common race). Unused gas is not paid."""

LEDGER_BATCH_DEPTH = 64
"""Most pending commitments of one node sent as one ``commitMany`` transaction (all land or
none): the contract's ``MAX_BATCH``. At 12 s blocks a tiny-model node journals ~25 rounds per
block, so one batch lands a block's worth and more; ``LEDGER_BATCH_MAX_USAGE`` bounds its gas."""

LEDGER_BATCH_MAX_USAGE = 128
"""Most usage entries one batch carries (it always carries at least one commitment): with
their headroom ~69k gas each, plus ~100k per round, a full batch asks at most ~15M gas, so
two nodes' full batches fit a 30M-gas block (anvil's, Ethereum's order of size)."""


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

MAX_SWARM_SEED = 4095
"""Largest swarm seed: a question's reasoning-gym seed is ``swarm_seed << 52`` plus an index
below 2**52 (sapo_async/tasks/source.py), and it travels in ``TaskRef.seed``, a msgpack
integer of at most 64 bits; seed 4096 would need 65 bits and the node could not encode its
first group."""

# --- a round's size ------------------------------------------------------------------

MAX_QUESTIONS_PER_ROUND = 1 << 10
"""Most questions (B) a node asks per round: a question's slot is 10 bits of its task index
(sapo_async/tasks/source.py), so slot 1024 would collide with the next round's first."""

MAX_ROLLOUTS_PER_ROUND = 4096
"""Most rollouts (B x L) one round may commit or use: the mirror of
``SapoLedger.MAX_ROLLOUTS_PER_ROUND`` (the contract refuses a larger count), equal to
:data:`BUFFER_MAX_GROUPS` (no node holds more groups of a round)."""

# --- a round's defaults -------------------------------------------------------------
# The one source of the defaults a node's spec (``TrainingSpec``, ``TrainerConfig``) and
# ``sapo-async train``'s flags share: the CLI reads them here, free of torch and pydantic,
# so ``--help`` stays fast and cannot show a default the spec does not have.

DEFAULT_QUESTIONS_PER_ROUND = 8
"""B = 8 questions a round: with L = 8, 64 rollouts, a 50 to 150 ms round of the tiny model
on one CPU core (docs/learning.md), yet several informative groups a round once it learns."""

DEFAULT_COMPLETIONS_PER_QUESTION = 8
"""L = 8 completions per question (GRPO needs 2): a question the policy answers right one
time in eight still makes an informative group, which the sparse tiny model depends on."""

DEFAULT_MAX_NEW_TOKENS = 16
"""The tiny model's answer with its ``<answer>`` tags fits in 16 of its tokens; real models
need hundreds and set it per node (it is also the trainer's per-sequence cap)."""

DEFAULT_TEMPERATURE = 1.0
"""Sample the policy as it is: the behaviour log-probs are then the policy's own, which the
importance ratios (truncated IS, F-TIS's filter) assume."""

DEFAULT_TOP_P = 1.0
"""No nucleus truncation, for the same reason as :data:`DEFAULT_TEMPERATURE`."""

REAL_MODEL_SIZES = {"questions_per_round": 4, "completions_per_question": 4, "max_new_tokens": 32}
"""A real model's round sizes in ``sapo-async swarm --model`` and the explorer's demo: SmolLM2-135M
takes about 6.5 s a node-round alone at these sizes on 2 cores (docs/learning.md, "Speed")."""


FAST_PATH_MIN_PARAMS = 20_000_000
"""From this many parameters a model's CPU work is arithmetic, so the "auto" fast paths
are on: the sampler's bf16 copy on a CPU with bf16 instructions (SmolLM2-135M, 16
completions of 32 tokens: 129.6 to 214.3 tokens/s), and in the GRPO step
``trainer.share_prompts`` and, where bf16 is fast, ``trainer.bf16``
(bench/results/real.json, ``profile``). The 0.86 M-parameter tiny model, overhead-bound,
and the tests' models stay on the float32 padded paths their recorded results ran."""

# --- content defences' fixed thresholds ----------------------------------------------
# Formerly [defence] settings; no volunteer had a reason to change them, so node.toml no
# longer offers them (a file that names one is refused saying so). Measured in
# docs/security.md and bench/results/defence_fp.json, plausibility.json.

TOKEN_TEST_LEVEL = 1e-3
"""A peer of the node's own model is implausible when the per-token test's p-value
(:attr:`~sapo_async.node.token_test.CompletionTest.p_value`: the least likely token, and the
surprisal excess of the whole and of its dyadic prefixes and suffixes, Bonferroni-corrected)
is below 1e-3: under the null (sampled from the receiver's policy) 1 in 1,000 honest
rewarded completions. Chosen on the tuning set only (bench/results/token_test.json); the
held-out attacks were not read before it was set."""

PLAUSIBILITY_QUANTILE = 0.01
"""The plausibility floor is this quantile of the node's own completions' mean token
log-probs (and of their least likely tokens' means), per family: the 1 % tail of its own
sampling, so about 1 in 100 honest same-model completions sits below it before the margin."""

PLAUSIBILITY_MARGIN = 1.0
"""...less 1 nat: with it, 17 to 24 of 35,840 honest groups (at most 0.07 %) were refused
as ``implausible`` in the README's 8-node swarm (2026-12-02 and 2026-12-06), while the
inject payload's three least likely SmolLM2 tokens (mean -14) stay below every own
completion's (lowest -11.8) by more."""

PLAUSIBILITY_LOW_TOKENS = 3
"""The mean of a completion's 3 least likely tokens is screened too: the mean of all tokens
let SmolLM2's one-marker payload through (0.969 payload rate in the first SmolLM2 matrix);
the three lowest caught it with no rise in honest refusals (docs/security.md)."""

LENGTH_QUANTILE = 0.95
"""The length guard's reference: the 95th percentile of the node's own rewarded lengths per
family (its long tail, not its longest, which one rambling sample sets)."""

LENGTH_FACTOR = 1.5
"""...times 1.5: the length attack's completions (the token cap) are 2x and more of it on
SmolLM2 (0 length groups trained, 0.85x the no-attack length, attack-real-defaults), while
honest peers' rewarded answers of the same model rarely pass it (5 of 17,920 in the dense
8-node swarm)."""

BREVITY_QUANTILE = 0.05
"""The brevity guard's reference: the 5th percentile of what the node's own completions show
before their answer (:func:`~sapo_async.tasks.reward.own_lead`): its short tail."""

BREVITY_FACTOR = 2.0
"""...over 2: SmolLM2's floor is then 1.5 to 4.5 characters on ``cpu_easy`` (a bare answer,
0 characters, is refused; its own short answers pass: 1 of 1,920 honest groups refused with
no attack, attack-real-defaults)."""

QUARANTINE_MIN_EVENTS = 8
"""A producer is judged for quarantine only after 8 verdicts on its groups (one or two rounds
of a peer's B groups): fewer would quarantine an honest peer for one unlucky round."""

FOREIGN_TOKEN_SLACK = 2.0
"""How many times the node's own completion cap a peer with another tokenizer may take in
this node's tokens (the size bound, ``completion_too_many_tokens``). Honest text that used its
producer's whole budget re-tokenised up to 1.58x longer between SmolLM2 and Gemma 3
(bench/results/defence_fp.json), so an exact bound dropped every Gemma group at a SmolLM2
receiver. The trainer still cuts every completion at the cap; the bound guards against
padding, and the length guard (counted in this node's tokens) still judges rewarded ones."""

CHECKPOINT_SMALL_BYTES = 256 << 20
"""Below this much model + optimizer state a node checkpoints every round ("auto"): the
tiny model's is about 10 MB and takes milliseconds."""

CHECKPOINT_LARGE_EVERY = 10
"""Rounds between checkpoints at real size ("auto"): SmolLM2-135M's model + AdamW state is
1.61 GB and took 9 to 11 s to write on 2 cores (bench/checkpoint_real.py), so writing it
every round would cost 1.6 GB of disk writes per round."""

DEFAULT_LR = 3e-5
"""AdamW's rate for the 0.86 M-parameter tiny model (every recorded run in docs/ used it);
real models want about 1e-6 and set it in node.toml."""

DEFAULT_LOSS_TYPE: Final = "dapo"  # Final: mypy reads it as the Literal TrainerConfig wants
"""Token mean over the batch (DAPO): every completion token weighs the same, so long and
short completions are not re-weighted per sequence as ``grpo`` does."""

DEFAULT_SWARM_SEED = 0
"""Any seed in 0..:data:`MAX_SWARM_SEED` works as long as a swarm's nodes share it; 0 is the
one they share unless told otherwise."""


# --- explorer -----------------------------------------------------------------------

LEDGER_LOG_CHUNK = 10_000
"""Blocks per ``eth_getLogs`` of the ledger index: public RPC providers cap a log query's
block range (commonly at 10,000), and a swarm's contract emits far fewer logs per block than
their result caps."""

EXPLORER_REFRESH_S = 1.0
"""The explorer reuses a swarm snapshot for 1 s: rounds take seconds, so a page is never
more than a round behind, and any number of open pages cost the chain one read a second."""

EXPLORER_POLL_S = 0.5
"""The live stream looks for a new snapshot twice a second (each look is a cache hit
unless :data:`EXPLORER_REFRESH_S` passed), so a change reaches the page within ~1.5 s."""

EXPLORER_START_TIMEOUT_S = 15.0
"""uvicorn answers within milliseconds of binding; 15 s covers a loaded CI machine."""

EXPLORER_SHUTDOWN_S = 2.0
"""Open live streams get 2 s to end when the explorer stops (they end within one poll)."""
