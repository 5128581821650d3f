/*
 * Quantized gathers. Each rank quantizes its own shard with the split-phase
 * API (one multi-amax, one amax all-reduce over the group for NVFP4, one
 * cast, for all experts at once), keeps it until the weight changes, and the
 * gather moves the quantized data and scales: 4 or 8 bits on the wire.
 *
 * Shard layouts concatenate into the full tensor's where a shard is a block
 * of rows of the full layout (rowwise data of both formats, MXFP8 columnwise
 * data). They do not for scale matrices (padded to 128 rows or 4 columns
 * per shard) nor for NVFP4 columnwise data (the transpose: a shard is a block
 * of columns): those are gathered into staging in the slot and re-laid with
 * 2D copies. Alignment is a multiple of the block, so no block straddles two
 * shards and the result equals quantizing the full padded weight with the
 * group's amax, bit for bit.
 *
 * cache_gathered_scales keeps each direction's finished scales (and the
 * amaxes) in the parameter's memory: the gather that refreshes them does
 * all of the above in the slot and copies the result out; the gathers of
 * the same weight version after it move the data alone. On 2 H200s the
 * scales' collective cost 15 us over the data's (MXFP8, a 256 MiB weight)
 * however small: a copy-engine collective synchronizes the ranks before
 * and after (docs/PERF.md).
 */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

enum { ALIGN = 256 };

static size_t up(size_t x)
{
    return (x + ALIGN - 1) / ALIGN * ALIGN;
}

typedef struct {
    size_t data_e, scales_e;     /* full, per expert */
    size_t sdata_e, sscales_e;   /* one shard's, per expert */
    size_t data, scales, stage_scales, stage_data, amax, bf16, swz, total; /* offsets */
    int row;
} qlayout_t;

static void layout(const etp_param_t *p, etp_pass_t pass, qlayout_t *L)
{
    size_t E = (size_t)p->experts, R = (size_t)p->group_size;
    L->row = pass == ETP_PASS_FORWARD;
    L->data_e = L->row ? p->qs_full.rowwise_data_bytes : p->qs_full.columnwise_data_bytes;
    L->scales_e = L->row ? p->qs_full.rowwise_scales_bytes : p->qs_full.columnwise_scales_bytes;
    L->sdata_e = L->row ? p->qs_shard.rowwise_data_bytes : p->qs_shard.columnwise_data_bytes;
    L->sscales_e = L->row ? p->qs_shard.rowwise_scales_bytes : p->qs_shard.columnwise_scales_bytes;
    int transposed = p->quant == ETP_PARAM_QUANT_NVFP4 && !L->row;
    L->data = 0;
    L->scales = up(L->data + E * L->data_e);
    L->stage_scales = up(L->scales + E * L->scales_e);
    L->stage_data = up(L->stage_scales + E * R * L->sscales_e);
    L->amax = up(L->stage_data + (transposed ? E * R * L->sdata_e : 0));
    L->bf16 = up(L->amax + E * sizeof(float));
    L->swz = up(L->bf16 + (p->gather_dequant ? E * (size_t)(p->padded_rows * p->cols) * 2 : 0));
    L->total = up(L->swz + (p->swizzle ? E * L->scales_e : 0));
}

size_t etp__qgather_bytes(const etp_param_t *p, etp_pass_t pass)
{
    qlayout_t L;
    layout(p, pass, &L);
    return L.total;
}

