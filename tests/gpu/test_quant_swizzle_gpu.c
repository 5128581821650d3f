/*
 * The CUDA scale-swizzle kernel against the host reference, byte for byte:
 * etp_quant_swizzle_scales in both directions on random bytes (padding not
 * zero), for NVFP4 and MXFP8 (MXFP8 columnwise is swizzled as its
 * transpose), each direction set, 1 to 256 tensors in one launch (and 300
 * and 600: several launches), random shapes (rows and columns not multiples
 * of 128 or 4, empty tensors, a few large ones spanning many 128-row bands
 * and tile columns), buffers aligned and 1 to 3 bytes off alignment (the
 * kernel's byte path), every output poisoned first and its guard byte
 * checked after; swizzle then unswizzle gives the input back; the no-op
 * flag (set: nothing written; back to 0 with its pointer still set: the
 * reference's bytes again). Then the swizzle of a GPU cast's row-major
 * scales equals the GPU cast with swizzle_scales = 1. Label gpu; skipped
 * without a GPU (ETP_TEST_QUANT_ON_HOST=1 runs it on the host backend, to
 * prove the test on a machine without one; test_quant_swizzle_gpu_on_host,
 * in builds without CUDA too).
 */
#include <math.h>

#include "mpi_util.h"
#include "quant/formats/quant_ref.h"
/* gpu_util.h needs the CUDA runtime's headers: a build without CUDA builds
 * the program for its host variant only (ETP_HAVE_CUDA comes from etp.h) */
#if ETP_HAVE_CUDA
#include "gpu_util.h"
#endif

typedef struct {
    etp_context_t *ctx;
    etp_stream_t *s;
    uint8_t *dev;  /* the arena */
    uint8_t *host; /* its mirror */
    size_t arena;
} gpu_t;

typedef struct {
    size_t off, bytes;
} slot_t;

static slot_t take_at(size_t *cursor, size_t bytes, size_t mis)
{
    slot_t sl = {*cursor + mis, bytes};
    *cursor += (bytes + 1 + mis + 255) / 256 * 256;
    return sl;
}

static void up(gpu_t *g)
{
    ETP_OK(etp_memcpy_async(g->s, g->dev, g->host, g->arena));
    ETP_OK(etp_stream_synchronize(g->s));
}

static void down(gpu_t *g)
{
    ETP_OK(etp_memcpy_async(g->s, g->host, g->dev, g->arena));
    ETP_OK(etp_stream_synchronize(g->s));
}

static void shape_of(const etp_quantizer_config_t *c, uint64_t tag, size_t i, size_t *rows,
                     size_t *cols)
{
    const size_t blk = c->format == ETP_QUANT_NVFP4 ? 16 : 32;
    const uint64_t r = tu_rand(g_seed, tag, 1, i);
    const int large = i % 16 == 5;
    *rows = 1 + r % (large ? 1500 : 300);
    *cols = 1 + (r >> 12) % (large ? 3000 : 300);
    if (c->directions & ETP_QUANT_ROWWISE) *cols = blk * (1 + (r >> 24) % (large ? 300 : 40));
    if (c->directions & ETP_QUANT_COLUMNWISE) *rows = blk * (1 + (r >> 36) % (large ? 60 : 12));
    if (i % 9 == 4) *rows = 0;
    if (i % 11 == 6) *cols = 0;
}

static void check_bytes(const uint8_t *got, const uint8_t *want, size_t len, const char *what,
                        uint64_t tag, size_t i, size_t rows, size_t cols, int col)
{
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < len; k++)
        if (got[k] != want[k] && bad++ == 0) first = k;
    if (bad)
        print_error("config %llu tensor %zu [%zu, %zu] %s %s: %zu of %zu bytes differ, first at "
                    "%zu: 0x%02x, expected 0x%02x\n",
                    (unsigned long long)tag, i, rows, cols, col ? "columnwise" : "rowwise", what,
                    bad, len, first, got[first], want[first]);
    assert_int_equal(bad, 0);
    if (got[len] != 0xA5)
        print_error("config %llu tensor %zu: %s: guard byte written\n", (unsigned long long)tag, i,
                    what);
    assert_int_equal(got[len], 0xA5);
}

/* Each tensor's B (slot 1) against the reference's swizzle (or unswizzle)
 * of its A (slot 0), in the mirror, guard bytes included. */
