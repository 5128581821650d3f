/* The collectives front end: argument checks, sequence numbers, dispatch. */
#include <stdint.h>

#include "comm_internal.h"

static etp_status_t check_common(etp_group_t *g, int role, etp_dtype_t dtype, etp_stream_t *s,
                                 const char *fn)
{
    if (!g) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'group' is NULL", fn);
    if (!s) return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument 'stream' is NULL", fn);
    if (role < 0 || role >= g->num_roles)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: role %d not in [0, %d) of group '%s'", fn,
                        role, g->num_roles, g->name);
    if (etp_dtype_size(dtype) == 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: dtype %d is not an etp_dtype_t", fn,
                        (int)dtype);
    if (s->ctx != g->ctx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: the stream belongs to another context than group '%s'", fn, g->name);
    return etp__ctx_usable(g->ctx, fn);
}

static etp_status_t check_redop(etp_redop_t op, const char *fn)
{
    if (op != ETP_REDOP_SUM && op != ETP_REDOP_MAX)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: op %d is not an etp_redop_t", fn, (int)op);
    return ETP_SUCCESS;
}

static etp_status_t check_buffers(const void *send, const void *recv, size_t count, const char *fn)
{
    if (count > 0 && (!send || !recv))
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn,
                        send ? "recv" : "send", count);
    return ETP_SUCCESS;
}

static etp_status_t issue(etp_group_t *g, int role, etp__coll_t *d, etp_stream_t *s,
                          const char *fn)
{
    /* this rank's own refusals first: one while an earlier refusal's
     * outcome is pending counts with it, as on the other ranks */
    etp_status_t noted = etp__capture_note_group(g, s);
    if (noted == ETP_SUCCESS) noted = etp__stream_order_use(g, role, s, fn, 0);
    if (noted != ETP_SUCCESS) return etp__group_refused(g, noted, fn);
    ETP__TRY(etp__group_ready(g, 1, fn));
    ETP__TRY(etp__stream_order_use(g, role, s, fn, 1));
    d->group_name = g->name;
    d->role = role;
    d->seq = ++g->seq[role];
    etp__be_t *be = g->ctx->be;
    ETP__LOG(&g->ctx->log, ETP_LOG_DEBUG, ETP_SUBSYS_COMM, "%s seq %llu group '%s' role %d count %zu %s",
             etp__coll_name(d->kind), (unsigned long long)d->seq, g->name, role, d->count,
             etp_dtype_name(d->dtype));
    etp_status_t st = be->ops->coll(be, g->comms[role], d, s->bs);
    /* refused on this rank before anything reached a peer (the backend
     * fails the context otherwise): the number is not used */
    if (st != ETP_SUCCESS && !be->failed) {
        g->seq[role]--;
        return etp__group_refused(g, st, fn);
    }
    return st;
}

/* A collective refused on this rank: recorded on its group (refusal.c). */
#define REFUSE_ON_FAIL(group, expr, fn)                                   \
    do {                                                                  \
        etp_status_t st_ = (expr);                                        \
        if (st_ != ETP_SUCCESS) return etp__group_refused(group, st_, fn); \
    } while (0)

etp_status_t etp_allgather(etp_group_t *group, int role, const void *send, void *recv, size_t count,
                           etp_dtype_t dtype, etp_stream_t *stream)
{
    const char *fn = "etp_allgather";
    REFUSE_ON_FAIL(group, check_common(group, role, dtype, stream, fn), fn);
    REFUSE_ON_FAIL(group, check_buffers(send, recv, count, fn), fn);
    etp__coll_t d = {.kind = ETP__COLL_ALLGATHER, .send = send, .recv = recv, .count = count,
                     .dtype = dtype};
    return issue(group, role, &d, stream, fn);
}

etp_status_t etp_reduce_scatter(etp_group_t *group, int role, const void *send, void *recv,
                                size_t recvcount, etp_dtype_t dtype, etp_redop_t op,
                                etp_stream_t *stream)
{
    const char *fn = "etp_reduce_scatter";
    REFUSE_ON_FAIL(group, check_common(group, role, dtype, stream, fn), fn);
    REFUSE_ON_FAIL(group, check_redop(op, fn), fn);
    REFUSE_ON_FAIL(group, check_buffers(send, recv, recvcount, fn), fn);
    etp__coll_t d = {.kind = ETP__COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                     .count = recvcount, .dtype = dtype, .op = op};
    return issue(group, role, &d, stream, fn);
}

