/*
 * Scale swizzle: scale matrices between row-major and cuBLASLt's
 * block-scaling-factor layout (docs/FORMATS.md, "Scale layouts"), ONE
 * launch for all the matrices of a batch.
 *
 * In the GEMM's view of a matrix (outer rows by block columns; for MXFP8
 * columnwise the transpose of what is stored), the swizzled order keeps each
 * 128-row band in one contiguous run of bytes, its 128x4 tiles left to
 * right. A chunk of up to kChunkTiles tiles of one band is therefore one
 * contiguous piece on the swizzled side and a rectangle on the row-major
 * side. A block stages a chunk in shared memory: it reads one side with
 * coalesced accesses, and writes the other side, coalesced, through the
 * permutation. Accesses are 32-bit words when both buffers of a matrix are
 * 4-byte aligned (every piece then starts on a multiple of 4: row-major rows
 * are multiples of 4 or 128 bytes long, tiles 512), bytes otherwise.
 *
 * The grid loops over the concatenation of all matrices' chunks; a block
 * finds its matrix by binary search in a prefix sum of chunk counts that
 * travels with the batch in the kernel parameters (no device memory,
 * nothing to allocate, graph-capturable), as in quant_kernels.cu.
 */
#include <stdint.h>
#include <string.h>

#include "swizzle.h"

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kChunkTiles = 8; /* tiles per chunk: 4 KiB */
constexpr uint32_t kTileBytes = 512;
/* A tile's bytes in shared memory, one word of padding after each, so that
 * the row-major side's word stores (4 tiles apart in the same row) do not
 * all land in one bank. */
constexpr uint32_t kTileStride = kTileBytes + 4;
constexpr uint32_t kBlocksPerSm = 8;

struct Params {
    etp__qswz_batch_t b;
    uint64_t start[ETP__QSWZ_MAX + 1]; /* prefix sum of chunks per matrix */
};

/* A matrix as the GEMM sees it: `outer` rows (a multiple of 128) by
 * `blocks` columns (a multiple of 4). */
struct View {
    uint32_t outer, blocks;
};

__host__ __device__ inline View view_of(const etp__qswz_mat_t &m)
{
    View v;
    v.outer = m.mxfp8_col ? m.cols : m.rows;
    v.blocks = m.mxfp8_col ? m.rows : m.cols;
    return v;
}

__host__ __device__ inline uint32_t chunks_per_band(View v)
{
    return (v.blocks / 4 + kChunkTiles - 1) / kChunkTiles;
}

/* One chunk: its row-major rectangle (nseg pieces of seglen bytes, ld apart,
 * from rm) and its swizzled piece (sw_len bytes from sw). */
struct Chunk {
    const uint8_t *in;
    uint8_t *out;
    uint64_t rm, ld, sw;
    uint32_t nseg, seglen, sw_len;
    bool tr; /* pieces are block columns (MXFP8 columnwise), not outer rows */
};

/* Shared-memory byte of entry (o, b) of the chunk's view (o < 128 the row
 * in the band, b < 4 * tiles the block column from the chunk's first): the
 * swizzled formula of qf_layout.h, tiles padded to kTileStride. */
__device__ __forceinline__ uint32_t smem_at(uint32_t o, uint32_t b)
{
    return (b / 4) * kTileStride + (o % 32) * 16 + (o / 32) * 4 + b % 4;
}

/* Byte x of row-major piece i, as an entry of the view. */
__device__ __forceinline__ uint32_t smem_rm(const Chunk &k, uint32_t i, uint32_t x)
{
    return k.tr ? smem_at(x, i) : smem_at(i, x);
}

/* Byte s of the swizzled piece. */
__device__ __forceinline__ uint32_t smem_sw(uint32_t s)
{
    return (s / kTileBytes) * kTileStride + s % kTileBytes;
}

template <bool kWords>
__device__ __forceinline__ void rm_to_smem(const Chunk &k, uint8_t *sm)
{
    if (kWords) {
        const uint32_t wps = k.seglen / 4, count = k.nseg * wps;
        for (uint32_t w = threadIdx.x; w < count; w += blockDim.x) {
            const uint32_t i = w / wps, x = (w % wps) * 4;
            const uint32_t val = *reinterpret_cast<const uint32_t *>(k.in + k.rm + i * k.ld + x);
            if (!k.tr) /* four block columns of one row: adjacent in a tile row */
                *reinterpret_cast<uint32_t *>(sm + smem_rm(k, i, x)) = val;
            else
                for (uint32_t j = 0; j < 4; j++) sm[smem_rm(k, i, x + j)] = (uint8_t)(val >> (8 * j));
        }
    } else {
        const uint32_t count = k.nseg * k.seglen;
        for (uint32_t e = threadIdx.x; e < count; e += blockDim.x) {
            const uint32_t i = e / k.seglen, x = e % k.seglen;
            sm[smem_rm(k, i, x)] = k.in[k.rm + i * k.ld + x];
        }
    }
}

template <bool kWords>
__device__ __forceinline__ void smem_to_rm(const Chunk &k, const uint8_t *sm)
{
    if (kWords) {
        const uint32_t wps = k.seglen / 4, count = k.nseg * wps;
        for (uint32_t w = threadIdx.x; w < count; w += blockDim.x) {
            const uint32_t i = w / wps, x = (w % wps) * 4;
            uint32_t val = 0;
            if (!k.tr)
                val = *reinterpret_cast<const uint32_t *>(sm + smem_rm(k, i, x));
            else
                for (uint32_t j = 0; j < 4; j++) val |= (uint32_t)sm[smem_rm(k, i, x + j)] << (8 * j);
            *reinterpret_cast<uint32_t *>(k.out + k.rm + i * k.ld + x) = val;
        }
    } else {
        const uint32_t count = k.nseg * k.seglen;
        for (uint32_t e = threadIdx.x; e < count; e += blockDim.x) {
            const uint32_t i = e / k.seglen, x = e % k.seglen;
            k.out[k.rm + i * k.ld + x] = sm[smem_rm(k, i, x)];
        }
    }
}

