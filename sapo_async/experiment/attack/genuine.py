"""The attacker's own work: what the attacks from the literature build their groups from.

An attacker node's group (what :meth:`~sapo_async.experiment.attack.base.Attack.forge`
gets) is its own model's honest group for the question: genuine work in that model's
words, and ``group.answer`` is the right answer, which the attacker derives from the task
reference as every node does, so it knows which of its completions are right ("Hail to the
Thief", arXiv 2511.09780v2, notes that a majority vote of its own samples does as well).
The paper's text and false-statement attacks keep that work, edit it and set its final
answer right; the rest of the group is wrong, so the group is informative and the edited
right completions ride a positive advantage (the paper's strongest recipe: about half
poisoned-but-right, half wrong).

Owns reading a completion's work (:func:`work_of`), judging it right as the attacker can
(:func:`is_right`), writing a right answer after work (:func:`answered`), the wrong half of
a group (:func:`wrong_ones`) and the half poisoned, half wrong group (:func:`poisoned`).
Knows nothing of any attack's payload. Rebuilt completions carry no token ids or log-probs
(receivers re-tokenise, as for every forged group); kept ones keep their text and finish
reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from msgspec.structs import replace

from sapo_async.experiment.attack.base import wrong_answer
from sapo_async.tasks.prompt import ANSWER_CLOSE, ANSWER_OPEN, extract_answer
from sapo_async.tasks.reward import answer_lead_text
from sapo_async.wire import Completion, RolloutGroup

__all__ = [
    "answered",
    "bare_wrong",
    "interleave",
    "is_right",
    "pieces",
    "poisoned",
    "regroup",
    "right_first",
    "stopped",
    "work_of",
    "wrong_ones",
]

_BREAK = re.compile(r"((?<=[.!?])\s+|\s*\n\s*)")
"""Where one sentence of work ends and the next begins: after ``.``, ``!`` or ``?`` and
whitespace, or at a line break (a decimal point is followed by a digit, not a space)."""


def is_right(text: str, answer: str) -> bool:
    """Whether ``text``'s answer (its last ``<answer>`` pair) is ``answer`` as the attacker
    judges it: the same text, or the same number (``4.0`` for ``4``)."""
    given = extract_answer(text)
    if given is None:
        return False
    if given == answer.strip():
        return True
    try:
        return float(given) == float(answer)
    except ValueError:
        return False


def work_of(text: str) -> str:
    """The work a completion shows before its answer, stripped: the text before the opening
    tag of its last answer pair; for one that closed no tag (cut at the cap, or never
    answering), the text before any opening tag, or all of it."""
    if ANSWER_CLOSE in text:
        return answer_lead_text(text)
    start = text.find(ANSWER_OPEN)
    return (text[:start] if start >= 0 else text).strip()


def answered(work: str, answer: str) -> str:
    """``work`` then ``answer`` in tags, as a completion's text: `` WORK <answer>A</answer>``
    (`` <answer>A</answer>`` with no work)."""
    tag = f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
    return f" {work} {tag}" if work else f" {tag}"


def bare_wrong(answer: str) -> str:
    """A bare, well-formed wrong answer (:func:`~.base.wrong_answer`)."""
    return f" {ANSWER_OPEN}{wrong_answer(answer)}{ANSWER_CLOSE}"


def stopped(text: str) -> Completion:
    """A completion of ``text`` that ended with a stop token."""
    return Completion(text=text, finish_reason="stop")


def pieces(work: str) -> list[str]:
    """``work`` split into its sentences and the breaks between them, alternating (the
    sentences at even indices; ``"".join`` gives ``work`` back); empty for no work."""
    return _BREAK.split(work) if work else []


def right_first(group: RolloutGroup) -> list[Completion]:
    """The attacker's completions, its right ones first, each part in its own order."""
    right = [c for c in group.completions if is_right(c.text, group.answer)]
    return right + [c for c in group.completions if not is_right(c.text, group.answer)]


def wrong_ones(group: RolloutGroup, count: int) -> list[Completion]:
    """``count`` wrong completions: the attacker's own wrong ones as it sampled them (text
    and finish reason), in order, then bare wrong answers where it has too few."""
    own = [
        Completion(text=c.text, finish_reason=c.finish_reason)
        for c in group.completions
        if not is_right(c.text, group.answer)
    ][:count]
    return own + [stopped(bare_wrong(group.answer))] * (count - len(own))


def interleave(good: Sequence[Completion], bad: Sequence[Completion]) -> list[Completion]:
    """``good`` at the even slots (first, third...) and ``bad`` between, then the rest."""
    out: list[Completion] = []
    for i in range(max(len(good), len(bad))):
        out += [*good[i : i + 1], *bad[i : i + 1]]
    return out


def regroup(group: RolloutGroup, completions: Sequence[Completion]) -> RolloutGroup:
    """``group`` with ``completions`` in place of its own."""
    return replace(group, completions=tuple(completions))


def poisoned(group: RolloutGroup, rewrite: Callable[[str], str]) -> RolloutGroup:
    """Half poisoned, half wrong: the even slots hold the attacker's completions, its right
    ones first, each with its work rewritten by ``rewrite`` and its answer set right (a
    wrong one's work is kept and its answer replaced); the odd slots hold wrong ones
    (:func:`wrong_ones`). Informative whenever the group has two completions or more."""
    n = len(group.completions)
    good = [
        stopped(answered(rewrite(work_of(c.text)), group.answer))
        for c in right_first(group)[: (n + 1) // 2]
    ]
    return regroup(group, interleave(good, wrong_ones(group, n // 2)))
