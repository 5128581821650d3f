/*
 * One EP step of one layer through etp (prepare, dispatch, combine,
 * combine_bwd, dispatch_bwd) on device buffers, every output compared with
 * the reference of test_ep_ref.h bit for bit, outputs poisoned first and
 * the rows past the layer's rows checked to keep their poison; the
 * adjoint identities checked to rounding; the counters compared with the
 * reference's; the memory report checked unchanged across the EP calls.
 * Shared by the MPI tests (host backend) and the GPU test (CUDA backend).
 *
 * MXFP8 groups (gcfg_t.mx): dispatch goes through etp_ep_dispatch_ex and its
 * data and scales are compared byte for byte with the quant module's host
 * reference (etp__qref_quantize, MXFP8 rowwise E4M3) of each source row;
 * every other call is checked as in a BF16 group. A test that runs MXFP8
 * steps defines ETP_TEST_EP_MXFP8 before including this header and links
 * the static archive (etp_internal) for the reference.
 */
#ifndef ETP_TEST_EP_STEPS_H
#define ETP_TEST_EP_STEPS_H

#include "test_ep_ref.h"

#ifdef ETP_TEST_EP_MXFP8
#include "quant/formats/quant_ref.h"

/* The reference MXFP8 rowwise E4M3 quantization of one BF16 row of H
 * elements: data[H] and scales[H/32] (the first row of the reference's
 * padded, row-major scale matrix). */
static inline void ep_mx_ref_row(const uint16_t *row, int64_t H, uint8_t *data, uint8_t *scales)
{
    etp__qref_cfg_t c;
    memset(&c, 0, sizeof c);
    c.format = ETP__QB_MXFP8;
    const size_t scols = ((size_t)H / 32 + 3) / 4 * 4;
    uint8_t *sc = calloc(128 * scols, 1);
    etp__qref_quantize(&c, row, ETP__QB_BF16, 1, (size_t)H, 0.0f, data, sc, NULL, NULL);
    memcpy(scales, sc, (size_t)H / 32);
    free(sc);
}
#endif

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s0, *s1;
    int mode;
} ep_fx_t;

/* The host MPI tests' fixture: a host context in eager or shuffle mode and
 * two streams (the GPU test has its own). */
