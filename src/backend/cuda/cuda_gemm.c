/* CUDA GEMMs of the gemm module: cuBLASLt, one handle, descriptor, three
 * layouts and a workspace per plan.
 *
 * cuBLASLt is column-major; a row-major [r, c] matrix is the column-major
 * [c, r] one with the same leading dimension. So, with M the rows of an
 * expert (or of the dense GEMM) and W row-major [n, k] (ld w_ld):
 *   FORWARD Y^T [n, M]  = (W')^T X'      A = W' [k, n] (T), B = X' [k, M]
 *   DGRAD   dX^T [k, M] = W' dY'         A = W' [k, n],     B = dY' [n, M]
 *   WGRAD   dW^T [k, n] = X' (dY')^T     A = X' [k, M],     B = dY' [n, M] (T)
 * where X' = X^T etc. are the row-major buffers read column-major. M
 * appears as the column count of the row-side layouts: FIXED_SLOTS batches
 * the experts (strides S rows apart, and the weights' expert stride);
 * PACKED sets the column count per expert and takes the algorithm cached
 * for the count's bucket.
 *
 * PACKED spreads its experts' matmuls over the caller's stream and the
 * plan's auxiliary streams, forked from it and joined back (packed_run);
 * each stream has its own slice of the workspace. Its forward and dgrad
 * run the experts of a chunk's rows or more as one pointer-array batched
 * matmul over chunks of their blocks (kernels/gemm/gemm_chunks.h): on 4
 * H200s, 32 experts of about 2041 rows, 0.959 of one dense GEMM of the
 * same FLOPs against 0.89 one matmul an expert (docs/PERF.md); on an H100,
 * 0.95 in 256-row chunks against 0.88 in 128-row ones. */
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "../kernels_gemm.h"
#include "cuda_internal.h"
#include "kernels/gemm/gemm_chunks.h"

/* PACKED algorithm buckets: counts 1 .. 4 each alone, then every octave
 * (2^b, 2^(b+1)] in quarters, up to 2^31. A bucket's algorithm is the
 * heuristic's for the first count of it a call runs: the heuristic's pick
 * for a count (2041, say) can be faster for it than its pick for a round
 * bound (2048) of the bucket. */
enum { BUCKETS = 4 + 29 * 4 };

/* PACKED: lane 0 is the caller's stream, lanes 1 .. LANES-1 the plan's
 * auxiliary streams; each lane has its own slice of the workspace, since
 * matmuls running at once must not share one */
enum { LANES = 4 };

/* The most chunks one chunked matmul takes (its pointer arrays: 1.5 MiB of
 * the workspace at most); a call of more runs one matmul an expert. */
enum { MAX_CHUNKS = 1 << 16 };

typedef struct {
    cudaStream_t aux[LANES - 1];
    cudaEvent_t fork, join[LANES - 1];
} lanes_t;

typedef struct {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    void *ws;
    size_t ws_bytes;
    size_t lane_bytes; /* the workspace one matmul may use (PACKED: a lane's slice) */
    /* algo[b]: the heuristic's pick for the counts of bucket b (PACKED:
     * asked when have[b] is 0, then 1; 2: it had none, cuBLASLt chooses
     * per call); for the plan's M in algo[0] */
    cublasLtMatmulAlgo_t algo[BUCKETS];
    unsigned char have[BUCKETS];
    cublasLtMatmulPreference_t pref; /* PACKED: for the buckets' heuristics */
    int64_t cur_m;                   /* PACKED: the M the layouts hold now */
    lanes_t lanes;                   /* PACKED with more than one expert */
    /* PACKED forward and dgrad: the chunked matmul (gemm_chunks.h) */
    struct {
        int on; /* the plan has one: layouts, an algorithm, pointer arrays */
        cublasLtMatrixLayout_t la, lb, ld; /* M = a chunk, pointer-array batches */
        cublasLtMatmulAlgo_t algo;
        void **ptrs;   /* A, B, D arrays of max pointers each, after the lanes' workspace */
        int64_t max;   /* the chunks a call may have */
        int32_t batch; /* the batch count the layouts hold */
        etp__gemm_chunk_args_t args; /* the pointer kernel's parameters, filled per call */
    } ch;
    const etp__logger_t *log;
} cplan_t;

/* cuBLASLt's status as etp's: memory, a shape it cannot do (at plan
 * creation: unsupported), anything else a backend error */
