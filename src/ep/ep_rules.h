/*
 * The rules of expert parallelism, per slot, per token, per row and per
 * element, written once for every backend: which slots are kept and where
 * a token goes, the transport's drop rules, the layout (offsets, kept rows,
 * each token's rows in expert order), and the arithmetic (element loads and
 * BF16 rounding, the order of every FP32 sum, the MXFP8 wire rows).
 * docs/EP.md states them; src/backend/ep_args.h names the arrays.
 *
 * Compiled for the host (src/ep/ep.c, the host backend's kernels in
 * src/backend/host/host_ep.c) and for the device (kernels/ep/ep.cu), as
 * quant/formats/qf_codec.h is for the quantization codecs: the backends
 * differ only in how they spread the work over threads (and in how they
 * add to the counters), so the host backend runs the GPU's rule code and
 * CI tests it. Plain static inline C, __host__ __device__ under nvcc. Every
 * FP32 operation is one IEEE operation or an explicit fmaf; kernels/ep/ep.cu
 * is compiled with --fmad=false so that nvcc contracts nothing the host
 * does not.
 */
#ifndef ETP__EP_RULES_H
#define ETP__EP_RULES_H

#include <stdint.h>

#include "backend/ep_args.h"
#include "quant/formats/qf_codec.h"

#ifdef __CUDACC__
#define ETP__EP_HD static inline __host__ __device__
#define ETP__EP_UNROLL _Pragma("unroll")
#else
#include <math.h>
#define ETP__EP_HD static inline
#define ETP__EP_UNROLL
#endif

