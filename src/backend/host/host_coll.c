/*
 * Host collectives: MPI non-blocking collectives, each preceded by an
 * exchange of fingerprints between every pair of ranks on a separate
 * communicator. The fingerprints say who arrived (named in a timeout) and,
 * under ETP_CHECK_COLLECTIVES, are compared before any data moves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/half.h"
#include "host_internal.h"

enum { FP_TAG = 7, VERDICT_TAG = 8, REFUSAL_TAG = 9 };

static etp_status_t refused_by_peer(etp__host_t *h, etp__hcoll_t *hc);

static MPI_Datatype mpi_type(etp_dtype_t t)
{
    switch (t) {
    case ETP_DTYPE_U8: return MPI_UINT8_T;
    case ETP_DTYPE_I32: return MPI_INT32_T;
    case ETP_DTYPE_I64: return MPI_INT64_T;
    case ETP_DTYPE_F16:
    case ETP_DTYPE_BF16: return MPI_UINT16_T;
    case ETP_DTYPE_F32: return MPI_FLOAT;
    case ETP_DTYPE_F64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(const etp__host_t *h, etp_dtype_t t, etp_redop_t op)
{
    if (t == ETP_DTYPE_F16) return h->half_ops[0][op == ETP_REDOP_MAX];
    if (t == ETP_DTYPE_BF16) return h->half_ops[1][op == ETP_REDOP_MAX];
    return op == ETP_REDOP_MAX ? MPI_MAX : MPI_SUM;
}

/* MPI has no 16-bit floats: reduce them in FP32, one rounding per step. */
#define HALF_OP(name, to_f, from_f, expr)                                           \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)            \
    {                                                                               \
        (void)dt;                                                                   \
        const uint16_t *a = in;                                                     \
        uint16_t *b = inout;                                                        \
        for (int i = 0; i < *len; i++) {                                            \
            float x = to_f(a[i]), y = to_f(b[i]);                                   \
            b[i] = from_f(expr);                                                    \
        }                                                                           \
    }
static float max_nan(float x, float y)
{
    if (x != x) return x;
    if (y != y) return y;
    return x > y ? x : y;
}
HALF_OP(f16_sum, etp__f16_to_f32, etp__f32_to_f16, x + y)
HALF_OP(f16_max, etp__f16_to_f32, etp__f32_to_f16, max_nan(x, y))
HALF_OP(bf16_sum, etp__bf16_to_f32, etp__f32_to_bf16, x + y)
HALF_OP(bf16_max, etp__bf16_to_f32, etp__f32_to_bf16, max_nan(x, y))

