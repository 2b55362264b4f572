/* 16 fp32 lanes as one AVX-512 register or two AVX2 ones, and bf16 conversions: what the kernels are written in.
 * Arithmetic is explicit (fused multiply-adds, a fixed reduction tree), so an AVX-512 and an AVX2 build round alike. */
#ifndef VOICE_ASSISTANT_VEC16_H
#define VOICE_ASSISTANT_VEC16_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 16
#define GROUP 32

/* 16 fp32 lanes: one AVX-512 register, or two AVX2 ones. The arithmetic is explicit fused multiply-adds, so both
 * builds round alike. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
typedef struct { __m512 v; } vec16;
static inline vec16 v_set1(float a) { return (vec16){_mm512_set1_ps(a)}; }
static inline vec16 v_load(const float *p) { return (vec16){_mm512_loadu_ps(p)}; }
static inline void v_store(float *p, vec16 a) { _mm512_storeu_ps(p, a.v); }
static inline vec16 v_mul(vec16 a, vec16 b) { return (vec16){_mm512_mul_ps(a.v, b.v)}; }
static inline vec16 v_add(vec16 a, vec16 b) { return (vec16){_mm512_add_ps(a.v, b.v)}; }
static inline vec16 v_div(vec16 a, vec16 b) { return (vec16){_mm512_div_ps(a.v, b.v)}; }
static inline vec16 v_fma(vec16 a, vec16 b, vec16 c) { return (vec16){_mm512_fmadd_ps(a.v, b.v, c.v)}; }
static inline vec16 v_sub(vec16 a, vec16 b) { return (vec16){_mm512_sub_ps(a.v, b.v)}; }
static inline vec16 v_abs(vec16 a) { return (vec16){_mm512_abs_ps(a.v)}; }
static inline vec16 v_max(vec16 a, vec16 b) { return (vec16){_mm512_max_ps(a.v, b.v)}; }
static inline vec16 v_min(vec16 a, vec16 b) { return (vec16){_mm512_min_ps(a.v, b.v)}; }
static inline float v_hmax(vec16 a) { return _mm512_reduce_max_ps(a.v); }
/* to the nearest integer, ties to even (as rintf in the default rounding mode) */
static inline vec16 v_rint(vec16 a) {
    return (vec16){_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
/* 16 lanes holding integers in [-128, 127] as 16 bytes */
static inline void v_store_int8(int8_t *p, vec16 a) {
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(a.v)));
}
static inline vec16 v_f16(const uint16_t *p) {
    return (vec16){_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p))};
}
/* 16 bytes as the low and the high nibbles (Q4) or as signed bytes (Q8), in fp32 */
static inline void v_nibbles(const uint8_t *p, vec16 *low, vec16 *high) {
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    low->v = _mm512_cvtepi32_ps(_mm512_and_si512(wide, _mm512_set1_epi32(15)));
    high->v = _mm512_cvtepi32_ps(_mm512_srli_epi32(wide, 4));
}
static inline vec16 v_bytes(const int8_t *p) {
    return (vec16){_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)))};
}
static inline vec16 v_bf16(const uint16_t *p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return (vec16){_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
/* the sum of the lanes, as the AVX2 build sums them: halves, then quarters, ... */
static inline float v_sum(vec16 a) {
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(a.v), high);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
/* exp(x) lane by lane, to ~2 ulp (Cephes' expf polynomial); exactly 0 below -87.3, where a masked attention
 * score lands, so masked keys add nothing however many there are. */
static inline vec16 v_exp(vec16 x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), x.v);  /* a NaN stays NaN */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return (vec16){_mm512_maskz_mul_ps(~tiny, p, _mm512_castsi512_ps(bits))};
}
/* 16 int32 lanes, and the u8 x s8 dot products of the Q4 kernel: each lane adds the four products of its four
 * weight bytes with the same four activation bytes (VNNI where the CPU has it; the same exact sums without). */
