/* MPI test scaffolding: init, a seed every rank shares, contexts. */
#ifndef ETP_TEST_MPI_UTIL_H
#define ETP_TEST_MPI_UTIL_H

#include "etp/mpi.h"
#include "test_util.h"
#ifdef ETP_SHARD_TEST_CUDA
#include "test_knobs.h"
#endif

static int g_rank, g_size;
static uint64_t g_seed;
static const char *g_test_name = "test";
#ifdef ETP_SHARD_TEST_CUDA
/* A CUDA context and its groups take seconds to create at 4 ranks (NCCL
 * communicators and their warmed-up twins), and a shuffle seed means
 * nothing there: a CUDA test program shares one context and one two-role
 * group (tu_test_ctx, tu_test_tp), made at first use and destroyed by
 * tu_mpi_finish. */
static etp_context_t *g_cuda_ctx;
static etp_group_t *g_cuda_tp;
#endif

static inline void tu_mpi_init(int *argc, char ***argv, const char *name)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    unsigned long long seed = tu_pick_seed();
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    g_seed = seed;
    g_test_name = name;
    tu_apply_case_filter();
    if (g_rank == 0)
        printf("%s: %d rank(s), seed %llu (rerun with ETP_TEST_SEED=%llu)\n", name, g_size, seed,
               seed);
    fflush(stdout);
}

/* Combine every rank's cmocka result, so all ranks exit alike. */
static inline int tu_mpi_finish(int failed)
{
    int any = 0;
    /* again at the end, where a CI log's tail keeps it */
    if (failed)
        fprintf(stderr, "%s: rank %d of %d failed %d test(s); seed %llu (rerun with ETP_TEST_SEED=%llu)\n",
                g_test_name, g_rank, g_size, failed, (unsigned long long)g_seed,
                (unsigned long long)g_seed);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#ifdef ETP_SHARD_TEST_CUDA
    if (g_cuda_tp) ETP_OK(etp_group_destroy(g_cuda_tp));
    if (g_cuda_ctx) ETP_OK(etp_context_destroy(g_cuda_ctx));
    g_cuda_tp = NULL;
    g_cuda_ctx = NULL;
#endif
    MPI_Finalize();
    return any ? 1 : 0;
}

static inline etp_context_t *tu_host_ctx(MPI_Comm comm, int mode, int64_t seed, double timeout,
                                         int check)
{
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_HOST;
    cfg.host_stream_mode = (etp_host_stream_mode_t)mode;
    cfg.shuffle_seed = seed;
    cfg.timeout_s = timeout;
    cfg.check_collectives = check;
    etp_context_t *ctx = NULL;
    ETP_OK(etp_context_create_mpi(comm, &cfg, &ctx));
    return ctx;
}

/* A host allocator for tests: malloc and free, counting calls and live
 * bytes; an allocation for an owner in fail_mask (bit 1u << owner) fails. */
typedef struct {
    int allocs, frees;
    size_t live;
    unsigned fail_mask;
} tu_allocator_t;

static inline void *tu_alloc(void *user, size_t bytes, etp_mem_owner_t owner)
{
    tu_allocator_t *a = user;
    if (a->fail_mask & (1u << owner)) return NULL;
    a->allocs++;
    a->live += bytes;
    return malloc(bytes ? bytes : 1);
}

static inline void tu_free(void *user, void *ptr, size_t bytes)
{
    tu_allocator_t *a = user;
    a->frees++;
    a->live -= bytes;
    free(ptr);
}

/* A host context (ETP_HOST_STREAMS_* mode, shuffle seed) allocating through a. */
static inline etp_context_t *tu_alloc_ctx(tu_allocator_t *a, int mode, int64_t seed)
{
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_HOST;
    cfg.host_stream_mode = (etp_host_stream_mode_t)mode;
    cfg.shuffle_seed = seed;
    cfg.allocator.alloc = tu_alloc;
    cfg.allocator.free = tu_free;
    cfg.allocator.user = a;
    etp_context_t *ctx = NULL;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    return ctx;
}

/* The backend a test file runs on: the host backend in shuffle mode (a
 * context of its own for each run, with the run's seed), or, when the file
 * is built for the GPU with ETP_SHARD_TEST_CUDA defined, the CUDA backend
 * (the program's one shared context). Give it back with tu_test_ctx_done. */
static inline etp_context_t *tu_test_ctx(int64_t seed)
{
#ifdef ETP_SHARD_TEST_CUDA
    (void)seed;
    if (g_cuda_ctx == NULL) {
        etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
        cfg.backend = ETP_BACKEND_CUDA;
        ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &g_cuda_ctx));
        tu_apply_test_knobs(g_cuda_ctx, g_rank);
    }
    return g_cuda_ctx;
#else
    return tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, seed, -1, -1);
#endif
}

static inline void tu_test_ctx_done(etp_context_t *ctx)
{
#ifdef ETP_SHARD_TEST_CUDA
    if (ctx == g_cuda_ctx) return;
#endif
    ETP_OK(etp_context_destroy(ctx));
}

/* Every rank in one group of two roles (all-gather and reduce-scatter) on
 * ctx's world, named `name`; shared on the CUDA backend like the context.
 * Give it back with tu_test_tp_done. */
static inline etp_group_t *tu_test_tp(etp_context_t *ctx, const char *name)
{
#ifdef ETP_SHARD_TEST_CUDA
    if (ctx == g_cuda_ctx && g_cuda_tp) return g_cuda_tp;
#endif
    etp_group_t *world, *tp;
    ETP_OK(etp_context_world(ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = name;
    gc.num_roles = 2;
    ETP_OK(etp_group_split(world, 0, g_rank, &gc, &tp));
#ifdef ETP_SHARD_TEST_CUDA
    if (ctx == g_cuda_ctx) g_cuda_tp = tp;
#endif
    return tp;
}

static inline void tu_test_tp_done(etp_group_t *tp)
{
#ifdef ETP_SHARD_TEST_CUDA
    if (tp == g_cuda_tp) return;
#endif
    ETP_OK(etp_group_destroy(tp));
}



#endif
