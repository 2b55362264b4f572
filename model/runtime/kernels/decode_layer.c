/* One decoder layer of a Llama, Qwen2 or Qwen3 network for a decoding pass, in one call: the rows of every answer in
 * the pass.
 *
 * Why: with the matmuls at memory speed, what was left of a pass was ~60 small torch operations a layer (norms,
 * rotary, cache writes, attention set-up, residual adds), ~10 ms a pass that no thread count shortens. Here they
 * are loops over a few rows, between the quantized matmuls of quant_matmul.c. Rows of several answers share each
 * weight read: a pass of four answers reads the weights once, as a pass of one does.
 *
 * The same computation as model/runtime/fast_pass.py (transformers' Llama plus the gated LoRA on the noisy rows,
 * when the model has an adapter; Qwen2's q/k/v biases, added after the projection; Qwen3's RMS norms of each q and k
 * head, before the rotary), with the residual stream, norms, rotary, attention and LoRA in fp32, and keys and values
 * rounded to bf16 as the cache holds them.
 *
 * Rows: the clean rows of every answer first, then the noisy ones (the LoRA on, from `start`), the drafting mask
 * rows last (coarse matmuls, from `coarse`: quant_matmul.c). Each row names its answer's cache slot and the position
 * its key and value are written at; it attends its own slot only, with its own bias row.
 *
 * Exactness: every row is computed as if alone, whatever the other rows and answers of the pass. Matmuls: see
 * quant_matmul.c. LoRA: each (row, output) sums in one fixed order. Attention: one (row, key head) a thread, keys in
 * index order, and a masked key adds exactly nothing (its weight is exp(-huge) = 0), so a row's output is the same
 * bits whatever the rows beside it and however many masked keys the pass carries.
 */

#include <stdlib.h>

#include "kernels.h"
#include "vec16.h"

/* A fused linear's LoRA: `members` side-by-side outputs, member i's outputs [end[i-1], end[i]), computed as
 * scale * (x @ a_i.T) @ b_i.T for the noisy rows. a: [members * rank, k]; bt: the b's transposed, [rank, n]; both
 * bf16 (widened to fp32 as they are loaded: the factors are read once a pass, ~20 MB in fp32 for the bundled
 * model, as much time as the products); a NULL when none. */
typedef struct {
    const uint16_t *a;
    const uint16_t *bt;
    int64_t rank;
    int64_t members;
    int64_t end[4];
} LoRA;

/* A fused linear: up to 3 weights side by side (q, k, v; gate, up), each in its own block format (a "Q4_K_M" file
 * mixes them), multiplied by one quantization of the activations; and its LoRA. */
typedef struct {
    QWeight members[3];
    int64_t count;
    LoRA lora;
} Linear;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps, attn_scale, lora_scale;
    const float *input_norm, *post_norm;
    const float *qkv_bias;       /* [q + 2 kv] or NULL (Qwen2's) */
    const float *q_norm, *k_norm; /* [head_dim] each or NULL (Qwen3's) */
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

/* Rows of the LoRA's products computed together, in registers: each factor's vector is loaded once for them. A
 * block of fewer rows repeats its last row (computed, not stored): every row's arithmetic is its own. */
#define LORA_ROWS 4

/* How far ahead the LoRA's loops ask for their factors (elements): `dots` reads a's vectors one after another,
 * `lora_tile` a column of 16 outputs across bt's `rank` rows, as many streams as the rank, more than the hardware's
 * prefetcher follows (a pass of 1 clean + 3 mask rows 3 % shorter). */
#define A_AHEAD 512
#define BT_AHEAD 128

/* out[j] = x[j] . a for the block's rows x[j] [n] and one vector a [n]: per row, 16 lanes of partial sums in input
 * order (a tail of under 16 added to the first lanes), then their fixed tree. */
