/* The GLU family on the SIMD layer: the elementwise math of every operator, once, and the three GLU
   operators that store it (swiglu_group_grad, clipped_swiglu, clipped_swiglu_grad). mx.h quantises the
   same math.

   The math works on 16 pairs (A, B) at a time. Each CANN operator keeps its own operation order (spec
   documents; swiglu_ops/reference/glu.py and reference/group_grad.py are the readable versions):
     swiglu_fwd   A~ / (exp(A~ * -alpha) + 1) * B                 SwigluMxQuantWithDualAxis stage 1
     swiglu_bwd   s = sigmoid(A); t = ((-s) + 1) * A + 1 ...      SwigluBackwardMxQuantWithDualAxis
     clipped_fwd  ClippedSwiglu, clamp_mode 0 and 1
     clipped_bwd  ClippedSwigluGrad (closed masks, selects), and the clamp_mode-1 extension
     group_grad   SwigluGroupGrad: open masks multiplied, routing weight
   where the transcendental part, a function of A alone, is ``act`` (numerics.h): from a table for 16-bit
   inputs. The layout (chunked or interleaved halves, which one is A) is the loaders' business.

   Rows are independent and every row is computed by the same code, so results do not depend on the thread
   count or on how rows are cut into tasks. */

/* ------------------------------------------------------------------------------------ the functors */

typedef struct { /* loop invariants, copied into registers by the kernels */
    act_fn act, act2;
    vf alpha, limit, nlimit, bias;
    int gather; /* swiglu_glu.gather */
} glu_consts;

/* The activations a variant reads (act2: only the clamp_mode-1 backward), as (kind, alpha, limit). */
INLINE void glu_acts(const swiglu_glu *g, int backward, act_fn *act, act_fn *act2) {
    const act_fn sigmoid = {NULL, SWIGLU_ACT_SIGMOID, 1.0f, INFINITY}, silu = {NULL, SWIGLU_ACT_GLU, 1.0f, INFINITY};
    *act2 = silu;
    if (!g->clipped) *act = backward ? sigmoid : silu;
    else if (g->clamp_mode == 1) *act = backward ? sigmoid : (act_fn){NULL, SWIGLU_ACT_SILU_MIN, 1.0f, g->limit};
    else *act = (act_fn){NULL, backward ? SWIGLU_ACT_GLU_SIG : SWIGLU_ACT_GLU, g->alpha, g->limit};
}

/* ``f`` with its table for a 16-bit dtype: from the library's cache, else a private one that the caller
   frees (``*owned``); 0 if none could be allocated. */
INLINE int act_with_table(act_fn *f, int dt, float **owned) {
    *owned = NULL;
    if (dt == SWIGLU_FP32) return 1;
    f->table = swiglu_act_table_get(f->kind, dt, f->alpha, f->limit, FN(act_build));
    if (f->table == NULL && (*owned = malloc(sizeof(float) * 65536 * ACT_WIDTH(f->kind))) != NULL) {
        FN(act_build)(f->kind, dt, f->alpha, f->limit, *owned);
        f->table = *owned;
    }
    return f->table != NULL;
}

INLINE glu_consts glu_setup(const swiglu_glu *g, const act_fn *act, const act_fn *act2) {
    const glu_consts c = {
        .act = *act,
        .act2 = *act2,
        .alpha = v_set(g->alpha),
        .limit = v_set(g->limit),
        .nlimit = v_set(-g->limit),
        .bias = v_set(g->bias),
        .gather = g->gather,
    };
    return c;
}

INLINE vf clip(const glu_consts *c, vf b) { return v_maxc(v_minc(b, c->limit), c->nlimit); }

/* Forward from the activation ``glu`` of A: the output in fp32. ``clipped`` and ``mode`` are constants of
   the caller. */
INLINE vf glu_fwd_of(const glu_consts *c, vf glu, vf b, const int clipped, const int mode) {
    if (!clipped) return v_mul(glu, b);                   /* (A / (exp(-A) + 1)) * B */
    if (mode == 0) return v_mul(glu, v_add(clip(c, b), c->bias)); /* glu * (clip(B) + bias) */
    return v_mul(glu, clip(c, b));                        /* min(silu(A), L) * clip(B) */
}

/* Forward: the activation output in fp32. */
INLINE vf glu_fwd(const glu_consts *c, vf a, act_idx ai, vf b, const int clipped, const int mode, const int dt) {
    return glu_fwd_of(c, act(&c->act, a, ai, dt), b, clipped, mode);
}

