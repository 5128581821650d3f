/*
 * Sharded parameters and chains on the host backend, in shuffle mode, for
 * every seed of the fixed list: forward and backward gathers equal the full
 * weights; gradients over 5 steps of 2 micro-batches equal a single-rank
 * reference computed here without etp; each completion callback fires once a
 * step. Then one test per ordering edge: removing it (a test-only switch)
 * gives wrong numbers for seed 0, which runs producers as late as allowed.
 */
#include <math.h>

#include "core/half.h"
#include "mpi_util.h"
#include "shard/shard_internal.h"
#include "test_shard_layout.h"

static const int64_t seeds[] = {0, 1, 2, 3, 42, 1234, 99991};
#define NSEEDS (sizeof seeds / sizeof seeds[0])

typedef struct {
    int64_t experts, rows, cols;
    int alignment;
    etp_dtype_t dtype, wgrad;
    int upcast, master;
} spec_t;

/* Mixed shapes: rows not divisible by the group size, alignment 0, 1, 16,
 * 32, grouped experts, ranks holding padding only, BF16 and FP32, upcasts. */
static const spec_t specs[] = {
    {1, 37, 8, 0, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 1},
    {1, 64, 16, 1, ETP_DTYPE_BF16, ETP_DTYPE_BF16, 0, 0},
    {1, 5, 12, 16, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 0},
    {4, 23, 8, 32, ETP_DTYPE_BF16, ETP_DTYPE_BF16, 1, 1},
    {1, 100, 4, 0, ETP_DTYPE_BF16, ETP_DTYPE_F32, 0, 0},
    {3, 9, 10, 1, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 0},
    {1, 1, 33, 0, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 0},
    {2, 50, 6, 16, ETP_DTYPE_BF16, ETP_DTYPE_BF16, 0, 0},
    {1, 31, 31, 0, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 0},
    {8, 7, 5, 0, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 0},
    {1, 128, 2, 32, ETP_DTYPE_BF16, ETP_DTYPE_BF16, 1, 0},
    {1, 13, 9, 1, ETP_DTYPE_F32, ETP_DTYPE_F32, 0, 1},
};
#define NSPECS (sizeof specs / sizeof specs[0])

/* Small integers: exact in BF16, and their sums over ranks too. */
static float weight(int p, int step, int64_t e, int64_t r, int64_t c)
{
    return (float)((int64_t)(tu_rand(g_seed, 100 + (uint64_t)p, (uint64_t)step,
                                     (uint64_t)((e * 1000 + r) * 1000 + c)) % 17) - 8);
}

static float wgrad(int p, int step, int micro, int rank, int64_t i)
{
    return (float)((int64_t)(tu_rand(g_seed, 200 + (uint64_t)p,
                                     (uint64_t)((step * 8 + micro) * 64 + rank), (uint64_t)i) % 9) - 4);
}

/* Parameter i's layout on this rank, from its spec (the tests' groups are
 * the world, ranks in world order). */
static tu_shard_layout_t spec_layout(int i)
{
    return tu_shard_layout(specs[i].experts, specs[i].rows, specs[i].alignment, g_size, g_rank);
}

static void put(void *buf, etp_dtype_t t, size_t i, float v)
{
    if (t == ETP_DTYPE_BF16)
        ((uint16_t *)buf)[i] = etp__f32_to_bf16(v);
    else
        ((float *)buf)[i] = v;
}

static float get(const void *buf, etp_dtype_t t, size_t i)
{
    return t == ETP_DTYPE_BF16 ? etp__bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world, *tp;
    etp_stream_t *main;
    etp_chain_t *chain;
    etp_param_t *p[NSPECS];
    int nparams;
    int callbacks[NSPECS];
    int bad_callback_stream;
    /* host buffers that deferred (shuffle-mode) work reads or writes */
    void *keep[4 * NSPECS * 8];
    int nkeep;
} run_t;

static void *keep(run_t *r, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    r->keep[r->nkeep++] = p;
    return p;
}

static void drop_kept(run_t *r)
{
    for (int i = 0; i < r->nkeep; i++) free(r->keep[i]);
    r->nkeep = 0;
}

static void on_grad(void *user, etp_param_t *param, etp_stream_t *final_stream)
{
    run_t *r = user;
    etp_stream_t *rs = NULL;
    etp_chain_streams(r->chain, NULL, &rs);
    if (final_stream != rs) r->bad_callback_stream++;
    for (int i = 0; i < r->nparams; i++)
        if (r->p[i] == param) r->callbacks[i]++;
}

enum {
    RUN_GRAPHED = 1,
    RUN_PREFETCH_ON_UPDATE = 2,
    RUN_DEFER_ZERO = 4,
    RUN_EAGER = 8,
    RUN_WHOLE_STEP = 16,
    RUN_KEEP = 32 /* keep_bytes: every weight kept from forward to backward */
};

static void open_run(run_t *r, int64_t seed, int nparams, int depth, int ring, unsigned skip,
                     int mode)
{
    memset(r, 0, sizeof *r);
#ifdef ETP_SHARD_TEST_CUDA
    r->ctx = tu_test_ctx(seed);
#else
    r->ctx = (mode & RUN_EAGER) ? tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, seed, -1, -1)
                                : tu_test_ctx(seed);
