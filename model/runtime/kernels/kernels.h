/* What the kernels export to one another (model/runtime/quant_kernels.py loads the library through ctypes). */
#ifndef VOICE_ASSISTANT_KERNELS_H
#define VOICE_ASSISTANT_KERNELS_H

#include <stdint.h>

/* A Q4_1 weight [n, k] in the tiled layout of quant_matmul.c */
typedef struct {
    const uint8_t *nibbles;
    const uint16_t *d; /* fp16 */
    const uint16_t *m;
    int64_t n, k;
} Q4Weight;

/* y [rows, n] = x [rows, k] @ w.T, fp32 in and out, rows from `coarse` on without the activations' remainder,
 * `threads` OpenMP threads; 0 on success, 1 out of memory. */
int q4_1_rows(const float *x, int64_t rows, int64_t coarse, const Q4Weight *w, float *y, int threads);

#endif
