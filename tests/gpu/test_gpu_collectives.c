/*
 * Collectives of the CUDA backend, over the public API, under
 * `mpirun -np N` (N = 1 and 2; more works too).
 *
 * Every input comes from a seeded hash of (seed, tag, source rank, index),
 * so each rank computes on the host what every other rank sent and checks
 * its results against that, exactly (values are small integers, or quarter
 * integers in f32, so every sum is exact in every dtype and any order).
 * Outputs are filled with 0xFF bytes (NaN in f32/bf16) before each
 * collective. The seed is printed; ETP_TEST_SEED repeats a run.
 *
 * Where a node has fewer GPUs than ranks the test exits 77, which CTest
 * reports as skipped (tests/common/gpu_util.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "etp/etp.h"
#include "etp/mpi.h"
#include "etp/cuda.h"
#include "gpu_util.h"
#include "test_util.h"

static struct {
    int rank, size;
    uint64_t seed;
    uint64_t tag; /* advanced identically on every rank */
} g;

#define CHECK_OK(expr)                                                                      \
    do {                                                                                    \
        etp_status_t s_ = (expr);                                                           \
        if (s_ != ETP_SUCCESS)                                                              \
            fail_msg("rank %d: %s -> %s: %s", g.rank, #expr, etp_status_string(s_),         \
                     etp_last_error());                                                     \
    } while (0)

#define CHECK_CUDA(expr)                                                                    \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != cudaSuccess)                                                              \
            fail_msg("rank %d: %s -> %s", g.rank, #expr, cudaGetErrorString(e_));           \
    } while (0)

#define CHECK_NCCL(expr)                                                                    \
    do {                                                                                    \
        ncclResult_t r_ = (expr);                                                           \
        if (r_ != ncclSuccess)                                                              \
            fail_msg("rank %d: %s -> %s", g.rank, #expr, ncclGetErrorString(r_));           \
    } while (0)

/* ---- data ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* The stream of values that source `src` sends under `tag`. */
static uint64_t gen_base(uint64_t tag, int src)
{
    return mix64(mix64(g.seed ^ mix64(tag)) + (uint64_t)src);
}

static double gen(etp_dtype_t dt, uint64_t base, size_t i)
{
    uint64_t r = mix64(base + (uint64_t)i * UINT64_C(0xD1B54A32D192ED03));
    switch (dt) {
    case ETP_DTYPE_F32: return ((int)(r % 129) - 64) * 0.25;
    case ETP_DTYPE_BF16: return (double)((int)(r % 33) - 16);
    case ETP_DTYPE_I32: return (double)((int64_t)(r % 2000001) - 1000000);
    default: return 0.0;
    }
}

static size_t dt_size(etp_dtype_t dt)
{
    return etp_dtype_size(dt);
}

static void put(etp_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case ETP_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case ETP_DTYPE_BF16: {
        float f = (float)v; /* small integers: the low 16 bits are zero */
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16);
        break;
    }
    case ETP_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: break;
    }
}

static double get(etp_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case ETP_DTYPE_F32: return ((const float *)buf)[i];
    case ETP_DTYPE_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    case ETP_DTYPE_I32: return ((const int32_t *)buf)[i];
    default: return 0.0;
    }
}

static const etp_dtype_t k_dtypes[] = {ETP_DTYPE_F32, ETP_DTYPE_BF16, ETP_DTYPE_I32};
#define NUM_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

/* ---- one collective's buffers -------------------------------------------- */

typedef struct job {
    etp_context_t *ctx;
    etp_dtype_t dt;
    size_t send_n, recv_n;   /* elements */
    void *d_send, *d_recv;
    void *h_send, *h_recv;
    double *expect;          /* recv_n expected values */
    unsigned char *gap;      /* optional: 1 where recv must stay poisoned */
} job_t;

static void job_init(job_t *j, etp_context_t *ctx, etp_dtype_t dt, size_t send_n, size_t recv_n)
{
    memset(j, 0, sizeof *j);
    j->ctx = ctx;
    j->dt = dt;
    j->send_n = send_n;
    j->recv_n = recv_n;
    size_t es = dt_size(dt);
    /* etp_mem_alloc wants bytes > 0; a zero count still gets a real buffer. */
    CHECK_OK(etp_mem_alloc(ctx, send_n * es + 256, ETP_MEM_USER, &j->d_send));
    CHECK_OK(etp_mem_alloc(ctx, recv_n * es + 256, ETP_MEM_USER, &j->d_recv));
    j->h_send = malloc(send_n * es + 1);
    j->h_recv = malloc(recv_n * es + 1);
    j->expect = malloc(recv_n * sizeof(double) + 1);
    assert_non_null(j->h_send);
    assert_non_null(j->h_recv);
    assert_non_null(j->expect);
}

