/* cmd_bench.c — `minke bench serve` (load-test an OpenAI-compatible server and report latency,
 * throughput, goodput and cost as shared/docs/benchmarking.md defines them) and `minke bench plot`
 * (SVG charts from result files). The measuring is in src/bench/; this file turns options into an
 * mk_bench_config, runs one run per concurrency of a sweep, prints and saves the results.
 *
 *   minke bench serve --base-url http://127.0.0.1:8000 --dataset random --random-input-len 128 \
 *       --random-output-len 32 --num-prompts 20 --sweep-concurrency 1,2,4 --save-result r.json
 *   minke bench plot r.json [more.json ...] --out chart.svg
 */
#include "bench/bench.h"
#include "bench/plot.h"
#include "bench/report.h"
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *serve_usage = "--base-url URL [--dataset random|prefix-repetition|agentic|sharegpt] [options]";

/* --slo ttft=MS,tpot=MS,e2el=MS (any subset) into seconds. */
static int parse_slo(const char *s, mk_bench_slo *slo) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) return -1;
        *eq = 0;
        char *end;
        double v = strtod(eq + 1, &end);
        if (*end || end == eq + 1 || !(v > 0)) return -1;
        if (!strcmp(tok, "ttft")) slo->ttft = v / 1e3;
        else if (!strcmp(tok, "tpot")) slo->tpot = v / 1e3;
        else if (!strcmp(tok, "e2el")) slo->e2el = v / 1e3;
        else return -1;
    }
    return 0;
}

/* "1,2,4,8" -> values (at most cap). Returns the count or -1. */
static int parse_list(const char *s, int *v, int cap) {
    int n = 0;
    for (const char *p = s; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 100000 || n == cap) return -1;
        v[n++] = (int)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n ? n : -1;
}

/* --dump-requests: the exact bodies, one per line (JSON Lines), so another load generator can
 * replay the same workload. */
static int dump_requests(const char *path, const mk_bench_ctx *ctx, const mk_bench_prompt *p, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        char *b = mk_bench_request_body(ctx, &p[i]);
        bad = !b || fprintf(f, "%s\n", b) < 0;
        free(b);
    }
    return fclose(f) || bad ? -1 : 0;
}

