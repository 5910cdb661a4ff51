"""Task families, their configs, canonical config JSON and digests, and the presets.

Owns what a "task family" is on the wire: a reasoning-gym dataset name plus a config dict
whose canonical JSON (sorted keys, no spaces, ASCII) is what :class:`~sapo_async.wire.TaskRef`
digests with keccak-256. Deliberately does not know about seeds, indices, prompts or scoring
(see :mod:`sapo_async.tasks.source` and :mod:`sapo_async.tasks.verify`).

Invariants:
    * ``config_json`` never contains ``seed`` or ``size``: the seed travels in the TaskRef
      and reasoning-gym item access ignores ``size``;
    * equal configs give byte-equal canonical JSON and therefore equal digests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.wire import keccak256

__all__ = [
    "CPU_EASY_PRESET",
    "CPU_MIX_PRESET",
    "CPU_PRESET",
    "PAPER_PRESET",
    "PRESETS",
    "REAL_MIX_PRESET",
    "REAL_SPARSE_PRESET",
    "FamilySpec",
    "canonical_config_json",
    "config_digest",
    "preset",
]

_RESERVED_KEYS = frozenset({"seed", "size"})


def canonical_config_json(config: Mapping[str, Any]) -> str:
    """Return the canonical JSON of a dataset config (sorted keys, compact, ASCII).

    Tuples become lists, as JSON has only one sequence type.

    Raises:
        ConfigError: the config holds ``seed``/``size`` or a value JSON cannot encode.
    """
    bad = _RESERVED_KEYS.intersection(config)
    if bad:
        raise ConfigError(
            f"task config must not set {sorted(bad)}: seed travels in the TaskRef",
            field="tasks.config",
        )
    try:
        return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"task config is not JSON-encodable: {exc}", field="tasks.config"
        ) from exc


def config_digest(config_json: str) -> str:
    """Hex keccak-256 of canonical config JSON (what ``TaskRef.config_digest`` holds)."""
    return "0x" + keccak256(config_json.encode("ascii")).hex()


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One reasoning-gym family with its dataset config.

    Attributes:
        family: reasoning-gym dataset name, e.g. ``"chain_sum"``.
        config: dataset config without ``seed``/``size``.
        weight: relative sampling weight when a preset mixes families.
    """

    family: str
    config: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 1.0

    @property
    def config_json(self) -> str:
        """Canonical JSON of :attr:`config`."""
        return canonical_config_json(self.config)

    @property
    def digest(self) -> str:
        """Hex keccak-256 of :attr:`config_json`."""
        return config_digest(self.config_json)


# The paper's nine families (SAPO §4) with reasoning-gym's default difficulty.
PAPER_PRESET: tuple[FamilySpec, ...] = tuple(
    FamilySpec(name)
    for name in (
        "base_conversion",
        "basic_arithmetic",
        "arc_1d",
        "bf",
        "propositional_logic",
        "fraction_simplification",
        "decimal_arithmetic",
        "calendar_arithmetic",
        "binary_matrix",
    )
)

# Where the ~1 M-parameter tiny model learns within minutes on 2 cores: sums and differences
# of 2 to 3 numbers of 1 to 2 digits (answers of 1 to 3 characters). chain_sum scores with
# decimal equality plus partial credit len(oracle)/len(answer) when the oracle is a
# substring, so a near miss such as "112" for "12" earns 0.67 (the dense regime's gradient).
CPU_PRESET: tuple[FamilySpec, ...] = (
    FamilySpec("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
)

# The smallest learnable setting (sums/differences of two 1-digit numbers): what the test
# suite trains on, because a ~0.1 M parameter model learns it within seconds.
CPU_EASY_PRESET: tuple[FamilySpec, ...] = (
    FamilySpec("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
)

# Three families in one swarm, as the paper mixed nine, all with a bare expression the
# tiny model's compact prompt shows (``metadata["expression"]``) and 1-to-3 character
# answers: chain_sum as in ``cpu``, one-digit products, and one-digit basic_arithmetic with
# all four operators (integer results, no parentheses or negation).
CPU_MIX_PRESET: tuple[FamilySpec, ...] = (
    CPU_PRESET[0],
    FamilySpec("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    FamilySpec(
        "basic_arithmetic",
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "allow_parentheses": False,
            "allow_negation": False,
        },
    ),
)

# Where SmolLM2-135M-Instruct (Q4_1, 32 tokens, the instruct prompt with one demonstration)
# starts in the sample-limited range, about 0.02 to 0.5 (docs/results/paper-table-real/
# start.json, 16 questions x 4 completions each): one-digit sums and differences (0.086),
# one-digit products (0.031) and one-digit basic_arithmetic as in ``cpu_mix`` (0.078). At
# reasoning-gym's default difficulty it scores 0.000 to 0.001 on all nine paper families.
REAL_MIX_PRESET: tuple[FamilySpec, ...] = (CPU_EASY_PRESET[0], *CPU_MIX_PRESET[1:])

# The low end of that range, where LEARNING-NOTES' mechanism says sharing pays most (few
# local groups carry signal): the three measured families that start at 0.016 to 0.031 with
# a fifth of their groups or fewer informative (start.json): two-to-three-term sums of 1-2
# digits (``cpu``, 0.016), one-digit products (0.031) and base conversion of values up to 15
# between bases 2 and 10 (0.023; measured with values from 0). Values start at 1 here:
# reasoning-gym 0.1.25 writes 0's conversion as the empty answer, which nothing can match.
# The SmolLM2 table's default since 2026-12-03: 2/2 over 4/0 1.89x and 1.97x at 8 nodes
# (docs/results/paper-table-real); 2.01x, 1.02x and 1.91x at 4 (paper-table-real-sparse).
REAL_SPARSE_PRESET: tuple[FamilySpec, ...] = (
    CPU_PRESET[0],
    CPU_MIX_PRESET[1],
    FamilySpec("base_conversion", {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 15}),
)

PRESETS: Mapping[str, tuple[FamilySpec, ...]] = {
    "paper": PAPER_PRESET,
    "cpu": CPU_PRESET,
    "cpu_mix": CPU_MIX_PRESET,
    "cpu_easy": CPU_EASY_PRESET,
    "real_mix": REAL_MIX_PRESET,
    "real_sparse": REAL_SPARSE_PRESET,
}


def preset(name: str) -> tuple[FamilySpec, ...]:
    """Return the named preset (``"paper"``, ``"cpu"``, ``"cpu_mix"``, ``"cpu_easy"``,
    ``"real_mix"`` or ``"real_sparse"``).

    Raises:
        ConfigError: unknown preset name.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown task preset {name!r}; allowed: {sorted(PRESETS)}", field="tasks.preset"
        ) from None
