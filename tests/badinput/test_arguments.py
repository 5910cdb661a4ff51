"""Bad command-line arguments: refused before any model loads, naming the option."""

from __future__ import annotations

import socket

import pytest

from tests.badinput.conftest import Sandbox
from tests.badinput.harness import assert_refused, invoke

# (arguments, what the one error line must name)
CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "threads_zero": (["train", "--threads", "0"], ("--threads", "0", ">= 1")),
    "threads_negative": (["train", "--threads", "-2"], ("--threads", "-2")),
    "rounds_negative": (["train", "--rounds", "-1"], ("--rounds", "-1", ">= 1")),
    "rounds_zero": (["train", "--rounds", "0"], ("--rounds", "0")),
    "group_of_one": (["train", "--group-size", "1"], ("--group-size", "1", ">= 2")),
    "group_of_one_long_name": (
        ["train", "--completions-per-question", "1"],
        ("--group-size", "1"),
    ),
    "questions_zero": (["train", "--questions-per-round", "0"], ("--questions-per-round",)),
    "questions_above_the_task_slots": (
        ["train", "--questions-per-round", "100000"],
        ("--questions-per-round", "100000", "1..1024"),
    ),
    "rollouts_above_a_commitment": (
        ["train", "--questions-per-round", "1", "--completions-per-question", "5000"],
        ("--questions-per-round x --completions-per-question", "5000", "4096"),
    ),
    "max_new_tokens_zero": (["train", "--max-new-tokens", "0"], ("--max-new-tokens",)),
    "temperature_inf": (["train", "--temperature", "inf"], ("--temperature", "inf", "finite")),
    "temperature_nan": (["train", "--temperature", "nan"], ("--temperature", "nan")),
    "temperature_zero": (["train", "--temperature", "0"], ("--temperature",)),
    "top_p_above_one": (["train", "--top-p", "2"], ("--top-p", "2.0", "(0, 1]")),
    "top_k_negative": (["train", "--top-k", "-1"], ("--top-k",)),
    "lr_zero": (["train", "--lr", "0"], ("--lr",)),
    "lr_inf": (["train", "--lr", "inf"], ("--lr", "inf")),
    "loss_type_unknown": (["train", "--loss-type", "sapo"], ("--loss-type", "'sapo'")),
    "tasks_unknown": (["train", "--tasks", "nope"], ("--tasks", "'nope'", "cpu")),
    "regime_unknown": (["train", "--regime", "medium"], ("--regime", "'medium'")),
    "device_unknown": (["train", "--device", "tpu"], ("--device", "'tpu'")),
    "prompt_style_unknown": (["train", "--prompt-style", "chat"], ("--prompt-style", "'chat'")),
    "seed_negative": (["train", "--seed", "-3"], ("--seed", "-3")),
    "node_index_negative": (["train", "--node-index", "-1"], ("--node-index",)),
    "checkpoint_every_negative": (["train", "--checkpoint-every", "-1"], ("--checkpoint-every",)),
    "log_under_a_file": (
        ["train", "--log", "README.txt/run.jsonl"],
        ("--log", "README.txt/run.jsonl", "not a directory"),
    ),
    "log_level_unknown": (["train", "--log-level", "LOUD"], ("--log-level", "'LOUD'")),
    "warmstart_threads_zero": (["warmstart", "--threads", "0"], ("--threads",)),
    "warmstart_regime_unknown": (["warmstart", "--regime", "x"], ("--regime", "'x'")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_refused_in_one_line(sandbox: Sandbox, case: str) -> None:
    args, culprits = CASES[case]
    before = sandbox.snapshot()
    assert_refused(invoke(args), *culprits, before=before, sandbox=sandbox.root)


def test_train_refuses_a_completion_cap_beyond_the_models_context(sandbox: Sandbox) -> None:
    # the tiny model's context is 64 tokens; main generated into positions it has no
    # embedding for
    before = sandbox.snapshot()
    outcome = invoke(["train", "--rounds", "1", "--max-new-tokens", "100"])
    assert_refused(
        outcome, "--max-new-tokens", "100", "64 tokens", before=before, sandbox=sandbox.root
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["train", "--threads", "many"], "--threads"),
        (["swarm", "--nodes", "0"], "--nodes"),
        (["train", "--no-such-option"], "--no-such-option"),
    ],
)
def test_click_usage_errors_name_the_option_without_a_traceback(
    sandbox: Sandbox, args: list[str], option: str
) -> None:
    before = sandbox.snapshot()
    outcome = invoke(args)
    assert outcome.escaped is None
    assert "Traceback" not in outcome.output
    assert outcome.code == 2
    assert option in outcome.stderr
    assert sandbox.snapshot() == before


def test_debug_shows_the_traceback_of_a_refused_input(sandbox: Sandbox) -> None:
    outcome = invoke(["--debug", "train", "--threads", "0"])
    assert outcome.code != 0
    assert outcome.escaped is not None  # re-raised for the traceback
    assert "--threads" in str(outcome.escaped)


MORE: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "swarm_nats_url_http": (["swarm", "--nats-url", "http://x:1"], ("--nats-url", "http://x:1")),
    "swarm_name_with_space": (["swarm", "--name", "a b"], ("--name", "'a b'", "pattern")),
    "swarm_regime_unknown": (["swarm", "--regime", "medium"], ("--regime", "'medium'")),
    "swarm_log_dir_under_a_file": (
        ["swarm", "--log-dir", "README.txt/logs"],
        ("--log-dir", "README.txt", "not a directory"),
    ),
    "devnet_port_too_big": (["devnet", "--nats-port", "70000"], ("--nats-port", "70000")),
    "devnet_same_ports": (
        ["devnet", "--nats-port", "4999", "--anvil-port", "4999"],
        ("--anvil-port", "different from --nats-port"),
    ),
    "devnet_fund_not_an_address": (["devnet", "--fund", "0x12"], ("--fund", "'0x12'")),
    "devnet_swarm_with_space": (["devnet", "--swarm", "a b"], ("--swarm", "'a b'")),
    "devnet_data_dir_under_a_file": (
        ["devnet", "--data-dir", "README.txt/devnet"],
        ("--data-dir", "not a directory"),
    ),
}


@pytest.mark.parametrize("case", sorted(MORE))
def test_swarm_and_devnet_refuse_a_bad_argument_before_starting_anything(
    sandbox: Sandbox, case: str
) -> None:
    args, culprits = MORE[case]
    before = sandbox.snapshot()
    assert_refused(invoke(args), *culprits, before=before, sandbox=sandbox.root)


def test_devnet_refuses_a_port_in_use(sandbox: Sandbox) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        before = sandbox.snapshot()
        outcome = invoke(["devnet", "--nats-port", str(port)])
        assert_refused(
            outcome, "--nats-port", str(port), "free port", before=before, sandbox=sandbox.root
        )
