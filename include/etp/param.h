/*
 * etp/param.h - sharded parameters, prefetch chains, the gather cache and
 * weight-gradient reduction: extended tensor parallelism.
 *
 * A parameter is a weight [rows, cols] (or a grouped expert weight
 * [experts][rows, cols]) sharded along rows across an ETP group. Rows are
 * padded at the end to a multiple of group_size * alignment (each expert on
 * its own), so only the last rank or ranks hold padding; rank r holds padded
 * rows [r * shard_rows, (r + 1) * shard_rows). Each rank keeps its shard, an
 * FP32 main_grad shard of the same shape, and optionally an FP32 master shard.
 *
 * A chain is an ordered list of parameters in forward order; the backward
 * pass walks it in reverse. Finalizing a chain plans a fixed slot of the
 * gather cache for every (parameter, pass) - a ticket - so that no two
 * gathers alive at the same time share one: addresses are the same every
 * step (a CUDA graph can replay them) and no memory is allocated after
 * finalize.
 *
 * Usage per step (the contract the plan relies on): gather(p, pass) returns
 * the full weight, ordered on the caller's stream, and prefetches the next
 * `depth` tickets on the chain's all-gather stream; the caller releases each
 * gathered weight (on the stream that read it) before gathering the next
 * ticket. A prefetch that would overwrite a weight not yet released is an
 * error, never a silent overwrite. Prefetches never cross the end of the
 * step; a graphed chain's prefetches also never cross from forward to
 * backward, so forward and backward may be captured as separate graphs.
 * A gather whose slot still holds the weight (the slot's last gather was
 * of the same unquantized parameter, not marked updated since) gathers
 * nothing: the last forward weights at the turn to backward, the first of
 * the next micro-batch; a graphed chain only with graph_whole_step, within
 * a step.
 *
 * Ordering is by events only, both ways: the all-gather stream waits for the
 * shard's writer (etp_param_mark_updated) and for the release of a slot's
 * previous reader; the caller's stream waits for the gather. Gradients:
 * etp_wgrad_buffer hands out a buffer of a fixed ring, the caller writes the
 * weight gradient into it on its stream, etp_reduce_grad reduce-scatters it
 * on the chain's reduce-scatter stream and accumulates scale * result into
 * main_grad (padding stripped). etp_wait_grads joins that stream back.
 *
 * Collectives: every rank of the group makes the same calls that touch a
 * chain's communication, in the same order: etp_chain_finalize,
 * etp_chain_end_record and etp_chain_destroy (which register and free the
 * gather slots, possibly as windows of the group: they block the host),
 * etp_gather (a gather of a (parameter, pass), or its prefetches), etp_reduce_grad,
 * etp_chain_grad_stats, and etp_param_mark_updated / etp_param_load_* where
 * they issue a gather (prefetch_on_update) or for quantized parameters. None
 * of them may be called inside etp_batch_begin/end (ETP_ERR_INVALID_STATE).
 *
 * Thread safety: a parameter and a chain are used by one thread at a time,
 * the thread that uses their context.
 */
#ifndef ETP_PARAM_H
#define ETP_PARAM_H

#include "etp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etp_param etp_param_t;
typedef struct etp_chain etp_chain_t;

typedef enum etp_pass {
    ETP_PASS_FORWARD = 0,  /* rowwise data in quantized modes */
    ETP_PASS_BACKWARD = 1  /* columnwise data in quantized modes */
} etp_pass_t;

typedef enum etp_param_quant {
    ETP_PARAM_QUANT_NONE = 0,
    ETP_PARAM_QUANT_MXFP8 = 1, /* needs alignment a multiple of 32 */
    ETP_PARAM_QUANT_NVFP4 = 2  /* needs alignment a multiple of 16 */
} etp_param_quant_t;

