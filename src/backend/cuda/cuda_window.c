/*
 * Copy-engine all-gathers and all-to-alls. NCCL (2.28 and later) runs them
 * on the copy engines, with no SMs, when the communicator has the zero-CTA
 * policy and the buffers are in symmetric windows (memory from ncclMemAlloc
 * registered with ncclCommWindowRegister). Measured on 2 H200s over NVLink
 * (docs/PERF.md): an in-place all-gather of 256 MiB in 366 us against 560 us
 * for the kernel path, and, next to a kernel occupying every SM, no slowdown
 * of either where the kernel path waits for the SMs. A non-in-place one
 * needs its send buffer in a window too, so etp gathers in place: the
 * shard is first copied into its own place in the slot (cudaMemcpy2DAsync:
 * on the SMs with CUDA 13.0's driver, so the chain issues it on the
 * caller's stream; docs/DESIGN.md).
 *
 * Each communicator gets a zero-CTA twin (blocking, like the fast-launch
 * twin) when its first window is made; only all-gathers into windows and
 * uniform all-to-alls between windows go to it (etp__cuda_ag_comm,
 * etp__cuda_a2a_comm), everything else stays on the usual communicators. Registration is a blocking
 * collective, so it is entered only after a rendezvous under the timeout on
 * the non-blocking communicator, which also agrees on whether every rank
 * got its memory (else all fall back to plain memory together).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"
#include "kernels/ep/nvl_kernels.h"

/* Smaller slots gain nothing from the copy engines and would each pay the
 * allocation granularity (2 MiB). */
#define ETP__CUDA_WIN_MIN_BYTES ((size_t)1 << 20)

struct etp__cuda_win {
    char *ptr;
    size_t bytes;
#if ETP__CUDA_HAVE_WINDOWS
    ncclWindow_t win;
#endif
    /* the window on each rank, as this device addresses it (NCCL's LSA
     * pointers); NULL where some rank has none */
    char **peer;
    struct etp__cuda_win *next;
};

#if ETP__CUDA_HAVE_WINDOWS

/* MIN over the ranks of `ok`, on the non-blocking communicator and bounded
 * by the timeout (at least min_s): when it returns, every rank of c is
 * here. */
static etp_status_t agree(etp__cuda_t *cb, etp__bcomm_t *c, int *ok, double min_s)
{
    int32_t *buf = NULL;
    cudaStream_t ws = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&buf, sizeof *buf);
    int32_t v = *ok;
    if (e == cudaSuccess) e = cudaMemcpy(buf, &v, sizeof v, cudaMemcpyHostToDevice);
    etp_status_t st = ETP_SUCCESS;
    if (e != cudaSuccess) {
        st = etp__err(ETP_ERR_BACKEND, "group '%s': window rendezvous: %s", c->name,
                      cudaGetErrorString(e));
    } else {
        ncclResult_t r = ncclAllReduce(buf, buf, 1, ncclInt32, ncclMin, c->nccl, ws);
        if (r != ncclSuccess && r != ncclInProgress)
            st = etp__err(ETP_ERR_BACKEND, "group '%s': window rendezvous: %s (%s)", c->name,
                          ncclGetErrorString(r), ncclGetLastError(c->nccl));
        if (st == ETP_SUCCESS)
            st = etp__cuda_nccl_wait(cb, &c->nccl, 1, "window rendezvous", min_s);
        if (st == ETP_SUCCESS) st = etp__cuda_wait_stream(cb, ws, "window rendezvous", NULL);
        if (st == ETP_SUCCESS && cudaMemcpy(&v, buf, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess)
            st = etp__err(ETP_ERR_BACKEND, "group '%s': window rendezvous: reading the result", c->name);
    }
    /* a rendezvous a peer never joined may leave NCCL's kernel waiting:
     * abort the communicators, and leave the 4 bytes to the process
     * (cudaFree would wait for the device) */
    if (st != ETP_SUCCESS) st = etp__cuda_fail(cb, st);
    if (buf && st == ETP_SUCCESS) cudaFree(buf);
    if (ws) cudaStreamDestroy(ws);
    *ok = v;
    return st;
}

static etp_status_t make_zero(etp__cuda_t *cb, etp__bcomm_t *c)
{
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    conf.blocking = 1;
    conf.commName = c->name;
    conf.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    ncclResult_t r = ncclCommSplit(c->nccl, 0, c->rank, &c->zero, &conf);
    if (r != ncclSuccess && r != ncclInProgress)
        return etp__err(ETP_ERR_BACKEND, "group '%s': splitting the copy-engine twin: %s (%s)",
                        c->name, ncclGetErrorString(r), ncclGetLastError(c->nccl));
    ETP__TRY(etp__cuda_nccl_wait(cb, &c->nccl, 1, "splitting the copy-engine twin",
                                 ETP__CUDA_SETUP_MIN_S));
    if (c->zero == NULL)
        return etp__err(ETP_ERR_INTERNAL, "group '%s': the copy-engine twin split returned none",
                        c->name);
    return ETP_SUCCESS;
}

