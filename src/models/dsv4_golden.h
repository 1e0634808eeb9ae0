/* dsv4_golden.h — replaying DeepSeek's reference decisions from a golden file.
 *
 * A golden file (tests/data/dsv4/<case>/golden.safetensors, written by the reference harness)
 * records, per prompt p<j>, the tokens fed, the call pattern, the fp32 logits of every call, the
 * mHC stream after every layer, the experts chosen per token and layer (with their margins) and
 * the indexer's selections. Tiny random models have near-ties in these discrete decisions, so
 * minke checks its arithmetic in "forced" mode: a dsv4_hooks set that replaces minke's own
 * choices by the reference's for the same call and layer (routing weights stay minke's). In
 * "natural" mode the same hooks only compare and record the first decision that differs.
 * Used by `minke logits --force-decisions` and the golden tests.
 */
#ifndef MK_MODELS_DSV4_GOLDEN_H
#define MK_MODELS_DSV4_GOLDEN_H

#include "models/dsv4.h"

typedef struct dsv4_golden dsv4_golden;

/* The first decision that differed from the reference (natural mode). */
typedef struct {
    int found;
    int call, layer, token;
    int is_indexer;
    float margin;      /* gate flips: the reference's gate margin at that token-layer;
                          indexer flips: minke's score gap at the top-k boundary between its
                          choice and the reference's, relative to the row's max |score| */
    int near_tie;      /* indexer flip where that gap is within 1 bf16 ulp */
} dsv4_flip;

/* Open prompt j of a golden file. n_layers: of the model (to size the tables). */
int dsv4_golden_open(const char *path, int prompt, int n_layers, dsv4_golden **out, mk_err *err);
void dsv4_golden_free(dsv4_golden *g);
/* Find the prompt whose fed tokens start with tokens[0..n) (-1 if none). */
int dsv4_golden_find_prompt(const char *path, const int32_t *tokens, int n, mk_err *err);

int dsv4_golden_n_calls(const dsv4_golden *g);
int dsv4_golden_prompt_len(const dsv4_golden *g);
int dsv4_golden_start_pos(const dsv4_golden *g, int call);
int dsv4_golden_n_tokens(const dsv4_golden *g, int call);
const int64_t *dsv4_golden_tokens(const dsv4_golden *g, int *n);
const float *dsv4_golden_logits(const dsv4_golden *g, int call, int *vocab);
/* h after layer l in call c: [n_tokens(c), hc, dim] f32. */
const float *dsv4_golden_h(const dsv4_golden *g, int call, int layer);
const int64_t *dsv4_golden_mtp_ids(const dsv4_golden *g, int *n);
const float *dsv4_golden_mtp_logits(const dsv4_golden *g);

/* Hooks: force = 1 replaces decisions with the reference's; 0 only compares. The caller sets
 * the current call index before each forward call. */
void dsv4_golden_hooks(dsv4_golden *g, int force, dsv4_hooks *h);
void dsv4_golden_set_call(dsv4_golden *g, int call);
/* The model's sliding window (decode offsets of the recorded indexer selections). */
void dsv4_golden_set_window(dsv4_golden *g, int window);
const dsv4_flip *dsv4_golden_first_flip(const dsv4_golden *g);
/* Decisions minke made that differed from the reference's while forced (for information). */
int dsv4_golden_forced_overrides(const dsv4_golden *g);

#endif
