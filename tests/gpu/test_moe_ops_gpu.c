/*
 * etp-train's small kernels on the CUDA backend (label gpu;train; 1 GPU;
 * skipped without one) against the same calls on the host backend, which
 * test_moe_ops checks against its references. Both run moe_math.h, the
 * kernels without contraction (--fmad=false): what uses only +, -, *, /
 * and sqrtf (IEEE on both) must match bit for bit (fill, router backward,
 * add, the loss gradient, Adam); what calls expf (softmax, SiLU) within
 * the platforms' expf difference; the loss sum, whose order differs, to
 * 1e-12. Also the loss from a captured CUDA graph, launched twice: the
 * same bits as the eager call.
 */
#include <math.h>

#include <cuda_runtime_api.h>

#include "etp/cuda.h"
#include "gpu_util.h"
#include "moe_ops.h"
#include "mpi_util.h"

typedef struct {
    etp_context_t *hctx, *dctx;
    etp_stream_t *hs, *ds;
    moe_ops_t *hops, *dops;
} pair_t;

static pair_t pair_open(void)
{
    pair_t p;
    p.hctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &p.dctx));
    ETP_OK(etp_stream_create(p.hctx, ETP_STREAM_PRIORITY_NORMAL, &p.hs));
    ETP_OK(etp_stream_create(p.dctx, ETP_STREAM_PRIORITY_NORMAL, &p.ds));
    ETP_OK(moe_ops_create(p.hctx, 64, &p.hops));
    ETP_OK(moe_ops_create(p.dctx, 0, &p.dops));
    return p;
}

static void pair_close(pair_t *p)
{
    moe_ops_destroy(p->hops);
    moe_ops_destroy(p->dops);
    ETP_OK(etp_stream_destroy(p->hs));
    ETP_OK(etp_stream_destroy(p->ds));
    ETP_OK(etp_context_destroy(p->hctx));
    ETP_OK(etp_context_destroy(p->dctx));
}

/* The test's own copies and fills go through the legacy default stream,
 * which etp's (non-blocking) streams do not wait for: each is finished
 * before the next etp call. */
