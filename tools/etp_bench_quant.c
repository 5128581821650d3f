/*
 * etp-bench quant: the split-phase quantization of N expert weights
 * (etp/quant.h) against a device-to-device copy of the same bytes measured
 * in the same run, and the fused N-tensor launches against N launches of
 * one tensor each.
 *
 * For each case (N tensors of [rows, cols], BF16 by default) it times
 *
 *   multi-amax            etp_quant_multi_amax (one amax per tensor)
 *   cast <format>         etp_quant_cast_only, rowwise + columnwise
 *   split <format>        etp_quant_quantize: multi-amax, one amax all-reduce
 *                         over the world, cast (MXFP8: the cast alone)
 *
 * each fused (one call for the N tensors) and, when N > 1, as N calls of one
 * tensor each; a "fused/N" row gives the speedup of the fused call (its
 * ratio column). After the N calls' row, a ": host" row gives the host's
 * median time to enqueue them (wall clock around the calls), its ratio the
 * event-timed time over it: the flush gives the host a head start, so a
 * ratio near 1 says the host paced the N launches, and well below 1 (a
 * long --flush-mib, 4096 for 64 x [1024, 512]) that the GPU did. Bytes
 * are what the operation must read and write, counted exactly: the input
 * elements, the amaxes read or written (4 bytes per tensor), and every
 * output byte etp_quant_sizes() reports (scale padding included: the
 * kernels write it). The all-reduce's bytes are not counted
 * (its time is). The baseline row of each operation is a device-to-device
 * copy (etp_memcpy_async) of half as many bytes, so it reads and writes as
 * many bytes in all: ratio = copy time / operation time, the share of the
 * copy roofline reached.
 *
 * Timing: CUDA events on one stream, the median of --iters after --warmup
 * runs, the slowest rank's median; on the CUDA backend a --flush-mib buffer
 * is swept before every timed run so that no run finds its input in L2:
 * written (--flush write, the default of every record so far), which also
 * leaves L2 full of dirty lines that the timed run then writes back, or
 * read (--flush read: a multi-amax over it), which leaves clean lines.
 * On the host backend every operation is the reference quantizer on the CPU
 * (timings of the CPU; smaller default sizes).
 *
 *   etp-bench quant [--cases 64x1024x512,8x8192x4096] [--big-mib 256] [--dtype bf16|f32]
 *                   [--formats nvfp4,mxfp8] [...]
 *   (etp-bench quant --help: each option, from quant_opts below)
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etp/quant.h"
#include "etp_bench.h"

#define QB_MAX_CASES 16

typedef struct {
    size_t n, rows, cols;
} qcase_t;

typedef struct {
    bench_t *b;
    etp_stream_t *s;
    etp_group_t *world;
    bench_timer_t *tm;
    void *copy_src, *copy_dst; /* the baseline's buffers */
    size_t copy_cap;
    void *flush;               /* swept before every timed run (CUDA) */
    size_t flush_bytes;
    etp_quantizer_t *flush_q;  /* --flush read: the multi-amax that reads it */
    float *flush_amax;
    double *t;                 /* iters samples */
    double *h;                 /* iters samples of the host's enqueue time */
    double host_us;            /* the last time_op's median enqueue time, slowest rank */
} qbench_t;

/* One operation to time: fn(arg) enqueues it on the stream. */
typedef void (*op_fn_t)(qbench_t *x, void *arg);

static double time_op(qbench_t *x, op_fn_t fn, void *arg, int collective)
{
    bench_t *b = x->b;
    for (int it = -b->warmup; it < b->iters; it++) {
        if (x->flush && x->flush_q) {
            const etp_quant_input_t in = {x->flush, ETP_DTYPE_BF16, x->flush_bytes / 2 / 4096, 4096};
            BENCH_CHECK(b, etp_quant_multi_amax(x->flush_q, 1, &in, x->flush_amax, NULL, 1, x->s));
        } else if (x->flush) {
            BENCH_CHECK(b, etp_memset_async(x->s, x->flush, it & 0xff, x->flush_bytes));
        }
        /* ranks start a collective together, so that one rank's wait for
         * the others is not counted as its time */
        if (collective) {
            BENCH_CHECK(b, etp_stream_synchronize(x->s));
            MPI_Barrier(MPI_COMM_WORLD);
        }
        bench_timer_start(x->tm);
        const double h0 = MPI_Wtime();
        fn(x, arg);
        const double h1 = MPI_Wtime();
        bench_timer_stop(x->tm);
        const double us = bench_timer_us(x->tm);
        if (it >= 0) {
            x->t[it] = us;
            x->h[it] = 1e6 * (h1 - h0);
        }
    }
    x->host_us = bench_max_over_ranks(bench_median(x->h, b->iters));
    return bench_max_over_ranks(bench_median(x->t, b->iters));
}

