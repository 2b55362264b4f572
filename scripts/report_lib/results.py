"""How a benchmark hands back its figures: a summary on stdout, the whole result in a JSON file when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(result: dict[str, Any], path: Path | None, indent: int = 2) -> None:
    """Write `result` to `path` (its folder made first); nothing when `path` is None (no `--json` given)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent) + "\n")


def print_and_save(summary: dict[str, Any], result: dict[str, Any], path: Path | None, indent: int = 2) -> None:
    """Print `summary` as JSON, then save the whole `result` as `save_json` does."""
    print(json.dumps(summary, indent=indent))
    save_json(result, path, indent)
