"""Chaos run: real nodes on a three-server JetStream cluster with anvil, under faults.

Usage: ``just chaos [--quick] [--nodes 8] [--duration 600] [--seed 7]``. Writes
``bench/results/chaos.json`` (``--quick``: ``bench/results/quick/chaos.json``).

Each node is its own ``sapo-async node`` process with the tiny model, its own keystore,
journal and checkpoints, reading 8 of 16 shards (rotating every minute) of a stream
replicated three ways. A seeded, bounded schedule injects one fault at a time, each
undone before the next: SIGKILL a node (restarted 2-5 s later; any node, even one still
starting), SIGTERM a node that is running (restarted once it exited), SIGKILL a NATS
server (restarted 5-15 s later on its store), pause the RPC (SIGSTOP anvil for
5-20 s, then SIGCONT), and restart a node (SIGKILL, started again at once) while the RPC is
paused for 5-20 s, or while all three NATS servers are down for 5-15 s (the start-up
checks must wait the outage out, never exit 2); lock a running node's ledger journal from
another process (``BEGIN EXCLUSIVE``) for 5-20 s (the node must wait it out); and fill a
running node's data disk for 5-20 s (each node's ``data_dir`` is its own small tmpfs: the
node may stop with its one-line full-disk error, which is expected, and is started again
once the space is back; without root, so without tmpfs, this kind is left out and the
record says so); short runs shorten the outages to 0.4x.
``--block-time S`` runs anvil mining a block every S seconds (a real chain's pace). A node
that exits on its own is a crash (and is restarted, so the run goes on). After the schedule
every node must complete a round in its latest incarnation, then all stop with SIGTERM and
the audit runs:

* rounds committed: commitments on chain, all nodes;
* commitments lost: a round a node completed (logged ``round_completed``) or journaled
  that is not on chain after the final drain, or whose on-chain commitment differs;
* duplicate commitments: a (node, round) on chain twice, or a group committed as "own"
  in two commitments;
* acked groups lost: a group whose publish was acknowledged (``rollout_published``, or
  named as "own" in a journaled commitment) that the stream does not hold;
* crashes: a node that exited on its own, or non-zero after SIGTERM, or logged
  ``node_failed``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fixtures (the cluster)
sys.path.insert(0, str(ROOT / "bench"))

from eth_account import Account  # noqa: E402
from results_path import results_path  # noqa: E402

from sapo_async.fabric.transport.base import StartAt  # noqa: E402
from sapo_async.fabric.transport.embedded import NatsOptions  # noqa: E402
from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings  # noqa: E402
from sapo_async.ledger import deploy_ledger, fund, rpc_chain  # noqa: E402
from sapo_async.ledger.anvil import AnvilProcess  # noqa: E402
from sapo_async.ledger.evm import EvmLedger  # noqa: E402
from sapo_async.ledger.journal import Journal  # noqa: E402
from sapo_async.ledger.recorder import Recorder  # noqa: E402
from sapo_async.ops.devnet import ANVIL_DEV_KEY  # noqa: E402
from sapo_async.process import lasting_ports  # noqa: E402
from tests.fixtures.volunteer import NatsCluster  # noqa: E402

SWARM = "chaos"
KINDS = (
    "node_sigkill",
    "node_sigterm",
    "nats_kill",
    "rpc_pause",
    "node_start_in_rpc_pause",
    "node_start_in_nats_outage",
    "journal_lock",
    "disk_full",
)
DATA_DISK_MIB = 192
"""Each node's tmpfs data disk: two kept checkpoints of the tiny model, one being written,
the journal and room to spare."""
PASSWORD = "chaos-password"  # the throwaway keystores of this run


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["SAPO_KEY_PASSWORD"] = PASSWORD
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def events(log: Path) -> list[dict[str, Any]]:
    out = []
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL
    return out


@dataclass
class NodeProc:
    """One node: its config, its address and its incarnations (one log each)."""

    index: int
    config: Path
    data: Path
    address: str = ""
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    expected_exit: bool = False
    disk_full: bool = False  # its data disk is full now: exiting is expected
    full_stops: set[int] = field(default_factory=set)  # incarnations a full disk stopped

    def start(self) -> None:
        # Beside the data directory, not in it: a full data disk must not cut the log.
        log = self.data.parent / f"{self.data.name}-run{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sapo_async", "node", "--config", str(self.config)],
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
        self.expected_exit = False

    def rounds_now(self) -> int:
        return sum(1 for e in events(self.logs[-1]) if e.get("event") == "round_completed")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.expected_exit = True
        self.proc.send_signal(sig)


def write_config(node: NodeProc, urls: list[str], rpc: str, contract: str) -> None:
    own_first = urls[node.index % 3 :] + urls[: node.index % 3]
    node.config.write_text(
        f"""
