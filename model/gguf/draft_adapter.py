"""Where a GGUF model's draft adapter lives, and whether an adapter folder fits a file, read before anything loads.

A draft adapter (`dlm adapt`) is a folder holding a gated LoRA (`adapter.safetensors` and `adapter.json`, the bundled
adapter's form: model/training/adapt.py), a drafter on the model's hidden rows (`drafter.safetensors` and
`drafter.json`: model/training/adapt_drafter.py), or both. Kept beside its model as `<file name>.dlm-adapter/`
(`model.Q4_K_M.gguf` -> `model.Q4_K_M.gguf.dlm-adapter/`; an Ollama blob `sha256-<hex>` -> `sha256-<hex>.dlm-adapter/`),
it is found without `--adapter`. Each of its json files names the teacher's shape (`teacher`: architecture, layers,
width, vocabulary), so a folder trained for another model is refused in one line instead of failing inside torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.errors import ModelError

if TYPE_CHECKING:  # gguf-py only where a header is read (model.gguf.locate.open_gguf)
    from model.gguf.header import GGUFHeader

SUFFIX = ".dlm-adapter"
NONE = "none"  # --adapter none: the file alone, even with an adapter beside it
LORA_FILES = ("adapter.safetensors", "adapter.json")
DRAFTER_FILES = ("drafter.safetensors", "drafter.json")


def beside(model_file: Path) -> Path:
    """The adapter folder kept beside `model_file`."""
    return model_file.with_name(model_file.name + SUFFIX)


def teacher_shape(header: GGUFHeader) -> dict[str, Any]:
    """What an adapter must match of its model (stored as adapter.json's and drafter.json's `teacher`)."""
    return {"architecture": header.architecture, "layers": header.layers,
            "hidden": int(header.value("embedding_length")), "vocab": header.vocab_size}


def find_adapter(header: GGUFHeader, explicit: str | None) -> Path | None:
    """The adapter folder for the model `header` describes: `explicit` (--adapter; "none": no adapter), else the one
    beside the file, else None. Raises ModelError when the folder is not an adapter or was trained for a model of
    another shape."""
    if explicit == NONE:
        return None
    folder = Path(explicit).expanduser() if explicit is not None else beside(header.path)
    if explicit is None and not folder.is_dir():
        return None
    kinds = [files for files in (LORA_FILES, DRAFTER_FILES) if all((folder / name).is_file() for name in files)]
    if not kinds:
        raise ModelError(f"{folder} is not a draft adapter (no {' and '.join(LORA_FILES)}, no "
                         f"{' and '.join(DRAFTER_FILES)}): make one with `dlm adapt`")
    wanted = teacher_shape(header)
    for _, card in kinds:
        try:
            meta = json.loads((folder / card).read_text())
        except (OSError, ValueError) as error:
            raise ModelError(f"{folder}/{card} is unreadable: {error}") from error
        stated = meta.get("teacher")
        if stated is None:
            raise ModelError(f"the adapter in {folder} names no teacher model in {card}: it was not made by `dlm "
                             "adapt` for a GGUF")
        if stated != wanted:
            raise ModelError(f"the adapter in {folder} does not fit {header.path.name}: it was trained for {stated}, "
                             f"this model is {wanted}")
    return folder
