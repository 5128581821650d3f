/* Command-line options from one table: the parser, the defaults, the usage. */
#include "etp_cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* getopt_long's val for an option of the tables: above every character,
 * so that it never meets 'h', '?' or ':' */
enum { VAL_BASE = 0x10000 };

#define USAGE_WIDTH 79
#define HELP_COLUMN 26

static const etp_cli_opt_t *option_at(const etp_cli_t *c, int k)
{
    return &c->tables[ETP_CLI_TABLE(k)][ETP_CLI_INDEX(k)];
}

/* Every option of the tables in order, as (table << 8 | index); -1 after the
 * last. */
static int option_after(const etp_cli_t *c, int k)
{
    int t = k < 0 ? 0 : ETP_CLI_TABLE(k), i = k < 0 ? 0 : ETP_CLI_INDEX(k) + 1;
    for (; t < ETP_CLI_MAX_TABLES; t++, i = 0)
        if (c->tables[t] && c->tables[t][i].name) return t << 8 | i;
    return -1;
}

static void build(etp_cli_t *c)
{
    int n = 0;
    for (int k = option_after(c, -1); k >= 0; k = option_after(c, k)) {
        if (n == ETP_CLI_MAX_OPTS) {
            fprintf(stderr, "%s: more than %d options: raise ETP_CLI_MAX_OPTS\n", c->prog,
                    ETP_CLI_MAX_OPTS);
            abort(); /* a program's own table is wrong, not its user's input */
        }
        const etp_cli_opt_t *o = option_at(c, k);
        c->lo_[n++] = (struct option){o->name, o->metavar ? required_argument : no_argument, NULL,
                                      VAL_BASE + k};
    }
    c->lo_[n++] = (struct option){"help", no_argument, NULL, 'h'};
    c->lo_[n] = (struct option){NULL, 0, NULL, 0};
    c->next_def_ = -1;
    c->started_ = 1;
    /* glibc's getopt keeps its place in globals: 0 starts it afresh */
    optind = 0;
    opterr = 0;
}

static int returning(etp_cli_t *c, int k, const char *arg)
{
    snprintf(c->opt_, sizeof c->opt_, "--%s", option_at(c, k)->name);
    c->opt = c->opt_;
    c->arg = arg;
    return k;
}

/* an unknown --name, or a prefix of more than one option's */
static int unknown_long(const etp_cli_t *c, const char *given)
{
    const char *name = given + strspn(given, "-");
    const size_t len = strcspn(name, "=");
    char matches[256] = "";
    int n = 0;
    for (const struct option *o = c->lo_; o->name; o++)
        if (strncmp(o->name, name, len) == 0) {
            size_t used = strlen(matches);
            snprintf(matches + used, sizeof matches - used, "%s--%s", n ? ", " : "", o->name);
            n++;
        }
    if (n > 1) return etp_cli_fail(c, "option '%s' is ambiguous: %s", given, matches);
    return etp_cli_fail(c, "unknown option '%s'", given);
}

int etp_cli_next(etp_cli_t *c)
{
    if (!c->started_) build(c);
    /* the defaults first */
    while (c->next_def_ != -2) {
        c->next_def_ = option_after(c, c->next_def_);
        if (c->next_def_ < 0) {
            c->next_def_ = -2;
            break;
        }
        const etp_cli_opt_t *o = option_at(c, c->next_def_);
        if (o->metavar && o->def) return returning(c, c->next_def_, o->def);
    }
    int li = -1;
    const int v = getopt_long(c->argc, c->argv, ":h", c->lo_, &li);
    if (v == -1) {
        if (optind < c->argc) return etp_cli_fail(c, "unexpected argument '%s'", c->argv[optind]);
        return ETP_CLI_END;
    }
    if (v == 'h') {
        if (!c->quiet) etp_cli_usage(c, stdout);
        return ETP_CLI_HELP;
    }
    if (v >= VAL_BASE) return returning(c, v - VAL_BASE, optarg);
    /* getopt_long's optopt: our val for an option of ours, the letter of an
     * unknown short option, 0 for an unknown or ambiguous long one */
    if (optopt >= VAL_BASE) {
        const char *name = option_at(c, optopt - VAL_BASE)->name;
        if (v == ':') return etp_cli_fail(c, "option --%s needs a value", name);
        return etp_cli_fail(c, "option --%s takes no value", name);
    }
    if (v == ':') return etp_cli_fail(c, "option -%c needs a value", optopt);
    if (optopt) return etp_cli_fail(c, "unknown option -%c", optopt);
    return unknown_long(c, c->argv[optind - 1]);
}

/* text from column `col`, wrapped at USAGE_WIDTH with later lines at
 * `indent`; '\n' starts a new paragraph there */
static void wrap(FILE *f, const char *text, int col, int indent)
{
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n\n%*s", indent, "");
            col = indent;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        int first = col == indent;
        if (!first && col + 1 + (int)w > USAGE_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            first = 1;
        }
        if (!first) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, w, f);
        col += (int)w;
        p += w;
    }
    fputc('\n', f);
}

static void usage_line(FILE *f, const char *left, const char *help, const char *def)
{
    char text[1024];
    if (def)
        snprintf(text, sizeof text, "%s (default: %s)", help, def);
    else
        snprintf(text, sizeof text, "%s", help);
    etp_cli_item(f, left, text);
}

void etp_cli_item(FILE *f, const char *left, const char *text)
{
    int col = fprintf(f, "  %s", left);
    if (col + 2 > HELP_COLUMN) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", HELP_COLUMN - col, "");
    wrap(f, text, HELP_COLUMN, HELP_COLUMN);
}

static int table_used(const etp_cli_t *c, int t)
{
    return c->tables[t] && c->tables[t][0].name;
}

void etp_cli_usage(const etp_cli_t *c, FILE *f)
{
    fprintf(f, "Usage: %s %s\n", c->prog, c->args ? c->args : "[OPTIONS]");
    if (c->about) {
        fputc('\n', f);
        wrap(f, c->about, 0, 0);
    }
    int last = 0; /* --help goes last, under the last table's heading */
    for (int t = 0; t < ETP_CLI_MAX_TABLES; t++)
        if (table_used(c, t)) last = t;
    for (int t = 0; t <= last; t++) {
        if (!table_used(c, t) && t != last) continue;
        fprintf(f, "\n%s:\n", c->titles[t] ? c->titles[t] : "Options");
        for (const etp_cli_opt_t *o = c->tables[t]; o && o->name; o++) {
            char left[96];
            snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
            usage_line(f, left, o->help, o->metavar ? o->def : NULL);
        }
        if (t == last) usage_line(f, "-h, --help", "print this help and exit", NULL);
    }
}

int etp_cli_fail(const etp_cli_t *c, const char *fmt, ...)
{
    if (c->quiet) return ETP_CLI_ERROR;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s (%s --help lists the options)\n", c->prog, msg, c->prog);
    return ETP_CLI_ERROR;
}

int etp_cli_long(const char *prog, int quiet, const char *opt, const char *s, long lo, long hi,
                 long *out)
{
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno || v < lo || v > hi) {
        if (!quiet)
            fprintf(stderr, "%s: %s '%s': expected a whole number in [%ld, %ld]\n", prog, opt, s,
                    lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int etp_cli_double(const char *prog, int quiet, const char *opt, const char *s, double lo, double hi,
                   double *out)
{
    char *end = NULL;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno || !isfinite(v) || v < lo || v > hi) {
        if (!quiet)
            fprintf(stderr, "%s: %s '%s': expected a number in [%g, %g]\n", prog, opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
