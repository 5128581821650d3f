/*
 * Graph capture on the host backend, with CUDA's rules, so that capture bugs
 * show up in CI: while a stream captures, its operations are recorded, not
 * run; another stream joins the capture by waiting on an event recorded in
 * it; a capturing stream may not wait on an event recorded outside the
 * capture; no host wait on a capturing stream or a captured event, no
 * device-wide wait and no allocation while a capture is in progress; and at
 * the end every joined stream's work must be joined back into the stream the
 * capture began on. A graph replays the recorded operations in their order,
 * its other streams forked from and joined back into the launch stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

typedef struct {
    int stream;         /* capture-local stream index; 0: the origin */
    etp__hop_t op;      /* a copy of the operation (FN args and COLL templates owned) */
    int wstream, wpos;  /* WAIT: after wpos operations captured on wstream */
} gop_t;

struct etp__hcap {
    uint64_t id;
    etp__bstream_t **streams; /* [0]: the origin */
    int *nops_on;             /* operations captured per stream */
    int nstreams, cap_streams;
    gop_t *ops;
    int nops, cap_ops;
    etp_status_t failed;      /* the first error: the capture is invalid */
    char fail_msg[ETP__ERRMSG_MAX];
};

typedef struct {
    int nstreams, nops;
    etp__bstream_t **streams; /* [0] unused (the launch stream); the others owned */
    gop_t *ops;
    int *base;                /* where stream k's positions start in seqs */
    uint64_t *seqs;           /* per launch: the seq each replayed operation got */
    uint64_t *start;          /* per launch: each stream's last seq before it */
} hgraph_t;

static void free_gop(gop_t *g)
{
    if (g->op.kind == ETP__HOP_FN) free(g->op.u.fn.args);
    if (g->op.kind == ETP__HOP_COLL && g->op.u.coll.hc) etp__hcoll_free(g->op.u.coll.hc);
}

static etp_status_t invalidate(etp__hcap_t *c, etp_status_t st)
{
    if (c->failed == ETP_SUCCESS) {
        c->failed = st;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", etp_last_error());
    }
    return st;
}

static gop_t *push(etp__hcap_t *c, int stream)
{
    if (c->nops == c->cap_ops) {
        int cap = c->cap_ops ? 2 * c->cap_ops : 64;
        gop_t *a = realloc(c->ops, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        c->ops = a;
        c->cap_ops = cap;
    }
    gop_t *g = &c->ops[c->nops++];
    memset(g, 0, sizeof *g);
    g->stream = stream;
    c->nops_on[stream]++;
    return g;
}

static etp_status_t join(etp__hcap_t *c, etp__bstream_t *s)
{
    if (c->nstreams == c->cap_streams) {
        int cap = 2 * c->cap_streams;
        etp__bstream_t **a = realloc(c->streams, (size_t)cap * sizeof *a);
        if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "capture: out of host memory");
        c->streams = a;
        int *b = realloc(c->nops_on, (size_t)cap * sizeof *b);
        if (!b) return etp__err(ETP_ERR_OUT_OF_MEMORY, "capture: out of host memory");
        c->nops_on = b;
        c->cap_streams = cap;
    }
    s->cap = c;
    s->cap_idx = c->nstreams;
    c->streams[c->nstreams] = s;
    c->nops_on[c->nstreams++] = 0;
    return ETP_SUCCESS;
}

etp_status_t etp__hcap_add(etp__host_t *h, etp__bstream_t *s, etp__hop_t *op)
{
    gop_t *g = push(s->cap, s->cap_idx);
    if (!g) {
        etp__err(ETP_ERR_OUT_OF_MEMORY, "capture: out of host memory");
        return invalidate(s->cap, ETP_ERR_OUT_OF_MEMORY);
    }
    g->op = *op; /* FN args and the COLL template move into the graph */
    g->op.next = NULL;
    free(op);
    (void)h;
    return ETP_SUCCESS;
}

etp_status_t etp__hcap_record(etp__host_t *h, etp__bevent_t *e, etp__bstream_t *s)
{
    e->stream = s;
    e->seq = 0;
    e->cap_id = s->cap->id;
    e->cap_stream = s->cap_idx;
    e->cap_pos = s->cap->nops_on[s->cap_idx];
    (void)h;
    return ETP_SUCCESS;
}

