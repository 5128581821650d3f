/*
 * The CUDA quant kernels against the host reference, byte for byte: for
 * NVFP4 (1D and 2D blocks, stochastic rounding) and MXFP8 (E4M3, E5M2), each
 * direction set and both scale orders, on 1 to 300 tensors of random shapes
 * (rows and columns that are not multiples of the block or of 128, empty
 * tensors, one beyond a million elements), BF16 and FP32, fresh data from a
 * printed seed (rare NaN, infinities, values past the formats' ranges,
 * FP32 subnormals and -0 in every fourth configuration), every output
 * poisoned first and its guard byte checked after. Also amax_allreduce over
 * the ranks (one GPU each), the chained quantize (its amax buffer poisoned
 * too), dequantize in both directions, and the no-op flag (set: nothing
 * written; back to 0 with its pointer still set: everything again). Label
 * gpu; skipped without a GPU (ETP_TEST_QUANT_ON_HOST=1 runs it on the host
 * backend, in builds without CUDA too).
 */
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "mpi_util.h"
#include "quant/formats/quant_ref.h"
#include "test_knobs.h"
/* gpu_util.h needs the CUDA runtime's headers: a build without CUDA builds
 * the program for its host variant only (ETP_HAVE_CUDA comes from etp.h) */
#if ETP_HAVE_CUDA
#include "gpu_util.h"
#endif

typedef struct {
    size_t rows, cols;
    etp_dtype_t dtype;
} shape_t;

/* Tags from here on draw whole-tile batches: BF16 tensors of 128-row and
 * 512-column multiples (some empty, of any shape), which the CUDA MXFP8
 * cast with row-major scales and both directions runs in a kernel of its
 * own (kernels/quant/cast_v3_whole.cuh); WHOLE_TAG + 4, + 10, + 16 have one
 * buffer misaligned each (input, rowwise data, columnwise data:
 * whole_mis), and those with one direction, so that the general kernel
 * takes them. WHOLE_TAG + 20: 256 tensors of [128, 512], so that a block's
 * next tile lies more than 32 tensors on (the search's second round) and
 * the search meets the batch's end. */
#define WHOLE_TAG 1000

/* The buffer a whole-tile config misaligns: 0 none, 1 the input (4 bytes),
 * 2 the rowwise data, 3 the columnwise data (1 byte). */
static int whole_mis(uint64_t tag)
{
    const uint64_t j = tag - WHOLE_TAG;
    return j % 6 == 4 ? 1 + (int)(j / 6) % 3 : 0;
}

/* Whole-tile configs j = 0 mod 3 fill bands of 32 rows with zeros (both
 * signs), BF16 subnormals and tiny normals: blocks of amax 0 and with
 * multipliers 1 and 2^126 beside the ordinary ones. */
static int whole_bands(uint64_t tag)
{
    return tag >= WHOLE_TAG && (tag - WHOLE_TAG) % 3 == 0;
}

