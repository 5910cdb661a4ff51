"""The collector: admits other nodes' rollout groups into a bounded buffer.

Owns the receiver side of the fabric: it consumes a transport subscription, decodes and
verifies every message, counts and logs every rejection by reason, and keeps a bounded
buffer of verified external groups from which the swarm's sampler draws.

Admission is one pipeline (:mod:`.admission`; docs/admission.md lists it in order):
decoding [oversize, malformed_envelope, schema_version, malformed_group]; the checks before
the signature, on what the message claims (wire: swarm, shape, subject and shard, message
id; then the collector's own replay sets [already_trained, duplicate]; then the checks the
node gave, such as quarantine, preset, sizes and the producer-round cap); the signature
(:func:`~sapo_async.wire.signing.verify_signer`) [bad_signature, high_s_signature,
signer_mismatch]; this node's own groups skipped (counted as ``skipped_own``) unless
``include_own``; the checks after the signature (age [from_future, stale_age], round lag
[stale_round], then any the node gave). The checks are handed to the constructor; nothing
is patched into a live collector. A hash the node trained on is refused for as long as a
replay could pass the age check [already_trained], however many other groups arrive
meanwhile.

After admission a receiver may :meth:`Collector.drop` a buffered group (content checks,
failed scoring), counted by reason under ``dropped``, so it is never scored twice.

Deliberately does not know about tasks, rewards or models: the node's checks plug in
through ``checks`` and content checks run in the round. It does not decide what to train
on either: :meth:`Collector.candidates` lists what is admissible; the sampler scores and
picks.

Invariants:
    * the collector is not thread-safe: admission, :meth:`~Collector.candidates`,
      :meth:`~Collector.take`, :meth:`~Collector.drop` and :meth:`~Collector.mark_trained`
      run on the event loop's thread (worker threads get immutable snapshots; a call from
      another thread raises rather than race the loop's inserts);
    * nothing a peer sends can raise out of the consume loop; every message ends up
      admitted, skipped, or counted under exactly one rejection reason;
    * a rollout hash is admitted at most once while it could still pass the age check
      (replays are counted as ``duplicate``), and so is a content
      (:func:`~sapo_async.wire.rollout.content_hash`: the same task, question and
      completion texts under another key or time stamp, also ``duplicate``);
    * the buffer never holds more than ``buffer_max_groups`` groups, nor (when read) a group
      older than ``buffer_max_age_s``.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import anyio
from cachetools import LRUCache

from sapo_async.actors import Actor, ActorState
from sapo_async.backoff import NATS_JOIN_BACKOFF, retry_async
from sapo_async.errors import ActorStopped, RejectedInput, TransportUnavailable
from sapo_async.fabric.admission import (
    AgeCheck,
    Arrival,
    Check,
    CountsAdmitted,
    MessageIdCheck,
    RoundLagCheck,
    ShapeCheck,
    Stage,
    SubjectCheck,
    SwarmCheck,
    by_stage,
)
from sapo_async.fabric.buffered import BufferedGroup, CollectorStatistics, Counters
from sapo_async.fabric.transport.base import StartAt, Subscription, Transport
from sapo_async.fabric.transport.rotating import subscribe_planned
from sapo_async.fabric.transport.shards import ShardPlan
from sapo_async.limits import (
    BUFFER_MAX_AGE_S,
    BUFFER_MAX_GROUPS,
    FETCH_BATCH,
    FETCH_TIMEOUT_S,
    MAX_CLOCK_SKEW_S,
    MAX_GROUP_BYTES,
    MAX_ROUND_LAG,
    NATS_JOIN_TIMEOUT_S,
    PRODUCERS_REMEMBERED,
    SEEN_HASHES_MAX,
)
from sapo_async.logs import get_logger
from sapo_async.pulse import Pulse
from sapo_async.wire.reasons import RejectReason
from sapo_async.wire.rollout import content_hash
from sapo_async.wire.signing import decode_envelope, verify_signer

__all__ = ["BufferedGroup", "Collector", "CollectorStatistics"]


class Collector(Actor):
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
        checks: the node's admission checks, in order, each run at its own
            :class:`~sapo_async.fabric.admission.Stage` after the collector's wire checks
            of that stage (a check that raises anything but ``RejectedInput`` is counted
            as ``check_error``).
        max_group_bytes: cap on a group's encoded size.
        buffer_max_groups: buffer bound by count (oldest admitted evicted first).
        buffer_max_age_s: buffer bound by group age (``created_at_ms``), also the staleness
            limit at admission.
        max_round_lag: reject groups whose producer round is more than this behind the
            newest admitted from that producer.
        max_clock_skew_s: reject groups stamped further than this in the future.
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
        checks: Sequence[Check] = (),
        max_group_bytes: int = MAX_GROUP_BYTES,
        buffer_max_groups: int = BUFFER_MAX_GROUPS,
        buffer_max_age_s: float = BUFFER_MAX_AGE_S,
        max_round_lag: int = MAX_ROUND_LAG,
        max_clock_skew_s: float = MAX_CLOCK_SKEW_S,
        fetch_batch: int = FETCH_BATCH,
        fetch_max_wait: float = FETCH_TIMEOUT_S,
        clock: Callable[[], float] | None = None,
        name: str = "collector",
    ) -> None:
        super().__init__(name)
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
        self._max_group_bytes = max_group_bytes
        self._max_groups = buffer_max_groups
        self._max_age_s = buffer_max_age_s
        self._max_round_lag = max_round_lag
        self._max_skew_s = max_clock_skew_s
        self._fetch_batch = fetch_batch
        self._fetch_max_wait = fetch_max_wait
        self._clock = clock or time.time  # looked up now, not at import
        before = (
            SwarmCheck(self.swarm),
            ShapeCheck(),
            SubjectCheck(self.swarm, leaves=transport.leaves),
            MessageIdCheck(),
        )
        after = (AgeCheck(buffer_max_age_s, max_clock_skew_s), RoundLagCheck(max_round_lag))
        self._before: tuple[Check, ...] = (*before, *by_stage(checks, Stage.BEFORE_SIGNATURE))
        self._after: tuple[Check, ...] = (*after, *by_stage(checks, Stage.AFTER_SIGNATURE))
        self._counting = tuple(c for c in checks if isinstance(c, CountsAdmitted))
        self._own_checks = frozenset(id(c) for c in (*before, *after))
        self._owner: int | None = None
        self._trained: OrderedDict[bytes, float] = OrderedDict()
        self._buffer: OrderedDict[bytes, BufferedGroup] = OrderedDict()
        # (created_at_ms, hash) of buffered groups, oldest first: what age eviction pops
        # instead of scanning the whole buffer after every fetch (entries of groups already
        # taken or dropped are skipped when they surface, and compacted away in bulk).
        self._by_age: list[tuple[int, bytes]] = []
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        # The newest round admitted per producer, for the round-lag check, of at most
        # PRODUCERS_REMEMBERED producers (keys are free), the least recently seen (admitted,
        # or named by a message) forgotten first: a producer that keeps sending is seen with
        # its every group. Forgetting one costs only its lag check until its next admitted
        # group; a replay of its old rounds still meets the age and duplicate checks.
        self._newest_round: LRUCache[str, int] = LRUCache(PRODUCERS_REMEMBERED)
        self._counts = Counters()
        self._sub: Subscription | None = None
        self._admitted = Pulse()
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
        self._admitted.fire()

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
            self._counts.rejected[str(exc.reason)] += 1
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
            self._counts.rejected[str(RejectReason.INTERNAL_ERROR)] += 1
            self._log.exception("rollout_check_crashed", error=repr(exc))
            return None
        return admitted

    def _admit(self, data: bytes, msg_id: str | None, subject: str | None) -> BufferedGroup | None:
        envelope = decode_envelope(data, max_bytes=self._max_group_bytes)
        group, digest = envelope.group, envelope.rollout_hash
        now = self._clock()
        arrival = Arrival(
            group, digest, subject, msg_id, now, self._newest_round.get(group.producer)
        )
        for check in self._before:
            self._run(check, arrival)
        if digest in self._trained:
            raise self._rejected(arrival, RejectReason.ALREADY_TRAINED)
        if digest in self._seen:
            raise self._rejected(arrival, RejectReason.DUPLICATE)
        # One experience, however many keys or time stamps it comes under: a group whose
        # content (task, question, completion texts) an admitted group had is refused too.
        # Checked before the signature, remembered only on admission, so a forged message
        # cannot shut out the genuine one.
        content = content_hash(group)
        if content in self._seen:
            raise self._rejected(
                arrival, RejectReason.DUPLICATE, "the same content as an admitted group"
            )
        try:
            verify_signer(envelope)
        except RejectedInput as exc:
            raise self._rejected(arrival, exc.reason, exc.detail) from exc
        if group.producer == self.own_address and not self.include_own:
            self._counts.skipped_own += 1
            return None
        for check in self._after:
            self._run(check, arrival)
        # Counted before the insert (which cannot fail): a counter that raises leaves the
        # message under one reason (internal_error), never admitted as well.
        for counting in self._counting:
            counting.admitted(arrival)
        self._remember(content, now)
        return self._insert(BufferedGroup(group, digest, now))

    def _run(self, check: Check, arrival: Arrival) -> None:
        """One check; its refusal carries the hash and claimed producer, and a node
        check that crashes is counted as ``check_error`` (the collector's own checks'
        crashes are bugs: ``internal_error``)."""
        try:
            check(arrival)
        except RejectedInput as exc:
            raise self._rejected(arrival, exc.reason, exc.detail) from exc
        except Exception as exc:
            if id(check) in self._own_checks:
                raise
            raise self._rejected(arrival, RejectReason.CHECK_ERROR, repr(exc)) from exc

    @staticmethod
    def _rejected(arrival: Arrival, reason: str, detail: str = "") -> RejectedInput:
        return RejectedInput(
            reason,
            detail,
            rollout_hash=arrival.rollout_hash.hex(),
            producer=arrival.group.producer,
        )

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
        heapq.heappush(self._by_age, (item.group.created_at_ms, item.rollout_hash))
        while len(self._buffer) > self._max_groups:
            self._buffer.popitem(last=False)
            self._counts.evicted["count"] += 1
        self._counts.accepted += 1
        self._admitted.fire()
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
        by_age = self._by_age
        while by_age and by_age[0][0] < cutoff_ms:
            _, key = heapq.heappop(by_age)
            if self._buffer.pop(key, None) is not None:
                self._counts.evicted["age"] += 1
        if len(by_age) > 2 * len(self._buffer) + 1024:
            self._by_age = [(b.group.created_at_ms, k) for k, b in self._buffer.items()]
            heapq.heapify(self._by_age)

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
        self._counts.dropped[str(reason)] += dropped
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