static void op_copy(qbench_t *x, void *arg)
{
    BENCH_CHECK(x->b, etp_memcpy_async(x->s, x->copy_dst, x->copy_src, *(const size_t *)arg));
}

/* The baseline: a copy that reads and writes `moved` bytes in all; its
 * bandwidth over those bytes, GB/s. */
static double copy_gbps(qbench_t *x, double moved)
{
    size_t half = (size_t)(moved / 2);
    if (half > x->copy_cap) half = x->copy_cap; /* cannot happen: sized for the largest */
    if (half == 0) return 0;
    const double us = time_op(x, op_copy, &half, 0);
    return us > 0 ? 2.0 * (double)half / (us * 1e3) : 0;
}

/* The row after a separate launches' row rs: the host's median time to
 * enqueue them, its ratio rs's event-timed time over it. The flush gives
 * the host a head start, so a ratio near 1 (or above) says the host, not
 * the GPU, paced the launches. */
static void add_host_row(qbench_t *x, const char *name, const char *shape, double moved, const bench_row_t *rs)
{
    char h[80];
    snprintf(h, sizeof h, "%s: host", name);
    bench_add(x->b, h, shape, moved, x->host_us, rs->gbps);
}

/* ---- one case --------------------------------------------------------------- */

typedef struct {
    etp_quantizer_t *q;
    int nvfp4;
    size_t n;
    etp_quant_input_t *in;
    etp_quant_output_t *out;
    float *amax; /* device, n floats */
    int separate; /* one call per tensor */
} qop_t;

static void op_amax(qbench_t *x, void *arg)
{
    qop_t *o = arg;
    if (!o->separate) {
        BENCH_CHECK(x->b, etp_quant_multi_amax(o->q, o->n, o->in, o->amax, NULL, o->n, x->s));
        return;
    }
    for (size_t i = 0; i < o->n; i++)
        BENCH_CHECK(x->b, etp_quant_multi_amax(o->q, 1, &o->in[i], &o->amax[i], NULL, 1, x->s));
}

static void op_cast(qbench_t *x, void *arg)
{
    qop_t *o = arg;
    if (!o->separate) {
        BENCH_CHECK(x->b, etp_quant_cast_only(o->q, o->n, o->in, o->nvfp4 ? o->amax : NULL,
                                              o->nvfp4 ? o->n : 0, o->out, x->s));
        return;
    }
    for (size_t i = 0; i < o->n; i++)
        BENCH_CHECK(x->b, etp_quant_cast_only(o->q, 1, &o->in[i], o->nvfp4 ? &o->amax[i] : NULL,
                                              o->nvfp4 ? 1 : 0, &o->out[i], x->s));
}

static void op_split(qbench_t *x, void *arg)
{
    qop_t *o = arg;
    if (!o->separate) {
        BENCH_CHECK(x->b, etp_quant_quantize(o->q, o->n, o->in, o->amax, o->n, x->world, 0, o->out,
                                             x->s));
        return;
    }
    /* the per-expert way: an amax, an all-reduce and a cast for each */
    for (size_t i = 0; i < o->n; i++)
        BENCH_CHECK(x->b, etp_quant_quantize(o->q, 1, &o->in[i], &o->amax[i], 1, x->world, 0,
                                             &o->out[i], x->s));
}

/* Fill a tensor with varied finite values (several binades, both signs,
 * some zeros), through a host staging buffer. */
