/* The host backend: lifecycle, memory, streams, events and communicators. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

#define HOST(be) ((etp__host_t *)(be))

static etp_status_t mpi_err(const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return etp__err(ETP_ERR_BACKEND, "%s: %s", what, msg);
}

/* Wait for a request, polling, bounded by the timeout. */
static etp_status_t wait_req(etp__host_t *h, MPI_Request *req, const char *what)
{
    double t0 = etp__now_s();
    unsigned backoff = 1;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_err(what, rc);
        if (flag) return ETP_SUCCESS;
        double waited = etp__now_s() - t0;
        if (h->base.cfg.timeout_s > 0 && waited > h->base.cfg.timeout_s)
            return etp__err(ETP_ERR_TIMEOUT, "timeout after %.1f s in %s: not every rank arrived",
                            waited, what);
        etp__sleep_us(backoff);
        if (backoff < 1000) backoff *= 2;
    }
}

/* ---- memory ----------------------------------------------------------- */

static etp_status_t host_mem_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    if (HOST(be)->cap)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "allocation of %zu bytes while a capture is in progress (allocate before)",
                        bytes);
    size_t rounded = (bytes + 255) & ~(size_t)255;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
    *ptr = p;
    return ETP_SUCCESS;
}

static void host_mem_free(etp__be_t *be, void *ptr)
{
    free(ptr);
}

static etp_status_t host_device_sync(etp__be_t *be)
{
    ETP__TRY(etp__hcap_check_host_wait(HOST(be), NULL, NULL, "waiting for all work"));
    return etp__hsched_run(HOST(be), NULL, 0, 1);
}

/* ---- streams and events ---------------------------------------------- */

static etp_status_t host_stream_create(etp__be_t *be, int priority, etp__bstream_t **out)
{
    etp__host_t *h = HOST(be);
    etp__bstream_t *s = calloc(1, sizeof *s);
    if (!s) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream: out of memory");
    s->host = h;
    s->id = h->next_stream_id++;
    s->priority = priority;
    s->next = h->streams;
    h->streams = s;
    *out = s;
    return ETP_SUCCESS;
}

static etp_status_t host_stream_wrap(etp__be_t *be, void *native, etp__bstream_t **out)
{
    return etp__err(ETP_ERR_UNSUPPORTED, "the host backend has no native streams to wrap");
}

static void *host_stream_native(etp__be_t *be, etp__bstream_t *s)
{
    return NULL;
}

static etp_status_t host_stream_sync(etp__be_t *be, etp__bstream_t *s)
{
    ETP__TRY(etp__hcap_check_host_wait(HOST(be), s, NULL, "stream synchronize"));
    return etp__hsched_run(HOST(be), s, s->last_enqueued, 1);
}

static etp_status_t host_stream_capturing(etp__be_t *be, etp__bstream_t *s, int *capturing)
{
    (void)be;
    *capturing = s->cap != NULL;
    return ETP_SUCCESS;
}

static etp_status_t host_stream_destroy(etp__be_t *be, etp__bstream_t *s)
{
    etp__host_t *h = HOST(be);
    if (s->cap)
        return etp__err(ETP_ERR_INVALID_STATE, "stream destroy: the stream is being captured");
    etp_status_t st = ETP_SUCCESS;
    if (!be->failed) st = host_stream_sync(be, s);
    /* Waits on other streams may still name this one: run each stream up to
     * its last such wait (running frees the operations, so find it first) */
    for (etp__bstream_t *o = h->streams; o && st == ETP_SUCCESS; o = o->next) {
        uint64_t last = 0;
        for (etp__hop_t *op = o->head; op; op = op->next)
            if (op->kind == ETP__HOP_WAIT && op->u.wait.stream == s) last = op->seq;
        if (last) st = etp__hsched_run(h, o, last, 1);
    }
    if (st != ETP_SUCCESS) return st;
    /* its work is done (or abandoned): events recorded on it are complete,
     * as a CUDA event outlives its stream */
    for (etp__bevent_t *e = h->events; e; e = e->next)
        if (e->stream == s) e->stream = NULL;
    etp__bstream_t **pp = &h->streams;
    while (*pp != s) pp = &(*pp)->next;
    *pp = s->next;
    free(s);
    return ETP_SUCCESS;
}

