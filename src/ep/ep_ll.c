/*
 * Low-latency EP layers (etp/ep.h: etp_ep_ll_dispatch, etp_ep_ll_combine;
 * docs/EP.md): prepare folded into dispatch, one call a direction, two
 * halves of received rows that alternate between a layer's dispatches.
 *
 * A dispatch computes what prepare + dispatch of an ordinary layer do, with
 * NVLINK's slabs sized by the layer's max_tokens_per_rank (T_ll) and
 * EXACT's receive-capacity drops, into the half's own routing state and
 * rows; its combine reads that half. So results are EXACT's bit for bit.
 * - CUDA (a group with peer stores): dispatch is one kernel on the layer's
 *   own window (kernels/ep/ll.cu), combine the NVLINK combine kernel
 *   (nvl_e2t) on the same window's combine slabs with the half's layout.
 * - The host backend: the same kernels as NVLINK's host path (route, the
 *   count all-gather, clip, the metadata exchange, layout, pack, the token
 *   exchange, expand; pre-sum, exchange, token sum), on slabs of T_ll rows
 *   of the group's transport buffers, writing the half's state.
 *
 * Order: the host counts the layer's dispatches (half = count % 2) and the
 * dispatches not yet combined (at most 2: a third would overwrite the
 * first's rows and routing, which its combine reads: refused). Across
 * ranks the device orders the stores: a rank stores a call's rows into a
 * peer only once the peer has begun the same call (ll.cu; the combine
 * kernel waits for the peers' release of its previous call).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep_ll.h"
#include "ep/ep_rules.h"

/* One half: the routing and layout of one dispatch, and its rows. */
typedef struct {
    int32_t *t_dev, *slot_dest, *send_pos, *send_cnt, *send_base, *C, *recv_cnt, *recv_base;
    int32_t *counts, *offsets, *scratch, *recv_row, *tok_rows, *row_src;
    float *w;   /* [rows] the received slot weights (weighted layers) */
    void *rows; /* [rows, H] */
} ll_half_t;

struct etp__ep_ll {
    etp_context_t *ctx;
    etp__be_t *be;
    const etp__ep_kernels_t *kt;
    etp__bcomm_t *comm;
    int64_t tmax, rows, H;
    int R, k;
    void *mem; /* the halves and the device counters, one allocation */
    ll_half_t half[2];
    uint64_t *dcalls; /* CUDA: dispatch [0..2], combine [4..5] */
    /* CUDA: the layer's window, as the dispatch and combine kernels see it */
    etp__ep_nvl_t nv, e2t;
    size_t cnt_off, w_off;
    size_t part_slab; /* bytes of one of combine's two partial slabs */
    size_t flag_off;  /* combine's two flag slabs */
    void *win_local, *win_handle;
    size_t win_bytes;
    /* host order of the calls */
    int64_t dispatches; /* made so far: the next fills half dispatches % 2 */
    int pending;        /* dispatched, not yet combined (0 .. 2) */
    int64_t t_host[2];  /* T of each half's dispatch on the host; -1: on the device */
};

static size_t up256(size_t n)
{
    return (n + 255) / 256 * 256;
}

