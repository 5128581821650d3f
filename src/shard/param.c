/* Sharded parameters: shapes and padding, shards, loads and exports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

static size_t esize(etp_dtype_t t)
{
    return etp_dtype_size(t);
}

size_t etp__param_gather_bytes(const etp_param_t *p, etp_pass_t pass)
{
    if (p->quant != ETP_PARAM_QUANT_NONE) return etp__qgather_bytes(p, pass);
    return (size_t)(p->experts * p->padded_rows * p->cols) * esize(p->dtype);
}

static etp_status_t check_config(const etp_param_config_t *c, const char *fn)
{
    ETP__CHECK_ARG(c->group != NULL, "%s: config->group is NULL", fn);
    ETP__CHECK_ARG(c->experts >= 0, "%s: experts %lld (expected >= 0)", fn, (long long)c->experts);
    ETP__CHECK_ARG(c->rows > 0 && c->cols > 0, "%s: shape [%lld, %lld] (expected both > 0)", fn,
                   (long long)c->rows, (long long)c->cols);
    ETP__CHECK_ARG(c->dtype == ETP_DTYPE_BF16 || c->dtype == ETP_DTYPE_F32,
                   "%s: dtype %s (expected bf16 or f32)", fn, etp_dtype_name(c->dtype));
    ETP__CHECK_ARG((int)c->wgrad_dtype == -1 || c->wgrad_dtype == ETP_DTYPE_BF16 ||
                       c->wgrad_dtype == ETP_DTYPE_F32,
                   "%s: wgrad_dtype %s (expected -1, bf16 or f32)", fn, etp_dtype_name(c->wgrad_dtype));
    ETP__CHECK_ARG(c->alignment >= 0, "%s: alignment %d (expected >= 0)", fn, c->alignment);
    ETP__CHECK_ARG(c->quant >= ETP_PARAM_QUANT_NONE && c->quant <= ETP_PARAM_QUANT_NVFP4,
                   "%s: quant mode %d is unknown", fn, (int)c->quant);
    ETP__CHECK_ARG(c->name == NULL || strlen(c->name) < 64, "%s: name longer than 63 characters", fn);
    if (c->quant != ETP_PARAM_QUANT_NONE) {
        int block = c->quant == ETP_PARAM_QUANT_MXFP8 ? 32 : 16;
        ETP__CHECK_ARG(c->alignment > 0 && c->alignment % block == 0,
                       "%s: %s needs an alignment that is a multiple of %d rows (got %d)", fn,
                       c->quant == ETP_PARAM_QUANT_MXFP8 ? "MXFP8" : "NVFP4", block, c->alignment);
        ETP__CHECK_ARG(c->cols % block == 0, "%s: %s needs cols a multiple of %d (got %lld)", fn,
                       c->quant == ETP_PARAM_QUANT_MXFP8 ? "MXFP8" : "NVFP4", block,
                       (long long)c->cols);
    } else {
        ETP__CHECK_ARG(!c->gather_dequantized, "%s: gather_dequantized needs a quantized mode", fn);
    }
    ETP__CHECK_ARG(c->swizzle_scales == 0 || c->swizzle_scales == 1, "%s: swizzle_scales %d (expected 0 or 1)",
                   fn, c->swizzle_scales);
    ETP__CHECK_ARG(!c->swizzle_scales || (c->quant != ETP_PARAM_QUANT_NONE && !c->gather_dequantized),
                   "%s: swizzle_scales needs a quantized mode without gather_dequantized", fn);
    ETP__CHECK_ARG(c->cache_gathered_scales == 0 || c->cache_gathered_scales == 1,
                   "%s: cache_gathered_scales %d (expected 0 or 1)", fn, c->cache_gathered_scales);
    ETP__CHECK_ARG(!c->cache_gathered_scales || c->quant != ETP_PARAM_QUANT_NONE,
                   "%s: cache_gathered_scales needs a quantized mode", fn);
    /* Sizes in bytes must fit comfortably in size_t and in the collectives'
     * counts, padding included (a large alignment pads the rows a lot). */
    const double unit = (double)c->group->size * (double)(c->alignment > 1 ? c->alignment : 1);
    double elems = (double)(c->experts > 1 ? c->experts : 1) * (ceil((double)c->rows / unit) * unit) *
                   (double)c->cols;
    ETP__CHECK_ARG(elems < 9.0e15, "%s: %g elements is too large", fn, elems);
    return ETP_SUCCESS;
}

