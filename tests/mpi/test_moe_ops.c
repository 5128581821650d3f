/*
 * etp-train's small kernels (tools/train/moe_ops.h) on the host backend
 * (label mpi;train, one rank): each call against a computation written
 * here from the model's formulas (double precision, the test's own BF16
 * rounding), on fresh random data with poisoned outputs, in eager and
 * shuffle mode; a graph of them launched twice on new inputs; the records'
 * mark, rewind and exhaustion; and bad arguments with their messages.
 */
#include <fcntl.h>
#include <math.h>
#include <unistd.h>

#include "mpi_util.h"
#include "moe_ops.h"

/* ---- the test's own numbers ---- */

static float bits_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round a finite float to BF16's 8 significant bits, ties to even, by
 * scaling to an integer (not by bit tricks), for normal magnitudes. */
static uint16_t ref_bf16(float x)
{
    if (x == 0.0f) return signbit(x) ? 0x8000u : 0u;
    int e;
    (void)frexpf(x, &e);                     /* x = m 2^e, 0.5 <= |m| < 1 */
    double q = ldexp(1.0, e - 8);             /* BF16's quantum at x */
    double r = nearbyint((double)x / q) * q; /* ties to even (default rounding) */
    float f = (float)r;                       /* r has 8 bits (or is 2^e): exact or inf */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    assert_true((u & 0xffffu) == 0);
    return (uint16_t)(u >> 16);
}

/* BF16's unit in the last place at |x| */
static double bf16_ulp(double x)
{
    int e;
    (void)frexp(x == 0.0 ? 1e-30 : x, &e);
    return ldexp(1.0, e - 8);
}

static double uni(uint64_t a, uint64_t b, uint64_t i) /* [0, 1) */
{
    return (double)(tu_rand(g_seed, a, b, i) >> 11) * 0x1p-53;
}

static void rand_bf16(uint16_t *x, int64_t n, uint64_t stream, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) x[i] = ref_bf16((float)(lo + (hi - lo) * uni(7, stream, (uint64_t)i)));
}

static void *poisoned(size_t bytes)
{
    void *p = malloc(bytes);
    assert_non_null(p);
    tu_poison(p, bytes);
    return p;
}

/* Assert |got - want| <= tol, naming what and where. */
#define NEAR(got, want, tol, what, i)                                                   \
    do {                                                                                \
        double g_ = (got), w_ = (want), t_ = (tol);                                     \
        if (!(fabs(g_ - w_) <= t_)) {                                                   \
            print_error("%s[%lld]: got %.9g, want %.9g (tolerance %.3g)\n", (what),      \
                        (long long)(i), g_, w_, t_);                                    \
            fail();                                                                     \
        }                                                                               \
    } while (0)

typedef struct {
    etp_context_t *ctx;
    etp_stream_t *s;
    moe_ops_t *ops;
    int shuffle;
} fx_t;

static fx_t fx_open(int shuffle, size_t records)
{
    fx_t f;
    f.shuffle = shuffle;
    f.ctx = tu_host_ctx(MPI_COMM_WORLD, shuffle ? ETP_HOST_STREAMS_SHUFFLE : ETP_HOST_STREAMS_EAGER,
                        (int64_t)g_seed, -1, -1);
    ETP_OK(etp_stream_create(f.ctx, ETP_STREAM_PRIORITY_NORMAL, &f.s));
    ETP_OK(moe_ops_create(f.ctx, records, &f.ops));
    return f;
}

static void fx_close(fx_t *f)
{
    moe_ops_destroy(f->ops);
    ETP_OK(etp_stream_destroy(f->s));
    ETP_OK(etp_context_destroy(f->ctx));
}

/* ---- fill ---- */

