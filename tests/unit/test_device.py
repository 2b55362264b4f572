"""The language model on a device (model/device.py): the same tests on `cpu` and, where torch sees a GPU, on `cuda`.

Host syncs: on a GPU nothing inside a pass may wait for the device (a pass of a 135M model is a few hundred small
kernels, and every wait drains the queue). There the check is torch's own sync detector; on the CPU a stand-in counts
the calls that would be syncs on a GPU: reads of a tensor's values into Python and uploads that block.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from model.bundled.backend import BlockDiffusionBackend
from model.device import describe, resolve_device, synchronize, upload
from model.errors import ModelError
from model.runtime.batching import Feed, SlotCache, batched_pass, keep, pass_layout, prefill
from model.runtime.fast_pass import FastPass
from scripts.report_lib.tiny_models import LLAMA_EOS
from tests.unit.drive import reference_logits, sequence
from tests.unit.test_batching import MODES, alone, prompts, requests, stream
from tests.unit.test_self_speculative import adapted, one_thread  # noqa: F401  (autouse: tiny tensors, 1 thread)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")),
]
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSyncs:
    """Counts, while `watching`, what would make the host wait for a GPU: a tensor's values read into Python
    (`READS`, `torch.equal`) and a copy to a device that is not non-blocking (`Tensor.to`/`cuda` with a device,
    `torch.tensor(..., device=...)`). `model.device.upload` on the CPU copies nothing and is not counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[str] = Counter()
        self.on = False
        for name in READS:
            self._wrap(monkeypatch, torch.Tensor, name, lambda *a, **k: True)
        self._wrap(monkeypatch, torch, "equal", lambda *a, **k: True)
        self._wrap(monkeypatch, torch, "tensor", lambda *a, **k: "device" in k)
        self._wrap(monkeypatch, torch.Tensor, "cuda", lambda *a, **k: not k.get("non_blocking"))
        self._wrap(monkeypatch, torch.Tensor, "to", self._blocking_move)

    @staticmethod
    def _blocking_move(*args: Any, **kwargs: Any) -> bool:
        moves = "device" in kwargs or any(isinstance(a, torch.device | str) for a in args[1:])
        return moves and not kwargs.get("non_blocking")

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, counts: Callable[..., bool]) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.on and counts(*args, **kwargs):
                self.counts[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False


def watch_passes(monkeypatch: pytest.MonkeyPatch, device: str) -> Callable[[], Counter[str]]:
    """Make every `FastPass` call run under the sync check for `device`; returns the stand-in's counts (CPU)."""
    call = FastPass.__call__
    if device == "cuda":
        def strict(self: FastPass, *args: Any, **kwargs: Any) -> torch.Tensor:
            torch.cuda.set_sync_debug_mode("error")  # any host sync inside the pass raises
            try:
                return call(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        monkeypatch.setattr(FastPass, "__call__", strict)
        return Counter

    syncs = HostSyncs(monkeypatch)

    def counted(self: FastPass, *args: Any, **kwargs: Any) -> torch.Tensor:
        with syncs.watching():
            return call(self, *args, **kwargs)

    monkeypatch.setattr(FastPass, "__call__", counted)
    return lambda: syncs.counts


def test_auto_is_cuda_when_torch_sees_a_gpu_and_cuda_without_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelError, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ModelError, match="unknown device"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert describe(torch.device("cpu")).startswith("cpu (")


@pytest.mark.parametrize("device", DEVICES)
def test_upload_gives_the_same_values_on_the_device_and_the_same_tensor_on_the_cpu(device: str) -> None:
    host = torch.arange(12).reshape(3, 4)[:, 1:]  # a view: pinning copies it
    moved = upload(host, torch.device(device))
    synchronize(torch.device(device))
    assert moved.device.type == device
    assert torch.equal(moved.cpu(), host)
    if device == "cpu":
        assert moved is host


def tiny_on(device: str) -> BlockDiffusionBackend:
    return BlockDiffusionBackend(adapted().to(device), [LLAMA_EOS])


@pytest.mark.parametrize("device", DEVICES)
def test_a_batched_pass_on_the_device_gives_each_sequence_its_cache_free_logits(device: str) -> None:
    denoiser = tiny_on(device)
    model = denoiser.model
    mask = model.mask_id
    contexts = prompts(3, seed=1)
    cache = SlotCache(3)
    for slot, context in enumerate(contexts):
        prefill(model, cache, slot, context)
    # slots 0 and 2: not contiguous (the gathered path); rows of each decoding mode side by side
    slots, feeds = [0, 2], [Feed((5, 6, 7), (mask,) * 4), Feed((8,), (9, mask, mask))]
    outs = batched_pass(model, cache, slots, feeds)
    for slot, feed, (clean, noisy) in zip(slots, feeds, outs, strict=True):
        assert clean.device.type == "cpu"  # the logits come back to the host, for the decoding decisions
        context = cache.slots[slot].ids
        expected = reference_logits(model, context + list(feed.clean), feed.noisy)[len(context) :].float().cpu()
        torch.testing.assert_close(clean, expected[: len(feed.clean)], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(noisy, expected[len(feed.clean) :], atol=1e-4, rtol=1e-4)
        keep(cache, slot, feed, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_nothing_inside_a_batched_pass_waits_for_the_device(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    denoiser = tiny_on(device)
    model = denoiser.model
    mask = model.mask_id
    cache = SlotCache(3)
    for slot, context in enumerate(prompts(3, seed=2)):
        prefill(model, cache, slot, context)
    counts = watch_passes(monkeypatch, device)
    # uneven noisy rows (the adapter masked per sequence) and slots 0, 2 (gathered keys): the paths that read back
    batched_pass(model, cache, [0, 2], [Feed((5, 6), (mask,) * 3), Feed((7,), (mask,))])
    prefill(model, cache, 1, prompts(1, seed=4)[0])
    assert counts() == Counter()


def test_the_stand_in_counts_the_reads_a_pass_makes_when_it_finds_the_noisy_rows_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above can fail: a pass asked to find the noisy rows on the device reads them back three times."""
    model = tiny_on("cpu").model
    cache = SlotCache(1)
    prefill(model, cache, 0, [5, 6, 7])
    ids, positions, noisy, allowed = pass_layout([3], [Feed((8,), (model.mask_id,) * 2)], 32)
    from model.runtime.batching import additive_mask

    counts = watch_passes(monkeypatch, "cpu")
    cache.bind([0], [3])
    model.inference_pass()(ids, positions, additive_mask(allowed), noisy, cache)
    assert counts() == Counter({"equal": 1, "__int__": 1, "__bool__": 1})


@pytest.mark.parametrize("device", DEVICES)
def test_every_decoding_mode_on_the_device_gives_the_cpu_answer(device: str) -> None:
    """Answers decoded together by the batch runner on `device` (fp32) are the answers decoded alone on the CPU."""
    from model.chat.engine import DiffusionChatModel
    from scripts.report_lib.tiny_models import byte_tokenizer

    chat = DiffusionChatModel("tiny", byte_tokenizer(), tiny_on(device), MODES["diffusion"])
    cases = requests(4)
    runs = [chat.backend.runner.submit(sequence(chat, prompt, length, config, options))
            for prompt, config, length, options in cases]
    for run, (prompt, config, length, options) in zip(runs, cases, strict=True):
        assert stream(iter(run)) == alone(prompt, config, length, options), config.decoding
    assert {config.decoding for _, config, _, _ in cases} >= {"self-speculative", "autoregressive", "diffusion"}