static etp_status_t host_event_create(etp__be_t *be, etp__bevent_t **out)
{
    etp__bevent_t *e = calloc(1, sizeof *e);
    if (!e) return etp__err(ETP_ERR_OUT_OF_MEMORY, "event: out of memory");
    etp__host_t *h = HOST(be);
    e->next = h->events;
    if (h->events) h->events->prev = e;
    h->events = e;
    *out = e;
    return ETP_SUCCESS;
}

static etp_status_t host_event_destroy(etp__be_t *be, etp__bevent_t *e)
{
    etp__host_t *h = HOST(be);
    if (e->prev) e->prev->next = e->next;
    else h->events = e->next;
    if (e->next) e->next->prev = e->prev;
    free(e);
    return ETP_SUCCESS;
}

static etp_status_t host_event_record(etp__be_t *be, etp__bevent_t *e, etp__bstream_t *s)
{
    if (s->cap) return etp__hcap_record(HOST(be), e, s);
    e->cap_id = 0;
    e->stream = s;
    e->seq = s->last_enqueued;
    return ETP_SUCCESS;
}

static etp_status_t host_stream_wait_event(etp__be_t *be, etp__bstream_t *s, etp__bevent_t *e)
{
    if (s->cap || e->cap_id) return etp__hcap_wait(HOST(be), s, e);
    if (!e->stream || e->stream == s || e->stream->done_seq >= e->seq) return ETP_SUCCESS;
    etp__hop_t *op = etp__hop_new(ETP__HOP_WAIT);
    if (!op) return etp__err(ETP_ERR_OUT_OF_MEMORY, "wait: out of memory");
    op->u.wait.stream = e->stream;
    op->u.wait.seq = e->seq;
    return etp__hsched_enqueue(HOST(be), s, op);
}

static etp_status_t host_event_query(etp__be_t *be, etp__bevent_t *e, int *done)
{
    ETP__TRY(etp__hcap_check_host_wait(HOST(be), NULL, e, "event query"));
    if (e->stream && e->stream->done_seq < e->seq)
        ETP__TRY(etp__hsched_run(HOST(be), e->stream, e->seq, 0));
    *done = !e->stream || e->stream->done_seq >= e->seq;
    return ETP_SUCCESS;
}

static etp_status_t host_event_sync(etp__be_t *be, etp__bevent_t *e)
{
    ETP__TRY(etp__hcap_check_host_wait(HOST(be), NULL, e, "event synchronize"));
    if (!e->stream) return ETP_SUCCESS;
    return etp__hsched_run(HOST(be), e->stream, e->seq, 1);
}

static etp_status_t host_memset_async(etp__be_t *be, etp__bstream_t *s, void *ptr, int value,
                                      size_t bytes)
{
    etp__hop_t *op = etp__hop_new(ETP__HOP_MEMSET);
    if (!op) return etp__err(ETP_ERR_OUT_OF_MEMORY, "memset: out of memory");
    op->u.memset.ptr = ptr;
    op->u.memset.value = value;
    op->u.memset.bytes = bytes;
    return etp__hsched_enqueue(HOST(be), s, op);
}

static etp_status_t host_memcpy_async(etp__be_t *be, etp__bstream_t *s, void *dst,
                                      const void *src, size_t bytes)
{
    etp__hop_t *op = etp__hop_new(ETP__HOP_MEMCPY);
    if (!op) return etp__err(ETP_ERR_OUT_OF_MEMORY, "memcpy: out of memory");
    op->u.memcpy.dst = dst;
    op->u.memcpy.src = src;
    op->u.memcpy.bytes = bytes;
    return etp__hsched_enqueue(HOST(be), s, op);
}

/* A caller's function, run like a host kernel: a scheduled operation of
 * the stream (shuffle mode orders it only by stream order and event
 * waits), recorded into a graph under capture. */
typedef struct {
    void (*fn)(void *arg);
    void *arg;
} host_fn_t;

static void host_fn_run(void *p)
{
    const host_fn_t *h = p;
    h->fn(h->arg);
}

static etp_status_t host_launch_host(etp__be_t *be, etp__bstream_t *s, void (*fn)(void *arg),
                                     void *arg)
{
    host_fn_t h = {fn, arg};
    return etp__host_launch(be, s, host_fn_run, &h, sizeof h);
}

/* ---- communicators ---------------------------------------------------- */

/* Wraps `data`, which every rank of it has just made; the wrapper owns it
 * from here. The wrapper's memory comes first: a rank out of memory fails
 * before the one step that needs the others (the control communicator's
 * dup), and the others then time out in that dup instead of hanging in a
 * blocking MPI_Comm_dup. After a timeout the request may still complete
 * into c->ctrl, so c and data are left to it (leaked); the caller aborts
 * the context. */
