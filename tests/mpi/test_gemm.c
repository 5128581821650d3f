/*
 * GEMMs on the host backend (label mpi;gemm; 1 and 2 ranks, each rank its
 * own cases): every product, layout, output dtype and beta against a
 * double-precision reference (gemm_cases.h), in shuffle and eager mode;
 * a FIXED_SLOTS forward captured into a graph and launched; bad input
 * with the messages it gets; and etp_stream_launch_host's stream order.
 */
#define GEMM_TOL 1e-5
#include "gemm_cases.h"

static void test_products_shuffle(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, (int64_t)g_seed, -1, -1);
    g_run_all(ctx);
    ETP_OK(etp_context_destroy(ctx));
}

static void test_products_eager(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    g_run_all(ctx);
    ETP_OK(etp_context_destroy(ctx));
}

/* A FIXED_SLOTS forward captured once and launched twice on new inputs:
 * each launch's Y is the reference's for that launch's X. */
static void test_capture_fixed(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, (int64_t)g_seed, -1, -1);
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    enum { E = 3, S = 5, N = 7, K = 9 };
    uint16_t *x, *w, *y;
    ETP_OK(etp_mem_alloc(ctx, E * S * K * 2, ETP_MEM_USER, (void **)&x));
    ETP_OK(etp_mem_alloc(ctx, E * N * K * 2, ETP_MEM_USER, (void **)&w));
    ETP_OK(etp_mem_alloc(ctx, E * S * N * 2, ETP_MEM_USER, (void **)&y));
    etp_gemm_config_t cfg = ETP_GEMM_CONFIG_INIT;
    cfg.layout = ETP_GEMM_FIXED_SLOTS;
    cfg.experts = E;
    cfg.rows = S;
    cfg.n = N;
    cfg.k = K;
    etp_gemm_plan_t *plan;
    ETP_OK(etp_gemm_plan_create(ctx, &cfg, &plan));
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    v.data = w;
    v.experts = E;
    v.rows = N;
    v.cols = K;
    v.ld = K;
    v.expert_stride = N * K;
    etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
    a.x = x;
    a.w = &v;
    a.y = y;
    etp_graph_t *g;
    ETP_OK(etp_stream_begin_capture(s));
    ETP_OK(etp_gemm_run(plan, &a, s));
    ETP_OK(etp_stream_end_capture(s, &g));
    ETP_EXPECT_MSG(etp_gemm_plan_destroy(plan), ETP_ERR_BUSY, "graph");
    for (uint64_t round = 0; round < 2; round++) {
        for (int i = 0; i < E * S * K; i++) x[i] = g_bf16(g_seed, 500 + round, (uint64_t)i);
        for (int i = 0; i < E * N * K; i++) w[i] = g_bf16(g_seed, 600 + round, (uint64_t)i);
        tu_poison(y, E * S * N * 2);
        ETP_OK(etp_graph_launch(g, s));
        ETP_OK(etp_stream_synchronize(s));
        g_check_fixed_forward(x, w, y, E, S, N, K, round);
    }
    ETP_OK(etp_graph_destroy(g));
    ETP_OK(etp_gemm_plan_destroy(plan));
    ETP_OK(etp_mem_free(ctx, x));
    ETP_OK(etp_mem_free(ctx, w));
    ETP_OK(etp_mem_free(ctx, y));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