static void fill_input(qbench_t *x, void *dev, size_t elems, etp_dtype_t dt, uint64_t seed)
{
    const size_t es = etp_dtype_size(dt), chunk = (size_t)4 << 20;
    uint8_t *h = malloc(chunk * es);
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t e0 = 0; e0 < elems; e0 += chunk) {
        const size_t m = elems - e0 < chunk ? elems - e0 : chunk;
        for (size_t e = 0; e < m; e++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t v = (uint32_t)(r >> 32);
            /* sign, exponent 2^-8 .. 2^7, 16 random mantissa bits; 1 in 256 zero */
            uint32_t bits = ((v & 1u) << 31) | ((119u + (v >> 1) % 16u) << 23) | ((v >> 8) & 0x7fff80u);
            if ((v >> 24) == 0) bits = 0;
            if (dt == ETP_DTYPE_BF16) {
                const uint16_t hb = (uint16_t)(bits >> 16);
                memcpy(h + e * 2, &hb, 2);
            } else {
                memcpy(h + e * 4, &bits, 4);
            }
        }
        BENCH_CHECK(x->b, etp_memcpy_async(x->s, (uint8_t *)dev + e0 * es, h, m * es));
        BENCH_CHECK(x->b, etp_stream_synchronize(x->s));
    }
    free(h);
}