static void job_free(job_t *j)
{
    if (j->d_send) CHECK_OK(etp_mem_free(j->ctx, j->d_send));
    if (j->d_recv) CHECK_OK(etp_mem_free(j->ctx, j->d_recv));
    free(j->h_send);
    free(j->h_recv);
    free(j->expect);
    free(j->gap);
    memset(j, 0, sizeof *j);
}

/* Upload the input and poison the output, on the collective's stream. */
static void job_stage(job_t *j, etp_stream_t *st)
{
    size_t es = dt_size(j->dt);
    CHECK_OK(etp_memcpy_async(st, j->d_send, j->h_send, j->send_n * es));
    CHECK_OK(etp_memset_async(st, j->d_recv, 0xFF, j->recv_n * es));
}

static void job_fetch(job_t *j, etp_stream_t *st)
{
    CHECK_OK(etp_memcpy_async(st, j->h_recv, j->d_recv, j->recv_n * dt_size(j->dt)));
}

static void job_check(const job_t *j, const char *what)
{
    size_t es = dt_size(j->dt);
    for (size_t i = 0; i < j->recv_n; i++) {
        if (j->gap && j->gap[i]) {
            static const unsigned char ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
            if (memcmp((const char *)j->h_recv + i * es, ff, es) != 0)
                fail_msg("rank %d: %s %s: element %zu (between blocks) was overwritten", g.rank,
                         what, etp_dtype_name(j->dt), i);
            continue;
        }
        double got = get(j->dt, j->h_recv, i);
        if (!(got == j->expect[i]))
            fail_msg("rank %d: %s %s count %zu: element %zu is %g, expected %g (seed %llu)",
                     g.rank, what, etp_dtype_name(j->dt), j->recv_n, i, got, j->expect[i],
                     (unsigned long long)g.seed);
    }
}

/* ---- fixture: a CUDA context, a 2-role group split from world --------- */

typedef struct fixture {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_group_t *grp;  /* all ranks, keys reversed, 2 roles */
    int grank, gsize;
    etp_stream_t *st[2];
    int check;
} fixture_t;

/* A CUDA context and its split take seconds to create at 4 ranks (NCCL
 * communicators and their warmed-up twins): the tests share one fixture
 * for each setting of collective checking, made at first use, replaced
 * only after a test aborted it, destroyed at the end (fx_release_all). */
static fixture_t *g_fx[2];

static etp_context_config_t cuda_config(double timeout_s, int check)
{
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    cfg.timeout_s = timeout_s;
    cfg.check_collectives = check;
    return cfg;
}

static int fx_destroy(fixture_t *f);

static int fx_setup_check(void **state, int check)
{
    *state = NULL;
    if (g_fx[check]) {
        *state = g_fx[check];
        return 0;
    }
    fixture_t *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    f->check = check;
    /* A generous timeout: a rank that fails an assertion leaves the others
     * with a timeout error instead of a hang. */
    etp_context_config_t cfg = cuda_config(120.0, check);
    etp_status_t st = etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &f->ctx);
    if (st == ETP_SUCCESS) st = etp_context_world(f->ctx, &f->world);
    if (st == ETP_SUCCESS) {
        etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
        gc.name = "split";
        gc.num_roles = 2;
        st = etp_group_split(f->world, 0, g.size - 1 - g.rank, &gc, &f->grp);
    }
    if (st == ETP_SUCCESS) st = etp_group_rank(f->grp, &f->grank);
    if (st == ETP_SUCCESS) st = etp_group_size(f->grp, &f->gsize);
    if (st == ETP_SUCCESS) st = etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->st[0]);
    if (st == ETP_SUCCESS) st = etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_HIGH, &f->st[1]);
    if (st != ETP_SUCCESS) {
        fprintf(stderr, "rank %d: fixture setup: %s: %s\n", g.rank, etp_status_string(st),
                etp_last_error());
        return -1;
    }
    g_fx[check] = f;
    *state = f;
    return 0;
}

static int fx_setup(void **state)
{
    return fx_setup_check(state, 0);
}

static int fx_setup_checked(void **state)
{
    return fx_setup_check(state, 1);
}

/* After each test: the shared fixture stays unless the test aborted its
 * context (on purpose or by failing), whose streams must also be idle. */
static int fx_teardown(void **state)
{
    fixture_t *f = *state;
    if (f == NULL) return 0;
    if (etp_context_check(f->ctx) == ETP_SUCCESS &&
        etp_stream_synchronize(f->st[0]) == ETP_SUCCESS &&
        etp_stream_synchronize(f->st[1]) == ETP_SUCCESS)
        return 0;
    g_fx[f->check] = NULL;
    return fx_destroy(f);
}

static int fx_release_all(void)
{
    int bad = 0;
    for (int c = 0; c < 2; c++)
        if (g_fx[c]) {
            bad |= fx_destroy(g_fx[c]) != 0;
            g_fx[c] = NULL;
        }
    return bad;
}