[node]
swarm = "{SWARM}"
name = "chaos-{node.index}"
data_dir = "{node.data}"
drain_timeout_s = 60

[checkpoint]
every = 1

[nats]
urls = {json.dumps(own_first)}
stream_replicas = 3
shards = 16
shards_read = 8
shard_rotate_s = 60

[ledger]
rpc_url = "{rpc}"
contract_address = "{contract}"

[model]
name_or_path = "tiny"
device = "cpu"
backend = "transformers"

[tasks]
regime = "dense"

[training]
questions_per_round = 4
completions_per_question = 4
local = 2
external = 2
max_new_tokens = 16

[metrics]
log_json = true
log_level = "DEBUG"
"""
    )


def fill_disk(filler: Path) -> int:
    """Write ``filler`` until its disk has no byte left; returns the bytes written."""
    written = 0
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    n = os.write(fd, block)
                except OSError:  # ENOSPC: this size no longer fits, try a smaller one
                    break
                written += n
                if n < chunk:
                    break
    finally:
        os.close(fd)
    return written


def error_line(log: Path) -> str:
    """The node's one ``error:`` line in ``log`` (empty if none)."""
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("error:")]
    return lines[-1] if lines else ""


def wait_healthy(ports: list[int], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = 0
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    ok += r.status == 200
            except OSError:
                pass
        if ok == len(ports):
            return
        time.sleep(0.3)  # polling the servers' health endpoint, bounded by the deadline
    raise TimeoutError(f"cluster not healthy in {timeout} s")


class Chaos:
    """The run: servers, chain, nodes, the fault schedule and the audit."""

    def __init__(
        self, work: Path, nodes: int, duration: float, seed: int, block_time: float | None = None
    ) -> None:
        self.work = work
        self.n = nodes
        self.duration = duration
        self.rng = random.Random(seed)
        self.seed = seed
        self.scale = 1.0 if duration >= 300 else 0.4  # short runs: shorter outages
        ports = lasting_ports(12)  # servers restart on their ports
        self.cluster = NatsCluster(
            work_dir=work / "nats",
            client_ports=ports[0:3],
            cluster_ports=ports[3:6],
            leaf_ports=ports[6:9],
            http_ports=ports[9:12],
        )
        self.anvil = AnvilProcess(work / "anvil", keep_state=False, block_time_s=block_time)
        self.nodes = [NodeProc(i, work / f"node{i}.toml", work / f"node{i}") for i in range(nodes)]
        self.faults: Counter[str] = Counter()
        self.tmpfs: list[Path] = []  # the data disks mounted (all or none)
        self.kinds: tuple[str, ...] = KINDS
        self.crashes: list[str] = []
        self.timeline: list[dict[str, Any]] = []
        self.contract = ""

    # --- set-up ------------------------------------------------------------------------

    def setup(self) -> None:
        self.cluster.work_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.render()
        for i in range(3):
            self.cluster.start(i)
        wait_healthy(self.cluster.http_ports or [])
        self.anvil.start()
        chain = rpc_chain(self.anvil.url)
        ledger = anyio.run(lambda: deploy_ledger(chain, Account.from_key(ANVIL_DEV_KEY), SWARM))
        self.contract = ledger.address
        anyio.run(self._create_stream)
        procs = []
        for node in self.nodes:
            node.data.mkdir(parents=True, exist_ok=True)
        self._mount_data_disks()
        for node in self.nodes:
            write_config(node, self.cluster.auth_urls, self.anvil.url, self.contract)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "sapo_async", "identity", "--config", str(node.config)],
                    cwd=ROOT,
                    env=_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for node, proc in zip(self.nodes, procs, strict=True):
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
            node.address = next(w for w in out.split() if w.startswith("0x") and len(w) == 42)
            anyio.run(lambda a=node.address: fund(chain, a))

    def _mount_data_disks(self) -> None:
        """Give each node a tmpfs data disk of DATA_DISK_MIB (root only), for disk_full."""
        if os.geteuid() != 0:
            self.kinds = tuple(k for k in KINDS if k != "disk_full")
            return
        for node in self.nodes:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={DATA_DISK_MIB}m", "tmpfs", str(node.data)],
                check=True,
            )
            self.tmpfs.append(node.data)

    async def _create_stream(self) -> None:
        transport = await JetStreamTransport.connect(
            NatsOptions(url=",".join(self.cluster.auth_urls)),
            SWARM,
            settings=StreamSettings(replicas=3),
        )
        await transport.aclose()

    # --- the run -------------------------------------------------------------------------

    def note(self, what: str, **info: Any) -> None:
        entry = {"t": round(time.monotonic() - self.t0, 1), "what": what, **info}
        self.timeline.append(entry)
        print(json.dumps(entry), flush=True)

    def check_crashes(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None and node.disk_full:
                continue  # stopped by its full disk: started again once the space is back
            if node.proc is not None and node.proc.poll() is not None and not node.expected_exit:
                self.crashes.append(f"node {node.index} exited {node.proc.returncode} on its own")
                self.note("crash", node=node.index, code=node.proc.returncode)
                node.start()

    def wait_rounds(self, nodes: list[NodeProc], count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_crashes()
            if all(n.rounds_now() >= count for n in nodes):
                return
            time.sleep(1.0)  # polling logs, bounded by the deadline
        slow = [n.index for n in nodes if n.rounds_now() < count]
        raise TimeoutError(f"nodes {slow} did not complete {count} round(s) in {timeout} s")

    def wait_rounds_any(self, count: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not any(n.rounds_now() >= count for n in self.nodes):
            self.check_crashes()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no node completed {count} round(s) in {timeout} s")
            time.sleep(0.5)  # polling logs, bounded by the deadline

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check_crashes()
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))

    def fault(self, kind: str) -> None:
        self.faults[kind] += 1
        if kind == "node_sigkill":
            node = self.rng.choice(self.nodes)
            node.signal(signal.SIGKILL)
            node.proc.wait(timeout=30)  # type: ignore[union-attr]
            down = self.rng.uniform(2, 5)
            self.note(kind, node=node.index, down_s=round(down, 1))
            self.sleep(down)
            node.start()
        elif kind == "node_sigterm":
            # A node is asked to stop once it runs: before its signal handlers are in
            # place (still importing torch) SIGTERM kills the interpreter outright (-15),
            # which is a SIGKILL by another name and tested as such.
            self.wait_rounds_any(1)
            node = self.rng.choice([n for n in self.nodes if n.rounds_now() >= 1])
            node.signal(signal.SIGTERM)
            code = node.proc.wait(timeout=180)  # type: ignore[union-attr]
            self.note(kind, node=node.index, exit=code)
            if code != 0:
                self.crashes.append(f"node {node.index} exited {code} after SIGTERM")
            node.start()
        elif kind == "nats_kill":
            i = self.rng.randrange(3)
            server = self.cluster.servers[i]
            pid = server.process.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            server.stop()  # reaps it
            down = self.rng.uniform(5, 15) * self.scale
            self.note(kind, server=i, down_s=round(down, 1))
            self.sleep(down)
            self.cluster.start(i)
        elif kind == "rpc_pause":
            pid = self.anvil.process.pid if self.anvil.process else None
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            down = self.rng.uniform(5, 20) * self.scale
            self.note(kind, down_s=round(down, 1))
            try:
                self.sleep(down)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif kind == "node_start_in_rpc_pause":
            pid = self.anvil.process.pid if self.anvil.process else None
            assert pid is not None
            node = self.rng.choice(self.nodes)
            node.signal(signal.SIGKILL)
            node.proc.wait(timeout=30)  # type: ignore[union-attr]
            os.kill(pid, signal.SIGSTOP)
            down = self.rng.uniform(5, 20) * self.scale
            self.note(kind, node=node.index, down_s=round(down, 1))
            node.start()
            try:
                self.sleep(down)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif kind == "node_start_in_nats_outage":
            node = self.rng.choice(self.nodes)
            node.signal(signal.SIGKILL)
            node.proc.wait(timeout=30)  # type: ignore[union-attr]
            for server in self.cluster.servers.values():
                if server.process.pid is not None:
                    os.kill(server.process.pid, signal.SIGKILL)
                server.stop()  # reaps it
            down = self.rng.uniform(5, 15) * self.scale
            self.note(kind, node=node.index, down_s=round(down, 1))
            node.start()
            self.sleep(down)
            for i in range(3):
                self.cluster.start(i)
        elif kind == "journal_lock":
            self.wait_rounds_any(1)
            node = self.rng.choice([n for n in self.nodes if n.rounds_now() >= 1])
            held = self.rng.uniform(5, 20) * self.scale
            other = sqlite3.connect(
                node.data / "journal" / "journal.sqlite", timeout=30, isolation_level=None
            )
            other.execute("BEGIN EXCLUSIVE")  # another program holds the write lock
            self.note(kind, node=node.index, held_s=round(held, 1))
            try:
                self.sleep(held)
            finally:
                other.execute("COMMIT")
                other.close()
        elif kind == "disk_full":
            self.wait_rounds_any(1)
            node = self.rng.choice([n for n in self.nodes if n.rounds_now() >= 1])
            filler = node.data / "filler"
            node.disk_full = True
            filled = fill_disk(filler)
            held = self.rng.uniform(5, 20) * self.scale
            self.note(kind, node=node.index, held_s=round(held, 1), filled_mib=filled >> 20)
            try:
                self.sleep(held)
            finally:
                filler.unlink()
            # The space is back: the node either runs on (a round completes) or is stopping
            # on the error the full disk gave it (it exits); either, within 3 minutes.
            assert node.proc is not None
            rounds, deadline = node.rounds_now(), time.monotonic() + 180
            while node.proc.poll() is None and node.rounds_now() <= rounds:
                if time.monotonic() > deadline:
                    break
                self.sleep(0.5)
            node.disk_full = False
            code = node.proc.poll()
            if code is not None:
                line = error_line(node.logs[-1])
                self.note("disk_full_stopped", node=node.index, exit=code, error=line)
                if code != 1 or "full" not in line:
                    self.crashes.append(f"node {node.index} exited {code} on a full disk: {line}")
                node.full_stops.add(len(node.logs) - 1)
                node.start()
        else:  # pragma: no cover
            raise ValueError(kind)

    def run(self) -> dict[str, Any]:
        self.t0 = time.monotonic()
        for node in self.nodes:
            node.start()
        self.wait_rounds(self.nodes, 1, timeout=900)
        self.note("all_nodes_running")
        start = time.monotonic()
        # Faults in seeded blocks holding each kind once (so every kind is hit about
        # equally often, and even a short run covers them all); gaps of 10-30 s (1-3 s
        # for short runs) between faults.
        kinds: list[str] = []
        gap = (10.0, 30.0) if self.duration >= 300 else (1.0, 3.0)
        done = 0
        while done < len(self.kinds) or time.monotonic() - start < self.duration:
            if not kinds:
                kinds = list(self.kinds)
                self.rng.shuffle(kinds)
            kind = kinds.pop(0)
            done += 1
            self.fault(kind)
            self.sleep(self.rng.uniform(*gap))
        self.note("schedule_done", faults=dict(self.faults))
        # Every node resumed: each completes a round in its latest incarnation.
        self.wait_rounds(self.nodes, 1, timeout=600)
        self.note("all_nodes_resumed")
        for node in self.nodes:
            node.signal(signal.SIGTERM)
        for node in self.nodes:
            code = node.proc.wait(timeout=240)  # type: ignore[union-attr]
            if code != 0:
                self.crashes.append(f"node {node.index} exited {code} after the final SIGTERM")
        self.note("all_nodes_stopped")
        return anyio.run(self.audit)

    # --- the audit -----------------------------------------------------------------------

    async def _stream_ids(self) -> set[str]:
        transport = await JetStreamTransport.connect(
            NatsOptions(url=",".join(self.cluster.auth_urls)),
            SWARM,
            settings=StreamSettings(replicas=3),
        )
        try:
            info = await transport.js.stream_info(transport.stream)
            total = info.state.messages
            sub = await transport.subscribe(start=StartAt.everything())
            ids: set[str] = set()
            seen = 0
            with anyio.fail_after(120):
                while seen < total:
                    for d in await sub.fetch(256, 1.0):
                        seen += 1
                        if d.msg_id:
                            ids.add(d.msg_id)
                        await d.ack()
            await sub.aclose()
            return ids
        finally:
            await transport.aclose()

    async def _final_drain(self, ledger: Any) -> None:
        """Land what the nodes left pending, as each node's next start would: every node's
        journal with its own key, all at once. Tiny nodes finish rounds faster than the chain
        takes commitments, so the SIGTERM drain can leave a backlog; it is journaled, not
        lost. Once every node's rounds are on chain, each settles its open credit claims.
        Each node gets its own connection, as its own process would: a connection holds its
        lock while it waits for a receipt, so one shared by eight recorders landed one
        transaction per block for the whole swarm (at 12 s blocks the drain outlasted 600 s)."""
        landed = {node.index: anyio.Event() for node in self.nodes}
        all_landed = anyio.Event()

        async def drain(node: NodeProc) -> None:
            try:
                key = Account.decrypt(json.loads((node.data / "key.json").read_text()), PASSWORD)
                account = Account.from_key(key)
                with Journal(node.data / "journal" / "journal.sqlite") as journal:
                    if not journal.pending(node.address) and not journal.open_claims(node.address):
                        return
                    own = EvmLedger(rpc_chain(self.anvil.url), ledger.address)
                    async with Recorder(
                        own, journal, account, retry_base_s=0.05, retry_max_s=1.0
                    ) as rec:
                        await rec.wait_idle(600)
                        landed[node.index].set()
                        await all_landed.wait()
                        await rec.wait_credit_settled(600)
            finally:
                landed[node.index].set()

        async def release() -> None:
            for event in landed.values():
                await event.wait()
            all_landed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            for node in self.nodes:
                tg.start_soon(drain, node)

    async def audit(self) -> dict[str, Any]:
        chain = rpc_chain(self.anvil.url)
        ledger = EvmLedger(chain, self.contract)
        await self._final_drain(ledger)
        stream = await self._stream_ids()
        lost: list[str] = []
        duplicates: list[str] = []
        acked_lost: list[str] = []
        not_resumed: list[int] = []
        committed = 0
        repeated = 0
        killed_early = 0
        max_pending = 0
        paused_s = rounds_span_s = 0.0
        rounds_done = 0
        signals: Counter[str] = Counter()
        own_seen: dict[bytes, tuple[str, int]] = {}
        for node in self.nodes:
            on_chain = await ledger.rounds_of(node.address)
            committed += len(on_chain)
            if len(on_chain) != len(set(on_chain)):
                duplicates.append(f"{node.index}: rounds on chain twice {on_chain}")
            with Journal(node.data / "journal" / "journal.sqlite") as journal:
                entries = journal.entries(node.address)
            journaled = {e.round: e for e in entries}
            all_events = [e for log in node.logs for e in events(log)]
            completed = {e["round"] for e in all_events if e.get("event") == "round_completed"}
            for r in sorted(completed - set(journaled)):
                lost.append(f"{node.index}: round {r} completed but never journaled")
            for r, entry in sorted(journaled.items()):
                if r not in on_chain:
                    lost.append(f"{node.index}: round {r} journaled ({entry.state}) not on chain")
                    continue
                stored = await ledger.commitment_of(node.address, r)
                if stored is None or not stored.matches(entry.commitment.payload()):
                    lost.append(f"{node.index}: round {r} on chain differs from the journal")
                for h in entry.commitment.rollout_hashes:
                    if h in own_seen:
                        duplicates.append(f"{h.hex()} own in {own_seen[h]} and {node.index}/{r}")
                    own_seen[h] = (node.address, r)
            acked = {e["rollout_hash"] for e in all_events if e.get("event") == "rollout_published"}
            acked |= {h.hex() for e in entries for h in e.commitment.rollout_hashes}
            acked_lost += sorted(acked - stream)
            repeated += sum(1 for e in all_events if e.get("event") == "commitment_not_journaled")
            for log in node.logs:  # journaled minus landed, in each incarnation's order
                backlog = 0
                for e in events(log):
                    if e.get("event") == "recorder_started":
                        backlog = int(e.get("pending", 0))
                    elif e.get("event") == "commitment_journaled":
                        backlog += 1
                    elif e.get("event") in ("commitment_confirmed", "commitment_already_landed"):
                        backlog -= 1
                    max_pending = max(max_pending, backlog)
            paused_s += sum(
                float(e.get("waited_s", 0.0))
                for e in all_events
                if e.get("event") == "rounds_resumed_after_backlog"
            )
            for log in node.logs:  # the span of each incarnation's rounds
                stamps = [
                    datetime.fromisoformat(e["timestamp"]).timestamp()
                    for e in events(log)
                    if e.get("event") == "round_completed" and "timestamp" in e
                ]
                rounds_done += len(stamps)
                rounds_span_s += max(stamps) - min(stamps) if stamps else 0.0
            for name in (
                "rounds_paused_for_backlog",
                "credit_settled",
                "credit_claim_lapsed",
                "credit_withdrawn",
                "credit_refused_by_producer_round",
                "stream_missing",
                "startup_check_waiting",
                "journal_locked",
                "journal_unlocked",
                "commitments_wait_in_checkpoint",
                "commitments_journaled_from_checkpoint",
            ):
                signals[name] += sum(1 for e in all_events if e.get("event") == name)
            for k, log in enumerate(node.logs):
                evs = events(log)
                if any(e.get("event") == "node_failed" for e in evs) and k not in node.full_stops:
                    self.crashes.append(f"node {node.index} run {k} logged node_failed")
                resumed = any(e.get("event") == "node_resumed" for e in evs) and any(
                    e.get("event") == "round_completed" for e in evs
                )
                if k and not resumed:
                    if k == len(node.logs) - 1:
                        not_resumed.append(node.index)  # the incarnation that should run on
                    else:
                        killed_early += 1  # a later fault stopped it while it was starting
        return {
            "faults_injected": dict(self.faults),
            "fault_kinds_left_out": {"disk_full": "not root: no tmpfs data disks"}
            if "disk_full" not in self.kinds
            else {},
            "stopped_by_full_disk": sum(len(n.full_stops) for n in self.nodes),
            "rounds_committed": committed,
            "commitments_lost": len(lost),
            "duplicate_commitments": len(duplicates),
            "acked_groups_lost": len(acked_lost),
            "crashes": len(self.crashes),
            "nodes_not_resumed": sorted(set(not_resumed)),
            "restarts": sum(len(n.logs) - 1 for n in self.nodes),
            "acked_groups": len(stream),
            "rounds_repeated_after_resume": repeated,
            "max_commitments_pending_per_node": max_pending,
            # pace: rounds completed (all incarnations), the time between each incarnation's
            # first and last round, summed, and the part of it rounds spent paused for the
            # commitment backlog (rounds_resumed_after_backlog's waited_s)
            "rounds_completed": rounds_done,
            "rounds_span_s": round(rounds_span_s, 1),
            "backlog_paused_s": round(paused_s, 1),
            "honest_credit_withdrawn": signals["credit_withdrawn"],
            "events": dict(signals),
            "incarnations_stopped_before_resuming": killed_early,
            "details": {
                "lost": lost[:20],
                "duplicates": duplicates[:20],
                "acked_lost": acked_lost[:20],
                "crashes": self.crashes[:20],
            },
            "timeline": self.timeline,
        }

    def teardown(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=30)
        if self.anvil.process is not None and self.anvil.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.anvil.process.pid, signal.SIGCONT)
        self.anvil.stop()
        self.cluster.stop_all()
        for mount in self.tmpfs:
            subprocess.run(["umount", str(mount)], check=False)


