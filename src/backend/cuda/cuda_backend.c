/*
 * The CUDA backend: lifecycle, streams, events, memory, host waits, and
 * communicator creation, split and destruction. The collectives are in
 * cuda_coll.c; the design notes are in cuda_internal.h.
 */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "kernels/elementwise/axpy.h"

/* ---- small helpers --------------------------------------------------- */

etp_status_t etp__cuda_set_device(etp__cuda_t *cb)
{
    cudaError_t e = cudaSetDevice(cb->device);
    if (e != cudaSuccess)
        return etp__err(ETP_ERR_BACKEND, "cudaSetDevice(%d): %s", cb->device,
                        cudaGetErrorString(e));
    return ETP_SUCCESS;
}

static etp_status_t cuda_error(const char *what, cudaError_t e)
{
    etp_status_t st = e == cudaErrorMemoryAllocation ? ETP_ERR_OUT_OF_MEMORY : ETP_ERR_BACKEND;
    /* Non-sticky errors stay as the thread's "last error" of the runtime;
     * clear it so it is not reported again by an unrelated later check. */
    (void)cudaGetLastError();
    return etp__err(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static void decode_nccl_version(int code, int *major, int *minor, int *patch)
{
    /* NCCL_VERSION() changed its encoding at 2.9. */
    if (code >= 10000) {
        *major = code / 10000;
        *minor = (code % 10000) / 100;
        *patch = code % 100;
    } else {
        *major = code / 1000;
        *minor = (code % 1000) / 100;
        *patch = code % 100;
    }
}

/* The launcher's node-local rank of this process, or -1. It only picks a
 * default GPU when the caller leaves device at -1. Reading these variables
 * here rather than in src/core/env.c is a documented exception: they are not
 * etp settings but facts that the launcher (Open MPI, MPICH/Intel MPI, Slurm)
 * publishes about this process. */
static int launcher_local_rank(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                        "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v == NULL || *v == '\0') continue;
        char *end = NULL;
        long x = strtol(v, &end, 10);
        if (end != v && *end == '\0' && x >= 0 && x < INT_MAX) return (int)x;
    }
    return -1;
}

/* ---- communicator bookkeeping ---------------------------------------- */

/* Non-blocking, named after the group, with the group's CTA settings
 * (negative: NCCL's default). cuda_internal.h requires NCCL >= 2.18, which
 * has every field here but CTAPolicy (2.27). */
static void fill_nccl_config(etp__cuda_t *cb, ncclConfig_t *conf, const etp_group_config_t *g,
                             const char *name)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *conf = init;
    conf->blocking = 0;
    conf->commName = name;
    if (g == NULL) return;
    if (g->cga_cluster_size >= 0) conf->cgaClusterSize = g->cga_cluster_size;
    if (g->min_ctas >= 0) conf->minCTAs = g->min_ctas;
    if (g->max_ctas >= 0) conf->maxCTAs = g->max_ctas;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    if (g->cta_policy >= 0) conf->CTAPolicy = g->cta_policy;
    (void)cb;
#else
    if (g->cta_policy >= 0)
        ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                 "group '%s': cta_policy needs NCCL >= 2.27; ignored", name);
#endif
}

static etp__bcomm_t *comm_new(etp__cuda_t *cb, const char *name)
{
    etp__bcomm_t *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->cb = cb;
    c->role = -1;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
    return c;
}

static void fill_nccl_config(etp__cuda_t *cb, ncclConfig_t *conf, const etp_group_config_t *g,
                             const char *name);
static etp_status_t cuda_error(const char *what, cudaError_t e);

/* ETP_NCCL_FAST_LAUNCH: split a blocking twin from c->nccl (the split is
 * polled under the timeout like any other) and establish its connections
 * now, while every rank is known to be here: one all-gather and one
 * reduce-scatter large enough for NCCL's full channel count, an all-reduce,
 * and a send/recv with every peer. Later launches then find their
 * connections and return at once. */
static etp_status_t make_fast(etp__cuda_t *cb, etp__bcomm_t *c, const etp_group_config_t *g)
{
    ncclConfig_t conf;
    fill_nccl_config(cb, &conf, g, c->name);
    conf.blocking = 1;
    ncclResult_t r = ncclCommSplit(c->nccl, 0, c->rank, &c->fast, &conf);
    if (r != ncclSuccess && r != ncclInProgress)
        return etp__err(ETP_ERR_BACKEND, "group '%s': splitting the fast-launch twin: %s (%s)",
                        c->name, ncclGetErrorString(r), ncclGetLastError(c->nccl));
    char what[128];
    snprintf(what, sizeof what, "splitting the fast-launch twin of group '%s'", c->name);
    ETP__TRY(etp__cuda_nccl_wait(cb, &c->nccl, 1, what, ETP__CUDA_SETUP_MIN_S));
    if (c->fast == NULL)
        return etp__err(ETP_ERR_INTERNAL, "group '%s': the fast-launch twin split returned none", c->name);
    const size_t big = (size_t)32 << 20, per = big / (size_t)c->size;
    cudaStream_t ws = NULL;
    char *buf = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&buf, 2 * big);
    if (e != cudaSuccess) {
        if (ws) cudaStreamDestroy(ws);
        return cuda_error("fast-launch warm-up", e);
    }
    r = ncclAllGather(buf, buf + big, per, ncclUint8, c->fast, ws);
    if (r == ncclSuccess) r = ncclReduceScatter(buf + big, buf, per / 4, ncclFloat32, ncclSum, c->fast, ws);
    if (r == ncclSuccess) r = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclMax, c->fast, ws);
    if (r == ncclSuccess) {
        r = ncclGroupStart();
        for (int p = 0; p < c->size && r == ncclSuccess; p++) {
            if (p == c->rank) continue;
            r = ncclSend(buf, 1 << 20, ncclUint8, p, c->fast, ws);
            if (r == ncclSuccess) r = ncclRecv(buf + big + ((size_t)p << 20) % big, 1 << 20, ncclUint8, p, c->fast, ws);
        }
        ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess) r = r2;
    }
    etp_status_t st = ETP_SUCCESS;
    if (r != ncclSuccess)
        st = etp__err(ETP_ERR_BACKEND, "group '%s': fast-launch warm-up: %s (%s)", c->name,
                      ncclGetErrorString(r), ncclGetLastError(c->fast));
    else
        st = etp__cuda_wait_stream(cb, ws, "fast-launch warm-up", NULL);
    if (st != ETP_SUCCESS && c->fast) {
        /* c is not among cb->comms yet, so a failure did not abort its
         * twin, whose kernels may still wait for peers on ws: abort them
         * before cudaFree, which waits for the whole device */
        (void)ncclCommAbort(c->fast);
        c->fast = NULL;
    }
    cudaFree(buf);
    cudaStreamDestroy(ws);
    return st;
}

