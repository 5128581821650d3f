/*
 * Shuffle mode catches a missing event wait, deterministically.
 *
 * The same small programs run with and without their etp_stream_wait_event:
 * with it, the result is right for every seed of the fixed list; without it,
 * the result is wrong for at least one seed (and, for seed 0, which runs
 * producers as late as allowed, always). Eager mode hides the bug, which is
 * why tests run in shuffle mode.
 */
#include "mpi_util.h"

/* The fixed list of scheduler seeds the tests use (docs/TESTING.md). */
static const int64_t seeds[] = {0, 1, 2, 3, 42, 1234, 99991};
#define NSEEDS (sizeof seeds / sizeof seeds[0])

/* Producer on one stream fills a buffer; consumer on another copies it. */
static int run_copy(int mode, int64_t seed, int with_wait)
{
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, mode, seed, -1, -1);
    etp_stream_t *prod, *cons;
    etp_event_t *ev;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &prod));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &cons));
    ETP_OK(etp_event_create(ctx, &ev));
    enum { N = 256 };
    uint8_t *x, *y;
    ETP_OK(etp_mem_alloc(ctx, N, ETP_MEM_USER, (void **)&x));
    ETP_OK(etp_mem_alloc(ctx, N, ETP_MEM_USER, (void **)&y));
    memset(x, 0, N);
    tu_poison(y, N);
    int value = 1 + (int)(tu_rand(g_seed, 1, (uint64_t)seed, 0) % 200);
    ETP_OK(etp_memset_async(prod, x, value, N));
    ETP_OK(etp_event_record(ev, prod));
    if (with_wait) ETP_OK(etp_stream_wait_event(cons, ev));
    ETP_OK(etp_memcpy_async(cons, y, x, N));
    ETP_OK(etp_stream_synchronize(cons));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= y[i] == value;
    ETP_OK(etp_stream_synchronize(prod));
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_stream_destroy(prod));
    ETP_OK(etp_stream_destroy(cons));
    ETP_OK(etp_mem_free(ctx, x));
    ETP_OK(etp_mem_free(ctx, y));
    ETP_OK(etp_context_destroy(ctx));
    return ok;
}

/* Producer writes the input of an all-reduce issued on another stream; the
 * host then reads after synchronizing everything (a device-wide drain), so
 * only the order inside the drain decides. */
static int run_allreduce(int mode, int64_t seed, int with_wait)
{
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, mode, seed, -1, -1);
    etp_group_t *world;
    ETP_OK(etp_context_world(ctx, &world));
    etp_stream_t *prod, *comm;
    etp_event_t *ev;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &prod));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_HIGH, &comm));
    ETP_OK(etp_event_create(ctx, &ev));
    enum { N = 64 };
    float src[N], in[N], out[N];
    for (int i = 0; i < N; i++) {
        src[i] = (float)(tu_rand(g_seed, 2, (uint64_t)g_rank, (uint64_t)i) % 100);
        in[i] = 0.0f;
    }
    tu_poison(out, sizeof out);
    ETP_OK(etp_memcpy_async(prod, in, src, sizeof src));
    ETP_OK(etp_event_record(ev, prod));
    if (with_wait) ETP_OK(etp_stream_wait_event(comm, ev));
    ETP_OK(etp_allreduce(world, 0, in, out, N, ETP_DTYPE_F32, ETP_REDOP_SUM, comm));
    /* the reader's stream first: the producer runs only when needed */
    ETP_OK(etp_stream_synchronize(comm));
    ETP_OK(etp_stream_synchronize(prod));
    int ok = 1;
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < g_size; r++)
            want += (float)(tu_rand(g_seed, 2, (uint64_t)r, (uint64_t)i) % 100);
        ok &= out[i] == want;
    }
    /* every rank reports the same verdict */
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_stream_destroy(prod));
    ETP_OK(etp_stream_destroy(comm));
    ETP_OK(etp_context_destroy(ctx));
    return all_ok;
}

typedef int (*program_t)(int mode, int64_t seed, int with_wait);

static void check_program(program_t prog)
{
    int failures_without = 0;
    for (size_t i = 0; i < NSEEDS; i++) {
        assert_true(prog(ETP_HOST_STREAMS_SHUFFLE, seeds[i], 1));
        int ok = prog(ETP_HOST_STREAMS_SHUFFLE, seeds[i], 0);
        failures_without += !ok;
        if (seeds[i] == 0) assert_false(ok); /* producers as late as allowed */
    }
    if (g_rank == 0)
        printf("missing wait caught by %d of %zu seeds\n", failures_without, NSEEDS);
    assert_true(failures_without >= 1);
    /* Eager mode runs in program order and hides the bug: that is the point. */
    assert_true(prog(ETP_HOST_STREAMS_EAGER, 0, 0));
    assert_true(prog(ETP_HOST_STREAMS_EAGER, 0, 1));
}

static void test_missing_wait_copy(void **state)
{
    (void)state;
    check_program(run_copy);
}

static void test_missing_wait_collective(void **state)
{
    (void)state;
    check_program(run_allreduce);
}

/* Shuffle mode runs nothing before a synchronization point. */
static void test_shuffle_defers_until_sync(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, 5, -1, -1);
    etp_stream_t *s;
    etp_event_t *ev;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    ETP_OK(etp_event_create(ctx, &ev));
    uint8_t buf[32];
    memset(buf, 0, sizeof buf);
    ETP_OK(etp_memset_async(s, buf, 9, sizeof buf));
    ETP_OK(etp_event_record(ev, s));
    assert_int_equal(buf[0], 0);
    int done = -1;
    ETP_OK(etp_event_query(ev, &done)); /* a query may advance work, never block */
    assert_int_equal(done, 1);
    assert_int_equal(buf[31], 9);
    ETP_OK(etp_event_synchronize(ev));
    ETP_OK(etp_event_destroy(ev));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shuffle");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_wait_copy),
        cmocka_unit_test(test_missing_wait_collective),
        cmocka_unit_test(test_shuffle_defers_until_sync),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
