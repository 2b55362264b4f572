"""A GGUF's tokenizer and config as transformers builds them from the file's header, kept in the cache so a model is
read that way once: transformers parses the whole header (the vocabulary's strings one numpy view each) for each of
the two, 8.7 s and 5.2 s for SmolLM2's file on two cores, where loading the saved pair takes 0.5 s.

Both depend on the header alone, so the cache is keyed by a hash of the header's bytes (and transformers' version,
which may build them differently): a copy of the file elsewhere (an Ollama store's blob) finds the same entry, and
a file whose header changed gets its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from model.disk_cache import cache_root
from model.gguf.header import GGUFHeader

CACHE_FOLDER = "gguf-text"


def header_digest(header: GGUFHeader) -> str:
    """The hash of everything before the tensor data (metadata and tensor table) and of transformers' version."""
    import transformers

    digest = hashlib.sha256(transformers.__version__.encode())
    with header.path.open("rb") as file:
        digest.update(file.read(header.data_start))
    return digest.hexdigest()[:32]


def tokenizer_and_config(header: GGUFHeader) -> tuple[Any, Any]:
    """transformers' tokenizer and config of the GGUF at `header.path`, from the cache when they were built before."""
    from transformers import AutoConfig, AutoTokenizer

    entry = cache_root() / CACHE_FOLDER / header_digest(header)
    if (entry / "config.json").is_file():
        return AutoTokenizer.from_pretrained(entry), AutoConfig.from_pretrained(entry)
    folder, name = str(header.path.parent), header.path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f"{entry.name}.", dir=entry.parent)  # written whole, then renamed into place
    try:
        tokenizer.save_pretrained(partial)
        config.save_pretrained(partial)
        with contextlib.suppress(OSError):  # another process put the same entry in place first
            Path(partial).rename(entry)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return tokenizer, config