static void dots(const float *const x[LORA_ROWS], const uint16_t *a, int64_t n, float out[LORA_ROWS]) {
    vec16 s0 = v_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + TILE <= n; i += TILE) {
        if (!(i & 31)) __builtin_prefetch(a + i + A_AHEAD, 0, 3);  /* a line every 32 elements */
        const vec16 av = v_bf16(a + i);
        s0 = v_fma(v_load(x[0] + i), av, s0);
        s1 = v_fma(v_load(x[1] + i), av, s1);
        s2 = v_fma(v_load(x[2] + i), av, s2);
        s3 = v_fma(v_load(x[3] + i), av, s3);
    }
    const vec16 s[LORA_ROWS] = {s0, s1, s2, s3};
    for (int j = 0; j < LORA_ROWS; j++) {
        vec16 sj = s[j];
        if (i < n) {
            float lane[TILE];
            v_store(lane, sj);
            for (int64_t t = i, l = 0; t < n; t++, l++) lane[l] = __builtin_fmaf(x[j][t], bf16_to_f32(a[t]), lane[l]);
            sj = v_load(lane);
        }
        out[j] = v_sum(sj);
    }
}

/* y[j][o..o+16) += scale * sum_c t[j][c] * bt[c, o..o+16) over one member's rank, c in order, for the block's
 * `count` real rows (of LORA_ROWS computed). */
static void lora_tile(const float *const t[LORA_ROWS], const uint16_t *bt, int64_t n, int64_t rank, int64_t o,
                      float scale, float *const y[LORA_ROWS], int64_t count) {
    if (!(o & 31))
        for (int64_t c = 0; c < rank; c++) __builtin_prefetch(bt + c * n + o + BT_AHEAD, 0, 3);
    const vec16 b0 = v_bf16(bt + o);
    vec16 s0 = v_mul(v_set1(t[0][0]), b0), s1 = v_mul(v_set1(t[1][0]), b0);
    vec16 s2 = v_mul(v_set1(t[2][0]), b0), s3 = v_mul(v_set1(t[3][0]), b0);
    for (int64_t c = 1; c < rank; c++) {
        const vec16 b = v_bf16(bt + c * n + o);
        s0 = v_fma(v_set1(t[0][c]), b, s0);
        s1 = v_fma(v_set1(t[1][c]), b, s1);
        s2 = v_fma(v_set1(t[2][c]), b, s2);
        s3 = v_fma(v_set1(t[3][c]), b, s3);
    }
    const vec16 s[LORA_ROWS] = {s0, s1, s2, s3};
    for (int64_t j = 0; j < count; j++) v_store(y[j] + o, v_fma(v_set1(scale), s[j], v_load(y[j] + o)));
}

/* The same arithmetic as `lora_tile`, for the single output o. */
static void lora_output(const float *const t[LORA_ROWS], const uint16_t *bt, int64_t n, int64_t rank, int64_t o,
                        float scale, float *const y[LORA_ROWS], int64_t count) {
    for (int64_t j = 0; j < count; j++) {
        float s = t[j][0] * bf16_to_f32(bt[o]);
        for (int64_t c = 1; c < rank; c++) s = __builtin_fmaf(t[j][c], bf16_to_f32(bt[c * n + o]), s);
        y[j][o] = __builtin_fmaf(scale, s, y[j][o]);
    }
}

/* Pointers to the rows of block b: rows b * LORA_ROWS on, the last real one repeated; returns the real count. */
static int64_t block_rows(float *base, int64_t stride, int64_t rows, int64_t b, float *out[LORA_ROWS]) {
    const int64_t first = b * LORA_ROWS, count = rows - first < LORA_ROWS ? rows - first : LORA_ROWS;
    for (int64_t j = 0; j < LORA_ROWS; j++) out[j] = base + (first + (j < count ? j : count - 1)) * stride;
    return count;
}

/* y += scale * (x @ a.T) @ b.T, member by member, on `rows` rows x [rows, k], y [rows, n]: each factor read once
 * per LORA_ROWS rows, the work split over the factors' vectors and outputs (not the rows, which are few). 0 on
 * success, 1 out of memory. */
