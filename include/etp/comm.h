/*
 * etp/comm.h - groups and collectives.
 *
 * A group is a set of ranks of a context (the world group, or one split from
 * another by color and key: an ETP group, an EP group, a DP group). Each group
 * has `num_roles` communicators, one per stream role: NCCL (and MPI) run the
 * operations of one communicator in order, so the all-gather stream and the
 * reduce-scatter stream each get their own communicator to overlap. Every rank
 * must issue the operations of one (group, role) in the same order; different
 * roles are independent.
 *
 * One stream per (group, role) at a time: a collective on (group, role)
 * enqueued on another stream than the last one that issued there must be
 * ordered after that one by etp: an etp_event_record on the last stream
 * after its collective that this stream waited for (etp_stream_wait_event,
 * directly or through other streams), or a host wait that saw it complete
 * (stream or event synchronize, a completed event query, etp_mem_free), or
 * the last stream's destroy. Otherwise two streams enqueue on one
 * communicator with nothing ordering them, and ranks pair different
 * collectives (a hang or wrong data on CUDA). Native waits on wrapped
 * streams (cudaStreamWaitEvent) are invisible to etp and do not count.
 * With ETP_CHECK_COLLECTIVES=1, or on the host backend in shuffle mode,
 * such a collective is refused (ETP_ERR_INVALID_STATE naming both streams)
 * and the refusal is recorded on the group ("Refused calls" in
 * etp/context.h: refused on every rank alike, the group goes on).
 * Collectives enqueued during a graph capture are not checked, and graph
 * launches do not count as uses. etp's own collectives keep the rule: a
 * chain's gathers (and etp_param_export_full of its parameters) on its
 * all-gather stream, its reductions and gradient statistics on its
 * reduction stream, EP calls joined to the group's previous call.
 *
 * Collectives are enqueued on an etp stream of the group's context and
 * complete asynchronously, like NCCL. Each carries a sequence number per
 * (group, role). A collective that does not complete within the context's
 * timeout (ETP_TIMEOUT_S) makes the wait that observes it return
 * ETP_ERR_TIMEOUT with a message naming the group, role, operation, sequence
 * number and, where the backend can tell, the ranks that did not arrive; the
 * context's communicators are then aborted (etp_context_check). With
 * ETP_CHECK_COLLECTIVES=1 every collective first exchanges a fingerprint
 * (group, role, sequence, operation, count, dtype, reduction) and a difference
 * between ranks is reported as ETP_ERR_COLLECTIVE_MISMATCH instead of a hang.
 * That check waits on the host for the exchange (so calls documented as never
 * blocking then block), and is skipped for collectives captured into a graph
 * or issued inside a batch: a debugging aid, off by default.
 *
 * Thread safety: as the context (one thread at a time).
 */
#ifndef ETP_COMM_H
#define ETP_COMM_H

#include "etp/context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pass as color to etp_group_split() on ranks that join no group. */
#define ETP_GROUP_NO_COLOR (-1)
#define ETP_GROUP_MAX_ROLES 8

typedef struct etp_group_config {
    size_t size;         /* sizeof(etp_group_config_t) */
    const char *name;    /* copied; used in messages and logs ("etp", "ep", "dp") */
    int num_roles;       /* communicators, one per stream role: 1..ETP_GROUP_MAX_ROLES */
    /* NCCL communicator settings for this group; -1 leaves NCCL's default.
     * Ignored by the host backend. */
    int min_ctas;
    int max_ctas;
    int cga_cluster_size;
    int cta_policy;      /* NCCL_CTA_POLICY_* */
} etp_group_config_t;

#define ETP_GROUP_CONFIG_INIT {sizeof(etp_group_config_t), NULL, 1, -1, -1, -1, -1}

