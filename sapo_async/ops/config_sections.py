"""The sections of a volunteer node's ``node.toml``: one frozen pydantic model each.

Owns every setting's type, default, bounds and description (each field is documented
exactly once, in its ``Field(description=...)``), and the checks across fields of one
section. :data:`SECTIONS` lists them in file order.

Does not know files, the environment or how settings are used: :mod:`.config` loads them,
:mod:`.config_docs` renders them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from sapo_async.errors import ConfigError
from sapo_async.limits import MAX_SWARM_SEED
from sapo_async.ops.config_checks import (
    check_host_port,
    did_you_mean,
    existing_file,
    writable_dir,
)

if TYPE_CHECKING:
    from sapo_async.fabric.transport.embedded import NatsOptions

__all__ = [
    "SECTIONS",
    "IdentitySection",
    "LedgerSection",
    "MetricsSection",
    "ModelSection",
    "NatsSection",
    "NodeSection",
    "StrList",
    "TasksSection",
    "TrainingSection",
]


def _split_list(value: Any) -> Any:
    """Accept a JSON list or a comma-separated string where a list of strings is expected."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list: {exc}") from exc
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


StrList = Annotated[list[str], NoDecode]
"""A list of strings that the environment may give as ``a,b`` or ``["a","b"]``."""


class _Section(BaseModel):
    # allow_inf_nan: no setting means anything at inf or nan (temperature = inf samples
    # uniformly at random; lr = nan poisons the weights on the first step).
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )


