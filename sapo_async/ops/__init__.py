"""Operating a node on a volunteer's machine: everything around the round.

:mod:`.config` (the node's TOML file and environment), :mod:`.identity` (the key),
:mod:`.hardware` (which backend to run), :mod:`.doctor` (pre-flight checks),
:mod:`.devnet` (local NATS + anvil + contract), :mod:`.metrics` (Prometheus),
:mod:`.status` and :mod:`.reporting` (the live table and JSONL logs). Sits above
:mod:`sapo_async.node`; only the CLI and experiments sit above it.
"""
