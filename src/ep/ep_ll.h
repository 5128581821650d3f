/*
 * Low-latency EP layers (src/ep/ep_ll.c; etp/ep.h's etp_ep_ll_*): what the
 * ep module's core (ep.c) and the low-latency code share. ep.c owns the
 * group and layer objects and their checks; it hands ep_ll.c the view of
 * them below, and ep_ll.c owns a low-latency layer's halves and window.
 */
#ifndef ETP__EP_LL_H
#define ETP__EP_LL_H

#include "backend/kernels_ep.h"
#include "comm/comm_internal.h"
#include "etp/ep.h"

typedef struct etp__ep_ll etp__ep_ll_t;

/* A group and layer as the low-latency code sees them (filled by ep.c). */
typedef struct {
    etp_ep_group_t *ep;
    etp_ep_layer_t *ly;
    etp_context_t *ctx;
    etp_group_t *group;
    etp__be_t *be;
    const etp__ep_kernels_t *kt;
    const etp_ep_group_config_t *cfg;
    const char *name, *layer_name;
    int R, rank;
    int nvl, fused; /* NVLINK; NVLINK through peer stores (CUDA) */
    int mx;
    etp_dtype_t dt;
    int wire; /* ETP__EP_F32 / ETP__EP_BF16 */
    int64_t L, tok_cap;
    void *send_tok, *recv_tok, *send_small, *recv_small; /* the group's buffers (host path) */
    int k, weighted;
    int64_t align, slots, rows;
    int64_t *stats;
    volatile int64_t *host_stats;
    etp_event_t *prep_ev;
    int *prepared_once;
} etp__ep_ll_env_t;

/* Make a layer's low-latency state: its halves (ETP_MEM_EP_BUFFERS) and,
 * on CUDA, its window (collective: every rank makes the same layers in the
 * same order). t_max: the layer's max_tokens_per_rank (0: the group's).
 * Errors: ETP_ERR_UNSUPPORTED (not an NVLINK group, MXFP8, top-k or group
 * past the kernels' bounds), ETP_ERR_INVALID_ARGUMENT (t_max out of range),
 * ETP_ERR_OUT_OF_MEMORY. */
etp_status_t etp__ep_ll_create(const etp__ep_ll_env_t *env, int64_t t_max, etp__ep_ll_t **out);
/* Free it (waits for the device like a free); NULL is a no-op. */
void etp__ep_ll_destroy(etp__ep_ll_t *ll);
/* The layout arrays of the last dispatch's half (half 0 before any). */
void etp__ep_ll_layout(const etp__ep_ll_t *ll, const int32_t **counts, const int32_t **offsets);

/* ep.c's side: the checks every EP call of a layer makes (a stream of the
 * group's context, not inside the trace callback, no batch, the capture
 * noted), the join with the group's previous call, and the view; `ll`
 * gets the layer's low-latency state (INVALID_ARGUMENT naming fn when the
 * layer is not low-latency). */
etp_status_t etp__ep_ll_begin(etp_ep_layer_t *ly, etp_stream_t *s, const char *fn,
                              etp__ep_ll_env_t *env, etp__ep_ll_t **ll);
/* The end of a call: the group's last stream and event. */
etp_status_t etp__ep_ll_end(etp_ep_layer_t *ly, etp_stream_t *s);
/* The etp group of a layer's EP group (for the refusal guard). */
etp_group_t *etp__ep_ll_group_of(const etp_ep_layer_t *ly);
/* The group's trace callback at `point` (nothing when none is set). */
void etp__ep_ll_trace(etp_ep_layer_t *ly, etp_trace_point_t point, etp_stream_t *s);

#endif /* ETP__EP_LL_H */
