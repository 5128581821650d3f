/*
 * Host kernels of the ep module: the reference of kernels/ep/ep.cu (same
 * arguments, kernels/ep/ep_args.h, same arithmetic order: FP32 sums with
 * fmaf where the CUDA kernels use fmaf), enqueued on host streams with
 * etp__host_launch. Each runs as one operation of its stream, so it reads T
 * and counts written by earlier operations of the stream when it runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels_ep.h"
#include "core/half.h"
#include "host_internal.h"
#include "quant/formats/qf_codec.h"

static inline float load(const void *p, int dtype, int64_t i)
{
    if (dtype == ETP__EP_BF16) return etp__bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static inline void store(void *p, int dtype, int64_t i, float v)
{
    if (dtype == ETP__EP_BF16)
        ((uint16_t *)p)[i] = etp__f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

static inline size_t esize(int dtype)
{
    return dtype == ETP__EP_BF16 ? 2 : 4;
}

/* T as route stored it (already clamped); clamped again so that a kernel
 * never trusts device memory for a bound. */
static int64_t tokens_of(const int32_t *t_dev, int64_t t_max)
{
    int64_t t = *t_dev;
    return t < 0 ? 0 : t > t_max ? t_max : t;
}

static inline void stat_max(int64_t *stats, int which, int64_t v)
{
    if (stats[which] < v) stats[which] = v;
}

/* ---- route -------------------------------------------------------------- */

static void route_run(void *p)
{
    const etp__ep_route_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t E = a->num_experts, L = a->local_experts;
    int64_t *st = a->stats;
    int64_t T = a->t_in ? *a->t_in : a->t_value;
    if (T < 0 || T > a->t_max) {
        st[ETP__EP_ST_FLAGS] |= ETP__EP_F_BAD_TOKENS;
        T = T < 0 ? 0 : a->t_max;
    }
    *a->t_dev = (int32_t)T;
    st[ETP__EP_ST_PREPARES]++;
    int64_t cnt[R];
    for (int d = 0; d < R; d++) cnt[d] = 0;
    for (int64_t t = 0; t < a->t_max; t++) {
        int32_t *sd = a->slot_dest + t * k;
        int32_t *sp = a->send_pos + t * R;
        for (int d = 0; d < R; d++) sp[d] = -1;
        for (int j = 0; j < k; j++) sd[j] = -1;
        if (t >= T) continue;
        const int64_t *idx = a->topk_idx + t * k;
        for (int j = 0; j < k; j++) {
            int64_t e = idx[j];
            if (e == -1) continue;
            if (e < -1 || e >= E) {
                st[ETP__EP_ST_BAD_INDEX]++;
                st[ETP__EP_ST_FLAGS] |= ETP__EP_F_BAD_INDEX;
                continue;
            }
            int dup = 0;
            for (int j2 = 0; j2 < j && !dup; j2++) dup = sd[j2] >= 0 && idx[j2] == e;
            if (dup) {
                st[ETP__EP_ST_DUPLICATE]++;
                st[ETP__EP_ST_FLAGS] |= ETP__EP_F_DUPLICATE;
                continue;
            }
            sd[j] = (int32_t)(e / L);
        }
        for (int j = 0; j < k; j++) {
            int d = sd[j];
            if (d < 0 || sp[d] != -1) continue;
            /* position = tokens before t that go to d; mark with -2 first */
            sp[d] = -2;
        }
        for (int d = 0; d < R; d++) {
            if (sp[d] != -2) continue;
            if (cnt[d] < a->slab) {
                sp[d] = (int32_t)cnt[d];
            } else {
                sp[d] = -1;
                for (int j = 0; j < k; j++) st[ETP__EP_ST_TRANSPORT_DROPPED] += sd[j] == d;
                st[ETP__EP_ST_FLAGS] |= ETP__EP_F_TRANSPORT_FULL;
            }
            cnt[d]++;
        }
    }
    int64_t base = 0;
    for (int d = 0; d < R; d++) {
        if (!a->exact) stat_max(st, ETP__EP_ST_TRANSPORT_NEEDED, cnt[d]);
        a->send_cnt[d] = (int32_t)(cnt[d] < a->slab ? cnt[d] : a->slab);
        a->send_base[d] = (int32_t)(a->exact ? base : (int64_t)d * a->slab);
        base += a->send_cnt[d];
    }
    for (int64_t t = 0; t < T; t++) {
        const int32_t *sd = a->slot_dest + t * k;
        const int32_t *sp = a->send_pos + t * R;
        const int64_t *idx = a->topk_idx + t * k;
        for (int d = 0; d < R; d++) {
            if (sp[d] < 0) continue;
            int32_t *m = a->send_meta + ((int64_t)a->send_base[d] + sp[d]) * k;
            for (int j = 0; j < k; j++) m[j] = sd[j] == d ? (int32_t)(idx[j] - (int64_t)d * L) : -1;
        }
    }
}

