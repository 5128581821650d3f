/*
 * A graphed chain's whole step (zero_grad, forward gathers, backward gathers
 * with wgrads and reductions, wait_grads; a BF16, an FP32 grouped and an
 * NVFP4 dequantized parameter) captured into one graph and replayed 100
 * times, each replay on new weights and new wgrads, its outputs and every
 * main_grad poisoned first: every gathered weight equals the loaded one (the
 * NVFP4 one, the host reference's quantization and dequantization of it) and
 * every main_grad the reduce-scatter computed here on one rank, bit for bit,
 * as for the eager steps before and after the capture. The host backend in
 * shuffle mode (whose capture enforces CUDA's rules), or, built as
 * tests/gpu/test_gpu_shard_graph.c, the CUDA backend on 1 and 2 GPUs.
 *
 * The same with a step that only reduces gradients (its weights held whole
 * elsewhere, as a resident baseline does): no gather marks the step's
 * start, so the eager steps' wgrad-ring edges must end at etp_wait_grads,
 * or the capture would wait on events recorded outside it.
 *
 * And with graph_whole_step (the last forward gather prefetches the first
 * backward one inside the capture): the same results, and a capture that
 * ends after the forward gathers fails at etp_stream_end_capture (its
 * prefetch unjoined) instead of leaving a branch outside the graph.
 *
 * And on a group of one, where an unquantized gather's view is the shard.
 */
#include <math.h>

#include "core/half.h"
#include "mpi_util.h"
#include "quant/formats/quant_ref.h"
#include "test_shard_layout.h"

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

/* The step's reduction scale: not 1, so a reduction that drops it shows. */
#define GSCALE 0.5f

typedef struct {
    etp_context_t *ctx;
    etp_group_t *tp;
    etp_stream_t *main;
    etp_chain_t *chain;
    etp_param_t *p[NG];
    tu_shard_layout_t lay[NG];
    void *out_f[NG], *out_b[NG], *wsrc[NG];
    size_t out_bytes[NG], w_bytes[NG], g_bytes[NG];
    /* host: the loaded version's weights and this rank's wgrads (read by
     * deferred work until main is synchronized), and a step's results */
    void *hw[NG], *hg[NG], *got_f[NG], *got_b[NG];
    float *got_g[NG];
    int grads_only; /* the step gathers nothing: wgrads and reductions only */
} gfx_t;

/* Weights and wgrads of version `ver`: small integers, exact in BF16, and
 * so are their sums over ranks. */
static float gweight(size_t i, int ver, size_t k)
{
    return (float)((int64_t)(tu_rand(g_seed, 10 + i, (uint64_t)ver, k) % 17) - 8);
}

static float gwgrad(size_t i, int ver, int rank, size_t k)
{
    return (float)((int64_t)(tu_rand(g_seed, 20 + i, (uint64_t)ver * 1024 + (uint64_t)rank, k) % 9) - 4);
}

static void gput(void *b, etp_dtype_t t, size_t k, float x)
{
    if (t == ETP_DTYPE_BF16)
        ((uint16_t *)b)[k] = etp__f32_to_bf16(x);
    else
        ((float *)b)[k] = x;
}

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
    for (size_t i = 0; i < NG && !f->grads_only; i++) {
        ETP_OK(etp_gather(f->p[i], ETP_PASS_FORWARD, f->main, &v));
        copy_view(f->main, &v, f->out_f[i], 0);
        ETP_OK(etp_release(f->p[i], ETP_PASS_FORWARD, f->main));
    }
    for (size_t k = NG; k-- > 0;) {
        if (!f->grads_only) {
            ETP_OK(etp_gather(f->p[k], ETP_PASS_BACKWARD, f->main, &v));
            copy_view(f->main, &v, f->out_b[k], 0);
            ETP_OK(etp_release(f->p[k], ETP_PASS_BACKWARD, f->main));
        }
        ETP_OK(etp_wgrad_buffer(f->p[k], f->main, &v));
        copy_view(f->main, &v, f->wsrc[k], 1);
        ETP_OK(etp_reduce_grad(f->p[k], f->main, GSCALE));
    }
    ETP_OK(etp_wait_grads(f->chain, f->main));
}

