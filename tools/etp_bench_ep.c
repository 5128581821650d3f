/*
 * etp-bench ep: expert-parallel dispatch and combine (etp/ep.h) against a
 * plain grouped send/recv of the same inter-rank bytes, peer copies of
 * combine's bytes over CUDA IPC and a device copy, all measured in the same
 * run, interleaved iteration by iteration.
 *
 *   etp-bench ep [--tokens 4096[,...]] [--hidden 7168] [--topk 8] [--experts 64]
 *                [--skew uniform|zipf:S[,...]]
 *                [--transport exact|capacity[:C]|nvlink|auto[,...]]
 *                [--layout packed|fixed[,...]] [--wire f32|bf16[,...]] [--sms 0]
 *                [--capacity-factor 1.25] [--dtype bf16|f32|mxfp8]
 *                [--align 1] [--unweighted] [--rows N] [--seed 1]
 *   etp-bench ep --ll-tokens 128[,...] [the options above]
 *   (etp-bench ep --help: each option, from ep_opts below)
 *
 * Every combination of the listed tokens, skews, transports, layouts and
 * combine wires is one case (default: exact, capacity at c = 1.25 and
 * nvlink, packed, uniform, FP32 wire, 4096 tokens per rank, H 7168 BF16,
 * top-8 of 64 experts, weighted). A transport the group cannot run
 * (nvlink asked for explicitly: etp_ep_group_create says
 * ETP_ERR_UNSUPPORTED on every rank) skips its case with the reason; auto
 * takes what the library picks. Each case prints a header (the transport
 * taken, num_sms, the combine wire, the layout's and transport's sizes,
 * drops: etp_ep_group_info) and a summary to set beside DeepEP: prepare +
 * dispatch and combine in us, and the logical GB/s of both calls.
 *
 * Routing: each rank draws its own topk_idx on the host (seed + rank): k
 * distinct experts per token, uniformly or by Zipf popularity (expert of
 * popularity rank i has weight 1/(i+1)^S; popularity ranks are a random
 * permutation of the experts, the same on every rank, so hot experts are
 * spread over the ranks the way a trained router spreads them). The same
 * routing is replayed every iteration; the receive capacity is exactly what
 * it needs (the busiest rank's rows, padded to the alignment), or --rows.
 *
 * What one iteration times, each after an MPI barrier, on one stream, with
 * CUDA events (wall clock around synchronized regions on the host backend):
 *   baseline D   ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd on a blocking
 *                communicator of the bench's own (MPI_Alltoallv on the host
 *                backend) moving dispatch's inter-rank bytes, peer by peer
 *   prepare      etp_ep_prepare (EXACT includes its host synchronization)
 *   dispatch     etp_ep_dispatch, split by the EP trace points (etp/trace.h)
 *                into pack | exchange | expand
 *   baseline C   the same baseline moving combine's inter-rank bytes
 *   peer copy    CUDA only: every rank copies to all its peers at once what
 *                combine's exchange sends each, cudaMemcpyAsync straight
 *                into a buffer of the peer's (CUDA IPC), a stream per peer
 *                joined back with events: the copy engines' peer bandwidth
 *   combine      etp_ep_combine, split into pre-sum | exchange | token sum
 *   copy         a device-to-device copy of the expanded rows' bytes
 * Each row of the table is the slowest rank's median. Times are the
 * device's: every timed region is enqueued while the stream is held
 * (bench_hold), and every rank's stream goes at once after a barrier, so
 * neither the host's enqueueing nor the ranks' skew in it is counted, as in
 * a step enqueued ahead of the device (EXACT's prepare, which waits for its
 * stream on the host, is timed unheld).
 *
 * NVLINK on the CUDA backend has no pack (its sending kernel stores the
 * caller's tokens): its dispatch rows are the sending kernel (exchange) and
 * the receiving one (expand), its combine rows the pre-sum into the stage,
 * the sending kernel (exchange) and the token sums.
 *
 * --ll-tokens T[,...] runs, instead, the low-latency comparison at T tokens
 * a rank (run_ll_case): a low-latency layer (etp_ep_ll_dispatch and
 * etp_ep_ll_combine, an nvlink group) against an ordinary layer of a
 * capacity group at --capacity-factor, both groups of max_tokens_per_rank
 * T, the same H, k, E, routing, layout (the first --layout) and wire,
 * timed in the same iterations. Its rows: capacity prepare, dispatch,
 * prepare+dispatch and combine, and "ll dispatch / capacity
 * prepare+dispatch", "ll dispatch / capacity dispatch", "ll combine /
 * capacity combine", whose ratio column is the speed-up (capacity's time
 * over the low-latency call's; the same logical bytes); a summary line
 * says the same.
 *
 * Bytes:
 * - exchange: the token rows that cross between ranks (not a rank's own),
 *   times the row bytes (dispatch: H x dtype + k FP32 weights when
 *   weighted; combine: H x the wire dtype's size, 4 or 2, a partial), for
 *   the rank that sends or receives the most. CAPACITY moves whole slabs,
 *   but only the useful rows count (its wasted slab bytes show as a lower
 *   GB/s). The baselines move exactly these bytes, so ratio = baseline time
 *   / exchange time; combine's exchange / peer copy is the
 *   share of the peer-copy bandwidth the exchange reaches.
 * - logical (whole call rows and the summary): token rows received per
 *   rank, one per (token, destination rank), the rank's own included, times
 *   H x dtype: the metric DeepEP reports, over the whole call (and over
 *   prepare + dispatch, as DeepEP's dispatch also exchanges the counts).
 * - expand and pre-sum: the expanded rows (one per kept (token, expert)),
 *   times H x dtype: what expand writes and pre-sum reads; the copy row
 *   copies the same bytes, so ratio = copy time / kernel time. With MXFP8
 *   dispatch the expand row counts its wire rows' bytes (H + H/32 + padding
 *   a row) against a copy of BF16 rows: that ratio compares bandwidths
 *   (GB/s over GB/s), not times.
 * - pack: the rows it writes (all destinations); token sum: the partials
 *   (wire dtype) it reads. Their ratios are against the copy's GB/s.
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etp/ep.h"
#include "etp_bench.h"
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

enum { MAX_LIST = 8 };

typedef struct {
    int64_t tokens[MAX_LIST];
    int ntokens;
    int64_t ll_tokens[MAX_LIST]; /* --ll-tokens: the low-latency comparison's cases */
    int nll;
    double zipf[MAX_LIST]; /* 0: uniform */
    int nskew;
    etp_ep_transport_t transport[MAX_LIST];
    double cf[MAX_LIST];
    int ntransport;
    etp_ep_layout_t layout[MAX_LIST];
    int nlayout;
    etp_dtype_t wire[MAX_LIST];
    int nwire;
    int64_t hidden, experts, rows;
    int topk, align, weighted, sms;
    etp_dtype_t dtype;
    double default_cf;
    uint64_t seed;
} opts_t;

/* One case, and what its routing implies. */
typedef struct {
    int64_t T, H, E, L;
    int k, align, weighted;
    double zipf, cf;
    etp_dtype_t dt;  /* the group's token dtype */
    size_t es;       /* bytes of a token element in and out (MXFP8: BF16 in, BF16 combine) */
    int mx;          /* MXFP8 dispatch: E4M3 + E8M0 rows on the wire and received */
    etp_ep_transport_t transport; /* asked for (AUTO allowed) */
    etp_ep_layout_t layout;
    etp_dtype_t wire;             /* combine's partials on the wire: F32 or BF16 */
    char shape[128]; /* the table keeps 95 characters (bench_row_t) */
} case_t;