etp_status_t etp__param_quant_init(etp_param_t *p)
{
    etp_quantizer_config_t qc = ETP_QUANTIZER_CONFIG_INIT;
    qc.format = p->quant == ETP_PARAM_QUANT_MXFP8 ? ETP_QUANT_MXFP8 : ETP_QUANT_NVFP4;
    /* 2D blocks for NVFP4 weights: rowwise and columnwise copies agree. */
    qc.nvfp4_block = ETP_QUANT_BLOCK_2D;
    qc.directions = ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE;
    ETP__TRY(etp_quantizer_create(p->ctx, &qc, &p->qz));
    p->qs_shard = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
    p->qs_full = (etp_quant_sizes_t)ETP_QUANT_SIZES_INIT;
    ETP__TRY(etp_quant_sizes(p->qz, (size_t)p->shard_rows, (size_t)p->cols, &p->qs_shard));
    ETP__TRY(etp_quant_sizes(p->qz, (size_t)p->padded_rows, (size_t)p->cols, &p->qs_full));
    /* The swizzle converts what a quantizer's directions say: one quantizer
     * a direction, as a gather has the scales of one. */
    for (int d = 0; d < 2 && p->swizzle; d++) {
        etp_quantizer_config_t dc = qc;
        dc.directions = d == 0 ? ETP_QUANT_ROWWISE : ETP_QUANT_COLUMNWISE;
        ETP__TRY(etp_quantizer_create(p->ctx, &dc, &p->qz_dir[d]));
    }
    const etp_quant_sizes_t *q = &p->qs_shard;
    p->q_expert_bytes = up(q->rowwise_data_bytes) + up(q->rowwise_scales_bytes) +
                        up(q->columnwise_data_bytes) + up(q->columnwise_scales_bytes);
    ETP__TRY(etp_mem_alloc(p->ctx, (size_t)p->experts * p->q_expert_bytes, ETP_MEM_SHARDS,
                           (void **)&p->q_store));
    ETP__TRY(etp_mem_alloc(p->ctx, (size_t)p->experts * sizeof(float), ETP_MEM_SHARDS,
                           (void **)&p->q_amax));
    p->q_version = (uint64_t)-1;
    if (p->cache_scales) {
        size_t off = 0, E = (size_t)p->experts;
        for (int d = 0; d < 2; d++) {
            size_t b = d == 0 ? p->qs_full.rowwise_scales_bytes : p->qs_full.columnwise_scales_bytes;
            p->sc_scales[d] = off;
            off = up(off + E * b);
            p->sc_swz[d] = off;
            if (p->swizzle) off = up(off + E * b);
            /* the amaxes per direction too: a refresh of one direction's
             * waits for that direction's readers only */
            p->sc_amax[d] = off;
            off = up(off + E * sizeof(float));
            p->sc_version[d] = (uint64_t)-1;
        }
        ETP__TRY(etp_mem_alloc(p->ctx, off, ETP_MEM_SHARDS, (void **)&p->sc));
    }
    return ETP_SUCCESS;
}

void etp__param_quant_free(etp_param_t *p)
{
    if (p->q_store) etp_mem_free(p->ctx, p->q_store);
    if (p->q_amax) etp_mem_free(p->ctx, p->q_amax);
    if (p->sc) etp_mem_free(p->ctx, p->sc);
    if (p->qz) etp_quantizer_destroy(p->qz);
    for (int d = 0; d < 2; d++)
        if (p->qz_dir[d]) etp_quantizer_destroy(p->qz_dir[d]);
}

/* Expert e's quantized shard, both directions. */
static etp_quant_output_t shard_out(const etp_param_t *p, int64_t e)
{
    const etp_quant_sizes_t *q = &p->qs_shard;
    uint8_t *b = p->q_store + (size_t)e * p->q_expert_bytes;
    size_t o1 = up(q->rowwise_data_bytes), o2 = o1 + up(q->rowwise_scales_bytes),
           o3 = o2 + up(q->columnwise_data_bytes);
    etp_quant_output_t out = {b, q->rowwise_data_bytes, b + o1, q->rowwise_scales_bytes,
                              b + o2, q->columnwise_data_bytes, b + o3, q->columnwise_scales_bytes};
    return out;
}

static etp_status_t quantize_shard(etp_chain_t *c, etp_param_t *p)
{
    size_t E = (size_t)p->experts;
    etp_quant_input_t *in = malloc(E * sizeof *in);
    etp_quant_output_t *out = malloc(E * sizeof *out);
    if (!in || !out) {
        free(in);
        free(out);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "quantizing '%s': out of host memory", p->name);
    }
    size_t es = etp_dtype_size(p->dtype), shard = (size_t)(p->shard_rows * p->cols);
    for (size_t e = 0; e < E; e++) {
        in[e] = (etp_quant_input_t){(const char *)p->shard + e * shard * es, p->dtype,
                                    (size_t)p->shard_rows, (size_t)p->cols};
        out[e] = shard_out(p, (int64_t)e);
    }
    /* NVFP4: local amaxes, one all-reduce (max) over the group, one cast. */
    etp_status_t st = etp_quant_quantize(p->qz, E, in, p->q_amax, E, c->group, c->ag_role, out, c->ag);
    free(in);
    free(out);
    if (st == ETP_SUCCESS) p->q_version = p->version;
    return st;
}

