/*
 * etp-bench gather: the gather of one sharded BF16 weight (a cold gather:
 * mark_updated, gather, the caller's stream waits) against a plain
 * all-gather of the same bytes on a communicator of its own (ncclAllGather
 * on the CUDA backend, MPI_Allgather on the host backend), interleaved
 * iteration by iteration. Bandwidth is the all-gather bus bandwidth:
 * (n - 1) / n * full bytes / time.
 *
 * Then, unless --no-quant, the same weight with MXFP8 and NVFP4 gathers (the
 * quantized shard cached: the steady state of micro-batches and backward;
 * and with the gathered scales cached too (cache_gathered_scales: the data
 * alone crosses); and quantize + gather after a weight update; and NVFP4 dequantized to
 * BF16 for Hopper), as BF16-equivalent bandwidth against the BF16 gather of
 * the same run: the ratio is how much faster than BF16 the weight arrives.
 *
 *   etp-bench gather [--mib 64,256] [--cols 4096] [--max-ctas N] [--no-quant]
 *   (etp-bench gather --help: each option, from gather_opts below)
 */
#include <stdlib.h>
#include <string.h>

#include "etp_bench.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

typedef struct {
    bench_t *b;
#if ETP_HAVE_CUDA
    ncclComm_t nccl;
#endif
    MPI_Comm mpi;
    void *send, *recv;
    size_t shard_bytes;
    etp_stream_t *s;
} baseline_t;

