"""NodeConfig: the written example round-trips, env overrides win, bad values name the field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError
from sapo_async.ops.config import NodeConfig, load_config, render_example, render_reference


@pytest.fixture(autouse=True)
def _clean_sapo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SAPO_"):
            monkeypatch.delenv(name)


def test_written_example_loads_back_to_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(render_example())
    assert load_config(path) == load_config()
    assert load_config(path) == NodeConfig()


def test_example_documents_every_field_of_every_section() -> None:
    text = render_example()
    for section, model in NodeConfig.model_fields.items():
        assert f"[{section}]" in text
        assert model.annotation is not None
        for name, info in model.annotation.model_fields.items():
            assert info.description, f"{section}.{name} has no description"
            assert f"# {info.description}" in text
            assert f"{name} =" in text


def test_example_lists_allowed_values_of_choices() -> None:
    assert 'One of: "grpo", "dapo", "dr_grpo"' in render_example()


def test_defaults_match_the_documented_values() -> None:
    cfg = load_config()
    assert cfg.node.swarm == "local"
    assert cfg.training.rounds is None
    assert cfg.node.data_dir == Path("~/.sapo").expanduser()
    assert cfg.keystore_path == cfg.node.data_dir / "key.json"
    assert cfg.nats.urls == ()
    assert cfg.ledger.enabled is True
    assert cfg.ledger.rpc_url is None
    assert (cfg.training.local, cfg.training.external) == (4, 4)
    assert cfg.training.lr == 3e-5
    assert (cfg.training.clip_low, cfg.training.clip_high) == (0.2, 0.28)
    assert cfg.metrics.prometheus_port is None


def test_environment_overrides_the_file_and_merges_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[training]\nlocal = 2\nlr = 1e-4\n[node]\nswarm = "alpha"\n')
    monkeypatch.setenv("SAPO_TRAINING__LR", "1e-5")
    monkeypatch.setenv("SAPO_NATS__URLS", "nats://a:4222, nats://b:4222")
    cfg = load_config(path)
    assert cfg.training.lr == 1e-5
    assert cfg.training.local == 2  # from the file, not reset by the env section
    assert cfg.node.swarm == "alpha"
    assert cfg.nats.urls == ("nats://a:4222", "nats://b:4222")


def test_environment_list_may_be_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_TASKS__FAMILIES", '["bf", "arc_1d"]')
    assert load_config().tasks.families == ["bf", "arc_1d"]


def test_password_variable_is_not_mistaken_for_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "hunter2")
    assert load_config() == NodeConfig()


def test_keyword_overrides_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_TRAINING__LR", "1e-5")
    assert load_config(training={"lr": 2e-5}).training.lr == 2e-5


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(ValueError, match="frozen"):
        cfg.training.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("toml", "field", "says"),
    [
        ('[training]\nloss_type = "sapo"\n', "training.loss_type", "'grpo', 'dapo' or 'dr_grpo'"),
        ("[training]\nlr = -1\n", "training.lr", "greater than 0"),
        (
            "[training]\ncompletions_per_question = 1\n",
            "training.completions_per_question",
            "greater than or equal to 2",
        ),
        ('[model]\nbackend = "tensorrt"\n', "model.backend", "'auto', 'transformers' or 'vllm'"),
        (
            "[model]\ngpu_memory_utilization = 1.5\n",
            "model.gpu_memory_utilization",
            "less than or equal to 1",
        ),
        ('[nats]\nurls = ["http://x:80"]\n', "nats.urls", "not a NATS URL"),
        ('[nats]\nstart = "oldest"\n', "nats.start", "'new', 'all' or a number of seconds"),
        ("[nats]\nstart = -5\n", "nats.start", "'new', 'all' or a number of seconds"),
        ("[nats]\nlookback_minutes = 5\n", "nats", "lookback_minutes is now called start"),
        ("[nats]\nshard_rotate_minutes = 5\n", "nats", "now called shard_rotate_s"),
        ("[node]\nseed = 3\n", "node", "seed is now called [training] seed"),
        ("[node]\nrounds = 3\n", "node", "rounds is now called [training] rounds"),
        ("[node]\ncheckpoint_every = 3\n", "node", "now called [checkpoint] every"),
        ('[ledger]\ncontract_address = "0x12"\n', "ledger.contract_address", "pattern"),
        ('[ledger]\nrpc_url = "http://x:8545"\n', "ledger", "contract_address"),
        ('[node]\nswarm = "a b"\n', "node.swarm", "pattern"),
        ("[training]\nlrr = 1\n", "training.lrr", "unknown setting (did you mean 'lr'?)"),
        ("[metrics]\nprometheus_port = 70000\n", "metrics.prometheus_port", "65535"),
        ("[training]\nlocal = 0\nexternal = 0\n", "training", "at least 1"),
        ('[nats]\ntls_cert = "/no/c.pem"\n', "nats.tls_cert", "no such file"),
    ],
)
def test_bad_value_in_file_names_the_field_and_what_is_allowed(
    tmp_path: Path, toml: str, field: str, says: str
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == field
    assert field in str(info.value)
    assert says in str(info.value)


def test_bad_value_in_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_TRAINING__LR", "fast")
    with pytest.raises(ConfigError, match=r"training\.lr = 'fast'.*SAPO_TRAINING__LR") as info:
        load_config()
    assert info.value.field == "training.lr"


def test_unknown_section_is_rejected_with_the_allowed_ones(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[trainig]\nlr = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \[trainig\].*\[training\]"):
        load_config(path)


def test_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sapo-async init"):
        load_config(tmp_path / "nope.toml")


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[training\n")
    with pytest.raises(ConfigError, match=r"node\.toml:1:10: not valid TOML: Expected"):
        load_config(path)


def test_client_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="tls_cert and tls_key must be set together") as info:
        load_config(nats={"tls_cert": str(cert)})
    assert info.value.field == "nats"


def test_init_command_writes_the_example_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    runner = CliRunner()
    result = runner.invoke(build_app(), ["init", str(path)])
    assert result.exit_code == 0, result.output
    assert path.read_text() == render_example()
    path.write_text("# mine\n")
    result = runner.invoke(build_app(), ["init", str(path)])
    assert result.exit_code != 0
    assert "--force" in result.output
    assert path.read_text() == "# mine\n"
    result = runner.invoke(build_app(), ["init", str(path), "--force"])
    assert result.exit_code == 0
    assert path.read_text() == render_example()


def test_docs_embed_the_current_settings_reference() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "volunteer.md"
    assert render_reference() in docs.read_text(), (
        "docs/volunteer.md is out of date: paste sapo_async.ops.config.render_reference()"
    )


def test_config_builds_the_node_spec_with_the_same_names(tmp_path: Path) -> None:
    from eth_account import Account

    from sapo_async.ops.hardware import HardwareChoice

    cfg = load_config(
        node={"swarm": "alpha", "data_dir": str(tmp_path)},
        training={
            "rounds": 5,
            "seed": 3,
            "questions_per_round": 6,
            "completions_per_question": 4,
            "local": 2,
            "external": 3,
            "lr": 1e-5,
            "overlap": True,
            "max_age_s": 30,
        },
        nats={"urls": "nats://a:4222,nats://b:4222", "start": 600},
        ledger={"rpc_url": "http://127.0.0.1:8545", "contract_address": "0x" + "2" * 40},
    )
    account = Account.create()
    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    spec = cfg.to_spec(account=account, hardware=hardware)
    t = spec.training
    assert (t.questions_per_round, t.completions_per_question, t.local, t.external) == (6, 4, 2, 3)
    assert t.trainer is not None
    assert t.trainer.lr == 1e-5
    assert (t.overlap, t.rounds, t.seed) == (True, 5, 3)
    assert t.max_age_s == 30  # main read training.max_age_s nowhere
    assert spec.swarm == "alpha"
    assert spec.account is account
    assert spec.policy.model == "tiny"
    assert spec.fabric.urls == ("nats://a:4222", "nats://b:4222")
    assert spec.fabric.start == 600.0
    assert spec.ledger.rpc_url == "http://127.0.0.1:8545"
    assert spec.ledger.journal_path == tmp_path / "journal" / "journal.sqlite"
    assert spec.checkpoint.dir == tmp_path / "checkpoints"
