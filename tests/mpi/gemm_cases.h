/*
 * The checked GEMM cases of tests/mpi/test_gemm.c (host backend) and
 * tests/gpu/test_gemm_gpu.c (CUDA backend): random layouts (PACKED with
 * empty experts, one-row experts and counts that are not multiples of 16;
 * FIXED_SLOTS; DENSE), all three products, BF16 and FP32 outputs, beta 0
 * and 1, weights with padded rows; PACKED also with up to 15 experts and
 * captured into a graph. Every output is poisoned first and
 * compared with a double-precision reference computed here, on fresh
 * random BF16 data of the printed seed. What the library must not write
 * (rows outside every PACKED block, weight row padding) must still hold
 * its poison.
 *
 * Tolerance: the library sums in FP32 in an order of its own, so an
 * element may differ from the exact sum by the FP32 rounding of each
 * partial sum, at most about (terms) x 2^-24 x sum|terms|. An element
 * passes when |got - exact| <= GEMM_TOL x sum|terms| (+ 1 BF16 ulp of the
 * exact value for BF16 outputs, its one rounding). The includer sets
 * GEMM_TOL: 1e-5 on the host (inner dimensions here are at most 96:
 * 96 x 2^-24 < 6e-6), 1e-4 for cuBLASLt.
 */
#ifndef ETP_TEST_GEMM_CASES_H
#define ETP_TEST_GEMM_CASES_H

#include <math.h>

#include "mpi_util.h"

#ifndef GEMM_TOL
#error "define GEMM_TOL before including gemm_cases.h"
#endif
/* BF16 dW with beta 1: extra roundings of the product allowed (0: none) */
#ifndef GEMM_BETA_ROUNDINGS
#define GEMM_BETA_ROUNDINGS 0
#endif
/* n, k and weight ld are multiples of this (1: any) */
#ifndef GEMM_NK_ALIGN
#define GEMM_NK_ALIGN 1
#endif

/* BF16 bits of a random value: both signs, exponents 2^-6 .. 2^1, every
 * mantissa. Written here, not taken from the library. */
static uint16_t g_bf16(uint64_t seed, uint64_t a, uint64_t i)
{
    const uint64_t r = tu_rand(seed, a, 77, i);
    const uint16_t sign = (uint16_t)((r >> 63) << 15);
    const uint16_t exp = (uint16_t)(127 - 6 + (int)((r >> 8) % 8));
    return (uint16_t)(sign | (exp << 7) | (r & 0x7f));
}

static double g_bf16_val(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double g_out_val(const void *p, etp_dtype_t dt, int64_t i)
{
    if (dt == ETP_DTYPE_F32) return ((const float *)p)[i];
    return g_bf16_val(((const uint16_t *)p)[i]);
}

/* one BF16 ulp at |v| (v != 0): 2^(exponent - 7) */
static double g_bf16_ulp(double v)
{
    int e;
    if (v == 0.0) return 0.0;
    frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 7);
}

/* A FIXED_SLOTS forward's output y [E][S][N] (BF16, in host memory) against
 * x [E][S][K] and w [E][N][K]; `launch` names the graph launch checked. */
static void g_check_fixed_forward(const uint16_t *x, const uint16_t *w, const uint16_t *y, int E,
                                  int S, int N, int K, uint64_t launch)
{
    for (int e = 0; e < E; e++)
        for (int i = 0; i < S; i++)
            for (int j = 0; j < N; j++) {
                double ref = 0.0, mag = 0.0;
                for (int t = 0; t < K; t++) {
                    const double p = g_bf16_val(x[(e * S + i) * K + t]) *
                                     g_bf16_val(w[(e * N + j) * K + t]);
                    ref += p;
                    mag += fabs(p);
                }
                const double got = g_bf16_val(y[(e * S + i) * N + j]);
                if (!(fabs(got - ref) <= GEMM_TOL * mag + g_bf16_ulp(ref)))
                    fail_msg("launch %llu expert %d row %d col %d: got %.9g, expected %.9g",
                             (unsigned long long)launch, e, i, j, got, ref);
            }
}

typedef struct {
    etp_gemm_layout_t layout;
    etp_gemm_op_t op;
    etp_dtype_t out;
    float beta;
    int64_t experts, n, k, ld; /* ld: weight row stride (>= k) */
    int64_t slots;             /* FIXED_SLOTS: S */
    uint64_t tag;              /* names this case's random streams */
    /* 1: the run is captured into a graph, which is launched twice: on the
     * buffers before the inputs are copied in, then (the checked launch)
     * after */
    int graph;
    int32_t max_count;     /* PACKED: counts 0 .. max_count (0: 40) */
    const int32_t *counts; /* PACKED: these counts instead (experts of them) */
} gcase_t;

