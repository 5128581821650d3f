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
 * for the count's bucket. */
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "../kernels_gemm.h"
#include "cuda_internal.h"

enum { BUCKETS = 32 }; /* counts up to 2^31 */

typedef struct {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    void *ws;
    size_t ws_bytes;
    /* algo[b]: the heuristic's pick for M in (2^(b-1), 2^b] (PACKED), or
     * for the plan's M in algo[0] */
    cublasLtMatmulAlgo_t algo[BUCKETS];
    int64_t cur_m; /* PACKED: the M the layouts hold now */
    const etp__logger_t *log;
} cplan_t;

/* cuBLASLt's status as etp's: memory, a shape it cannot do (at plan
 * creation: unsupported), anything else a backend error */
static etp_status_t lt_err_as(cublasStatus_t st, int plan_time, const char *plan, const char *what)
{
    etp_status_t es = st == CUBLAS_STATUS_ALLOC_FAILED                ? ETP_ERR_OUT_OF_MEMORY
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

static void plan_free(cplan_t *p)
{
    const etp__logger_t *log = p->log;
    if (p->la) released(log, cublasLtMatrixLayoutDestroy(p->la), "cublasLtMatrixLayoutDestroy");
    if (p->lb) released(log, cublasLtMatrixLayoutDestroy(p->lb), "cublasLtMatrixLayoutDestroy");
    if (p->ld) released(log, cublasLtMatrixLayoutDestroy(p->ld), "cublasLtMatrixLayoutDestroy");
    if (p->desc) released(log, cublasLtMatmulDescDestroy(p->desc), "cublasLtMatmulDescDestroy");
    if (p->lt) released(log, cublasLtDestroy(p->lt), "cublasLtDestroy");
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
    LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
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

static etp_status_t heuristic(cplan_t *p, const etp__gemm_shape_t *s, cublasLtMatmulPreference_t pref,
                              cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(p->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &h, &found),
       "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1)
        return etp__err(ETP_ERR_UNSUPPORTED,
                        "gemm '%s': cuBLASLt has no algorithm for M %lld, n %lld, k %lld (%s out)",
                        s->name, (long long)p->cur_m, (long long)s->n, (long long)s->k,
                        etp_dtype_name(s->out_dtype));
    *algo = h.algo;
    return ETP_SUCCESS;
}

static etp_status_t build(cplan_t *p, const etp__gemm_shape_t *s)
{
    const int64_t n = s->n, k = s->k;
    const int64_t M = s->rows; /* DENSE and FIXED_SLOTS: M of every call; PACKED: the largest */
    const cudaDataType_t bf = CUDA_R_16BF, od = cuda_type(s->out_dtype);
    LT(cublasLtCreate(&p->lt), "cublasLtCreate");
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
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
    cublasStatus_t cs = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p->ws_bytes, sizeof p->ws_bytes);
    if (cs == CUBLAS_STATUS_SUCCESS && s->layout == ETP_GEMM_PACKED) {
        /* an expert's block starts at a whole row: its pointer is aligned
         * to the row bytes' power of two (the base to 256 bytes); a
         * pointer the call finds less aligned falls back (matmul) */
        const int wg_d = s->op == ETP_GEMM_WGRAD; /* D is dW, of the output dtype */
        const cublasLtMatmulPreferenceAttributes_t attr[3] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
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
                cs = cublasLtMatmulPreferenceSetAttribute(
                    pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
        }
    }
    if (cs != CUBLAS_STATUS_SUCCESS) st = lt_err(cs, s->name, "matmul preference");
    if (st == ETP_SUCCESS && s->layout != ETP_GEMM_PACKED) st = heuristic(p, s, pref, &p->algo[0]);
    for (int b = 0; st == ETP_SUCCESS && s->layout == ETP_GEMM_PACKED && b < BUCKETS; b++) {
        const int64_t m = (int64_t)1 << b < M ? (int64_t)1 << b : M;
        st = set_m(p, s, m);
        if (st == ETP_SUCCESS) st = heuristic(p, s, pref, &p->algo[b]);
        if (m == M) break;
    }
    released(p->log, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
    return st;
}

static etp_status_t cuda_gemm_plan_create(etp__be_t *be, const etp__gemm_shape_t *shape,
                                          void *workspace, size_t ws_bytes, void **bplan)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cplan_t *p = calloc(1, sizeof *p);
    if (!p) return etp__err(ETP_ERR_OUT_OF_MEMORY, "gemm '%s': out of memory", shape->name);
    p->ws = workspace;
    p->ws_bytes = ws_bytes;
    p->log = be->log;
    etp_status_t st = build(p, shape);
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

/* One matmul: the layouts as they are, the algorithm `algo`. A cached
 * algorithm that cuBLASLt refuses for this call's M or pointers is
 * replaced by cuBLASLt's own choice (algo NULL), still without any
 * allocation. */
static etp_status_t matmul(cplan_t *p, const etp__gemm_shape_t *s, const cublasLtMatmulAlgo_t *algo,
                           const void *A, const void *B, void *D, float beta, cudaStream_t cs,
                           int64_t expert, int64_t m)
{
    const float one = 1.0f;
    cublasStatus_t st = cublasLtMatmul(p->lt, p->desc, &one, A, p->la, B, p->lb, &beta, D, p->ld, D,
                                       p->ld, algo, p->ws, p->ws_bytes, cs);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)
        st = cublasLtMatmul(p->lt, p->desc, &one, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld,
                            NULL, p->ws, p->ws_bytes, cs);
    if (st == CUBLAS_STATUS_SUCCESS) return ETP_SUCCESS;
    char what[160], who[32] = "all experts";
    if (expert >= 0) snprintf(who, sizeof who, "expert %lld", (long long)expert);
    snprintf(what, sizeof what, "cublasLtMatmul (%s, %s, rows %lld, n %lld, k %lld)",
             s->op == ETP_GEMM_FORWARD ? "forward" : s->op == ETP_GEMM_DGRAD ? "dgrad" : "wgrad",
             who, (long long)m, (long long)s->n, (long long)s->k);
    return lt_err_as(st, 0, s->name, what);
}

static int bucket_of(int64_t m)
{
    int b = 0;
    while (((int64_t)1 << b) < m) b++;
    return b;
}

static etp_status_t cuda_gemm_run(etp__be_t *be, etp__bstream_t *bs, const etp__gemm_shape_t *s,
                                  void *bplan, const etp__gemm_call_t *c)
{
    cplan_t *p = bplan;
    cudaStream_t cs;
    ETP__TRY(etp__cuda_stream_for_launch(be, bs, &cs));
    const size_t osz = etp_dtype_size(s->out_dtype);
    const int64_t n = s->n, k = s->k;
    /* cuBLASLt's operands in its order: A, B (see the top of this file) */
    const int wg = s->op == ETP_GEMM_WGRAD;
    if (s->layout != ETP_GEMM_PACKED)
        return matmul(p, s, &p->algo[0], wg ? c->b : c->w, c->a, c->out, c->beta, cs, -1, s->rows);
    for (int64_t e = 0; e < s->experts; e++) {
        const int64_t m = c->counts[e], r0 = c->offsets[e];
        char *wout = (char *)c->out + (size_t)(e * s->w_stride) * osz;
        if (m == 0) {
            if (!wg || c->beta != 0.0f) continue;
            /* no rows: dW = 0 (beta 1 leaves it) */
            cudaError_t ce = cudaMemset2DAsync(wout, (size_t)s->w_ld * osz, 0, (size_t)k * osz,
                                               (size_t)n, cs);
            if (ce != cudaSuccess) {
                char what[96];
                snprintf(what, sizeof what, "gemm '%s': zeroing expert %lld's dW", s->name,
                         (long long)e);
                return etp__cuda_error(what, ce);
            }
            continue;
        }
        ETP__TRY(set_m(p, s, m));
        const cublasLtMatmulAlgo_t *algo = &p->algo[bucket_of(m)];
        const uint16_t *a = c->a, *x = c->b;
        switch (s->op) {
        case ETP_GEMM_FORWARD:
            ETP__TRY(matmul(p, s, algo, (const uint16_t *)c->w + e * s->w_stride, a + r0 * k,
                            (char *)c->out + (size_t)(r0 * n) * osz, 0.0f, cs, e, m));
            break;
        case ETP_GEMM_DGRAD:
            ETP__TRY(matmul(p, s, algo, (const uint16_t *)c->w + e * s->w_stride, a + r0 * n,
                            (char *)c->out + (size_t)(r0 * k) * osz, 0.0f, cs, e, m));
            break;
        case ETP_GEMM_WGRAD:
            ETP__TRY(matmul(p, s, algo, x + r0 * k, a + r0 * n, wout, c->beta, cs, e, m));
            break;
        }
    }
    return ETP_SUCCESS;
}

const etp__gemm_kernels_t etp__cuda_gemm_kernels = {
    /* NVIDIA's recommendation for Hopper */
    .default_workspace_bytes = (size_t)32 << 20,
    .plan_create = cuda_gemm_plan_create,
    .plan_destroy = cuda_gemm_plan_destroy,
    .run = cuda_gemm_run,
};