etp_status_t etp__ep_ll_create(const etp__ep_ll_env_t *env, int64_t t_max, etp__ep_ll_t **out)
{
    char fn[160];
    snprintf(fn, sizeof fn, "etp_ep_layer_create: EP layer '%s' of group '%s' (low_latency)",
             env->layer_name, env->name);
    const int64_t gmax = env->cfg->max_tokens_per_rank;
    if (!env->nvl)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "%s: low-latency layers need the nvlink transport; the group uses %s", fn,
                        env->cfg->transport == ETP_EP_TRANSPORT_EXACT ? "exact" : "capacity");
    if (env->mx)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "%s: low-latency layers move bf16 or f32 tokens (the group dispatches "
                        "MXFP8)",
                        fn);
    if (env->k > ETP__EP_LL_MAX_TOPK || env->R > ETP__EP_LL_MAX_RANKS)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "%s: top-k %d and %d ranks: low-latency layers take top-k up to %d and "
                        "up to %d ranks",
                        fn, env->k, env->R, ETP__EP_LL_MAX_TOPK, ETP__EP_LL_MAX_RANKS);
    const int64_t T = t_max ? t_max : gmax;
    ETP__CHECK_ARG(t_max >= 0 && T <= gmax && T <= ETP_EP_LL_MAX_TOKENS,
                   "%s: max_tokens_per_rank %lld: a low-latency layer takes 1 .. min(%d, the "
                   "group's max_tokens_per_rank %lld) tokens a rank (0: the group's)",
                   fn, (long long)t_max, ETP_EP_LL_MAX_TOKENS, (long long)gmax);

    etp__ep_ll_t *ll = calloc(1, sizeof *ll);
    if (!ll) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    ll->ctx = env->ctx;
    ll->be = env->be;
    ll->kt = env->kt;
    ll->comm = env->group->comms[env->cfg->role];
    ll->tmax = T;
    ll->rows = env->rows;
    ll->H = env->cfg->hidden;
    ll->R = env->R;
    ll->k = env->k;
    ll->t_host[0] = ll->t_host[1] = 0;
    const int R = env->R, k = env->k;
    const int64_t L = env->L, rows = env->rows, nrecv = (int64_t)R * T;
    const size_t es = etp_dtype_size(env->dt);
    /* both halves' arrays, then the device call counters: sized first,
     * placed (256-byte aligned) once the one allocation exists */
    enum { NPARTS = 16 };
    struct {
        void **p;
        size_t bytes;
    } parts[2 * NPARTS + 1];
    int np = 0;
    for (int h = 0; h < 2; h++) {
        ll_half_t *x = &ll->half[h];
#define PART(ptr, n)                   \
    do {                               \
        parts[np].p = (void **)(ptr);  \
        parts[np].bytes = (size_t)(n); \
        np++;                          \
    } while (0)
        PART(&x->t_dev, 4);
        PART(&x->slot_dest, T * k * 4);
        PART(&x->send_pos, T * R * 4);
        PART(&x->send_cnt, R * 4);
        PART(&x->send_base, R * 4);
        PART(&x->C, (int64_t)R * R * 4);
        PART(&x->recv_cnt, R * 4);
        PART(&x->recv_base, R * 4);
        PART(&x->counts, L * 4);
        PART(&x->offsets, (L + 1) * 4);
        PART(&x->scratch, ETP__EP_LAYOUT_SCRATCH(L, nrecv) * 4); /* the layout kernel's */
        PART(&x->recv_row, nrecv * k * 4);
        PART(&x->tok_rows, nrecv * k * 4);
        PART(&x->row_src, rows * 4);
        PART(&x->w, rows * 4);
        PART(&x->rows, (size_t)rows * (size_t)ll->H * es);
    }
    PART(&ll->dcalls, 8 * sizeof(uint64_t));
