/* Pairs of ranks all-gather and all-reduce a vector; every number is checked.
 * Backend AUTO: CUDA (one GPU a rank) where there are GPUs, else host.
 *   cc collectives.c $(pkg-config --cflags --libs etp) -o collectives
 *   mpirun -np 2 ./collectives */
#include <stdio.h>
#include <stdlib.h>

#include <etp/etp.h>
#include <etp/mpi.h>

#define CHECK(call)                                                                \
    do {                                                                           \
        etp_status_t st_ = (call);                                                 \
        if (st_ != ETP_SUCCESS) {                                                  \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,      \
                    etp_status_string(st_), etp_last_error());                     \
            MPI_Abort(MPI_COMM_WORLD, 1);                                          \
        }                                                                          \
    } while (0)

enum { N = 1000 };

/* element i of world rank r's vector: small integers, exact in FP32 sums */
static float value(int r, int i) { return (float)(r * 100 + i % 97); }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    etp_context_t *ctx;
    CHECK(etp_context_create_mpi(MPI_COMM_WORLD, NULL, &ctx)); /* NULL: defaults */
    etp_backend_t backend;
    CHECK(etp_context_backend(ctx, &backend));
    etp_group_t *world, *pair;
    CHECK(etp_context_world(ctx, &world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "pair";
    CHECK(etp_group_split(world, rank / 2, rank, &gc, &pair)); /* ranks 0-1, 2-3, ... */
    int n; /* 2, or 1 for the last rank of an odd world */
    CHECK(etp_group_size(pair, &n));
    const int first = rank / 2 * 2; /* world rank of the pair's rank 0 */

    /* Collectives take the context's memory (the GPU's on CUDA):
     * etp_mem_alloc, filled and read back with etp_memcpy_async. */
    float *mine, *all, *sum;
    CHECK(etp_mem_alloc(ctx, N * sizeof(float), ETP_MEM_USER, (void **)&mine));
    CHECK(etp_mem_alloc(ctx, (size_t)n * N * sizeof(float), ETP_MEM_USER, (void **)&all));
    CHECK(etp_mem_alloc(ctx, N * sizeof(float), ETP_MEM_USER, (void **)&sum));
    float *h_all = malloc((size_t)n * N * sizeof(float)), h_sum[N], h_mine[N];
    if (!h_all) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < N; i++) h_mine[i] = value(rank, i);

    etp_stream_t *s;
    CHECK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    CHECK(etp_memcpy_async(s, mine, h_mine, sizeof h_mine));
    CHECK(etp_allgather(pair, 0, mine, all, N, ETP_DTYPE_F32, s));
    CHECK(etp_allreduce(pair, 0, mine, sum, N, ETP_DTYPE_F32, ETP_REDOP_SUM, s));
    CHECK(etp_memcpy_async(s, h_all, all, (size_t)n * N * sizeof(float)));
    CHECK(etp_memcpy_async(s, h_sum, sum, sizeof h_sum));
    CHECK(etp_stream_synchronize(s)); /* the host buffers are written now */

    long bad = 0;
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int p = 0; p < n; p++) {
            bad += h_all[p * N + i] != value(first + p, i);
            want += value(first + p, i);
        }
        bad += h_sum[i] != want;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("collectives: %d ranks, backend %s: %s (%ld wrong numbers)\n", size,
               backend == ETP_BACKEND_CUDA ? "cuda" : "host", bad ? "FAILED" : "OK", bad);

    CHECK(etp_stream_destroy(s));
    CHECK(etp_mem_free(ctx, mine));
    CHECK(etp_mem_free(ctx, all));
    CHECK(etp_mem_free(ctx, sum));
    CHECK(etp_group_destroy(pair));
    CHECK(etp_context_destroy(ctx));
    free(h_all);
    MPI_Finalize();
    return bad ? 1 : 0;
}
