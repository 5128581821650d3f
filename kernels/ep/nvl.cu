/*
 * The NVLink transport's kernels (src/backend/ep_args.h: etp__ep_xchg_args_t,
 * etp__ep_t2e_args_t and etp__ep_e2t_args_t define what each computes; the
 * window and its flags are described there). A call's sending kernel has
 * `blocks` blocks per rank: they store their share of the rows straight
 * into the peers' slabs (addresses from NCCL's LSA pointers, taken once at
 * the window's creation) and count their arrival in each peer's window. Its
 * receiving kernel (wide_blocks: the whole device) waits until every
 * sending block of every rank has arrived here, finishes the call's work on
 * this rank's slabs (the expand, or the token sums) and releases them to
 * their writers. dispatch's sending kernel expands the rank's own tokens
 * on its other blocks, and combine's pre-sums there;
 * prepare's exchange is one kernel, and so is a low-latency layer's
 * combine, whose token sums wait for the blocks that pre-summed each
 * token rather than for all (its flags, ep_args.h).
 * Every wait is bounded by nvl.timeout_ns: a kernel that gives up records
 * the rank it waited for in host-mapped memory (nvl_sync.cuh), which the
 * backend's waits report (cuda_ep.c), and leaves.
 *
 * The arithmetic is ep_rules.h's, element by element in the same order as
 * the host backend's pack/expand/presum/reduce kernels: a warp owns a row,
 * each lane whole 16-byte groups of elements, and every element's terms are
 * taken in the rules' order; so results equal EXACT's bit for bit. Compiled
 * with --fmad=false like ep.cu.
 */
#include <stdint.h>

#include "ep/ep_rules.h"
#include "ep_dev.cuh"
#include "ep_vec.cuh"
#include "layout_dev.cuh"
#include "nvl_kernels.h"
#include "nvl_sync.cuh"

namespace {

using etp_ep_vec::store_bf16;
using etp_ep_vec::unpack16;
using namespace etp_nvl_sync;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
/* ranks a warp keeps in registers (per lane: one peer); larger groups are
 * refused by the launcher */
constexpr int kMaxRanks = 32;

__device__ __forceinline__ int64_t tokens_of(const int32_t *t_dev, int64_t t_max)
{
    return etp__ep_clamp_tokens(*t_dev, t_max);
}

/* ---- prepare's exchange ---------------------------------------------------- */

__device__ __forceinline__ int32_t *cnt(const etp__ep_nvl_t &n, int rank)
{
    return reinterpret_cast<int32_t *>(n.peers[rank] + n.cnt_off);
}

__device__ __forceinline__ int32_t *meta(const etp__ep_nvl_t &n, int rank)
{
    return reinterpret_cast<int32_t *>(n.peers[rank] + n.small_off);
}

__global__ void __launch_bounds__(kThreads) xchg_kernel(etp__ep_xchg_args_t a)
{
    const etp__ep_nvl_t &n = a.nvl;
    uint64_t call_no;
    int64_t t0;
    if (!call_begin(n, ETP__EP_NVL_PREPARE, &call_no, &t0)) return;
    const int R = n.ranks, k = a.k, me = n.me;
    const int64_t tm = n.t_max, T = tokens_of(a.t_dev, tm), L = a.local_experts;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nth = (int64_t)n.blocks * blockDim.x;
    /* a thread per copy (token, destination): its metadata row */
    for (int64_t x = tid; x < T * R; x += nth) {
        const int64_t t = x / R;
        const int d = (int)(x % R);
        const int32_t pos = a.send_pos[x];
        if (pos < 0) continue;
        int32_t *m = meta(n, d) + etp__ep_nvl_row(me, tm, pos) * k;
        const int64_t *idx = a.topk_idx + t * k;
        const int32_t *sd = a.slot_dest + t * k;
        if ((k & 3) == 0) {
            for (int j = 0; j < k; j += 4) {
                int32_t v[4];
                etp__ep_meta_row(idx + j, sd + j, 4, d, L, v);
                reinterpret_cast<int4 *>(m)[j / 4] = make_int4(v[0], v[1], v[2], v[3]);
            }
        } else {
            for (int j = 0; j < k; j++) etp__ep_meta_row(idx + j, sd + j, 1, d, L, m + j);
        }
    }
    if (blockIdx.x == 0)
        for (int x = threadIdx.x; x < R * R; x += blockDim.x)
            cnt(n, x / R)[me * R + x % R] = a.send_cnt[x % R];
    __syncthreads();
    if (threadIdx.x == 0) signal_all(n, 0);
    if (!block_wait(n, 0, etp__ep_nvl_mark(call_no, n.blocks), ETP__EP_NVL_PREPARE,
                    ETP__EP_NVL_WAIT_ARRIVAL, t0))
        return;
    /* every rank's counts and metadata are here: keep them, clip */
    const int32_t *C = cnt(n, me);
    __shared__ int64_t acc[kMaxRanks];
    if ((int)threadIdx.x < R) acc[threadIdx.x] = etp__ep_accepted(C, R, a.tok_cap, me, threadIdx.x);
    __syncthreads();
    if (blockIdx.x == 0) {
        for (int x = threadIdx.x; x < R * R; x += blockDim.x) a.C[x] = C[x];
        if ((int)threadIdx.x < R && acc[threadIdx.x] != C[(int64_t)me * R + threadIdx.x]) {
            etp_ep_dev::stat_max(a.stats, ETP__EP_ST_TRANSPORT_NEEDED,
                                 etp__ep_wanted_by(C, R, (int)threadIdx.x));
            etp_ep_dev::stat_flag(a.stats, ETP__EP_F_TRANSPORT_FULL);
        }
    }
    const int64_t nm = (int64_t)R * tm * k;
    const int32_t *mine = meta(n, me);
    if ((nm & 3) == 0) {
        for (int64_t x = tid; x < nm / 4; x += nth)
            reinterpret_cast<int4 *>(a.recv_meta)[x] = reinterpret_cast<const int4 *>(mine)[x];
    } else {
        for (int64_t x = tid; x < nm; x += nth) a.recv_meta[x] = mine[x];
    }
    for (int64_t x = tid; x < T * R; x += nth) {
        const int d = (int)(x % R);
        const int dropped = etp__ep_clip_copy(acc[d], a.slot_dest + (x / R) * k, k, d, a.send_pos + x);
        etp_ep_dev::stat_add(a.stats, ETP__EP_ST_TRANSPORT_DROPPED, dropped);
    }
    if (a.lay.after_exchange) {
        /* the layout's chunk counts from the rows here, not from the copy
         * other blocks are still writing */
        etp__ep_layout_args_t la = a.lay;
        la.C = C;
        la.recv_meta = mine;
        etp_ep_layout::count_chunks(la);
    }
    block_end(n, call_no);
}

/* ---- token side to expert side -------------------------------------------- */

/* The destinations of token t that it is sent to: a mask of ranks, and per
 * lane d < R the slab row there. */
__device__ __forceinline__ unsigned dest_mask(const etp__ep_t2e_args_t &a, int64_t t, int64_t *row)
{
    const int lane = threadIdx.x & 31;
    int32_t pos = -1;
    if (lane < a.nvl.ranks) pos = a.send_pos[t * a.nvl.ranks + lane];
    *row = pos >= 0 ? etp__ep_nvl_row(a.nvl.me, a.nvl.t_max, pos) : -1;
    return __ballot_sync(kFull, pos >= 0);
}

/* 16-byte words [0, nc) of src into each of the nd rows dst, a warp: 8
 * words a lane loaded before their stores, so that a warp keeps 4 KB of
 * reads in flight (one 14 KB row is 3.5 rounds). */
constexpr int kCopyUnroll = 8;

/* written: src was written by this kernel's other blocks (loads through
 * L2 only, not the read-only path) */
template <bool written = false>
__device__ __forceinline__ void warp_copy16(const uint4 *src, char *const *dst, int nd, int64_t nc)
{
    const int lane = threadIdx.x & 31;
    for (int64_t c0 = lane; c0 < nc; c0 += 32 * kCopyUnroll) {
        uint4 v[kCopyUnroll];
#pragma unroll
        for (int u = 0; u < kCopyUnroll; u++)
            if (c0 + 32 * u < nc) v[u] = written ? __ldcg(src + c0 + 32 * u) : __ldg(src + c0 + 32 * u);
        for (int q = 0; q < nd; q++) {
            uint4 *d4 = reinterpret_cast<uint4 *>(dst[q]);
#pragma unroll
            for (int u = 0; u < kCopyUnroll; u++)
                if (c0 + 32 * u < nc) d4[c0 + 32 * u] = v[u];
        }
    }
}

/* Token t's row (rb bytes) into every destination's token slab. */
__device__ void store_token(const etp__ep_t2e_args_t &a, int64_t t, unsigned mask, int64_t row,
                            int64_t rb, bool vec)
{
    const int lane = threadIdx.x & 31;
    const char *src = static_cast<const char *>(a.tokens) + t * rb;
    char *dst[kMaxRanks];
    int nd = 0;
    for (unsigned m = mask; m; m &= m - 1) {
        const int d = __ffs(m) - 1;
        const int64_t r = __shfl_sync(kFull, row, d);
        dst[nd++] = a.nvl.peers[d] + a.nvl.tok_off + r * rb;
    }
    if (vec) {
        warp_copy16(reinterpret_cast<const uint4 *>(src), dst, nd, rb / 16);
    } else {
        for (int64_t b = lane; b < rb; b += 32) {
            const char v = src[b];
            for (int q = 0; q < nd; q++) dst[q][b] = v;
        }
    }
}

/* MXFP8: token t quantized once (etp__ep_mx_block per 32-element block),
 * its wire row into every destination. */
__device__ void store_token_mx(const etp__ep_t2e_args_t &a, int64_t t, unsigned mask, int64_t row)
{
    const int lane = threadIdx.x & 31;
    const int64_t H = a.hidden, nb = H / ETP__EP_MX_BLOCK, rb = ETP__EP_MX_ROW_BYTES(H);
    char *dst[kMaxRanks];
    int nd = 0;
    for (unsigned m = mask; m; m &= m - 1) {
        const int d = __ffs(m) - 1;
        const int64_t r = __shfl_sync(kFull, row, d);
        dst[nd++] = a.nvl.peers[d] + a.nvl.tok_off + r * rb;
    }
    const bool vec = a.dtype == ETP__EP_BF16 &&
                     ((reinterpret_cast<uintptr_t>(a.tokens) | (uintptr_t)(H * 2)) & 15u) == 0;
    for (int64_t b = lane; b < nb; b += 32) {
        const int64_t h0 = t * H + b * ETP__EP_MX_BLOCK;
        float x[ETP__EP_MX_BLOCK];
        if (vec) {
            const uint4 *s4 = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.tokens) + h0);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 v = __ldg(s4 + q);
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    x[q * 8 + 2 * c] = etp__qf_bf16_to_f32((uint16_t)(w[c] & 0xffffu));
                    x[q * 8 + 2 * c + 1] = etp__qf_bf16_to_f32((uint16_t)(w[c] >> 16));
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < ETP__EP_MX_BLOCK; c++) x[c] = etp__ep_load(a.tokens, a.dtype, h0 + c);
        }
        uint8_t q8[ETP__EP_MX_BLOCK];
        const uint8_t e = etp__ep_mx_block(x, q8);
        uint32_t w[8];
