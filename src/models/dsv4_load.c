/* dsv4_load.c — loading DeepSeek-V4-Flash: config.json validation, binding every checkpoint
 * tensor to the model with its exact dtype and shape, and `minke info`.
 *
 * Fail early: every field the model uses is read and range-checked; every tensor the model needs
 * must exist with the dtype and shape the config implies; a tensor that nothing binds is an error
 * too (it means the checkpoint and the config disagree). Messages name the file, the field or
 * tensor, and expected vs found. Weights stay in the mmap: binding only records pointers.
 */
#include "models/dsv4.h"
#include "num/formats.h"

#include <jansson.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- config.json ---------------------------------------------------------------------------- */

typedef struct {
    json_t *root;
    const char *path;
    mk_err *err;
} cfg_reader;

static int get_num(cfg_reader *r, json_t *obj, const char *key, int required, double def, double lo,
                   double hi, int integer, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return mk_fail(r->err, MK_EFORMAT, "%s: missing field '%s'", r->path, key);
        *out = def;
        return MK_OK;
    }
    if (!json_is_number(v))
        return mk_fail(r->err, MK_EFORMAT, "%s: field '%s' must be a number", r->path, key);
    double d = json_number_value(v);
    if (integer && (!json_is_integer(v) && d != floor(d)))
        return mk_fail(r->err, MK_EFORMAT, "%s: field '%s' must be an integer, found %g", r->path,
                       key, d);
    if (!(d >= lo && d <= hi))
        return mk_fail(r->err, MK_EFORMAT, "%s: field '%s' = %g is out of range [%g, %g]", r->path,
                       key, d, lo, hi);
    *out = d;
    return MK_OK;
}

#define GETI(obj, key, req, def, lo, hi, dst)                                      \
    do {                                                                           \
        double _v;                                                                 \
        int _rc = get_num(&r, obj, key, req, def, lo, hi, 1, &_v);                 \
        if (_rc) goto fail;                                                        \
        dst = (int)_v;                                                             \
    } while (0)
#define GETF(obj, key, req, def, lo, hi, dst)                                      \
    do {                                                                           \
        double _v;                                                                 \
        int _rc = get_num(&r, obj, key, req, def, lo, hi, 0, &_v);                 \
        if (_rc) goto fail;                                                        \
        dst = _v;                                                                  \
    } while (0)

static int check_str(cfg_reader *r, json_t *obj, const char *key, const char *want, int required) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return mk_fail(r->err, MK_EFORMAT, "%s: missing field '%s'", r->path, key);
        return MK_OK;
    }
    if (!json_is_string(v) || strcmp(json_string_value(v), want))
        return mk_fail(r->err, MK_ENOTSUP, "%s: field '%s' must be \"%s\", found %s", r->path, key,
                       want, json_is_string(v) ? json_string_value(v) : "a non-string");
    return MK_OK;
}