typedef struct etp_param_config {
    size_t size;            /* sizeof(etp_param_config_t) */
    const char *name;       /* copied; used in messages */
    etp_group_t *group;     /* the ETP group the rows are sharded over */
    int64_t experts;        /* 0 or 1: one weight; > 1: a grouped expert weight */
    int64_t rows, cols;     /* per expert; both > 0 */
    etp_dtype_t dtype;      /* weights: ETP_DTYPE_BF16 or ETP_DTYPE_F32 */
    etp_dtype_t wgrad_dtype; /* -1: same as dtype; else BF16 or F32 */
    int upcast_wgrad;       /* accepted, no effect: the reduction sums BF16 wgrads in FP32
                             * (etp_reduce_grad); it once chose an FP32 reduce-scatter */
    int alignment;          /* rows pad to group_size * alignment; 0 or 1: group_size */
    int master;             /* 1: keep an FP32 master shard */
    etp_param_quant_t quant;
    /* Quantized modes: 1 makes gathers return the weight dequantized to
     * BF16 (for GPUs without block-scaled GEMMs, e.g. Hopper); the wire
     * still carries 4 or 8 bits. */
    int gather_dequantized;
    /* Quantized modes without gather_dequantized: 1 makes gathers return
     * the scales in cuBLASLt's swizzled order (128x4 tiles, what Blackwell's
     * block-scaled GEMMs read; docs/FORMATS.md), converted on the
     * all-gather stream after the gather; the wire and the cached shard keep
     * row-major scales. */
    int swizzle_scales;
    /* Quantized modes: 1 keeps the gathered scales of both directions (and
     * NVFP4's amaxes) in the parameter's own memory, gathered once per
     * weight version, at the first gather of each direction after
     * etp_param_mark_updated; the gathers in between move the data alone
     * (a collective fewer: on 2 H200s, a 256 MiB weight gathers MXFP8 at
     * 1.87-1.92x the BF16 gather instead of 1.68-1.71x, NVFP4 at 3.19-3.21x
     * instead of 2.63-2.72x; docs/PERF.md). Costs the full weight's scales, both directions, on
     * every rank: 1/16 (MXFP8) or 1/8 (NVFP4) of a byte per weight element,
     * twice that with swizzle_scales, against a shard's 1/group_size of
     * 2.06 or 1.13 bytes. Views then point at that memory, the same address
     * every step; it is rewritten only after the last release of the
     * direction's previous view (stream-ordered). Graphed chains do not use
     * it: a replayed gather cannot know whether the weight changed. */
    int cache_gathered_scales;
} etp_param_config_t;

#define ETP_PARAM_CONFIG_INIT \
    {sizeof(etp_param_config_t), NULL, NULL, 1, 0, 0, ETP_DTYPE_BF16, (etp_dtype_t)-1, 0, 0, 0, ETP_PARAM_QUANT_NONE, \
     0, 0, 0}

/* Create a parameter: allocates the shard, main_grad (zeroed) and master
 * shards through the context allocator. Not collective.
 * Errors: ETP_ERR_INVALID_ARGUMENT (shape <= 0, a dtype other than BF16/F32,
 * an alignment the quantization mode cannot use, no group),
 * ETP_ERR_OUT_OF_MEMORY. Quantized modes keep the quantized shard (both
 * directions) too, refreshed at the first gather after each
 * etp_param_mark_updated, and need cols a multiple of the block. */
ETP_API etp_status_t etp_param_create(etp_context_t *ctx, const etp_param_config_t *config,
                                      etp_param_t **param);
/* Errors: ETP_ERR_BUSY while the parameter is in a chain, or while a graph
 * that captured an etp_param_load_full/_shard or etp_param_mark_updated of
 * it lives (a replay writes its shard and records its event);
 * ETP_ERR_INVALID_STATE while a graph capture is in progress on the context
 * (nothing is destroyed either way). NULL is a no-op. */
ETP_API etp_status_t etp_param_destroy(etp_param_t *param);

