"""The node spec's parts for the network, the chain, checkpoints and defences.

Owns :class:`FabricSpec`, :class:`LedgerSpec`, :class:`CheckpointSpec` and
:class:`DefenceSpec` (documented in :mod:`sapo_async.node.spec`, which re-exports them) and
the field checks every part uses (:func:`check`, :func:`one_of`): a bad value raises
:class:`~sapo_async.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sapo_async.errors import ConfigError
from sapo_async.limits import (
    NATS_JOIN_TIMEOUT_S,
    SHARD_ROTATE_S,
)

if TYPE_CHECKING:
    from sapo_async.fabric.transport.base import Transport
    from sapo_async.fabric.transport.embedded import NatsOptions
    from sapo_async.fabric.transport.shards import ShardPlan

__all__ = ["CheckpointSpec", "DefenceSpec", "FabricSpec", "LedgerSpec", "check", "one_of"]


def check(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name} must be {allowed}, got {value!r}", field=field_name)


def one_of(value: Any, allowed: tuple[Any, ...], field_name: str) -> None:
    check(value in allowed, field_name, "one of " + ", ".join(map(repr, allowed)), value)


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """How a node shares rollouts.

    Attributes:
        nats_url: NATS server(s), comma-separated; None starts (or shares) an embedded
            server in this process.
        nats_options: a :class:`~sapo_async.fabric.transport.NatsOptions` (credentials,
            TLS); its ``url`` is used when ``nats_url`` is None.
        stream_replicas: replicas of the swarm's stream (3 on a three-server cluster, so
            losing one server loses no acknowledged group).
        connect_timeout_s: how long to keep retrying NATS (with backoff, saying what it
            waits for) before giving up.
        transport: use this transport instead of NATS (tests, the in-memory broker).
        start: where this node's consumer starts: ``"new"`` messages only, ``"all"``
            retained ones, or a number of seconds back.
        include_tokens: share token ids and log-probs (receivers with the same tokenizer
            use them for importance weights).
        extra_check: a receiver-side check added to the collector's.
        shards: S, how many shards this node divides the swarm into (1, 16, 256 or
            4096; see ``fabric/transport/shards.py``); 1 reads everything.
        shards_read: k, how many of them it reads at a time (``None``: all S).
        shard_rotate_s: seconds before it moves on to the next k shards.
    """

    nats_url: str | None = None
    nats_options: NatsOptions | None = None
    stream_replicas: int = 1
    connect_timeout_s: float = NATS_JOIN_TIMEOUT_S
    transport: Transport | None = None
    start: Literal["new", "all"] | float = "all"
    include_tokens: bool = True
    extra_check: Any = None
    shards: int = 1
    shards_read: int | None = None
    shard_rotate_s: float = SHARD_ROTATE_S

    def shard_plan(self) -> ShardPlan | None:
        """The shard plan these settings ask for; ``None`` reads everything.

        Raises:
            ConfigError: S not in 1/16/256/4096, k outside 1..S, or a rotation <= 0 s.
        """
        from sapo_async.fabric.transport.shards import ShardPlan

        plan = ShardPlan(self.shards, self.shards_read, self.shard_rotate_s)
        return None if plan.count == 1 else plan

    def __post_init__(self) -> None:
        self.shard_plan()  # validates the three shard fields
        check(self.stream_replicas >= 1, "fabric.stream_replicas", ">= 1", self.stream_replicas)
        check(self.connect_timeout_s > 0, "fabric.connect_timeout_s", "> 0", self.connect_timeout_s)
        start = self.start
        check(
            start in ("new", "all")
            or (isinstance(start, int | float) and not isinstance(start, bool) and start >= 0),
            "fabric.start",
            "'new', 'all' or a number of seconds >= 0",
            start,
        )


@dataclass(frozen=True, slots=True)
class LedgerSpec:
    """Where a node's round commitments are recorded.

    Attributes:
        enabled: record commitments at all.
        rpc_url: JSON-RPC URL of the chain; None uses (or shares) an in-process EVM with
            the swarm's contract deployed on it.
        contract_address: the ledger contract on ``rpc_url``'s chain.
        relayer_key: key of an account that pays for this node's commitments (EIP-712
            relaying); None: the node pays its own gas.
        journal_path: the ledger journal's SQLite file (needed with ``rpc_url``; the
            embedded ledger keeps journals in a temporary directory).
    """

    enabled: bool = True
    rpc_url: str | None = None
    contract_address: str | None = None
    relayer_key: str | None = field(default=None, repr=False)  # a secret: never in logs
    journal_path: Path | None = None

    def __post_init__(self) -> None:
        if not self.enabled or self.rpc_url is None:
            return
        check(
            self.rpc_url.startswith(("http://", "https://", "ws://", "wss://")),
            "ledger.rpc_url",
            "an http(s):// or ws(s):// URL",
            self.rpc_url,
        )
        if not self.contract_address:
            raise ConfigError(
                "ledger.rpc_url needs ledger.contract_address (the deployed contract)",
                field="ledger.contract_address",
            )
        if self.journal_path is None:
            raise ConfigError(
                "ledger.rpc_url needs ledger.journal_path (where commitments are journaled)",
                field="ledger.journal_path",
            )


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """Where a node saves its state and resumes from.

    Attributes:
        dir: checkpoints go here, and the node resumes from the latest one (model,
            optimizer, round, RNG states); None: no checkpoints.
        every: rounds between checkpoints (one is also saved on leave); a node with a
            ledger recorder checkpoints every round, before its commitment.
    """

    dir: Path | None = None
    every: int = 10

    def __post_init__(self) -> None:
        check(self.every >= 1, "checkpoint.every", ">= 1", self.every)


@dataclass(frozen=True, slots=True)
class DefenceSpec:
    """What a node refuses from validly signed peers (docs/security.md, one paragraph each).

    Attributes:
        active: the master switch (the attack experiment's "defences off" sets it False;
            the collector's wire checks and the trained-hash rule stay on regardless).
        preset_only: admit only task configs of the receiver's own preset and swarm seed.
        max_prompt_chars: admit only questions of at most this many characters.
        max_completion_chars: admit only completions of at most this many characters.
        max_groups_per_producer_round: admit at most this many groups of one producer round.
        plausibility: drop groups with a completion the node's own model finds implausible.
        plausibility_quantile / plausibility_margin: the threshold on a completion's mean
            token log-prob: this quantile of the node's own completions (per family) minus
            this many nats.
        length_guard: drop groups with a rewarded completion longer than ``length_factor``
            times the ``length_quantile`` of the node's own rewarded completions (tokens,
            per family), or longer than its own ``max_new_tokens``.
        calibration_min: own completions a family needs before its thresholds apply.
        quarantine_rate / quarantine_min_events: refuse a producer once at least this share
            of at least this many of its judged groups were dropped...
        quarantine_s: ...for this many seconds.
    """

    active: bool = True
    preset_only: bool = True
    max_prompt_chars: int = 8192
    max_completion_chars: int = 8192
    max_groups_per_producer_round: int = 64
    plausibility: bool = True
    plausibility_quantile: float = 0.01
    plausibility_margin: float = 1.0
    length_guard: bool = True
    length_factor: float = 1.5
    length_quantile: float = 0.95
    calibration_min: int = 32
    quarantine_rate: float = 0.5
    quarantine_min_events: int = 8
    quarantine_s: float = 600.0

    def __post_init__(self) -> None:
        for name in (
            "max_prompt_chars",
            "max_completion_chars",
            "max_groups_per_producer_round",
            "calibration_min",
            "quarantine_min_events",
        ):
            check(getattr(self, name) >= 1, f"defence.{name}", ">= 1", getattr(self, name))
        for name in ("plausibility_quantile", "length_quantile", "quarantine_rate"):
            v = getattr(self, name)
            check(0 < v <= 1, f"defence.{name}", "in (0, 1]", v)
        check(
            self.plausibility_margin >= 0,
            "defence.plausibility_margin",
            ">= 0",
            self.plausibility_margin,
        )
        check(self.length_factor >= 1, "defence.length_factor", ">= 1", self.length_factor)
        check(self.quarantine_s >= 0, "defence.quarantine_s", ">= 0", self.quarantine_s)
