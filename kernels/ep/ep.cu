/*
 * The EP kernels (src/backend/ep_args.h defines what each computes). The
 * rules they apply, per slot, token, row and element, are those of
 * src/ep/ep_rules.h, which the host backend runs too; what is here is how
 * the work is spread over threads: one thread owns one output element and
 * walks its terms in the rules' order, so the results are bit-identical to
 * the host's; the weight-gradient dot product folds its 256 lanes
 * (ETP__EP_DOT_LANES, one block's threads) in the rules' order. Each kernel
 * takes its argument struct by value; T and the counts are read on the
 * device, so a captured graph replays with new routing. This file is
 * compiled with --fmad=false (src/ep/sources.cmake) so that no multiply and
 * add are contracted where the host does not (every FMA is an explicit
 * fmaf).
 */
#include <stdint.h>

#include "ep/ep_rules.h"
#include "ep_kernels.h"
#include "ep_dev.cuh"
#include "ep_vec.cuh"
#include "layout_dev.cuh"

namespace {

using namespace etp_ep_dev;
using etp_ep_vec::store_bf16;
using etp_ep_vec::unpack16;

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;
/* The vectorized pre-sum and token sum keep a token's rows / sources in
 * shared memory; larger top-k or groups take the general kernels. */
constexpr int kVecMaxTopk = 64;
constexpr int kVecMaxRanks = 64;

static_assert(ETP__EP_DOT_LANES == kThreads, "the dot product's lanes are one block's threads");

__device__ __forceinline__ int64_t tokens_of(const int32_t *t_dev, int64_t t_max)
{
    return etp__ep_clamp_tokens(*t_dev, t_max);
}

unsigned blocks_for(int64_t n, int per)
{
    int64_t b = (n + per - 1) / per;
    return (unsigned)(b > 0 ? b : 1);
}

template <typename A>
cudaError_t launch(void (*k)(A), unsigned grid, unsigned block, cudaStream_t s, const A &a)
{
    A copy = a;
    void *args[] = {&copy};
    return cudaLaunchKernel(reinterpret_cast<const void *>(k), dim3(grid), dim3(block), args, 0, s);
}

/* ---- route -------------------------------------------------------------- */

/* Per token: validate its slots, destinations, and mark send_pos[t*R+d] = 1
 * for each destination (0 otherwise), to be turned into positions by
 * route_scan. K = k <= kRouteK: the token's K slots in registers
 * (route_regs); given the global slot_dest, the rule's stores and reloads
 * of earlier slots chain round trips to L2 (8 us for a block of 128
 * tokens), and local arrays would spill past L1. K = 0: any k, on
 * slot_dest. */
constexpr int kRouteK = 8;

template <int K>
__global__ void route_mark(etp__ep_route_args_t a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t raw = a.t_in ? *a.t_in : a.t_value;
    const int64_t T = etp__ep_clamp_tokens(raw, a.t_max);
    if (t == 0) {
        *a.t_dev = (int32_t)T;
        if (T != raw) stat_flag(a.stats, ETP__EP_F_BAD_TOKENS);
        stat_add(a.stats, ETP__EP_ST_PREPARES, 1);
    }
    if (t >= a.t_max) return;
    const int R = a.ranks;
    int32_t *sp = a.send_pos + t * R;
    if constexpr (K == 0) {
        const int k = a.k;
        int32_t *sd = a.slot_dest + t * k;
        for (int d = 0; d < R; d++) sp[d] = 0;
        if (t >= T) {
            for (int j = 0; j < k; j++) sd[j] = -1;
            return;
        }
        int bad, dup;
        etp__ep_route_token(a.topk_idx + t * k, k, a.num_experts, a.local_experts, sd, &bad, &dup);
        for (int j = 0; j < k; j++)
            if (sd[j] >= 0) sp[sd[j]] = 1;
        stat_route(a.stats, bad, dup);
    } else {
        int32_t sd[K];
        if (t < T) {
            int bad, dup;
            route_regs<K>(a.topk_idx + t * K, a.num_experts, a.local_experts, sd, &bad, &dup);
            stat_route(a.stats, bad, dup);
        } else {
#pragma unroll
            for (int j = 0; j < K; j++) sd[j] = -1;
        }
#pragma unroll
        for (int j = 0; j < K; j++) a.slot_dest[t * K + j] = sd[j];
        for (int d = 0; d < R; d++) {
            int hit = 0;
#pragma unroll
            for (int j = 0; j < K; j++) hit |= sd[j] == d;
            sp[d] = hit;
        }
    }
}

/* One block per destination d: positions in token order (a scan of the
 * marks), slab drops, the count; with slabs (CAPACITY, NVLINK: blocks at
 * d*slab) also the base and the metadata rows, so route needs no more
 * kernels. */
__global__ void route_scan(etp__ep_route_args_t a)
{
    const int d = blockIdx.x, R = a.ranks, k = a.k;
    int64_t running = 0;
    for (int64_t t0 = 0; t0 < a.t_max; t0 += kScanThreads) {
        const int64_t t = t0 + threadIdx.x;
        int32_t *sp = t < a.t_max ? a.send_pos + t * R + d : nullptr;
        const int flag = sp ? *sp : 0;
        int total = 0;
        const int64_t pos = running + block_excl_scan(flag, &total);
        if (sp) {
            *sp = flag ? etp__ep_slab_pos(pos, a.slab) : -1;
            if (flag && *sp < 0) {
                stat_add(a.stats, ETP__EP_ST_TRANSPORT_DROPPED,
                         etp__ep_slots_to(a.slot_dest + t * k, k, d));
                stat_flag(a.stats, ETP__EP_F_TRANSPORT_FULL);
            }
            if (!a.exact && a.send_meta && *sp >= 0)
                etp__ep_meta_row(a.topk_idx + t * k, a.slot_dest + t * k, k, d, a.local_experts,
                                 a.send_meta + ((int64_t)d * a.slab + *sp) * k);
        }
        running += total;
    }
    if (threadIdx.x == 0) {
        if (a.slab_report) stat_max(a.stats, ETP__EP_ST_TRANSPORT_NEEDED, running);
        a.send_cnt[d] = (int32_t)etp__ep_min(running, a.slab);
        if (!a.exact) a.send_base[d] = (int32_t)((int64_t)d * a.slab);
    }
}

/* A received row's rows in local memory for layout_sort (a row a thread,
 * 256 threads a block: within L1), for top-k up to this. */
constexpr int kLocalK = ETP__EP_LAYOUT_FEW_K;

/* EXACT: the blocks back to back, once every count is known. */
__global__ void route_base(etp__ep_route_args_t a)
{
    etp__ep_block_bases(a.send_cnt, a.ranks, a.exact, a.slab, a.send_base);
}

__global__ void route_meta(etp__ep_route_args_t a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    const int R = a.ranks, k = a.k;
    for (int d = 0; d < R; d++) {
        const int64_t row = etp__ep_send_row(a.send_pos, a.send_base, R, t, d);
        if (row >= 0)
            etp__ep_meta_row(a.topk_idx + t * k, a.slot_dest + t * k, k, d, a.local_experts,
                             a.send_meta + row * k);
    }
}

/* ---- clip (EXACT) ------------------------------------------------------- */

__global__ void clip_kernel(etp__ep_clip_args_t a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int R = a.ranks, k = a.k;
    if (t == 0) {
        for (int d = 0; d < R; d++) {
            if (etp__ep_accepted(a.C, R, a.tok_cap, a.me, d) == a.C[(int64_t)a.me * R + d]) continue;
            stat_max(a.stats, ETP__EP_ST_TRANSPORT_NEEDED, etp__ep_wanted_by(a.C, R, d));
            stat_flag(a.stats, ETP__EP_F_TRANSPORT_FULL);
        }
    }
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    for (int d = 0; d < R; d++) {
        const int64_t acc = etp__ep_accepted(a.C, R, a.tok_cap, a.me, d);
        stat_add(a.stats, ETP__EP_ST_TRANSPORT_DROPPED,
                 etp__ep_clip_copy(acc, a.slot_dest + t * k, k, d, a.send_pos + t * R + d));
    }
}

/* ---- layout ------------------------------------------------------------- */

__global__ void layout_bases(etp__ep_layout_args_t a)
{
    for (int s = 0; s < a.ranks; s++)
        a.recv_cnt[s] = (int32_t)etp__ep_accepted(a.C, a.ranks, a.tok_cap, s, a.me);
    etp__ep_block_bases(a.recv_cnt, a.ranks, a.exact, a.slab, a.recv_base);
}

/* The slot of received row i that selects local expert e, or -1. */
__device__ __forceinline__ int slot_of(const etp__ep_layout_args_t &a, int64_t i, int e)
{
    if (!etp__ep_recv_valid(a.recv_base, a.recv_cnt, a.ranks, a.exact, a.slab, i)) return -1;
    for (int j = 0; j < a.k; j++)
        if (etp__ep_recv_expert(a.recv_meta, a.k, a.local_experts, i, j) == e) return j;
    return -1;
}

/* One block per local expert: its row count, into counts (turned into the
 * kept count by layout_offsets). */
__global__ void layout_count(etp__ep_layout_args_t a)
{
    const int e = blockIdx.x;
    int64_t running = 0;
    for (int64_t i0 = 0; i0 < a.recv_rows; i0 += kScanThreads) {
        const int64_t i = i0 + threadIdx.x;
        const int flag = i < a.recv_rows && slot_of(a, i, e) >= 0;
        int total = 0;
        (void)block_excl_scan(flag, &total);
        running += total;
    }
    if (threadIdx.x == 0) a.counts[e] = (int32_t)running;
}

__global__ void layout_offsets(etp__ep_layout_args_t a)
{
    stat_layout(a.stats, etp__ep_layout_offsets(a.counts, a.offsets, a.local_experts, a.alignment,
                                                 a.fixed_slots, a.rows_cap));
}

/* One block per local expert: its rows in receive order (= (source rank,
 * token) order), the first counts[e] of them kept. */
__global__ void layout_assign(etp__ep_layout_args_t a)
{
    const int e = blockIdx.x;
    const int64_t kept = a.counts[e], base = a.offsets[e];
    int64_t running = 0;
    for (int64_t i0 = 0; i0 < a.recv_rows && running < kept; i0 += kScanThreads) {
        const int64_t i = i0 + threadIdx.x;
        const int j = i < a.recv_rows ? slot_of(a, i, e) : -1;
        int total = 0;
        const int64_t q = running + block_excl_scan(j >= 0, &total);
        if (j >= 0 && q < kept) {
            const int64_t row = base + q;
            a.recv_row[i * a.k + j] = (int32_t)row;
            a.row_src[row] = (int32_t)(i * a.k + j);
        }
        running += total;
    }
}

/* The counters into the host's mirror (a.mirror), by one block of the
 * layout's last kernel: every earlier kernel of prepare has counted, and
 * this block's own counts are fenced before its barrier. */
__device__ void copy_mirror(const etp__ep_layout_args_t &a)
{
    __syncthreads();
    if (a.mirror && (int)threadIdx.x < ETP__EP_ST_COUNT)
        a.mirror[threadIdx.x] = *static_cast<volatile const int64_t *>(a.stats + threadIdx.x);
}

/* Each received row's expert rows, ascending (the pre-sum's order), sorted
 * in local memory when k allows (kLocalK). */
__global__ void layout_sort(etp__ep_layout_args_t a)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int k = a.k;
    if (i < a.recv_rows) {
        if (k <= kLocalK) {
            int32_t rr[kLocalK], out[kLocalK];
            for (int j = 0; j < k; j++) rr[j] = a.recv_row[i * k + j];
            etp__ep_sort_rows(rr, k, out);
            for (int j = 0; j < k; j++) a.tok_rows[i * k + j] = out[j];
        } else {
            etp__ep_sort_rows(a.recv_row + i * k, k, a.tok_rows + i * k);
        }
    }
    if (blockIdx.x == 0) copy_mirror(a);
}

