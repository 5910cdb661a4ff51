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

Threads: built and read in one worker thread (the round's selection); not shared.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.policy.generation.transformers_backend import stop_token_ids
from sapo_async.policy.grpo.batch import ScoredGroup, TokenSource

__all__ = ["CandidateView"]


class CandidateView:
    """One scored external group as this node sees it (see the module docstring).

    Args:
        scored: the group scored by this node's verifier (prompt in this node's style).
        model: this node's current policy (for log-probs; nothing is run until asked).
        tokenizer: this node's tokenizer (EOS required; nothing is tokenised until read).
        tokenizer_id: its digest (a peer with the same digest may send matching ids).
        add_special_tokens: as the node's generator tokenises prompts.
    """

    def __init__(
        self,
        scored: ScoredGroup,
        *,
        model: Any,
        tokenizer: Any,
        tokenizer_id: str,
        add_special_tokens: bool,
    ) -> None:
        self.scored = scored
        self.same_tokenizer = scored.tokenizer_id == tokenizer_id
        self._model = model
        self._tokenizer = tokenizer
        self._tokenizer_id = tokenizer_id
        self._add_special_tokens = add_special_tokens
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self._eos = None if eos is None else int(eos)
        self._pad = int(pad if pad is not None else (eos if eos is not None else 0))
        self._logprobs: list[Any] = [None] * len(scored.completions)
        self._stop = frozenset(stop_token_ids(model, tokenizer))
        self._special = frozenset(map(int, getattr(tokenizer, "all_special_ids", ())))

    @functools.cached_property
    def prompt_ids(self) -> tuple[int, ...]:
        """The prompt's ids under the receiver's tokenizer (tokenised on first read)."""
        enc = self._tokenizer(self.scored.prompt, add_special_tokens=self._add_special_tokens)
        return tuple(enc["input_ids"])

    @functools.cached_property
    def token_ids(self) -> tuple[tuple[int, ...], ...]:
        """Each completion's ids in the receiver's tokenizer, the stop token included: the
        peer's own where they spell the text (:meth:`peer_ids_match`), else the text
        tokenised here (worked out on first read, all completions at once)."""
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
        missing = [i for i in dict.fromkeys(indices) if self._logprobs[i] is None]
        run = [i for i in missing if self.token_ids[i]]
        computed = token_logprobs_batch(
            self._model, self.prompt_ids, [self.token_ids[i] for i in run], pad=self._pad
        )
        for i, lp in zip(run, computed, strict=True):
            self._logprobs[i] = lp
        if len(run) < len(missing):
            import torch

            device = next(self._model.parameters()).device
            for i in set(missing) - set(run):
                self._logprobs[i] = torch.zeros(0, device=device)
        return [self._logprobs[i] for i in indices]

    def trained_group(self) -> ScoredGroup:
        """The group the trainer gets: the receiver's own ids (``TokenSource.RECEIVER``),
        with the peer's behaviour log-probs kept only where its ids were exactly ours."""
        completions = []
        for i, c in enumerate(self.scored.completions):
            keep = self.peer_ids_match(i) and c.behaviour_logprobs is not None
            completions.append(
                dataclasses.replace(
                    c,
                    token_ids=self.token_ids[i],
                    behaviour_logprobs=c.behaviour_logprobs if keep else None,
                )
            )
        return dataclasses.replace(
            self.scored,
            completions=tuple(completions),
            tokenizer_id=self._tokenizer_id,
            prompt_token_ids=self.prompt_ids,
            token_source=TokenSource.RECEIVER,
        )
