"""The node spec's parts for the network, the chain and checkpoints.

Owns :class:`FabricSpec`, :class:`LedgerSpec` and :class:`CheckpointSpec` (documented in
:mod:`sapo_async.node.spec`, which re-exports them; the defences' part is
:class:`~sapo_async.node.spec_defence.DefenceSpec`).
Each is a :class:`~sapo_async.policy.settings.Settings` model and node.toml's section of the
same idea is generated from it (``[nats]`` from :data:`FABRIC_FILE_FIELDS`, ``[ledger]``
from :data:`LEDGER_FILE_FIELDS`, ``[checkpoint]`` from :data:`CHECKPOINT_FILE_FIELDS`;
``[defence]`` is :class:`DefenceSpec` itself): a setting has one name, one default, one
bound and one description from the file to the code that uses it. The fields a file cannot
give (a transport object, a journal path derived from ``[node] data_dir``) are the spec's
only. A bad value raises :class:`~sapo_async.errors.ConfigError` naming the field and
what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, model_validator
from pydantic_settings import NoDecode

from sapo_async import limits
from sapo_async.errors import ConfigError
from sapo_async.fabric.transport.shards import SHARD_COUNTS
from sapo_async.limits import (
    CHECKPOINT_LARGE_EVERY,
    CHECKPOINT_SMALL_BYTES,
    NATS_JOIN_TIMEOUT_S,
    SHARD_ROTATE_S,
)
from sapo_async.policy.settings import ReadableFile, Settings, check_host_port, split_list

if TYPE_CHECKING:
    from sapo_async.fabric.transport.embedded import NatsOptions
    from sapo_async.fabric.transport.shards import ShardPlan

__all__ = [
    "CHECKPOINT_FILE_FIELDS",
    "FABRIC_FILE_FIELDS",
    "LEDGER_FILE_FIELDS",
    "CheckpointSpec",
    "FabricSpec",
    "LedgerSpec",
    "read_private_key",
]


NatsUrls = Annotated[tuple[str, ...], NoDecode, BeforeValidator(split_list)]
"""NATS server URLs: a list, or (from the environment) ``a,b`` or a JSON list (as
:data:`~sapo_async.policy.settings.StrList`, kept a tuple)."""


def _nats_urls(value: tuple[str, ...]) -> tuple[str, ...]:
    for url in value:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme not in {"nats", "tls", "ws", "wss"}:
            raise ValueError(
                f"{url!r} is not a NATS URL: expected nats://, tls://, ws:// or wss://"
            )
        check_host_port(url)
    return value


def _shard_count(value: int) -> int:
    if value not in SHARD_COUNTS:
        raise ValueError(f"must be 1, 16, 256 or 4096 (16^0..16^3), got {value}")
    return value


def _start(value: Any) -> Any:
    if value in ("new", "all"):
        return value
    if value == "last_minutes":
        raise ValueError("'last_minutes' is gone: give the seconds back instead (600 for 10 min)")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds < float("inf"):
        raise ValueError(f"must be 'new', 'all' or a number of seconds >= 0, got {value!r}")
    return seconds


class FabricSpec(Settings):
    """How a node shares rollouts; node.toml's ``[nats]`` is :data:`FABRIC_FILE_FIELDS` of it.

    The default ``start = "all"`` reads what the stream retains (at most
    :data:`~sapo_async.limits.STREAM_MAX_AGE_S`); the collector's age rule
    (``training.max_age_s``) refuses what is older, so a large swarm may prefer a number of
    seconds (the old file default, ``"new"`` with 10 minutes of look-back, is ``start = 600``).
    """

    part: ClassVar[str] = "fabric"
    renamed: ClassVar[dict[str, str]] = {
        "nats_url": "urls",
        "nats_options": "urls, creds_file, nkey_seed_file, tls_ca, tls_cert and tls_key",
        "lookback_minutes": "start (seconds back: start = 600 for 10 minutes)",
        "shard_rotate_minutes": "shard_rotate_s (seconds)",
    }

    urls: Annotated[NatsUrls, AfterValidator(_nats_urls)] = Field(
        default=(),
        description="NATS server URLs (nats://host:4222, tls://...); empty starts (or shares) "
        "an embedded private server in this process (a swarm of one machine).",
    )
    creds_file: ReadableFile = Field(
        default=None,
        description="NATS credentials file (JWT + nkey seed) for decentralised auth.",
    )
    nkey_seed_file: ReadableFile = Field(
        default=None,
        description="File with this node's NATS user nkey seed (SU...), for nkey auth.",
    )
    tls_ca: ReadableFile = Field(
        default=None, description="CA certificate to verify the servers with."
    )
    tls_cert: ReadableFile = Field(
        default=None, description="Client certificate for mutual TLS (needs tls_key)."
    )
    tls_key: ReadableFile = Field(
        default=None, description="Client private key for mutual TLS (needs tls_cert)."
    )
    consumer_owner: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,32}$",
        description="The owner name the swarm's operator bound this credential's consumers "
        "to (infra/nats/gen_permissions.py): consumers are then named <owner>-0 .. "
        "<owner>-5, the only ones its permissions allow. Unset: random names (a server "
        "without per-user consumer permissions).",
    )
    start: Annotated[Literal["new", "all"] | float, BeforeValidator(_start)] = Field(
        default="all",
        description="Where this node starts reading shared rollouts: 'new' ones only, 'all' "
        "the stream retains, or a number of seconds back.",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the swarm's stream: 3 on a three-server cluster, so losing "
        "a server loses no acknowledged group (every node that connects sets it: use the "
        "swarm's value).",
    )
    connect_timeout_s: float = Field(
        default=NATS_JOIN_TIMEOUT_S,
        gt=0,
        description="How long to keep retrying NATS at start (with backoff, saying what it "
        "waits for) before giving up.",
    )
    include_tokens: bool = Field(
        default=True,
        description="Share token ids and log-probs (receivers with the same tokenizer use "
        "them for importance weights).",
    )
    shards: Annotated[int, AfterValidator(_shard_count)] = Field(
        default=1,
        description="How many shards this node divides the swarm's rollouts into (by "
        "producer, per family): 1, 16, 256 or 4096; 1 reads everything. See docs/fabric.md "
        "for the count that fits a swarm's size.",
    )
    shards_read: int | None = Field(
        default=None,
        ge=1,
        description="How many of those shards to read at a time (bounds ingress in large "
        "swarms; the node moves to the next ones every shard_rotate_s); unset reads all.",
    )
    shard_rotate_s: float = Field(
        default=SHARD_ROTATE_S,
        gt=0,
        description="Seconds before a node reading a subset of shards moves to the next one.",
    )
    transport: Any = Field(
        default=None,
        description="Use this Transport instead of NATS (tests, the in-memory broker).",
    )
    extra_check: Any = Field(
        default=None, description="An operator's receiver-side check, run after the node's."
    )

    @model_validator(mode="after")
    def _together(self) -> Self:
        if self.shards_read is not None and self.shards_read > self.shards:
            raise ValueError(
                f"shards_read = {self.shards_read} is more than shards = {self.shards}: "
                f"read 1..{self.shards} of them, or raise shards (1, 16, 256 or 4096)"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together (mutual TLS)")
        return self

    def shard_plan(self) -> ShardPlan | None:
        """The shard plan these settings ask for; ``None`` reads everything."""
        from sapo_async.fabric.transport.shards import ShardPlan

        plan = ShardPlan(self.shards, self.shards_read, self.shard_rotate_s)
        return None if plan.count == 1 else plan

    def options(self, url: str | None = None, **overrides: Any) -> NatsOptions:
        """These settings as the transport's connection options.

        Args:
            url: connect to this URL only; default: every one of ``urls`` (none: embedded).
            overrides: other :class:`NatsOptions` fields (``name``, ``connect_timeout``,
                ``reconnect``).
        """
        from sapo_async.fabric.transport.embedded import NatsOptions

        return NatsOptions(
            url=url or ",".join(self.urls) or None,
            creds_file=self.creds_file,
            nkey_seed_file=self.nkey_seed_file,
            tls_ca_file=self.tls_ca,
            tls_cert_file=self.tls_cert,
            tls_key_file=self.tls_key,
            consumer_owner=self.consumer_owner,
            **overrides,
        )


FABRIC_FILE_FIELDS = tuple(
    name for name in FabricSpec.model_fields if name not in {"transport", "extra_check"}
)
"""The fabric settings a volunteer sets in ``node.toml``'s ``[nats]``."""


