"""Every node.toml key, set to a value other than its default, reaches what uses it.

One case per key of every section (a test fails when a section gains a key with no case
here). Each case loads a config with only that key changed, builds the node's objects the
way ``sapo-async node`` does (``NodeConfig.to_spec``, then for ``[training]`` the
``LearnerSettings`` ``build_learner`` derives and the ``TrainerConfig`` the ``Trainer`` is
given) and asserts the value arrived. One more test builds the real learner on the tiny
model and checks its ``Trainer`` holds exactly that derived config.

Where a key is read straight from the loaded ``NodeConfig`` by its consumer (``[identity]``
by ``ops.identity``, ``[metrics]`` by logging and ``ops.metrics``, ``ledger.chain_id`` by
the start-up checks), the case asserts the attribute that consumer reads. The collector's
``max_age_s`` and the sampler's ``max_staleness_rounds``, ``sampler`` and
``per_producer_cap`` are read from ``spec.training`` by node/swarm.py and node/rounds.py
when the node is assembled; the case asserts the spec field they read.

On main before issue 21 (ef48b04) no key was lost on the way, but the keys renamed on it
(``loss_type``, ``clip_low``, ``clip_high``, ``kl_beta`` -> the trainer's ``aggregation``,
``eps_low``, ``eps_high``, ``beta``; ``overlap_generation`` -> ``overlap``) had no test that
they reach the trainer; now one name runs from the file to the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from sapo_async.errors import ConfigError
from sapo_async.node.learner import LearnerSettings
from sapo_async.node.spec import NodeSpec
from sapo_async.ops.config import NodeConfig, load_config
from sapo_async.ops.config_sections import SECTIONS
from sapo_async.ops.hardware import HardwareChoice, select_backend

ACCOUNT = Account.create()
HARDWARE = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
VLLM = HardwareChoice("vllm", "cuda", "tiny", 0.5, "test", None, None)


class Built:
    """What one config builds: the config, the spec and the learner's settings."""

    def __init__(self, cfg: NodeConfig, hardware: HardwareChoice = HARDWARE) -> None:
        self.cfg = cfg
        self.spec: NodeSpec = cfg.to_spec(account=ACCOUNT, hardware=hardware)
        self.learner = LearnerSettings.of(
            self.spec.training, node_index=0, prompt_style="compact", chat_template=False
        )
        self.trainer = self.learner.trainer_config()


Check = Callable[[Built], Any]

# (section, key): (value set, what the built objects hold for it, expected)
# "file:<name>" values are replaced by a path of an existing file; "dir" by a fresh directory.
CASES: dict[tuple[str, str], tuple[Any, Check, Any]] = {
    ("node", "swarm"): ("alpha", lambda b: b.spec.swarm, "alpha"),
    ("node", "name"): ("n1", lambda b: b.spec.name, "n1"),
    ("node", "data_dir"): ("dir", lambda b: b.spec.checkpoint.dir.parent, "dir"),
    ("checkpoint", "every"): (2, lambda b: b.spec.checkpoint.every, 2),
    ("model", "generation_dtype"): (
        "bfloat16",
        lambda b: b.spec.policy.generation_dtype,
        "bfloat16",
    ),
    ("model", "train_layers"): (2, lambda b: b.spec.policy.train_layers, 2),
    ("node", "drain_timeout_s"): (4.0, lambda b: b.spec.drain_timeout_s, 4.0),
    ("identity", "keystore"): ("file:key.json", lambda b: b.cfg.keystore_path, "file:key.json"),
    ("identity", "password_env"): ("MY_PW", lambda b: b.cfg.identity.password_env, "MY_PW"),
    ("identity", "password_file"): (
        "file:pw",
        lambda b: b.cfg.identity.password_file,
        "file:pw",
    ),
    ("nats", "urls"): (
        ["nats://a:4222"],
        lambda b: (b.spec.fabric.urls, b.spec.fabric.options().url),
        (("nats://a:4222",), "nats://a:4222"),
    ),
    ("nats", "creds_file"): (
        "file:c.creds",
        lambda b: b.spec.fabric.options().creds_file,
        "file:c.creds",
    ),
    ("nats", "nkey_seed_file"): (
        "file:seed",
        lambda b: b.spec.fabric.options().nkey_seed_file,
        "file:seed",
    ),
    ("nats", "tls_ca"): ("file:ca", lambda b: b.spec.fabric.options().tls_ca_file, "file:ca"),
    ("nats", "start"): (600, lambda b: b.spec.fabric.start, 600.0),
    ("nats", "stream_replicas"): (3, lambda b: b.spec.fabric.stream_replicas, 3),
    ("nats", "connect_timeout_s"): (7.0, lambda b: b.spec.fabric.connect_timeout_s, 7.0),
    ("nats", "include_tokens"): (False, lambda b: b.spec.fabric.include_tokens, False),
    ("nats", "consumer_owner"): ("v1", lambda b: b.spec.fabric.options().consumer_owner, "v1"),
    ("nats", "shards"): (16, lambda b: b.spec.fabric.shards, 16),
    ("nats", "shard_rotate_s"): (120.0, lambda b: b.spec.fabric.shard_rotate_s, 120.0),
    ("ledger", "enabled"): (False, lambda b: b.spec.ledger.enabled, False),
    ("ledger", "chain_id"): (5, lambda b: b.cfg.ledger.chain_id, 5),
    # Read by the start-up checks from the loaded config; by the round loop from the spec.
    ("ledger", "connect_timeout_s"): (7.0, lambda b: b.cfg.ledger.connect_timeout_s, 7.0),
    ("ledger", "max_pending"): (3, lambda b: b.spec.ledger.max_pending, 3),
    ("ledger", "relayer_key_file"): (
        "file:relayer",
        lambda b: b.spec.ledger.relayer_private_key(),
        "0x" + "ab" * 32,
    ),
    ("tasks", "preset"): ("paper", lambda b: b.spec.policy.tasks, "paper"),
    ("tasks", "families"): (
        ["basic_arithmetic"],
        lambda b: [f.family for f in b.spec.policy.tasks],
        ["basic_arithmetic"],
    ),
    ("tasks", "regime"): ("dense", lambda b: b.spec.policy.regime, "dense"),
    ("tasks", "prompt_style"): ("instruct", lambda b: b.spec.policy.prompt_style, "instruct"),
    ("metrics", "prometheus_port"): (9100, lambda b: b.cfg.metrics.prometheus_port, 9100),
    ("metrics", "prometheus_host"): ("0.0.0.0", lambda b: b.cfg.metrics.prometheus_host, "0.0.0.0"),
    ("metrics", "log_level"): ("DEBUG", lambda b: b.cfg.metrics.log_level, "DEBUG"),
    ("metrics", "log_json"): (True, lambda b: b.cfg.metrics.log_json, True),
}

