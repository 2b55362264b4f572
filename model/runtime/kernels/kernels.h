/* What the kernels export to one another (model/runtime/quant_kernels.py loads the library through ctypes). */
#ifndef VOICE_ASSISTANT_KERNELS_H
#define VOICE_ASSISTANT_KERNELS_H

#include <stdint.h>

/* A Q4_1 weight [n, k] in the tiled layout of quant_matmul.c */
typedef struct {
    const uint8_t *nibbles;
    const float *d;
    const float *m;
    int64_t n, k;
} Q4Weight;

/* Each row's sum over each group of 32 inputs, as the Q4_1 matmul needs them: xsum [rows, k / 32]. */
void group_sums(const float *x, int64_t rows, int64_t k, float *xsum);

/* y [rows, n] = x [rows, k] @ w.T, fp32 in and out, `threads` OpenMP threads. */
void q4_1_rows(const float *x, const float *xsum, int64_t rows, const Q4Weight *w, float *y, int threads);

#endif
