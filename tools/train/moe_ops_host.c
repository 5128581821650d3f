/*
 * The host backend of moe_ops.h: each call stores its arguments in the
 * next record and enqueues a loop over them with etp_stream_launch_host,
 * so the loop runs in stream order (later in shuffle mode, at every launch
 * of a graph that captured it).
 */
#include <stdio.h>
#include <stdlib.h>

#include "moe_ops_impl.h"

struct moe_host_rec {
    union {
        struct {
            moe_fill_t f;
            uint16_t *dst;
        } fill;
        struct {
            const float *logits;
            float *probs, *w;
            int64_t *idx;
            int64_t T;
            int E, k;
        } rfwd;
        struct {
            const float *probs, *gw;
            const int64_t *idx;
            uint16_t *dz;
            int64_t T;
            int E, k;
        } rbwd;
        struct {
            const uint16_t *a, *b, *c; /* silu_fwd: a; silu_bwd: a, gs = b */
            uint16_t *out;
            int64_t n;
        } ew;
        struct {
            const uint16_t *y, *target;
            uint16_t *grad;
            double *loss;
            int64_t n;
            float scale;
        } mse;
        struct {
            const float *parts;
            float *out;
            int64_t n;
            int nparts;
        } sum;
        struct {
            moe_adam_t a;
            const float *g;
            float *m, *v, *master;
            uint16_t *w;
            int64_t n;
        } adam;
    } u;
};

struct moe_host_rec *moe__host_records_alloc(size_t n)
{
    return calloc(n, sizeof(struct moe_host_rec));
}

void moe__host_records_free(struct moe_host_rec *recs)
{
    free(recs);
}

static etp_status_t take(moe_ops_t *ops, const char *call, struct moe_host_rec **rec)
{
    if (ops->used >= ops->nrec) {
        fprintf(stderr,
                "%s: all %zu host records are in use (moe_ops_create's count; "
                "moe_ops_rewind gives back those of finished work)\n",
                call, ops->nrec);
        return ETP_ERR_CAPACITY;
    }
    *rec = &ops->recs[ops->used++];
    return ETP_SUCCESS;
}

/* Enqueue fn(rec); a refused launch gives the record back. */
static etp_status_t launch(moe_ops_t *ops, const char *call, etp_stream_t *s,
                           void (*fn)(void *), struct moe_host_rec *rec)
{
    etp_status_t st = etp_stream_launch_host(s, fn, rec);
    if (st != ETP_SUCCESS) {
        fprintf(stderr, "%s: etp_stream_launch_host failed: %s\n", call, etp_last_error());
        ops->used--;
    }
    return st;
}

#define TAKE(call)                                                                      \
    struct moe_host_rec *r;                                                             \
    do {                                                                                \
        etp_status_t st_ = take(ops, call, &r);                                         \
        if (st_ != ETP_SUCCESS) return st_;                                             \
    } while (0)

/* ---- the loops ---- */

static void run_fill(void *arg)
{
    const struct moe_host_rec *r = arg;
    const moe_fill_t *f = &r->u.fill.f;
    uint16_t *dst = r->u.fill.dst;
    for (int64_t e = 0; e < f->experts; e++)
        for (int64_t i = 0; i < f->rows; i++) {
            uint16_t *row = dst + (e * f->rows + i) * f->cols;
            if (i >= f->valid_rows) {
                for (int64_t j = 0; j < f->cols; j++) row[j] = 0;
                continue;
            }
            uint64_t base = (uint64_t)(((f->expert0 + e) * f->total_rows + f->row0 + i) * f->cols);
            for (int64_t j = 0; j < f->cols; j++)
                row[j] = moe_f32_to_bf16(f->scale * moe_normal(f->seed, f->tensor,
                                                               base + (uint64_t)j));
        }
}

