/* CUDA kernels of the quant module (launchers for kernels/quant/). */
#include "../kernels_quant.h"
#include "cuda_internal.h"

const etp__quant_kernels_t etp__cuda_quant_kernels = {0};