ETP__EP_HD int64_t etp__ep_min(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* n / d for n >= 0, d >= 1. In 32 bits when both fit: on a GPU a 64-bit
 * division is a long software sequence, and the layout's serial offsets
 * chain two per local expert (the quotient is the same either way). */
ETP__EP_HD int64_t etp__ep_div(int64_t n, int64_t d)
{
    if (((uint64_t)n | (uint64_t)d) <= 0xffffffffu) return (int64_t)((uint32_t)n / (uint32_t)d);
    return n / d;
}

/* n rounded up to a multiple of a (n >= 0, a >= 1): a padded expert block. */
ETP__EP_HD int64_t etp__ep_round_up(int64_t n, int64_t a)
{
    if (a == 1) return n;
    return etp__ep_div(n + a - 1, a) * a;
}

/* ---- elements --------------------------------------------------------- */

ETP__EP_HD int64_t etp__ep_esize(int dtype)
{
    return dtype == ETP__EP_BF16 ? 2 : 4;
}

/* Element i of a BF16 or FP32 buffer, in FP32. */
ETP__EP_HD float etp__ep_load(const void *p, int dtype, int64_t i)
{
    if (dtype == ETP__EP_BF16) return etp__qf_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Store v, rounded to nearest even for BF16 (the one rounding of an output). */
ETP__EP_HD void etp__ep_store(void *p, int dtype, int64_t i, float v)
{
    if (dtype == ETP__EP_BF16)
        ((uint16_t *)p)[i] = etp__qf_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* ---- token side: slots, destinations, positions -------------------------- */

/* The T a kernel may use: route clamps the caller's T into [0, t_max] (and
 * flags it when it was outside); the later kernels clamp the stored value
 * again, so that no bound comes from device memory alone. */
ETP__EP_HD int64_t etp__ep_clamp_tokens(int64_t T, int64_t t_max)
{
    return T < 0 ? 0 : T > t_max ? t_max : T;
}

/* Slot acceptance for one token row idx[0 .. k): sd[j] = the rank that owns
 * expert idx[j] (idx / L), or -1 for an empty slot (-1), a bad index (< -1
 * or >= E: counted in *bad) or an expert an earlier kept slot of the row
 * selected (counted in *dup). */
ETP__EP_HD void etp__ep_route_token(const int64_t *idx, int k, int64_t E, int64_t L, int32_t *sd,
                                    int *bad, int *dup)
{
    *bad = 0;
    *dup = 0;
    for (int j = 0; j < k; j++) {
        const int64_t e = idx[j];
        sd[j] = -1;
        if (e == -1) continue;
        if (e < -1 || e >= E) {
            (*bad)++;
            continue;
        }
        int rep = 0;
        for (int j2 = 0; j2 < j && !rep; j2++) rep = sd[j2] >= 0 && idx[j2] == e;
        if (rep) {
            (*dup)++;
            continue;
        }
        sd[j] = (int32_t)etp__ep_div(e, L);
    }
}

/* The slots of a token (destinations sd[0 .. k)) that go to rank d: what
 * dropping its copy to d drops. */
ETP__EP_HD int etp__ep_slots_to(const int32_t *sd, int k, int d)
{
    int n = 0;
    for (int j = 0; j < k; j++) n += sd[j] == d;
    return n;
}

/* The send position of a token that is the pos-th (in token order) to go to
 * one rank, whose block holds `slab` token rows (EXACT: max_tokens_per_rank,
 * never full): pos, or -1 when the block is full (the token is dropped). */
ETP__EP_HD int32_t etp__ep_slab_pos(int64_t pos, int64_t slab)
{
    return pos < slab ? (int32_t)pos : -1;
}

/* Where the blocks of the R ranks start in a send or receive buffer, from
 * their token counts: CAPACITY at d * slab, EXACT back to back. */
ETP__EP_HD void etp__ep_block_bases(const int32_t *cnt, int R, int exact, int64_t slab,
                                    int32_t *base)
{
    int64_t b = 0;
    for (int d = 0; d < R; d++) {
        base[d] = (int32_t)(exact ? b : (int64_t)d * slab);
        b += cnt[d];
    }
}

/* The send buffer row of token t's copy to rank d (d < 0: none), or -1 when
 * it is not sent. */
ETP__EP_HD int64_t etp__ep_send_row(const int32_t *send_pos, const int32_t *send_base, int R,
                                    int64_t t, int d)
{
    const int32_t sp = d >= 0 ? send_pos[t * R + d] : -1;
    return sp < 0 ? -1 : (int64_t)send_base[d] + sp;
}

/* The routing metadata row token t sends to rank d (idx and sd: its k slots
 * and their destinations): per slot, the local expert it selects on d, -1
 * for a slot that goes elsewhere or nowhere. */
ETP__EP_HD void etp__ep_meta_row(const int64_t *idx, const int32_t *sd, int k, int d, int64_t L,
                                 int32_t *m)
{
    for (int j = 0; j < k; j++) m[j] = sd[j] == d ? (int32_t)(idx[j] - (int64_t)d * L) : -1;
}

/* The weight slot j of a token carries in its copy to rank d: its own for a
 * slot that goes to d, 0 for the others. */
ETP__EP_HD float etp__ep_slot_weight(const int32_t *sd, const float *w, int j, int d)
{
    return sd[j] == d ? w[j] : 0.0f;
}

/* NVLINK: the row of each destination's slabs (slab `me`, the sender's)
 * that the token at send position pos fills, and the row of the token's
 * rank that the expert side's answer for received row i (slab s = i /
 * t_max, position i % t_max) fills: the same numbering both ways. */
ETP__EP_HD int64_t etp__ep_nvl_row(int me, int64_t t_max, int64_t pos)
{
    return (int64_t)me * t_max + pos;
}

/* NVLINK: the value every rank's arrived[] and released[] words reach when
 * call n (1-based, counted on the device) is complete: each of the
 * `blocks` blocks of every rank adds 1 per call. */
ETP__EP_HD uint64_t etp__ep_nvl_mark(uint64_t n, int blocks)
{
    return n * (uint64_t)blocks;
}

/* ---- the exchange sizes --------------------------------------------------- */

/* The tokens rank s may send to rank d when d's receive buffer holds
 * tok_cap token rows (EXACT), filled in source rank order: C[s*R + d] (the
 * all-gathered counts) up to what the earlier sources left. */
ETP__EP_HD int64_t etp__ep_accepted(const int32_t *C, int R, int64_t tok_cap, int s, int d)
{
    int64_t before = 0;
    for (int s2 = 0; s2 < s; s2++) before += C[(int64_t)s2 * R + d];
    int64_t room = tok_cap - before;
    if (room < 0) room = 0;
    return etp__ep_min(C[(int64_t)s * R + d], room);
}

/* The clip cannot drop a token of rank s, whatever the counts (each rank
 * sends a rank at most t_max tokens): the ranks before s fill at most
 * s * t_max of tok_cap, and s's own t_max still fit. */
ETP__EP_HD int etp__ep_never_clipped(int s, int64_t t_max, int64_t tok_cap)
{
    return (int64_t)(s + 1) * t_max <= tok_cap;
}

/* EXACT's clip (NVLINK's too) of a token's copy to rank d, after the
 * counts are known: at or beyond what d accepts from this rank (acc =
 * etp__ep_accepted(C, R, tok_cap, me, d)) it loses its send position (*sp,
 * the token's to d); returns the slots that dropped (sd: the token's). */
ETP__EP_HD int etp__ep_clip_copy(int64_t acc, const int32_t *sd, int k, int d, int32_t *sp)
{
    if (*sp < acc) return 0;
    *sp = -1;
    return etp__ep_slots_to(sd, k, d);
}

/* The token rows every rank wanted to send to d: what d's receive buffer
 * would have needed. */
ETP__EP_HD int64_t etp__ep_wanted_by(const int32_t *C, int R, int d)
{
    int64_t n = 0;
    for (int s = 0; s < R; s++) n += C[(int64_t)s * R + d];
    return n;
}

/* ---- expert side: the layout ---------------------------------------------- */

/* Row i of the receive buffer holds a token: rows are in (source rank,
 * token) order in both transports; EXACT blocks are back to back, CAPACITY
 * slabs of `slab` rows have unused tails. */
ETP__EP_HD int etp__ep_recv_valid(const int32_t *recv_base, const int32_t *recv_cnt, int R,
                                  int exact, int64_t slab, int64_t i)
{
    if (exact) return i < (int64_t)recv_base[R - 1] + recv_cnt[R - 1];
    const int64_t s = etp__ep_div(i, slab);
    return i - s * slab < recv_cnt[s];
}

/* The local expert slot j of received row i selects (its metadata), or -1.
 * Route dropped repeated experts, so an expert appears in at most one slot
 * of a row. */
ETP__EP_HD int32_t etp__ep_recv_expert(const int32_t *meta, int k, int64_t L, int64_t i, int j)
{
    const int32_t e = meta[i * k + j];
    return e >= 0 && e < L ? e : -1;
}

/* What the layout needed: the report's rows_needed, and the rows dropped. */
typedef struct {
    int64_t needed, dropped;
} etp__ep_layout_need_t;

/* The layout from the rows each local expert got: counts[e] holds them on
 * entry and the kept rows on return; offsets[0 .. L] are written.
 * fixed_slots == 0 (PACKED): experts fill rows_cap in expert order, each
 * block padded to `align` (rows_cap is a multiple of it, so padded offsets
 * never pass it); later rows that do not fit are dropped. fixed_slots = S
 * (FIXED_SLOTS): expert e owns rows [e*S, (e+1)*S) and keeps its first S.
 * needed: PACKED the sum of the padded blocks, FIXED_SLOTS the largest
 * padded block. So where PACKED's padded blocks all fit, nothing is dropped
 * and the offsets are the exclusive sum of the padded counts: the GPU's
 * layout kernels take that case as a block scan (ep_dev.cuh:
 * block_layout_offsets) and call this for the rest. */
ETP__EP_HD etp__ep_layout_need_t etp__ep_layout_offsets(int32_t *counts, int32_t *offsets,
                                                        int64_t L, int64_t align,
                                                        int64_t fixed_slots, int64_t rows_cap)
{
    int64_t off = 0, need = 0, dropped = 0, maxn = 0;
    for (int64_t e = 0; e < L; e++) {
        const int64_t n = counts[e], padded = etp__ep_round_up(n, align);
        need += padded;
        if (n > maxn) maxn = n;
        int64_t kept;
        if (fixed_slots > 0) {
            off = e * fixed_slots;
            kept = etp__ep_min(n, fixed_slots);
        } else {
            kept = etp__ep_min(n, rows_cap - off);
        }
        offsets[e] = (int32_t)off;
        counts[e] = (int32_t)kept;
        dropped += n - kept;
        if (fixed_slots == 0) off += kept == n ? padded : etp__ep_round_up(kept, align);
    }
    offsets[L] = (int32_t)(fixed_slots > 0 ? L * fixed_slots : off);
    etp__ep_layout_need_t r;
    r.needed = fixed_slots > 0 ? etp__ep_round_up(maxn, align) : need;
    r.dropped = dropped;
    return r;
}

/* A received token's rows in ascending order (= expert order, the pre-sum's
 * order): out[0 .. m) the rows of recv_row[0 .. k) that are >= 0, sorted,
 * then -1 up to k. */
ETP__EP_HD void etp__ep_sort_rows(const int32_t *recv_row, int k, int32_t *out)
{
    int m = 0;
    for (int j = 0; j < k; j++) {
        const int32_t r = recv_row[j];
        if (r < 0) continue;
        int q = m++;
        while (q > 0 && out[q - 1] > r) {
            out[q] = out[q - 1];
            q--;
        }
        out[q] = r;
    }
    for (int q = m; q < k; q++) out[q] = -1;
}

/* The received weight row r carries (row_src[r] = its received slot, -1:
 * an empty row, weight 0; recv_w NULL: no weights, 0). */
ETP__EP_HD float etp__ep_row_weight(const float *recv_w, int32_t src)
{
    return src >= 0 && recv_w ? recv_w[src] : 0.0f;
}

/* ---- sums ----------------------------------------------------------------- */

/* One term of the expert side's pre-sum of a token's rows: weighted
 * fmaf(w, x, acc), unweighted acc + x. */
ETP__EP_HD float etp__ep_presum_step(float acc, int weighted, float w, float x)
{
    return weighted ? fmaf(w, x, acc) : acc + x;
}

/* A partial sum as it travels: FP32, or rounded once to BF16 (the
 * combine_wire of the group). */
ETP__EP_HD float etp__ep_wire_round(float v, int wire)
{
    return wire == ETP__EP_BF16 ? etp__qf_bf16_to_f32(etp__qf_f32_to_bf16(v)) : v;
}

/* Element h of received token i's FP32 partial: its rows in tok_rows order
 * (ascending, expert order), from 0 (stored as the wire dtype). */
ETP__EP_HD float etp__ep_presum_elem(const etp__ep_presum_args_t *a, int64_t i, int64_t h)
{
    const int32_t *rows = a->tok_rows + i * a->k;
    float acc = 0.0f;
    for (int m = 0; m < a->k; m++) {
        const int32_t r = rows[m];
        if (r < 0) break;
        const float x = etp__ep_load(a->in, a->dtype, (int64_t)r * a->hidden + h);
        acc = etp__ep_presum_step(acc, a->row_w != NULL, a->row_w ? a->row_w[r] : 0.0f, x);
    }
    return acc;
}

/* Element h of token t's sum: its partials in rank order, from 0 (0 for a
 * token with none), before the one rounding to the token dtype. */
ETP__EP_HD float etp__ep_reduce_elem(const etp__ep_reduce_args_t *a, int64_t t, int64_t h)
{
    float acc = 0.0f;
    for (int d = 0; d < a->ranks; d++) {
        const int64_t row = etp__ep_send_row(a->send_pos, a->send_base, a->ranks, t, d);
        if (row >= 0) acc = acc + etp__ep_load(a->partial, a->wire, row * a->hidden + h);
    }
    return acc;
}

/* Lane l of combine_bwd's fixed-order dot product of x and y (n elements
 * of dtype): h = l, l + LANES, ... in order with fmaf. */
ETP__EP_HD float etp__ep_dot_lane(const void *x, const void *y, int dtype, int64_t n, int l)
{
    float acc = 0.0f;
    for (int64_t h = l; h < n; h += ETP__EP_DOT_LANES)
        acc = fmaf(etp__ep_load(x, dtype, h), etp__ep_load(y, dtype, h), acc);
    return acc;
}

/* One step of the lanes' pairwise fold, for w = LANES/2, ..., 1 and every
 * l < w in turn: lane[0] ends with the dot product. */
ETP__EP_HD void etp__ep_dot_fold(float *lane, int l, int w)
{
    lane[l] = lane[l] + lane[l + w];
}

/* The weight gradient of token t's slot j, token side: what the expert rank
 * sent back for it, 0 for a slot with no destination or not sent. */
ETP__EP_HD float etp__ep_slot_grad(const etp__ep_wscatter_args_t *a, int64_t t, int j)
{
    const int32_t d = a->slot_dest[t * a->k + j];
    const int64_t row = etp__ep_send_row(a->send_pos, a->send_base, a->ranks, t, d);
    return row >= 0 ? a->g_recv[row * a->k + j] : 0.0f;
}

/* ---- MXFP8 wire rows -------------------------------------------------------- */

/* One block of ETP__EP_MX_BLOCK elements of a token row as MXFP8 rowwise
 * E4M3 (etp/quant.h's format, quant/formats/qf_codec.h's codecs): amax over
 * the non-NaN elements, scale code = E8M0 round-up of amax / 448, elements
 * E4M3 of x * 2^(127 - code). q gets the element codes; returns the scale.
 * A wire row holds the data at bytes [0, H), block b's scale at H + b, and
 * zeros up to ETP__EP_MX_ROW_BYTES(H). */
ETP__EP_HD uint8_t etp__ep_mx_block(const float *x, uint8_t *q)
{
    float amax = 0.0f;
    ETP__EP_UNROLL
    for (int c = 0; c < ETP__EP_MX_BLOCK; c++) amax = etp__qf_amax_step(amax, x[c]);
    const uint8_t e = etp__qf_mxfp8_scale(amax, etp__qf_mxfp8_inv_max(0));
    const float s = etp__qf_mxfp8_multiplier(e);
    ETP__EP_UNROLL
    for (int c = 0; c < ETP__EP_MX_BLOCK; c++) q[c] = etp__qf_mxfp8_encode_fast(x[c], s, 0);
    return e;
}

#endif /* ETP__EP_RULES_H */
