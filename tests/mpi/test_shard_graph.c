/*
 * A graphed chain's whole step (zero_grad, forward gathers, backward gathers
 * with wgrads and reductions, wait_grads; a BF16, an FP32 grouped and an
 * NVFP4 dequantized parameter) captured into one graph and replayed
 * 100 times: every gathered weight and every main_grad equal, bit for bit,
 * those of the same step run eagerly. The host backend in shuffle mode
 * (whose capture enforces CUDA's rules), or, built as
 * tests/gpu/test_gpu_shard_graph.c, the CUDA backend on 1 and 2 GPUs.
 */
#include <math.h>

#include "core/half.h"
#include "mpi_util.h"

typedef struct {
    int64_t experts, rows, cols;
    int alignment;
    etp_dtype_t dtype;
    etp_param_quant_t quant;
} gspec_t;

static const gspec_t gspecs[] = {
    {1, 96, 64, 0, ETP_DTYPE_BF16, ETP_PARAM_QUANT_NONE},
    {3, 40, 32, 16, ETP_DTYPE_F32, ETP_PARAM_QUANT_NONE},
    {1, 70, 64, 16, ETP_DTYPE_BF16, ETP_PARAM_QUANT_NVFP4},
    {2, 33, 16, 1, ETP_DTYPE_F32, ETP_PARAM_QUANT_NONE},
};
#define NG (sizeof gspecs / sizeof gspecs[0])

typedef struct {
    etp_context_t *ctx;
    etp_group_t *tp;
    etp_stream_t *main;
    etp_chain_t *chain;
    etp_param_t *p[NG];
    void *out_f[NG], *out_b[NG], *wsrc[NG];
    size_t out_bytes[NG], w_bytes[NG];
} gfx_t;

/* Copy a gathered (or wgrad) view's real rows to/from a packed buffer. */
static void copy_view(etp_stream_t *s, const etp_weight_view_t *v, void *packed, int to_view)
{
    size_t es = etp_dtype_size(v->dtype), per = (size_t)(v->rows * v->cols) * es;
    for (int64_t e = 0; e < v->experts; e++) {
        char *in_view = (char *)v->data + (size_t)(e * v->expert_stride) * es;
        char *in_packed = (char *)packed + (size_t)e * per;
        if (to_view)
            ETP_OK(etp_memcpy_async(s, in_view, in_packed, per));
        else
            ETP_OK(etp_memcpy_async(s, in_packed, in_view, per));
    }
}

static void step(gfx_t *f)
{
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_zero_grad(f->chain, f->main));
    for (size_t i = 0; i < NG; i++) {
        ETP_OK(etp_gather(f->p[i], ETP_PASS_FORWARD, f->main, &v));
        copy_view(f->main, &v, f->out_f[i], 0);
        ETP_OK(etp_release(f->p[i], ETP_PASS_FORWARD, f->main));
    }
    for (size_t k = NG; k-- > 0;) {
        ETP_OK(etp_gather(f->p[k], ETP_PASS_BACKWARD, f->main, &v));
        copy_view(f->main, &v, f->out_b[k], 0);
        ETP_OK(etp_release(f->p[k], ETP_PASS_BACKWARD, f->main));
        ETP_OK(etp_wgrad_buffer(f->p[k], f->main, &v));
        copy_view(f->main, &v, f->wsrc[k], 1);
        ETP_OK(etp_reduce_grad(f->p[k], f->main, 0.5f));
    }
    ETP_OK(etp_wait_grads(f->chain, f->main));
}

/* Everything a step produced, copied to host (synchronizes); its bytes. */
static size_t snapshot(gfx_t *f, void *host)
{
    size_t off = 0;
    for (size_t i = 0; i < NG; i++) {
        etp_param_info_t info = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(f->p[i], &info));
        size_t g = (size_t)(info.experts * info.shard_rows * info.cols) * sizeof(float);
        ETP_OK(etp_memcpy_async(f->main, (char *)host + off, f->out_f[i], f->out_bytes[i]));
        off += f->out_bytes[i];
        ETP_OK(etp_memcpy_async(f->main, (char *)host + off, f->out_b[i], f->out_bytes[i]));
        off += f->out_bytes[i];
        ETP_OK(etp_memcpy_async(f->main, (char *)host + off, info.main_grad, g));
        off += g;
    }
    ETP_OK(etp_stream_synchronize(f->main));
    return off;
}

