/*
 * Steady state allocates nothing: a 24-parameter chain runs many steps
 * (ETP_TEST_STEPS, 20 by default; the soak variant 1000) and the memory
 * report after step 1 never changes.
 */
#include "mpi_util.h"

static void test_memory_is_flat(void **state)
{
    (void)state;
    const char *env = getenv("ETP_TEST_STEPS");
    int steps = env ? atoi(env) : 20;
    etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_EAGER, 0, -1, -1);
    etp_group_t *world, *tp;
    ETP_OK(etp_context_world(ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.num_roles = 2;
    ETP_OK(etp_group_split(world, 0, g_rank, &gc, &tp));
    etp_stream_t *main_s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &main_s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.group = tp;
    cc.depth = 2;
    etp_chain_t *chain;
    ETP_OK(etp_chain_create(ctx, &cc, &chain));
    enum { N = 24 };
    etp_param_t *p[N];
    for (int i = 0; i < N; i++) {
        etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
        pc.group = tp;
        pc.experts = 1 + i % 3;
        pc.rows = 8 + (int64_t)(tu_rand(g_seed, 1, (uint64_t)i, 0) % 40);
        pc.cols = 4 + i % 5;
        pc.dtype = i % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
        pc.upcast_wgrad = i % 4 == 1;
        ETP_OK(etp_param_create(ctx, &pc, &p[i]));
        ETP_OK(etp_chain_add(chain, p[i]));
    }
    ETP_OK(etp_chain_finalize(chain));
    etp_memory_report_t first = ETP_MEMORY_REPORT_INIT, now = ETP_MEMORY_REPORT_INIT;
    for (int step = 0; step < steps; step++) {
        ETP_OK(etp_zero_grad(chain, main_s));
        etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
        for (int i = 0; i < N; i++) {
            ETP_OK(etp_gather(p[i], ETP_PASS_FORWARD, main_s, &v));
            ETP_OK(etp_release(p[i], ETP_PASS_FORWARD, main_s));
        }
        for (int i = N - 1; i >= 0; i--) {
            ETP_OK(etp_gather(p[i], ETP_PASS_BACKWARD, main_s, &v));
            ETP_OK(etp_release(p[i], ETP_PASS_BACKWARD, main_s));
            ETP_OK(etp_wgrad_buffer(p[i], main_s, &v));
            ETP_OK(etp_memset_async(main_s, v.data, 0,
                                    (size_t)(v.experts * v.expert_stride) * etp_dtype_size(v.dtype)));
            ETP_OK(etp_reduce_grad(p[i], main_s, 1.0f));
        }
        ETP_OK(etp_wait_grads(chain, main_s));
        ETP_OK(etp_stream_synchronize(main_s));
        if (step == 0) {
            ETP_OK(etp_memory_report(ctx, &first));
        } else {
            ETP_OK(etp_memory_report(ctx, &now));
            assert_memory_equal(now.bytes, first.bytes, sizeof now.bytes);
            assert_int_equal(now.live_allocations, first.live_allocations);
            assert_int_equal(now.peak_bytes, first.peak_bytes);
        }
    }
    if (g_rank == 0)
        printf("%d steps: %zu bytes in %zu buffers throughout (gather slots %zu)\n", steps,
               first.total_bytes, first.live_allocations, first.bytes[ETP_MEM_GATHER_SLOTS]);
    etp_stream_t *ag, *rs;
    ETP_OK(etp_chain_streams(chain, &ag, &rs));
    ETP_OK(etp_stream_synchronize(ag));
    ETP_OK(etp_stream_synchronize(rs));
    ETP_OK(etp_chain_destroy(chain));
    for (int i = 0; i < N; i++) ETP_OK(etp_param_destroy(p[i]));
    ETP_OK(etp_stream_destroy(main_s));
    ETP_OK(etp_group_destroy(tp));
    ETP_OK(etp_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_shard_memory");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_memory_is_flat)};
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
