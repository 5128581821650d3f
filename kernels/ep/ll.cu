/*
 * The low-latency dispatch kernel (src/backend/ep_args.h:
 * etp__ep_ll_args_t defines what it computes and its window). One kernel
 * of nvl.blocks blocks does what prepare and dispatch do in several
 * kernels and collectives, for at most ETP_EP_LL_MAX_TOKENS tokens a rank:
 *
 * 1. every block routes this rank's tokens (a few hundred: redundantly,
 *    in shared memory, so that no block waits for another), block 0 keeps
 *    the routing and stores this rank's count row into every rank's
 *    window and signals;
 * 2. a warp per (token, part of its row) stores the part into the slab
 *    of every rank that keeps the token (part 0's warp also the metadata
 *    and weights), and each block signals. Which ranks keep it is EXACT's
 *    receive-capacity clip, known once every rank's counts are here;
 *    where the clip cannot drop this rank's tokens (etp__ep_never_clipped)
 *    the stores start as soon as each destination has released the
 *    previous call's slab, and the counts travel beside them;
 * 3. once every block of every rank has stored, the blocks lay out the
 *    received rows (per local expert counts, offsets, rows in (source rank,
 *    token) order) and expand them into the half's rows: with at most
 *    kFastL local experts each block counting for itself, with no block
 *    barrier (layout_chunked), else the per-expert scans with three. The last
 *    block to finish writes the counters' host mirror and releases this
 *    rank's slab to every rank.
 *
 * Every rule is ep_rules.h's (the same the host backend runs), every wait
 * is bounded as in the NVLINK kernels (nvl_sync.cuh), and the call is
 * counted on the device, so graphs replay. Compiled with --fmad=false.
 */
#include <stdint.h>

#include "ep/ep_rules.h"
#include "ll_kernels.h"
#include "ep_dev.cuh"
#include "layout_dev.cuh"
#include "nvl_sync.cuh"

namespace
{

using namespace etp_ep_dev;
using namespace etp_nvl_sync;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxTokens = 256; /* ETP_EP_LL_MAX_TOKENS */
constexpr int kMaxTopk = ETP__EP_LL_MAX_TOPK;
constexpr int kMaxRanks = ETP__EP_LL_MAX_RANKS;
/* local experts the chunked layout takes: a bit each in a uint64 */
constexpr int kFastL = ETP__EP_LAYOUT_FEW_L;
/* block barriers a call passes with more local experts (counts, offsets,
 * rows); the chunked layout passes none */
constexpr int kBarriers = 3;
/* chunks of 32 received rows at most: ETP__EP_LL_MAX_RANKS x kMaxTokens rows */
constexpr int kMaxChunks = kMaxRanks * kMaxTokens / 32;
/* Shared memory of a block that the routing (each token's positions at
 * each rank, its slots' destinations) and then the chunked layout (each
 * expert's prefix per chunk) use in turn: the routing's last reads (the
 * stores, the clip) come before the barrier of the arrival wait, and the
 * layout's first writes after it. */
constexpr int kPosBytes = kMaxTokens * kMaxRanks * 2, kSdBytes = kMaxTokens * kMaxTopk * 4;
constexpr int kPrefixBytes = kFastL * kMaxChunks * 2;
constexpr int kTurnBytes = kPosBytes + kSdBytes > kPrefixBytes ? kPosBytes + kSdBytes
                                                               : kPrefixBytes;
static_assert(kMaxRanks * kMaxTokens <= 65535, "a chunk prefix fits a uint16_t");

/* Every block of this rank reached barrier b of call call_no (blocks of a
 * rank are resident together, as the NVLINK kernels need): bounded like
 * the cross-rank waits. */
__device__ bool block_barrier(const etp__ep_nvl_t &n, uint64_t call_no, int b, int per_call,
                              int64_t t0)
{
    __shared__ int ok;
    __syncthreads();
    if (threadIdx.x == 0) {
        ok = 1;
        __threadfence();
        atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 2), 1ull);
        const uint64_t want = ((call_no - 1) * (uint64_t)per_call + (uint64_t)b + 1) *
                              (uint64_t)n.blocks;
        if (!wait_for(n, n.calls + 2, want, t0, n.me, ETP__EP_NVL_LL_DISPATCH,
                      ETP__EP_NVL_WAIT_ARRIVAL))
            ok = 0;
        __threadfence();
    }
    __syncthreads();
    return ok != 0;
}

