/* GEMM plans: the checks and the plan object; the products themselves run
 * in the backends (host/host_gemm.c, cuda/cuda_gemm.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels_gemm.h"
#include "comm/comm_internal.h"
#include "etp/gemm.h"

struct etp_gemm_plan {
    etp_context_t *ctx;
    const etp__gemm_kernels_t *kt;
    etp__gemm_shape_t shape;
    char name[64];
    void *workspace; /* from the context allocator; NULL when none */
    size_t ws_bytes;
    void *bplan;     /* the backend's part */
    int graph_refs;  /* live graphs that captured its calls (its destroy refuses) */
};

static const char *op_name(etp_gemm_op_t op)
{
    switch (op) {
    case ETP_GEMM_FORWARD: return "forward";
    case ETP_GEMM_DGRAD: return "dgrad";
    case ETP_GEMM_WGRAD: return "wgrad";
    }
    return "?";
}

static etp_status_t check_config(const etp_gemm_config_t *c, const char *fn)
{
    const char *nm = c->name ? c->name : "gemm";
    ETP__CHECK_ARG(c->op == ETP_GEMM_FORWARD || c->op == ETP_GEMM_DGRAD || c->op == ETP_GEMM_WGRAD,
                   "%s: plan '%s': op %d is not an etp_gemm_op_t", fn, nm, (int)c->op);
    ETP__CHECK_ARG(c->layout == ETP_GEMM_DENSE || c->layout == ETP_GEMM_FIXED_SLOTS ||
                       c->layout == ETP_GEMM_PACKED,
                   "%s: plan '%s': layout %d is not an etp_gemm_layout_t", fn, nm, (int)c->layout);
    /* cuBLASLt's dimensions and the EP layouts' row indices are 32-bit */
    const int64_t lim = INT32_MAX;
    ETP__CHECK_ARG(c->rows > 0 && c->n > 0 && c->k > 0 && c->rows <= lim && c->n <= lim &&
                       c->k <= lim,
                   "%s: plan '%s': rows %lld, n %lld, k %lld (each must be in 1 .. 2^31-1)", fn,
                   nm, (long long)c->rows, (long long)c->n, (long long)c->k);
    ETP__CHECK_ARG(c->experts > 0 && c->experts <= lim, "%s: plan '%s': experts %lld (must be >= 1)",
                   fn, nm, (long long)c->experts);
    ETP__CHECK_ARG(c->layout != ETP_GEMM_DENSE || c->experts == 1,
                   "%s: plan '%s': a DENSE plan has one weight, not experts %lld", fn, nm,
                   (long long)c->experts);
    ETP__CHECK_ARG(c->layout != ETP_GEMM_FIXED_SLOTS || c->rows * c->experts <= lim,
                   "%s: plan '%s': FIXED_SLOTS rows %lld x experts %lld is past 2^31-1", fn, nm,
                   (long long)c->rows, (long long)c->experts);
    ETP__CHECK_ARG(c->weight_ld == 0 || c->weight_ld >= c->k,
                   "%s: plan '%s': weight_ld %lld is smaller than k %lld", fn, nm,
                   (long long)c->weight_ld, (long long)c->k);
    const int64_t ld = c->weight_ld ? c->weight_ld : c->k;
    ETP__CHECK_ARG(c->weight_expert_stride == 0 || c->weight_expert_stride >= c->n * ld,
                   "%s: plan '%s': weight_expert_stride %lld is smaller than n %lld x weight_ld "
                   "%lld",
                   fn, nm, (long long)c->weight_expert_stride, (long long)c->n, (long long)ld);
    ETP__CHECK_ARG(c->out_dtype == ETP_DTYPE_BF16 || c->out_dtype == ETP_DTYPE_F32,
                   "%s: plan '%s': out_dtype %s (expected bf16 or f32)", fn, nm,
                   etp_dtype_name(c->out_dtype));
    return ETP_SUCCESS;
}