/* ---- layout with few local experts --------------------------------------
 * L <= ETP__EP_LAYOUT_FEW_L, k <= ETP__EP_LAYOUT_FEW_K: a warp takes a chunk
 * of 32 received rows, a lane one row; one ballot per expert gives each
 * row's rank among the chunk's rows that select it, and the chunks' counts
 * (scratch [L][chunks]) are scanned per expert in between. The same rows,
 * order and drops as the per-expert scans above, in two kernels instead
 * of one pass per expert over every received row. */

/* Per chunk and expert, the rows that select it (layout_dev.cuh). */
__global__ void layout_chunks(etp__ep_layout_args_t a)
{
    etp_ep_layout::count_chunks(a);
}

/* Per chunk (a warp each): every slot's row (the q-th row of its expert in
 * receive order, kept when q < the kept count), row_src of the kept rows,
 * and each received row's rows ascending. Each block first sums the
 * chunks' counts per expert, all of them (the counts, hence the offsets,
 * which every block computes alike) and those before its own chunks (its
 * rows' start): the scan of layout_chunks' counts, without a kernel of its
 * own between them. */
constexpr int kPlaceWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) layout_place(etp__ep_layout_args_t a)
{
    __shared__ int32_t cnt_s[ETP__EP_LAYOUT_FEW_L], off_s[ETP__EP_LAYOUT_FEW_L + 1],
        pre_s[kPlaceWarps][ETP__EP_LAYOUT_FEW_L];
    __shared__ unsigned bal_s[kPlaceWarps][ETP__EP_LAYOUT_FEW_L];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, L = (int)a.local_experts, k = a.k;
    const int64_t nch = (a.recv_rows + ETP__EP_LAYOUT_CHUNK - 1) / ETP__EP_LAYOUT_CHUNK;
    const int64_t c_first = (int64_t)blockIdx.x * kPlaceWarps;
    for (int e = w; e < L; e += kPlaceWarps) {
        const int32_t *h = a.scratch + (int64_t)e * nch;
        int all = 0, before = 0;
#pragma unroll 8
        for (int64_t c = lane; c < nch; c += 32) {
            const int v = h[c];
            all += v;
            if (c < c_first) before += v;
        }
        for (int o = 16; o > 0; o >>= 1) {
            all += __shfl_xor_sync(kFull, all, o);
            before += __shfl_xor_sync(kFull, before, o);
        }
        if (lane == 0) {
            cnt_s[e] = all;
            pre_s[0][e] = before;
        }
    }
    __syncthreads();
    /* the rows of the block's chunks before each warp's, per expert */
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
        int run = pre_s[0][e];
#pragma unroll
        for (int u = 0; u < kPlaceWarps; u++) {
            const int64_t c = c_first + u;
            pre_s[u][e] = run;
            if (c < nch) run += a.scratch[(int64_t)e * nch + c];
        }
    }
    const etp__ep_layout_need_t need =
        block_layout_offsets(cnt_s, off_s, L, a.alignment, a.fixed_slots, a.rows_cap);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        stat_layout(a.stats, need);
        __threadfence();
    }
    __syncthreads();
    if (blockIdx.x == 0) {
        for (int e = threadIdx.x; e <= L; e += blockDim.x) {
            a.offsets[e] = off_s[e];
            if (e < L) a.counts[e] = cnt_s[e];
        }
        copy_mirror(a);
    }
    const unsigned below = (1u << lane) - 1u;
    const int64_t c = c_first + w;
    if (c >= nch) return;
    const int64_t i = c * ETP__EP_LAYOUT_CHUNK + lane;
    const uint64_t m = etp_ep_layout::row_experts(a, i, a.recv_base, a.recv_cnt);
    /* per expert, which of the chunk's rows select it: a ballot each */
    for (int e = 0; e < L; e++) {
        const unsigned b = __ballot_sync(kFull, (unsigned)(m >> e) & 1u);
        if (lane == 0) bal_s[w][e] = b;
    }
    __syncwarp();
    if (i >= a.recv_rows) return;
    /* row e of this received row: the q-th of expert e, kept below its count */
    auto row_of = [&](int e) -> int32_t {
        const int q = pre_s[w][e] + __popc(bal_s[w][e] & below);
        return q < cnt_s[e] ? off_s[e] + q : -1;
    };
    for (int j = 0; j < k; j++) {
        const int32_t e = m ? etp__ep_recv_expert(a.recv_meta, k, a.local_experts, i, j) : -1;
        const int32_t row = e >= 0 ? row_of(e) : -1;
        a.recv_row[i * k + j] = row;
        if (row >= 0) a.row_src[row] = (int32_t)(i * k + j);
    }
    /* the rows ascending (etp__ep_sort_rows' order) are the experts'
     * ascending: expert e's rows lie below expert e + 1's, and a row
     * selects an expert at most once */
    int nr = 0;
    for (uint64_t mm = m; mm; mm &= mm - 1) {
        const int32_t row = row_of(__ffsll((long long)mm) - 1);
        if (row >= 0) a.tok_rows[i * k + nr++] = row;
    }
    for (; nr < k; nr++) a.tok_rows[i * k + nr] = -1;
}

