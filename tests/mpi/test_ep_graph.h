/*
 * The captured EP step, shared by the host MPI test (tests/mpi/test_ep_graph.c,
 * host capture with CUDA's rules) and the GPU test (CUDA graphs): a forward
 * + backward step in CAPACITY and NVLINK mode with T on the device, captured once and
 * replayed with new routing each time, equal bit for bit to the same step
 * run eagerly, the memory report unchanged by the capture.
 */
#ifndef ETP_TEST_EP_GRAPH_H
#define ETP_TEST_EP_GRAPH_H

#include "test_ep_steps.h"

static gcfg_t cfg_for(int k, int64_t H, etp_dtype_t dt, etp_ep_transport_t tr)
{
    gcfg_t g = {0};
    g.R = g_size;
    g.me = g_rank;
    g.E = (int64_t)g_size * 8;
    g.L = 8;
    g.H = H;
    g.tmax = 200;
    g.maxk = k;
    g.dt = dt;
    g.transport = tr;
    g.overflow = ETP_EP_OVERFLOW_DROP;
    g.cf = 1.25;
    g.cap = ((int64_t)g_size * g.tmax * k + g.L * 16 + 15) / 16 * 16;
    return g;
}

/* Upload step `tag`'s inputs of this rank for a layer of top-k k. */
static void upload(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, ep_bufs_t *b, uint64_t tag,
                   int32_t *T_out)
{
    const int k = l->k;
    const int64_t H = g->H, T = ep_tokens(tag, g->me, g->tmax);
    const size_t es = etp_dtype_size(g->dt);
    int64_t *idx = calloc((size_t)(g->tmax * k), sizeof *idx);
    ep_route(tag, g->me, T, k, g->E, (int)(tag % 2), idx);
    uint8_t *tok = malloc((size_t)(g->tmax * H) * es);
    float *w = malloc((size_t)(g->tmax * k) * 4);
    uint8_t *rowsbuf = malloc((size_t)(l->rows * H) * es);
    float *gw = malloc((size_t)l->rows * 4);
    for (int64_t i = 0; i < g->tmax * H; i++) ep_put(tok, g->dt, i, ep_val(tag * 16 + TAG_TOK, (uint64_t)g->me, (uint64_t)i));
    for (int64_t i = 0; i < g->tmax * k; i++) w[i] = ep_weight(tag * 16 + TAG_W, (uint64_t)g->me, (uint64_t)i);
    int32_t t32 = (int32_t)T;
    ep_up(f->s0, b->idx, idx, (size_t)(g->tmax * k) * 8);
    ep_up(f->s0, b->tok, tok, (size_t)(g->tmax * H) * es);
    ep_up(f->s0, b->w, w, (size_t)(g->tmax * k) * 4);
    ep_up(f->s0, b->tdev, &t32, 4);
    for (int64_t i = 0; i < g->tmax * H; i++) ep_put(tok, g->dt, i, ep_val(tag * 16 + TAG_G, (uint64_t)g->me, (uint64_t)i));
    ep_up(f->s0, b->gout, tok, (size_t)(g->tmax * H) * es);
    for (int64_t i = 0; i < l->rows * H; i++) ep_put(rowsbuf, g->dt, i, ep_val(tag * 16 + TAG_Y, (uint64_t)g->me, (uint64_t)i));
    ep_up(f->s0, b->y, rowsbuf, (size_t)(l->rows * H) * es);
    for (int64_t i = 0; i < l->rows * H; i++) ep_put(rowsbuf, g->dt, i, ep_val(tag * 16 + TAG_GR, (uint64_t)g->me, (uint64_t)i));
    ep_up(f->s0, b->grows_in, rowsbuf, (size_t)(l->rows * H) * es);
    for (int64_t i = 0; i < l->rows; i++) gw[i] = ep_val(tag * 16 + TAG_GW, (uint64_t)g->me, (uint64_t)i);
    ep_up(f->s0, b->gw_in, gw, (size_t)l->rows * 4);
    ETP_OK(etp_stream_synchronize(f->s0));
    *T_out = t32;
    free(idx);
    free(tok);
    free(w);
    free(rowsbuf);
    free(gw);
}

