/*
 * Low-latency EP layers (etp_ep_ll_dispatch / etp_ep_ll_combine), checked
 * steps shared by the host MPI test (tests/mpi/test_ep_ll.c) and the GPU
 * test (tests/gpu/test_ep_gpu.c): every output against the single-rank
 * reference of test_ep_ref.h (EXACT's rules) bit for bit, and against an
 * ordinary layer of an EXACT group given the same inputs; the halves'
 * rows poisoned before they are refilled; the rows of a dispatch checked
 * again after the next dispatch; the counters; a captured dispatch +
 * combine replayed with new routing against the same calls run eagerly.
 */
#ifndef ETP_TEST_EP_LL_H
#define ETP_TEST_EP_LL_H

#include "test_ep_steps.h"

/* A low-latency layer of l's settings with max_tokens_per_rank tll. */
static inline etp_ep_layer_t *ll_make_layer(etp_ep_group_t *ep, const gcfg_t *g, lcfg_t *l,
                                            int64_t tll, const char *name)
{
    etp_ep_layer_config_t c = ETP_EP_LAYER_CONFIG_INIT;
    c.name = name;
    c.topk = l->k;
    c.alignment = l->align;
    c.layout = l->layout;
    c.weighted = l->weighted;
    c.slots_per_expert = l->layout == ETP_EP_LAYOUT_FIXED_SLOTS ? l->S : 0;
    c.low_latency = 1;
    c.max_tokens_per_rank = tll;
    etp_ep_layer_t *ly = NULL;
    ETP_OK(etp_ep_layer_create(ep, &c, &ly));
    int64_t a = l->align > 1 ? l->align : 1;
    if (l->layout == ETP_EP_LAYOUT_FIXED_SLOTS && l->S == 0) l->S = g->cap / g->L / a * a;
    l->rows = l->layout == ETP_EP_LAYOUT_FIXED_SLOTS ? l->S * g->L : g->cap;
    int64_t rows = -1;
    ETP_OK(etp_ep_layer_rows(ly, &rows));
    assert_int_equal(rows, l->rows);
    return ly;
}

/* One dispatch's inputs and what it must produce on this rank. */
typedef struct {
    ref_t rf;
    int64_t Ts[64];
    int64_t *idx; /* [tll * k] (rows past T zero) */
    uint8_t *tok; /* [tll * H] */
    float *w;     /* [tll * k] */
} ll_in_t;

/* Inputs of step `tag`: T of each rank (fixed_T, or random in [0, tll]),
 * routing `route`. */
static inline void ll_in_make(const gcfg_t *g, const lcfg_t *l, int64_t tll, uint64_t tag,
                              int route, const int64_t *fixed_T, ll_in_t *in)
{
    for (int r = 0; r < g->R; r++) in->Ts[r] = fixed_T ? fixed_T[r] : ep_tokens(tag, r, tll);
    ref_build(&in->rf, g, l, tag, route, in->Ts);
    const int64_t T = in->Ts[g->me], H = g->H;
    const size_t es = etp_dtype_size(g->dt);
    in->idx = calloc((size_t)(tll * l->k) + 1, sizeof *in->idx);
    memcpy(in->idx, in->rf.idx[g->me], (size_t)(T * l->k) * sizeof *in->idx);
    in->tok = calloc((size_t)(tll * H) * es + 1, 1);
    in->w = calloc((size_t)(tll * l->k) + 1, sizeof *in->w);
    for (int64_t i = 0; i < T * H; i++)
        ep_put(in->tok, g->dt, i, ep_tok(tag * 16 + TAG_TOK, (uint64_t)g->me, (uint64_t)i, 0));
    for (int64_t i = 0; i < T * l->k; i++)
        in->w[i] = ep_weight(tag * 16 + TAG_W, (uint64_t)g->me, (uint64_t)i);
}

static inline void ll_in_free(ll_in_t *in)
{
    ref_free(&in->rf);
    free(in->idx);
    free(in->tok);
    free(in->w);
}

/* Device inputs of one dispatch (per in-flight dispatch: its own). */
typedef struct {
    int64_t *idx;
    void *tok, *y, *out;
    float *w;
    int32_t *tdev;
} ll_dev_t;

