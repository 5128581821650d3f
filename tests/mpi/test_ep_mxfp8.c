/*
 * MXFP8 dispatch (ETP_EP_TOKEN_MXFP8) on the host backend: BF16 tokens are
 * quantized once on their rank, data and E8M0 scales travel together, and
 * the received rows (data [rows, H], scales [rows, H/32], row-major) equal,
 * byte for byte, the quant module's host reference (etp__qref_quantize,
 * MXFP8 rowwise E4M3) of each source row, placed per the layer's layout;
 * combine, combine_bwd and dispatch_bwd of the same group stay BF16 and are
 * checked as in test_ep (tests/mpi/test_ep_steps.h). 2, 3 and 4 ranks,
 * eager and shuffle streams: top-k 1, 2, 8, both layouts, both transports,
 * weighted and not, T varying per rank including 0, misaligned tokens,
 * drops and bad indices, T on the device, two layers in one group, bad
 * input. Links the static archive for the reference.
 */
#define ETP_TEST_EP_MXFP8 1
#include "test_ep_steps.h"

/* An MXFP8 group (BF16 data calls) with room for everything. */
static gcfg_t mx_cfg(int64_t E, int64_t H, int maxk, etp_ep_transport_t tr)
{
    gcfg_t g = {0};
    g.R = g_size;
    g.me = g_rank;
    g.E = E;
    g.L = E / g_size;
    g.H = H;
    g.tmax = 13;
    g.maxk = maxk;
    g.dt = ETP_DTYPE_BF16;
    g.mx = 1;
    g.transport = tr;
    g.overflow = ETP_EP_OVERFLOW_DROP;
    g.cf = 1.25;
    g.cap = ((int64_t)g_size * g.tmax * maxk + g.L * 8 + 7) / 8 * 8;
    return g;
}

/* top-k x layout x transport x weighting; H from one block (48-byte wire
 * rows: padding) to 16 blocks; routing and misalignment alternating. */
static void test_mx_matrix(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 8};
    const int64_t Hs[] = {32, 96, 160, 512};
    uint64_t tag = 31000 + (uint64_t)f->mode * 100000;
    int cases = 0;
    for (int ki = 0; ki < 3; ki++)
        for (int layout = 0; layout < 2; layout++)
            for (int tr = 0; tr < EP_TRANSPORTS; tr++)
                for (int weighted = 0; weighted < 2; weighted++) {
                    const int k = ks[ki], v = ki + layout + tr + weighted;
                    gcfg_t g = mx_cfg(ep_experts_for(k), Hs[v % 4], k,
                                      ep_transport(tr));
                    g.cf = (layout + weighted) % 2 ? 1.0 : 8.0;
                    lcfg_t l = {.k = k, .align = (ki + layout) % 2 ? 4 : 1, .weighted = weighted,
                                .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                    ep_two_steps(f, &g, &l, "mx", v % 2 ? ROUTE_SKEWED : ROUTE_UNIFORM, v % 3 == 0, tag);
                    tag += 2;
                    cases++;
                }
    assert_int_equal(cases, 12 * EP_TRANSPORTS);
}

/* Every rank with T = 0 (every row zero: data and scales), and one rank
 * with all the tokens; the empty ranks pass NULL tokens, weights and
 * token-side outputs (ep_empty_ranks). Weighted and unweighted. */
