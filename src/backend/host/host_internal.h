/*
 * The host backend: CPU memory, MPI non-blocking collectives, and streams
 * that are queues run by a scheduler (host_sched.c).
 *
 * Streams: every operation gets a global sequence number when enqueued. An
 * event is (stream, sequence of the stream's last operation at record time);
 * a wait is an operation that is runnable once that stream has completed that
 * sequence. Operations of one stream complete in order.
 *
 * Eager mode runs everything as soon as it is enqueued (outside a batch).
 * Shuffle mode runs nothing until a synchronization point, and then only what
 * the point needs: the synchronized stream's operations and, through the
 * waits among them, their producers (so an undeclared producer is simply not
 * run yet). Among the runnable heads it picks by policy: seed 0 the latest
 * enqueued first (producers as late as allowed), seed 1 program order, any
 * other seed a seeded random choice.
 */
#ifndef ETP__HOST_INTERNAL_H
#define ETP__HOST_INTERNAL_H

#include <mpi.h>

#include "../backend.h"

typedef struct etp__host etp__host_t;
typedef struct etp__hcoll etp__hcoll_t;

typedef enum etp__hop_kind {
    ETP__HOP_MEMSET,
    ETP__HOP_MEMCPY,
    ETP__HOP_WAIT,
    ETP__HOP_COLL,
    ETP__HOP_FN
} etp__hop_kind_t;

typedef struct etp__hop {
    struct etp__hop *next;
    uint64_t seq;
    etp__hop_kind_t kind;
    union {
        struct {
            void *ptr;
            int value;
            size_t bytes;
        } memset;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } memcpy;
        struct {
            etp__bstream_t *stream;
            uint64_t seq;
        } wait;
        struct {
            etp__hcoll_t *hc;
        } coll;
        struct {
            void (*fn)(void *args);
            void *args; /* a copy, owned by the operation */
            size_t bytes;
        } fn;
    } u;
} etp__hop_t;

struct etp__bstream {
    etp__host_t *host;
    int id;
    int priority;
    etp__hop_t *head, *tail; /* not yet started, in order */
    etp__hop_t *inflight;    /* a started collective, not yet complete */
    uint64_t last_enqueued;  /* seq of the newest operation (0: none ever) */
    uint64_t done_seq;       /* seq of the newest completed operation */
    uint64_t need;           /* scheduler scratch */
    struct etp__hcap *cap;   /* the capture this stream records into, or NULL */
    int cap_idx;             /* its index in that capture */
    etp__bstream_t *next;
};

struct etp__bevent {
    etp__bstream_t *stream; /* NULL: never recorded (complete) */
    uint64_t seq;
    /* recorded during a capture: which one, on which of its streams, after
     * how many captured operations there */
    uint64_t cap_id;
    int cap_stream, cap_pos;
    etp__bevent_t *prev, *next; /* the backend's events, so that a destroyed stream can let go of them */
};

struct etp__bcomm {
    etp__host_t *host;
    MPI_Comm data; /* the collectives */
    MPI_Comm ctrl; /* fingerprints / arrival notes, so they never match data messages */
    int rank, size;
    etp__hcoll_t *zombies; /* failed collectives whose MPI requests are still live */
    /* refusals (host_coll.c), allocated at the first one seen or sent */
    /* size: each peer's refusals not settled yet, the latest record for
     * each sequence number, in order (a peer may be several ahead) */
    struct etp__hrefs *peer_ref;
    etp__refusal_t *peer_ans; /* size: a peer's answer to this rank's refusal (magic 0: none) */
    int *answered;            /* size: this rank told that peer it went on */
    struct etp__hsend *sends; /* refusal records still being sent */
};

/* One collective in flight (host_coll.c). */
struct etp__hcoll {
    etp__hcoll_t *next; /* in the comm's zombie list */
    etp__bcomm_t *comm;
    etp__coll_t d;      /* arrays and group name point into this object */
    char group_name[64];
    size_t *arrays;     /* all-to-all-v counts and displacements, 4 x size */
    void *tmp;          /* staging for an in-place reduce-scatter */
    int *mpi_counts;    /* the int arrays MPI_Ialltoallv reads until completion */
    etp__fp_t *fp_out, *fp_in; /* size: what this rank sends each peer, what each sent */
    MPI_Request *reqs;  /* 2 x size: sends then receives of the fingerprints */
    int *arrived;       /* per peer: its fingerprint came */
    /* ETP_CHECK_COLLECTIVES: after comparing, every rank tells every other
     * its verdict, so a mismatch only some pairs see stops all ranks. */
    int64_t *verdict_in;   /* size: the peer that peer p found mismatched, or -1 */
    int64_t verdict_out;
    MPI_Request *vreqs;    /* 2 x size */
    int verdict_posted, verdict_done;
    etp_status_t mismatch; /* this rank's own comparison */
    char mismatch_msg[ETP__ERRMSG_MAX];
    MPI_Request data_req;
    int data_started, data_done, ctrl_done, checked;
    double t_start;
};

