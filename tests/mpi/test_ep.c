/*
 * Expert parallelism on the host backend, against the single-rank reference
 * of test_ep_ref.h (every rank replays every rank's routing and data from
 * the printed seed): 2, 3 and 4 ranks, T varying per rank including 0 (the
 * empty ranks passing NULL for their empty arrays), top-k 1, 2, 6, 8
 * with -1 slots, uniform and skewed routing, both layouts, weighted and
 * unweighted, both transports, BF16 and F32; two
 * layers of different top-k and alignment interleaved on two streams;
 * adjoints; overflow and bad indices under both policies; T on the device;
 * many steps with an unchanged memory report; bad input; more than 2^16
 * local experts; the trace callback. Everything runs in eager and in
 * shuffle stream mode.
 *
 * ETP_EP_STEPS sets the number of steps of the memory test (default 100;
 * the soak registration uses 10000).
 */
#include "test_ep_steps.h"

static gcfg_t base_cfg(int64_t E, int64_t H, int maxk, etp_dtype_t dt, etp_ep_transport_t tr)
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
    g.transport = tr;
    g.overflow = ETP_EP_OVERFLOW_DROP;
    g.cf = 1.25;
    /* room for everything: R ranks x tmax tokens x k rows, plus padding */
    g.cap = ((int64_t)g_size * g.tmax * maxk + g.L * 8 + 7) / 8 * 8;
    return g;
}

/* The matrix: top-k x routing x layout x weighting x transport, dtype
 * alternating; capacity factors that drop and that do not. */
static void test_matrix(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 6, 8};
    uint64_t tag = 1000 + (uint64_t)f->mode * 100000;
    int cases = 0;
    for (int ki = 0; ki < 4; ki++)
        for (int route = 0; route < 2; route++)
            for (int layout = 0; layout < 2; layout++)
                for (int weighted = 0; weighted < 2; weighted++)
                    for (int tr = 0; tr < EP_TRANSPORTS; tr++) {
                        int k = ks[ki];
                        etp_dtype_t dt = (ki + route + layout + weighted + tr) % 2 ? ETP_DTYPE_BF16
                                                                                  : ETP_DTYPE_F32;
                        gcfg_t g = base_cfg(ep_experts_for(k), 20 + 3 * ki, k, dt,
                                            ep_transport(tr));
                        g.cf = (layout + weighted) % 2 ? 1.0 : 8.0;
                        /* half the BF16 cases send BF16 partials back */
                        if (dt == ETP_DTYPE_BF16 && (ki + layout) % 2) g.wire = ETP_DTYPE_BF16;
                        lcfg_t l = {.k = k, .align = (ki + layout) % 2 ? 4 : 1,
                                    .weighted = weighted,
                                    .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                        ep_two_steps(f, &g, &l, "moe", route, 0, tag);
                        tag += 2;
                        cases++;
                    }
    assert_int_equal(cases, 32 * EP_TRANSPORTS);
}

/* Every rank with T = 0, and one rank with all the tokens, the empty ranks
 * passing NULL for their empty arrays: both transports, both layouts,
 * weighted and not. */