static etp_status_t lt_err_as(cublasStatus_t st, int plan_time, const char *plan, const char *what)
{
    etp_status_t es = st == CUBLAS_STATUS_ALLOC_FAILED                 ? ETP_ERR_OUT_OF_MEMORY
                      : st == CUBLAS_STATUS_NOT_SUPPORTED && plan_time ? ETP_ERR_UNSUPPORTED
                                                                       : ETP_ERR_BACKEND;
    return etp__err(es, "gemm '%s': %s: cuBLASLt status %d (%s)", plan, what, (int)st,
                    cublasLtGetStatusString(st));
}

static etp_status_t lt_err(cublasStatus_t st, const char *plan, const char *what)
{
    return lt_err_as(st, 1, plan, what);
}

#define LT(call, what)                                                       \
    do {                                                                     \
        cublasStatus_t st_ = (call);                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS) return lt_err(st_, s->name, what); \
    } while (0)

static cudaDataType_t cuda_type(etp_dtype_t dt)
{
    return dt == ETP_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

/* A release that fails has nothing to undo: it is logged, not returned. */
static void released(const etp__logger_t *log, cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        ETP__LOG(log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND, "gemm plan: %s: cuBLASLt status %d (%s)",
                 what, (int)st, cublasLtGetStatusString(st));
}

static void cuda_released(const etp__logger_t *log, cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        ETP__LOG(log, ETP_LOG_WARN, ETP_SUBSYS_BACKEND, "gemm plan: %s: %s", what,
                 cudaGetErrorString(e));
}

static void plan_free(cplan_t *p)
{
    const etp__logger_t *log = p->log;
    if (p->la) released(log, cublasLtMatrixLayoutDestroy(p->la), "cublasLtMatrixLayoutDestroy");
    if (p->lb) released(log, cublasLtMatrixLayoutDestroy(p->lb), "cublasLtMatrixLayoutDestroy");
    if (p->ld) released(log, cublasLtMatrixLayoutDestroy(p->ld), "cublasLtMatrixLayoutDestroy");
    cublasLtMatrixLayout_t chl[3] = {p->ch.la, p->ch.lb, p->ch.ld};
    for (int i = 0; i < 3; i++)
        if (chl[i])
            released(log, cublasLtMatrixLayoutDestroy(chl[i]), "cublasLtMatrixLayoutDestroy");
    if (p->desc) released(log, cublasLtMatmulDescDestroy(p->desc), "cublasLtMatmulDescDestroy");
    if (p->pref)
        released(log, cublasLtMatmulPreferenceDestroy(p->pref), "cublasLtMatmulPreferenceDestroy");
    if (p->lt) released(log, cublasLtDestroy(p->lt), "cublasLtDestroy");
    for (int i = 0; i < LANES - 1; i++) {
        if (p->lanes.aux[i])
            cuda_released(log, cudaStreamDestroy(p->lanes.aux[i]), "cudaStreamDestroy");
        if (p->lanes.join[i])
            cuda_released(log, cudaEventDestroy(p->lanes.join[i]), "cudaEventDestroy");
    }
    if (p->lanes.fork) cuda_released(log, cudaEventDestroy(p->lanes.fork), "cudaEventDestroy");
    free(p);
}

/* Set the row count M of the layouts where it appears (PACKED). */
static etp_status_t set_m(cplan_t *p, const etp__gemm_shape_t *s, int64_t m)
{
    if (p->cur_m == m) return ETP_SUCCESS;
    const uint64_t cols = (uint64_t)m;
    if (s->op == ETP_GEMM_WGRAD)
        LT(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
           "layout A columns");
    else
        LT(cublasLtMatrixLayoutSetAttribute(p->ld, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
           "layout D columns");
    LT(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
       "layout B columns");
    p->cur_m = m;
    return ETP_SUCCESS;
}

static etp_status_t batch(cublasLtMatrixLayout_t l, int32_t count, int64_t stride,
                          const etp__gemm_shape_t *s)
{
    LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                        sizeof count),
       "layout batch count");
    LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                        sizeof stride),
       "layout batch stride");
    return ETP_SUCCESS;
}

/* The largest power of two dividing `bytes`, at most 256. */
static uint32_t align_of(int64_t bytes)
{
    uint32_t a = 1;
    while (a < 256 && bytes % (2 * a) == 0) a *= 2;
    return a;
}

/* The bucket of count m >= 1 (see BUCKETS): the counts above a power of
 * two by up to a quarter of it share an algorithm, not those up to twice
 * as many */