static void param_free(etp_param_t *p)
{
    etp__param_quant_free(p);
    if (p->shard) etp_mem_free(p->ctx, p->shard);
    if (p->main_grad) etp_mem_free(p->ctx, p->main_grad);
    if (p->master) etp_mem_free(p->ctx, p->master);
    if (p->updated) etp_event_destroy(p->updated);
    free(p);
}

etp_status_t etp_param_create(etp_context_t *ctx, const etp_param_config_t *config,
                              etp_param_t **out)
{
    const char *fn = "etp_param_create";
    ETP__CHECK_NULL(ctx, fn);
    ETP__CHECK_NULL(config, fn);
    ETP__CHECK_NULL_AS(out, "param", fn);
    etp_param_config_t in = ETP_PARAM_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&in, config, &etp__vs_param_config, fn, "config"));
    const etp_param_config_t *cfg = &in;
    /* the config's messages name the parameter */
    char who[112];
    snprintf(who, sizeof who, "%s: parameter '%.63s'", fn, cfg->name ? cfg->name : "param");
    ETP__TRY(check_config(cfg, who));
    ETP__CHECK_ARG(cfg->group->ctx == ctx, "%s: group '%s' belongs to another context", who,
                   cfg->group->name);
    ETP__TRY(etp__ctx_usable(ctx, fn));

    etp_param_t *p = calloc(1, sizeof *p);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    p->ctx = ctx;
    p->group = cfg->group;
    snprintf(p->name, sizeof p->name, "%s", cfg->name ? cfg->name : "param");
    p->group_rank = cfg->group->rank;
    p->group_size = cfg->group->size;
    p->experts = cfg->experts > 1 ? cfg->experts : 1;
    p->rows = cfg->rows;
    p->cols = cfg->cols;
    int64_t unit = (int64_t)p->group_size * (cfg->alignment > 1 ? cfg->alignment : 1);
    p->padded_rows = (p->rows + unit - 1) / unit * unit;
    p->shard_rows = p->padded_rows / p->group_size;
    p->row_begin = (int64_t)p->group_rank * p->shard_rows;
    int64_t valid = p->rows - p->row_begin;
    p->valid_rows = valid < 0 ? 0 : valid > p->shard_rows ? p->shard_rows : valid;
    p->dtype = cfg->dtype;
    p->wgrad_dtype = (int)cfg->wgrad_dtype == -1 ? cfg->dtype : cfg->wgrad_dtype;
    p->alignment = cfg->alignment;
    p->has_master = cfg->master != 0;
    p->quant = cfg->quant;
    p->ticket[0] = p->ticket[1] = -1;
    p->wgrad_entry = -1;
    p->gather_dequant = cfg->gather_dequantized != 0;
    p->swizzle = cfg->swizzle_scales;
    p->cache_scales = cfg->cache_gathered_scales != 0;

    size_t n = (size_t)(p->experts * p->shard_rows * p->cols);
    etp_status_t st = etp_mem_alloc(ctx, n * esize(p->dtype), ETP_MEM_SHARDS, &p->shard);
    if (st == ETP_SUCCESS)
        st = etp_mem_alloc(ctx, n * sizeof(float), ETP_MEM_MAIN_GRAD, (void **)&p->main_grad);
    if (st == ETP_SUCCESS && p->has_master)
        st = etp_mem_alloc(ctx, n * sizeof(float), ETP_MEM_SHARDS, (void **)&p->master);
    if (st == ETP_SUCCESS) st = etp_event_create(ctx, &p->updated);
    if (st == ETP_SUCCESS && p->quant != ETP_PARAM_QUANT_NONE) st = etp__param_quant_init(p);
    if (st == ETP_SUCCESS) {
        /* Zeroed once, synchronously: padding rows stay zero for good. */
        etp_stream_t *s;
        st = etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s);
        if (st == ETP_SUCCESS) {
            st = etp_memset_async(s, p->shard, 0, n * esize(p->dtype));
            if (st == ETP_SUCCESS) st = etp_memset_async(s, p->main_grad, 0, n * sizeof(float));
            if (st == ETP_SUCCESS && p->master)
                st = etp_memset_async(s, p->master, 0, n * sizeof(float));
            etp_status_t st2 = etp_stream_synchronize(s);
            if (st == ETP_SUCCESS) st = st2;
            etp_stream_destroy(s);
        }
    }
    if (st != ETP_SUCCESS) {
        param_free(p);
        return st;
    }
    ETP__LOG(&ctx->log, ETP_LOG_INFO, ETP_SUBSYS_SHARD,
             "param '%s': %lld x [%lld, %lld] %s, padded rows %lld, shard rows %lld (%lld valid)",
             p->name, (long long)p->experts, (long long)p->rows, (long long)p->cols,
             etp_dtype_name(p->dtype), (long long)p->padded_rows, (long long)p->shard_rows,
             (long long)p->valid_rows);
    p->group->users++;
    *out = p;
    return ETP_SUCCESS;
}

