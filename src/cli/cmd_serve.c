/* cmd_serve.c — `minke serve`: load the model (text/chat.h), start the engine and the HTTP server
 * (server/server.h), wait for SIGTERM / SIGINT, shut down gracefully.
 *
 *   minke serve [--model PATH] [--host 127.0.0.1] [--port 8000] [--api-key KEY | --api-key-file F]
 *               [--served-model-name NAME] [--max-model-len N] [--max-num-seqs 8]
 *               [--max-waiting 256] [--threads N] [--max-body-bytes 4194304]
 *               [--request-timeout S] [--shutdown-timeout 30] [--tokenizer F] [--chat-template T]
 *               [--max-num-batched-tokens N] [--long-prefill-token-threshold N]
 *               [--no-enable-prefix-caching] [--kv-cache-memory-bytes N]
 *               [--enable-prompt-tokens-details] [--no-access-log] [--device cpu|cuda]
 *               [--cuda-device N] [--no-async-scheduling]
 *
 * Every option can also come from the environment variable its help names (MINKE_PORT, ...).
 * With no --model the embedded default model (SmolLM2-135M-Instruct) is served. --device cuda runs
 * a DeepSeek-V4 checkpoint on the GPU (build-cuda/minke, built by `make cuda`); the startup log
 * names the device.
 *
 * Shutdown: the signals are blocked in every thread and taken here with sigwait. On the first one
 * the server drains (new generation requests get 503 + Retry-After, the engine admits nothing new)
 * and in-flight requests may finish for --shutdown-timeout seconds; then (or at a second signal)
 * what remains is cancelled, its clients get a final "abort" chunk, connections close, the engine
 * stops, and the process exits 0.
 */
#include "cli/cli.h"
#include "engine/engine.h"
#include "server/server.h"
#include "text/chat.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { O_MODEL, O_TOK, O_TMPL, O_HOST, O_PORT, O_KEY, O_KEYFILE, O_NAME, O_MAXLEN, O_SEQS, O_WAIT, O_THREADS,
       O_BODY, O_TIMEOUT, O_SHUTDOWN, O_QUIET, O_BATCH, O_LONGPF, O_NOPREFIX, O_KVBYTES, O_DETAILS, O_DEVICE, O_CUDADEV,
       O_NOASYNC, O_N };

/* Reads the first line of path (trimmed) into buf. */
static int read_key_file(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(buf, (int)cap, f)) buf[0] = 0;
    fclose(f);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = 0;
    return n ? 0 : -1;
}

/* Waits up to timeout_s for a signal in set; returns it, or 0 on timeout. */
static int wait_signal(const sigset_t *set, double timeout_s) {
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    for (;;) {
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0) return sig;
        if (errno == EAGAIN) return 0;
        if (errno != EINTR) return 0;
    }
}