static int bucket_of(int64_t m)
{
    if (m <= 4) return (int)m - 1;
    int oct = 2;
    while (((int64_t)1 << (oct + 1)) < m) oct++; /* 2^oct < m <= 2^(oct+1) */
    const int64_t q = (int64_t)1 << (oct - 2);
    const int64_t quarter = (m - ((int64_t)1 << oct) + q - 1) / q;
    return 4 + (oct - 2) * 4 + (int)quarter - 1;
}

/* The heuristic's pick for the layouts as they are into *algo; *found 0:
 * it has none. */
static cublasStatus_t ask(cplan_t *p, cublasLtMatmulPreference_t pref, cublasLtMatmulAlgo_t *algo,
                          int *found)
{
    cublasLtMatmulHeuristicResult_t h;
    *found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(p->lt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                       pref, 1, &h, found);
    if (st == CUBLAS_STATUS_SUCCESS && *found > 0) *algo = h.algo;
    return st;
}

/* The plan's algorithm: none is a shape cuBLASLt cannot do (refused). */
static etp_status_t heuristic(cplan_t *p, const etp__gemm_shape_t *s,
                              cublasLtMatmulPreference_t pref, cublasLtMatmulAlgo_t *algo)
{
    int found = 0;
    LT(ask(p, pref, algo, &found), "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "gemm '%s': cuBLASLt has no algorithm for M %lld, n %lld, k %lld (%s out)",
                        s->name, (long long)p->cur_m, (long long)s->n, (long long)s->k,
                        etp_dtype_name(s->out_dtype));
    return ETP_SUCCESS;
}