etp_status_t etp_param_destroy(etp_param_t *p)
{
    if (!p) return ETP_SUCCESS;
    ETP__TRY(etp__ctx_no_capture(p->ctx, "etp_param_destroy"));
    if (p->chain)
        return etp__err(ETP_ERR_BUSY, "etp_param_destroy: '%s' is in chain '%s'; destroy the chain first",
                        p->name, p->chain->name);
    if (p->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY,
                        "etp_param_destroy: '%s' is used by %d graph(s) (a captured load or "
                        "mark_updated); destroy them first", p->name, p->graph_refs);
    p->group->users--;
    param_free(p);
    return ETP_SUCCESS;
}

etp_status_t etp_param_info(const etp_param_t *p, etp_param_info_t *info)
{
    ETP__CHECK_NULL_AS(p, "param", "etp_param_info");
    ETP__CHECK_NULL(info, "etp_param_info");
    etp_param_info_t i = {sizeof i, p->name, p->experts, p->rows, p->cols, p->padded_rows,
                          p->shard_rows, p->row_begin, p->valid_rows, p->dtype, p->wgrad_dtype,
                          p->shard, p->main_grad, p->master};
    return etp__vs_out(info, &i, &etp__vs_param_info, "etp_param_info", "info");
}

static etp_status_t check_stream(const etp_param_t *p, const etp_stream_t *s, const char *fn)
{
    ETP__CHECK_NULL_AS(p, "param", fn);
    ETP__CHECK_NULL_AS(s, "stream", fn);
    ETP__CHECK_ARG(s->ctx == p->ctx, "%s: the stream belongs to another context than '%s'", fn,
                   p->name);
    return etp__ctx_usable(p->ctx, fn);
}

/* Copy this rank's valid rows (src rows from src_row0, experts src_stride
 * rows apart) into the shard, zero the padding rows, refresh master, and
 * mark the shard updated: everything on s. */
static etp_status_t load_rows(etp_param_t *p, const char *src, int64_t src_row0, int64_t src_stride,
                              etp_stream_t *s)
{
    /* before anything is enqueued: a graph that writes the shard holds it */
    ETP__TRY(etp__capture_note(p->ctx, &p->graph_refs, s));
    size_t es = esize(p->dtype), row = (size_t)p->cols * es;
    etp_status_t st = ETP_SUCCESS;
    for (int64_t e = 0; e < p->experts && st == ETP_SUCCESS; e++) {
        char *dst = (char *)p->shard + (size_t)(e * p->shard_rows) * row;
        if (p->valid_rows > 0) /* src may be NULL otherwise */
            st = etp_memcpy_async(s, dst,
                                  src + (size_t)((e * src_stride + src_row0) * p->cols) * es,
                                  (size_t)p->valid_rows * row);
        if (st == ETP_SUCCESS)
            st = etp_memset_async(s, dst + (size_t)p->valid_rows * row, 0,
                                  (size_t)(p->shard_rows - p->valid_rows) * row);
    }
    if (p->master && st == ETP_SUCCESS) {
        etp__be_t *be = p->ctx->be;
        etp__shard_geom_t g = {p->experts, p->shard_rows, p->cols, p->shard_rows,
                               p->shard_rows * p->cols};
        st = be->ops->kernels->shard->convert_rows(be, s->bs, p->master, ETP_DTYPE_F32, g.stride,
                                                   p->shard, p->dtype, g.stride, p->cols, g);
    }
    /* a load that failed part way has still changed the shard: it is
     * marked updated all the same (no stale quantized copy, and later
     * gathers wait for the copies enqueued), and its error returned */
    const etp_status_t mu = etp_param_mark_updated(p, s);
    return st != ETP_SUCCESS ? st : mu;
}

etp_status_t etp_param_load_full(etp_param_t *p, const void *src, etp_stream_t *s)
{
    ETP__TRY(check_stream(p, s, "etp_param_load_full"));
    ETP__CHECK_NULL(src, "etp_param_load_full");
    return load_rows(p, src, p->row_begin, p->rows, s);
}