#pragma unroll
        for (int c = 0; c < 8; c++)
            w[c] = (uint32_t)q8[4 * c] | (uint32_t)q8[4 * c + 1] << 8 |
                   (uint32_t)q8[4 * c + 2] << 16 | (uint32_t)q8[4 * c + 3] << 24;
        for (int q = 0; q < nd; q++) {
            uint4 *d4 = reinterpret_cast<uint4 *>(dst[q] + b * ETP__EP_MX_BLOCK);
            d4[0] = make_uint4(w[0], w[1], w[2], w[3]);
            d4[1] = make_uint4(w[4], w[5], w[6], w[7]);
            dst[q][H + b] = (char)e;
        }
    }
    for (int64_t i = H + nb + lane; i < rb; i += 32)
        for (int q = 0; q < nd; q++) dst[q][i] = 0;
}

/* Row r of the layout from received token row i = src / k (etp__ep_expand_args_t). */
__device__ void expand_row(const etp__ep_t2e_args_t &a, const char *slab, const float *recv_w,
                           int64_t r, int64_t rb, bool vec)
{
    const int lane = threadIdx.x & 31;
    const int32_t src = a.row_src[r];
    const int64_t H = a.hidden;
    if (lane == 0) {
        const float w = etp__ep_row_weight(recv_w, src);
        if (a.out_w) a.out_w[r] = w;
        if (a.keep_w) a.keep_w[r] = w;
    }
    if (a.mx) {
        const int64_t nb = H / ETP__EP_MX_BLOCK;
        char *od = static_cast<char *>(a.out) + r * H;
        char *os = static_cast<char *>(a.out_scales) + r * nb;
        const char *in = src < 0 ? nullptr : slab + (int64_t)(src / a.k) * rb;
        if (vec && (H & 15) == 0) {
            for (int64_t c = lane; c < H / 16; c += 32)
                reinterpret_cast<uint4 *>(od)[c] =
                    in ? reinterpret_cast<const uint4 *>(in)[c] : make_uint4(0, 0, 0, 0);
        } else {
            for (int64_t b = lane; b < H; b += 32) od[b] = in ? in[b] : 0;
        }
        for (int64_t b = lane; b < nb; b += 32) os[b] = in ? in[H + b] : 0;
        return;
    }
    char *o = static_cast<char *>(a.out) + r * rb;
    if (src < 0) {
        if (vec)
            for (int64_t c = lane; c < rb / 16; c += 32) reinterpret_cast<uint4 *>(o)[c] = make_uint4(0, 0, 0, 0);
        else
            for (int64_t b = lane; b < rb; b += 32) o[b] = 0;
        return;
    }
    const char *in = slab + (int64_t)(src / a.k) * rb;
    if (a.scale_w) {
        const float w = a.scale_w[r];
        for (int64_t h = lane; h < H; h += 32)
            etp__ep_store(a.out, a.dtype, r * H + h, w * etp__ep_load(in, a.dtype, h));
    } else if (vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(in);
        uint4 *o4 = reinterpret_cast<uint4 *>(o);
        int64_t c = lane;
        const int64_t nc = rb / 16;
        for (; c + 96 < nc; c += 128) {
            const uint4 v0 = s4[c], v1 = s4[c + 32], v2 = s4[c + 64], v3 = s4[c + 96];
            o4[c] = v0;
            o4[c + 32] = v1;
            o4[c + 64] = v2;
            o4[c + 96] = v3;
        }
        for (; c < nc; c += 32) o4[c] = s4[c];
    } else {
        for (int64_t b = lane; b < rb; b += 32) o[b] = in[b];
    }
}