static void die(bench_t *b, const char *what)
{
    fprintf(stderr, "etp-bench rank %d: %s\n", b->rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- phase timer: marks 0 (start) .. 3 (end) on one stream -------------- */

typedef struct {
    bench_t *b;
    etp_stream_t *s;
    int marked[4];
    double t[4];
    /* while set: prepare's exchange and layout points mark 3 and 4 of it */
    bench_seq_t *prep_q;
#if ETP_HAVE_CUDA
    cudaEvent_t ev[4];
#endif
} phases_t;

static void phases_init(phases_t *p, bench_t *b, etp_stream_t *s)
{
    memset(p, 0, sizeof *p);
    p->b = b;
    p->s = s;
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA)
        for (int i = 0; i < 4; i++) BENCH_CUDA(b, cudaEventCreate(&p->ev[i]));
#endif
}

static void phases_fini(phases_t *p)
{
#if ETP_HAVE_CUDA
    if (p->b->backend == ETP_BACKEND_CUDA)
        for (int i = 0; i < 4; i++) BENCH_CUDA(p->b, cudaEventDestroy(p->ev[i]));
#endif
    (void)p;
}

/* Mark i on stream s (the call's stream: the trace callback passes it). */
static void phases_mark(phases_t *p, int i, etp_stream_t *s)
{
    p->marked[i] = 1;
#if ETP_HAVE_CUDA
    if (p->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(p->b, etp_stream_get_cuda(s, &cs));
        BENCH_CUDA(p->b, cudaEventRecord(p->ev[i], cs));
        return;
    }
#endif
    BENCH_CHECK(p->b, etp_stream_synchronize(s));
    p->t[i] = MPI_Wtime();
}

/* The trace points around the exchange of dispatch and combine. */
static void phase_trace(void *user, etp_trace_point_t point, etp_stream_t *s)
{
    phases_t *p = user;
    if (point == ETP_TRACE_EP_PREPARE_EXCHANGE || point == ETP_TRACE_EP_PREPARE_LAYOUT) {
        if (p->prep_q) bench_seq_mark(p->prep_q, point == ETP_TRACE_EP_PREPARE_EXCHANGE ? 3 : 4);
        return;
    }
    if (point == ETP_TRACE_EP_DISPATCH_EXCHANGE || point == ETP_TRACE_EP_COMBINE_EXCHANGE)
        phases_mark(p, 1, s);
    else if (point == ETP_TRACE_EP_DISPATCH_EXPAND || point == ETP_TRACE_EP_COMBINE_SUM)
        phases_mark(p, 2, s);
}

static void phases_start(phases_t *p)
{
    memset(p->marked, 0, sizeof p->marked);
    phases_mark(p, 0, p->s);
}

/* End the region; out[0..2] = the three phases, out[3] = the whole, in us. */
static void phases_stop(phases_t *p, double out[4])
{
    phases_mark(p, 3, p->s);
    bench_release(p->b);
    if (!p->marked[1] || !p->marked[2]) die(p->b, "the EP trace callback was not called");
    BENCH_CHECK(p->b, etp_stream_synchronize(p->s));
    for (int i = 0; i < 4; i++) {
        int a = i < 3 ? i : 0, z = i < 3 ? i + 1 : 3;
#if ETP_HAVE_CUDA
        if (p->b->backend == ETP_BACKEND_CUDA) {
            float ms = 0;
            BENCH_CUDA(p->b, cudaEventElapsedTime(&ms, p->ev[a], p->ev[z]));
            out[i] = 1000.0 * ms;
            continue;
        }
#endif
        out[i] = 1e6 * (p->t[z] - p->t[a]);
    }
}

/* ---- baseline: grouped send/recv of the inter-rank bytes ----------------- */

typedef struct {
    bench_t *b;
    etp_stream_t *s;
    MPI_Comm mpi;
#if ETP_HAVE_CUDA
    ncclComm_t nccl;
#endif
    void *send, *recv;
    size_t cap;                   /* bytes of send and of recv */
    size_t *sc, *sd, *rc, *rd;    /* bytes per peer (self: 0) and offsets */
    int *isc, *isd, *irc, *ird;   /* the same as int, for MPI */
} baseline_t;

static void baseline_init(baseline_t *x, bench_t *b, etp_stream_t *s)
{
    memset(x, 0, sizeof *x);
    x->b = b;
    x->s = s;
    const size_t R = (size_t)b->size;
    x->sc = calloc(4 * R, sizeof(size_t));
    x->isc = calloc(4 * R, sizeof(int));
    if (!x->sc || !x->isc) die(b, "out of host memory");
    x->sd = x->sc + R;
    x->rc = x->sd + R;
    x->rd = x->rc + R;
    x->isd = x->isc + R;
    x->irc = x->isd + R;
    x->ird = x->irc + R;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &x->mpi) != MPI_SUCCESS) die(b, "MPI_Comm_dup failed");
#if ETP_HAVE_CUDA
    if (b->backend == ETP_BACKEND_CUDA) {
        ncclUniqueId id;
        if (b->rank == 0) BENCH_CUDA(b, ncclGetUniqueId(&id));
        if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
            die(b, "MPI_Bcast failed");
        int dev = 0;
        BENCH_CHECK(b, etp_context_cuda_device(b->ctx, &dev));
        BENCH_CUDA(b, cudaSetDevice(dev));
        /* blocking (the default config): the plain NCCL a user would call */
        BENCH_CUDA(b, ncclCommInitRank(&x->nccl, b->size, id, b->rank));
    }
#endif
}

static void baseline_fini(baseline_t *x)
{
#if ETP_HAVE_CUDA
    if (x->b->backend == ETP_BACKEND_CUDA) BENCH_CUDA(x->b, ncclCommDestroy(x->nccl));
#endif
    MPI_Comm_free(&x->mpi);
    free(x->sc);
    free(x->isc);
}

/* Per-peer byte counts: send rows_to[p] rows of send_row bytes to p and
 * receive rows_from[p] rows of recv_row bytes from p, self excluded. */
static void baseline_set(baseline_t *x, const int64_t *rows_to, size_t send_row,
                         const int64_t *rows_from, size_t recv_row)
{
    size_t so = 0, ro = 0;
    for (int p = 0; p < x->b->size; p++) {
        int self = p == x->b->rank;
        x->sc[p] = self ? 0 : (size_t)rows_to[p] * send_row;
        x->rc[p] = self ? 0 : (size_t)rows_from[p] * recv_row;
        x->sd[p] = so;
        x->rd[p] = ro;
        so += x->sc[p];
        ro += x->rc[p];
        if (so > INT32_MAX || ro > INT32_MAX) die(x->b, "baseline: more than 2 GiB per rank");
        x->isc[p] = (int)x->sc[p];
        x->isd[p] = (int)x->sd[p];
        x->irc[p] = (int)x->rc[p];
        x->ird[p] = (int)x->rd[p];
    }
    if (so > x->cap || ro > x->cap) die(x->b, "baseline: buffers too small");
}

static void baseline_run(baseline_t *x)
{
#if ETP_HAVE_CUDA
    if (x->b->backend == ETP_BACKEND_CUDA) {
        cudaStream_t cs;
        BENCH_CHECK(x->b, etp_stream_get_cuda(x->s, &cs));
        const char *send = x->send;
        char *recv = x->recv;
        BENCH_CUDA(x->b, ncclGroupStart());
        for (int p = 0; p < x->b->size; p++) {
            if (x->sc[p]) BENCH_CUDA(x->b, ncclSend(send + x->sd[p], x->sc[p], ncclUint8, p, x->nccl, cs));
            if (x->rc[p]) BENCH_CUDA(x->b, ncclRecv(recv + x->rd[p], x->rc[p], ncclUint8, p, x->nccl, cs));
        }
        BENCH_CUDA(x->b, ncclGroupEnd());
        return;
    }
#endif
    BENCH_CHECK(x->b, etp_stream_synchronize(x->s));
    if (MPI_Alltoallv(x->send, x->isc, x->isd, MPI_BYTE, x->recv, x->irc, x->ird, MPI_BYTE,
                      x->mpi) != MPI_SUCCESS)
        die(x->b, "MPI_Alltoallv failed");
}

/* ---- baseline: peer copies over CUDA IPC (CUDA only) -------------------- */

/* Every rank copies, to all its peers at once, what it sends each of them
 * (per peer its own bytes) straight into a buffer on that peer: one
 * cudaMemcpyAsync per peer, each on a stream of its own, forked from and
 * joined back into the bench's stream with events. What the copy engines
 * reach over the links this way is the bandwidth a device-initiated
 * exchange is judged against. */
typedef struct {
    bench_t *b;
    etp_stream_t *s;
    int on;              /* the CUDA backend */
    size_t *send, *src;  /* bytes to each peer and their offsets in the source */
    size_t *dst;         /* where they land in the peer's buffer */
#if ETP_HAVE_CUDA
    void *mine;          /* this rank's buffer, exported to the peers */
    void **peer;         /* the peers' buffers, opened here (self: NULL) */
    const char *from;    /* the source, a device buffer of this rank */
    cudaStream_t *st;    /* one a peer (self: unused) */
    cudaEvent_t fork, *join;
#endif
} peercopy_t;

static void peercopy_init(peercopy_t *pc, bench_t *b, etp_stream_t *s)
{
    memset(pc, 0, sizeof *pc);
    pc->b = b;
    pc->s = s;
    const size_t R = (size_t)b->size;
    pc->send = calloc(3 * R, sizeof(size_t));
    if (!pc->send) die(b, "out of host memory");
    pc->src = pc->send + R;
    pc->dst = pc->src + R;
#if ETP_HAVE_CUDA
    pc->on = b->backend == ETP_BACKEND_CUDA;
    if (!pc->on) return;
    pc->peer = calloc(R, sizeof *pc->peer);
    pc->st = calloc(R, sizeof *pc->st);
    pc->join = calloc(R, sizeof *pc->join);
    if (!pc->peer || !pc->st || !pc->join) die(b, "out of host memory");
    BENCH_CUDA(b, cudaEventCreateWithFlags(&pc->fork, cudaEventDisableTiming));
    for (int p = 0; p < b->size; p++) {
        if (p == b->rank) continue;
        BENCH_CUDA(b, cudaStreamCreateWithFlags(&pc->st[p], cudaStreamNonBlocking));
        BENCH_CUDA(b, cudaEventCreateWithFlags(&pc->join[p], cudaEventDisableTiming));
    }
#endif
}

static void peercopy_fini(peercopy_t *pc)
{
#if ETP_HAVE_CUDA
    if (pc->on) {
        for (int p = 0; p < pc->b->size; p++) {
            if (p == pc->b->rank) continue;
            BENCH_CUDA(pc->b, cudaStreamDestroy(pc->st[p]));
            BENCH_CUDA(pc->b, cudaEventDestroy(pc->join[p]));
        }
        BENCH_CUDA(pc->b, cudaEventDestroy(pc->fork));
        free(pc->peer);
        free(pc->st);
        free(pc->join);
    }
#endif
    free(pc->send);
}