static etp_status_t build(cplan_t *p, const etp__gemm_shape_t *s)
{
    const int64_t n = s->n, k = s->k;
    const int64_t M = s->rows; /* DENSE and FIXED_SLOTS: M of every call; PACKED: the largest */
    const cudaDataType_t bf = CUDA_R_16BF, od = cuda_type(s->out_dtype);
    LT(cublasLtCreate(&p->lt), "cublasLtCreate");
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
       "cublasLtMatmulDescCreate");
    cublasOperation_t ta = s->op == ETP_GEMM_FORWARD ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = s->op == ETP_GEMM_WGRAD ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
       "descriptor TRANSA");
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
       "descriptor TRANSB");
    /* row-side operands' row bytes: what PACKED pointers are aligned to */
    int64_t a_row = 0, b_row = 0, d_row = 0; /* 0: a weight operand */
    switch (s->op) {
    case ETP_GEMM_FORWARD:
        LT(cublasLtMatrixLayoutCreate(&p->la, bf, k, n, s->w_ld), "layout A (W)");
        LT(cublasLtMatrixLayoutCreate(&p->lb, bf, k, M, k), "layout B (X)");
        LT(cublasLtMatrixLayoutCreate(&p->ld, od, n, M, n), "layout D (Y)");
        b_row = k * 2;
        d_row = n * (int64_t)etp_dtype_size(s->out_dtype);
        break;
    case ETP_GEMM_DGRAD:
        LT(cublasLtMatrixLayoutCreate(&p->la, bf, k, n, s->w_ld), "layout A (W)");
        LT(cublasLtMatrixLayoutCreate(&p->lb, bf, n, M, n), "layout B (dY)");
        LT(cublasLtMatrixLayoutCreate(&p->ld, od, k, M, k), "layout D (dX)");
        b_row = n * 2;
        d_row = k * (int64_t)etp_dtype_size(s->out_dtype);
        break;
    case ETP_GEMM_WGRAD:
        LT(cublasLtMatrixLayoutCreate(&p->la, bf, k, M, k), "layout A (X)");
        LT(cublasLtMatrixLayoutCreate(&p->lb, bf, n, M, n), "layout B (dY)");
        LT(cublasLtMatrixLayoutCreate(&p->ld, od, k, n, s->w_ld), "layout D (dW)");
        a_row = k * 2;
        b_row = n * 2;
        break;
    }
    p->cur_m = M;
    if (s->layout == ETP_GEMM_FIXED_SLOTS && s->experts > 1) {
        const int32_t E = (int32_t)s->experts;
        const int64_t S = s->rows;
        switch (s->op) {
        case ETP_GEMM_FORWARD:
            ETP__TRY(batch(p->la, E, s->w_stride, s));
            ETP__TRY(batch(p->lb, E, S * k, s));
            ETP__TRY(batch(p->ld, E, S * n, s));
            break;
        case ETP_GEMM_DGRAD:
            ETP__TRY(batch(p->la, E, s->w_stride, s));
            ETP__TRY(batch(p->lb, E, S * n, s));
            ETP__TRY(batch(p->ld, E, S * k, s));
            break;
        case ETP_GEMM_WGRAD:
            ETP__TRY(batch(p->la, E, S * k, s));
            ETP__TRY(batch(p->lb, E, S * n, s));
            ETP__TRY(batch(p->ld, E, s->w_stride, s));
            break;
        }
    }

    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    etp_status_t st = ETP_SUCCESS;
    cublasStatus_t cs =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &p->lane_bytes, sizeof p->lane_bytes);
    /* a split-K algorithm reduces its partial sums in FP32 in the workspace
     * or not at all: reduced in place in a BF16 D (with beta 1, onto the
     * old dW), each partial is rounded to BF16 on the way, up to 2 ulps
     * from the once-rounded sum the product promises */
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &schemes, sizeof schemes);
    if (cs == CUBLAS_STATUS_SUCCESS && s->layout == ETP_GEMM_PACKED) {
        /* an expert's block starts at a whole row: its pointer is aligned
         * to the row bytes' power of two (the base to 256 bytes); a
         * pointer the call finds less aligned falls back (matmul) */
        const int wg_d = s->op == ETP_GEMM_WGRAD; /* D is dW, of the output dtype */
        const cublasLtMatmulPreferenceAttributes_t attr[3] =
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
             CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        /* a weight operand's expert e starts e expert strides in */
        const int64_t wsz = wg_d ? (int64_t)etp_dtype_size(s->out_dtype) : 2;
        const int64_t wbytes = s->experts > 1 ? s->w_stride * wsz : 256;
        const int64_t row[3] = {a_row ? a_row : wbytes, b_row, d_row ? d_row : wbytes};
        for (int i = 0; i < 3 && cs == CUBLAS_STATUS_SUCCESS; i++) {
            if (!row[i]) continue;
            uint32_t al = align_of(row[i]);
            cs = cublasLtMatmulPreferenceSetAttribute(pref, attr[i], &al, sizeof al);
            if (cs == CUBLAS_STATUS_SUCCESS && i == 2)
                cs =
                    cublasLtMatmulPreferenceSetAttribute(pref,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                         &al, sizeof al);
        }
    }
    if (cs != CUBLAS_STATUS_SUCCESS) st = lt_err(cs, s->name, "matmul preference");
    /* PACKED: a shape cuBLASLt cannot do is refused now, at the most rows;
     * the buckets' algorithms come with their first counts */
    if (st == ETP_SUCCESS) st = heuristic(p, s, pref, &p->algo[0]);
    if (s->layout == ETP_GEMM_PACKED && st == ETP_SUCCESS)
        p->pref = pref;
    else
        released(p->log, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
    return st;
}

/* PACKED: the auxiliary streams (non-blocking, so that the legacy
 * default stream does not order them) and the fork and join events */
static etp_status_t lanes_create(cplan_t *p, const etp__gemm_shape_t *s)
{
    char what[96];
    cudaError_t e = cudaEventCreateWithFlags(&p->lanes.fork, cudaEventDisableTiming);
    for (int i = 0; i < LANES - 1 && e == cudaSuccess; i++) {
        e = cudaStreamCreateWithFlags(&p->lanes.aux[i], cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&p->lanes.join[i], cudaEventDisableTiming);
    }
    if (e == cudaSuccess) return ETP_SUCCESS;
    snprintf(what, sizeof what, "gemm '%s': the auxiliary streams and events of its experts",
             s->name);
    return etp__cuda_error(what, e);
}

/* The chunked matmul's algorithm, asked at the most chunks with the PACKED
 * preference: among the heuristic's first 8, a 256 x 128 tile where the
 * weight side is a multiple of 256 (a chunk is two of its tiles and no
 * tile hangs over the weights' edge: on an H100 the heuristic's first
 * pick, 320 x 128, ran 3% slower), else its first. */
