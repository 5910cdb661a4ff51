"""What an attack is: a rewrite of an attacker node's honest groups before they are signed.

Owns the :class:`Attack` protocol, the :class:`Forged` message an attack returns, the
payload detectors the harness measures honest nodes with, and :class:`AttackPublisher`,
which stands in for an attacker node's publisher. Each attack is a small module beside this
one; none of them knows how the harness runs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from eth_account.signers.local import LocalAccount
from msgspec.structs import replace

from sapo_async.fabric.publisher import Publisher, PublishReceipt
from sapo_async.fabric.transport.base import Transport
from sapo_async.wire import Completion, RolloutGroup

__all__ = [
    "Attack",
    "AttackPublisher",
    "Forged",
    "beside_wrong",
    "retext",
    "wrong_answer",
]


@dataclass(frozen=True, slots=True)
class Forged:
    """One message an attack sends: a group and the key that signs it."""

    group: RolloutGroup
    account: LocalAccount


class Attack(Protocol):
    """A named rewrite of an attacker's groups, and what it plants in honest nodes."""

    name: str

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        """The messages to send in place of ``group`` (signed by ``account`` or others)."""
        ...

    def carries_payload(self, text: str, answer: str) -> bool:
        """Whether an honest node's own completion shows the attack's payload."""
        ...


def wrong_answer(answer: str) -> str:
    """A well-formed wrong answer: the integer after the right one (or ``"0"``)."""
    try:
        return str(int(answer) + 1)
    except ValueError:
        return "0"


def retext(group: RolloutGroup, texts: Sequence[str], **changes: Any) -> RolloutGroup:
    """``group`` with completions of ``texts`` (no token ids: receivers re-tokenise)."""
    return replace(
        group,
        completions=tuple(Completion(text=t, finish_reason="stop") for t in texts),
        **changes,
    )


def beside_wrong(group: RolloutGroup, good: str) -> RolloutGroup:
    """``group`` with ``good`` as every other completion (the first, third...) and a bare
    wrong answer between: informative by construction, so ``good`` rides a positive
    advantage (the inject and filler attacks)."""
    bad = f" <answer>{wrong_answer(group.answer)}</answer>"
    return retext(group, [good if i % 2 == 0 else bad for i in range(len(group.completions))])


class AttackPublisher:
    """An attacker node's publisher: forges each group, then publishes every message.

    Args:
        transport: the attacker's transport.
        account: the attacker node's own key (its identity in the round loop).
        attack: what to forge.
        seed: seeds the attack's randomness.
    """

    def __init__(
        self, transport: Transport, account: LocalAccount, attack: Attack, seed: int
    ) -> None:
        self._transport = transport
        self._account = account
        self._attack = attack
        self._rng = random.Random(seed)
        self._publishers: dict[str, Publisher] = {}
        self.sent = 0

    @property
    def address(self) -> str:
        """The attacker node's address."""
        return str(self._account.address)

    async def publish(self, group: RolloutGroup) -> PublishReceipt:
        """Publish what the attack makes of ``group``; the first message's receipt."""
        first: PublishReceipt | None = None
        for forged in self._attack.forge(group, self._account, self._rng):
            key = forged.account.address
            if key not in self._publishers:
                self._publishers[key] = Publisher(self._transport, forged.account)
            receipt = await self._publishers[key].publish(forged.group)
            self.sent += 1
            first = first or receipt
        assert first is not None, "an attack sends at least one message per group"
        return first
