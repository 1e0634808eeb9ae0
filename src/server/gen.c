/* gen.c — a validated request running on the engine: events -> text, logprobs, tool calls.
 *
 * One srv_choice per engine request (prompt p, sample j: index p * n + j, OpenAI's order; a seeded
 * request gives choice j the seed + j, as vLLM does). Per token event, in this order: a stop
 * token (EOS unless ignore_eos, or one of stop_token_ids) shows no text; otherwise the token goes
 * through the detokenizer (special tokens are left out when skip_special_tokens, except
 * DeepSeek-V4's "</think>" while the reasoning is open: the splitter needs it), then the
 * stop-string matcher (not before min_tokens tokens, as vLLM), then — for chat on DeepSeek-V4 —
 * the reasoning / tool-call splitter. A stop-string match cancels the engine request at once; the
 * engine drops it at its next step. Logprobs are kept for every token the engine produced, the
 * stop token included (its text is "" when special tokens are skipped), so that the token texts
 * join to the output text and their count is the usage's completion_tokens.
 *
 * Forced tool calls (tool_choice required / named on DeepSeek-V4). vLLM forces the call with a
 * grammar; minke's engine has no logits masks, so the server writes the DSML structure itself and
 * lets the model write only what the structure leaves open, one engine request per phase, each
 * re-prompted with everything so far:
 *   reasoning (thinking mode): until "</think>" — the reasoning streams as usual;
 *   name (required with several tools): after `<｜DSML｜invoke name="` until `"`; a name that is
 *     not a tool becomes the tool sharing the longest prefix with it;
 *   one phase per required parameter of the schema: after its opening tag, until
 *     `</｜DSML｜parameter>`; a non-string value that is not JSON is passed as a string.
 * The phases share the request's max_tokens. The finished block is parsed like generated DSML, so
 * the arguments look exactly as they would had the model written the block.
 */
#include "server/srv.h"

#include "text/chat_dsv4.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define DSML MK_DSV4_DSML
#define PARAM_CLOSE "</" DSML "parameter>"

enum { F_OFF = 0, F_REASON, F_NAME, F_PARAM, F_DONE };

static int is_stop_token(const srv_req *r, const mk_chat *chat, int32_t id, int *is_eos) {
    *is_eos = 0;
    for (int i = 0; i < r->sp.n_stop_ids; i++)
        if (r->sp.stop_ids[i] == id) return 1;
    if (r->sp.ignore_eos) return 0;
    int n;
    const int32_t *eos = mk_chat_eos(chat, &n);
    for (int i = 0; i < n; i++)
        if (eos[i] == id) return *is_eos = 1;
    return 0;
}

/* ---- submitting --------------------------------------------------------------------------------- */

static int submit(srv_gen *g, srv_choice *c, const int32_t *ids, int n_ids, int max_tokens, srv_err *e) {
    mk_srv *s = g->s;
    srv_req *r = g->r;
    if (!s->eng) return srv_fail(e, 503, NULL, "no engine is running");
    if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE)) {
        srv_fail(e, 503, NULL, "the server is shutting down");
        e->retry_after = 5;
        return -1;
    }
    int n_eos;
    const int32_t *eos = mk_chat_eos(s->chat, &n_eos);
    mk_ereq_params p = {
        .prompt = ids, .n_prompt = n_ids, .sampling = r->sp, .eos_ids = eos, .n_eos = n_eos,
        .max_tokens = max_tokens, .priority = r->priority, .timeout_s = s->o.request_timeout_s,
        .cache_salt = r->cache_salt,
    };
    if (p.sampling.has_seed) p.sampling.seed += (uint64_t)(c->index % r->n);
    mk_err err = {0};
    mk_ereq *er = NULL;
    int rc = mk_engine_submit(s->eng, &p, &er, &err);
    if (rc == MK_EBUSY) {
        int drain = __atomic_load_n(&s->draining, __ATOMIC_ACQUIRE);
        srv_fail(e, drain ? 503 : 429, NULL, "%s", drain ? "the server is shutting down" : "too many requests are waiting: try again later");
        if (!drain) e->code = "queue_full";
        e->retry_after = drain ? 5 : 1;
        return -1;
    }
    if (rc == MK_EINVAL || rc == MK_ERANGE) return srv_fail(e, 400, NULL, "%s", err.msg);
    if (rc) return srv_fail(e, 500, NULL, "%s", err.msg);
    pthread_mutex_lock(&s->mu);
    mk_ereq *old = c->er;
    c->er = er;
    pthread_mutex_unlock(&s->mu);
    if (old) mk_ereq_release(old);
    return 0;
}

