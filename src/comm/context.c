/* Contexts: configuration, bootstrap, lifetime. */
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#if ETP_HAVE_MPI
#include "etp/mpi.h"
#endif
#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

/* The first bytes of an etp_unique_id_t name the backend that made it. */
enum { UID_TAG_BYTES = 16 };
static const char uid_tag_cuda[UID_TAG_BYTES] = "etp-uid-cuda-v1";

etp_status_t etp__ctx_usable(const etp_context_t *ctx, const char *fn)
{
    etp__trace_bind(&ctx->log);
    if (ctx->be->failed)
        return etp__err(ETP_ERR_ABORTED, "%s: the context was aborted earlier: %s", fn,
                        ctx->be->fail_msg);
    return ETP_SUCCESS;
}

etp_status_t etp__ctx_init(const etp_context_config_t *config, etp_context_t **out,
                           etp__be_config_t *becfg)
{
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&cfg, config, &etp__vs_context_config, "context create", "config"));
    if (cfg.backend != ETP_BACKEND_AUTO && cfg.backend != ETP_BACKEND_HOST &&
        cfg.backend != ETP_BACKEND_CUDA)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "context config: backend %d is not an etp_backend_t",
                        (int)cfg.backend);
    if (cfg.device < -1)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "context config: device %d (expected -1 or >= 0)",
                        cfg.device);
    if (cfg.host_stream_mode < ETP_HOST_STREAMS_DEFAULT || cfg.host_stream_mode > ETP_HOST_STREAMS_SHUFFLE)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "context config: host_stream_mode %d is unknown",
                        (int)cfg.host_stream_mode);
    if (cfg.shuffle_seed < -1)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "context config: shuffle_seed %lld (expected >= -1)",
                        (long long)cfg.shuffle_seed);
    if (cfg.check_collectives < -1 || cfg.check_collectives > 1)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "context config: check_collectives %d (expected -1, 0 or 1)",
                        cfg.check_collectives);
    if (cfg.timeout_s != cfg.timeout_s)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "context config: timeout_s is NaN");
    if ((cfg.allocator.alloc == NULL) != (cfg.allocator.free == NULL))
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "context config: allocator needs both alloc and free, or neither");

    etp_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return etp__err(ETP_ERR_OUT_OF_MEMORY, "context: out of memory");
    etp_status_t st = etp__env_load(&ctx->env);
    if (st != ETP_SUCCESS) {
        free(ctx);
        return st;
    }
    ctx->log.level = ctx->env.log_level;
    ctx->log.subsys = ctx->env.log_subsys;
    ctx->log.rank = -1;
    ctx->log.fn = cfg.log_fn;
    ctx->log.user = cfg.log_user;
    etp__trace_bind(&ctx->log);
    ctx->allocator = cfg.allocator;

    becfg->device = cfg.device;
    becfg->host_streams = cfg.host_stream_mode != ETP_HOST_STREAMS_DEFAULT ? (int)cfg.host_stream_mode
                          : ctx->env.host_streams ? ctx->env.host_streams
                                                  : ETP_HOST_STREAMS_EAGER;
    becfg->shuffle_seed = cfg.shuffle_seed >= 0 ? cfg.shuffle_seed : ctx->env.shuffle_seed;
    becfg->timeout_s = cfg.timeout_s >= 0 ? cfg.timeout_s : ctx->env.timeout_s;
    becfg->check_collectives =
        cfg.check_collectives >= 0 ? cfg.check_collectives : ctx->env.check_collectives;
    becfg->nccl_fast_launch = ctx->env.nccl_fast_launch;
    becfg->copy_engine = ctx->env.copy_engine;
    ctx->requested_backend = cfg.backend;
    *out = ctx;
    return ETP_SUCCESS;
}

etp__test_knobs_t *etp__context_test_knobs(etp_context_t *ctx)
{
    return &ctx->be->test;
}

void etp__ctx_free(etp_context_t *ctx)
{
    if (!ctx) return;
    etp__trace_unbind(&ctx->log);
    free(ctx->allocs);
    free(ctx->cap_refs);
    free(ctx->done.e);
    free(ctx);
}

