"""Start-up checks of ``sapo-async node``: refuse to start a node that would run uselessly.

Owns the checks a node passes before it loads a model: the NATS servers answer (doctor's
:func:`~sapo_async.ops.doctor.check_nats`, at least one URL), the chain answers with the
configured ``ledger.chain_id``, the contract has code and is this swarm's SapoLedger
(doctor's :func:`~sapo_async.ops.doctor.check_ledger`, where a contract of another swarm
fails instead of warning), whoever pays for commitments can pay for one (:func:`check_funds`:
the relayer when one is configured, else the node), and the metrics port is free.
:func:`run_startup_checks` runs the server and contract checks (before torch is imported,
so a dead server fails in a second or two) and :func:`require_funds` the payer's, once the
node's spec says who pays; each raises the first failure as an error whose one-line message
carries doctor's fix.

Outages are not configuration errors: a NATS server or RPC endpoint that does not answer
(refused, or silent: a paused anvil, a restarting server) is retried with jittered backoff
for ``nats.connect_timeout_s`` / ``ledger.connect_timeout_s``, logging
``startup_check_waiting`` with the URL, and only then raises
:class:`~sapo_async.errors.TransportUnavailable` / :class:`~sapo_async.errors.LedgerUnavailable`
(exit 1) naming the URL. Only what waiting cannot fix is a :class:`ConfigError` (exit 2): a
wrong chain id, no code at the contract address, another swarm's (or another kind of)
contract, a payer without funds, a busy metrics port, refused NATS credentials. A chain that
stops answering in the middle of the checks (between the chain id and the contract, or at
the funds check after the model loaded) counts as unreachable, never as a wrong contract.

Does not start anything and changes nothing: each check only reads (a connection, an RPC
call, a bind that is released at once). Invariant: every single check has doctor's timeout;
the waiting is bounded by the two settings above.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from sapo_async import limits
from sapo_async.backoff import Backoff
from sapo_async.errors import ConfigError, LedgerError, LedgerUnavailable, TransportUnavailable
from sapo_async.limits import DOCTOR_CONNECT_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.ops.doctor import Check, check_ledger, check_nats

if TYPE_CHECKING:
    from sapo_async.ledger.chain import Chain
    from sapo_async.ops.config import NodeConfig

__all__ = [
    "COMMIT_GAS_ESTIMATE",
    "check_funds",
    "check_metrics_port",
    "raise_first_failure",
    "require_funds",
    "run_startup_checks",
]

COMMIT_GAS_ESTIMATE = 1_500_000
"""Gas one commitment may take: one crediting the most producers (64) uses ~1.3M (see
``limits.LEDGER_EMBEDDED_TX_GAS``). A node whose payer cannot afford one such commitment at
the chain's gas price would train, fail every send and end with nothing on chain."""

_log = get_logger("startup")

_FUND_FIX = (
    "send it some ETH on this chain (locally: `sapo-async devnet --fund {address}`), or "
    "set ledger.relayer_key_file to an account that pays for the node's commitments"
)


def check_funds(chain: Chain, payer: str, *, who: str = "node") -> Check:
    """Check that ``payer`` can pay the gas of one commitment at the current gas price.

    Args:
        chain: the ledger's chain.
        payer: the address that sends (and pays for) the node's commitments.
        who: ``"node"`` or ``"relayer"``, for the message.
    """
    from sapo_async.ledger.chain import translate_errors

    try:
        with chain.lock, translate_errors():
            balance = int(chain.w3.eth.get_balance(payer))  # type: ignore[arg-type]
            price = int(chain.w3.eth.gas_price)
    except LedgerUnavailable as exc:
        return unreachable_chain(chain, exc)
    except LedgerError as exc:
        return Check("funds", "fail", f"cannot read the balance of {payer}: {exc}")
    needed = COMMIT_GAS_ESTIMATE * price
    if balance < needed:
        return Check(
            "funds",
            "fail",
            f"the {who} {payer} has {balance / 1e18:.6g} ETH; one commitment needs about "
            f"{needed / 1e18:.6g} ETH ({COMMIT_GAS_ESTIMATE} gas at {price / 1e9:.3g} gwei)",
            _FUND_FIX.format(address=payer),
        )
    return Check("funds", "ok", f"the {who} {payer} has {balance / 1e18:.6g} ETH")


