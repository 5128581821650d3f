/*
 * etp-bench layer: one MoE layer of etp-train's model (tools/train/model.h)
 * forward and backward with real GEMMs, and the grouped GEMMs' efficiency.
 *
 *   etp-bench layer [--hidden H] [--ffn F] [--experts E] [--topk K] [--tokens T]
 *                   [--etp N] [--ep N] [--transport exact|capacity] [--capacity X]
 *                   [--quant none|mxfp8|nvfp4] [--variants LIST] [--seed S] [--depth N]
 *   (etp-bench layer --help: each option, from layer_opts below)
 *
 * Two parts, in one run (--variants picks among them):
 *
 * gemm: the expert GEMMs of this rank on their own (etp/gemm.h, FORWARD,
 * Y = X W^T with the W1 shape [F, H] and, where F != H, the W2 shape
 * [H, F]). A seeded random routing (T tokens on each of the ep ranks pick
 * top-k distinct experts uniformly) gives the rows each of EP rank 0's
 * E / ep experts receives; every rank times those GEMMs (a row is the
 * slowest rank's). Timed, interleaved, on one stream:
 *   dense (peer)   ONE DENSE GEMM of M = sum(counts) rows: the same FLOPs
 *   PACKED         one block per expert at the prefix sums of the counts
 *                  (no padding); ratio = its useful FLOP/s over the peer's
 *                  (target: >= 0.90)
 *   FIXED_SLOTS    S slots per expert, S = the largest count rounded up to
 *                  16 ("tight") and S = --capacity x the mean count, rounded
 *                  up to 16 (the layer's capacity transport), each as two
 *                  rows: useful FLOPs (2 sum(counts) n k) and padded FLOPs
 *                  (2 E_local S n k) over the same time.
 * In these rows "bytes" holds FLOPs and "GB/s" GFLOP/s (1e9 FLOP/s).
 *
 * layer: etp-train's model with one layer (a dense projection, the router,
 * EP dispatch, W1, SiLU, W2, EP combine; forward, loss, backward, then
 * Adam), weights from the seed, on a grid etp x ep (x dp, the rest of the
 * ranks). Each variant is a fresh model; a row is the median over --iters
 * steps of the forward + backward time on the stream (CUDA events; the
 * host backend's wall clock), the slowest rank's:
 *   resident eager   every weight whole on every rank: no gathers (peer of
 *                    gathered eager)
 *   gathered eager   weights sharded over the etp group, gathered by the
 *                    chain with prefetch; ratio = resident time / gathered
 *                    time (target: >= 0.95 at etp x ep = 2 x 2)
 *   gathered graph,  the forward + backward captured once into a graph and
 *   resident graph   replayed; always on the capacity transport (the exact
 *                    one copies counts to the host and cannot be captured);
 *                    ratio = the eager variant's time / the graph's (targets:
 *                    >= 1.3 at etp 1, ep 4, 512 tokens a rank; >= 1.0 at
 *                    8192); with --transport exact the eager peer differs
 *                    in its transport too
 * In these rows "bytes" holds the step's useful GEMM FLOPs on a rank
 * (3 products of 2 M N K per weight, T k expert rows on average) and "GB/s"
 * GFLOP/s. On CUDA the eager variants add rows of the median step's
 * phases: the stream's time in gathers (what the prefetch left exposed), in
 * EP calls (dispatch, combine and their backward) and the rest.
 *
 * Defaults: CUDA H 4096, F 4096, E 64, top-8, 8192 tokens; host 64, 128,
 * 8, top-2, 64 tokens. etp is 2 where the ranks are even, ep the rest (as
 * etp-train); the capacity transport at --capacity 1.5 (rows per expert
 * 1.5x the mean: tokens beyond are dropped and counted).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etp/gemm.h"
#include "etp_bench.h"
#include "model.h"

enum { V_GEMM, V_RESIDENT, V_GATHERED, V_RESIDENT_GRAPH, V_GATHERED_GRAPH, V_COUNT };
static const char *const variant_names[V_COUNT] = {"gemm", "resident", "gathered",
                                                   "resident-graph", "gathered-graph"};

typedef struct {
    long hidden, ffn, experts, topk, tokens, etp, ep, seed, depth;
    double capacity;
    etp_ep_transport_t transport;
    train_quant_t quant;
    int variant[V_COUNT]; /* 1: run it */
} layer_opts_t;

