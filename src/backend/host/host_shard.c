/* Host kernels of the shard module: the reference for cuda_shard.c. */
#include <math.h>
#include <string.h>

#include "../../core/half.h"
#include "../kernels_shard.h"
#include "host_internal.h"

static float load(const void *p, etp_dtype_t t, int64_t i)
{
    return t == ETP_DTYPE_BF16 ? etp__bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void store(void *p, etp_dtype_t t, int64_t i, float v)
{
    if (t == ETP_DTYPE_BF16)
        ((uint16_t *)p)[i] = etp__f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

typedef struct {
    float *dst;
    const void *src;
    etp_dtype_t src_dtype;
    etp__shard_geom_t g;
    int nsrc;
    int64_t rstride, estride;
    float scale;
    int store;
} acc_args_t;

static void acc_run(void *p)
{
    const acc_args_t *a = p;
    for (int64_t e = 0; e < a->g.experts; e++)
        for (int64_t i = 0; i < a->g.valid_rows * a->g.cols; i++) {
            float x = 0.0f;
            for (int r = 0; r < a->nsrc; r++) x += load(a->src, a->src_dtype, e * a->estride + r * a->rstride + i);
            int64_t k = e * a->g.stride + i;
            a->dst[k] = fmaf(a->scale, x, a->store ? 0.0f : a->dst[k]);
        }
}

static etp_status_t host_accumulate(etp__be_t *be, etp__bstream_t *s, float *dst, const void *src,
                                    etp_dtype_t src_dtype, etp__shard_geom_t g, int nsrc,
                                    int64_t src_rstride, int64_t src_estride, float scale, int store)
{
    acc_args_t a = {dst, src, src_dtype, g, nsrc, src_rstride, src_estride, scale, store};
    return etp__host_launch(be, s, acc_run, &a, sizeof a);
}

typedef struct {
    void *dst;
    etp_dtype_t dst_dtype;
    int64_t dst_stride;
    const void *src;
    etp_dtype_t src_dtype;
    int64_t src_stride, src_ld;
    etp__shard_geom_t g;
} conv_args_t;

static void conv_run(void *p)
{
    const conv_args_t *a = p;
    for (int64_t e = 0; e < a->g.experts; e++)
        for (int64_t i = 0; i < a->g.rows; i++)
            for (int64_t c = 0; c < a->g.cols; c++) {
                float v = i < a->g.valid_rows
                              ? load(a->src, a->src_dtype, e * a->src_stride + i * a->src_ld + c)
                              : 0.0f;
                store(a->dst, a->dst_dtype, e * a->dst_stride + i * a->g.cols + c, v);
            }
}

static etp_status_t host_convert_rows(etp__be_t *be, etp__bstream_t *s, void *dst,
                                      etp_dtype_t dst_dtype, int64_t dst_stride, const void *src,
                                      etp_dtype_t src_dtype, int64_t src_stride, int64_t src_ld,
                                      etp__shard_geom_t g)
{
    conv_args_t a = {dst, dst_dtype, dst_stride, src, src_dtype, src_stride, src_ld, g};
    return etp__host_launch(be, s, conv_run, &a, sizeof a);
}

typedef struct {
    const float *x;
    etp__shard_geom_t g;
    double *out;
} stats_args_t;

static void stats_run(void *p)
{
    const stats_args_t *a = p;
    double sum = 0, bad = 0;
    for (int64_t e = 0; e < a->g.experts; e++)
        for (int64_t i = 0; i < a->g.valid_rows * a->g.cols; i++) {
            float v = a->x[e * a->g.stride + i];
            if (isfinite(v))
                sum += (double)v * (double)v;
            else
                bad += 1;
        }
    a->out[0] += sum;
    a->out[1] += bad;
}

static etp_status_t host_grad_stats(etp__be_t *be, etp__bstream_t *s, const float *x,
                                    etp__shard_geom_t g, double *out)
{
    stats_args_t a = {x, g, out};
    return etp__host_launch(be, s, stats_run, &a, sizeof a);
}

typedef struct {
    char *dst;
    size_t dpitch;
    const char *src;
    size_t spitch, width, rows;
} copy2d_args_t;

static void copy2d_run(void *p)
{
    const copy2d_args_t *a = p;
    for (size_t r = 0; r < a->rows; r++) memcpy(a->dst + r * a->dpitch, a->src + r * a->spitch, a->width);
}

static etp_status_t host_copy2d(etp__be_t *be, etp__bstream_t *s, void *dst, size_t dpitch,
                                const void *src, size_t spitch, size_t width, size_t rows)
{
    copy2d_args_t a = {dst, dpitch, src, spitch, width, rows};
    return etp__host_launch(be, s, copy2d_run, &a, sizeof a);
}

const etp__shard_kernels_t etp__host_shard_kernels = {
    .copy2d = host_copy2d,
    .accumulate = host_accumulate,
    .convert_rows = host_convert_rows,
    .grad_stats = host_grad_stats,
};
