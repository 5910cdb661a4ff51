"""A volunteer node's settings: one TOML file plus ``SAPO_*`` environment overrides.

Owns the typed, frozen :class:`NodeConfig` (one pydantic model per TOML section), its
loader :func:`load_config`, and :func:`render_example`, which writes the commented example
``node.toml`` from the same field descriptions (each field is documented exactly once, in
its ``Field(description=...)``).

Precedence, highest first: keyword arguments to :func:`load_config`, environment variables
(``SAPO_<SECTION>__<FIELD>``, e.g. ``SAPO_TRAINING__LR=1e-5``), the TOML file, defaults.
List fields accept a JSON list or a comma-separated string from the environment.

Does not know how the settings are used: the node, doctor and devnet read them.
Invariants: a loaded config is valid and immutable; any bad value, unknown key or
unreadable file raises :class:`~sapo_async.errors.ConfigError` naming the field, the value
and what is allowed, never pydantic's own exception.
"""

from __future__ import annotations

import contextvars
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from sapo_async.errors import ConfigError

if TYPE_CHECKING:
    from sapo_async.fabric.transport.embedded import NatsOptions

__all__ = [
    "ENV_PREFIX",
    "IdentitySection",
    "LedgerSection",
    "MetricsSection",
    "ModelSection",
    "NatsSection",
    "NodeConfig",
    "NodeSection",
    "TasksSection",
    "TrainingSection",
    "load_config",
    "render_example",
    "render_reference",
]

ENV_PREFIX = "SAPO_"
"""Every environment override starts with this; sections and fields are joined by ``__``."""

_ENV_DELIMITER = "__"


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
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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
    seed: int = Field(0, ge=0, description="Seed for task sampling and generation RNGs.")
    rounds: int | None = Field(
        None, ge=1, description="Rounds to run, then stop; unset runs until stopped."
    )
    checkpoint_every: int = Field(
        10, ge=1, description="Write a checkpoint (model, optimizer, round, RNG) every N rounds."
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
        return value.expanduser()


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

    @field_validator("keystore", "password_file")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()


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

    @field_validator("urls")
    @classmethod
    def _urls_scheme(cls, value: list[str]) -> list[str]:
        for url in value:
            scheme = url.split("://", 1)[0] if "://" in url else ""
            if scheme not in {"nats", "tls", "ws", "wss"}:
                raise ValueError(
                    f"{url!r} is not a NATS URL: expected nats://, tls://, ws:// or wss://"
                )
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

    @field_validator("rpc_url")
    @classmethod
    def _rpc_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"{value!r} is not an RPC URL: expected http(s):// or ws(s)://")
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


_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "sapo_config_toml", default=None
)


class NodeConfig(BaseSettings):
    """All settings of one volunteer node, one attribute per TOML section."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=_ENV_DELIMITER,
        extra="ignore",  # other SAPO_* variables (e.g. SAPO_KEY_PASSWORD) are not settings
        frozen=True,
        validate_default=True,
    )

    node: NodeSection = Field(default_factory=NodeSection)  # type: ignore[arg-type]
    identity: IdentitySection = Field(default_factory=IdentitySection)  # type: ignore[arg-type]
    nats: NatsSection = Field(default_factory=NatsSection)  # type: ignore[arg-type]
    ledger: LedgerSection = Field(default_factory=LedgerSection)  # type: ignore[arg-type]
    model: ModelSection = Field(default_factory=ModelSection)  # type: ignore[arg-type]
    tasks: TasksSection = Field(default_factory=TasksSection)  # type: ignore[arg-type]
    training: TrainingSection = Field(default_factory=TrainingSection)  # type: ignore[arg-type]
    metrics: MetricsSection = Field(default_factory=MetricsSection)  # type: ignore[arg-type]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env or secrets dir: a node's settings live in one visible file plus the env.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = _TOML_FILE.get()
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    @property
    def keystore_path(self) -> Path:
        """The keystore file: ``identity.keystore`` or ``<data_dir>/key.json``."""
        return self.identity.keystore or self.node.data_dir / "key.json"

    @property
    def checkpoint_dir(self) -> Path:
        """Where checkpoints are written: ``<data_dir>/checkpoints``."""
        return self.node.data_dir / "checkpoints"

    @property
    def journal_dir(self) -> Path:
        """Where the ledger journal lives: ``<data_dir>/journal``."""
        return self.node.data_dir / "journal"

    @property
    def log_dir(self) -> Path:
        """Where log files go: ``<data_dir>/logs``."""
        return self.node.data_dir / "logs"


def _env_name(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + _ENV_DELIMITER.join(str(part).upper() for part in loc[:2])


def _translate(exc: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's errors into one ConfigError that a volunteer can act on."""
    lines = []
    first_field: str | None = None
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        field = ".".join(str(part) for part in loc) or "(whole config)"
        first_field = first_field or field
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            section = loc[0] if loc else ""
            allowed = _field_names(str(section)) if len(loc) > 1 else sorted(_SECTIONS)
            lines.append(
                f"  {field}: unknown setting; allowed here: {', '.join(allowed) or '(none)'}"
            )
            continue
        where = f" (or env {_env_name(loc)})" if len(loc) >= 2 else ""
        value = error.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        lines.append(f"  {field}{shown}: {message}{where}")
    return ConfigError(
        f"invalid node configuration ({source}):\n" + "\n".join(lines), field=first_field
    )


