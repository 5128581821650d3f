/* Weight gradients: the wgrad ring, reduce-scatter into main_grad, stats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

static size_t full_elems(const etp_param_t *p)
{
    return (size_t)(p->experts * p->padded_rows * p->cols);
}

/* (Re)allocate *buf as a window of the chain's RS communicator (plain
 * memory where windows are not possible), after the RS stream is done
 * with the old one. */
static etp_status_t rs_buffer(etp_chain_t *c, void **buf, size_t *have, size_t need,
                              etp_mem_owner_t owner)
{
    if (need <= *have) return ETP_SUCCESS;
    ETP__TRY(etp_stream_synchronize(c->rs));
    if (*buf) etp_mem_free(c->ctx, *buf);
    *buf = NULL;
    *have = 0;
    int window = 0;
    ETP__TRY(etp__mem_alloc_window(c->group, c->rs_role, need, owner, buf, &window));
    *have = need;
    return ETP_SUCCESS;
}

/* Size the ring and staging for every parameter of the chain. Only before
 * the chain is finalized (at finalize, or while recording, when it may
 * grow); afterwards nothing is allocated. The ring and the all-to-all
 * staging are windows of the RS communicator, so that the
 * all-to-all of a reduction runs on the copy engines (cuda_window.c). */
etp_status_t etp__chain_ensure_workspace(etp_chain_t *c)
{
    /* a ring entry and the exchange's staging each hold one full wgrad of
     * the largest parameter */
    size_t ring = 0;
    for (int i = 0; i < c->nparams; i++) {
        const etp_param_t *p = c->params[i];
        const size_t bytes = full_elems(p) * etp_dtype_size(p->wgrad_dtype);
        if (bytes > ring) ring = bytes;
    }
    if (ring > c->ring_bytes) {
        /* Only while recording can the ring grow; an entry handed out
         * would be freed under its writer. */
        for (int k = 0; k < c->ring_n; k++)
            if (c->ring_holder[k])
                return etp__err(ETP_ERR_INVALID_STATE,
                                "chain '%s': its wgrad ring must grow to %zu bytes while '%s' "
                                "holds an entry not yet reduced", c->name, ring,
                                c->ring_holder[k]->name);
        ETP__TRY(etp_stream_synchronize(c->rs));
        for (int k = 0; k < c->ring_n; k++) {
            if (c->ring[k]) etp_mem_free(c->ctx, c->ring[k]);
            c->ring[k] = NULL;
        }
        c->ring_bytes = 0;
        for (int k = 0; k < c->ring_n; k++) {
            int window = 0;
            ETP__TRY(etp__mem_alloc_window(c->group, c->rs_role, ring, ETP_MEM_WGRAD_RING, &c->ring[k],
                                           &window));
        }
        c->ring_bytes = ring;
    }
    /* a group of one sums its own wgrad: no exchange, no staging */
    if (c->group->size > 1)
        ETP__TRY(rs_buffer(c, &c->rs_stage, &c->rs_bytes, ring, ETP_MEM_WORKSPACE));
    if (!c->a2a_counts) {
        size_t R = (size_t)c->group->size;
        c->a2a_counts = calloc(R, sizeof *c->a2a_counts);
        c->a2a_displs = calloc(R, sizeof *c->a2a_displs);
        if (!c->a2a_counts || !c->a2a_displs)
            return etp__err(ETP_ERR_OUT_OF_MEMORY, "chain '%s': out of host memory", c->name);
    }
    if (!c->stats) ETP__TRY(etp_mem_alloc(c->ctx, 2 * sizeof(double), ETP_MEM_WORKSPACE, (void **)&c->stats));
    return ETP_SUCCESS;
}

static etp_status_t chain_of(const etp_param_t *p, const etp_stream_t *s, const char *fn,
                             etp_chain_t **out)
{
    ETP__CHECK_NULL_AS(p, "param", fn);
    ETP__CHECK_NULL_AS(s, "stream", fn);
    ETP__CHECK_ARG(s->ctx == p->ctx, "%s: the stream belongs to another context than '%s'", fn,
                   p->name);
    ETP__TRY(etp__ctx_usable(p->ctx, fn));
    ETP__TRY(etp__ctx_no_batch(p->ctx, fn));
    etp_chain_t *c = p->chain;
    if (!c || c->state == ETP__CHAIN_BUILDING)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: '%s' is not in a finalized or recording chain",
                        fn, p->name);
    *out = c;
    return ETP_SUCCESS;
}

