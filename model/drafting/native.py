"""The drafter through the decode kernel (model/runtime/kernels/decode_layer.c): its layer is a Llama layer, so the
kernel that runs the target's layers runs it, on its weights quantized to 8 bits (Q8_0: a scale per 32 inputs).

In fp32 torch the drafter read ~20 MB of weights a call for 4 rows (the bundled model's shape), a fifth of what a
target pass reads; in Q8_0 a quarter of that, and one kernel call instead of ~40 torch operations. A drafting call is
one pass of the layer over `[new context rows | block rows]`: the context rows are clean rows (causal; their keys and
values stay in the drafter's own cache), the block rows noisy ones (they see the whole context and each other), as
`PassRows` lays out any pass. Then the output norm and the shortlist head, in Q8_0 too, in one `norm_logits` call.
Drafts are proposals the target verifies, so the 8-bit rounding can only change how often they are accepted.
"""

from __future__ import annotations

import ctypes

import torch

from model.decoding.step import Feed
from model.drafting.drafter import Drafter, rms_norm
from model.runtime import quant_kernels
from model.runtime.batching import KEY_MULTIPLE, PassRows, SlotCache
from model.runtime.packed import GROUP, PackedLinear, PackedWeight


def q8_0(weight: torch.Tensor) -> PackedWeight:
    """`weight` `[N, K]` quantized as Q8_0: per group of 32 inputs an fp16 scale (the group's largest magnitude over
    127) and int8 values."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    d = (groups.abs().amax(-1) / 127.0).half().float()  # [N, K / 32], fp16 values
    q = torch.where(d[..., None] > 0, groups / d[..., None].clamp(min=1e-30), torch.zeros(()))
    return PackedWeight.bytes(q.round().clamp(-127, 127).to(torch.int8).reshape(n, k), d)


class NativeDrafter:
    """A `Drafter`'s layer and head packed for the decode kernel (where the kernels run: `quant_kernels.unavailable()`
    None)."""

    def __init__(self, drafter: Drafter) -> None:
        t = drafter.config.target
        self.drafter = drafter
        self.fc = PackedLinear([q8_0(drafter.fc.weight)])
        self.qkv = PackedLinear([q8_0(drafter.q.weight), q8_0(drafter.k.weight), q8_0(drafter.v.weight)])
        self.o = PackedLinear([q8_0(drafter.o.weight)])
        self.gate_up = PackedLinear([q8_0(drafter.gate.weight), q8_0(drafter.up.weight)])
        self.down = PackedLinear([q8_0(drafter.down.weight)])
        self.head = PackedLinear([q8_0(drafter.head)], logits=True)
        self._norms = [n.detach().float().contiguous() for n in (drafter.input_norm, drafter.post_norm,
                                                                  drafter.out_norm)]
        self.layer = (quant_kernels.Layer * 1)(quant_kernels.Layer(
            t.hidden, t.heads, t.kv_heads, t.head_dim, t.intermediate, t.rms_eps, t.head_dim**-0.5, 0.0,
            self._norms[0].data_ptr(), self._norms[1].data_ptr(), None, None, None,
            *(quant_kernels.Linear((quant_kernels.QWeight * quant_kernels.MEMBERS)(*(m.struct() for m in w.members)),
                                   len(w.members), quant_kernels.LoRA())
              for w in (self.qkv, self.o, self.gate_up, self.down)),
        ))

    def fuse(self, tapped: torch.Tensor) -> torch.Tensor:
        """`Drafter.fuse` with the packed fc."""
        d = self.drafter
        eps = d.config.target.rms_eps
        normed = rms_norm(tapped.float(), None, eps).flatten(-2)
        return rms_norm(self.fc(normed.contiguous()), d.context_norm.detach(), eps)

    def block_logits(self, context: torch.Tensor, block: torch.Tensor, cache: SlotCache, length: int,
                     first_position: int) -> torch.Tensor:
        """One drafting pass: `context` `[n, hidden]` new context rows (kept in `cache`'s slot 0 after its `length`
        rows), then the `block` rows `[k, hidden]` -> logits `[k, shortlist]`."""
        n, k = context.shape[0], block.shape[0]
        feed = Feed(clean=(0,) * n, noisy=(0,) * k)
        rows = PassRows.of([0], [length], [feed], KEY_MULTIPLE)
        h = torch.cat([context, block]).float().contiguous()
        cos, sin = (t.contiguous() for t in self.drafter.rotary(rows.positions + first_position))
        bias = rows.bias.float().contiguous()
        slots, writes = rows.slots.contiguous(), rows.writes.contiguous()
        t = self.drafter.config.target
        like = torch.empty(1, t.kv_heads, 0, t.head_dim, dtype=torch.bfloat16)
        buffers = cache.layer_buffers(1, bias.shape[-1], like)
        lib = quant_kernels.library()
        failed = ctypes.c_int64(-1)
        threads = torch.get_num_threads()
        if lib.decode_layers(self.layer, 1, h.data_ptr(), n + k, n, n + k, cos.data_ptr(), sin.data_ptr(),
                             buffers.keys, buffers.values, buffers.capacity, slots.data_ptr(), writes.data_ptr(),
                             bias.shape[-1], bias.data_ptr(), threads, ctypes.byref(failed)):
            raise MemoryError("the drafter's layer could not run in the decode kernel")
        cache.slots[0].ids.extend([0] * n)  # the context rows stay; the block's are overwritten next time
        out = h[n:].contiguous()
        logits = torch.empty(k, self.head.out_features, dtype=torch.float32)
        if lib.norm_logits(out.data_ptr(), k, t.hidden, self._norms[2].data_ptr(), t.rms_eps, k,
                           self.head.structs, len(self.head.members), logits.data_ptr(), threads):
            raise MemoryError("the drafter's head could not run in the decode kernel")
        return logits
