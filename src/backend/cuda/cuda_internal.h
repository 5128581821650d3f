/*
 * The CUDA backend: CUDA runtime streams, events and memory; NCCL
 * communicators for the collectives; the kernels of kernels/.
 *
 * Files: cuda_backend.c (the ops table, the device, the backend object,
 * memory, copies), cuda_comm.c (bootstrap, communicator split and release,
 * fast-launch twins, abort), cuda_stream.c (streams, events, host waits and
 * their timeouts), cuda_graph.c (graph capture), cuda_coll.c (the
 * collectives, fingerprints, batches, and the per-communicator ring of
 * issued collectives that timeouts are reported from), cuda_window.c
 * (symmetric windows, copy-engine all-gathers).
 *
 * Every NCCL communicator etp creates is non-blocking (ncclConfig_t.blocking =
 * 0): an NCCL call may return ncclInProgress and finish in an NCCL thread, so
 * every such call is followed by a bounded poll of ncclCommGetAsyncError.
 * That keeps creation and splits under the context's timeout, and lets a hung
 * communicator be aborted from the thread that noticed. Because every launch
 * on a non-blocking communicator is handed to an NCCL thread (tens of
 * microseconds), ETP_NCCL_FAST_LAUNCH (default 1) gives each one a blocking
 * twin, split and warmed up at creation, that collectives launch on; waits
 * stay bounded (they poll streams and abort both).
 *
 * There is no watchdog or progress thread: timeouts and asynchronous NCCL
 * errors are noticed by the waiting caller (stream/event/device waits poll
 * the stream and every communicator's async error). So no CUDA call of etp
 * ever runs on another thread while the caller captures a CUDA graph.
 *
 * Every entry point that touches CUDA first calls cudaSetDevice(device): one
 * thread may drive two contexts on two GPUs.
 */
#ifndef ETP__CUDA_INTERNAL_H
#define ETP__CUDA_INTERNAL_H

#include <stdint.h>

#include <cuda_runtime_api.h>
/* nccl.h declares ncclGroupStart() without (void); keep -Wstrict-prototypes
 * for our code even where NCCL's directory is not a system include path. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <nccl.h>

/* Symmetric windows (2.27) and the zero-CTA policy (2.28): copy-engine
 * all-gathers (cuda_window.c). */
#if defined(NCCL_CTA_POLICY_ZERO) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define ETP__CUDA_HAVE_WINDOWS 1
#else
#define ETP__CUDA_HAVE_WINDOWS 0
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "../backend.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the etp CUDA backend needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

enum {
    ETP__CUDA_RING = 32,     /* issued collectives remembered per communicator */
    ETP__CUDA_NAME_MAX = 64  /* group names, as etp_group_t keeps them */
};

/* Communicator creation and split (topology discovery, bootstrap of every
 * rank) legitimately take longer than a collective at scale; a timeout set
 * for collectives (2 s in tests) is not applied below this to them. */
#define ETP__CUDA_SETUP_MIN_S 60.0

/* One collective issued on a communicator: what a timeout message names. */
typedef struct etp__cuda_issued {
    cudaEvent_t ev;  /* recorded on the stream right after the collective; created lazily */
    uint64_t order;  /* backend-wide issue number; 0: slot empty or known complete */
    uint64_t seq;
    etp__coll_kind_t kind;
    int role;
    char group[ETP__CUDA_NAME_MAX];
} etp__cuda_issued_t;

typedef struct etp__cuda etp__cuda_t;

struct etp__bcomm {
    etp__cuda_t *cb;
    ncclComm_t nccl;     /* NULL once aborted or destroyed */
    /* ETP_NCCL_FAST_LAUNCH: a blocking twin split from nccl and warmed up at
     * creation; collectives launch on it (no NCCL launch thread, no poll). */
    ncclComm_t fast;
    /* ETP_COPY_ENGINE: a blocking twin with NCCL_CTA_POLICY_ZERO, split when
     * the first window is registered; all-gathers into its windows run on
     * the copy engines (cuda_window.c). */
    ncclComm_t zero;
    struct etp__cuda_win *wins;
    int rank, size;
    int role;            /* role of the last collective issued (-1: none yet) */
    int in_batch;        /* issued work in the open batch */
    char name[ETP__CUDA_NAME_MAX]; /* group name; NCCL's commName points here */
    etp__fp_t *fp_dev;   /* fingerprint scratch, 2 x size records: sends, receives */
    etp__fp_t *fp_host;  /* pinned staging of the same layout */
    etp__cuda_issued_t ring[ETP__CUDA_RING];
    unsigned ring_next;
    etp__bcomm_t *next;  /* the backend's live communicators, in creation order */
};

