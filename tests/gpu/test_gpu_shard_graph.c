/* The graphed-chain capture test on the CUDA backend (1 and 2 GPUs): the
 * program of tests/mpi/test_shard_graph.c, captured with CUDA graphs. */
#include <cuda_runtime_api.h>

#define ETP_SHARD_TEST_CUDA 1
#include "gpu_util.h"
#include "../mpi/test_shard_graph.c"
