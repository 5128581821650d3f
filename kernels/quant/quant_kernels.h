/*
 * The quant module's CUDA kernels (multi-amax, NVFP4 and MXFP8 cast-only in
 * both directions with optional scale swizzle, dequantize), C-callable. The
 * CUDA backend reaches them through its quant kernel table.
 */
#ifndef ETP__KERNELS_QUANT_KERNELS_H
#define ETP__KERNELS_QUANT_KERNELS_H

#include <cuda_runtime_api.h>

#include "quant/formats/qf_batch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch of one quantizer (batch->workspace): per tensor slot of a
 * launch, the running amax (as bits) and a count of finished blocks, both
 * returned to zero by the last block of the tensor. */
#define ETP__CUDA_QUANT_WORKSPACE_BYTES (2u * ETP__QB_MAX * sizeof(unsigned int))

/* Enqueue one batch on stream s: one kernel launch for all of its tensors
 * (the batch is a kernel parameter; nothing is allocated; launches
 * sharing a workspace must be stream-ordered, the host is not
 * synchronized, so it can be captured in a CUDA graph). The result equals
 * the host reference (quant/formats/quant_ref.c) bit for bit. Returns the
 * launch status. */
cudaError_t etp__cuda_quant_launch(cudaStream_t s, const etp__qbatch_t *batch);

/* *clusters: how many thread-block clusters of the NVFP4 cast (16x16
 * blocks, row-major scales) the current device holds at once, 0 where it
 * fits none (the cast then launches no clusters). A device query: asked
 * once per quantizer, never on the launch path. */
cudaError_t etp__cuda_quant_cluster_fit(uint32_t *clusters);

#ifdef __cplusplus
}
#endif

#endif /* ETP__KERNELS_QUANT_KERNELS_H */