typedef struct etp_param_info {
    size_t size;               /* sizeof(etp_param_info_t) */
    const char *name;
    int64_t experts, rows, cols;
    int64_t padded_rows;       /* per expert, a multiple of group_size * alignment */
    int64_t shard_rows;        /* padded_rows / group_size */
    int64_t shard_row_begin;   /* first (padded) row this rank holds */
    int64_t valid_shard_rows;  /* rows of this rank's shard that are not padding (may be 0) */
    etp_dtype_t dtype, wgrad_dtype;
    void *shard;               /* [experts][shard_rows][cols] dtype, device memory */
    float *main_grad;          /* [experts][shard_rows][cols] FP32; padding rows stay 0 */
    float *master;             /* same shape, FP32, or NULL */
} etp_param_info_t;

#define ETP_PARAM_INFO_INIT {sizeof(etp_param_info_t), NULL, 0, 0, 0, 0, 0, 0, 0, ETP_DTYPE_BF16, ETP_DTYPE_BF16, NULL, NULL, NULL}

ETP_API etp_status_t etp_param_info(const etp_param_t *param, etp_param_info_t *info);

/* Load this rank's shard, on `stream`, from the full tensor
 * [experts][rows][cols] (dtype of the parameter, host or device memory),
 * or from this rank's own shard [experts][shard_rows][cols] (padding rows
 * are zeroed either way). Fills the master shard too. Marks the parameter
 * updated on `stream`. `src` must stay valid until the stream reaches it.
 * Only the valid rows of the shard are read: etp_param_load_shard's src may
 * be NULL on a rank whose valid_shard_rows is 0 (a shard of padding only,
 * when rows < group size x alignment), as any empty array may in etp.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULL param or stream, src NULL where
 * rows are read, a stream of another context). */
ETP_API etp_status_t etp_param_load_full(etp_param_t *param, const void *src, etp_stream_t *stream);
ETP_API etp_status_t etp_param_load_shard(etp_param_t *param, const void *src, etp_stream_t *stream);

/* Gather the full tensor into dst [experts][rows][cols] (no padding),
 * ordered after the work enqueued on `stream` so far, and `stream`'s later
 * work after it. Collective over the parameter's group: for a parameter of
 * a chain, on the chain's all-gather stream and role, behind the chain's
 * gathers and prefetches (so it may run during a step, or straight after a
 * load that prefetched); for one in no chain, on `stream` and role 0. Any
 * time, with the same order of calls on every rank. Not under capture.
 * Where the rows are padded (rows not a multiple of the group's size times
 * the alignment), allocates a staging buffer for the call and frees it at
 * the end, which waits for the context's enqueued work (blocks the host);
 * otherwise it gathers straight into dst, stream-ordered like a gather.
 * A refusal (a NULL dst on one rank, say) is recorded on the group
 * ("Refused calls" in etp/context.h). */
ETP_API etp_status_t etp_param_export_full(etp_param_t *param, void *dst, etp_stream_t *stream);

/* Tell etp that the shard was written on `stream` (after an optimizer step):
 * later gathers wait for it, and a prefetched gather of it issued before
 * this call is issued again at its etp_gather. Every write of the shard
 * needs it: without it a later gather may return the weight as a gather
 * before the write left it in its slot. Every rank of the group must
 * mark the same parameters updated between the same gathers, even one whose
 * shard did not change (only padding, say): a quantized parameter's next
 * gather re-quantizes after it, with a collective (NVFP4's amax all-reduce,
 * the scales of cache_gathered_scales) that all ranks must issue alike. */
ETP_API etp_status_t etp_param_mark_updated(etp_param_t *param, etp_stream_t *stream);

/* Called on the calling thread as soon as a step's final reduce-scatter of
 * the parameter (its num_microbatches-th etp_reduce_grad) is enqueued;
 * `final_stream` is where main_grad becomes final (enqueue a data-parallel
 * all-reduce there). */
typedef void (*etp_grad_ready_fn_t)(void *user, etp_param_t *param, etp_stream_t *final_stream);
ETP_API etp_status_t etp_param_set_grad_callback(etp_param_t *param, etp_grad_ready_fn_t fn,
                                                 void *user);

/* ---- chains ----------------------------------------------------------- */

