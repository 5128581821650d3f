/*
 * GEMMs on the CUDA backend (label gpu;gemm; 1 GPU; skipped without one):
 * the cuBLASLt plans' outputs for every product, layout, output dtype and
 * beta against the double-precision reference of tests/mpi/gemm_cases.h,
 * the one the host backend's GEMMs pass at 1e-5. cuBLASLt sums in FP32 in
 * an order of its own (tiles, split-K): the tolerance is 1e-4 of the sum
 * of the terms' magnitudes (+ 1 BF16 ulp for BF16 outputs, + 1 ulp of the
 * product for a BF16 dW with beta 1: some kernels round the product before
 * adding the old value). PACKED (its
 * experts' GEMMs spread over the plan's streams) also with larger experts
 * and with counts at the edges of its chunked matmul, run directly and
 * captured into CUDA graphs. Also a FIXED_SLOTS forward
 * captured into a CUDA graph, and an etp_stream_launch_host in stream
 * order.
 */
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#define GEMM_TOL 1e-4
#define GEMM_BETA_ROUNDINGS 1
#include "gemm_cases.h"

static etp_context_t *cuda_ctx(void)
{
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    etp_context_t *ctx;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    return ctx;
}

static void test_products(void **state)
{
    (void)state;
    etp_context_t *ctx = cuda_ctx();
    g_run_all(ctx);
    ETP_OK(etp_context_destroy(ctx));
}

/* A PACKED case of n and k in [136, 368], multiples of 8, weight rows 8
 * elements longer than k. */
static gcase_t packed_case(uint64_t tag, int op, etp_dtype_t out)
{
    gcase_t c;
    memset(&c, 0, sizeof c);
    c.tag = tag * 1000 + (uint64_t)g_rank;
    c.layout = ETP_GEMM_PACKED;
    c.op = (etp_gemm_op_t)op;
    c.out = out;
    c.n = 136 + 8 * (int64_t)(tu_rand(g_seed, c.tag, 4, 0) % 30);
    c.k = 136 + 8 * (int64_t)(tu_rand(g_seed, c.tag, 5, 0) % 30);
    c.ld = c.k + 8;
    return c;
}

/* PACKED with hundreds of rows per expert and n, k of hundreds (cuBLAS
 * takes other kernels than for the small cases), every product, run
 * directly and captured. */
static void test_packed_larger(void **state)
{
    (void)state;
    etp_context_t *ctx = cuda_ctx();
    etp_stream_t *s0, *s1;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s0));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s1));
    uint64_t tag = 900001;
    for (int op = 0; op < 3; op++)
        for (int bi = 0; bi < (op == ETP_GEMM_WGRAD ? 2 : 1); bi++) {
            gcase_t c = packed_case(tag++, op, bi ? ETP_DTYPE_F32 : ETP_DTYPE_BF16);
            c.beta = (float)bi;
            c.experts = 7;
            c.max_count = 700;
            c.graph = (int)(tag % 2);
            print_message("packed %s%s, beta %d, n %lld, k %lld\n",
                          op == 0   ? "forward"
                          : op == 1 ? "dgrad"
                                    : "wgrad",
                          c.graph ? " (graph)" : "", bi, (long long)c.n, (long long)c.k);
            g_run_checked(ctx, s0, s1, &c);
        }
    ETP_OK(etp_stream_destroy(s0));
    ETP_OK(etp_stream_destroy(s1));
    ETP_OK(etp_context_destroy(ctx));
}

/* PACKED forward and dgrad over counts at the edges of CUDA's chunked
 * matmul (256-row chunks; an expert below a chunk has its own matmul; a
 * count not a multiple of it ends with a chunk overlapping the one before),
 * run directly and captured: every row of every block against the
 * reference, every row outside the blocks untouched. The captured cases
 * have n = k = 512, where the plan looks for a 256 x 128 tile. */
