/*
 * Runs of copy-engine collectives. A grouped parameter's gather is one
 * in-place all-gather per expert, and its gradient's reduce-scatter one
 * all-to-all per expert, each a fixed stride after the last. NCCL runs
 * every copy-engine collective as a barrier, its copies and a barrier, one
 * after the other even inside a group: on 2 H200s, 32 experts' all-gathers
 * of 16 MiB took 1.92 ms where one all-gather of the same 512 MiB took 1.40
 * ms, as fast as one 2D peer copy of the 32 strided pieces (docs/PERF.md).
 *
 * So inside a batch such collectives are held back and issued after the
 * batch's NCCL group (they are unordered within a batch anyway). A run of n
 * >= 3 with a common stride becomes:
 *   1. the first through NCCL: its closing barrier means every rank has
 *      reached the run, so every destination is free to write;
 *   2. per destination rank, one 2D copy of the middle n - 2 pieces into
 *      that rank's window (NCCL's LSA address of it), on the same stream;
 *   3. the last through NCCL: its opening barrier means every rank's copies
 *      of step 2 are done, so when it completes the run has arrived.
 * Every rank holds back and fuses the same calls (the windows' peer
 * addresses are agreed at allocation), so the NCCL calls still match.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cuda_internal.h"

#if ETP__CUDA_HAVE_WINDOWS

/* A 2D copy's pitch beyond this goes row by row (cudaMemcpy2D limits the
 * pitch). */
#define ETP__CE_MAX_PITCH ((size_t)1 << 30)

static size_t chunk_bytes(const etp__cuda_ce_op_t *o)
{
    return o->count * o->esize;
}

etp_status_t etp__cuda_ce_hold(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op,
                               ncclDataType_t dt, size_t esize, cudaStream_t s, int *held)
{
    *held = 0;
    if (c->zero == NULL || c->size < 2) return ETP_SUCCESS;
    const size_t R = (size_t)c->size;
    size_t count = 0;
    if (op->kind == ETP__COLL_ALLGATHER) {
        count = op->count;
        const size_t chunk = count * esize;
        /* in place only: the run's copies read the rank's own piece there */
        if (chunk == 0 ||
            (const char *)op->send != (const char *)op->recv + (size_t)c->rank * chunk ||
            etp__cuda_ag_comm(c, op->send, op->recv, chunk * R) != c->zero)
            return ETP_SUCCESS;
    } else if (op->kind == ETP__COLL_ALLTOALLV) {
        if (etp__cuda_a2a_comm(c, op) == NULL) return ETP_SUCCESS;
        count = op->sendcounts[0];
    } else {
        return ETP_SUCCESS;
    }
    const void *win = etp__cuda_win_id(c, op->recv, count * esize * R);
    if (win == NULL) return ETP_SUCCESS;
    if (cb->num_ce == cb->cap_ce) {
        size_t cap = cb->cap_ce ? 2 * cb->cap_ce : 64;
        etp__cuda_ce_op_t *n = realloc(cb->ce, cap * sizeof *n);
        if (n == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "batch: out of host memory");
        cb->ce = n;
        cb->cap_ce = cap;
    }
    cb->ce[cb->num_ce++] = (etp__cuda_ce_op_t){.comm = c,
                                               .stream = s,
                                               .kind = op->kind,
                                               .send = op->send,
                                               .recv = op->recv,
                                               .count = count,
                                               .esize = esize,
                                               .dt = dt,
                                               .win = win};
    *held = 1;
    return ETP_SUCCESS;
}

static etp_status_t issue_one(const etp__cuda_ce_op_t *o)
{
    const etp__bcomm_t *c = o->comm;
    ncclResult_t r = o->kind == ETP__COLL_ALLGATHER
                         ? ncclAllGather(o->send, o->recv, o->count, o->dt, c->zero, o->stream)
                         : etp__cuda_alltoall(o->send, o->recv, o->count, o->dt, c->zero,
                                              o->stream);
    if (r != ncclSuccess)
        return etp__err(ETP_ERR_BACKEND, "group '%s': %s on the copy engines: %s (%s)", c->name,
                        o->kind == ETP__COLL_ALLGATHER ? "ncclAllGather" : "ncclAlltoAll",
                        ncclGetErrorString(r), ncclGetLastError(c->zero));
    return ETP_SUCCESS;
}