static void test_bad_input(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    enum { E = 2, R = 32, N = 8, K = 16 };
    void *x, *w, *y;
    ETP_OK(etp_mem_alloc(ctx, R * K * 2, ETP_MEM_USER, &x));
    ETP_OK(etp_mem_alloc(ctx, E * N * K * 4, ETP_MEM_USER, &w));
    ETP_OK(etp_mem_alloc(ctx, R * N * 2, ETP_MEM_USER, &y));
    /* the calls that pass run on these: defined contents (memcheck) */
    ETP_OK(etp_memset_async(s, x, 0, R * K * 2));
    ETP_OK(etp_memset_async(s, w, 0, E * N * K * 4));
    ETP_OK(etp_memset_async(s, y, 0, R * N * 2));

    etp_gemm_config_t cfg = ETP_GEMM_CONFIG_INIT;
    cfg.name = "moe.fc1";
    cfg.layout = ETP_GEMM_PACKED;
    cfg.experts = E;
    cfg.rows = R;
    cfg.n = N;
    cfg.k = K;
    etp_gemm_plan_t *plan = NULL;
    /* bad configs */
    ETP_EXPECT_MSG(etp_gemm_plan_create(NULL, &cfg, &plan), ETP_ERR_INVALID_ARGUMENT, "ctx");
    etp_gemm_config_t bad = cfg;
    bad.k = 0;
    ETP_EXPECT_MSG(etp_gemm_plan_create(ctx, &bad, &plan), ETP_ERR_INVALID_ARGUMENT, "k 0");
    bad = cfg;
    bad.layout = ETP_GEMM_DENSE;
    ETP_EXPECT_MSG(etp_gemm_plan_create(ctx, &bad, &plan), ETP_ERR_INVALID_ARGUMENT, "experts 2");
    bad = cfg;
    bad.out_dtype = ETP_DTYPE_F16;
    ETP_EXPECT_MSG(etp_gemm_plan_create(ctx, &bad, &plan), ETP_ERR_INVALID_ARGUMENT, "f16");
    bad = cfg;
    bad.weight_ld = K - 1;
    ETP_EXPECT_MSG(etp_gemm_plan_create(ctx, &bad, &plan), ETP_ERR_INVALID_ARGUMENT, "weight_ld 15");
    bad = cfg;
    bad.size = 4;
    ETP_EXPECT_MSG(etp_gemm_plan_create(ctx, &bad, &plan), ETP_ERR_INVALID_ARGUMENT, "config->size");
    assert_null(plan);
    ETP_OK(etp_gemm_plan_create(ctx, &cfg, &plan));

    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    v.data = w;
    v.experts = E;
    v.rows = N;
    v.cols = K;
    v.ld = K;
    v.expert_stride = N * K;
    int32_t counts[E] = {3, 17}, offsets[E + 1] = {0, 8, 25};
    etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
    a.x = x;
    a.w = &v;
    a.y = y;
    a.counts = counts;
    a.offsets = offsets;
    ETP_OK(etp_gemm_run(plan, &a, s));

    /* NULL plan, args, stream */
    ETP_EXPECT_MSG(etp_gemm_run(NULL, &a, s), ETP_ERR_INVALID_ARGUMENT, "'plan' is NULL");
    ETP_EXPECT_MSG(etp_gemm_run(plan, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'args' is NULL");
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, NULL), ETP_ERR_INVALID_ARGUMENT, "'stream' is NULL");
    /* mismatched K */
    etp_weight_view_t vb = v;
    vb.cols = K + 1;
    a.w = &vb;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "[8, 17], the plan's weight [n 8, k 16] (mismatched k)");
    /* a view of the wrong dtype */
    vb = v;
    vb.dtype = ETP_DTYPE_F32;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "args->w has dtype f32, expected bf16");
    vb = v;
    vb.experts = 3;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "args->w has 3 expert(s), the plan 2");
    vb = v;
    vb.quant = ETP_PARAM_QUANT_MXFP8;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "quantized view");
    a.w = &v;
    /* rows beyond the layout, overlapping blocks, negative counts */
    offsets[2] = 33;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "offsets[2] = 33 is beyond the layout's 32 rows");
    offsets[2] = 40;
    counts[1] = 30;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "expert 1's rows [8, 38) are beyond the layout's 32 rows");
    counts[1] = 17;
    offsets[2] = 25;
    counts[0] = 9;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "expert 0's rows [0, 9) overlap expert 1's block");
    counts[0] = -1;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "expert 0 has count -1");
    counts[0] = 3;
    /* operands of another product, missing ones, beta */
    a.counts = NULL;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "args->counts is NULL");
    a.counts = counts;
    a.dy = x;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "args->dy must be NULL");
    a.dy = NULL;
    a.beta = 1.0f;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &a, s), ETP_ERR_INVALID_ARGUMENT, "only wgrad accumulates");
    a.beta = 0.0f;
    ETP_OK(etp_gemm_run(plan, &a, s));
    ETP_OK(etp_gemm_plan_destroy(plan));

    /* wgrad: dW's dtype is the plan's out dtype; beta 0 or 1 */
    cfg.op = ETP_GEMM_WGRAD;
    cfg.out_dtype = ETP_DTYPE_F32;
    ETP_OK(etp_gemm_plan_create(ctx, &cfg, &plan));
    etp_gemm_args_t b = ETP_GEMM_ARGS_INIT;
    b.x = x;
    b.dy = y;
    vb = v;
    b.dw = &vb;
    b.counts = counts;
    b.offsets = offsets;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &b, s), ETP_ERR_INVALID_ARGUMENT, "args->dw has dtype bf16, expected f32");
    vb.dtype = ETP_DTYPE_F32;
    b.beta = 0.5f;
    ETP_EXPECT_MSG(etp_gemm_run(plan, &b, s), ETP_ERR_INVALID_ARGUMENT, "beta 0.5 (expected 0 or 1)");
    b.beta = 1.0f;
    ETP_OK(etp_gemm_run(plan, &b, s));
    ETP_OK(etp_stream_synchronize(s));
    ETP_OK(etp_gemm_plan_destroy(plan));
    ETP_OK(etp_gemm_plan_destroy(NULL));

    ETP_OK(etp_mem_free(ctx, x));
    ETP_OK(etp_mem_free(ctx, w));
    ETP_OK(etp_mem_free(ctx, y));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