static void check_swizzled(const gpu_t *g, slot_t (*sl)[3][2], const etp_quant_sizes_t *sz,
                           size_t n, const size_t *rows, const size_t *cols, int mx,
                           etp_quant_swizzle_dir_t dir, const char *what, uint64_t tag)
{
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++) {
            const size_t R = d ? sz[i].columnwise_scale_rows : sz[i].rowwise_scale_rows;
            const size_t C = d ? sz[i].columnwise_scale_cols : sz[i].rowwise_scale_cols;
            const slot_t a = sl[i][0][d], b = sl[i][1][d];
            uint8_t *want = malloc(a.bytes + 1);
            want[a.bytes] = 0xA5;
            etp__qref_swizzle(g->host + a.off, want, R, C, mx && d, dir == ETP_QUANT_UNSWIZZLE);
            check_bytes(g->host + b.off, want, b.bytes, what, tag, i, rows[i], cols[i], d);
            free(want);
        }
}

/* n tensors' scales: random bytes in A, swizzle A -> B (or unswizzle, as
 * `dir` says), then the inverse B -> C; B equals the reference and C
 * equals A. mis: 0 all aligned; 1 A, 2 B and C, 3 all 1 to 3 bytes off
 * alignment (so each call meets aligned and unaligned pairs). */
static void run_config(gpu_t *g, etp_quantizer_config_t cfg, size_t n,
                       etp_quant_swizzle_dir_t dir, int mis, uint64_t tag)
{
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(g->ctx, &cfg, &q));
    const int mx = cfg.format == ETP_QUANT_MXFP8;
    size_t *rows = calloc(n, sizeof *rows), *cols = calloc(n, sizeof *cols);
    etp_quant_sizes_t *sz = calloc(n, sizeof *sz);
    slot_t(*sl)[3][2] = calloc(n, sizeof *sl); /* [tensor][A, B, C][row, col] */
    size_t cur = 0;
    const slot_t s_noop = take_at(&cur, 4, 0);
    for (size_t i = 0; i < n; i++) {
        shape_of(&cfg, tag, i, &rows[i], &cols[i]);
        sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q, rows[i], cols[i], &sz[i]));
        for (int k = 0; k < 3; k++)
            for (int d = 0; d < 2; d++) {
                const uint64_t r = tu_rand(g_seed, tag, 3, 6 * i + 2 * (size_t)k + (size_t)d);
                const size_t off = mis && (mis == 3 || (k == 0) == (mis == 1)) ? 1 + r % 3 : 0;
                const size_t len = d ? sz[i].columnwise_scales_bytes : sz[i].rowwise_scales_bytes;
                sl[i][k][d] = take_at(&cur, len, off);
            }
    }
    g->arena = cur;
    ETP_OK(etp_mem_alloc(g->ctx, cur, ETP_MEM_USER, (void **)&g->dev));
    g->host = malloc(cur);
    tu_poison(g->host, cur);
    memset(g->host + s_noop.off, 0, 4);
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++)
            for (size_t b = 0; b < sl[i][0][d].bytes; b++)
                g->host[sl[i][0][d].off + b] = (uint8_t)tu_rand(g_seed, tag, 10 + 2 * i + (size_t)d, b);
    up(g);
    etp_quant_scales_t *sc[3];
    for (int k = 0; k < 3; k++) {
        sc[k] = calloc(n, sizeof *sc[k]);
        for (size_t i = 0; i < n; i++)
            sc[k][i] = (etp_quant_scales_t){rows[i], cols[i], g->dev + sl[i][k][0].off,
                                            sl[i][k][0].bytes, g->dev + sl[i][k][1].off,
                                            sl[i][k][1].bytes};
    }
    const etp_quant_swizzle_dir_t inv =
        dir == ETP_QUANT_SWIZZLE ? ETP_QUANT_UNSWIZZLE : ETP_QUANT_SWIZZLE;
    ETP_OK(etp_quant_swizzle_scales(q, n, sc[0], sc[1], dir, g->s));
    ETP_OK(etp_quant_swizzle_scales(q, n, sc[1], sc[2], inv, g->s));
    down(g);
    check_swizzled(g, sl, sz, n, rows, cols, mx, dir,
                   dir == ETP_QUANT_SWIZZLE ? "swizzled" : "unswizzled", tag);
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++) {
            const slot_t a = sl[i][0][d], c = sl[i][2][d];
            check_bytes(g->host + c.off, g->host + a.off, c.bytes, "round trip", tag, i, rows[i],
                        cols[i], d);
        }

    /* the no-op flag, set on the device: nothing is written */
    static const int32_t one = 1, zero = 0;
    ETP_OK(etp_memcpy_async(g->s, g->dev + s_noop.off, &one, sizeof one));
    ETP_OK(etp_quantizer_set_noop_flag(q, (const int32_t *)(g->dev + s_noop.off)));
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++)
            ETP_OK(etp_memset_async(g->s, g->dev + sl[i][1][d].off, 0xA5, sl[i][1][d].bytes + 1));
    ETP_OK(etp_quant_swizzle_scales(q, n, sc[0], sc[1], dir, g->s));
    down(g);
    size_t written = 0;
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++)
            for (size_t b = 0; b <= sl[i][1][d].bytes; b++)
                written += g->host[sl[i][1][d].off + b] != 0xA5;
    assert_int_equal(written, 0);
    /* the flag back to 0, its pointer still set: the kernel runs again (the
     * value is read at run time, not the pointer's presence at enqueue) */
    ETP_OK(etp_memcpy_async(g->s, g->dev + s_noop.off, &zero, sizeof zero));
    ETP_OK(etp_quant_swizzle_scales(q, n, sc[0], sc[1], dir, g->s));
    down(g);
    check_swizzled(g, sl, sz, n, rows, cols, mx, dir, "with the no-op flag 0", tag);

    ETP_OK(etp_quantizer_destroy(q));
    ETP_OK(etp_mem_free(g->ctx, g->dev));
    free(g->host);
    for (int k = 0; k < 3; k++) free(sc[k]);
    free(rows);
    free(cols);
    free(sz);
    free(sl);
}

