/*
 * One launch of the quant kernels over up to ETP__QB_MAX tensors, as the
 * quant module hands it to a backend: plain data, passed by value (a CUDA
 * kernel parameter, a copied host-launch argument), so a launch needs no
 * device-side allocation and a captured graph keeps its own copy.
 */
#ifndef ETP__QF_BATCH_H
#define ETP__QF_BATCH_H

#include <stddef.h>
#include <stdint.h>

/* Tensors per launch. A kernel parameter block holds them (CUDA >= 12.1
 * allows 32 KiB); a call with more tensors is split into several launches. */
#define ETP__QB_MAX 256

enum etp__qb_op {
    ETP__QB_AMAX = 1,
    ETP__QB_CAST = 2,
    ETP__QB_DEQUANT = 3
};

enum etp__qb_format {
    ETP__QB_NVFP4 = 1,
    ETP__QB_MXFP8 = 2
};

/* Element types of inputs and dequantized outputs. */
enum etp__qb_dtype {
    ETP__QB_BF16 = 0,
    ETP__QB_F32 = 1
};

typedef struct etp__qb_tensor {
    const void *x;                /* AMAX/CAST: the input */
    void *y;                      /* DEQUANT: the output */
    void *row_data, *row_scales;  /* CAST writes, DEQUANT reads (NULL: not produced) */
    void *col_data, *col_scales;
    uint32_t rows, cols;          /* the original [M, K] */
    uint8_t dtype;                /* of x (AMAX, CAST) or y (DEQUANT) */
    uint8_t pad_[7];
} etp__qb_tensor_t;

typedef struct etp__qbatch {
    uint32_t op, format;
    uint32_t n;                   /* tensors in t[] */
    uint32_t first;               /* index of t[0] in the caller's arrays: the amax
                                     index and the stochastic-rounding tensor id */
    uint32_t e5m2, block2d, swizzle, stochastic;
    uint32_t direction;           /* DEQUANT: ETP_QUANT_ROWWISE or ETP_QUANT_COLUMNWISE */
    uint32_t sms;                 /* the device's multiprocessor count (read once, at
                                     quantizer creation), to size grids; 0: unknown */
    uint32_t clusters;            /* CAST on CUDA: the NVFP4 cast's thread-block clusters the device
                                     holds at once (read at quantizer creation); 0: no clusters */
    uint32_t compact_all;         /* CAST on CUDA: every launch that can compacts its scales (the
                                     test knob quant_compact_all; else large launches only) */
    uint32_t compact;             /* CAST on CUDA, NVFP4 16x16 blocks, row-major scales: this
                                     launch writes only the last of each 16 equal scale rows of its
                                     interior tiles, a second kernel copying it over the other 15
                                     (the launcher's choice, for its kernels; 0 from the module) */
    uint64_t seed;
    const int32_t *noop;          /* non-NULL and non-zero at run time: do nothing */
    float *amax_row, *amax_col;   /* AMAX outputs (either may be NULL), index first + i */
    const float *amax;            /* CAST/DEQUANT per-tensor amax (NVFP4), index first + i */
    void *workspace;              /* the quantizer's device scratch (CUDA multi-amax:
                                     ETP__QB_MAX max words, then as many counters; left
                                     zero after every launch) */
    etp__qb_tensor_t t[ETP__QB_MAX];
} etp__qbatch_t;

/* Bytes of a batch holding n tensors (what must be copied). */
static inline size_t etp__qbatch_bytes(uint32_t n)
{
    return offsetof(etp__qbatch_t, t) + (size_t)n * sizeof(etp__qb_tensor_t);
}

#endif /* ETP__QF_BATCH_H */