/* The gathered row-major scales of every expert, swizzled into their own
 * region of the slot (one launch on the AG stream). */
static etp_status_t swizzle_gathered(etp_chain_t *c, const etp_param_t *p, const qlayout_t *L,
                                     uint8_t *s)
{
    size_t E = (size_t)p->experts;
    etp_quant_scales_t *in = calloc(E, sizeof *in), *out = calloc(E, sizeof *out);
    etp_status_t st = (in && out) ? ETP_SUCCESS
                                  : etp__err(ETP_ERR_OUT_OF_MEMORY, "swizzling '%s': out of host memory", p->name);
    for (size_t e = 0; e < E && st == ETP_SUCCESS; e++) {
        etp_quant_scales_t a = {(size_t)p->padded_rows, (size_t)p->cols, NULL, 0, NULL, 0};
        etp_quant_scales_t b = a;
        uint8_t *src = s + L->scales + e * L->scales_e, *dst = s + L->swz + e * L->scales_e;
        if (L->row) {
            a.rowwise = src, a.rowwise_bytes = L->scales_e;
            b.rowwise = dst, b.rowwise_bytes = L->scales_e;
        } else {
            a.columnwise = src, a.columnwise_bytes = L->scales_e;
            b.columnwise = dst, b.columnwise_bytes = L->scales_e;
        }
        in[e] = a;
        out[e] = b;
    }
    if (st == ETP_SUCCESS)
        st = etp_quant_swizzle_scales(p->qz_dir[L->row ? 0 : 1], E, in, out, ETP_QUANT_SWIZZLE, c->ag);
    free(in);
    free(out);
    return st;
}

int etp__qgather_cached(const etp_param_t *p)
{
    return p->sc && p->chain && !p->chain->graphed;
}

/* Where a gathered direction's scales and amaxes are: the parameter's cache
 * or the slot. */
static void scales_at(const etp_param_t *p, const qlayout_t *L, uint8_t *slot, uint8_t **scales,
                      uint8_t **swz, float **amax)
{
    if (etp__qgather_cached(p)) {
        int d = L->row ? 0 : 1;
        *scales = p->sc + p->sc_scales[d];
        *swz = p->sc + p->sc_swz[d];
        *amax = (float *)(p->sc + p->sc_amax[d]);
    } else {
        *scales = slot + L->scales;
        *swz = slot + L->swz;
        *amax = (float *)(slot + L->amax);
    }
}

/* The slot's finished scales (and amaxes) to the parameter's cache. The
 * readers of the previous ones are done: each read between a gather and a
 * release of this (parameter, pass), whose slot is fixed, and this gather
 * waits for the slot's last release, which follows every earlier tenant's
 * (each tenant's gather waited for its predecessor's release, its reader
 * for its gather). The slot-release edge's test covers the cache too. */
static etp_status_t cache_scales(etp_chain_t *c, etp_param_t *p, const qlayout_t *L, const uint8_t *s)
{
    int d = L->row ? 0 : 1;
    size_t E = (size_t)p->experts;
    ETP__TRY(etp_memcpy_async(c->ag, p->sc + p->sc_scales[d], s + L->scales, E * L->scales_e));
    if (p->swizzle) ETP__TRY(etp_memcpy_async(c->ag, p->sc + p->sc_swz[d], s + L->swz, E * L->scales_e));
    if (p->quant == ETP_PARAM_QUANT_NVFP4)
        ETP__TRY(etp_memcpy_async(c->ag, p->sc + p->sc_amax[d], s + L->amax, E * sizeof(float)));
    p->sc_version[d] = p->q_version;
    return ETP_SUCCESS;
}