enum {
    O_HIDDEN, O_FFN, O_EXPERTS, O_TOPK, O_TOKENS, O_ETP, O_EP, O_TRANSPORT, O_CAPACITY, O_QUANT,
    O_VARIANTS, O_SEED, O_DEPTH
};
static const etp_cli_opt_t layer_opts[] = {
    [O_HIDDEN] = {"hidden", "H", NULL, "hidden size, a multiple of 32 (default: cuda 4096, host 64)"},
    [O_FFN] = {"ffn", "F", NULL, "expert FFN size, a multiple of 32 (default: cuda 4096, host 128)"},
    [O_EXPERTS] = {"experts", "E", NULL, "experts (default: cuda 64, host 8)"},
    [O_TOPK] = {"topk", "K", NULL, "experts per token (default: cuda 8, host 2)"},
    [O_TOKENS] = {"tokens", "T", NULL, "tokens per rank (default: cuda 8192, host 64)"},
    [O_ETP] = {"etp", "N", NULL,
               "ETP group size (default: 2 where the ranks are even, else 1; etp x ep divides "
               "the ranks, data-parallel replicas take the rest)"},
    [O_EP] = {"ep", "N", NULL, "EP group size (default: the ranks over etp)"},
    [O_TRANSPORT] = {"transport", "exact|capacity", "capacity",
                     "the EP transport of the eager variants (graph variants: always capacity)"},
    [O_CAPACITY] = {"capacity", "X", "1.5",
                    "EP rows per expert (capacity) or per rank (exact) as a multiple of the mean "
                    "load; 0: enough that no slot can be dropped"},
    [O_QUANT] = {"quant", "none|mxfp8|nvfp4", "none",
                 "weights cross the wire quantized; the GEMMs read them dequantized to BF16"},
    [O_VARIANTS] = {"variants", "LIST", "gemm,resident,gathered,resident-graph,gathered-graph",
                    "what to run, comma-separated: gemm (the grouped GEMMs), resident, gathered "
                    "(eager layer steps), resident-graph, gathered-graph"},
    [O_SEED] = {"seed", "S", "1", "seed of the routing, the weights and the data"},
    [O_DEPTH] = {"depth", "N", "1", "the chain's prefetch depth"},
    {NULL},
};

static const char layer_about[] =
    "One MoE layer of etp-train's model, forward and backward with real GEMMs, and its grouped "
    "GEMMs. gemm rows: FORWARD over a random top-k routing's rows for this rank's experts, "
    "PACKED and FIXED_SLOTS (etp/gemm.h) against ONE dense GEMM of the same FLOPs (target: "
    "PACKED >= 0.90 of it); their 'bytes' are FLOPs and 'GB/s' GFLOP/s (FIXED_SLOTS: useful "
    "and padded FLOPs). layer rows: the median forward + backward of a one-layer model (dense "
    "projection, router, EP, W1, SiLU, W2) with gathered or resident weights, eager or "
    "replayed from a graph (capacity transport); 'bytes' are the step's useful GEMM FLOPs. "
    "Targets: gathered eager >= 0.95 of resident at etp x ep = 2 x 2; graph >= 1.3x eager at "
    "etp 1, ep 4, 512 tokens a rank, and no slower at 8192.";

