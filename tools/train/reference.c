/*
 * etp-train's single-rank reference (reference.h): train_model.h's model in
 * plain loops. Every BF16 result is computed with the operations, in the
 * order, that etp's host backend uses, so that a one-ulp BF16 difference
 * cannot arise; the per-element math is moe_math.h's.
 */
#include "reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* combine_bwd's dot product: 256 lanes folded pairwise (docs/EP.md). */
enum { DOT_LANES = 256 };

static float bf(uint16_t h)
{
    return moe_bf16_to_f32(h);
}

/* ---- quantization (docs/FORMATS.md) ------------------------------------------ */

/* v rounded to the nearest value of a narrow float with `mbits` mantissa
 * bits, smallest normal exponent `emin` and subnormals below it, ties to
 * even, saturating at maxval (Inf included); the sign kept (-0 stays -0).
 * Within a binade the grid is the multiples of 2^(e - mbits), and an even
 * multiple has an even last mantissa bit, so rintf's ties-to-even is the
 * format's. */
static float round_narrow(float v, int mbits, int emin, float maxval)
{
    const float a = fabsf(v);
    float r;
    if (!(a <= maxval)) {
        r = maxval;
    } else if (a == 0.0f) {
        r = 0.0f;
    } else {
        int ex;
        (void)frexpf(a, &ex); /* a = f 2^ex, f in [0.5, 1) */
        int e = ex - 1;
        if (e < emin) e = emin;
        const float quantum = ldexpf(1.0f, e - mbits);
        r = rintf(a / quantum) * quantum; /* division by a power of two: exact */
    }
    return copysignf(r, v);
}

static float e4m3(float v)
{
    return round_narrow(v, 3, -6, 448.0f);
}

static float e2m1(float v)
{
    return round_narrow(v, 1, 0, 6.0f);
}

/* MXFP8's E8M0 scale code of a block: the smallest c with 2^(c - 127) >=
 * amax / 448 (amax times the FP32 reciprocal), within [0, 254]. */
static int e8m0_code(float amax)
{
    const float v = amax * (1.0f / 448.0f);
    if (v == 0.0f) return 0;
    int ex;
    const float f = frexpf(v, &ex);
    int c = (f == 0.5f ? ex - 1 : ex) + 127;
    return c < 0 ? 0 : c > 254 ? 254 : c;
}

/* The dequantized value of x in an MXFP8 E4M3 block of that amax. Finite
 * weights have codes below 254, whose multiplier 2^(127 - c) is exact. */
static float mxfp8_deq(float x, float amax)
{
    const int c = e8m0_code(amax);
    const float s = c == 0 ? 1.0f : ldexpf(1.0f, 127 - c);
    return e4m3(x * s) * ldexpf(1.0f, c - 127);
}

/* NVFP4's per-tensor constants from the tensor's amax. */
typedef struct {
    float s_dec, s_enc_6;
} nvfp4_t;

static nvfp4_t nvfp4_tensor(float amax)
{
    float s_enc = 2688.0f / amax;
    if (amax == 0.0f || !isfinite(s_enc) || s_enc == 0.0f) s_enc = 1.0f;
    nvfp4_t t = {1.0f / s_enc, s_enc * (1.0f / 6.0f)};
    return t;
}

static float nvfp4_deq(float x, float bamax, nvfp4_t t)
{
    const float sv = e4m3(bamax * t.s_enc_6); /* the block's decode scale */
    float mult = 1.0f / (sv * t.s_dec);
    if (!(mult < FLT_MAX)) mult = FLT_MAX;
    return e2m1(x * mult) * (sv * t.s_dec);
}

