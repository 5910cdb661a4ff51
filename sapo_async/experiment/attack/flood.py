"""``flood``: many valid groups from many keys, and oversized ones.

Each group the attacker generates goes out ``copies`` times under each of ``keys`` extra
keys (distinct time stamps, so distinct hashes), and one oversized group per round beside
it. The content is the attacker's own honest groups: the harm is the receivers' time and
memory, measured as the honest round time against the no-attack run, and, where the
copies are admitted as distinct groups, the same group trained again in later rounds
(the collector now admits one content once).
"""

from __future__ import annotations

import random

from eth_account import Account
from eth_account.signers.local import LocalAccount
from msgspec.structs import replace

from sapo_async.experiment.attack.base import Forged, retext
from sapo_async.limits import MAX_GROUP_BYTES
from sapo_async.wire import RolloutGroup, keccak256


class Flood:
    name = "flood"

    def __init__(self, keys: int = 4, copies: int = 20) -> None:
        self.keys, self.copies = keys, copies
        self._accounts: dict[str, list[LocalAccount]] = {}

    def _keys(self, account: LocalAccount) -> list[LocalAccount]:
        if account.address not in self._accounts:
            self._accounts[account.address] = [
                Account.from_key(keccak256(f"flood:{account.address}:{k}".encode()))
                for k in range(self.keys)
            ]
        return self._accounts[account.address]

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        out = [Forged(group, account)]
        for key in self._keys(account):
            for c in range(self.copies):
                copy = replace(group, producer=key.address, created_at_ms=group.created_at_ms - c)
                out.append(Forged(copy, key))
        if group.task.index % 1024 == 0:  # slot 0: one oversized group per round
            big = " " + "9" * (MAX_GROUP_BYTES // len(group.completions) + 1024)
            out.append(Forged(retext(group, [big] * len(group.completions)), account))
        return out

    def carries_payload(self, text: str, answer: str) -> bool:
        return False