def run_chaos(
    nodes: int, duration: float, seed: int, work: Path, block_time: float | None = None
) -> dict[str, Any]:
    """Set up, run the schedule, audit, tear down; returns the audit."""
    chaos = Chaos(work, nodes, duration, seed, block_time)
    started = time.time()
    try:
        chaos.setup()
        result = chaos.run()
    finally:
        chaos.teardown()
    result["conditions"] = {
        "nodes": nodes,
        "duration_s": duration,
        "seed": seed,
        "wall_s": round(time.time() - started, 1),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "cluster": "3 nats-server processes on loopback (infra/nats/cluster), stream R3",
        "chain": "anvil (npm), one SapoLedger, "
        + (f"a block every {block_time:g} s" if block_time else "a block per transaction"),
        "node": "sapo-async node, tiny model on CPU, 4x4 rollouts/round, I=2 J=2, "
        "reads 8 of 16 shards rotating every minute, checkpoint every round",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs",
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 nodes, 45 s of faults")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--block-time", type=float, default=None, help="anvil mines a block every S seconds"
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    args = parser.parse_args()
    nodes, duration = (3, 45.0) if args.quick else (args.nodes, args.duration)
    with tempfile.TemporaryDirectory(prefix="sapo-chaos-") as tmp:
        result = run_chaos(nodes, duration, args.seed, Path(tmp), args.block_time)
    result["command"] = " ".join(["python bench/chaos.py", *sys.argv[1:]])
    path = args.out or results_path("chaos", quick=args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    keys = ("faults_injected", "rounds_committed", "commitments_lost", "duplicate_commitments")
    keys += ("acked_groups_lost", "crashes", "nodes_not_resumed")
    keys += ("max_commitments_pending_per_node", "honest_credit_withdrawn", "events")
    keys += ("rounds_completed", "rounds_span_s", "backlog_paused_s")
    for key in keys:
        print(f"{key}: {result[key]}")


if __name__ == "__main__":
    main()
