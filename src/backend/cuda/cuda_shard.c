/* CUDA kernels of the shard module: launchers for kernels/shard/. */
#include "../kernels_shard.h"
#include "cuda_internal.h"
#include "kernels/shard/shard_kernels.h"

static etp_status_t launched(const char *what, cudaError_t e)
{
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the next launch must not report it */
        return etp__err(ETP_ERR_BACKEND, "%s kernel launch: %s", what, cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

static etp_status_t cuda_accumulate(etp__be_t *be, etp__bstream_t *s, float *dst, const void *src,
                                    etp_dtype_t src_dtype, etp__shard_geom_t g, int nsrc,
                                    int64_t src_rstride, int64_t src_estride, float scale, int store)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched("shard accumulate",
                    etp__cuda_shard_accumulate(cs, dst, src, src_dtype == ETP_DTYPE_BF16, g.experts,
                                               g.valid_rows * g.cols, g.stride, nsrc, src_rstride,
                                               src_estride, scale, store));
}

static etp_status_t cuda_convert_rows(etp__be_t *be, etp__bstream_t *s, void *dst,
                                      etp_dtype_t dst_dtype, int64_t dst_stride, const void *src,
                                      etp_dtype_t src_dtype, int64_t src_stride, int64_t src_ld,
                                      etp__shard_geom_t g)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched("convert_rows",
                    etp__cuda_convert_rows(cs, dst, dst_dtype == ETP_DTYPE_BF16, dst_stride, src,
                                           src_dtype == ETP_DTYPE_BF16, src_stride, src_ld,
                                           g.experts, g.rows, g.cols, g.valid_rows));
}

static etp_status_t cuda_grad_stats(etp__be_t *be, etp__bstream_t *s, const float *x,
                                    etp__shard_geom_t g, double *out)
{
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    return launched("grad_stats", etp__cuda_grad_stats(cs, x, g.experts, g.valid_rows * g.cols,
                                                       g.stride, out));
}

static etp_status_t cuda_copy2d(etp__be_t *be, etp__bstream_t *s, void *dst, size_t dpitch,
                                const void *src, size_t spitch, size_t width, size_t rows)
{
    if (width == 0 || rows == 0) return ETP_SUCCESS;
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, s, &cs));
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "cudaMemcpy2DAsync: %s", cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

const etp__shard_kernels_t etp__cuda_shard_kernels = {
    .copy2d = cuda_copy2d,
    .accumulate = cuda_accumulate,
    .convert_rows = cuda_convert_rows,
    .grad_stats = cuda_grad_stats,
};
