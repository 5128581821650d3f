/*
 * The captured EP step on the host backend (labels mpi, ep, quant; 2 and 3 ranks,
 * eager and shuffle streams): host capture enforces CUDA's rules, so an EP
 * step that would not capture on a GPU fails here, in CI. The step and its
 * checks are those of the GPU test (tests/mpi/test_ep_graph.h).
 */
#define ETP_TEST_EP_MXFP8 1
#include "test_ep_steps.h"

#include "test_ep_graph.h"

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_graph");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graph_replay),
                                       cmocka_unit_test(test_exact_prepare_in_capture)};
    int failed = cmocka_run_group_tests_name("eager", tests, ep_host_setup_eager, ep_host_teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, ep_host_setup_shuffle, ep_host_teardown);
    return tu_mpi_finish(failed);
}
