/* Unit tests of src/core: statuses, per-thread errors, logging, settings, halfs. */
#include <math.h>
#include <pthread.h>

#include "test_util.h"
#include "core/core.h"
#include "core/half.h"
#include "etp/ep.h"

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

/* Every line a sink got, for the failure trace. */
typedef struct {
    int calls;
    char lines[4][512];
} trace_sink_t;

static void trace_sink(void *user, int level, const char *line)
{
    trace_sink_t *s = user;
    assert_int_equal(level, ETP_LOG_DEBUG);
    if (s->calls < 4) snprintf(s->lines[s->calls], sizeof s->lines[0], "%s", line);
    s->calls++;
}

/* A failure three levels down, passed up by ETP__TRY at two; try_line
 * holds the line of each ETP__TRY. */
static int try_line[2];

static etp_status_t trace_leaf(int fail)
{
    return fail ? etp__err(ETP_ERR_TIMEOUT, "the leaf failed") : ETP_SUCCESS;
}

static etp_status_t trace_middle(int fail)
{
    try_line[1] = __LINE__ + 1;
    ETP__TRY(trace_leaf(fail));
    return ETP_SUCCESS;
}

static etp_status_t trace_top(int fail)
{
    try_line[0] = __LINE__ + 1;
    ETP__TRY(trace_middle(fail));
    return ETP_SUCCESS;
}

