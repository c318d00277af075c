/* AVX-512 kernels for the cpu backend's 16-bit storage kinds (bf16, fp16): swiglu_group_grad whole, and
   the two stages of a dual-axis task (the Numba kernel in _mx_quant.py keeps the task loop and calls them).

   The same element arithmetic as the Numba kernels (_group_grad.py, _mx_quant.py, _numerics.py), written
   with intrinsics where LLVM's vectoriser (as Numba drives it) leaves cycles on the table:

   - The sigmoid comes from a 65,536-entry table indexed by the input's 16 bits, fetched with one
     vgatherdps per 16 elements. The table is the Numba kernels' own sigmoid (_numerics.sigmoid_f32)
     evaluated at every bit pattern, built in Python, so both kernels give bit-identical results; a
     clamped input (g >= clamp) takes sigmoid(clamp), computed by the same function.
   - Constants stay in registers (Numba's large code model reloads them in every iteration).
   - The routing-weight gradient's pairwise sum runs 8 fp32 lanes, which is exactly NumPy's 8
     accumulators, without a scratch row.
   - Scale codes are computed 16 blocks at a time, FP8 codes 16 elements at a time.

   Every fp32 operation is the kernel's operation, in its order, without contraction (compiled with
   -ffp-contract=off). Rows are independent: threads take tiles of rows from an atomic counter and every
   row is computed by the same code, so results do not depend on the thread count.

   Only called after the host was checked for AVX512F/BW/VL/DQ (cpu/_native.py). */

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#ifndef SWIGLU_SIMD_SOURCE_HASH
#define SWIGLU_SIMD_SOURCE_HASH "unknown"
#endif
/* sha256 of this file (first 16 hex digits), given by setup.py; checked against the source by _native.py. */
const char swiglu_simd_source_hash[] = SWIGLU_SIMD_SOURCE_HASH;

#define INLINE static inline __attribute__((always_inline)) /* specialised per kind and mode */

enum { KIND_BF16 = 0, KIND_FP16 = 1 };
enum { ROWS_PER_TILE = 16, MAX_THREADS = 256, MX_MAX_WIDTH = 512 };
/* The widest dual-axis task (columns of one half) the quantiser takes; _native.py checks _mx_quant.CHUNK. */
const int swiglu_mx_max_width = MX_MAX_WIDTH;

/* ------------------------------------------------------------------------------------ conversions */

/* 16 stored elements (masked lanes read nothing and give 0). */
INLINE __m256i load16(const uint16_t *p, __mmask16 m) { return _mm256_maskz_loadu_epi16(m, p); }

/* fp32 values of 16 stored elements; exact. */
INLINE __m512 widen(__m256i bits, int kind) {
    if (kind == KIND_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    return _mm512_cvtph_ps(bits);
}

/* RNE, overflow to inf; bf16 NaN becomes 0x7FC0 (PyTorch's), fp16 NaN stays a quiet NaN (as F16C and the
   Numba kernels' hardware path give it). With AVX512-BF16 (the _simd_bf16 build), vcvtneps2bf16 rounds the
   same way for every input except NaN (payload kept) and fp32 subnormals (flushed to zero): vectors that
   hold one of those take the integer path. */
INLINE __m256i narrow(__m512 v, int kind) {
    if (kind == KIND_BF16) {
#ifdef __AVX512BF16__
        if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) == 0, 1)) /* QNaN | SNaN | denormal */
            return (__m256i)_mm512_cvtneps_pbh(v);
#endif
        const __m512i u = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
        r = _mm512_srli_epi32(r, 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
        return _mm512_cvtepi32_epi16(r);
    }
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

INLINE void narrow_store(uint16_t *p, __mmask16 m, __m512 v, int kind) {
    _mm256_mask_storeu_epi16(p, m, narrow(v, kind));
}

/* --------------------------------------------------------------------------------- group grad */

typedef struct {
    const uint16_t *dy, *x, *y_origin;
    const float *weight, *table; /* weight NULL when absent */
    const int64_t *leaves, *merges;
    int64_t rows, hidden, valid_rows, n_leaves;
    float clamp, s_clamp; /* clamp > 0 enables the clamp; s_clamp = sigmoid(clamp) */
    uint16_t *grad_x;
    float *grad_weight;
    int kind;
    atomic_long next_tile;
} gg_args;

