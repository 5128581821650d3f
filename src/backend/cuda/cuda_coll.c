/*
 * The CUDA backend's collectives: NCCL calls, the fingerprint check of
 * ETP_CHECK_COLLECTIVES, batches (NCCL groups), and the ring of issued
 * collectives per communicator that timeout messages are made from.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static int is_reduction(etp__coll_kind_t kind)
{
    return kind == ETP__COLL_REDUCE_SCATTER || kind == ETP__COLL_ALLREDUCE;
}

static int nccl_dtype(etp_dtype_t dt, ncclDataType_t *out)
{
    switch (dt) {
    case ETP_DTYPE_U8: *out = ncclUint8; return 1;
    case ETP_DTYPE_I32: *out = ncclInt32; return 1;
    case ETP_DTYPE_I64: *out = ncclInt64; return 1;
    case ETP_DTYPE_F16: *out = ncclFloat16; return 1;
    case ETP_DTYPE_BF16: *out = ncclBfloat16; return 1;
    case ETP_DTYPE_F32: *out = ncclFloat32; return 1;
    case ETP_DTYPE_F64: *out = ncclFloat64; return 1;
    default: return 0;
    }
}

static int nccl_redop(etp_redop_t op, ncclRedOp_t *out)
{
    switch (op) {
    case ETP_REDOP_SUM: *out = ncclSum; return 1;
    case ETP_REDOP_MAX: *out = ncclMax; return 1;
    default: return 0;
    }
}

/* "allreduce seq 3 on group 'world' role 0 (rank 1 of 2)" */
static void coll_desc(const etp__bcomm_t *c, const etp__coll_t *op, char *buf, size_t n)
{
    snprintf(buf, n, "%s seq %llu on group '%s' role %d (rank %d of %d)", etp__coll_name(op->kind),
             (unsigned long long)op->seq, op->group_name ? op->group_name : c->name, op->role,
             c->rank, c->size);
}

/* ---- the ring of issued collectives ------------------------------------- */

static etp_status_t ring_record(etp__cuda_t *cb, etp__bcomm_t *c, cudaStream_t s,
                                etp__coll_kind_t kind, uint64_t seq, int role, const char *group)
{
    etp__cuda_issued_t *slot = &c->ring[c->ring_next % ETP__CUDA_RING];
    c->ring_next++;
    cudaError_t e = cudaSuccess;
    if (slot->ev == NULL) e = cudaEventCreateWithFlags(&slot->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(slot->ev, s);
    if (e != cudaSuccess) {
        slot->order = 0;
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "recording the completion event of %s seq %llu: %s",
                        etp__coll_name(kind), (unsigned long long)seq, cudaGetErrorString(e));
    }
    slot->order = ++cb->next_order;
    slot->seq = seq;
    slot->kind = kind;
    slot->role = role;
    snprintf(slot->group, sizeof slot->group, "%s", group ? group : c->name);
    return ETP_SUCCESS;
}

void etp__cuda_describe_pending(etp__cuda_t *cb, char *buf, size_t n)
{
    const etp__bcomm_t *best_c = NULL;
    const etp__cuda_issued_t *best = NULL;
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) {
        for (int i = 0; i < ETP__CUDA_RING; i++) {
            etp__cuda_issued_t *slot = &c->ring[i];
            if (slot->order == 0) continue;
            cudaError_t e = cudaEventQuery(slot->ev);
            if (e == cudaSuccess) {
                slot->order = 0; /* complete: forget it */
                continue;
            }
            if (e != cudaErrorNotReady) (void)cudaGetLastError();
            if (best == NULL || slot->order < best->order) {
                best = slot;
                best_c = c;
            }
        }
    }
    if (best == NULL) {
        snprintf(buf, n,
                 "no collective of this context is known to be pending (the wait is on other "
                 "work, or on collectives issued during a graph capture)");
        return;
    }
    snprintf(buf, n,
             "collective %s seq %llu on group '%s' role %d (rank %d of %d) has not completed; "
             "the CUDA backend cannot tell which ranks did not arrive",
             etp__coll_name(best->kind), (unsigned long long)best->seq, best->group, best->role,
             best_c->rank, best_c->size);
}

void etp__cuda_comm_free_scratch(etp__bcomm_t *c)
{
    for (int i = 0; i < ETP__CUDA_RING; i++) {
        if (c->ring[i].ev != NULL) (void)cudaEventDestroy(c->ring[i].ev);
        c->ring[i].ev = NULL;
        c->ring[i].order = 0;
    }
    if (c->fp_dev != NULL) (void)cudaFree(c->fp_dev);
    if (c->fp_host != NULL) (void)cudaFreeHost(c->fp_host);
    c->fp_dev = NULL;
    c->fp_host = NULL;
    (void)cudaGetLastError();
}

