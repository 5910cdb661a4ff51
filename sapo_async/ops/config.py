"""A volunteer node's settings: one TOML file plus ``SAPO_*`` environment overrides.

Owns the typed, frozen :class:`NodeConfig` (one pydantic model per TOML section, defined
in :mod:`.config_sections`, most generated from the node spec's own models), its loader
:func:`load_config`, the translation of pydantic's errors into one
:class:`~sapo_async.errors.ConfigError`, and :meth:`NodeConfig.to_spec`, which builds the
:class:`~sapo_async.node.spec.NodeSpec` a node is built from: each section's keys pass
under their own names; only what the file derives (paths under ``data_dir``, the hardware
choice, the task families) is added there, once.

Precedence, highest first: keyword arguments to :func:`load_config`, environment variables
(``SAPO_<SECTION>__<FIELD>``, e.g. ``SAPO_TRAINING__LR=1e-5``), the TOML file, defaults.
List fields accept a JSON list or a comma-separated string from the environment.

Does not know how the settings are used beyond the spec: the node, doctor and devnet read
them. Invariants: a loaded config is valid and immutable; any bad value, unknown key or
unreadable file raises :class:`~sapo_async.errors.ConfigError` naming the field, the value
and what is allowed, never pydantic's own exception.
"""

from __future__ import annotations

import contextvars
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from sapo_async.errors import ConfigError
from sapo_async.ops.config_checks import did_you_mean
from sapo_async.ops.config_docs import render_example, render_reference
from sapo_async.ops.config_sections import (
    SECTIONS,
    CheckpointSection,
    DefenceSection,
    IdentitySection,
    LedgerSection,
    MetricsSection,
    ModelSection,
    NatsSection,
    NodeSection,
    TasksSection,
    TrainingSection,
)
from sapo_async.policy.settings import renamed_message

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from sapo_async.node.spec import NodeSpec
    from sapo_async.ops.hardware import HardwareChoice

__all__ = [  # the sections themselves are config_sections' (SECTIONS)
    "ENV_PREFIX",
    "KNOWN_ENVIRONMENT",
    "NodeConfig",
    "check_environment",
    "load_config",
    "render_example",
    "render_reference",
]

ENV_PREFIX = "SAPO_"
"""Every environment override starts with this; sections and fields are joined by ``__``."""

