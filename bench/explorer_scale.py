"""Explorer at swarm scale: RPC calls and latency of the swarm and node pages, views vs index.

Usage: ``python bench/explorer_scale.py [--nodes 1000] [--quick]``. On anvil, N simulated
nodes register and commit one round each (node i crediting node i-1's round, so the usage
graph and scores are real), relayed by one funded account. Then the explorer's swarm
snapshot (``Explorer._read_swarm``: what ``/api/swarm`` serves, refreshed once a second
while pages are open) is taken three times each way:

* ``views``: the audit's views, three calls per node (``nodeInfo``, ``metadataOf``, the
  last ``commitmentOf``) plus a ``UsageCredited`` scan from the deployment block;
* ``index``: :class:`sapo_async.ledger.index.LedgerIndex`, the first refresh scanning
  from the deployment block, the later ones only the blocks mined since.

Then the node page (``Explorer.node``: what ``/api/node/{address}`` serves) for three nodes
(the first, the middle and the last registered) each way: with the views it reads the
node's totals, two ``UsageCredited`` scans, the scores' rounds of every node and its
commitments; with the index (``refresh_s=0``: every page refreshes it first, the worst
case) only the blocks mined since.

RPC calls are counted at the web3 provider. Writes ``bench/results/explorer_scale.json``
(``--quick``: under ``bench/results/quick/``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from eth_account import Account  # noqa: E402
from results_path import results_path  # noqa: E402 - bench/ is on sys.path

from sapo_async import limits  # noqa: E402
from sapo_async.explorer.source import Explorer  # noqa: E402
from sapo_async.ledger import RoundCommitment, deploy_ledger, rpc_chain  # noqa: E402
from sapo_async.ledger.anvil import ANVIL_DEV_KEY, AnvilProcess, find_anvil  # noqa: E402
from sapo_async.ledger.evm import EvmLedger  # noqa: E402
from sapo_async.ledger.index import LedgerIndex  # noqa: E402


class Counting:
    """Counts the JSON-RPC requests a web3 provider makes."""

    def __init__(self, ledger: EvmLedger) -> None:
        provider: Any = ledger.chain.w3.provider
        self.calls = 0
        real = provider.make_request

        def counted(method: Any, params: Any) -> Any:
            self.calls += 1
            return real(method, params)

        provider.make_request = counted


async def populate(ledger: EvmLedger, n: int) -> list[str]:
    previous: tuple[str, list[bytes]] | None = None
    addresses = []
    for i in range(n):
        node = Account.create()
        await ledger.register(node, f"sim-{i}")
        own = [i.to_bytes(32, "big")]
        external = {previous[0]: {1: previous[1]}} if previous else {}
        await ledger.submit(node, RoundCommitment(node.address, 1, 1, own, external).payload())
        previous = (node.address, own)
        addresses.append(node.address)
        if (i + 1) % 100 == 0:
            print(f"{i + 1} nodes committed", flush=True)
    return addresses


async def snapshots(explorer: Explorer, counter: Counting, times: int) -> list[dict[str, float]]:
    out = []
    for _ in range(times):
        before, t0 = counter.calls, time.perf_counter()
        view = await explorer._read_swarm()
        out.append(
            {
                "latency_s": round(time.perf_counter() - t0, 3),
                "rpc_calls": counter.calls - before,
                "nodes": len(view["nodes"]),
            }
        )
    return out


async def node_pages(
    explorer: Explorer, counter: Counting, nodes: list[str]
) -> list[dict[str, float]]:
    out = []
    for node in nodes:
        before, t0 = counter.calls, time.perf_counter()
        page = await explorer.node(node)
        out.append(
            {
                "latency_s": round(time.perf_counter() - t0, 3),
                "rpc_calls": counter.calls - before,
                "timeline": len(page["timeline"]),
            }
        )
    return out


async def measure(url: str, n: int) -> dict[str, Any]:
    dev = Account.from_key(ANVIL_DEV_KEY)
    ledger = await deploy_ledger(rpc_chain(url), dev, "explorer-scale", relayer=dev)
    t0 = time.perf_counter()
    addresses = await populate(ledger, n)
    sample = [addresses[0], addresses[n // 2], addresses[-1]]
    populate_s = time.perf_counter() - t0
    views_ledger = EvmLedger(rpc_chain(url), ledger.address, from_block=ledger.from_block)
    views_counter = Counting(views_ledger)
    views_explorer = Explorer(views_ledger, chain=url)
    views = await snapshots(views_explorer, views_counter, 3)
    views_pages = await node_pages(views_explorer, views_counter, sample)
    index_ledger = EvmLedger(rpc_chain(url), ledger.address, from_block=ledger.from_block)
    index_counter = Counting(index_ledger)
    # refresh_s=0: each read below refreshes the index, as one read per refresh would.
    explorer = Explorer(index_ledger, chain=url, index=LedgerIndex(index_ledger), refresh_s=0.0)
    first = await snapshots(explorer, index_counter, 1)
    # A round of the swarm lands between refreshes: one more commitment and its block.
    late = Account.create()
    await ledger.register(late, "late")
    await ledger.submit(late, RoundCommitment(late.address, 1, 1, [b"\x01" * 32]).payload())
    steady = await snapshots(explorer, index_counter, 3)
    index_pages = await node_pages(explorer, index_counter, sample)

    def summary(rows: list[dict[str, float]]) -> dict[str, float]:
        return {
            "latency_s_median": statistics.median(r["latency_s"] for r in rows),
            "rpc_calls_median": statistics.median(r["rpc_calls"] for r in rows),
            "rpc_calls_per_s_at_refresh": statistics.median(r["rpc_calls"] for r in rows)
            / limits.EXPLORER_REFRESH_S,
        }

    def pages(rows: list[dict[str, float]]) -> dict[str, float]:
        calls = statistics.median(r["rpc_calls"] for r in rows)
        return {
            "latency_s_median": statistics.median(r["latency_s"] for r in rows),
            "rpc_calls_median": calls,
            "rpc_calls_per_s_at_one_page_per_s": calls,
        }

    return {
        "nodes": n,
        "populate_s": round(populate_s, 1),
        "views": {"refreshes": views, **summary(views)},
        "index_first_refresh": first[0],
        "index_steady": {"refreshes": steady, **summary(steady)},
        "node_page_views": {"pages": views_pages, **pages(views_pages)},
        "node_page_index": {"pages": index_pages, **pages(index_pages)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="100 nodes")
    args = parser.parse_args()
    n = 100 if args.quick else args.nodes
    with (
        tempfile.TemporaryDirectory() as tmp,
        AnvilProcess(Path(tmp), binary=find_anvil(ROOT), keep_state=False) as anvil,
    ):
        result = anyio.run(measure, anvil.url, n)
    result |= {
        "benchmark": "explorer_scale",
        "command": " ".join(["python bench/explorer_scale.py", *sys.argv[1:]]),
        "chain": "anvil (npm), automine; one relayer sends every registration and commitment",
        "refresh_interval_s": limits.EXPLORER_REFRESH_S,
        "python": platform.python_version(),
        "conditions": "a shared 2-core machine with other jobs running; ratios, not times",
    }
    out = results_path("explorer_scale", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for key in ("views", "index_steady", "node_page_views", "node_page_index"):
        print(key, {k: v for k, v in result[key].items() if k not in {"refreshes", "pages"}})
    print("index_first_refresh", result["index_first_refresh"])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
