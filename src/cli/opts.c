/* opts.c — option tables and value parsing shared by the subcommands (cli.h). */
#include "cli/cli.h"
#include "minke.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_help(const char *cmd, const char *usage, const cli_opt *o, int n) {
    printf("usage: minke %s %s\n\noptions:\n", cmd, usage);
    for (int k = 0; k < n; k++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o[k].name, o[k].arg ? " " : "", o[k].arg ? o[k].arg : "");
        char extra[160] = "";
        if (o[k].def && o[k].env) snprintf(extra, sizeof extra, " (default %s; env %s)", o[k].def, o[k].env);
        else if (o[k].def) snprintf(extra, sizeof extra, " (default %s)", o[k].def);
        else if (o[k].env) snprintf(extra, sizeof extra, " (env %s)", o[k].env);
        printf("  %-32s %s%s\n", left, o[k].help, extra);
    }
}

int cli_parse(const char *cmd, const char *usage, int argc, char **argv, cli_opt *o, int n) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help(cmd, usage, o, n);
            return 1;
        }
        int found = 0;
        for (int k = 0; k < n && !found; k++) {
            if (strcmp(argv[i], o[k].name)) continue;
            found = 1;
            if (o[k].arg) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "minke %s: option %s needs a value (%s)\n", cmd, o[k].name, o[k].arg);
                    return -1;
                }
                o[k].value = argv[++i];
            } else {
                o[k].value = "1";
            }
        }
        if (!found) {
            fprintf(stderr, "minke %s: unknown option '%s' (see minke %s --help)\n", cmd, argv[i], cmd);
            return -1;
        }
    }
    /* environment, defaults, declared checks */
    for (int k = 0; k < n; k++) {
        const char *src = o[k].name;
        if (!o[k].value && o[k].env) {
            const char *e = getenv(o[k].env);
            if (e && *e) {
                o[k].value = o[k].arg ? e : (strcmp(e, "0") ? "1" : NULL);
                src = o[k].env;
            }
        }
        if (!o[k].value && o[k].def) {
            o[k].value = o[k].def;
            src = NULL;
        }
        if (!o[k].value || !src) continue;
        long l;
        double d;
        if (o[k].kind == CLI_INT && cli_int(cmd, src, o[k].value, (long)o[k].lo, (long)o[k].hi, &l)) return -1;
        if (o[k].kind == CLI_FLOAT && cli_float(cmd, src, o[k].value, o[k].lo, o[k].hi, &d)) return -1;
    }
    return 0;
}

const char *cli_get(const cli_opt *o, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (!strcmp(o[k].name, name)) return o[k].value;
    return NULL;
}

int cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "minke %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "minke %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_device(const char *cmd, const char *s, int *device) {
    if (!s || !strcmp(s, "cpu")) *device = MK_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *device = MK_DEVICE_CUDA;
    else {
        fprintf(stderr, "minke %s: --device expects cpu or cuda, got '%s'\n", cmd, s);
        return -1;
    }
    return 0;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (f != stdin) fclose(f);
    if (b) b[n] = 0;
    if (len) *len = n;
    return b;
}
