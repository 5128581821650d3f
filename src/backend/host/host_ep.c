/* Host kernels of the ep module. */
#include "../kernels_ep.h"
#include "host_internal.h"

const etp__ep_kernels_t etp__host_ep_kernels = {0};
