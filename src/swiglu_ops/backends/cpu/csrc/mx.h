/* The two dual-axis MX operators on the SIMD layer: stage 1 of the GLU family (glu.h), rounded to the
   input dtype, then MX-quantised along both axes in one pass over memory.

   Work is cut into tasks of one 32-row block (of a group, or of a batch slice without groups) times a
   chunk of pairs: whole rows where they fit (mx_task_pairs). A task reads its rows of x (and dy) once, keeps
   the rounded stage-1 values as stored bits in a tile (32 rows x the task's output columns, in L2) together
   with their column amax, and from that tile writes both directions: row-wise 32-column blocks (y1,
   mxscale1) and the 32-row column blocks (y2, mxscale2). Tasks write disjoint outputs with the same code,
   so the results do not depend on the thread count or on the chunk size.

   Output columns of a task ("segments" of the tile):
     backward, chunked:      A's and B's gradients, two segments of w columns (x's layout: columns follow x)
     backward, interleaved:  one segment of 2w columns
     forward:                one segment of w columns (y has cols / 2 columns)

   Routing weight (spec 7.1): stage 1 times w[row], the last fp32 operation before the rounding. The
   backward with a weight also returns grad_weight[row] = 0.0 + sum(dy * act16) over the row's pairs, act16
   the forward's unweighted stage 1 rounded to the dtype (its own activation table), in the same pass: each
   task sums its rows' products lane-wise per GW_PAIRS-pair block of the row (16 pairs at a time, in order),
   and a row's block vectors are added lane-wise in a fixed tree over the row's blocks, then the 16 lanes in a
   fixed tree (gw_row_sum), by the task when it holds whole rows, else after all tasks from a scratch array.
   Tasks hold whole blocks (their pairs are a multiple of GW_PAIRS), so the bits depend neither on the
   thread count nor on the cut of the rows. (A horizontal sum per block instead: +6 % of the stage-1 time.) */

enum { MX_BLOCK = 32, GW_PAIRS = 128 };

/* Pairs per task, a multiple of 32: whole rows where their tile fits in half the L2 (within [128 KiB,
   1 MiB]; 256 KiB where the C library does not say) and there are still 4 tasks per thread, else each row
   cut into equal chunks; ``tile_pairs`` (> 0) caps it (tests: many chunks at small shapes). Whole rows are
   read front to back, which the hardware prefetchers follow; they barely start on the 1 KiB pieces of a
   row that 512-pair tasks read. Measured at M=8192, 2H=4096 bf16 (Zen 4, 1 MiB L2), 512-pair tasks ->
   whole rows (2048): forward 8.8 -> 7.6 ms, backward 16.7 -> 14.3 ms on 2 threads, 15.3 -> 14.8 ms
   forward on one. */
INLINE int64_t mx_task_pairs(const swiglu_mx_args *a, int64_t n_blocks, int n_threads) {
    const int64_t half = a->cols / 2, es = a->dtype == SWIGLU_FP32 ? 4 : 2, outs = a->backward ? 2 : 1;
    const int64_t unit = a->backward && a->weight != NULL ? GW_PAIRS : MX_BLOCK; /* whole grad_weight blocks */
    const int64_t l2 = (int64_t)swiglu_l2_cache_bytes();
    int64_t budget = l2 > 0 ? l2 / 2 : 256 << 10;
    budget = budget < 128 << 10 ? 128 << 10 : budget > 1 << 20 ? 1 << 20 : budget;
    int64_t cap = budget / (MX_BLOCK * outs * es);
    if (a->tile_pairs > 0 && a->tile_pairs < cap) cap = a->tile_pairs;
    cap = cap < unit ? unit : cap / unit * unit;
    const int64_t most = (half + MX_BLOCK - 1) / MX_BLOCK;
    const int64_t want = n_blocks > 0 ? (4 * (int64_t)n_threads + n_blocks - 1) / n_blocks : 1; /* no rows: no tasks */
    int64_t n = (half + cap - 1) / cap;
    if (n < want) n = want < most ? want : most;
    const int64_t per = (half + n - 1) / n;
    return (per + unit - 1) / unit * unit;
}

/* A task's working memory, in its thread's buffer (swiglu_thread_buffer): ``ts`` tile columns. */
typedef struct {
    void *tile;                 /* 32 rows x ts stored values */
    void *col_amax;             /* per tile column, in the stored bits' width */
    float *col_recip;           /* per column of a segment: its column block's multiplier, */
    uint16_t *col_off, *col_keep; /* and fp8x32_block's offset and keep */
    uint8_t *y2t;               /* transpose_y2: a segment's codes, [row][column] */
    float *gw;                  /* grad_weight: the block sums of the task's rows, [row][ts / GW_PAIRS][16] */
} mx_work;

INLINE int mx_work_get(int64_t ts, mx_work *w) {
    const size_t cols = (size_t)(ts + 31) / 32 * 32; /* every array 64-byte aligned */
    const size_t tile = MX_BLOCK * cols * 4, amax = cols * 4, recip = cols * 4, off = cols * 2, y2t = MX_BLOCK * cols;
    const size_t gw = MX_BLOCK * (cols / GW_PAIRS + 1) * 16 * 4;
    char *p = swiglu_thread_buffer(tile + amax + recip + 2 * off + y2t + gw);
    if (p == NULL) return 0;
    *w = (mx_work){p, p + tile, (float *)(p + tile + amax), (uint16_t *)(p + tile + amax + recip),
                   (uint16_t *)(p + tile + amax + recip + off), (uint8_t *)(p + tile + amax + recip + 2 * off),
                   (float *)(p + tile + amax + recip + 2 * off + y2t)};
    return 1;
}

