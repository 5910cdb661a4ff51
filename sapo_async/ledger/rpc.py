"""The JSON-RPC ledger backend: anvil, any testnet or L2 reached by URL.

Owns the HTTP provider settings: a bounded request timeout and no web3-level retries (the
recorder owns retrying, with backoff, so a dead endpoint surfaces at once as
:class:`~sapo_async.errors.LedgerUnavailable`). Connecting is lazy: a chain that is down at
start-up is not an error until it is used.
"""

from __future__ import annotations

from web3 import HTTPProvider, Web3

from sapo_async import limits
from sapo_async.errors import ConfigError
from sapo_async.ledger.chain import Chain

__all__ = ["rpc_chain"]


def rpc_chain(url: str, *, timeout_s: float = limits.LEDGER_RPC_TIMEOUT_S) -> Chain:
    """Return a :class:`Chain` speaking JSON-RPC over HTTP to ``url``.

    Raises:
        ConfigError: ``url`` is not an http(s) URL.
    """
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"ledger RPC URL must be http(s), got {url!r}", field="ledger.rpc_url")
    provider = HTTPProvider(
        url, request_kwargs={"timeout": timeout_s}, exception_retry_configuration=None
    )
    return Chain(Web3(provider), kind="rpc", url=url)