static void check_fill(fx_t *f)
{
    /* statistics of 1e5 values */
    const int64_t n = 100000;
    uint16_t *x = poisoned((size_t)n * 2);
    moe_fill_t fl = {g_seed, 11, 1, 1000, 100, 0, 0, 1000, 1000, 1.0f};
    ETP_OK(moe_fill_normal(f->ops, f->s, x, &fl));
    fl.tensor = 999; /* the call keeps its own copy */
    ETP_OK(etp_stream_synchronize(f->s));
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = bits_f32(x[i]);
        assert_true(fabs(v) <= 2.0 * 1.7320508 + 0.01);
        sum += v;
        sq += v * v;
    }
    double mean = sum / (double)n, var = sq / (double)n - mean * mean;
    printf("fill: mean %.5f variance %.5f over %lld values\n", mean, var, (long long)n);
    assert_true(fabs(mean) < 0.02); /* standard error 0.003 */
    assert_true(fabs(var - 1.0) < 0.03);

    /* a block of the whole tensor [3][10][7]: experts 1..2, rows 4..7 of
     * which the last is padding; and scale 0.25 (a power of two: exact) */
    enum { E = 3, R = 10, C = 7 };
    uint16_t whole[E * R * C], part[2 * 4 * C], other[E * R * C];
    tu_poison(whole, sizeof whole);
    tu_poison(part, sizeof part);
    tu_poison(other, sizeof other);
    moe_fill_t fw = {g_seed, 5, E, R, C, 0, 0, R, R, 1.0f};
    moe_fill_t fp = {g_seed, 5, 2, 4, C, 1, 4, 3, R, 0.25f};
    moe_fill_t fo = {g_seed, 6, E, R, C, 0, 0, R, R, 1.0f};
    ETP_OK(moe_fill_normal(f->ops, f->s, whole, &fw));
    ETP_OK(moe_fill_normal(f->ops, f->s, part, &fp));
    ETP_OK(moe_fill_normal(f->ops, f->s, other, &fo));
    ETP_OK(etp_stream_synchronize(f->s));
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < C; j++) {
                uint16_t got = part[(e * 4 + i) * C + j];
                uint16_t want = i < 3 ? ref_bf16(0.25f * bits_f32(whole[((1 + e) * R + 4 + i) * C + j]))
                                      : 0;
                if (got != want) {
                    print_error("fill block (%d, %d, %d): 0x%04x, want 0x%04x\n", e, i, j, got, want);
                    fail();
                }
            }
    int same = 0;
    for (int i = 0; i < E * R * C; i++) same += whole[i] == other[i];
    assert_true(same < E * R * C / 10); /* another tensor id, other values */
    free(x);
}

/* ---- router ---- */

