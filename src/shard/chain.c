/* Chains: building, planning, the gather cache, gathers and releases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

static const char *pass_name(etp_pass_t pass)
{
    return pass == ETP_PASS_FORWARD ? "forward" : "backward";
}

etp_status_t etp_chain_create(etp_context_t *ctx, const etp_chain_config_t *config,
                              etp_chain_t **out)
{
    const char *fn = "etp_chain_create";
    ETP__CHECK_NULL(ctx, fn);
    ETP__CHECK_NULL(config, fn);
    ETP__CHECK_NULL_AS(out, "chain", fn);
    etp_chain_config_t in = ETP_CHAIN_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&in, config, &etp__vs_chain_config, fn, "config"));
    const etp_chain_config_t *cfg = &in;
    /* the config's messages name the chain */
    char who[112];
    snprintf(who, sizeof who, "etp_chain_create: chain '%.63s'", cfg->name ? cfg->name : "chain");
    fn = who;
    ETP__CHECK_ARG(cfg->group != NULL, "%s: config->group is NULL", fn);
    ETP__CHECK_ARG(cfg->group->ctx == ctx, "%s: group '%s' belongs to another context", fn,
                   cfg->group->name);
    ETP__CHECK_ARG(cfg->depth >= 0, "%s: depth %d (expected >= 0)", fn, cfg->depth);
    ETP__CHECK_ARG(cfg->wgrad_ring >= 1, "%s: wgrad_ring %d (expected >= 1)", fn, cfg->wgrad_ring);
    ETP__CHECK_ARG(cfg->num_microbatches >= 1, "%s: num_microbatches %d (expected >= 1)", fn,
                   cfg->num_microbatches);
    ETP__CHECK_ARG(cfg->prefetch_on_update == 0 || cfg->prefetch_on_update == 1,
                   "%s: prefetch_on_update %d (expected 0 or 1)", fn, cfg->prefetch_on_update);
    ETP__CHECK_ARG(!(cfg->prefetch_on_update && cfg->graphed),
                   "%s: prefetch_on_update is for ungraphed chains (a graphed chain's prefetches "
                   "stay inside its captured steps)", fn);
    ETP__CHECK_ARG(cfg->defer_zero_grad == 0 || cfg->defer_zero_grad == 1,
                   "%s: defer_zero_grad %d (expected 0 or 1)", fn, cfg->defer_zero_grad);
    /* a replayed graph would repeat whichever of store and add was captured */
    ETP__CHECK_ARG(!(cfg->defer_zero_grad && cfg->graphed),
                   "%s: defer_zero_grad is for ungraphed chains (a captured reduction would store "
                   "or add on every replay, whatever etp_zero_grad said)", fn);
    ETP__CHECK_ARG(cfg->graph_whole_step == 0 || cfg->graph_whole_step == 1,
                   "%s: graph_whole_step %d (expected 0 or 1)", fn, cfg->graph_whole_step);
    ETP__CHECK_ARG(!cfg->graph_whole_step || cfg->graphed,
                   "%s: graph_whole_step is for graphed chains (an ungraphed chain's prefetches "
                   "cross forward -> backward anyway)", fn);
    /* a captured pass must gather what it uses (slot_holds) */
    ETP__CHECK_ARG(cfg->keep_bytes == 0 || !cfg->graphed || cfg->graph_whole_step,
                   "%s: keep_bytes on a graphed chain needs graph_whole_step (forward and "
                   "backward in one graph, or each captured pass gathers what it uses)",
                   fn);
    int roles = cfg->group->num_roles;
    /* the usual first mistake, the context's world (one role): say what to do */
    ETP__CHECK_ARG(roles >= 2,
                   "%s: group '%s' has %d role; chains need 2 (all-gather and reduce-scatter): "
                   "split a group with num_roles = 2, see etp_group_split", fn, cfg->group->name,
                   roles);
    ETP__CHECK_ARG(cfg->ag_role >= 0 && cfg->ag_role < roles && cfg->rs_role >= 0 && cfg->rs_role < roles,
                   "%s: roles ag %d, rs %d not in [0, %d) of group '%s'", fn, cfg->ag_role,
                   cfg->rs_role, roles, cfg->group->name);
    ETP__CHECK_ARG(cfg->ag_role != cfg->rs_role,
                   "%s: ag_role and rs_role are both %d: all-gathers and reduce-scatters on one "
                   "communicator cannot overlap (give the group two roles)", fn, cfg->ag_role);
    ETP__CHECK_ARG(cfg->name == NULL || strlen(cfg->name) < 64, "%s: name longer than 63 characters", fn);
    ETP__TRY(etp__ctx_usable(ctx, fn));

    etp_chain_t *c = calloc(1, sizeof *c);
    if (!c) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    c->ctx = ctx;
    c->group = cfg->group;
    c->group->users++; /* etp_chain_destroy, also on the failure paths below, returns it */
    snprintf(c->name, sizeof c->name, "%s", cfg->name ? cfg->name : "chain");
    c->depth = cfg->depth;
    c->graphed = cfg->graphed != 0;
    c->ag_role = cfg->ag_role;
    c->rs_role = cfg->rs_role;
    c->ring_n = cfg->wgrad_ring;
    c->grads_joined = 1; /* nothing reduced yet */
    c->num_micro = cfg->num_microbatches;
    c->prefetch_on_update = cfg->prefetch_on_update;
    c->defer_zero = cfg->defer_zero_grad;
    c->whole_step = cfg->graph_whole_step;
    c->keep_bytes = cfg->keep_bytes;
    etp_status_t st = etp_stream_create(ctx, ETP_STREAM_PRIORITY_HIGH, &c->ag);
    if (st == ETP_SUCCESS) st = etp_stream_create(ctx, ETP_STREAM_PRIORITY_HIGH, &c->rs);
    if (st == ETP_SUCCESS) st = etp_event_create(ctx, &c->scratch);
    if (st == ETP_SUCCESS) {
        /* for messages about streams (etp__stream_order_use) */
        snprintf(c->ag->label, sizeof c->ag->label, "chain '%.40s' all-gathers", c->name);
        snprintf(c->rs->label, sizeof c->rs->label, "chain '%.40s' reductions", c->name);
        c->ring = calloc((size_t)c->ring_n, sizeof *c->ring);
        c->ring_holder = calloc((size_t)c->ring_n, sizeof *c->ring_holder);
        c->ring_done = calloc((size_t)c->ring_n, sizeof *c->ring_done);
        c->ring_done_recorded = calloc((size_t)c->ring_n, sizeof *c->ring_done_recorded);
        if (!c->ring || !c->ring_holder || !c->ring_done || !c->ring_done_recorded)
            st = etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    for (int k = 0; k < c->ring_n && st == ETP_SUCCESS; k++) st = etp_event_create(ctx, &c->ring_done[k]);
    if (st != ETP_SUCCESS) {
        etp_chain_destroy(c);
        return st;
    }
    *out = c;
    return ETP_SUCCESS;
}

