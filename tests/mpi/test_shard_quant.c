/*
 * Quantized gathers (MXFP8, NVFP4; 1 to 64 experts) equal quantizing the full
 * padded weight with the host reference (NVFP4 with the group's amax), data
 * and scales, forward (rowwise) and backward (columnwise); the dequantized
 * variant equals the reference dequantization; with cache_gathered_scales,
 * every gather of a version after its first equals it too, and a cached
 * view's reader on another stream keeps its scales until its release.
 * Host backend in shuffle mode,
 * or the CUDA backend when built as tests/gpu/test_gpu_shard_quant.c.
 */
#include <math.h>

#include "core/half.h"
#include "mpi_util.h"
#include "quant/formats/quant_ref.h"
#include "shard/shard_internal.h"
#include "test_shard_layout.h"

typedef struct {
    etp_param_quant_t quant;
    int64_t experts, rows, cols;
    int alignment;
    etp_dtype_t dtype;
    int dequant;
    int swizzle; /* gathered scales in cuBLASLt's swizzled order */
    int cache;   /* cache_gathered_scales: each pass gathered twice a step */
} qspec_t;

static const qspec_t qspecs[] = {
    {ETP_PARAM_QUANT_MXFP8, 1, 70, 64, 32, ETP_DTYPE_BF16, 0, 0, 0},
    {ETP_PARAM_QUANT_NVFP4, 1, 45, 32, 16, ETP_DTYPE_F32, 0, 0, 0},
    {ETP_PARAM_QUANT_NVFP4, 3, 100, 48, 16, ETP_DTYPE_BF16, 0, 0, 0},
    {ETP_PARAM_QUANT_MXFP8, 3, 33, 32, 64, ETP_DTYPE_F32, 0, 0, 0},
    {ETP_PARAM_QUANT_NVFP4, 64, 16, 16, 16, ETP_DTYPE_BF16, 0, 0, 0},
    {ETP_PARAM_QUANT_MXFP8, 64, 20, 32, 32, ETP_DTYPE_BF16, 0, 0, 0},
    {ETP_PARAM_QUANT_NVFP4, 2, 130, 64, 32, ETP_DTYPE_BF16, 1, 0, 0},
    {ETP_PARAM_QUANT_MXFP8, 2, 40, 64, 32, ETP_DTYPE_F32, 1, 0, 0},
    /* shards of a multiple of 128 rows: scales gathered in place */
    {ETP_PARAM_QUANT_MXFP8, 2, 300, 64, 128, ETP_DTYPE_BF16, 0, 0, 0},
    {ETP_PARAM_QUANT_NVFP4, 1, 250, 32, 128, ETP_DTYPE_BF16, 0, 0, 0},
    /* swizzled scales: one and several experts, in place and re-laid */
    {ETP_PARAM_QUANT_NVFP4, 3, 100, 48, 16, ETP_DTYPE_BF16, 0, 1, 0},
    {ETP_PARAM_QUANT_MXFP8, 2, 300, 160, 128, ETP_DTYPE_BF16, 0, 1, 0},
    {ETP_PARAM_QUANT_MXFP8, 1, 70, 64, 32, ETP_DTYPE_F32, 0, 1, 0},
    /* cached scales: re-laid and in place, swizzled, dequantized */
    {ETP_PARAM_QUANT_MXFP8, 1, 70, 64, 32, ETP_DTYPE_BF16, 0, 0, 1},
    {ETP_PARAM_QUANT_NVFP4, 3, 100, 48, 16, ETP_DTYPE_BF16, 0, 1, 1},
    {ETP_PARAM_QUANT_MXFP8, 2, 300, 64, 128, ETP_DTYPE_F32, 0, 0, 1},
    {ETP_PARAM_QUANT_NVFP4, 1, 250, 32, 128, ETP_DTYPE_BF16, 0, 0, 1},
    {ETP_PARAM_QUANT_NVFP4, 2, 130, 64, 32, ETP_DTYPE_BF16, 1, 0, 1},
};
#define NQ (sizeof qspecs / sizeof qspecs[0])

