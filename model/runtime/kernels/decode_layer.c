/* One decoder layer of the bundled Llama for a decoding pass of one answer, in one call.
 *
 * Why: with the matmuls at memory speed, what was left of a pass was ~60 small torch operations a layer (norms,
 * rotary, cache writes, attention set-up, residual adds), ~10 ms a pass that no thread count shortens. Here they
 * are loops over a few rows, between the quantized matmuls of quant_matmul.c.
 *
 * The same computation as model/runtime/fast_pass.py (transformers' Llama plus the gated LoRA on the noisy rows),
 * with the residual stream, norms, rotary, attention and LoRA in fp32, and keys and values rounded to bf16 as the
 * cache holds them.
 *
 * Exactness: every row is computed as if alone. Matmuls: see quant_matmul.c. Attention: one (row, key head) a
 * thread, keys in index order, and a masked key adds exactly nothing (its weight is exp(-huge) = 0), so a row's
 * output is the same bits whatever the rows beside it and however many masked keys the pass carries.
 */

#include <stdlib.h>

#include "kernels.h"
#include "vec16.h"

/* A fused linear's LoRA: `members` side-by-side outputs, member i's outputs [end[i-1], end[i]), computed as
 * scale * (x @ a_i.T) @ b_i.T for the noisy rows. a: [members * rank, k]; bt: the b's transposed, [rank, n]
 * (fp32); a NULL when none. */
typedef struct {
    const float *a;
    const float *bt;
    int64_t rank;
    int64_t members;
    int64_t end[4];
} LoRA;

typedef struct {
    Q4Weight weight;
    LoRA lora;
} Linear;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps, attn_scale, lora_scale;
    const float *input_norm, *post_norm;
    Linear qkv, o, gate_up, down;
} Layer;

static void rms_norm(const float *x, const float *weight, int64_t rows, int64_t width, float eps, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        float s = 0.0f;
        for (int64_t i = 0; i < width; i++) s += xr[i] * xr[i];
        const float inv = 1.0f / __builtin_sqrtf(s / (float)width + eps);
        for (int64_t i = 0; i < width; i++) y[r * width + i] = weight[i] * (xr[i] * inv);
    }
}

/* x . y over n floats: 16 lanes of partial sums (a tail of under 16 added to the first lanes), then their
 * fixed tree. */
static float dot(const float *x, const float *y, int64_t n) {
    vec16 s = v_set1(0.0f);
    int64_t i = 0;
    for (; i + TILE <= n; i += TILE) s = v_fma(v_load(x + i), v_load(y + i), s);
    if (i < n) {
        float lane[TILE];
        v_store(lane, s);
        for (int64_t j = 0; i < n; i++, j++) lane[j] = __builtin_fmaf(x[i], y[i], lane[j]);
        s = v_load(lane);
    }
    return v_sum(s);
}

/* y = x @ w.T (+ the LoRA on rows >= start); y [rows, n]. 0 on success, 1 out of memory, 2 a LoRA of more than
 * 4 members of rank 64. */
static int linear(const Linear *l, float lora_scale, const float *x, int64_t rows, int64_t start, float *y,
                  int threads) {
    const Q4Weight *w = &l->weight;
    if (q4_1_rows(x, rows, w, y, threads)) return 1;
    if (l->lora.a && start < rows) {
        const int64_t rank = l->lora.rank, inner = l->lora.members * rank;
        if (l->lora.members > 4 || inner > 4 * 64) return 2;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t r = start; r < rows; r++) {
            float t[4 * 64];  /* x @ a.T of this row: members * rank */
            const float *xr = x + r * w->k;
            float *yr = y + r * w->n;
            for (int64_t c = 0; c < inner; c++) t[c] = dot(xr, l->lora.a + c * w->k, w->k);
            for (int64_t member = 0, first = 0; member < l->lora.members; first = l->lora.end[member++]) {
                const float *tm = t + member * rank;
                int64_t o = first;
                for (; o + TILE <= l->lora.end[member]; o += TILE) {
                    vec16 s = v_mul(v_set1(tm[0]), v_load(l->lora.bt + o));
                    for (int64_t c = 1; c < rank; c++) s = v_fma(v_set1(tm[c]), v_load(l->lora.bt + c * w->n + o), s);
                    v_store(yr + o, v_fma(v_set1(lora_scale), s, v_load(yr + o)));
                }
                for (; o < l->lora.end[member]; o++) {  /* the same arithmetic, one output at a time */
                    float s = tm[0] * l->lora.bt[o];
                    for (int64_t c = 1; c < rank; c++) s = __builtin_fmaf(tm[c], l->lora.bt[c * w->n + o], s);
                    yr[o] = __builtin_fmaf(lora_scale, s, yr[o]);
                }
            }
        }
    }
    return 0;
}