/* Row r's weight (0 for a row without a token), where asked for. */
__device__ __forceinline__ void row_weight(const etp__ep_t2e_args_t &a, const float *recv_w,
                                           int64_t r, int32_t src)
{
    if ((threadIdx.x & 31) != 0) return;
    const float w = etp__ep_row_weight(recv_w, src);
    if (a.out_w) a.out_w[r] = w;
    if (a.keep_w) a.keep_w[r] = w;
}

/* Row r of the layout row space when it holds no token: zero. With
 * recv_w (or none needed: weighted == false), also every row's weight. */
__device__ void expand_empty(const etp__ep_t2e_args_t &a, const float *recv_w, int64_t r,
                             int64_t rb, bool weights = true)
{
    const int lane = threadIdx.x & 31;
    const int32_t src = a.row_src[r];
    if (weights) row_weight(a, recv_w, r, src);
    if (src >= 0) return;
    /* MXFP8: H data bytes a row (rb is the wire row), and the scales */
    const int64_t ob = a.mx ? a.hidden : rb;
    uint4 *o = reinterpret_cast<uint4 *>(static_cast<char *>(a.out) + r * ob);
    for (int64_t c = lane; c < ob / 16; c += 32) o[c] = make_uint4(0, 0, 0, 0);
    if (a.mx) {
        const int64_t nb = a.hidden / ETP__EP_MX_BLOCK;
        char *os = static_cast<char *>(a.out_scales) + r * nb;
        for (int64_t b = lane; b < nb; b += 32) os[b] = 0;
    }
}

/* MXFP8: received wire row `in` into each of its nr rows: H data bytes
 * (16 bytes a lane, 4 in flight) and H/32 scale bytes. */
__device__ void expand_token_mx(const etp__ep_t2e_args_t &a, const char *in, const int32_t *rows,
                                int nr)
{
    const int lane = threadIdx.x & 31;
    const int64_t H = a.hidden, nb = H / ETP__EP_MX_BLOCK, nc = H / 16;
    const uint4 *s4 = reinterpret_cast<const uint4 *>(in);
    int64_t c = lane;
    for (; c + 96 < nc; c += 128) {
        const uint4 v0 = s4[c], v1 = s4[c + 32], v2 = s4[c + 64], v3 = s4[c + 96];
        for (int m = 0; m < nr; m++) {
            uint4 *o4 = reinterpret_cast<uint4 *>(static_cast<char *>(a.out) + rows[m] * H);
            o4[c] = v0;
            o4[c + 32] = v1;
            o4[c + 64] = v2;
            o4[c + 96] = v3;
        }
    }
    for (; c < nc; c += 32) {
        const uint4 v = s4[c];
        for (int m = 0; m < nr; m++) reinterpret_cast<uint4 *>(static_cast<char *>(a.out) + rows[m] * H)[c] = v;
    }
    for (int64_t b = lane; b < nb; b += 32) {
        const char v = in[H + b];
        for (int m = 0; m < nr; m++) static_cast<char *>(a.out_scales)[rows[m] * nb + b] = v;
    }
}

/* Received token row i (rb bytes at `in`) into each of its nr rows of the
 * layout (ascending): read once, 4 x 16 bytes a lane at a time. The rows
 * are the token's exact bytes (no scale_w: that takes expand_row). */
__device__ void expand_token(const etp__ep_t2e_args_t &a, const char *in, const int32_t *rows, int nr,
                             int64_t rb)
{
    const int lane = threadIdx.x & 31;
    const uint4 *s4 = reinterpret_cast<const uint4 *>(in);
    const int64_t nc = rb / 16;
    uint4 *o4[8];
    for (int m = 0; m < nr; m++) o4[m] = reinterpret_cast<uint4 *>(static_cast<char *>(a.out) + rows[m] * rb);
    int64_t c = lane;
    for (; c + 96 < nc; c += 128) {
        const uint4 v0 = s4[c], v1 = s4[c + 32], v2 = s4[c + 64], v3 = s4[c + 96];
        for (int m = 0; m < nr; m++) {
            o4[m][c] = v0;
            o4[m][c + 32] = v1;
            o4[m][c + 64] = v2;
            o4[m][c + 96] = v3;
        }
    }
    for (; c < nc; c += 32) {
        const uint4 v = s4[c];
        for (int m = 0; m < nr; m++) o4[m][c] = v;
    }
}

/* Whether this rank's own tokens skip its slab: in the receiving
 * kernel's fast path (rows that are the token's exact bytes), and where
 * the senders leave SMs free (wide_blocks is two an SM), the sending
 * kernel's other blocks expand them straight from the caller's tokens
 * while the peers' rows travel, and zero the rows without a token; the
 * receiving kernel then expands only the peers' rows. */
__host__ __device__ __forceinline__ bool own_early(const etp__ep_t2e_args_t &a, int vec)
{
    return vec && !a.mx && !a.scale_w && a.k <= 8 && a.nvl.wide_blocks / 2 > a.nvl.blocks;
}

