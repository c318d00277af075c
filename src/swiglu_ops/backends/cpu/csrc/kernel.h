/* What the kernel sources share with the library's dispatch (dispatch.c), and the macros they use.

   The kernels (numerics.h, glu.h, mx.h and the SIMD layers) are compiled once per instruction set by the
   kernels_<isa>.c translation units, each of which defines FN(name) to suffix its functions with the
   instruction set's name and includes the kernels once. */
#ifndef SWIGLU_KERNEL_H
#define SWIGLU_KERNEL_H

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "swiglu_cpu.h"

#define INLINE static inline __attribute__((always_inline))
/* A kernel phase (a task's stage 1, its quantisation, a GLU tile) is a function of its own, specialised by
   its constant arguments (the compiler clones it per constant combination): small enough for the optimiser.
   The larger numeric helpers (HEAVY) are inlined into the AVX-512 and AVX2 kernels and called in the
   portable build, where GCC lowers each 16-lane operation to several native ones (inlining them there made
   that build minutes long and megabytes large). A phase is named through FN, so each instruction set's copy
   has a symbol of its own (the instruction budget, benchmarks/x86_budget.py, reads them from the library). */
#define PHASE static __attribute__((noinline))
#ifdef SWIGLU_CALL_HEAVY
#define HEAVY static __attribute__((noinline))
#else
#define HEAVY INLINE
#endif

/* The thread pool (dispatch.c): runs fn(ctx, t) for t in [0, n_tasks) on up to n_threads threads, the
   caller included, and returns when all are done. Tasks must be independent. */
typedef void (*task_fn)(const void *ctx, int64_t t);
void swiglu_pool_run(task_fn fn, const void *ctx, int64_t n_tasks, int n_threads);

/* A buffer of at least ``bytes`` (4 KiB-aligned) that belongs to the calling thread and is kept for its next
   call (the same memory when it is large enough); NULL if it cannot be allocated (dispatch.c). */
void *swiglu_thread_buffer(size_t bytes);
/* The per-core L2 data cache in bytes, 0 if the C library does not say (dispatch.c). */
size_t swiglu_l2_cache_bytes(void);

/* The activation tables (dispatch.c): the table of (kind, dtype, alpha, limit), built by ``build`` on first
   use and kept; NULL if it could not be allocated. */
typedef void (*act_builder)(int kind, int dt, float alpha, float limit, float *out);
/* Floats per input bit pattern in the table of ``kind``: two for SWIGLU_ACT_SILU_DERIV and the pair kinds
   (SWIGLU_ACT_SIGMOID_GLU, SWIGLU_ACT_GLU_SIG_GLU), else one. */
#define ACT_WIDTH(kind) ((kind) >= SWIGLU_ACT_SILU_DERIV ? 2 : 1)
const float *swiglu_act_table_get(int kind, int dt, float alpha, float limit, act_builder build);

/* Each instruction set's build of the kernels (kernels_<isa>.c). */
#define SWIGLU_DECLARE_ISA(isa)                                                   \
    int swiglu_glu_run_##isa(const swiglu_glu_args *a, int n_threads);            \
    int swiglu_mx_run_##isa(const swiglu_mx_args *a, int n_threads);             \
    void swiglu_act_build_##isa(int kind, int dt, float alpha, float limit, float *out);  \
    void swiglu_fp8_x32_check_##isa(int dt, int format, int64_t *mismatches, int64_t *left);
SWIGLU_DECLARE_ISA(portable)
SWIGLU_DECLARE_ISA(avx2)
SWIGLU_DECLARE_ISA(avx512)
SWIGLU_DECLARE_ISA(avx512_bf16)

#endif
