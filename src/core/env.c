/* Every environment setting of etp, read here and nowhere else. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core.h"
#include "etp/ep.h"

/* How a setting's text becomes its field. */
typedef enum {
    ENV_INT,        /* int in [lo, hi] */
    ENV_INT64,      /* int64_t in [lo, hi] */
    ENV_SECONDS,    /* double, finite, >= 0 */
    ENV_NAME,       /* int: the value of one of `names` (case-insensitive) */
    ENV_LOG_LEVEL,  /* int: etp__log_level_parse */
    ENV_LOG_SUBSYS  /* unsigned: etp__log_subsys_parse */
} env_kind_t;

typedef struct {
    const char *name;
    int value;
} env_name_t;

/* One setting: its documentation, and how its text (the default's too:
 * the defaults are the table's text, parsed like a set value) is read
 * into its field of etp__env_t. */
typedef struct {
    const char *name;
    const char *default_value;
    const char *doc;
    env_kind_t kind;
    int64_t lo, hi;          /* ENV_INT, ENV_INT64 */
    const env_name_t *names; /* ENV_NAME: ended by a NULL name */
    size_t offset;           /* of the field */
} env_setting_t;

/* The field's offset, if its type is the kind's (else no compilation). */
#define AS_INT(f) _Generic(((etp__env_t *)0)->f, int: offsetof(etp__env_t, f))
#define AS_INT64(f) _Generic(((etp__env_t *)0)->f, int64_t: offsetof(etp__env_t, f))
#define AS_DOUBLE(f) _Generic(((etp__env_t *)0)->f, double: offsetof(etp__env_t, f))
#define AS_UNSIGNED(f) _Generic(((etp__env_t *)0)->f, unsigned: offsetof(etp__env_t, f))

static const env_name_t host_stream_names[] = {
    {"eager", ETP_HOST_STREAMS_EAGER}, {"shuffle", ETP_HOST_STREAMS_SHUFFLE}, {NULL, 0}};

static const env_name_t ep_transport_names[] = {
    {"auto", ETP_EP_TRANSPORT_AUTO}, {"exact", ETP_EP_TRANSPORT_EXACT},
    {"capacity", ETP_EP_TRANSPORT_CAPACITY}, {"nvlink", ETP_EP_TRANSPORT_NVLINK}, {NULL, 0}};

static const env_setting_t settings[] = {
    {"ETP_LOG_LEVEL", "none", "log verbosity: none, error, warn, info, debug or trace (or 0-5)",
     ENV_LOG_LEVEL, 0, 0, NULL, AS_INT(log_level)},
    {"ETP_LOG_SUBSYS", "all",
     "comma list of subsystems to log: core, backend, comm, quant, shard, ep, or all",
     ENV_LOG_SUBSYS, 0, 0, NULL, AS_UNSIGNED(log_subsys)},
    {"ETP_TIMEOUT_S", "300",
     "seconds a collective or wait may take before it fails with a timeout; 0 disables",
     ENV_SECONDS, 0, 0, NULL, AS_DOUBLE(timeout_s)},
    {"ETP_CHECK_COLLECTIVES", "0",
     "1: exchange a fingerprint before each collective and report mismatches between ranks",
     ENV_INT, 0, 1, NULL, AS_INT(check_collectives)},
    {"ETP_HOST_STREAMS", "eager",
     "host backend streams: eager (run when enqueued) or shuffle (adversarial order)",
     ENV_NAME, 0, 0, host_stream_names, AS_INT(host_streams)},
    {"ETP_HOST_SHUFFLE_SEED", "0",
     "seed of the shuffle-mode scheduler; 0 runs producers as late as allowed, 1 in "
     "program order, others a seeded random order",
     ENV_INT64, 0, INT64_MAX, NULL, AS_INT64(shuffle_seed)},
    {"ETP_NCCL_FAST_LAUNCH", "1",
     "1: CUDA collectives launch on a blocking twin of each NCCL communicator, connected and "
     "warmed up at creation (a launch needing new connections can then block until its peers "
     "arrive); 0: launch on the non-blocking communicator (tens of microseconds per launch)",
     ENV_INT, 0, 1, NULL, AS_INT(nccl_fast_launch)},
    {"ETP_COPY_ENGINE", "1",
     "1: chain buffers of 1 MiB or more (gather slots, wgrad ring, exchange staging) are NCCL "
     "symmetric windows and their all-gathers and all-to-alls run on the copy engines (NCCL >= "
     "2.28, CTA policy zero: no SMs taken from compute); 0: plain memory and NCCL's kernels",
     ENV_INT, 0, 1, NULL, AS_INT(copy_engine)},
    {"ETP_EP_TRANSPORT", "auto",
     "the transport of EP groups made with ETP_EP_TRANSPORT_AUTO (the default): auto (nvlink "
     "where every rank can run it, else exact), exact, capacity or nvlink; a transport named in "
     "the group's config wins",
     ENV_NAME, 0, 0, ep_transport_names, AS_INT(ep_transport)},
};