static cublasStatus_t chunk_algo(cplan_t *p, const etp__gemm_shape_t *s, int *found)
{
    cublasLtMatmulHeuristicResult_t h[8];
    *found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(p->lt, p->desc, p->ch.la, p->ch.lb,
                                                             p->ch.ld, p->ch.ld, p->pref, 8, h,
                                                             found);
    if (st != CUBLAS_STATUS_SUCCESS || *found < 1) return st;
    const int64_t wside = s->op == ETP_GEMM_FORWARD ? s->n : s->k;
    int pick = 0;
    for (int i = 0; wside % 256 == 0 && i < *found; i++) {
        int tile = 0;
        size_t w = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                 sizeof tile, &w) == CUBLAS_STATUS_SUCCESS &&
            tile == CUBLASLT_MATMUL_TILE_256x128) {
            pick = i;
            break;
        }
    }
    p->ch.algo = h[pick].algo;
    return st;
}

/* PACKED forward and dgrad: the chunked matmul's layouts (a chunk's rows,
 * pointer-array batches) and its algorithm, asked at the most chunks with
 * the PACKED preference. A shape cuBLASLt has no pointer-array algorithm
 * for keeps one matmul an expert (ch.on stays 0). */
static etp_status_t chunk_build(cplan_t *p, const etp__gemm_shape_t *s)
{
    const int64_t n = s->n, k = s->k, C = ETP__GEMM_CHUNK_ROWS;
    const cudaDataType_t bf = CUDA_R_16BF, od = cuda_type(s->out_dtype);
    const int fwd = s->op == ETP_GEMM_FORWARD;
    LT(cublasLtMatrixLayoutCreate(&p->ch.la, bf, k, n, s->w_ld), "chunk layout A (W)");
    LT(cublasLtMatrixLayoutCreate(&p->ch.lb, bf, fwd ? k : n, C, fwd ? k : n), "chunk layout B");
    LT(cublasLtMatrixLayoutCreate(&p->ch.ld, od, fwd ? n : k, C, fwd ? n : k), "chunk layout D");
    const int32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY, count = (int32_t)p->ch.max;
    const cublasLtMatrixLayout_t l[3] = {p->ch.la, p->ch.lb, p->ch.ld};
    for (int i = 0; i < 3; i++) {
        LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
                                            sizeof mode),
           "chunk layout batch mode");
        LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                            sizeof count),
           "chunk layout batch count");
    }
    p->ch.batch = count;
    int found = 0;
    const cublasStatus_t hs = chunk_algo(p, s, &found);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
        p->ch.on = 1;
        return ETP_SUCCESS;
    }
    ETP__LOG(p->log, ETP_LOG_DEBUG, ETP_SUBSYS_BACKEND,
             "gemm '%s': no pointer-array algorithm (cuBLASLt status %d): one matmul an expert",
             s->name, (int)hs);
    return ETP_SUCCESS;
}

static etp_status_t cuda_gemm_plan_create(etp__be_t *be, const etp__gemm_shape_t *shape,
                                          void *workspace, size_t ws_bytes, void **bplan)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cplan_t *p = calloc(1, sizeof *p);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "gemm '%s': out of memory", shape->name);
    p->ws = workspace;
    p->ws_bytes = ws_bytes;
    /* PACKED: a 256-byte aligned slice per lane (cuBLASLt's alignment);
     * forward and dgrad: the chunked matmul's pointer arrays after them,
     * where the workspace leaves each lane 1 MiB or more */
    const int lanes = shape->layout == ETP_GEMM_PACKED && shape->experts > 1;
    size_t ptr_bytes = 0;
    if (lanes && shape->op != ETP_GEMM_WGRAD && workspace &&
        shape->experts <= ETP__GEMM_CHUNK_MAX_EXPERTS) {
        int64_t max = shape->rows / ETP__GEMM_CHUNK_ROWS + shape->experts;
        if (max > MAX_CHUNKS) max = MAX_CHUNKS;
        ptr_bytes = ((size_t)max * 3 * sizeof(void *) + 255) / 256 * 256;
        if (ws_bytes >= ptr_bytes + LANES * ((size_t)1 << 20))
            p->ch.max = max;
        else
            ptr_bytes = 0;
    }
    p->lane_bytes = lanes ? (ws_bytes - ptr_bytes) / LANES / 256 * 256 : ws_bytes;
    if (ptr_bytes) p->ch.ptrs = (void **)((char *)workspace + LANES * p->lane_bytes);
    p->log = be->log;
    etp_status_t st = build(p, shape);
    if (st == ETP_SUCCESS && lanes) st = lanes_create(p, shape);
    if (st == ETP_SUCCESS && p->ch.max) st = chunk_build(p, shape);
    if (st != ETP_SUCCESS) {
        plan_free(p);
        return st;
    }
    *bplan = p;
    return ETP_SUCCESS;
}

