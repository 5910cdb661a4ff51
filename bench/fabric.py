"""Fabric benchmark: 8 producers and 8 consumers exchange 2 KB groups through the whole path.

Whole path: encode, sign (EIP-191, secp256k1), publish and await the JetStream ack, pull
fetch, decode, verify (hash, signature recovery, every collector check), buffer. Baseline:
raw nats-py JetStream publish + pull fetch of the same envelope bytes, same server, same
run. Every consumer reads every group (including its own, ``include_own``), so both runs
move exactly the same messages; ``ratio_to_raw`` = path rate / raw rate.

Also times each CPU stage alone (per group, one core), to say where the time goes.

Usage: ``just bench fabric [--quick]``; writes bench/results/fabric.json.
"""

# ruff: noqa: E402 - logging is configured before the library modules are imported
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import anyio
from eth_account import Account

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Configure logging before the library's modules create their loggers.
from sapo_async.logs import configure_logging

configure_logging(level="WARNING")

from results_path import results_path  # bench/ is on sys.path

from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import StartAt
from sapo_async.fabric.transport.embedded import EmbeddedNats, NatsOptions, connect_nats
from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings
from sapo_async.wire import signing
from sapo_async.wire.rollout import (
    SCHEMA_VERSION,
    Completion,
    RolloutGroup,
    SamplingParams,
    TaskRef,
    decode_group,
    encode_group,
    keccak256,
)
from sapo_async.wire.signing import (
    decode_signed,
    encode_signed,
    recover_signer,
    reference_recover,
    rollout_hash,
    sign_body,
    sign_group,
)

NODES = 8
FAMILY = "basic_arithmetic"


def make_groups(account, count: int, target_bytes: int = 2048) -> list[RolloutGroup]:  # type: ignore[no-untyped-def]
    groups = []
    now_ms = int(time.time() * 1000)
    for i in range(count):
        completions = tuple(
            Completion(
                text=f"Step {j}: 17 + 25 = 42. " * 16 + f"The answer is 42 ({i}.{j}).",
                finish_reason="stop",
            )
            for j in range(4)
        )
        group = RolloutGroup(
            schema_version=SCHEMA_VERSION,
            swarm="bench",
            producer=account.address,
            producer_round=0,
            policy_version=0,
            model_id="bench",
            tokenizer_id="0x" + "0" * 64,
            task=TaskRef(family=FAMILY, config_digest="0x" + "ab" * 32, seed=1, index=i),
            task_config="{}",
            question=f"What is 17 + 25? (item {i})",
            answer="42",
            completions=completions,
            sampling=SamplingParams(),
            created_at_ms=now_ms,
        )
        pad = target_bytes - len(encode_group(group))
        if pad > 0:
            group = msgspec_replace(group, question=group.question + " " * pad)
        groups.append(group)
    return groups


def msgspec_replace(group: RolloutGroup, **changes: object) -> RolloutGroup:
    import msgspec

    return msgspec.structs.replace(group, **changes)


async def run_path(url: str, accounts, groups, swarm: str) -> float:  # type: ignore[no-untyped-def]
    """Whole path; returns seconds from first publish to the last consumer's last group."""
    groups = {a.address: [msgspec_replace(g, swarm=swarm) for g in gs] for a, gs in groups.items()}
    total = sum(len(g) for g in groups.values())
    options = NatsOptions(url=url)
    settings = StreamSettings()
    pubs = [await JetStreamTransport.connect(options, swarm, settings=settings) for _ in accounts]
    subs = [await JetStreamTransport.connect(options, swarm, settings=settings) for _ in accounts]
    try:
        async with anyio.create_task_group() as tg:
            collectors = []
            for account, transport in zip(accounts, subs, strict=True):
                collector = Collector(
                    transport,
                    own_address=account.address,
                    include_own=True,
                    start=StartAt.new(),
                    buffer_max_groups=total + 1,
                    max_round_lag=1 << 30,
                    fetch_batch=256,
                    fetch_max_wait=0.5,
                )
                await tg.start(collector.run)
                collectors.append(collector)
            start = time.perf_counter()

            async def produce(account, transport) -> None:  # type: ignore[no-untyped-def]
                publisher = Publisher(transport, account)
                for group in groups[account.address]:
                    await publisher.publish(group)

            async with anyio.create_task_group() as producers:
                for account, transport in zip(accounts, pubs, strict=True):
                    producers.start_soon(produce, account, transport)
            for collector in collectors:
                await collector.wait_accepted(total, timeout=600)
            elapsed = time.perf_counter() - start
            for collector in collectors:
                stats = collector.statistics()
                assert stats.accepted == total, stats
                assert not stats.rejected, stats
                await collector.stop()
    finally:
        for transport in pubs + subs:
            await transport.aclose()
    return elapsed


