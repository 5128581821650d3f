/*
 * etp_quant_swizzle_scales on the host backend (label quant; eager and
 * shuffle streams):
 * - swizzling the row-major scales of a cast equals the cast with
 *   swizzle_scales = 1, and unswizzling that equals the row-major cast, for
 *   NVFP4 (1D, 2D) and MXFP8 (E4M3, E5M2), every direction set, random
 *   shapes whose rows and columns are not multiples of 128 or 4, empty
 *   tensors included; the swizzle and the swizzled cast share the library's
 *   layout code (etp__qf_scale_offset), so the swizzled cast is also checked
 *   entry by entry against the row-major cast through the formula below;
 * - on random bytes (padding not zero), every entry lands where the formula
 *   of docs/FORMATS.md, written again here, puts it, and unswizzle inverts
 *   swizzle; more matrices than one launch holds;
 * - the no-op flag, n = 0, and bad input (status, a message naming the
 *   tensor and sizes, nothing written).
 * Fresh data from the printed seed; outputs poisoned first, and a guard
 * byte after each must stay poisoned.
 */
#include <math.h>

#include "mpi_util.h"

typedef struct {
    etp_context_t *ctx;
    etp_stream_t *s;
} fx_t;

static int setup(void **state, int mode)
{
    fx_t *f = calloc(1, sizeof *f);
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, (int64_t)(g_seed % 1000), -1, -1);
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

static int all_poison(const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)p)[i] != 0xA5) return 0;
    return 1;
}

/* A shape the quantizer accepts: the block dimension of each produced
 * direction divides; otherwise rows and cols are anything up to a few
 * 128-row bands, zero included. */
static void shape_of(const etp_quantizer_config_t *c, uint64_t tag, size_t i, size_t *rows,
                     size_t *cols)
{
    const size_t blk = c->format == ETP_QUANT_NVFP4 ? 16 : 32;
    const uint64_t r = tu_rand(g_seed, tag, 1, i);
    *rows = 1 + r % 400;
    *cols = 1 + (r >> 10) % 400;
    if (c->directions & ETP_QUANT_ROWWISE) *cols = blk * (1 + (r >> 20) % 30);
    if (c->directions & ETP_QUANT_COLUMNWISE) *rows = blk * (1 + (r >> 30) % 20);
    if (i % 9 == 4) *rows = 0;
    if (i % 11 == 6) *cols = 0;
}

/* Byte buffers of one call: per tensor and direction, bytes + 1 guard. */
typedef struct {
    size_t n;
    etp_quant_sizes_t *sz;
    etp_quant_scales_t *sc;
} scales_t;

static void scales_alloc(fx_t *f, const etp_quantizer_t *q, scales_t *b, size_t n,
                         const size_t *rows, const size_t *cols)
{
    b->n = n;
    b->sz = calloc(n, sizeof *b->sz);
    b->sc = calloc(n, sizeof *b->sc);
    for (size_t i = 0; i < n; i++) {
        b->sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q, rows[i], cols[i], &b->sz[i]));
        etp_quant_scales_t *s = &b->sc[i];
        s->rows = rows[i];
        s->cols = cols[i];
        s->rowwise_bytes = b->sz[i].rowwise_scales_bytes;
        s->columnwise_bytes = b->sz[i].columnwise_scales_bytes;
        ETP_OK(etp_mem_alloc(f->ctx, s->rowwise_bytes + 1, ETP_MEM_USER, &s->rowwise));
        ETP_OK(etp_mem_alloc(f->ctx, s->columnwise_bytes + 1, ETP_MEM_USER, &s->columnwise));
        tu_poison(s->rowwise, s->rowwise_bytes + 1);
        tu_poison(s->columnwise, s->columnwise_bytes + 1);
    }
}

/* b's descriptors as a call gets them: NULL for every empty matrix (the
 * buffers stay allocated and poisoned, so a write through NULL-accepting
 * paths would show). Free the result. */
