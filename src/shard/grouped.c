/* One grouped all-gather for all experts of a parameter: NCCL fuses the
 * per-expert calls of a batch into one launch. */
#include "shard_internal.h"

typedef etp_status_t (*one_fn_t)(etp_group_t *g, int role, const void *src, void *dst, size_t count,
                                 etp_dtype_t dtype, etp_stream_t *s);

static etp_status_t ag_one(etp_group_t *g, int role, const void *src, void *dst, size_t count,
                           etp_dtype_t dtype, etp_stream_t *s)
{
    return etp_allgather(g, role, src, dst, count, dtype, s);
}

static etp_status_t grouped(one_fn_t one, etp_group_t *g, int role, const char *src,
                            size_t src_stride, char *dst, size_t dst_stride, size_t count,
                            etp_dtype_t dtype, int64_t experts, etp_stream_t *s)
{
    if (experts == 1) return one(g, role, src, dst, count, dtype, s);
    ETP__TRY(etp_batch_begin(g->ctx));
    etp_status_t st = ETP_SUCCESS;
    for (int64_t e = 0; e < experts && st == ETP_SUCCESS; e++)
        st = one(g, role, src + (size_t)e * src_stride, dst + (size_t)e * dst_stride, count, dtype, s);
    etp_status_t st2 = etp_batch_end(g->ctx);
    return st != ETP_SUCCESS ? st : st2;
}

etp_status_t etp__grouped_allgather(etp_group_t *g, int role, const void *src, size_t src_stride,
                                    void *dst, size_t dst_stride, size_t count, etp_dtype_t dtype,
                                    int64_t experts, etp_stream_t *s)
{
    return grouped(ag_one, g, role, src, src_stride, dst, dst_stride, count, dtype, experts, s);
}

etp_status_t etp__grouped_allgather_inplace(etp_group_t *g, int role, const void *src,
                                            size_t src_stride, void *dst, size_t dst_stride,
                                            size_t count, etp_dtype_t dtype, int64_t experts,
                                            etp_stream_t *s)
{
    const size_t bytes = count * etp_dtype_size(dtype);
    char *mine = (char *)dst + (size_t)g->rank * bytes;
    if (bytes && experts > 0) {
        etp__be_t *be = g->ctx->be;
        ETP__TRY(be->ops->kernels->shard->copy2d(be, s->bs, mine, dst_stride, src, src_stride, bytes,
                                                 (size_t)experts));
    }
    return grouped(ag_one, g, role, mine, dst_stride, dst, dst_stride, count, dtype, experts, s);
}

etp_status_t etp__slot_allgather(etp_group_t *g, int role, int window, const void *src,
                                 size_t src_stride, void *dst, size_t dst_stride, size_t count,
                                 etp_dtype_t dtype, int64_t experts, etp_stream_t *s)
{
    if (window)
        return etp__grouped_allgather_inplace(g, role, src, src_stride, dst, dst_stride, count,
                                              dtype, experts, s);
    return etp__grouped_allgather(g, role, src, src_stride, dst, dst_stride, count, dtype, experts,
                                  s);
}
