"""Weights in the decoding kernels' tiled layout (model/runtime/kernels/quant_matmul.c), and the linear layer that
multiplies by them: one or more weights of one input side by side (q, k and v as one qkv), each in its own block
format, as a "Q4_K_M" file mixes them.

Three packings hold every format the kernels read: 4-bit values two to a byte (Q4_1, Q4_K, and Q4_0 with its offset
of 8 taken off in the integer sums), one signed byte a value (Q8_0), and 5- and 6-bit values at their bits (Q5_0,
Q5_1, Q5_K; Q6_K: the nibbles and planes of fifth and sixth bits, which the kernel unpacks in registers to the bytes
it multiplies: their values would overflow the nibble kernel's 16-bit sums). Scales are the
file's fp16 ones, per group of 32; the K-quants keep theirs as the file does too (`SubScales`): a super-block's fp16
scale (and minimum) per 256 inputs and its sub-blocks' small integers, whose products the kernel forms exactly, so
that a K-quant costs about its file's bits a weight. The values and scales are the file's own, re-laid out: nothing is
rounded again. model/gguf/blocks.py maps a GGUF block type to its packing; model/runtime/int4_weights.py packs the
bundled model's Q4_1 and Q8_0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from model.errors import ModelError
from model.runtime import quant_kernels

GROUP = 32  # inputs a block's scale covers, and the kernel's group size
TILE = 16  # outputs the kernel computes together
SUPER = 256  # inputs of a K-quant's super-block: its fp16 scale (and minimum) covers 8 groups


def cat_present(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The parts of an optional tensor (minimums, sub-scales) one after another: None when the first has none."""
    return None if parts[0] is None else torch.cat([p for p in parts if p is not None])