static etp_status_t comm_wrap(etp__host_t *h, MPI_Comm data, etp__bcomm_t **out)
{
    etp__bcomm_t *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&data);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "communicator: out of memory");
    }
    c->host = h;
    c->data = data;
    c->ctrl = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(data, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(data, &c->size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_idup(data, &c->ctrl, &req);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&c->data);
        free(c);
        return mpi_err("creating a communicator", rc);
    }
    etp_status_t st = wait_req(h, &req, "creating a communicator (MPI_Comm_idup)");
    if (st != ETP_SUCCESS) return st;
    rc = MPI_Comm_set_errhandler(c->ctrl, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&c->ctrl);
        MPI_Comm_free(&c->data);
        free(c);
        return mpi_err("creating a communicator", rc);
    }
    *out = c;
    return ETP_SUCCESS;
}

static etp_status_t host_comm_split(etp__be_t *be, etp__bcomm_t *parent, int color, int key,
                                    const etp_group_config_t *cfg, etp__bcomm_t **out)
{
    etp__host_t *h = HOST(be);
    /* MPI_Comm_split blocks with no timeout; an all-gather of the arguments
     * first proves every rank is there (or times out), and catches ranks
     * that disagree about nothing yet: each brings its own color. */
    /* both buffers on the heap: a request that timed out may still be
     * completed by a late rank, so they are then left to it (leaked) */
    int *mine = malloc((2 + 2 * (size_t)parent->size) * sizeof(int));
    if (!mine) return etp__err(ETP_ERR_OUT_OF_MEMORY, "split: out of memory");
    int *all = mine + 2;
    mine[0] = color;
    mine[1] = key;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, parent->ctrl, &req);
    etp_status_t st = rc == MPI_SUCCESS ? wait_req(h, &req, "group split") : mpi_err("group split", rc);
    if (st == ETP_SUCCESS || rc != MPI_SUCCESS) free(mine);
    if (st != ETP_SUCCESS) return etp__be_fail(be, st);
    MPI_Comm data;
    rc = MPI_Comm_split(parent->data, color < 0 ? MPI_UNDEFINED : color, key, &data);
    if (rc != MPI_SUCCESS) return etp__be_fail(be, mpi_err("MPI_Comm_split", rc));
    if (data == MPI_COMM_NULL) {
        *out = NULL;
        return ETP_SUCCESS;
    }
    /* a rank that fails here leaves its peers with a group it is not in:
     * their next collective on it would time out, so every rank that
     * fails aborts (the others time out in comm_wrap's dup, and abort) */
    st = comm_wrap(h, data, out);
    return st == ETP_SUCCESS ? st : etp__be_fail(be, st);
}

static void host_comm_destroy(etp__be_t *be, etp__bcomm_t *c)
{
    if (!c) return;
    /* A group that saw a refusal may have peers whose collective this rank
     * never joined (or the reverse): MPI keeps progressing such a request,
     * and its messages would match a later communicator that reuses this
     * one's context id (a hang at 5 and 7 ranks, wrong data elsewhere).
     * Those communicators are left allocated, so their ids are never
     * reused: a few per refused call, which breaks the group anyway. */
    int abandoned = etp__hcomm_drain(HOST(be), c);
    int refused = c->peer_ref != NULL || c->peer_ans != NULL || c->answered != NULL ||
                  c->sends != NULL;
    etp__hcomm_refusals_free(c);
    if (!abandoned && !refused) {
        MPI_Comm_free(&c->ctrl);
        MPI_Comm_free(&c->data);
    }
    free(c);
}

static int host_comm_rank(const etp__bcomm_t *c)
{
    return c->rank;
}

static int host_comm_size(const etp__bcomm_t *c)
{
    return c->size;
}

static etp_status_t host_coll(etp__be_t *be, etp__bcomm_t *c, const etp__coll_t *d,
                              etp__bstream_t *s)
{
    etp__host_t *h = HOST(be);
    size_t limit = (size_t)INT_MAX;
    int too_big = d->count > limit;
    if (d->kind == ETP__COLL_ALLTOALLV)
        for (int p = 0; p < c->size; p++)
            too_big |= d->sendcounts[p] > limit || d->sdispls[p] > limit ||
                       d->recvcounts[p] > limit || d->rdispls[p] > limit;
    if (too_big)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "%s on group '%s': counts above %d elements exceed MPI's int counts on the "
                        "host backend", etp__coll_name(d->kind), d->group_name, INT_MAX);
    etp__hcoll_t *hc;
    ETP__TRY(etp__hcoll_new(h, c, d, &hc));
    etp__hop_t *op = etp__hop_new(ETP__HOP_COLL);
    if (!op) {
        etp__hcoll_free(hc);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "collective: out of memory");
    }
    op->u.coll.hc = hc;
    return etp__hsched_enqueue(h, s, op);
}