struct etp__host {
    etp__be_t base;
    MPI_Op half_ops[2][2]; /* [f16, bf16][sum, max] */
    etp__bstream_t *streams;
    etp__bevent_t *events;
    int next_stream_id;
    uint64_t next_seq;
    int policy;            /* 0 latest first, 1 program order, 2 random */
    uint64_t rng;
    int batch_depth;
    struct etp__hcap *cap; /* the capture in progress (one at a time) */
    uint64_t next_cap_id;
};

enum { ETP__POLICY_LATE = 0, ETP__POLICY_FIFO = 1, ETP__POLICY_RANDOM = 2 };

/* host_sched.c */
etp_status_t etp__hsched_enqueue(etp__host_t *h, etp__bstream_t *s, etp__hop_t *op);
/* Run until `s` has completed `seq` (s NULL: everything enqueued). With
 * blocking 0, do what can be done now and return. */
etp_status_t etp__hsched_run(etp__host_t *h, etp__bstream_t *s, uint64_t seq, int blocking);
/* Drop all queued work after a failure (collectives in flight become zombies). */
void etp__hsched_abandon(etp__host_t *h);
etp__hop_t *etp__hop_new(etp__hop_kind_t kind);

/* host_coll.c */
etp_status_t etp__hcoll_new(etp__host_t *h, etp__bcomm_t *c, const etp__coll_t *d,
                            etp__hcoll_t **out);
etp_status_t etp__hcoll_start(etp__host_t *h, etp__hcoll_t *hc);
/* *done = 1 once complete. An error (timeout, mismatch, MPI) is returned once. */
etp_status_t etp__hcoll_progress(etp__host_t *h, etp__hcoll_t *hc, int *done);
/* Free a collective that never started or has completed. */
void etp__hcoll_free(etp__hcoll_t *hc);
/* Park a started, unfinished collective on its comm until comm destroy. */
void etp__hcoll_zombify(etp__hcoll_t *hc);
/* Try (bounded by the timeout) to finish a comm's zombies; leak what stays
 * and return 1 (their MPI requests are still live), else 0. */
int etp__hcomm_drain(etp__host_t *h, etp__bcomm_t *c);
etp_status_t etp__hcoll_ops_create(etp__host_t *h);
/* The backend ops refuse and refusal_poll (backend.h), and what a comm's
 * destroy frees of them. */
etp_status_t etp__hcomm_refuse(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *rec);
etp_status_t etp__hcomm_refusal_poll(etp__be_t *be, etp__bcomm_t *c, const etp__refusal_t *mine,
                                     int *verdict, char *why, size_t why_bytes);
void etp__hcomm_refusals_free(etp__bcomm_t *c);
void etp__hcoll_ops_free(etp__host_t *h);

/* host_capture.c: graph capture, with CUDA's rules. */
typedef struct etp__hcap etp__hcap_t;
/* Take an operation enqueued on a capturing stream into the capture. */
etp_status_t etp__hcap_add(etp__host_t *h, etp__bstream_t *s, etp__hop_t *op);
etp_status_t etp__hcap_record(etp__host_t *h, etp__bevent_t *e, etp__bstream_t *s);
etp_status_t etp__hcap_wait(etp__host_t *h, etp__bstream_t *s, etp__bevent_t *e);
/* ETP_SUCCESS unless `what` is not allowed during the capture in progress
 * (a host wait, an allocation), or e is an event of a capture. */
etp_status_t etp__hcap_check_host_wait(etp__host_t *h, etp__bstream_t *s, etp__bevent_t *e,
                                       const char *what);
etp_status_t etp__hcap_begin(etp__be_t *be, etp__bstream_t *s);
etp_status_t etp__hcap_end(etp__be_t *be, etp__bstream_t *s, void **graph);
etp_status_t etp__hcap_launch(etp__be_t *be, void *graph, etp__bstream_t *s);
void etp__hcap_graph_destroy(etp__be_t *be, void *graph);

/* host_kernels.c */
extern const etp__kernels_t etp__host_kernels;
void etp__host_axpy_f32_ref(size_t n, float alpha, const float *x, float *y);

/* Enqueue fn(copy of args) on a host stream: how every host kernel runs. */
etp_status_t etp__host_launch(etp__be_t *be, etp__bstream_t *s, void (*fn)(void *args),
                              const void *args, size_t args_bytes);

/* Each module's host kernel table (host_<module>.c). */
extern const etp__quant_kernels_t etp__host_quant_kernels;
extern const etp__ep_kernels_t etp__host_ep_kernels;
extern const etp__shard_kernels_t etp__host_shard_kernels;
extern const etp__gemm_kernels_t etp__host_gemm_kernels;

#endif /* ETP__HOST_INTERNAL_H */