int ref_dequantize(train_quant_t q, int columnwise, const uint16_t *w, int64_t rows, int64_t cols,
                   uint16_t *out)
{
    if (rows < 0 || cols < 0 || (q != TRAIN_QUANT_NONE && q != TRAIN_QUANT_MXFP8 && q != TRAIN_QUANT_NVFP4)) {
        fprintf(stderr, "ref_dequantize: bad mode %d or shape [%lld, %lld]\n", (int)q,
                (long long)rows, (long long)cols);
        return -1;
    }
    if (q == TRAIN_QUANT_NONE) {
        memcpy(out, w, (size_t)(rows * cols) * sizeof *out);
        return 0;
    }
    const int64_t blk = q == TRAIN_QUANT_MXFP8 ? 32 : 16;
    if (cols % blk != 0) {
        fprintf(stderr, "ref_dequantize: cols %lld is not a multiple of the block %lld\n",
                (long long)cols, (long long)blk);
        return -1;
    }
    if (q == TRAIN_QUANT_MXFP8 && !columnwise) {
        /* 1x32 blocks along a row */
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j0 = 0; j0 < cols; j0 += 32) {
                float amax = 0.0f;
                for (int64_t j = j0; j < j0 + 32; j++) amax = fmaxf(amax, fabsf(bf(w[i * cols + j])));
                for (int64_t j = j0; j < j0 + 32; j++)
                    out[i * cols + j] = moe_f32_to_bf16(mxfp8_deq(bf(w[i * cols + j]), amax));
            }
    } else if (q == TRAIN_QUANT_MXFP8) {
        /* 32x1 blocks along a column from row 0; the rows past the end are
         * etp's zero padding */
        for (int64_t i0 = 0; i0 < rows; i0 += 32) {
            const int64_t i1 = i0 + 32 < rows ? i0 + 32 : rows;
            for (int64_t j = 0; j < cols; j++) {
                float amax = 0.0f;
                for (int64_t i = i0; i < i1; i++) amax = fmaxf(amax, fabsf(bf(w[i * cols + j])));
                for (int64_t i = i0; i < i1; i++)
                    out[i * cols + j] = moe_f32_to_bf16(mxfp8_deq(bf(w[i * cols + j]), amax));
            }
        }
    } else {
        /* NVFP4 16x16 blocks: both directions share them, so they
         * dequantize alike */
        float tamax = 0.0f;
        for (int64_t i = 0; i < rows * cols; i++) tamax = fmaxf(tamax, fabsf(bf(w[i])));
        const nvfp4_t t = nvfp4_tensor(tamax);
        for (int64_t i0 = 0; i0 < rows; i0 += 16) {
            const int64_t i1 = i0 + 16 < rows ? i0 + 16 : rows;
            for (int64_t j0 = 0; j0 < cols; j0 += 16) {
                float amax = 0.0f;
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = j0; j < j0 + 16; j++)
                        amax = fmaxf(amax, fabsf(bf(w[i * cols + j])));
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = j0; j < j0 + 16; j++)
                        out[i * cols + j] = moe_f32_to_bf16(nvfp4_deq(bf(w[i * cols + j]), amax, t));
            }
        }
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------------ */

struct ref_model {
    train_shape_t s;
    int L, E, K, ep;
    int etp, dp, ranks;          /* the etp run's grid: rank = (dp * ep + ep_i) * etp + etp_i */
    int64_t N, H, F;
    int64_t *off;                /* [ranks + 1]: rank r's tokens are n = off[r] .. off[r + 1] - 1 */
    /* per weight, index l * TRAIN_WEIGHTS + w */
    uint16_t **wt[2];            /* BF16 weights: student, teacher */
    uint16_t **wf, **wb;         /* what the forward / input-gradient products read */
    float **master, **m1, **m2, **grad;
    uint16_t **in, **tgt;        /* per batch, [N, H] */
    /* per layer, the forward's saved values */
    uint16_t **x, **u, **a, **sa, **o; /* x, u [N, H]; a, s [N k, F]; o [N k, H] */
    float **probs, **tw;         /* [N, E], [N, k] */
    int64_t **idx;               /* [N, k] */
    int *order;                  /* per layer and token, its slots in ascending expert order */
    ref_ep_t epc;                /* what EP drops and rounds */
    uint8_t **kept;              /* per layer [N, k]: the slot has a row (not dropped) */
    int64_t *fill;               /* [E / ep]: an EP rank's rows per local expert so far */
    int64_t dropped;             /* slots the last forward dropped */
    /* the current layer's GEMM output gradients, for its weight gradients */
    uint16_t *dgu, *ddz, *dgo, *dga; /* gu [N, H], dz [N, E]; go [N k, H], ga [N k, F] */
    /* scratch */
    uint16_t *y, *g, *gs, *gr, *gm, *gq, *gp;
    float *z, *gw, *acc;
    float *part, *psum;          /* one rank's partial and an ETP group's sum of a weight gradient */
    int64_t *rdy, *rx;           /* [N]: a partial's rows (dy row, x row) in sum order */
};

static int64_t wcount(const train_shape_t *s, train_weight_t w)
{
    int64_t e, r, c;
    train_weight_shape(s, w, &e, &r, &c);
    return e * r * c;
}

/* y[i, j] = bf16(sum_t x[i, t] w[j, t]): a row of x against a row of w,
 * fmaf from 0 over t ascending, as the host GEMM's forward. */
static float dot_rows(const uint16_t *x, const uint16_t *w, int64_t n)
{
    float acc = 0.0f;
    for (int64_t t = 0; t < n; t++) acc = fmaf(bf(x[t]), bf(w[t]), acc);
    return acc;
}

/* dx[t] = bf16(sum_j dy[j] w[j, t]) for t < k, w [n, k]: each element's sum
 * from 0 over j ascending, as the host GEMM's dgrad (acc: k floats of
 * scratch; the loops run j outside for contiguous reads). */
static void dgrad_row(const uint16_t *dy, const uint16_t *w, int64_t n, int64_t k, float *acc,
                      uint16_t *dx)
{
    for (int64_t t = 0; t < k; t++) acc[t] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float d = bf(dy[j]);
        for (int64_t t = 0; t < k; t++) acc[t] = fmaf(d, bf(w[j * k + t]), acc[t]);
    }
    for (int64_t t = 0; t < k; t++) dx[t] = moe_f32_to_bf16(acc[t]);
}