/* The row space of a case: per expert [offsets[e], offsets[e] + counts[e]),
 * total rows R. */
typedef struct {
    int64_t rows;
    int32_t counts[16], offsets[17];
} glayout_t;

static void g_make_layout(const gcase_t *c, glayout_t *L)
{
    memset(L, 0, sizeof *L);
    if (c->layout == ETP_GEMM_DENSE) {
        L->counts[0] = (int32_t)(1 + tu_rand(g_seed, c->tag, 1, 0) % 70);
        L->offsets[1] = L->counts[0];
        L->rows = L->counts[0];
        return;
    }
    if (c->layout == ETP_GEMM_FIXED_SLOTS) {
        for (int64_t e = 0; e < c->experts; e++) {
            L->counts[e] = (int32_t)c->slots;
            L->offsets[e] = (int32_t)(e * c->slots);
        }
        L->offsets[c->experts] = (int32_t)(c->experts * c->slots);
        L->rows = c->experts * c->slots;
        return;
    }
    /* PACKED: expert 0 empty, expert 1 one row, the rest 0 .. max_count rows
     * (mostly not multiples of 16), blocks padded to 8 rows like an EP
     * layer's alignment, and slack rows after the last block */
    int64_t off = 0;
    for (int64_t e = 0; e < c->experts; e++) {
        const uint64_t top = c->max_count ? (uint64_t)c->max_count : 40;
        int32_t cnt = c->counts ? c->counts[e]
                      : e == 0  ? 0
                      : e == 1  ? 1
                                : (int32_t)(tu_rand(g_seed, c->tag, 2, (uint64_t)e) % (top + 1));
        L->counts[e] = cnt;
        L->offsets[e] = (int32_t)off;
        off += (cnt + 7) / 8 * 8;
    }
    L->offsets[c->experts] = (int32_t)off;
    L->rows = off + 5;
}

/* Run one case on ctx (streams s0 for the copies, s1 for the GEMM, joined
 * by events, so that a host backend in shuffle mode checks the order) and
 * check every element. Returns the number of bad elements. */