static void test_empty_ranks(void **state)
{
    ep_fx_t *f = *state;
    for (int v = 0; v < 12; v++) {
        const int tr = v % 3, layout = v / 3 % 2, weighted = v / 6;
        gcfg_t g = base_cfg(ep_experts_for(2), 8, 2, v % 3 ? ETP_DTYPE_F32 : ETP_DTYPE_BF16,
                            ep_transport(tr));
        lcfg_t l = {.k = 2, .align = 2, .weighted = weighted,
                    .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        ep_empty_ranks(f, &g, &l, 7000 + 10 * (uint64_t)v, 7100 + 10 * (uint64_t)v);
    }
}

/* Two layers of one group with different top-k, alignment and layout,
 * their calls interleaved, on two streams (the group orders them). */
static void test_two_layers(void **state)
{
    ep_fx_t *f = *state;
    for (int tr = 0; tr < EP_TRANSPORTS; tr++) {
        gcfg_t g = base_cfg(ep_experts_for(6), 300, 6, ETP_DTYPE_BF16,
                            ep_transport(tr));
        g.cf = 4.0;
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l1 = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
        lcfg_t l2 = {.k = 6, .align = 8, .weighted = 0, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
        etp_ep_layer_t *a = ep_make_layer(ep, &g, &l1, "moe_a");
        etp_ep_layer_t *c = ep_make_layer(ep, &g, &l2, "moe_b");
        ep_bufs_t ba, bc;
        ep_bufs_alloc(f, &g, l1.rows, 2, &ba);
        ep_bufs_alloc(f, &g, l2.rows, 6, &bc);
        ep_step_opts_t o = {.route_mode = ROUTE_SKEWED, .check_report = 1};
        for (int it = 0; it < 2; it++) {
            ep_step(f, &g, &l1, a, f->s0, &ba, 8000 + 10 * tr + it, &o);
            ep_step(f, &g, &l2, c, f->s1, &bc, 8100 + 10 * tr + it, &o);
        }
        /* interleaved: a's routing must survive c's calls in between */
        const int64_t H = g.H;
        const size_t es = 2;
        ref_t ra, rc;
        ref_build(&ra, &g, &l1, 8200 + tr, ROUTE_UNIFORM, NULL);
        ref_build(&rc, &g, &l2, 8300 + tr, ROUTE_SKEWED, NULL);
        int64_t Ta = ra.T[g_rank], Tc = rc.T[g_rank];
        /* both layers send rows of tok: fill as many as the larger T needs
         * (c's tokens past Ta were uninitialized heap before) */
        const int64_t Tmax = Ta > Tc ? Ta : Tc;
        uint16_t *tok = malloc((size_t)(g.tmax * H) * es);
        float *w = malloc((size_t)(g.tmax * 6) * 4);
        for (int64_t i = 0; i < Tmax * H; i++) tok[i] = etp__f32_to_bf16(ep_val(8200 + tr, (uint64_t)g_rank, (uint64_t)i));
        for (int64_t i = 0; i < Ta * 2; i++) w[i] = ep_weight((8200 + tr) * 16 + TAG_W, (uint64_t)g_rank, (uint64_t)i);
        ep_up(f->s0, ba.idx, ra.idx[g_rank], (size_t)(Ta * 2) * 8);
        ep_up(f->s0, ba.tok, tok, (size_t)(Ta * H) * es);
        ep_up(f->s0, ba.w, w, (size_t)(Ta * 2) * 4);
        ep_up(f->s1, bc.idx, rc.idx[g_rank], (size_t)(Tc * 6) * 8);
        ep_up(f->s1, bc.tok, tok, (size_t)(Tc * H) * es);
        ETP_OK(etp_stream_synchronize(f->s0));
        ETP_OK(etp_stream_synchronize(f->s1));
        ETP_OK(etp_ep_prepare(a, ba.idx, ETP_DTYPE_I64, Ta, NULL, f->s0));
        ETP_OK(etp_ep_prepare(c, bc.idx, ETP_DTYPE_I64, Tc, NULL, f->s1));
        ETP_OK(etp_ep_dispatch(a, ba.tok, ETP_DTYPE_BF16, ba.w, ETP_DTYPE_F32, ba.recv, ba.recv_w, l1.rows, f->s0));
        ETP_OK(etp_ep_dispatch(c, bc.tok, ETP_DTYPE_BF16, NULL, ETP_DTYPE_F32, bc.recv, NULL, l2.rows, f->s1));
        /* a combines its own dispatch output: each token comes back as the
         * weighted sum of its copies (all rows kept: sum of weights x token) */
        ETP_OK(etp_ep_combine(c, bc.recv, ETP_DTYPE_BF16, l2.rows, bc.out, f->s1));
        ETP_OK(etp_ep_combine(a, ba.recv, ETP_DTYPE_BF16, l1.rows, ba.out, f->s0));
        uint16_t *out = malloc((size_t)(g.tmax * H) * es);
        ep_down(f->s0, out, ba.out, (size_t)(Ta * H) * es);
        int64_t bad = 0;
        for (int64_t t = 0; t < Ta; t++) {
            for (int64_t h = 0; h < H; h++) {
                float acc = 0.0f, x = etp__bf16_to_f32(tok[t * H + h]);
                for (int d = 0; d < g_size; d++) {
                    float part = 0.0f;
                    int used[8] = {0};
                    for (;;) {
                        int best = -1;
                        for (int j = 0; j < 2; j++)
                            if (!used[j] && ra.row[g_rank][t * 2 + j] >= 0 && ra.dest[g_rank][t * 2 + j] == d &&
                                (best < 0 || ra.idx[g_rank][t * 2 + j] < ra.idx[g_rank][t * 2 + best]))
                                best = j;
                        if (best < 0) break;
                        used[best] = 1;
                        part = fmaf(w[t * 2 + best], x, part);
                    }
                    acc += part;
                }
                bad += out[t * H + h] != etp__f32_to_bf16(acc);
            }
        }
        ep_down(f->s1, out, bc.out, (size_t)(Tc * H) * es);
        for (int64_t t = 0; t < Tc; t++)
            for (int64_t h = 0; h < H; h++) {
                float acc = 0.0f, x = etp__bf16_to_f32(tok[t * H + h]);
                for (int d = 0; d < g_size; d++) {
                    float part = 0.0f;
                    for (int j = 0; j < 6; j++)
                        if (rc.row[g_rank][t * 6 + j] >= 0 && rc.dest[g_rank][t * 6 + j] == d) part += x;
                    acc += part;
                }
                bad += out[t * H + h] != etp__f32_to_bf16(acc);
            }
        if (bad) print_error("two layers interleaved: %lld wrong values\n", (long long)bad);
        assert_int_equal(bad, 0);
        free(out);
        free(tok);
        free(w);
        ref_free(&ra);
        ref_free(&rc);
        ep_bufs_free(f, &ba);
        ep_bufs_free(f, &bc);
        ETP_OK(etp_ep_layer_destroy(a));
        ETP_OK(etp_ep_layer_destroy(c));
        ETP_OK(etp_ep_group_destroy(ep));
    }
}

/* Capacity exceeded in every way, and bad indices, under the drop policy:
 * outputs still equal the reference (which drops the same slots) and the
 * counters say what was dropped. */
static void test_overflow_drop(void **state)
{
    ep_fx_t *f = *state;
    for (int v = 0; v < 9; v++) {
        int tr = v % 3, k = v < 3 ? 2 : 6;
        gcfg_t g = base_cfg(ep_experts_for(k), 12, k, ETP_DTYPE_F32,
                            ep_transport(tr));
        lcfg_t l = {.k = k, .align = v >= 6 ? 4 : 1, .weighted = 1,
                    .layout = v / 3 == 1 ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        ep_overflow_steps(f, &g, &l, v >= 7 ? ROUTE_BAD : ROUTE_SKEWED, 9000 + v, 9100 + v);
    }
}

/* The error policy: a raised flag is an error of check and poll naming the
 * rank, the layer and the capacity needed; ranks without one succeed. */
static void test_overflow_error(void **state)
{
    ep_fx_t *f = *state;
    for (int v = 0; v < 6; v++) {
        int tr = v % 3;
        gcfg_t g = base_cfg(ep_experts_for(2), 4, 2, ETP_DTYPE_F32,
                            ep_transport(tr));
        g.overflow = ETP_EP_OVERFLOW_ERROR;
        g.cf = 0.2;
        g.cap = v >= 3 ? 2 * g.L : g.cap;
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l = {.k = 2, .align = 1, .weighted = 0, .layout = ETP_EP_LAYOUT_PACKED};
        etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "strict");
        ep_bufs_t b;
        ep_bufs_alloc(f, &g, l.rows, 2, &b);
        int64_t Ts[64];
        for (int r = 0; r < g_size; r++) Ts[r] = g.tmax;
        /* v 2: NVLINK drops nothing for cf (it has no slabs to fill) */
        int mode = v == 0 || v == 2 ? ROUTE_BAD : ROUTE_SKEWED;
        ep_step_opts_t o = {.route_mode = mode, .fixed_T = Ts, .check_report = 1};
        ep_step(f, &g, &l, ly, f->s0, &b, 9500 + v, &o);
        ref_t rf;
        ref_build(&rf, &g, &l, 9500 + v, mode, Ts);
        const ref_stats_t *w = &rf.st[g_rank];
        etp_ep_report_t r = ETP_EP_REPORT_INIT;
        char layer_rank[64];
        snprintf(layer_rank, sizeof layer_rank, "rank %d of %d", g_rank, g_size);
        if (w->flags & (ETP_EP_FLAG_BAD_INDEX | ETP_EP_FLAG_DUPLICATE)) {
            ETP_EXPECT_MSG(etp_ep_check(ly, &r), ETP_ERR_INVALID_ARGUMENT, "'strict'");
            assert_non_null(strstr(etp_last_error(), layer_rank));
        } else if (w->flags) {
            ETP_EXPECT_MSG(etp_ep_check(ly, &r), ETP_ERR_CAPACITY, "needed");
            assert_non_null(strstr(etp_last_error(), layer_rank));
            assert_non_null(strstr(etp_last_error(), "'strict'"));
            char need[64];
            snprintf(need, sizeof need, "needed %lld",
                     (long long)((w->flags & ETP_EP_FLAG_TRANSPORT_FULL) ? w->tneed : w->rneed));
            assert_non_null(strstr(etp_last_error(), need));
            ETP_EXPECT(etp_ep_poll(ly, &r), ETP_ERR_CAPACITY);
        } else {
            ETP_OK(etp_ep_check(ly, &r));
        }
        assert_int_equal(r.flags, w->flags);
        /* in these sizes at least one rank overflows */
        int any = w->flags != 0, all = 0;
        MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        assert_int_equal(all, 1);
        ETP_OK(etp_ep_reset_report(ly, f->s0));
        ETP_OK(etp_ep_check(ly, &r));
        assert_int_equal(r.flags, 0);
        ref_free(&rf);
        ep_bufs_free(f, &b);
        ETP_OK(etp_ep_layer_destroy(ly));
        ETP_OK(etp_ep_group_destroy(ep));
    }
}

/* Which transport a group takes: AUTO (the default) is NVLINK on the host
 * backend; ETP_EP_TRANSPORT (read when a context is made) chooses for AUTO
 * groups only; an explicit transport wins; a value that names no transport
 * fails the context's creation naming the variable. The info says what was
 * taken. */
static void test_transport_choice(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = base_cfg(ep_experts_for(2), 8, 2, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_AUTO);
    etp_ep_group_config_t c = ETP_EP_GROUP_CONFIG_INIT;
    assert_int_equal(c.transport, ETP_EP_TRANSPORT_AUTO);
    assert_int_equal(c.combine_wire, ETP_DTYPE_F32);
    c.num_experts = g.E;
    c.hidden = g.H;
    c.max_tokens_per_rank = g.tmax;
    c.max_topk = 2;
    c.recv_capacity_per_rank = g.cap;
    const char *envs[] = {NULL, "exact", "capacity", "nvlink", "AUTO"};
    const etp_ep_transport_t want[] = {ETP_EP_TRANSPORT_NVLINK, ETP_EP_TRANSPORT_EXACT,
                                       ETP_EP_TRANSPORT_CAPACITY, ETP_EP_TRANSPORT_NVLINK,
                                       ETP_EP_TRANSPORT_NVLINK};
    for (int i = 0; i < 5; i++) {
        if (envs[i]) setenv("ETP_EP_TRANSPORT", envs[i], 1);
        etp_context_t *ctx = tu_host_ctx(MPI_COMM_WORLD, f->mode, 1, -1, -1);
        unsetenv("ETP_EP_TRANSPORT");
        etp_group_t *world = NULL;
        ETP_OK(etp_context_world(ctx, &world));
        for (int expl = 0; expl < 2; expl++) {
            etp_ep_group_config_t cc = c;
            /* an explicit transport is kept, whatever the environment says */
            cc.transport = expl ? ETP_EP_TRANSPORT_CAPACITY : ETP_EP_TRANSPORT_AUTO;
            etp_ep_group_t *ep = NULL;
            ETP_OK(etp_ep_group_create(world, &cc, &ep));
            etp_ep_group_info_t info = ETP_EP_GROUP_INFO_INIT;
            ETP_OK(etp_ep_group_info(ep, &info));
            assert_int_equal(info.transport, expl ? ETP_EP_TRANSPORT_CAPACITY : want[i]);
            assert_int_equal(info.combine_wire, ETP_DTYPE_F32);
            assert_int_equal(info.num_sms, 0); /* the host backend runs no NVLink kernels */
            ETP_OK(etp_ep_group_destroy(ep));
        }
        ETP_OK(etp_context_destroy(ctx));
    }
    setenv("ETP_EP_TRANSPORT", "nvl", 1);
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_HOST;
    etp_context_t *ctx = NULL;
    ETP_EXPECT_MSG(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx), ETP_ERR_INVALID_ARGUMENT,
                   "ETP_EP_TRANSPORT");
    unsetenv("ETP_EP_TRANSPORT");
}

/* T read on the device (the capture path): in range, 0, and out of range
 * (clamped and flagged). */
static void test_device_tokens(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = base_cfg(ep_experts_for(2), 10, 2, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_NVLINK);
    lcfg_t l = {.k = 2, .align = 2, .weighted = 1, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
    g.cap = 4 * g.L; /* NVLINK: a device T that overflows the receive capacity */
    ep_device_tokens(f, &g, &l, "graphable_nvl", 9650);
    g = base_cfg(ep_experts_for(2), 10, 2, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_CAPACITY);
    g.cf = 8;
    ep_device_tokens(f, &g, &l, "graphable", 9700);

    /* T on the device is unknown at enqueue: no array of T rows may be
     * NULL, even where T turns out 0 */
    etp_ep_group_t *ep = ep_make_group(f, &g);
    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "devT");
    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, l.k, &b);
    const int32_t zero = 0;
    ep_up(f->s0, b.tdev, &zero, sizeof zero);
    ETP_EXPECT_MSG(etp_ep_prepare(ly, NULL, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, b.tdev, f->s0),
                   ETP_ERR_INVALID_ARGUMENT, "'topk_idx' is NULL; with a device token count");
    ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, b.tdev, f->s0));
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, NULL, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F32, b.recv, b.recv_w,
                                   l.rows, f->s0),
                   ETP_ERR_INVALID_ARGUMENT, "'tokens' is NULL; EP layer 'devT' was prepared with a device");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, NULL, ETP_DTYPE_F32, b.recv, b.recv_w,
                                   l.rows, f->s0),
                   ETP_ERR_INVALID_ARGUMENT, "'topk_weights' is NULL, but EP layer 'devT' is weighted");
    ETP_OK(etp_stream_synchronize(f->s0));
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* Many steps of random routing through two layers: the memory report
 * never changes (nothing is allocated after creation). */