static void check_router(fx_t *f, int64_t T, int E, int k, int ties, uint64_t stream)
{
    float *logits = malloc(sizeof(float) * (size_t)(T * E));
    float *probs = poisoned(sizeof(float) * (size_t)(T * E));
    int64_t *idx = poisoned(sizeof(int64_t) * (size_t)(T * k));
    float *w = poisoned(sizeof(float) * (size_t)(T * k));
    float *gw = malloc(sizeof(float) * (size_t)(T * k));
    uint16_t *dz = poisoned(2 * (size_t)(T * E));
    assert_non_null(logits);
    assert_non_null(gw);
    int *perm = malloc(sizeof(int) * (size_t)E);
    assert_non_null(perm);
    for (int64_t t = 0; t < T; t++) {
        /* distinct logits 0.05 apart (no near ties) in a random order, or
         * all equal (exact ties: the lower expert first) */
        for (int i = 0; i < E; i++) perm[i] = i;
        for (int i = E - 1; i > 0; i--) {
            int j = (int)(tu_rand(g_seed, stream, (uint64_t)t, (uint64_t)i) % (uint64_t)(i + 1));
            int tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        double off = 4.0 * uni(stream, 1, (uint64_t)t) - 2.0;
        for (int i = 0; i < E; i++)
            logits[t * E + i] = ties ? (float)off : (float)(off + 0.05 * perm[i] - 0.025 * E);
        for (int j = 0; j < k; j++) gw[t * k + j] = (float)(2.0 * uni(stream, 2, (uint64_t)(t * k + j)) - 1.0);
    }
    ETP_OK(moe_router_fwd(f->ops, f->s, logits, T, E, k, probs, idx, w));
    ETP_OK(moe_router_bwd(f->ops, f->s, probs, idx, gw, T, E, k, dz));
    ETP_OK(etp_stream_synchronize(f->s));

    double *ref = malloc(sizeof(double) * (size_t)E);
    assert_non_null(ref);
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        double mx = l[0], sum = 0;
        for (int i = 1; i < E; i++) mx = fmax(mx, l[i]);
        for (int i = 0; i < E; i++) sum += ref[i] = exp((double)l[i] - mx);
        for (int i = 0; i < E; i++) {
            ref[i] /= sum;
            NEAR(probs[t * E + i], ref[i], 1e-4 * ref[i] + 1e-12, "probs", t * E + i);
        }
        /* the order: by probability down, ties to the lower index */
        for (int i = 0; i < E; i++) perm[i] = i;
        for (int a = 1; a < E; a++) /* insertion sort, stable */
            for (int b = a; b > 0 && ref[perm[b]] > ref[perm[b - 1]]; b--) {
                int tmp = perm[b];
                perm[b] = perm[b - 1];
                perm[b - 1] = tmp;
            }
        double dot = 0;
        for (int j = 0; j < k; j++) {
            if (idx[t * k + j] != perm[j]) {
                print_error("router token %lld choice %d: expert %lld, want %d\n", (long long)t, j,
                            (long long)idx[t * k + j], perm[j]);
                fail();
            }
            assert_true(w[t * k + j] == probs[t * E + perm[j]]);
            dot += (double)gw[t * k + j] * probs[t * E + perm[j]];
        }
        /* backward from the kernel's own probabilities (its input) */
        for (int i = 0; i < E; i++) {
            double gp = 0;
            for (int j = 0; j < k; j++)
                if (perm[j] == i) gp = gw[t * k + j];
            double p = probs[t * E + i], want = p * (gp - dot);
            double tol = bf16_ulp(want) + p * (fabs(gp) + fabs(dot)) * 1e-6 * k;
            NEAR(bits_f32(dz[t * E + i]), want, tol, "dz", t * E + i);
        }
    }
    free(ref);
    free(perm);
    free(logits);
    free(probs);
    free(idx);
    free(w);
    free(gw);
    free(dz);
}

/* ---- element-wise ---- */

static void check_elementwise(fx_t *f)
{
    const int64_t n = 10007;
    uint16_t *a = malloc(2 * n), *b = malloc(2 * n), *c = malloc(2 * n);
    uint16_t *s = poisoned(2 * n), *ga = poisoned(2 * n), *o3 = poisoned(2 * n), *o2 = poisoned(2 * n);
    uint16_t *inplace = malloc(2 * n);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(inplace);
    rand_bf16(a, n, 21, -12.0, 12.0);
    rand_bf16(b, n, 22, -3.0, 3.0);
    rand_bf16(c, n, 23, -0.01, 0.01); /* small: the sum's rounding matters */
    memcpy(inplace, a, 2 * n);
    ETP_OK(moe_silu_fwd(f->ops, f->s, a, s, n));
    ETP_OK(moe_silu_bwd(f->ops, f->s, a, b, ga, n));
    ETP_OK(moe_add(f->ops, f->s, a, b, c, o3, n));
    ETP_OK(moe_add(f->ops, f->s, a, b, NULL, o2, n));
    ETP_OK(moe_add(f->ops, f->s, inplace, b, c, inplace, n)); /* out == a */
    ETP_OK(etp_stream_synchronize(f->s));
    for (int64_t i = 0; i < n; i++) {
        double x = bits_f32(a[i]), g = bits_f32(b[i]);
        double sg = 1.0 / (1.0 + exp(-x));
        double want = x * sg;
        NEAR(bits_f32(s[i]), want, bf16_ulp(want), "silu", i);
        double inner = 1.0 + x * (1.0 - sg);
        want = g * sg * inner;
        /* 1 + a (1 - sg) cancels near a = -1.28: FP32's error there */
        double tol = bf16_ulp(want) + fabs(g) * sg * (1.0 + fabs(x)) * 1e-6;
        NEAR(bits_f32(ga[i]), want, tol, "silu_grad", i);
        float sum = bits_f32(a[i]) + bits_f32(b[i]);
        assert_int_equal(o2[i], ref_bf16(sum));
        sum = sum + bits_f32(c[i]);
        assert_int_equal(o3[i], ref_bf16(sum));
        assert_int_equal(inplace[i], o3[i]);
    }
    free(a);
    free(b);
    free(c);
    free(s);
    free(ga);
    free(o3);
    free(o2);
    free(inplace);
}

