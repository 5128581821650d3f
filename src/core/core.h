/*
 * Internal core: error reporting, logging, environment settings, time.
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
#define ETP__TRY(expr)                       \
    do {                                     \
        etp_status_t etp__s_ = (expr);       \
        if (etp__s_ != ETP_SUCCESS) return etp__s_; \
    } while (0)

/* Versioned config structs: a caller built against an older header passes
 * a smaller struct, whose size is where one of its fields ends (ETP__END
 * of each field, in order). Any other size would cut a field in two. */
#define ETP__END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
static inline int etp__known_size(size_t size, const size_t *ends, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (size == ends[i]) return 1;
    return 0;
}

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

/* Parse "error|warn|info|debug|trace|none" or a digit; -1 if not understood. */
int etp__log_level_parse(const char *s);
/* Parse a comma list of subsystem names ("comm,ep", "all"); 0 if none understood. */
unsigned etp__log_subsys_parse(const char *s);

/* ---- environment ------------------------------------------------------ */

/* Every setting etp reads from the environment, read in one place
 * (src/core/env.c) when a context is created. */
typedef struct etp__env {
    int log_level;          /* ETP_LOG_LEVEL */
    unsigned log_subsys;    /* ETP_LOG_SUBSYS */
    double timeout_s;       /* ETP_TIMEOUT_S */
    int check_collectives;  /* ETP_CHECK_COLLECTIVES */
    int host_streams;       /* ETP_HOST_STREAMS: eager or shuffle */
    int64_t shuffle_seed;   /* ETP_HOST_SHUFFLE_SEED */
    int nccl_fast_launch;   /* ETP_NCCL_FAST_LAUNCH */
    int copy_engine;        /* ETP_COPY_ENGINE */
    int quant_cast_kernel;  /* ETP_QUANT_CAST_KERNEL: 2, 3 or 4 */
    int quant_launch_sms;   /* ETP_QUANT_LAUNCH_SMS: 0 (the device's count) or a count */
    int quant_cast_clusters; /* ETP_QUANT_CAST_CLUSTERS: 0 or 1 */
    int quant_cast_compact;  /* ETP_QUANT_CAST_COMPACT: 0, 1 or 2 */
} etp__env_t;

/* One row of the settings table, for docs and `etp-demo --env`. */
typedef struct etp__env_doc {
    const char *name;
    const char *default_value;
    const char *doc;
} etp__env_doc_t;

/* Read the settings. A malformed value is an error naming the variable. */
etp_status_t etp__env_load(etp__env_t *env);
/* The table of settings, terminated by a row whose name is NULL. */
const etp__env_doc_t *etp__env_docs(void);

/* ---- time ------------------------------------------------------------- */

double etp__now_s(void);       /* monotonic seconds */
void etp__sleep_us(unsigned us);

#endif /* ETP__CORE_H */