async def run_raw(url: str, payloads: list[list[bytes]], swarm: str) -> float:
    """Raw nats-py: publish (await ack) and pull-fetch the same bytes, no encode/sign/verify."""
    from nats.js import api

    total = sum(len(p) for p in payloads)
    options = NatsOptions(url=url)
    setup = await JetStreamTransport.connect(options, swarm)  # same stream settings
    await setup.aclose()
    stream = f"SAPO_{swarm}"
    subject = f"sapo.{swarm}.rollouts.{FAMILY}"
    pubs = [await connect_nats(options) for _ in payloads]
    subs = [await connect_nats(options) for _ in payloads]
    try:
        pulls = []
        for i, nc in enumerate(subs):
            js = nc.jetstream()
            config = api.ConsumerConfig(
                name=f"raw-{i}",
                deliver_policy=api.DeliverPolicy.NEW,
                ack_policy=api.AckPolicy.EXPLICIT,
            )
            pulls.append(await js.pull_subscribe(subject, stream=stream, config=config))
        start = time.perf_counter()

        async def produce(nc, data: list[bytes]) -> None:  # type: ignore[no-untyped-def]
            js = nc.jetstream()
            for payload in data:
                await js.publish(
                    subject,
                    payload,
                    stream=stream,
                    headers={"Nats-Msg-Id": keccak256(payload).hex()},
                )

        async def consume(pull) -> None:  # type: ignore[no-untyped-def]
            got = 0
            while got < total:
                try:
                    msgs = await pull.fetch(256, timeout=0.5)
                except TimeoutError:
                    continue
                for msg in msgs:
                    _ = msg.data
                    await msg.ack()
                got += len(msgs)

        async with anyio.create_task_group() as tg:
            for pull in pulls:
                tg.start_soon(consume, pull)
            for nc, data in zip(pubs, payloads, strict=True):
                tg.start_soon(produce, nc, data)
        elapsed = time.perf_counter() - start
    finally:
        for nc in pubs + subs:
            await nc.close()
    return elapsed