static void test_packed_chunks(void **state)
{
    (void)state;
    static const int32_t counts[] = {0,   1,   127, 128, 129, 255, 256,
                                     257, 300, 511, 512, 513, 640, 131};
    etp_context_t *ctx = cuda_ctx();
    etp_stream_t *s0, *s1;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s0));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s1));
    uint64_t tag = 910001;
    for (int op = 0; op < 2; op++)
        for (int graph = 0; graph < 2; graph++) {
            gcase_t c = packed_case(tag++, op, graph ? ETP_DTYPE_F32 : ETP_DTYPE_BF16);
            c.experts = (int64_t)(sizeof counts / sizeof counts[0]);
            c.counts = counts;
            c.graph = graph;
            if (graph) {
                c.n = c.k = 512;
                c.ld = c.k + 8;
            }
            print_message("packed chunks %s%s, n %lld, k %lld\n", op == 0 ? "forward" : "dgrad",
                          graph ? " (graph)" : "", (long long)c.n, (long long)c.k);
            g_run_checked(ctx, s0, s1, &c);
        }
    ETP_OK(etp_stream_destroy(s0));
    ETP_OK(etp_stream_destroy(s1));
    ETP_OK(etp_context_destroy(ctx));
}

/* A FIXED_SLOTS forward captured into a CUDA graph and launched on two
 * inputs: each launch's Y within the tolerance of that input's reference. */
static void test_graph(void **state)
{
    (void)state;
    etp_context_t *ctx = cuda_ctx();
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    enum { E = 4, S = 24, N = 64, K = 96 };
    uint16_t *hx = malloc(E * S * K * 2), *hw = malloc(E * N * K * 2), *hy = malloc(E * S * N * 2);
    assert_non_null(hx);
    assert_non_null(hw);
    assert_non_null(hy);
    void *x, *w, *y;
    ETP_OK(etp_mem_alloc(ctx, E * S * K * 2, ETP_MEM_USER, &x));
    ETP_OK(etp_mem_alloc(ctx, E * N * K * 2, ETP_MEM_USER, &w));
    ETP_OK(etp_mem_alloc(ctx, E * S * N * 2, ETP_MEM_USER, &y));
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
    for (uint64_t round = 0; round < 2; round++) {
        for (int i = 0; i < E * S * K; i++) hx[i] = g_bf16(g_seed, 500 + round, (uint64_t)i);
        for (int i = 0; i < E * N * K; i++) hw[i] = g_bf16(g_seed, 600 + round, (uint64_t)i);
        tu_poison(hy, E * S * N * 2);
        ETP_OK(etp_memcpy_async(s, x, hx, E * S * K * 2));
        ETP_OK(etp_memcpy_async(s, w, hw, E * N * K * 2));
        ETP_OK(etp_memcpy_async(s, y, hy, E * S * N * 2));
        ETP_OK(etp_graph_launch(g, s));
        ETP_OK(etp_memcpy_async(s, hy, y, E * S * N * 2));
        ETP_OK(etp_stream_synchronize(s));
        g_check_fixed_forward(hx, hw, hy, E, S, N, K, round);
    }
    ETP_OK(etp_graph_destroy(g));
    ETP_OK(etp_gemm_plan_destroy(plan));
    ETP_OK(etp_mem_free(ctx, x));
    ETP_OK(etp_mem_free(ctx, w));
    ETP_OK(etp_mem_free(ctx, y));
    free(hx);
    free(hw);
    free(hy);
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

static void record(void *arg)
{
    int *r = arg;
    r[1] = r[0];
}

/* cudaLaunchHostFunc: the function runs after the stream's earlier copy
 * into pinned memory has landed. */
static void test_launch_host(void **state)
{
    (void)state;
    etp_context_t *ctx = cuda_ctx();
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    int *pinned;
    assert_int_equal(cudaMallocHost((void **)&pinned, 2 * sizeof(int)), cudaSuccess);
    pinned[0] = 7;
    pinned[1] = 0;
    int *dev;
    ETP_OK(etp_mem_alloc(ctx, sizeof(int), ETP_MEM_USER, (void **)&dev));
    const int v = 42;
    ETP_OK(etp_memcpy_async(s, dev, &v, sizeof v));
    ETP_OK(etp_stream_synchronize(s));
    ETP_OK(etp_memcpy_async(s, pinned, dev, sizeof(int)));
    ETP_OK(etp_stream_launch_host(s, record, pinned));
    ETP_OK(etp_stream_synchronize(s));
    assert_int_equal(pinned[1], 42);
    ETP_OK(etp_mem_free(ctx, dev));
    cudaFreeHost(pinned);
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_gemm_gpu");
    if (tu_gpu_short("test_gemm_gpu")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_products),      cmocka_unit_test(test_packed_larger),
        cmocka_unit_test(test_packed_chunks), cmocka_unit_test(test_graph),
        cmocka_unit_test(test_launch_host),
    };
    return tu_mpi_finish(cmocka_run_group_tests_name("gemm_gpu", tests, NULL, NULL));
}
