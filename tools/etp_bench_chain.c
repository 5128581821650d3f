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
 *   etp-bench chain [--layers 16] [--d 8192] [--m 4096] [--depth 1] [--loop K] [...]
 *   (etp-bench chain --help: each option, from chain_opts below)
 *
 * A fourth variant, "local, FP32 grad acc", runs the local step with the
 * wgrad GEMM accumulating into an FP32 gradient (beta 1), as a local-weights
 * training step with FP32 gradient accumulation would; the exposure is also
 * printed against it.
 */
#include <stdlib.h>
#include <string.h>

#include "etp_bench.h"

typedef struct {
    long layers, d, m, depth, max_ctas, gemm_sms, loop;
    int update, prefetch_on_update, defer_zero, wgrad_first, main_high, no_join, stalls;
} chain_opts_t;

enum {
    O_LAYERS, O_D, O_M, O_DEPTH, O_MAX_CTAS, O_GEMM_SMS, O_LOOP, O_UPDATE, O_PREFETCH_ON_UPDATE,
    O_DEFER_ZERO, O_WGRAD_FIRST, O_MAIN_HIGH, O_NO_JOIN, O_STALLS
};
static const etp_cli_opt_t chain_opts[] = {
    [O_LAYERS] = {"layers", "N", "16", "layers, each a BF16 weight [d, d] sharded over the world"},
    [O_D] = {"d", "N", "8192", "the model dimension d"},
    [O_M] = {"m", "N", "4096", "tokens a rank (the GEMMs' M)"},
    [O_DEPTH] = {"depth", "N", "1", "the chain's prefetch depth"},
    [O_MAX_CTAS] = {"max-ctas", "N", NULL, "the etp group's NCCL CTA cap (default: NCCL's)"},
    [O_GEMM_SMS] = {"gemm-sms", "N", "0",
                    "the GEMMs use N SMs, leaving the rest to communication (0: all)"},
    [O_LOOP] = {"loop", "K", "1",
                "each sample runs K steps back to back, as a training loop does, and counts their "
                "mean (1: one step alone, whose first gather and last reduction are exposed by "
                "construction)"},
    [O_UPDATE] = {"update", NULL, NULL,
                  "mark every weight updated at each step's start, as after an optimizer step"},
    [O_PREFETCH_ON_UPDATE] = {"prefetch-on-update", NULL, NULL, "the chain's prefetch_on_update"},
    [O_DEFER_ZERO] = {"defer-zero", NULL, NULL,
                      "the chain's defer_zero_grad: no zeroing pass, each step's reduction "
                      "stores instead of adding"},
    [O_WGRAD_FIRST] = {"wgrad-first", NULL, NULL,
                       "each layer's wgrad GEMM and reduction before its dgrad"},
    [O_MAIN_HIGH] = {"main-high", NULL, NULL, "the GEMMs' stream at high priority"},
    [O_NO_JOIN] = {"no-join", NULL, NULL,
                   "wait_grads once per sample of --loop steps, not every step"},
    [O_STALLS] = {"stalls", NULL, NULL,
                  "then print, per step, how long the main stream waited in each kind of etp "
                  "call and spent in each kind of GEMM"},
    {NULL},
};

static const char chain_about[] =
    "How much communication a chain leaves exposed in a training step: L layers of BF16 weights "
    "[d, d] sharded over the world; a step runs every layer's forward GEMM, then in reverse the "
    "dgrad and wgrad GEMMs (cuBLASLt), with M tokens a rank. Timed as the median step: etp "
    "(gathers with prefetch, reduce_grad), local (the same GEMMs on local weights), comm (the "
    "etp calls without GEMMs), and local with FP32 gradient accumulation; exposed = (etp - "
    "local) / comm. CUDA backend only.";

static int run_chain(bench_t *b, const chain_opts_t *o);