/* Values over many binades, both signs, so scales differ per block. */
static float value(int p, int step, int64_t e, int64_t r, int64_t c)
{
    uint64_t x = tu_rand(g_seed, 300 + (uint64_t)p, (uint64_t)step, (uint64_t)((e * 4096 + r) * 4096 + c));
    float m = (float)(x & 0xffff) / 65536.0f;
    int ex = (int)((x >> 16) % 12) - 6 + (int)(r / 16 % 3);
    return ((x >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, ex);
}

static void put(void *b, etp_dtype_t t, size_t i, float v)
{
    if (t == ETP_DTYPE_BF16)
        ((uint16_t *)b)[i] = etp__f32_to_bf16(v);
    else
        ((float *)b)[i] = v;
}


/* Copy n bytes the device holds into a fresh host buffer (main is synced). */
static void *fetch(etp_stream_t *s, const void *src, size_t n)
{
    void *h = malloc(n ? n : 1);
    assert_non_null(h);
    tu_poison(h, n);
    if (n) ETP_OK(etp_memcpy_async(s, h, src, n));
    ETP_OK(etp_stream_synchronize(s));
    return h;
}

static int64_t roundup(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* One expert's gathered layout for a pass, from docs/FORMATS.md's tables
 * for the full padded weight [M, K] (M = padded rows), not from the
 * library: data bytes and row pitch, scale matrix rows x cols bytes. */
typedef struct {
    int64_t data_bytes, ld, scale_rows, scale_cols;
} qdir_t;

static qdir_t expected_dir(const qspec_t *q, int pass)
{
    const int64_t M = tu_shard_layout(q->experts, q->rows, q->alignment, g_size, g_rank).padded_rows;
    const int64_t K = q->cols;
    qdir_t d;
    if (q->quant == ETP_PARAM_QUANT_NVFP4) {
        if (pass == 0) { /* rowwise: [M, K/2], scales [roundup(M,128), roundup(K/16,4)] */
            d.ld = K / 2;
            d.scale_rows = roundup(M, 128);
            d.scale_cols = roundup(K / 16, 4);
        } else { /* columnwise, the transpose: [K, M/2], scales [roundup(K,128), roundup(M/16,4)] */
            d.ld = M / 2;
            d.scale_rows = roundup(K, 128);
            d.scale_cols = roundup(M / 16, 4);
        }
        d.data_bytes = M * K / 2;
    } else {
        d.ld = K; /* both directions [M, K] */
        if (pass == 0) { /* scales [roundup(M,128), roundup(K/32,4)] */
            d.scale_rows = roundup(M, 128);
            d.scale_cols = roundup(K / 32, 4);
        } else { /* scales [roundup(M/32,4), roundup(K,128)] */
            d.scale_rows = roundup(M / 32, 4);
            d.scale_cols = roundup(K, 128);
        }
        d.data_bytes = M * K;
    }
    return d;
}

/* Expert e of parameter i at `step` quantized by the host reference, as
 * every rank can build it: the full padded weight (NVFP4 with its amax).
 * *data and *scales are the caller's to free. */
static void ref_quant(int i, const qspec_t *q, int step, int pass, int64_t e, uint8_t **data,
                      uint8_t **scales, float *amax)
{
    const int64_t pr = tu_shard_layout(q->experts, q->rows, q->alignment, g_size, g_rank).padded_rows;
    const int64_t K = q->cols;
    const qdir_t d = expected_dir(q, pass);
    etp__qref_cfg_t cfg = {q->quant == ETP_PARAM_QUANT_MXFP8 ? ETP__QB_MXFP8 : ETP__QB_NVFP4, 0,
                           q->quant == ETP_PARAM_QUANT_NVFP4, q->swizzle, 0, 0, 0};
    float *full = calloc((size_t)(pr * K), sizeof(float));
    for (int64_t r = 0; r < q->rows; r++)
        for (int64_t c = 0; c < K; c++) {
            float x = value(i, step, e, r, c);
            /* round as the parameter stores it */
            full[r * K + c] = q->dtype == ETP_DTYPE_BF16 ? etp__bf16_to_f32(etp__f32_to_bf16(x)) : x;
        }
    *amax = q->quant == ETP_PARAM_QUANT_NVFP4 ? etp__qref_amax(full, ETP__QB_F32, (size_t)pr, (size_t)K) : 0.0f;
    *data = calloc((size_t)d.data_bytes, 1);
    *scales = calloc((size_t)(d.scale_rows * d.scale_cols), 1);
    assert_true(full && *data && *scales);
    if (pass == 0)
        etp__qref_quantize(&cfg, full, ETP__QB_F32, (size_t)pr, (size_t)K, *amax, *data, *scales, NULL, NULL);
    else
        etp__qref_quantize(&cfg, full, ETP__QB_F32, (size_t)pr, (size_t)K, *amax, NULL, NULL, *data, *scales);
    free(full);
}

/* A gather's view against the documented layout, so that the sizes the
 * comparisons use cannot come from a wrong view: quantized views in bytes,
 * experts packed at their data and scale sizes, an amax per expert for
 * NVFP4 and none for MXFP8; dequantized views BF16 [padded_rows, cols] per
 * expert in elements, of quant NONE and so without amax. */
static void assert_view_layout(const qspec_t *q, int pass, const etp_weight_view_t *v)
{
    const int64_t pr = tu_shard_layout(q->experts, q->rows, q->alignment, g_size, g_rank).padded_rows;
    assert_int_equal(v->experts, q->experts);
    assert_int_equal(v->rows, q->rows);
    assert_int_equal(v->cols, q->cols);
    assert_non_null(v->data);
    if (q->dequant) {
        assert_int_equal(v->dtype, ETP_DTYPE_BF16);
        assert_int_equal(v->quant, ETP_PARAM_QUANT_NONE);
        assert_int_equal(v->ld, q->cols);
        assert_int_equal(v->expert_stride, pr * q->cols);
        assert_null(v->amax);
        return;
    }
    const qdir_t d = expected_dir(q, pass);
    assert_int_equal(v->quant, q->quant);
    assert_int_equal(v->dtype, ETP_DTYPE_U8);
    assert_int_equal(v->scales_swizzled, q->swizzle);
    assert_int_equal(v->ld, d.ld);
    assert_int_equal(v->expert_stride, d.data_bytes);
    assert_int_equal(v->scale_rows, d.scale_rows);
    assert_int_equal(v->scale_cols, d.scale_cols);
    /* swizzling reorders the same bytes */
    assert_int_equal(v->scale_expert_stride, d.scale_rows * d.scale_cols);
    assert_non_null(v->scales);
    if (q->quant == ETP_PARAM_QUANT_NVFP4)
        assert_non_null(v->amax);
    else
        assert_null(v->amax);
}

static long check_param(int i, const qspec_t *q, etp_param_t *p, etp_stream_t *main_s, int step)
{
    const int64_t pr = tu_shard_layout(q->experts, q->rows, q->alignment, g_size, g_rank).padded_rows;
    const int64_t K = q->cols;
    etp__qref_cfg_t cfg = {q->quant == ETP_PARAM_QUANT_MXFP8 ? ETP__QB_MXFP8 : ETP__QB_NVFP4, 0,
                           q->quant == ETP_PARAM_QUANT_NVFP4, q->swizzle, 0, 0, 0};
    long bad = 0;
    for (int g = 0; g < (q->cache ? 4 : 2); g++) {
        const int pass = g % 2;
        const qdir_t d = expected_dir(q, pass);
        /* per expert: BF16 elements dequantized, else the documented bytes */
        const size_t data_e = q->dequant ? (size_t)(pr * K) * sizeof(uint16_t) : (size_t)d.data_bytes;
        const size_t scales_e = (size_t)(d.scale_rows * d.scale_cols);
        etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
        ETP_OK(etp_gather(p, (etp_pass_t)pass, main_s, &v));
        assert_view_layout(q, pass, &v);
        uint8_t *data = fetch(main_s, v.data, data_e * (size_t)q->experts);
        uint8_t *scales = q->dequant ? NULL : fetch(main_s, v.scales, scales_e * (size_t)q->experts);
        const int fp4 = !q->dequant && q->quant == ETP_PARAM_QUANT_NVFP4;
        float *amax = fp4 ? fetch(main_s, v.amax, (size_t)q->experts * sizeof(float)) : NULL;
        ETP_OK(etp_release(p, (etp_pass_t)pass, main_s));
        for (int64_t e = 0; e < q->experts; e++) {
            uint8_t *ref_data, *ref_scales;
            float ref_amax;
            ref_quant(i, q, step, pass, e, &ref_data, &ref_scales, &ref_amax);
            if (q->dequant) {
                uint16_t *deq = calloc((size_t)(pr * K), sizeof(uint16_t));
                etp__qref_dequantize(&cfg, pass == 0 ? 1u : 2u, (size_t)pr, (size_t)K, ref_amax, ref_data,
                                     ref_scales, deq, ETP__QB_BF16);
                const uint16_t *got = (const uint16_t *)(data + (size_t)e * data_e);
                for (int64_t k = 0; k < q->rows * K; k++) bad += got[k] != deq[k];
                free(deq);
            } else {
                bad += memcmp(data + (size_t)e * data_e, ref_data, data_e) != 0;
                bad += memcmp(scales + (size_t)e * scales_e, ref_scales, scales_e) != 0;
                if (fp4) bad += memcmp(&amax[e], &ref_amax, sizeof(float)) != 0;
                if (getenv("ETP_TEST_VERBOSE") && bad)
                    printf("rank %d param %d pass %d expert %lld: mismatch\n", g_rank, i, pass, (long long)e);
            }
            free(ref_data);
            free(ref_scales);
        }
        free(data);
        free(scales);
        free(amax);
    }
    return bad;
}

static void run_quant_gathers(int64_t seed)
{
    etp_context_t *ctx = tu_test_ctx(seed);
    etp_group_t *tp;
    tp = tu_test_tp(ctx, "etp");
    etp_stream_t *main_s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &main_s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = tp;
    etp_chain_t *chain;
    ETP_OK(etp_chain_create(ctx, &cc, &chain));
    etp_param_t *p[NQ];
    for (size_t i = 0; i < NQ; i++) {
        const qspec_t *q = &qspecs[i];
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = tp;
        pc.experts = q->experts;
        pc.rows = q->rows;
        pc.cols = q->cols;
        pc.alignment = q->alignment;
        pc.dtype = q->dtype;
        pc.quant = q->quant;
        pc.gather_dequantized = q->dequant;
        pc.swizzle_scales = q->swizzle;
        pc.cache_gathered_scales = q->cache;
        ETP_OK(etp_param_create(ctx, &pc, &p[i]));
        (void)tu_assert_shard_layout(p[i], &pc, g_size, g_rank);
        ETP_OK(etp_chain_add(chain, p[i]));
    }
    ETP_OK(etp_chain_finalize(chain));
    long bad = 0;
    for (int step = 0; step < 2; step++) {
        /* new weights each step: the quantized shard must be refreshed */
        void *hold[NQ];
        for (size_t i = 0; i < NQ; i++) {
            const qspec_t *q = &qspecs[i];
            size_t n = (size_t)(q->experts * q->rows * q->cols);
            hold[i] = malloc(n * etp_dtype_size(q->dtype));
            for (int64_t e = 0; e < q->experts; e++)
                for (int64_t r = 0; r < q->rows; r++)
                    for (int64_t c = 0; c < q->cols; c++)
                        put(hold[i], q->dtype, (size_t)((e * q->rows + r) * q->cols + c),
                            value((int)i, step, e, r, c));
            ETP_OK(etp_param_load_full(p[i], hold[i], main_s));
        }
        /* Each parameter forward then backward: out of the planned order on
         * purpose, so prefetched tickets get evicted and gathered again. */
        for (size_t i = 0; i < NQ; i++) bad += check_param((int)i, &qspecs[i], p[i], main_s, step);
        ETP_OK(etp_stream_synchronize(main_s));
        for (size_t i = 0; i < NQ; i++) free(hold[i]);
    }
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (all && g_rank == 0) printf("seed %lld: %ld mismatches\n", (long long)seed, all);
    assert_int_equal(all, 0);
    etp_stream_t *ag, *rs;
    ETP_OK(etp_chain_streams(chain, &ag, &rs));
    ETP_OK(etp_stream_synchronize(ag));
    ETP_OK(etp_chain_destroy(chain));
    for (size_t i = 0; i < NQ; i++) ETP_OK(etp_param_destroy(p[i]));
    ETP_OK(etp_stream_destroy(main_s));
    tu_test_tp_done(tp);
    tu_test_ctx_done(ctx);
}

#ifndef ETP_SHARD_TEST_CUDA
/* A cached view's scales (cross: a backward view's, and its amaxes) read on
 * a stream of their own: the next version
 * may rewrite the cache only after that reader's release, which the
 * all-gather stream's wait for mark_updated does not give (the update is on
 * another stream) and the slot-release edge does. Returns the expert-scale
 * matrices the reader got wrong (summed over ranks), with `skip` the edges
 * left out. */
static long cache_reader(int64_t seed, unsigned skip, int cross)
{
    const qspec_t q = {ETP_PARAM_QUANT_NVFP4, 2, 100, 48, 16, ETP_DTYPE_BF16, 0, 0, 1};
    const int id = 90;
    etp_context_t *ctx = tu_test_ctx(seed);
    etp_group_t *tp;
    tp = tu_test_tp(ctx, "etp");
    etp_stream_t *main_s, *side;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &main_s));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &side));
    etp_event_t *ev;
    ETP_OK(etp_event_create(ctx, &ev));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = tp;
    etp_chain_t *chain;
    ETP_OK(etp_chain_create(ctx, &cc, &chain));
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.group = tp;
    pc.experts = q.experts;
    pc.rows = q.rows;
    pc.cols = q.cols;
    pc.alignment = q.alignment;
    pc.dtype = q.dtype;
    pc.quant = q.quant;
    pc.cache_gathered_scales = 1;
    etp_param_t *p, *p2 = NULL;
    ETP_OK(etp_param_create(ctx, &pc, &p));
    (void)tu_assert_shard_layout(p, &pc, g_size, g_rank);
    ETP_OK(etp_chain_add(chain, p));
    if (cross) { /* a second parameter after it: the slots are no longer one per pair of passes */
        ETP_OK(etp_param_create(ctx, &pc, &p2));
        (void)tu_assert_shard_layout(p2, &pc, g_size, g_rank);
        ETP_OK(etp_chain_add(chain, p2));
    }
    ETP_OK(etp_chain_finalize(chain));
    etp__chain_test_skip_edges(chain, skip);
    size_t n = (size_t)(q.experts * q.rows * q.cols);
    void *w[2];
    for (int step = 0; step < 2; step++) {
        w[step] = malloc(n * etp_dtype_size(q.dtype));
        for (int64_t e = 0; e < q.experts; e++)
            for (int64_t r = 0; r < q.rows; r++)
                for (int64_t c = 0; c < q.cols; c++)
                    /* cross: the second version's amaxes 4 times the first's */
                    put(w[step], q.dtype, (size_t)((e * q.rows + r) * q.cols + c),
                        value(id, step, e, r, c) * (cross && step ? 4.0f : 1.0f));
    }
    ETP_OK(etp_param_load_full(p, w[0], main_s));
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    /* cross: the backward view of the first version is the one read; the
     * next version's forward gather refreshes the other direction's cache */
    const etp_pass_t read_pass = cross ? ETP_PASS_BACKWARD : ETP_PASS_FORWARD;
    if (cross) { /* forward A, B; backward B, then A (read below) */
        ETP_OK(etp_param_load_full(p2, w[0], main_s));
        ETP_OK(etp_gather(p, ETP_PASS_FORWARD, main_s, &v));
        ETP_OK(etp_release(p, ETP_PASS_FORWARD, main_s));
        ETP_OK(etp_gather(p2, ETP_PASS_FORWARD, main_s, &v));
        ETP_OK(etp_release(p2, ETP_PASS_FORWARD, main_s));
        ETP_OK(etp_gather(p2, ETP_PASS_BACKWARD, main_s, &v));
        ETP_OK(etp_release(p2, ETP_PASS_BACKWARD, main_s));
    }
    ETP_OK(etp_gather(p, read_pass, main_s, &v));
    assert_view_layout(&q, (int)read_pass, &v);
    const qdir_t d = expected_dir(&q, (int)read_pass);
    const size_t stride = (size_t)(d.scale_rows * d.scale_cols), sb = stride * (size_t)q.experts;
    uint8_t *got = malloc(sb);
    float *got_amax = malloc((size_t)q.experts * sizeof(float));
    tu_poison(got, sb);
    tu_poison(got_amax, (size_t)q.experts * sizeof(float));
    ETP_OK(etp_event_record(ev, main_s));
    ETP_OK(etp_stream_wait_event(side, ev));
    ETP_OK(etp_memcpy_async(side, got, v.scales, sb));
    ETP_OK(etp_memcpy_async(side, got_amax, v.amax, (size_t)q.experts * sizeof(float)));
    ETP_OK(etp_release(p, read_pass, side));
    /* the next version, updated and gathered on main */
    ETP_OK(etp_param_load_full(p, w[1], main_s));
    ETP_OK(etp_gather(p, ETP_PASS_FORWARD, main_s, &v));
    ETP_OK(etp_release(p, ETP_PASS_FORWARD, main_s));
    etp_stream_t *ag, *rs;
    ETP_OK(etp_chain_streams(chain, &ag, &rs));
    /* the all-gather stream first: the reader last, as late as it may run */
    ETP_OK(etp_stream_synchronize(ag));
    ETP_OK(etp_stream_synchronize(main_s));
    ETP_OK(etp_stream_synchronize(side));
    long bad = 0;
    for (int64_t e = 0; e < q.experts; e++) {
        uint8_t *ref_data, *ref_scales;
        float ref_amax;
        ref_quant(id, &q, 0, cross ? 1 : 0, e, &ref_data, &ref_scales, &ref_amax);
        bad += memcmp(got + (size_t)e * stride, ref_scales, stride) != 0;
        bad += memcmp(&got_amax[e], &ref_amax, sizeof(float)) != 0;
        free(ref_data);
        free(ref_scales);
    }
    free(got);
    free(got_amax);
    free(w[0]);
    free(w[1]);
    ETP_OK(etp_chain_destroy(chain));
    ETP_OK(etp_param_destroy(p));
    if (p2) ETP_OK(etp_param_destroy(p2));
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_stream_destroy(side));
    ETP_OK(etp_stream_destroy(main_s));
    tu_test_tp_done(tp);
    tu_test_ctx_done(ctx);
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return all;
}