static void free_slots(etp_chain_t *c)
{
    for (int s = 0; s < c->nslots; s++) {
        if (c->slots[s].ptr) etp_mem_free(c->ctx, c->slots[s].ptr);
        if (c->slots[s].ready) etp_event_destroy(c->slots[s].ready);
        if (c->slots[s].released) etp_event_destroy(c->slots[s].released);
    }
    free(c->slots);
    c->slots = NULL;
    c->nslots = 0;
}

static int work_pending(etp_chain_t *c)
{
    int done_ag = 1, done_rs = 1;
    if (etp_event_record(c->scratch, c->ag) == ETP_SUCCESS) etp_event_query(c->scratch, &done_ag);
    if (etp_event_record(c->scratch, c->rs) == ETP_SUCCESS) etp_event_query(c->scratch, &done_rs);
    return !done_ag || !done_rs;
}

etp_status_t etp_chain_destroy(etp_chain_t *c)
{
    if (!c) return ETP_SUCCESS;
    ETP__TRY(etp__ctx_no_capture(c->ctx, "etp_chain_destroy"));
    if (c->graph_refs > 0)
        return etp__err(ETP_ERR_BUSY, "etp_chain_destroy: chain '%s' is used by %d graph(s); destroy them first",
                        c->name, c->graph_refs);
    if (!c->ctx->be->failed) {
        for (int t = 0; t < c->ntickets; t++)
            if (c->tickets[t].state == ETP__TICKET_HELD)
                return etp__err(ETP_ERR_BUSY,
                                "etp_chain_destroy: '%s' %s of chain '%s' is gathered and not released",
                                c->tickets[t].param->name, pass_name(c->tickets[t].pass), c->name);
        if (c->ag && c->rs && work_pending(c))
            return etp__err(ETP_ERR_BUSY,
                            "etp_chain_destroy: chain '%s' has communication in flight; call "
                            "etp_wait_grads and synchronize first", c->name);
    }
    /* deferred zeros become real before the parameters leave (only then is
     * there anything to wait for: other chains keep destroy free of syncs) */
    int pending = 0;
    for (int i = 0; i < c->nparams; i++) pending |= c->params[i]->zero_pending;
    if (pending && !c->ctx->be->failed) {
        etp_status_t zs = etp__chain_zero_pending(c);
        if (zs == ETP_SUCCESS) zs = etp_stream_synchronize(c->rs);
        if (zs != ETP_SUCCESS) return zs;
    }
    if (c->ctx->recording == c) c->ctx->recording = NULL;
    c->group->users--;
    for (int i = 0; i < c->nparams; i++) {
        /* nothing of this chain stays with the parameter: a wgrad buffer
         * handed out and not reduced, or micro-batches counted, would
         * index the next chain's ring or hold back its callback */
        c->params[i]->chain = NULL;
        c->params[i]->ticket[0] = c->params[i]->ticket[1] = -1;
        c->params[i]->wgrad_entry = -1;
        c->params[i]->micro = 0;
    }
    free_slots(c);
    for (int k = 0; k < c->ring_n; k++) {
        if (c->ring && c->ring[k]) etp_mem_free(c->ctx, c->ring[k]);
        if (c->ring_done && c->ring_done[k]) etp_event_destroy(c->ring_done[k]);
    }
    if (c->rs_stage) etp_mem_free(c->ctx, c->rs_stage);
    if (c->stats) etp_mem_free(c->ctx, c->stats);
    if (c->scratch) etp_event_destroy(c->scratch);
    if (c->ag) etp_stream_destroy(c->ag);
    if (c->rs) etp_stream_destroy(c->rs);
    free(c->a2a_counts);
    free(c->a2a_displs);
    free(c->ring);
    free(c->ring_holder);
    free(c->ring_done);
    free(c->ring_done_recorded);
    free(c->params);
    free(c->tickets);
    free(c);
    return ETP_SUCCESS;
}