static void cuda_gemm_plan_destroy(etp__be_t *be, void *bplan)
{
    if (!bplan) return;
    (void)etp__cuda_set_device(etp__cuda_of(be));
    plan_free(bplan);
}

/* One matmul: the layouts as they are, the algorithm `algo`, the
 * workspace of `lane`. A cached algorithm that cuBLASLt refuses for this
 * call's M or pointers is replaced by cuBLASLt's own choice (algo NULL),
 * still without any allocation. */
static cublasStatus_t lt_matmul(cplan_t *p, const cublasLtMatrixLayout_t l[3],
                                const cublasLtMatmulAlgo_t *algo, const void *A, const void *B,
                                void *D, float beta, cudaStream_t cs, int lane)
{
    const float one = 1.0f;
    void *ws = p->ws ? (char *)p->ws + (size_t)lane * p->lane_bytes : NULL;
    const size_t wsb = p->lane_bytes;
    cublasStatus_t st = cublasLtMatmul(p->lt, p->desc, &one, A, l[0], B, l[1], &beta, D, l[2], D,
                                       l[2], algo, ws, wsb, cs);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)
        st = cublasLtMatmul(p->lt, p->desc, &one, A, l[0], B, l[1], &beta, D, l[2], D, l[2], NULL,
                            ws, wsb, cs);
    return st;
}

/* expert: -1 all experts (one call), -2 the chunks of a chunked call (m of them) */
static etp_status_t matmul_failed(const etp__gemm_shape_t *s, cublasStatus_t st, int64_t expert,
                                  int64_t m)
{
    char what[160], who[48] = "all experts";
    if (expert >= 0) snprintf(who, sizeof who, "expert %lld", (long long)expert);
    if (expert == -2)
        snprintf(who, sizeof who, "%lld chunks of %d rows", (long long)m, ETP__GEMM_CHUNK_ROWS);
    snprintf(what, sizeof what, "cublasLtMatmul (%s, %s, rows %lld, n %lld, k %lld)",
             s->op == ETP_GEMM_FORWARD ? "forward"
             : s->op == ETP_GEMM_DGRAD ? "dgrad"
                                       : "wgrad",
             who, (long long)(expert == -2 ? m * ETP__GEMM_CHUNK_ROWS : m), (long long)s->n,
             (long long)s->k);
    return lt_err_as(st, 0, s->name, what);
}

static etp_status_t matmul(cplan_t *p, const etp__gemm_shape_t *s, const cublasLtMatmulAlgo_t *algo,
                           const void *A, const void *B, void *D, float beta, cudaStream_t cs,
                           int lane, int64_t expert, int64_t m)
{
    const cublasLtMatrixLayout_t l[3] = {p->la, p->lb, p->ld};
    const cublasStatus_t st = lt_matmul(p, l, algo, A, B, D, beta, cs, lane);
    return st == CUBLAS_STATUS_SUCCESS ? ETP_SUCCESS : matmul_failed(s, st, expert, m);
}

/* PACKED, an expert with no rows: dW = 0 with beta 0 (beta 1 leaves it;
 * forward and dgrad have no rows to write). */
static etp_status_t zero_empty(const etp__gemm_shape_t *s, const etp__gemm_call_t *c, int64_t e,
                               cudaStream_t cs)
{
    if (s->op != ETP_GEMM_WGRAD || c->beta != 0.0f) return ETP_SUCCESS;
    const size_t osz = etp_dtype_size(s->out_dtype);
    char *wout = (char *)c->out + (size_t)(e * s->w_stride) * osz;
    cudaError_t ce = cudaMemset2DAsync(wout, (size_t)s->w_ld * osz, 0, (size_t)s->k * osz,
                                       (size_t)s->n, cs);
    if (ce == cudaSuccess) return ETP_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "gemm '%s': zeroing expert %lld's dW", s->name, (long long)e);
    return etp__cuda_error(what, ce);
}

/* PACKED, expert e (count > 0): its matmul on cs with lane's workspace.
 * The layouts are set to e's count first: cuBLASLt reads them when the
 * matmul is enqueued, so the next expert may change them at once. */