static shape_t shape_of(const etp_quantizer_config_t *c, int rank, size_t i, uint64_t tag)
{
    const size_t blk = c->format == ETP_QUANT_NVFP4 ? 16 : 32;
    const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)rank, 1, i);
    shape_t s;
    if (tag >= WHOLE_TAG) {
        const int tiny = tag == WHOLE_TAG + 20;
        s.rows = i % 9 == 4 ? 0 : tiny ? 128 : 128 * (1 + r % 3);
        s.cols = tiny ? 512 : 512 * (1 + (r >> 8) % 2);
        if (i % 11 == 6) { /* empty, and of no whole shape (96 rows: blocks of 32) */
            s.rows = 96;
            s.cols = 0;
        }
        s.dtype = ETP_DTYPE_BF16;
        return s;
    }
    s.rows = 1 + r % 300;
    s.cols = 1 + (r >> 10) % 300;
    if (c->directions & ETP_QUANT_ROWWISE) s.cols = blk * (1 + (r >> 20) % 12);
    if (c->directions & ETP_QUANT_COLUMNWISE) s.rows = blk * (1 + (r >> 28) % 12);
    if (i % 9 == 4) s.rows = 0;
    if (i % 11 == 6) s.cols = 0;
    if (i == 1 && tag % 4 == 0) { /* one large tensor: many blocks per amax */
        s.rows = 1024 + blk * 3;
        s.cols = 1024 + blk;
    }
    if (i == 0 && c->format == ETP_QUANT_NVFP4 && c->directions == (ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE) &&
        !c->swizzle_scales) {
        /* tiles enough (1156, 1190 of 128 x 128) that the NVFP4 cast runs
         * in runs of 1 x 4 tiles (a GPU of up to 148 SMs), with runs of 2
         * tiles at the tensor's edges. 16x16 blocks: 256-multiples, whose
         * scale rows (a multiple of 16 bytes) take the runs' scale images;
         * 1D blocks: rows and columns ending inside a tile, whose scales go
         * out a tile at a time. */
        const int images = c->nvfp4_block == ETP_QUANT_BLOCK_2D;
        s.rows = images ? 256 * 17 : 128 * 34 + 48;
        s.cols = images ? 256 * 17 : 128 * 33 + 16;
    }
    if (c->format == ETP_QUANT_NVFP4 && c->nvfp4_block == ETP_QUANT_BLOCK_2D && !c->swizzle_scales &&
        ((i == 2 && (c->directions & ETP_QUANT_COLUMNWISE)) || (i == 0 && c->directions == ETP_QUANT_ROWWISE))) {
        /* 16x16 blocks, row-major scales whose rows are 16-byte multiples
         * (images, merges, compaction) in a tensor ending inside a tile:
         * edge tiles beside compacted ones, and rowwise alone a last group
         * of fewer than 16 rows (its padding rows stay zero) */
        s.rows = (c->directions & ETP_QUANT_COLUMNWISE) ? 256 * 8 + 208 : 256 * 8 + 202;
        s.cols = (c->directions & ETP_QUANT_ROWWISE) ? 256 * 8 + 224 : 256 * 8 + 221;
    }
    s.dtype = (r >> 40) & 1 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
    return s;
}

static float value_of(int rank, size_t i, size_t e, uint64_t tag)
{
    const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)rank, 100 + i, e);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    const int ex = (int)((r >> 24) % 24) - 12 + (int)(i % 5);
    float v = ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, ex);
    if ((r >> 32) % 997 == 0) v = 0.0f; /* some exact zeros */
    /* every fourth configuration: rare special values, so that some warps
     * of the kernels take their per-element paths (a NaN in a block, an
     * infinite amax) beside others on the fast ones; infinities only in
     * every eighth, where they make the NVFP4 tensor scale degenerate */
    if (tag % 4 == 3 && (r >> 40) % 1500 == 0) {
        switch ((r >> 52) % 6) {
        case 0: v = NAN; break;
        case 1: v = tag % 8 == 7 ? -INFINITY : -3.0e38f; break;
        case 2: v = 1.0e30f; break;            /* past every format's range */
        case 3: v = -1.0e-40f; break;          /* an FP32 subnormal */
        case 4: v = -0.0f; break;
        default: v = tag % 8 == 7 ? INFINITY : 448.0f * 6.0f; break;
        }
    }
    return v;
}

static void fill(void *x, const shape_t *s, int rank, size_t i, uint64_t tag)
{
    for (size_t e = 0; e < s->rows * s->cols; e++) {
        float f = value_of(rank, i, e, tag);
        if (whole_bands(tag)) {
            const size_t band = e / s->cols / 32 % 8;
            const uint64_t r = tu_rand(g_seed, tag, 7 + i, e);
            if (band == 1) f = r & 1 ? -0.0f : 0.0f;
            if (band == 3) f = (r & 1 ? -1.0f : 1.0f) * ldexpf(0.5f + (float)(r >> 40 & 0xff) / 512.0f, -127 - (int)(r >> 8) % 7);
            if (band == 5) f = (r & 1 ? -1.0f : 1.0f) * ldexpf(0.5f + (float)(r >> 40 & 0xff) / 512.0f, -118 - (int)(r >> 8) % 8);
        }
        if (s->dtype == ETP_DTYPE_BF16)
            ((uint16_t *)x)[e] = etp__qf_f32_to_bf16(f);
        else
            ((float *)x)[e] = f;
    }
}

static size_t align256(size_t x)
{
    return (x + 255) / 256 * 256;
}

/* The host reference is the test's cost (the GPU's work takes
 * milliseconds): its per-tensor calls run on the cores this rank's share of
 * the node allows, each tensor on one thread, in no particular order (each
 * call writes only its own tensor's results). */
typedef struct {
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n, next;
    pthread_mutex_t lock;
} par_t;

