/*
 * Quantizer objects and the split-phase API (etp/quant.h): argument
 * checking, sizes, and the orchestration multi-amax -> one all-reduce ->
 * cast-only, run through the backend's quant kernel table.
 *
 * Every call checks all of its arguments before it enqueues anything, so a
 * bad tensor in the middle of a list never leaves the first half quantized.
 * A call over more than ETP__QB_MAX tensors is split into launches of that
 * many (the batch is a kernel parameter block); the batch lives in the
 * quantizer, so the launch path allocates nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels_quant.h"
#include "comm/comm_internal.h"
#include "etp/quant.h"
#include "quant/formats/qf_layout.h"

struct etp_quantizer {
    etp_context_t *ctx;
    int graph_refs; /* live graphs that captured its launches (they use its scratch) */
    etp_quantizer_config_t cfg;
    void *workspace;     /* the backend's device scratch (NULL: it needs none) */
    uint32_t sms;        /* the backend's launch width (0: none), for every batch */
    uint32_t clusters;   /* the cast's clusters the device holds (0: launch none) */
    etp__qbatch_t batch; /* scratch of the launch path, one thread at a time */
    etp__qswz_batch_t swz; /* the same for scale swizzles */
};

/* Rows or columns beyond this do not fit the kernels' 32-bit indices. */
#define ETP__Q_DIM_MAX ((size_t)INT32_MAX)

static size_t block_of(const etp_quantizer_t *q)
{
    return q->cfg.format == ETP_QUANT_NVFP4 ? ETP__QF_NVFP4_BLOCK : ETP__QF_MXFP8_BLOCK;
}

static const char *format_name(const etp_quantizer_t *q)
{
    return q->cfg.format == ETP_QUANT_NVFP4 ? "NVFP4" : "MXFP8";
}

/* The kernels read the flag as an int32 (a misaligned one is a
 * misaligned-address fault on CUDA, which aborts the context). */
static etp_status_t check_noop_flag(const int32_t *flag, const char *fn)
{
    if ((uintptr_t)flag % sizeof *flag)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: noop_flag %p is not 4-byte aligned", fn,
                        (const void *)flag);
    return ETP_SUCCESS;
}