/* own_early's part of the sending kernel, on its blocks past n.blocks.
 * It writes only the caller's layout rows, which stream order hands to
 * this call, so it waits for no peer. */
__device__ void expand_own(const etp__ep_t2e_args_t &a, int64_t rb)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int warp = threadIdx.x / 32;
    const int64_t gw = (int64_t)(blockIdx.x - n.blocks) * kWarps + warp;
    const int64_t nw = (int64_t)(gridDim.x - n.blocks) * kWarps;
    const int64_t T = tokens_of(a.t_dev, n.t_max), k = a.k;
    for (int64_t r = gw; r < a.rows; r += nw) expand_empty(a, nullptr, r, rb, false);
    for (int64_t t = gw; t < T; t += nw) {
        const int32_t pos = a.send_pos[t * n.ranks + n.me];
        if (pos < 0) continue;
        const int32_t *tr = a.tok_rows + etp__ep_nvl_row(n.me, n.t_max, pos) * k;
        int nr = 0;
        while (nr < k && tr[nr] >= 0) nr++;
        if (nr) expand_token(a, static_cast<const char *>(a.tokens) + t * rb, tr, nr, rb);
    }
}

/* The sending half (n.blocks blocks): every token's row into its
 * destinations' slabs, then this rank's arrival there; with own_early,
 * more blocks expand this rank's own tokens. */
__global__ void __launch_bounds__(kThreads) t2e_send(etp__ep_t2e_args_t a, int vec)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int64_t rb = a.mx ? ETP__EP_MX_ROW_BYTES(a.hidden) : a.hidden * etp__ep_esize(a.dtype);
    if ((int)blockIdx.x >= n.blocks) {
        expand_own(a, rb);
        return;
    }
    uint64_t call_no;
    int64_t t0;
    if (!call_begin(n, a.call, &call_no, &t0)) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    const int64_t T = tokens_of(a.t_dev, n.t_max), k = a.k;
    const unsigned keep = own_early(a, vec) ? ~(1u << n.me) : ~0u;
    for (int64_t t = gw; t < T; t += nw) {
        int64_t row;
        const unsigned mask = dest_mask(a, t, &row);
        if (!mask) continue;
        if (a.mx)
            store_token_mx(a, t, mask, row);
        else if (mask & keep)
            store_token(a, t, mask & keep, row, rb, vec != 0);
        if (a.carry) {
            for (unsigned m = mask; m; m &= m - 1) {
                const int d = __ffs(m) - 1;
                const int64_t r = __shfl_sync(kFull, row, d);
                /* k < 32 slots a lane each; more loop */
                for (int64_t j = lane; j < k; j += 32) {
                    float *w = reinterpret_cast<float *>(n.peers[d] + n.small_off) + r * k;
                    w[j] = etp__ep_slot_weight(a.slot_dest + t * k, a.weights + t * k, (int)j, d);
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) signal_all(n, 0);
}

/* The receiving half (any number of blocks, the whole device by default):
 * once every rank stored here, the expand from this rank's slabs, then
 * the release. */
__global__ void __launch_bounds__(kThreads) t2e_recv(etp__ep_t2e_args_t a, int vec)
{
    const etp__ep_nvl_t &n = a.nvl;
    uint64_t call_no;
    if (!wide_begin(n, a.call, &call_no)) return;
    const int warp = threadIdx.x / 32;
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)gridDim.x * kWarps;
    const int64_t k = a.k;
    const int64_t rb = a.mx ? ETP__EP_MX_ROW_BYTES(a.hidden) : a.hidden * etp__ep_esize(a.dtype);
    const char *slab = n.peers[n.me] + n.tok_off;
    const float *recv_w = a.carry ? reinterpret_cast<const float *>(n.peers[n.me] + n.small_off) : nullptr;
    if (vec && !a.scale_w && k <= 8) {
        /* each received token read once and written to its rows; the
         * rows without a token zeroed apart */
        const bool own = own_early(a, vec);
        if (!own)
            for (int64_t r = gw; r < a.rows; r += nw) expand_empty(a, recv_w, r, rb);
        else if (a.out_w || a.keep_w)
            for (int64_t r = gw; r < a.rows; r += nw) row_weight(a, recv_w, r, a.row_src[r]);
        const int64_t tm = n.t_max;
        for (int64_t i = gw; i < (int64_t)n.ranks * tm; i += nw) {
            if (i % tm >= a.recv_cnt[i / tm] || (own && i / tm == n.me)) continue;
            const int32_t *tr = a.tok_rows + i * k;
            int nr = 0;
            while (nr < k && tr[nr] >= 0) nr++;
            if (nr && a.mx)
                expand_token_mx(a, slab + i * rb, tr, nr);
            else if (nr)
                expand_token(a, slab + i * rb, tr, nr, rb);
        }
    } else {
        for (int64_t r = gw; r < a.rows; r += nw) expand_row(a, slab, recv_w, r, rb, vec != 0);
    }
    wide_end(n, call_no);
}

/* ---- expert side to token side -------------------------------------------- */

/* V values stored as `dtype` (BF16: rounded once) at element e of p. */
template <int V>
__device__ __forceinline__ void store_vals(void *p, int dtype, int64_t e, const float *x)
{
    if (dtype == ETP__EP_BF16) {
        store_bf16<V>(static_cast<uint16_t *>(p) + e, x);
    } else {
        float4 *f = reinterpret_cast<float4 *>(static_cast<float *>(p) + e);
#pragma unroll
        for (int q = 0; q < V / 4; q++) f[q] = make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
    }
}

/* V values of `dtype` at element e of p, as FP32. */
template <int V>
__device__ __forceinline__ void load_vals(const void *p, int dtype, int64_t e, float *x)
{
    if (dtype == ETP__EP_BF16) {
        if constexpr (V == 8) {
            unpack16<8>(*reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + e), x);
        } else {
            const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p) + e);
            x[0] = etp__qf_bf16_to_f32((uint16_t)(u.x & 0xffffu));
            x[1] = etp__qf_bf16_to_f32((uint16_t)(u.x >> 16));
            x[2] = etp__qf_bf16_to_f32((uint16_t)(u.y & 0xffffu));
            x[3] = etp__qf_bf16_to_f32((uint16_t)(u.y >> 16));
        }
    } else {
        const float4 *f = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + e);
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            const float4 v = f[q];
            x[4 * q] = v.x;
            x[4 * q + 1] = v.y;
            x[4 * q + 2] = v.z;
            x[4 * q + 3] = v.w;
        }
    }
}

