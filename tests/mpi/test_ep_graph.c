/*
 * The captured EP step on the host backend (label mpi;ep; 2, 3, 4 ranks,
 * eager and shuffle streams): host capture enforces CUDA's rules, so an EP
 * step that would not capture on a GPU fails here, in CI. The step and its
 * checks are those of the GPU test (tests/mpi/test_ep_graph.h).
 */
#define ETP_TEST_EP_MXFP8 1
#include "test_ep_steps.h"

#define EP_GRAPH_NEED(f) ((void)(f))
#include "test_ep_graph.h"

static int setup(void **state, int mode)
{
    ep_fx_t *f = calloc(1, sizeof *f);
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, 0, -1, -1);
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s0));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s1));
    *state = f;
    return 0;
}
static int setup_eager(void **state) { return setup(state, ETP_HOST_STREAMS_EAGER); }
static int setup_shuffle(void **state) { return setup(state, ETP_HOST_STREAMS_SHUFFLE); }

static int teardown(void **state)
{
    ep_fx_t *f = *state;
    ETP_OK(etp_stream_destroy(f->s0));
    ETP_OK(etp_stream_destroy(f->s1));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_graph");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graph_replay)};
    int failed = cmocka_run_group_tests_name("eager", tests, setup_eager, teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, setup_shuffle, teardown);
    return tu_mpi_finish(failed);
}
