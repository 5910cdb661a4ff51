"""Scale benchmark: N simulated nodes on a real three-server JetStream cluster, sharded.

Usage: ``just bench scale [--quick] [--sizes 8,100,1000] [--rounds 3]``. Writes
``bench/results/scale.json`` (``--quick``: ``bench/results/quick/scale.json``).

A simulated node is what a node is on the wire, without a model: a key, a publisher that
signs and publishes ``g`` real rollout groups per round on its leaves, and a real
:class:`~sapo_async.fabric.collector.Collector` reading ``k`` of ``S`` shards as
``ShardPlan.for_swarm(N, g, external=J)`` says, verifying every group it receives. Many
nodes share one process and a few connections (the servers cannot tell); the process-wide
decode and signer caches are off, so each node pays for what it reads as if it ran alone.

Per N it reports: per-node ingress (groups and bytes per round, mean and max), the same
for full fan-out (what reading everything would be), server egress per round (sum of the
three servers' ``/varz`` ``out_bytes``, routes included), publish-to-admit latency (p50,
p99) and the CPU a node spends verifying per round (thread time inside ``ingest``).
"""

# ruff: noqa: E402 - logging is configured before the library modules are imported
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures (the cluster)

from sapo_async.logs import configure_logging

configure_logging(level="WARNING")

from fabric import make_groups, msgspec_replace, process_caches_off  # bench/ is on sys.path
from results_path import results_path

from sapo_async.errors import ActorFailed, PublishError
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.base import StartAt
from sapo_async.fabric.transport.embedded import NatsOptions
from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings
from sapo_async.fabric.transport.shards import ShardPlan, producer_leaf
from sapo_async.process import free_port
from sapo_async.wire.rollout import TaskRef
from sapo_async.wire.signing import encode_signed, sign_group
from tests.fixtures.fabric import make_account
from tests.fixtures.volunteer import NatsCluster

GROUPS_PER_NODE = 4  # g: groups a node publishes per round
EXTERNAL = 4  # J: external groups a node trains on per round
FACTOR = 4  # c: ingress aimed at c x J groups per round
FAMILIES = ("basic_arithmetic", "bf")
CONNECTIONS = 24  # client connections the simulated nodes share, spread over the servers