/* The window's address on every rank (cuda_ce.c copies into them), read
 * once through NCCL's device API; kept only where every rank has them, so
 * that all take the same path. */
static etp_status_t win_peers(etp__cuda_t *cb, etp__bcomm_t *c, struct etp__cuda_win *w)
{
    const int R = c->size;
    int ok = etp__cuda_nvl_built() && etp__cuda_nvl_lsa_ranks(c->zero) == R;
    char **dev = NULL;
    cudaStream_t ws = NULL;
    if (ok) {
        w->peer = calloc((size_t)R, sizeof *w->peer);
        cudaError_t e = w->peer ? cudaMalloc((void **)&dev, (size_t)R * sizeof *dev)
                                : cudaErrorMemoryAllocation;
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = etp__cuda_nvl_peer_ptrs(w->win, R, dev, ws);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(w->peer, dev, (size_t)R * sizeof *dev, cudaMemcpyDeviceToHost, ws);
        if (e == cudaSuccess) e = cudaStreamSynchronize(ws);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            ETP__LOG(cb->base.log, ETP_LOG_INFO, ETP_SUBSYS_BACKEND,
                     "group '%s': the window's peer addresses: %s; per-call copy-engine "
                     "collectives",
                     c->name, cudaGetErrorString(e));
            ok = 0;
        }
        for (int q = 0; ok && q < R; q++) ok = w->peer[q] != NULL;
    }
    if (ws) (void)cudaStreamDestroy(ws);
    if (dev) (void)cudaFree(dev);
    etp_status_t st = agree(cb, c, &ok, ETP__CUDA_SETUP_MIN_S);
    if (st != ETP_SUCCESS || !ok) {
        free(w->peer);
        w->peer = NULL;
    }
    return st;
}

const void *etp__cuda_win_id(const etp__bcomm_t *c, const void *p, size_t bytes)
{
    const char *b = p;
    for (const struct etp__cuda_win *w = c->wins; w; w = w->next)
        if (b >= w->ptr && b + bytes <= w->ptr + w->bytes) return w->peer ? w : NULL;
    return NULL;
}

char *etp__cuda_win_peer(const void *win, const void *p, int peer)
{
    const struct etp__cuda_win *w = win;
    return w->peer[peer] + ((const char *)p - w->ptr);
}

etp_status_t etp__cuda_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, void **ptr,
                                 void **win)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    /* The same answer on every rank: these depend only on shared settings. */
    if (!cb->base.cfg.copy_engine || (bytes < ETP__CUDA_WIN_MIN_BYTES && !cb->base.test.window_any_size) ||
        c->size < 2 || c->nccl == NULL)
        return ETP_ERR_UNSUPPORTED;
    ETP__TRY(etp__cuda_set_device(cb));
    struct etp__cuda_win *w = calloc(1, sizeof *w);
    void *p = NULL;
    int ok = w != NULL && ncclMemAlloc(&p, bytes) == ncclSuccess;
    etp_status_t st = agree(cb, c, &ok, ETP__CUDA_SETUP_MIN_S);
    if (st != ETP_SUCCESS || !ok) {
        if (p) (void)ncclMemFree(p);
        free(w);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
        ETP__LOG(cb->base.log, ETP_LOG_INFO, ETP_SUBSYS_BACKEND,
                 "group '%s': a rank could not allocate a %zu-byte window; plain memory instead",
                 c->name, bytes);
        return ETP_ERR_UNSUPPORTED;
    }
    if (c->zero == NULL) st = make_zero(cb, c);
    if (st == ETP_SUCCESS) {
        ncclResult_t r = ncclCommWindowRegister(c->zero, p, bytes, &w->win, NCCL_WIN_COLL_SYMMETRIC);
        if (r != ncclSuccess)
            st = etp__err(ETP_ERR_BACKEND, "group '%s': ncclCommWindowRegister of %zu bytes: %s (%s)",
                          c->name, bytes, ncclGetErrorString(r), ncclGetLastError(c->zero));
    }
    if (st != ETP_SUCCESS) {
        (void)ncclMemFree(p);
        free(w);
        /* the ranks may now disagree about the communicators' state */
        return etp__cuda_fail(cb, st);
    }
    w->ptr = p;
    w->bytes = bytes;
    st = win_peers(cb, c, w);
    if (st != ETP_SUCCESS) {
        (void)ncclMemFree(p);
        free(w);
        return st; /* agree failed the backend */
    }
    w->next = c->wins;
    c->wins = w;
    *ptr = p;
    *win = w;
    return ETP_SUCCESS;
}

