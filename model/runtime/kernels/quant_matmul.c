/* Weight-only quantized matmuls for a decoding pass: y = x @ w.T with w in a GGUF's own blocks (Q4_0, Q4_1, Q8_0,
 * Q5_0, Q5_1 and the K-quants: model/gguf/blocks.py packs them; the bundled model's Q4_1 and Q8_0: model/runtime/int4_weights.py).
 *
 * Each row's activations are split, per group of 32, into two 8-bit parts: x ~ scale * (254 * hi + lo), hi the
 * group rounded to 8 bits (scale * 254 = max |x| / 127, as llama.cpp rounds activations) and lo the remainder
 * rounded to 8 bits again. A group's dot product with the 4-bit (Q4_1) or 8-bit (Q8_0) weights is then two exact
 * integer sums (VNNI `vpdpbusd`, or the same sums from `pmaddubsw` on CPUs without it), joined in one rounding
 * (a fused multiply-add of the two sums as floats, each exact below 2^24: the same bits as joining them in int32,
 * without the integer multiply that competes with the dot products for their port):
 * Q4_1: y += d * scale * (254 * sum_hi + sum_lo) + m * sum(x), with sum(x) the group's fp32 sum (coarse rows: below);
 * Q8_0: y += d * scale * (...). Q4_0 (w = d * (q - 8)) takes 8 * sum(hi) and 8 * sum(lo) off the integer sums, exactly,
 * as llama.cpp does. Q5_0, Q5_1 and Q5_K are held at their 5 bits (PACK_FIVES: the nibbles as Q4's, and a plane of
 * fifth bits), unpacked in registers to the bytes q - offset (Q5_0's 16; Q5_1 and Q5_K keep q and add their m) and
 * multiplied by the byte kernel, as Q8_0's (the 5-bit values' pair sums would overflow the nibble kernel's 16-bit
 * sums). K-quants: a sub-block of 32 is a group whose scale (and minimum) is the super-block's fp16 d (and -dmin) times
 * the sub-block's 6-bit integer (SCALES_K), both kept as the file holds them and multiplied per group, once for all the
 * rows: the product is exact in fp32 (11 bits times 6), so it costs a widen, a convert and a multiply of 16 lanes, and
 * the scales cost the file's bits a weight, not two fp32 a group (the super-block's fp16 are converted once per 8
 * groups). Q4_K goes through the nibble kernel, Q5_K through the byte one; Q6_K (held at its 6 bits, PACK_SIXES: a
 * plane of sixth bits more, unpacked to the bytes q - 32) has sub-blocks of 16, each with its own int8 scale under the
 * fp16 d (SCALES_K_HALVES): the byte kernel's two halves of a group, whose integer sums it keeps apart anyway, are each
 * scaled by theirs (8 bits times 11, exact too). llama.cpp sums a super-block's sub-blocks in integers before one fp32
 * multiply; here each sub-block is joined in fp32, in order: the same rules (exact integer dot products, a row's result
 * as if alone, every build the same bits) on a finer rounding of the activations.
 * The remainder is what keeps the answers the bf16 teacher's quality: with hi alone (llama.cpp's rounding) an
 * activation is off by up to 1/254 of its group's largest, which on CPUs that prefill through these kernels made
 * the greedy answers' perplexity 1.05x the bf16 teacher's; with the remainder it is off by 1/64516.
 * The second sum costs the integer units, not memory: the weights are read once for both, and for all rows.
 *
 * The byte kernel on AVX2 (WORD_DOTS in vec16.h) adds no second sum: a row's activation is one int16 word,
 * 254 * hi + lo (|.| <= 32385), and the group's weights are widened to int16, so one `pmaddwd` multiplies both parts
 * (the 8-bit `pmaddubsw` has no signed x signed form: two 8-bit sums there cost twice its instructions, llama.cpp's
 * work twice over). The group's int32 sum is exact (|.| <= 32 * 32385 * 128 < 2^31) and equals 254 * sum(hi) +
 * sum(lo): converted to fp32 it is the one rounding that the other builds' fma of the two sums makes, the same bits.
 * For a row or two (DIRECT_ROWS) each row widens the group in registers; for more, the group is widened into memory
 * once and every row reads it there.
 *
 * Coarse rows: rows from `coarse` on skip the remainder (hi alone, llama.cpp's rounding), half the integer work (the
 * AVX2 byte kernel multiplies their hi bytes by `pmaddubsw`, as llama.cpp does, rather than words: ug_dot in vec16.h).
 * Their minimum term (Q4_1, Q5_1, Q4_K, Q5_K) takes the sum of the rounded activations, unit * sum(hi), as llama.cpp's
 * does: then each activation's rounding error meets its weight, w = d q + m, and not d q alone (q in 0..15 or 0..31,
 * never centred), which made a K-quant file's error 3-4x llama.cpp's in KL (tiny qwen2 Q4_K_M: 0.149 against 0.040).
 * They are a drafting pass's mask rows, whose logits only propose drafts that the clean rows then verify
 * (model/decoding/speculative.py): the answer never depends on them, and a row's rounding is still its own.
 * K-quants (Q4_K, Q5_K, Q6_K) take every row coarse: llama.cpp rounds their activations per 256 (q8_K), so hi per 32
 * is finer than the rounding the file was made for, and the remainder would double the integer work of a user's
 * model (a 1.5B Q4_K_M file's decoding is bound by it on one AVX2 core). The bundled model's Q4_1 and Q8_0, and the
 * other formats, keep it on clean rows: it holds the bundled teacher's perplexity (below).
 *
 * Exactness: a row's output never depends on the other rows, the row count or the thread count. Every output
 * element is computed by one thread, in one fixed order (exact integer sums, then fp32 over the groups in
 * order). AVX-512 and AVX2 builds compute the same bits.
 *
 * Layout (built by model/runtime/int4_weights.py): outputs in tiles of 16, inputs in groups of 32.
 *   PACK_NIBBLES (Q4_1, Q4_0): nibbles[tile][group][i in 0..3][output in 0..15][c in 0..3]
 *         = q[., 32 g + 4 i + c] | q[., 32 g + 16 + 4 i + c] << 4,
 *         d[tile][group][16], m[tile][group][16] (fp16, the file's own; no m for Q4_0).
 *   PACK_BYTES (Q8_0): q[tile][group][i in 0..7][output in 0..15][c in 0..3] = q[., 32 g + 4 i + c] (int8),
 *         d[tile][group][16] (fp16; or a K-quant's scales, below).
 *   PACK_FIVES (Q5_0, Q5_1, Q5_K; values q in 0..31, w = d * (q - offset) (+ m)): FIVES_BYTES (320) a tile's group,
 *         the bytes of PACK_BYTES' group at 5 bits: with j = 4 * output + c, byte 64 i + j (i in 0..3) = the low
 *         4 bits of quad i's q[j] | those of quad i + 4's << 4 (PACK_NIBBLES' order), and byte 256 + j = the fifth
 *         bits of quads 0..7's q[j] as its bits 0..7 (ggml's qh, re-laid out); d and m as above.
 *   PACK_SIXES (Q6_K; q in 0..63, w = d * (q - 32), a d per 16 inputs): SIXES_BYTES (384) a tile's group, PACK_FIVES'
 *         and byte 320 + j = the sixth bits of quads 0..7's q[j].
 *   K-quants' scales (Q4_K with PACK_NIBBLES, Q5_K with PACK_FIVES, Q6_K with PACK_SIXES; k whole super-blocks of
 *         256 inputs, 8 groups): d[tile][super-block][16] and m[tile][super-block][16] fp16, the file's d and minus
 *         its dmin (no m for Q6_K), and sub[tile][group][2][16] int8, the 16 outputs' sub-block scales then their
 *         minimums (SCALES_K: Q4_K's and Q5_K's 6-bit ones), or the scales of inputs 0-15 then of 16-31
 *         (SCALES_K_HALVES: Q6_K's): a group's scale is d * sub[0], its minimum m * sub[1]. 16 lanes are one load
 *         (32 bytes of fp16, 16 of int8) at a multiple of its size: 40 bytes a tile's group of 512 weights (Q6_K
 *         36), 0.63 (0.56) bits a weight, where the file has 0.5 (0.56).
 * Weights are zero-padded to whole tiles; n may end in a partial one.
 */

