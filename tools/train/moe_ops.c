/*
 * moe_ops.h's calls: the argument checks, written once for both backends,
 * then the host loops (moe_ops_host.c) or the CUDA kernels
 * (moe_ops_cuda.cu) by the context's backend.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe_ops_impl.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

static etp_status_t bad(const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", call);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return ETP_ERR_INVALID_ARGUMENT;
}

/* a * b of non-negative values, or -1 when it does not fit in int64_t */
static int64_t mul_or_neg(int64_t a, int64_t b)
{
    if (a < 0 || b < 0) return -1;
    if (a != 0 && b > INT64_MAX / a) return -1;
    return a * b;
}

#define NEED(cond, ...)                                                                 \
    do {                                                                                \
        if (!(cond)) return bad(call, __VA_ARGS__);                                     \
    } while (0)

/* ops and the stream, common to every call */
#define CHECK_OPS_STREAM(ops, s)                                                        \
    do {                                                                                \
        NEED((ops) != NULL, "'ops' is NULL");                                           \
        NEED((s) != NULL, "the stream is NULL");                                        \
    } while (0)

#if ETP_HAVE_CUDA
static etp_status_t native_stream(const char *call, etp_stream_t *s, cudaStream_t *cs)
{
    etp_status_t st = etp_stream_get_cuda(s, cs);
    if (st != ETP_SUCCESS)
        fprintf(stderr, "%s: etp_stream_get_cuda failed: %s\n", call, etp_last_error());
    return st;
}
#define ON_CUDA(ops, s, call_expr)                                                      \
    do {                                                                                \
        if ((ops)->backend == ETP_BACKEND_CUDA) {                                       \
            cudaStream_t cs;                                                            \
            etp_status_t st_ = native_stream(call, (s), &cs);                           \
            return st_ != ETP_SUCCESS ? st_ : (call_expr);                              \
        }                                                                               \
    } while (0)
#else
#define ON_CUDA(ops, s, call_expr) ((void)0)
#endif

etp_status_t moe_ops_create(etp_context_t *ctx, size_t records, moe_ops_t **out)
{
    const char *call = "moe_ops_create";
    NEED(ctx != NULL, "'ctx' is NULL");
    NEED(out != NULL, "'ops' is NULL");
    etp_backend_t backend;
    etp_status_t st = etp_context_backend(ctx, &backend);
    if (st != ETP_SUCCESS) {
        fprintf(stderr, "%s: etp_context_backend failed: %s\n", call, etp_last_error());
        return st;
    }
    NEED(backend != ETP_BACKEND_HOST || records > 0, "a host context needs records > 0");
    moe_ops_t *ops = calloc(1, sizeof *ops);
    if (ops == NULL) {
        fprintf(stderr, "%s: out of host memory\n", call);
        return ETP_ERR_OUT_OF_MEMORY;
    }
    ops->ctx = ctx;
    ops->backend = backend;
    if (backend == ETP_BACKEND_HOST) {
        ops->recs = moe__host_records_alloc(records);
        if (ops->recs == NULL) {
            free(ops);
            fprintf(stderr, "%s: out of host memory for %zu records\n", call, records);
            return ETP_ERR_OUT_OF_MEMORY;
        }
        ops->nrec = records;
    } else if (backend == ETP_BACKEND_CUDA) {
#if ETP_HAVE_CUDA
        st = etp_mem_alloc(ctx, MOE_MSE_BLOCKS * sizeof(double), ETP_MEM_WORKSPACE,
                           (void **)&ops->mse_partials);
        if (st != ETP_SUCCESS) {
            fprintf(stderr, "%s: moe_mse's scratch: %s\n", call, etp_last_error());
            free(ops);
            return st;
        }
#endif
    } else {
        free(ops);
        return bad(call, "the context's backend (%d) is neither host nor CUDA", (int)backend);
    }
    *out = ops;
    return ETP_SUCCESS;
}

void moe_ops_destroy(moe_ops_t *ops)
{
    if (ops == NULL) return;
    if (ops->mse_partials != NULL && etp_mem_free(ops->ctx, ops->mse_partials) != ETP_SUCCESS)
        fprintf(stderr, "moe_ops_destroy: freeing moe_mse's scratch: %s\n", etp_last_error());
    moe__host_records_free(ops->recs);
    free(ops);
}

size_t moe_ops_mark(const moe_ops_t *ops)
{
    return ops != NULL ? ops->used : 0;
}