etp_status_t etp__ctx_finish(etp_context_t *ctx, etp__bcomm_t *world_comm)
{
    etp_group_t *w = calloc(1, sizeof *w);
    if (!w) return etp__err(ETP_ERR_OUT_OF_MEMORY, "context: out of memory");
    w->ctx = ctx;
    strcpy(w->name, "world");
    w->rank = ctx->be->ops->comm_rank(world_comm);
    w->size = ctx->be->ops->comm_size(world_comm);
    w->num_roles = 1;
    w->comms[0] = world_comm;
    ctx->world = w;
    ctx->groups = w;
    ctx->log.rank = w->rank;
    ctx->be->rank = w->rank;
    ctx->be->size = w->size;
    ETP__LOG(&ctx->log, ETP_LOG_INFO, ETP_SUBSYS_CORE,
             "etp %d.%d.%d context: backend %s, rank %d of %d, timeout %.1f s, check collectives %d, "
             "host streams %s (seed %lld)",
             ETP_VERSION_MAJOR, ETP_VERSION_MINOR, ETP_VERSION_PATCH, ctx->be->ops->name, w->rank,
             w->size, ctx->be->cfg.timeout_s, ctx->be->cfg.check_collectives,
             ctx->be->cfg.host_streams == ETP_HOST_STREAMS_SHUFFLE ? "shuffle" : "eager",
             (long long)ctx->be->cfg.shuffle_seed);
    return ETP_SUCCESS;
}

#if ETP_HAVE_MPI /* its one caller, etp_context_create_mpi */
static etp_status_t resolve_backend(etp_backend_t want, etp_backend_t *got)
{
    if (want == ETP_BACKEND_AUTO) {
#if ETP_HAVE_CUDA
        if (etp__cuda_device_count() > 0) {
            *got = ETP_BACKEND_CUDA;
            return ETP_SUCCESS;
        }
#endif
        want = ETP_BACKEND_HOST;
    }
    if (want == ETP_BACKEND_HOST && !ETP_HAVE_MPI)
        return etp__err(ETP_ERR_UNSUPPORTED, "the host backend needs MPI: etp was built without it");
    if (want == ETP_BACKEND_CUDA && !ETP_HAVE_CUDA)
        return etp__err(ETP_ERR_UNSUPPORTED, "the CUDA backend was not built into this etp");
    *got = want;
    return ETP_SUCCESS;
}
#endif

static etp_status_t finish_or_undo(etp_context_t *ctx, etp_status_t st, etp__bcomm_t *world,
                                   etp_context_t **out)
{
    if (st == ETP_SUCCESS) st = etp__ctx_finish(ctx, world);
    if (st != ETP_SUCCESS) {
        if (ctx->be) {
            if (world) ctx->be->ops->comm_destroy(ctx->be, world);
            ctx->be->ops->destroy(ctx->be);
        }
        etp__ctx_free(ctx);
        return st;
    }
    *out = ctx;
    return ETP_SUCCESS;
}

#if ETP_HAVE_MPI
etp_status_t etp_context_create_mpi(MPI_Comm comm, const etp_context_config_t *config,
                                    etp_context_t **out)
{
    ETP__CHECK_NULL(out, "etp_context_create_mpi");
    if (comm == MPI_COMM_NULL)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_context_create_mpi: comm is MPI_COMM_NULL");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_context_create_mpi: MPI is not initialized (call MPI_Init first)");
    etp_context_t *ctx;
    etp__be_config_t becfg;
    ETP__TRY(etp__ctx_init(config, &ctx, &becfg));
    etp_backend_t kind = ETP_BACKEND_HOST;
    etp_status_t st = resolve_backend(ctx->requested_backend, &kind);
    etp__bcomm_t *world = NULL;
    if (st == ETP_SUCCESS) {
        if (kind == ETP_BACKEND_HOST)
            st = etp__host_create_mpi(comm, &becfg, &ctx->log, &ctx->be, &world);
#if ETP_HAVE_CUDA
        else
            st = etp__cuda_create_mpi(comm, &becfg, &ctx->log, &ctx->be, &world);
#endif
    }
    return finish_or_undo(ctx, st, world, out);
}
#endif