/* ---- loss ---- */

static void check_mse(fx_t *f)
{
    const int64_t n = 4099;
    uint16_t *y = malloc(2 * n), *t = malloc(2 * n), *g = poisoned(2 * n);
    double *loss = poisoned(sizeof(double)), *loss0 = poisoned(sizeof(double));
    assert_non_null(y);
    assert_non_null(t);
    rand_bf16(y, n, 31, -4.0, 4.0);
    rand_bf16(t, n, 32, -4.0, 4.0);
    const float scale = 2.0f / (float)n;
    ETP_OK(moe_mse(f->ops, f->s, y, t, n, scale, g, loss));
    ETP_OK(moe_mse(f->ops, f->s, NULL, NULL, 0, scale, NULL, loss0));
    ETP_OK(etp_stream_synchronize(f->s));
    double want = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)bits_f32(y[i]) - (double)bits_f32(t[i]);
        want += d * d;
        double gw = (double)scale * d;
        /* FP32 y - t may round once, then scale * d, then BF16 */
        NEAR(bits_f32(g[i]), gw, bf16_ulp(gw) + fabs(gw) * 1e-6, "mse grad", i);
    }
    NEAR(*loss, want, 1e-12 * want, "loss", 0);
    assert_true(*loss0 == 0.0);
    free(y);
    free(t);
    free(g);
    free(loss);
    free(loss0);
}

/* ---- Adam ---- */

static void check_adam(fx_t *f)
{
    const int64_t n = 3001;
    const int steps = 3;
    float *g = malloc(4 * n), *m = malloc(4 * n), *v = malloc(4 * n), *master = malloc(4 * n);
    uint16_t *w = poisoned(2 * n);
    double *rm = malloc(8 * n), *rv = malloc(8 * n), *rmaster = malloc(8 * n);
    assert_non_null(g);
    assert_non_null(m);
    assert_non_null(v);
    assert_non_null(master);
    assert_non_null(rm);
    assert_non_null(rv);
    assert_non_null(rmaster);
    for (int64_t i = 0; i < n; i++) {
        m[i] = v[i] = 0.0f;
        rm[i] = rv[i] = 0.0;
        rmaster[i] = master[i] = (float)(uni(41, 0, (uint64_t)i) - 0.5);
    }
    /* the FP32 constants the call gets, exactly, in the reference; each
     * step's reference starts from the FP32 state the call started from,
     * so only that step's roundings separate the two */
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (int step = 1; step <= steps; step++) {
        for (int64_t i = 0; i < n; i++) {
            g[i] = (float)((uni(42, (uint64_t)step, (uint64_t)i) - 0.5) * 0.1);
            rm[i] = m[i];
            rv[i] = v[i];
            rmaster[i] = master[i];
        }
        moe_adam_t a = {lr, b1, b2, eps, (float)(1.0 - pow(b1, step)), (float)(1.0 - pow(b2, step))};
        const double bc1 = a.bc1, bc2 = a.bc2;
        tu_poison(w, 2 * (size_t)n);
        ETP_OK(moe_adam(f->ops, f->s, &a, g, m, v, master, w, n));
        a.lr = 1e9f; /* the call keeps its own copy */
        ETP_OK(etp_stream_synchronize(f->s));
        for (int64_t i = 0; i < n; i++) {
            /* the two terms of m may cancel: the tolerance follows their size */
            double mscale = fabs((double)b1 * rm[i]) + fabs((1.0 - (double)b1) * g[i]);
            rm[i] = (double)b1 * rm[i] + (1.0 - (double)b1) * g[i];
            rv[i] = (double)b2 * rv[i] + (1.0 - (double)b2) * (double)g[i] * g[i];
            double mh = rm[i] / bc1, vh = rv[i] / bc2;
            const double den = sqrt(vh) + (double)eps;
            double upd = (double)lr * mh / den;
            /* the update's size had m's terms not cancelled: m's rounding
             * error (relative to mscale) carries into the update */
            const double uscale = (double)lr * (mscale / bc1) / den;
            rmaster[i] -= upd;
            NEAR(m[i], rm[i], 1e-6 * mscale + 1e-15, "adam m", i);
            NEAR(v[i], rv[i], 1e-6 * fabs(rv[i]) + 1e-15, "adam v", i);
            NEAR(master[i], rmaster[i], 1e-7 * fabs(rmaster[i]) + 1e-5 * uscale + 1e-12,
                 "adam master", i);
            assert_int_equal(w[i], ref_bf16(master[i]));
        }
    }
    free(g);
    free(m);
    free(v);
    free(master);
    free(w);
    free(rm);
    free(rv);
    free(rmaster);
}

