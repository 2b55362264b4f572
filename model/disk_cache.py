"""Where the project keeps what it makes once and reuses: the converted base model, joined Whisper parts, the TLS
certificate, report audio. One place, so that moving it (or pointing CI at an empty one) moves everything."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$VOICE_ASSISTANT_CACHE, else $XDG_CACHE_HOME/voice-assistant, else ~/.cache/voice-assistant."""
    override = os.environ.get("VOICE_ASSISTANT_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voice-assistant"
