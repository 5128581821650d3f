/*
 * The v3 cast (cast_v3.cu, which alone includes this): its design, tiles,
 * threads' places in them, loads and the registers' layout.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_TILE_CUH
#define ETP__KERNELS_QUANT_CAST_V3_TILE_CUH

#include "qk_common.cuh"

namespace etp__qk {

/* ---- cast v3 (rounding to nearest) -----------------------------------------
 *
 * The first cast (the stochastic-rounding one, cast_sr.cu, is what
 * remains of it) put every tile in shared memory as FP32, converted each
 * element with ~15 instructions (a float-to-int conversion among them) once
 * per direction and stored the columnwise outputs a byte or 8 bytes at a time:
 * at 256 MiB it ran at 0.2-0.27 of a device copy, bound by instructions and
 * store transactions rather than by memory. v3 keeps each thread's 8 x 8
 * elements in registers from load to store:
 * - tiles of 128 x 128 elements for 256 threads; a warp covers 32 rows x 64
 *   columns, lane l rows 8 (l / 8) and columns 8 (l % 8) of it, so a 16-byte
 *   load is one row's 8 BF16 and a warp's load 4 rows x 128 contiguous
 *   bytes, and every block (1x16, 16x1, 16x16, 1x32, 32x1) lies in one warp:
 *   its amax is an integer max (two BF16 per instruction) finished by one or
 *   two shuffles, its scale computed by one of the block's lanes and
 *   shuffled to the others;
 * - NVFP4 elements are converted by one FP32 addition of a magic number
 *   (etp__qf_round_magic: the code lands in the low byte of the sum), codes
 *   packed with byte permutes, signs taken from the input words; MXFP8
 *   elements by the hardware's FP8 conversion, two per instruction (sm_89
 *   and later: its rounding is the reference's once the scale keeps every
 *   element finite and in range, which the fast path checks; it cut the
 *   MXFP8 kernel's instructions by about a third, from 0.71 to 0.85 of a
 *   copy). Hopper has no E2M1 conversion, and rounding through E4M3 first
 *   would round twice;
 * - an NVFP4 row of 8 codes is one 32-bit word, the columnwise copy is the
 *   8 x 8 nibble transpose of those words in registers; with 16x16 blocks
 *   both copies have the same codes, converted once;
 * - MXFP8 data leaves as 8 bytes per thread and row (a warp store fills
 *   whole 32-byte sectors of 4 rows), NVFP4 rowwise data as 4 bytes per
 *   thread and row (whole sectors too); NVFP4 columnwise data of whole
 *   tiles is staged in shared memory and leaves as 16-byte stores after
 *   the tile's barrier (stage_put_v3: stored from registers, 4 bytes of 8
 *   rows a thread, those half-sector stores alone halved the kernel's
 *   speed);
 * - scale bytes gather in shared memory and leave as 4-byte words in output
 *   order: a tile's scales are whole 512-byte swizzle tiles (unswizzled,
 *   4 or 8 bytes of each of 128 rows: pieces of sectors that other tiles
 *   complete, 6-8% slower than swizzled in the benchmark; hence NVFP4's
 *   runs and MXFP8's wide tiles below);
 * - the next tile's BF16 rows travel to shared memory by cp.async while
 *   the current ones are converted, each thread its own rows (no barrier,
 *   no registers held); FP32 tensors run in a second instantiation of the
 *   kernel (a second launch when a batch mixes the types) that loads in
 *   place, so neither type's registers crowd the other's.
 * A warp whose blocks hold a NaN (or, MXFP8, whose scale would let an
 * element pass the format's largest value: an infinite amax) converts with
 * the codec's per-element functions (qf_codec.h) instead. */

/* What the v3 cast would otherwise test of a tensor on every tile (its
 * pointers' alignment, its shape's divisibility, which outputs it has):
 * the launcher's, once per launch. The BF16 NVFP4 kernel is bound by its
 * SMs' instruction issue, and those tests, 64-bit and loaded from the
 * parameter block each time, were 4% of its instructions (with the masks
 * of the old 16x16 amax; ncu, H200, docs/PERF.md). */
