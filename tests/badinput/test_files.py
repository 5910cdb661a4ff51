"""Bad config files: missing, a directory, not TOML, not text. Each named with what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.badinput.conftest import Sandbox
from tests.badinput.harness import assert_refused, invoke


def _refuse(sandbox: Sandbox, args: list[str], *culprits: str) -> str:
    before = sandbox.snapshot()
    return assert_refused(invoke(args), *culprits, before=before, sandbox=sandbox.root)


def test_node_refuses_a_config_that_does_not_exist(sandbox: Sandbox) -> None:
    # main started the node on the defaults when --config named a missing file
    missing = sandbox.root / "nope.toml"
    _refuse(sandbox, ["node", "--config", str(missing)], str(missing), "does not exist", "init")
    assert not missing.exists()


def test_node_refuses_a_config_that_is_a_directory(sandbox: Sandbox) -> None:
    _refuse(sandbox, ["node", "--config", str(sandbox.data_dir)], "is a directory")


def test_toml_syntax_error_names_file_line_and_column(sandbox: Sandbox) -> None:
    path = sandbox.root / "node.toml"
    path.write_text('[node]\nswarm = "a"\n[training\nlr = 1\n')
    _refuse(sandbox, ["node", "--config", str(path)], f"{path}:3:10:", "not valid TOML")


def test_unclosed_string_names_its_line(sandbox: Sandbox) -> None:
    path = sandbox.root / "node.toml"
    path.write_text('[node]\n\n\nswarm = "a\n')
    _refuse(sandbox, ["node", "--config", str(path)], f"{path}:4:", "not valid TOML")


def test_duplicate_key_is_a_toml_error(sandbox: Sandbox) -> None:
    path = sandbox.root / "node.toml"
    path.write_text("[training]\nlr = 1e-5\nlr = 2e-5\n")
    _refuse(sandbox, ["node", "--config", str(path)], f"{path}:3:", "not valid TOML")


def test_binary_file_is_not_toml(sandbox: Sandbox) -> None:
    path = sandbox.root / "node.toml"
    path.write_bytes(b"\xff\xfe\x00garbage\x9c")
    _refuse(sandbox, ["node", "--config", str(path)], str(path), "not valid TOML")


def test_dangling_symlink_is_a_missing_file(sandbox: Sandbox) -> None:
    path = sandbox.root / "link.toml"
    path.symlink_to(sandbox.root / "gone.toml")
    _refuse(sandbox, ["node", "--config", str(path)], str(path), "does not exist")


def test_doctor_refuses_a_missing_config(sandbox: Sandbox) -> None:
    before = sandbox.snapshot()
    outcome = invoke(["doctor", "--config", "nope.toml", "--skip-gpu"])
    assert_refused(
        outcome,
        "nope.toml",
        "does not exist",
        code=1,
        prefix="[FAIL] config:",
        before=before,
        sandbox=sandbox.root,
    )


def test_identity_refuses_a_missing_config(sandbox: Sandbox) -> None:
    before = sandbox.snapshot()
    outcome = invoke(["identity", "--config", "nope.toml"])
    assert_refused(
        outcome,
        "nope.toml",
        "does not exist",
        code=1,
        prefix="identity:",
        before=before,
        sandbox=sandbox.root,
    )


def test_init_refuses_a_directory_under_a_file(sandbox: Sandbox) -> None:
    target = sandbox.root / "README.txt" / "node.toml"
    _refuse(sandbox, ["init", str(target)], str(target), "is a file, not a directory")


def test_init_refuses_a_path_that_is_a_directory(sandbox: Sandbox) -> None:
    _refuse(sandbox, ["init", str(sandbox.data_dir)], str(sandbox.data_dir), "is a directory")


def test_init_refuses_a_read_only_place(sandbox: Sandbox) -> None:
    # /proc refuses new files even to root (chmod cannot make a directory unwritable for root)
    _refuse(sandbox, ["init", "/proc/sapo-node.toml"], "/proc/sapo-node.toml", "cannot write")


def test_init_keeps_an_existing_file(sandbox: Sandbox) -> None:
    path = sandbox.root / "README.txt"
    before = sandbox.snapshot()
    outcome = invoke(["init", str(path)])
    assert outcome.code == 1
    assert "--force" in outcome.stderr
    assert sandbox.snapshot() == before


def test_node_without_a_password_source_names_the_variable(sandbox: Sandbox) -> None:
    # CliRunner's stdin is not a terminal, so there is nobody to prompt
    path = sandbox.config("[ledger]\nenabled = false\n")
    _refuse(sandbox, ["node", "--config", str(path)], "SAPO_KEY_PASSWORD", "password_file")


def test_node_with_a_wrong_password_keeps_the_keystore(sandbox: Sandbox) -> None:
    path = sandbox.config("[ledger]\nenabled = false\n")
    made = invoke(["identity", "--config", str(path)], env={"SAPO_KEY_PASSWORD": "right"})
    assert made.code == 0, made.output
    before = sandbox.snapshot()
    assert "data/key.json" in before
    outcome = invoke(["node", "--config", str(path)], env={"SAPO_KEY_PASSWORD": "wrong"})
    assert_refused(outcome, "key.json", before=before, sandbox=sandbox.root)


def test_resume_refuses_a_checkpoint_whose_manifest_lists_no_digests(
    sandbox: Sandbox, tiny_lm: Any, tiny_dir: Path
) -> None:
    # `files = {}` beside a truncated model.safetensors: nothing to check the file against,
    # so main's loader met the torn file and died with a SafetensorError traceback
    from sapo_async.node.learner import Learner
    from sapo_async.tasks import TaskSource, preset

    learner = Learner(tiny_lm.model, tiny_lm.tokenizer, TaskSource(preset("cpu")))
    checkpoints = sandbox.data_dir / "checkpoints"
    saved = learner.save(checkpoints)
    manifest = json.loads((saved / "manifest.json").read_text())
    (saved / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    model_file = saved / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:100])
    args = ["train", "--model", str(tiny_dir), "--rounds", "1"]
    args += ["--checkpoint-dir", str(checkpoints), "--resume"]
    before = sandbox.snapshot()
    line = assert_refused(
        invoke(args),
        str(saved),
        "lists no digest for model.safetensors",
        code=1,
        before=before,
        sandbox=sandbox.root,
    )
    assert "no usable checkpoint" in line
