"""`load_chat_model(spec)`: from a model spec to a ready `ChatModel`, picking the adapter from the checkpoint's config.

Spec: None -> the bundled default model; a local folder or a hub id -> read `config.json` (`model_type`, `auto_map`)
and choose: `auto_map` -> remote-code (LLaDA-style) adapter; `diffusion_gemma` -> DiffusionGemma; anything that
transformers maps to a masked LM -> the masked-LM adapter. Hub ids are resolved by transformers (users' machines only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from model.chat import ChatModel
from model.decoding.sampler import SamplerConfig
from model.device import resolve_device
from model.errors import ModelError
from model.runtime.passing_thread import on_passing_thread

SAMPLER_FIELDS = frozenset(SamplerConfig.__dataclass_fields__)


def read_config(spec: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dict; raises ModelError("...not found...") when there is none."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise ModelError(f"model not found: {spec!r} is a folder without a config.json")
        return json.loads(path.read_text())
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ModelError(f"model not found: {spec!r} is neither a local checkpoint folder nor a hub id (owner/name)")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(spec, trust_remote_code=False).to_dict()
    except ValueError:  # a remote-code config: read the raw json instead
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(spec, "config.json")).read_text())
    except OSError as error:
        raise ModelError(f"model not found: {spec!r} ({error})") from error


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
def load_chat_model(spec: str | None = None, **overrides: Any) -> ChatModel:
    """Load a chat model. `overrides`: SamplerConfig fields (block_length, threshold, ...), `device` (cpu, cuda or
    auto: `model.device.resolve_device`; default cpu), `system_prompt`,
    `max_batch` (answers decoded together in one pass, for models that batch), `weights` (the bundled model's: auto,
    int4 or bf16, `model.bundled.default_model.load_default_chat_model`).

    Runs on a passing thread, so the caller's thread keeps no OpenMP workers that would slow down the thread that runs
    the passes (`model.runtime.passing_thread`).

    Raises ModelError for an unknown path, an unsupported architecture, or a checkpoint with no mask token.
    """
    # None: the CPU, as before devices were a choice (the commands resolve `--device auto` themselves)
    device = resolve_device(overrides.pop("device", None) or "cpu")
    weights = overrides.pop("weights", None) or "auto"
    if spec is None or (Path(spec) / "adapter.json").is_file():
        # the bundled model, or another block-diffusion adapter for the same base (e.g. one you trained)
        from model.bundled.default_model import load_default_chat_model

        return load_default_chat_model(Path(spec) if spec else None, device=device, weights=weights, **overrides)
    if weights == "int4":
        raise ModelError("int4 weights come from the bundled model's GGUF: --weights int4 needs no --model")
    from model.chat.engine import DiffusionChatModel, context_length_of

    config = read_config(spec)
    kind = architecture(config)
    system_prompt = overrides.pop("system_prompt", None)
    max_batch = overrides.pop("max_batch", None)
    unknown = set(overrides) - SAMPLER_FIELDS
    if unknown:
        raise ModelError(f"unknown model options: {sorted(unknown)}")
    # bf16 on a GPU (tensor cores' full rate; DiffusionGemma always loads in bf16); fp32 on the CPU, as before
    dtype = torch.bfloat16 if device.type == "cuda" else None
    if kind == "diffusion_gemma":
        from model.adapters.diffusion_gemma import load_diffusion_gemma

        return load_diffusion_gemma(spec, device=str(device), system_prompt=system_prompt, **overrides)
    if kind == "remote_code":
        from model.adapters.remote_code import load_remote_code

        tokenizer, denoiser = load_remote_code(spec, device=str(device), dtype=dtype)
    else:
        from model.adapters.masked_lm import load_masked_lm

        tokenizer, denoiser = load_masked_lm(spec, device=str(device), dtype=dtype)
    sampler = SamplerConfig(**overrides)
    context = context_length_of(denoiser.model.config)
    return DiffusionChatModel(Path(spec).name or spec, tokenizer, denoiser, sampler, system_prompt, context, max_batch)