/* ---- data movement ------------------------------------------------------ */

/* Copy one row of `bytes`: 16-byte words when both ends allow it. */
__device__ __forceinline__ void copy_row(char *dst, const char *src, int64_t bytes)
{
    if ((((uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes) & 15u) == 0) {
        const int64_t n = bytes / 16;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

__device__ __forceinline__ void zero_row(char *dst, int64_t bytes)
{
    if ((((uintptr_t)dst | (uintptr_t)bytes) & 15u) == 0) {
        for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
            reinterpret_cast<uint4 *>(dst)[i] = make_uint4(0, 0, 0, 0);
    } else {
        for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = 0;
    }
}

/* The weights of token t's copy to rank d, at send row `row` (if weighted). */
__device__ __forceinline__ void pack_weights(const etp__ep_pack_args_t &a, int64_t t, int d,
                                             int64_t row)
{
    if (!a.send_w) return;
    for (int j = threadIdx.x; j < a.k; j += blockDim.x)
        a.send_w[row * a.k + j] = etp__ep_slot_weight(a.slot_dest + t * a.k, a.weights + t * a.k, j, d);
}

/* One block per token. */
__global__ void pack_kernel(etp__ep_pack_args_t a)
{
    const int64_t t = blockIdx.x;
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    const int R = a.ranks;
    const int64_t rb = a.hidden * etp__ep_esize(a.dtype);
    for (int d = 0; d < R; d++) {
        const int64_t row = etp__ep_send_row(a.send_pos, a.send_base, R, t, d);
        if (row < 0) continue;
        copy_row(static_cast<char *>(a.send_tok) + row * rb,
                 static_cast<const char *>(a.tokens) + t * rb, rb);
        pack_weights(a, t, d, row);
    }
}

/* MXFP8 dispatch, one block per token: each thread quantizes 32-element
 * blocks of the token once (etp__ep_mx_block) and stores the 32 data bytes
 * and the scale byte in every send row of the token. */
__global__ void pack_mx_kernel(etp__ep_pack_args_t a)
{
    const int64_t t = blockIdx.x;
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    const int R = a.ranks;
    const int64_t H = a.hidden, nb = H / ETP__EP_MX_BLOCK, rb = ETP__EP_MX_ROW_BYTES(H);
    char *send = static_cast<char *>(a.send_tok);
    const bool vec = a.dtype == ETP__EP_BF16 && (reinterpret_cast<uintptr_t>(a.tokens) & 15u) == 0;
    /* rows are 16-byte multiples: 16-byte stores when the buffer is aligned
     * (always with the default allocators; a user allocator might not be) */
    const bool vst = (reinterpret_cast<uintptr_t>(a.send_tok) & 15u) == 0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        const int64_t h0 = t * H + b * ETP__EP_MX_BLOCK;
        float x[ETP__EP_MX_BLOCK];
        if (vec) {
            const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.tokens) + h0);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 v = src[q];
                const uint32_t pair[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    x[q * 8 + 2 * c] = etp__qf_bf16_to_f32((uint16_t)(pair[c] & 0xffffu));
                    x[q * 8 + 2 * c + 1] = etp__qf_bf16_to_f32((uint16_t)(pair[c] >> 16));
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < ETP__EP_MX_BLOCK; c++) x[c] = etp__ep_load(a.tokens, a.dtype, h0 + c);
        }
        uint8_t q[ETP__EP_MX_BLOCK];
        const uint8_t e = etp__ep_mx_block(x, q);
        uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int c = 0; c < ETP__EP_MX_BLOCK; c++) w[c / 4] |= (uint32_t)q[c] << (8 * (c % 4));
        const uint4 lo = make_uint4(w[0], w[1], w[2], w[3]), hi = make_uint4(w[4], w[5], w[6], w[7]);
        for (int d = 0; d < R; d++) {
            const int64_t srow = etp__ep_send_row(a.send_pos, a.send_base, R, t, d);
            if (srow < 0) continue;
            char *row = send + srow * rb;
            if (vst) {
                uint4 *dst = reinterpret_cast<uint4 *>(row + b * ETP__EP_MX_BLOCK);
                dst[0] = lo;
                dst[1] = hi;
            } else {
#pragma unroll
                for (int c = 0; c < ETP__EP_MX_BLOCK; c++)
                    row[b * ETP__EP_MX_BLOCK + c] = (char)(w[c / 4] >> (8 * (c % 4)));
            }
            row[H + b] = (char)e;
        }
    }
    for (int d = 0; d < R; d++) {
        const int64_t row = etp__ep_send_row(a.send_pos, a.send_base, R, t, d);
        if (row < 0) continue;
        for (int64_t i = H + nb + threadIdx.x; i < rb; i += blockDim.x) send[row * rb + i] = 0;
        pack_weights(a, t, d, row);
    }
}