etp_status_t etp_quantizer_create(etp_context_t *ctx, const etp_quantizer_config_t *config,
                                  etp_quantizer_t **quantizer)
{
    const char *fn = "etp_quantizer_create";
    ETP__CHECK_NULL(ctx, fn);
    ETP__CHECK_NULL(quantizer, fn);
    etp_quantizer_config_t cfg = ETP_QUANTIZER_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&cfg, config, &etp__vs_quantizer_config, fn, "config"));
    if (cfg.format != ETP_QUANT_NVFP4 && cfg.format != ETP_QUANT_MXFP8)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: format %d is not an etp_quant_format_t", fn,
                        (int)cfg.format);
    /* a field the format does not use is not checked (a zeroed config of
     * one format is valid whatever the other format's fields hold) */
    if (cfg.format == ETP_QUANT_MXFP8 && cfg.mxfp8_elem != ETP_QUANT_ELEM_E4M3 &&
        cfg.mxfp8_elem != ETP_QUANT_ELEM_E5M2)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: mxfp8_elem %d is not an etp_quant_elem_t (expected "
                        "ETP_QUANT_ELEM_E4M3 or ETP_QUANT_ELEM_E5M2)", fn, (int)cfg.mxfp8_elem);
    if (cfg.format == ETP_QUANT_NVFP4 && cfg.nvfp4_block != ETP_QUANT_BLOCK_1D &&
        cfg.nvfp4_block != ETP_QUANT_BLOCK_2D)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: nvfp4_block %d is not an etp_quant_block_t (expected "
                        "ETP_QUANT_BLOCK_1D or ETP_QUANT_BLOCK_2D)", fn, (int)cfg.nvfp4_block);
    if (cfg.directions == 0 || (cfg.directions & ~(ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE)))
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: directions 0x%x (expected ETP_QUANT_ROWWISE and/or "
                        "ETP_QUANT_COLUMNWISE)",
                        fn, cfg.directions);
    if (cfg.swizzle_scales != 0 && cfg.swizzle_scales != 1)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: swizzle_scales %d (expected 0 or 1)", fn,
                        cfg.swizzle_scales);
    if (cfg.rounding != ETP_QUANT_ROUND_NEAREST && cfg.rounding != ETP_QUANT_ROUND_STOCHASTIC)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: rounding %d is not an etp_quant_rounding_t",
                        fn, (int)cfg.rounding);
    if (cfg.format == ETP_QUANT_MXFP8 && cfg.rounding == ETP_QUANT_ROUND_STOCHASTIC)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: stochastic rounding is for NVFP4 elements only, not MXFP8", fn);
    ETP__TRY(check_noop_flag(cfg.noop_flag, fn));
    ETP__TRY(etp__ctx_usable(ctx, fn));
    etp_quantizer_t *q = calloc(1, sizeof *q);
    if (!q) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    q->ctx = ctx;
    q->cfg = cfg;
    const etp__quant_kernels_t *k = ctx->be->ops->kernels->quant;
    if (k->launch_width) {
        const etp__test_knobs_t *knobs = &ctx->be->test;
        etp_status_t st = k->launch_width(ctx->be, &q->sms, knobs->quant_no_clusters ? NULL : &q->clusters);
        if (st != ETP_SUCCESS) {
            free(q);
            return st;
        }
        if (knobs->quant_launch_sms > 0) q->sms = knobs->quant_launch_sms;
    }
    if (k->workspace_bytes) {
        etp_status_t st = etp_mem_alloc(ctx, k->workspace_bytes, ETP_MEM_WORKSPACE, &q->workspace);
        if (st == ETP_SUCCESS) st = k->workspace_init(ctx->be, q->workspace);
        if (st != ETP_SUCCESS) {
            if (q->workspace) etp_mem_free(ctx, q->workspace);
            free(q);
            return st;
        }
    }
    *quantizer = q;
    ETP__LOG(&ctx->log, ETP_LOG_DEBUG, ETP_SUBSYS_QUANT,
             "quantizer %s%s blocks %s directions 0x%x swizzle %d rounding %d", format_name(q),
             cfg.format == ETP_QUANT_MXFP8 ? (cfg.mxfp8_elem == ETP_QUANT_ELEM_E5M2 ? " E5M2" : " E4M3")
                                           : "",
             cfg.format == ETP_QUANT_NVFP4 && cfg.nvfp4_block == ETP_QUANT_BLOCK_2D ? "16x16" : "1D",
             cfg.directions, cfg.swizzle_scales, (int)cfg.rounding);
    return ETP_SUCCESS;
}

etp_status_t etp_quantizer_destroy(etp_quantizer_t *quantizer)
{
    if (!quantizer) return ETP_SUCCESS;
    ETP__TRY(etp__ctx_no_capture(quantizer->ctx, "etp_quantizer_destroy"));
    if (quantizer->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY,
                        "etp_quantizer_destroy: %d graph(s) captured its launches; destroy them first",
                        quantizer->graph_refs);
    /* waits for the context's enqueued work, which may still use it; a
     * failed free keeps the quantizer, so the call can be retried */
    if (quantizer->workspace) ETP__TRY(etp_mem_free(quantizer->ctx, quantizer->workspace));
    free(quantizer);
    return ETP_SUCCESS;
}

etp_status_t etp_quantizer_set_seed(etp_quantizer_t *quantizer, uint64_t seed)
{
    ETP__CHECK_NULL(quantizer, "etp_quantizer_set_seed");
    quantizer->cfg.seed = seed;
    return ETP_SUCCESS;
}

etp_status_t etp_quantizer_set_noop_flag(etp_quantizer_t *quantizer, const int32_t *flag)
{
    ETP__CHECK_NULL(quantizer, "etp_quantizer_set_noop_flag");
    ETP__TRY(check_noop_flag(flag, "etp_quantizer_set_noop_flag"));
    quantizer->cfg.noop_flag = flag;
    return ETP_SUCCESS;
}

/* ---- sizes ---------------------------------------------------------------- */

/* NO_INDEX: a call of one tensor (etp_quant_sizes), named by its shape only */
#define NO_INDEX SIZE_MAX

/* "tensor i of [rows, cols]", or "tensor [rows, cols]" for NO_INDEX */
static const char *tensor_name(char *buf, size_t cap, size_t index, size_t rows, size_t cols)
{
    if (index == NO_INDEX)
        snprintf(buf, cap, "tensor [%zu, %zu]", rows, cols);
    else
        snprintf(buf, cap, "tensor %zu of [%zu, %zu]", index, rows, cols);
    return buf;
}