static int fx_destroy(fixture_t *f)
{
    /* A test may leave the context aborted on purpose; then ETP_ERR_ABORTED
     * from a destroy call is expected, anything else is not. */
    int aborted = f->ctx && etp_context_check(f->ctx) != ETP_SUCCESS;
    int bad = 0;
    etp_status_t st;
    for (int r = 0; r < 2; r++) {
        if (f->st[r] && (st = etp_stream_destroy(f->st[r])) != ETP_SUCCESS &&
            !(aborted && st == ETP_ERR_ABORTED))
            bad = 1;
    }
    if (f->grp && (st = etp_group_destroy(f->grp)) != ETP_SUCCESS &&
        !(aborted && st == ETP_ERR_ABORTED))
        bad = 1;
    if (f->ctx && (st = etp_context_destroy(f->ctx)) != ETP_SUCCESS &&
        !(aborted && st == ETP_ERR_ABORTED))
        bad = 1;
    if (bad) fprintf(stderr, "rank %d: fixture teardown: %s\n", g.rank, etp_last_error());
    free(f);
    return bad ? -1 : 0;
}

static fixture_t *fx(void **state)
{
    fixture_t *f = *state;
    assert_non_null(f);
    assert_int_equal(f->gsize, g.size);
    assert_int_equal(f->grank, g.size - 1 - g.rank); /* keys were reversed */
    return f;
}

static void sync_both(fixture_t *f)
{
    CHECK_OK(etp_stream_synchronize(f->st[0]));
    CHECK_OK(etp_stream_synchronize(f->st[1]));
}

/* ---- job builders --------------------------------------------------------- */

static void build_allgather(job_t *j, etp_context_t *ctx, etp_dtype_t dt, size_t count, int me,
                            int n)
{
    uint64_t tag = ++g.tag;
    job_init(j, ctx, dt, count, count * (size_t)n);
    uint64_t mine = gen_base(tag, me);
    for (size_t i = 0; i < count; i++) put(dt, j->h_send, i, gen(dt, mine, i));
    for (int r = 0; r < n; r++) {
        uint64_t b = gen_base(tag, r);
        for (size_t i = 0; i < count; i++) j->expect[(size_t)r * count + i] = gen(dt, b, i);
    }
}

static double reduce2(etp_redop_t op, double a, double b)
{
    return op == ETP_REDOP_MAX ? (a > b ? a : b) : a + b;
}

static void build_reduce_scatter(job_t *j, etp_context_t *ctx, etp_dtype_t dt, size_t recvcount,
                                 etp_redop_t op, int me, int n)
{
    uint64_t tag = ++g.tag;
    job_init(j, ctx, dt, recvcount * (size_t)n, recvcount);
    uint64_t mine = gen_base(tag, me);
    for (size_t i = 0; i < j->send_n; i++) put(dt, j->h_send, i, gen(dt, mine, i));
    for (size_t i = 0; i < recvcount; i++) {
        size_t at = (size_t)me * recvcount + i;
        double acc = gen(dt, gen_base(tag, 0), at);
        for (int r = 1; r < n; r++) acc = reduce2(op, acc, gen(dt, gen_base(tag, r), at));
        j->expect[i] = acc;
    }
}

static void build_allreduce(job_t *j, etp_context_t *ctx, etp_dtype_t dt, size_t count,
                            etp_redop_t op, int me, int n)
{
    uint64_t tag = ++g.tag;
    job_init(j, ctx, dt, count, count);
    uint64_t mine = gen_base(tag, me);
    for (size_t i = 0; i < count; i++) put(dt, j->h_send, i, gen(dt, mine, i));
    uint64_t *bases = malloc((size_t)n * sizeof *bases);
    assert_non_null(bases);
    for (int r = 0; r < n; r++) bases[r] = gen_base(tag, r);
    for (size_t i = 0; i < count; i++) {
        double acc = gen(dt, bases[0], i);
        for (int r = 1; r < n; r++) acc = reduce2(op, acc, gen(dt, bases[r], i));
        j->expect[i] = acc;
    }
    free(bases);
}

/* All-to-all-v: src sends cnt(src, dst) elements to dst; some are zero.
 * Send blocks have gaps of `dst` elements, receive blocks gaps of 2*src
 * elements (which must stay poisoned). */
typedef struct a2a {
    size_t *scount, *sdispl, *rcount, *rdispl;
} a2a_t;

static size_t a2a_cnt(uint64_t tag, int src, int dst)
{
    return (size_t)(mix64(tag * 1000003u + (uint64_t)src * 1009u + (uint64_t)dst) % 5) * 37;
}

static const size_t k_a2a_stride = (size_t)1 << 20; /* element index of a (dst, j) pair */