/* 16 element pairs of one row of grad_x (spec section 3); lanes outside ``m`` are neither read nor written.
   Masked multiplies stand for the spec's selects and 0/1-mask products: a lane left out of a masked
   multiply keeps its value, which is what multiplying it by 1 gives. */
typedef struct { /* a row's loop invariants, in registers: intrinsic stores may alias anything in memory */
    const float *table;
    __m512 w, clamp, nclamp, s_clamp;
    int masked_row;
} gg_row_consts;

INLINE void gg_step(const gg_row_consts *c, const uint16_t *dy,
                                                          const uint16_t *g_in, const uint16_t *u_in,
                                                          uint16_t *dg_out, uint16_t *du_out, __mmask16 m,
                                                          const int kind, const int has_clamp) {
    const __m512 zero = _mm512_setzero_ps(), clamp = c->clamp, w = c->w;
    const __m512 dyv = widen(load16(dy, m), kind);
    const __m256i g_bits = load16(g_in, m);
    __m512 g = widen(g_bits, kind), u = widen(load16(u_in, m), kind);
    __m512 s = _mm512_mask_i32gather_ps(zero, m, _mm512_cvtepu16_epi32(g_bits), c->table, 4);
    __mmask16 m_g = 0xFFFF, m_u = 0xFFFF;
    if (has_clamp) { /* open-interval masks from the raw inputs (NaN -> 0); min/clip keep NaN */
        m_g = _mm512_cmp_ps_mask(g, clamp, _CMP_LT_OQ);
        m_u = _mm512_cmp_ps_mask(_mm512_abs_ps(u), clamp, _CMP_LT_OQ);
        s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(g, clamp, _CMP_GE_OQ), c->s_clamp);
        g = _mm512_min_ps(clamp, g); /* min(c, v) returns v when either is NaN, c only when c < v */
        u = _mm512_max_ps(c->nclamp, _mm512_min_ps(clamp, u));
    }
    const __mmask16 inf = _mm512_fpclass_ps_mask(g, 0x18), ninf = _mm512_fpclass_ps_mask(g, 0x10);
    const __m512 f = _mm512_maskz_mul_ps((__mmask16)~ninf, g, s); /* g * s, 0 at g = -inf (not NaN) */
    __m512 sp = _mm512_sub_ps(_mm512_add_ps(s, f), _mm512_mul_ps(f, s));
    sp = _mm512_mask_mov_ps(sp, inf, s); /* 1 at +inf, 0 at -inf: exactly s there */
    __m512 dg = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dyv, sp), u), w);
    __m512 du = _mm512_mul_ps(_mm512_mul_ps(dyv, f), w);
    if (has_clamp) { /* times the 0/1 masks: inf/NaN times 0 gives NaN */
        dg = _mm512_mask_mul_ps(dg, (__mmask16)~m_g, dg, zero);
        du = _mm512_mask_mul_ps(du, (__mmask16)~m_u, du, zero);
    }
    if (c->masked_row) { /* times the row mask 0 */
        dg = _mm512_mul_ps(dg, zero);
        du = _mm512_mul_ps(du, zero);
    }
    narrow_store(dg_out, m, dg, kind);
    narrow_store(du_out, m, du, kind);
}

/* One row of grad_x: full steps of 16 pairs, then one masked step for the rest. */
INLINE void gg_row(const gg_args *a, int64_t r, const int kind,
                                                         const int has_clamp) {
    const int64_t H = a->hidden;
    const uint16_t *dy = a->dy + r * H, *g_in = a->x + r * 2 * H, *u_in = g_in + H;
    uint16_t *dg_out = a->grad_x + r * 2 * H, *du_out = dg_out + H;
    const gg_row_consts c = {
        .table = a->table,
        .w = _mm512_set1_ps(a->weight ? a->weight[r] : 1.0f),
        .clamp = _mm512_set1_ps(a->clamp),
        .nclamp = _mm512_set1_ps(-a->clamp),
        .s_clamp = _mm512_set1_ps(a->s_clamp),
        .masked_row = r >= a->valid_rows,
    };
    int64_t h = 0;
    for (; h + 16 <= H; h += 16)
        gg_step(&c, dy + h, g_in + h, u_in + h, dg_out + h, du_out + h, 0xFFFF, kind, has_clamp);
    if (h < H)
        gg_step(&c, dy + h, g_in + h, u_in + h, dg_out + h, du_out + h, (__mmask16)((1u << (H - h)) - 1), kind,
                has_clamp);
}

