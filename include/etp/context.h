/*
 * etp/context.h - contexts, streams, events and memory.
 *
 * A context is one rank of a job on one device: it owns a backend (CUDA+NCCL
 * or host+MPI), the world group, and every stream, event, group and buffer
 * made from it. Nothing in etp is process-wide: two contexts (two GPUs driven
 * by two threads, or a host and a CUDA context) live side by side.
 *
 * Contexts are created from an MPI communicator (etp/mpi.h), from an NCCL
 * communicator the caller already has (etp/cuda.h), or from a unique id
 * (below).
 *
 * Thread safety: a context and everything made from it is used by one thread
 * at a time. Different contexts may be used concurrently from different
 * threads (the host backend then needs MPI_THREAD_MULTIPLE).
 *
 * Streams: work is ordered on etp streams exactly as on CUDA streams. On the
 * CUDA backend an etp stream is a cudaStream_t (created by etp or wrapped,
 * see etp/cuda.h). On the host backend a stream is a queue: in eager mode an
 * operation runs when it is enqueued; in shuffle mode operations wait until a
 * synchronization point and then run in a seeded adversarial order that
 * respects only stream order and declared event waits, so a missing
 * etp_stream_wait_event() gives wrong results in a test instead of a rare NaN
 * on a cluster (docs/DESIGN.md, "Host streams").
 */
#ifndef ETP_CONTEXT_H
#define ETP_CONTEXT_H

#include "etp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etp_context etp_context_t;
typedef struct etp_stream etp_stream_t;
typedef struct etp_event etp_event_t;
typedef struct etp_group etp_group_t;

typedef enum etp_backend {
    ETP_BACKEND_AUTO = 0, /* CUDA when built in and a GPU is present, else host */
    ETP_BACKEND_HOST = 1,
    ETP_BACKEND_CUDA = 2
} etp_backend_t;

typedef enum etp_host_stream_mode {
    ETP_HOST_STREAMS_DEFAULT = 0, /* from ETP_HOST_STREAMS (eager unless set) */
    ETP_HOST_STREAMS_EAGER = 1,
    ETP_HOST_STREAMS_SHUFFLE = 2
} etp_host_stream_mode_t;

/* Who a buffer belongs to, for the memory report. */
typedef enum etp_mem_owner {
    ETP_MEM_USER = 0,       /* etp_mem_alloc() on behalf of the caller */
    ETP_MEM_SHARDS = 1,
    ETP_MEM_MAIN_GRAD = 2,
    ETP_MEM_GATHER_SLOTS = 3,
    ETP_MEM_WGRAD_RING = 4,
    ETP_MEM_EP_BUFFERS = 5,
    ETP_MEM_WORKSPACE = 6,  /* etp's own scratch (fingerprints, staging) */
    ETP_MEM_OWNER_COUNT = 7
} etp_mem_owner_t;

/* A static name of an owner ("main_grad"), or "invalid". */
ETP_API const char *etp_mem_owner_name(etp_mem_owner_t owner);

/* Allocator hook: every buffer etp allocates on the context's device goes
 * through it. alloc returns NULL on failure; free receives the pointer and
 * the size alloc was asked for. Leave both NULL for the default (cudaMalloc on
 * the CUDA backend, an aligned malloc on the host backend). */
typedef struct etp_allocator {
    void *(*alloc)(void *user, size_t bytes, etp_mem_owner_t owner);
    void (*free)(void *user, void *ptr, size_t bytes);
    void *user;
} etp_allocator_t;

/* Log sink: receives each complete line (no trailing newline). NULL writes
 * to stderr. Lines are produced only at levels that ETP_LOG_LEVEL enables.
 * At debug level a failure's trace goes to the sink of the context the
 * failing thread last entered: a context destroyed by another thread may
 * still send that thread's traces to its sink until the thread enters
 * another context. */
typedef void (*etp_log_fn_t)(void *user, int level, const char *line);

typedef struct etp_context_config {
    size_t size;                  /* sizeof(etp_context_config_t) */
    etp_backend_t backend;
    int device;                   /* CUDA device; -1: local rank modulo device count */
    etp_host_stream_mode_t host_stream_mode;
    int64_t shuffle_seed;         /* shuffle-mode seed; -1: ETP_HOST_SHUFFLE_SEED */
    double timeout_s;             /* collective/wait timeout; <0: ETP_TIMEOUT_S; 0: none */
    int check_collectives;        /* -1: ETP_CHECK_COLLECTIVES; 0 off; 1 on */
    etp_allocator_t allocator;    /* its functions and user pointer are kept: valid for the context's life */
    etp_log_fn_t log_fn;          /* kept, with log_user, for the context's life */
    void *log_user;
} etp_context_config_t;

