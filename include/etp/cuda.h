/*
 * etp/cuda.h - CUDA and NCCL interoperation.
 *
 * Available when etp was built with CUDA (etp_config.h defines
 * ETP_HAVE_CUDA). Includes the CUDA runtime and NCCL headers.
 */
#ifndef ETP_CUDA_H
#define ETP_CUDA_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "etp/context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Create a context on the CUDA backend over the ranks of `comm`, an NCCL
 * communicator the caller owns. Collective over comm. The communicator is
 * borrowed: etp only splits its own (non-blocking) communicators from it and
 * never issues work on it or destroys it. config->backend must be AUTO or
 * CUDA; config->device -1 uses the communicator's device.
 * Errors: ETP_ERR_INVALID_ARGUMENT, ETP_ERR_TIMEOUT, ETP_ERR_BACKEND. */
ETP_API etp_status_t etp_context_create_nccl(ncclComm_t comm, const etp_context_config_t *config,
                                             etp_context_t **ctx);

/* Wrap a cudaStream_t the caller owns (NULL or cudaStreamPerThread are
 * refused: etp needs a real stream to order against). etp_stream_destroy()
 * releases the wrapper only. Work etp enqueues on it orders with the caller's
 * own kernels (cuBLASLt GEMMs) on that stream. The native stream must
 * outlive the wrapper: the context's waits query it. */
ETP_API etp_status_t etp_stream_wrap_cuda(etp_context_t *ctx, cudaStream_t native,
                                          etp_stream_t **stream);

/* The cudaStream_t behind an etp stream of a CUDA context. */
ETP_API etp_status_t etp_stream_get_cuda(const etp_stream_t *stream, cudaStream_t *native);

/* The CUDA device of a CUDA context. */
ETP_API etp_status_t etp_context_cuda_device(const etp_context_t *ctx, int *device);

#ifdef __cplusplus
}
#endif

#endif /* ETP_CUDA_H */