/* ---- fingerprints -------------------------------------------------------- */

etp_status_t etp__cuda_fp_alloc(etp__bcomm_t *c)
{
    if (c->fp_dev != NULL) return ETP_SUCCESS;
    const size_t bytes = (size_t)c->size * sizeof(etp__fp_t);
    cudaError_t e = cudaMalloc((void **)&c->fp_dev, 2 * bytes);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&c->fp_host, 2 * bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (c->fp_dev != NULL) (void)cudaFree(c->fp_dev);
        c->fp_dev = NULL;
        c->fp_host = NULL;
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "group '%s': fingerprint buffers (2 x %zu bytes): %s",
                        c->name, bytes, cudaGetErrorString(e));
    }
    return ETP_SUCCESS;
}

/* Exchange fingerprints with every peer on the collective's own
 * communicator and stream, wait for them, and compare. Nothing is issued
 * after a mismatch, so no rank enters a collective that cannot match. */
static etp_status_t fp_check(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op,
                             cudaStream_t s)
{
    const size_t bytes = (size_t)c->size * sizeof(etp__fp_t);
    char desc[192];
    coll_desc(c, op, desc, sizeof desc);
    cudaError_t e;
    /* made with the communicator (comm_attach), not here, where another
     * stream of this thread may be capturing (no cudaMalloc then) */
    if (c->fp_dev == NULL && etp__cuda_fp_alloc(c) != ETP_SUCCESS)
        return etp__cuda_fail(cb, ETP_ERR_OUT_OF_MEMORY);
    etp__fp_t *hs = c->fp_host, *hr = c->fp_host + c->size;
    etp__fp_t *ds = c->fp_dev, *dr = c->fp_dev + c->size;
    for (int p = 0; p < c->size; p++) etp__fp_make(op, p, &hs[p]);
    e = cudaMemcpyAsync(ds, hs, bytes, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        etp__err(ETP_ERR_BACKEND, "fingerprint upload before %s: %s", desc, cudaGetErrorString(e));
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (p == c->rank) continue;
        r = ncclSend(&ds[p], ETP__FP_WORDS, ncclInt64, p, c->nccl, s);
        if (r == ncclSuccess) r = ncclRecv(&dr[p], ETP__FP_WORDS, ncclInt64, p, c->nccl, s);
    }
    ncclResult_t r_end = ncclGroupEnd();
    if (r == ncclSuccess) r = r_end;
    if (r == ncclInProgress) {
        char what[256];
        snprintf(what, sizeof what, "the fingerprint exchange before %s", desc);
        etp_status_t st = etp__cuda_nccl_wait(cb, &c->nccl, 1, what, 0);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
    } else if (r != ncclSuccess) {
        etp__err(ETP_ERR_BACKEND, "fingerprint exchange before %s: %s (%s)", desc,
                 ncclGetErrorString(r), ncclGetLastError(c->nccl));
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    e = cudaMemcpyAsync(hr, dr, bytes, cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        etp__err(ETP_ERR_BACKEND, "fingerprint download before %s: %s", desc,
                 cudaGetErrorString(e));
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    char pending[512];
    snprintf(pending, sizeof pending,
             "the fingerprint exchange before %s has not completed: a peer has not issued its "
             "next collective on this communicator (the CUDA backend cannot tell which)",
             desc);
    ETP__TRY(etp__cuda_wait_stream(cb, s, "collective fingerprints", pending));
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        etp_status_t st = etp__fp_check(op, c->rank, p, &hr[p]);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
    }
    return ETP_SUCCESS;
}

/* ---- collectives ---------------------------------------------------------- */

static etp_status_t batch_add(etp__cuda_t *cb, etp__bcomm_t *c, cudaStream_t s,
                              const etp__coll_t *op)
{
    if (cb->num_batch == cb->cap_batch) {
        size_t cap = cb->cap_batch ? 2 * cb->cap_batch : 16;
        etp__cuda_batch_rec_t *nb = realloc(cb->batch, cap * sizeof *nb);
        if (nb == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "batch: out of host memory");
        cb->batch = nb;
        cb->cap_batch = cap;
    }
    etp__cuda_batch_rec_t *b = &cb->batch[cb->num_batch++];
    b->comm = c;
    b->stream = s;
    b->kind = op->kind;
    b->seq = op->seq;
    b->role = op->role;
    snprintf(b->group, sizeof b->group, "%s", op->group_name ? op->group_name : c->name);
    return ETP_SUCCESS;
}

/* Issue the NCCL calls of one collective (inside or outside a batch). */
static ncclResult_t issue(const etp__bcomm_t *c, const etp__coll_t *op, ncclDataType_t dt,
                          ncclRedOp_t rop, size_t esize, cudaStream_t s, const char **call)
{
    switch (op->kind) {
    case ETP__COLL_ALLGATHER:
        *call = "ncclAllGather";
        return ncclAllGather(op->send, op->recv, op->count, dt,
                             etp__cuda_ag_comm(c, op->send, op->recv, op->count * esize * (size_t)c->size), s);
    case ETP__COLL_REDUCE_SCATTER:
        *call = "ncclReduceScatter";
        return ncclReduceScatter(op->send, op->recv, op->count, dt, rop, etp__cuda_launch_comm(c), s);
    case ETP__COLL_ALLREDUCE:
        *call = "ncclAllReduce";
        return ncclAllReduce(op->send, op->recv, op->count, dt, rop, etp__cuda_launch_comm(c), s);
    case ETP__COLL_ALLTOALLV: {
        /* Equal counts in rank order between windows: ncclAlltoAll on the
         * zero-CTA twin, which runs it on the copy engines. */
        ncclComm_t a2a = etp__cuda_a2a_comm(c, op);
        if (a2a != NULL) {
            *call = "ncclAlltoAll";
            return etp__cuda_alltoall(op->send, op->recv, op->sendcounts[0], dt, a2a, s);
        }
        *call = "ncclSend/ncclRecv (alltoallv)";
        const char *send = op->send;
        char *recv = op->recv;
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; p < c->size && r == ncclSuccess; p++) {
            if (op->sendcounts[p] > 0)
                r = ncclSend(send + op->sdispls[p] * esize, op->sendcounts[p], dt, p, etp__cuda_launch_comm(c), s);
            if (r == ncclSuccess && op->recvcounts[p] > 0)
                r = ncclRecv(recv + op->rdispls[p] * esize, op->recvcounts[p], dt, p, etp__cuda_launch_comm(c), s);
        }
        ncclResult_t r_end = ncclGroupEnd();
        return r == ncclSuccess ? r_end : r;
    }
    }
    *call = "collective";
    return ncclInvalidArgument;
}