/* The EP calls of one forward + backward step with T on the device. */
static void step_calls(const gcfg_t *g, const lcfg_t *l, etp_ep_layer_t *ly, ep_bufs_t *b,
                       etp_stream_t *s)
{
    ETP_OK(etp_ep_prepare(ly, b->idx, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, b->tdev, s));
    if (g->mx) {
        etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
        da.tokens = b->tok;
        da.topk_weights = b->w;
        da.recv_tokens = b->recv;
        da.recv_scales = b->recv_s;
        da.recv_weights = b->recv_w;
        da.rows = l->rows;
        ETP_OK(etp_ep_dispatch_ex(ly, &da, s));
    } else {
        ETP_OK(etp_ep_dispatch(ly, b->tok, g->dt, b->w, ETP_DTYPE_F32, b->recv, b->recv_w, l->rows, s));
    }
    ETP_OK(etp_ep_combine(ly, b->y, g->dt, l->rows, b->out, s));
    ETP_OK(etp_ep_combine_bwd(ly, b->gout, g->dt, b->y, l->rows, b->grows, b->gtopk, s));
    ETP_OK(etp_ep_dispatch_bwd(ly, b->grows_in, g->dt, b->gw_in, l->rows, b->gtok, b->gtopk2, s));
}

enum { N_OUT = 8 };

typedef struct {
    uint8_t *p[N_OUT];
    size_t n[N_OUT];
} outputs_t;

static void download(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, ep_bufs_t *b, outputs_t *o)
{
    const size_t es = etp_dtype_size(g->dt);
    void *src[N_OUT] = {b->recv, b->recv_w, b->out, b->grows, b->gtopk, b->gtok, b->gtopk2, b->recv_s};
    size_t n[N_OUT] = {(size_t)(l->rows * g->H) * es, (size_t)l->rows * 4, (size_t)(g->tmax * g->H) * es,
                       (size_t)(l->rows * g->H) * es, (size_t)(g->tmax * l->k) * 4,
                       (size_t)(g->tmax * g->H) * es, (size_t)(g->tmax * l->k) * 4,
                       g->mx ? (size_t)(l->rows * (g->H / 32)) : 1};
    for (int i = 0; i < N_OUT; i++) {
        o->n[i] = n[i];
        o->p[i] = malloc(n[i]);
        ep_down(f->s0, o->p[i], src[i], n[i]);
    }
}

static void poison_outputs(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, ep_bufs_t *b)
{
    const size_t es = etp_dtype_size(g->dt);
    ETP_OK(etp_memset_async(f->s0, b->recv, 0xA5, (size_t)(l->rows * g->H) * es));
    ETP_OK(etp_memset_async(f->s0, b->recv_w, 0xA5, (size_t)l->rows * 4));
    ETP_OK(etp_memset_async(f->s0, b->out, 0xA5, (size_t)(g->tmax * g->H) * es));
    ETP_OK(etp_memset_async(f->s0, b->grows, 0xA5, (size_t)(l->rows * g->H) * es));
    ETP_OK(etp_memset_async(f->s0, b->gtopk, 0xA5, (size_t)(g->tmax * l->k) * 4));
    ETP_OK(etp_memset_async(f->s0, b->gtok, 0xA5, (size_t)(g->tmax * g->H) * es));
    ETP_OK(etp_memset_async(f->s0, b->gtopk2, 0xA5, (size_t)(g->tmax * l->k) * 4));
    ETP_OK(etp_memset_async(f->s0, b->recv_s, 0xA5, g->mx ? (size_t)(l->rows * (g->H / 32)) : 1));
}