etp_status_t etp_param_load_shard(etp_param_t *p, const void *src, etp_stream_t *s)
{
    const char *fn = "etp_param_load_shard";
    ETP__TRY(check_stream(p, s, fn));
    /* only the valid rows are read: a shard of padding alone reads none */
    if (!src && p->valid_rows > 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: argument 'src' is NULL; '%s' has %lld valid rows on this rank (NULL "
                        "only for 0)", fn, p->name, (long long)p->valid_rows);
    return load_rows(p, src, 0, p->shard_rows, s);
}

etp_status_t etp_param_mark_updated(etp_param_t *p, etp_stream_t *s)
{
    ETP__TRY(check_stream(p, s, "etp_param_mark_updated"));
    ETP__TRY(etp__ctx_no_batch(p->ctx, "etp_param_mark_updated")); /* it may issue a gather */
    /* a graph that records the event must outlive it (the chain's hold
     * covers a parameter in a chain, not one in none) */
    ETP__TRY(etp__capture_note(p->ctx, &p->graph_refs, s));
    ETP__TRY(etp_event_record(p->updated, s));
    p->updated_recorded = 1;
    p->version++; /* the quantized shard is stale */
    return etp__chain_on_update(p, s);
}

static etp_status_t export_full(etp_param_t *p, void *dst, etp_stream_t *s)
{
    const char *fn = "etp_param_export_full";
    ETP__TRY(check_stream(p, s, fn));
    ETP__TRY(etp__ctx_no_batch(p->ctx, fn));
    ETP__CHECK_NULL(dst, fn);
    ETP__TRY(etp__ctx_no_capture(p->ctx, fn));
    size_t es = esize(p->dtype), row = (size_t)p->cols * es;
    size_t shard_elems = (size_t)(p->shard_rows * p->cols);
    /* Rows without padding gather straight into dst; padded ones through a
     * staging buffer whose padding rows are left out. Straight in spares the
     * caller a whole tensor of memory at its peak (a training loop's
     * resident copies, refreshed after each update). */
    const int direct = p->padded_rows == p->rows;
    void *full = dst;
    if (!direct)
        ETP__TRY(etp_mem_alloc(p->ctx, (size_t)(p->experts * p->padded_rows) * row,
                               ETP_MEM_WORKSPACE, &full));
    /* A parameter of a chain gathers on the chain's all-gather stream and
     * role, where its prefetches go: two streams on one communicator would
     * pair different collectives across ranks. That stream waits for the
     * caller's (the shard's writers), and the caller for the copies. */
    etp_chain_t *c = p->chain;
    etp_stream_t *xs = c ? c->ag : s;
    const int role = c ? c->ag_role : 0;
    etp_event_t *ev = NULL;
    etp_status_t st = ETP_SUCCESS;
    if (c) {
        st = etp_event_create(p->ctx, &ev);
        if (st == ETP_SUCCESS) st = etp_event_record(ev, s);
        if (st == ETP_SUCCESS) st = etp_stream_wait_event(xs, ev);
    }
    if (st == ETP_SUCCESS)
        st = etp__grouped_allgather(p->group, role, p->shard, shard_elems * es, full,
                                    (size_t)p->padded_rows * row, shard_elems, p->dtype,
                                    p->experts, xs);
    for (int64_t e = 0; e < p->experts && st == ETP_SUCCESS && !direct; e++)
        st = etp_memcpy_async(xs, (char *)dst + (size_t)(e * p->rows) * row,
                              (char *)full + (size_t)(e * p->padded_rows) * row,
                              (size_t)p->rows * row);
    if (c && st == ETP_SUCCESS) st = etp_event_record(ev, xs);
    if (c && st == ETP_SUCCESS) st = etp_stream_wait_event(s, ev);
    if (ev) (void)etp_event_destroy(ev);
    if (direct) return st;
    /* etp_mem_free waits for the enqueued work, the copies included. */
    etp_status_t st2 = etp_mem_free(p->ctx, full);
    return st != ETP_SUCCESS ? st : st2;
}

etp_status_t etp_param_export_full(etp_param_t *p, void *dst, etp_stream_t *s)
{
    /* collective over the parameter's group: a refusal is recorded there */
    etp__refusal_guard_t gd = etp__refusal_guard(p ? p->group : NULL);
    return etp__refusal_guard_end(gd, export_full(p, dst, s), "etp_param_export_full");
}

etp_status_t etp_param_set_grad_callback(etp_param_t *p, etp_grad_ready_fn_t fn, void *user)
{
    ETP__CHECK_NULL_AS(p, "param", "etp_param_set_grad_callback");
    p->cb = fn;
    p->cb_user = user;
    return ETP_SUCCESS;
}