static void run_router_fwd(void *arg)
{
    const struct moe_host_rec *r = arg;
    int E = r->u.rfwd.E, k = r->u.rfwd.k;
    for (int64_t t = 0; t < r->u.rfwd.T; t++)
        moe_softmax_topk(r->u.rfwd.logits + t * E, E, k, r->u.rfwd.probs + t * E,
                         r->u.rfwd.idx + t * k, r->u.rfwd.w + t * k);
}

static void run_router_bwd(void *arg)
{
    const struct moe_host_rec *r = arg;
    int E = r->u.rbwd.E, k = r->u.rbwd.k;
    for (int64_t t = 0; t < r->u.rbwd.T; t++) {
        const float *p = r->u.rbwd.probs + t * E, *gw = r->u.rbwd.gw + t * k;
        const int64_t *idx = r->u.rbwd.idx + t * k;
        float dot = moe_router_dot(p, idx, gw, k);
        for (int i = 0; i < E; i++)
            r->u.rbwd.dz[t * E + i] = moe_f32_to_bf16(moe_router_dlogit(p, idx, gw, k, dot, i));
    }
}

static void run_silu_fwd(void *arg)
{
    const struct moe_host_rec *r = arg;
    for (int64_t i = 0; i < r->u.ew.n; i++)
        r->u.ew.out[i] = moe_f32_to_bf16(moe_silu(moe_bf16_to_f32(r->u.ew.a[i])));
}

static void run_silu_bwd(void *arg)
{
    const struct moe_host_rec *r = arg;
    for (int64_t i = 0; i < r->u.ew.n; i++)
        r->u.ew.out[i] = moe_f32_to_bf16(
            moe_silu_grad(moe_bf16_to_f32(r->u.ew.a[i]), moe_bf16_to_f32(r->u.ew.b[i])));
}

static void run_add(void *arg)
{
    const struct moe_host_rec *r = arg;
    for (int64_t i = 0; i < r->u.ew.n; i++) {
        float x = moe_bf16_to_f32(r->u.ew.a[i]) + moe_bf16_to_f32(r->u.ew.b[i]);
        if (r->u.ew.c != NULL) x = x + moe_bf16_to_f32(r->u.ew.c[i]);
        r->u.ew.out[i] = moe_f32_to_bf16(x);
    }
}

static void run_mse(void *arg)
{
    const struct moe_host_rec *r = arg;
    double sum = 0.0;
    for (int64_t i = 0; i < r->u.mse.n; i++) {
        float y = moe_bf16_to_f32(r->u.mse.y[i]), t = moe_bf16_to_f32(r->u.mse.target[i]);
        sum += moe_mse_term(y, t);
        r->u.mse.grad[i] = moe_f32_to_bf16(moe_mse_grad(y, t, r->u.mse.scale));
    }
    *r->u.mse.loss = sum;
}

static void run_sum(void *arg)
{
    const struct moe_host_rec *r = arg;
    const int64_t n = r->u.sum.n;
    for (int64_t i = 0; i < n; i++) {
        float x = r->u.sum.parts[i];
        for (int p = 1; p < r->u.sum.nparts; p++) x = x + r->u.sum.parts[p * n + i];
        r->u.sum.out[i] = x;
    }
}

static void run_adam(void *arg)
{
    const struct moe_host_rec *r = arg;
    for (int64_t i = 0; i < r->u.adam.n; i++) {
        float nm = moe_adam_step(&r->u.adam.a, r->u.adam.g[i], &r->u.adam.m[i],
                                 &r->u.adam.v[i], r->u.adam.master[i]);
        r->u.adam.master[i] = nm;
        r->u.adam.w[i] = moe_f32_to_bf16(nm);
    }
}

/* ---- the calls ---- */

etp_status_t moe__host_fill_normal(moe_ops_t *ops, etp_stream_t *s, uint16_t *dst,
                                   const moe_fill_t *f)
{
    TAKE("moe_fill_normal");
    r->u.fill.f = *f;
    r->u.fill.dst = dst;
    return launch(ops, "moe_fill_normal", s, run_fill, r);
}

