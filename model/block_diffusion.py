"""Block diffusion on top of an autoregressive checkpoint (the bundled default model's form).

An instruction-tuned causal LM becomes a block-diffusion LM with three small additions, in the spirit of Fast-dLLM v2 /
SDAR but sized for a CPU:

* **Block attention.** The answer is split into blocks of `block_length` tokens. A noisy block attends bidirectionally
  to itself and causally to everything before it; finished blocks never see later ones, so their KV cache is exact.
* **Next-token shift kept.** The hidden state at position i still predicts token i+1, so the pretrained head stays
  meaningful: the first token of a block is predicted by the clean position just before it, the others by the noisy
  block's own positions.
* **Adapter on the noisy stream only.** Gated LoRA on every linear layer plus a learned mask embedding. The gate is 0
  for clean tokens (prompt and finished blocks) and 1 for the noisy block, so the cache and each block's first-token
  prediction are exactly the teacher's: the adapter only learns to fill masks, it cannot drift the model's own voice.

Because clean and noisy tokens are told apart by the gate, finishing a block costs nothing extra: its clean encoding is
fused into the first pass of the next block (one forward over `[finished block | noisy block]`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from model.errors import GenerationCancelled, ModelError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PREFILL_CHUNK = 1024  # at most this many prompt tokens per prefill forward (see BlockDiffusionDenoiser._prefill)
MIN_PREFILL_BUCKET = 32


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """Shape of the trained adapter; saved next to its weights so a checkpoint describes itself."""

    block_length: int = 4
    lora_rank: int = 16
    lora_alpha: float = 32.0
    targets: tuple[str, ...] = LORA_TARGETS

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["targets"] = list(self.targets)
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> AdapterConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "targets" in known:
            known["targets"] = tuple(known["targets"])  # type: ignore[arg-type]
        return cls(**known)  # type: ignore[arg-type]


class _Gate:
    """Which tokens get the LoRA, shared by every adapted layer: `mask` `[batch, seq, 1]` of 0/1 for any pattern, or
    `suffix_from` when they are the last rows of every sequence (every decoding pass), so only those rows pay for it.
    Both None: the adapter is on everywhere."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.suffix_from: int | None = None