void etp__cuda_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    (void)etp__cuda_set_device(cb);
    struct etp__cuda_win *w = win;
    for (struct etp__cuda_win **pp = &c->wins; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    /* Deregistration is collective and blocking, like the registration:
     * frees happen at chain destruction, on every rank. A rank whose
     * context has aborted never comes (the abort released its windows with
     * its communicators), so the others first meet under the timeout; one
     * that times out aborts too instead of waiting in the deregistration
     * forever. */
    int here = 1;
    if (c->zero && !cb->base.failed) {
        etp_status_t st = agree(cb, c, &here, 0.0);
        if (st != ETP_SUCCESS) (void)etp__cuda_fail(cb, st);
    }
    if (c->zero && !cb->base.failed && here) {
        ncclResult_t r = ncclCommWindowDeregister(c->zero, w->win);
        if (r != ncclSuccess)
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "group '%s': ncclCommWindowDeregister: %s", c->name, ncclGetErrorString(r));
    }
    (void)ncclMemFree(ptr);
    free(w->peer);
    free(w);
}

etp_status_t etp__cuda_peer_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, int local_ok,
                                      int *agree_min, void **ptr, void **win, char *why,
                                      size_t why_bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    int version = 0;
    (void)ncclGetVersion(&version);
    int ok = local_ok;
    if (!local_ok)
        snprintf(why, why_bytes, "a user allocator is set (its memory cannot be registered)");
    if (ok && !etp__cuda_nvl_built())
        ok = 0, snprintf(why, why_bytes, "etp was built without NCCL's device API (nccl_device.h, NCCL >= 2.28.3)");
    if (ok && version < NCCL_VERSION(2, 28, 3))
        ok = 0, snprintf(why, why_bytes, "NCCL %d at run time (needs >= 2.28.3)", version);
    if (ok && c->size > etp__cuda_nvl_max_ranks())
        ok = 0, snprintf(why, why_bytes, "%d ranks (at most %d)", c->size, etp__cuda_nvl_max_ranks());
    if (ok && c->nccl == NULL) ok = 0, snprintf(why, why_bytes, "no communicator");
    if (ok && c->size == 1) {
        /* one rank: its own memory is all the window there is */
        cudaError_t e = cudaMalloc(ptr, bytes);
        if (e == cudaSuccess) e = cudaMemset(*ptr, 0, bytes);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) return etp__cuda_error("EP nvlink window of one rank", e);
        *win = NULL;
        return ETP_SUCCESS;
    }
    if (ok) {
        const int lsa = etp__cuda_nvl_lsa_ranks(c->nccl);
        if (lsa != c->size)
            ok = 0, snprintf(why, why_bytes,
                             "rank %d reaches %d of the group's %d ranks by peer stores (NCCL's LSA "
                             "team: one NVLink domain with peer access)", c->rank, lsa, c->size);
    }
    void *p = NULL;
    if (ok && ncclMemAlloc(&p, bytes) != ncclSuccess)
        ok = 0, snprintf(why, why_bytes, "ncclMemAlloc of %zu bytes failed", bytes);
    if (ok) {
        /* zeroed before the rendezvous: when any rank's kernel first stores
         * into it, every rank's flags start from 0 */
        cudaStream_t zs = NULL;
        cudaError_t e = cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes, zs);
        if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
        if (zs) (void)cudaStreamDestroy(zs);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            ok = 0, snprintf(why, why_bytes, "zeroing the window: %s", cudaGetErrorString(e));
        }
    }
    const int mine = ok;
    etp_status_t st = c->nccl ? agree(cb, c, &ok, ETP__CUDA_SETUP_MIN_S) : ETP_SUCCESS;
    if (st != ETP_SUCCESS || !ok) {
        if (p) (void)ncclMemFree(p);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
        if (mine) snprintf(why, why_bytes, "another rank of the group cannot (its log says why)");
        return ETP_ERR_UNSUPPORTED;
    }
    st = agree(cb, c, agree_min, ETP__CUDA_SETUP_MIN_S);
    if (st != ETP_SUCCESS) {
        (void)ncclMemFree(p);
        return st; /* agree failed the backend */
    }
    if (c->zero == NULL) st = make_zero(cb, c);
    ncclWindow_t w = NULL;
    if (st == ETP_SUCCESS) {
        ncclResult_t r = ncclCommWindowRegister(c->zero, p, bytes, &w, NCCL_WIN_COLL_SYMMETRIC);
        if (r != ncclSuccess)
            st = etp__err(ETP_ERR_BACKEND, "group '%s': ncclCommWindowRegister of %zu bytes: %s (%s)",
                          c->name, bytes, ncclGetErrorString(r), ncclGetLastError(c->zero));
    }
    if (st != ETP_SUCCESS) {
        (void)ncclMemFree(p);
        return etp__cuda_fail(cb, st);
    }
    *ptr = p;
    *win = w;
    return ETP_SUCCESS;
}

