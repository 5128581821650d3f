/*
 * The EP tests' single-rank reference, computed without etp from every
 * rank's inputs (each rank replays any rank's input from the shared seed),
 * and a runner that drives one layer through etp on device buffers
 * (etp_mem_alloc + copies, so it runs on the host and the CUDA backend) and
 * compares every output with the reference, bit for bit.
 *
 * The reference follows docs/EP.md literally: validity of slots, transport
 * drops (slab in source-token order; EXACT receive buffer in source-rank
 * order), expert rows in (source rank, token) order, PACKED / FIXED_SLOTS
 * capacity, FP32 pre-sum per (token, rank) in expert order then rank order,
 * one rounding, the 256-lane dot product.
 */
#ifndef ETP_TEST_EP_REF_H
#define ETP_TEST_EP_REF_H

#include <math.h>

#include "core/half.h"
#include "etp/ep.h"
#include "mpi_util.h"

enum { ROUTE_UNIFORM = 0, ROUTE_SKEWED = 1, ROUTE_BAD = 2 };

typedef struct {
    int R, me;
    int64_t E, L, H, tmax, cap;
    int maxk;
    etp_dtype_t dt;   /* the data calls' dtype (BF16 when mx) */
    int mx;           /* an MXFP8 group: token_dtype ETP_EP_TOKEN_MXFP8 */
    etp_ep_transport_t transport;
    etp_ep_overflow_t overflow;
    double cf;
    etp_dtype_t wire; /* combine_wire (0: F32) */
    /* from etp_ep_group_info (the test checks them separately); tok_cap is
     * what a rank accepts: EXACT's and NVLINK's drops, CAPACITY's slabs */
    int64_t slab, tok_cap;
} gcfg_t;

/* The transports the tests loop over, by index. */
enum { EP_TRANSPORTS = 3 };
static inline etp_ep_transport_t ep_transport(int i)
{
    return i == 0 ? ETP_EP_TRANSPORT_EXACT : i == 1 ? ETP_EP_TRANSPORT_CAPACITY : ETP_EP_TRANSPORT_NVLINK;
}

typedef struct {
    int k, align, weighted;
    etp_ep_layout_t layout;
    int64_t S;    /* FIXED_SLOTS slots per expert */
    int64_t rows; /* layer rows */
} lcfg_t;

/* What one rank's counters should read after one prepare. */
typedef struct {
    uint32_t flags;
    int64_t bad, dup, tdrop, rdrop, tneed, rneed;
} ref_stats_t;

typedef struct {
    int R;
    int64_t T[64];
    int64_t *idx[64];       /* [T_s * k] per source rank */
    int32_t *dest[64];      /* slot's destination rank, -1 none */
    int32_t *row[64];       /* slot's row on its destination, -1 none */
    int64_t *counts[64];    /* per destination: [L] kept */
    int64_t *offsets[64];   /* [L + 1] */
    int32_t *sent[64];      /* [T_s * R]: token crossed to d */
    ref_stats_t st[64];
} ref_t;

/* ---- inputs ------------------------------------------------------------- */

/* A value with a full 24-bit significand over 25 binades, so that FP32
 * sums round and their order shows (BF16 buffers round it once more, and
 * the reference does the same). */
static inline float ep_val(uint64_t tag, uint64_t a, uint64_t i)
{
    uint64_t r = tu_rand(g_seed, tag, a, i);
    float m = 1.0f + (float)(r & 0x7fffff) / 8388608.0f;
    int e = (int)((r >> 23) % 25) - 12;
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(m, e);
}

/* Token element i of rank s. MXFP8 groups get harder inputs for the
 * quantizer: each 32-element block scaled by its own power of two (2^-50 ..
 * 2^50, so block scales vary), some blocks all zero, and now and then NaN,
 * +-Inf, +-0, a value near the BF16 maximum, or an FP32 subnormal. */
static inline float ep_tok(uint64_t tag, uint64_t s, uint64_t i, int mx)
{
    float v = ep_val(tag, s, i);
    if (!mx) return v;
    uint64_t rb = tu_rand(g_seed, tag ^ 0x4242, s, i / 32);
    if (rb % 17 == 0) return 0.0f;
    v = ldexpf(v, (int)(rb % 101) - 50);
    switch (tu_rand(g_seed, tag ^ 0x3131, s, i) % 1009) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 0.0f;
    case 4: return -0.0f;
    case 5: return -3.0e38f;
    case 6: return 1.0e-40f;
    default: return v;
    }
}

