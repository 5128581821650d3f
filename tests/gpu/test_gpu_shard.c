/*
 * The shard tests on the CUDA backend (1 and 2 GPUs): the same programs and
 * single-rank references as tests/mpi/test_shard.c, without the edge tests
 * (which need the host backend's shuffle mode). Skipped without a GPU.
 */
#include <cuda_runtime_api.h>

#define ETP_SHARD_TEST_CUDA 1
#include "../mpi/test_shard.c"
#include "gpu_util.h"

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_gpu_shard");
    if (tu_gpu_short("test_gpu_shard")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_every_seed),
        cmocka_unit_test(test_grad_stats),
        cmocka_unit_test(test_graphed_chain),
        cmocka_unit_test(test_prefetch_on_update),
        cmocka_unit_test(test_defer_zero_grad),
        cmocka_unit_test(test_recorded_chain),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_update_after_prefetch),
        cmocka_unit_test(test_forward_only_step),
        cmocka_unit_test(test_reuse_at_the_turn),
        cmocka_unit_test(test_record_reused_params),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