class NodeSection(_Section):
    """[node]: who this node is and how long it runs."""

    swarm: str = Field(
        "local",
        min_length=1,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Swarm to join; part of every subject and of the chain records "
        "(letters, digits, '-' and '_').",
    )
    name: str = Field("", description="Human-readable node name for logs and metrics (optional).")
    data_dir: Path = Field(
        Path("~/.sapo"),
        description="Directory for this node's keystore, checkpoints, ledger journal and logs.",
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SWARM_SEED,
        description="Seed for task sampling and generation RNGs (0..4095: it fills the top "
        "12 bits of a 64-bit wire field).",
    )
    rounds: int | None = Field(
        None, ge=1, description="Rounds to run, then stop; unset runs until stopped."
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        description="Write a checkpoint (model, optimizer, round, RNG) every N rounds; with "
        "the ledger on, every round, before its commitment (a restart then never commits a "
        "lower policy version than the chain has).",
    )
    drain_timeout_s: float = Field(
        10.0,
        gt=0,
        description="On SIGINT/SIGTERM, seconds allowed to finish the round and flush "
        "publishes and the journal before stopping hard.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return writable_dir(value)


class IdentitySection(_Section):
    """[identity]: the node's Ethereum key, kept in an encrypted keystore."""

    keystore: Path | None = Field(
        None,
        description="Encrypted keystore file (created on first run); unset means "
        "<data_dir>/key.json.",
    )
    password_env: str = Field(
        "SAPO_KEY_PASSWORD",
        min_length=1,
        description="Environment variable holding the keystore password (checked first).",
    )
    password_file: Path | None = Field(
        None,
        description="File whose first line is the keystore password (checked second); "
        "if neither is set, the node prompts when run on a terminal.",
    )

    @field_validator("keystore")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @field_validator("password_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        return existing_file(value)


class NatsSection(_Section):
    """[nats]: the NATS servers rollouts are shared over."""

    urls: StrList = Field(
        default_factory=list,
        description="NATS server URLs (nats://host:4222, tls://...); empty starts an "
        "embedded private server (a swarm of one machine).",
    )
    creds_file: Path | None = Field(
        None, description="NATS credentials file (JWT + nkey seed) for decentralised auth."
    )
    nkey_seed_file: Path | None = Field(
        None, description="File with this node's NATS user nkey seed (SU...), for nkey auth."
    )
    tls_ca: Path | None = Field(None, description="CA certificate to verify the servers with.")
    tls_cert: Path | None = Field(
        None, description="Client certificate for mutual TLS (needs tls_key)."
    )
    tls_key: Path | None = Field(
        None, description="Client private key for mutual TLS (needs tls_cert)."
    )
    start: Literal["new", "last_minutes"] = Field(
        "new",
        description="Where to start reading shared rollouts: only new ones, or those of "
        "the last lookback_minutes.",
    )
    lookback_minutes: float = Field(
        10.0, gt=0, description="With start = 'last_minutes', how far back to start reading."
    )
    shards_read: int | None = Field(
        None,
        ge=1,
        description="How many rollout shards to subscribe to (bounds ingress in large "
        "swarms); unset reads all.",
    )

    @field_validator("urls", mode="before")
    @classmethod
    def _urls_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("creds_file", "nkey_seed_file", "tls_ca", "tls_cert", "tls_key")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        return existing_file(value)

    @field_validator("urls")
    @classmethod
    def _urls_scheme(cls, value: list[str]) -> list[str]:
        for url in value:
            scheme = url.split("://", 1)[0] if "://" in url else ""
            if scheme not in {"nats", "tls", "ws", "wss"}:
                raise ValueError(
                    f"{url!r} is not a NATS URL: expected nats://, tls://, ws:// or wss://"
                )
            check_host_port(url)
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> NatsSection:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together (mutual TLS)")
        return self

    def options(self, url: str | None = None, **overrides: Any) -> NatsOptions:
        """These settings as the transport's connection options.

        Args:
            url: connect to this URL only; default: every one of ``urls`` (none: embedded).
            overrides: other :class:`NatsOptions` fields (``connect_timeout``, ``reconnect``).
        """
        from sapo_async.fabric.transport.embedded import NatsOptions

        return NatsOptions(
            url=url or ",".join(self.urls) or None,
            creds_file=self.creds_file,
            nkey_seed_file=self.nkey_seed_file,
            tls_ca_file=self.tls_ca,
            tls_cert_file=self.tls_cert,
            tls_key_file=self.tls_key,
            **overrides,
        )


class LedgerSection(_Section):
    """[ledger]: where rollout commitments are recorded."""

    enabled: bool = Field(True, description="Record rollout commitments on the EVM ledger.")
    rpc_url: str | None = Field(
        None,
        description="JSON-RPC URL of the chain (http://127.0.0.1:8545 for anvil); unset "
        "uses an embedded in-process EVM.",
    )
    contract_address: str | None = Field(
        None,
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="Address of the deployed SapoLedger contract (needed with rpc_url).",
    )
    chain_id: int | None = Field(
        None, ge=1, description="Expected chain id; the node refuses a chain that differs."
    )
    relayer_key_file: Path | None = Field(
        None,
        description="File whose first line is the private key of an account that pays gas "
        "for this node's commitments: the node signs each one (EIP-712), the relayer sends "
        "it. Unset: the node pays its own gas.",
    )

    @field_validator("relayer_key_file")
    @classmethod
    def _expand_key_file(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    def read_relayer_key(self) -> str | None:
        """The relayer's private key from ``relayer_key_file`` (None when unset).

        Raises:
            ConfigError: the file cannot be read or its first line is not a private key
                (0x and 64 hex digits); the message never shows the file's content.
        """
        path = self.relayer_key_file
        if path is None:
            return None
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"cannot read ledger.relayer_key_file {path}: {exc}",
                field="ledger.relayer_key_file",
            ) from exc
        key = lines[0].strip() if lines else ""
        digits = key.removeprefix("0x")
        if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ConfigError(
                f"ledger.relayer_key_file {path}: the first line must be a private key "
                "(0x followed by 64 hex digits)",
                field="ledger.relayer_key_file",
            )
        return "0x" + digits

    @field_validator("rpc_url")
    @classmethod
    def _rpc_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"{value!r} is not an RPC URL: expected http(s):// or ws(s)://")
        if value is not None:
            check_host_port(value)
        return value

    @field_validator("contract_address")
    @classmethod
    def _checksum(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from eth_utils.address import to_checksum_address

        expected = to_checksum_address(value)
        digits = value[2:]
        if digits not in {digits.lower(), digits.upper()} and value != expected:
            raise ValueError(
                f"{value!r} fails its EIP-55 checksum (mixed case must read {expected}): "
                "a character was mistyped"
            )
        return value

    @model_validator(mode="after")
    def _rpc_needs_contract(self) -> LedgerSection:
        if self.enabled and self.rpc_url is not None and self.contract_address is None:
            raise ValueError(
                "rpc_url is set but contract_address is not: give the deployed contract's "
                "address (`sapo-async devnet` prints it for a local chain)"
            )
        return self


class ModelSection(_Section):
    """[model]: the policy model and how it generates."""

    name_or_path: str = Field(
        "auto",
        min_length=1,
        description="Model directory or hub id; 'auto' picks by hardware, 'tiny' is the "
        "project's own CPU model.",
    )
    backend: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="Generation backend; 'auto' uses vLLM on a GPU when installed."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device for training and generation; 'auto' uses CUDA if present."
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take (the trainer needs the rest).",
    )
    sleep_mode: bool = Field(
        False, description="Let vLLM release GPU memory while the trainer steps."
    )


class TasksSection(_Section):
    """[tasks]: the verifiable task families this node trains on."""

    preset: str = Field(
        "cpu", min_length=1, description="Named task preset (families and difficulty)."
    )
    families: StrList = Field(
        default_factory=list,
        description="reasoning-gym families to use; non-empty overrides the preset.",
    )
    regime: Literal["dense", "sparse"] = Field(
        "dense",
        description="Reward regime: 'dense' (partial credit) or 'sparse' (answer tag required).",
    )

    @field_validator("families", mode="before")
    @classmethod
    def _families_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: list[str]) -> list[str]:
        if not value:
            return value
        from reasoning_gym.factory import DATASETS  # 0.8 s: only when families are given

        for family in value:
            if family not in DATASETS:
                raise ValueError(
                    f"{family!r} is not a reasoning-gym family{did_you_mean(family, DATASETS)}; "
                    f"{len(DATASETS)} exist (python -c 'import reasoning_gym.factory as f; "
                    "print(sorted(f.DATASETS))')"
                )
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from sapo_async.tasks.spec import PRESETS

        if value not in PRESETS:
            raise ValueError(
                f"{value!r} is not a task preset{did_you_mean(value, PRESETS)}; "
                f"allowed: {', '.join(map(repr, sorted(PRESETS)))}"
            )
        return value


