/* Unit tests of src/core: statuses, per-thread errors, logging, settings, halfs. */
#include <math.h>
#include <pthread.h>

#include "test_util.h"
#include "core/core.h"
#include "core/half.h"

static void test_status_strings(void **state)
{
    (void)state;
    const char *seen[16] = {0};
    for (int s = ETP_SUCCESS; s <= ETP_ERR_CAPACITY; s++) {
        const char *str = etp_status_string((etp_status_t)s);
        assert_non_null(str);
        assert_string_not_equal(str, "unknown status");
        for (int t = 0; t < s; t++) assert_string_not_equal(str, seen[t]);
        seen[s] = str;
    }
    assert_string_equal(etp_status_string((etp_status_t)999), "unknown status");
}

static void test_version(void **state)
{
    (void)state;
    int ma = -1, mi = -1, pa = -1;
    int code = etp_version(&ma, &mi, &pa);
    assert_int_equal(ma, ETP_VERSION_MAJOR);
    assert_int_equal(mi, ETP_VERSION_MINOR);
    assert_int_equal(pa, ETP_VERSION_PATCH);
    assert_int_equal(code, ma * 10000 + mi * 100 + pa);
    assert_int_equal(etp_version(NULL, NULL, NULL), code);
}

static void test_dtypes(void **state)
{
    (void)state;
    const size_t sizes[ETP_DTYPE_COUNT] = {1, 4, 8, 2, 2, 4, 8};
    for (int t = 0; t < ETP_DTYPE_COUNT; t++) {
        assert_int_equal(etp_dtype_size((etp_dtype_t)t), sizes[t]);
        assert_string_not_equal(etp_dtype_name((etp_dtype_t)t), "invalid");
    }
    assert_int_equal(etp_dtype_size(ETP_DTYPE_COUNT), 0);
    assert_int_equal(etp_dtype_size((etp_dtype_t)-1), 0);
    assert_string_equal(etp_dtype_name((etp_dtype_t)-1), "invalid");
}

static void *other_thread(void *arg)
{
    (void)arg;
    /* A failure on the main thread is not visible here. */
    return (void *)(uintptr_t)(strlen(etp_last_error()) == 0);
}

static void test_last_error_is_per_thread(void **state)
{
    (void)state;
    assert_int_equal(etp__err(ETP_ERR_INVALID_ARGUMENT, "argument '%s': expected %d, got %d", "x", 4, 5),
                     ETP_ERR_INVALID_ARGUMENT);
    assert_string_equal(etp_last_error(), "argument 'x': expected 4, got 5");
    pthread_t t;
    void *clean = NULL;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &clean), 0);
    assert_true(clean != NULL);
    assert_string_equal(etp_last_error(), "argument 'x': expected 4, got 5");
}

static void test_last_error_truncates(void **state)
{
    (void)state;
    char big[4 * ETP__ERRMSG_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    etp__err(ETP_ERR_INTERNAL, "%s", big);
    assert_int_equal(strlen(etp_last_error()), ETP__ERRMSG_MAX - 1);
}

typedef struct {
    int calls;
    int level;
    char line[2048];
} sink_t;

static void sink(void *user, int level, const char *line)
{
    sink_t *s = user;
    s->calls++;
    s->level = level;
    snprintf(s->line, sizeof s->line, "%s", line);
}

static void test_logging_levels_and_rank(void **state)
{
    (void)state;
    sink_t s = {0};
    etp__logger_t lg = {ETP_LOG_WARN, ETP_SUBSYS_COMM, 3, sink, &s};
    ETP__LOG(&lg, ETP_LOG_INFO, ETP_SUBSYS_COMM, "hidden %d", 1);
    assert_int_equal(s.calls, 0);
    ETP__LOG(&lg, ETP_LOG_ERROR, ETP_SUBSYS_EP, "other subsystem %d", 2);
    assert_int_equal(s.calls, 0);
    ETP__LOG(&lg, ETP_LOG_WARN, ETP_SUBSYS_COMM, "shown %d", 3);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.level, ETP_LOG_WARN);
    assert_non_null(strstr(s.line, "etp[3]"));
    assert_non_null(strstr(s.line, "WARN"));
    assert_non_null(strstr(s.line, "comm"));
    assert_non_null(strstr(s.line, "shown 3"));
    lg.level = ETP_LOG_NONE;
    ETP__LOG(&lg, ETP_LOG_ERROR, ETP_SUBSYS_COMM, "silent");
    assert_int_equal(s.calls, 1);
}

