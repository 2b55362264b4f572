"""Only the thread that runs the LM's passes may keep an OpenMP team of torch's runtime
(model/runtime/passing_thread.py,
voice/listen/whisper_import.py). Each scenario runs in a fresh interpreter: a team, once made, lives as long as its
thread, and CTranslate2 binds its OpenMP symbols once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TEAMS = """
import os, time, torch
from model.runtime.passing_thread import run_in_passing_thread
from model.process.threads import set_torch_threads

def threads():
    return len(os.listdir("/proc/self/task"))

def parallel_op():
    a = torch.randn(512, 512)
    for _ in range(5):
        a @ a
    return torch.get_num_threads()

set_torch_threads(2)
before = threads()
assert run_in_passing_thread(parallel_op) == 2
deadline = time.monotonic() + 5
while threads() > before and time.monotonic() < deadline:  # its workers end just after it
    time.sleep(0.05)
after_passing = threads()
parallel_op()
after_main = threads()
print(before, after_passing, after_main)
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **env}, check=True)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to count threads")
def test_a_passing_thread_takes_its_openmp_workers_with_it():
    before, after_passing, after_main = map(int, run(TEAMS).stdout.split())
    assert after_main > before  # the same op on a thread that stays (here: main) leaves its workers behind ...
    assert after_passing == before  # ... on a passing thread it leaves none


def test_the_loaders_run_on_a_passing_thread():
    from model.bundled.default_model import _load_default_chat_model
    from model.loading import load_chat_model
    from model.runtime.passing_thread import run_in_passing_thread

    # the bundled model's loading (its draft calibration then runs on the batch runner's thread, after it)
    for loader in (load_chat_model, _load_default_chat_model):
        assert loader.__wrapped__ is not None  # the decorator's functools.wraps
    with pytest.raises(ValueError, match="from the thread"):
        run_in_passing_thread(lambda: (_ for _ in ()).throw(ValueError("from the thread")))
    import threading

    assert run_in_passing_thread(threading.current_thread) is not threading.current_thread()


CTRANSLATE2_BINDINGS = """
import numpy as np
import torch  # first, as the web server and the CLIs import it: its libgomp is loaded RTLD_GLOBAL
from voice.listen.asr_models import load_model
from voice.listen.transcriber import TranscriberConfig, decode_words

decode_words(load_model(cpu_threads=2).model, np.zeros(16000, np.float32), TranscriberConfig())
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="LD_DEBUG is glibc's")
def test_ctranslate2_keeps_its_own_openmp_runtime_after_torch():
    """glibc prints each symbol binding with LD_DEBUG=bindings: CTranslate2's OpenMP calls must reach the libgomp it
    ships, not torch's (one runtime for both made every LM pass ~1.8x slower with Whisper loaded)."""
    stderr = run(CTRANSLATE2_BINDINGS, LD_DEBUG="bindings").stderr
    bindings = [line for line in stderr.splitlines()
                if "libctranslate2" in line.split(" to ")[0] and "libgomp" in line and "`GOMP_" in line]
    assert bindings, "no OpenMP binding of CTranslate2 seen"
    wrong = [line.strip() for line in bindings if "ctranslate2.libs/libgomp" not in line.split(" to ")[1]]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 2), (8, 4), (32, 4)])
def test_whisper_takes_half_the_cores(monkeypatch: pytest.MonkeyPatch, cores: int, threads: int) -> None:
    from voice.listen import asr_models

    monkeypatch.setattr(asr_models.os, "cpu_count", lambda: cores)
    assert asr_models.default_cpu_threads() == threads


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 2), (8, 4), (16, 8)])
def test_the_voice_lm_takes_half_the_cores(monkeypatch: pytest.MonkeyPatch, cores: int, threads: int) -> None:
    from voice import engines

    monkeypatch.setattr(engines.os, "cpu_count", lambda: cores)
    assert engines.default_lm_threads() == threads


BLAS_SPIN = """
import sys, time
import numpy as np

if sys.argv[1] == "kept":
    from voice.engines import keep_numpy_blas_on_its_caller

    keep_numpy_blas_on_its_caller()
mel, frames = np.ones((80, 201)), np.ones((201, 801))  # Smart Turn's mel product
wall, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() - wall < 0.6:
    mel @ frames
    time.sleep(0.005)  # the caller idles between products, as a voice process does
print((time.process_time() - cpu) / (time.perf_counter() - wall))
"""


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a BLAS pool needs two cores to spin beside its caller")
def test_numpy_blas_leaves_no_thread_spinning_after_its_products():
    """The process's CPU time per wall second while it makes small products and idles between them: OpenBLAS's pool
    left spinning shows as a second core's worth (Whisper's decode beside Smart Turn took twice its time)."""
    def cores_busy(mode: str) -> float:
        return float(subprocess.run([sys.executable, "-c", BLAS_SPIN, mode], capture_output=True, text=True,
                                    timeout=120, cwd=ROOT, check=True).stdout)

    free = cores_busy("free")
    if free < 0.6:
        pytest.skip(f"numpy's BLAS here does not spin after a product ({free:.2f} cores busy without the limit)")
    assert cores_busy("kept") < 0.4
