/* Status strings, per-thread error detail, dtypes and version. */
#include <stdio.h>
#include <string.h>

#include "core.h"

/* The mutable state outside a context, per thread like errno: the last
 * error, and where its trace goes: a copy of the logger of the context this
 * thread works on, when that logs at debug level. A copy, so that a context
 * freed by another thread leaves no pointer into it here; `trace_from`
 * only identifies the logger it came from (never dereferenced). */
static _Thread_local char etp__last_error[ETP__ERRMSG_MAX];
static _Thread_local etp__logger_t etp__trace_log;
static _Thread_local const etp__logger_t *etp__trace_from;

const char *etp_status_string(etp_status_t status)
{
    switch (status) {
    case ETP_SUCCESS: return "success";
    case ETP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case ETP_ERR_INVALID_STATE: return "invalid state";
    case ETP_ERR_OUT_OF_MEMORY: return "out of memory";
    case ETP_ERR_UNSUPPORTED: return "unsupported";
    case ETP_ERR_TIMEOUT: return "timeout";
    case ETP_ERR_COLLECTIVE_MISMATCH: return "collective mismatch";
    case ETP_ERR_ABORTED: return "aborted";
    case ETP_ERR_BUSY: return "busy";
    case ETP_ERR_BACKEND: return "backend error";
    case ETP_ERR_INTERNAL: return "internal error";
    case ETP_ERR_CAPACITY: return "capacity exceeded";
    }
    return "unknown status";
}

const char *etp_last_error(void)
{
    return etp__last_error;
}

etp_status_t etp__verr(etp_status_t status, const char *fmt, va_list ap)
{
    vsnprintf(etp__last_error, sizeof etp__last_error, fmt, ap);
    return status;
}

etp_status_t etp__err(etp_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    etp__verr(status, fmt, ap);
    va_end(ap);
    return status;
}

void etp__trace_bind(const etp__logger_t *lg)
{
    if (lg != NULL && lg->level >= ETP_LOG_DEBUG) {
        etp__trace_log = *lg;
        etp__trace_from = lg;
    } else {
        etp__trace_log.level = ETP_LOG_NONE;
        etp__trace_from = NULL;
    }
}

void etp__trace_unbind(const etp__logger_t *lg)
{
    if (etp__trace_from != lg) return;
    etp__trace_log.level = ETP_LOG_NONE;
    etp__trace_from = NULL;
}

/* The last two parts of a path ("shard/chain.c"): which file, without the
 * build machine's directories. */
static const char *short_path(const char *file)
{
    const char *last = NULL, *before = NULL;
    for (const char *p = file; *p; p++) {
        if (*p != '/') continue;
        before = last;
        last = p;
    }
    return before ? before + 1 : file;
}

void etp__trace(const char *file, int line, const char *expr, etp_status_t status)
{
    if (etp__trace_log.level < ETP_LOG_DEBUG) return;
    ETP__LOG(&etp__trace_log, ETP_LOG_DEBUG, ETP_SUBSYS_CORE, "%s:%d -> %d (%s): %s", short_path(file), line,
             (int)status, etp_status_string(status), expr);
}

int etp_version(int *major, int *minor, int *patch)
{
    if (major) *major = ETP_VERSION_MAJOR;
    if (minor) *minor = ETP_VERSION_MINOR;
    if (patch) *patch = ETP_VERSION_PATCH;
    return ETP_VERSION_CODE;
}

size_t etp_dtype_size(etp_dtype_t dtype)
{
    switch (dtype) {
    case ETP_DTYPE_U8: return 1;
    case ETP_DTYPE_F16:
    case ETP_DTYPE_BF16: return 2;
    case ETP_DTYPE_I32:
    case ETP_DTYPE_F32: return 4;
    case ETP_DTYPE_I64:
    case ETP_DTYPE_F64: return 8;
    default: return 0;
    }
}

const char *etp_dtype_name(etp_dtype_t dtype)
{
    static const char *const names[ETP_DTYPE_COUNT] = {"u8",  "i32", "i64", "f16",
                                                       "bf16", "f32", "f64"};
    if ((int)dtype < 0 || dtype >= ETP_DTYPE_COUNT) return "invalid";
    return names[dtype];
}
