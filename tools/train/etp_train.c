/*
 * etp-train: train a mixture-of-experts model with etp (docs/TRAINING.md).
 *
 *   mpirun -np 4 etp-train [--backend host] [--steps 200] [--check] [...]
 *   (etp-train --help: every option, from the table below)
 *
 * The model and data are train_model.h's; model.c builds it on etp;
 * reference.c is the same model on one process without etp (--check).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etp/etp.h"
#include "etp/gemm.h"
#include "etp/mpi.h"
#include "etp_cli.h"
#include "model.h"
#include "reference.h"
#include "train_report.h"

#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

enum {
    O_BACKEND, O_LAYERS, O_HIDDEN, O_FFN, O_EXPERTS, O_TOPK, O_TOKENS, O_TOKENS_STEP, O_STEPS,
    O_SEED, O_ETP, O_EP, O_DP, O_QUANT, O_TRANSPORT, O_GRAPH, O_RESIDENT, O_CHECK, O_SAVE,
    O_LOAD, O_CSV, O_SVG, O_LR, O_POOL, O_CAPACITY, O_WIRE, O_DEPTH, O_KEEP, O_EVERY, O_WARMUP,
    O_QUIET, O_MIN_FALL
};

static const etp_cli_opt_t opts[] = {
    [O_BACKEND] = {"backend", "host|cuda", NULL, "the etp backend (default: cuda when a GPU is "
                                                 "present, else host)"},
    [O_LAYERS] = {"layers", "N", NULL, "layers (default 4)"},
    [O_HIDDEN] = {"hidden", "H", NULL, "hidden size (default: host 32, cuda 4096)"},
    [O_FFN] = {"ffn", "F", NULL, "expert FFN size (default: host 64, cuda 4096)"},
    [O_EXPERTS] = {"experts", "E", NULL, "experts (default: host 8, cuda 64)"},
    [O_TOPK] = {"topk", "K", NULL, "experts per token (default: host 2, cuda 8)"},
    [O_TOKENS] = {"tokens", "T", NULL, "tokens per rank (default: host 32, cuda 8192)"},
    [O_TOKENS_STEP] = {"tokens-step", "D", "0",
                       "rank r has T - (r % 3) * D tokens (different T per rank)"},
    [O_STEPS] = {"steps", "N", "200", "training steps"},
    [O_SEED] = {"seed", "S", "1", "seed of the weights, the teacher and the data"},
    [O_ETP] = {"etp", "N", NULL, "ETP group size (weights sharded over it)"},
    [O_EP] = {"ep", "N", NULL, "EP group size (experts spread over it)"},
    [O_DP] = {"dp", "N", "1", "data-parallel replicas (etp x ep x dp = ranks; by default etp "
                              "is 2 where the ranks allow it and ep takes the rest)"},
    [O_QUANT] = {"quant", "none|mxfp8|nvfp4", "none",
                 "weights cross the wire quantized; the GEMMs read them dequantized to BF16"},
    [O_TRANSPORT] = {"transport", "exact|capacity|nvlink", NULL,
                     "the EP transport (default: capacity with --graph, else exact); capacity "
                     "and nvlink keep the counts on the device (FIXED_SLOTS layouts), nvlink "
                     "drops as exact does"},
    [O_GRAPH] = {"graph", NULL, NULL,
                 "capture the forward and backward of the whole layer stack in one CUDA graph "
                 "after the warm-up steps and replay it every step (capacity or nvlink "
                 "transport)"},
    [O_RESIDENT] = {"resident", NULL, NULL,
                    "every weight whole on every rank, no gathers, the same gradient reductions: "
                    "the baseline the overlap is measured against"},
    [O_CHECK] = {"check", NULL, NULL,
                 "also run the model on one process with a reference written without etp and "
                 "compare the first step's gradients and the first 5 losses"},
    [O_SAVE] = {"save", "DIR", NULL, "write a checkpoint at the end"},
    [O_LOAD] = {"load", "DIR", NULL, "start from a checkpoint (any etp/ep/dp split)"},
    [O_CSV] = {"csv", "FILE", NULL, "one row per step"},
    [O_SVG] = {"svg", "FILE", NULL, "the loss curve and the step-time breakdown, as SVG"},
    [O_LR] = {"lr", "X", NULL,
              "Adam's learning rate (default 0.05 / sqrt(hidden): a step moves each weight "
              "by about the rate, and the weights' scale is 1 / sqrt(fan-in))"},
    [O_POOL] = {"pool", "N", "4", "batches of data, used in turn"},
    [O_CAPACITY] = {"capacity", "X", NULL,
                    "EP rows as a multiple of the mean load; 0: enough that no slot can be "
                    "dropped (default: 0 on the host backend and with --check, else 1.5)"},
    [O_WIRE] = {"wire", "f32|bf16", "f32",
                "the dtype of EP combine's per-rank partials on the wire (combine_wire)"},
    [O_DEPTH] = {"depth", "N", "1", "the chain's prefetch depth"},
    [O_KEEP] = {"keep", "GIB|all", "0",
                "GiB of forward-gathered weights the chain keeps for the backward pass, which "
                "then gathers them no more (keep_bytes; the last layers' first; not with "
                "--quant or --resident): the memory of whole weights for fewer gathers"},
    [O_EVERY] = {"every", "N", NULL, "a progress line every N steps (default: steps / 10)"},
    [O_WARMUP] = {"warmup", "N", "2", "eager steps before the capture (--graph)"},
    [O_QUIET] = {"quiet", NULL, NULL, "only the summary"},
    [O_MIN_FALL] = {"min-fall", "X", NULL,
                    "exit 1 unless the loss fell at least X-fold (first step's over the last's)"},
    {NULL},
};

static const char about[] =
    "Train a mixture-of-experts model with etp: L layers, each a dense projection [H, H] and an "
    "MoE FFN (router [E, H], softmax top-k, EP dispatch, per expert W1 [F, H], SiLU, W2 [H, F], "
    "EP combine), residuals around both; weights sharded by ETP and gathered through a "
    "prefetching chain, tokens routed by EP, GEMMs on etp/gemm.h, Adam on FP32 masters. The "
    "task: regress a random teacher of the same shape. Ranks form a grid dp x ep x etp (etp "
    "fastest). docs/TRAINING.md explains the model and the code.";

typedef struct run {
    train_opts_t o;
    int steps, check, quiet, every, warmup, ranks, rank;
    const char *backend, *save, *load, *csv, *svg;
    long hidden, ffn, experts, topk, tokens, layers;
    double min_fall;
} run_t;

static int parse(run_t *r, int argc, char **argv)
{
    etp_cli_t cli = {.prog = "etp-train", .about = about, .tables = {opts}, .argc = argc,
                     .argv = argv, .quiet = r->rank != 0};
    int k;
    long v;
    double d;
    train_shape_t *sh = &r->o.shape;
    while ((k = etp_cli_next(&cli)) >= 0) {
        int bad = 0;
        const char *a = cli.arg;
        switch (ETP_CLI_INDEX(k)) {
        case O_BACKEND:
            if (strcmp(a, "host") && strcmp(a, "cuda"))
                return etp_cli_fail(&cli, "--backend: host or cuda, not '%s'", a);
            r->backend = a;
            break;
        case O_LAYERS: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1024, &r->layers); break;
        case O_HIDDEN: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 32, 1L << 16, &r->hidden); break;
        case O_FFN: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 32, 1L << 16, &r->ffn); break;
        case O_EXPERTS: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1024, &r->experts); break;
        case O_TOPK: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 64, &r->topk); break;
        case O_TOKENS: bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1L << 22, &r->tokens); break;
        case O_TOKENS_STEP:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 0, 1L << 20, &v);
            sh->tokens_step = v;
            break;
        case O_STEPS:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1L << 30, &v);
            r->steps = (int)v;
            break;
        case O_SEED:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 0, 1L << 62, &v);
            sh->seed = (uint64_t)v;
            break;
        case O_ETP:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1 << 20, &v);
            r->o.etp = (int)v;
            break;
        case O_EP:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1 << 20, &v);
            r->o.ep = (int)v;
            break;
        case O_DP:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1 << 20, &v);
            r->o.dp = (int)v;
            break;
        case O_QUANT:
            if (!strcmp(a, "none")) sh->quant = TRAIN_QUANT_NONE;
            else if (!strcmp(a, "mxfp8")) sh->quant = TRAIN_QUANT_MXFP8;
            else if (!strcmp(a, "nvfp4")) sh->quant = TRAIN_QUANT_NVFP4;
            else return etp_cli_fail(&cli, "--quant: none, mxfp8 or nvfp4, not '%s'", a);
            break;
        case O_TRANSPORT:
            if (!strcmp(a, "exact")) r->o.transport = ETP_EP_TRANSPORT_EXACT;
            else if (!strcmp(a, "capacity")) r->o.transport = ETP_EP_TRANSPORT_CAPACITY;
            else if (!strcmp(a, "nvlink")) r->o.transport = ETP_EP_TRANSPORT_NVLINK;
            else return etp_cli_fail(&cli, "--transport: exact, capacity or nvlink, not '%s'", a);
            break;
        case O_WIRE:
            if (!strcmp(a, "f32")) r->o.combine_wire = ETP_DTYPE_F32;
            else if (!strcmp(a, "bf16")) r->o.combine_wire = ETP_DTYPE_BF16;
            else return etp_cli_fail(&cli, "--wire: f32 or bf16, not '%s'", a);
            break;
        case O_GRAPH: r->o.graph = 1; break;
        case O_RESIDENT: r->o.resident = 1; break;
        case O_CHECK: r->check = 1; break;
        case O_SAVE: r->save = a; break;
        case O_LOAD: r->load = a; break;
        case O_CSV: r->csv = a; break;
        case O_SVG: r->svg = a; break;
        case O_LR:
            bad = etp_cli_double(cli.prog, cli.quiet, cli.opt, a, 0.0, 1.0, &d);
            sh->lr = (float)d;
            break;
        case O_POOL:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1024, &v);
            sh->pool = (int)v;
            break;
        case O_CAPACITY: bad = etp_cli_double(cli.prog, cli.quiet, cli.opt, a, 0.0, 1e6, &r->o.capacity); break;
        case O_DEPTH:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 0, 64, &v);
            r->o.depth = (int)v;
            break;
        case O_KEEP:
            if (!strcmp(a, "all")) {
                r->o.keep_bytes = SIZE_MAX;
            } else {
                double gib = 0;
                bad = etp_cli_double(cli.prog, cli.quiet, cli.opt, a, 0.0, 1e6, &gib);
                r->o.keep_bytes = (size_t)(gib * 1073741824.0);
            }
            break;
        case O_EVERY:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 1, 1L << 30, &v);
            r->every = (int)v;
            break;
        case O_WARMUP:
            bad = etp_cli_long(cli.prog, cli.quiet, cli.opt, a, 0, 1 << 20, &v);
            r->warmup = (int)v;
            break;
        case O_QUIET: r->quiet = 1; break;
        case O_MIN_FALL: bad = etp_cli_double(cli.prog, cli.quiet, cli.opt, a, 1.0, 1e30, &r->min_fall); break;
        }
        if (bad) return ETP_CLI_ERROR;
    }
    if (k != ETP_CLI_END) return k;
    if (r->check && r->load) return etp_cli_fail(&cli, "--check starts from the seed: not with --load");
    return 0;
}

/* Sizes the options left open: per backend, and the grid. */
static int complete(run_t *r, etp_backend_t backend)
{
    const int gpu = backend == ETP_BACKEND_CUDA;
    train_shape_t *sh = &r->o.shape;
    sh->layers = (int)(r->layers ? r->layers : 4);
    sh->hidden = r->hidden ? r->hidden : gpu ? 4096 : 32;
    sh->ffn = r->ffn ? r->ffn : gpu ? 4096 : 64;
    sh->experts = (int)(r->experts ? r->experts : gpu ? 64 : 8);
    sh->topk = (int)(r->topk ? r->topk : gpu ? 8 : 2);
    sh->tokens = r->tokens ? r->tokens : gpu ? 8192 : 32;
    train_opts_t *o = &r->o;
    if (o->dp < 1) o->dp = 1;
    if (!o->etp && !o->ep) {
        int rest = r->ranks / o->dp;
        o->etp = rest % 2 == 0 ? 2 : 1;
        o->ep = rest / o->etp;
    } else if (!o->etp) {
        o->etp = r->ranks / (o->ep * o->dp);
    } else if (!o->ep) {
        o->ep = r->ranks / (o->etp * o->dp);
    }
    sh->ep = o->ep;
    const float lr = sh->lr;
    train_adam_defaults(sh);
    if (lr >= 0) sh->lr = lr;
    if (o->capacity < 0) o->capacity = gpu && !r->check ? 1.5 : 0;
    if (o->transport == (etp_ep_transport_t)-1)
        o->transport = o->graph ? ETP_EP_TRANSPORT_CAPACITY : ETP_EP_TRANSPORT_EXACT;
    char why[256];
    if (model_check_opts(o, r->ranks, why, sizeof why) != ETP_SUCCESS) {
        if (r->rank == 0) fprintf(stderr, "etp-train: %s\n", why);
        return 2;
    }
    if (r->every <= 0) r->every = r->steps >= 10 ? r->steps / 10 : 1;
    return 0;
}