/* ---- the replicas' sum ---- */

static void check_sum(fx_t *f)
{
    const int64_t n = 1003;
    for (int parts = 1; parts <= 4; parts++) {
        float *x = malloc(4 * (size_t)(n * parts)), *out = poisoned(4 * (size_t)n);
        assert_non_null(x);
        for (int64_t i = 0; i < n * parts; i++)
            x[i] = (float)((uni(61, (uint64_t)parts, (uint64_t)i) - 0.5) *
                           pow(2.0, (double)(i % 40) - 20.0));
        /* element 0: an order that matters, (2^25 + 1) - 2^25 is 0 in FP32
         * when summed left to right, 1 otherwise */
        if (parts == 3) x[0] = 33554432.0f, x[n] = 1.0f, x[2 * n] = -33554432.0f;
        ETP_OK(moe_sum(f->ops, f->s, x, parts, n, out));
        ETP_OK(etp_stream_synchronize(f->s));
        for (int64_t i = 0; i < n; i++) {
            double want = 0, mag = 0;
            for (int p = 0; p < parts; p++) {
                want += x[p * n + i];
                mag += fabs(x[p * n + i]);
            }
            if (parts == 3 && i == 0) {
                assert_true(out[0] == 0.0f); /* the left-to-right FP32 sum, exactly */
                continue;
            }
            NEAR(out[i], want, mag * 1e-7 * parts, "sum", i);
        }
        /* in place: out is part 0 */
        memcpy(out, x, 4 * (size_t)n);
        float *y = malloc(4 * (size_t)(n * parts));
        assert_non_null(y);
        memcpy(y, x, 4 * (size_t)(n * parts));
        ETP_OK(moe_sum(f->ops, f->s, y, parts, n, y));
        ETP_OK(etp_stream_synchronize(f->s));
        ETP_OK(moe_sum(f->ops, f->s, x, parts, n, out));
        ETP_OK(etp_stream_synchronize(f->s));
        assert_memory_equal(y, out, 4 * (size_t)n);
        free(x);
        free(y);
        free(out);
    }
}

static void run_all(int shuffle)
{
    fx_t f = fx_open(shuffle, 64);
    check_fill(&f);
    check_router(&f, 37, 8, 2, 0, 51);
    check_router(&f, 5, 1024, 4, 0, 52);
    check_router(&f, 4, 5, 5, 0, 53);
    check_router(&f, 3, 1, 1, 0, 54);
    check_router(&f, 6, 16, 3, 1, 55);
    check_elementwise(&f);
    check_mse(&f);
    check_adam(&f);
    check_sum(&f);
    fx_close(&f);
}

