"""``sapo-async audit``, ``verify`` and ``deploy``: the ledger from the command line.

Owns argument parsing and printing only; the work is in :mod:`sapo_async.ledger.audit` and
:mod:`sapo_async.ledger`, which return rows (:class:`~sapo_async.ledger.audit.NodeAudit`);
the tables are drawn here. The chain is reached by JSON-RPC (``--rpc`` /
``SAPO_LEDGER_RPC``) and the ledger by address (``--ledger`` / ``SAPO_LEDGER_ADDRESS``).
The embedded chain lives inside its process, so a local swarm prints its own audit table
instead (the same :func:`swarm_table`).

Exit codes: 0 success; 1 a verification failed or found nothing; 2 bad input or the chain
could not be used.
"""

# Heavy imports (web3, eth-tester) live inside the commands so `--help` stays fast (cli/main.py).

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rich.table import Table

    from sapo_async.ledger.audit import NodeAudit
    from sapo_async.ledger.evm import EvmLedger

__all__ = ["register", "swarm_table"]

_Rpc = Annotated[
    str,
    typer.Option("--rpc", envvar="SAPO_LEDGER_RPC", help="JSON-RPC URL of the chain."),
]
_LedgerAddress = Annotated[
    str,
    typer.Option("--ledger", envvar="SAPO_LEDGER_ADDRESS", help="Address of the SapoLedger."),
]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _fail(message: str) -> typer.Exit:
    typer.secho(message, err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _ledger(rpc: str, address: str, from_block: int = 0) -> EvmLedger:
    from sapo_async.ledger.evm import EvmLedger
    from sapo_async.ledger.rpc import rpc_chain

    return EvmLedger(rpc_chain(rpc), address, from_block=from_block)


async def _audits(
    ledger: EvmLedger, node: str | None, trusted: list[str] | None, index_path: Path | None
) -> list[Any]:
    """The audit from the ledger's event index (one scan of the new blocks, whatever the
    number of nodes), the views only for a node the index never saw register."""
    from sapo_async.ledger.audit import audit_node
    from sapo_async.ledger.index import LedgerIndex

    index = LedgerIndex(ledger, index_path or ":memory:")
    try:
        await index.refresh()
        if node is None:
            return index.audits(breakdown=True, trusted=trusted)
        found = index.audit(node, trusted=trusted)
    finally:
        index.close()
    return [found if found is not None else await audit_node(ledger, node, trusted=trusted)]


def audit(  # noqa: PLR0917 - typer maps each parameter to an option
    node: Annotated[str | None, typer.Argument(help="Node address to audit.")] = None,
    swarm: Annotated[bool, typer.Option("--swarm", help="Audit every registered node.")] = False,
    rpc: _Rpc = "http://127.0.0.1:8545",
    ledger: _LedgerAddress = "",
    trust: Annotated[
        list[str] | None,
        typer.Option(
            "--trust",
            help="A consumer whose credit weighs fully in the score (repeatable; "
            "default: every consumer). See docs/ledger.md.",
        ),
    ] = None,
    as_json: _Json = False,
    index: Annotated[
        Path | None,
        typer.Option(
            "--index",
            help="SQLite file keeping the ledger's event index between runs (default: in "
            "memory, the events scanned afresh each run).",
        ),
    ] = None,
    from_block: Annotated[
        int, typer.Option("--from-block", help="Block the ledger was deployed at.")
    ] = 0,
) -> None:
    """Show what a node (or every node) committed on the ledger, the credit it received and
    its contribution score (read from the ledger's events, see docs/ledger.md)."""
    import anyio
    from rich.console import Console

    from sapo_async.errors import SapoError
    from sapo_async.ops.status import print_unclipped

    if (node is None) == (not swarm):
        raise _fail("give a NODE address or --swarm (not both)")
    if not ledger:
        raise _fail("no ledger address: pass --ledger or set SAPO_LEDGER_ADDRESS")
    try:
        client = _ledger(rpc, ledger, from_block)
        audits: list[NodeAudit] = anyio.run(_audits, client, node, trust, index)
    except SapoError as exc:
        raise _fail(f"audit failed: {exc}") from exc
    if as_json:
        typer.echo(json.dumps([_audit_json(a) for a in audits], indent=1))
        return
    console = Console()
    print_unclipped(console, swarm_table(audits))
    if not swarm:
        a = audits[0]
        for title, rows in (
            ("credit received, by consumer", a.credit_by_consumer),
            ("external rollouts used, by producer", a.usage_by_producer),
        ):
            print_unclipped(console, _counts_table(title, rows))


_CAPTION = (
    "rounds: commitments; last: last round; shared: rollouts committed; "
    "used: external rollouts trained on; credit: own rollouts others trained on; "
    "score: consumer rounds that used the node, weighted by the consumer's standing"
)


def swarm_table(audits: Sequence[NodeAudit], *, title: str = "swarm ledger audit") -> Table:
    """A rich table: one row per node with its committed and used/credited counts."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, caption=_CAPTION)
    table.add_column("node", no_wrap=True, min_width=42)  # an address must stay copyable
    table.add_column("metadata", max_width=14, overflow="ellipsis", no_wrap=True)
    # Short headers and no wrapping keep the numbers whole in an 80-column terminal.
    for header in ("rounds", "last", "shared", "used", "credit", "score"):
        table.add_column(header, justify="right", no_wrap=True)
    for a in audits:
        p = a.participation
        table.add_row(
            a.node,
            Text(a.metadata),  # any node registers any metadata: plain text, never markup
            str(p.rounds_committed),
            "-" if a.last_round is None else str(a.last_round),
            str(p.rollouts_committed),
            str(p.external_used),
            str(p.credit_received),
            "-" if a.score is None else f"{a.score.score:.2f}",
        )
    return table


def _counts_table(title: str, rows: Mapping[str, int]) -> Table:
    """One row per other node with its rollout count, by address."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("node")
    table.add_column("rollouts", justify="right")
    for other, count in sorted(rows.items()):
        table.add_row(other, str(count))
    return table


def _audit_json(a: Any) -> dict[str, Any]:
    p = a.participation
    return {
        "node": a.node,
        "registered": a.registered,
        "metadata": a.metadata,
        "last_round": a.last_round,
        "rounds_committed": p.rounds_committed,
        "rollouts_committed": p.rollouts_committed,
        "external_used": p.external_used,
        "credit_received": p.credit_received,
        "credit_by_consumer": a.credit_by_consumer,
        "usage_by_producer": a.usage_by_producer,
        "score": None if a.score is None else a.score.score,
        "score_from_trusted": None if a.score is None else a.score.from_trusted,
        "standing": None if a.score is None else a.score.standing,
    }


def verify(  # noqa: PLR0917 - typer maps parameters to options
    rollout_hash: Annotated[str, typer.Argument(help="0x-prefixed 32-byte rollout hash.")],
    journal: Annotated[
        list[Path] | None,
        typer.Option(
            "--journal",
            help="Journal(s) to look the hash up in (repeatable; default: $SAPO_JOURNAL, else "
            "the journal the node of --config writes, <data_dir>/journal/journal.sqlite).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="node.toml whose journal, RPC and contract to use (default: ./node.toml if "
            "any, else defaults and SAPO_* environment).",
        ),
    ] = None,
    rpc: Annotated[
        str | None,
        typer.Option(
            "--rpc",
            envvar="SAPO_LEDGER_RPC",
            help="JSON-RPC URL of the chain (default: the config's ledger.rpc_url, else "
            "http://127.0.0.1:8545).",
        ),
    ] = None,
    ledger: Annotated[
        str | None,
        typer.Option(
            "--ledger",
            envvar="SAPO_LEDGER_ADDRESS",
            help="Address of the SapoLedger (default: the config's ledger.contract_address).",
        ),
    ] = None,
    as_json: _Json = False,
) -> None:
    """Find the commitment(s) naming ROLLOUT_HASH and check the inclusion proof on chain."""
    import anyio

    from sapo_async.errors import SapoError
    from sapo_async.ledger.audit import verify_rollout
    from sapo_async.ledger.journal import Journal
    from sapo_async.ops.config import load_config

    text = rollout_hash.removeprefix("0x")
    try:
        digest = bytes.fromhex(text)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise _fail(f"ROLLOUT_HASH must be 32 bytes of hex, got {rollout_hash!r}")
    if config is None and Path("node.toml").is_file():
        config = Path("node.toml")
    given = {"contract_address": ledger, "rpc_url": rpc}
    try:
        # The node writes its journal where its config says; read the same one. What the
        # command line gives wins over the file (and completes it).
        cfg = load_config(config, ledger={k: v for k, v in given.items() if v})
    except SapoError as exc:
        raise _fail(f"verify: {exc}") from exc
    ledger = ledger or cfg.ledger.contract_address
    rpc = rpc or cfg.ledger.rpc_url or "http://127.0.0.1:8545"
    if not ledger:
        raise _fail(
            "no ledger address: pass --ledger, set SAPO_LEDGER_ADDRESS or ledger.contract_address"
        )
    from_env = os.environ.get("SAPO_JOURNAL")
    paths = journal or [Path(from_env) if from_env else cfg.journal_path]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise _fail(f"journal not found: {', '.join(missing)} (pass --journal or --config)")
    try:
        with ExitStack() as stack:
            # JournalError names a damaged one; those opened before it close all the same.
            journals = [stack.enter_context(Journal(p)) for p in paths]
            results = anyio.run(verify_rollout, _ledger(rpc, ledger), journals, digest)
    except SapoError as exc:
        raise _fail(f"verify failed: {exc}") from exc
    if as_json:
        rows = [r.as_json() for r in results]
        typer.echo(json.dumps({"rollout_hash": "0x" + text, "found": rows}, indent=1))
    elif not results:
        typer.echo(f"0x{text}: not in any journal")
    for r in results if not as_json else []:
        verdict = "INCLUDED" if r.included else "NOT INCLUDED"
        typer.echo(
            f"0x{text}: {verdict} in round {r.round} of {r.node} ({r.kind}, producer "
            f"{r.producer}, proof of {len(r.proof)})"
        )
    if not results or not all(r.included for r in results):
        raise typer.Exit(1)


def deploy(
    rpc: Annotated[str, typer.Option("--rpc", help="JSON-RPC URL of the chain.")],
    key_env: Annotated[
        str, typer.Option("--key-env", help="Environment variable holding the deployer key.")
    ],
    swarm: Annotated[
        str, typer.Option("--swarm", help="Swarm name the ledger serves.")
    ] = "default",
    as_json: _Json = False,
) -> None:
    """Deploy a SapoLedger for a swarm and print its address."""
    import anyio
    from eth_account import Account

    from sapo_async.errors import SapoError
    from sapo_async.ledger.deploy import deploy_contract, swarm_id
    from sapo_async.ledger.rpc import rpc_chain

    key = os.environ.get(key_env, "")
    if not key:
        raise _fail(f"environment variable {key_env} is empty or unset")
    try:
        account = Account.from_key(key)
    except (ValueError, TypeError) as exc:
        raise _fail(f"{key_env} does not hold a valid private key") from exc
    try:
        chain = rpc_chain(rpc)
        deployment = anyio.run(deploy_contract, chain, account, "SapoLedger", swarm_id(swarm))
    except SapoError as exc:
        raise _fail(f"deploy failed: {exc}") from exc
    info = {
        "ledger": deployment.address,
        "block": deployment.block_number,
        "tx_hash": deployment.tx_hash,
        "gas_used": deployment.gas_used,
        "swarm": swarm,
        "rpc": rpc,
    }
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(
            f"SapoLedger for swarm {swarm!r} at {deployment.address} "
            f"(block {deployment.block_number})"
        )
        typer.echo(f"export SAPO_LEDGER_RPC={rpc} SAPO_LEDGER_ADDRESS={deployment.address}")


def register(app: typer.Typer) -> None:
    """Add ``audit``, ``verify`` and ``deploy`` to the ``sapo-async`` app."""
    app.command("audit")(audit)
    app.command("verify")(verify)
    app.command("deploy")(deploy)