static void test_memory_steady(void **state)
{
    ep_fx_t *f = *state;
    const char *env = getenv("ETP_EP_STEPS");
    long steps = env && *env ? strtol(env, NULL, 10) : 100;
    if (f->mode == ETP_HOST_STREAMS_SHUFFLE && steps > 100) steps /= 10;
    for (int tr = 0; tr < EP_TRANSPORTS; tr++) {
        gcfg_t g = base_cfg(ep_experts_for(4), 16, 4, ETP_DTYPE_BF16,
                            ep_transport(tr));
        g.cf = 1.0;
        g.cap = g.cap / 2 / 8 * 8; /* some steps overflow */
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l1 = {.k = 4, .align = 8, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
        lcfg_t l2 = {.k = 1, .align = 1, .weighted = 0, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
        etp_ep_layer_t *a = ep_make_layer(ep, &g, &l1, "a");
        etp_ep_layer_t *c = ep_make_layer(ep, &g, &l2, "c");
        etp_ep_group_info_t info = ETP_EP_GROUP_INFO_INIT;
        ETP_OK(etp_ep_group_info(ep, &info));
        etp_memory_report_t m0 = ETP_MEMORY_REPORT_INIT, m1 = ETP_MEMORY_REPORT_INIT;
        ETP_OK(etp_memory_report(f->ctx, &m0));
        assert_true(m0.bytes[ETP_MEM_EP_BUFFERS] >= info.buffer_bytes);
        int64_t *idx = malloc((size_t)g.tmax * 4 * 8);
        uint16_t *tok = malloc((size_t)(g.tmax * g.H) * 2);
        float *w = malloc((size_t)g.tmax * 4 * 4);
        int64_t *didx;
        void *dtok, *drecv, *dout;
        float *dw, *drw;
        const int64_t rows = l1.rows > l2.rows ? l1.rows : l2.rows;
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)g.tmax * 4 * 8, ETP_MEM_USER, (void **)&didx));
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)(g.tmax * g.H) * 2, ETP_MEM_USER, &dtok));
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)g.tmax * 4 * 4, ETP_MEM_USER, (void **)&dw));
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)(rows * g.H) * 2, ETP_MEM_USER, &drecv));
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)rows * 4, ETP_MEM_USER, (void **)&drw));
        ETP_OK(etp_mem_alloc(f->ctx, (size_t)(g.tmax * g.H) * 2, ETP_MEM_USER, &dout));
        ETP_OK(etp_memory_report(f->ctx, &m0));
        for (long st = 0; st < steps; st++) {
            uint64_t tag = 20000 + (uint64_t)st;
            int64_t T = ep_tokens(tag, g_rank, g.tmax);
            for (int li = 0; li < 2; li++) {
                etp_ep_layer_t *ly = li ? c : a;
                int k = li ? 1 : 4;
                int64_t lrows = li ? l2.rows : l1.rows;
                ep_route(tag + (uint64_t)li, g_rank, T, k, g.E, (int)(st % 2), idx);
                for (int64_t i = 0; i < T * g.H; i++) tok[i] = (uint16_t)(0x3f80 + i % 64);
                for (int64_t i = 0; i < T * k; i++) w[i] = 0.5f;
                ETP_OK(etp_memcpy_async(f->s0, didx, idx, (size_t)(T * k) * 8));
                ETP_OK(etp_memcpy_async(f->s0, dtok, tok, (size_t)(T * g.H) * 2));
                ETP_OK(etp_memcpy_async(f->s0, dw, w, (size_t)(T * k) * 4));
                ETP_OK(etp_ep_prepare(ly, didx, ETP_DTYPE_I64, T, NULL, f->s0));
                ETP_OK(etp_ep_dispatch(ly, dtok, ETP_DTYPE_BF16, dw, ETP_DTYPE_F32, drecv, drw, lrows, f->s0));
                ETP_OK(etp_ep_combine(ly, drecv, ETP_DTYPE_BF16, lrows, dout, f->s0));
                ETP_OK(etp_ep_combine_bwd(ly, dout, ETP_DTYPE_BF16, li ? NULL : drecv, lrows, drecv,
                                          li ? NULL : dw, f->s0));
                ETP_OK(etp_ep_dispatch_bwd(ly, drecv, ETP_DTYPE_BF16, NULL, lrows, dout, NULL, f->s0));
            }
            ETP_OK(etp_stream_synchronize(f->s0));
            ETP_OK(etp_memory_report(f->ctx, &m1));
            if (!ep_same_report(&m0, &m1)) {
                print_error("step %ld: the memory report changed (%zu -> %zu bytes, %zu -> %zu allocations)\n",
                            st, m0.total_bytes, m1.total_bytes, m0.live_allocations, m1.live_allocations);
                fail();
            }
        }
        etp_ep_report_t r = ETP_EP_REPORT_INIT;
        ETP_OK(etp_ep_check(a, &r));
        assert_int_equal(r.prepares, steps);
        void *all[] = {didx, dtok, dw, drecv, drw, dout};
        for (int i = 0; i < 6; i++) ETP_OK(etp_mem_free(f->ctx, all[i]));
        free(idx);
        free(tok);
        free(w);
        ETP_OK(etp_ep_layer_destroy(a));
        ETP_OK(etp_ep_layer_destroy(c));
        ETP_OK(etp_ep_group_destroy(ep));
        ETP_OK(etp_memory_report(f->ctx, &m1));
        assert_int_equal(m1.bytes[ETP_MEM_EP_BUFFERS], 0);
    }
}

