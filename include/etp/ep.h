/*
 * etp/ep.h - expert parallelism: move MoE tokens to the ranks that own their
 * top-k experts (dispatch) and back (combine), forward and backward.
 *
 * docs/EP.md defines every output's layout with a worked 2-rank example.
 *
 * Objects:
 * - An EP group (etp_ep_group_t) is made once on an etp group of R ranks. It
 *   owns E experts, E/R consecutive ones per rank (rank r owns experts
 *   [r*E/R, (r+1)*E/R), its "local experts" 0 .. E/R-1), and the transport
 *   buffers that every layer shares, allocated once at creation through the
 *   context allocator (owner ETP_MEM_EP_BUFFERS).
 * - A layer handle (etp_ep_layer_t) holds one routing at a time: that
 *   layer's top-k, alignment, layout and weighting, and the device-resident
 *   routing state that prepare computes and that dispatch, combine and the
 *   two backward calls read. Its state is allocated at creation. Two layers
 *   with different top-k live side by side; for several micro-batches of one
 *   layer in flight, make one handle per micro-batch.
 *
 * A step of one layer, with T tokens on this rank (T <= max_tokens_per_rank,
 * different on every rank, 0 allowed) and k = the layer's top-k:
 *
 *   etp_ep_prepare(layer, topk_idx [T, k] int64)        routing, counts, layout
 *   etp_ep_dispatch(tokens [T, H], topk_weights [T, k]) -> recv_tokens [rows, H],
 *                                                          recv_weights [rows]
 *   ... the caller's expert GEMMs: recv_tokens -> expert_out [rows, H] ...
 *   etp_ep_combine(expert_out [rows, H])                -> out [T, H]
 *   backward:
 *   etp_ep_combine_bwd(grad_out [T, H], expert_out)     -> grad_rows [rows, H],
 *                                                          grad_topk_weights [T, k]
 *   etp_ep_dispatch_bwd(grad_rows', grad_row_weights)   -> grad_tokens [T, H],
 *                                                          grad_topk_weights [T, k]
 *
 * Semantics (docs/EP.md has the details):
 * - Slot (t, j) of topk_idx names expert topk_idx[t, j]; -1 means no expert.
 *   An index < -1 or >= E, or an expert repeated in a row (the later
 *   occurrence), is a bad slot: dropped, counted and flagged (below).
 * - A token crosses to each destination rank at most once; the receiver
 *   expands it into one row per selected local expert. Within a local
 *   expert, rows are ordered by (source rank, source token index): results
 *   do not depend on timing.
 * - Layouts: PACKED puts local expert e's rows at offsets[e], where offsets
 *   are the exclusive prefix sum of the counts each rounded up to the
 *   layer's alignment; FIXED_SLOTS gives local expert e the fixed rows
 *   [e*S, (e+1)*S) (S = slots_per_expert). Every row of the layer's `rows`
 *   that holds no token is zero (tokens and weights).
 * - combine: the expert side sums each token's rows for its local experts in
 *   FP32, in expert order (weighted: acc = fmaf(w, x, acc); unweighted:
 *   acc += x), one partial per (token, rank), which travels back in FP32;
 *   the token's rank sums the partials in rank order in FP32 and rounds once
 *   to the token dtype. A token none of whose slots was kept gets zeros.
 * - dispatch_bwd and combine_bwd are the exact adjoints of dispatch and
 *   combine (weights included).
 *
 * Capacity and bad input: slots are dropped, never written past a buffer,
 * when a rank's layout needs more rows than it has (recv_capacity_per_rank,
 * or S per expert), when a transport slab is full (capacity transport), or
 * when the index is bad. Each drop is counted on the device and raises a
 * flag; prepare copies the counters to pinned host memory at its end.
 * etp_ep_poll() reads that copy without blocking, etp_ep_check() waits for
 * the layer's last prepare first. With ETP_EP_OVERFLOW_ERROR a raised flag
 * makes poll and check fail (until etp_ep_reset_report) with a message
 * naming the rank, the layer and the capacity needed; with
 * ETP_EP_OVERFLOW_DROP they report the counts and succeed. The data calls
 * themselves never fail on a flag: flags are raised on some ranks only, and
 * a rank refusing a collective call would leave the others waiting.
 *
 * Transports: EXACT copies the exchanged counts to the host inside prepare
 * (one stream synchronization per prepare) and moves exactly the rows that
 * cross; eager only. CAPACITY moves fixed slabs of `slab_rows` token rows
 * per peer, keeps every count on the device, never synchronizes, and can be
 * captured into a CUDA graph (with T on the device: num_tokens_dev).
 * NVLINK (the default where it can run: ETP_EP_TRANSPORT_AUTO) keeps the
 * counts on the device like CAPACITY and drops like EXACT (a receive buffer
 * of recv_capacity_per_rank token rows, filled in source rank order), so
 * its results are EXACT's bit for bit (with the FP32 combine wire); on
 * CUDA a sending kernel of num_sms blocks stores every token (or partial
 * sum) once into each destination rank's receive slab (an NCCL symmetric
 * window, addressed through NCCL's device API), and the local work (the
 * expand, the pre-sums beside the stores, the token sums) runs on the rest
 * of the device, with flags in the windows instead of collectives; prepare
 * exchanges the counts and routing the same way, in one kernel.
 * Those kernels wait for their peers at most half of ETP_TIMEOUT_S (so that
 * a host wait, bounded by the whole, sees why): a peer that never arrives
 * is reported (by the next stream or event wait,
 * etp_ep_check and etp_context_check) as ETP_ERR_TIMEOUT naming the EP
 * group and the rank, and the context is aborted; nothing hangs. The host
 * backend runs the same transport (the same layout, drops and results)
 * with all-to-alls of its receive slabs.
 *
 * Streams: every call enqueues its work on the stream it is given, including
 * the collectives on (group, config.role), so it orders with the caller's
 * GEMMs there. Calls of one EP group (all its layers) share its transport
 * buffers: when consecutive calls come on different streams, etp makes the
 * new stream wait for the previous call (an event, no host block). Keep one
 * stream per EP group when capturing graphs. Every rank must make the same
 * sequence of EP calls (they are collective over the group), and no other
 * work may use the group's role `config.role` on another stream meanwhile.
 *
 * Memory: nothing is allocated after creation; prepare, dispatch, combine
 * and their backward calls write only etp's own preallocated buffers and
 * the caller's output buffers. Pointers are device pointers (host memory on
 * the host backend). Outputs are written only by the work enqueued.
 *
 * Empty arrays: an array of zero length may be NULL. The token-side arrays
 * ([T, ...]: topk_idx, tokens, topk_weights, out, grad_out, grad_tokens,
 * grad_topk_weights) are empty on a rank whose prepare was given
 * num_tokens = 0; such a rank still makes every call, with NULL or not.
 * With T on the device (num_tokens_dev) T is unknown when the work is
 * enqueued: those arrays hold max_tokens_per_rank rows and are never NULL.
 * Arrays of the layer's rows (recv_tokens, expert_out, grad_rows, ...)
 * are never empty.
 *
 * Thread safety: an EP group and its layers are used by one thread at a
 * time, like their context.
 *
 * Tracing: etp_ep_group_set_trace() sets a callback (etp/trace.h) that
 * prepare, dispatch, combine and dispatch_bwd call at their phase
 * boundaries, with their stream, so that a caller can time the phases with
 * events.
 *
 * MXFP8 dispatch: a group made with token_dtype ETP_EP_TOKEN_MXFP8 takes
 * BF16 tokens in dispatch (etp_ep_dispatch_ex), quantizes each token row once
 * on its rank (MXFP8 rowwise, E4M3 elements, one E8M0 scale per 32 elements:
 * exactly etp/quant.h's MXFP8 rowwise format), sends data and scales together
 * (H + H/32 bytes per token instead of 2H), and writes the received rows as
 * MXFP8: recv_tokens [rows, H] E4M3 bytes and recv_scales [rows, H/32] E8M0
 * bytes, both row-major (scales not swizzled, no padding), the layout a
 * grouped MXFP8 GEMM reads through counts/offsets. combine, dispatch_bwd and
 * combine_bwd of such a group move BF16, as in a BF16 group.
 */
