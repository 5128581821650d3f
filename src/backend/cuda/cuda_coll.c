/*
 * The CUDA backend's collectives: NCCL calls, the fingerprint check of
 * ETP_CHECK_COLLECTIVES, batches (NCCL groups), and the ring of issued
 * collectives per communicator that timeout messages are made from.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

const char *etp__cuda_redop_name(int op)
{
    switch (op) {
    case ETP_REDOP_SUM: return "sum";
    case ETP_REDOP_MAX: return "max";
    default: return "invalid";
    }
}

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
    const size_t bytes = (size_t)c->size * ETP__CUDA_FP_WORDS * sizeof(int64_t);
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

/* The count this rank tells peer p: what an all-to-all-v sends to p, or the
 * collective's count. */
static uint64_t fp_count_to(const etp__coll_t *op, int p)
{
    return op->kind == ETP__COLL_ALLTOALLV ? (uint64_t)op->sendcounts[p] : (uint64_t)op->count;
}

/* The count this rank expects from peer p. */
static uint64_t fp_count_from(const etp__coll_t *op, int p)
{
    return op->kind == ETP__COLL_ALLTOALLV ? (uint64_t)op->recvcounts[p] : (uint64_t)op->count;
}

static int fp_op(const etp__coll_t *op)
{
    return is_reduction(op->kind) ? (int)op->op : -1;
}

/* "allgather count 4 dtype f32" plus what else tells the two apart. */
static void fp_text(char *buf, size_t n, int64_t kind, uint64_t count, int64_t dtype, int64_t op,
                    int64_t seq, int64_t role, int show_seq, int show_role)
{
    int k = snprintf(buf, n, "%s count %llu dtype %s", etp__coll_name((etp__coll_kind_t)kind),
                     (unsigned long long)count, etp_dtype_name((etp_dtype_t)dtype));
    if (k < 0 || (size_t)k >= n) return;
    if (is_reduction((etp__coll_kind_t)kind)) {
        int m = snprintf(buf + k, n - (size_t)k, " op %s", etp__cuda_redop_name((int)op));
        if (m < 0 || (size_t)m >= n - (size_t)k) return;
        k += m;
    }
    if (show_seq) {
        int m = snprintf(buf + k, n - (size_t)k, " seq %lld", (long long)seq);
        if (m < 0 || (size_t)m >= n - (size_t)k) return;
        k += m;
    }
    if (show_role) snprintf(buf + k, n - (size_t)k, " role %lld", (long long)role);
}

static etp_status_t fp_mismatch(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op, int p,
                                const int64_t *theirs)
{
    const char *group = op->group_name ? op->group_name : c->name;
    const int me = c->rank;
    if (theirs[0] != ETP__CUDA_FP_MAGIC) {
        etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                 "collective mismatch on group '%s' role %d seq %llu: rank %d sent rank %d no etp "
                 "fingerprint (word 0x%llx) before %s",
                 group, op->role, (unsigned long long)op->seq, p, me,
                 (unsigned long long)theirs[0], etp__coll_name(op->kind));
        return etp__cuda_fail(cb, ETP_ERR_COLLECTIVE_MISMATCH);
    }
    const int64_t kind = theirs[2], dtype = theirs[4], rop = theirs[5];
    const uint64_t count = (uint64_t)theirs[3];
    const int show_seq = (uint64_t)theirs[1] != op->seq;
    const int show_role = theirs[6] != op->role;
    char mine_s[192], theirs_s[192];
    if (op->kind == ETP__COLL_ALLTOALLV && kind == ETP__COLL_ALLTOALLV && !show_seq && !show_role &&
        dtype == (int64_t)op->dtype) {
        snprintf(mine_s, sizeof mine_s, "alltoallv receiving %llu elements from rank %d",
                 (unsigned long long)fp_count_from(op, p), p);
        snprintf(theirs_s, sizeof theirs_s, "alltoallv sending %llu elements to rank %d",
                 (unsigned long long)count, me);
    } else {
        fp_text(mine_s, sizeof mine_s, op->kind, fp_count_from(op, p), op->dtype, fp_op(op),
                (int64_t)op->seq, op->role, show_seq, show_role);
        fp_text(theirs_s, sizeof theirs_s, kind, count, dtype, rop, theirs[1], theirs[6], show_seq,
                show_role);
    }
    if (me < p)
        etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                 "collective mismatch on group '%s' role %d seq %llu: rank %d issued %s, rank %d "
                 "issued %s",
                 group, op->role, (unsigned long long)op->seq, me, mine_s, p, theirs_s);
    else
        etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                 "collective mismatch on group '%s' role %d seq %llu: rank %d issued %s, rank %d "
                 "issued %s",
                 group, op->role, (unsigned long long)op->seq, p, theirs_s, me, mine_s);
    return etp__cuda_fail(cb, ETP_ERR_COLLECTIVE_MISMATCH);
}

/* Exchange fingerprints with every peer on the collective's own
 * communicator and stream, wait for them, and compare. Nothing is issued
 * after a mismatch, so no rank enters a collective that cannot match. */
static etp_status_t fp_check(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op,
                             cudaStream_t s)
{
    const size_t words = (size_t)c->size * ETP__CUDA_FP_WORDS;
    const size_t bytes = words * sizeof(int64_t);
    char desc[192];
    coll_desc(c, op, desc, sizeof desc);
    cudaError_t e;
    /* made with the communicator (comm_attach), not here, where another
     * stream of this thread may be capturing (no cudaMalloc then) */
    if (c->fp_dev == NULL && etp__cuda_fp_alloc(c) != ETP_SUCCESS)
        return etp__cuda_fail(cb, ETP_ERR_OUT_OF_MEMORY);
    int64_t *hs = c->fp_host, *hr = c->fp_host + words;
    int64_t *ds = c->fp_dev, *dr = c->fp_dev + words;
    for (int p = 0; p < c->size; p++) {
        int64_t *w = hs + (size_t)p * ETP__CUDA_FP_WORDS;
        w[0] = ETP__CUDA_FP_MAGIC;
        w[1] = (int64_t)op->seq;
        w[2] = (int64_t)op->kind;
        w[3] = (int64_t)fp_count_to(op, p);
        w[4] = (int64_t)op->dtype;
        w[5] = fp_op(op);
        w[6] = op->role;
        w[7] = 0;
    }
    e = cudaMemcpyAsync(ds, hs, bytes, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        etp__err(ETP_ERR_BACKEND, "fingerprint upload before %s: %s", desc, cudaGetErrorString(e));
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (p == c->rank) continue;
        r = ncclSend(ds + (size_t)p * ETP__CUDA_FP_WORDS, ETP__CUDA_FP_WORDS, ncclInt64, p, c->nccl,
                     s);
        if (r == ncclSuccess)
            r = ncclRecv(dr + (size_t)p * ETP__CUDA_FP_WORDS, ETP__CUDA_FP_WORDS, ncclInt64, p,
                         c->nccl, s);
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
        const int64_t *w = hr + (size_t)p * ETP__CUDA_FP_WORDS;
        if (w[0] != ETP__CUDA_FP_MAGIC || (uint64_t)w[1] != op->seq || w[2] != (int64_t)op->kind ||
            (uint64_t)w[3] != fp_count_from(op, p) || w[4] != (int64_t)op->dtype ||
            w[5] != fp_op(op) || w[6] != op->role)
            return fp_mismatch(cb, c, op, p, w);
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