etp_status_t etp_wgrad_buffer(etp_param_t *p, etp_stream_t *stream, etp_weight_view_t *view)
{
    const char *fn = "etp_wgrad_buffer";
    etp_chain_t *c = NULL;
    ETP__TRY(chain_of(p, stream, fn, &c));
    ETP__TRY(etp__capture_note(p->ctx, &c->graph_refs, stream));
    ETP__CHECK_NULL(view, fn);
    ETP__TRY(etp__vs_check(view->size, &etp__vs_weight_view, fn, "view"));
    if (p->wgrad_entry >= 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: '%s' already has a wgrad buffer that was not reduced (call "
                        "etp_reduce_grad first)", fn, p->name);
    if (c->state == ETP__CHAIN_RECORDING) ETP__TRY(etp__chain_ensure_workspace(c));
    /* the next entry in ring order that no parameter holds */
    int k = c->ring_next;
    for (int i = 0; i < c->ring_n && c->ring_holder[k]; i++) k = (k + 1) % c->ring_n;
    if (c->ring_holder[k])
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: '%s': the %d wgrad buffer(s) of chain '%s' are all handed out and not "
                        "reduced ('%s' holds the next): reduce a gradient first, or raise "
                        "wgrad_ring", fn, p->name, c->ring_n, c->name, c->ring_holder[k]->name);
    /* Its last reduction must have read the entry before the caller writes. */
    if (c->ring_done_recorded[k] && !(c->skip_edges & ETP__EDGE_RING_REUSE))
        ETP__TRY(etp_stream_wait_event(stream, c->ring_done[k]));
    c->ring_next = (k + 1) % c->ring_n;
    p->wgrad_entry = k;
    c->ring_holder[k] = p;
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    v.data = c->ring[k];
    v.dtype = p->wgrad_dtype;
    v.experts = p->experts;
    v.rows = p->rows;
    v.cols = p->cols;
    v.ld = p->cols;
    v.expert_stride = p->padded_rows * p->cols;
    etp__vs_put(view, &v);
    return ETP_SUCCESS;
}

etp_status_t etp_reduce_grad(etp_param_t *p, etp_stream_t *stream, float scale)
{
    const char *fn = "etp_reduce_grad";
    etp_chain_t *c = NULL;
    ETP__TRY(chain_of(p, stream, fn, &c));
    ETP__TRY(etp__capture_note(p->ctx, &c->graph_refs, stream));
    ETP__CHECK_ARG(isfinite(scale), "%s: '%s': scale %g is not finite", fn, p->name, (double)scale);
    if (p->wgrad_entry < 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: '%s' has no wgrad buffer to reduce (call etp_wgrad_buffer first)", fn,
                        p->name);
    etp__be_t *be = p->ctx->be;
    const etp__shard_kernels_t *k = be->ops->kernels->shard;
    int e = p->wgrad_entry;
    if (!(c->skip_edges & ETP__EDGE_WGRAD_WRITER)) {
        ETP__TRY(etp_event_record(c->scratch, stream));
        ETP__TRY(etp_stream_wait_event(c->rs, c->scratch));
    }
    /* The wgrad travels in its own dtype: the sum below is FP32 anyway, so
     * converting BF16 first (upcast_wgrad) would only double the bytes. */
    const void *src = c->ring[e];
    const etp_dtype_t dt = p->wgrad_dtype;
    /* A reduce-scatter as an all-to-all (rank q's chunk r of each expert
     * to rank r) and one kernel summing the chunks in rank order in FP32
     * into main_grad: the sum is deterministic and rounded once, whatever
     * NCCL's algorithm, and the exchange runs on the copy engines where the
     * buffers are windows. */
    const int R = c->group->size;
    size_t es = etp_dtype_size(dt), shard_elems = (size_t)(p->shard_rows * p->cols);
    size_t full_e = (size_t)(p->padded_rows * p->cols);
    for (int r = 0; r < R; r++) {
        c->a2a_counts[r] = shard_elems;
        c->a2a_displs[r] = (size_t)r * shard_elems;
    }
    /* A group of one: the ring entry is already the only chunk, laid out
     * as the exchange would leave it (one chunk an expert). */
    const void *stage = src;
    if (R > 1) {
        stage = c->rs_stage;
        ETP__TRY(etp_batch_begin(p->ctx));
        etp_status_t st = ETP_SUCCESS;
        for (int64_t x = 0; x < p->experts && st == ETP_SUCCESS; x++)
            st = etp_alltoallv(c->group, c->rs_role, (const char *)src + (size_t)x * full_e * es,
                               c->a2a_counts, c->a2a_displs,
                               (char *)c->rs_stage + (size_t)x * full_e * es, c->a2a_counts,
                               c->a2a_displs, dt, c->rs);
        etp_status_t st2 = etp_batch_end(p->ctx);
        ETP__TRY(st != ETP_SUCCESS ? st : st2);
    }
    etp__shard_geom_t g = {p->experts, p->shard_rows, p->cols, p->valid_rows, (int64_t)shard_elems};
    ETP__TRY(k->accumulate(be, c->rs->bs, p->main_grad, stage, dt, g, R, (int64_t)shard_elems,
                           (int64_t)full_e, scale, p->zero_pending));
    p->zero_pending = 0;
    ETP__TRY(etp_event_record(c->ring_done[e], c->rs));
    c->ring_done_recorded[e] = 1;
    c->grads_joined = 0;
    c->ring_holder[e] = NULL;
    p->wgrad_entry = -1;
    if (++p->micro == c->num_micro) {
        p->micro = 0;
        if (p->cb) p->cb(p->cb_user, p, c->rs);
    }
    return ETP_SUCCESS;
}

