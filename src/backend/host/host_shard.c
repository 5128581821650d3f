/* Host kernels of the shard module. */
#include "../kernels_shard.h"
#include "host_internal.h"

const etp__shard_kernels_t etp__host_shard_kernels = {0};