static void test_log_parsing(void **state)
{
    (void)state;
    assert_int_equal(etp__log_level_parse("trace"), ETP_LOG_TRACE);
    assert_int_equal(etp__log_level_parse("WARN"), ETP_LOG_WARN);
    assert_int_equal(etp__log_level_parse("warning"), ETP_LOG_WARN);
    assert_int_equal(etp__log_level_parse("3"), ETP_LOG_INFO);
    assert_int_equal(etp__log_level_parse("none"), ETP_LOG_NONE);
    assert_int_equal(etp__log_level_parse("loud"), -1);
    assert_int_equal(etp__log_level_parse("9"), -1);
    assert_int_equal(etp__log_level_parse(""), -1);
    assert_int_equal(etp__log_subsys_parse("comm,ep"), ETP_SUBSYS_COMM | ETP_SUBSYS_EP);
    assert_int_equal(etp__log_subsys_parse("ALL"), ETP_SUBSYS_ALL);
    assert_int_equal(etp__log_subsys_parse("nothing"), 0);
    assert_int_equal(etp__log_subsys_parse("comm,shrad"), 0); /* one unknown name: refused */
}

static void clear_env(void)
{
    const char *name, *def, *doc;
    for (int k = 0; etp_env_setting(k, &name, &def, &doc) == ETP_SUCCESS; k++) unsetenv(name);
}

/* The defaults, as the README lists them (the table's text is what is
 * parsed: these values are written independently of it). */
static void test_env_defaults_and_docs(void **state)
{
    (void)state;
    clear_env();
    etp__env_t e;
    memset(&e, 0x5a, sizeof e);
    assert_int_equal(etp__env_load(&e), ETP_SUCCESS);
    assert_int_equal(e.log_level, ETP_LOG_NONE);
    assert_int_equal(e.log_subsys, ETP_SUBSYS_ALL);
    assert_true(e.timeout_s == 300.0);
    assert_int_equal(e.check_collectives, 0);
    assert_int_equal(e.host_streams, ETP_HOST_STREAMS_EAGER);
    assert_int_equal(e.shuffle_seed, 0);
    assert_int_equal(e.nccl_fast_launch, 1);
    assert_int_equal(e.copy_engine, 1);
    /* every row documented, named once, and its default accepted when set
     * explicitly (the same parser as a user's value) */
    const char *name, *def, *doc;
    int n = 0;
    for (; etp_env_setting(n, &name, &def, &doc) == ETP_SUCCESS; n++) {
        assert_non_null(def);
        assert_true(strlen(doc) > 10);
        assert_int_equal(strncmp(name, "ETP_", 4), 0);
        const char *other, *od, *odoc;
        for (int k = 0; k < n; k++) {
            assert_int_equal(etp_env_setting(k, &other, &od, &odoc), ETP_SUCCESS);
            assert_string_not_equal(name, other);
        }
        setenv(name, def, 1);
        etp__env_t set;
        assert_int_equal(etp__env_load(&set), ETP_SUCCESS);
        assert_memory_equal(&set, &e, sizeof e);
        unsetenv(name);
    }
    assert_int_equal(n, 8);
    ETP_EXPECT(etp_env_setting(n, &name, &def, &doc), ETP_ERR_INVALID_ARGUMENT);
    ETP_EXPECT(etp_env_setting(-1, &name, &def, &doc), ETP_ERR_INVALID_ARGUMENT);
    ETP_EXPECT(etp_env_setting(0, NULL, &def, &doc), ETP_ERR_INVALID_ARGUMENT);
}

static void test_env_values(void **state)
{
    (void)state;
    clear_env();
    setenv("ETP_LOG_LEVEL", "debug", 1);
    setenv("ETP_LOG_SUBSYS", "comm", 1);
    setenv("ETP_TIMEOUT_S", "2.5", 1);
    setenv("ETP_CHECK_COLLECTIVES", "1", 1);
    setenv("ETP_HOST_STREAMS", "SHUFFLE", 1);
    setenv("ETP_HOST_SHUFFLE_SEED", "42", 1);
    setenv("ETP_NCCL_FAST_LAUNCH", "0", 1);
    setenv("ETP_COPY_ENGINE", "0", 1);
    etp__env_t e;
    assert_int_equal(etp__env_load(&e), ETP_SUCCESS);
    assert_int_equal(e.log_level, ETP_LOG_DEBUG);
    assert_int_equal(e.log_subsys, ETP_SUBSYS_COMM);
    assert_true(e.timeout_s == 2.5);
    assert_int_equal(e.check_collectives, 1);
    assert_int_equal(e.host_streams, ETP_HOST_STREAMS_SHUFFLE);
    assert_int_equal(e.shuffle_seed, 42);
    assert_int_equal(e.nccl_fast_launch, 0);
    assert_int_equal(e.copy_engine, 0);
    /* an empty value is unset */
    setenv("ETP_LOG_LEVEL", "", 1);
    assert_int_equal(etp__env_load(&e), ETP_SUCCESS);
    assert_int_equal(e.log_level, ETP_LOG_NONE);
    clear_env();
}

