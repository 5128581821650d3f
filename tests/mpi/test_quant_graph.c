/*
 * A quantize captured into a graph (labels mpi, quant; 1 and 2 ranks): the
 * whole etp_quant_quantize (multi-amax, the amax all-reduce over the world,
 * the cast; NVFP4 1D/2D/stochastic and MXFP8 E4M3/E5M2, scales row-major
 * or swizzled) and, for row-major configurations, an etp_quant_swizzle_scales
 * of its scales, captured once with etp_stream_begin_capture /
 * etp_stream_end_capture:
 * - capturing runs nothing (outputs still poisoned);
 * - each replay, on new data written into the same input buffers, and the
 *   same calls run eagerly on that data, equal byte for byte (data, scales,
 *   amaxes, swizzled scales, guard bytes) the host reference quantizer
 *   (quant/formats/quant_ref.c) on that data and the amaxes of every rank's
 *   tensors (replayed here);
 * - the no-op flag's pointer is set throughout: with the flag 0 the calls
 *   run; a replay with the flag 1 leaves every output as it was (the amax
 *   all-reduce still runs, on equal values: a no-op too), and clearing the
 *   flag makes the next replay quantize again.
 * The host backend enforces CUDA's capture rules (eager and shuffle
 * streams); built as tests/gpu/test_quant_graph_gpu.c (ETP_QUANT_GRAPH_CUDA)
 * the same program runs with CUDA graphs and NCCL on 1 and 2 GPUs. Buffers
 * are reached only through etp_memcpy_async, so the program is the same on
 * both.
 */
#include <math.h>

#include "mpi_util.h"
#include "quant/formats/quant_ref.h"

#ifdef ETP_QUANT_GRAPH_CUDA
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#include "test_knobs.h"
static int backend_present(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#else
static int backend_present(void)
{
    return 1;
}
#endif

enum { N_TENSORS = 9, REPLAYS = 3 };

typedef struct {
    size_t off, bytes;
} slot_t;

static slot_t take(size_t *cursor, size_t bytes)
{
    slot_t sl = {*cursor, bytes};
    *cursor += (bytes + 1 + 255) / 256 * 256;
    return sl;
}

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
    uint8_t *dev, *host; /* the arena and its mirror */
    size_t arena;
    size_t out_begin;    /* outputs are the arena's bytes [out_begin, arena) */
} fx_t;

static void up(fx_t *f, size_t off, size_t bytes)
{
    ETP_OK(etp_memcpy_async(f->s, f->dev + off, f->host + off, bytes));
    ETP_OK(etp_stream_synchronize(f->s));
}

static void down(fx_t *f, uint8_t *to)
{
    ETP_OK(etp_memcpy_async(f->s, to, f->dev + f->out_begin, f->arena - f->out_begin));
    ETP_OK(etp_stream_synchronize(f->s));
}

/* The outputs' poison: a byte pattern that varies along the range, so that
 * a kernel copying poisoned bytes to other places (the NVFP4 scale
 * expansion, run when it should be skipped) changes them; every 4 bytes
 * are a finite negative float, so that the no-op replay's amax all-reduce
 * (max over ranks of equal poison) leaves them as they are. */
static void poison_pattern(uint8_t *to, size_t bytes)
{
    for (size_t o = 0; o < bytes; o++) to[o] = (uint8_t)(0xA0u | (((uint32_t)o * 2654435761u) >> 28));
}

static void poison_outputs(fx_t *f)
{
    poison_pattern(f->host + f->out_begin, f->arena - f->out_begin);
    up(f, f->out_begin, f->arena - f->out_begin);
}

/* Rank `rank`'s tensor i (any rank's, so that each can replay the others'
 * for the all-reduced amax): shapes differ between ranks (the all-reduce
 * still has one amax per tensor index), empty ones included. */