/* Learn rank and size of a ready communicator and make it live. */
static etp_status_t comm_attach(etp__cuda_t *cb, etp__bcomm_t *c, const etp_group_config_t *g)
{
    ncclResult_t r = ncclCommUserRank(c->nccl, &c->rank);
    if (r == ncclSuccess) r = ncclCommCount(c->nccl, &c->size);
    if (r != ncclSuccess)
        return etp__err(ETP_ERR_BACKEND, "group '%s': querying the new NCCL communicator: %s (%s)",
                        c->name, ncclGetErrorString(r), ncclGetLastError(c->nccl));
    /* the fingerprint scratch now, not at the first checked collective,
     * which may come while another stream of the thread captures */
    if (cb->base.cfg.check_collectives) ETP__TRY(etp__cuda_fp_alloc(c));
    if (cb->base.cfg.nccl_fast_launch) {
        etp_status_t st = make_fast(cb, c, g);
        if (st != ETP_SUCCESS) {
            if (c->fast) (void)ncclCommAbort(c->fast);
            c->fast = NULL;
            etp__cuda_comm_free_scratch(c);
            return st;
        }
    }
    etp__bcomm_t **pp = &cb->comms;
    while (*pp) pp = &(*pp)->next;
    *pp = c;
    return ETP_SUCCESS;
}

static void comm_unlink(etp__cuda_t *cb, etp__bcomm_t *c)
{
    for (etp__bcomm_t **pp = &cb->comms; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            c->next = NULL;
            return;
        }
    }
}

static void abort_all(etp__cuda_t *cb)
{
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) {
        if (c->fast) (void)ncclCommAbort(c->fast);
        c->fast = NULL;
        if (c->zero) (void)ncclCommAbort(c->zero);
        c->zero = NULL;
        if (c->nccl == NULL) continue;
        ncclResult_t r = ncclCommAbort(c->nccl);
        if (r != ncclSuccess)
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "ncclCommAbort on group '%s': %s", c->name, ncclGetErrorString(r));
        c->nccl = NULL;
    }
}

etp_status_t etp__cuda_fail(etp__cuda_t *cb, etp_status_t status)
{
    etp__be_fail(&cb->base, status);
    (void)cudaSetDevice(cb->device);
    /* An abort issued inside an open NCCL group would be deferred to the
     * group's end; close the group first (what it launches is aborted). */
    if (cb->group_open) {
        (void)ncclGroupEnd();
        cb->group_open = 0;
    }
    abort_all(cb);
    return status;
}

etp_status_t etp__cuda_nccl_wait(etp__cuda_t *cb, ncclComm_t *comms, int n, const char *what,
                                 double min_limit_s)
{
    const double t0 = etp__now_s();
    double limit = cb->base.cfg.timeout_s;
    if (limit > 0 && limit < min_limit_s) limit = min_limit_s;
    unsigned nap = 20;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < n; i++) {
            if (comms[i] == NULL) continue;
            ncclResult_t state = ncclInProgress;
            ncclResult_t r = ncclCommGetAsyncError(comms[i], &state);
            if (r != ncclSuccess)
                return etp__err(ETP_ERR_BACKEND, "%s: ncclCommGetAsyncError: %s (%s)", what,
                                ncclGetErrorString(r), ncclGetLastError(comms[i]));
            if (state == ncclInProgress)
                busy = 1;
            else if (state != ncclSuccess)
                return etp__err(ETP_ERR_BACKEND, "%s: %s (%s)", what, ncclGetErrorString(state),
                                ncclGetLastError(comms[i]));
        }
        if (!busy) return ETP_SUCCESS;
        double elapsed = etp__now_s() - t0;
        if (limit > 0 && elapsed > limit)
            return etp__err(ETP_ERR_TIMEOUT,
                            "timeout after %.1f s: %s did not complete (every rank of the "
                            "communicator must take part)",
                            elapsed, what);
        /* A non-blocking communicator hands each launch to an NCCL thread,
         * and the caller's next work on the stream must wait for it: spin
         * for the first millisecond (launches take tens of microseconds),
         * then back off. */
        if (elapsed < 1e-3) {
            sched_yield();
            continue;
        }
        etp__sleep_us(nap);
        nap = nap < 100 ? 2 * nap : 200;
    }
}