/* One block per output row. */
__global__ void expand_kernel(etp__ep_expand_args_t a)
{
    const int64_t r = blockIdx.x;
    const int32_t src = a.row_src[r];
    const int64_t H = a.hidden, rb = H * etp__ep_esize(a.dtype);
    char *o = static_cast<char *>(a.out) + r * rb;
    if (a.mx) {
        /* MXFP8: H data bytes and H/32 scale bytes per row */
        const int64_t nb = H / ETP__EP_MX_BLOCK;
        char *od = static_cast<char *>(a.out) + r * H;
        char *os = static_cast<char *>(a.out_scales) + r * nb;
        if (src < 0) {
            zero_row(od, H);
            zero_row(os, nb);
        } else {
            const char *in = static_cast<const char *>(a.recv_tok) + (int64_t)(src / a.k) * ETP__EP_MX_ROW_BYTES(H);
            copy_row(od, in, H);
            copy_row(os, in + H, nb);
        }
    } else if (src < 0) {
        zero_row(o, rb);
    } else {
        const int64_t i = src / a.k;
        if (a.scale_w) {
            const float w = a.scale_w[r];
            for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
                etp__ep_store(a.out, a.dtype, r * H + h,
                              w * etp__ep_load(a.recv_tok, a.dtype, i * H + h));
        } else {
            copy_row(o, static_cast<const char *>(a.recv_tok) + i * rb, rb);
        }
    }
    if (threadIdx.x == 0) {
        const float w = etp__ep_row_weight(a.recv_w, src);
        if (a.out_w) a.out_w[r] = w;
        if (a.keep_w) a.keep_w[r] = w;
    }
}

