"""The collector: admits other nodes' rollout groups into a bounded buffer.

Owns the receiver side of the fabric: it consumes a transport subscription, decodes and
verifies every message, counts and logs every rejection by reason, and keeps a bounded
buffer of verified external groups from which the swarm's sampler draws.

Checks, cheapest first (the reason label a rejection is counted under in brackets):
size [oversize], envelope [malformed_envelope], schema version [schema_version], strict
group decoding [malformed_group], swarm [wrong_swarm], shape [invalid_group], subject vs
task family [wrong_subject], message id vs rollout hash [hash_mismatch], already admitted
[duplicate], signature [bad_signature] and signer vs claimed producer [signer_mismatch],
time stamp in the future [from_future], age [stale_age], producer round lag [stale_round],
then the optional receiver-side ``extra_check`` [its own reason]. A group from this node
itself is skipped (counted as ``skipped_own``) unless ``include_own``. A group whose
claimed producer the optional ``blocked`` hook names (a quarantined producer) is rejected
right after decoding [quarantined], before the signature is checked: a forger cannot put a
producer into quarantine (that takes verified drops), so the claim needs no proof to be
refused. A hash the node trained on is refused for as long as a replay could pass the age
check [already_trained], however many other groups arrive meanwhile.

After admission a receiver may :meth:`Collector.drop` a buffered group (content checks,
failed scoring), counted by reason under ``dropped``, so it is never scored twice.

Deliberately does not know about tasks, rewards or models: re-deriving the task and the
log-prob plausibility check plug in through ``extra_check``. It does not decide what to
train on either: :meth:`Collector.candidates` lists what is admissible and
:meth:`Collector.sample` draws uniformly; the sampler scores and picks.

Invariants:
    * the collector is not thread-safe: admission, :meth:`~Collector.candidates`,
      :meth:`~Collector.take`, :meth:`~Collector.drop` and :meth:`~Collector.mark_trained`
      run on the event loop's thread (worker threads get immutable snapshots; a call from
      another thread raises rather than race the loop's inserts);
    * nothing a peer sends can raise out of the consume loop; every message ends up
      admitted, skipped, or counted under exactly one rejection reason;
    * a rollout hash is admitted at most once while it could still pass the age check
      (replays are counted as ``duplicate``);
    * the buffer never holds more than ``buffer_max_groups`` groups, nor (when read) a group
      older than ``buffer_max_age_s``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import anyio

from sapo_async.actors import Actor, ActorState
from sapo_async.backoff import NATS_JOIN_BACKOFF, retry_async
from sapo_async.errors import ActorStopped, RejectedInput, TransportUnavailable
from sapo_async.fabric.buffered import BufferedGroup, CollectorStatistics, Counters
from sapo_async.fabric.transport.base import StartAt, Subscription, Transport, validate_token
from sapo_async.fabric.transport.rotating import subscribe_planned
from sapo_async.fabric.transport.shards import ShardPlan, parse_rollouts_subject, producer_leaf
from sapo_async.limits import (
    BUFFER_MAX_AGE_S,
    BUFFER_MAX_GROUPS,
    FETCH_BATCH,
    FETCH_TIMEOUT_S,
    MAX_CLOCK_SKEW_S,
    MAX_GROUP_BYTES,
    MAX_ROUND_LAG,
    NATS_JOIN_TIMEOUT_S,
    SEEN_HASHES_MAX,
)
from sapo_async.logs import get_logger
from sapo_async.wire.rollout import RolloutGroup
from sapo_async.wire.signing import decode_envelope, recover_signer

__all__ = ["BufferedGroup", "Collector", "CollectorStatistics", "ExtraCheck"]

ExtraCheck = Callable[[RolloutGroup], None]
"""A receiver-side check: returns to admit, raises :class:`RejectedInput` (with a reason)
to reject. Anything else it raises is counted as ``check_error``."""

_FINISH_REASONS = frozenset({"stop", "length"})


class Collector(Actor[None]):
    """Consumes a transport subscription into a bounded buffer of verified groups.

    Use as an actor (``async with Collector(...)``, or ``task_group.start(c.run)``); the
    admission logic is also callable directly through :meth:`ingest`.

    Args:
        transport: where groups come from; its swarm is the only one admitted.
        own_address: this node's address; its groups are skipped unless ``include_own``.
        include_own: admit this node's own groups too.
        families: task families to subscribe to (``None``: all).
        start: where a new consumer starts (default: new messages only).
        durable: durable consumer name, to resume across restarts of this node.
        shards: read k of S shards, rotating (``None``: everything).
        extra_check: receiver-side check run last on each otherwise valid group.
        max_group_bytes: cap on a group's encoded size.
        buffer_max_groups: buffer bound by count (oldest admitted evicted first).
        buffer_max_age_s: buffer bound by group age (``created_at_ms``), also the staleness
            limit at admission.
        max_round_lag: reject groups whose producer round is more than this behind the
            newest admitted from that producer.
        max_clock_skew_s: reject groups stamped further than this in the future.
        blocked: names producers whose groups are refused before any other work (the
            node's quarantine); checked on the claimed producer, right after decoding.
        clock: unix-seconds clock (injectable for tests).
        name: actor name.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        own_address: str | None = None,
        include_own: bool = False,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
        shards: ShardPlan | None = None,
        extra_check: ExtraCheck | None = None,
        max_group_bytes: int = MAX_GROUP_BYTES,
        buffer_max_groups: int = BUFFER_MAX_GROUPS,
        buffer_max_age_s: float = BUFFER_MAX_AGE_S,
        max_round_lag: int = MAX_ROUND_LAG,
        max_clock_skew_s: float = MAX_CLOCK_SKEW_S,
        fetch_batch: int = FETCH_BATCH,
        fetch_max_wait: float = FETCH_TIMEOUT_S,
        blocked: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.time,
        name: str = "collector",
    ) -> None:
        super().__init__(name, mailbox_size=0)
        if buffer_max_groups < 1 or buffer_max_age_s <= 0 or max_round_lag < 0:
            raise ValueError("buffer bounds must be positive and max_round_lag >= 0")
        self._transport = transport
        self.swarm = transport.swarm
        self.own_address = own_address
        self.include_own = include_own
        self._families = families
        self._start = start
        self._durable = durable
        self.shards = shards
        self.extra_check = extra_check
        self._max_group_bytes = max_group_bytes
        self._max_groups = buffer_max_groups
        self._max_age_s = buffer_max_age_s
        self._max_round_lag = max_round_lag
        self._max_skew_s = max_clock_skew_s
        self._fetch_batch = fetch_batch
        self._fetch_max_wait = fetch_max_wait
        self._clock = clock
        self.blocked = blocked
        self._owner: int | None = None
        self._trained: OrderedDict[bytes, float] = OrderedDict()
        self._buffer: OrderedDict[bytes, BufferedGroup] = OrderedDict()
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._newest_round: dict[str, int] = {}
        self._counts = Counters()
        self._sub: Subscription | None = None
        self._admitted = anyio.Event()
        self._log = get_logger("collector", actor=name, swarm=self.swarm)

    # --- actor hooks -----------------------------------------------------------------

    async def _setup(self) -> None:
        self._owner = threading.get_ident()

        # The first subscription retries while JetStream is unreachable (a server of the
        # cluster restarting, a consumer leader being elected) for as long as a joining
        # node retries NATS, instead of failing the node at start.
        def retried(attempt: int, exc: Exception, delay: float) -> None:
            self._log.warning("subscribe_retry", error=str(exc), retry_in_s=delay)

        self._sub = await retry_async(
            self._subscribe,
            retry_on=(TransportUnavailable,),
            schedule=NATS_JOIN_BACKOFF,
            timeout_s=NATS_JOIN_TIMEOUT_S,
            on_retry=retried,
        )

    async def _subscribe(self) -> Subscription:
        if self.shards is None:
            return await self._transport.subscribe(
                families=self._families, start=self._start, durable=self._durable
            )
        return await subscribe_planned(
            self._transport,
            families=self._families,
            plan=self.shards,
            key=self.own_address or self.name,
            start=self._start,
            durable=self._durable,
        )

    async def _serve(self) -> None:
        assert self._sub is not None
        while True:
            deliveries = await self._sub.fetch(self._fetch_batch, self._fetch_max_wait)
            for delivery in deliveries:
                self.ingest(delivery.data, msg_id=delivery.msg_id, subject=delivery.subject)
                # Acked whatever the verdict: a rejected message must not come again either.
                await delivery.ack()
            self._evict_expired()

    async def _teardown(self) -> None:
        if self._sub is not None:
            await self._sub.aclose()
        # Wake waiters so they see the stopped state instead of hanging.
        self._admitted.set()

    # --- admission ---------------------------------------------------------------------

    def ingest(
        self, data: bytes, *, msg_id: str | None = None, subject: str | None = None
    ) -> BufferedGroup | None:
        """Verify one message and admit it; never raises on bad input.

        Args:
            data: envelope bytes as received.
            msg_id: the transport's message id (claimed rollout hash, hex), if any.
            subject: the subject it came on, if any.

        Returns:
            The admitted group, or ``None`` if it was rejected or skipped.
        """
        self._check_thread()
        self._counts.received += 1
        try:
            admitted = self._admit(data, msg_id, subject)
        except RejectedInput as exc:
            self._counts.rejected[exc.reason] += 1
            self._log.info(
                "rollout_rejected",
                reason=exc.reason,
                detail=exc.detail[:200],
                rollout_hash=exc.rollout_hash,
                producer=exc.producer,
            )
            return None
        except Exception as exc:
            # A bug in a check must not kill the node: count it loudly and go on.
            self._counts.rejected["internal_error"] += 1
            self._log.exception("rollout_check_crashed", error=repr(exc))
            return None
        return admitted

    def _admit(self, data: bytes, msg_id: str | None, subject: str | None) -> BufferedGroup | None:
        signed, group, digest = decode_envelope(data, max_bytes=self._max_group_bytes)
        hex_hash = digest.hex()

        def reject(reason: str, detail: str = "") -> RejectedInput:
            return RejectedInput(reason, detail, rollout_hash=hex_hash, producer=group.producer)

        if group.swarm != self.swarm:
            raise reject("wrong_swarm", f"{group.swarm!r} is not {self.swarm!r}")
        if self.blocked is not None and self.blocked(group.producer):
            raise reject("quarantined")
        _check_shape(group, reject)
        if subject is not None:
            where = parse_rollouts_subject(self.swarm, subject)
            if where is None or where[0] != group.task.family:
                raise reject("wrong_subject", f"{group.task.family!r} arrived on {subject!r}")
            # The leaf is a function of (family, producer): a group on another leaf is a
            # producer spraying shards it does not belong to.
            if where[1] is not None and where[1] != producer_leaf(where[0], group.producer):
                raise reject("wrong_shard", f"{group.producer} is not on leaf {where[1]}")
        if msg_id is not None and msg_id != hex_hash:
            raise reject("hash_mismatch", f"message id {msg_id[:80]!r} is not the rollout hash")
        if digest in self._trained:
            raise reject("already_trained")
        if digest in self._seen:
            raise reject("duplicate")
        try:
            signer = recover_signer(digest, signed.signature)
        except RejectedInput as exc:
            raise reject(exc.reason, exc.detail) from exc
        if signer != group.producer:
            raise reject("signer_mismatch", f"signed by {signer}")
        if group.producer == self.own_address and not self.include_own:
            self._counts.skipped_own += 1
            return None
        now = self._clock()
        age_s = now - group.created_at_ms / 1000
        if age_s < -self._max_skew_s:
            raise reject("from_future", f"created {-age_s:.0f} s in the future")
        if age_s > self._max_age_s:
            raise reject("stale_age", f"{age_s:.0f} s old > {self._max_age_s:.0f} s")
        newest = self._newest_round.get(group.producer, group.producer_round)
        if group.producer_round < newest - self._max_round_lag:
            raise reject("stale_round", f"round {group.producer_round} < {newest} - lag")
        if self.extra_check is not None:
            try:
                self.extra_check(group)
            except RejectedInput as exc:
                raise reject(exc.reason, exc.detail) from exc
            except Exception as exc:
                raise reject("check_error", repr(exc)) from exc
        return self._insert(BufferedGroup(group, digest, now))

    def _insert(self, item: BufferedGroup) -> BufferedGroup:
        self._remember(item.rollout_hash, item.received_at)
        producer, rnd = item.producer, item.group.producer_round
        if rnd > self._newest_round.get(producer, -1):
            self._newest_round[producer] = rnd
            floor = rnd - self._max_round_lag
            for key in [
                k
                for k, b in self._buffer.items()
                if b.producer == producer and b.group.producer_round < floor
            ]:
                del self._buffer[key]
                self._counts.evicted["round"] += 1
        self._buffer[item.rollout_hash] = item
        while len(self._buffer) > self._max_groups:
            self._buffer.popitem(last=False)
            self._counts.evicted["count"] += 1
        self._counts.accepted += 1
        self._admitted.set()
        self._admitted = anyio.Event()
        return item

    def _remember(self, digest: bytes, now: float) -> None:
        self._seen[digest] = now
        horizon = self._horizon(now)
        while self._seen:
            oldest, seen_at = next(iter(self._seen.items()))
            if seen_at >= horizon and len(self._seen) <= SEEN_HASHES_MAX:
                break
            del self._seen[oldest]

    def _horizon(self, now: float) -> float:
        """Replays received before this time would fail the age check anyway."""
        return now - self._max_age_s - self._max_skew_s

    def _evict_expired(self) -> None:
        horizon = self._horizon(self._clock())
        while self._trained and next(iter(self._trained.values())) < horizon:
            self._trained.popitem(last=False)
        cutoff_ms = (self._clock() - self._max_age_s) * 1000
        for key in [k for k, b in self._buffer.items() if b.group.created_at_ms < cutoff_ms]:
            del self._buffer[key]
            self._counts.evicted["age"] += 1

    # --- reading -------------------------------------------------------------------------

    def candidates(self, exclude_producers: Iterable[str] = ()) -> list[BufferedGroup]:
        """The admissible groups now, oldest admitted first, minus excluded producers.

        Returns:
            A new list (a snapshot a worker thread may read while the loop admits more).
        """
        self._check_thread()
        self._evict_expired()
        excluded = frozenset(exclude_producers)
        return [b for b in self._buffer.values() if b.producer not in excluded]

    def sample(
        self,
        k: int,
        *,
        exclude_producers: Iterable[str] = (),
        rng: random.Random | None = None,
    ) -> list[BufferedGroup]:
        """Draw up to ``k`` distinct groups uniformly (fewer if fewer are buffered).

        Args:
            k: how many.
            exclude_producers: producers whose groups are not eligible.
            rng: the random source (a seeded one makes runs reproducible).

        Returns:
            The drawn groups; they stay in the buffer (see :meth:`take`).
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        pool = self.candidates(exclude_producers)
        return (rng or random.Random()).sample(pool, min(k, len(pool)))

    def take(self, rollout_hashes: Iterable[bytes]) -> list[BufferedGroup]:
        """Remove the given groups from the buffer and return those that were there."""
        self._check_thread()
        taken = []
        for digest in rollout_hashes:
            item = self._buffer.pop(digest, None)
            if item is not None:
                taken.append(item)
                self._counts.evicted["taken"] += 1
        return taken

    def drop(self, rollout_hashes: Iterable[bytes], reason: str) -> int:
        """Remove buffered groups the receiver refused after admission (a content check or
        failed scoring), counted under ``reason``, so none is scored again.

        Returns:
            How many were in the buffer.
        """
        self._check_thread()
        dropped = 0
        for digest in rollout_hashes:
            item = self._buffer.pop(digest, None)
            if item is not None:
                dropped += 1
                self._log.info(
                    "rollout_dropped",
                    reason=reason,
                    rollout_hash=digest.hex(),
                    producer=item.producer,
                )
        self._counts.dropped[reason] += dropped
        return dropped

    def mark_trained(self, rollout_hashes: Iterable[bytes]) -> None:
        """Remember hashes the node trained on: they are refused (``already_trained``) for
        as long as their age could still pass, whatever the number of other hashes seen.

        Bounded by time alone: a node trains on J groups a round, so this holds J x the
        rounds of one ``buffer_max_age_s``, not a flood's worth.
        """
        self._check_thread()
        now = self._clock()
        for digest in rollout_hashes:
            self._trained[digest] = now
            self._trained.move_to_end(digest)

    def _check_thread(self) -> None:
        ident = threading.get_ident()
        if self._owner is None:
            self._owner = ident
        elif ident != self._owner:
            raise RuntimeError(
                f"{self.name} was called from another thread: the buffer belongs to the "
                "event loop (pass worker threads a snapshot from candidates())"
            )

    async def wait_accepted(self, count: int, *, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until at least ``count`` groups were admitted in total.

        Args:
            count: the total to wait for.
            timeout: seconds to wait.

        Raises:
            TimeoutError: not reached in time.
            ActorStopped: the collector stopped (or was never started) before that.
        """
        with anyio.fail_after(timeout):
            while self._counts.accepted < count:
                if self.state not in (ActorState.STARTING, ActorState.RUNNING):
                    raise ActorStopped(self.name, self.state.value)
                await self._admitted.wait()

    def statistics(self) -> CollectorStatistics:  # type: ignore[override]
        """A snapshot of counters and buffer (``.actor`` has the runtime's view)."""
        c = self._counts
        return CollectorStatistics(
            actor=super().statistics(),
            received=c.received,
            accepted=c.accepted,
            skipped_own=c.skipped_own,
            rejected=dict(c.rejected),
            buffered=len(self._buffer),
            evicted=dict(c.evicted),
            producers=len({b.producer for b in self._buffer.values()}),
            dropped=dict(c.dropped),
        )


def _check_shape(group: RolloutGroup, reject: Callable[[str, str], RejectedInput]) -> None:
    """Field-level sanity the schema types cannot express."""
    if not group.completions:
        raise reject("invalid_group", "no completions")
    try:
        validate_token(group.task.family, field="family")
    except ValueError as exc:
        raise reject("invalid_group", str(exc)) from exc
    if not (group.producer.startswith("0x") and len(group.producer) == 42):
        raise reject("invalid_group", f"producer {group.producer[:50]!r} is not an address")
    for completion in group.completions:
        if completion.finish_reason not in _FINISH_REASONS:
            raise reject("invalid_group", f"finish_reason {completion.finish_reason[:20]!r}")
        ids, lps = completion.token_ids, completion.logprobs
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise reject("invalid_group", "token_ids and logprobs differ in length")
        if lps is not None and any(not (lp <= 0.0) for lp in lps):
            raise reject("invalid_group", "a log-probability is positive or NaN")
