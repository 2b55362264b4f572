"""A drafter small by construction: one transformer layer that reads the target's own hidden states.

A draft row that goes through the whole network costs what a clean row costs, so on a CPU no drafting layout pays for
it (issues 46, 48). This drafter is the shape of DFlash (block diffusion on the target's features, vLLM speculators'
`dflash`, SGLang's `DFLASH`) with EAGLE-3's feature fusion, sized for a CPU:

* **Context from the target.** The residual rows of a few of the target's layers (`taps`), each RMS-normalised, side
  by side, are fused by one linear and a norm into one row per committed token. The draft layer's keys and values of
  the context are projected from these rows (and cached: each committed token's row is projected once).
* **One block, one pass.** The block `[last token, mask_1, ..., mask_{k-1}]` sits at the positions after the context;
  its rows attend to the whole context and to each other (bidirectionally), through one Llama-shaped layer. As in the
  target, row j predicts the token after it (the next-token shift): k rows give k drafts.
* **The target's embedding and head.** The last token's row starts from the target's embedding, the masks from
  learned per-offset embeddings; the output goes through a norm and the target's head restricted to a shortlist of
  the tokens its answers use (`shortlist` rows of the head instead of the full vocabulary, which would dominate the
  drafter's cost on a 150K vocabulary).

A draft row then costs one layer and a shortlist head, not the whole network. Drafts are only proposals: the target's
clean rows verify them (model/decoding/speculative.py), so answers are the target's greedy ones whatever the drafter
says. Everything here is fp32 torch: the drafter is ~1/30 of the bundled model's arithmetic per row.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.errors import ModelError


@dataclass(frozen=True, slots=True)
class TargetShape:
    """What the drafter must match of its target: its layer count, widths and attention layout (a drafter trained
    for another model is refused by it, `Drafter.check_target`)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    rope_theta: float

    @staticmethod
    def of(config: Any) -> TargetShape:
        """The shape of a transformers config (a Llama, Qwen2 or Qwen3)."""
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        return TargetShape(int(config.num_hidden_layers), int(config.hidden_size), int(config.num_attention_heads),
                           int(config.num_key_value_heads), head_dim, int(config.intermediate_size),
                           int(config.vocab_size), float(config.rms_norm_eps), theta)


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    """The drafter's own shape; saved beside its weights so a checkpoint describes itself."""

    target: TargetShape
    taps: tuple[int, ...]  # target layers (the residual after this many) the context is fused from
    block: int = 4  # drafts per pass: rows [last token, block - 1 masks]
    shortlist: int = 4096  # head rows the drafts are chosen among

    @staticmethod
    def for_target(target: TargetShape, block: int = 4, shortlist: int = 4096) -> DrafterConfig:
        """Taps at a third, two thirds and the end of the target's layers: low, middle and high features (EAGLE-3),
        the last being the row the target's own next token comes from."""
        n = target.layers
        taps = tuple(sorted({max(1, round(n / 3)), max(1, round(2 * n / 3)), n}))
        return DrafterConfig(target, taps, block, min(shortlist, target.vocab))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["taps"] = list(self.taps)
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> DrafterConfig:
        return DrafterConfig(TargetShape(**data["target"]), tuple(data["taps"]), int(data["block"]),
                             int(data["shortlist"]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return h if weight is None else h * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Drafter(nn.Module):
    """The draft model: `fuse` the target's tapped rows, `context` their keys and values, `block_logits` a block's
    drafts over the shortlist. `forward` is the training form (many blocks of many sequences at once)."""

    def __init__(self, config: DrafterConfig, shortlist: torch.Tensor, head: torch.Tensor) -> None:
        """`shortlist`: `[S]` token ids the head scores; `head`: the target's head rows of them `[S, hidden]`."""
        super().__init__()
        t = config.target
        if shortlist.shape != (config.shortlist,) or head.shape != (config.shortlist, t.hidden):
            raise ModelError(f"a shortlist of {config.shortlist} tokens and their head rows are needed, got "
                             f"{tuple(shortlist.shape)} and {tuple(head.shape)}")
        self.config = config
        q, kv = t.heads * t.head_dim, t.kv_heads * t.head_dim
        self.fc = nn.Linear(len(config.taps) * t.hidden, t.hidden, bias=False)
        self.context_norm = nn.Parameter(torch.ones(t.hidden))
        self.input_norm = nn.Parameter(torch.ones(t.hidden))
        self.q = nn.Linear(t.hidden, q, bias=False)
        self.k = nn.Linear(t.hidden, kv, bias=False)
        self.v = nn.Linear(t.hidden, kv, bias=False)
        self.o = nn.Linear(q, t.hidden, bias=False)
        self.post_norm = nn.Parameter(torch.ones(t.hidden))
        self.gate = nn.Linear(t.hidden, t.intermediate, bias=False)
        self.up = nn.Linear(t.hidden, t.intermediate, bias=False)
        self.down = nn.Linear(t.intermediate, t.hidden, bias=False)
        self.out_norm = nn.Parameter(torch.ones(t.hidden))
        self.masks = nn.Parameter(torch.randn(config.block - 1, t.hidden) * 0.02)
        self.register_buffer("shortlist", shortlist.long().clone(), persistent=True)
        self.register_buffer("head", head.float().clone(), persistent=False)  # the target's: never trained or saved
        inv_freq = 1.0 / (t.rope_theta ** (torch.arange(0, t.head_dim, 2, dtype=torch.float32) / t.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # --- pieces shared by training and decoding -------------------------------------------------------------------
    def fuse(self, tapped: torch.Tensor) -> torch.Tensor:
        """`[..., taps, hidden]` residual rows of the target -> `[..., hidden]` context rows."""
        t = self.config.target
        normed = rms_norm(tapped.float(), None, t.rms_eps).flatten(-2)
        return rms_norm(self.fc(normed), self.context_norm, t.rms_eps)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[..., head_dim]` of `positions` (the target's default rotary)."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values `[..., kv_heads, rows, head_dim]` of layer inputs `x` `[..., rows, hidden]`."""
        t = self.config.target
        h = rms_norm(x, self.input_norm, t.rms_eps)
        cos, sin = self.rotary(positions)
        k = self.k(h).unflatten(-1, (t.kv_heads, t.head_dim)).transpose(-3, -2)
        v = self.v(h).unflatten(-1, (t.kv_heads, t.head_dim)).transpose(-3, -2)
        return _rotate(k, cos.unsqueeze(-3), sin.unsqueeze(-3)), v

    def context(self, tapped: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[kv_heads, rows, head_dim]` of committed tokens' tapped rows `[rows, taps, hidden]`."""
        return self.keys_values(self.fuse(tapped), positions)

    def block_rows(self, embedding: torch.Tensor) -> torch.Tensor:
        """The block's layer inputs `[..., block, hidden]`: the last token's embedding `[..., hidden]`, then the
        masks."""
        masks = self.masks.expand(*embedding.shape[:-1], *self.masks.shape)
        return torch.cat([embedding.float().unsqueeze(-2), masks], dim=-2)

    def _layer(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: output projection, residual, MLP, the output norm."""
        t = self.config.target
        h = x + self.o(attended)
        m = rms_norm(h, self.post_norm, t.rms_eps)
        h = h + self.down(F.silu(self.gate(m)) * self.up(m))
        return rms_norm(h, self.out_norm, t.rms_eps)

    def _queries(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        t = self.config.target
        h = rms_norm(x, self.input_norm, t.rms_eps)
        cos, sin = self.rotary(positions)
        q = self.q(h).unflatten(-1, (t.heads, t.head_dim)).transpose(-3, -2)
        return _rotate(q, cos.unsqueeze(-3), sin.unsqueeze(-3))

    # --- decoding: one block after a cached context ------------------------------------------------------------------
    @torch.inference_mode()
    def block_logits(
        self, x: torch.Tensor, position: int, keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[block, shortlist]` of the block rows `x` `[block, hidden]` (`block_rows`) at positions from
        `position`, after the context's keys and values `[kv_heads, N, head_dim]` (every committed token before it)."""
        t = self.config.target
        positions = torch.arange(position, position + x.shape[0])
        q = self._queries(x, positions)  # [heads, block, d]
        k, v = self.keys_values(x, positions)
        k, v = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
        group = t.heads // t.kv_heads
        attended = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0))
        h = self._layer(x, attended.transpose(0, 1).flatten(-2))
        return h @ self.head.t()

    # --- training: many blocks of many sequences --------------------------------------------------------------------
    def forward(
        self, tapped: torch.Tensor, embedded: torch.Tensor, anchors: torch.Tensor, starts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits `[B, A, block, shortlist]` of blocks after `anchors` `[B, A]` (the position of each block's last
        token), from sequences' tapped rows `[B, N, taps, hidden]` and the anchors' tokens' embeddings
        `[B, A, hidden]`. Block a of sequence b sees the context from `starts[b]` (default 0) to its anchor, and
        itself."""
        t = self.config.target
        b, n = tapped.shape[:2]
        k = self.config.block
        ctx_k, ctx_v = self.keys_values(self.fuse(tapped), torch.arange(n).expand(b, n))  # [B, kv, N, d]
        x = self.block_rows(embedded)  # [B, A, block, hidden]
        positions = anchors.unsqueeze(-1) + torch.arange(k)  # [B, A, block]
        q = self._queries(x, positions)  # [B, A, heads, block, d]
        blk_k, blk_v = self.keys_values(x, positions)  # [B, A, kv, block, d]
        group = t.heads // t.kv_heads
        q = q.unflatten(2, (t.kv_heads, group))  # [B, A, kv, group, block, d]
        scale = 1.0 / math.sqrt(t.head_dim)
        ctx_scores = torch.einsum("bakgqd,bknd->bakgqn", q, ctx_k) * scale
        seen = torch.arange(n).view(1, 1, n) < anchors.unsqueeze(-1)  # [B, A, N]
        if starts is not None:
            seen &= torch.arange(n).view(1, 1, n) >= starts.view(b, 1, 1)
        ctx_scores = ctx_scores.masked_fill(~seen[:, :, None, None, None, :], -torch.inf)
        blk_scores = torch.einsum("bakgqd,bakjd->bakgqj", q, blk_k) * scale
        weights = torch.softmax(torch.cat([ctx_scores, blk_scores], dim=-1), dim=-1)
        attended = (torch.einsum("bakgqn,bknd->bakgqd", weights[..., :n], ctx_v)
                    + torch.einsum("bakgqj,bakjd->bakgqd", weights[..., n:], blk_v))
        attended = attended.flatten(2, 3).transpose(2, 3).flatten(-2)  # [B, A, block, heads * d]
        return self._layer(x, attended) @ self.head.t()

    # --- the target ---------------------------------------------------------------------------------------------------
    def check_target(self, shape: TargetShape) -> None:
        """Refuse a target of another shape than the one this drafter was trained on."""
        if shape != self.config.target:
            raise ModelError(f"this drafter was trained for a model of shape {self.config.target}, not {shape}")

    def init_from_layer(self, layer: Any) -> None:
        """Start the draft layer from one of the target's (a transformers decoder layer with dense weights): its
        attention and MLP already read the target's residual stream."""
        attn, mlp = layer.self_attn, layer.mlp
        theirs = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj, "gate": mlp.gate_proj,
                  "up": mlp.up_proj, "down": mlp.down_proj}
        self.init_from_weights({name: getattr(module, "base", module).weight for name, module in theirs.items()},
                               layer.input_layernorm.weight, layer.post_attention_layernorm.weight)

    def init_from_weights(self, linears: dict[str, torch.Tensor], input_norm: torch.Tensor,
                          post_norm: torch.Tensor) -> None:
        """`init_from_layer` from a layer's weights: `linears` by the draft layer's names (q, k, v, o, gate, up,
        down; transformers' row order), and its two norms."""
        with torch.no_grad():
            for name, weight in linears.items():
                getattr(self, name).weight.copy_(weight.float())
            self.input_norm.copy_(input_norm.float())
            self.post_norm.copy_(post_norm.float())


def save_drafter(drafter: Drafter, directory: Path, extra: dict[str, Any] | None = None) -> None:
    """`drafter.safetensors` (its trained weights and shortlist, not the target's head) and `drafter.json`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # fp16 matrices halve the shipped size (drafts are proposals: their rounding only moves acceptance); norms fp32
    state = {name: (tensor.half() if tensor.is_floating_point() and tensor.ndim > 1 else tensor).contiguous()
             for name, tensor in drafter.state_dict().items()}
    save_file(state, str(directory / "drafter.safetensors"))
    meta = {"drafter": drafter.config.to_json(), **(extra or {})}
    (directory / "drafter.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_drafter(directory: Path, shape: TargetShape, head_rows: Any) -> Drafter:
    """The drafter saved in `directory` for a target of `shape`; `head_rows(ids)` gives the target's head rows of
    token ids `[S]` -> `[S, hidden]`. A drafter of another model's shape is refused."""
    from safetensors.torch import load_file

    weights, meta_path = directory / "drafter.safetensors", directory / "drafter.json"
    if not weights.is_file() or not meta_path.is_file():
        raise ModelError(f"no drafter in {directory} (expected drafter.safetensors and drafter.json)")
    config = DrafterConfig.from_json(json.loads(meta_path.read_text())["drafter"])
    if config.target != shape:
        raise ModelError(f"the drafter in {directory} was trained for a model of shape {config.target}, not {shape}")
    state = load_file(str(weights))
    shortlist = state["shortlist"]
    drafter = Drafter(config, shortlist, head_rows(shortlist))
    drafter.load_state_dict({name: t.float() if t.is_floating_point() else t for name, t in state.items()})
    return drafter.eval()
