/*
 * etp/quant.h - block-scaled quantization (NVFP4 and MXFP8) of many tensors
 * at once, in split phases.
 *
 * A mixture-of-experts layer quantizes N expert weights before gathering
 * them. Instead of N amax launches, N all-reduces and N cast launches, etp
 * does it in three steps for all N together:
 *
 *   etp_quant_multi_amax()      one launch: the amax of each of the N tensors
 *   etp_quant_amax_allreduce()  one all-reduce (max) of the N amaxes over a group
 *   etp_quant_cast_only()       one launch: the N quantized tensors
 *
 * and etp_quant_quantize() chains the three ("one launch": per 256 tensors
 * and per input dtype, plus a scale-expansion launch for NVFP4 16x16
 * blocks with row-major scales on CUDA; a call over more is split into
 * launches of 256, all enqueued only after every argument of the call has
 * been checked). MXFP8 needs no per-tensor amax
 * (its scales are per block only): quantize is then the cast alone.
 * etp_quant_swizzle_scales() converts the scale matrices of N tensors
 * between row-major and cuBLASLt's tiled order in one launch (for scales
 * made or kept row-major, e.g. gathered, that a block-scaled GEMM needs
 * swizzled).
 *
 * Formats (docs/FORMATS.md defines every bit, layout and special value):
 * - NVFP4: E2M1 elements, one E4M3 scale per 16 elements (1x16 blocks, or
 *   16x16 blocks whose one scale is repeated on each of their 16 rows, so
 *   rowwise and columnwise copies agree), one FP32 per-tensor amax.
 * - MXFP8: E4M3 (default) or E5M2 elements, one E8M0 scale per 32 elements.
 * Rowwise data is [M, K] quantized along K; columnwise data is what the
 * transposed operand needs (NVFP4: the transpose [K, M]; MXFP8: [M, K]
 * quantized along M). The results are bit-exact with TransformerEngine's
 * formats, so they feed cuBLASLt block-scaled GEMMs.
 *
 * Memory: every pointer in the launch calls (tensors, amaxes, outputs, the
 * no-op flag) is device memory of the quantizer's context (host memory on
 * the host backend), written or read on `stream` in stream order. Outputs
 * are caller-provided, sized with etp_quant_sizes(); the launch calls
 * allocate nothing, never synchronize the host, and may be captured in a
 * CUDA graph.
 *
 * Empty arrays: any array of zero length may be NULL: the arrays of a call
 * with n = 0, the data of a tensor with 0 elements, and the data and scale
 * buffers of a direction whose size is 0 bytes (a tensor with rows or cols
 * 0). An empty tensor still has its amax entry (0).
 *
 * Alignment: tensors (inputs, dequantize destinations) must be aligned to
 * their element size, amax arrays and the no-op flag to 4 bytes; quantized
 * data and scale buffers may have any alignment. At most 2^32 - 1 tensors
 * a call.
 *
 * Errors: every call validates its arguments first (NULL pointers,
 * unsupported dtypes, shapes whose block dimension does not divide, buffers
 * too small, misaligned pointers) and on failure enqueues nothing and says,
 * in etp_last_error(), which tensor index and which sizes were wrong.
 *
 * Graphs: a graph that captured a quantizer's launches holds it: its
 * destroy refuses (ETP_ERR_BUSY) until those graphs are destroyed.
 *
 * Thread safety: a quantizer is used by one thread at a time, like its
 * context.
 */
#ifndef ETP_QUANT_H
#define ETP_QUANT_H

#include "etp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etp_quantizer etp_quantizer_t;

typedef enum etp_quant_format {
    ETP_QUANT_NVFP4 = 1,
    ETP_QUANT_MXFP8 = 2
} etp_quant_format_t;

/* MXFP8 element type. */
typedef enum etp_quant_elem {
    ETP_QUANT_ELEM_E4M3 = 0,
    ETP_QUANT_ELEM_E5M2 = 1
} etp_quant_elem_t;

/* NVFP4 block shape. MXFP8 blocks are always 1x32 (rowwise) / 32x1
 * (columnwise). */
typedef enum etp_quant_block {
    ETP_QUANT_BLOCK_1D = 1, /* 1x16 along the quantized dimension */
    ETP_QUANT_BLOCK_2D = 2  /* 16x16: one scale per block for both directions */
} etp_quant_block_t;

/* Directions, a bit set. */
#define ETP_QUANT_ROWWISE 1u
#define ETP_QUANT_COLUMNWISE 2u

