/*
 * etp-train's model and data, defined once for the etp program (model.c)
 * and its single-rank reference (reference.c). docs/TRAINING.md explains it.
 *
 * Model: `layers` layers; layer l maps x [T, H] (BF16) to x' [T, H]:
 *
 *   p  = x Wp^T                   dense projection, Wp [H, H]     (BF16 out)
 *   u  = x + p                    residual, one FP32 add rounded to BF16
 *   z  = u Wr^T                   router logits, Wr [E, H]         (FP32 out)
 *   probs, idx, w = softmax_topk(z)     moe_softmax_topk (moe_math.h)
 *   rows = dispatch(u)            EP: one row per (token, selected expert)
 *   a  = rows W1[e]^T             W1 [E][F, H]                     (BF16 out)
 *   s  = silu(a)                  moe_silu, rounded to BF16
 *   o  = s W2[e]^T                W2 [E][H, F]                     (BF16 out)
 *   m  = combine(o, w)            etp_ep_combine's order and rounding (docs/EP.md)
 *   x' = u + m                    one FP32 add rounded to BF16
 *
 * Every GEMM sums in FP32 from BF16 operands and rounds once. Loss over the
 * N tokens of all ranks: L = sum (y - target)^2 / (N H), y = x_layers;
 * the output gradient is moe_mse_grad with train_loss_scale. Backward, per
 * layer in reverse, from g = dL/dx':
 *
 *   go, gw = combine_bwd(g, o)     go = round(w g); gw[t, j] = <g_t, o_row> (docs/EP.md)
 *   gs = go W2        dW2 = go^T s          (per expert)
 *   ga = silu_grad(a, gs)                   rounded to BF16
 *   gr = ga W1        dW1 = ga^T rows
 *   gm = dispatch_bwd(gr)                   (the unweighted combine of gr)
 *   dz = router_bwd(probs, idx, gw)         moe_router_dlogit, rounded to BF16
 *   gq = dz Wr        dWr = dz^T u
 *   gu = (g + gm) + gq                      FP32 adds, one rounding
 *   gp = gu Wp        dWp = gu^T x
 *   gx = gu + gp                            one rounding; the previous layer's g
 *
 * Weight gradients are FP32. Adam (moe_adam_step) updates FP32 masters and
 * the BF16 weights are the rounded masters.
 */
#ifndef TRAIN_MODEL_H
#define TRAIN_MODEL_H

#include <math.h>
#include <stdint.h>

#include "moe_math.h"

typedef enum train_quant {
    TRAIN_QUANT_NONE = 0,
    TRAIN_QUANT_MXFP8 = 1, /* weights cross the wire in MXFP8; GEMMs read the BF16 dequantized */
    TRAIN_QUANT_NVFP4 = 2
} train_quant_t;

/* The weights of a layer, in chain (forward) order. */
typedef enum train_weight {
    TRAIN_WP = 0, /* [H, H] */
    TRAIN_WR = 1, /* [E, H] */
    TRAIN_W1 = 2, /* [E][F, H] */
    TRAIN_W2 = 3, /* [E][H, F] */
    TRAIN_WEIGHTS = 4
} train_weight_t;

typedef struct train_shape {
    int layers;
    int64_t hidden, ffn; /* H, F */
    int experts, topk;   /* E, k */
    int64_t tokens;      /* T of rank 0; train_tokens() gives each rank's */
    int64_t tokens_step; /* rank r has tokens - (r % 3) * tokens_step */
    int pool;            /* batches of data, used in turn (step s: batch s % pool) */
    uint64_t seed;
    train_quant_t quant;
    int ep;              /* the EP group size: combine's sums follow it (docs/EP.md) */
    float lr, beta1, beta2, eps;
} train_shape_t;

static inline int64_t train_tokens(const train_shape_t *s, int rank)
{
    return s->tokens - (int64_t)(rank % 3) * s->tokens_step;
}

/* Shape of weight w: experts (1 for dense), rows, cols. */
static inline void train_weight_shape(const train_shape_t *s, train_weight_t w, int64_t *experts,
                                      int64_t *rows, int64_t *cols)
{
    switch (w) {
    case TRAIN_WP: *experts = 1, *rows = s->hidden, *cols = s->hidden; break;
    case TRAIN_WR: *experts = 1, *rows = s->experts, *cols = s->hidden; break;
    case TRAIN_W1: *experts = s->experts, *rows = s->ffn, *cols = s->hidden; break;
    default: *experts = s->experts, *rows = s->hidden, *cols = s->ffn; break;
    }
}

/* Random streams (moe_normal's tensor ids). Element (e, i, j) of a weight
 * [experts][rows][cols] is index (e * rows + i) * cols + j; element
 * (n, j) of a batch's inputs is n * H + j, n the token's place among the
 * tokens of all ranks (rank 0's first). */
static inline uint64_t train_tensor_weight(int layer, train_weight_t w, int teacher)
{
    return ((uint64_t)(teacher ? 2 : 1) << 32) + (uint64_t)layer * 16u + (uint64_t)w;
}

static inline uint64_t train_tensor_input(int batch)
{
    return ((uint64_t)3 << 32) + (uint64_t)batch;
}

/* Weights are moe_normal times this: 1/sqrt(cols) keeps each GEMM's
 * output at its input's scale; the projection and W2 are smaller (the
 * residual stream stays O(1)); the teacher's are 1.5x the student's. */
static inline float train_weight_scale(const train_shape_t *s, train_weight_t w, int teacher)
{
    int64_t e, r, c;
    train_weight_shape(s, w, &e, &r, &c);
    float base = (float)(1.0 / sqrt((double)c));
    if (w == TRAIN_WP || w == TRAIN_W2) base *= 0.5f;
    return teacher ? base * 1.5f : base;
}

/* Inputs are moe_normal, unscaled, rounded to BF16. */

/* 2 / (N H): the output gradient's scale (N tokens of all ranks). */
static inline float train_loss_scale(int64_t n_tokens, int64_t hidden)
{
    return (float)(2.0 / ((double)n_tokens * (double)hidden));
}

/* Adam's defaults. lr: a step moves each weight by about the rate, and the
 * weights' scale is 1/sqrt(fan-in). eps: the largest weight gradients of
 * this loss are 1e-3 to 1e-1; below 1e-6 a gradient is at the FP32
 * rounding of the sums across ranks, and a smaller eps would step it by
 * the full rate, either way. */
static inline void train_adam_defaults(train_shape_t *s)
{
    s->lr = (float)(0.05 / sqrt((double)s->hidden));
    s->beta1 = 0.9f;
    s->beta2 = 0.999f;
    s->eps = 1e-6f;
}

/* Adam's constants at step t (1, 2, ...). */
static inline moe_adam_t train_adam(const train_shape_t *s, int t)
{
    moe_adam_t a;
    a.lr = s->lr;
    a.beta1 = s->beta1;
    a.beta2 = s->beta2;
    a.eps = s->eps;
    a.bc1 = (float)(1.0 - pow((double)s->beta1, (double)t));
    a.bc2 = (float)(1.0 - pow((double)s->beta2, (double)t));
    return a;
}

#endif /* TRAIN_MODEL_H */