#undef PART
    size_t total = 0;
    for (int i = 0; i < np; i++) total += up256(parts[i].bytes);
    etp_status_t st = etp_mem_alloc(env->ctx, total, ETP_MEM_EP_BUFFERS, &ll->mem);
    if (st != ETP_SUCCESS) {
        free(ll);
        return st;
    }
    size_t place = 0;
    for (int i = 0; i < np; i++) {
        *parts[i].p = (char *)ll->mem + place;
        place += up256(parts[i].bytes);
    }
    /* zeroed: the rows of a half never dispatched are defined, the counters start at 0 */
    etp_stream_t *zs = NULL;
    st = etp_stream_create(env->ctx, ETP_STREAM_PRIORITY_NORMAL, &zs);
    if (st == ETP_SUCCESS) st = etp_memset_async(zs, ll->mem, 0, total);
    if (st == ETP_SUCCESS) st = etp_stream_synchronize(zs);
    if (zs) (void)etp_stream_destroy(zs);

    if (st == ETP_SUCCESS && env->fused) {
        /* the window: dispatch's flags and count rows, its metadata, weight
         * and token slabs; combine's flags and slabs (ep_args.h) */
        const size_t tok_row = ((size_t)ll->H * es + 15) / 16 * 16;
        const size_t part_row = ((size_t)ll->H * (env->wire == ETP__EP_BF16 ? 2 : 4) + 15) / 16 *
                                16;
        size_t off = 0;
        etp__ep_nvl_t *nv = &ll->nv;
        nv->sig_off = off;
        off = up256(off + 3 * (size_t)R * sizeof(uint64_t));
        ll->cnt_off = off;
        off = up256(off + 2 * (size_t)R * R * 4);
        nv->small_off = off;
        nv->small_row_bytes = (size_t)k * 4;
        off = up256(off + (size_t)nrecv * k * 4);
        ll->w_off = off;
        off = up256(off + (size_t)nrecv * k * 4);
        nv->tok_off = off;
        nv->tok_row_bytes = tok_row;
        off = up256(off + (size_t)nrecv * tok_row);
        /* two flag slabs and two partial slabs, alternating between
         * combines: no release to wait for, no barrier of all ranks
         * (ep_args.h: etp__ep_e2t_args_t) */
        etp__ep_nvl_t *e2 = &ll->e2t;
        ll->flag_off = off;
        off = up256(off + 2 * (size_t)R * ETP__EP_LL_MAX_BLOCKS * sizeof(uint32_t));
        e2->tok_off = off;
        e2->tok_row_bytes = part_row;
        ll->part_slab = (size_t)nrecv * part_row;
        off += 2 * ll->part_slab;
        char why[256] = "";
        /* its kernels do all of a call's work: half the device unless the
         * group says (ep.h: num_sms) */
        const int sms = env->cfg->num_sms > 0 ? env->cfg->num_sms : ETP__EP_NVL_HALF_SMS;
        st = env->kt->nvl_open(env->be, ll->comm, env->name, off, sms,
                               env->ctx->allocator.alloc == NULL, nv, &ll->win_local,
                               &ll->win_handle, why, sizeof why);
        if (st == ETP_ERR_UNSUPPORTED)
            st = etp__err(ETP_ERR_UNSUPPORTED, "%s: its window cannot be made: %s", fn, why);
        if (st == ETP_SUCCESS) {
            ll->win_bytes = off;
            etp__mem_account(env->ctx, ETP_MEM_EP_BUFFERS, off, 1);
            /* the combine's flags: a word a block (the group agrees on
             * blocks, so every rank refuses alike) */
            if (nv->blocks > ETP__EP_LL_MAX_BLOCKS)
                st = etp__err(ETP_ERR_UNSUPPORTED,
                              "%s: its kernels would run %d blocks (num_sms), more than the %d "
                              "a low-latency layer takes",
                              fn, nv->blocks, ETP__EP_LL_MAX_BLOCKS);
        }
        if (st == ETP_SUCCESS) {
            nv->t_max = T;
            nv->calls = ll->dcalls;
            const etp__ep_nvl_t base = *nv;
            e2->peers = base.peers;
            e2->fault = base.fault;
            e2->timeout_ns = base.timeout_ns;
            e2->t_max = T;
            e2->blocks = base.blocks;
            e2->wide_blocks = base.wide_blocks;
            e2->me = base.me;
            e2->ranks = base.ranks;
            e2->calls = ll->dcalls + 4;
        }
    }
    if (st != ETP_SUCCESS) {
        etp__ep_ll_destroy(ll);
        return st;
    }
    *out = ll;
    return ETP_SUCCESS;
}

void etp__ep_ll_destroy(etp__ep_ll_t *ll)
{
    if (!ll) return;
    if (ll->win_handle) {
        ll->kt->nvl_close(ll->be, ll->comm, ll->win_handle);
        etp__mem_account(ll->ctx, ETP_MEM_EP_BUFFERS, ll->win_bytes, 0);
    }
    if (ll->mem) (void)etp_mem_free(ll->ctx, ll->mem);
    free(ll);
}

void etp__ep_ll_layout(const etp__ep_ll_t *ll, const int32_t **counts, const int32_t **offsets)
{
    const ll_half_t *x = &ll->half[ll->dispatches > 0 ? (ll->dispatches - 1) % 2 : 0];
    if (counts) *counts = x->counts;
    if (offsets) *offsets = x->offsets;
}

/* ---- dispatch ------------------------------------------------------------ */

