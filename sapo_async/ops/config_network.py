"""node.toml's network sections: ``[nats]`` (the fabric) and ``[ledger]`` (the chain).

Split from :mod:`.config_sections` (which re-exports both and documents the rest) so each
module stays small; same rules: every field documented once in its ``Field(description)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from sapo_async.errors import ConfigError
from sapo_async.ops.config_base import Section, StrList, split_list
from sapo_async.ops.config_checks import (
    check_host_port,
    existing_file,
)

if TYPE_CHECKING:
    from sapo_async.fabric.transport.embedded import NatsOptions

__all__ = ["LedgerSection", "NatsSection"]


class NatsSection(Section):
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
    stream_replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="Replicas of the swarm's stream: 3 on a three-server cluster, so losing "
        "a server loses no acknowledged group (every node that connects sets it: use the "
        "swarm's value).",
    )
    shards: int = Field(
        1,
        description="How many shards this node divides the swarm's rollouts into (by "
        "producer, per family): 1, 16, 256 or 4096; 1 reads everything. See docs/fabric.md "
        "for the count that fits a swarm's size.",
    )
    shards_read: int | None = Field(
        None,
        ge=1,
        description="How many of those shards to read at a time (bounds ingress in large "
        "swarms; the node moves to the next ones every shard_rotate_minutes); unset reads "
        "all.",
    )
    shard_rotate_minutes: float = Field(
        5.0, gt=0, description="Minutes before a node reading a subset moves to the next one."
    )

    @field_validator("urls", mode="before")
    @classmethod
    def _urls_list(cls, value: Any) -> Any:
        return split_list(value)

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

    @field_validator("shards")
    @classmethod
    def _shard_count(cls, value: int) -> int:
        if value not in (1, 16, 256, 4096):
            raise ValueError(f"must be 1, 16, 256 or 4096 (16^0..16^3), got {value}")
        return value

    @model_validator(mode="after")
    def _shards_read_within(self) -> NatsSection:
        if self.shards_read is not None and self.shards_read > self.shards:
            raise ValueError(
                f"shards_read = {self.shards_read} is more than shards = {self.shards}: "
                f"read 1..{self.shards} of them, or raise shards (1, 16, 256 or 4096)"
            )
        return self

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


class LedgerSection(Section):
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
