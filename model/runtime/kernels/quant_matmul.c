/* Weight-only quantized matmuls for a decoding pass: y = x @ w.T with w in a GGUF's own blocks (Q4_0, Q4_1, Q8_0,
 * Q5_0, Q5_1: model/gguf/blocks.py packs them; the bundled model's Q4_1 and Q8_0: model/runtime/int4_weights.py).
 *
 * Each row's activations are split, per group of 32, into two 8-bit parts: x ~ scale * (254 * hi + lo), hi the
 * group rounded to 8 bits (scale * 254 = max |x| / 127, as llama.cpp rounds activations) and lo the remainder
 * rounded to 8 bits again. A group's dot product with the 4-bit (Q4_1) or 8-bit (Q8_0) weights is then two exact
 * integer sums (VNNI `vpdpbusd`, or the same sums from `pmaddubsw` on CPUs without it), joined in one rounding
 * (a fused multiply-add of the two sums as floats, each exact below 2^24: the same bits as joining them in int32,
 * without the integer multiply that competes with the dot products for their port):
 * Q4_1: y += d * scale * (254 * sum_hi + sum_lo) + m * sum(x), with sum(x) the group's fp32 sum; Q8_0: y += d *
 * scale * (...). Q4_0 (w = d * (q - 8)) takes 8 * sum(hi) and 8 * sum(lo) off the integer sums, exactly, as
 * llama.cpp does; Q5_0 is packed as the bytes q - 16 and Q5_1 as the bytes q with its m, through the Q8_0 kernel
 * (a byte a weight, not 5 bits: the 5-bit values' pair sums would overflow the 16-bit sums of the nibble kernel). The remainder is what keeps the answers the bf16 teacher's quality: with hi alone (llama.cpp's
 * rounding) an activation is off by up to 1/254 of its group's largest, which on CPUs that prefill through these
 * kernels made the greedy answers' perplexity 1.05x the bf16 teacher's; with the remainder it is off by 1/64516.
 * The second sum costs the integer units, not memory: the weights are read once for both, and for all rows.
 *
 * Coarse rows: rows from `coarse` on skip the remainder (hi alone, llama.cpp's rounding), half the integer work.
 * They are a drafting pass's mask rows, whose logits only propose drafts that the clean rows then verify
 * (model/decoding/speculative.py): the answer never depends on them, and a row's rounding is still its own.
 *
 * Exactness: a row's output never depends on the other rows, the row count or the thread count. Every output
 * element is computed by one thread, in one fixed order (exact integer sums, then fp32 over the groups in
 * order). AVX-512 and AVX2 builds compute the same bits.
 *
 * Layout (built by model/runtime/int4_weights.py): outputs in tiles of 16, inputs in groups of 32.
 *   PACK_NIBBLES (Q4_1, Q4_0): nibbles[tile][group][i in 0..3][output in 0..15][c in 0..3]
 *         = q[., 32 g + 4 i + c] | q[., 32 g + 16 + 4 i + c] << 4,
 *         d[tile][group][16], m[tile][group][16] (fp16, the file's own; no m for Q4_0).
 *   PACK_BYTES (Q8_0, Q5_0, Q5_1): q[tile][group][i in 0..7][output in 0..15][c in 0..3] = q[., 32 g + 4 i + c] (int8),
 *         d[tile][group][16] (fp16), and m as above for Q5_1.
 * Weights are zero-padded to whole tiles; n may end in a partial one.
 */

#include <stdlib.h>

#include "kernels.h"
#include "vec16.h"

/* Rows a tile's accumulators hold at once (on the stack of each thread); more rows are done in chunks. */
#define ROW_CHUNK 64
/* Rows of the Q4_1 kernel whose accumulators stay in registers: a block's rows share each unpacked weight group */
#define ROW_BLOCK 4

/* The weight of hi against lo: x ~ scale * (RESIDUAL * hi + lo) */
#define RESIDUAL 254

/* Each row's groups of 32 activations as two sets of 8-bit values (four to an int32, in input order: the 8 quads
 * of hi, then the 8 of lo), their scales, their fp32 sums, and the integer sums of hi and of lo (what S8_BIAS
 * adds to a Q8_0 dot product: vec16.h). */
