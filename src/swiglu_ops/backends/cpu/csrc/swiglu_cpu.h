/* swiglu_ops cpu backend: the C library's whole interface, declared once.

   This file is read by the C sources and, at import, by cffi (swiglu_ops/cpu/_loader.py), so it holds
   only what cffi's parser takes: integer #defines, typedefs and prototypes (no #include, no #if).
   Tensors are C-contiguous; element types are given by ``dtype``; every size and index is 64-bit. */

/* element types of the float tensors */
#define SWIGLU_BF16 0
#define SWIGLU_FP16 1
#define SWIGLU_FP32 2

/* instruction sets, one build of the kernels each (AVX512_BF16: AVX-512 with AVX512-BF16) */
#define SWIGLU_ISA_PORTABLE 0
#define SWIGLU_ISA_AVX2 1
#define SWIGLU_ISA_AVX512 2
#define SWIGLU_ISA_AVX512_BF16 3

/* the GLU operators (swiglu_glu_args.op) */
#define SWIGLU_OP_GROUP_GRAD 0
#define SWIGLU_OP_CLIPPED_FWD 1
#define SWIGLU_OP_CLIPPED_BWD 2

/* activation functions of A (numerics.h act_eval; tables of them for 16-bit inputs) */
#define SWIGLU_ACT_SIGMOID 0
#define SWIGLU_ACT_GLU 1
#define SWIGLU_ACT_GLU_SIG 2
#define SWIGLU_ACT_SILU_MIN 3
#define SWIGLU_ACT_SILU_DERIV 4 /* two floats per input: (silu, silu') of swiglu_group_grad */
/* two floats per input, (backward's, forward's) activation: the weighted MX backward's (stage 1, act16) */
#define SWIGLU_ACT_SIGMOID_GLU 5  /* (SIGMOID, GLU): the plain SwiGLU */
#define SWIGLU_ACT_GLU_SIG_GLU 6  /* (GLU_SIG, GLU): the clipped SwiGLU, clamp_mode 0 */

/* MX element formats and FP4 round modes */
#define SWIGLU_FMT_E4M3 0
#define SWIGLU_FMT_E5M2 1
#define SWIGLU_FMT_E2M1 2
#define SWIGLU_FMT_E1M2 3
#define SWIGLU_ROUND_RINT 0
#define SWIGLU_ROUND_ROUND 1
#define SWIGLU_ROUND_FLOOR 2

/* Bumped whenever a struct or prototype below changes: a library built from another version of this file
   is refused at load. */
#define SWIGLU_ABI_VERSION 8

/* Which member of the GLU family (swiglu_ops.numerics.glu.GluParams). The kernels build and cache its activation
   tables themselves (swiglu_act_table). */
typedef struct {
    int32_t interleaved; /* A and B are the even and odd elements of a row, else its two halves */
    int32_t a_index;     /* 0: A is the left half (even elements); 1: the right half (odd elements) */
    int32_t clipped;     /* the GPT-OSS clipped SwiGLU (alpha, limit, bias, clamp_mode); 0: plain SwiGLU */
    int32_t clamp_mode;  /* clipped: 0 clamps A before the activation, 1 clamps its output */
    float alpha, limit, bias;
    int32_t gather;      /* read the activation tables of 16-bit inputs with the hardware gather (1) or with
                            scalar loads (0): the same bits; the loader picks what is faster on this CPU */
} swiglu_glu;