struct etp__bstream {
    cudaStream_t s;
    int borrowed;        /* wrapped: the caller owns s */
    etp__bstream_t *next;
};

struct etp__bevent {
    cudaEvent_t e;
    int recorded_in_capture; /* its last record was captured into a graph */
};

/* A collective of the open batch, whose ring entry is made at batch end
 * (only then is it on its stream). */
typedef struct etp__cuda_batch_rec {
    etp__bcomm_t *comm;
    cudaStream_t stream;
    etp__coll_kind_t kind;
    uint64_t seq;
    int role;
    char group[ETP__CUDA_NAME_MAX];
} etp__cuda_batch_rec_t;

/* A copy-engine collective held back inside a batch (cuda_ce.c): an
 * in-place all-gather or an equal-count all-to-all between windows. */
typedef struct etp__cuda_ce_op {
    etp__bcomm_t *comm;
    cudaStream_t stream;
    etp__coll_kind_t kind;
    const char *send;
    char *recv;
    size_t count;  /* elements from each rank to each rank */
    size_t esize;
    ncclDataType_t dt;
    const void *win; /* the window recv lies in (etp__cuda_win_id) */
} etp__cuda_ce_op_t;

struct etp__cuda {
    etp__be_t base;
    int device;
    int prio_greatest;         /* numerically lowest stream priority of the device */
    etp__bcomm_t *comms;
    etp__bstream_t *streams;
    uint64_t next_order;
    int batch_depth;
    int group_open;            /* an ncclGroupStart of a batch is not yet ended */
    etp__cuda_batch_rec_t *batch;
    size_t num_batch, cap_batch;
    int warned_check_capture;  /* fingerprints skipped under capture: said once */
    int warned_check_batch;    /* fingerprints skipped inside a batch: said once */
    struct etp__cuda_nvl *nvls; /* the NVLink transport's windows (cuda_ep.c) */
    etp__cuda_ce_op_t *ce;     /* held back in the open batch, in issue order */
    size_t num_ce, cap_ce;
};

/* The communicator collectives launch on. */
static inline ncclComm_t etp__cuda_launch_comm(const etp__bcomm_t *c)
{
    return c->fast ? c->fast : c->nccl;
}

static inline etp__cuda_t *etp__cuda_of(etp__be_t *be)
{
    return (etp__cuda_t *)be;
}

/* ---- cuda_backend.c ---------------------------------------------------- */

/* cudaSetDevice(cb->device), as an etp status. */
etp_status_t etp__cuda_set_device(etp__cuda_t *cb);
/* A CUDA error as an etp error (OUT_OF_MEMORY or BACKEND) naming `what`;
 * clears CUDA's last error. */
etp_status_t etp__cuda_error(const char *what, cudaError_t e);
/* The device a new backend uses (cfg->device, or picked from the launcher's
 * local rank). */
etp_status_t etp__cuda_pick_device(const etp__be_config_t *cfg, int world_rank, int *device);
/* A new backend object on `device`, with no communicator yet. */
etp_status_t etp__cuda_be_new(const etp__be_config_t *cfg, etp__logger_t *log, int rank,
                             int size, int device, etp__cuda_t **out);

/* ---- cuda_comm.c ------------------------------------------------------- */

/* Record the first fatal failure (this thread's last error), close an open
 * batch group and abort every communicator. Returns status. */
etp_status_t etp__cuda_fail(etp__cuda_t *cb, etp_status_t status);
/* Abort every live communicator (and its twins). */
void etp__cuda_abort_all(etp__cuda_t *cb);
/* Finalize and destroy cs[0..n) together, or abort them; frees them. */
void etp__cuda_release_comms(etp__cuda_t *cb, etp__bcomm_t **cs, size_t n);
etp_status_t etp__cuda_comm_split(etp__be_t *be, etp__bcomm_t *parent, int color, int key,
                                  const etp_group_config_t *cfg, etp__bcomm_t **out);