/* etp_stream_launch_host: the function sees what the stream did before it
 * and nothing of what comes after, under the shuffle scheduler. */
typedef struct {
    const int *src;
    int seen[4];
    int runs;
} seen_t;

static void record(void *arg)
{
    seen_t *r = arg;
    memcpy(r->seen, r->src, sizeof r->seen);
    r->runs++;
}

static void test_launch_host(void **state)
{
    (void)state;
    for (int64_t seed = 1; seed <= 8; seed++) {
        etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE,
                                         (int64_t)g_seed + seed, -1, -1);
        etp_stream_t *s;
        ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
        int *buf;
        ETP_OK(etp_mem_alloc(ctx, 4 * sizeof(int), ETP_MEM_USER, (void **)&buf));
        const int before[4] = {1, 2, 3, 4}, after[4] = {9, 9, 9, 9};
        for (int i = 0; i < 4; i++) buf[i] = 7; /* what a run at enqueue time would see */
        seen_t r = {buf, {0}, 0};
        ETP_OK(etp_memcpy_async(s, buf, before, sizeof before));
        ETP_OK(etp_stream_launch_host(s, record, &r));
        ETP_OK(etp_memcpy_async(s, buf, after, sizeof after));
        ETP_OK(etp_stream_synchronize(s));
        assert_int_equal(r.runs, 1);
        assert_memory_equal(r.seen, before, sizeof before);
        ETP_EXPECT_MSG(etp_stream_launch_host(s, NULL, &r), ETP_ERR_INVALID_ARGUMENT, "'fn' is NULL");
        ETP_EXPECT_MSG(etp_stream_launch_host(NULL, record, &r), ETP_ERR_INVALID_ARGUMENT, "'stream' is NULL");
        ETP_OK(etp_mem_free(ctx, buf));
        ETP_OK(etp_stream_destroy(s));
        ETP_OK(etp_context_destroy(ctx));
    }
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_gemm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_launch_host),
        cmocka_unit_test(test_products_shuffle),
        cmocka_unit_test(test_products_eager),
        cmocka_unit_test(test_capture_fixed),
    };
    return tu_mpi_finish(cmocka_run_group_tests_name("gemm", tests, NULL, NULL));
}