static void settle(void)
{
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

/* device memory: poisoned, or a copy of src */
static void *dev(pair_t *p, size_t bytes, const void *src)
{
    void *d;
    ETP_OK(etp_mem_alloc(p->dctx, bytes ? bytes : 1, ETP_MEM_USER, &d));
    if (src != NULL)
        assert_int_equal(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
        assert_int_equal(cudaMemset(d, 0xA5, bytes), cudaSuccess);
    settle();
    return d;
}

static void *host(size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    tu_poison(h, bytes);
    return h;
}

/* a device buffer's contents (after the device stream's work) */
static void *back(pair_t *p, const void *d, size_t bytes)
{
    ETP_OK(etp_stream_synchronize(p->ds));
    void *h = host(bytes);
    assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static void same(const void *got, const void *want, size_t bytes, const char *what)
{
    if (memcmp(got, want, bytes) != 0) {
        size_t i = 0;
        while (((const unsigned char *)got)[i] == ((const unsigned char *)want)[i]) i++;
        print_error("%s: CUDA and host differ first at byte %zu of %zu\n", what, i, bytes);
        fail();
    }
}

static float bits_f32(uint16_t h)
{
    return moe_bf16_to_f32(h);
}

static double bf16_ulp(double x)
{
    int e;
    (void)frexp(x == 0.0 ? 1e-30 : x, &e);
    return ldexp(1.0, e - 8);
}

static double uni(uint64_t a, uint64_t b, uint64_t i)
{
    return (double)(tu_rand(g_seed, a, b, i) >> 11) * 0x1p-53;
}

static void rand_bf16(uint16_t *x, int64_t n, uint64_t stream, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = moe_f32_to_bf16((float)(lo + (hi - lo) * uni(9, stream, (uint64_t)i)));
}

static void test_fill(void **state)
{
    (void)state;
    pair_t p = pair_open();
    const moe_fill_t fills[] = {
        {g_seed, 3, 3, 50, 129, 2, 7, 45, 100, 0.3f},
        {g_seed, 4, 1, 3000, 1001, 0, 0, 3000, 3000, 1.0f}, /* more than one grid */
    };
    for (size_t c = 0; c < sizeof fills / sizeof fills[0]; c++) {
        const moe_fill_t *f = &fills[c];
        size_t bytes = (size_t)(f->experts * f->rows * f->cols) * 2;
        uint16_t *h = host(bytes), *d = dev(&p, bytes, NULL);
        ETP_OK(moe_fill_normal(p.hops, p.hs, h, f));
        ETP_OK(moe_fill_normal(p.dops, p.ds, d, f));
        ETP_OK(etp_stream_synchronize(p.hs));
        uint16_t *got = back(&p, d, bytes);
        same(got, h, bytes, "fill");
        free(got);
        free(h);
        ETP_OK(etp_mem_free(p.dctx, d));
    }
    pair_close(&p);
}

static void router_case(pair_t *p, int64_t T, int E, int k, uint64_t stream)
{
    size_t nl = (size_t)(T * E), nk = (size_t)(T * k);
    float *logits = host(4 * nl), *gw = host(4 * nk);
    int *perm = host(sizeof(int) * (size_t)E);
    for (int64_t t = 0; t < T; t++) {
        /* 0.05 apart: no two probabilities within the expf difference */
        for (int i = 0; i < E; i++) perm[i] = i;
        for (int i = E - 1; i > 0; i--) {
            int j = (int)(tu_rand(g_seed, stream, (uint64_t)t, (uint64_t)i) % (uint64_t)(i + 1));
            int tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        for (int i = 0; i < E; i++) logits[t * E + i] = (float)(0.05 * perm[i] - 0.025 * E);
        for (int j = 0; j < k; j++) gw[t * k + j] = (float)(2.0 * uni(stream, 2, (uint64_t)(t * k + j)) - 1.0);
    }
    float *hp = host(4 * nl), *hw = host(4 * nk);
    int64_t *hi = host(8 * nk);
    uint16_t *hdz = host(2 * nl);
    ETP_OK(moe_router_fwd(p->hops, p->hs, logits, T, E, k, hp, hi, hw));
    ETP_OK(moe_router_bwd(p->hops, p->hs, hp, hi, gw, T, E, k, hdz));
    ETP_OK(etp_stream_synchronize(p->hs));

    float *dl = dev(p, 4 * nl, logits), *dp = dev(p, 4 * nl, NULL), *dw = dev(p, 4 * nk, NULL);
    int64_t *di = dev(p, 8 * nk, NULL);
    ETP_OK(moe_router_fwd(p->dops, p->ds, dl, T, E, k, dp, di, dw));
    float *gp = back(p, dp, 4 * nl), *gwt = back(p, dw, 4 * nk);
    int64_t *gi = back(p, di, 8 * nk);
    same(gi, hi, 8 * nk, "router idx");
    for (size_t q = 0; q < nl; q++)
        if (!(fabs((double)gp[q] - hp[q]) <= 1e-5 * hp[q] + 1e-30)) {
            print_error("probs[%zu]: CUDA %.9g, host %.9g\n", q, (double)gp[q], (double)hp[q]);
            fail();
        }
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) assert_true(gwt[t * k + j] == gp[t * E + gi[t * k + j]]);

    /* backward from the host's forward: the same inputs, the same bits */
    float *dph = dev(p, 4 * nl, hp), *dg = dev(p, 4 * nk, gw);
    int64_t *dih = dev(p, 8 * nk, hi);
    uint16_t *ddz = dev(p, 2 * nl, NULL);
    ETP_OK(moe_router_bwd(p->dops, p->ds, dph, dih, dg, T, E, k, ddz));
    uint16_t *gdz = back(p, ddz, 2 * nl);
    same(gdz, hdz, 2 * nl, "router dz");

    void *frees[] = {logits, gw, perm, hp, hw, hi, hdz, gp, gwt, gi, gdz};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]);
    void *dfrees[] = {dl, dp, dw, di, dph, dg, dih, ddz};
    for (size_t i = 0; i < sizeof dfrees / sizeof dfrees[0]; i++) ETP_OK(etp_mem_free(p->dctx, dfrees[i]));
}

static void test_router(void **state)
{
    (void)state;
    pair_t p = pair_open();
    router_case(&p, 1000, 64, 4, 1);
    router_case(&p, 70, 1024, 8, 2);
    router_case(&p, 3, 1, 1, 3);
    pair_close(&p);
}

static void test_elementwise(void **state)
{
    (void)state;
    pair_t p = pair_open();
    const int64_t n = (1 << 20) + 17;
    const size_t b = 2 * (size_t)n;
    uint16_t *a = host(b), *g = host(b), *c = host(b);
    rand_bf16(a, n, 1, -12.0, 12.0);
    rand_bf16(g, n, 2, -3.0, 3.0);
    rand_bf16(c, n, 3, -0.01, 0.01);
    uint16_t *hs = host(b), *hga = host(b), *h3 = host(b), *h2 = host(b);
    ETP_OK(moe_silu_fwd(p.hops, p.hs, a, hs, n));
    ETP_OK(moe_silu_bwd(p.hops, p.hs, a, g, hga, n));
    ETP_OK(moe_add(p.hops, p.hs, a, g, c, h3, n));
    ETP_OK(moe_add(p.hops, p.hs, a, g, NULL, h2, n));
    ETP_OK(etp_stream_synchronize(p.hs));
    uint16_t *da = dev(&p, b, a), *dg = dev(&p, b, g), *dc = dev(&p, b, c);
    uint16_t *ds = dev(&p, b, NULL), *dga = dev(&p, b, NULL), *d3 = dev(&p, b, NULL), *d2 = dev(&p, b, NULL);
    uint16_t *din = dev(&p, b, a);
    ETP_OK(moe_silu_fwd(p.dops, p.ds, da, ds, n));
    ETP_OK(moe_silu_bwd(p.dops, p.ds, da, dg, dga, n));
    ETP_OK(moe_add(p.dops, p.ds, da, dg, dc, d3, n));
    ETP_OK(moe_add(p.dops, p.ds, da, dg, NULL, d2, n));
    ETP_OK(moe_add(p.dops, p.ds, din, dg, dc, din, n)); /* in place */
    uint16_t *gs = back(&p, ds, b), *gga = back(&p, dga, b), *g3 = back(&p, d3, b);
    uint16_t *g2 = back(&p, d2, b), *gin = back(&p, din, b);
    same(g3, h3, b, "add a+b+c");
    same(g2, h2, b, "add a+b");
    same(gin, h3, b, "add in place");
    for (int64_t i = 0; i < n; i++) {
        double x = bits_f32(a[i]), want = bits_f32(hs[i]);
        if (!(fabs(bits_f32(gs[i]) - want) <= bf16_ulp(want))) {
            print_error("silu(%g): CUDA %g, host %g\n", x, (double)bits_f32(gs[i]), want);
            fail();
        }
        double sg = 1.0 / (1.0 + exp(-x)), gg = bits_f32(g[i]);
        want = bits_f32(hga[i]);
        double tol = bf16_ulp(want) + fabs(gg) * sg * (1.0 + fabs(x)) * 1e-6;
        if (!(fabs(bits_f32(gga[i]) - want) <= tol)) {
            print_error("silu_grad(%g, %g): CUDA %g, host %g\n", x, gg, (double)bits_f32(gga[i]), want);
            fail();
        }
    }
    void *frees[] = {a, g, c, hs, hga, h3, h2, gs, gga, g3, g2, gin};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]);
    void *dfrees[] = {da, dg, dc, ds, dga, d3, d2, din};
    for (size_t i = 0; i < sizeof dfrees / sizeof dfrees[0]; i++) ETP_OK(etp_mem_free(p.dctx, dfrees[i]));
    pair_close(&p);
}

