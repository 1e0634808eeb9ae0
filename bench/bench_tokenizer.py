#!/usr/bin/env python3
"""bench_tokenizer.py — encode throughput of minke's tokenizer vs Hugging Face `tokenizers`.

Builds a few MB of mixed text (English prose from the system's license texts, C and Python
source, Markdown, and generated multilingual text: CJK, Japanese, Korean, Cyrillic, Greek, Arabic,
Devanagari, emoji, digits and whitespace runs), cut into documents of up to 8 KB, and encodes every
document on its own with the DeepSeek-V3 tokenizer:
  - minke: build/bench/bench_tokenizer (mk_tok_encode, one document per call, one thread);
  - HF:    Tokenizer.encode(doc, add_special_tokens=False), one document per call, with
           RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false (also encode_batch on 1 thread).
Both take the best of REPEATS passes over the same documents in the same run; the ids of both
are hashed and must be equal. Prints MB/s for each and the ratio minke / HF.

Usage: bench_tokenizer.py [BUILD] [--tokenizer FILE] [--mb 4] [--repeats 3]
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path, limit):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(limit)
    except (OSError, UnicodeDecodeError):
        return ""


def multilingual(r, n_bytes):
    """Sentences from word pools of several scripts, with numbers, punctuation and emoji."""
    pools = [
        "深度 求索 公司 发布 了 新的 模型 人工 智能 语言 数据 训练 推理 我们 研究 世界 中文 系统".split(),
        "東京 は 日本 の 首都 です カタカナ ひらがな 言語 モデル を 使って 文章 を 書きます".split(),
        "한국어 문장 입니다 모델 데이터 학습 추론 세계 사람 언어 컴퓨터".split(),
        "Привет мир модель язык данные обучение вывод система мы это как".split(),
        "Ελληνικά κείμενο μοντέλο γλώσσα δεδομένα εκπαίδευση σύστημα".split(),
        "مرحبا بالعالم نموذج لغة بيانات تدريب نظام".split(),
        "नमस्ते दुनिया मॉडल भाषा डेटा प्रशिक्षण प्रणाली".split(),
        "café naïve résumé Straße façade über Ünïcode déjà".split(),
    ]
    emoji = ["🙂", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇯🇵", "❤️", "🤖"]
    out, n = [], 0
    while n < n_bytes:
        pool = r.choice(pools)
        words = [r.choice(pool) for _ in range(r.randint(4, 20))]
        if r.random() < 0.3:
            words.insert(r.randrange(len(words)), str(r.randint(0, 10 ** r.randint(1, 9))))
        if r.random() < 0.2:
            words.append(r.choice(emoji))
        sep = "" if pool is pools[0] and r.random() < 0.5 else " "
        s = sep.join(words) + r.choice(["。", ". ", "! ", "? ", "\n", "\n\n", "  ", "\t"])
        out.append(s)
        n += len(s.encode())
    return "".join(out)


def corpus(mb, seed=7):
    r = random.Random(seed)
    target = int(mb * 1e6)
    parts = []  # (kind, text)
    prose = "".join(read(p, 400_000) for p in sorted(glob.glob("/usr/share/common-licenses/*")) if os.path.isfile(p))
    code_files = sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True))
    code_files += sorted(glob.glob(os.path.join(sys.base_prefix, "lib", "python3*", "*.py")))
    md = "".join(read(p, 200_000) for p in sorted(glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True)))
    code = "".join(read(p, 200_000) for p in code_files)
    share = target // 4
    parts.append(prose[:share])
    parts.append(code[:share])
    parts.append(md[: share // 4])
    parts.append(multilingual(r, target - sum(len(p.encode()) for p in parts)))
    docs = []
    for text in parts:
        i = 0
        while i < len(text):
            j = min(len(text), i + r.randint(1000, 8000))
            k = text.rfind("\n", i, j)
            j = k + 1 if k > i and j < len(text) else j
            docs.append(text[i:j])
            i = j
    return docs


def fnv(ids_list):
    h = 0xcbf29ce484222325
    for ids in ids_list:
        for x in ids:
            h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/data/tokenizer/deepseek-v3/tokenizer.json"))
    ap.add_argument("--mb", type=float, default=float(os.environ.get("TOK_BENCH_MB", "4")))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "bench_tokenizer")
    docs = corpus(a.mb)
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"tokenizer bench: {len(docs)} documents, {nbytes / 1e6:.2f} MB of mixed text, "
          f"{os.path.relpath(a.tokenizer, ROOT)}, single thread, best of {a.repeats}")

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
        path = f.name
    try:
        out = subprocess.run([exe, a.tokenizer, path, str(a.repeats)], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode != 0:
        print(out.stderr)
        return 1
    mk = json.loads(out.stdout)

    tok = Tokenizer.from_file(a.tokenizer)
    ids = [e.ids for e in (tok.encode(d, add_special_tokens=False) for d in docs)]  # warm-up + reference
    hf_hash, hf_tokens = fnv(ids), sum(len(x) for x in ids)
    best_one = best_batch = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        best_one = min(best_one, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tok.encode_batch(docs, add_special_tokens=False)
        best_batch = min(best_batch, time.perf_counter() - t0)
    hf_best = min(best_one, best_batch)

    same = mk["hash"] == hf_hash and mk["tokens"] == hf_tokens
    print(f"  minke  mk_tok_encode, one doc per call      {nbytes / mk['best_s'] / 1e6:8.2f} MB/s  ({mk['tokens']} tokens)")
    print(f"  HF     encode, one doc per call              {nbytes / best_one / 1e6:8.2f} MB/s")
    print(f"  HF     encode_batch, RAYON_NUM_THREADS=1     {nbytes / best_batch / 1e6:8.2f} MB/s")
    print(f"  ratio minke / HF (HF's faster mode): {hf_best / mk['best_s']:.2f}x;  ids identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