#endif
    ETP_OK(etp_context_world(r->ctx, &r->world));
    r->tp = tu_test_tp(r->ctx, "etp");
    ETP_OK(etp_stream_create(r->ctx, ETP_STREAM_PRIORITY_NORMAL, &r->main));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.name = "layers";
    cc.group = r->tp;
    cc.depth = depth;
    cc.wgrad_ring = ring;
    cc.num_microbatches = 2;
    cc.graphed = (mode & RUN_GRAPHED) != 0;
    cc.graph_whole_step = (mode & RUN_WHOLE_STEP) != 0;
    cc.prefetch_on_update = (mode & RUN_PREFETCH_ON_UPDATE) != 0;
    cc.defer_zero_grad = (mode & RUN_DEFER_ZERO) != 0;
    cc.keep_bytes = (mode & RUN_KEEP) ? SIZE_MAX : 0;
    ETP_OK(etp_chain_create(r->ctx, &cc, &r->chain));
    r->nparams = nparams;
    for (int i = 0; i < nparams; i++) {
        const spec_t *s = &specs[i];
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        pc.name = name;
        pc.group = r->tp;
        pc.experts = s->experts;
        pc.rows = s->rows;
        pc.cols = s->cols;
        pc.alignment = s->alignment;
        pc.dtype = s->dtype;
        pc.wgrad_dtype = s->wgrad;
        pc.upcast_wgrad = s->upcast;
        pc.master = s->master;
        ETP_OK(etp_param_create(r->ctx, &pc, &r->p[i]));
        (void)tu_assert_shard_layout(r->p[i], &pc, g_size, g_rank);
        ETP_OK(etp_param_set_grad_callback(r->p[i], on_grad, r));
        ETP_OK(etp_chain_add(r->chain, r->p[i]));
    }
    ETP_OK(etp_chain_finalize(r->chain));
    etp__chain_test_skip_edges(r->chain, skip);
}

/* Everything done, then the chain destroyed. */
static void close_chain(run_t *r)
{
    etp_stream_t *ag, *rs;
    ETP_OK(etp_chain_streams(r->chain, &ag, &rs));
    ETP_OK(etp_stream_synchronize(ag));
    ETP_OK(etp_stream_synchronize(rs));
    ETP_OK(etp_stream_synchronize(r->main));
    drop_kept(r);
    ETP_OK(etp_chain_destroy(r->chain));
    r->chain = NULL;
}

static void close_run(run_t *r)
{
    if (r->chain) close_chain(r);
    drop_kept(r);
    for (int i = 0; i < r->nparams; i++) ETP_OK(etp_param_destroy(r->p[i]));
    ETP_OK(etp_stream_destroy(r->main));
    tu_test_tp_done(r->tp);
    tu_test_ctx_done(r->ctx);
}

/* Load step `step`'s weights (every rank passes the full tensor). */
static void load_weights(run_t *r, int step)
{
    for (int i = 0; i < r->nparams; i++) {
        const spec_t *s = &specs[i];
        size_t n = (size_t)(s->experts * s->rows * s->cols);
        void *full = keep(r, n * etp_dtype_size(s->dtype));
        for (int64_t e = 0; e < s->experts; e++)
            for (int64_t row = 0; row < s->rows; row++)
                for (int64_t c = 0; c < s->cols; c++)
                    put(full, s->dtype, (size_t)((e * s->rows + row) * s->cols + c),
                        weight(i, step, e, row, c));
        ETP_OK(etp_param_load_full(r->p[i], full, r->main));
    }
}

/* Gather p for `pass`, copy the weight out on main, release. Returns the
 * host copy (valid after main is synchronized). */
static void *gather_copy(run_t *r, int i, etp_pass_t pass)
{
    const spec_t *s = &specs[i];
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_gather(r->p[i], pass, r->main, &v));
    assert_int_equal(v.rows, s->rows);
    assert_int_equal(v.cols, s->cols);
    assert_int_equal(v.experts, s->experts);
    assert_int_equal(v.ld, s->cols);
    size_t es = etp_dtype_size(s->dtype), per = (size_t)(s->rows * s->cols);
    void *out = keep(r, (size_t)s->experts * per * es);
    tu_poison(out, (size_t)s->experts * per * es);
    for (int64_t e = 0; e < s->experts; e++)
        ETP_OK(etp_memcpy_async(r->main, (char *)out + (size_t)e * per * es,
                                (char *)v.data + (size_t)(e * v.expert_stride) * es, per * es));
    ETP_OK(etp_release(r->p[i], pass, r->main));
    return out;
}

static long count_weight_errors(int i, int step, const void *got)
{
    const spec_t *s = &specs[i];
    long bad = 0;
    for (int64_t e = 0; e < s->experts; e++)
        for (int64_t row = 0; row < s->rows; row++)
            for (int64_t c = 0; c < s->cols; c++)
                bad += get(got, s->dtype, (size_t)((e * s->rows + row) * s->cols + c)) !=
                       weight(i, step, e, row, c);
    return bad;
}

/* Write micro-batch m's wgrad of p into a ring buffer on main and reduce. */
static void produce_grad(run_t *r, int i, int step, int m)
{
    const spec_t *s = &specs[i];
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_wgrad_buffer(r->p[i], r->main, &v));
    assert_int_equal(v.dtype, s->wgrad);
    size_t es = etp_dtype_size(s->wgrad), per = (size_t)(s->rows * s->cols);
    void *src = keep(r, (size_t)s->experts * per * es);
    for (size_t k = 0; k < (size_t)s->experts * per; k++) put(src, s->wgrad, k, wgrad(i, step, m, g_rank, (int64_t)k));
    for (int64_t e = 0; e < s->experts; e++)
        ETP_OK(etp_memcpy_async(r->main, (char *)v.data + (size_t)(e * v.expert_stride) * es,
                                (char *)src + (size_t)e * per * es, per * es));
    ETP_OK(etp_reduce_grad(r->p[i], r->main, 0.5f));
}

/* main_grad of p after `step` (2 micro-batches of scale 0.5), on this rank. */
static long count_grad_errors(int i, int step, const float *got)
{
    const spec_t *s = &specs[i];
    const tu_shard_layout_t l = spec_layout(i);
    long bad = 0;
    for (int64_t e = 0; e < s->experts; e++)
        for (int64_t row = 0; row < l.shard_rows; row++)
            for (int64_t c = 0; c < s->cols; c++) {
                int64_t grow = l.shard_row_begin + row;
                float want = 0;
                if (grow < s->rows)
                    for (int m = 0; m < 2; m++) {
                        float sum = 0;
                        for (int q = 0; q < g_size; q++)
                            sum += wgrad(i, step, m, q, (e * s->rows + grow) * s->cols + c);
                        want += 0.5f * sum;
                    }
                bad += got[(e * l.shard_rows + row) * s->cols + c] != want;
            }
    return bad;
}

/* Steps of the full protocol; returns the number of wrong elements seen
 * (the same on every rank). */
