/*
 * etp-bench: benchmarks of etp against baselines measured in the same run.
 *
 *   mpirun -np N etp-bench SUBCOMMAND [--iters N] [--warmup N] [--csv FILE] [--json FILE] [options]
 *   etp-bench --help, etp-bench SUBCOMMAND --help: the options (made from
 *   the tables that the parser reads, tools/etp_cli.h)
 *
 * Subcommands: gather (sharded-weight all-gather against a plain
 * ncclAllGather), chain (exposed communication of a training step with
 * cuBLASLt GEMMs), quant, ep, layer (when built). Each prints a table on rank 0:
 * median time over the iterations (the slowest rank's), bandwidth, the
 * baseline's bandwidth and the ratio.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "etp_bench.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

struct bench_timer {
    bench_t *b;
    etp_stream_t *s;
    double t0, t1;
#if ETP_HAVE_CUDA
    cudaEvent_t e0, e1;
#endif
};

#if ETP_HAVE_CUDA
static void CUDART_CB hold_fn(void *arg)
{
    atomic_int *gate = arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!atomic_load_explicit(gate, memory_order_acquire)) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) break; /* a region that waited on the host */
    }
}
#endif

void bench_hold(bench_t *b, etp_stream_t *s)
{
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA) {
        if (!b->gate) {
            b->gate = calloc(1, sizeof(atomic_int));
            if (!b->gate) {
                fprintf(stderr, "etp-bench rank %d: out of host memory for a hold\n", b->rank);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        atomic_store((atomic_int *)b->gate, 0);
        cudaStream_t cs;
        BENCH_CHECK(b, etp_stream_get_cuda(s, &cs));
        BENCH_CUDA(b, cudaLaunchHostFunc(cs, hold_fn, b->gate));
        b->held = 1;
    }
#else
    (void)b;
    (void)s;
#endif
}

void bench_release(bench_t *b)
{
    if (!b->held) return;
    MPI_Barrier(MPI_COMM_WORLD);
    atomic_store_explicit((atomic_int *)b->gate, 1, memory_order_release);
    b->held = 0;
}

struct bench_seq {
    bench_t *b;
    etp_stream_t *s;
    int n, waited;
    double *t;
#if ETP_HAVE_CUDA
    cudaEvent_t *ev;
#endif
};

bench_seq_t *bench_seq_create(bench_t *b, etp_stream_t *s, int n)
{
    bench_seq_t *q = calloc(1, sizeof *q);
    if (q) q->t = calloc((size_t)n, sizeof *q->t);
#if ETP_HAVE_CUDA
    if (q) q->ev = calloc((size_t)n, sizeof *q->ev);
    if (q && !q->ev) q->t = (free(q->t), NULL);
#endif
    if (!q || !q->t) {
        fprintf(stderr, "etp-bench rank %d: out of host memory for %d marks\n", b->rank, n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    q->b = b;
    q->s = s;
    q->n = n;
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA)
        for (int i = 0; i < n; i++) BENCH_CUDA(b, cudaEventCreate(&q->ev[i]));
#endif
    return q;
}

void bench_seq_mark(bench_seq_t *q, int i)
{
    q->waited = 0;
#if ETP_HAVE_CUDA
    if (q->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(q->b, etp_stream_get_cuda(q->s, &cs));
        BENCH_CUDA(q->b, cudaEventRecord(q->ev[i], cs));
        return;
    }
#endif
    BENCH_CHECK(q->b, etp_stream_synchronize(q->s));
    q->t[i] = MPI_Wtime();
}

double bench_seq_us(bench_seq_t *q, int a, int z)
{
    if (!q->waited) {
        bench_release(q->b);
        BENCH_CHECK(q->b, etp_stream_synchronize(q->s));
        q->waited = 1;
    }
#if ETP_HAVE_CUDA
    if (q->b->backend == ETP_BACKEND_CUDA) {
        float ms = 0;
        BENCH_CUDA(q->b, cudaEventElapsedTime(&ms, q->ev[a], q->ev[z]));
        return 1000.0 * ms;
    }
#endif
    return 1e6 * (q->t[z] - q->t[a]);
}

void bench_seq_destroy(bench_seq_t *q)
{
    if (!q) return;
#if ETP_HAVE_CUDA
    if (q->b->backend == ETP_BACKEND_CUDA)
        for (int i = 0; i < q->n; i++) (void)cudaEventDestroy(q->ev[i]);
    free(q->ev);
#endif
    free(q->t);
    free(q);
}

bench_timer_t *bench_timer_create(bench_t *b, etp_stream_t *s)
{
    bench_timer_t *t = calloc(1, sizeof *t);
    if (!t) {
        fprintf(stderr, "etp-bench rank %d: out of host memory for a timer\n", b->rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    t->b = b;
    t->s = s;
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA) {
        BENCH_CUDA(b, cudaEventCreate(&t->e0));
        BENCH_CUDA(b, cudaEventCreate(&t->e1));
    }
#endif
    return t;
}

void bench_timer_start(bench_timer_t *t)
{
#if ETP_HAVE_CUDA
    if (t->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(t->b, etp_stream_get_cuda(t->s, &cs));
        BENCH_CUDA(t->b, cudaEventRecord(t->e0, cs));
        return;
    }
#endif
    BENCH_CHECK(t->b, etp_stream_synchronize(t->s));
    t->t0 = MPI_Wtime();
}

void bench_timer_stop(bench_timer_t *t)
{
#if ETP_HAVE_CUDA
    if (t->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(t->b, etp_stream_get_cuda(t->s, &cs));
        BENCH_CUDA(t->b, cudaEventRecord(t->e1, cs));
        bench_release(t->b);
        return;
    }
#endif
    BENCH_CHECK(t->b, etp_stream_synchronize(t->s));
    t->t1 = MPI_Wtime();
}

double bench_timer_us(bench_timer_t *t)
{
#if ETP_HAVE_CUDA
    if (t->b->backend == ETP_BACKEND_CUDA) {
        BENCH_CHECK(t->b, etp_stream_synchronize(t->s));
        float ms = 0;
        BENCH_CUDA(t->b, cudaEventElapsedTime(&ms, t->e0, t->e1));
        return 1000.0 * ms;
    }
#endif
    return 1e6 * (t->t1 - t->t0);
}

void bench_timer_destroy(bench_timer_t *t)
{
#if ETP_HAVE_CUDA
    if (t->b->backend == ETP_BACKEND_CUDA) {
        BENCH_CUDA(t->b, cudaEventDestroy(t->e0));
        BENCH_CUDA(t->b, cudaEventDestroy(t->e1));
    }
#endif
    free(t);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_max_over_ranks(double x)
{
    double m = x;
    MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

bench_row_t *bench_add(bench_t *b, const char *name, const char *shape, double bytes, double us,
                       double base_gbps)
{
    if (b->nrows == b->cap_rows) {
        int cap = b->cap_rows ? 2 * b->cap_rows : 64;
        bench_row_t **a = realloc(b->rows, (size_t)cap * sizeof *a);
        if (!a) {
            fprintf(stderr, "etp-bench rank %d: out of host memory for rows\n", b->rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        b->rows = a;
        b->cap_rows = cap;
    }
    /* a row of its own: callers keep the pointer past later rows */
    bench_row_t *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "etp-bench rank %d: out of host memory for rows\n", b->rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    b->rows[b->nrows++] = r;
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    r->bytes = bytes;
    r->us = us;
    r->gbps = us > 0 ? bytes / (us * 1e3) : 0;
    r->base_gbps = base_gbps;
    r->ratio = base_gbps > 0 ? r->gbps / base_gbps : 0;
    return r;
}

int bench_long(const bench_t *b, const char *opt, const char *s, long lo, long hi, long *out)
{
    return etp_cli_long(b->prog[0] ? b->prog : "etp-bench", b->rank != 0, opt, s, lo, hi, out);
}

int bench_double(const bench_t *b, const char *opt, const char *s, double lo, double hi, double *out)
{
    return etp_cli_double(b->prog[0] ? b->prog : "etp-bench", b->rank != 0, opt, s, lo, hi, out);
}

/* ---- options ------------------------------------------------------------ */

enum { C_ITERS, C_WARMUP, C_CSV, C_JSON };
static const etp_cli_opt_t common_opts[] = {
    [C_ITERS] = {"iters", "N", "20", "timed iterations; a row is the slowest rank's median"},
    [C_WARMUP] = {"warmup", "N", "5", "untimed iterations before them"},
    [C_CSV] = {"csv", "FILE", NULL, "also write the table to FILE as CSV (rank 0)"},
    [C_JSON] = {"json", "FILE", NULL, "also write the table to FILE as JSON (rank 0)"},
    {NULL},
};
static const char common_title[] = "Options of every subcommand";

etp_cli_t bench_cli(bench_t *b, const char *sub, const char *about, const etp_cli_opt_t *opts,
                    int argc, char **argv)
{
    snprintf(b->prog, sizeof b->prog, "etp-bench %s", sub);
    return (etp_cli_t){.prog = b->prog, .about = about, .tables = {opts, common_opts},
                       .titles = {NULL, common_title}, .quiet = b->rank != 0, .argc = argc,
                       .argv = argv};
}

int bench_next(bench_t *b, etp_cli_t *cli)
{
    int k;
    while ((k = etp_cli_next(cli)) >= 0) {
        if (ETP_CLI_TABLE(k) == 0) return ETP_CLI_INDEX(k);
        long v = 0;
        switch (ETP_CLI_INDEX(k)) {
        case C_ITERS:
            if (bench_long(b, cli->opt, cli->arg, 1, 1000000, &v)) return ETP_CLI_ERROR;
            b->iters = (int)v;
            break;
        case C_WARMUP:
            if (bench_long(b, cli->opt, cli->arg, 0, 1000000, &v)) return ETP_CLI_ERROR;
            b->warmup = (int)v;
            break;
        case C_CSV:
            b->csv = cli->arg;
            break;
        case C_JSON:
            b->json = cli->arg;
            break;
        }
    }
    return k;
}

int bench_stop(int k)
{
    return k == ETP_CLI_HELP ? 0 : 2;
}

void bench_start(bench_t *b)
{
    BENCH_CHECK(b, etp_context_create_mpi(MPI_COMM_WORLD, NULL, &b->ctx));
    BENCH_CHECK(b, etp_context_backend(b->ctx, &b->backend));
}

static void print_table(const bench_t *b)
{
    printf("%-34s %-34s %12s %12s %10s %10s %7s\n", "benchmark", "shape", "bytes", "time_us",
           "GB/s", "base_GB/s", "ratio");
    for (int i = 0; i < b->nrows; i++) {
        const bench_row_t *r = b->rows[i];
        printf("%-34s %-34s %12.0f %12.1f %10.1f %10.1f %7.3f\n", r->name, r->shape, r->bytes,
               r->us, r->gbps, r->base_gbps, r->ratio);
    }
}

/* 0, or -1 after a message: a run whose file was asked for and not written
 * must not look like a success */
static int write_failed(const char *path)
{
    fprintf(stderr, "etp-bench: cannot write %s\n", path);
    return -1;
}

static int write_csv(const bench_t *b, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return write_failed(path);
    fprintf(f, "benchmark,shape,bytes,time_us,gbps,base_gbps,ratio\n");
    for (int i = 0; i < b->nrows; i++) {
        const bench_row_t *r = b->rows[i];
        /* names hold commas ("cast mxfp8, 64 launches"): quoted like the shapes */
        fprintf(f, "\"%s\",\"%s\",%.0f,%.3f,%.3f,%.3f,%.4f\n", r->name, r->shape, r->bytes, r->us,
                r->gbps, r->base_gbps, r->ratio);
    }
    return fclose(f) == 0 ? 0 : write_failed(path);
}

static int write_json(const bench_t *b, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return write_failed(path);
    fprintf(f, "{\"ranks\": %d, \"backend\": \"%s\", \"iters\": %d, \"rows\": [\n", b->size,
            b->backend == ETP_BACKEND_CUDA ? "cuda" : "host", b->iters);
    for (int i = 0; i < b->nrows; i++) {
        const bench_row_t *r = b->rows[i];
        fprintf(f, "  {\"benchmark\": \"%s\", \"shape\": \"%s\", \"bytes\": %.0f, \"time_us\": %.3f, "
                   "\"gbps\": %.3f, \"base_gbps\": %.3f, \"ratio\": %.4f}%s\n",
                r->name, r->shape, r->bytes, r->us, r->gbps, r->base_gbps, r->ratio,
                i + 1 < b->nrows ? "," : "");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : write_failed(path);
}

static const struct {
    const char *name;
    int (*fn)(bench_t *b, int argc, char **argv); /* NULL: not built in */
    const char *about;
} cmds[] = {
    {"gather", etp_bench_gather, "the gather of a sharded weight (BF16, MXFP8, NVFP4) against a "
                                 "plain all-gather"},
    {"chain", etp_bench_chain, "how much communication a chain leaves exposed in a training "
                               "step with cuBLASLt GEMMs (CUDA)"},
    {"quant", etp_bench_quant, "split-phase NVFP4/MXFP8 quantization of N tensors against a "
                               "device copy"},
    {"ep", etp_bench_ep, "expert-parallel dispatch and combine against a plain send/recv"},
    {"layer", etp_bench_layer, "one MoE layer of etp-train's model forward and backward "
                               "(gathered or resident weights, eager or graph), and its grouped "
                               "GEMMs against one dense GEMM of the same FLOPs"},
};

static const char bench_about[] =
    "Benchmarks of etp against baselines measured in the same run. Each subcommand prints a "
    "table on rank 0: the median time over the iterations (the slowest rank's), bandwidth, "
    "the baseline's bandwidth and the ratio. docs/PERF.md records the numbers.\n"
    "Run it under MPI: mpirun -np N etp-bench SUBCOMMAND [OPTIONS] (as root, add "
    "--allow-run-as-root); one rank a GPU on the CUDA backend where GPUs are, else the host "
    "backend.";

static void usage(FILE *f)
{
    etp_cli_t cli = {.prog = "etp-bench", .args = "SUBCOMMAND [OPTIONS]", .about = bench_about,
                     .tables = {common_opts}, .titles = {common_title}};
    etp_cli_usage(&cli, f);
    fprintf(f, "\nSubcommands (etp-bench SUBCOMMAND --help lists its options):\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "%s%s", cmds[i].about, cmds[i].fn ? "" : " (not built in)");
        etp_cli_item(f, cmds[i].name, text);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    int (*fn)(bench_t *, int, char **) = NULL;
    size_t c = 0;
    while (c < sizeof cmds / sizeof cmds[0] && strcmp(cmd, cmds[c].name) != 0) c++;
    if (c == sizeof cmds / sizeof cmds[0]) {
        fprintf(stderr, "etp-bench: '%s' is not a subcommand (etp-bench --help lists them)\n", cmd);
        return 2;
    }
    fn = cmds[c].fn;
    if (!fn) {
        fprintf(stderr, "etp-bench: '%s' is not built into this etp-bench\n", cmd);
        return 2;
    }
    MPI_Init(&argc, &argv);
    static bench_t b;
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.size);
    /* the subcommand reads its options (argv[0] its name), then starts */
    int rc = fn(&b, argc - 1, argv + 1);
    if (b.ctx) {
        if (b.rank == 0 && rc == 0) {
            printf("etp-bench %s: %d ranks, backend %s, median of %d iterations after %d warm-up\n",
                   cmd, b.size, b.backend == ETP_BACKEND_CUDA ? "cuda" : "host", b.iters, b.warmup);
            print_table(&b);
            if (b.csv && write_csv(&b, b.csv) != 0) rc = 1;
            if (b.json && write_json(&b, b.json) != 0) rc = 1;
        }
        BENCH_CHECK(&b, etp_context_destroy(b.ctx));
    }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); /* every rank exits alike */
    for (int i = 0; i < b.nrows; i++) free(b.rows[i]);
    free(b.rows);
    free(b.gate);
    MPI_Finalize();
    return rc;
}