static int choice_init(srv_gen *g, srv_choice *c, srv_err *e) {
    srv_req *r = g->r;
    mk_err err;
    c->stop_str = -1;
    c->stop_tok = -1;
    if (mk_detok_create(mk_chat_tok(g->s->chat), 0, &c->dt, &err)) return srv_fail(e, 500, NULL, "%s", err.msg);
    if (mk_stop_create((const char *const *)r->stops, r->n_stops, r->include_stop_str, &c->st, &err))
        return srv_fail(e, 500, NULL, "%s", err.msg);
    int dsv4 = mk_chat_is_dsv4(g->s->chat);
    if (r->api != SRV_API_COMPLETION && dsv4 && (r->thinking || r->parse_tools || r->ftools)) {
        /* a forced call parses its own block: the splitter only splits the reasoning off */
        if (srv_split_create(r->thinking, r->parse_tools && !r->ftools, &c->sp)) return srv_fail(e, 500, NULL, "out of memory");
    }
    return 0;
}

/* ---- forced tool calls -------------------------------------------------------------------------- */

/* Starts the engine request of the current forced phase: prompt = rendered prompt + the
 * assistant text so far. */
static int fphase_submit(srv_gen *g, srv_choice *c, const char *stop, srv_err *e) {
    mk_srv *s = g->s;
    srv_req *r = g->r;
    mk_err err;
    mk_stop_free(c->st);
    c->st = NULL;
    const char *stops[1] = {stop};
    if (mk_stop_create(stops, 1, 0, &c->st, &err)) return srv_fail(e, 500, NULL, "%s", err.msg);
    mk_detok_reset(c->dt);
    sb_reset(&c->fval);
    c->fmaxed = 0;
    srv_buf t = {0};
    sb_puts(&t, r->prompt_text);
    sb_put(&t, c->fblock.p ? c->fblock.p : "", c->fblock.n);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = t.oom ? MK_ENOMEM : mk_tok_encode(mk_chat_tok(s->chat), t.p, t.n, 0, &ids, &n, &err);
    sb_free(&t);
    if (rc) return srv_fail(e, 500, NULL, "forced tool call: %s", rc == MK_ENOMEM ? "out of memory" : err.msg);
    int room = s->max_model_len - (int)n;
    int mt = c->fbudget < room ? c->fbudget : room;
    if (mt < 1) { /* nothing left to write with: the value stays empty */
        free(ids);
        pthread_mutex_lock(&s->mu);
        mk_ereq *old = c->er;
        c->er = NULL;
        pthread_mutex_unlock(&s->mu);
        if (old) mk_ereq_release(old);
        c->fmaxed = 1;
        return 1;
    }
    rc = submit(g, c, ids, (int)n, mt, e);
    free(ids);
    return rc;
}

/* The opening of parameter c->fparam of tool c->ftool, appended to the block. */
static void fopen_param(srv_choice *c, const srv_ftool *t) {
    const srv_fparam *p = &t->params[c->fparam];
    sb_printf(&c->fblock, "<" DSML "parameter name=\"%s\" string=\"%s\">", p->name, p->is_string ? "true" : "false");
}

static int fnext(srv_gen *g, srv_choice *c, srv_delta *d, srv_err *e);