static etp_status_t sizes_of(const etp_quantizer_t *q, size_t rows, size_t cols, size_t index,
                             const char *fn, etp_quant_sizes_t *out)
{
    const size_t blk = block_of(q);
    const int nv = q->cfg.format == ETP_QUANT_NVFP4;
    char tn[96];
    if (rows > ETP__Q_DIM_MAX || cols > ETP__Q_DIM_MAX)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: %s: rows and cols must be at most %zu", fn,
                        tensor_name(tn, sizeof tn, index, rows, cols), ETP__Q_DIM_MAX);
    etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
    if (q->cfg.directions & ETP_QUANT_ROWWISE) {
        if (cols % blk)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "%s: %s: %s rowwise needs cols a multiple of %zu", fn,
                            tensor_name(tn, sizeof tn, index, rows, cols), format_name(q), blk);
        etp__qf_scale_shape_t sh =
            nv ? etp__qf_nvfp4_row_scales(rows, cols) : etp__qf_mxfp8_row_scales(rows, cols);
        s.rowwise_data_bytes = nv ? rows * cols / 2 : rows * cols;
        s.rowwise_scale_rows = sh.rows;
        s.rowwise_scale_cols = sh.cols;
        s.rowwise_scales_bytes = sh.rows * sh.cols;
    }
    if (q->cfg.directions & ETP_QUANT_COLUMNWISE) {
        if (rows % blk)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "%s: %s: %s columnwise needs rows a multiple of %zu", fn,
                            tensor_name(tn, sizeof tn, index, rows, cols), format_name(q), blk);
        etp__qf_scale_shape_t sh =
            nv ? etp__qf_nvfp4_col_scales(rows, cols) : etp__qf_mxfp8_col_scales(rows, cols);
        s.columnwise_data_bytes = nv ? rows * cols / 2 : rows * cols;
        s.columnwise_scale_rows = sh.rows;
        s.columnwise_scale_cols = sh.cols;
        s.columnwise_scales_bytes = sh.rows * sh.cols;
    }
    *out = s;
    return ETP_SUCCESS;
}

etp_status_t etp_quant_sizes(const etp_quantizer_t *quantizer, size_t rows, size_t cols,
                             etp_quant_sizes_t *sizes)
{
    const char *fn = "etp_quant_sizes";
    ETP__CHECK_NULL(quantizer, fn);
    ETP__CHECK_NULL(sizes, fn);
    etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
    ETP__TRY(sizes_of(quantizer, rows, cols, NO_INDEX, fn, &s));
    return etp__vs_out(sizes, &s, &etp__vs_quant_sizes, fn, "sizes");
}

/* ---- argument checks -------------------------------------------------------- */

static etp_status_t check_call(etp_quantizer_t *q, size_t n, const void *list, const char *list_name,
                               etp_stream_t *stream, const char *fn)
{
    if (!q) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'quantizer' is NULL", fn);
    ETP__CHECK_NULL(stream, fn);
    /* launches index tensors in 32 bits (the amax index, the stochastic
     * rounding's tensor id) */
    if (n > UINT32_MAX)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: n = %zu tensors (at most %u a call)", fn, n,
                        UINT32_MAX);
    if (n > 0 && !list)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument '%s' is NULL with n = %zu", fn,
                        list_name, n);
    if (stream->ctx != q->ctx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: the stream belongs to another context than the quantizer", fn);
    return etp__ctx_usable(q->ctx, fn);
}

static etp_status_t check_amax_aligned(const float *amax, const char *name, const char *fn)
{
    if ((uintptr_t)amax % sizeof *amax)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: %s %p is not 4-byte aligned (FP32)", fn,
                        name, (const void *)amax);
    return ETP_SUCCESS;
}

static etp_status_t check_amax(const float *amax, size_t amax_count, size_t n, const char *name,
                               const char *fn)
{
    if (amax_count != n)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s has %zu amaxes for %zu tensors (expected as many as tensors)", fn,
                        name, amax_count, n);
    if (n > 0 && !amax)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument '%s' is NULL with n = %zu", fn,
                        name, n);
    return check_amax_aligned(amax, name, fn);
}

/* Elements are read and written whole (a misaligned pointer is a fault on
 * CUDA, which aborts the context; the host backend would not notice). */
