/*
 * etp-demo: a short multi-rank run of etp's collectives, the way extended
 * tensor parallelism uses them, until etp-train exists.
 *
 * The world is split into ETP groups (consecutive pairs of ranks, with two
 * roles: an all-gather stream and a reduce-scatter stream) and DP groups
 * (the ranks with the same place in their ETP group). Each step every rank
 * all-gathers a sharded weight on the AG stream, "uses" it on the main stream
 * after an event, reduce-scatters a gradient on the RS stream, all-reduces
 * the shard gradient across its DP group, and checks every number against
 * values computed on the host. Uses the public API only.
 *
 *   mpirun -np 4 etp-demo [--steps N] [--rows R] [--cols C]
 *   etp-demo --env        list the environment settings
 *   etp-demo --help       the options (made from the table below)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etp/etp.h"
#include "etp/mpi.h"
#include "etp_cli.h"

#define CHECK(expr)                                                                        \
    do {                                                                                   \
        etp_status_t st_ = (expr);                                                         \
        if (st_ != ETP_SUCCESS) {                                                          \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #expr,                   \
                    etp_status_string(st_), etp_last_error());                             \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)

enum { O_STEPS, O_ROWS, O_COLS, O_ENV };
static const etp_cli_opt_t demo_opts[] = {
    [O_STEPS] = {"steps", "N", "5", "steps to run"},
    [O_ROWS] = {"rows", "R", "4096",
                "rows of the weight (rounded up to a multiple of the ETP group's size)"},
    [O_COLS] = {"cols", "C", "1024", "columns of the weight"},
    [O_ENV] = {"env", NULL, NULL, "list the environment settings etp reads, and exit"},
    {NULL},
};

static const char demo_about[] =
    "A short multi-rank run of etp's collectives, the way extended tensor parallelism uses them: "
    "ETP groups of two ranks all-gather a sharded FP32 weight and reduce-scatter its gradient, "
    "DP groups all-reduce the shards, and every number is checked against values computed on "
    "the host. Backend AUTO: one rank a GPU on the CUDA backend where GPUs are, else the host "
    "backend. Exit status 0 when every number is right.\n"
    "Run it under MPI: mpirun -np 4 etp-demo (as root, add --allow-run-as-root).";

/* Weight element (r, c) at step s: small integers, exact in FP32 sums. */
static float weight(int s, size_t r, size_t c)
{
    return (float)((int)((r * 31 + c * 7 + (size_t)s * 3) % 17) - 8);
}

static float grad(int world_rank, int s, size_t i)
{
    return (float)((int)((i * 13 + (size_t)world_rank * 5 + (size_t)s) % 11) - 5);
}

