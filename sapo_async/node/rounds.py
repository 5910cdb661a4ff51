"""A SAPO node's round: generate, publish, score, sample, train, commit.

Owns the round of one node in a swarm, by joining pieces that know nothing of each other:
the learner (:class:`~sapo_async.node.learner.Learner`: tasks, generator, verifier, GRPO
trainer), the publisher and collector (fabric), the sampler (pure core) and the recorder
(ledger journal). Each round:

1. generate B questions x L completions with the node's own policy;
2. sign and publish every group (one message per group), await the server's acks;
3. score the node's own groups with its own verifier;
4. pick I local groups and J external ones from a snapshot of the collector's buffer,
   judged in a worker thread (:mod:`.selection`, :mod:`.judge`); back on the event loop,
   drop what failed (once, by reason, fed to the quarantine), take what was chosen, record
   who shows a stock lead (:mod:`.leads`);
5. one GRPO step on the I + J groups;
6. journal the round's commitment (hashes shared, hashes used by producer) for the chain;
   the node never waits for the chain.

No global barrier: a node never waits for another; what is in its buffer when it samples is
what it trains on. Staleness has one owner, the collector: it refuses and evicts groups
older than ``max_age_s`` or more than ``max_staleness_rounds`` behind the newest round it
admitted from their producer (:func:`~sapo_async.node.admission.build_collector`).

With ``training.overlap`` round r+1 is generated while round r trains, from the pre-step
weights (one policy version behind; a generator with weights of its own, synced after both
halves). A pre-generated round of a node that stops between the halves is never trained on.

Deliberately does not know how its pieces are built (:func:`~sapo_async.node.swarm.assemble`)
nor started and stopped (:class:`~sapo_async.node.lifecycle.Node`); the lockstep harness
(:mod:`sapo_async.experiment.lockstep`) drives ``share_round``/``train_round`` itself.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from cachetools import LRUCache

from sapo_async.errors import (
    ConfigError,
    PublishError,
    SapoError,
    StreamMissing,
    TransportUnavailable,
)
from sapo_async.fabric.collector import BufferedGroup, Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.ledger.recorder import Recorder
from sapo_async.limits import PRODUCERS_REMEMBERED
from sapo_async.logs import get_logger
from sapo_async.node.admission import NodeDefences
from sapo_async.node.checkpoint import state_bytes
from sapo_async.node.commitments import HeldCommitments, round_commitment
from sapo_async.node.groups import GeneratedGroup, SharedRound, to_rollout_group
from sapo_async.node.learner import Learner
from sapo_async.node.pacing import RoundPacing
from sapo_async.node.report import NodeStats, RoundHistory, RoundReport, rewards_by_family
from sapo_async.node.selection import Candidate, Choice, calibrate, pool_key, select_groups
from sapo_async.node.spec import NodeSpec
from sapo_async.policy.grpo.trainer import ScoredGroup, StepMetrics
from sapo_async.wire import RolloutGroup

__all__ = ["RoundLoop"]


class RoundLoop:
    """One node's rounds, one after another (see the module docstring).

    Args:
        spec: the node's spec (swarm, training, checkpoint, ``fabric.include_tokens``,
            ``policy.sleep_mode``, limiter).
        name: the node's human name.
        learner: the node's model, tasks, generator, verifier and trainer.
        publisher: signs and publishes the node's groups (its key is the node identity).
        collector: admits other nodes' groups (started and stopped by whoever runs it).
        recorder: journals round commitments for the ledger (None: no ledger).
        defences: the node's defences, the same object whose checks the collector was built
            with (:func:`~sapo_async.node.admission.build_collector`); None builds fresh
            ones, and a collector built without them then has no node-level admission
            checks (the round's content defences still apply).
        offload: run generation, selection and training in worker threads (several nodes per
            process).

    Raises:
        ConfigError: sleep mode with a generator that cannot sleep.
    """

    def __init__(
        self,
        spec: NodeSpec,
        *,
        name: str,
        learner: Learner,
        publisher: Publisher,
        collector: Collector,
        recorder: Recorder | None = None,
        defences: NodeDefences | None = None,
        offload: bool = True,
    ) -> None:
        self.spec = spec
        self.training = spec.training
        self.name = name
        self.learner = learner
        self.publisher = publisher
        self.collector = collector
        self.recorder = recorder
        self.offload = offload
        self.sleep_mode = spec.policy.sleep_mode
        if self.sleep_mode and not hasattr(learner.generator, "wake_up"):
            raise ConfigError(
                "sleep_mode needs a generator that can sleep (the vLLM backend)",
                field="policy.sleep_mode",
            )
        self.history = RoundHistory(name)
        self._next: SharedRound | None = None
        self._generator_version = learner.policy_version
        self._saved_round = learner.round
        self.checkpoint_every = spec.checkpoint.every_rounds(state_bytes(learner.model))
        self._stopping = False
        self._running = anyio.Event()
        self._running.set()
        self._done = anyio.Event()
        self._scope = anyio.CancelScope()
        self._published = 0
        # Bounded in producers (keys are free): the least recently trained one is forgotten.
        self._used: LRUCache[str, int] = LRUCache(PRODUCERS_REMEMBERED)
        self._seen_accepted = 0
        self._seen_rejected: Counter[str] = Counter()
        self._log = get_logger("node", node=self.address, node_name=name)
        # Until a checkpoint covers them (and carries them), then until the journal has them.
        self._held = HeldCommitments(recorder, self._log, stopping=self._stop_requested)
        self.pacing = RoundPacing(recorder, spec.ledger.max_pending, self._log)
        self._install_defences(defences)

    def _install_defences(self, defences: NodeDefences | None) -> None:
        """Keep the defence state the collector's checks share (given it when built)."""
        if defences is None:
            defences = NodeDefences.build(self.spec, self.learner.tasks.families)
        self.quarantine, self.calibration = defences.quarantine, defences.calibration
        self.leads = defences.leads

    @property
    def address(self) -> str:
        """The node's Ethereum address (its identity everywhere)."""
        return self.publisher.address

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stopping

    def stats(self) -> NodeStats:
        """Totals published and consumed so far."""
        return NodeStats(self.history.count, self._published, dict(self._used))

    async def run(self) -> None:
        """Run rounds until stopped or ``training.rounds`` are done, checkpointing every
        ``checkpoint.every`` rounds. A failure ends the rounds and reaches readers of the
        history; it is not raised here."""
        failure: BaseException | None = None
        try:
            with self._scope:
                await self._run_rounds()
        except anyio.get_cancelled_exc_class():
            if self._stopping:
                self._log.warning("round_abandoned", round=self.learner.round)
            raise
        except Exception as exc:  # the node's supervision boundary: the one catch-all in node/
            failure = exc
            ours = isinstance(exc, SapoError)  # its message says what to do; else a bug
            (self._log.error if ours else self._log.exception)("node_failed", error=repr(exc))
        finally:
            self._done.set()
            self.history.close(failure)

    async def _run_rounds(self) -> None:
        limit = self.training.rounds
        while not self._stop_requested() and (limit is None or self.history.count < limit):
            await self.pacing.wait_backlog(self._stop_requested)
            await self._running.wait()
            if self._stop_requested():  # stopped while paused (by pause() or the backlog)
                break
            if self.training.overlap:
                await self._overlapped_step()
            else:
                await self.step()
            if (self.learner.round - self._saved_round) >= self.checkpoint_every:
                await self.save_checkpoint()
        # The rounds are over (or a stop was asked): checkpoint what they trained, so the
        # commitments held for it go to the journal now, not only when the node leaves.
        await self.save_checkpoint()

    def _stop_requested(self) -> bool:
        # A method, not the property, so type checkers do not assume it cannot change.
        return self._stopping

    async def wait_done(self) -> None:
        """Wait until :meth:`run` has ended."""
        await self._done.wait()

    def pause(self) -> None:
        """Stop starting new rounds (the others keep going; nobody waits for this node)."""
        self._running = anyio.Event()

    def resume(self) -> None:
        """Start rounds again after :meth:`pause`."""
        self._running.set()

    def request_stop(self) -> None:
        """Stop after the round in progress (non-blocking; safe from any task)."""
        self._stopping = True
        self._running.set()

    def abandon_round(self) -> None:
        """Stop now, cancelling the round in progress."""
        self.request_stop()
        self._scope.cancel()

    async def save_checkpoint(self) -> Path | None:
        """Checkpoint model, optimizer, round and RNG states now (no-op without a
        checkpoint directory or when nothing changed since the last one), carrying the
        commitments that waited for it, then journal them (:mod:`.commitments`).

        Raises:
            CheckpointError: the write failed (the held commitments stay held).
            JournalError: the journal is full, read-only or damaged (they stay held).
        """
        directory = self.spec.checkpoint.dir
        path: Path | None = None
        if directory is not None and self._saved_round != self.learner.round:
            started = time.perf_counter()
            path = await anyio.to_thread.run_sync(
                self.learner.save, directory, self._held.carried()
            )
            self._saved_round = self.learner.round
            self._log.info(
                "checkpoint_saved",
                round=self.learner.round,
                path=str(path),
                seconds=round(time.perf_counter() - started, 2),
            )
        await self._held.release()
        return path

    async def step(self) -> RoundReport:
        """Run one whole round (share, then train)."""
        shared = await self.share_round()
        return await self.train_round(shared)

    async def _overlapped_step(self) -> None:
        """Train round r while round r+1 generates with the same (pre-step) weights."""
        if self._next is None:
            self._next = await self.share_round()
        current = self._next
        results: dict[str, Any] = {}

        async def train() -> None:
            results["report"] = await self.train_round(current, sync=False)

        async def generate_next() -> None:
            results["next"] = await self.share_round(current.round + 1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(train)
            tg.start_soon(generate_next)
        self._next = results["next"]
        await self._sync_generator()

    async def _run_sync(self, fn: Any, *args: Any) -> Any:
        if self.offload:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.spec.limiter)
        return fn(*args)

    async def share_round(self, round_: int | None = None) -> SharedRound:
        """Generate, publish and score one round's own groups (default: the current one)."""
        learner = self.learner
        r = learner.round if round_ is None else round_
        policy_version = self._generator_version
        t0 = time.perf_counter()
        generated: list[GeneratedGroup] = await learner.generate(r)
        t1 = time.perf_counter()
        wire = [
            to_rollout_group(
                g,
                swarm=self.spec.swarm,
                producer=self.address,
                producer_round=r,
                policy_version=policy_version,
                model_id=learner.model_id,
                tokenizer_id=learner.tokenizer_id,
                include_tokens=self.spec.fabric.include_tokens,
            )
            for g in generated
        ]
        hashes = await self._publish_all(wire)
        t2 = time.perf_counter()
        local = learner.score_local(generated)
        t3 = time.perf_counter()
        return SharedRound(r, generated, local, hashes, policy_version, t1 - t0, t2 - t1, t3 - t2)

    async def _sync_generator(self) -> None:
        # Push the new weights into the generation engine (a no-op for a transformers
        # generator that samples from the trainer's own module; vLLM verifies the sync
        # with its log-prob probe and raises WeightSyncError on a mismatch).
        await self.learner.generator.sync_weights(self.learner.model.named_parameters())
        self._generator_version = self.learner.policy_version

    async def _publish_all(self, groups: Sequence[RolloutGroup]) -> list[bytes]:
        hashes: list[bytes | None] = [None] * len(groups)
        missing = False

        async def one(i: int, g: RolloutGroup) -> None:
            nonlocal missing
            try:
                hashes[i] = (await self.publisher.publish(g)).rollout_hash
            except StreamMissing:
                missing = True  # failed at once, counted by the publisher; said once below
            except (PublishError, TransportUnavailable) as exc:
                # Counted by the publisher; the round still trains on its own groups.
                self._log.warning("round_publish_failed", error=str(exc))

        async with anyio.create_task_group() as tg:
            for i, g in enumerate(groups):
                tg.start_soon(one, i, g)
        done = [h for h in hashes if h is not None]
        self._published += len(done)
        self.pacing.published(missing=missing, round_=groups[0].producer_round if groups else None)
        return done

    def _fresh_candidates(self) -> tuple[tuple[BufferedGroup, ...], dict[str, int]]:
        """A snapshot of the buffered external groups (fresh: the collector owns staleness),
        canonically ordered, taken on the loop, and each producer's newest round held."""
        # A quarantined producer's buffered groups are not candidates either.
        quarantined = self.quarantine.active() if self.spec.defence.active else []
        fresh = self.collector.candidates(exclude_producers=(self.address, *quarantined))
        newest: dict[str, int] = {}
        for b in fresh:
            newest[b.producer] = max(newest.get(b.producer, -1), b.group.producer_round)
        # The draw then depends only on what the pool holds and the seeded rng, not on
        # delivery order or time stamps (common random numbers across runs).
        fresh.sort(key=pool_key)
        return tuple(fresh), newest

    async def _choose(self, shared: SharedRound) -> Choice:
        """Select in a worker thread from a snapshot; apply drops and takes on the loop."""
        fresh, newest = self._fresh_candidates()
        active = self.spec.defence.active
        if active:
            calibrate(self.calibration, shared)
        limits = self.calibration.thresholds() if active else None
        choice: Choice = await self._run_sync(
            partial(
                select_groups,
                self.learner,
                self.training,
                shared.round,
                local=shared.local,
                fresh=fresh,
                newest=newest,
                limits=limits,
                leads=self.leads.copy() if self.leads is not None else None,
                evidence=self.quarantine.evidence(newest) if active else None,
            )
        )
        for producer in self.leads.observe(choice.leads) if self.leads is not None else ():
            self._log.warning("producer_stock_lead_left_out", producer=producer)
        by_reason: dict[str, list[bytes]] = {}
        for v in choice.drops:
            by_reason.setdefault(v.reason, []).append(v.rollout_hash)
        for reason, hashes in by_reason.items():
            self.collector.drop(hashes, reason)
        if active:  # the quarantine's one source of verdicts (one per group)
            verdicts = [(v.producer, True, v.rollout_hash) for v in choice.drops]
            verdicts += [(producer, False, h) for producer, h in choice.passed]
            for producer in self.quarantine.record_all(verdicts):
                self._log.warning("producer_quarantined", producer=producer)
        if choice.external:
            hashes = [c.buffered.rollout_hash for c in choice.external]
            self.collector.take(hashes)
            self.collector.mark_trained(hashes)
        return choice

    async def _train(self, batch: list[ScoredGroup], *, sync: bool) -> StepMetrics:
        """One GRPO step, with the generation engine asleep or synced afterwards."""
        sleeper = self.learner.generator if self.sleep_mode else None
        if sleeper is not None:
            # Release the engine's KV cache (and at level 2 its weights) for the step.
            await sleeper.sleep()  # type: ignore[attr-defined]
        step: StepMetrics = await self._run_sync(self.learner.train, batch)
        if sleeper is not None:
            # wake_up loads the new weights and runs the log-prob probe after waking.
            await sleeper.wake_up(  # type: ignore[attr-defined]
                self.learner.model.named_parameters(),
                policy_version=self.learner.policy_version,
            )
            self._generator_version = self.learner.policy_version
        elif sync:
            await self._sync_generator()
        return step

    async def _commit(self, shared: SharedRound, chosen: list[Candidate]) -> tuple[int, int]:
        """Hold the round's commitment until a checkpoint covers (and carries) it, then
        journal it, or at once without checkpoints (why: :mod:`.commitments`); returns
        (pending: held + unconfirmed, confirmed)."""
        if self.recorder is None:
            return 0, 0
        commitment = round_commitment(self.address, shared, chosen)
        self._held.hold(commitment)
        if self.spec.checkpoint.dir is None:
            await self._held.release()
        elif self.learner.round - self._saved_round >= self.checkpoint_every:
            await self.save_checkpoint()
        stats = self.recorder.statistics()
        return stats.pending + len(self._held), stats.landed

    def _collected(self) -> tuple[int, dict[str, int]]:
        """Groups the collector admitted and rejected (by reason) since the last call."""
        stats = self.collector.statistics()
        received = stats.accepted - self._seen_accepted
        rejected = Counter(stats.rejected) + Counter(stats.dropped)
        rejected.subtract(self._seen_rejected)
        self._seen_accepted = stats.accepted
        self._seen_rejected = Counter(stats.rejected) + Counter(stats.dropped)
        return received, {reason: n for reason, n in rejected.items() if n > 0}

    async def train_round(self, shared: SharedRound, *, sync: bool = True) -> RoundReport:
        """Choose I local and J external groups, take one GRPO step, journal the round.

        Args:
            shared: the round's first half.
            sync: push the new weights into the generator afterwards (the overlapped loop
                syncs itself once the next round's generation is done).
        """
        t0 = time.perf_counter()
        choice = await self._choose(shared)
        chosen = choice.external
        t1 = time.perf_counter()
        step = await self._train([*choice.local, *(c.scored for c in chosen)], sync=sync)
        t2 = time.perf_counter()
        used: Counter[str] = Counter(c.producer for c in chosen)
        for producer, n in used.items():
            self._used[producer] = self._used.get(producer, 0) + n
        self.learner.set_round(shared.round + 1)
        pending, confirmed = await self._commit(shared, chosen)
        received, rejections = self._collected()
        rewards = [c.reward for g in shared.local for c in g.completions]
        completions = [c for g in shared.generated for c in g.result.completions]
        staleness = [choice.newest[c.producer] - c.buffered.group.producer_round for c in chosen]
        report = RoundReport(
            node=self.address,
            name=self.name,
            round=shared.round,
            policy_version=self.learner.policy_version,
            reward_mean=sum(rewards) / max(len(rewards), 1),
            informative_local=sum(g.informative for g in shared.local),
            local_used=len(choice.local),
            groups_shared=len(shared.hashes),
            groups_received=received,
            external_used=dict(used),
            external_scored=choice.selection.scored,
            external_uninformative=choice.selection.dropped_uninformative,
            external_failed=dict(choice.selection.failed),
            external_held=sum(choice.held.values()),
            external_held_by={str(k): n for k, n in choice.held.items()},
            external_left_out=choice.left_out,
            staleness_rounds=sum(staleness) / len(staleness) if staleness else 0.0,
            rejections=rejections,
            commitments_pending=pending,
            commitments_confirmed=confirmed,
            **self.pacing.take_report_fields(),
            generate_s=shared.generate_s,
            publish_s=shared.publish_s,
            score_s=shared.score_s + (t1 - t0),
            train_s=t2 - t1,
            step={k: v for k, v in asdict(step).items() if k != "extra"},
            external_staleness=staleness,
            reward_by_family=rewards_by_family(shared.local),
            quarantined=tuple(self.quarantine.active()),
            generated_tokens=sum(len(c.token_ids or ()) for c in completions),
        )
        self.history.add(report)
        self._log.info(
            "round_completed",
            round=report.round,
            policy_version=report.policy_version,
            reward=round(report.reward_mean, 4),
            external=report.external_total,
            shared=report.groups_shared,
        )
        return report