def unreachable_chain(chain: Chain, exc: Exception) -> Check:
    """The failed ``rpc <url>`` check of a chain that stopped answering mid-check."""
    return Check(f"rpc {chain.url or 'the given chain'}", "fail", f"cannot reach the chain: {exc}")


def _waiting_helps(check: Check) -> bool:
    """Whether a failed check is an outage (retry) rather than a setting (refuse now)."""
    if not check.name.startswith(("nats ", "jetstream ", "rpc ")):
        return False
    return "authorization" not in check.detail.lower()


def _without_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it removed (logs, errors)."""
    return re.sub(r"//[^/@\s]*@", "//", text)


def _until_reachable(run: Callable[[], list[Check]], wait_s: float) -> list[Check]:
    """Run ``run`` until no check fails for an outage, or ``wait_s`` has passed.

    Sleeps between tries (start-up is synchronous, before the event loop): jittered
    backoff from ``limits.STARTUP_RETRY_BASE_S`` to ``limits.STARTUP_RETRY_MAX_S``.
    """
    backoff = Backoff(
        limits.STARTUP_RETRY_BASE_S, limits.STARTUP_RETRY_MAX_S, jitter=limits.RETRY_JITTER
    )
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        checks = run()
        down = [c for c in checks if c.failed and _waiting_helps(c)]
        left = deadline - time.monotonic()
        if not down or left <= 0:
            return checks
        delay = min(backoff.delay(attempt), left)
        _log.warning(
            "startup_check_waiting",
            check=_without_credentials(down[0].name),
            detail=_without_credentials(down[0].detail),
            retry_in_s=round(delay, 2),
            gives_up_in_s=round(left, 1),
        )
        time.sleep(delay)  # backoff between tries of a server that does not answer
        attempt += 1


def check_metrics_port(cfg: NodeConfig) -> Check | None:
    """Check that ``metrics.prometheus_port`` can be bound (None when metrics are off)."""
    port, host = cfg.metrics.prometheus_port, cfg.metrics.prometheus_host
    if port is None:
        return None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return Check(
            "metrics",
            "fail",
            f"metrics.prometheus_port = {port}: cannot listen on {host}:{port} "
            f"({exc.strerror or exc})",
            "choose a free port, or stop what listens there",
        )
    return Check("metrics", "ok", f"{host}:{port} is free")


def _payer(node: str, relayer: str | None) -> tuple[str, str]:
    """Who pays for commitments: the relayer (``ledger.relayer_key_file``) if any, else the
    node itself."""
    return (relayer, "relayer") if relayer is not None else (node, "node")


def _ledger_chain(cfg: NodeConfig, chain: Chain | None, timeout: float) -> Chain | None:
    """The chain the node commits to over RPC (None: no ledger, or the embedded chain,
    whose relayer is funded)."""
    from sapo_async.ledger.rpc import rpc_chain

    if not cfg.ledger.enabled or (cfg.ledger.rpc_url is None and chain is None):
        return None
    if chain is None:
        assert cfg.ledger.rpc_url is not None
        chain = rpc_chain(cfg.ledger.rpc_url, timeout_s=timeout)
    return chain


def _ledger_checks(cfg: NodeConfig, chain: Chain | None, timeout: float) -> list[Check]:
    chain = _ledger_chain(cfg, chain, timeout)
    if chain is None:
        return []
    checks = check_ledger(cfg, chain=chain, timeout=timeout)
    # Another swarm's contract is only worth a warning in doctor; a node would commit into
    # the wrong swarm's records, so here it is a failure.
    return [
        Check(c.name, "fail", c.detail, c.fix) if c.name == "contract" and c.status == "warn" else c
        for c in checks
    ]


def raise_first_failure(checks: Sequence[Check]) -> None:
    """Raise the first failed check as the error a volunteer reads (one line, with the fix).

    Raises:
        TransportUnavailable: no NATS URL answered.
        LedgerUnavailable: the chain's RPC did not answer.
        ConfigError: any other failure (wrong chain, contract, funds, port), naming the
            setting to change.
    """
    for check in checks:
        if not check.failed:
            continue
        message = _without_credentials(f"start-up check {check.name} failed: {check.detail}")
        if check.fix:
            message += f"; fix: {check.fix}"
        message += " (`sapo-async doctor` checks everything)"
        if check.name.startswith("nats"):
            raise TransportUnavailable(message)
        if check.name.startswith("rpc"):
            raise LedgerUnavailable(message)
        field = {
            "chain id": "ledger.chain_id",
            "contract": "ledger.contract_address",
            "metrics": "metrics.prometheus_port",
        }.get(check.name)
        raise ConfigError(message, field=field)


def run_startup_checks(
    cfg: NodeConfig, *, chain: Chain | None = None, timeout: float = DOCTOR_CONNECT_TIMEOUT_S
) -> list[Check]:
    """Check the servers and the contract before anything heavy loads; raise the first failure.

    Args:
        cfg: the node's settings.
        chain: the ledger's chain instead of one on ``ledger.rpc_url`` (tests).
        timeout: seconds per server connection or request.

    Returns:
        The checks, all passed (metrics port, NATS, RPC, chain id, contract).

    Raises:
        TransportUnavailable, LedgerUnavailable, ConfigError: see :func:`raise_first_failure`.
    """
    checks: list[Check] = []
    port = check_metrics_port(cfg)
    if port is not None:
        checks.append(port)
    raise_first_failure(checks)
    if cfg.nats.urls:

        def nats_checks() -> list[Check]:
            nats = anyio.run(lambda: check_nats(cfg, connect_timeout=timeout))
            # One server with JetStream is enough (a cluster reconnects to the others); only
            # when none answers with it is the node refused.
            serving = [c for c in nats if c.name.startswith("jetstream ") and not c.failed]
            return serving or [c for c in nats if c.failed]

        checks += _until_reachable(nats_checks, cfg.nats.connect_timeout_s)
        raise_first_failure(checks)
    checks += _until_reachable(
        lambda: _ledger_checks(cfg, chain, timeout), cfg.ledger.connect_timeout_s
    )
    raise_first_failure(checks)
    return checks


def require_funds(
    cfg: NodeConfig,
    node: str,
    *,
    relayer: str | None = None,
    chain: Chain | None = None,
    timeout: float = DOCTOR_CONNECT_TIMEOUT_S,
) -> Check | None:
    """Check that whoever pays for the node's commitments can pay for one; raise if not.

    Args:
        cfg: the node's settings.
        node: the node's address (it pays unless a relayer does).
        relayer: the address of the relayer that pays instead (None: the node pays).
        chain: the ledger's chain instead of one on ``ledger.rpc_url`` (tests).
        timeout: seconds per request.

    Returns:
        The passed check, or None when nobody pays (no ledger, or the embedded chain).

    Raises:
        ConfigError: the payer cannot afford one commitment; the fix says how to fund it.
        LedgerUnavailable: the chain did not answer within ``ledger.connect_timeout_s``.
    """
    chain = _ledger_chain(cfg, chain, timeout)
    if chain is None:
        return None
    payer = _payer(node, relayer)
    checks = _until_reachable(
        lambda: [check_funds(chain, payer[0], who=payer[1])], cfg.ledger.connect_timeout_s
    )
    raise_first_failure(checks)
    return checks[0]
