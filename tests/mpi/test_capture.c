/*
 * Graph capture on the host backend follows CUDA's rules: captured work does
 * not run until launched, side streams join by events and must join back,
 * no waits on events from outside the capture, no host waits or
 * allocations during it; a graph replays with the buffers' current contents,
 * collectives included. Eager and shuffle stream modes.
 */
#include <math.h>

#include "mpi_util.h"

static etp_context_t *ctx_for(int mode)
{
    return tu_host_ctx(MPI_COMM_WORLD, mode, 0, -1, -1);
}

static void test_capture_records_then_replays(void **state)
{
    (void)state;
    for (int mode = ETP_HOST_STREAMS_EAGER; mode <= ETP_HOST_STREAMS_SHUFFLE; mode++) {
        etp_context_t *ctx = ctx_for(mode);
        etp_stream_t *s, *side;
        etp_event_t *fork, *back;
        ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
        ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &side));
        ETP_OK(etp_event_create(ctx, &fork));
        ETP_OK(etp_event_create(ctx, &back));
        enum { N = 64 };
        unsigned char src[N], mid[N], dst[N];
        memset(src, 1, N);
        memset(mid, 0, N);
        memset(dst, 0, N);
        etp_graph_t *g = NULL;
        ETP_OK(etp_stream_begin_capture(s));
        ETP_OK(etp_memcpy_async(s, mid, src, N));         /* s: src -> mid */
        ETP_OK(etp_event_record(fork, s));
        ETP_OK(etp_stream_wait_event(side, fork));         /* side joins */
        ETP_OK(etp_memcpy_async(side, dst, mid, N));       /* side: mid -> dst */
        ETP_OK(etp_event_record(back, side));
        ETP_OK(etp_stream_wait_event(s, back));            /* and joins back */
        ETP_OK(etp_stream_end_capture(s, &g));
        ETP_OK(etp_stream_synchronize(s));
        ETP_OK(etp_stream_synchronize(side));
        assert_int_equal(dst[0], 0); /* captured, not run */
        for (int it = 1; it <= 3; it++) {
            memset(src, it + 10, N); /* a replay reads the buffers as they are now */
            ETP_OK(etp_graph_launch(g, s));
            ETP_OK(etp_stream_synchronize(s));
            for (int i = 0; i < N; i++) assert_int_equal(dst[i], it + 10);
        }
        ETP_EXPECT_MSG(etp_context_destroy(ctx), ETP_ERR_BUSY, "1 graph(s)");
        ETP_OK(etp_graph_destroy(g));
        ETP_OK(etp_event_destroy(fork));
        ETP_OK(etp_event_destroy(back));
        ETP_OK(etp_stream_destroy(s));
        ETP_OK(etp_stream_destroy(side));
        ETP_OK(etp_context_destroy(ctx));
    }
}

static void test_capture_rules(void **state)
{
    (void)state;
    etp_context_t *ctx = ctx_for(ETP_HOST_STREAMS_SHUFFLE);
    etp_stream_t *s, *side;
    etp_event_t *before, *in, *back;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &side));
    ETP_OK(etp_event_create(ctx, &before));
    ETP_OK(etp_event_create(ctx, &in));
    ETP_OK(etp_event_create(ctx, &back));
    unsigned char a[16], b[16];
    etp_graph_t *g = NULL;
    void *p = NULL;

    /* work forked to a side stream and not joined back */
    ETP_OK(etp_stream_begin_capture(s));
    ETP_OK(etp_event_record(in, s));
    ETP_OK(etp_stream_wait_event(side, in));
    ETP_OK(etp_memset_async(side, a, 1, sizeof a));
    ETP_EXPECT_MSG(etp_stream_end_capture(s, &g), ETP_ERR_INVALID_STATE, "not joined back");
    assert_null(g);

    /* a wait on an event recorded before the capture */
    ETP_OK(etp_memset_async(side, b, 2, sizeof b));
    ETP_OK(etp_event_record(before, side));
    ETP_OK(etp_stream_begin_capture(s));
    ETP_EXPECT_MSG(etp_stream_wait_event(s, before), ETP_ERR_INVALID_STATE, "outside the capture");
    ETP_EXPECT_MSG(etp_stream_end_capture(s, &g), ETP_ERR_INVALID_STATE, "invalidated");

    /* host waits, allocations, a second capture, ending on the wrong stream */
    ETP_OK(etp_stream_begin_capture(s));
    ETP_EXPECT_MSG(etp_stream_synchronize(s), ETP_ERR_INVALID_STATE, "captured");
    ETP_EXPECT_MSG(etp_mem_alloc(ctx, 64, ETP_MEM_USER, &p), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_stream_begin_capture(side), ETP_ERR_INVALID_STATE, "in progress");
    ETP_EXPECT_MSG(etp_stream_end_capture(side, &g), ETP_ERR_INVALID_STATE, "not the one");
    ETP_OK(etp_event_record(in, s));
    ETP_EXPECT_MSG(etp_event_synchronize(in), ETP_ERR_INVALID_STATE, "during a capture");
    ETP_OK(etp_stream_end_capture(s, &g)); /* an empty graph is fine */
    /* an event recorded in a finished capture cannot be waited on */
    ETP_EXPECT_MSG(etp_stream_wait_event(side, in), ETP_ERR_INVALID_STATE, "has ended");
    ETP_OK(etp_graph_launch(g, s));
    ETP_OK(etp_graph_destroy(g));
    /* and after all that, the streams work */
    memset(a, 0, sizeof a);
    ETP_OK(etp_memset_async(s, a, 7, sizeof a));
    ETP_OK(etp_stream_synchronize(s));
    assert_int_equal(a[15], 7);
    ETP_OK(etp_event_destroy(before));
    ETP_OK(etp_event_destroy(in));
    ETP_OK(etp_event_destroy(back));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_stream_destroy(side));
    ETP_OK(etp_context_destroy(ctx));
}

