/* What the kernels export to one another (model/runtime/quant_kernels.py loads the library through ctypes). */
#ifndef VOICE_ASSISTANT_KERNELS_H
#define VOICE_ASSISTANT_KERNELS_H

#include <stdint.h>

/* How a weight's values are packed (quant_matmul.c gives the layouts; model/gguf/blocks.py maps each GGUF block
 * type to one): 4-bit values two to a byte (Q4_0, Q4_1, Q4_K), one signed byte each (Q8_0), or 5- and 6-bit values
 * at their bits, nibbles and planes of fifth (and sixth) bits (Q5_0, Q5_1, Q5_K; Q6_K), multiplied as bytes. */
enum { PACK_NIBBLES = 0, PACK_BYTES = 1, PACK_FIVES = 2, PACK_SIXES = 3 };
/* Bytes of one group of 32 inputs for 16 outputs: 256 of nibbles and 64 of fifth bits (and 64 of sixth bits) */
#define FIVES_BYTES 320
#define SIXES_BYTES 384
/* How its scales (and minimums) are stored: fp16 per group of 32 (the file's own: Q4_0 ... Q8_0), fp32 per group
 * (a K-quant's super-block scale times its sub-block's 6-bit one, exact in fp32: Q4_K, Q5_K), or fp32 per 16 inputs
 * (Q6_K's sub-blocks of 16; PACK_BYTES and PACK_SIXES only). */
enum { SCALES_FP16 = 0, SCALES_FP32 = 1, SCALES_FP32_HALVES = 2 };

/* A weight [n, k] in the kernels' tiled layout: w = d * (q - offset) (+ m), per group of 32 inputs. */
typedef struct {
    int64_t packing; /* PACK_NIBBLES or PACK_BYTES */
    int64_t offset;  /* taken off every value (Q4_0's 8 in the integer sums, Q5_0's 16 as unpacked); 0 for PACK_BYTES */
    int64_t scales;  /* SCALES_FP16, SCALES_FP32 or SCALES_FP32_HALVES */
    const uint8_t *q;
    const void *d; /* [tile][group][16], or [tile][group][2][16] for halves */
    const void *m; /* as d; NULL: no minimum */
    int64_t n, k;
} QWeight;

/* y [rows, sum of the members' n] = x [rows, k] @ [w_0; w_1; ...].T for `members` weights of the same k, fp32 in
 * and out; rows from `coarse` on without the activations' remainder, `threads` OpenMP threads. 0 on success, 1 out
 * of memory, 2 an unknown packing. */
int weight_rows(const float *x, int64_t rows, int64_t coarse, const QWeight *w, int64_t members, float *y,
                int threads);

#endif