/* The local expert slot j of received row i selects (a valid row), or -1. */
__device__ __forceinline__ int slot_of(const etp__ep_ll_args_t &a, const int32_t *meta,
                                       const int32_t *rc, int64_t i, int e)
{
    const int64_t tm = a.nvl.t_max;
    if (i % tm >= rc[i / tm]) return -1;
    for (int j = 0; j < a.k; j++)
        if (etp__ep_recv_expert(meta, a.k, a.local_experts, i, j) == e) return j;
    return -1;
}

__device__ __forceinline__ char *shfl_ptr(char *p, int from)
{
    return reinterpret_cast<char *>(
        __shfl_sync(kFull, reinterpret_cast<unsigned long long>(p), from));
}

/* A warp stores bytes [b0, b1) of src into the row dst of each lane in
 * `who` (warp-uniform): every 16-byte group (vec; else byte) is loaded
 * once, 8 a lane in flight, and stored into every row, the lanes from
 * `first` (< 32) up, then those below it. A row's copy is bound by the
 * loads' latency at a few rows a warp, so loading once for all of a
 * token's rows (or ranks) is what makes it fast. */
__device__ void copy_fanout(char *dst, unsigned who, const char *src, int64_t b0, int64_t b1,
                            bool vec, int first = 0)
{
    /* the lanes in store order: those from `first` up, then the rest */
    const unsigned up = who & (~0u << first), down = who & ~(~0u << first);
    const int lane = threadIdx.x & 31;
    if (vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
        const int64_t c1 = b1 / 16;
        for (int64_t base = b0 / 16; base < c1; base += 8 * 32) {
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int64_t c = base + u * 32 + lane;
                v[u] = c < c1 ? s4[c] : make_uint4(0, 0, 0, 0);
            }
            for (int h = 0; h < 2; h++)
                for (unsigned w = h ? down : up; w; w &= w - 1) {
                    uint4 *d4 = reinterpret_cast<uint4 *>(shfl_ptr(dst, __ffs(w) - 1));
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int64_t c = base + u * 32 + lane;
                        if (c < c1) d4[c] = v[u];
                    }
                }
        }
    } else {
        for (int64_t base = b0; base < b1; base += 32) {
            const int64_t b = base + lane;
            const char v = b < b1 ? src[b] : 0;
            for (int h = 0; h < 2; h++)
                for (unsigned w = h ? down : up; w; w &= w - 1) {
                    char *d = shfl_ptr(dst, __ffs(w) - 1);
                    if (b < b1) d[b] = v;
                }
        }
    }
}

/* Into how many parts (1 .. kMaxParts) a row's copies are split so that
 * n rows keep nw warps busy. */
constexpr int kMaxParts = 8;
__device__ __forceinline__ int parts_for(int n, int nw)
{
    const int p = n > 0 ? nw / n : 1;
    return p < 1 ? 1 : p > kMaxParts ? kMaxParts : p;
}

/* Part `part` of P of a row of rb bytes: [*b0, *b1), whole 16-byte groups
 * with vec. */
__device__ __forceinline__ void part_of(int64_t rb, int P, int part, bool vec, int64_t *b0,
                                        int64_t *b1)
{
    const int64_t g = vec ? 16 : 1, n = rb / g, per = (n + P - 1) / P;
    *b0 = etp__ep_min((int64_t)part * per, n) * g;
    *b1 = etp__ep_min((int64_t)(part + 1) * per, n) * g;
}