void etp__cuda_comm_destroy(etp__be_t *be, etp__bcomm_t *c);
int etp__cuda_comm_rank(const etp__bcomm_t *c);
int etp__cuda_comm_size(const etp__bcomm_t *c);

/* Poll until no communicator of comms[0..n) reports ncclInProgress. Bounded
 * by the timeout, but never below min_limit_s when a timeout is set (0 for
 * collectives; ETP__CUDA_SETUP_MIN_S for communicator creation and split);
 * `what` names the operation in messages. Sets the last error but does not
 * fail the backend (the caller decides). */
etp_status_t etp__cuda_nccl_wait(etp__cuda_t *cb, ncclComm_t *comms, int n, const char *what,
                                 double min_limit_s);

/* ---- cuda_stream.c ------------------------------------------------------ */

/* Block until `s` is idle, watching every communicator for asynchronous
 * errors; bounded by the timeout. `pending` (may be NULL) names what is
 * awaited in a timeout message; NULL: the oldest incomplete collective.
 * A timeout or error fails the backend. */
etp_status_t etp__cuda_wait_stream(etp__cuda_t *cb, cudaStream_t s, const char *what,
                                   const char *pending);

/* Poll until streams ss[0..ns) and event ev (may be NULL) are complete;
 * report 0 (teardown): no message, no failure. */
etp_status_t etp__cuda_wait_work(etp__cuda_t *cb, const char *what, const cudaStream_t *ss,
                                 size_t ns, cudaEvent_t ev, const char *pending, int report);
/* The native handles of the backend's streams (*out malloc'd, or NULL). */
etp_status_t etp__cuda_stream_list(etp__cuda_t *cb, cudaStream_t **out, size_t *n);
etp_status_t etp__cuda_device_sync(etp__be_t *be);
etp_status_t etp__cuda_stream_create(etp__be_t *be, int priority, etp__bstream_t **out);
etp_status_t etp__cuda_stream_wrap(etp__be_t *be, void *native, etp__bstream_t **out);
void *etp__cuda_stream_native(etp__be_t *be, etp__bstream_t *s);
etp_status_t etp__cuda_stream_destroy(etp__be_t *be, etp__bstream_t *s);
etp_status_t etp__cuda_stream_sync(etp__be_t *be, etp__bstream_t *s);
etp_status_t etp__cuda_stream_capturing(etp__be_t *be, etp__bstream_t *s, int *capturing);
etp_status_t etp__cuda_event_create(etp__be_t *be, etp__bevent_t **out);
etp_status_t etp__cuda_event_destroy(etp__be_t *be, etp__bevent_t *ev);
etp_status_t etp__cuda_event_record(etp__be_t *be, etp__bevent_t *ev, etp__bstream_t *s);
etp_status_t etp__cuda_stream_wait_event(etp__be_t *be, etp__bstream_t *s, etp__bevent_t *ev);
etp_status_t etp__cuda_event_query(etp__be_t *be, etp__bevent_t *ev, int *done);
etp_status_t etp__cuda_event_sync(etp__be_t *be, etp__bevent_t *ev);

/* ---- cuda_graph.c ------------------------------------------------------- */

etp_status_t etp__cuda_capture_begin(etp__be_t *be, etp__bstream_t *s);
etp_status_t etp__cuda_capture_end(etp__be_t *be, etp__bstream_t *s, void **graph);
etp_status_t etp__cuda_graph_launch(etp__be_t *be, void *graph, etp__bstream_t *s);
void etp__cuda_graph_destroy(etp__be_t *be, void *graph);

/* ---- cuda_window.c ------------------------------------------------------ */

etp_status_t etp__cuda_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, void **ptr,
                                 void **win);
void etp__cuda_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win);
/* The NVLink transport's window (cuda_ep.c): `bytes` of ncclMemAlloc
 * memory registered as a symmetric window of c, whose peers' copies the
 * kernels reach by LSA pointers. Collective over c; ETP_ERR_UNSUPPORTED on
 * every rank alike, with the reason in why, when some rank cannot (local_ok
 * 0, no device API, NCCL too old, not every rank in the LSA team).
 * *agree_min becomes the smallest value any rank passed. *win is the
 * ncclWindow_t (NULL for a one-rank group: plain memory). */
