"""Shared set-up of the API tests: dlm-serve in a background thread over a tiny real diffusion chat model."""

from __future__ import annotations

from pathlib import Path

from model.chat import ChatModel
from model.server.background import RunningServer
from model.server.background import serve_in_thread as serve

__all__ = ["RunningServer", "serve", "tiny_chat_model"]


def tiny_chat_model(folder: Path, block_length: int = 8) -> ChatModel:
    """A real `DiffusionChatModel` over a random 2-layer BERT (tests/unit/tiny_models.py): fast, offline, and
    multi-pass (one token committed per pass), so streams have many drafts. Its words are random, not an answer."""
    from model.loading import load_chat_model
    from tests.unit.tiny_models import tiny_bert

    return load_chat_model(str(tiny_bert(folder)), block_length=block_length, steps_per_block=block_length)
