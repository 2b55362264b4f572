"""An external checkpoint's `Denoiser` as a chat back end: the sampler's `generate` over one answer at a time.

Such checkpoints keep one prefix cache per denoiser, so answers take turns on it (`OneAtATime`). They are masked
samplers: they decode by diffusion only (self-speculative and autoregressive decoding need a block-diffusion model
whose clean tokens see exactly an autoregressive teacher).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from model.chat.backend import AnswerPlan, OneAtATime
from model.decoding.denoiser import Denoiser, Forkable
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig, generate
from model.errors import ModelError


class SamplerBackend(OneAtATime):
    """`denoiser`'s answers through `generate`; classifier-free guidance (`cfg_scale`) gets a second state over the
    same weights when the denoiser can make one (`Forkable`)."""

    def __init__(self, name: str, denoiser: Denoiser, config: SamplerConfig) -> None:
        super().__init__(self._passes, self._refuse, constrains=True)
        self.name = name
        self.denoiser = denoiser
        self._unconditional = denoiser.fork() if config.cfg_scale > 0 and isinstance(denoiser, Forkable) else None

    def _passes(self, plan: AnswerPlan, cancel: threading.Event | None) -> Iterator[Refinement]:
        return generate(self.denoiser, plan.prompt, plan.length, plan.config, cancel, self._unconditional, plan.guard,
                        plan.options, plan.grammar)

    def _refuse(self, config: SamplerConfig) -> None:
        if config.decoding != "diffusion":
            raise ModelError(
                f"{self.name} cannot decode {config.decoding}: that needs a block-diffusion model with a gated adapter "
                "(clean tokens see exactly the autoregressive teacher); use --decoding diffusion"
            )
