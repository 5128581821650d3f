/*
 * The CUDA backend's communicators: bootstrap of the world communicator
 * (from a unique id, MPI or a user's NCCL communicator), splits, the
 * fast-launch twins, abort on failure, and release.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

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
        return etp__cuda_error("fast-launch warm-up", e);
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

void etp__cuda_abort_all(etp__cuda_t *cb)
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
    cb->num_ce = 0; /* a batch's held-back collectives: never issued */
    etp__cuda_abort_all(cb);
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

/* Finalize (bounded) and destroy the given communicators together, so that
 * ranks that release them in different orders cannot deadlock; abort the
 * ones that are failed, or do not finalize in time. */
void etp__cuda_release_comms(etp__cuda_t *cb, etp__bcomm_t **cs, size_t n)
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

/* ---- ops: communicators ------------------------------------------------- */

int etp__cuda_comm_rank(const etp__bcomm_t *c)
{
    return c->rank;
}

int etp__cuda_comm_size(const etp__bcomm_t *c)
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

etp_status_t etp__cuda_comm_split(etp__be_t *be, etp__bcomm_t *parent, int color, int key,
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

void etp__cuda_comm_destroy(etp__be_t *be, etp__bcomm_t *c)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (c == NULL) return;
    (void)cudaSetDevice(cb->device);
    etp__cuda_release_comms(cb, &c, 1);
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
    ETP__TRY(etp__cuda_pick_device(cfg, rank, &device));
    etp__cuda_t *cb = NULL;
    ETP__TRY(etp__cuda_be_new(cfg, log, rank, size, device, &cb));
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
    ETP__TRY(etp__cuda_be_new(cfg, log, rank, size, dev, &cb));
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
