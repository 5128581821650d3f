/*
 * Expert parallelism: EP groups, per-layer handles, prepare / dispatch /
 * combine and their backward (etp/ep.h, docs/EP.md).
 *
 * Written once against the backend: the layout and data-movement steps are
 * kernels of the backend's ep table (host or CUDA, both applying the rules
 * of ep_rules.h), the exchanges are etp's own collectives (etp_allgather,
 * etp_alltoallv in a batch) on the EP group's role, all enqueued on the
 * caller's stream in order. So the host backend's shuffle mode sees every
 * dependency as stream order.
 *
 * Buffers: the group owns four transport buffers shared by its layers (each
 * call finishes with them before the next call starts, in stream order):
 * send_tok / recv_tok (token rows, 4 bytes per element so they also hold the
 * FP32 partials of combine) and send_small / recv_small (k int32 or FP32
 * per token row: routing metadata, weights, weight gradients). A layer owns
 * its routing state (one device allocation) and a pinned host mirror of its
 * counters plus, for EXACT, the host copy of the count matrix.
 *
 * NVLINK: the CAPACITY layout with a slab of max_tokens_per_rank rows per
 * source (so nothing is dropped for a slab) and EXACT's drops (the clip
 * after the counts' all-gather, on the device), so its results are
 * EXACT's. On a backend with peer stores (CUDA) each data call is one
 * kernel of the backend's nvl table on the group's window (ep_args.h
 * describes it), and the transport buffers hold only the prepare's routing
 * metadata and combine_bwd's weight gradients; elsewhere (the host
 * backend) the slabs travel by all-to-all as in CAPACITY.
 *
 * MXFP8 groups (ETP_EP_TOKEN_MXFP8) compute in BF16 (`dt`): only dispatch
 * differs, its pack kernel quantizing each token once into an MXFP8 wire
 * row (ETP__EP_MX_ROW_BYTES, exchanged as bytes) and its expand kernel
 * splitting received rows into the caller's data and scale matrices.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels_ep.h"
#include "comm/comm_internal.h"
#include "ep/ep_ll.h"
#include "ep/ep_rules.h"
#include "etp/ep.h"

enum { EP_NAME_MAX = 64 };

struct etp_ep_group {
    etp_group_t *group;
    etp_context_t *ctx;
    int graph_refs; /* live graphs that captured calls on its buffers (its destroy refuses) */
    etp__be_t *be;
    const etp__ep_kernels_t *kt;
    char name[EP_NAME_MAX];
    etp_ep_group_config_t cfg;
    etp_dtype_t dt;             /* the dtype of the data calls: BF16 for MXFP8 groups */
    int mx;                     /* MXFP8 dispatch */
    int rank, R;
    /* recv_rows: token rows of the receive buffer (EXACT tok_cap, else R
     * slabs); tok_cap: what a rank accepts (EXACT's and NVLINK's drops) */
    int64_t L, slab, tok_cap, send_rows, recv_rows;
    void *send_tok, *recv_tok, *send_small, *recv_small;
    size_t buf_bytes;
    int nvl;          /* NVLINK */
    int fused;        /* NVLINK through the backend's peer kernels */
    etp__ep_nvl_t nv; /* fused: the window, as the kernels see it */
    void *nvl_local;  /* fused: this rank's window */
    void *nvl_handle;
    size_t nvl_bytes;
    uint32_t *chunk_done; /* fused: the combine's chunk counters, after its stage in send_tok */
    int wire;         /* combine_wire as ETP__EP_F32 / ETP__EP_BF16 */
    /* the last call's stream and an event recorded at its end: a call on
     * another stream waits for it (the transport buffers are shared) */
    etp_event_t *last_ev;
    uint64_t last_stream; /* the id of the stream of the group's last call; 0: none */
    int layers, next_layer_id;
    /* the caller's trace callback (etp_ep_group_set_trace), or NULL; tracing
     * while it runs (the group's calls refuse to re-enter) */
    etp_trace_fn_t trace_fn;
    void *trace_user;
    int tracing;
};

enum { LAYER_EMPTY = 0, LAYER_PREPARED = 1 };

struct etp_ep_layer {
    etp_ep_group_t *ep;
    int graph_refs; /* live graphs that captured its calls (its destroy refuses) */
    char name[EP_NAME_MAX];
    int k;
    int weighted;
    etp_ep_layout_t layout;
    int64_t align, slots, rows; /* slots: S for FIXED_SLOTS, else 0 */
    void *state;                /* one device allocation, carved below */
    int32_t *t_dev, *slot_dest, *send_pos, *send_cnt, *send_base, *C, *recv_cnt, *recv_base;
    int32_t *counts, *offsets, *recv_row, *tok_rows, *row_src;
    int32_t *layout_scratch;    /* for the layout kernel (ETP__EP_LAYOUT_SCRATCH) */
    float *row_w;
    int64_t *stats;
    void *pinned;               /* host: stats mirror, then (EXACT) the count matrix */
    volatile int64_t *host_stats;
    int32_t *host_C;
    int64_t *rows_host;         /* EXACT, 4 x R: send rows, send offsets, recv rows, recv offsets */
    size_t *a2a;                /* 4 x R: the count arrays of one etp_alltoallv */
    int64_t ntok;               /* received token rows the expert-side kernels visit */
    int64_t t_host;             /* this rank's T of the last prepare; -1: on the device */
    int phase;
    int weights_kept;           /* the last dispatch carried weights (since prepare) */
    etp_event_t *prep_ev;       /* recorded at the end of each prepare */
    int prepared_once;
    etp__ep_ll_t *ll;           /* a low-latency layer's halves (ep_ll.c), else NULL */
};

/* ---- helpers ------------------------------------------------------------ */

/* The group's calls that enqueue work or change its objects are refused
 * inside its trace callback: they would run in the middle of the call that
 * reports the point, on its buffers. */
static etp_status_t not_tracing(const etp_ep_group_t *ep, const char *fn)
{
    if (ep->tracing)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: called from the trace callback of EP group '%s' (not allowed: the "
                        "traced call is still enqueuing its work)", fn, ep->name);
    return ETP_SUCCESS;
}

static etp_status_t check_stream(etp_ep_group_t *ep, etp_stream_t *s, const char *fn)
{
    ETP__TRY(not_tracing(ep, fn));
    if (!s) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'stream' is NULL", fn);
    if (s->ctx != ep->ctx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: the stream belongs to another context than EP group '%s'", fn,
                        ep->name);
    return etp__ctx_usable(ep->ctx, fn);
}

/* A captured call uses the layer's and the group's memory: the graph holds
 * both (their destroys refuse while it lives). */
static etp_status_t note_capture(etp_ep_layer_t *ly, etp_stream_t *s)
{
    ETP__TRY(etp__capture_note(ly->ep->ctx, &ly->graph_refs, s));
    return etp__capture_note(ly->ep->ctx, &ly->ep->graph_refs, s);
}

/* Order this call after the previous call of the group when it came on
 * another stream (shared transport buffers). */
static etp_status_t join(etp_ep_group_t *ep, etp_stream_t *s)
{
    if (ep->last_stream && ep->last_stream != s->id) ETP__TRY(etp_stream_wait_event(s, ep->last_ev));
    return ETP_SUCCESS;
}

static etp_status_t leave(etp_ep_group_t *ep, etp_stream_t *s)
{
    ETP__TRY(etp_event_record(ep->last_ev, s));
    ep->last_stream = s->id;
    return ETP_SUCCESS;
}

static void trace(etp_ep_group_t *ep, etp_trace_point_t point, etp_stream_t *s)
{
    if (!ep->trace_fn) return;
    ep->tracing = 1;
    ep->trace_fn(ep->trace_user, point, s);
    ep->tracing = 0;
}

etp_status_t etp_ep_group_set_trace(etp_ep_group_t *ep, etp_trace_fn_t fn, void *user)
{
    ETP__CHECK_NULL(ep, "etp_ep_group_set_trace");
    ETP__TRY(not_tracing(ep, "etp_ep_group_set_trace"));
    ep->trace_fn = fn;
    ep->trace_user = fn ? user : NULL;
    return ETP_SUCCESS;
}

static int token_dtype_ok(etp_dtype_t t)
{
    return t == ETP_DTYPE_BF16 || t == ETP_DTYPE_F32 || t == ETP_EP_TOKEN_MXFP8;
}

static const char *token_dtype_name(etp_dtype_t t)
{
    return t == ETP_EP_TOKEN_MXFP8 ? "mxfp8" : etp_dtype_name(t);
}

/* The data calls take the group's dtype: its token dtype, BF16 in an MXFP8
 * group (dispatch quantizes BF16 tokens; everything else stays BF16). */
static etp_status_t check_dtype(const etp_ep_group_t *ep, etp_dtype_t dt, const char *what,
                                const char *fn)
{
    if (dt == ep->dt) return ETP_SUCCESS;
    if (dt == ETP_EP_TOKEN_MXFP8 && ep->mx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s has dtype mxfp8: EP group '%s' quantizes to MXFP8 inside dispatch, "
                        "from bf16 tokens; combine, dispatch_bwd and combine_bwd stay bf16 (pass "
                        "ETP_DTYPE_BF16)", fn, what, ep->name);
    if (dt == ETP_EP_TOKEN_MXFP8)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s has dtype mxfp8, EP group '%s' moves %s (MXFP8 dispatch needs a "
                        "group made with token_dtype ETP_EP_TOKEN_MXFP8)", fn, what, ep->name,
                        etp_dtype_name(ep->dt));
    return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: %s has dtype %s, EP group '%s' moves %s%s", fn,
                    what, etp_dtype_name(dt), ep->name, etp_dtype_name(ep->dt),
                    ep->mx ? " (its dispatch quantizes bf16 tokens to MXFP8)" : "");
}

/* ---- the report ------------------------------------------------------- */

static void read_report(const etp_ep_layer_t *ly, etp_ep_report_t *r)
{
    const volatile int64_t *h = ly->host_stats;
    r->flags = (uint32_t)h[ETP__EP_ST_FLAGS];
    r->bad_index_slots = h[ETP__EP_ST_BAD_INDEX];
    r->duplicate_slots = h[ETP__EP_ST_DUPLICATE];
    r->transport_dropped_slots = h[ETP__EP_ST_TRANSPORT_DROPPED];
    r->rows_dropped_slots = h[ETP__EP_ST_ROWS_DROPPED];
    r->transport_rows_needed = h[ETP__EP_ST_TRANSPORT_NEEDED];
    r->rows_needed = h[ETP__EP_ST_ROWS_NEEDED];
    r->prepares = h[ETP__EP_ST_PREPARES];
}

