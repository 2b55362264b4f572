"""Block diffusion on top of an autoregressive checkpoint (the bundled default model's form).

An instruction-tuned causal LM becomes a block-diffusion LM with three small additions, in the spirit of Fast-dLLM v2 /
SDAR but sized for a CPU:

* **Block attention.** The answer is split into blocks of `block_length` tokens. A noisy block attends bidirectionally
  to itself and causally to everything before it; finished blocks never see later ones, so their KV cache is exact.
* **Next-token shift kept.** The hidden state at position i still predicts token i+1, so the pretrained head stays
  meaningful: the first token of a block is predicted by the clean position just before it, the others by the noisy
  block's own positions.
* **Adapter on the noisy stream only.** Gated LoRA on every linear layer plus a learned mask embedding. The gate is 0
  for clean tokens (prompt and finished blocks) and 1 for the noisy block, so the cache and each block's first-token
  prediction are exactly the teacher's: the adapter only learns to fill masks, it cannot drift the model's own voice.

Because clean and noisy tokens are told apart by the gate, finishing a block costs nothing extra: its clean encoding is
fused into the first pass of the next block (one forward over `[finished block | noisy block]`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from model.errors import ModelError
from model.runtime import fused_layers, row_exact
from model.runtime.batching import prefill_bucket
from model.runtime.fast_pass import FastPass
from model.runtime.huge_pages import onto_huge_pages
from model.runtime.int4_weights import Int4Weights
from model.runtime.noisy_rows import Suffix, noisy_suffix

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """Shape of the trained adapter; saved next to its weights so a checkpoint describes itself."""

    block_length: int = 4
    lora_rank: int = 16
    lora_alpha: float = 32.0
    targets: tuple[str, ...] = LORA_TARGETS

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["targets"] = list(self.targets)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AdapterConfig:
        """The config saved by `to_json` (adapter.json's values are whatever JSON held); unknown keys are ignored."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "targets" in known:
            known["targets"] = tuple(known["targets"])
        return cls(**known)


class _Gate:
    """Which tokens get the LoRA, shared by every adapted layer. `suffix_from` set: only columns from there on can be
    noisy (every decoding pass: each sequence's noisy rows are its last ones), so only they pay for it, and `mask`
    (`[batch, seq - suffix_from, 1]` of 0/1) says which of them are, or is None when all are. `suffix_from` None:
    `mask` `[batch, seq, 1]` for any pattern (training). Both None: the adapter is on everywhere."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.suffix_from: int | None = None


class GatedLoRALinear(nn.Module):
    """`base(x) + gate * scale * B(A(x))`: LoRA that can be switched off token by token."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gate: _Gate) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank
        self._gate = gate

    def _delta(self, x: torch.Tensor) -> torch.Tensor:
        # In the factors' own dtype: at inference they stay fp32 while the base runs in bf16, because a CPU multiplies
        # these thin matrices (rank 16, a few rows) 3-8x faster in fp32 than in bf16 (kernel set-up dominates).
        dtype = self.lora_a.dtype
        return (self.scale * ((x.to(dtype) @ self.lora_a.t()) @ self.lora_b.t().to(dtype))).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, in]
        out = self.base(x)
        start = self._gate.suffix_from
        if start is not None:  # clean rows [0, start) are exactly the base layer: no LoRA work for them
            if start >= x.shape[1]:
                return out
            delta = self._delta(x[:, start:])
            if self._gate.mask is not None:  # sequences with fewer noisy rows than the longest suffix
                delta = delta * self._gate.mask.to(delta.dtype)
            if start == 0:
                return out + delta
            out[:, start:].add_(delta)  # in place: Linear's backward never needs its output
            return out
        delta = self._delta(x)
        if self._gate.mask is not None:
            delta = delta * self._gate.mask.to(delta.dtype)
        return out + delta


@runtime_checkable
class MeanRow(Protocol):
    """An embedding that holds no dense `weight` (a GGUF's own blocks, model/gguf/embedding.py) and averages its rows
    itself."""

    def mean_row(self) -> torch.Tensor: ...