static etp_status_t check_elem_aligned(const void *p, etp_dtype_t dtype, size_t i, size_t rows,
                                       size_t cols, const char *what, const char *fn)
{
    const size_t es = etp_dtype_size(dtype);
    if (es > 0 && (uintptr_t)p % es)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu of [%zu, %zu]: %s %p is not aligned to its %zu-byte %s "
                        "elements",
                        fn, i, rows, cols, what, p, es, etp_dtype_name(dtype));
    return ETP_SUCCESS;
}

static int qb_dtype(etp_dtype_t t)
{
    return t == ETP_DTYPE_BF16 ? ETP__QB_BF16 : ETP__QB_F32;
}

static etp_status_t check_input(const etp_quant_input_t *in, size_t i, const char *fn)
{
    if (in->dtype != ETP_DTYPE_BF16 && in->dtype != ETP_DTYPE_F32)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu of [%zu, %zu]: dtype %s is not supported (bf16 or f32)",
                        fn, i, in->rows, in->cols, etp_dtype_name(in->dtype));
    if (in->rows > ETP__Q_DIM_MAX || in->cols > ETP__Q_DIM_MAX)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu of [%zu, %zu]: rows and cols must be at most %zu", fn, i,
                        in->rows, in->cols, ETP__Q_DIM_MAX);
    if (!in->data && in->rows * in->cols > 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: tensor %zu of [%zu, %zu]: data is NULL", fn,
                        i, in->rows, in->cols);
    return check_elem_aligned(in->data, in->dtype, i, in->rows, in->cols, "data", fn);
}

static etp_status_t check_buffer(const void *p, size_t have, size_t need, size_t i, size_t rows,
                                 size_t cols, const char *what, const char *fn)
{
    if (need == 0) return ETP_SUCCESS;
    if (!p)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu of [%zu, %zu]: %s is NULL (needs %zu bytes)", fn, i, rows,
                        cols, what, need);
    if (have < need)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu of [%zu, %zu]: %s has %zu bytes, needs %zu", fn, i, rows,
                        cols, what, have, need);
    return ETP_SUCCESS;
}

static etp_status_t check_output(const etp_quantizer_t *q, const etp_quant_output_t *o, size_t i,
                                 size_t rows, size_t cols, const char *fn)
{
    etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
    ETP__TRY(sizes_of(q, rows, cols, i, fn, &s));
    ETP__TRY(check_buffer(o->rowwise_data, o->rowwise_data_bytes, s.rowwise_data_bytes, i, rows,
                          cols, "rowwise_data", fn));
    ETP__TRY(check_buffer(o->rowwise_scales, o->rowwise_scales_bytes, s.rowwise_scales_bytes, i,
                          rows, cols, "rowwise_scales", fn));
    ETP__TRY(check_buffer(o->columnwise_data, o->columnwise_data_bytes, s.columnwise_data_bytes, i,
                          rows, cols, "columnwise_data", fn));
    ETP__TRY(check_buffer(o->columnwise_scales, o->columnwise_scales_bytes,
                          s.columnwise_scales_bytes, i, rows, cols, "columnwise_scales", fn));
    return ETP_SUCCESS;
}

/* ---- launches --------------------------------------------------------------- */

static void batch_header(etp_quantizer_t *q, uint32_t op)
{
    etp__qbatch_t *b = &q->batch;
    memset(b, 0, offsetof(etp__qbatch_t, t));
    b->op = op;
    b->format = q->cfg.format == ETP_QUANT_NVFP4 ? ETP__QB_NVFP4 : ETP__QB_MXFP8;
    b->e5m2 = q->cfg.mxfp8_elem == ETP_QUANT_ELEM_E5M2;
    b->block2d = q->cfg.format == ETP_QUANT_NVFP4 && q->cfg.nvfp4_block == ETP_QUANT_BLOCK_2D;
    b->swizzle = (uint32_t)q->cfg.swizzle_scales;
    b->stochastic = q->cfg.rounding == ETP_QUANT_ROUND_STOCHASTIC;
    b->seed = q->cfg.seed;
    b->noop = q->cfg.noop_flag;
    b->workspace = q->workspace;
    b->sms = q->sms;
    b->clusters = q->clusters;
    b->compact_all = q->ctx->be->test.quant_compact_all ? 1u : 0u;
}

/* Launch the batch's header over tensors [0, n), ETP__QB_MAX at a time; fill(i, t)
 * describes tensor i. */
typedef void (*fill_fn_t)(const void *arg, size_t i, etp__qb_tensor_t *t);