static void die(bench_t *b, const char *what)
{
    fprintf(stderr, "etp-bench layer rank %d: %s\n", b->rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *xcalloc(bench_t *b, size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) die(b, "out of host memory");
    return p;
}

/* ---- routing -------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Rows each of the experts [e0, e0 + el) receives when R x T tokens pick k
 * distinct experts of E uniformly: a partial Fisher-Yates shuffle per token
 * (from any order of `perm`, its first k entries are a uniform k-subset). */
static void route(uint64_t seed, int64_t tokens, int E, int k, int e0, int el, int32_t *counts)
{
    int *perm = malloc((size_t)E * sizeof *perm);
    if (!perm) return; /* the caller sees zero counts */
    for (int e = 0; e < E; e++) perm[e] = e;
    memset(counts, 0, (size_t)el * sizeof *counts);
    uint64_t s = seed;
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < k; j++) {
            int r = j + (int)(((splitmix(&s) >> 32) * (uint64_t)(E - j)) >> 32);
            int e = perm[r];
            perm[r] = perm[j];
            perm[j] = e;
            if (e >= e0 && e < e0 + el) counts[e - e0]++;
        }
    free(perm);
}

/* ---- the grouped GEMMs ------------------------------------------------------ */

enum { G_DENSE, G_PACKED, G_FIXED_TIGHT, G_FIXED_CAP, G_COUNT };

typedef struct {
    etp_gemm_plan_t *plan;
    etp_weight_view_t w;
    int64_t S; /* FIXED_SLOTS */
} gcase_t;

static etp_gemm_plan_t *make_plan(bench_t *b, const char *name, etp_gemm_layout_t layout,
                                  int64_t experts, int64_t rows, int64_t n, int64_t k)
{
    etp_gemm_config_t gc = ETP_GEMM_CONFIG_INIT;
    gc.name = name;
    gc.op = ETP_GEMM_FORWARD;
    gc.layout = layout;
    gc.experts = experts;
    gc.rows = rows;
    gc.n = n;
    gc.k = k;
    gc.out_dtype = ETP_DTYPE_BF16;
    etp_gemm_plan_t *p = NULL;
    BENCH_CHECK(b, etp_gemm_plan_create(b->ctx, &gc, &p));
    return p;
}

static int64_t round16(int64_t x)
{
    return (x + 15) / 16 * 16;
}

