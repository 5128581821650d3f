/* The quant module's kernels: one table, implemented by each backend in
 * host/host_quant.c (the reference of quant/formats/quant_ref.c) and
 * cuda/cuda_quant.c (kernels/quant/). Owned by the quant module. */
#ifndef ETP__KERNELS_QUANT_H
#define ETP__KERNELS_QUANT_H

#include "backend.h"
#include "quant/formats/qf_batch.h"
#include "quant/formats/qf_swizzle.h"

struct etp__quant_kernels {
    /* Bytes of device scratch each quantizer keeps for its launches (0:
     * none), allocated at quantizer creation through the context allocator
     * and handed to workspace_init (which leaves it zeroed, synchronously)
     * and then to every run in batch->workspace. */
    size_t workspace_bytes;
    etp_status_t (*workspace_init)(etp__be_t *be, void *workspace);
    /* The number of multiprocessors launches should fill (kernels size their
     * grids to it), asked once at quantizer creation so that the launch path
     * makes no device query; NULL: the backend has none (batch->sms = 0).
     * *clusters (clusters may be NULL: not asked, left as it is): how many
     * thread-block clusters of the cast the device holds at once (0: none,
     * or the backend launches none). */
    etp_status_t (*launch_width)(etp__be_t *be, uint32_t *sms, uint32_t *clusters);
    /* Enqueue one batch (multi-amax, cast-only or dequantize of up to
     * ETP__QB_MAX tensors) on s. The batch is read before the call returns
     * (copied into the launch); the buffers it points to are used in stream
     * order. Allocates nothing on the CUDA backend. */
    etp_status_t (*run)(etp__be_t *be, etp__bstream_t *s, const etp__qbatch_t *batch);
    /* Enqueue one scale swizzle (or unswizzle) of up to ETP__QSWZ_MAX
     * matrices on s, one launch, under the same rules as run. */
    etp_status_t (*swizzle)(etp__be_t *be, etp__bstream_t *s, const etp__qswz_batch_t *batch);
};

#endif