template <bool kWords>
__device__ __forceinline__ void sw_to_smem(const Chunk &k, uint8_t *sm)
{
    if (kWords) {
        for (uint32_t w = threadIdx.x; w < k.sw_len / 4; w += blockDim.x)
            *reinterpret_cast<uint32_t *>(sm + smem_sw(4 * w)) =
                *reinterpret_cast<const uint32_t *>(k.in + k.sw + 4 * w);
    } else {
        for (uint32_t e = threadIdx.x; e < k.sw_len; e += blockDim.x) sm[smem_sw(e)] = k.in[k.sw + e];
    }
}

template <bool kWords>
__device__ __forceinline__ void smem_to_sw(const Chunk &k, const uint8_t *sm)
{
    if (kWords) {
        for (uint32_t w = threadIdx.x; w < k.sw_len / 4; w += blockDim.x)
            *reinterpret_cast<uint32_t *>(k.out + k.sw + 4 * w) =
                *reinterpret_cast<const uint32_t *>(sm + smem_sw(4 * w));
    } else {
        for (uint32_t e = threadIdx.x; e < k.sw_len; e += blockDim.x) k.out[k.sw + e] = sm[smem_sw(e)];
    }
}

template <bool kWords>
__device__ void move_chunk(const Chunk &k, bool unswizzle, uint8_t *sm)
{
    if (!unswizzle) {
        rm_to_smem<kWords>(k, sm);
        __syncthreads();
        smem_to_sw<kWords>(k, sm);
    } else {
        sw_to_smem<kWords>(k, sm);
        __syncthreads();
        smem_to_rm<kWords>(k, sm);
    }
}

/* The matrix of chunk c (the last one whose prefix is <= c: never an empty
 * one, since c < the total) and the chunk's index in it. */
__device__ __forceinline__ uint32_t find_matrix(const Params &p, uint64_t c, uint64_t *local)
{
    uint32_t lo = 0, hi = p.b.n;
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (p.start[mid] <= c)
            lo = mid;
        else
            hi = mid;
    }
    *local = c - p.start[lo];
    return lo;
}

__global__ void __launch_bounds__(kThreads) swizzle_kernel(const __grid_constant__ Params p)
{
    __shared__ __align__(16) uint8_t sm[kChunkTiles * kTileStride];
    if (p.b.noop != nullptr && *p.b.noop != 0) return;
    const uint64_t total = p.start[p.b.n];
    for (uint64_t c = blockIdx.x; c < total; c += gridDim.x) {
        uint64_t local;
        const etp__qswz_mat_t &m = p.b.m[find_matrix(p, c, &local)];
        const View v = view_of(m);
        const uint32_t cpb = chunks_per_band(v), tiles = v.blocks / 4;
        const uint64_t band = local / cpb;
        const uint32_t tc0 = (uint32_t)(local % cpb) * kChunkTiles;
        const uint32_t nt = tiles - tc0 < kChunkTiles ? tiles - tc0 : kChunkTiles;
        Chunk k;
        k.in = m.in;
        k.out = m.out;
        k.tr = m.mxfp8_col != 0;
        k.ld = m.cols;
        /* normal: 128 rows of the band, 4 * nt bytes each; transposed: 4 * nt
         * stored rows (block columns), 128 bytes each */
        k.rm = k.tr ? (uint64_t)(4 * tc0) * k.ld + band * 128 : band * 128 * k.ld + 4 * tc0;
        k.nseg = k.tr ? 4 * nt : 128;
        k.seglen = k.tr ? 128 : 4 * nt;
        k.sw = (band * tiles + tc0) * kTileBytes;
        k.sw_len = nt * kTileBytes;
        if ((((uintptr_t)m.in | (uintptr_t)m.out) & 3) == 0)
            move_chunk<true>(k, p.b.unswizzle != 0, sm);
        else
            move_chunk<false>(k, p.b.unswizzle != 0, sm);
        __syncthreads(); /* before the next chunk reuses sm */
    }
}

} // namespace

extern "C" cudaError_t etp__cuda_swizzle_launch(cudaStream_t s, const etp__qswz_batch_t *batch)
{
    if (batch->n == 0) return cudaSuccess;
    if (batch->n > ETP__QSWZ_MAX) return cudaErrorInvalidValue;
    static_assert(sizeof(Params) < 32764, "kernel parameters are limited to 32764 bytes");
    Params p;
    memcpy(&p.b, batch, etp__qswz_batch_bytes(batch->n));
    uint64_t total = 0;
    for (uint32_t i = 0; i < batch->n; i++) {
        const View v = view_of(batch->m[i]);
        if (v.outer % 128 || v.blocks % 4) return cudaErrorInvalidValue;
        p.start[i] = total;
        total += (uint64_t)(v.outer / 128) * chunks_per_band(v);
    }
    p.start[batch->n] = total;
    if (total == 0) return cudaSuccess;
    const uint64_t most = batch->sms ? (uint64_t)batch->sms * kBlocksPerSm : 65535u;
    const uint64_t grid = total < most ? total : most;
    void *args[] = {&p};
    return cudaLaunchKernel((const void *)swizzle_kernel, dim3((unsigned)grid), dim3(kThreads), args,
                            0, s);
}