/* Closes the block, parses it into c->calls. */
static void fdone(srv_gen *g, srv_choice *c, srv_delta *d) {
    sb_puts(&c->fblock, "</" DSML "invoke>\n</" DSML "tool_calls>");
    const char *blk = c->fblock.p ? strstr(c->fblock.p, "\n\n<" DSML "tool_calls") : NULL;
    mk_dsv4_msg m;
    mk_err err;
    if (blk && !mk_dsv4_parse(blk, strlen(blk), 0, &m, &err)) {
        for (int i = 0; i < m.n_calls; i++) {
            if (c->calls.n == c->calls.cap) {
                int cap = c->calls.cap ? 2 * c->calls.cap : 2;
                srv_call *v = realloc(c->calls.v, (size_t)cap * sizeof *v);
                if (!v) break;
                c->calls.v = v;
                c->calls.cap = cap;
            }
            srv_call *call = &c->calls.v[c->calls.n++];
            srv_rand_id("call_", call->id, sizeof call->id);
            call->name = m.calls[i].name;
            call->args = m.calls[i].arguments;
            m.calls[i].name = m.calls[i].arguments = NULL;
        }
        mk_dsv4_msg_free(&m);
    } else {
        snprintf(c->errmsg, sizeof c->errmsg, "forced tool call did not parse: %s", blk ? err.msg : "no block");
        mk_log(MK_LOG_WARN, "%s", c->errmsg);
    }
    (void)g;
    (void)d;
    c->fphase = F_DONE;
}

/* The text of the phase that just ended is in c->fval: use it and start the next phase. Returns 1
 * when the call is complete, 0 when a phase was started, -1 on error. */