/* Collective. rows_to[p]: rows of row_bytes this rank sends p; rows_from[p]:
 * what it receives from p; src: the device buffer they are read from (per
 * peer one after the other). Allocates this rank's receive buffer, exports
 * it and opens the peers'. */
static void peercopy_open(peercopy_t *pc, const int64_t *rows_to, const int64_t *rows_from,
                          size_t row_bytes, const void *src)
{
    if (!pc->on) return;
#if ETP_HAVE_CUDA
    bench_t *b = pc->b;
    const int R = b->size, me = b->rank;
    size_t *recv_off = calloc((size_t)R, sizeof *recv_off);
    cudaIpcMemHandle_t *h = calloc((size_t)R, sizeof *h);
    if (!recv_off || !h) die(b, "out of host memory");
    size_t so = 0, ro = 0;
    for (int p = 0; p < R; p++) {
        pc->send[p] = p == me ? 0 : (size_t)rows_to[p] * row_bytes;
        pc->src[p] = so;
        so += pc->send[p];
        recv_off[p] = ro;
        ro += p == me ? 0 : (size_t)rows_from[p] * row_bytes;
    }
    /* each sender learns where its bytes start in each receiver's buffer */
    if (MPI_Alltoall(recv_off, (int)sizeof(size_t), MPI_BYTE, pc->dst, (int)sizeof(size_t),
                     MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(b, "MPI_Alltoall failed");
    BENCH_CUDA(b, cudaMalloc(&pc->mine, ro ? ro : 1));
    BENCH_CUDA(b, cudaIpcGetMemHandle(&h[me], pc->mine));
    if (MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, h, (int)sizeof *h, MPI_BYTE, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        die(b, "MPI_Allgather failed");
    for (int p = 0; p < R; p++)
        if (p != me)
            BENCH_CUDA(b, cudaIpcOpenMemHandle(&pc->peer[p], h[p],
                                               cudaIpcMemLazyEnablePeerAccess));
    pc->from = src;
    free(recv_off);
    free(h);
#else
    (void)rows_to, (void)rows_from, (void)row_bytes, (void)src;
#endif
}

/* Enqueue the copies on the bench's stream (forked and joined there). */
static void peercopy_run(peercopy_t *pc)
{
#if ETP_HAVE_CUDA
    bench_t *b = pc->b;
    cudaStream_t cs;
    BENCH_CHECK(b, etp_stream_get_cuda(pc->s, &cs));
    BENCH_CUDA(b, cudaEventRecord(pc->fork, cs));
    for (int p = 0; p < b->size; p++) {
        if (p == b->rank || pc->send[p] == 0) continue;
        BENCH_CUDA(b, cudaStreamWaitEvent(pc->st[p], pc->fork, 0));
        BENCH_CUDA(b, cudaMemcpyAsync((char *)pc->peer[p] + pc->dst[p], pc->from + pc->src[p],
                                      pc->send[p], cudaMemcpyDeviceToDevice, pc->st[p]));
        BENCH_CUDA(b, cudaEventRecord(pc->join[p], pc->st[p]));
        BENCH_CUDA(b, cudaStreamWaitEvent(cs, pc->join[p], 0));
    }
#else
    (void)pc;
#endif
}

/* Collective: close the peers' buffers, then (no peer writing any more)
 * free this rank's. */
static void peercopy_close(peercopy_t *pc)
{
    if (!pc->on) return;
#if ETP_HAVE_CUDA
    bench_t *b = pc->b;
    for (int p = 0; p < b->size; p++) {
        if (p == b->rank) continue;
        BENCH_CUDA(b, cudaStreamSynchronize(pc->st[p]));
        BENCH_CUDA(b, cudaIpcCloseMemHandle(pc->peer[p]));
        pc->peer[p] = NULL;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    BENCH_CUDA(b, cudaFree(pc->mine));
    pc->mine = NULL;
#endif
}

/* ---- routing ------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* topk_idx [T, k]: k distinct experts per token, drawn without replacement
 * by weight (uniform, or Zipf over a permutation common to all ranks). */
static void make_routing(bench_t *b, const case_t *c, uint64_t seed, int64_t *idx)
{
    const int64_t E = c->E;
    double *w = malloc((size_t)E * sizeof *w), *left = malloc((size_t)E * sizeof *left);
    int64_t *perm = malloc((size_t)E * sizeof *perm);
    if (!w || !left || !perm) die(b, "out of host memory");
    uint64_t common = seed ^ 0x5bd1e995ull;
    for (int64_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t e = E - 1; e > 0; e--) {
        int64_t j = (int64_t)(rng_next(&common) % (uint64_t)(e + 1));
        int64_t t = perm[e];
        perm[e] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < E; i++) w[perm[i]] = c->zipf > 0 ? pow((double)(i + 1), -c->zipf) : 1.0;
    uint64_t st = seed + 0x1000003ull * (uint64_t)(b->rank + 1);
    for (int64_t t = 0; t < c->T; t++) {
        double total = 0;
        for (int64_t e = 0; e < E; e++) total += (left[e] = w[e]);
        for (int j = 0; j < c->k; j++) {
            double u = rng_unit(&st) * total, acc = 0;
            int64_t pick = -1, last = -1;
            for (int64_t e = 0; e < E && pick < 0; e++) {
                if (left[e] <= 0) continue;
                last = e;
                acc += left[e];
                if (u < acc) pick = e;
            }
            if (pick < 0) pick = last; /* u at the rounded top of the sum */
            idx[t * c->k + j] = pick;
            total -= left[pick];
            left[pick] = 0;
        }
    }
    free(w);
    free(left);
    free(perm);
}

/* ---- one case ------------------------------------------------------------ */

static const char *transport_name(etp_ep_transport_t t)
{
    switch (t) {
    case ETP_EP_TRANSPORT_EXACT: return "exact";
    case ETP_EP_TRANSPORT_CAPACITY: return "capacity";
    case ETP_EP_TRANSPORT_NVLINK: return "nvlink";
    default: return "auto";
    }
}

/* The case's name in the table: the transport taken (after "auto:" when
 * AUTO chose it), with capacity's factor; the combine wire when BF16. */
static void case_shape(case_t *c, etp_ep_transport_t taken, double cf)
{
    char tr[32], sk[32];
    int n = snprintf(tr, sizeof tr, "%s%s", c->transport == ETP_EP_TRANSPORT_AUTO ? "auto:" : "",
                     transport_name(taken));
    if (taken == ETP_EP_TRANSPORT_CAPACITY && n > 0 && (size_t)n < sizeof tr)
        snprintf(tr + n, sizeof tr - (size_t)n, ":%g", cf);
    if (c->zipf > 0)
        snprintf(sk, sizeof sk, "zipf:%g", c->zipf);
    else
        snprintf(sk, sizeof sk, "uniform");
    snprintf(c->shape, sizeof c->shape, "%s %s %s T%lld H%lld k%d E%lld %s%s%s", tr,
             c->layout == ETP_EP_LAYOUT_PACKED ? "packed" : "fixed", sk, (long long)c->T,
             (long long)c->H, c->k, (long long)c->E, c->mx ? "mxfp8" : etp_dtype_name(c->dt),
             c->weighted ? "" : " unw", c->wire == ETP_DTYPE_BF16 ? " wire bf16" : "");
}

typedef struct {
    double base_d, prep, prep_ph[3], d[4], prep_d, base_c, peer, c[4], copy;
} sample_t;

static void fill_tokens(bench_t *b, const case_t *c, etp_stream_t *s, void *dev, uint64_t seed)
{
    const size_t n = (size_t)c->T * (size_t)c->H;
    void *h = malloc(n * c->es);
    if (!h) die(b, "out of host memory");
    uint64_t st = seed * 31 + (uint64_t)b->rank;
    for (size_t i = 0; i < n; i++) {
        float v = (float)(rng_unit(&st) * 2.0 - 1.0);
        if (c->dt == ETP_DTYPE_F32) {
            ((float *)h)[i] = v;
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)h)[i] = (uint16_t)(u >> 16); /* truncation: any bf16 value does */
        }
    }
    BENCH_CHECK(b, etp_memcpy_async(s, dev, h, n * c->es));
    BENCH_CHECK(b, etp_stream_synchronize(s));
    free(h);
}

static double med_max(bench_t *b, double *v, int stride, int n)
{
    double *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) die(b, "out of host memory");
    for (int i = 0; i < n; i++) tmp[i] = v[(size_t)i * (size_t)stride];
    double m = bench_median(tmp, n);
    free(tmp);
    return bench_max_over_ranks(m);
}

static double max_over_ranks_i(int64_t x)
{
    return bench_max_over_ranks((double)x);
}

/* The receive capacity (rows) of a case from the experts' row counts of
 * every rank (ecnt [E], summed over ranks): what the busiest rank's layout
 * needs, or --rows; *slots: FIXED_SLOTS' slots per expert (the largest
 * aligned block). */
static int64_t layout_capacity(const opts_t *o, const case_t *c, int R, const int64_t *ecnt,
                               int64_t *slots)
{
    const int64_t a = c->align > 1 ? c->align : 1, L = c->L;
    int64_t need_packed = 0;
    *slots = a;
    for (int r = 0; r < R; r++) {
        int64_t n = 0;
        for (int64_t e = r * L; e < (r + 1) * L; e++) {
            int64_t pad = (ecnt[e] + a - 1) / a * a;
            n += pad;
            if (pad > *slots) *slots = pad;
        }
        if (n > need_packed) need_packed = n;
    }
    if (o->rows > 0) return (o->rows + a - 1) / a * a;
    if (c->layout == ETP_EP_LAYOUT_FIXED_SLOTS) return *slots * L;
    return need_packed > a ? need_packed : a;
}

/* A case's group: its shape, drops (never the OVERFLOW error), wire and
 * num_sms; transport and capacity factor are the caller's. */
static etp_ep_group_config_t group_config(const opts_t *o, const case_t *c, const char *name,
                                          int64_t E, int64_t H, int64_t T, int k, int64_t cap)
{
    etp_ep_group_config_t gc = ETP_EP_GROUP_CONFIG_INIT;
    gc.name = name;
    gc.num_experts = E;
    gc.hidden = H;
    gc.token_dtype = c->dt;
    gc.max_tokens_per_rank = T;
    gc.max_topk = k;
    gc.recv_capacity_per_rank = cap;
    gc.overflow = ETP_EP_OVERFLOW_DROP;
    gc.combine_wire = c->wire;
    gc.num_sms = o->sms;
    return gc;
}

static void run_case(bench_t *b, const opts_t *o, case_t *c, etp_group_t *world,
                     etp_stream_t *s, baseline_t *base, peercopy_t *pc, phases_t *ph,
                     bench_timer_t *tm)
{
    const int R = b->size, me = b->rank;
    const int64_t T = c->T, H = c->H, E = c->E, L = c->L;
    const int k = c->k;
    const size_t rb = (size_t)H * c->es;

    /* Routing and what it implies, on the host. */
    int64_t *idx = malloc((size_t)T * (size_t)k * sizeof *idx);
    float *wts = malloc((size_t)T * (size_t)k * sizeof *wts);
    int64_t *to = calloc((size_t)R, sizeof *to), *from = calloc((size_t)R, sizeof *from);
    int64_t *ecnt = calloc((size_t)E, sizeof *ecnt);
    char *hit = malloc((size_t)R);
    if (!idx || !wts || !to || !from || !ecnt || !hit) die(b, "out of host memory");
    make_routing(b, c, o->seed, idx);
    uint64_t wst = o->seed * 7 + (uint64_t)me;
    for (int64_t i = 0; i < T * k; i++) wts[i] = (float)(0.05 + 0.9 * rng_unit(&wst));
    for (int64_t t = 0; t < T; t++) {
        memset(hit, 0, (size_t)R);
        for (int j = 0; j < k; j++) {
            int64_t e = idx[t * k + j];
            ecnt[e]++;
            hit[e / L] = 1;
        }
        for (int d = 0; d < R; d++) to[d] += hit[d];
    }
    if (MPI_Allreduce(MPI_IN_PLACE, ecnt, (int)E, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(b, "MPI_Allreduce failed");

    /* Receive capacity: what the busiest rank's layout needs, or --rows. */
    const int64_t a = c->align > 1 ? c->align : 1;
    int64_t slots = a;
    const int64_t cap = layout_capacity(o, c, R, ecnt, &slots);
    int64_t expanded_me = 0;
    for (int64_t e = (int64_t)me * L; e < (int64_t)(me + 1) * L; e++) expanded_me += ecnt[e];

    etp_ep_group_config_t gc = group_config(o, c, "bench", E, H, T, k, cap);
    gc.transport = c->transport;
    /* AUTO may take capacity (ETP_EP_TRANSPORT in the environment) */
    gc.capacity_factor = c->cf > 0 ? c->cf : o->default_cf;
    etp_ep_group_t *ep = NULL;
    const etp_status_t made = etp_ep_group_create(world, &gc, &ep);
    /* nvlink asked for where it cannot run: that case is skipped, the
     * others run (creation is collective: every rank answers alike) */
    const double others = bench_max_over_ranks(made == ETP_ERR_UNSUPPORTED ? 0.0 : 1.0);
    if (made == ETP_ERR_UNSUPPORTED && others == 0) {
        if (me == 0) {
            case_shape(c, c->transport, gc.capacity_factor);
            printf("etp-bench ep: %s: skipped: %s\n", c->shape, etp_last_error());
            fflush(stdout);
        }
        free(idx);
        free(wts);
        free(to);
        free(from);
        free(ecnt);
        free(hit);
        return;
    }
    BENCH_CHECK(b, made);
    etp_ep_group_info_t info = ETP_EP_GROUP_INFO_INIT;
    BENCH_CHECK(b, etp_ep_group_info(ep, &info));
    case_shape(c, info.transport, gc.capacity_factor);
    /* NVLINK on CUDA: no pack phase */
    const int fused = info.transport == ETP_EP_TRANSPORT_NVLINK && b->backend == ETP_BACKEND_CUDA;
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.name = "moe";
    lc.topk = k;
    lc.alignment = (int)a;
    lc.layout = c->layout;
    lc.weighted = c->weighted;
    lc.slots_per_expert = c->layout == ETP_EP_LAYOUT_FIXED_SLOTS && o->rows == 0 ? slots : 0;
    etp_ep_layer_t *ly;
    BENCH_CHECK(b, etp_ep_layer_create(ep, &lc, &ly));
    int64_t rows = 0;
    BENCH_CHECK(b, etp_ep_layer_rows(ly, &rows));
    BENCH_CHECK(b, etp_ep_group_set_trace(ep, phase_trace, ph));

    /* Rows that actually cross: CAPACITY sends at most a slab per peer. */
    for (int d = 0; d < R; d++)
        if (info.transport == ETP_EP_TRANSPORT_CAPACITY && to[d] > info.slab_rows)
            to[d] = info.slab_rows;
    if (MPI_Alltoall(to, 1, MPI_INT64_T, from, 1, MPI_INT64_T, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(b, "MPI_Alltoall failed");
    int64_t x_to = 0, x_from = 0, all_to = 0, all_from = 0;
    for (int p = 0; p < R; p++) {
        all_to += to[p];
        all_from += from[p];
        if (p == me) continue;
        x_to += to[p];
        x_from += from[p];
    }
    /* MXFP8: a wire row holds H data and H/32 scale bytes (padded to 16);
     * what dispatch delivers per row is H + H/32 bytes; combine stays BF16.
     * Combine's partials travel in the wire dtype (FP32 or BF16). */
    const size_t wrow = c->mx ? info.wire_row_bytes : rb;
    const size_t xrow = c->mx ? (size_t)(H + H / ETP_EP_MXFP8_BLOCK) : rb;
    const size_t drow = wrow + (c->weighted ? (size_t)k * 4 : 0);
    const size_t crow = (size_t)H * etp_dtype_size(info.combine_wire);
    const double x_rows = max_over_ranks_i(x_to > x_from ? x_to : x_from);
    const double bytes_xd = x_rows * (double)drow, bytes_xc = x_rows * (double)crow;
    const double bytes_logical_d = max_over_ranks_i(all_from) * (double)xrow;
    const double bytes_logical = max_over_ranks_i(all_from) * (double)rb;
    const double bytes_pack = max_over_ranks_i(all_to) * (double)wrow;
    const double bytes_sum = max_over_ranks_i(all_to) * (double)crow;

    /* Buffers. */
    void *tokens, *topk_idx, *topk_w, *recv, *recv_w, *out, *recv_sc = NULL, *ein = NULL;
    etp_context_t *ctx = b->ctx;
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * rb, ETP_MEM_WORKSPACE, &tokens));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * (size_t)k * 8, ETP_MEM_WORKSPACE, &topk_idx));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * (size_t)k * 4, ETP_MEM_WORKSPACE, &topk_w));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * rb, ETP_MEM_WORKSPACE, &recv));
    if (c->mx) {
        /* E4M3 rows land in recv (H bytes each), scales beside; the expert
         * outputs combine reads are BF16 rows of their own */
        BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * (size_t)(H / ETP_EP_MXFP8_BLOCK), ETP_MEM_WORKSPACE,
                                     &recv_sc));
        BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * rb, ETP_MEM_WORKSPACE, &ein));
        BENCH_CHECK(b, etp_memset_async(s, ein, 0, (size_t)rows * rb));
    }
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * 4, ETP_MEM_WORKSPACE, &recv_w));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * rb, ETP_MEM_WORKSPACE, &out));
    size_t bcap = 1;
    {
        size_t sd = (size_t)x_to * drow, rd = (size_t)x_from * drow;
        size_t sc = (size_t)x_from * crow, rc = (size_t)x_to * crow;
        size_t m[4] = {sd, rd, sc, rc};
        for (int i = 0; i < 4; i++)
            if (m[i] > bcap) bcap = m[i];
    }
    base->cap = bcap;
    BENCH_CHECK(b, etp_mem_alloc(ctx, bcap, ETP_MEM_WORKSPACE, &base->send));
    BENCH_CHECK(b, etp_mem_alloc(ctx, bcap, ETP_MEM_WORKSPACE, &base->recv));
    BENCH_CHECK(b, etp_memset_async(s, base->send, 1, bcap));
    BENCH_CHECK(b, etp_memcpy_async(s, topk_idx, idx, (size_t)T * (size_t)k * 8));
    BENCH_CHECK(b, etp_memcpy_async(s, topk_w, wts, (size_t)T * (size_t)k * 4));
    BENCH_CHECK(b, etp_stream_synchronize(s));
    fill_tokens(b, c, s, tokens, o->seed);

    /* The rows etp lays out: the routing's, less what a full slab dropped
     * (reported below); without drops they must match the count above. */
    BENCH_CHECK(b, etp_ep_prepare(ly, topk_idx, ETP_DTYPE_I64, T, NULL, s));
    int64_t expanded = 0;
    {
        int32_t *cnt = malloc((size_t)L * sizeof *cnt);
        if (!cnt) die(b, "out of host memory");
        BENCH_CHECK(b, etp_ep_layout_host(ly, s, cnt, NULL));
        for (int64_t e = 0; e < L; e++) expanded += cnt[e];
        free(cnt);
        etp_ep_report_t rep = ETP_EP_REPORT_INIT;
        BENCH_CHECK(b, etp_ep_check(ly, &rep));
        if (expanded != expanded_me && rep.flags == 0)
            fprintf(stderr, "etp-bench ep rank %d: %s: %lld rows laid out, the routing has %lld\n",
                    me, c->shape, (long long)expanded, (long long)expanded_me);
    }
    const double bytes_exp = max_over_ranks_i(expanded) * (double)rb;
    const double bytes_exp_d = max_over_ranks_i(expanded) * (double)xrow;
    /* the copy baseline copies the expanded bytes out of the received rows */
    void *copy_dst;
    const size_t copy_bytes = (size_t)expanded * rb;
    BENCH_CHECK(b, etp_mem_alloc(ctx, copy_bytes ? copy_bytes : 1, ETP_MEM_WORKSPACE, &copy_dst));

    /* combine's bytes per peer: the partials of the rows this rank received */
    peercopy_open(pc, from, to, crow, base->send);

    const int n = b->iters;
    sample_t *smp = calloc((size_t)n, sizeof *smp);
    if (!smp) die(b, "out of host memory");
    const void *wptr = c->weighted ? topk_w : NULL;
    float *rwptr = c->weighted ? recv_w : NULL;
    bench_seq_t *pq = bench_seq_create(b, s, 6);
    for (int it = -b->warmup; it < n; it++) {
        sample_t x;
        baseline_set(base, to, drow, from, drow);
        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        bench_timer_start(tm);
        baseline_run(base);
        bench_timer_stop(tm);
        x.base_d = bench_timer_us(tm);

        MPI_Barrier(MPI_COMM_WORLD);
        if (info.transport == ETP_EP_TRANSPORT_EXACT) {
            /* EXACT's prepare waits for its stream on the host: not held */
            bench_timer_start(tm);
            BENCH_CHECK(b, etp_ep_prepare(ly, topk_idx, ETP_DTYPE_I64, T, NULL, s));
            bench_timer_stop(tm);
            x.prep = bench_timer_us(tm);
            x.prep_ph[0] = x.prep_ph[1] = x.prep_ph[2] = 0;
        } else {
            /* held, three back to back: the second's time (the first pays
             * the device's start after the hold), and the third's phases
             * (route, exchange, layout: marks 2-3, 3-4, 4-5; apart, as the
             * marks between them take time of their own) */
            bench_hold(b, s);
            bench_seq_mark(pq, 0);
            for (int r = 1; r <= 3; r++) {
                ph->prep_q = r == 3 ? pq : NULL;
                BENCH_CHECK(b, etp_ep_prepare(ly, topk_idx, ETP_DTYPE_I64, T, NULL, s));
                bench_seq_mark(pq, r == 3 ? 5 : r);
            }
            ph->prep_q = NULL;
            x.prep = bench_seq_us(pq, 1, 2);
            for (int i = 0; i < 3; i++) x.prep_ph[i] = bench_seq_us(pq, 2 + i, 3 + i);
        }

        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        phases_start(ph);
        if (c->mx) {
            etp_ep_dispatch_args_t da = ETP_EP_DISPATCH_ARGS_INIT;
            da.tokens = tokens;
            da.dtype = ETP_DTYPE_BF16;
            da.topk_weights = wptr;
            da.recv_tokens = recv;
            da.recv_scales = recv_sc;
            da.recv_weights = rwptr;
            da.rows = rows;
            BENCH_CHECK(b, etp_ep_dispatch_ex(ly, &da, s));
        } else {
            BENCH_CHECK(b, etp_ep_dispatch(ly, tokens, c->dt, wptr, ETP_DTYPE_F32, recv, rwptr, rows, s));
        }
        phases_stop(ph, x.d);
        x.prep_d = x.prep + x.d[3];

        baseline_set(base, from, crow, to, crow);
        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        bench_timer_start(tm);
        baseline_run(base);
        bench_timer_stop(tm);
        x.base_c = bench_timer_us(tm);

        x.peer = 0;
        if (pc->on) {
            MPI_Barrier(MPI_COMM_WORLD);
            bench_hold(b, s);
            bench_timer_start(tm);
            peercopy_run(pc);
            bench_timer_stop(tm);
            x.peer = bench_timer_us(tm);
        }

        /* the received rows stand in for the expert outputs */
        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        phases_start(ph);
        BENCH_CHECK(b, etp_ep_combine(ly, c->mx ? ein : recv, c->mx ? ETP_DTYPE_BF16 : c->dt, rows, out, s));
        phases_stop(ph, x.c);

        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        bench_timer_start(tm);
        if (copy_bytes) BENCH_CHECK(b, etp_memcpy_async(s, copy_dst, recv, copy_bytes));
        bench_timer_stop(tm);
        x.copy = bench_timer_us(tm);
        if (it >= 0) smp[it] = x;
    }
    bench_seq_destroy(pq);
    etp_ep_report_t rep = ETP_EP_REPORT_INIT;
    BENCH_CHECK(b, etp_ep_check(ly, &rep));
    const double dropped =
        bench_max_over_ranks((double)(rep.transport_dropped_slots + rep.rows_dropped_slots) /
                             (double)(rep.prepares > 0 ? rep.prepares : 1));

    /* Table rows (every rank computes the same maxima; rank 0 prints). */
    const int st = (int)(sizeof(sample_t) / sizeof(double));
    double *v = (double *)smp;
    const int o_bd = (int)(offsetof(sample_t, base_d) / sizeof(double));
    const int o_pr = (int)(offsetof(sample_t, prep) / sizeof(double));
    const int o_d = (int)(offsetof(sample_t, d) / sizeof(double));
    const int o_bc = (int)(offsetof(sample_t, base_c) / sizeof(double));
    const int o_c = (int)(offsetof(sample_t, c) / sizeof(double));
    const int o_cp = (int)(offsetof(sample_t, copy) / sizeof(double));
    const int o_pd = (int)(offsetof(sample_t, prep_d) / sizeof(double));
    const int o_pe = (int)(offsetof(sample_t, peer) / sizeof(double));
    double us_bd = med_max(b, v + o_bd, st, n), us_bc = med_max(b, v + o_bc, st, n);
    double us_prep = med_max(b, v + o_pr, st, n), us_copy = med_max(b, v + o_cp, st, n);
    double us_pd = med_max(b, v + o_pd, st, n), us_peer = med_max(b, v + o_pe, st, n);
    double us_d[4], us_c[4], us_pp[3];
    const int o_pp = (int)(offsetof(sample_t, prep_ph) / sizeof(double));
    for (int i = 0; i < 3; i++) us_pp[i] = med_max(b, v + o_pp + i, st, n);
    for (int i = 0; i < 4; i++) {
        us_d[i] = med_max(b, v + o_d + i, st, n);
        us_c[i] = med_max(b, v + o_c + i, st, n);
    }
    const int cuda = b->backend == ETP_BACKEND_CUDA;
    const char *bname = cuda ? "nccl send/recv" : "MPI_Alltoallv";
    char nm[64];
    const char *sh = c->shape;
    bench_row_t *cp = bench_add(b, "copy: expanded rows", sh, bytes_exp, us_copy, 0);
    const double copy_gbps = cp->gbps;
    bench_add(b, "ep prepare", sh, 0, us_prep, 0);
    if (info.transport != ETP_EP_TRANSPORT_EXACT) {
        /* the phases' medians (each the slowest rank's): they need not sum
         * to the whole's */
        bench_add(b, "prepare: route", sh, 0, us_pp[0], 0);
        bench_add(b, "prepare: exchange", sh, 0, us_pp[1], 0);
        bench_add(b, "prepare: layout", sh, 0, us_pp[2], 0);
    }
    snprintf(nm, sizeof nm, "%s: dispatch bytes", bname);
    bench_row_t *bd = bench_add(b, nm, sh, bytes_xd, us_bd, 0);
    const double gbps_ld =
        bench_add(b, "dispatch: whole call (logical)", sh, bytes_logical_d, us_d[3], 0)->gbps;
    const double gbps_lpd =
        bench_add(b, "prepare+dispatch (logical)", sh, bytes_logical_d, us_pd, 0)->gbps;
    /* NVLINK on CUDA has no pack: its sending kernel stores the tokens */
    if (!fused) bench_add(b, "dispatch: pack / copy", sh, bytes_pack, us_d[0], copy_gbps);
    bench_add(b, "dispatch: exchange / send-recv", sh, bytes_xd, us_d[1], bd->gbps);
    bench_add(b, "dispatch: expand / copy", sh, bytes_exp_d, us_d[2], copy_gbps);
    snprintf(nm, sizeof nm, "%s: combine bytes", bname);
    bench_row_t *bc = bench_add(b, nm, sh, bytes_xc, us_bc, 0);
    double peer_gbps = 0, peer_ratio = 0;
    if (pc->on)
        peer_gbps = bench_add(b, "peer copy: combine bytes", sh, bytes_xc, us_peer, 0)->gbps;
    const double gbps_lc =
        bench_add(b, "combine: whole call (logical)", sh, bytes_logical, us_c[3], 0)->gbps;
    bench_add(b, "combine: pre-sum / copy", sh, bytes_exp, us_c[0], copy_gbps);
    bench_add(b, "combine: exchange / send-recv", sh, bytes_xc, us_c[1], bc->gbps);
    if (pc->on)
        peer_ratio = bench_add(b, "combine: exchange / peer copy", sh, bytes_xc, us_c[1],
                               peer_gbps)->ratio;
    bench_add(b, "combine: token sum / copy", sh, bytes_sum, us_c[2], copy_gbps);
    if (me == 0) {
        char per_peer[64];
        if (info.transport == ETP_EP_TRANSPORT_CAPACITY)
            snprintf(per_peer, sizeof per_peer, "slab %lld rows per peer",
                     (long long)info.slab_rows);
        else if (info.transport == ETP_EP_TRANSPORT_NVLINK)
            snprintf(per_peer, sizeof per_peer, "a slab of %lld rows per source rank",
                     (long long)info.slab_rows);
        else
            snprintf(per_peer, sizeof per_peer, "exact, up to %lld rows per peer", (long long)T);
        printf("etp-bench ep: %s: transport %s%s, num_sms %d, combine wire %s, layout rows "
               "%lld per rank, receive buffer %lld token rows, %s, %.1f slots dropped per "
               "prepare (busiest rank)%s\n",
               sh, transport_name(info.transport),
               c->transport == ETP_EP_TRANSPORT_AUTO ? " (auto)" : "", info.num_sms,
               etp_dtype_name(info.combine_wire), (long long)rows, (long long)info.recv_token_rows,
               per_peer, dropped, fused ? "; no pack (the sending kernel stores the tokens)" : "");
        /* the figures to set beside DeepEP's: its dispatch (without a
         * cached layout) also exchanges the counts, as prepare does here */
        printf("etp-bench ep: %s: prepare+dispatch %.1f us, combine %.1f us; logical GB/s "
               "(DeepEP's metric): dispatch %.1f (prepare+dispatch %.1f), combine %.1f",
               sh, us_pd, us_c[3], gbps_ld, gbps_lpd, gbps_lc);
        if (pc->on)
            printf("; combine exchange / peer copy %.3f", peer_ratio);
        printf("\n");
        fflush(stdout);
    }
    peercopy_close(pc);

    free(smp);
    BENCH_CHECK(b, etp_stream_synchronize(s));
    BENCH_CHECK(b, etp_ep_group_set_trace(ep, NULL, NULL));
    BENCH_CHECK(b, etp_ep_layer_destroy(ly));
    BENCH_CHECK(b, etp_ep_group_destroy(ep));
    void *bufs[] = {tokens, topk_idx, topk_w, recv, recv_w, out, copy_dst, base->send, base->recv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) BENCH_CHECK(b, etp_mem_free(ctx, bufs[i]));
    BENCH_CHECK(b, etp_mem_free(ctx, recv_sc)); /* NULL unless MXFP8: a no-op */
    BENCH_CHECK(b, etp_mem_free(ctx, ein));
    base->send = base->recv = NULL;
    free(idx);
    free(wts);
    free(to);
    free(from);
    free(ecnt);
    free(hit);
}