enum : uint8_t {
    kFlX16 = 1,   /* x 16-byte aligned, its rows whole 16-byte multiples: whole 8 x 8 pieces load as vectors */
    kFlRow = 2,   /* rowwise output */
    kFlCol = 4,   /* columnwise output */
    kFlStage = 8, /* NVFP4 columnwise codes staged: col_data 16-byte aligned, (rows / 2) % 16 == 0 */
    kFlRimg = 16, /* NVFP4 rowwise scales of whole runs collect in an image: unswizzled, their rows
                     whole 16-byte multiples, 16-byte aligned */
    kFlMerge = 32 /* NVFP4 columnwise scales merged by clusters: unswizzled, their rows whole 16-byte
                     multiples, 16-byte aligned */
};

constexpr int kTileV3 = 128;          /* v3 tiles: 128 x 128 elements */
/* resident blocks per SM (launch bounds) of the NVFP4 and the MXFP8 kernels */
constexpr int kCastV3NvBlocksPerSm = 2;
constexpr int kCastV3MxBlocksPerSm = 2;
constexpr uint32_t kFull = 0xffffffffu;
constexpr uint32_t kAbs2 = 0x7fff7fffu; /* |x| of two BF16 */

/* One tile's scale bytes on their way out: [direction (0 rowwise, 1
 * columnwise)][block index in the tile][row (rowwise) or column]. */
typedef uint8_t TileScales[2][8][kTileV3];

/* A thread's 8 x 8 elements, by value for the per-element path: a call
 * (not inlined: its registers would crowd the fast path's) that copies
 * them only when taken. */
struct SubV3 {
    uint32_t w[8][8];
};

/* Wide tiles: MXFP8 with row-major (unswizzled) scales runs tiles of 32 x
 * 512 elements instead, so that a tile writes 16 bytes of each of 32
 * rowwise scale rows where a 128 x 128 tile wrote 4 bytes of each of 128
 * (pieces of sectors: on an H200 those stores cost 7% of the kernel, where
 * the swizzled layout's whole 512-byte tiles cost 2%), and its columnwise
 * scales are one row's 512 contiguous bytes. Every MXFP8 block (1x32,
 * 32x1) still lies in one warp. The swizzled layout keeps square tiles:
 * its 512-byte tiles are 128 rows deep. */
constexpr int kWideRows = 32, kWideCols = 512;

template <bool kWide>
struct TileDimV3 {
    static constexpr int kRows = kWide ? kWideRows : kTileV3, kCols = kWide ? kWideCols : kTileV3;
};

/* Elements extents v3 tiles cover: the data and all scale padding (scale
 * rows are padded to 128 in every layout). */
__host__ inline void cast_extent_v3(const etp__qb_tensor_t &t, bool wide, size_t *re, size_t *ce)
{
    const bool any = t.row_data != nullptr || t.col_data != nullptr;
    *re = any ? etp__qf_roundup(t.rows, kTileV3) : 0;
    *ce = any ? etp__qf_roundup(t.cols, wide ? kWideCols : kTileV3) : 0;
}

/* This thread's place in a tile: rows tr..tr+7, columns tc..tc+7. Column
 * neighbours are lanes ^1, ^2, ^4; row neighbours lanes ^8, ^16. Square
 * tiles: warps 2 wide, 4 deep; wide tiles: 8 wide, 1 deep. */
struct GeoV3 {
    int tid, lane, cg, rg, wr; /* thread, lane, lane % 8, lane / 8, the warp's 32-row band */
    int tr, tc;
};