int etp_bench_chain(bench_t *b, int argc, char **argv)
{
    chain_opts_t o = {.max_ctas = -1};
    etp_cli_t cli = bench_cli(b, "chain", chain_about, chain_opts, argc, argv);
    int key;
    while ((key = bench_next(b, &cli)) >= 0) {
        int bad = 0;
        switch (key) {
        case O_LAYERS: bad = bench_long(b, cli.opt, cli.arg, 1, 4096, &o.layers); break;
        case O_D: bad = bench_long(b, cli.opt, cli.arg, 1, 1L << 20, &o.d); break;
        case O_M: bad = bench_long(b, cli.opt, cli.arg, 1, 1L << 24, &o.m); break;
        case O_DEPTH: bad = bench_long(b, cli.opt, cli.arg, 0, 64, &o.depth); break;
        case O_MAX_CTAS: bad = bench_long(b, cli.opt, cli.arg, -1, 1 << 20, &o.max_ctas); break;
        case O_GEMM_SMS: bad = bench_long(b, cli.opt, cli.arg, 0, 1 << 16, &o.gemm_sms); break;
        case O_LOOP: bad = bench_long(b, cli.opt, cli.arg, 1, 1 << 16, &o.loop); break;
        case O_UPDATE: o.update = 1; break;
        case O_PREFETCH_ON_UPDATE: o.prefetch_on_update = 1; break;
        case O_DEFER_ZERO: o.defer_zero = 1; break;
        case O_WGRAD_FIRST: o.wgrad_first = 1; break;
        case O_MAIN_HIGH: o.main_high = 1; break;
        case O_NO_JOIN: o.no_join = 1; break;
        case O_STALLS: o.stalls = 1; break;
        }
        if (bad) return 2;
    }
    if (key != ETP_CLI_END) return bench_stop(key);
    bench_start(b);
    if (b->backend != ETP_BACKEND_CUDA) {
        if (b->rank == 0) fprintf(stderr, "etp-bench chain: needs the CUDA backend (a GPU)\n");
        return 2;
    }
    return run_chain(b, &o);
}

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

/* Column-major D[m, n] = op(A) op(B) + beta D, BF16 in, D BF16 (or FP32
 * when d32), FP32 accumulate. */
static void gemm(gemm_t *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                 int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, int d32, float beta)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_check(g->b, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    lt_check(g->b, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "cublasLtMatmulDescSetAttribute");
    lt_check(g->b, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "cublasLtMatmulDescSetAttribute");
    /* Leave SMs to the collectives running beside the GEMM (an SM margin). */
    if (g->sms > 0)
        lt_check(g->b, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &g->sms, sizeof g->sms), "cublasLtMatmulDescSetAttribute");
    lt_check(g->b, cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda), "layout A");
    lt_check(g->b, cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb), "layout B");
    lt_check(g->b, cublasLtMatrixLayoutCreate(&ld, d32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldd), "layout D");
    cublasLtMatmulPreference_t pref;
    lt_check(g->b, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    lt_check(g->b,
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes,
                                                  sizeof g->ws_bytes),
             "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    lt_check(g->b, cublasLtMatmulAlgoGetHeuristic(g->lt, op, la, lb, ld, ld, pref, 1, &h, &found),
             "AlgoGetHeuristic");
    if (!found) lt_check(g->b, CUBLAS_STATUS_NOT_SUPPORTED, "no cuBLASLt algorithm");
    float one = 1.0f;
    lt_check(g->b, cublasLtMatmul(g->lt, op, &one, A, la, B, lb, &beta, D, ld, D, ld, &h.algo, g->ws,
                                  g->ws_bytes, g->cs), "Matmul");
    lt_check(g->b, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
    lt_check(g->b, cublasLtMatrixLayoutDestroy(la), "cublasLtMatrixLayoutDestroy");
    lt_check(g->b, cublasLtMatrixLayoutDestroy(lb), "cublasLtMatrixLayoutDestroy");
    lt_check(g->b, cublasLtMatrixLayoutDestroy(ld), "cublasLtMatrixLayoutDestroy");
    lt_check(g->b, cublasLtMatmulDescDestroy(op), "cublasLtMatmulDescDestroy");
}

/* Row-major helpers over column-major GEMMs (see the header comment). */
static void fwd(gemm_t *g, int64_t M, int64_t d, const void *X, const void *W, void *Y)
{
    gemm(g, 1, 0, d, M, d, W, d, X, d, Y, d, 0, 0.0f); /* Y[M,d] = X W^T */
}

static void dgrad(gemm_t *g, int64_t M, int64_t d, const void *dY, const void *W, void *dX)
{
    gemm(g, 0, 0, d, M, d, W, d, dY, d, dX, d, 0, 0.0f); /* dX[M,d] = dY W */
}

