"""One view of each external candidate: the receiver's tokens once, its log-probs once.

Owns what the round knows of one external group under this node's own tokenizer and model.
:class:`CandidateView` takes each completion's tokens once: a same-tokenizer peer's own ids
when they spell its text (:meth:`CandidateView.peer_ids_match`), else the receiver's
tokenisation of the *text* (plus EOS when the completion stopped, as the generator and the
trainer do); it tokenises the prompt once, and computes per-token log-probs under the
receiver's current policy at most once per completion (batched per group, no grad, on the
model's device), only for the completions a consumer asks for. Both are lazy: building a
view costs nothing, the text is tokenised the first time something reads the ids (a defence
that is on, or :meth:`CandidateView.trained_group` for a candidate the round chose), so with
the defences off an unchosen candidate is never tokenised or run. Everything that looks at
the candidate reads this one view: the size bound and the token check (:mod:`.selection`),
plausibility and the length guard (:func:`~sapo_async.node.defence.screen`), the F-TIS ratio
filter (:mod:`.filters`) and the trainer, which gets :meth:`CandidateView.trained_group`:
the ids the view chose (:attr:`~sapo_async.policy.grpo.batch.TokenSource.RECEIVER`),
so it does not tokenise the text again.

The receiver's log-probs serve the checks only. The trainer computes its old log-probs
itself inside the step (in the same batch as the local rows, or the step's own detached
ones with one epoch and one minibatch), and truncated importance weights need the
*producer's* behaviour log-probs, not the receiver's (with the receiver's the weight would
be 1). The GRPO maths is unchanged.

The token check (:meth:`CandidateView.peer_ids_match`) asks whether the ids *spell the
text*: no special token but a final stop token, and decoding (as the producer's generator
decodes) gives the text exactly. It used to ask whether they *are the receiver's
tokenisation* of the text, which an honest sample need not be: a BPE policy may emit "1"
then "2" where the tokenizer writes "12". Both refuse what the check is for, a run whose
tokens say something the text (what every verifier scored) does not; the new one keeps the
honest peer's ids and behaviour log-probs, so the trainer trains on what was sampled.

With ``cut_after_answer`` (``[defence] cut_after_answer``) a completion with text after
its last closing answer tag is trained, and screened, only through that tag: the verifier
read the answer, never what follows, and the inject and tokens attacks put their payload
there (a right answer then carries it up with a positive advantage). The cut keeps the
reward and ends the completion there: the cut text tokenised here plus the stop token, as
a completion that stopped after its answer (what the prompt asks for). Without the stop
token, SmolLM2 nodes that trained on the cut answers learned to answer and then keep
talking to the cap (docs/security.md). The rows are this node's own tokenisation, so
no behaviour log-probs are kept (as for a peer with another tokenizer).
:attr:`CandidateView.sent_token_ids` stay whole, for the size bound.

Threads: built and read in one worker thread (the round's selection); not shared.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from sapo_async.node.plausibility import token_tests_batch
from sapo_async.node.token_test import CompletionTest
from sapo_async.policy.generation.transformers_backend import stop_token_ids
from sapo_async.policy.grpo.batch import ScoredGroup, TokenSource
from sapo_async.tasks.prompt import ANSWER_CLOSE
from sapo_async.tasks.reward import text_after_answer

__all__ = ["CandidateView"]

_UNTESTED = CompletionTest(tokens=0, p_min=1.0, z=0.0)
"""An empty completion's test (nothing to test: it passes)."""