/* Under the error policy, a raised flag as an error status naming the
 * rank, the layer and the capacity needed. */
static etp_status_t report_status(const etp_ep_layer_t *ly, const etp_ep_report_t *r,
                                  const char *fn)
{
    const etp_ep_group_t *ep = ly->ep;
    if (ep->cfg.overflow != ETP_EP_OVERFLOW_ERROR || r->flags == 0) return ETP_SUCCESS;
    char who[200];
    snprintf(who, sizeof who, "%s: EP layer '%s' of group '%s', rank %d of %d", fn, ly->name,
             ep->name, ep->rank, ep->R);
    if (r->flags & (ETP_EP_FLAG_BAD_INDEX | ETP_EP_FLAG_DUPLICATE))
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %lld topk_idx slots out of range [-1, %lld) and %lld repeated "
                        "experts in a row (dropped)", who, (long long)r->bad_index_slots,
                        (long long)ep->cfg.num_experts, (long long)r->duplicate_slots);
    if (r->flags & ETP_EP_FLAG_BAD_TOKENS)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: the device token count was outside [0, %lld] (clamped)", who,
                        (long long)ep->cfg.max_tokens_per_rank);
    if (r->flags & ETP_EP_FLAG_TRANSPORT_FULL) {
        if (ep->cfg.transport == ETP_EP_TRANSPORT_CAPACITY)
            return etp__err(ETP_ERR_CAPACITY,
                            "%s: transport slab full: a peer needed %lld token rows, slab_rows is "
                            "%lld (capacity_factor %g); %lld slots dropped", who,
                            (long long)r->transport_rows_needed, (long long)ep->slab,
                            ep->cfg.capacity_factor, (long long)r->transport_dropped_slots);
        return etp__err(ETP_ERR_CAPACITY,
                        "%s: receive capacity exceeded: a rank's receive buffer needed %lld token "
                        "rows, it holds %lld (recv_capacity_per_rank); %lld slots dropped", who,
                        (long long)r->transport_rows_needed, (long long)ep->tok_cap,
                        (long long)r->transport_dropped_slots);
    }
    if (ly->layout == ETP_EP_LAYOUT_FIXED_SLOTS)
        return etp__err(ETP_ERR_CAPACITY,
                        "%s: receive capacity exceeded: an expert needed %lld slots, the layer has "
                        "%lld per expert; %lld slots dropped", who, (long long)r->rows_needed,
                        (long long)ly->slots, (long long)r->rows_dropped_slots);
    return etp__err(ETP_ERR_CAPACITY,
                    "%s: receive capacity exceeded: the layout needed %lld rows, "
                    "recv_capacity_per_rank is %lld; %lld slots dropped", who,
                    (long long)r->rows_needed, (long long)ly->rows,
                    (long long)r->rows_dropped_slots);
}

/* The data calls do not fail on a raised flag: a flag is raised on some
 * ranks only, and a rank that refused a collective call would leave the
 * others waiting. Flags become errors in poll and check. */
static etp_status_t entry(etp_ep_layer_t *ly, etp_stream_t *s, const char *fn)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'layer' is NULL", fn);
    if (ly->ll)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: EP layer '%s' is a low-latency layer: it dispatches and combines "
                        "with etp_ep_ll_dispatch and etp_ep_ll_combine (no prepare), forward "
                        "only (no backward)", fn, ly->name);
    ETP__TRY(check_stream(ly->ep, s, fn));
    ETP__TRY(etp__ctx_no_batch(ly->ep->ctx, fn));
    return note_capture(ly, s);
}

/* ---- exchanges ---------------------------------------------------------- */

/* One all-to-all-v of per_row elements per token row. fwd: token side to
 * expert side (send_base blocks -> receive blocks); else the mirror. */
static etp_status_t exchange(etp_ep_layer_t *ly, int fwd, const void *send, void *recv,
                             int64_t per_row, etp_dtype_t dt, etp_stream_t *s)
{
    etp_ep_group_t *ep = ly->ep;
    const int R = ep->R;
    size_t *sc = ly->a2a, *sd = sc + R, *rc = sd + R, *rd = rc + R;
    for (int p = 0; p < R; p++) {
        int64_t srows, soff, rrows, roff;
        if (ep->cfg.transport != ETP_EP_TRANSPORT_EXACT) { /* CAPACITY, NVLINK's slabs */
            srows = rrows = ep->slab;
            soff = roff = (int64_t)p * ep->slab;
        } else {
            const int64_t *h = ly->rows_host;
            /* rows_host: [0,R) send rows, [R,2R) send offsets, [2R,3R) recv rows, [3R,4R) recv offsets */
            int a = fwd ? 0 : 2, b = fwd ? 2 : 0;
            srows = h[a * R + p];
            soff = h[(a + 1) * R + p];
            rrows = h[b * R + p];
            roff = h[(b + 1) * R + p];
        }
        sc[p] = (size_t)(srows * per_row);
        sd[p] = (size_t)(soff * per_row);
        rc[p] = (size_t)(rrows * per_row);
        rd[p] = (size_t)(roff * per_row);
    }
    return etp_alltoallv(ep->group, ep->cfg.role, send, sc, sd, recv, rc, rd, dt, s);
}

/* ---- groups ------------------------------------------------------------- */

static void group_free(etp_ep_group_t *ep)
{
    void *bufs[4] = {ep->send_tok, ep->recv_tok, ep->send_small, ep->recv_small};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) (void)etp_mem_free(ep->ctx, bufs[i]);
    if (ep->nvl_handle) {
        ep->kt->nvl_close(ep->be, ep->group->comms[ep->cfg.role], ep->nvl_handle);
        etp__mem_account(ep->ctx, ETP_MEM_EP_BUFFERS, ep->nvl_bytes, 0);
    }
    if (ep->last_ev) (void)etp_event_destroy(ep->last_ev);
    free(ep);
}

static etp_status_t alloc_zeroed(etp_context_t *ctx, size_t bytes, void **p)
{
    ETP__TRY(etp_mem_alloc(ctx, bytes, ETP_MEM_EP_BUFFERS, p));
    /* Slabs travel whole in CAPACITY mode: their unused rows are defined. */
    etp_stream_t *s = NULL;
    etp_status_t st = etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s);
    if (st == ETP_SUCCESS) st = etp_memset_async(s, *p, 0, bytes);
    if (st == ETP_SUCCESS) st = etp_stream_synchronize(s);
    if (s) (void)etp_stream_destroy(s);
    return st;
}