/* With a user allocator too, an allocation during a capture is refused
 * before the allocator is asked (on CUDA, cudaMalloc would fail inside the
 * capture). */
static void test_capture_refuses_user_allocation(void **state)
{
    (void)state;
    tu_allocator_t a = {0};
    etp_context_t *ctx = tu_alloc_ctx(&a, ETP_HOST_STREAMS_EAGER, 0);
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    void *p = NULL;
    ETP_OK(etp_stream_begin_capture(s));
    ETP_EXPECT_MSG(etp_mem_alloc(ctx, 64, ETP_MEM_USER, &p), ETP_ERR_INVALID_STATE, "capture");
    assert_int_equal(a.allocs, 0);
    etp_graph_t *g = NULL;
    ETP_OK(etp_stream_end_capture(s, &g));
    ETP_OK(etp_graph_destroy(g));
    ETP_OK(etp_mem_alloc(ctx, 64, ETP_MEM_USER, &p)); /* after it: fine */
    assert_int_equal(a.allocs, 1);
    ETP_OK(etp_mem_free(ctx, p));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
}

/* One of each object that owns memory, a communicator or a stream, for the
 * capture tests below: a group, a chain of one F32 parameter [4 R, 8], a
 * quantizer, an EP group and layer, on a fresh context. */
typedef struct {
    etp_context_t *ctx;
    etp_group_t *world, *grp;
    etp_stream_t *s;
    etp_chain_t *chain;
    etp_param_t *prm;
    etp_quantizer_t *q;
    etp_ep_group_t *ep;
    etp_ep_layer_t *ly;
} objs_t;

/* An F32 parameter [4 R, 8] on grp, named nm. */
static etp_param_t *make_param(etp_context_t *ctx, etp_group_t *grp, const char *nm)
{
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.name = nm;
    pc.group = grp;
    pc.rows = 4 * g_size;
    pc.cols = 8;
    pc.dtype = ETP_DTYPE_F32;
    etp_param_t *p = NULL;
    ETP_OK(etp_param_create(ctx, &pc, &p));
    return p;
}