/* Backward of the plain SwiGLU and of the clipped one with clamp_mode 0 from the activation ``s`` of A (their
   sigmoid): (grad A, grad B) in fp32. */
INLINE void glu_bwd_of(const glu_consts *c, vf a, vf s, vf b, vf dy, const int clipped, vf *ga, vf *gb) {
    const vf one = v_set(1.0f), zero = v_zero();
    if (!clipped) { /* swiglu_backward_mx_quant.md 2.2 */
        const vf t = v_add(v_mul(v_add(v_neg(s), one), a), one);
        *ga = v_mul(v_mul(v_mul(t, b), s), dy);
        *gb = v_mul(v_mul(s, dy), a);
        return;
    }
    /* clipped_swiglu.md 4: s = (A~ * 0 + 1) / (exp(A~ * -alpha) + 1) */
    const vm b_ok = m_and(v_le(b, c->limit), v_ge(b, c->nlimit)); /* closed masks, raw inputs */
    const vf at = v_minc(a, c->limit);
    const vf bp = v_add(clip(c, b), c->bias);
    const vf db = v_mul(v_mul(dy, at), s);
    vf t = v_add(v_mul(s, v_set(-1.0f)), one);
    t = v_mul(v_mul(v_add(v_mul(v_mul(t, at), c->alpha), one), s), bp);
    *ga = v_sel(v_le(a, c->limit), v_mul(t, dy), zero);
    *gb = v_sel(b_ok, db, zero);
}

/* Backward: (grad A, grad B) in fp32. */
INLINE void glu_bwd(const glu_consts *c, vf a, act_idx ai, vf b, vf dy, const int clipped, const int mode,
                    const int dt, vf *ga, vf *gb) {
    if (!clipped || mode == 0) {
        glu_bwd_of(c, a, act(&c->act, a, ai, dt), b, dy, clipped, ga, gb);
        return;
    }
    /* the clamp_mode-1 extension, clipped_swiglu.md 10 */
    const vf one = v_set(1.0f), zero = v_zero();
    const vm b_ok = m_and(v_le(b, c->limit), v_ge(b, c->nlimit)); /* closed masks, raw inputs */
    const vf s = act(&c->act, a, ai, dt);     /* 1 / (exp(-A) + 1) */
    const vf silu = act(&c->act2, a, ai, dt); /* A / (exp(-A) + 1) */
    const vf db = v_mul(dy, v_minc(silu, c->limit));
    vf t = v_add(v_mul(v_add(v_mul(s, v_set(-1.0f)), one), a), one);
    t = v_mul(v_mul(t, s), clip(c, b));
    *ga = v_sel(v_le(silu, c->limit), v_mul(t, dy), zero);
    *gb = v_sel(b_ok, db, zero);
}

/* ------------------------------------------------------------------------------ pairs in a row */

/* The raw bits of 16 pairs from pair ``p`` of a row of ``2 * half`` elements (masked pairs give 0). */
INLINE void ld_ab(const void *row, int64_t half, int64_t p, const int inter, int a_index, const int dt, vm m,
                  vu *a, vu *b) {
    if (inter) {
        vu even, odd;
        ld_bits_pairs(row, p, dt, m, &even, &odd);
        *a = a_index ? odd : even;
        *b = a_index ? even : odd;
    } else {
        *a = ld_bits(row, p + a_index * half, dt, m);
        *b = ld_bits(row, p + (1 - a_index) * half, dt, m);
    }
}

/* Stores the bits of 16 pairs' (A, B) results at their columns of a row of ``2 * half`` elements. */
INLINE void st_ab(void *row, int64_t half, int64_t p, vu a, vu b, const int inter, int a_index, const int dt,
                  vm m) {
    if (inter) {
        st_bits_pairs(row, p, a_index ? b : a, a_index ? a : b, dt, m);
    } else {
        st_bits(row, p + a_index * half, a, dt, m);
        st_bits(row, p + (1 - a_index) * half, b, dt, m);
    }
}

/* ----------------------------------------------------------------------------- swiglu_group_grad */

/* 16 pairs of one row of SwigluGroupGrad (swiglu_group_grad.md section 3): masked multiplies stand for the
   spec's 0/1-mask products (a masked inf/NaN stays NaN, zeros keep their sign). */
