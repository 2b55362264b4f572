"""Kernels whose output for a row does not depend on the other rows of its pass, on every CPU we measured.

Self-speculative decoding is exact only if the teacher's logits for a token are the same bits whether the token is
an autoregressive step's lone row or one of the clean rows of a drafting pass (and its keys the same bits in the cache).
CPU kernels choose their blocking by the number of rows, and blocking changes a sum's rounding:

* **Attention.** ATen's flash SDPA kernel works on blocks of query rows, and the GEMM it calls rounded a row's sums by
  the block's row count: on MKL's AVX2 kernels (what MKL runs on AMD CPUs) and on oneDNN without AMX often enough to
  flip bf16 near-ties; Intel's AMX kernels happened not to. So the rows that must be exact are not blocked together at
  all: each is its own batch entry, its head group's query heads the only rows of its SDPA problem (the layout an
  autoregressive step, and transformers for a lone row, already use), the keys read in place (an expanded view, not a
  copy). Rows after `exact_rows` (mask rows, whose drafts need no exactness) share one SDPA call, cheaper for many.
* **Linear layers.** oneDNN's bf16 matmul gives one row the same bits for any row count from 2 up to 32 on
  AVX512-BF16 without AMX, and from 1 to 32 with AMX, but a lone row differs without AMX (1 ulp in ~10 % of 576-wide
  outputs) and past 32 rows differs with AMX. `linear` therefore never multiplies a lone row: it adds a zero row
  (weights stream from memory either way, so the second row is nearly free). So the guarantee covers passes of at
  most `EXACT_ROWS` rows: one answer's passes are (at most a folded prompt tail of 24 tokens, the last token and 3
  masks; later 4 clean rows and 12 masks). Answers batched together are equal to their answers alone in fp32 and
  within bf16 rounding, not bit for bit (past 32 rows AMX rounds by rows too), so a batched pass attends its rows
  together, without the per-row cost.

`attention_forward` is `attend` in transformers' attention interface, so the modules' forward (training, tests) and
the fused pass compute the same bits; without `exact_rows` it is plain SDPA. The exactness tests run under settings
that reproduce other CPUs' kernels (tests/unit/test_other_cpus.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from model.process.threads import torch_threads
from model.runtime.batching import additive_mask

ATTENTION_NAME = "dlm_exact_rows"
# The most rows a pass may have for its exact rows to be exact on every kernel measured (see the module docstring).
EXACT_ROWS = 32


def default_exact_rows(answers: int, clean_rows: int) -> int:
    """The rows a decoding pass over `answers` answers keeps exact when its caller does not say: the clean rows of a
    pass of one answer; none in a batch of answers, which is not bit-exact anyway (see the module docstring)."""
    return clean_rows if answers == 1 else 0


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` with a lone row computed as one of two (see the module docstring)."""
    if x.numel() != x.shape[-1]:
        return F.linear(x, weight)
    pair = torch.cat([x.reshape(1, -1), x.new_zeros(1, x.shape[-1])])
    return F.linear(pair, weight)[:1].reshape(*x.shape[:-1], weight.shape[0])


def _grouped(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """Rows together: q `[B, H, S, D]` over keys `[B, KV, K, D]` -> `[B, S, H, D]`, each key head's query heads
    stacked as the rows of one problem (the keys read once, not repeated per query head)."""
    b, heads, s, d = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    packed = q.reshape(b, kv_heads, groups * s, d)  # rows (group member, query row)
    if s > 1:  # a lone row's bias [B, 1, 1, K] broadcasts over its group's rows as it is
        bias = bias.unsqueeze(2).expand(b, 1, groups, s, bias.shape[-1]).reshape(b, 1, groups * s, bias.shape[-1])
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=bias, scale=scale)  # [B, KV, G * S, D]
    return out.view(b, kv_heads, groups, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, heads, d)