static long run_steps(run_t *r, int steps)
{
    long bad = 0;
    for (int step = 0; step < steps; step++) {
        memset(r->callbacks, 0, sizeof r->callbacks);
        ETP_OK(etp_zero_grad(r->chain, r->main));
        load_weights(r, step);
        void *seen[2][2][NSPECS];
        for (int m = 0; m < 2; m++) {
            for (int i = 0; i < r->nparams; i++) seen[m][0][i] = gather_copy(r, i, ETP_PASS_FORWARD);
            for (int i = r->nparams - 1; i >= 0; i--) {
                seen[m][1][i] = gather_copy(r, i, ETP_PASS_BACKWARD);
                produce_grad(r, i, step, m);
            }
        }
        ETP_OK(etp_wait_grads(r->chain, r->main));
        float *grads[NSPECS];
        for (int i = 0; i < r->nparams; i++) {
            etp_param_info_t info = ETP_PARAM_INFO_INIT;
            ETP_OK(etp_param_info(r->p[i], &info));
            const tu_shard_layout_t l = spec_layout(i);
            size_t n = (size_t)(l.experts * l.shard_rows * specs[i].cols);
            grads[i] = keep(r, n * sizeof(float));
            tu_poison(grads[i], n * sizeof(float));
            ETP_OK(etp_memcpy_async(r->main, grads[i], info.main_grad, n * sizeof(float)));
        }
        ETP_OK(etp_stream_synchronize(r->main));
        for (int m = 0; m < 2; m++)
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < r->nparams; i++) {
                    long b = count_weight_errors(i, step, seen[m][pass][i]);
                    if (b && getenv("ETP_TEST_VERBOSE")) printf("rank %d step %d micro %d pass %d param %d: %ld weight errors\n", g_rank, step, m, pass, i, b);
                    bad += b;
                }
        for (int i = 0; i < r->nparams; i++) {
            long b = count_grad_errors(i, step, grads[i]);
            if (b && getenv("ETP_TEST_VERBOSE")) printf("rank %d step %d param %d: %ld grad errors\n", g_rank, step, i, b);
            bad += b;
            assert_int_equal(r->callbacks[i], 1);
        }
        assert_int_equal(r->bad_callback_stream, 0);
        drop_kept(r);
    }
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return all;
}

static void test_chain_every_seed(void **state)
{
    (void)state;
    for (size_t k = 0; k < NSEEDS; k++) {
        run_t r;
        open_run(&r, seeds[k], (int)NSPECS, 1 + (int)(k % 3), 2, 0, 0);
        etp_cache_report_t rep = ETP_CACHE_REPORT_INIT;
        ETP_OK(etp_chain_cache_report(r.chain, &rep));
        assert_int_equal(rep.tickets, 2 * (int)NSPECS);
        /* a group of one gathers views of the shards: no slots */
        assert_int_equal(rep.slots, g_size > 1 ? 2 + (int)(k % 3) : 0);
        assert_true(rep.slot_bytes >= rep.lower_bound_bytes);
        long bad = run_steps(&r, 5);
        if (bad && g_rank == 0) printf("seed %lld: %ld wrong elements\n", (long long)seeds[k], bad);
        assert_int_equal(bad, 0);
        close_run(&r);
    }
}

/* A graphed chain (side streams forked from the caller's at each gather and
 * reduction, no prefetch across forward -> backward) is as correct, in
 * shuffle mode, over several seeds and prefetch depths. */
static void test_graphed_chain(void **state)
{
    (void)state;
    const int64_t gseeds[] = {0, 42, 99991};
    for (size_t k = 0; k < sizeof gseeds / sizeof gseeds[0]; k++) {
        run_t r;
        open_run(&r, gseeds[k], (int)NSPECS, 1 + (int)k, 2, 0, RUN_GRAPHED);
        assert_int_equal(run_steps(&r, 3), 0);
        close_run(&r);
    }
}

/* Gathers that start at the weights' updates (prefetch_on_update): as
 * correct, in shuffle mode, over seeds and depths; the head of the chain is
 * issued by the updates themselves, before the step's first gather. */
static void test_prefetch_on_update(void **state)
{
    (void)state;
    const int64_t pseeds[] = {0, 1, 42};
    for (size_t k = 0; k < sizeof pseeds / sizeof pseeds[0]; k++) {
        run_t r;
        const int depth = 1 + (int)k;
        open_run(&r, pseeds[k], (int)NSPECS, depth, 2, 0, RUN_PREFETCH_ON_UPDATE);
        assert_int_equal(run_steps(&r, 4), 0);
        /* between steps, updates issue the first `depth` forward gathers */
        load_weights(&r, 9);
        for (int i = 0; i < (int)NSPECS; i++)
            assert_int_equal(r.chain->tickets[r.p[i]->ticket[ETP_PASS_FORWARD]].state,
                             i < depth ? ETP__TICKET_ISSUED : ETP__TICKET_IDLE);
        ETP_OK(etp_stream_synchronize(r.main));
        drop_kept(&r);
        close_run(&r);
    }
}

/* Deferred zero_grad: each step's first reduction stores, the second adds,
 * so that 5 steps of 2 micro-batches (each step's main_grad unlike the
 * last's) equal the reference; a step without reductions leaves zeros at
 * etp_wait_grads, and the grad norm sees them. */
static long count_nonzero(run_t *r)
{
    long nz = 0;
    for (int i = 0; i < r->nparams; i++) {
        etp_param_info_t info = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(r->p[i], &info));
        size_t n = (size_t)(info.experts * info.shard_rows * info.cols);
        float *g = keep(r, n * sizeof(float));
        tu_poison(g, n * sizeof(float));
        ETP_OK(etp_memcpy_async(r->main, g, info.main_grad, n * sizeof(float)));
        ETP_OK(etp_stream_synchronize(r->main));
        for (size_t k = 0; k < n; k++) nz += g[k] != 0.0f;
    }
    drop_kept(r);
    return nz;
}