/* An asynchronous NCCL error on any live communicator fails the backend. */
static etp_status_t check_async(etp__cuda_t *cb)
{
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) {
        if (c->nccl == NULL) continue;
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess) state = r;
        if ((state == ncclSuccess || state == ncclInProgress) && c->fast) {
            r = ncclCommGetAsyncError(c->fast, &state);
            if (r != ncclSuccess) state = r;
        }
        if ((state == ncclSuccess || state == ncclInProgress) && c->zero) {
            r = ncclCommGetAsyncError(c->zero, &state);
            if (r != ncclSuccess) state = r;
        }
        if (state == ncclSuccess || state == ncclInProgress) continue;
        etp__err(ETP_ERR_BACKEND,
                 "NCCL reported an asynchronous error on group '%s' role %d (rank %d of %d): "
                 "%s (%s); communicators aborted",
                 c->name, c->role, c->rank, c->size, ncclGetErrorString(state),
                 ncclGetLastError(c->nccl));
        return etp__cuda_fail(cb, ETP_ERR_BACKEND);
    }
    return ETP_SUCCESS;
}

/* ---- host waits --------------------------------------------------------- */

/* Poll until the streams ss[0..ns) and the event ev (may be NULL) are
 * complete. With report == 0 (teardown) nothing is reported or failed; the
 * result only says whether it finished. */
static etp_status_t wait_work(etp__cuda_t *cb, const char *what, const cudaStream_t *ss, size_t ns,
                              cudaEvent_t ev, const char *pending, int report)
{
    const double t0 = etp__now_s();
    const double limit = cb->base.cfg.timeout_s;
    unsigned nap = 20;
    size_t done_streams = 0;
    int ev_done = ev == NULL;
    for (;;) {
        cudaError_t e = cudaSuccess;
        while (done_streams < ns && (e = cudaStreamQuery(ss[done_streams])) == cudaSuccess)
            done_streams++;
        if (e == cudaSuccess && !ev_done) {
            e = cudaEventQuery(ev);
            if (e == cudaSuccess) ev_done = 1;
        }
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            if (!report) return ETP_ERR_BACKEND;
            /* Most likely a kernel fault, which is sticky: the context is lost. */
            char where[160];
            snprintf(where, sizeof where, "waiting for %s: %s", what,
                     done_streams < ns ? "cudaStreamQuery" : "cudaEventQuery");
            cuda_error(where, e);
            return etp__cuda_fail(cb, ETP_ERR_BACKEND);
        }
        if (done_streams == ns && ev_done) return ETP_SUCCESS;
        if (report) ETP__TRY(check_async(cb));
        double elapsed = etp__now_s() - t0;
        if (limit > 0 && elapsed > limit) {
            if (!report) return ETP_ERR_TIMEOUT;
            char desc[ETP__ERRMSG_MAX / 2];
            if (pending)
                snprintf(desc, sizeof desc, "%s", pending);
            else
                etp__cuda_describe_pending(cb, desc, sizeof desc);
            etp__err(ETP_ERR_TIMEOUT, "timeout after %.1f s waiting for %s: %s; communicators aborted",
                     elapsed, what, desc);
            return etp__cuda_fail(cb, ETP_ERR_TIMEOUT);
        }
        etp__sleep_us(nap);
        nap = nap < 100 ? 2 * nap : 200;
    }
}

static etp_status_t refuse_if_capturing(cudaStream_t s, const char *what)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e != cudaSuccess) return cuda_error("cudaStreamIsCapturing", e);
    if (cs != cudaStreamCaptureStatusNone)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: the stream is being captured into a CUDA graph; a host wait is not "
                        "allowed during a capture",
                        what);
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_wait_stream(etp__cuda_t *cb, cudaStream_t s, const char *what,
                                   const char *pending)
{
    return wait_work(cb, what, &s, 1, NULL, pending, 1);
}

/* ---- ops: lifecycle and memory ------------------------------------------ */

static etp_status_t cuda_stream_list(etp__cuda_t *cb, cudaStream_t **out, size_t *n)
{
    size_t count = 0;
    for (etp__bstream_t *s = cb->streams; s; s = s->next) count++;
    *n = count;
    *out = NULL;
    if (count == 0) return ETP_SUCCESS;
    cudaStream_t *arr = malloc(count * sizeof *arr);
    if (arr == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "device sync: out of host memory");
    size_t i = 0;
    for (etp__bstream_t *s = cb->streams; s; s = s->next) arr[i++] = s->s;
    *out = arr;
    return ETP_SUCCESS;
}

static etp_status_t cuda_device_sync(etp__be_t *be)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    for (etp__bstream_t *s = cb->streams; s; s = s->next)
        ETP__TRY(refuse_if_capturing(s->s, "device synchronize"));
    cudaStream_t *arr;
    size_t n;
    ETP__TRY(cuda_stream_list(cb, &arr, &n));
    etp_status_t st = wait_work(cb, "the device", arr, n, NULL, NULL, 1);
    free(arr);
    return st;
}

/* Finalize (bounded) and destroy the given communicators together, so that
 * ranks that release them in different orders cannot deadlock; abort the
 * ones that are failed, or do not finalize in time. */
