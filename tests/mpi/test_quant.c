/*
 * The split-phase quantization API on the host backend, at 1 to 4 ranks, in
 * eager and shuffle stream modes: multi-amax against amaxes the test
 * computes itself, amax_allreduce against the max over every rank's replayed
 * data (each rank can regenerate any rank's tensors from the shared seed),
 * cast-only / quantize / dequantize against the host reference run on those
 * amaxes, byte for byte, with outputs poisoned first; more tensors than one
 * launch holds; the device-side no-op flag; and bad input (a status and a
 * message naming the tensor and sizes, nothing written).
 */
#include <math.h>

#include "mpi_util.h"
#include "quant/formats/quant_ref.h"

enum { N_TENSORS = 11 };

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
} fx_t;

static int setup(void **state, int mode)
{
    fx_t *f = calloc(1, sizeof *f);
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, (int64_t)(g_seed % 1000), -1, -1);
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s));
    *state = f;
    return 0;
}
static int setup_eager(void **state) { return setup(state, ETP_HOST_STREAMS_EAGER); }
static int setup_shuffle(void **state) { return setup(state, ETP_HOST_STREAMS_SHUFFLE); }

static int teardown(void **state)
{
    fx_t *f = *state;
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

/* ---- the tensors of rank r: shapes and values any rank can replay ------------ */

typedef struct {
    size_t rows, cols;
    etp_dtype_t dtype;
} shape_t;

/* Shapes fit the quantizer (block dimension divides for the produced
 * directions) and include empty tensors and rows/cols that are not
 * multiples of 128 or of the other direction's block. */
static shape_t shape_of(int fmt, unsigned dirs, int rank, size_t i, uint64_t tag)
{
    const size_t blk = fmt == ETP_QUANT_NVFP4 ? 16 : 32;
    const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)rank, 1, i);
    shape_t s;
    s.rows = 1 + r % 70;
    s.cols = 1 + (r >> 8) % 90;
    if (dirs & ETP_QUANT_ROWWISE) s.cols = blk * (1 + (r >> 16) % 5);
    if (dirs & ETP_QUANT_COLUMNWISE) s.rows = blk * (1 + (r >> 24) % 5);
    if (i % 5 == 3) s.rows = 0; /* empty tensors */
    if (i % 7 == 5) s.cols = 0;
    s.dtype = (r >> 40) & 1 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
    return s;
}

static float value_of(int rank, size_t i, size_t e, uint64_t tag)
{
    const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)rank, 100 + i, e);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    const int ex = (int)((r >> 24) % 20) - 10 + (int)(i % 4); /* per-tensor ranges differ */
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, ex);
}

/* Fill x (of the shape's dtype) with rank r's tensor i; the FP32 values (the
 * BF16 ones rounded as stored) go to v when not NULL. */
static void fill(void *x, float *v, const shape_t *s, int rank, size_t i, uint64_t tag)
{
    for (size_t e = 0; e < s->rows * s->cols; e++) {
        float f = value_of(rank, i, e, tag);
        if (s->dtype == ETP_DTYPE_BF16) {
            const uint16_t h = etp__qf_f32_to_bf16(f);
            if (x) ((uint16_t *)x)[e] = h;
            f = etp__qf_bf16_to_f32(h);
        } else if (x) {
            ((float *)x)[e] = f;
        }
        if (v) v[e] = f;
    }
}

/* amax computed here, from the definition: the largest |x|. */
static float amax_of(const shape_t *s, int rank, size_t i, uint64_t tag)
{
    float *v = malloc(s->rows * s->cols * sizeof(float) + 4);
    fill(NULL, v, s, rank, i, tag);
    float a = 0.0f;
    for (size_t e = 0; e < s->rows * s->cols; e++)
        if (fabsf(v[e]) > a) a = fabsf(v[e]);
    free(v);
    return a;
}

typedef struct {
    etp_quantizer_config_t cfg;
    size_t n;
    shape_t *shapes;
    etp_quant_input_t *in;
    etp_quant_output_t *out;
    etp_quant_sizes_t *sz;
    /* what the calls get: in and out with NULL for every empty buffer */
    etp_quant_input_t *in_call;
    etp_quant_output_t *out_call;
    float *amax, *amax_col;
    int32_t *noop;
} run_t;

