/*
 * etp-bench chain: how much communication a chain leaves exposed in a
 * training step. L layers, each a BF16 weight [d, d] sharded over the world;
 * a step runs the forward GEMM Y = X W^T of every layer, then, in reverse,
 * the dgrad GEMM dX = dY W and the wgrad GEMM dW = dY^T X (cuBLASLt, BF16 in
 * and out, FP32 accumulate), with M tokens per rank. Three variants, each
 * timed as the median step:
 *
 *   etp    gathers with prefetch, releases, wgrad buffers, reduce_grad
 *   local  the same GEMMs on weights already local (no communication)
 *   comm   the same etp calls without GEMMs (the communication alone)
 *
 * exposed = (etp - local) / comm: the share of the communication time the
 * step did not hide. CUDA backend only.
 *
 *   etp-bench chain [--layers 16] [--d 8192] [--m 4096] [--depth 1] [--max-ctas N]
 *                   [--gemm-sms N (GEMMs use N SMs, leaving the rest to communication)]
 *                   [--loop K (each sample runs K steps back to back, as a training
 *                    loop does, and counts their mean; default 1: one step alone, so
 *                    its first gather and last reduction are exposed by construction)]
 *                   [--update (every weight marked updated at each step's start, as after an
 *                    optimizer step)] [--prefetch-on-update (the chain's prefetch_on_update)]
 *                   [--defer-zero (the chain's defer_zero_grad: no zeroing pass, each step's
 *                    reduction stores instead of adding)]
 */
#include <stdlib.h>
#include <string.h>

#include "etp_bench.h"

#if ETP_HAVE_CUDA
#include <cublasLt.h>

#include "etp/cuda.h"

typedef struct {
    bench_t *b;
    int sms; /* CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0: all */
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    cudaStream_t cs;
} gemm_t;

static void lt_check(bench_t *b, cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "etp-bench chain rank %d: %s failed (cuBLAS status %d)\n", b->rank, what, (int)s);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* Column-major D[m, n] = op(A) op(B), BF16 in and out, FP32 accumulate. */
static void gemm(gemm_t *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                 int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_check(g->b, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    /* Leave SMs to the collectives running beside the GEMM (an SM margin). */
    if (g->sms > 0)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &g->sms, sizeof g->sms);
    lt_check(g->b, cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda), "layout A");
    lt_check(g->b, cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb), "layout B");
    lt_check(g->b, cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, ldd), "layout D");
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes,
                                         sizeof g->ws_bytes);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    lt_check(g->b, cublasLtMatmulAlgoGetHeuristic(g->lt, op, la, lb, ld, ld, pref, 1, &h, &found),
             "AlgoGetHeuristic");
    if (!found) lt_check(g->b, CUBLAS_STATUS_NOT_SUPPORTED, "no cuBLASLt algorithm");
    float one = 1.0f, zero = 0.0f;
    lt_check(g->b, cublasLtMatmul(g->lt, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &h.algo, g->ws,
                                  g->ws_bytes, g->cs), "Matmul");
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

/* Row-major helpers over column-major GEMMs (see the header comment). */
static void fwd(gemm_t *g, int64_t M, int64_t d, const void *X, const void *W, void *Y)
{
    gemm(g, 1, 0, d, M, d, W, d, X, d, Y, d); /* Y[M,d] = X W^T */
}

static void dgrad(gemm_t *g, int64_t M, int64_t d, const void *dY, const void *W, void *dX)
{
    gemm(g, 0, 0, d, M, d, W, d, dY, d, dX, d); /* dX[M,d] = dY W */
}

static void wgrad(gemm_t *g, int64_t M, int64_t d, const void *dY, const void *X, void *dW, int64_t ld)
{
    gemm(g, 0, 1, d, d, M, X, d, dY, d, dW, ld); /* dW[d,d] = dY^T X */
}

enum { MODE_ETP, MODE_LOCAL, MODE_COMM };

typedef struct {
    int L, depth, update;
    int64_t d, M;
    etp_param_t **p;
    etp_chain_t *chain;
    void **act, **full, *dy, *dx, *gbuf;
    etp_stream_t *main;
} model_t;