static int64_t g_run_case(etp_context_t *ctx, etp_stream_t *s0, etp_stream_t *s1, const gcase_t *c)
{
    glayout_t L;
    g_make_layout(c, &L);
    const int64_t E = c->experts, N = c->n, K = c->k, LD = c->ld, R = L.rows;
    const int64_t wstride = N * LD + 8; /* experts not back to back */
    const int64_t welems = (E - 1) * wstride + N * LD;
    const etp_dtype_t od = c->out;
    const size_t osz = etp_dtype_size(od);
    const int wg = c->op == ETP_GEMM_WGRAD;

    uint16_t *hx = malloc((size_t)(R * K) * 2), *hdy = malloc((size_t)(R * N) * 2);
    uint16_t *hw = malloc((size_t)welems * 2);
    const int64_t out_elems = wg ? welems : c->op == ETP_GEMM_FORWARD ? R * N : R * K;
    unsigned char *hout0 = malloc((size_t)out_elems * osz), *hout = malloc((size_t)out_elems * osz);
    assert_non_null(hx);
    assert_non_null(hdy);
    assert_non_null(hw);
    assert_non_null(hout0);
    assert_non_null(hout);
    for (int64_t i = 0; i < R * K; i++) hx[i] = g_bf16(g_seed, c->tag, 10 + (uint64_t)i * 3);
    for (int64_t i = 0; i < R * N; i++) hdy[i] = g_bf16(g_seed, c->tag, 11 + (uint64_t)i * 3);
    for (int64_t i = 0; i < welems; i++) hw[i] = g_bf16(g_seed, c->tag, 12 + (uint64_t)i * 3);
    /* the output's starting contents: poison, or (wgrad, beta 1) random
     * values the products add to, with poison in the padding */
    tu_poison(hout0, (size_t)out_elems * osz);
    if (wg && c->beta == 1.0f)
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < N; j++)
                for (int64_t t = 0; t < K; t++) {
                    const int64_t o = e * wstride + j * LD + t;
                    const uint16_t b = g_bf16(g_seed, c->tag, 13 + (uint64_t)o * 3);
                    if (od == ETP_DTYPE_F32)
                        ((float *)hout0)[o] = (float)g_bf16_val(b);
                    else
                        ((uint16_t *)hout0)[o] = b;
                }

    void *dx, *ddy, *dw, *dout;
    ETP_OK(etp_mem_alloc(ctx, (size_t)(R * K) * 2, ETP_MEM_USER, &dx));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(R * N) * 2, ETP_MEM_USER, &ddy));
    ETP_OK(etp_mem_alloc(ctx, (size_t)welems * 2, ETP_MEM_USER, &dw));
    ETP_OK(etp_mem_alloc(ctx, (size_t)out_elems * osz, ETP_MEM_USER, &dout));
    etp_gemm_config_t cfg = ETP_GEMM_CONFIG_INIT;
    cfg.name = "case";
    cfg.op = c->op;
    cfg.layout = c->layout;
    cfg.experts = E;
    cfg.rows = c->layout == ETP_GEMM_FIXED_SLOTS ? c->slots : R;
    cfg.n = N;
    cfg.k = K;
    cfg.weight_ld = LD;
    cfg.weight_expert_stride = wstride;
    cfg.out_dtype = od;
    etp_gemm_plan_t *plan;
    ETP_OK(etp_gemm_plan_create(ctx, &cfg, &plan));

    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    v.dtype = wg ? od : ETP_DTYPE_BF16;
    v.data = wg ? dout : dw;
    v.experts = E;
    v.rows = N;
    v.cols = K;
    v.ld = LD;
    v.expert_stride = wstride;
    etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
    if (c->op != ETP_GEMM_DGRAD) a.x = dx;
    if (c->op != ETP_GEMM_FORWARD) a.dy = ddy;
    if (wg)
        a.dw = &v;
    else
        a.w = &v;
    if (c->op == ETP_GEMM_FORWARD) a.y = dout;
    if (c->op == ETP_GEMM_DGRAD) a.dx = dout;
    a.beta = c->beta;
    if (c->layout == ETP_GEMM_PACKED) {
        a.counts = L.counts;
        a.offsets = L.offsets;
    }
    etp_event_t *ev;
    ETP_OK(etp_event_create(ctx, &ev));
    etp_graph_t *graph = NULL;
    if (c->graph) {
        /* the first launch reads poison, and writes what the copies below
         * overwrite */
        size_t in_max = (size_t)(R * K) * 2;
        if ((size_t)(R * N) * 2 > in_max) in_max = (size_t)(R * N) * 2;
        if ((size_t)welems * 2 > in_max) in_max = (size_t)welems * 2;
        unsigned char *hp = malloc(in_max);
        assert_non_null(hp);
        tu_poison(hp, in_max);
        ETP_OK(etp_memcpy_async(s1, dx, hp, (size_t)(R * K) * 2));
        ETP_OK(etp_memcpy_async(s1, ddy, hp, (size_t)(R * N) * 2));
        ETP_OK(etp_memcpy_async(s1, dw, hp, (size_t)welems * 2));
        ETP_OK(etp_memcpy_async(s1, dout, hout0, (size_t)out_elems * osz));
        ETP_OK(etp_stream_synchronize(s1));
        free(hp);
        ETP_OK(etp_stream_begin_capture(s1));
        ETP_OK(etp_gemm_run(plan, &a, s1));
        ETP_OK(etp_stream_end_capture(s1, &graph));
        /* the copies wait for the launch on the poison */
        ETP_OK(etp_graph_launch(graph, s1));
        ETP_OK(etp_event_record(ev, s1));
        ETP_OK(etp_stream_wait_event(s0, ev));
    }
    ETP_OK(etp_memcpy_async(s0, dx, hx, (size_t)(R * K) * 2));
    ETP_OK(etp_memcpy_async(s0, ddy, hdy, (size_t)(R * N) * 2));
    ETP_OK(etp_memcpy_async(s0, dw, hw, (size_t)welems * 2));
    ETP_OK(etp_memcpy_async(s0, dout, hout0, (size_t)out_elems * osz));
    ETP_OK(etp_event_record(ev, s0));
    ETP_OK(etp_stream_wait_event(s1, ev));
    if (graph)
        ETP_OK(etp_graph_launch(graph, s1));
    else
        ETP_OK(etp_gemm_run(plan, &a, s1));
    ETP_OK(etp_event_record(ev, s1));
    ETP_OK(etp_stream_wait_event(s0, ev));
    tu_poison(hout, (size_t)out_elems * osz);
    ETP_OK(etp_memcpy_async(s0, hout, dout, (size_t)out_elems * osz));
    ETP_OK(etp_stream_synchronize(s0));
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_graph_destroy(graph));
    ETP_OK(etp_gemm_plan_destroy(plan));

    /* which rows of the row space belong to an expert, and to which */
    int64_t bad = 0, checked = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = L.offsets[e], m = L.counts[e];
        const uint16_t *W = hw + e * wstride;
        if (!wg) {
            const int64_t cols = c->op == ETP_GEMM_FORWARD ? N : K;
            for (int64_t i = r0; i < r0 + m; i++)
                for (int64_t j = 0; j < cols; j++) {
                    double ref = 0.0, mag = 0.0;
                    if (c->op == ETP_GEMM_FORWARD)
                        for (int64_t t = 0; t < K; t++) {
                            const double p = g_bf16_val(hx[i * K + t]) * g_bf16_val(W[j * LD + t]);
                            ref += p;
                            mag += fabs(p);
                        }
                    else
                        for (int64_t t = 0; t < N; t++) {
                            const double p = g_bf16_val(hdy[i * N + t]) * g_bf16_val(W[t * LD + j]);
                            ref += p;
                            mag += fabs(p);
                        }
                    const double got = g_out_val(hout, od, i * cols + j);
                    const double tol = GEMM_TOL * mag +
                                       (od == ETP_DTYPE_BF16 ? g_bf16_ulp(ref) : 0.0);
                    checked++;
                    if (!(fabs(got - ref) <= tol)) {
                        if (bad < 5)
                            print_error("expert %lld row %lld col %lld: got %.9g, expected %.9g "
                                        "(tol %.3g)\n",
                                        (long long)e, (long long)i, (long long)j, got, ref, tol);
                        bad++;
                    }
                }
        } else {
            for (int64_t j = 0; j < N; j++)
                for (int64_t t = 0; t < K; t++) {
                    const int64_t o = e * wstride + j * LD + t;
                    const double old = c->beta == 1.0f ? g_out_val(hout0, od, o) : 0.0;
                    double ref = old, mag = fabs(ref);
                    for (int64_t i = r0; i < r0 + m; i++) {
                        const double p = g_bf16_val(hdy[i * N + j]) * g_bf16_val(hx[i * K + t]);
                        ref += p;
                        mag += fabs(p);
                    }
                    const double got = g_out_val(hout, od, o);
                    /* BF16 out with beta 1: cuBLASLt's small-tile kernels may
                     * round the product to BF16 before adding the old value
                     * (seen on H200: algo 66, 32x64 tiles), a second rounding */
                    double tol = GEMM_TOL * mag + (od == ETP_DTYPE_BF16 ? g_bf16_ulp(ref) : 0.0);
                    if (od == ETP_DTYPE_BF16 && c->beta == 1.0f)
                        tol += GEMM_BETA_ROUNDINGS * g_bf16_ulp(ref - old);
                    checked++;
                    if (!(fabs(got - ref) <= tol)) {
                        if (bad < 5)
                            print_error("dW expert %lld [%lld, %lld] (rows %lld): got %.9g, "
                                        "expected %.9g (tol %.3g)\n",
                                        (long long)e, (long long)j, (long long)t, (long long)m, got,
                                        ref, tol);
                        bad++;
                    }
                }
        }
    }
    /* what must be untouched: rows outside the blocks (forward, dgrad) or
     * the padding of dW */
    const int64_t cols = c->op == ETP_GEMM_FORWARD ? N : K;
    for (int64_t o = 0; o < out_elems; o++) {
        int inside = 0;
        if (!wg) {
            const int64_t i = o / cols;
            for (int64_t e = 0; e < E && !inside; e++)
                inside = i >= L.offsets[e] && i < L.offsets[e] + L.counts[e];
        } else {
            const int64_t e = o / wstride, r = o % wstride;
            inside = r < N * LD && r % LD < K && e < E;
        }
        if (!inside && memcmp(hout + o * (int64_t)osz, hout0 + o * (int64_t)osz, osz) != 0) {
            if (bad < 5)
                print_error("element %lld outside the products was written\n", (long long)o);
            bad++;
        }
    }
    assert_true(checked > 0 || c->layout == ETP_GEMM_PACKED);

    ETP_OK(etp_mem_free(ctx, dx));
    ETP_OK(etp_mem_free(ctx, ddy));
    ETP_OK(etp_mem_free(ctx, dw));
    ETP_OK(etp_mem_free(ctx, dout));
    free(hx);
    free(hdy);
    free(hw);
    free(hout0);
    free(hout);
    return bad;
}

