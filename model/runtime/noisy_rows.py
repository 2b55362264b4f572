"""Where a pass's noisy rows are: each sequence's last ones (a decoding pass) or anywhere (training).

Its own module because both the batch layout (model/runtime/batching.py), which finds it on the host before a pass, and
the
passes that run the adapter only on those rows (model/runtime/fast_pass.py, model/bundled/block_diffusion.py) need it.
"""

from __future__ import annotations

import torch

# (first column of the longest noisy run, which columns from there on are noisy in each row, or None when all are)
Suffix = tuple[int, torch.Tensor | None]


def noisy_suffix(noisy: torch.Tensor) -> Suffix | None:
    """When each row of `noisy` ([B, S] bool) is clean tokens followed by noisy ones (every decoding pass, a batch's
    sequences each with their own count): where the longest noisy run starts (S when none is noisy), and which columns
    from there on are noisy in each row (`[B, S - start]`), or None when all are (the same count in every row).
    None for any other pattern. Reads `noisy` (three host syncs on a GPU): callers pass the host-side copy."""
    counts = noisy.sum(dim=1)  # [B]
    s = noisy.shape[1]
    suffixes = torch.arange(s, device=noisy.device)[None, :] >= (s - counts)[:, None]
    if not torch.equal(suffixes, noisy):
        return None
    start = s - int(counts.max())
    return start, None if bool((counts == counts[0]).all()) else noisy[:, start:]