/* NumPy's float32 sum of a leaf (at most 128 elements) of the products dy * y_origin (spec section 5):
   8 accumulators = 8 fp32 lanes, combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)). */
INLINE float gg_leaf(const uint16_t *dy, const uint16_t *yo, int64_t n, const int kind) {
    if (n < 8) {
        float res = -0.0f;
        float d[8], y[8];
        const __mmask16 m = (__mmask16)((1u << n) - 1);
        _mm256_storeu_ps(d, _mm512_castps512_ps256(widen(load16(dy, m), kind)));
        _mm256_storeu_ps(y, _mm512_castps512_ps256(widen(load16(yo, m), kind)));
        for (int64_t i = 0; i < n; i++) res += d[i] * y[i];
        return res;
    }
    const __mmask16 m8 = 0xFF;
    __m256 acc = _mm256_mul_ps(_mm512_castps512_ps256(widen(load16(dy, m8), kind)),
                               _mm512_castps512_ps256(widen(load16(yo, m8), kind)));
    const int64_t body = n - n % 8;
    for (int64_t i = 8; i < body; i += 8) {
        const __m256 p = _mm256_mul_ps(_mm512_castps512_ps256(widen(load16(dy + i, m8), kind)),
                                       _mm512_castps512_ps256(widen(load16(yo + i, m8), kind)));
        acc = _mm256_add_ps(acc, p);
    }
    float r[8];
    _mm256_storeu_ps(r, acc);
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    if (body < n) {
        float d[8], y[8];
        const __mmask16 m = (__mmask16)((1u << (n - body)) - 1);
        _mm256_storeu_ps(d, _mm512_castps512_ps256(widen(load16(dy + body, m), kind)));
        _mm256_storeu_ps(y, _mm512_castps512_ps256(widen(load16(yo + body, m), kind)));
        for (int64_t i = 0; i < n - body; i++) res += d[i] * y[i];
    }
    return res;
}

INLINE float gg_grad_weight(const gg_args *a, int64_t r, float *stack, const int kind) {
    const uint16_t *dy = a->dy + r * a->hidden, *yo = a->y_origin + r * a->hidden;
    int64_t top = 0;
    for (int64_t j = 0; j < a->n_leaves; j++) {
        const int64_t start = a->leaves[2 * j], n = a->leaves[2 * j + 1];
        stack[top++] = gg_leaf(dy + start, yo + start, n, kind);
        for (int64_t k = 0; k < a->merges[j]; k++) {
            top -= 1;
            stack[top - 1] = stack[top - 1] + stack[top];
        }
    }
    return 0.0f + stack[0];
}

INLINE void gg_tiles(gg_args *a, float *stack, const int kind, const int has_clamp) {
    const int64_t n_tiles = (a->rows + ROWS_PER_TILE - 1) / ROWS_PER_TILE;
    for (;;) {
        const int64_t t = atomic_fetch_add(&a->next_tile, 1);
        if (t >= n_tiles) return;
        const int64_t end = (t + 1) * ROWS_PER_TILE < a->rows ? (t + 1) * ROWS_PER_TILE : a->rows;
        for (int64_t r = t * ROWS_PER_TILE; r < end; r++) {
            gg_row(a, r, kind, has_clamp);
            if (a->weight) a->grad_weight[r] = gg_grad_weight(a, r, stack, kind); /* never masked */
        }
    }
}