static etp_status_t launch_all(etp_quantizer_t *q, etp_stream_t *stream, size_t n, fill_fn_t fill,
                               const void *arg)
{
    etp__qbatch_t *b = &q->batch;
    etp__be_t *be = q->ctx->be;
    ETP__TRY(etp__capture_note(q->ctx, &q->graph_refs, stream));
    for (size_t first = 0; first < n; first += ETP__QB_MAX) {
        const size_t cnt = n - first < ETP__QB_MAX ? n - first : ETP__QB_MAX;
        b->first = (uint32_t)first;
        b->n = (uint32_t)cnt;
        for (size_t k = 0; k < cnt; k++) {
            memset(&b->t[k], 0, sizeof b->t[k]);
            fill(arg, first + k, &b->t[k]);
        }
        ETP__TRY(be->ops->kernels->quant->run(be, stream->bs, b));
    }
    return ETP_SUCCESS;
}

typedef struct {
    const etp_quant_input_t *in;
    const etp_quant_output_t *out;
    const etp_quant_dest_t *dst;
    unsigned directions;
} fill_arg_t;

static void fill_input(const void *arg, size_t i, etp__qb_tensor_t *t)
{
    const fill_arg_t *a = arg;
    const etp_quant_input_t *in = &a->in[i];
    t->x = in->data;
    t->rows = (uint32_t)in->rows;
    t->cols = (uint32_t)in->cols;
    t->dtype = (uint8_t)qb_dtype(in->dtype);
    if (a->out) {
        if (a->directions & ETP_QUANT_ROWWISE) {
            t->row_data = a->out[i].rowwise_data;
            t->row_scales = a->out[i].rowwise_scales;
        }
        if (a->directions & ETP_QUANT_COLUMNWISE) {
            t->col_data = a->out[i].columnwise_data;
            t->col_scales = a->out[i].columnwise_scales;
        }
    }
}

static etp_status_t multi_amax(etp_quantizer_t *q, size_t n, const etp_quant_input_t *inputs,
                               float *amax_row, float *amax_col, etp_stream_t *stream)
{
    if (n == 0) return ETP_SUCCESS;
    batch_header(q, ETP__QB_AMAX);
    q->batch.amax_row = amax_row;
    q->batch.amax_col = amax_col;
    fill_arg_t a = {inputs, NULL, NULL, 0};
    return launch_all(q, stream, n, fill_input, &a);
}

static etp_status_t cast_only(etp_quantizer_t *q, size_t n, const etp_quant_input_t *inputs,
                              const float *amax, const etp_quant_output_t *outputs,
                              etp_stream_t *stream)
{
    if (n == 0) return ETP_SUCCESS;
    batch_header(q, ETP__QB_CAST);
    q->batch.amax = q->cfg.format == ETP_QUANT_NVFP4 ? amax : NULL;
    fill_arg_t a = {inputs, outputs, NULL, q->cfg.directions};
    return launch_all(q, stream, n, fill_input, &a);
}

etp_status_t etp_quant_multi_amax(etp_quantizer_t *quantizer, size_t n,
                                  const etp_quant_input_t *inputs, float *amax_rowwise,
                                  float *amax_columnwise, size_t amax_count, etp_stream_t *stream)
{
    const char *fn = "etp_quant_multi_amax";
    ETP__TRY(check_call(quantizer, n, inputs, "inputs", stream, fn));
    /* with n = 0 both arrays are empty, and may both be NULL */
    if (n > 0 && !amax_rowwise && !amax_columnwise)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: amax_rowwise and amax_columnwise are both NULL with n = %zu (give at "
                        "least one)", fn, n);
    if (amax_rowwise) ETP__TRY(check_amax(amax_rowwise, amax_count, n, "amax_rowwise", fn));
    if (amax_columnwise) ETP__TRY(check_amax(amax_columnwise, amax_count, n, "amax_columnwise", fn));
    for (size_t i = 0; i < n; i++) ETP__TRY(check_input(&inputs[i], i, fn));
    return multi_amax(quantizer, n, inputs, amax_rowwise, amax_columnwise, stream);
}

static etp_status_t amax_allreduce(etp_group_t *group, int role, float *amax, size_t n,
                                   etp_stream_t *stream)
{
    const char *fn = "etp_quant_amax_allreduce";
    ETP__CHECK_NULL(group, fn);
    ETP__CHECK_NULL(stream, fn);
    if (n > 0 && !amax)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'amax' is NULL with n = %zu", fn, n);
    ETP__TRY(check_amax_aligned(amax, "amax", fn));
    /* one collective for all n: the point of the split phases */
    return etp_allreduce(group, role, amax, amax, n, ETP_DTYPE_F32, ETP_REDOP_MAX, stream);
}

