/*
 * A call refused on one rank only: every rank ends with an error naming the
 * refusing rank and the call, nothing waits out the timeout, the refusing
 * rank's group is broken (its next collective fails at once quoting the
 * refusal; etp_context_check says so). A call refused on every rank alike
 * leaves the group in step. Host backend, 3 ranks, both stream modes.
 */
#include "mpi_util.h"

enum { REFUSER = 1, N = 8 };
static const double timeout_s = 5.0;

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
    int mode;
} fx_t;

static fx_t fx_make(int mode, int check)
{
    fx_t f = {.mode = mode};
    f.ctx = tu_host_ctx(MPI_COMM_WORLD, mode, 7, timeout_s, check);
    ETP_OK(etp_context_world(f.ctx, &f.world));
    ETP_OK(etp_stream_create(f.ctx, ETP_STREAM_PRIORITY_NORMAL, &f.s));
    return f;
}

static void fx_done(fx_t *f)
{
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
    MPI_Barrier(MPI_COMM_WORLD); /* the next context's creation has a short timeout */
}

static void has(const char *msg, const char *needle)
{
    if (!strstr(msg, needle)) fail_msg("rank %d: '%s' not in: %s", g_rank, needle, msg);
}

/* A correct all-reduce of fresh values, checked against the sum. */
static void allreduce_ok(fx_t *f, uint64_t salt)
{
    float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = (float)(tu_rand(g_seed, salt, (uint64_t)g_rank, (uint64_t)i) % 100);
    tu_poison(b, sizeof b);
    ETP_OK(etp_allreduce(f->world, 0, a, b, N, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < g_size; r++) want += (float)(tu_rand(g_seed, salt, (uint64_t)r, (uint64_t)i) % 100);
        assert_true(b[i] == want);
    }
}

/* The refusing rank's side after its refusal: the next collective on the
 * group fails at once (no timeout), quoting the refusal; so does the check. */
static void refuser_after(fx_t *f, const char *call, const char *why)
{
    float a[N] = {0}, b[N];
    etp_status_t st = etp_allreduce(f->world, 0, a, b, N, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s);
    printf("rank %d: next collective: %s: %s\n", g_rank, etp_status_string(st), etp_last_error());
    assert_int_equal(st, ETP_ERR_INVALID_STATE);
    const char *msg = etp_last_error();
    has(msg, "group 'world' is broken on this rank");
    has(msg, call);
    has(msg, why);
    has(msg, "a peer went on"); /* learnt from the peers, not from a timeout */
    ETP_EXPECT_MSG(etp_context_check(f->ctx), ETP_ERR_INVALID_STATE, why);
    /* still refused at once, and the stream itself is fine */
    ETP_EXPECT_MSG(etp_allgather(f->world, 0, a, b, 1, ETP_DTYPE_F32, f->s), ETP_ERR_INVALID_STATE,
                   why);
    ETP_OK(etp_stream_synchronize(f->s));
}

/* A peer's side: its collective fails naming rank 1 and the call. */
static void peer_failed(fx_t *f, etp_status_t st, const char *call, const char *why)
{
    printf("rank %d: %s: %s\n", g_rank, etp_status_string(st), etp_last_error());
    assert_int_equal(st, ETP_ERR_COLLECTIVE_MISMATCH);
    const char *msg = etp_last_error();
    has(msg, "rank 1 of group 'world'");
    has(msg, call);
    has(msg, why);
    ETP_EXPECT_MSG(etp_context_check(f->ctx), ETP_ERR_ABORTED, call);
}

static void allreduce_refused_on_one_rank(int mode, int check)
{
    fx_t f = fx_make(mode, check);
    allreduce_ok(&f, 1);
    float a[N] = {1, 2, 3, 4, 5, 6, 7, 8}, b[N];
    if (g_rank == REFUSER) {
        /* a dtype that is no etp_dtype_t, on this rank only */
        ETP_EXPECT_MSG(etp_allreduce(f.world, 0, a, b, N, (etp_dtype_t)77, ETP_REDOP_SUM, f.s),
                       ETP_ERR_INVALID_ARGUMENT, "dtype 77");
        MPI_Barrier(MPI_COMM_WORLD); /* the peers issue theirs after the refusal */
        refuser_after(&f, "etp_allreduce", "dtype 77");
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        etp_status_t st = etp_allreduce(f.world, 0, a, b, N, ETP_DTYPE_F32, ETP_REDOP_SUM, f.s);
        if (st == ETP_SUCCESS) st = etp_stream_synchronize(f.s);
        peer_failed(&f, st, "etp_allreduce", "dtype 77");
    }
    fx_done(&f);
}