int main(int argc, char **argv)
{
    int rank = 0, size = 1, steps = 0, env = 0;
    size_t rows = 0, cols = 0;
    /* before MPI: --help and --env need no MPI job */
    etp_cli_t cli = {.prog = "etp-demo", .about = demo_about, .tables = {demo_opts},
                     .argc = argc, .argv = argv};
    int k;
    while ((k = etp_cli_next(&cli)) >= 0) {
        long v = 0;
        switch (ETP_CLI_INDEX(k)) {
        case O_STEPS:
            if (etp_cli_long(cli.prog, 0, cli.opt, cli.arg, 1, 1000000, &v)) return 2;
            steps = (int)v;
            break;
        case O_ROWS:
            if (etp_cli_long(cli.prog, 0, cli.opt, cli.arg, 1, 1L << 24, &v)) return 2;
            rows = (size_t)v;
            break;
        case O_COLS:
            if (etp_cli_long(cli.prog, 0, cli.opt, cli.arg, 1, 1L << 24, &v)) return 2;
            cols = (size_t)v;
            break;
        case O_ENV:
            env = 1;
            break;
        }
    }
    if (k != ETP_CLI_END) return k == ETP_CLI_HELP ? 0 : 2;
    if (env) {
        const char *name, *def, *doc;
        for (int i = 0; etp_env_setting(i, &name, &def, &doc) == ETP_SUCCESS; i++)
            printf("%-24s default %-6s %s\n", name, def, doc);
        return 0;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    etp_context_t *ctx;
    CHECK(etp_context_create_mpi(MPI_COMM_WORLD, NULL, &ctx));
    etp_backend_t backend;
    CHECK(etp_context_backend(ctx, &backend));
    etp_group_t *world, *etp_g, *dp_g;
    CHECK(etp_context_world(ctx, &world));
    int etp_size = size >= 2 ? 2 : 1;
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "etp";
    gc.num_roles = 2; /* role 0: all-gather stream, role 1: reduce-scatter stream */
    CHECK(etp_group_split(world, rank / etp_size, rank, &gc, &etp_g));
    gc.name = "dp";
    gc.num_roles = 1;
    CHECK(etp_group_split(world, rank % etp_size, rank, &gc, &dp_g));
    int er, es, dr, ds;
    CHECK(etp_group_rank(etp_g, &er));
    CHECK(etp_group_size(etp_g, &es));
    CHECK(etp_group_rank(dp_g, &dr));
    CHECK(etp_group_size(dp_g, &ds));

    rows = (rows + (size_t)es - 1) / (size_t)es * (size_t)es;
    size_t shard_rows = rows / (size_t)es, full = rows * cols, shard = shard_rows * cols;
    float *d_shard, *d_full, *d_wgrad, *d_gshard, *h = malloc(full * sizeof(float));
    CHECK(etp_mem_alloc(ctx, shard * sizeof(float), ETP_MEM_SHARDS, (void **)&d_shard));
    CHECK(etp_mem_alloc(ctx, full * sizeof(float), ETP_MEM_GATHER_SLOTS, (void **)&d_full));
    CHECK(etp_mem_alloc(ctx, full * sizeof(float), ETP_MEM_WGRAD_RING, (void **)&d_wgrad));
    CHECK(etp_mem_alloc(ctx, shard * sizeof(float), ETP_MEM_MAIN_GRAD, (void **)&d_gshard));

    etp_stream_t *main_s, *ag_s, *rs_s;
    etp_event_t *gathered, *grad_ready, *reduced;
    CHECK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &main_s));
    CHECK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_HIGH, &ag_s));
    CHECK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_HIGH, &rs_s));
    CHECK(etp_event_create(ctx, &gathered));
    CHECK(etp_event_create(ctx, &grad_ready));
    CHECK(etp_event_create(ctx, &reduced));

    long bad = 0;
    double t0 = MPI_Wtime();
    for (int s = 0; s < steps; s++) {
        /* this rank's shard of the weight, written on the main stream */
        for (size_t r = 0; r < shard_rows; r++)
            for (size_t c = 0; c < cols; c++)
                h[r * cols + c] = weight(s, (size_t)er * shard_rows + r, c);
        CHECK(etp_memcpy_async(main_s, d_shard, h, shard * sizeof(float)));
        CHECK(etp_stream_synchronize(main_s));
        /* gather on the AG stream, consume on the main stream after the event */
        CHECK(etp_allgather(etp_g, 0, d_shard, d_full, shard, ETP_DTYPE_F32, ag_s));
        CHECK(etp_event_record(gathered, ag_s));
        CHECK(etp_stream_wait_event(main_s, gathered));
        CHECK(etp_memcpy_async(main_s, h, d_full, full * sizeof(float)));
        CHECK(etp_stream_synchronize(main_s));
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) bad += h[r * cols + c] != weight(s, r, c);
        /* a weight gradient, reduce-scattered in the ETP group on the RS stream,
         * then all-reduced over the DP group on the same stream */
        for (size_t i = 0; i < full; i++) h[i] = grad(rank, s, i);
        CHECK(etp_memcpy_async(main_s, d_wgrad, h, full * sizeof(float)));
        CHECK(etp_event_record(grad_ready, main_s));
        CHECK(etp_stream_wait_event(rs_s, grad_ready));
        CHECK(etp_reduce_scatter(etp_g, 1, d_wgrad, d_gshard, shard, ETP_DTYPE_F32, ETP_REDOP_SUM, rs_s));
        CHECK(etp_allreduce(dp_g, 0, d_gshard, d_gshard, shard, ETP_DTYPE_F32, ETP_REDOP_SUM, rs_s));
        CHECK(etp_event_record(reduced, rs_s));
        CHECK(etp_stream_wait_event(main_s, reduced));
        CHECK(etp_memcpy_async(main_s, h, d_gshard, shard * sizeof(float)));
        CHECK(etp_stream_synchronize(main_s));
        /* every rank of the world contributes exactly once to each element */
        for (size_t i = 0; i < shard; i++) {
            float want = 0;
            for (int w = 0; w < size; w++) want += grad(w, s, (size_t)er * shard + i);
            bad += h[i] != want;
        }
    }
    double secs = MPI_Wtime() - t0;
    long bad_all = 0;
    MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);

    etp_memory_report_t rep = ETP_MEMORY_REPORT_INIT;
    CHECK(etp_memory_report(ctx, &rep));
    if (rank == 0) {
        printf("etp-demo: %d ranks, backend %s, ETP groups of %d, DP groups of %d\n", size,
               backend == ETP_BACKEND_CUDA ? "cuda" : "host", es, ds);
        printf("  weight %zu x %zu fp32 (%.1f MB), %d steps in %.3f s\n", rows, cols,
               (double)full * 4 / 1e6, steps, secs);
        printf("  memory on rank 0:");
        for (int o = 0; o < ETP_MEM_OWNER_COUNT; o++)
            if (rep.bytes[o]) printf(" %s %.1f MB", etp_mem_owner_name((etp_mem_owner_t)o), (double)rep.bytes[o] / 1e6);
        printf("\n  result: %s (%ld wrong elements over all ranks)\n", bad_all ? "WRONG" : "OK", bad_all);
    }
    CHECK(etp_event_destroy(gathered));
    CHECK(etp_event_destroy(grad_ready));
    CHECK(etp_event_destroy(reduced));
    CHECK(etp_stream_destroy(main_s));
    CHECK(etp_stream_destroy(ag_s));
    CHECK(etp_stream_destroy(rs_s));
    CHECK(etp_mem_free(ctx, d_shard));
    CHECK(etp_mem_free(ctx, d_full));
    CHECK(etp_mem_free(ctx, d_wgrad));
    CHECK(etp_mem_free(ctx, d_gshard));
    CHECK(etp_group_destroy(etp_g));
    CHECK(etp_group_destroy(dp_g));
    CHECK(etp_context_destroy(ctx));
    free(h);
    MPI_Finalize();
    return bad_all ? 1 : 0;
}