typedef struct { /* a 32-row block: batch, first row, rows, mxscale2 row and slot */
    int64_t b, row0, nrows, s2_row, slot;
    int64_t gw_only; /* rows past the last group end: only their grad_weight (no outputs) */
} mx_block;

typedef struct {
    const swiglu_mx_args *a;
    const mx_block *blocks;
    act_fn act;
    act_fn act_fwd;          /* backward with weight: the forward's activation (act16 of grad_weight), */
    act_fn act_pair;         /* or, 16-bit inputs, both activations from one table of pairs */
    mx_format fmt;
    int64_t chunk, n_chunks; /* pairs per task, tasks per block of rows */
    int64_t width;           /* output columns of a row: cols (backward), cols / 2 (forward) */
    int64_t gw_blocks;       /* grad_weight blocks per row, ceil(cols / 2 / GW_PAIRS) */
    float *gw_parts;         /* [batch * m][gw_blocks][16] block sums when rows are cut (n_chunks > 1), else NULL */
    atomic_int *failed;      /* set by a task whose working memory could not be allocated */
} mx_job;

/* ------------------------------------------------------------------------------------------ stage 1 */

/* fp32 values rounded to ``dt`` and widened back (fp32: unchanged). */
INLINE vf round_to(vf v, const int dt) { return dt == SWIGLU_FP32 ? v : widen(narrow(v, dt), dt); }

/* The stage-1 results of 16 pairs of a row, in fp32: the forward's in *ya (+0 in the lanes past the pairs),
   the backward's A and B gradients in *ya and *yb. ``xa``/``xb``: the row's A and B halves (chunked: from
   the task's first pair; interleaved: ``xa`` the row's first pair, ``xb`` unused); ``m``: the pairs that
   exist (``full``: all 16). A constant full ``m`` gives plain loads. ``wt`` (a constant): times the row's
   routing weight ``w`` last; the weighted backward also gives ``*pr`` = dy * act16 (+0 past the pairs),
   act16 the forward's stage 1 (``cf``: its activation ``act``; for 16-bit inputs ``act2``, the pair table
   of both activations, one lookup instead of two) rounded to the dtype. */
INLINE void mx_pairs(const glu_consts *c, const glu_consts *cf, const char *xa, const char *xb, const char *dy,
                     int64_t q, int a_index, vm m, const int full, const int dt, const int bwd, const int inter,
                     const int clipped, const int wt, vf w, vf *ya, vf *yb, vf *pr) {
    vu ab, bb;
    if (inter) {
        vu even, odd;
        ld_bits_pairs(xa, q, dt, m, &even, &odd);
        ab = a_index ? odd : even;
        bb = a_index ? even : odd;
    } else {
        ab = ld_bits(xa, q, dt, m);
        bb = ld_bits(xb, q, dt, m);
    }
    const vf av = widen(ab, dt), bv = widen(bb, dt);
    const act_idx ai = act_idx_at(ab, (const uint16_t *)xa + (inter ? 2 * q + a_index : q), inter, full, dt, c->gather);
    if (!bwd) {
        const vf y = glu_fwd(c, av, ai, bv, clipped, 0, dt);
        *ya = v_sel(m, wt ? v_mul(y, w) : y, v_zero());
        return;
    }
    const vf dyv = ld(dy, q, dt, m);
    if (!wt) {
        glu_bwd(c, av, ai, bv, dyv, clipped, 0, dt, ya, yb);
        return;
    }
    vf fwd;
    if (dt != SWIGLU_FP32) {
        vf s, g;
        act_lookup2(cf->act2.table, ai, &s, &g);
        glu_bwd_of(c, av, s, bv, dyv, clipped, ya, yb);
        fwd = glu_fwd_of(cf, g, bv, clipped, 0);
    } else {
        glu_bwd(c, av, ai, bv, dyv, clipped, 0, dt, ya, yb);
        fwd = glu_fwd(cf, av, ai, bv, clipped, 0, dt);
    }
    *ya = v_mul(*ya, w);
    *yb = v_mul(*yb, w);
    *pr = v_sel(m, v_mul(dyv, round_to(fwd, dt)), v_zero());
}

/* Stored values into a tile row from column ``col`` and the running amax of their magnitude bits per
   column (``ca``): 32 16-bit values, or 16 fp32 ones. */
INLINE void tile_put16(uint16_t *t, uint16_t *ca, int64_t col, vw v, vwm m) {
    w_store(t + col, v, m);
    w_store(ca + col, w_max(w_load(ca + col, m), w_and(v, w_set(0x7FFF))), m);
}
INLINE void tile_put32(uint32_t *t, uint32_t *ca, int64_t col, vu v, vm m) {
    u_store32(t + col, v, m);
    u_store32(ca + col, u_max(u_load32(ca + col, m), u_and(v, u_set(0x7FFFFFFF))), m);
}

/* One step of a row's stage 1 from pair ``q``, ``n`` pairs left (a constant >= 32 gives full vectors): the
   rounded results as stored bits into the tile row ``t`` (output-column order; chunked: A's and B's results
   at ``ta``/``tb``) and their column amax into ``ca``. 16-bit results are rounded 32 at a time (narrow2):
   32 pairs per step, or 16 for the interleaved backward (32 results); fp32: 16 pairs. The forward fills
   its lanes past the pairs with +0, up to the next 32 columns, so that a partial block reads zeros. The
   weighted backward adds its products dy * act16 to ``acc``, 16 pairs at a time in pair order. */
