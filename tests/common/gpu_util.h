/* GPU tests' gate. A GPU test runs one rank per GPU; where a node has fewer
 * GPUs than ranks (none, or one for an _np2 test) it cannot run, and says so
 * with CTest's skip code instead of passing vacuously (every case skipped) or
 * failing in NCCL (two ranks on one device). Every rank calls it after
 * MPI_Init, and all of them agree. */
#ifndef ETP_TEST_GPU_UTIL_H
#define ETP_TEST_GPU_UTIL_H

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdio.h>

/* tests/CMakeLists.txt gives every test labelled gpu SKIP_RETURN_CODE 77 */
#define TU_SKIP_CODE 77

/* Nonzero (on every rank) when some node has fewer visible GPUs than ranks;
 * rank 0 then prints why. */
static inline int tu_gpu_short(const char *name)
{
    int rank = 0, local = 1, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    int enough = n >= local, all = 0;
    MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all && rank == 0) {
        printf("%s: skipped: %d rank(s) on a node need a GPU each, %d visible here\n", name, local, n);
        fflush(stdout);
    }
    return !all;
}

/* The exit of a skipped test: every rank, after MPI_Init. */
static inline int tu_gpu_skip(void)
{
    MPI_Finalize();
    return TU_SKIP_CODE;
}

#endif