static void build_alltoallv(job_t *j, a2a_t *a, etp_context_t *ctx, etp_dtype_t dt, int me, int n)
{
    uint64_t tag = ++g.tag;
    a->scount = calloc((size_t)n, sizeof(size_t));
    a->sdispl = calloc((size_t)n, sizeof(size_t));
    a->rcount = calloc((size_t)n, sizeof(size_t));
    a->rdispl = calloc((size_t)n, sizeof(size_t));
    assert_true(a->scount && a->sdispl && a->rcount && a->rdispl);
    size_t s_at = 0, r_at = 0;
    for (int p = 0; p < n; p++) {
        a->sdispl[p] = s_at;
        a->scount[p] = a2a_cnt(tag, me, p);
        s_at += a->scount[p] + (size_t)p;
        a->rdispl[p] = r_at + 2 * (size_t)p;
        a->rcount[p] = a2a_cnt(tag, p, me);
        r_at = a->rdispl[p] + a->rcount[p];
    }
    job_init(j, ctx, dt, s_at, r_at);
    j->gap = calloc(r_at + 1, 1);
    assert_non_null(j->gap);
    memset(j->gap, 1, r_at);
    memset(j->h_send, 0xEE, s_at * dt_size(dt)); /* gaps: must never be sent */
    uint64_t mine = gen_base(tag, me);
    for (int p = 0; p < n; p++)
        for (size_t e = 0; e < a->scount[p]; e++)
            put(dt, j->h_send, a->sdispl[p] + e, gen(dt, mine, (size_t)p * k_a2a_stride + e));
    for (int p = 0; p < n; p++) {
        uint64_t b = gen_base(tag, p);
        for (size_t e = 0; e < a->rcount[p]; e++) {
            j->expect[a->rdispl[p] + e] = gen(dt, b, (size_t)me * k_a2a_stride + e);
            j->gap[a->rdispl[p] + e] = 0;
        }
    }
}

static void a2a_free(a2a_t *a)
{
    free(a->scount);
    free(a->sdispl);
    free(a->rcount);
    free(a->rdispl);
    memset(a, 0, sizeof *a);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_allgather(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    static const size_t counts[] = {0, 1, 7, 1000, 65537};
    for (size_t d = 0; d < NUM_DTYPES; d++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            job_t j[2];
            for (int r = 0; r < 2; r++) {
                build_allgather(&j[r], f->ctx, k_dtypes[d], counts[c], f->grank, f->gsize);
                job_stage(&j[r], f->st[r]);
                CHECK_OK(etp_allgather(f->grp, r, j[r].d_send, j[r].d_recv, counts[c],
                                       k_dtypes[d], f->st[r]));
                job_fetch(&j[r], f->st[r]);
            }
            sync_both(f);
            for (int r = 0; r < 2; r++) {
                job_check(&j[r], r ? "allgather role 1" : "allgather role 0");
                job_free(&j[r]);
            }
        }
    }
}

static void test_allgather_large(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    /* More than 64 MiB gathered in total, and not a round size. */
    size_t count = ((size_t)64 << 20) / sizeof(float) / (size_t)f->gsize + 1031;
    job_t j;
    build_allgather(&j, f->ctx, ETP_DTYPE_F32, count, f->grank, f->gsize);
    assert_true(j.recv_n * sizeof(float) > ((size_t)64 << 20));
    job_stage(&j, f->st[1]);
    CHECK_OK(etp_allgather(f->grp, 1, j.d_send, j.d_recv, count, ETP_DTYPE_F32, f->st[1]));
    job_fetch(&j, f->st[1]);
    CHECK_OK(etp_stream_synchronize(f->st[1]));
    job_check(&j, "large allgather");
    job_free(&j);
}

static void test_reduce_scatter_sum(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    static const size_t counts[] = {0, 1, 33, 4097};
    for (size_t d = 0; d < NUM_DTYPES; d++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            job_t j[2];
            for (int r = 0; r < 2; r++) {
                build_reduce_scatter(&j[r], f->ctx, k_dtypes[d], counts[c], ETP_REDOP_SUM,
                                     f->grank, f->gsize);
                job_stage(&j[r], f->st[r]);
                CHECK_OK(etp_reduce_scatter(f->grp, r, j[r].d_send, j[r].d_recv, counts[c],
                                            k_dtypes[d], ETP_REDOP_SUM, f->st[r]));
                job_fetch(&j[r], f->st[r]);
            }
            sync_both(f);
            for (int r = 0; r < 2; r++) {
                job_check(&j[r], "reduce_scatter sum");
                job_free(&j[r]);
            }
        }
    }
}