typedef struct etp_chain_config {
    size_t size;            /* sizeof(etp_chain_config_t) */
    const char *name;
    etp_group_t *group;     /* every parameter of the chain uses this group */
    int depth;              /* prefetch depth, >= 0 (default 1) */
    /* 1: a graphed chain, whose steps may be captured into CUDA graphs:
     * prefetches cross forward -> backward only with graph_whole_step
     * (without it, capture them apart or together); its side streams fork
     * from the caller's stream at every gather and reduce_grad, so the shard's writer (mark_updated) and every
     * release must be on the stream that gathers (or ordered before it);
     * each step must end with etp_wait_grads on that stream, which joins
     * the side streams back; quantized weights are re-quantized at each
     * forward gather. */
    int graphed;
    int ag_role, rs_role;   /* communicator roles of the group (default 0 and 1) */
    int wgrad_ring;         /* wgrad buffers in the ring, >= 1 (default 2) */
    int num_microbatches;   /* reduce_grad calls per parameter per step (default 1) */
    /* 1 (ungraphed chains): the next step's first `depth` gathers start at
     * the weights' updates instead of at the step's first gather: between
     * steps (no weight of the chain gathered and not released),
     * etp_param_mark_updated of one of the chain's first `depth` parameters
     * issues its forward gather on the all-gather stream, after the update;
     * a second update before that gather issues it again. Such calls are
     * then collective: every rank of the group must mark the same
     * parameters updated in the same order. */
    int prefetch_on_update;
    /* 1 (ungraphed chains): etp_zero_grad writes nothing; each parameter's
     * first reduction after it stores scale * sum instead of adding it to
     * main_grad (the same bits as zeroing and adding: fmaf(scale, sum, +0)),
     * so a step neither writes every main_grad with zeros nor reads it back
     * once. The zeros become visible to main_grad's readers at
     * etp_wait_grads (which zeroes, on the chain's reduce-scatter stream,
     * every parameter not reduced since), etp_chain_grad_stats and
     * etp_chain_destroy, not at etp_zero_grad: read main_grad only after
     * etp_wait_grads. */
    int defer_zero_grad;
    /* 1 (graphed chains): every step's forward and backward are captured
     * into one graph (or both run eager), so the last forward gathers
     * prefetch the first backward ones, as an ungraphed chain's do; without
     * it the first backward gather of a captured step starts cold (on 2
     * H100s an MoE layer's graph replay went from 0.91 to 0.97 of its eager
     * step's speed with it). A capture that ends between forward and backward
     * then holds an unjoined prefetch: etp_stream_end_capture fails
     * (ETP_ERR_INVALID_STATE on the host backend, ETP_ERR_BACKEND on CUDA),
     * never a silent race. */
    int graph_whole_step;
    /* Bytes of gathered weights the chain may keep from a weight's gather
     * to its next one (forward to backward), which then finds the weight in
     * its slot and gathers nothing (FSDP's reshard_after_forward = False,
     * within a budget): each kept weight holds a slot of its own in
     * between, so the chain's slots grow by about this (the memory report
     * says by how much). The pairs closest
     * together are kept first (the last forward weights); SIZE_MAX keeps
     * all (a step then gathers each weight once, with the memory of whole
     * weights at the turn). Unquantized weights only; a graphed chain needs
     * graph_whole_step. 0 (default): only what the turn's slots hold. */
    size_t keep_bytes;
} etp_chain_config_t;

#define ETP_CHAIN_CONFIG_INIT                                                \
    {                                                                        \
        sizeof(etp_chain_config_t), NULL, NULL, 1, 0, 0, 1, 2, 1, 0, 0, 0, 0 \
    }

/* Create a chain with its own all-gather and reduce-scatter streams. Its
 * group needs two roles (ag_role != rs_role; the default group config and
 * the context's world group have one: split a group with num_roles = 2,
 * etp_group_split): ETP_ERR_INVALID_ARGUMENT otherwise. */