__device__ void zero_bytes(char *dst, int64_t rb, bool vec)
{
    const int lane = threadIdx.x & 31;
    if (vec) {
        uint4 *d4 = reinterpret_cast<uint4 *>(dst);
        for (int64_t c = lane; c < rb / 16; c += 32) d4[c] = make_uint4(0, 0, 0, 0);
    } else {
        for (int64_t b = lane; b < rb; b += 32) dst[b] = 0;
    }
}

/* The local experts received row i selects, as bits (0: no valid row):
 * slabs of t_max rows, rc[s] of them valid. */
__device__ __forceinline__ uint64_t row_mask(const etp__ep_ll_args_t &a, const int32_t *meta,
                                             const int32_t *rc, int64_t nrecv, int64_t i)
{
    if (i >= nrecv || !etp__ep_recv_valid(rc, rc, a.nvl.ranks, 0, a.nvl.t_max, i)) return 0;
    return etp_ep_layout::expert_bits(meta, a.k, a.local_experts, i);
}

/* The layout and the expand with few local experts (L <= kFastL), past one
 * block barrier instead of three and without a sort: rows in (source,
 * token) order within each expert, the first counts[e] kept, as
 * layout_count / offsets / assign / sort of ep.cu lay them out.
 * (a) Every block counts, per chunk of 32 received rows, the rows that
 *     select each expert (a ballot each) and scans each expert's chunks
 *     into pre_s (the prefix of expert e before chunk c at e * chunks + c)
 *     and its total: about a microsecond of ballots on the metadata, where
 *     blocks e counting expert e into global memory for all cost their
 *     round trip and a block barrier.
 * (b) Every block computes the offsets and kept counts (cnt_s, off_s) from
 *     the totals itself (block_layout_offsets).
 * (c) A warp per (received row i, part of it): the row of each of i's
 *     slots (the prefix of its chunk plus its rank in the chunk's ballot),
 *     the part of the token's bytes into each of its rows, and with part 0
 *     recv_row, row_src, the weights and tok_rows (ascending rows are
 *     ascending experts: expert e's rows lie below e + 1's, and a row
 *     selects an expert at most once); then a warp per layout row that
 *     holds no token: zeros.
 * The caller's last block writes the kept counts and offsets. pre_s:
 * kPrefixBytes of shared memory (a prefix is at most kMaxRanks *
 * kMaxTokens). */
