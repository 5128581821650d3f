/*
 * Refused collective calls. A call refused on one rank only leaves its
 * peers in a collective this rank never joins; refused on every rank alike,
 * the group is still in step. A rank cannot tell the two apart alone, so a
 * refusal is recorded on the group and the peers are told (the backend's
 * refuse op); the group's next collective on this rank waits for the
 * peers' answers: all refused alike (the group goes on), or one went on
 * (the group is broken on this rank, and every later collective on it fails
 * at once quoting the refusal). A backend with no channel to tell the peers
 * (cuda) cannot learn which it was: breaking the group there would break
 * every program that refuses a call alike on every rank (a bad argument
 * that every rank computes the same way), so it keeps the group in step,
 * says on the warning log which call this rank refused, and leaves a
 * one-rank refusal to the peers' timeout (which names the group, role,
 * operation and sequence number) or, with collective checking on, to the
 * next collective's fingerprint comparison.
 */
#include <stdio.h>
#include <string.h>

#include "comm_internal.h"

/* Copy a message, cut to fit (messages quote messages). */
static void copy_msg(char *dst, size_t n, const char *src)
{
    size_t k = strnlen(src, n - 1);
    memcpy(dst, src, k);
    dst[k] = '\0';
}

static void set_broken(etp_group_t *g, const char *why)
{
    etp__group_refusals_t *r = &g->refusals;
    r->state = ETP__GROUP_BROKEN;
    if (snprintf(r->broken, sizeof r->broken,
             "group '%s' is broken on this rank (rank %d of %d): %s was refused here (%s), and %s",
             g->name, g->rank, g->size, r->call, r->msg, why) < 0)
        r->broken[0] = '\0'; /* longer messages are cut to the buffer */
    ETP__LOG(&g->ctx->log, ETP_LOG_WARN, ETP_SUBSYS_COMM, "%s", r->broken);
}

etp_status_t etp__group_refused(etp_group_t *g, etp_status_t status, const char *fn)
{
    if (!g || status == ETP_SUCCESS) return status;
    etp__be_t *be = g->ctx->be;
    etp__group_refusals_t *r = &g->refusals;
    if (be->failed || g->size < 2 || r->state == ETP__GROUP_BROKEN) return status;
    char msg[ETP__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", etp_last_error());
    if (r->state == ETP__GROUP_IN_STEP) {
        copy_msg(r->call, sizeof r->call, fn);
        copy_msg(r->msg, sizeof r->msg, msg);
    }
    r->count++;
    if (!be->ops->refuse) {
        ETP__LOG(&g->ctx->log, ETP_LOG_WARN, ETP_SUBSYS_COMM,
                 "group '%s' (rank %d of %d): %s was refused on this rank (%s); if a peer did not "
                 "refuse it alike, that peer waits for this rank until its timeout",
                 g->name, g->rank, g->size, fn, msg);
    } else {
        r->state = ETP__GROUP_REFUSED;
        ETP__LOG(&g->ctx->log, ETP_LOG_INFO, ETP_SUBSYS_COMM,
                 "group '%s': %s refused on this rank (refusal %lld); telling the peers", g->name,
                 fn, (long long)r->count);
        for (int k = 0; k < g->num_roles; k++) {
            etp__refusal_t rec = {.magic = ETP__REFUSAL_MAGIC, .kind = ETP__REFUSAL_REFUSED,
                                  .seq = (int64_t)(g->seq[k] + 1), .count = r->count,
                                  .world_rank = be->rank};
            copy_msg(rec.call, sizeof rec.call, fn);
            copy_msg(rec.msg, sizeof rec.msg, msg);
            r->seq[k] = g->seq[k] + 1;
            r->alike[k] = 0;
            if (be->ops->refuse(be, g->comms[k], &rec) != ETP_SUCCESS) {
                char why[ETP__ERRMSG_MAX];
                snprintf(why, sizeof why, "telling the peers failed: %s", etp_last_error());
                set_broken(g, why);
                break;
            }
        }
    }
    /* the caller's message, not what the bookkeeping above may have left */
    return etp__err(status, "%s", msg);
}

/* One look at the peers' answers, on every role not settled yet. */
static void poll_peers(etp_group_t *g)
{
    etp__be_t *be = g->ctx->be;
    etp__group_refusals_t *r = &g->refusals;
    int all = 1;
    for (int k = 0; k < g->num_roles && r->state == ETP__GROUP_REFUSED; k++) {
        if (r->alike[k]) continue;
        etp__refusal_t mine = {.magic = ETP__REFUSAL_MAGIC, .kind = ETP__REFUSAL_REFUSED,
                               .seq = (int64_t)r->seq[k], .count = r->count};
        int verdict = 0;
        char why[ETP__ERRMSG_MAX] = "";
        if (be->ops->refusal_poll(be, g->comms[k], &mine, &verdict, why, sizeof why) !=
            ETP_SUCCESS) {
            snprintf(why, sizeof why, "asking the peers failed: %s", etp_last_error());
            verdict = -1;
        }
        if (verdict < 0) {
            char because[ETP__ERRMSG_MAX + 32];
            snprintf(because, sizeof because, "a peer went on: %s", why);
            set_broken(g, because);
            return;
        }
        r->alike[k] = verdict > 0;
        all &= r->alike[k];
    }
    if (r->state == ETP__GROUP_REFUSED && all) {
        r->state = ETP__GROUP_IN_STEP;
        ETP__LOG(&g->ctx->log, ETP_LOG_INFO, ETP_SUBSYS_COMM,
                 "group '%s': every rank refused %s alike; the group is in step", g->name, r->call);
    }
}

etp_status_t etp__group_ready(etp_group_t *g, int blocking, const char *fn)
{
    etp__group_refusals_t *r = &g->refusals;
    if (r->state == ETP__GROUP_REFUSED) {
        const double limit = g->ctx->be->cfg.timeout_s, t0 = etp__now_s();
        for (;;) {
            poll_peers(g);
            if (r->state != ETP__GROUP_REFUSED || !blocking) break;
            if (limit > 0 && etp__now_s() - t0 > limit) {
                char why[96];
                snprintf(why, sizeof why,
                         "not every peer said within %.1f s whether it refused alike", limit);
                set_broken(g, why);
                break;
            }
            etp__sleep_us(200);
        }
    }
    if (r->state == ETP__GROUP_BROKEN)
        return etp__err(ETP_ERR_INVALID_STATE, "%s: %s", fn, r->broken);
    return ETP_SUCCESS;
}

etp__refusal_guard_t etp__refusal_guard(etp_group_t *group)
{
    etp__refusal_guard_t gd = {group, group ? group->refusals.count : 0};
    return gd;
}

etp_status_t etp__refusal_guard_end(etp__refusal_guard_t gd, etp_status_t status, const char *fn)
{
    if (status == ETP_SUCCESS || !gd.group || gd.group->refusals.count != gd.count) return status;
    return etp__group_refused(gd.group, status, fn);
}
