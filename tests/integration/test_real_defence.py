"""The content defences against the inject attack on a real model (issue 23).

SmolLM2-135M-Instruct calibrates on its own completions exactly as a node's round does
(:func:`~sapo_async.node.selection.calibrate`), then screens, under its own weights, the
attack's completion (the right answer plus the marker, docs/security.md) and honest
completions sampled like a peer's.

What is asserted holds on any CPU. The thresholds are quantiles of *sampled* own
completions, and sampling differs between CPUs (floating point: the test once failed on an
AMD EPYC machine and passed on Intel, issue 54). Drawn with four other sampling seeds on one
machine (the stand-in for another CPU's arithmetic), the brevity floor was 1.5 three times
and 5.0 once, the plausibility check alone refused the marker on three of the four and let
it through on the fourth (where the brevity guard refused it), and 0 to 3 of 16 honest
completions were refused. So the test asserts the screen's order, which is exact given the
calibrated thresholds (the brevity guard decides first wherever it has a floor above 0,
plausibility otherwise), that the node refuses the bare answer by one of the two, and a
bound on honest refusals with its reason beside it, not one draw's verdicts.
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
    honest_refused = honest = forged_refused = 0
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
        plausibility = screen(family, [CompletionView(forged.tolist(), 1.0)], limits)
        assert plausibility in (None, "implausible")
        # ... and the node's whole screen on the bare answer the cut would leave: the
        # brevity guard first, wherever its floor is above 0 (the bare answer shows 0).
        bare = screen(family, [CompletionView(forged.tolist(), 1.0, (), payload_text)], limits)
        floor = limits.limits(family).min_rewarded_lead
        assert bare == ("too_brief" if floor is not None and floor > 0 else plausibility)
        forged_refused += bare is not None
    assert honest == 16
    # Refused by one defence or the other on every question: the guard's floor and the
    # plausibility check failed together on none of five draws (four seeds and the AMD run).
    assert forged_refused == 4
    # Each floor is a low quantile of the same distribution the honest completions are drawn
    # from (the 1 % quantile less 1 nat; half the 5th percentile of leads), so each is
    # refused with probability about 6 % at most; 5 or more of 16 then has probability
    # about 0.2 % (binomial), where one draw's "at most 1" failed on other seeds (3 of 16).
    assert honest_refused <= 4, f"{honest_refused} of 16 honest completions refused"


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
        view = candidate_view(learner, peer, cut_after_answer=True)
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
