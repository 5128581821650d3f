/*
 * libetp-ktrace: kernel timelines where no profiler is installed.
 *
 * A CUPTI injection library: run a CUDA program with
 *
 *     CUDA_INJECTION64_PATH=build-gpu/tools/libetp-ktrace.so KTRACE_DIR=DIR program ...
 *
 * (under mpirun: -x CUDA_INJECTION64_PATH -x KTRACE_DIR) and each process
 * writes DIR/ktrace.PID.tsv: a line per kernel, memory copy and memset
 * the device ran, as
 *
 *     kind  name  start_ns  end_ns  stream  device  grid_x
 *
 * (kind K, C or S; a copy's name is memcpy<kind>_<bytes>, a memset's
 * memset_<bytes>; times from CUPTI's clock, comparable across the
 * processes of one machine). tools/ktrace/ktrace_summary.py reads them.
 * Kernels are traced concurrently (CUPTI's concurrent-kernel activity), so
 * the timeline is the program's own, plus a little of CUPTI's buffer work.
 *
 * The CUDA driver calls InitializeInjection once per process; the file and
 * the activity buffers are therefore the process's, by CUPTI's design.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* the process's trace file: CUPTI's callbacks take no user pointer */
static FILE *ktrace_out;

enum { KTRACE_BUFFER = 8 << 20 };

static void CUPTIAPI ktrace_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, KTRACE_BUFFER);
    *size = *buf ? KTRACE_BUFFER : 0;
    *max_records = 0;
}

static void CUPTIAPI ktrace_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                     size_t valid)
{
    CUpti_Activity *r = NULL;
    while (ktrace_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel9 *k = (const CUpti_ActivityKernel9 *)r;
            fprintf(ktrace_out, "K\t%s\t%llu\t%llu\t%u\t%u\t%d\n", k->name,
                    (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                    k->deviceId, k->gridX);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(ktrace_out, "C\tmemcpy%d_%llu\t%llu\t%llu\t%u\t%u\t0\n", (int)m->copyKind,
                    (unsigned long long)m->bytes, (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->deviceId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            fprintf(ktrace_out, "S\tmemset_%llu\t%llu\t%llu\t%u\t%u\t0\n",
                    (unsigned long long)m->bytes, (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->deviceId);
        }
    }
    free(buf);
}

static void ktrace_finish(void)
{
    cuptiActivityFlushAll(1);
    if (ktrace_out) fclose(ktrace_out);
    ktrace_out = NULL;
}

int InitializeInjection(void);

int InitializeInjection(void)
{
    const char *dir = getenv("KTRACE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/ktrace.%d.tsv", dir ? dir : ".", (int)getpid());
    ktrace_out = fopen(path, "w");
    if (!ktrace_out) {
        fprintf(stderr, "libetp-ktrace: cannot write %s: no trace\n", path);
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(ktrace_request, ktrace_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "libetp-ktrace: CUPTI refused the activity trace: no trace\n");
        fclose(ktrace_out);
        ktrace_out = NULL;
        return 0;
    }
    atexit(ktrace_finish);
    return 1;
}
