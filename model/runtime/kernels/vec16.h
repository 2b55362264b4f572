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
#if defined(__AVX512F__)
typedef struct { __m512 v; } vec16;
static inline vec16 v_set1(float a) { return (vec16){_mm512_set1_ps(a)}; }
static inline vec16 v_load(const float *p) { return (vec16){_mm512_loadu_ps(p)}; }
static inline void v_store(float *p, vec16 a) { _mm512_storeu_ps(p, a.v); }
static inline vec16 v_mul(vec16 a, vec16 b) { return (vec16){_mm512_mul_ps(a.v, b.v)}; }
static inline vec16 v_add(vec16 a, vec16 b) { return (vec16){_mm512_add_ps(a.v, b.v)}; }
static inline vec16 v_fma(vec16 a, vec16 b, vec16 c) { return (vec16){_mm512_fmadd_ps(a.v, b.v, c.v)}; }
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
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef struct { __m256 lo, hi; } vec16;
static inline vec16 v_set1(float a) { return (vec16){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline vec16 v_load(const float *p) { return (vec16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void v_store(float *p, vec16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
static inline vec16 v_mul(vec16 a, vec16 b) { return (vec16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline vec16 v_add(vec16 a, vec16 b) { return (vec16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline vec16 v_fma(vec16 a, vec16 b, vec16 c) {
    return (vec16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline void v_nibbles(const uint8_t *p, vec16 *low, vec16 *high) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    const __m256i a = _mm256_cvtepu8_epi32(bytes), b = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    const __m256i mask = _mm256_set1_epi32(15);
    *low = (vec16){_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), _mm256_cvtepi32_ps(_mm256_and_si256(b, mask))};
    *high = (vec16){_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))};
}
static inline vec16 v_bytes(const int8_t *p) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    return (vec16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
                   _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)))};
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
#else
#error "needs AVX-512 or AVX2 with FMA"

/* exp(x) to ~2 ulp, in fixed arithmetic (glibc's expf picks its code by CPU); exactly 0 below -87.3, where a
 * masked attention score lands, so masked keys add nothing however many there are. */
static inline float exp_f32(float x) {
    if (x < -87.3f) return 0.0f;
    if (x > 88.0f) x = 88.0f;
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * r) * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

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


/* exp(x) to ~2 ulp, in fixed arithmetic (glibc's expf picks its code by CPU); exactly 0 below -87.3, where a
 * masked attention score lands, so masked keys add nothing however many there are. */
static inline float exp_f32(float x) {
    if (x < -87.3f) return 0.0f;
    if (x > 88.0f) x = 88.0f;
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * r) * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
