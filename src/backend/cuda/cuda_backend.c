/*
 * The CUDA backend: the ops table, the device and the backend object
 * (creation, destruction), memory, copies and the backend's own kernels.
 * Communicators are in cuda_comm.c, streams, events and host waits in
 * cuda_stream.c, graph capture in cuda_graph.c, collectives in cuda_coll.c;
 * the design notes are in cuda_internal.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"
#include "kernels/elementwise/axpy.h"

/* ---- small helpers --------------------------------------------------- */

etp_status_t etp__cuda_set_device(etp__cuda_t *cb)
{
    cudaError_t e = cudaSetDevice(cb->device);
    if (e != cudaSuccess)
        return etp__err(ETP_ERR_BACKEND, "cudaSetDevice(%d): %s", cb->device,
                        cudaGetErrorString(e));
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_error(const char *what, cudaError_t e)
{
    etp_status_t st = e == cudaErrorMemoryAllocation ? ETP_ERR_OUT_OF_MEMORY : ETP_ERR_BACKEND;
    /* Non-sticky errors stay as the thread's "last error" of the runtime;
     * clear it so it is not reported again by an unrelated later check. */
    (void)cudaGetLastError();
    return etp__err(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static void decode_nccl_version(int code, int *major, int *minor, int *patch)
{
    /* NCCL_VERSION() changed its encoding at 2.9. */
    if (code >= 10000) {
        *major = code / 10000;
        *minor = (code % 10000) / 100;
        *patch = code % 100;
    } else {
        *major = code / 1000;
        *minor = (code % 1000) / 100;
        *patch = code % 100;
    }
}

/* The launcher's node-local rank of this process, or -1. It only picks a
 * default GPU when the caller leaves device at -1. Reading these variables
 * here rather than in src/core/env.c is a documented exception: they are not
 * etp settings but facts that the launcher (Open MPI, MPICH/Intel MPI, Slurm)
 * publishes about this process. */
static int launcher_local_rank(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                        "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v == NULL || *v == '\0') continue;
        char *end = NULL;
        long x = strtol(v, &end, 10);
        if (end != v && *end == '\0' && x >= 0 && x < INT_MAX) return (int)x;
    }
    return -1;
}

/* ---- ops: lifecycle and memory ------------------------------------------ */

static void cuda_destroy(etp__be_t *be)
{
    if (be == NULL) return;
    etp__cuda_t *cb = etp__cuda_of(be);
    (void)cudaSetDevice(cb->device);
    if (cb->group_open) {
        (void)ncclGroupEnd();
        cb->group_open = 0;
    }
    /* Let enqueued work finish (bounded); if it does not, whatever is stuck
     * waits on a collective, and aborting the communicators releases it. */
    cudaStream_t *arr = NULL;
    size_t n = 0;
    if (etp__cuda_stream_list(cb, &arr, &n) == ETP_SUCCESS) {
        etp_status_t st = etp__cuda_wait_work(cb, "the device", arr, n, NULL, NULL, 0);
        if (st != ETP_SUCCESS && !cb->base.failed) {
            ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                     "context destroy: outstanding work did not finish (%s); aborting "
                     "communicators",
                     st == ETP_ERR_TIMEOUT ? "timeout" : "CUDA error");
            etp__cuda_abort_all(cb);
        }
        free(arr);
    }
    size_t ncomms = 0;
    for (etp__bcomm_t *c = cb->comms; c; c = c->next) ncomms++;
    if (ncomms > 0) {
        etp__bcomm_t **cs = malloc(ncomms * sizeof *cs);
        if (cs != NULL) {
            size_t i = 0;
            for (etp__bcomm_t *c = cb->comms; c; c = c->next) cs[i++] = c;
            etp__cuda_release_comms(cb, cs, ncomms);
            free(cs);
        } else {
            etp__cuda_abort_all(cb);
            while (cb->comms) {
                etp__bcomm_t *c = cb->comms;
                cb->comms = c->next;
                etp__cuda_comm_free_scratch(c);
                free(c);
            }
        }
    }
    while (cb->streams) {
        etp__bstream_t *s = cb->streams;
        cb->streams = s->next;
        if (!s->borrowed) (void)cudaStreamDestroy(s->s);
        free(s);
    }
    free(cb->batch);
    free(cb->ce);
    free(cb);
}

static etp_status_t cuda_mem_alloc(etp__be_t *be, size_t bytes, void **ptr)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    ETP__TRY(etp__cuda_set_device(cb));
    if (bytes == 0) {
        *ptr = NULL;
        return ETP_SUCCESS;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes) on device %d", bytes, cb->device);
        return etp__cuda_error(what, e);
    }
    *ptr = p;
    return ETP_SUCCESS;
}