__device__ void layout_chunked(const etp__ep_ll_args_t &a, const int32_t *meta, const int32_t *rc,
                               int64_t nrecv, const char *slab, const float *recv_w, int64_t rb,
                               int64_t in_rb, bool vec, uint16_t *pre_s, int32_t *cnt_s,
                               int32_t *off_s)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, k = a.k;
    const int L = (int)a.local_experts;
    const int64_t nch = (nrecv + 31) / 32;
    for (int64_t c = warp; c < nch; c += kWarps) {
        const uint64_t m = row_mask(a, meta, rc, nrecv, c * 32 + lane);
        for (int e = 0; e < L; e++) {
            const unsigned b = __ballot_sync(kFull, (unsigned)(m >> e) & 1u);
            if (lane == (e & 31)) pre_s[(int64_t)e * nch + c] = (uint16_t)__popc(b);
        }
    }
    __syncthreads();
    /* a warp per expert: the exclusive scan of its chunks' counts */
    for (int e = warp; e < L; e += kWarps) {
        int running = 0;
        for (int64_t c0 = 0; c0 < nch; c0 += 32) {
            const int64_t c = c0 + lane;
            const int v = c < nch ? pre_s[(int64_t)e * nch + c] : 0;
            int x = v;
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(kFull, x, o);
                if (lane >= o) x += y;
            }
            if (c < nch) pre_s[(int64_t)e * nch + c] = (uint16_t)(running + x - v);
            running += __shfl_sync(kFull, x, 31);
        }
        if (lane == 0) cnt_s[e] = running;
    }
    __syncthreads();
    const etp__ep_layout_need_t need =
        block_layout_offsets(cnt_s, off_s, L, a.alignment, a.fixed_slots, a.rows_cap);
    if (blockIdx.x == 0 && threadIdx.x == 0) stat_layout(a.stats, need);
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    /* a warp per (received row, part of it): nrecv <= kMaxChunks * 32 rows */
    const int P = parts_for((int)nrecv, (int)nw);
    for (int x = (int)gw; x < (int)nrecv * P; x += (int)nw) {
        const int i = x / P, part = x % P, c = i / 32, li = i % 32;
        const uint64_t m = row_mask(a, meta, rc, nrecv, c * 32 + lane);
        const uint64_t mi = __shfl_sync(kFull, m, li);
        if (!mi && part > 0) continue;
        const int32_t ej =
            lane < k && mi ? etp__ep_recv_expert(meta, k, a.local_experts, i, lane) : -1;
        /* the chunk's rows before row i that select each of i's experts
         * (a ballot each), then every slot's chunk prefix in one load */
        int below = 0;
        for (uint64_t mm = mi; mm; mm &= mm - 1) {
            const int e = __ffsll((long long)mm) - 1;
            const unsigned b = __ballot_sync(kFull, (unsigned)(m >> e) & 1u);
            if (ej == e) below = __popc(b & ((1u << li) - 1u));
        }
        int32_t row = -1;
        if (ej >= 0) {
            const int q = (int)pre_s[(int64_t)ej * nch + c] + below;
            row = q < cnt_s[ej] ? off_s[ej] + q : -1;
        }
        const bool kept = row >= 0;
        const unsigned kb = __ballot_sync(kFull, kept);
        if (part == 0) {
            if (lane < k) {
                a.recv_row[(int64_t)i * k + lane] = row;
                if (kept) {
                    a.row_src[row] = (int32_t)(i * k + lane);
                    if (a.out_w) a.out_w[row] = etp__ep_row_weight(recv_w, (int32_t)(i * k + lane));
                }
            }
            int rank = 0;
            for (int j = 0; j < k; j++) {
                const int32_t e2 = __shfl_sync(kFull, ej, j);
                rank += ((kb >> j) & 1u) && e2 < ej;
            }
            if (kept) a.tok_rows[(int64_t)i * k + rank] = row;
            if (lane < k && lane >= __popc(kb)) a.tok_rows[(int64_t)i * k + lane] = -1;
        }
        int64_t b0, b1;
        part_of(in_rb, P, part, vec, &b0, &b1);
        copy_fanout(kept ? static_cast<char *>(a.out) + (int64_t)row * in_rb : nullptr, kb,
                    slab + (int64_t)i * rb, b0, b1, vec);
    }
    /* the rows no token fills: an expert's tail past its kept rows (the
     * alignment's padding, fixed slots' empty ones) and past the last */
    for (int64_t r = gw; r < a.rows_cap; r += nw) {
        int lo = 0, hi = L; /* the expert whose range holds r: off_s[lo] <= r < off_s[lo + 1] */
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (off_s[mid + 1] <= r) lo = mid + 1; else hi = mid;
        }
        if (lo < L && r < off_s[lo] + cnt_s[lo]) continue;
        if (lane == 0) {
            a.row_src[r] = -1;
            if (a.out_w) a.out_w[r] = 0.0f;
        }
        zero_bytes(static_cast<char *>(a.out) + r * in_rb, in_rb, vec);
    }
}

/* Token t's slots routed into sd_s (the rule, etp__ep_route_token); its
 * destinations as bits. K = k <= 8: in registers (route_regs); K = 0: any
 * k, on sd_s. The lead block counts the rule's breaks and writes
 * slot_dest. */