/* The tokens rank s may send to rank d: receivers fill their tok_cap rows
 * in source rank order. */
static int64_t accepted(const int32_t *C, int R, int64_t tok_cap, int s, int d)
{
    int64_t before = 0;
    for (int s2 = 0; s2 < s; s2++) before += C[(int64_t)s2 * R + d];
    int64_t room = tok_cap - before;
    if (room < 0) room = 0;
    return C[(int64_t)s * R + d] < room ? C[(int64_t)s * R + d] : room;
}

static void clip_run(void *p)
{
    const etp__ep_clip_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t T = tokens_of(a->t_dev, a->t_max);
    for (int d = 0; d < R; d++) {
        int64_t acc = accepted(a->C, R, a->tok_cap, a->me, d);
        if (acc == a->C[(int64_t)a->me * R + d]) continue;
        int64_t need = 0;
        for (int s = 0; s < R; s++) need += a->C[(int64_t)s * R + d];
        stat_max(a->stats, ETP__EP_ST_TRANSPORT_NEEDED, need);
        a->stats[ETP__EP_ST_FLAGS] |= ETP__EP_F_TRANSPORT_FULL;
        for (int64_t t = 0; t < T; t++) {
            int32_t *sp = a->send_pos + t * R + d;
            if (*sp < acc) continue;
            *sp = -1;
            for (int j = 0; j < k; j++) a->stats[ETP__EP_ST_TRANSPORT_DROPPED] += a->slot_dest[t * k + j] == d;
        }
    }
}

/* ---- layout ------------------------------------------------------------- */

static void layout_run(void *p)
{
    const etp__ep_layout_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t L = a->local_experts, al = a->alignment;
    int64_t *st = a->stats;
    int64_t base = 0;
    for (int s = 0; s < R; s++) {
        a->recv_cnt[s] = (int32_t)accepted(a->C, R, a->tok_cap, s, a->me);
        a->recv_base[s] = (int32_t)(a->exact ? base : (int64_t)s * a->slab);
        base += a->recv_cnt[s];
    }
    for (int64_t i = 0; i < a->tok_cap * k; i++) a->recv_row[i] = a->tok_rows[i] = -1;
    for (int64_t r = 0; r < a->rows_cap; r++) a->row_src[r] = -1;

    int64_t n[L];
    for (int64_t e = 0; e < L; e++) n[e] = 0;
    for (int s = 0; s < R; s++)
        for (int64_t i = a->recv_base[s]; i < a->recv_base[s] + a->recv_cnt[s]; i++)
            for (int j = 0; j < k; j++) {
                int32_t e = a->recv_meta[i * k + j];
                if (e >= 0 && e < L) n[e]++;
            }
    /* kept rows and offsets: PACKED fills the capacity in expert order (the
     * capacity is a multiple of the alignment, so padded offsets never pass
     * it); FIXED_SLOTS keeps at most S per expert. */
    int64_t off = 0, need = 0, dropped = 0, maxn = 0;
    for (int64_t e = 0; e < L; e++) {
        int64_t padded = (n[e] + al - 1) / al * al;
        need += padded;
        if (n[e] > maxn) maxn = n[e];
        int64_t kept;
        if (a->fixed_slots > 0) {
            off = e * a->fixed_slots;
            kept = n[e] < a->fixed_slots ? n[e] : a->fixed_slots;
        } else {
            int64_t room = a->rows_cap - off;
            kept = n[e] < room ? n[e] : room;
        }
        a->offsets[e] = (int32_t)off;
        a->counts[e] = (int32_t)kept;
        dropped += n[e] - kept;
        if (a->fixed_slots == 0) off += (kept + al - 1) / al * al;
    }
    a->offsets[L] = (int32_t)(a->fixed_slots > 0 ? L * a->fixed_slots : off);
    stat_max(st, ETP__EP_ST_ROWS_NEEDED, a->fixed_slots > 0 ? (maxn + al - 1) / al * al : need);
    if (dropped) {
        st[ETP__EP_ST_ROWS_DROPPED] += dropped;
        st[ETP__EP_ST_FLAGS] |= ETP__EP_F_ROWS_FULL;
    }
    /* rows in (source rank, token) order within each expert */
    int64_t pos[L];
    for (int64_t e = 0; e < L; e++) pos[e] = 0;
    for (int s = 0; s < R; s++)
        for (int64_t i = a->recv_base[s]; i < a->recv_base[s] + a->recv_cnt[s]; i++)
            for (int j = 0; j < k; j++) {
                int32_t e = a->recv_meta[i * k + j];
                if (e < 0 || e >= L) continue;
                int64_t q = pos[e]++;
                if (q >= a->counts[e]) continue;
                int64_t row = a->offsets[e] + q;
                a->recv_row[i * k + j] = (int32_t)row;
                a->row_src[row] = (int32_t)(i * k + j);
            }
    /* each token's rows ascending: the pre-sum's expert order */
    for (int64_t i = 0; i < a->tok_cap; i++) {
        int32_t *o = a->tok_rows + i * k;
        int m = 0;
        for (int j = 0; j < k; j++) {
            int32_t r = a->recv_row[i * k + j];
            if (r < 0) continue;
            int q = m++;
            while (q > 0 && o[q - 1] > r) {
                o[q] = o[q - 1];
                q--;
            }
            o[q] = r;
        }
    }
}