/* Load version `ver` (weights through the API, this rank's wgrads into the
 * buffer the step copies from) and poison what the next step must write:
 * its gathered copies and main_grad. The step zeroes main_grad first, so a
 * huge finite value (0x7F7F7F7F, about 3.4e38) that no small sum can hide
 * stays visible wherever the zeroing or a reduction goes missing. Call with
 * main synchronized (hw/hg are reused). */
static void load_version(gfx_t *f, int ver)
{
    for (size_t i = 0; i < NG; i++) {
        const gspec_t *g = &gspecs[i];
        size_t n = (size_t)(g->experts * g->rows * g->cols);
        for (size_t k = 0; k < n; k++) {
            gput(f->hw[i], g->dtype, k, gweight(i, ver, k));
            gput(f->hg[i], g->dtype, k, gwgrad(i, ver, g_rank, k));
        }
        ETP_OK(etp_param_load_full(f->p[i], f->hw[i], f->main));
        ETP_OK(etp_memcpy_async(f->main, f->wsrc[i], f->hg[i], f->w_bytes[i]));
        etp_param_info_t info = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(f->p[i], &info));
        ETP_OK(etp_memset_async(f->main, f->out_f[i], 0xA5, f->out_bytes[i]));
        ETP_OK(etp_memset_async(f->main, f->out_b[i], 0xA5, f->out_bytes[i]));
        ETP_OK(etp_memset_async(f->main, info.main_grad, 0x7F, f->g_bytes[i]));
    }
}

/* The NVFP4 parameter's gathered weight for `pass`, as the host reference
 * quantizes (group-wide amax, 16x16 blocks) and dequantizes the full padded
 * weight of version `ver`: BF16 [experts][padded_rows][cols], caller frees. */
static uint16_t *ref_nvfp4(size_t i, const tu_shard_layout_t *l, int ver, int pass)
{
    const gspec_t *g = &gspecs[i];
    const int64_t pr = l->padded_rows, K = g->cols;
    const etp__qref_cfg_t cfg = {ETP__QB_NVFP4, 0, 1, 0, 0, 0, 0};
    uint16_t *out = calloc((size_t)(g->experts * pr * K), sizeof(uint16_t));
    float *full = calloc((size_t)(pr * K), sizeof(float));
    uint8_t *data = calloc((size_t)(pr * K), 1);
    /* room for either direction's scale matrix (docs/FORMATS.md) */
    size_t r128 = (size_t)((pr + 127) / 128 * 128), k128 = (size_t)((K + 127) / 128 * 128);
    size_t sb = r128 * (size_t)((K / 16 + 3) / 4 * 4) + k128 * (size_t)((pr / 16 + 3) / 4 * 4);
    uint8_t *scales = calloc(sb, 1);
    assert_true(out && full && data && scales);
    for (int64_t e = 0; e < g->experts; e++) {
        memset(full, 0, (size_t)(pr * K) * sizeof(float));
        for (int64_t k = 0; k < g->rows * K; k++) {
            float x = gweight(i, ver, (size_t)(e * g->rows * K + k));
            full[k] = g->dtype == ETP_DTYPE_BF16 ? etp__bf16_to_f32(etp__f32_to_bf16(x)) : x;
        }
        float amax = etp__qref_amax(full, ETP__QB_F32, (size_t)pr, (size_t)K);
        if (pass == 0)
            etp__qref_quantize(&cfg, full, ETP__QB_F32, (size_t)pr, (size_t)K, amax, data, scales, NULL, NULL);
        else
            etp__qref_quantize(&cfg, full, ETP__QB_F32, (size_t)pr, (size_t)K, amax, NULL, NULL, data, scales);
        etp__qref_dequantize(&cfg, pass == 0 ? 1u : 2u, (size_t)pr, (size_t)K, amax, data, scales,
                             out + (size_t)(e * pr * K), ETP__QB_BF16);
    }
    free(full);
    free(data);
    free(scales);
    return out;
}

/* Copy a step's gathered weights and main_grads to host (poisoned first;
 * synchronizes) and count the elements that differ from version `ver`. */
