/*
 * The chunk rule of PACKED's chunked matmul (kernels/gemm/gemm_chunks.h),
 * the one the CUDA plan counts its chunks by and its pointer kernel places
 * them by, checked on the host against what the matmul needs of it: on
 * fresh random counts and at every count up to a few chunks, an expert's
 * chunks are whole chunks inside its block, cover it exactly once but for
 * the last chunk's overlap with the one before, and a call's chunks fit
 * the pointer arrays the plan sizes for its rows and experts.
 */
#include "test_util.h"
#include "kernels/gemm/gemm_chunks.h"

static uint64_t g_seed;

enum { C = ETP__GEMM_CHUNK_ROWS };

/* The chunks of a block of m rows against coverage written out row by
 * row: every row in exactly one chunk, except the rows of the last chunk
 * that the one before already holds (there only where m is not a multiple
 * of a chunk, and fewer than a chunk of them). */
static void check_block(int64_t m)
{
    const int64_t n = etp__gemm_chunks_of(m);
    if (m < C) {
        if (n != 0)
            fail_msg("%lld rows: %lld chunks below a chunk's %d rows", (long long)m, (long long)n,
                     C);
        return;
    }
    if (n != (m + C - 1) / C)
        fail_msg("%lld rows: %lld chunks, not %lld", (long long)m, (long long)n,
                 (long long)((m + C - 1) / C));
    unsigned char *hits = calloc((size_t)m, 1);
    assert_non_null(hits);
    int64_t prev = -1;
    for (int64_t j = 0; j < n; j++) {
        const int64_t s = etp__gemm_chunk_start(m, j);
        if (s < 0 || s + C > m)
            fail_msg("%lld rows: chunk %lld at %lld reaches outside the block", (long long)m,
                     (long long)j, (long long)s);
        if (s <= prev)
            fail_msg("%lld rows: chunk %lld at %lld not after chunk %lld at %lld", (long long)m,
                     (long long)j, (long long)s, (long long)(j - 1), (long long)prev);
        for (int64_t r = s; r < s + C; r++) hits[r]++;
        prev = s;
    }
    int64_t twice = 0;
    for (int64_t r = 0; r < m; r++) {
        if (hits[r] == 0) fail_msg("%lld rows: row %lld in no chunk", (long long)m, (long long)r);
        if (hits[r] > 2)
            fail_msg("%lld rows: row %lld in %d chunks", (long long)m, (long long)r, hits[r]);
        /* only the last chunk overlaps, and only the one before */
        if (hits[r] == 2 && r < etp__gemm_chunk_start(m, n - 1))
            fail_msg("%lld rows: row %lld twice, below the last chunk", (long long)m, (long long)r);
        twice += hits[r] == 2;
    }
    const int64_t want = m % C ? C - m % C : 0;
    if (twice != want)
        fail_msg("%lld rows: %lld rows computed twice, not %lld", (long long)m, (long long)twice,
                 (long long)want);
    free(hits);
}

static void test_every_small_count(void **state)
{
    (void)state;
    for (int64_t m = 0; m <= 5 * C + 1; m++) check_block(m);
}

static void test_random_counts(void **state)
{
    (void)state;
    for (uint64_t it = 0; it < 2000; it++)
        check_block((int64_t)(tu_rand(g_seed, 1, it, 0) % 200000));
}

/* A call's chunks never exceed what the plan's pointer arrays hold for a
 * plan of `rows` rows and E experts: rows / C + E. */
static void test_call_bound(void **state)
{
    (void)state;
    for (uint64_t it = 0; it < 2000; it++) {
        const int64_t E = 1 + (int64_t)(tu_rand(g_seed, 2, it, 0) % 300);
        int64_t rows = 0, chunks = 0;
        for (int64_t e = 0; e < E; e++) {
            /* counts near multiples of a chunk, and one past, more than not */
            const uint64_t u = tu_rand(g_seed, 3, it, (uint64_t)e);
            const int64_t m = u % 3 ? (int64_t)(u >> 8) % 8 * C + (int64_t)(u >> 16) % 3
                                    : (int64_t)(u >> 8) % (9 * C);
            rows += m;
            chunks += etp__gemm_chunks_of(m);
        }
        if (chunks > rows / C + E)
            fail_msg("%lld experts, %lld rows: %lld chunks, the plan holds %lld", (long long)E,
                     (long long)rows, (long long)chunks, (long long)(rows / C + E));
    }
}

int main(void)
{
    g_seed = tu_pick_seed();
    printf("test_gemm_chunks: seed %llu (rerun with ETP_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_small_count),
        cmocka_unit_test(test_random_counts),
        cmocka_unit_test(test_call_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