static inline void ll_dev_alloc(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, int64_t tll,
                                ll_dev_t *d)
{
    const size_t es = etp_dtype_size(g->dt);
    d->idx = ep_dalloc(f, (size_t)(tll * l->k) * 8);
    d->tok = ep_dalloc(f, (size_t)(tll * g->H) * es);
    d->w = ep_dalloc(f, (size_t)(tll * l->k) * 4);
    d->y = ep_dalloc(f, (size_t)(l->rows * g->H) * es);
    d->out = ep_dalloc(f, (size_t)((tll + 1) * g->H) * es);
    d->tdev = ep_dalloc(f, 4);
    /* defined everywhere (the bad-input test dispatches without uploading) */
    etp_stream_t *s = f->s0;
    ETP_OK(etp_memset_async(s, d->idx, 0, (size_t)(tll * l->k) * 8));
    ETP_OK(etp_memset_async(s, d->tok, 0, (size_t)(tll * g->H) * es));
    ETP_OK(etp_memset_async(s, d->w, 0, (size_t)(tll * l->k) * 4));
    ETP_OK(etp_memset_async(s, d->y, 0, (size_t)(l->rows * g->H) * es));
    ETP_OK(etp_memset_async(s, d->tdev, 0, 4));
    ETP_OK(etp_stream_synchronize(s));
}

static inline void ll_dev_free(ep_fx_t *f, ll_dev_t *d)
{
    void *all[] = {d->idx, d->tok, d->w, d->y, d->out, d->tdev};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ETP_OK(etp_mem_free(f->ctx, all[i]));
}

/* Upload `in` and the expert outputs of step `tag` (ep_y of this rank), and
 * poison out (one row past tll too). */
static inline void ll_upload(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, int64_t tll,
                             const ll_in_t *in, uint64_t tag, ll_dev_t *d, etp_stream_t *s)
{
    const size_t es = etp_dtype_size(g->dt);
    const int64_t H = g->H;
    ep_up(s, d->idx, in->idx, (size_t)(tll * l->k) * 8);
    ep_up(s, d->tok, in->tok, (size_t)(tll * H) * es);
    ep_up(s, d->w, in->w, (size_t)(tll * l->k) * 4);
    const int32_t t32 = (int32_t)in->Ts[g->me];
    ep_up(s, d->tdev, &t32, 4);
    uint8_t *hy = malloc((size_t)(l->rows * H) * es);
    for (int64_t r = 0; r < l->rows; r++)
        for (int64_t h = 0; h < H; h++) ep_put(hy, g->dt, r * H + h, ep_y(tag, g->me, r, h, H));
    ep_up(s, d->y, hy, (size_t)(l->rows * H) * es);
    ETP_OK(etp_memset_async(s, d->out, 0xA5, (size_t)((tll + 1) * H) * es));
    ETP_OK(etp_stream_synchronize(s));
    free(hy);
}

/* The dispatch of `in` (T on the host, or on the device). */
static inline etp_status_t ll_dispatch_call(const gcfg_t *g, etp_ep_layer_t *ly, const ll_in_t *in,
                                            const ll_dev_t *d, int device_T, etp_ep_ll_rows_t *view,
                                            etp_stream_t *s)
{
    const int64_t T = in->Ts[g->me];
    const int nul = T == 0 && !device_T; /* an empty rank passes NULL */
    etp_ep_ll_dispatch_args_t a = ETP_EP_LL_DISPATCH_ARGS_INIT;
    a.topk_idx = nul ? NULL : d->idx;
    a.num_tokens = device_T ? ETP_EP_TOKENS_ON_DEVICE : T;
    a.num_tokens_dev = device_T ? d->tdev : NULL;
    a.tokens = nul ? NULL : d->tok;
    a.dtype = g->dt;
    a.topk_weights = nul ? NULL : d->w;
    return etp_ep_ll_dispatch(ly, &a, view, s);
}

static inline etp_status_t ll_combine_call(const gcfg_t *g, const lcfg_t *l, etp_ep_layer_t *ly,
                                           const ll_in_t *in, const ll_dev_t *d, int device_T,
                                           etp_stream_t *s)
{
    const int nul = in->Ts[g->me] == 0 && !device_T;
    return etp_ep_ll_combine(ly, d->y, g->dt, l->rows, nul ? NULL : d->out, s);
}

