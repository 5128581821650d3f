/* CUDA kernels of the ep module (launchers for kernels/ep/). */
#include "../kernels_ep.h"
#include "cuda_internal.h"

const etp__ep_kernels_t etp__cuda_ep_kernels = {0};