static void test_defer_zero_grad(void **state)
{
    (void)state;
    const int64_t dseeds[] = {0, 3, 42};
    for (size_t k = 0; k < sizeof dseeds / sizeof dseeds[0]; k++) {
        run_t r;
        open_run(&r, dseeds[k], (int)NSPECS, 1 + (int)k, 2, 0, RUN_DEFER_ZERO);
        assert_int_equal(run_steps(&r, 5), 0);
        assert_true(count_nonzero(&r) > 0);
        ETP_OK(etp_zero_grad(r.chain, r.main));
        ETP_OK(etp_wait_grads(r.chain, r.main));
        assert_int_equal(count_nonzero(&r), 0);
        /* and through the norm, without etp_wait_grads */
        assert_int_equal(run_steps(&r, 1), 0);
        ETP_OK(etp_zero_grad(r.chain, r.main));
        double sumsq = -1;
        int64_t nonfinite = -1;
        ETP_OK(etp_chain_grad_stats(r.chain, &sumsq, &nonfinite));
        assert_true(sumsq == 0.0);
        assert_int_equal(nonfinite, 0);
        /* and at the chain's destruction, the parameters outliving it */
        assert_int_equal(run_steps(&r, 1), 0);
        assert_true(count_nonzero(&r) > 0);
        ETP_OK(etp_zero_grad(r.chain, r.main));
        close_chain(&r);
        assert_int_equal(count_nonzero(&r), 0);
        close_run(&r);
    }
}

/* Grad norm over the chain equals the sum computed from the reference. */
static void test_grad_stats(void **state)
{
    (void)state;
    run_t r;
    open_run(&r, 7, 5, 1, 2, 0, 0);
    assert_int_equal(run_steps(&r, 1), 0);
    double sumsq = -1;
    int64_t nonfinite = -1;
    ETP_OK(etp_chain_grad_stats(r.chain, &sumsq, &nonfinite));
    double want = 0;
    for (int i = 0; i < 5; i++) {
        const spec_t *s = &specs[i];
        for (int64_t k = 0; k < s->experts * s->rows * s->cols; k++) {
            double g = 0;
            for (int m = 0; m < 2; m++)
                for (int q = 0; q < g_size; q++) g += 0.5 * wgrad(i, 0, m, q, k);
            want += g * g;
        }
    }
    assert_true(sumsq == want);
    assert_int_equal(nonfinite, 0);
    close_run(&r);
}

#ifndef ETP_SHARD_TEST_CUDA
/* Each edge, removed, gives wrong numbers under seed 0; present, right ones. */
static void check_edge_kind(unsigned edge, const char *name, int graphed)
{
    run_t r;
    /* The run without the edge reads gather slots nobody wrote: that is the
     * point of it, and what memcheck reports; its runs set this variable
     * and keep only the run with the edge. */
    const char *keep = getenv("ETP_TEST_SHARD_KEEP_EDGES");
    if (keep && strcmp(keep, "1") == 0) {
        if (g_rank == 0) printf("without edge %s: not run (ETP_TEST_SHARD_KEEP_EDGES=1)\n", name);
    } else {
        open_run(&r, 0, 4, 1, 2, edge, graphed);
        long bad = run_steps(&r, 2);
        if (g_rank == 0) printf("without edge %s: %ld wrong elements\n", name, bad);
        /* a group of one gathers views of the shards and sums its own
         * wgrads: only the ring's and the join's edges order anything that
         * runs beside the caller there */
        if (g_size > 1 || (edge & (ETP__EDGE_RING_REUSE | ETP__EDGE_GRADS_JOIN)))
            assert_true(bad > 0);
        close_run(&r);
    }
    open_run(&r, 0, 4, 1, 2, 0, graphed);
    assert_int_equal(run_steps(&r, 2), 0);
    close_run(&r);
}

static void check_edge(unsigned edge, const char *name)
{
    check_edge_kind(edge, name, 0);
}

static void test_edge_shard_writer(void **s) { (void)s; check_edge(ETP__EDGE_SHARD_WRITER, "shard writer"); }
static void test_edge_slot_release(void **s) { (void)s; check_edge(ETP__EDGE_SLOT_RELEASE, "slot release"); }
static void test_edge_gather_ready(void **s) { (void)s; check_edge(ETP__EDGE_GATHER_READY, "gather ready"); }
static void test_edge_wgrad_writer(void **s) { (void)s; check_edge(ETP__EDGE_WGRAD_WRITER, "wgrad writer"); }
static void test_edge_ring_reuse(void **s) { (void)s; check_edge(ETP__EDGE_RING_REUSE, "ring reuse"); }
static void test_edge_grads_join(void **s) { (void)s; check_edge(ETP__EDGE_GRADS_JOIN, "grads join"); }
/* An in-place gather copies the own shard on the caller's stream; the AG
 * stream waits for that copy before the peers read it. */
static void test_edge_copy_handoff(void **s)
{
    (void)s;
    const char *ce = getenv("ETP_COPY_ENGINE");
    if (ce && strcmp(ce, "0") == 0) skip(); /* plain memory: gathers are not in place, no copy */
    check_edge(ETP__EDGE_COPY_HANDOFF, "copy hand-off");
}
/* A graphed chain's fork of the AG stream from the caller's stands for both
 * the shard-writer and the slot-release edges. */
static void test_edge_graphed_fork(void **s) { (void)s; check_edge_kind(ETP__EDGE_SLOT_RELEASE, "graphed fork", RUN_GRAPHED); }
/* The prefetch an update issues waits for that update, and for the slot's
 * last reader of the previous step. */
static void test_edge_update_prefetch(void **s)
{
    (void)s;
    check_edge_kind(ETP__EDGE_SHARD_WRITER, "shard writer (prefetch on update)", RUN_PREFETCH_ON_UPDATE);
    check_edge_kind(ETP__EDGE_SLOT_RELEASE, "slot release (prefetch on update)", RUN_PREFETCH_ON_UPDATE);
}
#endif

