/*
 * The CUDA kernels against the host reference kernels, bit for bit, on
 * fresh random data from a printed seed (label gpu; skipped without a GPU).
 */
#include <cuda_runtime_api.h>
#include <math.h>

#include "comm/comm_internal.h"
#include "backend/host/host_internal.h"
#include "etp/cuda.h"
#include "gpu_util.h"
#include "mpi_util.h"

static float rand_float(uint64_t seed, uint64_t k, uint64_t i)
{
    /* spread over many binades, both signs, so rounding is exercised */
    uint64_t r = tu_rand(seed, k, 0, i);
    float m = (float)(r & 0xffffff) / (float)0x1000000;
    int e = (int)((r >> 24) % 40) - 20;
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, e);
}

static void test_axpy_matches_host(void **state)
{
    (void)state;
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    etp_context_t *ctx;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &ctx));
    etp_stream_t *s;
    ETP_OK(etp_stream_create(ctx, ETP_STREAM_PRIORITY_NORMAL, &s));
    /* 0, small, odd, and beyond L2 (2 x 64 MB), at aligned and unaligned offsets */
    const size_t sizes[] = {0, 1, 3, 1000, 4099, (size_t)16 << 20};
    const size_t offsets[] = {0, 1, 3};
    size_t maxn = ((size_t)16 << 20) + 8;
    float *hx = malloc(maxn * sizeof(float)), *hy = malloc(maxn * sizeof(float));
    float *ref = malloc(maxn * sizeof(float)), *out = malloc(maxn * sizeof(float));
    float *dx, *dy;
    ETP_OK(etp_mem_alloc(ctx, maxn * sizeof(float), ETP_MEM_WORKSPACE, (void **)&dx));
    ETP_OK(etp_mem_alloc(ctx, maxn * sizeof(float), ETP_MEM_WORKSPACE, (void **)&dy));
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
            size_t n = sizes[si], off = offsets[oi];
            float alpha = rand_float(g_seed, 1000 + si, oi);
            for (size_t i = 0; i < n + off; i++) {
                hx[i] = rand_float(g_seed, 2 * si, i);
                hy[i] = rand_float(g_seed, 2 * si + 1, i);
            }
            memcpy(ref, hy, (n + off) * sizeof(float));
            etp__host_axpy_f32_ref(n, alpha, hx + off, ref + off);
            ETP_OK(etp_memcpy_async(s, dx, hx, (n + off) * sizeof(float)));
            ETP_OK(etp_memcpy_async(s, dy, hy, (n + off) * sizeof(float)));
            ETP_OK(ctx->be->ops->kernels->axpy_f32(ctx->be, s->bs, n, alpha, dx + off, dy + off));
            tu_poison(out, (n + off) * sizeof(float));
            ETP_OK(etp_memcpy_async(s, out, dy, (n + off) * sizeof(float)));
            ETP_OK(etp_stream_synchronize(s));
            size_t bad = 0;
            for (size_t i = 0; i < n + off; i++) bad += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
            if (bad) print_error("axpy n=%zu offset %zu: %zu elements differ\n", n, off, bad);
            assert_int_equal(bad, 0);
        }
    ETP_OK(etp_mem_free(ctx, dx));
    ETP_OK(etp_mem_free(ctx, dy));
    ETP_OK(etp_stream_destroy(s));
    ETP_OK(etp_context_destroy(ctx));
    free(hx);
    free(hy);
    free(ref);
    free(out);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_gpu_kernels");
    if (tu_gpu_short("test_gpu_kernels")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_axpy_matches_host),
    };
    return tu_mpi_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