static long check_version(gfx_t *f, int ver)
{
    for (size_t i = 0; i < NG; i++) {
        etp_param_info_t info = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(f->p[i], &info));
        tu_poison(f->got_f[i], f->out_bytes[i]);
        tu_poison(f->got_b[i], f->out_bytes[i]);
        tu_poison(f->got_g[i], f->g_bytes[i]);
        ETP_OK(etp_memcpy_async(f->main, f->got_f[i], f->out_f[i], f->out_bytes[i]));
        ETP_OK(etp_memcpy_async(f->main, f->got_b[i], f->out_b[i], f->out_bytes[i]));
        ETP_OK(etp_memcpy_async(f->main, f->got_g[i], info.main_grad, f->g_bytes[i]));
    }
    ETP_OK(etp_stream_synchronize(f->main));
    long bad = 0;
    for (size_t i = 0; i < NG; i++) {
        const gspec_t *g = &gspecs[i];
        const tu_shard_layout_t *l = &f->lay[i];
        long bw = 0, bg = 0;
        if (f->grads_only) {
            /* nothing gathered */
        } else if (g->quant == ETP_PARAM_QUANT_NONE) {
            /* plain gathers return the loaded bits */
            bw += memcmp(f->got_f[i], f->hw[i], f->out_bytes[i]) != 0;
            bw += memcmp(f->got_b[i], f->hw[i], f->out_bytes[i]) != 0;
        } else {
            for (int pass = 0; pass < 2; pass++) {
                uint16_t *want = ref_nvfp4(i, l, ver, pass);
                const uint16_t *got = pass == 0 ? f->got_f[i] : f->got_b[i];
                for (int64_t e = 0; e < g->experts; e++)
                    for (int64_t k = 0; k < g->rows * g->cols; k++)
                        bw += got[e * g->rows * g->cols + k] != want[e * l->padded_rows * g->cols + k];
                free(want);
            }
        }
        /* rank r's main_grad: scale times the sum over ranks, in rank order,
         * of their wgrads' rows of r's shard; padding rows zero */
        for (int64_t e = 0; e < g->experts; e++)
            for (int64_t row = 0; row < l->shard_rows; row++)
                for (int64_t c = 0; c < g->cols; c++) {
                    int64_t grow = l->shard_row_begin + row;
                    float want = 0.0f;
                    if (grow < g->rows) {
                        float sum = 0.0f;
                        for (int q = 0; q < g_size; q++)
                            sum += gwgrad(i, ver, q, (size_t)((e * g->rows + grow) * g->cols + c));
                        want = GSCALE * sum;
                    }
                    bg += f->got_g[i][(e * l->shard_rows + row) * g->cols + c] != want;
                }
        if ((bw || bg) && getenv("ETP_TEST_VERBOSE"))
            printf("rank %d version %d param %zu: %ld weight, %ld grad errors\n", g_rank, ver, i, bw, bg);
        bad += bw + bg;
    }
    return bad;
}