/* p, or NULL when it holds nothing: etp is given NULL for every empty
 * array (the buffer itself stays allocated and poisoned, so a write
 * through a NULL-accepting path would be seen as a crash or as changed
 * poison). */
static void *nul_if_empty(void *p, size_t bytes)
{
    return bytes ? p : NULL;
}

static void run_alloc(fx_t *f, run_t *r, etp_quantizer_t *q, size_t n, uint64_t tag)
{
    r->n = n;
    r->shapes = calloc(n, sizeof *r->shapes);
    r->in = calloc(n, sizeof *r->in);
    r->out = calloc(n, sizeof *r->out);
    r->sz = calloc(n, sizeof *r->sz);
    r->in_call = calloc(n, sizeof *r->in_call);
    r->out_call = calloc(n, sizeof *r->out_call);
    ETP_OK(etp_mem_alloc(f->ctx, n * sizeof(float) + 4, ETP_MEM_USER, (void **)&r->amax));
    ETP_OK(etp_mem_alloc(f->ctx, n * sizeof(float) + 4, ETP_MEM_USER, (void **)&r->amax_col));
    ETP_OK(etp_mem_alloc(f->ctx, sizeof(int32_t), ETP_MEM_USER, (void **)&r->noop));
    *r->noop = 0;
    for (size_t i = 0; i < n; i++) {
        shape_t s = shape_of(r->cfg.format, r->cfg.directions, g_rank, i, tag);
        r->shapes[i] = s;
        r->in[i].dtype = s.dtype;
        r->in[i].rows = s.rows;
        r->in[i].cols = s.cols;
        const size_t bytes = s.rows * s.cols * etp_dtype_size(s.dtype) + 1;
        void *x;
        ETP_OK(etp_mem_alloc(f->ctx, bytes, ETP_MEM_USER, &x));
        fill(x, NULL, &s, g_rank, i, tag);
        r->in[i].data = x;
        r->sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q, s.rows, s.cols, &r->sz[i]));
        /* one spare byte after each buffer: must stay poisoned */
        etp_quant_output_t *o = &r->out[i];
        o->rowwise_data_bytes = r->sz[i].rowwise_data_bytes;
        o->rowwise_scales_bytes = r->sz[i].rowwise_scales_bytes;
        o->columnwise_data_bytes = r->sz[i].columnwise_data_bytes;
        o->columnwise_scales_bytes = r->sz[i].columnwise_scales_bytes;
        ETP_OK(etp_mem_alloc(f->ctx, o->rowwise_data_bytes + 1, ETP_MEM_USER, &o->rowwise_data));
        ETP_OK(etp_mem_alloc(f->ctx, o->rowwise_scales_bytes + 1, ETP_MEM_USER, &o->rowwise_scales));
        ETP_OK(etp_mem_alloc(f->ctx, o->columnwise_data_bytes + 1, ETP_MEM_USER, &o->columnwise_data));
        ETP_OK(etp_mem_alloc(f->ctx, o->columnwise_scales_bytes + 1, ETP_MEM_USER,
                             &o->columnwise_scales));
        r->in_call[i] = r->in[i];
        r->in_call[i].data = nul_if_empty((void *)r->in[i].data,
                                          s.rows * s.cols * etp_dtype_size(s.dtype));
        etp_quant_output_t *oc = &r->out_call[i];
        *oc = *o;
        oc->rowwise_data = nul_if_empty(o->rowwise_data, o->rowwise_data_bytes);
        oc->rowwise_scales = nul_if_empty(o->rowwise_scales, o->rowwise_scales_bytes);
        oc->columnwise_data = nul_if_empty(o->columnwise_data, o->columnwise_data_bytes);
        oc->columnwise_scales = nul_if_empty(o->columnwise_scales, o->columnwise_scales_bytes);
    }
}

static void poison_outputs(run_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        etp_quant_output_t *o = &r->out[i];
        tu_poison(o->rowwise_data, o->rowwise_data_bytes + 1);
        tu_poison(o->rowwise_scales, o->rowwise_scales_bytes + 1);
        tu_poison(o->columnwise_data, o->columnwise_data_bytes + 1);
        tu_poison(o->columnwise_scales, o->columnwise_scales_bytes + 1);
    }
    tu_poison(r->amax, r->n * sizeof(float) + 4);
    tu_poison(r->amax_col, r->n * sizeof(float) + 4);
}