etp_status_t etp__hcap_wait(etp__host_t *h, etp__bstream_t *s, etp__bevent_t *e)
{
    etp__hcap_t *c = h->cap;
    if (e->cap_id) {
        if (!c || e->cap_id != c->id)
            return etp__err(ETP_ERR_INVALID_STATE,
                            "stream wait: the event was last recorded during a capture that has "
                            "ended; record it again outside (CUDA: cudaErrorCapturedEvent)");
        if (!s->cap) ETP__TRY(join(c, s));
        gop_t *g = push(c, s->cap_idx);
        if (!g) return invalidate(c, etp__err(ETP_ERR_OUT_OF_MEMORY, "capture: out of host memory"));
        g->op.kind = ETP__HOP_WAIT;
        g->wstream = e->cap_stream;
        g->wpos = e->cap_pos;
        return ETP_SUCCESS;
    }
    if (e->stream == NULL) return ETP_SUCCESS; /* never recorded: nothing to wait for */
    etp__err(ETP_ERR_INVALID_STATE,
             "stream wait: a capturing stream waits on an event recorded outside the capture; "
             "the graph could not carry that dependency (order it before the capture began, or "
             "record the event inside the capture)");
    return invalidate(s->cap, ETP_ERR_INVALID_STATE);
}

etp_status_t etp__hcap_check_host_wait(etp__host_t *h, etp__bstream_t *s, etp__bevent_t *e,
                                       const char *what)
{
    if (s && s->cap)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: the stream is being captured; a host wait is not allowed during a "
                        "capture", what);
    if (e && e->cap_id)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: the event was last recorded during a capture; record it again "
                        "outside first", what);
    if (!s && !e && h->cap)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: not allowed while a capture is in progress",
                        what);
    return ETP_SUCCESS;
}

etp_status_t etp__hcap_begin(etp__be_t *be, etp__bstream_t *s)
{
    etp__host_t *h = (etp__host_t *)be;
    if (h->cap)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "begin capture: a capture is in progress on this context already");
    etp__hcap_t *c = calloc(1, sizeof *c);
    if (c) {
        c->cap_streams = 4;
        c->streams = calloc(4, sizeof *c->streams);
        c->nops_on = calloc(4, sizeof *c->nops_on);
    }
    if (!c || !c->streams || !c->nops_on) {
        if (c) {
            free(c->streams);
            free(c->nops_on);
        }
        free(c);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "begin capture: out of host memory");
    }
    c->id = ++h->next_cap_id;
    h->cap = c;
    return join(c, s);
}

static void cap_free(etp__host_t *h, etp__hcap_t *c, int keep_ops)
{
    for (int k = 0; k < c->nstreams; k++) c->streams[k]->cap = NULL;
    if (!keep_ops)
        for (int i = 0; i < c->nops; i++) free_gop(&c->ops[i]);
    if (!keep_ops) free(c->ops);
    free(c->streams);
    free(c->nops_on);
    free(c);
    h->cap = NULL;
}

/* Every captured operation must precede the origin's last one, through
 * stream order and the recorded waits. */
static int all_joined(const etp__hcap_t *c, const int *base, const int *order)
{
    int *reach = calloc((size_t)c->nstreams, sizeof *reach);
    if (!reach) return 0;
    reach[0] = c->nops_on[0];
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int k = 0; k < c->nstreams; k++)
            for (int p = 0; p < reach[k]; p++) {
                const gop_t *g = &c->ops[order[base[k] + p]];
                if (g->op.kind == ETP__HOP_WAIT && reach[g->wstream] < g->wpos) {
                    reach[g->wstream] = g->wpos;
                    changed = 1;
                }
            }
    }
    int ok = 1;
    for (int k = 0; k < c->nstreams; k++) ok &= reach[k] == c->nops_on[k];
    free(reach);
    return ok;
}

etp_status_t etp__hcap_end(etp__be_t *be, etp__bstream_t *s, void **graph)
{
    etp__host_t *h = (etp__host_t *)be;
    etp__hcap_t *c = h->cap;
    if (!c || s->cap != c || s->cap_idx != 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "end capture: the stream is not the one the capture began on");
    if (c->failed != ETP_SUCCESS) {
        etp_status_t st = etp__err(c->failed, "end capture: the capture was invalidated: %s",
                                   c->fail_msg);
        cap_free(h, c, 0);
        return st;
    }
    hgraph_t *g = calloc(1, sizeof *g);
    int *base = calloc((size_t)c->nstreams + 1, sizeof *base);
    int *order = malloc((size_t)(c->nops ? c->nops : 1) * sizeof *order);
    int *fill = calloc((size_t)c->nstreams, sizeof *fill);
    if (!g || !base || !order || !fill) {
        free(g), free(base), free(order), free(fill);
        cap_free(h, c, 0);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "end capture: out of host memory");
    }
    for (int k = 0; k < c->nstreams; k++) base[k + 1] = base[k] + c->nops_on[k];
    for (int i = 0; i < c->nops; i++) {
        int k = c->ops[i].stream;
        order[base[k] + fill[k]++] = i;
    }
    int ok = all_joined(c, base, order);
    free(order);
    free(fill);
    if (!ok) {
        free(g);
        free(base);
        cap_free(h, c, 0);
        return etp__err(ETP_ERR_INVALID_STATE,
                        "end capture: work on a stream that joined the capture was not joined "
                        "back into the stream the capture began on (record an event after it and "
                        "make that stream wait on it)");
    }
    g->nstreams = c->nstreams;
    g->nops = c->nops;
    g->ops = c->ops;
    g->base = base;
    g->streams = calloc((size_t)g->nstreams, sizeof *g->streams);
    g->seqs = calloc((size_t)(g->nops ? g->nops : 1), sizeof *g->seqs);
    g->start = calloc((size_t)g->nstreams, sizeof *g->start);
    etp_status_t st = (g->streams && g->seqs && g->start)
                          ? ETP_SUCCESS
                          : etp__err(ETP_ERR_OUT_OF_MEMORY, "end capture: out of host memory");
    cap_free(h, c, 1);
    /* the graph's own streams stand for the captured side streams */
    for (int k = 1; k < g->nstreams && st == ETP_SUCCESS; k++)
        st = be->ops->stream_create(be, ETP_STREAM_PRIORITY_NORMAL, &g->streams[k]);
    if (st != ETP_SUCCESS) {
        etp__hcap_graph_destroy(be, g);
        return st;
    }
    *graph = g;
    return ETP_SUCCESS;
}