def _rpc_url(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"{value!r} is not an RPC URL: expected http(s):// or ws(s)://")
    check_host_port(value)
    return value


def _checksummed(value: str | None) -> str | None:
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


def read_private_key(path: Path) -> str:
    """The private key on the first line of ``path`` (``0x`` and 64 hex digits).

    Raises:
        ValueError: the file cannot be read or its first line is not a private key; the
            message never shows the file's content.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    key = lines[0].strip() if lines else ""
    digits = key.removeprefix("0x")
    if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(
            f"{path}: the first line must be a private key (0x followed by 64 hex digits)"
        )
    return "0x" + digits


def _key_file(value: Path | None) -> Path | None:
    if value is not None:
        read_private_key(value)  # a bad file fails when the settings load, not at start
    return value


class LedgerSpec(Settings):
    """Where a node's round commitments are recorded; node.toml's ``[ledger]`` is
    :data:`LEDGER_FILE_FIELDS` of it (``journal_path`` comes from ``[node] data_dir``)."""

    part: ClassVar[str] = "ledger"

    enabled: bool = Field(default=True, description="Record rollout commitments on the EVM ledger.")
    rpc_url: Annotated[str | None, AfterValidator(_rpc_url)] = Field(
        default=None,
        description="JSON-RPC URL of the chain (http://127.0.0.1:8545 for anvil); unset "
        "uses (or shares) an in-process EVM with the swarm's contract deployed on it.",
    )
    contract_address: Annotated[str | None, AfterValidator(_checksummed)] = Field(
        default=None,
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="Address of the deployed SapoLedger contract (needed with rpc_url).",
    )
    chain_id: int | None = Field(
        default=None, ge=1, description="Expected chain id; the node refuses a chain that differs."
    )
    relayer_key_file: Annotated[ReadableFile, AfterValidator(_key_file)] = Field(
        default=None,
        description="File whose first line is the private key of an account that pays gas "
        "for this node's commitments: the node signs each one (EIP-712), the relayer sends "
        "it. Unset: the node pays its own gas.",
    )
    relayer_key: str | None = Field(
        default=None,
        repr=False,  # a secret: never in logs
        description="The relayer's private key itself (Python callers; node.toml names a file).",
    )
    connect_timeout_s: float = Field(
        default=limits.LEDGER_CONNECT_TIMEOUT_S,
        gt=0,
        description="How long a starting node keeps retrying an RPC endpoint that does not "
        "answer (with backoff, saying what it waits for) before giving up.",
    )
    max_pending: int = Field(
        default=limits.LEDGER_MAX_PENDING,
        ge=1,
        le=4096,
        description="Most commitments journaled and not yet on chain before the node pauses "
        "its rounds until they land (the chain is down or slower than the rounds); nothing "
        "is dropped meanwhile.",
    )
    journal_path: Path | None = Field(
        default=None,
        description="The ledger journal's SQLite file (needed with rpc_url; the embedded "
        "ledger keeps journals in a temporary directory).",
    )

    @model_validator(mode="after")
    def _together(self) -> Self:
        if self.relayer_key is not None and self.relayer_key_file is not None:
            raise ValueError("relayer_key and relayer_key_file exclude each other: give one")
        if self.enabled and self.rpc_url is not None and self.contract_address is None:
            raise ValueError(
                "contract_address is needed with rpc_url: give the deployed contract's "
                "address (`sapo-async devnet` prints it for a local chain)"
            )
        return self

    def relayer_private_key(self) -> str | None:
        """The relayer's key: ``relayer_key``, or read from ``relayer_key_file`` (None: the
        node pays its own gas).

        Raises:
            ConfigError: the file cannot be read or holds no private key (its content is
                never shown).
        """
        if self.relayer_key_file is None:
            return self.relayer_key
        try:
            return read_private_key(self.relayer_key_file)
        except ValueError as exc:
            raise ConfigError(
                f"ledger.relayer_key_file: {exc}", field="ledger.relayer_key_file"
            ) from exc


LEDGER_FILE_FIELDS = (
    "enabled",
    "rpc_url",
    "contract_address",
    "chain_id",
    "relayer_key_file",
    "connect_timeout_s",
    "max_pending",
)
"""The ledger settings a volunteer sets in ``node.toml``'s ``[ledger]``."""