/* One block per received token row; each thread owns columns. The general
 * case (any alignment); presum_vec below is the fast one. */
__global__ void presum_kernel(etp__ep_presum_args_t a)
{
    const int64_t i = blockIdx.x, H = a.hidden;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
        etp__ep_store(a.partial, a.wire, i * H + h, etp__ep_presum_elem(&a, i, h));
}

/* 4 wire values (FP32 or BF16) of a partial, as FP32. */
__device__ __forceinline__ void load_wire4(const void *p, int wire, int64_t idx4, float *v)
{
    if (wire == ETP__EP_BF16) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p) + idx4);
        v[0] = etp__qf_bf16_to_f32((uint16_t)(u.x & 0xffffu));
        v[1] = etp__qf_bf16_to_f32((uint16_t)(u.x >> 16));
        v[2] = etp__qf_bf16_to_f32((uint16_t)(u.y & 0xffffu));
        v[3] = etp__qf_bf16_to_f32((uint16_t)(u.y >> 16));
    } else {
        const float4 f = __ldg(reinterpret_cast<const float4 *>(p) + idx4);
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
    }
}

constexpr int kPresumBatch = 4; /* expert rows loaded together (in flight at once) */

/* presum_kernel with 16-byte loads (V elements of one row) and the token's
 * rows loaded kPresumBatch at a time before they are summed, so that a
 * thread has several loads in flight; each element's terms are added in the
 * order of etp__ep_presum_elem. Needs 16-byte aligned rows (checked by the
 * launcher). */