void etp__cuda_peer_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    (void)etp__cuda_set_device(cb);
    if (win == NULL) { /* one rank: plain memory */
        (void)cudaFree(ptr);
        return;
    }
    /* collective like the registration (etp__cuda_win_free says why the
     * rendezvous comes first) */
    int here = 1;
    if (c->zero && !cb->base.failed) {
        etp_status_t st = agree(cb, c, &here, 0.0);
        if (st != ETP_SUCCESS) (void)etp__cuda_fail(cb, st);
    }
    if (c->zero && !cb->base.failed && here) {
        ncclResult_t r = ncclCommWindowDeregister(c->zero, (ncclWindow_t)win);
        if (r != ncclSuccess)
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "group '%s': ncclCommWindowDeregister: %s", c->name, ncclGetErrorString(r));
    }
    (void)ncclMemFree(ptr);
}

static int in_window(const etp__bcomm_t *c, const void *p, size_t bytes)
{
    const char *b = p;
    for (const struct etp__cuda_win *w = c->wins; w; w = w->next)
        if (b >= w->ptr && b + bytes <= w->ptr + w->bytes) return 1;
    return 0;
}

ncclComm_t etp__cuda_ag_comm(const etp__bcomm_t *c, const void *send, const void *recv,
                             size_t bytes)
{
    /* Both buffers in windows (in place, the send buffer is in recv's): a
     * plain send buffer would get NCCL's kernels anyway, and an all-to-all
     * with one was seen to hang on the zero-CTA communicator. */
    const size_t per = bytes / (size_t)c->size;
    if (c->zero && in_window(c, recv, bytes) && in_window(c, send, per)) return c->zero;
    return etp__cuda_launch_comm(c);
}

ncclComm_t etp__cuda_a2a_comm(const etp__bcomm_t *c, const etp__coll_t *op)
{
    if (c->zero == NULL) return NULL;
    const size_t n = op->sendcounts[0];
    for (int p = 0; p < c->size; p++)
        if (op->sendcounts[p] != n || op->recvcounts[p] != n || op->sdispls[p] != (size_t)p * n ||
            op->rdispls[p] != (size_t)p * n)
            return NULL;
    const size_t bytes = n * (size_t)c->size * etp_dtype_size(op->dtype);
    if (bytes == 0 || !in_window(c, op->send, bytes) || !in_window(c, op->recv, bytes)) return NULL;
    return c->zero;
}

ncclResult_t etp__cuda_alltoall(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                ncclComm_t comm, cudaStream_t s)
{
    return ncclAlltoAll(send, recv, count, dt, comm, s);
}

#else /* NCCL without symmetric windows or the zero-CTA policy */

etp_status_t etp__cuda_peer_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, int local_ok,
                                      int *agree_min, void **ptr, void **win, char *why,
                                      size_t why_bytes)
{
    (void)be, (void)c, (void)bytes, (void)local_ok, (void)agree_min, (void)ptr, (void)win;
    snprintf(why, why_bytes, "etp was built with an NCCL older than 2.28 (no symmetric windows)");
    return ETP_ERR_UNSUPPORTED;
}

void etp__cuda_peer_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win)
{
    (void)be, (void)c, (void)ptr, (void)win;
}

etp_status_t etp__cuda_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, void **ptr,
                                 void **win)
{
    (void)be, (void)c, (void)bytes, (void)ptr, (void)win;
    return ETP_ERR_UNSUPPORTED;
}

void etp__cuda_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win)
{
    (void)be, (void)c, (void)ptr, (void)win;
}

ncclComm_t etp__cuda_ag_comm(const etp__bcomm_t *c, const void *send, const void *recv,
                             size_t bytes)
{
    (void)send, (void)recv, (void)bytes;
    return etp__cuda_launch_comm(c);
}

ncclComm_t etp__cuda_a2a_comm(const etp__bcomm_t *c, const etp__coll_t *op)
{
    (void)c, (void)op;
    return NULL;
}

ncclResult_t etp__cuda_alltoall(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                ncclComm_t comm, cudaStream_t s)
{
    (void)send, (void)recv, (void)count, (void)dt, (void)comm, (void)s;
    return ncclInvalidUsage;
}

#endif
