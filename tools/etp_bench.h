/* etp-bench: shared scaffolding of the benchmark subcommands. */
#ifndef ETP_BENCH_H
#define ETP_BENCH_H

#include <mpi.h>
#include <stdio.h>

#include "etp/etp.h"
#include "etp/mpi.h"
#include "etp_cli.h"

typedef struct bench_row {
    char name[64];    /* what was timed */
    char shape[96];   /* sizes, free text */
    double bytes;     /* bytes the bandwidth is computed over */
    double us;        /* median time, microseconds */
    double gbps;      /* bytes / time, GB/s (1e9) */
    double base_gbps; /* the baseline measured in the same run, or 0 */
    double ratio;     /* gbps / base_gbps, or 0 */
} bench_row_t;

typedef struct bench {
    int rank, size;
    etp_context_t *ctx; /* bench_start() makes it, after the options */
    etp_backend_t backend;
    int warmup, iters;
    const char *csv, *json; /* files to write the table to, or NULL */
    char prog[48];          /* "etp-bench gather", for messages */
    bench_row_t **rows; /* grown as rows are added; each row stays where it is */
    int nrows, cap_rows;
    void *gate;        /* bench_hold's flag (made at the first hold) */
    int held;          /* a stream is held until bench_release */
} bench_t;

#define BENCH_CHECK(b, expr)                                                                \
    do {                                                                                    \
        etp_status_t st_ = (expr);                                                          \
        if (st_ != ETP_SUCCESS) {                                                           \
            fprintf(stderr, "etp-bench rank %d: %s: %s: %s\n", (b)->rank, #expr,            \
                    etp_status_string(st_), etp_last_error());                              \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                   \
        }                                                                                   \
    } while (0)

/* A CUDA runtime or NCCL call (both return 0 on success) that must not
 * fail: a bench whose events or launches failed would print wrong times. */
#define BENCH_CUDA(b, expr)                                                                 \
    do {                                                                                    \
        int e_ = (int)(expr);                                                               \
        if (e_ != 0) {                                                                      \
            fprintf(stderr, "etp-bench rank %d: %s failed (error %d)\n", (b)->rank, #expr, e_); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                   \
        }                                                                                   \
    } while (0)

/* A timer over an etp stream: CUDA events on the CUDA backend, the wall
 * clock around a synchronized region on the host backend. */
typedef struct bench_timer bench_timer_t;
bench_timer_t *bench_timer_create(bench_t *b, etp_stream_t *s);
void bench_timer_start(bench_timer_t *t);
void bench_timer_stop(bench_timer_t *t);
/* Hold stream s until the next bench_release (CUDA: a host function that
 * waits for it; nothing on the host backend), so that the region timed in
 * between is enqueued while the device waits: its events then time the
 * device's work, not the host's enqueueing, as in a training step enqueued
 * ahead of the device. bench_release (called by bench_timer_stop and the
 * EP phase timer, before they wait) lets every rank's stream go at once,
 * after a barrier. Collective: every rank holds and releases alike. Not
 * for regions that wait for their stream on the host (the hold gives up
 * after 10 s). */
void bench_hold(bench_t *b, etp_stream_t *s);
void bench_release(bench_t *b);
/* Microseconds between the last start and stop (synchronizes). */
double bench_timer_us(bench_timer_t *t);
void bench_timer_destroy(bench_timer_t *t);

/* Marks 0 .. n-1 on one stream, for back-to-back regions timed in one
 * go (CUDA events; on the host backend the wall clock after a stream
 * synchronization at each mark). bench_seq_us synchronizes (and releases
 * a hold first) and gives the microseconds between marks a and z. */
typedef struct bench_seq bench_seq_t;
bench_seq_t *bench_seq_create(bench_t *b, etp_stream_t *s, int n);
void bench_seq_mark(bench_seq_t *q, int i);
double bench_seq_us(bench_seq_t *q, int a, int z);
void bench_seq_destroy(bench_seq_t *q);

/* The median of n values (reorders v). Max over ranks of the median. */
double bench_median(double *v, int n);
double bench_max_over_ranks(double x);

/* A row of the table; the pointer stays valid until the program ends (rows
 * added after it do not move it). */
bench_row_t *bench_add(bench_t *b, const char *name, const char *shape, double bytes, double us,
                       double base_gbps);

/* Option values, whole or refused: s must be a number in [lo, hi] with
 * nothing after it. 0 with *out set, or -1 after a message naming opt (on
 * rank 0). */
int bench_long(const bench_t *b, const char *opt, const char *s, long lo, long hi, long *out);
int bench_double(const bench_t *b, const char *opt, const char *s, double lo, double hi, double *out);

/* A subcommand's options: its table (tools/etp_cli.h) and the options every
 * subcommand takes (--iters, --warmup, --csv, --json), parsed together, the
 * usage (--help) made from both. A subcommand reads them with
 *
 *   etp_cli_t cli = bench_cli(b, "gather", about, opts, argc, argv);
 *   int k;
 *   while ((k = bench_next(b, &cli)) >= 0)
 *       switch (k) { ... cli.opt, cli.arg ...; on a bad value: return 2 }
 *   if (k != ETP_CLI_END) return bench_stop(k);
 *   bench_start(b);
 *
 * argv[0] is the subcommand's name (main passes argv + 1). */
etp_cli_t bench_cli(bench_t *b, const char *sub, const char *about, const etp_cli_opt_t *opts,
                    int argc, char **argv);
/* The next option of the subcommand's table (its index); the common ones are
 * taken here. ETP_CLI_END when all are read; ETP_CLI_HELP or ETP_CLI_ERROR
 * otherwise (the usage or a message printed on rank 0). */
int bench_next(bench_t *b, etp_cli_t *cli);
/* What the subcommand returns for ETP_CLI_HELP (0) or ETP_CLI_ERROR (2). */
int bench_stop(int k);
/* Create the context (b->ctx, b->backend), once the options are read. */
void bench_start(bench_t *b);

/* Subcommands: each in its own file; a missing one is reported, not linked. */
int etp_bench_gather(bench_t *b, int argc, char **argv);
int etp_bench_chain(bench_t *b, int argc, char **argv);
int etp_bench_quant(bench_t *b, int argc, char **argv) __attribute__((weak));
int etp_bench_ep(bench_t *b, int argc, char **argv) __attribute__((weak));
int etp_bench_layer(bench_t *b, int argc, char **argv) __attribute__((weak));

#endif
