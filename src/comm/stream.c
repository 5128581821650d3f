/* Streams, events and the asynchronous memory operations. */
#include <stdio.h>
#include <stdlib.h>

#include "comm_internal.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

etp_status_t etp_stream_create(etp_context_t *ctx, int priority, etp_stream_t **stream)
{
    ETP__CHECK_NULL(ctx, "etp_stream_create");
    ETP__CHECK_NULL(stream, "etp_stream_create");
    ETP__TRY(etp__ctx_usable(ctx, "etp_stream_create"));
    ETP__CHECK_ARG(priority == ETP_STREAM_PRIORITY_NORMAL || priority == ETP_STREAM_PRIORITY_HIGH,
                   "etp_stream_create: priority %d (expected ETP_STREAM_PRIORITY_NORMAL or _HIGH)",
                   priority);
    etp_stream_t *s = calloc(1, sizeof *s);
    if (!s) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_stream_create: out of memory");
    etp_status_t st = ctx->be->ops->stream_create(ctx->be, priority, &s->bs);
    if (st != ETP_SUCCESS) {
        free(s);
        return st;
    }
    s->ctx = ctx;
    s->id = ++ctx->stream_ids;
    ctx->num_streams++;
    *stream = s;
    return ETP_SUCCESS;
}

/* ---- ordering clocks ------------------------------------------------------ */

static uint64_t clock_get(const etp__clock_t *c, uint64_t stream)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].stream == stream) return c->e[i].colls;
    return 0;
}

static etp_status_t clock_raise(etp__clock_t *c, uint64_t stream, uint64_t colls)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].stream == stream) {
            if (c->e[i].colls < colls) c->e[i].colls = colls;
            return ETP_SUCCESS;
        }
    if (colls == 0) return ETP_SUCCESS;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 4;
        etp__clock_entry_t *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) return etp__err(ETP_ERR_OUT_OF_MEMORY, "stream ordering: out of host memory");
        c->e = e;
        c->cap = cap;
    }
    c->e[c->n++] = (etp__clock_entry_t){stream, colls};
    return ETP_SUCCESS;
}

static etp_status_t clock_merge(etp__clock_t *into, const etp__clock_t *from)
{
    for (int i = 0; i < from->n; i++)
        ETP__TRY(clock_raise(into, from->e[i].stream, from->e[i].colls));
    return ETP_SUCCESS;
}

int etp__stream_order_checking(const etp_context_t *ctx)
{
    const etp__be_t *be = ctx->be;
    return be->cfg.check_collectives ||
           (be->ops->kind == ETP_BACKEND_HOST && be->cfg.host_streams == ETP_HOST_STREAMS_SHUFFLE);
}

void etp__stream_describe(char *buf, size_t n, uint64_t id, const char *label)
{
    if (label[0])
        snprintf(buf, n, "stream #%llu (%s)", (unsigned long long)id, label);
    else
        snprintf(buf, n, "stream #%llu", (unsigned long long)id);
}

etp_status_t etp__stream_order_use(etp_group_t *g, int role, etp_stream_t *s, const char *fn,
                                   int record)
{
    etp_context_t *ctx = g->ctx;
    if (ctx->captures) {
        int capturing = 0;
        ETP__TRY(etp__stream_capturing(s, &capturing));
        if (capturing) return ETP_SUCCESS;
    }
    const uint64_t last = g->last_stream[role];
    if (last && last != s->id && etp__stream_order_checking(ctx) &&
        clock_get(&s->after, last) < g->last_colls[role] &&
        clock_get(&ctx->done, last) < g->last_colls[role]) {
        char mine[96], theirs[96];
        etp__stream_describe(mine, sizeof mine, s->id, s->label);
        etp__stream_describe(theirs, sizeof theirs, last, g->last_label[role]);
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: group '%s' role %d from %s, but %s issued the last collective there "
                        "(seq %llu) and no etp event orders the two (record an event on %s after "
                        "it and make %s wait for it): collectives of one communicator from two "
                        "unordered streams pair differently on different ranks",
                        fn, g->name, role, mine, theirs, (unsigned long long)g->last_seq[role],
                        theirs, mine);
    }
    if (!record) return ETP_SUCCESS;
    s->colls++;
    g->last_stream[role] = s->id;
    g->last_colls[role] = s->colls;
    g->last_seq[role] = g->seq[role] + 1;
    snprintf(g->last_label[role], sizeof g->last_label[role], "%s", s->label);
    return ETP_SUCCESS;
}

