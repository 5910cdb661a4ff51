"""The compiled contracts Python deploys and talks to (written by ``contracts/build.sh``).

Owns loading ``sapo_async/ledger/artifacts/<Name>.json`` and the source hash that says which
Solidity sources they were built from. The hash is sha256 over ``foundry.toml`` and every
``contracts/src/*.sol``, each fed as ``"<path>\\0<content>\\0"`` sorted by path; it must match
``contracts/export-artifacts.js`` (a test fails when artifacts are stale).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_async.errors import LedgerError

__all__ = ["ARTIFACT_DIR", "Artifact", "load_artifact", "source_hash"]

ARTIFACT_DIR = Path(__file__).with_name("artifacts")


@dataclass(frozen=True, slots=True)
class Artifact:
    """ABI and creation bytecode of one contract."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    source_hash: str


@functools.cache
def load_artifact(name: str) -> Artifact:
    """Load the artifact of contract ``name`` (``SapoLedger`` or ``NaiveLedger``).

    Raises:
        LedgerError: the artifact is missing (run ``just contracts``) or unreadable.
    """
    path = ARTIFACT_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Artifact(
            name=name, abi=data["abi"], bytecode=data["bytecode"], source_hash=data["sourceHash"]
        )
    except (OSError, KeyError, ValueError) as exc:
        raise LedgerError(
            f"contract artifact {path} unusable ({exc}); run `just contracts`"
        ) from exc


def source_hash(contracts_dir: Path) -> str:
    """Hash the Solidity sources under ``contracts_dir`` as the build stamps them."""
    files = ["foundry.toml", *(f"src/{p.name}" for p in (contracts_dir / "src").glob("*.sol"))]
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0")
        digest.update((contracts_dir / rel).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()