etp_status_t etp__cuda_coll(etp__be_t *be, etp__bcomm_t *c, const etp__coll_t *op,
                            etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    char desc[192];
    coll_desc(c, op, desc, sizeof desc);
    if (cb->base.failed || c->nccl == NULL)
        return etp__err(ETP_ERR_ABORTED, "%s: the context was aborted earlier: %s", desc,
                        cb->base.fail_msg);
    ncclDataType_t dt;
    ncclRedOp_t rop = ncclSum;
    if (!nccl_dtype(op->dtype, &dt))
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: dtype %d is not supported", desc,
                        (int)op->dtype);
    if (is_reduction(op->kind) && !nccl_redop(op->op, &rop))
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: reduction %d is not supported", desc,
                        (int)op->op);
    const size_t esize = etp_dtype_size(op->dtype);
    ETP__TRY(etp__cuda_set_device(cb));
    c->role = op->role;

    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s->s, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "%s: cudaStreamIsCapturing: %s", desc,
                        cudaGetErrorString(e));
    }
    const int capturing = cs != cudaStreamCaptureStatusNone;

    if (cb->base.cfg.check_collectives && c->size > 1) {
        if (capturing) {
            if (!cb->warned_check_capture)
                ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                         "collective fingerprints are not checked for collectives issued during "
                         "a CUDA graph capture (first: %s)",
                         desc);
            cb->warned_check_capture = 1;
        } else if (cb->batch_depth > 0) {
            /* A check waits on the host, which cannot happen inside an open
             * NCCL group (nothing of the group runs before its end). */
            if (!cb->warned_check_batch)
                ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                         "collective fingerprints are not checked for collectives inside a "
                         "batch (first: %s)",
                         desc);
            cb->warned_check_batch = 1;
        } else {
            ETP__TRY(fp_check(cb, c, op, s->s));
        }
    }

    /* Zero counts are the same on every rank (allgather, reduce-scatter,
     * allreduce): nothing to do, and nothing to wait for. */
    if (op->kind != ETP__COLL_ALLTOALLV && op->count == 0) return ETP_SUCCESS;

    if (cb->batch_depth > 0) {
        int held = 0;
        etp_status_t st = etp__cuda_ce_hold(cb, c, op, dt, esize, s->s, &held);
        if (st == ETP_SUCCESS && held && !capturing) st = batch_add(cb, c, s->s, op);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
        if (held) return ETP_SUCCESS;
    }

    const char *call = "collective";
    ncclResult_t r = issue(c, op, dt, rop, esize, s->s, &call);
    if (r != ncclSuccess && r != ncclInProgress) {
        etp__err(ETP_ERR_BACKEND, "%s on %s: %s (%s)", call, desc, ncclGetErrorString(r),
                 ncclGetLastError(c->nccl));
        /* This rank did not issue what its peers did: the communicator is
         * out of step, so the context cannot go on. */
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    if (cb->batch_depth > 0) {
        c->in_batch = 1;
        if (!capturing) {
            etp_status_t st = batch_add(cb, c, s->s, op);
            if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
        }
        return ETP_SUCCESS;
    }
    if (r == ncclInProgress) {
        char what[256];
        snprintf(what, sizeof what, "NCCL issuing %s", desc);
        etp_status_t st = etp__cuda_nccl_wait(cb, &c->nccl, 1, what, 0);
        if (st != ETP_SUCCESS) {
            char msg[ETP__ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", etp_last_error());
            etp__err(st, "%s; communicators aborted", msg);
            return etp__cuda_fail(cb, st);
        }
    }
    if (!capturing) {
        etp_status_t st = ring_record(cb, c, s->s, op->kind, op->seq, op->role, op->group_name);
        if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
    }
    return ETP_SUCCESS;
}

/* ---- batches ------------------------------------------------------------- */

etp_status_t etp__cuda_batch_begin(etp__be_t *be)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (cb->base.failed)
        return etp__err(ETP_ERR_ABORTED, "batch begin: the context was aborted earlier: %s",
                        cb->base.fail_msg);
    if (cb->batch_depth == 0) {
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess)
            return etp__err(ETP_ERR_BACKEND, "ncclGroupStart: %s (%s)", ncclGetErrorString(r),
                            ncclGetLastError(NULL));
        cb->group_open = 1;
        cb->num_batch = 0;
    }
    cb->batch_depth++;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_batch_end(etp__be_t *be)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (cb->batch_depth == 0)
        return etp__err(ETP_ERR_INVALID_STATE, "batch end without a matching batch begin");
    if (--cb->batch_depth > 0) return ETP_SUCCESS;
    if (!cb->group_open) /* closed by a failure inside the batch */
        return etp__err(ETP_ERR_ABORTED, "batch end: the context was aborted: %s",
                        cb->base.fail_msg);
    ETP__TRY(etp__cuda_set_device(cb));
    cb->group_open = 0;
    ncclResult_t r = ncclGroupEnd();

    size_t n = 0;
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) n += c->in_batch;
    ncclComm_t *used = n ? calloc(n, sizeof *used) : NULL;
    size_t k = 0;
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) {
        if (c->in_batch && used) used[k++] = c->nccl;
        c->in_batch = 0;
    }
    etp_status_t st = ETP_SUCCESS;
    if (r == ncclInProgress) {
        if (n > 0 && used == NULL)
            st = etp__err(ETP_ERR_OUT_OF_MEMORY, "batch end: out of host memory");
        else
            st = etp__cuda_nccl_wait(cb, used, (int)k, "NCCL issuing a batch of collectives", 0);
    } else if (r != ncclSuccess) {
        st = etp__err(ETP_ERR_BACKEND, "ncclGroupEnd of a batch: %s (%s)", ncclGetErrorString(r),
                      ncclGetLastError(NULL));
    }
    free(used);
    /* what the batch held back, after its group */
    if (st == ETP_SUCCESS) st = etp__cuda_ce_flush(cb);
    if (st != ETP_SUCCESS) {
        cb->num_batch = 0;
        return etp__cuda_fail(cb, st);
    }
    for (size_t i = 0; i < cb->num_batch; i++) {
        const etp__cuda_batch_rec_t *b = &cb->batch[i];
        st = ring_record(cb, b->comm, b->stream, b->kind, b->seq, b->role, b->group);
        if (st != ETP_SUCCESS) break;
    }
    cb->num_batch = 0;
    if (st != ETP_SUCCESS) return etp__cuda_fail(cb, st);
    return ETP_SUCCESS;
}