static void shape_of(const etp_quantizer_config_t *c, int rank, uint64_t tag, size_t i,
                     size_t *rows, size_t *cols, etp_dtype_t *dt)
{
    const size_t blk = c->format == ETP_QUANT_NVFP4 ? 16 : 32;
    const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)rank, 1, i);
    *rows = 1 + r % 200;
    *cols = 1 + (r >> 10) % 200;
    if (c->directions & ETP_QUANT_ROWWISE) *cols = blk * (1 + (r >> 20) % 9);
    if (c->directions & ETP_QUANT_COLUMNWISE) *rows = blk * (1 + (r >> 30) % 9);
    if (i == 4) *rows = 0;
    if (i == 1 && c->format == ETP_QUANT_NVFP4 && c->nvfp4_block == ETP_QUANT_BLOCK_2D && !c->swizzle_scales) {
        /* scale rows of 16-byte multiples both ways and whole tiles: the
         * cast's compaction and its expansion kernel apply
         * (ETP_TEST_QUANT_COMPACT_ALL=1, test_quant_graph_gpu_np1_compact) */
        *rows = 256;
        *cols = 256 * (1 + (r >> 50) % 2);
    }
    *dt = (r >> 40) & 1 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
    if (c->format == ETP_QUANT_MXFP8 && c->mxfp8_elem == ETP_QUANT_ELEM_E5M2 &&
        c->directions == (ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE) && !c->swizzle_scales) {
        /* BF16 of 128-row and 512-column multiples: the CUDA cast's
         * whole-tile kernel (kernels/quant/cast_v3_whole.cuh) is captured */
        *rows = i == 4 ? 0 : 128 * (1 + r % 2);
        *cols = 512;
        *dt = ETP_DTYPE_BF16;
    }
}

static float value_of(int rank, uint64_t tag, uint64_t step, size_t i, size_t e)
{
    const uint64_t r = tu_rand(g_seed, tag * 1000 + step, (uint64_t)rank * 1000 + i, e);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    if ((r >> 40) % 97 == 0) return 0.0f;
    /* per-step ranges differ, so each step's amaxes and scales do too */
    const int ex = (int)((r >> 24) % 24) - 12 + (int)((step * 5 + i) % 7);
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, ex);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* finite inputs only */
}

/* Rank `rank`'s tensor i of step `step` into x (rows x cols of dt). */
static void make_input(int rank, uint64_t tag, uint64_t step, size_t i, size_t rows, size_t cols,
                       etp_dtype_t dt, uint8_t *x)
{
    for (size_t e = 0; e < rows * cols; e++) {
        const float v = value_of(rank, tag, step, i, e);
        if (dt == ETP_DTYPE_BF16) {
            const uint16_t h = to_bf16(v);
            memcpy(x + 2 * e, &h, 2);
        } else {
            memcpy(x + 4 * e, &v, 4);
        }
    }
}

/* Write step `step`'s inputs into the host mirror and upload them. */
static void upload_inputs(fx_t *f, size_t n, const slot_t *sx, const etp_quant_input_t *in,
                          uint64_t tag, uint64_t step)
{
    for (size_t i = 0; i < n; i++)
        make_input(g_rank, tag, step, i, in[i].rows, in[i].cols, in[i].dtype, f->host + sx[i].off);
    up(f, 0, f->out_begin);
}

typedef struct {
    etp_quantizer_t *q;
    size_t n;
    const etp_quant_input_t *in;
    const etp_quant_output_t *out;
    float *amax;
    const etp_quant_scales_t *rm, *swz; /* NULL: no swizzle step */
} step_t;

/* The captured work: one quantize (and one swizzle). */
static void step_calls(fx_t *f, const step_t *st)
{
    ETP_OK(etp_quant_quantize(st->q, st->n, st->in, st->amax, st->n, f->world, 0, st->out, f->s));
    if (st->rm)
        ETP_OK(etp_quant_swizzle_scales(st->q, st->n, st->rm, st->swz, ETP_QUANT_SWIZZLE, f->s));
}

