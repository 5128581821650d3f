/* Every environment setting of etp, read here and nowhere else. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core.h"

static const etp__env_doc_t env_docs[] = {
    {"ETP_LOG_LEVEL", "none",
     "log verbosity: none, error, warn, info, debug or trace (or 0-5)"},
    {"ETP_LOG_SUBSYS", "all",
     "comma list of subsystems to log: core, backend, comm, quant, shard, ep, or all"},
    {"ETP_TIMEOUT_S", "300",
     "seconds a collective or wait may take before it fails with a timeout; 0 disables"},
    {"ETP_CHECK_COLLECTIVES", "0",
     "1: exchange a fingerprint before each collective and report mismatches between ranks"},
    {"ETP_HOST_STREAMS", "eager",
     "host backend streams: eager (run when enqueued) or shuffle (adversarial order)"},
    {"ETP_HOST_SHUFFLE_SEED", "0",
     "seed of the shuffle-mode scheduler; 0 runs producers as late as allowed, 1 in "
     "program order, others a seeded random order"},
    {"ETP_NCCL_FAST_LAUNCH", "1",
     "1: CUDA collectives launch on a blocking twin of each NCCL communicator, connected and "
     "warmed up at creation (a launch needing new connections can then block until its peers "
     "arrive); 0: launch on the non-blocking communicator (tens of microseconds per launch)"},
    {"ETP_COPY_ENGINE", "1",
     "1: chain buffers of 1 MiB or more (gather slots, wgrad ring, exchange staging) are NCCL "
     "symmetric windows and their all-gathers and all-to-alls run on the copy engines (NCCL >= "
     "2.28, CTA policy zero: no SMs taken from compute); 2: the same for buffers of any size "
     "(tests); 0: plain memory and NCCL's kernels"},
    {"ETP_QUANT_CAST_KERNEL", "4",
     "CUDA cast-only quantization kernel: 4 (register-blocked, with a kernel of its own for "
     "MXFP8 batches of BF16 tensors made of whole 128 x 512 pieces and row-major scales), 3 "
     "(register-blocked, one kernel for every shape), or 2 (the first one, kept as a fallback)"},
    {"ETP_QUANT_LAUNCH_SMS", "0",
     "multiprocessors the CUDA quantization kernels size their grids for (0: the device's); "
     "tests set a few, so that the cast's grid-stride loops and runs of tiles meet small tensors"},
    {"ETP_QUANT_CAST_CLUSTERS", "1",
     "1: the CUDA NVFP4 cast with 16x16 blocks and row-major scales runs in thread-block "
     "clusters of 2 (sm_90 and later), which write a band of 2 tiles' columnwise scales as "
     "16-byte pieces; 0: one block a tile, each writing its own 8-byte pieces"},
    {"ETP_QUANT_CAST_COMPACT", "1",
     "the CUDA NVFP4 cast with 16x16 blocks and row-major scales: of each 16 scale rows its "
     "blocks make equal, its tiles write only the last, and a second kernel copies that row over "
     "the other 15 as whole lines; 1: for launches of at least 4 runs of tiles a resident block "
     "(large batches), 2: for every launch (tests), 0: never (every tile writes all its rows)"},
    {NULL, NULL, NULL},
};

const etp__env_doc_t *etp__env_docs(void)
{
    return env_docs;
}

static const char *get(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static etp_status_t parse_int64(const char *name, const char *v, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end != '\0')
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "environment %s='%s' is not an integer", name, v);
    *out = (int64_t)x;
    return ETP_SUCCESS;
}

/* An integer setting in [lo, hi], left as it is when unset. */
static etp_status_t parse_choice(const char *name, int lo, int hi, const char *expected, int *out)
{
    const char *v = get(name);
    if (v == NULL) return ETP_SUCCESS;
    int64_t x = 0;
    ETP__TRY(parse_int64(name, v, &x));
    if (x < lo || x > hi)
        return etp__err(ETP_ERR_INVALID_ARGUMENT, "environment %s='%s': expected %s", name, v, expected);
    *out = (int)x;
    return ETP_SUCCESS;
}

etp_status_t etp__env_load(etp__env_t *env)
{
    etp__env_t e = {ETP_LOG_NONE, ETP_SUBSYS_ALL, 300.0, 0, 0, 0, 1, 1, 4, 0, 1, 1};
    const char *v;

    if ((v = get("ETP_LOG_LEVEL"))) {
        e.log_level = etp__log_level_parse(v);
        if (e.log_level < 0)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "environment ETP_LOG_LEVEL='%s': expected none, error, warn, info, "
                            "debug or trace", v);
    }
    if ((v = get("ETP_LOG_SUBSYS"))) {
        e.log_subsys = etp__log_subsys_parse(v);
        if (e.log_subsys == 0)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "environment ETP_LOG_SUBSYS='%s': expected a comma list of core, backend, "
                            "comm, quant, shard, ep or all (every name known)", v);
    }
    if ((v = get("ETP_TIMEOUT_S"))) {
        char *end;
        errno = 0;
        double t = strtod(v, &end);
        if (errno || *end != '\0' || !isfinite(t) || t < 0)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "environment ETP_TIMEOUT_S='%s': expected seconds >= 0", v);
        e.timeout_s = t;
    }
    ETP__TRY(parse_choice("ETP_CHECK_COLLECTIVES", 0, 1, "0 or 1", &e.check_collectives));
    if ((v = get("ETP_HOST_STREAMS"))) {
        if (strcasecmp(v, "eager") == 0)
            e.host_streams = ETP_HOST_STREAMS_EAGER;
        else if (strcasecmp(v, "shuffle") == 0)
            e.host_streams = ETP_HOST_STREAMS_SHUFFLE;
        else
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "environment ETP_HOST_STREAMS='%s': expected eager or shuffle", v);
    }
    if ((v = get("ETP_HOST_SHUFFLE_SEED"))) {
        ETP__TRY(parse_int64("ETP_HOST_SHUFFLE_SEED", v, &e.shuffle_seed));
        if (e.shuffle_seed < 0)
            return etp__err(ETP_ERR_INVALID_ARGUMENT,
                            "environment ETP_HOST_SHUFFLE_SEED='%s': expected >= 0", v);
    }
    ETP__TRY(parse_choice("ETP_NCCL_FAST_LAUNCH", 0, 1, "0 or 1", &e.nccl_fast_launch));
    ETP__TRY(parse_choice("ETP_COPY_ENGINE", 0, 2, "0, 1 or 2", &e.copy_engine));
    ETP__TRY(parse_choice("ETP_QUANT_CAST_KERNEL", 2, 4, "2, 3 or 4", &e.quant_cast_kernel));
    ETP__TRY(parse_choice("ETP_QUANT_LAUNCH_SMS", 0, 65536, "0 (the device's) to 65536",
                          &e.quant_launch_sms));
    ETP__TRY(parse_choice("ETP_QUANT_CAST_CLUSTERS", 0, 1, "0 or 1", &e.quant_cast_clusters));
    ETP__TRY(parse_choice("ETP_QUANT_CAST_COMPACT", 0, 2, "0, 1 or 2", &e.quant_cast_compact));
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
    int n = (int)(sizeof env_docs / sizeof env_docs[0]) - 1;
    ETP__CHECK_ARG(index >= 0 && index < n, "etp_env_setting: index %d not in [0, %d)", index, n);
    *name = env_docs[index].name;
    *default_value = env_docs[index].default_value;
    *doc = env_docs[index].doc;
    return ETP_SUCCESS;
}