/* A new, empty chain over 6 parameters (none added), to be recorded, on ctx. */
static void open_record_run(run_t *r, etp_context_t *ctx)
{
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    ETP_OK(etp_context_world(r->ctx, &r->world));
    r->tp = tu_test_tp(r->ctx, "etp");
    ETP_OK(etp_stream_create(r->ctx, ETP_STREAM_PRIORITY_NORMAL, &r->main));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = r->tp;
    cc.num_microbatches = 2;
    ETP_OK(etp_chain_create(r->ctx, &cc, &r->chain));
    r->nparams = 6;
    for (int i = 0; i < r->nparams; i++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = r->tp;
        pc.experts = specs[i].experts;
        pc.rows = specs[i].rows;
        pc.cols = specs[i].cols;
        pc.alignment = specs[i].alignment;
        pc.dtype = specs[i].dtype;
        pc.wgrad_dtype = specs[i].wgrad;
        pc.upcast_wgrad = specs[i].upcast;
        ETP_OK(etp_param_create(r->ctx, &pc, &r->p[i]));
        (void)tu_assert_shard_layout(r->p[i], &pc, g_size, g_rank);
        ETP_OK(etp_param_set_grad_callback(r->p[i], on_grad, r));
    }
}

/* A chain recorded during one eager step plans the same tickets. */
static void test_recorded_chain(void **state)
{
    (void)state;
    run_t r;
    open_record_run(&r, tu_test_ctx(3));
    /* The recording step is a real step: gathers and gradients work. */
    ETP_OK(etp_chain_begin_record(r.chain));
    assert_int_equal(run_steps(&r, 1), 0);
    ETP_OK(etp_chain_end_record(r.chain));
    etp_cache_report_t rep = ETP_CACHE_REPORT_INIT;
    ETP_OK(etp_chain_cache_report(r.chain, &rep));
    assert_int_equal(rep.tickets, 12);
    assert_int_equal(rep.slots, g_size > 1 ? 2 : 0);
    assert_int_equal(run_steps(&r, 3), 0);
    close_run(&r);
}

/* Misuse is an error with a message, and nothing is corrupted. */
static int all_poison_f(const float *p)
{
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < sizeof *p; i++)
        if (b[i] != 0xA5) return 0;
    return 1;
}

