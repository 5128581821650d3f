/* Host reference kernels: the oracle the CUDA kernels are tested against. */
#include <math.h>

#include "host_internal.h"

void etp__host_axpy_f32_ref(size_t n, float alpha, const float *x, float *y)
{
    /* fmaf, so the result is the one rounding the CUDA kernel's FFMA makes. */
    for (size_t i = 0; i < n; i++) y[i] = fmaf(alpha, x[i], y[i]);
}
