/* tok_internal.h — the inside of mk_tok, shared by the tokenizer's files (not a public header).
 *
 *   tokenizer.c  loading tokenizer.json, the public API, the encode pipeline
 *   tok_util.c   UTF-8 helpers, string hash map, growable buffers, regexes (PCRE2 JIT)
 *   normalize.c  normalizers (utf8proc) and added-token matching
 *   bpe.c        the BPE model: merge map, word merge, per-scratch word cache
 *   detok.c      decoders, mk_tok_decode and the streaming detokenizer
 *   tok_gguf.c   building an mk_tok from GGUF tokenizer metadata (llama.cpp's conventions)
 *
 * Invariants: after mk_tok_load returns, everything in mk_tok is read-only except the scratch
 * free list (guarded by `lock`). Every text handed between stages is valid UTF-8 (checked once at
 * the API boundary; normalizers and splits keep it valid), so PCRE2 runs with NO_UTF_CHECK.
 */
#ifndef MK_TEXT_TOK_INTERNAL_H
#define MK_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/status.h"
#include "text/tokenizer.h"

/* ---- growable byte buffer and typed vectors ---------------------------------------------- */
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra); /* room for `extra` more bytes (+1 for a NUL) */
int tok_buf_put(tok_buf *b, const void *s, size_t n);
int tok_buf_putc(tok_buf *b, int c);
int tok_buf_put_cp(tok_buf *b, uint32_t cp); /* append the UTF-8 encoding of a code point */

typedef struct {
    int32_t *p;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *v, int32_t id);
int tok_ids_put(tok_ids *v, const int32_t *ids, size_t n);

/* A piece of a string: [s, e) and whether it is a pattern match (find_matches of HF). */
typedef struct {
    uint32_t s, e;
    int32_t tag; /* match flag for splits; token id (or -1) for added-token pieces */
} tok_span;
typedef struct {
    tok_span *p;
    size_t n, cap;
} tok_spans;
int tok_spans_push(tok_spans *v, uint32_t s, uint32_t e, int32_t tag);

/* ---- UTF-8 --------------------------------------------------------------------------------- */
/* Offset of the first invalid byte, or len when all of s is valid UTF-8 (Rust's str rules). */
size_t tok_utf8_check(const char *s, size_t len);
/* Decode the code point at s (valid UTF-8 assumed); returns its length in bytes. */
int tok_utf8_next(const char *s, uint32_t *cp);
/* Append s as text, replacing invalid sequences with U+FFFD per maximal subpart (from_utf8_lossy). */
int tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
int tok_is_whitespace(uint32_t cp); /* Rust char::is_whitespace (Unicode White_Space) */
int tok_is_word_char(uint32_t cp);  /* regex \w as Rust's regex crate sees it (for single_word) */

/* ---- string -> int32 map (open addressing, linear probing) ---------------------------------- */
typedef struct {
    uint32_t off, len; /* the key in pool (NUL-terminated there) */
    uint32_t hash;
    int32_t val;
} tok_smap_ent;
typedef struct {
    uint32_t *slot; /* entry index + 1; 0 = empty */
    size_t mask;
    tok_smap_ent *ent;
    size_t n, cap;
    tok_buf pool;
} tok_smap;
uint64_t tok_hash(const void *p, size_t n);
int tok_smap_put(tok_smap *m, const char *k, size_t n, int32_t val); /* insert or overwrite */
int32_t tok_smap_get(const tok_smap *m, const char *k, size_t n);     /* -1 if absent */
void tok_smap_free(tok_smap *m);

/* ---- regex (PCRE2, JIT) ----------------------------------------------------------------------- */
typedef struct {
    pcre2_code *code; /* NULL = no regex */
    int jit;          /* JIT compiled */
} tok_re;
/* Compile `pat` (literal when `literal`). `what` names the config field for the error message. */
int tok_re_compile(tok_re *re, const char *pat, size_t n, int literal, const char *what, mk_err *err);
void tok_re_free(tok_re *re);

/* ---- per-call scratch ------------------------------------------------------------------------- */
#define TOK_MAX_STAGES 16
typedef struct tok_cache tok_cache;
typedef struct tok_scratch {
    struct tok_scratch *next;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    tok_buf norm[3];                    /* normalizer ping-pong buffers + result */
    tok_spans raw_pieces, norm_pieces;  /* added-token splits of the raw / normalized text */
    tok_spans stage_spans[TOK_MAX_STAGES];
    tok_buf stage_buf[TOK_MAX_STAGES];  /* text a stage rewrote (ByteLevel prefix space) */
    tok_spans matches;                  /* regex matches (find_iter) */
    tok_buf word;                       /* a word's mapped string (ignore_merges, prefixes) */
    /* BPE word state: symbols and the merge heap */
    struct tok_sym *sym;
    size_t sym_cap;
    struct tok_merge *heap;
    size_t heap_cap;
    tok_cache *cache;
} tok_scratch;

/* Scratch from the tokenizer's pool (NULL when out of memory); give it back after the call. */
tok_scratch *tok_scratch_get(const mk_tok *t);
void tok_scratch_put(const mk_tok *t, tok_scratch *sc);

/* Regex find_iter with Oniguruma's empty-match rule, then HF's find_matches: the whole of
 * [0, n) as alternating gap (tag 0) / match (tag 1) spans. `out` is cleared first. */
int tok_re_find_matches(const tok_re *re, tok_scratch *sc, const char *s, size_t n, tok_spans *out,
                        mk_err *err);

