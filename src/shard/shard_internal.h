/* Internal state of parameters and chains (src/shard). */
#ifndef ETP__SHARD_INTERNAL_H
#define ETP__SHARD_INTERNAL_H

#include "../backend/kernels_shard.h"
#include "../comm/comm_internal.h"
#include "etp/param.h"
#include "etp/quant.h"

enum { ETP__TICKET_IDLE = 0, ETP__TICKET_ISSUED, ETP__TICKET_HELD, ETP__TICKET_RELEASED };
enum { ETP__CHAIN_BUILDING = 0, ETP__CHAIN_RECORDING, ETP__CHAIN_FINALIZED };

/* Ordering edges, each removable by tests (etp__chain_test_skip_edges) to
 * prove the shuffle-mode tests notice. */
enum {
    ETP__EDGE_SHARD_WRITER = 1u << 0, /* AG stream waits for mark_updated's stream */
    ETP__EDGE_SLOT_RELEASE = 1u << 1, /* AG stream waits for the slot's previous reader */
    ETP__EDGE_GATHER_READY = 1u << 2, /* the caller's stream waits for the gather */
    ETP__EDGE_WGRAD_WRITER = 1u << 3, /* RS stream waits for the wgrad's writer */
    ETP__EDGE_RING_REUSE = 1u << 4,   /* a ring entry's writer waits for its last reduction */
    ETP__EDGE_GRADS_JOIN = 1u << 5,   /* wait_grads joins the RS stream */
    ETP__EDGE_COPY_HANDOFF = 1u << 6  /* AG stream waits for the own shard's copy on the caller's stream */
};

struct etp_param {
    etp_context_t *ctx;
    etp_group_t *group;
    char name[64];
    int group_rank, group_size;
    int64_t experts, rows, cols, padded_rows, shard_rows, row_begin, valid_rows;
    etp_dtype_t dtype, wgrad_dtype;
    int alignment, has_master;
    etp_param_quant_t quant;
    void *shard;
    float *main_grad, *master;
    etp_event_t *updated;
    int updated_recorded;
    int graph_refs; /* live graphs that captured a load or mark_updated of it (they write its
                       shard and master, record its event): its destroy refuses */
    etp_chain_t *chain;
    int ticket[2];   /* per pass, -1 when not planned */
    int wgrad_entry; /* ring entry handed out and not yet reduced, or -1 */
    int micro;       /* reductions this step */
    int zero_pending; /* defer_zero_grad: zeroed by etp_zero_grad, not yet written */
    etp_grad_ready_fn_t cb;
    void *cb_user;
    /* quantized modes (qgather.c) */
    etp_quantizer_t *qz;
    int gather_dequant;
    int swizzle;                 /* gathered scales swizzled (qgather.c) */
    etp_quantizer_t *qz_dir[2];  /* swizzle: one-direction quantizers (rowwise, columnwise) */
    uint64_t version, q_version; /* bumped by mark_updated; the quantized shard's */
    etp_quant_sizes_t qs_shard, qs_full; /* per expert */
    uint8_t *q_store;  /* per expert: row data, row scales, column data, column scales */
    size_t q_expert_bytes;
    float *q_amax;     /* [experts]: the group's amax (NVFP4) */
    /* cache_gathered_scales (qgather.c): per direction (0 rowwise, 1
     * columnwise) the gathered full scales, row-major then swizzled, and
     * the amaxes (offsets into sc); which quantized shard version each
     * direction holds */
    int cache_scales;
    uint8_t *sc;
    size_t sc_scales[2], sc_swz[2], sc_amax[2]; /* per direction: each has its own readers */
    uint64_t sc_version[2];
};

typedef struct etp__ticket {
    etp_param_t *param;
    etp_pass_t pass;
    size_t bytes;
    int slot;
    int state;
    uint64_t version; /* the parameter's version its last issue gathered */
    int reused;       /* its last issue found the data in its slot already (no gather) */
} etp__ticket_t;

typedef struct etp__slot {
    void *ptr;
    size_t bytes;
    int tenant; /* ticket, or -1 */
    etp_event_t *ready, *released;
    int release_recorded;
    int window; /* ptr is a window (etp__mem_alloc_window): gathers go in place */
    /* whose whole weight the slot holds (an unquantized gather of it, at
     * its version then, in the chain's step then), or NULL */
    const etp_param_t *holds;
    uint64_t holds_version, holds_step;
} etp__slot_t;

struct etp_chain {
    int graph_refs; /* live graphs that captured its calls (they use its slots and ring) */
    etp_context_t *ctx;
    etp_group_t *group;
    char name[64];
    int depth, graphed, ag_role, rs_role, ring_n, num_micro;
    int prefetch_on_update;
    int defer_zero; /* defer_zero_grad */
    int whole_step; /* graph_whole_step: prefetches cross forward -> backward */
    size_t keep_bytes; /* keep_bytes: weights kept whole from forward to backward */
    int early_step; /* a step begun by mark_updated's prefetch, before its first gather */
    uint64_t step;  /* steps (or micro-batches) begun: a new one at each ticket gathered again */
    int reuses;     /* issues that found their data in the slot (for tests) */
    int state;
    etp_stream_t *ag, *rs;
    etp_event_t *scratch;
    etp_param_t **params;
    int nparams, cap_params;
    etp__ticket_t *tickets;
    int ntickets, cap_tickets;
    etp__slot_t *slots;
    int nslots;
    size_t lower_bound;
    /* wgrad ring and staging, sized for the largest parameter */
    void **ring;
    etp_param_t **ring_holder; /* the parameter an entry is handed out to, until its reduction */
    etp_event_t **ring_done;
    int *ring_done_recorded;
    int grads_joined; /* no reduction since the last etp_wait_grads (a graphed step's end) */
    int zero_on_join; /* recording: etp_zero_grad came before some parameters joined */
    int ring_next;
    size_t ring_bytes, rs_bytes;
    /* rs_stage receives the ranks' chunks of a wgrad (an all-to-all), which
     * one kernel sums in rank order into main_grad (grad.c) */
    void *rs_stage;
    size_t *a2a_counts, *a2a_displs; /* [group size]: the all-to-all's, in elements */
    double *stats;
    unsigned skip_edges;
};

