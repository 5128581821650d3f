/*
 * etp-train's single-rank reference (tools/train/reference.h; label train,
 * one rank on the host backend):
 * - its quantize-dequantize (written from docs/FORMATS.md, no etp code) equals
 *   etp_quant_quantize + etp_quant_dequantize of the same BF16 weights to
 *   BF16, bit for bit, both directions, MXFP8 E4M3 and NVFP4 16x16 (what
 *   a gather_dequantized parameter's GEMMs read), several tensors a call
 *   (NVFP4's amax is each tensor's own), etp's input padded with zero rows
 *   as a parameter's is; data of many magnitudes (BF16 subnormals, all-zero
 *   blocks, blocks tiny against the tensor's amax, block amaxes of 448 2^e)
 *   from the printed seed;
 * - ref_step: a finite positive loss and finite, not all zero gradients;
 *   with lr = 0 a second step on the same batch repeats the loss and the
 *   weights; with a small lr the loss falls over 30 steps (every mode);
 * - the first step's gradients, two ranks' tokens, within 5% in norm of an
 *   FP64 model written here from train_model.h's equations (k = E, so no
 *   routing decision depends on rounding; the agreement seen is ~0.7%).
 */
#include <math.h>

#include "mpi_util.h"
#include "reference.h"

typedef struct {
    etp_context_t *ctx;
    etp_stream_t *s;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, ETP_HOST_STREAMS_SHUFFLE, (int64_t)(g_seed % 1000), -1, -1);
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

/* Element (i, j) of test tensor t: a uniform value in (-1, 1) times 2^e,
 * e drawn per 16x32 tile from a range that reaches BF16 subnormals (so that
 * blocks straddle tiles of different magnitudes); some tiles are zero, some
 * elements exactly 0, and one tensor of weight-like values. */