static void release_comms(etp__cuda_t *cb, etp__bcomm_t **cs, size_t n)
{
    ncclComm_t *pending = calloc(n ? n : 1, sizeof *pending);
    int abandon = cb->base.failed || pending == NULL;
    for (size_t i = 0; i < n && !abandon; i++) {
        if (cs[i]->nccl == NULL) continue;
        ncclResult_t r = ncclCommFinalize(cs[i]->nccl);
        if (r == ncclSuccess || r == ncclInProgress) {
            pending[i] = cs[i]->nccl;
        } else {
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "ncclCommFinalize on group '%s': %s (%s); aborting it", cs[i]->name,
                     ncclGetErrorString(r), ncclGetLastError(cs[i]->nccl));
        }
    }
    if (!abandon && n > 0) {
        /* etp__cuda_nccl_wait sets the thread's last error; a teardown keeps it. */
        char saved[ETP__ERRMSG_MAX];
        snprintf(saved, sizeof saved, "%s", etp_last_error());
        etp_status_t st = etp__cuda_nccl_wait(cb, pending, (int)n, "finalizing communicators", 0);
        if (st != ETP_SUCCESS) {
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "%s; aborting the communicators instead", etp_last_error());
            abandon = 1;
        }
        etp__err(ETP_SUCCESS, "%s", saved);
    }
    for (size_t i = 0; i < n; i++) {
        etp__bcomm_t *c = cs[i];
        if (c->zero != NULL) {
            /* Its windows went with the chains that owned them. */
            if (abandon || ncclCommFinalize(c->zero) != ncclSuccess || ncclCommDestroy(c->zero) != ncclSuccess)
                (void)ncclCommAbort(c->zero);
            c->zero = NULL;
        }
        if (c->fast != NULL) {
            /* Its work was waited for with the context's streams. */
            if (abandon || ncclCommFinalize(c->fast) != ncclSuccess || ncclCommDestroy(c->fast) != ncclSuccess)
                (void)ncclCommAbort(c->fast);
            c->fast = NULL;
        }
        if (c->nccl != NULL) {
            ncclResult_t r;
            if (abandon || pending == NULL || pending[i] == NULL)
                r = ncclCommAbort(c->nccl);
            else
                r = ncclCommDestroy(c->nccl);
            if (r != ncclSuccess)
                ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                         "releasing the communicator of group '%s': %s", c->name,
                         ncclGetErrorString(r));
            c->nccl = NULL;
        }
        etp__cuda_comm_free_scratch(c);
        comm_unlink(cb, c);
        free(c);
    }
    free(pending);
}

static void cuda_destroy(etp__be_t *be)
{
    if (be == NULL) return;
    etp__cuda_t *cb = etp__cuda_of(be);
    (void)cudaSetDevice(cb->device);
    if (cb->group_open) {
        (void)ncclGroupEnd();
        cb->group_open = 0;
    }
    /* Let enqueued work finish (bounded); if it does not, whatever is stuck
     * waits on a collective, and aborting the communicators releases it. */
    cudaStream_t *arr = NULL;
    size_t n = 0;
    if (cuda_stream_list(cb, &arr, &n) == ETP_SUCCESS) {
        etp_status_t st = wait_work(cb, "the device", arr, n, NULL, NULL, 0);
        if (st != ETP_SUCCESS && !cb->base.failed) {
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "context destroy: outstanding work did not finish (%s); aborting "
                     "communicators",
                     st == ETP_ERR_TIMEOUT ? "timeout" : "CUDA error");
            abort_all(cb);
        }
        free(arr);
    }
    size_t ncomms = 0;
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) ncomms++;
    if (ncomms > 0) {
        etp__bcomm_t **cs = malloc(ncomms * sizeof *cs);
        if (cs != NULL) {
            size_t i = 0;
            for (etp__bcomm_t *c = cb->comms; c; c = c->next) cs[i++] = c;
            release_comms(cb, cs, ncomms);
            free(cs);
        } else {
            abort_all(cb);
            while (cb->comms) {
                etp__bcomm_t *c = cb->comms;
                cb->comms = c->next;
                etp__cuda_comm_free_scratch(c);
                free(c);
            }
        }
    }
    while (cb->streams) {
        etp__bstream_t *s = cb->streams;
        cb->streams = s->next;
        if (!s->borrowed) (void)cudaStreamDestroy(s->s);
        free(s);
    }
    free(cb->batch);
    free(cb);
}

static etp_status_t cuda_mem_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    if (bytes == 0) {
        *ptr = NULL;
        return ETP_SUCCESS;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes) on device %d", bytes, cb->device);
        return cuda_error(what, e);
    }
    *ptr = p;
    return ETP_SUCCESS;
}

static void cuda_mem_free(etp__be_t *be, void *ptr)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (ptr == NULL) return;
    (void)cudaSetDevice(cb->device);
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND, "cudaFree(%p): %s", ptr,
                 cudaGetErrorString(e));
    }
}

/* ---- ops: streams ------------------------------------------------------- */