typedef struct { __m512i v; } ivec16;
static inline ivec16 iv_zero(void) { return (ivec16){_mm512_setzero_si512()}; }
/* 64 bytes of nibbles: the low nibbles as bytes, and the high ones */
static inline void iv_nibbles(const uint8_t *p, ivec16 *low, ivec16 *high) {
    const __m512i raw = _mm512_loadu_si512((const void *)p), mask = _mm512_set1_epi8(15);
    low->v = _mm512_and_si512(raw, mask);
    high->v = _mm512_and_si512(_mm512_srli_epi32(raw, 4), mask);
}
/* A Q4 group's dot products for 16 outputs: the exact sum of low[i] . quads[i] + high[i] . quads[4 + i] over i,
 * each quad four activation bytes. Without VNNI the pair sums of maddubs are added in 16 bits before one widening:
 * eight of them are at most 8 * 2 * 15 * 127 = 30480, so nothing saturates or wraps, and the sums are VNNI's. */
static inline ivec16 iv_group(const ivec16 low[4], const ivec16 high[4], const int32_t *quads) {
#if defined(__AVX512VNNI__)
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) {
        a = _mm512_dpbusd_epi32(a, low[i].v, _mm512_set1_epi32(quads[i]));
        b = _mm512_dpbusd_epi32(b, high[i].v, _mm512_set1_epi32(quads[i + 4]));
    }
    return (ivec16){_mm512_add_epi32(a, b)};
#else
    __m512i pairs = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) {
        pairs = _mm512_add_epi16(pairs, _mm512_maddubs_epi16(low[i].v, _mm512_set1_epi32(quads[i])));
        pairs = _mm512_add_epi16(pairs, _mm512_maddubs_epi16(high[i].v, _mm512_set1_epi32(quads[i + 4])));
    }
    return (ivec16){_mm512_madd_epi16(pairs, _mm512_set1_epi16(1))};
#endif
}
static inline vec16 iv_float(ivec16 a) { return (vec16){_mm512_cvtepi32_ps(a.v)}; }
static inline ivec16 iv_add(ivec16 a, ivec16 b) { return (ivec16){_mm512_add_epi32(a.v, b.v)}; }
/* a - k * b, lane by lane, for a scalar k * b */
static inline ivec16 iv_minus(ivec16 a, int32_t kb) { return (ivec16){_mm512_sub_epi32(a.v, _mm512_set1_epi32(kb))}; }
#if defined(__AVX512VNNI__)
/* 64 signed weight bytes (in [-127, 127]) plus S8_BIAS, as unsigned bytes: VNNI's u8 x s8 products then sum without
 * saturating to w . x + S8_BIAS * sum(x), and the caller takes the second term off, exactly (one instruction a dot
 * product instead of three) */
#define S8_BIAS 128
typedef struct { __m512i biased; } s8vec;
static inline s8vec s8_from(__m512i w) { return (s8vec){_mm512_xor_si512(w, _mm512_set1_epi8((char)0x80))}; }
static inline ivec16 s8_dot4(ivec16 acc, s8vec w, int32_t four_bytes) {
    return (ivec16){_mm512_dpbusd_epi32(acc.v, w.biased, _mm512_set1_epi32(four_bytes))};
}
#else
/* 64 signed weight bytes (in [-127, 127]) as |w| and the sign, so that a signed x signed dot product is an
 * unsigned x signed one, |w| . (x * sign(w)), whose pair sums stay within 16 bits */