static const char *transport_name(etp_ep_transport_t t)
{
    return t == ETP_EP_TRANSPORT_EXACT      ? "exact"
           : t == ETP_EP_TRANSPORT_CAPACITY ? "capacity"
                                            : "nvlink";
}

/* ---- the check --------------------------------------------------------------- */

typedef struct check {
    ref_model_t *ref;
    double tol_grad, tol_loss, worst;
    int failed;
} check_t;

/* The largest |etp - reference| of this rank's shard of every weight
 * gradient, over the largest |reference| of the whole tensor. */
static int check_grads(run_t *r, train_model_t *m, check_t *c)
{
    const train_shape_t *sh = &r->o.shape;
    float *buf = malloc(model_max_shard_bytes(m));
    if (!buf) return -1;
    double worst = 0;
    for (int l = 0; l < sh->layers; l++)
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            int64_t e0, ne, r0, valid, srows, E, R, C;
            if (model_grad_shard(m, l, (train_weight_t)w, buf, &e0, &ne, &r0, &valid, &srows) !=
                ETP_SUCCESS) {
                free(buf);
                return -1;
            }
            train_weight_shape(sh, (train_weight_t)w, &E, &R, &C);
            const float *ref = ref_grad(c->ref, l, (train_weight_t)w);
            double scale = 0, diff = 0;
            for (int64_t i = 0; i < E * R * C; i++) scale = fmax(scale, fabs(ref[i]));
            for (int64_t e = 0; e < ne; e++)
                for (int64_t i = 0; i < valid; i++)
                    for (int64_t j = 0; j < C; j++) {
                        double a = buf[(e * srows + i) * C + j];
                        double b = ref[((e0 + e) * R + r0 + i) * C + j];
                        double d = fabs(a - b);
                        if (!(d <= diff)) diff = d; /* NaN counts */
                    }
            double rel = scale > 0 ? diff / scale : diff;
            if (isnan(rel)) rel = INFINITY;
            if (rel > worst) worst = rel;
        }
    free(buf);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r->rank == 0 && !r->quiet)
        printf("check: step 0 weight gradients: max relative difference %.3g (tolerance %.3g)\n",
               worst, c->tol_grad);
    if (worst > c->worst) c->worst = worst;
    if (!(worst <= c->tol_grad)) c->failed = 1;
    return 0;
}

