"""Tokenizer digests: whether two nodes' token ids mean the same thing.

Owns :func:`tokenizer_id`, the digest a ``RolloutGroup`` carries so receivers know whether
its token ids and log-probs are meaningful to them. It sits beside the policy's parts
rather than in one of them because all three use it (models record it, generators stamp
it on their output, the trainer compares it) while the tiny-model builder in
:mod:`.models` samples through :mod:`.generation`: kept here, the parts import one way
(``models -> generation``, both and ``grpo`` -> ``digest``).

Deliberately does not know how a tokenizer is built or loaded; it reads only the
tokenizer object it is given and imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from typing import Any

from sapo_async.wire import keccak256

__all__ = ["tokenizer_id"]


def tokenizer_id(tokenizer: Any) -> str:
    """A stable hex digest of a tokenizer's behaviour (vocabulary, merges, added tokens).

    Fast tokenizers are digested through their canonical JSON; others through their sorted
    vocabulary and special tokens.

    Args:
        tokenizer: a transformers tokenizer (fast or slow).

    Returns:
        ``"0x"`` + the keccak-256 of that description, in hex.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = json.loads(backend.to_str())
        body = json.dumps(blob, sort_keys=True, separators=(",", ":"))
    else:
        vocab = sorted(tokenizer.get_vocab().items())
        body = json.dumps(
            {"vocab": vocab, "special": sorted(map(str, tokenizer.all_special_tokens))},
            separators=(",", ":"),
        )
    return "0x" + keccak256(body.encode()).hex()
