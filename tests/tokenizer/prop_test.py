#!/usr/bin/env python3
"""prop_test.py — property test of minke's tokenizer against Hugging Face `tokenizers`.

Trains small BPE tokenizers with HF's BpeTrainer on a generated multilingual corpus, one per
configuration below, together covering every normalizer (none, NFC, NFD, NFKC, NFKD, Lowercase,
Replace with String and Regex patterns, Prepend, Strip, Sequence), every pre-tokenizer
(ByteLevel with and without prefix space / regex, Split with each behavior, invert, String and
Regex patterns including DeepSeek, Llama-3 and GPT-4 style patterns and an empty-match one,
Digits, Sequence, none), BPE options (byte_fallback, unk with and without fuse_unk,
continuing_subword_prefix, end_of_word_suffix, ignore_merges), post-processors (ByteLevel,
TemplateProcessing, Roberta, Sequence) and decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip,
none), each with the same added tokens (special and not, lstrip / rstrip / single_word,
normalized true and false). Each tokenizer is saved as tokenizer.json and given to
build/tests/tokenizer/tok_cli; on thousands of random strings (mixed scripts, emoji, whitespace
runs, digits, compatibility forms, added-token text) the ids with and without special tokens, the
decoded text (with and without skipping specials) must equal HF's, the streaming detokenizer
must reproduce decode(), and decode(encode(x)) == x where the configuration is lossless.

Usage: prop_test.py [BUILD_DIR]   (env: PROP_N strings per tokenizer, default 1500; PROP_SEED)
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
from tokenizers import AddedToken, Regex, Tokenizer, decoders as D, models, normalizers as N
from tokenizers import pre_tokenizers as P, processors as PP, trainers

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
CLI = os.path.join(BUILD, "tests", "tokenizer", "tok_cli")
N_STR = int(os.environ.get("PROP_N", "1500"))
SEED = int(os.environ.get("PROP_SEED", "20261202"))

# ---- random text --------------------------------------------------------------------------
RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0x61, 0x7A), (0xC0, 0xFF), (0x391, 0x3C9), (0x410, 0x44F),
    (0x4E00, 0x9FA5), (0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0x621, 0x64A),
    (0x905, 0x939), (0x93E, 0x94D), (0xE01, 0xE3A), (0x5D0, 0x5EA), (0x300, 0x36F),
]
WORDS = ("the quick brown fox jumps over lazy dog hello world token ization don't I'll we've it's "
         "they're HTTP JSON Python naïve café Straße İstanbul ΣΊΣΥΦΟΣ Ελληνικά Привет мир 深度求索 "
         "東京 カタカナ ひらがな 한국어 مرحبا नमस्ते สวัสดี שלום aaaa ababab snake_case camelCase "
         "x->y a::b #include <stdio.h> return 0; https://example.com/path?q=1").split()
EMOJI = ["😀", "🙂", "👍", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇯🇵", "❤️", "🏳️\u200d🌈", "🤖", "🫠"]
PUNCT = list(".,;:!?-_()[]{}<>\"'`~@#$%^&*+=/\\|") + list("，。！？「」…—–“”‘’")
SPACES = [" ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "   \n ", " \t ", "\u00a0", "\u3000",
          "\u2003", "\u200b", "\u2028", "\x0b"]
COMPAT = ["ﬁ", "ﬀ", "Ａ", "ｂ", "①", "㎏", "ℌ", "Ⅻ", "ｶﾞ", "½", "²", "µ", "Å", "e\u0301", "ǅ", "ẞ"]
DIGITS = "0123456789"
ADDED_TEXT = ["<|bos|>", "<|eos|>", "<|user|>", "<tool>", "[MASK]", " hello world", "Ünïcode",
              "word", "ＡＢＣ", "ABC", "<|user", "<too"]


def rand_piece(r):
    k = r.random()
    if k < 0.25:
        return r.choice(WORDS)
    if k < 0.45:
        lo, hi = r.choice(RANGES)
        return "".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 8)))
    if k < 0.55:
        return "".join(r.choice(DIGITS) for _ in range(r.randint(1, 12))) + r.choice(["", "", "１２", "٣٤"])
    if k < 0.65:
        return "".join(r.choice(PUNCT) for _ in range(r.randint(1, 4)))
    if k < 0.80:
        return r.choice(SPACES)
    if k < 0.87:
        return r.choice(EMOJI)
    if k < 0.93:
        return r.choice(COMPAT)
    return r.choice(ADDED_TEXT)


def rand_text(r):
    n = r.choice([0, 1, 2, 3, 5, 8, 12, 20])
    return "".join(rand_piece(r) + (r.choice(SPACES) if r.random() < 0.4 else "") for _ in range(n))


# ---- configurations -----------------------------------------------------------------------
DS_SPLIT = [
    P.Split(Regex(r"\p{N}{1,3}"), "isolated"),
    P.Split(Regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"), "isolated"),
    P.Split(Regex(r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""), "isolated"),
]
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
GPT4 = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
BL_NOREGEX = P.ByteLevel(add_prefix_space=False, use_regex=False)
LLAMA2_DEC = D.Sequence([D.Replace("▁", " "), D.ByteFallback(), D.Fuse(), D.Strip(" ", 1, 0)])

# name, normalizer, pre_tokenizer, decoder, model options, post-processor kind, lossless, vocab
CONFIGS = [
    ("gpt2", None, P.ByteLevel(add_prefix_space=False), D.ByteLevel(), {}, "bytelevel", True, 800),
    ("gpt2-prefix-nfc", N.NFC(), P.ByteLevel(add_prefix_space=True), D.ByteLevel(), {}, "bos", False, 600),
    ("llama3", None, P.Sequence([P.Split(Regex(LLAMA3), "isolated"), BL_NOREGEX]), D.ByteLevel(),
     {"ignore_merges": True}, "seq", True, 1500),
    ("deepseek", N.Sequence([]), P.Sequence(DS_SPLIT + [BL_NOREGEX]), D.ByteLevel(), {}, "bytelevel", True, 2000),
    ("gpt4-nfkc", N.NFKC(), P.Sequence([P.Split(Regex(GPT4), "isolated"), BL_NOREGEX]), D.ByteLevel(),
     {}, "bos_eos", False, 1000),
    ("lowercase", N.Lowercase(), P.ByteLevel(add_prefix_space=False, use_regex=True), D.ByteLevel(), {}, "none", False, 500),
    ("nfkc-lower-digits", N.Sequence([N.NFKC(), N.Lowercase()]),
     P.Sequence([P.Digits(individual_digits=True), P.ByteLevel(add_prefix_space=False)]), D.ByteLevel(), {}, "bos", False, 700),
    ("replace-regex", N.Replace(Regex(r"\s+"), " "), P.ByteLevel(add_prefix_space=False), D.ByteLevel(), {}, "none", False, 400),
    ("prepend-nfd-mergedprev", N.Sequence([N.Prepend("#"), N.NFD()]),
     P.Sequence([P.Split(Regex(r"\p{P}"), "merged_with_previous"), BL_NOREGEX]), D.ByteLevel(), {}, "none", False, 600),
    ("llama2-bytefallback", N.Sequence([N.Prepend("▁"), N.Replace(" ", "▁")]), None, LLAMA2_DEC,
     {"byte_fallback": True}, "bos", False, 700),
    ("unk-fuse", N.NFC(), P.Split(Regex(r"\s+"), "removed"), None, {"unk": "<unk>", "fuse_unk": True}, "none", False, 300),
    ("subword-affixes", N.Sequence([N.Strip(left=True, right=True), N.Lowercase()]),
     P.Sequence([P.Split(" ", "removed"), P.Split(Regex(r"[,.!?]"), "isolated")]), None,
     {"unk": "<unk>", "prefix": "##", "suffix": "</w>"}, "roberta", False, 500),
    ("behaviors", None,
     P.Sequence([P.Split(Regex(r"[aeiou]+"), "contiguous"), P.Split(Regex(r"\d*"), "merged_with_next"),
                 P.Split(Regex(r"\p{P}"), "merged_with_previous", invert=True), P.ByteLevel(add_prefix_space=True, use_regex=False)]),
     D.ByteLevel(), {}, "none", False, 500),
    ("nfkd-strip-contiguous", N.Sequence([N.NFKD(), N.Strip(left=False, right=True)]),
     P.Sequence([P.Digits(individual_digits=False), P.Split(Regex(r" ?\p{L}+"), "isolated"),
                 P.Split(Regex(r"\s+"), "removed", invert=True), BL_NOREGEX]), D.ByteLevel(), {}, "bos", False, 600),
    ("mergednext-string", N.Replace("a", "bb"), P.Sequence([P.Split("-", "merged_with_next"), P.ByteLevel(add_prefix_space=False)]),
     D.ByteLevel(), {}, "none", False, 500),
]

ADDED = [
    AddedToken("<|bos|>", special=True, normalized=False),
    AddedToken("<|eos|>", special=True, normalized=False),
    AddedToken("<|user|>", special=True, lstrip=True, rstrip=True, normalized=False),
    AddedToken("<tool>", special=True, rstrip=True, normalized=True),
    AddedToken("[MASK]", special=True, lstrip=True, normalized=True),
]
ADDED_PLAIN = [
    AddedToken(" hello world", normalized=True),
    AddedToken("Ünïcode", normalized=False),
    AddedToken("word", single_word=True, normalized=True),
    AddedToken("ＡＢＣ", normalized=True),
]


def build(cfg, corpus, path):
    name, norm, pre, dec, opt, post, lossless, vocab = cfg
    mopt = {k: v for k, v in (("unk_token", opt.get("unk")), ("continuing_subword_prefix", opt.get("prefix")),
                              ("end_of_word_suffix", opt.get("suffix"))) if v is not None}
    tok = Tokenizer(models.BPE(**mopt))
    if norm is not None:
        tok.normalizer = norm
    if pre is not None:
        tok.pre_tokenizer = pre
    if dec is not None:
        tok.decoder = dec
    byte_level = dec is not None and "ByteLevel" in repr(pre)
    topt = {k: v for k, v in (("continuing_subword_prefix", opt.get("prefix")), ("end_of_word_suffix", opt.get("suffix")),
                              ("limit_alphabet", None if byte_level else 120)) if v is not None}
    tr = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                             special_tokens=[opt["unk"]] if "unk" in opt else [],
                             initial_alphabet=P.ByteLevel.alphabet() if byte_level else [], **topt)
    tok.train_from_iterator(corpus, tr)
    # model options the trainer does not set, and <0xNN> tokens for byte_fallback
    j = json.loads(tok.to_str())
    m = j["model"]
    m["fuse_unk"] = bool(opt.get("fuse_unk"))
    m["byte_fallback"] = bool(opt.get("byte_fallback"))
    m["ignore_merges"] = bool(opt.get("ignore_merges"))
    if opt.get("byte_fallback"):
        nxt = max(m["vocab"].values()) + 1
        for b in range(256):
            if f"<0x{b:02X}>" not in m["vocab"]:
                m["vocab"][f"<0x{b:02X}>"] = nxt
                nxt += 1
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens(ADDED)
    tok.add_tokens(ADDED_PLAIN)
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    tmpl = PP.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    if post == "bytelevel":
        tok.post_processor = PP.ByteLevel(trim_offsets=False)
    elif post == "bos":
        tok.post_processor = tmpl
    elif post == "bos_eos":
        tok.post_processor = PP.TemplateProcessing(single="<|bos|> $A <|eos|>", special_tokens=[("<|bos|>", bos), ("<|eos|>", eos)])
    elif post == "seq":
        tok.post_processor = PP.Sequence([PP.ByteLevel(trim_offsets=False), tmpl])
    elif post == "roberta":
        tok.post_processor = PP.RobertaProcessing(("<|eos|>", eos), ("<|bos|>", bos))
    tok.save(path)
    return Tokenizer.from_file(path)


def main():
    if not os.path.exists(CLI):
        print(f"prop_test: {CLI} not built", file=sys.stderr)
        return 1
    t0 = time.time()
    rc = random.Random(SEED)
    corpus = [rand_text(rc) for _ in range(3000)] + [" ".join(rc.choice(WORDS) for _ in range(12)) for _ in range(1500)]
    passed = failed = 0
    shown = 0
    with tempfile.TemporaryDirectory() as td:
        for ci, cfg in enumerate(CONFIGS):
            name, lossless = cfg[0], cfg[6]
            path = os.path.join(td, f"{name}.json")
            hf = build(cfg, corpus, path)
            r = random.Random(SEED * 1000 + ci)
            texts = [rand_text(r) for _ in range(N_STR)]
            want_ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
            want_sp = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
            want_dec = hf.decode_batch(want_ids, skip_special_tokens=False)
            want_skip = hf.decode_batch(want_ids, skip_special_tokens=True)
            inp = "".join(json.dumps(t) + "\n" for t in texts).encode()
            out = subprocess.run([CLI, path], input=inp, capture_output=True)
            if out.returncode != 0:
                print(f"prop_test: {name}: tok_cli failed: {out.stderr.decode()[:2000]}")
                return 1
            got = [json.loads(l) for l in out.stdout.decode().splitlines()]
            if len(got) != len(texts):
                print(f"prop_test: {name}: expected {len(texts)} results, got {len(got)}")
                return 1
            cfail = 0
            for i, t in enumerate(texts):
                g = got[i]
                checks = [("ids", want_ids[i], g.get("ids")), ("ids_special", want_sp[i], g.get("ids_special")),
                          ("decoded", want_dec[i], g.get("decoded")), ("decoded_skip", want_skip[i], g.get("decoded_skip")),
                          ("stream", g.get("decoded"), g.get("stream"))]
                if lossless and not any(a in t for a in ADDED_TEXT[:9]):
                    checks.append(("roundtrip", t, g.get("decoded")))
                for what, want, have in checks:
                    if want == have:
                        passed += 1
                        continue
                    failed += 1
                    cfail += 1
                    if shown < 12:
                        shown += 1
                        print(f"MISMATCH [{name}] {what} text={t!r}\n  hf:    {want!r}\n  minke: {have!r}"
                              + (f"\n  error: {g['error']}" if "error" in g else ""))
            print(f"prop_test: {name:24s} {len(texts)} strings, {cfail} mismatches")
    print(f"prop_test: {len(CONFIGS)} tokenizers x {N_STR} strings in {time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
