/* The quantized-gather tests on the CUDA backend (1 and 2 GPUs): the same
 * program and host-reference comparison as tests/mpi/test_shard_quant.c. */
#include <cuda_runtime_api.h>

#define ETP_SHARD_TEST_CUDA 1
#include "gpu_util.h"
#include "../mpi/test_shard_quant.c"
