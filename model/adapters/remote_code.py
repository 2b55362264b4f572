"""LLaDA-style checkpoints that ship their own modelling code (`trust_remote_code=True`) as a `Denoiser`.

Such a checkpoint is an `AutoModel` whose forward takes `input_ids` and returns `.logits` over every position, with a
mask token id in its config (LLaDA: `mask_token_id = 126336`). Its code is outside transformers' attention dispatch,
so no cache can be attached from outside: every pass encodes prompt + the whole answer canvas, which is exact (and
`use_cache` is accepted and ignored). Loading runs code from the checkpoint; only load checkpoints you trust.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModel, AutoTokenizer

from model.adapters.masked_lm import end_ids
from model.errors import ModelError


def config_mask_id(config: Any, tokenizer: Any) -> int | None:
    """The mask id a remote-code checkpoint declares: config first (LLaDA), then the tokenizer."""
    for value in (getattr(config, "mask_token_id", None), getattr(tokenizer, "mask_token_id", None)):
        if isinstance(value, int):
            return value
    return None


class RemoteCodeDenoiser:
    """A bidirectional remote-code model; each pass is one full forward over prompt + canvas."""

    block_causal = False

    def __init__(self, model: torch.nn.Module, mask_id: int, eos_ids: frozenset[int], vocab_size: int) -> None:
        self.model = model.eval()
        self.mask_id = int(mask_id)
        self.eos_ids = eos_ids
        self.vocab_size = int(vocab_size)
        self._prompt = torch.zeros(0, dtype=torch.long)

    def fork(self) -> RemoteCodeDenoiser:
        """A second denoiser on the same weights with its own state (for classifier-free guidance)."""
        return RemoteCodeDenoiser(self.model, self.mask_id, self.eos_ids, self.vocab_size)

    def start(self, prompt_ids: list[int], max_new_tokens: int, use_cache: bool) -> None:
        self._prompt = torch.tensor(prompt_ids, dtype=torch.long)

    @torch.no_grad()
    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        offset = len(self._prompt)
        device = next(self.model.parameters()).device
        ids = torch.cat([self._prompt, canvas.cpu()])[None].to(device)  # [1, P + N]
        output = self.model(input_ids=ids)
        logits = getattr(output, "logits", None)
        if logits is None:
            raise ModelError("this remote-code model's forward returned no `logits`; it is not a LLaDA-style denoiser")
        logits = logits[0, offset + lo : offset + hi].float()  # [B, V]
        logits[:, self.mask_id] = -torch.inf
        return logits

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        """Nothing to fold in: there is no cache."""


def load_remote_code(
    spec: str, device: str | None = None, dtype: torch.dtype | None = None, mask_id: int | None = None
) -> tuple[Any, RemoteCodeDenoiser]:
    """Tokenizer and denoiser for a `trust_remote_code` checkpoint (local folder or hub id)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=True)
        model = AutoModel.from_pretrained(spec, trust_remote_code=True, dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise ModelError(f"could not load a remote-code model from {spec!r}: {error}") from error
    mask = mask_id if mask_id is not None else config_mask_id(model.config, tokenizer)
    if mask is None:
        raise ModelError(f"{spec!r} declares no mask_token_id: it cannot drive a masked-diffusion sampler")
    if device:
        model = model.to(device)
    vocab = getattr(model.config, "vocab_size", None) or len(tokenizer)
    return tokenizer, RemoteCodeDenoiser(model, mask, end_ids(tokenizer, model.config), vocab)
