/* Status strings, per-thread error detail, dtypes and version. */
#include <stdio.h>
#include <string.h>

#include "core.h"

/* The one piece of mutable state outside a context: per thread, like errno. */
static _Thread_local char etp__last_error[ETP__ERRMSG_MAX];

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
