/* The library's entry points (swiglu_cpu.h): the instruction-set dispatch, the thread pool and the cache of
   activation tables. Nothing here computes a value; the kernels are in kernels_<isa>.c. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SWIGLU_X86 1
#include <xmmintrin.h>
#else
#define SWIGLU_X86 0
#endif

/* ------------------------------------------------------------------ the caller's floating-point state */

/* Every entry point that computes runs with the default MXCSR (round to nearest, no FTZ / DAZ, exceptions
   masked) and gives the caller's MXCSR back exactly as it found it, control bits and sticky exception flags
   alike: the activation tables are built on the calling thread (NaN, inf and subnormal inputs raise IE, DE,
   OE and UE), and a table built under the caller's FTZ / DAZ would be cached wrong for the whole process.
   A thread that an entry point creates (a pool worker, or an OpenMP thread that libgomp starts inside
   GOMP_parallel) inherits the MXCSR of the thread that creates it: threads are therefore only created while
   the caller's own MXCSR is in place (fp_caller), so they start as they would have after a PyTorch
   operation. Tasks save and restore the MXCSR of the thread that runs them (run_tasks_from). */
#if SWIGLU_X86
enum { FP_DEFAULT_CSR = 0x1F80 };
static __thread unsigned int entry_csr; /* the caller's MXCSR, while an entry point runs on this thread */
static __thread int in_entry;
typedef struct {
    unsigned int csr;
    int outer;
} fp_saved;
static fp_saved fp_enter(void) {
    const fp_saved saved = {_mm_getcsr(), !in_entry};
    if (saved.outer) {
        entry_csr = saved.csr;
        in_entry = 1;
    }
    _mm_setcsr(FP_DEFAULT_CSR);
    return saved;
}
static void fp_leave(fp_saved saved) {
    if (saved.outer) in_entry = 0;
    _mm_setcsr(saved.csr);
}
/* Around thread creation: the caller's MXCSR in place (returns the one to put back after). */
static unsigned int fp_caller(void) {
    const unsigned int now = _mm_getcsr();
    if (in_entry) _mm_setcsr(entry_csr);
    return now;
}
static void fp_back(unsigned int csr) { _mm_setcsr(csr); }
#else
typedef int fp_saved;
static fp_saved fp_enter(void) { return 0; }
static void fp_leave(fp_saved saved) { (void)saved; }
static unsigned int fp_caller(void) { return 0; }
static void fp_back(unsigned int csr) { (void)csr; }
#endif

#ifndef SWIGLU_SOURCE_HASH
#define SWIGLU_SOURCE_HASH "unknown"
#endif

int32_t swiglu_cpu_abi_version(void) { return SWIGLU_ABI_VERSION; }
const char *swiglu_cpu_source_hash(void) { return SWIGLU_SOURCE_HASH; }

