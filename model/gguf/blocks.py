"""A GGUF model's linear layers as the file's own blocks, packed for the decoding kernels without de-quantizing them
(model/runtime/packed.py), so that a user's model is multiplied by exactly the weights its file holds, at the cost
of reading them: about the file's size, not a bf16 copy's.

One table, `FORMATS`, maps a block type to how its blocks unpack into integer values and scales and into which
packing the kernels read them (as ggml's type traits map a type to its routines): a new format is one entry. The
K-quants' sub-block scales are the super-block's fp16 scale times a 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) integer:
both are kept as the file holds them (`SubScales`) and the kernel forms their products, exact in fp32. The values
keep the file's bits (4, 5, 6 or 8 a value: model/runtime/packed.py) and the scales about the file's ~0.5 bit a
weight (fp16 per 32 for the others, fp16 per 256 and a byte per sub-block for the K-quants). Types outside
the table (F16, BF16, F32 linears) are not read by the kernels: a model with any of them in its layers decodes with
the de-quantized bf16 weights (model/adapters/gguf_model.py), and a head of such a type is multiplied row by row in
bf16 (`RowByRowHead`).

Llama files store q and k rows in llama.cpp's rotary order; they are put back in transformers' order here (as
transformers' own GGUF loader does), so the packed weights compute the same network as the de-quantized modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf.quants import Q4_K

from model.errors import ModelError
from model.gguf.header import GGUFHeader, TensorInfo
from model.runtime import row_exact
from model.runtime.int4_weights import Int4Layer, Int4Weights, unpermute_order
from model.runtime.packed import PackedLinear, PackedWeight, SubScales, cat_present

# The GGUF's tensor names of one layer's linears, in the fused pass's groups (model/runtime/fast_pass.py)
FUSED = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
         "down": ("ffn_down",)}


@dataclass(frozen=True, slots=True)
class Unpacked:
    """A weight's blocks as integers: `w[n, 32 g + j] = d[n, g] * values[n, 32 g + j] (+ m[n, g])`; a K-quant's
    `d` and `m` are per super-block of 256 inputs and a group's scale (minimum) is that times `sub`'s integer (Q6_K:
    one per 16 inputs, no m)."""

    values: torch.Tensor  # [N, K] int16
    d: torch.Tensor  # [N, K / 32] fp32 holding fp16 values (K-quants: [N, K / 256])
    m: torch.Tensor | None  # as d
    sub: SubScales | None = None  # K-quants

    def rows(self, order: torch.Tensor) -> Unpacked:
        return Unpacked(self.values[order], self.d[order], None if self.m is None else self.m[order],
                        None if self.sub is None else self.sub.rows(order))

    @staticmethod
    def stacked(members: list[Unpacked]) -> Unpacked:
        """Weights of one format and input, one after another along the output."""
        subs = [w.sub for w in members if w.sub is not None]
        sub = SubScales(torch.cat([s.scale for s in subs]), cat_present([s.min for s in subs])) if subs else None
        return Unpacked(torch.cat([w.values for w in members]), torch.cat([w.d for w in members]),
                        cat_present([w.m for w in members]), sub)


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """One ggml block type: its elements and bytes per block, how they unpack, and how the kernels read them."""

    block: int
    block_bytes: int
    unpack: Callable[[np.ndarray], Unpacked]  # blocks [N, K / 32, block_bytes] uint8
    pack: Callable[[Unpacked], PackedWeight]


def _fp16(blocks: np.ndarray, at: int) -> torch.Tensor:
    return torch.from_numpy(blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block: element j in the low nibble of byte j, element j + 16 in its high one."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes a block (a little-endian uint32): bit j is element j's fifth bit."""
    bits = qh.copy().view(np.uint32)  # [N, blocks, 1]
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _values(blocks: np.ndarray, values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values.reshape(blocks.shape[0], -1).astype(np.int16))


def _q4_0(b: np.ndarray) -> Unpacked:
    return Unpacked(_values(b, _nibbles(b[..., 2:]).astype(np.int16) - 8), _fp16(b, 0), None)


def _q4_1(b: np.ndarray) -> Unpacked:
    return Unpacked(_values(b, _nibbles(b[..., 4:])), _fp16(b, 0), _fp16(b, 2))


def _q5_0(b: np.ndarray) -> Unpacked:
    five = _nibbles(b[..., 6:]) | (_fifth_bits(b[..., 2:6]) << 4)
    return Unpacked(_values(b, five.astype(np.int16) - 16), _fp16(b, 0), None)


def _q5_1(b: np.ndarray) -> Unpacked:
    five = _nibbles(b[..., 8:]) | (_fifth_bits(b[..., 4:8]) << 4)
    return Unpacked(_values(b, five), _fp16(b, 0), _fp16(b, 2))