static uintptr_t gap(const void *a, const void *b)
{
    return (uintptr_t)b - (uintptr_t)a;
}

/* b follows a in one run whose stride is `stride`. A run stays in one
 * window: whether two windows happen to lie a stride apart differs between
 * ranks, and every rank must fuse the same calls. */
static int extends(const etp__cuda_ce_op_t *a, const etp__cuda_ce_op_t *b, uintptr_t stride)
{
    return a->comm == b->comm && a->win == b->win && a->stream == b->stream && a->kind == b->kind &&
           a->count == b->count && a->esize == b->esize && a->dt == b->dt &&
           gap(a->recv, b->recv) == stride && gap(a->send, b->send) == stride;
}

static etp_status_t copy_rows(char *dst, const char *src, size_t pitch, size_t width, size_t rows,
                              cudaStream_t s, const char *group)
{
    cudaError_t e = cudaSuccess;
    if (pitch <= ETP__CE_MAX_PITCH) {
        e = cudaMemcpy2DAsync(dst, pitch, src, pitch, width, rows, cudaMemcpyDeviceToDevice, s);
    } else {
        for (size_t r = 0; r < rows && e == cudaSuccess; r++)
            e = cudaMemcpyAsync(dst + r * pitch, src + r * pitch, width, cudaMemcpyDeviceToDevice,
                                s);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "group '%s': a run's copies into the peers' windows: %s",
                        group, cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

/* ops[0..n), n >= 3, one run of `stride` */
static etp_status_t issue_run(const etp__cuda_ce_op_t *ops, size_t n, size_t stride)
{
    const etp__cuda_ce_op_t *first = &ops[0], *mid = &ops[1];
    const etp__bcomm_t *c = first->comm;
    const int R = c->size, me = c->rank;
    const size_t chunk = chunk_bytes(first);
    ETP__TRY(issue_one(first));
    /* each rank starts with the next one, so that the ranks' first copies
     * go to different destinations */
    for (int k = 0; k < R; k++) {
        const int q = (me + k) % R;
        if (q == me && first->kind == ETP__COLL_ALLGATHER) continue; /* in place */
        char *dst = etp__cuda_win_peer(first->win, mid->recv, q) + (size_t)me * chunk;
        const char *src = first->kind == ETP__COLL_ALLGATHER ? mid->recv + (size_t)me * chunk
                                                             : mid->send + (size_t)q * chunk;
        ETP__TRY(copy_rows(dst, src, stride, chunk, n - 2, first->stream, c->name));
    }
    return issue_one(&ops[n - 1]);
}

etp_status_t etp__cuda_ce_flush(etp__cuda_t *cb)
{
    const size_t n = cb->num_ce;
    etp__cuda_ce_op_t *o = cb->ce;
    etp_status_t st = ETP_SUCCESS;
    size_t i = 0;
    while (i < n && st == ETP_SUCCESS) {
        size_t j = i + 1;
        const size_t whole = chunk_bytes(&o[i]) * (size_t)o[i].comm->size;
        const uintptr_t stride = j < n ? gap(o[i].recv, o[j].recv) : 0;
        /* pieces that do not overlap, in rising order (a wrapped difference
         * is huge, and no window holds three of it) */
        if (stride >= whole && stride <= SIZE_MAX / 4)
            while (j < n && extends(&o[j - 1], &o[j], stride)) j++;
        if (j - i >= 3) {
            st = issue_run(&o[i], j - i, (size_t)stride);
        } else {
            j = i + 1;
            st = issue_one(&o[i]);
        }
        i = j;
    }
    cb->num_ce = 0;
    return st;
}

#else /* NCCL without symmetric windows: nothing is held back */

etp_status_t etp__cuda_ce_hold(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op,
                               ncclDataType_t dt, size_t esize, cudaStream_t s, int *held)
{
    (void)cb, (void)c, (void)op, (void)dt, (void)esize, (void)s;
    *held = 0;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_ce_flush(etp__cuda_t *cb)
{
    cb->num_ce = 0;
    return ETP_SUCCESS;
}

#endif