/* Bad input: a status and a message, nothing enqueued, and the group still
 * works afterwards (a full checked step at the end). */
static void test_bad_input(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = base_cfg(ep_experts_for(2), 8, 2, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_EXACT);
    etp_ep_group_config_t c = ETP_EP_GROUP_CONFIG_INIT;
    c.num_experts = g.E;
    c.hidden = g.H;
    c.max_tokens_per_rank = g.tmax;
    c.max_topk = 2;
    c.recv_capacity_per_rank = g.cap;
    etp_ep_group_t *ep = NULL;
    ETP_EXPECT_MSG(etp_ep_group_create(NULL, &c, &ep), ETP_ERR_INVALID_ARGUMENT, "group");
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, NULL, &ep), ETP_ERR_INVALID_ARGUMENT, "config");
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &c, NULL), ETP_ERR_INVALID_ARGUMENT, "'ep'");
    etp_ep_group_config_t bad = c;
    bad.size = 8;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "size");
    if (g_size > 1) {
        bad = c;
        bad.num_experts = (int64_t)g_size * 2 + 1;
        ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT,
                       "not a multiple of the group size");
    }
    bad = c;
    bad.token_dtype = ETP_DTYPE_F16;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "token_dtype");
    bad.token_dtype = ETP_EP_TOKEN_MXFP8; /* H = 8: not a multiple of 32 */
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "multiple of 32");
    bad = c;
    bad.max_topk = 0;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "max_topk");
    bad = c;
    bad.role = 1;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "role");
    bad = c;
    bad.transport = ETP_EP_TRANSPORT_CAPACITY;
    bad.capacity_factor = 0;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "capacity_factor");
    bad = c;
    bad.hidden = 0;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "hidden");
    bad = c;
    bad.transport = (etp_ep_transport_t)7;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "transport 7");
    bad = c;
    bad.combine_wire = ETP_DTYPE_F16;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "combine_wire");
    bad.combine_wire = ETP_DTYPE_BF16;
    bad.token_dtype = ETP_DTYPE_F32;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "f32 tokens");
    bad = c;
    bad.num_sms = -1;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "num_sms");
    /* sizes whose products would wrap around int64 (to 0, past every check) */
    bad = c;
    bad.max_tokens_per_rank = (int64_t)1 << 62;
    bad.recv_capacity_per_rank = (int64_t)1 << 62;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "below 2^31");
    bad = c;
    bad.hidden = (int64_t)1 << 40;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "below 2^31");
    bad = c;
    bad.num_experts = (int64_t)g_size << 31; /* expert ids are int32 */
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT, "num_experts");
    /* the config's refusals name the EP group: its name, else its group's */
    bad = c;
    bad.hidden = 0;
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT,
                   "etp_ep_group_create: EP group 'world': hidden 0");
    bad.name = "moe_ep";
    ETP_EXPECT_MSG(etp_ep_group_create(f->world, &bad, &ep), ETP_ERR_INVALID_ARGUMENT,
                   "EP group 'moe_ep': hidden 0");
    assert_null(ep);

    g.cap = c.recv_capacity_per_rank;
    ep = ep_make_group(f, &g);
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    etp_ep_layer_t *ly = NULL;
    lc.topk = 3;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT, "topk");
    lc.name = "moe3";
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT,
                   "etp_ep_layer_create: EP layer 'moe3': topk 3");
    lc.name = NULL;
    lc.topk = 2;
    /* an odd alignment that does not divide the capacity (which follows the rank count) */
    lc.alignment = 3;
    while (g.cap % lc.alignment == 0) lc.alignment += 2;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT, "does not divide");
    lc.alignment = 1;
    lc.layout = ETP_EP_LAYOUT_FIXED_SLOTS;
    lc.slots_per_expert = g.cap;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT, "slots_per_expert");
    lc.slots_per_expert = (int64_t)1 << 62; /* x local experts wraps to 0 */
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT, "slots_per_expert");
    lc.layout = ETP_EP_LAYOUT_PACKED;
    ETP_EXPECT_MSG(etp_ep_layer_create(ep, &lc, &ly), ETP_ERR_INVALID_ARGUMENT, "slots_per_expert");
    assert_null(ly);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ly = ep_make_layer(ep, &g, &l, "checked");
    ETP_EXPECT(etp_ep_group_destroy(ep), ETP_ERR_BUSY);

    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, 2, &b);
    etp_stream_t *s = f->s0;
    /* wrong state: nothing prepared yet */
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_STATE, "not been prepared");
    ETP_EXPECT(etp_ep_combine(ly, b.y, ETP_DTYPE_BF16, l.rows, b.out, s), ETP_ERR_INVALID_STATE);
    ETP_EXPECT(etp_ep_layout_host(ly, s, NULL, NULL), ETP_ERR_INVALID_STATE);
    /* prepare */
    ETP_EXPECT_MSG(etp_ep_prepare(NULL, b.idx, ETP_DTYPE_I64, 1, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'layer'");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I32, 1, NULL, s), ETP_ERR_INVALID_ARGUMENT, "i64");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, g.tmax + 1, NULL, s), ETP_ERR_INVALID_ARGUMENT,
                   "max_tokens_per_rank");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, -1, NULL, s), ETP_ERR_INVALID_ARGUMENT, "num_tokens");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, b.tdev, s),
                   ETP_ERR_INVALID_ARGUMENT, "CAPACITY");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, NULL, ETP_DTYPE_I64, 2, NULL, s), ETP_ERR_INVALID_ARGUMENT,
                   "'topk_idx' is NULL with num_tokens 2");
    /* the device count named, not "num_tokens -1 not in [0, ...]" */
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, NULL, s),
                   ETP_ERR_INVALID_ARGUMENT, "ETP_EP_TOKENS_ON_DEVICE but argument 'num_tokens_dev' is NULL");
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, 1, NULL, NULL), ETP_ERR_INVALID_ARGUMENT, "'stream'");
    /* a real prepare (collective; one token everywhere, no expert), then
     * bad data calls: NULL is refused for arrays that are not empty */
    ETP_OK(etp_memset_async(s, b.idx, 0xFF, 2 * sizeof(int64_t)));
    ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, 1, NULL, s));
    ETP_EXPECT_MSG(etp_ep_combine(ly, b.y, ETP_DTYPE_BF16, l.rows, b.out, s), ETP_ERR_INVALID_STATE,
                   "has not dispatched");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F16, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "topk_weights has dtype f16");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, b.w, ETP_DTYPE_I64, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "expected f32");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_F32, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "moves bf16");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_EP_TOKEN_MXFP8, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "ETP_EP_TOKEN_MXFP8");
    {
        etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
        da.tokens = b.tok;
        da.topk_weights = b.w;
        da.recv_tokens = b.recv;
        da.recv_scales = b.recv_s; /* a BF16 group has no scales */
        da.recv_weights = b.recv_w;
        da.rows = l.rows;
        ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &da, s), ETP_ERR_INVALID_ARGUMENT, "recv_scales");
        da.recv_scales = NULL;
        da.size = 8;
        ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, &da, s), ETP_ERR_INVALID_ARGUMENT, "ETP_EP_DISPATCH_ARGS_INIT");
        ETP_EXPECT_MSG(etp_ep_dispatch_ex(ly, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'args'");
    }
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows - 1, s),
                   ETP_ERR_INVALID_ARGUMENT, "etp_ep_layer_rows");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_BF16, NULL, ETP_DTYPE_F32, b.recv, NULL, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "weighted");
    ETP_EXPECT_MSG(etp_ep_dispatch(ly, NULL, ETP_DTYPE_BF16, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, s),
                   ETP_ERR_INVALID_ARGUMENT, "'tokens' is NULL; EP layer 'checked' was prepared with 1 tokens");
    ETP_EXPECT_MSG(etp_ep_combine(ly, b.y, ETP_DTYPE_BF16, l.rows, NULL, s), ETP_ERR_INVALID_ARGUMENT, "'out'");
    ETP_EXPECT_MSG(etp_ep_combine_bwd(ly, NULL, ETP_DTYPE_BF16, b.y, l.rows, b.grows, b.gtopk, s),
                   ETP_ERR_INVALID_ARGUMENT, "'grad_out'");
    ETP_EXPECT_MSG(etp_ep_combine_bwd(ly, b.gout, ETP_DTYPE_BF16, b.y, l.rows, b.grows, NULL, s),
                   ETP_ERR_INVALID_ARGUMENT, "'grad_topk_weights' is required");
    ETP_EXPECT_MSG(etp_ep_dispatch_bwd(ly, b.grows_in, ETP_DTYPE_BF16, NULL, l.rows, NULL, NULL, s),
                   ETP_ERR_INVALID_ARGUMENT, "'grad_tokens'");
    ETP_EXPECT_MSG(etp_ep_dispatch_bwd(ly, b.grows_in, ETP_DTYPE_BF16, NULL, l.rows, b.gtok, b.gtopk2, s),
                   ETP_ERR_INVALID_ARGUMENT, "without grad_row_weights");
    ETP_EXPECT_MSG(etp_ep_combine_bwd(ly, b.gout, ETP_DTYPE_BF16, NULL, l.rows, b.grows, b.gtopk, s),
                   ETP_ERR_INVALID_ARGUMENT, "expert_out");
    ETP_EXPECT_MSG(etp_ep_dispatch_bwd(ly, b.grows_in, ETP_DTYPE_BF16, b.gw_in, l.rows, b.gtok, NULL, s),
                   ETP_ERR_INVALID_ARGUMENT, "both");
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    r.size = 4;
    ETP_EXPECT_MSG(etp_ep_poll(ly, &r), ETP_ERR_INVALID_ARGUMENT, "size");
    ETP_EXPECT(etp_ep_poll(NULL, NULL), ETP_ERR_INVALID_ARGUMENT);
    ETP_EXPECT(etp_ep_layer_rows(NULL, NULL), ETP_ERR_INVALID_ARGUMENT);
    etp_ep_group_info_t info = ETP_EP_GROUP_INFO_INIT;
    info.size = 1;
    ETP_EXPECT(etp_ep_group_info(ep, &info), ETP_ERR_INVALID_ARGUMENT);
    ETP_OK(etp_ep_group_destroy(NULL));
    ETP_OK(etp_ep_layer_destroy(NULL));
    /* still works */
    ep_step_opts_t o = {.route_mode = ROUTE_UNIFORM, .check_report = 1};
    ep_step(f, &g, &l, ly, s, &b, 9900, &o);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* More than 2^16 local experts (ep_many_experts). */