/* swiglu_group_grad (SwigluGroupGrad), clipped_swiglu (ClippedSwiglu), clipped_swiglu_grad. */
typedef struct {
    int32_t op;    /* SWIGLU_OP_* */
    int32_t dtype; /* of x, dy, y_origin and the output */
    int64_t rows, cols;   /* x [rows, cols]: cols / 2 pairs (A, B) per row */
    int64_t valid_rows;   /* rows >= valid_rows: masked (group grad: times 0; clipped ops: +0.0) */
    const void *x;
    const void *dy;       /* backward: [rows, cols / 2] */
    void *out;            /* forward: y [rows, cols / 2]; backward: grad_x [rows, cols] */
    const float *weight;  /* group grad: [rows] routing weight, or NULL */
    const void *y_origin; /* group grad with weight: [rows, cols / 2] */
    float *grad_weight;   /* group grad with weight: [rows] */
    float clamp;          /* group grad: > 0 enables the open-interval clamp */
    int32_t reserved;
    swiglu_glu glu;
} swiglu_glu_args;

/* swiglu_backward_mx_quant_dual_axis and swiglu_mx_quant_dual_axis: stage 1 of the GLU family, rounded
   to dtype, quantised along both axes in 32-element blocks (token-axis blocks restart at every group). */
typedef struct {
    int32_t backward; /* 1: SwiGLU backward (y [.., cols]); 0: forward (y [.., cols / 2]) */
    int32_t dtype;
    int64_t batch, m, cols; /* x [batch, m, cols] */
    int64_t n_groups;       /* cumulative row ends group_ends[n_groups] (batch 1), or 0 */
    int64_t s2_rows;        /* rows of mxscale2 [batch, s2_rows, width, 2] */
    const void *x;
    const void *dy;         /* backward: [batch, m, cols / 2] */
    const int64_t *group_ends;
    uint8_t *y1, *s1, *y2, *s2; /* element codes (FP4: two per byte, 2j low), scale codes */
    int32_t format, scale_alg, round_mode;
    int32_t transpose_y2; /* y2 token-contiguous: [batch, width, m] (FP8 only) instead of [batch, m, width] */
    swiglu_glu glu;
    int64_t tile_pairs;   /* pairs per task at most; 0: the library's choice (the bits do not depend on it) */
    /* routing weight (spec 7.1): w[row] = weight[b * m + row] multiplies stage 1 last, or NULL */
    const float *weight;
    float *grad_weight;   /* backward with weight: [batch * m], the pairwise-summed dy * act16 of every row */
} swiglu_mx_args;

int32_t swiglu_cpu_abi_version(void);
/* The first 16 hex digits of the sha256 of the C sources this library was built from. */
const char *swiglu_cpu_source_hash(void);
/* 1 if this build holds the kernels for ``isa`` and this CPU runs them. */
int32_t swiglu_cpu_isa_supported(int32_t isa);
/* The activation ``kind`` (SWIGLU_ACT_*) of each of the 65,536 bit patterns of a 16-bit dtype. */
void swiglu_act_table(int32_t kind, int32_t dtype, float alpha, float limit, float *out, int32_t isa);
/* For the tests: the encoder of 16-bit values (numerics.h fp8x32_code2, both axes) against the per-element
   one (fp8_encode of the fp32 product; FP4 formats: fp4_encode with round mode rint), for every finite bit
   pattern of ``dtype`` and every scale code on each axis; the number of codes that differ, and of values
   the fast encoder leaves to the per-element one. */
void swiglu_fp8_x32_check(int32_t dtype, int32_t format, int32_t isa, int64_t *mismatches, int64_t *left);
/* Where jobs run: PyTorch's OpenMP team (GNU libgomp, found in the process) or the library's own pool (no
   such runtime, a forked child, or the pool chosen by swiglu_cpu_use_own_pool(1)). */
#define SWIGLU_THREADS_POOL 0
#define SWIGLU_THREADS_OPENMP 1
int32_t swiglu_cpu_threads_kind(void);
void swiglu_cpu_use_own_pool(int32_t own);
/* The operators; return 0, -1 for arguments outside the contract (checked by the Python side first), -2 when
   working memory could not be allocated. */
int32_t swiglu_glu_run(const swiglu_glu_args *args, int32_t isa, int32_t n_threads);
int32_t swiglu_mx_run(const swiglu_mx_args *args, int32_t isa, int32_t n_threads);
