/*
 * The v3 cast (cast_v3.cu, which alone includes this): clusters merging a
 * band's NVFP4 columnwise scales.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_CLUSTER_CUH
#define ETP__KERNELS_QUANT_CAST_V3_CLUSTER_CUH

#include "cast_v3_tile.cuh"

namespace etp__qk {

/* ---- v3 clusters: a band's columnwise scales in larger pieces -------------
 *
 * NVFP4 16x16 scales in the row-major layout: a tile's columnwise scales are
 * 8 bytes of each of 128 scale rows, a quarter of a 32-byte sector that the
 * three tiles below it complete (docs/PERF.md: those
 * pieces are the whole gap to the swizzled layout). A cluster of kBand
 * blocks converts the kBand tiles of a band (kBand tile rows, the same
 * columns) at the same time, in the grid-stride order of runs that keeps
 * neighbouring tiles' outputs together (DESIGN.md, tile order). With 16x16
 * blocks a tile's columnwise scales are only 8 x 8 distinct bytes (16 scale
 * rows repeat each), so every block sends its 64 through distributed shared
 * memory (st.async, counted by the receiver's mbarrier) to the blocks that
 * write the band's scale rows of those columns (block i: tile columns
 * kBandCols i ..), and each block writes its rows' kBand * 8 bytes as
 * 16-byte stores. kBand = 2 (half sectors) measured faster than 4 (whole
 * ones) on an H200: clusters of 4 do not fill every SM (62 of 66 fit, the
 * GPCs' slots not being multiples of 4), clusters of 2 do (docs/PERF.md). */
constexpr uint32_t kBand = 2;
constexpr int kBandCols = kTileV3 / kBand;         /* the tile columns whose scale rows a block writes */
constexpr int kBandGroups = kBandCols / 16;        /* their 16-column groups */
constexpr int kBandPieces = kBand * 8 / 16;        /* 16-byte pieces of a band's scale row */
constexpr int kCimgBytes = 64; /* a parity's: [column group of the block][member][M-block] */
static_assert(kBandGroups * kBand * 8 == kCimgBytes && kBandPieces * kBandCols == 64, "64 pieces a tile");

/* The block's tile row in its cluster's band (read again where it is
 * used: a value kept across the tile loop would take a register the loop
 * has none of). */
__device__ __forceinline__ uint32_t band_member_v3()
{
    return blockIdx.x % kBand;
}

/* The cluster's barrier in its two halves, relaxed: a block arrives once
 * it has read the previous tile's pieces and sent this tile's, and waits a
 * tile later, before it sends into buffers the others may still read, so
 * the blocks of a cluster may drift a tile apart. (The first version, a
 * whole barrier with release semantics each tile, which compiles to a
 * fence on all the thread's global stores, with the merge's state held in
 * registers across the tile, ran 7-10% slower than no clusters at all.)
 * The bytes themselves are ordered by the receiver's mbarrier. Never
 * launched in clusters below sm_90 (etp__cuda_quant_cluster_fit). */
__device__ __forceinline__ void cluster_arrive_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}

/* The whole barrier with release semantics, once, after the mbarriers'
 * initialization. */
__device__ __forceinline__ void cluster_sync_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned smem_u32_v3(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init_v3(uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32_v3(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* The owner's one arrival of a phase, expecting `bytes` from st.async. */
__device__ __forceinline__ void mbar_expect_v3(uint64_t *bar, uint32_t bytes)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32_v3(bar)), "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait_v3(uint64_t *bar, uint32_t parity)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n"
                 "}\n" ::"r"(smem_u32_v3(bar)),
                 "r"(parity)
                 : "memory");
#endif
}

/* A word to the same shared variable of block `rank`, counted by that
 * block's mbarrier (the same variable there as `bar` here). */
__device__ __forceinline__ void st_async_v3(void *local, uint64_t *bar, uint32_t rank, uint32_t v)
{
#if __CUDA_ARCH__ >= 900
    unsigned d, m;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_u32_v3(local)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(m) : "r"(smem_u32_v3(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(d), "r"(v),
                 "r"(m)
                 : "memory");
#endif
}

__device__ __forceinline__ void cluster_wait_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}



} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_CLUSTER_CUH */