static void test_many_experts(void **state)
{
    ep_many_experts(*state, 9800);
}

/* What a trace callback saw: the points, their streams, and for each point
 * whether the output of the call it belongs to was still all poison (0xA5)
 * once the stream had run everything enqueued before the point. */
typedef struct {
    etp_ep_group_t *ep;
    etp_ep_layer_t *ly;
    /* dispatch's recv_tokens, combine's out, dispatch_bwd's grad_tokens;
     * prepare writes no output of the caller's (none watched) */
    const uint8_t *watch[4];
    size_t watch_bytes[4];
    int n;
    etp_trace_point_t pt[32];
    etp_stream_t *st[32];
    int poisoned[32];
    etp_status_t reenter[3]; /* EP calls of the group from inside the callback */
} trace_log_t;

static void trace_record(void *user, etp_trace_point_t point, etp_stream_t *s)
{
    trace_log_t *log = user;
    if (log->n == 32) fail_msg("more than 32 trace points");
    const int call = (int)(point - ETP_TRACE_EP_DISPATCH_PACK) / 16;
    if (call < 0 || call > 3) fail_msg("unknown trace point 0x%x", (unsigned)point);
    /* the host backend's device memory is host memory */
    ETP_OK(etp_stream_synchronize(s));
    int all = 1;
    for (size_t i = 0; i < log->watch_bytes[call]; i++) all &= log->watch[call][i] == 0xA5;
    log->pt[log->n] = point;
    log->st[log->n] = s;
    log->poisoned[log->n] = all;
    if (log->n == 0) {
        log->reenter[0] = etp_ep_reset_report(log->ly, s);
        log->reenter[1] = etp_ep_group_set_trace(log->ep, NULL, NULL);
        log->reenter[2] = etp_ep_layer_destroy(log->ly);
    }
    log->n++;
}