etp_status_t moe__host_router_fwd(moe_ops_t *ops, etp_stream_t *s, const float *logits, int64_t T,
                                  int E, int k, float *probs, int64_t *idx, float *w)
{
    TAKE("moe_router_fwd");
    r->u.rfwd.logits = logits;
    r->u.rfwd.probs = probs;
    r->u.rfwd.idx = idx;
    r->u.rfwd.w = w;
    r->u.rfwd.T = T;
    r->u.rfwd.E = E;
    r->u.rfwd.k = k;
    return launch(ops, "moe_router_fwd", s, run_router_fwd, r);
}

etp_status_t moe__host_router_bwd(moe_ops_t *ops, etp_stream_t *s, const float *probs,
                                  const int64_t *idx, const float *gw, int64_t T, int E, int k,
                                  uint16_t *dz)
{
    TAKE("moe_router_bwd");
    r->u.rbwd.probs = probs;
    r->u.rbwd.idx = idx;
    r->u.rbwd.gw = gw;
    r->u.rbwd.dz = dz;
    r->u.rbwd.T = T;
    r->u.rbwd.E = E;
    r->u.rbwd.k = k;
    return launch(ops, "moe_router_bwd", s, run_router_bwd, r);
}

static etp_status_t elementwise(moe_ops_t *ops, const char *call, etp_stream_t *s,
                                void (*fn)(void *), const uint16_t *a, const uint16_t *b,
                                const uint16_t *c, uint16_t *out, int64_t n)
{
    TAKE(call);
    r->u.ew.a = a;
    r->u.ew.b = b;
    r->u.ew.c = c;
    r->u.ew.out = out;
    r->u.ew.n = n;
    return launch(ops, call, s, fn, r);
}

etp_status_t moe__host_silu_fwd(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a, uint16_t *out,
                                int64_t n)
{
    return elementwise(ops, "moe_silu_fwd", s, run_silu_fwd, a, NULL, NULL, out, n);
}

etp_status_t moe__host_silu_bwd(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a,
                                const uint16_t *gs, uint16_t *ga, int64_t n)
{
    return elementwise(ops, "moe_silu_bwd", s, run_silu_bwd, a, gs, NULL, ga, n);
}

etp_status_t moe__host_add(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a, const uint16_t *b,
                           const uint16_t *c, uint16_t *out, int64_t n)
{
    return elementwise(ops, "moe_add", s, run_add, a, b, c, out, n);
}

etp_status_t moe__host_mse(moe_ops_t *ops, etp_stream_t *s, const uint16_t *y,
                           const uint16_t *target, int64_t n, float scale, uint16_t *grad,
                           double *loss)
{
    TAKE("moe_mse");
    r->u.mse.y = y;
    r->u.mse.target = target;
    r->u.mse.grad = grad;
    r->u.mse.loss = loss;
    r->u.mse.n = n;
    r->u.mse.scale = scale;
    return launch(ops, "moe_mse", s, run_mse, r);
}

etp_status_t moe__host_sum(moe_ops_t *ops, etp_stream_t *s, const float *parts, int nparts,
                           int64_t n, float *out)
{
    TAKE("moe_sum");
    r->u.sum.parts = parts;
    r->u.sum.nparts = nparts;
    r->u.sum.n = n;
    r->u.sum.out = out;
    return launch(ops, "moe_sum", s, run_sum, r);
}

etp_status_t moe__host_adam(moe_ops_t *ops, etp_stream_t *s, const moe_adam_t *a, const float *g,
                            float *m, float *v, float *master, uint16_t *w, int64_t n)
{
    TAKE("moe_adam");
    r->u.adam.a = *a;
    r->u.adam.g = g;
    r->u.adam.m = m;
    r->u.adam.v = v;
    r->u.adam.master = master;
    r->u.adam.w = w;
    r->u.adam.n = n;
    return launch(ops, "moe_adam", s, run_adam, r);
}