static inline float ep_weight(uint64_t tag, uint64_t a, uint64_t i)
{
    uint64_t r = tu_rand(g_seed, tag ^ 0x77, a, i);
    return etp__bf16_to_f32(etp__f32_to_bf16((float)(r % 1000) / 997.0f + 0.01f));
}

/* Tokens of rank s in this step (0 sometimes, never above tmax). */
static inline int64_t ep_tokens(uint64_t tag, int s, int64_t tmax)
{
    uint64_t r = tu_rand(g_seed, tag ^ 0x5151, (uint64_t)s, 0);
    if (r % 5 == 0) return 0;
    if (r % 5 == 1) return tmax;
    return (int64_t)((r >> 8) % (uint64_t)(tmax + 1));
}

/* topk_idx of rank s: k distinct experts per row (uniform, or skewed toward
 * low experts), some slots -1; ROUTE_BAD adds out-of-range indices and
 * repeated experts. */
static inline void ep_route(uint64_t tag, int s, int64_t T, int k, int64_t E, int mode,
                            int64_t *idx)
{
    for (int64_t t = 0; t < T; t++) {
        int64_t *row = idx + t * k;
        for (int j = 0; j < k; j++) {
            int64_t e = -1;
            for (int tries = 0; tries < 1000; tries++) {
                uint64_t r = tu_rand(g_seed, tag, (uint64_t)s, (uint64_t)(t * k + j) * 1000 + tries);
                if (mode == ROUTE_SKEWED) {
                    /* Zipf-like: expert e with weight ~ 1/(e+1)^2 */
                    double u = (double)(r >> 11) / 9007199254740992.0;
                    e = (int64_t)floor((double)E * u * u * u);
                    if (e >= E) e = E - 1;
                } else {
                    e = (int64_t)(r % (uint64_t)E);
                }
                int dup = 0;
                for (int j2 = 0; j2 < j; j2++) dup |= row[j2] == e;
                if (!dup) break;
                e = -1;
            }
            row[j] = e;
        }
        for (int j = 0; j < k; j++) {
            uint64_t r = tu_rand(g_seed, tag ^ 0x99, (uint64_t)s, (uint64_t)(t * k + j));
            if (r % 7 == 0) row[j] = -1;
            if (mode == ROUTE_BAD) {
                if (r % 11 == 1) row[j] = E + (int64_t)(r >> 40) % 3;
                if (r % 11 == 2) row[j] = -2 - (int64_t)(r >> 40) % 5;
                if (r % 11 == 3 && j > 0) row[j] = row[0];
            }
        }
    }
}

/* ---- the reference ------------------------------------------------------ */

static inline void ref_free(ref_t *f)
{
    for (int s = 0; s < f->R; s++) {
        free(f->idx[s]);
        free(f->dest[s]);
        free(f->row[s]);
        free(f->counts[s]);
        free(f->offsets[s]);
        free(f->sent[s]);
    }
    memset(f, 0, sizeof *f);
}

