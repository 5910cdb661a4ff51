"""Every bad value a volunteer can write in node.toml: `sapo-async node` refuses it in one line.

Each case names the key (``training.lr``), shows the value and says what is allowed; the
node never starts, and nothing in the working directory changes.
"""

from __future__ import annotations

import pytest

from tests.badinput.conftest import Sandbox
from tests.badinput.harness import assert_refused, invoke

# (toml, what the one error line must name)
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    # [node]
    "seed_not_a_number": (
        '[training]\nseed = "abc"\n',
        ("training.seed", "'abc'", "valid integer"),
    ),
    "seed_negative": (
        "[training]\nseed = -1\n",
        ("training.seed", "-1", "greater than or equal to 0"),
    ),
    "seed_in_node": ("[node]\nseed = 3\n", ("node", "[training] seed", "move the key")),
    "swarm_with_space": ('[node]\nswarm = "a b"\n', ("node.swarm", "'a b'", "pattern")),
    "swarm_empty": ('[node]\nswarm = ""\n', ("node.swarm", "at least 1 character")),
    "rounds_zero": (
        "[training]\nrounds = 0\n",
        ("training.rounds", "0", "greater than or equal to 1"),
    ),
    "checkpoint_every_negative": (
        "[checkpoint]\nevery = -1\n",
        ("checkpoint.every", "-1", "a number of rounds >= 1 or 'auto'"),
    ),
    "checkpoint_every_zero": ("[checkpoint]\nevery = 0\n", ("checkpoint.every",)),
    "checkpoint_every_in_node": (
        "[node]\ncheckpoint_every = 2\n",
        ("node", "[checkpoint] every", "move the key"),
    ),
    "drain_timeout_zero": ("[node]\ndrain_timeout_s = 0\n", ("node.drain_timeout_s", "0")),
    "drain_timeout_nan": ("[node]\ndrain_timeout_s = nan\n", ("node.drain_timeout_s", "finite")),
    "data_dir_under_a_file": (
        '[node]\ndata_dir = "README.txt/data"\n',
        ("node.data_dir", "README.txt", "not a directory"),
    ),
    "node_key_typo": ('[node]\nnmae = "x"\n', ("node.nmae", "unknown setting", "'name'")),
    # [identity]
    "password_file_missing": (
        '[identity]\npassword_file = "/no/such/pw"\n',
        ("identity.password_file", "/no/such/pw", "no such file"),
    ),
    "password_env_empty": ('[identity]\npassword_env = ""\n', ("identity.password_env",)),
    "identity_key_typo": (
        '[identity]\nkeystor = "k.json"\n',
        ("identity.keystor", "unknown setting", "'keystore'"),
    ),
    # [nats]
    "nats_url_http": ('[nats]\nurls = ["http://x:1"]\n', ("nats.urls", "http://x:1", "nats://")),
    "nats_url_no_host": ('[nats]\nurls = ["nats://:4222"]\n', ("nats.urls", "names no host")),
    "nats_url_port_too_big": (
        '[nats]\nurls = ["nats://h:70000"]\n',
        ("nats.urls", "nats://h:70000", "1..65535"),
    ),
    "nats_url_port_zero": ('[nats]\nurls = ["nats://h:0"]\n', ("nats.urls", "port 0")),
    "nats_urls_not_strings": ("[nats]\nurls = [1]\n", ("nats.urls", "valid string")),
    "nats_start_unknown": ('[nats]\nstart = "oldest"\n', ("nats.start", "'oldest'", "'new'")),
    "start_negative": ("[nats]\nstart = -5\n", ("nats.start", "-5", "seconds >= 0")),
    "start_inf": ("[nats]\nstart = inf\n", ("nats.start", "inf", "seconds >= 0")),
    "lookback_minutes_old_key": (
        "[nats]\nlookback_minutes = 5\n",
        ("nats", "lookback_minutes", "start"),
    ),
    "creds_file_missing": (
        '[nats]\ncreds_file = "/no/user.creds"\n',
        ("nats.creds_file", "/no/user.creds", "no such file"),
    ),
    "tls_ca_missing": ('[nats]\ntls_ca = "/no/ca.pem"\n', ("nats.tls_ca", "no such file")),
    "tls_cert_without_key": (
        '[nats]\ntls_cert = "README.txt"\n',
        ("nats", "tls_cert and tls_key must be set together"),
    ),
    "shards_read_zero": ("[nats]\nshards_read = 0\n", ("nats.shards_read", "0")),
    # [ledger]
    "ledger_enabled_not_bool": (
        '[ledger]\nenabled = "maybe"\n',
        ("ledger.enabled", "'maybe'", "valid boolean"),
    ),
    "rpc_url_ftp": ('[ledger]\nrpc_url = "ftp://x"\n', ("ledger.rpc_url", "ftp://x", "http(s)")),
    "rpc_url_port_too_big": (
        '[ledger]\nrpc_url = "http://x:99999"\ncontract_address = "0x' + "1" * 40 + '"\n',
        ("ledger.rpc_url", "1..65535"),
    ),
    "rpc_url_without_contract": (
        '[ledger]\nrpc_url = "http://127.0.0.1:8545"\n',
        ("ledger", "contract_address is needed with rpc_url", "sapo-async devnet"),
    ),
    "contract_address_short": (
        '[ledger]\ncontract_address = "0x123"\n',
        ("ledger.contract_address", "'0x123'", "pattern"),
    ),
    "contract_address_bad_checksum": (
        '[ledger]\ncontract_address = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD"\n',
        ("ledger.contract_address", "EIP-55", "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"),
    ),
    "chain_id_zero": ("[ledger]\nchain_id = 0\n", ("ledger.chain_id", "0")),
    "chain_id_text": ('[ledger]\nchain_id = "one"\n', ("ledger.chain_id", "'one'")),
    # [model]
    "backend_unknown": (
        '[model]\nbackend = "tensorrt"\n',
        ("model.backend", "'tensorrt'", "'auto', 'transformers' or 'vllm'"),
    ),
    "device_unknown": ('[model]\ndevice = "tpu"\n', ("model.device", "'tpu'", "'cuda'")),
    "gpu_share_above_one": (
        "[model]\ngpu_memory_utilization = 1.5\n",
        ("model.gpu_memory_utilization", "1.5", "less than or equal to 1"),
    ),
    "gpu_share_zero": ("[model]\ngpu_memory_utilization = 0\n", ("model.gpu_memory_utilization",)),
    "model_name_empty": ('[model]\nname_or_path = ""\n', ("model.name_or_path",)),
    "sleep_mode_not_bool": ('[model]\nsleep_mode = "sometimes"\n', ("model.sleep_mode",)),
    # [tasks]
    "family_unknown": (
        '[tasks]\nfamilies = ["no_such_family"]\n',
        ("tasks.families", "'no_such_family'", "not a reasoning-gym family"),
    ),
    "family_typo": ('[tasks]\nfamilies = ["chain_summ"]\n', ("tasks.families", "'chain_sum'")),
    "preset_unknown": ('[tasks]\npreset = "papr"\n', ("tasks.preset", "'papr'", "'paper'")),
    "regime_unknown": ('[tasks]\nregime = "medium"\n', ("tasks.regime", "'medium'", "'dense'")),
    # [training]
    "questions_zero": ("[training]\nquestions_per_round = 0\n", ("training.questions_per_round",)),
    "group_of_one": (
        "[training]\ncompletions_per_question = 1\n",
        ("training.completions_per_question", "greater than or equal to 2"),
    ),
    "local_negative": ("[training]\nlocal = -1\n", ("training.local", "-1")),
    "nothing_to_train_on": (
        "[training]\nlocal = 0\nexternal = 0\n",
        ("training", "at least 1"),
    ),
    "local_above_questions": (
        "[training]\nlocal = 9\n",
        ("training", "local (9) cannot exceed questions_per_round (8)"),
    ),
    "sampler_unknown": ('[training]\nsampler = "random"\n', ("training.sampler", "'random'")),
    "producer_cap_zero": ("[training]\nper_producer_cap = 0\n", ("training.per_producer_cap",)),
    "lr_zero": ("[training]\nlr = 0\n", ("training.lr", "greater than 0")),
    "lr_above_one": ("[training]\nlr = 1.5\n", ("training.lr", "1.5", "less than 1")),
    "lr_nan": ("[training]\nlr = nan\n", ("training.lr", "finite")),
    "loss_type_unknown": (
        '[training]\nloss_type = "sapo"\n',
        ("training.loss_type", "'sapo'", "'grpo', 'dapo' or 'dr_grpo'"),
    ),
    "clip_low_one": ("[training]\nclip_low = 1\n", ("training.clip_low", "less than 1")),
    "clip_high_negative": ("[training]\nclip_high = -0.1\n", ("training.clip_high", "-0.1")),
    "kl_beta_negative": ("[training]\nkl_beta = -1\n", ("training.kl_beta",)),
    "temperature_inf": ("[training]\ntemperature = inf\n", ("training.temperature", "finite")),
    "temperature_zero": ("[training]\ntemperature = 0\n", ("training.temperature", "0")),
    "top_p_zero": ("[training]\ntop_p = 0\n", ("training.top_p",)),
    "top_p_above_one": ("[training]\ntop_p = 1.5\n", ("training.top_p", "1.5")),
    "max_new_tokens_zero": ("[training]\nmax_new_tokens = 0\n", ("training.max_new_tokens",)),
    "staleness_negative": (
        "[training]\nmax_staleness_rounds = -1\n",
        ("training.max_staleness_rounds",),
    ),
    "max_age_zero": ("[training]\nmax_age_s = 0\n", ("training.max_age_s", "greater than 0")),
    "overlap_not_bool": ('[training]\noverlap = "x"\n', ("training.overlap",)),
    "overlap_generation_renamed": (
        "[training]\noverlap_generation = true\n",
        ("training", "overlap_generation is now called overlap"),
    ),
    # main accepted these and failed inside the running node (B above the task slots) or
    # ran rounds no commitment may carry (B x L above the contract's 4,096 rollouts)
    "questions_above_the_task_slots": (
        "[training]\nquestions_per_round = 100000\n",
        ("training.questions_per_round", "100000", "less than or equal to 1024"),
    ),
    "rollouts_above_a_commitment": (
        "[training]\nquestions_per_round = 1\nlocal = 1\ncompletions_per_question = 5000\n",
        ("questions_per_round x completions_per_question", "5000", "4096"),
    ),
    "training_key_typo": ("[training]\nlrr = 1e-5\n", ("training.lrr", "'lr'")),
    # [metrics]
    "prometheus_port_too_big": (
        "[metrics]\nprometheus_port = 70000\n",
        ("metrics.prometheus_port", "70000", "65535"),
    ),
    "prometheus_port_negative": (
        "[metrics]\nprometheus_port = -1\n",
        ("metrics.prometheus_port", "-1"),
    ),
    "log_level_unknown": ('[metrics]\nlog_level = "LOUD"\n', ("metrics.log_level", "'LOUD'")),
    "log_json_not_bool": ('[metrics]\nlog_json = "x"\n', ("metrics.log_json",)),
    "prometheus_host_empty": ('[metrics]\nprometheus_host = ""\n', ("metrics.prometheus_host",)),
    # whole sections
    "section_unknown": ("[nodes]\nseed = 1\n", ("unknown section", "[nodes]", "'node'")),
    "section_typo": ("[trainig]\nlr = 1e-5\n", ("[trainig]", "'training'")),
    "section_is_a_value": ("[ledger]\n[training]\n[metrics]\n", ()),
    "key_outside_sections": ("lr = 1e-5\n", ("unknown section", "[lr]")),
}
# "section_is_a_value" is a valid (empty) file: kept out of the refused cases below.
VALID = {"section_is_a_value"}