/* dW[j, t] = fmaf(dy[j], x[t], dW[j, t]) for one row: the host GEMM's
 * wgrad, one row of its sum (the caller goes through the rows in its
 * order). */
static void wgrad_row(float *dw, const uint16_t *dy, const uint16_t *x, int64_t n, int64_t k)
{
    for (int64_t j = 0; j < n; j++) {
        const float d = bf(dy[j]);
        for (int64_t t = 0; t < k; t++) dw[j * k + t] = fmaf(d, bf(x[t]), dw[j * k + t]);
    }
}

/* ---- weight gradients in etp's order ---------------------------------------------- */

/* dst = src (first) or dst + src: one FP32 add per element. */
static void add_into(float *dst, const float *src, int64_t c, int first)
{
    for (int64_t i = 0; i < c; i++) dst[i] = first ? src[i] : dst[i] + src[i];
}

/* One rank's partial of a weight gradient [n, k] into m->part: from 0 over
 * the rows of m->rdy / m->rx (cnt of them) in their order, as the host
 * GEMM's wgrad sums a rank's rows. */
static void partial(ref_model_t *m, int64_t cnt, const uint16_t *dy, int64_t n, const uint16_t *x,
                    int64_t k)
{
    memset(m->part, 0, (size_t)(n * k) * sizeof(float));
    for (int64_t i = 0; i < cnt; i++) wgrad_row(m->part, dy + m->rdy[i] * n, x + m->rx[i] * k, n, k);
}

/* A dense weight's gradient [n, k] into dw, from the rows dy [N, n] and x
 * [N, k] (one a token): each rank's partial over its own tokens; their sum
 * over each ETP group in etp order (etp_reduce_grad); those sums added over
 * the (dp, ep) groups in order dp * ep + ep_i (the EDP group's moe_sum). */
static void dense_wgrad(ref_model_t *m, float *dw, const uint16_t *dy, int64_t n, const uint16_t *x,
                        int64_t k)
{
    const int groups = m->ranks / m->etp;
    for (int q = 0; q < groups; q++) {
        for (int t = 0; t < m->etp; t++) {
            const int r = q * m->etp + t;
            int64_t cnt = 0;
            for (int64_t tok = m->off[r]; tok < m->off[r + 1]; tok++, cnt++) m->rdy[cnt] = m->rx[cnt] = tok;
            partial(m, cnt, dy, n, x, k);
            add_into(m->psum, m->part, n * k, t == 0);
        }
        add_into(dw, m->psum, n * k, q == 0);
    }
}

/* Expert e's gradient [n, k] into dw, from its rows' dy [N k, n] and x (per
 * slot [N k, k], or per token [N, k] when x_per_token): on the expert's
 * rank of EP group (dp, etp_i), the partial over the rows of the group's
 * tokens that chose e and kept their row, in (EP rank, token) order
 * (docs/EP.md); the sum over
 * etp of those (etp_reduce_grad); those sums over dp in order (the DP
 * group's moe_sum). */
static void expert_wgrad(ref_model_t *m, int l, int64_t e, float *dw, const uint16_t *dy, int64_t n,
                         const uint16_t *x, int64_t k, int x_per_token)
{
    const int64_t *idx = m->idx[l];
    for (int d = 0; d < m->dp; d++) {
        for (int t = 0; t < m->etp; t++) {
            int64_t cnt = 0;
            for (int q = 0; q < m->ep; q++) {
                const int r = (d * m->ep + q) * m->etp + t;
                for (int64_t tok = m->off[r]; tok < m->off[r + 1]; tok++)
                    for (int j = 0; j < m->K; j++)
                        if (idx[tok * m->K + j] == e && m->kept[l][tok * m->K + j]) {
                            m->rdy[cnt] = tok * m->K + j;
                            m->rx[cnt] = x_per_token ? tok : tok * m->K + j;
                            cnt++;
                        }
            }
            partial(m, cnt, dy, n, x, k);
            add_into(m->psum, m->part, n * k, t == 0);
        }
        add_into(dw, m->psum, n * k, d == 0);
    }
}

/* Layer l's weight gradients from the output gradients its backward kept. */
static void layer_wgrads(ref_model_t *m, int l)
{
    const int64_t H = m->H, F = m->F, E = m->E;
    float **gl = m->grad + l * TRAIN_WEIGHTS;
    dense_wgrad(m, gl[TRAIN_WP], m->dgu, H, m->x[l], H);
    dense_wgrad(m, gl[TRAIN_WR], m->ddz, E, m->u[l], H);
    for (int64_t e = 0; e < E; e++) {
        expert_wgrad(m, l, e, gl[TRAIN_W1] + e * F * H, m->dga, F, m->u[l], H, 1);
        expert_wgrad(m, l, e, gl[TRAIN_W2] + e * H * F, m->dgo, H, m->sa[l], F, 0);
    }
}

