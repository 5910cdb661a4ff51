"""Where a benchmark writes: full runs to ``bench/results/<name>.json`` (recorded, cited by
the docs), smoke runs (``--quick``) to ``bench/results/quick/<name>.json`` (ignored by git),
so a smoke run never writes over a recorded full result."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(name: str, *, quick: bool) -> Path:
    """The file a run of benchmark ``name`` writes."""
    return (RESULTS / "quick" if quick else RESULTS) / f"{name}.json"