# Keys that need a companion to be valid, and where the spec holds them.
COMBINED: dict[tuple[str, str], tuple[dict[str, dict[str, Any]], Check, Any]] = {
    ("nats", "shards_read"): (
        {"nats": {"shards": 16, "shards_read": 4}},
        lambda b: b.spec.fabric.shards_read,
        4,
    ),
    ("nats", "tls_cert"): (
        {"nats": {"tls_cert": "file:cert", "tls_key": "file:key"}},
        lambda b: (b.spec.fabric.options().tls_cert_file, b.spec.fabric.options().tls_key_file),
        ("file:cert", "file:key"),
    ),
    ("ledger", "rpc_url"): (
        {"ledger": {"rpc_url": "http://127.0.0.1:8545", "contract_address": "0x" + "2" * 40}},
        lambda b: (b.spec.ledger.rpc_url, b.spec.ledger.contract_address),
        ("http://127.0.0.1:8545", "0x" + "2" * 40),
    ),
}
COMBINED[("defence", "stock_lead_probation")] = (
    {"defence": {"stock_lead_share": 0.5, "stock_lead_probation": True}},
    lambda b: b.spec.defence.stock_lead_probation,
    True,
)
COMBINED[("nats", "tls_key")] = COMBINED[("nats", "tls_cert")]
COMBINED[("ledger", "contract_address")] = COMBINED[("ledger", "rpc_url")]

# [training]: a non-default value of each key and what uses it besides the spec field.
TRAINING: dict[str, tuple[Any, Check | None]] = {
    "questions_per_round": (5, lambda b: b.learner.questions_per_round),
    "completions_per_question": (3, lambda b: b.learner.completions_per_question),
    "local": (2, None),  # read by the round loop from spec.training
    "external": (1, None),
    "sampler": ("topk", None),
    "per_producer_cap": (2, None),
    "max_staleness_rounds": (1, None),
    "max_age_s": (30.0, None),
    "max_new_tokens": (
        24,
        lambda b: (b.learner.sampling.max_new_tokens, b.trainer.max_completion_tokens),
    ),
    "temperature": (0.7, lambda b: b.learner.sampling.temperature),
    "top_p": (0.9, lambda b: b.learner.sampling.top_p),
    "overlap": (True, None),  # build_learner gives the generator its own copy
    "rounds": (3, None),  # read by the round loop from spec.training
    "seed": (7, lambda b: b.learner.swarm_seed),
}
TRAINER: dict[str, Any] = {
    "lr": 1e-4,
    "loss_type": "dr_grpo",
    "clip_low": 0.1,
    "clip_high": 0.4,
    "kl_beta": 0.05,
    "tis_cap": 2.0,
    "tis_level": "sequence",
    "micro_batch_tokens": 256,
    "gradient_checkpointing": True,
    "bf16": True,
}
DEFENCE: dict[str, Any] = {
    "active": False,
    "preset_only": False,
    "max_prompt_chars": 100,
    "max_completion_chars": 200,
    "max_groups_per_producer_round": 3,
    "plausibility": False,
    "cut_after_answer": False,
    "stock_lead_share": 0.75,
    "length_guard": False,
    "brevity_guard": False,
    "repetition_limit": 5,
    "calibration_min": 4,
    "quarantine_rate": 0.9,
    "quarantine_s": 5.0,
}


