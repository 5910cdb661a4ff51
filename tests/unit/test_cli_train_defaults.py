"""``sapo-async train``'s flags default to what a node's spec defaults to, from one source
(:mod:`sapo_async.limits`), and ``train --help`` still imports neither torch nor the
spec's pydantic models."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from typing import Any

from sapo_async.cli.train import train
from sapo_async.node.learner import LearnerSettings
from sapo_async.node.spec import PolicySpec, TrainingSpec
from sapo_async.policy.grpo import TrainerConfig

_ROUND, _TRAINER, _POLICY, _LEARNER = (
    TrainingSpec(),
    TrainerConfig(),
    PolicySpec(),
    LearnerSettings(),
)

SPEC_DEFAULTS: dict[str, Any] = {
    "questions_per_round": _ROUND.questions_per_round,
    "completions_per_question": _ROUND.completions_per_question,
    "max_new_tokens": _ROUND.max_new_tokens,
    "temperature": _ROUND.temperature,
    "top_p": _ROUND.top_p,
    "seed": _ROUND.seed,
    "lr": _TRAINER.lr,
    "loss_type": _TRAINER.loss_type,
    "model": _POLICY.model,
    "regime": _POLICY.regime,
    "tasks": _POLICY.tasks,
    "device": _POLICY.device,
    # train builds LearnerSettings, whose own defaults these are
    "top_k": _LEARNER.sampling.top_k,
    "prompt_style": _LEARNER.prompt_style,
    "chat_template": _LEARNER.chat_template,
    "node_index": _LEARNER.node_index,
}
"""Every train flag a node's settings also have, and the settings' default."""

CLI_ONLY = {
    "rounds",
    "threads",
    "log",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
    "cache_dir",
    "log_level",
}
"""Flags with no counterpart in a node's settings (the lone run's own)."""


def _flag_defaults() -> dict[str, Any]:
    return {name: p.default.default for name, p in inspect.signature(train).parameters.items()}


def test_every_train_flag_defaults_to_the_specs_default() -> None:
    flags = _flag_defaults()
    assert set(flags) == set(SPEC_DEFAULTS) | CLI_ONLY, "classify a new flag above"
    assert {name: flags[name] for name in SPEC_DEFAULTS} == SPEC_DEFAULTS


_CHANGED = {
    "DEFAULT_QUESTIONS_PER_ROUND": 5,
    "DEFAULT_COMPLETIONS_PER_QUESTION": 3,
    "DEFAULT_MAX_NEW_TOKENS": 7,
    "DEFAULT_TEMPERATURE": 0.5,
    "DEFAULT_TOP_P": 0.25,
    "DEFAULT_SWARM_SEED": 9,
    "DEFAULT_LR": 1e-4,
    "DEFAULT_LOSS_TYPE": "grpo",
}

_PROBE = """
import inspect, json, sys
import sapo_async.limits as limits
for name, value in json.loads(sys.argv[1]).items():
    setattr(limits, name, value)
from sapo_async.cli.train import train
from sapo_async.node.spec import TrainingSpec
from sapo_async.policy.grpo import TrainerConfig
flags = {n: p.default.default for n, p in inspect.signature(train).parameters.items()}
spec = {**TrainingSpec().model_dump(exclude={"trainer"}), **TrainerConfig().model_dump()}
print(json.dumps({"flags": flags, "spec": spec}, default=str))
"""


def test_a_default_changed_in_its_one_place_moves_the_spec_and_the_flag_together() -> None:
    # In a fresh interpreter: the constants are patched before anything reads them.
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(_CHANGED)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    seen = json.loads(out.stdout)
    fields = {
        "DEFAULT_QUESTIONS_PER_ROUND": "questions_per_round",
        "DEFAULT_COMPLETIONS_PER_QUESTION": "completions_per_question",
        "DEFAULT_MAX_NEW_TOKENS": "max_new_tokens",
        "DEFAULT_TEMPERATURE": "temperature",
        "DEFAULT_TOP_P": "top_p",
        "DEFAULT_SWARM_SEED": "seed",
        "DEFAULT_LR": "lr",
        "DEFAULT_LOSS_TYPE": "loss_type",
    }
    for constant, value in _CHANGED.items():
        name = fields[constant]
        assert (seen["flags"][name], seen["spec"][name]) == (value, value), constant


_HELP = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["sapo-async", "train", "--help"]
from sapo_async.cli.main import main
main()
"""


def test_train_help_imports_neither_torch_nor_the_specs_models() -> None:
    # sys.modules at exit, not -X importtime: the trace leaves out the command modules
    # build_app imports with importlib.
    shown = subprocess.run(
        [sys.executable, "-c", _HELP], capture_output=True, text=True, check=True, timeout=120
    )
    assert "--questions-per-round" in shown.stdout
    modules = set(json.loads(shown.stderr.strip().splitlines()[-1]))
    assert "sapo_async.cli.train" in modules
    heavy = {"sapo_async.node.spec", "sapo_async.policy.grpo.config", "sapo_async.policy.settings"}
    assert not {m for m in modules if m in heavy or m.split(".")[0] == "torch"}