static void *par_worker(void *p_)
{
    par_t *p = p_;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const size_t i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) return NULL;
        p->fn(p->arg, i);
    }
}

static double g_par_s; /* time spent in par_for: ETP_TEST_VERBOSE prints it */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void par_for(size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
    const double t0 = now_s();
    static int threads; /* the test program's, set once on first use */
    if (threads == 0) {
        MPI_Comm node;
        int local = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > local ? (int)(cores / local) : 1;
        if (threads > 16) threads = 16;
    }
    par_t p = {fn, arg, n, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t t[16];
    int started = 0;
    for (; started < threads - 1 && (size_t)started + 1 < n; started++)
        if (pthread_create(&t[started], NULL, par_worker, &p) != 0) break;
    par_worker(&p);
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
    g_par_s += now_s() - t0;
}

/* One buffer in the device arena and its host mirror: bytes + 1 guard byte. */
typedef struct {
    size_t off, bytes;
} slot_t;

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
    uint8_t *dev;    /* the arena */
    uint8_t *host;   /* its mirror */
    size_t arena;
} gpu_t;

/* `mis` bytes past a 256-byte boundary: the kernels' vector loads and
 * stores must fall back on element accesses for such buffers. */
static slot_t take_at(size_t *cursor, size_t bytes, size_t mis)
{
    slot_t sl = {*cursor + mis, bytes};
    *cursor += align256(bytes + 1 + mis);
    return sl;
}

static slot_t take(size_t *cursor, size_t bytes)
{
    return take_at(cursor, bytes, 0);
}

static void down(gpu_t *g)
{
    ETP_OK(etp_memcpy_async(g->s, g->host, g->dev, g->arena));
    ETP_OK(etp_stream_synchronize(g->s));
}

static void check_bytes(const gpu_t *g, const uint8_t *want, slot_t sl, const char *what, size_t i,
                        const shape_t *s, uint64_t tag)
{
    const uint8_t *got = g->host + sl.off;
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < sl.bytes; k++)
        if (got[k] != want[k] && bad++ == 0) first = k;
    if (bad)
        print_error("rank %d config %llu tensor %zu [%zu, %zu] %s: %s: %zu of %zu bytes differ, "
                    "first at %zu: 0x%02x, expected 0x%02x\n",
                    g_rank, (unsigned long long)tag, i, s->rows, s->cols, etp_dtype_name(s->dtype),
                    what, bad, sl.bytes, first, got[first], want[first]);
    assert_int_equal(bad, 0);
    if (got[sl.bytes] != 0xA5)
        print_error("rank %d config %llu tensor %zu: %s: guard byte written\n", g_rank,
                    (unsigned long long)tag, i, what);
    assert_int_equal(got[sl.bytes], 0xA5);
}

/* Every output buffer of the n tensors, guard bytes included, to 0xA5. */
static void poison_outputs(gpu_t *g, slot_t (*so)[4], size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            ETP_OK(etp_memset_async(g->s, g->dev + so[i][k].off, 0xA5, so[i][k].bytes + 1));
}

/* The n floats at `sl` of the mirror equal want[] (want NULL: still the
 * 0xA5 poison, nothing written). */
static void check_amax(const gpu_t *g, slot_t sl, const float *want, size_t n, const char *what,
                       uint64_t tag)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = g->host + sl.off + i * 4;
        float a;
        memcpy(&a, p, 4);
        const int ok = want ? a == want[i]
                            : p[0] == 0xA5 && p[1] == 0xA5 && p[2] == 0xA5 && p[3] == 0xA5;
        if (!ok)
            print_error("rank %d config %llu tensor %zu: %s: amax %g, expected %s%g\n", g_rank,
                        (unsigned long long)tag, i, what, (double)a, want ? "" : "the poison ",
                        want ? (double)want[i] : 0.0);
        assert_true(ok);
    }
}

/* The host reference quantizer's image of every output of the n tensors,
 * run on the global amaxes: ref[i][k] for the four outputs of tensor i
 * (one allocation per tensor, at ref[i][0]). */
typedef struct {
    const etp_quantizer_config_t *cfg;
    const gpu_t *g;
    const shape_t *sh;
    const slot_t *sx;
    const etp_quant_sizes_t *sz;
    const float *global;
    uint8_t *(*ref)[4];
} ref_job_t;