etp_status_t etp_ep_group_create(etp_group_t *group, const etp_ep_group_config_t *config,
                                 etp_ep_group_t **out)
{
    const char *fn = "etp_ep_group_create";
    ETP__CHECK_NULL(group, fn);
    ETP__CHECK_NULL(config, fn);
    if (!out) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'ep' is NULL", fn);
    etp_ep_group_config_t c = ETP_EP_GROUP_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&c, config, &etp__vs_ep_group_config, fn, "config"));
    /* the config's messages name the EP group */
    char who[112];
    snprintf(who, sizeof who, "etp_ep_group_create: EP group '%.63s'", c.name ? c.name : group->name);
    fn = who;
    const int R = group->size;
    ETP__CHECK_ARG(c.role >= 0 && c.role < group->num_roles,
                   "%s: role %d not in [0, %d) of group '%s'", fn, c.role, group->num_roles,
                   group->name);
    ETP__CHECK_ARG(token_dtype_ok(c.token_dtype),
                   "%s: token_dtype %s (expected bf16, f32 or ETP_EP_TOKEN_MXFP8)", fn,
                   etp_dtype_name(c.token_dtype));
    ETP__CHECK_ARG(c.num_experts > 0, "%s: num_experts %lld (expected > 0)", fn,
                   (long long)c.num_experts);
    ETP__CHECK_ARG(c.num_experts % R == 0,
                   "%s: num_experts %lld is not a multiple of the group size %d of group '%s'",
                   fn, (long long)c.num_experts, R, group->name);
    ETP__CHECK_ARG(c.hidden > 0, "%s: hidden %lld (expected > 0)", fn, (long long)c.hidden);
    ETP__CHECK_ARG(c.token_dtype != ETP_EP_TOKEN_MXFP8 || c.hidden % ETP_EP_MXFP8_BLOCK == 0,
                   "%s: hidden %lld is not a multiple of %d: MXFP8 tokens have one E8M0 scale per "
                   "%d elements of a row", fn, (long long)c.hidden, ETP_EP_MXFP8_BLOCK,
                   ETP_EP_MXFP8_BLOCK);
    ETP__CHECK_ARG(c.max_tokens_per_rank > 0, "%s: max_tokens_per_rank %lld (expected > 0)", fn,
                   (long long)c.max_tokens_per_rank);
    ETP__CHECK_ARG(c.max_topk >= 1 && c.max_topk <= c.num_experts,
                   "%s: max_topk %d not in [1, num_experts %lld]", fn, c.max_topk,
                   (long long)c.num_experts);
    ETP__CHECK_ARG(c.recv_capacity_per_rank > 0, "%s: recv_capacity_per_rank %lld (expected > 0)",
                   fn, (long long)c.recv_capacity_per_rank);
    ETP__CHECK_ARG(c.overflow == ETP_EP_OVERFLOW_DROP || c.overflow == ETP_EP_OVERFLOW_ERROR,
                   "%s: overflow %d is not an etp_ep_overflow_t", fn, (int)c.overflow);
    ETP__CHECK_ARG(c.transport >= ETP_EP_TRANSPORT_EXACT && c.transport <= ETP_EP_TRANSPORT_AUTO,
                   "%s: transport %d is not an etp_ep_transport_t", fn, (int)c.transport);
    ETP__CHECK_ARG(c.combine_wire == ETP_DTYPE_F32 || c.combine_wire == ETP_DTYPE_BF16,
                   "%s: combine_wire %s (expected f32 or bf16)", fn,
                   etp_dtype_name(c.combine_wire));
    ETP__CHECK_ARG(c.combine_wire == ETP_DTYPE_F32 || c.token_dtype != ETP_DTYPE_F32,
                   "%s: combine_wire bf16 with f32 tokens (an f32 group sends f32 partials)", fn);
    ETP__CHECK_ARG(c.num_sms >= 0, "%s: num_sms %d (expected >= 0; 0: the default)", fn,
                   c.num_sms);
    /* an explicit transport wins over the environment's, which wins over AUTO */
    const etp_ep_transport_t asked = c.transport;
    const int explicit_tr = c.transport != ETP_EP_TRANSPORT_AUTO ||
                            group->ctx->env.ep_transport != ETP_EP_TRANSPORT_AUTO;
    if (c.transport == ETP_EP_TRANSPORT_AUTO)
        c.transport = (etp_ep_transport_t)group->ctx->env.ep_transport;
    if (c.transport == ETP_EP_TRANSPORT_AUTO) c.transport = ETP_EP_TRANSPORT_NVLINK;
    ETP__CHECK_ARG(c.transport != ETP_EP_TRANSPORT_CAPACITY ||
                       (c.capacity_factor > 0 && isfinite(c.capacity_factor)),
                   "%s: capacity_factor %g (expected > 0)", fn, c.capacity_factor);
    ETP__CHECK_ARG(c.name == NULL || strlen(c.name) < EP_NAME_MAX,
                   "%s: name longer than %d characters", fn, EP_NAME_MAX - 1);
    ETP__TRY(etp__ctx_usable(group->ctx, fn));

    /* Positions and row indices are int32 on the device; each factor is
     * bounded first, so that the products below cannot overflow (and the
     * buffers' bytes, rows < 2^31 x hidden < 2^31 x 4, fit in size_t). */
    const int64_t lim = INT32_MAX;
    ETP__CHECK_ARG(c.max_tokens_per_rank < lim && c.hidden < lim,
                   "%s: max_tokens_per_rank %lld and hidden %lld must be below 2^31", fn,
                   (long long)c.max_tokens_per_rank, (long long)c.hidden);
    /* expert ids are int32 on the device */
    ETP__CHECK_ARG(c.num_experts < lim, "%s: num_experts %lld must be below 2^31", fn,
                   (long long)c.num_experts);
    const int64_t L = c.num_experts / R, T = c.max_tokens_per_rank, K = c.max_topk;
    ETP__CHECK_ARG(T * R < lim && T * K < lim && T * R * K < lim && (int64_t)R * R < lim &&
                       c.recv_capacity_per_rank < lim,
                   "%s: sizes too large for 32-bit row indices (max_tokens_per_rank %lld, ranks %d, "
                   "max_topk %lld)", fn, (long long)T, R, (long long)K);

    etp_ep_group_t *ep = calloc(1, sizeof *ep);
    if (!ep) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    ep->group = group;
    ep->ctx = group->ctx;
    ep->be = group->ctx->be;
    ep->kt = ep->be->ops->kernels->ep;
    ep->mx = c.token_dtype == ETP_EP_TOKEN_MXFP8;
    ep->dt = ep->mx ? ETP_DTYPE_BF16 : c.token_dtype;
    ep->wire = c.combine_wire == ETP_DTYPE_BF16 ? ETP__EP_BF16 : ETP__EP_F32;
    snprintf(ep->name, sizeof ep->name, "%s", c.name ? c.name : group->name);
    c.name = ep->name;
    ep->rank = group->rank;
    ep->R = R;
    ep->L = L;
    const size_t H = (size_t)c.hidden;
    etp_status_t st = ETP_SUCCESS;
    if (c.transport == ETP_EP_TRANSPORT_NVLINK && ep->kt->nvl_open) {
        /* the window: flags, the small slabs, the token slabs (ep_args.h) */
        /* a token slab row holds dispatch's rows and combine's partials */
        const size_t disp_row =
            ep->mx ? (size_t)ETP__EP_MX_ROW_BYTES(c.hidden) : H * etp_dtype_size(ep->dt);
        const size_t part_row = H * etp_dtype_size(c.combine_wire);
        const size_t tok_row = disp_row > part_row ? disp_row : part_row;
        etp__ep_nvl_t *nv = &ep->nv;
        nv->sig_off = 0;
        nv->small_row_bytes = (size_t)K * 4;
        nv->tok_row_bytes = (tok_row + 15) / 16 * 16;
        nv->cnt_off = (size_t)2 * R * sizeof(uint64_t);
        nv->small_off = (nv->cnt_off + (size_t)R * R * sizeof(int32_t) + 255) / 256 * 256;
        nv->tok_off = (nv->small_off + (size_t)R * T * nv->small_row_bytes + 255) / 256 * 256;
        nv->t_max = T;
        const size_t bytes = nv->tok_off + (size_t)R * T * nv->tok_row_bytes;
        char why[256] = "";
        st = ep->kt->nvl_open(ep->be, group->comms[c.role], ep->name, bytes, c.num_sms,
                              group->ctx->allocator.alloc == NULL, nv, &ep->nvl_local,
                              &ep->nvl_handle, why, sizeof why);
        if (st == ETP_SUCCESS) {
            ep->fused = 1;
            ep->nvl_bytes = bytes;
            etp__mem_account(ep->ctx, ETP_MEM_EP_BUFFERS, bytes, 1);
        } else if (st == ETP_ERR_UNSUPPORTED && !explicit_tr) {
            ETP__LOG(&ep->ctx->log, ETP_LOG_INFO, ETP_SUBSYS_EP,
                     "EP group '%s': the nvlink transport cannot run here (%s): exact instead",
                     ep->name, why);
            c.transport = ETP_EP_TRANSPORT_EXACT;
            st = ETP_SUCCESS;
        } else if (st == ETP_ERR_UNSUPPORTED) {
            st = etp__err(ETP_ERR_UNSUPPORTED,
                          "%s: the nvlink transport (%s) cannot run here: %s", fn,
                          asked == ETP_EP_TRANSPORT_NVLINK ? "asked for in the config"
                                                                       : "ETP_EP_TRANSPORT=nvlink",
                          why);
        }
        if (st != ETP_SUCCESS) {
            free(ep);
            return st;
        }
    }
    ep->cfg = c;
    ep->nvl = c.transport == ETP_EP_TRANSPORT_NVLINK;
    int64_t slab = 0, tok_cap, send_rows, recv_rows;
    if (c.transport == ETP_EP_TRANSPORT_CAPACITY) {
        /* p: a token's K distinct experts, uniform, hit at least one of L */
        double miss = 1.0;
        for (int64_t i = 0; i < K; i++)
            miss *= c.num_experts - L - i <= 0 ? 0.0
                                               : (double)(c.num_experts - L - i) / (double)(c.num_experts - i);
        double want = ceil(c.capacity_factor * (double)T * (1.0 - miss));
        slab = want >= (double)T ? T : want < 1.0 ? 1 : (int64_t)want;
        tok_cap = recv_rows = send_rows = (int64_t)R * slab;
    } else {
        tok_cap = c.recv_capacity_per_rank < (int64_t)R * T ? c.recv_capacity_per_rank : (int64_t)R * T;
        if (ep->nvl) {
            slab = T;
            recv_rows = send_rows = (int64_t)R * T;
        } else {
            recv_rows = tok_cap;
            send_rows = T * (K < R ? K : R);
        }
    }
    ep->slab = slab;
    ep->tok_cap = tok_cap;
    ep->send_rows = send_rows;
    ep->recv_rows = recv_rows;
    /* the fused kernels need only the received metadata rows and
     * combine_bwd's weight gradients (recv_small), and the stage of the
     * partials they send (send_tok: a partial per received token row) */
    const size_t stage_bytes = ((size_t)recv_rows * H * etp_dtype_size(c.combine_wire) + 255) / 256 * 256;
    const size_t send_bytes =
        ep->fused ? stage_bytes + (size_t)ETP__EP_NVL_CHUNK_WORDS(recv_rows) * sizeof(uint32_t)
                  : (size_t)send_rows * H * 4;
    size_t sizes[4] = {send_bytes, ep->fused ? 0 : (size_t)recv_rows * H * 4,
                       ep->fused ? 0 : (size_t)send_rows * (size_t)K * 4,
                       (size_t)recv_rows * (size_t)K * 4};
    void **bufs[4] = {&ep->send_tok, &ep->recv_tok, &ep->send_small, &ep->recv_small};
    for (int i = 0; i < 4 && st == ETP_SUCCESS; i++) {
        if (sizes[i] == 0) continue;
        st = alloc_zeroed(ep->ctx, sizes[i], bufs[i]);
        ep->buf_bytes += sizes[i];
    }
    ep->buf_bytes += ep->nvl_bytes;
    if (st == ETP_SUCCESS && ep->fused) ep->chunk_done = (uint32_t *)((char *)ep->send_tok + stage_bytes);
    if (st == ETP_SUCCESS) st = etp_event_create(ep->ctx, &ep->last_ev);
    if (st != ETP_SUCCESS) {
        group_free(ep);
        return st;
    }
    static const char *const tr_names[] = {"exact", "capacity", "nvlink", "auto"};
    ETP__LOG(&ep->ctx->log, ETP_LOG_INFO, ETP_SUBSYS_EP,
             "EP group '%s': %d ranks, %lld experts (%lld local), H %lld %s, %s transport%s "
             "(slab %lld rows), receive %lld token rows (accepts %lld), combine wire %s, %zu "
             "buffer bytes", ep->name, R, (long long)c.num_experts, (long long)L,
             (long long)c.hidden, token_dtype_name(c.token_dtype), tr_names[c.transport],
             ep->fused ? " (peer stores)" : "", (long long)slab, (long long)recv_rows,
             (long long)tok_cap, etp_dtype_name(c.combine_wire), ep->buf_bytes);
    ep->group->users++;
    *out = ep;
    return ETP_SUCCESS;
}