static void test_mx_empty_ranks(void **state)
{
    ep_fx_t *f = *state;
    for (int tr = 0; tr < EP_TRANSPORTS; tr++)
        for (int layout = 0; layout < 2; layout++) {
            gcfg_t g = mx_cfg(ep_experts_for(2), 64, 2, ep_transport(tr));
            lcfg_t l = {.k = 2, .align = 2, .weighted = (tr + layout + 1) % 2,
                        .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
            ep_empty_ranks(f, &g, &l, 37000 + 10 * tr + layout, 37100 + 10 * tr + layout);
        }
}

/* Slabs and rows too small, bad and repeated indices: the reference drops
 * the same slots; every kept row still carries its token's exact bytes. */
static void test_mx_overflow(void **state)
{
    ep_fx_t *f = *state;
    for (int v = 0; v < 6; v++) {
        int tr = v % 3, k = v < 3 ? 2 : 8;
        gcfg_t g = mx_cfg(ep_experts_for(k), 96, k, ep_transport(tr));
        lcfg_t l = {.k = k, .align = v >= 3 ? 4 : 1, .weighted = 1,
                    .layout = v == 1 || v == 3 || v == 5 ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        ep_overflow_steps(f, &g, &l, ROUTE_SKEWED, 38000 + v, 38100 + v);
    }
}

/* CAPACITY with T on the device (in range, 0, out of range: clamped). */
static void test_mx_device_tokens(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = mx_cfg(ep_experts_for(2), 64, 2, ETP_EP_TRANSPORT_CAPACITY);
    g.cf = 4.0;
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ep_device_tokens(f, &g, &l, "devT", 39000);
}

/* Two layers of one MXFP8 group, different top-k, layout and alignment,
 * on two streams. */
static void test_mx_two_layers(void **state)
{
    ep_fx_t *f = *state;
    for (int tr = 0; tr < EP_TRANSPORTS; tr++) {
        gcfg_t g = mx_cfg(ep_experts_for(8), 128, 8, ep_transport(tr));
        g.cf = 4.0;
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l1 = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
        lcfg_t l2 = {.k = 8, .align = 8, .weighted = 0, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
        etp_ep_layer_t *a = ep_make_layer(ep, &g, &l1, "mx_a");
        etp_ep_layer_t *c = ep_make_layer(ep, &g, &l2, "mx_b");
        ep_bufs_t ba, bc;
        ep_bufs_alloc(f, &g, l1.rows, 2, &ba);
        ep_bufs_alloc(f, &g, l2.rows, 8, &bc);
        ep_step_opts_t o = {.route_mode = ROUTE_SKEWED, .check_report = 1};
        for (int it = 0; it < 2; it++) {
            ep_step(f, &g, &l1, a, f->s0, &ba, 39500 + 10 * tr + it, &o);
            ep_step(f, &g, &l2, c, f->s1, &bc, 39600 + 10 * tr + it, &o);
        }
        ep_bufs_free(f, &ba);
        ep_bufs_free(f, &bc);
        ETP_OK(etp_ep_layer_destroy(a));
        ETP_OK(etp_ep_layer_destroy(c));
        ETP_OK(etp_ep_group_destroy(ep));
    }
}

/* A literal case, independent of the reference: a row of 1.0 has block
 * amax 1, scale 2^ceil(log2(1/448)) = 2^-8 (E8M0 code 119 = 0x77) and
 * elements 1.0 * 2^8 = 256 (E4M3 code 0x78); a row of zeros has scale 0
 * and data 0. Every rank sends token 0 (ones) and token 1 (zeros) to
 * expert 0 of rank 0 (k = 1, PACKED). */
static void test_mx_literal(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = mx_cfg(ep_experts_for(1), 64, 1, ETP_EP_TRANSPORT_EXACT);
    etp_ep_group_t *ep = ep_make_group(f, &g);
    lcfg_t l = {.k = 1, .align = 1, .weighted = 0, .layout = ETP_EP_LAYOUT_PACKED};
    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "literal");
    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, 1, &b);
    const int64_t H = g.H, nb = H / 32, rows = l.rows;
    int64_t idx[2] = {0, 0};
    uint16_t tok[2 * 64];
    for (int64_t h = 0; h < H; h++) {
        tok[h] = etp__f32_to_bf16(1.0f);
        tok[H + h] = 0;
    }
    ep_up(f->s0, b.idx, idx, sizeof idx);
    ep_up(f->s0, b.tok, tok, sizeof tok);
    ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, 2, NULL, f->s0));
    /* rows with no token are zero by dispatch, not by the allocation */
    ETP_OK(etp_memset_async(f->s0, b.recv, 0xA5, (size_t)(rows * H)));
    ETP_OK(etp_memset_async(f->s0, b.recv_s, 0xA5, (size_t)(rows * nb)));
    etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
    da.tokens = b.tok;
    da.recv_tokens = b.recv;
    da.recv_scales = b.recv_s;
    da.rows = rows;
    ETP_OK(etp_ep_dispatch_ex(ly, &da, f->s0));
    uint8_t *data = malloc((size_t)(rows * H)), *sc = malloc((size_t)(rows * nb));
    ep_down(f->s0, data, b.recv, (size_t)(rows * H));
    ep_down(f->s0, sc, b.recv_s, (size_t)(rows * nb));
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        /* rank 0, expert 0: rows (s, 0), (s, 1) for s = 0 .. R-1 */
        int ones = g_rank == 0 && r < 2 * g_size && r % 2 == 0;
        for (int64_t h = 0; h < H; h++) bad += data[r * H + h] != (ones ? 0x78 : 0);
        for (int64_t q = 0; q < nb; q++) bad += sc[r * nb + q] != (ones ? 0x77 : 0);
    }
    assert_int_equal(bad, 0);
    free(data);
    free(sc);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* Bad input: a status and a message, nothing enqueued; the group works
 * afterwards (a full checked step). */
