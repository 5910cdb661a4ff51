"""A subscription that reads k of S shards and moves to the next k every epoch.

Owns the reader side of sharding over any transport: it holds one consumer on this
epoch's shard set (``ShardPlan.shards_at``) and, at the first fetch of a new epoch,
closes it and subscribes to the next set. A new consumer the servers cannot make
now (a server restarting) is retried at the next fetch, the reader meanwhile getting
nothing rather than failing. Rotation happens between fetches, when the caller has acked
what it fetched (the collector acks each delivery before fetching again;
anything left unacked is handed back by the closing consumer), so nothing in flight is
lost. A new epoch's consumer starts at new messages: a node reads k/S of what is published
at any time, which is what bounds its ingress.

Deliberately does not know what is in a group, nor choose S and k (``shards.ShardPlan``).
Durable consumers do not rotate (their filter would change under the same name); a node
that reads a subset uses ephemeral consumers, which the server removes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import anyio

from sapo_async.errors import ConfigError, TransportError, TransportUnavailable
from sapo_async.fabric.transport.base import Delivery, StartAt, Subscription, Transport
from sapo_async.fabric.transport.shards import ShardPlan, ShardSet
from sapo_async.logs import get_logger

__all__ = ["RotatingSubscription", "subscribe_planned"]

_log = get_logger("shards")


class RotatingSubscription:
    """A consumer on this epoch's shards of ``plan``, re-created each epoch.

    Build with :func:`subscribe_planned`.

    Attributes:
        shards: the shard set read now.
        epoch: the epoch it belongs to.
        rotations: how many times the consumer moved to a new set.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        families: Sequence[str] | None,
        plan: ShardPlan,
        key: str,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._transport = transport
        self._families = families
        self.plan = plan
        self._key = key
        self._clock = clock or time.time  # looked up now, not at import
        self._sub: Subscription | None = None
        self.epoch = plan.epoch(key, self._clock())
        self.shards = plan.shards_at(key, self.epoch)
        self.rotations = 0
        self._closed = False

    async def _open_on(self, shards: ShardSet, start: StartAt) -> None:
        self._sub = await self._transport.subscribe(
            families=self._families, start=start, shards=shards
        )

    async def fetch(self, max_messages: int, max_wait: float) -> Sequence[Delivery]:
        """See ``base.Subscription.fetch``; moves to the next shard set first when the
        epoch turned."""
        if self._closed:
            raise TransportUnavailable("subscription is closed")
        epoch = self.plan.epoch(self._key, self._clock())
        if epoch != self.epoch or self._sub is None:
            try:
                await self._rotate(epoch)
            except (TransportUnavailable, TransportError) as exc:
                # The servers cannot make the new consumer now (one restarting, no meta
                # leader): try again at the next fetch rather than fail the reader.
                _log.warning("shards_rotate_failed", epoch=epoch, error=str(exc))
                await anyio.sleep(min(max_wait, 0.5))
                return []
        assert self._sub is not None
        return await self._sub.fetch(max_messages, max_wait)

    async def _rotate(self, epoch: int) -> None:
        old, self._sub = self._sub, None
        if old is not None:
            await old.aclose()
        shards = self.plan.shards_at(self._key, epoch)
        await self._open_on(shards, StartAt.new())
        self.epoch, self.shards = epoch, shards
        self.rotations += 1
        _log.info("shards_rotated", epoch=epoch, shards=list(shards.indices))

    async def aclose(self) -> None:
        """Close the current consumer (idempotent)."""
        self._closed = True
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.aclose()


async def subscribe_planned(
    transport: Transport,
    *,
    families: Sequence[str] | None,
    plan: ShardPlan,
    key: str,
    start: StartAt | None = None,
    durable: str | None = None,
    clock: Callable[[], float] | None = None,
) -> Subscription:
    """Subscribe as ``plan`` says: one plain consumer when it reads everything, else a
    :class:`RotatingSubscription` (its first consumer starts at ``start``).

    Args:
        key: the reader's identity (its address): fixes its offset and epoch phase.

    Raises:
        ConfigError: ``durable`` with a plan that reads a subset.
        TransportError: the consumer could not be created.
    """
    if plan.reads_all:
        # All S shards are the same groups as one: one filter per family.
        return await transport.subscribe(
            families=families, start=start, durable=durable, shards=ShardSet.everything()
        )
    if durable is not None:
        raise ConfigError(
            f"a durable consumer ({durable!r}) cannot rotate shards: read all shards "
            "(shards_read unset) or drop durable",
            field="fabric.shards_read",
        )
    sub = RotatingSubscription(transport, families=families, plan=plan, key=key, clock=clock)
    await sub._open_on(sub.shards, start or StartAt.new())
    return sub
