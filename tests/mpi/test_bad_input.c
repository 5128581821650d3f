/*
 * Every public function given bad input returns a status and a message, and
 * leaves its outputs and the objects it was given as they were.
 */
#include "mpi_util.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
    etp_event_t *e;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s));
    ETP_OK(etp_event_create(f->ctx, &f->e));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    ETP_OK(etp_event_destroy(f->e));
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

#define BAD(expr, needle) ETP_EXPECT_MSG(expr, ETP_ERR_INVALID_ARGUMENT, needle)

static void test_context_creation(void **state)
{
    (void)state;
    etp_context_t *ctx = (etp_context_t *)0x1;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, NULL, NULL), "'out'");
    BAD(etp_context_create_mpi(MPI_COMM_NULL, NULL, &ctx), "MPI_COMM_NULL");
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.size = 3;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx), "ETP_CONTEXT_CONFIG_INIT");
    cfg.size = sizeof cfg + 8;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx), "size");
    /* inside a field: half of `device`, half the default's */
    cfg.size = offsetof(etp_context_config_t, device) + 2;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx), "ETP_CONTEXT_CONFIG_INIT");
    etp_context_config_t c2 = ETP_CONTEXT_CONFIG_INIT;
    c2.backend = (etp_backend_t)17;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &c2, &ctx), "backend 17");
    c2 = (etp_context_config_t)ETP_CONTEXT_CONFIG_INIT;
    c2.device = -5;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &c2, &ctx), "device -5");
    c2 = (etp_context_config_t)ETP_CONTEXT_CONFIG_INIT;
    c2.check_collectives = 4;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &c2, &ctx), "check_collectives");
    c2 = (etp_context_config_t)ETP_CONTEXT_CONFIG_INIT;
    c2.host_stream_mode = (etp_host_stream_mode_t)9;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &c2, &ctx), "host_stream_mode");
    c2 = (etp_context_config_t)ETP_CONTEXT_CONFIG_INIT;
    c2.allocator.free = NULL;
    c2.allocator.alloc = (void *(*)(void *, size_t, etp_mem_owner_t))0x1;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &c2, &ctx), "allocator");
    assert_true(ctx == (etp_context_t *)0x1);

    /* bad environment is an error too, naming the variable */
    setenv("ETP_TIMEOUT_S", "forever", 1);
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, NULL, &ctx), "ETP_TIMEOUT_S");
    unsetenv("ETP_TIMEOUT_S");
    setenv("ETP_TIMEOUT_S", "120", 1);

    etp_unique_id_t id;
    memset(&id, 0, sizeof id);
    BAD(etp_get_unique_id(ETP_BACKEND_HOST, NULL), "'id'");
    ETP_EXPECT_MSG(etp_get_unique_id(ETP_BACKEND_HOST, &id), ETP_ERR_UNSUPPORTED, "MPI");
    BAD(etp_get_unique_id((etp_backend_t)9, &id), "unknown");
    BAD(etp_context_create(NULL, 0, 1, NULL, &ctx), "'id'");
    BAD(etp_context_create(&id, 0, 0, NULL, &ctx), "size 0");
    BAD(etp_context_create(&id, 2, 2, NULL, &ctx), "rank 2");
    BAD(etp_context_create(&id, -1, 2, NULL, &ctx), "rank -1");
    BAD(etp_context_create(&id, 0, 1, NULL, &ctx), "etp_get_unique_id");
    assert_true(ctx == (etp_context_t *)0x1);
    assert_int_equal(etp_context_destroy(NULL), ETP_SUCCESS);
}

static void test_context_accessors(void **state)
{
    fx_t *f = *state;
    int x;
    etp_backend_t b;
    etp_group_t *g;
    BAD(etp_context_rank(NULL, &x), "'ctx'");
    BAD(etp_context_rank(f->ctx, NULL), "'rank'");
    BAD(etp_context_size(NULL, &x), "'ctx'");
    BAD(etp_context_size(f->ctx, NULL), "'size'");
    BAD(etp_context_backend(NULL, &b), "'ctx'");
    BAD(etp_context_backend(f->ctx, NULL), "'backend'");
    BAD(etp_context_world(NULL, &g), "'ctx'");
    BAD(etp_context_world(f->ctx, NULL), "'world'");
    BAD(etp_context_check(NULL), "'ctx'");
    etp_memory_report_t rep = ETP_MEMORY_REPORT_INIT;
    BAD(etp_memory_report(NULL, &rep), "'ctx'");
    BAD(etp_memory_report(f->ctx, NULL), "'report'");
    rep.size = 1;
    BAD(etp_memory_report(f->ctx, &rep), "ETP_MEMORY_REPORT_INIT");
    assert_string_equal(etp_mem_owner_name((etp_mem_owner_t)99), "invalid");
}