etp_status_t etp__hcoll_ops_create(etp__host_t *h)
{
    MPI_User_function *fns[2][2] = {{f16_sum, f16_max}, {bf16_sum, bf16_max}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (MPI_Op_create(fns[i][j], 1, &h->half_ops[i][j]) != MPI_SUCCESS)
                return etp__err(ETP_ERR_BACKEND, "MPI_Op_create failed");
    return ETP_SUCCESS;
}

void etp__hcoll_ops_free(etp__host_t *h)
{
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (h->half_ops[i][j] != MPI_OP_NULL) MPI_Op_free(&h->half_ops[i][j]);
}

static size_t dsize(etp_dtype_t t)
{
    return etp_dtype_size(t);
}

etp_status_t etp__hcoll_new(etp__host_t *h, etp__bcomm_t *c, const etp__coll_t *d,
                            etp__hcoll_t **out)
{
    int n = c->size;
    etp__hcoll_t *hc = calloc(1, sizeof *hc);
    if (!hc) return etp__err(ETP_ERR_OUT_OF_MEMORY, "host collective: out of memory");
    hc->comm = c;
    hc->d = *d;
    snprintf(hc->group_name, sizeof hc->group_name, "%s", d->group_name ? d->group_name : "?");
    hc->d.group_name = hc->group_name;
    hc->data_req = MPI_REQUEST_NULL;
    hc->fp_out = calloc((size_t)n, sizeof *hc->fp_out);
    hc->fp_in = calloc((size_t)n, sizeof *hc->fp_in);
    hc->reqs = malloc(2 * (size_t)n * sizeof(MPI_Request));
    hc->arrived = calloc((size_t)n, sizeof(int));
    hc->verdict_in = calloc((size_t)n, sizeof(int64_t));
    hc->vreqs = malloc(2 * (size_t)n * sizeof(MPI_Request));
    if (!hc->fp_out || !hc->fp_in || !hc->reqs || !hc->arrived || !hc->verdict_in || !hc->vreqs)
        goto oom;
    for (int i = 0; i < 2 * n; i++) hc->reqs[i] = hc->vreqs[i] = MPI_REQUEST_NULL;
    if (d->kind == ETP__COLL_ALLTOALLV) {
        hc->arrays = malloc(4 * (size_t)n * sizeof(size_t));
        if (!hc->arrays) goto oom;
        memcpy(hc->arrays, d->sendcounts, (size_t)n * sizeof(size_t));
        memcpy(hc->arrays + n, d->sdispls, (size_t)n * sizeof(size_t));
        memcpy(hc->arrays + 2 * n, d->recvcounts, (size_t)n * sizeof(size_t));
        memcpy(hc->arrays + 3 * n, d->rdispls, (size_t)n * sizeof(size_t));
        hc->d.sendcounts = hc->arrays;
        hc->d.sdispls = hc->arrays + n;
        hc->d.recvcounts = hc->arrays + 2 * n;
        hc->d.rdispls = hc->arrays + 3 * n;
    }
    for (int p = 0; p < n; p++) etp__fp_make(&hc->d, p, &hc->fp_out[p]);
    (void)h;
    *out = hc;
    return ETP_SUCCESS;
oom:
    etp__hcoll_free(hc);
    return etp__err(ETP_ERR_OUT_OF_MEMORY, "host collective: out of memory");
}

void etp__hcoll_free(etp__hcoll_t *hc)
{
    if (!hc) return;
    free(hc->fp_out);
    free(hc->fp_in);
    free(hc->reqs);
    free(hc->arrived);
    free(hc->verdict_in);
    free(hc->vreqs);
    free(hc->arrays);
    free(hc->tmp);
    free(hc->mpi_counts);
    free(hc);
}

static etp_status_t mpi_fail(const etp__hcoll_t *hc, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return etp__err(ETP_ERR_BACKEND, "%s for %s seq %llu on group '%s' role %d: %s", what,
                    etp__coll_name(hc->d.kind), (unsigned long long)hc->d.seq, hc->group_name,
                    hc->d.role, msg);
}

static etp_status_t start_data(etp__host_t *h, etp__hcoll_t *hc)
{
    const etp__coll_t *d = &hc->d;
    etp__bcomm_t *c = hc->comm;
    MPI_Datatype t = mpi_type(d->dtype);
    size_t es = dsize(d->dtype);
    int rc = MPI_SUCCESS;
    switch (d->kind) {
    case ETP__COLL_ALLGATHER: {
        const void *send = d->send;
        if ((const char *)send == (const char *)d->recv + (size_t)c->rank * d->count * es)
            send = MPI_IN_PLACE;
        rc = MPI_Iallgather(send, (int)d->count, t, d->recv, (int)d->count, t, c->data,
                            &hc->data_req);
        break;
    }
    case ETP__COLL_REDUCE_SCATTER: {
        const void *send = d->send;
        size_t bytes = d->count * (size_t)c->size * es;
        /* MPI's in-place form wants the input in recv; copying keeps it simple. */
        if ((const char *)d->recv < (const char *)send + bytes &&
            (const char *)send < (const char *)d->recv + d->count * es) {
            hc->tmp = malloc(bytes ? bytes : 1);
            if (!hc->tmp) return etp__err(ETP_ERR_OUT_OF_MEMORY, "reduce_scatter staging");
            memcpy(hc->tmp, send, bytes);
            send = hc->tmp;
        }
        rc = MPI_Ireduce_scatter_block(send, d->recv, (int)d->count, t,
                                       mpi_op(h, d->dtype, d->op), c->data, &hc->data_req);
        break;
    }
    case ETP__COLL_ALLREDUCE: {
        const void *send = d->send == d->recv ? MPI_IN_PLACE : d->send;
        rc = MPI_Iallreduce(send, d->recv, (int)d->count, t, mpi_op(h, d->dtype, d->op),
                            c->data, &hc->data_req);
        break;
    }
    case ETP__COLL_ALLTOALLV: {
        int n = c->size;
        /* MPI may read the int arrays until completion: they live in hc. */
        int *ints = hc->mpi_counts = malloc(4 * (size_t)n * sizeof(int));
        if (!ints) return etp__err(ETP_ERR_OUT_OF_MEMORY, "alltoallv counts");
        for (int i = 0; i < 4 * n; i++) ints[i] = (int)hc->arrays[i];
        rc = MPI_Ialltoallv(d->send, ints, ints + n, t, d->recv, ints + 2 * n, ints + 3 * n, t,
                            c->data, &hc->data_req);
        break;
    }
    }
    if (rc != MPI_SUCCESS) return mpi_fail(hc, "starting the MPI collective", rc);
    hc->data_started = 1;
    return ETP_SUCCESS;
}

etp_status_t etp__hcoll_start(etp__host_t *h, etp__hcoll_t *hc)
{
    etp__bcomm_t *c = hc->comm;
    int n = c->size;
    hc->t_start = etp__now_s();
    /* a peer that refused it already: fail before anything is posted */
    ETP__TRY(refused_by_peer(h, hc));
    for (int p = 0; p < n; p++) {
        if (p == c->rank) {
            hc->fp_in[p] = hc->fp_out[p];
            hc->arrived[p] = 1;
            continue;
        }
        int rc = MPI_Irecv(&hc->fp_in[p], ETP__FP_WORDS, MPI_INT64_T, p, FP_TAG, c->ctrl,
                           &hc->reqs[n + p]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(&hc->fp_out[p], ETP__FP_WORDS, MPI_INT64_T, p, FP_TAG, c->ctrl,
                           &hc->reqs[p]);
        if (rc != MPI_SUCCESS) return mpi_fail(hc, "posting the fingerprint exchange", rc);
    }
    ETP__LOG(h->base.log, ETP_LOG_TRACE, ETP_SUBSYS_COMM, "start %s seq %llu group '%s' role %d count %zu",
             etp__coll_name(hc->d.kind), (unsigned long long)hc->d.seq, hc->group_name, hc->d.role,
             hc->d.count);
    /* Without the check, data moves at once; the fingerprints only tell who
     * arrived. With it, data waits for the comparison. */
    if (!h->base.cfg.check_collectives) return start_data(h, hc);
    return ETP_SUCCESS;
}

/* Compare each peer's fingerprint with what this rank expects of it. */
static etp_status_t compare(const etp__hcoll_t *hc, int *bad_peer)
{
    const etp__bcomm_t *c = hc->comm;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        etp_status_t st = etp__fp_check(&hc->d, c->rank, p, &hc->fp_in[p]);
        if (st != ETP_SUCCESS) {
            *bad_peer = p;
            return st;
        }
    }
    return ETP_SUCCESS;
}

static etp_status_t timeout_error(etp__host_t *h, const etp__hcoll_t *hc, double waited)
{
    const etp__bcomm_t *c = hc->comm;
    char missing[256] = "";
    size_t len = 0;
    int nmissing = 0;
    for (int p = 0; p < c->size && len < sizeof missing - 16; p++) {
        if (hc->arrived[p]) continue;
        len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", nmissing ? ", " : "", p);
        nmissing++;
    }
    if (nmissing)
        return etp__err(ETP_ERR_TIMEOUT,
                        "timeout after %.1f s in %s seq %llu on group '%s' role %d (rank %d of %d): "
                        "rank%s %s of the group did not arrive; context aborted",
                        waited, etp__coll_name(hc->d.kind), (unsigned long long)hc->d.seq,
                        hc->group_name, hc->d.role, c->rank, c->size, nmissing > 1 ? "s" : "",
                        missing);
    return etp__err(ETP_ERR_TIMEOUT,
                    "timeout after %.1f s in %s seq %llu on group '%s' role %d (rank %d of %d): "
                    "all ranks arrived but the collective did not complete; context aborted",
                    waited, etp__coll_name(hc->d.kind), (unsigned long long)hc->d.seq,
                    hc->group_name, hc->d.role, c->rank, c->size);
}

static etp_status_t test_all(etp__hcoll_t *hc, MPI_Request *reqs, int *all_done, const char *what)
{
    int n = hc->comm->size, all = 1;
    for (int i = 0; i < 2 * n; i++) {
        if (reqs[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        int rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(hc, what, rc);
        all &= flag;
    }
    *all_done = all;
    return ETP_SUCCESS;
}

static etp_status_t post_verdicts(etp__hcoll_t *hc, int bad_peer)
{
    etp__bcomm_t *c = hc->comm;
    int n = c->size;
    hc->verdict_out = bad_peer;
    for (int p = 0; p < n; p++) {
        if (p == c->rank) {
            hc->verdict_in[p] = bad_peer;
            continue;
        }
        int rc = MPI_Irecv(&hc->verdict_in[p], 1, MPI_INT64_T, p, VERDICT_TAG, c->ctrl,
                           &hc->vreqs[n + p]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(&hc->verdict_out, 1, MPI_INT64_T, p, VERDICT_TAG, c->ctrl, &hc->vreqs[p]);
        if (rc != MPI_SUCCESS) return mpi_fail(hc, "posting the verdict exchange", rc);
    }
    hc->verdict_posted = 1;
    return ETP_SUCCESS;
}

/* Every verdict is in: this rank's own mismatch first, else a peer's. */
static etp_status_t judge(const etp__hcoll_t *hc)
{
    if (hc->mismatch != ETP_SUCCESS) return etp__err(hc->mismatch, "%s", hc->mismatch_msg);
    for (int p = 0; p < hc->comm->size; p++)
        if (hc->verdict_in[p] >= 0)
            return etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                            "collective mismatch on group '%s' role %d seq %llu (%s): rank %d found "
                            "that rank %lld issued a different collective (see rank %d's error)",
                            hc->group_name, hc->d.role, (unsigned long long)hc->d.seq,
                            etp__coll_name(hc->d.kind), p, (long long)hc->verdict_in[p], p);
    return ETP_SUCCESS;
}

etp_status_t etp__hcoll_progress(etp__host_t *h, etp__hcoll_t *hc, int *done)
{
    etp__bcomm_t *c = hc->comm;
    int n = c->size;
    *done = 0;
    if (!hc->data_done) ETP__TRY(refused_by_peer(h, hc));
    if (!hc->ctrl_done) {
        int all = 1;
        for (int i = 0; i < 2 * n; i++) {
            if (hc->reqs[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            int rc = MPI_Test(&hc->reqs[i], &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_fail(hc, "exchanging fingerprints", rc);
            if (flag && i >= n) hc->arrived[i - n] = 1;
            if (!flag) all = 0;
        }
        hc->ctrl_done = all;
    }
    if (hc->ctrl_done && !hc->checked) {
        hc->checked = 1;
        int bad_peer = -1;
        hc->mismatch = compare(hc, &bad_peer);
        if (hc->mismatch != ETP_SUCCESS)
            snprintf(hc->mismatch_msg, sizeof hc->mismatch_msg, "%s", etp_last_error());
        /* Without the check the data may already be moving: a mismatch is
         * still better named than left to MPI. */
        if (!h->base.cfg.check_collectives && hc->mismatch != ETP_SUCCESS) return hc->mismatch;
        if (h->base.cfg.check_collectives) ETP__TRY(post_verdicts(hc, bad_peer));
    }
    if (hc->verdict_posted && !hc->verdict_done) {
        ETP__TRY(test_all(hc, hc->vreqs, &hc->verdict_done, "exchanging verdicts"));
        if (hc->verdict_done) ETP__TRY(judge(hc));
        if (hc->verdict_done && !hc->data_started) ETP__TRY(start_data(h, hc));
    }
    if (hc->data_started && !hc->data_done) {
        int flag = 0;
        int rc = MPI_Test(&hc->data_req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(hc, "completing the MPI collective", rc);
        hc->data_done = flag;
    }
    if (hc->ctrl_done && hc->data_done) {
        *done = 1;
        return ETP_SUCCESS;
    }
    double waited = etp__now_s() - hc->t_start;
    if (h->base.cfg.timeout_s > 0 && waited > h->base.cfg.timeout_s)
        return timeout_error(h, hc, waited);
    return ETP_SUCCESS;
}

/* ---- refusals ------------------------------------------------------------
 * A rank that refused a call which would have issued collectives on a group
 * sends every peer, on each of the group's control communicators, the first
 * sequence number it will not join there (tag REFUSAL_TAG: never matched
 * by a fingerprint). A peer's collective from that number on fails at once,
 * naming the rank and the call, and answers that it went on, which is how
 * the refusing rank learns that its group is broken; a peer that refused
 * alike sends the same record, and the group stays in step. */

/* One peer's refusals not settled yet. */
struct etp__hrefs {
    etp__refusal_t *r;
    int n, cap;
};

/* A record being sent: its buffer lives until every send completed. */
struct etp__hsend {
    struct etp__hsend *next;
    int n;
    etp__refusal_t rec;
    MPI_Request reqs[];
};

static void reap_sends(etp__bcomm_t *c)
{
    for (struct etp__hsend **pp = &c->sends; *pp;) {
        struct etp__hsend *q = *pp;
        int flag = 0;
        if (MPI_Testall(q->n, q->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) flag = 0;
        if (flag) {
            *pp = q->next;
            free(q);
        } else {
            pp = &q->next;
        }
    }
}

/* Send rec to `to`, or to every peer for -1. */
static etp_status_t send_refusal(etp__bcomm_t *c, const etp__refusal_t *rec, int to)
{
    reap_sends(c);
    int n = c->size;
    struct etp__hsend *q = calloc(1, sizeof *q + (size_t)n * sizeof(MPI_Request));
    if (!q) return etp__err(ETP_ERR_OUT_OF_MEMORY, "refusal record: out of memory");
    q->rec = *rec;
    q->n = n;
    int rc = MPI_SUCCESS;
    for (int p = 0; p < n; p++) {
        q->reqs[p] = MPI_REQUEST_NULL;
        if (p == c->rank || (to >= 0 && p != to) || rc != MPI_SUCCESS) continue;
        rc = MPI_Isend(&q->rec, (int)sizeof q->rec, MPI_BYTE, p, REFUSAL_TAG, c->ctrl, &q->reqs[p]);
    }
    q->next = c->sends;
    c->sends = q;
    if (rc != MPI_SUCCESS) return etp__err(ETP_ERR_BACKEND, "sending a refusal record failed (MPI %d)", rc);
    return ETP_SUCCESS;
}

/* Take in every refusal record that has arrived. */
static etp_status_t refusals_in(etp__bcomm_t *c)
{
    int n = c->size;
    if (!c->peer_ref) {
        c->peer_ref = calloc((size_t)n, sizeof *c->peer_ref);
        c->peer_ans = calloc((size_t)n, sizeof *c->peer_ans);
        c->answered = calloc((size_t)n, sizeof *c->answered);
        if (!c->peer_ref || !c->peer_ans || !c->answered)
            return etp__err(ETP_ERR_OUT_OF_MEMORY, "refusal records: out of memory");
    }
    for (;;) {
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Iprobe(MPI_ANY_SOURCE, REFUSAL_TAG, c->ctrl, &flag, &st);
        if (rc != MPI_SUCCESS)
            return etp__err(ETP_ERR_BACKEND, "probing for refusal records failed (MPI %d)", rc);
        if (!flag) return ETP_SUCCESS;
        etp__refusal_t r;
        rc = MPI_Recv(&r, (int)sizeof r, MPI_BYTE, st.MPI_SOURCE, REFUSAL_TAG, c->ctrl,
                      MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return etp__err(ETP_ERR_BACKEND, "receiving a refusal record failed (MPI %d)", rc);
        if (r.magic != ETP__REFUSAL_MAGIC) continue;
        r.call[sizeof r.call - 1] = '\0';
        r.msg[sizeof r.msg - 1] = '\0';
        if (r.kind == ETP__REFUSAL_WENT_ON) {
            c->peer_ans[st.MPI_SOURCE] = r;
            continue;
        }
        if (r.kind != ETP__REFUSAL_REFUSED) continue;
        struct etp__hrefs *h = &c->peer_ref[st.MPI_SOURCE];
        if (h->n && h->r[h->n - 1].seq == r.seq) {
            h->r[h->n - 1] = r; /* a later count at the same point */
            continue;
        }
        if (h->n == h->cap) {
            int cap = h->cap ? 2 * h->cap : 4;
            etp__refusal_t *a = realloc(h->r, (size_t)cap * sizeof *a);
            if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "refusal records: out of memory");
            h->r = a;
            h->cap = cap;
        }
        h->r[h->n++] = r;
    }
}

/* hc waits for a peer that refused a call and will not join it: fail, and
 * tell that peer this rank went on. */
static etp_status_t refused_by_peer(etp__host_t *h, etp__hcoll_t *hc)
{
    etp__bcomm_t *c = hc->comm;
    ETP__TRY(refusals_in(c));
    for (int p = 0; p < c->size; p++) {
        /* the peer's earliest refusal not settled: it joins nothing from there */
        if (p == c->rank || c->peer_ref[p].n == 0) continue;
        const etp__refusal_t *r = &c->peer_ref[p].r[0];
        if ((uint64_t)r->seq > hc->d.seq) continue;
        if (!c->answered[p]) {
            etp__refusal_t a = {.magic = ETP__REFUSAL_MAGIC, .kind = ETP__REFUSAL_WENT_ON,
                                .seq = (int64_t)hc->d.seq, .world_rank = h->base.rank};
            snprintf(a.call, sizeof a.call, "%s", etp__coll_name(hc->d.kind));
            snprintf(a.msg, sizeof a.msg, "rank %d of group '%s' issued %s seq %llu on role %d",
                     c->rank, hc->group_name, etp__coll_name(hc->d.kind),
                     (unsigned long long)hc->d.seq, hc->d.role);
            c->answered[p] = 1;
            ETP__TRY(send_refusal(c, &a, p));
        }
        return etp__err(ETP_ERR_COLLECTIVE_MISMATCH,
                        "rank %d of group '%s' (world rank %lld) refused %s and will not join %s "
                        "seq %llu on role %d, which this rank (%d) issued: %s",
                        p, hc->group_name, (long long)r->world_rank, r->call,
                        etp__coll_name(hc->d.kind), (unsigned long long)hc->d.seq, hc->d.role,
                        c->rank, r->msg);
    }
    return ETP_SUCCESS;
}

etp_status_t etp__hcomm_refuse(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *rec)
{
    (void)be;
    ETP__TRY(refusals_in(c));
    return send_refusal(c, rec, -1);
}

etp_status_t etp__hcomm_refusal_poll(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *mine,
                                     int *verdict, char *why, size_t why_bytes)
{
    (void)be;
    ETP__TRY(refusals_in(c));
    int alike = 1;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        const etp__refusal_t *a = &c->peer_ans[p];
        if (a->magic) {
            snprintf(why, why_bytes, "%s", a->msg);
            *verdict = -1;
            return ETP_SUCCESS;
        }
        const struct etp__hrefs *h = &c->peer_ref[p];
        const etp__refusal_t *at = NULL;
        int past = 0; /* the peer refused later: it went through this point */
        for (int i = 0; i < h->n; i++) {
            const etp__refusal_t *r = &h->r[i];
            if (r->seq < mine->seq) {
                snprintf(why, why_bytes,
                         "rank %d refused %s before seq %lld, where this rank went on", p, r->call,
                         (long long)r->seq);
                *verdict = -1;
                return ETP_SUCCESS;
            }
            if (r->seq == mine->seq) at = r;
            past |= r->seq > mine->seq;
        }
        const int64_t theirs = at ? at->count : -1;
        /* out of step: more refusals here than this rank, fewer and done
         * with this point, or past it without refusing here */
        const int out = at ? theirs > mine->count || (theirs < mine->count && past) : past;
        if (out) {
            if (at)
                snprintf(why, why_bytes,
                         "rank %d refused otherwise before seq %lld (%lld refusal(s) in all, this "
                         "rank %lld; its last: %s)", p, (long long)mine->seq, (long long)theirs,
                         (long long)mine->count, at->call);
            else
                snprintf(why, why_bytes, "rank %d went past seq %lld without refusing there", p,
                         (long long)mine->seq);
            *verdict = -1;
            return ETP_SUCCESS;
        }
        alike &= theirs == mine->count;
    }
    *verdict = alike;
    /* in step: the records up to this point are spent */
    if (alike)
        for (int p = 0; p < c->size; p++) {
            struct etp__hrefs *h = &c->peer_ref[p];
            int keep = 0;
            for (int i = 0; i < h->n; i++)
                if (h->r[i].seq > mine->seq) h->r[keep++] = h->r[i];
            h->n = keep;
        }
    return ETP_SUCCESS;
}

void etp__hcomm_refusals_free(etp__bcomm_t *c)
{
    /* a record the peer took completes at the next progress; one still
     * pending after a short while has a peer that never takes it: its
     * buffer stays (MPI may still read it) */
    const double t0 = etp__now_s();
    for (reap_sends(c); c->sends && etp__now_s() - t0 < 2.0; reap_sends(c)) etp__sleep_us(200);
    c->sends = NULL;
    for (int p = 0; c->peer_ref && p < c->size; p++) free(c->peer_ref[p].r);
    free(c->peer_ref);
    free(c->peer_ans);
    free(c->answered);
}

void etp__hcoll_zombify(etp__hcoll_t *hc)
{
    hc->next = hc->comm->zombies;
    hc->comm->zombies = hc;
}

static int zombie_live(etp__hcoll_t *z)
{
    int n = z->comm->size, live = 0;
    for (int i = 0; i < 2 * n; i++) {
        int flag = 1;
        if (z->reqs[i] != MPI_REQUEST_NULL) MPI_Test(&z->reqs[i], &flag, MPI_STATUS_IGNORE);
        live |= !flag;
    }
    for (int i = 0; i < 2 * n; i++) {
        int flag = 1;
        if (z->vreqs[i] != MPI_REQUEST_NULL) MPI_Test(&z->vreqs[i], &flag, MPI_STATUS_IGNORE);
        live |= !flag;
    }
    if (z->data_started) {
        int flag = 1;
        if (z->data_req != MPI_REQUEST_NULL) MPI_Test(&z->data_req, &flag, MPI_STATUS_IGNORE);
        live |= !flag;
    }
    return live;
}

int etp__hcomm_drain(etp__host_t *h, etp__bcomm_t *c)
{
    double t0 = etp__now_s();
    double limit = h->base.cfg.timeout_s > 0 ? h->base.cfg.timeout_s : 10.0;
    while (c->zombies) {
        int live = 0;
        for (etp__hcoll_t *z = c->zombies; z; z = z->next) live |= zombie_live(z);
        if (!live) break;
        if (etp__now_s() - t0 > limit) {
            /* MPI cannot cancel a collective: its buffers must stay allocated. */
            ETP__LOG(h->base.log, ETP_LOG_WARN, ETP_SUBSYS_COMM,
                     "abandoning collectives that peers never joined; their requests leak");
            c->zombies = NULL;
            return 1;
        }
        etp__sleep_us(200);
    }
    while (c->zombies) {
        etp__hcoll_t *z = c->zombies;
        c->zombies = z->next;
        etp__hcoll_free(z);
    }
    return 0;
}
