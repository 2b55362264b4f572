"""Naming a user's GGUF: `ollama:NAME[:TAG]` through a store laid out as Ollama lays its own, a folder as LM Studio
keeps one, a .gguf path; and every bad name refused in one line with exit status 2 by each command, before any model
loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from model.chat.spec import DecodingSettings, ModelSpec
from model.errors import ModelError
from model.gguf.locate import OllamaName, locate_gguf, manifest_blob, model_files
from scripts.report_lib.tiny_gguf import ollama_layout, write_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.Q8_0.gguf").path


@pytest.mark.parametrize(("text", "expected"), [
    ("qwen2.5", OllamaName("qwen2.5")),
    ("qwen2.5:0.5b", OllamaName("qwen2.5", "0.5b")),
    ("me/tiny:q8", OllamaName("tiny", "q8", "me")),
    ("hf.co/owner/repo:Q4_K_M", OllamaName("repo", "Q4_K_M", "owner", "hf.co")),
    ("localhost:5000/me/tiny", OllamaName("tiny", "latest", "me", "localhost:5000")),
])
def test_an_ollama_name_is_parsed_as_ollama_spells_it(text: str, expected: OllamaName) -> None:
    assert OllamaName.parse(text) == expected
    assert OllamaName.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["", ":latest", "a//b", "../x", "a/b/c/d"])
def test_a_malformed_ollama_name_is_refused(text: str) -> None:
    with pytest.raises(ModelError, match="not an Ollama model name"):
        OllamaName.parse(text)


def test_the_manifests_model_layer_names_the_blob() -> None:
    manifest = {"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
                           {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:abc123"}]}
    assert manifest_blob(manifest, Path("/store")) == Path("/store/blobs/sha256-abc123")
    with pytest.raises(ModelError, match="no model layer"):
        manifest_blob({"layers": manifest["layers"][:1]}, Path("/store"))


def test_ollama_names_resolve_through_the_store(tmp_path: Path, tiny: Path) -> None:
    blob = ollama_layout(tmp_path, tiny)
    ollama_layout(tmp_path, tiny, name="tiny", tag="q8", namespace="me")
    environ = {"OLLAMA_MODELS": str(tmp_path)}
    assert locate_gguf("ollama:tiny", environ) == blob
    assert locate_gguf("ollama:tiny:latest", environ) == blob
    assert locate_gguf("ollama:me/tiny:q8", environ) == blob
    with pytest.raises(ModelError, match=r"no Ollama model ollama:tiny:7b in .*; its tags there: latest"):
        locate_gguf("ollama:tiny:7b", environ)
    with pytest.raises(ModelError, match="no Ollama model ollama:absent:latest"):
        locate_gguf("ollama:absent", environ)


def test_without_ollama_models_set_the_store_is_under_home(tmp_path: Path, tiny: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    blob = ollama_layout(tmp_path / ".ollama" / "models", tiny)
    assert locate_gguf("ollama:tiny", {}) == blob


def test_a_manifest_whose_blob_is_gone_is_refused(tmp_path: Path, tiny: Path) -> None:
    ollama_layout(tmp_path, tiny).unlink()
    with pytest.raises(ModelError, match="its manifest names sha256-"):
        locate_gguf("ollama:tiny", {"OLLAMA_MODELS": str(tmp_path)})


def test_a_folder_as_lm_studio_keeps_it_names_its_one_model(tmp_path: Path, tiny: Path) -> None:
    repo = tmp_path / "models" / "publisher" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "tiny.Q8_0.gguf").write_bytes(tiny.read_bytes())
    (repo / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF")  # a vision projector beside it is not the model
    (repo / "README.md").write_text("a model card")
    assert locate_gguf(str(repo)) == repo / "tiny.Q8_0.gguf"
    (repo / "tiny.Q4_K_M.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"2 GGUF models in .*tiny.Q4_K_M.gguf, tiny.Q8_0.gguf\): pass one"):
        locate_gguf(str(repo))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match=r"model not found: .* holds no .gguf file"):
        locate_gguf(str(empty))


def test_checkpoint_folders_and_hub_ids_are_not_ggufs(tmp_path: Path) -> None:
    for marker in ("config.json", "adapter.json"):
        folder = tmp_path / marker.removesuffix(".json")
        folder.mkdir()
        (folder / marker).write_text("{}")
        assert locate_gguf(str(folder)) is None
    assert locate_gguf("owner/name") is None
    assert model_files(["a.gguf", "mmproj-a.gguf", "a-projector.GGUF", "b.txt"]) == ["a.gguf"]


def test_the_model_spec_reads_a_gguf_header_once_built(tmp_path: Path, tiny: Path) -> None:
    ollama_layout(tmp_path, tiny)
    spec = ModelSpec(source=str(tiny))
    assert spec.gguf is not None and spec.gguf.architecture == "llama" and spec.gguf.path == tiny
    assert ModelSpec().gguf is None
    with pytest.raises(ModelError, match="no draft adapter: it decodes autoregressively only"):
        ModelSpec(source=str(tiny), decoding=DecodingSettings(decoding="self-speculative"))
    with pytest.raises(ModelError, match="--weights int4 is the bundled model's"):
        ModelSpec(source=str(tiny), weights="int4")
    assert ModelSpec(source=str(tiny), decoding=DecodingSettings(decoding="autoregressive")).gguf is not None


def test_a_model_spec_that_names_no_gguf_does_not_import_gguf_py(tmp_path: Path) -> None:
    """gguf-py (numpy, its reader and writer) costs ~0.3 s to import; the bundled model and a checkpoint folder never
    need it. A fresh interpreter checks, since this one has imported it already."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    code = ("import sys\nfrom model.chat.spec import ModelSpec\n"
            f"assert ModelSpec().gguf is None and ModelSpec(source={str(folder)!r}).gguf is None\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'gguf'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=True)
    assert done.stdout.strip() == "[]"