static void test_ops_eager(void **state)
{
    (void)state;
    run_all(0);
}

static void test_ops_shuffle(void **state)
{
    (void)state;
    run_all(1);
}

/* A step's calls captured once and launched twice on new inputs: the
 * records outlive the capture and serve each launch. */
static void test_graph(void **state)
{
    (void)state;
    fx_t f = fx_open(1, 4);
    const int64_t n = 515;
    uint16_t *a = malloc(2 * n), *t = malloc(2 * n), *s = poisoned(2 * n), *g = poisoned(2 * n);
    double *loss = poisoned(sizeof(double));
    assert_non_null(a);
    assert_non_null(t);
    size_t mark = moe_ops_mark(f.ops);
    ETP_OK(etp_stream_begin_capture(f.s));
    ETP_OK(moe_silu_fwd(f.ops, f.s, a, s, n));
    ETP_OK(moe_mse(f.ops, f.s, s, t, n, 1.0f, g, loss));
    etp_graph_t *graph;
    ETP_OK(etp_stream_end_capture(f.s, &graph));
    assert_int_equal(moe_ops_mark(f.ops), mark + 2);
    for (int launch = 0; launch < 2; launch++) {
        rand_bf16(a, n, 61 + (uint64_t)launch, -3.0, 3.0);
        rand_bf16(t, n, 71 + (uint64_t)launch, -1.0, 1.0);
        tu_poison(s, 2 * n);
        ETP_OK(etp_graph_launch(graph, f.s));
        ETP_OK(etp_stream_synchronize(f.s));
        double want = 0;
        for (int64_t i = 0; i < n; i++) {
            double x = bits_f32(a[i]), sw = x / (1.0 + exp(-x));
            NEAR(bits_f32(s[i]), sw, bf16_ulp(sw), "graph silu", i);
            double d = (double)bits_f32(s[i]) - bits_f32(t[i]);
            want += d * d;
        }
        NEAR(*loss, want, 1e-12 * want, "graph loss", launch);
    }
    ETP_OK(etp_graph_destroy(graph));
    free(a);
    free(t);
    free(s);
    free(g);
    free(loss);
    fx_close(&f);
}

/* What a call writes to stderr (the calls' messages go there). */
typedef struct {
    int saved;
    FILE *tmp;
} grab_t;

static grab_t grab_begin(void)
{
    grab_t gb;
    fflush(stderr);
    gb.tmp = tmpfile();
    assert_non_null(gb.tmp);
    gb.saved = dup(2);
    assert_true(gb.saved >= 0);
    assert_true(dup2(fileno(gb.tmp), 2) >= 0);
    return gb;
}

static void grab_end(grab_t *gb, char *buf, size_t cap)
{
    fflush(stderr);
    assert_true(dup2(gb->saved, 2) >= 0);
    close(gb->saved);
    rewind(gb->tmp);
    size_t len = fread(buf, 1, cap - 1, gb->tmp);
    buf[len] = '\0';
    fclose(gb->tmp);
}

#define EXPECT_REFUSED(expr, want, needle)                                              \
    do {                                                                                \
        char msg_[512];                                                                 \
        grab_t gb_ = grab_begin();                                                      \
        etp_status_t st_ = (expr);                                                      \
        grab_end(&gb_, msg_, sizeof msg_);                                              \
        if (st_ != (want) || strstr(msg_, (needle)) == NULL) {                          \
            print_error("%s:%d: %s -> %s (expected %s), message '%s' (expected '%s')\n", \
                        __FILE__, __LINE__, #expr, etp_status_string(st_),              \
                        etp_status_string(want), msg_, (needle));                       \
            fail();                                                                     \
        }                                                                               \
    } while (0)

