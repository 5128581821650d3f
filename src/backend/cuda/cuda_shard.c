/* CUDA kernels of the shard module (launchers for kernels/shard/). */
#include "../kernels_shard.h"
#include "cuda_internal.h"

const etp__shard_kernels_t etp__cuda_shard_kernels = {0};
