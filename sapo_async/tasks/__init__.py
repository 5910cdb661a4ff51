"""Tasks: reasoning-gym families, deterministic task items, prompts and the verifier.

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
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
        CPU_MIX_PRESET,
        CPU_PRESET,
        PAPER_PRESET,
        PRESETS,
        FamilySpec,
        canonical_config_json,
        config_digest,
        preset,
    )

_LAZY = {
    "ANSWER_CLOSE": "sapo_async.tasks.prompt",
    "ANSWER_OPEN": "sapo_async.tasks.prompt",
    "CPU_EASY_PRESET": "sapo_async.tasks.spec",
    "CPU_MIX_PRESET": "sapo_async.tasks.spec",
    "CPU_PRESET": "sapo_async.tasks.spec",
    "FamilySpec": "sapo_async.tasks.spec",
    "PAPER_PRESET": "sapo_async.tasks.spec",
    "PRESETS": "sapo_async.tasks.spec",
    "PromptStyle": "sapo_async.tasks.prompt",
    "Purpose": "sapo_async.tasks.source",
    "TaskItem": "sapo_async.tasks.source",
    "TaskSource": "sapo_async.tasks.source",
    "Verifier": "sapo_async.tasks.reward",
    "apply_chat_template": "sapo_async.tasks.prompt",
    "canonical_config_json": "sapo_async.tasks.spec",
    "config_digest": "sapo_async.tasks.spec",
    "dataset_seed": "sapo_async.tasks.source",
    "derive": "sapo_async.tasks.source",
    "extract_answer": "sapo_async.tasks.prompt",
    "format_prompt": "sapo_async.tasks.prompt",
    "format_target": "sapo_async.tasks.prompt",
    "item_index": "sapo_async.tasks.source",
    "preset": "sapo_async.tasks.spec",
    "score_entry": "sapo_async.tasks.source",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "CPU_EASY_PRESET",
    "CPU_MIX_PRESET",
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