static void run_graph_replay(int64_t seed, int grads_only, int whole_step)
{
    gfx_t f;
    memset(&f, 0, sizeof f);
    f.grads_only = grads_only;
    f.ctx = tu_test_ctx(seed);
    f.tp = tu_test_tp(f.ctx, "etp");
    ETP_OK(etp_stream_create(f.ctx, ETP_STREAM_PRIORITY_NORMAL, &f.main));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = f.tp;
    cc.graphed = 1;
    cc.graph_whole_step = whole_step;
    ETP_OK(etp_chain_create(f.ctx, &cc, &f.chain));
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
        f.lay[i] = tu_assert_shard_layout(f.p[i], &pc, g_size, g_rank);
        ETP_OK(etp_chain_add(f.chain, f.p[i]));
        size_t n = (size_t)(g->experts * g->rows * g->cols);
        etp_dtype_t view_dtype = g->quant != ETP_PARAM_QUANT_NONE ? ETP_DTYPE_BF16 : g->dtype;
        f.out_bytes[i] = n * etp_dtype_size(view_dtype);
        f.w_bytes[i] = n * etp_dtype_size(g->dtype);
        f.g_bytes[i] = (size_t)(f.lay[i].experts * f.lay[i].shard_rows * g->cols) * sizeof(float);
        ETP_OK(etp_mem_alloc(f.ctx, f.out_bytes[i], ETP_MEM_USER, &f.out_f[i]));
        ETP_OK(etp_mem_alloc(f.ctx, f.out_bytes[i], ETP_MEM_USER, &f.out_b[i]));
        ETP_OK(etp_mem_alloc(f.ctx, f.w_bytes[i], ETP_MEM_USER, &f.wsrc[i]));
        f.hw[i] = malloc(f.w_bytes[i]);
        f.hg[i] = malloc(f.w_bytes[i]);
        f.got_f[i] = malloc(f.out_bytes[i]);
        f.got_b[i] = malloc(f.out_bytes[i]);
        f.got_g[i] = malloc(f.g_bytes[i]);
        assert_true(f.hw[i] && f.hg[i] && f.got_f[i] && f.got_b[i] && f.got_g[i]);
    }
    ETP_OK(etp_chain_finalize(f.chain));

    long bad = 0;
    int ver = 0;
    /* eager steps first (the first one makes the connections and the first
     * quantization): the reference holds for them too */
    for (int k = 0; k < 2; k++, ver++) {
        load_version(&f, ver);
        step(&f);
        bad += check_version(&f, ver);
    }

    etp_graph_t *graph = NULL;
    ETP_OK(etp_stream_begin_capture(f.main));
    step(&f);
    ETP_OK(etp_stream_end_capture(f.main, &graph));
    /* a replay that reused any value of an earlier one (weights, wgrads,
     * main_grad) would show against the new version */
    for (int it = 0; it < 100; it++, ver++) {
        load_version(&f, ver);
        ETP_OK(etp_graph_launch(graph, f.main));
        bad += check_version(&f, ver);
    }
    /* and eager steps still work after the capture */
    load_version(&f, ver);
    step(&f);
    bad += check_version(&f, ver);

    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (all && g_rank == 0)
        printf("seed %lld%s%s: %ld mismatches\n", (long long)seed,
               grads_only ? " (grads only)" : "", whole_step ? " (whole step)" : "", all);
    assert_int_equal(all, 0);

    ETP_OK(etp_graph_destroy(graph));
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
        free(f.hw[i]);
        free(f.hg[i]);
        free(f.got_f[i]);
        free(f.got_b[i]);
        free(f.got_g[i]);
    }
    ETP_OK(etp_stream_destroy(f.main));
    tu_test_tp_done(f.tp);
    tu_test_ctx_done(f.ctx);
}

/* The first nseeds of {0, 1, 42} in shuffle mode; seed 0 on CUDA. */
static void replay_seeds(size_t nseeds, int grads_only, int whole_step)
{
    const int64_t seeds[] = {0, 1, 42};
#ifdef ETP_SHARD_TEST_CUDA
    nseeds = 1;
#endif
    for (size_t k = 0; k < nseeds; k++) run_graph_replay(seeds[k], grads_only, whole_step);
}

static void test_graph_replay_fresh_versions(void **state)
{
    (void)state;
    replay_seeds(3, 0, 0);
}

static void test_graph_replay_grads_only(void **state)
{
    (void)state;
    replay_seeds(2, 1, 0);
}

static void test_graph_replay_whole_step(void **state)
{
    (void)state;
    replay_seeds(2, 0, 1);
}

/* graph_whole_step with forward and backward captured apart: the forward
 * capture ends with the first backward gather's prefetch on the chain's
 * all-gather stream, not joined into the capturing stream, and
 * etp_stream_end_capture says so. The last weight is quantized: an
 * unquantized one would be found whole in its forward slot, with no
 * prefetch to issue. Host backend only (on CUDA a failed capture is CUDA's
 * error, ETP_ERR_BACKEND). */