#define NUM_SETTINGS ((int)(sizeof settings / sizeof settings[0]))

static const char *get(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* What a setting accepts, for the error of a value it does not. */
static void expected(const env_setting_t *d, char *buf, size_t cap)
{
    switch (d->kind) {
    case ENV_INT:
    case ENV_INT64:
        if (d->hi == d->lo + 1)
            snprintf(buf, cap, "%lld or %lld", (long long)d->lo, (long long)d->hi);
        else if (d->hi == INT64_MAX)
            snprintf(buf, cap, "an integer >= %lld", (long long)d->lo);
        else
            snprintf(buf, cap, "an integer from %lld to %lld", (long long)d->lo, (long long)d->hi);
        return;
    case ENV_SECONDS:
        snprintf(buf, cap, "seconds >= 0");
        return;
    case ENV_NAME: {
        size_t len = 0;
        buf[0] = '\0';
        for (const env_name_t *n = d->names; n->name && len < cap; n++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", n == d->names ? "" : n[1].name ? ", " : " or ",
                                    n->name);
        return;
    }
    case ENV_LOG_LEVEL:
        snprintf(buf, cap, "none, error, warn, info, debug or trace");
        return;
    case ENV_LOG_SUBSYS:
        snprintf(buf, cap, "a comma list of core, backend, comm, quant, shard, ep or all (every name known)");
        return;
    }
}

/* Text v of setting d into its field of e; 0 when malformed. */
static int parse(const env_setting_t *d, const char *v, etp__env_t *e)
{
    char *field = (char *)e + d->offset;
    char *end;
    errno = 0;
    switch (d->kind) {
    case ENV_INT:
    case ENV_INT64: {
        const long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end != '\0' || x < d->lo || x > d->hi) return 0;
        if (d->kind == ENV_INT)
            *(int *)(void *)field = (int)x;
        else
            *(int64_t *)(void *)field = (int64_t)x;
        return 1;
    }
    case ENV_SECONDS: {
        const double t = strtod(v, &end);
        if (errno || end == v || *end != '\0' || !isfinite(t) || t < 0) return 0;
        *(double *)(void *)field = t;
        return 1;
    }
    case ENV_NAME:
        for (const env_name_t *n = d->names; n->name; n++)
            if (strcasecmp(v, n->name) == 0) {
                *(int *)(void *)field = n->value;
                return 1;
            }
        return 0;
    case ENV_LOG_LEVEL: {
        const int level = etp__log_level_parse(v);
        if (level < 0) return 0;
        *(int *)(void *)field = level;
        return 1;
    }
    case ENV_LOG_SUBSYS: {
        const unsigned mask = etp__log_subsys_parse(v);
        if (mask == 0) return 0;
        *(unsigned *)(void *)field = mask;
        return 1;
    }
    }
    return 0;
}

etp_status_t etp__env_load(etp__env_t *env)
{
    etp__env_t e;
    memset(&e, 0, sizeof e);
    for (int i = 0; i < NUM_SETTINGS; i++) {
        const env_setting_t *d = &settings[i];
        if (!parse(d, d->default_value, &e))
            return etp__err(ETP_ERR_INTERNAL, "environment table: the default '%s' of %s does not parse",
                            d->default_value, d->name);
        const char *v = get(d->name);
        if (v && !parse(d, v, &e)) {
            char want[160];
            expected(d, want, sizeof want);
            return etp__err(ETP_ERR_INVALID_ARGUMENT, "environment %s='%s': expected %s", d->name, v, want);
        }
    }
    *env = e;
    return ETP_SUCCESS;
}

double etp__now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void etp__sleep_us(unsigned us)
{
    struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000L};
    nanosleep(&ts, NULL);
}

etp_status_t etp_env_setting(int index, const char **name, const char **default_value,
                             const char **doc)
{
    ETP__CHECK_NULL(name, "etp_env_setting");
    ETP__CHECK_NULL(default_value, "etp_env_setting");
    ETP__CHECK_NULL(doc, "etp_env_setting");
    ETP__CHECK_ARG(index >= 0 && index < NUM_SETTINGS, "etp_env_setting: index %d not in [0, %d)", index,
                   NUM_SETTINGS);
    *name = settings[index].name;
    *default_value = settings[index].default_value;
    *doc = settings[index].doc;
    return ETP_SUCCESS;
}
