/*
 * The NVLink transport's device-side synchronization through the flag
 * words of its windows (src/backend/ep_args.h: etp__ep_nvl_t), shared by
 * the NVLINK kernels (nvl.cu) and the low-latency kernels (ll.cu): acquire
 * loads, bounded waits that record a fault in host-mapped memory,
 * signals into every rank's window, and the call counting of a kernel's
 * blocks on the device (so that a graph replays correctly).
 */
#ifndef ETP__NVL_SYNC_CUH
#define ETP__NVL_SYNC_CUH

#include <stdint.h>

#include "ep/ep_rules.h"

namespace etp_nvl_sync
{

static __device__ __forceinline__ uint64_t load_acquire(const uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ uint32_t load_acquire32(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ int64_t now_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (int64_t)t;
}

static __device__ __forceinline__ uint64_t *sig(const etp__ep_nvl_t &n, int rank)
{
    return reinterpret_cast<uint64_t *>(n.peers[rank] + n.sig_off);
}

/* A wait that gave up: the first (per window) records whom it waited for
 * (peer), in which call and for what; word 0, which the host polls, is
 * written last. */
static __device__ void record_fault(const etp__ep_nvl_t &n, int peer, int call, int what)
{
    unsigned long long *claim = reinterpret_cast<unsigned long long *>(n.fault + 3);
    if (atomicCAS(claim, 0ull, 1ull) == 0ull) {
        volatile int64_t *vf = n.fault;
        vf[1] = call;
        vf[2] = what;
        __threadfence_system();
        vf[0] = peer + 1;
        __threadfence_system();
    }
}

/* Wait until *p >= v, at most the timeout; on giving up, record (once per
 * rank) who was waited for. Returns 0 when it gave up. */
static __device__ bool wait_for(const etp__ep_nvl_t &n, const uint64_t *p, uint64_t v, int64_t t0,
                                int peer, int call, int what)
{
    while (load_acquire(p) < v) {
        if (n.timeout_ns > 0 && now_ns() - t0 > n.timeout_ns) {
            record_fault(n, peer, call, what);
            return false;
        }
        __nanosleep(64);
    }
    return true;
}

/* Every rank's flag word `which` at this rank's index, in each rank's
 * window, gets one more (the NVLINK kernels' 0: arrived, 1: released; the
 * low-latency dispatch's window has a third, ep_args.h). */
static __device__ __forceinline__ void signal_all(const etp__ep_nvl_t &n, int which)
{
    __threadfence_system();
    for (int d = 0; d < n.ranks; d++)
        atomicAdd_system(reinterpret_cast<unsigned long long *>(sig(n, d) + which * n.ranks + n.me),
                         1ull);
}

/* Word `slot` of the uint32 flags at byte `off` of every rank's window
 * set to `mark`, after what this thread stored (and, past a block barrier,
 * its block): a flag a waiter polls with load_acquire32 for a value, where
 * signal_all's counters count arrivals. */
static __device__ __forceinline__ void flag_all(const etp__ep_nvl_t &n, size_t off, int64_t slot,
                                                uint32_t mark)
{
    __threadfence_system();
    for (int d = 0; d < n.ranks; d++) {
        uint32_t *f = reinterpret_cast<uint32_t *>(n.peers[d] + off) + slot;
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(f), "r"(mark) : "memory");
    }
}

/* Phase boundaries of a block: threads r < R wait on this rank's word
 * `which` for rank r; ok becomes 0 for the block when any gave up. */
static __device__ bool block_wait(const etp__ep_nvl_t &n, int which, uint64_t v, int call, int what,
                                  int64_t t0)
{
    __shared__ int ok;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads();
    if ((int)threadIdx.x < n.ranks) {
        const uint64_t *w = sig(n, n.me) + which * n.ranks + threadIdx.x;
        if (!wait_for(n, w, v, t0, (int)threadIdx.x, call, what)) ok = 0;
    }
    __syncthreads();
    return ok != 0;
}

/* The call's start: its number (counted on the device), the clock its
 * waits are bounded from, and the wait until every peer has released what
 * this rank stored in the previous call. false: gave up (recorded). */
static __device__ bool call_begin(const etp__ep_nvl_t &n, int call, uint64_t *call_no, int64_t *t0)
{
    *call_no = n.calls[0] + 1;
    *t0 = now_ns();
    return block_wait(n, 1, etp__ep_nvl_mark(*call_no - 1, n.blocks), call,
                      ETP__EP_NVL_WAIT_RELEASE, *t0);
}

/* The call's end: this block released what it read (unless `release` is
 * false: a kernel whose peers need no release); the last block of the rank
 * counts the call. */
static __device__ void block_end(const etp__ep_nvl_t &n, uint64_t call_no, bool release = true)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        if (release) signal_all(n, 1);
        if (atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 1), 1ull) ==
            (unsigned long long)(n.blocks - 1)) {
            n.calls[1] = 0;
            n.calls[0] = call_no;
        }
    }
}

/* The end of a call whose reading kernel has gridDim.x blocks (not
 * n.blocks): the last of them to finish releases for all, by n.blocks (the
 * flags count n.blocks a rank), and counts the call. */
static __device__ void wide_end(const etp__ep_nvl_t &n, uint64_t call_no)
{
    __syncthreads();
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(reinterpret_cast<unsigned long long *>(n.calls + 1), 1ull) !=
        (unsigned long long)(gridDim.x - 1))
        return;
    __threadfence_system();
    for (int d = 0; d < n.ranks; d++)
        atomicAdd_system(reinterpret_cast<unsigned long long *>(sig(n, d) + n.ranks + n.me),
                         (unsigned long long)n.blocks);
    n.calls[1] = 0;
    n.calls[0] = call_no;
}

/* The start of a call's reading kernel: the call's number (not counted
 * yet: its sending kernel ran before), and the wait until every block of
 * every rank stored here. false: gave up (recorded). */
static __device__ bool wide_begin(const etp__ep_nvl_t &n, int call, uint64_t *call_no)
{
    *call_no = n.calls[0] + 1;
    return block_wait(n, 0, etp__ep_nvl_mark(*call_no, n.blocks), call, ETP__EP_NVL_WAIT_ARRIVAL,
                      now_ns());
}

} // namespace etp_nvl_sync

#endif