static void test_mse(void **state)
{
    (void)state;
    pair_t p = pair_open();
    const int64_t sizes[] = {(1 << 21) + 5, 1000, 1, 0};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        const int64_t n = sizes[c];
        const size_t b = 2 * (size_t)n;
        const float scale = 2.0f / (float)(n + 1);
        uint16_t *y = host(b), *t = host(b), *hg = host(b);
        double hl = -1.0;
        rand_bf16(y, n, 10 + c, -4.0, 4.0);
        rand_bf16(t, n, 20 + c, -4.0, 4.0);
        ETP_OK(moe_mse(p.hops, p.hs, y, t, n, scale, hg, &hl));
        ETP_OK(etp_stream_synchronize(p.hs));
        uint16_t *dy = dev(&p, b, y), *dt = dev(&p, b, t), *dgr = dev(&p, b, NULL);
        double *dl = dev(&p, 3 * sizeof(double), NULL);
        ETP_OK(moe_mse(p.dops, p.ds, dy, dt, n, scale, dgr, dl));
        /* the same call captured, launched twice: the eager call's bits */
        etp_graph_t *graph;
        ETP_OK(etp_stream_begin_capture(p.ds));
        ETP_OK(moe_mse(p.dops, p.ds, dy, dt, n, scale, dgr, dl + 1));
        ETP_OK(etp_stream_end_capture(p.ds, &graph));
        ETP_OK(etp_graph_launch(graph, p.ds));
        ETP_OK(etp_stream_synchronize(p.ds));
        assert_int_equal(cudaMemcpy(dl + 2, dl + 1, sizeof(double), cudaMemcpyDeviceToDevice), cudaSuccess);
        assert_int_equal(cudaMemset(dl + 1, 0xA5, sizeof(double)), cudaSuccess);
        settle();
        ETP_OK(etp_graph_launch(graph, p.ds));
        double *gl = back(&p, dl, 3 * sizeof(double));
        uint16_t *gg = back(&p, dgr, b);
        ETP_OK(etp_graph_destroy(graph));
        same(gg, hg, b, "mse grad");
        same(&gl[1], &gl[0], sizeof(double), "mse loss, graph launch 2 vs eager");
        same(&gl[2], &gl[0], sizeof(double), "mse loss, graph launch 1 vs eager");
        if (!(fabs(gl[0] - hl) <= 1e-12 * hl)) {
            print_error("loss of %lld: CUDA %.17g, host %.17g\n", (long long)n, gl[0], hl);
            fail();
        }
        if (n == 0) assert_true(gl[0] == 0.0);
        free(y);
        free(t);
        free(hg);
        free(gl);
        free(gg);
        void *dfrees[] = {dy, dt, dgr, dl};
        for (size_t i = 0; i < sizeof dfrees / sizeof dfrees[0]; i++) ETP_OK(etp_mem_free(p.dctx, dfrees[i]));
    }
    pair_close(&p);
}