etp_status_t etp__qgather_issue(etp_chain_t *c, etp_param_t *p, etp_pass_t pass, void *slot,
                                int window)
{
    /* A graphed chain quantizes at every forward gather: a replayed graph
     * cannot know whether the weight changed since the capture. */
    if (p->q_version != p->version || (c->graphed && pass == ETP_PASS_FORWARD))
        ETP__TRY(quantize_shard(c, p));
    const etp__shard_kernels_t *k = p->ctx->be->ops->kernels->shard;
    etp__be_t *be = p->ctx->be;
    etp__bstream_t *ag = c->ag->bs;
    qlayout_t L;
    layout(p, pass, &L);
    uint8_t *s = slot;
    size_t E = (size_t)p->experts, R = (size_t)p->group_size;
    size_t sr = (size_t)p->shard_rows, pr = (size_t)p->padded_rows, K = (size_t)p->cols;
    etp_quant_output_t first = shard_out(p, 0);
    const uint8_t *sdata = L.row ? first.rowwise_data : first.columnwise_data;
    const uint8_t *sscales = L.row ? first.rowwise_scales : first.columnwise_scales;
    int transposed = p->quant == ETP_PARAM_QUANT_NVFP4 && !L.row;
    /* the cache holds this version's scales: the data alone crosses */
    int hit = etp__qgather_cached(p) && p->sc_version[L.row ? 0 : 1] == p->q_version;

    /* Scale matrices concatenate when a shard's scale rows need no padding
     * of their own (rowwise: 128 scale rows; MXFP8 columnwise: 4 scale rows
     * of 32 weight rows): then each shard's matrix is its rows of the full
     * one and the scales are gathered in place, in the same launch as the
     * data. Equal byte counts alone would not do: 2 x 120 rows pad to 256
     * either way but in different places. */
    int scales_in_place = !transposed && sr % 128 == 0 && L.scales_e == R * L.sscales_e;

    /* A slot that is a window is gathered into in place, the quantized
     * shard copied to its place first. (Gathering straight from a quantized
     * store that is a window too was measured slower on 2 H200s: 279.5
     * against 262.7 us for MXFP8 at 256 MiB BF16-equivalent.) Data and
     * scales go in one batch: one launch, the scales riding along with the
     * data instead of paying a collective's latency of their own. */
    ETP__TRY(etp_batch_begin(p->ctx));
    etp_status_t st = ETP_SUCCESS;
    if (!transposed) {
        st = etp__slot_allgather(c->group, c->ag_role, window, sdata, p->q_expert_bytes, s + L.data,
                                 L.data_e, L.sdata_e, ETP_DTYPE_U8, p->experts, c->ag);
    } else {
        /* [K][M/2]: rank r's shard is a block of columns of each row. */
        st = etp__slot_allgather(c->group, c->ag_role, window, sdata, p->q_expert_bytes,
                                 s + L.stage_data, R * L.sdata_e, L.sdata_e, ETP_DTYPE_U8,
                                 p->experts, c->ag);
    }
    if (st == ETP_SUCCESS && !hit)
        st = etp__slot_allgather(c->group, c->ag_role, window, sscales, p->q_expert_bytes,
                                 s + (scales_in_place ? L.scales : L.stage_scales),
                                 scales_in_place ? L.scales_e : R * L.sscales_e, L.sscales_e,
                                 ETP_DTYPE_U8, p->experts, c->ag);
    etp_status_t st2 = etp_batch_end(p->ctx);
    ETP__TRY(st != ETP_SUCCESS ? st : st2);

    if (transposed)
        for (size_t e = 0; e < E; e++)
            for (size_t r = 0; r < R; r++)
                ETP__TRY(k->copy2d(be, ag, s + L.data + e * L.data_e + r * (sr / 2), pr / 2,
                                   s + L.stage_data + (e * R + r) * L.sdata_e, sr / 2, sr / 2, K));
    /* Otherwise the scales are re-laid into a zeroed full matrix. */
    if (!hit && !scales_in_place) {
        ETP__TRY(etp_memset_async(c->ag, s + L.scales, 0, E * L.scales_e));
        for (size_t e = 0; e < E; e++)
            for (size_t r = 0; r < R; r++) {
                uint8_t *dst = s + L.scales + e * L.scales_e;
                const uint8_t *src = s + L.stage_scales + (e * R + r) * L.sscales_e;
                if (L.row) {
                    /* one scale row per weight row (both formats) */
                    size_t sc = p->qs_full.rowwise_scale_cols;
                    ETP__TRY(k->copy2d(be, ag, dst + r * sr * sc, sc, src, sc, sc, sr));
                } else if (p->quant == ETP_PARAM_QUANT_MXFP8) {
                    /* one scale row per 32 weight rows */
                    size_t sc = p->qs_full.columnwise_scale_cols;
                    ETP__TRY(k->copy2d(be, ag, dst + r * (sr / 32) * sc, sc, src, sc, sc, sr / 32));
                } else {
                    /* NVFP4 columnwise: one scale column per 16 weight rows */
                    ETP__TRY(k->copy2d(be, ag, dst + r * (sr / 16), p->qs_full.columnwise_scale_cols,
                                       src, p->qs_shard.columnwise_scale_cols, sr / 16, K));
                }
            }
    }
    if (!hit) {
        if (p->swizzle) ETP__TRY(swizzle_gathered(c, p, &L, s));
        if (p->quant == ETP_PARAM_QUANT_NVFP4)
            ETP__TRY(etp_memcpy_async(c->ag, s + L.amax, p->q_amax, E * sizeof(float)));
        if (etp__qgather_cached(p)) ETP__TRY(cache_scales(c, p, &L, s));
    }
    uint8_t *scales, *swz;
    float *amax;
    scales_at(p, &L, s, &scales, &swz, &amax);
    if (p->gather_dequant) {
        etp_quant_output_t *q = calloc(E, sizeof *q);
        etp_quant_dest_t *d = calloc(E, sizeof *d);
        st = (q && d) ? ETP_SUCCESS
                      : etp__err(ETP_ERR_OUT_OF_MEMORY, "dequantizing '%s': out of host memory", p->name);
        for (size_t e = 0; e < E && st == ETP_SUCCESS; e++) {
            uint8_t *dd = s + L.data + e * L.data_e, *ss = scales + e * L.scales_e;
            if (L.row) {
                q[e].rowwise_data = dd;
                q[e].rowwise_data_bytes = L.data_e;
                q[e].rowwise_scales = ss;
                q[e].rowwise_scales_bytes = L.scales_e;
            } else {
                q[e].columnwise_data = dd;
                q[e].columnwise_data_bytes = L.data_e;
                q[e].columnwise_scales = ss;
                q[e].columnwise_scales_bytes = L.scales_e;
            }
            d[e] = (etp_quant_dest_t){s + L.bf16 + e * pr * K * 2, ETP_DTYPE_BF16, pr, K, pr * K * 2};
        }
        if (st == ETP_SUCCESS)
            st = etp_quant_dequantize(p->qz, E, q, p->quant == ETP_PARAM_QUANT_NVFP4 ? amax : NULL,
                                      E, L.row ? ETP_QUANT_ROWWISE : ETP_QUANT_COLUMNWISE, d, c->ag);
        free(q);
        free(d);
        ETP__TRY(st);
    }
    return ETP_SUCCESS;
}

