"""The publisher: encode, sign, publish, and wait for the server to acknowledge.

Owns the producer side of the fabric. :class:`Publisher` is the one call (the node awaits
it per group).

Retries: a publish that was not acknowledged (timeout, server restarting) is retried with
jittered exponential backoff (:func:`sapo_async.backoff.retry_async`). That is safe because
the message id is the rollout hash, so the server stores a group once however often it is
sent within the duplicate window. A publish the server refuses for good (too large) is not
retried.

Deliberately does not know where groups come from or who reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from sapo_async.backoff import Backoff, retry_async
from sapo_async.errors import PublishError, PublishRefused, TransportUnavailable
from sapo_async.fabric.transport.base import PublishAck, Transport
from sapo_async.limits import (
    PUBLISH_RETRIES,
    PUBLISH_RETRY_BASE_S,
    PUBLISH_RETRY_MAX_S,
    RETRY_JITTER,
)
from sapo_async.logs import get_logger
from sapo_async.wire.rollout import RolloutGroup, encode_group
from sapo_async.wire.signing import rollout_hash, sign_body

__all__ = ["PublishReceipt", "Publisher", "PublisherStatistics"]


@dataclass(frozen=True, slots=True)
class PublishReceipt:
    """What a successful publish returns.

    Attributes:
        rollout_hash: keccak-256 of the group's canonical bytes (what the ledger commits to).
        ack: the server's acknowledgement.
        attempts: tries it took.
    """

    rollout_hash: bytes
    ack: PublishAck
    attempts: int


@dataclass(frozen=True, slots=True)
class PublisherStatistics:
    """Counters of a publisher.

    Attributes:
        published: groups acknowledged.
        duplicates: of those, ones the server already had (a retried publish).
        retries: extra attempts made.
        failed: groups given up on.
    """

    published: int
    duplicates: int
    retries: int
    failed: int


class Publisher:
    """Signs groups with the node's key and publishes them with retries.

    Args:
        transport: where to publish.
        account: the node's key; every group's ``producer`` must be its address.
        retries: attempts per group.
        retry_base_s: first backoff; doubles per attempt, up to ``PUBLISH_RETRY_MAX_S``.
    """

    def __init__(
        self,
        transport: Transport,
        account: LocalAccount,
        *,
        retries: int = PUBLISH_RETRIES,
        retry_base_s: float = PUBLISH_RETRY_BASE_S,
    ) -> None:
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        self._transport = transport
        self._account = account
        self._retries = retries
        self._backoff = Backoff(
            retry_base_s, max(retry_base_s, PUBLISH_RETRY_MAX_S), jitter=RETRY_JITTER
        )
        self._published = 0
        self._duplicates = 0
        self._retried = 0
        self._failed = 0
        self._log = get_logger("publisher", producer=account.address)

    @property
    def address(self) -> str:
        """The producer address groups must carry."""
        return str(self._account.address)

    async def publish(self, group: RolloutGroup) -> PublishReceipt:
        """Encode, sign and publish ``group``; return once the server acknowledged it.

        Raises:
            ValueError: ``group.producer`` is not this publisher's address.
            PublishRefused: the server refused it for good (e.g. too large).
            PublishError, TransportUnavailable: still unacknowledged after every retry.
        """
        if group.producer != self._account.address:
            raise ValueError(f"group.producer {group.producer} is not {self._account.address}")
        body = encode_group(group)
        digest = rollout_hash(body)
        signed = sign_body(self._account, body, hash32=digest)
        attempts = 1

        def retried(attempt: int, exc: Exception, delay: float) -> None:
            nonlocal attempts
            attempts = attempt + 1
            self._retried += 1
            self._log.info("rollout_publish_retried", attempt=attempt, delay_s=delay)

        try:
            ack = await retry_async(
                lambda: self._transport.publish(
                    signed, family=group.task.family, producer=group.producer, rollout_hash=digest
                ),
                retry_on=(PublishError, TransportUnavailable),
                give_up_on=(PublishRefused,),
                schedule=self._backoff,
                attempts=self._retries,
                on_retry=retried,
            )
        except PublishRefused:
            self._failed += 1
            raise
        except (PublishError, TransportUnavailable) as exc:
            self._failed += 1
            self._log.warning("rollout_publish_failed", rollout_hash=digest.hex(), error=str(exc))
            raise
        self._published += 1
        self._duplicates += int(ack.duplicate)
        self._log.debug(
            "rollout_published",
            rollout_hash=digest.hex(),
            seq=ack.seq,
            round=group.producer_round,
            duplicate=ack.duplicate,
        )
        return PublishReceipt(digest, ack, attempts)

    def statistics(self) -> PublisherStatistics:
        """Counters so far."""
        return PublisherStatistics(self._published, self._duplicates, self._retried, self._failed)
