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

/* ---- versioned structs ------------------------------------------------------ */

/* Where field f of T ends: the size of an older caller's struct that stops
 * after f. */
#define VS_END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))
#define VS_POISON 0xAB

/* An older caller's config: fields past `size` bytes hold poison, which
 * etp must not read (each poisoned field here would be refused). */
static void vs_truncate(void *cfg, size_t full, size_t size)
{
    memset((char *)cfg + size, VS_POISON, full - size);
    *(size_t *)cfg = size;
}

/* An older caller's output struct: all but the size field poisoned. */
static void vs_poison_out(void *out, size_t full, size_t size)
{
    memset((char *)out + sizeof(size_t), VS_POISON, full - sizeof(size_t));
    *(size_t *)out = size;
}

/* Bytes [from, to) of p still hold the poison. */
static void vs_assert_untouched(const void *p, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (((const unsigned char *)p)[i] != VS_POISON)
            fail_msg("byte %zu of %zu past the caller's size %zu was written", i, to, from);
}

/* A size that ends inside `field` is refused, naming the field. */
#define VS_CUT(expr, obj, T, field)                                                            \
    do {                                                                                   \
        (obj).size = offsetof(T, field) + sizeof(((T *)0)->field) / 2;                     \
        BAD(expr, "inside field '" #field "'");                                            \
    } while (0)

/* Refusals a user meets first, with messages that say what to do. */
static void test_first_mistakes(void **state)
{
    fx_t *f = *state;
    /* a chain on the context's world, which has one role */
    etp_group_t *world = NULL;
    ETP_OK(etp_context_world(f->ctx, &world));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = world;
    etp_chain_t *ch = (etp_chain_t *)0x1;
    BAD(etp_chain_create(f->ctx, &cc, &ch),
        "group 'world' has 1 role; chains need 2 (all-gather and reduce-scatter): split a group "
        "with num_roles = 2, see etp_group_split");
    assert_true(ch == (etp_chain_t *)0x1);
    /* arguments named as the header names them, objects by their names */
    BAD(etp_chain_add(NULL, NULL), "etp_chain_add: argument 'chain' is NULL");
    BAD(etp_chain_create(f->ctx, &cc, NULL), "argument 'chain' is NULL");
    etp_param_info_t pi = ETP_PARAM_INFO_INIT;
    BAD(etp_param_info(NULL, &pi), "argument 'param' is NULL");
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.group = world;
    pc.name = "w_up";
    pc.rows = 0;
    pc.cols = 8;
    etp_param_t *p = NULL;
    BAD(etp_param_create(f->ctx, &pc, &p), "etp_param_create: parameter 'w_up': shape [0, 8]");
    BAD(etp_param_create(f->ctx, &pc, NULL), "argument 'param' is NULL");
    assert_null(p);

    /* a zero-initialised quantizer config: the fields its format ignores
     * are not checked; those it uses are */
    etp_quantizer_config_t qc;
    memset(&qc, 0, sizeof qc);
    qc.size = sizeof qc;
    qc.format = ETP_QUANT_MXFP8; /* nvfp4_block 0: not an etp_quant_block_t, unused */
    qc.directions = ETP_QUANT_ROWWISE;
    etp_quantizer_t *q = NULL;
    ETP_OK(etp_quantizer_create(f->ctx, &qc, &q));
    /* one tensor's sizes: named by its shape, not as tensor 0 of a batch */
    etp_quant_sizes_t qs = ETP_QUANT_SIZES_INIT;
    BAD(etp_quant_sizes(q, 4, 48, &qs), "etp_quant_sizes: tensor [4, 48]: MXFP8 rowwise needs cols");
    ETP_OK(etp_quantizer_destroy(q));
    qc.format = ETP_QUANT_NVFP4; /* uses nvfp4_block: 0 is refused */
    q = (etp_quantizer_t *)0x1;
    BAD(etp_quantizer_create(f->ctx, &qc, &q), "nvfp4_block 0 is not an etp_quant_block_t");
    assert_true(q == (etp_quantizer_t *)0x1);
}

static void test_versioned_structs(void **state)
{
    fx_t *f = *state;
    /* context: an older config ending after host_stream_mode */
    etp_context_config_t cc = ETP_CONTEXT_CONFIG_INIT;
    cc.backend = ETP_BACKEND_HOST;
    cc.host_stream_mode = ETP_HOST_STREAMS_EAGER;
    vs_truncate(&cc, sizeof cc, VS_END(etp_context_config_t, host_stream_mode));
    etp_context_t *ctx = NULL;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &ctx));
    etp_backend_t kind = ETP_BACKEND_AUTO;
    ETP_OK(etp_context_backend(ctx, &kind));
    assert_int_equal(kind, ETP_BACKEND_HOST);
    ETP_OK(etp_context_destroy(ctx));
    cc = (etp_context_config_t)ETP_CONTEXT_CONFIG_INIT;
    etp_context_t *none = (etp_context_t *)0x1;
    VS_CUT(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &none), cc, etp_context_config_t, timeout_s);
    cc.size = sizeof cc + 8;
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &none), "larger than etp_context_config_t");
    cc.size = sizeof(size_t);
    BAD(etp_context_create_mpi(MPI_COMM_WORLD, &cc, &none), "holds no field");
    assert_true(none == (etp_context_t *)0x1);

    /* memory report: only the bytes by owner fit */
    etp_memory_report_t full = ETP_MEMORY_REPORT_INIT, mr;
    const size_t mr_size = VS_END(etp_memory_report_t, bytes);
    vs_poison_out(&mr, sizeof mr, mr_size);
    ETP_OK(etp_memory_report(f->ctx, &full));
    ETP_OK(etp_memory_report(f->ctx, &mr));
    assert_int_equal(mr.size, mr_size);
    assert_memory_equal(mr.bytes, full.bytes, sizeof mr.bytes);
    vs_assert_untouched(&mr, mr_size, sizeof mr);
    VS_CUT(etp_memory_report(f->ctx, &mr), mr, etp_memory_report_t, total_bytes);

    /* group: ending after num_roles (the NCCL settings are poison) */
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "vs";
    gc.num_roles = 2;
    vs_truncate(&gc, sizeof gc, VS_END(etp_group_config_t, num_roles));
    etp_group_t *g = NULL;
    ETP_OK(etp_group_split(f->world, 0, 0, &gc, &g));
    int roles = 0;
    ETP_OK(etp_group_num_roles(g, &roles));
    assert_int_equal(roles, 2);
    assert_string_equal(etp_group_name(g), "vs");
    etp_group_t *g_none = (etp_group_t *)0x1;
    VS_CUT(etp_group_split(f->world, 0, 0, &gc, &g_none), gc, etp_group_config_t, name);
    assert_true(g_none == (etp_group_t *)0x1);

    /* parameter: ending after cols; dtype and the rest take the defaults */
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.name = "w";
    pc.group = g;
    pc.rows = 8;
    pc.cols = 4;
    vs_truncate(&pc, sizeof pc, VS_END(etp_param_config_t, cols));
    etp_param_t *p = NULL;
    ETP_OK(etp_param_create(f->ctx, &pc, &p));
    etp_param_info_t pi = ETP_PARAM_INFO_INIT, pi_old;
    ETP_OK(etp_param_info(p, &pi));
    assert_int_equal(pi.dtype, ETP_DTYPE_BF16);
    assert_int_equal(pi.wgrad_dtype, ETP_DTYPE_BF16);
    assert_null(pi.master);
    const size_t pi_size = VS_END(etp_param_info_t, rows);
    vs_poison_out(&pi_old, sizeof pi_old, pi_size);
    ETP_OK(etp_param_info(p, &pi_old));
    assert_string_equal(pi_old.name, "w");
    assert_int_equal(pi_old.experts, 1);
    assert_int_equal(pi_old.rows, 8);
    vs_assert_untouched(&pi_old, pi_size, sizeof pi_old);
    VS_CUT(etp_param_info(p, &pi_old), pi_old, etp_param_info_t, cols);
    etp_param_t *p_none = (etp_param_t *)0x1;
    VS_CUT(etp_param_create(f->ctx, &pc, &p_none), pc, etp_param_config_t, experts);
    assert_true(p_none == (etp_param_t *)0x1);

    /* chain: ending after group (depth, roles, ring: defaults) */
    etp_chain_config_t chc = ETP_CHAIN_CONFIG_INIT;
    chc.name = "vs";
    chc.group = g;
    vs_truncate(&chc, sizeof chc, VS_END(etp_chain_config_t, group));
    etp_chain_t *ch = NULL;
    ETP_OK(etp_chain_create(f->ctx, &chc, &ch));
    etp_chain_t *ch_none = (etp_chain_t *)0x1;
    VS_CUT(etp_chain_create(f->ctx, &chc, &ch_none), chc, etp_chain_config_t, depth);
    chc.size = sizeof chc + 4;
    BAD(etp_chain_create(f->ctx, &chc, &ch_none), "larger than");
    assert_true(ch_none == (etp_chain_t *)0x1);
    ETP_OK(etp_chain_add(ch, p));
    ETP_OK(etp_chain_finalize(ch));
    etp_cache_report_t cr = ETP_CACHE_REPORT_INIT, cr_old;
    ETP_OK(etp_chain_cache_report(ch, &cr));
    const size_t cr_size = VS_END(etp_cache_report_t, slots);
    vs_poison_out(&cr_old, sizeof cr_old, cr_size);
    ETP_OK(etp_chain_cache_report(ch, &cr_old));
    assert_int_equal(cr_old.tickets, cr.tickets);
    assert_int_equal(cr_old.slots, cr.slots);
    vs_assert_untouched(&cr_old, cr_size, sizeof cr_old);
    VS_CUT(etp_chain_cache_report(ch, &cr_old), cr_old, etp_cache_report_t, slot_bytes);

    /* a gathered weight's view: only data and dtype fit */
    etp_weight_view_t v;
    const size_t v_size = VS_END(etp_weight_view_t, dtype);
    VS_CUT(etp_gather(p, ETP_PASS_FORWARD, f->s, &v), v, etp_weight_view_t, data);
    vs_poison_out(&v, sizeof v, v_size);
    ETP_OK(etp_gather(p, ETP_PASS_FORWARD, f->s, &v));
    assert_non_null(v.data);
    assert_int_equal(v.dtype, ETP_DTYPE_BF16);
    vs_assert_untouched(&v, v_size, sizeof v);
    ETP_OK(etp_release(p, ETP_PASS_FORWARD, f->s));
    ETP_OK(etp_stream_synchronize(f->s));
    ETP_OK(etp_chain_destroy(ch));
    ETP_OK(etp_param_destroy(p));

    /* quantizer: ending after format; the sizes of a call, partly */
    etp_quantizer_config_t qc = ETP_QUANTIZER_CONFIG_INIT;
    qc.format = ETP_QUANT_MXFP8;
    vs_truncate(&qc, sizeof qc, VS_END(etp_quantizer_config_t, format));
    etp_quantizer_t *q = NULL;
    ETP_OK(etp_quantizer_create(f->ctx, &qc, &q));
    etp_quant_sizes_t qs = ETP_QUANT_SIZES_INIT, qs_old;
    ETP_OK(etp_quant_sizes(q, 64, 64, &qs));
    const size_t qs_size = VS_END(etp_quant_sizes_t, rowwise_scale_rows);
    vs_poison_out(&qs_old, sizeof qs_old, qs_size);
    ETP_OK(etp_quant_sizes(q, 64, 64, &qs_old));
    assert_int_equal(qs_old.rowwise_data_bytes, 64 * 64);
    assert_int_equal(qs_old.rowwise_scale_rows, qs.rowwise_scale_rows);
    vs_assert_untouched(&qs_old, qs_size, sizeof qs_old);
    VS_CUT(etp_quant_sizes(q, 64, 64, &qs_old), qs_old, etp_quant_sizes_t, rowwise_scale_cols);
    ETP_OK(etp_quantizer_destroy(q));
    etp_quantizer_t *q_none = (etp_quantizer_t *)0x1;
    VS_CUT(etp_quantizer_create(f->ctx, &qc, &q_none), qc, etp_quantizer_config_t, nvfp4_block);
    assert_true(q_none == (etp_quantizer_t *)0x1);

    /* EP group: ending after recv_capacity_per_rank (overflow, transport
     * and capacity_factor: defaults) */
    etp_ep_group_config_t ec = ETP_EP_GROUP_CONFIG_INIT;
    ec.num_experts = 4;
    ec.hidden = 64;
    ec.max_tokens_per_rank = 16;
    ec.max_topk = 2;
    ec.recv_capacity_per_rank = 128;
    vs_truncate(&ec, sizeof ec, VS_END(etp_ep_group_config_t, recv_capacity_per_rank));
    etp_ep_group_t *ep = NULL;
    ETP_OK(etp_ep_group_create(f->world, &ec, &ep));
    etp_ep_group_info_t ei;
    const size_t ei_size = VS_END(etp_ep_group_info_t, ranks);
    vs_poison_out(&ei, sizeof ei, ei_size);
    ETP_OK(etp_ep_group_info(ep, &ei));
    assert_int_equal(ei.rank, 0);
    assert_int_equal(ei.ranks, 1);
    vs_assert_untouched(&ei, ei_size, sizeof ei);
    VS_CUT(etp_ep_group_info(ep, &ei), ei, etp_ep_group_info_t, local_experts);
    etp_ep_group_t *ep_none = (etp_ep_group_t *)0x1;
    VS_CUT(etp_ep_group_create(f->world, &ec, &ep_none), ec, etp_ep_group_config_t,
           max_tokens_per_rank);
    assert_true(ep_none == (etp_ep_group_t *)0x1);

    /* EP layer: ending after topk; its report, partly */
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.topk = 2;
    vs_truncate(&lc, sizeof lc, VS_END(etp_ep_layer_config_t, topk));
    etp_ep_layer_t *ly = NULL;
    ETP_OK(etp_ep_layer_create(ep, &lc, &ly));
    etp_ep_report_t er;
    const size_t er_size = VS_END(etp_ep_report_t, flags);
    vs_poison_out(&er, sizeof er, er_size);
    ETP_OK(etp_ep_check(ly, &er));
    assert_int_equal(er.flags, 0);
    vs_assert_untouched(&er, er_size, sizeof er);
    vs_poison_out(&er, sizeof er, er_size);
    ETP_OK(etp_ep_poll(ly, &er));
    vs_assert_untouched(&er, er_size, sizeof er);
    VS_CUT(etp_ep_poll(ly, &er), er, etp_ep_report_t, bad_index_slots);
    VS_CUT(etp_ep_check(ly, &er), er, etp_ep_report_t, prepares);
    etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
    VS_CUT(etp_ep_dispatch_ex(ly, &da, f->s), da, etp_ep_dispatch_args_t, rows);
    etp_ep_layer_t *ly_none = (etp_ep_layer_t *)0x1;
    VS_CUT(etp_ep_layer_create(ep, &lc, &ly_none), lc, etp_ep_layer_config_t, layout);
    assert_true(ly_none == (etp_ep_layer_t *)0x1);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
    ETP_OK(etp_group_destroy(g));
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
        cmocka_unit_test_setup_teardown(test_versioned_structs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_mistakes, setup, teardown),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