static int lora(const LoRA *l, float scale, const float *x, int64_t rows, int64_t k, int64_t n, float *y,
                int threads) {
    const int64_t rank = l->rank, inner = l->members * rank, blocks = (rows + LORA_ROWS - 1) / LORA_ROWS;
    float *t = malloc(sizeof(float) * (size_t)(rows * inner));  /* x @ a.T: [rows, inner] */
    if (!t) return 1;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for collapse(2) schedule(static)
        for (int64_t c = 0; c < inner; c++)
            for (int64_t b = 0; b < blocks; b++) {
                float *xs[LORA_ROWS], out[LORA_ROWS];
                const int64_t count = block_rows((float *)x, k, rows, b, xs);
                dots((const float *const *)xs, l->a + c * k, k, out);
                for (int64_t j = 0; j < count; j++) t[(b * LORA_ROWS + j) * inner + c] = out[j];
            }
        for (int64_t member = 0, first = 0; member < l->members; first = l->end[member++]) {
            const int64_t end = l->end[member], whole = (end - first) / TILE, tail = (end - first) % TILE;
#pragma omp for collapse(2) schedule(static) nowait
            for (int64_t o = 0; o < whole + tail; o++)
                for (int64_t b = 0; b < blocks; b++) {
                    float *ts[LORA_ROWS], *ys[LORA_ROWS];
                    const int64_t count = block_rows(t + member * rank, inner, rows, b, ts);
                    block_rows(y, n, rows, b, ys);
                    if (o < whole)
                        lora_tile((const float *const *)ts, l->bt, n, rank, first + o * TILE, scale, ys, count);
                    else
                        lora_output((const float *const *)ts, l->bt, n, rank, first + whole * TILE + (o - whole),
                                    scale, ys, count);
                }
        }
    }
    free(t);
    return 0;
}

/* y = x @ w.T (+ the LoRA on rows >= start; rows >= coarse without the activations' remainder); y [rows, n].
 * 0 on success, 1 out of memory, 2 a LoRA of more than 4 members. */