#include <stdlib.h>

#include "kernels.h"
#include "vec16.h"

/* Rows a tile's accumulators hold at once (on the stack of each thread); more rows are done in chunks. */
#define ROW_CHUNK 64
/* Rows of the Q4_1 kernel whose accumulators stay in registers: a block's rows share each unpacked weight group */
#define ROW_BLOCK 4

/* Rows up to which the AVX2 byte kernel unpacks a group's weights in registers for each row, rather than into memory
 * once for all of them */
#define DIRECT_ROWS 2

/* The weight of hi against lo: x ~ scale * (RESIDUAL * hi + lo) */
#define RESIDUAL 254

/* How far ahead of the group being multiplied the kernels ask for the weights: a thread reads its tiles' groups in
 * order, one stream of values and one of scales (and minimums), and the hardware's own prefetch left a lone row
 * waiting on memory for about as long as it computed (16 groups: 4 KB of Q4_1 values, 8 KB of Q8_0 ahead). */
#define PREFETCH_GROUPS 16

/* Ask for `bytes` of `base` from byte `at` on, line by line, into the caches (a hint: never faults). */
static inline void prefetch(const void *base, int64_t at, int64_t bytes) {
    const char *p = (const char *)base + at;
    for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 3);
}

/* A group's scales (and minimums) `PREFETCH_GROUPS` groups on: 32 bytes a group, so a line every other group; a
 * K-quant's integers a group, and its super-block's d and m once per two super-blocks. */