/* ---- main ------------------------------------------------------------------- */

#define CHECK(expr)                                                                        \
    do {                                                                                   \
        etp_status_t st_ = (expr);                                                         \
        if (st_ != ETP_SUCCESS) {                                                          \
            fprintf(stderr, "etp-train rank %d: %s: %s: %s\n", r.rank, #expr,              \
                    etp_status_string(st_), etp_last_error());                             \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)


/* Useful GEMM FLOPs of one step on this rank, forward and backward: three
 * products per weight, each 2 M N K. */
static double step_flops(const train_shape_t *sh, int64_t T)
{
    double H = (double)sh->hidden, F = (double)sh->ffn, E = sh->experts, k = sh->topk;
    return 3.0 * 2.0 * sh->layers * T * (H * H + E * H + k * 2.0 * H * F);
}

#if ETP_HAVE_CUDA
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#endif

/* TFLOP/s of one large cuBLASLt GEMM (etp/gemm.h) on this GPU: the peak the
 * step's GEMMs are compared with. */
static double peak_tflops(etp_context_t *ctx, etp_stream_t *s)
{
#if ETP_HAVE_CUDA
    const int64_t n = 8192;
    etp_gemm_config_t gc = ETP_GEMM_CONFIG_INIT;
    gc.name = "peak";
    gc.rows = n;
    gc.n = n;
    gc.k = n;
    etp_gemm_plan_t *plan = NULL;
    void *x = NULL, *w = NULL, *y = NULL;
    double tf = 0;
    cudaEvent_t e0, e1;
    cudaStream_t cs;
    if (etp_gemm_plan_create(ctx, &gc, &plan) != ETP_SUCCESS) return 0;
    if (etp_mem_alloc(ctx, (size_t)(n * n) * 2, ETP_MEM_USER, &x) == ETP_SUCCESS &&
        etp_mem_alloc(ctx, (size_t)(n * n) * 2, ETP_MEM_USER, &w) == ETP_SUCCESS &&
        etp_mem_alloc(ctx, (size_t)(n * n) * 2, ETP_MEM_USER, &y) == ETP_SUCCESS &&
        etp_memset_async(s, x, 0x3c, (size_t)(n * n) * 2) == ETP_SUCCESS &&
        etp_memset_async(s, w, 0x3c, (size_t)(n * n) * 2) == ETP_SUCCESS &&
        etp_stream_get_cuda(s, &cs) == ETP_SUCCESS && cudaEventCreate(&e0) == cudaSuccess) {
        if (cudaEventCreate(&e1) == cudaSuccess) {
            etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
            v.data = w;
            v.experts = 1;
            v.rows = n;
            v.cols = n;
            v.ld = n;
            v.expert_stride = n * n;
            etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
            a.x = x;
            a.w = &v;
            a.y = y;
            double t[10];
            int ok = 1;
            for (int i = 0; i < 13 && ok; i++) {
                cudaEventRecord(e0, cs);
                ok = etp_gemm_run(plan, &a, s) == ETP_SUCCESS;
                cudaEventRecord(e1, cs);
                float ms = 0;
                ok = ok && cudaEventSynchronize(e1) == cudaSuccess &&
                     cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
                if (i >= 3) t[i - 3] = ms;
            }
            if (ok) {
                qsort(t, 10, sizeof t[0], cmp_double);
                tf = 2.0 * n * n * n / (t[5] * 1e-3) / 1e12;
            }
            cudaEventDestroy(e1);
        }
        cudaEventDestroy(e0);
    }
    etp_stream_synchronize(s);
    if (x) etp_mem_free(ctx, x);
    if (w) etp_mem_free(ctx, w);
    if (y) etp_mem_free(ctx, y);
    etp_gemm_plan_destroy(plan);
    return tf;
#else
    (void)ctx, (void)s;
    return 0;
#endif
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    run_t r = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.ranks);
    train_shape_t *sh = &r.o.shape;
    sh->pool = 4;
    sh->seed = 1;
    sh->lr = -1.0f; /* train_adam_defaults' once the hidden size is known */
    r.o.depth = 1;
    r.o.capacity = -1;
    r.o.transport = (etp_ep_transport_t)-1;
    r.o.combine_wire = ETP_DTYPE_F32;
    r.warmup = 2;
    r.steps = 200;
    int rc = parse(&r, argc, argv);
    if (rc != 0) {
        MPI_Finalize();
        return rc == ETP_CLI_HELP ? 0 : 2;
    }
    etp_context_config_t cc = ETP_CONTEXT_CONFIG_INIT;
    if (r.backend) cc.backend = strcmp(r.backend, "host") ? ETP_BACKEND_CUDA : ETP_BACKEND_HOST;
    etp_context_t *ctx = NULL;
    CHECK(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &ctx));
    etp_backend_t backend;
    CHECK(etp_context_backend(ctx, &backend));
    if ((rc = complete(&r, backend)) != 0) {
        etp_context_destroy(ctx);
        MPI_Finalize();
        return rc;
    }
    int64_t n_all = 0;
    for (int i = 0; i < r.ranks; i++) n_all += train_tokens(sh, i);
    if (r.check && r.rank == 0) {
        /* the reference runs every rank's tokens through plain loops on one
         * core, at about 3 GFLOP/s */
        double ref_s = step_flops(sh, n_all) / 3e9;
        if (ref_s > 30.0)
            fprintf(stderr,
                    "etp-train: --check runs the reference on the CPU: about %.0f s a step at "
                    "this size (docs/TRAINING.md checks with --hidden 128 --ffn 256 --experts 16 "
                    "--topk 4 --tokens 64)\n",
                    ref_s);
    }
    r.o.timing = backend == ETP_BACKEND_CUDA && !r.o.graph;
    etp_stream_t *s = NULL;
    CHECK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    train_model_t *m = NULL;
    etp_status_t st = model_create(ctx, s, &r.o, &m);
    if (st != ETP_SUCCESS) {
        fprintf(stderr, "etp-train rank %d: the model could not be made\n", r.rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const int64_t N = n_all;
    if (r.rank == 0 && !r.quiet)
        printf("etp-train: %s backend, %d ranks (etp %d x ep %d x dp %d), %d layers, hidden %lld, "
               "ffn %lld, %d experts, top-%d, %lld tokens a step, quant %s, transport %s%s%s%s\n",
               backend == ETP_BACKEND_CUDA ? "cuda" : "host", r.ranks, r.o.etp, r.o.ep, r.o.dp,
               sh->layers, (long long)sh->hidden, (long long)sh->ffn, sh->experts, sh->topk,
               (long long)N,
               sh->quant == TRAIN_QUANT_NONE    ? "none"
               : sh->quant == TRAIN_QUANT_MXFP8 ? "mxfp8"
                                                : "nvfp4",
               transport_name(r.o.transport),
               r.o.combine_wire == ETP_DTYPE_BF16 ? ", bf16 wire" : "", r.o.graph ? ", graph" : "",
               r.o.resident ? ", resident" : "");
    CHECK(model_make_data(m));
    CHECK(model_init_weights(m, 0));
    if (r.load) CHECK(model_load(m, r.load));

    check_t chk = {0};
    if (r.check) {
        chk.tol_grad = backend == ETP_BACKEND_CUDA ? 5e-2 : 1e-5;
        chk.tol_loss = backend == ETP_BACKEND_CUDA ? 1e-2 : 1e-5;
        /* the reference follows nvlink's drops (receive capacity, then the
         * FIXED_SLOTS layout); the other transports must drop nothing */
        ref_ep_t rep_cfg = {0, 0, r.o.combine_wire == ETP_DTYPE_BF16};
        if (r.o.transport == ETP_EP_TRANSPORT_NVLINK)
            model_ep_limits(m, &rep_cfg.recv_tokens, &rep_cfg.slots);
        if (ref_create(sh, r.o.etp, r.o.ep, r.o.dp, &rep_cfg, &chk.ref) != 0) {
            fprintf(stderr, "etp-train rank %d: the reference could not be made\n", r.rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }

    train_report_t *rep = train_report_create(r.steps);
    if (!rep) MPI_Abort(MPI_COMM_WORLD, 1);
    const int first_step = model_step_count(m);
    double flops = step_flops(sh, train_tokens(sh, r.rank));
    for (int i = 0; i < r.steps; i++) {
        const int t = first_step + i;
        double loss = 0;
        int capture = r.o.graph && i == r.warmup;
        CHECK(model_step(m, t, capture, &loss));
        train_times_t tm;
        model_times(m, &tm);
        if (r.check && i < 5) {
            double ref_loss = 0;
            if (ref_step(chk.ref, t, &ref_loss) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
            double rel = fabs(loss - ref_loss) / fmax(fabs(ref_loss), 1e-30);
            if (isnan(rel)) rel = INFINITY;
            /* every dropped slot is counted once, on the rank that dropped it */
            long long drops = (long long)tm.dropped_step, ref_drops = (long long)ref_dropped(chk.ref);
            MPI_Allreduce(MPI_IN_PLACE, &drops, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (r.rank == 0 && !r.quiet)
                printf("check: step %d loss %.9g, reference %.9g: relative difference %.3g; "
                       "%lld slots dropped, reference %lld\n",
                       t, loss, ref_loss, rel, drops, ref_drops);
            if (rel > chk.worst) chk.worst = rel;
            if (!(rel <= chk.tol_loss)) chk.failed = 1;
            /* on GPUs routing near ties may flip, and with them drops */
            if (drops != ref_drops && (backend == ETP_BACKEND_HOST || ref_drops == 0)) {
                if (r.rank == 0)
                    printf("check: step %d dropped %lld slots, the reference %lld\n", t, drops,
                           ref_drops);
                chk.failed = 1;
            }
            if (i == 0 && check_grads(&r, m, &chk) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* the slowest rank's times are the step's */
        double v[6] = {tm.step_ms, tm.fwdbwd_ms, tm.gather_ms, tm.exchange_ms, tm.optim_ms,
                       (double)tm.dropped};
        MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double fl = flops;
        MPI_Allreduce(MPI_IN_PLACE, &fl, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        train_report_row_t row = {t, loss, v[0], v[1], v[2], v[3], v[4], (int64_t)v[5],
                                  (double)N / (v[0] * 1e-3),
                                  fl / r.ranks / (v[1] * 1e-3) / 1e12};
        train_report_add(rep, &row);
        if (r.rank == 0 && !r.quiet && ((i + 1) % r.every == 0 || i == 0 || i + 1 == r.steps))
            train_report_print_row(&row, stdout);
    }
    if (r.check && chk.ref) {
        const train_report_row_t *a = train_report_row(rep, 0);
        const train_report_row_t *b = train_report_row(rep, r.steps - 1);
        int64_t dropped = b->dropped;
        if (dropped != 0 && r.o.transport != ETP_EP_TRANSPORT_NVLINK) {
            if (r.rank == 0) printf("check: %lld slots were dropped\n", (long long)dropped);
            chk.failed = 1;
        }
        if (r.steps > 5 && !(b->loss < a->loss)) {
            if (r.rank == 0) printf("check: the loss did not fall (%g -> %g)\n", a->loss, b->loss);
            chk.failed = 1;
        }
    }
    if (r.min_fall > 0) {
        const train_report_row_t *a = train_report_row(rep, 0);
        const train_report_row_t *b = train_report_row(rep, r.steps - 1);
        if (!(b->loss > 0 && a->loss / b->loss >= r.min_fall)) {
            if (r.rank == 0)
                printf("the loss fell %.3gx, less than --min-fall %g\n", a->loss / b->loss,
                       r.min_fall);
            rc = 1;
        }
    }
    double peak = 0;
    if (backend == ETP_BACKEND_CUDA && !r.check) {
        peak = peak_tflops(ctx, s);
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    }
    /* device memory by owner on the rank whose peak is highest: what a user
     * sizes a run by (the model's own buffers count as "user") */
    etp_memory_report_t mem = ETP_MEMORY_REPORT_INIT;
    CHECK(etp_memory_report(ctx, &mem));
    struct {
        double peak;
        int rank;
    } top = {(double)mem.peak_bytes, r.rank};
    MPI_Allreduce(MPI_IN_PLACE, &top, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    if (top.rank != 0) {
        if (r.rank == top.rank) MPI_Send(&mem, sizeof mem, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        if (r.rank == 0)
            MPI_Recv(&mem, sizeof mem, MPI_BYTE, top.rank, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (r.rank == 0) {
        train_report_summary(rep, r.o.graph ? r.warmup + 1 : 1, peak,
                             backend == ETP_BACKEND_CUDA ? "GPU" : "rank", stdout);
        if (!r.quiet) {
            const int gib = mem.peak_bytes >= ((size_t)1 << 30);
            const double unit = gib ? 1073741824.0 : 1048576.0;
            const char *u = gib ? "GiB" : "MiB";
            printf("memory: peak %.2f %s on rank %d (", (double)mem.peak_bytes / unit, u,
                   top.rank);
            for (int o = 0; o < ETP_MEM_OWNER_COUNT; o++)
                printf("%s%s %.2f", o ? ", " : "", etp_mem_owner_name((etp_mem_owner_t)o),
                       (double)mem.bytes[o] / unit);
            printf(" %s live)\n", u);
        }
        if (r.csv && train_report_csv(rep, r.csv) != 0) rc = 1;
        if (r.svg && train_report_svg(rep, r.svg) != 0) rc = 1;
        if (r.check) {
            if (chk.failed)
                printf("check: FAILED (max relative difference %.3g)\n", chk.worst);
            else
                printf("check: ok (max relative difference %.3g)\n", chk.worst);
        }
    }
    if (r.save) CHECK(model_save(m, r.save));
    train_report_destroy(rep);
    if (chk.ref) ref_destroy(chk.ref);
    model_destroy(m);
    CHECK(etp_stream_destroy(s));
    CHECK(etp_context_destroy(ctx));
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int failed = chk.failed;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed ? 1 : rc;
}
