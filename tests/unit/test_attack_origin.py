"""The attack experiment counts every producer that is not an honest node as the attack's.

Issue 23: the count once knew only the attacker nodes' own addresses, so the groups the
flood signs with its extra keys were credited to honest peers. Fixed inputs, not a sampled
run: what a run trains depends on floating point, which differs between CPUs."""

from __future__ import annotations

import random

from eth_account import Account

from sapo_async.experiment.attack.flood import Flood
from sapo_async.experiment.attack.origin import by_origin, reasons_by_origin
from sapo_async.wire import keccak256
from tests.fixtures.fabric import make_group


def _swarm(nodes: int = 4) -> list:
    """The keys the attack runner's nodes get (lockstep: ``f"{key_label}:{i}"``)."""
    return [Account.from_key(keccak256(f"sapo-attack:0:{i}".encode())) for i in range(nodes)]


def _flood_keys(attacker) -> set[str]:
    """The extra keys the flood signs an attacker's copies with, from what it sends."""
    forged = Flood().forge(make_group(attacker), attacker, random.Random(0))
    return {f.group.producer for f in forged} - {attacker.address}


def test_groups_the_flood_signs_with_its_extra_keys_count_as_the_attackers():
    *honest, attacker = _swarm()
    flood_keys = _flood_keys(attacker)
    honest_keys = {a.address for a in honest}
    assert len(flood_keys) == Flood().keys
    assert flood_keys.isdisjoint(honest_keys)
    trained = {honest[0].address: 2, honest[1].address: 1, attacker.address: 1}
    trained |= dict.fromkeys(flood_keys, 3)
    assert by_origin(trained, honest_keys) == {"honest": 3, "attacker": 1 + 3 * len(flood_keys)}


def test_completions_left_out_of_the_floods_copies_count_as_the_attackers():
    *honest, attacker = _swarm()
    flood_keys = _flood_keys(attacker)
    left_out = {key: {"stock_lead": 2} for key in flood_keys}
    left_out[honest[2].address] = {"stock_lead": 1, "after_answer": 1}
    assert reasons_by_origin(left_out, {a.address for a in honest}) == {
        "attacker": {"stock_lead": 2 * len(flood_keys)},
        "honest": {"stock_lead": 1, "after_answer": 1},
    }


def test_an_origin_no_producer_had_is_left_out():
    *honest, _ = _swarm()
    assert by_origin({honest[0].address: 2}, {a.address for a in honest}) == {"honest": 2}
    assert by_origin({}, set()) == {}