/* The trace callback (etp_ep_group_set_trace): prepare, dispatch, combine
 * and dispatch_bwd report their points in order, with the call's stream, at
 * the boundaries of their phases (the call's output is untouched until its
 * last phase, written by its end); combine_bwd reports none;
 * EP calls from inside the callback are refused; NULL turns it off. The
 * steps are checked against the reference as everywhere. */
static void test_trace(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = base_cfg(ep_experts_for(2), 24, 2, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_CAPACITY);
    g.cf = 4.0;
    lcfg_t l = {.k = 2, .align = 2, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    etp_ep_group_t *ep = ep_make_group(f, &g);
    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "traced");
    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, l.k, &b);
    ETP_EXPECT_MSG(etp_ep_group_set_trace(NULL, trace_record, NULL), ETP_ERR_INVALID_ARGUMENT, "ep");
    int64_t Ts[64];
    for (int r = 0; r < g_size; r++) Ts[r] = g.tmax; /* every output has rows to write */
    const ep_step_opts_t o = {.route_mode = ROUTE_UNIFORM, .fixed_T = Ts, .check_report = 1};
    trace_log_t log = {.ep = ep, .ly = ly};
    const size_t es = 2;
    log.watch[0] = b.recv;
    log.watch_bytes[0] = (size_t)(l.rows * g.H) * es;
    log.watch[1] = b.out;
    log.watch[2] = b.gtok;
    log.watch_bytes[1] = log.watch_bytes[2] = (size_t)(g.tmax * g.H) * es;
    ETP_OK(etp_ep_group_set_trace(ep, trace_record, &log));
    /* on the second stream: the points must carry the call's */
    ep_step(f, &g, &l, ly, f->s1, &b, 9850, &o);
    static const etp_trace_point_t want[16] = {
        ETP_TRACE_EP_PREPARE_ROUTE,       ETP_TRACE_EP_PREPARE_EXCHANGE,
        ETP_TRACE_EP_PREPARE_LAYOUT,      ETP_TRACE_EP_PREPARE_END,
        ETP_TRACE_EP_DISPATCH_PACK,       ETP_TRACE_EP_DISPATCH_EXCHANGE,
        ETP_TRACE_EP_DISPATCH_EXPAND,     ETP_TRACE_EP_DISPATCH_END,
        ETP_TRACE_EP_COMBINE_PRESUM,      ETP_TRACE_EP_COMBINE_EXCHANGE,
        ETP_TRACE_EP_COMBINE_SUM,         ETP_TRACE_EP_COMBINE_END,
        ETP_TRACE_EP_DISPATCH_BWD_PRESUM, ETP_TRACE_EP_DISPATCH_BWD_EXCHANGE,
        ETP_TRACE_EP_DISPATCH_BWD_SUM,    ETP_TRACE_EP_DISPATCH_BWD_END};
    assert_int_equal(log.n, 16);
    for (int i = 0; i < 16; i++) {
        /* prepare (i < 4) watches nothing */
        const int untouched = i < 4 || i % 4 != 3;
        if (log.pt[i] != want[i] || log.st[i] != f->s1 || log.poisoned[i] != untouched) {
            print_error("trace point %d: 0x%x on stream %p, output %s; expected 0x%x on %p, %s\n", i,
                        (unsigned)log.pt[i], (void *)log.st[i],
                        log.poisoned[i] ? "untouched" : "written", (unsigned)want[i],
                        (void *)f->s1, untouched ? "untouched" : "written");
            fail();
        }
    }
    for (int i = 0; i < 3; i++) assert_int_equal(log.reenter[i], ETP_ERR_INVALID_STATE);
    ETP_OK(etp_ep_group_set_trace(ep, NULL, &log));
    ep_step(f, &g, &l, ly, f->s0, &b, 9851, &o);
    assert_int_equal(log.n, 16);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* docs/EP.md's worked example, literally (2 ranks only). */
