"""Each node.toml key that names a setting of the node spec is that spec field itself.

The second structural pass generated every such section from the spec's own models
(issue 21, item 3): the key is the field's name, and its type, default, bounds, checks and
description are the spec's. These tests fail when a section grows its own copy of a spec
setting (a second default or bound), or when a spec setting is renamed on its way.
"""

from __future__ import annotations

from typing import Any

import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.spec import NodeSpec
from sapo_async.ops.config_base import SpecSection
from sapo_async.ops.config_sections import SECTIONS

SPEC_SECTIONS = {
    name: model
    for name, model in SECTIONS.items()
    if isinstance(model, type) and issubclass(model, SpecSection)
}


def test_every_section_of_node_settings_is_generated_from_the_spec() -> None:
    assert set(SPEC_SECTIONS) == {
        "node",
        "nats",
        "ledger",
        "model",
        "tasks",
        "training",
        "checkpoint",
    }


@pytest.mark.parametrize("section", sorted(SPEC_SECTIONS))
def test_a_sections_spec_keys_carry_the_specs_default_bounds_and_description(
    section: str,
) -> None:
    model = SPEC_SECTIONS[section]
    spec = model.spec_kind
    for name in model.spec_fields:
        ours, theirs = model.model_fields[name], spec.model_fields[name]
        assert ours.annotation == theirs.annotation, name
        assert ours.get_default(call_default_factory=True) == theirs.get_default(
            call_default_factory=True
        ), name
        assert ours.metadata == theirs.metadata, name  # bounds and field checks
        assert ours.description == theirs.description, name


@pytest.mark.parametrize(
    ("keyword", "says"),
    [
        ("nats_url", "fabric.nats_url is now called urls"),
        ("fabric_lookback_minutes", "lookback_minutes is now called start"),
        ("shard_rotate_minutes", "shard_rotate_minutes is now called shard_rotate_s"),
        ("nats_options", "now called urls, creds_file"),
    ],
)
def test_an_old_keyword_is_refused_naming_the_new_one(keyword: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        NodeSpec.build(**{keyword: "x"})
    assert info.value.field == keyword


@pytest.mark.parametrize(
    ("keyword", "value", "field"),
    [
        ("urls", "http://x:1", "fabric.urls"),
        ("start", "oldest", "fabric.start"),
        ("shards", 8, "fabric.shards"),
        ("relayer_key_file", "/no/such/key", "ledger.relayer_key_file"),
        ("contract_address", "0x12", "ledger.contract_address"),
        ("swarm", "a.b", "swarm"),  # a dot would split the NATS subject
    ],
)
def test_python_callers_get_the_same_checks_as_the_file(
    keyword: str, value: Any, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        NodeSpec.build(**{keyword: value})
    assert info.value.field == field