template <int V>
__global__ void __launch_bounds__(128) presum_vec(etp__ep_presum_args_t a)
{
    __shared__ int32_t rows[kVecMaxTopk];
    __shared__ float w[kVecMaxTopk];
    __shared__ int nrows;
    const int64_t i = blockIdx.x, H = a.hidden, nv = H / V;
    if (threadIdx.x == 0) {
        int n = 0;
        while (n < a.k && a.tok_rows[i * a.k + n] >= 0) n++;
        nrows = n;
    }
    __syncthreads();
    const int n = nrows;
    for (int m = threadIdx.x; m < n; m += blockDim.x) {
        rows[m] = a.tok_rows[i * a.k + m];
        w[m] = a.row_w ? a.row_w[rows[m]] : 1.0f;
    }
    __syncthreads();
    const uint4 *in = static_cast<const uint4 *>(a.in);
    float4 *out = reinterpret_cast<float4 *>(static_cast<float *>(a.partial) + i * H);
    uint16_t *out16 = static_cast<uint16_t *>(a.partial) + i * H;
    for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) {
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int m0 = 0; m0 < n; m0 += kPresumBatch) {
            uint4 v[kPresumBatch];
#pragma unroll
            for (int u = 0; u < kPresumBatch; u++)
                if (m0 + u < n) v[u] = __ldg(in + (int64_t)rows[m0 + u] * nv + c);
#pragma unroll
            for (int u = 0; u < kPresumBatch; u++) {
                if (m0 + u >= n) break;
                float x[V];
                unpack16<V>(v[u], x);
#pragma unroll
                for (int j = 0; j < V; j++)
                    acc[j] = etp__ep_presum_step(acc[j], a.row_w != nullptr, w[m0 + u], x[j]);
            }
        }
        if (a.wire == ETP__EP_BF16) {
            store_bf16<V>(out16 + c * V, acc);
        } else {
#pragma unroll
            for (int j = 0; j < V; j += 4)
                out[c * (V / 4) + j / 4] = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
        }
    }
}

/* One block per token. */
__global__ void reduce_kernel(etp__ep_reduce_args_t a)
{
    const int64_t t = blockIdx.x, H = a.hidden;
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
        etp__ep_store(a.out, a.dtype, t * H + h, etp__ep_reduce_elem(&a, t, h));
}

/* reduce_kernel on 4 columns per thread: 16-byte loads of the partials and
 * 8-byte (BF16) or 16-byte (FP32) stores, each element's partials added in
 * the order of etp__ep_reduce_elem. Needs H % 4 == 0 and aligned buffers
 * (checked by the launcher). */
