"""A SAPO node: its own model, its own round loop, sharing through the fabric.

Owns the round of one node in a swarm, by joining pieces that know nothing of each other:
the learner (:class:`~sapo_async.node.learner.LocalTrainerNode`: tasks, generator, verifier,
GRPO trainer), the publisher and collector (fabric), the sampler (pure core) and the
recorder (ledger journal). Each round:

1. generate B questions x L completions with the node's own policy;
2. sign and publish every group (one message per group), await the server's acks;
3. score the node's own groups with its own verifier;
4. pick I local groups and J external ones from the collector's buffer (the sampler
   re-derives each candidate's task from its reference and scores it with this node's
   verifier; a mismatch is a rejection counted by reason);
5. one GRPO step on the I + J groups;
6. journal the round's commitment (hashes shared, hashes used by producer) for the chain;
   the node never waits for the chain.

No global barrier: a node never waits for another. What is in its buffer when it samples
is what it trains on; a node alone trains like J = 0. Staleness is bounded twice: the
collector drops groups older than ``max_age_s`` or far behind their producer's newest
round, and the sampler only draws groups at most ``max_staleness_rounds`` behind the newest
it holds from their producer, so a whole group ages out together.

Overlap of generation and training (``overlap=True``): round r+1 is generated while round r
trains, from the weights before round r's step (one policy version behind; the groups carry
that version and their behaviour log-probs). It needs a generator with weights of its own,
synced after both halves finish. Off by default: the default transformers generator samples
from the trainer's own module (no copy, no sync, no staleness), and in a local swarm the
cores are already busy with other nodes (its speed-up is not measured yet). If the node leaves
between the halves, the pre-generated round was shared but is never trained on nor
committed.

Deliberately does not know how its pieces are built (see :mod:`sapo_async.node.swarm`).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup

from sapo_async.errors import (
    ActorStopped,
    PublishError,
    RejectedInput,
    SapoError,
    TransportUnavailable,
)
from sapo_async.fabric.collector import BufferedGroup, Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.ledger.recorder import Recorder
from sapo_async.ledger.types import RoundCommitment
from sapo_async.limits import ACTOR_DRAIN_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.node.learner import GeneratedGroup, LocalTrainerNode, round_seed, to_rollout_group
from sapo_async.node.sampler import SamplerPolicy, select_external, select_local
from sapo_async.policy.grpo.trainer import ScoredGroup
from sapo_async.wire import RolloutGroup

__all__ = ["Node", "NodeStats", "RoundReport", "SharedRound"]


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one round of one node did.

    Attributes:
        node: the node's address.
        name: the node's human name.
        round: the round index.
        policy_version: optimizer steps taken after this round.
        reward_mean: mean reward of the node's own completions this round (the *training
            reward* the SAPO paper plots and sums).
        informative_local: own groups whose rewards differ.
        local_used: own groups trained on (I, or fewer).
        groups_shared: groups published and acknowledged this round.
        external_used: external groups trained on, by producer address.
        external_scored: external candidates scored to find them.
        external_uninformative: of those, dropped for all-equal rewards.
        external_failed: candidates dropped at scoring, by reason (e.g. task_mismatch).
        staleness_rounds: mean of (producer's newest round - group's round) over the
            external groups used (0 = all fresh).
        rejections: collector rejections so far, by reason (cumulative).
        commitments_pending / commitments_confirmed: ledger journal state (0 without a
            ledger).
        generate_s / publish_s / score_s / train_s: wall time of each phase.
        step: the trainer's metrics (flat dict).
    """

    node: str
    name: str
    round: int
    policy_version: int
    reward_mean: float
    informative_local: int
    local_used: int
    groups_shared: int
    external_used: dict[str, int]
    external_scored: int
    external_uninformative: int
    external_failed: dict[str, int]
    staleness_rounds: float
    rejections: dict[str, int]
    commitments_pending: int
    commitments_confirmed: int
    generate_s: float
    publish_s: float
    score_s: float
    train_s: float
    step: dict[str, Any] = field(default_factory=dict)

    @property
    def external_total(self) -> int:
        """External groups trained on this round."""
        return sum(self.external_used.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (for the per-node JSONL log)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SharedRound:
    """The first half of a round: generated, published and scored, not yet trained.

    Attributes:
        round: the round index.
        generated: the node's own groups.
        local: the same, scored by the node's verifier.
        hashes: rollout hashes of the groups that were acknowledged.
        generate_s / publish_s / score_s: phase times.
    """

    round: int
    generated: list[GeneratedGroup]
    local: list[ScoredGroup]
    hashes: list[bytes]
    policy_version: int
    generate_s: float
    publish_s: float
    score_s: float


@dataclass(frozen=True, slots=True)
class NodeStats:
    """Totals of a node (what it published and consumed), for audits and tests.

    Attributes:
        rounds: rounds completed.
        published: groups published and acknowledged.
        used_by_producer: external groups trained on, by producer, over all rounds.
    """

    rounds: int
    published: int
    used_by_producer: dict[str, int]


@dataclass(frozen=True, slots=True)
class _Candidate:
    """An external group with this node's scores, as the sampler sees it."""

    buffered: BufferedGroup
    scored: ScoredGroup

    @property
    def producer(self) -> str:
        return self.buffered.producer

    @property
    def rewards(self) -> list[float]:
        return self.scored.rewards


class Node:
    """A running SAPO node (an async context manager).

    Args:
        name: a human name for logs and tables.
        learner: the node's model, tasks, generator, verifier and trainer.
        publisher: signs and publishes the node's groups (its key is the node identity).
        collector: admits other nodes' groups (not yet started; the node runs it).
        swarm: the swarm's name (stamped into every group).
        local: I, own groups trained on per round.
        external: J, external groups trained on per round.
        sampler: ``"paper"`` or ``"topk"``.
        per_producer_cap: at most this many external groups from one producer per round.
        max_staleness_rounds: external groups more than this many rounds behind the newest
            held from their producer are not drawn (and are dropped).
        recorder: journals round commitments for the ledger (None: no ledger).
        rounds: stop after this many rounds (None: until :meth:`leave`).
        seed: the swarm seed (common random numbers for external sampling).
        offload: run generation and training in worker threads (several nodes per process).
        limiter: worker-thread limiter shared by the nodes of a process.
        include_tokens: share token ids and log-probs (receivers with the same tokenizer
            use them for importance weights).
        checkpoint_dir: where checkpoints go (None: no checkpoints).
        checkpoint_every: save a checkpoint every this many rounds (and always on leave).
        drain_timeout_s: how long :meth:`leave` lets the round in progress finish before
            abandoning it.
        overlap: generate round r+1 while round r trains. Needs a generator with weights
            of its own (``build_learner(overlap=True)`` copies the model; vLLM has its own):
            the next round is sampled one policy version behind, and the generator is
            synced once both halves are done.
        sleep_mode: put the generation engine to sleep around each training step (vLLM:
            KV cache released, weights offloaded) and wake it with the new weights, probed.
    """

    def __init__(
        self,
        *,
        name: str,
        learner: LocalTrainerNode,
        publisher: Publisher,
        collector: Collector,
        swarm: str,
        local: int = 4,
        external: int = 4,
        sampler: SamplerPolicy = "paper",
        per_producer_cap: int | None = None,
        max_staleness_rounds: int = 4,
        recorder: Recorder | None = None,
        rounds: int | None = None,
        seed: int = 0,
        offload: bool = True,
        limiter: anyio.CapacityLimiter | None = None,
        include_tokens: bool = True,
        checkpoint_dir: Path | None = None,
        checkpoint_every: int = 10,
        drain_timeout_s: float = ACTOR_DRAIN_TIMEOUT_S,
        overlap: bool = False,
        sleep_mode: bool = False,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        if local < 0 or external < 0 or local + external == 0:
            raise ValueError(
                f"need local >= 0, external >= 0, local + external > 0; got {local}/{external}"
            )
        self.name = name
        self.learner = learner
        self.publisher = publisher
        self.collector = collector
        self.swarm = swarm
        self.local = local
        self.external = external
        self.sampler: SamplerPolicy = sampler
        self.per_producer_cap = per_producer_cap
        self.max_staleness_rounds = max_staleness_rounds
        self.recorder = recorder
        self.max_rounds = rounds
        self.seed = seed
        self.offload = offload
        self.limiter = limiter
        self.include_tokens = include_tokens
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.drain_timeout_s = drain_timeout_s
        self.overlap = overlap
        self.sleep_mode = sleep_mode
        if sleep_mode and overlap:
            raise ValueError(
                "sleep_mode and overlap exclude each other (the engine sleeps while training)"
            )
        if sleep_mode and not hasattr(learner.generator, "wake_up"):
            raise ValueError("sleep_mode needs a generator that can sleep (the vLLM backend)")
        self._next: SharedRound | None = None
        self._generator_version = learner.policy_version
        self._saved_round = learner.round
        self._stopping = False
        self._loop_done = anyio.Event()
        self._loop_scope = anyio.CancelScope()
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._reports: deque[RoundReport] = deque(maxlen=10_000)
        self._report_count = 0
        self._new_report = anyio.Event()
        self._running = anyio.Event()
        self._running.set()
        self._done = anyio.Event()
        self._failure: BaseException | None = None
        self._published = 0
        self._used: Counter[str] = Counter()
        self._rounds_done = 0
        self._extra_stack: AsyncExitStack = AsyncExitStack()
        self._log = get_logger("node", node=self.address, node_name=name)

    # --- identity and state ------------------------------------------------------------

    @property
    def address(self) -> str:
        """The node's Ethereum address (its identity everywhere)."""
        return self.publisher.address

    @property
    def round(self) -> int:
        """The next round this node will run."""
        return self.learner.round

    @property
    def stopping(self) -> bool:
        """True once :meth:`leave` was called."""
        return self._stopping

    def _stop_requested(self) -> bool:
        # A method, not the property, so type checkers do not assume it cannot change.
        return self._stopping

    @property
    def reports(self) -> list[RoundReport]:
        """Reports kept so far (the most recent 10,000)."""
        return list(self._reports)

    def stats(self) -> NodeStats:
        """Totals published and consumed so far."""
        return NodeStats(self._rounds_done, self._published, dict(self._used))

    def add_cleanup(self, cm: Any) -> None:
        """Close ``cm`` (an async context manager already entered, or anything with
        ``aclose``) when the node leaves, after the node's own actors."""
        if hasattr(cm, "__aexit__"):
            self._extra_stack.push_async_exit(cm)
        else:
            self._extra_stack.push_async_callback(cm.aclose)

    # --- life cycle --------------------------------------------------------------------

    async def start(self, *, loop: bool = True) -> None:
        """Start the collector (and recorder) and, with ``loop``, the round loop.

        Must be paired with :meth:`leave` in the same task (``async with`` does both).
        """
        if self._stack is not None:
            return
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            stack.push_async_exit(self._extra_stack)
            if self.recorder is not None:
                await stack.enter_async_context(self.recorder)
            tg = await stack.enter_async_context(anyio.create_task_group())
            self._tg = tg
            await tg.start(self.collector.run)
            stack.push_async_callback(self.collector.stop)
            if loop:
                tg.start_soon(self._loop)
            else:
                self._loop_done.set()
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._log.info("node_started", swarm=self.swarm, local=self.local, external=self.external)

    async def leave(self) -> None:
        """Drain and stop: let the round in progress finish (abandon it after
        ``drain_timeout_s``), save a checkpoint, stop the collector, flush the recorder's
        journal, and release resources. Idempotent; the drain and checkpoint are shielded
        from cancellation."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        with anyio.CancelScope(shield=True):
            self._stopping = True
            self._running.set()
            with anyio.move_on_after(self.drain_timeout_s) as scope:
                await self._loop_done.wait()
            if scope.cancelled_caught:
                self._log.warning("round_abandoned", round=self.learner.round)
            self._loop_scope.cancel()
            try:
                await self.save_checkpoint()
            except SapoError as exc:
                self._log.error("checkpoint_failed", error=str(exc))
        # Outside the shield: the stack holds task groups entered before it, which must be
        # exited from the scope they were entered in (each part shields its own cleanup).
        await self._close(stack)

    async def save_checkpoint(self) -> Path | None:
        """Checkpoint model, optimizer, round and RNG states now (no-op without a
        checkpoint directory or when nothing changed since the last one).

        Raises:
            CheckpointError: the write failed.
        """
        if self.checkpoint_dir is None or self._saved_round == self.learner.round:
            return None
        path: Path = await anyio.to_thread.run_sync(self.learner.save, self.checkpoint_dir)
        self._saved_round = self.learner.round
        self._log.info("checkpoint_saved", round=self.learner.round, path=str(path))
        return path

    async def _close(self, stack: AsyncExitStack) -> None:
        try:
            await stack.aclose()
        finally:
            self._done.set()
            self._new_report.set()
            self._log.info("node_left", rounds=self._rounds_done, published=self._published)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.leave()

    def request_stop(self) -> None:
        """Ask the round loop to stop after the round in progress (non-blocking; safe from
        any task, e.g. a signal handler). :meth:`leave` still has to run."""
        self._stopping = True
        self._running.set()

    def abandon_round(self) -> None:
        """Cancel the round in progress now (after a drain deadline passed)."""
        self._stopping = True
        self._running.set()
        # Only the loop's own scope: the node's task group was entered in the caller's
        # task, so cancelling it would cancel the caller too.
        self._loop_scope.cancel()

    async def wait_stopped(self) -> None:
        """Wait until the round loop has ended."""
        await self._loop_done.wait()

    def pause(self) -> None:
        """Stop starting new rounds (the others keep going; nobody waits for this node)."""
        self._running = anyio.Event()

    def resume(self) -> None:
        """Start rounds again after :meth:`pause`."""
        self._running.set()

    async def rounds(self) -> AsyncIterator[RoundReport]:
        """Yield a report per completed round, from the first one kept, until the node
        stops.

        Raises:
            SapoError: the round loop failed (the original error is the cause).
        """
        index = 0
        while True:
            first = self._report_count - len(self._reports)
            index = max(index, first)
            while index < self._report_count:
                yield self._reports[index - first]
                index += 1
                first = self._report_count - len(self._reports)
            if self._failure is not None:
                raise SapoError(f"node {self.name} failed") from self._failure
            if self._done.is_set():
                return
            event = self._new_report
            await event.wait()

    async def wait_rounds(self, count: int, *, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until this node has completed ``count`` rounds.

        Raises:
            TimeoutError: not in time.
            ActorStopped: the node stopped first.
        """
        with anyio.fail_after(timeout):
            while self._rounds_done < count:
                if self._failure is not None:
                    raise SapoError(f"node {self.name} failed") from self._failure
                if self._done.is_set():
                    raise ActorStopped(self.name, "stopped")
                await self._new_report.wait()

    # --- the round ---------------------------------------------------------------------

    async def _loop(self) -> None:
        with self._loop_scope:
            await self._loop_body()

    async def _loop_body(self) -> None:
        try:
            while not self.stopping and (
                self.max_rounds is None or self._rounds_done < self.max_rounds
            ):
                await self._running.wait()
                if self._stop_requested():  # leave() was called while paused
                    break
                if self.overlap:
                    await self._overlapped_step()
                else:
                    await self.step()
                if (self.learner.round - self._saved_round) >= self.checkpoint_every:
                    await self.save_checkpoint()
        except Exception as exc:
            self._failure = exc
            self._log.exception("node_failed", error=repr(exc))
        finally:
            self._loop_done.set()
            self._done.set()
            self._new_report.set()

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

    async def step(self) -> RoundReport:
        """Run one whole round (share, then train)."""
        shared = await self.share_round()
        return await self.train_round(shared)

    async def _run_sync(self, fn: Any, *args: Any) -> Any:
        if self.offload:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)
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
                swarm=self.swarm,
                producer=self.address,
                producer_round=r,
                policy_version=policy_version,
                model_id=learner.model_id,
                tokenizer_id=learner.tokenizer_id,
                include_tokens=self.include_tokens,
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

        async def one(i: int, g: RolloutGroup) -> None:
            try:
                hashes[i] = (await self.publisher.publish(g)).rollout_hash
            except (PublishError, TransportUnavailable) as exc:
                # Counted by the publisher; the round still trains on its own groups.
                self._log.warning("round_publish_failed", error=str(exc))

        async with anyio.create_task_group() as tg:
            for i, g in enumerate(groups):
                tg.start_soon(one, i, g)
        done = [h for h in hashes if h is not None]
        self._published += len(done)
        return done

    def _fresh_candidates(self) -> tuple[list[BufferedGroup], dict[str, int]]:
        """Buffered external groups within the staleness bound, in a canonical order."""
        pool = self.collector.candidates(exclude_producers=(self.address,))
        newest: dict[str, int] = {}
        for b in pool:
            newest[b.producer] = max(newest.get(b.producer, -1), b.group.producer_round)
        fresh: list[BufferedGroup] = []
        stale: list[BufferedGroup] = []
        for b in pool:
            lag = newest[b.producer] - b.group.producer_round
            (fresh if lag <= self.max_staleness_rounds else stale).append(b)
        if stale:
            self.collector.take(b.rollout_hash for b in stale)
        # Sorting by hash makes the sampler's draw depend only on the pool's contents and
        # the seeded rng, not on delivery order (common random numbers across runs).
        fresh.sort(key=lambda b: b.rollout_hash)
        return fresh, newest

    def _select(self, shared: SharedRound) -> tuple[list[ScoredGroup], list[_Candidate], Any]:
        fresh, newest = self._fresh_candidates()
        rng = random.Random(
            round_seed(self.seed, self.learner.config.node_index, shared.round, "external")
        )

        def score(b: BufferedGroup) -> _Candidate:
            return _Candidate(b, self.learner.score_external(b.group))

        def reason(_b: BufferedGroup, exc: Exception) -> str:
            return exc.reason if isinstance(exc, RejectedInput) else "score_error"

        selection = select_external(
            fresh,
            self.external,
            score,
            rng=rng,
            policy=self.sampler,
            per_producer_cap=self.per_producer_cap,
            on_error=reason,
        )
        local = select_local(shared.local, self.local)
        return local, selection.chosen, (selection, newest)

    async def train_round(self, shared: SharedRound, *, sync: bool = True) -> RoundReport:
        """Choose I local and J external groups, take one GRPO step, journal the round.

        Args:
            shared: the round's first half.
            sync: push the new weights into the generator afterwards (the overlapped loop
                syncs itself once the next round's generation is done).
        """
        t0 = time.perf_counter()
        local, chosen, (selection, newest) = await self._run_sync(self._select, shared)
        if chosen:
            self.collector.take(c.buffered.rollout_hash for c in chosen)
        t1 = time.perf_counter()
        batch = [*local, *(c.scored for c in chosen)]
        sleeper = self.learner.generator if self.sleep_mode else None
        if sleeper is not None:
            # Release the engine's KV cache (and at level 2 its weights) for the step.
            await sleeper.sleep()  # type: ignore[attr-defined]
        step = await self._run_sync(self.learner.train, batch)
        if sleeper is not None:
            # wake_up loads the new weights and runs the log-prob probe after waking.
            await sleeper.wake_up(  # type: ignore[attr-defined]
                self.learner.model.named_parameters(),
                policy_version=self.learner.policy_version,
            )
            self._generator_version = self.learner.policy_version
        elif sync:
            await self._sync_generator()
        t2 = time.perf_counter()
        used: Counter[str] = Counter(c.producer for c in chosen)
        self._used.update(used)
        by_producer: dict[str, list[bytes]] = {}
        for c in chosen:
            by_producer.setdefault(c.producer, []).append(c.buffered.rollout_hash)
        pending = confirmed = 0
        if self.recorder is not None:
            try:
                self.recorder.record_nowait(
                    RoundCommitment(
                        node=self.address,
                        round=shared.round,
                        policy_version=shared.policy_version,
                        rollout_hashes=shared.hashes,
                        external_hashes=by_producer,
                    )
                )
            except (RejectedInput, ActorStopped) as exc:
                self._log.error("commitment_not_journaled", round=shared.round, error=str(exc))
            rs = self.recorder.statistics()
            pending, confirmed = rs.pending, rs.landed
        self.learner.round = shared.round + 1
        rewards = [c.reward for g in shared.local for c in g.completions]
        staleness = [newest[c.producer] - c.buffered.group.producer_round for c in chosen]
        report = RoundReport(
            node=self.address,
            name=self.name,
            round=shared.round,
            policy_version=self.learner.policy_version,
            reward_mean=sum(rewards) / max(len(rewards), 1),
            informative_local=sum(g.informative for g in shared.local),
            local_used=len(local),
            groups_shared=len(shared.hashes),
            external_used=dict(used),
            external_scored=selection.scored,
            external_uninformative=selection.dropped_uninformative,
            external_failed=dict(selection.failed),
            staleness_rounds=sum(staleness) / len(staleness) if staleness else 0.0,
            rejections=dict(self.collector.statistics().rejected),
            commitments_pending=pending,
            commitments_confirmed=confirmed,
            generate_s=shared.generate_s,
            publish_s=shared.publish_s,
            score_s=shared.score_s + (t1 - t0),
            train_s=t2 - t1,
            step={k: v for k, v in asdict(step).items() if k != "extra"},
        )
        self._rounds_done += 1
        self._reports.append(report)
        self._report_count += 1
        event, self._new_report = self._new_report, anyio.Event()
        event.set()
        self._log.info(
            "round_completed",
            round=report.round,
            reward=round(report.reward_mean, 4),
            external=report.external_total,
            shared=report.groups_shared,
        )
        return report
