/*
 * Arguments of the ep module's kernels (the table of kernels_ep.h), shared
 * by the host backend's kernels (src/backend/host/host_ep.c) and the CUDA
 * kernels (kernels/ep/ep.cu); each struct's comment defines what its kernel
 * computes, and the rules both apply are written once in src/ep/ep_rules.h.
 * Plain C, no dependencies.
 *
 * Notation: R ranks, `me` this rank, L local experts per rank, k the
 * layer's top-k, H the hidden size, T the tokens of this step (read on the
 * device from *t_dev, so it may change under a CUDA graph), T_max the
 * group's max_tokens_per_rank.
 *
 * Token side (the rank that owns the tokens):
 *   slot_dest[t*k + j]  destination rank of slot (t, j), -1: no expert/bad
 *   send_pos[t*R + d]   position of token t in its block to rank d, -1: not sent
 *   send_base[d]        first row of the block to d in the send buffer
 * Expert side (the rank that owns the experts):
 *   C[s*R + d]          tokens rank s wants to send to d (all-gathered)
 *   recv_cnt[s], recv_base[s]  tokens received from s and where they start
 *   recv_row[i*k + j]   row of the row space that slot j of received token
 *                       row i fills, -1: none (not local, or dropped)
 *   tok_rows[i*k + m]   the rows of received token i in ascending order
 *                       (= expert order), -1 after the last
 *   row_src[r]          i*k + j for the token slot that row r holds, -1: empty
 */
#ifndef ETP__EP_ARGS_H
#define ETP__EP_ARGS_H

#include <stdint.h>

/* Counters (int64, device); stats[0] holds the flags (ETP_EP_FLAG_*). */
enum {
    ETP__EP_ST_FLAGS = 0,
    ETP__EP_ST_BAD_INDEX = 1,
    ETP__EP_ST_DUPLICATE = 2,
    ETP__EP_ST_TRANSPORT_DROPPED = 3,
    ETP__EP_ST_ROWS_DROPPED = 4,
    ETP__EP_ST_TRANSPORT_NEEDED = 5, /* max */
    ETP__EP_ST_ROWS_NEEDED = 6,      /* max */
    ETP__EP_ST_PREPARES = 7,
    ETP__EP_ST_COUNT = 8
};

/* The same values as ETP_EP_FLAG_* of etp/ep.h. */
enum {
    ETP__EP_F_BAD_INDEX = 0x1,
    ETP__EP_F_DUPLICATE = 0x2,
    ETP__EP_F_TRANSPORT_FULL = 0x4,
    ETP__EP_F_ROWS_FULL = 0x8,
    ETP__EP_F_BAD_TOKENS = 0x10
};

/* Lanes of the fixed-order dot product of combine_bwd's weight gradient:
 * lane l sums h = l, l + LANES, ... in order with fmaf; then lanes are
 * added pairwise, lane l += lane l + w for w = LANES/2, ..., 1. */
#define ETP__EP_DOT_LANES 256

/* Token dtypes the kernels move (values of etp_dtype_t). */
enum { ETP__EP_BF16 = 4, ETP__EP_F32 = 5 };

/* MXFP8 dispatch (ETP_EP_TOKEN_MXFP8): a token row of H elements travels as
 * H E4M3 bytes, then H/32 E8M0 scale bytes, then zeros up to a multiple of
 * 16 bytes (so rows start 16-byte aligned for vector copies). H is a
 * multiple of ETP__EP_MX_BLOCK. */
#define ETP__EP_MX_BLOCK 32
#define ETP__EP_MX_ROW_BYTES(H) ((((H) + (H) / ETP__EP_MX_BLOCK) + 15) / 16 * 16)

/* Route: validate topk_idx, assign send positions, write the metadata rows
 * (local expert of each slot that targets d, -1 otherwise) into the send
 * buffer, count. Tokens t >= T get slot_dest -1 and send_pos -1.
 * exact: blocks back to back (send_base = prefix of send_cnt), slab =
 * T_max; else block d at d*slab, positions >= slab dropped (CAPACITY;
 * NVLINK has slab = T_max, so nothing is dropped here: clip does it as for
 * EXACT). slab_report: the slab's need goes into the report (CAPACITY).
 * Also counts one prepare in stats. A T outside [0, t_max] is clamped and
 * flagged. send_meta NULL: no metadata rows (NVLINK's exchange kernel,
 * etp__ep_xchg_args_t, stores them into the peers' windows). */