/* The dequantized copies a pass reads, of every weight in `src`. */
static void dequant_all(ref_model_t *m, uint16_t **src, uint16_t **dst, int columnwise)
{
    for (int l = 0; l < m->L; l++)
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            int64_t e, r, c;
            train_weight_shape(&m->s, (train_weight_t)w, &e, &r, &c);
            const int i = l * TRAIN_WEIGHTS + w;
            for (int64_t x = 0; x < e; x++)
                (void)ref_dequantize(m->s.quant, columnwise, src[i] + x * r * c, r, c,
                                     dst[i] + x * r * c); /* sizes checked at creation */
        }
}

/* The EP combine of one token's rows (docs/EP.md): per EP rank d in order, a
 * partial over the token's kept rows there in ascending expert order
 * (weighted: fmaf(w, x, p); unweighted: p + x) from 0, rounded to BF16 with
 * a BF16 wire; the sum of the partials of the ranks the token went to, from
 * 0, in rank order. Element h. (A rank whose rows were all dropped adds a
 * partial of +0, which changes no sum that starts from +0.) */
static float combine_elem(const ref_model_t *m, const int *ord, const int64_t *idx,
                          const uint8_t *kept, const float *w, const uint16_t *rows, int64_t h)
{
    const int64_t local = m->E / m->ep;
    float acc = 0.0f;
    int q = 0;
    while (q < m->K) {
        const int64_t d = idx[ord[q]] / local;
        float part = 0.0f;
        for (; q < m->K && idx[ord[q]] / local == d; q++) {
            if (!kept[ord[q]]) continue;
            const float x = bf(rows[(int64_t)ord[q] * m->H + h]);
            part = w ? fmaf(w[ord[q]], x, part) : part + x;
        }
        acc = acc + (m->epc.wire_bf16 ? bf(moe_f32_to_bf16(part)) : part);
    }
    return acc;
}

/* Layer l's kept slots under m->epc's limits (reference.h), per EP group
 * (dp d, etp t) and destination EP rank p; returns the slots dropped. */
static int64_t ep_drops(ref_model_t *m, int l)
{
    const int K = m->K;
    const int64_t local = m->E / m->ep, cap = m->epc.recv_tokens, S = m->epc.slots;
    const int64_t *idx = m->idx[l];
    uint8_t *kept = m->kept[l];
    int64_t dropped = 0;
    memset(kept, 1, (size_t)(m->N * K));
    for (int d = 0; d < m->dp; d++)
        for (int t = 0; t < m->etp; t++)
            for (int p = 0; p < m->ep; p++) {
                int64_t taken = 0;
                for (int64_t e = 0; e < local; e++) m->fill[e] = 0;
                for (int q = 0; q < m->ep; q++) {
                    const int r = (d * m->ep + q) * m->etp + t;
                    for (int64_t tok = m->off[r]; tok < m->off[r + 1]; tok++) {
                        int to_p = 0;
                        for (int j = 0; j < K; j++) to_p |= idx[tok * K + j] / local == p;
                        if (!to_p) continue;
                        const int accepted = cap == 0 || taken < cap;
                        taken++;
                        for (int j = 0; j < K; j++) {
                            if (idx[tok * K + j] / local != p) continue;
                            const int64_t e = idx[tok * K + j] - p * local;
                            if (accepted && (S == 0 || m->fill[e] < S)) {
                                m->fill[e]++;
                            } else {
                                kept[tok * K + j] = 0;
                                dropped++;
                            }
                        }
                    }
                }
            }
    return dropped;
}

/* The model's forward with the weights `wts` (student or teacher) on
 * input [N, H], saving what the backward needs; the output into m->y. */
