/*
 * The backend: one ops table, two implementations (cuda/ and host/).
 *
 * All runtime logic above this layer (groups, chains, tickets, EP layout,
 * quantization phases) is written once against this table. A backend owns
 * its streams, events and communicators; the comm layer (src/comm) owns the
 * public objects that wrap them and does argument checking, accounting and
 * sequence numbering, so that a backend only executes.
 *
 * Errors: a backend function returns an etp_status_t and sets the thread's
 * last error (etp__err) itself. A backend that hits a timeout, a mismatch or
 * a communicator error calls etp__be_fail(), which aborts its communicators
 * and makes every later call of the context return ETP_ERR_ABORTED.
 */
#ifndef ETP__BACKEND_H
#define ETP__BACKEND_H

#include <stdint.h>

#include "etp/etp_config.h"
#include "../core/core.h"
#include "etp/comm.h"

typedef struct etp__be etp__be_t;
typedef struct etp__bstream etp__bstream_t; /* defined by each backend */
typedef struct etp__bevent etp__bevent_t;
typedef struct etp__bcomm etp__bcomm_t;

typedef enum etp__coll_kind {
    ETP__COLL_ALLGATHER = 1,
    ETP__COLL_REDUCE_SCATTER = 2,
    ETP__COLL_ALLREDUCE = 3,
    ETP__COLL_ALLTOALLV = 4
} etp__coll_kind_t;

const char *etp__coll_name(etp__coll_kind_t kind);

/* One collective, as the comm layer hands it down. The arrays of an
 * all-to-all-v belong to the caller and are valid only during the call: a
 * backend that runs it later copies them. */
typedef struct etp__coll {
    etp__coll_kind_t kind;
    const void *send;
    void *recv;
    size_t count; /* allgather: per rank; reduce_scatter: recvcount; allreduce: total */
    etp_dtype_t dtype;
    etp_redop_t op;
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls; /* alltoallv, elements */
    /* for messages and fingerprints */
    const char *group_name;
    int role;
    uint64_t seq; /* 1-based per (group, role) */
} etp__coll_t;

/* ---- collective fingerprints (fingerprint.c) ---------------------------- */

/* What a rank tells one peer about the collective it is about to join on
 * their communicator (the group's): the same record on every backend, sent
 * as ETP__FP_WORDS int64 words. The backends only move records (each rank
 * sends every peer the one made for it); the comparison is here. */
typedef struct etp__fp {
    int64_t magic; /* ETP__FP_MAGIC: a stray message is not read as a fingerprint */
    int64_t seq;   /* 1-based per (group, role) */
    int64_t role;
    int64_t kind;  /* etp__coll_kind_t */
    int64_t count; /* the collective's count; all-to-all-v: what the sender sends this peer */
    int64_t dtype;
    int64_t redop; /* reductions; else -1 */
    int64_t root;  /* rooted collectives; else -1 */
} etp__fp_t;

enum { ETP__FP_WORDS = 8 };
/* "etpfp1" in ASCII */
#define ETP__FP_MAGIC INT64_C(0x657470667031)

/* The record this rank sends `peer` before `op`. */
void etp__fp_make(const etp__coll_t *op, int peer, etp__fp_t *fp);
/* Compare the record `peer` sent with what this rank (`me`) expects of it
 * (for an all-to-all-v: what this rank receives from it). On a difference,
 * ETP_ERR_COLLECTIVE_MISMATCH with a message naming the group, role and
 * sequence number, both ranks, what each issued, and what differs. */
etp_status_t etp__fp_check(const etp__coll_t *op, int me, int peer, const etp__fp_t *theirs);

/* ---- refusals (host_coll.c) ------------------------------------------------ */

/* A rank refused a collective-issuing call on a group of several ranks, or
 * a peer answers such a refusal: what travels on the collective-checking
 * channel, beside the fingerprints (never matched by them). */
typedef struct etp__refusal {
    int64_t magic;  /* ETP__REFUSAL_MAGIC */
    int64_t kind;   /* ETP__REFUSAL_REFUSED or ETP__REFUSAL_WENT_ON */
    int64_t seq;    /* refused: the first sequence number of the communicator the sender will
                     * not join; went on: the sequence number the sender issued */
    int64_t count;  /* refused: the sender's refusals on the group so far */
    int64_t world_rank;
    char call[48];  /* the refused call ("etp_allreduce"), or the collective issued */
    char msg[400];  /* the refusal's message, or what the answering rank did */
} etp__refusal_t;

enum { ETP__REFUSAL_REFUSED = 1, ETP__REFUSAL_WENT_ON = 2 };
/* "etprf1" in ASCII */
#define ETP__REFUSAL_MAGIC INT64_C(0x657470726631)