static etp_status_t host_batch_begin(etp__be_t *be)
{
    HOST(be)->batch_depth++;
    return ETP_SUCCESS;
}

static etp_status_t host_batch_end(etp__be_t *be)
{
    etp__host_t *h = HOST(be);
    if (--h->batch_depth > 0 || be->cfg.host_streams != ETP_HOST_STREAMS_EAGER) return ETP_SUCCESS;
    return etp__hsched_run(h, NULL, 0, 1);
}

static void host_destroy(etp__be_t *be)
{
    etp__host_t *h = HOST(be);
    if (!be->failed && etp__hsched_run(h, NULL, 0, 1) != ETP_SUCCESS)
        ETP__LOG(be->log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND, "destroy: %s", etp_last_error());
    etp__hsched_abandon(h);
    while (h->streams) {
        etp__bstream_t *s = h->streams;
        h->streams = s->next;
        free(s);
    }
    etp__hcoll_ops_free(h);
    free(h);
}

static const etp__backend_ops_t host_ops = {
    .name = "host",
    .kind = ETP_BACKEND_HOST,
    .destroy = host_destroy,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .device_sync = host_device_sync,
    .stream_create = host_stream_create,
    .stream_wrap = host_stream_wrap,
    .stream_native = host_stream_native,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .stream_capturing = host_stream_capturing,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .stream_wait_event = host_stream_wait_event,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .memset_async = host_memset_async,
    .memcpy_async = host_memcpy_async,
    .launch_host = host_launch_host,
    .comm_split = host_comm_split,
    .comm_destroy = host_comm_destroy,
    .comm_rank = host_comm_rank,
    .comm_size = host_comm_size,
    .coll = host_coll,
    .batch_begin = host_batch_begin,
    .batch_end = host_batch_end,
    .refuse = etp__hcomm_refuse,
    .refusal_poll = etp__hcomm_refusal_poll,
    .capture_begin = etp__hcap_begin,
    .capture_end = etp__hcap_end,
    .graph_launch = etp__hcap_launch,
    .graph_destroy = etp__hcap_graph_destroy,
    .kernels = &etp__host_kernels,
};

etp_status_t etp__host_create_mpi(MPI_Comm comm, const etp__be_config_t *cfg, etp__logger_t *log,
                                  etp__be_t **out, etp__bcomm_t **world)
{
    etp__host_t *h = calloc(1, sizeof *h);
    if (!h) return etp__err(ETP_ERR_OUT_OF_MEMORY, "host backend: out of memory");
    h->base.ops = &host_ops;
    h->base.log = log;
    h->base.cfg = *cfg;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) h->half_ops[i][j] = MPI_OP_NULL;
    h->next_stream_id = 0;
    h->policy = cfg->shuffle_seed == 0   ? ETP__POLICY_LATE
                : cfg->shuffle_seed == 1 ? ETP__POLICY_FIFO
                                         : ETP__POLICY_RANDOM;
    h->rng = (uint64_t)cfg->shuffle_seed;

    etp_status_t st = etp__hcoll_ops_create(h);
    MPI_Comm data = MPI_COMM_NULL;
    if (st == ETP_SUCCESS) {
        /* idup instead of dup: a rank that never comes is a timeout, not a hang. */
        MPI_Request req;
        int rc = MPI_Comm_idup(comm, &data, &req);
        st = rc == MPI_SUCCESS ? wait_req(h, &req, "context creation (MPI_Comm_idup)")
                               : mpi_err("MPI_Comm_idup", rc);
    }
    etp__bcomm_t *w = NULL;
    if (st == ETP_SUCCESS) st = comm_wrap(h, data, &w);
    if (st != ETP_SUCCESS) {
        etp__hcoll_ops_free(h);
        free(h);
        return st;
    }
    h->base.rank = w->rank;
    h->base.size = w->size;
    *out = &h->base;
    *world = w;
    return ETP_SUCCESS;
}