etp_status_t etp_allreduce(etp_group_t *group, int role, const void *send, void *recv, size_t count,
                           etp_dtype_t dtype, etp_redop_t op, etp_stream_t *stream)
{
    const char *fn = "etp_allreduce";
    REFUSE_ON_FAIL(group, check_common(group, role, dtype, stream, fn), fn);
    REFUSE_ON_FAIL(group, check_redop(op, fn), fn);
    REFUSE_ON_FAIL(group, check_buffers(send, recv, count, fn), fn);
    etp__coll_t d = {.kind = ETP__COLL_ALLREDUCE, .send = send, .recv = recv, .count = count,
                     .dtype = dtype, .op = op};
    return issue(group, role, &d, stream, fn);
}

static etp_status_t check_alltoallv(etp_group_t *group, int role, const void *send,
                                    const size_t *sendcounts, const size_t *sdispls, void *recv,
                                    const size_t *recvcounts, const size_t *rdispls,
                                    etp_dtype_t dtype, etp_stream_t *stream, size_t *total)
{
    const char *fn = "etp_alltoallv";
    ETP__TRY(check_common(group, role, dtype, stream, fn));
    ETP__CHECK_NULL(sendcounts, fn);
    ETP__CHECK_NULL(sdispls, fn);
    ETP__CHECK_NULL(recvcounts, fn);
    ETP__CHECK_NULL(rdispls, fn);
    size_t sent = 0, received = 0;
    for (int p = 0; p < group->size; p++) {
        /* sums and ends that wrap around would pass every check below */
        ETP__CHECK_ARG(sendcounts[p] <= SIZE_MAX - sent && recvcounts[p] <= SIZE_MAX - received &&
                           sdispls[p] <= SIZE_MAX - sendcounts[p] && rdispls[p] <= SIZE_MAX - recvcounts[p],
                       "%s: counts or displacements of rank %d overflow", fn, p);
        sent += sendcounts[p];
        received += recvcounts[p];
    }
    ETP__CHECK_ARG(sent == 0 || send != NULL, "%s: send is NULL with %zu elements to send", fn, sent);
    ETP__CHECK_ARG(received == 0 || recv != NULL, "%s: recv is NULL with %zu elements to receive",
                   fn, received);
    *total = sent;
    return ETP_SUCCESS;
}

etp_status_t etp_alltoallv(etp_group_t *group, int role, const void *send, const size_t *sendcounts,
                           const size_t *sdispls, void *recv, const size_t *recvcounts,
                           const size_t *rdispls, etp_dtype_t dtype, etp_stream_t *stream)
{
    const char *fn = "etp_alltoallv";
    size_t sent = 0;
    REFUSE_ON_FAIL(group,
                   check_alltoallv(group, role, send, sendcounts, sdispls, recv, recvcounts,
                                   rdispls, dtype, stream, &sent),
                   fn);
    etp__coll_t d = {.kind = ETP__COLL_ALLTOALLV, .send = send, .recv = recv, .count = sent,
                     .dtype = dtype, .sendcounts = sendcounts, .sdispls = sdispls,
                     .recvcounts = recvcounts, .rdispls = rdispls};
    return issue(group, role, &d, stream, fn);
}

etp_status_t etp__ctx_no_batch(const etp_context_t *ctx, const char *fn)
{
    if (ctx->batch_depth > 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: not inside etp_batch_begin/end (its own work reads collectives' "
                        "results, which a batch launches only at its end)", fn);
    return ETP_SUCCESS;
}

etp_status_t etp__ctx_no_capture(const etp_context_t *ctx, const char *fn)
{
    if (ctx->captures > 0 && !ctx->be->failed)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: a graph capture is in progress on this context (call it after "
                        "etp_stream_end_capture)", fn);
    return ETP_SUCCESS;
}

etp_status_t etp_batch_begin(etp_context_t *ctx)
{
    ETP__CHECK_NULL(ctx, "etp_batch_begin");
    ETP__TRY(etp__ctx_usable(ctx, "etp_batch_begin"));
    ETP__TRY(ctx->be->ops->batch_begin(ctx->be));
    ctx->batch_depth++;
    return ETP_SUCCESS;
}

etp_status_t etp_batch_end(etp_context_t *ctx)
{
    ETP__CHECK_NULL(ctx, "etp_batch_end");
    if (ctx->batch_depth == 0)
        return etp__err(ETP_ERR_INVALID_STATE, "etp_batch_end: no etp_batch_begin is open");
    ETP__TRY(etp__ctx_usable(ctx, "etp_batch_end"));
    ctx->batch_depth--;
    return ctx->be->ops->batch_end(ctx->be);
}
