"""The verifier: a completion's reward under the family's own reasoning-gym scorer.

Owns the reward rule: ``score_answer(extracted answer, entry)`` with the answer extracted
from ``<answer>`` tags (0 without tags), plus an optional format bonus (off by default)
for a completion that has the tags at all. Text after the last closing tag is not read
(where the inject and tokens attacks put their payload: a receiver cuts it off instead,
:class:`~sapo_async.node.view.CandidateView`). Rewards are never taken from peers: every
node re-derives the task (:func:`~sapo_async.tasks.source.derive`) and scores it here.
Deliberately does not know about models or groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo_async.errors import ConfigError
from sapo_async.tasks.prompt import ANSWER_CLOSE, ANSWER_OPEN, extract_answer
from sapo_async.tasks.source import TaskItem, score_entry

__all__ = [
    "Verifier",
    "answer_lead",
    "answer_lead_text",
    "answer_tail",
    "lead_key",
    "own_lead",
    "text_after_answer",
]


def answer_tail(text: str) -> str | None:
    """What follows the last closing answer tag, stripped (None: no closing tag)."""
    end = text.rfind(ANSWER_CLOSE)
    return None if end < 0 else text[end + len(ANSWER_CLOSE) :].strip()


def answer_lead_text(text: str) -> str:
    """The text (stripped) before the answer: before the opening tag nearest the last
    closing one; the whole stripped text when no tag pair closes."""
    end = text.rfind(ANSWER_CLOSE)
    start = text.rfind(ANSWER_OPEN, 0, end) if end >= 0 else -1
    return (text[:start] if start >= 0 else text).strip()


def lead_key(text: str) -> str:
    """:func:`answer_lead_text` as the stock-lead record compares it (:mod:`sapo_async.node.leads`):
    lower case, runs of whitespace as one space, a trailing ``:``, ``.`` or ``,`` dropped."""
    return " ".join(answer_lead_text(text).lower().split()).rstrip(":.,")


def answer_lead(text: str) -> int:
    """How many characters :func:`answer_lead_text` shows (the brevity guard's measure,
    :mod:`sapo_async.node.defence`)."""
    return len(answer_lead_text(text))


def own_lead(text: str, finish_reason: str) -> int | None:
    """What an own completion tells the brevity guard of how much text this model shows
    before an answer (:mod:`sapo_async.node.defence`), in characters; None: nothing.

    A completion that closes an answer tag shows its :func:`answer_lead`. One cut at the
    token cap (``"length"``) had not answered yet: its lead is at least its text before
    the answer tag it opened, or its whole text (a lower bound; SmolLM2's at 32 tokens are
    mostly these). One that ended without closing a tag gave no answer, so it tells
    nothing: counted as all lead, the tiny model's untagged ``" 10"`` put the floor above
    its own tagged bare answers (README swarm: 6.9 % of honest groups refused).
    """
    if ANSWER_CLOSE in text:
        return answer_lead(text)
    if finish_reason != "length":
        return None
    start = text.rfind(ANSWER_OPEN)
    return len((text[:start] if start >= 0 else text).strip())


def text_after_answer(text: str) -> bool:
    """True when anything but whitespace follows the last closing answer tag."""
    return bool(answer_tail(text))


@dataclass(frozen=True, slots=True)
class Verifier:
    """Scores completions of one task item.

    Attributes:
        format_reward: added when the completion contains an ``<answer>`` pair (0 = off,
            the paper's setting). Rewards then lie in [0, 1 + format_reward].
    """

    format_reward: float = 0.0

    def __post_init__(self) -> None:
        if self.format_reward < 0:
            raise ConfigError(
                f"format_reward must be >= 0, got {self.format_reward}", field="format_reward"
            )

    def score(self, item: TaskItem, completion_text: str) -> float:
        """The reward of one completion text for ``item``."""
        answer = extract_answer(completion_text)
        if answer is None:
            return 0.0
        return score_entry(item, answer) + self.format_reward

    def score_all(self, item: TaskItem, texts: list[str] | tuple[str, ...]) -> list[float]:
        """Rewards of several completion texts for the same item, in order."""
        return [self.score(item, text) for text in texts]
