/* The shard module's kernels: one table, implemented by each backend in
 * host/host_shard.c (the reference) and cuda/cuda_shard.c. */
#ifndef ETP__KERNELS_SHARD_H
#define ETP__KERNELS_SHARD_H

#include "backend.h"

/* A batch of `experts` matrices of [rows, cols], expert e starting at
 * e * stride elements; only the first `valid_rows` rows of each count. */
typedef struct etp__shard_geom {
    int64_t experts, rows, cols, valid_rows, stride;
} etp__shard_geom_t;

struct etp__shard_kernels {
    /* dst[e*g.stride + i] = fmaf(scale, x, dst[e*g.stride + i]) for the valid
     * elements i < g.valid_rows * g.cols of each expert e, where x is the sum
     * in FP32, in order r = 0 .. nsrc-1, of float(src[e*src_estride +
     * r*src_rstride + i]) (src F32 or BF16): the main_grad accumulation of
     * the ranks' chunks of a wgrad, in rank order. store: dst is not read,
     * as if it held +0 (fmaf(scale, x, +0): a deferred zero_grad). */
    etp_status_t (*accumulate)(etp__be_t *be, etp__bstream_t *s, float *dst, const void *src,
                               etp_dtype_t src_dtype, etp__shard_geom_t g, int nsrc,
                               int64_t src_rstride, int64_t src_estride, float scale, int store);
    /* dst (dtype) from src (F32 or BF16) over the valid rows, converting;
     * rows past valid are zeroed: shard loads and the master copy. */
    etp_status_t (*convert_rows)(etp__be_t *be, etp__bstream_t *s, void *dst, etp_dtype_t dst_dtype,
                                 int64_t dst_stride, const void *src, etp_dtype_t src_dtype,
                                 int64_t src_stride, int64_t src_ld, etp__shard_geom_t g);
    /* rows x width bytes from src (pitch spitch) to dst (pitch dpitch): the
     * re-lay of gathered quantized data and scales. */
    etp_status_t (*copy2d)(etp__be_t *be, etp__bstream_t *s, void *dst, size_t dpitch,
                           const void *src, size_t spitch, size_t width, size_t rows);
    /* out[0] += sum of x^2 over finite valid elements (in FP64), out[1] +=
     * count of NaN/Inf valid elements. */
    etp_status_t (*grad_stats)(etp__be_t *be, etp__bstream_t *s, const float *x,
                               etp__shard_geom_t g, double *out);
};

#endif