static void test_errors(void **state)
{
    (void)state;
    run_t r;
    open_run(&r, 1, 3, 1, 2, 0, 0);
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.group = r.tp;
    pc.rows = 8;
    pc.cols = 32;
    etp_param_t *loose;
    ETP_OK(etp_param_create(r.ctx, &pc, &loose));
    (void)tu_assert_shard_layout(loose, &pc, g_size, g_rank);
    ETP_EXPECT_MSG(etp_gather(loose, ETP_PASS_FORWARD, r.main, &v), ETP_ERR_INVALID_STATE,
                   "not in a finalized or recording chain");
    ETP_EXPECT_MSG(etp_release(r.p[0], ETP_PASS_FORWARD, r.main), ETP_ERR_INVALID_STATE,
                   "release without gather");
    ETP_EXPECT_MSG(etp_reduce_grad(r.p[0], r.main, 1.0f), ETP_ERR_INVALID_STATE, "no wgrad buffer");
    ETP_EXPECT_MSG(etp_chain_add(r.chain, loose), ETP_ERR_INVALID_STATE, "finalized");
    ETP_EXPECT_MSG(etp_param_destroy(r.p[0]), ETP_ERR_BUSY, "chain");
    /* the group outlives its parameters and chains: refused while used */
    ETP_EXPECT_MSG(etp_group_destroy(r.tp), ETP_ERR_BUSY, "parameter(s), chain(s)");
    ETP_EXPECT(etp_gather(r.p[0], (etp_pass_t)5, r.main, &v), ETP_ERR_INVALID_ARGUMENT);
    /* inside a batch, whose collectives launch only at its end: refused */
    ETP_OK(etp_batch_begin(r.ctx));
    ETP_EXPECT_MSG(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v), ETP_ERR_INVALID_STATE, "etp_batch_begin");
    ETP_EXPECT_MSG(etp_reduce_grad(r.p[0], r.main, 1.0f), ETP_ERR_INVALID_STATE, "etp_batch_begin");
    ETP_OK(etp_batch_end(r.ctx));
    /* holding a weight: a prefetch into its slot, or destroy, is refused */
    load_weights(&r, 0);
    ETP_OK(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v));
    ETP_EXPECT_MSG(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v), ETP_ERR_INVALID_STATE,
                   "not released");
    if (g_size > 1) {
        ETP_EXPECT_MSG(etp_gather(r.p[1], ETP_PASS_FORWARD, r.main, &v), ETP_ERR_INVALID_STATE,
                       "would overwrite slot");
    } else {
        /* views of the shards overwrite nothing */
        ETP_OK(etp_gather(r.p[1], ETP_PASS_FORWARD, r.main, &v));
        ETP_OK(etp_release(r.p[1], ETP_PASS_FORWARD, r.main));
    }
    ETP_EXPECT_MSG(etp_chain_destroy(r.chain), ETP_ERR_BUSY, "not released");
    ETP_OK(etp_release(r.p[0], ETP_PASS_FORWARD, r.main));
    etp_weight_view_t w = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_wgrad_buffer(r.p[2], r.main, &w));
    ETP_EXPECT_MSG(etp_wgrad_buffer(r.p[2], r.main, &w), ETP_ERR_INVALID_STATE, "not reduced");
    /* the ring's 2 entries both handed out: a third is refused, not shared */
    etp_weight_view_t w0 = ETP_WEIGHT_VIEW_INIT, w1 = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_wgrad_buffer(r.p[0], r.main, &w0));
    assert_ptr_not_equal(w0.data, w.data);
    w1.data = (void *)0x1;
    ETP_EXPECT_MSG(etp_wgrad_buffer(r.p[1], r.main, &w1), ETP_ERR_INVALID_STATE, "all handed out");
    assert_ptr_equal(w1.data, (void *)0x1);
    /* once p[0]'s is reduced, p[1] gets that entry, whatever the ring order */
    ETP_OK(etp_reduce_grad(r.p[0], r.main, 1.0f));
    ETP_OK(etp_wgrad_buffer(r.p[1], r.main, &w1));
    assert_ptr_equal(w1.data, w0.data);
    ETP_OK(etp_reduce_grad(r.p[1], r.main, 1.0f));
    ETP_EXPECT(etp_reduce_grad(r.p[2], r.main, INFINITY), ETP_ERR_INVALID_ARGUMENT);
    /* quantized modes: the alignment is checked first */
    etp_param_config_t q = pc;
    q.quant = ETP_PARAM_QUANT_NVFP4;
    q.alignment = 8;
    etp_param_t *bad = NULL;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &q, &bad), ETP_ERR_INVALID_ARGUMENT, "multiple of 16");
    q.quant = ETP_PARAM_QUANT_MXFP8;
    q.alignment = 16;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &q, &bad), ETP_ERR_INVALID_ARGUMENT, "multiple of 32");
    /* swizzled gathered scales: only for quantized gathers that keep scales */
    etp_param_config_t z = pc;
    z.swizzle_scales = 1;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &z, &bad), ETP_ERR_INVALID_ARGUMENT, "swizzle_scales needs");
    z.quant = ETP_PARAM_QUANT_MXFP8;
    z.alignment = 32;
    z.gather_dequantized = 1;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &z, &bad), ETP_ERR_INVALID_ARGUMENT, "swizzle_scales needs");
    z.gather_dequantized = 0;
    z.swizzle_scales = 2;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &z, &bad), ETP_ERR_INVALID_ARGUMENT, "expected 0 or 1");
    /* cached gathered scales: 0 or 1, quantized modes only */
    etp_param_config_t k = pc;
    k.cache_gathered_scales = 1;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &k, &bad), ETP_ERR_INVALID_ARGUMENT, "cache_gathered_scales needs");
    k.quant = ETP_PARAM_QUANT_NVFP4;
    k.alignment = 16;
    k.cache_gathered_scales = 3;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &k, &bad), ETP_ERR_INVALID_ARGUMENT, "cache_gathered_scales 3");
    assert_null(bad);
    pc.dtype = ETP_DTYPE_I32;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &pc, &bad), ETP_ERR_INVALID_ARGUMENT, "bf16 or f32");
    /* prefetch on update: 0 or 1, ungraphed chains only */
    etp_chain_config_t pcc = ETP_CHAIN_CONFIG_INIT;
    pcc.group = r.tp;
    etp_chain_t *no_chain = NULL;
    pcc.prefetch_on_update = 2;
    ETP_EXPECT_MSG(etp_chain_create(r.ctx, &pcc, &no_chain), ETP_ERR_INVALID_ARGUMENT, "expected 0 or 1");
    pcc.prefetch_on_update = 1;
    pcc.graphed = 1;
    ETP_EXPECT_MSG(etp_chain_create(r.ctx, &pcc, &no_chain), ETP_ERR_INVALID_ARGUMENT, "ungraphed chains");
    assert_null(no_chain);
    /* deferred zero_grad: 0 or 1, ungraphed chains only */
    pcc.prefetch_on_update = 0;
    pcc.graphed = 0;
    pcc.defer_zero_grad = 2;
    ETP_EXPECT_MSG(etp_chain_create(r.ctx, &pcc, &no_chain), ETP_ERR_INVALID_ARGUMENT, "expected 0 or 1");
    pcc.defer_zero_grad = 1;
    pcc.graphed = 1;
    ETP_EXPECT_MSG(etp_chain_create(r.ctx, &pcc, &no_chain), ETP_ERR_INVALID_ARGUMENT, "ungraphed chains");
    assert_null(no_chain);
    pc.dtype = ETP_DTYPE_BF16;
    pc.rows = 0;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &pc, &bad), ETP_ERR_INVALID_ARGUMENT, "shape");
    /* a single row padded to 2^30 rows of 2^34 columns: 2^64 elements */
    pc.rows = 1;
    pc.cols = (int64_t)1 << 34;
    pc.alignment = 1 << 30;
    ETP_EXPECT_MSG(etp_param_create(r.ctx, &pc, &bad), ETP_ERR_INVALID_ARGUMENT, "too large");
    assert_null(bad);
    /* a shard of padding only: one row over the group leaves the ranks past
     * the first without a valid row; they load from NULL (nothing is read),
     * the others are refused NULL, and the export still gives every row */
    {
        etp_param_config_t oc = ETP_PARAM_CONFIG_INIT;
        oc.group = r.tp;
        oc.name = "one_row";
        oc.experts = 2;
        oc.rows = 1;
        oc.cols = 4;
        oc.dtype = ETP_DTYPE_F32;
        etp_param_t *one = NULL;
        ETP_OK(etp_param_create(r.ctx, &oc, &one));
        etp_param_info_t oi = ETP_PARAM_INFO_INIT;
        ETP_OK(etp_param_info(one, &oi));
        const int empty = oi.valid_shard_rows == 0;
        assert_int_equal(empty, oi.shard_row_begin > 0);
        float sh[2 * 4 * 4], full[2 * 4 + 1];
        assert_true(oi.shard_rows * 2 * 4 <= (int64_t)(sizeof sh / sizeof sh[0]));
        for (int e = 0; e < 2; e++)
            for (int64_t i = 0; i < oi.shard_rows * 4; i++)
                sh[e * oi.shard_rows * 4 + i] = 1.0f + (float)(e * 10 + i);
        if (!empty)
            ETP_EXPECT_MSG(etp_param_load_shard(one, NULL, r.main), ETP_ERR_INVALID_ARGUMENT,
                           "'src' is NULL; 'one_row' has 1 valid rows");
        ETP_OK(etp_param_load_shard(one, empty ? NULL : sh, r.main));
        tu_poison(full, sizeof full);
        /* a parameter in no chain exports on the caller's stream and role 0,
         * which the chain's all-gather stream used last: an event orders them */
        etp_stream_t *ag0, *rs0;
        etp_event_t *ev;
        ETP_OK(etp_chain_streams(r.chain, &ag0, &rs0));
        ETP_OK(etp_event_create(r.ctx, &ev));
        ETP_OK(etp_event_record(ev, ag0));
        ETP_OK(etp_stream_wait_event(r.main, ev));
        ETP_OK(etp_param_export_full(one, full, r.main));
        ETP_OK(etp_event_destroy(ev));
        ETP_OK(etp_stream_synchronize(r.main));
        for (int e = 0; e < 2; e++)
            for (int c = 0; c < 4; c++) assert_true(full[e * 4 + c] == 1.0f + (float)(e * 10 + c));
        assert_true(all_poison_f(&full[8]));
        ETP_OK(etp_param_destroy(one));
    }
    ETP_OK(etp_param_destroy(loose));
    /* the reduction still goes through and the chain still works */
    ETP_OK(etp_reduce_grad(r.p[2], r.main, 1.0f));
    etp_stream_t *rs;
    ETP_OK(etp_chain_streams(r.chain, NULL, &rs));
    ETP_OK(etp_stream_synchronize(rs));
    ETP_OK(etp_zero_grad(r.chain, r.main));
    close_run(&r);
}