etp_status_t etp__hcap_launch(etp__be_t *be, void *graph, etp__bstream_t *s)
{
    etp__host_t *h = (etp__host_t *)be;
    hgraph_t *g = graph;
    if (s->cap)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "graph launch: launching a graph into a capture is not supported on the "
                        "host backend");
    int *pos = calloc((size_t)g->nstreams, sizeof *pos);
    if (!pos) return etp__err(ETP_ERR_OUT_OF_MEMORY, "graph launch: out of host memory");
    for (int k = 0; k < g->nstreams; k++) g->start[k] = (k ? g->streams[k] : s)->last_enqueued;
    etp_status_t st = ETP_SUCCESS;
    for (int i = 0; i < g->nops && st == ETP_SUCCESS; i++) {
        const gop_t *o = &g->ops[i];
        etp__bstream_t *t = o->stream ? g->streams[o->stream] : s;
        switch (o->op.kind) {
        case ETP__HOP_WAIT: {
            etp__bstream_t *w = o->wstream ? g->streams[o->wstream] : s;
            uint64_t seq = o->wpos ? g->seqs[g->base[o->wstream] + o->wpos - 1] : g->start[o->wstream];
            if (w != t && seq > w->done_seq) {
                etp__hop_t *op = etp__hop_new(ETP__HOP_WAIT);
                if (!op) {
                    st = etp__err(ETP_ERR_OUT_OF_MEMORY, "graph launch: out of host memory");
                    break;
                }
                op->u.wait.stream = w;
                op->u.wait.seq = seq;
                st = etp__hsched_enqueue(h, t, op);
            }
            break;
        }
        case ETP__HOP_MEMSET:
        case ETP__HOP_MEMCPY: {
            etp__hop_t *op = etp__hop_new(o->op.kind);
            if (!op) {
                st = etp__err(ETP_ERR_OUT_OF_MEMORY, "graph launch: out of host memory");
                break;
            }
            op->u = o->op.u;
            st = etp__hsched_enqueue(h, t, op);
            break;
        }
        case ETP__HOP_FN:
            st = etp__host_launch(be, t, o->op.u.fn.fn, o->op.u.fn.args, o->op.u.fn.bytes);
            break;
        case ETP__HOP_COLL: {
            const etp__hcoll_t *tmpl = o->op.u.coll.hc;
            etp__hcoll_t *hc = NULL;
            st = etp__hcoll_new(h, tmpl->comm, &tmpl->d, &hc);
            if (st != ETP_SUCCESS) break;
            etp__hop_t *op = etp__hop_new(ETP__HOP_COLL);
            if (!op) {
                etp__hcoll_free(hc);
                st = etp__err(ETP_ERR_OUT_OF_MEMORY, "graph launch: out of host memory");
                break;
            }
            op->u.coll.hc = hc;
            st = etp__hsched_enqueue(h, t, op);
            break;
        }
        }
        g->seqs[g->base[o->stream] + pos[o->stream]++] = t->last_enqueued;
    }
    free(pos);
    return st;
}

void etp__hcap_graph_destroy(etp__be_t *be, void *graph)
{
    hgraph_t *g = graph;
    if (!g) return;
    for (int i = 0; i < g->nops; i++) free_gop(&g->ops[i]);
    for (int k = 1; k < g->nstreams && g->streams; k++)
        if (g->streams[k]) be->ops->stream_destroy(be, g->streams[k]);
    free(g->ops);
    free(g->streams);
    free(g->base);
    free(g->seqs);
    free(g->start);
    free(g);
}
