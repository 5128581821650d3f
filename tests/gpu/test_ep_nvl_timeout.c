/*
 * The NVLink transport never hangs (label gpu;ep; 2 GPUs; skipped without
 * them): rank 1 prepares with rank 0 and then skips the dispatch. Rank 0's
 * dispatch kernel waits for rank 1's rows for half the context's timeout
 * (4 s), gives up, and rank 0's next stream wait fails with ETP_ERR_TIMEOUT naming
 * the EP group, the call and rank 1; its context is then aborted
 * (etp_context_check says so), and its teardown needs no peer. The same
 * for a low-latency layer's combine: both ranks dispatch, rank 1 skips the
 * combine, and rank 0's combine kernel gives up on rank 1's partials.
 */
#include <cuda_runtime_api.h>
#include <string.h>

#include "etp/ep.h"
#include "gpu_util.h"
#include "mpi_util.h"

enum { T = 64, K = 2, E = 8 };

/* One case's objects: an nvlink group of E experts and top-K named `name`
 * with a layer (low-latency or not), T tokens a rank of H elements
 * (zeros) routed to experts t and t + 3, and the layer's rows. */
typedef struct {
    int rank;
    int64_t H, rows;
    etp_context_t *ctx;
    etp_stream_t *s;
    etp_ep_group_t *ep;
    etp_ep_layer_t *ly;
    void *idx, *tok, *w, *rowbuf, *out;
} case_t;

static void case_open(case_t *c, const char *name, int64_t H, int low_latency)
{
    memset(c, 0, sizeof *c);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    c->H = H;
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    cfg.timeout_s = 4.0;
    etp_group_t *world = NULL;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &c->ctx));
    ETP_OK(etp_context_world(c->ctx, &world));
    ETP_OK(etp_stream_create(c->ctx, ETP_STREAM_PRIORITY_NORMAL, &c->s));
    etp_ep_group_config_t gc = ETP_EP_GROUP_CONFIG_INIT;
    gc.name = name;
    gc.num_experts = E;
    gc.hidden = H;
    gc.max_tokens_per_rank = T;
    gc.max_topk = K;
    gc.recv_capacity_per_rank = 512;
    gc.transport = ETP_EP_TRANSPORT_NVLINK;
    ETP_OK(etp_ep_group_create(world, &gc, &c->ep));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.topk = K;
    if (low_latency) {
        lc.weighted = 0;
        lc.low_latency = 1;
        lc.max_tokens_per_rank = T;
    }
    ETP_OK(etp_ep_layer_create(c->ep, &lc, &c->ly));
    ETP_OK(etp_ep_layer_rows(c->ly, &c->rows));
    int64_t idx[T * K];
    for (int64_t t = 0; t < T; t++) {
        idx[K * t] = t % E;
        idx[K * t + 1] = (t + 3) % E;
    }
    ETP_OK(etp_mem_alloc(c->ctx, sizeof idx, ETP_MEM_USER, &c->idx));
    ETP_OK(etp_mem_alloc(c->ctx, (size_t)(T * H) * 2, ETP_MEM_USER, &c->tok));
    ETP_OK(etp_mem_alloc(c->ctx, (size_t)T * K * 4, ETP_MEM_USER, &c->w));
    ETP_OK(etp_mem_alloc(c->ctx, (size_t)(c->rows * H) * 2, ETP_MEM_USER, &c->rowbuf));
    ETP_OK(etp_mem_alloc(c->ctx, (size_t)(T * H) * 2, ETP_MEM_USER, &c->out));
    ETP_OK(etp_memcpy_async(c->s, c->idx, idx, sizeof idx));
    ETP_OK(etp_memset_async(c->s, c->tok, 0, (size_t)(T * H) * 2));
    ETP_OK(etp_memset_async(c->s, c->w, 0, (size_t)T * K * 4));
    ETP_OK(etp_memset_async(c->s, c->rowbuf, 0, (size_t)(c->rows * H) * 2));
}

/* Rank 0 has enqueued a call rank 1 skips: its stream wait fails with
 * ETP_ERR_TIMEOUT naming the group, `call` and rank 1, and its context is
 * aborted. Then rank 0 releases everything alone; rank 1's teardown would
 * be collective with a peer that is gone (the window's deregistration): a
 * job in this state ends, so rank 1 leaves its objects to the process's
 * exit. */
static void case_expect_timeout(case_t *c, const char *group, const char *call)
{
    etp_status_t st = ETP_SUCCESS, st_check = ETP_SUCCESS;
    char msg[512] = "";
    if (c->rank == 0) {
        st = etp_stream_synchronize(c->s);
        snprintf(msg, sizeof msg, "%s", etp_last_error());
        st_check = etp_context_check(c->ctx);
        print_message("rank 0: %s\n", msg);
    }
    /* both ranks meet before any assertion can leave the test */
    MPI_Barrier(MPI_COMM_WORLD);
    if (c->rank == 1) return;
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", group);
    assert_int_equal(st, ETP_ERR_TIMEOUT);
    assert_non_null(strstr(msg, quoted));
    assert_non_null(strstr(msg, "rank 1"));
    assert_non_null(strstr(msg, call));
    assert_int_not_equal(st_check, ETP_SUCCESS);
    void *mem[] = {c->idx, c->tok, c->w, c->rowbuf, c->out};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) (void)etp_mem_free(c->ctx, mem[i]);
    ETP_OK(etp_ep_layer_destroy(c->ly));
    ETP_OK(etp_ep_group_destroy(c->ep));
    ETP_OK(etp_stream_destroy(c->s));
    ETP_OK(etp_context_destroy(c->ctx));
}

static void test_missing_peer(void **state)
{
    (void)state;
    case_t c;
    case_open(&c, "lonely", 256, 0);
    ETP_OK(etp_ep_prepare(c.ly, c.idx, ETP_DTYPE_I64, T, NULL, c.s));
    ETP_OK(etp_stream_synchronize(c.s));
    if (c.rank == 0)
        ETP_OK(etp_ep_dispatch(c.ly, c.tok, ETP_DTYPE_BF16, c.w, ETP_DTYPE_F32, c.rowbuf, NULL,
                               c.rows, c.s));
    case_expect_timeout(&c, "lonely", "dispatch");
}

static void test_ll_missing_combine(void **state)
{
    (void)state;
    case_t c;
    case_open(&c, "lonely-ll", 2048, 1); /* two slices a row */
    etp_ep_ll_dispatch_args_t a = ETP_EP_LL_DISPATCH_ARGS_INIT;
    a.topk_idx = c.idx;
    a.num_tokens = T;
    a.tokens = c.tok;
    ETP_OK(etp_ep_ll_dispatch(c.ly, &a, NULL, c.s));
    ETP_OK(etp_stream_synchronize(c.s));
    MPI_Barrier(MPI_COMM_WORLD);
    if (c.rank == 0) ETP_OK(etp_ep_ll_combine(c.ly, c.rowbuf, ETP_DTYPE_BF16, c.rows, c.out, c.s));
    case_expect_timeout(&c, "lonely-ll", "low-latency combine");
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_nvl_timeout");
    if (tu_gpu_short("test_ep_nvl_timeout")) return tu_gpu_skip();
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_missing_peer),
                                       cmocka_unit_test(test_ll_missing_combine)};
    int failed = cmocka_run_group_tests_name("ep_nvl_timeout", tests, NULL, NULL);
    return tu_mpi_finish(failed);
}