static void step(bench_t *b, gemm_t *g, model_t *m, int mode)
{
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    if (mode != MODE_LOCAL) BENCH_CHECK(b, etp_zero_grad(m->chain, m->main));
    if (mode != MODE_LOCAL && m->update)
        for (int l = 0; l < m->L; l++) BENCH_CHECK(b, etp_param_mark_updated(m->p[l], m->main));
    for (int l = 0; l < m->L; l++) {
        const void *W = m->full[l];
        if (mode != MODE_LOCAL) {
            BENCH_CHECK(b, etp_gather(m->p[l], ETP_PASS_FORWARD, m->main, &v));
            W = v.data;
        }
        if (mode != MODE_COMM) fwd(g, m->M, m->d, m->act[l], W, m->act[l + 1]);
        if (mode != MODE_LOCAL) BENCH_CHECK(b, etp_release(m->p[l], ETP_PASS_FORWARD, m->main));
    }
    for (int l = m->L - 1; l >= 0; l--) {
        const void *W = m->full[l];
        if (mode != MODE_LOCAL) {
            BENCH_CHECK(b, etp_gather(m->p[l], ETP_PASS_BACKWARD, m->main, &v));
            W = v.data;
        }
        if (mode != MODE_COMM) dgrad(g, m->M, m->d, m->dy, W, m->dx);
        if (mode != MODE_LOCAL) BENCH_CHECK(b, etp_release(m->p[l], ETP_PASS_BACKWARD, m->main));
        void *dW = m->gbuf;
        if (mode != MODE_LOCAL) {
            BENCH_CHECK(b, etp_wgrad_buffer(m->p[l], m->main, &v));
            dW = v.data;
        }
        if (mode != MODE_COMM) wgrad(g, m->M, m->d, m->dy, m->act[l], dW, m->d);
        if (mode != MODE_LOCAL) BENCH_CHECK(b, etp_reduce_grad(m->p[l], m->main, 1.0f));
    }
    if (mode != MODE_LOCAL) BENCH_CHECK(b, etp_wait_grads(m->chain, m->main));
}