template <bool kWide = false>
__device__ __forceinline__ GeoV3 geo_v3()
{
    GeoV3 g;
    const uint32_t tid = threadIdx.x;
    g.tid = (int)tid;
    g.lane = (int)(tid & 31);
    g.cg = g.lane & 7;
    g.rg = g.lane >> 3;
    g.wr = kWide ? 0 : (int)(tid >> 6);
    g.tr = g.wr * 32 + g.rg * 8;
    g.tc = (kWide ? (int)(tid >> 5) : (int)((tid >> 5) & 1)) * 64 + g.cg * 8;
    return g;
}

/* MXFP8 scale bytes of a tile in TileScales, flat per direction (1 KiB
 * each): rowwise [block of 32 columns][row], columnwise [32-row band][column]. */
template <bool kWide>
__device__ __forceinline__ uint8_t *mx_st_row(TileScales &st, int tc, int row)
{
    return &st[0][0][0] + (tc / 32) * TileDimV3<kWide>::kRows + row;
}

template <bool kWide>
__device__ __forceinline__ uint8_t *mx_st_col(TileScales &st, int band, int col)
{
    return &st[1][0][0] + band * kTileV3 + col; /* wide tiles: one band of 512 columns */
}

/* Runs: the v3 cast hands a block kRun* consecutive tiles of one tile row
 * at a time (fewer at a row's end), so that a run's rowwise scales leave
 * together: NVFP4 4 tiles x 8 bytes, 32 bytes of each scale row, whole
 * sectors, where one tile writes 8 bytes of each of 128 rows, pieces of
 * sectors other blocks complete (the unswizzled layout; 2 x H200: 0.73 ->
 * 0.80 of a copy at 256 MiB, docs/PERF.md; where there are runs enough for
 * every resident block: the launcher decides). MXFP8 stays a tile at a time:
 * runs of 8 gave it nothing unswizzled and cost 7% swizzled, likely as the
 * blocks' tiles at any moment spread over 8 times as many input rows. */
constexpr uint32_t kRunNv = 4, kRunMx = 1;
constexpr int kRunRowBytes = 32;

/* A run's tensor and place in it (tile row rt, run q of the row: tiles
 * q * run .. q * run + run - 1). */
struct TileV3 {
    uint32_t k, rt, q;
};

/* *t on entry: the previous run's tensor, most often this one's too (no
 * search then). */
__device__ __forceinline__ void tile_coords_v3(const Params &p, uint32_t run, TileV3 *t)
{
    uint32_t local;
    if (run >= p.tile_start[t->k] && run < p.tile_start[t->k + 1])
        local = run - p.tile_start[t->k];
    else
        t->k = find_tensor(p, run, &local);
    t->rt = local / p.runs_c[t->k];
    t->q = local % p.runs_c[t->k];
}

/* The run a grid stride after `cur` (run index `next`): within the same
 * tensor a step by the launcher's per-tensor quotient and remainder, no
 * division. */
__device__ __forceinline__ TileV3 tile_step_v3(const Params &p, const TileV3 &cur, uint32_t next)
{
    TileV3 t = cur;
    if (next < p.tile_start[cur.k + 1]) {
        t.rt = cur.rt + p.step_r[cur.k];
        t.q = cur.q + p.step_c[cur.k];
        if (t.q >= p.runs_c[cur.k]) {
            t.q -= p.runs_c[cur.k];
            t.rt++;
        }
        return t;
    }
    tile_coords_v3(p, next, &t);
    return t;
}

__device__ __forceinline__ uint32_t u4get(const uint4 &v, int j)
{
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ void u4set(uint4 &v, int j, uint32_t w)
{
    if (j == 0)
        v.x = w;
    else if (j == 1)
        v.y = w;
    else if (j == 2)
        v.z = w;
    else
        v.w = w;
}

/* The thread's 8 x 8 elements lie wholly inside the tensor, in 16-byte
 * aligned rows (fl: the tensor's kFl*). */
__device__ __forceinline__ bool fast_v3(uint32_t fl, const etp__qb_tensor_t &t, size_t R, size_t C)
{
    return (fl & kFlX16) && R + 8 <= t.rows && C + 8 <= t.cols;
}

/* BF16: row i in d[i] (element 2j in the low half of word j). */
__device__ __forceinline__ void load_bf16_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&d)[8])
{
    const size_t K = t.cols;
    const uint16_t *x = static_cast<const uint16_t *>(t.x) + R * K + C;
#pragma unroll
    for (int i = 0; i < 8; i++) d[i] = __ldg(reinterpret_cast<const uint4 *>(x + i * K));
}