/* ---- the low-latency comparison ------------------------------------------ */

/* A low-latency layer (etp_ep_ll_dispatch / etp_ep_ll_combine) of an NVLINK
 * group of max_tokens_per_rank T against an ordinary layer of a CAPACITY
 * group of max_tokens_per_rank T and --capacity-factor, same H, k, E,
 * routing, layout and wire, timed in the same iterations: capacity
 * prepare, dispatch, combine; low-latency dispatch (its prepare folded in)
 * and combine. The rows "ll ... / capacity ..." carry the speed-up (the
 * capacity call's time over the low-latency call's, the same bytes) in
 * their ratio column. */
static void run_ll_case(bench_t *b, const opts_t *o, case_t *c, etp_group_t *world,
                        etp_stream_t *s)
{
    const int R = b->size;
    const int64_t T = c->T, H = c->H, E = c->E;
    const int k = c->k;
    const size_t rb = (size_t)H * c->es;
    int64_t *idx = malloc((size_t)T * (size_t)k * sizeof *idx);
    float *wts = malloc((size_t)T * (size_t)k * sizeof *wts);
    int64_t *ecnt = calloc((size_t)E, sizeof *ecnt);
    char *hit = malloc((size_t)R);
    int64_t *to = calloc((size_t)R, sizeof *to);
    if (!idx || !wts || !ecnt || !hit || !to) die(b, "out of host memory");
    make_routing(b, c, o->seed, idx);
    uint64_t wst = o->seed * 7 + (uint64_t)b->rank;
    for (int64_t i = 0; i < T * k; i++) wts[i] = (float)(0.05 + 0.9 * rng_unit(&wst));
    int64_t all_to = 0;
    for (int64_t t = 0; t < T; t++) {
        memset(hit, 0, (size_t)R);
        for (int j = 0; j < k; j++) {
            ecnt[idx[t * k + j]]++;
            hit[idx[t * k + j] / c->L] = 1;
        }
        for (int d = 0; d < R; d++) all_to += hit[d];
    }
    if (MPI_Allreduce(MPI_IN_PLACE, ecnt, (int)E, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        die(b, "MPI_Allreduce failed");
    int64_t slots = 1;
    const int64_t cap = layout_capacity(o, c, R, ecnt, &slots);

    etp_ep_group_config_t gc = group_config(o, c, "bench_capacity", E, H, T, k, cap);
    gc.transport = ETP_EP_TRANSPORT_CAPACITY;
    gc.capacity_factor = o->default_cf;
    etp_ep_group_config_t gl = gc;
    gl.name = "bench_ll";
    gl.transport = ETP_EP_TRANSPORT_NVLINK;
    snprintf(c->shape, sizeof c->shape, "ll vs capacity:%g %s T%lld H%lld k%d E%lld %s%s%s",
             o->default_cf, c->layout == ETP_EP_LAYOUT_PACKED ? "packed" : "fixed", (long long)T,
             (long long)H, k, (long long)E, etp_dtype_name(c->dt), c->weighted ? "" : " unw",
             c->wire == ETP_DTYPE_BF16 ? " wire bf16" : "");
    etp_ep_group_t *epl = NULL, *epc = NULL;
    const etp_status_t made = etp_ep_group_create(world, &gl, &epl);
    if (made == ETP_ERR_UNSUPPORTED) {
        if (b->rank == 0) {
            printf("etp-bench ep: %s: skipped: %s\n", c->shape, etp_last_error());
            fflush(stdout);
        }
        free(idx);
        free(wts);
        free(ecnt);
        free(hit);
        free(to);
        return;
    }
    BENCH_CHECK(b, made);
    BENCH_CHECK(b, etp_ep_group_create(world, &gc, &epc));
    etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
    lc.name = "moe";
    lc.topk = k;
    lc.alignment = c->align;
    lc.layout = c->layout;
    lc.weighted = c->weighted;
    lc.slots_per_expert = c->layout == ETP_EP_LAYOUT_FIXED_SLOTS && o->rows == 0 ? slots : 0;
    etp_ep_layer_t *lyc = NULL, *lyl = NULL;
    BENCH_CHECK(b, etp_ep_layer_create(epc, &lc, &lyc));
    etp_ep_layer_config_t ll = lc;
    ll.name = "moe_ll";
    ll.low_latency = 1;
    ll.max_tokens_per_rank = T;
    BENCH_CHECK(b, etp_ep_layer_create(epl, &ll, &lyl));
    int64_t rows = 0;
    BENCH_CHECK(b, etp_ep_layer_rows(lyc, &rows));

    void *tokens, *topk_idx, *topk_w, *recv, *recv_w, *out, *out_ll;
    etp_context_t *ctx = b->ctx;
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * rb, ETP_MEM_WORKSPACE, &tokens));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * (size_t)k * 8, ETP_MEM_WORKSPACE, &topk_idx));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * (size_t)k * 4, ETP_MEM_WORKSPACE, &topk_w));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * rb, ETP_MEM_WORKSPACE, &recv));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)rows * 4, ETP_MEM_WORKSPACE, &recv_w));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * rb, ETP_MEM_WORKSPACE, &out));
    BENCH_CHECK(b, etp_mem_alloc(ctx, (size_t)T * rb, ETP_MEM_WORKSPACE, &out_ll));
    BENCH_CHECK(b, etp_memcpy_async(s, topk_idx, idx, (size_t)T * (size_t)k * 8));
    BENCH_CHECK(b, etp_memcpy_async(s, topk_w, wts, (size_t)T * (size_t)k * 4));
    BENCH_CHECK(b, etp_stream_synchronize(s));
    fill_tokens(b, c, s, tokens, o->seed);
    const void *wptr = c->weighted ? topk_w : NULL;
    float *rwptr = c->weighted ? recv_w : NULL;
    etp_ep_ll_dispatch_args_t da = ETP_EP_LL_DISPATCH_ARGS_INIT;
    da.topk_idx = topk_idx;
    da.num_tokens = T;
    da.tokens = tokens;
    da.dtype = c->dt;
    da.topk_weights = wptr;

    const int n = b->iters;
    double *smp = calloc((size_t)n * 5, sizeof *smp);
    if (!smp) die(b, "out of host memory");
    /* each iteration: the five calls LL_REPS times back to back on a held
     * stream; a call's time is its mean over the repetitions after the
     * first (the first pays the device's start after the hold) */
    enum { LL_REPS = 4 };
    bench_seq_t *q = bench_seq_create(b, s, 1 + 5 * LL_REPS);
    for (int it = -b->warmup; it < n; it++) {
        double x[5] = {0, 0, 0, 0, 0};
        MPI_Barrier(MPI_COMM_WORLD);
        bench_hold(b, s);
        bench_seq_mark(q, 0);
        for (int r = 0; r < LL_REPS; r++) {
            const int m = 1 + 5 * r;
            BENCH_CHECK(b, etp_ep_prepare(lyc, topk_idx, ETP_DTYPE_I64, T, NULL, s));
            bench_seq_mark(q, m);
            BENCH_CHECK(b, etp_ep_dispatch(lyc, tokens, c->dt, wptr, ETP_DTYPE_F32, recv, rwptr,
                                           rows, s));
            bench_seq_mark(q, m + 1);
            BENCH_CHECK(b, etp_ep_combine(lyc, recv, c->dt, rows, out, s));
            bench_seq_mark(q, m + 2);
            etp_ep_ll_rows_t v = ETP_EP_LL_ROWS_INIT;
            BENCH_CHECK(b, etp_ep_ll_dispatch(lyl, &da, &v, s));
            bench_seq_mark(q, m + 3);
            /* the received rows stand in for the expert outputs */
            BENCH_CHECK(b, etp_ep_ll_combine(lyl, v.tokens, c->dt, v.rows, out_ll, s));
            bench_seq_mark(q, m + 4);
        }
        for (int r = 1; r < LL_REPS; r++)
            for (int i = 0; i < 5; i++)
                x[i] += bench_seq_us(q, 5 * r + i, 5 * r + i + 1) / (LL_REPS - 1);
        if (it >= 0)
            for (int i = 0; i < 5; i++) smp[(size_t)it * 5 + (size_t)i] = x[i];
    }
    bench_seq_destroy(q);
    double us[5], pd[1];
    for (int i = 0; i < 5; i++) us[i] = med_max(b, smp + i, 5, n);
    /* prepare + dispatch, per iteration (as etp-bench ep's summary) */
    for (int it = 0; it < n; it++) smp[(size_t)it * 5] += smp[(size_t)it * 5 + 1];
    pd[0] = med_max(b, smp, 5, n);
    /* logical bytes: token rows received per rank, the rank's own included */
    const double bytes = bench_max_over_ranks((double)all_to) * (double)rb;
    const char *sh = c->shape;
    bench_add(b, "capacity: prepare", sh, 0, us[0], 0);
    const double g_d = bench_add(b, "capacity: dispatch (logical)", sh, bytes, us[1], 0)->gbps;
    const double g_pd =
        bench_add(b, "capacity: prepare+dispatch (logical)", sh, bytes, pd[0], 0)->gbps;
    const double g_c = bench_add(b, "capacity: combine (logical)", sh, bytes, us[2], 0)->gbps;
    const double r_pd =
        bench_add(b, "ll dispatch / capacity prepare+dispatch", sh, bytes, us[3], g_pd)->ratio;
    bench_add(b, "ll dispatch / capacity dispatch", sh, bytes, us[3], g_d);
    const double r_c = bench_add(b, "ll combine / capacity combine", sh, bytes, us[4], g_c)->ratio;
    if (b->rank == 0) {
        /* a low-latency layer's kernels take half the SMs unless --sms
         * (etp/ep.h: num_sms) */
        char blocks[48];
        if (b->backend != ETP_BACKEND_CUDA)
            snprintf(blocks, sizeof blocks, "the host backend");
        else if (o->sms > 0)
            snprintf(blocks, sizeof blocks, "%d blocks", o->sms);
        else
            snprintf(blocks, sizeof blocks, "half the SMs");
        printf("etp-bench ep: %s: low-latency calls on %s; low-latency dispatch %.1f us "
               "(capacity prepare+dispatch %.1f us: x%.2f), low-latency combine %.1f us "
               "(capacity combine %.1f us: x%.2f)\n",
               sh, blocks, us[3], pd[0], r_pd, us[4], us[2], r_c);
        fflush(stdout);
    }
    free(smp);
    BENCH_CHECK(b, etp_stream_synchronize(s));
    BENCH_CHECK(b, etp_ep_layer_destroy(lyc));
    BENCH_CHECK(b, etp_ep_layer_destroy(lyl));
    BENCH_CHECK(b, etp_ep_group_destroy(epc));
    BENCH_CHECK(b, etp_ep_group_destroy(epl));
    void *bufs[] = {tokens, topk_idx, topk_w, recv, recv_w, out, out_ll};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        BENCH_CHECK(b, etp_mem_free(ctx, bufs[i]));
    free(idx);
    free(wts);
    free(ecnt);
    free(hit);
    free(to);
}

