/* etp-train's checkpoints (model.h: model_save, model_load). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"

/* ---- checkpoints ------------------------------------------------------------------- */

/* Kinds of state a checkpoint keeps per weight. */
enum { K_WEIGHT, K_MASTER, K_M, K_V, K_COUNT };
static const char *const kind_names[K_COUNT] = {"bf16", "master", "adam_m", "adam_v"};

static etp_status_t barrier(train_model_t *m)
{
    TRY(etp_allreduce(m->world, 0, m->loss_dev, m->loss_dev, 1, ETP_DTYPE_F64, ETP_REDOP_MAX,
                      m->s));
    TRY(etp_stream_synchronize(m->s));
    return ETP_SUCCESS;
}

static etp_status_t ckpt_path(const char *dir, const tparam_t *tp, int kind, char *path,
                              size_t n)
{
    int w = snprintf(path, n, "%s/l%d.%s.%s", dir, tp->layer, model__weight_name(tp->kind),
                     kind_names[kind]);
    if (w < 0 || (size_t)w >= n) FAIL(ETP_ERR_INVALID_ARGUMENT, "checkpoint path too long");
    return ETP_SUCCESS;
}

/* Write (save) or read this rank's valid shard rows of one state at their
 * place in the whole tensor's file. */
static etp_status_t ckpt_io(train_model_t *m, const char *dir, tparam_t *tp, int kind, int save,
                            void *host, void *dev_to)
{
    char path[4096];
    TRY(ckpt_path(dir, tp, kind, path, sizeof path));
    const size_t esz = kind == K_WEIGHT ? 2 : 4;
    void *dev = kind == K_WEIGHT   ? tp->info.shard
                : kind == K_MASTER ? (void *)tp->info.master
                : kind == K_M      ? (void *)tp->adam_m
                                   : (void *)tp->adam_v;
    if (dev_to) dev = dev_to;
    const size_t bytes = (size_t)tp->n * esz;
    int fd = open(path, save ? O_WRONLY : O_RDONLY);
    if (fd < 0) FAIL(ETP_ERR_INVALID_ARGUMENT, "cannot open %s: %s", path, strerror(errno));
    if (save) {
        TRY(etp_memcpy_async(m->s, host, dev, bytes));
        TRY(etp_stream_synchronize(m->s));
    } else {
        memset(host, 0, bytes); /* padding rows stay zero */
    }
    const int64_t rowb = tp->cols * (int64_t)esz;
    etp_status_t st = ETP_SUCCESS;
    for (int64_t e = 0; e < tp->experts && st == ETP_SUCCESS; e++) {
        off_t off = (off_t)(((tp->expert0 + e) * tp->rows + tp->info.shard_row_begin) * rowb);
        char *p = (char *)host + (size_t)(e * tp->info.shard_rows * rowb);
        size_t len = (size_t)(tp->info.valid_shard_rows * rowb);
        ssize_t got = save ? pwrite(fd, p, len, off) : pread(fd, p, len, off);
        if (got != (ssize_t)len) {
            fprintf(stderr, "etp-train: %s %s: %s\n", save ? "writing" : "reading", path,
                    got < 0 ? strerror(errno) : "short file");
            st = ETP_ERR_INVALID_ARGUMENT;
        }
    }
    if (close(fd) != 0 && st == ETP_SUCCESS) {
        fprintf(stderr, "etp-train: closing %s: %s\n", path, strerror(errno));
        st = ETP_ERR_INVALID_ARGUMENT;
    }
    if (st != ETP_SUCCESS) return st;
    if (!save) {
        TRY(etp_memcpy_async(m->s, dev, host, bytes));
        TRY(etp_stream_synchronize(m->s));
    }
    return ETP_SUCCESS;
}

static etp_status_t meta_path(const char *dir, char *path, size_t n)
{
    int w = snprintf(path, n, "%s/model.txt", dir);
    if (w < 0 || (size_t)w >= n) FAIL(ETP_ERR_INVALID_ARGUMENT, "checkpoint path too long");
    return ETP_SUCCESS;
}

