"""Gas per round commitment on anvil: SapoLedger (roots only) vs one storage slot per rollout.

Usage: python bench/ledger.py [--quick]   (or `just bench ledger [--quick]`)

For 8, 64 and 512 rollouts per round it measures, on a fresh anvil started from npm, the
median / min / max over several rounds of a fresh registered node of:
- SapoLedger.commit sent by the node itself, and commitBySig sent by a relayer;
- commit of a round that also credits 4 producers, n/4 rollouts each, of rounds those producers
  committed (the credit rules read the producer's round and store one counter per entry, so
  the cost scales with usage entries, never with rollouts);
- NaiveLedger.record, which stores every rollout hash in its own slot (the baseline);
- commitMany of 1, 8 and 32 rounds (8 rollouts each; plain, and crediting 4 producers), and
  a relayer's commitManyBySig of as many plain rounds of a gasless node,
  per round: what a node's backlog costs sent as one transaction (issue 24);
and writes bench/results/ledger.json. Gas is deterministic, so --quick only measures fewer
rounds per size. Calldata bytes are reported beside gas.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from eth_account import Account  # noqa: E402
from results_path import results_path  # noqa: E402 - bench/ is on sys.path

from sapo_async.ledger import RoundCommitment, deploy_ledger, rpc_chain  # noqa: E402
from sapo_async.ledger.anvil import ANVIL_DEV_KEY, AnvilProcess, find_anvil  # noqa: E402
from sapo_async.ledger.artifacts import load_artifact  # noqa: E402
from sapo_async.ledger.deploy import deploy_contract, fund  # noqa: E402
from sapo_async.ledger.evm import EvmLedger  # noqa: E402

SIZES = (8, 64, 512)


def hashes(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


async def measure(url: str, rounds: int) -> dict:
    chain = rpc_chain(url)
    deployer = Account.from_key(ANVIL_DEV_KEY)
    direct = await deploy_ledger(chain, deployer, "bench")
    relayed = EvmLedger(chain, direct.address, relayer=deployer)
    naive = await deploy_contract(chain, deployer, "NaiveLedger")
    naive_contract = chain.w3.eth.contract(address=naive.address, abi=_abi("NaiveLedger"))
    out: dict[str, dict] = {}
    for n in SIZES:
        # Fresh producers per size, each sharing n rollouts in every round the consumer credits.
        producers = [Account.create() for _ in range(4)]
        shared: dict[str, dict[int, list[bytes]]] = {}
        for p in producers:
            await fund(chain, p.address)
            await direct.register(p)
            for r in range(1, rounds + 1):
                own = hashes(n)
                shared.setdefault(p.address, {})[r] = own
                await direct.submit(p, RoundCommitment(p.address, r, r, own).payload())
        row: dict[str, object] = {}
        for kind, ledger, credit in (
            ("sapo_commit", direct, False),
            ("sapo_commit_by_sig_relayed", relayed, False),
            ("sapo_commit_crediting_4_producers", direct, True),
        ):
            node = Account.create()  # a fresh node per series: same storage history each time
            await fund(chain, node.address)
            await ledger.register(node)
            gas = []
            for r in range(1, rounds + 1):
                external = (
                    {p: {r: by_round[r][: max(1, n // 4)]} for p, by_round in shared.items()}
                    if credit
                    else {}
                )
                c = RoundCommitment(node.address, r, r, hashes(n), external)
                gas.append((await ledger.submit(node, c.payload())).gas_used)
            row[kind] = _summary(gas)
        # The same usage, of producer rounds not on chain yet: kept as claims, then settled
        # (settleCredit, one transaction per claim) once the producers commit those rounds.
        node = Account.create()
        await fund(chain, node.address)
        await direct.register(node)
        later = rounds + 1000  # producer rounds committed only after the consumer's
        claim_gas, settle_gas = [], []
        for r in range(1, rounds + 1):
            external = {p: {later + r: hashes(max(1, n // 4))} for p in shared}
            c = RoundCommitment(node.address, r, r, hashes(n), external)
            claim_gas.append((await direct.submit(node, c.payload())).gas_used)
        for p in producers:
            for r in range(1, rounds + 1):
                own = hashes(n)
                await direct.submit(p, RoundCommitment(p.address, later + r, r, own).payload())
        for r in range(1, rounds + 1):
            for p in producers:
                receipt = await direct.settle_credit(node, node.address, r, p.address, later + r)
                settle_gas.append(receipt.gas_used)
        row["sapo_commit_claiming_4_producers"] = _summary(claim_gas)
        row["settle_credit_one_claim"] = _summary(settle_gas)
        node = Account.create()
        await fund(chain, node.address)
        naive_gas = []
        for r in range(1, rounds + 1):

            def record(round_: int, count: int, sender: object) -> int:
                call = naive_contract.functions.record(round_, hashes(count))
                return chain.send_sync(sender, call).gas_used  # type: ignore[arg-type]

            naive_gas.append(await chain.run(record, r, n, node))
        row["naive_one_slot_per_rollout"] = _summary(naive_gas)
        sapo = row["sapo_commit"]["median"]  # type: ignore[index]
        naive_median = row["naive_one_slot_per_rollout"]["median"]  # type: ignore[index]
        row["naive_over_sapo"] = round(naive_median / sapo, 2)
        row["sapo_calldata_bytes"] = len(
            direct._contract.encode_abi(
                "commit", [RoundCommitment(node.address, 1, 1, hashes(n)).payload().as_abi()]
            )
        )
        row["naive_calldata_bytes"] = 4 + 32 * 3 + 32 * n
        out[str(n)] = row
        print(f"{n:4d} rollouts: SapoLedger {sapo:>9,} gas   naive {naive_median:>11,} gas")
    batches = {**await measure_batches(direct), **await measure_relayed_batches(relayed)}
    return out, {**batches, **await measure_settles(direct)}


BATCHES = (1, 8, 32)


async def measure_batches(ledger: EvmLedger) -> dict[str, dict[str, int]]:
    """Gas per round of ``k`` rounds sent as ``k`` separate ``commit`` transactions and as one
    ``commitMany`` (8 rollouts a round): plain, and crediting 4 producers 2 rollouts each of
    producer rounds on chain (a fresh one per round, as the crediting series above). Each
    node first commits 4 rounds alone (crediting each producer once), so neither series pays
    a first write of the node's totals or a producer's credit."""
    chain = ledger.chain
    producers = [Account.create() for _ in range(4)]
    first, needed = 5000, 4 + 2 * sum(BATCHES)
    for p in producers:
        await fund(chain, p.address)
        await ledger.register(p)
        for start in range(first, first + needed, 32):
            own = [RoundCommitment(p.address, r, r, hashes(8)) for r in range(start, start + 32)]
            await ledger.submit_batch(p, [c.payload() for c in own])
    out: dict[str, dict[str, int]] = {}
    for credit in (False, True):
        kind = "crediting_4_producers" if credit else "plain"
        node = Account.create()
        await fund(chain, node.address)
        await ledger.register(node)
        made = iter(
            RoundCommitment(
                node.address,
                r,
                r,
                hashes(8),
                {p.address: {first + r: hashes(2)} for p in producers} if credit else {},
            ).payload()
            for r in range(needed)
        )
        for _ in range(4):  # warm-up
            await ledger.submit(node, next(made))
        for k in BATCHES:
            separate = [(await ledger.submit(node, next(made))).gas_used for _ in range(k)]
            receipts = await ledger.submit_batch(node, [next(made) for _ in range(k)])
            row = {
                "separate_gas_per_round": sum(separate) // k,
                "batch_gas_per_round": receipts[0].gas_used,  # the transaction's, shared evenly
            }
            out[f"{kind}_{k}"] = row
            print(f"{kind}, {k:2d} rounds: {row}")
    return out


async def measure_relayed_batches(relayed: EvmLedger) -> dict[str, dict[str, int]]:
    """Gas per round of ``k`` plain rounds of a gasless node relayed as ``k`` ``commitBySig``
    transactions and as one ``commitManyBySig`` (one signature per round), after 4 alone."""
    node = Account.create()  # holds no ether: the relayer pays
    await relayed.register(node)
    made = iter(RoundCommitment(node.address, r, r, hashes(8)).payload() for r in range(100))
    for _ in range(4):  # warm-up
        await relayed.submit(node, next(made))
    out: dict[str, dict[str, int]] = {}
    for k in BATCHES:
        separate = [(await relayed.submit(node, next(made))).gas_used for _ in range(k)]
        receipts = await relayed.submit_batch(node, [next(made) for _ in range(k)])
        row = {
            "separate_gas_per_round": sum(separate) // k,
            "batch_gas_per_round": receipts[0].gas_used,
        }
        out[f"relayed_plain_{k}"] = row
        print(f"relayed, {k:2d} rounds: {row}")
    return out


async def measure_settles(ledger: EvmLedger, k: int = 8) -> dict[str, dict[str, int]]:
    """Gas per claim of ``k`` claims settled as ``k`` ``settleCredit`` transactions and as one
    ``settleCredits``: a node's rounds each claim 2 rollouts of a producer round committed
    only afterwards (one per round, so every claim credits a fresh counter)."""
    chain = ledger.chain
    node, producer = Account.create(), Account.create()
    for account in (node, producer):
        await fund(chain, account.address)
        await ledger.register(account)
    later = 9000
    rounds = [
        RoundCommitment(node.address, r, r, hashes(8), {producer.address: {later + r: hashes(2)}})
        for r in range(2 * k)
    ]
    await ledger.submit_batch(node, [c.payload() for c in rounds])
    own = [RoundCommitment(producer.address, later + r, r, hashes(8)) for r in range(2 * k)]
    await ledger.submit_batch(producer, [c.payload() for c in own])
    claims = [(node.address, r, producer.address, later + r) for r in range(2 * k)]
    separate = [(await ledger.settle_credit(node, *c)).gas_used for c in claims[:k]]
    batched = await ledger.settle_credits(node, claims[k:])
    row = {"separate_gas_per_claim": sum(separate) // k, "batch_gas_per_claim": batched[0].gas_used}
    print(f"settling {k} claims: {row}")
    return {f"settle_{k}_claims": row}


def _summary(gas: list[int]) -> dict[str, int]:
    # Rounds are packed four to a slot in the node's round list, so gas varies a little
    # with the position in that slot (a fresh slot costs a zero-to-nonzero SSTORE).
    return {"median": int(statistics.median(gas)), "min": min(gas), "max": max(gas)}


def _abi(name: str) -> list:
    return load_artifact(name).abi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds per series instead of 8")
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    args = parser.parse_args()
    rounds = 2 if args.quick else 8
    anvil_bin = find_anvil(ROOT)
    with tempfile.TemporaryDirectory() as tmp, AnvilProcess(Path(tmp), binary=anvil_bin) as anvil:
        gas, batches = anyio.run(measure, anvil.url, rounds)
    result = {
        "benchmark": "ledger",
        "what": "gas per round commitment on anvil; SapoLedger stores roots and counts only, "
        "NaiveLedger stores one slot per rollout hash; the crediting series credits 4 producers "
        "n/4 rollouts each of rounds they committed (credit rules of issue 12); the claiming "
        "series credits the same of rounds not yet committed (kept as claims, issue 24) and "
        "settle_credit_one_claim is one later settleCredit transaction",
        "chain": "anvil (npm @foundry-rs/anvil 1.7.1); solc 0.8.30 (solcjs), optimizer 200 runs, "
        "evm cancun",
        "conditions": "gas is deterministic (it does not depend on load); measured on anvil on "
        "a shared 2-core machine with other jobs running",
        "quick": args.quick,
        "rounds_per_size": rounds,
        "python": platform.python_version(),
        "gas_by_rollouts_per_round": gas,
        "commit_many_by_batch_size": batches,
    }
    out = args.out or results_path("ledger", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
