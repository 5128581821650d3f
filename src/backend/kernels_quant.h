/* The quant module's kernels: one table, implemented by each backend in
 * host/host_quant.c and cuda/cuda_quant.c. Owned by the quant module. */
#ifndef ETP__KERNELS_QUANT_H
#define ETP__KERNELS_QUANT_H

#include "backend.h"

struct etp__quant_kernels {
    int placeholder; /* replaced by the module's kernels */
};

#endif