/* One all-to-all of slabs of T_ll rows of per_row elements (the host path). */
static etp_status_t slabs(const etp__ep_ll_env_t *env, const etp__ep_ll_t *ll, const void *send,
                          void *recv, int64_t per_row, etp_dtype_t dt, etp_stream_t *s)
{
    enum { MAXR = 64 };
    size_t c[4 * MAXR];
    size_t *sc = c, *sd = c + MAXR, *rc = c + 2 * MAXR, *rd = c + 3 * MAXR;
    for (int p = 0; p < ll->R; p++) {
        sc[p] = rc[p] = (size_t)(ll->tmax * per_row);
        sd[p] = rd[p] = (size_t)((int64_t)p * ll->tmax * per_row);
    }
    return etp_alltoallv(env->group, env->cfg->role, send, sc, sd, recv, rc, rd, dt, s);
}

static etp_status_t dispatch_host(const etp__ep_ll_env_t *env, etp__ep_ll_t *ll, ll_half_t *x,
                                  const etp_ep_ll_dispatch_args_t *a, int carry, etp_stream_t *s)
{
    const etp__ep_kernels_t *kt = env->kt;
    etp__be_t *be = env->be;
    const int R = env->R, k = env->k;
    etp__ep_route_args_t ra = {.topk_idx = a->topk_idx,
                               .t_in = a->num_tokens_dev,
                               .t_value = a->num_tokens,
                               .t_dev = x->t_dev,
                               .t_max = ll->tmax,
                               .num_experts = env->cfg->num_experts,
                               .local_experts = env->L,
                               .slab = ll->tmax,
                               .k = k,
                               .ranks = R,
                               .exact = 0,
                               .slab_report = 0,
                               .slot_dest = x->slot_dest,
                               .send_pos = x->send_pos,
                               .send_cnt = x->send_cnt,
                               .send_base = x->send_base,
                               .send_meta = env->send_small,
                               .stats = env->stats};
    ETP__TRY(kt->route(be, s->bs, &ra));
    ETP__TRY(
        etp_allgather(env->group, env->cfg->role, x->send_cnt, x->C, (size_t)R, ETP_DTYPE_I32, s));
    etp__ep_clip_args_t ca = {.C = x->C,
                              .t_dev = x->t_dev,
                              .slot_dest = x->slot_dest,
                              .t_max = ll->tmax,
                              .tok_cap = env->tok_cap,
                              .k = k,
                              .ranks = R,
                              .me = env->rank,
                              .send_pos = x->send_pos,
                              .stats = env->stats};
    ETP__TRY(kt->clip(be, s->bs, &ca));
    ETP__TRY(slabs(env, ll, env->send_small, env->recv_small, k, ETP_DTYPE_I32, s));
    etp__ep_layout_args_t la = {.C = x->C,
                                .recv_meta = env->recv_small,
                                .tok_cap = env->tok_cap,
                                .recv_rows = (int64_t)R * ll->tmax,
                                .slab = ll->tmax,
                                .rows_cap = env->rows,
                                .local_experts = env->L,
                                .alignment = env->align,
                                .fixed_slots = env->slots,
                                .k = k,
                                .ranks = R,
                                .me = env->rank,
                                .exact = 0,
                                .recv_cnt = x->recv_cnt,
                                .recv_base = x->recv_base,
                                .counts = x->counts,
                                .offsets = x->offsets,
                                .recv_row = x->recv_row,
                                .tok_rows = x->tok_rows,
                                .row_src = x->row_src,
                                .scratch = x->scratch,
                                .stats = env->stats,
                                /* the last op that counts (pack, exchange
                                 * and expand do not) */
                                .mirror = env->host_stats};
    ETP__TRY(kt->layout(be, s->bs, &la));
    etp__ep_pack_args_t pa = {.tokens = a->tokens,
                              .weights = carry ? a->topk_weights : NULL,
                              .t_dev = x->t_dev,
                              .slot_dest = x->slot_dest,
                              .send_pos = x->send_pos,
                              .send_base = x->send_base,
                              .t_max = ll->tmax,
                              .hidden = ll->H,
                              .k = k,
                              .ranks = R,
                              .dtype = (int)env->dt,
                              .send_tok = env->send_tok,
                              .send_w = carry ? env->send_small : NULL};
    ETP__TRY(kt->pack(be, s->bs, &pa));
    ETP__TRY(etp_batch_begin(env->ctx));
    etp_status_t st = slabs(env, ll, env->send_tok, env->recv_tok, ll->H, env->dt, s);
    if (st == ETP_SUCCESS && carry)
        st = slabs(env, ll, env->send_small, env->recv_small, k, ETP_DTYPE_F32, s);
    const etp_status_t st_end = etp_batch_end(env->ctx);
    ETP__TRY(st);
    ETP__TRY(st_end);
    etp__ep_expand_args_t xa = {.recv_tok = env->recv_tok,
                                .recv_w = carry ? env->recv_small : NULL,
                                .row_src = x->row_src,
                                .rows = env->rows,
                                .hidden = ll->H,
                                .k = k,
                                .dtype = (int)env->dt,
                                .out = x->rows,
                                .out_w = carry ? x->w : NULL};
    return kt->expand(be, s->bs, &xa);
}