def _row_by_row(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """Each query row its own SDPA problem: q `[B, H, R, D]` -> `[B, R, H, D]`, one call per sequence."""
    b, heads, rows, d = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    if rows == 1:
        return _grouped(q, keys, values, bias, scale)
    groups = heads // kv_heads
    packed = q.view(b, kv_heads, groups, rows, d).permute(0, 3, 1, 2, 4)  # [B, R, KV, G, D]
    masks = bias.transpose(1, 2).unsqueeze(2)  # [B, R, 1, 1, K]: a row's mask for each of its query heads
    outs = [
        F.scaled_dot_product_attention(
            packed[i], keys[i].expand(rows, kv_heads, length, d), values[i].expand(rows, kv_heads, length, d),
            attn_mask=masks[i], scale=scale,
        )  # [R, KV, G, D]: query heads in the model's order
        for i in range(b)
    ]
    return (outs[0].unsqueeze(0) if b == 1 else torch.stack(outs)).view(b, rows, heads, d)


def attend(
    q: torch.Tensor,  # [B, H, S, D]
    keys: torch.Tensor,  # [B, KV, K, D]
    values: torch.Tensor,  # [B, KV, K, D]
    bias: torch.Tensor,  # [B, 1, S, K] additive, q's dtype
    scale: float,
    exact_rows: int,
) -> torch.Tensor:
    """Attention output `[B, S, H, D]`; rows [0, exact_rows) each computed as if alone (see the module docstring)."""
    s = q.shape[2]
    exact_rows = min(exact_rows, s)
    if exact_rows == 0:
        return _grouped(q, keys, values, bias, scale)
    if exact_rows == s:
        return _row_by_row(q, keys, values, bias, scale)
    out = q.new_empty(q.shape[0], s, q.shape[1], q.shape[3])
    out[:, :exact_rows] = _row_by_row(q[:, :, :exact_rows], keys, values, bias[:, :, :exact_rows], scale)
    out[:, exact_rows:] = _grouped(q[:, :, exact_rows:], keys, values, bias[:, :, exact_rows:], scale)
    return out


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    exact_rows: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: `attend` when the forward says which rows are exact, else SDPA."""
    if exact_rows is None or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask.dtype == torch.bool:  # "may attend", as SDPA reads a bool mask
        attention_mask = additive_mask(attention_mask, query.dtype)
    return attend(query, key, value, attention_mask.to(query.dtype), scale, exact_rows), None  # [B, S, H, D]


AttentionInterface.register(ATTENTION_NAME, attention_forward)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


@functools.cache
def check_here(threads: int) -> str | None:
    """Whether the guarantee holds on this machine's kernels, at `threads` torch threads: None if it does, else
    what differed. Probes the bundled model's shapes (bf16 linears of 576 inputs, 9 query heads over 3 key heads)
    with random data, ~0.1 s; the tests do the same more thoroughly under other CPUs' kernel settings."""
    generator = torch.Generator().manual_seed(0)
    with torch_threads(threads), torch.inference_mode():
        for out_features, in_features in ((960, 576), (576, 576), (3072, 576), (576, 1536)):
            weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).bfloat16()
            x = torch.randn(EXACT_ROWS, in_features, generator=generator).bfloat16()
            alone = linear(x[:1], weight)[0]
            for rows in (2, 4, 16, EXACT_ROWS):
                if not torch.equal(alone, linear(x[:rows], weight)[0]):
                    return f"a bf16 linear {in_features} -> {out_features} rounds a row by the rows beside it"
        q = torch.randn(1, 9, 16, 64, generator=generator).bfloat16()
        keys = torch.randn(1, 3, 256, 64, generator=generator).bfloat16()
        values = torch.randn(1, 3, 256, 64, generator=generator).bfloat16()
        bias = torch.zeros(1, 1, 16, 256, dtype=torch.bfloat16)
        bias[..., 200:] = torch.finfo(torch.bfloat16).min
        among = attend(q, keys, values, bias, 0.125, exact_rows=4)
        for row in range(4):
            alone = attend(q[:, :, row : row + 1], keys, values, bias[:, :, row : row + 1], 0.125, exact_rows=1)
            if not torch.equal(alone[0, 0], among[0, row]):
                return "bf16 attention rounds a query row by the rows beside it"
    return None