static void test_whole_step_split_capture_fails(void **state)
{
    (void)state;
#ifndef ETP_SHARD_TEST_CUDA
    etp_context_t *ctx = tu_test_ctx(3);
    etp_group_t *tp = tu_test_tp(ctx, "etp");
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = tp;
    cc.graphed = 1;
    cc.graph_whole_step = 1;
    etp_chain_t *chain;
    ETP_OK(etp_chain_create(ctx, &cc, &chain));
    etp_param_t *p[2];
    for (int i = 0; i < 2; i++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = tp;
        pc.rows = 64;
        pc.cols = 32;
        if (i == 1) {
            pc.quant = ETP_PARAM_QUANT_MXFP8;
            pc.alignment = 32;
        }
        ETP_OK(etp_param_create(ctx, &pc, &p[i]));
        ETP_OK(etp_chain_add(chain, p[i]));
    }
    ETP_OK(etp_chain_finalize(chain));
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_stream_begin_capture(s));
    for (int i = 0; i < 2; i++) {
        ETP_OK(etp_gather(p[i], ETP_PASS_FORWARD, s, &v));
        ETP_OK(etp_release(p[i], ETP_PASS_FORWARD, s));
    }
    etp_graph_t *g = NULL;
    ETP_EXPECT_MSG(etp_stream_end_capture(s, &g), ETP_ERR_INVALID_STATE, "not joined");
    assert_null(g);
    /* an ungraphed-style flag on an ungraphed chain is refused */
    etp_chain_config_t bad = ETP_CHAIN_CONFIG_INIT;
    bad.group = tp;
    bad.graph_whole_step = 1;
    etp_chain_t *none = NULL;
    assert_int_equal(etp_chain_create(ctx, &bad, &none), ETP_ERR_INVALID_ARGUMENT);
    assert_null(none);
    /* kept weights in a graphed chain whose passes may be separate graphs */
    bad.graphed = 1;
    bad.graph_whole_step = 0;
    bad.keep_bytes = 1;
    ETP_EXPECT_MSG(etp_chain_create(ctx, &bad, &none), ETP_ERR_INVALID_ARGUMENT,
                   "keep_bytes on a graphed chain needs graph_whole_step");
    assert_null(none);
    ETP_OK(etp_chain_destroy(chain));
    for (int i = 0; i < 2; i++) ETP_OK(etp_param_destroy(p[i]));
    ETP_OK(etp_stream_destroy(s));
    tu_test_tp_done(tp);
    tu_test_ctx_done(ctx);
#endif
}

/* A group of one gathers nothing: an unquantized parameter's view, eager
 * and captured, is its shard itself, with no slot allocated for it, and it
 * shows every update (written by etp_param_load_full on the gathering
 * stream, so ordered as a shard's writer must be). */