static void forward(ref_model_t *m, uint16_t **wts, const uint16_t *input)
{
    const int64_t N = m->N, H = m->H, F = m->F;
    const int E = m->E, K = m->K;
    dequant_all(m, wts, m->wf, 0);
    const uint16_t *cur = input;
    m->dropped = 0;
    for (int l = 0; l < m->L; l++) {
        uint16_t **wl = m->wf + l * TRAIN_WEIGHTS;
        uint16_t *x = m->x[l], *u = m->u[l];
        memcpy(x, cur, (size_t)(N * H) * sizeof *x);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t i = 0; i < H; i++) {
                const float p = bf(moe_f32_to_bf16(dot_rows(x + n * H, wl[TRAIN_WP] + i * H, H)));
                u[n * H + i] = moe_f32_to_bf16(bf(x[n * H + i]) + p);
            }
            for (int e = 0; e < E; e++) m->z[e] = dot_rows(u + n * H, wl[TRAIN_WR] + e * H, H);
            int64_t *idx = m->idx[l] + n * K;
            float *w = m->tw[l] + n * K;
            moe_softmax_topk(m->z, E, K, m->probs[l] + n * E, idx, w);
            int *ord = m->order + ((int64_t)l * N + n) * K;
            for (int j = 0; j < K; j++) { /* insertion sort by expert */
                int q = j;
                while (q > 0 && idx[ord[q - 1]] > idx[j]) {
                    ord[q] = ord[q - 1];
                    q--;
                }
                ord[q] = j;
            }
        }
        /* which slots get a row depends on every token's routing */
        m->dropped += ep_drops(m, l);
        for (int64_t n = 0; n < N; n++) {
            const int64_t *idx = m->idx[l] + n * K;
            const float *w = m->tw[l] + n * K;
            const uint8_t *kept = m->kept[l] + n * K;
            const int *ord = m->order + ((int64_t)l * N + n) * K;
            for (int j = 0; j < K; j++) {
                if (!kept[j]) continue;
                const int64_t e = idx[j], r = n * K + j;
                const uint16_t *w1 = wl[TRAIN_W1] + e * F * H, *w2 = wl[TRAIN_W2] + e * H * F;
                uint16_t *a = m->a[l] + r * F, *sa = m->sa[l] + r * F, *o = m->o[l] + r * H;
                for (int64_t f = 0; f < F; f++) {
                    a[f] = moe_f32_to_bf16(dot_rows(u + n * H, w1 + f * H, H));
                    sa[f] = moe_f32_to_bf16(moe_silu(bf(a[f])));
                }
                for (int64_t h = 0; h < H; h++) o[h] = moe_f32_to_bf16(dot_rows(sa, w2 + h * F, F));
            }
            for (int64_t h = 0; h < H; h++) {
                const float mm =
                    bf(moe_f32_to_bf16(combine_elem(m, ord, idx, kept, w, m->o[l] + n * K * H, h)));
                m->y[n * H + h] = moe_f32_to_bf16(bf(u[n * H + h]) + mm);
            }
        }
        cur = m->y;
    }
}

/* The backward from m->g (dL/dy), writing the FP32 weight gradients. */
static void backward(ref_model_t *m)
{
    const int64_t N = m->N, H = m->H, F = m->F;
    const int E = m->E, K = m->K;
    dequant_all(m, m->wt[0], m->wb, 1);
    float lane[DOT_LANES];
    for (int l = m->L - 1; l >= 0; l--) {
        uint16_t **wl = m->wb + l * TRAIN_WEIGHTS;
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *g = m->g + n * H;
            const int64_t *idx = m->idx[l] + n * K;
            const float *w = m->tw[l] + n * K;
            const uint8_t *kept = m->kept[l] + n * K;
            const int *ord = m->order + ((int64_t)l * N + n) * K;
            for (int j = 0; j < K; j++) {
                const int64_t e = idx[j], r = n * K + j;
                if (!kept[j]) { /* no row: no gradient through the slot */
                    m->gw[j] = 0.0f;
                    continue;
                }
                const uint16_t *o = m->o[l] + r * H, *a = m->a[l] + r * F;
                uint16_t *go = m->dgo + r * H, *gs = m->gs, *ga = m->dga + r * F, *gr = m->gr + j * H;
                /* combine_bwd: the row's gradient and its weight's */
                for (int64_t h = 0; h < H; h++) go[h] = moe_f32_to_bf16(w[j] * bf(g[h]));
                for (int q = 0; q < DOT_LANES; q++) {
                    float acc = 0.0f;
                    for (int64_t h = q; h < H; h += DOT_LANES) acc = fmaf(bf(g[h]), bf(o[h]), acc);
                    lane[q] = acc;
                }
                for (int s = DOT_LANES / 2; s >= 1; s /= 2)
                    for (int q = 0; q < s; q++) lane[q] = lane[q] + lane[q + s];
                m->gw[j] = lane[0];
                /* the expert: gs = go W2, ga, gr = ga W1 (dW2, dW1 from go, ga below) */
                dgrad_row(go, wl[TRAIN_W2] + e * H * F, H, F, m->acc, gs);
                for (int64_t f = 0; f < F; f++) ga[f] = moe_f32_to_bf16(moe_silu_grad(bf(a[f]), bf(gs[f])));
                dgrad_row(ga, wl[TRAIN_W1] + e * F * H, F, H, m->acc, gr);
            }
            /* dispatch_bwd: the unweighted combine of the rows' gradients */
            for (int64_t h = 0; h < H; h++)
                m->gm[h] = moe_f32_to_bf16(combine_elem(m, ord, idx, kept, NULL, m->gr, h));
            /* router */
            const float *probs = m->probs[l] + n * E;
            const float dot = moe_router_dot(probs, idx, m->gw, K);
            uint16_t *dz = m->ddz + n * E, *gu = m->dgu + n * H;
            for (int e = 0; e < E; e++)
                dz[e] = moe_f32_to_bf16(moe_router_dlogit(probs, idx, m->gw, K, dot, e));
            dgrad_row(dz, wl[TRAIN_WR], E, H, m->acc, m->gq);
            for (int64_t h = 0; h < H; h++)
                gu[h] = moe_f32_to_bf16((bf(g[h]) + bf(m->gm[h])) + bf(m->gq[h]));
            /* the projection and the residual */
            dgrad_row(gu, wl[TRAIN_WP], H, H, m->acc, m->gq);
            for (int64_t h = 0; h < H; h++)
                m->gp[n * H + h] = moe_f32_to_bf16(bf(gu[h]) + bf(m->gq[h]));
        }
        layer_wgrads(m, l);
        /* gx is the previous layer's g */
        memcpy(m->g, m->gp, (size_t)(N * H) * sizeof *m->g);
    }
}