/* The FP32 values of groups base .. base + 31 of 8 (lane l holds group
 * base + l's in x) stored as two runs of 512 bytes, a float4 a lane in
 * each, instead of each lane's 32 bytes in two 16-byte stores: every store
 * then writes whole 32-byte sectors, which the low-latency combine's
 * stores into the peers measured faster at 4 ranks (docs/PERF.md). Groups
 * at or past g_hi are not stored; all lanes take part. */
__device__ __forceinline__ void store_f32_runs(char *dst, int64_t base, int64_t g_hi,
                                               const float *x)
{
    const int lane = threadIdx.x & 31;
    float4 *d = reinterpret_cast<float4 *>(reinterpret_cast<float *>(dst) + base * 8);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        /* float4 h * 32 + lane of the 32 groups: half (lane & 1) of group
         * h * 16 + lane / 2 */
        const int src = h * 16 + (lane >> 1);
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = __shfl_sync(kFull, x[j], src);
        const float4 lo = make_float4(y[0], y[1], y[2], y[3]),
                     hi = make_float4(y[4], y[5], y[6], y[7]);
        if (base + src < g_hi) d[h * 32 + lane] = (lane & 1) ? hi : lo;
    }
}

/* The groups of V elements (V: 8 for BF16 rows, 4 for FP32) a row holds,
 * the last one partial where V does not divide H (not with vec: there the
 * units of work are [g_lo, g_hi) groups; without, the elements
 * [g_lo * V, min(g_hi * V, H)), a lane each). */
__device__ __forceinline__ int64_t vals_of(const etp__ep_e2t_args_t &a)
{
    return a.dtype == ETP__EP_BF16 ? 8 : 4;
}

__device__ __forceinline__ int64_t groups_of(const etp__ep_e2t_args_t &a)
{
    return (a.hidden + vals_of(a) - 1) / vals_of(a);
}

/* The pre-sum of received token row i (its rows m < nr, ascending) into
 * `dst` (H elements of the wire dtype). A lane takes two groups of V
 * elements (c and c + 32) and loads their rows 4 at a time, so that up to
 * 8 loads are in flight; each element's terms are still added in row
 * order. */
template <int V>
__device__ void presum_row(const etp__ep_e2t_args_t &a, const int32_t *rows, const float *w,
                           int nr, char *dst, int64_t g_lo, int64_t g_hi)
{
    const int lane = threadIdx.x & 31;
    const int64_t ng = a.hidden / V;
    const uint4 *in = static_cast<const uint4 *>(a.in);
    /* warp-uniform trips (the FP32 stores below exchange values between
     * lanes); a lane past g_hi loads nothing and sums zeros */
    for (int64_t base = g_lo; base < g_hi; base += 64) {
        const int64_t c0 = base + lane;
        const bool one = c0 < g_hi, two = c0 + 32 < g_hi;
        float acc[2][V];
#pragma unroll
        for (int q = 0; q < 2; q++)
#pragma unroll
            for (int j = 0; j < V; j++) acc[q][j] = 0.0f;
        for (int m0 = 0; m0 < nr; m0 += 4) {
            uint4 v[2][4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (m0 + u >= nr) break;
                const uint4 *row = in + (int64_t)rows[m0 + u] * ng;
                if (one) v[0][u] = __ldg(row + c0);
                if (two) v[1][u] = __ldg(row + c0 + 32);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (m0 + u >= nr) break;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    if ((q == 0 && !one) || (q == 1 && !two)) continue;
                    float x[V];
                    unpack16<V>(v[q][u], x);
#pragma unroll
                    for (int j = 0; j < V; j++)
                        acc[q][j] = etp__ep_presum_step(acc[q][j], a.row_w != nullptr, w[m0 + u], x[j]);
                }
            }
        }
        if (V == 8 && a.wire == ETP__EP_F32) {
            store_f32_runs(dst, base, g_hi, acc[0]);
            store_f32_runs(dst, base + 32, g_hi, acc[1]);
        } else {
            if (one) store_vals<V>(dst, a.wire, c0 * V, acc[0]);
            if (two) store_vals<V>(dst, a.wire, (c0 + 32) * V, acc[1]);
        }
    }
}

/* The token sum of token t from its sources' rows (src[d]: where each
 * starts), rounded once into out: two groups of V elements a lane, two
 * sources' loads issued before their sums (in rank order). */
template <int V>
__device__ void reduce_row(const etp__ep_e2t_args_t &a, const char *const *src, int ns, int64_t t,
                           int64_t g_lo, int64_t g_hi)
{
    const int lane = threadIdx.x & 31;
    const int64_t H = a.hidden;
    for (int64_t c0 = g_lo + lane; c0 < g_hi; c0 += 64) {
        const bool two = c0 + 32 < g_hi;
        float acc[2][V];
#pragma unroll
        for (int q = 0; q < 2; q++)
#pragma unroll
            for (int j = 0; j < V; j++) acc[q][j] = 0.0f;
        for (int d0 = 0; d0 < ns; d0 += 2) {
            float x[2][2][V];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (d0 + u >= ns) break;
                load_vals<V>(src[d0 + u], a.wire, c0 * V, x[0][u]);
                if (two) load_vals<V>(src[d0 + u], a.wire, (c0 + 32) * V, x[1][u]);
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (d0 + u >= ns) break;
#pragma unroll
                for (int q = 0; q < 2; q++)
#pragma unroll
                    for (int j = 0; j < V; j++) acc[q][j] = acc[q][j] + x[q][u][j];
            }
        }
        store_vals<V>(a.out, a.dtype, t * H + c0 * V, acc[0]);
        if (two) store_vals<V>(a.out, a.dtype, t * H + (c0 + 32) * V, acc[1]);
    }
}

/* Received token row i's pre-sum into dst (H elements of the wire dtype),
 * a warp: the groups [g_lo, g_hi) of V elements only (groups_of; a slice:
 * several warps may share a long row). rows_s, w_s: the warp's shared
 * scratch of kTopkMax entries. */
constexpr int kTopkMax = 64;