static uint16_t elem(uint64_t seed, uint64_t t, int64_t i, int64_t j)
{
    const uint64_t tile = (uint64_t)(i / 16) * 1000u + (uint64_t)(j / 32);
    const uint64_t rt = tu_rand(seed, 100 + t, 1, tile), re = tu_rand(seed, 100 + t, 2, (uint64_t)(i * 4096 + j));
    if (t == 0) return moe_f32_to_bf16(moe_normal(seed, t, (uint64_t)(i * 4096 + j)) * 0.125f);
    if (rt % 11 == 3 || re % 29 == 5) return (uint16_t)(re % 2 ? 0x8000u : 0u);
    const int e = t == 1 ? (int)(rt % 24) - 16 : (int)(rt % 170) - 140;
    /* 448 2^e: an MXFP8 block amax whose amax / 448 is a power of two */
    if (re % 37 == 1) return moe_f32_to_bf16(ldexpf(re % 2 ? -448.0f : 448.0f, e - 8));
    const float u = (float)((double)(re >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    /* spread within a tile too: elements in E4M3's subnormal range of their block */
    return moe_f32_to_bf16(ldexpf(u, e - (int)((re >> 40) % 20)));
}

static void check_format(fx_t *f, etp_quant_format_t fmt, uint64_t seed)
{
    enum { NT = 3 };
    const train_quant_t tq = fmt == ETP_QUANT_MXFP8 ? TRAIN_QUANT_MXFP8 : TRAIN_QUANT_NVFP4;
    const int64_t blk = fmt == ETP_QUANT_MXFP8 ? 32 : 16;
    etp_quantizer_config_t qc = ETP_QUANTIZER_CONFIG_INIT;
    qc.format = fmt;
    qc.nvfp4_block = ETP_QUANT_BLOCK_2D; /* as a quantized parameter's (src/shard/qgather.c) */
    qc.directions = ETP_QUANT_ROWWISE | ETP_QUANT_COLUMNWISE;
    etp_quantizer_t *qz;
    ETP_OK(etp_quantizer_create(f->ctx, &qc, &qz));

    int64_t rows[NT], cols[NT], padded[NT];
    etp_quant_input_t in[NT];
    etp_quant_output_t out[NT];
    etp_quant_dest_t dst[2][NT];
    uint16_t *x[NT], *y[2][NT];
    float *amax;
    ETP_OK(etp_mem_alloc(f->ctx, NT * sizeof(float), ETP_MEM_USER, (void **)&amax));
    for (int t = 0; t < NT; t++) {
        const uint64_t r = tu_rand(seed, 7, (uint64_t)fmt, (uint64_t)t);
        rows[t] = 1 + (int64_t)(r % 70);
        cols[t] = blk * (1 + (int64_t)((r >> 8) % 5));
        /* the parameter's padding: whole blocks of zero rows past the weight */
        padded[t] = (rows[t] + blk - 1) / blk * blk + blk * (int64_t)((r >> 16) % 2);
        const size_t n = (size_t)(padded[t] * cols[t]);
        ETP_OK(etp_mem_alloc(f->ctx, n * 2, ETP_MEM_USER, (void **)&x[t]));
        memset(x[t], 0, n * 2);
        for (int64_t i = 0; i < rows[t]; i++)
            for (int64_t j = 0; j < cols[t]; j++) x[t][i * cols[t] + j] = elem(seed, (uint64_t)t, i, j);
        in[t] = (etp_quant_input_t){x[t], ETP_DTYPE_BF16, (size_t)padded[t], (size_t)cols[t]};
        etp_quant_sizes_t sz = ETP_QUANT_SIZES_INIT;
        ETP_OK(etp_quant_sizes(qz, (size_t)padded[t], (size_t)cols[t], &sz));
        void *b[4];
        const size_t bytes[4] = {sz.rowwise_data_bytes, sz.rowwise_scales_bytes,
                                 sz.columnwise_data_bytes, sz.columnwise_scales_bytes};
        for (int k = 0; k < 4; k++) {
            ETP_OK(etp_mem_alloc(f->ctx, bytes[k], ETP_MEM_USER, &b[k]));
            tu_poison(b[k], bytes[k]);
        }
        out[t] = (etp_quant_output_t){b[0], bytes[0], b[1], bytes[1], b[2], bytes[2], b[3], bytes[3]};
        for (int d = 0; d < 2; d++) {
            ETP_OK(etp_mem_alloc(f->ctx, n * 2, ETP_MEM_USER, (void **)&y[d][t]));
            tu_poison(y[d][t], n * 2);
            dst[d][t] = (etp_quant_dest_t){y[d][t], ETP_DTYPE_BF16, (size_t)padded[t], (size_t)cols[t], n * 2};
        }
    }
    ETP_OK(etp_quant_quantize(qz, NT, in, amax, NT, NULL, 0, out, f->s));
    ETP_OK(etp_quant_dequantize(qz, NT, out, fmt == ETP_QUANT_NVFP4 ? amax : NULL, NT,
                                ETP_QUANT_ROWWISE, dst[0], f->s));
    ETP_OK(etp_quant_dequantize(qz, NT, out, fmt == ETP_QUANT_NVFP4 ? amax : NULL, NT,
                                ETP_QUANT_COLUMNWISE, dst[1], f->s));
    ETP_OK(etp_stream_synchronize(f->s));

    for (int t = 0; t < NT; t++) {
        const int64_t n = rows[t] * cols[t];
        uint16_t *mine = malloc((size_t)n * 2);
        int64_t nonzero = 0;
        for (int d = 0; d < 2; d++) {
            for (int64_t i = 0; i < n; i++) mine[i] = 0xA5A5u;
            assert_int_equal(ref_dequantize(tq, d, x[t], rows[t], cols[t], mine), 0);
            for (int64_t i = 0; i < n; i++) {
                if (mine[i] != y[d][t][i]) {
                    print_error("%s %s tensor %d [%lld, %lld] (padded %lld), element (%lld, %lld): "
                                "x 0x%04x, reference 0x%04x, etp 0x%04x\n",
                                fmt == ETP_QUANT_MXFP8 ? "MXFP8" : "NVFP4", d ? "columnwise" : "rowwise", t,
                                (long long)rows[t], (long long)cols[t], (long long)padded[t],
                                (long long)(i / cols[t]), (long long)(i % cols[t]), x[t][i], mine[i],
                                y[d][t][i]);
                    fail();
                }
                nonzero += (mine[i] & 0x7fffu) != 0;
            }
            /* the padding dequantizes to zeros */
            for (int64_t i = n; i < padded[t] * cols[t]; i++) assert_int_equal(y[d][t][i] & 0x7fffu, 0);
        }
        if (t == 0) assert_true(nonzero > 0); /* a small tensor of the others may be one zero tile */
        free(mine);
    }
    /* the weight-like tensor loses precision: the comparison saw rounding */
    int64_t changed = 0;
    for (int64_t i = 0; i < rows[0] * cols[0]; i++) changed += y[0][0][i] != x[0][i];
    assert_true(changed > 0);

    for (int t = 0; t < NT; t++) {
        ETP_OK(etp_mem_free(f->ctx, x[t]));
        void *b[4] = {out[t].rowwise_data, out[t].rowwise_scales, out[t].columnwise_data,
                      out[t].columnwise_scales};
        for (int k = 0; k < 4; k++) ETP_OK(etp_mem_free(f->ctx, b[k]));
        for (int d = 0; d < 2; d++) ETP_OK(etp_mem_free(f->ctx, y[d][t]));
    }
    ETP_OK(etp_mem_free(f->ctx, amax));
    ETP_OK(etp_quantizer_destroy(qz));
    ETP_OK(etp_context_check(f->ctx));
}

static void test_dequant_mxfp8(void **state)
{
    for (int rep = 0; rep < 4; rep++) {
        check_format(*state, ETP_QUANT_MXFP8, tu_mix(g_seed + (uint64_t)rep));
    }
}

static void test_dequant_nvfp4(void **state)
{
    for (int rep = 0; rep < 4; rep++) {
        check_format(*state, ETP_QUANT_NVFP4, tu_mix(g_seed + (uint64_t)rep));
    }
}

/* ---- ref_step ------------------------------------------------------------------- */

static train_shape_t tiny(train_quant_t q, float lr)
{
    train_shape_t s;
    memset(&s, 0, sizeof s);
    s.layers = 2;
    s.hidden = 32;
    s.ffn = 64;
    s.experts = 4;
    s.topk = 2;
    s.tokens = 16;
    s.tokens_step = 0;
    s.pool = 1;
    s.seed = g_seed;
    s.quant = q;
    s.ep = 2;
    s.lr = lr;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    return s;
}

static int64_t weight_count(const train_shape_t *s, train_weight_t w)
{
    int64_t e, r, c;
    train_weight_shape(s, w, &e, &r, &c);
    return e * r * c;
}

static void test_step_lr0(void **state)
{
    (void)state;
    for (int q = TRAIN_QUANT_NONE; q <= TRAIN_QUANT_NVFP4; q++) {
        train_shape_t s = tiny((train_quant_t)q, 0.0f);
        ref_model_t *m = NULL;
        assert_int_equal(ref_create(&s, 1, s.ep, 1, NULL, &m), 0);
        double l0 = -1, l1 = -1;
        uint16_t *before[TRAIN_WEIGHTS];
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            const size_t n = (size_t)weight_count(&s, (train_weight_t)w);
            before[w] = malloc(n * 2);
            memcpy(before[w], ref_weight(m, 1, (train_weight_t)w), n * 2);
        }
        assert_int_equal(ref_step(m, 0, &l0), 0);
        assert_true(isfinite(l0) && l0 > 0);
        for (int l = 0; l < s.layers; l++)
            for (int w = 0; w < TRAIN_WEIGHTS; w++) {
                const float *g = ref_grad(m, l, (train_weight_t)w);
                const int64_t n = weight_count(&s, (train_weight_t)w);
                int64_t nz = 0;
                for (int64_t i = 0; i < n; i++) {
                    assert_true(isfinite(g[i]));
                    nz += g[i] != 0.0f;
                }
                /* W1/W2 of an expert no token chose have zero gradients; the rest not */
                assert_true(nz > n / (w >= TRAIN_W1 ? 2 * s.experts : 2));
            }
        assert_int_equal(ref_step(m, 1, &l1), 0);
        if (l1 != l0) {
            print_error("quant %d: lr 0, loss %.17g then %.17g\n", q, l0, l1);
            fail();
        }
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            const size_t n = (size_t)weight_count(&s, (train_weight_t)w);
            assert_memory_equal(before[w], ref_weight(m, 1, (train_weight_t)w), n * 2);
            free(before[w]);
        }
        ref_destroy(m);
    }
}

