/*
 * Internal core: error reporting, logging, environment settings, test
 * knobs, time.
 * Everything here is per context or per thread; nothing is process-wide.
 */
#ifndef ETP__CORE_H
#define ETP__CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "etp/context.h"
#include "etp/core.h"

#define ETP__ERRMSG_MAX 1024

#if defined(__GNUC__)
#define ETP__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ETP__PRINTF(a, b)
#endif

/* Record `status` and a formatted detail as this thread's last error and
 * return `status`, so that `return etp__err(...)` reads naturally. */
etp_status_t etp__err(etp_status_t status, const char *fmt, ...) ETP__PRINTF(2, 3);
/* Same, from a va_list. */
etp_status_t etp__verr(etp_status_t status, const char *fmt, va_list ap);

/* Argument checks at the API boundary. */
#define ETP__CHECK_ARG(cond, ...)                                   \
    do {                                                            \
        if (!(cond)) return etp__err(ETP_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)
#define ETP__CHECK_NULL(ptr, fn)                                                     \
    do {                                                                             \
        if ((ptr) == NULL)                                                           \
            return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, #ptr); \
    } while (0)
/* As ETP__CHECK_NULL, naming the argument as the public header does where
 * the implementation calls it something shorter. */
#define ETP__CHECK_NULL_AS(ptr, name, fn)                                            \
    do {                                                                             \
        if ((ptr) == NULL)                                                           \
            return etp__err(ETP_ERR_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, name); \
    } while (0)
/* Return a failure of `expr` to the caller. At debug level each level it
 * passes through logs "file:line -> status (expr)", so a deep failure
 * shows its path; the success path costs the test alone. */
#define ETP__TRY(expr)                                          \
    do {                                                        \
        etp_status_t etp__s_ = (expr);                          \
        if (etp__s_ != ETP_SUCCESS) {                           \
            etp__trace(__FILE__, __LINE__, #expr, etp__s_);     \
            return etp__s_;                                     \
        }                                                       \
    } while (0)

/* ---- versioned structs (vstruct.c) ------------------------------------- */

/* Every public struct that starts with `size_t size` is versioned: a caller
 * built against an older header passes a smaller struct, which ends after
 * one of its fields (maybe with padding up to the next one). Configs: what
 * it lacks takes the ETP_*_INIT defaults. Outputs: only what fits is
 * written. A size inside a field, one that holds no field after `size`, or
 * one larger than this etp's struct is refused. */
typedef struct etp__field {
    const char *name;
    size_t offset, end;
} etp__field_t;

typedef struct etp__vstruct {
    const char *type; /* "etp_chain_config_t" */
    const char *init; /* "ETP_CHAIN_CONFIG_INIT" */
    size_t size;      /* this etp's sizeof */
    const etp__field_t *fields; /* every field, in order, `size` first */
    size_t nfields;
} etp__vstruct_t;

#define ETP__END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define ETP__FIELD(type, field) {#field, offsetof(type, field), ETP__END(type, field)}
#define ETP__VSTRUCT(type, init, fields) \
    {#type, #init, sizeof(type), fields, sizeof fields / sizeof fields[0]}

extern const etp__vstruct_t etp__vs_context_config, etp__vs_memory_report, etp__vs_group_config,
    etp__vs_param_config, etp__vs_param_info, etp__vs_chain_config, etp__vs_cache_report,
    etp__vs_weight_view, etp__vs_quantizer_config, etp__vs_quant_sizes, etp__vs_ep_group_config,
    etp__vs_ep_group_info, etp__vs_ep_layer_config, etp__vs_ep_dispatch_args, etp__vs_ep_report,
    etp__vs_ep_ll_dispatch_args, etp__vs_ep_ll_rows,
    etp__vs_gemm_config, etp__vs_gemm_args;

/* ETP_SUCCESS when `size` is one vs accepts; else ETP_ERR_INVALID_ARGUMENT
 * naming fn, the argument (`arg`->size), the field it cuts or the size
 * expected, and the initializer to use. */
etp_status_t etp__vs_check(size_t size, const etp__vstruct_t *vs, const char *fn, const char *arg);
/* A config: *dst holds the defaults (ETP_*_INIT); copy what the caller's
 * src has over them (src NULL: keep the defaults). dst's size stays this
 * etp's. */
etp_status_t etp__vs_in(void *dst, const void *src, const etp__vstruct_t *vs, const char *fn,
                        const char *arg);
/* An output: check dst's size, then write the fields of src that fit in it
 * (dst's size field is left as the caller set it). */
etp_status_t etp__vs_out(void *dst, const void *src, const etp__vstruct_t *vs, const char *fn,
                         const char *arg);
/* The write of etp__vs_out alone, for a caller that checked dst's size
 * before doing anything else. */
void etp__vs_put(void *dst, const void *src);

/* ---- logging ---------------------------------------------------------- */

enum {
    ETP_LOG_NONE = 0,
    ETP_LOG_ERROR = 1,
    ETP_LOG_WARN = 2,
    ETP_LOG_INFO = 3,
    ETP_LOG_DEBUG = 4,
    ETP_LOG_TRACE = 5
};

/* Subsystems, for ETP_LOG_SUBSYS (a comma list of names, or "all"). */
enum {
    ETP_SUBSYS_CORE = 1u << 0,
    ETP_SUBSYS_BACKEND = 1u << 1,
    ETP_SUBSYS_COMM = 1u << 2,
    ETP_SUBSYS_QUANT = 1u << 3,
    ETP_SUBSYS_SHARD = 1u << 4,
    ETP_SUBSYS_EP = 1u << 5,
    ETP_SUBSYS_ALL = 0xffffffffu
};

typedef struct etp__logger {
    int level;
    unsigned subsys;
    int rank; /* -1 until known */
    etp_log_fn_t fn;
    void *user;
} etp__logger_t;

void etp__log(const etp__logger_t *lg, int level, unsigned subsys, const char *fmt, ...)
    ETP__PRINTF(4, 5);

#define ETP__LOG(lg, lvl_, sub_, ...)                                          \
    do {                                                                       \
        const etp__logger_t *etp__lg_ = (lg);                                  \
        if (etp__lg_ && etp__lg_->level >= (lvl_) && (etp__lg_->subsys & (sub_))) \
            etp__log(etp__lg_, (lvl_), (sub_), __VA_ARGS__);                   \
    } while (0)

/* Failure traces (ETP__TRY). The logger is per context, and ETP__TRY runs
 * where none is at hand: the context a thread works on binds (a copy of) its
 * logger to the thread (per thread, like the last error) when the thread
 * enters it (etp__ctx_usable, creation, destroy), and unbinds it when it is
 * freed. Only a logger at debug level is bound, so with logging off a
 * failure costs one thread-local load per level. */
void etp__trace_bind(const etp__logger_t *lg);
/* Unbind lg if it is the thread's (a context being freed). */
void etp__trace_unbind(const etp__logger_t *lg);
/* Log one level of a failure through the thread's bound logger, if any. */
void etp__trace(const char *file, int line, const char *expr, etp_status_t status);

/* Parse "error|warn|info|debug|trace|none" or a digit; -1 if not understood. */
int etp__log_level_parse(const char *s);
/* Parse a comma list of subsystem names ("comm,ep", "all"); 0 if none understood. */
unsigned etp__log_subsys_parse(const char *s);

/* ---- environment ------------------------------------------------------ */

/* Every setting etp reads from the environment, read in one place
 * (src/core/env.c, whose table gives each its name, default, doc and
 * parser) when a context is created. */
typedef struct etp__env {
    int log_level;          /* ETP_LOG_LEVEL */
    unsigned log_subsys;    /* ETP_LOG_SUBSYS */
    double timeout_s;       /* ETP_TIMEOUT_S */
    int check_collectives;  /* ETP_CHECK_COLLECTIVES */
    int host_streams;       /* ETP_HOST_STREAMS: ETP_HOST_STREAMS_EAGER or _SHUFFLE */
    int64_t shuffle_seed;   /* ETP_HOST_SHUFFLE_SEED */
    int nccl_fast_launch;   /* ETP_NCCL_FAST_LAUNCH */
    int copy_engine;        /* ETP_COPY_ENGINE: 0 or 1 */
    int ep_transport;       /* ETP_EP_TRANSPORT: an etp_ep_transport_t */
} etp__env_t;

/* Read the settings (etp_env_setting lists them). A malformed value is an
 * error naming the variable, and leaves *env as it was. */
etp_status_t etp__env_load(etp__env_t *env);

/* ---- test knobs ------------------------------------------------------- */

/* Paths that the library takes only for some shapes or devices, forced
 * for tests. Not settings: no environment variable reaches them, only a
 * test program linked to the static etp_internal library (the shared
 * library does not export etp__ names), through etp__context_test_knobs
 * after creating the context. All zero at creation: the product's paths. */
typedef struct etp__test_knobs {
    /* CUDA quantizers created afterwards size their grids for this many
     * multiprocessors (0: the device's): their grid-stride loops and runs
     * of tiles then meet the tests' small tensors */
    uint32_t quant_launch_sms;
    /* 1: CUDA quantizers created afterwards launch no thread-block
     * clusters, as on a device that fits none */
    int quant_no_clusters;
    /* 1: every CUDA NVFP4 cast with 16x16 blocks and row-major scales
     * compacts its scales (by default only large launches do) */
    int quant_compact_all;
    /* 1: chain buffers of any size are copy-engine windows (by default
     * 1 MiB and more: the tests' buffers are smaller) */
    int window_any_size;
} etp__test_knobs_t;

/* The context's knobs, to set after creating it (src/comm/context.c). */
etp__test_knobs_t *etp__context_test_knobs(etp_context_t *ctx);

/* ---- time ------------------------------------------------------------- */

double etp__now_s(void);       /* monotonic seconds */
void etp__sleep_us(unsigned us);

#endif /* ETP__CORE_H */