/* One weight shape [n, k]: rows of the four cases and the table. */
static void gemm_shape(bench_t *b, etp_stream_t *s, const char *wname, int64_t n, int64_t k,
                       int64_t el, const int32_t *counts, const int32_t *offsets, int64_t useful,
                       int64_t packed_rows, int64_t S_tight, int64_t S_cap, void *X, void *W,
                       void *Y)
{
    gcase_t c[G_COUNT];
    memset(c, 0, sizeof c);
    int on[G_COUNT] = {1, 1, 1, S_cap != S_tight};
    char name[64];
    snprintf(name, sizeof name, "%s dense", wname);
    c[G_DENSE].plan = make_plan(b, name, ETP_GEMM_DENSE, 1, useful, n, k);
    snprintf(name, sizeof name, "%s packed", wname);
    c[G_PACKED].plan = make_plan(b, name, ETP_GEMM_PACKED, el, packed_rows, n, k);
    c[G_FIXED_TIGHT].S = S_tight;
    c[G_FIXED_CAP].S = S_cap;
    for (int g = G_FIXED_TIGHT; g <= G_FIXED_CAP; g++)
        if (on[g]) {
            snprintf(name, sizeof name, "%s fixed", wname);
            c[g].plan = make_plan(b, name, ETP_GEMM_FIXED_SLOTS, el, c[g].S, n, k);
        }
    for (int g = 0; g < G_COUNT; g++) {
        etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
        v.data = W;
        v.dtype = ETP_DTYPE_BF16;
        v.experts = g == G_DENSE ? 1 : el;
        v.rows = n;
        v.cols = k;
        v.ld = k;
        v.expert_stride = n * k;
        c[g].w = v;
    }
    bench_timer_t *tm = bench_timer_create(b, s);
    double *t[G_COUNT];
    for (int g = 0; g < G_COUNT; g++) t[g] = xcalloc(b, (size_t)b->iters, sizeof(double));
    for (int it = -b->warmup; it < b->iters; it++)
        for (int g = 0; g < G_COUNT; g++) {
            if (!on[g]) continue;
            etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
            a.x = X;
            a.w = &c[g].w;
            a.y = Y;
            if (g == G_PACKED) {
                a.counts = counts;
                a.offsets = offsets;
            }
            bench_timer_start(tm);
            BENCH_CHECK(b, etp_gemm_run(c[g].plan, &a, s));
            bench_timer_stop(tm);
            double us = bench_timer_us(tm);
            if (it >= 0) t[g][it] = us;
        }
    double us[G_COUNT] = {0};
    for (int g = 0; g < G_COUNT; g++)
        if (on[g]) us[g] = bench_max_over_ranks(bench_median(t[g], b->iters));
    const double flop_useful = 2.0 * (double)useful * (double)n * (double)k;
    char shape[96], row[64];
    snprintf(shape, sizeof shape, "M=%lld n=%lld k=%lld", (long long)useful, (long long)n,
             (long long)k);
    snprintf(row, sizeof row, "gemm %s fwd: one dense GEMM (peer)", wname);
    bench_row_t *peer = bench_add(b, row, shape, flop_useful, us[G_DENSE], 0);
    const double base = peer->gbps;
    snprintf(shape, sizeof shape, "%lld experts, %lld rows, n=%lld k=%lld", (long long)el,
             (long long)useful, (long long)n, (long long)k);
    snprintf(row, sizeof row, "gemm %s fwd: PACKED", wname);
    bench_add(b, row, shape, flop_useful, us[G_PACKED], base);
    for (int g = G_FIXED_TIGHT; g <= G_FIXED_CAP; g++) {
        if (!on[g]) continue;
        const double flop_padded = 2.0 * (double)(el * c[g].S) * (double)n * (double)k;
        const char *which = g == G_FIXED_TIGHT ? "max" : "capacity";
        snprintf(shape, sizeof shape, "%lld experts x S=%lld (%s), n=%lld k=%lld", (long long)el,
                 (long long)c[g].S, which, (long long)n, (long long)k);
        snprintf(row, sizeof row, "gemm %s fwd: FIXED_SLOTS useful", wname);
        bench_add(b, row, shape, flop_useful, us[g], base);
        snprintf(row, sizeof row, "gemm %s fwd: FIXED_SLOTS padded", wname);
        bench_add(b, row, shape, flop_padded, us[g], base);
    }
    bench_timer_destroy(tm);
    for (int g = 0; g < G_COUNT; g++) {
        free(t[g]);
        if (c[g].plan) BENCH_CHECK(b, etp_gemm_plan_destroy(c[g].plan));
    }
}