etp_status_t etp_ep_group_destroy(etp_ep_group_t *ep)
{
    if (!ep) return ETP_SUCCESS;
    ETP__TRY(not_tracing(ep, "etp_ep_group_destroy"));
    ETP__TRY(etp__ctx_no_capture(ep->ctx, "etp_ep_group_destroy"));
    if (ep->layers > 0)
        return etp__err(ETP_ERR_BUSY, "etp_ep_group_destroy: EP group '%s' still has %d layer(s)",
                        ep->name, ep->layers);
    if (ep->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY,
                        "etp_ep_group_destroy: EP group '%s' is used by %d graph(s); destroy them first",
                        ep->name, ep->graph_refs);
    ep->group->users--;
    group_free(ep);
    return ETP_SUCCESS;
}

etp_status_t etp_ep_group_info(const etp_ep_group_t *ep, etp_ep_group_info_t *info)
{
    ETP__CHECK_NULL(ep, "etp_ep_group_info");
    ETP__CHECK_NULL(info, "etp_ep_group_info");
    etp_ep_group_info_t i = ETP_EP_GROUP_INFO_INIT;
    i.rank = ep->rank;
    i.ranks = ep->R;
    i.local_experts = ep->L;
    i.first_expert = (int64_t)ep->rank * ep->L;
    i.slab_rows = ep->slab;
    i.recv_token_rows = ep->recv_rows;
    i.send_token_rows = ep->send_rows;
    i.buffer_bytes = ep->buf_bytes;
    i.wire_row_bytes = ep->mx ? (size_t)ETP__EP_MX_ROW_BYTES(ep->cfg.hidden)
                              : (size_t)ep->cfg.hidden * etp_dtype_size(ep->dt);
    i.transport = ep->cfg.transport;
    i.combine_wire = ep->cfg.combine_wire;
    i.num_sms = ep->fused ? ep->nv.blocks : 0;
    return etp__vs_out(info, &i, &etp__vs_ep_group_info, "etp_ep_group_info", "info");
}

/* ---- layers ------------------------------------------------------------- */

static void layer_free(etp_ep_layer_t *ly)
{
    etp_ep_group_t *ep = ly->ep;
    etp__ep_ll_destroy(ly->ll);
    if (ly->state) (void)etp_mem_free(ep->ctx, ly->state);
    if (ly->pinned) {
        /* the device may still copy into it: wait like a free does */
        if (!ep->be->failed) (void)ep->be->ops->device_sync(ep->be);
        ep->kt->pinned_free(ep->be, ly->pinned);
    }
    if (ly->prep_ev) (void)etp_event_destroy(ly->prep_ev);
    free(ly->rows_host);
    free(ly->a2a);
    free(ly);
}

/* The view of a layer and its group that the low-latency code works with. */
static void ll_env(etp_ep_layer_t *ly, etp__ep_ll_env_t *e)
{
    etp_ep_group_t *ep = ly->ep;
    memset(e, 0, sizeof *e);
    e->ep = ep;
    e->ly = ly;
    e->ctx = ep->ctx;
    e->group = ep->group;
    e->be = ep->be;
    e->kt = ep->kt;
    e->cfg = &ep->cfg;
    e->name = ep->name;
    e->layer_name = ly->name;
    e->R = ep->R;
    e->rank = ep->rank;
    e->nvl = ep->nvl;
    e->fused = ep->fused;
    e->mx = ep->mx;
    e->dt = ep->dt;
    e->wire = ep->wire;
    e->L = ep->L;
    e->tok_cap = ep->tok_cap;
    e->send_tok = ep->send_tok;
    e->recv_tok = ep->recv_tok;
    e->send_small = ep->send_small;
    e->recv_small = ep->recv_small;
    e->k = ly->k;
    e->weighted = ly->weighted;
    e->align = ly->align;
    e->slots = ly->slots;
    e->rows = ly->rows;
    e->stats = ly->stats;
    e->host_stats = ly->host_stats;
    e->prep_ev = ly->prep_ev;
    e->prepared_once = &ly->prepared_once;
}

etp_status_t etp_ep_layer_create(etp_ep_group_t *ep, const etp_ep_layer_config_t *config,
                                 etp_ep_layer_t **out)
{
    const char *fn = "etp_ep_layer_create";
    ETP__CHECK_NULL(ep, fn);
    ETP__CHECK_NULL(config, fn);
    if (!out) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'layer' is NULL", fn);
    etp_ep_layer_config_t c = ETP_EP_LAYER_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&c, config, &etp__vs_ep_layer_config, fn, "config"));
    ETP__TRY(not_tracing(ep, fn));
    /* the config's messages name the layer (as it would be named) */
    char who[112], auto_name[24];
    snprintf(auto_name, sizeof auto_name, "layer%d", ep->next_layer_id);
    snprintf(who, sizeof who, "etp_ep_layer_create: EP layer '%.63s'", c.name ? c.name : auto_name);
    fn = who;
    ETP__CHECK_ARG(c.topk >= 1 && c.topk <= ep->cfg.max_topk,
                   "%s: topk %d not in [1, max_topk %d] of EP group '%s'", fn, c.topk,
                   ep->cfg.max_topk, ep->name);
    ETP__CHECK_ARG(c.alignment >= 0, "%s: alignment %d (expected >= 0)", fn, c.alignment);
    ETP__CHECK_ARG(c.layout == ETP_EP_LAYOUT_PACKED || c.layout == ETP_EP_LAYOUT_FIXED_SLOTS,
                   "%s: layout %d is not an etp_ep_layout_t", fn, (int)c.layout);
    ETP__CHECK_ARG(c.weighted == 0 || c.weighted == 1, "%s: weighted %d (expected 0 or 1)", fn,
                   c.weighted);
    ETP__CHECK_ARG(c.name == NULL || strlen(c.name) < EP_NAME_MAX,
                   "%s: name longer than %d characters", fn, EP_NAME_MAX - 1);
    ETP__CHECK_ARG(c.low_latency == 0 || c.low_latency == 1,
                   "%s: low_latency %d (expected 0 or 1)", fn, c.low_latency);
    ETP__CHECK_ARG(c.low_latency || c.max_tokens_per_rank == 0,
                   "%s: max_tokens_per_rank %lld is for low-latency layers (others: 0)", fn,
                   (long long)c.max_tokens_per_rank);
    const int64_t align = c.alignment > 1 ? c.alignment : 1, cap = ep->cfg.recv_capacity_per_rank;
    const int64_t L = ep->L;
    int64_t slots = 0, rows = cap;
    if (c.layout == ETP_EP_LAYOUT_PACKED) {
        ETP__CHECK_ARG(c.slots_per_expert == 0,
                       "%s: slots_per_expert %lld is for FIXED_SLOTS layers (PACKED: 0)", fn,
                       (long long)c.slots_per_expert);
        ETP__CHECK_ARG(cap % align == 0,
                       "%s: alignment %d does not divide recv_capacity_per_rank %lld", fn,
                       c.alignment, (long long)cap);
    } else {
        slots = c.slots_per_expert ? c.slots_per_expert : cap / L / align * align;
        ETP__CHECK_ARG(slots > 0 && slots % align == 0 && slots <= cap / L,
                       "%s: slots_per_expert %lld: need a positive multiple of the alignment %lld "
                       "with %lld local experts x slots <= recv_capacity_per_rank %lld", fn,
                       (long long)slots, (long long)align, (long long)L, (long long)cap);
        rows = slots * L;
    }
    ETP__TRY(etp__ctx_usable(ep->ctx, fn));

    etp_ep_layer_t *ly = calloc(1, sizeof *ly);
    if (!ly) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    ly->ep = ep;
    ly->k = c.topk;
    ly->weighted = c.weighted;
    ly->layout = c.layout;
    ly->align = align;
    ly->slots = slots;
    ly->rows = rows;
    int id = ep->next_layer_id++;
    if (c.name)
        snprintf(ly->name, sizeof ly->name, "%s", c.name);
    else
        snprintf(ly->name, sizeof ly->name, "layer%d", id);

    const int R = ep->R, k = c.topk;
    const int64_t T = ep->cfg.max_tokens_per_rank, tc = ep->recv_rows;
    /* int32 arrays first (counts in elements), then FP32, then int64 stats,
     * each array starting on a 256-byte boundary */
    struct {
        void **p;
        int64_t n;
        size_t es;
    } parts[] = {
        {(void **)&ly->t_dev, 1, 4},          {(void **)&ly->slot_dest, T * k, 4},
        {(void **)&ly->send_pos, T * R, 4},   {(void **)&ly->send_cnt, R, 4},
        {(void **)&ly->send_base, R, 4},      {(void **)&ly->C, (int64_t)R * R, 4},
        {(void **)&ly->recv_cnt, R, 4},       {(void **)&ly->recv_base, R, 4},
        {(void **)&ly->counts, L, 4},         {(void **)&ly->offsets, L + 1, 4},
        {(void **)&ly->layout_scratch, ETP__EP_LAYOUT_SCRATCH(L, ep->recv_rows), 4},
        {(void **)&ly->recv_row, tc * k, 4},  {(void **)&ly->tok_rows, tc * k, 4},
        {(void **)&ly->row_src, rows, 4},     {(void **)&ly->row_w, rows, 4},
        {(void **)&ly->stats, ETP__EP_ST_COUNT, 8},
    };
    const size_t nparts = sizeof parts / sizeof parts[0];
    size_t total = 0;
    for (size_t i = 0; i < nparts; i++) total += ((size_t)parts[i].n * parts[i].es + 255) / 256 * 256;
    etp_status_t st = alloc_zeroed(ep->ctx, total, &ly->state);
    if (st == ETP_SUCCESS) {
        size_t off = 0;
        for (size_t i = 0; i < nparts; i++) {
            *parts[i].p = (char *)ly->state + off;
            off += ((size_t)parts[i].n * parts[i].es + 255) / 256 * 256;
        }
        size_t pbytes = ETP__EP_ST_COUNT * sizeof(int64_t) + (size_t)R * R * sizeof(int32_t);
        st = ep->kt->pinned_alloc(ep->be, pbytes, &ly->pinned);
    }
    if (st == ETP_SUCCESS) {
        memset(ly->pinned, 0, ETP__EP_ST_COUNT * sizeof(int64_t) + (size_t)R * R * sizeof(int32_t));
        ly->host_stats = (volatile int64_t *)ly->pinned;
        ly->host_C = (int32_t *)((char *)ly->pinned + ETP__EP_ST_COUNT * sizeof(int64_t));
        ly->rows_host = calloc(4 * (size_t)R, sizeof *ly->rows_host);
        ly->a2a = calloc(4 * (size_t)R, sizeof *ly->a2a);
        if (!ly->rows_host || !ly->a2a)
            st = etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    if (st == ETP_SUCCESS) st = etp_event_create(ep->ctx, &ly->prep_ev);
    if (st == ETP_SUCCESS && c.low_latency) {
        etp__ep_ll_env_t env;
        ll_env(ly, &env);
        st = etp__ep_ll_create(&env, c.max_tokens_per_rank, &ly->ll);
    }
    if (st != ETP_SUCCESS) {
        layer_free(ly);
        return st;
    }
    ep->layers++;
    *out = ly;
    return ETP_SUCCESS;
}

