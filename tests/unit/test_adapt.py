"""`dlm adapt` and `--adapter` on tiny GGUF files written by the test: the recipe trains a few steps and resumes, the
adapter loads (given, or found beside the file) and drafts on the file's own blocks, self-speculative answers equal
the autoregressive ones token for token, and an adapter made for another model is refused in one line."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_answers import answers_per_pass, assert_refused_by_a_model_of_another_shape

from model.chat.engine import DiffusionChatModel
from model.chat.spec import DecodingSettings, ModelSpec
from model.cli import main
from model.gguf.draft_adapter import beside
from model.gguf.locate import open_gguf
from model.loading import load_chat_model
from model.runtime.int4_weights import available
from model.training.adapt import TEACHER_SYSTEM_PROMPT, adapt
from model.training.settings import AdaptSettings, Recipe
from scripts.report_lib.tiny_gguf import write_model
from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

T = GGMLQuantizationType
PROMPTS = ["hello the world", "the the hello", "tell the thing", "what the hell", "he the", "the end"]
HELDOUT = ["hello there", "the other the"]
NEWLINE = 10  # ChatML's prompt ends "assistant\n": byte 10, token 10 of the tiny byte-level vocabulary
SETTINGS = AdaptSettings(max_new_tokens=12, teacher_batch=4,
                         recipe=Recipe(batch=2, max_steps=3, save_every=2, eval_every=2, bf16=False, minutes=5))


def train(model: Path, out: Path, steps: int) -> tuple[list[float], list[float], int]:
    header = open_gguf(str(model))
    assert header is not None
    settings = replace(SETTINGS, recipe=replace(SETTINGS.recipe, max_steps=steps))
    result = adapt(header, out, settings, (PROMPTS, HELDOUT))
    return result.before, result.after, result.steps


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny llama GGUF in Q8_0, the adapter `adapt` trained for it, its LoRA then scaled up so that drafts differ
    from the model's own tokens and exactness is tested against drafts that are often wrong)."""
    root = tmp_path_factory.mktemp("adapt")
    model = write_model(root / "tiny.gguf", "llama", T.Q8_0, tied=True, seed=5).path
    out = root / "adapter"
    before, after, steps = train(model, out, 3)
    assert steps == 3 and len(before) == len(after) == SETTINGS.recipe.draft_masks
    return model, out


def test_adapt_trains_writes_the_adapter_and_resumes(adapted: tuple[Path, Path]) -> None:
    model, out = adapted
    meta = json.loads((out / "adapter.json").read_text())
    assert meta["teacher"]["architecture"] == "llama" and meta["training"]["steps"] == 3
    assert [m["step"] for m in meta["acceptance"]["by_step"]] == [0, 2, 3]
    assert all(0.0 <= a <= 1.0 for m in meta["acceptance"]["by_step"] for a in m["acceptance"])
    answers = (out / "teacher.jsonl").read_text().splitlines()
    assert len(answers) == len(PROMPTS)
    first_weights = (out / "adapter.safetensors").read_bytes()
    resumed = out.parent / "resumed"
    shutil.copytree(out, resumed)
    _, _, steps = train(model, resumed, 5)
    assert steps == 5  # from the checkpoint's step 3, not from 0
    assert (resumed / "teacher.jsonl").read_text().splitlines() == answers  # answers kept, none written twice
    state = torch.load(resumed / "checkpoint.pt", weights_only=False)
    assert [h["step"] for h in state["history"]] == [1, 2, 3, 4, 5]
    assert (resumed / "adapter.safetensors").read_bytes() != first_weights


def test_the_teacher_answers_under_the_voice_pipelines_prompt() -> None:
    assert TEACHER_SYSTEM_PROMPT == SPOKEN_SYSTEM_PROMPT


def with_weights(adapter: Path, folder: Path, lora_b_scale: float, mask_embedding: torch.Tensor | None = None) -> Path:
    """A copy of `adapter` in `folder` whose LoRA B factors are random (`lora_b_scale` > 0) or zero, and whose mask
    embedding is `mask_embedding` when given."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, folder)
    weights = load_file(str(folder / "adapter.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if "lora_b" in name:
            weights[name] = (torch.randn(tensor.shape, generator=generator) * lora_b_scale).to(tensor.dtype)
    if mask_embedding is not None:
        weights["mask_embedding"] = mask_embedding.float()
    save_file(weights, str(folder / "adapter.safetensors"))
    return folder


@pytest.mark.skipif(available() is not None, reason=str(available()))
@pytest.mark.parametrize("drafts", ["wrong", "right"])
def test_with_the_adapter_the_model_drafts_on_its_own_blocks_and_answers_as_autoregressive_decoding(
    adapted: tuple[Path, Path], tmp_path: Path, drafts: str
) -> None:
    """"wrong": the trained adapter's LoRA replaced by a loud random one, so drafts are rejected and any LoRA leaking
    into the clean rows changes the answer. "right": a model whose layers are near zero (greedy answers repeat the
    prompt's last token) and an adapter whose masks stand for that token, so drafts are accepted and committed."""
    model, out = adapted
    if drafts == "wrong":
        adapter = with_weights(out, tmp_path / "adapter", 0.05)
    else:
        flat = write_model(tmp_path / "flat.gguf", "llama", T.Q8_0, tied=True, seed=5, layer_scale=0.05)
        model = flat.path
        embedding = torch.from_numpy(flat.weights["model.embed_tokens.weight"][NEWLINE])
        adapter = with_weights(out, tmp_path / "adapter", 0.0, embedding)
    drafting = load_chat_model(ModelSpec(source=str(model), adapter=str(adapter)))
    plain = load_chat_model(ModelSpec(source=str(model), adapter=str(adapter),
                                      decoding=DecodingSettings(decoding="autoregressive")))
    assert isinstance(drafting, DiffusionChatModel) and isinstance(plain, DiffusionChatModel)
    assert drafting.sampler.decoding == "self-speculative" and plain.sampler.decoding == "autoregressive"
    assert drafting.note is not None and f"self-speculatively (draft adapter {adapter})" in drafting.note
    network = drafting.backend.model  # type: ignore[attr-defined]
    assert network.int4 is not None and network.inference_pass().native is not None  # the LoRA on the packed blocks
    assert network.base.model.layers[0].mlp.up_proj.base.weight.numel() == 0  # no dense copy
    rates = []
    for text in [*PROMPTS, *HELDOUT]:
        tokens, rate = answers_per_pass(drafting, text, 24)
        assert tokens == answers_per_pass(plain, text, 24)[0], text
        rates.append(rate)
    if drafts == "right":
        assert min(rates) > 1.5
    else:
        assert max(rates) < 1.2


def test_an_adapter_beside_the_file_is_found(adapted: tuple[Path, Path], tmp_path: Path) -> None:
    model, out = adapted
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model, copy)
    assert ModelSpec(source=str(copy)).draft_adapter is None
    shutil.copytree(out, beside(copy))
    assert beside(copy).name == "model.gguf.dlm-adapter"
    assert ModelSpec(source=str(copy)).draft_adapter == beside(copy)
    chat = load_chat_model(ModelSpec(source=str(copy)))
    assert isinstance(chat, DiffusionChatModel) and chat.sampler.decoding == "self-speculative"


def test_an_adapter_for_another_model_is_a_one_line_error(
    adapted: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = adapted
    assert_refused_by_a_model_of_another_shape(out, tmp_path, capsys)
    assert main(["generate", "hello", "--adapter", str(out)]) == 2  # no GGUF to go with it
    assert main(["adapt", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2  # no GGUF to adapt