static void *gg_worker(void *p) {
    gg_args *a = p;
    float stack[64]; /* the pairwise tree's depth is log2(hidden / 128) + 1 */
    if (a->kind == KIND_BF16) {
        if (a->clamp > 0) gg_tiles(a, stack, KIND_BF16, 1);
        else gg_tiles(a, stack, KIND_BF16, 0);
    } else {
        if (a->clamp > 0) gg_tiles(a, stack, KIND_FP16, 1);
        else gg_tiles(a, stack, KIND_FP16, 0);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ mx quant, stage 1 */

/* Stage 1 of one task of the dual-axis kernel (_mx_quant.py): for ``nrows`` rows and ``width`` columns
   (a multiple of 32), the SwiGLU backward of spec 2.2 rounded to the storage dtype, written as stored
   bits to tile[row][half][column] (half 0: A's gradient, 1: B's), and the running column amax of the
   magnitude bits, col_amax[half][column] (a monotone function of the magnitude for 16-bit floats). Called
   from the Numba kernel (which owns the threads), then swiglu_mx_quantise_16 quantises the tile. */
INLINE void mx_stage1(const uint16_t *xa, const uint16_t *xb, const uint16_t *dy, int64_t x_stride,
                      int64_t dy_stride, int64_t nrows, int64_t width, const float *table, uint16_t *tile,
                      int64_t tile_row_stride, int64_t tile_half_stride, uint16_t *col_amax, const int kind) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m256i mag = _mm256_set1_epi16(0x7FFF);
    for (int64_t i = 0; i < nrows; i++) {
        const uint16_t *ra = xa + i * x_stride, *rb = xb + i * x_stride, *rg = dy + i * dy_stride;
        uint16_t *ta = tile + i * tile_row_stride, *tb = ta + tile_half_stride;
        /* Prefetch the row after next: a task reads 3 x 32 short row segments, more streams than the
           hardware prefetchers follow (~10 % faster, same-process A/B at M=8192). */
        if (i + 2 < nrows)
            for (int64_t j = 0; j < width; j += 32) {
                _mm_prefetch((const char *)(ra + 2 * x_stride + j), _MM_HINT_T0);
                _mm_prefetch((const char *)(rb + 2 * x_stride + j), _MM_HINT_T0);
                _mm_prefetch((const char *)(rg + 2 * dy_stride + j), _MM_HINT_T0);
            }
        for (int64_t j = 0; j < width; j += 16) {
            const __m256i a_bits = load16(ra + j, 0xFFFF);
            const __m512 a = widen(a_bits, kind), b = widen(load16(rb + j, 0xFFFF), kind);
            const __m512 g = widen(load16(rg + j, 0xFFFF), kind);
            const __m512 s = _mm512_i32gather_ps(_mm512_cvtepu16_epi32(a_bits), table, 4);
            /* t = ((-s) + 1) * a + 1, negating by the sign bit as Numba does */
            const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(_mm512_xor_ps(s, sign), one), a), one);
            const __m512 ga = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(t, b), s), g);
            const __m512 gb = _mm512_mul_ps(_mm512_mul_ps(s, g), a);
            const __m256i qa = narrow(ga, kind), qb = narrow(gb, kind);
            _mm256_storeu_si256((__m256i *)(ta + j), qa);
            _mm256_storeu_si256((__m256i *)(tb + j), qb);
            __m256i *ca = (__m256i *)(col_amax + j), *cb = (__m256i *)(col_amax + tile_half_stride + j);
            _mm256_storeu_si256(ca, _mm256_max_epu16(_mm256_loadu_si256(ca), _mm256_and_si256(qa, mag)));
            _mm256_storeu_si256(cb, _mm256_max_epu16(_mm256_loadu_si256(cb), _mm256_and_si256(qb, mag)));
        }
    }
}

void swiglu_mx_stage1_16(const uint16_t *xa, const uint16_t *xb, const uint16_t *dy, int64_t x_stride,
                         int64_t dy_stride, int64_t nrows, int64_t width, const float *table, uint16_t *tile,
                         int64_t tile_row_stride, int64_t tile_half_stride, uint16_t *col_amax, int kind) {
    if (kind == KIND_BF16)
        mx_stage1(xa, xb, dy, x_stride, dy_stride, nrows, width, table, tile, tile_row_stride, tile_half_stride,
                  col_amax, KIND_BF16);
    else
        mx_stage1(xa, xb, dy, x_stride, dy_stride, nrows, width, table, tile, tile_row_stride, tile_half_stride,
                  col_amax, KIND_FP16);
}