INLINE void mx_stage1_step(const glu_consts *c, const glu_consts *cf, const char *xa, const char *xb, const char *dy,
                           void *t, void *ca, int64_t q, int64_t n, int64_t ta, int64_t tb, int a_index, const int dt,
                           const int bwd, const int inter, const int clipped, const int wt, vf w, vf *acc) {
    vf ya, yb, ya2, yb2, pr, pr2;
    mx_pairs(c, cf, xa, xb, dy, q, a_index, m_lanes(n), n >= 16, dt, bwd, inter, clipped, wt, w, &ya, &yb, &pr);
    if (bwd && wt) *acc = v_add(*acc, pr); /* the weighted backward's dy * act16, pair by pair in order */
    if (dt == SWIGLU_FP32) {
        if (!bwd) {
            tile_put32(t, ca, q, narrow(ya, dt), m_all());
        } else if (inter) { /* one segment: A and B at their own columns */
            const vu even = narrow(a_index ? yb : ya, dt), odd = narrow(a_index ? ya : yb, dt);
            const vm m = m_lanes(n);
            u_store32_pairs((uint32_t *)t + 2 * q, even, odd, m);
            vu ce, co;
            u_load32_pairs((uint32_t *)ca + 2 * q, m, &ce, &co);
            u_store32_pairs((uint32_t *)ca + 2 * q, u_max(ce, u_and(even, u_set(0x7FFFFFFF))),
                            u_max(co, u_and(odd, u_set(0x7FFFFFFF))), m);
        } else { /* two segments: x's left half first */
            tile_put32(t, ca, ta + q, narrow(ya, dt), m_lanes(n));
            tile_put32(t, ca, tb + q, narrow(yb, dt), m_lanes(n));
        }
        return;
    }
    if (bwd && inter) { /* 16 pairs, 32 results at their own columns */
        const vw v = w_interleave(narrow2(a_index ? yb : ya, a_index ? ya : yb, dt));
        tile_put16(t, ca, 2 * q, v, w_lanes(2 * n));
        return;
    }
    mx_pairs(c, cf, xa, xb, dy, q + 16, a_index, m_lanes(n - 16), n >= 32, dt, bwd, inter, clipped, wt, w, &ya2, &yb2,
             &pr2);
    if (bwd && wt) *acc = v_add(*acc, pr2);
    if (!bwd) {
        tile_put16(t, ca, q, narrow2(ya, ya2, dt), w_lanes(32));
        return;
    }
    tile_put16(t, ca, ta + q, narrow2(ya, ya2, dt), w_lanes(n));
    tile_put16(t, ca, tb + q, narrow2(yb, yb2, dt), w_lanes(n));
}

/* The lines of one stage-1 step (``step`` pairs from pair ``q``) of the next row: its x (chunked: both
   halves, ``xa``/``xb``; interleaved: ``xa``) and dy (NULL: none). */
INLINE void mx_prefetch(const char *xa, const char *xb, const char *dy, int64_t q, const int64_t step,
                        const int64_t es, const int inter) {
    const int64_t xs = inter ? 2 : 1; /* x elements per pair in the stream(s) */
    for (int64_t o = 0; o < xs * step * es; o += 64) {
        __builtin_prefetch(xa + xs * q * es + o, 0, 3);
        if (!inter) __builtin_prefetch(xb + q * es + o, 0, 3);
    }
    if (dy != NULL)
        for (int64_t o = 0; o < step * es; o += 64) __builtin_prefetch(dy + q * es + o, 0, 3);
}

/* The sum of a row's ``n`` >= 1 grad_weight block sums (``p``: n vectors of 16 lanes, overwritten): the
   vectors lane-wise in a fixed tree (vector i + vector i + ceil(len / 2), until one is left), then its lanes
   (lane i + lane i + 8, then + 4, + 2, + 1). */
static float FN(gw_row_sum)(float *p, int64_t n) {
    for (int64_t len = n; len > 1; len = (len + 1) / 2)
        for (int64_t i = 0; i < len / 2; i++)
            v_storef(p + 16 * i, v_add(v_loadf(p + 16 * i, m_all()), v_loadf(p + 16 * (i + (len + 1) / 2), m_all())),
                     m_all());
    float r[16];
    memcpy(r, p, sizeof r);
    for (int k = 8; k >= 1; k /= 2)
        for (int i = 0; i < k; i++) r[i] = r[i] + r[i + k];
    return r[0];
}

/* Rows of a task: mx_stage1_vec over the task's pairs, full vectors first. The forward stores +0 past its
   pairs up to the next 32 columns, so that a partial block reads zeros. ``wt`` (a constant): with the
   routing weight; the backward then writes each row's grad_weight block sums at ``gw`` (16 lanes each; row
   i's at ``gw + i * (chunk / GW_PAIRS) * 16``, the task's first pair a block start). */