static void ref_one(void *arg, size_t i)
{
    const ref_job_t *j = arg;
    const etp_quantizer_config_t *cfg = j->cfg;
    const etp_quant_sizes_t *z = &j->sz[i];
    uint8_t **w = j->ref[i];
    w[0] = malloc(z->rowwise_data_bytes + z->rowwise_scales_bytes + z->columnwise_data_bytes +
                  z->columnwise_scales_bytes + 4);
    w[1] = w[0] + z->rowwise_data_bytes;
    w[2] = w[1] + z->rowwise_scales_bytes;
    w[3] = w[2] + z->columnwise_data_bytes;
    etp__qref_cfg_t rc = {cfg->format == ETP_QUANT_NVFP4 ? ETP__QB_NVFP4 : ETP__QB_MXFP8,
                          cfg->mxfp8_elem == ETP_QUANT_ELEM_E5M2,
                          cfg->nvfp4_block == ETP_QUANT_BLOCK_2D, cfg->swizzle_scales,
                          cfg->rounding == ETP_QUANT_ROUND_STOCHASTIC, cfg->seed, (uint32_t)i};
    etp__qref_quantize(&rc, j->g->host + j->sx[i].off,
                       j->sh[i].dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32, j->sh[i].rows,
                       j->sh[i].cols, j->global[i],
                       (cfg->directions & ETP_QUANT_ROWWISE) ? w[0] : NULL, w[1],
                       (cfg->directions & ETP_QUANT_COLUMNWISE) ? w[2] : NULL, w[3]);
}

/* Every output of the n tensors (in the mirror) against the reference
 * images, byte for byte, guard bytes included. */
static void check_cast(const gpu_t *g, size_t n, const shape_t *sh, slot_t (*so)[4],
                       uint8_t *(*ref)[4], uint64_t tag)
{
    const char *names[4] = {"rowwise_data", "rowwise_scales", "columnwise_data",
                            "columnwise_scales"};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) check_bytes(g, ref[i][k], so[i][k], names[k], i, &sh[i], tag);
}

/* The expected amax of tensor i, on this rank's data. */
typedef struct {
    const gpu_t *g;
    const shape_t *sh;
    const slot_t *sx;
    float *local;
} amax_job_t;

static void amax_one(void *arg, size_t i)
{
    const amax_job_t *j = arg;
    j->local[i] = etp__qref_amax(j->g->host + j->sx[i].off,
                                 j->sh[i].dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32,
                                 j->sh[i].rows, j->sh[i].cols);
}

/* The host reference's dequantization of tensor i's `dir` outputs (read
 * from the mirror) into dst[i]'s dtype. */
typedef struct {
    const etp_quantizer_config_t *cfg;
    const gpu_t *g;
    const shape_t *sh;
    slot_t (*so)[4];
    const etp_quant_dest_t *dst;
    const float *global;
    unsigned dir;
    uint8_t **want;
} deq_job_t;

static void deq_one(void *arg, size_t i)
{
    const deq_job_t *j = arg;
    const etp_quantizer_config_t *cfg = j->cfg;
    etp__qref_cfg_t rc = {cfg->format == ETP_QUANT_NVFP4 ? ETP__QB_NVFP4 : ETP__QB_MXFP8,
                          cfg->mxfp8_elem == ETP_QUANT_ELEM_E5M2,
                          cfg->nvfp4_block == ETP_QUANT_BLOCK_2D, cfg->swizzle_scales, 0, 0, 0};
    j->want[i] = malloc(j->dst[i].bytes + 1);
    const int k = j->dir == 1 ? 0 : 2;
    etp__qref_dequantize(&rc, j->dir, j->sh[i].rows, j->sh[i].cols, j->global[i],
                         j->g->host + j->so[i][k].off, j->g->host + j->so[i][k + 1].off, j->want[i],
                         j->dst[i].dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32);
}

typedef struct {
    gpu_t *g;
    const shape_t *sh;
    const slot_t *sx;
    uint64_t tag;
} fill_job_t;

static void fill_one(void *arg, size_t i)
{
    const fill_job_t *j = arg;
    fill(j->g->host + j->sx[i].off, &j->sh[i], g_rank, i, j->tag);
}