/* --------------------------------------------------------------------- mx quant, quantisation */

typedef struct { /* an FP8 format and scale rule, as _mx_quant.mx_quant_kernel folds them in */
    __m512i mbits_shift, round_half, rebias, min_normal, sub_magic, max_code, emax;
    __m512 sub_magic_f, inv_max;
    int scale_alg;
} mx_fmt;

/* E8M0 codes of 16 blocks from the fp32 magnitude bits of their amax, and the factors 2**(127 - code)
   applied to their elements (0 for zero blocks, NaN for 0xFF): _numerics.scale_code/scale_reciprocal. */
INLINE __m512i scale_codes(const mx_fmt *f, __m512i amax, __m512 *recip) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512i code;
    __mmask16 zero;
    if (f->scale_alg == 1) { /* RCEIL: the exponent of amax * fp32(1/max), rounded up unless exact */
        const __m512i p = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(amax), f->inv_max));
        const __m512i e = _mm512_srli_epi32(p, 23), mf = _mm512_and_si512(p, _mm512_set1_epi32(0x7FFFFF));
        const __mmask16 normal_up = _mm512_cmpgt_epi32_mask(e, _mm512_setzero_si512()) &
                                    _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(254)) &
                                    _mm512_cmpgt_epi32_mask(mf, _mm512_setzero_si512());
        const __mmask16 sub_up = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()) &
                                 _mm512_cmpgt_epi32_mask(mf, _mm512_set1_epi32(0x400000));
        code = _mm512_mask_add_epi32(e, normal_up | sub_up, e, one);
        zero = _mm512_cmpeq_epi32_mask(amax, _mm512_setzero_si512());
    } else { /* OCP floor: biased exponent of amax minus emax, at least 0; fp32-subnormal amax is zero */
        const __m512i ef = _mm512_srli_epi32(amax, 23);
        code = _mm512_max_epi32(_mm512_sub_epi32(ef, f->emax), _mm512_setzero_si512());
        zero = _mm512_cmpeq_epi32_mask(ef, _mm512_setzero_si512());
    }
    const __mmask16 special = _mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(0x7F800000));
    code = _mm512_maskz_mov_epi32((__mmask16)~zero, code);
    code = _mm512_mask_mov_epi32(code, special, _mm512_set1_epi32(0xFF));
    __m512i r = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), code), 23);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(code, _mm512_set1_epi32(254)),
                              _mm512_set1_epi32(0x00200000)); /* 2**-127, the only subnormal factor */
    r = _mm512_maskz_mov_epi32((__mmask16)~zero, r);
    r = _mm512_mask_mov_epi32(r, special, _mm512_set1_epi32(0x7FC00000));
    *recip = _mm512_castsi512_ps(r);
    return code;
}

/* FP8 codes of 16 fp32 values: RNE, saturating, NaN -> 0x00, sign of zero kept (_numerics.fp8_encode). */
INLINE __m128i fp8_encode(const mx_fmt *f, __m512 value) {
    const __m512i u = _mm512_castps_si512(value);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    /* subnormal codes: adding 2**(emin - mbits + 23) rounds to the subnormal quantum (RNE) */
    const __m512i sub = _mm512_sub_epi32(
        _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), f->sub_magic_f)), f->sub_magic);
    /* normal codes: RNE on the dropped mantissa bits (a carry moves into the exponent), then rebias */
    const __m512i odd = _mm512_and_si512(_mm512_srlv_epi32(a, f->mbits_shift), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(a, f->round_half), odd);
    __m512i code = _mm512_sub_epi32(_mm512_srlv_epi32(rounded, f->mbits_shift), f->rebias);
    code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(a, f->min_normal), sub);
    code = _mm512_min_epu32(code, f->max_code);
    code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80)));
    code = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(a, _mm512_set1_epi32(0x7F800000)), code); /* NaN */
    return _mm512_cvtepi32_epi8(code);
}

