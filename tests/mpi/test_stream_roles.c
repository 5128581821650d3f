/*
 * One stream per (group, role) at a time. etp_param_export_full gathers
 * where the chain's prefetches go, so exporting after a load that
 * prefetched (prefetch_on_update) or in the middle of a step with a
 * prefetch pending gives the loaded weights on every shuffle seed; and
 * collectives of one (group, role) from two streams that no etp event
 * orders are refused, naming both streams.
 */
#include "mpi_util.h"

enum { NPARAMS = 2 };
static const struct {
    int64_t experts, rows, cols;
} specs[NPARAMS] = {{1, 13, 5}, {2, 7, 3}};

static size_t elems(int i)
{
    return (size_t)(specs[i].experts * specs[i].rows * specs[i].cols);
}

/* Weight i of `version`: the same on every rank. */
static float weight(int i, int version, size_t k)
{
    return (float)(tu_rand(g_seed, 100 + (uint64_t)version, (uint64_t)i, k) % 2001) / 8.0f - 125.0f;
}

typedef struct {
    etp_context_t *ctx;
    etp_group_t *tp;
    etp_stream_t *main;
    etp_chain_t *chain;
    etp_param_t *p[NPARAMS];
    float *src[NPARAMS], *out[NPARAMS];
} run_t;

static void run_make(run_t *r, int64_t seed)
{
    memset(r, 0, sizeof *r);
    r->ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, seed, -1, -1);
    r->tp = tu_test_tp(r->ctx, "etp");
    ETP_OK(etp_stream_create(r->ctx, ETP_STREAM_PRIORITY_NORMAL, &r->main));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.name = "layers";
    cc.group = r->tp;
    cc.depth = 1;
    cc.prefetch_on_update = 1;
    ETP_OK(etp_chain_create(r->ctx, &cc, &r->chain));
    for (int i = 0; i < NPARAMS; i++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.name = i ? "w1" : "w0";
        pc.group = r->tp;
        pc.experts = specs[i].experts;
        pc.rows = specs[i].rows;
        pc.cols = specs[i].cols;
        pc.dtype = ETP_DTYPE_F32;
        ETP_OK(etp_param_create(r->ctx, &pc, &r->p[i]));
        ETP_OK(etp_chain_add(r->chain, r->p[i]));
        r->src[i] = malloc(elems(i) * sizeof(float));
        r->out[i] = malloc(elems(i) * sizeof(float));
        assert_non_null(r->src[i]);
        assert_non_null(r->out[i]);
    }
    ETP_OK(etp_chain_finalize(r->chain));
}

static void run_free(run_t *r)
{
    ETP_OK(etp_stream_synchronize(r->main));
    ETP_OK(etp_chain_destroy(r->chain));
    for (int i = 0; i < NPARAMS; i++) {
        ETP_OK(etp_param_destroy(r->p[i]));
        free(r->src[i]);
        free(r->out[i]);
    }
    ETP_OK(etp_stream_destroy(r->main));
    tu_test_tp_done(r->tp);
    ETP_OK(etp_context_destroy(r->ctx));
}

static void load(run_t *r, int version)
{
    for (int i = 0; i < NPARAMS; i++) {
        for (size_t k = 0; k < elems(i); k++) r->src[i][k] = weight(i, version, k);
        ETP_OK(etp_param_load_full(r->p[i], r->src[i], r->main));
    }
}

/* Export parameter i now, and check it once the caller's stream is done. */
static void export_check(run_t *r, int i, int version, int64_t seed)
{
    tu_poison(r->out[i], elems(i) * sizeof(float));
    ETP_OK(etp_param_export_full(r->p[i], r->out[i], r->main));
    ETP_OK(etp_stream_synchronize(r->main));
    for (size_t k = 0; k < elems(i); k++)
        if (r->out[i][k] != weight(i, version, k))
            fail_msg("seed %lld: w%d version %d element %zu exported %g, loaded %g", (long long)seed,
                     i, version, k, (double)r->out[i][k], (double)weight(i, version, k));
}

static void test_export_during_prefetch(void **state)
{
    (void)state;
    for (int64_t seed = 0; seed <= 9; seed++) {
        run_t r;
        run_make(&r, seed);
        /* the loads' mark_updated prefetches w0 on the chain's stream */
        load(&r, 0);
        export_check(&r, 0, 0, seed);
        export_check(&r, 1, 0, seed);
        /* a step: w0's gather prefetches w1; export while it is pending */
        etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
        ETP_OK(etp_gather(r.p[0], ETP_PASS_FORWARD, r.main, &v));
        export_check(&r, 1, 0, seed);
        export_check(&r, 0, 0, seed);
        ETP_OK(etp_release(r.p[0], ETP_PASS_FORWARD, r.main));
        ETP_OK(etp_gather(r.p[1], ETP_PASS_FORWARD, r.main, &v));
        ETP_OK(etp_release(r.p[1], ETP_PASS_FORWARD, r.main));
        /* a new version, exported straight after its load */
        load(&r, 1);
        export_check(&r, 1, 1, seed);
        export_check(&r, 0, 1, seed);
        run_free(&r);
    }
}

/* Two streams, one (group, role), no event between: refused on every rank
 * alike (so the group stays in step), naming both streams; with the edge
 * declared, the same call works. */
static void two_streams(int mode, int check)
{
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, mode, 3, -1, check);
    etp_group_t *world;
    ETP_OK(etp_context_world(ctx, &world));
    etp_stream_t *s1, *s2;
    etp_event_t *ev;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s1)); /* stream #1 */
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s2)); /* stream #2 */
    ETP_OK(etp_event_create(ctx, &ev));
    float a[4], b[4], c[4];
    for (int i = 0; i < 4; i++) a[i] = (float)(g_rank * 10 + i);
    ETP_OK(etp_allreduce(world, 0, a, b, 4, ETP_DTYPE_F32, ETP_REDOP_SUM, s1));
    tu_poison(c, sizeof c);
    ETP_EXPECT_MSG(etp_allreduce(world, 0, a, c, 4, ETP_DTYPE_F32, ETP_REDOP_SUM, s2),
                   ETP_ERR_INVALID_STATE, "from stream #2, but stream #1 issued");
    ETP_EXPECT_MSG(etp_allgather(world, 0, a, c, 1, ETP_DTYPE_F32, s2), ETP_ERR_INVALID_STATE,
                   "record an event on stream #1");
    ETP_OK(etp_event_record(ev, s1));
    ETP_OK(etp_stream_wait_event(s2, ev));
    ETP_OK(etp_allreduce(world, 0, a, c, 4, ETP_DTYPE_F32, ETP_REDOP_SUM, s2));
    ETP_OK(etp_stream_synchronize(s2));
    for (int i = 0; i < 4; i++) {
        float want = 0;
        for (int r = 0; r < g_size; r++) want += (float)(r * 10 + i);
        assert_true(b[i] == want && c[i] == want);
    }
    ETP_OK(etp_context_check(ctx));
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_stream_destroy(s1));
    ETP_OK(etp_stream_destroy(s2));
    ETP_OK(etp_context_destroy(ctx));
}

static void test_two_streams_shuffle(void **state)
{
    (void)state;
    two_streams(ETP_HOST_STREAMS_SHUFFLE, 0);
}

static void test_two_streams_checked(void **state)
{
    (void)state;
    two_streams(ETP_HOST_STREAMS_EAGER, 1);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_stream_roles");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_during_prefetch),
        cmocka_unit_test(test_two_streams_shuffle),
        cmocka_unit_test(test_two_streams_checked),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