static void test_adam(void **state)
{
    (void)state;
    pair_t p = pair_open();
    const int64_t n = 100003;
    const size_t b4 = 4 * (size_t)n;
    float *g = host(b4), *m = host(b4), *v = host(b4), *master = host(b4);
    uint16_t *w = host(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        m[i] = v[i] = 0.0f;
        master[i] = (float)(uni(30, 0, (uint64_t)i) - 0.5);
    }
    float *dgr = dev(&p, b4, NULL), *dm = dev(&p, b4, m), *dv = dev(&p, b4, v);
    float *dmaster = dev(&p, b4, master);
    uint16_t *dw = dev(&p, 2 * (size_t)n, NULL);
    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < n; i++) g[i] = (float)((uni(31, (uint64_t)step, (uint64_t)i) - 0.5) * 0.1);
        assert_int_equal(cudaMemcpy(dgr, g, b4, cudaMemcpyHostToDevice), cudaSuccess);
        settle();
        moe_adam_t a = {1e-2f, 0.9f, 0.999f, 1e-8f, (float)(1.0 - pow(0.9, step)),
                        (float)(1.0 - pow(0.999, step))};
        ETP_OK(moe_adam(p.hops, p.hs, &a, g, m, v, master, w, n));
        ETP_OK(moe_adam(p.dops, p.ds, &a, dgr, dm, dv, dmaster, dw, n));
        ETP_OK(etp_stream_synchronize(p.hs));
        float *gm = back(&p, dm, b4), *gv = back(&p, dv, b4), *gmaster = back(&p, dmaster, b4);
        uint16_t *gw = back(&p, dw, 2 * (size_t)n);
        same(gm, m, b4, "adam m");
        same(gv, v, b4, "adam v");
        same(gmaster, master, b4, "adam master");
        same(gw, w, 2 * (size_t)n, "adam w");
        free(gm);
        free(gv);
        free(gmaster);
        free(gw);
    }
    void *frees[] = {g, m, v, master, w};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]);
    void *dfrees[] = {dgr, dm, dv, dmaster, dw};
    for (size_t i = 0; i < sizeof dfrees / sizeof dfrees[0]; i++) ETP_OK(etp_mem_free(p.dctx, dfrees[i]));
    pair_close(&p);
}

/* the replicas' sum: the same left-to-right FP32 adds on both sides */
static void test_sum(void **state)
{
    (void)state;
    pair_t p = pair_open();
    const int64_t n = 100003;
    const int parts = 3;
    const size_t b = 4 * (size_t)(n * parts), bo = 4 * (size_t)n;
    float *x = host(b), *out = host(bo);
    for (int64_t i = 0; i < n * parts; i++)
        x[i] = (float)((uni(40, 0, (uint64_t)i) - 0.5) * pow(2.0, (double)(i % 30) - 15.0));
    float *dx = dev(&p, b, x), *dout = dev(&p, bo, NULL);
    ETP_OK(moe_sum(p.hops, p.hs, x, parts, n, out));
    ETP_OK(moe_sum(p.dops, p.ds, dx, parts, n, dout));
    ETP_OK(etp_stream_synchronize(p.hs));
    float *got = back(&p, dout, bo);
    same(got, out, bo, "sum");
    free(got);
    free(x);
    free(out);
    ETP_OK(etp_mem_free(p.dctx, dx));
    ETP_OK(etp_mem_free(p.dctx, dout));
    pair_close(&p);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_moe_ops_gpu");
    if (tu_gpu_short("test_moe_ops_gpu")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_sum),
    };
    return tu_mpi_finish(cmocka_run_group_tests_name("moe_ops_gpu", tests, NULL, NULL));
}
