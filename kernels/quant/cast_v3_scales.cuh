/*
 * The v3 cast (cast_v3.cu, which alone includes this): a tile's and a
 * run's scales out of shared memory.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_SCALES_CUH
#define ETP__KERNELS_QUANT_CAST_V3_SCALES_CUH

#include "cast_v3_convert.cuh"

namespace etp__qk {

/* ---- v3 scales out ------------------------------------------------------- */

__device__ __forceinline__ void scale_word_out_v3(void *base, size_t off, uint32_t v)
{
    uint8_t *d = static_cast<uint8_t *>(base) + off;
    st4_v3(d, v, (reinterpret_cast<uintptr_t>(d) & 3u) == 0);
}

/* The row (column) of a tile, and the word of 4 blocks in it, whose scale
 * entries this thread writes. */
struct ScaleSlotV3 {
    int o, gi;
};

template <bool kNv>
__device__ __forceinline__ ScaleSlotV3 scale_slot_v3(bool swz, int tid)
{
    ScaleSlotV3 q;
    if (swz) { /* a 512-byte tile: word x holds rows x / 4 + 32 (x % 4) */
        const int x = tid & 127;
        q.gi = tid >> 7;
        q.o = (x >> 2) | ((x & 3) << 5);
    } else {
        q.o = kNv ? tid >> 1 : tid;
        q.gi = kNv ? tid & 1 : 0;
    }
    return q;
}

/* A word of 4 scale bytes st[d][g4 + j][o], j = 0..3 (byte j at bits 8j). */
__device__ __forceinline__ uint32_t scale_word_v3(const TileScales &st, int d, int g4, int o)
{
    return (uint32_t)st[d][g4][o] | (uint32_t)st[d][g4 + 1][o] << 8 | (uint32_t)st[d][g4 + 2][o] << 16 |
           (uint32_t)st[d][g4 + 3][o] << 24;
}

/* A wide MXFP8 tile's scales, unswizzled, padding included (zeros):
 * rowwise 16 bytes of each of its 32 rows (4 threads a row), columnwise
 * the 512 bytes of its 32-row band's scale row, 4 bytes a thread. */
__device__ __forceinline__ void mx_wide_scales_out_v3(const etp__qb_tensor_t &t, uint32_t fl, size_t r0, size_t c0,
                                                      TileScales &st)
{
    const int tid = threadIdx.x;
    const size_t M = t.rows, K = t.cols;
    if ((fl & kFlRow) && tid < 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_row_scales(M, K);
        const int o = tid >> 2, gi = tid & 3; /* row o, blocks 4 gi .. 4 gi + 3 */
        const size_t r = r0 + o, kb0 = c0 / 32, kb = kb0 + 4 * gi, kbs = K / 32;
        const uint8_t *e = mx_st_row<true>(st, 32 * 4 * gi, o); /* + 32 j: block 4 gi + j */
        if (r0 + kWideRows <= M && kb0 + 16 <= kbs) {
            const uint32_t v = (uint32_t)e[0] | (uint32_t)e[32] << 8 | (uint32_t)e[64] << 16 | (uint32_t)e[96] << 24;
            scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, 0), v);
        } else if (r < ss.rows && kb < ss.cols) {
            uint32_t v = 0;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (r < M && kb + j < kbs) v |= (uint32_t)e[32 * j] << (8 * j);
            scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, 0), v);
        }
    }
    if ((fl & kFlCol) && tid < 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_col_scales(M, K);
        const size_t mb = r0 / 32, kk = c0 + 4 * tid;
        if (mb < ss.rows && kk < ss.cols) {
            const uint8_t *e = mx_st_col<true>(st, 0, 4 * tid);
            uint32_t v;
            if (mb < M / 32 && kk + 4 <= K) {
                v = *reinterpret_cast<const uint32_t *>(e);
            } else {
                v = 0;
#pragma unroll
                for (int y = 0; y < 4; y++)
                    if (mb < M / 32 && kk + y < K) v |= (uint32_t)e[y] << (8 * y);
            }
            scale_word_out_v3(t.col_scales, etp__qf_mxfp8_col_scale_offset(mb, kk, ss, 0), v);
        }
    }
}

/* The tile's scale entries, padding included (zeros), as 4-byte words of 4
 * consecutive blocks, one word per thread, consecutive threads on
 * consecutive words of the output. A tile wholly inside the tensor takes
 * its words with no per-entry test. */