etp_status_t etp_get_unique_id(etp_backend_t backend, etp_unique_id_t *id)
{
    ETP__CHECK_NULL(id, "etp_get_unique_id");
    if (backend == ETP_BACKEND_AUTO) {
#if ETP_HAVE_CUDA
        backend = ETP_BACKEND_CUDA;
#else
        backend = ETP_BACKEND_HOST;
#endif
    }
    if (backend == ETP_BACKEND_HOST)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "etp_get_unique_id: the host backend bootstraps from MPI only "
                        "(etp_context_create_mpi)");
    if (backend != ETP_BACKEND_CUDA)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_get_unique_id: backend %d is unknown",
                        (int)backend);
#if ETP_HAVE_CUDA
    etp_unique_id_t tmp;
    memset(&tmp, 0, sizeof tmp);
    memcpy(tmp.internal, uid_tag_cuda, UID_TAG_BYTES);
    ETP__TRY(etp__cuda_get_unique_id(tmp.internal + UID_TAG_BYTES,
                                     ETP_UNIQUE_ID_BYTES - UID_TAG_BYTES));
    *id = tmp;
    return ETP_SUCCESS;
#else
    (void)uid_tag_cuda;
    return etp__err(ETP_ERR_UNSUPPORTED, "etp_get_unique_id: the CUDA backend was not built in");
#endif
}

etp_status_t etp_context_create(const etp_unique_id_t *id, int rank, int size,
                                const etp_context_config_t *config, etp_context_t **out)
{
    ETP__CHECK_NULL(id, "etp_context_create");
    ETP__CHECK_NULL(out, "etp_context_create");
    ETP__CHECK_ARG(size > 0, "etp_context_create: size %d (expected > 0)", size);
    ETP__CHECK_ARG(rank >= 0 && rank < size, "etp_context_create: rank %d not in [0, %d)", rank,
                   size);
    if (memcmp(id->internal, uid_tag_cuda, UID_TAG_BYTES) != 0)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_context_create: id was not made by etp_get_unique_id()");
    if (config && config->size >= offsetof(etp_context_config_t, backend) + sizeof config->backend &&
        config->backend == ETP_BACKEND_HOST)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_context_create: config asks for the host backend but the id is a "
                        "CUDA id");
#if ETP_HAVE_CUDA
    etp_context_t *ctx;
    etp__be_config_t becfg;
    ETP__TRY(etp__ctx_init(config, &ctx, &becfg));
    etp__bcomm_t *world = NULL;
    etp_status_t st = etp__cuda_create_uid(id->internal + UID_TAG_BYTES, rank, size, &becfg,
                                           &ctx->log, &ctx->be, &world);
    return finish_or_undo(ctx, st, world, out);
#else
    (void)finish_or_undo;
    return etp__err(ETP_ERR_UNSUPPORTED, "etp_context_create: the CUDA backend was not built in");
#endif
}

#if ETP_HAVE_CUDA
etp_status_t etp_context_create_nccl(ncclComm_t comm, const etp_context_config_t *config,
                                     etp_context_t **out)
{
    ETP__CHECK_NULL(comm, "etp_context_create_nccl");
    ETP__CHECK_NULL(out, "etp_context_create_nccl");
    etp_context_t *ctx;
    etp__be_config_t becfg;
    ETP__TRY(etp__ctx_init(config, &ctx, &becfg));
    etp_status_t st = ETP_SUCCESS;
    if (ctx->requested_backend == ETP_BACKEND_HOST)
        st = etp__err(ETP_ERR_INVALID_ARGUMENT,
                      "etp_context_create_nccl: config asks for the host backend");
    etp__bcomm_t *world = NULL;
    if (st == ETP_SUCCESS)
        st = etp__cuda_create_nccl((void *)comm, &becfg, &ctx->log, &ctx->be, &world);
    return finish_or_undo(ctx, st, world, out);
}

etp_status_t etp_context_cuda_device(const etp_context_t *ctx, int *device)
{
    ETP__CHECK_NULL(ctx, "etp_context_cuda_device");
    ETP__CHECK_NULL(device, "etp_context_cuda_device");
    if (ctx->be->ops->kind != ETP_BACKEND_CUDA)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "etp_context_cuda_device: not a CUDA context");
    *device = etp__cuda_be_device(ctx->be);
    return ETP_SUCCESS;
}
#endif

