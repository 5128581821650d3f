/*
 * Host kernels of the ep module (the table of ../kernels_ep.h; arguments
 * and what each computes in ../ep_args.h), enqueued on host streams with
 * etp__host_launch: each walks its work in plain loops and applies the
 * rules of src/ep/ep_rules.h, the same code the CUDA kernels
 * (kernels/ep/ep.cu) run, so the two agree bit for bit. Each runs as one
 * operation of its stream, so it reads T and counts written by earlier
 * operations of the stream when it runs.
 */
#include <stdlib.h>
#include <string.h>

#include "../kernels_ep.h"
#include "ep/ep_rules.h"
#include "host_internal.h"

static int64_t tokens_of(const int32_t *t_dev, int64_t t_max)
{
    return etp__ep_clamp_tokens(*t_dev, t_max);
}

static inline void stat_max(int64_t *stats, int which, int64_t v)
{
    if (stats[which] < v) stats[which] = v;
}

static inline void stat_drop(int64_t *stats, int which, int flag, int64_t n)
{
    stats[which] += n;
    stats[ETP__EP_ST_FLAGS] |= flag;
}

/* ---- route -------------------------------------------------------------- */

static void route_run(void *p)
{
    const etp__ep_route_args_t *a = p;
    const int R = a->ranks, k = a->k;
    int64_t *st = a->stats;
    const int64_t raw = a->t_in ? *a->t_in : a->t_value;
    const int64_t T = etp__ep_clamp_tokens(raw, a->t_max);
    if (T != raw) st[ETP__EP_ST_FLAGS] |= ETP__EP_F_BAD_TOKENS;
    *a->t_dev = (int32_t)T;
    st[ETP__EP_ST_PREPARES]++;
    /* send_cnt counts every token that wants to go (it is clamped to the
     * slab below): tokens < t_max < 2^31 */
    for (int d = 0; d < R; d++) a->send_cnt[d] = 0;
    for (int64_t t = 0; t < a->t_max; t++) {
        int32_t *sd = a->slot_dest + t * k;
        int32_t *sp = a->send_pos + t * R;
        for (int d = 0; d < R; d++) sp[d] = -1;
        if (t >= T) {
            for (int j = 0; j < k; j++) sd[j] = -1;
            continue;
        }
        int bad, dup;
        etp__ep_route_token(a->topk_idx + t * k, k, a->num_experts, a->local_experts, sd, &bad, &dup);
        if (bad) stat_drop(st, ETP__EP_ST_BAD_INDEX, ETP__EP_F_BAD_INDEX, bad);
        if (dup) stat_drop(st, ETP__EP_ST_DUPLICATE, ETP__EP_F_DUPLICATE, dup);
        /* positions in token order, per destination d: the count so far */
        for (int d = 0; d < R; d++) {
            if (etp__ep_slots_to(sd, k, d) == 0) continue;
            sp[d] = etp__ep_slab_pos(a->send_cnt[d]++, a->slab);
            if (sp[d] < 0)
                stat_drop(st, ETP__EP_ST_TRANSPORT_DROPPED, ETP__EP_F_TRANSPORT_FULL,
                          etp__ep_slots_to(sd, k, d));
        }
    }
    for (int d = 0; d < R; d++) {
        if (a->slab_report) stat_max(st, ETP__EP_ST_TRANSPORT_NEEDED, a->send_cnt[d]);
        a->send_cnt[d] = (int32_t)etp__ep_min(a->send_cnt[d], a->slab);
    }
    etp__ep_block_bases(a->send_cnt, R, a->exact, a->slab, a->send_base);
    for (int64_t t = 0; t < T; t++)
        for (int d = 0; d < R; d++) {
            const int64_t row = etp__ep_send_row(a->send_pos, a->send_base, R, t, d);
            if (row >= 0)
                etp__ep_meta_row(a->topk_idx + t * k, a->slot_dest + t * k, k, d,
                                 a->local_experts, a->send_meta + row * k);
        }
}

static void clip_run(void *p)
{
    const etp__ep_clip_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t T = tokens_of(a->t_dev, a->t_max);
    for (int d = 0; d < R; d++) {
        const int64_t acc = etp__ep_accepted(a->C, R, a->tok_cap, a->me, d);
        if (acc == a->C[(int64_t)a->me * R + d]) continue;
        stat_max(a->stats, ETP__EP_ST_TRANSPORT_NEEDED, etp__ep_wanted_by(a->C, R, d));
        for (int64_t t = 0; t < T; t++) {
            const int n = etp__ep_clip_copy(acc, a->slot_dest + t * k, k, d, a->send_pos + t * R + d);
            if (n) stat_drop(a->stats, ETP__EP_ST_TRANSPORT_DROPPED, ETP__EP_F_TRANSPORT_FULL, n);
        }
    }
}

/* ---- layout ------------------------------------------------------------- */

/* The local expert received slot x = i*k + j selects, or -1 (none, or row
 * i holds no token). */
