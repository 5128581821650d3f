/*
 * Low-latency EP layers on the host backend (labels mpi, ep; 1 to 4
 * ranks, eager and shuffle streams), against the single-rank reference of
 * test_ep_ref.h (every rank replays every rank's routing and data from the
 * printed seed) and against an ordinary layer of an EXACT group: top-k 1,
 * 2, 6, both layouts, weighted and not, BF16 and F32 tokens, both combine
 * wires, T different per rank and 0 on some, the layer's T below the
 * group's, bad and repeated indices, drops (receive capacity and rows), T
 * on the device (past the layer's: clamped and flagged); two dispatches in
 * flight and the overwrite rule; a captured dispatch + combine replayed
 * with new routing; bad input refused.
 */
#include "test_ep_ll.h"

static gcfg_t ll_cfg(int64_t E, int64_t H, int maxk, etp_dtype_t dt)
{
    gcfg_t g = {0};
    g.R = g_size;
    g.me = g_rank;
    g.E = E;
    g.L = E / g_size;
    g.H = H;
    g.tmax = 13;
    g.maxk = maxk;
    g.dt = dt;
    g.transport = ETP_EP_TRANSPORT_NVLINK;
    g.overflow = ETP_EP_OVERFLOW_DROP;
    g.cf = 1.25;
    g.cap = ((int64_t)g_size * g.tmax * maxk + g.L * 8 + 7) / 8 * 8;
    return g;
}

/* top-k x layout x weighting, dtype and wire alternating, the layer's T
 * the group's or below it; three steps each (the halves alternate, the
 * first one refilled), the first also against an EXACT group. */
static void test_ll_matrix(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 6};
    uint64_t tag = 90000 + (uint64_t)f->mode * 10000;
    for (int ki = 0; ki < 3; ki++)
        for (int layout = 0; layout < 2; layout++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const int k = ks[ki], v = ki + layout + weighted;
                const etp_dtype_t dt = v % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
                gcfg_t g = ll_cfg(ep_experts_for(k), 20 + 4 * ki, k, dt);
                if (dt == ETP_DTYPE_BF16 && (ki + layout) % 2) g.wire = ETP_DTYPE_BF16;
                lcfg_t l = {.k = k,
                            .align = (ki + layout) % 2 ? 4 : 1,
                            .weighted = weighted,
                            .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                const int64_t tll = (v % 3) == 0 ? 0 : 9; /* 0: the group's 13 */
                ll_opts_t o = {.route = v % 2 ? ROUTE_SKEWED : ROUTE_UNIFORM,
                               .exact = 1,
                               .report = 1};
                ll_steps(f, &g, &l, tll, tag, 1, &o);
                o.exact = 0;
                ll_steps(f, &g, &l, tll, tag + 10, 3, &o);
                tag += 100;
            }
}

/* T = 0 on every rank, on all but one, on every other rank; bad and
 * repeated indices; drops: the receive capacity (tok_cap, in source rank
 * order) and the rows (PACKED's and FIXED_SLOTS'), as EXACT drops. */
