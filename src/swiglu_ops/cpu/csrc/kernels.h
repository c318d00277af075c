/* The body of every kernels_<isa>.c: the kernels on the SIMD layer its includer chose, with their entry
   points suffixed by FN. */
#include "numerics.h"

void FN(act_build)(int kind, int dt, float alpha, float limit, float *out);

#include "glu.h"
#include "mx.h"

/* The activation of every bit pattern of a 16-bit dtype (the tables the kernels read for 16-bit inputs). */
void FN(act_build)(int kind, int dt, float alpha, float limit, float *out) {
    for (uint32_t i = 0; i < 65536; i += 16) {
        const vu bits = u_add(u_set(i), u_iota());
        const vf a = dt == SWIGLU_BF16 ? widen(bits, SWIGLU_BF16) : widen(bits, SWIGLU_FP16);
        v_storef(out + i, act_eval(a, kind, alpha, limit), m_all());
    }
}

int FN(glu_run)(const swiglu_glu_args *a, int n_threads) { return FN(glu_run_impl)(a, n_threads); }
int FN(mx_run)(const swiglu_mx_args *a, int n_threads) { return FN(mx_run_impl)(a, n_threads); }