typedef struct etp__ep_route_args {
    const int64_t *topk_idx;
    const int32_t *t_in;  /* T on the device, or NULL: t_value */
    int64_t t_value;
    int32_t *t_dev;       /* out: T (clamped to [0, t_max]) for the later kernels */
    int64_t t_max, num_experts, local_experts, slab;
    int k, ranks, exact, slab_report;
    int32_t *slot_dest, *send_pos, *send_cnt, *send_base;
    int32_t *send_meta; /* [send rows * k] */
    int64_t *stats;
} etp__ep_route_args_t;

/* Exact transport, token side: after the counts are known, drop the tokens
 * beyond what each receiver accepts (its receive buffer holds tok_cap
 * token rows, filled in source rank order): send_pos -1, slots counted. */
typedef struct etp__ep_clip_args {
    const int32_t *C, *t_dev, *slot_dest;
    int64_t t_max, tok_cap;
    int k, ranks, me;
    int32_t *send_pos;
    int64_t *stats;
} etp__ep_clip_args_t;

/* Layout, expert side: received counts and bases (from C), per local expert
 * counts, kept rows and offsets, recv_row, tok_rows, row_src.
 * fixed_slots > 0: expert e owns rows [e*fixed_slots, ...); else packed.
 * The receive buffer has recv_rows token rows (EXACT: tok_cap back to back;
 * else R slabs of `slab` rows); tok_cap bounds what a rank accepts (EXACT's
 * rule, etp__ep_accepted; CAPACITY's slabs always fit it).
 * scratch: ETP__EP_LAYOUT_SCRATCH(local_experts, recv_rows) int32 of the
 * layer's memory that a kernel may use as it likes (the host's per-expert
 * cursors; the CUDA kernels' per-chunk counts), so that no backend needs
 * memory sized by the experts on a stack or per call.
 * mirror: when set, the counters (stats, ETP__EP_ST_COUNT of them) are
 * copied there once the layout has counted: the host's pinned mirror of
 * them, which the device writes directly on CUDA (layout ends prepare, so
 * no copy of its own follows). */
#define ETP__EP_LAYOUT_CHUNK 32  /* received rows a warp takes (CUDA, few experts) */
#define ETP__EP_LAYOUT_FEW_L 64  /* "few experts": a bit each in a uint64 */
#define ETP__EP_LAYOUT_FEW_K 32
#define ETP__EP_LAYOUT_FEW_R 64
#define ETP__EP_LAYOUT_SCRATCH(L, recv_rows)                                                \
    ((L) <= ETP__EP_LAYOUT_FEW_L && (recv_rows) > ETP__EP_LAYOUT_CHUNK                          \
         ? ((recv_rows) + ETP__EP_LAYOUT_CHUNK - 1) / ETP__EP_LAYOUT_CHUNK * (L)                \
         : (L))
/* The layout with few local experts applies (CUDA: chunk ballots). */
#define ETP__EP_LAYOUT_FEW(L, k, R, recv_rows)                                                \
    ((L) <= ETP__EP_LAYOUT_FEW_L && (k) <= ETP__EP_LAYOUT_FEW_K && (R) <= ETP__EP_LAYOUT_FEW_R && \
     (recv_rows) > ETP__EP_LAYOUT_CHUNK)
typedef struct etp__ep_layout_args {
    const int32_t *C, *recv_meta;
    int64_t tok_cap, recv_rows, slab, rows_cap, local_experts, alignment, fixed_slots;
    int k, ranks, me, exact;
    int32_t *recv_cnt, *recv_base, *counts, *offsets, *recv_row, *tok_rows, *row_src;
    int32_t *scratch;
    int64_t *stats;
    volatile int64_t *mirror;
    /* 1: the NVLink exchange kernel ran (xchg's `lay`), and where
     * ETP__EP_LAYOUT_FEW holds it counted the chunks (CUDA): the rest of
     * the layout remains */
    int after_exchange;
} etp__ep_layout_args_t;