etp_status_t model_save(train_model_t *m, const char *dir)
{
    const train_shape_t *sh = &m->sh;
    char path[4096];
    etp_status_t st = ETP_SUCCESS;
    if (m->rank == 0) {
        /* rank 0 makes every file at its full size; the others then write
         * their rows into it */
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "etp-train: cannot make %s: %s\n", dir, strerror(errno));
            st = ETP_ERR_INVALID_ARGUMENT;
        }
        for (int i = 0; i < sh->layers * TRAIN_WEIGHTS && st == ETP_SUCCESS; i++) {
            tparam_t *tp = &m->params[i];
            int64_t e, r, c;
            train_weight_shape(sh, tp->kind, &e, &r, &c);
            for (int k = 0; k < K_COUNT && st == ETP_SUCCESS; k++) {
                st = ckpt_path(dir, tp, k, path, sizeof path);
                int fd = st == ETP_SUCCESS ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666) : -1;
                if (fd < 0 || ftruncate(fd, (off_t)(e * r * c * (k == K_WEIGHT ? 2 : 4))) != 0) {
                    fprintf(stderr, "etp-train: cannot make %s: %s\n", path, strerror(errno));
                    st = ETP_ERR_INVALID_ARGUMENT;
                }
                if (fd >= 0) close(fd);
            }
        }
        if (st == ETP_SUCCESS) st = meta_path(dir, path, sizeof path);
        FILE *f = st == ETP_SUCCESS ? fopen(path, "w") : NULL;
        if (f) {
            fprintf(f, "layers %d\nhidden %lld\nffn %lld\nexperts %d\ntopk %d\nstep %d\n",
                    sh->layers, (long long)sh->hidden, (long long)sh->ffn, sh->experts, sh->topk,
                    m->t);
            if (fclose(f) != 0) st = ETP_ERR_INVALID_ARGUMENT;
        } else if (st == ETP_SUCCESS) {
            fprintf(stderr, "etp-train: cannot write %s\n", path);
            st = ETP_ERR_INVALID_ARGUMENT;
        }
    }
    /* every rank learns whether rank 0 made the files */
    double flag = st == ETP_SUCCESS ? 0.0 : 1.0;
    double *hflag = m->loss_host;
    *hflag = flag;
    TRY(etp_memcpy_async(m->s, m->loss_dev, hflag, sizeof(double)));
    TRY(barrier(m));
    TRY(etp_memcpy_async(m->s, hflag, m->loss_dev, sizeof(double)));
    TRY(etp_stream_synchronize(m->s));
    if (*hflag != 0.0) FAIL(ETP_ERR_INVALID_ARGUMENT, "saving to %s failed", dir);
    void *host = malloc(model_max_shard_bytes(m));
    if (!host) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    st = ETP_SUCCESS;
    if (m->r_dp == 0) /* the DP replicas hold the same state */
        for (int i = 0; i < sh->layers * TRAIN_WEIGHTS && st == ETP_SUCCESS; i++) {
            tparam_t *tp = &m->params[i];
            if (tp->experts == 1 && m->r_ep != 0) continue; /* dense: EP replicas too */
            for (int k = 0; k < K_COUNT && st == ETP_SUCCESS; k++)
                st = ckpt_io(m, dir, tp, k, 1, host, NULL);
        }
    free(host);
    TRY(st);
    TRY(barrier(m));
    return ETP_SUCCESS;
}

etp_status_t model_load(train_model_t *m, const char *dir)
{
    const train_shape_t *sh = &m->sh;
    char path[4096];
    TRY(meta_path(dir, path, sizeof path));
    FILE *f = fopen(path, "r");
    if (!f) FAIL(ETP_ERR_INVALID_ARGUMENT, "cannot read %s: %s", path, strerror(errno));
    int layers = 0, experts = 0, topk = 0, step = 0;
    long long hidden = 0, ffn = 0;
    int got = fscanf(f, "layers %d\nhidden %lld\nffn %lld\nexperts %d\ntopk %d\nstep %d", &layers,
                     &hidden, &ffn, &experts, &topk, &step);
    fclose(f);
    if (got != 6) FAIL(ETP_ERR_INVALID_ARGUMENT, "%s: not a checkpoint's description", path);
    if (layers != sh->layers || hidden != sh->hidden || ffn != sh->ffn ||
        experts != sh->experts || topk != sh->topk)
        FAIL(ETP_ERR_INVALID_ARGUMENT,
             "%s holds layers %d hidden %lld ffn %lld experts %d topk %d; this run has layers %d "
             "hidden %lld ffn %lld experts %d topk %d",
             path, layers, hidden, ffn, experts, topk, sh->layers, (long long)sh->hidden,
             (long long)sh->ffn, sh->experts, sh->topk);
    void *host = malloc(model_max_shard_bytes(m));
    if (!host) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    etp_status_t st = model__fill_begin(m);
    for (int i = 0; i < sh->layers * TRAIN_WEIGHTS && st == ETP_SUCCESS; i++) {
        tparam_t *tp = &m->params[i];
        /* the masters first: loading the BF16 shard also writes them, from
         * the BF16 values; the saved masters then overwrite that */
        st = ckpt_io(m, dir, tp, K_WEIGHT, 0, host, m->fill_buf);
        if (st == ETP_SUCCESS) st = etp_param_load_shard(tp->p, m->fill_buf, m->s);
        if (st == ETP_SUCCESS) st = etp_stream_synchronize(m->s);
        for (int k = K_MASTER; k < K_COUNT && st == ETP_SUCCESS; k++)
            st = ckpt_io(m, dir, tp, k, 0, host, NULL);
    }
    free(host);
    etp_status_t st2 = model__fill_end(m);
    TRY(st);
    TRY(st2);
    m->t = step;
    TRY(model__refresh_resident(m));
    TRY(barrier(m));
    return ETP_SUCCESS;
}
