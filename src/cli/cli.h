/* cli.h — shared pieces of the `minke` subcommands: the declared option tables (name, argument,
 * help) that produce --help and reject unknown options, integer/float parsing with range checks,
 * and the subcommand entry points. Each subcommand lives in its own file in src/cli/. */
#ifndef MK_CLI_CLI_H
#define MK_CLI_CLI_H

#include <stddef.h>

typedef struct {
    const char *name; /* "--model" */
    const char *arg;  /* argument placeholder, NULL for a flag */
    const char *help;
    const char *value; /* filled by cli_parse: the argument, "1" for a set flag, else NULL */
} cli_opt;

/* Returns 0 on success, 1 if --help was asked (help printed), -1 on a usage error (message
 * printed naming the option). */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv, cli_opt *opts, int nopts);
/* The value of the option named `name` (NULL if not given). */
const char *cli_get(const cli_opt *opts, int nopts, const char *name);
int cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* Reads a whole file (or stdin for "-") into a malloc'd NUL-terminated buffer. */
char *cli_read_file(const char *path, size_t *len);

int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