__device__ void presum_token(const etp__ep_e2t_args_t &a, int64_t i, char *dst, int vec,
                             int32_t *rows_s, float *w_s, int64_t g_lo, int64_t g_hi)
{
    const int lane = threadIdx.x & 31, k = a.k;
    const int64_t H = a.hidden;
    const int32_t *tr = a.tok_rows + i * k;
    if (vec) {
        /* the rows (ascending, then -1s): every lane loads its slots at
         * once instead of one load after another */
        int nr = 0;
        for (int j0 = 0; j0 < k; j0 += 32) {
            const int j = j0 + lane;
            const int32_t r = j < k ? tr[j] : -1;
            const unsigned b = __ballot_sync(kFull, r >= 0);
            if (r >= 0) {
                rows_s[j] = r;
                w_s[j] = a.row_w ? a.row_w[r] : 1.0f;
            }
            nr += __popc(b);
            if (b != kFull) break;
        }
        __syncwarp();
        if (a.dtype == ETP__EP_BF16)
            presum_row<8>(a, rows_s, w_s, nr, dst, g_lo, g_hi);
        else
            presum_row<4>(a, rows_s, w_s, nr, dst, g_lo, g_hi);
        __syncwarp();
    } else {
        etp__ep_presum_args_t pa;
        pa.in = a.in;
        pa.row_w = a.row_w;
        pa.tok_rows = a.tok_rows;
        pa.ntok = (int64_t)a.nvl.ranks * a.nvl.t_max;
        pa.hidden = H;
        pa.k = k;
        pa.dtype = a.dtype;
        pa.wire = a.wire;
        pa.partial = dst;
        const int64_t h1 = etp__ep_min(g_hi * vals_of(a), H);
        for (int64_t h = g_lo * vals_of(a) + lane; h < h1; h += 32)
            etp__ep_store(dst, a.wire, h, etp__ep_presum_elem(&pa, i, h));
    }
}

/* Received token row i's k weight gradients into its rank's small slab at
 * row `back`, a warp. */
__device__ void send_wgrads(const etp__ep_e2t_args_t &a, int64_t i, int s, int64_t back)
{
    const int lane = threadIdx.x & 31, k = a.k;
    for (int j = lane; j < k; j += 32) {
        float g;
        if (a.g_pre) {
            g = a.g_pre[i * k + j];
        } else {
            const int32_t r = a.recv_row[i * k + j];
            g = r >= 0 ? a.grad_row_w[r] : 0.0f;
        }
        reinterpret_cast<float *>(a.nvl.peers[s] + a.nvl.small_off)[back * k + j] = g;
    }
}

/* Token t's sums from this rank's slabs, a warp: its output row (when `in`
 * is set; the groups [g_lo, g_hi) of V elements only, groups_of) and, in
 * the slice that starts at 0, its weight gradients (grad_topk). own: where
 * this rank's own partials are, when not in its slab (own_staged). src_s:
 * the warp's shared scratch. */
__device__ void sum_token(const etp__ep_e2t_args_t &a, const char *slab, const char *own, int64_t t,
                          int vec, const char **src_s, int64_t g_lo, int64_t g_hi)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int lane = threadIdx.x & 31, R = n.ranks, k = a.k;
    const int64_t H = a.hidden, tm = n.t_max;
    if (a.out) {
        if (vec) {
            /* the sources in rank order: lane d looks up rank d (R <=
             * kMaxRanks <= 32), all at once */
            const int64_t row = lane < R ? etp__ep_send_row(a.send_pos, a.send_base, R, t, lane) : -1;
            const unsigned b = __ballot_sync(kFull, row >= 0);
            const char *base = own && lane == n.me ? own : slab;
            if (row >= 0)
                src_s[__popc(b & ((1u << lane) - 1u))] = base + row * H * etp__ep_esize(a.wire);
            __syncwarp();
            const int ns = __popc(b);
            if (a.dtype == ETP__EP_BF16)
                reduce_row<8>(a, src_s, ns, t, g_lo, g_hi);
            else
                reduce_row<4>(a, src_s, ns, t, g_lo, g_hi);
            __syncwarp();
        } else {
            etp__ep_reduce_args_t ra;
            ra.partial = slab;
            ra.t_dev = a.t_dev;
            ra.send_pos = a.send_pos;
            ra.send_base = a.send_base;
            ra.t_max = tm;
            ra.hidden = H;
            ra.ranks = R;
            ra.dtype = a.dtype;
            ra.wire = a.wire;
            ra.out = a.out;
            const int64_t h1 = etp__ep_min(g_hi * vals_of(a), H);
            for (int64_t h = g_lo * vals_of(a) + lane; h < h1; h += 32)
                etp__ep_store(a.out, a.dtype, t * H + h, etp__ep_reduce_elem(&ra, t, h));
        }
    }
    if (a.grad_topk && g_lo == 0) {
        etp__ep_wscatter_args_t wa;
        wa.g_recv = reinterpret_cast<const float *>(n.peers[n.me] + n.small_off);
        wa.t_dev = a.t_dev;
        wa.slot_dest = a.slot_dest;
        wa.send_pos = a.send_pos;
        wa.send_base = a.send_base;
        wa.t_max = tm;
        wa.k = k;
        wa.ranks = R;
        wa.out = a.grad_topk;
        for (int j = lane; j < k; j += 32) a.grad_topk[t * k + j] = etp__ep_slot_grad(&wa, t, j);
    }
}

/* Whether this rank's own partials stay in its stage: the sending kernel
 * copies only the peers' into their ranks, and the token sums (with vec)
 * read the own rank's from the stage, at the row its slab would hold
 * (source me, position p: row me * t_max + p in both). */
__device__ __forceinline__ bool own_staged(const etp__ep_e2t_args_t &a, int vec)
{
    return vec && a.in != nullptr && a.out != nullptr;
}

/* Received rows in the order (position, source), x = p * R + s: warps
 * side by side store to every peer at once, not to one peer's slab after
 * another's. */
__device__ __forceinline__ int64_t row_of(const etp__ep_nvl_t &n, int64_t x, int *s, int64_t *p)
{
    *s = (int)(x % n.ranks);
    *p = x / n.ranks;
    return (int64_t)*s * n.t_max + *p;
}

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The sending half with the pre-sums beside it, one kernel: blocks below
 * n.blocks send, the others pre-sum. A pre-summing warp writes received
 * row x's partial into row x of the stage and counts it in its chunk
 * (ETP__EP_NVL_CHUNK rows of x); a sending warp waits for the chunk of
 * its row, copies the partial into its rank's slab (and the weight
 * gradients), and the sending blocks signal arrival at the end. So the
 * NVLink stores of num_sms blocks run while the rest of the device reads
 * the expert rows. The counters are zeroed by the next kernel (e2t_recv),
 * when every block of this one has finished. */
