/*
 * The arithmetic of etp-train's model, per element and per token, written
 * once for the host and the device: the CUDA kernels (moe_ops_cuda.cu),
 * the host backend's loops (moe_ops_host.c) and the single-rank reference
 * (reference.c) all call these, so the three differ only in how they spread
 * the work. docs/TRAINING.md states the model these implement.
 *
 * Every FP32 operation is one IEEE operation (the CUDA file is compiled
 * with --fmad=false); expf is the platform's, so host and device may differ
 * in the last bit of a softmax or SiLU (the GPU check has a BF16
 * tolerance; the host backend and the reference share the host's expf).
 */
#ifndef MOE_MATH_H
#define MOE_MATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MOE_HD static inline __host__ __device__
#else
#include <math.h>
#define MOE_HD static inline
#endif

/* ---- BF16 --------------------------------------------------------------- */

MOE_HD float moe_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
MOE_HD uint16_t moe_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- counter-based random numbers ----------------------------------------- */

MOE_HD uint64_t moe_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A normal-ish value of mean 0 and variance 1 for (seed, tensor, index):
 * the sum of four uniforms on a 2^-24 grid, centred and scaled. Integer
 * steps, exact conversions and single rounded FP32 operations only (the
 * sums of two 24-bit integers may round), so the host and the device make
 * the same bits; any rank can make any element of any tensor without the
 * others. */
MOE_HD float moe_normal(uint64_t seed, uint64_t tensor, uint64_t index)
{
    uint64_t a = moe_mix64(seed ^ moe_mix64(tensor * 0x100000001b3ull + 0x51ull));
    uint64_t h1 = moe_mix64(a ^ (index * 2u));
    uint64_t h2 = moe_mix64(a ^ (index * 2u + 1u));
    float s = (float)(h1 >> 40) + (float)((h1 >> 16) & 0xffffffu); /* each < 2^24: converts exactly */
    float t = (float)(h2 >> 40) + (float)((h2 >> 16) & 0xffffffu);
    float u = (s + t) * 5.9604644775390625e-8f; /* 2^-24: the sum of four uniforms in [0, 4) */
    return (u - 2.0f) * 1.7320508075688772f;    /* variance 4/12 -> 1 */
}

/* ---- router: softmax and top-k of one token --------------------------------- */

/* probs[i] = exp(l_i - max) / sum, the sum in index order. Then the k
 * largest probabilities, largest first, ties to the lower expert index:
 * idx[j] and w[j] = probs[idx[j]] (the weights are not renormalized).
 * k <= E <= 1024. */
MOE_HD void moe_softmax_topk(const float *logits, int E, int k, float *probs, int64_t *idx,
                             float *w)
{
    float m = logits[0];
    for (int i = 1; i < E; i++) m = logits[i] > m ? logits[i] : m;
    float sum = 0.0f;
    for (int i = 0; i < E; i++) {
        probs[i] = expf(logits[i] - m);
        sum = sum + probs[i];
    }
    for (int i = 0; i < E; i++) probs[i] = probs[i] / sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < E; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= idx[q] == i;
            if (taken) continue;
            if (best < 0 || probs[i] > probs[best]) best = i;
        }
        idx[j] = best;
        w[j] = probs[best];
    }
}

/* The gradient of the logits of one token from the gradients gw[j] of its
 * top-k weights: with gp_i = gw[j] where i = idx[j] (else 0) and
 * dot = sum over j (ascending) of gw[j] * probs[idx[j]],
 * dlogits[i] = probs[i] * (gp_i - dot). */
MOE_HD float moe_router_dot(const float *probs, const int64_t *idx, const float *gw, int k)
{
    float dot = 0.0f;
    for (int j = 0; j < k; j++) dot = dot + gw[j] * probs[idx[j]];
    return dot;
}

MOE_HD float moe_router_dlogit(const float *probs, const int64_t *idx, const float *gw, int k,
                               float dot, int i)
{
    float gp = 0.0f;
    for (int j = 0; j < k; j++)
        if (idx[j] == i) gp = gw[j];
    return probs[i] * (gp - dot);
}

/* ---- SiLU ------------------------------------------------------------------- */

MOE_HD float moe_sigmoid(float a)
{
    return 1.0f / (1.0f + expf(-a));
}

/* s = a * sigmoid(a) */
MOE_HD float moe_silu(float a)
{
    return a * moe_sigmoid(a);
}

/* ga = gs * sigmoid(a) * (1 + a * (1 - sigmoid(a))) */
MOE_HD float moe_silu_grad(float a, float gs)
{
    float sg = moe_sigmoid(a);
    return gs * (sg * (1.0f + a * (1.0f - sg)));
}

/* ---- loss ------------------------------------------------------------------- */

/* Per element of the output y and the target: d = y - target; the loss adds
 * d*d (summed in FP64), the gradient is scale * d with scale = 2 / (N * H)
 * (N tokens of all ranks), rounded to BF16. */
MOE_HD float moe_mse_grad(float y, float target, float scale)
{
    return scale * (y - target);
}

/* The loss term of one element: (y - target)^2 in FP64, the difference too
 * (exact for BF16 values less than 2^45 apart in magnitude). */
MOE_HD double moe_mse_term(float y, float target)
{
    double d = (double)y - (double)target;
    return d * d;
}

/* ---- Adam ------------------------------------------------------------------- */

typedef struct moe_adam {
    float lr, beta1, beta2, eps;
    float bc1, bc2; /* 1 - beta1^t and 1 - beta2^t of this step t (>= 1) */
} moe_adam_t;

/* One element: m, v and the FP32 master move; returns the new master
 * (the caller rounds it to the BF16 weight). */
MOE_HD float moe_adam_step(const moe_adam_t *a, float g, float *m, float *v, float master)
{
    float mm = a->beta1 * *m + (1.0f - a->beta1) * g;
    float vv = a->beta2 * *v + (1.0f - a->beta2) * (g * g);
    *m = mm;
    *v = vv;
    float mh = mm / a->bc1;
    float vh = vv / a->bc2;
    return master - a->lr * (mh / (sqrtf(vh) + a->eps));
}

#endif /* MOE_MATH_H */