static void cuda_mem_free(etp__be_t *be, void *ptr)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (ptr == NULL) return;
    (void)cudaSetDevice(cb->device);
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ETP__LOG(cb->base.log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND, "cudaFree(%p): %s", ptr,
                 cudaGetErrorString(e));
    }
}

/* ---- ops: copies and kernels ------------------------------------------- */

static etp_status_t cuda_memset_async(etp__be_t *be, etp__bstream_t *s, void *ptr, int value,
                                      size_t bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (bytes == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaMemsetAsync(ptr, value, bytes, s->s);
    if (e != cudaSuccess) return etp__cuda_error("cudaMemsetAsync", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_memcpy_async(etp__be_t *be, etp__bstream_t *s, void *dst, const void *src,
                                      size_t bytes)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (bytes == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->s);
    if (e != cudaSuccess) return etp__cuda_error("cudaMemcpyAsync", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_launch_host(etp__be_t *be, etp__bstream_t *s, void (*fn)(void *arg),
                                     void *arg)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cudaError_t e = cudaLaunchHostFunc(s->s, fn, arg);
    if (e != cudaSuccess) return etp__cuda_error("cudaLaunchHostFunc", e);
    return ETP_SUCCESS;
}

static etp_status_t cuda_axpy_f32(etp__be_t *be, etp__bstream_t *s, size_t n, float alpha,
                                  const float *x, float *y)
{
    etp__cuda_t *cb = etp__cuda_of(be);
    if (n == 0) return ETP_SUCCESS;
    ETP__TRY(etp__cuda_set_device(cb));
    cudaError_t e = etp__cuda_axpy_f32(s->s, n, alpha, x, y);
    if (e != cudaSuccess) return etp__cuda_error("axpy_f32 kernel launch", e);
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_stream_for_launch(etp__be_t *be, etp__bstream_t *s, cudaStream_t *out)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    *out = s->s;
    return ETP_SUCCESS;
}

static const etp__kernels_t cuda_kernels = {
    .axpy_f32 = cuda_axpy_f32,
    .quant = &etp__cuda_quant_kernels,
    .ep = &etp__cuda_ep_kernels,
    .shard = &etp__cuda_shard_kernels,
    .gemm = &etp__cuda_gemm_kernels,
};

static etp_status_t cuda_health(etp__be_t *be)
{
    return etp__cuda_nvl_faults(etp__cuda_of(be));
}

static const etp__backend_ops_t cuda_ops = {
    .name = "cuda",
    .kind = ETP_BACKEND_CUDA,
    .destroy = cuda_destroy,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .device_sync = etp__cuda_device_sync,
    .stream_create = etp__cuda_stream_create,
    .stream_wrap = etp__cuda_stream_wrap,
    .stream_native = etp__cuda_stream_native,
    .stream_destroy = etp__cuda_stream_destroy,
    .stream_sync = etp__cuda_stream_sync,
    .stream_capturing = etp__cuda_stream_capturing,
    .event_create = etp__cuda_event_create,
    .event_destroy = etp__cuda_event_destroy,
    .event_record = etp__cuda_event_record,
    .stream_wait_event = etp__cuda_stream_wait_event,
    .event_query = etp__cuda_event_query,
    .event_sync = etp__cuda_event_sync,
    .memset_async = cuda_memset_async,
    .memcpy_async = cuda_memcpy_async,
    .launch_host = cuda_launch_host,
    .comm_split = etp__cuda_comm_split,
    .comm_destroy = etp__cuda_comm_destroy,
    .comm_rank = etp__cuda_comm_rank,
    .comm_size = etp__cuda_comm_size,
    .coll = etp__cuda_coll,
    .win_alloc = etp__cuda_win_alloc,
    .win_free = etp__cuda_win_free,
    .batch_begin = etp__cuda_batch_begin,
    .batch_end = etp__cuda_batch_end,
    .capture_begin = etp__cuda_capture_begin,
    .capture_end = etp__cuda_capture_end,
    .graph_launch = etp__cuda_graph_launch,
    .graph_destroy = etp__cuda_graph_destroy,
    .health = cuda_health,
    .kernels = &cuda_kernels,
};

/* ---- constructors ------------------------------------------------------- */

int etp__cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

int etp__cuda_be_device(const etp__be_t *be)
{
    return ((const etp__cuda_t *)be)->device;
}

/* device: cfg->device, or (-1) the launcher's local rank (else world_rank)
 * modulo the number of devices. */
etp_status_t etp__cuda_pick_device(const etp__be_config_t *cfg, int world_rank, int *device)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return etp__err(ETP_ERR_BACKEND, "CUDA backend: no usable CUDA device (cudaGetDeviceCount: %s)",
                        cudaGetErrorString(e));
    }
    if (count <= 0) return etp__err(ETP_ERR_BACKEND, "CUDA backend: no CUDA device is visible");
    if (cfg->device >= 0) {
        if (cfg->device >= count)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "config device %d: only %d CUDA device(s) are visible", cfg->device,
                            count);
        *device = cfg->device;
        return ETP_SUCCESS;
    }
    int local = launcher_local_rank();
    *device = (local >= 0 ? local : world_rank) % count;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_be_new(const etp__be_config_t *cfg, etp__logger_t *log, int rank,
                             int size, int device, etp__cuda_t **out)
{
    etp__cuda_t *cb = calloc(1, sizeof *cb);
    if (cb == NULL) return etp__err(ETP_ERR_OUT_OF_MEMORY, "CUDA backend: out of host memory");
    cb->base.ops = &cuda_ops;
    cb->base.log = log;
    cb->base.cfg = *cfg;
    cb->base.rank = rank;
    cb->base.size = size;
    cb->device = device;
    etp_status_t st = etp__cuda_set_device(cb);
    if (st != ETP_SUCCESS) {
        free(cb);
        return st;
    }
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e != cudaSuccess) {
        free(cb);
        return etp__cuda_error("cudaDeviceGetStreamPriorityRange", e);
    }
    cb->prio_greatest = greatest;

    int rt = 0, maj = 0, min = 0, pat = 0, cmaj = 0, cmin = 0, cpat = 0;
    ncclResult_t r = ncclGetVersion(&rt);
    decode_nccl_version(NCCL_VERSION_CODE, &cmaj, &cmin, &cpat);
    if (r == ncclSuccess) decode_nccl_version(rt, &maj, &min, &pat);
    int cuda_rt = 0, cuda_drv = 0;
    (void)cudaRuntimeGetVersion(&cuda_rt);
    (void)cudaDriverGetVersion(&cuda_drv);
    ETP__LOG(log, ETP_LOG_INFO, ETP_SUBSYS_BACKEND,
             "CUDA backend: rank %d of %d on device %d; NCCL runtime %d.%d.%d, built with "
             "%d.%d.%d; CUDA runtime %d, driver %d",
             rank, size, device, maj, min, pat, cmaj, cmin, cpat, cuda_rt, cuda_drv);
    if (r != ncclSuccess || maj != cmaj || min != cmin)
        ETP__LOG(log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND,
                 "NCCL runtime %d.%d differs from the %d.%d etp was built with", maj, min, cmaj,
                 cmin);
    *out = cb;
    return ETP_SUCCESS;
}