typedef struct {
    int32_t *quads;  /* [rows, groups, 16] */
    float *scale;    /* [rows, groups] */
    float *sum;      /* [rows, groups] */
    int32_t *parts;  /* [rows, groups, 2]: sum(hi), sum(lo) */
} Activations;

static int quantize_rows(const float *x, int64_t rows, int64_t k, Activations *out) {
    const int64_t groups = k / GROUP;
    void *buffer = malloc((size_t)(rows * groups) * (18 * sizeof(int32_t) + 2 * sizeof(float)));
    if (!buffer) return 1;
    out->quads = buffer;
    out->scale = (float *)(out->quads + rows * groups * 16);
    out->sum = out->scale + rows * groups;
    out->parts = (int32_t *)(out->sum + rows * groups);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + r * k + g * GROUP;
            const vec16 x0 = v_load(xg), x1 = v_load(xg + TILE);
            const float top = v_hmax(v_max(v_abs(x0), v_abs(x1)));
            const float unit = top / 127.0f;
            const vec16 inv = v_set1(top > 0.0f ? 127.0f / top : 0.0f), step = v_set1(unit);
            const vec16 fine = v_set1((float)RESIDUAL), bound = v_set1(127.0f), minus = v_set1(-127.0f);
            int8_t *q = (int8_t *)(out->quads + (r * groups + g) * 16);  /* hi, then lo */
            const vec16 xs[2] = {x0, x1};
            for (int h = 0; h < 2; h++) {
                const vec16 hi = v_rint(v_mul(xs[h], inv));
                const vec16 lo = v_rint(v_mul(v_mul(v_sub(xs[h], v_mul(hi, step)), inv), fine));
                v_store_int8(q + h * TILE, hi);
                v_store_int8(q + GROUP + h * TILE, v_min(v_max(lo, minus), bound));
            }
            out->scale[r * groups + g] = unit / (float)RESIDUAL;
            out->sum[r * groups + g] = v_sum(v_add(x0, x1));
            for (int part = 0; part < 2; part++) {
                int32_t total = 0;
                for (int i = 0; i < GROUP; i++) total += q[part * GROUP + i];
                out->parts[(r * groups + g) * 2 + part] = total;
            }
        }
    return 0;
}

static void store_tile(const vec16 *acc, int64_t rows, int64_t n, int64_t tile, float *y, int64_t ldy) {
    const int64_t first = tile * TILE, width = n - first < TILE ? n - first : TILE;
    for (int64_t r = 0; r < rows; r++) {
        float lane[TILE];
        v_store(lane, acc[r]);
        for (int64_t o = 0; o < width; o++) y[r * ldy + first + o] = lane[o];
    }
}

/* One tile's outputs for rows [first, first + count), count <= ROW_BLOCK: the block's accumulators stay in
 * registers over the groups, and each group's weights are unpacked once for all of them. Always inlined with
 * constant `count`, `with_min` (Q4_1's m) and `offset` (Q4_0's 8), so that the row loop unrolls, `acc` is kept out
 * of memory and each format pays for its own terms only. y: the tile's member's first column, rows ldy apart. */
static inline __attribute__((always_inline)) void nibble_tile(const QWeight *w, const Activations *a, int64_t t,
                                                              int64_t first, int count, int64_t coarse, float *y,
                                                              int64_t ldy, int with_min, int offset) {
    const int64_t groups = w->k / GROUP;
    vec16 acc[ROW_BLOCK];
    for (int r = 0; r < count; r++) acc[r] = v_set1(0.0f);
    for (int64_t g = 0; g < groups; g++) {
        const int64_t block = t * groups + g;
        ivec16 low[4], high[4];  /* inputs 4i..4i+3 and 16+4i..16+4i+3 of the group, for 16 outputs */
        for (int i = 0; i < 4; i++) iv_nibbles(w->q + (block * 4 + i) * 64, &low[i], &high[i]);
        const vec16 vd = v_f16(w->d + block * TILE);
        const vec16 vm = with_min ? v_f16(w->m + block * TILE) : v_set1(0.0f);
        for (int r = 0; r < count; r++) {
            const int64_t at = (first + r) * groups + g;
            const int32_t *quads = a->quads + at * 16;
            /* integer sums are exact, so how iv_group splits them does not change them */
            ivec16 hi = iv_group(low, high, quads);
            ivec16 lo = first + r < coarse ? iv_group(low, high, quads + 8) : iv_zero();
            if (offset) {  /* (q - offset) . x = q . x - offset * sum(x), exactly */
                hi = iv_minus(hi, offset * a->parts[at * 2]);
                if (first + r < coarse) lo = iv_minus(lo, offset * a->parts[at * 2 + 1]);
            }
            const vec16 dot = v_fma(iv_float(hi), v_set1((float)RESIDUAL), iv_float(lo));
            acc[r] = v_fma(vd, v_mul(dot, v_set1(a->scale[at])), acc[r]);
            if (with_min) acc[r] = v_fma(vm, v_set1(a->sum[at]), acc[r]);
        }
    }
    store_tile(acc, count, w->n, t, y + first * ldy, ldy);
}