static void test_doc_example(void **state)
{
    ep_fx_t *f = *state;
    if (g_size != 2) skip();
    static const int64_t idx0[] = {1, 2, 0, -1, 3, 1}, idx1[] = {2, 0, 1, 3};
    const int64_t T = g_rank ? 2 : 3;
    for (int layout = 0; layout < 2; layout++) {
        gcfg_t g = base_cfg(4, 1, 2, ETP_DTYPE_F32, ETP_EP_TRANSPORT_EXACT);
        g.cap = 8;
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l = {.k = 2, .align = 2, .weighted = 1,
                    .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "doc");
        ep_bufs_t b;
        ep_bufs_alloc(f, &g, l.rows, 2, &b);
        float tok[3], w[6], recv[8];
        for (int t = 0; t < 3; t++) tok[t] = (float)(10 * g_rank + t); /* x(s,t) = 10 s + t */
        for (int i = 0; i < 6; i++) w[i] = 1.0f;
        ep_up(f->s0, b.idx, g_rank ? idx1 : idx0, (size_t)(T * 2) * 8);
        ep_up(f->s0, b.tok, tok, (size_t)T * 4);
        ep_up(f->s0, b.w, w, (size_t)T * 8);
        ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, T, NULL, f->s0));
        /* the padding rows' zeros below are dispatch's (docs/EP.md) */
        ETP_OK(etp_memset_async(f->s0, b.recv, 0xA5, 8 * sizeof(float)));
        ETP_OK(etp_ep_dispatch(ly, b.tok, ETP_DTYPE_F32, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, 8, f->s0));
        int32_t cnt[2], off[3];
        ETP_OK(etp_ep_layout_host(ly, f->s0, cnt, off));
        ep_down(f->s0, recv, b.recv, sizeof recv);
        /* rank 0: x(0,1) x(1,0) | x(0,0) x(0,2) x(1,1); rank 1: x(0,0) x(1,0) | x(0,2) x(1,1) */
        static const float packed0[8] = {1, 10, 0, 2, 11, 0, 0, 0}, packed1[8] = {0, 10, 2, 11, 0, 0, 0, 0};
        static const float fixed0[8] = {1, 10, 0, 0, 0, 2, 11, 0}, fixed1[8] = {0, 10, 0, 0, 2, 11, 0, 0};
        const float *want = layout ? (g_rank ? fixed1 : fixed0) : (g_rank ? packed1 : packed0);
        for (int r = 0; r < 8; r++) assert_true(recv[r] == want[r]);
        assert_int_equal(cnt[0], 2);
        assert_int_equal(cnt[1], g_rank ? 2 : 3);
        assert_int_equal(off[0], 0);
        assert_int_equal(off[1], layout ? 4 : 2);
        assert_int_equal(off[2], layout ? 8 : (g_rank ? 4 : 6));
        ep_bufs_free(f, &b);
        ETP_OK(etp_ep_layer_destroy(ly));
        ETP_OK(etp_ep_group_destroy(ep));
    }
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_example),    cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_empty_ranks),    cmocka_unit_test(test_two_layers),
        cmocka_unit_test(test_overflow_drop),  cmocka_unit_test(test_overflow_error),
        cmocka_unit_test(test_device_tokens),  cmocka_unit_test(test_memory_steady),
        cmocka_unit_test(test_many_experts),   cmocka_unit_test(test_trace),
        cmocka_unit_test(test_transport_choice),
    };
    int failed = cmocka_run_group_tests_name("eager", tests, ep_host_setup_eager, ep_host_teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, ep_host_setup_shuffle, ep_host_teardown);
    return tu_mpi_finish(failed);
}