static etp_status_t dispatch_fused(const etp__ep_ll_env_t *env, etp__ep_ll_t *ll, ll_half_t *x,
                                   const etp_ep_ll_dispatch_args_t *a, int carry, etp_stream_t *s)
{
    etp__ep_ll_args_t la = {.nvl = ll->nv,
                            .cnt_off = ll->cnt_off,
                            .w_off = ll->w_off,
                            .topk_idx = a->topk_idx,
                            .t_in = a->num_tokens_dev,
                            .t_value = a->num_tokens,
                            .tokens = a->tokens,
                            .weights = carry ? a->topk_weights : NULL,
                            .num_experts = env->cfg->num_experts,
                            .local_experts = env->L,
                            .tok_cap = env->tok_cap,
                            .hidden = ll->H,
                            .rows_cap = env->rows,
                            .alignment = env->align,
                            .fixed_slots = env->slots,
                            .k = env->k,
                            .dtype = (int)env->dt,
                            .carry = carry,
                            .t_dev = x->t_dev,
                            .slot_dest = x->slot_dest,
                            .send_pos = x->send_pos,
                            .send_cnt = x->send_cnt,
                            .send_base = x->send_base,
                            .recv_cnt = x->recv_cnt,
                            .recv_base = x->recv_base,
                            .counts = x->counts,
                            .offsets = x->offsets,
                            .recv_row = x->recv_row,
                            .tok_rows = x->tok_rows,
                            .row_src = x->row_src,
                            .out = x->rows,
                            .out_w = carry ? x->w : NULL,
                            .stats = env->stats,
                            .mirror = env->host_stats};
    return env->kt->ll_dispatch(env->be, s->bs, &la);
}

