/* PACKED forward and data-gradient GEMMs as one pointer-array batched
 * matmul: each expert's row block is cut into chunks of a fixed row count,
 * all chunks of all experts in one call (one launch, no per-expert kernel
 * ramps, waves over the whole layer). A count that is not a multiple of the
 * chunk takes its last chunk flush with the block's end, overlapping the one
 * before: those rows are computed twice, by the same kernel from the same
 * operands, to the same bits, and nothing outside the block is touched.
 * Experts of fewer rows than a chunk have their own matmuls.
 *
 * The rule below is the one both the host (counting the chunks of a call)
 * and the kernel (writing their pointers) follow. */
#ifndef ETP__GEMM_CHUNKS_H
#define ETP__GEMM_CHUNKS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __CUDACC__
#define ETP__CHUNK_HD static inline __host__ __device__
#else
#define ETP__CHUNK_HD static inline
#endif

/* Rows a chunk: two of the 128-row token side of a 256 x 128 tile. A
 * chunk is the tokens that share one read of their expert's weights, so
 * it must be big enough for the matmul to be bound by its FLOPs, not by
 * that read: on an H100, 32 experts of about 2048 rows by 4096 x 4096 ran
 * at 0.88 of one dense GEMM of the same FLOPs in 128-row chunks and at 0.95
 * in 256-row ones (despite the overlap of each block's last chunk: half a
 * chunk on average, 6% of 2048 rows); 128-row chunks apart from the others
 * ran at 0.43 (docs/PERF.md). */
#define ETP__GEMM_CHUNK_ROWS 256
/* The most experts one call's pointer kernel takes (its parameters); a
 * plan of more experts runs one matmul an expert. */
#define ETP__GEMM_CHUNK_MAX_EXPERTS 1024

/* Chunks of an expert of m rows: none below a chunk (its own matmul). */
ETP__CHUNK_HD int64_t etp__gemm_chunks_of(int64_t m)
{
    return m < ETP__GEMM_CHUNK_ROWS ? 0 : (m + ETP__GEMM_CHUNK_ROWS - 1) / ETP__GEMM_CHUNK_ROWS;
}

/* First row (within the block) of chunk j of an expert of m rows. */
ETP__CHUNK_HD int64_t etp__gemm_chunk_start(int64_t m, int64_t j)
{
    const int64_t r = j * ETP__GEMM_CHUNK_ROWS;
    return r + ETP__GEMM_CHUNK_ROWS <= m ? r : m - ETP__GEMM_CHUNK_ROWS;
}

/* What the pointer kernel writes: for each expert e with chunks, at
 * first[e] + j, A = a + e * a_expert (bytes), B = b + (offset[e] + start)
 * * b_row, D = d + (offset[e] + start) * d_row, into pa, pb, pd. */
typedef struct etp__gemm_chunk_args {
    const char *a, *b;
    char *d;
    int64_t a_expert, b_row, d_row;
    void **pa, **pb, **pd;
    int32_t experts;
    int32_t offset[ETP__GEMM_CHUNK_MAX_EXPERTS];
    int32_t count[ETP__GEMM_CHUNK_MAX_EXPERTS];
    int32_t first[ETP__GEMM_CHUNK_MAX_EXPERTS];
} etp__gemm_chunk_args_t;

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue the pointer kernel on s (the arguments travel as its parameters:
 * nothing to keep alive, capturable). Returns the launch status. */
cudaError_t etp__cuda_gemm_chunk_ptrs(cudaStream_t s, const etp__gemm_chunk_args_t *args);

#ifdef __cplusplus
}
#endif

#endif
