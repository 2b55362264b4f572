"""Weights in the decoding kernels' tiled layout (model/runtime/kernels/quant_matmul.c), and the linear layer that
multiplies by them: one or more weights of one input side by side (q, k and v as one qkv), each in its own block
format, as a "Q4_K_M" file mixes them.

Three packings hold every format the kernels read: 4-bit values two to a byte (Q4_1, Q4_K, and Q4_0 with its offset
of 8 taken off in the integer sums), one signed byte a value (Q8_0), and 5- and 6-bit values at their bits (Q5_0,
Q5_1, Q5_K; Q6_K: the nibbles and planes of fifth and sixth bits, which the kernel unpacks in registers to the bytes
it multiplies: their values would overflow the nibble kernel's 16-bit sums). Scales are the
file's fp16 ones, or for the K-quants the exact fp32 products of a super-block's scale and its sub-blocks' integers
(one a group of 32; Q6_K one per 16 inputs). The values are the file's own, re-laid out: nothing is rounded again.
model/gguf/blocks.py maps a GGUF block type to its packing; model/runtime/int4_weights.py packs the
bundled model's Q4_1 and Q8_0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from model.errors import ModelError
from model.runtime import quant_kernels

GROUP = 32  # inputs a block's scale covers, and the kernel's group size
TILE = 16  # outputs the kernel computes together


def tiles(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` `[N, ...]` zero-padded to whole tiles of outputs, `[tiles, TILE, ...]`."""
    count = -(-n // TILE)
    padded = torch.zeros((count * TILE, *t.shape[1:]), dtype=t.dtype)
    padded[:n] = t
    return padded.view(count, TILE, *t.shape[1:])


def per_tile(scales: torch.Tensor, n: int, kind: int = quant_kernels.SCALES_FP16) -> torch.Tensor:
    """Per-group scales `[N, K / 32]` as `[tiles, groups, 16]`: fp16 (values the file holds as fp16, unrounded) or
    fp32; for SCALES_FP32_HALVES, per 16 inputs `[N, K / 16]` as `[tiles, groups, 2, 16]` fp32."""
    if kind == quant_kernels.SCALES_FP32_HALVES:
        halves = tiles(scales.float().reshape(scales.shape[0], -1, 2), n)  # [tiles, 16, groups, 2]
        return halves.permute(0, 2, 3, 1).contiguous()
    if kind == quant_kernels.SCALES_FP32:
        return tiles(scales.float(), n).permute(0, 2, 1).contiguous()
    half = scales.half()
    if not torch.equal(half.float(), scales.float()):
        raise ModelError("packed weights' fp16 scales must be fp16 values, as a GGUF stores them")
    return tiles(half, n).permute(0, 2, 1).contiguous()


@dataclass(frozen=True)
class PackedWeight:
    """One weight `[n, k]` as the kernel reads it: `w = d * (q - offset) (+ m)` per group of 32 inputs."""

    packing: int  # quant_kernels.PACK_NIBBLES, PACK_BYTES, PACK_FIVES or PACK_SIXES
    offset: int
    scales: int  # quant_kernels.SCALES_FP16, SCALES_FP32 or SCALES_FP32_HALVES (d and m: fp16 or fp32)
    q: torch.Tensor  # nibbles [tiles, groups, 4, 16, 4] uint8, bytes [tiles, groups, 8, 16, 4] int8, or fives
    # [tiles, groups, 320] uint8 (sixes 384)
    d: torch.Tensor  # [tiles, groups, 16] (or [tiles, groups, 2, 16] for halves)
    m: torch.Tensor | None  # as d, or None
    n: int
    k: int

    @classmethod
    def nibbles(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int = 0,
                scales: int = quant_kernels.SCALES_FP16) -> PackedWeight:
        """4-bit `values` `[N, K]` in [0, 15] with their groups' scales `[N, K / 32]` (and minimums)."""
        n, k = _check_shape(values)
        q = tiles(values, n).view(-1, TILE, k // GROUP, GROUP).permute(0, 2, 3, 1)  # [tiles, groups, 32, 16]

        def quads(half: torch.Tensor) -> torch.Tensor:  # inputs 4 i + c: [tiles, groups, i, output, c]
            return half.reshape(*half.shape[:2], 4, 4, TILE).permute(0, 1, 2, 4, 3)

        low, high = quads(q[:, :, : GROUP // 2]), quads(q[:, :, GROUP // 2 :])
        nibbles = (low | (high << 4)).to(torch.uint8).contiguous()
        return cls(quant_kernels.PACK_NIBBLES, offset, scales, nibbles, per_tile(d, n, scales),
                   None if m is None else per_tile(m, n, scales), n, k)

    @classmethod
    def bytes(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None,
              scales: int = quant_kernels.SCALES_FP16) -> PackedWeight:
        """Values `[N, K]` in [-127, 127] with their groups' scales `[N, K / 32]` (or halves' `[N, K / 16]`) and
        minimums."""
        n, k = _check_shape(values)
        tiled = tiles(values.to(torch.int8), n).view(-1, TILE, k // GROUP, GROUP // 4, 4).permute(0, 2, 3, 1, 4)
        return cls(quant_kernels.PACK_BYTES, 0, scales, tiled.contiguous(), per_tile(d, n, scales),
                   None if m is None else per_tile(m, n, scales), n, k)

    @classmethod
    def fives(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int = 0,
              scales: int = quant_kernels.SCALES_FP16) -> PackedWeight:
        """5-bit `values` `[N, K]` in [0, 31] (the weight `d * (value - offset) (+ m)`) at 5 bits each: a group's
        bytes as `bytes` lays them out, [quad i][position j] (j = 4 output + c), as nibbles and a plane of fifth bits,
        `[tiles, groups, 320]`: byte 64 i + j holds quad i's nibble low and quad i + 4's high (the `nibbles` layout),
        and byte 256 + j quad i's fifth bit as its bit i (ggml's qh, re-laid out: the kernel unpacks them to bytes)."""
        return cls._planes(values, d, m, offset, scales, 5)

    @classmethod
    def sixes(cls, values: torch.Tensor, d: torch.Tensor, offset: int = 0,
              scales: int = quant_kernels.SCALES_FP32_HALVES) -> PackedWeight:
        """6-bit `values` in [0, 63] (Q6_K's, with its scale per 16 inputs) at 6 bits: `fives`' layout and a plane of
        sixth bits after it, byte 320 + j, `[tiles, groups, 384]`."""
        return cls._planes(values, d, None, offset, scales, 6)

    @classmethod
    def _planes(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int, scales: int,
                bits: int) -> PackedWeight:
        n, k = _check_shape(values)
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= 1 << bits):
            raise ModelError(f"{bits}-bit packed values must be in [0, {(1 << bits) - 1}]")
        q = tiles(values.to(torch.int32), n).view(-1, TILE, k // GROUP, GROUP // 4, 4).permute(0, 2, 3, 1, 4)
        q = q.reshape(q.shape[0], q.shape[1], 8, 4 * TILE)  # [tiles, groups, quad, 64]
        nibbles = (q[:, :, :4] & 15) | ((q[:, :, 4:] & 15) << 4)
        quad = torch.arange(8, dtype=torch.int32).view(1, 1, 8, 1)
        planes = [(((q >> bit) & 1) << quad).sum(dim=2) for bit in range(4, bits)]
        packed = torch.cat([nibbles.flatten(2), *planes], dim=2).to(torch.uint8).contiguous()
        packing = quant_kernels.PACK_FIVES if bits == 5 else quant_kernels.PACK_SIXES
        return cls(packing, offset, scales, packed, per_tile(d, n, scales),
                   None if m is None else per_tile(m, n, scales), n, k)

    def struct(self) -> quant_kernels.QWeight:
        """The C kernel's view (raw pointers into these tensors: keep this weight alive while it is used)."""
        return quant_kernels.QWeight(
            self.packing, self.offset, self.scales, self.q.data_ptr(), self.d.data_ptr(),
            None if self.m is None else self.m.data_ptr(), self.n, self.k,
        )


def _check_shape(values: torch.Tensor) -> tuple[int, int]:
    n, k = values.shape
    if k % GROUP:
        raise ModelError(f"packed weights need inputs in groups of {GROUP}, this one has {k}")
    return int(n), int(k)


class Head(Protocol):
    """An LM head of a decoding pass: fp32 logits of rows `x`; rows from `coarse` on may be computed coarser."""

    def __call__(self, x: torch.Tensor, coarse: int | None = None) -> torch.Tensor: ...


class PackedLinear:
    """`x @ w.T` for `w` the members stacked along the output (each member's outputs side by side), with the C
    kernel: x in bf16 or fp32; the output in x's dtype (other dtypes: fp32), or fp32 always for `logits`. Rows from
    `coarse` on (of `x` flattened to rows) skip the activations' remainder (drafting rows: quant_matmul.c)."""

    def __init__(self, members: list[PackedWeight], logits: bool = False) -> None:
        if not 1 <= len(members) <= quant_kernels.MEMBERS or len({m.k for m in members}) != 1:
            raise ModelError(f"a packed linear takes 1-{quant_kernels.MEMBERS} weights of one input")
        self.members = members
        self.logits = logits
        self.in_features = members[0].k
        self.out_features = sum(m.n for m in members)
        self.structs = (quant_kernels.QWeight * quant_kernels.MEMBERS)(*(m.struct() for m in members))

    def __call__(self, x: torch.Tensor, coarse: int | None = None) -> torch.Tensor:
        if x.device.type != "cpu" or x.shape[-1] != self.in_features:
            raise ModelError(f"packed kernels take CPU rows of {self.in_features}, not {tuple(x.shape)} on {x.device}")
        flat = x.reshape(-1, self.in_features)
        if flat.dtype not in (torch.bfloat16, torch.float32):
            flat = flat.float()
        flat = flat.contiguous()
        rows = flat.shape[0]
        dtype = torch.float32 if self.logits else flat.dtype
        out = torch.empty(rows, self.out_features, dtype=dtype)
        status = quant_kernels.library().weight_matmul(
            flat.data_ptr(), flat.dtype == torch.bfloat16, rows, rows if coarse is None else coarse,
            self.structs, len(self.members), out.data_ptr(), dtype == torch.bfloat16, torch.get_num_threads(),
        )
        if status:
            raise MemoryError("the packed kernel could not allocate its buffers")
        return out.view(*x.shape[:-1], self.out_features)

    def bytes_held(self) -> int:
        return sum(t.numel() * t.element_size() for m in self.members for t in (m.q, m.d, m.m) if t is not None)