static void test_allreduce(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    static const size_t counts[] = {1, 1000, ((size_t)1 << 20) + 3};
    static const etp_redop_t ops[] = {ETP_REDOP_SUM, ETP_REDOP_MAX};
    for (size_t o = 0; o < 2; o++) {
        for (size_t d = 0; d < NUM_DTYPES; d++) {
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                job_t j[2];
                for (int r = 0; r < 2; r++) {
                    build_allreduce(&j[r], f->ctx, k_dtypes[d], counts[c], ops[o], f->grank,
                                    f->gsize);
                    job_stage(&j[r], f->st[r]);
                    CHECK_OK(etp_allreduce(f->grp, r, j[r].d_send, j[r].d_recv, counts[c],
                                           k_dtypes[d], ops[o], f->st[r]));
                    job_fetch(&j[r], f->st[r]);
                }
                sync_both(f);
                for (int r = 0; r < 2; r++) {
                    job_check(&j[r], ops[o] == ETP_REDOP_SUM ? "allreduce sum" : "allreduce max");
                    job_free(&j[r]);
                }
            }
        }
    }
}

static void test_alltoallv(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    for (int round = 0; round < 2; round++) {
        for (size_t d = 0; d < NUM_DTYPES; d++) {
            job_t j[2];
            a2a_t a[2];
            for (int r = 0; r < 2; r++) {
                build_alltoallv(&j[r], &a[r], f->ctx, k_dtypes[d], f->grank, f->gsize);
                job_stage(&j[r], f->st[r]);
                CHECK_OK(etp_alltoallv(f->grp, r, j[r].d_send, a[r].scount, a[r].sdispl,
                                       j[r].d_recv, a[r].rcount, a[r].rdispl, k_dtypes[d],
                                       f->st[r]));
                job_fetch(&j[r], f->st[r]);
            }
            sync_both(f);
            for (int r = 0; r < 2; r++) {
                job_check(&j[r], "alltoallv");
                job_free(&j[r]);
                a2a_free(&a[r]);
            }
        }
    }
}

static void test_in_place(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    const size_t count = 1000, es = sizeof(float);
    /* allgather: send is this rank's block of recv */
    job_t j;
    build_allgather(&j, f->ctx, ETP_DTYPE_F32, count, f->grank, f->gsize);
    char *mine = (char *)j.d_recv + (size_t)f->grank * count * es;
    CHECK_OK(etp_memset_async(f->st[0], j.d_recv, 0xFF, j.recv_n * es));
    CHECK_OK(etp_memcpy_async(f->st[0], mine, j.h_send, count * es));
    CHECK_OK(etp_allgather(f->grp, 0, mine, j.d_recv, count, ETP_DTYPE_F32, f->st[0]));
    job_fetch(&j, f->st[0]);
    CHECK_OK(etp_stream_synchronize(f->st[0]));
    job_check(&j, "in-place allgather");
    job_free(&j);
    /* allreduce: send == recv */
    build_allreduce(&j, f->ctx, ETP_DTYPE_F32, count, ETP_REDOP_SUM, f->grank, f->gsize);
    CHECK_OK(etp_memcpy_async(f->st[1], j.d_recv, j.h_send, count * es));
    CHECK_OK(etp_allreduce(f->grp, 1, j.d_recv, j.d_recv, count, ETP_DTYPE_F32, ETP_REDOP_SUM,
                           f->st[1]));
    job_fetch(&j, f->st[1]);
    CHECK_OK(etp_stream_synchronize(f->st[1]));
    job_check(&j, "in-place allreduce");
    job_free(&j);
}

static void test_batch(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    job_t ar, ag, rs;
    build_allreduce(&ar, f->ctx, ETP_DTYPE_BF16, 4099, ETP_REDOP_SUM, f->grank, f->gsize);
    build_allgather(&ag, f->ctx, ETP_DTYPE_F32, 513, f->grank, f->gsize);
    /* on world, whose ranks are the MPI ranks */
    build_reduce_scatter(&rs, f->ctx, ETP_DTYPE_I32, 77, ETP_REDOP_SUM, g.rank, g.size);
    job_stage(&ar, f->st[0]);
    job_stage(&ag, f->st[1]);
    job_stage(&rs, f->st[0]);
    /* Collectives of three communicators (two roles of one group, and
     * world) on two streams in one batch, one of them in a nested batch. */
    CHECK_OK(etp_batch_begin(f->ctx));
    CHECK_OK(etp_allreduce(f->grp, 0, ar.d_send, ar.d_recv, 4099, ETP_DTYPE_BF16, ETP_REDOP_SUM,
                           f->st[0]));
    CHECK_OK(etp_batch_begin(f->ctx));
    CHECK_OK(etp_allgather(f->grp, 1, ag.d_send, ag.d_recv, 513, ETP_DTYPE_F32, f->st[1]));
    CHECK_OK(etp_batch_end(f->ctx));
    CHECK_OK(etp_reduce_scatter(f->world, 0, rs.d_send, rs.d_recv, 77, ETP_DTYPE_I32,
                                ETP_REDOP_SUM, f->st[0]));
    CHECK_OK(etp_batch_end(f->ctx));
    job_fetch(&ar, f->st[0]);
    job_fetch(&ag, f->st[1]);
    job_fetch(&rs, f->st[0]);
    sync_both(f);
    job_check(&ar, "batched allreduce");
    job_check(&ag, "batched allgather");
    job_check(&rs, "batched reduce_scatter on world");
    job_free(&ar);
    job_free(&ag);
    job_free(&rs);
    /* An empty batch is fine too. */
    CHECK_OK(etp_batch_begin(f->ctx));
    CHECK_OK(etp_batch_end(f->ctx));
}