__global__ void __launch_bounds__(kThreads) e2t_send(etp__ep_e2t_args_t a, int vec)
{
    __shared__ int32_t rows_s[kWarps][kTopkMax];
    __shared__ float w_s[kWarps][kTopkMax];
    const etp__ep_nvl_t &n = a.nvl;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t N = (int64_t)n.ranks * n.t_max;
    const int64_t wb = a.hidden * etp__ep_esize(a.wire); /* bytes of a partial */
    uint32_t *done = a.chunk_done;
    if ((int)blockIdx.x >= n.blocks) {
        if (!a.in) return;
        const int64_t pw = (int64_t)(blockIdx.x - n.blocks) * kWarps + warp;
        const int64_t npw = (int64_t)(gridDim.x - n.blocks) * kWarps;
        for (int64_t x = pw; x < N; x += npw) {
            int s;
            int64_t p;
            const int64_t i = row_of(n, x, &s, &p);
            if (p < a.recv_cnt[s])
                presum_token(a, i, static_cast<char *>(a.stage) + i * wb, vec, rows_s[warp],
                             w_s[warp], 0, groups_of(a));
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                atomicAdd(done + x / ETP__EP_NVL_CHUNK, 1u);
            }
        }
        return;
    }
    uint64_t call_no;
    int64_t t0;
    if (!call_begin(n, a.call, &call_no, &t0)) return;
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    const bool g_travels = a.g_pre != nullptr || a.grad_row_w != nullptr;
    const bool own = own_staged(a, vec);
    bool ok = true;
    for (int64_t x = gw; x < N && ok; x += nw) {
        int s;
        int64_t p;
        const int64_t i = row_of(n, x, &s, &p);
        if (p >= a.recv_cnt[s]) continue;
        const int64_t back = etp__ep_nvl_row(n.me, n.t_max, p);
        if (a.in && !(own && s == n.me)) {
            const int64_t c = x / ETP__EP_NVL_CHUNK;
            const uint32_t want = (uint32_t)etp__ep_min(N - c * ETP__EP_NVL_CHUNK, ETP__EP_NVL_CHUNK);
            if (lane == 0)
                while (load_acquire_gpu(done + c) < want) {
                    if (n.timeout_ns > 0 && now_ns() - t0 > n.timeout_ns) {
                        record_fault(n, n.me, a.call, ETP__EP_NVL_WAIT_LOCAL);
                        ok = false;
                        break;
                    }
                    __nanosleep(32);
                }
            ok = __shfl_sync(kFull, ok, 0);
            if (!ok) break;
            __syncwarp(); /* lane 0's acquire orders the other lanes' loads too */
            const char *src = static_cast<const char *>(a.stage) + i * wb;
            char *dst = n.peers[s] + n.tok_off + back * wb;
            if (vec && wb % 16 == 0) {
                warp_copy16<true>(reinterpret_cast<const uint4 *>(src), &dst, 1, wb / 16);
            } else {
                for (int64_t b = lane; b < wb; b += 32) dst[b] = __ldcg(src + b);
            }
        }
        if (g_travels) send_wgrads(a, i, s, back);
    }
    __shared__ int failed;
    if (threadIdx.x == 0) failed = 0;
    __syncthreads();
    if (!ok && lane == 0) failed = 1;
    __syncthreads();
    if (threadIdx.x == 0 && !failed) signal_all(n, 0);
}

/* The receiving half (any number of blocks): once every rank stored here,
 * the token sums in rank order and the weight gradients, then the
 * release. */
__global__ void __launch_bounds__(kThreads) e2t_recv(etp__ep_e2t_args_t a, int vec)
{
    const etp__ep_nvl_t &n = a.nvl;
    /* the sending kernel's chunk counters, free again (it has finished) */
    if (a.chunk_done && blockIdx.x == 0) {
        const int64_t words = ETP__EP_NVL_CHUNK_WORDS((int64_t)n.ranks * n.t_max);
        for (int64_t c = threadIdx.x; c < words; c += blockDim.x) a.chunk_done[c] = 0;
    }
    uint64_t call_no;
    if (!wide_begin(n, a.call, &call_no)) return;
    __shared__ const char *src_s[kWarps][kMaxRanks];
    const int warp = threadIdx.x / 32;
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)gridDim.x * kWarps;
    const int64_t T = tokens_of(a.t_dev, n.t_max), ng = groups_of(a);
    const char *slab = n.peers[n.me] + n.tok_off;
    const char *own = own_staged(a, vec) ? static_cast<const char *>(a.stage) : nullptr;
    for (int64_t t = gw; t < T; t += nw) sum_token(a, slab, own, t, vec, src_s[warp], 0, ng);
    wide_end(n, call_no);
}

/* The low-latency combine in one kernel of n.blocks blocks (ep_args.h:
 * PHASE_ALL), where launches and latency, not bytes, cost: the pre-sums
 * straight into the token ranks' slabs; each block, once its pre-sums
 * are in, sets its flag in every rank's window; and each token's slice is
 * summed as soon as the blocks that pre-summed it on its sources have.
 * No stage, and no barrier of all ranks: most sums overlap the stores of
 * the blocks still pre-summing (the blocks end 4-17 us into a 2-rank
 * call, a barrier held every sum until the last). A fence and a flag a
 * block, not a warp: a fence for each warp's slice cost more than the
 * overlap gained. A warp's unit is a slice of kSliceGroups groups of a row
 * or token, so that a few hundred tokens still keep every warp busy; the
 * units are the same on every rank (element ranges where a rank does not
 * vectorize), since a token rank finds the block that pre-summed its
 * slice from them. */
constexpr int64_t kSliceGroups = ETP__EP_LL_SLICE_GROUPS;

/* Call c's partial slab and flag slab in any rank's window. */
__device__ __forceinline__ size_t ll_tok_off(const etp__ep_e2t_args_t &a, uint64_t c)
{
    return a.nvl.tok_off + (size_t)(c % 2) * a.tok_half;
}

__device__ __forceinline__ size_t ll_flag_off(const etp__ep_e2t_args_t &a, uint64_t c)
{
    return a.flag_off + (size_t)(c % 2) * a.nvl.ranks * ETP__EP_LL_MAX_BLOCKS * sizeof(uint32_t);
}

/* Token t's slice sl is summable once, on every source d, the block that
 * pre-summed it (unit (p * R + me) * nsl + sl of d's order, p: t's
 * position at d) has flagged this call: lane d waits (bounded; the first
 * to give up records d). false: a wait gave up. */
__device__ bool ll_wait_slice(const etp__ep_e2t_args_t &a, const uint32_t *flags, uint32_t mark,
                              int64_t t, int64_t sl, int64_t nsl, int64_t t0)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int lane = threadIdx.x & 31;
    const int32_t p = lane < n.ranks ? a.send_pos[t * n.ranks + lane] : -1;
    bool ok = true;
    if (p >= 0) {
        const int64_t x = ((int64_t)p * n.ranks + n.me) * nsl + sl;
        const int b = (int)(x % ((int64_t)n.blocks * kWarps) / kWarps);
        const uint32_t *f = flags + (int64_t)lane * ETP__EP_LL_MAX_BLOCKS + b;
        while (load_acquire32(f) != mark) {
            if (n.timeout_ns > 0 && now_ns() - t0 > n.timeout_ns) {
                record_fault(n, lane, a.call, ETP__EP_NVL_WAIT_ARRIVAL);
                ok = false;
                break;
            }
            __nanosleep(32);
        }
    }
    const bool all = __all_sync(kFull, ok);
    __syncwarp(); /* the lanes' acquires order the whole warp's loads that follow */
    return all;
}

