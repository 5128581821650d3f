/*
 * The first step of the layout with few local experts (ep.cu's
 * layout_chunks), as a device function: the NVLink exchange kernel
 * (nvl.cu) runs it too, on the routing rows in its window, so that
 * prepare's layout is one kernel after it. The low-latency dispatch
 * (ll.cu) reads its rows' experts the same way.
 */
#ifndef ETP__LAYOUT_DEV_CUH
#define ETP__LAYOUT_DEV_CUH

#include <stdint.h>

#include "backend/ep_args.h"
#include "ep/ep_rules.h"

namespace etp_ep_layout
{

/* The local experts (fewer than 64) that valid received row i selects, as
 * bits; meta: the received routing rows of k slots. */
static __device__ __forceinline__ uint64_t expert_bits(const int32_t *meta, int k, int64_t L,
                                                       int64_t i)
{
    uint64_t m = 0;
    for (int j = 0; j < k; j++) {
        const int32_t e = etp__ep_recv_expert(meta, k, L, i, j);
        if (e >= 0) m |= 1ull << e;
    }
    return m;
}

/* The local experts received row i selects, as bits (0: not a valid row);
 * base, cnt: recv_base, recv_cnt. */
static __device__ __forceinline__ uint64_t row_experts(const etp__ep_layout_args_t &a, int64_t i,
                                                       const int32_t *base, const int32_t *cnt)
{
    if (i >= a.recv_rows || !etp__ep_recv_valid(base, cnt, a.ranks, a.exact, a.slab, i)) return 0;
    return expert_bits(a.recv_meta, a.k, a.local_experts, i);
}

/* Over the whole grid (every thread of every block calls it): the
 * received counts and bases (from a.C; block 0 writes them), row_src
 * emptied, and per chunk of ETP__EP_LAYOUT_CHUNK received rows (a warp
 * each) and local expert the rows that select it, into scratch
 * [L][chunks]. */
static __device__ void count_chunks(const etp__ep_layout_args_t &a)
{
    __shared__ int32_t cnt[ETP__EP_LAYOUT_FEW_R], base[ETP__EP_LAYOUT_FEW_R];
    const unsigned full = 0xffffffffu;
    if (threadIdx.x == 0) {
        for (int s = 0; s < a.ranks; s++)
            cnt[s] = (int32_t)etp__ep_accepted(a.C, a.ranks, a.tok_cap, s, a.me);
        etp__ep_block_bases(cnt, a.ranks, a.exact, a.slab, base);
        if (blockIdx.x == 0)
            for (int s = 0; s < a.ranks; s++) {
                a.recv_cnt[s] = cnt[s];
                a.recv_base[s] = base[s];
            }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, L = (int)a.local_experts;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nth = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = tid; r < a.rows_cap; r += nth) a.row_src[r] = -1;
    const int64_t nch = (a.recv_rows + ETP__EP_LAYOUT_CHUNK - 1) / ETP__EP_LAYOUT_CHUNK;
    for (int64_t c = tid >> 5; c < nch; c += nth >> 5) {
        const uint64_t m = row_experts(a, c * ETP__EP_LAYOUT_CHUNK + lane, base, cnt);
        int lo = 0, hi = 0;
        for (int e = 0; e < L; e++) {
            const int n = __popc(__ballot_sync(full, (unsigned)(m >> e) & 1u));
            if (e == lane) lo = n;
            if (e == lane + 32) hi = n;
        }
        if (lane < L) a.scratch[(int64_t)lane * nch + c] = lo;
        if (lane + 32 < L) a.scratch[(int64_t)(lane + 32) * nch + c] = hi;
    }
}

} // namespace etp_ep_layout

#endif