/* Three records: the fourth call is refused until a rewind gives back the
 * records of finished work; reused records compute their new call. */
static void test_records(void **state)
{
    (void)state;
    fx_t f = fx_open(0, 3);
    const int64_t n = 33;
    uint16_t a[33], b[33], o[33];
    rand_bf16(a, n, 81, -2.0, 2.0);
    rand_bf16(b, n, 82, -2.0, 2.0);
    ETP_OK(moe_add(f.ops, f.s, a, b, NULL, o, n));
    size_t mark = moe_ops_mark(f.ops);
    assert_int_equal(mark, 1);
    ETP_OK(moe_add(f.ops, f.s, a, b, NULL, o, n));
    ETP_OK(moe_add(f.ops, f.s, a, b, NULL, o, n));
    EXPECT_REFUSED(moe_add(f.ops, f.s, a, b, NULL, o, n), ETP_ERR_CAPACITY, "moe_add: all 3 host records");
    EXPECT_REFUSED(moe_mse(f.ops, f.s, a, b, n, 1.0f, o, (double[1]){0}), ETP_ERR_CAPACITY, "moe_mse");
    assert_int_equal(moe_ops_mark(f.ops), 3);
    ETP_OK(etp_stream_synchronize(f.s));
    EXPECT_REFUSED((moe_ops_rewind(f.ops, 4), ETP_SUCCESS), ETP_SUCCESS, "moe_ops_rewind: mark 4");
    assert_int_equal(moe_ops_mark(f.ops), 3);
    moe_ops_rewind(f.ops, mark);
    tu_poison(o, sizeof o);
    ETP_OK(moe_add(f.ops, f.s, a, b, b, o, n));
    ETP_OK(etp_stream_synchronize(f.s));
    for (int i = 0; i < n; i++) {
        float x = bits_f32(a[i]) + bits_f32(b[i]);
        assert_int_equal(o[i], ref_bf16(x + bits_f32(b[i])));
    }
    fx_close(&f);
}