static void run_case(qbench_t *x, const qcase_t *c, etp_dtype_t dt, const char *formats,
                     int nvfp4_1d, int swizzle, int separate, int stochastic)
{
    bench_t *b = x->b;
    const size_t n = c->n, es = etp_dtype_size(dt), elems = c->rows * c->cols;
    char shape[96];
    snprintf(shape, sizeof shape, "%zu x [%zu, %zu] %s", n, c->rows, c->cols, etp_dtype_name(dt));
    etp_quant_input_t *in = calloc(n, sizeof *in);
    for (size_t i = 0; i < n; i++) {
        in[i] = (etp_quant_input_t){NULL, dt, c->rows, c->cols};
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, elems * es, ETP_MEM_USER, (void **)&in[i].data));
        fill_input(x, (void *)in[i].data, elems, dt, (uint64_t)b->rank * 1000003u + i);
    }
    float *amax;
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, n * sizeof(float), ETP_MEM_USER, (void **)&amax));
    const double in_bytes = (double)n * (double)elems * (double)es, amax_bytes = 4.0 * (double)n;
    const int sep = separate && n > 1;
    char name[64];

    /* multi-amax: reads the inputs, writes one float per tensor (format-free) */
    {
        etp_quantizer_t *q;
        BENCH_CHECK(b, etp_quantizer_create(b->ctx, NULL, &q));
        qop_t o = {q, 1, n, in, NULL, amax, 0};
        const double moved = in_bytes + amax_bytes, base = copy_gbps(x, moved);
        const double us = time_op(x, op_amax, &o, 0);
        bench_row_t *rf = bench_add(b, "multi-amax", shape, moved, us, base);
        if (sep) {
            o.separate = 1;
            snprintf(name, sizeof name, "multi-amax, %zu launches", n);
            bench_row_t *rs = bench_add(b, name, shape, moved, time_op(x, op_amax, &o, 0), base);
            add_host_row(x, name, shape, moved, rs);
            bench_add(b, "multi-amax fused/separate", shape, moved, rf->us, rs->gbps);
            bench_add(b, "multi-amax copy/separate", shape, moved, moved / (base * 1e3), rs->gbps);
        }
        BENCH_CHECK(b, etp_quantizer_destroy(q));
    }

    char fl[64];
    snprintf(fl, sizeof fl, "%s", formats);
    for (char *save = NULL, *tok = strtok_r(fl, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const int nv = strcmp(tok, "nvfp4") == 0;
        if (stochastic && !nv) continue; /* stochastic rounding is NVFP4's alone */
        etp_quantizer_config_t cfg = ETP_QUANTIZER_CONFIG_INIT;
        cfg.format = nv ? ETP_QUANT_NVFP4 : ETP_QUANT_MXFP8;
        cfg.nvfp4_block = nvfp4_1d ? ETP_QUANT_BLOCK_1D : ETP_QUANT_BLOCK_2D;
        cfg.directions = ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE;
        cfg.swizzle_scales = swizzle;
        if (stochastic) {
            cfg.rounding = ETP_QUANT_ROUND_STOCHASTIC;
            cfg.seed = 0x5eed;
        }
        const char *fname = nv ? (nvfp4_1d ? (stochastic ? "nvfp4 1d sr" : "nvfp4 1d")
                                           : (stochastic ? "nvfp4 2d sr" : "nvfp4 2d"))
                               : "mxfp8";
        etp_quantizer_t *q;
        BENCH_CHECK(b, etp_quantizer_create(b->ctx, &cfg, &q));
        etp_quant_sizes_t sz = ETP_QUANT_SIZES_INIT;
        BENCH_CHECK(b, etp_quant_sizes(q, c->rows, c->cols, &sz));
        const double out_bytes = (double)n * (double)(sz.rowwise_data_bytes + sz.rowwise_scales_bytes +
                                                      sz.columnwise_data_bytes +
                                                      sz.columnwise_scales_bytes);
        etp_quant_output_t *out = calloc(n, sizeof *out);
        for (size_t i = 0; i < n; i++) {
            etp_quant_output_t *o = &out[i];
            o->rowwise_data_bytes = sz.rowwise_data_bytes;
            o->rowwise_scales_bytes = sz.rowwise_scales_bytes;
            o->columnwise_data_bytes = sz.columnwise_data_bytes;
            o->columnwise_scales_bytes = sz.columnwise_scales_bytes;
            BENCH_CHECK(b, etp_mem_alloc(b->ctx, sz.rowwise_data_bytes, ETP_MEM_USER, &o->rowwise_data));
            BENCH_CHECK(b, etp_mem_alloc(b->ctx, sz.rowwise_scales_bytes, ETP_MEM_USER, &o->rowwise_scales));
            BENCH_CHECK(b, etp_mem_alloc(b->ctx, sz.columnwise_data_bytes, ETP_MEM_USER, &o->columnwise_data));
            BENCH_CHECK(b, etp_mem_alloc(b->ctx, sz.columnwise_scales_bytes, ETP_MEM_USER,
                                         &o->columnwise_scales));
        }
        qop_t o = {q, nv, n, in, out, amax, 0};
        /* real amaxes for the casts to use */
        BENCH_CHECK(b, etp_quant_multi_amax(q, n, in, amax, NULL, n, x->s));

        /* cast-only: reads the inputs (and the NVFP4 amaxes), writes every output */
        const double cast_moved = in_bytes + (nv ? amax_bytes : 0) + out_bytes;
        double base = copy_gbps(x, cast_moved);
        snprintf(name, sizeof name, "cast %s r+c", fname);
        bench_row_t *rf = bench_add(b, name, shape, cast_moved, time_op(x, op_cast, &o, 0), base);
        if (sep) {
            o.separate = 1;
            snprintf(name, sizeof name, "cast %s, %zu launches", fname, n);
            bench_row_t *rs = bench_add(b, name, shape, cast_moved, time_op(x, op_cast, &o, 0), base);
            add_host_row(x, name, shape, cast_moved, rs);
            snprintf(name, sizeof name, "cast %s fused/separate", fname);
            bench_add(b, name, shape, cast_moved, rf->us, rs->gbps);
            /* the most a fused call can gain: one that ran as fast as a copy */
            snprintf(name, sizeof name, "cast %s copy/separate", fname);
            bench_add(b, name, shape, cast_moved, cast_moved / (base * 1e3), rs->gbps);
            o.separate = 0;
        }

        /* the split phase: NVFP4 reads the inputs twice (amax, then cast) */
        const double split_moved = nv ? in_bytes + 2 * amax_bytes + cast_moved : cast_moved;
        base = copy_gbps(x, split_moved);
        snprintf(name, sizeof name, nv ? "split %s (amax+ar+cast)" : "split %s (cast)", fname);
        /* only NVFP4's quantize issues a collective; MXFP8's, timed from a
         * synchronized idle GPU like one, would count the host's launch
         * preparation that its cast row hides behind the flush */
        rf = bench_add(b, name, shape, split_moved, time_op(x, op_split, &o, nv), base);
        if (sep) {
            o.separate = 1;
            snprintf(name, sizeof name, "split %s, %zu x 1", fname, n);
            bench_row_t *rs = bench_add(b, name, shape, split_moved, time_op(x, op_split, &o, nv), base);
            add_host_row(x, name, shape, split_moved, rs);
            snprintf(name, sizeof name, "split %s fused/separate", fname);
            bench_add(b, name, shape, split_moved, rf->us, rs->gbps);
        }

        BENCH_CHECK(b, etp_stream_synchronize(x->s));
        for (size_t i = 0; i < n; i++) {
            BENCH_CHECK(b, etp_mem_free(b->ctx, out[i].rowwise_data));
            BENCH_CHECK(b, etp_mem_free(b->ctx, out[i].rowwise_scales));
            BENCH_CHECK(b, etp_mem_free(b->ctx, out[i].columnwise_data));
            BENCH_CHECK(b, etp_mem_free(b->ctx, out[i].columnwise_scales));
        }
        free(out);
        BENCH_CHECK(b, etp_quantizer_destroy(q));
    }
    BENCH_CHECK(b, etp_stream_synchronize(x->s));
    for (size_t i = 0; i < n; i++) BENCH_CHECK(b, etp_mem_free(b->ctx, (void *)in[i].data));
    BENCH_CHECK(b, etp_mem_free(b->ctx, amax));
    free(in);
}