typedef enum etp_quant_rounding {
    ETP_QUANT_ROUND_NEAREST = 0,   /* round to nearest, ties to even */
    ETP_QUANT_ROUND_STOCHASTIC = 1 /* NVFP4 elements only: Philox4x32-10 from `seed` */
} etp_quant_rounding_t;

typedef struct etp_quantizer_config {
    size_t size;                   /* sizeof(etp_quantizer_config_t) */
    etp_quant_format_t format;
    etp_quant_elem_t mxfp8_elem;   /* MXFP8 only (not checked for NVFP4) */
    etp_quant_block_t nvfp4_block; /* NVFP4 only (not checked for MXFP8) */
    unsigned directions;           /* ETP_QUANT_ROWWISE and/or ETP_QUANT_COLUMNWISE */
    int swizzle_scales;            /* 1: scales in cuBLASLt's 128x4 tiled order, the one a
                                      block-scaled GEMM reads. 0: row-major; with 16x16
                                      blocks on sm_90 as fast to cast into for large
                                      batches (scales compacted; H200: even to 3%
                                      faster, H100: 2-5% faster); 3-8% slower where that
                                      does not apply (smaller batches, 1x16 blocks);
                                      docs/PERF.md */
    etp_quant_rounding_t rounding;
    uint64_t seed;                 /* stochastic rounding; change it with etp_quantizer_set_seed */
    /* Device int32: when non-NULL and non-zero at run time, multi-amax,
     * cast-only, dequantize and scale-swizzle launches do nothing (so a
     * captured quantize can be skipped on replay). Read by the device, never
     * by the host; it must stay allocated as long as launches (and graphs
     * that captured them) may run. */
    const int32_t *noop_flag;
} etp_quantizer_config_t;

#define ETP_QUANTIZER_CONFIG_INIT                                                      \
    {                                                                                  \
        sizeof(etp_quantizer_config_t), ETP_QUANT_NVFP4, ETP_QUANT_ELEM_E4M3,          \
            ETP_QUANT_BLOCK_2D, ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE, 0,           \
            ETP_QUANT_ROUND_NEAREST, 0, NULL                                           \
    }

/* One input tensor: [rows, cols] row-major, BF16 or F32. rows or cols may be
 * 0 (an empty tensor: amax 0; its data and scale matrices are 0 bytes, so
 * nothing is written). */
typedef struct etp_quant_input {
    const void *data;
    etp_dtype_t dtype;
    size_t rows, cols;
} etp_quant_input_t;

/* Where one tensor's quantized form goes. Buffers of a direction the
 * quantizer does not produce are ignored (may be NULL). Each *_bytes is the
 * capacity of its buffer, checked against etp_quant_sizes(). */
typedef struct etp_quant_output {
    void *rowwise_data;
    size_t rowwise_data_bytes;
    void *rowwise_scales;
    size_t rowwise_scales_bytes;
    void *columnwise_data;
    size_t columnwise_data_bytes;
    void *columnwise_scales;
    size_t columnwise_scales_bytes;
} etp_quant_output_t;

/* A dequantized destination: [rows, cols] (the original orientation, for
 * either direction), BF16 or F32, capacity `bytes`. */
typedef struct etp_quant_dest {
    void *data;
    etp_dtype_t dtype;
    size_t rows, cols;
    size_t bytes;
} etp_quant_dest_t;

/* Buffer sizes of one [rows, cols] tensor under a quantizer. Directions the
 * quantizer does not produce have zero sizes. Scale matrices are
 * scale_rows x scale_cols bytes (padded; docs/FORMATS.md). */
typedef struct etp_quant_sizes {
    size_t size; /* sizeof(etp_quant_sizes_t) */
    size_t rowwise_data_bytes;
    size_t rowwise_scale_rows, rowwise_scale_cols, rowwise_scales_bytes;
    size_t columnwise_data_bytes;
    size_t columnwise_scale_rows, columnwise_scale_cols, columnwise_scales_bytes;
} etp_quant_sizes_t;

#define ETP_QUANT_SIZES_INIT {sizeof(etp_quant_sizes_t), 0, 0, 0, 0, 0, 0, 0, 0}

/* The scale matrices of one [rows, cols] tensor, for etp_quant_swizzle_scales:
 * one buffer per direction, of the scale matrix etp_quant_sizes() describes
 * (rowwise_scales_bytes, columnwise_scales_bytes). Buffers of a direction
 * the quantizer does not produce are ignored (may be NULL). Each *_bytes is
 * the capacity of its buffer. */
typedef struct etp_quant_scales {
    size_t rows, cols; /* the quantized tensor's [M, K], as given to etp_quant_sizes */
    void *rowwise;
    size_t rowwise_bytes;
    void *columnwise;
    size_t columnwise_bytes;
} etp_quant_scales_t;

