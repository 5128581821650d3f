/* One grouped all-gather for all experts of a parameter: NCCL fuses the
 * per-expert calls of a batch into one launch. */
#include "shard_internal.h"

etp_status_t etp__grouped_allgather(etp_group_t *g, int role, const void *src, size_t src_stride,
                                    void *dst, size_t dst_stride, size_t count, etp_dtype_t dtype,
                                    int64_t experts, etp_stream_t *s)
{
    if (experts == 1) return etp_allgather(g, role, src, dst, count, dtype, s);
    ETP__TRY(etp_batch_begin(g->ctx));
    etp_status_t st = ETP_SUCCESS;
    for (int64_t e = 0; e < experts && st == ETP_SUCCESS; e++)
        st = etp_allgather(g, role, (const char *)src + (size_t)e * src_stride,
                           (char *)dst + (size_t)e * dst_stride, count, dtype, s);
    etp_status_t st2 = etp_batch_end(g->ctx);
    return st != ETP_SUCCESS ? st : st2;
}

etp_status_t etp__grouped_allgather_inplace(etp_group_t *g, int role, const void *src,
                                            size_t src_stride, void *dst, size_t dst_stride,
                                            size_t count, etp_dtype_t dtype, int64_t experts,
                                            etp_stream_t *s)
{
    return etp__slot_allgather_copy_on(g, role, src, src_stride, dst, dst_stride, count, dtype, experts, s,
                                       NULL, s);
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

etp_status_t etp__slot_allgather_copy_on(etp_group_t *g, int role, const void *src, size_t src_stride,
                                         void *dst, size_t dst_stride, size_t count, etp_dtype_t dtype,
                                         int64_t experts, etp_stream_t *copy_stream, etp_event_t *ev,
                                         etp_stream_t *s)
{
    const size_t bytes = count * etp_dtype_size(dtype);
    char *mine = (char *)dst + (size_t)g->rank * bytes;
    if (bytes && experts > 0) {
        etp__be_t *be = g->ctx->be;
        ETP__TRY(be->ops->kernels->shard->copy2d(be, copy_stream->bs, mine, dst_stride, src, src_stride,
                                                 bytes, (size_t)experts));
        /* ev NULL with another stream: the hand-off left out (a test of the edge) */
        if (ev && copy_stream != s) {
            ETP__TRY(etp_event_record(ev, copy_stream));
            ETP__TRY(etp_stream_wait_event(s, ev));
        }
    }
    return etp__grouped_allgather(g, role, mine, dst_stride, dst, dst_stride, count, dtype, experts, s);
}
