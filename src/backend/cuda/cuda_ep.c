/* CUDA kernels of the ep module: launchers for kernels/ep/ (the host
 * reference is host/host_ep.c), and pinned host memory for the layers'
 * counter mirrors. */
#include "../kernels_ep.h"
#include "cuda_internal.h"
#include "kernels/ep/ep_kernels.h"

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

static etp_status_t cuda_pinned_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
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
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
};