static void test_loss_falls(void **state)
{
    (void)state;
    for (int q = TRAIN_QUANT_NONE; q <= TRAIN_QUANT_NVFP4; q++) {
        train_shape_t s = tiny((train_quant_t)q, 3e-3f);
        ref_model_t *m = NULL;
        assert_int_equal(ref_create(&s, 1, s.ep, 1, NULL, &m), 0);
        double first = 0, loss = 0;
        for (int t = 0; t < 30; t++) {
            assert_int_equal(ref_step(m, t, &loss), 0);
            assert_true(isfinite(loss));
            if (t == 0) first = loss;
        }
        printf("quant %d: loss %.6g -> %.6g over 30 steps\n", q, first, loss);
        assert_true(loss < 0.8 * first);
        ref_destroy(m);
    }
}

/* ---- the gradients against an FP64 model ------------------------------------------ */

/* The model of train_model.h in FP64 with no rounding, written from its
 * equations, for k = E (every token takes every expert, so that rounding
 * cannot change a routing decision): the gradients of the loss at the
 * student weights w[l * 4 + weight] (BF16 values) on input x0 with
 * target tgt (both [N, H]) into g64 (zeroed by the caller). */
typedef struct {
    int L, E;
    int64_t N, H, F;
} twin_t;

static double silu64(double a)
{
    return a / (1.0 + exp(-a));
}