/* ---- the API ---------------------------------------------------------------------- */

static int check_shape(const train_shape_t *s, int etp, int ep, int dp, int64_t *n_out)
{
    const char *why = NULL;
    int64_t n = 0;
    const int64_t big = 1 << 20;
    const int ranks = etp >= 1 && ep >= 1 && dp >= 1 && etp <= big && ep <= big && dp <= big &&
                              (int64_t)etp * ep * dp <= big
                          ? etp * ep * dp
                          : 0;
    if (s->layers < 1) why = "layers < 1";
    else if (s->hidden < 1 || s->ffn < 1) why = "hidden or ffn < 1";
    else if (s->experts < 1 || s->experts > 1024) why = "experts outside [1, 1024]";
    else if (s->topk < 1 || s->topk > s->experts) why = "topk outside [1, experts]";
    else if (s->ep < 1 || s->experts % s->ep != 0) why = "ep < 1 or not dividing experts";
    else if (s->pool < 1) why = "pool < 1";
    else if (ranks < 1) why = "etp, ep or dp < 1, or more than 2^20 ranks";
    else if (ep != s->ep) why = "the grid's ep is not the shape's";
    else if (s->quant != TRAIN_QUANT_NONE && s->quant != TRAIN_QUANT_MXFP8 && s->quant != TRAIN_QUANT_NVFP4)
        why = "unknown quant";
    else if (s->quant != TRAIN_QUANT_NONE &&
             (s->hidden % (s->quant == TRAIN_QUANT_MXFP8 ? 32 : 16) != 0 ||
              s->ffn % (s->quant == TRAIN_QUANT_MXFP8 ? 32 : 16) != 0))
        why = "hidden or ffn not a multiple of the quantization block";
    for (int r = 0; !why && r < ranks; r++) {
        const int64_t t = train_tokens(s, r);
        if (t < 0) why = "a rank with fewer than 0 tokens";
        n += t;
    }
    if (!why && n < 1) why = "no tokens";
    if (why) {
        fprintf(stderr, "ref_create: bad shape: %s (layers %d, H %lld, F %lld, E %d, k %d, ep %d, "
                        "pool %d; grid etp %d x ep %d x dp %d)\n",
                why, s->layers, (long long)s->hidden, (long long)s->ffn, s->experts, s->topk, s->ep,
                s->pool, etp, ep, dp);
        return -1;
    }
    *n_out = n;
    return 0;
}

/* count pointers, each to `each` zeroed elements of `size` bytes. Out of
 * memory clears *ok and leaves NULLs (ref_destroy frees what was made). */
static void **arr(int count, size_t each, size_t size, int *ok)
{
    void **p = calloc((size_t)count, sizeof *p);
    if (!p) {
        *ok = 0;
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        p[i] = calloc(each ? each : 1, size);
        if (!p[i]) *ok = 0;
    }
    return p;
}

static void free_arr(void **p, int count)
{
    if (!p) return;
    for (int i = 0; i < count; i++) free(p[i]);
    free(p);
}