#ifndef ETP_EP_H
#define ETP_EP_H

#include "etp/comm.h"
#include "etp/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etp_ep_group etp_ep_group_t;
typedef struct etp_ep_layer etp_ep_layer_t;

typedef enum etp_ep_overflow {
    ETP_EP_OVERFLOW_DROP = 0,  /* drop, count, report; calls succeed */
    ETP_EP_OVERFLOW_ERROR = 1  /* drop, count, and fail poll and check (never the data calls) */
} etp_ep_overflow_t;

typedef enum etp_ep_transport {
    ETP_EP_TRANSPORT_EXACT = 0,    /* counts to the host, exact sizes; eager only */
    ETP_EP_TRANSPORT_CAPACITY = 1, /* fixed slabs per peer, counts on the device; capturable */
    /* device-initiated stores into the peers' receive slabs (CUDA: every
     * rank of the group reaches every other through peer access, in one
     * NVLink domain, with NCCL >= 2.28.3 symmetric windows); counts on the
     * device; capturable; EXACT's drops and results */
    ETP_EP_TRANSPORT_NVLINK = 2,
    /* the default: the environment's ETP_EP_TRANSPORT (exact, capacity,
     * nvlink or auto) if set, else NVLINK where every rank of the group can
     * run it (on CUDA: peer access between all ranks, NCCL windows, no user
     * allocator hook; always on the host backend), else EXACT.
     * etp_ep_group_info says which was taken. */
    ETP_EP_TRANSPORT_AUTO = 3
} etp_ep_transport_t;

/* A token dtype that is not an etp_dtype_t, for etp_ep_group_config_t's
 * token_dtype only: MXFP8 dispatch. The group's hidden size must be a
 * multiple of ETP_EP_MXFP8_BLOCK. dispatch (etp_ep_dispatch_ex) takes BF16
 * tokens and writes MXFP8 rows: E4M3 elements (float8_e4m3fn, round to
 * nearest even, saturating to +-448; NaN -> 0x7F) and one E8M0 scale
 * (float8_e8m0fnu, 2^(e-127)) per 32 consecutive elements of a row, the
 * scale of a block being the power of two at or above amax / 448 (amax over
 * the block's non-NaN elements): etp/quant.h's MXFP8 rowwise E4M3 result,
 * bit for bit (docs/FORMATS.md). The quantization happens once per token on
 * the token's rank; every copy of a token (one per expert it selected)
 * carries the same bytes. Every other call of an MXFP8 group (combine,
 * dispatch_bwd, combine_bwd) takes and returns BF16; passing
 * ETP_EP_TOKEN_MXFP8 to them is ETP_ERR_INVALID_ARGUMENT. */
