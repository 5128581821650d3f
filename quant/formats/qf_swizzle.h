/*
 * One launch of the scale swizzle (etp_quant_swizzle_scales) over up to
 * ETP__QSWZ_MAX scale matrices, as the quant module hands it to a backend:
 * plain data passed by value (a CUDA kernel parameter, a copied host-launch
 * argument), like etp__qbatch_t, so a launch allocates nothing and a
 * captured graph keeps its own copy.
 */
#ifndef ETP__QF_SWIZZLE_H
#define ETP__QF_SWIZZLE_H

#include <stddef.h>
#include <stdint.h>

/* Matrices per launch: 256 tensors with both directions. With the launch's
 * prefix sums the parameter block stays under CUDA's 32 KiB. */
#define ETP__QSWZ_MAX 512

typedef struct etp__qswz_mat {
    const uint8_t *in;
    uint8_t *out;
    /* The row-major matrix as stored (etp_quant_sizes' scale_rows x
     * scale_cols): rows a multiple of 128 and cols of 4, or, for MXFP8
     * columnwise (mxfp8_col), rows a multiple of 4 and cols of 128. */
    uint32_t rows, cols;
    uint32_t mxfp8_col; /* the GEMM's outer dimension is `cols` (a transposed view) */
    uint32_t pad_;
} etp__qswz_mat_t;

typedef struct etp__qswz_batch {
    uint32_t n;          /* matrices in m[], none of them empty */
    uint32_t unswizzle;  /* 0: row-major in, swizzled out; 1: the reverse */
    uint32_t sms;        /* multiprocessors to fill (0: unknown), as etp__qbatch_t */
    uint32_t pad_;
    const int32_t *noop; /* non-NULL and non-zero at run time: do nothing */
    etp__qswz_mat_t m[ETP__QSWZ_MAX];
} etp__qswz_batch_t;

/* Bytes of a batch holding n matrices (what must be copied). */
static inline size_t etp__qswz_batch_bytes(uint32_t n)
{
    return offsetof(etp__qswz_batch_t, m) + (size_t)n * sizeof(etp__qswz_mat_t);
}

#endif /* ETP__QF_SWIZZLE_H */