static inline void prefetch_scales(const QWeight *w, int64_t ahead, int k_quant) {
    if (ahead & 1) return;
    if (!k_quant) {
        prefetch(w->d, ahead * 2 * TILE, 64);
        if (w->m) prefetch(w->m, ahead * 2 * TILE, 64);
        return;
    }
    prefetch(w->sub, ahead * 2 * TILE, 64);
    if (ahead % (2 * SUPER_GROUPS) == 0) {
        prefetch(w->d, ahead / SUPER_GROUPS * 2 * TILE, 64);
        if (w->m) prefetch(w->m, ahead / SUPER_GROUPS * 2 * TILE, 64);
    }
}

/* Each row's groups of 32 activations as two sets of 8-bit values (four to an int32, in input order: the 8 quads
 * of hi, then the 8 of lo), their scales, their fp32 sums, and the integer sums of hi and of lo (what S8_BIAS
 * adds to a Q8_0 dot product: vec16.h). */
typedef struct {
    int32_t *quads;  /* [rows, groups, 16] */
    float *scale;    /* [rows, groups] */
    float *sum;      /* [rows, groups] */
    float *hi_sum;   /* [rows, groups]: the sum of hi as the activations it stands for, unit * sum(hi) (coarse rows') */
    int32_t *parts;  /* [rows, groups, 4]: sum(hi) over inputs 0-15, over 16-31, then sum(lo) over each half */
    int16_t *words;  /* [rows, groups, 32]: 254 * hi + lo, the AVX2 byte kernel's (its fine rows') */
} Activations;

static int quantize_rows(const float *x, int64_t rows, int64_t k, Activations *out) {
    const int64_t groups = k / GROUP;
    void *buffer = malloc((size_t)(rows * groups) * (20 * sizeof(int32_t) + 3 * sizeof(float) + 32 * sizeof(int16_t)));
    if (!buffer) return 1;
    out->quads = buffer;
    out->scale = (float *)(out->quads + rows * groups * 16);
    out->sum = out->scale + rows * groups;
    out->hi_sum = out->sum + rows * groups;
    out->parts = (int32_t *)(out->hi_sum + rows * groups);
    out->words = (int16_t *)(out->parts + rows * groups * 4);
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
            for (int part = 0; part < 4; part++) {
                int32_t total = 0;
                for (int i = 0; i < TILE; i++) total += q[part * TILE + i];
                out->parts[(r * groups + g) * 4 + part] = total;
            }
            const int32_t *parts = out->parts + (r * groups + g) * 4;
            out->hi_sum[r * groups + g] = (float)(parts[0] + parts[1]) * unit;
            int16_t *words = out->words + (r * groups + g) * GROUP;
            for (int i = 0; i < GROUP; i++) words[i] = (int16_t)(RESIDUAL * q[i] + q[GROUP + i]);
        }
    return 0;
}

