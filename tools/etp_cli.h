/*
 * etp_cli: the command-line options of etp's programs, each command's from
 * one table. The parser (getopt_long), the usage text (--help) and the
 * defaults are all made from the table, so they cannot disagree.
 *
 *   enum { O_STEPS, O_QUIET };
 *   static const etp_cli_opt_t opts[] = {
 *       [O_STEPS] = {"steps", "N", "5", "training steps"},
 *       [O_QUIET] = {"quiet", NULL, NULL, "print nothing"},
 *       {NULL},
 *   };
 *   etp_cli_t cli = {.prog = "etp-demo", .about = "...", .tables = {opts},
 *                    .argc = argc, .argv = argv};
 *   int k;
 *   while ((k = etp_cli_next(&cli)) >= 0)
 *       switch (ETP_CLI_INDEX(k)) { case O_STEPS: ... cli.arg ... }
 *   if (k != ETP_CLI_END) return k == ETP_CLI_HELP ? 0 : 2;
 *
 * Options are GNU long options (--name VALUE or --name=VALUE, unambiguous
 * prefixes accepted); -h and --help print the usage on stdout. Messages go
 * to stderr as "prog: ...".
 */
#ifndef ETP_CLI_H
#define ETP_CLI_H

#include <getopt.h>
#include <stdio.h>

typedef struct etp_cli_opt {
    const char *name;    /* the long name, without "--"; NULL ends a table */
    const char *metavar; /* the value's placeholder ("N", "LIST"); NULL: a flag, no value */
    const char *def;     /* the default value: etp_cli_next() returns it first, as if given
                            (options with a value only); NULL: none */
    const char *help;    /* what it does (the usage wraps it) */
} etp_cli_opt_t;

enum { ETP_CLI_MAX_TABLES = 2, ETP_CLI_MAX_OPTS = 64 };

typedef struct etp_cli {
    /* set by the caller */
    const char *prog;  /* "etp-bench gather": the usage line and messages */
    const char *args;  /* after prog in the usage line; NULL: "[OPTIONS]" */
    const char *about; /* the usage's paragraphs ('\n' separates them) */
    const etp_cli_opt_t *tables[ETP_CLI_MAX_TABLES]; /* in usage order; NULL: none */
    const char *titles[ETP_CLI_MAX_TABLES];          /* each table's heading; NULL: "Options" */
    int quiet;         /* print nothing, not even --help's usage (MPI ranks but 0) */
    int argc;
    char **argv;
    /* set by etp_cli_next() for the option it returns */
    const char *opt;   /* "--name", for messages */
    const char *arg;   /* its value; NULL for a flag */
    /* private */
    struct option lo_[ETP_CLI_MAX_OPTS + 2];
    char opt_[64];
    int started_, next_def_;
} etp_cli_t;

/* etp_cli_next() returns an option as (table << 8 | index in the table),
 * or one of these. */
#define ETP_CLI_INDEX(k) ((k) & 0xff)
#define ETP_CLI_TABLE(k) ((k) >> 8)
#define ETP_CLI_END (-1)   /* every option is read */
#define ETP_CLI_HELP (-2)  /* -h or --help: the usage is printed on stdout unless quiet (exit 0) */
#define ETP_CLI_ERROR (-3) /* a bad option or a stray argument, said on stderr (exit 2) */

/* The next option: first every default of the tables (def set), then the
 * command line's options in their order. */
int etp_cli_next(etp_cli_t *c);

/* The usage, made from the tables, on f. */
void etp_cli_usage(const etp_cli_t *c, FILE *f);
/* One more item in the usage's layout: "  left   text", text wrapped. */
void etp_cli_item(FILE *f, const char *left, const char *text);

/* Say on stderr (unless quiet) "prog: <message>"; returns ETP_CLI_ERROR. */
int etp_cli_fail(const etp_cli_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The value s of option opt as a whole number in [lo, hi] (or a number in
 * [lo, hi]), nothing after it: 0 with *out set, or -1 after a message naming
 * prog and opt (unless quiet). */
int etp_cli_long(const char *prog, int quiet, const char *opt, const char *s, long lo, long hi,
                 long *out);
int etp_cli_double(const char *prog, int quiet, const char *opt, const char *s, double lo, double hi,
                   double *out);

#endif
