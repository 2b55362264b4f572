"""Fixtures every test layer shares: the models a test only reads are loaded once per run, as one server shares them
between its sessions (a test that needs other engines builds its own)."""

from __future__ import annotations

import pytest

from tests.integration.ws_harness import load_test_engines
from voice.engines import Engines


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Engines:
    """Real Whisper and Piper, and the bundled LM (`load_test_engines`)."""
    return load_test_engines(tmp_path_factory.mktemp("lm"))