static void test_allreduce_eager(void **state)
{
    (void)state;
    allreduce_refused_on_one_rank(ETP_HOST_STREAMS_EAGER, 0);
}

static void test_allreduce_shuffle(void **state)
{
    (void)state;
    allreduce_refused_on_one_rank(ETP_HOST_STREAMS_SHUFFLE, 0);
}

static void test_allreduce_checked(void **state)
{
    (void)state;
    allreduce_refused_on_one_rank(ETP_HOST_STREAMS_SHUFFLE, 1);
}

/* An EP call: rank 1's prepare is refused (a token count out of range);
 * the others' prepare exchanges the counts and fails (at once, or at the
 * next wait where the transport keeps the counts on the device: nvlink, the
 * default here, and capacity). */
static void test_ep_prepare(void **state)
{
    (void)state;
    fx_t f = fx_make(ETP_HOST_STREAMS_SHUFFLE, 0);
    etp_ep_group_config_t ec = ETP_EP_GROUP_CONFIG_INIT;
    ec.num_experts = g_size;
    ec.hidden = 32;
    ec.max_tokens_per_rank = 4;
    ec.max_topk = 1;
    ec.recv_capacity_per_rank = 4 * g_size;
    etp_ep_group_t *ep;
    ETP_OK(etp_ep_group_create(f.world, &ec, &ep));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    etp_ep_layer_t *ly;
    ETP_OK(etp_ep_layer_create(ep, &lc, &ly));
    allreduce_ok(&f, 2);
    if (g_rank == REFUSER) {
        ETP_EXPECT_MSG(etp_ep_prepare(ly, NULL, ETP_DTYPE_I64, 99, NULL, f.s),
                       ETP_ERR_INVALID_ARGUMENT, "num_tokens 99");
        MPI_Barrier(MPI_COMM_WORLD);
        refuser_after(&f, "etp_ep_prepare", "num_tokens 99");
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        etp_status_t st = etp_ep_prepare(ly, NULL, ETP_DTYPE_I64, 0, NULL, f.s);
        if (st == ETP_SUCCESS) st = etp_stream_synchronize(f.s);
        peer_failed(&f, st, "etp_ep_prepare", "num_tokens 99");
    }
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
    fx_done(&f);
}

/* Refused on every rank alike (twice, and once more after a good
 * collective): the group stays in step and computes right. */
static void test_refused_alike(void **state)
{
    (void)state;
    fx_t f = fx_make(ETP_HOST_STREAMS_SHUFFLE, 0);
    float a[N] = {0}, b[N];
    ETP_EXPECT(etp_allgather(f.world, 0, a, b, 1, (etp_dtype_t)77, f.s), ETP_ERR_INVALID_ARGUMENT);
    ETP_EXPECT(etp_allreduce(f.world, 0, NULL, b, 1, ETP_DTYPE_F32, ETP_REDOP_SUM, f.s),
               ETP_ERR_INVALID_ARGUMENT);
    allreduce_ok(&f, 3);
    ETP_EXPECT(etp_reduce_scatter(f.world, 0, a, b, 1, ETP_DTYPE_F32, (etp_redop_t)9, f.s),
               ETP_ERR_INVALID_ARGUMENT);
    allreduce_ok(&f, 4);
    ETP_OK(etp_context_check(f.ctx));
    fx_done(&f);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_refusal");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_eager),
        cmocka_unit_test(test_allreduce_shuffle),
        cmocka_unit_test(test_allreduce_checked),
        cmocka_unit_test(test_ep_prepare),
        cmocka_unit_test(test_refused_alike),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