def _mean_embedding(embed: nn.Module) -> torch.Tensor:
    """The mean token embedding in fp32: the mask embedding's starting point (an adapter's own replaces it)."""
    if isinstance(embed, MeanRow):
        return embed.mean_row()
    return embed.weight.detach().float().mean(0).clone()


class BlockDiffusionLM(nn.Module):
    """A causal LM plus the block-diffusion adapter (gated LoRA + mask embedding)."""

    def __init__(self, base: PreTrainedModel, config: AdapterConfig) -> None:
        super().__init__()
        self.base = base
        self.config = config
        self.vocab_size = int(base.config.vocab_size)
        self.mask_id = self.vocab_size  # outside the vocabulary: replaced by `mask_embedding`, never predicted
        self._gate = _Gate()
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        hidden = int(base.config.hidden_size)
        self.mask_embedding = nn.Parameter(_mean_embedding(base.get_input_embeddings()).reshape(hidden))
        self._inject_lora(config)
        self._fast_pass: FastPass | None = None
        self.int4: Int4Weights | None = None  # see `use_int4`
        # SDPA, with the fused pass's exact rows (model.runtime.row_exact)
        if base.config._attn_implementation == "sdpa":
            base.set_attn_implementation(row_exact.ATTENTION_NAME)

    def _inject_lora(self, config: AdapterConfig) -> None:
        for module in list(self.base.modules()):
            for child_name, child in list(module.named_children()):
                if child_name in config.targets and isinstance(child, nn.Linear):
                    wrapped = GatedLoRALinear(child, config.lora_rank, config.lora_alpha, self._gate)
                    setattr(module, child_name, wrapped)
        # no targets: no adapter at all (a GGUF model without drafts, model/adapters/gguf_model.py)
        if config.targets and not any(isinstance(m, GatedLoRALinear) for m in self.base.modules()):
            raise ModelError(f"none of the LoRA targets {config.targets} exist in {type(self.base).__name__}")

    # --- adapter weights ------------------------------------------------------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Only the trained weights: what ships in the package."""
        return {name: p.detach().cpu() for name, p in self.named_parameters() if p.requires_grad}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_parameters())
        missing = [name for name, p in own.items() if p.requires_grad and name not in state]
        unknown = [name for name in state if name not in own]
        if missing or unknown:
            raise ModelError(f"adapter does not fit this model: missing {missing[:3]}, unknown {unknown[:3]}")
        shaped = [name for name, tensor in state.items() if tensor.shape != own[name].shape]
        if shaped:
            raise ModelError(f"adapter does not fit this model: {shaped[0]} is {tuple(state[shaped[0]].shape)}, the "
                             f"model's {tuple(own[shaped[0]].shape)}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self._fast_pass = None  # its fused LoRA factors are copies of the old ones

    def cast_adapter(self, dtype: torch.dtype) -> None:
        """Store the adapter in `dtype` (bf16 for CPU inference). Only the adapter: casting the whole model would also
        cast the rotary `inv_freq` buffer and blur positions."""
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.to(dtype)
        self._fast_pass = None

    def use_int4(self, weights: Int4Weights | None) -> None:
        """Decode with these int4 weights (`model.runtime.int4_weights`: the base's own weights as the GGUF stores
        them) in the fused pass, or with the bf16 ones again (None). The modules' forward (training) always uses
        bf16."""
        if weights is not None and len(weights.layers) != len(self.base.model.layers):
            raise ModelError(f"{len(weights.layers)} int4 layers for a model of {len(self.base.model.layers)}")
        if weights is not None:  # on 2 MB pages, in the order a pass reads them (model/runtime/huge_pages.py)
            onto_huge_pages(weights.linears())
        self.int4 = weights
        self._fast_pass = None

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    def inference_pass(self) -> FastPass | BlockDiffusionLM:
        """What runs a decoding pass over a `SlotCache`: the fused `FastPass` for a plain Llama (built once from the
        current weights), else this module itself. Training (autograd) always uses the module."""
        if self.training or not fused_layers.supports(self):
            return self
        if self._fast_pass is None:
            # normal tensors even when first asked inside a pass: the modules' weights become views of the fused ones
            with torch.inference_mode(False), torch.no_grad():
                self._fast_pass = FastPass(self)
        return self._fast_pass

    def prefill_size(self, rows: int) -> int:
        """Rows a prefill of `rows` tokens is padded to (`model.runtime.batching.prefill`): none added for the decode
        kernel, a `prefill_bucket` for bf16 matmuls (which build a kernel per shape)."""
        fast = self.inference_pass()
        native = isinstance(fast, FastPass) and fast.native is not None and fast.int4_prefill(rows)
        return rows if native else prefill_bucket(rows)

    # --- forward --------------------------------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings with every `mask_id` replaced by the learned mask embedding."""
        is_mask = input_ids == self.mask_id
        embeds = self.base.get_input_embeddings()(input_ids.masked_fill(is_mask, 0))
        return torch.where(is_mask.unsqueeze(-1), self.mask_embedding.to(embeds.dtype), embeds)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        position_ids: torch.Tensor,  # [B, S]
        attention_bias: torch.Tensor,  # [B, 1, S, K + S] additive float (0 attend, -inf not)
        noisy: torch.Tensor,  # [B, S] bool: which tokens get the adapter
        cache: Cache | None,
        logits_to_keep: int | torch.Tensor = 0,
        exact_rows: int | None = None,
        suffix: Suffix | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Logits `[B, S, vocab]`; appends this call's keys/values to `cache` when given.

        In a decoding pass (clean rows, then noisy ones) of one answer the clean rows, or the first `exact_rows`, are
        attended one by one (`model.runtime.row_exact`), as in the fused pass; any other pattern (training) is plain
        SDPA.

        `logits_to_keep` is the base model's (0: every position; k: the last k; a 1-D tensor: those
        positions): the vocabulary projection is the largest matmul per token, so a caller that needs one row of
        many (the prefill) asks for it. `suffix`: `noisy_suffix(noisy)` found by the caller on the host (a decoding
        pass's, model/runtime/batching.py); None: found here. `prefill` is the fused pass's (these modules are bf16
        always).
        """
        if suffix is None:
            suffix = noisy_suffix(noisy)
        if suffix is None:
            self._gate.mask, self._gate.suffix_from = noisy.unsqueeze(-1).float(), None
        else:
            start, rows = suffix
            self._gate.mask = None if rows is None else rows.unsqueeze(-1).float()
            self._gate.suffix_from = start
            if exact_rows is None:  # as the fused pass chooses
                exact_rows = row_exact.default_exact_rows(input_ids.shape[0], start)
        try:
            out = self.base(
                inputs_embeds=self.embed(input_ids),
                position_ids=position_ids,
                attention_mask=attention_bias.to(self.base.dtype),
                past_key_values=cache,
                use_cache=cache is not None,
                logits_to_keep=logits_to_keep,
                exact_rows=exact_rows,
            )
        finally:
            self._gate.mask, self._gate.suffix_from = None, None
        return out.logits




def save_adapter(model: BlockDiffusionLM, directory: Path, extra: dict[str, object] | None = None) -> None:
    """Write `adapter.safetensors` and `adapter.json` (config plus free-form training facts)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # fp16 halves the shipped size; LoRA factors lose nothing measurable at this precision
    state = {
        name: tensor.to(torch.float16 if tensor.ndim > 1 else torch.float32).contiguous()
        for name, tensor in model.adapter_state().items()
    }
    save_file(state, str(directory / "adapter.safetensors"))
    meta = {"adapter": model.config.to_json(), **(extra or {})}
    (directory / "adapter.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_adapter(model_base: PreTrainedModel, directory: Path) -> BlockDiffusionLM:
    """Rebuild a `BlockDiffusionLM` from a base model and a saved adapter folder."""
    from safetensors.torch import load_file

    weights, meta_path = directory / "adapter.safetensors", directory / "adapter.json"
    if not weights.is_file() or not meta_path.is_file():
        raise ModelError(f"no block-diffusion adapter in {directory} (expected adapter.safetensors and adapter.json)")
    meta = json.loads(meta_path.read_text())
    model = BlockDiffusionLM(model_base, AdapterConfig.from_json(meta["adapter"]))
    model.load_adapter_state(load_file(str(weights)))
    return model