ETP_API etp_status_t etp_chain_create(etp_context_t *ctx, const etp_chain_config_t *config,
                                      etp_chain_t **chain);
/* Errors: ETP_ERR_BUSY while its communication is in flight (call
 * etp_wait_grads and synchronize first) or a gathered weight is not
 * released; ETP_ERR_INVALID_STATE while a graph capture is in progress on
 * the context, ETP_ERR_BUSY while graphs that captured its calls live
 * (nothing is destroyed either way). Parameters are detached, not destroyed. Collective (the slots'
 * windows are freed together): every rank must get here with nothing in
 * flight, or a rank refused with BUSY leaves the others waiting. Blocks the
 * host. */
ETP_API etp_status_t etp_chain_destroy(etp_chain_t *chain);

/* Append a parameter (forward order). A parameter belongs to one chain. */
ETP_API etp_status_t etp_chain_add(etp_chain_t *chain, etp_param_t *param);
/* Plan the tickets over the explicit order (forward, then backward in
 * reverse) and allocate the gather slots and wgrad ring. Collective over
 * the chain's group; blocks the host. */
ETP_API etp_status_t etp_chain_finalize(etp_chain_t *chain);
/* Or record the order during one eager step: between begin and end, gathers
 * of parameters not in any chain add them, in call order (each (parameter,
 * pass) once); end plans and finalizes (collective; it synchronizes the
 * chain's streams and blocks the host). A failed end leaves the chain
 * recording without slots: call it again. */
ETP_API etp_status_t etp_chain_begin_record(etp_chain_t *chain);
ETP_API etp_status_t etp_chain_end_record(etp_chain_t *chain);

/* The all-gather and reduce-scatter streams (owned by the chain). */
ETP_API etp_status_t etp_chain_streams(etp_chain_t *chain, etp_stream_t **ag, etp_stream_t **rs);

typedef struct etp_cache_report {
    size_t size;               /* sizeof(etp_cache_report_t) */
    int tickets;               /* (parameter, pass) pairs planned */
    int slots;                 /* gather buffers */
    size_t slot_bytes;         /* their total size */
    size_t lower_bound_bytes;  /* the most bytes alive at once under the plan's model */
    size_t wgrad_ring_bytes;
} etp_cache_report_t;

#define ETP_CACHE_REPORT_INIT {sizeof(etp_cache_report_t), 0, 0, 0, 0, 0}

ETP_API etp_status_t etp_chain_cache_report(const etp_chain_t *chain, etp_cache_report_t *report);

/* ---- gathers ---------------------------------------------------------- */

/* A gathered weight. Plain (and dequantized) gathers: data in dtype, ld and
 * expert_stride in elements. Quantized gathers (quant != NONE): the layouts
 * of docs/FORMATS.md for the full padded weight [padded_rows, cols] of each
 * expert (rowwise data for the forward pass, columnwise for the backward),
 * dtype U8, ld and expert_stride in bytes, scales row-major or (the
 * parameter's swizzle_scales) swizzled, and for NVFP4 the group-wide
 * per-tensor amax of each expert. Padding rows
 * quantize to zero codes with zero scales. */
typedef struct etp_weight_view {
    size_t size;               /* sizeof(etp_weight_view_t) */
    void *data;                /* expert e row i at data + (e * expert_stride + i * ld) elements */
    etp_dtype_t dtype;
    int64_t experts, rows, cols;
    int64_t ld;                /* elements (bytes when quantized) between rows */
    int64_t expert_stride;     /* elements (bytes when quantized) between experts */
    etp_param_quant_t quant;   /* NONE for plain and dequantized gathers */
    void *scales;              /* quantized: expert e's scales at scales + e * scale_expert_stride */
    int64_t scale_rows, scale_cols, scale_expert_stride; /* bytes */
    const float *amax;         /* NVFP4: [experts] per-tensor amax; else NULL */
    int scales_swizzled;       /* 1: scales in cuBLASLt's swizzled order (same bytes) */
} etp_weight_view_t;