/* Each module's kernels, one table per module, declared in
 * src/backend/kernels_<module>.h and implemented by each backend in
 * host/host_<module>.c and cuda/cuda_<module>.c. */
typedef struct etp__quant_kernels etp__quant_kernels_t;
typedef struct etp__ep_kernels etp__ep_kernels_t;
typedef struct etp__shard_kernels etp__shard_kernels_t;
typedef struct etp__gemm_kernels etp__gemm_kernels_t;

/* Kernels each backend provides (the host ones are the reference the CUDA
 * ones are tested against). All enqueue on a stream. */
typedef struct etp__kernels {
    /* y[i] = fmaf(alpha, x[i], y[i]) for i < n: the main_grad accumulation. */
    etp_status_t (*axpy_f32)(etp__be_t *be, etp__bstream_t *s, size_t n, float alpha,
                             const float *x, float *y);
    const etp__quant_kernels_t *quant;
    const etp__ep_kernels_t *ep;
    const etp__shard_kernels_t *shard;
    const etp__gemm_kernels_t *gemm;
} etp__kernels_t;

typedef struct etp__backend_ops {
    const char *name;
    etp_backend_t kind;

    /* Release everything; waits (bounded) for outstanding work. */
    void (*destroy)(etp__be_t *be);

    /* Default allocator: device memory (cuda) or aligned host memory. */
    etp_status_t (*mem_alloc)(etp__be_t *be, size_t bytes, void **ptr);
    void (*mem_free)(etp__be_t *be, void *ptr);
    /* Wait for all enqueued work of the backend (before a free, at destroy). */
    etp_status_t (*device_sync)(etp__be_t *be);

    etp_status_t (*stream_create)(etp__be_t *be, int priority, etp__bstream_t **s);
    /* native is a cudaStream_t on cuda; the host backend has none. */
    etp_status_t (*stream_wrap)(etp__be_t *be, void *native, etp__bstream_t **s);
    void *(*stream_native)(etp__be_t *be, etp__bstream_t *s);
    /* Frees s, or refuses with s as it was; on an aborted context
     * (be->failed) always frees it. */
    etp_status_t (*stream_destroy)(etp__be_t *be, etp__bstream_t *s);
    etp_status_t (*stream_sync)(etp__be_t *be, etp__bstream_t *s);
    /* *capturing: whether s records into a graph capture now (what a
     * caller about to wait on the host checks before enqueuing anything) */
    etp_status_t (*stream_capturing)(etp__be_t *be, etp__bstream_t *s, int *capturing);

    etp_status_t (*event_create)(etp__be_t *be, etp__bevent_t **e);
    etp_status_t (*event_destroy)(etp__be_t *be, etp__bevent_t *e);
    etp_status_t (*event_record)(etp__be_t *be, etp__bevent_t *e, etp__bstream_t *s);
    etp_status_t (*stream_wait_event)(etp__be_t *be, etp__bstream_t *s, etp__bevent_t *e);
    etp_status_t (*event_query)(etp__be_t *be, etp__bevent_t *e, int *done);
    etp_status_t (*event_sync)(etp__be_t *be, etp__bevent_t *e);

    etp_status_t (*memset_async)(etp__be_t *be, etp__bstream_t *s, void *ptr, int value,
                                 size_t bytes);
    etp_status_t (*memcpy_async)(etp__be_t *be, etp__bstream_t *s, void *dst, const void *src,
                                 size_t bytes);
    /* fn(arg) in stream order on a host thread (etp_stream_launch_host) */
    etp_status_t (*launch_host)(etp__be_t *be, etp__bstream_t *s, void (*fn)(void *arg),
                                void *arg);

    /* Split parent by (color, key); color ETP_GROUP_NO_COLOR gives *out = NULL.
     * Collective over parent. cfg carries NCCL settings. */
    etp_status_t (*comm_split)(etp__be_t *be, etp__bcomm_t *parent, int color, int key,
                               const etp_group_config_t *cfg, etp__bcomm_t **out);
    /* Completes (bounded) or abandons outstanding work, then frees. */
    void (*comm_destroy)(etp__be_t *be, etp__bcomm_t *c);
    int (*comm_rank)(const etp__bcomm_t *c);
    int (*comm_size)(const etp__bcomm_t *c);

    etp_status_t (*coll)(etp__be_t *be, etp__bcomm_t *c, const etp__coll_t *op,
                         etp__bstream_t *s);
    /* Memory for all-gathers on c that may run on the copy engines: on cuda
     * an NCCL symmetric window of c (collective over c: every rank calls it,
     * in the same order, with the same bytes); ETP_ERR_UNSUPPORTED when not
     * possible here (too small, NCCL too old, ETP_COPY_ENGINE=0, no
     * registration), and the caller takes plain memory. *win is the
     * backend's handle for win_free. NULL on the host backend (plain
     * memory). */
    etp_status_t (*win_alloc)(etp__be_t *be, etp__bcomm_t *c, size_t bytes, void **ptr,
                              void **win);
    void (*win_free)(etp__be_t *be, etp__bcomm_t *c, void *ptr, void *win);
    etp_status_t (*batch_begin)(etp__be_t *be);
    etp_status_t (*batch_end)(etp__be_t *be);

    /* Refusals (src/comm/refusal.c); both NULL on a backend with no channel
     * beside its collectives (cuda), where a refusal breaks the group at
     * once. refuse: tell every peer of c, at once and without blocking,
     * that this rank will not join c's collectives from rec->seq on; their
     * collectives from there on then fail naming this rank and the call.
     * refusal_poll: without blocking, what the peers of c did about this
     * rank's refusal `mine`: *verdict 1 every peer refused alike (same
     * sequence number and count; the records are then forgotten), -1 a peer
     * went on or refused otherwise (why: which, what), 0 not known yet. */
    etp_status_t (*refuse)(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *rec);
    etp_status_t (*refusal_poll)(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *mine,
                                 int *verdict, char *why, size_t why_bytes);

    /* Graph capture: record what `s` (and the streams that join it by
     * events) enqueue, instead of running it; a graph replays it. */
    etp_status_t (*capture_begin)(etp__be_t *be, etp__bstream_t *s);
    etp_status_t (*capture_end)(etp__be_t *be, etp__bstream_t *s, void **graph);
    etp_status_t (*graph_launch)(etp__be_t *be, void *graph, etp__bstream_t *s);
    void (*graph_destroy)(etp__be_t *be, void *graph);

    /* Without blocking: a failure the device recorded on its own (an NVLink
     * transport kernel that gave up waiting for a peer) fails the backend
     * and is returned. NULL: nothing such can happen. */
    etp_status_t (*health)(etp__be_t *be);

    const etp__kernels_t *kernels;
} etp__backend_ops_t;