/* The most bytes any operation of the case moves, for the copy buffers:
 * the split phase of MXFP8 (2 bytes out per element) or NVFP4 (the input
 * twice). */
static double case_max_moved(const qcase_t *c, size_t es)
{
    const double elems = (double)c->n * (double)c->rows * (double)c->cols;
    /* scale bytes: at most one per 16 elements per direction plus padding */
    const double scales = 2.0 * ((double)c->n * ((double)c->rows + 128) * ((double)c->cols / 16 + 132));
    const double mx = elems * (double)es + 2.0 * elems + scales;
    const double nv = 2.0 * elems * (double)es + elems + scales + 12.0 * (double)c->n;
    return mx > nv ? mx : nv;
}

/* NxRxK cases: positive decimals, nothing else in a token */
static int parse_cases(const char *s, qcase_t *cases, int *ncases)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", s);
    *ncases = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long n, r, k;
        int used = 0;
        if (strchr(tok, '-') || sscanf(tok, "%llux%llux%llu%n", &n, &r, &k, &used) != 3 || tok[used] != '\0' ||
            n == 0 || r == 0 || k == 0 || *ncases == QB_MAX_CASES)
            return -1;
        cases[(*ncases)++] = (qcase_t){(size_t)n, (size_t)r, (size_t)k};
    }
    return *ncases > 0 ? 0 : -1;
}

/* Defaults by backend: the reference quantizer on a CPU is slow, so the host
 * backend's sizes are small. */
#define CASES_CUDA "64x1024x512,8x8192x4096"
#define CASES_HOST "64x256x128,4x512x512"
#define BIG_MIB_CUDA "256"
#define BIG_MIB_HOST "4"
#define FLUSH_MIB_CUDA "256"
#define FLUSH_MIB_HOST "0"

enum {
    O_CASES, O_BIG_MIB, O_DTYPE, O_FORMATS, O_NVFP4_1D, O_SWIZZLE, O_NO_SEPARATE, O_FLUSH_MIB,
    O_FLUSH, O_STOCHASTIC
};
static const etp_cli_opt_t quant_opts[] = {
    [O_CASES] = {"cases", "LIST", NULL,
                 "cases of N tensors [rows, cols], as NxROWSxCOLS, comma-separated (default: "
                 CASES_CUDA " on CUDA, " CASES_HOST " on the host backend)"},
    [O_BIG_MIB] = {"big-mib", "MIB", NULL,
                   "one more case: one tensor [rows, 4096] of this size; 0: none (default: "
                   BIG_MIB_CUDA " on CUDA, " BIG_MIB_HOST " on the host backend)"},
    [O_DTYPE] = {"dtype", "bf16|f32", "bf16", "the tensors' element type"},
    [O_FORMATS] = {"formats", "LIST", "nvfp4,mxfp8", "the formats to time, comma-separated"},
    [O_NVFP4_1D] = {"nvfp4-1d", NULL, NULL, "NVFP4 with 1x16 blocks (default: 16x16)"},
    [O_SWIZZLE] = {"swizzle", NULL, NULL, "scales in cuBLASLt's 128x4 tiled order (default: row-major)"},
    [O_NO_SEPARATE] = {"no-separate", NULL, NULL, "skip the N calls of one tensor each"},
    [O_FLUSH_MIB] = {"flush-mib", "MIB", NULL,
                     "CUDA: a buffer of this size swept before every timed run, so that no run "
                     "finds its input in L2 (default: " FLUSH_MIB_CUDA " on CUDA, "
                     FLUSH_MIB_HOST " on the host backend)"},
    [O_FLUSH] = {"flush", "write|read", "write",
                 "sweep the flush buffer by writing it (leaves dirty lines in L2) or reading it "
                 "(a multi-amax: clean lines)"},
    [O_STOCHASTIC] = {"stochastic", NULL, NULL,
                      "NVFP4 with stochastic rounding (MXFP8 rows are skipped)"},
    {NULL},
};