static float value_of(uint64_t tag, size_t i, size_t e)
{
    const uint64_t r = tu_rand(g_seed, tag, 100 + i, e);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    if ((r >> 40) % 50 == 0) return 0.0f;
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, (int)((r >> 24) % 60) - 30);
}

/* The GPU cast with swizzle off, then the swizzle, equals the GPU cast with
 * swizzle on (and the unswizzle of that, the cast with swizzle off). */
static void run_cast_config(gpu_t *g, etp_quantizer_config_t cfg, size_t n, uint64_t tag)
{
    etp_quantizer_t *q[2];
    for (int z = 0; z < 2; z++) {
        cfg.swizzle_scales = z;
        ETP_OK(etp_quantizer_create(g->ctx, &cfg, &q[z]));
    }
    size_t *rows = calloc(n, sizeof *rows), *cols = calloc(n, sizeof *cols);
    etp_quant_sizes_t *sz = calloc(n, sizeof *sz);
    slot_t *sx = calloc(n, sizeof *sx);
    slot_t(*so)[2][4] = calloc(n, sizeof *so); /* [tensor][swizzle off, on][4 outputs] */
    slot_t(*sw)[2][2] = calloc(n, sizeof *sw); /* [tensor][from off, from on][direction] */
    size_t cur = 0;
    const slot_t s_amax = take_at(&cur, n * sizeof(float), 0);
    for (size_t i = 0; i < n; i++) {
        shape_of(&cfg, tag, i, &rows[i], &cols[i]);
        sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q[0], rows[i], cols[i], &sz[i]));
        sx[i] = take_at(&cur, rows[i] * cols[i] * sizeof(float), 0);
        const size_t len[4] = {sz[i].rowwise_data_bytes, sz[i].rowwise_scales_bytes,
                               sz[i].columnwise_data_bytes, sz[i].columnwise_scales_bytes};
        for (int z = 0; z < 2; z++)
            for (int k = 0; k < 4; k++) so[i][z][k] = take_at(&cur, len[k], 0);
        for (int z = 0; z < 2; z++)
            for (int d = 0; d < 2; d++) sw[i][z][d] = take_at(&cur, len[2 * d + 1], 0);
    }
    g->arena = cur;
    ETP_OK(etp_mem_alloc(g->ctx, cur, ETP_MEM_USER, (void **)&g->dev));
    g->host = malloc(cur);
    tu_poison(g->host, cur);
    for (size_t i = 0; i < n; i++)
        for (size_t e = 0; e < rows[i] * cols[i]; e++) {
            const float v = value_of(tag, i, e);
            memcpy(g->host + sx[i].off + 4 * e, &v, 4);
        }
    up(g);
    etp_quant_input_t *in = calloc(n, sizeof *in);
    etp_quant_output_t *out[2] = {calloc(n, sizeof **out), calloc(n, sizeof **out)};
    etp_quant_scales_t *cs[2] = {calloc(n, sizeof **cs), calloc(n, sizeof **cs)};
    etp_quant_scales_t *ws[2] = {calloc(n, sizeof **ws), calloc(n, sizeof **ws)};
    for (size_t i = 0; i < n; i++) {
        in[i] = (etp_quant_input_t){g->dev + sx[i].off, ETP_DTYPE_F32, rows[i], cols[i]};
        for (int z = 0; z < 2; z++) {
            const slot_t *o = so[i][z];
            out[z][i] = (etp_quant_output_t){g->dev + o[0].off, o[0].bytes, g->dev + o[1].off,
                                             o[1].bytes, g->dev + o[2].off, o[2].bytes,
                                             g->dev + o[3].off, o[3].bytes};
            cs[z][i] = (etp_quant_scales_t){rows[i], cols[i], g->dev + o[1].off, o[1].bytes,
                                            g->dev + o[3].off, o[3].bytes};
            ws[z][i] = (etp_quant_scales_t){rows[i], cols[i], g->dev + sw[i][z][0].off,
                                            sw[i][z][0].bytes, g->dev + sw[i][z][1].off,
                                            sw[i][z][1].bytes};
        }
    }
    float *d_amax = (float *)(g->dev + s_amax.off);
    for (int z = 0; z < 2; z++)
        ETP_OK(etp_quant_quantize(q[z], n, in, d_amax, n, NULL, 0, out[z], g->s));
    ETP_OK(etp_quant_swizzle_scales(q[0], n, cs[0], ws[0], ETP_QUANT_SWIZZLE, g->s));
    ETP_OK(etp_quant_swizzle_scales(q[0], n, cs[1], ws[1], ETP_QUANT_UNSWIZZLE, g->s));
    down(g);
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 2; d++) {
            const slot_t c0 = so[i][0][2 * d + 1], c1 = so[i][1][2 * d + 1];
            check_bytes(g->host + sw[i][0][d].off, g->host + c1.off, c1.bytes,
                        "swizzle(row-major cast) vs swizzled cast", tag, i, rows[i], cols[i], d);
            check_bytes(g->host + sw[i][1][d].off, g->host + c0.off, c0.bytes,
                        "unswizzle(swizzled cast) vs row-major cast", tag, i, rows[i], cols[i], d);
        }
    for (int z = 0; z < 2; z++) {
        ETP_OK(etp_quantizer_destroy(q[z]));
        free(out[z]);
        free(cs[z]);
        free(ws[z]);
    }
    ETP_OK(etp_mem_free(g->ctx, g->dev));
    free(g->host);
    free(in);
    free(rows);
    free(cols);
    free(sz);
    free(sx);
    free(so);
    free(sw);
}