/* ---- normalizers --------------------------------------------------------------------------- */
enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_REPLACE, NORM_PREPEND, NORM_STRIP };
typedef struct {
    int kind;
    tok_re re;       /* Replace: the pattern */
    char *content;   /* Replace: replacement; Prepend: the prefix */
    size_t content_len;
    int left, right; /* Strip */
} tok_norm;

/* ---- added tokens ---------------------------------------------------------------------------- */
typedef struct {
    char *content;
    size_t len;
    char *ncontent; /* normalized=true: the content normalized, which HF also uses as the token's
                       text (id_to_token, decode); else NULL */
    size_t nlen;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* Byte trie for leftmost-longest matching (aho-corasick's LeftmostLongest, done naively). */
typedef struct {
    int32_t first, sibling; /* child list */
    int32_t match;          /* index into mk_tok.added, -1 if no pattern ends here */
    uint8_t byte;
} tok_trie_node;
typedef struct {
    tok_trie_node *node;
    size_t n, cap;
    int32_t root_child[256]; /* fast first step */
    int n_patterns;
} tok_trie;

/* ---- pre-tokenizer stages -------------------------------------------------------------------- */
/* ST_BYTE_BARRIER (GGUF tokenizers only, byte-level): cut a word around every byte that has no
 * token and drop that byte. llama.cpp keeps such a byte as a symbol that never merges and drops it
 * at the end, so its neighbours stay apart; HF (and tok_bpe_word) drop it before merging. */
enum { ST_SPLIT, ST_PREFIX_SPACE, ST_BYTE_BARRIER };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
typedef struct {
    int kind;
    tok_re re;
    int behavior, invert;
} tok_stage;

/* ---- decoders ---------------------------------------------------------------------------------- */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };
typedef struct {
    int kind;
    tok_re re;     /* Replace */
    char *content; /* Replace: replacement; Strip: the character (UTF-8) */
    size_t content_len;
    int start, stop; /* Strip */
} tok_dec;

struct mk_tok {
    char *path;
    /* model (BPE) */
    tok_smap vocab;
    struct tok_mmap *merges;
    int32_t unk_id; /* -1: no unk token */
    int fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int byte_level;       /* the pre-tokenizer ends with ByteLevel: BPE units are mapped bytes */
    int32_t byte_id[256]; /* byte-level: id of the mapped char of each byte (-1: not in vocab) */
    int32_t bytefb_id[256]; /* byte_fallback: ids of "<0xNN>" (-1: absent) */
    /* normalizer chain (Sequence flattened) */
    tok_norm *norm;
    int n_norm;
    /* pre-tokenizer chain */
    tok_stage stage[TOK_MAX_STAGES];
    int n_stage;
    /* added tokens */
    tok_added *added;
    int n_added;
    tok_smap added_map;
    tok_trie trie_raw, trie_norm;
    /* post-processor ids put around the text with add_special */
    tok_ids pre_ids, post_ids;
    int32_t bos_id;
    int32_t eos_id; /* GGUF: tokenizer.ggml.eos_token_id; tokenizer.json: -1 */
    /* decoder chain */
    tok_dec *dec;
    int n_dec, has_decoder;
    /* id -> token */
    int vocab_size;
    const char **id_tok;
    uint32_t *id_len;
    uint8_t *id_added; /* TOK_ID_* flags */
    /* scratch pool */
    pthread_mutex_t lock;
    tok_scratch *free_scratch;
};

enum { TOK_ID_ADDED = 1, TOK_ID_SPECIAL = 2, TOK_ID_SKIP = 4 /* dropped by skip_special */ };

/* tokenizer.c: the pieces tok_gguf.c builds an mk_tok with. tok_alloc gives a zeroed mk_tok with
 * its lock initialised, path copied and unk/bos/eos ids -1 (NULL when out of memory; free it with
 * mk_tok_free). Once the vocab, merges, stages, added tokens and decoders are filled in,
 * tok_finish_tables derives the byte tables, added-token tries and the id -> token table; the
 * caller sets bos_id. */
mk_tok *tok_alloc(const char *path);
int tok_finish_tables(mk_tok *t, mk_err *err);

/* byte-level alphabet (GPT-2 bytes_to_unicode) */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the byte-level alphabet */

/* normalize.c */
int tok_normalize(const mk_tok *t, tok_scratch *sc, const char *s, size_t n, const char **out,
                  size_t *out_n, mk_err *err);
void tok_norm_free(tok_norm *nm);
int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t match);
void tok_trie_free(tok_trie *tr);
/* HF AddedVocabulary::find_matches: split s into pieces, tag = added-token id or -1. */
int tok_added_split(const mk_tok *t, const tok_trie *tr, const char *s, size_t n, tok_spans *out);

/* bpe.c */
struct tok_mmap *tok_mmap_create(size_t n_merges);
int tok_mmap_put(struct tok_mmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
void tok_mmap_free(struct tok_mmap *m);
int tok_bpe_word(const mk_tok *t, tok_scratch *sc, const char *w, size_t n, tok_ids *out,
                 mk_err *err);
void tok_cache_free(tok_cache *c);

/* detok.c */
void tok_dec_free(tok_dec *d);
/* Decode into out (cleared first); HF's Tokenizer::decode. */
int tok_decode_into(const mk_tok *t, tok_scratch *sc, const int32_t *ids, size_t n, int skip_special,
                    tok_buf *out, mk_err *err);

#endif
