/*
 * The host reference quantizer and dequantizer (see quant_ref.h). Each
 * function follows docs/FORMATS.md line by line: find the block, take its
 * amax, derive its scale, multiply, round. Nothing is fused or reordered.
 */
#include "quant_ref.h"

#include <string.h>

/* Zero a whole scale matrix (its padding stays zero); nothing for an empty one. */
static void clear_scales(uint8_t *scales, etp__qf_scale_shape_t sh)
{
    if (sh.rows > 0 && sh.cols > 0) memset(scales, 0, sh.rows * sh.cols);
}

static float load(const void *x, int dtype, size_t i)
{
    if (dtype == ETP__QB_BF16) return etp__qf_bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

static void store(void *y, int dtype, size_t i, float v)
{
    if (dtype == ETP__QB_BF16)
        ((uint16_t *)y)[i] = etp__qf_f32_to_bf16(v);
    else
        ((float *)y)[i] = v;
}

/* Set nibble `i` of a packed FP4 row (even index in the low nibble). */
static void put_nibble(uint8_t *row, size_t i, uint8_t code)
{
    uint8_t *b = &row[i / 2];
    if (i % 2 == 0)
        *b = (uint8_t)((*b & 0xf0u) | code);
    else
        *b = (uint8_t)((*b & 0x0fu) | (uint8_t)(code << 4));
}

static uint8_t get_nibble(const uint8_t *row, size_t i)
{
    return (uint8_t)((row[i / 2] >> (4 * (i % 2))) & 0xfu);
}

/* amax of the region rows [r0, r1) x cols [c0, c1) of x[., cols]. */
static float region_amax(const void *x, int dtype, size_t cols, size_t r0, size_t r1, size_t c0,
                         size_t c1)
{
    float a = 0.0f;
    for (size_t i = r0; i < r1; i++)
        for (size_t j = c0; j < c1; j++) a = etp__qf_amax_step(a, load(x, dtype, i * cols + j));
    return a;
}

float etp__qref_amax(const void *x, int dtype, size_t rows, size_t cols)
{
    return region_amax(x, dtype, cols, 0, rows, 0, cols);
}

/* ---- NVFP4 ---------------------------------------------------------------- */

typedef struct nvfp4_ctx {
    const etp__qref_cfg_t *cfg;
    const void *x;
    int dtype;
    size_t rows, cols;
    float s_enc_6, s_dec;
} nvfp4_ctx_t;

static uint8_t nvfp4_element(const nvfp4_ctx_t *c, size_t i, size_t j, float m, uint32_t dir)
{
    const float v = load(c->x, c->dtype, i * c->cols + j) * m;
    if (c->cfg->stochastic)
        return etp__qf_e2m1_sr_satfinite(
            v, etp__qf_sr_bits(c->cfg->seed, c->cfg->tensor, dir, (uint64_t)i * c->cols + j));
    return etp__qf_e2m1_rne_satfinite(v);
}

/* Rowwise: blocks of bh rows (1, or 16 for 2D) by 16 columns. Each block's
 * scale goes on every one of its rows, at (row, column block). */
static void nvfp4_rowwise(const nvfp4_ctx_t *c, uint8_t *data, uint8_t *scales)
{
    const etp__qf_scale_shape_t sh = etp__qf_nvfp4_row_scales(c->rows, c->cols);
    clear_scales(scales, sh);
    const size_t bh = c->cfg->block2d ? 16 : 1;
    for (size_t r0 = 0; r0 < c->rows; r0 += bh) {
        const size_t r1 = r0 + bh < c->rows ? r0 + bh : c->rows;
        for (size_t kb = 0; kb < c->cols / 16; kb++) {
            const float bamax = region_amax(c->x, c->dtype, c->cols, r0, r1, kb * 16, kb * 16 + 16);
            const uint8_t sc = etp__qf_nvfp4_block_scale(bamax, c->s_enc_6);
            const float m = etp__qf_nvfp4_multiplier(sc, c->s_dec);
            for (size_t i = r0; i < r1; i++) {
                scales[etp__qf_scale_offset(i, kb, sh.cols, c->cfg->swizzle)] = sc;
                for (size_t j = kb * 16; j < kb * 16 + 16; j++)
                    put_nibble(data + i * (c->cols / 2), j, nvfp4_element(c, i, j, m, 0));
            }
        }
    }
}

/* Columnwise: the transpose [K, M] quantized rowwise, blocks of 16 rows of
 * the original by bw columns (1, or 16 for 2D: the very blocks of the
 * rowwise direction, so both directions share scales and multipliers). */
static void nvfp4_columnwise(const nvfp4_ctx_t *c, uint8_t *data, uint8_t *scales)
{
    const etp__qf_scale_shape_t sh = etp__qf_nvfp4_col_scales(c->rows, c->cols);
    clear_scales(scales, sh);
    const size_t bw = c->cfg->block2d ? 16 : 1;
    for (size_t mb = 0; mb < c->rows / 16; mb++) {
        for (size_t c0 = 0; c0 < c->cols; c0 += bw) {
            const size_t c1 = c0 + bw < c->cols ? c0 + bw : c->cols;
            const float bamax = region_amax(c->x, c->dtype, c->cols, mb * 16, mb * 16 + 16, c0, c1);
            const uint8_t sc = etp__qf_nvfp4_block_scale(bamax, c->s_enc_6);
            const float m = etp__qf_nvfp4_multiplier(sc, c->s_dec);
            for (size_t j = c0; j < c1; j++) {
                scales[etp__qf_scale_offset(j, mb, sh.cols, c->cfg->swizzle)] = sc;
                for (size_t i = mb * 16; i < mb * 16 + 16; i++)
                    put_nibble(data + j * (c->rows / 2), i, nvfp4_element(c, i, j, m, 1));
            }
        }
    }
}

/* ---- MXFP8 ---------------------------------------------------------------- */

static void mxfp8_rowwise(const etp__qref_cfg_t *cfg, const void *x, int dtype, size_t rows,
                          size_t cols, uint8_t *data, uint8_t *scales)
{
    const etp__qf_scale_shape_t sh = etp__qf_mxfp8_row_scales(rows, cols);
    clear_scales(scales, sh);
    const float inv_max = etp__qf_mxfp8_inv_max(cfg->e5m2);
    for (size_t i = 0; i < rows; i++)
        for (size_t kb = 0; kb < cols / 32; kb++) {
            const float bamax = region_amax(x, dtype, cols, i, i + 1, kb * 32, kb * 32 + 32);
            const uint8_t e = etp__qf_mxfp8_scale(bamax, inv_max);
            const float s = etp__qf_mxfp8_multiplier(e);
            scales[etp__qf_scale_offset(i, kb, sh.cols, cfg->swizzle)] = e;
            for (size_t j = kb * 32; j < kb * 32 + 32; j++)
                data[i * cols + j] = etp__qf_mxfp8_encode(load(x, dtype, i * cols + j), s, cfg->e5m2);
        }
}

static void mxfp8_columnwise(const etp__qref_cfg_t *cfg, const void *x, int dtype, size_t rows,
                             size_t cols, uint8_t *data, uint8_t *scales)
{
    const etp__qf_scale_shape_t sh = etp__qf_mxfp8_col_scales(rows, cols);
    clear_scales(scales, sh);
    const float inv_max = etp__qf_mxfp8_inv_max(cfg->e5m2);
    for (size_t mb = 0; mb < rows / 32; mb++)
        for (size_t j = 0; j < cols; j++) {
            const float bamax = region_amax(x, dtype, cols, mb * 32, mb * 32 + 32, j, j + 1);
            const uint8_t e = etp__qf_mxfp8_scale(bamax, inv_max);
            const float s = etp__qf_mxfp8_multiplier(e);
            scales[etp__qf_mxfp8_col_scale_offset(mb, j, sh, cfg->swizzle)] = e;
            for (size_t i = mb * 32; i < mb * 32 + 32; i++)
                data[i * cols + j] = etp__qf_mxfp8_encode(load(x, dtype, i * cols + j), s, cfg->e5m2);
        }
}

void etp__qref_quantize(const etp__qref_cfg_t *cfg, const void *x, int dtype, size_t rows,
                        size_t cols, float amax, uint8_t *row_data, uint8_t *row_scales,
                        uint8_t *col_data, uint8_t *col_scales)
{
    if (cfg->format == ETP__QB_NVFP4) {
        const float s_enc = etp__qf_nvfp4_s_enc(amax);
        nvfp4_ctx_t c = {cfg, x, dtype, rows, cols, etp__qf_nvfp4_s_enc_6(s_enc), 1.0f / s_enc};
        if (row_data) nvfp4_rowwise(&c, row_data, row_scales);
        if (col_data) nvfp4_columnwise(&c, col_data, col_scales);
    } else {
        if (row_data) mxfp8_rowwise(cfg, x, dtype, rows, cols, row_data, row_scales);
        if (col_data) mxfp8_columnwise(cfg, x, dtype, rows, cols, col_data, col_scales);
    }
}

void etp__qref_dequantize(const etp__qref_cfg_t *cfg, unsigned direction, size_t rows,
                          size_t cols, float amax, const uint8_t *data, const uint8_t *scales,
                          void *y, int dtype)
{
    const int col = direction == 2;
    if (cfg->format == ETP__QB_NVFP4) {
        const float s_dec = 1.0f / etp__qf_nvfp4_s_enc(amax);
        const etp__qf_scale_shape_t sh = col ? etp__qf_nvfp4_col_scales(rows, cols)
                                             : etp__qf_nvfp4_row_scales(rows, cols);
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++) {
                /* the stored matrix is [rows, cols] rowwise, its transpose columnwise */
                const size_t r = col ? j : i, k = col ? i : j, ld = col ? rows : cols;
                const uint8_t q = get_nibble(data + r * (ld / 2), k);
                const uint8_t sc = scales[etp__qf_scale_offset(r, k / 16, sh.cols, cfg->swizzle)];
                store(y, dtype, i * cols + j, etp__qf_nvfp4_decode(q, sc, s_dec));
            }
    } else {
        const etp__qf_scale_shape_t sh = col ? etp__qf_mxfp8_col_scales(rows, cols)
                                             : etp__qf_mxfp8_row_scales(rows, cols);
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++) {
                const size_t off = col ? etp__qf_mxfp8_col_scale_offset(i / 32, j, sh, cfg->swizzle)
                                       : etp__qf_scale_offset(i, j / 32, sh.cols, cfg->swizzle);
                store(y, dtype, i * cols + j,
                      etp__qf_mxfp8_decode(data[i * cols + j], scales[off], cfg->e5m2));
            }
    }
}