static void test_streams_events_memory(void **state)
{
    fx_t *f = *state;
    etp_stream_t *s = (etp_stream_t *)0x1;
    etp_event_t *e = (etp_event_t *)0x1;
    void *p = (void *)0x1;
    int done;
    char buf[8];
    BAD(etp_stream_create(NULL, 0, &s), "'ctx'");
    BAD(etp_stream_create(f->ctx, 0, NULL), "'stream'");
    BAD(etp_stream_create(f->ctx, 7, &s), "priority 7");
    BAD(etp_stream_synchronize(NULL), "'stream'");
    BAD(etp_event_create(NULL, &e), "'ctx'");
    BAD(etp_event_create(f->ctx, NULL), "'event'");
    BAD(etp_event_record(NULL, f->s), "'event'");
    BAD(etp_event_record(f->e, NULL), "'stream'");
    BAD(etp_stream_wait_event(NULL, f->e), "'stream'");
    BAD(etp_stream_wait_event(f->s, NULL), "'event'");
    BAD(etp_event_query(NULL, &done), "'event'");
    BAD(etp_event_query(f->e, NULL), "'done'");
    BAD(etp_event_synchronize(NULL), "'event'");
    BAD(etp_mem_alloc(NULL, 8, ETP_MEM_USER, &p), "'ctx'");
    BAD(etp_mem_alloc(f->ctx, 8, ETP_MEM_USER, NULL), "'ptr'");
    BAD(etp_mem_alloc(f->ctx, 0, ETP_MEM_USER, &p), "bytes is 0");
    BAD(etp_mem_alloc(f->ctx, 8, (etp_mem_owner_t)42, &p), "owner 42");
    BAD(etp_mem_free(NULL, buf), "'ctx'");
    BAD(etp_mem_free(f->ctx, buf), "not allocated");
    BAD(etp_memset_async(NULL, buf, 0, 8), "'stream'");
    BAD(etp_memset_async(f->s, NULL, 0, 8), "NULL");
    BAD(etp_memset_async(f->s, buf, 300, 8), "not a byte");
    BAD(etp_memcpy_async(NULL, buf, buf + 4, 4), "'stream'");
    BAD(etp_memcpy_async(f->s, NULL, buf, 4), "NULL");
    BAD(etp_memcpy_async(f->s, buf, buf + 2, 4), "overlap");
#if ETP_HAVE_CUDA
    /* A host context wraps no cudaStream_t, whichever is passed: the message
     * says so (it is not about the stream being a default one). */
    BAD(etp_stream_wrap_cuda(NULL, NULL, &s), "'ctx'");
    BAD(etp_stream_wrap_cuda(f->ctx, (cudaStream_t)0x10, NULL), "'stream'");
    BAD(etp_stream_wrap_cuda(f->ctx, NULL, &s), "host backend, not the CUDA backend");
    BAD(etp_stream_wrap_cuda(f->ctx, cudaStreamPerThread, &s), "not the CUDA backend");
    BAD(etp_stream_wrap_cuda(f->ctx, (cudaStream_t)0x10, &s), "not the CUDA backend");
    cudaStream_t native = (cudaStream_t)0x10;
    BAD(etp_stream_get_cuda(f->s, &native), "host backend, not the CUDA backend");
    BAD(etp_stream_get_cuda(NULL, &native), "'stream'");
    BAD(etp_stream_get_cuda(f->s, NULL), "'native'");
    assert_true(native == (cudaStream_t)0x10);
#endif
    assert_true(s == (etp_stream_t *)0x1 && e == (etp_event_t *)0x1 && p == (void *)0x1);
    assert_int_equal(etp_stream_destroy(NULL), ETP_SUCCESS);
    assert_int_equal(etp_event_destroy(NULL), ETP_SUCCESS);
    assert_int_equal(etp_mem_free(f->ctx, NULL), ETP_SUCCESS);
    /* zero bytes are fine */
    ETP_OK(etp_memset_async(f->s, NULL, 0, 0));
    ETP_OK(etp_memcpy_async(f->s, NULL, NULL, 0));
}

static void test_groups(void **state)
{
    fx_t *f = *state;
    etp_group_t *g = (etp_group_t *)0x1;
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    int x;
    BAD(etp_group_split(NULL, 0, 0, NULL, &g), "'parent'");
    BAD(etp_group_split(f->world, 0, 0, NULL, NULL), "'group'");
    BAD(etp_group_split(f->world, -2, 0, NULL, &g), "color -2");
    gc.num_roles = 0;
    BAD(etp_group_split(f->world, 0, 0, &gc, &g), "num_roles 0");
    gc.num_roles = ETP_GROUP_MAX_ROLES + 1;
    BAD(etp_group_split(f->world, 0, 0, &gc, &g), "num_roles");
    gc = (etp_group_config_t)ETP_GROUP_CONFIG_INIT;
    gc.min_ctas = 8;
    gc.max_ctas = 4;
    BAD(etp_group_split(f->world, 0, 0, &gc, &g), "min_ctas 8 > max_ctas 4");
    gc = (etp_group_config_t)ETP_GROUP_CONFIG_INIT;
    gc.size = 4;
    BAD(etp_group_split(f->world, 0, 0, &gc, &g), "ETP_GROUP_CONFIG_INIT");
    gc = (etp_group_config_t)ETP_GROUP_CONFIG_INIT;
    gc.name = "a name that is far too long to fit in the sixty-four bytes a group name has";
    BAD(etp_group_split(f->world, 0, 0, &gc, &g), "name longer");
    assert_true(g == (etp_group_t *)0x1);
    BAD(etp_group_rank(NULL, &x), "'group'");
    BAD(etp_group_rank(f->world, NULL), "'rank'");
    BAD(etp_group_size(NULL, &x), "'group'");
    BAD(etp_group_size(f->world, NULL), "'size'");
    BAD(etp_group_num_roles(NULL, &x), "'group'");
    BAD(etp_group_num_roles(f->world, NULL), "'num_roles'");
    assert_null(etp_group_name(NULL));
    assert_int_equal(etp_group_destroy(NULL), ETP_SUCCESS);
}