/* Dispatch, token side: copy token t to row send_base[d] + send_pos[t*R+d]
 * of send_tok for every d it goes to; weights (optional) likewise, k per
 * row, 0 in slots that target another rank.
 * mx: tokens are BF16 (dtype); a token sent anywhere is quantized once to
 * MXFP8 rowwise E4M3 (each 32-element block by etp__ep_mx_block) and the
 * same ETP__EP_MX_ROW_BYTES(H) bytes go to each of its send rows. */
typedef struct etp__ep_pack_args {
    const void *tokens;
    const float *weights;
    const int32_t *t_dev, *slot_dest, *send_pos, *send_base;
    int64_t t_max, hidden;
    int k, ranks, dtype, mx;
    void *send_tok;
    float *send_w;
} etp__ep_pack_args_t;

/* Expand, expert side: row r of out = received token row_src[r] / k
 * (scaled by scale_w[r] in FP32 and rounded once, when scale_w is set), or
 * zero. out_w / keep_w (optional) get the slot's received weight (0 for
 * empty rows).
 * mx: received rows are MXFP8 (ETP__EP_MX_ROW_BYTES(H) bytes each); out
 * row r gets its H data bytes (at r * H), out_scales row r its H/32 scale
 * bytes (at r * H/32); both zero for empty rows. scale_w is NULL. */
typedef struct etp__ep_expand_args {
    const void *recv_tok;
    const float *recv_w, *scale_w;
    const int32_t *row_src;
    int64_t rows, hidden;
    int k, dtype, mx;
    void *out;
    void *out_scales;
    float *out_w, *keep_w;
} etp__ep_expand_args_t;

/* Pre-sum, expert side: partial[i] = sum over tok_rows of token i in order
 * of in[row] (weighted: fmaf(row_w[row], in[row], acc)) in FP32, stored as
 * the wire dtype (ETP__EP_F32, or ETP__EP_BF16: rounded once), for the
 * first ntok received token rows. */
typedef struct etp__ep_presum_args {
    const void *in;
    const float *row_w;
    const int32_t *tok_rows;
    int64_t ntok, hidden;
    int k, dtype, wire;
    void *partial;
} etp__ep_presum_args_t;

/* Reduce, token side: out[t] = round(sum over d in rank order of the
 * partial (of the wire dtype) at send_base[d] + send_pos[t*R+d], in FP32),
 * zero when none; t < T. */
typedef struct etp__ep_reduce_args {
    const void *partial;
    const int32_t *t_dev, *send_pos, *send_base;
    int64_t t_max, hidden;
    int ranks, dtype, wire;
    void *out;
} etp__ep_reduce_args_t;

/* Weight gradient, expert side, for the first ntok received token rows:
 * g[i*k + j] = (row = recv_row[i*k+j]) < 0 ? 0 :
 *   dot == 0: grad_row_w[row]
 *   dot == 1: the fixed-order dot product of recv_tok[i] and rows_in[row]. */
typedef struct etp__ep_wgrad_args {
    const int32_t *recv_row;
    const float *grad_row_w;
    const void *recv_tok, *rows_in;
    int64_t ntok, hidden;
    int k, dtype, dot;
    float *g;
} etp__ep_wgrad_args_t;

/* Weight gradient, token side: out[t*k + j] = g_recv[(send_base[d] +
 * send_pos[t*R+d]) * k + j] for d = slot_dest[t*k+j], 0 when the slot has
 * no destination or was not sent; t < T. */
typedef struct etp__ep_wscatter_args {
    const float *g_recv;
    const int32_t *t_dev, *slot_dest, *send_pos, *send_base;
    int64_t t_max;
    int k, ranks;
    float *out;
} etp__ep_wscatter_args_t;

