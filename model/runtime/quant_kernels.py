"""The C kernels of a decoding pass (model/runtime/kernels/), compiled for this CPU on first use and called
through ctypes.

Why C: a pass of one answer multiplies a few rows by ~100 MB of 4-bit weights, then does ~60 small operations a
layer between the matmuls. In torch those small operations cost ~10 ms a pass whatever the thread count (one
dispatch each), as much as the matmuls; `decode_layers` does every layer of a pass in one call. The kernels share
torch's OpenMP runtime (the library links the `libgomp.so.1` torch has loaded), so they run on torch's thread count
without a second thread pool.

Built with the system's C compiler (`cc`, or `$CC`) for this CPU (`-march=native`; `$VOICE_ASSISTANT_KERNEL_TARGET`
gives other target flags: the tests run other CPUs' builds, `TARGETS`, on this one). The library is cached by the
hash of its sources, flags and CPU under the project's cache folder. Without a compiler, or on a CPU with neither
AVX-512 nor AVX2 with FMA and F16C, `unavailable()` says why and the model decodes with bf16 weights.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from model.disk_cache import cache_root

SOURCE_DIR = Path(__file__).parent / "kernels"
SOURCES = ("quant_matmul.c", "decode_layer.c")
HEADERS = ("kernels.h", "vec16.h")
TARGET_VARIABLE = "VOICE_ASSISTANT_KERNEL_TARGET"  # the compiler's target flags; default -march=native
# Other CPUs' builds, to test on this one (tests/unit/test_other_cpus.py); each runs on an AVX-512 VNNI machine
TARGETS = {
    # AMD EPYC Zen 4: AVX-512 with VNNI and BF16 (GCC 12 has no -march=znver4)
    "amd-zen4": "-march=znver3 -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -mavx512bf16",
    "avx512-without-vnni": "-march=skylake-avx512",
    "avx2": "-march=x86-64-v3",
}
# The /proc/cpuinfo flags a CPU needs to run each target's build (without them its first call dies of SIGILL)
TARGET_FLAGS = {
    "amd-zen4": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16"),
    "avx512-without-vnni": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"),
    "avx2": ("avx2", "fma", "f16c", "bmi2", "movbe"),
}

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


PACK_NIBBLES, PACK_BYTES, PACK_FIVES, PACK_SIXES = 0, 1, 2, 3  # kernels.h: how a weight's values are packed
SCALES_FP16, SCALES_K, SCALES_K_HALVES = 0, 1, 2  # and how its scales are stored


class QWeight(ctypes.Structure):
    _fields_ = [
        ("packing", _I64), ("offset", _I64), ("scales", _I64), ("q", _P), ("d", _P), ("m", _P), ("sub", _P),
        ("n", _I64), ("k", _I64),
    ]


MEMBERS = 3  # weights a fused linear of decode_layer.c holds side by side


class LoRA(ctypes.Structure):
    _fields_ = [("a", _P), ("b", _P), ("rank", _I64), ("members", _I64), ("end", _I64 * 4)]


class Linear(ctypes.Structure):
    _fields_ = [("members", QWeight * MEMBERS), ("count", _I64), ("lora", LoRA)]


class Layer(ctypes.Structure):
    _fields_ = [
        ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64), ("intermediate", _I64),
        ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("lora_scale", ctypes.c_float),
        ("input_norm", _P), ("post_norm", _P), ("qkv_bias", _P), ("q_norm", _P), ("k_norm", _P),
        ("qkv", Linear), ("o", Linear), ("gate_up", Linear), ("down", Linear),
    ]


def _target() -> str:
    return os.environ.get(TARGET_VARIABLE) or "-march=native"


def _cpuinfo_line(*keys: str) -> str | None:
    """The first /proc/cpuinfo line that starts with one of `keys` (None without one, or without the file)."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(keys)), None)
    except OSError:
        return None


def _cpu_flags() -> str:
    return _cpuinfo_line("flags", "Features") or platform.processor()


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."), or the platform's processor string."""
    line = _cpuinfo_line("model name")
    return line.split(":", 1)[1].strip() if line else platform.processor() or "cpu"