/* The ticket planner (plan.c): slot[i] for each of n tickets of bytes[i],
 * such that tickets less than depth + 1 apart never share a slot, except
 * that ticket i may take the slot of ticket same[i] (an earlier ticket of
 * the same weight, whose data it reuses; same NULL or same[i] < 0: none)
 * while nothing was placed there since; slot sizes in slot_bytes
 * (caller-allocated, n entries). A ticket of 0 bytes needs no slot: its
 * slot is -1 (it keeps its place in the depth, which counts tickets, as
 * the prefetches do). Returns the number of
 * slots, or -1 out of host memory; *lower_bound is the largest sum over
 * depth + 1 consecutive tickets, each weight counted once. With keep_bytes,
 * pairs (same[k], k) keep the slot between them for k (plan.c says which). */
int etp__plan_tickets(const size_t *bytes, const int *same, int n, int depth, size_t keep_bytes,
                      int *slot, size_t *slot_bytes, size_t *lower_bound);

size_t etp__param_gather_bytes(const etp_param_t *p, etp_pass_t pass);
etp_status_t etp__chain_record_ticket(etp_chain_t *c, etp_param_t *p, etp_pass_t pass);
/* etp_zero_grad of one parameter of c (on c's RS stream, or deferred). */
etp_status_t etp__chain_zero_one(etp_chain_t *c, etp_param_t *p);
etp_status_t etp__chain_ensure_workspace(etp_chain_t *c);
/* defer_zero_grad: zero, on the RS stream, every main_grad still waiting
 * for its first reduction since etp_zero_grad. */
etp_status_t etp__chain_zero_pending(etp_chain_t *c);
/* etp_param_mark_updated's part in the chain: the prefetch on update. */
etp_status_t etp__chain_on_update(etp_param_t *p, etp_stream_t *s);

/* grouped.c: the per-expert collectives of a parameter as one batch;
 * strides in bytes, counts in elements per expert. */
etp_status_t etp__grouped_allgather(etp_group_t *g, int role, const void *src, size_t src_stride,
                                    void *dst, size_t dst_stride, size_t count, etp_dtype_t dtype,
                                    int64_t experts, etp_stream_t *s);
/* The same gather in place in dst (a window: etp__mem_alloc_window): this
 * rank's pieces copied to their places first (a copy engine on cuda), then
 * send = dst + rank * count per expert, which lets NCCL use the copy
 * engines. */
etp_status_t etp__grouped_allgather_inplace(etp_group_t *g, int role, const void *src,
                                            size_t src_stride, void *dst, size_t dst_stride,
                                            size_t count, etp_dtype_t dtype, int64_t experts,
                                            etp_stream_t *s);
/* The in-place gather with the own shard's copy on copy_stream, handed to
 * s by ev (copy_stream s: no hand-off). */
etp_status_t etp__slot_allgather_copy_on(etp_group_t *g, int role, const void *src, size_t src_stride,
                                         void *dst, size_t dst_stride, size_t count, etp_dtype_t dtype,
                                         int64_t experts, etp_stream_t *copy_stream, etp_event_t *ev,
                                         etp_stream_t *s);
/* One of the two, by whether dst is in a window. */
etp_status_t etp__slot_allgather(etp_group_t *g, int role, int window, const void *src,
                                 size_t src_stride, void *dst, size_t dst_stride, size_t count,
                                 etp_dtype_t dtype, int64_t experts, etp_stream_t *s);

/* qgather.c: quantized modes. */
etp_status_t etp__param_quant_init(etp_param_t *p);
void etp__param_quant_free(etp_param_t *p);
size_t etp__qgather_bytes(const etp_param_t *p, etp_pass_t pass);
/* Quantize the shard if it changed, then gather data and scales of `pass`
 * into slot, re-laying where shard layouts do not concatenate; on the
 * chain's AG stream. */
etp_status_t etp__qgather_issue(etp_chain_t *c, etp_param_t *p, etp_pass_t pass, void *slot,
                                int window);
void etp__qgather_view(const etp_param_t *p, etp_pass_t pass, void *slot, etp_weight_view_t *v);
/* 1 when p's gathers use its cached scales (cache_gathered_scales, an
 * ungraphed chain). */
int etp__qgather_cached(const etp_param_t *p);

/* Test-only: remove ordering edges (ETP__EDGE_*) from a chain. */
void etp__chain_test_skip_edges(etp_chain_t *c, unsigned edges);
/* Issues so far that found their weight whole in the slot (no gather). */
int etp__chain_test_reuses(const etp_chain_t *c);

#endif