static int fnext(srv_gen *g, srv_choice *c, srv_delta *d, srv_err *e) {
    srv_req *r = g->r;
    for (;;) {
        if (c->fphase == F_REASON || c->fphase == F_OFF) {
            sb_puts(&c->fblock, "\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"");
            c->fparam = 0;
            if (r->n_ftools == 1) {
                c->ftool = 0;
                sb_printf(&c->fblock, "%s\">\n", r->ftools[0].name);
                c->fphase = F_PARAM;
                if (!r->ftools[0].n_params) { fdone(g, c, d); return 1; }
                fopen_param(c, &r->ftools[0]);
            } else {
                c->fphase = F_NAME;
            }
        } else if (c->fphase == F_NAME) {
            /* the model's name, else the tool sharing the longest prefix with it */
            const char *v = c->fval.p ? c->fval.p : "";
            int best = 0, best_len = -1;
            for (int i = 0; i < r->n_ftools; i++) {
                const char *a = r->ftools[i].name;
                int k = 0;
                while (a[k] && a[k] == v[k]) k++;
                if (!a[k] && !v[k]) k = 1 << 20; /* exact */
                if (k > best_len) { best_len = k; best = i; }
            }
            c->ftool = best;
            sb_printf(&c->fblock, "%s\">\n", r->ftools[best].name);
            c->fphase = F_PARAM;
            c->fparam = 0;
            if (!r->ftools[best].n_params) { fdone(g, c, d); return 1; }
            fopen_param(c, &r->ftools[best]);
        } else if (c->fphase == F_PARAM) {
            const srv_ftool *t = &r->ftools[c->ftool];
            const srv_fparam *p = &t->params[c->fparam];
            const char *v = c->fval.p ? c->fval.p : "";
            if (!p->is_string) {
                /* JSON expected: trim; not JSON -> re-open the parameter as a string */
                size_t a = 0, b = c->fval.n;
                while (a < b && strchr(" \t\r\n", v[a])) a++;
                while (b > a && strchr(" \t\r\n", v[b - 1])) b--;
                json_t *j = json_loadb(v + a, b - a, JSON_DECODE_ANY, NULL);
                if (j) {
                    json_decref(j);
                    sb_put(&c->fblock, v + a, b - a);
                } else {
                    const char *open = strrchr(c->fblock.p, '<');
                    c->fblock.n = (size_t)(open - c->fblock.p);
                    c->fblock.p[c->fblock.n] = 0;
                    sb_printf(&c->fblock, "<" DSML "parameter name=\"%s\" string=\"true\">", p->name);
                    sb_put(&c->fblock, v, c->fval.n);
                }
            } else {
                sb_put(&c->fblock, v, c->fval.n);
            }
            sb_puts(&c->fblock, PARAM_CLOSE "\n");
            if (++c->fparam >= t->n_params) { fdone(g, c, d); return 1; }
            fopen_param(c, t);
        }
        int rc = fphase_submit(g, c, c->fphase == F_NAME ? "\"" : PARAM_CLOSE, e);
        if (rc < 0) return -1;
        if (rc == 0) return 0;
        /* no room for this phase: an empty value, next one */
    }
}

/* ---- finishing ---------------------------------------------------------------------------------- */

static double now_s(void) { return mk_now(); }

static void choice_metrics(srv_gen *g, srv_choice *c, const char *reason) {
    if (c->metrics_done) return;
    c->metrics_done = 1;
    double queue = -1;
    if (c->er) {
        mk_ereq_info info;
        mk_ereq_get_info(c->er, &info);
        if (info.t_admit > 0) queue = info.t_admit - info.t_submit;
    }
    int first_of_prompt = c->index % g->r->n == 0;
    srv_metrics_request(g->s->metrics, reason, first_of_prompt ? g->r->prompts[c->prompt].n : 0, c->n_gen,
                        c->t_first > 0 ? c->t_first - g->t_arrive : -1, now_s() - g->t_arrive, queue);
}

/* Ends choice c with reason (flushing what the detokenizer, stop matcher and splitter hold). */
static void finish_choice(srv_gen *g, srv_choice *c, const char *reason, srv_delta *d);

static void route_text(srv_gen *g, srv_choice *c, const char *t, size_t n) {
    if (!n) return;
    if (c->fphase == F_NAME || c->fphase == F_PARAM) {
        sb_put(&c->fval, t, n);
        return;
    }
    if (c->sp) {
        if (c->fphase == F_REASON) {
            /* forced call: only the reasoning is kept; text after "</think>" is dropped */
            srv_buf drop = {0};
            srv_calls none = {0};
            srv_split_feed(c->sp, t, n, &c->reasoning, &drop, &none);
            sb_free(&drop);
            srv_calls_free(&none);
        } else {
            srv_split_feed(c->sp, t, n, &c->reasoning, &c->content, &c->calls);
        }
    } else {
        sb_put(&c->content, t, n);
    }
    (void)g;
}

/* Text out of the detokenizer: stop strings (not before min_tokens), then routing. Returns 1 when
 * a stop string matched. */
static int feed_text(srv_gen *g, srv_choice *c, const char *t, size_t n, int final) {
    const char *e;
    size_t el;
    if (!final && c->n_gen <= g->r->sp.min_tokens && c->fphase == F_OFF) {
        route_text(g, c, t, n);
        return 0;
    }
    int hit = mk_stop_feed(c->st, t, n, &e, &el);
    if (hit < 0) hit = 0;
    route_text(g, c, e, el);
    return hit == 1;
}

/* Flushes the detokenizer and the stop matcher. Returns 1 if a stop string matched in the rest. */
static int flush_text(srv_gen *g, srv_choice *c) {
    if (mk_stop_matched(c->st) >= 0) return 1;
    const char *t, *e;
    size_t tl, el;
    mk_detok_flush(c->dt, &t, &tl);
    if (feed_text(g, c, t, tl, 1)) return 1;
    mk_stop_flush(c->st, &e, &el);
    route_text(g, c, e, el);
    return 0;
}

static void finish_choice(srv_gen *g, srv_choice *c, const char *reason, srv_delta *d) {
    if (c->done) return;
    if (c->sp && c->fphase == F_REASON) {
        srv_buf drop = {0};
        srv_split_finish(c->sp, &c->reasoning, &drop, &c->calls);
        sb_free(&drop);
    } else if (c->sp && c->fphase == F_OFF) {
        srv_split_finish(c->sp, &c->reasoning, &c->content, &c->calls);
    } /* a forced call past its reasoning: the splitter has nothing of the call */
    c->finish = reason;
    if (!strcmp(reason, "stop") && c->calls.n) c->finish = "tool_calls";
    if (c->er) mk_ereq_cancel(c->er);
    c->done = 1;
    c->t_done = now_s();
    g->n_done++;
    d->finished = 1;
    choice_metrics(g, c, !strcmp(reason, "length") ? "length" : !strcmp(reason, "abort") || !strcmp(reason, "error") ? "abort" : "stop");
}

/* A forced phase ended (stop string, stop token, length or its budget). */
static void fphase_end(srv_gen *g, srv_choice *c, srv_delta *d, int budget_out) {
    srv_err e;
    if (c->fphase == F_REASON) {
        if (budget_out && srv_split_in_reasoning(c->sp)) { /* max_tokens inside the reasoning */
            finish_choice(g, c, "length", d);
            return;
        }
        sb_put(&c->fblock, c->reasoning.p ? c->reasoning.p : "", c->reasoning.n);
        sb_puts(&c->fblock, MK_DSV4_THINK_END);
    }
    int k0 = c->calls.n;
    int rc = fnext(g, c, d, &e);
    if (rc < 0) {
        snprintf(c->errmsg, sizeof c->errmsg, "%s", e.msg);
        finish_choice(g, c, e.status == 503 ? "abort" : "error", d);
    } else if (rc == 1) {
        d->call_from = k0;
        d->call_to = c->calls.n;
        finish_choice(g, c, "stop", d);
    }
}

/* ---- events -------------------------------------------------------------------------------------- */

static void on_token(srv_gen *g, srv_choice *c, const mk_ereq_event *ev, srv_delta *d) {
    srv_req *r = g->r;
    mk_srv *s = g->s;
    int32_t id = ev->tok.token;
    c->n_gen++;
    if (c->fphase) c->fbudget--;
    if (c->t_first <= 0) c->t_first = ev->t;
    else srv_metrics_itl(s->metrics, ev->t - c->t_last);
    c->t_last = ev->t;
    if (r->logprobs) {
        if (c->n_toks == c->cap_toks) {
            int cap = c->cap_toks ? 2 * c->cap_toks : 16;
            mk_sample_out *v = realloc(c->toks, (size_t)cap * sizeof *v);
            if (v) {
                c->toks = v;
                c->cap_toks = cap;
            }
        }
        if (c->n_toks < c->cap_toks) {
            c->toks[c->n_toks] = ev->tok;
            d->tok = &c->toks[c->n_toks++];
        }
    }
    int is_eos;
    if (is_stop_token(r, s->chat, id, &is_eos)) {
        c->stop_tok = id;
        c->stop_tok_is_eos = is_eos;
        return; /* the FINISH event follows */
    }
    int keep = !r->skip_special || !mk_tok_is_special(mk_chat_tok(s->chat), id) ||
               (c->sp && id == s->think_end && srv_split_in_reasoning(c->sp));
    const char *t = "";
    size_t tl = 0;
    if (keep) mk_detok_push(c->dt, id, &t, &tl);
    int hit = feed_text(g, c, t, tl, 0);
    if (c->fphase == F_REASON && !srv_split_in_reasoning(c->sp)) {
        fphase_end(g, c, d, 0);
        return;
    }
    if (hit) {
        if (c->fphase == F_NAME || c->fphase == F_PARAM) {
            fphase_end(g, c, d, 0);
            return;
        }
        c->stop_str = mk_stop_matched(c->st);
        finish_choice(g, c, "stop", d);
    }
}

static void on_finish(srv_gen *g, srv_choice *c, const mk_ereq_event *ev, srv_delta *d) {
    if (c->fphase && c->fphase != F_DONE &&
        (ev->finish == MK_EFIN_STOP || ev->finish == MK_EFIN_LENGTH)) {
        flush_text(g, c);
        fphase_end(g, c, d, ev->finish == MK_EFIN_LENGTH);
        return;
    }
    int hit = flush_text(g, c);
    if (hit && mk_stop_matched(c->st) >= 0 && c->stop_str < 0) c->stop_str = mk_stop_matched(c->st);
    switch (ev->finish) {
    case MK_EFIN_STOP: finish_choice(g, c, "stop", d); break;
    case MK_EFIN_LENGTH: finish_choice(g, c, hit ? "stop" : "length", d); break;
    case MK_EFIN_TIMEOUT:
        snprintf(c->errmsg, sizeof c->errmsg, "request timeout (--request-timeout)");
        finish_choice(g, c, "abort", d);
        break;
    case MK_EFIN_ERROR:
        snprintf(c->errmsg, sizeof c->errmsg, "%s", ev->msg);
        finish_choice(g, c, "error", d);
        break;
    default: finish_choice(g, c, "abort", d); break;
    }
}

/* Handles one event of c; fills d. */
static void handle(srv_gen *g, srv_choice *c, const mk_ereq_event *ev, srv_delta *d) {
    size_t c0 = c->content.n, r0 = c->reasoning.n;
    int k0 = c->calls.n;
    memset(d, 0, sizeof *d);
    d->c = c;
    d->call_from = d->call_to = k0;
    if (ev->type == MK_EV_TOKEN) on_token(g, c, ev, d);
    else if (ev->type == MK_EV_FINISH) on_finish(g, c, ev, d);
    d->content = c->content.p ? c->content.p + c0 : "";
    d->content_len = c->content.n - c0;
    d->reasoning = c->reasoning.p ? c->reasoning.p + r0 : "";
    d->reasoning_len = c->reasoning.n - r0;
    if (d->call_to < c->calls.n) d->call_to = c->calls.n;
    if (d->call_from > k0) d->call_from = k0;
}

/* ---- public -------------------------------------------------------------------------------------- */

int srv_gen_start(mk_srv *s, srv_req *r, double t_arrive, const char *id_prefix, srv_gen **out, srv_err *e) {
    *out = NULL;
    int n_ch = r->n_prompts * r->n;
    srv_gen *g = calloc(1, sizeof *g);
    if (!g || !(g->ch = calloc((size_t)(n_ch ? n_ch : 1), sizeof *g->ch))) {
        free(g);
        return srv_fail(e, 500, NULL, "out of memory");
    }
    g->s = s;
    g->r = r;
    g->n_ch = n_ch;
    g->t_arrive = t_arrive;
    g->created = time(NULL);
    srv_rand_id(id_prefix, g->id, sizeof g->id);
    for (int p = 0; p < r->n_prompts; p++) g->prompt_tokens += r->prompts[p].n;
    pthread_mutex_lock(&s->mu);
    g->next = s->active;
    if (s->active) s->active->prev = g;
    s->active = g;
    s->n_active++;
    g->registered = 1;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_ch; i++) {
        srv_choice *c = &g->ch[i];
        c->index = i;
        c->prompt = i / r->n;
        if (choice_init(g, c, e)) goto fail;
        if (r->ftools) {
            c->fbudget = r->max_tokens;
            c->fphase = r->thinking ? F_REASON : F_OFF;
            if (!r->thinking) {
                srv_delta d;
                memset(&d, 0, sizeof d);
                int rc = fnext(g, c, &d, e);
                if (rc < 0) goto fail;
                if (rc == 1) { /* a tool without parameters: complete without the model */
                    c->finish = "tool_calls";
                    c->done = 1;
                    g->n_done++;
                    choice_metrics(g, c, "stop");
                }
                continue;
            }
        }
        if (submit(g, c, r->prompts[c->prompt].ids, r->prompts[c->prompt].n, r->max_tokens, e)) goto fail;
    }
    *out = g;
    return 0;
fail:
    /* nothing was answered yet: these never count as requests */
    for (int i = 0; i < n_ch; i++) g->ch[i].metrics_done = 1;
    srv_gen_free(g);
    return -1;
}