@pytest.mark.parametrize("case", sorted(set(CASES) - VALID))
def test_node_refuses_a_bad_value_in_one_line(sandbox: Sandbox, case: str) -> None:
    toml, culprits = CASES[case]
    path = sandbox.config(toml)
    before = sandbox.snapshot()
    outcome = invoke(["node", "--config", str(path)])
    line = assert_refused(outcome, *culprits, before=before, sandbox=sandbox.root)
    assert str(path) in line  # the file is named too


def test_doctor_reports_a_bad_value_as_its_config_check(sandbox: Sandbox) -> None:
    path = sandbox.config('[training]\nseed = "abc"\n')
    before = sandbox.snapshot()
    outcome = invoke(["doctor", "--config", str(path), "--skip-gpu"])
    assert_refused(
        outcome,
        "training.seed",
        "'abc'",
        code=1,
        prefix="[FAIL] config:",
        before=before,
        sandbox=sandbox.root,
    )


def test_identity_refuses_a_bad_value(sandbox: Sandbox) -> None:
    path = sandbox.config('[ledger]\ncontract_address = "0x123"\n')
    before = sandbox.snapshot()
    outcome = invoke(["identity", "--config", str(path)])
    assert_refused(
        outcome,
        "ledger.contract_address",
        code=1,
        prefix="identity:",
        before=before,
        sandbox=sandbox.root,
    )