static int32_t slot_expert(const etp__ep_layout_args_t *a, int64_t x)
{
    const int64_t i = x / a->k;
    if (!etp__ep_recv_valid(a->recv_base, a->recv_cnt, a->ranks, a->exact, a->slab, i)) return -1;
    return etp__ep_recv_expert(a->recv_meta, a->k, a->local_experts, i, (int)(x % a->k));
}

static void layout_run(void *p)
{
    const etp__ep_layout_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t L = a->local_experts, slots = a->recv_rows * k;
    for (int s = 0; s < R; s++)
        a->recv_cnt[s] = (int32_t)etp__ep_accepted(a->C, R, a->tok_cap, s, a->me);
    etp__ep_block_bases(a->recv_cnt, R, a->exact, a->slab, a->recv_base);
    for (int64_t x = 0; x < slots; x++) a->recv_row[x] = -1;
    for (int64_t r = 0; r < a->rows_cap; r++) a->row_src[r] = -1;
    for (int64_t e = 0; e < L; e++) a->counts[e] = 0;
    for (int64_t x = 0; x < slots; x++) {
        const int32_t e = slot_expert(a, x);
        if (e >= 0) a->counts[e]++;
    }
    const etp__ep_layout_need_t need =
        etp__ep_layout_offsets(a->counts, a->offsets, L, a->alignment, a->fixed_slots, a->rows_cap);
    stat_max(a->stats, ETP__EP_ST_ROWS_NEEDED, need.needed);
    if (need.dropped) stat_drop(a->stats, ETP__EP_ST_ROWS_DROPPED, ETP__EP_F_ROWS_FULL, need.dropped);
    /* rows in receive order, = (source rank, token) order, within each
     * expert; the first counts[e] kept */
    int32_t *next = a->scratch;
    for (int64_t e = 0; e < L; e++) next[e] = 0;
    for (int64_t x = 0; x < slots; x++) {
        const int32_t e = slot_expert(a, x);
        if (e < 0 || next[e]++ >= a->counts[e]) continue;
        const int64_t row = (int64_t)a->offsets[e] + next[e] - 1;
        a->recv_row[x] = (int32_t)row;
        a->row_src[row] = (int32_t)x;
    }
    for (int64_t i = 0; i < a->recv_rows; i++)
        etp__ep_sort_rows(a->recv_row + i * k, k, a->tok_rows + i * k);
    if (a->mirror)
        for (int i = 0; i < ETP__EP_ST_COUNT; i++) a->mirror[i] = a->stats[i];
}

/* ---- data movement ------------------------------------------------------ */

/* Token row x (H BF16 elements) as an MXFP8 wire row (ep_args.h). */
static void mx_quantize_row(const void *x, int dtype, int64_t H, uint8_t *row)
{
    const int64_t nb = H / ETP__EP_MX_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        float v[ETP__EP_MX_BLOCK];
        for (int c = 0; c < ETP__EP_MX_BLOCK; c++)
            v[c] = etp__ep_load(x, dtype, b * ETP__EP_MX_BLOCK + c);
        row[H + b] = etp__ep_mx_block(v, row + b * ETP__EP_MX_BLOCK);
    }
    memset(row + H + nb, 0, (size_t)(ETP__EP_MX_ROW_BYTES(H) - H - nb));
}

static void pack_run(void *p)
{
    const etp__ep_pack_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t T = tokens_of(a->t_dev, a->t_max), H = a->hidden;
    const size_t es = (size_t)etp__ep_esize(a->dtype);
    /* bytes of one send row: the token, or its MXFP8 wire row */
    const size_t rb = a->mx ? (size_t)ETP__EP_MX_ROW_BYTES(H) : (size_t)H * es;
    for (int64_t t = 0; t < T; t++) {
        const char *first = NULL; /* MXFP8: the token's row, quantized once */
        for (int d = 0; d < R; d++) {
            const int64_t row = etp__ep_send_row(a->send_pos, a->send_base, R, t, d);
            if (row < 0) continue;
            char *dst = (char *)a->send_tok + (size_t)row * rb;
            const char *src = (const char *)a->tokens + (size_t)(t * H) * es;
            if (!a->mx) {
                memcpy(dst, src, rb);
            } else if (!first) {
                mx_quantize_row(src, a->dtype, H, (uint8_t *)dst);
                first = dst;
            } else {
                memcpy(dst, first, rb);
            }
            if (a->send_w)
                for (int j = 0; j < k; j++)
                    a->send_w[row * k + j] =
                        etp__ep_slot_weight(a->slot_dest + t * k, a->weights + t * k, j, d);
        }
    }
}

