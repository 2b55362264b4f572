"""The bundled model's linear layers as the shipped GGUF's own Q4_1 blocks, and its LM head as its Q8_0 ones, packed
for the decoding kernels (model/runtime/kernels/quant_matmul.c).

A decoding pass multiplies a few rows by every weight of the model, so it is bound by reading the weights: 270 MB in
bf16. The file we ship stores the layers as Q4_1 (each group of 32 weights of a row is `w = d * q + m`, a 4-bit `q`
and fp16 `d`, `m`: ~5 bits a weight) and the tied embedding as Q8_0 (`w = d * q`, an 8-bit `q`). The kernels read
exactly these values, re-laid out in tiles of 16 outputs: nothing is rounded again, and the teacher these passes
compute is the shipped file itself, multiplied with exact integer dot products as llama.cpp multiplies it, but on
finer activations: llama.cpp rounds each group of 32 to 8 bits, which made the greedy answers' perplexity 1.05x the
bf16 teacher's; the kernels add the remainder as a second 8-bit part, so an activation is off by at most 1/64516 of
its group's largest (quant_matmul.c), and the answers score as the bf16 teacher's do. A row's
output never depends on the other rows of the call (checked by `check_rows_independent` and
tests/unit/test_int4_weights.py, also for other CPUs' builds), so self-speculative decoding stays exact on these
weights.

What it costs: a lone row reads ~100 MB instead of 270 MB, and each extra row of a pass costs a few integer
instructions per 64 weights, so drafting passes stay cheap (scripts/bench/bench_lm.py --pass-costs). Prefills and
batched passes of several answers go through the same kernels, all answers' rows in the same calls
(`model.runtime.fast_pass`).

model/gguf/int4_file.py reads the blocks from the GGUF and keeps them packed in the cache (`cached_int4_weights`),
stamped with the layout's name (`LAYOUT`) and the file's size and time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from model.errors import ModelError
from model.process.threads import torch_threads
from model.runtime import quant_kernels
from model.runtime.packed import GROUP, Head, PackedLinear, PackedWeight

LAYOUT = "tiles16-groups32-quads-fp16-v3"  # the packed layout's name, in the cache file's stamp


@dataclass(frozen=True, slots=True)
class Q4Blocks:
    """One Q4_1 weight in HF's row order: `w[n, g*32 + j] = d[n, g] * q[n, g*32 + j] + m[n, g]`."""

    q: torch.Tensor  # [N, K] int32 in [0, 15]
    d: torch.Tensor  # [N, K / 32] float32 (fp16 values)
    m: torch.Tensor  # [N, K / 32] float32 (fp16 values)

    def dequantize(self) -> torch.Tensor:
        """The weight `[N, K]` in fp32, exactly as `gguf.quants.dequantize` (and transformers) computes it."""
        n, k = self.q.shape
        groups = self.q.view(n, k // GROUP, GROUP).float()
        return (groups * self.d[..., None] + self.m[..., None]).view(n, k)

    def rows(self, order: torch.Tensor) -> Q4Blocks:
        return Q4Blocks(self.q[order], self.d[order], self.m[order])

    @staticmethod
    def stack(parts: list[Q4Blocks]) -> Q4Blocks:
        """Weights of one input stacked along the output (q, k, v as one qkv)."""
        return Q4Blocks(
            torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), torch.cat([p.m for p in parts])
        )


class Int4Linear(PackedLinear):
    """`x @ w.T` for the Q4_1 weight `w` `[out_features, in_features]`, with the C kernel (model/runtime/kernels/
    quant_matmul.c says the layout): x in bf16 or fp32, the output in x's dtype (other dtypes: fp32)."""

    def __init__(self, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor, out_features: int) -> None:
        if not (nibbles.dtype == torch.uint8 and d.dtype == m.dtype == torch.float16
                and all(t.is_contiguous() and t.device.type == "cpu" for t in (nibbles, d, m))):
            raise ModelError("int4 weights need contiguous CPU uint8 nibbles and fp16 scales")
        in_features = int(nibbles.shape[1]) * GROUP
        fp16 = quant_kernels.SCALES_FP16
        super().__init__([PackedWeight(quant_kernels.PACK_NIBBLES, 0, fp16, nibbles, d, m, out_features, in_features)])

    @property
    def nibbles(self) -> torch.Tensor:  # [tiles, groups, 4, 16, 4] uint8
        return self.members[0].q

    @property
    def d(self) -> torch.Tensor:  # [tiles, groups, 16] fp16
        return self.members[0].d

    @property
    def m(self) -> torch.Tensor:  # [tiles, groups, 16] fp16
        m = self.members[0].m
        assert m is not None
        return m

    @classmethod
    def from_blocks(cls, blocks: Q4Blocks) -> Int4Linear:
        n, k = blocks.q.shape
        if k % GROUP:
            raise ModelError(f"int4 weights need inputs in groups of {GROUP}, this layer has {k}")
        packed = PackedWeight.nibbles(blocks.q, blocks.d, blocks.m)
        assert packed.m is not None
        return cls(packed.q, packed.d, packed.m, n)