static etp_status_t attach(etp_chain_t *c, etp_param_t *p, const char *fn)
{
    if (p->chain)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: '%s' is already in chain '%s'", fn, p->name,
                        p->chain->name);
    if (p->ctx != c->ctx)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: '%s' belongs to another context", fn, p->name);
    if (p->group != c->group)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: '%s' is sharded over group '%s', chain '%s' over group '%s'", fn,
                        p->name, p->group->name, c->name, c->group->name);
    if (c->nparams == c->cap_params) {
        int cap = c->cap_params ? 2 * c->cap_params : 16;
        etp_param_t **a = realloc(c->params, (size_t)cap * sizeof *a);
        if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        c->params = a;
        c->cap_params = cap;
    }
    c->params[c->nparams++] = p;
    p->chain = c;
    return ETP_SUCCESS;
}

etp_status_t etp_chain_add(etp_chain_t *c, etp_param_t *p)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_add");
    ETP__CHECK_NULL_AS(p, "param", "etp_chain_add");
    if (c->state != ETP__CHAIN_BUILDING)
        return etp__err(ETP_ERR_INVALID_STATE, "etp_chain_add: chain '%s' is %s", c->name,
                        c->state == ETP__CHAIN_RECORDING ? "recording (its gathers add parameters)"
                                                         : "finalized");
    return attach(c, p, "etp_chain_add");
}

static etp_status_t push_ticket(etp_chain_t *c, etp_param_t *p, etp_pass_t pass)
{
    if (c->ntickets == c->cap_tickets) {
        int cap = c->cap_tickets ? 2 * c->cap_tickets : 32;
        etp__ticket_t *a = realloc(c->tickets, (size_t)cap * sizeof *a);
        if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "chain '%s': out of memory", c->name);
        c->tickets = a;
        c->cap_tickets = cap;
    }
    etp__ticket_t t = {p, pass, etp__param_gather_bytes(p, pass), -1, ETP__TICKET_IDLE, 0, 0};
    p->ticket[pass] = c->ntickets;
    c->tickets[c->ntickets++] = t;
    return ETP_SUCCESS;
}

/* A group of one gathers nothing: the shard is the whole weight, and an
 * unquantized gather's view is the shard itself (no slot, no copy). */
static int gathers_nothing(const etp_param_t *p)
{
    return p->group_size == 1 && p->quant == ETP_PARAM_QUANT_NONE;
}

/* Plan the tickets and allocate the slots (replacing any a recording used). */
static etp_status_t plan(etp_chain_t *c)
{
    int n = c->ntickets;
    size_t *bytes = malloc((size_t)(n ? n : 1) * sizeof *bytes);
    size_t *slot_bytes = malloc((size_t)(n ? n : 1) * sizeof *slot_bytes);
    int *slot = malloc((size_t)(n ? n : 1) * sizeof *slot);
    int *same = malloc((size_t)(n ? n : 1) * sizeof *same);
    etp_status_t st = ETP_SUCCESS;
    int nslots = -1;
    if (bytes && slot_bytes && slot && same) {
        for (int i = 0; i < n; i++) {
            bytes[i] = gathers_nothing(c->tickets[i].param) ? 0 : c->tickets[i].bytes;
            /* an unquantized weight's earlier ticket: its slot may still
             * hold the whole weight (slot_holds) */
            same[i] = -1;
            if (c->tickets[i].param->quant == ETP_PARAM_QUANT_NONE && bytes[i])
                for (int j = i - 1; j >= 0 && same[i] < 0; j--)
                    if (c->tickets[j].param == c->tickets[i].param) same[i] = j;
        }
        nslots = etp__plan_tickets(bytes, same, n, c->depth, c->keep_bytes, slot, slot_bytes,
                                   &c->lower_bound);
    }
    if (nslots < 0) st = etp__err(ETP_ERR_OUT_OF_MEMORY, "chain '%s': out of memory", c->name);
    free_slots(c);
    if (st == ETP_SUCCESS && nslots > 0) {
        c->slots = calloc((size_t)nslots, sizeof *c->slots);
        if (!c->slots) st = etp__err(ETP_ERR_OUT_OF_MEMORY, "chain '%s': out of memory", c->name);
        else c->nslots = nslots;
    }
    for (int s = 0; s < c->nslots && st == ETP_SUCCESS; s++) {
        c->slots[s].tenant = -1;
        c->slots[s].bytes = slot_bytes[s];
        st = etp__mem_alloc_window(c->group, c->ag_role, slot_bytes[s], ETP_MEM_GATHER_SLOTS,
                                   &c->slots[s].ptr, &c->slots[s].window);
        if (st == ETP_SUCCESS) st = etp_event_create(c->ctx, &c->slots[s].ready);
        if (st == ETP_SUCCESS) st = etp_event_create(c->ctx, &c->slots[s].released);
    }
    for (int i = 0; i < n && st == ETP_SUCCESS; i++) {
        c->tickets[i].slot = slot[i];
        c->tickets[i].state = ETP__TICKET_IDLE;
    }
    free(bytes);
    free(slot_bytes);
    free(slot);
    free(same);
    if (st == ETP_SUCCESS) st = etp__chain_ensure_workspace(c);
    if (st != ETP_SUCCESS) {
        free_slots(c);
        return st;
    }
    c->state = ETP__CHAIN_FINALIZED;
    ETP__LOG(&c->ctx->log, ETP_LOG_INFO, ETP_SUBSYS_SHARD,
             "chain '%s': %d parameters, %d tickets in %d slots (depth %d), lower bound %zu bytes",
             c->name, c->nparams, c->ntickets, c->nslots, c->depth, c->lower_bound);
    return ETP_SUCCESS;
}