static void test_swizzle_kernel_matches_host(void **state)
{
    (void)state;
    const char *on_host = getenv("ETP_TEST_QUANT_ON_HOST");
    const int host = on_host && strcmp(on_host, "1") == 0;
    gpu_t g = {0};
    etp_context_config_t cc = ETP_CONTEXT_CONFIG_INIT;
    cc.backend = host ? ETP_BACKEND_HOST : ETP_BACKEND_CUDA;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &g.ctx));
    ETP_OK(etp_stream_create(g.ctx, ETP_STREAM_PRIORITY_NORMAL, &g.s));
    uint64_t tag = 0;
    /* 1 to 256 tensors in one launch; 300 (both directions) and 600 (one)
     * take several */
    const size_t counts[] = {1, 2, 17, 64, 255, 256, 300, 600, 5};
    for (int fmt = 0; fmt < 2; fmt++)
        for (unsigned dirs = 1; dirs <= 3; dirs++)
            for (int way = 0; way < 2; way++)
                for (int mis = 0; mis < 4; mis++) {
                    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                    c.format = fmt ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
                    c.nvfp4_block = ETP_QUANT_BLOCK_1D;
                    c.directions = dirs;
                    size_t n = counts[tag % 9];
                    if (n == 600 && dirs == 3) n = 256;
                    run_config(&g, c, n, way ? ETP_QUANT_UNSWIZZLE : ETP_QUANT_SWIZZLE, mis, tag++);
                }
    for (int fmt = 0; fmt < 2; fmt++)
        for (unsigned dirs = 1; dirs <= 3; dirs++) {
            etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
            c.format = fmt ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
            c.directions = dirs;
            run_cast_config(&g, c, 1 + tag % 40, tag);
            tag++;
        }
    ETP_OK(etp_stream_destroy(g.s));
    ETP_OK(etp_context_destroy(g.ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_quant_swizzle_gpu");
    /* the host variant (ETP_TEST_QUANT_ON_HOST=1) needs no GPU */
    const char *on_host = getenv("ETP_TEST_QUANT_ON_HOST");
    const int host = on_host && strcmp(on_host, "1") == 0;
#if ETP_HAVE_CUDA
    if (!host && tu_gpu_short("test_quant_swizzle_gpu")) return tu_gpu_skip();
#else
    if (!host) {
        if (g_rank == 0)
            printf("test_quant_swizzle_gpu: skipped: built without CUDA (ETP_TEST_QUANT_ON_HOST=1 runs it)\n");
        MPI_Finalize();
        return 77; /* CTest's skip code, as gpu_util.h's */
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swizzle_kernel_matches_host),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