#define ETP_EP_TOKEN_MXFP8 ((etp_dtype_t)100)

/* Elements per E8M0 scale of MXFP8 tokens. */
#define ETP_EP_MXFP8_BLOCK 32

typedef struct etp_ep_group_config {
    size_t size;                   /* sizeof(etp_ep_group_config_t) */
    const char *name;              /* copied; in messages ("ep"); NULL: the group's name */
    int role;                      /* the group role whose communicator EP uses */
    int64_t num_experts;           /* E, a multiple of the group size R, below 2^31 */
    int64_t hidden;                /* H, elements per token row */
    etp_dtype_t token_dtype;       /* ETP_DTYPE_BF16, ETP_DTYPE_F32, or ETP_EP_TOKEN_MXFP8
                                    * (BF16 in, MXFP8 out of dispatch; BF16 elsewhere) */
    int64_t max_tokens_per_rank;   /* the largest T any call will pass (> 0) */
    int max_topk;                  /* the largest top-k of any layer (>= 1) */
    int64_t recv_capacity_per_rank; /* expanded rows a rank's layout holds (> 0) */
    etp_ep_overflow_t overflow;
    etp_ep_transport_t transport;
    /* CAPACITY: the slab (token rows one rank sends to one peer per call) is
     * capacity_factor times the mean rows a peer receives from one rank when
     * every rank routes max_tokens_per_rank tokens uniformly at random to
     * max_topk distinct experts: ceil(c * max_tokens * p), p = the
     * probability that a token picks at least one of a rank's E/R experts;
     * at most max_tokens_per_rank. Must be > 0. Ignored by EXACT. */
    double capacity_factor;
    /* The dtype of the per (token, rank) partial sums that combine and
     * dispatch_bwd send back to the token's rank, every transport:
     * ETP_DTYPE_F32 (the default; the result is rounded once, after the
     * FP32 sum over ranks) or ETP_DTYPE_BF16 (half the bytes; each partial
     * is rounded to BF16 before it travels, so a token whose experts sit on
     * several ranks gets up to one more rounding per rank: docs/EP.md).
     * Groups of FP32 tokens take F32 only. */
    etp_dtype_t combine_wire;
    /* NVLINK on CUDA: the blocks (one per SM) that store into the peers
     * (and run prepare's exchange), the same on every rank; the local work
     * of a call (expand, pre-sums, token sums) takes the whole device, and
     * combine's pre-sums run on the SMs the sending blocks leave.
     * 0: 24, or the smallest SM count of the group's devices if smaller;
     * a low-latency layer's kernels (which do all of a call's work on these
     * blocks) then take half the smallest device's SMs instead.
     * More than a device's SMs: NVLINK cannot run (ETP_ERR_UNSUPPORTED when
     * asked for, saying so; AUTO takes EXACT). Ignored otherwise. */
    int num_sms;
} etp_ep_group_config_t;

#define ETP_EP_GROUP_CONFIG_INIT                                                       \
    {                                                                                  \
        sizeof(etp_ep_group_config_t), NULL, 0, 0, 0, ETP_DTYPE_BF16, 0, 1, 0,         \
            ETP_EP_OVERFLOW_DROP, ETP_EP_TRANSPORT_AUTO, 1.25, ETP_DTYPE_F32, 0        \
    }

/* Make an EP group on `group` (every rank of the group calls it, with the
 * same config). Allocates the transport buffers (ETP_MEM_EP_BUFFERS; for
 * NVLINK on CUDA an NCCL symmetric window, registered collectively, and a
 * few pinned host words) and an event of the context. The group must
 * outlive the EP group.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs, a config of the wrong size, E not
 * a multiple of R, sizes <= 0, sizes past the 32-bit row indices and
 * expert ids, a role the group lacks, capacity_factor <= 0,
 * a token dtype other than BF16/F32/ETP_EP_TOKEN_MXFP8, MXFP8 with a hidden
 * size that is not a multiple of 32, a combine_wire other than F32/BF16 or
 * BF16 in an F32 group, num_sms < 0), ETP_ERR_UNSUPPORTED (NVLINK asked for
 * explicitly, in the config or ETP_EP_TRANSPORT, where a rank cannot run
 * it: the message says why), ETP_ERR_OUT_OF_MEMORY, ETP_ERR_ABORTED. On failure nothing is left allocated and *ep is
 * untouched. */
ETP_API etp_status_t etp_ep_group_create(etp_group_t *group, const etp_ep_group_config_t *config,
                                         etp_ep_group_t **ep);

/* Destroy an EP group; waits for its enqueued work (like etp_mem_free).
 * ETP_ERR_BUSY while layers made from it, or graphs that captured calls of
 * its layers, are alive; ETP_ERR_INVALID_STATE
 * while a graph capture is in progress on the context (nothing is
 * destroyed either way). NULL is a no-op. */
