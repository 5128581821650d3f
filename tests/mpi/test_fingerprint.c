/*
 * ETP_CHECK_COLLECTIVES: ranks that issue different collectives get an error
 * naming the first difference instead of a hang or corrupted data. Each case
 * aborts its context, so each makes a fresh one.
 */
#include "mpi_util.h"

static etp_context_t *checked_ctx(int mode)
{
    return tu_host_ctx(MPI_COMM_WORLD, mode, 0, 60.0, 1);
}

static void test_different_counts(void **state)
{
    (void)state;
    for (int mode = ETP_HOST_STREAMS_EAGER; mode <= ETP_HOST_STREAMS_SHUFFLE; mode++) {
        etp_context_t *ctx = checked_ctx(mode);
        etp_group_t *world;
        etp_stream_t *s;
        ETP_OK(etp_context_world(ctx, &world));
        ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
        float send[8], recv[64], kept[64];
        assert_true(2 * g_size <= 64);
        for (int i = 0; i < 8; i++) send[i] = (float)(tu_rand(g_seed, (uint64_t)mode, (uint64_t)g_rank, (uint64_t)i) % 1000);
        tu_poison(recv, sizeof recv);
        /* a matching one first: the check passes its data through untouched */
        ETP_OK(etp_allgather(world, 0, send, recv, 2, ETP_DTYPE_F32, s));
        ETP_OK(etp_stream_synchronize(s));
        for (int r = 0; r < g_size; r++)
            for (int i = 0; i < 2; i++)
                assert_true(recv[2 * r + i] == (float)(tu_rand(g_seed, (uint64_t)mode, (uint64_t)r, (uint64_t)i) % 1000));
        memcpy(kept, recv, sizeof recv);
        size_t count = g_rank == 1 ? 5 : 4;
        etp_status_t st = etp_allgather(world, 0, send, recv, count, ETP_DTYPE_F32, s);
        if (st == ETP_SUCCESS) st = etp_stream_synchronize(s);
        /* refused before any data moved */
        assert_memory_equal(recv, kept, sizeof recv);
        if (g_rank == 0) printf("mode %d: %s\n", mode, etp_last_error());
        assert_int_equal(st, ETP_ERR_COLLECTIVE_MISMATCH);
        const char *msg = etp_last_error();
        assert_non_null(strstr(msg, "group 'world'"));
        assert_non_null(strstr(msg, "seq 2"));
        assert_non_null(strstr(msg, "count 4"));
        assert_non_null(strstr(msg, "count 5"));
        if (g_rank <= 1) assert_non_null(strstr(msg, "rank 0 issued allgather count 4"));
        assert_non_null(strstr(msg, "differ in count)"));
        ETP_EXPECT(etp_context_check(ctx), ETP_ERR_ABORTED);
        ETP_OK(etp_stream_destroy(s));
        ETP_OK(etp_context_destroy(ctx));
    }
}

static void test_different_operations_and_types(void **state)
{
    (void)state;
    etp_context_t *ctx = checked_ctx(ETP_HOST_STREAMS_EAGER);
    etp_group_t *world;
    etp_stream_t *s;
    ETP_OK(etp_context_world(ctx, &world));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    double buf[16] = {0};
    etp_status_t st;
    if (g_rank == 0)
        st = etp_allreduce(world, 0, buf, buf, 4, ETP_DTYPE_F64, ETP_REDOP_SUM, s);
    else
        st = etp_allreduce(world, 0, buf, buf, 4, ETP_DTYPE_F32, ETP_REDOP_MAX, s);
    assert_int_equal(st, ETP_ERR_COLLECTIVE_MISMATCH);
    assert_non_null(strstr(etp_last_error(), "f64"));
    assert_non_null(strstr(etp_last_error(), "f32"));
    assert_non_null(strstr(etp_last_error(), "differ in dtype, reduction)"));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

/* All-to-all-v: a receive count that does not match what the peer sends. */
static void test_alltoallv_pair_mismatch(void **state)
{
    (void)state;
    etp_context_t *ctx = checked_ctx(ETP_HOST_STREAMS_EAGER);
    etp_group_t *world;
    etp_stream_t *s;
    ETP_OK(etp_context_world(ctx, &world));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    size_t sc[8], sd[8], rc[8], rd[8];
    int32_t send[64] = {0}, recv[64];
    for (int p = 0; p < g_size; p++) {
        sc[p] = 2;
        sd[p] = 2 * (size_t)p;
        rc[p] = 2;
        rd[p] = 2 * (size_t)p;
    }
    if (g_rank == 0) rc[1] = 3; /* rank 1 sends 2 */
    etp_status_t st = etp_alltoallv(world, 0, send, sc, sd, recv, rc, rd, ETP_DTYPE_I32, s);
    /* Only ranks 0 and 1 can see it; the verdict round stops the others. */
    if (st == ETP_SUCCESS) st = etp_stream_synchronize(s);
    assert_int_equal(st, ETP_ERR_COLLECTIVE_MISMATCH);
    assert_non_null(strstr(etp_last_error(), "alltoallv"));
    if (g_rank == 0) {
        /* both directions of the pair, lower rank first */
        assert_non_null(strstr(etp_last_error(), "rank 0 issued alltoallv expecting count 3 from "
                                                 "rank 1, rank 1 issued alltoallv sending count 2 "
                                                 "to rank 0"));
    }
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_fingerprint");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_different_counts),
        cmocka_unit_test(test_different_operations_and_types),
        cmocka_unit_test(test_alltoallv_pair_mismatch),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