#define NIBBLE_BLOCK(with_min, offset)                                                                           \
    switch (count) {                                                                                              \
        case 1: nibble_tile(w, a, t, first, 1, coarse, y, ldy, with_min, offset); break;                          \
        case 2: nibble_tile(w, a, t, first, 2, coarse, y, ldy, with_min, offset); break;                          \
        case 3: nibble_tile(w, a, t, first, 3, coarse, y, ldy, with_min, offset); break;                          \
        default: nibble_tile(w, a, t, first, ROW_BLOCK, coarse, y, ldy, with_min, offset); break;                 \
    }

/* Q4_1 (an m, no offset) and Q4_0 (no m, an offset of 8): each its own compiled loop */
static void q4_1_block(const QWeight *w, const Activations *a, int64_t t, int64_t first, int64_t count,
                       int64_t coarse, float *y, int64_t ldy) {
    NIBBLE_BLOCK(1, 0)
}

static void q4_0_block(const QWeight *w, const Activations *a, int64_t t, int64_t first, int64_t count,
                       int64_t coarse, float *y, int64_t ldy) {
    NIBBLE_BLOCK(0, 8)
}

static void nibble_rows(const QWeight *w, const Activations *a, int64_t rows, int64_t coarse, float *y, int64_t ldy,
                        int threads) {
    const int64_t tiles = (w->n + TILE - 1) / TILE;
    const int min_form = w->m != NULL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t first = 0; first < rows; first += ROW_BLOCK) {
            const int64_t count = rows - first < ROW_BLOCK ? rows - first : ROW_BLOCK;
            if (min_form)
                q4_1_block(w, a, t, first, count, coarse, y, ldy);
            else
                q4_0_block(w, a, t, first, count, coarse, y, ldy);
        }
}

