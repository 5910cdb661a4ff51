"""The content defences against the inject attack on a real model (issue 23).

SmolLM2-135M-Instruct calibrates on its own completions exactly as a node's round does
(:func:`~sapo_async.node.selection.calibrate`), then screens, under its own weights, the
attack's completion (the right answer plus the marker, docs/security.md) and honest
completions sampled like a peer's. The attack's mean token log-prob lies inside the node's
own range, so the mean alone let it through (0.969 payload rate with the defences on, the
first SmolLM2 attack matrix); the mean of its least likely tokens does not.
"""

from __future__ import annotations

import anyio
import pytest

from sapo_async.experiment.attack.inject import MARKER
from sapo_async.node.defence import Calibration, CompletionView, screen
from sapo_async.node.groups import SharedRound
from sapo_async.node.learner import build_learner
from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.node.selection import calibrate
from sapo_async.node.spec import NodeSpec
from sapo_async.tasks.spec import preset

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


@pytest.mark.timeout(900)
def test_smollm2_refuses_the_injected_marker_and_keeps_honest_completions() -> None:
    spec = NodeSpec.build(
        model="smollm2-135m",
        tasks=list(preset("cpu_easy")),
        questions_per_round=4,
        completions_per_question=4,
        max_new_tokens=32,
        local=2,
    )
    learner = build_learner(spec)
    calibration = Calibration(spec.defence, spec.training.max_new_tokens)
    for r in range(2):  # 2 x B x L = 32 own completions: calibration_min
        generated = anyio.run(learner.generate, r)
        local = learner.score_local(generated)
        calibrate(calibration, SharedRound(r, generated, local, [], 0, 0.0, 0.0, 0.0))
    limits = calibration.thresholds()
    tok, eos = learner.tokenizer, learner.tokenizer.eos_token_id
    honest_refused = honest = forged_mean_passes = 0
    for g in anyio.run(learner.generate, 2):  # sampled as a peer with these weights would
        family = g.item.ref.family
        assert limits.judges(family)
        prompt = tok(g.prompt, add_special_tokens=not learner.settings.chat_template)
        rows = [list(c.token_ids or ()) for c in g.result.completions]
        payload_text = f" <answer>{g.item.answer}</answer>{MARKER}"
        payload = tok(payload_text, add_special_tokens=False)
        *own, forged = token_logprobs_batch(
            learner.model, prompt["input_ids"], [*rows, [*payload["input_ids"], eos]], pad=eos
        )
        for lp, c in zip(own, g.result.completions, strict=True):
            # As if every one were rewarded and pushed up, text and all (the brevity guard).
            honest += 1
            honest_view = CompletionView(lp.tolist(), 1.0, (), c.text)
            honest_refused += screen(family, [honest_view], limits) is not None
        # The plausibility check alone (no text: the brevity guard does not read it) ...
        view = CompletionView(forged.tolist(), 1.0)
        assert screen(family, [view], limits) == "implausible"
        # ... and the brevity guard, first, on the bare answer the cut would leave.
        bare = CompletionView(forged.tolist(), 1.0, (), payload_text)
        assert screen(family, [bare], limits) == "too_brief"
        floor = limits.families[family].min_mean_logprob
        assert floor is not None
        forged_mean_passes += sum(view.logprobs) / len(view.logprobs) >= floor
    assert honest == 16
    assert honest_refused <= 1, f"{honest_refused} of 16 honest completions refused"
    # What made the fix necessary: the mean alone admits the payload.
    assert forged_mean_passes >= 3


@pytest.mark.timeout(900)
def test_smollm2_trains_a_peers_completion_only_through_its_answer_with_the_cut() -> None:
    """``cut_after_answer`` on SmolLM2's own BPE and chat template: the tokens attack's run
    after a right answer is cut at the tag and the completion stopped there; honest sampled
    completions keep their ids and behaviour log-probs where nothing follows the tag, and
    are cut the same way where something does."""
    from dataclasses import replace

    from sapo_async.node.selection import candidate_view
    from sapo_async.policy.grpo.batch import ScoredCompletion, TokenSource
    from sapo_async.tasks.reward import answer_tail

    spec = NodeSpec.build(
        model="smollm2-135m",
        tasks=list(preset("cpu_easy")),
        questions_per_round=2,
        completions_per_question=4,
        max_new_tokens=32,
        local=1,
        external=1,
        defence_cut_after_answer=True,
    )
    learner = build_learner(spec)
    tok, eos = learner.tokenizer, learner.tokenizer.eos_token_id
    generated = anyio.run(learner.generate, 0)
    for g, own in zip(generated, learner.score_local(generated), strict=True):
        text = f" <answer>{g.item.answer}</answer> 7*(3="
        ids = (*tok(text, add_special_tokens=False)["input_ids"], eos)
        forged = ScoredCompletion(text, 1.0, "stop", ids, tuple(-1.0 - k for k in range(len(ids))))
        honest = tuple(
            replace(s, token_ids=tuple(c.token_ids or ()), behaviour_logprobs=tuple(c.logprobs))
            for s, c in zip(own.completions, g.result.completions, strict=True)
        )
        peer = replace(own, completions=(forged, *honest), token_source=TokenSource.TEXT)
        view = candidate_view(learner, peer)
        assert view.peer_ids_match(0)
        *body, stop = view.token_ids[0]
        assert stop == eos
        assert tok.decode(body) == f" <answer>{g.item.answer}</answer>"
        assert view.behaviour_logprobs(0) is None
        for i, c in enumerate(honest, start=1):
            assert view.peer_ids_match(i)
            if answer_tail(c.text):
                assert view.cut_text(i) is not None
                assert tok.decode(list(view.token_ids[i][:-1])) == view.cut_text(i)
            else:
                assert view.token_ids[i] == view.sent_token_ids[i] == c.token_ids
                assert view.behaviour_logprobs(i) == c.behaviour_logprobs