etp_status_t etp_ep_layer_destroy(etp_ep_layer_t *ly)
{
    if (!ly) return ETP_SUCCESS;
    ETP__TRY(not_tracing(ly->ep, "etp_ep_layer_destroy"));
    ETP__TRY(etp__ctx_no_capture(ly->ep->ctx, "etp_ep_layer_destroy"));
    if (ly->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY,
                        "etp_ep_layer_destroy: EP layer '%s' is used by %d graph(s); destroy them first",
                        ly->name, ly->graph_refs);
    ly->ep->layers--;
    layer_free(ly);
    return ETP_SUCCESS;
}

etp_status_t etp_ep_layer_rows(const etp_ep_layer_t *ly, int64_t *rows)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_ep_layer_rows: argument 'layer' is NULL");
    ETP__CHECK_NULL(rows, "etp_ep_layer_rows");
    *rows = ly->rows;
    return ETP_SUCCESS;
}

/* ---- prepare ------------------------------------------------------------ */

/* EXACT: the host's share of the layout, from the count matrix. */
static void exact_rows(etp_ep_layer_t *ly)
{
    etp_ep_group_t *ep = ly->ep;
    const int R = ep->R, me = ep->rank;
    const int32_t *C = ly->host_C;
    int64_t *h = ly->rows_host, soff = 0, roff = 0;
    for (int p = 0; p < R; p++) {
        h[0 * R + p] = etp__ep_accepted(C, R, ep->tok_cap, me, p);
        h[1 * R + p] = soff;
        soff += C[(int64_t)me * R + p];
        h[2 * R + p] = etp__ep_accepted(C, R, ep->tok_cap, p, me);
        h[3 * R + p] = roff;
        roff += h[2 * R + p];
    }
    ly->ntok = roff;
}

/* EXACT's receive-capacity drops (ep_rules.h: etp__ep_accepted), on the
 * token side, after the count all-gather. */
static etp_status_t clip(etp_ep_layer_t *ly, etp_stream_t *s)
{
    const etp_ep_group_t *ep = ly->ep;
    etp__ep_clip_args_t ca = {.C = ly->C, .t_dev = ly->t_dev, .slot_dest = ly->slot_dest,
                              .t_max = ep->cfg.max_tokens_per_rank, .tok_cap = ep->tok_cap,
                              .k = ly->k, .ranks = ep->R, .me = ep->rank,
                              .send_pos = ly->send_pos, .stats = ly->stats};
    return ep->kt->clip(ep->be, s->bs, &ca);
}

static etp_status_t ep_prepare_call(etp_ep_layer_t *ly, const void *topk_idx, etp_dtype_t idx_dtype,
                            int64_t num_tokens, const int32_t *num_tokens_dev, etp_stream_t *s)
{
    const char *fn = "etp_ep_prepare";
    ETP__TRY(entry(ly, s, fn));
    etp_ep_group_t *ep = ly->ep;
    const int exact = ep->cfg.transport == ETP_EP_TRANSPORT_EXACT;
    ETP__CHECK_ARG(idx_dtype == ETP_DTYPE_I64, "%s: topk_idx has dtype %s (expected i64)", fn,
                   etp_dtype_name(idx_dtype));
    if (num_tokens == ETP_EP_TOKENS_ON_DEVICE && !num_tokens_dev)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: num_tokens is ETP_EP_TOKENS_ON_DEVICE but argument 'num_tokens_dev' "
                        "is NULL (pass the device int32 that holds T, or T itself; EP layer '%s')",
                        fn, ly->name);
    if (num_tokens_dev) {
        ETP__CHECK_ARG(num_tokens == ETP_EP_TOKENS_ON_DEVICE,
                       "%s: num_tokens %lld with num_tokens_dev (pass ETP_EP_TOKENS_ON_DEVICE)", fn,
                       (long long)num_tokens);
        ETP__CHECK_ARG(!exact,
                       "%s: a device token count needs the CAPACITY or NVLINK transport (EXACT "
                       "brings counts to the host; EP group '%s')", fn, ep->name);
    } else {
        ETP__CHECK_ARG(num_tokens >= 0 && num_tokens <= ep->cfg.max_tokens_per_rank,
                       "%s: num_tokens %lld not in [0, max_tokens_per_rank %lld] of EP group '%s'",
                       fn, (long long)num_tokens, (long long)ep->cfg.max_tokens_per_rank, ep->name);
    }
    /* an empty array may be NULL; with T on the device, topk_idx holds
     * max_tokens_per_rank rows whatever T turns out to be */
    if (!topk_idx && num_tokens_dev)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: argument 'topk_idx' is NULL; with a device token count it must hold "
                        "max_tokens_per_rank %lld rows (EP layer '%s')", fn,
                        (long long)ep->cfg.max_tokens_per_rank, ly->name);
    ETP__CHECK_ARG(topk_idx != NULL || num_tokens == 0,
                   "%s: argument 'topk_idx' is NULL with num_tokens %lld (NULL only for 0 tokens; "
                   "EP layer '%s')", fn, (long long)num_tokens, ly->name);
    if (exact) {
        /* refused before anything is enqueued or the routing dropped: its
         * host synchronization would fail inside the capture, half done */
        int capturing = 0;
        ETP__TRY(etp__stream_capturing(s, &capturing));
        if (capturing)
            return etp__err(ETP_ERR_INVALID_STATE,
                            "%s: EP group '%s' uses the EXACT transport, which brings the exchange "
                            "sizes to the host: not during a graph capture (use NVLINK or CAPACITY)", fn,
                            ep->name);
    }
    const etp__ep_kernels_t *kt = ep->kt;
    etp__be_t *be = ep->be;
    ly->phase = LAYER_EMPTY;
    ly->weights_kept = 0;
    ETP__TRY(join(ep, s));

    trace(ep, ETP_TRACE_EP_PREPARE_ROUTE, s);
    etp__ep_route_args_t ra = {
        .topk_idx = topk_idx, .t_in = num_tokens_dev, .t_value = num_tokens, .t_dev = ly->t_dev,
        .t_max = ep->cfg.max_tokens_per_rank, .num_experts = ep->cfg.num_experts,
        .local_experts = ep->L, .slab = exact ? ep->cfg.max_tokens_per_rank : ep->slab,
        .k = ly->k, .ranks = ep->R, .exact = exact,
        .slab_report = ep->cfg.transport == ETP_EP_TRANSPORT_CAPACITY, .slot_dest = ly->slot_dest,
        .send_pos = ly->send_pos, .send_cnt = ly->send_cnt, .send_base = ly->send_base,
        /* fused: the exchange kernel stores the metadata rows */
        .send_meta = ep->fused ? NULL : ep->send_small, .stats = ly->stats};
    ETP__TRY(kt->route(be, s->bs, &ra));
    trace(ep, ETP_TRACE_EP_PREPARE_EXCHANGE, s);
    etp__ep_layout_args_t la = {
        .C = ly->C, .recv_meta = ep->recv_small, .tok_cap = ep->tok_cap,
        .recv_rows = ep->recv_rows, .slab = ep->slab,
        .rows_cap = ly->rows, .local_experts = ep->L, .alignment = ly->align,
        .fixed_slots = ly->slots, .k = ly->k, .ranks = ep->R, .me = ep->rank, .exact = exact,
        .recv_cnt = ly->recv_cnt, .recv_base = ly->recv_base, .counts = ly->counts,
        .offsets = ly->offsets, .recv_row = ly->recv_row, .tok_rows = ly->tok_rows,
        .row_src = ly->row_src, .scratch = ly->layout_scratch, .stats = ly->stats,
        .mirror = ly->host_stats, .after_exchange = ep->fused};
    if (ep->fused) {
        /* the counts, the metadata rows and the clip in one kernel on the
         * window */
        etp__ep_xchg_args_t xa = {
            .nvl = ep->nv, .topk_idx = topk_idx, .t_dev = ly->t_dev, .slot_dest = ly->slot_dest,
            .send_cnt = ly->send_cnt, .send_pos = ly->send_pos, .local_experts = ep->L,
            .tok_cap = ep->tok_cap, .k = ly->k, .C = ly->C, .recv_meta = ep->recv_small,
            .stats = ly->stats, .lay = la};
        ETP__TRY(kt->nvl_prepare(be, s->bs, &xa));
        ly->ntok = ep->recv_rows;
    } else {
        ETP__TRY(etp_allgather(ep->group, ep->cfg.role, ly->send_cnt, ly->C, (size_t)ep->R,
                               ETP_DTYPE_I32, s));
        if (exact) {
            /* EXACT: the exchange sizes come to the host (the one synchronization). */
            ETP__TRY(etp_memcpy_async(s, ly->host_C, ly->C, (size_t)ep->R * ep->R * sizeof(int32_t)));
            ETP__TRY(etp_stream_synchronize(s));
            exact_rows(ly);
            int clipped = 0;
            for (int p = 0; p < ep->R; p++)
                clipped |= ly->rows_host[p] != ly->host_C[(int64_t)ep->rank * ep->R + p];
            if (clipped) ETP__TRY(clip(ly, s));
        } else {
            /* NVLINK drops what the receivers cannot take as EXACT does, on the
             * device */
            if (ep->nvl) ETP__TRY(clip(ly, s));
            ly->ntok = ep->recv_rows;
        }
        ETP__TRY(exchange(ly, 1, ep->send_small, ep->recv_small, ly->k, ETP_DTYPE_I32, s));
    }
    trace(ep, ETP_TRACE_EP_PREPARE_LAYOUT, s);
    ETP__TRY(kt->layout(be, s->bs, &la));
    trace(ep, ETP_TRACE_EP_PREPARE_END, s);
    ETP__TRY(etp_event_record(ly->prep_ev, s));
    ly->prepared_once = 1;
    ly->t_host = num_tokens_dev ? -1 : num_tokens;
    ly->phase = LAYER_PREPARED;
    return leave(ep, s);
}