static void objs_make(objs_t *o, int mode)
{
    o->ctx = ctx_for(mode);
    ETP_OK(etp_context_world(o->ctx, &o->world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.num_roles = 2;
    ETP_OK(etp_group_split(o->world, 0, g_rank, &gc, &o->grp));
    ETP_OK(etp_stream_create(o->ctx, ETP_STREAM_PRIORITY_NORMAL, &o->s));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.name = "c";
    cc.group = o->grp;
    ETP_OK(etp_chain_create(o->ctx, &cc, &o->chain));
    o->prm = make_param(o->ctx, o->grp, "w");
    ETP_OK(etp_chain_add(o->chain, o->prm));
    ETP_OK(etp_chain_finalize(o->chain));
    etp_quantizer_config_t qc = ETP_QUANTIZER_CONFIG_INIT;
    ETP_OK(etp_quantizer_create(o->ctx, &qc, &o->q));
    etp_ep_group_config_t ec = ETP_EP_GROUP_CONFIG_INIT;
    ec.num_experts = 2 * g_size;
    ec.hidden = 16;
    ec.max_tokens_per_rank = 8;
    ec.max_topk = 1;
    ec.recv_capacity_per_rank = 8 * g_size;
    ETP_OK(etp_ep_group_create(o->world, &ec, &o->ep));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    ETP_OK(etp_ep_layer_create(o->ep, &lc, &o->ly));
}

static void objs_destroy(objs_t *o)
{
    ETP_OK(etp_ep_layer_destroy(o->ly));
    ETP_OK(etp_ep_group_destroy(o->ep));
    ETP_OK(etp_quantizer_destroy(o->q));
    ETP_OK(etp_chain_destroy(o->chain));
    ETP_OK(etp_param_destroy(o->prm));
    ETP_OK(etp_stream_destroy(o->s));
    ETP_OK(etp_group_destroy(o->grp));
    ETP_OK(etp_context_destroy(o->ctx));
}

/* Nothing that frees memory, a communicator or a stream goes during a
 * capture (on CUDA each would be an unsafe call inside it, and the host
 * backend would free what the graph may use): each destroy is refused
 * before it changes anything, and everything works after the capture. */
static void test_capture_refuses_destroy(void **state)
{
    (void)state;
    objs_t o;
    objs_make(&o, ETP_HOST_STREAMS_SHUFFLE);
    etp_context_t *ctx = o.ctx;
    etp_stream_t *s = o.s, *s2;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s2));
    void *mem = NULL;
    ETP_OK(etp_mem_alloc(ctx, 256, ETP_MEM_USER, &mem));
    etp_param_t *loose = make_param(ctx, o.grp, "loose"); /* in no chain */
    etp_memory_report_t before = ETP_MEMORY_REPORT_INIT, after = ETP_MEMORY_REPORT_INIT;
    ETP_OK(etp_memory_report(ctx, &before));

    ETP_OK(etp_stream_begin_capture(s));
    ETP_EXPECT_MSG(etp_mem_free(ctx, mem), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_stream_destroy(s2), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_stream_destroy(s), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_chain_destroy(o.chain), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_param_destroy(loose), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_quantizer_destroy(o.q), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_ep_layer_destroy(o.ly), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_ep_group_destroy(o.ep), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_group_destroy(o.grp), ETP_ERR_INVALID_STATE, "capture");
    ETP_EXPECT_MSG(etp_context_destroy(ctx), ETP_ERR_INVALID_STATE, "capture");
    etp_graph_t *g = NULL;
    ETP_OK(etp_stream_end_capture(s, &g));
    ETP_OK(etp_graph_destroy(g));

    /* nothing was freed, and the objects still work */
    ETP_OK(etp_memory_report(ctx, &after));
    assert_int_equal(after.total_bytes, before.total_bytes);
    assert_int_equal(after.live_allocations, before.live_allocations);
    ETP_OK(etp_memset_async(s2, mem, 5, 256));
    ETP_OK(etp_stream_synchronize(s2));
    assert_int_equal(((unsigned char *)mem)[255], 5);
    float full[4 * 8 * 64];
    assert_true(g_size <= 64);
    for (int i = 0; i < 4 * 8 * g_size; i++) full[i] = (float)(tu_rand(g_seed, 7, 0, (uint64_t)i) % 1000);
    ETP_OK(etp_param_load_full(o.prm, full, s));
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP_OK(etp_gather(o.prm, ETP_PASS_FORWARD, s, &v));
    ETP_OK(etp_stream_synchronize(s));
    for (int r = 0; r < g_size; r++)
        for (int i = 0; i < 4 * 8; i++) assert_true(((const float *)v.data)[r * 32 + i] == full[r * 32 + i]);
    ETP_OK(etp_release(o.prm, ETP_PASS_FORWARD, s));
    ETP_OK(etp_stream_synchronize(s));

    ETP_OK(etp_param_destroy(loose));
    ETP_OK(etp_mem_free(ctx, mem));
    ETP_OK(etp_stream_destroy(s2));
    objs_destroy(&o);
}

/* A graph holds what its captured calls use: a quantizer's scratch, a
 * chain's buffers, an EP group's and layer's, and a parameter in no chain
 * whose load or mark_updated it captured. Their destroys refuse while it
 * lives and go through after it. */
