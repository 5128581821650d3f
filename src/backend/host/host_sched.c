/* The host stream scheduler: eager, or demand-driven adversarial (shuffle). */
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

etp__hop_t *etp__hop_new(etp__hop_kind_t kind)
{
    etp__hop_t *op = calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

static void hop_free(etp__hop_t *op)
{
    if (op->kind == ETP__HOP_COLL && op->u.coll.hc) etp__hcoll_free(op->u.coll.hc);
    if (op->kind == ETP__HOP_FN) free(op->u.fn.args);
    free(op);
}

etp_status_t etp__hsched_enqueue(etp__host_t *h, etp__bstream_t *s, etp__hop_t *op)
{
    if (s->cap) return etp__hcap_add(h, s, op); /* recorded, not run */
    op->seq = ++h->next_seq;
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->last_enqueued = op->seq;
    if (h->base.cfg.host_streams == ETP_HOST_STREAMS_EAGER && h->batch_depth == 0)
        return etp__hsched_run(h, NULL, 0, 1);
    return ETP_SUCCESS;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Raise each stream's `need` to cover the producers its waits name, until
 * nothing changes. Only waits up to a stream's need count. */
static void close_needs(etp__host_t *h)
{
    int changed = 1;
    while (changed) {
        changed = 0;
        for (etp__bstream_t *s = h->streams; s; s = s->next) {
            if (s->need <= s->done_seq) continue;
            for (etp__hop_t *op = s->head; op && op->seq <= s->need; op = op->next) {
                if (op->kind != ETP__HOP_WAIT) continue;
                etp__bstream_t *w = op->u.wait.stream;
                if (w->need < op->u.wait.seq) {
                    w->need = op->u.wait.seq;
                    changed = 1;
                }
            }
        }
    }
}

static int head_runnable(const etp__bstream_t *s)
{
    const etp__hop_t *op = s->head;
    if (!op || s->inflight || op->seq > s->need) return 0;
    if (op->kind == ETP__HOP_WAIT) return op->u.wait.stream->done_seq >= op->u.wait.seq;
    return 1;
}

static etp__bstream_t *pick(etp__host_t *h)
{
    etp__bstream_t *best = NULL;
    int n = 0;
    for (etp__bstream_t *s = h->streams; s; s = s->next) {
        if (!head_runnable(s)) continue;
        n++;
        switch (h->policy) {
        case ETP__POLICY_LATE:
            if (!best || s->head->seq > best->head->seq) best = s;
            break;
        case ETP__POLICY_FIFO:
            if (!best || s->head->seq < best->head->seq) best = s;
            break;
        default:
            /* reservoir sampling: each runnable head equally likely */
            if (splitmix64(&h->rng) % (uint64_t)n == 0) best = s;
            break;
        }
    }
    return best;
}

static etp_status_t fail(etp__host_t *h, etp_status_t st)
{
    etp__be_fail(&h->base, st);
    etp__hsched_abandon(h);
    return st;
}

/* Run the head of s: plain operations complete at once, a collective starts. */
static etp_status_t exec_head(etp__host_t *h, etp__bstream_t *s)
{
    etp__hop_t *op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    switch (op->kind) {
    case ETP__HOP_MEMSET:
        memset(op->u.memset.ptr, op->u.memset.value, op->u.memset.bytes);
        break;
    case ETP__HOP_MEMCPY:
        memcpy(op->u.memcpy.dst, op->u.memcpy.src, op->u.memcpy.bytes);
        break;
    case ETP__HOP_WAIT:
        break;
    case ETP__HOP_FN:
        op->u.fn.fn(op->u.fn.args);
        break;
    case ETP__HOP_COLL: {
        s->inflight = op;
        etp_status_t st = etp__hcoll_start(h, op->u.coll.hc);
        if (st != ETP_SUCCESS) return fail(h, st);
        return ETP_SUCCESS;
    }
    }
    s->done_seq = op->seq;
    hop_free(op);
    return ETP_SUCCESS;
}

/* Advance every started collective once; *progressed when one finished. */
static etp_status_t progress_inflight(etp__host_t *h, int *progressed)
{
    for (etp__bstream_t *s = h->streams; s; s = s->next) {
        if (!s->inflight) continue;
        int done = 0;
        etp_status_t st = etp__hcoll_progress(h, s->inflight->u.coll.hc, &done);
        if (st != ETP_SUCCESS) return fail(h, st);
        if (done) {
            s->done_seq = s->inflight->seq;
            hop_free(s->inflight);
            s->inflight = NULL;
            *progressed = 1;
        }
    }
    return ETP_SUCCESS;
}

static int needs_met(const etp__host_t *h)
{
    for (const etp__bstream_t *s = h->streams; s; s = s->next)
        if (s->done_seq < s->need) return 0;
    return 1;
}

etp_status_t etp__hsched_run(etp__host_t *h, etp__bstream_t *target, uint64_t seq, int blocking)
{
    for (etp__bstream_t *s = h->streams; s; s = s->next)
        s->need = target ? s->done_seq : s->last_enqueued;
    if (target && target->need < seq) target->need = seq;
    close_needs(h);

    unsigned backoff_us = 1;
    while (!needs_met(h)) {
        etp__bstream_t *s = pick(h);
        if (s) {
            ETP__TRY(exec_head(h, s));
            backoff_us = 1;
            continue;
        }
        int progressed = 0;
        ETP__TRY(progress_inflight(h, &progressed));
        if (progressed) {
            backoff_us = 1;
            continue;
        }
        int any_inflight = 0;
        for (etp__bstream_t *t = h->streams; t; t = t->next) any_inflight |= t->inflight != NULL;
        if (!any_inflight) {
            /* Needs are closed over waits, so some head must be runnable. */
            etp__err(ETP_ERR_INTERNAL, "host scheduler: nothing runnable and nothing in flight");
            return fail(h, ETP_ERR_INTERNAL);
        }
        if (!blocking) return ETP_SUCCESS;
        /* Collectives time out on their own (etp__hcoll_progress), so this ends. */
        etp__sleep_us(backoff_us);
        if (backoff_us < 1000) backoff_us *= 2;
    }
    return ETP_SUCCESS;
}

void etp__hsched_abandon(etp__host_t *h)
{
    for (etp__bstream_t *s = h->streams; s; s = s->next) {
        if (s->inflight) {
            etp__hcoll_zombify(s->inflight->u.coll.hc);
            s->inflight->u.coll.hc = NULL;
            hop_free(s->inflight);
            s->inflight = NULL;
        }
        for (etp__hop_t *op = s->head, *next; op; op = next) {
            next = op->next;
            hop_free(op);
        }
        s->head = s->tail = NULL;
        /* Nothing will run any more: let waits and events read as complete. */
        s->done_seq = s->last_enqueued;
    }
}