/* Which way etp_quant_swizzle_scales converts. */
typedef enum etp_quant_swizzle_dir {
    ETP_QUANT_SWIZZLE = 1,  /* row-major in, cuBLASLt's 128x4 tiled order out */
    ETP_QUANT_UNSWIZZLE = 2 /* tiled in, row-major out */
} etp_quant_swizzle_dir_t;

/* Create a quantizer on a context (not while a CUDA graph is being
 * captured: it allocates and clears a small device scratch, owner
 * ETP_MEM_WORKSPACE, which the multi-amax launches use; launches of one
 * quantizer must therefore be ordered, on one stream or joined by events).
 * `config` NULL gives the defaults (NVFP4,
 * 2D blocks, rowwise and columnwise, row-major scales, round to nearest).
 * The other format's field (nvfp4_block for MXFP8, mxfp8_elem for NVFP4)
 * is neither checked nor used: a zero-initialised config with its format
 * set is valid.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULL ctx or out, an unknown format,
 * an unknown element (MXFP8) or block (NVFP4), an unknown rounding, no direction, stochastic rounding with MXFP8,
 * a config size that is not sizeof(etp_quantizer_config_t) or the end of
 * one of its fields, a noop_flag not 4-byte aligned), ETP_ERR_OUT_OF_MEMORY,
 * ETP_ERR_INVALID_STATE (during a capture: it allocates), ETP_ERR_BACKEND,
 * ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_quantizer_create(etp_context_t *ctx, const etp_quantizer_config_t *config,
                                          etp_quantizer_t **quantizer);

/* Destroy a quantizer. On CUDA it waits for the context's enqueued work
 * first (its launches use the quantizer's small device scratch; the host
 * backend's quantizer has none). NULL is a no-op.
 * Errors: ETP_ERR_BUSY while graphs that captured its launches live;
 * ETP_ERR_INVALID_STATE while a graph capture is in progress on the
 * context; ETP_ERR_TIMEOUT, ETP_ERR_BACKEND from the wait. On an error the
 * quantizer is as it was and may be destroyed again (on an aborted context
 * it is always destroyed). */
ETP_API etp_status_t etp_quantizer_destroy(etp_quantizer_t *quantizer);

/* Later launches use `seed` for stochastic rounding (a captured launch keeps
 * the seed it was captured with). */
ETP_API etp_status_t etp_quantizer_set_seed(etp_quantizer_t *quantizer, uint64_t seed);

/* Later launches read `flag` (device int32, 4-byte aligned, NULL for none)
 * as the no-op flag. */
ETP_API etp_status_t etp_quantizer_set_noop_flag(etp_quantizer_t *quantizer, const int32_t *flag);

/* Buffer sizes for a [rows, cols] tensor. Errors: ETP_ERR_INVALID_ARGUMENT
 * for NULL arguments, a sizes->size that is not sizeof(etp_quant_sizes_t),
 * rows or cols above INT32_MAX, and when a produced direction's block
 * dimension does not divide (rowwise: cols by 16 or 32; columnwise: rows by
 * 16 or 32), naming the sizes. */
ETP_API etp_status_t etp_quant_sizes(const etp_quantizer_t *quantizer, size_t rows, size_t cols,
                                     etp_quant_sizes_t *sizes);

/* Phase 1, one launch: amax_rowwise[i] and amax_columnwise[i] = the largest
 * |x| of tensor i (NaN elements ignored, +Inf if any is infinite, 0 for an
 * empty tensor), for i < n. Both arrays get the same values (a transposed
 * copy has the same amax); either may be NULL, not both (unless n is 0:
 * then both are empty and may be NULL). amax_count is the
 * number of floats in each array and must equal n (a mismatch is an error,
 * not a partial result). n may be 0 (nothing is enqueued). */
ETP_API etp_status_t etp_quant_multi_amax(etp_quantizer_t *quantizer, size_t n,
                                          const etp_quant_input_t *inputs, float *amax_rowwise,
                                          float *amax_columnwise, size_t amax_count,
                                          etp_stream_t *stream);

/* Phase 2: amax[i] = max over the ranks of `group` of amax[i], i < n, in
 * place, as ONE etp_allreduce on (group, role), enqueued on `stream`.
 * Collective: every rank of the group calls it with the same n. Inside
 * etp_batch_begin/end the all-reduce runs only at the batch's end, so the
 * cast that reads its result must come after the batch (etp_quant_cast_only
 * refuses inside one). */
