/* Host kernels of the quant module. */
#include "../kernels_quant.h"
#include "host_internal.h"

const etp__quant_kernels_t etp__host_quant_kernels = {0};
