/* The body of every kernels_<isa>.c: the kernels on the SIMD layer its includer chose, with their entry
   points suffixed by FN. */
#include "simd_shared.h"
#include "numerics.h"

void FN(act_build)(int kind, int dt, float alpha, float limit, float *out);

#include "glu.h"
#include "mx.h"

/* The activation of every bit pattern of a 16-bit dtype (the tables the kernels read for 16-bit inputs). */
void FN(act_build)(int kind, int dt, float alpha, float limit, float *out) {
    for (uint32_t i = 0; i < 65536; i += 16) {
        const vu bits = u_add(u_set(i), u_iota());
        const vf a = dt == SWIGLU_BF16 ? widen(bits, SWIGLU_BF16) : widen(bits, SWIGLU_FP16);
        if (kind == SWIGLU_ACT_SILU_DERIV) { /* (f, silu') of min(a, limit), interleaved, NaNs canonical */
            vf f, sp;
            silu_deriv(v_minc(a, v_set(limit)), act_eval(a, SWIGLU_ACT_SIGMOID, alpha, limit), &f, &sp);
            u_store32_pairs((uint32_t *)out + 2 * i, narrow(f, SWIGLU_FP32), narrow(sp, SWIGLU_FP32), m_all());
        } else if (ACT_WIDTH(kind) == 2) { /* (backward's, forward's), the bits of their own tables */
            const vf bwd = act_eval(a, kind == SWIGLU_ACT_SIGMOID_GLU ? SWIGLU_ACT_SIGMOID : SWIGLU_ACT_GLU_SIG, alpha, limit);
            const vf fwd = act_eval(a, SWIGLU_ACT_GLU, alpha, limit);
            u_store32_pairs((uint32_t *)out + 2 * i, v_bits(bwd), v_bits(fwd), m_all());
        } else {
            v_storef(out + i, act_eval(a, kind, alpha, limit), m_all());
        }
    }
}

/* swiglu_fp8_x32_check (swiglu_cpu.h) for this instruction set: fp8x32_code2 against fp8_encode (FP8) or
   fp4_encode with round mode rint (FP4), for every 16-bit pattern under every scale code, on both axes (the
   second under the scale code 255 - s, so that every pair of normal and subnormal results meets); with and
   without fp8x32_code2's ``rare`` branch, alternately from one (32 patterns, scale code) case to the next. */
void FN(fp8_x32_check)(int dt, int format, int64_t *mismatches, int64_t *left) {
    const int fp4 = format == SWIGLU_FMT_E2M1 || format == SWIGLU_FMT_E1M2; /* FP4: rint, the OCP rule */
    const swiglu_mx_args args = {.format = format, .round_mode = SWIGLU_ROUND_RINT, .scale_alg = fp4 ? 0 : 1};
    mx_format f;
    FN(mx_format_of)(&args, &f);
    const fp8x32_format c = fp8x32_of(&f, dt);
    const uint16_t inf_bits = dt == SWIGLU_BF16 ? 0x7F80 : 0x7C00;
    *mismatches = *left = 0;
    for (uint32_t scale = 0; scale < 256; scale++) {
        const uint32_t scales[2] = {scale, 255 - scale};
        vw off[2], kv[2];
        vf recip[2];
        for (int k = 0; k < 2; k++) {
            vu keep;
            off[k] = w_bcast(fp8x32_block(&c, u_set(scales[k]), &keep), 0);
            kv[k] = w_bcast(keep, 0);
            recip[k] = scale_recip(u_set(scales[k]), m_lanes(0), m_lanes(scales[k] == 0xFF ? 16 : 0));
        }
        for (uint32_t base = 0; base < 65536; base += 32) {
            _Alignas(64) uint16_t bits[32];
            _Alignas(64) uint8_t fast[2][32], slow[2][32];
            for (int i = 0; i < 32; i++) bits[i] = (uint16_t)(base + i);
            const fp8x32_values p = fp8x32_prepare(&c, w_load(bits, w_lanes(32)));
            vw c1, c2;
            const int rare = (int)((base / 32 + scale) & 1);
            if (fp4) fp8x32_code2(&c, &p, off[0], off[1], &c1, &c2, 1, rare);
            else fp8x32_code2(&c, &p, off[0], off[1], &c1, &c2, 0, rare);
            w_store8(fast[0], w_and(c1, kv[0]), w_lanes(32));
            w_store8(fast[1], w_and(c2, kv[1]), w_lanes(32));
            for (int k = 0; k < 2; k++)
                for (int h = 0; h < 32; h += 16) {
                    const vf v = widen(u_load16(bits + h, m_all()), dt);
                    u_store8(slow[k] + h, fp4 ? fp4_encode(&f, v, recip[k]) : fp8_encode(&f, v_mul(v, recip[k])),
                             m_all());
                }
            /* left to the per-element encoders: the subnormal sources (fp8x32_track), but for a NaN/inf block (all 0x00) */
            const vw sub = fp8x32_track(&p, w_set(0xFFFF));
            for (int k = 0; k < 2; k++) {
                _Alignas(64) uint16_t okv[32];
                w_store(okv, w_sel(w_lt_u(sub, w_set(c.sub_max)), w_set(scales[k] == 0xFF), w_set(1)), w_lanes(32));
                for (int i = 0; i < 32; i++) {
                    if ((bits[i] & 0x7FFF) >= inf_bits) continue; /* inf / NaN: only in NaN/inf blocks */
                    if (!okv[i]) (*left)++;
                    else if (fast[k][i] != slow[k][i]) (*mismatches)++;
                }
            }
        }
    }
}

int FN(glu_run)(const swiglu_glu_args *a, int n_threads) { return FN(glu_run_impl)(a, n_threads); }
int FN(mx_run)(const swiglu_mx_args *a, int n_threads) { return FN(mx_run_impl)(a, n_threads); }