void etp__stream_order_waited(etp_context_t *ctx, etp_stream_t *s, etp_event_t *e, int all)
{
    if (all) {
        for (etp_group_t *g = ctx->groups; g; g = g->next_group)
            for (int r = 0; r < g->num_roles; r++) g->last_stream[r] = 0;
        return;
    }
    /* out of host memory, the knowledge is lost: a later check may refuse
     * what a wait ordered, never accept what nothing ordered */
    if (s && (clock_merge(&ctx->done, &s->after) != ETP_SUCCESS ||
              clock_raise(&ctx->done, s->id, s->colls) != ETP_SUCCESS))
        return;
    if (e) (void)clock_merge(&ctx->done, &e->clock);
}

etp_status_t etp_stream_destroy(etp_stream_t *stream)
{
    if (!stream) return ETP_SUCCESS;
    etp_context_t *ctx = stream->ctx;
    ETP__TRY(etp__ctx_no_capture(ctx, "etp_stream_destroy"));
    /* the backend refuses with the stream as it was, or frees it (on an
     * aborted context always: teardown after a failure must go through) */
    etp_status_t st = ctx->be->ops->stream_destroy(ctx->be, stream->bs);
    if (st != ETP_SUCCESS && !ctx->be->failed) return st;
    ctx->num_streams--;
    /* its work completes first: a later collective from another stream
     * follows it */
    for (etp_group_t *g = ctx->groups; g; g = g->next_group)
        for (int r = 0; r < g->num_roles; r++)
            if (g->last_stream[r] == stream->id) g->last_stream[r] = 0;
    free(stream->after.e);
    free(stream);
    return ETP_SUCCESS;
}

etp_status_t etp_stream_synchronize(etp_stream_t *stream)
{
    ETP__CHECK_NULL(stream, "etp_stream_synchronize");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_stream_synchronize"));
    ETP__TRY(stream->ctx->be->ops->stream_sync(stream->ctx->be, stream->bs));
    etp__stream_order_waited(stream->ctx, stream, NULL, 0);
    return ETP_SUCCESS;
}

etp_status_t etp__stream_capturing(etp_stream_t *stream, int *capturing)
{
    return stream->ctx->be->ops->stream_capturing(stream->ctx->be, stream->bs, capturing);
}

#if ETP_HAVE_CUDA
etp_status_t etp_stream_wrap_cuda(etp_context_t *ctx, cudaStream_t native, etp_stream_t **stream)
{
    /* what the context is comes before what the stream is: the backend
     * refuses the default streams */
    ETP__CHECK_NULL(ctx, "etp_stream_wrap_cuda");
    ETP__CHECK_NULL(stream, "etp_stream_wrap_cuda");
    if (ctx->be->ops->kind != ETP_BACKEND_CUDA)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_stream_wrap_cuda: the context is on the %s backend, not the CUDA "
                        "backend: only a CUDA context wraps a cudaStream_t",
                        ctx->be->ops->name);
    ETP__TRY(etp__ctx_usable(ctx, "etp_stream_wrap_cuda"));
    etp_stream_t *s = calloc(1, sizeof *s);
    if (!s) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_stream_wrap_cuda: out of memory");
    etp_status_t st = ctx->be->ops->stream_wrap(ctx->be, (void *)native, &s->bs);
    if (st != ETP_SUCCESS) {
        free(s);
        return st;
    }
    s->ctx = ctx;
    s->id = ++ctx->stream_ids;
    ctx->num_streams++;
    *stream = s;
    return ETP_SUCCESS;
}

etp_status_t etp_stream_get_cuda(const etp_stream_t *stream, cudaStream_t *native)
{
    ETP__CHECK_NULL(stream, "etp_stream_get_cuda");
    ETP__CHECK_NULL(native, "etp_stream_get_cuda");
    if (stream->ctx->be->ops->kind != ETP_BACKEND_CUDA)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_stream_get_cuda: the stream's context is on the %s backend, not the "
                        "CUDA backend", stream->ctx->be->ops->name);
    *native = (cudaStream_t)stream->ctx->be->ops->stream_native(stream->ctx->be, stream->bs);
    return ETP_SUCCESS;
}
#endif

etp_status_t etp_event_create(etp_context_t *ctx, etp_event_t **event)
{
    ETP__CHECK_NULL(ctx, "etp_event_create");
    ETP__CHECK_NULL(event, "etp_event_create");
    ETP__TRY(etp__ctx_usable(ctx, "etp_event_create"));
    etp_event_t *e = calloc(1, sizeof *e);
    if (!e) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_event_create: out of memory");
    etp_status_t st = ctx->be->ops->event_create(ctx->be, &e->be_ev);
    if (st != ETP_SUCCESS) {
        free(e);
        return st;
    }
    e->ctx = ctx;
    ctx->num_events++;
    *event = e;
    return ETP_SUCCESS;
}