#define ETP_WEIGHT_VIEW_INIT \
    {sizeof(etp_weight_view_t), NULL, ETP_DTYPE_BF16, 0, 0, 0, 0, 0, ETP_PARAM_QUANT_NONE, NULL, 0, 0, 0, NULL, 0}

/* The full weight for `pass`, ready for work enqueued on `stream` after this
 * call. Waits (on the device) for the prefetch, or gathers now on a cold
 * start; then prefetches the next `depth` tickets. Valid until
 * etp_release(param, pass, stream'). A prefetch runs on the chain's
 * all-gather stream, except, for an unquantized weight gathered in place
 * (ETP_COPY_ENGINE), the copy of this rank's own shard into its place: it
 * runs on `stream` (about 40 us of SMs for 64 MiB on an H200, ahead of the
 * caller's next kernel), which also waits for that slot's previous reader
 * and for the shard's last etp_param_mark_updated. Collective (see the top).
 * On a group of one, an unquantized weight is not gathered: the view is
 * the shard itself (no slot, no copy; ordered after the shard's last
 * etp_param_mark_updated), so the shard's next writer must follow this
 * view's last reader (the release, on the same stream or after an event).
 * Errors: ETP_ERR_INVALID_STATE (not in a finalized or recording chain; the
 * (parameter, pass) gathered and not released; a prefetch that would
 * overwrite a weight not released; inside a batch), ETP_ERR_INVALID_ARGUMENT.
 * A refused call leaves the chain as it was. */
ETP_API etp_status_t etp_gather(etp_param_t *param, etp_pass_t pass, etp_stream_t *stream,
                                etp_weight_view_t *view);
/* The reader on `stream` is done with the gathered weight. */
ETP_API etp_status_t etp_release(etp_param_t *param, etp_pass_t pass, etp_stream_t *stream);

/* ---- gradients -------------------------------------------------------- */

/* A wgrad buffer [experts][rows][cols] of the parameter's wgrad dtype (view
 * strides as in a gather) from the chain's ring, writable by work enqueued
 * on `stream` after this call (the previous reader of the ring entry is
 * waited for). Write the gradient, then call etp_reduce_grad. */
ETP_API etp_status_t etp_wgrad_buffer(etp_param_t *param, etp_stream_t *stream,
                                      etp_weight_view_t *view);
/* Reduce-scatter the parameter's last wgrad buffer (written on `stream`) on
 * the chain's reduce-scatter stream and accumulate scale * result into
 * main_grad. Micro-batches accumulate until etp_zero_grad. The reduction is
 * deterministic: each rank's chunk of every rank's wgrad is summed in FP32
 * in rank order, then main_grad = fmaf(scale, sum, main_grad), the same
 * bits on every backend, rank count and run (the exchange is an all-to-all,
 * on the copy engines where possible: ETP_COPY_ENGINE; its staging takes
 * one full wgrad of the chain's largest parameter). Collective over the
 * chain's group (an all-to-all on its RS role). */
ETP_API etp_status_t etp_reduce_grad(etp_param_t *param, etp_stream_t *stream, float scale);
/* Zero every main_grad of the chain, ordered after `stream` and before later
 * reductions (with defer_zero_grad, by the first reductions: see there).
 * Starts a new step's micro-batch count. */
ETP_API etp_status_t etp_zero_grad(etp_chain_t *chain, etp_stream_t *stream);
/* Make `stream` wait for all gradient work enqueued so far (a stream join;
 * with defer_zero_grad, after zeroing the main_grads not reduced since
 * etp_zero_grad). */
ETP_API etp_status_t etp_wait_grads(etp_chain_t *chain, etp_stream_t *stream);
/* Sum of squares of every main_grad element of the chain's parameters
 * (padding excluded) over the group, and the count of NaN/Inf elements.
 * Collective over the group; blocks the calling thread. */
ETP_API etp_status_t etp_chain_grad_stats(etp_chain_t *chain, double *sum_squares,
                                          int64_t *nonfinite);

#ifdef __cplusplus
}
#endif

#endif /* ETP_PARAM_H */