#define S8_BIAS 0
typedef struct { __m512i abs; __mmask64 negative; } s8vec;
static inline s8vec s8_from(__m512i w) { return (s8vec){_mm512_abs_epi8(w), _mm512_movepi8_mask(w)}; }
static inline ivec16 s8_dot4(ivec16 acc, s8vec w, int32_t four_bytes) {
    const __m512i x = _mm512_set1_epi32(four_bytes);
    const __m512i signed_x = _mm512_mask_sub_epi8(x, w.negative, _mm512_setzero_si512(), x);
    const __m512i pairs = _mm512_maddubs_epi16(w.abs, signed_x);
    return (ivec16){_mm512_add_epi32(acc.v, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
}
#endif
/* A group's 512 weights for 16 outputs as the byte kernel's eight s8vec (inputs 4i..4i+3 each): PACK_BYTES' bytes,
 * or PACK_FIVES' (PACK_SIXES') nibbles and bit planes unpacked to the bytes q - offset in registers (quant_matmul.c's
 * layouts: bit i of a plane's byte is quad i's bit, shifted to its place within 16-bit lanes, where no bit of the
 * neighbouring byte lands) */
typedef struct { s8vec q[8]; } wgroup;
static inline void wg_bytes(wgroup *g, const int8_t *p) {
    for (int i = 0; i < 8; i++) g->q[i] = s8_from(_mm512_loadu_si512((const void *)(p + 64 * i)));
}
static inline void wg_planes(wgroup *g, const uint8_t *p, int offset, int sixes) {
    const __m512i bits = _mm512_loadu_si512((const void *)(p + 256)), mask = _mm512_set1_epi8(15);
    const __m512i sixth = sixes ? _mm512_loadu_si512((const void *)(p + 320)) : _mm512_setzero_si512();
    const __m512i five = _mm512_set1_epi8(16), six = _mm512_set1_epi8(32), off = _mm512_set1_epi8((char)offset);
    for (int i = 0; i < 4; i++) {
        const __m512i raw = _mm512_loadu_si512((const void *)(p + 64 * i));
        __m512i low = _mm512_and_si512(raw, mask), high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
        low = _mm512_or_si512(low, _mm512_and_si512(_mm512_slli_epi16(bits, 4 - i), five));
        high = _mm512_or_si512(high, _mm512_and_si512(_mm512_srli_epi16(bits, i), five));
        if (sixes) {
            low = _mm512_or_si512(low, _mm512_and_si512(_mm512_slli_epi16(sixth, 5 - i), six));
            high = _mm512_or_si512(high, _mm512_and_si512(i ? _mm512_srli_epi16(sixth, i - 1) : _mm512_slli_epi16(sixth, 1), six));
        }
        g->q[i] = s8_from(_mm512_sub_epi8(low, off));
        g->q[i + 4] = s8_from(_mm512_sub_epi8(high, off));
    }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
typedef struct { __m256 lo, hi; } vec16;
static inline vec16 v_set1(float a) { return (vec16){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline vec16 v_load(const float *p) { return (vec16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void v_store(float *p, vec16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
static inline vec16 v_mul(vec16 a, vec16 b) { return (vec16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline vec16 v_add(vec16 a, vec16 b) { return (vec16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline vec16 v_div(vec16 a, vec16 b) { return (vec16){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
static inline vec16 v_fma(vec16 a, vec16 b, vec16 c) {
    return (vec16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline vec16 v_sub(vec16 a, vec16 b) { return (vec16){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline vec16 v_abs(vec16 a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return (vec16){_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
static inline vec16 v_max(vec16 a, vec16 b) { return (vec16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline vec16 v_min(vec16 a, vec16 b) { return (vec16){_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
static inline float v_hmax(vec16 a) {
    const __m256 half = _mm256_max_ps(a.lo, a.hi);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline vec16 v_rint(vec16 a) {
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return (vec16){_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
static inline void v_store_int8(int8_t *p, vec16 a) {
    int32_t lane[16];
    _mm256_storeu_si256((__m256i *)lane, _mm256_cvtps_epi32(a.lo));
    _mm256_storeu_si256((__m256i *)(lane + 8), _mm256_cvtps_epi32(a.hi));
    for (int i = 0; i < 16; i++) p[i] = (int8_t)lane[i];
}
static inline vec16 v_f16(const uint16_t *p) {
    return (vec16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
static inline void v_nibbles(const uint8_t *p, vec16 *low, vec16 *high) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    const __m256i a = _mm256_cvtepu8_epi32(bytes), b = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    const __m256i mask = _mm256_set1_epi32(15);
    *low = (vec16){_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), _mm256_cvtepi32_ps(_mm256_and_si256(b, mask))};
    *high = (vec16){_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))};
}
/* each half widened straight from memory (`vpmovsxbd ymm, m64`): no shift between the halves */
static inline vec16 v_bytes(const int8_t *p) {
    return (vec16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                   _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
}
static inline vec16 v_bf16(const uint16_t *p) {
    const __m128i a = _mm_loadu_si128((const __m128i *)p), b = _mm_loadu_si128((const __m128i *)(p + 8));
    return (vec16){_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16)),
                   _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16))};
}
static inline float v_sum(vec16 a) {
    const __m256 half = _mm256_add_ps(a.lo, a.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline __m256 exp8(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), x);  /* a NaN stays NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
static inline vec16 v_exp(vec16 x) { return (vec16){exp8(x.lo), exp8(x.hi)}; }
typedef struct { __m256i lo, hi; } ivec16;
static inline ivec16 iv_zero(void) { return (ivec16){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
static inline void iv_nibbles(const uint8_t *p, ivec16 *low, ivec16 *high) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)p), b = _mm256_loadu_si256((const __m256i *)(p + 32));
    const __m256i mask = _mm256_set1_epi8(15);
    *low = (ivec16){_mm256_and_si256(a, mask), _mm256_and_si256(b, mask)};
    *high = (ivec16){_mm256_and_si256(_mm256_srli_epi32(a, 4), mask), _mm256_and_si256(_mm256_srli_epi32(b, 4), mask)};
}
/* products of at most 15 x 127: the pair sums of maddubs, added in 16 bits, stay exact (see the AVX-512 build) */
static inline ivec16 iv_group(const ivec16 low[4], const ivec16 high[4], const int32_t *quads) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        const __m256i x = _mm256_set1_epi32(quads[i]), y = _mm256_set1_epi32(quads[i + 4]);
        lo = _mm256_add_epi16(lo, _mm256_add_epi16(_mm256_maddubs_epi16(low[i].lo, x),
                                                   _mm256_maddubs_epi16(high[i].lo, y)));
        hi = _mm256_add_epi16(hi, _mm256_add_epi16(_mm256_maddubs_epi16(low[i].hi, x),
                                                   _mm256_maddubs_epi16(high[i].hi, y)));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    return (ivec16){_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)};
}
static inline vec16 iv_float(ivec16 a) { return (vec16){_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
static inline ivec16 iv_add(ivec16 a, ivec16 b) {
    return (ivec16){_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
static inline ivec16 iv_minus(ivec16 a, int32_t kb) {
    const __m256i v = _mm256_set1_epi32(kb);
    return (ivec16){_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}
/* The byte kernel without AVX-512 (WORD_DOTS): a row's activation is one int16 a word, 254 * hi + lo (|.| <= 32385),
 * and a group's weights are widened to int16 once per tile, so that one `pmaddwd` multiplies both parts (the sign
 * trick's two 8-bit dot products cost twice the instructions). Its int32 pair sums are exact, and so is a group's
 * sum, |.| <= 32 * 32385 * 128 < 2^31: the exact 254 * sum(hi) + sum(lo), which converted to fp32 is the one
 * rounding the AVX-512 builds' fma of the two sums makes, so every build computes the same bits. */
#define WORD_DOTS 1
/* [quad i][m]: inputs 4i..4i+3 of outputs 4m..4m+3 as 16 int16 (output by output, 4 inputs each) */
typedef struct { __m256i w[32]; } wgroup;
/* 32 weight bytes (outputs 8h..8h+7 of quad i) widened into the group */
static inline void wg_widen(wgroup *g, int i, int h, __m256i bytes) {
    g->w[4 * i + 2 * h] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
    g->w[4 * i + 2 * h + 1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1));
}
static inline void wg_bytes(wgroup *g, const int8_t *p) {
    for (int i = 0; i < 32; i++) g->w[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * i)));
}
/* PACK_FIVES (PACK_SIXES): quads i and i + 4 of outputs 8h..8h+7 as the unsigned bytes q, from the nibbles and the
 * bit planes (bit i of a plane's byte is quad i's bit: shifted to its place within 16-bit lanes, where no bit of the
 * neighbouring byte lands) */
static inline void planes_raw(const uint8_t *p, int sixes, int h, int i, __m256i *low, __m256i *high) {
    const __m256i mask = _mm256_set1_epi8(15), five = _mm256_set1_epi8(16);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(p + 256 + 32 * h));
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 64 * i + 32 * h));
    __m256i a = _mm256_and_si256(raw, mask), b = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    a = _mm256_or_si256(a, _mm256_and_si256(_mm256_slli_epi16(bits, 4 - i), five));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_srli_epi16(bits, i), five));
    if (sixes) {
        const __m256i sixth = _mm256_loadu_si256((const __m256i *)(p + 320 + 32 * h)), six = _mm256_set1_epi8(32);
        a = _mm256_or_si256(a, _mm256_and_si256(_mm256_slli_epi16(sixth, 5 - i), six));
        b = _mm256_or_si256(b, _mm256_and_si256(i ? _mm256_srli_epi16(sixth, i - 1) : _mm256_slli_epi16(sixth, 1), six));
    }
    *low = a, *high = b;
}
/* and as the bytes q - offset */
static inline void planes_unpack(const uint8_t *p, int offset, int sixes, int h, int i, __m256i *low, __m256i *high) {
    const __m256i off = _mm256_set1_epi8((char)offset);
    planes_raw(p, sixes, h, i, low, high);
    *low = _mm256_sub_epi8(*low, off), *high = _mm256_sub_epi8(*high, off);
}
static inline void wg_planes(wgroup *g, const uint8_t *p, int offset, int sixes) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            __m256i low, high;
            planes_unpack(p, offset, sixes, h, i, &low, &high);
            wg_widen(g, i, h, low);
            wg_widen(g, i + 4, h, high);
        }
}
/* A row's words of quad i, four int16, in every 64-bit lane */
static inline __m256i wd_quad(const int16_t *words, int i) {
    int64_t four;
    memcpy(&four, words + 4 * i, sizeof four);
    return _mm256_set1_epi64x(four);
}
/* Each `pmaddwd` lane holds one output's pair sum (inputs 0-1 or 2-3 of a quad): the four accumulators of outputs
 * 4m..4m+3 joined by `phaddd` into [o0 o1 o4 o5 | o2 o3 o6 o7] (and o8...), then put in order */
static inline ivec16 wd_join(const __m256i acc[4]) {
    const __m256i a = _mm256_hadd_epi32(acc[0], acc[1]), b = _mm256_hadd_epi32(acc[2], acc[3]);
    return (ivec16){_mm256_permute4x64_epi64(a, 0xD8), _mm256_permute4x64_epi64(b, 0xD8)};
}
#define WD_ZERO {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}
/* The exact int32 sums of quads [from, to) of the group's weights times a row's words, for 16 outputs in order */
static inline ivec16 wg_dot(const wgroup *g, const int16_t *words, int from, int to) {
    __m256i acc[4] = WD_ZERO;
    for (int i = from; i < to; i++) {
        const __m256i x = wd_quad(words, i);
        for (int m = 0; m < 4; m++) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(g->w[4 * i + m], x));
    }
    return wd_join(acc);
}
/* The same sums for one row straight from PACK_BYTES' bytes, widened in registers: for a row or two, where widening
 * the group into memory first costs more than widening it again */
static inline ivec16 bytes_dot(const int8_t *p, const int16_t *words, int from, int to) {
    __m256i acc[4] = WD_ZERO;
    for (int i = from; i < to; i++) {
        const __m256i x = wd_quad(words, i);
        for (int m = 0; m < 4; m++) {
            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 64 * i + 16 * m)));
            acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(w, x));
        }
    }
    return wd_join(acc);
}
/* and from PACK_FIVES' (PACK_SIXES') nibbles and bit planes: the sums over quads 0-3 in *sum and over 4-7 in *sum_b
 * for halves, else over all 8 in *sum */
static inline void planes_dot(const uint8_t *p, const int16_t *words, int offset, int sixes, int halves, ivec16 *sum,
                              ivec16 *sum_b) {
    __m256i acc[4] = WD_ZERO, acc_b[4] = WD_ZERO;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            __m256i low, high;
            planes_unpack(p, offset, sixes, h, i, &low, &high);
            const __m256i x = wd_quad(words, i), z = wd_quad(words, i + 4);
            const __m256i pairs[4] = {
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(low)), x),
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(low, 1)), x),
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(high)), z),
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(high, 1)), z),
            };
            if (halves) {
                acc[2 * h] = _mm256_add_epi32(acc[2 * h], pairs[0]);
                acc[2 * h + 1] = _mm256_add_epi32(acc[2 * h + 1], pairs[1]);
                acc_b[2 * h] = _mm256_add_epi32(acc_b[2 * h], pairs[2]);
                acc_b[2 * h + 1] = _mm256_add_epi32(acc_b[2 * h + 1], pairs[3]);
            } else {
                acc[2 * h] = _mm256_add_epi32(acc[2 * h], _mm256_add_epi32(pairs[0], pairs[2]));
                acc[2 * h + 1] = _mm256_add_epi32(acc[2 * h + 1], _mm256_add_epi32(pairs[1], pairs[3]));
            }
        }
    *sum = wd_join(acc);
    if (halves) *sum_b = wd_join(acc_b);
}
/* A coarse row (hi alone) needs no words: its sums are `pmaddubsw`'s, unsigned weight bytes times hi's signed ones, as
 * llama.cpp's AVX2 kernels form them. PACK_FIVES' and PACK_SIXES' q are taken before the offset (the caller takes
 * off offset * sum(hi), exactly), and two quads' pair sums are added in 16 bits (at most 2 * 2 * 63 * 127 = 32004)
 * before one widening; PACK_BYTES' |w| multiplies hi given w's sign (a pair sum at most 2 * 128 * 127), each quad
 * widened alone. The same exact integers as the words' product for fewer instructions, and the group is unpacked
 * once for all the coarse rows. u[2 quad + h]: a quad's inputs for outputs 8h..8h+7 (sign[.]: PACK_BYTES' w). */
typedef struct { __m256i u[16], sign[16]; } ugroup;
static inline void ug_planes(ugroup *g, const uint8_t *p, int sixes) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) planes_raw(p, sixes, h, i, &g->u[2 * i + h], &g->u[2 * (i + 4) + h]);
}
static inline void ug_bytes(ugroup *g, const int8_t *p) {
    for (int j = 0; j < 16; j++) {  /* quad j / 2's outputs 8 (j % 2) on: 32 bytes at 64 quad + 32 h = 32 j */
        g->sign[j] = _mm256_loadu_si256((const __m256i *)(p + 32 * j));
        g->u[j] = _mm256_abs_epi8(g->sign[j]);
    }
}
/* The exact int32 sums of a row's hi (`quads`: its 8 quads of bytes) times the group's weights (`signs`: ug_bytes'),
 * for 16 outputs in order: over inputs 0-15 in *sum and 16-31 in *sum_b for halves, else all 32 in *sum */
