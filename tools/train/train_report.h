/* etp-train's output: progress lines, the summary, the CSV and the SVG. */
#ifndef TRAIN_REPORT_H
#define TRAIN_REPORT_H

#include <stdint.h>
#include <stdio.h>

typedef struct train_report_row {
    int step;
    double loss;
    double step_ms;     /* wall clock of the whole step, slowest rank */
    double fwdbwd_ms;   /* forward + backward */
    double gather_ms;   /* exposed gathers (the stream's time inside them) */
    double exchange_ms; /* EP calls */
    double optim_ms;
    int64_t dropped;    /* EP slots dropped so far */
    double tokens_per_s;
    double tflops;      /* useful GEMM TFLOP/s per GPU over forward + backward */
} train_report_row_t;

typedef struct train_report train_report_t;

train_report_t *train_report_create(int steps);
void train_report_destroy(train_report_t *r);
void train_report_add(train_report_t *r, const train_report_row_t *row);
const train_report_row_t *train_report_row(const train_report_t *r, int i);
void train_report_print_row(const train_report_row_t *row, FILE *f);
/* Loss line and medians over the rows from `skip` on; peak: the TFLOP/s of
 * one large GEMM measured in the same run (0: not measured); per: what the
 * TFLOP/s are counted per ("GPU", "rank"). */
void train_report_summary(const train_report_t *r, int skip, double peak, const char *per,
                          FILE *f);
/* 0, or -1 after a message. */
int train_report_csv(const train_report_t *r, const char *path);
int train_report_svg(const train_report_t *r, const char *path);

#endif /* TRAIN_REPORT_H */
