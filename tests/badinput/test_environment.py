"""Bad SAPO_* environment: a bad override or a variable that sets nothing is refused by name."""

from __future__ import annotations

import re

import pytest

from sapo_async.errors import ConfigError
from sapo_async.ops.config import check_environment
from sapo_async.ops.config_sections import SECTIONS
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
    # old names: the file's rename message, in the environment's terms (issue 55)
    "renamed_to_another_section": (
        "SAPO_NODE__ROUNDS",
        "3",
        ("SAPO_NODE__ROUNDS is now called SAPO_TRAINING__ROUNDS: rename the variable",),
    ),
    "renamed_with_a_hint": (
        "SAPO_NATS__LOOKBACK_MINUTES",
        "5",
        ("SAPO_NATS__LOOKBACK_MINUTES is now called SAPO_NATS__START (seconds back",),
    ),
    "retired": (
        "SAPO_DEFENCE__TAIL_SHARE",
        "0.25",
        ("SAPO_DEFENCE__TAIL_SHARE is no longer a setting (", "unset the variable"),
    ),
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
    if "is now called" in line or "no longer a setting" in line:
        assert "did you mean" not in line


def _old_names() -> list[tuple[str, str, str, str]]:
    """(section, old key, "renamed" or "retired", where it went or why) for every section."""
    found = []
    for section, model in SECTIONS.items():
        for old, new in getattr(model, "renamed", {}).items():
            found.append((section, old, "renamed", new))
        for old, why in getattr(model, "retired", {}).items():
            found.append((section, old, "retired", why))
    return found


@pytest.mark.parametrize(("section", "old", "kind", "new"), _old_names())
def test_an_old_variable_gets_the_old_keys_message_in_the_environments_terms(
    section: str, old: str, kind: str, new: str
) -> None:
    variable = f"SAPO_{section.upper()}__{old.upper()}"
    with pytest.raises(ConfigError) as err:
        check_environment({variable: "1"}, password_env="SAPO_KEY_PASSWORD")
    message = str(err.value)
    assert err.value.field == variable
    assert "did you mean" not in message
    if kind == "retired":
        assert message == f"{variable} is no longer a setting ({new}): unset the variable"
        return
    assert message.startswith(f"{variable} is now called SAPO_"), message
    assert message.endswith(": rename the variable"), message
    target = new.removeprefix("[").split("]")[0] if new.startswith("[") else section
    named = message.removeprefix(f"{variable} is now called ").split(" (")[0]
    for name in re.findall(r"SAPO_\w+", named):
        assert name.startswith(f"SAPO_{target.upper()}__"), message
        field = name.removeprefix(f"SAPO_{target.upper()}__").lower()
        assert field in SECTIONS[target].model_fields, message


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