class MeteredCollector(Collector):
    """A collector that also counts bytes, verify CPU and publish-to-admit latency."""

    def __init__(self, *args, published: dict[bytes, float], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.bytes_in = 0
        self.cpu_s = 0.0
        self.latencies: list[float] = []
        self._published = published

    def ingest(self, data: bytes, *, msg_id=None, subject=None):  # type: ignore[no-untyped-def, override]
        t = time.thread_time()
        admitted = super().ingest(data, msg_id=msg_id, subject=subject)
        self.cpu_s += time.thread_time() - t
        self.bytes_in += len(data)
        if admitted is not None:
            sent = self._published.get(admitted.rollout_hash)
            if sent is not None:
                self.latencies.append(time.perf_counter() - sent)
        return admitted


def _varz_out_bytes(ports: list[int]) -> int:
    total = 0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as r:
            total += int(json.load(r)["out_bytes"])
    return total


async def wait_cluster_healthy(ports: list[int]) -> None:
    """Wait until every server's /healthz says ok (JetStream meta leader elected)."""

    def healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    with anyio.fail_after(60):
        while not all(healthy(p) for p in ports):  # noqa: ASYNC110 - polls over HTTP
            await anyio.sleep(0.2)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_size(cluster: NatsCluster, n: int, rounds: int, replicas: int) -> dict:  # type: ignore[type-arg]
    swarm = f"scale{n}"
    # No rotation inside the few rounds measured (each round's expected deliveries are
    # computed from the shard sets); rotation is tested in the conformance suite.
    plan = ShardPlan.for_swarm(n, GROUPS_PER_NODE, external=EXTERNAL, factor=FACTOR, rotate_s=1e9)
    accounts = [make_account(10_000 + i) for i in range(n)]
    template = make_groups(accounts[0], 1)[0]
    # A few rounds of ~2 KB groups need little room; each size's stream is deleted after
    # its run, so the three fit the cluster's 1 GB stores (R3: a full copy on each).
    settings = StreamSettings(replicas=replicas, max_bytes=128 * 2**20)
    published: dict[bytes, float] = {}
    urls = cluster.auth_urls
    async with AsyncExitStack() as stack:
        conns = []
        for c in range(min(CONNECTIONS, n)):
            t = await JetStreamTransport.connect(
                NatsOptions(url=urls[c % 3], name=f"scale-{c}"), swarm, settings=settings
            )
            stack.push_async_callback(t.aclose)
            conns.append(t)
        tg = await stack.enter_async_context(anyio.create_task_group())
        collectors: list[MeteredCollector] = []
        setup_t = time.perf_counter()
        limiter = anyio.CapacityLimiter(4)  # consumers made 4 at a time (server-bound)
        create_retries: list[int] = []

        async def start_one(i: int, account) -> None:  # type: ignore[no-untyped-def]
            for attempt in range(8):
                try:
                    await start_collector(i, account)
                except ActorFailed:
                    # The servers took longer than the JetStream API timeout to place the
                    # consumer (R3, under load): try again, as a restarted node would.
                    create_retries.append(attempt)
                    await anyio.sleep(1.0)
                else:
                    return
            raise RuntimeError(f"sim-{i}: no consumer after 8 attempts")

        async def start_collector(i: int, account) -> None:  # type: ignore[no-untyped-def]
            collector = MeteredCollector(
                conns[i % len(conns)],
                own_address=account.address,
                include_own=False,
                start=StartAt.new(),
                shards=None if plan.count == 1 else plan,
                max_round_lag=1 << 30,
                fetch_batch=256,
                fetch_max_wait=0.5,
                name=f"sim-{i}",
                published=published,
            )
            async with limiter:
                await tg.start(collector.run)
            collectors.append(collector)

        async with anyio.create_task_group() as starting:
            for i, account in enumerate(accounts):
                starting.start_soon(start_one, i, account)
        collectors.sort(key=lambda c: int(c.name.split("-")[1]))
        setup_s = time.perf_counter() - setup_t
        sets = {
            c.own_address: (c._sub.shards if plan.count > 1 else None)  # type: ignore[union-attr]
            for c in collectors
        }

        rows = []
        retries: list[int] = []
        limiter = anyio.CapacityLimiter(64)
        for rnd in range(rounds):
            # Sign this round's groups before the clock starts: signing is the producer's
            # cost, not the fabric's.
            batch = []
            for i, account in enumerate(accounts):
                for j in range(GROUPS_PER_NODE):
                    family = FAMILIES[j % len(FAMILIES)]
                    group = msgspec_replace(
                        template,
                        swarm=swarm,
                        producer=account.address,
                        producer_round=rnd,
                        task=TaskRef(family=family, config_digest="ab" * 32, seed=rnd, index=j),
                        created_at_ms=int(time.time() * 1000),
                    )
                    batch.append((conns[i % len(conns)], family, sign_group(account, group)))
            before_recv = [c.statistics().received for c in collectors]
            expected = dict(zip((c.own_address for c in collectors), before_recv, strict=True))
            for _, family, signed in batch:
                producer = msgspec_decode_producer(signed)
                leaf = producer_leaf(family, producer)
                for c in collectors:
                    chosen = sets[c.own_address]
                    if chosen is None or chosen.holds(leaf):
                        expected[c.own_address] += 1
            before_bytes = [c.bytes_in for c in collectors]
            before_cpu = [c.cpu_s for c in collectors]
            out0 = _varz_out_bytes(cluster.http_ports or [])
            t0 = time.perf_counter()

            async def publish(transport, family, signed) -> None:  # type: ignore[no-untyped-def]
                async with limiter:
                    from sapo_async.wire.signing import rollout_hash

                    published[rollout_hash(signed.body)] = time.perf_counter()
                    for attempt in range(5):  # as Publisher does: the message id dedups
                        try:
                            await transport.publish(signed, family=family)
                            break
                        except PublishError:
                            retries.append(attempt)
                            await anyio.sleep(0.2 * 2**attempt)
                    else:
                        raise RuntimeError("publish failed 5 times")

            async with anyio.create_task_group() as pubs:
                for transport, family, signed in batch:
                    pubs.start_soon(publish, transport, family, signed)
            publish_s = time.perf_counter() - t0
            with anyio.fail_after(600):
                for c in collectors:
                    while c.statistics().received < expected[c.own_address]:  # noqa: ASYNC110
                        await anyio.sleep(0.05)  # a counter the collector has no event for
            round_s = time.perf_counter() - t0
            await anyio.sleep(0.5)  # let acks and route traffic settle before reading /varz
            out_bytes = _varz_out_bytes(cluster.http_ports or []) - out0
            groups_in = [
                c.statistics().received - b for c, b in zip(collectors, before_recv, strict=True)
            ]
            rows.append(
                {
                    "groups": groups_in,
                    "bytes": [
                        c.bytes_in - b for c, b in zip(collectors, before_bytes, strict=True)
                    ],
                    "cpu_s": [c.cpu_s - b for c, b in zip(collectors, before_cpu, strict=True)],
                    "server_out_bytes": out_bytes,
                    "publish_s": publish_s,
                    "round_s": round_s,
                }
            )
        rejected: Counter[str] = Counter()
        for c in collectors:
            rejected.update(c.statistics().rejected)
        # Stopped together: one by one, 1,000 collectors delete their consumers one by
        # one (~1 s each on this cluster); a deletion that times out is left to the
        # stream's deletion below.
        async with anyio.create_task_group() as stopping:
            for c in collectors:
                stopping.start_soon(c.stop)
        try:
            await conns[0].js.delete_stream(conns[0].stream)
        except Exception as exc:
            print(f"stream not deleted ({exc!r}); the run's numbers stand", flush=True)
        # Only redeliveries may be refused (a delivery whose ack was late comes again).
        assert set(rejected) <= {"duplicate"}, rejected
        tg.cancel_scope.cancel()

    latencies = [x for c in collectors for x in c.latencies]
    per_node_groups = [statistics.mean(r["groups"]) for r in rows]
    per_node_bytes = [statistics.mean(r["bytes"]) for r in rows]
    body = len(encode_signed(sign_group(accounts[0], msgspec_replace(template, swarm=swarm))))
    return {
        "nodes": n,
        "plan": {"shards": plan.count, "shards_read": plan.k, "fraction": plan.fraction},
        "rounds": rounds,
        "groups_per_node_per_round": GROUPS_PER_NODE,
        "envelope_bytes": body,
        "ingress_groups_per_node": round(statistics.mean(per_node_groups), 2),
        "ingress_groups_per_node_max": max(max(r["groups"]) for r in rows),
        "ingress_bytes_per_node": round(statistics.mean(per_node_bytes)),
        # Received counts own groups on the shards read (skipped after the signature
        # check), so full fan-out is every group: n * g.
        "full_fanout_groups_per_node": n * GROUPS_PER_NODE,
        "full_fanout_bytes_per_node": n * GROUPS_PER_NODE * body,
        "server_egress_bytes_per_round": round(
            statistics.mean(r["server_out_bytes"] for r in rows)
        ),
        "publish_to_admit_p50_ms": round(_percentile(latencies, 0.5) * 1000, 1),
        "publish_to_admit_p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "verify_cpu_ms_per_node_per_round": round(
            statistics.mean(statistics.mean(r["cpu_s"]) for r in rows) * 1000, 3
        ),
        "round_wall_s": [round(r["round_s"], 2) for r in rows],
        "publish_wall_s": [round(r["publish_s"], 2) for r in rows],
        "setup_s": round(setup_s, 1),
        "publish_retries": len(retries),
        "consumer_create_retries": len(create_retries),
        "redeliveries_refused": rejected.get("duplicate", 0),
    }