static void test_wrapped_stream(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    int dev = -1;
    CHECK_OK(etp_context_cuda_device(f->ctx, &dev));
    CHECK_CUDA(cudaSetDevice(dev));
    cudaStream_t user;
    CHECK_CUDA(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    etp_stream_t *ws = NULL;
    CHECK_OK(etp_stream_wrap_cuda(f->ctx, user, &ws));
    cudaStream_t back = NULL;
    CHECK_OK(etp_stream_get_cuda(ws, &back));
    assert_ptr_equal(back, user);
    job_t j;
    build_allreduce(&j, f->ctx, ETP_DTYPE_F32, 12345, ETP_REDOP_SUM, g.rank, g.size);
    job_stage(&j, ws);
    CHECK_OK(etp_allreduce(f->world, 0, j.d_send, j.d_recv, 12345, ETP_DTYPE_F32, ETP_REDOP_SUM,
                           ws));
    job_fetch(&j, ws);
    CHECK_OK(etp_stream_synchronize(ws));
    job_check(&j, "allreduce on a wrapped stream");
    job_free(&j);
    CHECK_OK(etp_stream_destroy(ws));
    /* The wrapper is gone; the stream is still the caller's. */
    CHECK_CUDA(cudaStreamSynchronize(user));
    CHECK_CUDA(cudaStreamDestroy(user));
    /* Refused: the legacy default stream. */
    assert_int_equal(etp_stream_wrap_cuda(f->ctx, NULL, &ws), ETP_ERR_INVALID_ARGUMENT);
}

/* A context over every rank that runs one f32 allreduce sum on world and
 * checks it. */
static void allreduce_once(etp_context_t *ctx, const char *what)
{
    etp_group_t *world = NULL;
    CHECK_OK(etp_context_world(ctx, &world));
    int rank = -1, size = -1;
    CHECK_OK(etp_group_rank(world, &rank));
    CHECK_OK(etp_group_size(world, &size));
    assert_int_equal(rank, g.rank);
    assert_int_equal(size, g.size);
    etp_stream_t *st = NULL;
    CHECK_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &st));
    job_t j;
    build_allreduce(&j, ctx, ETP_DTYPE_F32, 4096 + 5, ETP_REDOP_SUM, rank, size);
    job_stage(&j, st);
    CHECK_OK(etp_allreduce(world, 0, j.d_send, j.d_recv, j.recv_n, ETP_DTYPE_F32, ETP_REDOP_SUM,
                           st));
    job_fetch(&j, st);
    CHECK_OK(etp_stream_synchronize(st));
    job_check(&j, what);
    job_free(&j);
    CHECK_OK(etp_stream_destroy(st));
}

static void test_ctx_unique_id(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    (void)state;
    /* The caller's own launcher: rank 0 makes the id, MPI carries it. */
    etp_unique_id_t id;
    memset(&id, 0, sizeof id);
    if (g.rank == 0) CHECK_OK(etp_get_unique_id(ETP_BACKEND_CUDA, &id));
    assert_int_equal(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), MPI_SUCCESS);
    etp_context_config_t cfg = cuda_config(120.0, 0);
    etp_context_t *ctx = NULL;
    CHECK_OK(etp_context_create(&id, g.rank, g.size, &cfg, &ctx));
    etp_backend_t kind = ETP_BACKEND_AUTO;
    CHECK_OK(etp_context_backend(ctx, &kind));
    assert_int_equal(kind, ETP_BACKEND_CUDA);
    allreduce_once(ctx, "allreduce (unique-id context)");
    CHECK_OK(etp_context_destroy(ctx));
}

static int local_rank(void)
{
    MPI_Comm node;
    int lr = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return g.rank;
    MPI_Comm_rank(node, &lr);
    MPI_Comm_free(&node);
    return lr;
}