static void run_graph_replay(int64_t seed)
{
    gfx_t f;
    memset(&f, 0, sizeof f);
    f.ctx = tu_test_ctx(seed);
    etp_group_t *world;
    ETP_OK(etp_context_world(f.ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.num_roles = 2;
    ETP_OK(etp_group_split(world, 0, g_rank, &gc, &f.tp));
    ETP_OK(etp_stream_create(f.ctx, ETP_STREAM_PRIORITY_NORMAL, &f.main));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = f.tp;
    cc.graphed = 1;
    ETP_OK(etp_chain_create(f.ctx, &cc, &f.chain));
    size_t total = 0;
    for (size_t i = 0; i < NG; i++) {
        const gspec_t *g = &gspecs[i];
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = f.tp;
        pc.experts = g->experts;
        pc.rows = g->rows;
        pc.cols = g->cols;
        pc.alignment = g->alignment;
        pc.dtype = g->dtype;
        pc.quant = g->quant;
        pc.gather_dequantized = g->quant != ETP_PARAM_QUANT_NONE;
        ETP_OK(etp_param_create(f.ctx, &pc, &f.p[i]));
        ETP_OK(etp_chain_add(f.chain, f.p[i]));
        size_t n = (size_t)(g->experts * g->rows * g->cols);
        etp_dtype_t view_dtype = g->quant != ETP_PARAM_QUANT_NONE ? ETP_DTYPE_BF16 : g->dtype;
        f.out_bytes[i] = n * etp_dtype_size(view_dtype);
        f.w_bytes[i] = n * etp_dtype_size(g->dtype);
        ETP_OK(etp_mem_alloc(f.ctx, f.out_bytes[i], ETP_MEM_USER, &f.out_f[i]));
        ETP_OK(etp_mem_alloc(f.ctx, f.out_bytes[i], ETP_MEM_USER, &f.out_b[i]));
        ETP_OK(etp_mem_alloc(f.ctx, f.w_bytes[i], ETP_MEM_USER, &f.wsrc[i]));
        /* weights and this rank's wgrad: small integers, from the seed */
        void *h = malloc(f.w_bytes[i]), *w = malloc(f.w_bytes[i]);
        for (size_t k = 0; k < n; k++) {
            float x = (float)((int64_t)(tu_rand(g_seed, 10 + i, 0, k) % 17) - 8);
            float y = (float)((int64_t)(tu_rand(g_seed, 20 + i, (uint64_t)g_rank, k) % 9) - 4);
            if (g->dtype == ETP_DTYPE_BF16) {
                ((uint16_t *)h)[k] = etp__f32_to_bf16(x);
                ((uint16_t *)w)[k] = etp__f32_to_bf16(y);
            } else {
                ((float *)h)[k] = x;
                ((float *)w)[k] = y;
            }
        }
        ETP_OK(etp_param_load_full(f.p[i], h, f.main));
        ETP_OK(etp_memcpy_async(f.main, f.wsrc[i], w, f.w_bytes[i]));
        ETP_OK(etp_stream_synchronize(f.main));
        free(h);
        free(w);
        etp_param_info_t info = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(f.p[i], &info));
        total += 2 * f.out_bytes[i] + (size_t)(info.experts * info.shard_rows * info.cols) * sizeof(float);
    }
    ETP_OK(etp_chain_finalize(f.chain));

    void *eager = malloc(total), *replay = malloc(total);
    step(&f); /* a warm-up step: connections, first quantization */
    step(&f);
    size_t n_eager = snapshot(&f, eager);

    etp_graph_t *graph = NULL;
    ETP_OK(etp_stream_begin_capture(f.main));
    step(&f);
    ETP_OK(etp_stream_end_capture(f.main, &graph));
    for (size_t i = 0; i < NG; i++) {
        ETP_OK(etp_memset_async(f.main, f.out_f[i], 0xA5, f.out_bytes[i]));
        ETP_OK(etp_memset_async(f.main, f.out_b[i], 0xA5, f.out_bytes[i]));
    }
    for (int it = 0; it < 100; it++) ETP_OK(etp_graph_launch(graph, f.main));
    size_t n_replay = snapshot(&f, replay);
    assert_int_equal(n_eager, n_replay);
    assert_memory_equal(eager, replay, n_eager);
    /* and eager steps still work after the capture */
    step(&f);
    assert_int_equal(snapshot(&f, replay), n_eager);
    assert_memory_equal(eager, replay, n_eager);

    ETP_OK(etp_graph_destroy(graph));
    free(eager);
    free(replay);
    etp_stream_t *ag, *rs;
    ETP_OK(etp_chain_streams(f.chain, &ag, &rs));
    ETP_OK(etp_stream_synchronize(ag));
    ETP_OK(etp_stream_synchronize(rs));
    ETP_OK(etp_chain_destroy(f.chain));
    for (size_t i = 0; i < NG; i++) {
        ETP_OK(etp_param_destroy(f.p[i]));
        ETP_OK(etp_mem_free(f.ctx, f.out_f[i]));
        ETP_OK(etp_mem_free(f.ctx, f.out_b[i]));
        ETP_OK(etp_mem_free(f.ctx, f.wsrc[i]));
    }
    ETP_OK(etp_stream_destroy(f.main));
    ETP_OK(etp_group_destroy(f.tp));
    ETP_OK(etp_context_destroy(f.ctx));
}

static void test_graph_replay_equals_eager(void **state)
{
    (void)state;
#ifdef ETP_SHARD_TEST_CUDA
    run_graph_replay(0);
#else
    const int64_t seeds[] = {0, 1, 42};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) run_graph_replay(seeds[k]);
#endif
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shard_graph");
#ifdef ETP_SHARD_TEST_CUDA
    if (tu_gpu_short("test_gpu_shard_graph")) return tu_gpu_skip();
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graph_replay_equals_eager)};
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