etp_status_t etp_quant_amax_allreduce(etp_group_t *group, int role, float *amax, size_t n,
                                      etp_stream_t *stream)
{
    etp__refusal_guard_t gd = etp__refusal_guard(group);
    return etp__refusal_guard_end(gd, amax_allreduce(group, role, amax, n, stream),
                                  "etp_quant_amax_allreduce");
}

static etp_status_t check_cast(etp_quantizer_t *q, size_t n, const etp_quant_input_t *inputs,
                               const float *amax, size_t amax_count,
                               const etp_quant_output_t *outputs, etp_stream_t *stream,
                               const char *fn)
{
    ETP__TRY(check_call(q, n, inputs, "inputs", stream, fn));
    if (n > 0 && !outputs)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'outputs' is NULL with n = %zu",
                        fn, n);
    if (q->cfg.format == ETP_QUANT_NVFP4) ETP__TRY(check_amax(amax, amax_count, n, "amax", fn));
    for (size_t i = 0; i < n; i++) {
        ETP__TRY(check_input(&inputs[i], i, fn));
        ETP__TRY(check_output(q, &outputs[i], i, inputs[i].rows, inputs[i].cols, fn));
    }
    return ETP_SUCCESS;
}

etp_status_t etp_quant_cast_only(etp_quantizer_t *quantizer, size_t n,
                                 const etp_quant_input_t *inputs, const float *amax,
                                 size_t amax_count, const etp_quant_output_t *outputs,
                                 etp_stream_t *stream)
{
    const char *fn = "etp_quant_cast_only";
    ETP__TRY(check_cast(quantizer, n, inputs, amax, amax_count, outputs, stream, fn));
    /* inside a batch an etp_quant_amax_allreduce before it runs only at the
     * batch's end: the cast would read each rank's local amaxes */
    ETP__TRY(etp__ctx_no_batch(quantizer->ctx, fn));
    return cast_only(quantizer, n, inputs, amax, outputs, stream);
}

static etp_status_t quantize(etp_quantizer_t *quantizer, size_t n,
                             const etp_quant_input_t *inputs, float *amax, size_t amax_count,
                             etp_group_t *group, int role, const etp_quant_output_t *outputs,
                             etp_stream_t *stream)
{
    const char *fn = "etp_quant_quantize";
    ETP__TRY(check_cast(quantizer, n, inputs, amax, amax_count, outputs, stream, fn));
    if (quantizer->cfg.format == ETP_QUANT_NVFP4) {
        if (group) {
            if (group->ctx != quantizer->ctx)
                return etp__err(ETP_ERR_INVALID_ARGUMENT,
                                "%s: group '%s' belongs to another context than the quantizer",
                                fn, group->name);
            if (role < 0 || role >= group->num_roles)
                return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: role %d not in [0, %d) of group '%s'",
                                fn, role, group->num_roles, group->name);
            /* the cast reads the all-reduce's result */
            ETP__TRY(etp__ctx_no_batch(group->ctx, fn));
        }
        ETP__TRY(multi_amax(quantizer, n, inputs, amax, NULL, stream));
        /* every rank issues the collective, even with n = 0, so that the
         * group's sequence stays the same on all ranks */
        if (group) ETP__TRY(etp_quant_amax_allreduce(group, role, amax, n, stream));
    }
    return cast_only(quantizer, n, inputs, amax, outputs, stream);
}

etp_status_t etp_quant_quantize(etp_quantizer_t *quantizer, size_t n,
                                const etp_quant_input_t *inputs, float *amax, size_t amax_count,
                                etp_group_t *group, int role, const etp_quant_output_t *outputs,
                                etp_stream_t *stream)
{
    /* with a group, NVFP4 quantization is collective (the amax all-reduce):
     * a refusal is recorded on the group */
    const int collective = group && quantizer && quantizer->cfg.format == ETP_QUANT_NVFP4;
    etp__refusal_guard_t gd = etp__refusal_guard(collective ? group : NULL);
    return etp__refusal_guard_end(gd,
                                  quantize(quantizer, n, inputs, amax, amax_count, group, role,
                                           outputs, stream),
                                  "etp_quant_quantize");
}