/* ---- the NVLink transport (CUDA) ------------------------------------------
 *
 * Each rank's window (an NCCL symmetric window, the same layout on every
 * rank) holds at sig_off the flag words, uint64: arrived[s] (blocks of rank
 * s that finished storing into this rank) and released[d] (blocks of rank
 * d that finished reading what this rank stored there), at cnt_off the
 * count matrix C (R x R int32, row s stored by rank s), then at small_off
 * R slabs of t_max rows of small_row_bytes (weights, weight gradients) and
 * at tok_off R slabs of t_max rows of tok_row_bytes (token rows, partial
 * sums). Source rank s's rows land in slab s, at its send position, as in
 * the CAPACITY transport with a slab of t_max rows; a kernel stores into
 * peer d's slabs only after d released the previous call's rows (the
 * slabs are shared by every call of the group). The counters count per
 * call `blocks` arrivals from each rank; calls are counted on the device
 * (calls[0]), so a graph replays correctly. */

/* What a kernel was doing when a peer did not come (fault[1]). */
enum {
    ETP__EP_NVL_DISPATCH = 1,
    ETP__EP_NVL_COMBINE = 2,
    ETP__EP_NVL_DISPATCH_BWD = 3,
    ETP__EP_NVL_COMBINE_BWD = 4,
    ETP__EP_NVL_COMBINE_BWD_WEIGHTS = 5,
    ETP__EP_NVL_PREPARE = 6,
    ETP__EP_NVL_LL_DISPATCH = 7,
    ETP__EP_NVL_LL_COMBINE = 8
};
/* The kernels of a call, launched one by one (the backend's nvl_t2e and
 * nvl_e2t take one): the pre-sums into the stage (e2t only), the stores to
 * the peers, the receiving side's work. */
enum {
    ETP__EP_NVL_PHASE_SEND = 1,
    ETP__EP_NVL_PHASE_RECV = 2,
    /* e2t only, a low-latency layer's combine: the whole call in one kernel
     * of `blocks` blocks, the pre-sums stored straight into the peers (no
     * stage) */
    ETP__EP_NVL_PHASE_ALL = 3
};
/* nvl_open's num_sms for half the device's SMs (kernels_ep.h) */
#define ETP__EP_NVL_HALF_SMS (-1)
/* e2t's sending kernel: received rows a chunk counter counts */
#define ETP__EP_NVL_CHUNK 256
/* its counters: one a chunk of the R*t_max received rows (and one spare) */
#define ETP__EP_NVL_CHUNK_WORDS(rows) (((rows) + ETP__EP_NVL_CHUNK - 1) / ETP__EP_NVL_CHUNK + 1)
/* What it waited for (fault[2]). */
enum { ETP__EP_NVL_WAIT_RELEASE = 1, ETP__EP_NVL_WAIT_ARRIVAL = 2, ETP__EP_NVL_WAIT_LOCAL = 3 };

typedef struct etp__ep_nvl {
    char *const *peers;    /* [R], on the device: every rank's window, this rank's included */
    size_t sig_off, cnt_off, small_off, tok_off, small_row_bytes, tok_row_bytes;
    uint64_t *calls;       /* this rank's: [0] calls completed, [1] blocks done in the current */
    /* host-mapped pinned words, written by a kernel that gave up waiting:
     * [0] 1 + the rank it waited for (written last), [1] the call, [2] what
     * for, [3] claimed (the first kernel to give up writes the record) */
    int64_t *fault;
    int64_t timeout_ns;    /* 0: wait forever */
    int64_t t_max;
    /* blocks: the sending kernels' (num_sms); wide_blocks: the local
     * phases' (the whole device) */
    int blocks, wide_blocks, me, ranks;
} etp__ep_nvl_t;

/* NVLINK's prepare after route (positions, counts; route's metadata rows
 * not written) in one kernel: each block stores its tokens' metadata rows
 * (etp__ep_meta_row) into each destination's small slab (int32, row
 * me*t_max + send_pos, k a row), and this rank's send_cnt into row `me` of
 * every rank's count matrix; signals, waits for every rank, then copies
 * the count matrix into C and the small slabs into recv_meta (R*t_max rows
 * of k), applies the clip of etp__ep_clip_args_t to send_pos, and releases
 * the window. */