class GatedLoRALinear(nn.Module):
    """`base(x) + gate * scale * B(A(x))`: LoRA that can be switched off token by token."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gate: _Gate) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank
        self._gate = gate

    def _delta(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * ((x @ self.lora_a.t().to(x.dtype)) @ self.lora_b.t().to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, in]
        out = self.base(x)
        start = self._gate.suffix_from
        if start is not None:  # clean rows [0, start) are exactly the base layer: no LoRA work for them
            if start >= x.shape[1]:
                return out
            if start == 0:
                return out + self._delta(x)
            out[:, start:].add_(self._delta(x[:, start:]))  # in place: Linear's backward never needs its output
            return out
        delta = self._delta(x)
        if self._gate.mask is not None:
            delta = delta * self._gate.mask.to(delta.dtype)
        return out + delta


class BlockDiffusionLM(nn.Module):
    """A causal LM plus the block-diffusion adapter (gated LoRA + mask embedding)."""

    def __init__(self, base: PreTrainedModel, config: AdapterConfig) -> None:
        super().__init__()
        self.base = base
        self.config = config
        self.vocab_size = int(base.config.vocab_size)
        self.mask_id = self.vocab_size  # outside the vocabulary: replaced by `mask_embedding`, never predicted
        self._gate = _Gate()
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        hidden = int(base.config.hidden_size)
        embed = base.get_input_embeddings()
        self.mask_embedding = nn.Parameter(embed.weight.detach().float().mean(0).clone().reshape(hidden))
        self._inject_lora(config)

    def _inject_lora(self, config: AdapterConfig) -> None:
        for module in list(self.base.modules()):
            for child_name, child in list(module.named_children()):
                if child_name in config.targets and isinstance(child, nn.Linear):
                    wrapped = GatedLoRALinear(child, config.lora_rank, config.lora_alpha, self._gate)
                    setattr(module, child_name, wrapped)
        if not any(isinstance(m, GatedLoRALinear) for m in self.base.modules()):
            raise ModelError(f"none of the LoRA targets {config.targets} exist in {type(self.base).__name__}")

    # --- adapter weights ------------------------------------------------------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Only the trained weights: what ships in the package."""
        return {name: p.detach().cpu() for name, p in self.named_parameters() if p.requires_grad}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_parameters())
        missing = [name for name, p in own.items() if p.requires_grad and name not in state]
        unknown = [name for name in state if name not in own]
        if missing or unknown:
            raise ModelError(f"adapter does not fit this model: missing {missing[:3]}, unknown {unknown[:3]}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))

    def cast_adapter(self, dtype: torch.dtype) -> None:
        """Store the adapter in `dtype` (bf16 for CPU inference). Only the adapter: casting the whole model would also
        cast the rotary `inv_freq` buffer and blur positions."""
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.to(dtype)

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    # --- forward --------------------------------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings with every `mask_id` replaced by the learned mask embedding."""
        is_mask = input_ids == self.mask_id
        embeds = self.base.get_input_embeddings()(input_ids.masked_fill(is_mask, 0))
        return torch.where(is_mask.unsqueeze(-1), self.mask_embedding.to(embeds.dtype), embeds)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        position_ids: torch.Tensor,  # [B, S]
        attention_bias: torch.Tensor,  # [B, 1, S, K + S] additive float (0 attend, -inf not)
        noisy: torch.Tensor,  # [B, S] bool: which tokens get the adapter
        cache: DynamicCache | None,
        keep: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """Logits `[B, S, vocab]`; appends this call's keys/values to `cache` when given.

        `keep` is the base model's `logits_to_keep` (0: every position; k: the last k; a 1-D tensor: those
        positions): the vocabulary projection is the largest matmul per token, so a caller that needs one row of
        many (the prefill) asks for it.
        """
        self._gate.mask, self._gate.suffix_from = None, noisy_suffix_start(noisy)
        if self._gate.suffix_from is None:
            self._gate.mask = noisy.unsqueeze(-1).float()
        try:
            out = self.base(
                inputs_embeds=self.embed(input_ids),
                position_ids=position_ids,
                attention_mask=attention_bias.to(self.base.dtype),
                past_key_values=cache,
                use_cache=cache is not None,
                logits_to_keep=keep,
            )
        finally:
            self._gate.mask, self._gate.suffix_from = None, None
        return out.logits


def noisy_suffix_start(noisy: torch.Tensor) -> int | None:
    """Where the noisy tokens start when every row of `noisy` ([B, S] bool) is clean tokens followed by the same number
    of noisy ones (S when none is noisy); None for any other pattern."""
    counts = noisy.sum(dim=1)  # [B]
    start = noisy.shape[1] - int(counts[0])
    if bool((counts == counts[0]).all()) and bool(noisy[:, start:].all()):
        return start
    return None


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a bool "may attend" mask into the additive form eager and SDPA attention both accept."""
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed, torch.finfo(dtype).min)


def prefill_bucket(n: int) -> int:
    """The smallest of 32, 48, 64, 96, 128, 192, ... (powers of two and 1.5 times them) holding `n` tokens."""
    size = MIN_PREFILL_BUCKET
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` cached positions in every layer (drops the noisy block's keys after a pass)."""
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


class BlockDiffusionDenoiser:
    """`Denoiser` over a `BlockDiffusionLM`: exact prefix cache, one forward per pass.

    The canvas is the answer region; the prompt lives in the cache. A pass over block `[lo, hi)` feeds the tokens of
    the block finished just before it (clean, if any, not yet cached) followed by the noisy block. Logits for the
    block's first position come from the last clean position (the teacher's own next-token prediction); logits for
    position `lo + j` (j >= 1) from noisy position `lo + j - 1`.
    """

    block_causal = True

    def __init__(self, model: BlockDiffusionLM, eos_ids: Iterable[int]) -> None:
        self.model = model
        self.mask_id = model.mask_id
        # The mask id sits just past the tokenizer's vocabulary; logits get one extra column for it, always -inf.
        self.vocab_size = model.vocab_size + 1
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.block_length = model.config.block_length
        self._prompt: list[int] = []
        self._use_cache = True
        self._cache: DynamicCache | None = None
        self._cached_ids: list[int] = []  # the tokens whose keys/values the cache holds (kept for the next prompt)
        self.reused_tokens = 0  # prompt tokens the last start() found already in the cache
        self.reuse_prompt_cache = True  # False: encode every prompt from scratch (for comparisons)
        self._next_logits: torch.Tensor | None = None  # [vocab] prediction for the first uncached position
        self._pending: tuple[int, int] | None = None  # answer slice finished but not yet in the cache
        self.prefill_cancel: threading.Event | None = None  # checked between prefill chunks (set by the engine)
        self._fed: list[int] = []  # clean tokens of the last verify() pass

    @property
    def dtype(self) -> torch.dtype:
        return self.model.base.dtype

    def start(self, prompt_ids: list[int], max_new_tokens: int, use_cache: bool) -> None:
        if not prompt_ids:
            raise ModelError("the prompt is empty: nothing to condition the answer on")
        self._prompt = list(prompt_ids)
        self._use_cache = use_cache
        self._pending = None
        self._next_logits = None
        cache, cached_ids = self._cache, self._cached_ids
        self._cache, self._cached_ids = None, []  # stays empty if the prefill fails
        self.reused_tokens = 0
        if not use_cache:
            return
        # A conversation's next prompt starts with the last one (system prompt, history, even the answer just
        # given): keep those positions' keys/values and encode only the rest. At least one token is encoded, for
        # the logits that predict the answer's first token.
        reuse = 0
        if cache is not None and self.reuse_prompt_cache:
            reuse = min(common_prefix(cached_ids, self._prompt), len(self._prompt) - 1)
        if reuse == 0:
            cache = DynamicCache()
        else:
            crop_cache(cache, reuse)
        self._next_logits = self._prefill(cache, self._prompt, reuse)
        self._cache, self._cached_ids = cache, list(self._prompt)
        self.reused_tokens = reuse

    @torch.inference_mode()
    def _prefill(self, cache: DynamicCache, prompt: list[int], start: int) -> torch.Tensor:
        """Encode `prompt[start:]` into `cache` (which holds `prompt[:start]`); return the logits predicting the
        answer's first token.

        Each forward is padded (with the prompt's own last token) up to a `prefill_bucket` size and the padding
        cropped from the cache afterwards, which is exact because prompt positions attend only backwards. Why:
        a bf16 matmul on the CPU builds and keeps a oneDNN kernel for every new input shape, so prefilling every
        turn's prompt at its own length grew a server's memory by megabytes a turn. Buckets bound the shapes to a
        dozen for ~15 % more prefill work on average; prompts beyond `PREFILL_CHUNK` go in chunks of that size, and
        `prefill_cancel` is checked before each chunk, so a long prompt does not hold the model after its answer was
        cancelled (the cache then stays empty: `start` sets it only after a complete prefill).
        """
        logits = torch.empty(0)
        for lo in range(start, len(prompt), PREFILL_CHUNK):
            if self.prefill_cancel is not None and self.prefill_cancel.is_set():
                raise GenerationCancelled("cancelled while encoding the prompt")
            part = prompt[lo : lo + PREFILL_CHUNK]
            last = len(part) - 1
            size = prefill_bucket(len(part))
            ids = torch.tensor([part + [part[-1]] * (size - len(part))])
            logits = self._run(ids, noisy_from=size, cache=cache, past=lo, keep=torch.tensor([last]))
            crop_cache(cache, lo + len(part))
        return logits[0, -1]

    @torch.inference_mode()
    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        p = len(self._prompt)
        noisy_ids = canvas[lo:hi]
        if not self._use_cache:
            clean = torch.tensor(self._prompt + canvas[:lo].tolist())
            ids = torch.cat([clean, noisy_ids]).unsqueeze(0)
            logits = self._run(ids, noisy_from=clean.shape[0], cache=None, past=0)[0]
            # from the last clean position on: it predicts the block's first token
            return self._shifted(logits[clean.shape[0] - 1], logits[clean.shape[0] :], hi - lo)

        assert self._cache is not None  # set by start() in cached mode
        clean_ids = canvas[self._pending[0] : self._pending[1]] if self._pending else canvas[:0]
        cached_len = len(self._cached_ids)  # absolute positions held in the cache
        if cached_len != p + lo - clean_ids.shape[0]:
            raise ModelError("blocks must be denoised in order: the cache does not end where this block starts")
        ids = torch.cat([clean_ids, noisy_ids]).unsqueeze(0)
        n_clean = clean_ids.shape[0]
        # Every position's logits, although only those from the last clean one on are used: asking the base model
        # for just those (`logits_to_keep`) made a pass slower on this CPU, not faster (bf16, 45 vs 35 ms a pass,
        # measured); the prefill, which needs one row of many, does ask.
        logits = self._run(ids, noisy_from=n_clean, cache=self._cache, past=cached_len)[0]
        if n_clean:
            self._next_logits, logits = logits[n_clean - 1], logits[n_clean:]
            self._pending = None
            self._cached_ids.extend(clean_ids.tolist())
        crop_cache(self._cache, len(self._cached_ids))
        assert self._next_logits is not None
        return self._shifted(self._next_logits, logits, hi - lo)

    # --- self-speculative and autoregressive decoding (model/speculative.py) ----------------------------------------
    def start_verify(self, prompt_ids: list[int]) -> None:
        """Cache every prompt token but the last, reusing what the cache already holds of it (the conversation so
        far); the first pass feeds the last prompt token, whose row predicts the answer's first token."""
        if not prompt_ids:
            raise ModelError("the prompt is empty: nothing to condition the answer on")
        self._prompt = list(prompt_ids)
        self._use_cache = True
        self._pending, self._next_logits = None, None
        cache, cached_ids = self._cache, self._cached_ids
        self._cache, self._cached_ids = None, []  # stays empty if the prefill fails
        prefix = self._prompt[:-1]
        reuse = 0
        if cache is not None and self.reuse_prompt_cache:
            reuse = common_prefix(cached_ids, prefix)
        if reuse == 0:
            cache = DynamicCache()
        else:
            crop_cache(cache, reuse)
        if reuse < len(prefix):
            self._prefill(cache, prefix, reuse)
        self._cache, self._cached_ids = cache, prefix
        self.reused_tokens = reuse

    @torch.inference_mode()
    def verify(self, tokens: list[int], masks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over `[tokens | masks]`: tokens clean and causal with the gate off (exactly the teacher), masks
        with the gate on, bidirectional among themselves and attending to every clean token; clean rows never see
        the masks. Returns (clean logits `[len(tokens), V]`, mask logits `[masks, V]`); all of it stays cached until
        `keep`."""
        if self._cache is None:
            raise ModelError("verify() before start_verify(): there is no cache to extend")
        self._fed = list(tokens)
        ids = torch.tensor([tokens + [self.mask_id] * masks])  # [1, k + 1 + m]
        logits = self._run(ids, noisy_from=len(tokens), cache=self._cache, past=len(self._cached_ids))[0]
        return logits[: len(tokens)], logits[len(tokens) :]

    def keep(self, count: int) -> None:
        """Keep the first `count` tokens of the last `verify` pass in the cache; drop the rejected drafts and masks."""
        self._cached_ids.extend(self._fed[:count])
        crop_cache(self._cache, len(self._cached_ids))

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        # Encoded lazily: fused into the next block's first pass, so a finished answer costs no extra forward.
        self._pending = (lo, hi)

    def _shifted(self, first: torch.Tensor, noisy_logits: torch.Tensor, length: int) -> torch.Tensor:
        out = torch.cat([first.unsqueeze(0), noisy_logits[: length - 1]]).float()[:, : self.model.vocab_size]
        return torch.cat([out, torch.full((length, 1), -torch.inf, device=out.device)], dim=1)

    def _run(
        self, ids: torch.Tensor, noisy_from: int, cache: DynamicCache | None, past: int, keep: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """Forward `ids` (`[1, S]`): positions before `noisy_from` are clean (causal), the rest one noisy block."""
        device = self.model.base.device  # the sampler's canvas lives on the CPU; the network may not
        s = ids.shape[1]
        q = torch.arange(s, device=device)
        causal = q.unsqueeze(1) >= q.unsqueeze(0)
        in_block = (q.unsqueeze(1) >= noisy_from) & (q.unsqueeze(0) >= noisy_from)
        allowed_new = causal | in_block
        allowed = torch.cat([torch.ones(s, past, dtype=torch.bool, device=device), allowed_new], dim=1)
        bias = additive_mask(allowed)[None, None]
        positions = (past + q).unsqueeze(0)
        noisy = (q >= noisy_from).unsqueeze(0)
        keep = keep.to(device) if isinstance(keep, torch.Tensor) else keep
        return self.model(ids.to(device), positions, bias, noisy, cache, keep)


def save_adapter(model: BlockDiffusionLM, directory: Path, extra: dict[str, object] | None = None) -> None:
    """Write `adapter.safetensors` and `adapter.json` (config plus free-form training facts)."""
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # fp16 halves the shipped size; LoRA factors lose nothing measurable at this precision
    state = {
        name: tensor.to(torch.float16 if tensor.ndim > 1 else torch.float32).contiguous()
        for name, tensor in model.adapter_state().items()
    }
    save_file(state, str(directory / "adapter.safetensors"))
    meta = {"adapter": model.config.to_json(), **(extra or {})}
    (directory / "adapter.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_adapter(model_base: PreTrainedModel, directory: Path) -> BlockDiffusionLM:
    """Rebuild a `BlockDiffusionLM` from a base model and a saved adapter folder."""
    import json

    from safetensors.torch import load_file

    weights, meta_path = directory / "adapter.safetensors", directory / "adapter.json"
    if not weights.is_file() or not meta_path.is_file():
        raise ModelError(f"no block-diffusion adapter in {directory} (expected adapter.safetensors and adapter.json)")
    meta = json.loads(meta_path.read_text())
    model = BlockDiffusionLM(model_base, AdapterConfig.from_json(meta["adapter"]))
    model.load_adapter_state(load_file(str(weights)))
    return model