/* dW[d,d] = dY^T X, BF16; or, acc32, dW (FP32) += dY^T X, the gradient
 * accumulation a local-weights step does in the GEMM's epilogue. */
static void wgrad(gemm_t *g, int64_t M, int64_t d, const void *dY, const void *X, void *dW, int64_t ld,
                  int acc32)
{
    gemm(g, 0, 1, d, d, M, X, d, dY, d, dW, ld, acc32, acc32 ? 1.0f : 0.0f);
}

/* MODE_LOCAL_ACC: weights local, and the wgrad GEMM accumulates into an
 * FP32 gradient of the full weight (beta 1), as a local-weights training
 * step with FP32 gradient accumulation does; MODE_LOCAL discards a BF16
 * wgrad, the lower bound. */
enum { MODE_ETP, MODE_LOCAL, MODE_COMM, MODE_LOCAL_ACC, NMODES };

/* --stalls: events around every call that can make the main stream wait
 * (the gathers, the wgrad buffer, the join) and around every GEMM, in a
 * few extra steps after the timed ones. */
enum { PR_GATHER_F, PR_GATHER_B, PR_WBUF, PR_JOIN, PR_GEMM_F, PR_GEMM_D, PR_GEMM_W, PR_N };
typedef struct {
    bench_t *b;
    cudaStream_t cs;
    int n, cap;
    cudaEvent_t *ev; /* pairs */
    int *kind;
} probe_t;

static void pr_mark(probe_t *pr, int kind, int end)
{
    if (!pr || pr->n >= pr->cap) return;
    BENCH_CUDA(pr->b, cudaEventRecord(pr->ev[2 * pr->n + end], pr->cs));
    if (end) pr->kind[pr->n++] = kind;
}

typedef struct {
    int L, depth, update, wgrad_first, no_join;
    int64_t d, M;
    etp_param_t **p;
    etp_chain_t *chain;
    void **act, **full, *dy, *dx, *gbuf, *gacc;
    probe_t *pr; /* --stalls, else NULL */
    etp_stream_t *main;
} model_t;

/* Layer l's weight for `pass`: the full local copy, or etp's gather (its
 * wait probed as `kind`). */
static const void *weight_of(bench_t *b, model_t *m, int l, etp_pass_t pass, int local, int kind)
{
    if (local) return m->full[l];
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    pr_mark(m->pr, kind, 0);
    BENCH_CHECK(b, etp_gather(m->p[l], pass, m->main, &v));
    pr_mark(m->pr, kind, 1);
    return v.data;
}

static void step(bench_t *b, gemm_t *g, model_t *m, int mode)
{
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    const int local = mode == MODE_LOCAL || mode == MODE_LOCAL_ACC;
    probe_t *pr = m->pr;
    if (!local) BENCH_CHECK(b, etp_zero_grad(m->chain, m->main));
    if (!local && m->update)
        for (int l = 0; l < m->L; l++) BENCH_CHECK(b, etp_param_mark_updated(m->p[l], m->main));
    for (int l = 0; l < m->L; l++) {
        const void *W = weight_of(b, m, l, ETP_PASS_FORWARD, local, PR_GATHER_F);
        pr_mark(pr, PR_GEMM_F, 0);
        if (mode != MODE_COMM) fwd(g, m->M, m->d, m->act[l], W, m->act[l + 1]);
        pr_mark(pr, PR_GEMM_F, 1);
        if (!local) BENCH_CHECK(b, etp_release(m->p[l], ETP_PASS_FORWARD, m->main));
    }
    for (int l = m->L - 1; l >= 0; l--) {
        for (int part = 0; part < 2; part++) {
            if ((part == 0) == (m->wgrad_first != 0)) {
                void *dW = mode == MODE_LOCAL_ACC ? m->gacc : m->gbuf;
                if (!local) {
                    pr_mark(pr, PR_WBUF, 0);
                    BENCH_CHECK(b, etp_wgrad_buffer(m->p[l], m->main, &v));
                    pr_mark(pr, PR_WBUF, 1);
                    dW = v.data;
                }
                pr_mark(pr, PR_GEMM_W, 0);
                if (mode != MODE_COMM)
                    wgrad(g, m->M, m->d, m->dy, m->act[l], dW, m->d, mode == MODE_LOCAL_ACC);
                pr_mark(pr, PR_GEMM_W, 1);
                if (!local) BENCH_CHECK(b, etp_reduce_grad(m->p[l], m->main, 1.0f));
            } else {
                const void *W = weight_of(b, m, l, ETP_PASS_BACKWARD, local, PR_GATHER_B);
                pr_mark(pr, PR_GEMM_D, 0);
                if (mode != MODE_COMM) dgrad(g, m->M, m->d, m->dy, W, m->dx);
                pr_mark(pr, PR_GEMM_D, 1);
                if (!local) BENCH_CHECK(b, etp_release(m->p[l], ETP_PASS_BACKWARD, m->main));
            }
        }
    }
    if (!local && !m->no_join) {
        pr_mark(pr, PR_JOIN, 0);
        BENCH_CHECK(b, etp_wait_grads(m->chain, m->main));
        pr_mark(pr, PR_JOIN, 1);
    }
}