INLINE void gg_pairs(const glu_consts *c, vf dy, vf g, act_idx gi, vf u, vf w, vf clamp, int masked_row,
                     const int has_clamp, const int dt, vf *dg, vf *du) {
    const vf zero = v_zero();
    vm m_g = m_all(), m_u = m_all();
    if (has_clamp) { /* open intervals on the raw inputs (NaN -> masked); min/clip keep NaN */
        m_g = v_lt(g, clamp);
        m_u = v_lt(v_abs(u), clamp);
        g = v_minc(g, clamp);
        u = v_maxc(v_minc(u, clamp), v_neg(clamp));
    }
    vf f, sp; /* silu(min(g, clamp)) and its derivative */
    if (dt != SWIGLU_FP32) act_lookup2(c->act.table, gi, &f, &sp);
    else silu_deriv(g, act(&c->act, g, gi, dt), &f, &sp);
    vf dgv = v_mul(v_mul(v_mul(dy, sp), u), w);
    vf duv = v_mul(v_mul(dy, f), w);
    if (has_clamp) {
        dgv = v_sel(m_g, dgv, v_mul(dgv, zero));
        duv = v_sel(m_u, duv, v_mul(duv, zero));
    }
    if (masked_row) {
        dgv = v_mul(dgv, zero);
        duv = v_mul(duv, zero);
    }
    *dg = dgv;
    *du = duv;
}

/* NumPy's float32 pairwise sum of ``dy * y_origin`` over ``n`` elements of a row (swiglu_group_grad.md
   section 5), without its final ``0.0 +``: runs of more than 128 elements split at n / 2 rounded down to a
   multiple of 8; a run of at most 128 is summed by 8 accumulators (lanes 0-7), combined as
   ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then its n % 8 tail in order. */
INLINE float gg_leaf(const void *dy, const void *yo, int64_t n, const int dt) {
    float res;
    if (n < 8) {
        float p[16];
        const vm m = m_lanes(n);
        v_storef(p, v_mul(ld(dy, 0, dt, m), ld(yo, 0, dt, m)), m_all());
        res = -0.0f;
        for (int64_t i = 0; i < n; i++) res += p[i];
        return res;
    }
    const vm m8 = m_lanes(8);
    const int64_t body = n - n % 8;
    vf acc = v_mul(ld(dy, 0, dt, m8), ld(yo, 0, dt, m8));
    for (int64_t i = 8; i < body; i += 8) acc = v_add(acc, v_mul(ld(dy, i, dt, m8), ld(yo, i, dt, m8)));
    float r[16];
    v_storef(r, acc, m_all());
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    if (body < n) {
        float p[16];
        const vm m = m_lanes(n - body);
        v_storef(p, v_mul(ld(dy, body, dt, m), ld(yo, body, dt, m)), m_all());
        for (int64_t i = 0; i < n - body; i++) res += p[i];
    }
    return res;
}

static float FN(gg_pairwise)(const void *dy, const void *yo, int64_t n, int dt) {
    if (n > 128) {
        int64_t half = n / 2;
        half -= half % 8;
        const size_t es = dt == SWIGLU_FP32 ? 4 : 2;
        const float lo = FN(gg_pairwise)(dy, yo, half, dt);
        return lo + FN(gg_pairwise)((const char *)dy + half * es, (const char *)yo + half * es, n - half, dt);
    }
    if (dt == SWIGLU_BF16) return gg_leaf(dy, yo, n, SWIGLU_BF16);
    if (dt == SWIGLU_FP16) return gg_leaf(dy, yo, n, SWIGLU_FP16);
    return gg_leaf(dy, yo, n, SWIGLU_FP32);
}

/* ------------------------------------------------------------------------------------- the tasks */

enum { GLU_ROWS_PER_TASK = 16 };

typedef struct {
    const swiglu_glu_args *a;
    act_fn act, act2;
    int64_t chunk, n_chunks; /* pairs per task, tasks per row range */
} glu_job;

/* Software prefetch, interleaved with the work: while a row is computed, the same columns of the next row
   are requested, one cache line of each input stream per 64 bytes of dy (every step of 16 fp32 pairs, every
   other step of 16-bit ones), into L1. The hardware prefetchers alone leave a thread at a third of the
   memory bandwidth here: a row touches 4-6 streams of a few KiB each, and they stop at every 4 KiB page.
   (bf16 swiglu_group_grad at M=8192, 2H=4096, 2 threads, same-minute A/B: 14.2 -> 5.6 ms; the next row's
   lines requested all at once at the start of a row: 11 ms; two rows ahead, or into L2 only: no better.)
   The next row's output lines are requested for writing (prefetchw) the same way: their first stores
   waited for the read for ownership (Intel host, cold caches, three alternating runs: bf16 group_grad
   10.3 -> 10.0 ms, AVX2 9.8 -> 9.4; the clipped operators unchanged).
   ``xn``, ``dyn``, ``yon``, ``on``: the next row's x, dy (NULL: none), y_origin (NULL: none) and output
   (``fwd``: clipped_swiglu's, one element per pair). */