static void test_mx_bad_input(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = mx_cfg(ep_experts_for(2), 64, 2, ETP_EP_TRANSPORT_EXACT);
    etp_ep_group_config_t c = ETP_EP_GROUP_CONFIG_INIT;
    c.num_experts = g.E;
    c.hidden = 48; /* not a multiple of 32 */
    c.token_dtype = ETP_EP_TOKEN_MXFP8;
    c.max_tokens_per_rank = g.tmax;
    c.max_topk = 2;
    c.recv_capacity_per_rank = g.cap;
    etp_ep_group_t *ep = NULL;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &c, &ep), ETP_ERR_INVALID_ARGUMENT, "multiple of 32");
    c.hidden = 16;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &c, &ep), ETP_ERR_INVALID_ARGUMENT, "hidden 16");
    c.hidden = 64;
    c.token_dtype = (etp_dtype_t)101;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &c, &ep), ETP_ERR_INVALID_ARGUMENT, "token_dtype");
    assert_null(ep);

    ep = ep_make_group(f, &g);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "checked");
    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, 2, &b);
    etp_stream_t *s = f->s0;
    etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
    da.tokens = b.tok;
    da.topk_weights = b.w;
    da.recv_tokens = b.recv;
    da.recv_scales = b.recv_s;
    da.recv_weights = b.recv_w;
    da.rows = l.rows;
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &da, s), ETP_ERR_INVALID_STATE, "not been prepared");
    ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, 0, NULL, s));
    /* dispatch: BF16 tokens only, scales required, through dispatch_ex */
    etp_ep_dispatch_args_t bad = da;
    bad.dtype = ETP_DTYPE_F32;
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &bad, s), ETP_ERR_INVALID_ARGUMENT, "moves bf16");
    bad.dtype = ETP_EP_TOKEN_MXFP8;
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &bad, s), ETP_ERR_INVALID_ARGUMENT, "from bf16 tokens");
    bad = da;
    bad.recv_scales = NULL;
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &bad, s), ETP_ERR_INVALID_ARGUMENT, "recv_scales");
    bad = da;
    bad.rows = l.rows - 1;
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &bad, s), ETP_ERR_INVALID_ARGUMENT, "etp_ep_layer_rows");
    bad = da;
    bad.size = sizeof bad - 4; /* inside `rows` */
    ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &bad, s), ETP_ERR_INVALID_ARGUMENT, "size");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "etp_ep_dispatch_ex");
    /* a real dispatch (T = 0 everywhere), then the BF16-only calls */
    ETP_OK(etp_ep_dispatch_ex(ly, &da, s));
    ETP_EXPECT_MSG(etp_ep_combine(ly, b.y, ETP_EP_TOKEN_MXFP8, l.rows, b.out, s), ETP_ERR_INVALID_ARGUMENT,
                   "stay bf16");
    ETP_EXPECT_MSG(etp_ep_combine(ly, b.y, ETP_DTYPE_F32, l.rows, b.out, s), ETP_ERR_INVALID_ARGUMENT,
                   "moves bf16");
    ETP_EXPECT_MSG(etp_ep_combine_bwd(ly, b.gout, ETP_EP_TOKEN_MXFP8, b.y, l.rows, b.grows, b.gtopk, s),
                   ETP_ERR_INVALID_ARGUMENT, "stay bf16");
    ETP_EXPECT_MSG(etp_ep_dispatch_bwd(ly, b.grows_in, ETP_EP_TOKEN_MXFP8, b.gw_in, l.rows, b.gtok, b.gtopk2, s),
                   ETP_ERR_INVALID_ARGUMENT, "stay bf16");
    ETP_OK(etp_ep_combine(ly, b.y, ETP_DTYPE_BF16, l.rows, b.out, s));
    ETP_OK(etp_stream_synchronize(s));
    /* still works */
    ep_step_opts_t o = {.route_mode = ROUTE_UNIFORM, .check_report = 1};
    ep_step(f, &g, &l, ly, s, &b, 39900, &o);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_mxfp8");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mx_literal),       cmocka_unit_test(test_mx_bad_input),
        cmocka_unit_test(test_mx_matrix),        cmocka_unit_test(test_mx_empty_ranks),
        cmocka_unit_test(test_mx_overflow),      cmocka_unit_test(test_mx_device_tokens),
        cmocka_unit_test(test_mx_two_layers),
    };
    int failed = cmocka_run_group_tests_name("eager", tests, ep_host_setup_eager, ep_host_teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, ep_host_setup_shuffle, ep_host_teardown);
    return tu_mpi_finish(failed);
}