int srv_gen_poll(srv_gen *g, double timeout_s, srv_delta_fn fn, void *ctx) {
    int got = 0;
    double end = now_s() + timeout_s;
    for (;;) {
        for (int k = 0; k < g->n_ch; k++) {
            srv_choice *c = &g->ch[(g->rr + k) % g->n_ch];
            /* a handful of events per choice and round keeps n > 1 streams interleaved */
            for (int m = 0; m < 16 && !c->done && c->er; m++) {
                mk_ereq_event ev;
                if (!mk_ereq_next(c->er, 0, &ev)) break;
                srv_delta d;
                handle(g, c, &ev, &d);
                got++;
                if (fn && fn(ctx, g, &d)) return -1;
            }
        }
        g->rr = (g->rr + 1) % (g->n_ch ? g->n_ch : 1);
        if (got || g->n_done == g->n_ch) return got;
        double left = end - now_s();
        if (left <= 0) return 0;
        /* wait on one unfinished choice; with several, in short slices so the others are seen */
        srv_choice *w = NULL;
        int unfinished = 0;
        for (int k = 0; k < g->n_ch; k++)
            if (!g->ch[k].done && g->ch[k].er) {
                if (!w) w = &g->ch[k];
                unfinished++;
            }
        if (!w) return 0;
        double slice = unfinished > 1 && left > 0.01 ? 0.01 : left;
        mk_ereq_event ev;
        if (mk_ereq_next(w->er, slice, &ev)) {
            srv_delta d;
            handle(g, w, &ev, &d);
            got++;
            if (fn && fn(ctx, g, &d)) return -1;
        }
    }
}