/* Run case c; fail the cmocka test, naming the case, on a bad element. */
static void g_run_checked(etp_context_t *ctx, etp_stream_t *s0, etp_stream_t *s1, const gcase_t *c)
{
    const char *lname[] = {"dense", "fixed_slots", "packed"};
    const char *oname[] = {"forward", "dgrad", "wgrad"};
    const int64_t bad = g_run_case(ctx, s0, s1, c);
    if (bad)
        fail_msg("%s %s%s, %s out, beta %g, experts %lld, n %lld, k %lld, ld %lld, slots %lld: "
                 "%lld bad element(s)",
                 lname[c->layout], oname[c->op], c->graph ? " (graph)" : "",
                 c->out == ETP_DTYPE_F32 ? "f32" : "bf16", (double)c->beta, (long long)c->experts,
                 (long long)c->n, (long long)c->k, (long long)c->ld, (long long)c->slots,
                 (long long)bad);
}

/* Random n, k and weight ld of case c: small, odd or even, not multiples
 * of 16 */
static void g_random_nk(gcase_t *c)
{
    const int64_t al = GEMM_NK_ALIGN;
    c->n = (8 + (int64_t)(tu_rand(g_seed, c->tag, 4, 0) % 89)) / al * al;
    c->k = (8 + (int64_t)(tu_rand(g_seed, c->tag, 5, 0) % 89)) / al * al;
    c->ld = c->k + (int64_t)(tu_rand(g_seed, c->tag, 6, 0) % 3) * 8;
}