static inline void ug_dot(const ugroup *g, const int32_t *quads, int signs, int halves, ivec16 *sum, ivec16 *sum_b) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()},
                         {_mm256_setzero_si256(), _mm256_setzero_si256()}};  /* [inputs 0-15 or 16-31][h] */
    for (int i = 0; i < 8; i += 2) {
        const __m256i x = _mm256_set1_epi32(quads[i]), z = _mm256_set1_epi32(quads[i + 1]);
        for (int h = 0; h < 2; h++) {
            const int a = 2 * i + h, b = 2 * (i + 1) + h;
            __m256i wide;
            if (signs) {
                const __m256i pa = _mm256_maddubs_epi16(g->u[a], _mm256_sign_epi8(x, g->sign[a]));
                const __m256i pb = _mm256_maddubs_epi16(g->u[b], _mm256_sign_epi8(z, g->sign[b]));
                wide = _mm256_add_epi32(_mm256_madd_epi16(pa, ones), _mm256_madd_epi16(pb, ones));
            } else {
                const __m256i pa = _mm256_maddubs_epi16(g->u[a], x), pb = _mm256_maddubs_epi16(g->u[b], z);
                wide = _mm256_madd_epi16(_mm256_add_epi16(pa, pb), ones);
            }
            acc[i / 4][h] = _mm256_add_epi32(acc[i / 4][h], wide);
        }
    }
    if (halves) {
        *sum = (ivec16){acc[0][0], acc[0][1]}, *sum_b = (ivec16){acc[1][0], acc[1][1]};
    } else {
        *sum = (ivec16){_mm256_add_epi32(acc[0][0], acc[1][0]), _mm256_add_epi32(acc[0][1], acc[1][1])};
    }
}
#else
#error "needs AVX-512 (BW) or AVX2 with FMA and F16C"
#endif

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch converts fp32 to bf16. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}


#endif