static void twin_forward(const twin_t *t, double *const *w, const double *x0, double *xs, double *us,
                         double *ps, double *as, double *os, double *y)
{
    const int64_t N = t->N, H = t->H, F = t->F;
    const int E = t->E;
    for (int64_t i = 0; i < N * H; i++) xs[i] = x0[i];
    for (int l = 0; l < t->L; l++) {
        double *const *wl = w + l * TRAIN_WEIGHTS;
        double *x = xs + l * N * H, *u = us + l * N * H, *p = ps + l * N * E;
        double *a = as + l * N * E * F, *o = os + l * N * E * H;
        double *out = l + 1 < t->L ? xs + (l + 1) * N * H : y;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t i = 0; i < H; i++) {
                double acc = 0;
                for (int64_t j = 0; j < H; j++) acc += x[n * H + j] * wl[TRAIN_WP][i * H + j];
                u[n * H + i] = x[n * H + i] + acc;
            }
            double zmax = -1e300, z[64], sum = 0;
            for (int e = 0; e < E; e++) {
                z[e] = 0;
                for (int64_t j = 0; j < H; j++) z[e] += u[n * H + j] * wl[TRAIN_WR][e * H + j];
                zmax = z[e] > zmax ? z[e] : zmax;
            }
            for (int e = 0; e < E; e++) sum += exp(z[e] - zmax);
            for (int e = 0; e < E; e++) p[n * E + e] = exp(z[e] - zmax) / sum;
            for (int64_t h = 0; h < H; h++) out[n * H + h] = u[n * H + h];
            for (int e = 0; e < E; e++) {
                double *ae = a + (n * E + e) * F, *oe = o + (n * E + e) * H;
                for (int64_t f = 0; f < F; f++) {
                    ae[f] = 0;
                    for (int64_t h = 0; h < H; h++) ae[f] += u[n * H + h] * wl[TRAIN_W1][(e * F + f) * H + h];
                }
                for (int64_t h = 0; h < H; h++) {
                    oe[h] = 0;
                    for (int64_t f = 0; f < F; f++) oe[h] += silu64(ae[f]) * wl[TRAIN_W2][(e * H + h) * F + f];
                    out[n * H + h] += p[n * E + e] * oe[h];
                }
            }
        }
    }
}