static void run_config(gpu_t *g, etp_quantizer_config_t cfg, size_t n, uint64_t tag)
{
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(g->ctx, &cfg, &q));
    const int nv = cfg.format == ETP_QUANT_NVFP4;
    shape_t *sh = calloc(n, sizeof *sh);
    slot_t *sx = calloc(n, sizeof *sx), (*so)[4] = calloc(n, sizeof *so), *sy = calloc(n, sizeof *sy);
    etp_quant_sizes_t *sz = calloc(n, sizeof *sz);
    size_t cur = 0;
    const slot_t s_amax = take(&cur, n * sizeof(float)), s_amax_col = take(&cur, n * sizeof(float));
    const slot_t s_noop = take(&cur, sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        sh[i] = shape_of(&cfg, g_rank, i, tag);
        sz[i] = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(q, sh[i].rows, sh[i].cols, &sz[i]));
        /* every third config: inputs 4 bytes and data outputs 1 byte off alignment */
        const size_t mis = tag < WHOLE_TAG && tag % 3 == 2 ? 1 : 0;
        const int wm = tag >= WHOLE_TAG ? whole_mis(tag) : 0;
        sx[i] = take_at(&cur, sh[i].rows * sh[i].cols * etp_dtype_size(sh[i].dtype), 4 * (mis || wm == 1));
        so[i][0] = take_at(&cur, sz[i].rowwise_data_bytes, mis || wm == 2);
        so[i][1] = take(&cur, sz[i].rowwise_scales_bytes);
        so[i][2] = take_at(&cur, sz[i].columnwise_data_bytes, mis || wm == 3);
        so[i][3] = take(&cur, sz[i].columnwise_scales_bytes);
        sy[i] = take(&cur, sh[i].rows * sh[i].cols * 4);
    }
    g->arena = cur;
    ETP_OK(etp_mem_alloc(g->ctx, cur, ETP_MEM_USER, (void **)&g->dev));
    g->host = malloc(cur);
    tu_poison(g->host, cur);
    fill_job_t fj = {g, sh, sx, tag};
    par_for(n, fill_one, &fj);
    memset(g->host + s_noop.off, 0, sizeof(int32_t));
    ETP_OK(etp_memcpy_async(g->s, g->dev, g->host, cur));
    ETP_OK(etp_stream_synchronize(g->s));

    etp_quant_input_t *in = calloc(n, sizeof *in);
    etp_quant_output_t *out = calloc(n, sizeof *out);
    etp_quant_dest_t *dst = calloc(n, sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        in[i] = (etp_quant_input_t){g->dev + sx[i].off, sh[i].dtype, sh[i].rows, sh[i].cols};
        out[i] = (etp_quant_output_t){g->dev + so[i][0].off, so[i][0].bytes, g->dev + so[i][1].off,
                                      so[i][1].bytes, g->dev + so[i][2].off, so[i][2].bytes,
                                      g->dev + so[i][3].off, so[i][3].bytes};
    }
    float *d_amax = (float *)(g->dev + s_amax.off), *d_amax_col = (float *)(g->dev + s_amax_col.off);

    /* expected amaxes: the host reference on this rank's data; the global
     * one the largest of every rank's (exchanged by MPI, not by etp), with
     * NaNs left out as the kernels' amax leaves them */
    float *local = calloc(n, sizeof(float)), *global = calloc(n, sizeof(float));
    float *all = calloc(n * (size_t)g_size, sizeof(float));
    amax_job_t aj = {g, sh, sx, local};
    par_for(n, amax_one, &aj);
    MPI_Allgather(local, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < g_size; p++)
            if (all[(size_t)p * n + i] > global[i]) global[i] = all[(size_t)p * n + i];
    free(all);
    /* the cast's expected outputs, computed once for the three casts below */
    uint8_t *(*ref)[4] = calloc(n, sizeof *ref);
    ref_job_t rj = {&cfg, g, sh, sx, sz, global, ref};
    par_for(n, ref_one, &rj);

    /* multi-amax */
    ETP_OK(etp_quant_multi_amax(q, n, in, d_amax, d_amax_col, n, g->s));
    down(g);
    for (size_t i = 0; i < n; i++) {
        float a, b;
        memcpy(&a, g->host + s_amax.off + i * 4, 4);
        memcpy(&b, g->host + s_amax_col.off + i * 4, 4);
        if (a != local[i] || b != local[i])
            print_error("config %llu tensor %zu [%zu, %zu]: amax %g / %g, expected %g\n",
                        (unsigned long long)tag, i, sh[i].rows, sh[i].cols, (double)a, (double)b,
                        (double)local[i]);
        assert_true(a == local[i] && b == local[i]);
    }
    /* the all-reduce, then cast-only, compared with the reference */
    ETP_OK(etp_quant_amax_allreduce(g->world, 0, d_amax, n, g->s));
    poison_outputs(g, so, n);
    ETP_OK(etp_quant_cast_only(q, n, in, nv ? d_amax : NULL, nv ? n : 0, out, g->s));
    down(g);
    check_amax(g, s_amax, global, n, "all-reduced", tag);
    check_cast(g, n, sh, so, ref, tag);
    /* the chained quantize: d_amax poisoned too, so that the cast must read
     * what this call's multi-amax and all-reduce wrote (the poison, a tiny
     * negative float, gives other scales), and MXFP8 (the cast alone)
     * writes no amax */
    poison_outputs(g, so, n);
    ETP_OK(etp_memset_async(g->s, d_amax, 0xA5, n * sizeof(float)));
    ETP_OK(etp_quant_quantize(q, n, in, d_amax, n, g->world, 0, out, g->s));
    down(g);
    check_amax(g, s_amax, nv ? global : NULL, n, "quantize", tag);
    check_cast(g, n, sh, so, ref, tag);
    /* dequantize each produced direction */
    for (unsigned dir = 1; dir <= 2; dir++) {
        if (!(cfg.directions & dir)) continue;
        for (size_t i = 0; i < n; i++) {
            const etp_dtype_t dt = (i + dir) % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
            dst[i] = (etp_quant_dest_t){g->dev + sy[i].off, dt, sh[i].rows, sh[i].cols,
                                        sh[i].rows * sh[i].cols * etp_dtype_size(dt)};
            ETP_OK(etp_memset_async(g->s, dst[i].data, 0xA5, dst[i].bytes + 1));
        }
        ETP_OK(etp_quant_dequantize(q, n, out, nv ? d_amax : NULL, nv ? n : 0, dir, dst, g->s));
        down(g);
        uint8_t **want = calloc(n, sizeof *want);
        deq_job_t dj = {&cfg, g, sh, so, dst, global, dir, want};
        par_for(n, deq_one, &dj);
        for (size_t i = 0; i < n; i++) {
            slot_t sl = {sy[i].off, dst[i].bytes};
            check_bytes(g, want[i], sl, dir == 1 ? "dequantized rowwise" : "dequantized columnwise",
                        i, &sh[i], tag);
            free(want[i]);
        }
        free(want);
    }
    /* the no-op flag, set on the device: nothing is written */
    static const int32_t one = 1, zero = 0;
    ETP_OK(etp_memcpy_async(g->s, g->dev + s_noop.off, &one, sizeof one));
    ETP_OK(etp_quantizer_set_noop_flag(q, (const int32_t *)(g->dev + s_noop.off)));
    poison_outputs(g, so, n);
    ETP_OK(etp_memset_async(g->s, d_amax_col, 0xA5, n * sizeof(float)));
    ETP_OK(etp_quant_multi_amax(q, n, in, NULL, d_amax_col, n, g->s));
    ETP_OK(etp_quant_cast_only(q, n, in, d_amax, n, out, g->s));
    down(g);
    for (size_t i = 0; i < n * sizeof(float); i++) assert_int_equal(g->host[s_amax_col.off + i], 0xA5);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            for (size_t b = 0; b <= so[i][k].bytes; b++)
                assert_int_equal(g->host[so[i][k].off + b], 0xA5);
    /* the flag back to 0, its pointer still set: every launch runs again
     * (the value is read at run time, not the pointer's presence at
     * enqueue) */
    ETP_OK(etp_memcpy_async(g->s, g->dev + s_noop.off, &zero, sizeof zero));
    poison_outputs(g, so, n);
    ETP_OK(etp_memset_async(g->s, d_amax, 0xA5, n * sizeof(float)));
    ETP_OK(etp_memset_async(g->s, d_amax_col, 0xA5, n * sizeof(float)));
    ETP_OK(etp_quant_multi_amax(q, n, in, NULL, d_amax_col, n, g->s));
    ETP_OK(etp_quant_quantize(q, n, in, d_amax, n, g->world, 0, out, g->s));
    down(g);
    check_amax(g, s_amax_col, local, n, "multi-amax with the no-op flag 0", tag);
    check_amax(g, s_amax, nv ? global : NULL, n, "quantize with the no-op flag 0", tag);
    check_cast(g, n, sh, so, ref, tag);

    ETP_OK(etp_quantizer_destroy(q));
    ETP_OK(etp_mem_free(g->ctx, g->dev));
    free(g->host);
    free(sh);
    free(sx);
    free(so);
    free(sy);
    free(sz);
    free(in);
    free(out);
    free(dst);
    free(local);
    free(global);
    for (size_t i = 0; i < n; i++) free(ref[i][0]);
    free(ref);
}