ETP_API etp_status_t etp_ep_group_destroy(etp_ep_group_t *ep);

typedef struct etp_ep_group_info {
    size_t size;              /* sizeof(etp_ep_group_info_t) */
    int rank, ranks;          /* this rank and R, in the EP group */
    int64_t local_experts;    /* E / R */
    int64_t first_expert;     /* rank * E / R */
    int64_t slab_rows;        /* CAPACITY: token rows per peer per call; NVLINK:
                               * max_tokens_per_rank (a slab per source rank); EXACT: 0 */
    int64_t recv_token_rows;  /* token rows the receive transport buffer holds */
    int64_t send_token_rows;  /* token rows the send transport buffer holds */
    size_t buffer_bytes;      /* transport buffers, all together */
    size_t wire_row_bytes;    /* bytes one token's row takes in dispatch's exchange: hidden x the
                               * token dtype's size, or for MXFP8 its data, E8M0 scales and zero
                               * padding to a multiple of 16 (docs/EP.md) */
    etp_ep_transport_t transport; /* the transport taken (never AUTO) */
    etp_dtype_t combine_wire;     /* ETP_DTYPE_F32 or ETP_DTYPE_BF16 */
    int num_sms;                  /* NVLINK on CUDA: blocks of its sending kernels; else 0 */
} etp_ep_group_info_t;