static void fill_dequant(const void *arg, size_t i, etp__qb_tensor_t *t)
{
    const fill_arg_t *a = arg;
    const etp_quant_dest_t *d = &a->dst[i];
    t->y = d->data;
    t->rows = (uint32_t)d->rows;
    t->cols = (uint32_t)d->cols;
    t->dtype = (uint8_t)qb_dtype(d->dtype);
    /* the kernel only reads these */
    if (a->directions == ETP_QUANT_ROWWISE) {
        t->row_data = a->out[i].rowwise_data;
        t->row_scales = a->out[i].rowwise_scales;
    } else {
        t->col_data = a->out[i].columnwise_data;
        t->col_scales = a->out[i].columnwise_scales;
    }
}

etp_status_t etp_quant_dequantize(etp_quantizer_t *quantizer, size_t n,
                                  const etp_quant_output_t *quantized, const float *amax,
                                  size_t amax_count, unsigned direction,
                                  const etp_quant_dest_t *dests, etp_stream_t *stream)
{
    const char *fn = "etp_quant_dequantize";
    etp_quantizer_t *q = quantizer;
    ETP__TRY(check_call(q, n, quantized, "quantized", stream, fn));
    if (n > 0 && !dests)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'dests' is NULL with n = %zu", fn,
                        n);
    if (direction != ETP_QUANT_ROWWISE && direction != ETP_QUANT_COLUMNWISE)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: direction %u (expected ETP_QUANT_ROWWISE or ETP_QUANT_COLUMNWISE)", fn,
                        direction);
    if (!(q->cfg.directions & direction))
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: the quantizer does not produce the %s direction", fn,
                        direction == ETP_QUANT_ROWWISE ? "rowwise" : "columnwise");
    if (q->cfg.format == ETP_QUANT_NVFP4) ETP__TRY(check_amax(amax, amax_count, n, "amax", fn));
    for (size_t i = 0; i < n; i++) {
        const etp_quant_dest_t *d = &dests[i];
        if (d->dtype != ETP_DTYPE_BF16 && d->dtype != ETP_DTYPE_F32)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "%s: tensor %zu of [%zu, %zu]: dtype %s is not supported (bf16 or f32)",
                            fn, i, d->rows, d->cols, etp_dtype_name(d->dtype));
        etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
        ETP__TRY(sizes_of(q, d->rows, d->cols, i, fn, &s));
        ETP__TRY(check_buffer(d->data, d->bytes, d->rows * d->cols * etp_dtype_size(d->dtype), i,
                              d->rows, d->cols, "dest data", fn));
        ETP__TRY(check_elem_aligned(d->data, d->dtype, i, d->rows, d->cols, "dest data", fn));
        const etp_quant_output_t *o = &quantized[i];
        if (direction == ETP_QUANT_ROWWISE) {
            ETP__TRY(check_buffer(o->rowwise_data, o->rowwise_data_bytes, s.rowwise_data_bytes, i,
                                  d->rows, d->cols, "rowwise_data", fn));
            ETP__TRY(check_buffer(o->rowwise_scales, o->rowwise_scales_bytes,
                                  s.rowwise_scales_bytes, i, d->rows, d->cols, "rowwise_scales", fn));
        } else {
            ETP__TRY(check_buffer(o->columnwise_data, o->columnwise_data_bytes,
                                  s.columnwise_data_bytes, i, d->rows, d->cols, "columnwise_data",
                                  fn));
            ETP__TRY(check_buffer(o->columnwise_scales, o->columnwise_scales_bytes,
                                  s.columnwise_scales_bytes, i, d->rows, d->cols,
                                  "columnwise_scales", fn));
        }
    }
    if (n == 0) return ETP_SUCCESS;
    batch_header(q, ETP__QB_DEQUANT);
    q->batch.amax = q->cfg.format == ETP_QUANT_NVFP4 ? amax : NULL;
    q->batch.direction = direction;
    fill_arg_t a = {NULL, quantized, dests, direction};
    return launch_all(q, stream, n, fill_dequant, &a);
}

/* ---- scale swizzle ------------------------------------------------------------ */

static int overlap(const void *a, size_t an, const void *b, size_t bn)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

/* One tensor's arguments: shapes agree, buffers hold their matrices, and no
 * out buffer overlaps an in buffer of the same tensor (the kernel reads
 * a chunk of one side while other blocks write the other). */