def stage_costs(account, groups: list[RolloutGroup]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Microseconds per group for each CPU stage, each timed alone."""
    n = len(groups)

    def per(fn) -> float:  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t) / n * 1e6, out

    t_encode, bodies = per(lambda: [encode_group(g) for g in groups])
    t_hash, hashes = per(lambda: [rollout_hash(b) for b in bodies])
    t_sign, signed = per(lambda: [sign_body(account, b) for b in bodies])
    t_envelope, wires = per(lambda: [encode_signed(s) for s in signed])
    t_decode, _ = per(lambda: [decode_group(decode_signed(w).body) for w in wires])
    t_recover, _ = per(
        lambda: [recover_signer(h, s.signature) for h, s in zip(hashes, signed, strict=True)]
    )
    t_ref, _ = per(
        lambda: [reference_recover(h, s.signature) for h, s in zip(hashes, signed, strict=True)]
    )
    return {
        "encode": t_encode,
        "keccak": t_hash,
        "sign": t_sign,
        "envelope": t_envelope,
        "decode": t_decode,
        "recover_signer": t_recover,
        "eth_account_recover_message": t_ref,
    }


def ecc_backend() -> str:
    from eth_keys.backends import get_backend

    return type(get_backend()).__name__


class process_caches_off:  # noqa: N801 - reads as a phrase at the call site
    """Decode, hash and recover every message per consumer, as if each ran in its own
    process (turns off the per-process memoisation in sapo_async.wire.signing)."""

    def __enter__(self) -> None:
        self._saved = (signing._recover_cached, signing._decode_envelope_cached)
        signing._recover_cached = self._saved[0].__wrapped__  # type: ignore[assignment]
        signing._decode_envelope_cached = signing._decode_envelope  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        signing._recover_cached, signing._decode_envelope_cached = self._saved


async def main(quick: bool) -> dict[str, object]:
    per_producer = 40 if quick else 200
    reps = 3
    accounts = [Account.from_key(keccak256(f"bench-{i}".encode())) for i in range(NODES)]
    groups = {a: make_groups(a, per_producer) for a in accounts}
    sample = groups[accounts[0]][0]
    group_bytes = len(encode_group(sample))
    stages = stage_costs(accounts[0], groups[accounts[0]])
    raw_runs, path_runs, uncached_runs = [], [], []
    async with EmbeddedNats() as server:
        for rep in range(reps):
            # Raw payloads: the exact envelope bytes the path would send.
            raw_payloads = [
                [encode_signed(sign_group(a, msgspec_replace(g, swarm=f"raw{rep}"))) for g in gs]
                for a, gs in groups.items()
            ]
            raw_runs.append(await run_raw(server.url, raw_payloads, f"raw{rep}"))
            path_runs.append(await run_path(server.url, accounts, groups, f"path{rep}"))
            with process_caches_off():
                uncached_runs.append(await run_path(server.url, accounts, groups, f"nocache{rep}"))
    deliveries = NODES * NODES * per_producer
    raw_s, path_s, uncached_s = (statistics.median(r) for r in (raw_runs, path_runs, uncached_runs))
    path_rate, raw_rate, uncached_rate = (deliveries / t for t in (path_s, raw_s, uncached_s))
    return {
        "benchmark": "fabric",
        "quick": quick,
        "producers": NODES,
        "consumers": NODES,
        "groups_per_producer": per_producer,
        "group_bytes": group_bytes,
        "envelope_bytes": len(raw_payloads[0][0]),
        "deliveries_per_run": deliveries,
        "repetitions": reps,
        "path_seconds_median": round(path_s, 3),
        "raw_seconds_median": round(raw_s, 3),
        "verified_groups_per_s": round(path_rate, 1),
        "raw_groups_per_s": round(raw_rate, 1),
        "ratio_to_raw": round(path_rate / raw_rate, 3),
        "verified_groups_per_s_no_process_caches": round(uncached_rate, 1),
        "ratio_to_raw_no_process_caches": round(uncached_rate / raw_rate, 3),
        "goal_ratio": 0.5,
        "runs_seconds": {
            "raw": [round(t, 3) for t in raw_runs],
            "path": [round(t, 3) for t in path_runs],
            "path_no_process_caches": [round(t, 3) for t in uncached_runs],
        },
        "stage_us_per_group": {k: round(v, 1) for k, v in stages.items()},
        "ecc_backend": ecc_backend(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def print_table(result: dict[str, object]) -> None:
    r = result
    rows = [
        (
            "workload",
            f"{NODES} producers x {NODES} consumers, {r['groups_per_producer']} groups each, "
            f"{r['group_bytes']} B/group, median of {r['repetitions']}",
        ),
        ("whole path", f"{r['verified_groups_per_s']} verified groups/s"),
        ("  same, no process caches", f"{r['verified_groups_per_s_no_process_caches']} groups/s"),
        ("raw nats-py", f"{r['raw_groups_per_s']} groups/s"),
        ("ratio_to_raw", f"{r['ratio_to_raw']} (goal >= {r['goal_ratio']})"),
        ("  no process caches", str(r["ratio_to_raw_no_process_caches"])),
        ("ecc backend", str(r["ecc_backend"])),
    ]
    stages = r["stage_us_per_group"]
    assert isinstance(stages, dict)
    rows += [(f"  {k} (us/group)", str(v)) for k, v in stages.items()]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (< 1 minute)")
    args = parser.parse_args()
    result = anyio.run(main, args.quick)
    out = results_path("fabric", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {out}")