etp_status_t etp_ep_prepare(etp_ep_layer_t *ly, const void *topk_idx, etp_dtype_t idx_dtype,
                            int64_t num_tokens, const int32_t *num_tokens_dev, etp_stream_t *s)
{
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    return etp__refusal_guard_end(gd, ep_prepare_call(ly, topk_idx, idx_dtype, num_tokens, num_tokens_dev, s), "etp_ep_prepare");
}

etp_status_t etp_ep_layout(const etp_ep_layer_t *ly, const int32_t **counts_dev,
                           const int32_t **offsets_dev)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_ep_layout: argument 'layer' is NULL");
    if (ly->ll) {
        etp__ep_ll_layout(ly->ll, counts_dev, offsets_dev);
        return ETP_SUCCESS;
    }
    if (counts_dev) *counts_dev = ly->counts;
    if (offsets_dev) *offsets_dev = ly->offsets;
    return ETP_SUCCESS;
}

etp_status_t etp_ep_layout_host(etp_ep_layer_t *ly, etp_stream_t *s, int32_t *counts,
                                int32_t *offsets)
{
    const char *fn = "etp_ep_layout_host";
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'layer' is NULL", fn);
    ETP__TRY(check_stream(ly->ep, s, fn));
    ETP__TRY(note_capture(ly, s));
    if (ly->phase != LAYER_PREPARED && !(ly->ll && ly->prepared_once))
        return etp__err(ETP_ERR_INVALID_STATE, "%s: EP layer '%s' has not been prepared", fn,
                        ly->name);
    etp_ep_group_t *ep = ly->ep;
    ETP__TRY(join(ep, s));
    const int32_t *cd = ly->counts, *od = ly->offsets;
    if (ly->ll) etp__ep_ll_layout(ly->ll, &cd, &od);
    if (counts) ETP__TRY(etp_memcpy_async(s, counts, cd, (size_t)ep->L * sizeof(int32_t)));
    if (offsets)
        ETP__TRY(etp_memcpy_async(s, offsets, od, (size_t)(ep->L + 1) * sizeof(int32_t)));
    ETP__TRY(leave(ep, s));
    return etp_stream_synchronize(s);
}

/* ---- dispatch, combine and their adjoints -------------------------------- */

static etp_status_t check_prepared(const etp_ep_layer_t *ly, const char *fn)
{
    if (ly->phase != LAYER_PREPARED)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: EP layer '%s' has not been prepared", fn,
                        ly->name);
    return ETP_SUCCESS;
}

/* A token-side array ([T, ...]) may be NULL when it is empty: when this
 * rank's T of the last prepare, known on the host, is 0. With T on the
 * device nothing is known to be empty. */
static etp_status_t check_tok(const etp_ep_layer_t *ly, const void *p, const char *name,
                              const char *fn)
{
    if (p || ly->t_host == 0) return ETP_SUCCESS;
    if (ly->t_host < 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: argument '%s' is NULL; EP layer '%s' was prepared with a device "
                        "token count, so it must hold max_tokens_per_rank %lld rows", fn, name,
                        ly->name, (long long)ly->ep->cfg.max_tokens_per_rank);
    return etp__err(ETP_ERR_INVALID_ARGUMENT,
                    "%s: argument '%s' is NULL; EP layer '%s' was prepared with %lld tokens on "
                    "this rank (NULL only for 0)", fn, name, ly->name, (long long)ly->t_host);
}

static etp_status_t check_rows(const etp_ep_layer_t *ly, int64_t rows, const char *what,
                               const char *fn)
{
    if (rows < ly->rows)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s holds %lld rows, EP layer '%s' needs %lld (etp_ep_layer_rows)", fn,
                        what, (long long)rows, ly->name, (long long)ly->rows);
    return ETP_SUCCESS;
}

/* carry: weights travel (send_w set); `weights` may then still be NULL for
 * an empty rank, whose pack reads no token. */
static etp__ep_pack_args_t pack_args(const etp_ep_layer_t *ly, const void *tokens,
                                     const float *weights, int carry)
{
    const etp_ep_group_t *ep = ly->ep;
    etp__ep_pack_args_t a = {
        .tokens = tokens, .weights = weights, .t_dev = ly->t_dev, .slot_dest = ly->slot_dest,
        .send_pos = ly->send_pos, .send_base = ly->send_base,
        .t_max = ep->cfg.max_tokens_per_rank, .hidden = ep->cfg.hidden, .k = ly->k,
        .ranks = ep->R, .dtype = (int)ep->dt, .send_tok = ep->send_tok,
        .send_w = carry ? ep->send_small : NULL};
    return a;
}

/* The fused kernels' common arguments (NVLINK with peer stores). */
static etp__ep_t2e_args_t t2e_args(const etp_ep_layer_t *ly, int call, const void *tokens)
{
    const etp_ep_group_t *ep = ly->ep;
    etp__ep_t2e_args_t a = {
        .nvl = ep->nv, .call = call, .tokens = tokens, .t_dev = ly->t_dev,
        .slot_dest = ly->slot_dest, .send_pos = ly->send_pos, .hidden = ep->cfg.hidden,
        .k = ly->k, .dtype = (int)ep->dt, .row_src = ly->row_src, .tok_rows = ly->tok_rows,
        .recv_cnt = ly->recv_cnt, .rows = ly->rows};
    return a;
}

static etp__ep_e2t_args_t e2t_args(const etp_ep_layer_t *ly, int call)
{
    const etp_ep_group_t *ep = ly->ep;
    etp__ep_e2t_args_t a = {
        .nvl = ep->nv, .call = call, .tok_rows = ly->tok_rows, .recv_cnt = ly->recv_cnt,
        .recv_row = ly->recv_row, .hidden = ep->cfg.hidden, .k = ly->k, .dtype = (int)ep->dt,
        .wire = ep->wire, .t_dev = ly->t_dev, .slot_dest = ly->slot_dest,
        .send_pos = ly->send_pos, .send_base = ly->send_base, .stage = ep->send_tok,
        .chunk_done = ep->chunk_done};
    return a;
}

static etp_status_t dispatch(etp_ep_layer_t *ly, const etp_ep_dispatch_args_t *a, etp_stream_t *s,
                             const char *fn)
{
    ETP__TRY(entry(ly, s, fn));
    etp_ep_group_t *ep = ly->ep;
    ETP__TRY(check_dtype(ep, a->dtype, "tokens", fn));
    ETP__TRY(check_prepared(ly, fn));
    ETP__TRY(check_tok(ly, a->tokens, "tokens", fn));
    if (!a->recv_tokens)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'recv_tokens' is NULL", fn);
    if (ep->mx)
        ETP__CHECK_ARG(a->recv_scales != NULL,
                       "%s: EP group '%s' dispatches MXFP8 tokens: recv_scales ([rows, %lld] "
                       "E8M0 bytes) is required%s", fn, ep->name,
                       (long long)(ep->cfg.hidden / ETP_EP_MXFP8_BLOCK),
                       a->size ? "" : " (use etp_ep_dispatch_ex)");
    else
        ETP__CHECK_ARG(a->recv_scales == NULL,
                       "%s: recv_scales is for MXFP8 groups; EP group '%s' moves %s (pass NULL)",
                       fn, ep->name, etp_dtype_name(ep->dt));
    ETP__TRY(check_rows(ly, a->rows, "recv_tokens", fn));
    if (a->topk_weights)
        ETP__CHECK_ARG(a->weights_dtype == ETP_DTYPE_F32,
                       "%s: topk_weights has dtype %s (expected f32)", fn,
                       etp_dtype_name(a->weights_dtype));
    /* Whether weights travel is decided from what every rank has alike
     * (the layer, and recv_weights, which is never empty), not from
     * topk_weights, which an empty rank may pass as NULL: ranks that
     * disagreed would make different exchanges. */
    const int carry = ly->weighted || a->recv_weights != NULL;
    if (carry && !a->topk_weights && ly->t_host != 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: argument 'topk_weights' is NULL, but EP layer '%s' %s and this rank "
                        "has %s tokens (NULL only for 0)", fn, ly->name,
                        ly->weighted ? "is weighted" : "was given recv_weights",
                        ly->t_host < 0 ? "a device count of" : "nonzero");
    const etp__ep_kernels_t *kt = ep->kt;
    etp__be_t *be = ep->be;
    ETP__TRY(join(ep, s));
    if (ep->fused) {
        /* no pack: the sending kernel stores the caller's tokens */
        trace(ep, ETP_TRACE_EP_DISPATCH_PACK, s);
        trace(ep, ETP_TRACE_EP_DISPATCH_EXCHANGE, s);
        etp__ep_t2e_args_t ta = t2e_args(ly, ETP__EP_NVL_DISPATCH, a->tokens);
        ta.weights = carry ? a->topk_weights : NULL;
        ta.mx = ep->mx;
        ta.carry = carry;
        ta.out = a->recv_tokens;
        ta.out_scales = a->recv_scales;
        ta.out_w = a->recv_weights;
        ta.keep_w = carry ? ly->row_w : NULL;
        ETP__TRY(kt->nvl_t2e(be, s->bs, &ta, ETP__EP_NVL_PHASE_SEND));
        trace(ep, ETP_TRACE_EP_DISPATCH_EXPAND, s);
        ETP__TRY(kt->nvl_t2e(be, s->bs, &ta, ETP__EP_NVL_PHASE_RECV));
        trace(ep, ETP_TRACE_EP_DISPATCH_END, s);
        ly->weights_kept = carry;
        return leave(ep, s);
    }
    trace(ep, ETP_TRACE_EP_DISPATCH_PACK, s);
    etp__ep_pack_args_t pa = pack_args(ly, a->tokens, carry ? a->topk_weights : NULL, carry);
    pa.mx = ep->mx;
    ETP__TRY(kt->pack(be, s->bs, &pa));
    trace(ep, ETP_TRACE_EP_DISPATCH_EXCHANGE, s);
    ETP__TRY(etp_batch_begin(ep->ctx));
    /* MXFP8: a wire row of data, scales and padding, as bytes */
    etp_status_t st =
        ep->mx ? exchange(ly, 1, ep->send_tok, ep->recv_tok, ETP__EP_MX_ROW_BYTES(ep->cfg.hidden),
                          ETP_DTYPE_U8, s)
               : exchange(ly, 1, ep->send_tok, ep->recv_tok, ep->cfg.hidden, ep->dt, s);
    if (st == ETP_SUCCESS && carry)
        st = exchange(ly, 1, ep->send_small, ep->recv_small, ly->k, ETP_DTYPE_F32, s);
    etp_status_t st_end = etp_batch_end(ep->ctx);
    ETP__TRY(st);
    ETP__TRY(st_end);
    trace(ep, ETP_TRACE_EP_DISPATCH_EXPAND, s);
    etp__ep_expand_args_t xa = {
        .recv_tok = ep->recv_tok, .recv_w = carry ? ep->recv_small : NULL,
        .row_src = ly->row_src, .rows = ly->rows, .hidden = ep->cfg.hidden, .k = ly->k,
        .dtype = (int)ep->dt, .mx = ep->mx, .out = a->recv_tokens, .out_scales = a->recv_scales,
        .out_w = a->recv_weights, .keep_w = carry ? ly->row_w : NULL};
    ETP__TRY(kt->expand(be, s->bs, &xa));
    trace(ep, ETP_TRACE_EP_DISPATCH_END, s);
    ly->weights_kept = carry;
    return leave(ep, s);
}

