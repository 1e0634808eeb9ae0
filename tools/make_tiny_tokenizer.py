"""make_tiny_tokenizer.py — the 512-token tokenizer that pairs with the tiny golden models.

The golden DeepSeek-V4 checkpoints in tests/data/dsv4/ have a vocabulary of 512, far smaller than
DeepSeek's tokenizer, so `minke generate` on them needs a tokenizer of the same size. This script
trains one with Hugging Face `tokenizers` (PyPI): byte-level BPE with DeepSeek-V3's own
pre-tokenizer (copied from the real tokenizer.json given as input), the special tokens at the ids
the tiny configs use (BOS 0, EOS 1) plus the chat-encoding tokens, on a small deterministic corpus.

    python3 tools/make_tiny_tokenizer.py /path/to/deepseek-v3/tokenizer.json tests/data/tok512/tokenizer.json
"""
import json
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
            "<｜Assistant｜>", "<think>", "</think>", "<｜latest_reminder｜>"]


def corpus(n=4000, seed=7):
    rng = random.Random(seed)
    words = ("the quick brown fox jumps over the lazy dog hello world what is two plus two "
             "minke runs deepseek models on the cpu exactly as the reference computes them "
             "numbers 0 1 2 3 42 1024 café naïve 東京 天气 emoji 🙂 code def main(): return x + y").split()
    for _ in range(n):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(3, 16))) + rng.choice([".", "?", "!", "\n"])


def main():
    src, dst = sys.argv[1], sys.argv[2]
    ref = json.load(open(src, encoding="utf-8"))
    tok = Tokenizer(models.BPE())
    # the real pre-tokenizer and decoder, via JSON round trip
    tmp = json.loads(tok.to_str())
    tmp["pre_tokenizer"] = ref["pre_tokenizer"]
    tmp["decoder"] = ref["decoder"]
    tok = Tokenizer.from_str(json.dumps(tmp))
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    tok.save(dst)
    t = Tokenizer.from_file(dst)
    assert t.get_vocab_size() <= 512, t.get_vocab_size()
    assert t.token_to_id(SPECIALS[0]) == 0 and t.token_to_id(SPECIALS[1]) == 1
    print(f"{dst}: vocab {t.get_vocab_size()}")


if __name__ == "__main__":
    main()
