/*
 * The public objects of contexts, streams, events and groups: thin wrappers
 * over backend objects that add argument checking, ownership counts, memory
 * accounting and per-(group, role) sequence numbers.
 */
#ifndef ETP__COMM_INTERNAL_H
#define ETP__COMM_INTERNAL_H

#include "../backend/backend.h"

typedef struct etp__alloc_rec {
    void *ptr;
    size_t bytes;
    etp_mem_owner_t owner;
    /* a symmetric window (etp__mem_alloc_window): its group, role and the
     * backend's handle; group NULL for plain memory */
    etp_group_t *win_group;
    int win_role;
    void *win;
} etp__alloc_rec_t;

/* What of other streams a stream (or an event) is ordered after, by etp's
 * own events and waits: per stream id, how many collectives of that stream
 * (stream.c). A few entries: the streams of one context. */
typedef struct etp__clock_entry {
    uint64_t stream, colls;
} etp__clock_entry_t;
typedef struct etp__clock {
    etp__clock_entry_t *e;
    int n, cap;
} etp__clock_t;

struct etp_context {
    etp__be_t *be;
    etp__logger_t log;
    etp__env_t env;
    etp_allocator_t allocator;
    etp_backend_t requested_backend; /* before the constructor resolves AUTO */
    etp_group_t *world;
    etp_group_t *groups; /* every live group, the world included (etp_context_check) */
    etp__clock_t done;   /* per stream: collectives known complete by a host wait (stream.c) */
    int num_streams, num_events, num_groups, num_graphs; /* live user-visible objects, world excluded */
    int batch_depth;
    uint64_t stream_ids; /* the last id given to a stream of this context */
    /* a graph capture in progress (0 or 1: one at a time), and the graph
     * counters (graph_refs) of the objects its work used (groups whose
     * communicators it captured, quantizers, chains, EP groups and layers
     * whose memory it captured), which its graph will hold */
    int captures;
    int **cap_refs;
    int n_cap_refs, cap_cap_refs;
    struct etp_chain *recording; /* src/shard: the chain recording its order, if any */
    /* memory accounting: a small open array, searched linearly (allocations
     * are few and long-lived: shards, slots, rings) */
    etp__alloc_rec_t *allocs;
    size_t num_allocs, cap_allocs;
    size_t bytes_by_owner[ETP_MEM_OWNER_COUNT];
    size_t total_bytes, peak_bytes;
};

struct etp_stream {
    etp_context_t *ctx;
    etp__bstream_t *bs;
    /* unique within the context and never reused, unlike the address of a
     * destroyed stream's successor: what "the same stream as last time"
     * compares */
    uint64_t id;
    char label[64]; /* what etp made it for ("chain 'x' all-gathers"), for messages; "" for the caller's */
    uint64_t colls;  /* collectives issued on it outside captures */
    etp__clock_t after; /* what it waited for through etp events */
};

struct etp_graph {
    etp_context_t *ctx;
    void *bg; /* the backend's graph */
    int **refs; /* graph_refs of the objects it uses (etp__capture_note): destroying them refuses */
    int nrefs;
};

struct etp_event {
    etp_context_t *ctx;
    etp__bevent_t *be_ev;
    etp__clock_t clock; /* at its last record: its stream's position and what that followed */
};

/* A group's refusals on this rank (refusal.c): a collective-issuing call
 * refused here may have left this rank out of step with its peers. */
typedef enum etp__refusal_state {
    ETP__GROUP_IN_STEP = 0,
    ETP__GROUP_REFUSED = 1, /* refused; whether the peers refused alike is not known yet */
    ETP__GROUP_BROKEN = 2   /* out of step: every collective on it fails at once */
} etp__refusal_state_t;

typedef struct etp__group_refusals {
    etp__refusal_state_t state;
    int64_t count;                      /* refusals on the group so far */
    uint64_t seq[ETP_GROUP_MAX_ROLES];  /* per role: the first sequence number not joined */
    int alike[ETP_GROUP_MAX_ROLES];     /* per role: every peer refused alike */
    char call[48];                      /* the first refused call and its message */
    char msg[ETP__ERRMSG_MAX];
    char broken[ETP__ERRMSG_MAX];       /* BROKEN: the message every collective fails with */
} etp__group_refusals_t;

struct etp_group {
    etp_context_t *ctx;
    etp_group_t *next_group; /* the context's groups, the world included */
    etp_group_t *parent;
    int children;
    char name[64];
    int rank, size, num_roles;
    etp__bcomm_t *comms[ETP_GROUP_MAX_ROLES];
    uint64_t seq[ETP_GROUP_MAX_ROLES];
    etp__group_refusals_t refusals;
    /* per role: the stream of the last collective issued outside a capture
     * (its id, 0 none) and that collective's position on it (stream.c) */
    uint64_t last_stream[ETP_GROUP_MAX_ROLES], last_colls[ETP_GROUP_MAX_ROLES];
    uint64_t last_seq[ETP_GROUP_MAX_ROLES];
    char last_label[ETP_GROUP_MAX_ROLES][64];
    int windows; /* live etp__mem_alloc_window allocations on its communicators */
    int users;   /* live parameters, chains and EP groups built on it */
    int graph_refs; /* live graphs whose collectives use its communicators */
};

