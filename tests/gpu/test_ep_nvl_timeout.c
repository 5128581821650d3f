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

static void test_missing_peer(void **state)
{
    (void)state;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    cfg.timeout_s = 4.0;
    etp_context_t *ctx = NULL;
    etp_group_t *world = NULL;
    etp_stream_t *s = NULL;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    ETP_OK(etp_context_world(ctx, &world));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    etp_ep_group_config_t gc = ETP_EP_GROUP_CONFIG_INIT;
    gc.name = "lonely";
    gc.num_experts = 8;
    gc.hidden = 256;
    gc.max_tokens_per_rank = 64;
    gc.max_topk = 2;
    gc.recv_capacity_per_rank = 512;
    gc.transport = ETP_EP_TRANSPORT_NVLINK;
    etp_ep_group_t *ep = NULL;
    ETP_OK(etp_ep_group_create(world, &gc, &ep));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.topk = 2;
    etp_ep_layer_t *ly = NULL;
    ETP_OK(etp_ep_layer_create(ep, &lc, &ly));
    int64_t rows = 0;
    ETP_OK(etp_ep_layer_rows(ly, &rows));
    const int64_t T = 64;
    int64_t idx[64 * 2];
    for (int64_t t = 0; t < T; t++) {
        idx[2 * t] = t % 8;
        idx[2 * t + 1] = (t + 3) % 8;
    }
    void *didx = NULL, *dtok = NULL, *dw = NULL, *drecv = NULL;
    ETP_OK(etp_mem_alloc(ctx, sizeof idx, ETP_MEM_USER, &didx));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(T * 256) * 2, ETP_MEM_USER, &dtok));
    ETP_OK(etp_mem_alloc(ctx, (size_t)T * 2 * 4, ETP_MEM_USER, &dw));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(rows * 256) * 2, ETP_MEM_USER, &drecv));
    ETP_OK(etp_memcpy_async(s, didx, idx, sizeof idx));
    ETP_OK(etp_memset_async(s, dtok, 0, (size_t)(T * 256) * 2));
    ETP_OK(etp_memset_async(s, dw, 0, (size_t)T * 2 * 4));
    ETP_OK(etp_ep_prepare(ly, didx, ETP_DTYPE_I64, T, NULL, s));
    ETP_OK(etp_stream_synchronize(s));
    etp_status_t st = ETP_SUCCESS, st_check = ETP_SUCCESS;
    char msg[512] = "";
    if (rank == 0) {
        ETP_OK(etp_ep_dispatch(ly, dtok, ETP_DTYPE_BF16, dw, ETP_DTYPE_F32, drecv, NULL, rows, s));
        st = etp_stream_synchronize(s);
        snprintf(msg, sizeof msg, "%s", etp_last_error());
        st_check = etp_context_check(ctx);
        print_message("rank 0: %s\n", msg);
    }
    /* both ranks meet before any assertion can leave the test */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        assert_int_equal(st, ETP_ERR_TIMEOUT);
        assert_non_null(strstr(msg, "'lonely'"));
        assert_non_null(strstr(msg, "rank 1"));
        assert_non_null(strstr(msg, "dispatch"));
        assert_int_not_equal(st_check, ETP_SUCCESS);
    }
    /* teardown: rank 0's context is aborted and releases everything alone.
     * Rank 1's would be collective with a peer that is gone (the window's
     * deregistration): a job in this state ends; rank 1 leaves its objects
     * to the process's exit. */
    if (rank == 1) return;
    (void)etp_mem_free(ctx, didx);
    (void)etp_mem_free(ctx, dtok);
    (void)etp_mem_free(ctx, dw);
    (void)etp_mem_free(ctx, drecv);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

static void test_ll_missing_combine(void **state)
{
    (void)state;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    cfg.timeout_s = 4.0;
    etp_context_t *ctx = NULL;
    etp_group_t *world = NULL;
    etp_stream_t *s = NULL;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    ETP_OK(etp_context_world(ctx, &world));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    etp_ep_group_config_t gc = ETP_EP_GROUP_CONFIG_INIT;
    gc.name = "lonely-ll";
    gc.num_experts = 8;
    gc.hidden = 2048; /* two slices of a row: flags per slice */
    gc.max_tokens_per_rank = 64;
    gc.max_topk = 2;
    gc.recv_capacity_per_rank = 512;
    gc.transport = ETP_EP_TRANSPORT_NVLINK;
    etp_ep_group_t *ep = NULL;
    ETP_OK(etp_ep_group_create(world, &gc, &ep));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.topk = 2;
    lc.weighted = 0;
    lc.low_latency = 1;
    lc.max_tokens_per_rank = 64;
    etp_ep_layer_t *ly = NULL;
    ETP_OK(etp_ep_layer_create(ep, &lc, &ly));
    int64_t rows = 0;
    ETP_OK(etp_ep_layer_rows(ly, &rows));
    const int64_t T = 64, H = 2048;
    int64_t idx[64 * 2];
    for (int64_t t = 0; t < T; t++) {
        idx[2 * t] = t % 8;
        idx[2 * t + 1] = (t + 3) % 8;
    }
    void *didx = NULL, *dtok = NULL, *dy = NULL, *dout = NULL;
    ETP_OK(etp_mem_alloc(ctx, sizeof idx, ETP_MEM_USER, &didx));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(T * H) * 2, ETP_MEM_USER, &dtok));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(rows * H) * 2, ETP_MEM_USER, &dy));
    ETP_OK(etp_mem_alloc(ctx, (size_t)(T * H) * 2, ETP_MEM_USER, &dout));
    ETP_OK(etp_memcpy_async(s, didx, idx, sizeof idx));
    ETP_OK(etp_memset_async(s, dtok, 0, (size_t)(T * H) * 2));
    ETP_OK(etp_memset_async(s, dy, 0, (size_t)(rows * H) * 2));
    etp_ep_ll_dispatch_args_t a = ETP_EP_LL_DISPATCH_ARGS_INIT;
    a.topk_idx = didx;
    a.num_tokens = T;
    a.tokens = dtok;
    ETP_OK(etp_ep_ll_dispatch(ly, &a, NULL, s));
    ETP_OK(etp_stream_synchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    etp_status_t st = ETP_SUCCESS, st_check = ETP_SUCCESS;
    char msg[512] = "";
    if (rank == 0) {
        ETP_OK(etp_ep_ll_combine(ly, dy, ETP_DTYPE_BF16, rows, dout, s));
        st = etp_stream_synchronize(s);
        snprintf(msg, sizeof msg, "%s", etp_last_error());
        st_check = etp_context_check(ctx);
        print_message("rank 0: %s\n", msg);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        assert_int_equal(st, ETP_ERR_TIMEOUT);
        assert_non_null(strstr(msg, "'lonely-ll'"));
        assert_non_null(strstr(msg, "rank 1"));
        assert_non_null(strstr(msg, "low-latency combine"));
        assert_int_not_equal(st_check, ETP_SUCCESS);
    }
    /* teardown as above */
    if (rank == 1) return;
    (void)etp_mem_free(ctx, didx);
    (void)etp_mem_free(ctx, dtok);
    (void)etp_mem_free(ctx, dy);
    (void)etp_mem_free(ctx, dout);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
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