static etp_quant_scales_t *scales_nul(const scales_t *b)
{
    etp_quant_scales_t *v = calloc(b->n + 1, sizeof *v);
    for (size_t i = 0; i < b->n; i++) {
        v[i] = b->sc[i];
        if (!v[i].rowwise_bytes) v[i].rowwise = NULL;
        if (!v[i].columnwise_bytes) v[i].columnwise = NULL;
    }
    return v;
}

static void scales_poison(scales_t *b)
{
    for (size_t i = 0; i < b->n; i++) {
        tu_poison(b->sc[i].rowwise, b->sc[i].rowwise_bytes + 1);
        tu_poison(b->sc[i].columnwise, b->sc[i].columnwise_bytes + 1);
    }
}

static void scales_free(fx_t *f, scales_t *b)
{
    for (size_t i = 0; i < b->n; i++) {
        ETP_OK(etp_mem_free(f->ctx, b->sc[i].rowwise));
        ETP_OK(etp_mem_free(f->ctx, b->sc[i].columnwise));
    }
    free(b->sz);
    free(b->sc);
}

/* got's matrices equal want's, and got's guard bytes are untouched. */
static void scales_equal(const scales_t *got, const scales_t *want, const char *what, uint64_t tag)
{
    for (size_t i = 0; i < got->n; i++) {
        const etp_quant_scales_t *g = &got->sc[i], *w = &want->sc[i];
        for (int d = 0; d < 2; d++) {
            const uint8_t *gp = d ? g->columnwise : g->rowwise, *wp = d ? w->columnwise : w->rowwise;
            const size_t len = d ? g->columnwise_bytes : g->rowwise_bytes;
            size_t bad = 0, first = 0;
            for (size_t k = 0; k < len; k++)
                if (gp[k] != wp[k] && bad++ == 0) first = k;
            if (bad)
                print_error("config %llu tensor %zu [%zu, %zu] %s %s: %zu of %zu bytes differ, first "
                            "at %zu: 0x%02x, expected 0x%02x\n",
                            (unsigned long long)tag, i, g->rows, g->cols, what,
                            d ? "columnwise" : "rowwise", bad, len, first, gp[first], wp[first]);
            assert_int_equal(bad, 0);
            assert_int_equal(gp[len], 0xA5);
        }
    }
}

/* ---- the formula ------------------------------------------------------------- */

/* docs/FORMATS.md: entry (r, c) of a swizzled matrix of C block columns. */
static size_t formula(size_t r, size_t c, size_t C)
{
    return ((r / 128) * (C / 4) + c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4;
}

/* Where stored entry (r, c) of a rows x cols matrix goes: MXFP8 columnwise
 * is stored [M blocks, K] and swizzled as its transpose [K, M blocks]. */
static size_t swizzled_at(size_t r, size_t c, size_t rows, size_t cols, int mxfp8_col)
{
    return mxfp8_col ? formula(c, r, rows) : formula(r, c, cols);
}

/* Every entry of each row-major matrix of rm is where the formula puts it in
 * the matching matrix of sw (a bijection onto the padded matrix: every byte
 * of sw is checked), and sw's guard bytes are untouched. */
static void expect_swizzled(const scales_t *rm, const scales_t *sw, int mxfp8, const char *what,
                            uint64_t tag)
{
    for (size_t i = 0; i < rm->n; i++) {
        const etp_quant_sizes_t *z = &rm->sz[i];
        for (int d = 0; d < 2; d++) {
            const size_t R = d ? z->columnwise_scale_rows : z->rowwise_scale_rows;
            const size_t C = d ? z->columnwise_scale_cols : z->rowwise_scale_cols;
            const uint8_t *a = d ? rm->sc[i].columnwise : rm->sc[i].rowwise;
            const uint8_t *b = d ? sw->sc[i].columnwise : sw->sc[i].rowwise;
            assert_int_equal(R * C, d ? sw->sc[i].columnwise_bytes : sw->sc[i].rowwise_bytes);
            for (size_t r = 0; r < R; r++)
                for (size_t c = 0; c < C; c++)
                    if (b[swizzled_at(r, c, R, C, mxfp8 && d)] != a[r * C + c]) {
                        print_error("config %llu tensor %zu [%zu, %zu] %s %s: entry (%zu, %zu) of "
                                    "[%zu, %zu] not at its swizzled place\n",
                                    (unsigned long long)tag, i, rm->sc[i].rows, rm->sc[i].cols, what,
                                    d ? "columnwise" : "rowwise", r, c, R, C);
                        fail();
                    }
            assert_int_equal(b[R * C], 0xA5);
        }
    }
}

/* ---- against the cast ------------------------------------------------------ */

static float value_of(uint64_t tag, size_t i, size_t e)
{
    const uint64_t r = tu_rand(g_seed, tag, 100 + i, e);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    const int ex = (int)((r >> 24) % 60) - 30; /* block scales of many values */
    if ((r >> 40) % 50 == 0) return 0.0f;
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, ex);
}