INLINE void mx_stage1(const mx_job *job, const mx_block *blk, int64_t p0, int64_t w, void *tile, int64_t ts,
                      void *col_amax, float *gw, const int dt, const int bwd, const int inter, const int clipped,
                      const int wt) {
    const swiglu_mx_args *a = job->a;
    const int64_t half = a->cols / 2, es = dt == SWIGLU_FP32 ? 4 : 2;
    const int a_index = a->glu.a_index;
    const glu_consts c = glu_setup(&a->glu, &job->act, &job->act);
    const glu_consts cf = glu_setup(&a->glu, &job->act_fwd, &job->act_pair);
    const int64_t nbt = job->chunk / GW_PAIRS; /* grad_weight blocks per task row */
    const int64_t span = bwd ? w : (w + MX_BLOCK - 1) / MX_BLOCK * MX_BLOCK; /* pairs to store */
    const int64_t step = dt == SWIGLU_FP32 || (bwd && inter) ? 16 : 32; /* pairs per mx_stage1_step */
    /* chunked: A's and B's first pair in the row, and their tile segments (x's left half first) */
    const int64_t xa = inter ? 2 * p0 : p0 + a_index * half, xb = p0 + (1 - a_index) * half;
    const int64_t ta = a_index * job->chunk, tb = (1 - a_index) * job->chunk;
    for (int64_t i = 0; i < blk->nrows; i++) {
        const int64_t row = blk->b * a->m + blk->row0 + i;
        const vf wv = v_set(wt ? a->weight[row] : 1.0f);
        float *g = gw + i * nbt * 16;
        vf acc = v_zero();
        const char *x = (const char *)a->x + row * a->cols * es;
        const char *dy = bwd ? (const char *)a->dy + (row * half + p0) * es : NULL;
        char *t = (char *)tile + i * ts * es;
        /* The next row's lines, requested step by step (glu.h's glu_prefetch explains why). */
        const char *xn = i + 1 < blk->nrows ? x + a->cols * es : NULL, *dyn = bwd ? dy + half * es : NULL;
        int64_t q = 0;
        for (; q + step <= w; q += step) {
            if (xn != NULL) mx_prefetch(xn + xa * es, xn + xb * es, dyn, q, step, es, inter);
            mx_stage1_step(&c, &cf, x + xa * es, x + xb * es, dy, t, col_amax, q, 32, ta, tb, a_index, dt, bwd, inter,
                           clipped, wt, wv, &acc);
            if (bwd && wt && ((q + step) % GW_PAIRS == 0 || q + step >= w)) { /* a block's end */
                v_storef(g + q / GW_PAIRS * 16, acc, m_all());
                acc = v_zero();
            }
        }
        for (; q < span; q += step) {
            mx_stage1_step(&c, &cf, x + xa * es, x + xb * es, dy, t, col_amax, q, w - q, ta, tb, a_index, dt, bwd,
                           inter, clipped, wt, wv, &acc);
            if (bwd && wt && ((q + step) % GW_PAIRS == 0 || q + step >= w)) {
                v_storef(g + q / GW_PAIRS * 16, acc, m_all());
                acc = v_zero();
            }
        }
    }
}

/* ------------------------------------------------------------------------------------- quantisation */

/* fp32 bits of widened 16-bit magnitudes (their integer max is the magnitude max of the values). */
INLINE vu amax_f32(vu amax, const int dt) { return dt == SWIGLU_FP32 ? amax : v_bits(widen(amax, dt)); }

/* The codes of 16 values times their block multipliers, stored at output column ``col`` of row ``y`` (FP8:
   one byte each; FP4: two per byte). */
INLINE void store_codes(uint8_t *y, int64_t col, vf v, vf m, const mx_format *f, vm mask, const int fp4) {
    if (fp4) u_store_nibbles(y + col / 2, fp4_encode(f, v, m), mask);
    else u_store8(y + col, fp8_encode(f, v_mul(v, m)), mask);
}

/* 32 values from ``v + j`` (``m``: those that exist): both code rows (FP8: a byte each; FP4: two per byte),
   y1 with their row block's ``off1``, y2 with their columns' ``off2``; ``special`` (a constant): some block
   is NaN/inf, its lanes' ``keep1``/``keep2`` 0 (codes 0x00). FP8 codes take fp8x32_code2's branch on
   subnormal results (``rare``), FP4 codes its forms without it. Returns ``acc`` updated by fp8x32_track. */
INLINE vw codes_x32(uint8_t *y1, uint8_t *y2, const uint16_t *v, int64_t j, vw off1, vw keep1, const uint16_t *off2,
                    const uint16_t *keep2, vw acc, const fp8x32_format *c, vwm m, const int fp4, const int special) {
    const fp8x32_values p = fp8x32_prepare(c, w_load(v + j, m));
    vw c1, c2;
    fp8x32_code2(c, &p, off1, w_load(off2 + j, m), &c1, &c2, fp4, !fp4);
    if (special) {
        c1 = w_and(c1, keep1);
        c2 = w_and(c2, w_load(keep2 + j, m));
    }
    if (fp4) {
        w_store_nibbles(y1 + j / 2, c1, m);
        w_store_nibbles(y2 + j / 2, c2, m);
    } else {
        w_store8(y1 + j, c1, m);
        w_store8(y2 + j, c2, m);
    }
    return fp8x32_track(&p, acc);
}

/* The codes_x32 steps over ``n`` <= 512 values, full vectors first (plain loads and stores). */
INLINE vw codes_run(uint8_t *y1, uint8_t *y2, const uint16_t *v, const uint16_t *off1, const uint16_t *keep1,
                    const uint16_t *off2, const uint16_t *keep2, int64_t n, const fp8x32_format *c, const int fp4,
                    const int special) {
    vw acc = w_set(0xFFFF);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32)
        acc = codes_x32(y1, y2, v, j, w_set(off1[j / 32]), w_set(keep1[j / 32]), off2, keep2, acc, c, w_lanes(32),
                        fp4, special);
    if (j < n)
        acc = codes_x32(y1, y2, v, j, w_set(off1[j / 32]), w_set(keep1[j / 32]), off2, keep2, acc, c, w_lanes(n - j),
                        fp4, special);
    return acc;
}

/* Both code rows of ``n`` <= 512 stored 16-bit values of a tile row (FP8, or FP4 rounded by rint), 32 at a
   time by fp8x32_code2, the rounding shared: y1 with the row's block scales (``off1``/``keep1``: entry k for
   the values 32k..32k+31, ``r1`` their multipliers), y2 with the column scales (``off2``/``keep2``/``r2``:
   one per value); ``y1``/``y2`` point at the run's first code (FP4: its byte); ``special``: some of these
   blocks or columns is NaN/inf. If the run holds a subnormal source (fp8x32_code2 does not encode those),
   both rows of each 32 values that hold one are encoded again by the per-element encoders (fp16 gradients
   hold them often: half the runs at M=8192, 2H=4096, 1 in 20 of the 32-value steps). */