/* transformers' rotate_half rotary on each head of `x` [heads, dim], with the row's cos and sin [dim]. */
static void rotate(float *x, int64_t heads, int64_t dim, const float *cos, const float *sin) {
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * dim;
        for (int64_t i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cos[i] - b * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/* One query row's heads of one key head's group over keys [0, key_len): out [group, dim]. head_dim is a multiple
 * of 16; scores a buffer of group * (key_len rounded up to 16) floats. */
static void attend_group(const float *q, int64_t group, int64_t dim, const uint16_t *keys, const uint16_t *values,
                         int64_t key_len, const float *bias, float scale, float *scores, float *out) {
    const int64_t lanes = dim / TILE, padded = (key_len + TILE - 1) / TILE * TILE;
    for (int64_t j = 0; j < key_len; j++) {
        vec16 k[8];
        for (int64_t c = 0; c < lanes; c++) k[c] = v_bf16(keys + j * dim + c * TILE);
        for (int64_t a = 0; a < group; a++) {
            vec16 s = v_mul(v_load(q + a * dim), k[0]);
            for (int64_t c = 1; c < lanes; c++) s = v_fma(v_load(q + a * dim + c * TILE), k[c], s);
            scores[a * padded + j] = v_sum(s) * scale + bias[j];
        }
    }
    for (int64_t a = 0; a < group; a++) {
        float *sa = scores + a * padded;
        float top = sa[0], total = 0.0f;
        for (int64_t j = 1; j < key_len; j++) top = sa[j] > top ? sa[j] : top;
        for (int64_t j = key_len; j < padded; j++) sa[j] = -3.0e38f;  /* exp gives 0 */
        for (int64_t j = 0; j < padded; j += TILE) v_store(sa + j, v_exp(v_add(v_load(sa + j), v_set1(-top))));
        for (int64_t j = 0; j < key_len; j++) total += sa[j];
        vec16 acc[8];
        for (int64_t c = 0; c < lanes; c++) acc[c] = v_set1(0.0f);
        for (int64_t j = 0; j < key_len; j++) {
            if (sa[j] == 0.0f) continue;  /* a masked key: adds exactly nothing */
            const vec16 p = v_set1(sa[j]);
            for (int64_t c = 0; c < lanes; c++) acc[c] = v_fma(p, v_bf16(values + j * dim + c * TILE), acc[c]);
        }
        const vec16 inv = v_set1(1.0f / total);
        for (int64_t c = 0; c < lanes; c++) v_store(out + a * dim + c * TILE, v_mul(acc[c], inv));
    }
}

/* The layer on the residual rows h [rows, hidden] (in place). Rows >= start are noisy (LoRA on). The rows' keys
 * and values are written at positions offset + r of this sequence's cache, keys/values [kv_heads, capacity,
 * head_dim] bf16; row r attends over positions [0, key_len) with the additive bias [rows, key_len]. cos, sin:
 * [rows, head_dim]. 0 on success, 1 out of memory, 2 unsupported shape; on an error h is left part-way. */
int decode_layer(const Layer *L, float *h, int64_t rows, int64_t start, const float *cos, const float *sin,
                 uint16_t *keys, uint16_t *values, int64_t capacity, int64_t offset, int64_t key_len,
                 const float *bias, int threads) {
    const int64_t hidden = L->hidden, dim = L->head_dim, heads = L->heads, kv_heads = L->kv_heads;
    const int64_t group = heads / kv_heads, q_size = heads * dim, kv_size = kv_heads * dim;
    const int64_t qkv_n = q_size + 2 * kv_size, inter = L->intermediate;
    if (dim % TILE || dim > 8 * TILE || heads % kv_heads || L->intermediate % TILE || offset + rows > key_len ||
        key_len > capacity)
        return 2;
    const int64_t size = rows * (hidden + qkv_n + q_size + 2 * inter + inter + hidden);
    float *x = malloc(sizeof(float) * (size_t)size);
    if (!x) return 1;
    float *qkv = x + rows * hidden, *att = qkv + rows * qkv_n, *gu = att + rows * q_size;
    float *act = gu + rows * 2 * inter, *tmp = act + rows * inter;
    int failed = 0;  /* a step's error code: the layer stops there (nothing half-computed reaches the cache) */

    rms_norm(h, L->input_norm, rows, hidden, L->eps, x);
    if ((failed = linear(&L->qkv, L->lora_scale, x, rows, start, qkv, threads))) goto done;
    for (int64_t r = 0; r < rows; r++) {
        float *row = qkv + r * qkv_n;
        rotate(row, heads + kv_heads, dim, cos + r * dim, sin + r * dim);  /* q and k are adjacent */
        for (int64_t g = 0; g < kv_heads; g++)
            for (int64_t i = 0; i < dim; i++) {
                const int64_t at = (g * capacity + offset + r) * dim + i;
                keys[at] = f32_to_bf16(row[q_size + g * dim + i]);
                values[at] = f32_to_bf16(row[q_size + kv_size + g * dim + i]);
            }
    }
    int no_memory = 0;
#pragma omp parallel num_threads(threads) reduction(| : no_memory)
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * ((key_len + TILE - 1) / TILE * TILE)));
        if (!scores) no_memory = 1;
#pragma omp for collapse(2) schedule(static)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < kv_heads; g++)
                if (scores)
                    attend_group(qkv + r * qkv_n + g * group * dim, group, dim, keys + g * capacity * dim,
                                 values + g * capacity * dim, key_len, bias + r * key_len, L->attn_scale, scores,
                                 att + r * q_size + g * group * dim);
        free(scores);
    }
    if ((failed = no_memory) || (failed = linear(&L->o, L->lora_scale, att, rows, start, tmp, threads))) goto done;
    for (int64_t i = 0; i < rows * hidden; i++) h[i] += tmp[i];

    rms_norm(h, L->post_norm, rows, hidden, L->eps, x);
    if ((failed = linear(&L->gate_up, L->lora_scale, x, rows, start, gu, threads))) goto done;
    for (int64_t r = 0; r < rows; r++)  /* silu(gate) * up; the intermediate size is a multiple of 16 */
        for (int64_t i = 0; i < inter; i += TILE) {
            const vec16 g = v_load(gu + r * 2 * inter + i), u = v_load(gu + r * 2 * inter + inter + i);
            const vec16 e = v_exp(v_mul(g, v_set1(-1.0f)));
            v_store(act + r * inter + i, v_mul(v_div(g, v_add(v_set1(1.0f), e)), u));
        }
    if ((failed = linear(&L->down, L->lora_scale, act, rows, start, tmp, threads))) goto done;
    for (int64_t i = 0; i < rows * hidden; i++) h[i] += tmp[i];
done:
    free(x);
    return failed;
}
