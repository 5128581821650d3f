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
 * 2. once every rank's counts are here, the receive-capacity clip
 *    (EXACT's rule) is known everywhere; a warp per (token, destination)
 *    stores the token's row, metadata and weights into the destination's
 *    slab, and each block signals;
 * 3. once every block of every rank has stored, the blocks lay out the
 *    received rows (per local expert counts, offsets, rows in (source rank,
 *    token) order; a rank-local block barrier between the steps) and expand
 *    them into the half's rows.
 *
 * Every rule is ep_rules.h's (the same the host backend runs), every wait
 * is bounded as in the NVLINK kernels (nvl_sync.cuh), and the call is
 * counted on the device, so graphs replay. Compiled with --fmad=false.
 */
#include <stdint.h>

#include "ep/ep_rules.h"
#include "ll_kernels.h"
#include "ep_dev.cuh"
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
/* local experts whose offsets are computed in shared memory */
constexpr int kFastL = 64;
/* block barriers a call passes (counts, offsets, rows) */
constexpr int kBarriers = 3;

/* Every block of this rank reached barrier b of call call_no (blocks of a
 * rank are resident together, as the NVLINK kernels need): bounded like
 * the cross-rank waits. */
__device__ bool block_barrier(const etp__ep_nvl_t &n, uint64_t call_no, int b, int64_t t0)
{
    __shared__ int ok;
    __syncthreads();
    if (threadIdx.x == 0) {
        ok = 1;
        __threadfence();
        atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 2), 1ull);
        const uint64_t want = ((call_no - 1) * kBarriers + (uint64_t)b + 1) * (uint64_t)n.blocks;
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

/* A warp copies rb bytes: 16 bytes a lane, 8 loads in flight (a row is
 * latency-bound, not bandwidth-bound, at a few rows a warp), else bytes. */
__device__ void copy_bytes(char *dst, const char *src, int64_t rb, bool vec)
{
    const int lane = threadIdx.x & 31;
    if (vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
        uint4 *d4 = reinterpret_cast<uint4 *>(dst);
        const int64_t nc = rb / 16;
        int64_t c = lane;
        for (; c + 7 * 32 < nc; c += 8 * 32) {
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = s4[c + u * 32];
#pragma unroll
            for (int u = 0; u < 8; u++) d4[c + u * 32] = v[u];
        }
        for (; c < nc; c += 32) d4[c] = s4[c];
    } else {
        for (int64_t b = lane; b < rb; b += 32) dst[b] = src[b];
    }
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

__global__ void __launch_bounds__(kThreads) ll_dispatch_kernel(etp__ep_ll_args_t a, int vec)
{
    const etp__ep_nvl_t &n = a.nvl;
    __shared__ uint32_t mask_s[kMaxTokens];
    __shared__ int16_t pos_s[kMaxTokens * kMaxRanks];
    __shared__ int32_t sd_s[kMaxTokens * kMaxTopk];
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
        int32_t *sd = sd_s + t * k;
        uint32_t m = 0;
        if (t < T) {
            int bad, dup;
            etp__ep_route_token(a.topk_idx + t * k, k, a.num_experts, L, sd, &bad, &dup);
            for (int j = 0; j < k; j++)
                if (sd[j] >= 0) m |= 1u << sd[j];
            if (lead) stat_route(a.stats, bad, dup);
        } else {
            for (int j = 0; j < k; j++) sd[j] = -1;
        }
        mask_s[t] = m;
        if (lead)
            for (int j = 0; j < k; j++) a.slot_dest[t * k + j] = sd[j];
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
    if (!block_wait(n, 0, call_no, ETP__EP_NVL_LL_DISPATCH, ETP__EP_NVL_WAIT_ARRIVAL, t0)) return;

    /* 2. the clip and the stores */
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
    const int64_t rb = n.tok_row_bytes;
    const int64_t in_rb = a.hidden * etp__ep_esize(a.dtype);
    const int64_t gw = (int64_t)blockIdx.x * kWarps + warp, nw = (int64_t)n.blocks * kWarps;
    /* a warp per (token, destination): a token's copies go out in parallel */
    for (int64_t x = gw; x < T * R; x += nw) {
        const int64_t t = x / R;
        const int d = (int)(x % R);
        const int p = pos_s[x];
        if (p < 0 || p >= acc_s[d]) continue;
        const int64_t row = etp__ep_nvl_row(me, tm, p);
        copy_bytes(n.peers[d] + n.tok_off + row * rb,
                   static_cast<const char *>(a.tokens) + t * in_rb, in_rb, vec != 0);
        if (lane == 0)
            etp__ep_meta_row(a.topk_idx + t * k, sd_s + t * k, k, d, L,
                             reinterpret_cast<int32_t *>(n.peers[d] + n.small_off) + row * k);
        if (a.carry)
            for (int j = lane; j < k; j += 32)
                reinterpret_cast<float *>(n.peers[d] + a.w_off)[row * k + j] =
                    etp__ep_slot_weight(sd_s + t * k, a.weights + t * k, j, d);
    }
    __syncthreads();
    if (threadIdx.x == 0) signal_all(n, 1);
    if (!block_wait(n, 1, etp__ep_nvl_mark(call_no, n.blocks), ETP__EP_NVL_LL_DISPATCH,
                    ETP__EP_NVL_WAIT_ARRIVAL, t0))
        return;

    /* 3. the layout (layout_count / offsets / assign / sort of ep.cu) */
    const int32_t *meta = reinterpret_cast<const int32_t *>(n.peers[me] + n.small_off);
    const int64_t nrecv = (int64_t)R * tm;
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
    if (!block_barrier(n, call_no, 0, t0)) return;
    if (lead) {
        /* in shared memory: the rule's stores and reloads of global
         * counts would chain round trips to L2 */
        __shared__ int32_t lc_s[kFastL], lo_s[kFastL + 1];
        if (L <= kFastL) {
            for (int e = threadIdx.x; e < L; e += kThreads) lc_s[e] = __ldcg(a.counts + e);
            __syncthreads();
            if (threadIdx.x == 0)
                stat_layout(a.stats, etp__ep_layout_offsets(lc_s, lo_s, L, a.alignment,
                                                             a.fixed_slots, a.rows_cap));
            __syncthreads();
            for (int e = threadIdx.x; e <= L; e += kThreads) {
                a.offsets[e] = lo_s[e];
                if (e < L) a.counts[e] = lc_s[e];
            }
        } else if (threadIdx.x == 0) {
            for (int64_t e = 0; e < L; e++) a.counts[e] = __ldcg(a.counts + e);
            stat_layout(a.stats, etp__ep_layout_offsets(a.counts, a.offsets, L, a.alignment,
                                                         a.fixed_slots, a.rows_cap));
        }
    }
    if (!block_barrier(n, call_no, 1, t0)) return;
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
    if (!block_barrier(n, call_no, 2, t0)) return;
    for (int64_t i = gt; i < nrecv; i += nt) {
        int32_t rr[kMaxTopk], out[kMaxTopk];
        for (int j = 0; j < k; j++) rr[j] = __ldcg(a.recv_row + i * k + j);
        etp__ep_sort_rows(rr, k, out);
        for (int j = 0; j < k; j++) a.tok_rows[i * k + j] = out[j];
    }
    /* the expand: each row of the layout from its received token row */
    const char *slab = n.peers[me] + n.tok_off;
    const float *recv_w = a.carry ? reinterpret_cast<const float *>(n.peers[me] + a.w_off)
                                  : nullptr;
    for (int64_t r = gw; r < a.rows_cap; r += nw) {
        const int32_t src = __ldcg(a.row_src + r);
        char *o = static_cast<char *>(a.out) + r * in_rb;
        if (lane == 0 && a.out_w) a.out_w[r] = etp__ep_row_weight(recv_w, src);
        if (src < 0)
            zero_bytes(o, in_rb, vec != 0);
        else
            copy_bytes(o, slab + (int64_t)(src / k) * rb, in_rb, vec != 0);
    }
    /* the call is done when every block is; the last copies the counters
     * (all counted: each block fenced its counts before its arrival) */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 1), 1ull) ==
            (unsigned long long)(n.blocks - 1)) {
            __threadfence();
            if (a.mirror)
                for (int x = 0; x < ETP__EP_ST_COUNT; x++)
                    a.mirror[x] = *static_cast<volatile const int64_t *>(a.stats + x);
            n.calls[1] = 0;
            n.calls[0] = call_no;
        }
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