template <int K>
__device__ uint32_t route_one(const etp__ep_ll_args_t &a, int64_t t, int32_t *sd_s, bool lead)
{
    const int k = K ? K : a.k;
    int32_t *sd = sd_s + t * k;
    int bad, dup;
    if constexpr (K == 0) {
        etp__ep_route_token(a.topk_idx + t * k, k, a.num_experts, a.local_experts, sd, &bad, &dup);
    } else {
        int32_t r[K];
        route_regs<K>(a.topk_idx + t * K, a.num_experts, a.local_experts, r, &bad, &dup);
#pragma unroll
        for (int j = 0; j < K; j++) sd[j] = r[j];
    }
    uint32_t m = 0;
    for (int j = 0; j < k; j++)
        if (sd[j] >= 0) m |= 1u << sd[j];
    if (lead) {
        stat_route(a.stats, bad, dup);
        for (int j = 0; j < k; j++) a.slot_dest[t * k + j] = sd[j];
    }
    return m;
}

/* EXACT's clip from every rank's counts (parity par of the window): what
 * this rank sends each rank (acc_s) and receives from it (rc_s); the lead
 * block also writes the half's send and receive counts and positions and
 * counts the drops. */
__device__ void clip(const etp__ep_ll_args_t &a, int par, const int32_t *sd_s, const int16_t *pos_s,
                     int32_t *acc_s, int32_t *rc_s, bool lead)
{
    const etp__ep_nvl_t &n = a.nvl;
    const int R = n.ranks, me = n.me, k = a.k;
    const int64_t tm = n.t_max;
    const int32_t *C = reinterpret_cast<const int32_t *>(n.peers[me] + a.cnt_off) +
                       (int64_t)par * R * R;
    if (threadIdx.x < R) {
        const int d = threadIdx.x;
        acc_s[d] = (int32_t)etp__ep_accepted(C, R, a.tok_cap, me, d);
        rc_s[d] = (int32_t)etp__ep_accepted(C, R, a.tok_cap, d, me);
        if (lead) {
            if (acc_s[d] != C[(int64_t)me * R + d]) {
                stat_max(a.stats, ETP__EP_ST_TRANSPORT_NEEDED, etp__ep_wanted_by(C, R, d));
                stat_flag(a.stats, ETP__EP_F_TRANSPORT_FULL);
            }
            a.send_cnt[d] = acc_s[d];
            a.send_base[d] = (int32_t)((int64_t)d * tm);
            a.recv_cnt[d] = rc_s[d];
            a.recv_base[d] = (int32_t)((int64_t)d * tm);
        }
    }
    __syncthreads();
    if (lead) {
        for (int64_t x = threadIdx.x; x < tm * R; x += kThreads) {
            const int64_t t = x / R;
            const int d = (int)(x % R);
            const int p = pos_s[x];
            const bool kept = p >= 0 && p < acc_s[d];
            a.send_pos[x] = kept ? p : -1;
            if (p >= 0 && !kept)
                stat_add(a.stats, ETP__EP_ST_TRANSPORT_DROPPED,
                         etp__ep_slots_to(sd_s + t * k, k, d));
        }
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) ll_dispatch_kernel(etp__ep_ll_args_t a, int vec)
{
    const etp__ep_nvl_t &n = a.nvl;
    __shared__ uint32_t mask_s[kMaxTokens];
    /* the routing's arrays, and then the chunked layout's (kTurnBytes) */
    __shared__ __align__(16) unsigned char turn_s[kTurnBytes];
    int16_t *const pos_s = reinterpret_cast<int16_t *>(turn_s);
    int32_t *const sd_s = reinterpret_cast<int32_t *>(turn_s + kPosBytes);
    __shared__ int32_t cnt_s[kMaxRanks], acc_s[kMaxRanks], rc_s[kMaxRanks];
    const int R = n.ranks, me = n.me, k = a.k;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t tm = n.t_max, L = a.local_experts;
    const bool lead = blockIdx.x == 0;
    /* every block reads the count before any can finish the call: each
     * signals its stores after reading, and the last waits for them all */
    const uint64_t call_no = n.calls[0] + 1;
    const int64_t t0 = now_ns();

    /* 1. route (route_mark / route_scan of ep.cu, for one block) */
    const int64_t raw = a.t_in ? *a.t_in : a.t_value;
    const int64_t T = etp__ep_clamp_tokens(raw, tm);
    if (lead && threadIdx.x == 0) {
        *a.t_dev = (int32_t)T;
        if (T != raw) stat_flag(a.stats, ETP__EP_F_BAD_TOKENS);
        stat_add(a.stats, ETP__EP_ST_PREPARES, 1);
    }
    for (int64_t t = threadIdx.x; t < tm; t += kThreads) {
        uint32_t m = 0;
        switch (t < T ? k : 0) {
        case 0:
            for (int j = 0; j < k; j++) sd_s[t * k + j] = -1;
            break;
        case 1: m = route_one<1>(a, t, sd_s, lead); break;
        case 2: m = route_one<2>(a, t, sd_s, lead); break;
        case 3: m = route_one<3>(a, t, sd_s, lead); break;
        case 4: m = route_one<4>(a, t, sd_s, lead); break;
        case 5: m = route_one<5>(a, t, sd_s, lead); break;
        case 6: m = route_one<6>(a, t, sd_s, lead); break;
        case 7: m = route_one<7>(a, t, sd_s, lead); break;
        case 8: m = route_one<8>(a, t, sd_s, lead); break;
        default: m = route_one<0>(a, t, sd_s, lead); break;
        }
        mask_s[t] = m;
        if (lead && t >= T)
            for (int j = 0; j < k; j++) a.slot_dest[t * k + j] = -1;
    }
    __syncthreads();
    /* positions in token order per destination: a warp per destination */
    for (int d = warp; d < R; d += kWarps) {
        int running = 0;
        for (int64_t t0w = 0; t0w < tm; t0w += 32) {
            const int64_t t = t0w + lane;
            const bool hit = t < tm && ((mask_s[t] >> d) & 1u);
            const unsigned b = __ballot_sync(kFull, hit);
            if (t < tm)
                pos_s[t * R + d] = hit ? (int16_t)(running + __popc(b & ((1u << lane) - 1u)))
                                       : (int16_t)-1;
            running += __popc(b);
        }
        if (lane == 0) cnt_s[d] = running;
    }
    __syncthreads();
    /* this rank's count row into every rank's window (parity call_no % 2) */
    const int par = (int)(call_no % 2);
    if (lead) {
        for (int x = threadIdx.x; x < R * R; x += kThreads) {
            const int d = x / R, c = x % R;
            int32_t *dst = reinterpret_cast<int32_t *>(n.peers[d] + a.cnt_off) +
                           ((int64_t)par * R + me) * R + c;
            *dst = cnt_s[c];
        }
        __syncthreads();
        if (threadIdx.x == 0) signal_all(n, 0);
    }
    /* the clip needs every rank's counts, unless it cannot drop a token of
     * this rank: then the stores need only each destination's release of
     * the previous call's slab (signalled when its call ended), and the
     * counts are waited for after them */
    const bool early = etp__ep_never_clipped(me, tm, a.tok_cap);
    if (early) {
        if (threadIdx.x < R) acc_s[threadIdx.x] = cnt_s[threadIdx.x];
        if (!block_wait(n, 2, call_no - 1, ETP__EP_NVL_LL_DISPATCH, ETP__EP_NVL_WAIT_RELEASE, t0))
            return;
    } else {
        if (!block_wait(n, 0, call_no, ETP__EP_NVL_LL_DISPATCH, ETP__EP_NVL_WAIT_ARRIVAL, t0))
            return;
        clip(a, par, sd_s, pos_s, acc_s, rc_s, lead);
    }

    /* 2. the stores */
    const int64_t rb = n.tok_row_bytes;
    const int64_t in_rb = a.hidden * etp__ep_esize(a.dtype);
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    /* a warp per (token, part of its row): the part is loaded once and
     * stored into the slab of every rank that keeps the token, starting
     * at rank (me + x) % R, so that the warps of all ranks do not store
     * into the same rank at once */
    const int P = parts_for((int)T, (int)nw);
    for (int x = (int)gw; x < (int)T * P; x += (int)nw) {
        const int t = x / P, part = x % P;
        const int p = lane < R ? pos_s[t * R + lane] : -1;
        const bool to = p >= 0 && p < acc_s[lane < R ? lane : 0];
        const int64_t row = etp__ep_nvl_row(me, tm, p);
        const unsigned who = __ballot_sync(kFull, to);
        if (!who) continue;
        int64_t b0, b1;
        part_of(in_rb, P, part, vec != 0, &b0, &b1);
        copy_fanout(to ? n.peers[lane] + n.tok_off + row * rb : nullptr, who,
                    static_cast<const char *>(a.tokens) + (int64_t)t * in_rb, b0, b1, vec != 0,
                    (me + x) % R);
        if (part > 0) continue;
        for (unsigned w = who; w; w &= w - 1) {
            const int d = __ffs(w) - 1;
            const int64_t rd = etp__ep_nvl_row(me, tm, pos_s[t * R + d]);
            /* a lane per slot: one rule call per slot (k = 1) keeps the
             * index loads apart from the remote stores they would follow */
            for (int j = lane; j < k; j += 32) {
                const int64_t tj = (int64_t)t * k + j;
                etp__ep_meta_row(a.topk_idx + tj, sd_s + tj, 1, d, L,
                                 reinterpret_cast<int32_t *>(n.peers[d] + n.small_off) + rd * k + j);
                if (a.carry)
                    reinterpret_cast<float *>(n.peers[d] + a.w_off)[rd * k + j] =
                        etp__ep_slot_weight(sd_s + t * k, a.weights + (int64_t)t * k, j, d);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) signal_all(n, 1);
    if (early) {
        if (!block_wait(n, 0, call_no, ETP__EP_NVL_LL_DISPATCH, ETP__EP_NVL_WAIT_ARRIVAL, t0))
            return;
        clip(a, par, sd_s, pos_s, acc_s, rc_s, lead);
    }
    if (!block_wait(n, 1, etp__ep_nvl_mark(call_no, n.blocks), ETP__EP_NVL_LL_DISPATCH,
                    ETP__EP_NVL_WAIT_ARRIVAL, t0))
        return;

    /* 3. the layout and the expand */
    const int32_t *meta = reinterpret_cast<const int32_t *>(n.peers[me] + n.small_off);
    const int64_t nrecv = (int64_t)R * tm;
    const float *recv_w = a.carry ? reinterpret_cast<const float *>(n.peers[me] + a.w_off)
                                  : nullptr;
    const char *slab = n.peers[me] + n.tok_off;
    __shared__ int32_t kept_s[kFastL], off_s[kFastL + 1];
    const bool chunked = L <= kFastL;
    if (chunked) {
        layout_chunked(a, meta, rc_s, nrecv, slab, recv_w, rb, in_rb, vec != 0,
                       reinterpret_cast<uint16_t *>(turn_s), kept_s, off_s);
    } else {
        const int64_t gt = (int64_t)blockIdx.x * kThreads + threadIdx.x,
                      nt = (int64_t)n.blocks * kThreads;
        for (int64_t x = gt; x < nrecv * k; x += nt) a.recv_row[x] = -1;
        for (int64_t r = gt; r < a.rows_cap; r += nt) a.row_src[r] = -1;
        for (int64_t e = blockIdx.x; e < L; e += n.blocks) {
            int64_t running = 0;
            for (int64_t i0 = 0; i0 < nrecv; i0 += kThreads) {
                const int64_t i = i0 + threadIdx.x;
                const int flag = i < nrecv && slot_of(a, meta, rc_s, i, (int)e) >= 0;
                int total = 0;
                (void)block_excl_scan(flag, &total);
                running += total;
            }
            if (threadIdx.x == 0) a.counts[e] = (int32_t)running;
        }
        if (!block_barrier(n, call_no, 0, kBarriers, t0)) return;
        if (lead && threadIdx.x == 0) {
            for (int64_t e = 0; e < L; e++) a.counts[e] = __ldcg(a.counts + e);
            stat_layout(a.stats, etp__ep_layout_offsets(a.counts, a.offsets, L, a.alignment,
                                                         a.fixed_slots, a.rows_cap));
        }
        if (!block_barrier(n, call_no, 1, kBarriers, t0)) return;
        /* what other blocks wrote before a barrier is read past L1 (__ldcg) */
        for (int64_t e = blockIdx.x; e < L; e += n.blocks) {
            const int64_t kept = __ldcg(a.counts + e), base = __ldcg(a.offsets + e);
            int64_t running = 0;
            for (int64_t i0 = 0; i0 < nrecv && running < kept; i0 += kThreads) {
                const int64_t i = i0 + threadIdx.x;
                const int j = i < nrecv ? slot_of(a, meta, rc_s, i, (int)e) : -1;
                int total = 0;
                const int64_t q = running + block_excl_scan(j >= 0, &total);
                if (j >= 0 && q < kept) {
                    const int64_t row = base + q;
                    a.recv_row[i * k + j] = (int32_t)row;
                    a.row_src[row] = (int32_t)(i * k + j);
                }
                running += total;
            }
        }
        if (!block_barrier(n, call_no, 2, kBarriers, t0)) return;
        for (int64_t i = gt; i < nrecv; i += nt) {
            int32_t rr[kMaxTopk], out[kMaxTopk];
            for (int j = 0; j < k; j++) rr[j] = __ldcg(a.recv_row + i * k + j);
            etp__ep_sort_rows(rr, k, out);
            for (int j = 0; j < k; j++) a.tok_rows[i * k + j] = out[j];
        }
        /* the expand: each row of the layout from its received token row */
        for (int64_t r = gw; r < a.rows_cap; r += nw) {
            const int32_t src = __ldcg(a.row_src + r);
            char *o = static_cast<char *>(a.out) + r * in_rb;
            if (lane == 0 && a.out_w) a.out_w[r] = etp__ep_row_weight(recv_w, src);
            if (src < 0)
                zero_bytes(o, in_rb, vec != 0);
            else
                copy_fanout(o, 1u, slab + (int64_t)(src / k) * rb, 0, in_rb, vec != 0);
        }
    }
    /* the call is done when every block is; the last copies the counters
     * (all counted: each block fenced its counts before its arrival) and
     * releases this rank's slabs (every block has read what it needed) */
    __shared__ int last_s;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last_s = atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 1), 1ull) ==
                 (unsigned long long)(n.blocks - 1);
        __threadfence();
    }
    __syncthreads();
    if (!last_s) return;
    /* a thread each: a loop of dependent loads here is the call's last
     * microseconds (the counters are read past L1, volatile) */
    if (chunked)
        for (int e = threadIdx.x; e <= L; e += kThreads) {
            if (e < L) a.counts[e] = kept_s[e];
            a.offsets[e] = off_s[e];
        }
    if (a.mirror && threadIdx.x < ETP__EP_ST_COUNT)
        a.mirror[threadIdx.x] = *static_cast<volatile const int64_t *>(a.stats + threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        n.calls[1] = 0;
        n.calls[0] = call_no;
        signal_all(n, 2);
    }
}

bool aligned16(const void *p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

} // namespace

extern "C" cudaError_t etp__cuda_ll_dispatch(cudaStream_t s, const etp__ep_ll_args_t *a)
{
    if (a->nvl.t_max > kMaxTokens || a->k > kMaxTopk || a->nvl.ranks > kMaxRanks)
        return cudaErrorInvalidValue;
    const int64_t rb = a->hidden * etp__ep_esize(a->dtype);
    /* 16-byte rows and buffers: vector copies (else bytes) */
    const int vec = rb % 16 == 0 && (a->tokens == nullptr || aligned16(a->tokens)) &&
                    aligned16(a->out);
    etp__ep_ll_args_t copy = *a;
    int v = vec;
    void *args[] = {&copy, &v};
    return cudaLaunchKernel(reinterpret_cast<const void *>(ll_dispatch_kernel),
                            dim3((unsigned)a->nvl.blocks), dim3(kThreads), args, 0, s);
}