def _materialise(value: Any, tmp_path: Path) -> Any:
    if value == "dir":
        return str(tmp_path / "data")
    if isinstance(value, str) and value.startswith("file:"):
        path = tmp_path / value.removeprefix("file:")
        if not path.exists():
            content = "0x" + "ab" * 32 if path.name == "relayer" else "x"
            path.write_text(content + "\n")
        return path
    if isinstance(value, tuple):
        return tuple(_materialise(v, tmp_path) for v in value)
    if isinstance(value, dict):
        return {k: _materialise(v, tmp_path) for k, v in value.items()}
    return value


def _build(sections: dict[str, dict[str, Any]], tmp_path: Path) -> Built:
    sections = {k: _materialise(v, tmp_path) for k, v in sections.items()}
    node = {"data_dir": str(tmp_path), **sections.pop("node", {})}
    return Built(load_config(node=node, **sections))


def _default(section: str, key: str) -> Any:
    return SECTIONS[section]().model_dump()[key]


def test_every_key_of_every_section_has_a_case() -> None:
    covered = set(CASES) | set(COMBINED)
    covered |= {("training", k) for k in (*TRAINING, *TRAINER)}
    covered |= {("defence", k) for k in DEFENCE}
    covered |= {("model", k) for k in ("name_or_path", "backend", "device")}
    covered |= {("model", k) for k in ("sleep_mode", "gpu_memory_utilization")}
    every = {(section, key) for section, model in SECTIONS.items() for key in model.model_fields}
    assert every == covered


@pytest.mark.parametrize("case", sorted(CASES), ids="-".join)
def test_a_changed_key_reaches_the_object_that_uses_it(
    case: tuple[str, str], tmp_path: Path
) -> None:
    section, key = case
    value, read, expected = CASES[case]
    value = _materialise(value, tmp_path)
    if section != "node" or key != "data_dir":
        assert value != _default(section, key)
    built = _build({section: {key: value}}, tmp_path)
    if expected == "dir":
        assert read(built) == Path(value)
    else:
        assert read(built) == _materialise(expected, tmp_path)


@pytest.mark.parametrize("case", sorted(COMBINED), ids="-".join)
def test_a_changed_key_with_its_companion_reaches_the_spec(
    case: tuple[str, str], tmp_path: Path
) -> None:
    sections, read, expected = COMBINED[case]
    built = _build(sections, tmp_path)
    assert read(built) == _materialise(expected, tmp_path)


@pytest.mark.parametrize("key", sorted(TRAINING))
def test_a_changed_training_key_reaches_the_spec_and_the_learner(key: str, tmp_path: Path) -> None:
    value, read = TRAINING[key]
    assert value != _default("training", key)
    built = _build({"training": {key: value}}, tmp_path)
    assert getattr(built.spec.training, key) == value
    if read is not None:
        got = read(built)
        assert got == ((value,) * len(got) if isinstance(got, tuple) else value)


@pytest.mark.parametrize("key", sorted(TRAINER))
def test_a_changed_trainer_key_reaches_the_trainers_config(key: str, tmp_path: Path) -> None:
    value = TRAINER[key]
    assert value != _default("training", key)
    built = _build({"training": {key: value}}, tmp_path)
    assert getattr(built.trainer, key) == value


@pytest.mark.parametrize("key", sorted(DEFENCE))
def test_a_changed_defence_key_reaches_the_nodes_defence_settings(key: str, tmp_path: Path) -> None:
    value = DEFENCE[key]
    assert value != _default("defence", key)
    built = _build({"defence": {key: value}}, tmp_path)
    assert getattr(built.spec.defence, key) == value


@pytest.mark.parametrize(
    ("key", "value", "attribute"),
    [
        ("name_or_path", "tiny", "model"),
        ("backend", "transformers", "backend"),
        ("device", "cpu", "device"),
    ],
)
def test_a_changed_model_key_reaches_the_hardware_choice_and_the_policy(
    key: str, value: str, attribute: str, tmp_path: Path
) -> None:
    assert value != _default("model", key)
    cfg = load_config(node={"data_dir": str(tmp_path)}, model={key: value})
    choice = select_backend(
        cfg.model.backend,
        model=None if cfg.model.name_or_path == "auto" else cfg.model.name_or_path,
        device=None if cfg.model.device == "auto" else cfg.model.device,
        gpu_memory_utilization=cfg.model.gpu_memory_utilization,
    )
    assert getattr(Built(cfg, choice).spec.policy, attribute) == value