int dsv4_config_parse(const char *path, dsv4_config *c, mk_err *err) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_cannot_open_file)
            return mk_fail(err, MK_EIO, "%s: cannot open (is this a checkpoint directory?)", path);
        return mk_fail(err, MK_EFORMAT, "%s: invalid JSON at line %d column %d: %s", path, je.line,
                       je.column, je.text);
    }
    cfg_reader r = {root, path, err};
    int rc = MK_OK;
    double d;
    if (!json_is_object(root)) { rc = mk_fail(err, MK_EFORMAT, "%s: not a JSON object", path); goto out; }
    {
        json_t *mt = json_object_get(root, "model_type");
        if (!mt || !json_is_string(mt)) {
            rc = mk_fail(err, MK_EFORMAT, "%s: missing field 'model_type' (expected \"deepseek_v4\")", path);
            goto out;
        }
        if (strcmp(json_string_value(mt), "deepseek_v4")) {
            rc = mk_fail(err, MK_ENOTSUP,
                         "%s: field 'model_type' is \"%s\"; this loader supports \"deepseek_v4\"",
                         path, json_string_value(mt));
            goto out;
        }
    }
    GETI(root, "vocab_size", 1, 0, 1, 1 << 24, c->vocab);
    GETI(root, "hidden_size", 1, 0, 64, 65536, c->dim);
    GETI(root, "num_hidden_layers", 1, 0, 1, DSV4_MAX_LAYERS, c->n_layers);
    GETI(root, "num_hash_layers", 1, 0, 0, DSV4_MAX_LAYERS, c->n_hash);
    GETI(root, "num_nextn_predict_layers", 0, 0, 0, 1, c->n_mtp);
    GETI(root, "num_attention_heads", 1, 0, 1, 1024, c->n_heads);
    GETI(root, "head_dim", 1, 0, 64, 4096, c->head_dim);
    GETI(root, "qk_rope_head_dim", 1, 0, 2, 512, c->rope_dim);
    GETI(root, "q_lora_rank", 1, 0, 1, 65536, c->q_lora);
    GETI(root, "o_groups", 1, 0, 1, 1024, c->o_groups);
    GETI(root, "o_lora_rank", 1, 0, 1, 65536, c->o_lora);
    GETI(root, "moe_intermediate_size", 1, 0, 32, 65536, c->moe_inter);
    GETI(root, "n_routed_experts", 1, 0, 1, 4096, c->n_experts);
    GETI(root, "num_experts_per_tok", 1, 0, 1, 64, c->n_act);
    GETI(root, "n_shared_experts", 1, 0, 1, 1, c->n_shared);
    GETF(root, "routed_scaling_factor", 1, 0, 0, 1e6, d); c->route_scale = (float)d;
    GETF(root, "swiglu_limit", 0, 0, 0, 1e6, d); c->swiglu_limit = (float)d;
    GETI(root, "sliding_window", 1, 0, 1, 1 << 20, c->window);
    GETF(root, "rope_theta", 1, 0, 1, 1e12, c->rope_theta);
    GETF(root, "compress_rope_theta", 1, 0, 1, 1e12, c->compress_rope_theta);
    GETI(root, "index_n_heads", 1, 0, 1, 1024, c->index_heads);
    GETI(root, "index_head_dim", 1, 0, 32, 4096, c->index_head_dim);
    GETI(root, "index_topk", 1, 0, 1, 1 << 20, c->index_topk);
    GETI(root, "hc_mult", 1, 0, 1, 6, c->hc);
    GETI(root, "hc_sinkhorn_iters", 1, 0, 1, 1000, c->hc_iters);
    GETF(root, "hc_eps", 1, 0, 0, 1, d); c->hc_eps = (float)d;
    GETF(root, "rms_norm_eps", 1, 0, 0, 1, d); c->norm_eps = (float)d;
    GETI(root, "bos_token_id", 0, 0, 0, 1 << 24, c->bos);
    GETI(root, "eos_token_id", 0, 1, 0, 1 << 24, c->eos);
    if ((rc = check_str(&r, root, "scoring_func", "sqrtsoftplus", 1))) goto out;
    if ((rc = check_str(&r, root, "topk_method", "noaux_tc", 0))) goto out;
    if ((rc = check_str(&r, root, "hidden_act", "silu", 0))) goto out;
    {
        json_t *v = json_object_get(root, "num_key_value_heads");
        if (v && (!json_is_integer(v) || json_integer_value(v) != 1)) {
            rc = mk_fail(err, MK_ENOTSUP, "%s: field 'num_key_value_heads' must be 1 (V4 is MQA)", path);
            goto out;
        }
        v = json_object_get(root, "tie_word_embeddings");
        if (v && !json_is_false(v)) {
            rc = mk_fail(err, MK_ENOTSUP, "%s: field 'tie_word_embeddings' must be false", path);
            goto out;
        }
        v = json_object_get(root, "norm_topk_prob");
        if (v && !json_is_true(v)) {
            rc = mk_fail(err, MK_ENOTSUP, "%s: field 'norm_topk_prob' must be true", path);
            goto out;
        }
    }
    /* rope_scaling: YaRN for the compressed layers */
    {
        json_t *rs = json_object_get(root, "rope_scaling");
        if (!rs || !json_is_object(rs)) {
            rc = mk_fail(err, MK_EFORMAT, "%s: missing object 'rope_scaling' (YaRN parameters)", path);
            goto out;
        }
        json_t *ty = json_object_get(rs, "type");
        if (!ty) ty = json_object_get(rs, "rope_type");
        if (!ty || !json_is_string(ty) || strcmp(json_string_value(ty), "yarn")) {
            rc = mk_fail(err, MK_ENOTSUP, "%s: field 'rope_scaling.type' must be \"yarn\"", path);
            goto out;
        }
        GETF(rs, "factor", 1, 0, 1, 1e6, c->rope_factor);
        GETI(rs, "original_max_position_embeddings", 1, 0, 1, 1 << 30, c->original_seq_len);
        GETF(rs, "beta_fast", 1, 0, 0, 1e6, c->beta_fast);
        GETF(rs, "beta_slow", 1, 0, 0, 1e6, c->beta_slow);
    }
    /* compress_ratios: one per layer plus the MTP layers */
    {
        json_t *cr = json_object_get(root, "compress_ratios");
        int want = c->n_layers + c->n_mtp;
        if (!cr || !json_is_array(cr) || (int)json_array_size(cr) != want) {
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: field 'compress_ratios' must be an array of %d integers "
                         "(num_hidden_layers + num_nextn_predict_layers), found %s of %d",
                         path, want, cr && json_is_array(cr) ? "an array" : "no array",
                         cr && json_is_array(cr) ? (int)json_array_size(cr) : 0);
            goto out;
        }
        for (int i = 0; i < want; i++) {
            json_t *v = json_array_get(cr, (size_t)i);
            long long x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (x < 0 || x == 1 || x > 128 || (i >= c->n_layers && x != 0)) {
                rc = mk_fail(err, MK_EFORMAT,
                             "%s: field 'compress_ratios[%d]' must be 0 (window only), 4 (CSA) or a "
                             "ratio in [2, 128] (HCA)%s", path, i, i >= c->n_layers ? "; the MTP layer must be 0" : "");
                goto out;
            }
            c->compress_ratio[i] = (int)x;
        }
    }
    /* quantization */
    {
        json_t *q = json_object_get(root, "quantization_config");
        if (q && !json_is_null(q)) {
            if ((rc = check_str(&r, q, "quant_method", "fp8", 1))) goto out;
            if ((rc = check_str(&r, q, "fmt", "e4m3", 0))) goto out;
            if ((rc = check_str(&r, q, "scale_fmt", "ue8m0", 0))) goto out;
            json_t *b = json_object_get(q, "weight_block_size");
            if (!b || !json_is_array(b) || json_array_size(b) != 2 ||
                json_integer_value(json_array_get(b, 0)) != 128 ||
                json_integer_value(json_array_get(b, 1)) != 128) {
                rc = mk_fail(err, MK_ENOTSUP,
                             "%s: field 'quantization_config.weight_block_size' must be [128, 128]", path);
                goto out;
            }
            c->fp8 = 1;
        }
        json_t *ed = json_object_get(root, "expert_dtype");
        if (ed && !json_is_null(ed)) {
            if (!json_is_string(ed) || (strcmp(json_string_value(ed), "fp4") && strcmp(json_string_value(ed), "fp8"))) {
                rc = mk_fail(err, MK_ENOTSUP, "%s: field 'expert_dtype' must be \"fp4\" or \"fp8\"", path);
                goto out;
            }
            c->expert_fp4 = !strcmp(json_string_value(ed), "fp4");
            if (!c->fp8) {
                rc = mk_fail(err, MK_EFORMAT, "%s: 'expert_dtype' is set but 'quantization_config' is missing", path);
                goto out;
            }
        }
    }
    /* consistency: shapes the reference asserts or the quantizers need */
    {
        int nope = c->head_dim - c->rope_dim;
        if (c->rope_dim % 2 || nope <= 0 || nope % 64) {
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: head_dim (%d) - qk_rope_head_dim (%d) must be a positive multiple of 64",
                         path, c->head_dim, c->rope_dim);
            goto out;
        }
        if ((c->n_heads * c->head_dim) % c->o_groups) {
            rc = mk_fail(err, MK_EFORMAT, "%s: num_attention_heads * head_dim must be divisible by o_groups", path);
            goto out;
        }
        int ih = c->index_head_dim;
        if ((ih & (ih - 1)) || ih % 32 || ih < c->rope_dim) {
            rc = mk_fail(err, MK_EFORMAT, "%s: index_head_dim (%d) must be a power of two, a multiple of 32 and >= qk_rope_head_dim", path, ih);
            goto out;
        }
        if (c->n_act > c->n_experts) {
            rc = mk_fail(err, MK_EFORMAT, "%s: num_experts_per_tok (%d) exceeds n_routed_experts (%d)", path, c->n_act, c->n_experts);
            goto out;
        }
        if (c->n_hash > c->n_layers) {
            rc = mk_fail(err, MK_EFORMAT, "%s: num_hash_layers (%d) exceeds num_hidden_layers (%d)", path, c->n_hash, c->n_layers);
            goto out;
        }
        if (c->dim % 128 && c->fp8) {
            rc = mk_fail(err, MK_EFORMAT, "%s: hidden_size (%d) must be a multiple of 128 with FP8 weights", path, c->dim);
            goto out;
        }
        if (c->expert_fp4 && (c->dim % 32 || c->moe_inter % 32)) {
            rc = mk_fail(err, MK_EFORMAT, "%s: hidden_size and moe_intermediate_size must be multiples of 32 for FP4 experts", path);
            goto out;
        }
    }
    goto out;