etp_status_t etp_ep_dispatch(etp_ep_layer_t *ly, const void *tokens, etp_dtype_t dtype,
                             const void *topk_weights, etp_dtype_t weights_dtype,
                             void *recv_tokens, float *recv_weights, int64_t rows,
                             etp_stream_t *s)
{
    /* size 0 marks the call without recv_scales (for the message) */
    etp_ep_dispatch_args_t a = {.size = 0, .tokens = tokens, .dtype = dtype,
                                .topk_weights = topk_weights, .weights_dtype = weights_dtype,
                                .recv_tokens = recv_tokens, .recv_scales = NULL,
                                .recv_weights = recv_weights, .rows = rows};
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    return etp__refusal_guard_end(gd, dispatch(ly, &a, s, "etp_ep_dispatch"), "etp_ep_dispatch");
}

etp_status_t etp_ep_dispatch_ex(etp_ep_layer_t *ly, const etp_ep_dispatch_args_t *args,
                                etp_stream_t *s)
{
    const char *fn = "etp_ep_dispatch_ex";
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    etp_status_t st = ETP_SUCCESS;
    etp_ep_dispatch_args_t a = ETP_EP_DISPATCH_ARGS_INIT;
    if (!args)
        st = etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'args' is NULL", fn);
    else
        st = etp__vs_in(&a, args, &etp__vs_ep_dispatch_args, fn, "args");
    if (st == ETP_SUCCESS) st = dispatch(ly, &a, s, fn);
    return etp__refusal_guard_end(gd, st, fn);
}

/* Expert rows -> per (token, rank) FP32 partials -> back -> sum in rank
 * order: combine, and the token gradient of dispatch_bwd. `first` is the
 * call's first trace point; its others follow it in etp_trace_point_t
 * (exchange, sum, end). */
static etp_status_t rows_to_tokens(etp_ep_layer_t *ly, const void *in, const float *row_w,
                                   const float *grad_row_w, void *out, int wgrad,
                                   float *grad_topk_w, etp_trace_point_t first, etp_stream_t *s)
{
    etp_ep_group_t *ep = ly->ep;
    trace(ep, first, s);
    const etp__ep_kernels_t *kt = ep->kt;
    etp__be_t *be = ep->be;
    if (ep->fused) {
        etp__ep_e2t_args_t ea = e2t_args(ly, first == ETP_TRACE_EP_COMBINE_PRESUM
                                                 ? ETP__EP_NVL_COMBINE
                                                 : ETP__EP_NVL_DISPATCH_BWD);
        ea.in = in;
        ea.row_w = row_w;
        ea.grad_row_w = wgrad ? grad_row_w : NULL;
        ea.out = out;
        ea.grad_topk = wgrad ? grad_topk_w : NULL;
        /* the pre-sums run beside the stores, in the exchange phase */
        trace(ep, (etp_trace_point_t)(first + 1), s);
        ETP__TRY(kt->nvl_e2t(be, s->bs, &ea, ETP__EP_NVL_PHASE_SEND));
        trace(ep, (etp_trace_point_t)(first + 2), s);
        ETP__TRY(kt->nvl_e2t(be, s->bs, &ea, ETP__EP_NVL_PHASE_RECV));
        trace(ep, (etp_trace_point_t)(first + 3), s);
        return ETP_SUCCESS;
    }
    etp__ep_presum_args_t pa = {.in = in, .row_w = row_w, .tok_rows = ly->tok_rows,
                                .ntok = ly->ntok, .hidden = ep->cfg.hidden, .k = ly->k,
                                .dtype = (int)ep->dt, .wire = ep->wire, .partial = ep->recv_tok};
    ETP__TRY(kt->presum(be, s->bs, &pa));
    if (wgrad) {
        etp__ep_wgrad_args_t wa = {.recv_row = ly->recv_row, .grad_row_w = grad_row_w,
                                   .ntok = ly->ntok, .hidden = ep->cfg.hidden, .k = ly->k,
                                   .dtype = (int)ep->dt, .dot = 0,
                                   .g = ep->recv_small};
        ETP__TRY(kt->wgrad(be, s->bs, &wa));
    }
    trace(ep, (etp_trace_point_t)(first + 1), s);
    ETP__TRY(etp_batch_begin(ep->ctx));
    etp_status_t st = exchange(ly, 0, ep->recv_tok, ep->send_tok, ep->cfg.hidden,
                               ep->cfg.combine_wire, s);
    if (st == ETP_SUCCESS && wgrad)
        st = exchange(ly, 0, ep->recv_small, ep->send_small, ly->k, ETP_DTYPE_F32, s);
    etp_status_t st_end = etp_batch_end(ep->ctx);
    ETP__TRY(st);
    ETP__TRY(st_end);
    trace(ep, (etp_trace_point_t)(first + 2), s);
    etp__ep_reduce_args_t ra = {.partial = ep->send_tok, .t_dev = ly->t_dev,
                                .send_pos = ly->send_pos, .send_base = ly->send_base,
                                .t_max = ep->cfg.max_tokens_per_rank, .hidden = ep->cfg.hidden,
                                .ranks = ep->R, .dtype = (int)ep->dt, .wire = ep->wire,
                                .out = out};
    ETP__TRY(kt->reduce(be, s->bs, &ra));
    if (wgrad) {
        etp__ep_wscatter_args_t wa = {.g_recv = ep->send_small, .t_dev = ly->t_dev,
                                      .slot_dest = ly->slot_dest, .send_pos = ly->send_pos,
                                      .send_base = ly->send_base,
                                      .t_max = ep->cfg.max_tokens_per_rank, .k = ly->k,
                                      .ranks = ep->R, .out = grad_topk_w};
        ETP__TRY(kt->wscatter(be, s->bs, &wa));
    }
    trace(ep, (etp_trace_point_t)(first + 3), s);
    return ETP_SUCCESS;
}

static etp_status_t check_out(const void *out, const char *name, const char *fn)
{
    if (!out) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, name);
    return ETP_SUCCESS;
}

static etp_status_t ep_combine_call(etp_ep_layer_t *ly, const void *expert_out, etp_dtype_t dtype,
                            int64_t rows, void *out, etp_stream_t *s)
{
    const char *fn = "etp_ep_combine";
    ETP__TRY(entry(ly, s, fn));
    ETP__TRY(check_dtype(ly->ep, dtype, "expert_out", fn));
    ETP__TRY(check_prepared(ly, fn));
    ETP__CHECK_NULL(expert_out, fn);
    ETP__TRY(check_tok(ly, out, "out", fn));
    ETP__TRY(check_rows(ly, rows, "expert_out", fn));
    if (ly->weighted && !ly->weights_kept)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: EP layer '%s' is weighted and has not dispatched weights since its "
                        "prepare", fn, ly->name);
    ETP__TRY(join(ly->ep, s));
    ETP__TRY(rows_to_tokens(ly, expert_out, ly->weighted ? ly->row_w : NULL, NULL, out, 0, NULL,
                            ETP_TRACE_EP_COMBINE_PRESUM, s));
    return leave(ly->ep, s);
}

etp_status_t etp_ep_combine(etp_ep_layer_t *ly, const void *expert_out, etp_dtype_t dtype,
                            int64_t rows, void *out, etp_stream_t *s)
{
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    return etp__refusal_guard_end(gd, ep_combine_call(ly, expert_out, dtype, rows, out, s), "etp_ep_combine");
}

