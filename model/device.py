"""Where the language model runs: `--device auto|cpu|cuda` resolved once, and the two moves a pass makes across it.

A pass's inputs are laid out on the host (model/runtime/batching.py) and its logits come back to the host once, for the
decoding decisions (acceptance, thresholds). On a GPU a plain `tensor.to("cuda")` from pageable memory waits for
everything queued on the stream before it returns (a host sync); `upload` copies from pinned memory without waiting,
so the layers queued after it never stall the host. On the CPU both moves are no-ops: the same tensors, the same bits.
"""

from __future__ import annotations

import torch

from model.errors import ModelError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None): CUDA when torch sees a GPU, else the CPU. `cuda` without one is a clear error, not a
    silent fallback: a user who asked for the GPU should learn that this torch cannot use it. A `torch.device`
    (already resolved) is checked the same way."""
    choice = str(choice or "auto")
    if choice not in DEVICE_CHOICES and not choice.startswith("cuda:"):
        raise ModelError(f"unknown device {choice!r}: expected one of {', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice.startswith("cuda") and not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise ModelError(f"--device {choice}: torch sees no CUDA GPU ({build}); use --device cpu or auto")
    return torch.device(choice)


def describe(device: torch.device) -> str:
    """One line for logs and reports: which device, and which GPU or how many CPU threads."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device` without a host sync: through pinned memory, non-blocking, on a GPU (the
    caching host allocator keeps the pinned buffer until the copy has run); the tensor itself on the CPU."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (for timings: a GPU runs kernels after the call that queued them)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