template <bool kNv, bool kUnswz = false>
__device__ __forceinline__ void scales_out_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, uint32_t fl,
                                              size_t r0, size_t c0, const TileScales &st, uint8_t *rimg, int rimg_off,
                                              bool cols = true)
{
    /* from the special register, which the compiler re-reads at will: a
     * value computed once for the kernel and kept was spilled instead */
    const int tid = threadIdx.x;
    const bool swz = !kUnswz && b.swizzle; /* kUnswz: the launcher's guarantee (the cluster kernel) */
    const ScaleSlotV3 q = scale_slot_v3<kNv>(swz, tid);
    const size_t M = t.rows, K = t.cols;
    constexpr bool nv = kNv;
    constexpr int groups = nv ? 2 : 1; /* 4-block words per row (column) of a tile */
    const int o = q.o, gi = q.gi;
    /* compact (unswizzled 16x16 NVFP4): of a whole tile's 16 identical rows
     * (columns) only the last, which the expansion copies to the others */
    const bool skip = kNv && !swz && b.compact && (o & 15) != 15;
    if ((fl & kFlRow) && tid < 128 * groups) {
        if (rimg) { /* a whole run's: to its image, leaving with the run */
            *reinterpret_cast<uint32_t *>(rimg + o * kRunRowBytes + rimg_off + 4 * gi) =
                scale_word_v3(st, 0, 4 * gi, o);
        } else {
            const etp__qf_scale_shape_t ss = nv ? etp__qf_nvfp4_row_scales(M, K) : etp__qf_mxfp8_row_scales(M, K);
            const size_t r = r0 + o, kb0 = nv ? c0 / 16 : c0 / 32, kb = kb0 + 4 * gi, kbs = nv ? K / 16 : K / 32;
            if (r0 + kTileV3 <= M && kb0 + 4 * groups <= kbs) {
                if (!(skip && (fl & kFlRimg)))
                    scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, swz),
                                      scale_word_v3(st, 0, 4 * gi, o));
            } else if (r < ss.rows && kb < ss.cols) {
                uint32_t v = 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (r < M && kb + j < kbs) v |= (uint32_t)st[0][4 * gi + j][o] << (8 * j);
                scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, swz), v);
            }
        }
    }
    if (!(fl & kFlCol) || !cols) return;
    if (nv) { /* [column, M-block], like rowwise */
        const etp__qf_scale_shape_t ss = etp__qf_nvfp4_col_scales(M, K);
        const size_t j = c0 + o, mb0 = r0 / 16, mb = mb0 + 4 * gi;
        if (c0 + kTileV3 <= K && mb0 + 8 <= M / 16) {
            if (!(skip && (fl & kFlMerge)))
                scale_word_out_v3(t.col_scales, etp__qf_scale_offset(j, mb, ss.cols, swz),
                                  scale_word_v3(st, 1, 4 * gi, o));
        } else if (j < ss.rows && mb < ss.cols) {
            uint32_t v = 0;
#pragma unroll
            for (int x = 0; x < 4; x++)
                if (j < K && mb + x < M / 16) v |= (uint32_t)st[1][4 * gi + x][o] << (8 * x);
            scale_word_out_v3(t.col_scales, etp__qf_scale_offset(j, mb, ss.cols, swz), v);
        }
        return;
    }
    /* MXFP8 in square tiles has swizzled scales (row-major ones take wide
     * tiles, mx_wide_scales_out_v3): the GEMM's view, column-major 4
     * M-blocks of a column */
    if (tid >= 128) return;
    const etp__qf_scale_shape_t ss = etp__qf_mxfp8_col_scales(M, K);
    const size_t mb0 = r0 / 32, kk = c0 + o;
    if (mb0 < ss.rows && kk < ss.cols) {
        uint32_t v = 0;
#pragma unroll
        for (int x = 0; x < 4; x++)
            if (kk < K && mb0 + x < M / 32) v |= (uint32_t)st[1][x][o] << (8 * x);
        scale_word_out_v3(t.col_scales, etp__qf_mxfp8_col_scale_offset(mb0, kk, ss, 1), v);
    }
}

/* ---- v3 kernel ------------------------------------------------------------ */

/* A whole run's rowwise scales (kRunRowBytes of each of 128 rows, from
 * row r0 and block kb0 of a [rows, ld] scale matrix; 16-byte aligned: the
 * kernel's check) to memory, 16 bytes a thread. */
__device__ __forceinline__ void run_out_v3(const uint8_t *rimg, void *scales, size_t ld, size_t r0, size_t kb0,
                                           int tid, bool compact)
{
    static_assert(kTileV3 * kRunRowBytes == 16 * kThreads, "one 16-byte piece a thread");
    const int row = tid / (kRunRowBytes / 16), h = tid % (kRunRowBytes / 16);
    if (compact && (row & 15) != 15) return; /* the expansion's (16x16 blocks) */
    const uint4 v = *reinterpret_cast<const uint4 *>(rimg + row * kRunRowBytes + 16 * h);
    *reinterpret_cast<uint4 *>(static_cast<uint8_t *>(scales) + (r0 + row) * ld + kb0 + 16 * h) = v;
}


} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_SCALES_CUH */