static etp_status_t cuda_stream_create(etp__be_t *be, int priority, etp__bstream_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    etp__bstream_t *s = calloc(1, sizeof *s);
    if (s == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream create: out of host memory");
    int prio = priority == ETP_STREAM_PRIORITY_HIGH ? cb->prio_greatest : 0;
    cudaError_t e = cudaStreamCreateWithPriority(&s->s, cudaStreamNonBlocking, prio);
    if (e != cudaSuccess) {
        free(s);
        return cuda_error("cudaStreamCreateWithPriority", e);
    }
    s->next = cb->streams;
    cb->streams = s;
    *out = s;
    return ETP_SUCCESS;
}

static etp_status_t cuda_stream_wrap(etp__be_t *be, void *native, etp__bstream_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    cudaStream_t ns = (cudaStream_t)native;
    if (ns == NULL || ns == cudaStreamLegacy || ns == cudaStreamPerThread)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_stream_wrap_cuda: the default stream (NULL, cudaStreamLegacy or "
                        "cudaStreamPerThread) cannot be wrapped; pass a stream you created");
    ETP__TRY(etp__cuda_set_device(cb));
    unsigned flags = 0;
    cudaError_t e = cudaStreamGetFlags(ns, &flags);
    if (e != cudaSuccess) return cuda_error("etp_stream_wrap_cuda: cudaStreamGetFlags", e);
    etp__bstream_t *s = calloc(1, sizeof *s);
    if (s == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream wrap: out of host memory");
    s->s = ns;
    s->borrowed = 1;
    s->next = cb->streams;
    cb->streams = s;
    *out = s;
    return ETP_SUCCESS;
}

static void *cuda_stream_native(etp__be_t *be, etp__bstream_t *s)
{
    (void)be;
    return s ? (void *)s->s : NULL;
}

static etp_status_t cuda_stream_destroy(etp__be_t *be, etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (s == NULL) return ETP_SUCCESS;
    /* refused with nothing changed (the caller keeps a stream it may
     * destroy again), except on an aborted context, whose teardown must go
     * through */
    etp_status_t st = etp__cuda_set_device(cb);
    if (st != ETP_SUCCESS && !be->failed) return st;
    for (etp__bstream_t **pp = &cb->streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    if (!s->borrowed && st == ETP_SUCCESS) {
        /* Returns at once; CUDA releases the stream once its work is done.
         * A failure here is the device's sticky error: the handle is gone
         * and so is the context. */
        cudaError_t e = cudaStreamDestroy(s->s);
        if (e != cudaSuccess) st = etp__cuda_fail(cb, cuda_error("cudaStreamDestroy", e));
    }
    free(s);
    return st;
}

static etp_status_t cuda_stream_sync(etp__be_t *be, etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    ETP__TRY(refuse_if_capturing(s->s, "stream synchronize"));
    return etp__cuda_wait_stream(cb, s->s, "stream", NULL);
}

static etp_status_t cuda_stream_capturing(etp__be_t *be, etp__bstream_t *s, int *capturing)
{
    (void)be;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s->s, &cs);
    if (e != cudaSuccess) return cuda_error("cudaStreamIsCapturing", e);
    *capturing = cs != cudaStreamCaptureStatusNone;
    return ETP_SUCCESS;
}

/* ---- ops: events -------------------------------------------------------- */

static etp_status_t cuda_event_create(etp__be_t *be, etp__bevent_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    etp__bevent_t *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "event create: out of host memory");
    cudaError_t e = cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return cuda_error("cudaEventCreateWithFlags", e);
    }
    *out = ev;
    return ETP_SUCCESS;
}

static etp_status_t cuda_event_destroy(etp__be_t *be, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (ev == NULL) return ETP_SUCCESS;
    etp_status_t st = etp__cuda_set_device(cb);
    if (st == ETP_SUCCESS) {
        cudaError_t e = cudaEventDestroy(ev->e);
        if (e != cudaSuccess) st = cuda_error("cudaEventDestroy", e);
    }
    free(ev);
    return st;
}

static etp_status_t cuda_event_record(etp__be_t *be, etp__bevent_t *ev, etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s->s, &cs);
    if (e != cudaSuccess) return cuda_error("cudaStreamIsCapturing", e);
    e = cudaEventRecord(ev->e, s->s);
    if (e != cudaSuccess) return cuda_error("cudaEventRecord", e);
    ev->recorded_in_capture = cs != cudaStreamCaptureStatusNone;
    return ETP_SUCCESS;
}

static etp_status_t cuda_stream_wait_event(etp__be_t *be, etp__bstream_t *s, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaStreamWaitEvent(s->s, ev->e, 0);
    if (e != cudaSuccess) return cuda_error("cudaStreamWaitEvent", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_event_query(etp__be_t *be, etp__bevent_t *ev, int *done)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    if (ev->recorded_in_capture)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "event query: the event was last recorded during a CUDA graph capture");
    cudaError_t e = cudaEventQuery(ev->e);
    if (e == cudaSuccess) {
        *done = 1;
        return ETP_SUCCESS;
    }
    if (e == cudaErrorNotReady) {
        *done = 0;
        return ETP_SUCCESS;
    }
    return cuda_error("cudaEventQuery", e);
}

static etp_status_t cuda_event_sync(etp__be_t *be, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    if (ev->recorded_in_capture)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "event synchronize: the event was last recorded during a CUDA graph "
                        "capture; a host wait on it is not allowed");
    return wait_work(cb, "event", NULL, 0, ev->e, NULL, 1);
}

/* ---- ops: copies and kernels ------------------------------------------- */