static void run_group_of_one(int graphed)
{
    etp_context_t *ctx = tu_test_ctx(5);
    etp_group_t *world, *one;
    ETP_OK(etp_context_world(ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "one";
    gc.num_roles = 2;
    ETP_OK(etp_group_split(world, g_rank, 0, &gc, &one));
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = one;
    cc.graphed = graphed;
    cc.graph_whole_step = graphed;
    etp_chain_t *chain;
    ETP_OK(etp_chain_create(ctx, &cc, &chain));
    /* a grouped BF16 weight with padding rows, and a dense F32 one */
    const gspec_t sp[2] = {{3, 40, 32, 16, ETP_DTYPE_BF16, ETP_PARAM_QUANT_NONE},
                           {1, 24, 8, 0, ETP_DTYPE_F32, ETP_PARAM_QUANT_NONE}};
    etp_param_t *p[2];
    void *hw[2], *got[2], *dev[2];
    size_t bytes[2];
    etp_memory_report_t before = ETP_MEMORY_REPORT_INIT, after = ETP_MEMORY_REPORT_INIT;
    ETP_OK(etp_memory_report(ctx, &before));
    for (int i = 0; i < 2; i++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = one;
        pc.experts = sp[i].experts;
        pc.rows = sp[i].rows;
        pc.cols = sp[i].cols;
        pc.alignment = sp[i].alignment;
        pc.dtype = sp[i].dtype;
        ETP_OK(etp_param_create(ctx, &pc, &p[i]));
        ETP_OK(etp_chain_add(chain, p[i]));
        bytes[i] = (size_t)(sp[i].experts * sp[i].rows * sp[i].cols) * etp_dtype_size(sp[i].dtype);
        hw[i] = malloc(bytes[i]);
        got[i] = malloc(bytes[i]);
        assert_non_null(hw[i]);
        assert_non_null(got[i]);
        ETP_OK(etp_mem_alloc(ctx, 2 * bytes[i], ETP_MEM_USER, &dev[i]));
    }
    ETP_OK(etp_chain_finalize(chain));
    ETP_OK(etp_memory_report(ctx, &after));
    assert_int_equal(after.bytes[ETP_MEM_GATHER_SLOTS], before.bytes[ETP_MEM_GATHER_SLOTS]);
    etp_graph_t *graph = NULL;
    for (int ver = 0; ver < 4; ver++) {
        for (int i = 0; i < 2; i++) {
            size_t n = bytes[i] / etp_dtype_size(sp[i].dtype);
            for (size_t k = 0; k < n; k++)
                gput(hw[i], sp[i].dtype, k, gweight(40 + (size_t)i, ver, k));
            ETP_OK(etp_param_load_full(p[i], hw[i], s));
            ETP_OK(etp_memset_async(s, dev[i], 0xA5, 2 * bytes[i]));
        }
        /* the step: each weight's forward and backward views copied out;
         * captured once at version 1 and replayed after */
        if (graphed && ver == 1) ETP_OK(etp_stream_begin_capture(s));
        if (!graphed || ver < 2) {
            etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
            for (int pass = 0; pass < 2; pass++)
                for (int k = 0; k < 2; k++) {
                    const int i = pass ? 1 - k : k;
                    etp_param_info_t info = ETP_PARAM_INFO_INIT;
                    ETP_OK(etp_param_info(p[i], &info));
                    ETP_OK(etp_gather(p[i], pass ? ETP_PASS_BACKWARD : ETP_PASS_FORWARD, s, &v));
                    assert_ptr_equal(v.data, info.shard);
                    copy_view(s, &v, (char *)dev[i] + (size_t)pass * bytes[i], 0);
                    ETP_OK(etp_release(p[i], pass ? ETP_PASS_BACKWARD : ETP_PASS_FORWARD, s));
                }
        }
        if (graphed && ver == 1) ETP_OK(etp_stream_end_capture(s, &graph));
        if (graph) ETP_OK(etp_graph_launch(graph, s));
        for (int i = 0; i < 2; i++)
            for (int pass = 0; pass < 2; pass++) {
                tu_poison(got[i], bytes[i]);
                ETP_OK(etp_memcpy_async(s, got[i], (char *)dev[i] + (size_t)pass * bytes[i],
                                        bytes[i]));
                ETP_OK(etp_stream_synchronize(s));
                if (memcmp(got[i], hw[i], bytes[i]) != 0)
                    fail_msg("rank %d version %d weight %d pass %d: the view is not the "
                             "loaded weight",
                             g_rank, ver, i, pass);
            }
    }
    if (graph) ETP_OK(etp_graph_destroy(graph));
    ETP_OK(etp_chain_destroy(chain));
    for (int i = 0; i < 2; i++) {
        ETP_OK(etp_param_destroy(p[i]));
        ETP_OK(etp_mem_free(ctx, dev[i]));
        free(hw[i]);
        free(got[i]);
    }
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_group_destroy(one));
    tu_test_ctx_done(ctx);
}

static void test_group_of_one_gathers_nothing(void **state)
{
    (void)state;
    run_group_of_one(0);
    run_group_of_one(1);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shard_graph");
#ifdef ETP_SHARD_TEST_CUDA
    if (tu_gpu_short("test_gpu_shard_graph")) return tu_gpu_skip();
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graph_replay_fresh_versions),
                                       cmocka_unit_test(test_graph_replay_grads_only),
                                       cmocka_unit_test(test_graph_replay_whole_step),
                                       cmocka_unit_test(test_whole_step_split_capture_fails),
                                       cmocka_unit_test(test_group_of_one_gathers_nothing)};
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