etp_status_t etp__cuda_peer_win_alloc(etp__be_t *be, etp__bcomm_t *c, size_t bytes, int local_ok,
                                      int *agree_min, void **ptr, void **win, char *why,
                                      size_t why_bytes);
void etp__cuda_peer_win_free(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win);
/* A fault an NVLink transport kernel recorded (a peer that never came), as
 * ETP_ERR_TIMEOUT failing the backend; ETP_SUCCESS when none. Read without
 * blocking (host-mapped words). */
etp_status_t etp__cuda_nvl_faults(etp__cuda_t *cb);
/* The communicator an all-gather from send into [recv, recv + bytes)
 * launches on: the zero-CTA twin when both lie in c's windows, else the
 * usual one. */
ncclComm_t etp__cuda_ag_comm(const etp__bcomm_t *c, const void *send, const void *recv,
                             size_t bytes);
/* The zero-CTA twin for an all-to-all-v whose counts are all equal, in
 * rank order, between buffers in c's windows; NULL otherwise. */
ncclComm_t etp__cuda_a2a_comm(const etp__bcomm_t *c, const etp__coll_t *op);
/* ncclAlltoAll where NCCL has it (only called when a2a_comm said so). */
ncclResult_t etp__cuda_alltoall(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                ncclComm_t comm, cudaStream_t s);

/* The window of c holding [p, p + bytes), when it has every rank's
 * address of it; NULL otherwise. The same buffers give the same answer on
 * every rank. */
const void *etp__cuda_win_id(const etp__bcomm_t *c, const void *p, size_t bytes);
/* Where p, inside window `win` (from etp__cuda_win_id), lies in rank
 * `peer`'s copy of it, as an address this device can copy to. */
char *etp__cuda_win_peer(const void *win, const void *p, int peer);

/* ---- cuda_ce.c --------------------------------------------------------- */

/* Inside a batch: hold back op when it is a copy-engine collective a run
 * can fuse (*held = 1); etp__cuda_ce_flush issues it after the batch's
 * NCCL group. */
etp_status_t etp__cuda_ce_hold(etp__cuda_t *cb, etp__bcomm_t *c, const etp__coll_t *op,
                               ncclDataType_t dt, size_t esize, cudaStream_t s, int *held);
/* Issue what was held back, in order; runs of three or more with a common
 * stride fused. A failure leaves the ranks out of step: the caller fails
 * the backend. */
etp_status_t etp__cuda_ce_flush(etp__cuda_t *cb);

/* ---- cuda_coll.c ------------------------------------------------------- */

etp_status_t etp__cuda_coll(etp__be_t *be, etp__bcomm_t *c, const etp__coll_t *op,
                            etp__bstream_t *s);
etp_status_t etp__cuda_batch_begin(etp__be_t *be);
etp_status_t etp__cuda_batch_end(etp__be_t *be);

/* Describe the oldest collective (over all communicators) that has not
 * completed, or say that none is known; for timeout messages. */
void etp__cuda_describe_pending(etp__cuda_t *cb, char *buf, size_t n);

/* Free a communicator's scratch and ring events (not the NCCL comm). */
/* The fingerprint scratch of c (ETP_CHECK_COLLECTIVES), when it is made. */
etp_status_t etp__cuda_fp_alloc(etp__bcomm_t *c);
void etp__cuda_comm_free_scratch(etp__bcomm_t *c);

/* Each module's CUDA kernel table (cuda_<module>.c). */
extern const etp__quant_kernels_t etp__cuda_quant_kernels;
extern const etp__ep_kernels_t etp__cuda_ep_kernels;
extern const etp__shard_kernels_t etp__cuda_shard_kernels;
extern const etp__gemm_kernels_t etp__cuda_gemm_kernels;

/* For module launchers: make the context's device current and give the
 * native stream of s. */
etp_status_t etp__cuda_stream_for_launch(etp__be_t *be, etp__bstream_t *s, cudaStream_t *out);

#endif /* ETP__CUDA_INTERNAL_H */