_ENV_DELIMITER = "__"


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
    nats: NatsSection = Field(default_factory=NatsSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    model: ModelSection = Field(default_factory=ModelSection)  # type: ignore[arg-type]
    tasks: TasksSection = Field(default_factory=TasksSection)  # type: ignore[arg-type]
    training: TrainingSection = Field(default_factory=TrainingSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    defence: DefenceSection = Field(default_factory=DefenceSection)
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
    def journal_path(self) -> Path:
        """The node's ledger journal: ``<data_dir>/journal/journal.sqlite`` (``verify`` reads
        it)."""
        return self.journal_dir / "journal.sqlite"

    @property
    def log_dir(self) -> Path:
        """Where log files go: ``<data_dir>/logs``."""
        return self.node.data_dir / "logs"

    def to_spec(self, *, account: LocalAccount, hardware: HardwareChoice) -> NodeSpec:
        """The node these settings describe, on the hardware chosen for it.

        Args:
            account: the node's key (from its keystore).
            hardware: the backend, device and model :func:`~sapo_async.ops.hardware.select_backend`
                chose for ``[model]``.

        Raises:
            ConfigError: a combination the node cannot run (named).
        """
        from sapo_async.node.spec import PolicySpec
        from sapo_async.tasks.spec import FamilySpec

        tasks: str | tuple[FamilySpec, ...] = self.tasks.preset
        if self.tasks.families:
            tasks = tuple(FamilySpec(f, {}) for f in self.tasks.families)
        spec: NodeSpec = self.node.to_part(
            account=account,
            policy=PolicySpec(
                **self.tasks.spec_values(),  # regime, prompt_style
                model=hardware.model,
                tasks=tasks,
                device=hardware.device,
                backend=hardware.backend,
                gpu_memory_utilization=hardware.gpu_memory_utilization
                or self.model.gpu_memory_utilization,
                sleep_mode=self.model.sleep_mode and hardware.backend == "vllm",
                generation_dtype=self.model.generation_dtype,
                train_layers=self.model.train_layers,
            ),
            training=self.training.to_part(),
            fabric=self.nats.to_part(),
            ledger=self.ledger.to_part(journal_path=self.journal_path),
            checkpoint=self.checkpoint.to_part(dir=self.checkpoint_dir),
            defence=self.defence,  # [defence] is the spec's DefenceSpec itself
        )
        return spec


def _env_name(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + _ENV_DELIMITER.join(str(part).upper() for part in loc[:2])


def _translate(exc: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's errors into one ConfigError, on one line, that a volunteer can act on."""
    items = []
    first_field: str | None = None
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        field = ".".join(str(part) for part in loc) or "(whole config)"
        first_field = first_field or field
        # A section's own check across its fields already names the section.
        message = error["msg"].removeprefix("Value error, ").removeprefix(f"{field}: ")
        if error["type"] == "extra_forbidden":
            section = loc[0] if loc else ""
            allowed = _field_names(str(section)) if len(loc) > 1 else sorted(SECTIONS)
            hint = did_you_mean(str(loc[-1]), allowed) if loc else ""
            items.append(
                f"{field}: unknown setting{hint}; allowed here: {', '.join(allowed) or '(none)'}"
            )
            continue
        where = f" (or env {_env_name(loc)})" if len(loc) >= 2 else ""
        value = error.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        items.append(f"{field}{shown}: {message}{where}")
    return ConfigError(
        f"invalid node configuration ({source}): " + "; ".join(items), field=first_field
    )


KNOWN_ENVIRONMENT: dict[str, str] = {
    "SAPO_KEY_PASSWORD": "the keystore password (the default identity.password_env)",
    "SAPO_NATS_SERVER": "path of the nats-server binary to run",
    "SAPO_ANVIL": "path of the anvil binary to run",
    "SAPO_CACHE_DIR": "root of the tiny model's cache",
    "SAPO_JOURNAL": "`sapo-async verify`: the ledger journal file",
    "SAPO_LEDGER_RPC": "`sapo-async audit`: the chain's JSON-RPC URL",
    "SAPO_LEDGER_ADDRESS": "`sapo-async audit`: the SapoLedger's address",
}
"""``SAPO_*`` variables that are not settings but are read elsewhere; any other ``SAPO_*``
variable that is not ``SAPO_<SECTION>__<FIELD>`` is a typo and an error. Add a line here
with any new one."""

_FREE_ENV_PREFIXES = ("SAPO_TEST_",)  # the test suite's own variables


def _variable(section: str, field: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}{_ENV_DELIMITER}{field.upper()}"


def _setting_variables() -> list[str]:
    return [
        _variable(section, name)
        for section, model in SECTIONS.items()
        for name in model.model_fields
    ]


def check_environment(environ: Mapping[str, str], *, password_env: str) -> None:
    """Refuse ``SAPO_*`` variables that set nothing (a typo would silently change nothing).

    Args:
        environ: the environment (``os.environ``).
        password_env: the variable ``[identity] password_env`` names (allowed too).

    Raises:
        ConfigError: an unknown ``SAPO_*`` variable, with the closest known name; the
            variable of a renamed or retired key, with the file's message for that key in
            the environment's terms (the new variable, or why it went). Its value is not
            shown (it may be a secret).
    """
    settings = _setting_variables()
    known = {*settings, *KNOWN_ENVIRONMENT, password_env.upper()}
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if upper.startswith(_FREE_ENV_PREFIXES):
            continue
        _refuse_old_variable(name)
        hint = did_you_mean(upper, sorted(known))
        raise ConfigError(
            f"unknown environment variable {name}{hint}: settings are "
            f"{ENV_PREFIX}<SECTION>{_ENV_DELIMITER}<FIELD> (e.g. SAPO_TRAINING__LR), other "
            f"known ones are {', '.join(sorted(KNOWN_ENVIRONMENT))}; unset it or fix its name",
            field=name,
        )


def _refuse_old_variable(name: str) -> None:
    """Raise the message the file gives an old key (renamed or retired), in the
    environment's terms (``SAPO_NODE__ROUNDS is now called SAPO_TRAINING__ROUNDS``), when
    ``name`` is the variable of one; return otherwise."""
    section, _, field = name.upper().removeprefix(ENV_PREFIX).partition(_ENV_DELIMITER)
    model = SECTIONS.get(section.lower())
    if model is None or not field:
        return
    field = field.lower()
    retired: dict[str, str] = getattr(model, "retired", {})
    if field in retired:
        raise ConfigError(
            f"{name} is no longer a setting ({retired[field]}): unset the variable", field=name
        )
    new = getattr(model, "renamed", {}).get(field)
    if new is None:
        return
    # "[training] rounds" moved to another section; "start (seconds back: ...)" has a hint
    moved = re.match(r"\[(\w+)\]\s*", new)
    target = moved.group(1) if moved else section.lower()
    names, paren, hint = new[moved.end() if moved else 0 :].partition(" (")
    fields = SECTIONS[target].model_fields
    names = re.sub(
        r"\w+", lambda m: _variable(target, m.group()) if m.group() in fields else m.group(), names
    )
    raise ConfigError(
        f"{renamed_message(name, names + paren + hint)}: rename the variable", field=name
    )


_TOML_WHERE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> ConfigError:
    """``file:line:column: what`` for a TOML syntax error (editors jump to it)."""
    text = str(exc)
    found = _TOML_WHERE.search(text)
    if found is None:
        return ConfigError(f"{path}: not valid TOML: {text}", field="config")
    what = text[: found.start()]
    return ConfigError(
        f"{path}:{found.group(1)}:{found.group(2)}: not valid TOML: {what}", field="config"
    )


def _field_names(section: str) -> list[str]:
    model = SECTIONS.get(section)
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
    document: dict[str, Any] = {}
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
        except IsADirectoryError as exc:
            raise ConfigError(f"config file {toml_path} is a directory", field="config") from exc
        except OSError as exc:
            raise ConfigError(
                f"cannot read config file {toml_path}: {exc.strerror or exc}", field="config"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise _toml_error(toml_path, exc) from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{toml_path}: not valid TOML: not UTF-8 text (byte {exc.start})", field="config"
            ) from exc
        unknown = sorted(set(document) - set(SECTIONS))
        if unknown:
            hints = "".join(did_you_mean(name, SECTIONS) for name in unknown)
            raise ConfigError(
                f"invalid node configuration ({source}): unknown section(s) "
                f"{', '.join(f'[{name}]' for name in unknown)}{hints}; allowed: "
                f"{', '.join(f'[{name}]' for name in SECTIONS)}",
                field=unknown[0],
            )
    check_environment(os.environ, password_env=_password_env(document, overrides))
    token = _TOML_FILE.set(toml_path)
    try:
        return NodeConfig(**overrides)
    except ValidationError as exc:
        raise _translate(exc, source) from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid node configuration ({source}): {exc}") from exc
    finally:
        _TOML_FILE.reset(token)


def _password_env(document: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    """The variable ``[identity] password_env`` will name, read before validation."""
    for source in (overrides.get("identity"), document.get("identity")):
        if isinstance(source, Mapping) and isinstance(source.get("password_env"), str):
            return str(source["password_env"])
    from_env = os.environ.get(f"{ENV_PREFIX}IDENTITY{_ENV_DELIMITER}PASSWORD_ENV")
    return from_env or str(IdentitySection.model_fields["password_env"].default)