/* The view's rows, weights and layout against the reference. */
static inline void ll_check_rows(const gcfg_t *g, const lcfg_t *l, const ll_in_t *in, uint64_t tag,
                                 const etp_ep_ll_rows_t *v, etp_stream_t *s)
{
    const int me = g->me, k = l->k;
    const int64_t H = g->H, L = g->L, rows = l->rows;
    const size_t es = etp_dtype_size(g->dt);
    const ref_t *rf = &in->rf;
    assert_int_equal(v->rows, rows);
    uint8_t *hr = malloc((size_t)(rows * H) * es);
    float *hw = malloc((size_t)rows * 4);
    int32_t *cnt = malloc((size_t)L * 4), *off = malloc((size_t)(L + 1) * 4);
    ep_down(s, hr, v->tokens, (size_t)(rows * H) * es);
    if (l->weighted) {
        assert_non_null(v->weights);
        ep_down(s, hw, v->weights, (size_t)rows * 4);
    } else {
        assert_null(v->weights);
    }
    ep_down(s, cnt, v->counts, (size_t)L * 4);
    ep_down(s, off, v->offsets, (size_t)(L + 1) * 4);
    int64_t bad = 0;
    for (int64_t e = 0; e < L; e++)
        bad += cnt[e] != rf->counts[me][e] || off[e] != rf->offsets[me][e];
    bad += off[L] != rf->offsets[me][L];
    /* the (source rank, token, slot) each row holds, -1: none */
    int64_t *src = malloc((size_t)rows * 3 * sizeof *src);
    for (int64_t r = 0; r < rows; r++) src[3 * r] = -1;
    for (int s2 = 0; s2 < g->R; s2++)
        for (int64_t t = 0; t < rf->T[s2]; t++)
            for (int j = 0; j < k; j++)
                if (rf->dest[s2][t * k + j] == me && rf->row[s2][t * k + j] >= 0) {
                    const int64_t r = rf->row[s2][t * k + j];
                    assert_true(src[3 * r] == -1);
                    src[3 * r] = s2;
                    src[3 * r + 1] = t;
                    src[3 * r + 2] = j;
                }
    for (int64_t r = 0; r < rows; r++) {
        const int sr = (int)src[3 * r];
        const int64_t st = sr < 0 ? 0 : src[3 * r + 1];
        const int sj = sr < 0 ? 0 : (int)src[3 * r + 2];
        for (int64_t h = 0; h < H; h++) {
            float want = sr < 0
                             ? 0.0f
                             : ep_tok(tag * 16 + TAG_TOK, (uint64_t)sr, (uint64_t)(st * H + h), 0);
            if (g->dt == ETP_DTYPE_BF16) want = etp__bf16_to_f32(etp__f32_to_bf16(want));
            bad += !ep_bits_equal(ep_get(hr, g->dt, r * H + h), want);
        }
        if (l->weighted) {
            float want = sr < 0
                             ? 0.0f
                             : ep_weight(tag * 16 + TAG_W, (uint64_t)sr, (uint64_t)(st * k + sj));
            bad += !ep_bits_equal(hw[r], want);
        }
    }
    if (bad)
        print_error("rank %d low-latency dispatch (half %d): %lld wrong values\n", me, v->half,
                    (long long)bad);
    assert_int_equal(bad, 0);
    free(src);
    free(hr);
    free(hw);
    free(cnt);
    free(off);
}

/* combine's out against the reference (and its poison past T). */
static inline void ll_check_out(const gcfg_t *g, const lcfg_t *l, int64_t tll, const ll_in_t *in,
                                uint64_t tag, const ll_dev_t *d, etp_stream_t *s)
{
    const size_t es = etp_dtype_size(g->dt);
    const int64_t T = in->Ts[g->me], H = g->H;
    const size_t n = (size_t)((tll + 1) * H) * es;
    uint8_t *got = malloc(n), *want = malloc(n);
    ep_down(s, got, d->out, n);
    ref_combine(&in->rf, g, l, tag, ep_y, tag, l->weighted, want);
    int64_t bad = 0;
    for (size_t i = 0; i < (size_t)(T * H) * es; i++) bad += got[i] != want[i];
    for (size_t i = (size_t)(T * H) * es; i < n; i++) bad += got[i] != 0xA5;
    if (bad) print_error("rank %d low-latency combine: %lld wrong bytes\n", g->me, (long long)bad);
    assert_int_equal(bad, 0);
    free(got);
    free(want);
}

/* The same inputs through an ordinary layer of an EXACT group (same
 * config): its rows, weights and out equal the low-latency layer's. */