def test_sleep_mode_reaches_the_policy_on_the_vllm_backend(tmp_path: Path) -> None:
    cfg = load_config(node={"data_dir": str(tmp_path)}, model={"sleep_mode": True})
    assert Built(cfg, VLLM).spec.policy.sleep_mode
    assert not Built(cfg).spec.policy.sleep_mode  # only vLLM sleeps


def test_gpu_memory_utilization_reaches_the_policy(tmp_path: Path) -> None:
    cfg = load_config(node={"data_dir": str(tmp_path)}, model={"gpu_memory_utilization": 0.6})
    assert Built(cfg).spec.policy.gpu_memory_utilization == 0.6
    assert Built(cfg, VLLM).spec.policy.gpu_memory_utilization == 0.5  # the hardware's choice


def test_the_trainer_build_learner_makes_holds_the_derived_config(tmp_path: Path) -> None:
    from sapo_async.node.learner import build_learner

    training = {**TRAINER, "max_new_tokens": 12, "bf16": False}
    built = _build({"training": training}, tmp_path)
    learner = build_learner(built.spec)
    assert learner.trainer.config == built.trainer
    assert learner.trainer.config.max_completion_tokens == 12
    assert learner.trainer._ref is not None  # kl_beta > 0 keeps the reference copy


@pytest.mark.parametrize(("active", "cut"), [(True, True), (False, False)])
def test_cut_after_answer_reaches_the_candidate_view_while_defences_are_active(
    tmp_path: Path, active: bool, cut: bool
) -> None:
    from sapo_async.node.admission import NodeDefences
    from sapo_async.node.learner import build_learner
    from sapo_async.node.selection import candidate_view
    from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource
    from sapo_async.tasks.spec import CPU_PRESET

    defence = {"cut_after_answer": True, "active": active}
    spec = _build({"defence": defence}, tmp_path).spec
    learner = build_learner(spec)
    # The round's thresholds carry it (None with the defences off), the judge reads them.
    limits = NodeDefences.build(spec, CPU_PRESET).calibration.thresholds() if active else None
    group = ScoredGroup(
        "1+1=",
        (ScoredCompletion(" <answer>2</answer> 7+7", 1.0),),
        tokenizer_id="tok",
        producer="0xp",
        token_source=TokenSource.TEXT,  # a peer's group, as the node scores one
    )
    view = candidate_view(
        learner, group, cut_after_answer=limits is not None and limits.cut_after_answer
    )
    assert (view.cut_text(0) == " <answer>2</answer>") is cut


def test_brevity_guard_reaches_the_nodes_thresholds(tmp_path: Path) -> None:
    from sapo_async.node.admission import NodeDefences
    from sapo_async.tasks.spec import CPU_PRESET

    defence = {"brevity_guard": True, "calibration_min": 4}
    calibration = NodeDefences.build(_build({"defence": defence}, tmp_path).spec, CPU_PRESET)
    for lead in ("ab", "abcd", "abcdef", "abcdefgh"):
        calibration.calibration.observe("chain_sum", [-1.0], 0.0, f"{lead} <answer>1</answer>")
    limits = calibration.calibration.thresholds()
    assert limits.brevity_guard
    assert (
        limits.limits("chain_sum").min_rewarded_lead == 2 / 2.0
    )  # the 5th percentile of four: the least, over 2


def test_stock_lead_share_reaches_the_nodes_lead_record(tmp_path: Path) -> None:
    from sapo_async.node.admission import NodeDefences
    from sapo_async.tasks.spec import CPU_PRESET

    defences = NodeDefences.build(
        _build({"defence": {"stock_lead_share": 0.75}}, tmp_path).spec, CPU_PRESET
    )
    assert defences.leads is not None
    assert defences.leads.share == 0.75
    assert defences.leads.probation  # on by default since 2026-12-05 (docs/security.md)
    off = {"defence": {"stock_lead_share": 0.75, "stock_lead_probation": False}}
    leads = NodeDefences.build(_build(off, tmp_path).spec, CPU_PRESET).leads
    assert leads is not None
    assert not leads.probation
    # A share of 0 alone turns the record, and so its probation, off.
    none = {"defence": {"stock_lead_share": 0}}
    assert NodeDefences.build(_build(none, tmp_path).spec, CPU_PRESET).leads is None
    # One line, the section named once.
    once = "^[^:]*: defence: stock_lead_probation = true needs stock_lead_share above 0"
    with pytest.raises(ConfigError, match=once):
        _build({"defence": {"stock_lead_share": 0, "stock_lead_probation": True}}, tmp_path)
