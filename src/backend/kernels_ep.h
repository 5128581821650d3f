/* The ep module's kernels: one table, implemented by each backend in
 * host/host_ep.c and cuda/cuda_ep.c. Owned by the ep module. */
#ifndef ETP__KERNELS_EP_H
#define ETP__KERNELS_EP_H

#include "backend.h"

struct etp__ep_kernels {
    int placeholder; /* replaced by the module's kernels */
};

#endif