static inline void ll_check_exact(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, int64_t tll,
                                  const ll_in_t *in, const ll_dev_t *d, const etp_ep_ll_rows_t *v,
                                  etp_stream_t *s)
{
    gcfg_t ge = *g;
    ge.transport = ETP_EP_TRANSPORT_EXACT;
    etp_ep_group_t *ex = ep_make_group(f, &ge);
    lcfg_t le = *l;
    etp_ep_layer_t *ly = ep_make_layer(ex, &ge, &le, "exact");
    const size_t es = etp_dtype_size(g->dt);
    const int64_t H = g->H, T = in->Ts[g->me], rows = l->rows;
    void *recv = ep_dalloc(f, (size_t)(rows * H) * es),
         *out = ep_dalloc(f, (size_t)((tll + 1) * H) * es);
    float *rw = ep_dalloc(f, (size_t)rows * 4);
    ETP_OK(etp_memset_async(s, out, 0xA5, (size_t)((tll + 1) * H) * es));
    ETP_OK(etp_ep_prepare(ly, T ? d->idx : NULL, ETP_DTYPE_I64, T, NULL, s));
    ETP_OK(etp_ep_dispatch(ly, T ? d->tok : NULL, g->dt, T ? d->w : NULL, ETP_DTYPE_F32, recv,
                           l->weighted ? rw : NULL, rows, s));
    ETP_OK(etp_ep_combine(ly, d->y, g->dt, rows, T ? out : NULL, s));
    const size_t nr = (size_t)(rows * H) * es, no = (size_t)((tll + 1) * H) * es;
    uint8_t *a = malloc(nr), *b = malloc(nr), *oa = malloc(no), *ob = malloc(no);
    ep_down(s, a, recv, nr);
    ep_down(s, b, v->tokens, nr);
    ep_down(s, oa, out, no);
    ep_down(s, ob, d->out, no);
    assert_memory_equal(a, b, nr);
    assert_memory_equal(oa, ob, no);
    if (l->weighted) {
        ep_down(s, a, rw, (size_t)rows * 4);
        ep_down(s, b, v->weights, (size_t)rows * 4);
        assert_memory_equal(a, b, (size_t)rows * 4);
    }
    free(a);
    free(b);
    free(oa);
    free(ob);
    ETP_OK(etp_mem_free(f->ctx, recv));
    ETP_OK(etp_mem_free(f->ctx, out));
    ETP_OK(etp_mem_free(f->ctx, rw));
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ex));
}

/* Options of ll_steps. */
typedef struct {
    int route;
    const int64_t *fixed_T; /* per rank, or NULL: random in [0, tll] */
    int device_T;
    int exact;  /* also against an EXACT group's ordinary layer */
    int report; /* the counters against the reference's */
} ll_opts_t;

/* n checked steps (dispatch + combine) of a low-latency layer of max
 * tll tokens; before each dispatch the half it refills is poisoned (the
 * rows of two dispatches ago). */