static etp_status_t ll_dispatch(etp_ep_layer_t *ly, const etp_ep_ll_dispatch_args_t *args,
                                etp_ep_ll_rows_t *view, etp_stream_t *s, const char *fn)
{
    etp_ep_ll_dispatch_args_t a = ETP_EP_LL_DISPATCH_ARGS_INIT;
    if (!args) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'args' is NULL", fn);
    ETP__TRY(etp__vs_in(&a, args, &etp__vs_ep_ll_dispatch_args, fn, "args"));
    if (view) ETP__TRY(etp__vs_check(view->size, &etp__vs_ep_ll_rows, fn, "rows"));
    etp__ep_ll_env_t env;
    etp__ep_ll_t *ll = NULL;
    ETP__TRY(etp__ep_ll_begin(ly, s, fn, &env, &ll));
    ETP__CHECK_ARG(a.idx_dtype == ETP_DTYPE_I64, "%s: topk_idx has dtype %s (expected i64)", fn,
                   etp_dtype_name(a.idx_dtype));
    ETP__CHECK_ARG(a.dtype == env.dt, "%s: tokens have dtype %s, EP group '%s' moves %s", fn,
                   etp_dtype_name(a.dtype), env.name, etp_dtype_name(env.dt));
    const int dev = a.num_tokens_dev != NULL;
    if (a.num_tokens == ETP_EP_TOKENS_ON_DEVICE && !dev)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: num_tokens is ETP_EP_TOKENS_ON_DEVICE but num_tokens_dev is NULL "
                        "(EP layer '%s')",
                        fn, env.layer_name);
    if (dev)
        ETP__CHECK_ARG(a.num_tokens == ETP_EP_TOKENS_ON_DEVICE,
                       "%s: num_tokens %lld with num_tokens_dev (pass ETP_EP_TOKENS_ON_DEVICE)", fn,
                       (long long)a.num_tokens);
    else
        ETP__CHECK_ARG(a.num_tokens >= 0 && a.num_tokens <= ll->tmax,
                       "%s: num_tokens %lld not in [0, max_tokens_per_rank %lld] of low-latency "
                       "EP layer '%s'",
                       fn, (long long)a.num_tokens, (long long)ll->tmax, env.layer_name);
    /* token-side arrays: NULL only when empty (T = 0 on the host) */
    const int empty = !dev && a.num_tokens == 0;
    ETP__CHECK_ARG(empty || a.topk_idx,
                   "%s: argument 'topk_idx' is NULL with %s tokens (EP layer '%s')", fn,
                   dev ? "a device count of" : "nonzero", env.layer_name);
    ETP__CHECK_ARG(empty || a.tokens,
                   "%s: argument 'tokens' is NULL with %s tokens (EP layer '%s')", fn,
                   dev ? "a device count of" : "nonzero", env.layer_name);
    if (env.weighted) {
        ETP__CHECK_ARG(empty || a.topk_weights,
                       "%s: argument 'topk_weights' is NULL, but EP layer '%s' is weighted and "
                       "this rank has %s tokens",
                       fn, env.layer_name, dev ? "a device count of" : "nonzero");
        ETP__CHECK_ARG(!a.topk_weights || a.weights_dtype == ETP_DTYPE_F32,
                       "%s: topk_weights has dtype %s (expected f32)", fn,
                       etp_dtype_name(a.weights_dtype));
    }
    if (ll->pending >= 2)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: low-latency EP layer '%s' has two dispatches awaiting their combine: "
                        "a third would overwrite the rows of dispatch %lld, which its combine "
                        "still reads (combine it first)",
                        fn, env.layer_name, (long long)(ll->dispatches - 2));
    const int h = (int)(ll->dispatches % 2);
    ll_half_t *x = &ll->half[h];
    const int carry = env.weighted;
    etp__ep_ll_trace(ly, ETP_TRACE_EP_DISPATCH_PACK, s);
    etp__ep_ll_trace(ly, ETP_TRACE_EP_DISPATCH_EXCHANGE, s);
    ETP__TRY(env.fused ? dispatch_fused(&env, ll, x, &a, carry, s)
                       : dispatch_host(&env, ll, x, &a, carry, s));
    etp__ep_ll_trace(ly, ETP_TRACE_EP_DISPATCH_EXPAND, s);
    etp__ep_ll_trace(ly, ETP_TRACE_EP_DISPATCH_END, s);
    ETP__TRY(etp_event_record(env.prep_ev, s));
    *env.prepared_once = 1;
    ll->t_host[h] = dev ? -1 : a.num_tokens;
    ll->dispatches++;
    ll->pending++;
    if (view) {
        etp_ep_ll_rows_t v = ETP_EP_LL_ROWS_INIT;
        v.tokens = x->rows;
        v.weights = carry ? x->w : NULL;
        v.counts = x->counts;
        v.offsets = x->offsets;
        v.rows = env.rows;
        v.half = h;
        etp__vs_put(view, &v);
    }
    return etp__ep_ll_end(ly, s);
}

etp_status_t etp_ep_ll_dispatch(etp_ep_layer_t *ly, const etp_ep_ll_dispatch_args_t *args,
                                etp_ep_ll_rows_t *rows, etp_stream_t *s)
{
    const char *fn = "etp_ep_ll_dispatch";
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? etp__ep_ll_group_of(ly) : NULL);
    return etp__refusal_guard_end(gd, ll_dispatch(ly, args, rows, s, fn), fn);
}

/* ---- combine ------------------------------------------------------------- */