/* Quantize n random tensors with swizzle off (q0) and on (q1); then
 * swizzle(q0's) == q1's and unswizzle(q1's) == q0's. */
static void run_cast_config(fx_t *f, etp_quantizer_config_t cfg, size_t n, uint64_t tag)
{
    etp_quantizer_t *q[2];
    for (int z = 0; z < 2; z++) {
        cfg.swizzle_scales = z;
        ETP_OK(etp_quantizer_create(f->ctx, &cfg, &q[z]));
    }
    size_t *rows = calloc(n, sizeof *rows), *cols = calloc(n, sizeof *cols);
    for (size_t i = 0; i < n; i++) shape_of(&cfg, tag, i, &rows[i], &cols[i]);
    etp_quant_input_t *in = calloc(n, sizeof *in);
    etp_quant_output_t *out[2] = {calloc(n, sizeof **out), calloc(n, sizeof **out)};
    scales_t cast[2], swz, back;
    for (int z = 0; z < 2; z++) scales_alloc(f, q[0], &cast[z], n, rows, cols);
    scales_alloc(f, q[0], &swz, n, rows, cols);
    scales_alloc(f, q[0], &back, n, rows, cols);
    float *amax;
    ETP_OK(etp_mem_alloc(f->ctx, n * sizeof(float), ETP_MEM_USER, (void **)&amax));
    void **data = calloc(4 * n, sizeof *data);
    for (size_t i = 0; i < n; i++) {
        float *x;
        ETP_OK(etp_mem_alloc(f->ctx, rows[i] * cols[i] * sizeof(float) + 4, ETP_MEM_USER, (void **)&x));
        for (size_t e = 0; e < rows[i] * cols[i]; e++) x[e] = value_of(tag, i, e);
        in[i] = (etp_quant_input_t){x, ETP_DTYPE_F32, rows[i], cols[i]};
        etp_quant_sizes_t *z = &cast[0].sz[i];
        for (int k = 0; k < 2; k++) {
            ETP_OK(etp_mem_alloc(f->ctx, z->rowwise_data_bytes + 1, ETP_MEM_USER, &data[4 * i + 2 * k]));
            ETP_OK(etp_mem_alloc(f->ctx, z->columnwise_data_bytes + 1, ETP_MEM_USER,
                                 &data[4 * i + 2 * k + 1]));
            out[k][i] = (etp_quant_output_t){data[4 * i + 2 * k], z->rowwise_data_bytes,
                                             cast[k].sc[i].rowwise, z->rowwise_scales_bytes,
                                             data[4 * i + 2 * k + 1], z->columnwise_data_bytes,
                                             cast[k].sc[i].columnwise, z->columnwise_scales_bytes};
        }
    }
    for (int z = 0; z < 2; z++)
        ETP_OK(etp_quant_quantize(q[z], n, in, amax, n, NULL, 0, out[z], f->s));
    ETP_OK(etp_stream_synchronize(f->s));

    /* the swizzle_scales setting of the quantizer plays no part: both serve */
    ETP_OK(etp_quant_swizzle_scales(q[tag % 2], n, cast[0].sc, swz.sc, ETP_QUANT_SWIZZLE, f->s));
    ETP_OK(etp_quant_swizzle_scales(q[0], n, cast[1].sc, back.sc, ETP_QUANT_UNSWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    scales_equal(&swz, &cast[1], "swizzle(row-major cast) vs swizzled cast", tag);
    scales_equal(&back, &cast[0], "unswizzle(swizzled cast) vs row-major cast", tag);
    /* the path independent of the library's layout code */
    expect_swizzled(&cast[0], &cast[1], cfg.format == ETP_QUANT_MXFP8,
                    "swizzled cast vs the formula on the row-major cast", tag);
    /* and back from our own swizzle */
    scales_poison(&back);
    etp_quant_scales_t *swz_nul = scales_nul(&swz), *back_nul = scales_nul(&back);
    ETP_OK(etp_quant_swizzle_scales(q[1], n, swz_nul, back_nul, ETP_QUANT_UNSWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    free(swz_nul);
    free(back_nul);
    scales_equal(&back, &cast[0], "unswizzle(swizzle(row-major cast))", tag);

    for (size_t i = 0; i < n; i++) {
        ETP_OK(etp_mem_free(f->ctx, (void *)in[i].data));
        for (int k = 0; k < 4; k++) ETP_OK(etp_mem_free(f->ctx, data[4 * i + k]));
    }
    ETP_OK(etp_mem_free(f->ctx, amax));
    for (int z = 0; z < 2; z++) scales_free(f, &cast[z]);
    scales_free(f, &swz);
    scales_free(f, &back);
    for (int z = 0; z < 2; z++) {
        ETP_OK(etp_quantizer_destroy(q[z]));
        free(out[z]);
    }
    free(data);
    free(in);
    free(rows);
    free(cols);
}

static void test_swizzle_equals_cast(void **state)
{
    fx_t *f = *state;
    uint64_t tag = 1;
    for (int fmt = 0; fmt < 2; fmt++)
        for (int var = 0; var < 2; var++)
            for (unsigned dirs = 1; dirs <= 3; dirs++) {
                etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                c.format = fmt ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
                c.nvfp4_block = var ? ETP_QUANT_BLOCK_2D : ETP_QUANT_BLOCK_1D;
                c.mxfp8_elem = var ? ETP_QUANT_ELEM_E5M2 : ETP_QUANT_ELEM_E4M3;
                c.directions = dirs;
                const size_t n = 1 + tu_rand(g_seed, tag, 2, 0) % 24;
                run_cast_config(f, c, n, tag++);
            }
}

/* ---- random bytes against the formula ---------------------------------------- */

static void run_bytes_config(fx_t *f, etp_quantizer_config_t cfg, size_t n, uint64_t tag)
{
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(f->ctx, &cfg, &q));
    size_t *rows = calloc(n, sizeof *rows), *cols = calloc(n, sizeof *cols);
    for (size_t i = 0; i < n; i++) shape_of(&cfg, tag, i, &rows[i], &cols[i]);
    scales_t rm, swz, back;
    scales_alloc(f, q, &rm, n, rows, cols);
    scales_alloc(f, q, &swz, n, rows, cols);
    scales_alloc(f, q, &back, n, rows, cols);
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < rm.sc[i].rowwise_bytes; k++)
            ((uint8_t *)rm.sc[i].rowwise)[k] = (uint8_t)tu_rand(g_seed, tag, 10 + 2 * i, k);
        for (size_t k = 0; k < rm.sc[i].columnwise_bytes; k++)
            ((uint8_t *)rm.sc[i].columnwise)[k] = (uint8_t)tu_rand(g_seed, tag, 11 + 2 * i, k);
    }
    ETP_OK(etp_quant_swizzle_scales(q, n, rm.sc, swz.sc, ETP_QUANT_SWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    expect_swizzled(&rm, &swz, cfg.format == ETP_QUANT_MXFP8, "swizzle(random bytes)", tag);
    ETP_OK(etp_quant_swizzle_scales(q, n, swz.sc, back.sc, ETP_QUANT_UNSWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    scales_equal(&back, &rm, "unswizzle(swizzle(random bytes))", tag);

    /* the no-op flag: nothing is written */
    int32_t *flag;
    ETP_OK(etp_mem_alloc(f->ctx, sizeof *flag, ETP_MEM_USER, (void **)&flag));
    *flag = 1;
    ETP_OK(etp_quantizer_set_noop_flag(q, flag));
    scales_poison(&back);
    ETP_OK(etp_quant_swizzle_scales(q, n, swz.sc, back.sc, ETP_QUANT_UNSWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (size_t i = 0; i < n; i++) {
        assert_true(all_poison(back.sc[i].rowwise, back.sc[i].rowwise_bytes + 1));
        assert_true(all_poison(back.sc[i].columnwise, back.sc[i].columnwise_bytes + 1));
    }
    *flag = 0; /* read at run time */
    ETP_OK(etp_quant_swizzle_scales(q, n, swz.sc, back.sc, ETP_QUANT_UNSWIZZLE, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    scales_equal(&back, &rm, "unswizzle after the no-op flag is cleared", tag);

    ETP_OK(etp_mem_free(f->ctx, flag));
    scales_free(f, &rm);
    scales_free(f, &swz);
    scales_free(f, &back);
    ETP_OK(etp_quantizer_destroy(q));
    free(rows);
    free(cols);
}

static void test_swizzle_formula(void **state)
{
    fx_t *f = *state;
    uint64_t tag = 100;
    for (int fmt = 0; fmt < 2; fmt++)
        for (unsigned dirs = 1; dirs <= 3; dirs++) {
            etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
            c.format = fmt ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
            c.nvfp4_block = ETP_QUANT_BLOCK_1D;
            c.directions = dirs;
            run_bytes_config(f, c, 1 + tu_rand(g_seed, tag, 2, 0) % 30, tag);
            tag++;
        }
    /* more matrices than one launch holds (512): 300 tensors with both
     * directions, 600 with one */
    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
    run_bytes_config(f, c, 300, tag++);
    c.format = ETP_QUANT_MXFP8;
    c.directions = ETP_QUANT_COLUMNWISE;
    run_bytes_config(f, c, 600, tag++);
}

/* ---- bad input ------------------------------------------------------------------ */

#define BAD(expr, needle) ETP_EXPECT_MSG(expr, ETP_ERR_INVALID_ARGUMENT, needle)

static void test_swizzle_bad_input(void **state)
{
    fx_t *f = *state;
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(f->ctx, NULL, &q)); /* NVFP4 2D, both directions */
    enum { R = 32, C = 64 }; /* scales: rowwise [128, 4], columnwise [128, 4] */
    static uint8_t a[2][512 + 1], b[2][512 + 1], big[1024];
    etp_quant_scales_t in[3], out[3];
    for (int i = 0; i < 3; i++) {
        in[i] = (etp_quant_scales_t){R, C, a[0], 512, a[1], 512};
        out[i] = (etp_quant_scales_t){R, C, b[0], 512, b[1], 512};
    }
    tu_poison(b, sizeof b);
    const etp_quant_swizzle_dir_t sw = ETP_QUANT_SWIZZLE;
    BAD(etp_quant_swizzle_scales(NULL, 3, in, out, sw, f->s), "argument 'quantizer' is NULL");
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, NULL), "'stream'");
    BAD(etp_quant_swizzle_scales(q, 3, NULL, out, sw, f->s), "'in' is NULL with n = 3");
    BAD(etp_quant_swizzle_scales(q, 3, in, NULL, sw, f->s), "'out' is NULL with n = 3");
    BAD(etp_quant_swizzle_scales(q, 3, in, out, (etp_quant_swizzle_dir_t)0, f->s), "dir 0");
    BAD(etp_quant_swizzle_scales(q, 3, in, out, (etp_quant_swizzle_dir_t)3, f->s), "dir 3");
    out[2].cols = 48;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 2: in is [32, 64] but out is [32, 48]");
    out[2].cols = C;
    in[1].cols = 40;
    out[1].cols = 40;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 1 of [32, 40]: NVFP4 rowwise needs cols a multiple of 16");
    in[1].cols = out[1].cols = C;
    in[1].rows = out[1].rows = 8;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 1 of [8, 64]: NVFP4 columnwise needs rows a multiple of 16");
    in[1].rows = out[1].rows = R;
    in[2].columnwise = NULL;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 2 of [32, 64]: in columnwise is NULL (needs 512 bytes)");
    in[2].columnwise = a[1];
    out[0].rowwise_bytes = 511;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 0 of [32, 64]: out rowwise has 511 bytes, needs 512");
    out[0].rowwise_bytes = 512;
    /* in place, and partial overlaps, between and within directions */
    out[1].rowwise = a[0];
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 1 of [32, 64]: out rowwise (512 bytes) overlaps in rowwise (512 bytes): in place is "
        "not supported");
    out[1].rowwise = b[0];
    in[2].rowwise = big;
    in[2].rowwise_bytes = sizeof big;
    out[2].columnwise = big + 511;
    BAD(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s),
        "tensor 2 of [32, 64]: out columnwise (512 bytes) overlaps in rowwise");
    ETP_OK(etp_stream_synchronize(f->s));
    assert_true(all_poison(b, sizeof b)); /* nothing was enqueued */
    out[2].columnwise = big + 512; /* adjacent is fine */
    ETP_OK(etp_quant_swizzle_scales(q, 3, in, out, sw, f->s));
    /* n = 0 enqueues nothing, whatever the arrays */
    ETP_OK(etp_quant_swizzle_scales(q, 0, NULL, NULL, ETP_QUANT_UNSWIZZLE, f->s));
    /* an empty matrix needs no buffer */
    etp_quant_scales_t e_in = {0, C, NULL, 0, NULL, 0}, e_out = {0, C, NULL, 0, NULL, 0};
    ETP_OK(etp_quant_swizzle_scales(q, 1, &e_in, &e_out, sw, f->s));
    /* the directions the quantizer does not produce are ignored */
    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
    c.format = ETP_QUANT_MXFP8;
    c.directions = ETP_QUANT_ROWWISE;
    etp_quantizer_t *qr;
    ETP_OK(etp_quantizer_create(f->ctx, &c, &qr));
    etp_quant_scales_t r_in = {R, C, a[0], 512, NULL, 0}, r_out = {R, C, b[0], 512, big, 0};
    ETP_OK(etp_quant_swizzle_scales(qr, 1, &r_in, &r_out, sw, f->s));
    r_in.rows = r_out.rows = 7; /* MXFP8 rowwise: any rows */
    ETP_OK(etp_quant_swizzle_scales(qr, 1, &r_in, &r_out, sw, f->s));
    r_in.cols = r_out.cols = 48;
    BAD(etp_quant_swizzle_scales(qr, 1, &r_in, &r_out, sw, f->s),
        "tensor 0 of [7, 48]: MXFP8 rowwise needs cols a multiple of 32");
    ETP_OK(etp_stream_synchronize(f->s));
    ETP_OK(etp_quantizer_destroy(qr));
    ETP_OK(etp_quantizer_destroy(q));
    ETP_OK(etp_context_check(f->ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_quant_swizzle");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_swizzle_equals_cast, setup_eager, teardown),
        cmocka_unit_test_setup_teardown(test_swizzle_formula, setup_eager, teardown),
        cmocka_unit_test_setup_teardown(test_swizzle_equals_cast, setup_shuffle, teardown),
        cmocka_unit_test_setup_teardown(test_swizzle_formula, setup_shuffle, teardown),
        cmocka_unit_test_setup_teardown(test_swizzle_bad_input, setup_eager, teardown),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