etp_status_t etp_event_destroy(etp_event_t *event)
{
    if (!event) return ETP_SUCCESS;
    etp_context_t *ctx = event->ctx;
    etp_status_t st = ctx->be->ops->event_destroy(ctx->be, event->be_ev);
    ctx->num_events--;
    free(event->clock.e);
    free(event);
    return st;
}

static etp_status_t same_ctx(const etp_event_t *e, const etp_stream_t *s, const char *fn)
{
    if (e->ctx != s->ctx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: the event and the stream belong to different "
                        "contexts", fn);
    return etp__ctx_usable(s->ctx, fn);
}

etp_status_t etp_event_record(etp_event_t *event, etp_stream_t *stream)
{
    ETP__CHECK_NULL(event, "etp_event_record");
    ETP__CHECK_NULL(stream, "etp_event_record");
    ETP__TRY(same_ctx(event, stream, "etp_event_record"));
    ETP__TRY(stream->ctx->be->ops->event_record(stream->ctx->be, event->be_ev, stream->bs));
    /* the event now stands for this stream's work so far and what it followed */
    event->clock.n = 0;
    ETP__TRY(clock_merge(&event->clock, &stream->after));
    return clock_raise(&event->clock, stream->id, stream->colls);
}

etp_status_t etp_stream_wait_event(etp_stream_t *stream, etp_event_t *event)
{
    ETP__CHECK_NULL(stream, "etp_stream_wait_event");
    ETP__CHECK_NULL(event, "etp_stream_wait_event");
    ETP__TRY(same_ctx(event, stream, "etp_stream_wait_event"));
    ETP__TRY(stream->ctx->be->ops->stream_wait_event(stream->ctx->be, stream->bs, event->be_ev));
    return clock_merge(&stream->after, &event->clock);
}

etp_status_t etp_event_query(etp_event_t *event, int *done)
{
    ETP__CHECK_NULL(event, "etp_event_query");
    ETP__CHECK_NULL(done, "etp_event_query");
    ETP__TRY(etp__ctx_usable(event->ctx, "etp_event_query"));
    int d = 0;
    ETP__TRY(event->ctx->be->ops->event_query(event->ctx->be, event->be_ev, &d));
    if (d) etp__stream_order_waited(event->ctx, NULL, event, 0);
    *done = d;
    return ETP_SUCCESS;
}

etp_status_t etp_event_synchronize(etp_event_t *event)
{
    ETP__CHECK_NULL(event, "etp_event_synchronize");
    ETP__TRY(etp__ctx_usable(event->ctx, "etp_event_synchronize"));
    ETP__TRY(event->ctx->be->ops->event_sync(event->ctx->be, event->be_ev));
    etp__stream_order_waited(event->ctx, NULL, event, 0);
    return ETP_SUCCESS;
}

etp_status_t etp_memset_async(etp_stream_t *stream, void *ptr, int value, size_t bytes)
{
    ETP__CHECK_NULL(stream, "etp_memset_async");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_memset_async"));
    ETP__CHECK_ARG(ptr != NULL || bytes == 0, "etp_memset_async: ptr is NULL for %zu bytes", bytes);
    ETP__CHECK_ARG(value >= 0 && value <= 255, "etp_memset_async: value %d is not a byte", value);
    if (bytes == 0) return ETP_SUCCESS;
    return stream->ctx->be->ops->memset_async(stream->ctx->be, stream->bs, ptr, value, bytes);
}

etp_status_t etp_memcpy_async(etp_stream_t *stream, void *dst, const void *src, size_t bytes)
{
    ETP__CHECK_NULL(stream, "etp_memcpy_async");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_memcpy_async"));
    ETP__CHECK_ARG((dst != NULL && src != NULL) || bytes == 0,
                   "etp_memcpy_async: dst or src is NULL for %zu bytes", bytes);
    ETP__CHECK_ARG(bytes == 0 || (const char *)dst + bytes <= (const char *)src ||
                       (const char *)src + bytes <= (const char *)dst,
                   "etp_memcpy_async: source and destination overlap");
    if (bytes == 0) return ETP_SUCCESS;
    return stream->ctx->be->ops->memcpy_async(stream->ctx->be, stream->bs, dst, src, bytes);
}

etp_status_t etp_stream_launch_host(etp_stream_t *stream, void (*fn)(void *arg), void *arg)
{
    ETP__CHECK_NULL(stream, "etp_stream_launch_host");
    ETP__CHECK_NULL(fn, "etp_stream_launch_host");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_stream_launch_host"));
    return stream->ctx->be->ops->launch_host(stream->ctx->be, stream->bs, fn, arg);
}