static void expect_same(const uint8_t *got, const uint8_t *want, size_t len, const char *what,
                        uint64_t tag, uint64_t step)
{
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < len; k++)
        if (got[k] != want[k] && bad++ == 0) first = k;
    if (bad)
        print_error("rank %d config %llu step %llu: %s: %zu of %zu output bytes differ, first at "
                    "%zu: 0x%02x, expected 0x%02x\n",
                    g_rank, (unsigned long long)tag, (unsigned long long)step, what, bad, len,
                    first, got[first], want[first]);
    assert_int_equal(bad, 0);
}

/* Where a configuration's buffers lie in the arena. */
typedef struct {
    size_t n;
    slot_t sx[N_TENSORS], so[N_TENSORS][4], sw[N_TENSORS][2], amax;
    etp_quant_input_t in[N_TENSORS];
    int with_swizzle;
} layout_t;

static int qref_dtype(etp_dtype_t dt)
{
    return dt == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32;
}

/* What the outputs' range [out_begin, arena) must hold after step `step`'s
 * quantize (and swizzle), from the host reference quantizer
 * (quant/formats/quant_ref.c, the oracle; no code of the calls under test):
 * NVFP4 amax i the max of the reference amax over every rank's tensor i
 * (each rank's inputs replayed here), the cast of this rank's inputs on it,
 * and the swizzled scales as the reference writes them with swizzle_scales
 * = 1; the poison everywhere else (guard bytes, and MXFP8's amaxes, which
 * its quantize ignores). */
static void reference_image(const fx_t *f, const etp_quantizer_config_t *cfg, const layout_t *l,
                            uint64_t tag, uint64_t step, uint8_t *want)
{
    const size_t base = f->out_begin;
    const int nv = cfg->format == ETP_QUANT_NVFP4;
    const int row = (cfg->directions & ETP_QUANT_ROWWISE) != 0;
    const int col = (cfg->directions & ETP_QUANT_COLUMNWISE) != 0;
    poison_pattern(want, f->arena - base);
    for (size_t i = 0; i < l->n; i++) {
        const etp_quant_input_t *in = &l->in[i];
        float amax = 0.0f;
        if (nv) {
            for (int p = 0; p < g_size; p++) {
                size_t rows, cols;
                etp_dtype_t dt;
                shape_of(cfg, p, tag, i, &rows, &cols, &dt);
                uint8_t *x = malloc(rows * cols * 4 + 4);
                make_input(p, tag, step, i, rows, cols, dt, x);
                const float a = etp__qref_amax(x, qref_dtype(dt), rows, cols);
                if (a > amax) amax = a;
                free(x);
            }
            memcpy(want + l->amax.off - base + 4 * i, &amax, 4);
        }
        etp__qref_cfg_t rc = {nv ? ETP__QB_NVFP4 : ETP__QB_MXFP8,
                              cfg->mxfp8_elem == ETP_QUANT_ELEM_E5M2,
                              cfg->nvfp4_block == ETP_QUANT_BLOCK_2D, cfg->swizzle_scales,
                              cfg->rounding == ETP_QUANT_ROUND_STOCHASTIC, cfg->seed, (uint32_t)i};
        uint8_t *o[4];
        for (int k = 0; k < 4; k++) o[k] = want + l->so[i][k].off - base;
        const uint8_t *x = f->host + l->sx[i].off;
        etp__qref_quantize(&rc, x, qref_dtype(in->dtype), in->rows, in->cols, amax,
                           row ? o[0] : NULL, o[1], col ? o[2] : NULL, o[3]);
        if (l->with_swizzle) {
            size_t len[4], total = 4;
            for (int k = 0; k < 4; k++) total += len[k] = l->so[i][k].bytes;
            uint8_t *t = malloc(total);
            rc.swizzle = 1;
            etp__qref_quantize(&rc, x, qref_dtype(in->dtype), in->rows, in->cols, amax,
                               row ? t : NULL, t + len[0], col ? t + len[0] + len[1] : NULL,
                               t + len[0] + len[1] + len[2]);
            memcpy(want + l->sw[i][0].off - base, t + len[0], l->sw[i][0].bytes);
            memcpy(want + l->sw[i][1].off - base, t + len[0] + len[1] + len[2], l->sw[i][1].bytes);
            free(t);
        }
    }
}