etp_status_t etp_chain_finalize(etp_chain_t *c)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_finalize");
    if (c->state != ETP__CHAIN_BUILDING)
        return etp__err(ETP_ERR_INVALID_STATE, "etp_chain_finalize: chain '%s' is %s", c->name,
                        c->state == ETP__CHAIN_RECORDING ? "recording (end it with etp_chain_end_record)"
                                                         : "finalized already");
    ETP__CHECK_ARG(c->nparams > 0, "etp_chain_finalize: chain '%s' has no parameters", c->name);
    ETP__TRY(etp__ctx_usable(c->ctx, "etp_chain_finalize"));
    c->ntickets = 0;
    for (int i = 0; i < c->nparams; i++) ETP__TRY(push_ticket(c, c->params[i], ETP_PASS_FORWARD));
    for (int i = c->nparams - 1; i >= 0; i--) ETP__TRY(push_ticket(c, c->params[i], ETP_PASS_BACKWARD));
    return plan(c);
}

etp_status_t etp_chain_begin_record(etp_chain_t *c)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_begin_record");
    if (c->state != ETP__CHAIN_BUILDING || c->nparams > 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_chain_begin_record: chain '%s' must be new and empty to record", c->name);
    if (c->ctx->recording)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_chain_begin_record: chain '%s' is recording on this context already",
                        c->ctx->recording->name);
    c->state = ETP__CHAIN_RECORDING;
    c->ctx->recording = c;
    return ETP_SUCCESS;
}

etp_status_t etp_chain_end_record(etp_chain_t *c)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_end_record");
    if (c->state != ETP__CHAIN_RECORDING)
        return etp__err(ETP_ERR_INVALID_STATE, "etp_chain_end_record: chain '%s' is not recording",
                        c->name);
    ETP__CHECK_ARG(c->ntickets > 0, "etp_chain_end_record: chain '%s' recorded no gather", c->name);
    for (int t = 0; t < c->ntickets; t++)
        if (c->tickets[t].state == ETP__TICKET_HELD)
            return etp__err(ETP_ERR_INVALID_STATE,
                            "etp_chain_end_record: '%s' %s is gathered and not released",
                            c->tickets[t].param->name, pass_name(c->tickets[t].pass));
    /* The recording slots may still be read or written: finish first. */
    ETP__TRY(etp_stream_synchronize(c->ag));
    ETP__TRY(etp_stream_synchronize(c->rs));
    c->ctx->recording = NULL;
    c->zero_on_join = 0;
    etp_status_t st = plan(c);
    if (st != ETP_SUCCESS) {
        /* plan() freed the recording's slots: the chain stays recording,
         * without slots, and etp_chain_end_record may be called again
         * (etp_gather refuses its recorded tickets meanwhile) */
        for (int t = 0; t < c->ntickets; t++) {
            c->tickets[t].slot = -1;
            c->tickets[t].state = ETP__TICKET_IDLE;
        }
        c->ctx->recording = c;
    }
    return st;
}