etp_status_t etp_context_destroy(etp_context_t *ctx)
{
    if (!ctx) return ETP_SUCCESS;
    etp__trace_bind(&ctx->log);
    ETP__TRY(etp__ctx_no_capture(ctx, "etp_context_destroy"));
    if (ctx->num_streams || ctx->num_events || ctx->num_groups || ctx->num_graphs)
        return etp__err(ETP_ERR_BUSY,
                        "etp_context_destroy: still in use by %d stream(s), %d event(s), %d "
                        "group(s) and %d graph(s); destroy them first",
                        ctx->num_streams, ctx->num_events, ctx->num_groups, ctx->num_graphs);
    etp__be_t *be = ctx->be;
    if (!be->failed && be->ops->device_sync(be) != ETP_SUCCESS)
        ETP__LOG(&ctx->log, ETP_LOG_WARN, ETP_SUBSYS_CORE, "destroy: %s", etp_last_error());
    if (ctx->num_allocs)
        ETP__LOG(&ctx->log, ETP_LOG_WARN, ETP_SUBSYS_CORE,
                 "destroy: freeing %zu buffer(s) (%zu bytes) the caller did not free",
                 ctx->num_allocs, ctx->total_bytes);
    /* windows need their communicator (only the world's can be left: other
     * groups refuse to go first); plain memory goes after it, whose destroy
     * settles what an abandoned collective may still write (the host
     * backend's timed-out MPI requests) */
    for (size_t i = 0; i < ctx->num_allocs; i++) {
        etp__alloc_rec_t *r = &ctx->allocs[i];
        if (r->win_group) be->ops->win_free(be, r->win_group->comms[r->win_role], r->ptr, r->win);
    }
    be->ops->comm_destroy(be, ctx->world->comms[0]);
    for (size_t i = 0; i < ctx->num_allocs; i++) {
        etp__alloc_rec_t *r = &ctx->allocs[i];
        if (r->win_group) continue;
        if (ctx->allocator.free)
            ctx->allocator.free(ctx->allocator.user, r->ptr, r->bytes);
        else
            be->ops->mem_free(be, r->ptr);
    }
    free(ctx->world);
    be->ops->destroy(be);
    etp__ctx_free(ctx);
    return ETP_SUCCESS;
}

etp_status_t etp_context_rank(const etp_context_t *ctx, int *rank)
{
    ETP__CHECK_NULL(ctx, "etp_context_rank");
    ETP__CHECK_NULL(rank, "etp_context_rank");
    *rank = ctx->world->rank;
    return ETP_SUCCESS;
}

etp_status_t etp_context_size(const etp_context_t *ctx, int *size)
{
    ETP__CHECK_NULL(ctx, "etp_context_size");
    ETP__CHECK_NULL(size, "etp_context_size");
    *size = ctx->world->size;
    return ETP_SUCCESS;
}

etp_status_t etp_context_backend(const etp_context_t *ctx, etp_backend_t *backend)
{
    ETP__CHECK_NULL(ctx, "etp_context_backend");
    ETP__CHECK_NULL(backend, "etp_context_backend");
    *backend = ctx->be->ops->kind;
    return ETP_SUCCESS;
}

etp_status_t etp_context_world(etp_context_t *ctx, etp_group_t **world)
{
    ETP__CHECK_NULL(ctx, "etp_context_world");
    ETP__CHECK_NULL(world, "etp_context_world");
    *world = ctx->world;
    return ETP_SUCCESS;
}

etp_status_t etp_context_check(const etp_context_t *ctx)
{
    ETP__CHECK_NULL(ctx, "etp_context_check");
    ETP__TRY(etp__ctx_usable(ctx, "etp_context_check"));
    if (ctx->be->ops->health) ETP__TRY(ctx->be->ops->health(ctx->be));
    for (etp_group_t *g = ctx->groups; g; g = g->next_group)
        ETP__TRY(etp__group_ready(g, 0, "etp_context_check"));
    return ETP_SUCCESS;
}