static void test_ctx_user_nccl_comm(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    (void)state;
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    int dev = local_rank() % ndev;
    CHECK_CUDA(cudaSetDevice(dev));
    ncclUniqueId uid;
    memset(&uid, 0, sizeof uid);
    if (g.rank == 0) CHECK_NCCL(ncclGetUniqueId(&uid));
    assert_int_equal(MPI_Bcast(&uid, (int)sizeof uid, MPI_BYTE, 0, MPI_COMM_WORLD), MPI_SUCCESS);
    ncclComm_t user = NULL;
    CHECK_NCCL(ncclCommInitRank(&user, g.size, uid, g.rank));

    etp_context_config_t cfg = cuda_config(120.0, 0);
    etp_context_t *ctx = NULL;
    CHECK_OK(etp_context_create_nccl(user, &cfg, &ctx));
    int edev = -1;
    CHECK_OK(etp_context_cuda_device(ctx, &edev));
    assert_int_equal(edev, dev);
    allreduce_once(ctx, "allreduce (context from an NCCL communicator)");
    CHECK_OK(etp_context_destroy(ctx));

    /* The borrowed communicator must still work. */
    CHECK_CUDA(cudaSetDevice(dev));
    const size_t n = 1000;
    uint64_t tag = ++g.tag;
    float *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = (float)gen(ETP_DTYPE_F32, gen_base(tag, g.rank), i);
    float *d = NULL;
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc((void **)&d, n * sizeof *d));
    CHECK_CUDA(cudaMemcpyAsync(d, h, n * sizeof *d, cudaMemcpyHostToDevice, s));
    CHECK_NCCL(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, user, s));
    CHECK_CUDA(cudaMemcpyAsync(h, d, n * sizeof *d, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < g.size; r++) want += gen(ETP_DTYPE_F32, gen_base(tag, r), i);
        if ((double)h[i] != want)
            fail_msg("rank %d: user communicator after etp: element %zu is %g, expected %g",
                     g.rank, i, (double)h[i], want);
    }
    free(h);
    CHECK_CUDA(cudaFree(d));
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_NCCL(ncclCommDestroy(user));
}

static void test_split_no_color(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    /* Odd world ranks join nothing but still take part in the split. */
    int color = g.rank % 2 ? ETP_GROUP_NO_COLOR : 0;
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "even";
    gc.min_ctas = 1;
    gc.max_ctas = 8;
    etp_group_t *even = NULL;
    CHECK_OK(etp_group_split(f->world, color, g.rank, &gc, &even));
    if (color == ETP_GROUP_NO_COLOR) {
        assert_null(even);
        return;
    }
    assert_non_null(even);
    int r = -1, n = -1;
    CHECK_OK(etp_group_rank(even, &r));
    CHECK_OK(etp_group_size(even, &n));
    assert_int_equal(n, (g.size + 1) / 2);
    assert_int_equal(r, g.rank / 2);
    job_t j;
    build_allreduce(&j, f->ctx, ETP_DTYPE_I32, 999, ETP_REDOP_MAX, r, n);
    job_stage(&j, f->st[0]);
    CHECK_OK(etp_allreduce(even, 0, j.d_send, j.d_recv, 999, ETP_DTYPE_I32, ETP_REDOP_MAX,
                           f->st[0]));
    job_fetch(&j, f->st[0]);
    CHECK_OK(etp_stream_synchronize(f->st[0]));
    job_check(&j, "allreduce max on a split of even ranks");
    job_free(&j);
    CHECK_OK(etp_group_destroy(even));
}

static void test_checked_collectives(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    /* With fingerprints on, matching collectives (alltoallv included, whose
     * counts differ per peer) still run and give the right numbers. */
    fixture_t *f = fx(state);
    job_t j;
    a2a_t a;
    build_alltoallv(&j, &a, f->ctx, ETP_DTYPE_F32, f->grank, f->gsize);
    job_stage(&j, f->st[0]);
    CHECK_OK(etp_alltoallv(f->grp, 0, j.d_send, a.scount, a.sdispl, j.d_recv, a.rcount, a.rdispl,
                           ETP_DTYPE_F32, f->st[0]));
    job_fetch(&j, f->st[0]);
    CHECK_OK(etp_stream_synchronize(f->st[0]));
    job_check(&j, "checked alltoallv");
    job_free(&j);
    a2a_free(&a);
    build_reduce_scatter(&j, f->ctx, ETP_DTYPE_BF16, 100, ETP_REDOP_MAX, f->grank, f->gsize);
    job_stage(&j, f->st[1]);
    CHECK_OK(etp_reduce_scatter(f->grp, 1, j.d_send, j.d_recv, 100, ETP_DTYPE_BF16,
                                ETP_REDOP_MAX, f->st[1]));
    job_fetch(&j, f->st[1]);
    CHECK_OK(etp_stream_synchronize(f->st[1]));
    job_check(&j, "checked reduce_scatter max");
    job_free(&j);
}