/* ---- options ------------------------------------------------------------ */

static int parse_list(bench_t *b, const char *opt, const char *arg, opts_t *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_LIST) {
            if (b->rank == 0) fprintf(stderr, "etp-bench ep: %s: at most %d values\n", opt, MAX_LIST);
            return 0;
        }
        char *end = NULL;
        if (strcmp(opt, "--tokens") == 0) {
            long long t = strtoll(tok, &end, 10);
            if (*end || t < 1) goto bad;
            o->tokens[n] = t;
        } else if (strcmp(opt, "--ll-tokens") == 0) {
            long long t = strtoll(tok, &end, 10);
            if (*end || t < 1 || t > ETP_EP_LL_MAX_TOKENS) goto bad;
            o->ll_tokens[n] = t;
        } else if (strcmp(opt, "--skew") == 0) {
            if (strcmp(tok, "uniform") == 0) {
                o->zipf[n] = 0;
            } else if (strncmp(tok, "zipf", 4) == 0) {
                double s = 1.0;
                if (tok[4] == ':') {
                    s = strtod(tok + 5, &end);
                    if (*end || !(s > 0)) goto bad;
                } else if (tok[4]) {
                    goto bad;
                }
                o->zipf[n] = s;
            } else {
                goto bad;
            }
        } else if (strcmp(opt, "--transport") == 0) {
            if (strcmp(tok, "exact") == 0) {
                o->transport[n] = ETP_EP_TRANSPORT_EXACT;
                o->cf[n] = 0;
            } else if (strncmp(tok, "capacity", 8) == 0) {
                o->transport[n] = ETP_EP_TRANSPORT_CAPACITY;
                o->cf[n] = 0; /* --capacity-factor, applied after parsing */
                if (tok[8] == ':') {
                    o->cf[n] = strtod(tok + 9, &end);
                    if (*end || !(o->cf[n] > 0)) goto bad;
                } else if (tok[8]) {
                    goto bad;
                }
            } else if (strcmp(tok, "nvlink") == 0) {
                o->transport[n] = ETP_EP_TRANSPORT_NVLINK;
                o->cf[n] = 0;
            } else if (strcmp(tok, "auto") == 0) {
                o->transport[n] = ETP_EP_TRANSPORT_AUTO;
                o->cf[n] = 0;
            } else {
                goto bad;
            }
        } else if (strcmp(opt, "--wire") == 0) {
            if (strcmp(tok, "f32") == 0) o->wire[n] = ETP_DTYPE_F32;
            else if (strcmp(tok, "bf16") == 0) o->wire[n] = ETP_DTYPE_BF16;
            else goto bad;
        } else { /* --layout */
            if (strcmp(tok, "packed") == 0) o->layout[n] = ETP_EP_LAYOUT_PACKED;
            else if (strcmp(tok, "fixed") == 0) o->layout[n] = ETP_EP_LAYOUT_FIXED_SLOTS;
            else goto bad;
        }
        n++;
        continue;
    bad:
        if (b->rank == 0) fprintf(stderr, "etp-bench ep: %s: bad value '%s'\n", opt, tok);
        return 0;
    }
    if (n == 0) {
        if (b->rank == 0) fprintf(stderr, "etp-bench ep: %s: empty list\n", opt);
        return 0;
    }
    if (strcmp(opt, "--tokens") == 0) o->ntokens = n;
    else if (strcmp(opt, "--ll-tokens") == 0) o->nll = n;
    else if (strcmp(opt, "--skew") == 0) o->nskew = n;
    else if (strcmp(opt, "--transport") == 0) o->ntransport = n;
    else if (strcmp(opt, "--wire") == 0) o->nwire = n;
    else o->nlayout = n;
    return 1;
}