static void run_gemm(bench_t *b, etp_stream_t *s, const layer_opts_t *o)
{
    const int E = (int)o->experts, k = (int)o->topk, R = (int)o->ep;
    const int64_t el = E / R, T = o->tokens;
    int32_t *counts = xcalloc(b, (size_t)el, sizeof *counts);
    int32_t *offsets = xcalloc(b, (size_t)el + 1, sizeof *offsets);
    /* the tokens of all R ranks on EP rank 0's experts: every rank times the
     * same GEMMs, so the slowest rank's time goes with rank 0's FLOPs */
    route((uint64_t)o->seed * 0x100000001b3ull, (int64_t)R * T, E, k, 0, (int)el, counts);
    int64_t useful = 0, maxc = 0;
    for (int64_t e = 0; e < el; e++) {
        offsets[e] = (int32_t)useful;
        useful += counts[e];
        if (counts[e] > maxc) maxc = counts[e];
    }
    offsets[el] = (int32_t)useful;
    if (useful == 0) { /* alike on every rank */
        if (b->rank == 0)
            printf("etp-bench layer: EP rank 0's experts received no rows: no gemm rows (more "
                   "--tokens)\n");
        free(counts);
        free(offsets);
        return;
    }
    /* the rows a layer would allocate: --capacity x the mean (0: all of them) */
    const double mean_rank = (double)T * k, mean_expert = mean_rank / (double)el;
    const int64_t kl = k < el ? k : el;
    int64_t packed_rows = o->capacity > 0 ? (int64_t)ceil(o->capacity * mean_rank) : R * T * kl;
    if (packed_rows < useful) packed_rows = useful;
    const int64_t S_tight = round16(maxc);
    int64_t S_cap = o->capacity > 0 ? round16((int64_t)ceil(o->capacity * mean_expert)) : S_tight;
    if (S_cap < 16) S_cap = 16;
    if (b->rank == 0)
        printf("etp-bench layer: gemm: %lld tokens x top-%d of %d experts over %d EP ranks; EP "
               "rank 0's %lld experts get %lld rows (mean %.1f, max %lld an expert), timed on "
               "every rank\n",
               (long long)(R * T), k, E, R, (long long)el, (long long)useful,
               (double)useful / (double)el, (long long)maxc);
    int64_t rows_max = packed_rows;
    if (el * S_tight > rows_max) rows_max = el * S_tight;
    if (el * S_cap > rows_max) rows_max = el * S_cap;
    const int64_t H = o->hidden, F = o->ffn, wide = H > F ? H : F;
    void *X = NULL, *W = NULL, *Y = NULL;
    const size_t xb = (size_t)(rows_max * wide) * 2, wb = (size_t)(el * H * F) * 2;
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, xb, ETP_MEM_USER, &X));
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, wb, ETP_MEM_USER, &W));
    BENCH_CHECK(b, etp_mem_alloc(b->ctx, xb, ETP_MEM_USER, &Y));
    /* BF16 0x3c3c, about 0.0115: finite sums at any k (a slot holding no
     * token would be a zero row after dispatch; the GEMM's cost is the same) */
    BENCH_CHECK(b, etp_memset_async(s, X, 0x3c, xb));
    BENCH_CHECK(b, etp_memset_async(s, W, 0x3c, wb));
    BENCH_CHECK(b, etp_stream_synchronize(s));
    gemm_shape(b, s, "W1", F, H, el, counts, offsets, useful, packed_rows, S_tight, S_cap, X, W, Y);
    if (F != H)
        gemm_shape(b, s, "W2", H, F, el, counts, offsets, useful, packed_rows, S_tight, S_cap, X,
                   W, Y);
    BENCH_CHECK(b, etp_stream_synchronize(s));
    BENCH_CHECK(b, etp_mem_free(b->ctx, X));
    BENCH_CHECK(b, etp_mem_free(b->ctx, W));
    BENCH_CHECK(b, etp_mem_free(b->ctx, Y));
    free(counts);
    free(offsets);
}

/* ---- the layer --------------------------------------------------------------- */

/* Useful GEMM FLOPs of one step's forward and backward on a rank of T
 * tokens: three products (forward, dgrad, wgrad) of 2 M N K per weight;
 * the expert GEMMs over T k rows, their mean per rank. */
static double step_flops(const train_shape_t *sh)
{
    const double H = (double)sh->hidden, F = (double)sh->ffn, E = sh->experts, k = sh->topk;
    return 3.0 * 2.0 * sh->layers * (double)sh->tokens * (H * H + E * H + k * 2.0 * H * F);
}

typedef struct {
    double fwdbwd, gather, exchange, rest; /* us: the slowest rank's medians */
    double dropped;                        /* slots, the most of any rank */
} layer_result_t;