static inline int64_t ref_max(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Every rank's routing for (tag), and the layout it must produce. */
static inline void ref_build(ref_t *f, const gcfg_t *g, const lcfg_t *l, uint64_t tag, int mode,
                             const int64_t *fixed_T)
{
    const int R = g->R, k = l->k;
    const int64_t L = g->L, E = g->E;
    memset(f, 0, sizeof *f);
    f->R = R;
    for (int s = 0; s < R; s++) {
        f->T[s] = fixed_T ? fixed_T[s] : ep_tokens(tag, s, g->tmax);
        int64_t T = f->T[s];
        f->idx[s] = calloc((size_t)(T * k + 1), sizeof(int64_t));
        f->dest[s] = calloc((size_t)(T * k + 1), sizeof(int32_t));
        f->row[s] = calloc((size_t)(T * k + 1), sizeof(int32_t));
        f->sent[s] = calloc((size_t)(T * R + 1), sizeof(int32_t));
        f->counts[s] = calloc((size_t)L, sizeof(int64_t));
        f->offsets[s] = calloc((size_t)L + 1, sizeof(int64_t));
        ep_route(tag, s, T, k, E, mode, f->idx[s]);
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < k; j++) {
                int64_t e = f->idx[s][t * k + j];
                f->dest[s][t * k + j] = -1;
                f->row[s][t * k + j] = -1;
                if (e == -1) continue;
                if (e < -1 || e >= E) {
                    f->st[s].bad++;
                    f->st[s].flags |= ETP_EP_FLAG_BAD_INDEX;
                    continue;
                }
                int dup = 0;
                for (int j2 = 0; j2 < j; j2++)
                    dup |= f->dest[s][t * k + j2] >= 0 && f->idx[s][t * k + j2] == e;
                if (dup) {
                    f->st[s].dup++;
                    f->st[s].flags |= ETP_EP_FLAG_DUPLICATE;
                    continue;
                }
                f->dest[s][t * k + j] = (int32_t)(e / L);
            }
    }
    /* transport: tokens s wants to send to d, kept per the transport's rule */
    int64_t C[64][64];
    for (int s = 0; s < R; s++)
        for (int d = 0; d < R; d++) {
            int64_t c = 0;
            for (int64_t t = 0; t < f->T[s]; t++) {
                int hit = 0;
                for (int j = 0; j < k; j++) hit |= f->dest[s][t * k + j] == d;
                if (!hit) continue;
                int keep = g->transport == ETP_EP_TRANSPORT_CAPACITY ? c < g->slab : 1;
                f->sent[s][t * R + d] = keep;
                if (!keep) {
                    for (int j = 0; j < k; j++) f->st[s].tdrop += f->dest[s][t * k + j] == d;
                    f->st[s].flags |= ETP_EP_FLAG_TRANSPORT_FULL;
                }
                c++;
            }
            C[s][d] = g->transport == ETP_EP_TRANSPORT_CAPACITY && c > g->slab ? g->slab : c;
            if (g->transport == ETP_EP_TRANSPORT_CAPACITY) f->st[s].tneed = ref_max(f->st[s].tneed, c);
        }
    /* EXACT and NVLINK: the receive buffer of tok_cap rows, in source rank order */
    if (g->transport != ETP_EP_TRANSPORT_CAPACITY)
        for (int d = 0; d < R; d++) {
            int64_t before = 0, total = 0;
            for (int s = 0; s < R; s++) total += C[s][d];
            for (int s = 0; s < R; s++) {
                int64_t room = ref_max(0, g->tok_cap - before), acc = C[s][d] < room ? C[s][d] : room;
                before += C[s][d];
                if (acc == C[s][d]) continue;
                f->st[s].tneed = ref_max(f->st[s].tneed, total);
                f->st[s].flags |= ETP_EP_FLAG_TRANSPORT_FULL;
                int64_t pos = 0;
                for (int64_t t = 0; t < f->T[s]; t++) {
                    if (!f->sent[s][t * R + d]) continue;
                    if (pos++ < acc) continue;
                    f->sent[s][t * R + d] = 0;
                    for (int j = 0; j < k; j++) f->st[s].tdrop += f->dest[s][t * k + j] == d;
                }
            }
        }
    /* layout on each destination: experts in order, rows in (s, t) order */
    const int64_t a = l->align > 1 ? l->align : 1;
    for (int d = 0; d < R; d++) {
        int64_t off = 0, need = 0, maxn = 0;
        for (int64_t e = 0; e < L; e++) {
            int64_t n = 0;
            for (int s = 0; s < R; s++)
                for (int64_t t = 0; t < f->T[s]; t++)
                    for (int j = 0; j < k; j++)
                        n += f->sent[s][t * R + d] && f->dest[s][t * k + j] == d &&
                             f->idx[s][t * k + j] - (int64_t)d * L == e;
            need += (n + a - 1) / a * a;
            maxn = ref_max(maxn, n);
            int64_t kept;
            if (l->layout == ETP_EP_LAYOUT_FIXED_SLOTS) {
                off = e * l->S;
                kept = n < l->S ? n : l->S;
            } else {
                kept = n < l->rows - off ? n : l->rows - off;
            }
            f->counts[d][e] = kept;
            f->offsets[d][e] = off;
            if (n > kept) {
                f->st[d].rdrop += n - kept;
                f->st[d].flags |= ETP_EP_FLAG_ROWS_FULL;
            }
            int64_t q = 0;
            for (int s = 0; s < R; s++)
                for (int64_t t = 0; t < f->T[s]; t++)
                    for (int j = 0; j < k; j++)
                        if (f->sent[s][t * R + d] && f->dest[s][t * k + j] == d &&
                            f->idx[s][t * k + j] - (int64_t)d * L == e) {
                            if (q < kept) f->row[s][t * k + j] = (int32_t)(off + q);
                            q++;
                        }
            if (l->layout == ETP_EP_LAYOUT_PACKED) off += (kept + a - 1) / a * a;
        }
        f->offsets[d][L] = l->layout == ETP_EP_LAYOUT_FIXED_SLOTS ? L * l->S : off;
        f->st[d].rneed = l->layout == ETP_EP_LAYOUT_FIXED_SLOTS ? (maxn + a - 1) / a * a : need;
    }
}

