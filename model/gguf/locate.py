"""Which GGUF file a `--model` value names: a `.gguf` path, `ollama:NAME[:TAG]`, or a folder holding one model file.

Where users keep them (DESIGN.md, round 4): Ollama stores every file as a content-addressed blob
(`$OLLAMA_MODELS/blobs/sha256-<hex>`, default `~/.ollama/models`) named by a JSON manifest at
`manifests/<registry>/<namespace>/<name>/<tag>`; LM Studio keeps `~/.lmstudio/models/PUBLISHER/REPO/FILE.gguf`, with
vision projectors (`mmproj-*.gguf`) beside the model. Parsing a name is pure (`OllamaName.parse`, `manifest_blob`);
`locate_gguf` reads only directory listings and the small manifest. Every refusal is one line (`ModelError`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.errors import ModelError

if TYPE_CHECKING:
    from model.gguf.header import GGUFHeader

OLLAMA_PREFIX = "ollama:"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
OLLAMA_TAG = "latest"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
# Files beside a model that are not the model: vision projectors (LM Studio and llama.cpp name them mmproj-*)
PROJECTOR_MARKS = ("mmproj", "projector")


@dataclass(frozen=True, slots=True)
class OllamaName:
    """`[registry/][namespace/]name[:tag]`, as Ollama spells a model (`qwen2.5:0.5b`, `hf.co/owner/repo:Q4_K_M`)."""

    name: str
    tag: str = OLLAMA_TAG
    namespace: str = OLLAMA_NAMESPACE
    registry: str = OLLAMA_REGISTRY

    @classmethod
    def parse(cls, text: str) -> OllamaName:
        """The name after `ollama:`; raises ModelError for an empty or malformed one."""
        head, colon, tail = text.rpartition(":")
        path, tag = (head, tail) if colon and "/" not in tail else (text, "")  # a colon before a "/" is a port
        parts = path.split("/")
        if not all(parts) or len(parts) > 3 or any(part in (".", "..") for part in parts) or tag in (".", ".."):
            raise ModelError(f"not an Ollama model name: {OLLAMA_PREFIX}{text} (expected {OLLAMA_PREFIX}NAME[:TAG], "
                             f"e.g. {OLLAMA_PREFIX}qwen2.5:0.5b)")
        registry, namespace = OLLAMA_REGISTRY, OLLAMA_NAMESPACE
        if len(parts) == 3:
            registry, namespace = parts[0], parts[1]
        elif len(parts) == 2:
            namespace = parts[0]
        return cls(parts[-1], tag or OLLAMA_TAG, namespace, registry)

    def manifest(self, root: Path) -> Path:
        return root / "manifests" / self.registry / self.namespace / self.name / self.tag

    def __str__(self) -> str:
        if self.registry != OLLAMA_REGISTRY:
            return f"{self.registry}/{self.namespace}/{self.name}:{self.tag}"
        if self.namespace != OLLAMA_NAMESPACE:
            return f"{self.namespace}/{self.name}:{self.tag}"
        return f"{self.name}:{self.tag}"


def ollama_root(environ: Mapping[str, str]) -> Path:
    """Where Ollama keeps its models: `$OLLAMA_MODELS`, else `~/.ollama/models`."""
    configured = environ.get("OLLAMA_MODELS")
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


def manifest_blob(manifest: Mapping[str, Any], root: Path) -> Path:
    """The blob of a manifest's model layer (`blobs/sha256-<hex>`: the GGUF itself); ModelError if it has none."""
    for layer in manifest.get("layers") or ():
        if isinstance(layer, Mapping) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            digest = str(layer.get("digest", ""))
            algorithm, _, hexdigest = digest.partition(":")
            if algorithm != "sha256" or not hexdigest.isalnum():
                raise ModelError(f"the Ollama manifest's model layer has a malformed digest {digest!r}")
            return root / "blobs" / f"sha256-{hexdigest}"
    raise ModelError(f"the Ollama manifest lists no model layer ({OLLAMA_MODEL_LAYER})")


def locate_ollama(text: str, environ: Mapping[str, str]) -> Path:
    """The GGUF blob `ollama:<text>` names under `ollama_root(environ)`."""
    name = OllamaName.parse(text)
    root = ollama_root(environ)
    path = name.manifest(root)
    if not path.is_file():
        folder = path.parent
        tags = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
        there = f"; its tags there: {', '.join(tags)}" if tags else ""
        raise ModelError(f"no Ollama model {OLLAMA_PREFIX}{name} in {root} (no manifest {path}){there}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot read the Ollama manifest {path}: {error}") from error
    if not isinstance(manifest, dict):
        raise ModelError(f"the Ollama manifest {path} is not a JSON object")
    blob = manifest_blob(manifest, root)
    if not blob.is_file():
        raise ModelError(f"{OLLAMA_PREFIX}{name}: its manifest names {blob.name}, which is not in {blob.parent}")
    return blob


def model_files(names: list[str]) -> list[str]:
    """The model GGUFs among a folder's file names: every `.gguf` but vision projectors."""
    return sorted(name for name in names if name.lower().endswith(".gguf")
                  and not any(mark in name.lower() for mark in PROJECTOR_MARKS))


def locate_in_folder(folder: Path) -> Path:
    """The one model `.gguf` in `folder` (LM Studio's PUBLISHER/REPO layout)."""
    found = model_files([entry.name for entry in folder.iterdir() if entry.is_file()])
    if not found:
        raise ModelError(f"model not found: {folder} holds no .gguf file (nor a diffusion checkpoint's config.json)")
    if len(found) > 1:
        raise ModelError(f"{len(found)} GGUF models in {folder} ({', '.join(found)}): pass one file's path")
    return folder / found[0]


def locate_gguf(source: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The GGUF file `source` (a `--model` value) names, or None when it names something else: a block-diffusion
    adapter or diffusion checkpoint folder (adapter.json or config.json inside), or a hub id. Raises ModelError for
    a GGUF name that leads nowhere."""
    environ = os.environ if environ is None else environ
    if source.startswith(OLLAMA_PREFIX):
        return locate_ollama(source.removeprefix(OLLAMA_PREFIX), environ)
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"no GGUF file at {path}")
        return path
    if not path.is_dir() or (path / "adapter.json").is_file() or (path / "config.json").is_file():
        return None
    return locate_in_folder(path)


def open_gguf(source: str, environ: Mapping[str, str] | None = None) -> GGUFHeader | None:
    """The header of the GGUF `source` names, checked as one this runtime runs (`check_supported`), or None when
    `source` names no GGUF (`locate_gguf`). Raises ModelError, one line, for anything else."""
    path = locate_gguf(source, environ)
    if path is None:
        return None
    # Imported here, once `source` is known to be a GGUF: the header's type tables are gguf-py's, whose package
    # imports numpy and its reader and writer (~0.3 s), which the bundled model and checkpoint folders never need.
    from model.gguf.header import check_supported, read_header

    header = read_header(path)
    check_supported(header)
    return header