/* Every combination on ctx; fails the cmocka test on the first bad case.
 * Then PACKED with 9 to 15 experts (more than a few run at once), each
 * product run directly and captured into a graph. */
static void g_run_all(etp_context_t *ctx)
{
    etp_stream_t *s0, *s1;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s0));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s1));
    const etp_gemm_layout_t layouts[] = {ETP_GEMM_DENSE, ETP_GEMM_FIXED_SLOTS, ETP_GEMM_PACKED};
    uint64_t tag = 1;
    for (int li = 0; li < 3; li++)
        for (int op = 0; op < 3; op++)
            for (int oi = 0; oi < 2; oi++)
                for (int bi = 0; bi < (op == ETP_GEMM_WGRAD ? 2 : 1); bi++) {
                    gcase_t c;
                    memset(&c, 0, sizeof c);
                    c.tag = tag++ * 1000 + (uint64_t)g_rank;
                    c.layout = layouts[li];
                    c.op = (etp_gemm_op_t)op;
                    c.out = oi ? ETP_DTYPE_F32 : ETP_DTYPE_BF16;
                    c.beta = (float)bi;
                    c.experts = c.layout == ETP_GEMM_DENSE
                                    ? 1
                                    : 2 + (int64_t)(tu_rand(g_seed, c.tag, 3, 0) % 5);
                    g_random_nk(&c);
                    c.slots = 1 + (int64_t)(tu_rand(g_seed, c.tag, 7, 0) % 40);
                    g_run_checked(ctx, s0, s1, &c);
                }
    for (int op = 0; op < 3; op++)
        for (int bi = 0; bi < (op == ETP_GEMM_WGRAD ? 2 : 1); bi++)
            for (int gi = 0; gi < 2; gi++) {
                gcase_t c;
                memset(&c, 0, sizeof c);
                c.tag = tag++ * 1000 + (uint64_t)g_rank;
                c.layout = ETP_GEMM_PACKED;
                c.op = (etp_gemm_op_t)op;
                c.out = tu_rand(g_seed, c.tag, 8, 0) % 2 ? ETP_DTYPE_F32 : ETP_DTYPE_BF16;
                c.beta = (float)bi;
                c.experts = 9 + (int64_t)(tu_rand(g_seed, c.tag, 3, 0) % 7);
                g_random_nk(&c);
                c.graph = gi;
                g_run_checked(ctx, s0, s1, &c);
            }
    ETP_OK(etp_stream_destroy(s0));
    ETP_OK(etp_stream_destroy(s1));
}

#endif