static void twin_grads(const twin_t *t, double *const *w, const double *x0, const double *tgt,
                       double *const *g64)
{
    const int64_t N = t->N, H = t->H, F = t->F;
    const int E = t->E, L = t->L;
    double *xs = calloc((size_t)(L * N * H), sizeof(double)), *us = calloc((size_t)(L * N * H), sizeof(double));
    double *ps = calloc((size_t)(L * N * E), sizeof(double)), *as = calloc((size_t)(L * N * E * F), sizeof(double));
    double *os = calloc((size_t)(L * N * E * H), sizeof(double)), *y = calloc((size_t)(N * H), sizeof(double));
    double *g = calloc((size_t)(N * H), sizeof(double)), *gx = calloc((size_t)(N * H), sizeof(double));
    double *gs = calloc((size_t)F, sizeof(double)), *gu = calloc((size_t)H, sizeof(double));
    twin_forward(t, w, x0, xs, us, ps, as, os, y);
    for (int64_t i = 0; i < N * H; i++) g[i] = 2.0 * (y[i] - tgt[i]) / ((double)N * (double)H);
    for (int l = L - 1; l >= 0; l--) {
        double *const *wl = w + l * TRAIN_WEIGHTS;
        double *const *gl = g64 + l * TRAIN_WEIGHTS;
        const double *x = xs + l * N * H, *u = us + l * N * H, *p = ps + l * N * E;
        const double *a = as + l * N * E * F, *o = os + l * N * E * H;
        for (int64_t n = 0; n < N; n++) {
            const double *gn = g + n * H;
            double gw[64], dot = 0;
            for (int64_t h = 0; h < H; h++) gu[h] = gn[h];
            for (int e = 0; e < E; e++) {
                const double *ae = a + (n * E + e) * F, *oe = o + (n * E + e) * H;
                const double pe = p[n * E + e];
                gw[e] = 0;
                for (int64_t h = 0; h < H; h++) gw[e] += gn[h] * oe[h];
                for (int64_t f = 0; f < F; f++) {
                    gs[f] = 0;
                    for (int64_t h = 0; h < H; h++) {
                        gs[f] += pe * gn[h] * wl[TRAIN_W2][(e * H + h) * F + f];
                        gl[TRAIN_W2][(e * H + h) * F + f] += pe * gn[h] * silu64(ae[f]);
                    }
                    const double sg = 1.0 / (1.0 + exp(-ae[f]));
                    const double ga = gs[f] * sg * (1.0 + ae[f] * (1.0 - sg));
                    for (int64_t h = 0; h < H; h++) {
                        gu[h] += ga * wl[TRAIN_W1][(e * F + f) * H + h];
                        gl[TRAIN_W1][(e * F + f) * H + h] += ga * u[n * H + h];
                    }
                }
                dot += gw[e] * pe;
            }
            for (int e = 0; e < E; e++) {
                const double dz = p[n * E + e] * (gw[e] - dot);
                for (int64_t h = 0; h < H; h++) {
                    gu[h] += dz * wl[TRAIN_WR][e * H + h];
                    gl[TRAIN_WR][e * H + h] += dz * u[n * H + h];
                }
            }
            for (int64_t i = 0; i < H; i++) {
                gx[n * H + i] = gu[i];
                for (int64_t j = 0; j < H; j++) gl[TRAIN_WP][i * H + j] += gu[i] * x[n * H + j];
            }
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < H; j++) gx[n * H + j] += gu[i] * wl[TRAIN_WP][i * H + j];
        }
        memcpy(g, gx, (size_t)(N * H) * sizeof(double));
    }
    free(xs), free(us), free(ps), free(as), free(os), free(y), free(g), free(gx), free(gs), free(gu);
}

/* Every weight's gradient within a few percent (in norm) of the FP64
 * model's: the BF16 roundings of the activations and the targets made in
 * BF16 explain a percent or so; a wrong term, sign or transpose would not
 * come near (the twin shares no code with the reference). */
