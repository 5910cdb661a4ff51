# sapo_async task runner. `just` lists the recipes; CI calls the same ones the README names.
set shell := ["bash", "-euo", "pipefail", "-c"]

py := justfile_directory() + "/.venv/bin/python"

# list the recipes
default:
    @just --list

# install Python deps into .venv and the Solidity toolchain into node_modules (idempotent)
setup:
    bash scripts/bootstrap.sh

# run every test: forge tests of the contracts, the API reference's build, then pytest
# (unit + integration); the tiny models are built and SmolLM2 prepared (or found in the
# cache) first, so no test pays for it
test *args: setup contracts docs
    {{py}} -m sapo_async warmstart --regime all --models smollm2-135m
    {{py}} -m pytest {{args}}

# only the fast unit tests
test-unit *args:
    {{py}} -m pytest tests/unit {{args}}

# lint (ruff) and type-check (mypy strict)
check:
    {{py}} -m ruff check sapo_async tests bench examples
    {{py}} -m ruff format --check sapo_async tests bench examples
    {{py}} -m mypy

# build the API reference (docs/api.md, from the docstrings) and the docs pages into site/;
# strict: any warning (a broken link, a docstring griffe cannot parse) fails
docs:
    {{py}} -m mkdocs build --strict

# format the code
fmt:
    {{py}} -m ruff format sapo_async tests bench examples
    {{py}} -m ruff check --fix sapo_async tests bench examples

# compile the contracts with solcjs, run forge tests offline, refresh the Python artifacts
contracts:
    bash contracts/build.sh

# run a benchmark: just bench fabric|learning|ledger|memory|decode|scale|real|train_layers|defence_fp|plausibility|token_test [--quick] (quick runs write bench/results/quick/)
bench name *args:
    {{py}} bench/{{name}}.py {{args}}

# real nodes on a 3-server NATS cluster with anvil under seeded faults, then the audit:
# just chaos [--quick] [--nodes 8] [--duration 600] [--seed 7] (bench/results/chaos.json)
chaos *args:
    {{py}} bench/chaos.py {{args}}

# a local swarm on embedded defaults (the README's main job)
swarm *args:
    {{py}} -m sapo_async swarm {{args}}

# the paper's I/J comparison (8/0, 6/2, 4/4, 2/6) in both regimes
paper-table *args:
    {{py}} -m sapo_async experiment paper-table {{args}}

# the attack matrix: seven attacks x defences off/on x seeds, a node's own defences
# (docs/security.md)
attack *args:
    {{py}} -m sapo_async experiment attack {{args}}

# issue 23 on SmolLM2-135M over NATS: start per family, a lone node, then 4/0 vs 2/2
# (docs/results/paper-table-real); --resume keeps finished swarms across sittings
paper-table-real *args:
    {{py}} -m sapo_async experiment paper-table --path async --model smollm2-135m --start-rounds 40 --workers 1 --resume {{args}}

# issue 58: one swarm of SmolLM2-135M and Gemma 3 270M nodes (node i runs the i % 2-th),
# each model alone (4/0) and shared (2/2, 2/2+ftis: the preset's arms), two seeds, reported
# per model (docs/swarm.md); into docs/results/paper-table-mixed (--quick: runs/...-quick)
paper-table-mixed *args:
    {{py}} -m sapo_async experiment paper-table --path async --model smollm2-135m+gemma3-270m --start-rounds 40 --workers 1 --resume {{args}}

# the attack matrix on SmolLM2-135M over NATS into docs/results/attack-real-defaults (the
# record of a node's defaults), every node with a node's own defences (the experiment has
# no defence default of its own: a later --defence KEY=VALUE, a node.toml [defence] key,
# changes one, and --out another path); resumes, and grows with more --attacks or --seeds
attack-real *args:
    {{py}} -m sapo_async experiment attack --model smollm2-135m --train-layers 4 --tasks cpu_easy --nodes 4 --attackers 2 --questions 2 --completions 4 --local 1 --external 1 --max-new-tokens 32 --lr 2e-4 --rounds 20 --workers 2 --out docs/results/attack-real-defaults {{args}}

# build (or rebuild) the cached tiny model
warmstart *args:
    {{py}} -m sapo_async warmstart {{args}}

# run a volunteer node from node.toml (sapo-async init writes one)
node config="node.toml":
    {{py}} -m sapo_async node --config {{config}}

# check NATS, JetStream, the RPC, the contract, GPU, disk and model for a node config
doctor config="node.toml":
    {{py}} -m sapo_async doctor --config {{config}}

# write a commented example node config
init path="node.toml":
    {{py}} -m sapo_async init {{path}}

# local NATS + anvil + deployed contracts, printing the settings a node needs
devnet:
    {{py}} -m sapo_async devnet