INLINE void glu_prefetch(const char *xn, const char *dyn, const char *yon, const char *on, int64_t half, int64_t p,
                         const int inter, const int dt, const int fwd) {
    const int64_t es = dt == SWIGLU_FP32 ? 4 : 2;
    if (inter) {
        __builtin_prefetch(xn + 2 * p * es, 0, 3);
        __builtin_prefetch(xn + 2 * p * es + 64, 0, 3);
    } else {
        __builtin_prefetch(xn + p * es, 0, 3);
        __builtin_prefetch(xn + (half + p) * es, 0, 3);
    }
    if (fwd) {
        __builtin_prefetch(on + p * es, 1, 3);
    } else if (inter) {
        __builtin_prefetch(on + 2 * p * es, 1, 3);
        __builtin_prefetch(on + 2 * p * es + 64, 1, 3);
    } else {
        __builtin_prefetch(on + p * es, 1, 3);
        __builtin_prefetch(on + (half + p) * es, 1, 3);
    }
    if (dyn != NULL) __builtin_prefetch(dyn + p * es, 0, 3);
    if (yon != NULL) __builtin_prefetch(yon + p * es, 0, 3);
}

/* One step of a GLU row: 16 pairs from pair ``p`` (``m``: the pairs that exist; ``full``, a constant: all 16,
   with the constant full mask, which gives plain loads and stores). */
INLINE void glu_step(const glu_consts *c, const char *x, const char *dy, char *out, int64_t half, int64_t p, vm m,
                     const int full, vf w, vf clamp, int masked, int a_index, const int op, const int dt,
                     const int inter, const int flag) {
    if (op != SWIGLU_OP_GROUP_GRAD && masked) { /* the clipped ops: +0.0, not computed */
        if (op == SWIGLU_OP_CLIPPED_FWD) st_bits(out, p, u_zero(), dt, m);
        else st_ab(out, half, p, u_zero(), u_zero(), inter, a_index, dt, m);
        return;
    }
    vu ab, bb;
    ld_ab(x, half, p, inter, a_index, dt, m, &ab, &bb);
    const vf av = widen(ab, dt), bv = widen(bb, dt);
    const act_idx ai = act_idx_at(ab, (const uint16_t *)x + (inter ? 2 * p + a_index : p + a_index * half), inter,
                                  full, dt, c->gather);
    if (op == SWIGLU_OP_CLIPPED_FWD) {
        st(out, p, glu_fwd(c, av, ai, bv, 1, flag, dt), dt, m);
        return;
    }
    const vf dyv = ld(dy, p, dt, m);
    vf ga, gb;
    if (op == SWIGLU_OP_CLIPPED_BWD) glu_bwd(c, av, ai, bv, dyv, 1, flag, dt, &ga, &gb);
    else gg_pairs(c, dyv, av, ai, bv, w, clamp, masked, flag, dt, &ga, &gb);
    st_ab(out, half, p, narrow(ga, dt), narrow(gb, dt), inter, a_index, dt, m);
}

/* Rows [r0, r1) x pairs [p0, p1) of one GLU operator, specialised by the caller's constants: full steps of
   16 pairs, then the row's tail. */