/* FP32: rows 0-3 in lo (two vectors each), rows 4-7 in hi. */
__device__ __forceinline__ void load_f32_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&lo)[8],
                                            uint4 (&hi)[8])
{
    const size_t K = t.cols;
    const float *x = static_cast<const float *>(t.x) + R * K + C;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 *a = reinterpret_cast<const uint4 *>(x + i * K);
        const uint4 *b = reinterpret_cast<const uint4 *>(x + (i + 4) * K);
        lo[2 * i] = __ldg(a);
        lo[2 * i + 1] = __ldg(a + 1);
        hi[2 * i] = __ldg(b);
        hi[2 * i + 1] = __ldg(b + 1);
    }
}

/* The next tile's BF16 rows go to shared memory by cp.async (16 bytes,
 * not through L1), each thread to its own slots: no barrier, no registers
 * held while they are in flight. */
__device__ __forceinline__ void cp_async16_v3(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit_v3()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Until at most N of the thread's newest commit groups are in flight (0:
 * all landed). */
template <int N = 0>
__device__ __forceinline__ void cp_async_wait_v3()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The same layouts element by element, zeros outside the tensor (a zero
 * changes no amax; its codes are never stored). */
template <bool kBf>
__device__ __forceinline__ void load_slow_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&lo)[8],
                                             uint4 (&hi)[8])
{
    const size_t M = t.rows, K = t.cols;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const bool in = R + i < M;
        if (kBf) {
            const uint16_t *x = static_cast<const uint16_t *>(t.x) + (R + i) * K;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const size_t c = C + 2 * j;
                const uint32_t a = in && c < K ? x[c] : 0u, b = in && c + 1 < K ? x[c + 1] : 0u;
                u4set(lo[i], j, a | (b << 16));
            }
        } else {
            const uint32_t *x = static_cast<const uint32_t *>(t.x) + (R + i) * K;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t v = in && C + j < K ? x[C + j] : 0u;
                if (i < 4)
                    u4set(lo[2 * i + j / 4], j & 3, v);
                else
                    u4set(hi[2 * (i - 4) + j / 4], j & 3, v);
            }
        }
    }
}

/* The registers as rows of words (BF16 uses words 0-3 of each row). */
template <bool kBf>
__device__ __forceinline__ void words_v3(const uint4 (&lo)[8], const uint4 (&hi)[8], uint32_t (&w)[8][8])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (kBf)
                w[i][j] = j < 4 ? u4get(lo[i], j) : 0u;
            else
                w[i][j] = i < 4 ? u4get(lo[2 * i + j / 4], j & 3) : u4get(hi[2 * (i - 4) + j / 4], j & 3);
        }
}

__device__ __forceinline__ SubV3 sub_v3(const uint32_t (&w)[8][8])
{
    SubV3 s;
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) s.w[i][j] = w[i][j];
    return s;
}

/* |element e| of a row as FP32 bits, and the element itself. */
template <bool kBf>
__device__ __forceinline__ uint32_t absbits_v3(const uint32_t (&r)[8], int e)
{
    if (!kBf) return r[e] & 0x7fffffffu;
    const uint32_t a = r[e >> 1] & kAbs2;
    return (e & 1) ? (a & 0xffff0000u) : (a << 16);
}

template <bool kBf>
__device__ __forceinline__ float elem_v3(const uint32_t (&r)[8], int e)
{
    if (!kBf) return __uint_as_float(r[e]);
    return __uint_as_float((e & 1) ? (r[e >> 1] & 0xffff0000u) : (r[e >> 1] << 16));
}


} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_TILE_CUH */
