/* CUDA kernels of the ep module: launchers for kernels/ep/ (the host
 * reference is host/host_ep.c), pinned host memory for the layers' counter
 * mirrors, and the NVLink transport's windows: their memory, their peers'
 * addresses, their device counters and the fault words their kernels write
 * when a peer never comes (reported by every wait of the backend). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels_ep.h"
#include "cuda_internal.h"
#include "kernels/ep/ep_kernels.h"
#include "kernels/ep/ll_kernels.h"
#include "kernels/ep/nvl_kernels.h"

/* One NVLink transport window. */
struct etp__cuda_nvl {
    void *mem;           /* the window's memory (ncclMemAlloc) */
    void *win;           /* its ncclWindow_t */
    char **peers;        /* device: [R] addresses */
    uint64_t *calls;     /* device: the call counters */
    int64_t *fault;      /* pinned, host-mapped: the kernels' fault words */
    char name[64];       /* the EP group's */
    int rank, ranks;
    double timeout_s;
    struct etp__cuda_nvl *next;
};

static const char *nvl_call_name(int64_t call)
{
    switch (call) {
    case ETP__EP_NVL_DISPATCH: return "dispatch";
    case ETP__EP_NVL_COMBINE: return "combine";
    case ETP__EP_NVL_DISPATCH_BWD: return "dispatch_bwd";
    case ETP__EP_NVL_COMBINE_BWD: return "combine_bwd";
    case ETP__EP_NVL_COMBINE_BWD_WEIGHTS: return "combine_bwd (weight gradients)";
    case ETP__EP_NVL_PREPARE: return "prepare";
    case ETP__EP_NVL_LL_DISPATCH: return "low-latency dispatch";
    case ETP__EP_NVL_LL_COMBINE: return "low-latency combine";
    default: return "an EP call";
    }
}

etp_status_t etp__cuda_nvl_faults(etp__cuda_t *cb)
{
    for (struct etp__cuda_nvl *n = cb->nvls; n; n = n->next) {
        const volatile int64_t *f = n->fault;
        if (f[0] == 0) continue;
        etp__err(ETP_ERR_TIMEOUT,
                 "EP group '%s' (rank %d of %d): its %s kernel waited more than %.1f s for rank "
                 "%lld %s (nvlink transport); communicators aborted",
                 n->name, n->rank, n->ranks, nvl_call_name(f[1]), n->timeout_s / 2,
                 (long long)(f[0] - 1),
                 f[2] == ETP__EP_NVL_WAIT_RELEASE ? "to release its receive slabs"
                 : f[2] == ETP__EP_NVL_WAIT_LOCAL ? "(itself) to pre-sum its rows: its blocks "
                                                    "could not all run"
                                                  : "to store its rows");
        return etp__cuda_fail(cb, ETP_ERR_TIMEOUT);
    }
    return ETP_SUCCESS;
}

static void nvl_free(etp__cuda_t *cb, etp__bcomm_t *c, struct etp__cuda_nvl *n)
{
    if (n->peers) (void)cudaFree(n->peers);
    if (n->calls) (void)cudaFree(n->calls);
    if (n->fault) (void)cudaFreeHost(n->fault);
    if (n->mem) etp__cuda_peer_win_free(&cb->base, c, n->mem, n->win);
    free(n);
}

static etp_status_t cuda_nvl_open(etp__be_t *be, etp__bcomm_t *c, const char *name, size_t bytes,
                                  int num_sms, int local_ok, etp__ep_nvl_t *nvl, void **local,
                                  void **handle, char *why, size_t why_bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    struct etp__cuda_nvl *n = calloc(1, sizeof *n);
    if (!n) return etp__err(ETP_ERR_OUT_OF_MEMORY, "EP group '%s': out of host memory", name);
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cb->device);
    if (e != cudaSuccess) {
        free(n);
        return etp__cuda_error("EP nvlink window: the device's SM count", e);
    }
    /* Every block of a kernel must be resident at once (they wait for each
     * other), and every rank must run as many (the flags count blocks): a
     * num_sms past this device's SMs is refused, and the default (24, or
     * fewer SMs) is agreed as the group's smallest. */
    int blocks = num_sms > 0 ? num_sms : (sms < 24 ? sms : 24);
    if (num_sms == ETP__EP_NVL_HALF_SMS) blocks = sms > 1 ? sms / 2 : 1;
    if (local_ok && blocks > sms) {
        local_ok = 0;
        snprintf(why, why_bytes, "num_sms %d exceeds rank %d's device's %d SMs", num_sms, c->rank,
                 sms);
    }
    etp_status_t st = etp__cuda_peer_win_alloc(be, c, bytes, local_ok, &blocks, &n->mem, &n->win,
                                               why, why_bytes);
    if (st != ETP_SUCCESS) {
        free(n);
        return st;
    }
    const int R = c->size;
    e = cudaMalloc((void **)&n->peers, (size_t)R * sizeof(char *));
    if (e == cudaSuccess) e = cudaMalloc((void **)&n->calls, 2 * sizeof(uint64_t));
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&n->fault, 4 * sizeof(int64_t), cudaHostAllocMapped);
    cudaStream_t ws = NULL;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(n->calls, 0, 2 * sizeof(uint64_t), ws);
    if (e == cudaSuccess && n->win == NULL) /* one rank: its own memory */
        e = cudaMemcpyAsync(n->peers, &n->mem, sizeof(char *), cudaMemcpyHostToDevice, ws);
    else if (e == cudaSuccess)
        e = etp__cuda_nvl_peer_ptrs(n->win, R, n->peers, ws);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ws);
    if (ws) (void)cudaStreamDestroy(ws);
    if (e != cudaSuccess) {
        st = etp__cuda_error("EP nvlink window setup", e);
        nvl_free(cb, c, n);
        return st;
    }
    memset((void *)n->fault, 0, 4 * sizeof(int64_t));
    snprintf(n->name, sizeof n->name, "%s", name);
    n->rank = c->rank;
    n->ranks = R;
    n->timeout_s = cb->base.cfg.timeout_s;
    nvl->peers = n->peers;
    nvl->calls = n->calls;
    nvl->fault = n->fault;
    /* half the timeout: a host wait on the kernel (bounded by the whole,
     * and begun no earlier than the kernel was enqueued) then finds the
     * fault and names the peer, instead of timing out on its own */
    nvl->timeout_ns = cb->base.cfg.timeout_s > 0 ? (int64_t)(cb->base.cfg.timeout_s * 0.5e9) : 0;
    nvl->blocks = blocks;
    nvl->wide_blocks = 2 * sms;
    nvl->me = c->rank;
    nvl->ranks = R;
    n->next = cb->nvls;
    cb->nvls = n;
    *local = n->mem;
    *handle = n;
    return ETP_SUCCESS;
}