void etp__qref_run_batch(const etp__qbatch_t *b)
{
    if (b->noop && *b->noop != 0) return;
    for (uint32_t i = 0; i < b->n; i++) {
        const etp__qb_tensor_t *t = &b->t[i];
        const uint32_t idx = b->first + i;
        etp__qref_cfg_t cfg = {(int)b->format, (int)b->e5m2, (int)b->block2d, (int)b->swizzle,
                               (int)b->stochastic, b->seed, idx};
        switch (b->op) {
        case ETP__QB_AMAX: {
            const float a = etp__qref_amax(t->x, t->dtype, t->rows, t->cols);
            if (b->amax_row) b->amax_row[idx] = a;
            if (b->amax_col) b->amax_col[idx] = a;
            break;
        }
        case ETP__QB_CAST:
            etp__qref_quantize(&cfg, t->x, t->dtype, t->rows, t->cols,
                               b->amax ? b->amax[idx] : 0.0f, t->row_data, t->row_scales,
                               t->col_data, t->col_scales);
            break;
        case ETP__QB_DEQUANT: {
            const int col = b->direction == 2;
            etp__qref_dequantize(&cfg, b->direction, t->rows, t->cols,
                                 b->amax ? b->amax[idx] : 0.0f, col ? t->col_data : t->row_data,
                                 col ? t->col_scales : t->row_scales, t->y, t->dtype);
            break;
        }
        default: break;
        }
    }
}

/* ---- scale swizzle -------------------------------------------------------- */

void etp__qref_swizzle(const uint8_t *in, uint8_t *out, size_t rows, size_t cols, int mxfp8_col,
                       int unswizzle)
{
    const etp__qf_scale_shape_t sh = {rows, cols};
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            /* the very offsets the cast uses for entry (r, c) */
            const size_t rm = r * cols + c;
            const size_t sw = mxfp8_col ? etp__qf_mxfp8_col_scale_offset(r, c, sh, 1)
                                        : etp__qf_scale_offset(r, c, cols, 1);
            if (unswizzle)
                out[rm] = in[sw];
            else
                out[sw] = in[rm];
        }
}

void etp__qref_run_swizzle(const etp__qswz_batch_t *b)
{
    if (b->noop && *b->noop != 0) return;
    for (uint32_t i = 0; i < b->n; i++) {
        const etp__qswz_mat_t *m = &b->m[i];
        etp__qref_swizzle(m->in, m->out, m->rows, m->cols, (int)m->mxfp8_col, (int)b->unswizzle);
    }
}
