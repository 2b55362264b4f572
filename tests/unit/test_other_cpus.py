"""The bit-exactness tests again, under settings that make this CPU's libraries choose another CPU's kernels.

Which kernels run is decided when oneDNN and MKL load, so each profile runs the tests in a fresh interpreter.
`amd-zen4` reproduces the AMD EPYC machine this project is also tested on: with it, the code before
`model.runtime.row_exact`
failed exactly the five tests that failed there (and passed them without it, on an Intel AMX machine). `avx2` stands
for a laptop CPU without AVX-512. Each profile also builds the decoding kernels (model/runtime/kernels/) for its
CPU, or for this one when it cannot run that build (an AVX2-only CPU and the Zen 4 build). On a CPU that lacks an
instruction set a profile names, the cap is simply its own.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.runtime.quant_kernels import TARGET_VARIABLE, TARGETS, instruction_sets, runs_here

ROOT = Path(__file__).resolve().parents[2]
EXACTNESS_TESTS = [
    "tests/unit/test_fast_pass.py::test_the_fused_pass_gives_the_modules_logits_bit_for_bit",
    "tests/unit/test_fast_pass.py::test_a_new_adapter_rebuilds_the_fused_pass",
    "tests/unit/test_fast_pass.py::test_in_bf16_a_query_rows_attention_does_not_depend_on_the_rows_beside_it",
    "tests/unit/test_self_speculative.py::test_in_bf16_a_tokens_logits_do_not_depend_on_the_rows_sharing_its_pass",
    "tests/unit/test_self_speculative.py::test_in_bf16_self_speculative_answers_equal_autoregressive_ones_bit_for_bit",
    "tests/unit/test_self_speculative.py::test_self_speculative_equals_autoregressive_equals_the_teacher",
    "tests/unit/test_int4_weights.py::test_a_rows_int4_output_does_not_depend_on_the_rows_beside_it[3072-576]",
    "tests/unit/test_int4_weights.py::test_with_int4_weights_a_tokens_logits_do_not_depend_on_the_rows_sharing_its_pass",
    "tests/unit/test_int4_weights.py::test_with_int4_weights_self_speculative_answers_equal_autoregressive_ones_bit_for_bit",
]
PROFILES = {
    # oneDNN without AMX (AVX-512 with BF16 and VNNI) and MKL's AVX2 code path, which MKL takes on AMD CPUs; the
    # decoding kernels built as for a Zen 4 (model/runtime/quant_kernels.py)
    "amd-zen4": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        TARGET_VARIABLE: TARGETS["amd-zen4"] if runs_here("amd-zen4") else "-march=native",
    },
    # no AVX-512 at all: oneDNN, MKL, ATen's own vectorised kernels and the decoding kernels on AVX2
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
        TARGET_VARIABLE: TARGETS["avx2"] if runs_here("avx2") else "-march=native",
    },
}


def run_under(profile: dict[str, str], tests: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **profile}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )


def kernels_chosen(profile: dict[str, str]) -> str:
    """The oneDNN ISA and ATen capability a fresh interpreter reports under `profile`."""
    return _kernels_chosen(tuple(sorted(profile.items())))


@functools.cache  # ~2.5 s an interpreter; this CPU's own choice is asked for by every profile
def _kernels_chosen(profile: tuple[tuple[str, str], ...]) -> str:
    code = (
        "import torch, torch.nn.functional as F;"
        "print(torch.backends.cpu.get_cpu_capability());"
        "F.linear(torch.ones(2, 64, dtype=torch.bfloat16), torch.ones(64, 64, dtype=torch.bfloat16))"
    )
    env = {**os.environ, **dict(profile), "ONEDNN_VERBOSE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return done.stdout


def same_as_this_cpus(profile: dict[str, str]) -> bool:
    """Whether `profile` leaves every kernel as this CPU's own: the same ATen capability and oneDNN choices, and the
    decoding kernels compiled from the same instruction sets as the main run's. Then its run repeats the main run's
    exactness tests bit for bit (on an AVX2-only CPU both profiles: the AMD one's caps are above what it has, and the
    AVX2 one's build is this CPU's), and costs ~100 s for nothing."""
    def effective(chosen: str) -> list[str]:  # oneDNN's execution lines end with their time: leave it out
        return [line.rsplit(",", 1)[0] if ",exec," in line else line for line in chosen.splitlines()]

    main_build = os.environ.get(TARGET_VARIABLE) or "-march=native"
    same_build = instruction_sets(profile[TARGET_VARIABLE]) == instruction_sets(main_build)
    return same_build and effective(kernels_chosen(profile)) == effective(kernels_chosen({}))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_exactness_tests_pass_with_another_cpus_kernels(name: str) -> None:
    if same_as_this_cpus(PROFILES[name]):
        pytest.skip(f"on this CPU the {name} profile chooses this CPU's own kernels: the main run's exactness tests")
    done = run_under(PROFILES[name], EXACTNESS_TESTS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(EXACTNESS_TESTS)} passed" in done.stdout


@pytest.mark.slow
def test_a_profile_really_changes_the_kernels() -> None:
    """The caps take effect (else the profiles would test this CPU twice): ATen's capability, and oneDNN's bf16
    matmul (without AVX-512 torch does not hand bf16 matmuls to oneDNN at all). On a CPU without AVX-512 the AMD
    profile's caps are above what it has: torch's kernels are then this CPU's own AVX2 ones."""
    chosen = kernels_chosen(PROFILES["avx2"])
    assert chosen.splitlines()[0] == "AVX2"
    assert not [line for line in chosen.splitlines() if ",matmul," in line and "avx512" in line]
    amd = kernels_chosen(PROFILES["amd-zen4"]).splitlines()
    matmuls = [line for line in amd if ",matmul," in line]
    if runs_here("avx512-without-vnni"):
        assert matmuls and all("amx" not in line for line in matmuls), amd
    else:
        assert amd[0] == "AVX2" and not matmuls, amd