INLINE void glu_tile(const glu_job *job, int64_t r0, int64_t r1, int64_t p0, int64_t p1, const int op,
                     const int dt, const int inter, const int flag) {
    const swiglu_glu_args *a = job->a;
    const int64_t half = a->cols / 2, es = dt == SWIGLU_FP32 ? 4 : 2;
    const int a_index = a->glu.a_index;
    const glu_consts c = glu_setup(&a->glu, &job->act, &job->act2);
    const vf clamp = v_set(a->clamp);
    for (int64_t r = r0; r < r1; r++) {
        const char *x = (const char *)a->x + r * a->cols * es;
        const char *dy = (const char *)a->dy + r * half * es;
        char *out = (char *)a->out + r * (op == SWIGLU_OP_CLIPPED_FWD ? half : a->cols) * es;
        const int masked = r >= a->valid_rows;
        const vf w = v_set(a->weight != NULL ? a->weight[r] : 1.0f); /* times 1 == skipping it */
        /* the next row (the last one: itself again, already in cache; p0 == 0: the task computes
           grad_weight, which reads y_origin's whole row), one prefetch per 64 bytes of dy */
        const int64_t rn = r + 1 < a->rows ? r + 1 : r;
        const char *xn = (const char *)a->x + rn * a->cols * es;
        const char *dyn = op != SWIGLU_OP_CLIPPED_FWD ? (const char *)a->dy + rn * half * es : NULL;
        const char *yon = op == SWIGLU_OP_GROUP_GRAD && a->weight != NULL && p0 == 0
                              ? (const char *)a->y_origin + rn * half * es
                              : NULL;
        const char *outn = (const char *)a->out + rn * (op == SWIGLU_OP_CLIPPED_FWD ? half : a->cols) * es;
        const int64_t steps = es == 2 ? 2 : 1; /* steps of 16 pairs per prefetch */
        int64_t p = p0;
        for (; p + 16 * steps <= p1; p += 16 * steps) {
            glu_prefetch(xn, dyn, yon, outn, half, p, inter, dt, op == SWIGLU_OP_CLIPPED_FWD);
            for (int64_t k = 0; k < steps; k++)
                glu_step(&c, x, dy, out, half, p + 16 * k, m_all(), 1, w, clamp, masked, a_index, op, dt, inter, flag);
        }
        if (p + 16 <= p1) {
            glu_step(&c, x, dy, out, half, p, m_all(), 1, w, clamp, masked, a_index, op, dt, inter, flag);
            p += 16;
        }
        if (p < p1) glu_step(&c, x, dy, out, half, p, m_lanes(p1 - p), 0, w, clamp, masked, a_index, op, dt, inter, flag);
        if (op == SWIGLU_OP_GROUP_GRAD && a->weight != NULL && p0 == 0) { /* never masked */
            const char *yo = (const char *)a->y_origin + r * half * es;
            a->grad_weight[r] = grad_weight_value(FN(gg_pairwise)(dy, yo, half, dt));
        }
    }
}

/* One function per specialisation of glu_tile: (operator, dtype, layout, clamp / clamp_mode). The
   compiler then folds every constant into its own loop (left to itself, it cloned a few and ran the others
   through one generic loop full of branches). */