int etp_bench_chain(bench_t *b, int argc, char **argv)
{
    model_t m = {.L = 16, .depth = 1, .d = 8192, .M = 4096};
    int max_ctas = -1, gemm_sms = 0, loop = 1, pou = 0, defer = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc) m.L = atoi(argv[++i]);
        else if (strcmp(argv[i], "--d") == 0 && i + 1 < argc) m.d = atol(argv[++i]);
        else if (strcmp(argv[i], "--m") == 0 && i + 1 < argc) m.M = atol(argv[++i]);
        else if (strcmp(argv[i], "--depth") == 0 && i + 1 < argc) m.depth = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-ctas") == 0 && i + 1 < argc) max_ctas = atoi(argv[++i]);
        else if (strcmp(argv[i], "--gemm-sms") == 0 && i + 1 < argc) gemm_sms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--loop") == 0 && i + 1 < argc) loop = atoi(argv[++i]);
        else if (strcmp(argv[i], "--update") == 0) m.update = 1;
        else if (strcmp(argv[i], "--prefetch-on-update") == 0) pou = 1;
        else if (strcmp(argv[i], "--defer-zero") == 0) defer = 1;
        else {
            if (b->rank == 0) fprintf(stderr, "etp-bench chain: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (loop < 1) {
        if (b->rank == 0) fprintf(stderr, "etp-bench chain: --loop must be >= 1\n");
        return 2;
    }
    if (b->backend != ETP_BACKEND_CUDA) {
        if (b->rank == 0) fprintf(stderr, "etp-bench chain: needs the CUDA backend (a GPU)\n");
        return 2;
    }
    etp_group_t *world, *grp;
    BENCH_CHECK(b, etp_context_world(b->ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "etp";
    gc.num_roles = 2;
    gc.max_ctas = max_ctas;
    BENCH_CHECK(b, etp_group_split(world, 0, b->rank, &gc, &grp));
    BENCH_CHECK(b, etp_stream_create(b->ctx, ETP_STREAM_PRIORITY_NORMAL, &m.main));
    gemm_t g = {.b = b, .sms = gemm_sms, .ws_bytes = (size_t)32 << 20};
    BENCH_CHECK(b, etp_stream_get_cuda(m.main, &g.cs));
    lt_check(b, cublasLtCreate(&g.lt), "cublasLtCreate");
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, g.ws_bytes, ETP_MEM_WORKSPACE, &g.ws));

    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = grp;
    cc.depth = m.depth;
    cc.prefetch_on_update = pou;
    cc.defer_zero_grad = defer;
    BENCH_CHECK(b, etp_chain_create(b->ctx, &cc, &m.chain));
    m.p = calloc((size_t)m.L, sizeof *m.p);
    m.full = calloc((size_t)m.L, sizeof *m.full);
    m.act = calloc((size_t)m.L + 1, sizeof *m.act);
    size_t wbytes = (size_t)(m.d * m.d) * 2, abytes = (size_t)(m.M * m.d) * 2;
    for (int l = 0; l < m.L; l++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = grp;
        pc.rows = m.d;
        pc.cols = m.d;
        pc.dtype = ETP_DTYPE_BF16;
        BENCH_CHECK(b, etp_param_create(b->ctx, &pc, &m.p[l]));
        BENCH_CHECK(b, etp_chain_add(m.chain, m.p[l]));
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, wbytes, ETP_MEM_USER, &m.full[l]));
        BENCH_CHECK(b, etp_memset_async(m.main, m.full[l], 0x3c, wbytes)); /* small finite values */
    }
    BENCH_CHECK(b, etp_chain_finalize(m.chain));
    for (int l = 0; l <= m.L; l++) {
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, abytes, ETP_MEM_USER, &m.act[l]));
        BENCH_CHECK(b, etp_memset_async(m.main, m.act[l], 0x3c, abytes));
    }
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, abytes, ETP_MEM_USER, &m.dy));
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, abytes, ETP_MEM_USER, &m.dx));
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, wbytes, ETP_MEM_USER, &m.gbuf));
    BENCH_CHECK(b, etp_memset_async(m.main, m.dy, 0x3c, abytes));
    for (int l = 0; l < m.L; l++) BENCH_CHECK(b, etp_param_mark_updated(m.p[l], m.main));

    bench_timer_t *tm = bench_timer_create(b, m.main);
    double *t[3];
    for (int k = 0; k < 3; k++) t[k] = calloc((size_t)b->iters, sizeof(double));
    for (int it = -b->warmup; it < b->iters; it++)
        for (int mode = 0; mode < 3; mode++) {
            BENCH_CHECK(b, etp_stream_synchronize(m.main));
            MPI_Barrier(MPI_COMM_WORLD);
            bench_timer_start(tm);
            for (int k = 0; k < loop; k++) step(b, &g, &m, mode);
            bench_timer_stop(tm);
            double us = bench_timer_us(tm) / loop;
            if (it >= 0) t[mode][it] = us;
        }
    double us[3];
    for (int k = 0; k < 3; k++) us[k] = bench_max_over_ranks(bench_median(t[k], b->iters));
    char shape[96];
    snprintf(shape, sizeof shape, "L=%d d=%lld M=%lld dp%d cta%d sm%d loop%d%s%s%s", m.L, (long long)m.d,
             (long long)m.M, m.depth, max_ctas, gemm_sms, loop, m.update ? " upd" : "",
             pou ? " pou" : "", defer ? " dz" : "");
    double comm_bytes = 3.0 * (double)m.L * (double)wbytes * (double)(b->size - 1) / (double)b->size;
    bench_add(b, "chain step: local weights", shape, 0, us[MODE_LOCAL], 0);
    bench_add(b, "chain step: communication only", shape, comm_bytes, us[MODE_COMM], 0);
    bench_row_t *r = bench_add(b, "chain step: etp", shape, 0, us[MODE_ETP], 0);
    /* ratio column: the exposed share of the communication time */
    r->ratio = (us[MODE_ETP] - us[MODE_LOCAL]) / us[MODE_COMM];
    if (b->rank == 0)
        printf("exposed communication: (etp %.1f us - local %.1f us) / comm %.1f us = %.2f%%\n",
               us[MODE_ETP], us[MODE_LOCAL], us[MODE_COMM], 100.0 * r->ratio);
    bench_timer_destroy(tm);
    for (int k = 0; k < 3; k++) free(t[k]);
    etp_stream_t *ag, *rs;
    BENCH_CHECK(b, etp_chain_streams(m.chain, &ag, &rs));
    BENCH_CHECK(b, etp_stream_synchronize(ag));
    BENCH_CHECK(b, etp_stream_synchronize(rs));
    BENCH_CHECK(b, etp_stream_synchronize(m.main));
    BENCH_CHECK(b, etp_chain_destroy(m.chain));
    for (int l = 0; l < m.L; l++) {
        BENCH_CHECK(b, etp_param_destroy(m.p[l]));
        BENCH_CHECK(b, etp_mem_free(b->ctx, m.full[l]));
    }
    for (int l = 0; l <= m.L; l++) BENCH_CHECK(b, etp_mem_free(b->ctx, m.act[l]));
    BENCH_CHECK(b, etp_mem_free(b->ctx, m.dy));
    BENCH_CHECK(b, etp_mem_free(b->ctx, m.dx));
    BENCH_CHECK(b, etp_mem_free(b->ctx, m.gbuf));
    BENCH_CHECK(b, etp_mem_free(b->ctx, g.ws));
    cublasLtDestroy(g.lt);
    free(m.p);
    free(m.full);
    free(m.act);
    BENCH_CHECK(b, etp_stream_destroy(m.main));
    BENCH_CHECK(b, etp_group_destroy(grp));
    return 0;
}
#else
int etp_bench_chain(bench_t *b, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    if (b->rank == 0) fprintf(stderr, "etp-bench chain: needs the CUDA backend\n");
    return 2;
}
#endif