INLINE void store_codes_x32(uint8_t *y1, uint8_t *y2, const uint16_t *v, const uint16_t *off1, const uint16_t *keep1,
                            vf r1, const uint16_t *off2, const uint16_t *keep2, const float *r2, int64_t n,
                            const fp8x32_format *c, const mx_format *f, const int dt, const int fp4, int special) {
    const vw acc = special ? codes_run(y1, y2, v, off1, keep1, off2, keep2, n, c, fp4, 1)
                           : codes_run(y1, y2, v, off1, keep1, off2, keep2, n, c, fp4, 0);
    if (__builtin_expect(!fp8x32_subnormal_sources(c, acc), 1)) return;
    float r[16];
    v_storef(r, r1, m_all());
    for (int64_t j = 0; j < n; j += 32) {
        if (!fp8x32_subnormal_sources(c, fp8x32_track_bits(w_load(v + j, w_lanes(n - j)), w_set(0xFFFF))))
            continue;
        for (int64_t k = j; k < j + 32 && k < n; k += 16) {
            const vm m = m_lanes(n - k);
            const vf x = ld(v, k, dt, m);
            store_codes(y1, k, x, v_set(r[j / 32]), f, m, fp4);
            store_codes(y2, k, x, v_loadf(r2 + k, m_all()), f, m, fp4);
        }
    }
}

/* Both quantisations of one segment of a task's tile: ``width`` columns from tile column ``tc`` that are
   output columns from ``col0`` (a multiple of 32) of the task's rows. FP8 codes of 16-bit values take
   fp8x32_encode (32 at a time, the rounding shared by both axes); FP4 codes and fp32 values the
   per-element encoders. */
INLINE void mx_quantise(const mx_job *job, const mx_block *blk, const mx_work *wk, int64_t ts, int64_t tc,
                        int64_t col0, int64_t width, const int dt, const int fp4) {
    const swiglu_mx_args *a = job->a;
    const mx_format f = job->fmt; /* a local copy: the byte stores below could alias the job */
    const int x32 = dt != SWIGLU_FP32 && (!fp4 || f.round_mode == SWIGLU_ROUND_RINT);
    const fp8x32_format c = fp8x32_of(&f, dt == SWIGLU_FP32 ? SWIGLU_BF16 : dt);
    const int64_t es = dt == SWIGLU_FP32 ? 4 : 2, W = job->width;
    const int64_t s1_stride = 2 * ((W + 63) / 64), y_stride = fp4 ? W / 2 : W;
    const int64_t nblk = (width + MX_BLOCK - 1) / MX_BLOCK;
    /* -2 axis: one block per column over the task's rows (zero padding never raises the amax): the scale
       codes and factors of all columns first */
    const void *tile = wk->tile, *col_amax = wk->col_amax;
    float *col_recip = wk->col_recip;
    uint16_t *col_off = wk->col_off, *col_keep = wk->col_keep;
    uint8_t *s2 = a->s2 + ((blk->b * a->s2_rows + blk->s2_row) * W + col0) * 2 + blk->slot;
    vm col_special = m_lanes(0); /* lanes of NaN/inf columns */
    for (int64_t j = 0; j < width; j += 16) {
        const vm m = m_lanes(width - j);
        vf recip;
        const vu codes = scale_codes(&f, amax_f32(ld_bits(col_amax, tc + j, dt, m), dt), &recip);
        v_storef(col_recip + j, recip, m_all());
        if (x32) {
            vu keeps;
            u_store16(col_off + j, fp8x32_block(&c, codes, &keeps), m_all());
            u_store16(col_keep + j, keeps, m_all());
            col_special = m_or(col_special, m_and(m, u_eq(codes, u_set(0xFF))));
        }
        u_store8_even(s2 + 2 * j, codes, m); /* every other byte: mxscale2's two 32-row slots */
    }
    /* -1 axis: per row and per 16 blocks of 32 columns, the amax, scale codes and factors; then the element
       codes of those columns on both axes. y1 and y2 point at the segment's first column (FP4: its byte);
       a token-contiguous y2 ([B, W, M], FP8) is written through ``y2t`` ([row][column]), then transposed.
       Each row's codes start a new 4 KiB page of y1 and of y2, where the hardware prefetchers do not
       follow, and every first store to a line waited for the line's read-for-ownership: the same columns
       of the next row are requested for writing (prefetchw) before these are encoded. Measured on the
       Intel host (AVX512-BF16, 2 threads, M=8192 2H=4096 bf16, three alternating runs of the bench's
       headline case): backward 12.2 -> 10.9 ms (60 -> 67 % of the copy), forward 5.3 -> 5.1; AVX2
       backward 21.1 -> 18.5 ms, forward 8.7 -> 7.7. Two rows ahead, or also the task's first row before
       the scales: no better. (On the Zen 4 machine, with whole-row tasks, the requests cost more issue
       slots than they saved; non-temporal stores instead gained nothing on either.) */
    uint8_t *y2t = wk->y2t;
    const int64_t seg = fp4 ? col0 / 2 : col0;
    for (int64_t i = 0; i < blk->nrows; i++) {
        const int64_t row = blk->b * a->m + blk->row0 + i;
        const char *v = (const char *)tile + (i * ts + tc) * es;
        uint8_t *y1 = a->y1 + row * y_stride + seg;
        uint8_t *y2 = a->transpose_y2 ? y2t + i * width : a->y2 + row * y_stride + seg;
        uint8_t *s1 = a->s1 + row * s1_stride + col0 / MX_BLOCK;
        for (int64_t k0 = 0; k0 < nblk; k0 += 16) {
            const int64_t nb = nblk - k0 < 16 ? nblk - k0 : 16, col = 32 * k0;
            const int64_t n = width - col < 32 * nb ? width - col : 32 * nb;
            /* (16 blocks, the usual case, as a constant: the tree then stays in registers) */
            const vu amax = dt == SWIGLU_FP32 ? (nb == 16 ? u_block_amax32((const uint32_t *)v + col, 16)
                                                          : u_block_amax32((const uint32_t *)v + col, nb))
                                              : (nb == 16 ? u_block_amax16((const uint16_t *)v + col, 16)
                                                          : u_block_amax16((const uint16_t *)v + col, nb));
            vf recip;
            const vu codes = scale_codes(&f, amax_f32(amax, dt), &recip);
            u_store8(s1 + k0, codes, m_lanes(nb));
            const int64_t at = fp4 ? col / 2 : col, bytes = fp4 ? n / 2 : n; /* these codes' first byte, bytes */
            if (i + 1 < blk->nrows && !a->transpose_y2) /* the next row's lines of these codes, for writing */
                for (int64_t o = 0; o < bytes; o += 64) {
                    __builtin_prefetch(y1 + y_stride + at + o, 1, 3);
                    __builtin_prefetch(y2 + y_stride + at + o, 1, 3);
                }
            if (x32) {
                _Alignas(64) uint16_t off1[16], keep1[16];
                vu keeps;
                u_store16(off1, fp8x32_block(&c, codes, &keeps), m_all());
                u_store16(keep1, keeps, m_all());
                const int special = m_any(m_or(col_special, m_and(m_lanes(nb), u_eq(codes, u_set(0xFF)))));
                store_codes_x32(y1 + at, y2 + at, (const uint16_t *)v + col, off1, keep1, recip, col_off + col,
                                col_keep + col, col_recip + col, n, &c, &f, dt, fp4, special);
                continue;
            }
            float r[16];
            v_storef(r, recip, m_all());
            for (int64_t j = 0; j < n; j += 16) {
                const vm m = m_lanes(n - j);
                const vf x = ld(v, col + j, dt, m);
                store_codes(y1, col + j, x, v_set(r[j / 32]), &f, m, fp4);
                store_codes(y2, col + j, x, v_loadf(col_recip + col + j, m_all()), &f, m, fp4);
            }
        }
        /* the pad slot of an odd number of blocks (forward, N % 64 in (0, 32]) is written as code 0 */
        if (col0 + width == W && (W + MX_BLOCK - 1) / MX_BLOCK % 2 == 1) s1[nblk] = 0;
    }
    if (a->transpose_y2) /* column j of the segment: the task's rows, contiguous in y2[b, col0 + j, :] */
        for (int64_t j = 0; j < width; j++) {
            uint8_t *out = a->y2 + (blk->b * W + col0 + j) * a->m + blk->row0;
            for (int64_t i = 0; i < blk->nrows; i++) out[i] = y2t[i * width + j];
        }
}

