/*
 * The CUDA backend's streams and events, and the bounded host waits on them
 * that notice timeouts and asynchronous NCCL errors.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

/* An asynchronous NCCL error on any live communicator, or a fault of an
 * NVLink transport kernel, fails the backend. */
static etp_status_t check_async(etp__cuda_t *cb)
{
    ETP__TRY(etp__cuda_nvl_faults(cb));
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
etp_status_t etp__cuda_wait_work(etp__cuda_t *cb, const char *what, const cudaStream_t *ss,
                                 size_t ns, cudaEvent_t ev, const char *pending, int report)
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
            etp__cuda_error(where, e);
            return etp__cuda_fail(cb, ETP_ERR_BACKEND);
        }
        if (done_streams == ns && ev_done) {
            /* a transport kernel that gave up waiting has completed too */
            if (report) ETP__TRY(etp__cuda_nvl_faults(cb));
            return ETP_SUCCESS;
        }
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
    if (e != cudaSuccess) return etp__cuda_error("cudaStreamIsCapturing", e);
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
    return etp__cuda_wait_work(cb, what, &s, 1, NULL, pending, 1);
}

etp_status_t etp__cuda_stream_list(etp__cuda_t *cb, cudaStream_t **out, size_t *n)
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

etp_status_t etp__cuda_device_sync(etp__be_t *be)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    for (etp__bstream_t *s = cb->streams; s; s = s->next)
        ETP__TRY(refuse_if_capturing(s->s, "device synchronize"));
    cudaStream_t *arr;
    size_t n;
    ETP__TRY(etp__cuda_stream_list(cb, &arr, &n));
    etp_status_t st = etp__cuda_wait_work(cb, "the device", arr, n, NULL, NULL, 1);
    free(arr);
    return st;
}

/* ---- ops: streams ------------------------------------------------------- */

etp_status_t etp__cuda_stream_create(etp__be_t *be, int priority, etp__bstream_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    etp__bstream_t *s = calloc(1, sizeof *s);
    if (s == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream create: out of host memory");
    int prio = priority == ETP_STREAM_PRIORITY_HIGH ? cb->prio_greatest : 0;
    cudaError_t e = cudaStreamCreateWithPriority(&s->s, cudaStreamNonBlocking, prio);
    if (e != cudaSuccess) {
        free(s);
        return etp__cuda_error("cudaStreamCreateWithPriority", e);
    }
    s->next = cb->streams;
    cb->streams = s;
    *out = s;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_stream_wrap(etp__be_t *be, void *native, etp__bstream_t **out)
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
    if (e != cudaSuccess) return etp__cuda_error("etp_stream_wrap_cuda: cudaStreamGetFlags", e);
    etp__bstream_t *s = calloc(1, sizeof *s);
    if (s == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream wrap: out of host memory");
    s->s = ns;
    s->borrowed = 1;
    s->next = cb->streams;
    cb->streams = s;
    *out = s;
    return ETP_SUCCESS;
}

void *etp__cuda_stream_native(etp__be_t *be, etp__bstream_t *s)
{
    (void)be;
    return s ? (void *)s->s : NULL;
}

etp_status_t etp__cuda_stream_destroy(etp__be_t *be, etp__bstream_t *s)
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
        if (e != cudaSuccess) st = etp__cuda_fail(cb, etp__cuda_error("cudaStreamDestroy", e));
    }
    free(s);
    return st;
}

etp_status_t etp__cuda_stream_sync(etp__be_t *be, etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    ETP__TRY(refuse_if_capturing(s->s, "stream synchronize"));
    return etp__cuda_wait_stream(cb, s->s, "stream", NULL);
}

etp_status_t etp__cuda_stream_capturing(etp__be_t *be, etp__bstream_t *s, int *capturing)
{
    (void)be;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s->s, &cs);
    if (e != cudaSuccess) return etp__cuda_error("cudaStreamIsCapturing", e);
    *capturing = cs != cudaStreamCaptureStatusNone;
    return ETP_SUCCESS;
}

/* ---- ops: events -------------------------------------------------------- */

etp_status_t etp__cuda_event_create(etp__be_t *be, etp__bevent_t **out)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    etp__bevent_t *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "event create: out of host memory");
    cudaError_t e = cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return etp__cuda_error("cudaEventCreateWithFlags", e);
    }
    *out = ev;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_event_destroy(etp__be_t *be, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (ev == NULL) return ETP_SUCCESS;
    etp_status_t st = etp__cuda_set_device(cb);
    if (st == ETP_SUCCESS) {
        cudaError_t e = cudaEventDestroy(ev->e);
        if (e != cudaSuccess) st = etp__cuda_error("cudaEventDestroy", e);
    }
    free(ev);
    return st;
}

etp_status_t etp__cuda_event_record(etp__be_t *be, etp__bevent_t *ev, etp__bstream_t *s)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s->s, &cs);
    if (e != cudaSuccess) return etp__cuda_error("cudaStreamIsCapturing", e);
    e = cudaEventRecord(ev->e, s->s);
    if (e != cudaSuccess) return etp__cuda_error("cudaEventRecord", e);
    ev->recorded_in_capture = cs != cudaStreamCaptureStatusNone;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_stream_wait_event(etp__be_t *be, etp__bstream_t *s, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaStreamWaitEvent(s->s, ev->e, 0);
    if (e != cudaSuccess) return etp__cuda_error("cudaStreamWaitEvent", e);
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_event_query(etp__be_t *be, etp__bevent_t *ev, int *done)
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
    return etp__cuda_error("cudaEventQuery", e);
}

etp_status_t etp__cuda_event_sync(etp__be_t *be, etp__bevent_t *ev)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    if (ev->recorded_in_capture)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "event synchronize: the event was last recorded during a CUDA graph "
                        "capture; a host wait on it is not allowed");
    return etp__cuda_wait_work(cb, "event", NULL, 0, ev->e, NULL, 1);
}