def bad_models(tmp_path: Path, tiny: Path) -> dict[str, tuple[str, str]]:
    """Each bad `--model` and what its one line says."""
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny.read_bytes()[: tiny.stat().st_size * 2 // 3])
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(tiny.read_bytes())
    (tmp_path / "store").mkdir()
    return {
        "truncated": (str(truncated), "is truncated: its tensors end at byte"),
        "no such name": ("ollama:nothere", "no Ollama model ollama:nothere:latest"),
        "two models": (str(two), "2 GGUF models in"),
    }


def test_every_command_refuses_a_bad_model_in_one_line_with_status_2(
    tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from model.cli import main as dlm
    from model.server.cli import main as dlm_serve
    from web.cli import main as voice_assistant

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))

    def refuse_to_load(*args: object) -> None:
        raise AssertionError("a model started loading")

    monkeypatch.setattr("model.loading.load_chat_model", refuse_to_load)
    monkeypatch.setattr("voice.engines.load_engines", refuse_to_load)
    for case, (model, says) in bad_models(tmp_path, tiny).items():
        assert dlm(["generate", "hi", "--model", model]) == 2, case
        with pytest.raises(SystemExit) as exited:
            dlm_serve(["--model", model])
        assert exited.value.code == 2, case
        wav = tmp_path / "in.wav"
        assert voice_assistant(["file", str(wav), "--out", str(tmp_path / "out.wav"), "--model", model]) == 2, case
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 3 and all(says in line for line in lines), (case, lines)
        assert [line.split(":")[0] for line in lines] == ["dlm", "dlm-serve", "voice-assistant"]


def test_an_ollama_manifest_that_is_not_json_is_refused(tmp_path: Path, tiny: Path) -> None:
    ollama_layout(tmp_path, tiny)
    manifest = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.write_text(json.dumps(["not", "an", "object"]))
    with pytest.raises(ModelError, match="is not a JSON object"):
        locate_gguf("ollama:tiny", {"OLLAMA_MODELS": str(tmp_path)})