static etp_status_t check_scales(const etp_quantizer_t *q, const etp_quant_scales_t *in,
                                 const etp_quant_scales_t *out, size_t i, const char *fn)
{
    const size_t rows = in->rows, cols = in->cols;
    if (out->rows != rows || out->cols != cols)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: tensor %zu: in is [%zu, %zu] but out is [%zu, %zu] (expected the "
                        "same shape)",
                        fn, i, rows, cols, out->rows, out->cols);
    etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
    ETP__TRY(sizes_of(q, rows, cols, i, fn, &s));
    const size_t rb = s.rowwise_scales_bytes, cb = s.columnwise_scales_bytes;
    ETP__TRY(check_buffer(in->rowwise, in->rowwise_bytes, rb, i, rows, cols, "in rowwise", fn));
    ETP__TRY(check_buffer(in->columnwise, in->columnwise_bytes, cb, i, rows, cols, "in columnwise",
                          fn));
    ETP__TRY(check_buffer(out->rowwise, out->rowwise_bytes, rb, i, rows, cols, "out rowwise", fn));
    ETP__TRY(check_buffer(out->columnwise, out->columnwise_bytes, cb, i, rows, cols,
                          "out columnwise", fn));
    const void *ip[2] = {in->rowwise, in->columnwise}, *op[2] = {out->rowwise, out->columnwise};
    const size_t len[2] = {rb, cb};
    const char *name[2] = {"rowwise", "columnwise"};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            if (overlap(ip[a], len[a], op[b], len[b]))
                return etp__err(ETP_ERR_INVALID_ARGUMENT,
                                "%s: tensor %zu of [%zu, %zu]: out %s (%zu bytes) overlaps in %s "
                                "(%zu bytes): in place is not supported",
                                fn, i, rows, cols, name[b], len[b], name[a], len[a]);
    return ETP_SUCCESS;
}

etp_status_t etp_quant_swizzle_scales(etp_quantizer_t *quantizer, size_t n,
                                      const etp_quant_scales_t *in, const etp_quant_scales_t *out,
                                      etp_quant_swizzle_dir_t dir, etp_stream_t *stream)
{
    const char *fn = "etp_quant_swizzle_scales";
    etp_quantizer_t *q = quantizer;
    ETP__TRY(check_call(q, n, in, "in", stream, fn));
    if (n > 0 && !out)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'out' is NULL with n = %zu", fn, n);
    if (dir != ETP_QUANT_SWIZZLE && dir != ETP_QUANT_UNSWIZZLE)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: dir %d (expected ETP_QUANT_SWIZZLE or ETP_QUANT_UNSWIZZLE)", fn,
                        (int)dir);
    for (size_t i = 0; i < n; i++) ETP__TRY(check_scales(q, &in[i], &out[i], i, fn));

    etp__qswz_batch_t *b = &q->swz;
    memset(b, 0, offsetof(etp__qswz_batch_t, m));
    b->unswizzle = dir == ETP_QUANT_UNSWIZZLE;
    b->sms = q->sms;
    b->noop = q->cfg.noop_flag;
    etp__be_t *be = q->ctx->be;
    const int mx = q->cfg.format == ETP_QUANT_MXFP8;
    for (size_t i = 0; i < n; i++) {
        etp_quant_sizes_t s = ETP_QUANT_SIZES_INIT;
        ETP__TRY(sizes_of(q, in[i].rows, in[i].cols, i, fn, &s));
        for (int col = 0; col < 2; col++) {
            const size_t rows = col ? s.columnwise_scale_rows : s.rowwise_scale_rows;
            const size_t cols = col ? s.columnwise_scale_cols : s.rowwise_scale_cols;
            if (rows * cols == 0) continue; /* not produced, or empty */
            etp__qswz_mat_t *m = &b->m[b->n++];
            memset(m, 0, sizeof *m);
            m->in = col ? in[i].columnwise : in[i].rowwise;
            m->out = col ? out[i].columnwise : out[i].rowwise;
            m->rows = (uint32_t)rows;
            m->cols = (uint32_t)cols;
            m->mxfp8_col = (uint32_t)(mx && col);
            if (b->n == ETP__QSWZ_MAX) {
                ETP__TRY(be->ops->kernels->quant->swizzle(be, stream->bs, b));
                b->n = 0;
            }
        }
    }
    if (b->n > 0) ETP__TRY(be->ops->kernels->quant->swizzle(be, stream->bs, b));
    return ETP_SUCCESS;
}