/* A malformed value fails, naming the variable, the value and what it
 * takes, and leaves the settings untouched. */
static void test_env_rejects_bad_values(void **state)
{
    (void)state;
    const char *bad[][3] = {
        {"ETP_LOG_LEVEL", "loud", "none, error, warn, info, debug or trace"},
        {"ETP_LOG_SUBSYS", "nothing", "comma list"},
        {"ETP_TIMEOUT_S", "-1", "seconds >= 0"},
        {"ETP_TIMEOUT_S", "soon", "seconds >= 0"},
        {"ETP_TIMEOUT_S", "inf", "seconds >= 0"},
        {"ETP_CHECK_COLLECTIVES", "2", "0 or 1"},
        {"ETP_CHECK_COLLECTIVES", "1 ", "0 or 1"},
        {"ETP_HOST_STREAMS", "lazy", "eager or shuffle"},
        {"ETP_HOST_SHUFFLE_SEED", "-3", "an integer >= 0"},
        {"ETP_HOST_SHUFFLE_SEED", "7x", "an integer >= 0"},
        {"ETP_HOST_SHUFFLE_SEED", "99999999999999999999", "an integer >= 0"},
        {"ETP_NCCL_FAST_LAUNCH", "2", "0 or 1"},
        {"ETP_COPY_ENGINE", "2", "0 or 1"}, /* any-size windows: a test knob now */
        {"ETP_COPY_ENGINE", "-1", "0 or 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clear_env();
        setenv(bad[i][0], bad[i][1], 1);
        etp__env_t e = {0};
        etp__env_t before = e;
        assert_int_equal(etp__env_load(&e), ETP_ERR_INVALID_ARGUMENT);
        char want[128];
        snprintf(want, sizeof want, "%s='%s'", bad[i][0], bad[i][1]);
        if (!strstr(etp_last_error(), want) || !strstr(etp_last_error(), bad[i][2]))
            print_error("%s=%s: %s\n", bad[i][0], bad[i][1], etp_last_error());
        assert_non_null(strstr(etp_last_error(), want));
        assert_non_null(strstr(etp_last_error(), bad[i][2]));
        assert_memory_equal(&e, &before, sizeof e); /* untouched on failure */
    }
    clear_env();
}

/* Every 16-bit code that is not NaN survives a trip through FP32. */
static void test_half_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = etp__bf16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(etp__f32_to_bf16(f), h);
        else assert_true(isnan(etp__bf16_to_f32(etp__f32_to_bf16(f))));
        float g = etp__f16_to_f32((uint16_t)h);
        if (!isnan(g)) assert_int_equal(etp__f32_to_f16(g), h);
        else assert_true(isnan(etp__f16_to_f32(etp__f32_to_f16(g))));
    }
}

/* Rounding to nearest even at the midpoints, checked against the definition. */
static void test_half_rounding(void **state)
{
    (void)state;
    assert_int_equal(etp__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      /* tie, even stays */
    assert_int_equal(etp__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  /* tie, odd rounds up */
    assert_int_equal(etp__f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(etp__f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(etp__f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(etp__f32_to_f16(0x1p-25f), 0x0000);             /* tie to even zero */
    assert_int_equal(etp__f32_to_f16(0x1.8p-24f), 0x0002);           /* 1.5 ulp -> 2 */
    assert_int_equal(etp__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(etp__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(etp__f32_to_bf16(-0.0f), 0x8000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_last_error_is_per_thread),
        cmocka_unit_test(test_last_error_truncates),
        cmocka_unit_test(test_logging_levels_and_rank),
        cmocka_unit_test(test_log_parsing),
        cmocka_unit_test(test_env_defaults_and_docs),
        cmocka_unit_test(test_env_values),
        cmocka_unit_test(test_env_rejects_bad_values),
        cmocka_unit_test(test_half_round_trip),
        cmocka_unit_test(test_half_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
