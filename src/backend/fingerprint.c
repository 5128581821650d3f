/*
 * Collective fingerprints: the one record format and the one comparison
 * both backends use (ETP_CHECK_COLLECTIVES, and the host's arrival notes).
 * A backend only moves the records: each rank sends every peer the record
 * made for it and compares the one it gets back.
 */
#include <stdio.h>

#include "backend.h"

_Static_assert(sizeof(etp__fp_t) == ETP__FP_WORDS * sizeof(int64_t),
               "a fingerprint travels as ETP__FP_WORDS int64 words, without padding");

static int is_reduction(int64_t kind)
{
    return kind == ETP__COLL_REDUCE_SCATTER || kind == ETP__COLL_ALLREDUCE;
}

static const char *redop_name(int64_t op)
{
    switch (op) {
    case ETP_REDOP_SUM: return "sum";
    case ETP_REDOP_MAX: return "max";
    default: return "invalid";
    }
}

/* The record as this rank would send it to `peer`, with the count taken
 * from `counts` for an all-to-all-v (sendcounts to make one, recvcounts
 * for what the peer's should say). */
static void fill(const etp__coll_t *op, const size_t *counts, int peer, etp__fp_t *fp)
{
    fp->magic = ETP__FP_MAGIC;
    fp->seq = (int64_t)op->seq;
    fp->role = op->role;
    fp->kind = op->kind;
    fp->count = (int64_t)(op->kind == ETP__COLL_ALLTOALLV ? counts[peer] : op->count);
    fp->dtype = op->dtype;
    fp->redop = is_reduction(op->kind) ? (int64_t)op->op : -1;
    fp->root = -1; /* no rooted collective yet */
}

void etp__fp_make(const etp__coll_t *op, int peer, etp__fp_t *fp)
{
    fill(op, op->sendcounts, peer, fp);
}

/* "allgather count 4 dtype f32", plus the reduction, and the sequence
 * number and role where they differ from the other side's. */
static void describe(char *buf, size_t n, const etp__fp_t *f, const etp__fp_t *other)
{
    int k = snprintf(buf, n, "%s count %lld dtype %s", etp__coll_name((etp__coll_kind_t)f->kind),
                     (long long)f->count, etp_dtype_name((etp_dtype_t)f->dtype));
    if (k >= 0 && (size_t)k < n && is_reduction(f->kind))
        k += snprintf(buf + k, n - (size_t)k, " op %s", redop_name(f->redop));
    if (k >= 0 && (size_t)k < n && f->root != other->root)
        k += snprintf(buf + k, n - (size_t)k, " root %lld", (long long)f->root);
    if (k >= 0 && (size_t)k < n && f->seq != other->seq)
        k += snprintf(buf + k, n - (size_t)k, " seq %lld", (long long)f->seq);
    if (k >= 0 && (size_t)k < n && f->role != other->role)
        snprintf(buf + k, n - (size_t)k, " role %lld", (long long)f->role);
}

/* "count and dtype": the fields in which a and b differ. */
static void differences(char *buf, size_t n, const etp__fp_t *a, const etp__fp_t *b)
{
    const struct {
        const char *name;
        int differs;
    } fields[] = {
        {"operation", a->kind != b->kind}, {"count", a->count != b->count},
        {"dtype", a->dtype != b->dtype},   {"reduction", a->redop != b->redop},
        {"root", a->root != b->root},      {"sequence number", a->seq != b->seq},
        {"role", a->role != b->role},
    };
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof fields / sizeof fields[0] && k < n; i++) {
        if (!fields[i].differs) continue;
        int m = snprintf(buf + k, n - k, "%s%s", k ? ", " : "", fields[i].name);
        if (m < 0) break;
        k += (size_t)m;
    }
}

etp_status_t etp__fp_check(const etp__coll_t *op, int me, int peer, const etp__fp_t *theirs)
{
    const char *group = op->group_name ? op->group_name : "?";
    if (theirs->magic != ETP__FP_MAGIC)
        return etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                        "collective mismatch on group '%s' role %d seq %llu: rank %d sent rank %d "
                        "no etp fingerprint (word 0x%llx) before %s",
                        group, op->role, (unsigned long long)op->seq, peer, me,
                        (unsigned long long)theirs->magic, etp__coll_name(op->kind));
    etp__fp_t mine;
    fill(op, op->recvcounts, peer, &mine);
    if (mine.seq == theirs->seq && mine.role == theirs->role && mine.kind == theirs->kind &&
        mine.count == theirs->count && mine.dtype == theirs->dtype && mine.redop == theirs->redop &&
        mine.root == theirs->root)
        return ETP_SUCCESS;
    char mine_s[192], theirs_s[192], what[96];
    if (mine.kind == ETP__COLL_ALLTOALLV && theirs->kind == ETP__COLL_ALLTOALLV &&
        mine.seq == theirs->seq && mine.role == theirs->role && mine.dtype == theirs->dtype) {
        /* counts differ between this pair only: say which direction */
        snprintf(mine_s, sizeof mine_s, "alltoallv expecting count %lld from rank %d",
                 (long long)mine.count, peer);
        snprintf(theirs_s, sizeof theirs_s, "alltoallv sending count %lld to rank %d",
                 (long long)theirs->count, me);
    } else {
        describe(mine_s, sizeof mine_s, &mine, theirs);
        describe(theirs_s, sizeof theirs_s, theirs, &mine);
    }
    differences(what, sizeof what, &mine, theirs);
    /* the lower rank first, so that both ranks of a pair say the same */
    const int lo = me < peer ? me : peer, hi = me < peer ? peer : me;
    return etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                    "collective mismatch on group '%s' role %d seq %llu: rank %d issued %s, rank %d "
                    "issued %s (they differ in %s)",
                    group, op->role, (unsigned long long)op->seq, lo, me < peer ? mine_s : theirs_s,
                    hi, me < peer ? theirs_s : mine_s, what);
}