/* The amax of each of ``nb`` <= 16 consecutive 32-element blocks of 16-bit stored values, as the largest
   magnitude bits (u32 lanes; lanes from nb on are 0). A transposed reduction tree instead of 16 horizontal
   ones: each level halves the units (32-bit pairs of values) per block with one max of two permutations,
   until every 32-bit unit holds one block's last two candidates. */
INLINE __m512i block_amax(const uint16_t *v, int64_t nb) {
    static const int32_t idx[4][2][16] = {
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
         {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
         {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
        {{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
         {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}},
        {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
         {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}},
    };
    const __m512i mag = _mm512_set1_epi16(0x7FFF);
    __m512i r[16];
    for (int k = 0; k < 16; k++)
        r[k] = k < nb ? _mm512_and_si512(_mm512_loadu_si512(v + 32 * k), mag) : _mm512_setzero_si512();
    for (int level = 0, n = 8; level < 4; level++, n /= 2) {
        const __m512i lo = _mm512_loadu_si512(idx[level][0]), hi = _mm512_loadu_si512(idx[level][1]);
        for (int k = 0; k < n; k++)
            r[k] = _mm512_max_epu16(_mm512_permutex2var_epi32(r[2 * k], lo, r[2 * k + 1]),
                                    _mm512_permutex2var_epi32(r[2 * k], hi, r[2 * k + 1]));
    }
    return _mm512_max_epu32(_mm512_and_si512(r[0], _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(r[0], 16));
}

/* Both quantisations of one half of a task's tile (see swiglu_mx_stage1_16): row-wise 32-column blocks
   into y1/s1 and one 32-row block per column into y2/s2, exactly as the Numba kernel's loops. ``y1``,
   ``y2`` point at the task's first row and column, ``s1`` at its first scale, ``s2`` at the mxscale2 byte
   of its first column (columns 2 bytes apart: the slot axis). */
INLINE void mx_quantise(const uint16_t *tile, const uint16_t *col_amax, int64_t tile_row_stride, int64_t nrows,
                        int64_t width, uint8_t *y1, uint8_t *s1, uint8_t *y2, uint8_t *s2, int64_t y_stride,
                        int64_t s1_stride, const int kind, const int scale_alg, int mbits, int bias, int max_code,
                        int sub_magic, int emax, float inv_max) {
    const int shift = 23 - mbits;
    const mx_fmt f = {
        .mbits_shift = _mm512_set1_epi32(shift), .round_half = _mm512_set1_epi32((1 << (shift - 1)) - 1),
        .rebias = _mm512_set1_epi32((127 - bias) << mbits), .min_normal = _mm512_set1_epi32((128 - bias) << 23),
        .sub_magic = _mm512_set1_epi32(sub_magic), .max_code = _mm512_set1_epi32(max_code),
        .emax = _mm512_set1_epi32(emax), .sub_magic_f = _mm512_castsi512_ps(_mm512_set1_epi32(sub_magic)),
        .inv_max = _mm512_set1_ps(inv_max), .scale_alg = scale_alg,
    };
    /* -1 axis: per row, the amax, scale code and factor of 16 blocks of 32 columns at a time */
    for (int64_t i = 0; i < nrows; i++) {
        const uint16_t *v = tile + i * tile_row_stride;
        for (int64_t k0 = 0; k0 < width / 32; k0 += 16) {
            const int64_t nb = width / 32 - k0 < 16 ? width / 32 - k0 : 16;
            const __m512i amax_bits = block_amax(v + 32 * k0, nb);
            const __m512i amax32 = _mm512_castps_si512(widen(_mm512_cvtepi32_epi16(amax_bits), kind));
            __m512 recip;
            const __m512i codes = scale_codes(&f, amax32, &recip);
            const __mmask16 blocks = (__mmask16)((1u << nb) - 1);
            _mm_mask_storeu_epi8(s1 + i * s1_stride + k0, blocks, _mm512_cvtepi32_epi8(codes));
            float recips[16];
            _mm512_storeu_ps(recips, recip);
            for (int64_t k = 0; k < nb; k++) {
                const __m512 r = _mm512_set1_ps(recips[k]);
                const uint16_t *b = v + 32 * (k0 + k);
                uint8_t *q = y1 + i * y_stride + 32 * (k0 + k);
                const __m512 lo = widen(load16(b, 0xFFFF), kind), hi = widen(load16(b + 16, 0xFFFF), kind);
                _mm_storeu_si128((__m128i *)q, fp8_encode(&f, _mm512_mul_ps(lo, r)));
                _mm_storeu_si128((__m128i *)(q + 16), fp8_encode(&f, _mm512_mul_ps(hi, r)));
            }
        }
    }
    /* -2 axis: one block per column over the task's rows; zero padding rows never raise the amax. The
       factors of all columns first, then the rows in order (contiguous stores). */
    float col_recip[MX_MAX_WIDTH];
    for (int64_t j = 0; j < width; j += 16) {
        __m512 recip;
        const __m512i amax32 = _mm512_castps_si512(widen(load16(col_amax + j, 0xFFFF), kind));
        const __m512i codes = scale_codes(&f, amax32, &recip);
        _mm512_storeu_ps(col_recip + j, recip);
        uint32_t c[16];
        _mm512_storeu_si512(c, codes);
        for (int k = 0; k < 16; k++) s2[2 * (j + k)] = (uint8_t)c[k];
    }
    for (int64_t i = 0; i < nrows; i++) {
        const uint16_t *v = tile + i * tile_row_stride;
        uint8_t *q = y2 + i * y_stride;
        for (int64_t j = 0; j < width; j += 16) {
            const __m512 x = _mm512_mul_ps(widen(load16(v + j, 0xFFFF), kind), _mm512_loadu_ps(col_recip + j));
            _mm_storeu_si128((__m128i *)(q + j), fp8_encode(&f, x));
        }
    }
}

void swiglu_mx_quantise_16(const uint16_t *tile, const uint16_t *col_amax, int64_t tile_row_stride,
                           int64_t nrows, int64_t width, uint8_t *y1, uint8_t *s1, uint8_t *y2, uint8_t *s2,
                           int64_t y_stride, int64_t s1_stride, int kind, int scale_alg, int mbits, int bias,
                           int max_code, int sub_magic, int emax, float inv_max) {
#define MX_QUANTISE(KIND, ALG)                                                                               \
    mx_quantise(tile, col_amax, tile_row_stride, nrows, width, y1, s1, y2, s2, y_stride, s1_stride, KIND, ALG, \
                mbits, bias, max_code, sub_magic, emax, inv_max)
    if (kind == KIND_BF16) {
        if (scale_alg == 1) MX_QUANTISE(KIND_BF16, 1);
        else MX_QUANTISE(KIND_BF16, 0);
    } else {
        if (scale_alg == 1) MX_QUANTISE(KIND_FP16, 1);
        else MX_QUANTISE(KIND_FP16, 0);
    }
#undef MX_QUANTISE
}

/* ------------------------------------------------------------------------------------- threads */

static void run_workers(void *(*worker)(void *), void *args, int n_threads) {
    pthread_t threads[MAX_THREADS];
    int started = 0;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&threads[started], NULL, worker, args) == 0) started++;
    worker(args); /* the calling thread works too; with no thread started it does everything */
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
}

/* Entry point: see cpu/_native.py for the argument contract (C-contiguous arrays, clamp <= 0 = off). */
void swiglu_group_grad_16(const uint16_t *dy, const uint16_t *x, const float *weight, const uint16_t *y_origin,
                          int64_t rows, int64_t hidden, int64_t valid_rows, float clamp, float s_clamp,
                          const float *table, const int64_t *leaves, const int64_t *merges, int64_t n_leaves,
                          uint16_t *grad_x, float *grad_weight, int kind, int n_threads) {
    gg_args a = {
        .dy = dy, .x = x, .y_origin = y_origin, .weight = weight, .table = table, .leaves = leaves,
        .merges = merges, .rows = rows, .hidden = hidden, .valid_rows = valid_rows, .n_leaves = n_leaves,
        .clamp = clamp, .s_clamp = s_clamp, .grad_x = grad_x, .grad_weight = grad_weight, .kind = kind,
    };
    atomic_init(&a.next_tile, 0);
    run_workers(gg_worker, &a, n_threads);
}
