"""The attack matrix's record, ``runs.jsonl``: a first line holding the spec, then one run a
line; :func:`load_runs` reads the runs a spec may resume or summarise.

Owns when recorded runs count as a spec's: their spec, read as it is recorded
(:func:`recorded_spec`), equals the spec asked for but for :data:`GROWS` (a later sitting
may ask for more attacks or seeds). Read so:

* a field the spec gained after the runs were recorded counts as its default (the default
  kept the behaviour those runs had); so does a defence setting the node's
  :class:`~sapo_async.node.spec_defence.DefenceSpec` gained;
* runs recorded before the experiment took a node's ``DefenceSpec`` (no ``defence`` in
  their spec) recorded eight settings of the experiment's own instead, with defaults of its
  own (:data:`LEGACY_DEFENCE`, all off): each is read as the ``[defence]`` setting it set,
  the rest of the node's defence as a node's default. So ``just attack-real --recorded``
  summarises the matrix recorded with the flags that imitated a node's defaults;
* a defence setting the node spec no longer has counts only while it is off (``false`` or
  0): a defence removed is a defence off, but runs that measured one on measured
  something this code cannot run, so they count as no current spec's.

Other recorded runs are never lost: resuming moves them beside the record
(``runs.jsonl.N``) and says so; summarising them (``--recorded``) refuses, naming the first
setting that differs. Does not know how runs are made (:mod:`.runner`) or summarised
(:mod:`.summary`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
from sapo_async.node.spec_defence import DefenceSpec

__all__ = ["GROWS", "LEGACY_DEFENCE", "difference", "load_runs", "recorded_spec"]

GROWS = ("attacks", "seeds")
"""Spec fields a later call may extend without losing the runs recorded so far."""

LEGACY_DEFENCE: dict[str, tuple[str, Any]] = {
    "strict_end": ("strict_end", False),
    "cut_after_answer": ("cut_after_answer", False),
    "drop_after_answer": ("drop_after_answer", False),
    "tail_share": ("tail_share", 0.0),
    "stock_lead_share": ("stock_lead_share", 0.0),
    "lead_probation": ("stock_lead_probation", False),
    "balanced_draw": ("balanced_draw", False),
    "brevity_guard": ("brevity_guard", False),
}
"""The experiment's own defence settings in records made before it took a node's
``DefenceSpec``: each recorded key, the ``[defence]`` key it set (``strict_end`` keeps its
name: the key it set is gone from the node spec), and the experiment's default then (every
one off, kept so that older matrices resumed). Names in old files, read only here."""


def recorded_spec(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded spec (``runs.jsonl``'s first line) in today's terms, to compare with
    :meth:`AttackSpec.record` (see the module docstring).

    Args:
        recorded: the spec as the record holds it (JSON).

    Returns:
        Every field of today's spec, ``defence`` with every setting of today's node spec
        and any removed one that was on.
    """
    spec: dict[str, Any] = AttackSpec().record() | dict(recorded)
    defence: dict[str, Any] = dict(recorded.get("defence", {}))
    if "defence" not in recorded:  # recorded with the experiment's own settings
        for old, (key, default) in LEGACY_DEFENCE.items():
            defence[key] = spec.pop(old, default)
    node = DefenceSpec().model_dump(mode="json")
    spec["defence"] = node | {
        key: value for key, value in defence.items() if key in node or value not in (False, 0)
    }
    return spec


def difference(recorded: dict[str, Any], asked: dict[str, Any]) -> str | None:
    """The first setting where two specs in today's terms differ (``GROWS`` aside), as
    ``"defence.stock_lead_share: recorded 0.0, asked 0.5"``; None where none does."""
    flat_recorded, flat_asked = _flat(recorded), _flat(asked)
    for key in sorted(flat_recorded.keys() | flat_asked.keys()):
        if key in GROWS:
            continue
        was, now = flat_recorded.get(key, "(unset)"), flat_asked.get(key, "(unset)")
        if was != now:
            return f"{key}: recorded {json.dumps(was)}, asked {json.dumps(now)}"
    return None


def _flat(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with ``defence``'s settings as ``defence.<key>``."""
    out = {k: v for k, v in spec.items() if k != "defence"}
    out |= {f"defence.{k}": v for k, v in spec.get("defence", {}).items()}
    return out


def load_runs(path: Path, spec: AttackSpec, *, recorded: bool = False) -> list[RunMeasure]:
    """Runs recorded at ``path`` that count as ``spec``'s (see the module docstring); the
    record's first line then holds ``spec`` (more attacks or seeds may be asked for than
    were recorded: the matrix grows across sittings).

    Args:
        path: the ``runs.jsonl`` of a matrix (need not exist).
        spec: the spec asked for.
        recorded: only summarise: never move or write a record.

    Returns:
        The runs that count as ``spec``'s; none (and a fresh record, the old one kept
        beside it as ``runs.jsonl.N``, never overwritten) where the record is another
        spec's.

    Raises:
        ConfigError: with ``recorded``, the record is another spec's (the first setting
            that differs named).
    """
    mine = spec.record()
    runs: list[RunMeasure] = []
    lines = path.read_text().splitlines() if path.exists() else []
    if lines:
        theirs = recorded_spec(json.loads(lines[0]).get("spec", {}))
        differs = difference(theirs, mine)
        if differs is None:
            runs = [RunMeasure(**json.loads(line)) for line in lines[1:] if line.strip()]
        elif recorded:
            raise ConfigError(
                f"{path} holds runs of another spec ({differs}): ask for the recorded "
                "settings, or summarise another --out",
                field="out",
            )
        elif len(lines) > 1:
            n = 1
            while path.with_name(f"{path.name}.{n}").exists():
                n += 1
            path.rename(path.with_name(f"{path.name}.{n}"))
            print(
                f"  {path} held runs of another spec ({differs}): kept as {path.name}.{n}",
                file=sys.stderr,
                flush=True,
            )
    if not recorded:
        header = json.dumps({"spec": mine}) + "\n"
        path.write_text(header + "".join(json.dumps(asdict(r)) + "\n" for r in runs))
    return runs