static void test_grads_vs_fp64(void **state)
{
    (void)state;
    train_shape_t s = tiny(TRAIN_QUANT_NONE, 0.0f);
    s.topk = s.experts;
    s.tokens = 24;
    s.tokens_step = 8; /* ranks of 24 and 16 tokens */
    const int ranks = 2;
    const twin_t t = {s.layers, s.experts, 40, s.hidden, s.ffn};
    ref_model_t *m = NULL;
    assert_int_equal(ref_create(&s, 1, s.ep, ranks / s.ep, NULL, &m), 0);
    double *w[2][2 * TRAIN_WEIGHTS], *g64[2 * TRAIN_WEIGHTS];
    for (int l = 0; l < s.layers; l++)
        for (int k = 0; k < TRAIN_WEIGHTS; k++) {
            const int i = l * TRAIN_WEIGHTS + k;
            const int64_t n = weight_count(&s, (train_weight_t)k);
            g64[i] = calloc((size_t)n, sizeof(double));
            for (int te = 0; te < 2; te++) {
                w[te][i] = malloc((size_t)n * sizeof(double));
                const float sc = train_weight_scale(&s, (train_weight_t)k, te);
                for (int64_t j = 0; j < n; j++)
                    w[te][i][j] = moe_bf16_to_f32(moe_f32_to_bf16(
                        moe_normal(s.seed, train_tensor_weight(l, (train_weight_t)k, te), (uint64_t)j) * sc));
            }
            /* the reference's student weights are these */
            const uint16_t *rw = ref_weight(m, l, (train_weight_t)k);
            for (int64_t j = 0; j < n; j++) assert_true(moe_bf16_to_f32(rw[j]) == w[0][i][j]);
        }
    const int64_t NH = t.N * t.H;
    double *x0 = malloc((size_t)NH * sizeof(double)), *tg = malloc((size_t)NH * sizeof(double));
    for (int64_t i = 0; i < NH; i++)
        x0[i] = moe_bf16_to_f32(moe_f32_to_bf16(moe_normal(s.seed, train_tensor_input(0), (uint64_t)i)));
    /* the targets: the teacher's output, rounded to BF16 as the reference's are */
    {
        const int64_t L = t.L, N = t.N, H = t.H, F = t.F, E = t.E;
        double *xs = malloc((size_t)(L * N * H) * sizeof(double)), *us = malloc((size_t)(L * N * H) * sizeof(double));
        double *ps = malloc((size_t)(L * N * E) * sizeof(double)), *as = malloc((size_t)(L * N * E * F) * sizeof(double));
        double *os = malloc((size_t)(L * N * E * H) * sizeof(double));
        twin_forward(&t, w[1], x0, xs, us, ps, as, os, tg);
        for (int64_t i = 0; i < NH; i++) tg[i] = moe_bf16_to_f32(moe_f32_to_bf16((float)tg[i]));
        free(xs), free(us), free(ps), free(as), free(os);
    }
    twin_grads(&t, w[0], x0, tg, g64);
    double loss;
    assert_int_equal(ref_step(m, 0, &loss), 0);
    for (int i = 0; i < s.layers * TRAIN_WEIGHTS; i++) {
        const int64_t n = weight_count(&s, (train_weight_t)(i % TRAIN_WEIGHTS));
        const float *gr = ref_grad(m, i / TRAIN_WEIGHTS, (train_weight_t)(i % TRAIN_WEIGHTS));
        double d2 = 0, r2 = 0;
        for (int64_t j = 0; j < n; j++) {
            d2 += ((double)gr[j] - g64[i][j]) * ((double)gr[j] - g64[i][j]);
            r2 += g64[i][j] * g64[i][j];
        }
        const double rel = sqrt(d2 / r2);
        printf("layer %d weight %d: |g - g64| / |g64| = %.3g\n", i / TRAIN_WEIGHTS, i % TRAIN_WEIGHTS, rel);
        assert_true(r2 > 0 && rel < 0.05);
    }
    for (int i = 0; i < s.layers * TRAIN_WEIGHTS; i++) free(g64[i]), free(w[0][i]), free(w[1][i]);
    free(x0), free(tg);
    ref_destroy(m);
}

static void test_bad_shape(void **state)
{
    (void)state;
    ref_model_t *m = (ref_model_t *)(uintptr_t)1;
    train_shape_t s = tiny(TRAIN_QUANT_NONE, 0.0f);
    s.ep = 3; /* does not divide 4 experts */
    assert_int_equal(ref_create(&s, 1, s.ep, 1, NULL, &m), -1);
    s = tiny(TRAIN_QUANT_MXFP8, 0.0f);
    s.hidden = 48; /* not a multiple of 32 */
    assert_int_equal(ref_create(&s, 1, s.ep, 1, NULL, &m), -1);
    s = tiny(TRAIN_QUANT_NONE, 0.0f);
    s.topk = 5;
    assert_int_equal(ref_create(&s, 1, s.ep, 1, NULL, &m), -1);
    s = tiny(TRAIN_QUANT_NONE, 0.0f);
    assert_int_equal(ref_create(&s, 1, s.ep + 1, 1, NULL, &m), -1); /* the grid's ep is not the shape's */
    assert_int_equal(ref_create(&s, 0, s.ep, 1, NULL, &m), -1);
    assert_int_equal(ref_create(&s, 1, s.ep, -1, NULL, &m), -1);
    const ref_ep_t bad_ep = {0, -1, 0};
    assert_int_equal(ref_create(&s, 1, s.ep, 1, &bad_ep, &m), -1);
    assert_true(m == (ref_model_t *)(uintptr_t)1);
    uint16_t w[32] = {0}, o[32];
    assert_int_equal(ref_dequantize(TRAIN_QUANT_NVFP4, 0, w, 2, 8, o), -1);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_train_reference");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dequant_mxfp8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dequant_nvfp4, setup, teardown),
        cmocka_unit_test(test_step_lr0),
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_grads_vs_fp64),
        cmocka_unit_test(test_bad_shape),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