/* A weight updated after its prefetch was issued (within a step) is
 * gathered again: the view holds the update, in eager and shuffle modes. */
static void test_update_after_prefetch(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        run_t r;
        /* eager: each gather runs when issued, so a stale one shows */
        open_run(&r, 5, 3, 1, 2, 0, mode ? 0 : RUN_EAGER);
        load_weights(&r, 0);
        void *w0 = gather_copy(&r, 0, ETP_PASS_FORWARD); /* prefetches w1 at step 0's weights */
        load_weights(&r, 1);                             /* every weight updated after that */
        void *w1 = gather_copy(&r, 1, ETP_PASS_FORWARD);
        void *w2 = gather_copy(&r, 2, ETP_PASS_FORWARD);
        ETP_OK(etp_stream_synchronize(r.main));
        assert_int_equal(count_weight_errors(0, 0, w0), 0);
        assert_int_equal(count_weight_errors(1, 1, w1), 0);
        assert_int_equal(count_weight_errors(2, 1, w2), 0);
        for (int i = 2; i >= 0; i--) (void)gather_copy(&r, i, ETP_PASS_BACKWARD);
        ETP_OK(etp_stream_synchronize(r.main));
        close_run(&r);
    }
}

/* A forward-only step (evaluation) leaves a prefetched backward gather
 * nobody gathers; the next step's gathers into that slot wait for it (the
 * own shard's copy runs on the caller's stream, beside the all-gather
 * stream), so training steps after it are right. Seed 0 runs that stale
 * gather as late as allowed. */
static void test_forward_only_step(void **state)
{
    (void)state;
    for (size_t k = 0; k < NSEEDS; k++) {
        run_t r;
        open_run(&r, seeds[k], 3, 1, 2, 0, 0);
        load_weights(&r, 0);
        for (int i = 0; i < 3; i++) (void)gather_copy(&r, i, ETP_PASS_FORWARD); /* prefetches w2 backward */
        ETP_OK(etp_stream_synchronize(r.main));
        drop_kept(&r);
        long bad = run_steps(&r, 2);
        if (bad && g_rank == 0)
            printf("seed %lld, after a forward-only step: %ld wrong elements\n", (long long)seeds[k], bad);
        assert_int_equal(bad, 0);
        close_run(&r);
    }
}

/* Gathers that find their weight whole in its slot (gathered there last,
 * not updated since) issue no gather: at the turn from forward to backward
 * the last two weights (depth 1), and, between micro-batches, the first
 * forward gathers; a weight updated in between is gathered again, with the
 * new values. A graphed chain reuses only with graph_whole_step, within a
 * step (what a captured region uses is gathered inside it). With
 * keep_bytes unbounded every weight keeps a slot of its own: backward
 * gathers nothing unless updated. Every gather's data is checked. */
static void test_reuse_at_the_turn(void **state)
{
    (void)state;
    for (size_t k = 0; k < NSEEDS; k++)
        for (int v = 0; v < 5; v++) {
            /* 0-2: eager, graphed, graphed whole step; 3-4: eager and
             * graphed whole step keeping every weight (keep_bytes) */
            const int graphed = v < 3 ? v : 2 * (v - 3);
            const int keep = v >= 3;
            run_t r;
            open_run(&r, seeds[k], 3, 1, 2, 0,
                     (graphed == 2 ? RUN_GRAPHED | RUN_WHOLE_STEP
                      : graphed    ? RUN_GRAPHED
                                   : 0) |
                         (keep ? RUN_KEEP : 0));
            void *got[3];
            long bad = 0;
            /* per round: the weights' versions forward and backward, loaded
             * before the forward (the first two rounds) and again between
             * the passes where they differ */
            int reuses[3][2];
            const int round_ver[3][2] = {{0, 0}, {1, 2}, {2, 2}};
            for (int round = 0; round < 3; round++) {
                if (round < 2) load_weights(&r, round_ver[round][0]);
                for (int pass = 0; pass < 2; pass++) {
                    if (pass == 1 && round_ver[round][1] != round_ver[round][0])
                        load_weights(&r, round_ver[round][1]);
                    const int before = etp__chain_test_reuses(r.chain);
                    for (int j = 0; j < 3; j++) {
                        const int i = pass ? 2 - j : j;
                        got[i] = gather_copy(&r, i, pass ? ETP_PASS_BACKWARD : ETP_PASS_FORWARD);
                    }
                    reuses[round][pass] = etp__chain_test_reuses(r.chain) - before;
                    ETP_OK(etp_stream_synchronize(r.main));
                    for (int i = 0; i < 3; i++)
                        bad += count_weight_errors(i, round_ver[round][pass], got[i]);
                    drop_kept(&r);
                }
            }
            if (bad && g_rank == 0)
                printf("seed %lld%s%s: %ld wrong elements\n", (long long)seeds[k],
                       graphed == 2 ? " (graphed, whole step)"
                       : graphed    ? " (graphed)"
                                    : "",
                       keep ? " (kept)" : "", bad);
            assert_int_equal(bad, 0);
            if (g_size == 1) {
                /* views of the shards: nothing is ever found in a slot */
                for (int q = 0; q < 3; q++) assert_int_equal(reuses[q][0] + reuses[q][1], 0);
                close_run(&r);
                continue;
            }
            if (keep) {
                /* every weight backward; then the update between the passes
                 * leaves only the turn's prefetch; then, ungraphed, every
                 * gather of the round (each weight has a slot of its own) */
                assert_int_equal(reuses[0][0] + reuses[0][1], 3);
                assert_int_equal(reuses[1][0] + reuses[1][1], 1);
                assert_int_equal(reuses[2][0] + reuses[2][1], graphed ? 3 : 6);
                close_run(&r);
                continue;
            }
            /* graphed, forward and backward apart: none */
            const int split = graphed == 1;
            /* w2 and w1 backward (w2 found by the last forward gather's
             * prefetch, where prefetches cross the passes) */
            assert_int_equal(reuses[0][0] + reuses[0][1], split ? 0 : 2);
            /* all updated, and again between the passes: only that prefetch
             * of w2, which the update makes stale (its gather gathers) */
            assert_int_equal(reuses[1][0] + reuses[1][1], split ? 0 : 1);
            /* ungraphed: w0 and w1 forward too, from the last micro-batch */
            assert_int_equal(reuses[2][0] + reuses[2][1], split ? 0 : graphed ? 2 : 4);
            close_run(&r);
        }
}