__global__ void __launch_bounds__(128) reduce_vec(etp__ep_reduce_args_t a)
{
    __shared__ int64_t src[kVecMaxRanks];
    __shared__ int nsrc;
    const int64_t t = blockIdx.x, H = a.hidden, nv = H / 4;
    if (t >= tokens_of(a.t_dev, a.t_max)) return;
    if (threadIdx.x == 0) {
        int n = 0;
        for (int d = 0; d < a.ranks; d++) {
            const int64_t row = etp__ep_send_row(a.send_pos, a.send_base, a.ranks, t, d);
            if (row >= 0) src[n++] = row * nv;
        }
        nsrc = n;
    }
    __syncthreads();
    const int n = nsrc;
    for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d = 0; d < n; d++) {
            float v[4];
            load_wire4(a.partial, a.wire, src[d] + c, v);
            acc[0] = acc[0] + v[0];
            acc[1] = acc[1] + v[1];
            acc[2] = acc[2] + v[2];
            acc[3] = acc[3] + v[3];
        }
        if (a.dtype == ETP__EP_BF16) {
            uint32_t h2[2];
            for (int q = 0; q < 2; q++)
                h2[q] = (uint32_t)etp__qf_f32_to_bf16(acc[2 * q]) |
                        (uint32_t)etp__qf_f32_to_bf16(acc[2 * q + 1]) << 16;
            const uint32_t lo = h2[0], hi = h2[1];
            reinterpret_cast<uint2 *>(a.out)[t * nv + c] = make_uint2(lo, hi);
        } else {
            reinterpret_cast<float4 *>(a.out)[t * nv + c] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        }
    }
}

__global__ void wgrad_gather(etp__ep_wgrad_args_t a)
{
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= a.ntok * a.k) return;
    const int32_t r = a.recv_row[x];
    a.g[x] = r >= 0 ? a.grad_row_w[r] : 0.0f;
}

/* One block (ETP__EP_DOT_LANES threads) per received token row. */
__global__ void wgrad_dot(etp__ep_wgrad_args_t a)
{
    __shared__ float lane[ETP__EP_DOT_LANES];
    const int64_t i = blockIdx.x, H = a.hidden, es = etp__ep_esize(a.dtype);
    const int l = threadIdx.x;
    const char *x = static_cast<const char *>(a.recv_tok) + i * H * es;
    for (int j = 0; j < a.k; j++) {
        const int32_t r = a.recv_row[i * a.k + j];
        if (r < 0) {
            if (l == 0) a.g[i * a.k + j] = 0.0f;
            continue;
        }
        const char *y = static_cast<const char *>(a.rows_in) + (int64_t)r * H * es;
        lane[l] = etp__ep_dot_lane(x, y, a.dtype, H, l);
        __syncthreads();
        for (int w = ETP__EP_DOT_LANES / 2; w >= 1; w /= 2) {
            if (l < w) etp__ep_dot_fold(lane, l, w);
            __syncthreads();
        }
        if (l == 0) a.g[i * a.k + j] = lane[0];
        __syncthreads();
    }
}

__global__ void wscatter_kernel(etp__ep_wscatter_args_t a)
{
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int k = a.k;
    if (x >= tokens_of(a.t_dev, a.t_max) * k) return;
    a.out[x] = etp__ep_slot_grad(&a, x / k, (int)(x % k));
}

} // namespace

#define ETP__TRY_CUDA(expr)                      \
    do {                                         \
        cudaError_t etp__e_ = (expr);            \
        if (etp__e_ != cudaSuccess) return etp__e_; \
    } while (0)

