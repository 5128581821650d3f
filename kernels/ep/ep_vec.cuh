/*
 * The vector element moves that kernels/ep/ep.cu and kernels/ep/nvl.cu
 * share: 16 loaded bytes as FP32 values, and FP32 values stored as BF16
 * with one wide store. They only move values; every rounding is the codec's
 * (quant/formats/qf_codec.h), as ep_rules.h's element stores. Loads of rows
 * stay in each kernel file: ep.cu reads through the read-only cache, nvl.cu
 * cannot (its slabs are written by peers during the kernel). Device C++.
 */
#ifndef ETP__EP_VEC_CUH
#define ETP__EP_VEC_CUH

#include <stdint.h>

#include "ep/ep_rules.h"

namespace etp_ep_vec {

/* 16 bytes of input as V = 8 BF16 or 4 FP32 values. */
template <int V>
__device__ __forceinline__ void unpack16(uint4 v, float *x)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (V == 8) {
            x[2 * j] = etp__qf_bf16_to_f32((uint16_t)(w[j] & 0xffffu));
            x[2 * j + 1] = etp__qf_bf16_to_f32((uint16_t)(w[j] >> 16));
        } else {
            x[j] = __uint_as_float(w[j]);
        }
    }
}

/* V FP32 values rounded to BF16 and stored with one 8- or 16-byte store
 * (dst aligned to it). */
template <int V>
__device__ __forceinline__ void store_bf16(uint16_t *dst, const float *x)
{
    uint32_t w[V / 2];
#pragma unroll
    for (int q = 0; q < V / 2; q++)
        w[q] = (uint32_t)etp__qf_f32_to_bf16(x[2 * q]) | (uint32_t)etp__qf_f32_to_bf16(x[2 * q + 1]) << 16;
    if constexpr (V == 8)
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    else
        *reinterpret_cast<uint2 *>(dst) = make_uint2(w[0], w[1]);
}

} // namespace etp_ep_vec

#endif /* ETP__EP_VEC_CUH */