etp_status_t etp__capture_note(etp_context_t *ctx, int *graph_refs, etp_stream_t *stream)
{
    if (ctx->captures == 0) return ETP_SUCCESS;
    int capturing = 0;
    ETP__TRY(etp__stream_capturing(stream, &capturing));
    if (!capturing) return ETP_SUCCESS;
    for (int i = 0; i < ctx->n_cap_refs; i++)
        if (ctx->cap_refs[i] == graph_refs) return ETP_SUCCESS;
    if (ctx->n_cap_refs == ctx->cap_cap_refs) {
        int cap = ctx->cap_cap_refs ? 2 * ctx->cap_cap_refs : 8;
        int **a = realloc(ctx->cap_refs, (size_t)cap * sizeof *a);
        if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "capture: out of host memory");
        ctx->cap_refs = a;
        ctx->cap_cap_refs = cap;
    }
    ctx->cap_refs[ctx->n_cap_refs++] = graph_refs;
    return ETP_SUCCESS;
}

etp_status_t etp__capture_note_group(etp_group_t *group, etp_stream_t *stream)
{
    return etp__capture_note(group->ctx, &group->graph_refs, stream);
}

/* A capture ended (made a graph or not): the objects noted are forgotten
 * once no capture is left. */
static void capture_done(etp_context_t *ctx)
{
    if (--ctx->captures == 0) ctx->n_cap_refs = 0;
}

etp_status_t etp_stream_begin_capture(etp_stream_t *stream)
{
    ETP__CHECK_NULL(stream, "etp_stream_begin_capture");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_stream_begin_capture"));
    /* both backends alike (CUDA itself would allow a second) */
    if (stream->ctx->captures)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_stream_begin_capture: a capture is in progress on this context already "
                        "(one at a time)");
    ETP__TRY(stream->ctx->be->ops->capture_begin(stream->ctx->be, stream->bs));
    stream->ctx->captures++;
    return ETP_SUCCESS;
}

etp_status_t etp_stream_end_capture(etp_stream_t *stream, etp_graph_t **graph)
{
    ETP__CHECK_NULL(stream, "etp_stream_end_capture");
    ETP__CHECK_NULL(graph, "etp_stream_end_capture");
    etp_context_t *ctx = stream->ctx;
    etp_graph_t *g = calloc(1, sizeof *g);
    if (g && ctx->n_cap_refs) {
        g->refs = malloc((size_t)ctx->n_cap_refs * sizeof *g->refs);
        if (!g->refs) {
            free(g);
            g = NULL;
        }
    }
    if (!g) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_stream_end_capture: out of host memory");
    int was = 0;
    (void)etp__stream_capturing(stream, &was);
    etp_status_t st = ctx->be->ops->capture_end(ctx->be, stream->bs, &g->bg);
    if (st != ETP_SUCCESS) {
        /* a capture that failed to end is over all the same where its
         * stream no longer captures (CUDA ends it either way) */
        int now = 1;
        if (was && etp__stream_capturing(stream, &now) == ETP_SUCCESS && !now && ctx->captures)
            capture_done(ctx);
        free(g->refs);
        free(g);
        return st;
    }
    for (int i = 0; i < ctx->n_cap_refs; i++) {
        g->refs[g->nrefs++] = ctx->cap_refs[i];
        (*ctx->cap_refs[i])++;
    }
    if (ctx->captures) capture_done(ctx);
    g->ctx = ctx;
    ctx->num_graphs++;
    *graph = g;
    return ETP_SUCCESS;
}

etp_status_t etp_graph_launch(etp_graph_t *graph, etp_stream_t *stream)
{
    ETP__CHECK_NULL(graph, "etp_graph_launch");
    ETP__CHECK_NULL(stream, "etp_graph_launch");
    ETP__CHECK_ARG(stream->ctx == graph->ctx,
                   "etp_graph_launch: the stream belongs to another context than the graph");
    ETP__TRY(etp__ctx_usable(stream->ctx, "etp_graph_launch"));
    return stream->ctx->be->ops->graph_launch(stream->ctx->be, graph->bg, stream->bs);
}

etp_status_t etp_graph_destroy(etp_graph_t *graph)
{
    if (!graph) return ETP_SUCCESS;
    graph->ctx->be->ops->graph_destroy(graph->ctx->be, graph->bg);
    for (int i = 0; i < graph->nrefs; i++) (*graph->refs[i])--;
    free(graph->refs);
    graph->ctx->num_graphs--;
    free(graph);
    return ETP_SUCCESS;
}
