/*
 * Dequantize: the codes and scales of one direction back to BF16 or FP32
 * (the reference's etp__qref_dequantize), one launch for the batch.
 */
#include "qk_common.cuh"

namespace etp__qk {
namespace {

constexpr uint32_t kDequantChunk = 4096; /* elements per dequantize block */

__global__ void __launch_bounds__(kThreads) dequant_kernel(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    uint32_t local;
    const uint32_t k = find_tensor(p, blockIdx.x, &local);
    const etp__qb_tensor_t &t = b.t[k];
    const size_t M = t.rows, K = t.cols, count = M * K;
    const bool col = b.direction == 2;
    const uint8_t *data = static_cast<const uint8_t *>(col ? t.col_data : t.row_data);
    const uint8_t *scales = static_cast<const uint8_t *>(col ? t.col_scales : t.row_scales);
    const size_t begin = (size_t)local * kDequantChunk;
    const size_t end = begin + kDequantChunk < count ? begin + kDequantChunk : count;
    if (b.format == ETP__QB_NVFP4) {
        const float s_dec = 1.0f / etp__qf_nvfp4_s_enc(b.amax[b.first + k]);
        const etp__qf_scale_shape_t ss =
            col ? etp__qf_nvfp4_col_scales(M, K) : etp__qf_nvfp4_row_scales(M, K);
        for (size_t e = begin + threadIdx.x; e < end; e += kThreads) {
            const size_t i = e / K, j = e % K;
            const size_t r = col ? j : i, c = col ? i : j, ld = col ? M : K;
            const uint8_t q = (uint8_t)((data[r * (ld / 2) + c / 2] >> (4 * (c % 2))) & 0xfu);
            const uint8_t sc = scales[etp__qf_scale_offset(r, c / 16, ss.cols, b.swizzle)];
            const float v = etp__qf_nvfp4_decode(q, sc, s_dec);
            if (t.dtype == ETP__QB_BF16)
                static_cast<uint16_t *>(t.y)[e] = etp__qf_f32_to_bf16(v);
            else
                static_cast<float *>(t.y)[e] = v;
        }
    } else {
        const etp__qf_scale_shape_t ss =
            col ? etp__qf_mxfp8_col_scales(M, K) : etp__qf_mxfp8_row_scales(M, K);
        for (size_t e = begin + threadIdx.x; e < end; e += kThreads) {
            const size_t i = e / K, j = e % K;
            const size_t off = col ? etp__qf_mxfp8_col_scale_offset(i / 32, j, ss, b.swizzle)
                                   : etp__qf_scale_offset(i, j / 32, ss.cols, b.swizzle);
            const float v = etp__qf_mxfp8_decode(data[e], scales[off], (int)b.e5m2);
            if (t.dtype == ETP__QB_BF16)
                static_cast<uint16_t *>(t.y)[e] = etp__qf_f32_to_bf16(v);
            else
                static_cast<float *>(t.y)[e] = v;
        }
    }
}

} // namespace

cudaError_t launch_dequant(cudaStream_t s, const etp__qbatch_t *batch, Params &p)
{
    const uint64_t total = plan_units(batch, &p, [&](uint32_t k) -> uint64_t {
        return ((uint64_t)batch->t[k].rows * batch->t[k].cols + kDequantChunk - 1) / kDequantChunk;
    });
    if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    if (total == 0) return cudaSuccess;
    void *args[] = {&p};
    return cudaLaunchKernel((const void *)dequant_kernel, dim3((unsigned)total), dim3(kThreads), args, 0, s);
}

} // namespace etp__qk
