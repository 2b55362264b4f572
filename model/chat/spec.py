"""`ModelSpec`: what to load, built once by a command line and passed down whole to `model.loading.load_chat_model`.

Light on purpose (no torch, no transformers): a command builds and checks it before anything heavy is imported, so a
wrong flag is refused at once. A GGUF `source` (`model.gguf.locate`) is resolved and its header read and checked
here for the same reason: a missing Ollama name, a truncated file or an unsupported architecture stops the command
before any model loads; gguf-py, which reading a header needs, is imported only for a source that is a GGUF. Every
field's default is what a user gets without the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from model.errors import ModelError
from model.gguf.draft_adapter import NONE, SUFFIX, find_adapter
from model.gguf.locate import open_gguf

if TYPE_CHECKING:
    from model.decoding.sampler import SamplerConfig
    from model.gguf.header import GGUFHeader

DEVICES = ("auto", "cpu", "cuda")
WEIGHTS = ("auto", "int4", "bf16")
PRECISIONS = ("bf16", "fp32")


class _ArgumentAdder(Protocol):
    """An argparse parser or argument group."""

    def add_argument(self, *names: str, **options: Any) -> argparse.Action: ...


@dataclass(frozen=True, slots=True)
class DecodingSettings:
    """A user's changes to a model's own decoding settings (`SamplerConfig`); None keeps the model's own."""

    decoding: str | None = None  # self-speculative | autoregressive | diffusion
    threshold: float | None = None  # diffusion: commit every masked position more confident than this
    block_length: int | None = None  # must be the block the model was trained with, where it has one
    steps_per_block: int | None = None  # diffusion: pass budget per block (default: the block length)
    draft_masks: int | None = None  # self-speculative: tokens drafted ahead per pass
    draft_branches: bool | None = None  # self-speculative: a block of masks after every draft (or one after all)
    use_cache: bool = True  # False: re-encode the prompt every pass (diffusion only, for comparisons)
    # self-speculative: draft with the model's drafter (model/drafting/) where it has one; False: with its adapter's
    # mask rows (for comparisons)
    drafter: bool = True

    @property
    def changed(self) -> tuple[str, ...]:
        """The names of the settings this changes."""
        defaults = dataclasses.asdict(DecodingSettings())
        return tuple(name for name, value in dataclasses.asdict(self).items() if value != defaults[name])

    def apply(self, base: SamplerConfig) -> SamplerConfig:
        """`base` with these changes (validated by `SamplerConfig`). A new block length without a pass budget gets
        one pass a token, the budget a block of that length has by default."""
        steps = self.steps_per_block
        if steps is None and self.block_length is not None:
            steps = self.block_length
        changes = {
            "decoding": self.decoding, "threshold": self.threshold, "block_length": self.block_length,
            "steps_per_block": steps, "draft_masks": self.draft_masks, "draft_branches": self.draft_branches,
        }
        kept = {name: value for name, value in changes.items() if value is not None}
        return dataclasses.replace(base, **kept, use_cache=self.use_cache and base.use_cache)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Which local model to load, where, and how it decodes."""

    # None: the bundled model; a folder with an adapter.json: another block-diffusion adapter for the bundled base;
    # a GGUF (a .gguf path, ollama:NAME[:TAG], a folder holding one .gguf): a user's own model, `gguf`;
    # another folder or a hub id (owner/name): an external diffusion checkpoint
    source: str | None = None
    device: str = "cpu"  # auto: a CUDA GPU when torch sees one (`model.device.resolve_device`)
    weights: str = "auto"  # the bundled model's: int4 (the GGUF's own blocks), bf16, or auto (int4 on a CPU)
    precision: str = "bf16"  # the bundled base's dtype (its adapter stays fp32)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    max_batch: int | None = None  # answers decoded together in one pass, for a back end that batches (None: 8)
    system_prompt: str | None = None  # the model's own, for a chat without one (a request's own comes first)
    # a GGUF's draft adapter folder (`dlm adapt`); None: the one beside the file, if any (model/gguf/draft_adapter.py)
    adapter: str | None = None
    gguf: GGUFHeader | None = field(init=False, default=None, compare=False)  # the header of a GGUF `source`
    draft_adapter: Path | None = field(init=False, default=None, compare=False)  # the adapter a GGUF decodes with

    def __post_init__(self) -> None:
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ModelError(f"unknown device {self.device!r}: expected one of {', '.join(DEVICES)}")
        if self.weights not in WEIGHTS:
            raise ModelError(f"unknown weights {self.weights!r}: choose one of {', '.join(WEIGHTS)}")
        if self.precision not in PRECISIONS:
            raise ModelError(f"unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ModelError(f"max_batch must be at least 1, got {self.max_batch}")
        gguf = open_gguf(self.source) if self.source is not None else None
        object.__setattr__(self, "gguf", gguf)  # frozen: set once, here
        if gguf is None:
            if self.adapter is not None:
                raise ModelError("--adapter is a GGUF model's draft adapter: pass the GGUF with --model")
            return
        if self.weights == "int4":
            raise ModelError("--weights int4 is the bundled model's: a GGUF model decodes on its own blocks (auto, "
                             "on a CPU) or de-quantized (bf16)")
        adapter = find_adapter(gguf, self.adapter)
        object.__setattr__(self, "draft_adapter", adapter)
        if adapter is None and self.decoding.decoding not in (None, "autoregressive"):
            raise ModelError(f"{gguf.path.name} has no draft adapter: it decodes autoregressively only (drop "
                             f"--decoding {self.decoding.decoding}, or make one with `dlm adapt`)")


MODEL_HELP = ("a GGUF (FILE.gguf, ollama:NAME[:TAG], or a folder holding one .gguf), a diffusion checkpoint folder or "
              "hub id, or a block-diffusion adapter folder of the bundled base (default: the bundled model)")
ADAPTER_HELP = (f"a GGUF model's draft adapter folder (made by `dlm adapt`): it then decodes self-speculatively "
                f"(default: the FILE{SUFFIX}/ folder beside the file, if there is one; else autoregressively; "
                f"{NONE}: the file alone)")


def add_model_options(group: _ArgumentAdder) -> list[argparse.Action]:
    """`--model` and `--adapter`, the same on every command that loads a model (read into `ModelSpec`'s `source`
    and `adapter`)."""
    return [group.add_argument("--model", default=None, help=MODEL_HELP),
            group.add_argument("--adapter", default=None, metavar="DIR", help=ADAPTER_HELP)]
