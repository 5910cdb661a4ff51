"""Bad SAPO_* environment: a bad override or a variable that sets nothing is refused by name."""

from __future__ import annotations

import pytest

from tests.badinput.conftest import Sandbox
from tests.badinput.harness import assert_refused, invoke

# (variable, value, what the one error line must name)
CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "lr_not_a_number": (
        "SAPO_TRAINING__LR",
        "abc",
        ("training.lr", "'abc'", "SAPO_TRAINING__LR", "valid number"),
    ),
    "lr_inf": ("SAPO_TRAINING__LR", "inf", ("training.lr", "SAPO_TRAINING__LR", "finite")),
    "seed_not_a_number": ("SAPO_TRAINING__SEED", "abc", ("training.seed", "SAPO_TRAINING__SEED")),
    "temperature_inf": (
        "SAPO_TRAINING__TEMPERATURE",
        "inf",
        ("training.temperature", "SAPO_TRAINING__TEMPERATURE", "finite"),
    ),
    "nats_url_http": (
        "SAPO_NATS__URLS",
        "http://x:1",
        ("nats.urls", "http://x:1", "SAPO_NATS__URLS"),
    ),
    "nats_urls_broken_json": (
        "SAPO_NATS__URLS",
        '["nats://a:1"',
        ("nats.urls", "not a JSON list", "SAPO_NATS__URLS"),
    ),
    "family_unknown": (
        "SAPO_TASKS__FAMILIES",
        "no_such_family",
        ("tasks.families", "no_such_family", "SAPO_TASKS__FAMILIES"),
    ),
    "port_too_big": (
        "SAPO_METRICS__PROMETHEUS_PORT",
        "99999",
        ("metrics.prometheus_port", "99999", "SAPO_METRICS__PROMETHEUS_PORT"),
    ),
    "contract_short": (
        "SAPO_LEDGER__CONTRACT_ADDRESS",
        "0x123",
        ("ledger.contract_address", "'0x123'", "SAPO_LEDGER__CONTRACT_ADDRESS"),
    ),
    "enabled_not_bool": ("SAPO_LEDGER__ENABLED", "maybe", ("ledger.enabled", "'maybe'")),
    "loss_type_unknown": ("SAPO_TRAINING__LOSS_TYPE", "sapo", ("training.loss_type", "'sapo'")),
    "data_dir_under_a_file": (
        "SAPO_NODE__DATA_DIR",
        "README.txt/d",
        ("node.data_dir", "not a directory", "SAPO_NODE__DATA_DIR"),
    ),
    # names that set nothing
    "typo_single_underscore": (
        "SAPO_NATS_URL",
        "nats://127.0.0.1:4222",
        ("unknown environment variable SAPO_NATS_URL", "'SAPO_NATS__URLS'"),
    ),
    "typo_in_field": (
        "SAPO_TRAINING__LRR",
        "1e-5",
        ("unknown environment variable SAPO_TRAINING__LRR", "'SAPO_TRAINING__LR'"),
    ),
    "typo_in_section": (
        "SAPO_TRAINIG__LR",
        "1e-5",
        ("SAPO_TRAINIG__LR", "'SAPO_TRAINING__LR'"),
    ),
    "whole_section_variable": ("SAPO_TRAINING", '{"lr": 1}', ("SAPO_TRAINING",)),
    "password_typo": (
        "SAPO_KEY_PASWORD",
        "s3cret-value",
        ("SAPO_KEY_PASWORD", "'SAPO_KEY_PASSWORD'"),
    ),
    "lower_case_typo": ("sapo_nats_url", "nats://h:1", ("sapo_nats_url",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_node_refuses_a_bad_environment_variable_in_one_line(sandbox: Sandbox, case: str) -> None:
    name, value, culprits = CASES[case]
    path = sandbox.config("")
    before = sandbox.snapshot()
    outcome = invoke(["node", "--config", str(path)], env={name: value})
    line = assert_refused(outcome, *culprits, before=before, sandbox=sandbox.root)
    if "unknown environment variable" in line:
        assert value not in line  # may be a secret (a mistyped password variable)


def test_an_unknown_variable_is_refused_even_without_a_config_file(sandbox: Sandbox) -> None:
    before = sandbox.snapshot()
    outcome = invoke(["identity"], env={"SAPO_NATS_URL": "nats://127.0.0.1:4222"})
    assert_refused(
        outcome,
        "SAPO_NATS_URL",
        "SAPO_NATS__URLS",
        code=1,
        prefix="identity:",
        before=before,
        sandbox=sandbox.root,
    )


def test_the_variable_named_by_password_env_is_not_an_unknown_variable(sandbox: Sandbox) -> None:
    from sapo_async.ops.config import load_config

    path = sandbox.config('[identity]\npassword_env = "SAPO_MY_PASSWORD"\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAPO_MY_PASSWORD", "x")
        assert load_config(path).identity.password_env == "SAPO_MY_PASSWORD"