static etp_status_t packed_expert(cplan_t *p, const etp__gemm_shape_t *s, const etp__gemm_call_t *c,
                                  int64_t e, cudaStream_t cs, int lane)
{
    const size_t osz = etp_dtype_size(s->out_dtype);
    const int64_t n = s->n, k = s->k, m = c->counts[e], r0 = c->offsets[e];
    ETP__TRY(set_m(p, s, m));
    const int b = bucket_of(m);
    if (!p->have[b]) {
        /* the bucket's first count: the heuristic, host work only (no
         * device work, no synchronization), once per bucket and plan */
        int found = 0;
        const cublasStatus_t hs = ask(p, p->pref, &p->algo[b], &found);
        if (hs != CUBLAS_STATUS_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "cublasLtMatmulAlgoGetHeuristic (expert %lld, rows %lld)",
                     (long long)e, (long long)m);
            return lt_err_as(hs, 0, s->name, what);
        }
        p->have[b] = found > 0 ? 1 : 2;
    }
    const cublasLtMatmulAlgo_t *algo = p->have[b] == 1 ? &p->algo[b] : NULL;
    const uint16_t *a = c->a, *x = c->b, *w = (const uint16_t *)c->w + e * s->w_stride;
    switch (s->op) {
    case ETP_GEMM_FORWARD:
        return matmul(p, s, algo, w, a + r0 * k, (char *)c->out + (size_t)(r0 * n) * osz, 0.0f, cs,
                      lane, e, m);
    case ETP_GEMM_DGRAD:
        return matmul(p, s, algo, w, a + r0 * n, (char *)c->out + (size_t)(r0 * k) * osz, 0.0f, cs,
                      lane, e, m);
    case ETP_GEMM_WGRAD:
        return matmul(p, s, algo, x + r0 * k, a + r0 * n,
                      (char *)c->out + (size_t)(e * s->w_stride) * osz, c->beta, cs, lane, e, m);
    }
    return ETP_SUCCESS;
}

/* PACKED forward or dgrad, the experts of a chunk's rows or more (nch
 * chunks): the pointer kernel, then one pointer-array batched matmul, both
 * on lane 1 (a plan-owned stream: the next call's kernel rewrites the
 * arrays only after this matmul has read them, whatever streams the calls
 * come from). */
static etp_status_t packed_chunks(cplan_t *p, const etp__gemm_shape_t *s, const etp__gemm_call_t *c,
                                  int64_t nch, cudaStream_t cs)
{
    etp__gemm_chunk_args_t *g = &p->ch.args;
    const int fwd = s->op == ETP_GEMM_FORWARD;
    const int64_t osz = (int64_t)etp_dtype_size(s->out_dtype);
    g->a = (const char *)c->w;
    g->a_expert = s->w_stride * 2;
    g->b = (const char *)c->a;
    g->b_row = (fwd ? s->k : s->n) * 2;
    g->d = (char *)c->out;
    g->d_row = (fwd ? s->n : s->k) * osz;
    g->pa = p->ch.ptrs;
    g->pb = p->ch.ptrs + p->ch.max;
    g->pd = p->ch.ptrs + 2 * p->ch.max;
    g->experts = (int32_t)s->experts;
    int32_t first = 0;
    for (int64_t e = 0; e < s->experts; e++) {
        g->offset[e] = c->offsets[e];
        g->count[e] = c->counts[e];
        g->first[e] = first;
        first += (int32_t)etp__gemm_chunks_of(c->counts[e]);
    }
    const cudaError_t ce = etp__cuda_gemm_chunk_ptrs(cs, g);
    if (ce != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "gemm '%s': the chunks' pointer kernel", s->name);
        return etp__cuda_error(what, ce);
    }
    const cublasLtMatrixLayout_t l[3] = {p->ch.la, p->ch.lb, p->ch.ld};
    if (p->ch.batch != (int32_t)nch) {
        const int32_t count = (int32_t)nch;
        for (int i = 0; i < 3; i++)
            LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof count),
               "chunk layout batch count");
        p->ch.batch = count;
    }
    const cublasStatus_t st = lt_matmul(p, l, &p->ch.algo, g->pa, g->pb, g->pd, 0.0f, cs, 1);
    return st == CUBLAS_STATUS_SUCCESS ? ETP_SUCCESS : matmul_failed(s, st, -2, nch);
}