/* ---- data movement ------------------------------------------------------ */

/* One token row of H elements (dtype) as an MXFP8 wire row (ep_args.h):
 * H E4M3 bytes, H/32 E8M0 scales, zeros up to ETP__EP_MX_ROW_BYTES(H). The
 * quant module's MXFP8 rowwise E4M3 recipe, from its codecs. */
static void mx_quantize_row(const void *x, int dtype, int64_t H, uint8_t *row)
{
    const float inv_max = etp__qf_mxfp8_inv_max(0);
    const int64_t nb = H / ETP__EP_MX_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t h0 = b * ETP__EP_MX_BLOCK;
        float amax = 0.0f;
        for (int64_t h = h0; h < h0 + ETP__EP_MX_BLOCK; h++) amax = etp__qf_amax_step(amax, load(x, dtype, h));
        const uint8_t e = etp__qf_mxfp8_scale(amax, inv_max);
        const float s = etp__qf_mxfp8_multiplier(e);
        for (int64_t h = h0; h < h0 + ETP__EP_MX_BLOCK; h++) row[h] = etp__qf_mxfp8_encode(load(x, dtype, h), s, 0);
        row[H + b] = e;
    }
    memset(row + H + nb, 0, (size_t)(ETP__EP_MX_ROW_BYTES(H) - H - nb));
}

static void pack_run(void *p)
{
    const etp__ep_pack_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t T = tokens_of(a->t_dev, a->t_max), H = a->hidden;
    const size_t es = esize(a->dtype);
    /* bytes of one send row: the token, or its MXFP8 wire row */
    const size_t rb = a->mx ? (size_t)ETP__EP_MX_ROW_BYTES(H) : (size_t)H * es;
    for (int64_t t = 0; t < T; t++) {
        const char *first = NULL; /* MXFP8: the token's row, quantized once */
        for (int d = 0; d < R; d++) {
            int32_t sp = a->send_pos[t * R + d];
            if (sp < 0) continue;
            int64_t row = (int64_t)a->send_base[d] + sp;
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
                    a->send_w[row * k + j] = a->slot_dest[t * k + j] == d ? a->weights[t * k + j] : 0.0f;
        }
    }
}

/* expand of MXFP8 rows: data and scales to their own matrices */
static void expand_mx_run(const etp__ep_expand_args_t *a)
{
    const int64_t H = a->hidden, nb = H / ETP__EP_MX_BLOCK, rb = ETP__EP_MX_ROW_BYTES(H);
    for (int64_t r = 0; r < a->rows; r++) {
        int32_t src = a->row_src[r];
        uint8_t *o = (uint8_t *)a->out + r * H, *os = (uint8_t *)a->out_scales + r * nb;
        if (src < 0) {
            memset(o, 0, (size_t)H);
            memset(os, 0, (size_t)nb);
            if (a->out_w) a->out_w[r] = 0.0f;
            if (a->keep_w) a->keep_w[r] = 0.0f;
            continue;
        }
        const uint8_t *in = (const uint8_t *)a->recv_tok + (src / a->k) * rb;
        memcpy(o, in, (size_t)H);
        memcpy(os, in + H, (size_t)nb);
        float w = a->recv_w ? a->recv_w[src] : 0.0f;
        if (a->out_w) a->out_w[r] = w;
        if (a->keep_w) a->keep_w[r] = w;
    }
}