void moe_ops_rewind(moe_ops_t *ops, size_t mark)
{
    if (ops == NULL) return;
    if (mark > ops->used) {
        fprintf(stderr, "moe_ops_rewind: mark %zu is past the %zu records in use (ignored)\n",
                mark, ops->used);
        return;
    }
    ops->used = mark;
}

etp_status_t moe_fill_normal(moe_ops_t *ops, etp_stream_t *s, uint16_t *dst, const moe_fill_t *f)
{
    const char *call = "moe_fill_normal";
    CHECK_OPS_STREAM(ops, s);
    NEED(f != NULL, "'f' is NULL");
    NEED(f->experts >= 0 && f->rows >= 0 && f->cols >= 0,
         "negative size (experts %" PRId64 ", rows %" PRId64 ", cols %" PRId64 ")", f->experts,
         f->rows, f->cols);
    NEED(f->valid_rows >= 0 && f->valid_rows <= f->rows,
         "valid_rows %" PRId64 " is not in 0 .. rows (%" PRId64 ")", f->valid_rows, f->rows);
    NEED(f->expert0 >= 0 && f->row0 >= 0, "negative offset (expert0 %" PRId64 ", row0 %" PRId64 ")",
         f->expert0, f->row0);
    /* a shard wholly in the padding (valid_rows 0) may start past the tensor's rows */
    NEED(f->valid_rows == 0 || (f->row0 <= f->total_rows && f->valid_rows <= f->total_rows - f->row0),
         "rows row0 %" PRId64 " + valid_rows %" PRId64 " pass total_rows %" PRId64, f->row0,
         f->valid_rows, f->total_rows);
    int64_t n = mul_or_neg(mul_or_neg(f->experts, f->rows), f->cols);
    NEED(n >= 0, "experts x rows x cols overflows");
    NEED(f->expert0 <= INT64_MAX - f->experts &&
             mul_or_neg(mul_or_neg(f->expert0 + f->experts, f->total_rows), f->cols) >= 0,
         "the whole tensor's element indices overflow");
    if (n == 0) return ETP_SUCCESS;
    NEED(dst != NULL, "'dst' is NULL");
    ON_CUDA(ops, s, moe__cuda_fill_normal(cs, dst, f));
    return moe__host_fill_normal(ops, s, dst, f);
}

static etp_status_t check_router(const char *call, int64_t T, int E, int k)
{
    NEED(T >= 0, "T %" PRId64 " < 0", T);
    NEED(E >= 1 && E <= 1024, "E %d is not in 1 .. 1024", E);
    NEED(k >= 1 && k <= E, "k %d is not in 1 .. E (%d)", k, E);
    NEED(mul_or_neg(T, E) >= 0, "T x E overflows");
    return ETP_SUCCESS;
}

etp_status_t moe_router_fwd(moe_ops_t *ops, etp_stream_t *s, const float *logits, int64_t T,
                            int E, int k, float *probs, int64_t *idx, float *w)
{
    const char *call = "moe_router_fwd";
    CHECK_OPS_STREAM(ops, s);
    etp_status_t st = check_router(call, T, E, k);
    if (st != ETP_SUCCESS) return st;
    if (T == 0) return ETP_SUCCESS;
    NEED(logits != NULL && probs != NULL && idx != NULL && w != NULL,
         "a NULL array (logits %p, probs %p, idx %p, w %p)", (const void *)logits, (void *)probs,
         (void *)idx, (void *)w);
    ON_CUDA(ops, s, moe__cuda_router_fwd(cs, logits, T, E, k, probs, idx, w));
    return moe__host_router_fwd(ops, s, logits, T, E, k, probs, idx, w);
}

etp_status_t moe_router_bwd(moe_ops_t *ops, etp_stream_t *s, const float *probs,
                            const int64_t *idx, const float *gw, int64_t T, int E, int k,
                            uint16_t *dz)
{
    const char *call = "moe_router_bwd";
    CHECK_OPS_STREAM(ops, s);
    etp_status_t st = check_router(call, T, E, k);
    if (st != ETP_SUCCESS) return st;
    if (T == 0) return ETP_SUCCESS;
    NEED(probs != NULL && idx != NULL && gw != NULL && dz != NULL,
         "a NULL array (probs %p, idx %p, gw %p, dz %p)", (const void *)probs, (const void *)idx,
         (const void *)gw, (void *)dz);
    ON_CUDA(ops, s, moe__cuda_router_bwd(cs, probs, idx, gw, T, E, k, dz));
    return moe__host_router_bwd(ops, s, probs, idx, gw, T, E, k, dz);
}