/* PACKED: the experts' matmuls spread over the caller's stream (lane 0)
 * and the auxiliary streams, each to the lane with the fewest rows so far.
 * The lanes are forked from the caller's stream by an event recorded on
 * it, and joined back by an event recorded on each (also after a failure:
 * a graph capture of the caller's stream must not end with work of it left
 * on a lane). Running experts at once is safe: their output blocks (Y, dX)
 * or dW are disjoint. Empty experts' dW zeroing runs on lane 0. Two calls
 * of the plan share the lanes, so their lane work is in call order. With
 * fewer than two non-empty experts there is nothing to overlap: no fork,
 * all on the caller's stream. A chunked forward or dgrad puts its one
 * matmul over the experts of a chunk's rows or more on lane 1, the
 * smaller experts on the lanes as before. */
static etp_status_t packed_run(cplan_t *p, const etp__gemm_shape_t *s, const etp__gemm_call_t *c,
                               cudaStream_t cs)
{
    /* busy: the non-empty experts; nch of the chunks of nbig of them */
    int64_t busy = 0, nch = 0, nbig = 0, chunk_rows = 0;
    for (int64_t e = 0; e < s->experts; e++) {
        const int64_t k = p->ch.on ? etp__gemm_chunks_of(c->counts[e]) : 0;
        busy += c->counts[e] > 0;
        nch += k;
        nbig += k > 0;
        if (k) chunk_rows += c->counts[e];
    }
    const int chunked = nch >= 2 && nch <= p->ch.max;
    /* chunked: the big experts are one matmul on lane 1, the others on
     * lane 0 and a lane for each further one */
    if (chunked) busy -= nbig - 1;
    const int used = busy < 2 ? (chunked ? 2 : 1) : busy < LANES ? (int)busy : LANES;
    lanes_t *L = &p->lanes;
    char what[128];
    cudaError_t ce = used > 1 ? cudaEventRecord(L->fork, cs) : cudaSuccess;
    int forked = 1; /* lanes that run in the caller's stream's order */
    while (ce == cudaSuccess && forked < used) {
        ce = cudaStreamWaitEvent(L->aux[forked - 1], L->fork, 0);
        if (ce == cudaSuccess) forked++;
    }
    etp_status_t st = ETP_SUCCESS;
    if (ce != cudaSuccess) {
        snprintf(what, sizeof what, "gemm '%s': forking its experts' streams", s->name);
        st = etp__cuda_error(what, ce);
    }
    int64_t rows[LANES] = {0};
    if (chunked && st == ETP_SUCCESS) {
        rows[1] = chunk_rows;
        st = packed_chunks(p, s, c, nch, L->aux[0]);
    }
    for (int64_t e = 0; e < s->experts && st == ETP_SUCCESS; e++) {
        if (c->counts[e] == 0) {
            st = zero_empty(s, c, e, cs);
            continue;
        }
        if (chunked && etp__gemm_chunks_of(c->counts[e]) > 0) continue;
        int lane = 0;
        for (int i = 1; i < forked; i++)
            if (rows[i] < rows[lane]) lane = i;
        rows[lane] += c->counts[e];
        st = packed_expert(p, s, c, e, lane ? L->aux[lane - 1] : cs, lane);
    }
    for (int i = 1; i < forked; i++) {
        ce = cudaEventRecord(L->join[i - 1], L->aux[i - 1]);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent(cs, L->join[i - 1], 0);
        if (ce != cudaSuccess && st == ETP_SUCCESS) {
            snprintf(what, sizeof what, "gemm '%s': joining its experts' stream %d", s->name, i);
            st = etp__cuda_error(what, ce);
        }
    }
    return st;
}

static etp_status_t cuda_gemm_run(etp__be_t *be, etp__bstream_t *bs, const etp__gemm_shape_t *s,
                                  void *bplan, const etp__gemm_call_t *c)
{
    cplan_t *p = bplan;
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, bs, &cs));
    /* cuBLASLt's operands in its order: A, B (see the top of this file) */
    if (s->layout != ETP_GEMM_PACKED)
        return matmul(p, s, &p->algo[0], s->op == ETP_GEMM_WGRAD ? c->b : c->w, c->a, c->out,
                      c->beta, cs, 0, -1, s->rows);
    return packed_run(p, s, c, cs);
}

const etp__gemm_kernels_t etp__cuda_gemm_kernels = {
    /* NVIDIA's recommendation for Hopper */
    .default_workspace_bytes = (size_t)32 << 20,
    .plan_create = cuda_gemm_plan_create,
    .plan_destroy = cuda_gemm_plan_destroy,
    .run = cuda_gemm_run,
};
