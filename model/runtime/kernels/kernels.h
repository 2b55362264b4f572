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
/* How its scales (and minimums) are stored: fp16 per group of 32 (the file's own: Q4_0 ... Q8_0), or a K-quant's as
 * its file holds them: the super-block's fp16 d (and minus its dmin) per 256 inputs, and per group the sub-blocks'
 * integers, a scale and a minimum (SCALES_K: Q4_K's and Q5_K's 6-bit ones) or two scales, one per 16 inputs
 * (SCALES_K_HALVES: Q6_K's int8 ones; PACK_BYTES and PACK_SIXES only). The kernel multiplies them per group:
 * d * scale and -dmin * min are exact in fp32 (an 11-bit mantissa times an integer of at most 8 bits), so the
 * scales cost the file's bits, not two fp32 a group. */
enum { SCALES_FP16 = 0, SCALES_K = 1, SCALES_K_HALVES = 2 };
/* Groups of 32 inputs in a K-quant's super-block of 256 */
#define SUPER_GROUPS 8

/* A weight [n, k] in the kernels' tiled layout: w = d * (q - offset) (+ m), per group of 32 inputs. */
typedef struct {
    int64_t packing; /* PACK_NIBBLES, PACK_BYTES, PACK_FIVES or PACK_SIXES */
    int64_t offset;  /* taken off every value (Q4_0's 8 in the integer sums, Q5_0's 16 as unpacked); 0 for PACK_BYTES */
    int64_t scales;  /* SCALES_FP16, SCALES_K or SCALES_K_HALVES */
    const uint8_t *q;
    const void *d;     /* fp16 [tile][group][16]; K-quants: fp16 [tile][super-block][16] */
    const void *m;     /* as d (K-quants: minus the file's dmin); NULL: no minimum (SCALES_K has one, halves none) */
    const int8_t *sub; /* K-quants: [tile][group][2][16], the 16 outputs' integer scales then minimums (halves: the
                        * scales of inputs 0-15 then of 16-31); NULL for SCALES_FP16 */
    int64_t n, k;      /* k a multiple of 256 for the K-quants */
} QWeight;

/* y [rows, sum of the members' n] = x [rows, k] @ [w_0; w_1; ...].T for `members` weights of the same k, fp32 in
 * and out; rows from `coarse` on without the activations' remainder, `threads` OpenMP threads. 0 on success, 1 out
 * of memory, 2 a packing or scales kind the kernels do not compile (or a K-quant's k not a multiple of 256). */
int weight_rows(const float *x, int64_t rows, int64_t coarse, const QWeight *w, int64_t members, float *y,
                int threads);

#endif
