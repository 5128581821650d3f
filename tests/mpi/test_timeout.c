/*
 * No silent hangs: a collective one rank skips is reported as a timeout that
 * names the group, operation, sequence number and the rank that did not
 * arrive. The late rank issues its collective only after its peer has
 * reported, so the run drains and both exit cleanly.
 */
#include "mpi_util.h"

static void test_skipped_collective_times_out(void **state)
{
    (void)state;
    assert_int_equal(g_size, 2);
    const double timeout = 2.0;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, timeout, 0);
    etp_group_t *world;
    ETP_OK(etp_context_world(ctx, &world));
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    int send[4], recv[8];
    for (int i = 0; i < 4; i++) send[i] = (int)(tu_rand(g_seed, 3, (uint64_t)g_rank, (uint64_t)i) % 1000);

    /* One collective both issue, so the sequence number of the next is 2. */
    ETP_OK(etp_allgather(world, 0, send, recv, 4, ETP_DTYPE_I32, s));
    ETP_OK(etp_stream_synchronize(s));

    if (g_rank == 0) {
        double t0 = MPI_Wtime();
        etp_status_t st = etp_allgather(world, 0, send, recv, 4, ETP_DTYPE_I32, s);
        if (st == ETP_SUCCESS) st = etp_stream_synchronize(s);
        double took = MPI_Wtime() - t0;
        printf("rank 0: %s after %.2f s: %s\n", etp_status_string(st), took, etp_last_error());
        assert_int_equal(st, ETP_ERR_TIMEOUT);
        assert_true(took >= timeout && took < timeout + 30);
        const char *msg = etp_last_error();
        assert_non_null(strstr(msg, "allgather"));
        assert_non_null(strstr(msg, "seq 2"));
        assert_non_null(strstr(msg, "group 'world'"));
        assert_non_null(strstr(msg, "rank 1 of the group did not arrive"));
        /* The context is aborted: it says why, and refuses new work. */
        ETP_EXPECT_MSG(etp_context_check(ctx), ETP_ERR_ABORTED, "seq 2");
        ETP_EXPECT(etp_allreduce(world, 0, send, send, 4, ETP_DTYPE_I32, ETP_REDOP_SUM, s),
                   ETP_ERR_ABORTED);
        ETP_EXPECT(etp_stream_synchronize(s), ETP_ERR_ABORTED);
        /* Now let the peer come. */
        int token = 1;
        MPI_Send(&token, 1, MPI_INT, 1, 77, MPI_COMM_WORLD);
    } else {
        int token = 0;
        MPI_Recv(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        /* Rank 0 started its side before giving up, and its destroy drains
         * it, so this completes with rank 0's data. */
        tu_poison(recv, sizeof recv);
        ETP_OK(etp_allgather(world, 0, send, recv, 4, ETP_DTYPE_I32, s));
        ETP_OK(etp_stream_synchronize(s));
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 4; i++)
                assert_int_equal(recv[r * 4 + i], (int)(tu_rand(g_seed, 3, (uint64_t)r, (uint64_t)i) % 1000));
    }
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

/* A timeout in shuffle mode surfaces at the synchronization point. */
static void test_timeout_at_sync_in_shuffle_mode(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, 3, 1.0, 0);
    etp_group_t *world, *solo = NULL;
    ETP_OK(etp_context_world(ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "pair";
    ETP_OK(etp_group_split(world, 0, g_rank, &gc, &solo));
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    /* rank 1's values win the MAX in two places, rank 0's in one */
    float x[3] = {1, 2, 3};
    if (g_rank == 1) {
        x[0] = 5;
        x[2] = 7;
    }
    if (g_rank == 1) {
        ETP_OK(etp_allreduce(solo, 0, x, x, 3, ETP_DTYPE_F32, ETP_REDOP_MAX, s));
        ETP_EXPECT_MSG(etp_stream_synchronize(s), ETP_ERR_TIMEOUT, "group 'pair'");
        assert_non_null(strstr(etp_last_error(), "rank 0 of the group did not arrive"));
        int token = 1;
        MPI_Send(&token, 1, MPI_INT, 0, 78, MPI_COMM_WORLD);
    } else {
        int token = 0;
        MPI_Recv(&token, 1, MPI_INT, 1, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ETP_OK(etp_allreduce(solo, 0, x, x, 3, ETP_DTYPE_F32, ETP_REDOP_MAX, s));
        ETP_OK(etp_stream_synchronize(s));
        /* rank 1 started its side before giving up: this completes with its data */
        assert_true(x[0] == 5.0f && x[1] == 2.0f && x[2] == 7.0f);
    }
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_group_destroy(solo));
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_timeout");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skipped_collective_times_out),
        cmocka_unit_test(test_timeout_at_sync_in_shuffle_mode),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