static void test_ll_edges(void **state)
{
    ep_fx_t *f = *state;
    uint64_t tag = 120000 + (uint64_t)f->mode * 10000;
    static const int64_t zeros[64] = {0};
    int64_t one[64] = {0}, alt[64] = {0};
    one[g_size - 1] = 9;
    for (int r = 0; r < g_size; r++) alt[r] = r % 2 ? 0 : 1 + r % 9;
    const int64_t *Ts[3] = {zeros, one, alt};
    for (int v = 0; v < 6; v++) {
        gcfg_t g = ll_cfg(ep_experts_for(2), 16, 2, v % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32);
        lcfg_t l = {.k = 2,
                    .align = 2,
                    .weighted = v / 3 == 0,
                    .layout = v % 3 == 2 ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        ll_opts_t o = {.route = ROUTE_UNIFORM, .fixed_T = Ts[v % 3], .exact = v < 3, .report = 1};
        ll_steps(f, &g, &l, 9, tag, 2, &o);
        tag += 10;
    }
    for (int v = 0; v < 4; v++) {
        gcfg_t g = ll_cfg(ep_experts_for(3), 12, 3, v % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32);
        /* tight: few rows, and a receive buffer of fewer token rows than
         * arrive (v >= 2) */
        g.cap = 4 * (g.L + 1);
        lcfg_t l = {.k = 3,
                    .align = 1,
                    .weighted = v % 2,
                    .layout = v == 1 ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        ll_opts_t o = {.route = v >= 2 ? ROUTE_BAD : ROUTE_SKEWED, .exact = 1, .report = 1};
        ll_steps(f, &g, &l, 0, tag, 2, &o);
        tag += 10;
    }
}

/* T on the device: random, and past the layer's on rank 0 (clamped to it
 * and flagged). */
static void test_ll_device_tokens(void **state)
{
    ep_fx_t *f = *state;
    uint64_t tag = 140000 + (uint64_t)f->mode * 10000;
    gcfg_t g = ll_cfg(ep_experts_for(2), 16, 2, ETP_DTYPE_BF16);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ll_opts_t o = {.route = ROUTE_UNIFORM, .device_T = 1, .report = 1};
    ll_steps(f, &g, &l, 9, tag, 2, &o);
    /* rank 0's device T past the layer's 9: the reference takes 9 and the
     * counters the flag */
    int64_t raw[64];
    for (int r = 0; r < g_size; r++) raw[r] = r == 0 ? 9 : r % 10;
    ll_opts_t o2 = {.route = ROUTE_UNIFORM, .fixed_T = raw, .device_T = 1, .report = 0};
    ll_steps(f, &g, &l, 9, tag + 10, 1, &o2);
    etp_ep_group_t *ep = ep_make_group(f, &g);
    etp_ep_layer_t *ly = ll_make_layer(ep, &g, &l, 9, "clamp");
    ll_dev_t d;
    ll_dev_alloc(f, &g, &l, 9, &d);
    ll_in_t in;
    ll_in_make(&g, &l, 9, tag + 20, ROUTE_UNIFORM, raw, &in);
    ll_upload(f, &g, &l, 9, &in, tag + 20, &d, f->s0);
    const int32_t past = 9 + 5;
    if (g_rank == 0) ep_up(f->s0, d.tdev, &past, 4);
    etp_ep_ll_rows_t v = ETP_EP_LL_ROWS_INIT;
    ETP_OK(ll_dispatch_call(&g, ly, &in, &d, 1, &v, f->s0));
    ETP_OK(ll_combine_call(&g, &l, ly, &in, &d, 1, f->s0));
    ETP_OK(etp_stream_synchronize(f->s0));
    ll_check_rows(&g, &l, &in, tag + 20, &v, f->s0);
    ll_check_out(&g, &l, 9, &in, tag + 20, &d, f->s0);
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    (void)etp_ep_check(ly, &r);
    assert_int_equal((r.flags & ETP_EP_FLAG_BAD_TOKENS) != 0, g_rank == 0);
    ll_in_free(&in);
    ll_dev_free(f, &d);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

static void test_ll_overlap(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = ll_cfg(ep_experts_for(2), 24, 2, ETP_DTYPE_BF16);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ll_overlap(f, &g, &l, 0, 150000 + (uint64_t)f->mode * 100);
    gcfg_t g2 = ll_cfg(ep_experts_for(6), 12, 6, ETP_DTYPE_F32);
    lcfg_t l2 = {.k = 6, .align = 4, .weighted = 0, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
    ll_overlap(f, &g2, &l2, 7, 150050 + (uint64_t)f->mode * 100);
}

static void test_ll_graph(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = ll_cfg(ep_experts_for(4), 32, 4, ETP_DTYPE_BF16);
    g.wire = ETP_DTYPE_BF16;
    lcfg_t l = {.k = 4, .align = 2, .weighted = 1, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
    ll_graph(f, &g, &l, 11, 160000 + (uint64_t)f->mode * 100);
    gcfg_t g2 = ll_cfg(ep_experts_for(2), 16, 2, ETP_DTYPE_F32);
    lcfg_t l2 = {.k = 2, .align = 1, .weighted = 0, .layout = ETP_EP_LAYOUT_PACKED};
    ll_graph(f, &g2, &l2, 0, 160050 + (uint64_t)f->mode * 100);
}

static void test_ll_bad_input(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = ll_cfg(ep_experts_for(2), 16, 2, ETP_DTYPE_BF16);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    etp_ep_layer_config_t c = ETP_EP_LAYER_CONFIG_INIT;
    c.topk = 2;
    c.low_latency = 1;
    etp_ep_layer_t *ly = NULL;
    /* not NVLINK */
    for (int tr = 0; tr < 2; tr++) {
        gcfg_t ge = g;
        ge.transport = ep_transport(tr);
        etp_ep_group_t *ex = ep_make_group(f, &ge);
        ETP_EXPECT_MSG(etp_ep_layer_create(ex, &c, &ly), ETP_ERR_UNSUPPORTED, "nvlink transport");
        ETP_OK(etp_ep_group_destroy(ex));
    }
    etp_ep_group_t *ep = ep_make_group(f, &g);
    etp_ep_layer_config_t b = c;
    b.max_tokens_per_rank = g.tmax + 1;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &b, &ly), ETP_ERR_INVALID_ARGUMENT,
                   "max_tokens_per_rank");
    b.max_tokens_per_rank = -1;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &b, &ly), ETP_ERR_INVALID_ARGUMENT,
                   "max_tokens_per_rank");
    b = c;
    b.low_latency = 2;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &b, &ly), ETP_ERR_INVALID_ARGUMENT, "low_latency");
    b = c;
    b.low_latency = 0;
    b.max_tokens_per_rank = 4;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &b, &ly), ETP_ERR_INVALID_ARGUMENT,
                   "low-latency layers");
    /* the ordinary calls on a low-latency layer, and the reverse */
    etp_ep_layer_t *ll = ll_make_layer(ep, &g, &l, 5, "ll_bad");
    etp_ep_layer_t *ord = ep_make_layer(ep, &g, &l, "ordinary");
    ll_dev_t d;
    ll_dev_alloc(f, &g, &l, g.tmax, &d);
    void *grows = ep_dalloc(f, (size_t)(l.rows * g.H) * 2);
    etp_stream_t *s = f->s0;
    ETP_EXPECT_MSG(etp_ep_prepare(ll, d.idx, ETP_DTYPE_I64, 1, NULL, s), ETP_ERR_INVALID_ARGUMENT,
                   "etp_ep_ll_dispatch");
    ETP_EXPECT_MSG(etp_ep_dispatch(ll, d.tok, g.dt, d.w, ETP_DTYPE_F32, d.y, NULL, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "low-latency");
    ETP_EXPECT_MSG(etp_ep_combine(ll, d.y, g.dt, l.rows, d.out, s), ETP_ERR_INVALID_ARGUMENT,
                   "low-latency");
    ETP_EXPECT_MSG(etp_ep_dispatch_bwd(ll, grows, g.dt, NULL, l.rows, d.out, NULL, s),
                   ETP_ERR_INVALID_ARGUMENT, "no backward");
    ETP_EXPECT_MSG(etp_ep_combine_bwd(ll, d.out, g.dt, d.y, l.rows, grows, d.w, s),
                   ETP_ERR_INVALID_ARGUMENT, "no backward");
    etp_ep_ll_dispatch_args_t a = ETP_EP_LL_DISPATCH_ARGS_INIT;
    a.topk_idx = d.idx;
    a.num_tokens = 1;
    a.tokens = d.tok;
    a.topk_weights = d.w;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ord, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT,
                   "not a low-latency layer");
    ETP_EXPECT_MSG(etp_ep_ll_combine(ord, d.y, g.dt, l.rows, d.out, s), ETP_ERR_INVALID_ARGUMENT,
                   "not a low-latency layer");
    /* T past the layer's 5 (the group's is 13) */
    a.num_tokens = 6;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "num_tokens 6");
    a.num_tokens = 1;
    a.dtype = ETP_DTYPE_F32;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "dtype");
    a.dtype = ETP_DTYPE_BF16;
    a.idx_dtype = ETP_DTYPE_I32;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "i64");
    a.idx_dtype = ETP_DTYPE_I64;
    a.topk_weights = NULL;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "weighted");
    a.topk_weights = d.w;
    a.tokens = NULL;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'tokens'");
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, NULL, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'args'");
    a.tokens = d.tok;
    a.size = 4;
    ETP_EXPECT_MSG(etp_ep_ll_dispatch(ll, &a, NULL, s), ETP_ERR_INVALID_ARGUMENT, "size");
    ETP_EXPECT_MSG(etp_ep_ll_combine(ll, d.y, g.dt, l.rows, d.out, s), ETP_ERR_INVALID_STATE,
                   "no dispatch awaiting");
    /* after every refusal the layer still works */
    a.size = sizeof a;
    ETP_OK(etp_ep_ll_dispatch(ll, &a, NULL, s));
    ETP_EXPECT_MSG(etp_ep_ll_combine(ll, d.y, g.dt, l.rows - 1, d.out, s), ETP_ERR_INVALID_ARGUMENT,
                   "rows");
    ETP_EXPECT_MSG(etp_ep_ll_combine(ll, d.y, g.dt, l.rows, NULL, s), ETP_ERR_INVALID_ARGUMENT,
                   "'out'");
    ETP_OK(etp_ep_ll_combine(ll, d.y, g.dt, l.rows, d.out, s));
    ETP_OK(etp_stream_synchronize(s));
    /* top-k past what the low-latency kernels keep, and MXFP8 groups */
    gcfg_t gk = ll_cfg(ep_experts_for(17) + (int64_t)g_size * 4, 16, 17, ETP_DTYPE_BF16);
    etp_ep_group_t *ek = ep_make_group(f, &gk);
    b = c;
    b.topk = 17;
    ETP_EXPECT_MSG(etp_ep_layer_create(ek, &b, &ly), ETP_ERR_UNSUPPORTED, "top-k up to 16");
    ETP_OK(etp_ep_group_destroy(ek));
    gcfg_t gm = ll_cfg(ep_experts_for(2), 64, 2, ETP_DTYPE_BF16);
    gm.mx = 1;
    etp_ep_group_t *em = ep_make_group(f, &gm);
    ETP_EXPECT_MSG(etp_ep_layer_create(em, &c, &ly), ETP_ERR_UNSUPPORTED, "MXFP8");
    ETP_OK(etp_ep_group_destroy(em));
    ETP_OK(etp_mem_free(f->ctx, grows));
    ll_dev_free(f, &d);
    ETP_OK(etp_ep_layer_destroy(ll));
    ETP_OK(etp_ep_layer_destroy(ord));
    ETP_OK(etp_ep_group_destroy(ep));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_ll");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ll_bad_input), cmocka_unit_test(test_ll_matrix),
        cmocka_unit_test(test_ll_edges),     cmocka_unit_test(test_ll_device_tokens),
        cmocka_unit_test(test_ll_overlap),   cmocka_unit_test(test_ll_graph),
    };
    int failed = cmocka_run_group_tests_name("eager", tests, ep_host_setup_eager, ep_host_teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, ep_host_setup_shuffle,
                                          ep_host_teardown);
    return tu_mpi_finish(failed);
}