/* Multi-amax over more work than the device holds at once: 256 tensors of
 * up to 26 units of 16384 elements (about 1600 in all), so blocks take
 * several units and cross from one tensor into the next, and every fourth
 * tensor starts off 16-byte alignment. */
static void run_amax_many(gpu_t *g, uint64_t tag)
{
    etp_quantizer_t *q;
    ETP_OK(etp_quantizer_create(g->ctx, NULL, &q));
    const size_t n = 256;
    shape_t *sh = calloc(n, sizeof *sh);
    slot_t *sx = calloc(n, sizeof *sx);
    etp_quant_input_t *in = calloc(n, sizeof *in);
    size_t cur = 0;
    const slot_t s_amax = take(&cur, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = tu_rand(g_seed, tag * 131 + (uint64_t)g_rank, 7, i);
        sh[i].rows = 1 + r % 1400;
        sh[i].cols = 1 + (r >> 10) % 300;
        if (i % 17 == 3) sh[i].rows = 0;
        sh[i].dtype = (r >> 40) & 1 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
        sx[i] = take_at(&cur, sh[i].rows * sh[i].cols * etp_dtype_size(sh[i].dtype), i % 4 == 1 ? 4 : 0);
    }
    g->arena = cur;
    ETP_OK(etp_mem_alloc(g->ctx, cur, ETP_MEM_USER, (void **)&g->dev));
    g->host = malloc(cur);
    tu_poison(g->host, cur);
    for (size_t i = 0; i < n; i++) {
        fill(g->host + sx[i].off, &sh[i], g_rank, i, tag);
        in[i] = (etp_quant_input_t){g->dev + sx[i].off, sh[i].dtype, sh[i].rows, sh[i].cols};
    }
    ETP_OK(etp_memcpy_async(g->s, g->dev, g->host, cur));
    /* twice: the workspace must be left clean by the first launch */
    for (int pass = 0; pass < 2; pass++) {
        ETP_OK(etp_memset_async(g->s, g->dev + s_amax.off, 0xA5, n * sizeof(float)));
        ETP_OK(etp_quant_multi_amax(q, n, in, (float *)(g->dev + s_amax.off), NULL, n, g->s));
        down(g);
        for (size_t i = 0; i < n; i++) {
            const float want = etp__qref_amax(g->host + sx[i].off,
                                              sh[i].dtype == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32,
                                              sh[i].rows, sh[i].cols);
            float got;
            memcpy(&got, g->host + s_amax.off + i * 4, 4);
            if (got != want)
                print_error("many-unit amax: tensor %zu [%zu, %zu]: %g, expected %g\n", i, sh[i].rows,
                            sh[i].cols, (double)got, (double)want);
            assert_true(got == want);
        }
    }
    ETP_OK(etp_quantizer_destroy(q));
    ETP_OK(etp_mem_free(g->ctx, g->dev));
    free(g->host);
    free(sh);
    free(sx);
    free(in);
}