int srv_client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0;
    }
    return 0;
}

int srv_gen_run(srv_gen *g, int fd) {
    while (g->n_done < g->n_ch) {
        srv_gen_poll(g, 0.1, NULL, NULL);
        if (g->n_done < g->n_ch && srv_client_gone(fd)) {
            srv_gen_cancel(g);
            return -1;
        }
    }
    return 0;
}

void srv_gen_cancel(srv_gen *g) {
    pthread_mutex_lock(&g->s->mu);
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].er) mk_ereq_cancel(g->ch[i].er);
    pthread_mutex_unlock(&g->s->mu);
}

int srv_gen_completion_tokens(const srv_gen *g) {
    int n = 0;
    for (int i = 0; i < g->n_ch; i++) n += g->ch[i].n_gen;
    return n;
}

int srv_gen_cached_tokens(const srv_gen *g) {
    int n = 0;
    pthread_mutex_lock(&g->s->mu);
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].er && g->ch[i].index % g->r->n == 0) {
            mk_ereq_info info;
            mk_ereq_get_info(g->ch[i].er, &info);
            n += info.n_cached;
        }
    pthread_mutex_unlock(&g->s->mu);
    return n;
}

void srv_gen_timing(const srv_gen *g, double *queue_s, double *ttft_s) {
    *queue_s = *ttft_s = -1;
    if (!g->n_ch) return;
    const srv_choice *c = &g->ch[0];
    if (c->t_first > 0) *ttft_s = c->t_first - g->t_arrive;
    if (c->er) {
        mk_ereq_info info;
        mk_ereq_get_info(c->er, &info);
        if (info.t_admit > 0) *queue_s = info.t_admit - info.t_submit;
    }
}

void srv_gen_free(srv_gen *g) {
    if (!g) return;
    mk_srv *s = g->s;
    pthread_mutex_lock(&s->mu);
    if (g->registered) {
        if (g->prev) g->prev->next = g->next;
        else s->active = g->next;
        if (g->next) g->next->prev = g->prev;
        s->n_active--;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < g->n_ch; i++) {
        srv_choice *c = &g->ch[i];
        if (!c->done) choice_metrics(g, c, "abort"); /* client gone, or shutdown */
        if (c->er) mk_ereq_release(c->er); /* cancels it when still running */
        mk_detok_free(c->dt);
        mk_stop_free(c->st);
        srv_split_free(c->sp);
        sb_free(&c->content);
        sb_free(&c->reasoning);
        sb_free(&c->fblock);
        sb_free(&c->fval);
        srv_calls_free(&c->calls);
        free(c->toks);
    }
    free(g->ch);
    free(g);
}