/* A group's integer sum of hi (part 0) or lo (part 1), over both halves: exact */
static inline int32_t whole(const Activations *a, int64_t at, int part) {
    return a->parts[at * 4 + part * 2] + a->parts[at * 4 + part * 2 + 1];
}

/* 16 outputs' fp16 scales (or minimums) of block `block` (tile t's group g: t * groups + g) as fp32: a group's own,
 * or a K-quant's super-block's (`block` any of its groups) */
static inline vec16 fp16_of(const void *p, int64_t block) { return v_f16((const uint16_t *)p + block * TILE); }
static inline vec16 super_of(const void *p, int64_t block) { return fp16_of(p, block / SUPER_GROUPS); }

/* A K-quant group's 16 scales (`which` 0) or minimums (1; halves: the second half's scales): the super-block's
 * `super` times the sub-block's integers, exact in fp32 */
static inline vec16 sub_of(vec16 super, const int8_t *sub, int64_t block, int which) {
    return v_mul(super, v_bytes(sub + (block * 2 + which) * TILE));
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
 * constant `count`, `with_min` (Q4_1's m), `offset` (Q4_0's 8) and `k_quant` (Q4_K's SCALES_K), so that the row loop
 * unrolls, `acc` is kept out of memory and each format pays for its own terms only. y: the tile's member's first
 * column, rows ldy apart. */
static inline __attribute__((always_inline)) void nibble_tile(const QWeight *w, const Activations *a, int64_t t,
                                                              int64_t first, int count, int64_t coarse, float *y,
                                                              int64_t ldy, int with_min, int offset, int k_quant) {
    const int64_t groups = w->k / GROUP;
    vec16 acc[ROW_BLOCK];
    for (int r = 0; r < count; r++) acc[r] = v_set1(0.0f);
    vec16 super_d = v_set1(0.0f), super_m = v_set1(0.0f);  /* a K-quant's super-block d and -dmin, as fp32 */
    for (int64_t g = 0; g < groups; g++) {
        const int64_t block = t * groups + g;
        prefetch(w->q, (block + PREFETCH_GROUPS) * 256, 256);
        prefetch_scales(w, block + PREFETCH_GROUPS, k_quant);
        ivec16 low[4], high[4];  /* inputs 4i..4i+3 and 16+4i..16+4i+3 of the group, for 16 outputs */
        for (int i = 0; i < 4; i++) iv_nibbles(w->q + (block * 4 + i) * 64, &low[i], &high[i]);
        if (k_quant && g % SUPER_GROUPS == 0) super_d = super_of(w->d, block), super_m = super_of(w->m, block);
        const vec16 vd = k_quant ? sub_of(super_d, w->sub, block, 0) : fp16_of(w->d, block);
        const vec16 vm = !with_min ? v_set1(0.0f) : k_quant ? sub_of(super_m, w->sub, block, 1) : fp16_of(w->m, block);
        for (int r = 0; r < count; r++) {
            const int64_t at = (first + r) * groups + g;
            const int32_t *quads = a->quads + at * 16;
            /* integer sums are exact, so how iv_group splits them does not change them */
            ivec16 hi = iv_group(low, high, quads);
            ivec16 lo = first + r < coarse ? iv_group(low, high, quads + 8) : iv_zero();
            if (offset) {  /* (q - offset) . x = q . x - offset * sum(x), exactly */
                hi = iv_minus(hi, offset * whole(a, at, 0));
                if (first + r < coarse) lo = iv_minus(lo, offset * whole(a, at, 1));
            }
            const vec16 dot = v_fma(iv_float(hi), v_set1((float)RESIDUAL), iv_float(lo));
            acc[r] = v_fma(vd, v_mul(dot, v_set1(a->scale[at])), acc[r]);
            if (with_min) acc[r] = v_fma(vm, v_set1(first + r < coarse ? a->sum[at] : a->hi_sum[at]), acc[r]);
        }
    }
    store_tile(acc, count, w->n, t, y + first * ldy, ldy);
}

#define NIBBLE_BLOCK(with_min, offset, k_quant)                                                                   \
    switch (count) {                                                                                              \
        case 1: nibble_tile(w, a, t, first, 1, coarse, y, ldy, with_min, offset, k_quant); break;                 \
        case 2: nibble_tile(w, a, t, first, 2, coarse, y, ldy, with_min, offset, k_quant); break;                 \
        case 3: nibble_tile(w, a, t, first, 3, coarse, y, ldy, with_min, offset, k_quant); break;                 \
        default: nibble_tile(w, a, t, first, ROW_BLOCK, coarse, y, ldy, with_min, offset, k_quant); break;        \
    }

/* Q4_1 (an m, no offset), Q4_0 (no m, an offset of 8), Q4_K (an m, SCALES_K): each its own compiled loop */
static void q4_1_block(const QWeight *w, const Activations *a, int64_t t, int64_t first, int64_t count,
                       int64_t coarse, float *y, int64_t ldy) {
    NIBBLE_BLOCK(1, 0, 0)
}

static void q4_0_block(const QWeight *w, const Activations *a, int64_t t, int64_t first, int64_t count,
                       int64_t coarse, float *y, int64_t ldy) {
    NIBBLE_BLOCK(0, 8, 0)
}

static void q4_k_block(const QWeight *w, const Activations *a, int64_t t, int64_t first, int64_t count,
                       int64_t coarse, float *y, int64_t ldy) {
    NIBBLE_BLOCK(1, 0, 1)
}

static void nibble_rows(const QWeight *w, const Activations *a, int64_t rows, int64_t coarse, float *y, int64_t ldy,
                        int threads) {
    const int64_t tiles = (w->n + TILE - 1) / TILE;
    void (*block)(const QWeight *, const Activations *, int64_t, int64_t, int64_t, int64_t, float *, int64_t) =
        w->scales != SCALES_FP16 ? q4_k_block : w->m != NULL ? q4_1_block : q4_0_block;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t first = 0; first < rows; first += ROW_BLOCK)
            block(w, a, t, first, rows - first < ROW_BLOCK ? rows - first : ROW_BLOCK, coarse, y, ldy);
}

/* ug (WORD_DOTS) is filled whenever the block has a coarse row (fine < count), which GCC cannot follow into the row
 * loop's `r >= fine` */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/* The byte kernel's rows [first, first + count) of tile t: `kind` the scales' and `planes` the packing (0 bytes, 5
 * PACK_FIVES, 6 PACK_SIXES; constants where inlined, so that Q8_0's loop is its own). Halves (SCALES_K_HALVES): the
 * integer sums of inputs 0-15 and 16-31 kept apart, each scaled by its own. */
static inline __attribute__((always_inline)) void byte_tile(const QWeight *w, const Activations *a, int64_t t,
                                                            int64_t first, int64_t count, int64_t coarse, float *y,
                                                            int64_t ldy, int kind, int planes) {
    const int64_t groups = w->k / GROUP;
    vec16 acc[ROW_CHUNK];
    for (int64_t r = 0; r < count; r++) acc[r] = v_set1(0.0f);
    vec16 super_d = v_set1(0.0f), super_m = v_set1(0.0f);  /* a K-quant's super-block d and -dmin, as fp32 */
    for (int64_t g = 0; g < groups; g++) {
        const int64_t block = t * groups + g;
        const int64_t bytes = planes == 6 ? SIXES_BYTES : planes ? FIVES_BYTES : 512;
        const uint8_t *packed = w->q + block * bytes;
        prefetch(w->q, (block + PREFETCH_GROUPS) * bytes, bytes);
        prefetch_scales(w, block + PREFETCH_GROUPS, kind != SCALES_FP16);
        wgroup wg;  /* the group's weights for 16 outputs, unpacked once for all the rows */
#if defined(WORD_DOTS)
        /* the block's fine rows multiply words (each widening the group in registers, or all reading it widened
         * once), its coarse rows hi's bytes (the group unpacked once for them) */
        const int64_t fine = coarse <= first ? 0 : coarse - first < count ? coarse - first : count;
        const int direct = fine <= DIRECT_ROWS;
        if (!direct && planes) wg_planes(&wg, packed, (int)w->offset, planes == 6);
        if (!direct && !planes) wg_bytes(&wg, (const int8_t *)packed);
        ugroup ug;
        if (fine < count && planes) ug_planes(&ug, packed, planes == 6);
        if (fine < count && !planes) ug_bytes(&ug, (const int8_t *)packed);
#else
        if (planes)
            wg_planes(&wg, packed, (int)w->offset, planes == 6);
        else
            wg_bytes(&wg, (const int8_t *)packed);
#endif
        if (kind != SCALES_FP16 && g % SUPER_GROUPS == 0) {
            super_d = super_of(w->d, block);
            if (w->m) super_m = super_of(w->m, block);
        }
        const vec16 vd = kind == SCALES_FP16 ? fp16_of(w->d, block) : sub_of(super_d, w->sub, block, 0);
        const vec16 vd_b = kind == SCALES_K_HALVES ? sub_of(super_d, w->sub, block, 1) : vd;
        const vec16 vm = !w->m ? v_set1(0.0f) : kind == SCALES_FP16 ? fp16_of(w->m, block)
                                                                   : sub_of(super_m, w->sub, block, 1);
        for (int64_t r = 0; r < count; r++) {
            const int64_t at = (first + r) * groups + g;
#if defined(WORD_DOTS)
            /* one exact int32 sum, 254 * sum(hi) + sum(lo), or hi's alone (a coarse row), times 254 in fp32:
             * exact too, so the same bits */
            const int16_t *words = a->words + at * GROUP;
            const vec16 scale = v_set1(a->scale[at]);
            const int halves = kind == SCALES_K_HALVES;
            ivec16 sum, sum_b = iv_zero();
            if (r >= fine) {
                const int32_t *parts = a->parts + at * 4, offset = planes ? (int32_t)w->offset : 0;
                ug_dot(&ug, a->quads + at * 16, !planes, halves, &sum, &sum_b);
                if (halves) {
                    sum = iv_minus(sum, offset * parts[0]);
                    sum_b = iv_minus(sum_b, offset * parts[1]);
                } else {
                    sum = iv_minus(sum, offset * (parts[0] + parts[1]));
                }
            } else if (!direct) {
                sum = wg_dot(&wg, words, 0, halves ? 4 : 8);
                if (halves) sum_b = wg_dot(&wg, words, 4, 8);
            } else if (planes) {
                planes_dot(packed, words, (int)w->offset, planes == 6, halves, &sum, &sum_b);
            } else {
                sum = bytes_dot((const int8_t *)packed, words, 0, halves ? 4 : 8);
                if (halves) sum_b = bytes_dot((const int8_t *)packed, words, 4, 8);
            }
            vec16 dot = iv_float(sum), dot_b = iv_float(sum_b);
            if (r >= fine) dot = v_mul(dot, v_set1((float)RESIDUAL)), dot_b = v_mul(dot_b, v_set1((float)RESIDUAL));
            acc[r] = v_fma(vd, v_mul(dot, scale), acc[r]);
            if (halves) acc[r] = v_fma(vd_b, v_mul(dot_b, scale), acc[r]);
#else
            const s8vec *wq = wg.q;  /* inputs 4i..4i+3 of the group, for 16 outputs */
            const int32_t *quads = a->quads + at * 16;
            const int32_t *parts = a->parts + at * 4;
            const vec16 scale = v_set1(a->scale[at]);
            ivec16 c0 = iv_zero(), c1 = iv_zero(), c2 = iv_zero(), c3 = iv_zero(), lo, lo_b = iv_zero();
            if (first + r < coarse) {
                for (int i = 0; i < 4; i++) {
                    c0 = s8_dot4(c0, wq[i], quads[i]);
                    c1 = s8_dot4(c1, wq[i + 4], quads[i + 4]);
                    c2 = s8_dot4(c2, wq[i], quads[i + 8]);
                    c3 = s8_dot4(c3, wq[i + 4], quads[i + 12]);
                }
                if (kind == SCALES_K_HALVES) {
                    lo = iv_minus(c2, S8_BIAS * parts[2]), lo_b = iv_minus(c3, S8_BIAS * parts[3]);
                } else {
                    lo = iv_minus(iv_add(c2, c3), S8_BIAS * (parts[2] + parts[3]));  /* see below */
                }
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
            if (kind == SCALES_K_HALVES) {
                const ivec16 hi = iv_minus(c0, S8_BIAS * parts[0]), hi_b = iv_minus(c1, S8_BIAS * parts[1]);
                const vec16 dot = v_fma(iv_float(hi), v_set1((float)RESIDUAL), iv_float(lo));
                const vec16 dot_b = v_fma(iv_float(hi_b), v_set1((float)RESIDUAL), iv_float(lo_b));
                acc[r] = v_fma(vd, v_mul(dot, scale), acc[r]);
                acc[r] = v_fma(vd_b, v_mul(dot_b, scale), acc[r]);
            } else {
                const ivec16 hi = iv_minus(iv_add(c0, c1), S8_BIAS * (parts[0] + parts[1]));
                const vec16 dot = v_fma(iv_float(hi), v_set1((float)RESIDUAL), iv_float(lo));
                acc[r] = v_fma(vd, v_mul(dot, scale), acc[r]);
            }
#endif
            if (w->m) acc[r] = v_fma(vm, v_set1(first + r < coarse ? a->sum[at] : a->hi_sum[at]), acc[r]);
        }
    }
    store_tile(acc, count, w->n, t, y + first * ldy, ldy);
}

#pragma GCC diagnostic pop

static void byte_rows(const QWeight *w, const Activations *a, int64_t rows, int64_t coarse, float *y, int64_t ldy,
                      int threads) {
    const int64_t tiles = (w->n + TILE - 1) / TILE;
    const int kind = (int)w->scales, planes = w->packing == PACK_FIVES ? 5 : w->packing == PACK_SIXES ? 6 : 0;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t first = 0; first < rows; first += ROW_CHUNK) {
            const int64_t count = rows - first < ROW_CHUNK ? rows - first : ROW_CHUNK;
            if (planes == 5 && kind == SCALES_FP16)
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_FP16, 5);
            else if (planes == 5)
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_K, 5);
            else if (planes == 6)
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_K_HALVES, 6);
            else if (kind == SCALES_FP16)
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_FP16, 0);
            else if (kind == SCALES_K)
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_K, 0);
            else
                byte_tile(w, a, t, first, count, coarse, y, ldy, SCALES_K_HALVES, 0);
        }
}

