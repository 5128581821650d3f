/*
 * Contexts, memory and streams on the host backend: the memory report, the
 * allocator hook, event semantics, and what each wrong-state call returns.
 */
#include "mpi_util.h"

static void test_memory_report_and_allocator(void **state)
{
    (void)state;
    tu_allocator_t cnt = {0};
    etp_context_t *ctx = tu_alloc_ctx(&cnt, ETP_HOST_STREAMS_EAGER, 0);
    size_t sizes[ETP_MEM_OWNER_COUNT];
    void *ptrs[ETP_MEM_OWNER_COUNT];
    size_t total = 0;
    for (int o = 0; o < ETP_MEM_OWNER_COUNT; o++) {
        sizes[o] = 1 + (size_t)(tu_rand(g_seed, 11, (uint64_t)o, 0) % 5000);
        total += sizes[o];
        ETP_OK(etp_mem_alloc(ctx, sizes[o], (etp_mem_owner_t)o, &ptrs[o]));
        memset(ptrs[o], o, sizes[o]); /* the memory is really there */
    }
    assert_int_equal(cnt.allocs, ETP_MEM_OWNER_COUNT);
    etp_memory_report_t rep = ETP_MEMORY_REPORT_INIT;
    ETP_OK(etp_memory_report(ctx, &rep));
    for (int o = 0; o < ETP_MEM_OWNER_COUNT; o++) assert_int_equal(rep.bytes[o], sizes[o]);
    assert_int_equal(rep.total_bytes, total);
    assert_int_equal(rep.peak_bytes, total);
    assert_int_equal(rep.live_allocations, ETP_MEM_OWNER_COUNT);
    ETP_OK(etp_mem_free(ctx, ptrs[ETP_MEM_MAIN_GRAD]));
    ETP_OK(etp_memory_report(ctx, &rep));
    assert_int_equal(rep.bytes[ETP_MEM_MAIN_GRAD], 0);
    assert_int_equal(rep.total_bytes, total - sizes[ETP_MEM_MAIN_GRAD]);
    assert_int_equal(rep.peak_bytes, total);
    ETP_EXPECT_MSG(etp_mem_free(ctx, ptrs[ETP_MEM_MAIN_GRAD]), ETP_ERR_INVALID_ARGUMENT,
                   "not allocated by this context");
    /* the rest is left for destroy, which frees it through the hook */
    ETP_OK(etp_context_destroy(ctx));
    assert_int_equal(cnt.frees, ETP_MEM_OWNER_COUNT);
    assert_int_equal(cnt.live, 0);
}

static void test_allocator_failure_is_reported(void **state)
{
    (void)state;
    tu_allocator_t none = {.fail_mask = ~0u};
    etp_context_t *ctx = tu_alloc_ctx(&none, ETP_HOST_STREAMS_EAGER, 0);
    void *p = (void *)0x1;
    ETP_EXPECT_MSG(etp_mem_alloc(ctx, 64, ETP_MEM_SHARDS, &p), ETP_ERR_OUT_OF_MEMORY, "shards");
    assert_true(p == (void *)0x1); /* outputs only on success */
    etp_memory_report_t rep = ETP_MEMORY_REPORT_INIT;
    ETP_OK(etp_memory_report(ctx, &rep));
    assert_int_equal(rep.total_bytes, 0);
    ETP_OK(etp_context_destroy(ctx));
}

static void test_context_queries(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    int rank = -1, size = -1;
    etp_backend_t be = ETP_BACKEND_AUTO;
    ETP_OK(etp_context_rank(ctx, &rank));
    ETP_OK(etp_context_size(ctx, &size));
    ETP_OK(etp_context_backend(ctx, &be));
    assert_int_equal(rank, g_rank);
    assert_int_equal(size, g_size);
    assert_int_equal(be, ETP_BACKEND_HOST);
    etp_group_t *w = NULL;
    ETP_OK(etp_context_world(ctx, &w));
    assert_string_equal(etp_group_name(w), "world");
    ETP_OK(etp_context_check(ctx));
    ETP_OK(etp_context_destroy(ctx));
}