def _flags(target: str) -> list[str]:
    # no implicit fused multiply-adds: the kernels write theirs out, so every build rounds the scalar code alike
    return ["-O3", *target.split(), "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=off"]


def _library_path(compiler: str, target: str) -> Path:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((SOURCE_DIR / name).read_bytes())
    digest.update(" ".join([compiler, *_flags(target), _cpu_flags()]).encode())
    return cache_root() / "kernels" / f"dlm-kernels-{digest.hexdigest()[:16]}.so"


def _build(compiler: str, target: str, library: Path) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as folder:
        partial = Path(folder) / library.name
        command = [compiler, *_flags(target), "-o", str(partial), *(str(SOURCE_DIR / s) for s in SOURCES)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[-600:]}")
        partial.replace(library)


def build(target: str) -> ctypes.CDLL:
    """The kernels compiled with the target flags `target` (`-march=native`, or a `TARGETS` value), from the cache
    when built before; raises `OSError` saying why they cannot be."""
    import torch  # noqa: F401  (loads the libgomp.so.1 the library then shares)

    if platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(f"the kernels are x86-64 ones (this machine is {platform.machine()})")
    compiler = _compiler()
    if not compiler:
        raise OSError("no C compiler found (install gcc)")
    path = _library_path(compiler, target)
    try:
        if not path.is_file():
            _build(compiler, target, path)
    except subprocess.SubprocessError as error:
        raise OSError(str(error)) from error
    lib = ctypes.CDLL(str(path))
    lib.weight_matmul.argtypes = [
        _P, ctypes.c_int, _I64, _I64, ctypes.POINTER(QWeight), _I64, _P, ctypes.c_int, ctypes.c_int,
    ]
    lib.decode_layers.argtypes = [
        ctypes.POINTER(Layer), _I64, _P, _I64, _I64, _I64, _P, _P, ctypes.POINTER(_P), ctypes.POINTER(_P),
        ctypes.POINTER(_I64), _P, _P, _I64, _P, ctypes.c_int, ctypes.POINTER(_I64),
    ]
    lib.norm_logits.argtypes = [
        _P, _I64, _I64, _P, ctypes.c_float, _I64, ctypes.POINTER(QWeight), _I64, _P, ctypes.c_int,
    ]
    for function in (lib.weight_matmul, lib.decode_layers, lib.norm_logits):
        function.restype = ctypes.c_int
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    try:
        return build(_target()), None
    except OSError as error:
        return None, f"the decoding kernels did not build: {error}"


def library() -> ctypes.CDLL:
    """The loaded kernels (built first if needed); raises `OSError` saying why when they cannot be."""
    lib, why = _load()
    if lib is None:
        raise OSError(why)
    return lib


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def instruction_sets(target: str) -> dict[str, str]:
    """The instruction-set macros the kernels' sources test (`defined(__AVX2__)`, ...) as the compiler defines them
    for `target`: two targets with the same compile the same kernels, whatever else their flags tune (an AVX2-only
    CPU's -march=native and the `avx2` target), so a test of one build is a test of the other."""
    tested = {
        macro
        for name in SOURCES + HEADERS
        for macro in re.findall(r"(?:defined\(|#\s*ifn?def\s+)(__\w+__)", (SOURCE_DIR / name).read_text())
    }
    compiler = _compiler()
    if not compiler:
        raise OSError("no C compiler found (install gcc)")
    done = subprocess.run([compiler, *target.split(), "-dM", "-E", "-x", "c", os.devnull],
                          capture_output=True, text=True, timeout=60, check=True)
    defined = dict(line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.count(" ") >= 2)
    return {macro: defined[macro] for macro in sorted(tested) if macro in defined}


def runs_here(cpu: str) -> bool:
    """Whether this CPU can run the build for `TARGETS[cpu]`."""
    flags = set(_cpu_flags().split())
    return all(flag in flags for flag in TARGET_FLAGS[cpu])


def fingerprint() -> str:
    """Names the kernels in use (their sources, flags and CPU), or "none": what a pass's cost depends on."""
    lib, _ = _load()
    return Path(lib._name).stem if lib is not None else "none"


def unavailable() -> str | None:
    """None when the kernels run here, else why not."""
    return _load()[1]
