/*
 * Device helpers the EP kernels share (ep.cu, nvl.cu, ll.cu): the report's
 * counters (src/backend/ep_args.h: ETP__EP_ST_*), a token's routing in
 * registers and a block-wide scan.
 */
#ifndef ETP__EP_DEV_CUH
#define ETP__EP_DEV_CUH

#include <stdint.h>

#include "backend/ep_args.h"
#include "ep/ep_rules.h"

namespace etp_ep_dev
{

static __device__ __forceinline__ unsigned long long *u64(int64_t *p)
{
    return reinterpret_cast<unsigned long long *>(p);
}

static __device__ __forceinline__ void stat_add(int64_t *st, int which, int64_t v)
{
    if (v) atomicAdd(u64(st + which), (unsigned long long)v);
}

static __device__ __forceinline__ void stat_flag(int64_t *st, unsigned f)
{
    atomicOr(u64(st + ETP__EP_ST_FLAGS), (unsigned long long)f);
}

static __device__ __forceinline__ void stat_max(int64_t *st, int which, int64_t v)
{
    atomicMax(u64(st + which), (unsigned long long)v);
}

/* A token's slot rules broke: bad indices and repeated experts counted and
 * flagged (etp__ep_route_token's counts). */
static __device__ __forceinline__ void stat_route(int64_t *st, int bad, int dup)
{
    if (bad) {
        stat_add(st, ETP__EP_ST_BAD_INDEX, bad);
        stat_flag(st, ETP__EP_F_BAD_INDEX);
    }
    if (dup) {
        stat_add(st, ETP__EP_ST_DUPLICATE, dup);
        stat_flag(st, ETP__EP_F_DUPLICATE);
    }
}

/* What a layout needed (etp__ep_layout_offsets) into the report. */
static __device__ __forceinline__ void stat_layout(int64_t *st, etp__ep_layout_need_t need)
{
    stat_max(st, ETP__EP_ST_ROWS_NEEDED, need.needed);
    if (need.dropped) {
        stat_add(st, ETP__EP_ST_ROWS_DROPPED, need.dropped);
        stat_flag(st, ETP__EP_F_ROWS_FULL);
    }
}

/* A token's K slots routed (etp__ep_route_token) with its indices and
 * destinations in registers: K is known, so the rule's loops unroll. Given
 * global indices or shared destinations, the rule's duplicate check would
 * reload earlier slots, a chain of round trips per slot. */
template <int K>
static __device__ __forceinline__ void route_regs(const int64_t *topk, int64_t E, int64_t L,
                                                  int32_t (&sd)[K], int *bad, int *dup)
{
    int64_t idx[K];
#pragma unroll
    for (int j = 0; j < K; j++) idx[j] = topk[j];
    etp__ep_route_token(idx, K, E, L, sd, bad, dup);
}

/* Exclusive prefix sum over the block (blockDim.x a multiple of 32, at most
 * 1024); *total gets the block's sum. All threads must call it. */
static __device__ int block_excl_scan(int v, int *total)
{
    __shared__ int warp_sums[32];
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(full, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[w] = x;
    __syncthreads();
    if (w == 0) {
        int sx = lane < nw ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(full, sx, o);
            if (lane >= o) sx += y;
        }
        if (lane < nw) warp_sums[lane] = sx;
    }
    __syncthreads();
    const int before = w > 0 ? warp_sums[w - 1] : 0;
    *total = warp_sums[nw - 1];
    __syncthreads(); /* warp_sums is reused by the next call */
    return before + x - v;
}

/* The layout's offsets and kept counts (etp__ep_layout_offsets) of the L
 * experts whose row counts are in cnt_s, by the whole block (all threads
 * call it; cnt_s and off_s in shared memory, read after it returns). When
 * every PACKED expert's padded block fits, the rule keeps every row and
 * its offsets are the exclusive sum of the padded counts: one block scan
 * instead of the rule's serial walk, which costs thread 0 a few
 * microseconds of dependent steps. Otherwise (a drop, FIXED_SLOTS, more
 * experts than threads) thread 0 runs the rule. */
static __device__ etp__ep_layout_need_t block_layout_offsets(int32_t *cnt_s, int32_t *off_s, int L,
                                                             int64_t align, int64_t fixed_slots,
                                                             int64_t rows_cap)
{
    __shared__ etp__ep_layout_need_t need_s;
    const int e = threadIdx.x;
    /* the sum of L padded counts, each at most rows_cap, stays in an int */
    if (fixed_slots == 0 && L <= (int)blockDim.x && (int64_t)L * (rows_cap + 1) <= 0x7fffffff) {
        const int64_t n = e < L ? cnt_s[e] : 0, padded = etp__ep_round_up(n, align);
        int total = 0;
        const int off = block_excl_scan(padded <= rows_cap ? (int)padded : (int)rows_cap + 1, &total);
        if (total <= rows_cap) {
            if (e < L) off_s[e] = off;
            if (e == 0) off_s[L] = total;
            __syncthreads();
            etp__ep_layout_need_t need;
            need.needed = total;
            need.dropped = 0;
            return need;
        }
    }
    if (threadIdx.x == 0)
        need_s = etp__ep_layout_offsets(cnt_s, off_s, L, align, fixed_slots, rows_cap);
    __syncthreads();
    return need_s;
}

} // namespace etp_ep_dev

#endif
