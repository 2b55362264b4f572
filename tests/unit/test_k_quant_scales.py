"""The K-quants (Q4_K, Q5_K, Q6_K) in the kernels at their file's size (model/gguf/blocks.py, quant_matmul.c): the
sub-block scales kept as the file's integers under the super-blocks' fp16 `d` and `dmin`, multiplied in the kernel.

Those products are exact in fp32 (an 11-bit fp16 mantissa times a 6- or 8-bit integer), so the kernel must give
the very bits of the same computation on fp32 group scales. The reference here does that computation in numpy, in
the kernel's order of fp32 operations (quant_matmul.c's header): the activations' 8-bit hi alone on every row (a
K-quant's rule: llama.cpp's own q8_K is coarser still), exact integer sums, then per group
`acc = fma(d * sc, dot * scale, acc)` and `acc = fma(-dmin * min, unit * sum(hi), acc)`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import Q4_K
from kernel_sweep import rows_and_coarse

from model.gguf.blocks import FORMATS
from model.runtime.int4_weights import available
from model.runtime.packed import GROUP, SUPER, TILE, PackedLinear

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

F32 = np.float32
D_AT = {"Q4_K": 0, "Q5_K": 0, "Q6_K": 208}  # where a super-block's fp16 d lies (Q4_K and Q5_K: dmin after it)


def random_k_blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random bytes as `kind`'s blocks `[n, k / 256, bytes]`, each super-block with its own fp16 d (and dmin), of
    both signs for Q6_K's d, so that a wrong super-block or sub-block scale shows."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // SUPER, FORMATS[kind].block_bytes), dtype=np.uint8)
    count = 1 if kind == "Q6_K" else 2  # d (and dmin)
    scales = rng.uniform(2e-4, 2e-3, size=(n, k // SUPER, count))
    if kind == "Q6_K":
        scales *= rng.choice([-1.0, 1.0], size=scales.shape)
    blocks[..., D_AT[kind] : D_AT[kind] + 2 * count] = scales.astype(np.float16).view(np.uint8)
    return blocks


def group_scales(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The groups' fp32 scales from the file's bytes, `d * sc` per 32 inputs (Q6_K: per 16) and `-dmin * min`
    (exact products, as the kernel forms them)."""
    n, supers = blocks.shape[:2]
    at = D_AT[kind]
    d = blocks[..., at : at + 2].copy().view(np.float16).astype(F32)  # [n, supers, 1]
    if kind == "Q6_K":
        sc = blocks[..., 192:208].copy().view(np.int8).astype(F32)
        return (d * sc).reshape(n, -1), None
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(F32)
    sc, mn = Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
    sc, mn = sc.reshape(n, supers, 8).astype(F32), mn.reshape(n, supers, 8).astype(F32)
    return (d * sc).reshape(n, -1), (-(dmin * mn)).reshape(n, -1)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 `a * b + c` rounded once, as a fused multiply-add: the product is exact in float64 and the sum's
    rounding there is made round-to-odd (TwoSum's error says which way), which the one rounding to fp32 then
    cannot double-round."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = np.broadcast_to(c, p.shape).astype(np.float64)
    s = p + c64
    v = s - p
    error = (p - (s - v)) + (c64 - v)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((error != 0) & even, np.nextafter(s, np.where(error > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def kernel_reference(x: np.ndarray, values: np.ndarray, d: np.ndarray, m: np.ndarray | None,
                     coarse: int) -> np.ndarray:
    """What the kernel computes for rows `x` `[rows, k]` fp32 and weights `values` `[n, k]` (q - offset) with fp32
    scales `d` per 32 inputs or per 16 (halves) and minimums `m` per 32, rows from `coarse` on without the remainder
    (their minimum term on the rounded activations' sum)."""
    rows, k = x.shape
    groups = k // GROUP
    g = x.reshape(rows, groups, GROUP).astype(F32)
    top = np.abs(g).max(-1, keepdims=True)
    unit = top / F32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(top > 0, F32(127) / top, F32(0)).astype(F32)
    hi = np.rint(g * inv)
    lo = np.clip(np.rint(((g - hi * unit) * inv) * F32(254)), -127, 127)
    lo[coarse:] = 0
    scale = (unit / F32(254))[..., 0]  # [rows, groups]
    total = g[..., :16] + g[..., 16:]
    for width in (8, 4, 2):  # the kernels' reduction tree
        total = total[..., :width] + total[..., width:]
    total = total[..., 0] + total[..., 1]
    total[coarse:] = (hi.sum(-1).astype(F32) * unit[..., 0])[coarse:]
    parts = d.shape[1] // groups  # 1, or 2 for halves
    words = (254 * hi.astype(np.int64) + lo.astype(np.int64)).reshape(rows, groups, parts, -1)
    weights = values.astype(np.int64).reshape(values.shape[0], groups, parts, -1)
    dots = np.einsum("rgpi,ngpi->rngp", words, weights).astype(F32)  # exact sums, rounded once
    acc = np.zeros((rows, values.shape[0]), dtype=F32)
    for group in range(groups):
        for part in range(parts):
            acc = fma32(d[None, :, group * parts + part], dots[:, :, group, part] * scale[:, group, None], acc)
        if m is not None:
            acc = fma32(m[None, :, group], total[:, group, None], acc)
    return acc


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_give_the_bits_of_their_exact_fp32_group_scales(kind: str) -> None:
    """A partial tile, three super-blocks, 1-9 rows, drafting rows and 1-2 threads: the kernel's bits are the
    reference's on the exact fp32 products of the file's scales, every row from hi alone whatever rows the caller
    calls drafting."""
    n, k = 3 * TILE + 5, 3 * SUPER
    blocks = random_k_blocks(kind, n, k, seed=len(kind) + ord(kind[1]))
    weight = FORMATS[kind].unpack(blocks)
    linear = PackedLinear([FORMATS[kind].pack(weight)], logits=True)
    d, m = group_scales(kind, blocks)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(7))
    x[:, ::GROUP] *= 30.0
    x[3, :GROUP] = 0.0  # a group of zeros
    for rows, coarse in rows_and_coarse():
        expected = kernel_reference(x[:rows].numpy(), weight.values.numpy(), d, m, coarse=0)
        assert torch.equal(linear(x[:rows], coarse=coarse), torch.from_numpy(expected)), (rows, coarse)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_take_about_their_files_bits_a_weight(kind: str) -> None:
    """Packed, a K-quant weight holds its values at their bits and its scales at about the file's size: within 0.3
    bit a weight of the file's (4.5 Q4_K, 5.5 Q5_K, 6.5625 Q6_K)."""
    n, k = 2 * TILE, 4 * SUPER
    linear = PackedLinear([FORMATS[kind].pack(FORMATS[kind].unpack(random_k_blocks(kind, n, k, seed=3)))])
    file_bits = FORMATS[kind].block_bytes * 8 / SUPER
    assert linear.bytes_held() * 8 / (n * k) <= file_bits + 0.3