int ref_create(const train_shape_t *shape, int etp, int ep, int dp, const ref_ep_t *ep_cfg,
               ref_model_t **out)
{
    int64_t N;
    if (!shape || !out) {
        fprintf(stderr, "ref_create: NULL argument\n");
        return -1;
    }
    if (check_shape(shape, etp, ep, dp, &N) != 0) return -1;
    const ref_ep_t no_limits = {0, 0, 0};
    if (!ep_cfg) ep_cfg = &no_limits;
    if (ep_cfg->recv_tokens < 0 || ep_cfg->slots < 0) {
        fprintf(stderr, "ref_create: negative EP limits (recv_tokens %lld, slots %lld)\n",
                (long long)ep_cfg->recv_tokens, (long long)ep_cfg->slots);
        return -1;
    }
    ref_model_t *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->s = *shape;
    m->epc = *ep_cfg;
    m->L = shape->layers;
    m->E = shape->experts;
    m->K = shape->topk;
    m->ep = ep;
    m->etp = etp;
    m->dp = dp;
    m->ranks = etp * ep * dp;
    m->N = N;
    m->H = shape->hidden;
    m->F = shape->ffn;
    const int NW = m->L * TRAIN_WEIGHTS;
    const int64_t H = m->H, F = m->F, E = m->E, K = m->K;
    const size_t rows = (size_t)(N * K);
    const int64_t big = F > H ? F : H;
    int ok = 1;
    /* per weight arrays, sized per weight below */
    uint16_t ***w16[4] = {&m->wt[0], &m->wt[1], &m->wf, &m->wb};
    float ***w32[4] = {&m->master, &m->m1, &m->m2, &m->grad};
    for (int a = 0; a < 4; a++) {
        *w16[a] = calloc((size_t)NW, sizeof(uint16_t *));
        *w32[a] = calloc((size_t)NW, sizeof(float *));
        if (!*w16[a] || !*w32[a]) goto oom;
    }
    for (int i = 0; i < NW; i++) {
        const size_t c = (size_t)wcount(shape, (train_weight_t)(i % TRAIN_WEIGHTS));
        for (int a = 0; a < 4; a++) {
            (*w16[a])[i] = calloc(c, sizeof(uint16_t));
            (*w32[a])[i] = calloc(c, sizeof(float));
            if (!(*w16[a])[i] || !(*w32[a])[i]) ok = 0;
        }
    }
    m->in = (uint16_t **)arr(shape->pool, (size_t)(N * H), sizeof(uint16_t), &ok);
    m->tgt = (uint16_t **)arr(shape->pool, (size_t)(N * H), sizeof(uint16_t), &ok);
    m->x = (uint16_t **)arr(m->L, (size_t)(N * H), sizeof(uint16_t), &ok);
    m->u = (uint16_t **)arr(m->L, (size_t)(N * H), sizeof(uint16_t), &ok);
    m->a = (uint16_t **)arr(m->L, rows * (size_t)F, sizeof(uint16_t), &ok);
    m->sa = (uint16_t **)arr(m->L, rows * (size_t)F, sizeof(uint16_t), &ok);
    m->o = (uint16_t **)arr(m->L, rows * (size_t)H, sizeof(uint16_t), &ok);
    m->probs = (float **)arr(m->L, (size_t)(N * E), sizeof(float), &ok);
    m->tw = (float **)arr(m->L, rows, sizeof(float), &ok);
    m->idx = (int64_t **)arr(m->L, rows, sizeof(int64_t), &ok);
    m->kept = (uint8_t **)arr(m->L, rows, sizeof(uint8_t), &ok);
    m->fill = calloc((size_t)E, sizeof(int64_t));
    m->order = calloc((size_t)m->L * rows, sizeof(int));
    m->y = calloc((size_t)(N * H), sizeof(uint16_t));
    m->g = calloc((size_t)(N * H), sizeof(uint16_t));
    m->gp = calloc((size_t)(N * H), sizeof(uint16_t));
    m->dgu = calloc((size_t)(N * H), sizeof(uint16_t));
    m->ddz = calloc((size_t)(N * E), sizeof(uint16_t));
    m->dgo = calloc(rows * (size_t)H, sizeof(uint16_t));
    m->dga = calloc(rows * (size_t)F, sizeof(uint16_t));
    m->gr = calloc((size_t)(K * H), sizeof(uint16_t));
    m->gs = calloc((size_t)big, sizeof(uint16_t));
    m->gm = calloc((size_t)H, sizeof(uint16_t));
    m->gq = calloc((size_t)H, sizeof(uint16_t));
    m->acc = calloc((size_t)big, sizeof(float));
    m->z = calloc((size_t)E, sizeof(float));
    m->gw = calloc((size_t)K, sizeof(float));
    /* the largest weight: H x max(H, F) per expert, or the router's E x H */
    const int64_t wmax = (big > E ? big : E) * H;
    m->part = calloc((size_t)wmax, sizeof(float));
    m->psum = calloc((size_t)wmax, sizeof(float));
    m->rdy = calloc((size_t)N, sizeof(int64_t));
    m->rx = calloc((size_t)N, sizeof(int64_t));
    m->off = calloc((size_t)m->ranks + 1, sizeof(int64_t));
    if (!ok || !m->in || !m->tgt || !m->x || !m->u || !m->a || !m->sa || !m->o || !m->probs ||
        !m->tw || !m->idx || !m->kept || !m->fill || !m->order || !m->y || !m->g || !m->gp || !m->dgu || !m->ddz ||
        !m->dgo || !m->dga || !m->gr || !m->gs || !m->gm || !m->gq || !m->acc || !m->z || !m->gw ||
        !m->part || !m->psum || !m->rdy || !m->rx || !m->off)
        goto oom;
    for (int r = 0; r < m->ranks; r++) m->off[r + 1] = m->off[r] + train_tokens(shape, r);

    /* weights and masters */
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < m->L; l++)
            for (int w = 0; w < TRAIN_WEIGHTS; w++) {
                const int i = l * TRAIN_WEIGHTS + w;
                const int64_t c = wcount(shape, (train_weight_t)w);
                const uint64_t tensor = train_tensor_weight(l, (train_weight_t)w, t);
                const float scale = train_weight_scale(shape, (train_weight_t)w, t);
                for (int64_t j = 0; j < c; j++)
                    m->wt[t][i][j] = moe_f32_to_bf16(moe_normal(shape->seed, tensor, (uint64_t)j) * scale);
                if (t == 0)
                    for (int64_t j = 0; j < c; j++) m->master[i][j] = bf(m->wt[0][i][j]);
            }
    /* the batches and their targets */
    for (int b = 0; b < shape->pool; b++) {
        const uint64_t tensor = train_tensor_input(b);
        for (int64_t j = 0; j < N * H; j++)
            m->in[b][j] = moe_f32_to_bf16(moe_normal(shape->seed, tensor, (uint64_t)j));
        forward(m, m->wt[1], m->in[b]);
        memcpy(m->tgt[b], m->y, (size_t)(N * H) * sizeof(uint16_t));
    }
    m->dropped = 0; /* the teacher's: ref_dropped speaks of steps */
    *out = m;
    return 0;
