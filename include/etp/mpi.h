/*
 * etp/mpi.h - bootstrap a context from an MPI communicator.
 *
 * Available when etp was built with MPI (ETP_WITH_MPI; etp_config.h defines
 * ETP_HAVE_MPI). Include <mpi.h> is done here; link MPI as usual.
 */
#ifndef ETP_MPI_H
#define ETP_MPI_H

#include <mpi.h>

#include "etp/context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Create this rank's context over the ranks of `comm`. Collective over comm.
 * The communicator is borrowed: etp duplicates what it needs and never frees
 * `comm`; MPI must stay initialized until the context is destroyed.
 * Backend AUTO picks CUDA when it is built in and a GPU is visible, else host.
 * For the CUDA backend, MPI only carries the NCCL unique id.
 * Errors: ETP_ERR_INVALID_ARGUMENT (comm is MPI_COMM_NULL, ctx NULL, a config
 * of the wrong size), ETP_ERR_INVALID_STATE (MPI not initialized),
 * ETP_ERR_UNSUPPORTED (the backend is not built in), ETP_ERR_TIMEOUT,
 * ETP_ERR_BACKEND. */
ETP_API etp_status_t etp_context_create_mpi(MPI_Comm comm, const etp_context_config_t *config,
                                            etp_context_t **ctx);

#ifdef __cplusplus
}
#endif

#endif /* ETP_MPI_H */