static void test_collectives(void **state)
{
    fx_t *f = *state;
    float a[16] = {0}, b[16], b_poison[16];
    /* one entry a rank (up to 8): etp_alltoallv reads group-size entries */
    size_t c[8] = {1, 1, 1, 1, 1, 1, 1, 1}, d[8] = {0};
    tu_poison(b, sizeof b);
    memcpy(b_poison, b, sizeof b);
    BAD(etp_allgather(NULL, 0, a, b, 1, ETP_DTYPE_F32, f->s), "'group'");
    BAD(etp_allgather(f->world, 0, a, b, 1, ETP_DTYPE_F32, NULL), "'stream'");
    BAD(etp_allgather(f->world, 1, a, b, 1, ETP_DTYPE_F32, f->s), "role 1");
    BAD(etp_allgather(f->world, -1, a, b, 1, ETP_DTYPE_F32, f->s), "role -1");
    BAD(etp_allgather(f->world, 0, a, b, 1, (etp_dtype_t)77, f->s), "dtype 77");
    BAD(etp_allgather(f->world, 0, NULL, b, 1, ETP_DTYPE_F32, f->s), "send is NULL");
    BAD(etp_allgather(f->world, 0, a, NULL, 1, ETP_DTYPE_F32, f->s), "recv is NULL");
    BAD(etp_reduce_scatter(f->world, 0, a, b, 1, ETP_DTYPE_F32, (etp_redop_t)5, f->s), "op 5");
    BAD(etp_reduce_scatter(f->world, 0, NULL, b, 1, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s), "NULL");
    BAD(etp_allreduce(f->world, 0, a, b, 1, ETP_DTYPE_F32, (etp_redop_t)-1, f->s), "op -1");
    BAD(etp_allreduce(NULL, 0, a, b, 1, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s), "'group'");
    BAD(etp_alltoallv(f->world, 0, a, NULL, d, b, c, d, ETP_DTYPE_F32, f->s), "'sendcounts'");
    BAD(etp_alltoallv(f->world, 0, a, c, NULL, b, c, d, ETP_DTYPE_F32, f->s), "'sdispls'");
    BAD(etp_alltoallv(f->world, 0, a, c, d, b, NULL, d, ETP_DTYPE_F32, f->s), "'recvcounts'");
    BAD(etp_alltoallv(f->world, 0, a, c, d, b, c, NULL, ETP_DTYPE_F32, f->s), "'rdispls'");
    BAD(etp_alltoallv(f->world, 0, NULL, c, d, b, c, d, ETP_DTYPE_F32, f->s), "NULL");
    size_t huge[8] = {SIZE_MAX};
    BAD(etp_alltoallv(f->world, 0, a, huge, c, b, c, d, ETP_DTYPE_F32, f->s), "overflow");
    BAD(etp_batch_begin(NULL), "'ctx'");
    BAD(etp_batch_end(NULL), "'ctx'");
    ETP_EXPECT_MSG(etp_batch_end(f->ctx), ETP_ERR_INVALID_STATE, "no etp_batch_begin");

    /* A stream of another context is refused. */
    etp_context_t *other = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    etp_stream_t *os;
    etp_event_t *oe;
    ETP_OK(etp_stream_create(other, ETP_STREAM_PRIORITY_NORMAL, &os));
    ETP_OK(etp_event_create(other, &oe));
    BAD(etp_allgather(f->world, 0, a, b, 1, ETP_DTYPE_F32, os), "another context");
    BAD(etp_event_record(oe, f->s), "different contexts");
    BAD(etp_stream_wait_event(f->s, oe), "different contexts");
    /* nothing refused wrote its output (refused calls enqueue nothing) */
    ETP_OK(etp_stream_synchronize(f->s));
    assert_memory_equal(b, b_poison, sizeof b);
    ETP_OK(etp_event_destroy(oe));
    ETP_OK(etp_stream_destroy(os));
    ETP_OK(etp_context_destroy(other));

    /* After all that, the context is healthy and correct. */
    for (int i = 0; i < 16; i++) a[i] = (float)i;
    tu_poison(b, sizeof b);
    ETP_OK(etp_allreduce(f->world, 0, a, b, 16, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    for (int i = 0; i < 16; i++) assert_true(b[i] == (float)(i * g_size));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_bad_input");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_creation),
        cmocka_unit_test_setup_teardown(test_context_accessors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streams_events_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_collectives, setup, teardown),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