typedef struct etp__ep_xchg_args {
    etp__ep_nvl_t nvl;
    const int64_t *topk_idx;
    const int32_t *t_dev, *slot_dest, *send_cnt;
    int32_t *send_pos;
    int64_t local_experts, tok_cap;
    int k;
    int32_t *C, *recv_meta;
    int64_t *stats;
    /* the layout that follows (CUDA: where ETP__EP_LAYOUT_FEW holds, the
     * exchange kernel counts its chunks, from the routing rows in its
     * window, before it releases them) */
    etp__ep_layout_args_t lay;
} etp__ep_xchg_args_t;

/* Token side to expert side (dispatch, combine_bwd) in two kernels: the
 * sending one's `blocks` blocks store their tokens' rows into every
 * destination's token slab (row me*t_max + send_pos[t*R+d]; MXFP8: the
 * wire row of etp__ep_mx_block) and, when weights is set, the slot weights
 * into the small slab (etp__ep_slot_weight), and signal; the receiving one
 * (wide_blocks) waits for every rank's arrival, writes the expand of
 * etp__ep_expand_args_t (recv_tok and recv_w = its own slabs; recv_w only
 * when weights travel: carry) and releases. Where the expanded rows are
 * the tokens' exact bytes (not MXFP8, no scale_w, k <= 8) and the senders
 * take fewer than wide_blocks / 2 blocks (the SMs), the rank's own
 * tokens skip its slab: the sending kernel's further blocks write their
 * rows (and zero the rows without a token) from `tokens` directly, and the
 * receiving one expands the peers' rows only (nvl.cu: own_early). */
typedef struct etp__ep_t2e_args {
    etp__ep_nvl_t nvl;
    int call;
    const void *tokens;
    const float *weights;
    const int32_t *t_dev, *slot_dest, *send_pos;
    int64_t hidden;
    int k, dtype, mx, carry;
    const float *scale_w;
    const int32_t *row_src;
    const int32_t *tok_rows, *recv_cnt; /* the layout's, to expand by received token */
    int64_t rows;
    void *out, *out_scales;
    float *out_w, *keep_w;
} etp__ep_t2e_args_t;

/* Expert side to token side (combine, dispatch_bwd, and the weight
 * gradients of combine_bwd): for every received token row i = s * t_max +
 * p with p < recv_cnt[s], the pre-sum of etp__ep_presum_args_t (when `in`
 * is set; rounded to the wire dtype) goes to rank s's token slab me at row
 * p, and (when g_pre or grad_row_w is set) its k weight gradients to s's
 * small slab: g_pre[i*k + j], or etp__ep_wgrad_args_t's dot == 0 rule from
 * grad_row_w. After every rank arrived, the token side writes reduce's
 * `out` (when `in` is set) and wscatter's grad_topk (when weight gradients
 * travel), reading its own slabs (send_base[d] = d*t_max). Two kernels:
 * the sending one (`blocks` blocks store to the peers while the rest of
 * the device pre-sums into row i of `stage`, counted in chunk_done), the
 * token side's sums (wide_blocks; where vectorized, the rank's own
 * partials are read from `stage`, at the rows its slab would hold, and
 * not copied: nvl.cu's own_staged); or, for a low-latency layer's
 * combine, one (PHASE_ALL; no weight gradients travel; nvl.sig_off and
 * small_off unused): two token slabs, tok_half bytes apart, call n
 * (counted on the device) using slab n % 2, and two flag slabs at
 * flag_off (the same parity), each R x ETP__EP_LL_MAX_BLOCKS uint32:
 * word [s][b] is set to n (mod 2^32) by block b of rank s once its
 * pre-sums of call n are in. A token's slice is summed once the blocks
 * that pre-summed it have set theirs: no barrier of all ranks.
 * A rank stores call n + 2's partials into d's slabs only after its own
 * dispatch in between passed that dispatch's wait for every rank's
 * stores (the layer refuses a third dispatch before a combine, and a
 * group's calls run in one order on each rank), which d made after its
 * call n had read that slab: no release is waited for, or signalled. */