static int parse_int(bench_t *b, const char *opt, const char *arg, int64_t lo, int64_t *v)
{
    long x = 0;
    if (bench_long(b, opt, arg, (long)lo, LONG_MAX, &x)) return 0;
    *v = x;
    return 1;
}

enum {
    O_TOKENS, O_HIDDEN, O_TOPK, O_EXPERTS, O_SKEW, O_TRANSPORT, O_LAYOUT, O_CAPACITY_FACTOR,
    O_DTYPE, O_WIRE, O_SMS, O_ALIGN, O_UNWEIGHTED, O_ROWS, O_SEED, O_LL_TOKENS
};
static const etp_cli_opt_t ep_opts[] = {
    [O_TOKENS] = {"tokens", "LIST", "4096", "tokens a rank, comma-separated"},
    [O_HIDDEN] = {"hidden", "H", "7168", "the hidden size"},
    [O_TOPK] = {"topk", "K", "8", "experts a token"},
    [O_EXPERTS] = {"experts", "E", "64", "experts in all, a multiple of the ranks"},
    [O_SKEW] = {"skew", "LIST", "uniform",
                "routing: uniform, or zipf:S (expert of popularity rank i weighs 1/(i+1)^S; "
                "zipf alone: S = 1), comma-separated"},
    [O_TRANSPORT] = {"transport", "LIST", "exact,capacity,nvlink",
                     "exact, capacity[:C] (C: its capacity factor, else --capacity-factor), "
                     "nvlink (a case is skipped, with the reason, where it cannot run) or auto "
                     "(the library's choice; the header says which it took), comma-separated"},
    [O_LAYOUT] = {"layout", "LIST", "packed", "packed or fixed (slots), comma-separated"},
    [O_CAPACITY_FACTOR] = {"capacity-factor", "C", "1.25", "the capacity transport's factor"},
    [O_DTYPE] = {"dtype", "bf16|f32|mxfp8", "bf16",
                 "the tokens' type; mxfp8: BF16 tokens dispatched as MXFP8 rows (E4M3 + E8M0 "
                 "scales), combined in BF16"},
    [O_WIRE] = {"wire", "LIST", "f32",
                "f32 or bf16: the dtype combine's per (token, rank) partials travel in "
                "(combine_wire; bf16 needs bf16 or mxfp8 tokens), comma-separated"},
    [O_SMS] = {"sms", "N", "0",
               "blocks (SMs) each nvlink kernel runs on CUDA (num_sms); 0 leaves the number to "
               "etp/ep.h's default"},
    [O_ALIGN] = {"align", "N", "1", "rows of each expert's block padded to a multiple of N"},
    [O_UNWEIGHTED] = {"unweighted", NULL, NULL, "combine does not multiply by the routing weights (no weights travel)"},
    [O_ROWS] = {"rows", "N", NULL,
                "the receive capacity in rows (default: what the routing needs: the busiest "
                "rank's rows, aligned)"},
    [O_SEED] = {"seed", "N", "1", "the routing's seed (a rank draws with seed + rank)"},
    [O_LL_TOKENS] = {"ll-tokens", "LIST", NULL,
                     "instead of the cases above: low-latency layers (etp_ep_ll_*, an nvlink "
                     "group) against a capacity group (--capacity-factor), both of "
                     "max_tokens_per_rank T, at these T a rank (up to 256), comma-separated; "
                     "the first skew, layout and wire"},
    {NULL},
};