/* ------------------------------------------------------------------------------------------- tasks */

/* One function per specialisation of each phase (see glu.h): stage 1 per (dtype, direction, layout,
   variant), the quantisation per (dtype, FP8 or FP4). */
typedef void (*mx_stage1_fn)(const mx_job *, const mx_block *, int64_t, int64_t, void *, int64_t, void *, float *);
typedef void (*mx_quantise_fn)(const mx_job *, const mx_block *, const mx_work *, int64_t, int64_t, int64_t,
                               int64_t);
#define MX_STAGE1_SPEC(DTN, BWD, INTER, CLIPPED, WT)                                                            \
    PHASE void FN(mx_stage1_##DTN##_##BWD##INTER##CLIPPED##WT)(const mx_job *job, const mx_block *blk, int64_t p0, \
                                                           int64_t w, void *tile, int64_t ts, void *col_amax,      \
                                                           float *gw) {                                            \
        mx_stage1(job, blk, p0, w, tile, ts, col_amax, gw, SWIGLU_##DTN, BWD, INTER, CLIPPED, WT);                \
    }
#define MX_STAGE1_SPECS_W(DTN, WT)                                                                      \
    MX_STAGE1_SPEC(DTN, 0, 0, 0, WT) MX_STAGE1_SPEC(DTN, 0, 0, 1, WT) MX_STAGE1_SPEC(DTN, 0, 1, 0, WT)  \
    MX_STAGE1_SPEC(DTN, 0, 1, 1, WT) MX_STAGE1_SPEC(DTN, 1, 0, 0, WT) MX_STAGE1_SPEC(DTN, 1, 0, 1, WT)  \
    MX_STAGE1_SPEC(DTN, 1, 1, 0, WT) MX_STAGE1_SPEC(DTN, 1, 1, 1, WT)
#define MX_STAGE1_SPECS(DTN) MX_STAGE1_SPECS_W(DTN, 0) MX_STAGE1_SPECS_W(DTN, 1)
#define MX_QUANTISE_SPEC(DTN, FP4)                                                                           \
    PHASE void FN(mx_quantise_##DTN##_##FP4)(const mx_job *job, const mx_block *blk, const mx_work *wk, int64_t ts, \
                                         int64_t tc, int64_t col0, int64_t width) {                         \
        mx_quantise(job, blk, wk, ts, tc, col0, width, SWIGLU_##DTN, FP4);                                 \
    }
MX_STAGE1_SPECS(BF16)
MX_STAGE1_SPECS(FP16)
MX_STAGE1_SPECS(FP32)
MX_QUANTISE_SPEC(BF16, 0)
MX_QUANTISE_SPEC(BF16, 1)
MX_QUANTISE_SPEC(FP16, 0)
MX_QUANTISE_SPEC(FP16, 1)
MX_QUANTISE_SPEC(FP32, 0)
MX_QUANTISE_SPEC(FP32, 1)

#define MX_STAGE1_PAIR(DTN, BIC) {FN(mx_stage1_##DTN##_##BIC##0), FN(mx_stage1_##DTN##_##BIC##1)}
#define MX_STAGE1_ROW(DTN)                                                                                     \
    {{{MX_STAGE1_PAIR(DTN, 000), MX_STAGE1_PAIR(DTN, 001)}, {MX_STAGE1_PAIR(DTN, 010), MX_STAGE1_PAIR(DTN, 011)}}, \
     {{MX_STAGE1_PAIR(DTN, 100), MX_STAGE1_PAIR(DTN, 101)}, {MX_STAGE1_PAIR(DTN, 110), MX_STAGE1_PAIR(DTN, 111)}}}
/* [dtype][backward][interleaved][clipped][weighted] and [dtype][fp4] */
static const mx_stage1_fn mx_stage1_fns[3][2][2][2][2] = {MX_STAGE1_ROW(BF16), MX_STAGE1_ROW(FP16),
                                                           MX_STAGE1_ROW(FP32)};
static const mx_quantise_fn mx_quantise_fns[3][2] = {
    {FN(mx_quantise_BF16_0), FN(mx_quantise_BF16_1)},
    {FN(mx_quantise_FP16_0), FN(mx_quantise_FP16_1)},
    {FN(mx_quantise_FP32_0), FN(mx_quantise_FP32_1)}};
#undef MX_STAGE1_SPEC
#undef MX_STAGE1_SPECS
#undef MX_STAGE1_SPECS_W
#undef MX_STAGE1_PAIR
#undef MX_QUANTISE_SPEC
#undef MX_STAGE1_ROW

static void FN(mx_task)(const void *ctx, int64_t t) {
    const mx_job *job = ctx;
    const swiglu_mx_args *a = job->a;
    const mx_block *blk = &job->blocks[t / job->n_chunks];
    const int64_t chunk = job->chunk, half = a->cols / 2, p0 = (t % job->n_chunks) * chunk;
    const int64_t w = half - p0 < chunk ? half - p0 : chunk;
    const int64_t ts = (a->backward ? 2 : 1) * chunk; /* tile row stride in elements */
    mx_work wk;
    if (!mx_work_get(ts, &wk)) {
        atomic_store(job->failed, 1);
        return;
    }
    memset(wk.col_amax, 0, (size_t)(ts * (a->dtype == SWIGLU_FP32 ? 4 : 2)));
    const int inter = a->glu.interleaved != 0, wt = a->weight != NULL;
    mx_stage1_fns[a->dtype][a->backward != 0][inter][a->glu.clipped != 0][wt](job, blk, p0, w, wk.tile, ts,
                                                                              wk.col_amax, wk.gw);
    if (wt && a->backward) { /* grad_weight: the rows' sums now (whole rows), else their block sums for later */
        const int64_t nbt = chunk / GW_PAIRS, nb = (w + GW_PAIRS - 1) / GW_PAIRS;
        for (int64_t i = 0; i < blk->nrows; i++) {
            const int64_t row = blk->b * a->m + blk->row0 + i;
            float *g = wk.gw + i * nbt * 16;
            if (job->gw_parts == NULL) a->grad_weight[row] = grad_weight_value(FN(gw_row_sum)(g, nb));
            else memcpy(job->gw_parts + (row * job->gw_blocks + p0 / GW_PAIRS) * 16, g, sizeof(float) * 16 * nb);
        }
    }
    if (blk->gw_only) return;
    const mx_quantise_fn quantise = mx_quantise_fns[a->dtype][job->fmt.fp4];
    if (!a->backward) quantise(job, blk, &wk, ts, 0, p0, w);
    else if (inter) quantise(job, blk, &wk, ts, 0, 2 * p0, 2 * w);
    else {
        quantise(job, blk, &wk, ts, 0, p0, w);             /* the left half */
        quantise(job, blk, &wk, ts, chunk, half + p0, w); /* the right half */
    }
}

/* The element format's constants (mx.py's FP8Format / FP4 rules). */
static int FN(mx_format_of)(const swiglu_mx_args *a, mx_format *f) {
    static const struct { int mbits, bias, max_code, emax; uint32_t inv_max_bits; } fp8[2] = {
        {3, 7, 0x7E, 8, 0x3B124925u},  /* E4M3FN: max 448 */
        {2, 15, 0x7B, 15, 0x37924925u}, /* E5M2: max 57344 */
    };
    memset(f, 0, sizeof *f);
    f->scale_alg = a->scale_alg;
    f->round_mode = a->round_mode;
    if (a->format == SWIGLU_FMT_E4M3 || a->format == SWIGLU_FMT_E5M2) {
        const int i = a->format == SWIGLU_FMT_E5M2;
        const uint32_t shift = (uint32_t)(23 - fp8[i].mbits);
        memcpy(&f->inv_max, &fp8[i].inv_max_bits, 4);
        f->emax = (uint32_t)fp8[i].emax;
        f->shift = shift;
        f->round_half = (1u << (shift - 1)) - 1u;
        f->rebias = (uint32_t)(127 - fp8[i].bias) << fp8[i].mbits;
        f->min_normal = (uint32_t)(128 - fp8[i].bias) << 23;
        f->sub_magic = (uint32_t)(1 - fp8[i].bias - fp8[i].mbits + 23 + 127) << 23; /* 2**(emin - mbits + 23) */
        f->max_code = (uint32_t)fp8[i].max_code;
        return a->round_mode == SWIGLU_ROUND_RINT ? 0 : -1;
    }
    if (a->format != SWIGLU_FMT_E2M1 && a->format != SWIGLU_FMT_E1M2) return -1;
    f->fp4 = 1;
    f->e1m2 = a->format == SWIGLU_FMT_E1M2;
    f->emax = f->e1m2 ? 0 : 2;
    /* for fp8x32_of (round mode rint): mantissa bits 1 (E2M1) or 2 (E1M2), bias 1, largest code 7 */
    f->shift = f->e1m2 ? 21 : 22;
    f->rebias = 126u << (23 - f->shift);
    f->max_code = 7;
    return a->scale_alg == 0 ? 0 : -1; /* FP4: the OCP rule only */
}

static int FN(mx_run_impl)(const swiglu_mx_args *a, int n_threads) {
    mx_job job = {.a = a, .width = a->backward ? a->cols : a->cols / 2};
    if (FN(mx_format_of)(a, &job.fmt) != 0 || (a->transpose_y2 && job.fmt.fp4)) return -1;
    act_fn act2;
    glu_acts(&a->glu, a->backward, &job.act, &act2);
    if (a->glu.clipped && a->glu.clamp_mode != 0) return -1; /* the MX operators take clamp_mode 0 */
    const int gw = a->backward && a->weight != NULL;
    if (gw && a->grad_weight == NULL) return -1;
    if (a->n_groups > 0 && a->batch != 1) return -1; /* groups are rows of one matrix (the zero fill below) */
    glu_acts(&a->glu, 0, &job.act_fwd, &act2); /* the forward's activation: act16 of grad_weight */
    const int pairs = gw && a->dtype != SWIGLU_FP32; /* both from one table */
    job.act_pair = (act_fn){NULL, a->glu.clipped ? SWIGLU_ACT_GLU_SIG_GLU : SWIGLU_ACT_SIGMOID_GLU,
                            a->glu.clipped ? a->glu.alpha : 1.0f, a->glu.clipped ? a->glu.limit : INFINITY};
    float *owned = NULL, *owned_fwd = NULL; /* the weighted 16-bit backward reads the pair table only */
    if (!pairs && !act_with_table(&job.act, a->dtype, &owned)) return -2;
    if (gw && !act_with_table(pairs ? &job.act_pair : &job.act_fwd, a->dtype, &owned_fwd)) {
        free(owned);
        return -2;
    }
    /* The 32-row blocks: restarting at every group start; each end clamped into [previous end, M]; with
       grad_weight also blocks of the rows past the last end (gw_only). */
    const int64_t per_slice = (a->m + MX_BLOCK - 1) / MX_BLOCK + (a->n_groups > 0 ? a->n_groups : 0);
    mx_block *blocks = malloc(sizeof(mx_block) * (size_t)(a->batch * per_slice + per_slice + 1));
    if (blocks == NULL) {
        free(owned);
        free(owned_fwd);
        return -2;
    }
    int64_t n = 0, covered = a->m;
    for (int64_t b = 0; b < a->batch; b++) {
        const int64_t groups = a->n_groups > 0 ? a->n_groups : 1;
        int64_t start = 0;
        for (int64_t g = 0; g < groups; g++) {
            int64_t end = a->n_groups > 0 ? a->group_ends[g] : a->m;
            end = end < start ? start : end > a->m ? a->m : end;
            const int64_t base = a->n_groups > 0 ? start / 64 + g : 0;
            for (int64_t t = 0; start + MX_BLOCK * t < end; t++) {
                const int64_t row0 = start + MX_BLOCK * t;
                blocks[n++] = (mx_block){b, row0, end - row0 < MX_BLOCK ? end - row0 : MX_BLOCK, base + t / 2, t % 2};
            }
            start = end;
        }
        covered = start;
        for (int64_t row0 = covered; gw && row0 < a->m; row0 += MX_BLOCK) /* (groups: batch 1) */
            blocks[n++] = (mx_block){b, row0, a->m - row0 < MX_BLOCK ? a->m - row0 : MX_BLOCK, 0, 0, 1};
    }
    job.blocks = blocks;
    /* mxscale2 whole: the tasks write the slots their blocks map to, the others stay 0 */
    memset(a->s2, 0, (size_t)(a->batch * a->s2_rows * job.width * 2));
    job.chunk = mx_task_pairs(a, n, n_threads);
    job.n_chunks = (a->cols / 2 + job.chunk - 1) / job.chunk;
    job.gw_blocks = (a->cols / 2 + GW_PAIRS - 1) / GW_PAIRS;
    if (gw && job.n_chunks > 1 && (job.gw_parts = malloc(sizeof(float) * 16 * (size_t)(a->batch * a->m * job.gw_blocks))) == NULL) {
        free(blocks);
        free(owned);
        free(owned_fwd);
        return -2;
    }
    atomic_int failed;
    atomic_init(&failed, 0);
    job.failed = &failed;
    swiglu_pool_run(FN(mx_task), &job, n * job.n_chunks, n_threads);
    free(blocks);
    free(owned);
    free(owned_fwd);
    if (job.gw_parts != NULL) { /* rows cut into several tasks: their block sums, in the same tree */
        if (!atomic_load(&failed))
            for (int64_t r = 0; r < a->batch * a->m; r++)
                a->grad_weight[r] =
                    grad_weight_value(FN(gw_row_sum)(job.gw_parts + r * job.gw_blocks * 16, job.gw_blocks));
        free(job.gw_parts);
    }
    if (atomic_load(&failed)) return -2;
    /* rows past the last (clamped) group end belong to no group: all their outputs are 0 */
    if (covered < a->m) {
        const int64_t W = job.width, rows = a->m - covered;
        const int64_t yb = job.fmt.fp4 ? W / 2 : W, sb = 2 * ((W + 63) / 64);
        memset(a->y1 + covered * yb, 0, (size_t)(rows * yb));
        memset(a->s1 + covered * sb, 0, (size_t)(rows * sb));
        if (!a->transpose_y2) memset(a->y2 + covered * yb, 0, (size_t)(rows * yb));
        else
            for (int64_t j = 0; j < W; j++) memset(a->y2 + j * a->m + covered, 0, (size_t)rows);
    }
    return 0;
}
