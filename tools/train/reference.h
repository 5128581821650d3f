/*
 * etp-train's single-rank reference: the model of train_model.h on one
 * process, in plain C with no etp call, for `etp-train --check`. It makes
 * the same data and weights as the etp program and reproduces etp's
 * arithmetic wherever it rounds to BF16 (the host GEMM's sum order, the EP
 * combine's per-rank partials, combine_bwd's lane dot product, the
 * quantized weights' dequantized values, and every weight gradient's sum
 * in the order of etp-train's grid: per rank, over the ETP group, over the
 * replicas), so that the host backend's gradients and losses match it bit
 * for bit.
 *
 * Quantized modes (TRAIN_QUANT_MXFP8 / _NVFP4): the forward product
 * (y = x W^T) reads the BF16 dequantization of the weight's rowwise
 * quantization, the input-gradient product (dx = dy W) that of its
 * columnwise quantization, per expert, as etp's gathers with
 * gather_dequantized do (docs/FORMATS.md: MXFP8 E4M3 1x32 / 32x1 blocks;
 * NVFP4 16x16 blocks with the expert's amax). The teacher's forward, which
 * makes the targets, reads its weights the same way.
 *
 * Not thread-safe per model; models are independent. Errors print one line
 * on stderr and return -1.
 */
#ifndef TRAIN_REFERENCE_H
#define TRAIN_REFERENCE_H

#include <stdint.h>

#include "train_model.h"

typedef struct ref_model ref_model_t;

/* What the etp run's EP groups drop and how combine's partials travel
 * (docs/EP.md), for the reference to do the same in every layer's forward
 * (the teacher's included). Per EP group and destination EP rank: the
 * tokens that select at least one of its experts are taken in (EP rank,
 * token) order, the first recv_tokens of them accepted and every slot of
 * the later ones to that rank dropped (the nvlink and exact transports'
 * receive capacity); then each expert keeps the first `slots` of its
 * accepted rows in that order and drops the rest (a FIXED_SLOTS layout).
 * A dropped slot has no row: it adds nothing to combine or dispatch_bwd,
 * its weight's gradient is 0, and its rows are in no weight gradient.
 * 0: no limit. wire_bf16: each EP rank's partial of combine and
 * dispatch_bwd is rounded to BF16 before the rank-order sum (combine_wire
 * BF16; 0: FP32). */
typedef struct ref_ep {
    int64_t recv_tokens, slots;
    int wire_bf16;
} ref_ep_t;

/* etp, ep, dp: the grid of the etp run (ep = shape->ep), whose ranks
 * number etp * ep * dp, rank (dp_i * ep + ep_i) * etp + etp_i; rank r has
 * train_tokens(shape, r) tokens, the global batch is all ranks' tokens,
 * rank 0's first. The weight gradients are summed as etp-train sums them
 * (docs/TRAINING.md): a dense weight's per rank over its tokens, then over
 * each ETP group in etp order, then over the (dp_i, ep_i) groups in order;
 * expert e's, on its EP rank of group (dp_i, etp_i), over the group's rows
 * that chose e in (EP rank, token) order, then over etp, then over dp; each
 * sum in FP32 one add (or fmaf) at a time. Makes the student (teacher = 0) and teacher weights
 * (moe_normal(seed, train_tensor_weight(l, w, teacher), (e*rows + i)*cols
 * + j) * train_weight_scale, rounded to BF16), the FP32 masters (the BF16
 * values), the inputs of the shape->pool batches
 * (bf16(moe_normal(seed, train_tensor_input(b), n*H + j))) and their
 * targets (the teacher model's forward output). ep_cfg (copied; NULL:
 * nothing dropped, FP32 partials) says what EP drops and rounds. The shape
 * is copied. Returns 0, or -1 (bad shape or negative limits: message on
 * stderr, *m untouched; out of memory). */
int ref_create(const train_shape_t *shape, int etp, int ep, int dp, const ref_ep_t *ep_cfg,
               ref_model_t **m);

/* One step t (0-based) on batch t % pool: forward, loss = sum (y -
 * target)^2 / (N H) (FP64), backward from the output gradient
 * bf16(moe_mse_grad(y, target, train_loss_scale(N, H))), the FP32 weight
 * gradients, then Adam (train_adam(shape, t + 1)) on every element of every
 * weight and the BF16 weights = bf16(master). *loss (may be NULL) gets the
 * loss before the update. Returns 0, or -1 for t < 0. */
int ref_step(ref_model_t *m, int t, double *loss);

/* The slots the last ref_step's forward dropped, over every layer and EP
 * group (what etp's EP reports count, summed over all ranks); 0 before the
 * first step. */
int64_t ref_dropped(const ref_model_t *m);

/* The FP32 gradient of weight w of layer l from the last ref_step (zeros
 * before the first), [experts][rows][cols]; owned by the model. NULL for a
 * layer or weight out of range. */
const float *ref_grad(const ref_model_t *m, int layer, train_weight_t w);

/* The current BF16 weights of the student, [experts][rows][cols]; owned by
 * the model. NULL for a layer or weight out of range. */
const uint16_t *ref_weight(const ref_model_t *m, int layer, train_weight_t w);

/* Frees everything; NULL is a no-op. */
void ref_destroy(ref_model_t *m);

/* The BF16 values a GEMM reads for one [rows, cols] matrix w (one expert)
 * quantized in mode q: the dequantized rowwise (columnwise = 0) or
 * columnwise (1) quantization (TRAIN_QUANT_NONE: w itself), into out
 * [rows, cols]. Rows need not be a multiple of the block: etp pads the
 * weight with zero rows, which change no block's amax. cols must be a
 * multiple of 32 (MXFP8) or 16 (NVFP4). Returns 0, or -1 (message on
 * stderr) for a bad size. */
int ref_dequantize(train_quant_t q, int columnwise, const uint16_t *w, int64_t rows, int64_t cols,
                   uint16_t *out);

#endif /* TRAIN_REFERENCE_H */
