"""`dlm adapt --drafter` on tiny GGUF files written by the test: the target's answers traced through the decode
kernel teach a drafter that then drafts more of them than before, a later run resumes, the drafter loads from its
folder (given, or beside the file) and answers equal autoregressive decoding token for token, and a drafter made for
another model is refused in one line."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from gguf_answers import answers_per_pass, assert_refused_by_a_model_of_another_shape

from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.cli import main
from model.gguf.draft_adapter import beside
from model.gguf.locate import open_gguf
from model.loading import load_chat_model
from model.runtime.int4_weights import available
from model.training.adapt_drafter import CHECKPOINT, adapt_drafter
from model.training.settings import DrafterSettings
from scripts.report_lib.tiny_gguf import write_model

T = GGMLQuantizationType
# slow: it trains a drafter (make test runs it; make test-fast leaves it out)
pytestmark = [pytest.mark.skipif(available() is not None, reason=str(available())), pytest.mark.slow]
WORDS = ("hello", "the", "world", "tell", "thing", "what", "end", "is", "a", "b")
PROMPTS = [" ".join(random.Random(i).choices(WORDS, k=2 + i % 4)) for i in range(48)]
HELDOUT = ["hello there", "the other the", "what world is", "tell a thing"]
SETTINGS = DrafterSettings(max_new_tokens=16, chunk=16, shortlist=64, steps=300, batch=8, lr=3e-3, save_every=100,
                           eval_every=150, minutes=5)


def tiny(path: Path, layer_scale: float = 1.0) -> Path:
    """A tiny llama GGUF of the kernels' block types; with a small `layer_scale` its layers are near zero, so its greedy
    answers repeat the prompt's last token: answers a drafter can learn from a few dozen, held-out ones too."""
    return write_model(path, "llama", lambda name: T.Q8_0 if "token_embd" in name else T.Q4_0, seed=3,
                       layer_scale=layer_scale).path


@pytest.fixture(scope="module")
def drafted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[float], list[float]]:
    """(a tiny GGUF whose answers repeat a token, the drafter trained for it, its acceptance before and after)."""
    root = tmp_path_factory.mktemp("adapt-drafter")
    model = tiny(root / "flat.gguf", layer_scale=0.05)
    header = open_gguf(str(model))
    assert header is not None
    out = root / "drafter"
    result = adapt_drafter(header, out, SETTINGS, (PROMPTS, HELDOUT))
    assert result.steps == SETTINGS.steps and result.examples == len(PROMPTS)
    return model, out, result.before, result.after


def test_the_drafter_learns_the_targets_answers_and_writes_its_card(drafted) -> None:
    _, out, before, after = drafted
    print("acceptance before", before, "after", after)
    assert len(before) == len(after) == SETTINGS.block
    # the first draft is the target's own next token from its last layer's rows (the draft layer starts as that
    # layer); the drafts after it are what training teaches
    assert after[0] >= before[0] - 0.1 and after[-1] > before[-1] + 0.5
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["teacher"]["architecture"] == "llama" and meta["steps"] == SETTINGS.steps
    assert meta["acceptance"]["after"] == after
    assert len(list(out.glob("traced-train-*.pt"))) == 3  # 48 prompts, 16 a chunk


def test_a_later_run_resumes_from_its_checkpoint_and_traced_answers(drafted, tmp_path: Path) -> None:
    model, out, _, after = drafted
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    for traced in resumed.glob("traced-*.pt"):  # answers already traced are read back, not traced again
        traced.chmod(0o444)
    header = open_gguf(str(model))
    assert header is not None
    more = adapt_drafter(header, resumed, replace(SETTINGS, steps=350), (PROMPTS, HELDOUT))
    assert more.steps == 350  # from the checkpoint's step 300, not from 0
    assert json.loads((resumed / "drafter.json").read_text())["steps"] == 350
    assert more.after[0] >= after[0] - 0.1
    assert (resumed / CHECKPOINT).is_file()


@pytest.mark.parametrize("drafts", ["right", "wrong"])
def test_with_its_drafter_the_model_answers_as_autoregressive_decoding(drafted, tmp_path: Path, drafts: str) -> None:
    """"right": the model the drafter learned, whose drafts are accepted, several tokens a pass. "wrong": a model of
    the same shape with other answers, whose drafts are mostly rejected; any draft that leaked into an answer would
    change it."""
    model, out, _, _ = drafted
    if drafts == "wrong":
        model = tiny(tmp_path / "random.gguf")
    drafting = load_chat_model(ModelSpec(source=str(model), adapter=str(out)))
    plain = load_chat_model(ModelSpec(source=str(model), adapter="none"))
    assert isinstance(drafting, DiffusionChatModel) and isinstance(plain, DiffusionChatModel)
    assert drafting.sampler.decoding == "self-speculative" and plain.sampler.decoding == "autoregressive"
    assert drafting.backend.drafter is not None  # type: ignore[attr-defined]
    assert drafting.note is not None and f"self-speculatively (drafter {out})" in drafting.note
    rates = []
    for text in [*PROMPTS[:8], *HELDOUT]:
        tokens, rate = answers_per_pass(drafting, text, 16)
        assert tokens == answers_per_pass(plain, text, 16)[0], text
        rates.append(rate)
    print(drafts, "tokens a pass", rates)
    if drafts == "right":
        assert min(rates) > 1.5
    else:
        assert max(rates) < 1.5


def test_a_drafter_beside_the_file_is_found(drafted, tmp_path: Path) -> None:
    model, out, _, _ = drafted
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model, copy)
    shutil.copytree(out, beside(copy))
    chat = load_chat_model(ModelSpec(source=str(copy)))
    assert isinstance(chat, DiffusionChatModel) and chat.sampler.decoding == "self-speculative"
    assert ModelSpec(source=str(copy), adapter="none").draft_adapter is None


def test_a_drafter_for_another_model_is_a_one_line_error_and_the_cli_trains_one(
    drafted, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out, _, _ = drafted
    assert_refused_by_a_model_of_another_shape(out, tmp_path, capsys)
    folder = tmp_path / "cli"
    assert main(["adapt", str(model), "--out", str(folder), "--drafter", "--examples", "4", "--heldout", "2",
                 "--max-new-tokens", "8", "--max-steps", "5", "--batch", "2", "--shortlist", "32"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("drafter after 5 steps on ") and f"written to {folder} in " in said
    assert (folder / "drafter.safetensors").is_file() and (folder / "drafter.json").is_file()
