"""Fixtures of the bad-input suite: a sandbox directory with files that must survive."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.badinput.harness import snapshot

PASSWORD = "bad-input-suite-only"  # a throwaway keystore password for the sandbox


@dataclass
class Sandbox:
    """A working directory whose files a refused command must leave as they were."""

    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def config(self, text: str, name: str = "node.toml") -> Path:
        """Write a config file (data_dir inside the sandbox unless the text sets one)."""
        path = self.root / name
        if "data_dir" not in text and text.startswith("["):
            text = f'[node]\ndata_dir = "{self.data_dir}"\n' + text.replace("[node]\n", "", 1)
        path.write_text(text)
        return path

    def snapshot(self) -> dict[str, str]:
        return snapshot(self.root)


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """A fresh working directory (the cwd) with bystander files; no SAPO_* variables set."""
    for name in list(os.environ):
        if name.upper().startswith("SAPO_"):
            monkeypatch.delenv(name)
    root = tmp_path / "sandbox"
    (root / "data" / "checkpoints").mkdir(parents=True)
    (root / "data" / "checkpoints" / "notes.txt").write_text("a volunteer's file\n")
    (root / "README.txt").write_text("bystander\n")
    monkeypatch.chdir(root)
    return Sandbox(root)