etp_status_t etp_gemm_plan_create(etp_context_t *ctx, const etp_gemm_config_t *config,
                                  etp_gemm_plan_t **plan)
{
    const char *fn = "etp_gemm_plan_create";
    ETP__CHECK_NULL(ctx, fn);
    ETP__CHECK_NULL(config, fn);
    ETP__CHECK_NULL(plan, fn);
    etp_gemm_config_t c = ETP_GEMM_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&c, config, &etp__vs_gemm_config, fn, "config"));
    ETP__TRY(check_config(&c, fn));
    ETP__TRY(etp__ctx_usable(ctx, fn));
    const etp__gemm_kernels_t *kt = ctx->be->ops->kernels->gemm;
    if (!kt) return etp__err(ETP_ERR_UNSUPPORTED, "%s: the %s backend has no GEMMs", fn, ctx->be->ops->name);

    etp_gemm_plan_t *p = calloc(1, sizeof *p);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    p->ctx = ctx;
    p->kt = kt;
    snprintf(p->name, sizeof p->name, "%s", c.name ? c.name : "gemm");
    etp__gemm_shape_t *s = &p->shape;
    s->op = c.op;
    s->layout = c.layout;
    s->experts = c.experts;
    s->rows = c.rows;
    s->n = c.n;
    s->k = c.k;
    s->w_ld = c.weight_ld ? c.weight_ld : c.k;
    s->w_stride = c.weight_expert_stride ? c.weight_expert_stride : c.n * s->w_ld;
    s->out_dtype = c.out_dtype;
    s->name = p->name;
    p->ws_bytes = c.workspace_bytes ? c.workspace_bytes : kt->default_workspace_bytes;
    etp_status_t st = ETP_SUCCESS;
    if (p->ws_bytes) st = etp_mem_alloc(ctx, p->ws_bytes, ETP_MEM_WORKSPACE, &p->workspace);
    if (st == ETP_SUCCESS) st = kt->plan_create(ctx->be, s, p->workspace, p->ws_bytes, &p->bplan);
    if (st != ETP_SUCCESS) {
        if (p->workspace) (void)etp_mem_free(ctx, p->workspace);
        free(p);
        return st;
    }
    *plan = p;
    return ETP_SUCCESS;
}

etp_status_t etp_gemm_plan_destroy(etp_gemm_plan_t *plan)
{
    if (!plan) return ETP_SUCCESS;
    const char *fn = "etp_gemm_plan_destroy";
    ETP__TRY(etp__ctx_no_capture(plan->ctx, fn));
    if (plan->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY, "%s: plan '%s' is used by %d graph(s); destroy them first", fn,
                        plan->name, plan->graph_refs);
    /* the workspace first: its free waits for the work that uses the plan */
    etp_status_t st = ETP_SUCCESS;
    if (plan->workspace) st = etp_mem_free(plan->ctx, plan->workspace);
    if (st != ETP_SUCCESS && !plan->ctx->be->failed) return st;
    plan->kt->plan_destroy(plan->ctx->be, plan->bplan);
    free(plan);
    return ETP_SUCCESS;
}

/* A view of the plan's weight side: `what` ("w" or "dw") of `dtype`. */
static etp_status_t check_view(const etp_gemm_plan_t *p, const etp_weight_view_t *view,
                               const char *what, etp_dtype_t dtype)
{
    const char *fn = "etp_gemm_run";
    const etp__gemm_shape_t *s = &p->shape;
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    ETP__TRY(etp__vs_in(&v, view, &etp__vs_weight_view, fn, what));
    ETP__CHECK_ARG(v.quant == ETP_PARAM_QUANT_NONE,
                   "%s: plan '%s': args->%s is a quantized view (quant %d): GEMMs take BF16 "
                   "weights (gather dequantized)",
                   fn, p->name, what, (int)v.quant);
    ETP__CHECK_ARG(v.dtype == dtype, "%s: plan '%s' (%s): args->%s has dtype %s, expected %s", fn,
                   p->name, op_name(s->op), what, etp_dtype_name(v.dtype), etp_dtype_name(dtype));
    ETP__CHECK_ARG(v.data != NULL, "%s: plan '%s': args->%s->data is NULL", fn, p->name, what);
    ETP__CHECK_ARG(v.experts == s->experts,
                   "%s: plan '%s': args->%s has %lld expert(s), the plan %lld", fn, p->name, what,
                   (long long)v.experts, (long long)s->experts);
    ETP__CHECK_ARG(v.rows == s->n && v.cols == s->k,
                   "%s: plan '%s': args->%s is [%lld, %lld], the plan's weight [n %lld, k %lld]"
                   "%s",
                   fn, p->name, what, (long long)v.rows, (long long)v.cols, (long long)s->n,
                   (long long)s->k, v.cols != s->k ? " (mismatched k)" : " (mismatched n)");
    ETP__CHECK_ARG(v.ld == s->w_ld, "%s: plan '%s': args->%s->ld %lld, the plan's weight_ld %lld",
                   fn, p->name, what, (long long)v.ld, (long long)s->w_ld);
    ETP__CHECK_ARG(s->experts == 1 || v.expert_stride == s->w_stride,
                   "%s: plan '%s': args->%s->expert_stride %lld, the plan's %lld", fn, p->name,
                   what, (long long)v.expert_stride, (long long)s->w_stride);
    return ETP_SUCCESS;
}

