/*
 * The scale swizzle kernel (etp_quant_swizzle_scales), C-callable: scale
 * matrices between row-major and cuBLASLt's 128x4-tiled order. The CUDA
 * backend reaches it through its quant kernel table.
 */
#ifndef ETP__KERNELS_QUANT_SWIZZLE_H
#define ETP__KERNELS_QUANT_SWIZZLE_H

#include <cuda_runtime_api.h>

#include "quant/formats/qf_swizzle.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue one batch on stream s: ONE kernel launch for all of its matrices
 * (the batch is a kernel parameter; nothing is allocated, the host is not
 * synchronized, so it can be captured in a CUDA graph). The result equals
 * the host reference (etp__qref_run_swizzle) byte for byte. Returns the
 * launch status (cudaErrorInvalidValue for a batch the launcher cannot
 * describe: more than ETP__QSWZ_MAX matrices, or a shape that is not a
 * scale matrix). */
cudaError_t etp__cuda_swizzle_launch(cudaStream_t s, const etp__qswz_batch_t *batch);

#ifdef __cplusplus
}
#endif

#endif /* ETP__KERNELS_QUANT_SWIZZLE_H */
