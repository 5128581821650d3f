/* The ep module's kernels: one table, implemented by each backend in
 * host/host_ep.c and cuda/cuda_ep.c (kernels/ep/), both applying the rules
 * of src/ep/ep_rules.h. Owned by the ep module. Every kernel enqueues on a
 * stream; the argument structs (ep_args.h, which defines what each kernel
 * computes) are copied at launch, the buffers they point to are read and
 * written when the kernel runs. */
#ifndef ETP__KERNELS_EP_H
#define ETP__KERNELS_EP_H

#include "backend.h"
#include "ep_args.h"

struct etp__ep_kernels {
    etp_status_t (*route)(etp__be_t *be, etp__bstream_t *s, const etp__ep_route_args_t *a);
    etp_status_t (*clip)(etp__be_t *be, etp__bstream_t *s, const etp__ep_clip_args_t *a);
    etp_status_t (*layout)(etp__be_t *be, etp__bstream_t *s, const etp__ep_layout_args_t *a);
    etp_status_t (*pack)(etp__be_t *be, etp__bstream_t *s, const etp__ep_pack_args_t *a);
    etp_status_t (*expand)(etp__be_t *be, etp__bstream_t *s, const etp__ep_expand_args_t *a);
    etp_status_t (*presum)(etp__be_t *be, etp__bstream_t *s, const etp__ep_presum_args_t *a);
    etp_status_t (*reduce)(etp__be_t *be, etp__bstream_t *s, const etp__ep_reduce_args_t *a);
    etp_status_t (*wgrad)(etp__be_t *be, etp__bstream_t *s, const etp__ep_wgrad_args_t *a);
    etp_status_t (*wscatter)(etp__be_t *be, etp__bstream_t *s, const etp__ep_wscatter_args_t *a);
    /* The NVLink transport's peer stores; NULL on a backend without them
     * (the host backend runs NVLINK with all-to-alls of its slabs).
     * nvl_open: collective over c (every rank calls it, with the same
     * sizes): a window of `bytes` on every rank whose peers' copies this
     * rank's kernels can store into, plus the device counters and the fault
     * words; fills nvl's peers, calls, fault, timeout_ns, blocks (num_sms;
     * 0: the default, ETP__EP_NVL_HALF_SMS: half the device's SMs; the
     * group's smallest), me and ranks, and *local (this rank's window).
     * local_ok = 0 says this rank cannot take part (a user allocator).
     * ETP_ERR_UNSUPPORTED on every rank alike, with the reason in why,
     * when a rank cannot (no peer access, NCCL too old, registration
     * refused); the backend's state is then as before. `name` (the EP
     * group's) is kept for the fault's message. */
    etp_status_t (*nvl_open)(etp__be_t *be, etp__bcomm_t *c, const char *name, size_t bytes,
                             int num_sms, int local_ok, etp__ep_nvl_t *nvl, void **local,
                             void **handle, char *why, size_t why_bytes);
    /* Collective like nvl_open; waits for the window's enqueued work. */
    void (*nvl_close)(etp__be_t *be, etp__bcomm_t *c, void *handle);
    etp_status_t (*nvl_t2e)(etp__be_t *be, etp__bstream_t *s, const etp__ep_t2e_args_t *a,
                            int phase);
    etp_status_t (*nvl_e2t)(etp__be_t *be, etp__bstream_t *s, const etp__ep_e2t_args_t *a,
                            int phase);
    etp_status_t (*nvl_prepare)(etp__be_t *be, etp__bstream_t *s, const etp__ep_xchg_args_t *a);
    /* A low-latency dispatch in one kernel (ep_args.h); NULL on a backend
     * without peer stores (the host backend runs it with its kernels and
     * all-to-alls). Low-latency combine is nvl_e2t on the layer's window. */
    etp_status_t (*ll_dispatch)(etp__be_t *be, etp__bstream_t *s, const etp__ep_ll_args_t *a);
    /* Host memory the device can write, with an async copy or from a
     * kernel at the same address, and the host can read without a stream
     * operation (pinned and mapped on CUDA; malloc on host). */
    etp_status_t (*pinned_alloc)(etp__be_t *be, size_t bytes, void **ptr);
    void (*pinned_free)(etp__be_t *be, void *ptr);
};

#endif