static void cuda_nvl_close(etp__be_t *be, etp__bcomm_t *c, void *handle)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    struct etp__cuda_nvl *n = handle;
    if (!n) return;
    (void)etp__cuda_set_device(cb);
    /* nothing enqueued may still use it (like etp_mem_free) */
    if (!cb->base.failed) (void)be->ops->device_sync(be);
    for (struct etp__cuda_nvl **pp = &cb->nvls; *pp; pp = &(*pp)->next)
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    nvl_free(cb, c, n);
}

static etp_status_t launched(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return ETP_SUCCESS;
    (void)cudaGetLastError(); /* a launch error is not sticky: clear it */
    return etp__err(ETP_ERR_BACKEND, "EP kernel %s: %s", what, cudaGetErrorString(e));
}

#define CUDA_LAUNCHER(name, type)                                                   \
    static etp_status_t cuda_##name(etp__be_t *be, etp__bstream_t *s, const type *a) \
    {                                                                               \
        cudaStream_t cs;                                                            \
        ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));                          \
        return launched(etp__cuda_ep_##name(cs, a), #name);                         \
    }

CUDA_LAUNCHER(route, etp__ep_route_args_t)
CUDA_LAUNCHER(clip, etp__ep_clip_args_t)
CUDA_LAUNCHER(layout, etp__ep_layout_args_t)
CUDA_LAUNCHER(pack, etp__ep_pack_args_t)
CUDA_LAUNCHER(expand, etp__ep_expand_args_t)
CUDA_LAUNCHER(presum, etp__ep_presum_args_t)
CUDA_LAUNCHER(reduce, etp__ep_reduce_args_t)
CUDA_LAUNCHER(wgrad, etp__ep_wgrad_args_t)
CUDA_LAUNCHER(wscatter, etp__ep_wscatter_args_t)

static etp_status_t cuda_nvl_t2e(etp__be_t *be, etp__bstream_t *s, const etp__ep_t2e_args_t *a,
                                 int phase)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched(etp__cuda_nvl_t2e(cs, a, phase), "nvlink token-to-expert");
}

static etp_status_t cuda_nvl_e2t(etp__be_t *be, etp__bstream_t *s, const etp__ep_e2t_args_t *a,
                                 int phase)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched(etp__cuda_nvl_e2t(cs, a, phase), "nvlink expert-to-token");
}

static etp_status_t cuda_nvl_prepare(etp__be_t *be, etp__bstream_t *s, const etp__ep_xchg_args_t *a)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched(etp__cuda_nvl_prepare(cs, a), "nvlink prepare");
}

static etp_status_t cuda_ll_dispatch(etp__be_t *be, etp__bstream_t *s, const etp__ep_ll_args_t *a)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched(etp__cuda_ll_dispatch(cs, a), "low-latency dispatch");
}

static etp_status_t cuda_pinned_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    void *p = NULL;
    /* mapped: kernels write the report mirror there directly (with unified
     * addressing, at the host pointer) */
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "EP: cudaHostAlloc of %zu bytes: %s", bytes,
                        cudaGetErrorString(e));
    }
    *ptr = p;
    return ETP_SUCCESS;
}

static void cuda_pinned_free(etp__be_t *be, void *ptr)
{
    if (etp__cuda_set_device(etp__cuda_of(be)) == ETP_SUCCESS) (void)cudaFreeHost(ptr);
}

const etp__ep_kernels_t etp__cuda_ep_kernels = {
    .route = cuda_route,
    .clip = cuda_clip,
    .layout = cuda_layout,
    .pack = cuda_pack,
    .expand = cuda_expand,
    .presum = cuda_presum,
    .reduce = cuda_reduce,
    .wgrad = cuda_wgrad,
    .wscatter = cuda_wscatter,
    .nvl_open = cuda_nvl_open,
    .nvl_close = cuda_nvl_close,
    .nvl_t2e = cuda_nvl_t2e,
    .nvl_e2t = cuda_nvl_e2t,
    .nvl_prepare = cuda_nvl_prepare,
    .ll_dispatch = cuda_ll_dispatch,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
};
