#!/usr/bin/env bash
# CMake flags that build llama.cpp (llama-cpp-python, the benchmark's reference engine) for this CPU's instruction
# sets, AMX left out: GGML_NATIVE builds ggml's AMX kernels where the CPU has AMX, and on the KVM guests we measure
# on they die at their first tile instruction (SIGILL in ggml_backend_amx_mul_mat). AMX only speeds up llama.cpp's
# prompt batches; a decoding step runs its AVX-512 dot products either way.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
has() { [[ " $flags " == *" $1 "* ]]; }
has avx && args+=" -DGGML_AVX=ON"
has avx2 && args+=" -DGGML_AVX2=ON"
has fma && args+=" -DGGML_FMA=ON"
has f16c && args+=" -DGGML_F16C=ON"
has bmi2 && args+=" -DGGML_BMI2=ON"
has avx_vnni && args+=" -DGGML_AVX_VNNI=ON"
has avx512f && args+=" -DGGML_AVX512=ON"
has avx512_vbmi && args+=" -DGGML_AVX512_VBMI=ON"
has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
echo "$args"