class CandidateView:
    """One scored external group as this node sees it (see the module docstring).

    Args:
        scored: the group scored by this node's verifier (prompt in this node's style).
        model: this node's current policy (for log-probs; nothing is run until asked).
        tokenizer: this node's tokenizer (EOS required; nothing is tokenised until read).
        tokenizer_id: its digest (a peer with the same digest may send matching ids).
        add_special_tokens: as the node's generator tokenises prompts.
        cut_after_answer: train and screen each completion only through its last closing
            answer tag (see the module docstring).
        bf16: run the forward pass in the trainer's precision.
        temperature: the sampling temperature the per-token test assumes (:meth:`tests`).
    """

    def __init__(
        self,
        scored: ScoredGroup,
        *,
        model: Any,
        tokenizer: Any,
        tokenizer_id: str,
        add_special_tokens: bool,
        cut_after_answer: bool = False,
        bf16: bool = False,
        temperature: float = 1.0,
    ) -> None:
        self.scored = scored
        self._bf16 = bf16
        self._temperature = temperature
        self.same_tokenizer = scored.tokenizer_id == tokenizer_id
        self._model = model
        self._tokenizer = tokenizer
        self._tokenizer_id = tokenizer_id
        self._add_special_tokens = add_special_tokens
        self._cut_after_answer = cut_after_answer
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self._eos = None if eos is None else int(eos)
        self._pad = int(pad if pad is not None else (eos if eos is not None else 0))
        self._logprobs: list[Any] = [None] * len(scored.completions)
        self._tests: list[CompletionTest | None] = [None] * len(scored.completions)
        self._stop = frozenset(stop_token_ids(model, tokenizer))
        self._special = frozenset(map(int, getattr(tokenizer, "all_special_ids", ())))

    @functools.cached_property
    def prompt_ids(self) -> tuple[int, ...]:
        """The prompt's ids under the receiver's tokenizer (tokenised on first read)."""
        enc = self._tokenizer(self.scored.prompt, add_special_tokens=self._add_special_tokens)
        return tuple(enc["input_ids"])

    @functools.cached_property
    def sent_token_ids(self) -> tuple[tuple[int, ...], ...]:
        """Each completion's ids in the receiver's tokenizer, the stop token included: the
        peer's own where they spell the text (:meth:`peer_ids_match`), else the text
        tokenised here (worked out on first read, all completions at once). Whole, never
        cut: what the size bound reads."""
        ids: list[tuple[int, ...]] = []
        for i, c in enumerate(self.scored.completions):
            if self._spelled[i]:
                ids.append(tuple(c.token_ids or ()))
                continue
            own = list(self._tokenizer(c.text, add_special_tokens=False)["input_ids"])
            if c.finish_reason == "stop" and self._eos is not None:
                own.append(self._eos)
            ids.append(tuple(own))
        return tuple(ids)

    @functools.cached_property
    def token_ids(self) -> tuple[tuple[int, ...], ...]:
        """The ids screened and trained on: :attr:`sent_token_ids`, cut after the answer
        where ``cut_after_answer`` applies (:meth:`cut_text`)."""
        return tuple(ids for ids, _ in self._trained)

    def cut_text(self, i: int) -> str | None:
        """Completion ``i``'s text through its last closing answer tag, when the cut is on
        and anything but whitespace follows the tag (else None: trained whole)."""
        if not self._cut_after_answer:
            return None
        text = self.scored.completions[i].text
        if not text_after_answer(text):
            return None
        return text[: text.rfind(ANSWER_CLOSE) + len(ANSWER_CLOSE)]

    def stopped(self, i: int) -> bool:
        """Whether completion ``i`` is trained ending in a stop: it stopped, or the answer
        cut stops it after its answer; False for one that ran to the producer's cap."""
        return self.scored.completions[i].finish_reason == "stop" or self.cut_text(i) is not None

    def behaviour_logprobs(self, i: int) -> tuple[float, ...] | None:
        """The producer's behaviour log-probs of :attr:`token_ids` ``[i]``: kept only where
        its ids are the ones trained on (the token check); None for a cut completion."""
        return self._trained[i][1]

    @functools.cached_property
    def _trained(self) -> tuple[tuple[tuple[int, ...], tuple[float, ...] | None], ...]:
        out: list[tuple[tuple[int, ...], tuple[float, ...] | None]] = []
        for i, c in enumerate(self.scored.completions):
            sent = self.sent_token_ids[i]
            cut = self.cut_text(i)
            if cut is None:
                lps = c.behaviour_logprobs
                kept = tuple(lps) if self._spelled[i] and lps and len(lps) == len(sent) else None
                out.append((sent, kept))
                continue
            own = list(self._tokenizer(cut, add_special_tokens=False)["input_ids"])
            if self._eos is not None:
                own.append(self._eos)
            out.append((tuple(own), None))
        return tuple(out)

    @functools.cached_property
    def _spelled(self) -> tuple[bool, ...]:
        return tuple(self._spells(c) for c in self.scored.completions)

    def _spells(self, c: Any) -> bool:
        claimed = c.token_ids
        if not self.same_tokenizer or claimed is None:
            return False
        body = list(claimed)
        if c.finish_reason == "stop":
            if not body or body[-1] not in self._stop:
                return False
            body.pop()
        vocab = len(self._tokenizer)
        if any(not 0 <= t < vocab or t in self._special for t in body):
            return False
        return bool(self._tokenizer.decode(body, skip_special_tokens=False) == c.text)

    def peer_ids_match(self, i: int) -> bool:
        """The token check: whether completion ``i`` carries ids of the receiver's tokenizer
        that spell exactly its text (no special token but a final stop token when it
        stopped, and decoding gives the text), which are then the ids trained on."""
        return self._spelled[i]

    def logprobs(self, indices: Sequence[int]) -> list[Any]:
        """Per-token log-probs (1-D tensors on the model's device) of the completions
        ``indices`` under the receiver's current policy; those not computed yet are run in
        one batched pass, so no completion is run through the model twice."""
        self._run(indices)
        return [self._logprobs[i] for i in indices]

    def tests(self, indices: Sequence[int]) -> list[CompletionTest]:
        """The per-token test (:mod:`.token_test`) of the completions ``indices`` under the
        receiver's current policy, from the same pass as :meth:`logprobs`."""
        self._run(indices)
        return [self._tests[i] or _UNTESTED for i in indices]

    def _appended(self, i: int) -> int:
        """How many of :attr:`token_ids` ``[i]``'s last tokens the receiver added (the stop
        token after a cut: the peer never sampled it)."""
        return int(self.cut_text(i) is not None and self._eos is not None)

    def _run(self, indices: Sequence[int]) -> None:
        missing = [i for i in dict.fromkeys(indices) if self._logprobs[i] is None]
        run = [i for i in missing if self.token_ids[i]]
        computed = token_tests_batch(
            self._model,
            self.prompt_ids,
            [self.token_ids[i] for i in run],
            pad=self._pad,
            bf16=self._bf16,
            tested=[len(self.token_ids[i]) - self._appended(i) for i in run],
            temperature=self._temperature,
        )
        for i, (lp, test) in zip(run, computed, strict=True):
            self._logprobs[i], self._tests[i] = lp, test
        if len(run) < len(missing):
            import torch

            device = next(self._model.parameters()).device
            for i in set(missing) - set(run):
                self._logprobs[i] = torch.zeros(0, device=device)

    def trained_group(self) -> ScoredGroup:
        """The group the trainer gets: the receiver's own ids (``TokenSource.RECEIVER``),
        with the peer's behaviour log-probs kept only where its ids were exactly ours, and
        a completion cut after its answer (:meth:`cut_text`) as its cut text, stopped."""
        completions = []
        for i, c in enumerate(self.scored.completions):
            cut = self.cut_text(i)
            completions.append(
                dataclasses.replace(
                    c,
                    text=c.text if cut is None else cut,
                    finish_reason=c.finish_reason if cut is None else "stop",
                    token_ids=self.token_ids[i],
                    behaviour_logprobs=self.behaviour_logprobs(i),
                )
            )
        return dataclasses.replace(
            self.scored,
            completions=tuple(completions),
            tokenizer_id=self._tokenizer_id,
            prompt_token_ids=self.prompt_ids,
            token_source=TokenSource.RECEIVER,
        )
