"""The node spec's parts for the network, the chain, checkpoints and defences.

Owns :class:`FabricSpec`, :class:`LedgerSpec`, :class:`CheckpointSpec` and
:class:`DefenceSpec` (documented in :mod:`sapo_async.node.spec`, which re-exports them;
:class:`DefenceSpec` is a :class:`~sapo_async.policy.settings.Settings` model, node.toml's
``[defence]`` section itself) and
the field checks every part uses (:func:`check`, :func:`one_of`): a bad value raises
:class:`~sapo_async.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from sapo_async.errors import ConfigError
from sapo_async.limits import (
    NATS_JOIN_TIMEOUT_S,
    SHARD_ROTATE_S,
)
from sapo_async.policy.settings import Settings

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


class DefenceSpec(Settings):
    """What a node refuses from validly signed peers (docs/security.md, one paragraph each).

    The same model is node.toml's ``[defence]`` section: each field's default, bounds and
    description are here only. ``active`` is the master switch (the attack experiment's
    "defences off"; the collector's wire checks and the trained-hash rule stay on
    regardless); the length guard also drops a rewarded completion longer than the node's
    own ``max_new_tokens``; a producer is quarantined once at least ``quarantine_rate`` of
    at least ``quarantine_min_events`` of its judged groups were dropped.
    """

    part: ClassVar[str] = "defence"

    active: bool = Field(default=True, description="All content and resource defences on or off.")
    preset_only: bool = Field(
        default=True,
        description="Admit only task configs of this node's own preset and swarm seed.",
    )
    max_prompt_chars: int = Field(default=8192, ge=1, description="Longest question admitted.")
    max_completion_chars: int = Field(
        default=8192, ge=1, description="Longest completion admitted."
    )
    max_groups_per_producer_round: int = Field(
        default=64, ge=1, description="Most groups admitted from one producer round."
    )
    plausibility: bool = Field(
        default=True, description="Drop groups this node's own model finds implausible."
    )
    plausibility_quantile: float = Field(
        default=0.01, gt=0, le=1, description="Quantile of own completions' mean log-prob..."
    )
    plausibility_margin: float = Field(default=1.0, ge=0, description="...minus this many nats.")
    length_guard: bool = Field(
        default=True, description="Drop needlessly long rewarded completions."
    )
    length_factor: float = Field(
        default=1.5, ge=1, description="Longest rewarded completion, times own rewarded length..."
    )
    length_quantile: float = Field(default=0.95, gt=0, le=1, description="...at this quantile.")
    calibration_min: int = Field(
        default=32, ge=1, description="Own completions a family needs before its thresholds apply."
    )
    quarantine_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Quarantine a producer when this share of its groups...",
    )
    quarantine_min_events: int = Field(default=8, ge=1, description="...of at least this many...")
    quarantine_s: float = Field(default=600.0, ge=0, description="...were dropped, for this long.")