static inline void ll_steps(ep_fx_t *f, gcfg_t *g, lcfg_t *l, int64_t tll, uint64_t tag, int n,
                            const ll_opts_t *o)
{
    etp_ep_group_t *ep = ep_make_group(f, g);
    etp_ep_layer_t *ly = ll_make_layer(ep, g, l, tll, "ll");
    const int64_t T_ll = tll ? tll : g->tmax;
    ll_dev_t d;
    ll_dev_alloc(f, g, l, T_ll, &d);
    etp_ep_ll_rows_t views[2] = {ETP_EP_LL_ROWS_INIT, ETP_EP_LL_ROWS_INIT};
    int have[2] = {0, 0};
    const size_t es = etp_dtype_size(g->dt);
    etp_stream_t *s = f->s0;
    for (int i = 0; i < n; i++) {
        ll_in_t in;
        ll_in_make(g, l, T_ll, tag + (uint64_t)i, o->route, o->fixed_T, &in);
        ll_upload(f, g, l, T_ll, &in, tag + (uint64_t)i, &d, s);
        const int h = i % 2;
        if (have[h]) {
            ETP_OK(etp_memset_async(s, views[h].tokens, 0xA5, (size_t)(l->rows * g->H) * es));
            if (views[h].weights)
                ETP_OK(etp_memset_async(s, (void *)views[h].weights, 0xA5, (size_t)l->rows * 4));
        }
        ETP_OK(etp_ep_reset_report(ly, s));
        etp_memory_report_t m0 = ETP_MEMORY_REPORT_INIT, m1 = ETP_MEMORY_REPORT_INIT;
        ETP_OK(etp_stream_synchronize(s));
        ETP_OK(etp_memory_report(f->ctx, &m0));
        etp_ep_ll_rows_t v = ETP_EP_LL_ROWS_INIT;
        ETP_OK(ll_dispatch_call(g, ly, &in, &d, o->device_T, &v, s));
        ETP_OK(ll_combine_call(g, l, ly, &in, &d, o->device_T, s));
        ETP_OK(etp_stream_synchronize(s));
        ETP_OK(etp_memory_report(f->ctx, &m1));
        assert_true(ep_same_report(&m0, &m1));
        assert_int_equal(v.half, h);
        views[h] = v;
        have[h] = 1;
        ll_check_rows(g, l, &in, tag + (uint64_t)i, &v, s);
        ll_check_out(g, l, T_ll, &in, tag + (uint64_t)i, &d, s);
        if (o->report) ep_check_report(ly, &in.rf.st[g->me], 1);
        if (o->exact && !o->device_T) ll_check_exact(f, g, l, T_ll, &in, &d, &v, s);
        ll_in_free(&in);
    }
    ll_dev_free(f, &d);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* Two dispatches in flight: dispatch 0, dispatch 1 (the rows of 0 still
 * valid), a third refused, combine 0 and 1 (each against its own
 * reference), a combine with none awaiting refused; then dispatch 2 reuses
 * half 0 and the rows of 1 are still valid. */
static inline void ll_overlap(ep_fx_t *f, gcfg_t *g, lcfg_t *l, int64_t tll, uint64_t tag)
{
    etp_ep_group_t *ep = ep_make_group(f, g);
    etp_ep_layer_t *ly = ll_make_layer(ep, g, l, tll, "ll2");
    const int64_t T_ll = tll ? tll : g->tmax;
    etp_stream_t *s = f->s0;
    ll_in_t in[3];
    ll_dev_t d[3];
    etp_ep_ll_rows_t v[3] = {ETP_EP_LL_ROWS_INIT, ETP_EP_LL_ROWS_INIT, ETP_EP_LL_ROWS_INIT};
    for (int i = 0; i < 3; i++) {
        ll_in_make(g, l, T_ll, tag + (uint64_t)i, i == 1 ? ROUTE_SKEWED : ROUTE_UNIFORM, NULL,
                   &in[i]);
        ll_dev_alloc(f, g, l, T_ll, &d[i]);
        ll_upload(f, g, l, T_ll, &in[i], tag + (uint64_t)i, &d[i], s);
    }
    ETP_OK(ll_dispatch_call(g, ly, &in[0], &d[0], 0, &v[0], s));
    ETP_OK(ll_dispatch_call(g, ly, &in[1], &d[1], 0, &v[1], s));
    assert_int_equal(v[0].half, 0);
    assert_int_equal(v[1].half, 1);
    assert_true(v[0].tokens != v[1].tokens);
    /* etp_ep_layout: the last dispatch's half */
    const int32_t *lc = NULL, *lo = NULL;
    ETP_OK(etp_ep_layout(ly, &lc, &lo));
    assert_ptr_equal(lc, v[1].counts);
    assert_ptr_equal(lo, v[1].offsets);
    ll_check_rows(g, l, &in[0], tag, &v[0], s);
    ll_check_rows(g, l, &in[1], tag + 1, &v[1], s);
    /* a third would overwrite dispatch 0's rows before its combine */
    ETP_EXPECT_MSG(ll_dispatch_call(g, ly, &in[2], &d[2], 0, NULL, s), ETP_ERR_INVALID_STATE,
                   "awaiting their combine");
    ETP_OK(ll_combine_call(g, l, ly, &in[0], &d[0], 0, s));
    ETP_OK(etp_stream_synchronize(s));
    ll_check_out(g, l, T_ll, &in[0], tag, &d[0], s);
    ETP_OK(ll_combine_call(g, l, ly, &in[1], &d[1], 0, s));
    ETP_OK(etp_stream_synchronize(s));
    ll_check_out(g, l, T_ll, &in[1], tag + 1, &d[1], s);
    ETP_EXPECT_MSG(ll_combine_call(g, l, ly, &in[1], &d[1], 0, s), ETP_ERR_INVALID_STATE,
                   "no dispatch awaiting");
    /* dispatch 2 refills half 0; the rows of dispatch 1 stay as they were */
    ETP_OK(ll_dispatch_call(g, ly, &in[2], &d[2], 0, &v[2], s));
    assert_int_equal(v[2].half, 0);
    assert_ptr_equal(v[2].tokens, v[0].tokens);
    ll_check_rows(g, l, &in[2], tag + 2, &v[2], s);
    ll_check_rows(g, l, &in[1], tag + 1, &v[1], s);
    ETP_OK(ll_combine_call(g, l, ly, &in[2], &d[2], 0, s));
    ETP_OK(etp_stream_synchronize(s));
    ll_check_out(g, l, T_ll, &in[2], tag + 2, &d[2], s);
    for (int i = 0; i < 3; i++) {
        ll_dev_free(f, &d[i]);
        ll_in_free(&in[i]);
    }
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* Capture dispatch + combine once (T on the device) and replay it with new
 * routing: rows, weights and out equal the same calls of another layer
 * run eagerly, and the reference; the memory report unchanged. */
static inline void ll_graph(ep_fx_t *f, gcfg_t *g, lcfg_t *l, int64_t tll, uint64_t tag)
{
    etp_ep_group_t *ep = ep_make_group(f, g);
    etp_ep_layer_t *graphed = ll_make_layer(ep, g, l, tll, "ll_graphed");
    etp_ep_layer_t *eager = ll_make_layer(ep, g, l, tll, "ll_eager");
    const int64_t T_ll = tll ? tll : g->tmax;
    const size_t es = etp_dtype_size(g->dt);
    etp_stream_t *s = f->s0;
    ll_dev_t d;
    ll_dev_alloc(f, g, l, T_ll, &d);
    ll_in_t in;
    ll_in_make(g, l, T_ll, tag, ROUTE_UNIFORM, NULL, &in);
    ll_upload(f, g, l, T_ll, &in, tag, &d, s);
    ll_in_free(&in);
    etp_memory_report_t m0 = ETP_MEMORY_REPORT_INIT, m1 = ETP_MEMORY_REPORT_INIT;
    ETP_OK(etp_memory_report(f->ctx, &m0));
    etp_ep_ll_rows_t vg = ETP_EP_LL_ROWS_INIT, ve = ETP_EP_LL_ROWS_INIT;
    ETP_OK(etp_stream_begin_capture(s));
    ETP_OK(ll_dispatch_call(g, graphed, &in, &d, 1, &vg, s));
    ETP_OK(ll_combine_call(g, l, graphed, &in, &d, 1, s));
    etp_graph_t *graph = NULL;
    ETP_OK(etp_stream_end_capture(s, &graph));
    ETP_OK(etp_memory_report(f->ctx, &m1));
    assert_true(ep_same_report(&m0, &m1));
    const size_t nr = (size_t)(l->rows * g->H) * es, no = (size_t)((T_ll + 1) * g->H) * es;
    uint8_t *rg = malloc(nr), *re = malloc(nr), *og = malloc(no), *oe = malloc(no);
    for (int rep = 0; rep < 3; rep++) {
        const uint64_t t = tag + 1 + (uint64_t)rep;
        ll_in_make(g, l, T_ll, t, rep % 2 ? ROUTE_SKEWED : ROUTE_BAD, NULL, &in);
        ll_upload(f, g, l, T_ll, &in, t, &d, s);
        ETP_OK(etp_memset_async(s, vg.tokens, 0xA5, nr));
        ETP_OK(etp_graph_launch(graph, s));
        ETP_OK(etp_stream_synchronize(s));
        ll_check_rows(g, l, &in, t, &vg, s);
        ll_check_out(g, l, T_ll, &in, t, &d, s);
        ep_down(s, rg, vg.tokens, nr);
        ep_down(s, og, d.out, no);
        ETP_OK(etp_memset_async(s, d.out, 0xA5, no));
        ETP_OK(ll_dispatch_call(g, eager, &in, &d, 1, &ve, s));
        ETP_OK(ll_combine_call(g, l, eager, &in, &d, 1, s));
        ep_down(s, re, ve.tokens, nr);
        ep_down(s, oe, d.out, no);
        assert_memory_equal(rg, re, nr);
        assert_memory_equal(og, oe, no);
        /* the replayed dispatch counts as a prepare in the mirror */
        etp_ep_report_t r = ETP_EP_REPORT_INIT;
        ETP_OK(etp_ep_poll(graphed, &r));
        assert_int_equal(r.prepares, rep + 1);
        ll_in_free(&in);
    }
    free(rg);
    free(re);
    free(og);
    free(oe);
    ETP_OK(etp_graph_destroy(graph));
    ll_dev_free(f, &d);
    ETP_OK(etp_ep_layer_destroy(graphed));
    ETP_OK(etp_ep_layer_destroy(eager));
    ETP_OK(etp_ep_group_destroy(ep));
}

#endif /* ETP_TEST_EP_LL_H */