__global__ void __launch_bounds__(kThreads) e2t_fused(etp__ep_e2t_args_t a, int vec)
{
    __shared__ int32_t rows_s[kWarps][kTopkMax];
    __shared__ float w_s[kWarps][kTopkMax];
    __shared__ const char *src_s[kWarps][kMaxRanks];
    __shared__ int failed;
    /* the call's number and start, read again where needed: kept in
     * registers across the pre-sums they spill */
    __shared__ uint64_t call_s;
    __shared__ int64_t t0_s;
    const etp__ep_nvl_t &n = a.nvl;
    if (threadIdx.x == 0) {
        call_s = n.calls[0] + 1;
        t0_s = now_ns();
        failed = 0;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    const int64_t tm = n.t_max, wb = a.hidden * etp__ep_esize(a.wire);
    const int64_t ng = groups_of(a), nsl = (ng + kSliceGroups - 1) / kSliceGroups;
    for (int64_t x = gw; x < (int64_t)n.ranks * tm * nsl; x += nw) {
        const int64_t sl = x % nsl;
        int s;
        int64_t p;
        const int64_t i = row_of(n, x / nsl, &s, &p);
        if (p >= a.recv_cnt[s]) continue;
        const int64_t back = etp__ep_nvl_row(n.me, tm, p);
        if (a.in)
            presum_token(a, i, n.peers[s] + ll_tok_off(a, call_s) + back * wb, vec, rows_s[warp],
                         w_s[warp], sl * kSliceGroups, etp__ep_min((sl + 1) * kSliceGroups, ng));
    }
    __syncthreads();
    if (threadIdx.x == 0)
        flag_all(n, ll_flag_off(a, call_s), (int64_t)n.me * ETP__EP_LL_MAX_BLOCKS + blockIdx.x,
                 (uint32_t)call_s);
    /* the sums: the last warps, which took one unit fewer, first */
    const int64_t T = tokens_of(a.t_dev, tm);
    const char *slab = n.peers[n.me] + ll_tok_off(a, call_s);
    const uint32_t *flags = reinterpret_cast<const uint32_t *>(n.peers[n.me] +
                                                               ll_flag_off(a, call_s));
    for (int64_t x = nw - 1 - gw; x < T * nsl; x += nw) {
        const int64_t t = x / nsl, sl = x % nsl;
        if (!ll_wait_slice(a, flags, (uint32_t)call_s, t, sl, nsl, t0_s)) {
            if (lane == 0) failed = 1;
            break;
        }
        sum_token(a, slab, nullptr, t, vec, src_s[warp], sl * kSliceGroups,
                  etp__ep_min((sl + 1) * kSliceGroups, ng));
    }
    __syncthreads();
    if (failed) return;
    block_end(n, call_s, false);
}

template <typename A>
cudaError_t launch(void (*k)(A, int), unsigned grid, cudaStream_t s, const A &a, int vec)
{
    A copy = a;
    int v = vec;
    void *args[] = {&copy, &v};
    return cudaLaunchKernel(reinterpret_cast<const void *>(k), dim3(grid), dim3(kThreads), args, 0, s);
}

bool aligned16(const void *p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

} // namespace

extern "C" int etp__cuda_nvl_max_ranks(void)
{
    return kMaxRanks;
}

extern "C" cudaError_t etp__cuda_nvl_t2e(cudaStream_t s, const etp__ep_t2e_args_t *a, int phase)
{
    const int64_t rb = a->mx ? ETP__EP_MX_ROW_BYTES(a->hidden) : a->hidden * etp__ep_esize(a->dtype);
    /* 16-byte rows and buffers: vector copies (else bytes) */
    const int vec = rb % 16 == 0 && (a->tokens == nullptr || aligned16(a->tokens)) &&
                    aligned16(a->out) && (a->out_scales == nullptr || aligned16(a->out_scales));
    if (phase == ETP__EP_NVL_PHASE_SEND) {
        /* own_early's blocks: one an SM beside the senders, so that the
         * senders keep theirs */
        const int own = own_early(*a, vec) ? a->nvl.wide_blocks / 2 - a->nvl.blocks : 0;
        return launch(t2e_send, (unsigned)(a->nvl.blocks + own), s, *a, vec);
    }
    return launch(t2e_recv, (unsigned)a->nvl.wide_blocks, s, *a, vec);
}

extern "C" cudaError_t etp__cuda_nvl_prepare(cudaStream_t s, const etp__ep_xchg_args_t *a)
{
    etp__ep_xchg_args_t copy = *a;
    const etp__ep_layout_args_t &l = a->lay;
    copy.lay.after_exchange = ETP__EP_LAYOUT_FEW(l.local_experts, l.k, l.ranks, l.recv_rows);
    void *args[] = {&copy};
    return cudaLaunchKernel(reinterpret_cast<const void *>(xchg_kernel), dim3((unsigned)a->nvl.blocks),
                            dim3(kThreads), args, 0, s);
}

extern "C" cudaError_t etp__cuda_nvl_e2t(cudaStream_t s, const etp__ep_e2t_args_t *a, int phase)
{
    const int64_t es = etp__ep_esize(a->dtype), V = a->dtype == ETP__EP_BF16 ? 8 : 4;
    /* whole 16-byte groups of the input, aligned buffers, top-k that fits
     * the warp's shared rows */
    const int vec = a->hidden % V == 0 && (a->hidden * es) % 16 == 0 && a->k <= kTopkMax &&
                    (a->in == nullptr || aligned16(a->in)) && (a->out == nullptr || aligned16(a->out)) &&
                    (a->stage == nullptr || aligned16(a->stage));
    if (phase == ETP__EP_NVL_PHASE_ALL) {
        if (a->nvl.blocks > ETP__EP_LL_MAX_BLOCKS) return cudaErrorInvalidValue;
        return launch(e2t_fused, (unsigned)a->nvl.blocks, s, *a, vec);
    }
    if (phase == ETP__EP_NVL_PHASE_SEND) {
        /* senders, and pre-summing blocks on the rest of the device */
        const int pre = a->nvl.wide_blocks > a->nvl.blocks ? a->nvl.wide_blocks - a->nvl.blocks : 1;
        return launch(e2t_send, (unsigned)(a->nvl.blocks + pre), s, *a, vec);
    }
    return launch(e2t_recv, (unsigned)a->nvl.wide_blocks, s, *a, vec);
}