static etp_status_t ep_dispatch_bwd_call(etp_ep_layer_t *ly, const void *grad_rows, etp_dtype_t dtype,
                                 const float *grad_row_weights, int64_t rows, void *grad_tokens,
                                 float *grad_topk_weights, etp_stream_t *s)
{
    const char *fn = "etp_ep_dispatch_bwd";
    ETP__TRY(entry(ly, s, fn));
    ETP__TRY(check_dtype(ly->ep, dtype, "grad_rows", fn));
    ETP__TRY(check_prepared(ly, fn));
    ETP__CHECK_NULL(grad_rows, fn);
    ETP__TRY(check_tok(ly, grad_tokens, "grad_tokens", fn));
    ETP__TRY(check_rows(ly, rows, "grad_rows", fn));
    /* grad_row_weights ([rows]) decides whether weight gradients travel;
     * grad_topk_weights ([T, k]) may be NULL when empty */
    ETP__CHECK_ARG(grad_row_weights || !grad_topk_weights,
                   "%s: grad_topk_weights given without grad_row_weights (both given or both "
                   "NULL; EP layer '%s')", fn, ly->name);
    if (grad_row_weights && !grad_topk_weights && ly->t_host != 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: grad_row_weights given without grad_topk_weights (both given or both "
                        "NULL; grad_topk_weights may be NULL only when this rank has 0 tokens; EP "
                        "layer '%s')", fn, ly->name);
    ETP__TRY(join(ly->ep, s));
    ETP__TRY(rows_to_tokens(ly, grad_rows, NULL, grad_row_weights, grad_tokens,
                            grad_row_weights != NULL, grad_topk_weights,
                            ETP_TRACE_EP_DISPATCH_BWD_PRESUM, s));
    return leave(ly->ep, s);
}

etp_status_t etp_ep_dispatch_bwd(etp_ep_layer_t *ly, const void *grad_rows, etp_dtype_t dtype,
                                 const float *grad_row_weights, int64_t rows, void *grad_tokens,
                                 float *grad_topk_weights, etp_stream_t *s)
{
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    return etp__refusal_guard_end(gd, ep_dispatch_bwd_call(ly, grad_rows, dtype, grad_row_weights, rows, grad_tokens, grad_topk_weights, s), "etp_ep_dispatch_bwd");
}

static etp_status_t ep_combine_bwd_call(etp_ep_layer_t *ly, const void *grad_out, etp_dtype_t dtype,
                                const void *expert_out, int64_t rows, void *grad_rows,
                                float *grad_topk_weights, etp_stream_t *s)
{
    const char *fn = "etp_ep_combine_bwd";
    ETP__TRY(entry(ly, s, fn));
    etp_ep_group_t *ep = ly->ep;
    ETP__TRY(check_dtype(ep, dtype, "grad_out", fn));
    ETP__TRY(check_prepared(ly, fn));
    ETP__TRY(check_tok(ly, grad_out, "grad_out", fn));
    ETP__TRY(check_out(grad_rows, "grad_rows", fn));
    ETP__TRY(check_rows(ly, rows, "grad_rows", fn));
    if (ly->weighted) {
        ETP__CHECK_ARG(expert_out != NULL,
                       "%s: EP layer '%s' is weighted: argument 'expert_out' is required", fn,
                       ly->name);
        if (!grad_topk_weights && ly->t_host != 0)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "%s: EP layer '%s' is weighted: argument 'grad_topk_weights' is "
                            "required (NULL only when this rank has 0 tokens)", fn, ly->name);
        if (!ly->weights_kept)
            return etp__err(ETP_ERR_INVALID_STATE,
                            "%s: EP layer '%s' is weighted and has not dispatched weights since "
                            "its prepare", fn, ly->name);
    } else {
        ETP__CHECK_ARG(!grad_topk_weights,
                       "%s: EP layer '%s' is unweighted: grad_topk_weights must be NULL", fn,
                       ly->name);
    }
    const etp__ep_kernels_t *kt = ep->kt;
    etp__be_t *be = ep->be;
    ETP__TRY(join(ep, s));
    if (ep->fused) {
        etp__ep_t2e_args_t ta = t2e_args(ly, ETP__EP_NVL_COMBINE_BWD, grad_out);
        ta.scale_w = ly->weighted ? ly->row_w : NULL;
        ta.out = grad_rows;
        ETP__TRY(kt->nvl_t2e(be, s->bs, &ta, ETP__EP_NVL_PHASE_SEND));
        ETP__TRY(kt->nvl_t2e(be, s->bs, &ta, ETP__EP_NVL_PHASE_RECV));
        if (ly->weighted) {
            /* the dot products read the received grad_out rows in the
             * window: the peers store there again only after this rank's
             * next kernel (the one below) has released its slabs */
            etp__ep_wgrad_args_t wa = {.recv_row = ly->recv_row,
                                       .recv_tok = (char *)ep->nvl_local + ep->nv.tok_off,
                                       .rows_in = expert_out, .ntok = ly->ntok,
                                       .hidden = ep->cfg.hidden, .k = ly->k, .dtype = (int)dtype,
                                       .dot = 1, .g = ep->recv_small};
            ETP__TRY(kt->wgrad(be, s->bs, &wa));
            etp__ep_e2t_args_t ea = e2t_args(ly, ETP__EP_NVL_COMBINE_BWD_WEIGHTS);
            ea.g_pre = ep->recv_small;
            ea.grad_topk = grad_topk_weights;
            ETP__TRY(kt->nvl_e2t(be, s->bs, &ea, ETP__EP_NVL_PHASE_SEND));
            ETP__TRY(kt->nvl_e2t(be, s->bs, &ea, ETP__EP_NVL_PHASE_RECV));
        }
        return leave(ep, s);
    }
    etp__ep_pack_args_t pa = pack_args(ly, grad_out, NULL, 0);
    ETP__TRY(kt->pack(be, s->bs, &pa));
    ETP__TRY(exchange(ly, 1, ep->send_tok, ep->recv_tok, ep->cfg.hidden, dtype, s));
    etp__ep_expand_args_t xa = {.recv_tok = ep->recv_tok, .scale_w = ly->weighted ? ly->row_w : NULL,
                                .row_src = ly->row_src, .rows = ly->rows,
                                .hidden = ep->cfg.hidden, .k = ly->k, .dtype = (int)dtype,
                                .out = grad_rows};
    ETP__TRY(kt->expand(be, s->bs, &xa));
    if (ly->weighted) {
        etp__ep_wgrad_args_t wa = {.recv_row = ly->recv_row, .recv_tok = ep->recv_tok,
                                   .rows_in = expert_out, .ntok = ly->ntok,
                                   .hidden = ep->cfg.hidden, .k = ly->k, .dtype = (int)dtype,
                                   .dot = 1, .g = ep->recv_small};
        ETP__TRY(kt->wgrad(be, s->bs, &wa));
        ETP__TRY(exchange(ly, 0, ep->recv_small, ep->send_small, ly->k, ETP_DTYPE_F32, s));
        etp__ep_wscatter_args_t sa = {.g_recv = ep->send_small, .t_dev = ly->t_dev,
                                      .slot_dest = ly->slot_dest, .send_pos = ly->send_pos,
                                      .send_base = ly->send_base,
                                      .t_max = ep->cfg.max_tokens_per_rank, .k = ly->k,
                                      .ranks = ep->R, .out = grad_topk_weights};
        ETP__TRY(kt->wscatter(be, s->bs, &sa));
    }
    return leave(ep, s);
}

etp_status_t etp_ep_combine_bwd(etp_ep_layer_t *ly, const void *grad_out, etp_dtype_t dtype,
                                const void *expert_out, int64_t rows, void *grad_rows,
                                float *grad_topk_weights, etp_stream_t *s)
{
    etp__refusal_guard_t gd = etp__refusal_guard(ly ? ly->ep->group : NULL);
    return etp__refusal_guard_end(gd, ep_combine_bwd_call(ly, grad_out, dtype, expert_out, rows, grad_rows, grad_topk_weights, s), "etp_ep_combine_bwd");
}

/* ---- reports ------------------------------------------------------------ */

etp_status_t etp_ep_poll(etp_ep_layer_t *ly, etp_ep_report_t *report)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_ep_poll: argument 'layer' is NULL");
    if (report) ETP__TRY(etp__vs_check(report->size, &etp__vs_ep_report, "etp_ep_poll", "report"));
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    read_report(ly, &r);
    if (report) etp__vs_put(report, &r);
    return report_status(ly, &r, "etp_ep_poll");
}

etp_status_t etp_ep_check(etp_ep_layer_t *ly, etp_ep_report_t *report)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_ep_check: argument 'layer' is NULL");
    if (report) ETP__TRY(etp__vs_check(report->size, &etp__vs_ep_report, "etp_ep_check", "report"));
    ETP__TRY(etp__ctx_usable(ly->ep->ctx, "etp_ep_check"));
    if (ly->prepared_once) ETP__TRY(etp_event_synchronize(ly->prep_ev));
    /* a transport kernel that gave up waiting for a peer (NVLINK) */
    etp__be_t *be = ly->ep->be;
    if (be->ops->health) ETP__TRY(be->ops->health(be));
    etp_ep_report_t r = ETP_EP_REPORT_INIT;
    read_report(ly, &r);
    if (report) etp__vs_put(report, &r);
    return report_status(ly, &r, "etp_ep_check");
}

etp_status_t etp_ep_reset_report(etp_ep_layer_t *ly, etp_stream_t *s)
{
    const char *fn = "etp_ep_reset_report";
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'layer' is NULL", fn);
    ETP__TRY(check_stream(ly->ep, s, fn));
    ETP__TRY(note_capture(ly, s));
    etp_ep_group_t *ep = ly->ep;
    ETP__TRY(join(ep, s));
    ETP__TRY(etp_memset_async(s, ly->stats, 0, ETP__EP_ST_COUNT * sizeof(int64_t)));
    /* The mirror is cleared now and again in stream order, so a copy of an
     * earlier prepare still queued cannot bring old counters back after. */
    ETP__TRY(etp_memcpy_async(s, (void *)ly->host_stats, ly->stats,
                              ETP__EP_ST_COUNT * sizeof(int64_t)));
    for (int i = 0; i < ETP__EP_ST_COUNT; i++) ly->host_stats[i] = 0;
    return leave(ep, s);
}

/* ---- low-latency layers: ep_ll.c's entry points -------------------------- */

etp_status_t etp__ep_ll_begin(etp_ep_layer_t *ly, etp_stream_t *s, const char *fn,
                              etp__ep_ll_env_t *env, etp__ep_ll_t **ll)
{
    if (!ly) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'layer' is NULL", fn);
    if (!ly->ll)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: EP layer '%s' is not a low-latency layer (made with low_latency = 1)",
                        fn, ly->name);
    ETP__TRY(check_stream(ly->ep, s, fn));
    ETP__TRY(etp__ctx_no_batch(ly->ep->ctx, fn));
    ETP__TRY(note_capture(ly, s));
    ll_env(ly, env);
    *ll = ly->ll;
    return join(ly->ep, s);
}

etp_status_t etp__ep_ll_end(etp_ep_layer_t *ly, etp_stream_t *s)
{
    return leave(ly->ep, s);
}

void etp__ep_ll_trace(etp_ep_layer_t *ly, etp_trace_point_t point, etp_stream_t *s)
{
    trace(ly->ep, point, s);
}

etp_group_t *etp__ep_ll_group_of(const etp_ep_layer_t *ly)
{
    return ly->ep->group;
}
