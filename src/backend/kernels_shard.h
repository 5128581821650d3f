/* The shard module's kernels: one table, implemented by each backend in
 * host/host_shard.c and cuda/cuda_shard.c. Owned by the shard module. */
#ifndef ETP__KERNELS_SHARD_H
#define ETP__KERNELS_SHARD_H

#include "backend.h"

struct etp__shard_kernels {
    int placeholder; /* replaced by the module's kernels */
};

#endif