/* Parameters of a finished chain (their main_grad holding its last step)
 * recorded into a new chain: the recording step's etp_zero_grad, called
 * before they join at their first gathers, zeroes them all the same. */
static void test_record_reused_params(void **state)
{
    (void)state;
    for (int defer = 0; defer < 2; defer++) {
        run_t r;
        open_run(&r, 1, 3, 1, 2, 0, defer ? RUN_DEFER_ZERO : 0);
        assert_int_equal(run_steps(&r, 1), 0);
        close_chain(&r);
        etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
        cc.group = r.tp;
        cc.num_microbatches = 2;
        cc.defer_zero_grad = defer;
        ETP_OK(etp_chain_create(r.ctx, &cc, &r.chain));
        ETP_OK(etp_chain_begin_record(r.chain));
        assert_int_equal(run_steps(&r, 1), 0);
        ETP_OK(etp_chain_end_record(r.chain));
        assert_int_equal(run_steps(&r, 1), 0);
        close_run(&r);
    }
}

#ifndef ETP_SHARD_TEST_CUDA
/* A destroyed chain leaves nothing on its parameters: a wgrad buffer it
 * handed out (never reduced) and the micro-batches it counted do not carry
 * over to the next chain, whose ring may be smaller. */
static void test_destroy_detaches(void **state)
{
    (void)state;
    run_t r;
    open_run(&r, 2, 2, 1, 4, 0, 0);
    load_weights(&r, 0);
    ETP_OK(etp_zero_grad(r.chain, r.main));
    for (int m = 0; m < 3; m++) produce_grad(&r, 0, 0, m % 2); /* p[0] counts 1 micro-batch of 2 */
    etp_weight_view_t w = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_wgrad_buffer(r.p[1], r.main, &w)); /* entry 3, never reduced */
    close_chain(&r);
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = r.tp;
    cc.wgrad_ring = 1;
    cc.num_microbatches = 2;
    ETP_OK(etp_chain_create(r.ctx, &cc, &r.chain));
    for (int i = 0; i < 2; i++) ETP_OK(etp_chain_add(r.chain, r.p[i]));
    ETP_OK(etp_chain_finalize(r.chain));
    /* a whole step on the new chain: every gradient, every callback once */
    assert_int_equal(run_steps(&r, 2), 0);
    close_run(&r);
}

/* A recording whose gather slots cannot be allocated, at a gather or at
 * etp_chain_end_record, is left as it was: the call fails with a status,
 * can be retried, and the chain then runs correct steps. */
static void test_record_out_of_memory(void **state)
{
    (void)state;
    /* a group of one allocates no gather slots to fail */
    if (g_size == 1) skip();
    /* gather slots fail to allocate while fail is set */
    tu_allocator_t a = {0};
    const unsigned fail = 1u << ETP_MEM_GATHER_SLOTS;
    run_t r;
    open_record_run(&r, tu_alloc_ctx(&a, ETP_HOST_STREAMS_SHUFFLE, 7));
    ETP_OK(etp_chain_begin_record(r.chain));
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    a.fail_mask = fail;
    ETP_EXPECT(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v), ETP_ERR_OUT_OF_MEMORY);
    a.fail_mask = 0;
    /* the recording step, its first gather retried, is a correct step */
    assert_int_equal(run_steps(&r, 1), 0);
    a.fail_mask = fail;
    ETP_EXPECT(etp_chain_end_record(r.chain), ETP_ERR_OUT_OF_MEMORY);
    /* still recording, without slots: its gathers are refused, not run */
    ETP_EXPECT_MSG(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v), ETP_ERR_INVALID_STATE,
                   "end_record failed");
    etp_chain_t *other = NULL;
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = r.tp;
    ETP_OK(etp_chain_create(r.ctx, &cc, &other));
    ETP_EXPECT_MSG(etp_chain_begin_record(other), ETP_ERR_INVALID_STATE, "recording on this context");
    ETP_OK(etp_chain_destroy(other));
    a.fail_mask = 0;
    ETP_OK(etp_chain_end_record(r.chain));
    etp_cache_report_t rep = ETP_CACHE_REPORT_INIT;
    ETP_OK(etp_chain_cache_report(r.chain, &rep));
    assert_int_equal(rep.tickets, 12);
    assert_int_equal(rep.slots, 2);
    assert_int_equal(run_steps(&r, 2), 0);
    close_run(&r);
}
#endif

#ifndef ETP_SHARD_TEST_CUDA
int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shard");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_every_seed),
        cmocka_unit_test(test_grad_stats),
        cmocka_unit_test(test_graphed_chain),
        cmocka_unit_test(test_prefetch_on_update),
        cmocka_unit_test(test_defer_zero_grad),
        cmocka_unit_test(test_recorded_chain),
        cmocka_unit_test(test_edge_shard_writer),
        cmocka_unit_test(test_edge_slot_release),
        cmocka_unit_test(test_edge_gather_ready),
        cmocka_unit_test(test_edge_wgrad_writer),
        cmocka_unit_test(test_edge_ring_reuse),
        cmocka_unit_test(test_edge_grads_join),
        cmocka_unit_test(test_edge_copy_handoff),
        cmocka_unit_test(test_edge_graphed_fork),
        cmocka_unit_test(test_edge_update_prefetch),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_update_after_prefetch),
        cmocka_unit_test(test_forward_only_step),
        cmocka_unit_test(test_reuse_at_the_turn),
        cmocka_unit_test(test_record_reused_params),
        cmocka_unit_test(test_destroy_detaches),
        cmocka_unit_test(test_record_out_of_memory),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
#endif
