/*
 * The v3 cast (the default): NVFP4 and MXFP8, rowwise and columnwise in one
 * pass, one launch per input type of the batch, and the expansion of
 * compacted scales; the design is in cast_v3_tile.cuh.
 */
#include "quant_kernels.h"
#include "cast_v3_cluster.cuh"
#include "cast_v3_mxfp8.cuh"
#include "cast_v3_nvfp4.cuh"
#include "cast_v3_scales.cuh"
#include "cast_v3_whole.cuh"

namespace etp__qk {
namespace {

/* Tiles blockIdx.x, + gridDim.x, ... of the tensors of one input type
 * (kBf: BF16, else FP32; the launcher gives the others no tiles) and one
 * format (kNv: NVFP4, else MXFP8): each instantiation is allocated
 * registers, and fills the instruction cache, for its own case alone.
 * Scale bytes alternate between two shared buffers: one barrier per tile
 * (warps storing their own scales straight from registers, as 2-byte
 * pieces of words that other warps complete, measured slower; mbarriers
 * that let a warp run a tile ahead of the others instead of a block-wide
 * barrier, no faster). kClu: launched in clusters of kBand blocks, each
 * cluster walking bands of runs (kBand tile rows of one run each), block
 * i of the cluster tile row i of the band, merging columnwise scales as
 * above; the other instantiations are compiled as before. */
template <bool kBf, bool kNv, bool kWide, bool kClu = false>
__global__ void __launch_bounds__(kThreads, kNv ? kCastV3NvBlocksPerSm : kCastV3MxBlocksPerSm)
    cast_kernel_v3(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ __align__(16) TileScales st[2];
    __shared__ __align__(16) uint4 ahead[kBf ? 8 : 1][kThreads]; /* the next tile's rows, per thread */
    extern __shared__ __align__(16) uint8_t stage[]; /* NVFP4: [parity] staged columnwise codes */
    const uint32_t run_len = kNv ? p.run : kRunMx;
    constexpr int kBlocksPerTile = kNv ? kTileV3 / 16 : kTileV3 / 32; /* rowwise scale bytes of a tile row */
    /* a whole run's rowwise scales fill its image rows, or it has no image */
    constexpr bool kImg = kNv && kRunNv * kBlocksPerTile == kRunRowBytes;
    __shared__ __align__(16) uint8_t rimg[2][kImg ? kTileV3 * kRunRowBytes : 16]; /* whole runs' rowwise scales */
    static_assert(!kClu || (kNv && !kWide), "clusters are NVFP4's");
    __shared__ __align__(16) uint8_t cimg[kClu ? 2 * kCimgBytes : 16]; /* [parity] a band's merged scales */
    __shared__ uint64_t cbar[kClu ? 2 : 1]; /* [parity] cimg's bytes arrived */
    /* kClu: where thread i < 64 writes the previous tile's merged piece (in
     * shared memory: the kernel's registers are all taken, and a pointer
     * carried across a tile spilled) */
    __shared__ uint8_t *mdst[kClu ? 64 : 1];
    const uint32_t total = p.tile_start[b.n]; /* runs (kClu: bands of runs) */
    uint32_t run = kClu ? blockIdx.x / kBand : blockIdx.x; /* uniform in a cluster */
    if (run >= total) return;
    static_assert(!(kWide && kNv), "wide tiles are MXFP8's");
    constexpr int kTR = TileDimV3<kWide>::kRows, kTC = TileDimV3<kWide>::kCols;
    const GeoV3 g = geo_v3<kWide>();
    TileV3 cur = {0, 0, 0};
    tile_coords_v3(p, run, &cur);
    uint32_t j = 0; /* the tile of the run */
    bool have = false;  /* ahead holds this tile's input */
    uint32_t nvk = ~0u; /* the tensor s_enc_6 and s_dec belong to */
    float s_enc_6 = 1.0f, s_dec = 1.0f;
    /* the run whose image is complete and leaves after the next barrier */
    bool pend = false;
    const uint8_t *pend_img = nullptr;
    void *pend_scales = nullptr;
    size_t pend_ld = 0, pend_r0 = 0, pend_kb0 = 0;
    int rp = 0;           /* the image of the current run */
    uint8_t *rimg_cur = nullptr;
    /* kClu, one register: kArrived (at the cluster's barrier once), kPm (the
     * previous tile was merged), kLpar (its parity), kPh << p (cbar[p]'s
     * phase) */
    constexpr uint32_t kArrived = 1, kPm = 2, kLpar = 4, kPh = 8;
    uint32_t cs = 0;
    if (kClu) {
        if (g.tid == 0) {
            mbar_init_v3(&cbar[0]);
            mbar_init_v3(&cbar[1]);
        }
        cluster_sync_v3();
    }
    for (int par = 0;; par ^= 1) {
        const uint32_t k = cur.k;
        const etp__qb_tensor_t &t = b.t[k];
        const uint32_t fl = p.fl[k];
        const uint32_t len = min(run_len, p.tiles_c[k] - cur.q * run_len);
        const size_t r0 = (size_t)(kClu ? cur.rt * kBand + band_member_v3() : cur.rt) * kTR,
                     c0 = (size_t)(cur.q * run_len + j) * kTC;
        const size_t R = r0 + g.tr, C = c0 + g.tc;
        /* kClu: a band's tile row past the tensor's last has no tile (its
         * block still keeps the cluster's barriers) */
        const bool act = !kClu || r0 < etp__qf_roundup(t.rows, kTileV3);
        if (j == 0) {
            /* a whole run of an unswizzled rowwise layout collects its
             * scales in an image (the same for every thread) */
            rimg_cur = nullptr;
            if (kImg && (fl & kFlRimg) && len == kRunNv && r0 + kTileV3 <= t.rows &&
                (size_t)(cur.q + 1) * run_len * kTileV3 <= t.cols)
                rimg_cur = rimg[rp];
        }
        uint4 lo[8], hi[8];
        if (have) {
            cp_async_wait_v3();
#pragma unroll
            for (int i = 0; i < 8; i++) lo[i] = ahead[i][g.tid];
        } else if (!act) { /* defined values for the words below, never stored */
#pragma unroll
            for (int i = 0; i < 8; i++) lo[i] = hi[i] = make_uint4(0u, 0u, 0u, 0u);
        } else if (kBf) {
            if (fast_v3(fl, t, R, C))
                load_bf16_v3(t, R, C, lo);
            else
                load_slow_v3<true>(t, R, C, lo, hi);
        } else {
            if (fast_v3(fl, t, R, C))
                load_f32_v3(t, R, C, lo, hi);
            else
                load_slow_v3<false>(t, R, C, lo, hi);
        }
        /* the next tile: the run's next, or the first of the run a grid
         * stride on */
        bool more = j + 1 < len;
        TileV3 nt = cur;
        uint32_t nj = j + 1, nrun = run;
        if (!more) {
            nrun = run + (kClu ? gridDim.x / kBand : gridDim.x);
            more = nrun < total;
            nj = 0;
            if (more) nt = tile_step_v3(p, cur, nrun);
        }
        const size_t nr0 = (size_t)(kClu ? nt.rt * kBand + band_member_v3() : nt.rt) * kTR,
                     nc0 = (size_t)(nt.q * run_len + nj) * kTC;
        /* FP32 rows would need twice the shared memory: those load in place.
         * Whole tiles only, a test the same for the whole block (a tile at
         * the tensor's edge loads in place, each thread as fast_v3 says) */
        have = kBf && more && act && (p.fl[nt.k] & kFlX16) && nr0 + kTR <= b.t[nt.k].rows &&
               nc0 + kTC <= b.t[nt.k].cols;
        const auto prefetch = [&]() {
            if (!kBf || !have) return;
            const etp__qb_tensor_t &ntt = b.t[nt.k];
            const size_t K = ntt.cols;
            const uint16_t *x = static_cast<const uint16_t *>(ntt.x) + (nr0 + g.tr) * K + nc0 + g.tc;
#pragma unroll
            for (int i = 0; i < 8; i++) cp_async16_v3(&ahead[kBf ? i : 0][g.tid], x + i * K);
            cp_async_commit_v3();
        };
        constexpr bool nv = kNv;
        if (nv && k != nvk) {
            const float s_enc = etp__qf_nvfp4_s_enc(b.amax[b.first + k]);
            s_enc_6 = etp__qf_nvfp4_s_enc_6(s_enc);
            s_dec = 1.0f / s_enc;
            nvk = k;
        }
        /* NVFP4 columnwise codes of whole tiles with 16-byte aligned output
         * rows are staged (the same for every thread of the block) */
        uint8_t *cstage = nullptr;
        if (nv && (fl & kFlStage) && r0 + kTileV3 <= t.rows && c0 + kTileV3 <= t.cols)
            cstage = stage + par * kStageBytes;
        uint32_t w[8][8];
        words_v3<kBf>(lo, hi, w);
        if (act) {
            if (nv)
                nv_tile_v3<kBf, kClu>(b, t, fl, g, R, C, w, s_enc_6, s_dec, st[par], cstage, prefetch);
            else
                mx_tile_v3<kBf, kWide>(b, t, fl, g, R, C, w, st[par], prefetch);
        }
        __syncthreads();
        /* kClu (launched only for 16x16 blocks and row-major scales): the
         * band's kBand tiles whole, their columnwise scales merged (the same
         * for every block of the cluster) */
        const bool merged = kClu && (fl & kFlMerge) && (size_t)(cur.rt + 1) * kBand * kTileV3 <= t.rows &&
                            c0 + kTileV3 <= t.cols;
        /* every thread has filled the previous run's image: it leaves (the
         * image is filled again two runs on, after at least one more
         * barrier) */
        if (pend) run_out_v3(pend_img, pend_scales, pend_ld, pend_r0, pend_kb0, g.tid, b.compact);
        pend = false;
        if (act) {
            if (kWide)
                mx_wide_scales_out_v3(t, fl, r0, c0, st[par]);
            else
                scales_out_v3<kNv, kClu>(b, t, fl, r0, c0, st[par], rimg_cur, (int)j * kBlocksPerTile, !merged);
        }
        if (cstage) stage_out_v3(cstage, t.col_data, t.rows / 2, c0, r0 / 2, g.tid);
        if (kImg && rimg_cur && j + 1 == len) { /* the run's last tile */
            const etp__qf_scale_shape_t ss =
                kNv ? etp__qf_nvfp4_row_scales(t.rows, t.cols) : etp__qf_mxfp8_row_scales(t.rows, t.cols);
            pend = true;
            pend_img = rimg_cur;
            pend_scales = t.row_scales;
            pend_ld = ss.cols;
            pend_r0 = r0;
            pend_kb0 = (size_t)cur.q * kRunRowBytes;
        }
        if (kClu) {
            /* the previous tile's merged pieces, complete once their bytes
             * have arrived (the mbarrier). Reading them before arriving
             * (relaxed) is enough to let the senders reuse the buffer after
             * the next wait: their values are consumed, by the store, before
             * the arrival is issued. */
            if (cs & kArrived) cluster_wait_v3();
            if (cs & kPm) {
                const int q = par ^ 1;
                if (g.tid < 64) {
                    mbar_wait_v3(&cbar[q], (cs / (kPh << q)) & 1u);
                    const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
                    const uint4 v =
                        *reinterpret_cast<const uint4 *>(&cimg[q * kCimgBytes + (jl >> 4) * (kBand * 8) + 16 * h]);
                    if (!b.compact || (jl & 15) == 15)
                        *reinterpret_cast<uint4 *>(mdst[g.tid]) = v;
                }
                cs ^= kPh << q;
            }
            /* this tile's 16x16 blocks' scales, a word of 4 M-blocks a
             * thread, to the blocks that write them */
            if (merged) {
                if (g.tid == 0) mbar_expect_v3(&cbar[par], kCimgBytes);
                if (g.tid < 16) {
                    const int h = g.tid & 1, bj = g.tid >> 1;
                    const uint32_t v = (uint32_t)st[par][1][4 * h][bj * 16] |
                                       (uint32_t)st[par][1][4 * h + 1][bj * 16] << 8 |
                                       (uint32_t)st[par][1][4 * h + 2][bj * 16] << 16 |
                                       (uint32_t)st[par][1][4 * h + 3][bj * 16] << 24;
                    const int at = par * kCimgBytes + (bj % kBandGroups) * (kBand * 8) + band_member_v3() * 8 + 4 * h;
                    st_async_v3(&cimg[at], &cbar[par], (uint32_t)(bj / kBandGroups), v);
                }
                /* this block's kBandCols columns of the band: kBand * 8
                 * bytes (the kBand tiles' 8 M-blocks each) of kBandCols
                 * scale rows, 16 bytes a thread */
                if (g.tid < 64) {
                    const size_t cld = etp__qf_nvfp4_col_scales(t.rows, t.cols).cols;
                    const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
                    const size_t row = c0 + band_member_v3() * kBandCols + jl;
                    mdst[g.tid] =
                        static_cast<uint8_t *>(t.col_scales) + row * cld + (size_t)cur.rt * (kBand * 8) + 16 * h;
                }
            }
            cs = (cs & ~(kPm | kLpar)) | kArrived | (merged ? kPm : 0u) | (par ? kLpar : 0u);
            cluster_arrive_v3();
        }
        if (j + 1 == len) rp ^= 1;
        if (!more) break;
        run = nrun;
        cur = nt;
        j = nj;
    }
    if (kImg && pend) {
        __syncthreads();
        run_out_v3(pend_img, pend_scales, pend_ld, pend_r0, pend_kb0, g.tid, b.compact);
    }
    if (kClu) { /* the last tile's merged pieces (and no block leaves while others may write to it) */
        cluster_wait_v3();
        if ((cs & kPm) && g.tid < 64) {
            const int q = (cs & kLpar) ? 1 : 0;
            mbar_wait_v3(&cbar[q], (cs / (kPh << q)) & 1u);
            const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
            const uint4 v = *reinterpret_cast<const uint4 *>(&cimg[q * kCimgBytes + (jl >> 4) * (kBand * 8) + 16 * h]);
            if (!b.compact || (jl & 15) == 15)
                *reinterpret_cast<uint4 *>(mdst[g.tid]) = v;
        }
    }
}

/* ---- compact scales: the expansion ----------------------------------------
 *
 * With 16x16 NVFP4 blocks every 16 consecutive rows of a row-major scale
 * matrix are equal (a block's scale repeats on each of its 16 rows, and in
 * the columnwise matrix on each of its 16 columns). A tile writes 8 or 16
 * bytes of each of its 128 rows, pieces of 32-byte sectors in 128
 * different lines; with compaction (batch.compact, whole interior tiles of
 * tensors kFlRimg / kFlMerge) it writes only rows 16g + 15, and this kernel
 * then copies each such row over rows 16g .. 16g + 14, whole lines. A
 * group's rows all lie inside the tensor (g < M / 16 rowwise, K / 16
 * columnwise): rows past it are padding, zero, and never copied over, and
 * a row 16g + 15 is complete once the cast is, every tile writing its part
 * of it (edge tiles write all their rows, which the copy rewrites with
 * equal bytes). Units: 16 bytes of one group's source row; p.tiles_c[k]:
 * the rowwise units of tensor k, then its columnwise ones. */
__global__ void __launch_bounds__(kThreads) expand_kernel_v3(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    const uint32_t total = p.tile_start[b.n];
    for (uint32_t u = blockIdx.x * kThreads + threadIdx.x; u < total; u += gridDim.x * kThreads) {
        uint32_t local;
        const uint32_t k = find_tensor(p, u, &local);
        const etp__qb_tensor_t &t = b.t[k];
        uint8_t *base;
        size_t ld;
        if (local < p.tiles_c[k]) {
            base = static_cast<uint8_t *>(t.row_scales);
            ld = etp__qf_nvfp4_row_scales(t.rows, t.cols).cols;
        } else {
            local -= p.tiles_c[k];
            base = static_cast<uint8_t *>(t.col_scales);
            ld = etp__qf_nvfp4_col_scales(t.rows, t.cols).cols;
        }
        const size_t per = ld / 16, g = local / per;
        uint8_t *d = base + 16 * g * ld + 16 * (local % per);
        const uint4 v = *reinterpret_cast<const uint4 *>(d + 15 * ld);
#pragma unroll
        for (int i = 0; i < 15; i++) *reinterpret_cast<uint4 *>(d + i * ld) = v;
    }
}



/* The kFl* facts of tensor t of a v3 cast. */
uint8_t cast_flags_v3(const etp__qbatch_t *b, const etp__qb_tensor_t &t)
{
    const bool nv = b->format == ETP__QB_NVFP4;
    const size_t es = t.dtype == ETP__QB_BF16 ? 2 : 4;
    const auto al16 = [](const void *q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
    uint8_t f = 0;
    if (al16(t.x) && ((size_t)t.cols * es) % 16 == 0) f |= kFlX16;
    if (t.row_data) f |= kFlRow;
    if (t.col_data) f |= kFlCol;
    if (nv && t.col_data && (t.rows / 2) % 16 == 0 && al16(t.col_data)) f |= kFlStage;
    if (nv && t.row_data && !b->swizzle && etp__qf_nvfp4_row_scales(t.rows, t.cols).cols % 16 == 0 &&
        al16(t.row_scales))
        f |= kFlRimg;
    if (nv && t.col_data && !b->swizzle && etp__qf_nvfp4_col_scales(t.rows, t.cols).cols % 16 == 0 &&
        al16(t.col_scales))
        f |= kFlMerge;
    return f;
}

/* Runs a resident block from which a launch compacts its scales. */
constexpr uint64_t kCompactRuns = 4;

/* The expansion's units (16 bytes of one group's source row) of the
 * tensors whose input type's cast compacted: p->tile_start their prefix
 * sum, p->tiles_c[k] tensor k's rowwise ones (its columnwise ones follow).
 * p == nullptr: the count alone (the launcher checks it before the cast
 * runs, and fills p after the cast's launches, whose plan p held). */
uint64_t plan_expand_v3(const etp__qbatch_t *b, const uint8_t *fl, const bool compacted[2], Params *p)
{
    uint64_t units = 0;
    for (uint32_t k = 0; k < b->n; k++) {
        const etp__qb_tensor_t &t = b->t[k];
        uint64_t ru = 0, cu = 0;
        if (t.dtype <= ETP__QB_F32 && compacted[t.dtype]) {
            if (fl[k] & kFlRimg) ru = (uint64_t)(t.rows / 16) * (etp__qf_nvfp4_row_scales(t.rows, t.cols).cols / 16);
            if (fl[k] & kFlMerge) cu = (uint64_t)(t.cols / 16) * (etp__qf_nvfp4_col_scales(t.rows, t.cols).cols / 16);
        }
        if (p) {
            p->tile_start[k] = (uint32_t)units;
            p->tiles_c[k] = (uint32_t)ru;
        }
        units += ru + cu;
    }
    if (p) p->tile_start[b->n] = (uint32_t)units;
    return units;
}

/* The NVFP4 v3 cast's dynamic shared memory: two tiles' staged columnwise
 * codes, beyond the 48 KiB a block gets without asking with the static
 * shared memory, so the kernel must be allowed it first. */
constexpr size_t kCastV3NvDyn = 2 * (size_t)kStageBytes;

/* A launch of `blocks` blocks in clusters of kBand (the kClu kernel); attr
 * is the configuration's storage. */
cudaLaunchConfig_t cluster_config_v3(unsigned blocks, cudaStream_t s, cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = kBand;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kCastV3NvDyn;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* p's run prefix sums for one launch of a v3 cast: the tensors of input
 * type `only` (the others get none), runs of `run` tiles along a tile row,
 * in bands of `band` tile rows (clusters). */
uint64_t plan_tiles_v3(const etp__qbatch_t *batch, int only, uint32_t run, Params *p, bool wide, uint32_t band = 1)
{
    return plan_units(batch, p, [&](uint32_t k) -> uint64_t {
        const etp__qb_tensor_t &t = batch->t[k];
        if (t.dtype != only) return 0;
        size_t re, ce;
        const size_t tr = wide ? kWideRows : kTileV3, tc = wide ? kWideCols : kTileV3;
        cast_extent_v3(t, wide, &re, &ce);
        p->tiles_c[k] = ce / tc ? (uint32_t)(ce / tc) : 1; /* >= 1: the launcher divides by runs */
        p->runs_c[k] = (p->tiles_c[k] + run - 1) / run;
        /* no columns: nothing to write, not a tile row of empty tiles
         * ([2^31 - 1, 0] would launch 2^24 of them) */
        if (ce == 0) return 0;
        return (uint64_t)((re / tr + band - 1) / band) * p->runs_c[k];
    });
}

} // namespace

cudaError_t launch_cast_v3(cudaStream_t s, const etp__qbatch_t *batch, Params &p)
{
    { /* whole-tile MXFP8 batches: their own kernel */
        bool done = false;
        const cudaError_t e = launch_whole_v3(s, batch, p, &done);
        if (e != cudaSuccess || done) return e;
    }
    void *args[] = {&p};
    const bool nv = batch->format == ETP__QB_NVFP4;
    const bool wide = !nv && !batch->swizzle; /* square MXFP8 tiles: swizzled scales only */
    const uint64_t most = (uint64_t)batch->sms * (nv ? kCastV3NvBlocksPerSm : kCastV3MxBlocksPerSm);
    uint64_t totals[2];
    uint32_t runs[2] = {1, 1};
    /* compact scales (the expansion above) for launches of at least
     * kCompactRuns runs a resident block: smaller ones, whose outputs L2
     * holds whole, complete their scale sectors there and only pay for
     * the second launch (H100, 64 x [1024, 512]: 50 -> 54 us; 8 x [8192,
     * 4096]: 344 -> 312 us; the crossover on H100 and H200 near 4 x
     * [8192, 4096], docs/PERF.md); compact_all (a test knob): every
     * launch it applies to */
    const bool compact = nv && batch->block2d && !batch->swizzle;
    bool compacted[2] = {false, false};
    for (uint32_t k = 0; k < batch->n; k++) p.fl[k] = cast_flags_v3(batch, batch->t[k]);
    for (int dt = 0; dt < 2; dt++) { /* checked before anything is launched */
        if ((totals[dt] = plan_tiles_v3(batch, dt, 1, &p, wide)) > 0x7fffffffu) return cudaErrorInvalidValue;
        /* NVFP4 in runs where there are enough to give every resident
         * block one: fewer, and a run's tiles would wait on one block
         * that many blocks could share (a [1024, 512] weight alone: 8
         * runs, 2.4x slower) */
        if (nv && totals[dt] >= (uint64_t)kRunNv * (most ? most : 1)) {
            runs[dt] = kRunNv;
            totals[dt] = plan_tiles_v3(batch, dt, kRunNv, &p, wide);
        }
        compacted[dt] = compact && totals[dt] > 0 &&
                        (batch->compact_all || (runs[dt] == kRunNv && totals[dt] >= kCompactRuns * most));
    }
    const uint64_t expand_units = plan_expand_v3(batch, p.fl, compacted, nullptr);
    if (expand_units > 0x7fffffffu) return cudaErrorInvalidValue;
    for (int dt = 0; dt < 2; dt++) {
        if (totals[dt] == 0) continue;
        /* NVFP4 16x16 blocks, row-major scales, in runs: clusters of
         * kBand blocks take bands of runs (the kClu kernel). Every device
         * built for (sm_90 and later) launches clusters, but whether a
         * cluster of these blocks fits is the driver's answer at run time
         * (etp__cuda_quant_cluster_fit), and a cluster launch that cannot
         * fit fails. Where it says none fits (clusters 0), the general
         * kernel: the same bytes in 8-byte scale pieces (6-9% slower),
         * and it runs every other NVFP4 launch anyway, so the fallback
         * costs no code (the test knob quant_no_clusters keeps it tested). */
        const bool clu = nv && runs[dt] == kRunNv && batch->clusters && batch->block2d && !batch->swizzle;
        const uint32_t band = clu ? kBand : 1;
        p.b.compact = compacted[dt] ? 1u : 0u;
        const uint64_t units = plan_tiles_v3(batch, dt, runs[dt], &p, wide, band);
        p.run = runs[dt];
        uint64_t grid = units; /* kClu: clusters */
        /* clusters: as many as the device holds at once (fewer than
         * most / kBand where a GPC's slots are not a multiple of kBand;
         * more would run as a second wave) */
        const uint64_t most_c = most / kBand ? most / kBand : 1;
        const uint64_t fit = !clu ? most : batch->clusters < most_c ? batch->clusters : most_c;
        if (batch->sms) grid = grid < fit ? grid : fit;
        for (uint32_t k = 0; k < batch->n; k++) {
            p.step_r[k] = (uint32_t)(grid / p.runs_c[k]);
            p.step_c[k] = (uint32_t)(grid % p.runs_c[k]);
        }
        const bool bf = dt == ETP__QB_BF16;
        const void *fn = clu    ? (bf ? (const void *)cast_kernel_v3<true, true, false, true>
                                      : (const void *)cast_kernel_v3<false, true, false, true>)
                         : nv   ? (bf ? (const void *)cast_kernel_v3<true, true, false>
                                      : (const void *)cast_kernel_v3<false, true, false>)
                         : wide ? (bf ? (const void *)cast_kernel_v3<true, false, true>
                                      : (const void *)cast_kernel_v3<false, false, true>)
                                : (bf ? (const void *)cast_kernel_v3<true, false, false>
                                      : (const void *)cast_kernel_v3<false, false, false>);
        const size_t dyn = nv ? kCastV3NvDyn : 0;
        if (dyn) {
            const cudaError_t ea = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
            if (ea != cudaSuccess) return ea;
        }
        if (clu) {
            cudaLaunchAttribute attr;
            const cudaLaunchConfig_t cfg = cluster_config_v3((unsigned)(grid * kBand), s, &attr);
            const cudaError_t e = cudaLaunchKernelExC(&cfg, fn, args);
            if (e != cudaSuccess) return e;
            continue;
        }
        const cudaError_t e = cudaLaunchKernel(fn, dim3((unsigned)grid), dim3(kThreads), args, dyn, s);
        if (e != cudaSuccess) return e;
    }
    if (expand_units == 0) return cudaSuccess;
    /* the compacted tensors' scale rows copied over their groups */
    plan_expand_v3(batch, p.fl, compacted, &p);
    uint64_t eg = (expand_units + kThreads - 1) / kThreads;
    const uint64_t ecap = (uint64_t)(batch->sms ? batch->sms : 1) * 16;
    eg = eg < ecap ? eg : ecap;
    return cudaLaunchKernel((const void *)expand_kernel_v3, dim3((unsigned)eg), dim3(kThreads), args, 0, s);
}

} // namespace etp__qk

extern "C" cudaError_t etp__cuda_quant_cluster_fit(uint32_t *clusters)
{
    using namespace etp__qk;
    *clusters = 0;
    int dev = 0, can = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev);
    if (e != cudaSuccess || !can) return e;
    const void *fns[2] = {(const void *)cast_kernel_v3<true, true, false, true>,
                          (const void *)cast_kernel_v3<false, true, false, true>};
    int fit = 0x7fffffff;
    for (int f = 0; f < 2; f++) {
        e = cudaFuncSetAttribute(fns[f], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kCastV3NvDyn);
        if (e != cudaSuccess) return e;
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = cluster_config_v3(kBand, 0, &attr);
        int n = 0;
        e = cudaOccupancyMaxActiveClusters(&n, fns[f], &cfg);
        if (e != cudaSuccess) return e;
        fit = n < fit ? n : fit;
    }
    *clusters = fit > 0 ? (uint32_t)fit : 0u;
    return cudaSuccess;
}
