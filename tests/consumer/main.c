/* Links the installed etp and runs one all-reduce on the host backend. */
#include <stdio.h>

#include <etp/etp.h>
#include <etp/mpi.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_HOST;
    etp_context_t *ctx;
    etp_group_t *world;
    etp_stream_t *s;
    int x[3] = {rank, 1, 2 * rank}, ok = 0;
    if (etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx) == ETP_SUCCESS &&
        etp_context_world(ctx, &world) == ETP_SUCCESS &&
        etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s) == ETP_SUCCESS &&
        etp_allreduce(world, 0, x, x, 3, ETP_DTYPE_I32, ETP_REDOP_SUM, s) == ETP_SUCCESS &&
        etp_stream_synchronize(s) == ETP_SUCCESS) {
        int tri = size * (size - 1) / 2;
        ok = x[0] == tri && x[1] == size && x[2] == 2 * tri;
        etp_stream_destroy(s);
        etp_context_destroy(ctx);
    } else {
        fprintf(stderr, "consumer: %s\n", etp_last_error());
    }
    if (rank == 0) printf("consumer linked etp %d: %s\n", etp_version(NULL, NULL, NULL), ok ? "OK" : "FAILED");
    MPI_Finalize();
    return ok ? 0 : 1;
}