fail:
    rc = err ? err->status : MK_EFORMAT;
out:
    json_decref(root);
    return rc;
}

/* ---- tensor binding ------------------------------------------------------------------------- */

static int take(dsv4_model *m, const char *name, mk_dtype dt, int ndim, const int64_t *shape,
                const void **out, mk_err *err) {
    mk_st_tensor *t = mk_st_find(m->st, name);
    if (!t) return mk_fail(err, MK_EFORMAT, "%s: missing tensor '%s'", m->dir, name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    char want[128] = "", got[128] = "";
    if (!ok || t->dtype != dt) {
        int o = 0;
        for (int i = 0; i < ndim; i++) o += snprintf(want + o, sizeof want - (size_t)o, "%s%lld", i ? ", " : "", (long long)shape[i]);
        o = 0;
        for (int i = 0; i < t->ndim; i++) o += snprintf(got + o, sizeof got - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        return mk_fail(err, MK_EFORMAT, "%s: tensor '%s' in %s: expected %s [%s], found %s [%s]",
                       m->dir, name, mk_st_file_path(m->st, t->file), mk_dtype_name(dt), want,
                       mk_dtype_name(t->dtype), got);
    }
    if (t->used) return mk_fail(err, MK_EINTERNAL, "tensor '%s' bound twice", name);
    t->used = 1;
    *out = t->data;
    /* safetensors only aligns data when the writer pads its header; a misaligned f32/i64/bf16
     * tensor is copied once to aligned memory (typed loads from it would be undefined). */
    size_t es = mk_dtype_size(dt);
    if (es > 1 && ((uintptr_t)t->data % es) != 0) {
        if (m->n_owned == m->cap_owned) {
            int nc = m->cap_owned ? 2 * m->cap_owned : 64;
            void **no = realloc(m->owned, sizeof(void *) * (size_t)nc);
            if (!no) return mk_fail(err, MK_ENOMEM, "out of memory");
            m->owned = no;
            m->cap_owned = nc;
        }
        void *cp = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
        if (!cp) return mk_fail(err, MK_ENOMEM, "out of memory copying tensor '%s'", name);
        memcpy(cp, t->data, t->nbytes);
        m->owned[m->n_owned++] = cp;
        m->owned_bytes += t->nbytes;
        *out = cp;
    }
    return MK_OK;
}

static int take1(dsv4_model *m, const char *name, mk_dtype dt, int64_t n0, const void **out, mk_err *err) {
    int64_t s[1] = {n0};
    return take(m, name, dt, 1, s, out, err);
}
static int take2(dsv4_model *m, const char *name, mk_dtype dt, int64_t n0, int64_t n1, const void **out, mk_err *err) {
    int64_t s[2] = {n0, n1};
    return take(m, name, dt, 2, s, out, err);
}

/* A linear layer `prefix`.weight (+ .scale) of logical shape [n, k] in the given kind. */
static int bind_linear(dsv4_model *m, const char *prefix, int n, int k, mk_wkind kind, mk_wmat *W, mk_err *err) {
    char nm[256];
    const void *p;
    int rc;
    W->kind = kind; W->n = n; W->k = k; W->scale = NULL;
    snprintf(nm, sizeof nm, "%s.weight", prefix);
    switch (kind) {
    case MK_W_BF16: return take2(m, nm, MK_DT_BF16, n, k, &W->w, err);
    case MK_W_F32: return take2(m, nm, MK_DT_F32, n, k, &W->w, err);
    case MK_W_FP8:
        if ((rc = take2(m, nm, MK_DT_F8_E4M3, n, k, &W->w, err))) return rc;
        snprintf(nm, sizeof nm, "%s.scale", prefix);
        if ((rc = take2(m, nm, MK_DT_F8_E8M0, (n + 127) / 128, (k + 127) / 128, &p, err))) return rc;
        W->scale = p;
        return MK_OK;
    case MK_W_FP4:
        if ((rc = take2(m, nm, MK_DT_I8, n, k / 2, &W->w, err))) return rc;
        snprintf(nm, sizeof nm, "%s.scale", prefix);
        if ((rc = take2(m, nm, MK_DT_F8_E8M0, n, k / 32, &p, err))) return rc;
        W->scale = p;
        return MK_OK;
    case MK_W_FP8_DQ: break;
    }
    return MK_EINTERNAL;
}

#define TRY(x) do { int _rc = (x); if (_rc) return _rc; } while (0)

static int bind_compressor(dsv4_model *m, const char *prefix, int ratio, int D, dsv4_compressor *c, mk_err *err) {
    const dsv4_config *cfg = &m->cfg;
    char nm[256];
    c->ratio = ratio; c->coff = ratio == 4 ? 2 : 1; c->D = D;
    snprintf(nm, sizeof nm, "%s.wkv", prefix);
    TRY(bind_linear(m, nm, c->coff * D, cfg->dim, MK_W_BF16, &c->wkv, err));
    snprintf(nm, sizeof nm, "%s.wgate", prefix);
    TRY(bind_linear(m, nm, c->coff * D, cfg->dim, MK_W_BF16, &c->wgate, err));
    snprintf(nm, sizeof nm, "%s.ape", prefix);
    TRY(take2(m, nm, MK_DT_F32, ratio, c->coff * D, (const void **)&c->ape, err));
    snprintf(nm, sizeof nm, "%s.norm.weight", prefix);
    TRY(take1(m, nm, MK_DT_BF16, D, (const void **)&c->norm, err));
    return MK_OK;
}

static int bind_expert(dsv4_model *m, const char *prefix, mk_wkind kind, dsv4_expert *e, mk_err *err) {
    const dsv4_config *c = &m->cfg;
    char nm[256];
    snprintf(nm, sizeof nm, "%s.w1", prefix);
    TRY(bind_linear(m, nm, c->moe_inter, c->dim, kind, &e->w1, err));
    snprintf(nm, sizeof nm, "%s.w2", prefix);
    TRY(bind_linear(m, nm, c->dim, c->moe_inter, kind, &e->w2, err));
    snprintf(nm, sizeof nm, "%s.w3", prefix);
    TRY(bind_linear(m, nm, c->moe_inter, c->dim, kind, &e->w3, err));
    return MK_OK;
}

static int bind_layer(dsv4_model *m, const char *pfx, int layer_id, dsv4_layer *L, mk_err *err) {
    const dsv4_config *c = &m->cfg;
    char nm[320];
    mk_wkind lin = c->fp8 ? MK_W_FP8 : MK_W_BF16;
    mk_wkind ek = c->fp8 ? (c->expert_fp4 ? MK_W_FP4 : MK_W_FP8) : MK_W_BF16;
    int hcd = c->hc * c->dim, nmix = (2 + c->hc) * c->hc;
    L->ratio = c->compress_ratio[layer_id];
    L->rope = L->ratio ? &m->rope_yarn : &m->rope_plain;
#define NM(fmt, ...) (snprintf(nm, sizeof nm, "%s." fmt, pfx, ##__VA_ARGS__), nm)
    TRY(take1(m, NM("attn_norm.weight"), MK_DT_BF16, c->dim, (const void **)&L->attn_norm, err));
    TRY(take1(m, NM("ffn_norm.weight"), MK_DT_BF16, c->dim, (const void **)&L->ffn_norm, err));
    TRY(take2(m, NM("hc_attn_fn"), MK_DT_F32, nmix, hcd, (const void **)&L->hc_attn_fn, err));
    TRY(take1(m, NM("hc_attn_base"), MK_DT_F32, nmix, (const void **)&L->hc_attn_base, err));
    TRY(take1(m, NM("hc_attn_scale"), MK_DT_F32, 3, (const void **)&L->hc_attn_scale, err));
    TRY(take2(m, NM("hc_ffn_fn"), MK_DT_F32, nmix, hcd, (const void **)&L->hc_ffn_fn, err));
    TRY(take1(m, NM("hc_ffn_base"), MK_DT_F32, nmix, (const void **)&L->hc_ffn_base, err));
    TRY(take1(m, NM("hc_ffn_scale"), MK_DT_F32, 3, (const void **)&L->hc_ffn_scale, err));
    /* attention */
    int HD = c->n_heads * c->head_dim;
    TRY(bind_linear(m, NM("attn.wq_a"), c->q_lora, c->dim, lin, &L->wq_a, err));
    TRY(take1(m, NM("attn.q_norm.weight"), MK_DT_BF16, c->q_lora, (const void **)&L->q_norm, err));
    TRY(bind_linear(m, NM("attn.wq_b"), HD, c->q_lora, lin, &L->wq_b, err));
    TRY(bind_linear(m, NM("attn.wkv"), c->head_dim, c->dim, lin, &L->wkv, err));
    TRY(take1(m, NM("attn.kv_norm.weight"), MK_DT_BF16, c->head_dim, (const void **)&L->kv_norm, err));
    /* wo_a: FP8 in the checkpoint; convert.py dequantizes it to bf16, so it is used with exact
     * dequantized values and no activation quantization. */
    TRY(bind_linear(m, NM("attn.wo_a"), c->o_groups * c->o_lora, HD / c->o_groups, lin, &L->wo_a, err));
    if (L->wo_a.kind == MK_W_FP8) {
        L->wo_a.kind = MK_W_FP8_DQ;
        if (c->o_lora % 128) return mk_fail(err, MK_EFORMAT, "%s: o_lora_rank (%d) must be a multiple of 128 with FP8 weights", m->dir, c->o_lora);
    }
    TRY(bind_linear(m, NM("attn.wo_b"), c->dim, c->o_groups * c->o_lora, lin, &L->wo_b, err));
    TRY(take1(m, NM("attn.attn_sink"), MK_DT_F32, c->n_heads, (const void **)&L->attn_sink, err));
    if (L->ratio) {
        TRY(bind_compressor(m, NM("attn.compressor"), L->ratio, c->head_dim, &L->cmp, err));
        if (L->ratio == 4) {
            TRY(bind_compressor(m, NM("attn.indexer.compressor"), 4, c->index_head_dim, &L->idx_cmp, err));
            TRY(bind_linear(m, NM("attn.indexer.wq_b"), c->index_heads * c->index_head_dim, c->q_lora, lin, &L->idx_wq_b, err));
            TRY(bind_linear(m, NM("attn.indexer.weights_proj"), c->index_heads, c->dim, MK_W_BF16, &L->idx_wproj, err));
        }
    }
    /* MoE */
    TRY(bind_linear(m, NM("ffn.gate"), c->n_experts, c->dim, MK_W_BF16, &L->gate, err));
    if (layer_id < c->n_hash) {
        TRY(take2(m, NM("ffn.gate.tid2eid"), MK_DT_I64, c->vocab, c->n_act, (const void **)&L->tid2eid, err));
        for (int64_t i = 0; i < (int64_t)c->vocab * c->n_act; i++)
            if (L->tid2eid[i] < 0 || L->tid2eid[i] >= c->n_experts)
                return mk_fail(err, MK_EFORMAT, "%s: tensor '%s.ffn.gate.tid2eid' holds expert id %lld at row %lld; expected 0..%d",
                               m->dir, pfx, (long long)L->tid2eid[i], (long long)(i / c->n_act), c->n_experts - 1);
    } else {
        TRY(take1(m, NM("ffn.gate.bias"), MK_DT_F32, c->n_experts, (const void **)&L->gate_bias, err));
    }
    TRY(bind_expert(m, NM("ffn.shared_experts"), lin, &L->shared, err));
    L->experts = calloc((size_t)c->n_experts, sizeof *L->experts);
    if (!L->experts) return mk_fail(err, MK_ENOMEM, "out of memory");
    for (int e = 0; e < c->n_experts; e++) TRY(bind_expert(m, NM("ffn.experts.%d", e), ek, &L->experts[e], err));
    return MK_OK;
#undef NM
}

int dsv4_bind(dsv4_model *m, mk_err *err) {
    const dsv4_config *c = &m->cfg;
    mk_wkind lin = c->fp8 ? MK_W_FP8 : MK_W_BF16;
    int hcd = c->hc * c->dim;
    TRY(take2(m, "embed.weight", MK_DT_BF16, c->vocab, c->dim, (const void **)&m->embed, err));
    TRY(bind_linear(m, "head", c->vocab, c->dim, MK_W_BF16, &m->head, err));
    TRY(take1(m, "norm.weight", MK_DT_BF16, c->dim, (const void **)&m->norm, err));
    TRY(take2(m, "hc_head_fn", MK_DT_F32, c->hc, hcd, (const void **)&m->hc_head_fn, err));
    TRY(take1(m, "hc_head_base", MK_DT_F32, c->hc, (const void **)&m->hc_head_base, err));
    TRY(take1(m, "hc_head_scale", MK_DT_F32, 1, (const void **)&m->hc_head_scale, err));
    for (int l = 0; l < c->n_layers; l++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "layers.%d", l);
        TRY(bind_layer(m, pfx, l, &m->layers[l], err));
    }
    if (c->n_mtp) {
        dsv4_layer *L = &m->mtp;
        TRY(bind_layer(m, "mtp.0", c->n_layers, L, err));
        TRY(bind_linear(m, "mtp.0.e_proj", c->dim, c->dim, lin, &L->e_proj, err));
        TRY(bind_linear(m, "mtp.0.h_proj", c->dim, c->dim, lin, &L->h_proj, err));
        TRY(take1(m, "mtp.0.enorm.weight", MK_DT_BF16, c->dim, (const void **)&L->enorm, err));
        TRY(take1(m, "mtp.0.hnorm.weight", MK_DT_BF16, c->dim, (const void **)&L->hnorm, err));
        TRY(take1(m, "mtp.0.norm.weight", MK_DT_BF16, c->dim, (const void **)&L->norm, err));
        TRY(take2(m, "mtp.0.hc_head_fn", MK_DT_F32, c->hc, hcd, (const void **)&L->hc_head_fn, err));
        TRY(take1(m, "mtp.0.hc_head_base", MK_DT_F32, c->hc, (const void **)&L->hc_head_base, err));
        TRY(take1(m, "mtp.0.hc_head_scale", MK_DT_F32, 1, (const void **)&L->hc_head_scale, err));
    }
    /* Anything left unbound means config and checkpoint disagree. */
    for (size_t i = 0; i < mk_st_count(m->st); i++) {
        mk_st_tensor *t = mk_st_at(m->st, i);
        if (!t->used)
            return mk_fail(err, MK_EFORMAT, "%s: unexpected tensor '%s' in %s (not part of a deepseek_v4 model with this config.json)",
                           m->dir, t->name, mk_st_file_path(m->st, t->file));
    }
    return MK_OK;
}

/* ---- model lifecycle ------------------------------------------------------------------------ */

static void free_layer(dsv4_layer *L) { free(L->experts); L->experts = NULL; }

void dsv4_model_free(dsv4_model *m) {
    if (!m) return;
    for (int l = 0; l < DSV4_MAX_LAYERS; l++) free_layer(&m->layers[l]);
    free_layer(&m->mtp);
    mk_rope_table_free(&m->rope_plain);
    mk_rope_table_free(&m->rope_yarn);
    mk_pool_free(m->pool);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    mk_st_close(m->st);
    free(m);
}

int dsv4_model_load(const char *dir, const mk_model_options *opt, dsv4_model **out, mk_err *err) {
    *out = NULL;
    mk_num_init();
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = dsv4_config_parse(path, &m->cfg, err);
    if (rc) goto fail;
    if ((rc = mk_st_open(dir, &m->st, err))) goto fail;
    m->max_seq_len = opt && opt->max_seq_len > 0 ? opt->max_seq_len : 4096;
    const dsv4_config *c = &m->cfg;
    if ((rc = mk_rope_table_init(&m->rope_plain, m->max_seq_len, c->rope_dim, c->rope_theta, 0, 1, 1, 1)) ||
        (rc = mk_rope_table_init(&m->rope_yarn, m->max_seq_len, c->rope_dim, c->compress_rope_theta,
                                 c->original_seq_len, c->rope_factor, c->beta_fast, c->beta_slow))) {
        rc = mk_fail(err, MK_ENOMEM, "out of memory for RoPE tables");
        goto fail;
    }
    if ((rc = dsv4_bind(m, err))) goto fail;
    if (m->owned_bytes)
        mk_log(MK_LOG_INFO, "%s: %d tensors (%.1f MiB) are misaligned in the file and were copied", dir,
               m->n_owned, m->owned_bytes / 1048576.0);
    m->pool = mk_pool_create(opt ? opt->n_threads : 0);
    if (!m->pool) { rc = mk_fail(err, MK_ENOMEM, "cannot create thread pool"); goto fail; }
    *out = m;
    return MK_OK;
fail:
    dsv4_model_free(m);
    return rc;
}

int dsv4_model_vocab_size(const dsv4_model *m) { return m->cfg.vocab; }

void dsv4_model_print_info(const dsv4_model *m, void *fp) {
    FILE *f = fp;
    const dsv4_config *c = &m->cfg;
    fprintf(f, "model: %s\n", m->dir);
    fprintf(f, "architecture: deepseek_v4 (DeepSeek-V4-Flash family)\n");
    fprintf(f, "  hidden %d, vocab %d, layers %d (+%d MTP), hash-routed layers %d\n", c->dim, c->vocab, c->n_layers, c->n_mtp, c->n_hash);
    fprintf(f, "  attention: %d heads x %d (rope %d), MQA K=V, q_lora %d, output %d groups x %d, window %d\n",
            c->n_heads, c->head_dim, c->rope_dim, c->q_lora, c->o_groups, c->o_lora, c->window);
    fprintf(f, "  indexer: %d heads x %d, top-%d\n", c->index_heads, c->index_head_dim, c->index_topk);
    fprintf(f, "  MoE: %d routed experts (top-%d, route scale %g, swiglu limit %g) + %d shared, inter %d\n",
            c->n_experts, c->n_act, c->route_scale, c->swiglu_limit, c->n_shared, c->moe_inter);
    fprintf(f, "  hyper-connections: %d streams, %d Sinkhorn iterations\n", c->hc, c->hc_iters);
    fprintf(f, "  weights: %s%s\n", c->fp8 ? "FP8 E4M3 (128x128 e8m0 scales)" : "BF16",
            c->fp8 ? (c->expert_fp4 ? ", routed experts FP4 E2M1 (per-32 e8m0 scales)" : ", routed experts FP8") : "");
    fprintf(f, "  layer types:");
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l];
        fprintf(f, " %s", r == 0 ? "SWA" : r == 4 ? "CSA" : "HCA");
    }
    fprintf(f, "\n");
    /* parameter counts and bytes by dtype */
    int64_t cnt[16] = {0};
    size_t bytes[16] = {0};
    for (size_t i = 0; i < mk_st_count(m->st); i++) {
        mk_st_tensor *t = mk_st_at((mk_st *)m->st, i);
        int64_t n = t->numel;
        if (t->dtype == MK_DT_I8 && strstr(t->name, ".experts.")) n *= 2; /* packed FP4 */
        cnt[t->dtype] += n;
        bytes[t->dtype] += t->nbytes;
    }
    fprintf(f, "parameters by dtype:\n");
    int64_t total = 0;
    size_t tb = 0;
    for (int d = 0; d < 16; d++) {
        if (!cnt[d]) continue;
        fprintf(f, "  %-8s %15lld params %12.3f MiB%s\n", d == MK_DT_I8 ? "FP4(I8)" : mk_dtype_name((mk_dtype)d),
                (long long)cnt[d], bytes[d] / 1048576.0, d == MK_DT_I64 ? " (hash routing table)" : "");
        if (d != MK_DT_I64 && d != MK_DT_F8_E8M0) total += cnt[d];
        tb += bytes[d];
    }
    fprintf(f, "  total    %15lld params (excluding scales and routing tables)\n", (long long)total);
    /* KV state per sequence (fp32 as this CPU engine holds it) */
    size_t per_tok = 0, fixed = 0;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l];
        fixed += (size_t)c->window * c->head_dim * 4;
        if (r) {
            int coff = r == 4 ? 2 : 1;
            fixed += 2 * (size_t)coff * r * coff * c->head_dim * 4;
            if (r == 4) fixed += 2 * 8 * 2 * (size_t)c->index_head_dim * 4;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        int r = c->compress_ratio[l];
        if (r) per_tok += (size_t)c->head_dim * 4 * 1000 / r;
        if (r == 4) per_tok += (size_t)c->index_head_dim * 4 * 1000 / r;
    }
    fprintf(f, "memory:\n  weights (mmapped)  %.3f GiB\n", tb / 1073741824.0);
    fprintf(f, "  per sequence: %.2f MiB fixed (windows, compressor state) + %.1f bytes/token (compressed KV, fp32)\n",
            fixed / 1048576.0, per_tok / 1000.0);
    fprintf(f, "  at max_seq_len %d: %.3f GiB per sequence\n", m->max_seq_len,
            (fixed + per_tok * (size_t)m->max_seq_len / 1000) / 1073741824.0);
}