def msgspec_decode_producer(signed) -> str:  # type: ignore[no-untyped-def]
    from sapo_async.fabric.transport.shards import body_producer

    producer = body_producer(signed.body)
    assert producer is not None
    return producer


async def main_async(sizes: list[int], rounds_for: dict[int, int], replicas: int) -> dict:  # type: ignore[type-arg]
    ports = [free_port() for _ in range(12)]
    with tempfile.TemporaryDirectory(prefix="sapo-scale-") as tmp:
        cluster = NatsCluster(
            work_dir=Path(tmp),
            client_ports=ports[0:3],
            cluster_ports=ports[3:6],
            leaf_ports=ports[6:9],
            http_ports=ports[9:12],
        )
        cluster.render()
        try:
            for i in range(3):
                cluster.start(i)
            await wait_cluster_healthy(ports[9:12])
            results = []
            with process_caches_off():
                for n in sizes:
                    t = time.perf_counter()
                    row = await run_size(cluster, n, rounds_for[n], replicas)
                    row["wall_s"] = round(time.perf_counter() - t, 1)
                    print(json.dumps(row), flush=True)
                    results.append(row)
        finally:
            cluster.stop_all()
    return {"sizes": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 8 and 30, 2 rounds")
    parser.add_argument("--sizes", default=None, help="comma-separated N (default 8,100,1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size")
    parser.add_argument("--replicas", type=int, default=3, help="stream replicas (1..3)")
    args = parser.parse_args()
    sizes = [int(x) for x in (args.sizes or ("8,30" if args.quick else "8,100,1000")).split(",")]
    rounds = 2 if args.quick else args.rounds
    started = time.time()
    out = anyio.run(main_async, sizes, dict.fromkeys(sizes, rounds), args.replicas)
    by_n = {str(r["nodes"]): r["ingress_groups_per_node"] for r in out["sizes"]}
    out.update(
        {
            "ingress_groups_per_node": by_n,
            "target_groups_per_node": FACTOR * EXTERNAL,
            "ratio_1000_to_100": (
                round(by_n["1000"] / by_n["100"], 3) if {"100", "1000"} <= by_n.keys() else None
            ),
            "conditions": {
                "cluster": "3 nats-server processes on loopback (infra/nats/cluster configs)",
                "stream_replicas": args.replicas,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other "
                "jobs (8 parallel sessions); run under nice -n 10",
                "nodes": "simulated in one process, sharing connections; process caches off",
                "g_J_c": [GROUPS_PER_NODE, EXTERNAL, FACTOR],
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "wall_s": round(time.time() - started, 1),
            },
            "command": "nice -n 10 just bench scale " + " ".join(sys.argv[1:]),
        }
    )
    path = results_path("scale", quick=args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    for r in out["sizes"]:
        print(
            f"N={r['nodes']:>5}  S={r['plan']['shards']:>4} k={r['plan']['shards_read']:>3}  "
            f"ingress {r['ingress_groups_per_node']:>7} groups/node/round "
            f"({r['ingress_bytes_per_node'] / 1e3:.0f} kB; full fan-out "
            f"{r['full_fanout_groups_per_node']})  egress "
            f"{r['server_egress_bytes_per_round'] / 1e6:.1f} MB/round  p50/p99 "
            f"{r['publish_to_admit_p50_ms']}/{r['publish_to_admit_p99_ms']} ms  verify "
            f"{r['verify_cpu_ms_per_node_per_round']} ms/node/round"
        )


if __name__ == "__main__":
    main()