static etp_status_t record_slot(etp_chain_t *c, etp__ticket_t *t)
{
    if (gathers_nothing(t->param)) return ETP_SUCCESS; /* slot -1 */
    for (int s = 0; s < c->nslots; s++) {
        int ten = c->slots[s].tenant;
        if (c->slots[s].bytes >= t->bytes && (ten < 0 || c->tickets[ten].state != ETP__TICKET_HELD)) {
            t->slot = s;
            return ETP_SUCCESS;
        }
    }
    etp__slot_t *a = realloc(c->slots, (size_t)(c->nslots + 1) * sizeof *a);
    if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "chain '%s': out of memory", c->name);
    c->slots = a;
    etp__slot_t *s = &c->slots[c->nslots];
    memset(s, 0, sizeof *s);
    s->tenant = -1;
    s->bytes = t->bytes;
    etp_status_t st = etp__mem_alloc_window(c->group, c->ag_role, t->bytes, ETP_MEM_GATHER_SLOTS,
                                            &s->ptr, &s->window);
    if (st == ETP_SUCCESS) st = etp_event_create(c->ctx, &s->ready);
    if (st == ETP_SUCCESS) st = etp_event_create(c->ctx, &s->released);
    if (st != ETP_SUCCESS) {
        if (s->ptr) etp_mem_free(c->ctx, s->ptr);
        if (s->ready) etp_event_destroy(s->ready);
        return st;
    }
    t->slot = c->nslots++;
    return ETP_SUCCESS;
}

/* A gather during recording: a cold gather into a slot of the recording,
 * reusing one whose tenant was released and that is large enough. A
 * failure leaves no ticket behind, so the same gather may be retried. */
etp_status_t etp__chain_record_ticket(etp_chain_t *c, etp_param_t *p, etp_pass_t pass)
{
    if (!p->chain) {
        ETP__TRY(attach(c, p, "etp_gather"));
        /* the step's etp_zero_grad came before it joined */
        if (c->zero_on_join) ETP__TRY(etp__chain_zero_one(c, p));
    }
    if (p->ticket[pass] >= 0)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_gather: '%s' %s was gathered already while chain '%s' recorded; a "
                        "(parameter, pass) appears once in a chain", p->name, pass_name(pass), c->name);
    ETP__TRY(push_ticket(c, p, pass));
    /* the wgrad ring grows here, at the gathers, rather than at a later
     * etp_wgrad_buffer, where an entry may be handed out to another
     * parameter */
    etp_status_t st = record_slot(c, &c->tickets[c->ntickets - 1]);
    if (st == ETP_SUCCESS) st = etp__chain_ensure_workspace(c);
    if (st != ETP_SUCCESS) {
        c->ntickets--;
        p->ticket[pass] = -1;
    }
    return st;
}

etp_status_t etp_chain_streams(etp_chain_t *c, etp_stream_t **ag, etp_stream_t **rs)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_streams");
    if (ag) *ag = c->ag;
    if (rs) *rs = c->rs;
    return ETP_SUCCESS;
}

etp_status_t etp_chain_cache_report(const etp_chain_t *c, etp_cache_report_t *r)
{
    ETP__CHECK_NULL_AS(c, "chain", "etp_chain_cache_report");
    ETP__CHECK_NULL_AS(r, "report", "etp_chain_cache_report");
    etp_cache_report_t out = {sizeof out, c->ntickets, c->nslots, 0, c->lower_bound,
                              c->ring_bytes * (size_t)c->ring_n};
    for (int s = 0; s < c->nslots; s++) out.slot_bytes += c->slots[s].bytes;
    return etp__vs_out(r, &out, &etp__vs_cache_report, "etp_chain_cache_report", "report");
}

void etp__chain_test_skip_edges(etp_chain_t *c, unsigned edges)
{
    c->skip_edges = edges;
}

int etp__chain_test_reuses(const etp_chain_t *c)
{
    return c->reuses;
}

/* ---- gathers ---------------------------------------------------------- */

/* The slot holds ticket u's whole weight as it is now: its last gather
 * was the same parameter's, unquantized, and the parameter has not been
 * updated since. A graphed chain only where the whole step is one graph
 * (graph_whole_step) and the weight was gathered in this step: what a
 * captured region uses is gathered inside it (other captures may cover a
 * pass or a layer). Gathering the weight again would copy the same bytes. */
static int slot_holds(const etp_chain_t *c, const etp__slot_t *s, int u)
{
    const etp_param_t *p = c->tickets[u].param;
    return s->holds == p && p->quant == ETP_PARAM_QUANT_NONE && s->holds_version == p->version &&
           (!c->graphed || (c->whole_step && s->holds_step == c->step));
}

/* Issuing ticket u now (while ticket t is gathered) would overwrite its
 * slot's tenant, held or being gathered, with other data. */
static int would_overwrite(const etp_chain_t *c, int u, int t)
{
    if (c->tickets[u].slot < 0) return 0; /* gathers nothing */
    const etp__slot_t *sl = &c->slots[c->tickets[u].slot];
    const int ten = sl->tenant;
    if (ten < 0 || ten == u || slot_holds(c, sl, u)) return 0;
    return c->tickets[ten].state == ETP__TICKET_HELD || (u != t && ten == t);
}

/* Issue ticket u into its slot on the AG stream. `caller` is the stream of
 * the gather that issues it. */
