"""The ABI and bytecode Python deploys are generated from the current Solidity sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo_async.ledger.artifacts import ARTIFACT_DIR, load_artifact, source_hash

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


@pytest.mark.parametrize("name", ["SapoLedger", "NaiveLedger"])
def test_artifacts_are_built_from_the_current_sources(name: str):
    artifact = load_artifact(name)
    assert artifact.source_hash == source_hash(CONTRACTS), (
        f"sapo_async/ledger/artifacts/{name}.json is stale: run `just contracts`"
    )
    assert artifact.bytecode.startswith("0x6")  # creation code starts with a PUSHn
    assert len(artifact.bytecode) > 100


def test_source_hash_changes_when_a_source_changes(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "foundry.toml").write_text("[profile.default]\n")
    (tmp_path / "src" / "A.sol").write_text("contract A {}\n")
    before = source_hash(tmp_path)
    (tmp_path / "src" / "A.sol").write_text("contract A { uint x; }\n")
    assert source_hash(tmp_path) != before


def test_artifacts_match_the_installed_openzeppelin_version():
    package = CONTRACTS.parent / "node_modules" / "@openzeppelin" / "contracts" / "package.json"
    if not package.exists():
        pytest.skip("node_modules not installed (run `npm ci`)")
    raw = json.loads((ARTIFACT_DIR / "SapoLedger.json").read_text())
    assert raw["openzeppelin"] == json.loads(package.read_text())["version"], (
        "artifacts were built against another OpenZeppelin: run `just contracts`"
    )