static void byte_rows(const QWeight *w, const Activations *a, int64_t rows, int64_t coarse, float *y, int64_t ldy,
                      int threads) {
    const int64_t groups = w->k / GROUP, tiles = (w->n + TILE - 1) / TILE;
    const int8_t *q = (const int8_t *)w->q;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t first = 0; first < rows; first += ROW_CHUNK) {
            const int64_t count = rows - first < ROW_CHUNK ? rows - first : ROW_CHUNK;
            vec16 acc[ROW_CHUNK];
            for (int64_t r = 0; r < count; r++) acc[r] = v_set1(0.0f);
            for (int64_t g = 0; g < groups; g++) {
                const int64_t block = t * groups + g;
                s8vec wq[8];  /* inputs 4i..4i+3 of the group, for 16 outputs */
                for (int i = 0; i < 8; i++) wq[i] = s8_load(q + (block * 8 + i) * 64);
                const vec16 vd = v_f16(w->d + block * TILE);
                const vec16 vm = w->m ? v_f16(w->m + block * TILE) : v_set1(0.0f);
                for (int64_t r = 0; r < count; r++) {
                    const int64_t at = (first + r) * groups + g;
                    const int32_t *quads = a->quads + at * 16;
                    ivec16 c0 = iv_zero(), c1 = iv_zero(), c2 = iv_zero(), c3 = iv_zero(), lo;
                    if (first + r < coarse) {
                        for (int i = 0; i < 4; i++) {
                            c0 = s8_dot4(c0, wq[i], quads[i]);
                            c1 = s8_dot4(c1, wq[i + 4], quads[i + 4]);
                            c2 = s8_dot4(c2, wq[i], quads[i + 8]);
                            c3 = s8_dot4(c3, wq[i + 4], quads[i + 12]);
                        }
                        lo = iv_minus(iv_add(c2, c3), S8_BIAS * a->parts[at * 2 + 1]);  /* see below */
                    } else {  /* hi alone: see the header */
                        for (int i = 0; i < 2; i++) {
                            c0 = s8_dot4(c0, wq[i], quads[i]);
                            c1 = s8_dot4(c1, wq[i + 4], quads[i + 4]);
                            c2 = s8_dot4(c2, wq[i + 2], quads[i + 2]);
                            c3 = s8_dot4(c3, wq[i + 6], quads[i + 6]);
                        }
                        c0 = iv_add(c0, c2), c1 = iv_add(c1, c3), lo = iv_zero();
                    }
                    /* the biased weights' extra term off, exactly (S8_BIAS 0: nothing to take off) */
                    const ivec16 hi = iv_minus(iv_add(c0, c1), S8_BIAS * a->parts[at * 2]);
                    const vec16 dot = v_fma(iv_float(hi), v_set1((float)RESIDUAL), iv_float(lo));
                    acc[r] = v_fma(vd, v_mul(dot, v_set1(a->scale[at])), acc[r]);
                    if (w->m) acc[r] = v_fma(vm, v_set1(a->sum[at]), acc[r]);
                }
            }
            store_tile(acc, count, w->n, t, y + first * ldy, ldy);
        }
}

int weight_rows(const float *x, int64_t rows, int64_t coarse, const QWeight *w, int64_t members, float *y,
                int threads) {
    if (rows <= 0) return 0;
    int64_t ldy = 0;
    for (int64_t i = 0; i < members; i++) {
        if (w[i].packing != PACK_NIBBLES && w[i].packing != PACK_BYTES) return 2;
        ldy += w[i].n;
    }
    Activations a;
    if (quantize_rows(x, rows, w[0].k, &a)) return 1;  /* once for all the members */
    for (int64_t i = 0, column = 0; i < members; column += w[i++].n) {
        if (w[i].packing == PACK_NIBBLES)
            nibble_rows(&w[i], &a, rows, coarse, y + column, ldy, threads);
        else
            byte_rows(&w[i], &a, rows, coarse, y + column, ldy, threads);
    }
    free(a.quads);
    return 0;
}

/* x as fp32 (from bf16 when x_bf16), in a buffer with `spare` more floats after it */
static float *fp32_rows(const void *x, int x_bf16, int64_t count, int64_t spare) {
    float *xf = malloc(sizeof(float) * (size_t)(count + spare));
    if (!xf) return NULL;
    for (int64_t i = 0; i < count; i++)
        xf[i] = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
    return xf;
}

static void store_rows(const float *yf, int64_t count, void *y, int y_bf16) {
    for (int64_t i = 0; i < count; i++) {
        if (y_bf16)
            ((uint16_t *)y)[i] = f32_to_bf16(yf[i]);
        else
            ((float *)y)[i] = yf[i];
    }
}

/* The Python entry point: x [rows, k] and y [rows, sum of the members' n] in bf16 or fp32; rows from `coarse` on
 * from hi alone. 0 on success, as weight_rows. */
int weight_matmul(const void *x, int x_bf16, int64_t rows, int64_t coarse, const QWeight *w, int64_t members,
                  void *y, int y_bf16, int threads) {
    if (rows <= 0) return 0;
    int64_t n = 0;
    for (int64_t i = 0; i < members; i++) n += w[i].n;
    const int64_t k = w[0].k;
    float *xf = fp32_rows(x, x_bf16, rows * k, y_bf16 ? rows * n : 0);
    if (!xf) return 1;
    float *yf = y_bf16 ? xf + rows * k : (float *)y;
    const int status = weight_rows(xf, rows, coarse, w, members, yf, threads);
    if (y_bf16) store_rows(yf, rows * n, y, y_bf16);
    free(xf);
    return status;
}