int32_t swiglu_cpu_isa_supported(int32_t isa) {
    switch (isa) {
    case SWIGLU_ISA_PORTABLE:
        return 1;
#if SWIGLU_X86
    case SWIGLU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
               __builtin_cpu_supports("bmi2");
    case SWIGLU_ISA_AVX512:
        return swiglu_cpu_isa_supported(SWIGLU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    case SWIGLU_ISA_AVX512_BF16:
        return swiglu_cpu_isa_supported(SWIGLU_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
#endif
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------------------ thread pool */

/* Workers are started on first use and then wait for jobs. One job runs at a time: a caller that finds the
   pool busy (another Python thread inside an operator) runs its tasks alone, which gives the same bits.
   The caller takes tasks too; a worker that gets no CPU in time (a machine busy with PyTorch's own OpenMP
   threads, which spin after every parallel region) does no task, the others do its share, and it skips
   the job when it wakes. The caller returns only when every worker has woken and looked at the job (and
   those that joined have finished): no thread of the library runs after a call has returned.
   After fork() the child has no workers (only the calling thread is copied): an atfork handler resets the
   pool, and the child starts its own workers when it first needs them. Every thread runs the tasks with
   the default floating-point environment (no flush-to-zero), whatever the caller's, and gets its own back
   (run_tasks_from). */

enum { MAX_WORKERS = 255 };

static struct {
    pthread_mutex_t busy; /* held by the caller whose job the pool runs */
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t wake, done;
    int n_workers;
    uint64_t generation; /* one per job */
    int open;            /* the current job still takes workers */
    task_fn fn;
    const void *ctx;
    int64_t n_tasks;
    int helpers;         /* at most this many workers join (the threads asked for, minus the caller) */
    int active;          /* workers inside the current job */
    int unseen;          /* workers woken for the current job that have not looked at it yet */
    uint64_t born[MAX_WORKERS]; /* the generation when each worker was started: its first job is the next */
    atomic_llong next;   /* the next task */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static void run_tasks_from(atomic_llong *next, task_fn fn, const void *ctx, int64_t n_tasks) {
#if SWIGLU_X86
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(FP_DEFAULT_CSR);
#endif
    for (;;) {
        const int64_t t = atomic_fetch_add(next, 1);
        if (t >= n_tasks) break;
        fn(ctx, t);
    }
#if SWIGLU_X86
    _mm_setcsr(csr);
#endif
}
static void run_tasks(task_fn fn, const void *ctx, int64_t n_tasks) { run_tasks_from(&pool.next, fn, ctx, n_tasks); }

static void *worker(void *arg) {
    const int index = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    uint64_t seen = pool.born[index];
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        pool.unseen--;
        /* join only a job that is still open, has tasks left and wants more helpers */
        if (pool.open && index < pool.helpers && atomic_load(&pool.next) < pool.n_tasks) {
            const task_fn fn = pool.fn;
            const void *ctx = pool.ctx;
            const int64_t n = pool.n_tasks;
            pool.active++;
            pthread_mutex_unlock(&pool.lock);
            run_tasks(fn, ctx, n);
            pthread_mutex_lock(&pool.lock);
            pool.active--;
        }
        if (pool.active == 0 && pool.unseen == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.open = 0;
    pool.helpers = 0;
    pool.active = 0;
    pool.unseen = 0;
}

static void tables_after_fork_in_child(void);
static atomic_int own_pool; /* 1: always the pool (not PyTorch's OpenMP team) */

static void after_fork_in_child(void) {
    pool_after_fork_in_child();
    tables_after_fork_in_child();
    atomic_store(&own_pool, 1); /* GNU OpenMP's team does not survive fork: the pool from here on */
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void install_atfork(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

/* Starts workers up to ``want`` (pool.lock held); returns how many there are. */
static int grow_workers(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    const unsigned int csr = fp_caller(); /* a new thread inherits the creator's MXCSR: the caller's */
    while (pool.n_workers < want) {
        pthread_attr_t attr;
        pthread_t thread;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20); /* MX tiles live in swiglu_thread_buffer, not here */
        pool.born[pool.n_workers] = pool.generation;
        const int failed = pthread_create(&thread, &attr, worker, (void *)(intptr_t)pool.n_workers);
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.n_workers++;
    }
    fp_back(csr);
    return pool.n_workers;
}

/* ------------------------------------------------------------------------- PyTorch's OpenMP team */

/* Where the process has GNU OpenMP loaded (PyTorch's own libgomp, on Linux), a job runs on its team instead
   of the pool: after each of PyTorch's parallel operations its OpenMP threads spin-wait for a few
   milliseconds, on the cores the pool's threads would need (MX backward at M=8192 right after a torch
   op: 11 ms on the pool, 7.5 on the team), while the team takes the job at once. The tasks are the
   same, taken from a counter of the job's own, so the bits are too. Not in a forked child (libgomp's team
   does not survive fork: PyTorch's own parallel operations hang there, and so did the first job of a
   child whose parent had a team but loaded or used this library only after the fork) and not after
   swiglu_cpu_use_own_pool(1) (SWIGLU_OPS_CPU_POOL=own, or a forked child, set by the Python loader and by
   the fork handler): the pool then runs it. */
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn gomp_parallel; /* NULL: no OpenMP team to use */
static pid_t gomp_pid;                 /* the process that found it (a forked child has another pid) */
static pthread_once_t gomp_once = PTHREAD_ONCE_INIT;

/* Called by the Python loader when it loads the library (own: SWIGLU_OPS_CPU_POOL=own, or a child forked
   from a process that had imported swiglu_ops, where PyTorch's team may be the parent's). It also installs
   the fork handler, so that a child forked after the load runs the pool even if no job ran before. */
void swiglu_cpu_use_own_pool(int32_t own) {
    pthread_once(&atfork_once, install_atfork);
    atomic_store(&own_pool, own != 0);
}

static void find_gomp(void) {
    void *lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD); /* only one that is already loaded */
    if (lib == NULL) return;
    gomp_parallel = (gomp_parallel_fn)dlsym(lib, "GOMP_parallel");
    gomp_pid = getpid();
    dlclose(lib); /* the reference NOLOAD took: the library stays loaded by whoever loaded it */
}

static int use_gomp(void) {
    pthread_once(&gomp_once, find_gomp);
    return !atomic_load(&own_pool) && gomp_parallel != NULL && getpid() == gomp_pid;
}

typedef struct {
    task_fn fn;
    const void *ctx;
    int64_t n_tasks;
    atomic_llong next;
} team_job;

static void team_body(void *arg) {
    team_job *job = arg;
    run_tasks_from(&job->next, job->fn, job->ctx, job->n_tasks);
}

int32_t swiglu_cpu_threads_kind(void) { return use_gomp() ? SWIGLU_THREADS_OPENMP : SWIGLU_THREADS_POOL; }

void swiglu_pool_run(task_fn fn, const void *ctx, int64_t n_tasks, int n_threads) {
    pthread_once(&atfork_once, install_atfork);
    int64_t helpers = (int64_t)n_threads - 1;
    if (helpers > n_tasks - 1) helpers = n_tasks - 1;
    if (helpers > 0 && use_gomp() && pthread_mutex_trylock(&pool.busy) == 0) {
        team_job job = {.fn = fn, .ctx = ctx, .n_tasks = n_tasks};
        atomic_init(&job.next, 0);
        /* libgomp may start team threads here, which inherit this thread's MXCSR: the caller's */
        const unsigned int csr = fp_caller();
        gomp_parallel(team_body, &job, (unsigned)(helpers + 1), 0);
        fp_back(csr);
        pthread_mutex_unlock(&pool.busy);
        return;
    }
    if (helpers <= 0 || pthread_mutex_trylock(&pool.busy) != 0) {
        /* alone: one thread wanted, one task, or the pool is busy with another caller's job; this thread
           is inside an entry point, at the default MXCSR already (fp_enter) */
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    const int n = grow_workers((int)helpers);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    pool.helpers = n < helpers ? n : (int)helpers;
    pool.active = 0;
    pool.unseen = n; /* every worker wakes: each looks at the job once */
    pool.open = 1;
    atomic_store(&pool.next, 0);
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_tasks(fn, ctx, n_tasks);
    /* every task is taken: close the job (a worker waking later skips it) and wait for those inside, and
       for every worker to have looked at the job: none is left to wake up after the call returns */
    pthread_mutex_lock(&pool.lock);
    pool.open = 0;
    while (pool.active > 0 || pool.unseen > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

/* ---------------------------------------------------------------------------- per-thread memory */

/* A task's working memory (the MX tile, up to about 1 MiB) is a buffer of the thread that runs it, kept
   between jobs and grown when a job needs more: thread stacks are too small for it (PyTorch's OpenMP
   threads have the runtime's default, OMP_STACKSIZE can shrink it), and allocating per task would fault its
   pages in again on every call. A thread's buffer is freed when the thread exits. */
static pthread_key_t buffer_key;
static pthread_once_t buffer_once = PTHREAD_ONCE_INIT;
static int buffer_key_ok;
static __thread void *buffer;
static __thread size_t buffer_bytes;

static void make_buffer_key(void) { buffer_key_ok = pthread_key_create(&buffer_key, free) == 0; }

void *swiglu_thread_buffer(size_t bytes) {
    if (bytes <= buffer_bytes) return buffer;
    pthread_once(&buffer_once, make_buffer_key);
    if (!buffer_key_ok) return NULL;
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void *p = aligned_alloc(4096, rounded);
    if (p == NULL) return NULL;
    free(buffer);
    buffer = p;
    buffer_bytes = rounded;
    pthread_setspecific(buffer_key, p); /* freed at thread exit */
    return p;
}

/* The data cache per core below the shared level (L2), from the C library; 0 where it does not say. */
static size_t l2_bytes;
static pthread_once_t l2_once = PTHREAD_ONCE_INIT;
static void find_l2(void) {
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    l2_bytes = v > 0 ? (size_t)v : 0;
#endif
}
size_t swiglu_l2_cache_bytes(void) {
    pthread_once(&l2_once, find_l2);
    return l2_bytes;
}

/* ----------------------------------------------------------------------------- activation tables */

/* Tables are kept for the life of the process (256 KiB each; operators use a few). Past MAX_TABLES
   distinct (kind, dtype, alpha, limit), further ones are not cached: the call gets NULL and the operator
   builds a private table for its own use. */
enum { MAX_TABLES = 64 };

static struct {
    pthread_mutex_t lock;
    int n;
    struct {
        int kind, dt;
        uint32_t alpha, limit; /* bits */
        float *table;
    } entry[MAX_TABLES];
} tables = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void tables_after_fork_in_child(void) { pthread_mutex_init(&tables.lock, NULL); }

static uint32_t f32_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return b;
}

const float *swiglu_act_table_get(int kind, int dt, float alpha, float limit, act_builder build) {
    pthread_once(&atfork_once, install_atfork);
    const uint32_t ab = f32_bits(alpha), lb = f32_bits(limit);
    const float *found = NULL;
    pthread_mutex_lock(&tables.lock);
    for (int i = 0; i < tables.n && found == NULL; i++)
        if (tables.entry[i].kind == kind && tables.entry[i].dt == dt && tables.entry[i].alpha == ab &&
            tables.entry[i].limit == lb)
            found = tables.entry[i].table;
    if (found == NULL && tables.n < MAX_TABLES) {
        float *t = malloc(sizeof(float) * 65536 * ACT_WIDTH(kind));
        if (t != NULL) {
            build(kind, dt, alpha, limit, t);
            tables.entry[tables.n].kind = kind;
            tables.entry[tables.n].dt = dt;
            tables.entry[tables.n].alpha = ab;
            tables.entry[tables.n].limit = lb;
            tables.entry[tables.n].table = t;
            tables.n++;
            found = t;
        }
    }
    pthread_mutex_unlock(&tables.lock);
    return found;
}

/* ------------------------------------------------------------------------------------- entry points */

typedef struct {
    int (*glu)(const swiglu_glu_args *, int);
    int (*mx)(const swiglu_mx_args *, int);
    void (*act)(int, int, float, float, float *);
    void (*fp8_check)(int, int, int64_t *, int64_t *);
} isa_impl;

static int isa_of(int32_t isa, isa_impl *impl) {
    if (!swiglu_cpu_isa_supported(isa)) return -1;
    switch (isa) {
#if SWIGLU_X86
    case SWIGLU_ISA_AVX2:
        *impl = (isa_impl){swiglu_glu_run_avx2, swiglu_mx_run_avx2, swiglu_act_build_avx2,
                            swiglu_fp8_x32_check_avx2};
        return 0;
    case SWIGLU_ISA_AVX512:
        *impl = (isa_impl){swiglu_glu_run_avx512, swiglu_mx_run_avx512, swiglu_act_build_avx512,
                            swiglu_fp8_x32_check_avx512};
        return 0;
    case SWIGLU_ISA_AVX512_BF16:
        *impl = (isa_impl){swiglu_glu_run_avx512_bf16, swiglu_mx_run_avx512_bf16, swiglu_act_build_avx512_bf16,
                            swiglu_fp8_x32_check_avx512_bf16};
        return 0;
#endif
    default:
        *impl = (isa_impl){swiglu_glu_run_portable, swiglu_mx_run_portable, swiglu_act_build_portable,
                            swiglu_fp8_x32_check_portable};
        return 0;
    }
}

void swiglu_act_table(int32_t kind, int32_t dtype, float alpha, float limit, float *out, int32_t isa) {
    isa_impl impl;
    if (isa_of(isa, &impl) != 0) return;
    const fp_saved fp = fp_enter();
    impl.act(kind, dtype, alpha, limit, out);
    fp_leave(fp);
}

void swiglu_fp8_x32_check(int32_t dtype, int32_t format, int32_t isa, int64_t *mismatches, int64_t *left) {
    isa_impl impl;
    *mismatches = *left = -1;
    if (isa_of(isa, &impl) != 0 || dtype == SWIGLU_FP32) return;
    const fp_saved fp = fp_enter();
    impl.fp8_check(dtype, format, mismatches, left);
    fp_leave(fp);
}

int32_t swiglu_glu_run(const swiglu_glu_args *args, int32_t isa, int32_t n_threads) {
    isa_impl impl;
    if (isa_of(isa, &impl) != 0 || args->rows < 0 || args->cols < 2 || args->cols % 2 != 0) return -1;
    if (args->rows == 0) return 0;
    const fp_saved fp = fp_enter();
    const int32_t rc = impl.glu(args, n_threads < 1 ? 1 : n_threads);
    fp_leave(fp);
    return rc;
}

int32_t swiglu_mx_run(const swiglu_mx_args *args, int32_t isa, int32_t n_threads) {
    isa_impl impl;
    if (isa_of(isa, &impl) != 0 || args->batch < 0 || args->m < 0 || args->cols < 2 || args->cols % 2 != 0)
        return -1;
    if (args->batch * args->m == 0) return 0;
    const fp_saved fp = fp_enter();
    const int32_t rc = impl.mx(args, n_threads < 1 ? 1 : n_threads);
    fp_leave(fp);
    return rc;
}
