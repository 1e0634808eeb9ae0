/* tokenizer.h — Hugging Face tokenizer.json tokenizers (BPE) and the streaming detokenizer.
 *
 * mk_tok loads a tokenizer.json as the HF `tokenizers` library writes it and encodes/decodes with
 * the same ids and text as that library (the oracle our tests compare against). The pipeline is
 * HF's: added tokens are cut out of the raw text first (those with normalized=false), then each
 * remaining piece is normalized, added tokens with normalized=true are cut out of the normalized
 * text, the rest is pre-tokenized into words and each word goes through the BPE model. With
 * add_special, the post-processor's ids (BOS/EOS of a TemplateProcessing, cls/sep of Roberta/
 * Bert processing) are put around the result. mk_tok_load_gguf builds the same object from GGUF
 * tokenizer metadata, following llama.cpp (its oracle) instead of HF where the two differ.
 *
 * Supported (anything else is a load error naming the type or field):
 *   model:          BPE (merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk,
 *                   byte_fallback, continuing_subword_prefix, end_of_word_suffix, ignore_merges;
 *                   dropout must be null or 0)
 *   normalizer:     NFC, NFD, NFKC, NFKD, Lowercase, Replace (String or Regex), Prepend, Strip,
 *                   Sequence, null
 *   pre_tokenizer:  ByteLevel (add_prefix_space, use_regex; must be the last one), Split (String or
 *                   Regex pattern, all five behaviors, invert), Digits, Sequence, null
 *   post_processor: TemplateProcessing (single template), ByteLevel, RobertaProcessing,
 *                   BertProcessing, Sequence, null
 *   decoder:        ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence, null (tokens joined
 *                   with spaces, as HF does)
 *   added tokens:   matched leftmost-longest before BPE; lstrip, rstrip, single_word, normalized
 *                   honoured; `special` drives skip_special in decoding.
 * Regexes are compiled with PCRE2 (UTF + UCP, JIT); HF uses Oniguruma, whose syntax these patterns
 * share. Normalization uses utf8proc.
 *
 * Thread-safety: an mk_tok is immutable after load and may be used by many threads at once (per-
 * call scratch comes from an internal pool guarded by a mutex). An mk_detok belongs to one thread.
 *
 * Input text must be valid UTF-8 (as HF requires of Python str); invalid input is MK_EINVAL
 * naming the byte offset.
 */
#ifndef MK_TEXT_TOKENIZER_H
#define MK_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "minke.h"

typedef struct mk_tok mk_tok;

/* Load a tokenizer.json file, or a directory containing one. A tokenizer_config.json next to it,
 * if present, is read only for its bos_token (see mk_tok_bos_id). */
int mk_tok_load(const char *path, mk_tok **out, mk_err *err);

/* Build the tokenizer described by a GGUF file's tokenizer.ggml.* metadata, tokenizing as
 * llama.cpp does (the oracle tests/tokenizer/gguf_vs_llamacpp.py compares against):
 *   tokenizer.ggml.model       must be "gpt2" (byte-level BPE); "llama" (SentencePiece) and the
 *                              others are MK_ENOTSUP naming the key and value
 *   tokenizer.ggml.tokens      the vocab (string array; id = index; duplicates are an error)
 *   tokenizer.ggml.merges      "a b" strings, rank = index (a repeated pair keeps its first rank)
 *   tokenizer.ggml.token_type  1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte:
 *                              control, unknown and user-defined tokens become added tokens cut
 *                              out of the text before BPE (control and unknown ones special)
 *   tokenizer.ggml.pre         the pre-tokenizer, mapped to llama.cpp's regexes (see tok_gguf.c
 *                              for the names; an unknown name is MK_ENOTSUP naming it)
 *   tokenizer.ggml.{bos,eos}_token_id, add_bos_token, add_eos_token: with add_special, encode
 *                              puts BOS / EOS around the text when the flags say so (defaults as
 *                              llama.cpp's: add BOS for the llama3 and tekken pre-tokenizers)
 * The mk_tok does not keep g; g may be closed afterwards. */
typedef struct mk_gguf mk_gguf;
int mk_tok_load_gguf(const mk_gguf *g, mk_tok **out, mk_err *err);
void mk_tok_free(mk_tok *t);

/* Number of ids, including added tokens: max id + 1. */
int mk_tok_vocab_size(const mk_tok *t);

/* Encode len bytes of UTF-8 text. *ids is malloc'd (free() it; may be NULL when *n == 0).
 * add_special applies the post-processor (e.g. a TemplateProcessing BOS). */
int mk_tok_encode(const mk_tok *t, const char *text, size_t len, int add_special, int32_t **ids,
                  size_t *n, mk_err *err);

/* Decode ids to text (*out malloc'd, NUL-terminated, *len bytes without the NUL). Unknown ids are
 * skipped, as HF does; skip_special drops added tokens marked special. Invalid UTF-8 produced by
 * byte-level tokens becomes U+FFFD (one per maximal invalid subpart, as Rust's from_utf8_lossy). */
int mk_tok_decode(const mk_tok *t, const int32_t *ids, size_t n, int skip_special, char **out,
                  size_t *len, mk_err *err);

int mk_tok_token_to_id(const mk_tok *t, const char *token); /* -1 if absent */
const char *mk_tok_id_to_token(const mk_tok *t, int id);     /* NULL if out of range or a hole */
int mk_tok_is_special(const mk_tok *t, int id);              /* an added token with special=true */
/* The BOS id: the first id the post-processor puts before the text, else tokenizer_config.json's
 * bos_token (e.g. DeepSeek, whose tokenizer.json adds nothing), else -1. From a GGUF:
 * tokenizer.ggml.bos_token_id (whether or not add_bos_token is set), else -1. */
int mk_tok_bos_id(const mk_tok *t);
/* The EOS id: GGUF tokenizer.ggml.eos_token_id; -1 when absent or loaded from tokenizer.json. */
int mk_tok_eos_id(const mk_tok *t);

/* Streaming detokenizer: feed ids one at a time, get text only once it forms complete UTF-8
 * (a character split over several byte-level tokens is emitted when its last byte arrives). It
 * follows HF's DecodeStream: decode a short window of recent ids and emit what grew past the
 * previous window's text, so the concatenated output equals mk_tok_decode of all ids.
 * Known limit (shared with HF): while the text ends in U+FFFD (an incomplete character, or a real
 * U+FFFD the model produced) nothing is emitted and the window grows, so a long run of such ids
 * costs time quadratic in its length until a clean character or flush ends it. */
typedef struct mk_detok mk_detok;
int mk_detok_create(const mk_tok *t, int skip_special, mk_detok **out, mk_err *err);
/* Feed one id. *text and *len receive the newly completed text (possibly empty), in a buffer owned by
 * the detok and valid until the next call. */
int mk_detok_push(mk_detok *d, int32_t id, const char **text, size_t *len);
/* Emit what remains (incomplete UTF-8 becomes U+FFFD, as HF does) and reset the stream. */
int mk_detok_flush(mk_detok *d, const char **text, size_t *len);
void mk_detok_reset(mk_detok *d);
void mk_detok_free(mk_detok *d);

#endif
