"""``sybil``: one content under many keys.

Keys are free (docs/security.md, Threat model), and every per-producer limit counts keys:
the draw's ``per_producer_cap`` (where set), the producer-round cap, the quarantine's
verdicts, the stock-lead record's window and its probation. An attacker that signs the
same content with ``keys`` more keys is that many producers to all of them, and competes
for that many more external slots; "Hail to the Thief" (arXiv 2511.09780v2) found its
false-statement attack barely weakened down to 6.25 % attackers, so every slot won
counts. Each message of the inner attack (the :mod:`.trigger` attack by default) goes
out under the attacker's own key and again, the same group with only its producer
changed, under each extra key (derived from the attacker's address as :mod:`.flood`
derives its own, on another label), so its hash and signature differ and its content does
not. Unlike ``flood`` it sends no copies under one key and no oversized group: only as
many messages as keys, each worth training on.

Payload: the inner attack's.
"""

from __future__ import annotations

import random

from eth_account import Account
from eth_account.signers.local import LocalAccount
from msgspec.structs import replace

from sapo_async.experiment.attack.base import Attack, Forged
from sapo_async.experiment.attack.trigger import Trigger
from sapo_async.wire import RolloutGroup, keccak256


class Sybil:
    name = "sybil"

    def __init__(self, inner: Attack | None = None, keys: int = 4) -> None:
        self.inner: Attack = inner or Trigger()
        self.keys = keys
        self._accounts: dict[str, list[LocalAccount]] = {}

    def keys_of(self, account: LocalAccount) -> list[LocalAccount]:
        """The extra keys of the attacker with ``account`` (the same every call)."""
        if account.address not in self._accounts:
            self._accounts[account.address] = [
                Account.from_key(keccak256(f"sybil:{account.address}:{k}".encode()))
                for k in range(self.keys)
            ]
        return self._accounts[account.address]

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        sent = self.inner.forge(group, account, rng)
        out = list(sent)
        for key in self.keys_of(account):
            out += [Forged(replace(f.group, producer=key.address), key) for f in sent]
        return out

    def carries_payload(self, text: str, answer: str) -> bool:
        return self.inner.carries_payload(text, answer)