static void expand_run(void *p)
{
    const etp__ep_expand_args_t *a = p;
    if (a->mx) {
        expand_mx_run(a);
        return;
    }
    const int64_t H = a->hidden;
    const size_t es = esize(a->dtype);
    for (int64_t r = 0; r < a->rows; r++) {
        int32_t src = a->row_src[r];
        char *o = (char *)a->out + (size_t)(r * H) * es;
        if (src < 0) {
            memset(o, 0, (size_t)H * es);
            if (a->out_w) a->out_w[r] = 0.0f;
            if (a->keep_w) a->keep_w[r] = 0.0f;
            continue;
        }
        int64_t i = src / a->k;
        if (a->scale_w) {
            float w = a->scale_w[r];
            for (int64_t h = 0; h < H; h++) store(a->out, a->dtype, r * H + h, w * load(a->recv_tok, a->dtype, i * H + h));
        } else {
            memcpy(o, (const char *)a->recv_tok + (size_t)(i * H) * es, (size_t)H * es);
        }
        float w = a->recv_w ? a->recv_w[src] : 0.0f;
        if (a->out_w) a->out_w[r] = w;
        if (a->keep_w) a->keep_w[r] = w;
    }
}

static void presum_run(void *p)
{
    const etp__ep_presum_args_t *a = p;
    const int64_t H = a->hidden;
    for (int64_t i = 0; i < a->ntok; i++) {
        float *o = a->partial + i * H;
        for (int64_t h = 0; h < H; h++) o[h] = 0.0f;
        for (int m = 0; m < a->k; m++) {
            int32_t r = a->tok_rows[i * a->k + m];
            if (r < 0) break;
            if (a->row_w) {
                float w = a->row_w[r];
                for (int64_t h = 0; h < H; h++) o[h] = fmaf(w, load(a->in, a->dtype, (int64_t)r * H + h), o[h]);
            } else {
                for (int64_t h = 0; h < H; h++) o[h] += load(a->in, a->dtype, (int64_t)r * H + h);
            }
        }
    }
}

static void reduce_run(void *p)
{
    const etp__ep_reduce_args_t *a = p;
    const int R = a->ranks;
    const int64_t T = tokens_of(a->t_dev, a->t_max), H = a->hidden;
    enum { CHUNK = 256 }; /* columns at a time: scratch on the stack, no allocation */
    float acc[CHUNK];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h0 = 0; h0 < H; h0 += CHUNK) {
            const int64_t n = H - h0 < CHUNK ? H - h0 : CHUNK;
            for (int64_t h = 0; h < n; h++) acc[h] = 0.0f;
            for (int d = 0; d < R; d++) {
                int32_t sp = a->send_pos[t * R + d];
                if (sp < 0) continue;
                const float *q = a->partial + ((int64_t)a->send_base[d] + sp) * H + h0;
                for (int64_t h = 0; h < n; h++) acc[h] += q[h];
            }
            for (int64_t h = 0; h < n; h++) store(a->out, a->dtype, t * H + h0 + h, acc[h]);
        }
}

float etp__host_ep_dot(const void *x, const void *y, int dtype, int64_t n)
{
    float lane[ETP__EP_DOT_LANES];
    for (int l = 0; l < ETP__EP_DOT_LANES; l++) {
        float acc = 0.0f;
        for (int64_t h = l; h < n; h += ETP__EP_DOT_LANES)
            acc = fmaf(load(x, dtype, h), load(y, dtype, h), acc);
        lane[l] = acc;
    }
    for (int w = ETP__EP_DOT_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

static void wgrad_run(void *p)
{
    const etp__ep_wgrad_args_t *a = p;
    const int64_t H = a->hidden;
    const size_t es = esize(a->dtype);
    for (int64_t i = 0; i < a->ntok; i++)
        for (int j = 0; j < a->k; j++) {
            int32_t r = a->recv_row[i * a->k + j];
            float g = 0.0f;
            if (r >= 0) {
                if (a->dot)
                    g = etp__host_ep_dot((const char *)a->recv_tok + (size_t)(i * H) * es,
                                         (const char *)a->rows_in + (size_t)((int64_t)r * H) * es,
                                         a->dtype, H);
                else
                    g = a->grad_row_w[r];
            }
            a->g[i * a->k + j] = g;
        }
}

static void wscatter_run(void *p)
{
    const etp__ep_wscatter_args_t *a = p;
    const int R = a->ranks, k = a->k;
    const int64_t T = tokens_of(a->t_dev, a->t_max);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t d = a->slot_dest[t * k + j];
            int32_t sp = d >= 0 ? a->send_pos[t * R + d] : -1;
            a->out[t * k + j] = sp >= 0 ? a->g_recv[((int64_t)a->send_base[d] + sp) * k + j] : 0.0f;
        }
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