static inline float ep_get(const void *p, etp_dtype_t dt, int64_t i)
{
    return dt == ETP_DTYPE_BF16 ? etp__bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void ep_put(void *p, etp_dtype_t dt, int64_t i, float v)
{
    if (dt == ETP_DTYPE_BF16)
        ((uint16_t *)p)[i] = etp__f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* The 256-lane dot product of docs/EP.md. */
static inline float ref_dot(const float *x, const float *y, int64_t n)
{
    float lane[256];
    for (int l = 0; l < 256; l++) {
        float acc = 0.0f;
        for (int64_t h = l; h < n; h += 256) acc = fmaf(x[h], y[h], acc);
        lane[l] = acc;
    }
    for (int w = 128; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* Tags of the per-step data. */
enum { TAG_TOK = 1, TAG_W = 2, TAG_Y = 3, TAG_G = 4, TAG_GR = 5, TAG_GW = 6 };

/* Row r of the expert output on rank d (a function of (d, r), so any rank
 * can compute it); rows with no token hold data too, which must not leak. */
static inline float ep_y(uint64_t tag, int d, int64_t r, int64_t h, int64_t H)
{
    return ep_val(tag * 16 + TAG_Y, (uint64_t)d, (uint64_t)(r * H + h));
}

/* combine / dispatch_bwd on rank me: out[t] (FP32 before rounding is not
 * visible; returns the rounded value in the dtype via ep_put). in(d, r, h)
 * gives the expert-side row data, weighted uses the slot weights. */
typedef float (*ref_rows_fn)(uint64_t tag, int d, int64_t r, int64_t h, int64_t H);

static inline void ref_combine(const ref_t *f, const gcfg_t *g, const lcfg_t *l, uint64_t tag,
                               ref_rows_fn in, uint64_t in_tag, int weighted, void *out)
{
    const int R = g->R, k = l->k, me = g->me;
    const int64_t H = g->H;
    float *acc = malloc((size_t)H * sizeof(float)), *part = malloc((size_t)H * sizeof(float));
    for (int64_t t = 0; t < f->T[me]; t++) {
        for (int64_t h = 0; h < H; h++) acc[h] = 0.0f;
        for (int d = 0; d < R; d++) {
            if (!f->sent[me][t * R + d]) continue;
            for (int64_t h = 0; h < H; h++) part[h] = 0.0f;
            /* expert order = ascending expert index among this token's slots */
            int used[64] = {0};
            for (;;) {
                int best = -1;
                for (int j = 0; j < k; j++)
                    if (!used[j] && f->row[me][t * k + j] >= 0 && f->dest[me][t * k + j] == d &&
                        (best < 0 || f->idx[me][t * k + j] < f->idx[me][t * k + best]))
                        best = j;
                if (best < 0) break;
                used[best] = 1;
                int64_t r = f->row[me][t * k + best];
                float w = ep_weight(tag * 16 + TAG_W, (uint64_t)me, (uint64_t)(t * k + best));
                for (int64_t h = 0; h < H; h++) {
                    float x = in(in_tag, d, r, h, H);
                    if (g->dt == ETP_DTYPE_BF16) x = etp__bf16_to_f32(etp__f32_to_bf16(x));
                    part[h] = weighted ? fmaf(w, x, part[h]) : part[h] + x;
                }
            }
            /* the partial travels in the wire dtype */
            for (int64_t h = 0; h < H; h++)
                acc[h] += g->wire == ETP_DTYPE_BF16 ? etp__bf16_to_f32(etp__f32_to_bf16(part[h])) : part[h];
        }
        for (int64_t h = 0; h < H; h++) ep_put(out, g->dt, t * H + h, acc[h]);
    }
    free(acc);
    free(part);
}

#endif /* ETP_TEST_EP_REF_H */
