"""A step's stages are timed where they run (``Trainer.stage_seconds``, read by the
profile in ``bench/real_profile.py``): the forward, backward and optimizer of the update,
the frozen log-probs only when a pass of their own runs, and each step's times are its own."""

from __future__ import annotations

from typing import Any

from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup, Trainer
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.policy.grpo.trainer import STAGES
from tests.unit.test_grpo_reference import _model, _tokenizer, config, groups


def _trainer(**more: Any) -> tuple[Trainer, Any]:
    tok = _tokenizer()
    return Trainer(_model(tok), tok, config("dapo", **more), add_special_tokens=False), tok


def test_every_stage_of_a_one_update_step_is_timed_and_no_old_logprob_pass_runs() -> None:
    trainer, tok = _trainer()
    assert not trainer.step(groups(tok)).skipped
    seconds = trainer.stage_seconds
    assert tuple(seconds) == STAGES
    assert all(seconds[s] > 0 for s in ("batch", "forward", "backward", "optimizer"))
    # one update: its own detached log-probs serve as the old ones
    assert seconds["old_logprobs"] == 0.0


def test_the_old_logprob_pass_is_timed_when_it_runs() -> None:
    trainer, tok = _trainer(ppo_epochs=2)
    trainer.step(groups(tok))
    assert trainer.stage_seconds["old_logprobs"] > 0


def test_a_skipped_step_leaves_no_times_of_the_step_before() -> None:
    trainer, tok = _trainer()
    trainer.step(groups(tok))
    same = (ScoredCompletion("4", 1.0), ScoredCompletion("4", 1.0))
    assert trainer.step([ScoredGroup("2+2=", same, token_source=TokenSource.TEXT)]).skipped
    assert trainer.stage_seconds == dict.fromkeys(STAGES, 0.0)