static int bench_serve(int argc, char **argv) {
    cli_opt o[] = {
        {"--base-url", "URL", "server to benchmark, e.g. http://127.0.0.1:8000 (required)", NULL},
        {"--endpoint", "E", "completions (default) or chat", NULL},
        {"--model", "NAME", "model name sent in requests (default: the first of /v1/models)", NULL},
        {"--api-key", "KEY", "bearer token (default: $OPENAI_API_KEY when set)", NULL},
        {"--prompt-format", "F", "completions prompts as ids (token ids, default) or text", NULL},
        {"--dataset", "D", "random (default), prefix-repetition, agentic or sharegpt", NULL},
        {"--dataset-path", "FILE", "ShareGPT-format JSON file (--dataset sharegpt)", NULL},
        {"--num-prompts", "N", "requests to send (default 100; agentic: see --agentic-sessions)", NULL},
        {"--request-rate", "R", "requests/s with gamma inter-arrivals, or inf (default: inf, all at once)", NULL},
        {"--burstiness", "B", "gamma shape of the inter-arrivals: 1 = Poisson, <1 burstier (default 1)", NULL},
        {"--max-concurrency", "N", "most requests in flight (default: no cap)", NULL},
        {"--sweep-concurrency", "LIST", "one run per value, e.g. 1,2,4,8 (agentic: lanes); results in one file", NULL},
        {"--seed", "S", "seed of the workload and the arrivals (default 0)", NULL},
        {"--num-warmups", "N", "requests sent and discarded before measuring (default 0)", NULL},
        {"--random-input-len", "N", "random: prompt tokens (default 1024)", NULL},
        {"--random-output-len", "N", "random and prefix-repetition: output tokens (default 128)", NULL},
        {"--random-range-ratio", "R", "lengths uniform in [len(1-R), len(1+R)], 0 <= R < 1 (default 0)", NULL},
        {"--prefix-num", "P", "prefix-repetition: distinct shared prefixes (default 4)", NULL},
        {"--prefix-len", "L", "prefix-repetition: tokens per prefix (default 256)", NULL},
        {"--suffix-len", "S", "prefix-repetition: unique tokens after the prefix (default 64)", NULL},
        {"--sharegpt-output-len", "N", "sharegpt: output tokens of every request (default: the answer's length)", NULL},
        {"--agentic-lanes", "N", "agentic: concurrent session lanes, the load (default 4)", NULL},
        {"--agentic-sessions", "N", "agentic: sessions in all (default: one per lane)", NULL},
        {"--agentic-turns", "T", "agentic: turns per session (default 8)", NULL},
        {"--agentic-think-ms", "MS", "agentic: mean think time between turns, exponential (default 1000)", NULL},
        {"--agentic-subagent-prob", "P", "agentic: probability that a session spawns sub-agents (default 0.44)", NULL},
        {"--agentic-subagents", "K", "agentic: sub-agents per spawn (default 2)", NULL},
        {"--agentic-subagent-turns", "T", "agentic: turns of a sub-agent session (default: half of --agentic-turns)", NULL},
        {"--agentic-system-len", "N", "agentic: shared system prompt tokens (default 512)", NULL},
        {"--agentic-first-len", "N", "agentic: first user message tokens (default 128)", NULL},
        {"--agentic-tool-len", "N", "agentic: tool result tokens per turn (default 128)", NULL},
        {"--agentic-output-len", "N", "agentic: output tokens per turn (default 64)", NULL},
        {"--agentic-max-context", "N", "agentic: a session ends before its prompt + output pass N (default 4096)", NULL},
        {"--temperature", "T", "sampling temperature (default 0)", NULL},
        {"--no-ignore-eos", NULL, "do not send ignore_eos (outputs may end before max_tokens)", NULL},
        {"--request-timeout", "S", "seconds before a request counts as failed (default 600)", NULL},
        {"--slo", "SPEC", "goodput SLOs in ms, e.g. ttft=2000,tpot=50,e2el=10000 (any subset)", NULL},
        {"--gpus", "N", "GPUs serving the model, for TPGS and cost (default 1)", NULL},
        {"--gpu-hour-cost", "USD", "price of one GPU-hour, for cost per 1M output tokens", NULL},
        {"--label", "NAME", "name of this system in plots (default: model @ base URL)", NULL},
        {"--save-result", "FILE", "write the configuration, summary and every request record as JSON", NULL},
        {"--dump-requests", "FILE", "write the request bodies of the (first) run, one JSON per line, for other tools", NULL},
        {"--dry-run", NULL, "build the prompts (and --dump-requests them), send nothing", NULL},
        {"--quiet", NULL, "print only the sweep table (and errors)", NULL},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int pr = cli_parse("bench serve", serve_usage, argc, argv, o, n);
    if (pr) return pr > 0 ? 0 : 2;
#define OPT(name) cli_get(o, n, name)
    mk_bench_config c = {
        .timeout_s = 600, .ignore_eos = 1, .prompt_ids = 1, .num_prompts = 100, .request_rate = INFINITY,
        .burstiness = 1, .input_len = 1024, .output_len = 128, .prefix_num = 4, .prefix_len = 256, .suffix_len = 64,
        .ag_lanes = 4, .ag_turns = 8, .ag_think_ms = 1000, .ag_subagent_prob = 0.44, .ag_subagents = 2,
        .ag_system_len = 512, .ag_first_len = 128, .ag_tool_len = 128, .ag_output_len = 64, .ag_max_context = 4096,
        .gpus = 1,
    };
    const char *cmd = "bench serve";
    c.base_url = OPT("--base-url");
    if (!c.base_url) {
        fprintf(stderr, "minke bench serve: --base-url is required (see minke bench serve --help)\n");
        return 2;
    }
    c.model = OPT("--model");
    c.api_key = OPT("--api-key");
    if (!c.api_key) c.api_key = getenv("OPENAI_API_KEY");
    c.label = OPT("--label");
    c.dataset_path = OPT("--dataset-path");
    c.quiet = OPT("--quiet") != NULL;
    c.ignore_eos = OPT("--no-ignore-eos") == NULL;
    const char *v;
    if ((v = OPT("--endpoint"))) {
        if (!strcmp(v, "chat")) c.endpoint = MK_BENCH_EP_CHAT;
        else if (strcmp(v, "completions")) {
            fprintf(stderr, "minke bench serve: --endpoint must be chat or completions (got '%s')\n", v);
            return 2;
        }
    }
    if ((v = OPT("--prompt-format"))) {
        if (!strcmp(v, "text")) c.prompt_ids = 0;
        else if (strcmp(v, "ids")) {
            fprintf(stderr, "minke bench serve: --prompt-format must be ids or text (got '%s')\n", v);
            return 2;
        }
    }
    if ((v = OPT("--dataset"))) {
        static const char *names[] = {"random", "prefix-repetition", "agentic", "sharegpt"};
        c.dataset = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, names[i])) c.dataset = i;
        if (c.dataset < 0) {
            fprintf(stderr, "minke bench serve: --dataset must be random, prefix-repetition, agentic or sharegpt (got '%s')\n", v);
            return 2;
        }
    }
    if (c.dataset == MK_BENCH_DS_SHAREGPT && !c.dataset_path) {
        fprintf(stderr, "minke bench serve: --dataset sharegpt needs --dataset-path FILE\n");
        return 2;
    }
    struct {
        const char *name;
        int *dst;
        long lo, hi;
    } ints[] = {
        {"--num-prompts", &c.num_prompts, 1, 10000000},
        {"--max-concurrency", &c.max_concurrency, 1, 100000},
        {"--num-warmups", &c.num_warmups, 0, 100000},
        {"--random-input-len", &c.input_len, 1, 10000000},
        {"--random-output-len", &c.output_len, 1, 10000000},
        {"--prefix-num", &c.prefix_num, 1, 100000},
        {"--prefix-len", &c.prefix_len, 0, 10000000},
        {"--suffix-len", &c.suffix_len, 0, 10000000},
        {"--sharegpt-output-len", &c.sharegpt_output_len, 1, 10000000},
        {"--agentic-lanes", &c.ag_lanes, 1, 100000},
        {"--agentic-sessions", &c.ag_sessions, 1, 10000000},
        {"--agentic-turns", &c.ag_turns, 1, 100000},
        {"--agentic-subagents", &c.ag_subagents, 0, 1000},
        {"--agentic-subagent-turns", &c.ag_subagent_turns, 1, 100000},
        {"--agentic-system-len", &c.ag_system_len, 0, 10000000},
        {"--agentic-first-len", &c.ag_first_len, 1, 10000000},
        {"--agentic-tool-len", &c.ag_tool_len, 0, 10000000},
        {"--agentic-output-len", &c.ag_output_len, 1, 10000000},
        {"--agentic-max-context", &c.ag_max_context, 0, 100000000},
        {"--gpus", &c.gpus, 1, 1000000},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long x;
        if (!(v = OPT(ints[i].name))) continue;
        if (cli_int(cmd, ints[i].name, v, ints[i].lo, ints[i].hi, &x)) return 2;
        *ints[i].dst = (int)x;
    }
    long seed = 0;
    if ((v = OPT("--seed")) && cli_int(cmd, "--seed", v, 0, 0x7fffffffL, &seed)) return 2;
    c.seed = (unsigned long long)seed;
    struct {
        const char *name;
        double *dst, lo, hi;
    } dbl[] = {
        {"--burstiness", &c.burstiness, 1e-3, 1e6},
        {"--random-range-ratio", &c.range_ratio, 0, 0.999},
        {"--agentic-think-ms", &c.ag_think_ms, 0, 1e9},
        {"--agentic-subagent-prob", &c.ag_subagent_prob, 0, 1},
        {"--temperature", &c.temperature, 0, 100},
        {"--request-timeout", &c.timeout_s, 0.001, 1e7},
        {"--gpu-hour-cost", &c.gpu_hour_cost, 0, 1e9},
    };
    for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++)
        if ((v = OPT(dbl[i].name)) && cli_float(cmd, dbl[i].name, v, dbl[i].lo, dbl[i].hi, dbl[i].dst)) return 2;
    if ((v = OPT("--request-rate")) && strcasecmp(v, "inf") &&
        cli_float(cmd, "--request-rate", v, 1e-6, 1e9, &c.request_rate))
        return 2;
    if ((v = OPT("--slo")) && parse_slo(v, &c.slo)) {
        fprintf(stderr, "minke bench serve: --slo expects ttft=MS,tpot=MS,e2el=MS (any subset), got '%s'\n", v);
        return 2;
    }
    if (!c.ag_subagent_turns) c.ag_subagent_turns = c.ag_turns > 1 ? c.ag_turns / 2 : 1;
    int sweep[64], n_sweep = 0;
    if ((v = OPT("--sweep-concurrency")) && (n_sweep = parse_list(v, sweep, 64)) < 0) {
        fprintf(stderr, "minke bench serve: --sweep-concurrency expects a list like 1,2,4,8 (got '%s')\n", v);
        return 2;
    }
    int sessions_given = c.ag_sessions > 0;
    if (!n_sweep) sweep[n_sweep++] = c.dataset == MK_BENCH_DS_AGENTIC ? c.ag_lanes : c.max_concurrency;

    /* ---- set up: server, model, token pool, prompts ---- */
    mk_err err = {0};
    if (mk_bench_http_global_init(&err)) {
        fprintf(stderr, "minke bench serve: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    mk_bench_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    mk_bench_prompt *prompts = NULL;
    int n_prompts = 0;
    char *version = NULL;
    json_t *runs = json_array();
    mk_bench_http *h = mk_bench_http_new(c.api_key);
    if (!h) {
        fprintf(stderr, "minke bench serve: out of memory\n");
        goto done;
    }
    if (mk_bench_ctx_init(&ctx, &c, h, &err) || mk_bench_pool_init(&ctx, h, &err)) goto fail;
    version = mk_bench_server_version(&ctx, h);
    if (c.dataset == MK_BENCH_DS_AGENTIC && mk_bench_agentic_init(&ctx, h, &err)) goto fail;

    /* ---- one run per concurrency ---- */
    int all_failed = 0;
    mk_bench_summary rows[64];
    int row_conc[64];
    for (int k = 0; k < n_sweep; k++) {
        mk_bench_config rc_cfg = c;
        if (c.dataset == MK_BENCH_DS_AGENTIC) {
            rc_cfg.ag_lanes = sweep[k];
            if (!sessions_given) rc_cfg.ag_sessions = sweep[k];
        } else {
            rc_cfg.max_concurrency = sweep[k];
        }
        /* each run of a sweep draws its own prompts (seed + k), so a run does not hit the prefix
         * cache that the previous run filled */
        rc_cfg.seed = c.seed + (unsigned long long)k;
        ctx.cfg = &rc_cfg;
        if (c.dataset != MK_BENCH_DS_AGENTIC) {
            double tb = mk_bench_now();
            if (prompts)
                for (int i = 0; i < n_prompts; i++) mk_bench_prompt_free(&prompts[i]);
            free(prompts);
            prompts = NULL;
            if (mk_bench_build_prompts(&ctx, h, &prompts, &n_prompts, &err)) goto fail;
            if (!c.quiet)
                fprintf(stderr, "minke bench: %d prompts built in %.2f s (%s, model %s)\n", n_prompts,
                        mk_bench_now() - tb, ctx.base, ctx.model);
        }
        if (k == 0 && prompts && (v = OPT("--dump-requests")) && dump_requests(v, &ctx, prompts, n_prompts)) {
            fprintf(stderr, "minke bench serve: cannot write %s\n", v);
            goto done;
        }
        if (OPT("--dry-run")) {
            if (!c.quiet) fprintf(stderr, "minke bench: --dry-run: nothing sent\n");
            rc = 0;
            goto done;
        }
        mk_bench_report rep = {.cfg = &rc_cfg, .ctx = &ctx, .server_version = version};
        mk_bench_results res;
        rep.have_prom = mk_bench_scrape(&ctx, h, &rep.before) == MK_OK;
        if (!c.quiet) fprintf(stderr, "minke bench: run %d of %d (concurrency %d)\n", k + 1, n_sweep, sweep[k]);
        if (mk_bench_run(&ctx, prompts, n_prompts, &res, &err)) goto fail;
        rep.have_prom = rep.have_prom && mk_bench_scrape(&ctx, h, &rep.after) == MK_OK;
        rep.res = &res;
        if (mk_bench_summarize(res.reqs, res.n, res.duration, &c.slo, c.gpus, c.gpu_hour_cost, &rep.sum)) {
            mk_bench_results_free(&res);
            fprintf(stderr, "minke bench serve: out of memory\n");
            goto done;
        }
        if (!c.quiet) mk_bench_print(stdout, &rep);
        if (rep.sum.completed == 0) all_failed = 1;
        json_array_append_new(runs, mk_bench_run_json(&rep));
        rows[k] = rep.sum;
        row_conc[k] = res.concurrency;
        mk_bench_results_free(&res);
        fflush(stdout);
    }
    if (n_sweep > 1 || c.quiet) {
        printf("\nsweep (%s):\n", c.dataset == MK_BENCH_DS_AGENTIC ? "concurrency = lanes" : "concurrency = max in flight");
        for (int j = 0; j < n_sweep; j++) mk_bench_print_sweep_row(stdout, row_conc[j], &rows[j], j == 0);
    }
    ctx.cfg = &c;
    if ((v = OPT("--save-result"))) {
        if (mk_bench_save(v, runs, &err)) goto fail;
        if (!c.quiet) fprintf(stderr, "minke bench: results written to %s\n", v);
    }
    rc = all_failed ? 1 : 0;
    goto done;
fail:
    fprintf(stderr, "minke bench serve: %s\n", err.msg);
    rc = 1;
done:
    json_decref(runs);
    if (prompts)
        for (int i = 0; i < n_prompts; i++) mk_bench_prompt_free(&prompts[i]);
    free(prompts);
    free(version);
    mk_bench_ctx_free(&ctx);
    mk_bench_http_free(h);
    mk_bench_http_global_cleanup();
    return rc;
#undef OPT
}

static int bench_plot(int argc, char **argv) {
    cli_opt o[] = {
        {"--out", "FILE.svg", "where to write the chart (required)", NULL},
        {"--title", "TEXT", "chart title (default: minke bench)", NULL},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    /* result files are the arguments that are neither options nor option values */
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    const char **files = malloc(sizeof(char *) * (size_t)(argc + 1));
    int nr = 0, nf = 0, rc = 2;
    if (!rest || !files) goto done;
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) {
            rest[nr++] = argv[i];
            int takes = 0;
            for (int k = 0; k < n; k++)
                if (!strcmp(argv[i], o[k].name)) takes = o[k].arg != NULL;
            if (takes && i + 1 < argc) rest[nr++] = argv[++i];
        } else {
            files[nf++] = argv[i];
        }
    }
    int pr = cli_parse("bench plot", "RESULT.json... --out FILE.svg [--title TEXT]", nr, rest, o, n);
    if (pr) {
        rc = pr > 0 ? 0 : 2;
        goto done;
    }
    if (!o[0].value || !nf) {
        fprintf(stderr, "minke bench plot: give one or more result files and --out FILE.svg\n");
        goto done;
    }
    mk_err err = {0};
    if (mk_bench_plot(files, nf, o[0].value, o[1].value, &err)) {
        fprintf(stderr, "minke bench plot: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    rc = 0;
done:
    free(rest);
    free(files);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "serve")) return bench_serve(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "plot")) return bench_plot(argc - 1, argv + 1);
    printf("usage: minke bench serve %s\n"
           "       minke bench plot RESULT.json... --out FILE.svg [--title TEXT]\n\n"
           "  serve  load-test an OpenAI-compatible server (minke, vLLM, SGLang, llama-server) and report\n"
           "         TTFT / TPOT / ITL / E2EL percentiles, throughput, goodput, interactivity and cost\n"
           "  plot   SVG charts (latency percentiles per concurrency, throughput vs tokens/s/user)\n\n"
           "`minke bench serve --help` lists every option.\n",
           serve_usage);
    return argc >= 1 && strcmp(argv[0], "--help") && strcmp(argv[0], "-h") ? 2 : 0;
}
