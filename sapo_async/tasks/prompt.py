"""Prompt formatting and answer extraction.

Owns how a question is shown to a model and how an answer is read back: the answer is
the text inside the LAST ``<answer>...</answer>`` pair, stripped; no pair means no answer
(reward 0). Deliberately does not know about tokenizers' internals or rewards.

Styles:
    * ``compact``: the bare expression and `` =`` (e.g. ``"4 - 1 ="``) for families whose
      metadata has an ``expression``, else the question. The tiny model's style: short
      prompts keep a CPU node-round in tens of milliseconds. Departure from the paper,
      which prompts the full question with an instruction.
    * ``instruct``: the full reasoning-gym question plus an instruction to answer inside
      the tags (what an instruction-tuned model such as Qwen2.5-0.5B-Instruct gets; wrap it
      with :func:`apply_chat_template` when the tokenizer has a chat template).
"""

from __future__ import annotations

from typing import Any, Literal

from sapo_async.errors import ConfigError
from sapo_async.tasks.source import TaskItem

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "DEMONSTRATION",
    "INSTRUCTION",
    "PromptStyle",
    "apply_chat_template",
    "extract_answer",
    "format_prompt",
    "format_target",
]

PromptStyle = Literal["compact", "instruct"]
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
INSTRUCTION = (
    "Think briefly, then give only the final answer inside <answer> </answer> tags, "
    "for example <answer>42</answer>."
)


DEMONSTRATION = ("What is 2 + 3?", "2 + 3 = 5. <answer>5</answer>")
"""One solved exchange shown before the question in a chat model's prompt: how to use the
answer tags. Without it SmolLM2-135M-Instruct put 4 % of its completions' answers in tags
and scored 0.000 on chain_sum (24 completions of 64 tokens); with it 38 % and 0.042 at 32
tokens, the sample-limited regime where sharing can pay. Our departure from the paper,
whose prompt is not published with the figures."""


def format_prompt(item: TaskItem, style: PromptStyle = "compact") -> str:
    """The prompt text for ``item`` in ``style``.

    Raises:
        ConfigError: unknown style.
    """
    if style == "compact":
        expression = item.metadata.get("expression")
        if isinstance(expression, str) and expression:
            return f"{expression} ="
        return item.question
    if style == "instruct":
        return f"{item.question}\n\n{INSTRUCTION}"
    raise ConfigError(f"unknown prompt style {style!r}; allowed: compact, instruct", field="prompt")


def format_target(answer: str, *, tagged: bool) -> str:
    """The supervised completion for ``answer``: `` <answer>A</answer>`` or `` A``."""
    return f" {ANSWER_OPEN}{answer}{ANSWER_CLOSE}" if tagged else f" {answer}"


def extract_answer(text: str) -> str | None:
    """The stripped content of the last ``<answer>`` pair in ``text``, or ``None``.

    Pairs are read as the non-greedy regex ``<answer>(.*?)</answer>`` reads them (leftmost
    opening tag, nearest closing tag after it, then on from there), in linear time: that
    regex retries from every opening tag to the end of the text, so a peer's completion
    of 20,000 unclosed tags took 16 s (quadratic). Here each ``str.find`` starts where the
    previous one ended, and an opening tag with no closing tag after it ends the scan
    (no later tag can have one either).
    """
    last: str | None = None
    pos = 0
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            break
        body = start + len(ANSWER_OPEN)
        end = text.find(ANSWER_CLOSE, body)
        if end < 0:
            break
        last = text[body:end]
        pos = end + len(ANSWER_CLOSE)
    return None if last is None else last.strip()


def apply_chat_template(tokenizer: Any, prompt: str) -> str:
    """Wrap ``prompt`` as a user turn after one solved exchange (:data:`DEMONSTRATION`)
    with the tokenizer's chat template, if it has one.

    Returns:
        The templated text with the assistant turn opened, or ``prompt`` unchanged when the
        tokenizer has no chat template (base models, the tiny model).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return prompt
    demo_question, demo_answer = DEMONSTRATION
    return str(
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": f"{demo_question}\n\n{INSTRUCTION}"},
                {"role": "assistant", "content": demo_answer},
                {"role": "user", "content": prompt},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
    )