class Q8Head(PackedLinear):
    """`x @ w.T` for a Q8_0 weight (the tied LM head) with the C kernel; fp32 logits. Rows from `coarse` on (of
    `x` flattened to rows) skip the activations' remainder (drafting mask rows: quant_matmul.c)."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, out_features: int) -> None:
        if not (q.dtype == torch.int8 and d.dtype == torch.float16
                and all(t.is_contiguous() and t.device.type == "cpu" for t in (q, d))):
            raise ModelError("a Q8_0 head needs contiguous CPU int8 values and fp16 scales")
        in_features = int(q.shape[1]) * GROUP
        fp16 = quant_kernels.SCALES_FP16
        weight = PackedWeight(quant_kernels.PACK_BYTES, 0, fp16, q, d, None, out_features, in_features)
        super().__init__([weight], logits=True)

    @property
    def q(self) -> torch.Tensor:  # [tiles, groups, 8, 16, 4] int8
        return self.members[0].q

    @property
    def d(self) -> torch.Tensor:  # [tiles, groups, 16] fp16
        return self.members[0].d

    @classmethod
    def from_q8_0(cls, q: torch.Tensor, d: torch.Tensor) -> Q8Head:
        """`q` `[N, K]` int8 values, `d` `[N, K / 32]` their groups' scales."""
        packed = PackedWeight.bytes(q, d)
        return cls(packed.q, packed.d, q.shape[0])


@dataclass(frozen=True)
class Int4Weights:
    """What a decoding pass multiplies by: every layer's linears, and the LM head when the file's is Q8_0."""

    layers: list[Int4Layer]
    head: Head | None

    def linears(self) -> list[PackedLinear]:
        """Every packed linear in the order a pass reads them: layer by layer qkv, o, gate_up and down, then the head
        when the kernels read it (not a dense head done row by row)."""
        body = [linear for layer in self.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return body + ([self.head] if isinstance(self.head, PackedLinear) else [])


@dataclass(frozen=True)
class Int4Layer:
    """One decoder layer's linears, fused as `model.runtime.fast_pass` runs them (q/k/v as one, gate/up as one)."""

    qkv: PackedLinear
    o: PackedLinear
    gate_up: PackedLinear
    down: PackedLinear

    @classmethod
    def from_blocks(cls, w: dict[str, Q4Blocks]) -> Int4Layer:
        """From one layer's Q4_1 blocks by HF's names (`q_proj` ... `down_proj`)."""
        return cls(
            qkv=Int4Linear.from_blocks(Q4Blocks.stack([w["q_proj"], w["k_proj"], w["v_proj"]])),
            o=Int4Linear.from_blocks(w["o_proj"]),
            gate_up=Int4Linear.from_blocks(Q4Blocks.stack([w["gate_proj"], w["up_proj"]])),
            down=Int4Linear.from_blocks(w["down_proj"]),
        )


def unpermute_order(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary permutation of q and k (as transformers' GGUF loader does)."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(rows)


def quantize_q4_1(weight: torch.Tensor) -> Q4Blocks:
    """Round a float weight `[N, K]` to Q4_1 as llama.cpp does (per group of 32: `d = (max - min) / 15`, `m = min`,
    both fp16): the weights `check_here` probes the kernel with, and tests' tiny models."""
    n, k = weight.shape
    if k % GROUP:
        raise ModelError(f"int4 weights need inputs in groups of {GROUP}, this layer has {k}")
    groups = weight.detach().float().view(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    d = ((high - low) / 15).half().float()
    m = low.half().float()
    safe = torch.where(d == 0, torch.ones_like(d), d)
    q = torch.round((groups - m[..., None]) / safe[..., None]).clamp(0, 15).to(torch.int32)
    return Q4Blocks(q.view(n, k), d, m)


def available() -> str | None:
    """None when the int4 kernels run here, else why not."""
    return quant_kernels.unavailable()


@functools.cache
def check_here(threads: int) -> str | None:
    """Whether the int4 kernel keeps a row's output independent of the rows beside it here, at `threads` torch
    threads, for the bundled model's shapes (random weights, ~0.1 s): None if it does, else what differed."""
    with torch_threads(threads):
        generator = torch.Generator().manual_seed(0)
        for out_features, in_features in ((960, 576), (3072, 576), (576, 1536)):
            weight = torch.randn(out_features, in_features, generator=generator) * 0.05
            if not check_rows_independent(Int4Linear.from_blocks(quantize_q4_1(weight)), in_features):
                return f"the int4 kernel ({in_features} -> {out_features}) rounds a row by the rows beside it"
    return None


def check_rows_independent(linear: Int4Linear, in_features: int, rows: int = 32, seed: int = 0) -> bool:
    """Whether each row's output is the same bits alone and among `1..rows` rows (random bf16 inputs)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    alone = torch.cat([linear(x[i : i + 1]) for i in range(rows)])
    return all(torch.equal(linear(x[:count]), alone[:count]) for count in (2, 3, 4, 8, 16, 17, rows))
