"""A node's round reads the collector's buffer on the event loop, never from the worker
thread it trains in: the collector admits groups on the event loop, and a read from another
thread raced with admission ("OrderedDict mutated during iteration", seen in the async
paper table, where a crashed admission drops the group)."""

from __future__ import annotations

import threading

import anyio
import pytest
from eth_account import Account

from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import StartAt
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.groups import to_rollout_group
from sapo_async.node.learner import build_learner
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.spec import NodeSpec


class _RecordingCollector(Collector):
    """A real collector that notes which thread touches its buffer."""

    threads: set[int]

    def candidates(self, exclude_producers=()):  # type: ignore[no-untyped-def]
        self.threads.add(threading.get_ident())
        return super().candidates(exclude_producers)

    def take(self, rollout_hashes):  # type: ignore[no-untyped-def]
        self.threads.add(threading.get_ident())
        return super().take(rollout_hashes)


@pytest.mark.timeout(300)
def test_the_round_reads_and_trims_the_buffer_on_the_event_loop_thread(tiny_lm):
    async def main() -> set[int]:
        broker = MemoryBroker()
        spec = NodeSpec.build(
            model=tiny_lm,
            prompt_style="compact",
            tasks="cpu_easy",
            questions_per_round=2,
            completions_per_question=2,
            local=2,
            external=2,
            ledger_enabled=False,
        )
        peer_account, account = Account.create(), Account.create()
        peer = Publisher(broker.connect("local"), peer_account)
        transport = broker.connect("local")
        collector = _RecordingCollector(
            transport, own_address=account.address, start=StartAt.everything(), name="c"
        )
        collector.threads = set()
        node = RoundLoop(
            spec,
            name="n",
            learner=build_learner(spec),
            publisher=Publisher(transport, account),
            collector=collector,
            offload=True,  # generation, selection and training in worker threads
        )
        async with collector:
            # Another node's round 0 groups, then round 9 (round 0 is now stale: dropped).
            other = build_learner(spec.replace(node_index=1))
            for rnd in (0, 9):
                for g in await other.generate(rnd):
                    await peer.publish(
                        to_rollout_group(
                            g,
                            swarm="local",
                            producer=peer_account.address,
                            producer_round=rnd,
                            policy_version=other.policy_version,
                            model_id=other.model_id,
                            tokenizer_id=other.tokenizer_id,
                        )
                    )
            await collector.wait_accepted(4, timeout=30)
            await node.step()
        return collector.threads

    threads = anyio.run(main)
    assert threads == {threading.get_ident()}