static void run_variant(bench_t *b, etp_stream_t *s, const train_opts_t *base, int resident,
                        int graph, layer_result_t *res)
{
    train_opts_t to = *base;
    to.resident = resident;
    to.graph = graph;
    if (graph) to.transport = ETP_EP_TRANSPORT_CAPACITY;
    /* events around every gather and EP call: eager only (none inside a graph) */
    to.timing = !graph && b->backend == ETP_BACKEND_CUDA;
    train_model_t *m = NULL;
    BENCH_CHECK(b, model_create(b->ctx, s, &to, &m));
    BENCH_CHECK(b, model_make_data(m));
    BENCH_CHECK(b, model_init_weights(m, 0));
    const int iters = b->iters;
    double *t[4];
    for (int i = 0; i < 4; i++) t[i] = xcalloc(b, (size_t)iters, sizeof(double));
    /* graph: eager steps first (at least one, as a training loop's first
     * steps are), the capture, then the warm-up replays */
    const int eager = graph ? (b->warmup > 0 ? b->warmup : 1) : 0;
    const int total = eager + (graph ? 1 : 0) + b->warmup + iters;
    int step = 0;
    for (int i = 0; i < total; i++) {
        double loss = 0;
        const int capture = graph && i == eager;
        BENCH_CHECK(b, model_step(m, step++, capture, &loss));
        if (!isfinite(loss)) die(b, "the step's loss is not finite");
        const int it = i - (total - iters);
        if (it < 0) continue;
        train_times_t tm;
        model_times(m, &tm);
        t[0][it] = 1e3 * tm.fwdbwd_ms;
        t[1][it] = 1e3 * tm.gather_ms;
        t[2][it] = 1e3 * tm.exchange_ms;
        t[3][it] = 1e3 * (tm.fwdbwd_ms - tm.gather_ms - tm.exchange_ms);
    }
    train_times_t tm;
    model_times(m, &tm);
    res->dropped = bench_max_over_ranks((double)tm.dropped);
    res->fwdbwd = bench_max_over_ranks(bench_median(t[0], iters));
    res->gather = bench_max_over_ranks(bench_median(t[1], iters));
    res->exchange = bench_max_over_ranks(bench_median(t[2], iters));
    res->rest = bench_max_over_ranks(bench_median(t[3], iters));
    for (int i = 0; i < 4; i++) free(t[i]);
    model_destroy(m);
}

static void run_layer(bench_t *b, etp_stream_t *s, const layer_opts_t *o)
{
    train_opts_t to;
    memset(&to, 0, sizeof to);
    train_shape_t *sh = &to.shape;
    sh->layers = 1;
    sh->hidden = o->hidden;
    sh->ffn = o->ffn;
    sh->experts = (int)o->experts;
    sh->topk = (int)o->topk;
    sh->tokens = o->tokens;
    sh->tokens_step = 0;
    sh->pool = 1;
    sh->seed = (uint64_t)o->seed;
    sh->quant = o->quant;
    sh->ep = (int)o->ep;
    train_adam_defaults(sh);
    to.etp = (int)o->etp;
    to.ep = (int)o->ep;
    to.dp = b->size / (int)(o->etp * o->ep);
    to.transport = o->transport;
    to.capacity = o->capacity;
    to.combine_wire = ETP_DTYPE_F32;
    to.depth = (int)o->depth;

    static const struct {
        int v, resident, graph, peer; /* peer: the variant of the ratio's baseline, or -1 */
        const char *name;
    } vs[] = {
        {V_RESIDENT, 1, 0, -1, "layer resident eager"},
        {V_GATHERED, 0, 0, V_RESIDENT, "layer gathered eager"},
        {V_RESIDENT_GRAPH, 1, 1, V_RESIDENT, "layer resident graph"},
        {V_GATHERED_GRAPH, 0, 1, V_GATHERED, "layer gathered graph"},
    };
    const double flops = step_flops(sh);
    const char *tr = o->transport == ETP_EP_TRANSPORT_EXACT ? "exact" : "capacity";
    double gbps[V_COUNT] = {0};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        if (!o->variant[vs[i].v]) continue;
        layer_result_t r;
        run_variant(b, s, &to, vs[i].resident, vs[i].graph, &r);
        char shape[96], name[64];
        snprintf(shape, sizeof shape, "etp%d ep%d dp%d T=%lld H=%lld F=%lld E%d k%d %s c%g",
                 to.etp, to.ep, to.dp, (long long)sh->tokens, (long long)sh->hidden,
                 (long long)sh->ffn, sh->experts, sh->topk, vs[i].graph ? "capacity" : tr,
                 o->capacity);
        const int peer = vs[i].peer;
        snprintf(name, sizeof name, "%s%s", vs[i].name,
                 vs[i].v == V_RESIDENT && o->variant[V_GATHERED] ? " (peer)" : "");
        bench_row_t *row = bench_add(b, name, shape, flops, r.fwdbwd, peer >= 0 ? gbps[peer] : 0);
        gbps[vs[i].v] = row->gbps;
        if (!vs[i].graph && b->backend == ETP_BACKEND_CUDA) {
            snprintf(name, sizeof name, "  %s: exposed gathers", vs[i].name + 6);
            bench_add(b, name, shape, 0, r.gather, 0);
            snprintf(name, sizeof name, "  %s: EP exchange", vs[i].name + 6);
            bench_add(b, name, shape, 0, r.exchange, 0);
            snprintf(name, sizeof name, "  %s: the rest", vs[i].name + 6);
            bench_add(b, name, shape, 0, r.rest, 0);
        }
        if (b->rank == 0 && r.dropped > 0)
            printf("etp-bench layer: %s: %.0f slots dropped on a rank over the run (--capacity "
                   "%g)\n",
                   vs[i].name, r.dropped, o->capacity);
    }
}

