"""One inference pass of a block-diffusion Llama (or of a Llama, Qwen2 or Qwen3 network without an adapter: a user's
GGUF model, model/adapters/gguf_model.py), written out without transformers' per-module machinery.

The bundled model's passes multiply ~270 MB of bf16 weights by 1-32 rows. On a 2-core CPU those matmuls take about
40 ms; transformers' modules around them (per-call hooks and kwargs, a separate q, k, v, gate and up projection, and
the gated LoRA's 420 thin matmuls and dtype casts per pass) added 25-35 ms more. This module is the same computation in
the style of gpt-fast: q/k/v and gate/up are one matmul each, the LoRA runs only on the noisy rows, the rotary table is
computed once, and keys go straight into the `SlotCache`.

Exactness: the same operations in the same dtypes as transformers' Llama (RMSNorm in fp32, rotary in the model's
dtype, the LoRA in its factors' dtype, member by member) and the same attention function as the modules
(`model.runtime.row_exact`, which also multiplies a lone row as one of two); the fused projections shape each
output column's sum as the separate ones did. Tests hold it to the modules' forward bit for bit in fp32 and bf16,
also under other CPUs' kernels (tests/unit/test_fast_pass.py, tests/unit/test_other_cpus.py), and the bf16 exactness
tests of self-speculative decoding run through it.

With the GGUF's int4 weights (`BlockDiffusionLM.int4`), every decoding pass, of one answer or of several, is
computed by the C decode layer instead (`rows_pass`, model/runtime/kernels/decode_layer.c): the same network, one
call a layer for all the pass's rows, with a fp32 residual stream and llama.cpp's quantized matmuls; each row is
computed as if alone, so an answer is the same bits whoever else is in its pass. Prefills go through it too
(`int4_prefill`).

The fused weights share storage with the modules (the modules' weights become views into them), so nothing is held
twice, and training, which needs autograd through the modules, keeps using them.
"""

from __future__ import annotations

import ctypes
import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.process import watch
from model.runtime import quant_kernels, row_exact
from model.runtime.batching import PassRows
from model.runtime.fused_layers import (
    AdaptedModel,
    FusedLayer,
    LayerLoRA,
    base_linear,
    fuse,
    native_linear,
    native_linears,
    native_lora_rank,
    pointer_at,
)
from model.runtime.int4_weights import Int4Layer
from model.runtime.noisy_rows import Suffix, noisy_suffix
from model.runtime.packed import Head, PackedLinear

if TYPE_CHECKING:
    from model.runtime.batching import SlotCache

log = logging.getLogger(__name__)


class PassPath(enum.Enum):
    """The three ways a pass runs, chosen in one place (`FastPass.path`)."""

    NATIVE = "native"  # the C decode layer: every layer and the head in one call (int4 weights, a shape it takes)
    INT4 = "int4"  # torch's layer loop on the int4 (packed) weights' kernels
    DENSE = "dense"  # torch's layer loop on the dense (bf16 or fp32) weights


# Rows of a batched pass (several answers) in torch, where the decode kernel does not take the model (an fp32 one),
# up to which the int4 kernels with the torch glue a batch needs beat bf16 (scripts/bench/bench_lm.py --batch-costs)
INT4_BATCH_ROWS = 8