int cmd_serve(int argc, char **argv) {
    cli_opt o[O_N] = {
        [O_MODEL] = {"--model", "PATH", "DeepSeek-V4 checkpoint directory or a .gguf file (default: the embedded SmolLM2-135M-Instruct)", NULL, "MINKE_MODEL"},
        [O_TOK] = {"--tokenizer", "FILE", "tokenizer.json to use instead of the model's", NULL, "MINKE_TOKENIZER"},
        [O_TMPL] = {"--chat-template", "NAME", "chat template for GGUF models: chatml or llama3 (default: from the GGUF)", NULL, "MINKE_CHAT_TEMPLATE"},
        [O_HOST] = {"--host", "HOST", "address to listen on", NULL, "MINKE_HOST", CLI_ANY, 0, 0, "127.0.0.1"},
        [O_PORT] = {"--port", "N", "port to listen on (0: any free port)", NULL, "MINKE_PORT", CLI_INT, 0, 65535, "8000"},
        [O_KEY] = {"--api-key", "KEY", "require this key on every inference route (Authorization: Bearer KEY or x-api-key)", NULL, "MINKE_API_KEY"},
        [O_KEYFILE] = {"--api-key-file", "FILE", "read the API key from the first line of FILE", NULL, "MINKE_API_KEY_FILE"},
        [O_NAME] = {"--served-model-name", "NAME", "the model's name in the API (default: the --model argument, or SmolLM2-135M-Instruct)", NULL, "MINKE_SERVED_MODEL_NAME"},
        [O_MAXLEN] = {"--max-model-len", "N", "tokens per request, prompt + output (default: min(model context, 4096))", NULL, "MINKE_MAX_MODEL_LEN", CLI_INT, 16, 1 << 30},
        [O_SEQS] = {"--max-num-seqs", "N", "requests running at once (sequence slots)", NULL, "MINKE_MAX_NUM_SEQS", CLI_INT, 1, 4096, "8"},
        [O_WAIT] = {"--max-waiting", "N", "requests waiting for a slot before new ones get 429", NULL, "MINKE_MAX_WAITING", CLI_INT, 0, 1 << 20, "256"},
        [O_THREADS] = {"--threads", "N", "CPU threads for the forward pass (default: all cores)", NULL, "MINKE_THREADS", CLI_INT, 1, 1024},
        [O_BODY] = {"--max-body-bytes", "N", "larger request bodies get 413", NULL, "MINKE_MAX_BODY_BYTES", CLI_INT, 1024, 1 << 30, "4194304"},
        [O_TIMEOUT] = {"--request-timeout", "S", "seconds a request may run before it is ended (finish_reason abort); 0 = none", NULL, "MINKE_REQUEST_TIMEOUT", CLI_FLOAT, 0, 1e9, "0"},
        [O_SHUTDOWN] = {"--shutdown-timeout", "S", "on SIGTERM/SIGINT, seconds in-flight requests may finish before they are cancelled", NULL, "MINKE_SHUTDOWN_TIMEOUT", CLI_FLOAT, 0, 1e6, "30"},
        [O_QUIET] = {"--no-access-log", NULL, "do not log one line per request on stderr", NULL, "MINKE_NO_ACCESS_LOG"},
        [O_BATCH] = {"--max-num-batched-tokens", "N", "tokens per engine step (default: max(2048, max-model-len))", NULL, "MINKE_MAX_NUM_BATCHED_TOKENS", CLI_INT, 1, 1 << 30},
        [O_LONGPF] = {"--long-prefill-token-threshold", "N", "prefill tokens per request per step (default 512)", NULL, "MINKE_LONG_PREFILL_TOKEN_THRESHOLD", CLI_INT, 1, 1 << 30},
        [O_NOPREFIX] = {"--no-enable-prefix-caching", NULL, "disable prefix caching", NULL, "MINKE_NO_PREFIX_CACHING"},
        [O_KVBYTES] = {"--kv-cache-memory-bytes", "N", "bytes of the paged KV pool (default: room for max-num-seqs full sequences; on the CPU at most 512 MiB, at least one)", NULL, "MINKE_KV_CACHE_MEMORY_BYTES", CLI_INT, 1, 9.2e18},
        [O_DETAILS] = {"--enable-prompt-tokens-details", NULL, "report usage.prompt_tokens_details.cached_tokens", NULL, "MINKE_ENABLE_PROMPT_TOKENS_DETAILS"},
        [O_DEVICE] = {"--device", "cpu|cuda", CLI_DEVICE_HELP, NULL, "MINKE_DEVICE", CLI_ANY, 0, 0, "cpu"},
        [O_CUDADEV] = {"--cuda-device", "N", CLI_CUDA_DEVICE_HELP, NULL, "MINKE_CUDA_DEVICE", CLI_INT, 0, 1024, "0"},
        [O_NOASYNC] = {"--no-async-scheduling", NULL, "on the GPU, wait for each step's tokens before queuing the next step (default: the next step is queued while the GPU runs this one)", NULL, "MINKE_NO_ASYNC_SCHEDULING"},
    };
    int pr = cli_parse("serve", "[--model PATH] [--host H] [--port N] [--api-key KEY] [options]", argc, argv, o, O_N);
    if (pr) return pr > 0 ? 0 : 2;
    int device;
    if (cli_device("serve", o[O_DEVICE].value, &device)) return 2;
    char key[512] = "";
    if (o[O_KEY].value && o[O_KEYFILE].value) {
        fprintf(stderr, "minke serve: give --api-key or --api-key-file, not both\n");
        return 2;
    }
    if (o[O_KEY].value) snprintf(key, sizeof key, "%s", o[O_KEY].value);
    if (o[O_KEYFILE].value && read_key_file(o[O_KEYFILE].value, key, sizeof key)) {
        fprintf(stderr, "minke serve: --api-key-file %s: cannot read a key from it\n", o[O_KEYFILE].value);
        return 2;
    }
    long port = atol(o[O_PORT].value), seqs = atol(o[O_SEQS].value), waiting = atol(o[O_WAIT].value);
    long maxlen = o[O_MAXLEN].value ? atol(o[O_MAXLEN].value) : 0, threads = o[O_THREADS].value ? atol(o[O_THREADS].value) : 0;
    long body = atol(o[O_BODY].value);
    double timeout = atof(o[O_TIMEOUT].value), shutdown_s = atof(o[O_SHUTDOWN].value);

    /* signals: blocked here before any thread starts, so every thread inherits the mask and only
     * the sigtimedwait below takes them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    mk_err err = {0};
    mk_chat *chat = NULL;
    mk_engine *eng = NULL;
    mk_srv *srv = NULL;
    int rc = 1;
    mk_chat_options co = {.model = o[O_MODEL].value, .tokenizer = o[O_TOK].value, .chat_template = o[O_TMPL].value,
                          .n_threads = (int)threads, .max_model_len = (int)maxlen, .device = device,
                          .cuda_device = atoi(o[O_CUDADEV].value)};
    if (mk_chat_load(&co, &chat, &err)) {
        fprintf(stderr, "minke serve: %s\n", err.msg);
        return 1;
    }
    if (maxlen > mk_chat_context(chat)) {
        fprintf(stderr, "minke serve: --max-model-len %ld exceeds the model's context length %d\n", maxlen, mk_chat_context(chat));
        mk_chat_free(chat);
        return 2;
    }
    mk_engine_options eo = {
        .max_num_seqs = (int)seqs, .max_model_len = mk_chat_max_model_len(chat), .max_waiting = (int)waiting,
        .max_num_batched_tokens = o[O_BATCH].value ? atoi(o[O_BATCH].value) : 0,
        .long_prefill_token_threshold = o[O_LONGPF].value ? atoi(o[O_LONGPF].value) : 0,
        .kv_bytes = o[O_KVBYTES].value ? (size_t)strtoull(o[O_KVBYTES].value, NULL, 10) : 0,
        .no_prefix_caching = o[O_NOPREFIX].value != NULL,
        .async_scheduling = o[O_NOASYNC].value != NULL ? -1 : 0,
    };
    if (mk_engine_create(mk_chat_model(chat), &eo, &eng, &err)) {
        fprintf(stderr, "minke serve: %s\n", err.msg);
        goto out;
    }
    const char *name = o[O_NAME].value ? o[O_NAME].value : o[O_MODEL].value ? o[O_MODEL].value : "SmolLM2-135M-Instruct";
    mk_srv_options so = {
        .host = o[O_HOST].value, .port = (int)port, .api_key = key[0] ? key : NULL, .served_model_name = name,
        .max_body_bytes = (size_t)body, .request_timeout_s = timeout, .max_model_len = mk_chat_max_model_len(chat),
        .quiet = o[O_QUIET].value != NULL, .prompt_tokens_details = o[O_DETAILS].value != NULL,
    };
    if (mk_srv_create(chat, eng, &so, &srv, &err) || mk_srv_start(srv, &err)) {
        fprintf(stderr, "minke serve: %s\n", err.msg);
        goto out;
    }
    const char *host = o[O_HOST].value;
    int v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "minke serve: model %s (%s, %s template) on %s, max_model_len %d, max_num_seqs %ld%s\n",
            mk_chat_model_path(chat), mk_chat_family(chat), mk_chat_template_name(chat),
            mk_model_device_name(mk_chat_model(chat)), mk_chat_max_model_len(chat), seqs, key[0] ? ", API key required" : "");
    fprintf(stderr, "minke serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", mk_srv_port(srv));
    fflush(stderr);

    int sig = 0;
    while (!(sig = wait_signal(&set, 3600))) {}
    fprintf(stderr, "minke serve: %s: draining (%d requests in flight, up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            mk_srv_active(srv), shutdown_s);
    mk_srv_drain(srv);
    mk_engine_drain(eng);
    double t0 = mk_now();
    while (mk_srv_active(srv) > 0 && mk_now() - t0 < shutdown_s)
        if (wait_signal(&set, 0.05)) break; /* a second signal: stop waiting */
    if (mk_srv_active(srv) > 0) {
        fprintf(stderr, "minke serve: cancelling %d requests\n", mk_srv_active(srv));
        mk_srv_cancel_all(srv);
        t0 = mk_now();
        while (mk_srv_active(srv) > 0 && mk_now() - t0 < 10) wait_signal(&set, 0.05);
    }
    mk_srv_stop(srv);
    fprintf(stderr, "minke serve: stopped\n");
    rc = 0;
out:
    mk_srv_free(srv);
    mk_engine_free(eng);
    mk_chat_free(chat);
    return rc;
}
