"""Shared fixtures. Area fixtures live in tests/<area>_fixtures.py modules loaded here."""

from __future__ import annotations

import os

# Tests build their own tiny models; nothing may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Each area keeps its fixtures in its own module so areas never edit the same file.
pytest_plugins = [
    "tests.fixtures.fabric",
    "tests.fixtures.learning",
    "tests.fixtures.ledger",
    "tests.fixtures.volunteer",
]
