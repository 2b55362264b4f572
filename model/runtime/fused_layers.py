"""A network's layers as the fused pass holds them (model/runtime/fast_pass.py): q/k/v and gate/up stacked into one
matrix each, whose rows the modules' own weights then view (nothing held twice), the LoRA factors kept member by
member, and the C decode layer's view of each fused linear. Also which networks the fused pass computes exactly
(`supports`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from model.runtime import quant_kernels
from model.runtime.int4_weights import Int4Layer, Int4Weights
from model.runtime.packed import PackedLinear


class LoRALinear(Protocol):
    """What the fused pass reads of an adapted linear layer (model/bundled/block_diffusion.py's GatedLoRALinear):
    its base layer, whose weight it replaces by a view of the fused one, and its LoRA factors."""

    base: nn.Linear
    lora_a: torch.Tensor  # [rank, in]
    lora_b: torch.Tensor  # [out, rank]
    scale: float


class AdaptedModel(Protocol):
    """What the fused pass reads of a block-diffusion network (model/bundled/block_diffusion.py's BlockDiffusionLM):
    the base Llama with its linears adapted, the adapter's targets, the int4 weights when it decodes with them, and
    its embedding of mask tokens."""

    base: Any  # a transformers Llama (Qwen2, Qwen3) causal LM whose linears are LoRALinear, or plain when no targets
    config: Any  # its AdapterConfig (`targets`)
    int4: Int4Weights | None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class LayerLoRA:
    """A fused group's LoRA: each member's `scale * (x @ a.T) @ b.T`, side by side (fp32 factors on a CPU: thin
    matmuls run faster). Computed member by member, as the modules do: stacking the factors into one pair (a
    block-diagonal B) changed the sums' rounding on MKL's AVX2 kernels, whose thin matmuls round by their width."""

    factors: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per member: a [rank, in], b [out, rank]
    scale: float

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        if not self.factors:  # no adapter
            return torch.zeros(*x.shape[:-1], 0, dtype=x.dtype)
        h = x.to(self.factors[0][0].dtype)
        parts = [self.scale * ((h @ a.t()) @ b.t()) for a, b in self.factors]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)).to(x.dtype)


@dataclass(frozen=True, slots=True)
class FusedLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor  # [heads * d + 2 * kv_heads * d, hidden]
    o: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor
    qkv_lora: LayerLoRA
    o_lora: LayerLoRA
    gate_up_lora: LayerLoRA
    down_lora: LayerLoRA
    qkv_bias: torch.Tensor | None  # Qwen2's q, k, v biases, side by side
    q_norm: torch.Tensor | None  # Qwen3's RMS norm weights of each q and k head
    k_norm: torch.Tensor | None
    int4: Int4Layer | None  # the same linears as the GGUF's int4 blocks, for decoding (model.runtime.int4_weights)


# What the pass computes beyond a plain Llama: Qwen2's biases on q, k and v, Qwen3's norms on q and k
ARCHITECTURES = ("llama", "qwen2", "qwen3")
ALL_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def supports(model: AdaptedModel) -> bool:
    """Whether `FastPass` computes what `model`'s own forward does: a plain Llama (SmolLM2's architecture), exactly,
    or Qwen2 or Qwen3 (full attention, default rotary; Qwen2's biases added to the projection's rounded output, one
    rounding more than transformers' fused bias in bf16), with the LoRA on every linear layer or no adapter at all."""
    config = model.base.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = getattr(config, "model_type", "")
    return (
        kind in ARCHITECTURES
        and getattr(config, "hidden_act", "") == "silu"
        and not (kind != "qwen2" and getattr(config, "attention_bias", False))
        and not getattr(config, "mlp_bias", False)
        and not getattr(config, "use_sliding_window", False)
        and rope.get("rope_type", "default") == "default"
        and set(model.config.targets) in (ALL_TARGETS, set())
    )


def base_linear(module: LoRALinear | nn.Linear) -> nn.Linear:
    return module if isinstance(module, nn.Linear) else module.base


def fuse(modules: list[LoRALinear] | list[nn.Linear]) -> tuple[torch.Tensor, LayerLoRA]:
    """Stack the base weights of `modules` (same input) into one matrix whose rows the modules then view; keep
    their LoRA factors member by member (none for plain linears: a model without an adapter)."""
    linears = [base_linear(m) for m in modules]
    fused = torch.cat([linear.weight.detach() for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = nn.Parameter(fused[offset : offset + rows], requires_grad=False)  # a view: no second copy
        offset += rows
    adapted = [m for m in modules if not isinstance(m, nn.Linear)]
    if not adapted:
        return fused, LayerLoRA((), 0.0)
    scales = {m.scale for m in adapted}
    if len(scales) != 1:
        raise ValueError("fused LoRA members must share one scale")
    return fused, LayerLoRA(tuple((m.lora_a.detach(), m.lora_b.detach()) for m in adapted), scales.pop())


def native_lora_rank(lora: LayerLoRA) -> int | None:
    """The LoRA's rank when decode_layer.c takes it (one rank, at most 4 members, members x rank at most 256; 0 for
    none)."""
    if not lora.factors:
        return 0
    ranks = {a.shape[0] for a, _ in lora.factors}
    rank = ranks.pop() if len(ranks) == 1 else None
    return rank if rank is not None and len(lora.factors) <= 4 and len(lora.factors) * rank <= 256 else None


def native_linears(layer: FusedLayer, int4: Int4Layer) -> tuple[tuple[PackedLinear, LayerLoRA], ...]:
    """The layer's int4 linears, each with its LoRA, in the order decode_layer.c takes them: qkv, o, gate_up, down."""
    return ((int4.qkv, layer.qkv_lora), (int4.o, layer.o_lora), (int4.gate_up, layer.gate_up_lora),
            (int4.down, layer.down_lora))


def native_linear(weight: PackedLinear, lora: LayerLoRA, held: list[torch.Tensor]) -> quant_kernels.Linear:
    """The C kernel's view of one fused linear: its packed weights and its LoRA's factors (bf16, members stacked)."""
    rank = native_lora_rank(lora)
    if rank is None:
        raise ValueError("the decode kernel needs one LoRA rank, at most 4 fused members and 256 LoRA columns")
    members = (quant_kernels.QWeight * quant_kernels.MEMBERS)(*weight.structs)
    if not rank:
        return quant_kernels.Linear(members, len(weight.members), quant_kernels.LoRA())
    # bf16: the factors are read once a pass (decode_layer.c); they only act on noisy rows, which never reach the
    # clean rows' logits
    a = torch.cat([a for a, _ in lora.factors]).bfloat16().contiguous()
    b = torch.cat([b for _, b in lora.factors]).bfloat16().t().contiguous()  # [rank, out]
    held += [a, b]  # the kernel reads them through raw pointers: the pass holds them
    ends = torch.tensor([member_b.shape[0] for _, member_b in lora.factors]).cumsum(0).tolist()
    return quant_kernels.Linear(
        members, len(weight.members),
        quant_kernels.LoRA(a.data_ptr(), b.data_ptr(), rank, len(ends), (ctypes.c_int64 * 4)(*ends)),
    )


def pointer_at(array: ctypes.Array, index: int) -> Any:
    """A pointer to `array[index]`, for a C function that takes the array from there on."""
    element = array._type_
    return ctypes.cast(ctypes.addressof(array) + index * ctypes.sizeof(element), ctypes.POINTER(element))