static etp_status_t cuda_memset_async(etp__be_t *be, etp__bstream_t *s, void *ptr, int value,
                                      size_t bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (bytes == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaMemsetAsync(ptr, value, bytes, s->s);
    if (e != cudaSuccess) return cuda_error("cudaMemsetAsync", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_memcpy_async(etp__be_t *be, etp__bstream_t *s, void *dst, const void *src,
                                      size_t bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (bytes == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->s);
    if (e != cudaSuccess) return cuda_error("cudaMemcpyAsync", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_axpy_f32(etp__be_t *be, etp__bstream_t *s, size_t n, float alpha,
                                  const float *x, float *y)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (n == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = etp__cuda_axpy_f32(s->s, n, alpha, x, y);
    if (e != cudaSuccess) return cuda_error("axpy_f32 kernel launch", e);
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_stream_for_launch(etp__be_t *be, etp__bstream_t *s, cudaStream_t *out)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    *out = s->s;
    return ETP_SUCCESS;
}

static const etp__kernels_t cuda_kernels = {
    .axpy_f32 = cuda_axpy_f32,
    .quant = &etp__cuda_quant_kernels,
    .ep = &etp__cuda_ep_kernels,
    .shard = &etp__cuda_shard_kernels,
};

/* ---- ops: communicators ------------------------------------------------- */

static int cuda_comm_rank(const etp__bcomm_t *c)
{
    return c->rank;
}

static int cuda_comm_size(const etp__bcomm_t *c)
{
    return c->size;
}

/* Split `parent_nccl` into c->nccl. Polls the parent too: for a split the
 * NCCL job belongs to the parent, and c->nccl is written by NCCL's thread
 * only when it completes. On a timeout that thread may still write c->nccl
 * later, so *leak is set and the caller must not free c. */
static etp_status_t split_into(etp__cuda_t *cb, ncclComm_t parent_nccl, int color, int key,
                               const etp_group_config_t *g, etp__bcomm_t *c, int *leak,
                               int *started)
{
    ncclConfig_t conf;
    fill_nccl_config(cb, &conf, g, c->name);
    *leak = 0;
    *started = 0;
    c->nccl = NULL;
    ncclResult_t r = ncclCommSplit(parent_nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                   &c->nccl, &conf);
    if (r != ncclSuccess && r != ncclInProgress)
        return etp__err(r == ncclInvalidArgument ? ETP_ERR_INVALID_ARGUMENT : ETP_ERR_BACKEND,
                        "ncclCommSplit of group '%s' (color %d, key %d): %s (%s)", c->name, color,
                        key, ncclGetErrorString(r), ncclGetLastError(parent_nccl));
    *started = 1;
    char what[160];
    snprintf(what, sizeof what, "ncclCommSplit of group '%s' (color %d, key %d)", c->name, color,
             key);
    etp_status_t st = etp__cuda_nccl_wait(cb, &parent_nccl, 1, what, ETP__CUDA_SETUP_MIN_S);
    if (st == ETP_SUCCESS && c->nccl != NULL)
        st = etp__cuda_nccl_wait(cb, &c->nccl, 1, what, ETP__CUDA_SETUP_MIN_S);
    if (st == ETP_ERR_TIMEOUT) *leak = 1;
    return st;
}

static etp_status_t cuda_comm_split(etp__be_t *be, etp__bcomm_t *parent, int color, int key,
                                    const etp_group_config_t *cfg, etp__bcomm_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (cb->base.failed || parent->nccl == NULL)
        return etp__err(ETP_ERR_ABORTED, "group split: the context was aborted: %s",
                        cb->base.fail_msg);
    ETP__TRY(etp__cuda_set_device(cb));
    etp__bcomm_t *c = comm_new(cb, cfg && cfg->name ? cfg->name : NULL);
    if (c == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "group split: out of host memory");
    int leak = 0, started = 0;
    etp_status_t st = split_into(cb, parent->nccl, color, key, cfg, c, &leak, &started);
    if (st != ETP_SUCCESS) {
        if (c->nccl != NULL && !leak) {
            (void)ncclCommAbort(c->nccl);
            c->nccl = NULL;
        }
        /* Refused at the call (a bad setting): nothing happened. Failed
         * once under way: the other ranks are stuck in, or past, the same
         * split, so the context's communicators are no longer consistent. */
        if (started) etp__cuda_fail(cb, st);
        if (!leak) free(c);
        return st;
    }
    if (c->nccl == NULL) { /* ETP_GROUP_NO_COLOR: took part, joined nothing */
        free(c);
        *out = NULL;
        return ETP_SUCCESS;
    }
    st = comm_attach(cb, c, cfg);
    if (st != ETP_SUCCESS) {
        (void)ncclCommAbort(c->nccl);
        free(c);
        return etp__cuda_fail(cb, st);
    }
    ETP__LOG(cb->base.log, ETP_LOG_DEBUG, ETP_SUBSYS_BACKEND,
             "split group '%s' (color %d key %d): rank %d of %d", c->name, color, key, c->rank,
             c->size);
    *out = c;
    return ETP_SUCCESS;
}

static void cuda_comm_destroy(etp__be_t *be, etp__bcomm_t *c)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (c == NULL) return;
    (void)cudaSetDevice(cb->device);
    release_comms(cb, &c, 1);
}

/* ---- ops: graph capture ------------------------------------------------- */

typedef struct {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} cuda_graph_t;

static etp_status_t cuda_capture_begin(etp__be_t *be, etp__bstream_t *s)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    /* Thread-local: this thread's unsafe calls (an allocation, a host wait)
     * fail during the capture instead of silently breaking it. */
    cudaError_t e = cudaStreamBeginCapture(s->s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_error("cudaStreamBeginCapture", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_capture_end(etp__be_t *be, etp__bstream_t *s, void **graph)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cuda_graph_t *g = calloc(1, sizeof *g);
    if (!g) return etp__err(ETP_ERR_OUT_OF_MEMORY, "end capture: out of host memory");
    cudaError_t e = cudaStreamEndCapture(s->s, &g->graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (e != cudaSuccess) {
        if (g->graph) cudaGraphDestroy(g->graph);
        free(g);
        return cuda_error("ending the capture (cudaStreamEndCapture / cudaGraphInstantiate)", e);
    }
    *graph = g;
    return ETP_SUCCESS;
}

static etp_status_t cuda_graph_launch(etp__be_t *be, void *graph, etp__bstream_t *s)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cudaError_t e = cudaGraphLaunch(((cuda_graph_t *)graph)->exec, s->s);
    if (e != cudaSuccess) return cuda_error("cudaGraphLaunch", e);
    return ETP_SUCCESS;
}

static void cuda_graph_destroy(etp__be_t *be, void *graph)
{
    cuda_graph_t *g = graph;
    if (!g) return;
    (void)cudaSetDevice(etp__cuda_of(be)->device);
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
}

static const etp__backend_ops_t cuda_ops = {
    .name = "cuda",
    .kind = ETP_BACKEND_CUDA,
    .destroy = cuda_destroy,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .device_sync = cuda_device_sync,
    .stream_create = cuda_stream_create,
    .stream_wrap = cuda_stream_wrap,
    .stream_native = cuda_stream_native,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_capturing = cuda_stream_capturing,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .memset_async = cuda_memset_async,
    .memcpy_async = cuda_memcpy_async,
    .comm_split = cuda_comm_split,
    .comm_destroy = cuda_comm_destroy,
    .comm_rank = cuda_comm_rank,
    .comm_size = cuda_comm_size,
    .coll = etp__cuda_coll,
    .win_alloc = etp__cuda_win_alloc,
    .win_free = etp__cuda_win_free,
    .batch_begin = etp__cuda_batch_begin,
    .batch_end = etp__cuda_batch_end,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .kernels = &cuda_kernels,
};

/* ---- constructors ------------------------------------------------------- */

int etp__cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

int etp__cuda_be_device(const etp__be_t *be)
{
    return ((const etp__cuda_t *)be)->device;
}

etp_status_t etp__cuda_get_unique_id(void *id, size_t id_bytes)
{
    if (id == NULL || id_bytes < NCCL_UNIQUE_ID_BYTES)
        return etp__err(ETP_ERR_INTERNAL, "unique id buffer of %zu bytes, NCCL needs %d", id_bytes,
                        NCCL_UNIQUE_ID_BYTES);
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        return etp__err(ETP_ERR_BACKEND, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r),
                        ncclGetLastError(NULL));
    memcpy(id, uid.internal, NCCL_UNIQUE_ID_BYTES);
    return ETP_SUCCESS;
}

/* device: cfg->device, or (-1) the launcher's local rank (else world_rank)
 * modulo the number of devices. */
static etp_status_t pick_device(const etp__be_config_t *cfg, int world_rank, int *device)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "CUDA backend: no usable CUDA device (cudaGetDeviceCount: %s)",
                        cudaGetErrorString(e));
    }
    if (count <= 0) return etp__err(ETP_ERR_BACKEND, "CUDA backend: no CUDA device is visible");
    if (cfg->device >= 0) {
        if (cfg->device >= count)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "config device %d: only %d CUDA device(s) are visible", cfg->device,
                            count);
        *device = cfg->device;
        return ETP_SUCCESS;
    }
    int local = launcher_local_rank();
    *device = (local >= 0 ? local : world_rank) % count;
    return ETP_SUCCESS;
}