static void run_config(fx_t *f, etp_quantizer_config_t cfg, uint64_t tag)
{
    const size_t n = N_TENSORS;
    layout_t l = {.n = n, .with_swizzle = !cfg.swizzle_scales};
    size_t cur = 0;
    /* inputs first, then every output: they are poisoned and compared as one range */
    etp_quant_output_t out[N_TENSORS];
    etp_quant_scales_t rm[N_TENSORS], swz[N_TENSORS];
    etp_quant_sizes_t sz[N_TENSORS];
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(f->ctx, &cfg, &q));
    for (size_t i = 0; i < n; i++) {
        etp_quant_input_t *in = &l.in[i];
        shape_of(&cfg, g_rank, tag, i, &in->rows, &in->cols, &in->dtype);
        l.sx[i] = take(&cur, in->rows * in->cols * etp_dtype_size(in->dtype));
        sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q, in->rows, in->cols, &sz[i]));
    }
    const slot_t s_noop = take(&cur, sizeof(int32_t));
    f->out_begin = cur;
    l.amax = take(&cur, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const size_t len[4] = {sz[i].rowwise_data_bytes, sz[i].rowwise_scales_bytes,
                               sz[i].columnwise_data_bytes, sz[i].columnwise_scales_bytes};
        for (int k = 0; k < 4; k++) l.so[i][k] = take(&cur, len[k]);
        for (int d = 0; d < 2; d++) l.sw[i][d] = take(&cur, l.with_swizzle ? len[2 * d + 1] : 0);
    }
    f->arena = cur;
    ETP_OK(etp_mem_alloc(f->ctx, cur, ETP_MEM_USER, (void **)&f->dev));
    f->host = calloc(1, cur);
    uint8_t *got = malloc(cur - f->out_begin), *want = malloc(cur - f->out_begin);
    uint8_t *d = f->dev;
    for (size_t i = 0; i < n; i++) {
        const slot_t *so = l.so[i], *sw = l.sw[i];
        const etp_quant_input_t *in = &l.in[i];
        l.in[i].data = d + l.sx[i].off;
        out[i] = (etp_quant_output_t){d + so[0].off, so[0].bytes, d + so[1].off, so[1].bytes,
                                      d + so[2].off, so[2].bytes, d + so[3].off, so[3].bytes};
        rm[i] = (etp_quant_scales_t){in->rows, in->cols, d + so[1].off, so[1].bytes,
                                     d + so[3].off, so[3].bytes};
        swz[i] = (etp_quant_scales_t){in->rows, in->cols, d + sw[0].off, sw[0].bytes,
                                      d + sw[1].off, sw[1].bytes};
    }
    int32_t *noop = (int32_t *)(d + s_noop.off);
    ETP_OK(etp_quantizer_set_noop_flag(q, noop));
    step_t st = {q, n, l.in, out, (float *)(d + l.amax.off), l.with_swizzle ? rm : NULL, swz};

    /* capture: nothing runs */
    upload_inputs(f, n, l.sx, l.in, tag, 0);
    poison_outputs(f);
    etp_graph_t *graph = NULL;
    ETP_OK(etp_stream_begin_capture(f->s));
    step_calls(f, &st);
    ETP_OK(etp_stream_end_capture(f->s, &graph));
    down(f, got);
    poison_pattern(want, cur - f->out_begin);
    expect_same(got, want, cur - f->out_begin, "after the capture (nothing may run)", tag, 0);

    /* replays on new data, and eager runs of the same calls on it, equal
     * the host reference; the no-op flag's pointer is set throughout, its
     * value 0 but on one step */
    for (uint64_t step = 1; step <= REPLAYS + 2; step++) {
        const int noop_step = step == REPLAYS + 1;
        const int32_t flag = noop_step;
        memcpy(f->host + s_noop.off, &flag, sizeof flag);
        upload_inputs(f, n, l.sx, l.in, tag, step);
        poison_outputs(f);
        ETP_OK(etp_graph_launch(graph, f->s));
        down(f, got);
        if (noop_step) {
            /* every output untouched (the amaxes: max over equal poison) */
            poison_pattern(want, cur - f->out_begin);
            expect_same(got, want, cur - f->out_begin, "replay with the no-op flag set", tag, step);
            continue;
        }
        /* the step after the no-op one: clearing the flag quantizes again */
        reference_image(f, &cfg, &l, tag, step, want);
        expect_same(got, want, cur - f->out_begin, "replay vs the host reference", tag, step);
        poison_outputs(f);
        step_calls(f, &st);
        down(f, got);
        expect_same(got, want, cur - f->out_begin, "eager run vs the host reference", tag, step);
    }

    ETP_OK(etp_graph_destroy(graph));
    ETP_OK(etp_quantizer_destroy(q));
    ETP_OK(etp_mem_free(f->ctx, f->dev));
    free(f->host);
    free(got);
    free(want);
}

