/*
 * The host reference quantizer and dequantizer of NVFP4 and MXFP8: the
 * oracle every other implementation (the CUDA kernels) is tested against,
 * written straight from the definitions in docs/FORMATS.md, one tensor at a
 * time, readable before fast. No state, no allocation.
 */
#ifndef ETP__QUANT_REF_H
#define ETP__QUANT_REF_H

#include <stddef.h>
#include <stdint.h>

#include "qf_batch.h"
#include "qf_layout.h"
#include "qf_swizzle.h"

typedef struct etp__qref_cfg {
    int format;       /* ETP__QB_NVFP4 or ETP__QB_MXFP8 */
    int e5m2;         /* MXFP8 elements E5M2 instead of E4M3 */
    int block2d;      /* NVFP4 16x16 blocks */
    int swizzle;      /* scales in cuBLASLt's 128x4 tiled order */
    int stochastic;   /* NVFP4 stochastic rounding */
    uint64_t seed;
    uint32_t tensor;  /* the tensor's id in the stochastic-rounding stream */
} etp__qref_cfg_t;

/* Largest |x| over the non-NaN elements of x[rows, cols] (dtype ETP__QB_*),
 * +Inf if any is infinite, 0 when empty. */
float etp__qref_amax(const void *x, int dtype, size_t rows, size_t cols);

/* Quantize x[rows, cols] with per-tensor amax `amax` (NVFP4 only). Each of
 * the rowwise pair (row_data, row_scales) and the columnwise pair may be
 * NULL (that direction is not produced). Scale matrices are written whole,
 * padding included (zeros); data buffers exactly their layout's bytes. The
 * block dimension of a produced direction must divide (the API checks). */
void etp__qref_quantize(const etp__qref_cfg_t *cfg, const void *x, int dtype, size_t rows,
                        size_t cols, float amax, uint8_t *row_data, uint8_t *row_scales,
                        uint8_t *col_data, uint8_t *col_scales);

/* Dequantize one direction (1 rowwise, 2 columnwise) into y[rows, cols]
 * (the original orientation) of dtype ETP__QB_BF16 or ETP__QB_F32. */
void etp__qref_dequantize(const etp__qref_cfg_t *cfg, unsigned direction, size_t rows,
                          size_t cols, float amax, const uint8_t *data, const uint8_t *scales,
                          void *y, int dtype);

/* Run one batch (what the host backend's kernel does), honouring its no-op
 * flag. */
void etp__qref_run_batch(const etp__qbatch_t *b);

/* Convert one stored scale matrix of rows x cols bytes between row-major
 * and cuBLASLt's swizzled order (unswizzle 0: in is row-major, out
 * swizzled; 1: the reverse), placing every entry, padding included, where
 * the cast writes it with swizzling on. mxfp8_col: an MXFP8 columnwise
 * matrix, whose swizzled form is that of its transpose. in and out must not
 * overlap. */
void etp__qref_swizzle(const uint8_t *in, uint8_t *out, size_t rows, size_t cols, int mxfp8_col,
                       int unswizzle);

/* Run one swizzle batch (what the host backend's kernel does), honouring
 * its no-op flag. */
void etp__qref_run_swizzle(const etp__qswz_batch_t *b);

#endif /* ETP__QUANT_REF_H */