static void run_free(fx_t *f, run_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        ETP_OK(etp_mem_free(f->ctx, (void *)r->in[i].data));
        ETP_OK(etp_mem_free(f->ctx, r->out[i].rowwise_data));
        ETP_OK(etp_mem_free(f->ctx, r->out[i].rowwise_scales));
        ETP_OK(etp_mem_free(f->ctx, r->out[i].columnwise_data));
        ETP_OK(etp_mem_free(f->ctx, r->out[i].columnwise_scales));
    }
    ETP_OK(etp_mem_free(f->ctx, r->amax));
    ETP_OK(etp_mem_free(f->ctx, r->amax_col));
    ETP_OK(etp_mem_free(f->ctx, r->noop));
    free(r->shapes);
    free(r->in);
    free(r->out);
    free(r->sz);
    free(r->in_call);
    free(r->out_call);
}

static int all_poison(const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)p)[i] != 0xA5) return 0;
    return 1;
}

/* Compare every output of tensor i with the host reference run on amax. */
static void check_outputs(const run_t *r, size_t i, float amax, uint64_t tag, const char *what)
{
    const shape_t *s = &r->shapes[i];
    const etp_quant_sizes_t *z = &r->sz[i];
    const size_t cap = z->rowwise_data_bytes + z->rowwise_scales_bytes + z->columnwise_data_bytes +
                       z->columnwise_scales_bytes + 4;
    uint8_t *ref = malloc(cap);
    uint8_t *rd = ref, *rs = rd + z->rowwise_data_bytes, *cd = rs + z->rowwise_scales_bytes,
            *cs = cd + z->columnwise_data_bytes;
    void *x = malloc(s->rows * s->cols * 4 + 4);
    fill(x, NULL, s, g_rank, i, tag);
    const etp_quantizer_config_t *c = &r->cfg;
    etp__qref_cfg_t rc = {c->format == ETP_QUANT_NVFP4 ? ETP__QB_NVFP4 : ETP__QB_MXFP8,
                          c->mxfp8_elem == ETP_QUANT_ELEM_E5M2, c->nvfp4_block == ETP_QUANT_BLOCK_2D,
                          c->swizzle_scales, c->rounding == ETP_QUANT_ROUND_STOCHASTIC, c->seed,
                          (uint32_t)i};
    const int row = (c->directions & ETP_QUANT_ROWWISE) != 0, col = (c->directions & ETP_QUANT_COLUMNWISE) != 0;
    etp__qref_quantize(&rc, x, s->dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32, s->rows,
                       s->cols, amax, row ? rd : NULL, rs, col ? cd : NULL, cs);
    const etp_quant_output_t *o = &r->out[i];
    const void *got[4] = {o->rowwise_data, o->rowwise_scales, o->columnwise_data, o->columnwise_scales};
    const uint8_t *want[4] = {rd, rs, cd, cs};
    const size_t len[4] = {z->rowwise_data_bytes, z->rowwise_scales_bytes, z->columnwise_data_bytes,
                           z->columnwise_scales_bytes};
    const char *names[4] = {"rowwise_data", "rowwise_scales", "columnwise_data", "columnwise_scales"};
    for (int k = 0; k < 4; k++) {
        if (memcmp(got[k], want[k], len[k]) != 0) {
            print_error("rank %d %s tensor %zu [%zu, %zu] %s: %s differs from the reference\n",
                        g_rank, what, i, s->rows, s->cols, etp_dtype_name(s->dtype), names[k]);
            fail();
        }
        assert_int_equal(((const uint8_t *)got[k])[len[k]], 0xA5); /* nothing past the end */
    }
    free(ref);
    free(x);
}