static const char ep_about[] =
    "Expert-parallel dispatch and combine (etp/ep.h) against a plain grouped send/recv of the "
    "same inter-rank bytes (ncclSend/ncclRecv; MPI_Alltoallv on the host backend), peer copies "
    "of combine's bytes over CUDA IPC (CUDA only) and a device copy, interleaved iteration by "
    "iteration. Every combination of the listed tokens, skews, transports, layouts and wires is "
    "one case; its header says the transport taken and num_sms, its summary prepare+dispatch "
    "and combine us with DeepEP's logical GB/s. Rows: prepare; dispatch split into pack | "
    "exchange | expand; combine split into pre-sum | exchange | token sum (nvlink on CUDA: one "
    "kernel a call, whole-call rows only); the baselines and the copy, each the slowest rank's "
    "median.";

int etp_bench_ep(bench_t *b, int argc, char **argv)
{
    opts_t o;
    memset(&o, 0, sizeof o);
    o.weighted = 1;
    etp_cli_t cli = bench_cli(b, "ep", ep_about, ep_opts, argc, argv);
    int key;
    while ((key = bench_next(b, &cli)) >= 0) {
        const char *opt = cli.opt, *arg = cli.arg;
        int ok = 1;
        int64_t v = 0;
        switch (key) {
        case O_TOKENS:
        case O_LL_TOKENS:
        case O_SKEW:
        case O_TRANSPORT:
        case O_LAYOUT:
        case O_WIRE:
            ok = parse_list(b, opt, arg, &o);
            break;
        case O_HIDDEN:
            ok = parse_int(b, opt, arg, 1, &o.hidden);
            break;
        case O_EXPERTS:
            ok = parse_int(b, opt, arg, 1, &o.experts);
            break;
        case O_TOPK:
            ok = parse_int(b, opt, arg, 1, &v) && v <= 65536;
            o.topk = (int)v;
            break;
        case O_SMS: {
            long sms = 0;
            ok = bench_long(b, opt, arg, 0, 65536, &sms) == 0;
            o.sms = (int)sms;
            break;
        }
        case O_ALIGN:
            ok = parse_int(b, opt, arg, 1, &v) && v <= 65536;
            o.align = (int)v;
            break;
        case O_ROWS:
            ok = parse_int(b, opt, arg, 1, &o.rows);
            break;
        case O_SEED:
            ok = parse_int(b, opt, arg, 0, &v);
            o.seed = (uint64_t)v;
            break;
        case O_CAPACITY_FACTOR:
            ok = bench_double(b, opt, arg, 1e-6, 1e6, &o.default_cf) == 0;
            break;
        case O_DTYPE:
            if (strcmp(arg, "bf16") == 0) o.dtype = ETP_DTYPE_BF16;
            else if (strcmp(arg, "f32") == 0) o.dtype = ETP_DTYPE_F32;
            else if (strcmp(arg, "mxfp8") == 0) o.dtype = ETP_EP_TOKEN_MXFP8;
            else {
                if (b->rank == 0)
                    fprintf(stderr, "etp-bench ep: --dtype '%s': bf16, f32 or mxfp8\n", arg);
                ok = 0;
            }
            break;
        case O_UNWEIGHTED:
            o.weighted = 0;
            break;
        }
        if (!ok) return 2;
    }
    if (key != ETP_CLI_END) return bench_stop(key);
    bench_start(b);
    if (o.experts % b->size != 0 || o.topk > o.experts) {
        if (b->rank == 0)
            fprintf(stderr, "etp-bench ep: --experts %lld must be a multiple of the %d ranks and "
                            ">= --topk %d\n", (long long)o.experts, b->size, o.topk);
        return 2;
    }
    for (int i = 0; i < o.nwire; i++)
        if (o.wire[i] == ETP_DTYPE_BF16 && o.dtype == ETP_DTYPE_F32) {
            if (b->rank == 0)
                fprintf(stderr, "etp-bench ep: --wire bf16 needs bf16 or mxfp8 tokens (an f32 "
                                "group sends f32 partials)\n");
            return 2;
        }
    if (o.nll > 0 && o.dtype == ETP_EP_TOKEN_MXFP8) {
        if (b->rank == 0)
            fprintf(stderr,
                    "etp-bench ep: --ll-tokens: low-latency layers move bf16 or f32 tokens\n");
        return 2;
    }
    for (int i = 0; i < o.ntransport; i++)
        if (o.transport[i] == ETP_EP_TRANSPORT_CAPACITY && o.cf[i] == 0) o.cf[i] = o.default_cf;

    etp_group_t *world;
    BENCH_CHECK(b, etp_context_world(b->ctx, &world));
    etp_stream_t *s;
    BENCH_CHECK(b, etp_stream_create(b->ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    baseline_t base;
    baseline_init(&base, b, s);
    peercopy_t pc;
    peercopy_init(&pc, b, s);
    phases_t ph;
    phases_init(&ph, b, s);
    bench_timer_t *tm = bench_timer_create(b, s);
    for (int it = 0; it < o.nll; it++) {
        case_t c = {.T = o.ll_tokens[it], .H = o.hidden, .E = o.experts, .L = o.experts / b->size,
                    .k = o.topk, .align = o.align, .weighted = o.weighted, .zipf = o.zipf[0],
                    .dt = o.dtype, .es = etp_dtype_size(o.dtype),
                    .transport = ETP_EP_TRANSPORT_NVLINK, .layout = o.layout[0], .wire = o.wire[0]};
        run_ll_case(b, &o, &c, world, s);
    }
    for (int it = 0; o.nll == 0 && it < o.ntokens; it++)
        for (int is = 0; is < o.nskew; is++)
            for (int itr = 0; itr < o.ntransport; itr++)
                for (int il = 0; il < o.nlayout; il++)
                    for (int iw = 0; iw < o.nwire; iw++) {
                        const int mx = o.dtype == ETP_EP_TOKEN_MXFP8;
                        case_t c = {.T = o.tokens[it], .H = o.hidden, .E = o.experts,
                                    .L = o.experts / b->size, .k = o.topk, .align = o.align,
                                    .weighted = o.weighted, .zipf = o.zipf[is], .cf = o.cf[itr],
                                    .dt = o.dtype, .mx = mx,
                                    .es = mx ? 2 : etp_dtype_size(o.dtype),
                                    .transport = o.transport[itr], .layout = o.layout[il],
                                    .wire = o.wire[iw]};
                        run_case(b, &o, &c, world, s, &base, &pc, &ph, tm);
                    }
    bench_timer_destroy(tm);
    phases_fini(&ph);
    peercopy_fini(&pc);
    baseline_fini(&base);
    BENCH_CHECK(b, etp_stream_destroy(s));
    return 0;
}