/* ETP_SUCCESS, or ETP_ERR_ABORTED with the context's first failure. */
etp_status_t etp__ctx_usable(const etp_context_t *ctx, const char *fn);
/* ETP_ERR_INVALID_STATE inside an etp_batch_begin/end: for calls that
 * enqueue work reading a collective's result (on CUDA a batch's collectives
 * launch only at its end, after that work). */
etp_status_t etp__ctx_no_batch(const etp_context_t *ctx, const char *fn);
/* ETP_ERR_INVALID_STATE while a graph capture is in progress on a context
 * that has not aborted: for calls that free memory, a stream or a
 * communicator (on CUDA each is an unsafe call inside a capture, and the
 * host backend would free what the graph may use). Checked before anything
 * changes. */
etp_status_t etp__ctx_no_capture(const etp_context_t *ctx, const char *fn);
/* *capturing: whether `stream` records into a graph capture now. */
etp_status_t etp__stream_capturing(etp_stream_t *stream, int *capturing);
/* Work that uses an object (its memory or communicators) enqueued on
 * `stream`: while the stream captures, the graph it becomes will hold the
 * object's counter *graph_refs (its destroy refuses with ETP_ERR_BUSY while
 * it is nonzero). Call before enqueueing. */
etp_status_t etp__capture_note(etp_context_t *ctx, int *graph_refs, etp_stream_t *stream);
/* A collective on `group` enqueued on `stream`. */
etp_status_t etp__capture_note_group(etp_group_t *group, etp_stream_t *stream);
/* ---- one stream per (group, role) at a time (stream.c) --------------------
 * A collective on (group, role) from another stream than the last one that
 * issued there must be ordered after it by etp events (a record on the
 * last stream after that collective, waited for by this stream, directly or
 * through other streams): otherwise the ranks may pair different
 * collectives. Checked (ETP_ERR_INVALID_STATE naming both streams, recorded
 * as a refusal) where `checking` says so; with `record`, the collective
 * is then recorded as the last use (always, checking or not). Collectives
 * enqueued while capturing are neither checked nor recorded. */
int etp__stream_order_checking(const etp_context_t *ctx);
etp_status_t etp__stream_order_use(etp_group_t *group, int role, etp_stream_t *stream,
                                   const char *fn, int record);
/* Host waits: what they waited for is complete, so later collectives
 * from any stream follow it. all: every stream (a device-wide wait). */
void etp__stream_order_waited(etp_context_t *ctx, etp_stream_t *stream, etp_event_t *event,
                              int all);
/* "stream #3 (chain 'x' all-gathers)" */
void etp__stream_describe(char *buf, size_t n, uint64_t id, const char *label);

/* ---- refusals (refusal.c): the contract is in etp/context.h ------------- */

/* `fn`, a call that would have issued collectives on `group`, was refused on
 * this rank with `status` (the thread's last error says why) before it
 * issued them all. On a group of several ranks of a context that has not
 * aborted, the refusal is recorded and the peers are told (where the
 * backend can); the group's next collective learns whether they refused
 * alike. Returns `status`, the last error unchanged. NULL group: nothing. */
etp_status_t etp__group_refused(etp_group_t *group, etp_status_t status, const char *fn);
/* Before a collective (or a collective setup call) on `group`: after a
 * refusal, wait (bounded by the timeout; with blocking 0, look only) until
 * the peers' answers say whether they refused alike; ETP_ERR_INVALID_STATE
 * quoting the refusal when the group is broken on this rank. */
etp_status_t etp__group_ready(etp_group_t *group, int blocking, const char *fn);
/* A public call that issues collectives on one group through etp's own
 * collective calls: begin before anything, end with the call's status.
 * end records a refusal unless the collective call that failed inside
 * recorded it already. */
typedef struct etp__refusal_guard {
    etp_group_t *group;
    int64_t count;
} etp__refusal_guard_t;
etp__refusal_guard_t etp__refusal_guard(etp_group_t *group);
etp_status_t etp__refusal_guard_end(etp__refusal_guard_t guard, etp_status_t status,
                                    const char *fn);

/* Create a context around a backend that a constructor made. */
etp_status_t etp__ctx_finish(etp_context_t *ctx, etp__bcomm_t *world_comm);
/* Resolve config + environment into a fresh (zeroed) context. */
etp_status_t etp__ctx_init(const etp_context_config_t *config, etp_context_t **out,
                           etp__be_config_t *becfg);
void etp__ctx_free(etp_context_t *ctx);

/* Memory for all-gathers on (group, role) that may run on the copy engines
 * (backend.h: win_alloc), accounted to `owner` like etp_mem_alloc and freed
 * by etp_mem_free. Collective over the role's communicator when *window
 * comes back 1 on the cuda backend: every rank allocates the same sizes in
 * the same order. *window: 1 when the memory is a window (or on the host
 * backend, where any memory is one): all-gathers into it should then be in
 * place (send = recv + rank * count), which is what lets NCCL use the copy
 * engines; 0 for plain memory (a user allocator, a small or unsupported
 * allocation). */
etp_status_t etp__mem_alloc_window(etp_group_t *group, int role, size_t bytes,
                                   etp_mem_owner_t owner, void **ptr, int *window);

/* Count (add = 1) or uncount (0) bytes a module allocated through the
 * backend itself (an EP group's NVLink window) in the memory report. */
void etp__mem_account(etp_context_t *ctx, etp_mem_owner_t owner, size_t bytes, int add);

#endif /* ETP__COMM_INTERNAL_H */