#define ETP_EP_GROUP_INFO_INIT                                                          \
    {                                                                                   \
        sizeof(etp_ep_group_info_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, ETP_EP_TRANSPORT_EXACT, \
            ETP_DTYPE_F32, 0                                                            \
    }

ETP_API etp_status_t etp_ep_group_info(const etp_ep_group_t *ep, etp_ep_group_info_t *info);

/* Set (fn != NULL) or clear (fn == NULL) the trace callback of every layer
 * of `ep`, replacing the previous one. From the next call on, dispatch
 * (etp_ep_dispatch, etp_ep_dispatch_ex), combine and dispatch_bwd call
 * fn(user, point, stream) at their points (ETP_TRACE_EP_*, etp/trace.h
 * says when and what fn may do), on the calling thread, with the call's
 * stream; prepare and combine_bwd report no points. While fn runs, the
 * calls of this group and its layers that enqueue work, make or destroy a
 * layer or the group, or set the trace fail with ETP_ERR_INVALID_STATE
 * (poll, check, info, etp_ep_layer_rows and etp_ep_layout work). `user` is passed back as
 * given (not owned; ignored when fn is NULL). Local: no communication,
 * nothing enqueued; ranks may trace differently.
 * Errors: ETP_ERR_INVALID_ARGUMENT (ep NULL), ETP_ERR_INVALID_STATE (called
 * from the group's own trace callback). */
ETP_API etp_status_t etp_ep_group_set_trace(etp_ep_group_t *ep, etp_trace_fn_t fn, void *user);

typedef enum etp_ep_layout {
    ETP_EP_LAYOUT_PACKED = 0,      /* expert blocks back to back at aligned offsets */
    ETP_EP_LAYOUT_FIXED_SLOTS = 1  /* expert e owns rows [e*S, (e+1)*S) */
} etp_ep_layout_t;

typedef struct etp_ep_layer_config {
    size_t size;              /* sizeof(etp_ep_layer_config_t) */
    const char *name;         /* copied; in messages; NULL: "layer<n>" */
    int topk;                 /* k of this layer, 1 .. max_topk */
    int alignment;            /* rows per expert block are padded to this (0 or 1: none);
                               * PACKED: must divide recv_capacity_per_rank */
    etp_ep_layout_t layout;
    int weighted;             /* 1: combine multiplies by topk_weights */
    /* FIXED_SLOTS: rows per local expert S, a multiple of alignment with
     * S * E/R <= recv_capacity_per_rank; 0: the largest such S. */
    int64_t slots_per_expert;
    /* 1: a low-latency layer (below: etp_ep_ll_dispatch), for small
     * batches (decode): NVLINK groups only, forward only. 0: an ordinary
     * layer. */
    int low_latency;
    /* Low-latency layers: the largest T a dispatch of this layer passes,
     * 1 .. min(ETP_EP_LL_MAX_TOKENS, the group's max_tokens_per_rank); 0:
     * the group's (which must then be <= ETP_EP_LL_MAX_TOKENS). Ordinary
     * layers: 0. */
    int64_t max_tokens_per_rank;
} etp_ep_layer_config_t;

#define ETP_EP_LAYER_CONFIG_INIT \
    {sizeof(etp_ep_layer_config_t), NULL, 1, 1, ETP_EP_LAYOUT_PACKED, 1, 0, 0, 0}

/* Make a layer handle (local: no communication, except a low-latency layer
 * on CUDA: its window is registered collectively, so every rank makes the
 * same low-latency layers in the same order). Allocates its routing state
 * (ETP_MEM_EP_BUFFERS; a low-latency layer also its two halves and, on
 * CUDA, its window), pinned host memory for its report (not in the memory
 * report: a few hundred bytes), and an event.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs, wrong config size, topk out of
 * range, alignment < 0 or not dividing the capacity, bad slots_per_expert,
 * low_latency not 0 or 1, max_tokens_per_rank out of range or set on an
 * ordinary layer), ETP_ERR_UNSUPPORTED (a low-latency layer in a group
 * that is not NVLINK, an MXFP8 group, top-k above 16 or more than 32
 * ranks), ETP_ERR_OUT_OF_MEMORY, ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_ep_layer_create(etp_ep_group_t *ep, const etp_ep_layer_config_t *config,
                                         etp_ep_layer_t **layer);

/* Destroy a layer handle; waits for its enqueued work (collective for a
 * low-latency layer on CUDA, like its creation). ETP_ERR_BUSY while
 * graphs that captured its calls live; ETP_ERR_INVALID_STATE
 * while a graph capture is in progress on the context (nothing is
 * destroyed). NULL is a no-op. */
ETP_API etp_status_t etp_ep_layer_destroy(etp_ep_layer_t *layer);

/* Rows of the layer's row space: recv_tokens, recv_weights, expert_out and
 * grad_rows must hold at least this many rows. PACKED: recv_capacity_per_rank;
 * FIXED_SLOTS: S * E/R. */
ETP_API etp_status_t etp_ep_layer_rows(const etp_ep_layer_t *layer, int64_t *rows);

/* Pass as num_tokens when T is on the device (num_tokens_dev). */
#define ETP_EP_TOKENS_ON_DEVICE ((int64_t)-1)

/* Compute the routing of this step: on the device, per local expert the
 * kept row count (unpadded, int32 [E/R]) and the row offset (int32
 * [E/R + 1], padded to the alignment; offsets[E/R] is the end of the last
 * block), the exchange of counts across the group, receive offsets and send
 * positions. Collective over the EP group.
 *   topk_idx: [T, k] of idx_dtype, which must be ETP_DTYPE_I64; read by the
 *     enqueued work (keep it alive and unchanged until the stream passes).
 *     NULL allowed when num_tokens is 0.
 *   num_tokens: T (0 .. max_tokens_per_rank), or ETP_EP_TOKENS_ON_DEVICE
 *     with num_tokens_dev (an int32 on the device, read by the enqueued
 *     work; a value outside [0, max_tokens_per_rank] is clamped and flagged
 *     ETP_EP_FLAG_BAD_TOKENS). topk_idx then holds max_tokens_per_rank rows.
 * EXACT synchronizes `stream` once (the counts come to the host) and is
 * refused under capture; CAPACITY never blocks.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs (topk_idx NULL with T > 0 or a
 * device T; ETP_EP_TOKENS_ON_DEVICE without num_tokens_dev), idx_dtype not
 * I64, T out of range, device T with EXACT), ETP_ERR_INVALID_STATE (a capture with EXACT),
 * ETP_ERR_TIMEOUT, ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_ep_prepare(etp_ep_layer_t *layer, const void *topk_idx,
                                    etp_dtype_t idx_dtype, int64_t num_tokens,
                                    const int32_t *num_tokens_dev, etp_stream_t *stream);

/* The layout of the last prepare, on the device, owned by the layer (same
 * addresses for the layer's lifetime, so a graph may read them): counts
 * [E/R] int32, offsets [E/R + 1] int32. Valid once the stream passes the
 * prepare. Either pointer argument may be NULL. */
ETP_API etp_status_t etp_ep_layout(const etp_ep_layer_t *layer, const int32_t **counts_dev,
                                   const int32_t **offsets_dev);

/* Copy the layout of the last prepare to host arrays (counts [E/R],
 * offsets [E/R + 1]; either may be NULL): enqueues copies on `stream` and
 * synchronizes it (eager only). */
ETP_API etp_status_t etp_ep_layout_host(etp_ep_layer_t *layer, etp_stream_t *stream,
                                        int32_t *counts, int32_t *offsets);

/* Dispatch the tokens of the last prepare. Collective.
 *   tokens: [T, H] of dtype (the group's token dtype); NULL when T is 0.
 *   topk_weights: [T, k] of weights_dtype, which must be ETP_DTYPE_F32;
 *     NULL when T is 0, or for an unweighted layer without recv_weights
 *     (ignored there without recv_weights).
 *   recv_tokens: [rows, H] of dtype, rows >= etp_ep_layer_rows(); row r of
 *     local expert e's block holds the token of its (source rank, token).
 *   recv_weights: [rows] FP32: the weight of that row's slot (may be NULL).
 *   rows: the rows recv_tokens and recv_weights hold.
 * Weights travel when the layer is weighted or recv_weights is given: for
 * an unweighted layer every rank passes recv_weights or none (an empty rank
 * decides by recv_weights too, as its topk_weights may be NULL).
 * Rows of [0, layer rows) that hold no token are zero; rows beyond are not
 * touched. Weighted layers keep the received weights for combine and
 * combine_bwd.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs of non-empty arrays, a dtype
 * other than the group's or F32 for weights, rows too small, topk_weights
 * missing (T > 0) for a weighted layer or with recv_weights, an MXFP8
 * group: it needs etp_ep_dispatch_ex for its scales),
 * ETP_ERR_INVALID_STATE (before prepare), ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_ep_dispatch(etp_ep_layer_t *layer, const void *tokens, etp_dtype_t dtype,
                                     const void *topk_weights, etp_dtype_t weights_dtype,
                                     void *recv_tokens, float *recv_weights, int64_t rows,
                                     etp_stream_t *stream);

/* The arguments of etp_ep_dispatch_ex: those of etp_ep_dispatch, plus the
 * receive buffer of MXFP8 scales. */
typedef struct etp_ep_dispatch_args {
    size_t size;                /* sizeof(etp_ep_dispatch_args_t) */
    const void *tokens;         /* [T, H] of dtype; NULL when T is 0 */
    etp_dtype_t dtype;          /* the group's token dtype; MXFP8 groups: ETP_DTYPE_BF16 */
    /* [T, k] of weights_dtype; NULL when T is 0, or as etp_ep_dispatch says */
    const void *topk_weights;
    etp_dtype_t weights_dtype;  /* ETP_DTYPE_F32 */
    /* [rows, H] of the group's token dtype; MXFP8 groups: rows x H bytes of
     * E4M3, row r at byte r * H */
    void *recv_tokens;
    /* MXFP8 groups (required): rows x H/32 bytes of E8M0, row r's scale of
     * elements [32 b, 32 b + 32) at byte r * (H/32) + b: row-major, not
     * swizzled, no padding. Other groups: NULL. */
    void *recv_scales;
    float *recv_weights;        /* [rows] FP32, or NULL */
    int64_t rows;               /* rows recv_tokens, recv_scales and recv_weights hold */
} etp_ep_dispatch_args_t;

#define ETP_EP_DISPATCH_ARGS_INIT                                                        \
    {                                                                                    \
        sizeof(etp_ep_dispatch_args_t), NULL, ETP_DTYPE_BF16, NULL, ETP_DTYPE_F32, NULL, \
            NULL, NULL, 0                                                                \
    }

/* Dispatch, with every argument in a struct: etp_ep_dispatch for any group,
 * and the only dispatch of an MXFP8 group (ETP_EP_TOKEN_MXFP8). Collective.
 * MXFP8 groups: tokens are BF16 [T, H]; each token row is quantized once on
 * this rank (MXFP8 rowwise E4M3, ETP_EP_TOKEN_MXFP8 defines it); data and
 * scales travel together; row r of the layer's layout gets the token's H
 * data bytes in recv_tokens and its H/32 scale bytes in recv_scales. Rows of
 * [0, layer rows) that hold no token are zero (data, scales and weights:
 * a zero scale byte is 2^-127); rows beyond are not touched. A token
 * expanded to several experts' rows carries the same data and scales in
 * each.
 * Errors: as etp_ep_dispatch; also ETP_ERR_INVALID_ARGUMENT for args NULL
 * or of the wrong size, recv_scales missing (MXFP8 group) or given (other
 * groups), and tokens of a dtype other than BF16 in an MXFP8 group. */
ETP_API etp_status_t etp_ep_dispatch_ex(etp_ep_layer_t *layer, const etp_ep_dispatch_args_t *args,
                                        etp_stream_t *stream);

/* Combine the expert outputs of the last dispatch back to their tokens.
 * Collective. expert_out: [rows, H] of dtype (the token dtype; BF16 in an
 * MXFP8 group), in the layout of recv_tokens; out: [T, H] of dtype (NULL
 * when T is 0).
 * Weighted layers multiply by the weights the last dispatch carried.
 * Errors: as dispatch; ETP_ERR_INVALID_STATE for a weighted layer that has
 * not dispatched since its prepare. */
ETP_API etp_status_t etp_ep_combine(etp_ep_layer_t *layer, const void *expert_out,
                                    etp_dtype_t dtype, int64_t rows, void *out,
                                    etp_stream_t *stream);

/* The adjoint of dispatch. Collective.
 *   grad_rows: [rows, H] of dtype (the token dtype; BF16 in an MXFP8 group:
 *     the gradient passes the quantization straight through);
 *   grad_row_weights: [rows] FP32 or NULL.
 *   grad_tokens: [T, H] of dtype: the sum of the rows of each token (the
 *     order and rounding of an unweighted combine). NULL when T is 0.
 *   grad_topk_weights: [T, k] FP32: slot (t, j) gets grad_row_weights of the
 *     row that carried it, 0 for slots without a row. grad_row_weights and
 *     grad_topk_weights are both given or both NULL (ETP_ERR_INVALID_ARGUMENT
 *     otherwise), except that a rank with T = 0 may pass grad_topk_weights
 *     NULL with grad_row_weights given. Weight gradients travel when
 *     grad_row_weights is given: every rank gives it or none.
 * Errors: as dispatch. */
ETP_API etp_status_t etp_ep_dispatch_bwd(etp_ep_layer_t *layer, const void *grad_rows,
                                         etp_dtype_t dtype, const float *grad_row_weights,
                                         int64_t rows, void *grad_tokens,
                                         float *grad_topk_weights, etp_stream_t *stream);

/* The adjoint of combine. Collective.
 *   grad_out: [T, H] of dtype (the token dtype; BF16 in an MXFP8 group);
 *     NULL when T is 0;
 *   expert_out: [rows, H] of dtype, the forward's
 *     input (read only by weighted layers; may be NULL for unweighted ones).
 *   grad_rows: [rows, H] of dtype: w * grad_out[t] (weighted, one rounding)
 *     or grad_out[t]; rows holding no token are zero.
 *   grad_topk_weights: [T, k] FP32, weighted layers only (else NULL): the
 *     dot product of grad_out[t] and the slot's expert_out row, in FP32 in a
 *     fixed order (docs/EP.md); 0 for slots without a row. NULL when T is 0.
 * Errors: as combine. */
ETP_API etp_status_t etp_ep_combine_bwd(etp_ep_layer_t *layer, const void *grad_out,
                                        etp_dtype_t dtype, const void *expert_out, int64_t rows,
                                        void *grad_rows, float *grad_topk_weights,
                                        etp_stream_t *stream);

/* ---- low-latency layers ---------------------------------------------------
 *
 * A layer made with low_latency = 1 (an NVLINK group; docs/EP.md) moves
 * small batches (decode, pipeline tails: at most ETP_EP_LL_MAX_TOKENS tokens
 * a rank) with one call per direction and no prepare:
 *
 *   etp_ep_ll_dispatch(layer, {topk_idx, T, tokens, topk_weights}) -> a view
 *       of the received rows (etp_ep_ll_rows_t: device pointers owned by
 *       the layer, in the layer's layout, with its counts and offsets)
 *   ... the caller's expert GEMMs: view.tokens -> expert_out [rows, H] ...
 *   etp_ep_ll_combine(layer, expert_out)               -> out [T, H]
 *
 * Results: those of prepare + dispatch + combine of an ordinary layer of the
 * same config in the same group (the EXACT transport's), bit for bit: the
 * same slot rules, drops, layout, rows, weights, counters and sums. On
 * CUDA, each call is one kernel: dispatch routes, exchanges the counts,
 * stores each token once into every destination rank's window and lays out
 * the received rows there; combine pre-sums on the expert side and sums on
 * the token side (the NVLINK combine kernel). The host backend runs the same
 * semantics with its all-to-alls. Both are capturable (T on the device:
 * num_tokens_dev). Backward is not offered: dispatch_bwd and combine_bwd on
 * a low-latency layer, like prepare, dispatch and combine, are
 * ETP_ERR_INVALID_ARGUMENT.
 *
 * Buffers: the layer owns two halves of received rows (each its layout's
 * `rows` rows of H, weights, and the routing its combine reads), allocated
 * at creation, and alternates them: dispatch number n (from 0, counted
 * per layer on the host, in the order the calls are made) fills half n % 2.
 * The rows of dispatch n stay valid until dispatch n + 2 is enqueued (on
 * that stream: work enqueued before it, or on streams it waits for, may read
 * them). Every dispatch is paired with one combine, in order: combine
 * consumes the oldest dispatch not yet combined, so dispatch n + 1 may come
 * before combine n (two micro-batches in flight). A dispatch while two
 * dispatches of the layer await their combine would overwrite rows the
 * first's combine still needs: it is refused (ETP_ERR_INVALID_STATE,
 * nothing enqueued), as is a combine with none awaiting. A graph keeps the
 * halves its calls were captured with: a captured step (dispatch, GEMMs,
 * combine) refills the same half at every replay, so its rows stay valid
 * until the next replay's dispatch.
 *
 * Counters: each dispatch counts as a prepare in the layer's report and
 * copies the counters to the host mirror at its end (etp_ep_poll,
 * etp_ep_check wait for the last dispatch). */

/* The most tokens a rank passes to a low-latency dispatch. */
#define ETP_EP_LL_MAX_TOKENS 256

typedef struct etp_ep_ll_dispatch_args {
    size_t size;                  /* sizeof(etp_ep_ll_dispatch_args_t) */
    /* [T, k] of idx_dtype (ETP_DTYPE_I64), read by the enqueued work; NULL
     * when T is 0 (on the host) */
    const void *topk_idx;
    etp_dtype_t idx_dtype;
    /* T (0 .. the layer's max_tokens_per_rank), or ETP_EP_TOKENS_ON_DEVICE
     * with num_tokens_dev (an int32 on the device; outside the range: clamped
     * and flagged ETP_EP_FLAG_BAD_TOKENS); the token-side arrays then hold
     * the layer's max_tokens_per_rank rows */
    int64_t num_tokens;
    const int32_t *num_tokens_dev;
    const void *tokens;           /* [T, H] of dtype (the group's); NULL when T is 0 */
    etp_dtype_t dtype;
    /* [T, k] of weights_dtype (ETP_DTYPE_F32): weighted layers (NULL when T
     * is 0); unweighted layers: ignored (no weights travel) */
    const void *topk_weights;
    etp_dtype_t weights_dtype;
} etp_ep_ll_dispatch_args_t;

#define ETP_EP_LL_DISPATCH_ARGS_INIT                                                       \
    {                                                                                      \
        sizeof(etp_ep_ll_dispatch_args_t), NULL, ETP_DTYPE_I64, 0, NULL, NULL,             \
            ETP_DTYPE_BF16, NULL, ETP_DTYPE_F32                                            \
    }

/* The received rows of one low-latency dispatch: device pointers into the
 * layer's half (owned by the layer; valid as the header above says). */
typedef struct etp_ep_ll_rows {
    size_t size;                /* sizeof(etp_ep_ll_rows_t) */
    void *tokens;               /* [rows, H] of the token dtype, in the layer's layout;
                                 * rows holding no token are zero */
    const float *weights;       /* [rows] FP32 slot weights (weighted layers; else NULL) */
    const int32_t *counts;      /* [E/R] int32: rows per local expert (etp_ep_layout's) */
    const int32_t *offsets;     /* [E/R + 1] int32 */
    int64_t rows;               /* the layer's rows (etp_ep_layer_rows) */
    int half;                   /* 0 or 1: the half this dispatch filled */
} etp_ep_ll_rows_t;

#define ETP_EP_LL_ROWS_INIT {sizeof(etp_ep_ll_rows_t), NULL, NULL, NULL, NULL, 0, 0}

/* Dispatch a low-latency layer's tokens: routing, exchange and layout in one
 * call (no prepare). Collective. `rows` (may be NULL) receives the view of
 * the half this call fills; the view's contents are valid once the stream
 * passes the call. The layout arrays are the half's (etp_ep_layout returns
 * those of the last dispatch).
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs of non-empty arrays, args of the
 * wrong size, dtypes other than I64 / the group's / F32, T out of range, a
 * layer that is not low-latency), ETP_ERR_INVALID_STATE (two dispatches of
 * the layer await their combine), ETP_ERR_TIMEOUT, ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_ep_ll_dispatch(etp_ep_layer_t *layer,
                                        const etp_ep_ll_dispatch_args_t *args,
                                        etp_ep_ll_rows_t *rows, etp_stream_t *stream);

/* Combine the oldest low-latency dispatch of the layer not yet combined.
 * Collective. expert_out: [rows, H] of dtype (the group's token dtype), in
 * that dispatch's layout (it may be that dispatch's view.tokens); out: [T, H]
 * of dtype, T of that dispatch (NULL when T is 0 on the host). Weighted
 * layers multiply by the weights that dispatch carried; the sums are
 * etp_ep_combine's (docs/EP.md).
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs, dtype, rows too small, a layer
 * that is not low-latency), ETP_ERR_INVALID_STATE (no dispatch awaits its
 * combine), ETP_ERR_TIMEOUT, ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_ep_ll_combine(etp_ep_layer_t *layer, const void *expert_out,
                                       etp_dtype_t dtype, int64_t rows, void *out,
                                       etp_stream_t *stream);

/* Flags of etp_ep_report_t. */
#define ETP_EP_FLAG_BAD_INDEX 0x1u         /* an index < -1 or >= E */
#define ETP_EP_FLAG_DUPLICATE 0x2u         /* an expert repeated in a row */
#define ETP_EP_FLAG_TRANSPORT_FULL 0x4u    /* a slab or the receive token buffer was full */
#define ETP_EP_FLAG_ROWS_FULL 0x8u         /* the layout's rows were full */
#define ETP_EP_FLAG_BAD_TOKENS 0x10u       /* a device T outside [0, max_tokens_per_rank] */

/* What this rank's layer dropped since creation or the last reset. */
typedef struct etp_ep_report {
    size_t size;                   /* sizeof(etp_ep_report_t) */
    uint32_t flags;                /* ETP_EP_FLAG_* raised */
    int64_t bad_index_slots;       /* slots with an index < -1 or >= E */
    int64_t duplicate_slots;       /* slots repeating an earlier expert of their row */
    int64_t transport_dropped_slots; /* slots of tokens that did not fit a transport buffer */
    int64_t rows_dropped_slots;    /* slots whose row did not fit the layout */
    int64_t transport_rows_needed; /* most token rows one transport buffer needed:
                                    * CAPACITY a slab, EXACT the receive buffer */
    int64_t rows_needed;           /* most rows the layout needed: PACKED the total,
                                    * FIXED_SLOTS per expert */
    int64_t prepares;              /* prepares whose counters are included */
} etp_ep_report_t;

#define ETP_EP_REPORT_INIT {sizeof(etp_ep_report_t), 0, 0, 0, 0, 0, 0, 0, 0}

/* Read the layer's counters as of the last prepare that has completed,
 * without blocking (a prepare still queued is not included). `report` may
 * be NULL. Under ETP_EP_OVERFLOW_ERROR a raised flag returns an error
 * naming the rank, the layer and the capacity needed:
 * ETP_ERR_INVALID_ARGUMENT for bad indices or T, ETP_ERR_CAPACITY for
 * a capacity exceeded. The report is filled in either case. */
ETP_API etp_status_t etp_ep_poll(etp_ep_layer_t *layer, etp_ep_report_t *report);

/* As etp_ep_poll, after waiting for the layer's last prepare (a host
 * block; not during a capture). */
ETP_API etp_status_t etp_ep_check(etp_ep_layer_t *layer, etp_ep_report_t *report);

/* Zero the layer's counters: enqueued on `stream` (capturable), and the
 * host copy at once. Clears the error state of ETP_EP_OVERFLOW_ERROR. */
ETP_API etp_status_t etp_ep_reset_report(etp_ep_layer_t *layer, etp_stream_t *stream);

#ifdef __cplusplus
}
#endif

#endif /* ETP_EP_H */