static etp_status_t issue(etp_chain_t *c, int u, etp_stream_t *caller)
{
    etp__ticket_t *t = &c->tickets[u];
    etp_param_t *p = t->param;
    if (gathers_nothing(p)) {
        t->state = ETP__TICKET_ISSUED;
        t->version = p->version;
        t->reused = 0;
        return ETP_SUCCESS;
    }
    if (t->slot < 0) /* a failed etp_chain_end_record left no slots */
        return etp__err(ETP_ERR_INVALID_STATE,
                        "chain '%s' has no gather slots since its etp_chain_end_record failed; "
                        "call etp_chain_end_record again",
                        c->name);
    etp__slot_t *s = &c->slots[t->slot];
    if (slot_holds(c, s, u)) {
        /* No gather: the slot's ready event already follows the writes of
         * the data, and the gather of u orders its reader after the last
         * reader's release (etp_gather), which a new writer waits for. */
        s->tenant = u;
        t->state = ETP__TICKET_ISSUED;
        t->version = p->version;
        t->reused = 1;
        c->reuses++;
        return ETP_SUCCESS;
    }
    if (s->tenant >= 0 && s->tenant != u && c->tickets[s->tenant].state == ETP__TICKET_HELD) {
        const etp__ticket_t *prev = &c->tickets[s->tenant];
        return etp__err(ETP_ERR_INVALID_STATE,
                        "chain '%s': gathering '%s' %s would overwrite slot %d, which holds '%s' %s "
                        "not yet released (release each gathered weight before the next gather, "
                        "or lower the prefetch depth)",
                        c->name, p->name, pass_name(t->pass), t->slot, prev->param->name,
                        pass_name(prev->pass));
    }
    /* A prefetched tenant nobody gathered (the caller left the planned
     * order) is evicted: its gather will issue it again. */
    if (s->tenant >= 0 && s->tenant != u && c->tickets[s->tenant].state == ETP__TICKET_ISSUED)
        c->tickets[s->tenant].state = ETP__TICKET_IDLE;
    if (c->graphed) {
        /* A graphed chain forks the AG stream from the caller's stream: under
         * a capture that puts the AG work into the graph, and it orders the
         * gather after the shard's writer and the slot's last reader, which
         * a graphed chain requires on the caller's stream (no wait on an
         * event recorded outside the capture). */
        if (!(c->skip_edges & (ETP__EDGE_SLOT_RELEASE | ETP__EDGE_SHARD_WRITER))) {
            ETP__TRY(etp_event_record(c->scratch, caller));
            ETP__TRY(etp_stream_wait_event(c->ag, c->scratch));
        }
    } else {
        if (s->release_recorded && !(c->skip_edges & ETP__EDGE_SLOT_RELEASE))
            ETP__TRY(etp_stream_wait_event(c->ag, s->released));
        if (p->updated_recorded && !(c->skip_edges & ETP__EDGE_SHARD_WRITER))
            ETP__TRY(etp_stream_wait_event(c->ag, p->updated));
    }
    if (p->quant != ETP_PARAM_QUANT_NONE) {
        ETP__TRY(etp__qgather_issue(c, p, t->pass, s->ptr, s->window));
    } else {
        size_t es = etp_dtype_size(p->dtype);
        size_t shard_elems = (size_t)(p->shard_rows * p->cols);
        /* An in-place gather first copies the own shard into the slot. A
         * device-to-device copy runs on the SMs (the copy engines take it
         * only from CUDA 13.1's drivers, with a hint), so on the AG stream
         * (or a graph's AG branch) it waits behind the caller's next GEMM,
         * and the gather starts a GEMM late: on 2 H200s the forward gathers
         * then kept the main stream waiting 1.7 ms a step (docs/PERF.md,
         * lessons). On the caller's stream, before its next kernel, the
         * copy takes its ~40 us of SMs at once and the gather gets the
         * whole GEMM. The caller's stream waits for the slot's last reader
         * and the shard's writer first (a graphed chain's caller is behind
         * both already); the test-only edge switches keep the copy on the
         * AG stream, where only those edges order it. */
        const unsigned order = ETP__EDGE_SLOT_RELEASE | ETP__EDGE_SHARD_WRITER;
        if (s->window && !(c->skip_edges & order)) {
            /* after the slot's last reader's release, which followed its
             * gather; with no release since that gather (issued again into
             * its own slot, or a tenant never gathered: evicted, or left
             * by a forward-only step), after the gather itself */
            if (!c->graphed) {
                if (s->release_recorded) ETP__TRY(etp_stream_wait_event(caller, s->released));
                else if (s->tenant >= 0) ETP__TRY(etp_stream_wait_event(caller, s->ready));
                if (p->updated_recorded) ETP__TRY(etp_stream_wait_event(caller, p->updated));
            }
            ETP__TRY(etp__slot_allgather_copy_on(c->group, c->ag_role, p->shard, shard_elems * es, s->ptr,
                                                 (size_t)(p->padded_rows * p->cols) * es, shard_elems,
                                                 p->dtype, p->experts, caller,
                                                 (c->skip_edges & ETP__EDGE_COPY_HANDOFF) ? NULL : c->scratch,
                                                 c->ag));
        } else {
            ETP__TRY(etp__slot_allgather(c->group, c->ag_role, s->window, p->shard, shard_elems * es,
                                         s->ptr, (size_t)(p->padded_rows * p->cols) * es, shard_elems,
                                         p->dtype, p->experts, c->ag));
        }
    }
    ETP__TRY(etp_event_record(s->ready, c->ag));
    s->tenant = u;
    s->release_recorded = 0;
    s->holds = p->quant == ETP_PARAM_QUANT_NONE ? p : NULL;
    s->holds_version = p->version;
    s->holds_step = c->step;
    t->state = ETP__TICKET_ISSUED;
    t->version = p->version;
    t->reused = 0;
    return ETP_SUCCESS;
}