static void test_try_traces_failures(void **state)
{
    (void)state;
    trace_sink_t s = {0};
    etp__logger_t lg = {ETP_LOG_DEBUG, ETP_SUBSYS_ALL, 0, trace_sink, &s};
    etp__trace_bind(&lg);
    assert_int_equal(trace_top(0), ETP_SUCCESS);
    assert_int_equal(s.calls, 0);
    assert_int_equal(trace_top(1), ETP_ERR_TIMEOUT);
    assert_string_equal(etp_last_error(), "the leaf failed");
    /* each level, the deepest first, with its file, line and expression */
    assert_int_equal(s.calls, 2);
    const char *expr[2] = {"trace_middle(fail)", "trace_leaf(fail)"};
    for (int i = 0; i < 2; i++) {
        char want[128];
        snprintf(want, sizeof want, "unit/test_core.c:%d -> %d (timeout): %s", try_line[1 - i],
                 (int)ETP_ERR_TIMEOUT, expr[1 - i]);
        if (strstr(s.lines[i], want) == NULL)
            fail_msg("line %d: '%s' lacks '%s'", i, s.lines[i], want);
        assert_non_null(strstr(s.lines[i], "DEBUG core"));
    }
    /* below debug level nothing is bound, so nothing is logged */
    lg.level = ETP_LOG_INFO;
    etp__trace_bind(&lg);
    assert_int_equal(trace_top(1), ETP_ERR_TIMEOUT);
    assert_int_equal(s.calls, 2);
    /* nor once the logger is unbound (its context freed) */
    lg.level = ETP_LOG_DEBUG;
    etp__trace_bind(&lg);
    etp__trace_unbind(&lg);
    assert_int_equal(trace_top(1), ETP_ERR_TIMEOUT);
    assert_int_equal(s.calls, 2);
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
    assert_int_equal(e.ep_transport, ETP_EP_TRANSPORT_AUTO);
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
    assert_int_equal(n, 9);
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
    setenv("ETP_EP_TRANSPORT", "Capacity", 1);
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
    assert_int_equal(e.ep_transport, ETP_EP_TRANSPORT_CAPACITY);
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
        {"ETP_EP_TRANSPORT", "nvl", "auto, exact, capacity or nvlink"},
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

/* An older caller's struct may end after any field, or in the padding
 * after it; nowhere else. */
typedef struct {
    size_t size;
    int a;      /* bytes 8-12, then 4 of padding */
    double d;   /* bytes 16-24 */
    char c[3];  /* bytes 24-27, then 5 of padding */
} vs_demo_t;

static void test_vstruct_sizes(void **state)
{
    (void)state;
    static const etp__field_t fields[] = {ETP__FIELD(vs_demo_t, size), ETP__FIELD(vs_demo_t, a),
                                          ETP__FIELD(vs_demo_t, d), ETP__FIELD(vs_demo_t, c)};
    static const etp__vstruct_t vs = ETP__VSTRUCT(vs_demo_t, VS_DEMO_INIT, fields);
    assert_int_equal(sizeof(vs_demo_t), 32);
    const size_t ok[] = {12, 14, 16, 24, 27, 30, 32};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(etp__vs_check(ok[i], &vs, "f", "x"), ETP_SUCCESS);
    const struct {
        size_t size;
        const char *says;
    } bad[] = {{0, "holds no field"}, {8, "holds no field"}, {10, "inside field 'a'"},
               {20, "inside field 'd' (bytes 16 to 24) of vs_demo_t"},
               {25, "inside field 'c'"}, {40, "larger than vs_demo_t"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(etp__vs_check(bad[i].size, &vs, "f", "x"), ETP_ERR_INVALID_ARGUMENT);
        if (strstr(etp_last_error(), bad[i].says) == NULL ||
            strstr(etp_last_error(), "VS_DEMO_INIT") == NULL)
            fail_msg("size %zu: '%s' lacks '%s'", bad[i].size, etp_last_error(), bad[i].says);
    }
    /* in: the caller's fields over the defaults; out: only what fits */
    vs_demo_t def = {sizeof def, 1, 2.0, {'x', 'y', 'z'}}, in = {16, 7, 9.0, {'a', 'b', 'c'}};
    assert_int_equal(etp__vs_in(&def, &in, &vs, "f", "config"), ETP_SUCCESS);
    assert_int_equal(def.size, sizeof def);
    assert_int_equal(def.a, 7);
    assert_true(def.d == 2.0 && def.c[0] == 'x');
    vs_demo_t out = {24, -1, -1.0, {'-', '-', '-'}};
    assert_int_equal(etp__vs_out(&out, &in, &vs, "f", "out"), ETP_SUCCESS);
    assert_int_equal(out.size, 24);
    assert_true(out.a == 7 && out.d == 9.0 && out.c[0] == '-');
}

/* Every public versioned struct's table lists its fields in order, from
 * `size`, without a gap larger than padding, up to its end. */
static void test_vstruct_tables(void **state)
{
    (void)state;
    const etp__vstruct_t *all[] = {
        &etp__vs_context_config, &etp__vs_memory_report,  &etp__vs_group_config,
        &etp__vs_param_config,   &etp__vs_param_info,     &etp__vs_chain_config,
        &etp__vs_cache_report,   &etp__vs_weight_view,    &etp__vs_quantizer_config,
        &etp__vs_quant_sizes,    &etp__vs_ep_group_config, &etp__vs_ep_group_info,
        &etp__vs_ep_layer_config, &etp__vs_ep_dispatch_args, &etp__vs_ep_report,
        &etp__vs_ep_ll_dispatch_args, &etp__vs_ep_ll_rows, &etp__vs_gemm_config,
        &etp__vs_gemm_args};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        const etp__vstruct_t *vs = all[k];
        assert_true(vs->nfields >= 2);
        assert_string_equal(vs->fields[0].name, "size");
        assert_int_equal(vs->fields[0].offset, 0);
        assert_int_equal(vs->fields[0].end, sizeof(size_t));
        for (size_t i = 1; i < vs->nfields; i++)
            if (vs->fields[i].offset < vs->fields[i - 1].end ||
                vs->fields[i].offset - vs->fields[i - 1].end >= 8)
                fail_msg("%s: field '%s' at %zu after '%s' ending at %zu", vs->type,
                         vs->fields[i].name, vs->fields[i].offset, vs->fields[i - 1].name,
                         vs->fields[i - 1].end);
        const size_t last = vs->fields[vs->nfields - 1].end;
        if (last > vs->size || vs->size - last >= 8)
            fail_msg("%s: the last field listed ends at %zu of %zu bytes", vs->type, last,
                     vs->size);
        assert_int_equal(etp__vs_check(vs->size, vs, "f", "x"), ETP_SUCCESS);
    }
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
        cmocka_unit_test(test_try_traces_failures),
        cmocka_unit_test(test_env_defaults_and_docs),
        cmocka_unit_test(test_env_values),
        cmocka_unit_test(test_env_rejects_bad_values),
        cmocka_unit_test(test_half_round_trip),
        cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_vstruct_sizes),
        cmocka_unit_test(test_vstruct_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