/* Settings a backend gets from its context. */
typedef struct etp__be_config {
    int device;           /* cuda: -1 = pick from local rank */
    int host_streams;     /* ETP_HOST_STREAMS_EAGER or _SHUFFLE */
    int64_t shuffle_seed;
    double timeout_s;     /* 0: none */
    int check_collectives;
    int nccl_fast_launch; /* cuda: launch on blocking twins of the communicators */
    int copy_engine;      /* cuda: gather slots as symmetric windows, all-gathers on copy engines */
} etp__be_config_t;

/* The part of every backend instance the layers above may read. Each
 * implementation embeds it as its first member. */
struct etp__be {
    const etp__backend_ops_t *ops;
    etp__logger_t *log;   /* the context's logger */
    etp__be_config_t cfg;
    etp__test_knobs_t test; /* the context's (etp__context_test_knobs) */
    int rank, size;       /* in the world */
    int failed;           /* set by etp__be_fail: the context is aborted */
    etp_status_t fail_status;
    char fail_msg[ETP__ERRMSG_MAX];
};

/* Record the first fatal failure (the message of this thread's last error),
 * log it, and leave it for etp_context_check(). Returns `status`. The caller
 * aborts its own communicators. */
etp_status_t etp__be_fail(etp__be_t *be, etp_status_t status);

/* ---- constructors (not in the table: each bootstraps differently) ---- */

#if ETP_HAVE_MPI
#include <mpi.h>
etp_status_t etp__host_create_mpi(MPI_Comm comm, const etp__be_config_t *cfg,
                                  etp__logger_t *log, etp__be_t **be, etp__bcomm_t **world);
#if ETP_HAVE_CUDA
etp_status_t etp__cuda_create_mpi(MPI_Comm comm, const etp__be_config_t *cfg,
                                  etp__logger_t *log, etp__be_t **be, etp__bcomm_t **world);
#endif
#endif

#if ETP_HAVE_CUDA
/* id: the etp_unique_id_t internal bytes after the backend tag. */
etp_status_t etp__cuda_get_unique_id(void *id, size_t id_bytes);
etp_status_t etp__cuda_create_uid(const void *id, int rank, int size, const etp__be_config_t *cfg,
                                  etp__logger_t *log, etp__be_t **be, etp__bcomm_t **world);
/* comm is an ncclComm_t, borrowed. */
etp_status_t etp__cuda_create_nccl(void *comm, const etp__be_config_t *cfg, etp__logger_t *log,
                                   etp__be_t **be, etp__bcomm_t **world);
/* Number of visible CUDA devices, 0 when none or no driver. */
int etp__cuda_device_count(void);
int etp__cuda_be_device(const etp__be_t *be);
#endif

#endif /* ETP__BACKEND_H */