class TrainingSection(_Section):
    """[training]: the SAPO/GRPO round."""

    questions_per_round: int = Field(8, ge=1, description="Questions sampled per round (B).")
    completions_per_question: int = Field(
        8, ge=2, description="Completions per question (L); GRPO needs at least 2."
    )
    local: int = Field(4, ge=0, description="Own question groups trained on per round (I).")
    external: int = Field(
        4, ge=0, description="Groups from other nodes trained on per round (J); 0 is plain GRPO."
    )
    sampler: Literal["paper", "topk"] = Field(
        "paper",
        description="External sampler: 'paper' drops zero-advantage groups then samples "
        "uniformly; 'topk' takes the most informative.",
    )
    per_producer_cap: int | None = Field(
        None, ge=1, description="Most external groups taken from one producer per round."
    )
    lr: float = Field(3e-5, gt=0, lt=1, description="AdamW learning rate.")
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        "grpo",
        description="Loss aggregation: 'grpo' (per sequence), 'dapo' (token mean), "
        "'dr_grpo' (constant normaliser).",
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip above (1 + clip_high).")
    kl_beta: float = Field(0.0, ge=0, description="KL penalty to the initial model; 0 disables.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(32, ge=1, description="Longest completion, in tokens.")
    max_staleness_rounds: int = Field(
        8, ge=0, description="Drop external groups more than this many rounds behind."
    )
    max_age_s: float = Field(
        600.0, gt=0, description="Drop external groups older than this many seconds."
    )
    overlap_generation: bool = Field(
        False,
        description="Generate round r+1 while round r trains, one policy version behind "
        "(costs a copy of the weights; see docs/swarm.md).",
    )

    @model_validator(mode="after")
    def _some_groups(self) -> TrainingSection:
        if self.local + self.external == 0:
            raise ValueError("local + external must be at least 1 (nothing to train on)")
        if self.local > self.questions_per_round:
            raise ValueError(
                f"local ({self.local}) cannot exceed questions_per_round "
                f"({self.questions_per_round})"
            )
        return self


class MetricsSection(_Section):
    """[metrics]: what the volunteer sees."""

    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="Serve Prometheus metrics on this port; unset disables."
    )
    prometheus_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Interface the metrics endpoint binds; '0.0.0.0' exposes it to the network.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level."
    )
    log_json: bool | None = Field(
        None, description="JSON log lines (true) or console (false); unset picks by TTY."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


SECTIONS: dict[str, type[BaseModel]] = {
    "node": NodeSection,
    "identity": IdentitySection,
    "nats": NatsSection,
    "ledger": LedgerSection,
    "model": ModelSection,
    "tasks": TasksSection,
    "training": TrainingSection,
    "metrics": MetricsSection,
}
"""Every section, by its TOML name, in the order the example file lists them."""