etp_status_t etp_zero_grad(etp_chain_t *c, etp_stream_t *stream)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_zero_grad");
    ETP__CHECK_NULL(stream, "etp_zero_grad");
    ETP__CHECK_ARG(stream->ctx == c->ctx,
                   "etp_zero_grad: the stream belongs to another context than chain '%s'", c->name);
    ETP__TRY(etp__ctx_usable(c->ctx, "etp_zero_grad"));
    ETP__TRY(etp__capture_note(c->ctx, &c->graph_refs, stream));
    /* deferred too: the first reductions' writes then follow whatever
     * `stream` did before (an optimizer reading main_grad) */
    ETP__TRY(etp_event_record(c->scratch, stream));
    ETP__TRY(etp_stream_wait_event(c->rs, c->scratch));
    for (int i = 0; i < c->nparams; i++) ETP__TRY(etp__chain_zero_one(c, c->params[i]));
    /* a recording chain's parameters join at their first gather, after this
     * call: each is zeroed then (etp__chain_record_ticket) */
    if (c->state == ETP__CHAIN_RECORDING) c->zero_on_join = 1;
    return ETP_SUCCESS;
}

etp_status_t etp__chain_zero_one(etp_chain_t *c, etp_param_t *p)
{
    if (c->defer_zero)
        p->zero_pending = 1;
    else
        ETP__TRY(etp_memset_async(c->rs, p->main_grad, 0,
                                  (size_t)(p->experts * p->shard_rows * p->cols) * sizeof(float)));
    p->micro = 0;
    return ETP_SUCCESS;
}

etp_status_t etp__chain_zero_pending(etp_chain_t *c)
{
    for (int i = 0; i < c->nparams; i++) {
        etp_param_t *p = c->params[i];
        if (!p->zero_pending) continue;
        ETP__TRY(etp_memset_async(c->rs, p->main_grad, 0,
                                  (size_t)(p->experts * p->shard_rows * p->cols) * sizeof(float)));
        p->zero_pending = 0;
    }
    return ETP_SUCCESS;
}

etp_status_t etp_wait_grads(etp_chain_t *c, etp_stream_t *stream)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_wait_grads");
    ETP__CHECK_NULL(stream, "etp_wait_grads");
    ETP__CHECK_ARG(stream->ctx == c->ctx,
                   "etp_wait_grads: the stream belongs to another context than chain '%s'", c->name);
    ETP__TRY(etp__ctx_usable(c->ctx, "etp_wait_grads"));
    ETP__TRY(etp__capture_note(c->ctx, &c->graph_refs, stream));
    ETP__TRY(etp__chain_zero_pending(c));
    if (c->skip_edges & ETP__EDGE_GRADS_JOIN) return ETP_SUCCESS;
    ETP__TRY(etp_event_record(c->scratch, c->rs));
    ETP__TRY(etp_stream_wait_event(stream, c->scratch));
    c->grads_joined = 1;
    /* A graphed chain's stream is now behind every reduction of the ring:
     * the next step's wgrad buffers need no edge to them, and a capture that
     * starts here could not carry one (a step that gathers drops them at its
     * first gather too; one whose weights are all held elsewhere has none). */
    if (c->graphed)
        for (int k = 0; k < c->ring_n; k++) c->ring_done_recorded[k] = 0;
    return ETP_SUCCESS;
}

etp_status_t etp_chain_grad_stats(etp_chain_t *c, double *sum_squares, int64_t *nonfinite)
{
    const char *fn = "etp_chain_grad_stats";
    ETP__CHECK_NULL_AS(c, "chain", fn);
    ETP__CHECK_NULL(sum_squares, fn);
    ETP__CHECK_NULL(nonfinite, fn);
    ETP__TRY(etp__ctx_usable(c->ctx, fn));
    ETP__TRY(etp__ctx_no_batch(c->ctx, fn));
    if (!c->stats)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: chain '%s' is not finalized", fn, c->name);
    etp__be_t *be = c->ctx->be;
    ETP__TRY(etp__chain_zero_pending(c));
    ETP__TRY(etp_memset_async(c->rs, c->stats, 0, 2 * sizeof(double)));
    for (int i = 0; i < c->nparams; i++) {
        const etp_param_t *p = c->params[i];
        etp__shard_geom_t g = {p->experts, p->shard_rows, p->cols, p->valid_rows,
                               p->shard_rows * p->cols};
        ETP__TRY(be->ops->kernels->shard->grad_stats(be, c->rs->bs, p->main_grad, g, c->stats));
    }
    ETP__TRY(etp_allreduce(c->group, c->rs_role, c->stats, c->stats, 2, ETP_DTYPE_F64,
                           ETP_REDOP_SUM, c->rs));
    double host[2];
    ETP__TRY(etp_memcpy_async(c->rs, host, c->stats, sizeof host));
    ETP__TRY(etp_stream_synchronize(c->rs));
    *sum_squares = host[0];
    *nonfinite = (int64_t)host[1];
    return ETP_SUCCESS;
}