def _q8_0(b: np.ndarray) -> Unpacked:
    return Unpacked(_values(b, b[..., 2:].copy().view(np.int8)), _fp16(b, 0), None)


def _super_scales(b: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, SubScales]:
    """Q4_K's and Q5_K's scales as the file holds them: d and minus dmin per super-block `[N, blocks]` (a group's
    minimum is `-dmin * min`), and the 6-bit scales and minimums `[N, blocks * 8]`."""
    rows = b.shape[0]
    scale, low = Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12))

    def integers(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.reshape(rows, -1).astype(np.int16))

    return _fp16(b, 0), -_fp16(b, 2), SubScales(integers(scale), integers(low))


def _q4_k(b: np.ndarray) -> Unpacked:
    """d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes: 4 chunks of 32 bytes, whose low nibbles are a
    sub-block and high nibbles the next."""
    quads = b[..., 16:].reshape(*b.shape[:2], 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    return Unpacked(_values(b, quads & 0xF), *_super_scales(b))


def _q5_k(b: np.ndarray) -> Unpacked:
    """Q4_K's layout with 32 bytes of fifth bits after the scales: bit i of byte j is sub-block i's element j's."""
    low = (b[..., 48:].reshape(*b.shape[:2], 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)) & 0xF
    high = (b[..., 16:48].reshape(*b.shape[:2], 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    return Unpacked(_values(b, low.reshape(*b.shape[:2], 8, 32) | (high << 4)), *_super_scales(b))


def _q6_k(b: np.ndarray) -> Unpacked:
    """128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 elements), fp16 d last."""
    rows, blocks = b.shape[:2]
    # in place where it can be: a head's temporaries stay at a byte a value
    low = b[..., :128].reshape(rows, blocks, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    low &= 0xF
    high = b[..., 128:192].reshape(rows, blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    high &= 3
    high <<= 4
    low = low.reshape(rows, -1)
    low |= high.reshape(rows, -1)
    del high
    values = torch.from_numpy(low).to(torch.int16)
    values -= 32
    scales = torch.from_numpy(b[..., 192:208].copy().view(np.int8).astype(np.int16)).reshape(rows, -1)
    return Unpacked(values, _fp16(b, 208), None, SubScales(scales, None))


def _as_nibbles(offset: int) -> Callable[[Unpacked], PackedWeight]:
    """Values in [-offset, 15 - offset] as the nibbles `value + offset`, the offset taken off in the kernel's sums."""
    return lambda u: PackedWeight.nibbles(u.values + offset, u.d, u.m, offset, u.sub)


def _as_bytes(u: Unpacked) -> PackedWeight:
    return PackedWeight.bytes(u.values, u.d, u.m, u.sub)


def _as_fives(offset: int) -> Callable[[Unpacked], PackedWeight]:
    """Values in [-offset, 31 - offset] at 5 bits, as `value + offset`, the offset taken off as the kernel unpacks."""
    return lambda u: PackedWeight.fives(u.values + offset, u.d, u.m, offset, u.sub)


def _as_sixes(u: Unpacked) -> PackedWeight:
    """Q6_K's values in [-32, 31] at 6 bits, as `value + 32`."""
    if u.sub is None:
        raise ModelError("6-bit packed weights are Q6_K's, with its sub-block scales")
    return PackedWeight.sixes(u.values + 32, u.d, u.sub, 32)


FORMATS: dict[str, BlockFormat] = {
    "Q4_0": BlockFormat(32, 18, _q4_0, _as_nibbles(8)),  # fp16 d, 16 bytes of nibbles; w = d (q - 8)
    "Q4_1": BlockFormat(32, 20, _q4_1, _as_nibbles(0)),  # fp16 d, m, 16 bytes of nibbles; w = d q + m
    "Q5_0": BlockFormat(32, 22, _q5_0, _as_fives(16)),  # fp16 d, 4 bytes of fifth bits, 16 of nibbles; d (q - 16)
    "Q5_1": BlockFormat(32, 24, _q5_1, _as_fives(0)),  # fp16 d, m, fifth bits, nibbles; w = d q + m
    "Q8_0": BlockFormat(32, 34, _q8_0, _as_bytes),  # fp16 d, 32 int8; w = d q
    "Q4_K": BlockFormat(256, 144, _q4_k, _as_nibbles(0)),  # values 0-15, sub-block scales and minimums
    "Q5_K": BlockFormat(256, 176, _q5_k, _as_fives(0)),  # values 0-31, at 5 bits
    "Q6_K": BlockFormat(256, 210, _q6_k, _as_sixes),  # -32-31, at 6 bits, a scale per 16
}


def raw_blocks(header: GGUFHeader, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes `[rows, row bytes]`, memory-mapped from the file (read only as they are packed)."""
    rows = int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
    return np.memmap(header.path, dtype=np.uint8, mode="r", offset=header.data_start + info.offset,
                     shape=(rows, info.size // rows))


def unpacked(header: GGUFHeader, info: TensorInfo, rows: slice = slice(None)) -> Unpacked:
    """A tensor of a `FORMATS` type (its `rows`) as integers and scales, in the file's row order."""
    block = FORMATS[info.type_name]
    raw = raw_blocks(header, info)[rows]
    return block.unpack(np.asarray(raw).reshape(raw.shape[0], -1, block.block_bytes))


# Rows of a large tensor (a head of 150k rows) unpacked and packed at a time: the integers take 2 bytes a value and the
# packing's temporaries as much again, so a whole 1.5B model's Q6_K head at once peaked at 1.8 GB over its 195 MB
PACK_ROWS = 8192


def packed(header: GGUFHeader, info: TensorInfo) -> PackedWeight:
    """A tensor of a `FORMATS` type in the kernels' layout, `PACK_ROWS` rows at a time (the same tensors as at
    once: the layout is tile after tile)."""
    block, count = FORMATS[info.type_name], raw_blocks(header, info).shape[0]
    parts = [block.pack(unpacked(header, info, slice(start, start + PACK_ROWS)))
             for start in range(0, count, PACK_ROWS)]
    return parts[0] if len(parts) == 1 else PackedWeight.joined(parts)



def unreadable(header: GGUFHeader) -> list[str]:
    """The layers' linear weights whose type the kernels do not read ("blk.0.ffn_down.weight Q4_K"): none, and
    the model decodes on its own blocks."""
    names = [f"blk.{i}.{part}.weight" for i in range(header.layers) for parts in FUSED.values() for part in parts]
    found = {t.name: t for t in header.tensors}
    return [f"{n} {found[n].type_name if n in found else 'missing'}" for n in names
            if n not in found or found[n].type_name not in FORMATS]


def _unpacked_weight(header: GGUFHeader, name: str, heads: int | None) -> tuple[str, Unpacked]:
    info = header.tensor(name)
    weight = unpacked(header, info)
    if heads is not None:  # llama.cpp's rotary order of q and k rows, undone
        weight = weight.rows(unpermute_order(weight.values.shape[0], heads))
    return info.type_name, weight


def rotary_permuted(header: GGUFHeader) -> dict[str, int]:
    """The linears whose rows llama.cpp's converter put in its rotary order (llama's q and k), with their heads."""
    return {"attn_q": header.heads, "attn_k": header.kv_heads} if header.architecture == "llama" else {}


def _linear(header: GGUFHeader, layer: int, parts: tuple[str, ...]) -> PackedLinear:
    """One fused linear: its members stacked into one weight when they share a format (one pass over the tiles),
    side by side otherwise (a "Q4_K_M"-style mix)."""
    heads = rotary_permuted(header)
    weights = [_unpacked_weight(header, f"blk.{layer}.{part}.weight", heads.get(part)) for part in parts]
    kinds = {kind for kind, _ in weights}
    if len(kinds) == 1:
        return PackedLinear([FORMATS[kinds.pop()].pack(Unpacked.stacked([w for _, w in weights]))])
    return PackedLinear([FORMATS[kind].pack(w) for kind, w in weights])


class RowByRowHead:
    """An LM head the kernels do not read (Q6_K, F16...): the de-quantized `weight` `[V, hidden]` in bf16, each row
    multiplied alone (`row_exact.linear`), so that a row's logits do not depend on the rows beside it; fp32 logits.
    It reads the head once per row: a pass of several answers pays for each."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])

    def __call__(self, x: torch.Tensor, coarse: int | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.weight.dtype)
        rows = [row_exact.linear(flat[i : i + 1], self.weight).float() for i in range(flat.shape[0])]
        out = torch.cat(rows) if rows else torch.empty(0, self.out_features)
        return out.view(*x.shape[:-1], self.out_features)


def gguf_weights(header: GGUFHeader, dense_head: torch.Tensor) -> Int4Weights:
    """Every layer's linears as the file's own blocks (`unreadable` must be empty), fused as the fused pass runs
    them, and the head: its own blocks when the kernels read them, else `dense_head` row by row."""
    layers = [Int4Layer(*(_linear(header, i, parts) for parts in FUSED.values())) for i in range(header.layers)]
    name = "token_embd.weight" if header.tied_head else "output.weight"
    info = header.tensor(name)
    if info.type_name in FORMATS:
        head: PackedLinear | RowByRowHead = PackedLinear([packed(header, info)], logits=True)
    else:
        head = RowByRowHead(dense_head)
    return Int4Weights(layers, head)
