"""Which peers put text after their rewarded answers: the answer cut's escalation.

The verifier reads the answer between the last ``<answer>`` pair and nothing after it, so a
payload rides there (the inject and tokens attacks: a right answer, then a marker or a run
of tokens, beside a bare wrong answer). The cut (``cut_after_answer``) trains such a
completion only through its tag, but the attacker's group is still trained: a bare right
answer beside a bare wrong one, every round, in the external slots an honest peer's group
would have filled. ``drop_after_answer`` leaves every tailed peer completion out, which
stops that but also leaves out the honest ones that run on after their answer (9 to 13 % of
SmolLM2's), at a cost with no attack.

This record tells the two apart per producer: of the completions a producer was rewarded
for (reward above its group's floor, what GRPO pushes up) in its last
:data:`WINDOW_GROUPS` groups with any (groups of no spread do not count, so they cannot
dilute it) this node scored, the share that carried text after the answer. Once that
share reaches ``tail_share`` over at least :data:`MIN_ANSWERS` answers, that producer's
tailed completions are left out (as ``drop_after_answer`` does for all): an attacker that
tails every right answer crosses it after 8 of them (four of the inject attacker's groups);
an honest peer crosses it only if half its rewarded answers run on, and otherwise stays
cut only. Nothing is refused or quarantined for it: a producer whose right answers are
left out sends groups with no spread, dropped as uninformative.

*Cannot* stop: an attacker that tails fewer than ``tail_share`` of its right answers (the
cut still removes each payload, and its bare answers are still trained).

Threads: the node keeps one :class:`TailRecord` on the event loop; the selection thread
gets a :meth:`~TailRecord.copy`, scores with it and returns what it observed; the loop then
records those (:meth:`~TailRecord.observe`), each group once, by hash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sapo_async.node.windows import ProducerWindows

__all__ = ["MIN_ANSWERS", "WINDOW_GROUPS", "TailObservation", "TailRecord"]

WINDOW_GROUPS = 16
"""Groups per producer the share is read over (the newest ones this node scored)."""

MIN_ANSWERS = 8
"""Rewarded completions a producer must have in the window before its share counts."""


@dataclass(frozen=True, slots=True)
class TailObservation:
    """One scored peer group: its rewarded completions and how many carried a tail."""

    rollout_hash: bytes
    producer: str
    tailed: int
    rewarded: int


class TailRecord:
    """Per producer, the tail counts of its last :data:`WINDOW_GROUPS` scored groups."""

    def __init__(self, share: float, *, window: int = WINDOW_GROUPS, least: int = MIN_ANSWERS):
        if not 0 < share <= 1:
            raise ValueError(f"tail_share {share!r} is not allowed: in (0, 1]")
        self.share = share
        self._least = least
        self._groups: ProducerWindows[tuple[int, int]] = ProducerWindows(window)

    def copy(self) -> TailRecord:
        """An independent copy (what the selection thread may change)."""
        out = TailRecord(self.share, window=self._groups.window, least=self._least)
        out._groups = self._groups.copy()
        return out

    def add(self, seen: TailObservation) -> None:
        """Record one group (again: no change; the newest ``window`` are kept)."""
        self._groups.add(seen.producer, seen.rollout_hash, (seen.tailed, seen.rewarded))

    def heavy(self, producer: str) -> bool:
        """Whether ``producer``'s tailed completions are left out: at least ``share`` of
        its at least :data:`MIN_ANSWERS` recent rewarded answers carried a tail."""
        groups = self._groups.values(producer)
        if not groups:
            return False
        tailed = sum(t for t, _ in groups)
        rewarded = sum(r for _, r in groups)
        return rewarded >= self._least and tailed >= self.share * rewarded

    def observe(self, seen: Iterable[TailObservation]) -> list[str]:
        """Record a round's observations; return the producers that became heavy."""
        seen = list(seen)
        before = {s.producer: self.heavy(s.producer) for s in seen}
        for s in seen:
            self.add(s)
        return sorted(p for p, was in before.items() if not was and self.heavy(p))
