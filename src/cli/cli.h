/* cli.h — shared pieces of the `minke` subcommands: the declared option tables (name, argument,
 * help, and optionally an environment variable, a default and a checked type/range) that produce
 * --help, reject unknown options and validate values, integer/float parsing with range checks,
 * and the subcommand entry points. Each subcommand lives in its own file in src/cli/.
 *
 * Precedence of a value: the command line, then the option's environment variable (read once, in
 * cli_parse; an empty variable counts as unset), then its default. */
#ifndef MK_CLI_CLI_H
#define MK_CLI_CLI_H

#include <stddef.h>

/* Option tables list {name, arg, help, value} and leave the optional trailing fields (env, kind,
 * range, default) zero; that is intended, so the warning about it is off in the CLI files. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

typedef struct {
    const char *name; /* "--model" */
    const char *arg;  /* argument placeholder, NULL for a flag */
    const char *help;
    const char *value; /* filled by cli_parse: the argument, "1" for a set flag, else the
                        * environment variable's value, else def, else NULL */
    /* Optional (zero in tables that do not use them): */
    const char *env;   /* environment variable read when the option is not on the command line;
                        * for a flag, any value but "" / "0" sets it */
    int kind;          /* CLI_ANY: no check; CLI_INT / CLI_FLOAT: cli_parse checks [lo, hi] */
    double lo, hi;
    const char *def;   /* default value, shown in --help */
} cli_opt;

enum { CLI_ANY = 0, CLI_INT = 1, CLI_FLOAT = 2 };

/* Returns 0 on success, 1 if --help was asked (help printed), -1 on a usage error (message
 * printed naming the option). */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv, cli_opt *opts, int nopts);
/* The value of the option named `name` (NULL if not given). */
const char *cli_get(const cli_opt *opts, int nopts, const char *name);
int cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* --device: "cpu" -> MK_DEVICE_CPU, "cuda" -> MK_DEVICE_CUDA (minke.h); anything else prints
 * "minke CMD: --device expects cpu or cuda, got 'X'" and returns -1 (exit 2). NULL is cpu. */
int cli_device(const char *cmd, const char *s, int *device);
/* The help text of --device and --cuda-device (one place for every subcommand). */
#define CLI_DEVICE_HELP                                                                            \
    "where the forward pass runs: cpu, or cuda (DeepSeek-V4 checkpoints, in build-cuda/minke from " \
    "`make cuda`)"
#define CLI_CUDA_DEVICE_HELP "CUDA device index with --device cuda"
/* Reads a whole file (or stdin for "-") into a malloc'd NUL-terminated buffer. */
char *cli_read_file(const char *path, size_t *len);

int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