static int linear(const Linear *l, float lora_scale, const float *x, int64_t rows, int64_t start, int64_t coarse,
                  float *y, int threads) {
    if (l->count < 1 || l->count > 3) return 2;
    const int64_t k = l->members[0].k;
    int64_t n = 0;
    for (int64_t i = 0; i < l->count; i++) n += l->members[i].n;
    const int status = weight_rows(x, rows, coarse, l->members, l->count, y, threads);
    if (status) return status;
    if (!l->lora.a || start >= rows) return 0;
    if (l->lora.members > 4) return 2;
    return lora(&l->lora, lora_scale, x + start * k, rows - start, k, n, y + start * n, threads);
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

/* The layer on the residual rows h [rows, hidden] (in place). Rows >= start are noisy (LoRA on), rows >= coarse
 * drafting masks (coarse matmuls). Row r's key and value are written at position position[r] of its answer's slot
 * slot[r] of the layer's cache, keys/values [slots, kv_heads, capacity, head_dim] bf16; it attends over its slot's
 * positions [0, key_len) with the additive bias row bias[r] [key_len]. cos, sin: [rows, head_dim]. 0 on success,
 * 1 out of memory, 2 unsupported shape; on an error h is left part-way. */
int decode_layer(const Layer *L, float *h, int64_t rows, int64_t start, int64_t coarse, const float *cos,
                 const float *sin, uint16_t *keys, uint16_t *values, int64_t capacity, const int64_t *slot,
                 const int64_t *position, int64_t key_len, const float *bias, int threads) {
    const int64_t hidden = L->hidden, dim = L->head_dim, heads = L->heads, kv_heads = L->kv_heads;
    const int64_t group = heads / kv_heads, q_size = heads * dim, kv_size = kv_heads * dim;
    const int64_t qkv_n = q_size + 2 * kv_size, inter = L->intermediate, slot_size = kv_heads * capacity * dim;
    if (dim % TILE || dim > 8 * TILE || heads % kv_heads || L->intermediate % TILE || key_len > capacity)
        return 2;
    if (rows <= 0) return 0;
    for (int64_t r = 0; r < rows; r++)
        if (position[r] < 0 || position[r] >= key_len || slot[r] < 0) return 2;
    const int64_t size = rows * (hidden + qkv_n + q_size + 2 * inter + inter + hidden);
    float *x = malloc(sizeof(float) * (size_t)size);
    if (!x) return 1;
    float *qkv = x + rows * hidden, *att = qkv + rows * qkv_n, *gu = att + rows * q_size;
    float *act = gu + rows * 2 * inter, *tmp = act + rows * inter;
    int failed = 0;  /* a step's error code: the layer stops there (nothing half-computed reaches the cache) */

    rms_norm(h, L->input_norm, rows, hidden, L->eps, x);
    if ((failed = linear(&L->qkv, L->lora_scale, x, rows, start, coarse, qkv, threads))) goto done;
    for (int64_t r = 0; r < rows; r++) {
        float *row = qkv + r * qkv_n;
        if (L->qkv_bias)
            for (int64_t i = 0; i < qkv_n; i++) row[i] += L->qkv_bias[i];
        if (L->q_norm) {  /* in place, head by head: each head's row is read whole before it is written */
            rms_norm(row, L->q_norm, heads, dim, L->eps, row);
            rms_norm(row + q_size, L->k_norm, kv_heads, dim, L->eps, row + q_size);
        }
        rotate(row, heads + kv_heads, dim, cos + r * dim, sin + r * dim);  /* q and k are adjacent */
        for (int64_t g = 0; g < kv_heads; g++)
            for (int64_t i = 0; i < dim; i++) {
                const int64_t at = slot[r] * slot_size + (g * capacity + position[r]) * dim + i;
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
                    attend_group(qkv + r * qkv_n + g * group * dim, group, dim,
                                 keys + slot[r] * slot_size + g * capacity * dim,
                                 values + slot[r] * slot_size + g * capacity * dim, key_len, bias + r * key_len,
                                 L->attn_scale, scores, att + r * q_size + g * group * dim);
        free(scores);
    }
    if ((failed = no_memory) || (failed = linear(&L->o, L->lora_scale, att, rows, start, coarse, tmp, threads))) goto done;
    for (int64_t i = 0; i < rows * hidden; i++) h[i] += tmp[i];

    rms_norm(h, L->post_norm, rows, hidden, L->eps, x);
    if ((failed = linear(&L->gate_up, L->lora_scale, x, rows, start, coarse, gu, threads))) goto done;
    for (int64_t r = 0; r < rows; r++)  /* silu(gate) * up; the intermediate size is a multiple of 16 */
        for (int64_t i = 0; i < inter; i += TILE) {
            const vec16 g = v_load(gu + r * 2 * inter + i), u = v_load(gu + r * 2 * inter + inter + i);
            const vec16 e = v_exp(v_mul(g, v_set1(-1.0f)));
            v_store(act + r * inter + i, v_mul(v_div(g, v_add(v_set1(1.0f), e)), u));
        }
    if ((failed = linear(&L->down, L->lora_scale, act, rows, start, coarse, tmp, threads))) goto done;
    for (int64_t i = 0; i < rows * hidden; i++) h[i] += tmp[i];
done:
    free(x);
    return failed;
}

/* Every layer of a pass in one call, layer i with its own cache buffers keys[i] and values[i] (capacity[i]
 * positions): one call from Python a pass instead of one a layer (30 for the bundled model, ~0.1 ms of argument
 * conversion and Python a pass). Stops at the first layer that fails: its status, and its index in
 * *failed_layer. */
int decode_layers(const Layer *layers, int64_t count, float *h, int64_t rows, int64_t start, int64_t coarse,
                  const float *cos, const float *sin, uint16_t *const *keys, uint16_t *const *values,
                  const int64_t *capacity, const int64_t *slot, const int64_t *position, int64_t key_len,
                  const float *bias, int threads, int64_t *failed_layer) {
    for (int64_t i = 0; i < count; i++) {
        const int status = decode_layer(&layers[i], h, rows, start, coarse, cos, sin, keys[i], values[i],
                                        capacity[i], slot, position, key_len, bias, threads);
        if (status) {
            *failed_layer = i;
            return status;
        }
    }
    return 0;
}

/* The final norm and the head on the last layer's rows h [rows, hidden]: logits [rows, n] = rms_norm(h) @ head.T,
 * rows from `coarse` on without the activations' remainder, as `weight_rows`. One call after `decode_layers`: the
 * same norm as each layer's, and no torch operation between the layers and the head (each costs several times its
 * warm time once the weights' stream has evicted torch from the caches). 0 on success, 1 out of memory, else as
 * `weight_rows`. */
int norm_logits(const float *h, int64_t rows, int64_t hidden, const float *norm, float eps, int64_t coarse,
                const QWeight *head, int64_t members, float *logits, int threads) {
    if (rows <= 0) return 0;
    float *x = malloc(sizeof(float) * (size_t)(rows * hidden));
    if (!x) return 1;
    rms_norm(h, norm, rows, hidden, eps, x);
    const int status = weight_rows(x, rows, coarse, head, members, logits, threads);
    free(x);
    return status;
}
