/* etp-train's output (train_report.h). */
#include "train_report.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct train_report {
    train_report_row_t *rows;
    int n, cap;
};

train_report_t *train_report_create(int steps)
{
    train_report_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->cap = steps > 0 ? steps : 1;
    r->rows = calloc((size_t)r->cap, sizeof *r->rows);
    if (!r->rows) {
        free(r);
        return NULL;
    }
    return r;
}

void train_report_destroy(train_report_t *r)
{
    if (!r) return;
    free(r->rows);
    free(r);
}

void train_report_add(train_report_t *r, const train_report_row_t *row)
{
    if (r->n < r->cap) r->rows[r->n++] = *row;
}

const train_report_row_t *train_report_row(const train_report_t *r, int i)
{
    static const train_report_row_t none = {0};
    return i >= 0 && i < r->n ? &r->rows[i] : &none;
}

void train_report_print_row(const train_report_row_t *w, FILE *f)
{
    fprintf(f,
            "step %5d  loss %.6g  %.4g tokens/s  step %.2f ms (fwd+bwd %.2f, gathers exposed "
            "%.2f, exchanges %.2f, optimizer %.2f)  dropped %lld\n",
            w->step, w->loss, w->tokens_per_s, w->step_ms, w->fwdbwd_ms, w->gather_ms,
            w->exchange_ms, w->optim_ms, (long long)w->dropped);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of field `off` of rows [skip, n). */
static double median(const train_report_t *r, int skip, size_t off)
{
    if (skip >= r->n) skip = 0;
    int n = r->n - skip;
    if (n <= 0) return 0;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) return 0;
    for (int i = 0; i < n; i++) memcpy(&v[i], (const char *)&r->rows[skip + i] + off, sizeof(double));
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}

#define MED(r, skip, field) median((r), (skip), offsetof(train_report_row_t, field))

void train_report_summary(const train_report_t *r, int skip, double peak, const char *per,
                          FILE *f)
{
    if (r->n == 0) return;
    const train_report_row_t *a = &r->rows[0], *b = &r->rows[r->n - 1];
    fprintf(f, "loss %.6g -> %.6g (%.1fx) over %d steps\n", a->loss, b->loss,
            b->loss > 0 ? a->loss / b->loss : INFINITY, r->n);
    double tf = MED(r, skip, tflops);
    fprintf(f,
            "median step %.2f ms: fwd+bwd %.2f ms, gathers exposed %.2f ms, exchanges %.2f ms, "
            "optimizer %.2f ms; %.4g tokens/s; GEMMs %.3g TFLOP/s per %s",
            MED(r, skip, step_ms), MED(r, skip, fwdbwd_ms), MED(r, skip, gather_ms),
            MED(r, skip, exchange_ms), MED(r, skip, optim_ms), MED(r, skip, tokens_per_s), tf,
            per);
    if (peak > 0) fprintf(f, " (%.0f%% of one 8192^3 GEMM's %.1f)", 100.0 * tf / peak, peak);
    fprintf(f, "; dropped %lld slots\n", (long long)b->dropped);
}

int train_report_csv(const train_report_t *r, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "etp-train: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "step,loss,step_ms,fwdbwd_ms,gather_exposed_ms,exchange_ms,optimizer_ms,dropped,"
               "tokens_per_s,tflops_per_gpu\n");
    for (int i = 0; i < r->n; i++) {
        const train_report_row_t *w = &r->rows[i];
        /* the loss in full: runs are compared bit for bit */
        fprintf(f, "%d,%.17g,%.4f,%.4f,%.4f,%.4f,%.4f,%lld,%.6g,%.4f\n", w->step, w->loss,
                w->step_ms, w->fwdbwd_ms, w->gather_ms, w->exchange_ms, w->optim_ms,
                (long long)w->dropped, w->tokens_per_s, w->tflops);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "etp-train: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* Two charts: the loss per step (log scale), and each step's time stacked
 * as compute (forward + backward less the exposed parts), exposed gathers,
 * EP exchanges and the optimizer. */
int train_report_svg(const train_report_t *r, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "etp-train: cannot write %s\n", path);
        return -1;
    }
    const double W = 800, Hc = 260, x0 = 70, y0 = 30, gap = 70;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n",
            W + 2 * x0, 2 * Hc + gap + 2 * y0 + 40);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    double lo = INFINITY, hi = 0, tmax = 0;
    for (int i = 0; i < r->n; i++) {
        double l = r->rows[i].loss;
        if (l > 0 && l < lo) lo = l;
        if (l > hi) hi = l;
        double t = r->rows[i].fwdbwd_ms + r->rows[i].optim_ms;
        if (t > tmax) tmax = t;
    }
    if (!(lo < hi)) hi = lo * 10, lo = lo / 10;
    if (!(tmax > 0)) tmax = 1;
    const int n = r->n > 1 ? r->n : 2;
    /* loss */
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">loss (log scale) %.4g to %.4g</text>\n", x0, y0 - 10,
            hi, lo);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#888\"/>\n",
            x0, y0, W, Hc);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"1.5\" points=\"");
    for (int i = 0; i < r->n; i++) {
        double l = r->rows[i].loss > 0 ? r->rows[i].loss : lo;
        double x = x0 + W * i / (n - 1);
        double y = y0 + Hc * (log(hi) - log(l)) / (log(hi) - log(lo));
        fprintf(f, "%.1f,%.1f ", x, y);
    }
    fprintf(f, "\"/>\n");
    /* times */
    const double y1 = y0 + Hc + gap;
    static const char *const names[4] = {"compute", "gathers exposed", "EP exchanges",
                                         "optimizer"};
    static const char *const colors[4] = {"#2e86c1", "#e67e22", "#8e44ad", "#7f8c8d"};
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">step time, ms (0 to %.3g)</text>\n", x0, y1 - 10,
            tmax);
    for (int c = 0; c < 4; c++)
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/><text "
                   "x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                x0 + 250 + c * 130, y1 - 20, colors[c], x0 + 264 + c * 130, y1 - 11, names[c]);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#888\"/>\n",
            x0, y1, W, Hc);
    const double bw = W / n;
    for (int i = 0; i < r->n; i++) {
        const train_report_row_t *w = &r->rows[i];
        double comp = w->fwdbwd_ms - w->gather_ms - w->exchange_ms;
        double part[4] = {comp > 0 ? comp : 0, w->gather_ms, w->exchange_ms, w->optim_ms};
        double y = y1 + Hc;
        for (int c = 0; c < 4; c++) {
            double h = Hc * part[c] / tmax;
            y -= h;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n",
                    x0 + bw * i, y, bw, h, colors[c]);
        }
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">step</text>\n", x0 + W / 2, y1 + Hc + 30);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "etp-train: cannot write %s\n", path);
        return -1;
    }
    return 0;
}