static void test_mismatch(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    fixture_t *f = fx(state);
    if (g.size < 2) skip();
    /* World rank r gathers 4 + r elements: every rank sees a mismatch with
     * its first differing peer, and nothing is issued. */
    size_t count = 4 + (size_t)g.rank;
    void *send = NULL, *recv = NULL;
    CHECK_OK(etp_mem_alloc(f->ctx, 4096, ETP_MEM_USER, &send));
    CHECK_OK(etp_mem_alloc(f->ctx, 4096 * (size_t)g.size, ETP_MEM_USER, &recv));
    etp_status_t st = etp_allgather(f->world, 0, send, recv, count, ETP_DTYPE_F32, f->st[0]);
    if (st == ETP_SUCCESS) st = etp_stream_synchronize(f->st[0]);
    assert_int_equal(st, ETP_ERR_COLLECTIVE_MISMATCH);
    const char *msg = etp_last_error();
    if (strstr(msg, "collective mismatch on group") == NULL)
        fail_msg("rank %d: unexpected message: %s", g.rank, msg);
    if (g.rank <= 1 &&
        strstr(msg, "rank 0 issued allgather count 4 dtype f32, rank 1 issued allgather count 5 "
                    "dtype f32") == NULL)
        fail_msg("rank %d: unexpected message: %s", g.rank, msg);
    assert_int_equal(etp_context_check(f->ctx), ETP_ERR_ABORTED);
    /* The fixture's teardown destroys the aborted context (it frees these). */
}

static void test_ctx_timeout(void **state)
{
    /* every rank starts each test at the same tag, whatever ran before */
    g.tag = (uint64_t)__LINE__ << 32;
    (void)state;
    if (g.size < 2) skip();
    etp_context_config_t cfg = cuda_config(2.0, 0);
    etp_context_t *ctx = NULL;
    CHECK_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    etp_group_t *world = NULL;
    CHECK_OK(etp_context_world(ctx, &world));
    etp_stream_t *st = NULL;
    CHECK_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &st));
    const size_t n = 1 << 16;
    void *buf = NULL;
    CHECK_OK(etp_mem_alloc(ctx, n * sizeof(float), ETP_MEM_USER, &buf));
    CHECK_OK(etp_memset_async(st, buf, 0, n * sizeof(float)));
    /* The same collective once on every rank, so connections are set up and
     * the timeout below is about the missing peer, not about setup. */
    CHECK_OK(etp_allreduce(world, 0, buf, buf, n, ETP_DTYPE_F32, ETP_REDOP_SUM, st));
    CHECK_OK(etp_stream_synchronize(st));
    assert_int_equal(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);

    if (g.rank == 0) {
        double t0 = MPI_Wtime();
        etp_status_t s = etp_allreduce(world, 0, buf, buf, n, ETP_DTYPE_F32, ETP_REDOP_SUM, st);
        if (s == ETP_SUCCESS) s = etp_stream_synchronize(st);
        double dt = MPI_Wtime() - t0;
        fprintf(stderr, "rank 0: timeout after %.2f s: %s\n", dt, etp_last_error());
        assert_int_equal(s, ETP_ERR_TIMEOUT);
        if (strstr(etp_last_error(), "allreduce") == NULL)
            fail_msg("timeout message does not name the collective: %s", etp_last_error());
        assert_true(dt >= 1.5 && dt <= 10.0);
        assert_int_equal(etp_context_check(ctx), ETP_ERR_ABORTED);
    }
    assert_int_equal(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
    if (g.rank != 0) {
        CHECK_OK(etp_context_check(ctx));
        CHECK_OK(etp_mem_free(ctx, buf));
        CHECK_OK(etp_stream_destroy(st));
        CHECK_OK(etp_context_destroy(ctx));
    } else {
        /* An aborted context accepts destroy calls; the buffer goes with it. */
        etp_status_t s = etp_stream_destroy(st);
        assert_true(s == ETP_SUCCESS || s == ETP_ERR_ABORTED);
        s = etp_context_destroy(ctx);
        assert_true(s == ETP_SUCCESS || s == ETP_ERR_ABORTED);
    }
    assert_int_equal(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);

    unsigned long long seed = (unsigned long long)time(NULL);
    const char *env_seed = getenv("ETP_TEST_SEED");
    if (env_seed && *env_seed) seed = strtoull(env_seed, NULL, 0);
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    g.seed = seed;
    if (g.rank == 0)
        printf("test_gpu_collectives: %d rank(s), seed %llu (ETP_TEST_SEED=%llu repeats it)\n",
               g.size, seed, seed);

    if (tu_gpu_short("test_gpu_collectives")) return tu_gpu_skip();
    tu_apply_case_filter();

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_allgather, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_allgather_large, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_reduce_scatter_sum, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_allreduce, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_alltoallv, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_in_place, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_batch, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_wrapped_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_split_no_color, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checked_collectives, fx_setup_checked, fx_teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, fx_setup_checked, fx_teardown),
        cmocka_unit_test(test_ctx_unique_id),
        cmocka_unit_test(test_ctx_user_nccl_comm),
        cmocka_unit_test(test_ctx_timeout),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (fx_release_all()) failed++;
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
