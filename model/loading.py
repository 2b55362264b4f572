"""`load_chat_model(spec)`: from a `ModelSpec` to a ready `ChatModel`, picking the adapter from the checkpoint.

Above both model/bundled/ and model/adapters/, so neither imports upward. `spec.source`: None -> the bundled default
model; a GGUF (`spec.gguf`: a .gguf path, `ollama:NAME`, a folder holding one) -> a user's own llama/qwen2/qwen3
model, decoded autoregressively; a folder with an adapter.json -> another block-diffusion adapter of the bundled base;
another local folder or a hub id -> read `config.json` (`model_type`, `auto_map`) and choose: `auto_map` ->
remote-code (LLaDA-style) adapter; `diffusion_gemma` -> DiffusionGemma; anything that transformers maps to a masked
LM -> the masked-LM adapter. Hub ids are resolved by transformers (users' machines only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from model.adapters.sampler_backend import SamplerBackend
from model.chat import ChatModel
from model.chat.engine import DiffusionChatModel, context_length_of
from model.chat.spec import ModelSpec
from model.decoding.sampler import SamplerConfig
from model.device import resolve_device
from model.errors import ModelError
from model.runtime.passing_thread import on_passing_thread


def read_config(source: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dict; raises ModelError("...not found...") when there is none."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise ModelError(f"model not found: {source!r} is a folder without a config.json")
        return json.loads(path.read_text())
    looks_like_hub_id = source.count("/") == 1 and not source.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ModelError(f"model not found: {source!r} is neither a local checkpoint folder nor a hub id (owner/name)")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(source, trust_remote_code=False).to_dict()
    except ValueError:  # a remote-code config: read the raw json instead
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(source, "config.json")).read_text())
    except OSError as error:
        raise ModelError(f"model not found: {source!r} ({error})") from error


def architecture(config: dict[str, Any]) -> str:
    """Which adapter serves a config: "remote_code", "diffusion_gemma" or "masked_lm"."""
    model_type = config.get("model_type", "")
    if model_type == "diffusion_gemma":
        return "diffusion_gemma"
    if config.get("auto_map"):
        return "remote_code"
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked_lm"
    raise ModelError(
        f"no diffusion adapter for model_type {model_type!r}: expected a masked LM (BERT, ModernBERT...), "
        "a LLaDA-style remote-code checkpoint, or DiffusionGemma"
    )


@on_passing_thread
def load_chat_model(spec: ModelSpec | None = None) -> ChatModel:
    """Load the model `spec` names (None: the bundled one, on the CPU).

    Runs on a passing thread, so the caller's thread keeps no OpenMP workers that would slow down the thread that runs
    the passes (`model.runtime.passing_thread`).

    Raises ModelError for an unknown path, an unsupported architecture, or a checkpoint with no mask token.
    """
    spec = spec or ModelSpec()
    if spec.gguf is not None:
        from model.adapters.gguf_model import load_gguf_chat_model

        return load_gguf_chat_model(spec)
    if spec.source is None or (Path(spec.source) / "adapter.json").is_file():
        from model.bundled.default_model import load_default_chat_model

        return load_default_chat_model(spec)
    return _load_external(spec.source, spec)


def _load_external(source: str, spec: ModelSpec) -> ChatModel:
    """An external diffusion checkpoint, `spec.source`."""
    if spec.weights == "int4":
        raise ModelError("int4 weights come from the bundled model's GGUF: --weights int4 needs no --model")
    device = resolve_device(spec.device)
    kind = architecture(read_config(source))
    if kind == "diffusion_gemma":
        from model.adapters.diffusion_gemma import load_diffusion_gemma

        return load_diffusion_gemma(source, device, spec)
    # bf16 on a GPU (tensor cores' full rate); fp32 on the CPU
    dtype = torch.bfloat16 if device.type == "cuda" else None
    if kind == "remote_code":
        from model.adapters.remote_code import load_remote_code

        tokenizer, denoiser = load_remote_code(source, device=str(device), dtype=dtype)
    else:
        from model.adapters.masked_lm import load_masked_lm

        tokenizer, denoiser = load_masked_lm(source, device=str(device), dtype=dtype)
    sampler = spec.decoding.apply(SamplerConfig())
    name = Path(source).name or source
    return DiffusionChatModel(name, tokenizer, SamplerBackend(name, denoiser, sampler), sampler, spec.system_prompt,
                              context_length_of(denoiser.model.config))