def tiles(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` `[N, ...]` zero-padded to whole tiles of outputs, `[tiles, TILE, ...]`."""
    count = -(-n // TILE)
    padded = torch.zeros((count * TILE, *t.shape[1:]), dtype=t.dtype)
    padded[:n] = t
    return padded.view(count, TILE, *t.shape[1:])


def per_tile(scales: torch.Tensor, n: int) -> torch.Tensor:
    """fp16 scales `[N, G]` (per group of 32, or per K-quant super-block) as `[tiles, G, 16]`: values the file holds
    as fp16, unrounded."""
    half = scales.half()
    if not torch.equal(half.float(), scales.float()):
        raise ModelError("packed weights' fp16 scales must be fp16 values, as a GGUF stores them")
    return tiles(half, n).permute(0, 2, 1).contiguous()


@dataclass(frozen=True, slots=True)
class SubScales:
    """A K-quant's sub-block scales as its file's integers, under the super-blocks' fp16 `d` (and minimum `m`) of
    its weight: a group's scale is `d * scale` (and its minimum `m * min`), which the kernel forms, exact in fp32 (11
    bits times at most 8). Q4_K, Q5_K: a 6-bit scale and minimum per 32 inputs; Q6_K: an int8 scale per 16 inputs
    (halves, no minimum)."""

    scale: torch.Tensor  # [N, K / 32] integers in [0, 63], or [N, K / 16] in [-128, 127] for halves
    min: torch.Tensor | None  # [N, K / 32] in [0, 63]; None: halves

    @property
    def kind(self) -> int:
        return quant_kernels.SCALES_K_HALVES if self.min is None else quant_kernels.SCALES_K

    def rows(self, order: torch.Tensor) -> SubScales:
        return SubScales(self.scale[order], None if self.min is None else self.min[order])

    def per_tile(self, n: int) -> torch.Tensor:
        """`[tiles, groups, 2, 16]` int8: per group the 16 outputs' scales then minimums (halves: the scales of
        inputs 0-15 then of 16-31), the kernel's `sub`."""
        pairs = (self.scale.reshape(self.scale.shape[0], -1, 2) if self.min is None
                 else torch.stack([self.scale, self.min], dim=-1))  # [N, groups, 2]
        if pairs.numel() and (int(pairs.min()) < -128 or int(pairs.max()) > 127):
            raise ModelError("a K-quant's sub-block scales must be 8-bit integers")
        return tiles(pairs.to(torch.int8), n).permute(0, 2, 3, 1).contiguous()


def _scales(d: torch.Tensor, m: torch.Tensor | None, sub: SubScales | None, n: int, k: int,
            ) -> tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(scales kind, d, m, sub) in the kernel's layout: fp16 per group `[N, K / 32]`, or with `sub` the
    super-blocks' `[N, K / 256]` and the sub-blocks' integers."""
    if sub is None:
        return quant_kernels.SCALES_FP16, per_tile(d, n), None if m is None else per_tile(m, n), None
    groups = k // GROUP
    scale_groups = groups * 2 if sub.min is None else groups
    if (k % SUPER or d.shape[1] != k // SUPER or (m is None) != (sub.min is None)
            or (m is not None and m.shape[1] != k // SUPER) or sub.scale.shape[1] != scale_groups
            or (sub.min is not None and sub.min.shape[1] != groups)):
        raise ModelError("a K-quant needs whole super-blocks of 256 inputs, a d (and m) per super-block and its "
                         "sub-blocks' integers")
    return sub.kind, per_tile(d, n), None if m is None else per_tile(m, n), sub.per_tile(n)


@dataclass(frozen=True)
class PackedWeight:
    """One weight `[n, k]` as the kernel reads it: `w = d * (q - offset) (+ m)` per group of 32 inputs (K-quants:
    per group `d * sub scale` and `m * sub min`, or per 16 inputs for halves)."""

    packing: int  # quant_kernels.PACK_NIBBLES, PACK_BYTES, PACK_FIVES or PACK_SIXES
    offset: int
    scales: int  # quant_kernels.SCALES_FP16, SCALES_K or SCALES_K_HALVES
    q: torch.Tensor  # nibbles [tiles, groups, 4, 16, 4] uint8, bytes [tiles, groups, 8, 16, 4] int8, or fives
    # [tiles, groups, 320] uint8 (sixes 384)
    d: torch.Tensor  # [tiles, groups, 16] fp16 (K-quants: [tiles, super-blocks, 16])
    m: torch.Tensor | None  # as d, or None
    n: int
    k: int
    sub: torch.Tensor | None = None  # K-quants: [tiles, groups, 2, 16] int8 (SubScales.per_tile)

    @classmethod
    def nibbles(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int = 0,
                sub: SubScales | None = None) -> PackedWeight:
        """4-bit `values` `[N, K]` in [0, 15] with their groups' scales `[N, K / 32]` (and minimums), or a K-quant's
        super-blocks' `[N, K / 256]` and `sub`."""
        n, k = _check_shape(values)
        q = tiles(values, n).view(-1, TILE, k // GROUP, GROUP).permute(0, 2, 3, 1)  # [tiles, groups, 32, 16]

        def quads(half: torch.Tensor) -> torch.Tensor:  # inputs 4 i + c: [tiles, groups, i, output, c]
            return half.reshape(*half.shape[:2], 4, 4, TILE).permute(0, 1, 2, 4, 3)

        low, high = quads(q[:, :, : GROUP // 2]), quads(q[:, :, GROUP // 2 :])
        nibbles = (low | (high << 4)).to(torch.uint8).contiguous()
        kind, d, m, tiled_sub = _scales(d, m, sub, n, k)
        return cls(quant_kernels.PACK_NIBBLES, offset, kind, nibbles, d, m, n, k, tiled_sub)

    @classmethod
    def bytes(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None,
              sub: SubScales | None = None) -> PackedWeight:
        """Values `[N, K]` in [-127, 127] with their groups' scales `[N, K / 32]` and minimums (or a K-quant's, as
        `nibbles`)."""
        n, k = _check_shape(values)
        tiled = tiles(values.to(torch.int8), n).view(-1, TILE, k // GROUP, GROUP // 4, 4).permute(0, 2, 3, 1, 4)
        kind, d, m, tiled_sub = _scales(d, m, sub, n, k)
        return cls(quant_kernels.PACK_BYTES, 0, kind, tiled.contiguous(), d, m, n, k, tiled_sub)

    @classmethod
    def fives(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int = 0,
              sub: SubScales | None = None) -> PackedWeight:
        """5-bit `values` `[N, K]` in [0, 31] (the weight `d * (value - offset) (+ m)`) at 5 bits each: a group's
        bytes as `bytes` lays them out, [quad i][position j] (j = 4 output + c), as nibbles and a plane of fifth bits,
        `[tiles, groups, 320]`: byte 64 i + j holds quad i's nibble low and quad i + 4's high (the `nibbles` layout),
        and byte 256 + j quad i's fifth bit as its bit i (ggml's qh, re-laid out: the kernel unpacks them to bytes)."""
        return cls._planes(values, d, m, offset, sub, 5)

    @classmethod
    def sixes(cls, values: torch.Tensor, d: torch.Tensor, sub: SubScales, offset: int = 0) -> PackedWeight:
        """6-bit `values` in [0, 63] (Q6_K's: its super-blocks' `d` `[N, K / 256]` and a scale per 16 inputs in
        `sub`) at 6 bits: `fives`' layout and a plane of sixth bits after it, byte 320 + j, `[tiles, groups, 384]`."""
        return cls._planes(values, d, None, offset, sub, 6)

    @classmethod
    def _planes(cls, values: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, offset: int,
                sub: SubScales | None, bits: int) -> PackedWeight:
        n, k = _check_shape(values)
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= 1 << bits):
            raise ModelError(f"{bits}-bit packed values must be in [0, {(1 << bits) - 1}]")
        # a byte a value throughout: a large head's temporaries stay near its own size
        q = tiles(values.to(torch.uint8), n).view(-1, TILE, k // GROUP, GROUP // 4, 4).permute(0, 2, 3, 1, 4)
        q = q.reshape(q.shape[0], q.shape[1], 8, 4 * TILE)  # [tiles, groups, quad, 64]
        packed = torch.empty(q.shape[0], q.shape[1], 256 + 64 * (bits - 4), dtype=torch.uint8)
        packed[..., :256] = ((q[:, :, :4] & 15) | ((q[:, :, 4:] & 15) << 4)).flatten(2)
        for plane, bit in enumerate(range(4, bits)):
            bits_of = packed[..., 256 + 64 * plane : 320 + 64 * plane]
            bits_of.zero_()
            for quad in range(8):
                bits_of |= ((q[:, :, quad] >> bit) & 1) << quad
        packing = quant_kernels.PACK_FIVES if bits == 5 else quant_kernels.PACK_SIXES
        kind, d, m, tiled_sub = _scales(d, m, sub, n, k)
        return cls(packing, offset, kind, packed, d, m, n, k, tiled_sub)

    @classmethod
    def joined(cls, parts: list[PackedWeight]) -> PackedWeight:
        """One weight of `parts` packed from consecutive rows of it (each but the last a whole number of tiles): the
        kernel's layout is tile after tile, so their tensors follow one another."""
        first = parts[0]
        if any(p.n % TILE for p in parts[:-1]) or any(
            (p.packing, p.offset, p.scales, p.k) != (first.packing, first.offset, first.scales, first.k) for p in parts
        ):
            raise ModelError("joined weights are one format's consecutive whole tiles")
        q = torch.cat([p.q for p in parts])
        return cls(first.packing, first.offset, first.scales, q, torch.cat([p.d for p in parts]),
                   cat_present([p.m for p in parts]), sum(p.n for p in parts), first.k,
                   cat_present([p.sub for p in parts]))

    def struct(self) -> quant_kernels.QWeight:
        """The C kernel's view (raw pointers into these tensors: keep this weight alive while it is used)."""
        return quant_kernels.QWeight(
            self.packing, self.offset, self.scales, self.q.data_ptr(), self.d.data_ptr(),
            None if self.m is None else self.m.data_ptr(), None if self.sub is None else self.sub.data_ptr(),
            self.n, self.k,
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

    def tensors(self) -> list[torch.Tensor]:
        """What the kernel reads, member by member: values, scales, minimums, sub-block integers."""
        return [t for m in self.members for t in (m.q, m.d, m.m, m.sub) if t is not None]

    def move(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Hold each tensor as `place` copies it (the same values elsewhere: model/runtime/huge_pages.py); the C
        structs then point at the copies. Structs taken before (`structs`) still point at the old tensors."""

        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else place(t)

        self.members = [
            dataclasses.replace(m, q=place(m.q), d=place(m.d), m=moved(m.m), sub=moved(m.sub)) for m in self.members
        ]
        self.structs = (quant_kernels.QWeight * quant_kernels.MEMBERS)(*(m.struct() for m in self.members))

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
        return sum(t.numel() * t.element_size() for m in self.members for t in (m.q, m.d, m.m, m.sub)
                   if t is not None)