extern "C" cudaError_t etp__cuda_ep_route(cudaStream_t s, const etp__ep_route_args_t *a)
{
    /* route_mark: a thread per token */
    const unsigned g = blocks_for(a->t_max, kThreads);
    cudaError_t e;
    switch (a->k) {
    case 1: e = launch(route_mark<1>, g, kThreads, s, *a); break;
    case 2: e = launch(route_mark<2>, g, kThreads, s, *a); break;
    case 3: e = launch(route_mark<3>, g, kThreads, s, *a); break;
    case 4: e = launch(route_mark<4>, g, kThreads, s, *a); break;
    case 5: e = launch(route_mark<5>, g, kThreads, s, *a); break;
    case 6: e = launch(route_mark<6>, g, kThreads, s, *a); break;
    case 7: e = launch(route_mark<7>, g, kThreads, s, *a); break;
    case 8: e = launch(route_mark<8>, g, kThreads, s, *a); break;
    default: e = launch(route_mark<0>, g, kThreads, s, *a); break;
    }
    static_assert(kRouteK == 8, "route_mark is instantiated for k = 1 .. 8");
    ETP__TRY_CUDA(e);
    ETP__TRY_CUDA(launch(route_scan, (unsigned)a->ranks, kScanThreads, s, *a));
    if (!a->exact) return cudaSuccess; /* the scan wrote the bases and metadata */
    ETP__TRY_CUDA(launch(route_base, 1, 1, s, *a));
    if (!a->send_meta) return cudaSuccess;
    return launch(route_meta, blocks_for(a->t_max, kThreads), kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_clip(cudaStream_t s, const etp__ep_clip_args_t *a)
{
    return launch(clip_kernel, blocks_for(a->t_max, kThreads), kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_layout(cudaStream_t s, const etp__ep_layout_args_t *a)
{
    /* the scratch holds the chunks' counts (ETP__EP_LAYOUT_SCRATCH) */
    if (ETP__EP_LAYOUT_FEW(a->local_experts, a->k, a->ranks, a->recv_rows)) {
        const int64_t nch = (a->recv_rows + ETP__EP_LAYOUT_CHUNK - 1) / ETP__EP_LAYOUT_CHUNK;
        /* the exchange kernel counted the chunks (NVLINK) */
        if (!a->after_exchange)
            ETP__TRY_CUDA(launch(layout_chunks, blocks_for(nch * 32, kThreads), kThreads, s, *a));
        /* a warp per chunk */
        return launch(layout_place, blocks_for(nch * 32, kThreads), kThreads, s, *a);
    }
    const size_t per_tok = (size_t)a->recv_rows * (size_t)a->k * sizeof(int32_t);
    ETP__TRY_CUDA(cudaMemsetAsync(a->recv_row, 0xff, per_tok, s));
    ETP__TRY_CUDA(cudaMemsetAsync(a->row_src, 0xff, (size_t)a->rows_cap * sizeof(int32_t), s));
    ETP__TRY_CUDA(launch(layout_bases, 1, 1, s, *a));
    ETP__TRY_CUDA(launch(layout_count, (unsigned)a->local_experts, kScanThreads, s, *a));
    ETP__TRY_CUDA(launch(layout_offsets, 1, 1, s, *a));
    ETP__TRY_CUDA(launch(layout_assign, (unsigned)a->local_experts, kScanThreads, s, *a));
    return launch(layout_sort, blocks_for(a->recv_rows, kThreads), kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_pack(cudaStream_t s, const etp__ep_pack_args_t *a)
{
    if (a->mx) return launch(pack_mx_kernel, (unsigned)a->t_max, kThreads, s, *a);
    return launch(pack_kernel, (unsigned)a->t_max, kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_expand(cudaStream_t s, const etp__ep_expand_args_t *a)
{
    if (a->rows == 0) return cudaSuccess;
    return launch(expand_kernel, (unsigned)a->rows, kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_presum(cudaStream_t s, const etp__ep_presum_args_t *a)
{
    if (a->ntok == 0) return cudaSuccess;
    const uintptr_t addr = (uintptr_t)a->in | (uintptr_t)a->partial;
    const int64_t es = a->dtype == ETP__EP_BF16 ? 2 : 4;
    if ((addr & 15u) == 0 && (a->hidden * es) % 16 == 0 && a->k <= kVecMaxTopk) {
        if (a->dtype == ETP__EP_BF16) return launch(presum_vec<8>, (unsigned)a->ntok, 128, s, *a);
        return launch(presum_vec<4>, (unsigned)a->ntok, 128, s, *a);
    }
    return launch(presum_kernel, (unsigned)a->ntok, kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_reduce(cudaStream_t s, const etp__ep_reduce_args_t *a)
{
    const uintptr_t addr = (uintptr_t)a->partial | (uintptr_t)a->out;
    if ((addr & 15u) == 0 && a->hidden % 4 == 0 && a->ranks <= kVecMaxRanks)
        return launch(reduce_vec, (unsigned)a->t_max, 128, s, *a);
    return launch(reduce_kernel, (unsigned)a->t_max, kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_wgrad(cudaStream_t s, const etp__ep_wgrad_args_t *a)
{
    if (a->ntok == 0) return cudaSuccess;
    if (a->dot) return launch(wgrad_dot, (unsigned)a->ntok, ETP__EP_DOT_LANES, s, *a);
    return launch(wgrad_gather, blocks_for(a->ntok * a->k, kThreads), kThreads, s, *a);
}

extern "C" cudaError_t etp__cuda_ep_wscatter(cudaStream_t s, const etp__ep_wscatter_args_t *a)
{
    return launch(wscatter_kernel, blocks_for(a->t_max * a->k, kThreads), kThreads, s, *a);
}
