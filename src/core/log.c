/* Logging: off unless ETP_LOG_LEVEL asks; every line carries the rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"core", ETP_SUBSYS_CORE},   {"backend", ETP_SUBSYS_BACKEND}, {"comm", ETP_SUBSYS_COMM},
    {"quant", ETP_SUBSYS_QUANT}, {"shard", ETP_SUBSYS_SHARD},     {"ep", ETP_SUBSYS_EP},
};

static const char *subsys_name(unsigned bit)
{
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
        if (subsys_names[i].bit == bit) return subsys_names[i].name;
    return "?";
}

void etp__log(const etp__logger_t *lg, int level, unsigned subsys, const char *fmt, ...)
{
    char line[ETP__ERRMSG_MAX + 64];
    int n;
    if (lg->rank >= 0)
        n = snprintf(line, sizeof line, "etp[%d] %s %s: ", lg->rank, level_names[level],
                     subsys_name(subsys));
    else
        n = snprintf(line, sizeof line, "etp[-] %s %s: ", level_names[level],
                     subsys_name(subsys));
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (lg->fn)
        lg->fn(lg->user, level, line);
    else
        fprintf(stderr, "%s\n", line);
}

int etp__log_level_parse(const char *s)
{
    if (s == NULL || *s == '\0') return -1;
    if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0') return s[0] - '0';
    for (int i = 0; i <= ETP_LOG_TRACE; i++)
        if (strcasecmp(s, level_names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return ETP_LOG_WARN;
    return -1;
}

unsigned etp__log_subsys_parse(const char *s)
{
    unsigned mask = 0;
    if (s == NULL) return 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        unsigned bit = 0;
        if (len == 3 && strncasecmp(s, "all", 3) == 0) bit = ETP_SUBSYS_ALL;
        for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
            if (strlen(subsys_names[i].name) == len && strncasecmp(s, subsys_names[i].name, len) == 0)
                bit = subsys_names[i].bit;
        /* one misspelt name would silently hide the logs it was meant to show */
        if (bit == 0) return 0;
        mask |= bit;
        s += len;
        if (*s == ',') s++;
    }
    return mask;
}