/* One configuration through every phase. */
static void run_config(fx_t *f, etp_quantizer_config_t cfg, size_t n, uint64_t tag)
{
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(f->ctx, &cfg, &q));
    run_t r = {.cfg = cfg};
    run_alloc(f, &r, q, n, tag);
    const int nv = cfg.format == ETP_QUANT_NVFP4;

    /* expected amaxes: local, and the max over every rank's replayed tensors */
    float *local = calloc(n, sizeof(float)), *global = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        local[i] = amax_of(&r.shapes[i], g_rank, i, tag);
        for (int p = 0; p < g_size; p++) {
            shape_t s = shape_of(cfg.format, cfg.directions, p, i, tag);
            const float a = amax_of(&s, p, i, tag);
            if (a > global[i]) global[i] = a;
        }
    }

    /* phase 1 */
    poison_outputs(&r);
    ETP_OK(etp_quant_multi_amax(q, n, r.in_call, r.amax, r.amax_col, n, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (size_t i = 0; i < n; i++) {
        assert_true(r.amax[i] == local[i]);
        assert_true(r.amax_col[i] == local[i]);
    }
    assert_true(all_poison(&r.amax[n], 4));
    /* phase 2 */
    ETP_OK(etp_quant_amax_allreduce(f->world, 0, r.amax, n, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (size_t i = 0; i < n; i++) assert_true(r.amax[i] == global[i]);
    /* phase 3 */
    ETP_OK(etp_quant_cast_only(q, n, r.in_call, nv ? r.amax : NULL, nv ? n : 0, r.out_call, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (size_t i = 0; i < n; i++) check_outputs(&r, i, global[i], tag, "cast_only");

    /* the no-op flag: nothing is written by any launch */
    poison_outputs(&r);
    *r.noop = 1;
    ETP_OK(etp_quantizer_set_noop_flag(q, r.noop));
    ETP_OK(etp_quant_multi_amax(q, n, r.in_call, r.amax, NULL, n, f->s));
    ETP_OK(etp_quant_cast_only(q, n, r.in_call, r.amax_col, n, r.out_call, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    assert_true(all_poison(r.amax, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) {
        assert_true(all_poison(r.out[i].rowwise_data, r.out[i].rowwise_data_bytes + 1));
        assert_true(all_poison(r.out[i].rowwise_scales, r.out[i].rowwise_scales_bytes + 1));
        assert_true(all_poison(r.out[i].columnwise_data, r.out[i].columnwise_data_bytes + 1));
        assert_true(all_poison(r.out[i].columnwise_scales, r.out[i].columnwise_scales_bytes + 1));
    }
    *r.noop = 0; /* the flag is read at run time: the same quantizer works again */

    /* the chained quantize */
    poison_outputs(&r);
    ETP_OK(etp_quant_quantize(q, n, r.in_call, r.amax, n, f->world, 0, r.out_call, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (size_t i = 0; i < n; i++) {
        if (nv) assert_true(r.amax[i] == global[i]);
        check_outputs(&r, i, global[i], tag, "quantize");
    }

    /* dequantize both directions against the reference dequantizer */
    for (unsigned dir = 1; dir <= 2; dir++) {
        if (!(cfg.directions & dir)) continue;
        etp_quant_dest_t *d = calloc(n, sizeof *d), *dc = calloc(n, sizeof *dc);
        for (size_t i = 0; i < n; i++) {
            d[i].rows = r.shapes[i].rows;
            d[i].cols = r.shapes[i].cols;
            d[i].dtype = (i + dir) % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
            d[i].bytes = d[i].rows * d[i].cols * etp_dtype_size(d[i].dtype);
            ETP_OK(etp_mem_alloc(f->ctx, d[i].bytes + 1, ETP_MEM_USER, &d[i].data));
            tu_poison(d[i].data, d[i].bytes + 1);
            dc[i] = d[i];
            dc[i].data = nul_if_empty(d[i].data, d[i].bytes);
        }
        ETP_OK(etp_quant_dequantize(q, n, r.out_call, nv ? r.amax : NULL, nv ? n : 0, dir, dc, f->s));
        ETP_OK(etp_stream_synchronize(f->s));
        for (size_t i = 0; i < n; i++) {
            const etp_quant_output_t *o = &r.out[i];
            etp__qref_cfg_t rc = {nv ? ETP__QB_NVFP4 : ETP__QB_MXFP8,
                                  cfg.mxfp8_elem == ETP_QUANT_ELEM_E5M2,
                                  cfg.nvfp4_block == ETP_QUANT_BLOCK_2D, cfg.swizzle_scales, 0, 0, 0};
            void *want = malloc(d[i].bytes + 1);
            etp__qref_dequantize(&rc, dir, d[i].rows, d[i].cols, global[i],
                                 dir == 1 ? o->rowwise_data : o->columnwise_data,
                                 dir == 1 ? o->rowwise_scales : o->columnwise_scales, want,
                                 d[i].dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32);
            assert_memory_equal(d[i].data, want, d[i].bytes);
            assert_int_equal(((uint8_t *)d[i].data)[d[i].bytes], 0xA5);
            free(want);
            ETP_OK(etp_mem_free(f->ctx, d[i].data));
        }
        free(d);
        free(dc);
    }
    free(local);
    free(global);
    run_free(f, &r);
    ETP_OK(etp_quantizer_destroy(q));
}

static void test_nvfp4(void **state)
{
    fx_t *f = *state;
    uint64_t tag = 1;
    for (int block = ETP_QUANT_BLOCK_1D; block <= ETP_QUANT_BLOCK_2D; block++)
        for (unsigned dirs = 1; dirs <= 3; dirs++)
            for (int swz = 0; swz < 2; swz++) {
                etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                c.format = ETP_QUANT_NVFP4;
                c.nvfp4_block = (etp_quant_block_t)block;
                c.directions = dirs;
                c.swizzle_scales = swz;
                run_config(f, c, N_TENSORS, tag++);
            }
    /* stochastic rounding: the same bits as the reference's Philox stream */
    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
    c.rounding = ETP_QUANT_ROUND_STOCHASTIC;
    c.seed = g_seed ^ 0x5eed;
    run_config(f, c, N_TENSORS, tag++);
}

static void test_mxfp8(void **state)
{
    fx_t *f = *state;
    uint64_t tag = 50;
    for (int elem = 0; elem < 2; elem++)
        for (unsigned dirs = 1; dirs <= 3; dirs++)
            for (int swz = 0; swz < 2; swz++) {
                etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                c.format = ETP_QUANT_MXFP8;
                c.mxfp8_elem = (etp_quant_elem_t)elem;
                c.directions = dirs;
                c.swizzle_scales = swz;
                run_config(f, c, N_TENSORS, tag++);
            }
}

/* More tensors than one launch holds (ETP__QB_MAX): split launches, one
 * all-reduce. */
static void test_many_tensors(void **state)
{
    fx_t *f = *state;
    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
    run_config(f, c, ETP__QB_MAX + 45, 90);
    c.format = ETP_QUANT_MXFP8;
    run_config(f, c, ETP__QB_MAX + 3, 91);
}

/* ---- bad input ------------------------------------------------------------ */

#define BAD(expr, needle) ETP_EXPECT_MSG(expr, ETP_ERR_INVALID_ARGUMENT, needle)

static void test_bad_input(void **state)
{
    fx_t *f = *state;
    etp_quantizer_t *q = (etp_quantizer_t *)0x1;
    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
    BAD(etp_quantizer_create(NULL, &c, &q), "'ctx'");
    BAD(etp_quantizer_create(f->ctx, &c, NULL), "'quantizer'");
    c.size = 3;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "ETP_QUANTIZER_CONFIG_INIT");
    /* sizes inside a field would take half of it (half a noop_flag pointer) */
    c.size = offsetof(etp_quantizer_config_t, noop_flag) + 4;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "ETP_QUANTIZER_CONFIG_INIT");
    c.size = offsetof(etp_quantizer_config_t, seed) + 4;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "ETP_QUANTIZER_CONFIG_INIT");
    /* an older caller's struct ending after `rounding`: accepted */
    c.size = offsetof(etp_quantizer_config_t, seed);
    etp_quantizer_t *old = NULL;
    ETP_OK(etp_quantizer_create(f->ctx, &c, &old));
    ETP_OK(etp_quantizer_destroy(old));
    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT;
    c.format = (etp_quant_format_t)9;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "format 9");
    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT;
    c.directions = 0;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "directions");
    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT;
    c.nvfp4_block = (etp_quant_block_t)3;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "nvfp4_block 3");
    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT;
    c.format = ETP_QUANT_MXFP8;
    c.mxfp8_elem = (etp_quant_elem_t)7;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "mxfp8_elem 7");
    /* the other format's field is not checked: NVFP4 ignores mxfp8_elem */
    c.format = ETP_QUANT_NVFP4;
    ETP_OK(etp_quantizer_create(f->ctx, &c, &old));
    ETP_OK(etp_quantizer_destroy(old));
    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT;
    c.format = ETP_QUANT_MXFP8;
    c.rounding = ETP_QUANT_ROUND_STOCHASTIC;
    BAD(etp_quantizer_create(f->ctx, &c, &q), "stochastic");
    assert_true(q == (etp_quantizer_t *)0x1);
    assert_int_equal(etp_quantizer_destroy(NULL), ETP_SUCCESS);

    c = (etp_quantizer_config_t)ETP_QUANTIZER_CONFIG_INIT; /* NVFP4 2D, both directions */
    ETP_OK(etp_quantizer_create(f->ctx, &c, &q));
    etp_quant_sizes_t sz = ETP_QUANT_SIZES_INIT;
    BAD(etp_quant_sizes(q, 32, 40, &sz), "cols a multiple of 16");
    BAD(etp_quant_sizes(q, 40, 32, &sz), "[40, 32]");
    /* one tensor: named by its shape, not as "tensor 0" of a batch */
    BAD(etp_quant_sizes(q, 40, 32, &sz), "etp_quant_sizes: tensor [40, 32]: NVFP4 columnwise");
    ETP_OK(etp_quant_sizes(q, 32, 64, &sz));
    assert_int_equal(sz.rowwise_data_bytes, 32 * 32);
    assert_int_equal(sz.rowwise_scales_bytes, 128 * 4);
    assert_int_equal(sz.columnwise_data_bytes, 64 * 16);
    assert_int_equal(sz.columnwise_scales_bytes, 128 * 4);

    /* n = 0: every array is empty and may be NULL (nothing is enqueued;
     * quantize still all-reduces its zero amaxes, collectively) */
    ETP_OK(etp_quant_multi_amax(q, 0, NULL, NULL, NULL, 0, f->s));
    ETP_OK(etp_quant_cast_only(q, 0, NULL, NULL, 0, NULL, f->s));
    ETP_OK(etp_quant_quantize(q, 0, NULL, NULL, 0, f->world, 0, NULL, f->s));
    ETP_OK(etp_quant_quantize(q, 0, NULL, NULL, 0, NULL, 0, NULL, f->s));
    ETP_OK(etp_quant_amax_allreduce(f->world, 0, NULL, 0, f->s));
    ETP_OK(etp_quant_dequantize(q, 0, NULL, NULL, 0, ETP_QUANT_ROWWISE, NULL, f->s));
    ETP_OK(etp_quant_swizzle_scales(q, 0, NULL, NULL, ETP_QUANT_SWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));

    enum { R = 32, C = 64 };
    static float x[R * C], amax[4];
    static uint8_t rd[R * C], rs[128 * 4], cd[R * C], cs[128 * 4];
    etp_quant_input_t in[3];
    etp_quant_output_t out[3];
    for (int i = 0; i < 3; i++) {
        in[i] = (etp_quant_input_t){x, ETP_DTYPE_F32, R, C};
        out[i] = (etp_quant_output_t){rd, sizeof rd, rs, sizeof rs, cd, sizeof cd, cs, sizeof cs};
    }
    tu_poison(rd, sizeof rd);
    BAD(etp_quant_cast_only(NULL, 3, in, amax, 3, out, f->s), "argument 'quantizer' is NULL");
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, NULL), "'stream'");
    BAD(etp_quant_cast_only(q, 3, NULL, amax, 3, out, f->s), "'inputs'");
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, NULL, f->s), "'outputs'");
    BAD(etp_quant_cast_only(q, 3, in, NULL, 3, out, f->s), "'amax'");
    BAD(etp_quant_cast_only(q, 3, in, amax, 2, out, f->s), "2 amaxes for 3 tensors");
    in[2].dtype = ETP_DTYPE_F16;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), "tensor 2 of [32, 64]: dtype f16");
    in[2].dtype = ETP_DTYPE_F32;
    in[1].cols = 40;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), "tensor 1 of [32, 40]");
    in[1].cols = C;
    in[1].data = NULL;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), "tensor 1 of [32, 64]: data is NULL");
    in[1].data = x;
    out[2].columnwise_scales_bytes = 100;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s),
        "tensor 2 of [32, 64]: columnwise_scales has 100 bytes, needs 512");
    out[2].columnwise_scales_bytes = sizeof cs;
    out[0].rowwise_data = NULL;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), "tensor 0 of [32, 64]: rowwise_data is NULL");
    out[0].rowwise_data = rd;
    BAD(etp_quant_multi_amax(q, 3, in, NULL, NULL, 3, f->s), "both NULL");
    BAD(etp_quant_multi_amax(q, 3, in, amax, NULL, 4, f->s), "4 amaxes for 3 tensors");
    BAD(etp_quant_quantize(q, 3, in, amax, 3, f->world, 5, out, f->s), "role 5");
    BAD(etp_quant_amax_allreduce(NULL, 0, amax, 3, f->s), "'group'");
    BAD(etp_quant_amax_allreduce(f->world, 0, NULL, 3, f->s), "'amax'");
    etp_quant_dest_t d[3];
    for (int i = 0; i < 3; i++) d[i] = (etp_quant_dest_t){x, ETP_DTYPE_F32, R, C, sizeof x};
    BAD(etp_quant_dequantize(q, 3, out, amax, 3, 3, d, f->s), "direction 3");
    d[1].bytes = 16;
    BAD(etp_quant_dequantize(q, 3, out, amax, 3, ETP_QUANT_ROWWISE, d, f->s),
        "tensor 1 of [32, 64]: dest data has 16 bytes, needs 8192");
    d[1].bytes = sizeof x;
    d[0].dtype = ETP_DTYPE_I32;
    BAD(etp_quant_dequantize(q, 3, out, amax, 3, ETP_QUANT_ROWWISE, d, f->s), "dtype i32");
    d[0].dtype = ETP_DTYPE_F32;
    /* misaligned elements, amaxes and flags: a fault on CUDA, refused alike
     * on both backends */
    in[1].data = (const char *)x + 2;
    BAD(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), "tensor 1 of [32, 64]: data");
    BAD(etp_quant_multi_amax(q, 3, in, amax, NULL, 3, f->s), "not aligned to its 4-byte f32");
    in[1].data = x;
    float *odd_amax = (float *)((char *)amax + 1);
    BAD(etp_quant_cast_only(q, 3, in, odd_amax, 3, out, f->s), "not 4-byte aligned");
    BAD(etp_quant_multi_amax(q, 3, in, amax, odd_amax, 3, f->s), "amax_columnwise");
    BAD(etp_quant_amax_allreduce(f->world, 0, odd_amax, 3, f->s), "not 4-byte aligned");
    d[2].data = (char *)x + 1;
    BAD(etp_quant_dequantize(q, 3, out, amax, 3, ETP_QUANT_ROWWISE, d, f->s), "tensor 2 of [32, 64]: dest data");
    d[2].data = x;
    BAD(etp_quantizer_set_noop_flag(q, (const int32_t *)((const char *)amax + 2)), "noop_flag");
    /* a cast inside a batch would read amaxes the batch has not reduced yet */
    ETP_OK(etp_batch_begin(f->ctx));
    ETP_EXPECT_MSG(etp_quant_cast_only(q, 3, in, amax, 3, out, f->s), ETP_ERR_INVALID_STATE, "etp_batch_begin");
    ETP_OK(etp_batch_end(f->ctx));
    ETP_OK(etp_stream_synchronize(f->s));
    assert_true(all_poison(rd, sizeof rd)); /* nothing was enqueued */
    ETP_OK(etp_quantizer_destroy(q));

    /* a direction the quantizer does not produce */
    c.directions = ETP_QUANT_ROWWISE;
    ETP_OK(etp_quantizer_create(f->ctx, &c, &q));
    BAD(etp_quant_dequantize(q, 3, out, amax, 3, ETP_QUANT_COLUMNWISE, d, f->s), "columnwise");
    ETP_OK(etp_quantizer_destroy(q));
    /* the context works afterwards */
    ETP_OK(etp_context_check(f->ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_quant");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nvfp4, setup_eager, teardown),
        cmocka_unit_test_setup_teardown(test_mxfp8, setup_eager, teardown),
        cmocka_unit_test_setup_teardown(test_nvfp4, setup_shuffle, teardown),
        cmocka_unit_test_setup_teardown(test_mxfp8, setup_shuffle, teardown),
        cmocka_unit_test_setup_teardown(test_many_tensors, setup_shuffle, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup_eager, teardown),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