static void test_bad_args(void **state)
{
    (void)state;
    fx_t f = fx_open(0, 8);
    moe_ops_t *ops = f.ops;
    etp_stream_t *s = f.s;
    float fl[8] = {0};
    int64_t ix[8] = {0};
    uint16_t h[8] = {0};
    double loss = 0;
    const etp_status_t INV = ETP_ERR_INVALID_ARGUMENT;
    moe_ops_t *none = NULL;
    EXPECT_REFUSED(moe_ops_create(NULL, 4, &none), INV, "moe_ops_create: 'ctx' is NULL");
    EXPECT_REFUSED(moe_ops_create(f.ctx, 0, &none), INV, "records > 0");
    assert_null(none);
    EXPECT_REFUSED(moe_silu_fwd(NULL, s, h, h, 8), INV, "moe_silu_fwd: 'ops' is NULL");
    EXPECT_REFUSED(moe_silu_fwd(ops, NULL, h, h, 8), INV, "moe_silu_fwd: the stream is NULL");
    EXPECT_REFUSED(moe_silu_fwd(ops, s, h, h, -1), INV, "n -1 < 0");
    EXPECT_REFUSED(moe_silu_fwd(ops, s, NULL, h, 8), INV, "moe_silu_fwd: a NULL array");
    EXPECT_REFUSED(moe_silu_bwd(ops, s, h, NULL, h, 8), INV, "moe_silu_bwd: a NULL array");
    EXPECT_REFUSED(moe_add(ops, s, h, h, NULL, NULL, 8), INV, "moe_add: a NULL array");
    EXPECT_REFUSED(moe_mse(ops, s, h, h, 8, 1.0f, h, NULL), INV, "moe_mse: 'loss' is NULL");
    EXPECT_REFUSED(moe_mse(ops, s, h, NULL, 8, 1.0f, h, &loss), INV, "moe_mse: a NULL array");
    EXPECT_REFUSED(moe_router_fwd(ops, s, fl, 1, 1025, 1, fl, ix, fl), INV, "E 1025 is not in 1 .. 1024");
    EXPECT_REFUSED(moe_router_fwd(ops, s, fl, 1, 4, 5, fl, ix, fl), INV, "k 5 is not in 1 .. E (4)");
    EXPECT_REFUSED(moe_router_fwd(ops, s, fl, 1, 4, 0, fl, ix, fl), INV, "k 0");
    EXPECT_REFUSED(moe_router_fwd(ops, s, fl, -2, 4, 2, fl, ix, fl), INV, "T -2 < 0");
    EXPECT_REFUSED(moe_router_fwd(ops, s, fl, 1, 4, 2, fl, NULL, fl), INV, "moe_router_fwd: a NULL array");
    EXPECT_REFUSED(moe_router_bwd(ops, s, fl, ix, fl, 1, 0, 1, h), INV, "moe_router_bwd: E 0");
    EXPECT_REFUSED(moe_router_bwd(ops, s, fl, ix, NULL, 1, 4, 1, h), INV, "moe_router_bwd: a NULL array");
    moe_fill_t fi = {1, 2, 1, 2, 4, 0, 0, 2, 2, 1.0f};
    EXPECT_REFUSED(moe_fill_normal(ops, s, h, NULL), INV, "'f' is NULL");
    EXPECT_REFUSED(moe_fill_normal(ops, s, NULL, &fi), INV, "'dst' is NULL");
    fi.valid_rows = 3;
    EXPECT_REFUSED(moe_fill_normal(ops, s, h, &fi), INV, "valid_rows 3 is not in 0 .. rows (2)");
    fi.valid_rows = 2;
    fi.row0 = 1;
    EXPECT_REFUSED(moe_fill_normal(ops, s, h, &fi), INV, "pass total_rows");
    /* a shard of padding only starts past the tensor's rows: zeros */
    fi.valid_rows = 0;
    fi.row0 = 5;
    ETP_OK(moe_fill_normal(ops, s, h, &fi));
    ETP_OK(etp_stream_synchronize(s));
    moe_ops_rewind(ops, 0);
    fi.valid_rows = 2;
    fi.row0 = 0;
    fi.cols = -4;
    EXPECT_REFUSED(moe_fill_normal(ops, s, h, &fi), INV, "negative size");
    fi.cols = INT64_MAX / 2 + 1; /* x 2 rows */
    EXPECT_REFUSED(moe_fill_normal(ops, s, h, &fi), INV, "overflows");
    moe_adam_t ad = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.001f};
    EXPECT_REFUSED(moe_adam(ops, s, NULL, fl, fl, fl, fl, h, 8), INV, "moe_adam: 'a' is NULL");
    EXPECT_REFUSED(moe_adam(ops, s, &ad, fl, fl, fl, fl, h, 8), INV, "bc1 0 and bc2");
    ad.bc1 = 0.1f;
    EXPECT_REFUSED(moe_adam(ops, s, &ad, fl, fl, NULL, fl, h, 8), INV, "moe_adam: a NULL array");
    /* refusals enqueued nothing and took no record */
    assert_int_equal(moe_ops_mark(ops), 0);
    /* empty calls are fine, NULL arrays included */
    ETP_OK(moe_silu_fwd(ops, s, NULL, NULL, 0));
    ETP_OK(moe_router_fwd(ops, s, NULL, 0, 4, 2, NULL, NULL, NULL));
    ETP_OK(moe_adam(ops, s, &ad, NULL, NULL, NULL, NULL, NULL, 0));
    ETP_OK(etp_stream_synchronize(s));
    moe_ops_destroy(NULL);
    fx_close(&f);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_moe_ops");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_ops_eager),
        cmocka_unit_test(test_ops_shuffle),
        cmocka_unit_test(test_graph),
    };
    return tu_mpi_finish(cmocka_run_group_tests_name("moe_ops", tests, NULL, NULL));
}