typedef void (*glu_tile_fn)(const glu_job *, int64_t, int64_t, int64_t, int64_t);
#define GLU_SPEC(NAME, OP, DT, INTER, FLAG)                                                          \
    PHASE void FN(NAME)(const glu_job *job, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {            \
        glu_tile(job, r0, r1, p0, p1, OP, DT, INTER, FLAG);                                          \
    }
#define GLU_SPECS(OPN, OP, DTN)                                         \
    GLU_SPEC(glu_##OPN##_##DTN##_00, OP, SWIGLU_##DTN, 0, 0)           \
    GLU_SPEC(glu_##OPN##_##DTN##_01, OP, SWIGLU_##DTN, 0, 1)           \
    GLU_SPEC(glu_##OPN##_##DTN##_10, OP, SWIGLU_##DTN, 1, 0)           \
    GLU_SPEC(glu_##OPN##_##DTN##_11, OP, SWIGLU_##DTN, 1, 1)
#define GLU_SPECS_ALL_DT(OPN, OP) GLU_SPECS(OPN, OP, BF16) GLU_SPECS(OPN, OP, FP16) GLU_SPECS(OPN, OP, FP32)
GLU_SPEC(glu_gg_BF16_0, SWIGLU_OP_GROUP_GRAD, SWIGLU_BF16, 0, 0)
GLU_SPEC(glu_gg_BF16_1, SWIGLU_OP_GROUP_GRAD, SWIGLU_BF16, 0, 1)
GLU_SPEC(glu_gg_FP16_0, SWIGLU_OP_GROUP_GRAD, SWIGLU_FP16, 0, 0)
GLU_SPEC(glu_gg_FP16_1, SWIGLU_OP_GROUP_GRAD, SWIGLU_FP16, 0, 1)
GLU_SPEC(glu_gg_FP32_0, SWIGLU_OP_GROUP_GRAD, SWIGLU_FP32, 0, 0)
GLU_SPEC(glu_gg_FP32_1, SWIGLU_OP_GROUP_GRAD, SWIGLU_FP32, 0, 1)
GLU_SPECS_ALL_DT(fwd, SWIGLU_OP_CLIPPED_FWD)
GLU_SPECS_ALL_DT(bwd, SWIGLU_OP_CLIPPED_BWD)

/* [dtype][clamp] for swiglu_group_grad; [dtype][interleaved][clamp_mode] for the clipped operators */
static const glu_tile_fn glu_gg_tiles[3][2] = {
    {FN(glu_gg_BF16_0), FN(glu_gg_BF16_1)}, {FN(glu_gg_FP16_0), FN(glu_gg_FP16_1)}, {FN(glu_gg_FP32_0), FN(glu_gg_FP32_1)}};
#define GLU_ROW(OPN, DTN)                                                                              \
    {{FN(glu_##OPN##_##DTN##_00), FN(glu_##OPN##_##DTN##_01)}, {FN(glu_##OPN##_##DTN##_10), FN(glu_##OPN##_##DTN##_11)}}
static const glu_tile_fn glu_fwd_tiles[3][2][2] = {GLU_ROW(fwd, BF16), GLU_ROW(fwd, FP16), GLU_ROW(fwd, FP32)};
static const glu_tile_fn glu_bwd_tiles[3][2][2] = {GLU_ROW(bwd, BF16), GLU_ROW(bwd, FP16), GLU_ROW(bwd, FP32)};
#undef GLU_SPEC
#undef GLU_SPECS
#undef GLU_SPECS_ALL_DT
#undef GLU_ROW

static void FN(glu_task)(const void *ctx, int64_t t) {
    const glu_job *job = ctx;
    const swiglu_glu_args *a = job->a;
    const int64_t tile = t / job->n_chunks, chunk = t % job->n_chunks;
    const int64_t r0 = tile * GLU_ROWS_PER_TASK;
    const int64_t r1 = r0 + GLU_ROWS_PER_TASK < a->rows ? r0 + GLU_ROWS_PER_TASK : a->rows;
    const int64_t half = a->cols / 2, p0 = chunk * job->chunk;
    const int64_t p1 = p0 + job->chunk < half ? p0 + job->chunk : half;
    const int inter = a->glu.interleaved != 0, mode = a->glu.clamp_mode != 0;
    glu_tile_fn fn;
    if (a->op == SWIGLU_OP_GROUP_GRAD) fn = glu_gg_tiles[a->dtype][a->clamp > 0];
    else if (a->op == SWIGLU_OP_CLIPPED_FWD) fn = glu_fwd_tiles[a->dtype][inter][mode];
    else fn = glu_bwd_tiles[a->dtype][inter][mode];
    fn(job, r0, r1, p0, p1);
}

static int FN(glu_run_impl)(const swiglu_glu_args *a, int n_threads) {
    glu_job job = {.a = a};
    if (a->op == SWIGLU_OP_GROUP_GRAD) { /* of min(g, clamp): the clamp is the only limit */
        const int pairs = a->dtype != SWIGLU_FP32;
        job.act = (act_fn){NULL, pairs ? SWIGLU_ACT_SILU_DERIV : SWIGLU_ACT_SIGMOID, 1.0f, a->clamp > 0 ? a->clamp : INFINITY};
    } else {
        glu_acts(&a->glu, a->op == SWIGLU_OP_CLIPPED_BWD, &job.act, &job.act2);
    }
    /* act2 is read by the clamp_mode-1 backward only (glu_bwd): its table is fetched for that one */
    const int reads_act2 = a->op == SWIGLU_OP_CLIPPED_BWD && a->glu.clipped && a->glu.clamp_mode == 1;
    float *own1, *own2 = NULL;
    const int ok = act_with_table(&job.act, a->dtype, &own1) &&
                   (!reads_act2 || act_with_table(&job.act2, a->dtype, &own2));
    /* Whole rows per task when there are enough row tiles to share; else rows cut into chunks of pairs
       (a multiple of 1024), so that a few long rows still use every thread. */
    const int64_t half = a->cols / 2, tiles = (a->rows + GLU_ROWS_PER_TASK - 1) / GLU_ROWS_PER_TASK;
    job.chunk = half;
    if (tiles < 4 * (int64_t)n_threads && half > 1024) {
        const int64_t want = (4 * (int64_t)n_threads + tiles - 1) / tiles;
        job.chunk = ((half + want - 1) / want + 1023) / 1024 * 1024;
    }
    job.n_chunks = (half + job.chunk - 1) / job.chunk;
    if (ok) swiglu_pool_run(FN(glu_task), &job, tiles * job.n_chunks, n_threads);
    free(own1);
    free(own2);
    return ok ? 0 : -2;
}