etp_status_t etp__chain_on_update(etp_param_t *p, etp_stream_t *s)
{
    etp_chain_t *c = p->chain;
    if (!c || !c->prefetch_on_update || c->state != ETP__CHAIN_FINALIZED) return ETP_SUCCESS;
    int t = p->ticket[ETP_PASS_FORWARD];
    if (t < 0 || t >= c->depth) return ETP_SUCCESS; /* not at the head of the chain */
    if (!c->early_step) {
        /* Between steps only: nothing held, nothing issued for this step. */
        for (int i = 0; i < c->ntickets; i++)
            if (c->tickets[i].state == ETP__TICKET_HELD || c->tickets[i].state == ETP__TICKET_ISSUED)
                return ETP_SUCCESS;
        /* The next step begins now, as its first gather would begin it. */
        for (int i = 0; i < c->ntickets; i++) c->tickets[i].state = ETP__TICKET_IDLE;
        c->step++;
        c->early_step = 1;
    }
    /* a captured update's prefetch uses the chain's slots */
    ETP__TRY(etp__capture_note(p->ctx, &c->graph_refs, s));
    /* Issued already (an update before): again, after this update. */
    return issue(c, t, s);
}

static etp_status_t check_use(const etp_param_t *p, etp_pass_t pass, const etp_stream_t *s,
                              const char *fn)
{
    ETP__CHECK_NULL_AS(p, "param", fn);
    ETP__CHECK_NULL_AS(s, "stream", fn);
    ETP__CHECK_ARG(pass == ETP_PASS_FORWARD || pass == ETP_PASS_BACKWARD,
                   "%s: '%s': pass %d (expected ETP_PASS_FORWARD or ETP_PASS_BACKWARD)", fn,
                   p->name, (int)pass);
    ETP__CHECK_ARG(s->ctx == p->ctx, "%s: the stream belongs to another context than '%s'", fn,
                   p->name);
    ETP__TRY(etp__ctx_no_batch(p->ctx, fn));
    return etp__ctx_usable(p->ctx, fn);
}