int weight_rows(const float *x, int64_t rows, int64_t coarse, const QWeight *w, int64_t members, float *y,
                int threads) {
    if (rows <= 0) return 0;
    int64_t ldy = 0;
    for (int64_t i = 0; i < members; i++) {
        const int64_t packing = w[i].packing, scales = w[i].scales;
        if (packing < PACK_NIBBLES || packing > PACK_SIXES || scales < SCALES_FP16 || scales > SCALES_K_HALVES)
            return 2;
        /* the compiled combinations: bytes with any scales, sixes with halves (Q6_K's), the others without */
        if (packing != PACK_BYTES && (scales == SCALES_K_HALVES) != (packing == PACK_SIXES)) return 2;
        /* a K-quant: whole super-blocks, its integers, and a minimum exactly when SCALES_K */
        if (scales != SCALES_FP16 &&
            (w[i].k % (SUPER_GROUPS * GROUP) || !w[i].sub || (scales == SCALES_K) != (w[i].m != NULL)))
            return 2;
        ldy += w[i].n;
    }
    Activations a;
    if (quantize_rows(x, rows, w[0].k, &a)) return 1;  /* once for all the members */
    for (int64_t i = 0, column = 0; i < members; column += w[i++].n) {
        const int64_t fine = w[i].scales == SCALES_FP16 ? coarse : 0;  /* K-quants: every row coarse (header) */
        if (w[i].packing == PACK_NIBBLES)
            nibble_rows(&w[i], &a, rows, fine, y + column, ldy, threads);
        else
            byte_rows(&w[i], &a, rows, fine, y + column, ldy, threads);
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
