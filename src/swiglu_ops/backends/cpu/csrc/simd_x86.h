/* x86 pieces that the AVX2 and AVX-512 layers share (each includes this with its own target flags): the
   activation tables' indices read from memory and their two-float entries. */
#ifndef SWIGLU_SIMD_X86_H
#define SWIGLU_SIMD_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The ``n`` (a multiple of 4) table indices src[i * stride] (stride 1 or 2) of the activation lookups, read 64
   bits at a time: a quarter (stride 1) or half (stride 2) of the loads of one per index, the rest shifts and
   masks, which run beside the table loads (M=8192, 2H=4096 bf16, 2 threads of a Zen 4, A/B in one process:
   MX forward 6.1 -> 5.9 ms). Every load stays within src[0 .. (n - 1) * stride]: with stride 2 the second
   word of four keys starts one element early (src[2i+3 .. 2i+6], keys in its odd 16-bit lanes), since
   src[2i+7] is the element after the last key (the first of the next row, or past the end of x, when the
   keys are the odd elements of an interleaved row's last step). */
INLINE void src_keys(const uint16_t *src, const int stride, const int n, uint32_t *k) {
    for (int i = 0; i < n; i += 4) {
        uint64_t w0, w1;
        memcpy(&w0, src + i * stride, 8);
        if (stride == 1) {
            k[i] = (uint32_t)(w0 & 0xFFFF), k[i + 1] = (uint32_t)((w0 >> 16) & 0xFFFF);
            k[i + 2] = (uint32_t)((w0 >> 32) & 0xFFFF), k[i + 3] = (uint32_t)(w0 >> 48);
        } else {
            memcpy(&w1, src + i * stride + 3, 8);
            k[i] = (uint32_t)(w0 & 0xFFFF), k[i + 1] = (uint32_t)((w0 >> 32) & 0xFFFF);
            k[i + 2] = (uint32_t)((w1 >> 16) & 0xFFFF), k[i + 3] = (uint32_t)(w1 >> 48);
        }
    }
}

/* (t[2i], t[2i+1], t[2j], t[2j+1]) */
INLINE __m128 ld_entry2(const float *t, uint32_t i, uint32_t j) {
    const __m128 a = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(t + 2 * (size_t)i)));
    return _mm_loadh_pi(a, (const __m64 *)(t + 2 * (size_t)j));
}

/* The two-float entries of the eight keys k[0..7], (t[2k], t[2k + 1]), as *a and *b: one 8-byte load per key,
   then two shuffles per 8 lanes. */
INLINE void entries2x8(const float *t, const uint32_t k[8], __m256 *a, __m256 *b) {
    const __m256 x = _mm256_insertf128_ps(_mm256_castps128_ps256(ld_entry2(t, k[0], k[1])), ld_entry2(t, k[4], k[5]), 1);
    const __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(ld_entry2(t, k[2], k[3])), ld_entry2(t, k[6], k[7]), 1);
    *a = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0));
    *b = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1));
}

#endif
