/*
 * Block and scale layouts of NVFP4 and MXFP8 (docs/FORMATS.md has the
 * formulas and a worked example of each). A tensor is [rows, cols] = [M, K],
 * row-major; blocks run along K unless said. Usable from C and CUDA.
 *
 *   NVFP4 rowwise:    data [M, K/2] bytes (even index in the low nibble),
 *                     scales [roundup(M, 128), roundup(K/16, 4)]  (E4M3)
 *   NVFP4 columnwise: data [K, M/2] bytes (the transpose, blocks along M),
 *                     scales [roundup(K, 128), roundup(M/16, 4)]
 *   MXFP8 rowwise:    data [M, K], scales [roundup(M, 128), roundup(K/32, 4)] (E8M0)
 *   MXFP8 columnwise: data [M, K] (not transposed, 32x1 blocks along M),
 *                     scales [roundup(M/32, 4), roundup(K, 128)]
 *
 * Scale padding entries are zero. With swizzling, a scale matrix whose
 * "outer" dimension (the one padded to 128) has R rows and whose block
 * dimension has C columns is stored in cuBLASLt's 128x4 tiles of 512 bytes:
 * tiles in row-major order over (R/128, C/4), and inside a tile entry (r, c)
 * at (r % 32) * 16 + (r / 32) * 4 + c. For MXFP8 columnwise the outer
 * dimension is K: entry (block mb, column k) is the swizzled (k, mb) of an
 * [roundup(K, 128), roundup(M/32, 4)] matrix, the same number of bytes.
 */
#ifndef ETP__QF_LAYOUT_H
#define ETP__QF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "qf_codec.h"

enum {
    ETP__QF_NVFP4_BLOCK = 16,
    ETP__QF_MXFP8_BLOCK = 32,
    ETP__QF_SCALE_ROW_ALIGN = 128, /* the outer dimension of a scale matrix */
    ETP__QF_SCALE_COL_ALIGN = 4,   /* the block dimension of a scale matrix */
    ETP__QF_SWIZZLE_TILE = 512     /* bytes of one 128x4 tile */
};

ETP__QF_HD size_t etp__qf_roundup(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

/* One scale matrix: `rows` (padded to 128 along the outer dimension) by
 * `cols` (padded to 4 along the block dimension); bytes = rows * cols. */
typedef struct etp__qf_scale_shape {
    size_t rows, cols;
} etp__qf_scale_shape_t;

/* Byte offset of entry (r, c) of a scale matrix with `cols` columns (a
 * multiple of 4; rows a multiple of 128), row-major or swizzled. */
ETP__QF_HD size_t etp__qf_scale_offset(size_t r, size_t c, size_t cols, int swizzle)
{
    if (!swizzle) return r * cols + c;
    const size_t tile = (r / 128) * (cols / 4) + c / 4;
    return tile * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4;
}

/* Scale matrices of the four layouts, for an [m, k] tensor whose block
 * dimension divides as required (the caller checks). */
ETP__QF_HD etp__qf_scale_shape_t etp__qf_nvfp4_row_scales(size_t m, size_t k)
{
    etp__qf_scale_shape_t s = {etp__qf_roundup(m, 128), etp__qf_roundup(k / 16, 4)};
    return s;
}

ETP__QF_HD etp__qf_scale_shape_t etp__qf_nvfp4_col_scales(size_t m, size_t k)
{
    etp__qf_scale_shape_t s = {etp__qf_roundup(k, 128), etp__qf_roundup(m / 16, 4)};
    return s;
}

ETP__QF_HD etp__qf_scale_shape_t etp__qf_mxfp8_row_scales(size_t m, size_t k)
{
    etp__qf_scale_shape_t s = {etp__qf_roundup(m, 128), etp__qf_roundup(k / 32, 4)};
    return s;
}

/* Stored as [roundup(M/32, 4), roundup(K, 128)] (rows = M blocks). */
ETP__QF_HD etp__qf_scale_shape_t etp__qf_mxfp8_col_scales(size_t m, size_t k)
{
    etp__qf_scale_shape_t s = {etp__qf_roundup(m / 32, 4), etp__qf_roundup(k, 128)};
    return s;
}

/* Offset of the MXFP8 columnwise scale of block mb (rows mb*32 ..) and
 * column k, in a matrix of `shape` (etp__qf_mxfp8_col_scales). */
ETP__QF_HD size_t etp__qf_mxfp8_col_scale_offset(size_t mb, size_t k, etp__qf_scale_shape_t shape,
                                               int swizzle)
{
    if (!swizzle) return mb * shape.cols + k;
    /* the GEMM's view: outer dimension K (shape.cols), blocks along M */
    return etp__qf_scale_offset(k, mb, shape.rows, 1);
}

#endif /* ETP__QF_LAYOUT_H */