static void expand_run(void *p)
{
    const etp__ep_expand_args_t *a = p;
    const int64_t H = a->hidden, nb = H / ETP__EP_MX_BLOCK;
    /* bytes of a received row, and of an output row */
    const size_t es = (size_t)etp__ep_esize(a->dtype);
    const size_t ib = a->mx ? (size_t)ETP__EP_MX_ROW_BYTES(H) : (size_t)H * es;
    const size_t ob = a->mx ? (size_t)H : (size_t)H * es;
    for (int64_t r = 0; r < a->rows; r++) {
        const int32_t src = a->row_src[r];
        char *o = (char *)a->out + (size_t)r * ob;
        uint8_t *os = a->mx ? (uint8_t *)a->out_scales + r * nb : NULL;
        const float w = etp__ep_row_weight(a->recv_w, src);
        if (a->out_w) a->out_w[r] = w;
        if (a->keep_w) a->keep_w[r] = w;
        if (src < 0) {
            memset(o, 0, ob);
            if (os) memset(os, 0, (size_t)nb);
            continue;
        }
        const int64_t i = src / a->k;
        const char *in = (const char *)a->recv_tok + (size_t)i * ib;
        if (a->scale_w) {
            const float sw = a->scale_w[r];
            for (int64_t h = 0; h < H; h++)
                etp__ep_store(a->out, a->dtype, r * H + h, sw * etp__ep_load(in, a->dtype, h));
        } else {
            memcpy(o, in, ob);
        }
        if (os) memcpy(os, in + H, (size_t)nb);
    }
}

static void presum_run(void *p)
{
    const etp__ep_presum_args_t *a = p;
    for (int64_t i = 0; i < a->ntok; i++)
        for (int64_t h = 0; h < a->hidden; h++)
            etp__ep_store(a->partial, a->wire, i * a->hidden + h, etp__ep_presum_elem(a, i, h));
}

static void reduce_run(void *p)
{
    const etp__ep_reduce_args_t *a = p;
    const int64_t T = tokens_of(a->t_dev, a->t_max), H = a->hidden;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            etp__ep_store(a->out, a->dtype, t * H + h, etp__ep_reduce_elem(a, t, h));
}

static void wgrad_run(void *p)
{
    const etp__ep_wgrad_args_t *a = p;
    const int64_t H = a->hidden;
    const size_t es = (size_t)etp__ep_esize(a->dtype);
    float lane[ETP__EP_DOT_LANES];
    for (int64_t i = 0; i < a->ntok; i++)
        for (int j = 0; j < a->k; j++) {
            const int32_t r = a->recv_row[i * a->k + j];
            float g = 0.0f;
            if (r >= 0 && !a->dot) {
                g = a->grad_row_w[r];
            } else if (r >= 0) {
                const char *x = (const char *)a->recv_tok + (size_t)(i * H) * es;
                const char *y = (const char *)a->rows_in + (size_t)((int64_t)r * H) * es;
                for (int l = 0; l < ETP__EP_DOT_LANES; l++)
                    lane[l] = etp__ep_dot_lane(x, y, a->dtype, H, l);
                for (int w = ETP__EP_DOT_LANES / 2; w >= 1; w /= 2)
                    for (int l = 0; l < w; l++) etp__ep_dot_fold(lane, l, w);
                g = lane[0];
            }
            a->g[i * a->k + j] = g;
        }
}

static void wscatter_run(void *p)
{
    const etp__ep_wscatter_args_t *a = p;
    const int64_t T = tokens_of(a->t_dev, a->t_max);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < a->k; j++) a->out[t * a->k + j] = etp__ep_slot_grad(a, t, j);
}

/* ---- the table ---------------------------------------------------------- */

#define HOST_LAUNCHER(name, type)                                                             \
    static etp_status_t host_##name(etp__be_t *be, etp__bstream_t *s, const type *a)          \
    {                                                                                         \
        return etp__host_launch(be, s, name##_run, a, sizeof *a);                             \
    }

HOST_LAUNCHER(route, etp__ep_route_args_t)
HOST_LAUNCHER(clip, etp__ep_clip_args_t)
HOST_LAUNCHER(layout, etp__ep_layout_args_t)
HOST_LAUNCHER(pack, etp__ep_pack_args_t)
HOST_LAUNCHER(expand, etp__ep_expand_args_t)
HOST_LAUNCHER(presum, etp__ep_presum_args_t)
HOST_LAUNCHER(reduce, etp__ep_reduce_args_t)
HOST_LAUNCHER(wgrad, etp__ep_wgrad_args_t)
HOST_LAUNCHER(wscatter, etp__ep_wscatter_args_t)

static etp_status_t host_pinned_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    (void)be;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "EP: out of host memory (%zu bytes)", bytes);
    *ptr = p;
    return ETP_SUCCESS;
}

static void host_pinned_free(etp__be_t *be, void *ptr)
{
    (void)be;
    free(ptr);
}

const etp__ep_kernels_t etp__host_ep_kernels = {
    .route = host_route,
    .clip = host_clip,
    .layout = host_layout,
    .pack = host_pack,
    .expand = host_expand,
    .presum = host_presum,
    .reduce = host_reduce,
    .wgrad = host_wgrad,
    .wscatter = host_wscatter,
    .pinned_alloc = host_pinned_alloc,
    .pinned_free = host_pinned_free,
};