#define ETP_CONTEXT_CONFIG_INIT                                                     \
    {                                                                               \
        sizeof(etp_context_config_t), ETP_BACKEND_AUTO, -1, ETP_HOST_STREAMS_DEFAULT, \
            -1, -1.0, -1, {NULL, NULL, NULL}, NULL, NULL                            \
    }

/* An opaque bootstrap token: one rank makes it with etp_get_unique_id(), the
 * job carries it to every rank by its own means (a file, a socket, a launcher),
 * and each rank passes it to etp_context_create(). */
#define ETP_UNIQUE_ID_BYTES 256
typedef struct etp_unique_id {
    char internal[ETP_UNIQUE_ID_BYTES];
} etp_unique_id_t;

/* Make a unique id for a new job of the given backend (called on one rank).
 * Errors: ETP_ERR_INVALID_ARGUMENT (id NULL, backend unknown),
 * ETP_ERR_UNSUPPORTED (backend not built in, or the host backend, which
 * bootstraps from MPI only), ETP_ERR_BACKEND. */
ETP_API etp_status_t etp_get_unique_id(etp_backend_t backend, etp_unique_id_t *id);

/* Create this rank's context of a job of `size` ranks from a unique id, with
 * no MPI involved. Collective: every rank of the job calls it. `config` may be
 * NULL for defaults; its backend must match the id's.
 * Errors: ETP_ERR_INVALID_ARGUMENT (rank/size out of range, id of another
 * backend, config of a wrong size), ETP_ERR_UNSUPPORTED, ETP_ERR_TIMEOUT,
 * ETP_ERR_BACKEND. On failure *ctx is untouched. */
ETP_API etp_status_t etp_context_create(const etp_unique_id_t *id, int rank, int size,
                                        const etp_context_config_t *config,
                                        etp_context_t **ctx);

/* Destroy a context. Streams, events, groups and graphs made from it must be
 * destroyed first (ETP_ERR_BUSY names what is left), and so must its
 * quantizers, parameters, chains and EP groups (they are not counted: their
 * destroy after this one would touch a freed context); buffers still
 * allocated are freed and reported in the log. Waits for the context's
 * outstanding work (bounded by the timeout) before releasing communicators,
 * which every rank does together: collective, blocks the host.
 * ETP_ERR_INVALID_STATE while a graph capture is in progress on it (nothing
 * is destroyed; an aborted context is always destroyed). NULL is a no-op. */
ETP_API etp_status_t etp_context_destroy(etp_context_t *ctx);

ETP_API etp_status_t etp_context_rank(const etp_context_t *ctx, int *rank);
ETP_API etp_status_t etp_context_size(const etp_context_t *ctx, int *size);
ETP_API etp_status_t etp_context_backend(const etp_context_t *ctx, etp_backend_t *backend);
/* The group of all ranks of the context (owned by the context: never destroy it). */
ETP_API etp_status_t etp_context_world(etp_context_t *ctx, etp_group_t **world);