/* Per step and kind: the mean time between the events around the calls of
 * that kind, over `steps` steps of `mode` run back to back; the slowest
 * rank's mean (a stall on one rank holds up the step's collectives on all). */
static void probe_steps(bench_t *b, gemm_t *g, model_t *m, int mode, int steps)
{
    static const char *names[PR_N] = {"gather fwd wait", "gather bwd wait", "wgrad buffer wait",
                                      "join (wait_grads)", "GEMM fwd", "GEMM dgrad", "GEMM wgrad"};
    probe_t pr = {.b = b, .cs = g->cs, .cap = steps * (6 * m->L + 2)};
    pr.ev = calloc((size_t)pr.cap * 2, sizeof *pr.ev);
    pr.kind = calloc((size_t)pr.cap, sizeof *pr.kind);
    if (!pr.ev || !pr.kind) {
        fprintf(stderr, "etp-bench rank %d: out of host memory for --stalls\n", b->rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < 2 * pr.cap; i++) BENCH_CUDA(b, cudaEventCreate(&pr.ev[i]));
    BENCH_CHECK(b, etp_stream_synchronize(m->main));
    MPI_Barrier(MPI_COMM_WORLD);
    m->pr = &pr;
    for (int k = 0; k < steps; k++) step(b, g, m, mode);
    m->pr = NULL;
    BENCH_CHECK(b, etp_stream_synchronize(m->main));
    double sum[PR_N] = {0};
    for (int i = 0; i < pr.n; i++) {
        float ms = 0;
        BENCH_CUDA(b, cudaEventElapsedTime(&ms, pr.ev[2 * i], pr.ev[2 * i + 1]));
        sum[pr.kind[i]] += 1e3 * ms;
    }
    MPI_Allreduce(MPI_IN_PLACE, sum, PR_N, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (b->rank == 0)
        for (int k = 0; k < PR_N; k++)
            if (sum[k] > 0)
                printf("stalls %-5s %-20s %10.1f us a step\n", mode == MODE_ETP ? "etp" : "local", names[k],
                       sum[k] / steps);
    for (int i = 0; i < 2 * pr.cap; i++) BENCH_CUDA(b, cudaEventDestroy(pr.ev[i]));
    free(pr.ev);
    free(pr.kind);
}

static int run_chain(bench_t *b, const chain_opts_t *o)
{
    model_t m = {.L = (int)o->layers, .depth = (int)o->depth, .d = o->d, .M = o->m,
                 .update = o->update, .wgrad_first = o->wgrad_first, .no_join = o->no_join};
    const int max_ctas = (int)o->max_ctas, gemm_sms = (int)o->gemm_sms, loop = (int)o->loop,
              pou = o->prefetch_on_update, defer = o->defer_zero, main_high = o->main_high,
              stalls = o->stalls;
    etp_group_t *world, *grp;
    BENCH_CHECK(b, etp_context_world(b->ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "etp";
    gc.num_roles = 2;
    gc.max_ctas = max_ctas;
    BENCH_CHECK(b, etp_group_split(world, 0, b->rank, &gc, &grp));
    BENCH_CHECK(b, etp_stream_create(b->ctx, main_high ? ETP_STREAM_PRIORITY_HIGH : ETP_STREAM_PRIORITY_NORMAL,
                                     &m.main));
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
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, 2 * wbytes, ETP_MEM_USER, &m.gacc));
    BENCH_CHECK(b, etp_memset_async(m.main, m.gacc, 0, 2 * wbytes));
    BENCH_CHECK(b, etp_memset_async(m.main, m.dy, 0x3c, abytes));
    for (int l = 0; l < m.L; l++) BENCH_CHECK(b, etp_param_mark_updated(m.p[l], m.main));

    bench_timer_t *tm = bench_timer_create(b, m.main);
    double *t[NMODES];
    for (int k = 0; k < NMODES; k++) t[k] = calloc((size_t)b->iters, sizeof(double));
    for (int it = -b->warmup; it < b->iters; it++)
        for (int mode = 0; mode < NMODES; mode++) {
            BENCH_CHECK(b, etp_stream_synchronize(m.main));
            MPI_Barrier(MPI_COMM_WORLD);
            bench_timer_start(tm);
            for (int k = 0; k < loop; k++) step(b, &g, &m, mode);
            if (m.no_join && mode != MODE_LOCAL && mode != MODE_LOCAL_ACC)
                BENCH_CHECK(b, etp_wait_grads(m.chain, m.main));
            bench_timer_stop(tm);
            double us = bench_timer_us(tm) / loop;
            if (it >= 0) t[mode][it] = us;
        }
    double us[NMODES];
    for (int k = 0; k < NMODES; k++) us[k] = bench_max_over_ranks(bench_median(t[k], b->iters));
    char shape[96];
    snprintf(shape, sizeof shape, "L=%d d=%lld M=%lld dp%d cta%d sm%d loop%d%s%s%s%s%s", m.L, (long long)m.d,
             (long long)m.M, m.depth, max_ctas, gemm_sms, loop, m.update ? " upd" : "",
             pou ? " pou" : "", defer ? " dz" : "", m.wgrad_first ? " wf" : "", main_high ? " mh" : "");
    double comm_bytes = 3.0 * (double)m.L * (double)wbytes * (double)(b->size - 1) / (double)b->size;
    bench_add(b, "chain step: local weights", shape, 0, us[MODE_LOCAL], 0);
    bench_add(b, "chain step: local, FP32 grad acc", shape, 0, us[MODE_LOCAL_ACC], 0);
    bench_add(b, "chain step: communication only", shape, comm_bytes, us[MODE_COMM], 0);
    bench_row_t *r = bench_add(b, "chain step: etp", shape, 0, us[MODE_ETP], 0);
    /* ratio column: the exposed share of the communication time */
    r->ratio = (us[MODE_ETP] - us[MODE_LOCAL]) / us[MODE_COMM];
    if (b->rank == 0) {
        printf("exposed communication: (etp %.1f us - local %.1f us) / comm %.1f us = %.2f%%\n",
               us[MODE_ETP], us[MODE_LOCAL], us[MODE_COMM], 100.0 * r->ratio);
        printf("against local weights with FP32 gradient accumulation: (etp - %.1f us) / comm = %.2f%%\n",
               us[MODE_LOCAL_ACC], 100.0 * (us[MODE_ETP] - us[MODE_LOCAL_ACC]) / us[MODE_COMM]);
    }
    if (stalls) {
        probe_steps(b, &g, &m, MODE_ETP, 4);
        probe_steps(b, &g, &m, MODE_LOCAL, 4);
    }
    bench_timer_destroy(tm);
    for (int k = 0; k < NMODES; k++) free(t[k]);
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
    BENCH_CHECK(b, etp_mem_free(b->ctx, m.gacc));
    BENCH_CHECK(b, etp_mem_free(b->ctx, g.ws));
    lt_check(b, cublasLtDestroy(g.lt), "cublasLtDestroy");
    free(m.p);
    free(m.full);
    free(m.act);
    BENCH_CHECK(b, etp_stream_destroy(m.main));
    BENCH_CHECK(b, etp_group_destroy(grp));
    return 0;
}
#else
static int run_chain(bench_t *b, const chain_opts_t *o)
{
    (void)o;
    if (b->rank == 0) fprintf(stderr, "etp-bench chain: needs the CUDA backend\n");
    return 2;
}
#endif