/* ---- options and the run --------------------------------------------------- */

static int parse_variants(etp_cli_t *cli, const char *arg, layer_opts_t *o)
{
    memset(o->variant, 0, sizeof o->variant);
    const char *p = arg;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int v = 0; v < V_COUNT; v++)
            if (strlen(variant_names[v]) == len && strncmp(p, variant_names[v], len) == 0) found = v;
        if (found < 0)
            return etp_cli_fail(cli, "--variants: '%.*s' is none of gemm, resident, gathered, "
                                     "resident-graph, gathered-graph",
                                (int)len, p);
        o->variant[found] = 1;
        p += len;
        if (*p == ',') p++;
    }
    for (int v = 0; v < V_COUNT; v++)
        if (o->variant[v]) return 0;
    return etp_cli_fail(cli, "--variants: the list is empty");
}

/* Sizes the options left open, per backend, and the grid. 0, or 2 after a
 * message on rank 0. */
static int complete(bench_t *b, layer_opts_t *o)
{
    const int gpu = b->backend == ETP_BACKEND_CUDA;
    if (!o->hidden) o->hidden = gpu ? 4096 : 64;
    if (!o->ffn) o->ffn = gpu ? 4096 : 128;
    if (!o->experts) o->experts = gpu ? 64 : 8;
    if (!o->topk) o->topk = gpu ? 8 : 2;
    if (!o->tokens) o->tokens = gpu ? 8192 : 64;
    const char *bad = NULL;
    char msg[160];
    if (!o->etp && !o->ep) {
        o->etp = b->size % 2 == 0 ? 2 : 1;
        o->ep = b->size / o->etp;
    } else if (!o->etp) {
        o->etp = b->size % o->ep == 0 ? b->size / o->ep : 0;
    } else if (!o->ep) {
        o->ep = b->size % o->etp == 0 ? b->size / o->etp : 0;
    }
    if (o->etp < 1 || o->ep < 1) {
        snprintf(msg, sizeof msg, "--%s %ld does not divide the %d ranks", o->etp ? "etp" : "ep",
                 o->etp ? o->etp : o->ep, b->size);
        bad = msg;
    } else if (b->size % (o->etp * o->ep) != 0) {
        snprintf(msg, sizeof msg, "--etp %ld x --ep %ld does not divide the %d ranks", o->etp,
                 o->ep, b->size);
        bad = msg;
    } else if (o->experts % o->ep != 0) {
        snprintf(msg, sizeof msg, "--experts %ld is not a multiple of the EP size %ld",
                 o->experts, o->ep);
        bad = msg;
    } else if (o->topk > o->experts) {
        snprintf(msg, sizeof msg, "--topk %ld is more than --experts %ld", o->topk, o->experts);
        bad = msg;
    } else if (o->hidden % 32 || o->ffn % 32) {
        bad = "--hidden and --ffn must be multiples of 32";
    }
    if (bad) {
        if (b->rank == 0) fprintf(stderr, "etp-bench layer: %s\n", bad);
        return 2;
    }
    return 0;
}