/* The forward view: wrong without the slot-release edge (seed 0), right
 * with it (seeds 0, 2). The backward view (cross): right even without it,
 * since a forward refresh writes only the forward direction's cache, its
 * amaxes included (a cache shared by the directions got it wrong). */
static void check_cache_reader(int cross)
{
    long without = cache_reader(0, ETP__EDGE_SLOT_RELEASE, cross);
    if (g_rank == 0)
        printf("%s, without edge slot release: %ld wrong\n", cross ? "backward view" : "forward view", without);
    if (cross)
        assert_int_equal(without, 0);
    else
        assert_true(without > 0);
    assert_int_equal(cache_reader(0, 0, cross), 0);
    assert_int_equal(cache_reader(2, 0, cross), 0);
}

static void test_edge_slot_release_scale_cache(void **state)
{
    (void)state;
    check_cache_reader(0);
}

/* The other direction's refresh: in a chain of two parameters, the first
 * one's backward view of a version, read late on a stream of its own, keeps
 * its scales and NVFP4 amaxes while the next version's forward gather
 * refreshes that parameter's forward cache: each direction has its own,
 * amaxes included, so no edge is needed for it. */
static void test_scale_cache_directions_apart(void **state)
{
    (void)state;
    check_cache_reader(1);
}
#endif

static void test_quantized_gathers(void **state)
{
    (void)state;
    const int64_t seeds[] = {0, 1, 42};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) run_quant_gathers(seeds[k]);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shard_quant");
#ifdef ETP_SHARD_TEST_CUDA
    if (tu_gpu_short("test_gpu_shard_quant")) return tu_gpu_skip();
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantized_gathers),
#ifndef ETP_SHARD_TEST_CUDA
        cmocka_unit_test(test_edge_slot_release_scale_cache),
        cmocka_unit_test(test_scale_cache_directions_apart),
#endif
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