/* Objects must go before what they were made from. */
static void test_destroy_order(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, 2, -1, -1);
    etp_group_t *w, *a, *b;
    etp_stream_t *s;
    etp_event_t *e;
    ETP_OK(etp_context_world(ctx, &w));
    ETP_OK(etp_group_split(w, 0, g_rank, NULL, &a));
    ETP_OK(etp_group_split(a, 0, g_rank, NULL, &b));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    ETP_OK(etp_event_create(ctx, &e));
    ETP_EXPECT_MSG(etp_group_destroy(w), ETP_ERR_INVALID_ARGUMENT, "world");
    ETP_EXPECT_MSG(etp_group_destroy(a), ETP_ERR_BUSY, "split from it");
    ETP_EXPECT_MSG(etp_context_destroy(ctx), ETP_ERR_BUSY, "1 stream(s), 1 event(s), 2 group(s) and 0 graph(s)");
    /* and nothing was harmed: the group still works */
    int x = g_rank + 1;
    ETP_OK(etp_allreduce(b, 0, &x, &x, 1, ETP_DTYPE_I32, ETP_REDOP_SUM, s));
    ETP_OK(etp_stream_synchronize(s));
    assert_int_equal(x, g_size * (g_size + 1) / 2);
    ETP_OK(etp_group_destroy(b));
    ETP_OK(etp_group_destroy(a));
    ETP_OK(etp_event_destroy(e));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

/* A stream destroyed with work queued finishes that work first (shuffle
 * mode queues everything). */
static void test_stream_destroy_drains(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, 0, -1, -1);
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    unsigned char b[16];
    memset(b, 0, sizeof b);
    ETP_OK(etp_memset_async(s, b, 3, sizeof b));
    assert_int_equal(b[0], 0);
    ETP_OK(etp_stream_destroy(s));
    assert_int_equal(b[15], 3);
    ETP_OK(etp_context_destroy(ctx));
}

/* A stream destroyed while another stream's queued work waits on it: that
 * work runs first, in order, and events recorded on it stay valid (as
 * CUDA's outlive their stream). ASan catches a freed operation or stream
 * read here. */
static void test_stream_destroy_waiters_and_events(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, 0, -1, -1);
    etp_stream_t *a, *b, *c;
    etp_event_t *e1, *e2;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &a));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &b));
    ETP_OK(etp_event_create(ctx, &e1));
    ETP_OK(etp_event_create(ctx, &e2));
    unsigned char x[16], y[16], z[16];
    memset(x, 0, sizeof x);
    ETP_OK(etp_memset_async(b, x, 5, sizeof x));
    ETP_OK(etp_event_record(e1, b));
    ETP_OK(etp_memset_async(b, x + 8, 6, 8));
    ETP_OK(etp_event_record(e2, b));
    /* two waits on b queued on a, each followed by a copy of what b wrote */
    ETP_OK(etp_stream_wait_event(a, e1));
    ETP_OK(etp_memcpy_async(a, y, x, sizeof x));
    ETP_OK(etp_stream_wait_event(a, e2));
    ETP_OK(etp_memcpy_async(a, z, x, sizeof x));
    ETP_OK(etp_stream_destroy(b));
    ETP_OK(etp_stream_synchronize(a));
    for (int i = 0; i < 16; i++) {
        assert_int_equal(z[i], i < 8 ? 5 : 6);
        assert_true(y[i] == 5 || (i >= 8 && y[i] == 6));
    }
    /* the events of the destroyed stream: complete, usable */
    int done = 0;
    ETP_OK(etp_event_query(e2, &done));
    assert_int_equal(done, 1);
    ETP_OK(etp_event_synchronize(e1));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &c));
    ETP_OK(etp_stream_wait_event(c, e2));
    ETP_OK(etp_stream_synchronize(c));
    ETP_OK(etp_event_destroy(e1));
    ETP_OK(etp_event_destroy(e2));
    ETP_OK(etp_stream_destroy(a));
    ETP_OK(etp_stream_destroy(c));
    ETP_OK(etp_context_destroy(ctx));
}

/* No-color ranks get no group; the others a group of their own. */
static void test_split_no_color(void **state)
{
    (void)state;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    etp_group_t *w, *g = (etp_group_t *)0x1;
    ETP_OK(etp_context_world(ctx, &w));
    int color = g_rank == 0 ? ETP_GROUP_NO_COLOR : 5;
    ETP_OK(etp_group_split(w, color, 0, NULL, &g));
    if (g_rank == 0) {
        assert_null(g);
    } else {
        int size = 0;
        ETP_OK(etp_group_size(g, &size));
        assert_int_equal(size, g_size - 1);
        assert_string_equal(etp_group_name(g), "group5");
        ETP_OK(etp_group_destroy(g));
    }
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_context");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_report_and_allocator),
        cmocka_unit_test(test_allocator_failure_is_reported),
        cmocka_unit_test(test_context_queries),
        cmocka_unit_test(test_destroy_order),
        cmocka_unit_test(test_stream_destroy_drains),
        cmocka_unit_test(test_stream_destroy_waiters_and_events),
        cmocka_unit_test(test_split_no_color),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