ETP_API etp_status_t etp_quant_amax_allreduce(etp_group_t *group, int role, float *amax, size_t n,
                                              etp_stream_t *stream);

/* Phase 3, one launch: quantize tensor i into outputs[i] using the
 * per-tensor amax[i] (NVFP4: amax_count must equal n; MXFP8 ignores amax
 * and amax_count, amax may then be NULL). n may be 0. Refused
 * (ETP_ERR_INVALID_STATE) inside etp_batch_begin/end. */
ETP_API etp_status_t etp_quant_cast_only(etp_quantizer_t *quantizer, size_t n,
                                         const etp_quant_input_t *inputs, const float *amax,
                                         size_t amax_count, const etp_quant_output_t *outputs,
                                         etp_stream_t *stream);

/* Phases 1-3 chained. NVFP4: amax (n floats, written: the amaxes used, kept
 * for dequantization and the GEMM) gets the local amaxes, then, when group is
 * not NULL, their max over the group (one all-reduce on (group, role)),
 * then the cast; amax_count must equal n. MXFP8: the cast only; amax,
 * amax_count and group are ignored. Launches (and the collective) are
 * enqueued only after every local argument has been checked; what only
 * the collective can see (ranks passing different n, with
 * ETP_CHECK_COLLECTIVES) fails it after the multi-amax was enqueued: amax
 * then holds the local amaxes, no cast is enqueued, and the context is
 * aborted. Refused inside etp_batch_begin/end when group is not NULL. */
ETP_API etp_status_t etp_quant_quantize(etp_quantizer_t *quantizer, size_t n,
                                        const etp_quant_input_t *inputs, float *amax,
                                        size_t amax_count, etp_group_t *group, int role,
                                        const etp_quant_output_t *outputs, etp_stream_t *stream);

/* One launch: dequantize the `direction` copy (ETP_QUANT_ROWWISE or
 * ETP_QUANT_COLUMNWISE, which the quantizer must produce) of each of n
 * tensors into dests[i] (rows and cols are the original [M, K]; BF16 rounds
 * to nearest even). amax and amax_count as given to cast_only (NVFP4;
 * MXFP8: ignored). Reads the buffers of `quantized[i]` of that direction
 * only, checking their *_bytes. */
ETP_API etp_status_t etp_quant_dequantize(etp_quantizer_t *quantizer, size_t n,
                                          const etp_quant_output_t *quantized, const float *amax,
                                          size_t amax_count, unsigned direction, const etp_quant_dest_t *dests,
                                          etp_stream_t *stream);

/* One launch: convert the scale matrices of n tensors between row-major and
 * cuBLASLt's swizzled order (docs/FORMATS.md, "Scale layouts"). With
 * ETP_QUANT_SWIZZLE, out[i] gets in[i]'s row-major matrices in tiled order,
 * byte for byte what etp_quant_cast_only writes with swizzle_scales = 1
 * (padding entries move like the others); ETP_QUANT_UNSWIZZLE is the
 * inverse. The quantizer's format and directions say which matrices a tensor
 * has and their shapes (its swizzle_scales setting is not used): for each
 * produced direction, in[i] and out[i] each need a buffer of at least that
 * matrix's bytes (NULL only when it is empty), and out[i].rows, cols must
 * equal in[i]'s. Not in place: out[i]'s buffers must not overlap in[i]'s (an
 * error), nor any other buffer of the call (not checked). Buffers are
 * device memory of the quantizer's context (host memory on the host
 * backend), read and written on `stream` in stream order; nothing is
 * allocated, the host is not synchronized, and the call may be captured in
 * a CUDA graph. The quantizer's no-op flag applies. One launch holds 256
 * tensors with both directions (512 with one); more are split into several.
 * n may be 0 (nothing is enqueued).
 * Errors (nothing enqueued): ETP_ERR_INVALID_ARGUMENT (NULL quantizer,
 * stream, or in / out with n > 0; a dir that is not an
 * etp_quant_swizzle_dir_t; a stream of another context; and, naming the
 * tensor index, its shape and the sizes: a block dimension that does not
 * divide, out's shape different from in's, a NULL or too small buffer, in
 * and out overlapping), ETP_ERR_ABORTED. */
ETP_API etp_status_t etp_quant_swizzle_scales(etp_quantizer_t *quantizer, size_t n,
                                              const etp_quant_scales_t *in,
                                              const etp_quant_scales_t *out,
                                              etp_quant_swizzle_dir_t dir, etp_stream_t *stream);

#ifdef __cplusplus
}
#endif

#endif /* ETP_QUANT_H */
