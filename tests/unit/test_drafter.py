"""The drafter on the target's hidden rows (model/drafting/), on a tiny GGUF model through the decode kernel: the
tapped pass leaves the pass's logits as they were, drafted answers are the autoregressive ones token for token, the
packed drafter drafts what its torch form drafts, training teaches it the target's answers, and a drafter of another
model's shape is refused."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_answers import TEXTS, answer

from model.bundled import backend as backend_module
from model.chat import ChatMessage
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.decoding.step import Feed
from model.drafting.context import DraftingContext
from model.drafting.drafter import Drafter, DrafterConfig, TargetShape, load_drafter, save_drafter
from model.drafting.native import NativeDrafter
from model.drafting.training import TrainSettings, acceptance, shortlist_of, traced_answers, train_drafter
from model.errors import ModelError
from model.loading import load_chat_model
from model.runtime.batching import KEY_MULTIPLE, PassRows, SlotCache, batched_pass, prefill, tapped_pass
from model.runtime.int4_weights import available
from scripts.report_lib.tiny_gguf import write_model

T = GGMLQuantizationType
pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> DiffusionChatModel:
    path = write_model(tmp_path_factory.mktemp("drafter") / "d.gguf", "llama",
                       lambda name: T.Q8_0 if "token_embd" in name else T.Q4_0, seed=3).path
    model = load_chat_model(ModelSpec(source=str(path)))
    assert isinstance(model, DiffusionChatModel)
    assert model.backend.model.inference_pass().native is not None  # type: ignore[attr-defined]
    return model


def target_of(chat: DiffusionChatModel):  # type: ignore[no-untyped-def]
    return chat.backend.model  # type: ignore[attr-defined]


def drafter_for(chat: DiffusionChatModel, seed: int = 0, shortlist: int = 64) -> Drafter:
    model = target_of(chat)
    shape = TargetShape.of(model.base.config)
    torch.manual_seed(seed)
    config = DrafterConfig.for_target(shape, block=4, shortlist=shortlist)
    ids = torch.arange(config.shortlist)
    head = torch.randn(config.shortlist, shape.hidden) * 0.5
    return Drafter(config, ids, head).eval()


def test_a_tapped_pass_gives_the_same_logits_and_its_last_tap_is_the_final_residual(chat: DiffusionChatModel) -> None:
    model = target_of(chat)
    fast = model.inference_pass()
    layers = len(model.base.model.layers)
    tokens = [3 + (5 * i) % 200 for i in range(21)]
    feed = Feed(clean=tuple(tokens[-3:]))
    plain, tapped_cache = SlotCache(1), SlotCache(1)
    prefill(model, plain, 0, tokens[:-3])
    prefill(model, tapped_cache, 0, tokens[:-3])
    [(reference, _)] = batched_pass(model, plain, [0], [feed])
    [(logits, _)], [rows] = tapped_pass(model, tapped_cache, [0], [dataclasses.replace(feed, taps=(1, layers))])
    assert torch.equal(logits, reference)
    assert rows is not None and rows.shape == (3, 2, model.base.config.hidden_size)
    # the last tap is the residual the head reads: the pass's logits come from it
    fast_rows = PassRows.of([0], [len(tokens) - 3], [feed], KEY_MULTIPLE)
    assert torch.equal(fast.logits(rows[:, 1].contiguous(), fast_rows.coarse), reference)
    assert not torch.equal(rows[:, 0], rows[:, 1])


class OracleDrafting(DraftingContext):
    """The real drafting context (its passes run), but drafts are the reference answer wrong at random places: so
    passes accept several drafts, reject others, and both paths of verification and the context's growth run."""

    def __init__(self, *args, reference: list[int], seed: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.reference, self.rng = reference, random.Random(seed)
        self.kept = self.calls = 0

    def extend(self, tapped: torch.Tensor) -> None:
        self.kept += tapped.shape[0]
        super().extend(tapped)

    def draft(self, last: int) -> tuple[list[int], list[float]]:
        drafts, confidence = super().draft(last)
        self.calls += 1
        at = self.kept  # answer tokens known so far: the context holds the prompt's last token and kept ones
        truth = self.reference[at : at + self.block]
        return [t if self.rng.random() > 0.25 else (t + 1) % 200 for t in truth] or drafts, confidence


@pytest.mark.parametrize("layout", ["fixed", "adaptive"])
def test_drafted_answers_are_the_autoregressive_ones_token_for_token(
    chat: DiffusionChatModel, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Fixed: every pass verifies the drafter's block, drafted right after the pass before. Adaptive, with costs
    seeded so that two drafts a pass pay: the drafter runs only when the next pass verifies drafts (or the answer's
    lead shows them), lazily, before that pass."""
    backend = chat.backend
    autoregressive = {text: answer(chat, text, 24) for text in TEXTS}
    monkeypatch.setattr(chat, "sampler", dataclasses.replace(chat.sampler, decoding="self-speculative", draft_masks=4,
                                                             draft_layout=layout))
    made: list[OracleDrafting] = []
    backend.use_drafter(drafter_for(chat), prior=(0.9, 0.8, 0.7, 0.6))  # type: ignore[attr-defined]
    policy = backend.draft_policy(chat.sampler)  # type: ignore[attr-defined]
    assert (policy is None) == (layout == "fixed")
    if policy is not None:
        policy.seed([10.0, 10.5, 11.0, 30.0, 40.0])
    try:
        for seed, text in enumerate(TEXTS):
            prompt, reference = autoregressive[text]

            def oracle(*args, reference=reference, seed=seed, **kwargs):  # type: ignore[no-untyped-def]
                made.append(OracleDrafting(*args, reference=reference, seed=seed, **kwargs))
                return made[-1]

            monkeypatch.setattr(backend_module, "DraftingContext", oracle)
            assert answer(chat, text, 24) == (prompt, reference)
    finally:
        backend.use_drafter(None)  # type: ignore[attr-defined]
    assert len(made) == len(TEXTS)
    # every answer token but the last went into the drafter's context, and passes accepted drafts
    assert [m.kept for m in made] == [len(autoregressive[t][1]) for t in TEXTS]
    assert sum(m.calls for m in made) < sum(m.kept for m in made)


def test_the_packed_drafter_drafts_what_its_torch_form_drafts(chat: DiffusionChatModel) -> None:
    drafter = drafter_for(chat, seed=1)
    shape = drafter.config.target
    torch.manual_seed(2)
    table = torch.randn(shape.vocab, shape.hidden)
    steps = [torch.randn(n, len(drafter.config.taps), shape.hidden) * 3 for n in (1, 2, 1, 3, 1, 4, 2)]
    drafted = []
    for native in (None, NativeDrafter(drafter)):
        context = DraftingContext(drafter, lambda ids: table[ids], 9, native)
        out = []
        for i, tapped in enumerate(steps):
            context.extend(tapped)
            out.append(context.draft(10 + i))
        drafted.append(out)
    torch_form, packed = drafted
    agree = sum(a[0] == b[0] for a, b in zip(torch_form, packed, strict=True))
    assert agree >= len(steps) - 1  # 8-bit weights may flip a near tie
    for (_, p), (_, q) in zip(torch_form, packed, strict=True):
        assert max(abs(x - y) for x, y in zip(p, q, strict=True)) < 0.05


@pytest.mark.slow
def test_training_on_the_targets_answers_teaches_the_drafter(chat: DiffusionChatModel, tmp_path: Path) -> None:
    model = target_of(chat)
    fast = model.inference_pass()
    drafter = drafter_for(chat)
    prompts = [chat.prompt_ids([ChatMessage("user", t)]) for t in (*TEXTS, "the world is", "hello hello", "a b c")]
    eos = frozenset(chat.backend.eos_ids)  # type: ignore[attr-defined]
    traced = traced_answers(fast, prompts, drafter.config.taps, 16, eos)
    assert [t.tokens[t.prompt:] for t in traced[:2]] == [answer(chat, text, 16)[1] for text in TEXTS[:2]]
    assert all(t.tapped.shape[0] == len(t.tokens) - 1 for t in traced)
    table = torch.randn(drafter.config.target.vocab, drafter.config.target.hidden)
    shortlist = shortlist_of(traced, 64, ())
    head = torch.randn(len(shortlist), drafter.config.target.hidden) * 0.5
    drafter = Drafter(dataclasses.replace(drafter.config, shortlist=len(shortlist)), shortlist, head)

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return table[ids]

    before = acceptance(drafter, traced, embed)
    for _ in train_drafter(drafter, traced, embed, TrainSettings(steps=200, batch=4, anchors=8, lr=3e-3)):
        pass
    after = acceptance(drafter, traced, embed)
    print("acceptance before", before, "after", after)
    assert after[0] > before[0] + 0.3 and after[0] > 0.5
    save_drafter(drafter, tmp_path / "d", {"acceptance": {"after": after}})
    again = load_drafter(tmp_path / "d", drafter.config.target, lambda ids: head)  # rows in the shortlist's order
    # saved in fp16: the same drafter up to that rounding
    assert all(abs(a - b) <= 0.05 for a, b in zip(acceptance(again, traced, embed), after, strict=True))
    assert torch.allclose(again.q.weight, drafter.q.weight, rtol=1e-3, atol=1e-4)
    other = dataclasses.replace(drafter.config.target, layers=drafter.config.target.layers + 1)
    with pytest.raises(ModelError, match="trained for a model of shape"):
        load_drafter(tmp_path / "d", other, lambda ids: head)
