/*
 * etp/core.h - status codes, error details, data types and version.
 *
 * Every etp function returns an etp_status_t; ETP_SUCCESS is 0. On failure the
 * calling thread's etp_last_error() holds a sentence saying what was wrong
 * (which argument, expected against got, which rank or group). Output arguments
 * are written only on success. A refused call that would have issued
 * collectives may leave its group out of step with the other ranks: see
 * "Refused calls" in etp/context.h.
 *
 * Versioned structs: every struct etp takes or fills that starts with
 * `size_t size` is set up with its ETP_*_INIT initializer, which sets size to
 * the sizeof of the header the caller was built with. etp accepts a smaller
 * size from a caller built against an older header, as long as it ends after
 * a field (or in the padding after it): a config's missing fields take the
 * initializer's defaults, and an output struct gets only the fields that fit
 * (the rest of its bytes are not written). A size that ends inside a field,
 * holds nothing after `size`, or is larger than this etp's struct (a caller
 * built against a newer header) is refused with ETP_ERR_INVALID_ARGUMENT.
 *
 * Thread safety: all functions in this header are safe to call from any thread.
 */
#ifndef ETP_CORE_H
#define ETP_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ETP_API
#else
#define ETP_API __attribute__((visibility("default")))
#endif

#define ETP_VERSION_MAJOR 0
#define ETP_VERSION_MINOR 1
#define ETP_VERSION_PATCH 0
/* One integer that orders versions: major * 10000 + minor * 100 + patch. */
#define ETP_VERSION_CODE \
    (ETP_VERSION_MAJOR * 10000 + ETP_VERSION_MINOR * 100 + ETP_VERSION_PATCH)

typedef enum etp_status {
    ETP_SUCCESS = 0,
    ETP_ERR_INVALID_ARGUMENT = 1,  /* a null, out-of-range or inconsistent argument */
    ETP_ERR_INVALID_STATE = 2,     /* a call at the wrong time (e.g. destroy while in use, a collective on a group a refused call broke: etp/context.h) */
    ETP_ERR_OUT_OF_MEMORY = 3,     /* an allocation through the context allocator failed */
    ETP_ERR_UNSUPPORTED = 4,       /* not built in, or not possible on this backend */
    ETP_ERR_TIMEOUT = 5,           /* a collective or wait did not finish within ETP_TIMEOUT_S */
    ETP_ERR_COLLECTIVE_MISMATCH = 6, /* ranks issued different collectives (ETP_CHECK_COLLECTIVES) */
    ETP_ERR_ABORTED = 7,           /* the context failed earlier and its communicators are aborted */
    ETP_ERR_BUSY = 8,              /* the object is still used by another object */
    ETP_ERR_BACKEND = 9,           /* CUDA, NCCL or MPI reported an error */
    ETP_ERR_INTERNAL = 10,         /* a bug in etp: please report it */
    ETP_ERR_CAPACITY = 11          /* a fixed-size buffer was too small (data was dropped, not written past it) */
} etp_status_t;

/* A static English name of a status ("invalid argument"); never NULL. */
ETP_API const char *etp_status_string(etp_status_t status);

/* The detail of the last failure on the calling thread: a NUL-terminated
 * sentence owned by etp, valid until the next failing etp call on this thread.
 * Empty ("") when no call has failed on this thread. Successful calls do not
 * clear it. */
ETP_API const char *etp_last_error(void);

/* The library's version as ETP_VERSION_CODE of the build that is loaded, and
 * optionally its parts (any pointer may be NULL). */
ETP_API int etp_version(int *major, int *minor, int *patch);

/* Element types that etp moves and reduces. */
typedef enum etp_dtype {
    ETP_DTYPE_U8 = 0,
    ETP_DTYPE_I32 = 1,
    ETP_DTYPE_I64 = 2,
    ETP_DTYPE_F16 = 3,
    ETP_DTYPE_BF16 = 4,
    ETP_DTYPE_F32 = 5,
    ETP_DTYPE_F64 = 6,
    ETP_DTYPE_COUNT = 7
} etp_dtype_t;

/* Bytes of one element, or 0 for a value that is not an etp_dtype_t. */
ETP_API size_t etp_dtype_size(etp_dtype_t dtype);

/* A static short name ("bf16"), or "invalid". */
ETP_API const char *etp_dtype_name(etp_dtype_t dtype);

/* The environment settings etp reads (when a context is created), one per
 * index from 0: *name, *default_value and *doc are static strings. Returns
 * ETP_ERR_INVALID_ARGUMENT past the last one (or for NULL pointers). */
ETP_API etp_status_t etp_env_setting(int index, const char **name, const char **default_value,
                                     const char **doc);

#ifdef __cplusplus
}
#endif

#endif /* ETP_CORE_H */
