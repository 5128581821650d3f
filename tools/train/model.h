/*
 * etp-train's model on etp: the layer stack of train_model.h with its
 * weights sharded by ETP (prefetching chains), its tokens routed by EP, its
 * GEMMs on etp/gemm.h and its small steps on moe_ops.h. Public API only.
 *
 * Ranks form a grid DP x EP x ETP, ETP fastest: rank = (dp * EP + ep) * ETP
 * + etp. Groups: the ETP group (same dp, ep; the chain's group, two roles),
 * the EP group (same dp, etp), the DP group (same ep, etp: expert gradients
 * are summed there) and the EDP group (same etp: dense and router
 * gradients are summed there). The sums (an all-gather and a sum in rank
 * order, so that every backend and split gives the same bits) are enqueued by the
 * parameters' grad-ready callbacks on the chain's reduction stream, so a
 * captured step captures them too.
 */
#ifndef TRAIN_MODEL_ETP_H
#define TRAIN_MODEL_ETP_H

#include "etp/etp.h"
#include "moe_ops.h"
#include "train_model.h"

typedef struct train_opts {
    train_shape_t shape;  /* shape.ep must equal ep */
    int etp, ep, dp;      /* the grid; etp * ep * dp = ranks */
    /* EXACT: PACKED layouts, counts copied to the host; CAPACITY and
     * NVLINK: FIXED_SLOTS layouts, counts on the device (capturable) */
    etp_ep_transport_t transport;
    /* rows per expert (FIXED_SLOTS) or per rank (PACKED) as a multiple of
     * the mean; 0: enough that no slot can be dropped */
    double capacity;
    etp_dtype_t combine_wire; /* ETP_DTYPE_F32 or ETP_DTYPE_BF16 (0, zeroed options: F32) */
    int resident;         /* every weight whole on every rank: no gathers */
    int graph;            /* the chain is made capturable (graphed) */
    int depth;            /* the chain's prefetch depth */
    size_t keep_bytes;    /* the chain's keep_bytes */
    int timing;           /* CUDA: events around every gather and EP call */
} train_opts_t;

typedef struct train_model train_model_t;

/* The options' rules (the grid is the ranks, E splits over EP, top-k <= E,
 * quantized sizes, every rank has tokens, --graph needs the capacity or
 * nvlink transport): ETP_SUCCESS, or ETP_ERR_INVALID_ARGUMENT with the reason in
 * why[n]. model_create applies them too. */
etp_status_t model_check_opts(const train_opts_t *o, int ranks, char *why, size_t n);

/* Collective over the context's world. */
etp_status_t model_create(etp_context_t *ctx, etp_stream_t *s, const train_opts_t *o,
                          train_model_t **m);
void model_destroy(train_model_t *m);

/* Load every weight from its seed (teacher: the teacher's), masters too;
 * Adam's moments and step count reset. Enqueued on the model's stream. */
etp_status_t model_init_weights(train_model_t *m, int teacher);

/* Make the data pool: inputs of every batch and the teacher's outputs on
 * them (the teacher's weights are loaded for that; load the student's
 * after). Blocks the host. */
etp_status_t model_make_data(train_model_t *m);

/* One training step's forward, loss and backward on batch `batch` (inputs
 * and targets copied into the step's fixed buffers first, outside any
 * graph): with `graph` the forward+backward is captured on the first call
 * with capture = 1 and replayed afterwards. Then Adam (step t = 1, 2 ...)
 * and mark_updated. *loss: the mean squared error of the step (blocks). */
etp_status_t model_step(train_model_t *m, int batch, int capture, double *loss);

typedef struct train_times {
    double step_ms;      /* host wall clock of the whole step */
    double fwdbwd_ms;    /* forward + backward on the stream (CUDA events; host: wall clock) */
    double gather_ms;    /* the stream's time in gathers (waiting for them): exposed */
    double exchange_ms;  /* the stream's time in EP calls */
    double optim_ms;
    int64_t dropped;     /* slots dropped by EP since the start, this rank */
    int64_t dropped_step; /* of which by this step (its forward's prepares) */
} train_times_t;

/* The last step's times (timing on, CUDA: per-call events; else zeros). */
void model_times(const train_model_t *m, train_times_t *t);

/* Hooks for the check and checkpoints. */
int model_step_count(const train_model_t *m);
/* The EP limits the model configured: the token rows an EP rank accepts
 * (recv_capacity_per_rank, at most EP x --tokens: what the nvlink and exact
 * transports drop by) and, for FIXED_SLOTS layouts (capacity, nvlink), the
 * rows per expert (0 for PACKED). */
void model_ep_limits(const train_model_t *m, int64_t *recv_tokens, int64_t *slots);
/* Copy this rank's FP32 main_grad shard of (layer, w) to host memory `dst`
 * [experts_local][shard_rows][cols] and say where it lies in the whole
 * tensor: expert0, row0, valid rows, shard rows, local experts. Blocks. */
etp_status_t model_grad_shard(train_model_t *m, int layer, train_weight_t w, float *dst,
                              int64_t *expert0, int64_t *experts, int64_t *row0,
                              int64_t *valid_rows, int64_t *shard_rows);
/* Bytes of the largest shard in FP32. */
size_t model_max_shard_bytes(const train_model_t *m);

/* Checkpoints: whole tensors in files of DIR, one file per (layer, weight,
 * kind); every rank writes or reads only its own shard rows, so a
 * checkpoint loads at any split. Collective (a barrier). */
etp_status_t model_save(train_model_t *m, const char *dir);
etp_status_t model_load(train_model_t *m, const char *dir);

#endif /* TRAIN_MODEL_ETP_H */
