/* Weight-only quantized matmuls for a decoding pass: y = x @ w.T with w in the GGUF's Q4_1 or Q8_0 blocks.
 *
 * Why our own kernel: a pass of a few rows is bound by reading and unpacking the weights. Each block of weights is
 * unpacked once into fp32 registers and used by every row of the pass, so a row costs one FMA per weight.
 *
 * Exactness: a row's output never depends on the other rows, the row count or the thread count. Every output
 * element is computed by one thread, in one fixed order: per group of 32 inputs, four partial sums over the
 * group's inputs j = 0 mod 4, 1 mod 4, ... added as (s0 + s1) + (s2 + s3), then y += d * s + m * sum(x of the
 * group). The weights are the file's values exactly (4-bit or 8-bit values, fp16 scales held as fp32); activations
 * and sums are fp32.
 *
 * Layout (built by model/runtime/int4_weights.py): outputs in tiles of 16, inputs in groups of 32.
 *   Q4_1: nibbles[tile][group][j in 0..15][output in 0..15] = q[., 32 g + j] | q[., 32 g + j + 16] << 4,
 *         d[tile][group][16], m[tile][group][16] (fp32).
 *   Q8_0: q[tile][group][j in 0..31][output in 0..15] (int8), d[tile][group][16].
 * Weights are zero-padded to whole tiles; n may end in a partial one.
 */

#include <stdlib.h>

#include "kernels.h"
#include "vec16.h"

void group_sums(const float *x, int64_t rows, int64_t k, float *xsum) {
    const int64_t groups = k / GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int j = 0; j < GROUP; j++) s += x[r * k + g * GROUP + j];
            xsum[r * groups + g] = s;
        }
}

/* The group's 32 weights for 16 outputs (fp32) times one row's 32 inputs. */
static inline vec16 group_dot(const vec16 *w, const float *xr) {
    vec16 s0 = v_mul(w[0], v_set1(xr[0])), s1 = v_mul(w[1], v_set1(xr[1]));
    vec16 s2 = v_mul(w[2], v_set1(xr[2])), s3 = v_mul(w[3], v_set1(xr[3]));
    for (int j = 4; j < GROUP; j += 4) {
        s0 = v_fma(w[j], v_set1(xr[j]), s0);
        s1 = v_fma(w[j + 1], v_set1(xr[j + 1]), s1);
        s2 = v_fma(w[j + 2], v_set1(xr[j + 2]), s2);
        s3 = v_fma(w[j + 3], v_set1(xr[j + 3]), s3);
    }
    return v_add(v_add(s0, s1), v_add(s2, s3));
}

static void store_tile(const vec16 *acc, int64_t rows, int64_t n, int64_t tile, float *y) {
    const int64_t first = tile * TILE, width = n - first < TILE ? n - first : TILE;
    for (int64_t r = 0; r < rows; r++) {
        float lane[TILE];
        v_store(lane, acc[r]);
        for (int64_t o = 0; o < width; o++) y[r * n + first + o] = lane[o];
    }
}

void q4_1_rows(const float *x, const float *xsum, int64_t rows, const Q4Weight *w, float *y, int threads) {
    const int64_t k = w->k, n = w->n, groups = k / GROUP, tiles = (n + TILE - 1) / TILE;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++) {
        vec16 acc[rows];
        for (int64_t r = 0; r < rows; r++) acc[r] = v_set1(0.0f);
        for (int64_t g = 0; g < groups; g++) {
            const int64_t block = t * groups + g;
            vec16 wf[GROUP];
            for (int j = 0; j < GROUP / 2; j++)
                v_nibbles(w->nibbles + (block * (GROUP / 2) + j) * TILE, &wf[j], &wf[j + GROUP / 2]);
            const vec16 vd = v_load(w->d + block * TILE), vm = v_load(w->m + block * TILE);
            for (int64_t r = 0; r < rows; r++) {
                acc[r] = v_fma(vd, group_dot(wf, x + r * k + g * GROUP), acc[r]);
                acc[r] = v_fma(vm, v_set1(xsum[r * groups + g]), acc[r]);
            }
        }
        store_tile(acc, rows, n, t, y);
    }
}

static void q8_0_rows(const float *x, int64_t rows, int64_t k, int64_t n, const int8_t *q, const float *d, float *y,
                      int threads) {
    const int64_t groups = k / GROUP, tiles = (n + TILE - 1) / TILE;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++) {
        vec16 acc[rows];
        for (int64_t r = 0; r < rows; r++) acc[r] = v_set1(0.0f);
        for (int64_t g = 0; g < groups; g++) {
            const int64_t block = t * groups + g;
            vec16 wf[GROUP];
            for (int j = 0; j < GROUP; j++) wf[j] = v_bytes(q + (block * GROUP + j) * TILE);
            const vec16 vd = v_load(d + block * TILE);
            for (int64_t r = 0; r < rows; r++) acc[r] = v_fma(vd, group_dot(wf, x + r * k + g * GROUP), acc[r]);
        }
        store_tile(acc, rows, n, t, y);
    }
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

/* The Python entry points: x [rows, k] and y [rows, n] in bf16 or fp32. 0 on success. */
int q4_1_matmul(const void *x, int x_bf16, int64_t rows, const Q4Weight *w, void *y, int y_bf16, int threads) {
    const int64_t groups = w->k / GROUP;
    float *xf = fp32_rows(x, x_bf16, rows * w->k, rows * groups + rows * w->n);
    if (!xf) return 1;
    float *xsum = xf + rows * w->k, *yf = xsum + rows * groups;
    group_sums(xf, rows, w->k, xsum);
    q4_1_rows(xf, xsum, rows, w, yf, threads);
    store_rows(yf, rows * w->n, y, y_bf16);
    free(xf);
    return 0;
}

int q8_0_matmul(const void *x, int x_bf16, int64_t rows, int64_t k, int64_t n, const int8_t *q, const float *d,
                float *y, int threads) {
    float *xf = fp32_rows(x, x_bf16, rows * k, 0);
    if (!xf) return 1;
    q8_0_rows(xf, rows, k, n, q, d, y, threads);
    free(xf);
    return 0;
}
