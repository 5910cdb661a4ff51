"""The per-round report a node emits: one plain dict feeds the status view and the metrics.

Owns only the shape of that dict. The node's round loop builds one per finished round;
:mod:`sapo_async.ops.status` renders it and :mod:`sapo_async.ops.metrics` exports it, so neither
needs to know the node.
"""

from __future__ import annotations

from typing import NotRequired, Required, TypedDict

__all__ = ["RoundReport"]


class RoundReport(TypedDict, total=False):
    """What one finished round did. Only ``round`` is required.

    Per-round counts (``groups_shared``, ``groups_received``, ``rejections``) cover this
    round only; ``commitments_pending`` and ``commitments_confirmed`` are the node's
    current totals (the recorder knows them, the round does not).
    """

    round: Required[int]
    """The node's round counter (starts at 0, strictly increasing)."""
    policy_version: NotRequired[int]
    """Optimizer steps taken so far (the version the next round generates with)."""
    reward: NotRequired[float]
    """Mean reward of the node's own completions this round, by its own verifier."""
    groups_shared: NotRequired[int]
    """Question groups this node published this round."""
    groups_received: NotRequired[int]
    """External groups that passed verification and entered the buffer this round."""
    groups_trained_external: NotRequired[int]
    """External groups the trainer used this round (J actually achieved)."""
    rejections: NotRequired[dict[str, int]]
    """External groups rejected this round, by reason (``bad_signature``, ``stale``...)."""
    staleness: NotRequired[float]
    """Mean rounds behind (trainer version minus generating version) of groups trained on."""
    commitments_pending: NotRequired[int]
    """Round commitments journaled but not yet confirmed on chain."""
    commitments_confirmed: NotRequired[int]
    """Round commitments confirmed on chain since the node first started."""
    round_s: NotRequired[float]
    """Wall-clock seconds the round took."""