etp_status_t etp_gather(etp_param_t *p, etp_pass_t pass, etp_stream_t *stream, etp_weight_view_t *view)
{
    const char *fn = "etp_gather";
    ETP__TRY(check_use(p, pass, stream, fn));
    ETP__CHECK_NULL(view, fn);
    ETP__TRY(etp__vs_check(view->size, &etp__vs_weight_view, fn, "view"));
    /* A parameter in no chain joins the one recording on its context. */
    etp_chain_t *c = p->chain ? p->chain : p->ctx->recording;
    if (c) ETP__TRY(etp__capture_note(p->ctx, &c->graph_refs, stream));
    if (c && c->state == ETP__CHAIN_RECORDING && p->ticket[pass] < 0) {
        ETP__TRY(etp__chain_record_ticket(c, p, pass));
    } else if (!c || c->state == ETP__CHAIN_BUILDING || p->ticket[pass] < 0) {
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: '%s' %s is not in a finalized or recording chain", fn, p->name,
                        pass_name(pass));
    }
    int t = p->ticket[pass];
    etp__ticket_t *tk = &c->tickets[t];
    const int direct = gathers_nothing(p);
    if (tk->slot < 0 && !direct)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: chain '%s' has no gather slots since its etp_chain_end_record failed; "
                        "call etp_chain_end_record again", fn, c->name);
    c->early_step = 0; /* the step is under way: updates no longer prefetch */
    if (tk->state == ETP__TICKET_HELD)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: '%s' %s is gathered already and not released",
                        fn, p->name, pass_name(pass));
    if (tk->state == ETP__TICKET_RELEASED) {
        /* A new step (or micro-batch): every ticket of the last must be released. */
        for (int i = 0; i < c->ntickets; i++)
            if (c->tickets[i].state == ETP__TICKET_HELD)
                return etp__err(ETP_ERR_INVALID_STATE,
                                "%s: '%s' %s starts a new step of chain '%s' while '%s' %s is not "
                                "released", fn, p->name, pass_name(pass), c->name,
                                c->tickets[i].param->name, pass_name(c->tickets[i].pass));
        for (int i = 0; i < c->ntickets; i++) c->tickets[i].state = ETP__TICKET_IDLE;
        c->step++;
        if (c->graphed) {
            /* The last step ended with its releases on the caller's stream
             * (a graphed chain's contract), so the events of that step are
             * behind us: waiting on them again would reach outside a capture
             * that starts here. The ring's reductions are behind us only
             * after an etp_wait_grads: between micro-batches (one per
             * gather-cache step) they are not, and their edges stay. */
            if (c->grads_joined)
                for (int k = 0; k < c->ring_n; k++) c->ring_done_recorded[k] = 0;
            for (int i = 0; i < c->nslots; i++) c->slots[i].release_recorded = 0;
        }
    }
    /* Check every gather this call will issue before changing anything, so
     * a refused call leaves the chain as it was. */
    int last = t;
    if (c->state == ETP__CHAIN_FINALIZED)
        for (int k = 1; k <= c->depth && t + k < c->ntickets; k++) {
            if (c->graphed && !c->whole_step && c->tickets[t + k].pass != tk->pass) break;
            last = t + k;
        }
    for (int u = t; u <= last; u++) {
        if (c->tickets[u].state != ETP__TICKET_IDLE || !would_overwrite(c, u, t)) continue;
        const int ten = c->slots[c->tickets[u].slot].tenant;
        /* the planner gave u its weight's slot for the data, which an
         * update has made stale: u is gathered at its own etp_gather */
        if (u != t && c->tickets[ten].param == c->tickets[u].param) continue;
        return etp__err(ETP_ERR_INVALID_STATE,
                        "%s: chain '%s': gathering '%s' %s would overwrite slot %d, which holds "
                        "'%s' %s not yet released (release each gathered weight before the "
                        "next gather, or lower the prefetch depth)",
                        fn, c->name, c->tickets[u].param->name, pass_name(c->tickets[u].pass),
                        c->tickets[u].slot, c->tickets[ten].param->name,
                        pass_name(c->tickets[ten].pass));
    }
    /* a cold start, or a prefetch of a weight updated since it was issued
     * (its gather read the old shard, or raced its writer) */
    if (tk->state == ETP__TICKET_IDLE || (tk->state == ETP__TICKET_ISSUED && tk->version != p->version))
        ETP__TRY(issue(c, t, stream));
    etp__slot_t *s = direct ? NULL : &c->slots[tk->slot];
    if (direct) {
        /* the reader of the shard after its writer (a graphed chain's
         * writer is on the gathering stream already) */
        if (!c->graphed && p->updated_recorded && !(c->skip_edges & ETP__EDGE_SHARD_WRITER))
            ETP__TRY(etp_stream_wait_event(stream, p->updated));
    } else {
        if (!(c->skip_edges & ETP__EDGE_GATHER_READY))
            ETP__TRY(etp_stream_wait_event(stream, s->ready));
        /* data found in the slot: this reader after the slot's last one,
         * whose release the slot's next writer does not wait for (it waits
         * for this ticket's); a graphed chain's caller is behind it already */
        if (tk->reused && !c->graphed && s->release_recorded &&
            !(c->skip_edges & ETP__EDGE_SLOT_RELEASE))
            ETP__TRY(etp_stream_wait_event(stream, s->released));
    }
    tk->state = ETP__TICKET_HELD;
    for (int u = t + 1; u <= last; u++) {
        if (c->tickets[u].state != ETP__TICKET_IDLE || would_overwrite(c, u, t)) continue;
        /* no slot to prefetch into: its own gather says why */
        if (c->tickets[u].slot < 0 && !gathers_nothing(c->tickets[u].param)) continue;
        const etp_status_t st = issue(c, u, stream);
        if (st != ETP_SUCCESS) {
            tk->state = ETP__TICKET_ISSUED; /* no view was handed out: nothing to release */
            return st;
        }
    }
    if (p->quant != ETP_PARAM_QUANT_NONE) {
        etp__qgather_view(p, pass, s->ptr, view);
        return ETP_SUCCESS;
    }
    etp_weight_view_t v = ETP_WEIGHT_VIEW_INIT;
    v.data = direct ? p->shard : s->ptr;
    v.dtype = p->dtype;
    v.experts = p->experts;
    v.rows = p->rows;
    v.cols = p->cols;
    v.ld = p->cols;
    v.expert_stride = p->padded_rows * p->cols;
    etp__vs_put(view, &v);
    return ETP_SUCCESS;
}

etp_status_t etp_release(etp_param_t *p, etp_pass_t pass, etp_stream_t *stream)
{
    const char *fn = "etp_release";
    ETP__TRY(check_use(p, pass, stream, fn));
    etp_chain_t *c = p->chain;
    int t = c ? p->ticket[pass] : -1;
    if (t < 0 || c->tickets[t].state != ETP__TICKET_HELD)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: '%s' %s was not gathered (release without gather)",
                        fn, p->name, pass_name(pass));
    ETP__TRY(etp__capture_note(p->ctx, &c->graph_refs, stream));
    if (c->tickets[t].slot >= 0) {
        etp__slot_t *s = &c->slots[c->tickets[t].slot];
        ETP__TRY(etp_event_record(s->released, stream));
        s->release_recorded = 1;
    }
    c->tickets[t].state = ETP__TICKET_RELEASED;
    return ETP_SUCCESS;
}
