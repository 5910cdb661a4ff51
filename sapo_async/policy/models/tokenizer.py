"""The tiny model's tokenizer, trained offline with ``tokenizers``.

Owns the character-level tokenizer trained on generated task text: a BPE model with no
merges (so every character is one token) plus ``<pad>``, ``<eos>``, ``<unk>`` and the two
answer tags as single added tokens (a tokenizer's digest is
:func:`sapo_async.policy.digest.tokenizer_id`). Deliberately does not know about models or
tasks beyond the text it is given.

Why the tags are single tokens: emitting ``<answer>`` is then one decision of the policy,
which is exactly the behaviour the sparse regime asks RL to discover.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, trainers
from transformers import PreTrainedTokenizerFast

from sapo_async.tasks.prompt import ANSWER_CLOSE, ANSWER_OPEN

__all__ = ["EOS", "PAD", "UNK", "train_char_tokenizer"]

PAD = "<pad>"
EOS = "<eos>"
UNK = "<unk>"


def train_char_tokenizer(texts: Iterable[str]) -> Any:
    """Train a character-level tokenizer on ``texts``.

    Args:
        texts: task text (prompts and bare answers); every character seen becomes a token.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with pad, eos and unk set. Ids are
        deterministic: specials first, then characters in the order the trainer sorts them.
    """
    tok = Tokenizer(models.BPE(unk_token=UNK))
    # vocab_size=1 < alphabet: the trainer keeps the whole alphabet and learns no merges.
    trainer = trainers.BpeTrainer(vocab_size=1, special_tokens=[PAD, EOS, UNK], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(
        [AddedToken(ANSWER_OPEN, normalized=False), AddedToken(ANSWER_CLOSE, normalized=False)]
    )
    tok.decoder = decoders.Fuse()
    fast: Any = PreTrainedTokenizerFast
    return fast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side="left"
    )