static const char quant_about[] =
    "The split-phase quantization of N expert weights (etp/quant.h) against a device-to-device "
    "copy of the same bytes measured in the same run, and the fused N-tensor launches against "
    "N launches of one tensor each. For each case it times multi-amax, cast (rowwise + "
    "columnwise) and split (multi-amax, amax all-reduce over the world, cast), fused and as N "
    "calls. Bytes are what the operation must read and write; ratio = copy time / operation "
    "time. On the host backend every operation is the reference quantizer on the CPU.";

int etp_bench_quant(bench_t *b, int argc, char **argv)
{
    const char *cases_s = NULL, *formats = NULL;
    double big_mib = -1, flush_mib = -1; /* -1: the backend's default */
    etp_dtype_t dt = ETP_DTYPE_BF16;
    int nvfp4_1d = 0, swizzle = 0, separate = 1, flush_read = 0, stochastic = 0;
    etp_cli_t cli = bench_cli(b, "quant", quant_about, quant_opts, argc, argv);
    int key;
    while ((key = bench_next(b, &cli)) >= 0) {
        switch (key) {
        case O_CASES:
            cases_s = cli.arg;
            break;
        case O_BIG_MIB:
            if (bench_double(b, cli.opt, cli.arg, 0, 1e6, &big_mib)) return 2;
            break;
        case O_FLUSH_MIB:
            if (bench_double(b, cli.opt, cli.arg, 0, 1e6, &flush_mib)) return 2;
            break;
        case O_FORMATS:
            formats = cli.arg;
            break;
        case O_FLUSH:
            if (strcmp(cli.arg, "write") == 0) flush_read = 0;
            else if (strcmp(cli.arg, "read") == 0) flush_read = 1;
            else {
                if (b->rank == 0) fprintf(stderr, "etp-bench quant: --flush write or read\n");
                return 2;
            }
            break;
        case O_DTYPE:
            if (strcmp(cli.arg, "bf16") == 0) dt = ETP_DTYPE_BF16;
            else if (strcmp(cli.arg, "f32") == 0) dt = ETP_DTYPE_F32;
            else {
                if (b->rank == 0) fprintf(stderr, "etp-bench quant: --dtype bf16 or f32\n");
                return 2;
            }
            break;
        case O_NVFP4_1D:
            nvfp4_1d = 1;
            break;
        case O_SWIZZLE:
            swizzle = 1;
            break;
        case O_STOCHASTIC:
            stochastic = 1;
            break;
        case O_NO_SEPARATE:
            separate = 0;
            break;
        }
    }
    if (key != ETP_CLI_END) return bench_stop(key);
    bench_start(b);
    const int cuda = b->backend == ETP_BACKEND_CUDA;
    if (!cases_s) cases_s = cuda ? CASES_CUDA : CASES_HOST;
    if (big_mib < 0) big_mib = atof(cuda ? BIG_MIB_CUDA : BIG_MIB_HOST);
    if (flush_mib < 0) flush_mib = atof(cuda ? FLUSH_MIB_CUDA : FLUSH_MIB_HOST);
    {   /* only the two formats */
        char fl[64];
        int nvfp4 = 0;
        snprintf(fl, sizeof fl, "%s", formats);
        for (char *save = NULL, *tok = strtok_r(fl, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (strcmp(tok, "nvfp4") != 0 && strcmp(tok, "mxfp8") != 0) {
                if (b->rank == 0) fprintf(stderr, "etp-bench quant: unknown format %s\n", tok);
                return 2;
            }
            nvfp4 |= strcmp(tok, "nvfp4") == 0;
        }
        if (stochastic && !nvfp4) { /* it would time nothing but the multi-amax */
            if (b->rank == 0)
                fprintf(stderr, "etp-bench quant: --stochastic is NVFP4's: --formats %s has no nvfp4\n",
                        formats);
            return 2;
        }
    }
    qcase_t cases[QB_MAX_CASES + 1];
    int ncases = 0;
    if (parse_cases(cases_s, cases, &ncases) != 0) {
        if (b->rank == 0)
            fprintf(stderr, "etp-bench quant: --cases wants NxROWSxCOLS[,...] (at most %d)\n",
                    QB_MAX_CASES);
        return 2;
    }
    const size_t es = etp_dtype_size(dt);
    if (big_mib > 0) { /* one tensor [rows, 4096] of big_mib MiB, rows a multiple of 128 */
        size_t rows = (size_t)(big_mib * 1048576.0 / (double)es / 4096.0);
        rows = (rows + 127) / 128 * 128;
        cases[ncases++] = (qcase_t){1, rows, 4096};
    }
    for (int k = 0; k < ncases; k++)
        if (cases[k].rows % 32 || cases[k].cols % 32) {
            if (b->rank == 0)
                fprintf(stderr, "etp-bench quant: rows and cols must be multiples of 32 "
                                "(both formats, both directions)\n");
            return 2;
        }

    qbench_t x = {.b = b};
    BENCH_CHECK(b, etp_context_world(b->ctx, &x.world));
    BENCH_CHECK(b, etp_stream_create(b->ctx, ETP_STREAM_PRIORITY_NORMAL, &x.s));
    x.tm = bench_timer_create(b, x.s);
    x.t = calloc((size_t)b->iters, sizeof(double));
    x.h = calloc((size_t)b->iters, sizeof(double));
    if (!x.t || !x.h) {
        fprintf(stderr, "etp-bench rank %d: out of host memory for %d samples\n", b->rank, b->iters);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double most = 0;
    for (int k = 0; k < ncases; k++) {
        const double m = case_max_moved(&cases[k], es);
        if (m > most) most = m;
    }
    x.copy_cap = (size_t)(most / 2) + 4096;
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, x.copy_cap, ETP_MEM_WORKSPACE, &x.copy_src));
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, x.copy_cap, ETP_MEM_WORKSPACE, &x.copy_dst));
    BENCH_CHECK(b, etp_memset_async(x.s, x.copy_src, 0x3c, x.copy_cap));
    /* whole BF16 rows of 4096 (the read sweep's tensor): less is no flush */
    if ((size_t)(flush_mib * 1048576.0) / 8192 > 0) {
        x.flush_bytes = (size_t)(flush_mib * 1048576.0) / 8192 * 8192;
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, x.flush_bytes, ETP_MEM_WORKSPACE, &x.flush));
        BENCH_CHECK(b, etp_memset_async(x.s, x.flush, 0x3c, x.flush_bytes));
        if (flush_read) {
            etp_quantizer_config_t fc = ETP_QUANTIZER_CONFIG_INIT;
            BENCH_CHECK(b, etp_quantizer_create(b->ctx, &fc, &x.flush_q));
            BENCH_CHECK(b, etp_mem_alloc(b->ctx, sizeof(float), ETP_MEM_WORKSPACE, (void **)&x.flush_amax));
        }
    }
    for (int k = 0; k < ncases; k++) run_case(&x, &cases[k], dt, formats, nvfp4_1d, swizzle, separate, stochastic);

    BENCH_CHECK(b, etp_stream_synchronize(x.s));
    if (x.flush) BENCH_CHECK(b, etp_mem_free(b->ctx, x.flush));
    if (x.flush_amax) BENCH_CHECK(b, etp_mem_free(b->ctx, x.flush_amax));
    if (x.flush_q) BENCH_CHECK(b, etp_quantizer_destroy(x.flush_q));
    BENCH_CHECK(b, etp_mem_free(b->ctx, x.copy_src));
    BENCH_CHECK(b, etp_mem_free(b->ctx, x.copy_dst));
    free(x.t);
    free(x.h);
    bench_timer_destroy(x.tm);
    BENCH_CHECK(b, etp_stream_destroy(x.s));
    return 0;
}