class FastPass:
    """Callable like `BlockDiffusionLM.forward` for inference with a `SlotCache` (see `model.runtime.batching`). Built
    from the model's current weights: rebuild it after the adapter changes (`BlockDiffusionLM.inference_pass` does).

    With the model's int4 weights (`BlockDiffusionLM.int4`), decoding passes and prefills multiply by them
    (`int4_prefill`); without, every pass is bf16."""

    def __init__(self, model: AdaptedModel) -> None:
        base = model.base
        config = base.config
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.eps = float(config.rms_norm_eps)
        self.scaling = self.head_dim**-0.5
        self.layers: list[FusedLayer] = []
        int4 = model.int4.layers if model.int4 else [None] * len(base.model.layers)
        for layer, quantized in zip(base.model.layers, int4, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            qkv, qkv_lora = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            biases = [base_linear(m).bias for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
            qkv_bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            q_norm = attn.q_norm.weight.detach() if config.model_type == "qwen3" else None
            k_norm = attn.k_norm.weight.detach() if q_norm is not None else None
            gate_up, gate_up_lora = fuse([mlp.gate_proj, mlp.up_proj])
            _, o_lora = fuse([attn.o_proj])
            _, down_lora = fuse([mlp.down_proj])
            self.layers.append(FusedLayer(
                layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                qkv, base_linear(attn.o_proj).weight.detach(), gate_up, base_linear(mlp.down_proj).weight.detach(),
                qkv_lora, o_lora, gate_up_lora, down_lora, qkv_bias, q_norm, k_norm, quantized,
            ))
        self.norm = base.model.norm.weight.detach()
        self._final_norm = self.norm.float().contiguous()  # what `norm_logits` reads
        self.lm_head = base.get_output_embeddings().weight.detach()
        self.int4_head: Head | None = model.int4.head if model.int4 else None
        rotary = base.model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float()
        self.attention_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.dtype = self.lm_head.dtype
        # a model loaded without dense linears (model/gguf/network.py) multiplies by its packed ones only
        self.packed_only = model.int4 is not None and self.layers[0].qkv.numel() == 0
        self._held: list[torch.Tensor] = []  # what the native layers point into
        # why the decode kernel does not take this model (None: it does); a model with int4 weights then runs every
        # pass through torch's layer loop, several times slower, and the log says so once
        self.native_refusal = self._native_refusal()
        self.native = self._native_layers() if self.native_refusal is None else None
        if self.native_refusal is not None and model.int4 is not None:
            log.warning("the decode kernel does not take this model (%s): its passes run through torch, slower",
                        self.native_refusal)  # fmt: skip
        self._embedding_bits, self._mask_bits = self._bf16_embedding()
        self._rotary_table = (np.empty((0, self.head_dim), np.float32),) * 2  # cos, sin by position (`_rotary_rows`)

    def _bf16_embedding(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The token embedding's and the mask embedding's bf16 bits as numpy uint16, which `_embedded` widens to
        fp32 exactly as `.float()` does; (None, None) when the embedding is not a bf16 table (a GGUF's blocks)."""
        table = self.model.base.get_input_embeddings()
        weight = getattr(table, "weight", None)
        mask = getattr(self.model, "mask_embedding", None)
        if not isinstance(table, nn.Embedding) or weight is None or weight.dtype != torch.bfloat16 or mask is None:
            return None, None
        bits = weight.detach().view(torch.int16).numpy().view(np.uint16)  # shares the weight's memory
        return bits, mask.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()

    def _native_refusal(self) -> str | None:
        """Why decode_layer.c does not take this model (the shapes it is written for, int4 weights that match them,
        the LoRA's shape, the kernels built for this CPU), or None when it does."""
        config = self.model.base.config
        hidden, intermediate = int(config.hidden_size), int(config.intermediate_size)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # (out, in) of qkv, o, gate_up, down: `native_linears`' order
        shapes = ((q_size + 2 * kv_size, hidden), (hidden, q_size), (2 * intermediate, hidden), (hidden, intermediate))
        checks: list[tuple[bool, str]] = [
            (self.model.int4 is not None and self.int4_head is not None, "no int4 weights"),
            (self.dtype == torch.bfloat16, f"{self.dtype} weights, not bf16"),
            (self.lm_head.device.type == "cpu", f"weights on {self.lm_head.device.type}"),
            (self.head_dim % 16 == 0 and self.head_dim <= 128, f"head size {self.head_dim}"),
            (self.heads % self.kv_heads == 0, f"{self.heads} heads over {self.kv_heads} key-value heads"),
            (intermediate % 16 == 0, f"intermediate size {intermediate}"),
        ]
        for passed, reason in checks:
            if not passed:
                return reason
        for index, layer in enumerate(self.layers):
            if layer.int4 is None:
                return f"layer {index} has no int4 weights"
            linears = native_linears(layer, layer.int4)
            if any((linear.out_features, linear.in_features) != shape
                   for (linear, _), shape in zip(linears, shapes, strict=True)):  # fmt: skip
                return f"layer {index}'s int4 shapes"
            loras = [lora for _, lora in linears]
            if any(native_lora_rank(lora) is None for lora in loras) or len({lora.scale for lora in loras}) != 1:
                return f"layer {index}'s LoRA (ranks or scales it is not built for)"
            if layer.q_norm is not None and layer.q_norm.shape != (self.head_dim,):
                return f"layer {index}'s query norm shape"
        return quant_kernels.unavailable()

    def int4_prefill(self, rows: int) -> bool:
        """Whether a prefill of `rows` prompt tokens reads the int4 weights (through the decode kernel when it takes
        the model) rather than the bf16 ones: always, when the model has them. A prompt token's keys are then the
        same bits however the prompt was split between the cache and the prefill, so an answer does not depend on
        what its slot held before (which other client's prompt, on a server). AMX's bf16 matmuls would encode a
        prompt of a few hundred tokens about twice as fast (scripts/bench/bench_lm.py --prefill-costs), and on
        another arithmetic: a prompt cached in part then gave other answers than the same prompt encoded whole."""
        return self.model.int4 is not None

    def _native_layers(self) -> ctypes.Array:
        """Each layer as `decode_layer` (model/runtime/kernels/decode_layer.c) takes it (`_native_refusal`: None)."""
        config = self.model.base.config
        layers = []
        for layer in self.layers:
            assert layer.int4 is not None
            norms = [layer.input_norm.float().contiguous(), layer.post_norm.float().contiguous()]
            extras = [None if t is None else t.float().contiguous() for t in (layer.qkv_bias, layer.q_norm,
                                                                               layer.k_norm)]
            self._held += norms + [t for t in extras if t is not None]
            layers.append(quant_kernels.Layer(
                int(config.hidden_size), self.heads, self.kv_heads, self.head_dim, int(config.intermediate_size),
                self.eps, self.scaling, layer.qkv_lora.scale, norms[0].data_ptr(), norms[1].data_ptr(),
                *(None if t is None else t.data_ptr() for t in extras),
                *(native_linear(linear, lora, self._held) for linear, lora in native_linears(layer, layer.int4)),
            ))
        return (quant_kernels.Layer * len(layers))(*layers)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rotary_fp32(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, S] -> cos, sin: [B, S, head_dim] fp32, computed as transformers' LlamaRotaryEmbedding does
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def _embedded(self, ids: torch.Tensor) -> torch.Tensor:
        """`model.embed(ids).float()` for a pass's rows `[R]`: `[R, hidden]` fp32, the same values. With a bf16 table
        its rows are gathered and widened in numpy: a decoding pass's torch operations each cost ~10-20 us once the
        weights' stream has evicted their code and data from the caches (the embedding's six took ~110 us a pass
        in a decoding loop, ~26 us in a loop of its own)."""
        bits = self._embedding_bits
        if bits is None:
            return self.model.embed(ids[None]).float()[0].contiguous()
        index = ids.numpy()
        masks = index == self.model.mask_id  # outside the table: their rows are the mask embedding's
        rows = bits[np.where(masks, 0, index)]
        if masks.any():
            rows[masks] = self._mask_bits
        return torch.from_numpy((rows.astype(np.uint32) << 16).view(np.float32))

    def _rotary_rows(self, positions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """`_rotary_fp32` of a pass's rows' positions `[R]` as contiguous `[R, head_dim]` arrays, read from a table
        of every position so far (grown by doubling, each position's row computed by `_rotary_fp32` as before): the
        same values as the per-pass computation, without its torch operations (see `_embedded`)."""
        index = positions.numpy()
        cos, sin = self._rotary_table
        top = int(index.max()) + 1 if index.size else 0
        if top > cos.shape[0]:
            size = max(top, 2 * cos.shape[0], 1024)
            cos, sin = (t[0].numpy() for t in self._rotary_fp32(torch.arange(size)[None]))
            self._rotary_table = cos, sin
        return cos[index], sin[index]

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, S] -> cos, sin: [B, 1, S, head_dim] in the model's dtype
        cos, sin = self._rotary_fp32(positions)
        return cos.to(self.dtype).unsqueeze(1), sin.to(self.dtype).unsqueeze(1)

    def _kept_rows(self, h: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
        """The final norm of the residual rows `h` `[B, S, hidden]` that `logits_to_keep` selects (the rows the head
        needs)."""
        h = self._rms_norm(h, self.norm)
        if isinstance(logits_to_keep, torch.Tensor):
            return h[:, logits_to_keep]
        return h[:, -logits_to_keep:] if logits_to_keep else h

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos) + (rotated * sin)

    @staticmethod
    def _linear(
        x: torch.Tensor,
        weight: torch.Tensor | PackedLinear,
        lora: LayerLoRA,
        start: int | None,
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """`x @ weight.T` plus the LoRA on columns [start, S), masked per sequence by `rows` (start None: none)."""
        out = weight(x) if isinstance(weight, PackedLinear) else row_exact.linear(x, weight)
        if start is None or start >= x.shape[1] or not lora.factors:
            return out
        delta = lora.delta(x[:, start:])
        if rows is not None:
            delta = delta * rows.to(delta.dtype)
        out[:, start:].add_(delta)
        return out

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, S]
        position_ids: torch.Tensor,  # [B, S]
        attention_bias: torch.Tensor,  # [B, 1, S, K] additive float
        noisy: torch.Tensor,  # [B, S] bool: noisy rows are each sequence's last ones (see model.runtime.batching)
        cache: SlotCache,
        logits_to_keep: int | torch.Tensor = 0,
        exact_rows: int | None = None,
        suffix: Suffix | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Logits `[B, S, V]` (or the rows `logits_to_keep` selects). `prefill`: a prompt's encoding (bf16 weights even
        when the model has int4 ones). `exact_rows` (default: the clean rows of a pass of one answer) are the rows whose
        logits and keys must not depend on the rest of the pass (`model.runtime.row_exact`); a prefill, whose layout is
        the same in every decoding mode, needs none. `suffix`: `noisy_suffix(noisy)`, found by the caller on the host
        (model/runtime/batching.py: then nothing in the pass reads a device tensor back); None: found here."""
        if suffix is None:
            suffix = noisy_suffix(noisy)
        if suffix is None:
            raise ValueError("FastPass needs each sequence's noisy rows after its clean ones")
        start: int | None = suffix[0]
        rows = None if suffix[1] is None else suffix[1].unsqueeze(-1)
        b, s = input_ids.shape
        if exact_rows is None:
            exact_rows = row_exact.default_exact_rows(b, min(start, s))
        if start is not None and start >= s:
            start = None  # a clean pass: no LoRA anywhere
        path = self.path(b, s, prefill)
        if path is PassPath.NATIVE:
            first_noisy = s if start is None else start
            return self._native_pass(input_ids, position_ids, attention_bias, first_noisy, cache, logits_to_keep)
        int4 = path is PassPath.INT4
        h = self.model.embed(input_ids).to(self.dtype)  # [B, S, hidden]
        bias = attention_bias.to(self.dtype)
        cos, sin = self._rotary(position_ids)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            w: FusedLayer | Int4Layer = layer.int4 if int4 and layer.int4 is not None else layer
            x = self._rms_norm(h, layer.input_norm)
            qkv = self._linear(x, w.qkv, layer.qkv_lora, start, rows)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias.to(qkv.dtype)
            qk, v = qkv.split((q_size + kv_size, kv_size), dim=-1)
            qk = qk.view(b, s, self.heads + self.kv_heads, self.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q_heads, k_heads = qk.split((self.heads, self.kv_heads), dim=2)
                qk = torch.cat([self._rms_norm(q_heads, layer.q_norm), self._rms_norm(k_heads, layer.k_norm)], dim=2)
            # queries and keys rotated in one call: the same elementwise operations as two, half the op launches
            qk = self._rotate(qk.transpose(1, 2), cos, sin)
            q, k = qk.split((self.heads, self.kv_heads), dim=1)
            v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.update(k, v, index)
            attended = row_exact.attend(q, keys, values, bias, self.scaling, exact_rows).reshape(b, s, q_size)
            h = h + self._linear(attended, w.o, layer.o_lora, start, rows)
            x = self._rms_norm(h, layer.post_norm)
            gate, up = self._linear(x, w.gate_up, layer.gate_up_lora, start, rows).chunk(2, dim=-1)
            h = h + self._linear(F.silu(gate) * up, w.down, layer.down_lora, start, rows)
        h = self._kept_rows(h, logits_to_keep)
        if self.int4_head is not None and int4:
            return self.int4_head(h)
        return row_exact.linear(h, self.lm_head)

    def path(self, answers: int, rows: int, prefill: bool) -> PassPath:
        """How a pass of `answers` x `rows` runs through `__call__` (a pass in `PassRows` goes to `rows_pass`, the
        decode kernel, whenever `takes_rows`). The int4 weights for every pass of one answer (its exactness needs
        one set of weights), for a batch of answers only while that is cheaper (a batch is not bit-exact anyway), for
        a prefill as `int4_prefill` says; always for a model with no dense weights; the decode kernel for a pass of
        one answer on the int4 weights when it takes the model."""
        if self.int4_head is None and self.model.int4 is None:
            return PassPath.DENSE
        if prefill:
            int4 = answers == 1 and self.int4_prefill(rows)
        else:
            int4 = answers == 1 or answers * rows <= INT4_BATCH_ROWS
        if not (int4 or self.packed_only):
            return PassPath.DENSE
        return PassPath.NATIVE if answers == 1 and self.native is not None else PassPath.INT4

    def takes_rows(self) -> bool:
        """Whether `rows_pass` runs here (the decode kernel takes this model): then every decoding pass, of one answer
        or several, goes through it (model/runtime/batching.py `batched_pass`)."""
        return self.native is not None

    def rows_pass(self, rows: PassRows, cache: SlotCache, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[R, V]` fp32 of a pass's rows (of the rows `keep` selects, ascending) through `decode_layers`, one
        call a pass for every layer and every answer in it: the residual stream in fp32, each row computed as if
        alone (model/runtime/kernels/decode_layer.c), drafting rows on coarse matmuls."""
        h = self.hidden_rows(rows, cache)
        if keep is None:
            return self.logits(h, rows.coarse)
        # `keep` ascending: the drafting rows among them are still the last ones
        return self.logits(h[keep].contiguous(), int((keep < rows.coarse).sum()))

    def hidden_rows(self, rows: PassRows, cache: SlotCache) -> torch.Tensor:
        """The last layer's residual rows `[R, hidden]` fp32 of a pass (`rows_pass` before its head): every layer in
        one `decode_layers` call, the rows' keys and values written into `cache`."""
        return self.tapped_rows(rows, cache, ())[0]

    def tapped_rows(
        self, rows: PassRows, cache: SlotCache, taps: Sequence[int]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`hidden_rows`, and a copy of the residual rows after each of the first `taps` layers (ascending, 1 to the
        layer count): what a drafter reads of the model (model/drafting/). The pass is split into one
        `decode_layers` call per tap, each row's arithmetic unchanged."""
        lib = quant_kernels.library()
        assert self.native is not None and self.int4_head is not None
        r = rows.ids.shape[0]
        h = self._embedded(rows.ids)  # [R, hidden] fp32
        cos, sin = self._rotary_rows(rows.positions)  # [R, head_dim] fp32
        bias = rows.bias.float().contiguous()
        slots, writes = rows.slots.contiguous(), rows.writes.contiguous()
        key_len = bias.shape[-1]
        like = torch.empty(1, self.kv_heads, 0, self.head_dim, dtype=torch.bfloat16)
        buffers = cache.layer_buffers(len(self.native), key_len, like)
        count = len(self.native)
        if list(taps) != sorted(set(taps)) or any(not 1 <= tap <= count for tap in taps):
            raise ValueError(f"taps must be ascending layer counts in [1, {count}], got {list(taps)}")
        tapped: list[torch.Tensor] = []
        done = 0
        ends = list(taps) if taps and taps[-1] == count else [*taps, count]
        for end in ends:
            failed = ctypes.c_int64(-1)
            with watch.span(watch.DECODE_LAYERS):
                status = lib.decode_layers(
                    pointer_at(self.native, done), end - done, h.data_ptr(), r, rows.start, rows.coarse,
                    cos.ctypes.data, sin.ctypes.data, pointer_at(buffers.keys, done), pointer_at(buffers.values, done),
                    pointer_at(buffers.capacity, done), slots.data_ptr(), writes.data_ptr(), key_len, bias.data_ptr(),
                    torch.get_num_threads(), ctypes.byref(failed),
                )
            if status == 1:
                raise MemoryError(f"decode_layer could not allocate its buffers (layer {done + failed.value})")
            if status:
                raise ValueError(f"decode_layer refused layer {done + failed.value}'s shapes ({status})")
            done = end
            if end in taps:
                tapped.append(h.clone())
        return h, tapped

    def logits(self, h: torch.Tensor, coarse: int | None) -> torch.Tensor:
        """The final norm and the int4 head on the last layer's rows `h` `[R, hidden]` fp32 (`hidden_rows`) -> `[R, V]`
        fp32, rows from `coarse` on drafting (None: none): `rows_pass`'s last step. A packed head takes both in one C
        call (`norm_logits`), so no torch operation runs between the layers and the head; a head done row by row
        (model/gguf/blocks.py) after the norm in torch."""
        head = self.int4_head
        assert head is not None
        if not (isinstance(head, PackedLinear) and head.logits):
            return head(self._rms_norm(h, self.norm), coarse)
        r = h.shape[0]
        logits = torch.empty(r, head.out_features, dtype=torch.float32)
        if quant_kernels.library().norm_logits(
            h.data_ptr(), r, h.shape[1], self._final_norm.data_ptr(), self.eps, r if coarse is None else coarse,
            head.structs, len(head.members), logits.data_ptr(), torch.get_num_threads(),
        ):
            raise MemoryError("the head's kernel could not allocate its buffers")
        return logits

    def _native_pass(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_bias: torch.Tensor,
        start: int,
        cache: SlotCache,
        logits_to_keep: int | torch.Tensor,
    ) -> torch.Tensor:
        """A pass of one answer in `__call__`'s layout (a prefill's) through `rows_pass`: its rows are the one
        answer's, in order, none of them drafting."""
        s = input_ids.shape[1]
        columns = torch.arange(s)
        rows = PassRows(
            input_ids[0], position_ids[0], torch.full((s,), cache.rows[0], dtype=torch.long),
            cache.offsets[0] + columns, attention_bias[0, 0], start, s, ((slice(0, start), slice(start, s)),),
        )
        if isinstance(logits_to_keep, torch.Tensor):
            keep = logits_to_keep
        else:
            keep = columns[-logits_to_keep:] if logits_to_keep else None
        return self.rows_pass(rows, cache, keep)[None]