/* Split `parent` into groups of the ranks that pass the same color, ordered
 * by key (ties by parent rank). Collective over the parent's role-0
 * communicator: every rank of the parent calls it. A rank that passes
 * ETP_GROUP_NO_COLOR gets *group = NULL. `config` may be NULL (one role, name
 * "group<color>"). The parent must outlive the new group.
 * Errors: ETP_ERR_INVALID_ARGUMENT (color < -1, num_roles out of range, a
 * config of the wrong size), ETP_ERR_TIMEOUT, ETP_ERR_BACKEND,
 * ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_group_split(etp_group_t *parent, int color, int key,
                                     const etp_group_config_t *config, etp_group_t **group);

/* Destroy a group made by etp_group_split(). Errors: ETP_ERR_BUSY while groups
 * split from it, parameters, chains or EP groups built on it, or graphs that
 * captured a collective on it, are alive (nothing is destroyed);
 * ETP_ERR_INVALID_ARGUMENT for the world group; ETP_ERR_INVALID_STATE while
 * a graph capture is in progress on the context (nothing is destroyed).
 * Collective over the group (its communicators are finalized together) and
 * blocks the host, bounded by the timeout. NULL is a no-op. */
ETP_API etp_status_t etp_group_destroy(etp_group_t *group);

ETP_API etp_status_t etp_group_rank(const etp_group_t *group, int *rank);
ETP_API etp_status_t etp_group_size(const etp_group_t *group, int *size);
ETP_API etp_status_t etp_group_num_roles(const etp_group_t *group, int *num_roles);
/* The group's name; owned by the group. NULL for a NULL group. */
ETP_API const char *etp_group_name(const etp_group_t *group);

typedef enum etp_redop {
    ETP_REDOP_SUM = 0,
    ETP_REDOP_MAX = 1
} etp_redop_t;

/* recv[r*count .. (r+1)*count) = rank r's send[0 .. count). send may equal
 * recv + rank*count (in place). count may be 0. */
ETP_API etp_status_t etp_allgather(etp_group_t *group, int role, const void *send, void *recv,
                                   size_t count, etp_dtype_t dtype, etp_stream_t *stream);

/* recv[0 .. recvcount) = op over ranks of send[rank*recvcount ..). */
ETP_API etp_status_t etp_reduce_scatter(etp_group_t *group, int role, const void *send,
                                        void *recv, size_t recvcount, etp_dtype_t dtype,
                                        etp_redop_t op, etp_stream_t *stream);

/* recv[i] = op over ranks of send[i]; send may equal recv. */
ETP_API etp_status_t etp_allreduce(etp_group_t *group, int role, const void *send, void *recv,
                                   size_t count, etp_dtype_t dtype, etp_redop_t op,
                                   etp_stream_t *stream);

/* Rank r sends sendcounts[p] elements from send + sdispls[p] to rank p, and
 * receives recvcounts[p] elements from p at recv + rdispls[p] (all in
 * elements). The count arrays have group-size entries, are read before the
 * call returns, and recvcounts[p] on this rank must equal sendcounts[me] on p
 * (checked under ETP_CHECK_COLLECTIVES). */
ETP_API etp_status_t etp_alltoallv(etp_group_t *group, int role, const void *send,
                                   const size_t *sendcounts, const size_t *sdispls, void *recv,
                                   const size_t *recvcounts, const size_t *rdispls,
                                   etp_dtype_t dtype, etp_stream_t *stream);

/* Fuse the collectives issued between begin and end into one launch (an NCCL
 * group). Batches nest; the outermost end launches. Collectives of a batch may
 * be on any groups and streams of the context. Only collectives belong in a
 * batch: on CUDA other work enqueued on their streams inside it runs before
 * them (they launch at the end), so etp's calls whose own work reads a
 * collective's result (etp_gather, etp_reduce_grad, EP calls, quantize with a
 * group) refuse inside one (ETP_ERR_INVALID_STATE). */
ETP_API etp_status_t etp_batch_begin(etp_context_t *ctx);
ETP_API etp_status_t etp_batch_end(etp_context_t *ctx);

#ifdef __cplusplus
}
#endif

#endif /* ETP_COMM_H */