etp_status_t moe_silu_fwd(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a, uint16_t *s,
                          int64_t n)
{
    const char *call = "moe_silu_fwd";
    CHECK_OPS_STREAM(ops, st);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    if (n == 0) return ETP_SUCCESS;
    NEED(a != NULL && s != NULL, "a NULL array (a %p, s %p)", (const void *)a, (void *)s);
    ON_CUDA(ops, st, moe__cuda_silu_fwd(cs, a, s, n));
    return moe__host_silu_fwd(ops, st, a, s, n);
}

etp_status_t moe_silu_bwd(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a,
                          const uint16_t *gs, uint16_t *ga, int64_t n)
{
    const char *call = "moe_silu_bwd";
    CHECK_OPS_STREAM(ops, st);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    if (n == 0) return ETP_SUCCESS;
    NEED(a != NULL && gs != NULL && ga != NULL, "a NULL array (a %p, gs %p, ga %p)",
         (const void *)a, (const void *)gs, (void *)ga);
    ON_CUDA(ops, st, moe__cuda_silu_bwd(cs, a, gs, ga, n));
    return moe__host_silu_bwd(ops, st, a, gs, ga, n);
}

etp_status_t moe_add(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a, const uint16_t *b,
                     const uint16_t *c, uint16_t *out, int64_t n)
{
    const char *call = "moe_add";
    CHECK_OPS_STREAM(ops, st);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    if (n == 0) return ETP_SUCCESS;
    NEED(a != NULL && b != NULL && out != NULL, "a NULL array (a %p, b %p, out %p)",
         (const void *)a, (const void *)b, (void *)out);
    ON_CUDA(ops, st, moe__cuda_add(cs, a, b, c, out, n));
    return moe__host_add(ops, st, a, b, c, out, n);
}

etp_status_t moe_mse(moe_ops_t *ops, etp_stream_t *st, const uint16_t *y, const uint16_t *target,
                     int64_t n, float scale, uint16_t *grad, double *loss)
{
    const char *call = "moe_mse";
    CHECK_OPS_STREAM(ops, st);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    NEED(loss != NULL, "'loss' is NULL");
    NEED(n == 0 || (y != NULL && target != NULL && grad != NULL),
         "a NULL array (y %p, target %p, grad %p)", (const void *)y, (const void *)target,
         (void *)grad);
    ON_CUDA(ops, st, moe__cuda_mse(cs, y, target, n, scale, grad, loss, ops->mse_partials));
    return moe__host_mse(ops, st, y, target, n, scale, grad, loss);
}

etp_status_t moe_sum(moe_ops_t *ops, etp_stream_t *st, const float *parts, int nparts, int64_t n,
                     float *out)
{
    const char *call = "moe_sum";
    CHECK_OPS_STREAM(ops, st);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    NEED(nparts >= 1, "nparts %d < 1", nparts);
    NEED(mul_or_neg(n, nparts) >= 0, "nparts %d x n %" PRId64 " overflows", nparts, n);
    if (n == 0) return ETP_SUCCESS;
    NEED(parts != NULL && out != NULL, "a NULL array (parts %p, out %p)", (const void *)parts,
         (void *)out);
    ON_CUDA(ops, st, moe__cuda_sum(cs, parts, nparts, n, out));
    return moe__host_sum(ops, st, parts, nparts, n, out);
}

etp_status_t moe_adam(moe_ops_t *ops, etp_stream_t *st, const moe_adam_t *a, const float *g,
                      float *m, float *v, float *master, uint16_t *w, int64_t n)
{
    const char *call = "moe_adam";
    CHECK_OPS_STREAM(ops, st);
    NEED(a != NULL, "'a' is NULL");
    NEED(a->bc1 > 0.0f && a->bc2 > 0.0f,
         "bias corrections bc1 %g and bc2 %g must be > 0 (step t >= 1)", (double)a->bc1,
         (double)a->bc2);
    NEED(n >= 0, "n %" PRId64 " < 0", n);
    if (n == 0) return ETP_SUCCESS;
    NEED(g != NULL && m != NULL && v != NULL && master != NULL && w != NULL,
         "a NULL array (g %p, m %p, v %p, master %p, w %p)", (const void *)g, (void *)m,
         (void *)v, (void *)master, (void *)w);
    ON_CUDA(ops, st, moe__cuda_adam(cs, a, g, m, v, master, w, n));
    return moe__host_adam(ops, st, a, g, m, v, master, w, n);
}