static void test_graph_holds_objects(void **state)
{
    (void)state;
    objs_t o;
    objs_make(&o, ETP_HOST_STREAMS_EAGER);
    float x[32], amax = -1.0f;
    for (int i = 0; i < 32; i++) x[i] = (float)(tu_rand(g_seed, 11, (uint64_t)g_rank, (uint64_t)i) % 1000) - 500.0f;
    const etp_quant_input_t in = {x, ETP_DTYPE_F32, 4, 8};
    /* in no chain: one loaded, one marked updated in the capture */
    etp_param_t *loaded = make_param(o.ctx, o.grp, "loaded");
    etp_param_t *marked = make_param(o.ctx, o.grp, "marked");
    float full[4 * 8 * 64];
    assert_true(g_size <= 64);
    for (int i = 0; i < 4 * 8 * g_size; i++) full[i] = (float)(tu_rand(g_seed, 12, 0, (uint64_t)i) % 1000);

    etp_graph_t *g = NULL;
    ETP_OK(etp_stream_begin_capture(o.s));
    ETP_OK(etp_quant_multi_amax(o.q, 1, &in, &amax, NULL, 1, o.s));
    ETP_OK(etp_zero_grad(o.chain, o.s));
    ETP_OK(etp_wait_grads(o.chain, o.s));
    ETP_OK(etp_ep_reset_report(o.ly, o.s));
    ETP_OK(etp_param_load_full(loaded, full, o.s));
    ETP_OK(etp_param_mark_updated(marked, o.s));
    ETP_OK(etp_stream_end_capture(o.s, &g));
    ETP_EXPECT_MSG(etp_quantizer_destroy(o.q), ETP_ERR_BUSY, "1 graph(s)");
    ETP_EXPECT_MSG(etp_chain_destroy(o.chain), ETP_ERR_BUSY, "1 graph(s)");
    ETP_EXPECT_MSG(etp_ep_layer_destroy(o.ly), ETP_ERR_BUSY, "1 graph(s)");
    ETP_EXPECT_MSG(etp_param_destroy(loaded), ETP_ERR_BUSY, "1 graph(s)");
    ETP_EXPECT_MSG(etp_param_destroy(marked), ETP_ERR_BUSY, "1 graph(s)");
    etp_param_info_t info = ETP_PARAM_INFO_INIT;
    ETP_OK(etp_param_info(loaded, &info));
    tu_poison(info.shard, 4 * 8 * sizeof(float));
    ETP_OK(etp_graph_launch(g, o.s)); /* all still there */
    ETP_OK(etp_stream_synchronize(o.s));
    float want = 0.0f;
    for (int i = 0; i < 32; i++) want = fabsf(x[i]) > want ? fabsf(x[i]) : want;
    assert_true(amax == want);
    /* the replay loaded this rank's rows of full into the shard */
    for (int i = 0; i < 4 * 8; i++) assert_true(((const float *)info.shard)[i] == full[g_rank * 32 + i]);
    ETP_OK(etp_graph_destroy(g));
    ETP_OK(etp_param_destroy(loaded));
    ETP_OK(etp_param_destroy(marked));
    objs_destroy(&o);
}

/* A captured all-reduce reduces what the buffers hold at each launch; its
 * group cannot be destroyed while the graph lives. */
static void test_captured_collective(void **state)
{
    (void)state;
    for (int mode = ETP_HOST_STREAMS_EAGER; mode <= ETP_HOST_STREAMS_SHUFFLE; mode++) {
        etp_context_t *ctx = ctx_for(mode);
        etp_group_t *world, *grp;
        etp_stream_t *s;
        ETP_OK(etp_context_world(ctx, &world));
        etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
        ETP_OK(etp_group_split(world, 0, g_rank, &gc, &grp));
        ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
        enum { N = 32 };
        int32_t in[N], out[N];
        etp_graph_t *g;
        ETP_OK(etp_stream_begin_capture(s));
        ETP_OK(etp_allreduce(grp, 0, in, out, N, ETP_DTYPE_I32, ETP_REDOP_SUM, s));
        ETP_OK(etp_stream_end_capture(s, &g));
        ETP_EXPECT_MSG(etp_group_destroy(grp), ETP_ERR_BUSY, "1 graph(s)");
        for (int it = 0; it < 3; it++) {
            for (int i = 0; i < N; i++) in[i] = (int32_t)(tu_rand(g_seed, (uint64_t)it, (uint64_t)g_rank, (uint64_t)i) % 1000);
            tu_poison(out, sizeof out);
            ETP_OK(etp_graph_launch(g, s));
            ETP_OK(etp_stream_synchronize(s));
            for (int i = 0; i < N; i++) {
                int32_t want = 0;
                for (int r = 0; r < g_size; r++)
                    want += (int32_t)(tu_rand(g_seed, (uint64_t)it, (uint64_t)r, (uint64_t)i) % 1000);
                assert_int_equal(out[i], want);
            }
        }
        ETP_OK(etp_graph_destroy(g));
        ETP_OK(etp_group_destroy(grp));
        ETP_OK(etp_stream_destroy(s));
        ETP_OK(etp_context_destroy(ctx));
    }
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_capture");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_records_then_replays),
        cmocka_unit_test(test_capture_rules),
        cmocka_unit_test(test_captured_collective),
        cmocka_unit_test(test_capture_refuses_user_allocation),
        cmocka_unit_test(test_capture_refuses_destroy),
        cmocka_unit_test(test_graph_holds_objects),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