static void test_quantize_graph(void **state)
{
    fx_t *f = *state;
    uint64_t tag = 1;
    for (int k = 0; k < 7; k++) {
        etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
        switch (k) {
        case 0: break; /* NVFP4 2D, both directions, row-major (+ swizzle) */
        case 1:
            c.nvfp4_block = ETP_QUANT_BLOCK_1D;
            c.directions = ETP_QUANT_ROWWISE;
            c.swizzle_scales = 1;
            break;
        case 2:
            c.nvfp4_block = ETP_QUANT_BLOCK_1D;
            c.rounding = ETP_QUANT_ROUND_STOCHASTIC;
            c.seed = g_seed ^ 0xabcdef;
            break;
        case 3: c.format = ETP_QUANT_MXFP8; break;
        case 4:
            c.format = ETP_QUANT_MXFP8;
            c.mxfp8_elem = ETP_QUANT_ELEM_E5M2;
            c.directions = ETP_QUANT_COLUMNWISE;
            c.swizzle_scales = 1;
            break;
        case 5:
            c.format = ETP_QUANT_MXFP8;
            c.directions = ETP_QUANT_COLUMNWISE;
            break;
        default: /* whole tiles (shape_of) */
            c.format = ETP_QUANT_MXFP8;
            c.mxfp8_elem = ETP_QUANT_ELEM_E5M2;
            break;
        }
        run_config(f, c, tag++);
    }
}

static int setup(void **state, int mode)
{
    if (!backend_present()) {
        *state = NULL;
        return 0;
    }
    fx_t *f = calloc(1, sizeof *f);
#ifdef ETP_QUANT_GRAPH_CUDA
    (void)mode;
    etp_context_config_t cc = ETP_CONTEXT_CONFIG_INIT;
    cc.backend = ETP_BACKEND_CUDA;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &f->ctx));
    tu_apply_test_knobs(f->ctx, g_rank);
#else
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, (int64_t)(g_seed % 1000), -1, -1);
#endif
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s));
    *state = f;
    return 0;
}
static int setup_eager(void **state) { return setup(state, ETP_HOST_STREAMS_EAGER); }
#ifndef ETP_QUANT_GRAPH_CUDA
static int setup_shuffle(void **state) { return setup(state, ETP_HOST_STREAMS_SHUFFLE); }
#endif

static int teardown(void **state)
{
    fx_t *f = *state;
    if (!f) return 0;
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

static void test_graph(void **state)
{
    if (!*state) {
        print_message("no GPU present: skipping the captured quantize\n");
        skip();
    }
    test_quantize_graph(state);
}

int main(int argc, char **argv)
{
#ifdef ETP_QUANT_GRAPH_CUDA
    tu_mpi_init(&argc, &argv, "test_quant_graph_gpu");
    if (tu_gpu_short("test_quant_graph_gpu")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_graph, setup_eager, teardown),
    };
#else
    tu_mpi_init(&argc, &argv, "test_quant_graph");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_graph, setup_eager, teardown),
        cmocka_unit_test_setup_teardown(test_graph, setup_shuffle, teardown),
    };
#endif
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
