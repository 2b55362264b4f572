"""OpenAI-compatible HTTP API over a `ChatModel` (`dlm-serve`). See API.md for the wire contract."""

from __future__ import annotations

from model.server.app import create_app
from model.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