static etp_status_t be_new(const etp__be_config_t *cfg, etp__logger_t *log, int rank, int size,
                           int device, etp__cuda_t **out)
{
    etp__cuda_t *cb = calloc(1, sizeof *cb);
    if (cb == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "CUDA backend: out of host memory");
    cb->base.ops = &cuda_ops;
    cb->base.log = log;
    cb->base.cfg = *cfg;
    cb->base.rank = rank;
    cb->base.size = size;
    cb->device = device;
    etp_status_t st = etp__cuda_set_device(cb);
    if (st != ETP_SUCCESS) {
        free(cb);
        return st;
    }
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e != cudaSuccess) {
        free(cb);
        return cuda_error("cudaDeviceGetStreamPriorityRange", e);
    }
    cb->prio_greatest = greatest;

    int rt = 0, maj = 0, min = 0, pat = 0, cmaj = 0, cmin = 0, cpat = 0;
    ncclResult_t r = ncclGetVersion(&rt);
    decode_nccl_version(NCCL_VERSION_CODE, &cmaj, &cmin, &cpat);
    if (r == ncclSuccess) decode_nccl_version(rt, &maj, &min, &pat);
    int cuda_rt = 0, cuda_drv = 0;
    (void)cudaRuntimeGetVersion(&cuda_rt);
    (void)cudaDriverGetVersion(&cuda_drv);
    ETP__LOG(log, ETP_LOG_INFO, ETP_SUBSYS_BACKEND,
             "CUDA backend: rank %d of %d on device %d; NCCL runtime %d.%d.%d, built with "
             "%d.%d.%d; CUDA runtime %d, driver %d",
             rank, size, device, maj, min, pat, cmaj, cmin, cpat, cuda_rt, cuda_drv);
    if (r != ncclSuccess || maj != cmaj || min != cmin)
        ETP__LOG(log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                 "NCCL runtime %d.%d differs from the %d.%d etp was built with", maj, min, cmaj,
                 cmin);
    *out = cb;
    return ETP_SUCCESS;
}

/* Make a ready communicator c live as the world role-0 communicator. */
static etp_status_t finish_world(etp__cuda_t *cb, etp__bcomm_t *c, etp__be_t **be,
                                 etp__bcomm_t **world)
{
    etp_status_t st = comm_attach(cb, c, NULL);
    if (st != ETP_SUCCESS) {
        (void)ncclCommAbort(c->nccl);
        free(c);
        free(cb);
        return st;
    }
    *be = &cb->base;
    *world = c;
    return ETP_SUCCESS;
}