void etp__qgather_view(const etp_param_t *p, etp_pass_t pass, void *slot, etp_weight_view_t *v)
{
    qlayout_t L;
    layout(p, pass, &L);
    uint8_t *s = slot;
    etp_weight_view_t out = ETP_WEIGHT_VIEW_INIT;
    out.experts = p->experts;
    out.rows = p->rows;
    out.cols = p->cols;
    if (p->gather_dequant) {
        out.data = s + L.bf16;
        out.dtype = ETP_DTYPE_BF16;
        out.ld = p->cols;
        out.expert_stride = p->padded_rows * p->cols;
    } else {
        int transposed = p->quant == ETP_PARAM_QUANT_NVFP4 && !L.row;
        int fp4 = p->quant == ETP_PARAM_QUANT_NVFP4;
        out.data = s + L.data;
        out.dtype = ETP_DTYPE_U8;
        out.ld = transposed ? p->padded_rows / 2 : fp4 ? p->cols / 2 : p->cols;
        out.expert_stride = (int64_t)L.data_e;
        out.quant = p->quant;
        uint8_t *scales, *swz;
        float *amax;
        scales_at(p, &L, s, &scales, &swz, &amax);
        out.scales = p->swizzle ? swz : scales;
        out.scales_swizzled = p->swizzle;
        out.scale_rows = (int64_t)(L.row ? p->qs_full.rowwise_scale_rows : p->qs_full.columnwise_scale_rows);
        out.scale_cols = (int64_t)(L.row ? p->qs_full.rowwise_scale_cols : p->qs_full.columnwise_scale_cols);
        out.scale_expert_stride = (int64_t)L.scales_e;
        out.amax = fp4 ? amax : NULL;
    }
    etp__vs_put(v, &out);
}