def _rounds_or_auto(value: Any) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():  # from the environment
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a number of rounds >= 1 or 'auto', got {value!r}")
    return value


class CheckpointSpec(Settings):
    """Where a node saves its state and resumes from; node.toml's ``[checkpoint]`` is its
    ``every`` (the directory is ``<data_dir>/checkpoints``)."""

    part: ClassVar[str] = "checkpoint"

    dir: Path | None = Field(
        default=None,
        description="Checkpoints go here, and the node resumes from the latest one (model, "
        "optimizer, round, RNG states); None: no checkpoints.",
    )
    every: Annotated[int | Literal["auto"], PlainValidator(_rounds_or_auto)] = Field(
        default="auto",
        description="Write a checkpoint every N rounds (one is also saved on leave); 'auto': "
        f"every round while model + optimizer state is under {CHECKPOINT_SMALL_BYTES >> 20} "
        f"MiB (the tiny model), else every {CHECKPOINT_LARGE_EVERY} rounds. With the "
        "ledger on, a round's commitment is journaled only once a checkpoint at or after "
        "that round is on disk, so a restart never loses a policy version the chain names.",
    )

    def every_rounds(self, state_bytes: int) -> int:
        """The checkpoint interval in rounds for a node whose checkpoint is ``state_bytes``."""
        if self.every != "auto":
            return self.every
        return 1 if state_bytes < CHECKPOINT_SMALL_BYTES else CHECKPOINT_LARGE_EVERY


CHECKPOINT_FILE_FIELDS = ("every",)
"""The checkpoint settings a volunteer sets in ``node.toml``'s ``[checkpoint]``."""
