"""GGUF files of every block type the kernels read, made on this machine, offline: the bundled SmolLM2 weights
re-quantized by llama.cpp's own quantizer, and tiny random qwen2 and qwen3 models (scripts/report_lib/tiny_gguf.py,
written in F32) quantized by it too; the files scripts/bench/agree_llama_cpp.py and bench_llama_cpp.py compare on.

    python scripts/bench/requantize.py [--out artifacts/gguf] [--types Q4_0,...] [--no-tiny]

llama.cpp's quantizer (`llama_model_quantize`, llama-cpp-python: `make install-bench`) is the one a user's files come
from, so its choices are what a user meets: the mix of a "Q4_K_M" file (Q6_K for some v and down projections),
and the fall-backs for rows that are not a multiple of 256 (SmolLM2's 576-wide rows: Q4_K -> Q5_0, Q5_K -> Q5_1,
Q6_K -> Q8_0; only its 1536-wide down projections take the K-quant). The tiny models' rows are multiples of 256, so
their K-quant files hold K-quants in every layer. Re-quantizing the bundled Q4_1 file rounds its weights a second
time: worse weights, but the same file for both engines, which is all an agreement or a speed comparison needs.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The file types asked of the quantizer (llama.cpp's LLAMA_FTYPE_MOSTLY_* names), one per block type the kernels read
FILE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
TINY_ARCHITECTURES = ("qwen2", "qwen3")


def requantize(source: Path, file_type: str, out: Path, threads: int = 2) -> Path:
    """`source` quantized by llama.cpp to `file_type` as `out` (kept when it exists: the quantizer is deterministic)."""
    import llama_cpp

    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.allow_requantize = True  # the bundled file is already Q4_1
    params.nthread = threads
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {source} to {file_type}")
    partial.rename(out)
    return out


def tiny_source(architecture: str, out_dir: Path) -> Path:
    """A tiny random `architecture` model in F32 (rows of 256, so every K-quant applies), untied head for qwen2
    and tied for qwen3, as the released models of each are most often."""
    from gguf import GGMLQuantizationType

    from scripts.report_lib.tiny_gguf import K_SHAPE, write_model

    path = out_dir / f"tiny-{architecture}-F32.gguf"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        write_model(path, architecture, GGMLQuantizationType.F32, tied=architecture == "qwen3", seed=7,
                    shape=K_SHAPE)
    return path


def agreement_files(out_dir: Path, file_types: tuple[str, ...] = FILE_TYPES, tiny: bool = True) -> list[Path]:
    """The bundled weights in each of `file_types`, then (with `tiny`) the tiny qwen2 and qwen3 models in each."""
    from model.bundled.default_model import base_gguf_path

    files = [requantize(base_gguf_path(), kind, out_dir / f"smollm2-135m-{kind}.gguf") for kind in file_types]
    if tiny:
        for architecture in TINY_ARCHITECTURES:
            source = tiny_source(architecture, out_dir)
            files += [requantize(source, kind, out_dir / f"tiny-{architecture}-{kind}.gguf") for kind in file_types]
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "gguf")
    parser.add_argument("--types", default=",".join(FILE_TYPES))
    parser.add_argument("--no-tiny", action="store_true", help="only the bundled weights")
    args = parser.parse_args(argv)
    for path in agreement_files(args.out, tuple(t for t in args.types.split(",") if t), not args.no_tiny):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
