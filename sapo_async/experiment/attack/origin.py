"""Whose a producer is in an attack run: :func:`by_origin` and :func:`reasons_by_origin`.

Owns one rule: a producer is ``"honest"`` only if it is an honest node's address; every
other producer is ``"attacker"``. The rule is stated by the honest side because the
attack's side is open: the flood signs its copies with extra keys of its own
(:class:`~sapo_async.experiment.attack.flood.Flood`), which are neither an attacker node's
address nor an honest one's, and a count that knew only the attacker nodes' addresses
credited those copies to honest peers (issue 23).

Pure: counts in, counts out. Does not know the run, the nodes or the reports it counts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

__all__ = ["add_counts", "by_origin", "origin_of", "reasons_by_origin"]


def origin_of(producer: str, honest_keys: Collection[str]) -> str:
    """``"honest"`` for an honest node's address, ``"attacker"`` for any other producer."""
    return "honest" if producer in honest_keys else "attacker"


def by_origin(counts: Mapping[str, int], honest_keys: Collection[str]) -> dict[str, int]:
    """``counts`` by producer summed by origin (only origins with a producer appear).

    Args:
        counts: a number per producer address (a round's external groups trained on).
        honest_keys: the honest nodes' addresses.

    Returns:
        ``{"honest": n, "attacker": m}``, an origin left out where no producer had it.
    """
    out: dict[str, int] = {}
    for producer, n in counts.items():
        origin = origin_of(producer, honest_keys)
        out[origin] = out.get(origin, 0) + n
    return out


def reasons_by_origin(
    counts: Mapping[str, Mapping[str, int]], honest_keys: Collection[str]
) -> dict[str, dict[str, int]]:
    """``counts`` by producer and reason summed by origin and reason (see :func:`by_origin`).

    Args:
        counts: numbers per producer address and reason (a round's completions left out).
        honest_keys: the honest nodes' addresses.

    Returns:
        ``{"honest": {"stock_lead": n}, "attacker": {...}}``.
    """
    out: dict[str, dict[str, int]] = {}
    for producer, reasons in counts.items():
        mine = out.setdefault(origin_of(producer, honest_keys), {})
        for reason, n in reasons.items():
            mine[reason] = mine.get(reason, 0) + n
    return out


def add_counts(total: dict[str, int], more: Mapping[str, int]) -> None:
    """Add ``more`` into ``total`` key by key (a run's running totals)."""
    for key, n in more.items():
        total[key] = total.get(key, 0) + n