/* ETP_SUCCESS while the context is healthy; ETP_ERR_ABORTED (with the first
 * failure as the message) once a timeout, mismatch or backend error has
 * aborted its communicators. An aborted context accepts only destroy calls.
 * ETP_ERR_INVALID_STATE when one of its groups is broken on this rank by a
 * refused call (below; the message names the group and quotes the
 * refusal); the context's other groups still work. Never blocks: a
 * refusal whose outcome the peers have not told yet is not reported. A
 * failure the device recorded on its own (an EP kernel of the NVLINK
 * transport that gave up waiting for a peer, etp/ep.h) is reported here
 * too, as ETP_ERR_TIMEOUT naming the EP group and the rank, and aborts the
 * context.
 *
 * Refused calls. A call refused for its arguments or state returns the
 * error and enqueues nothing. When it is a call that issues collectives on
 * a group of more than one rank (etp_allgather, etp_reduce_scatter,
 * etp_allreduce, etp_alltoallv, etp_ep_prepare and the EP data calls,
 * etp_param_export_full, etp_quant_amax_allreduce, etp_quant_quantize of
 * NVFP4 with a group), its peers may be waiting in a collective this rank
 * will not join, so the refusal is recorded on the group:
 * - refused on every rank alike (the same calls at the same point), the
 *   group is in step and goes on as before;
 * - otherwise the group is broken on this rank: its next collective (and
 *   every later one, a split from it, a window on it) fails at once with
 *   ETP_ERR_INVALID_STATE quoting the first refusal, and etp_context_check
 *   says so. Destroy the group (and what is built on it) to go on.
 * Host backend: the peers are told at once, beside the fingerprint
 * exchange. A peer's collective that the refusing rank will not join fails
 * with ETP_ERR_COLLECTIVE_MISMATCH naming that rank, the call and its
 * message (its context aborts), and answers that it went on. The refusing
 * rank's next collective on the group waits for the answers (bounded by the
 * timeout): all refused alike, or one went on.
 * CUDA backend: no channel beside NCCL tells the peers, so the refusing
 * rank cannot learn which case it is in. It keeps the group in step (a
 * call refused alike on every rank, the common case of a bad argument,
 * must not break a working job) and logs a warning naming the group, its
 * rank and the refused call. Refused on this rank only, the peers' waits
 * time out (ETP_ERR_TIMEOUT) naming the group, role, operation and
 * sequence number of the collective not joined (NCCL does not say which
 * rank is missing); with ETP_CHECK_COLLECTIVES=1 the next collective's
 * fingerprint comparison reports the mismatch instead, naming the ranks. */
ETP_API etp_status_t etp_context_check(const etp_context_t *ctx);

/* ---- streams ---------------------------------------------------------- */

#define ETP_STREAM_PRIORITY_NORMAL 0
#define ETP_STREAM_PRIORITY_HIGH 1

/* Create a stream owned by etp. priority is ETP_STREAM_PRIORITY_NORMAL or
 * ETP_STREAM_PRIORITY_HIGH (the device's greatest priority). */
ETP_API etp_status_t etp_stream_create(etp_context_t *ctx, int priority, etp_stream_t **stream);
/* Destroy a stream; work already enqueued completes first. A wrapped stream's
 * native handle is left to its owner. On an error the stream is as it was
 * (ETP_ERR_INVALID_STATE while any graph capture is in progress on the
 * context) and may be destroyed again; on an aborted context it is always destroyed (ETP_SUCCESS). Events
 * recorded on it stay valid. */
ETP_API etp_status_t etp_stream_destroy(etp_stream_t *stream);
/* Block the calling thread until all work enqueued on the stream is done.
 * Errors: ETP_ERR_TIMEOUT (the message names the pending collective),
 * ETP_ERR_INVALID_STATE (the stream is being captured), ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_stream_synchronize(etp_stream_t *stream);
/* Run fn(arg) on a host thread in stream order: after the work enqueued on
 * `stream` before it, and before the work enqueued after it
 * (cudaLaunchHostFunc on CUDA; a scheduled operation of the stream on the
 * host backend, ordered like any other in shuffle mode). Under a graph
 * capture it is captured (a host node on CUDA) and runs at each launch of
 * the graph. fn must not call etp or CUDA and should return promptly (on
 * CUDA it holds up the stream); `arg` is passed as given and must stay
 * valid until fn has run (each run, for a graph). Enqueues only: never
 * blocks the caller.
 * Errors: ETP_ERR_INVALID_ARGUMENT (stream or fn NULL), ETP_ERR_BACKEND,
 * ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_stream_launch_host(etp_stream_t *stream, void (*fn)(void *arg),
                                            void *arg);

/* ---- events ----------------------------------------------------------- */

ETP_API etp_status_t etp_event_create(etp_context_t *ctx, etp_event_t **event);
ETP_API etp_status_t etp_event_destroy(etp_event_t *event);
/* Capture the work enqueued on `stream` so far. */
ETP_API etp_status_t etp_event_record(etp_event_t *event, etp_stream_t *stream);
/* Make later work on `stream` wait for the event's most recent record (a
 * stream join, no host block). An event never recorded is complete. */
ETP_API etp_status_t etp_stream_wait_event(etp_stream_t *stream, etp_event_t *event);
/* *done = 1 when the recorded work has finished, 0 otherwise; never blocks. */
ETP_API etp_status_t etp_event_query(etp_event_t *event, int *done);
/* Block until the recorded work has finished (bounded by the timeout). */
ETP_API etp_status_t etp_event_synchronize(etp_event_t *event);