/* Capture once, replay with new routing: equal to eager, bit for bit. */
static void test_graph_replay(void **state)
{
    ep_fx_t *f = *state;
    for (int v = 0; v < 8; v++) {
        const int layout = v % 2;
        gcfg_t g = cfg_for(8, 1024, ETP_DTYPE_BF16,
                           v < 4 ? ETP_EP_TRANSPORT_CAPACITY : ETP_EP_TRANSPORT_NVLINK);
        g.mx = v / 2 % 2; /* MXFP8 dispatch in the graph too */
        if (v == 5) g.wire = ETP_DTYPE_BF16;
        g.cf = 1.5;
        etp_ep_group_t *ep = ep_make_group(f, &g);
        lcfg_t l = {.k = 8, .align = 16, .weighted = 1,
                    .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        etp_ep_layer_t *graphed = ep_make_layer(ep, &g, &l, "graphed");
        etp_ep_layer_t *eager = ep_make_layer(ep, &g, &l, "eager");
        ep_bufs_t b;
        ep_bufs_alloc(f, &g, l.rows, l.k, &b);
        int32_t T = 0;
        upload(f, &g, &l, &b, 60000, &T);

        etp_memory_report_t m0 = ETP_MEMORY_REPORT_INIT, m1 = ETP_MEMORY_REPORT_INIT;
        ETP_OK(etp_memory_report(f->ctx, &m0));
        ETP_OK(etp_stream_begin_capture(f->s0));
        step_calls(&g, &l, graphed, &b, f->s0);
        etp_graph_t *graph = NULL;
        ETP_OK(etp_stream_end_capture(f->s0, &graph));
        ETP_OK(etp_memory_report(f->ctx, &m1));
        assert_true(ep_same_report(&m0, &m1));

        for (int rep = 0; rep < 4; rep++) {
            uint64_t tag = 60100 + (uint64_t)(10 * v + rep);
            upload(f, &g, &l, &b, tag, &T);
            poison_outputs(f, &g, &l, &b);
            ETP_OK(etp_graph_launch(graph, f->s0));
            ETP_OK(etp_stream_synchronize(f->s0));
            outputs_t og, oe;
            download(f, &g, &l, &b, &og);
            poison_outputs(f, &g, &l, &b);
            step_calls(&g, &l, eager, &b, f->s0);
            ETP_OK(etp_stream_synchronize(f->s0));
            download(f, &g, &l, &b, &oe);
            for (int i = 0; i < N_OUT; i++) {
                size_t diff = 0;
                for (size_t x = 0; x < og.n[i]; x++) diff += og.p[i][x] != oe.p[i][x];
                if (diff) print_error("replay %d output %d: %zu bytes differ from eager\n", rep, i, diff);
                assert_int_equal(diff, 0);
                free(og.p[i]);
                free(oe.p[i]);
            }
            /* the graph's counters arrive through the same pinned mirror */
            etp_ep_report_t r = ETP_EP_REPORT_INIT;
            ETP_OK(etp_ep_poll(graphed, &r));
            assert_int_equal(r.prepares, rep + 1);
        }
        ETP_OK(etp_graph_destroy(graph));
        ep_bufs_free(f, &b);
        ETP_OK(etp_ep_layer_destroy(graphed));
        ETP_OK(etp_ep_layer_destroy(eager));
        ETP_OK(etp_ep_group_destroy(ep));
    }
}

/* EXACT brings the exchange sizes to the host, so its prepare is refused
 * during a capture, before it enqueues anything or drops the layer's
 * routing: the capture ends clean and the last routing still dispatches
 * the same rows. */
static void test_exact_prepare_in_capture(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = cfg_for(2, 64, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_EXACT);
    etp_ep_group_t *ep = ep_make_group(f, &g);
    lcfg_t l = {.k = 2, .align = 1, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "exact");
    ep_bufs_t b;
    ep_bufs_alloc(f, &g, l.rows, l.k, &b);
    int32_t T = 0;
    upload(f, &g, &l, &b, 61000, &T);
    const size_t n = (size_t)(l.rows * g.H) * etp_dtype_size(g.dt);
    uint8_t *want = malloc(n), *got = malloc(n);
    ETP_OK(etp_memset_async(f->s0, b.recv, 0xA5, n));
    ETP_OK(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, T, NULL, f->s0));
    ETP_OK(etp_ep_dispatch(ly, b.tok, g.dt, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, f->s0));
    ep_down(f->s0, want, b.recv, n);

    ETP_OK(etp_stream_begin_capture(f->s0));
    ETP_EXPECT_MSG(etp_ep_prepare(ly, b.idx, ETP_DTYPE_I64, T, NULL, f->s0), ETP_ERR_INVALID_STATE,
                   "not during a graph capture");
    etp_graph_t *graph = NULL;
    ETP_OK(etp_stream_end_capture(f->s0, &graph));
    ETP_OK(etp_graph_destroy(graph));

    ETP_OK(etp_memset_async(f->s0, b.recv, 0xA5, n));
    ETP_OK(etp_ep_dispatch(ly, b.tok, g.dt, b.w, ETP_DTYPE_F32, b.recv, b.recv_w, l.rows, f->s0));
    ep_down(f->s0, got, b.recv, n);
    assert_memory_equal(got, want, n);
    free(want);
    free(got);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

#endif
