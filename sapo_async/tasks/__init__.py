"""Tasks: reasoning-gym families, deterministic task items, prompts and the verifier."""

from sapo_async.tasks.prompt import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    PromptStyle,
    apply_chat_template,
    extract_answer,
    format_prompt,
    format_target,
)
from sapo_async.tasks.reward import Verifier
from sapo_async.tasks.source import (
    Purpose,
    TaskItem,
    TaskSource,
    dataset_seed,
    derive,
    item_index,
    score_entry,
)
from sapo_async.tasks.spec import (
    CPU_EASY_PRESET,
    CPU_PRESET,
    PAPER_PRESET,
    PRESETS,
    FamilySpec,
    canonical_config_json,
    config_digest,
    preset,
)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "CPU_EASY_PRESET",
    "CPU_PRESET",
    "PAPER_PRESET",
    "PRESETS",
    "FamilySpec",
    "PromptStyle",
    "Purpose",
    "TaskItem",
    "TaskSource",
    "Verifier",
    "apply_chat_template",
    "canonical_config_json",
    "config_digest",
    "dataset_seed",
    "derive",
    "extract_answer",
    "format_prompt",
    "format_target",
    "item_index",
    "preset",
    "score_entry",
]