oom:
    fprintf(stderr, "ref_create: out of memory (N %lld tokens)\n", (long long)N);
    ref_destroy(m);
    return -1;
}

int ref_step(ref_model_t *m, int t, double *loss)
{
    if (!m || t < 0) {
        fprintf(stderr, "ref_step: %s\n", !m ? "NULL model" : "negative step");
        return -1;
    }
    const int64_t N = m->N, H = m->H;
    const int b = t % m->s.pool;
    forward(m, m->wt[0], m->in[b]);
    const float scale = train_loss_scale(N, H);
    double sum = 0.0;
    for (int64_t i = 0; i < N * H; i++) {
        const float y = bf(m->y[i]), tg = bf(m->tgt[b][i]);
        sum += moe_mse_term(y, tg);
        m->g[i] = moe_f32_to_bf16(moe_mse_grad(y, tg, scale));
    }
    if (loss) *loss = sum / ((double)N * (double)H);
    backward(m);
    const moe_adam_t a = train_adam(&m->s, t + 1);
    for (int i = 0; i < m->L * TRAIN_WEIGHTS; i++) {
        const int64_t c = wcount(&m->s, (train_weight_t)(i % TRAIN_WEIGHTS));
        for (int64_t j = 0; j < c; j++) {
            m->master[i][j] = moe_adam_step(&a, m->grad[i][j], &m->m1[i][j], &m->m2[i][j], m->master[i][j]);
            m->wt[0][i][j] = moe_f32_to_bf16(m->master[i][j]);
        }
    }
    return 0;
}

int64_t ref_dropped(const ref_model_t *m)
{
    return m ? m->dropped : 0;
}

const float *ref_grad(const ref_model_t *m, int layer, train_weight_t w)
{
    if (!m || layer < 0 || layer >= m->L || (int)w < 0 || w >= TRAIN_WEIGHTS) return NULL;
    return m->grad[layer * TRAIN_WEIGHTS + w];
}

const uint16_t *ref_weight(const ref_model_t *m, int layer, train_weight_t w)
{
    if (!m || layer < 0 || layer >= m->L || (int)w < 0 || w >= TRAIN_WEIGHTS) return NULL;
    return m->wt[0][layer * TRAIN_WEIGHTS + w];
}

void ref_destroy(ref_model_t *m)
{
    if (!m) return;
    const int NW = m->L * TRAIN_WEIGHTS;
    free_arr((void **)m->wt[0], NW);
    free_arr((void **)m->wt[1], NW);
    free_arr((void **)m->wf, NW);
    free_arr((void **)m->wb, NW);
    free_arr((void **)m->master, NW);
    free_arr((void **)m->m1, NW);
    free_arr((void **)m->m2, NW);
    free_arr((void **)m->grad, NW);
    free_arr((void **)m->in, m->s.pool);
    free_arr((void **)m->tgt, m->s.pool);
    free_arr((void **)m->x, m->L);
    free_arr((void **)m->u, m->L);
    free_arr((void **)m->a, m->L);
    free_arr((void **)m->sa, m->L);
    free_arr((void **)m->o, m->L);
    free_arr((void **)m->probs, m->L);
    free_arr((void **)m->tw, m->L);
    free_arr((void **)m->idx, m->L);
    free_arr((void **)m->kept, m->L);
    free(m->fill);
    free(m->order);
    free(m->y);
    free(m->g);
    free(m->dgu);
    free(m->ddz);
    free(m->dgo);
    free(m->dga);
    free(m->part);
    free(m->psum);
    free(m->rdy);
    free(m->rx);
    free(m->off);
    free(m->gs);
    free(m->gr);
    free(m->gm);
    free(m->gq);
    free(m->acc);
    free(m->gp);
    free(m->z);
    free(m->gw);
    free(m);
}