static etp_status_t create_from_uid(const ncclUniqueId *uid, int rank, int size,
                                    const etp__be_config_t *cfg, etp__logger_t *log,
                                    etp__be_t **be, etp__bcomm_t **world)
{
    int device = 0;
    ETP__TRY(pick_device(cfg, rank, &device));
    etp__cuda_t *cb = NULL;
    ETP__TRY(be_new(cfg, log, rank, size, device, &cb));
    etp__bcomm_t *c = comm_new(cb, "world");
    if (c == NULL) {
        free(cb);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "CUDA backend: out of host memory");
    }
    ncclConfig_t conf;
    fill_nccl_config(cb, &conf, NULL, c->name);
    ncclResult_t r = ncclCommInitRankConfig(&c->nccl, size, *uid, rank, &conf);
    etp_status_t st = ETP_SUCCESS;
    if (r != ncclSuccess && r != ncclInProgress) {
        st = etp__err(ETP_ERR_BACKEND, "ncclCommInitRankConfig (rank %d of %d, device %d): %s (%s)",
                      rank, size, device, ncclGetErrorString(r), ncclGetLastError(c->nccl));
    } else {
        char what[128];
        snprintf(what, sizeof what, "creating the NCCL communicator (rank %d of %d, device %d)",
                 rank, size, device);
        st = etp__cuda_nccl_wait(cb, &c->nccl, 1, what, ETP__CUDA_SETUP_MIN_S);
    }
    if (st != ETP_SUCCESS) {
        if (c->nccl != NULL) (void)ncclCommAbort(c->nccl);
        free(c);
        free(cb);
        return st;
    }
    return finish_world(cb, c, be, world);
}

etp_status_t etp__cuda_create_uid(const void *id, int rank, int size, const etp__be_config_t *cfg,
                                  etp__logger_t *log, etp__be_t **be, etp__bcomm_t **world)
{
    ncclUniqueId uid;
    memcpy(uid.internal, id, NCCL_UNIQUE_ID_BYTES);
    return create_from_uid(&uid, rank, size, cfg, log, be, world);
}

#if ETP_HAVE_MPI
etp_status_t etp__cuda_create_mpi(MPI_Comm comm, const etp__be_config_t *cfg, etp__logger_t *log,
                                  etp__be_t **be, etp__bcomm_t **world)
{
    int rank = 0, size = 0;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
        return etp__err(ETP_ERR_BACKEND, "CUDA backend: MPI_Comm_rank/MPI_Comm_size failed");
    /* Byte 0 says whether rank 0 could make the id, so that a failure there
     * reaches every rank instead of leaving them waiting in NCCL. */
    unsigned char msg[1 + NCCL_UNIQUE_ID_BYTES];
    memset(msg, 0, sizeof msg);
    etp_status_t st = ETP_SUCCESS;
    if (rank == 0) {
        st = etp__cuda_get_unique_id(msg + 1, NCCL_UNIQUE_ID_BYTES);
        msg[0] = st == ETP_SUCCESS;
    }
    if (MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, 0, comm) != MPI_SUCCESS)
        return etp__err(ETP_ERR_BACKEND, "CUDA backend: MPI_Bcast of the NCCL unique id failed");
    if (st != ETP_SUCCESS) return st;
    if (!msg[0])
        return etp__err(ETP_ERR_BACKEND,
                        "CUDA backend: rank 0 could not make an NCCL unique id (see its log)");
    ncclUniqueId uid;
    memcpy(uid.internal, msg + 1, NCCL_UNIQUE_ID_BYTES);
    return create_from_uid(&uid, rank, size, cfg, log, be, world);
}
#endif

etp_status_t etp__cuda_create_nccl(void *comm, const etp__be_config_t *cfg, etp__logger_t *log,
                                   etp__be_t **be, etp__bcomm_t **world)
{
    ncclComm_t user = (ncclComm_t)comm;
    int rank = 0, size = 0, dev = 0;
    ncclResult_t r = ncclCommUserRank(user, &rank);
    if (r == ncclSuccess) r = ncclCommCount(user, &size);
    if (r == ncclSuccess) r = ncclCommCuDevice(user, &dev);
    if (r != ncclSuccess)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_context_create_nccl: the NCCL communicator is not usable: %s (%s)",
                        ncclGetErrorString(r), ncclGetLastError(user));
    if (cfg->device >= 0 && cfg->device != dev)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_context_create_nccl: config device %d, but the NCCL communicator "
                        "is on device %d",
                        cfg->device, dev);
    etp__cuda_t *cb = NULL;
    ETP__TRY(be_new(cfg, log, rank, size, dev, &cb));
    etp__bcomm_t *c = comm_new(cb, "world");
    if (c == NULL) {
        free(cb);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "CUDA backend: out of host memory");
    }
    /* The caller's communicator is borrowed: etp only splits its own
     * non-blocking communicator from it, and never issues work on it. */
    int leak = 0, started = 0;
    etp_status_t st = split_into(cb, user, 0, rank, NULL, c, &leak, &started);
    if (st == ETP_SUCCESS && c->nccl == NULL)
        st = etp__err(ETP_ERR_INTERNAL, "ncclCommSplit of the user communicator returned none");
    if (st != ETP_SUCCESS) {
        if (c->nccl != NULL && !leak) (void)ncclCommAbort(c->nccl);
        if (!leak) free(c);
        free(cb);
        return st;
    }
    return finish_world(cb, c, be, world);
}