static void test_quant_kernels_match_host(void **state)
{
    (void)state;
    /* ETP_TEST_QUANT_ON_HOST=1 runs the same checks on the host backend:
     * it proves the test itself on a machine without a GPU */
    const char *on_host = getenv("ETP_TEST_QUANT_ON_HOST");
    const int host = on_host && strcmp(on_host, "1") == 0;
    gpu_t g = {0};
    etp_context_config_t cc = ETP_CONTEXT_CONFIG_INIT;
    cc.backend = host ? ETP_BACKEND_HOST : ETP_BACKEND_CUDA;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &g.ctx));
    tu_apply_test_knobs(g.ctx, g_rank); /* the CTest variants' forced paths */
    ETP_OK(etp_context_world(g.ctx, &g.world));
    ETP_OK(etp_stream_create(g.ctx, ETP_STREAM_PRIORITY_NORMAL, &g.s));
    uint64_t tag = 0;
    /* ETP_TEST_QUANT_WHOLE_ONLY=1: the whole-tile batches alone (a
     * sanitizer run's budget) */
    const char *whole_only = getenv("ETP_TEST_QUANT_WHOLE_ONLY");
    const int rest = !(whole_only && strcmp(whole_only, "1") == 0);
    /* tensor counts: 1 to 256 (and 300: two launches) */
    const size_t counts[] = {1, 7, 64, 256, 300, 33};
    for (int fmt = 0; fmt < 2 * rest; fmt++)
        for (int var = 0; var < 2; var++)       /* NVFP4: 1D / 2D; MXFP8: E4M3 / E5M2 */
            for (unsigned dirs = 1; dirs <= 3; dirs++)
                for (int swz = 0; swz < 2; swz++) {
                    etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                    c.format = fmt ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
                    c.nvfp4_block = var ? ETP_QUANT_BLOCK_2D : ETP_QUANT_BLOCK_1D;
                    c.mxfp8_elem = var ? ETP_QUANT_ELEM_E5M2 : ETP_QUANT_ELEM_E4M3;
                    c.directions = dirs;
                    c.swizzle_scales = swz;
                    const size_t n = counts[tag % 6];
                    run_config(&g, c, n, tag++);
                }
    /* stochastic rounding, both block shapes, every direction set, both
     * scale layouts (columnwise-only tensors have any number of columns,
     * so the random bits' groups of 4 elements start anywhere in a row) */
    for (int var = 0; var < 2 * rest; var++)
        for (unsigned dirs = 1; dirs <= 3; dirs++)
            for (int swz = 0; swz < 2; swz++) {
                etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
                c.nvfp4_block = var ? ETP_QUANT_BLOCK_2D : ETP_QUANT_BLOCK_1D;
                c.directions = dirs;
                c.swizzle_scales = swz;
                c.rounding = ETP_QUANT_ROUND_STOCHASTIC;
                c.seed = g_seed * 7 + 1 + tag;
                const size_t n = dirs == 3 && !swz ? 40 : counts[tag % 3]; /* up to 64 */
                run_config(&g, c, n, tag++);
            }
    /* whole-tile MXFP8 batches: both element types, special values in
     * tags 3 mod 4 (j = 3 E5M2, 11 E4M3, 19 E5M2), infinities in 7 mod 8
     * (j = 7 E5M2, 15 E4M3), bands of zeros and tiny values in j = 0 mod 3
     * (E4M3 and E5M2, 1 to 256 tensors); j = 1 mod 8 columnwise alone,
     * 5 mod 8 rowwise alone */
    for (uint64_t j = 0; j < 21; j++) {
        etp_quantizer_config_t c = ETP_QUANTIZER_CONFIG_INIT;
        c.format = ETP_QUANT_MXFP8;
        c.mxfp8_elem = (j + j / 8) % 2 ? ETP_QUANT_ELEM_E5M2 : ETP_QUANT_ELEM_E4M3;
        c.directions = j % 8 == 1   ? ETP_QUANT_COLUMNWISE
                       : j % 8 == 5 ? ETP_QUANT_ROWWISE
                                    : ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE;
        const size_t wn[] = {64, 7, 1, 20};
        run_config(&g, c, j == 20 ? 256 : wn[j % 4], WHOLE_TAG + j);
    }
    if (rest) run_amax_many(&g, tag++);
    ETP_OK(etp_stream_destroy(g.s));
    ETP_OK(etp_context_destroy(g.ctx));
    if (getenv("ETP_TEST_VERBOSE") && g_rank == 0)
        printf("rank 0: %.2f s of the test in the host reference's threads\n", g_par_s);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_quant_gpu");
    /* the host variant (ETP_TEST_QUANT_ON_HOST=1) needs no GPU */
    const char *on_host = getenv("ETP_TEST_QUANT_ON_HOST");
    const int host = on_host && strcmp(on_host, "1") == 0;
#if ETP_HAVE_CUDA
    if (!host && tu_gpu_short("test_quant_gpu")) return tu_gpu_skip();
#else
    if (!host) {
        if (g_rank == 0)
            printf("test_quant_gpu: skipped: built without CUDA (ETP_TEST_QUANT_ON_HOST=1 runs it)\n");
        MPI_Finalize();
        return 77; /* CTest's skip code, as gpu_util.h's */
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_kernels_match_host),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
