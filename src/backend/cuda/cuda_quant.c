/* CUDA kernels of the quant module (launchers for kernels/quant/). */
#include "../kernels_quant.h"
#include "cuda_internal.h"
#include "kernels/quant/quant_kernels.h"
#include "kernels/quant/swizzle.h"

static etp_status_t cuda_quant_workspace_init(etp__be_t *be, void *ws)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    /* on the legacy stream, waited for: the quantizer is created (never
     * under capture) before any launch of it can be enqueued */
    cudaError_t e = cudaMemset(ws, 0, ETP__CUDA_QUANT_WORKSPACE_BYTES);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (e != cudaSuccess)
        return etp__err(ETP_ERR_BACKEND, "quantizer workspace: %s", cudaGetErrorString(e));
    return ETP_SUCCESS;
}

/* The multiprocessor count of the context's device and (clusters
 * non-NULL) how many of the cast's thread-block clusters it holds at once
 * (0: none fits), asked once per quantizer (a device query on every
 * launch would cost host time). */
static etp_status_t cuda_quant_launch_width(etp__be_t *be, uint32_t *sms, uint32_t *clusters)
{
    const int dev = etp__cuda_of(be)->device;
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    int n = 0;
    cudaError_t e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return etp__err(ETP_ERR_BACKEND, "quantizer: multiprocessor count of device %d: %s", dev,
                        cudaGetErrorString(e));
    if (clusters) e = etp__cuda_quant_cluster_fit(clusters);
    if (e != cudaSuccess)
        return etp__err(ETP_ERR_BACKEND, "quantizer: thread-block clusters on device %d: %s", dev,
                        cudaGetErrorString(e));
    *sms = n > 0 ? (uint32_t)n : 0;
    return ETP_SUCCESS;
}

static etp_status_t cuda_quant_run(etp__be_t *be, etp__bstream_t *s, const etp__qbatch_t *b)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    cudaError_t e = etp__cuda_quant_launch(cs, b);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the next launch must not report it */
        return etp__err(ETP_ERR_BACKEND, "quant kernel launch (op %u, %u tensors): %s", b->op, b->n,
                        cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

static etp_status_t cuda_quant_swizzle(etp__be_t *be, etp__bstream_t *s, const etp__qswz_batch_t *b)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    cudaError_t e = etp__cuda_swizzle_launch(cs, b);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "scale %s kernel launch (%u matrices): %s",
                        b->unswizzle ? "unswizzle" : "swizzle", b->n, cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

const etp__quant_kernels_t etp__cuda_quant_kernels = {
    .workspace_bytes = ETP__CUDA_QUANT_WORKSPACE_BYTES,
    .workspace_init = cuda_quant_workspace_init,
    .launch_width = cuda_quant_launch_width,
    .run = cuda_quant_run,
    .swizzle = cuda_quant_swizzle,
};