static etp_status_t ll_combine(etp_ep_layer_t *ly, const void *expert_out, etp_dtype_t dtype,
                               int64_t rows, void *out, etp_stream_t *s, const char *fn)
{
    etp__ep_ll_env_t env;
    etp__ep_ll_t *ll = NULL;
    ETP__TRY(etp__ep_ll_begin(ly, s, fn, &env, &ll));
    ETP__CHECK_ARG(dtype == env.dt, "%s: expert_out has dtype %s, EP group '%s' moves %s", fn,
                   etp_dtype_name(dtype), env.name, etp_dtype_name(env.dt));
    ETP__CHECK_ARG(expert_out != NULL, "%s: argument 'expert_out' is NULL", fn);
    ETP__CHECK_ARG(rows >= env.rows,
                   "%s: expert_out holds %lld rows, EP layer '%s' needs %lld (etp_ep_layer_rows)",
                   fn, (long long)rows, env.layer_name, (long long)env.rows);
    if (ll->pending == 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: low-latency EP layer '%s' has no dispatch awaiting its combine", fn,
                        env.layer_name);
    const int h = (int)((ll->dispatches - ll->pending) % 2);
    const ll_half_t *x = &ll->half[h];
    if (!out && ll->t_host[h] != 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: argument 'out' is NULL; the dispatch it combines had %s tokens on "
                        "this rank (NULL only for 0; EP layer '%s')",
                        fn, ll->t_host[h] < 0 ? "a device count of" : "nonzero", env.layer_name);
    const float *row_w = env.weighted ? x->w : NULL;
    etp__ep_ll_trace(ly, ETP_TRACE_EP_COMBINE_PRESUM, s);
    etp__ep_ll_trace(ly, ETP_TRACE_EP_COMBINE_EXCHANGE, s);
    if (env.fused) {
        etp__ep_e2t_args_t ea = {.nvl = ll->e2t,
                                 .call = ETP__EP_NVL_LL_COMBINE,
                                 .tok_half = ll->part_slab,
                                 .flag_off = ll->flag_off,
                                 .in = expert_out,
                                 .row_w = row_w,
                                 .tok_rows = x->tok_rows,
                                 .recv_cnt = x->recv_cnt,
                                 .recv_row = x->recv_row,
                                 .hidden = ll->H,
                                 .k = env.k,
                                 .dtype = (int)env.dt,
                                 .wire = env.wire,
                                 .t_dev = x->t_dev,
                                 .slot_dest = x->slot_dest,
                                 .send_pos = x->send_pos,
                                 .send_base = x->send_base,
                                 .out = out};
        ETP__TRY(env.kt->nvl_e2t(env.be, s->bs, &ea, ETP__EP_NVL_PHASE_ALL));
    } else {
        etp__ep_presum_args_t pa = {.in = expert_out,
                                    .row_w = row_w,
                                    .tok_rows = x->tok_rows,
                                    .ntok = (int64_t)env.R * ll->tmax,
                                    .hidden = ll->H,
                                    .k = env.k,
                                    .dtype = (int)env.dt,
                                    .wire = env.wire,
                                    .partial = env.recv_tok};
        ETP__TRY(env.kt->presum(env.be, s->bs, &pa));
        ETP__TRY(slabs(&env, ll, env.recv_tok, env.send_tok, ll->H, env.cfg->combine_wire, s));
        etp__ep_reduce_args_t ra = {.partial = env.send_tok,
                                    .t_dev = x->t_dev,
                                    .send_pos = x->send_pos,
                                    .send_base = x->send_base,
                                    .t_max = ll->tmax,
                                    .hidden = ll->H,
                                    .ranks = env.R,
                                    .dtype = (int)env.dt,
                                    .wire = env.wire,
                                    .out = out};
        ETP__TRY(env.kt->reduce(env.be, s->bs, &ra));
    }
    etp__ep_ll_trace(ly, ETP_TRACE_EP_COMBINE_SUM, s);
    etp__ep_ll_trace(ly, ETP_TRACE_EP_COMBINE_END, s);
    ll->pending--;
    return etp__ep_ll_end(ly, s);
}

etp_status_t etp_ep_ll_combine(etp_ep_layer_t *ly, const void *expert_out, etp_dtype_t dtype,
                               int64_t rows, void *out, etp_stream_t *s)
{
    const char *fn = "etp_ep_ll_combine";
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? etp__ep_ll_group_of(ly) : NULL);
    return etp__refusal_guard_end(gd, ll_combine(ly, expert_out, dtype, rows, out, s, fn), fn);
}