/* ---- graph capture ---------------------------------------------------- */

typedef struct etp_graph etp_graph_t;

/* Capture what `stream` enqueues from now on, and what other streams enqueue
 * after joining it (by waiting on an event recorded on it during the
 * capture), into a graph, instead of running it: cudaStreamBeginCapture on
 * the CUDA backend (thread-local mode), the same rules on the host backend,
 * so capture bugs show up without a GPU. During a capture: no host wait on a
 * capturing stream or a captured event, no etp_mem_alloc/etp_mem_free, and a
 * capturing stream may not wait on an event recorded outside the capture.
 * One capture at a time per context.
 * Errors: ETP_ERR_INVALID_STATE (a capture in progress), ETP_ERR_BACKEND. */
ETP_API etp_status_t etp_stream_begin_capture(etp_stream_t *stream);
/* End the capture begun on `stream` and instantiate the graph (*graph,
 * destroyed with etp_graph_destroy); on CUDA each kernel of the graph keeps
 * the priority of the stream that captured it (node priorities), so etp's
 * high-priority gather and reduction streams keep their precedence over the
 * caller's kernels in a replay. Every joined stream's work must have
 * been joined back into `stream` (it waited on an event recorded after that
 * work). Errors: ETP_ERR_INVALID_STATE (not the capturing stream, unjoined
 * work, a capture invalidated by an earlier error, which is named) on the
 * host backend; on CUDA the same cases come back as ETP_ERR_BACKEND with
 * CUDA's message. */
ETP_API etp_status_t etp_stream_end_capture(etp_stream_t *stream, etp_graph_t **graph);
/* Enqueue the graph's work on `stream` (ordered after what is there). The
 * buffers it was captured with must still be allocated. */
ETP_API etp_status_t etp_graph_launch(etp_graph_t *graph, etp_stream_t *stream);
/* NULL is a no-op. */
ETP_API etp_status_t etp_graph_destroy(etp_graph_t *graph);

/* ---- memory ----------------------------------------------------------- */

/* Allocate `bytes` (> 0) of device memory (host memory on the host backend)
 * through the context allocator, accounted to `owner`. Aligned to 256 bytes
 * by the default allocators. */
ETP_API etp_status_t etp_mem_alloc(etp_context_t *ctx, size_t bytes, etp_mem_owner_t owner,
                                   void **ptr);
/* Free a buffer from etp_mem_alloc() of the same context. Like cudaFree, it
 * first waits for the context's enqueued work: blocks the host. Errors:
 * ETP_ERR_INVALID_ARGUMENT for a pointer this context did not allocate;
 * ETP_ERR_INVALID_STATE while a graph capture is in progress on the context
 * (on an aborted context it always frees); ETP_ERR_TIMEOUT, ETP_ERR_BACKEND
 * from the wait (the buffer then stays allocated). */
ETP_API etp_status_t etp_mem_free(etp_context_t *ctx, void *ptr);
/* Enqueue a byte fill / a copy of `bytes` on `stream`. Pointers may be device
 * or host memory the backend can reach; ranges must not overlap for copies.
 * value is the byte, 0..255 (-1 is refused: pass 255). */
ETP_API etp_status_t etp_memset_async(etp_stream_t *stream, void *ptr, int value, size_t bytes);
ETP_API etp_status_t etp_memcpy_async(etp_stream_t *stream, void *dst, const void *src,
                                      size_t bytes);

typedef struct etp_memory_report {
    size_t size;                              /* sizeof(etp_memory_report_t) */
    size_t bytes[ETP_MEM_OWNER_COUNT];        /* live bytes by owner */
    size_t total_bytes;                       /* live bytes, all owners */
    size_t peak_bytes;                        /* high-water mark of total_bytes */
    size_t live_allocations;
} etp_memory_report_t;

#define ETP_MEMORY_REPORT_INIT {sizeof(etp_memory_report_t), {0}, 0, 0, 0}

/* Fill *report (whose size field the caller sets) with the context's memory. */
ETP_API etp_status_t etp_memory_report(const etp_context_t *ctx, etp_memory_report_t *report);

#ifdef __cplusplus
}
#endif

#endif /* ETP_CONTEXT_H */