int etp_bench_layer(bench_t *b, int argc, char **argv)
{
    layer_opts_t o;
    memset(&o, 0, sizeof o);
    etp_cli_t cli = bench_cli(b, "layer", layer_about, layer_opts, argc, argv);
    int key;
    while ((key = bench_next(b, &cli)) >= 0) {
        int bad = 0;
        const char *a = cli.arg;
        switch (key) {
        case O_HIDDEN: bad = bench_long(b, cli.opt, a, 32, 1L << 16, &o.hidden); break;
        case O_FFN: bad = bench_long(b, cli.opt, a, 32, 1L << 16, &o.ffn); break;
        case O_EXPERTS: bad = bench_long(b, cli.opt, a, 1, 1024, &o.experts); break;
        case O_TOPK: bad = bench_long(b, cli.opt, a, 1, 64, &o.topk); break;
        case O_TOKENS: bad = bench_long(b, cli.opt, a, 1, 1L << 22, &o.tokens); break;
        case O_ETP: bad = bench_long(b, cli.opt, a, 1, 1 << 20, &o.etp); break;
        case O_EP: bad = bench_long(b, cli.opt, a, 1, 1 << 20, &o.ep); break;
        case O_TRANSPORT:
            if (!strcmp(a, "exact")) o.transport = ETP_EP_TRANSPORT_EXACT;
            else if (!strcmp(a, "capacity")) o.transport = ETP_EP_TRANSPORT_CAPACITY;
            else bad = etp_cli_fail(&cli, "--transport: exact or capacity, not '%s'", a) != 0;
            break;
        case O_CAPACITY: bad = bench_double(b, cli.opt, a, 0.0, 1e6, &o.capacity); break;
        case O_QUANT:
            if (!strcmp(a, "none")) o.quant = TRAIN_QUANT_NONE;
            else if (!strcmp(a, "mxfp8")) o.quant = TRAIN_QUANT_MXFP8;
            else if (!strcmp(a, "nvfp4")) o.quant = TRAIN_QUANT_NVFP4;
            else bad = etp_cli_fail(&cli, "--quant: none, mxfp8 or nvfp4, not '%s'", a) != 0;
            break;
        case O_VARIANTS: bad = parse_variants(&cli, a, &o) != 0; break;
        case O_SEED: bad = bench_long(b, cli.opt, a, 0, 1L << 62, &o.seed); break;
        case O_DEPTH: bad = bench_long(b, cli.opt, a, 0, 64, &o.depth); break;
        }
        if (bad) return 2;
    }
    if (key != ETP_CLI_END) return bench_stop(key);
    bench_start(b);
    int rc = complete(b, &o);
    if (rc != 0) return rc;
    etp_stream_t *s = NULL;
    BENCH_CHECK(b, etp_stream_create(b->ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    if (b->rank == 0)
        printf("etp-bench layer: etp %ld x ep %ld x dp %ld, H %ld, F %ld, %ld experts, top-%ld, "
               "%ld tokens a rank; in the rows 'bytes' are FLOPs and 'GB/s' GFLOP/s\n",
               o.etp, o.ep, b->size / (o.etp * o.ep), o.hidden, o.ffn, o.experts, o.topk,
               o.tokens);
    if (o.variant[V_GEMM]) run_gemm(b, s, &o);
    run_layer(b, s, &o);
    BENCH_CHECK(b, etp_stream_destroy(s));
    return 0;
}