#define ETP__EP_LL_SLICE_GROUPS 128
#define ETP__EP_LL_MAX_BLOCKS 1024
typedef struct etp__ep_e2t_args {
    etp__ep_nvl_t nvl;
    int call;
    size_t tok_half, flag_off;
    const void *in;
    const float *row_w;
    const int32_t *tok_rows, *recv_cnt, *recv_row;
    const float *grad_row_w, *g_pre;
    int64_t hidden;
    int k, dtype, wire;
    const int32_t *t_dev, *slot_dest, *send_pos, *send_base;
    void *out;
    float *grad_topk;
    void *stage; /* this rank's: R*t_max partials of the wire dtype (when `in` is set) */
    uint32_t *chunk_done; /* ETP__EP_NVL_CHUNK_WORDS(R*t_max): zero at the sending kernel's
                           * start; the receiving kernel zeroes them again */
} etp__ep_e2t_args_t;

/* ---- low-latency layers (CUDA) --------------------------------------------
 *
 * The largest top-k and group a low-latency kernel takes (the kernel keeps
 * a token's slots and every rank's counts in shared memory); the ep module
 * refuses larger ones at layer creation.
 */
#define ETP__EP_LL_MAX_TOPK 16
#define ETP__EP_LL_MAX_RANKS 32

/* Low-latency dispatch in one kernel: prepare's route, the count
 * all-gather, EXACT's clip, the token stores, the layout and the expand of
 * etp__ep_route/clip/layout/expand_args_t, with T_max = nvl.t_max (the
 * layer's) and slabs of T_max rows (NVLINK's numbering: source s's token at
 * send position p is received row s * T_max + p).
 * The layer's window (nvl.peers, the same layout on every rank) holds:
 *   sig_off: 3R uint64 words, cnt[s] (rank s stored its counts here: one
 *     a call), tok[s] (blocks of rank s that stored their rows here:
 *     nvl.blocks a call) and rel[s] (rank s has read the rows stored into
 *     its slabs: one a call, at its end), counted from the layer's
 *     creation;
 *   cnt_off: 2 parities x R x R int32: call n's C[s*R + d] (the tokens s
 *     sends d, as route counts them), in parity n % 2, stored by s;
 *   small_off: R x T_max rows of k int32, the received metadata
 *     (etp__ep_meta_row); w_off: R x T_max rows of k FP32 (the slot
 *     weights, etp__ep_slot_weight) when carry;
 *   tok_off: R x T_max token rows of nvl.tok_row_bytes.
 * A rank stores a call's rows into rank d only after d released the
 * previous call's (rel), or, where the clip needs the counts first, after
 * d's counts of the same call arrived (d has begun that call, so it is
 * done with the previous one's rows). nvl.calls is the kernel's own: [0]
 * calls done, [1] blocks done in the current one, [2] the rank's block
 * barrier (blocks arrived, counted from creation). Stats as route/clip/layout count them
 * (one prepare a call). */
typedef struct etp__ep_ll_args {
    etp__ep_nvl_t nvl;
    size_t cnt_off, w_off;
    const int64_t *topk_idx;
    const int32_t *t_in; /* T on the device, or NULL: t_value */
    int64_t t_value;
    const void *tokens;
    const float *weights;
    int64_t num_experts, local_experts, tok_cap, hidden, rows_cap, alignment, fixed_slots;
    int k, dtype, carry;
    /* the half's routing and layout, named as in the structs above */
    int32_t *t_dev, *slot_dest, *send_pos, *send_cnt, *send_base, *recv_cnt, *recv_base;
    int32_t *counts, *offsets, *recv_row, *tok_rows, *row_src;
    void *out;    /* [rows_cap, H] */
    float *out_w; /* [rows_cap], when carry */
    int64_t *stats;
    /* the counters' host mirror (pinned, mapped): the kernel's last block
     * copies them there (no copy after it) */
    volatile int64_t *mirror;
} etp__ep_ll_args_t;

#endif /* ETP__EP_ARGS_H */