static inline int ep_host_setup(void **state, int mode)
{
    ep_fx_t *f = calloc(1, sizeof *f);
    f->mode = mode;
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, (int64_t)(g_seed % 1000), -1, -1);
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s0));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_HIGH, &f->s1));
    *state = f;
    return 0;
}
static inline int ep_host_setup_eager(void **state)
{
    return ep_host_setup(state, ETP_HOST_STREAMS_EAGER);
}
static inline int ep_host_setup_shuffle(void **state)
{
    return ep_host_setup(state, ETP_HOST_STREAMS_SHUFFLE);
}
static inline int ep_host_teardown(void **state)
{
    ep_fx_t *f = *state;
    ETP_OK(etp_stream_destroy(f->s0));
    ETP_OK(etp_stream_destroy(f->s1));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

static inline void *ep_dalloc(ep_fx_t *f, size_t bytes)
{
    void *p = NULL;
    ETP_OK(etp_mem_alloc(f->ctx, bytes ? bytes : 1, ETP_MEM_USER, &p));
    return p;
}

static inline void ep_up(etp_stream_t *s, void *dst, const void *src, size_t bytes)
{
    ETP_OK(etp_memcpy_async(s, dst, src, bytes));
}

/* Copy device -> host, synchronizing. */
static inline void ep_down(etp_stream_t *s, void *dst, const void *src, size_t bytes)
{
    ETP_OK(etp_memcpy_async(s, dst, src, bytes));
    ETP_OK(etp_stream_synchronize(s));
}

static inline int ep_same_report(const etp_memory_report_t *a, const etp_memory_report_t *b)
{
    return a->total_bytes == b->total_bytes && a->peak_bytes == b->peak_bytes &&
           a->live_allocations == b->live_allocations &&
           memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

/* Make an EP group on the world with g's settings; fills slab and tok_cap. */
static inline etp_ep_group_t *ep_make_group(ep_fx_t *f, gcfg_t *g)
{
    etp_ep_group_config_t c = ETP_EP_GROUP_CONFIG_INIT;
    c.name = "ep";
    c.num_experts = g->E;
    c.hidden = g->H;
    c.token_dtype = g->mx ? ETP_EP_TOKEN_MXFP8 : g->dt;
    c.max_tokens_per_rank = g->tmax;
    c.max_topk = g->maxk;
    c.recv_capacity_per_rank = g->cap;
    c.overflow = g->overflow;
    c.transport = g->transport;
    c.capacity_factor = g->cf;
    c.combine_wire = g->wire ? g->wire : ETP_DTYPE_F32;
    etp_ep_group_t *ep = NULL;
    ETP_OK(etp_ep_group_create(f->world, &c, &ep));
    etp_ep_group_info_t info = ETP_EP_GROUP_INFO_INIT;
    ETP_OK(etp_ep_group_info(ep, &info));
    assert_int_equal(info.transport, g->transport);
    assert_int_equal(info.combine_wire, c.combine_wire);
    assert_int_equal(info.ranks, g->R);
    assert_int_equal(info.rank, g->me);
    assert_int_equal(info.local_experts, g->L);
    assert_int_equal(info.first_expert, g->me * g->L);
    /* docs/EP.md: MXFP8 wire rows are H data and H/32 scale bytes, zero-padded to 16 */
    assert_int_equal(info.wire_row_bytes,
                     g->mx ? (size_t)((g->H + g->H / 32 + 15) / 16 * 16)
                           : (size_t)g->H * etp_dtype_size(g->dt));
    g->slab = info.slab_rows;
    g->tok_cap = info.recv_token_rows;
    if (g->transport == ETP_EP_TRANSPORT_CAPACITY) {
        /* docs/EP.md: ceil(c * tmax * p), p = 1 - C(E-L, K) / C(E, K), at most tmax */
        double miss = 1.0;
        for (int i = 0; i < g->maxk; i++)
            miss *= g->E - g->L - i <= 0 ? 0.0 : (double)(g->E - g->L - i) / (double)(g->E - i);
        double want = ceil(g->cf * (double)g->tmax * (1.0 - miss));
        int64_t slab = want >= (double)g->tmax ? g->tmax : want < 1 ? 1 : (int64_t)want;
        assert_int_equal(g->slab, slab);
        assert_int_equal(g->tok_cap, g->R * slab);
    } else if (g->transport == ETP_EP_TRANSPORT_NVLINK) {
        /* docs/EP.md: a slab of max_tokens_per_rank rows per source rank;
         * a rank accepts EXACT's receive capacity */
        assert_int_equal(g->slab, g->tmax);
        assert_int_equal(g->tok_cap, g->R * g->tmax);
        g->tok_cap = g->cap < g->R * g->tmax ? g->cap : g->R * g->tmax;
    } else {
        assert_int_equal(g->slab, 0);
        assert_int_equal(g->tok_cap, g->cap < g->R * g->tmax ? g->cap : g->R * g->tmax);
    }
    return ep;
}

static inline etp_ep_layer_t *ep_make_layer(etp_ep_group_t *ep, const gcfg_t *g, lcfg_t *l,
                                            const char *name)
{
    etp_ep_layer_config_t c = ETP_EP_LAYER_CONFIG_INIT;
    c.name = name;
    c.topk = l->k;
    c.alignment = l->align;
    c.layout = l->layout;
    c.weighted = l->weighted;
    c.slots_per_expert = l->layout == ETP_EP_LAYOUT_FIXED_SLOTS ? l->S : 0;
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

/* Device buffers of one step, sized for the group and layer. */
typedef struct {
    int64_t *idx;
    void *tok, *recv, *y, *out, *gout, *grows_in, *grows, *gtok;
    float *w, *recv_w, *gw_in, *gtopk, *gtopk2;
    int32_t *tdev;
    uint8_t *recv_s; /* MXFP8 scales [rows + 2, H/32] */
} ep_bufs_t;

static inline void ep_bufs_alloc(ep_fx_t *f, const gcfg_t *g, int64_t rows, int k, ep_bufs_t *b)
{
    const size_t es = etp_dtype_size(g->dt), H = (size_t)g->H, T = (size_t)g->tmax;
    const size_t R2 = (size_t)rows + 2;
    b->idx = ep_dalloc(f, T * (size_t)k * 8);
    b->tok = ep_dalloc(f, T * H * es + 16); /* + 16: room for a misaligned start */
    b->w = ep_dalloc(f, T * (size_t)k * 4);
    b->recv = ep_dalloc(f, R2 * H * es);
    b->recv_w = ep_dalloc(f, R2 * 4);
    b->y = ep_dalloc(f, R2 * H * es);
    b->out = ep_dalloc(f, T * H * es);
    b->gout = ep_dalloc(f, T * H * es);
    b->grows = ep_dalloc(f, R2 * H * es);
    b->gtopk = ep_dalloc(f, T * (size_t)k * 4);
    b->grows_in = ep_dalloc(f, R2 * H * es);
    b->gw_in = ep_dalloc(f, R2 * 4);
    b->gtok = ep_dalloc(f, T * H * es);
    b->gtopk2 = ep_dalloc(f, T * (size_t)k * 4);
    b->tdev = ep_dalloc(f, 4);
    b->recv_s = ep_dalloc(f, R2 * (H / 32) + 1);
}

static inline void ep_bufs_free(ep_fx_t *f, ep_bufs_t *b)
{
    void *all[] = {b->idx, b->tok, b->w, b->recv, b->recv_w, b->y, b->out, b->gout,
                   b->grows, b->gtopk, b->grows_in, b->gw_in, b->gtok, b->gtopk2, b->tdev,
                   b->recv_s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ETP_OK(etp_mem_free(f->ctx, all[i]));
}

static inline int ep_bits_equal(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static inline void ep_check_report(etp_ep_layer_t *ly, const ref_stats_t *want, int prepares)
{
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    etp_status_t st = etp_ep_check(ly, &r);
    (void)st; /* the error policy's statuses are tested on their own */
    if (r.flags != want->flags || r.bad_index_slots != want->bad || r.duplicate_slots != want->dup ||
        r.transport_dropped_slots != want->tdrop || r.rows_dropped_slots != want->rdrop ||
        r.transport_rows_needed != want->tneed || r.rows_needed != want->rneed ||
        r.prepares != prepares) {
        print_error("rank %d report: flags %x bad %lld dup %lld tdrop %lld rdrop %lld tneed %lld "
                    "rneed %lld prepares %lld; expected %x %lld %lld %lld %lld %lld %lld %d\n",
                    g_rank, r.flags, (long long)r.bad_index_slots, (long long)r.duplicate_slots,
                    (long long)r.transport_dropped_slots, (long long)r.rows_dropped_slots,
                    (long long)r.transport_rows_needed, (long long)r.rows_needed,
                    (long long)r.prepares, want->flags, (long long)want->bad,
                    (long long)want->dup, (long long)want->tdrop, (long long)want->rdrop,
                    (long long)want->tneed, (long long)want->rneed, prepares);
        fail();
    }
}

static inline float ep_gr(uint64_t tag, int d, int64_t r, int64_t h, int64_t H)
{
    return ep_val(tag * 16 + TAG_GR, (uint64_t)d, (uint64_t)(r * H + h));
}

/* Sum of x over all ranks, in double. */
static inline double ep_allsum(double x)
{
    double y = 0;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return y;
}

static inline void ep_near(double a, double b, double scale, const char *what)
{
    double tol = 1e-5 * (scale > 1 ? scale : 1);
    if (fabs(a - b) > tol) {
        print_error("adjoint %s: %.17g vs %.17g (tolerance %g)\n", what, a, b, tol);
        fail();
    }
}

/* Step options. */
typedef struct {
    int route_mode;
    const int64_t *fixed_T;  /* per rank, or NULL: random */
    int device_T;            /* pass T through a device int32 (fixed_T may then be bad) */
    int check_report;        /* compare the counters with the reference */
    int misalign;            /* tokens start 2 bytes past a 16-byte boundary */
    int empty_ptrs;          /* T = 0 on the host: pass buffers, not NULL, for the [T, ...] arrays */
} ep_step_opts_t;

/* One full step of layer `ly`, checked. Only the ranks' own data is
 * uploaded; the reference is built from every rank's data. */
static inline void ep_step(ep_fx_t *f, const gcfg_t *g, const lcfg_t *l, etp_ep_layer_t *ly,
                           etp_stream_t *s, ep_bufs_t *b, uint64_t tag,
                           const ep_step_opts_t *o)
{
    const int me = g->me, k = l->k;
    const int64_t H = g->H, L = g->L, rows = l->rows;
    const etp_dtype_t dt = g->dt;
    const size_t es = etp_dtype_size(dt);
    ref_t rf;
    /* T of every rank: given or random; a device T may be out of range,
     * then etp clamps it and flags it (the reference uses the clamped T) */
    int64_t Ts[64], raw_me = 0;
    for (int r = 0; r < g->R; r++) {
        int64_t raw = o->fixed_T ? o->fixed_T[r] : ep_tokens(tag, r, g->tmax);
        if (r == me) raw_me = raw;
        Ts[r] = raw < 0 ? 0 : raw > g->tmax ? g->tmax : raw;
    }
    ref_build(&rf, g, l, tag, o->route_mode, Ts);
    if (raw_me != Ts[me]) rf.st[me].flags |= ETP_EP_FLAG_BAD_TOKENS;
    const int64_t Tm = rf.T[me];
    const int32_t t_dev_value = (int32_t)raw_me;
    etp_memory_report_t m0 = ETP_MEMORY_REPORT_INIT, m1 = ETP_MEMORY_REPORT_INIT;

    /* inputs */
    size_t nidx = (size_t)(o->device_T ? g->tmax : Tm) * (size_t)k;
    int64_t *hidx = calloc(nidx + 1, sizeof *hidx);
    memcpy(hidx, rf.idx[me], (size_t)Tm * k * sizeof *hidx);
    for (size_t i = (size_t)Tm * k; i < nidx; i++) hidx[i] = 0; /* rows past T: ignored */
    uint8_t *htok = malloc((size_t)(Tm * H) * es + 1);
    float *hw = malloc((size_t)(Tm * k) * 4 + 4);
    for (int64_t i = 0; i < Tm * H; i++) ep_put(htok, dt, i, ep_tok(tag * 16 + TAG_TOK, (uint64_t)me, (uint64_t)i, g->mx));
    void *tokp = (char *)b->tok + (o->misalign ? 2 : 0);
    for (int64_t i = 0; i < Tm * k; i++) hw[i] = ep_weight(tag * 16 + TAG_W, (uint64_t)me, (uint64_t)i);
    ep_up(s, b->idx, hidx, nidx * 8);
    ep_up(s, tokp, htok, (size_t)(Tm * H) * es);
    ep_up(s, b->w, hw, (size_t)(Tm * k) * 4);
    if (o->device_T) ep_up(s, b->tdev, &t_dev_value, 4);
    /* expert-side inputs of the later calls, uploaded now so that the EP
     * calls below run with no allocation or host work between them */
    uint8_t *hy = malloc((size_t)((rows + 2) * H) * es);
    uint8_t *hgr = malloc((size_t)((rows + 2) * H) * es);
    float *hgw = malloc((size_t)(rows + 2) * 4);
    for (int64_t r = 0; r < rows + 2; r++) {
        for (int64_t h = 0; h < H; h++) {
            ep_put(hy, dt, r * H + h, ep_y(tag, me, r, h, H));
            ep_put(hgr, dt, r * H + h, ep_gr(tag, me, r, h, H));
        }
        hgw[r] = ep_val(tag * 16 + TAG_GW, (uint64_t)me, (uint64_t)r);
    }
    uint8_t *hg = malloc((size_t)(Tm * H) * es + 1);
    for (int64_t i = 0; i < Tm * H; i++) ep_put(hg, dt, i, ep_val(tag * 16 + TAG_G, (uint64_t)me, (uint64_t)i));
    ep_up(s, b->y, hy, (size_t)(rows * H) * es);
    ep_up(s, b->grows_in, hgr, (size_t)(rows * H) * es);
    ep_up(s, b->gw_in, hgw, (size_t)rows * 4);
    ep_up(s, b->gout, hg, (size_t)(Tm * H) * es);
    /* poison every output, including two rows past the layer's rows */
    ETP_OK(etp_memset_async(s, b->recv, 0xA5, (size_t)((rows + 2) * H) * es));
    ETP_OK(etp_memset_async(s, b->recv_w, 0xA5, (size_t)(rows + 2) * 4));
    if (g->mx) ETP_OK(etp_memset_async(s, b->recv_s, 0xA5, (size_t)((rows + 2) * (H / 32))));
    ETP_OK(etp_memset_async(s, b->out, 0xA5, (size_t)(g->tmax * H) * es));
    ETP_OK(etp_memset_async(s, b->grows, 0xA5, (size_t)((rows + 2) * H) * es));
    ETP_OK(etp_memset_async(s, b->gtopk, 0xA5, (size_t)(g->tmax * k) * 4));
    ETP_OK(etp_memset_async(s, b->gtok, 0xA5, (size_t)(g->tmax * H) * es));
    ETP_OK(etp_memset_async(s, b->gtopk2, 0xA5, (size_t)(g->tmax * k) * 4));
    ETP_OK(etp_ep_reset_report(ly, s));
    ETP_OK(etp_stream_synchronize(s));
    ETP_OK(etp_memory_report(f->ctx, &m0));

    /* An empty rank (T = 0 on the host) passes NULL for every array of T
     * rows: topk_idx, tokens, topk_weights, out, grad_out, grad_tokens and
     * both grad_topk_weights; the poisoned buffers must stay untouched. */
    const int nul = Tm == 0 && !o->device_T && !o->empty_ptrs;
#define EP_TOKP(p) (nul ? NULL : (p))
    /* the step: nothing allocated from here to m1 */
    if (o->device_T)
        ETP_OK(etp_ep_prepare(ly, b->idx, ETP_DTYPE_I64, ETP_EP_TOKENS_ON_DEVICE, b->tdev, s));
    else
        ETP_OK(etp_ep_prepare(ly, EP_TOKP(b->idx), ETP_DTYPE_I64, Tm, NULL, s));
    if (g->mx) {
        etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
        da.tokens = EP_TOKP(tokp);
        da.dtype = ETP_DTYPE_BF16;
        da.topk_weights = EP_TOKP(b->w);
        da.recv_tokens = b->recv;
        da.recv_scales = b->recv_s;
        da.recv_weights = b->recv_w;
        da.rows = rows + 2;
        ETP_OK(etp_ep_dispatch_ex(ly, &da, s));
    } else {
        ETP_OK(etp_ep_dispatch(ly, EP_TOKP(tokp), dt, EP_TOKP(b->w), ETP_DTYPE_F32, b->recv,
                               b->recv_w, rows + 2, s));
    }
    ETP_OK(etp_ep_combine(ly, b->y, dt, rows, EP_TOKP(b->out), s));
    ETP_OK(etp_ep_combine_bwd(ly, EP_TOKP(b->gout), dt, l->weighted ? b->y : NULL, rows, b->grows,
                              l->weighted ? EP_TOKP(b->gtopk) : NULL, s));
    ETP_OK(etp_ep_dispatch_bwd(ly, b->grows_in, dt, b->gw_in, rows, EP_TOKP(b->gtok),
                               EP_TOKP(b->gtopk2), s));
#undef EP_TOKP
    ETP_OK(etp_stream_synchronize(s));
    ETP_OK(etp_memory_report(f->ctx, &m1));
    assert_true(ep_same_report(&m0, &m1));

    /* layout */
    int32_t *cnt = malloc((size_t)L * sizeof *cnt), *off = malloc((size_t)(L + 1) * sizeof *off);
    ETP_OK(etp_ep_layout_host(ly, s, cnt, off));
    for (int64_t e = 0; e < L; e++) {
        if (cnt[e] != rf.counts[me][e] || off[e] != rf.offsets[me][e]) {
            print_error("rank %d expert %lld: count %d offset %d, expected %lld %lld\n", me,
                        (long long)e, cnt[e], off[e], (long long)rf.counts[me][e],
                        (long long)rf.offsets[me][e]);
            fail();
        }
    }
    assert_int_equal(off[L], rf.offsets[me][L]);
    free(cnt);
    free(off);

    /* dispatch: row r holds the token of (s, t) whose slot landed there */
    uint8_t *hrecv = malloc((size_t)((rows + 2) * H) * es);
    float *hrw = malloc((size_t)(rows + 2) * 4);
    ep_down(s, hrecv, b->recv, (size_t)((rows + 2) * H) * es);
    ep_down(s, hrw, b->recv_w, (size_t)(rows + 2) * 4);
    int64_t *src_s = malloc((size_t)rows * sizeof *src_s), *src_t = malloc((size_t)rows * sizeof *src_t);
    int *src_j = malloc((size_t)rows * sizeof *src_j);
    for (int64_t r = 0; r < rows; r++) src_s[r] = -1;
    for (int sr = 0; sr < g->R; sr++)
        for (int64_t t = 0; t < rf.T[sr]; t++)
            for (int j = 0; j < k; j++)
                if (rf.dest[sr][t * k + j] == me && rf.row[sr][t * k + j] >= 0) {
                    int64_t r = rf.row[sr][t * k + j];
                    assert_true(src_s[r] == -1);
                    src_s[r] = sr;
                    src_t[r] = t;
                    src_j[r] = j;
                }
    int64_t bad = 0;
    if (g->mx) {
#ifdef ETP_TEST_EP_MXFP8
        /* MXFP8: row r = the reference quantization of its source token's
         * BF16 row, data [rows, H] and scales [rows, H/32]; empty rows 0 */
        const int64_t nb = H / 32;
        uint8_t *hs = malloc((size_t)((rows + 2) * nb) + 1), *wd = malloc((size_t)H);
        uint8_t *ws = malloc((size_t)nb + 1);
        uint16_t *srow = malloc((size_t)H * 2);
        ep_down(s, hs, b->recv_s, (size_t)((rows + 2) * nb));
        int64_t bad_data = 0, bad_scales = 0;
        for (int64_t r = 0; r < rows; r++) {
            memset(wd, 0, (size_t)H);
            memset(ws, 0, (size_t)nb);
            if (src_s[r] >= 0) {
                for (int64_t h = 0; h < H; h++)
                    srow[h] = etp__f32_to_bf16(ep_tok(tag * 16 + TAG_TOK, (uint64_t)src_s[r],
                                                      (uint64_t)(src_t[r] * H + h), 1));
                ep_mx_ref_row(srow, H, wd, ws);
            }
            for (int64_t h = 0; h < H; h++) bad_data += hrecv[r * H + h] != wd[h];
            for (int64_t q = 0; q < nb; q++) bad_scales += hs[r * nb + q] != ws[q];
        }
        /* rows past the layer's are not touched */
        for (int64_t i = rows * H; i < (rows + 2) * H; i++) bad_data += hrecv[i] != 0xA5;
        for (int64_t i = rows * nb; i < (rows + 2) * nb; i++) bad_scales += hs[i] != 0xA5;
        if (bad_data || bad_scales)
            print_error("rank %d MXFP8 dispatch: %lld data bytes and %lld scale bytes wrong\n", me,
                        (long long)bad_data, (long long)bad_scales);
        bad += bad_data + bad_scales;
        free(hs);
        free(wd);
        free(ws);
        free(srow);
#else
        fail_msg("MXFP8 steps need ETP_TEST_EP_MXFP8 (the quant module's reference)");
#endif
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t h = 0; h < H; h++) {
                float want = src_s[r] < 0 ? 0.0f
                                          : ep_val(tag * 16 + TAG_TOK, (uint64_t)src_s[r],
                                                   (uint64_t)(src_t[r] * H + h));
                if (dt == ETP_DTYPE_BF16) want = etp__bf16_to_f32(etp__f32_to_bf16(want));
                bad += !ep_bits_equal(ep_get(hrecv, dt, r * H + h), want);
            }
    }
    for (int64_t r = 0; r < rows; r++) {
        float want = src_s[r] < 0 ? 0.0f
                                  : ep_weight(tag * 16 + TAG_W, (uint64_t)src_s[r],
                                              (uint64_t)(src_t[r] * k + src_j[r]));
        bad += !ep_bits_equal(hrw[r], want);
    }
    if (!g->mx)
        for (size_t i = (size_t)(rows * H) * es; i < (size_t)((rows + 2) * H) * es; i++) bad += hrecv[i] != 0xA5;
    for (size_t i = (size_t)rows * 4; i < (size_t)(rows + 2) * 4; i++) bad += ((uint8_t *)hrw)[i] != 0xA5;
    if (bad) print_error("rank %d dispatch: %lld wrong values\n", me, (long long)bad);
    assert_int_equal(bad, 0);

    /* combine */
    size_t tbytes = (size_t)(g->tmax * H) * es;
    uint8_t *hout = malloc(tbytes), *want = malloc(tbytes);
    ep_down(s, hout, b->out, tbytes);
    ref_combine(&rf, g, l, tag, ep_y, tag, l->weighted, want);
    for (size_t i = 0; i < (size_t)(Tm * H) * es; i++) bad += hout[i] != want[i];
    for (size_t i = (size_t)(Tm * H) * es; i < tbytes; i++) bad += hout[i] != 0xA5;
    if (bad) print_error("rank %d combine: %lld wrong bytes\n", me, (long long)bad);
    assert_int_equal(bad, 0);

    /* combine_bwd: grad_rows[r] = w * grad_out[t] (or grad_out[t]), one rounding */
    uint8_t *hgrows = malloc((size_t)((rows + 2) * H) * es);
    float *hgtopk = malloc((size_t)(g->tmax * k) * 4);
    ep_down(s, hgrows, b->grows, (size_t)((rows + 2) * H) * es);
    ep_down(s, hgtopk, b->gtopk, (size_t)(g->tmax * k) * 4);
    for (int64_t r = 0; r < rows; r++) {
        float w = src_s[r] < 0 ? 0 : ep_weight(tag * 16 + TAG_W, (uint64_t)src_s[r], (uint64_t)(src_t[r] * k + src_j[r]));
        for (int64_t h = 0; h < H; h++) {
            float gv = 0.0f;
            if (src_s[r] >= 0) {
                gv = ep_val(tag * 16 + TAG_G, (uint64_t)src_s[r], (uint64_t)(src_t[r] * H + h));
                if (dt == ETP_DTYPE_BF16) gv = etp__bf16_to_f32(etp__f32_to_bf16(gv));
                if (l->weighted) gv = w * gv;
                if (dt == ETP_DTYPE_BF16) gv = etp__bf16_to_f32(etp__f32_to_bf16(gv));
            }
            bad += !ep_bits_equal(ep_get(hgrows, dt, r * H + h), gv);
        }
    }
    for (size_t i = (size_t)(rows * H) * es; i < (size_t)((rows + 2) * H) * es; i++) bad += hgrows[i] != 0xA5;
    if (l->weighted) {
        float *gx = malloc((size_t)H * 4), *yx = malloc((size_t)H * 4);
        for (int64_t t = 0; t < Tm; t++)
            for (int j = 0; j < k; j++) {
                float wantg = 0.0f;
                int64_t r = rf.row[me][t * k + j];
                int d = rf.dest[me][t * k + j];
                if (r >= 0 && rf.sent[me][t * g->R + d]) {
                    for (int64_t h = 0; h < H; h++) {
                        gx[h] = ep_get(hg, dt, t * H + h);
                        yx[h] = ep_y(tag, d, r, h, H);
                        if (dt == ETP_DTYPE_BF16) yx[h] = etp__bf16_to_f32(etp__f32_to_bf16(yx[h]));
                    }
                    wantg = ref_dot(gx, yx, H);
                }
                bad += !ep_bits_equal(hgtopk[t * k + j], wantg);
            }
        for (int64_t i = Tm * k; i < g->tmax * k; i++) bad += ((uint32_t *)hgtopk)[i] != 0xA5A5A5A5u;
        free(gx);
        free(yx);
    } else {
        for (int64_t i = 0; i < g->tmax * k; i++) bad += ((uint32_t *)hgtopk)[i] != 0xA5A5A5A5u;
    }
    if (bad) print_error("rank %d combine_bwd: %lld wrong values\n", me, (long long)bad);
    assert_int_equal(bad, 0);

    /* dispatch_bwd: the unweighted combine of grad_rows; weight grads by slot */
    uint8_t *hgtok = malloc(tbytes);
    float *hgtopk2 = malloc((size_t)(g->tmax * k) * 4);
    ep_down(s, hgtok, b->gtok, tbytes);
    ep_down(s, hgtopk2, b->gtopk2, (size_t)(g->tmax * k) * 4);
    ref_combine(&rf, g, l, tag, ep_gr, tag, 0, want);
    for (size_t i = 0; i < (size_t)(Tm * H) * es; i++) bad += hgtok[i] != want[i];
    for (size_t i = (size_t)(Tm * H) * es; i < tbytes; i++) bad += hgtok[i] != 0xA5;
    for (int64_t t = 0; t < Tm; t++)
        for (int j = 0; j < k; j++) {
            int64_t r = rf.row[me][t * k + j];
            int d = rf.dest[me][t * k + j];
            float wantg = r >= 0 ? ep_val(tag * 16 + TAG_GW, (uint64_t)d, (uint64_t)r) : 0.0f;
            bad += !ep_bits_equal(hgtopk2[t * k + j], wantg);
        }
    if (bad) print_error("rank %d dispatch_bwd: %lld wrong values\n", me, (long long)bad);
    assert_int_equal(bad, 0);

    /* adjoints, from etp's own outputs (sums over all ranks, in double):
     * <dispatch(x), y> + <recv_w, gw> == <x, dispatch_bwd(y)> + <w, gtopk>
     * (not for MXFP8 groups: their dispatch quantizes, it is not linear)
     * <combine(y), g> == <y, combine_bwd(g)> == <w, combine_bwd's gtopk> (weighted) */
    {
        if (!g->mx) {
            double lhs = 0, rhs = 0, scale = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t h = 0; h < H; h++) {
                    double a = ep_get(hrecv, dt, r * H + h), c = ep_get(hgr, dt, r * H + h);
                    lhs += a * c;
                    scale += fabs(a * c);
                }
                lhs += (double)hrw[r] * hgw[r];
                scale += fabs((double)hrw[r] * hgw[r]);
            }
            for (int64_t i = 0; i < Tm * H; i++) {
                const double t = (double)ep_get(htok, dt, i) * ep_get(hgtok, dt, i);
                rhs += t;
                scale += fabs(t);
            }
            for (int64_t i = 0; i < Tm * k; i++) {
                rhs += (double)hw[i] * hgtopk2[i];
                scale += fabs((double)hw[i] * hgtopk2[i]);
            }
            /* BF16 rounds each output once: a looser bound there */
            double s1 = ep_allsum(scale) * (dt == ETP_DTYPE_BF16 ? 1000 : 1);
            ep_near(ep_allsum(lhs), ep_allsum(rhs), s1, "dispatch");
        }
        /* the scale: the magnitudes of both sides' terms, since each side
         * rounds its own outputs (a token's sum can cancel where its rows'
         * gradients do not) */
        double c1 = 0, c2 = 0, c3 = 0, sc = 0;
        for (int64_t i = 0; i < Tm * H; i++) {
            c1 += (double)ep_get(hout, dt, i) * ep_get(hg, dt, i);
            sc += fabs((double)ep_get(hout, dt, i) * ep_get(hg, dt, i));
        }
        for (int64_t i = 0; i < rows * H; i++) {
            const double t = (double)ep_get(hy, dt, i) * ep_get(hgrows, dt, i);
            c2 += t;
            sc += fabs(t);
        }
        if (l->weighted)
            for (int64_t i = 0; i < Tm * k; i++) {
                c3 += (double)hw[i] * hgtopk[i];
                sc += fabs((double)hw[i] * hgtopk[i]);
            }
        c1 = ep_allsum(c1);
        sc = ep_allsum(sc);
        double s2 = dt == ETP_DTYPE_BF16 ? sc * 1000 : sc;
        ep_near(c1, ep_allsum(c2), s2, "combine (rows)");
        if (l->weighted) ep_near(c1, ep_allsum(c3), s2, "combine (weights)");
    }

    if (o->check_report) ep_check_report(ly, &rf.st[me], 1);

    free(hidx);
    free(htok);
    free(hw);
    free(hy);
    free(hgr);
    free(hgw);
    free(hg);
    free(hrecv);
    free(hrw);
    free(src_s);
    free(src_t);
    free(src_j);
    free(hout);
    free(want);
    free(hgrows);
    free(hgtopk);
    free(hgtok);
    free(hgtopk2);
    ref_free(&rf);
}

/* ---- whole test bodies shared by the BF16/F32 and the MXFP8 tests ---- */

/* Experts for top-k on this world: 4 a rank, and at least 2k. */
static inline int64_t ep_experts_for(int k)
{
    int64_t E = (int64_t)g_size * 4;
    while (E < 2 * k) E += g_size;
    return E;
}

/* A group of g and one layer of l with its buffers; the steps opts[i]
 * (tags[i]) on the first stream; `after` (may be NULL) on the layer; then
 * everything destroyed. */
static inline void ep_run_steps(ep_fx_t *f, gcfg_t *g, lcfg_t *l, const char *name,
                                const ep_step_opts_t *opts, const uint64_t *tags, int n,
                                void (*after)(etp_ep_layer_t *))
{
    etp_ep_group_t *ep = ep_make_group(f, g);
    etp_ep_layer_t *ly = ep_make_layer(ep, g, l, name);
    ep_bufs_t b;
    ep_bufs_alloc(f, g, l->rows, l->k, &b);
    for (int i = 0; i < n; i++) ep_step(f, g, l, ly, f->s0, &b, tags[i], &opts[i]);
    if (after) after(ly);
    ep_bufs_free(f, &b);
    ETP_OK(etp_ep_layer_destroy(ly));
    ETP_OK(etp_ep_group_destroy(ep));
}

/* Two steps of `route` on one layer handle (new routing, new T the
 * second time). */
static inline void ep_two_steps(ep_fx_t *f, gcfg_t *g, lcfg_t *l, const char *name, int route,
                                int misalign, uint64_t tag)
{
    ep_step_opts_t o = {.route_mode = route, .check_report = 1, .misalign = misalign};
    const ep_step_opts_t opts[2] = {o, o};
    const uint64_t tags[2] = {tag, tag + 1};
    ep_run_steps(f, g, l, name, opts, tags, 2, NULL);
}

/* Every rank with T = 0, then one rank with all the tokens, the empty
 * ranks passing NULL for their arrays of T rows (ep_step); then the same
 * with real buffers on the empty ranks, and with every other rank empty. */
static inline void ep_empty_ranks(ep_fx_t *f, gcfg_t *g, lcfg_t *l, uint64_t tag_zero,
                                  uint64_t tag_one)
{
    static const int64_t zeros[64] = {0};
    int64_t one[64] = {0}, alt[64] = {0};
    one[g_size - 1] = g->tmax;
    for (int r = 0; r < g_size; r++) alt[r] = r % 2 ? 0 : 1 + r % g->tmax;
    const ep_step_opts_t opts[4] = {
        {.route_mode = ROUTE_UNIFORM, .fixed_T = zeros, .check_report = 1},
        {.route_mode = ROUTE_UNIFORM, .fixed_T = one, .check_report = 1},
        {.route_mode = ROUTE_UNIFORM, .fixed_T = one, .check_report = 1, .empty_ptrs = 1},
        {.route_mode = ROUTE_SKEWED, .fixed_T = alt, .check_report = 1}};
    const uint64_t tags[4] = {tag_zero, tag_one, tag_one + 1000, tag_zero + 1000};
    ep_run_steps(f, g, l, "empty", opts, tags, 4, NULL);
}

/* T on the device: in range, 0, and past tmax on rank 0 (clamped and
 * flagged). */
static inline void ep_device_tokens(ep_fx_t *f, gcfg_t *g, lcfg_t *l, const char *name, uint64_t tag)
{
    int64_t Ts[3][64];
    ep_step_opts_t opts[3];
    uint64_t tags[3];
    for (int v = 0; v < 3; v++) {
        for (int r = 0; r < g_size; r++)
            Ts[v][r] = v == 0 ? (r * 5) % (g->tmax + 1) : v == 1 ? 0 : (r == 0 ? g->tmax + 7 : r);
        opts[v] = (ep_step_opts_t){.route_mode = ROUTE_UNIFORM, .fixed_T = Ts[v], .device_T = 1,
                                   .check_report = 1};
        tags[v] = tag + (uint64_t)v;
    }
    ep_run_steps(f, g, l, name, opts, tags, 3, NULL);
}

/* More than 2^16 local experts (E/R = 70,000) and a few tokens a rank: no
 * backend may bound the experts by an array of them on a stack (or by a
 * grid dimension). Both transports and layouts, every output against the
 * reference (which drops the same rows: FIXED_SLOTS keeps one per expert). */
static inline void ep_many_experts(ep_fx_t *f, uint64_t tag)
{
    for (int v = 0; v < EP_TRANSPORTS; v++) {
        gcfg_t g = {0};
        g.R = g_size;
        g.me = g_rank;
        g.L = 70000;
        g.E = g.L * g_size;
        g.H = 8;
        g.tmax = 5;
        g.maxk = 2;
        g.dt = v == 1 ? ETP_DTYPE_F32 : ETP_DTYPE_BF16;
        g.transport = ep_transport(v);
        g.overflow = ETP_EP_OVERFLOW_DROP;
        g.cf = 4.0;
        lcfg_t l = {.k = 2, .align = v == 1 ? 1 : 2, .weighted = 1,
                    .layout = v == 1 ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
        /* PACKED: room for every row, each padded to the alignment;
         * FIXED_SLOTS: one slot an expert */
        g.cap = v == 1 ? g.L : 2 * (int64_t)g_size * g.tmax * l.k;
        ep_two_steps(f, &g, &l, "wide", ROUTE_UNIFORM, 0, tag + 10 * (uint64_t)v);
    }
}

/* The drop policy never fails check or poll. */
static inline void ep_check_and_poll_succeed(etp_ep_layer_t *ly)
{
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    ETP_OK(etp_ep_check(ly, &r));
    ETP_OK(etp_ep_poll(ly, &r));
}

/* Slabs and rows too small, then bad indices too (first_route first):
 * the reference drops the same slots. */
static inline void ep_overflow_steps(ep_fx_t *f, gcfg_t *g, lcfg_t *l, int first_route, uint64_t tag0,
                                     uint64_t tag1)
{
    g->cf = 0.3;               /* slabs too small */
    g->cap = 8 * (g->L + 1);   /* rows too few */
    const ep_step_opts_t opts[2] = {{.route_mode = first_route, .check_report = 1},
                                    {.route_mode = ROUTE_BAD, .check_report = 1}};
    const uint64_t tags[2] = {tag0, tag1};
    ep_run_steps(f, g, l, "tight", opts, tags, 2, ep_check_and_poll_succeed);
}

#endif /* ETP_TEST_EP_STEPS_H */