/* PACKED: every block within the row space, none overlapping the next. */
static etp_status_t check_blocks(const etp_gemm_plan_t *p, const int32_t *counts,
                                 const int32_t *offsets)
{
    const char *fn = "etp_gemm_run";
    const int64_t E = p->shape.experts, rows = p->shape.rows;
    for (int64_t e = 0; e < E; e++) {
        const int64_t c = counts[e], o = offsets[e], next = offsets[e + 1];
        ETP__CHECK_ARG(c >= 0 && o >= 0, "%s: plan '%s': expert %lld has count %lld at offset %lld",
                       fn, p->name, (long long)e, (long long)c, (long long)o);
        ETP__CHECK_ARG(o + c <= next,
                       "%s: plan '%s': expert %lld's rows [%lld, %lld) overlap expert %lld's "
                       "block at offsets[%lld] = %lld",
                       fn, p->name, (long long)e, (long long)o, (long long)(o + c),
                       (long long)(e + 1), (long long)(e + 1), (long long)next);
        ETP__CHECK_ARG(o + c <= rows,
                       "%s: plan '%s': expert %lld's rows [%lld, %lld) are beyond the layout's "
                       "%lld rows",
                       fn, p->name, (long long)e, (long long)o, (long long)(o + c),
                       (long long)rows);
    }
    ETP__CHECK_ARG(offsets[E] <= rows,
                   "%s: plan '%s': offsets[%lld] = %lld is beyond the layout's %lld rows", fn,
                   p->name, (long long)E, (long long)offsets[E], (long long)rows);
    return ETP_SUCCESS;
}

#define NEED(field, cond)                                                                      \
    ETP__CHECK_ARG((a.field != NULL) == (cond),                                                \
                   "etp_gemm_run: plan '%s' (%s): args->" #field " %s", p->name,               \
                   op_name(p->shape.op), (cond) ? "is NULL" : "must be NULL for this product")

etp_status_t etp_gemm_run(etp_gemm_plan_t *plan, const etp_gemm_args_t *args, etp_stream_t *stream)
{
    const char *fn = "etp_gemm_run";
    ETP__CHECK_NULL(plan, fn);
    ETP__CHECK_NULL(args, fn);
    ETP__CHECK_NULL(stream, fn);
    etp_gemm_plan_t *p = plan;
    etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
    ETP__TRY(etp__vs_in(&a, args, &etp__vs_gemm_args, fn, "args"));
    ETP__CHECK_ARG(stream->ctx == p->ctx, "%s: plan '%s': the stream is of another context", fn,
                   p->name);
    const etp__gemm_shape_t *s = &p->shape;
    const etp_gemm_op_t op = s->op;
    NEED(x, op != ETP_GEMM_DGRAD);
    NEED(dy, op != ETP_GEMM_FORWARD);
    NEED(w, op != ETP_GEMM_WGRAD);
    NEED(y, op == ETP_GEMM_FORWARD);
    NEED(dx, op == ETP_GEMM_DGRAD);
    NEED(dw, op == ETP_GEMM_WGRAD);
    NEED(counts, s->layout == ETP_GEMM_PACKED);
    NEED(offsets, s->layout == ETP_GEMM_PACKED);
    if (op == ETP_GEMM_WGRAD)
        ETP__CHECK_ARG(a.beta == 0.0f || a.beta == 1.0f,
                       "%s: plan '%s' (wgrad): beta %g (expected 0 or 1)", fn, p->name,
                       (double)a.beta);
    else
        ETP__CHECK_ARG(a.beta == 0.0f, "%s: plan '%s' (%s): beta %g (only wgrad accumulates)", fn,
                       p->name, op_name(op), (double)a.beta);
    if (op == ETP_GEMM_WGRAD)
        ETP__TRY(check_view(p, a.dw, "dw", s->out_dtype));
    else
        ETP__TRY(check_view(p, a.w, "w", ETP_DTYPE_BF16));
    if (s->layout == ETP_GEMM_PACKED) ETP__TRY(check_blocks(p, a.counts, a.offsets));
    ETP__TRY(etp__ctx_usable(p->ctx, fn));
    ETP__TRY(etp__ctx_no_batch(p->ctx, fn));
    ETP__TRY(etp__capture_note(p->ctx, &p->graph_refs, stream));

    etp__gemm_call_t call = {0};
    call.a = op == ETP_GEMM_FORWARD ? a.x : a.dy;
    call.b = op == ETP_GEMM_WGRAD ? a.x : NULL;
    call.w = op == ETP_GEMM_WGRAD ? NULL : a.w->data;
    call.out = op == ETP_GEMM_FORWARD ? a.y : op == ETP_GEMM_DGRAD ? a.dx : a.dw->data;
    call.beta = a.beta;
    call.counts = a.counts;
    call.offsets = a.offsets;
    return p->kt->run(p->ctx->be, stream->bs, s, p->bplan, &call);
}