_SECTIONS: dict[str, type[BaseModel]] = {
    "node": NodeSection,
    "identity": IdentitySection,
    "nats": NatsSection,
    "ledger": LedgerSection,
    "model": ModelSection,
    "tasks": TasksSection,
    "training": TrainingSection,
    "metrics": MetricsSection,
}


def _field_names(section: str) -> list[str]:
    model = _SECTIONS.get(section)
    return sorted(model.model_fields) if model else []


def load_config(path: str | Path | None = None, **overrides: Any) -> NodeConfig:
    """Load a node's settings from a TOML file, the environment and keyword overrides.

    Args:
        path: a ``node.toml``; ``None`` uses only the environment and defaults.
        **overrides: whole sections (``training={"lr": 1e-5}``), highest precedence.

    Returns:
        The validated, frozen config.

    Raises:
        ConfigError: the file is missing or not TOML, a section or key is unknown, or a
            value is out of range; the message names every offending field, its value
            and what is allowed (and the ``SAPO_*`` variable that sets it).
    """
    toml_path: Path | None = None
    source = "defaults and SAPO_* environment"
    if path is not None:
        toml_path = Path(path).expanduser()
        source = f"{toml_path} and SAPO_* environment"
        try:
            with toml_path.open("rb") as fh:
                document = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(
                f"config file {toml_path} does not exist; `sapo-async init {toml_path}` "
                "writes a commented example",
                field="config",
            ) from exc
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {toml_path} as TOML: {exc}", field="config") from exc
        unknown = sorted(set(document) - set(_SECTIONS))
        if unknown:
            raise ConfigError(
                f"invalid node configuration ({source}): unknown section(s) "
                f"{', '.join(f'[{name}]' for name in unknown)}; allowed: "
                f"{', '.join(f'[{name}]' for name in _SECTIONS)}",
                field=unknown[0],
            )
    token = _TOML_FILE.set(toml_path)
    try:
        return NodeConfig(**overrides)
    except ValidationError as exc:
        raise _translate(exc, source) from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid node configuration ({source}): {exc}") from exc
    finally:
        _TOML_FILE.reset(token)


# --- the commented example ------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _allowed(info: FieldInfo) -> str:
    annotation = info.annotation
    if typing.get_origin(annotation) in {typing.Union, types.UnionType}:
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if typing.get_origin(annotation) is Literal:
        return " One of: " + ", ".join(_toml_value(arg) for arg in typing.get_args(annotation))
    return ""


def render_example() -> str:
    """Return a commented ``node.toml`` listing every setting with its default.

    Settings without a default value appear commented out. Loading the result gives the
    defaults (tested), so the file is a safe starting point.
    """
    out = [
        "# sapo-async node configuration (written by `sapo-async init`).",
        "# Every setting below shows its default; delete what you do not change.",
        "# Any setting can be overridden by an environment variable",
        "# SAPO_<SECTION>__<FIELD>, e.g. SAPO_TRAINING__LR=1e-5 or",
        "# SAPO_NATS__URLS=nats://a:4222,nats://b:4222.",
        "",
    ]
    for section_name, model in _SECTIONS.items():
        out.append(f"[{section_name}]")
        out.append(f"# {(model.__doc__ or '').strip().split(': ', 1)[-1]}")
        defaults = model()
        for name, info in model.model_fields.items():
            out.append(f"# {info.description}{_allowed(info)}")
            value = getattr(defaults, name)
            if value is None:
                out.append(f"# {name} =")
            else:
                out.append(f"{name} = {_toml_value(value if name != 'data_dir' else '~/.sapo')}")
        out.append("")
    return "\n".join(out)


def render_reference() -> str:
    """Return the settings reference as Markdown tables, one per section.

    docs/volunteer.md embeds this text verbatim (a test keeps the two in sync).
    """
    out: list[str] = []
    for section_name, model in _SECTIONS.items():
        out += [f"#### [{section_name}]", "", "| setting | default | meaning |", "|---|---|---|"]
        defaults = model()
        for name, info in model.model_fields.items():
            value = "~/.sapo" if name == "data_dir" else getattr(defaults, name)
            shown = "unset" if value is None else _toml_value(value)
            meaning = f"{info.description}{_allowed(info)}".replace("|", "/")
            out.append(f"| `{name}` | `{shown}` | {meaning} |")
        out.append("")
    return "\n".join(out)