static void baseline_run(baseline_t *x)
{
#if ETP_HAVE_CUDA
    if (x->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(x->b, etp_stream_get_cuda(x->s, &cs));
        if (ncclAllGather(x->send, x->recv, x->shard_bytes, ncclUint8, x->nccl, cs) != ncclSuccess) {
            fprintf(stderr, "etp-bench: ncclAllGather failed\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        return;
    }
#endif
    BENCH_CHECK(x->b, etp_stream_synchronize(x->s));
    MPI_Allgather(x->send, (int)x->shard_bytes, MPI_BYTE, x->recv, (int)x->shard_bytes, MPI_BYTE,
                  x->mpi);
}

/* One quantized weight [rows, cols]: median microseconds of a gather with the
 * quantized shard cached (update 0) or after a weight update (update 1). */
static double time_quant_gather(bench_t *b, etp_group_t *g, etp_stream_t *s, bench_timer_t *tm,
                                int64_t rows, long cols, etp_param_quant_t q, int dequant,
                                int update, int cache)
{
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.name = "wq";
    pc.group = g;
    pc.rows = rows;
    pc.cols = cols;
    pc.dtype = ETP_DTYPE_BF16;
    pc.alignment = 32;
    pc.quant = q;
    pc.gather_dequantized = dequant;
    pc.cache_gathered_scales = cache;
    etp_param_t *p;
    BENCH_CHECK(b, etp_param_create(b->ctx, &pc, &p));
    etp_param_info_t info = ETP_PARAM_INFO_INIT;
    BENCH_CHECK(b, etp_param_info(p, &info));
    /* 0x3c3c: BF16 1.18, a finite value in every block */
    BENCH_CHECK(b, etp_memset_async(s, info.shard, 0x3c, (size_t)(info.shard_rows * cols) * 2));
    BENCH_CHECK(b, etp_param_mark_updated(p, s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = g;
    cc.depth = 0;
    etp_chain_t *chain;
    BENCH_CHECK(b, etp_chain_create(b->ctx, &cc, &chain));
    BENCH_CHECK(b, etp_chain_add(chain, p));
    BENCH_CHECK(b, etp_chain_finalize(chain));
    double *t = calloc((size_t)b->iters, sizeof(double));
    for (int it = -b->warmup; it < b->iters; it++) {
        etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
        BENCH_CHECK(b, etp_stream_synchronize(s));
        MPI_Barrier(MPI_COMM_WORLD);
        bench_timer_start(tm);
        if (update) BENCH_CHECK(b, etp_param_mark_updated(p, s));
        BENCH_CHECK(b, etp_gather(p, ETP_PASS_FORWARD, s, &v));
        bench_timer_stop(tm);
        BENCH_CHECK(b, etp_release(p, ETP_PASS_FORWARD, s));
        double us = bench_timer_us(tm);
        if (it >= 0) t[it] = us;
    }
    double us = bench_max_over_ranks(bench_median(t, b->iters));
    free(t);
    etp_stream_t *ag, *rs;
    BENCH_CHECK(b, etp_chain_streams(chain, &ag, &rs));
    BENCH_CHECK(b, etp_stream_synchronize(ag));
    BENCH_CHECK(b, etp_stream_synchronize(s));
    BENCH_CHECK(b, etp_chain_destroy(chain));
    BENCH_CHECK(b, etp_param_destroy(p));
    return us;
}

enum { O_MIB, O_COLS, O_MAX_CTAS, O_NO_QUANT };
static const etp_cli_opt_t gather_opts[] = {
    [O_MIB] = {"mib", "LIST", "64,256", "weight sizes in MiB of BF16, comma-separated"},
    [O_COLS] = {"cols", "N", "4096", "columns of the weight"},
    [O_MAX_CTAS] = {"max-ctas", "N", NULL, "the etp group's NCCL CTA cap (default: NCCL's)"},
    [O_NO_QUANT] = {"no-quant", NULL, NULL, "time the BF16 gathers only"},
    {NULL},
};

static const char gather_about[] =
    "The gather of one sharded BF16 weight (mark_updated, gather, the caller's stream waits) "
    "against a plain all-gather of the same bytes on a communicator of its own (ncclAllGather "
    "on CUDA, MPI_Allgather on the host backend), and etp's all-gather collective alone; "
    "bandwidth is the all-gather bus bandwidth. Then the same weight's MXFP8 and NVFP4 gathers "
    "(quantized shard cached; scales cached too; quantize + gather; NVFP4 dequantized to BF16) "
    "in BF16-equivalent bandwidth: the ratio is the speed-up over the BF16 gather.";

int etp_bench_gather(bench_t *b, int argc, char **argv)
{
    char mibs[256] = "";
    long cols = 0;
    int max_ctas = -1, quant = 1;
    etp_cli_t cli = bench_cli(b, "gather", gather_about, gather_opts, argc, argv);
    int key;
    while ((key = bench_next(b, &cli)) >= 0) {
        long v = 0;
        switch (key) {
        case O_MIB:
            if (strlen(cli.arg) >= sizeof mibs) {
                if (b->rank == 0) fprintf(stderr, "etp-bench gather: --mib list too long\n");
                return 2;
            }
            snprintf(mibs, sizeof mibs, "%s", cli.arg);
            {   /* every size now, not half-way through the run */
                char list[sizeof mibs];
                double mib = 0;
                snprintf(list, sizeof list, "%s", cli.arg);
                for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","))
                    if (bench_double(b, cli.opt, tok, 1e-3, 1e7, &mib)) return 2;
            }
            break;
        case O_COLS:
            if (bench_long(b, cli.opt, cli.arg, 1, 1L << 30, &cols)) return 2;
            break;
        case O_MAX_CTAS:
            if (bench_long(b, cli.opt, cli.arg, -1, 1 << 20, &v)) return 2;
            max_ctas = (int)v;
            break;
        case O_NO_QUANT:
            quant = 0;
            break;
        }
    }
    if (key != ETP_CLI_END) return bench_stop(key);
    bench_start(b);
    etp_group_t *world, *g;
    BENCH_CHECK(b, etp_context_world(b->ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "etp";
    gc.num_roles = 2;
    gc.max_ctas = max_ctas;
    BENCH_CHECK(b, etp_group_split(world, 0, b->rank, &gc, &g));
    etp_stream_t *main_s;
    BENCH_CHECK(b, etp_stream_create(b->ctx, ETP_STREAM_PRIORITY_NORMAL, &main_s));

    baseline_t base = {.b = b, .s = main_s};
    MPI_Comm_dup(MPI_COMM_WORLD, &base.mpi);
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA) {
        ncclUniqueId id;
        if (b->rank == 0) BENCH_CUDA(b, ncclGetUniqueId(&id));
        MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        int dev = 0;
        BENCH_CHECK(b, etp_context_cuda_device(b->ctx, &dev));
        BENCH_CUDA(b, cudaSetDevice(dev));
        if (ncclCommInitRank(&base.nccl, b->size, id, b->rank) != ncclSuccess) {
            fprintf(stderr, "etp-bench: ncclCommInitRank failed\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
#endif
    bench_timer_t *tm = bench_timer_create(b, main_s);
    for (char *tok = strtok(mibs, ","); tok; tok = strtok(NULL, ",")) {
        double mib = 0;
        if (bench_double(b, "--mib", tok, 1e-3, 1e7, &mib)) return 2;
        int64_t rows = (int64_t)(mib * 1048576.0 / 2.0 / (double)cols);
        rows = (rows + b->size - 1) / b->size * b->size;
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.name = "w";
        pc.group = g;
        pc.rows = rows;
        pc.cols = cols;
        pc.dtype = ETP_DTYPE_BF16;
        etp_param_t *p;
        BENCH_CHECK(b, etp_param_create(b->ctx, &pc, &p));
        etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
        cc.group = g;
        cc.depth = 0;
        etp_chain_t *chain;
        BENCH_CHECK(b, etp_chain_create(b->ctx, &cc, &chain));
        BENCH_CHECK(b, etp_chain_add(chain, p));
        BENCH_CHECK(b, etp_chain_finalize(chain));
        double full = (double)rows * (double)cols * 2.0;
        base.shard_bytes = (size_t)(full / b->size);
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, base.shard_bytes, ETP_MEM_WORKSPACE, &base.send));
        BENCH_CHECK(b, etp_mem_alloc(b->ctx, (size_t)full, ETP_MEM_WORKSPACE, &base.recv));
        BENCH_CHECK(b, etp_memset_async(main_s, base.send, 1, base.shard_bytes));

        double *t_etp = calloc((size_t)b->iters, sizeof(double));
        double *t_base = calloc((size_t)b->iters, sizeof(double));
        double *t_coll = calloc((size_t)b->iters, sizeof(double));
        for (int it = -b->warmup; it < b->iters; it++) {
            etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
            MPI_Barrier(MPI_COMM_WORLD);
            bench_timer_start(tm);
            baseline_run(&base);
            bench_timer_stop(tm);
            double us_base = bench_timer_us(tm);
            MPI_Barrier(MPI_COMM_WORLD);
            bench_timer_start(tm);
            BENCH_CHECK(b, etp_param_mark_updated(p, main_s));
            BENCH_CHECK(b, etp_gather(p, ETP_PASS_FORWARD, main_s, &v));
            bench_timer_stop(tm);
            BENCH_CHECK(b, etp_release(p, ETP_PASS_FORWARD, main_s));
            double us_etp = bench_timer_us(tm);
            /* etp's collective alone, on the same group: what the gather adds */
            MPI_Barrier(MPI_COMM_WORLD);
            bench_timer_start(tm);
            BENCH_CHECK(b, etp_allgather(g, 0, base.send, base.recv, base.shard_bytes, ETP_DTYPE_U8, main_s));
            bench_timer_stop(tm);
            double us_coll = bench_timer_us(tm);
            if (it >= 0) {
                t_base[it] = us_base;
                t_etp[it] = us_etp;
                t_coll[it] = us_coll;
            }
        }
        double us_base = bench_max_over_ranks(bench_median(t_base, b->iters));
        double us_etp = bench_max_over_ranks(bench_median(t_etp, b->iters));
        double bus = full * (double)(b->size - 1) / (double)b->size;
        char shape[96];
        snprintf(shape, sizeof shape, "[%lld, %ld] bf16 (%.0f MiB)", (long long)rows, cols, mib);
        bench_row_t *rb = bench_add(b, b->backend == ETP_BACKEND_CUDA ? "ncclAllGather" : "MPI_Allgather",
                                    shape, bus, us_base, 0);
        double us_coll = bench_max_over_ranks(bench_median(t_coll, b->iters));
        bench_add(b, "etp_allgather (collective)", shape, bus, us_coll, rb->gbps);
        bench_row_t *re = bench_add(b, "etp_gather (cold, bf16)", shape, bus, us_etp, rb->gbps);
        if (quant && rows % (32 * b->size) == 0 && cols % 32 == 0) {
            const struct {
                const char *name;
                etp_param_quant_t q;
                int dequant, update, cache;
            } qv[] = {
                {"etp_gather mxfp8 (cached)", ETP_PARAM_QUANT_MXFP8, 0, 0, 0},
                {"etp_gather nvfp4 (cached)", ETP_PARAM_QUANT_NVFP4, 0, 0, 0},
                {"etp_gather mxfp8 (cached+scales)", ETP_PARAM_QUANT_MXFP8, 0, 0, 1},
                {"etp_gather nvfp4 (cached+scales)", ETP_PARAM_QUANT_NVFP4, 0, 0, 1},
                {"etp_gather mxfp8 (quantize+gather)", ETP_PARAM_QUANT_MXFP8, 0, 1, 0},
                {"etp_gather nvfp4 (quantize+gather)", ETP_PARAM_QUANT_NVFP4, 0, 1, 0},
                {"etp_gather nvfp4->bf16 (cached)", ETP_PARAM_QUANT_NVFP4, 1, 0, 0},
            };
            /* bandwidth in BF16-equivalent bytes: ratio = speed-up over BF16 */
            for (size_t k = 0; k < sizeof qv / sizeof qv[0]; k++) {
                double us_q = time_quant_gather(b, g, main_s, tm, rows, cols, qv[k].q, qv[k].dequant,
                                                qv[k].update, qv[k].cache);
                bench_add(b, qv[k].name, shape, bus, us_q, re->gbps);
            }
        }
        free(t_coll);
        free(t_etp);
        free(t_base);
        etp_stream_t *ag, *rs;
        BENCH_CHECK(b, etp_chain_streams(chain, &ag, &rs));
        BENCH_CHECK(b, etp_stream_synchronize(ag));
        BENCH_CHECK(b, etp_stream_synchronize(main_s));
        BENCH_CHECK(b, etp_chain_destroy(chain));
        BENCH_CHECK(b, etp_param_destroy(p));
        BENCH_CHECK(b, etp_mem_free(b->ctx, base.send));
        BENCH_CHECK(b, etp_mem_free(b->ctx, base.recv));
    }
    bench_timer_destroy(tm);
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA) BENCH_CUDA(b, ncclCommDestroy(base.nccl));
#endif
    MPI_Comm_free(&base.mpi);
    BENCH_CHECK(b, etp_stream_destroy(main_s));
    BENCH_CHECK(b, etp_group_destroy(g));
    return 0;
}
