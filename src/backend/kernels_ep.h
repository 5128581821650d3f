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
    /* Host memory the device can write with an async copy and the host can
     * read without a stream operation (pinned on CUDA; malloc on host). */
    etp_status_t (*pinned_alloc)(etp__be_t *be, size_t bytes, void **ptr);
    void (*pinned_free)(etp__be_t *be, void *ptr);
};

#endif
