"""The C++ GPT-2 encoder (tokenizer.h, through build/test/token_file_tool encode) against tiktoken's
"gpt2" encoding (built from the same local encoder.json / vocab.bpe as data/ builds it): the same
token ids for Tiny Shakespeare, for hand-written edge cases (contractions, whitespace runs, digits,
punctuation, text that is all whitespace) and for random text drawn from letters, digits, marks,
symbols and spaces of many scripts. Needs no GPU. Ends with `N passed, N failed, N skipped`.
"""
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, HERE)
from checks import check, finish  # noqa: E402  (test/checks.py: the count line every test ends with)
TOOL = os.path.join(ROOT, "build", "test", "token_file_tool")
MIRROR = os.environ.get("GPT_MIRROR", os.path.join(ROOT, "data", "mirror"))


def main():
    import gpt2_bpe
    if not os.access(TOOL, os.X_OK):
        check(f"{TOOL} built", False, "run `make build/test/token_file_tool`")
        finish()
    try:
        enc = gpt2_bpe.local_encoding()
    except gpt2_bpe.PrepError as e:
        check("GPT-2 tokenizer files in the mirror", False, str(e))
        finish()
    holder = tempfile.TemporaryDirectory(prefix="test_tokenizer.")
    tmp = holder.name
    tokenizer = os.path.join(tmp, "gpt2_tokenizer.bin")
    gpt2_bpe.write_tokenizer(enc, tokenizer)

    def ours(text):
        path = os.path.join(tmp, "text.txt")
        with open(path, "wb") as f:
            f.write(text.encode("utf-8"))
        r = subprocess.run([TOOL, "encode", tokenizer, path], capture_output=True, text=True)
        if r.returncode != 0:
            return None, r.stderr.strip()
        return [int(x) for x in r.stdout.split()], ""

    def compare(name, text):
        want = enc.encode_ordinary(text)
        got, err = ours(text)
        if got is None:
            check(name, False, f"token_file_tool failed: {err}")
            return
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        same = got == want
        check(name, same, f"{len(want)} tokens identical" if same else
              f"{len(got)} vs {len(want)} tokens, first difference at {first}: ours {got[first:first + 5]} "
              f"tiktoken {want[first:first + 5]}")

    print("C++ encoder (tokenizer.h) against tiktoken's gpt2 encoding")
    if os.path.isfile(os.path.join(MIRROR, "tinyshakespeare.txt")):
        with open(os.path.join(MIRROR, "tinyshakespeare.txt"), encoding="utf-8") as f:
            compare("Tiny Shakespeare (1.1 MB)", f.read())
    else:
        check("Tiny Shakespeare in the mirror", False, f"no {MIRROR}/tinyshakespeare.txt (set GPT_MIRROR)")
    cases = {
        "contractions": "It's, we'll, they've, you're, I'm, he'd, 'tis 'S 'LL o'clock' '' 's'",
        "whitespace runs": "a  b   c\t\td\n\n\ne \n x\r\n  \t  y   ",
        "only whitespace": " \n\t  ",
        "a single space": " ",
        "digits and punctuation": "3.14159 1,000,000 (x+y)*z=42!? ...---*** 2026-11-25 #1 $9.99 100% ½ ²",
        "non-Latin scripts": "Ünïcödé ñ Straße — «quotes» 中文字符 日本語のテキスト 한국어 Ελληνικά русский عربى हिन्दी ١٢٣ ४५६",
        "emoji and symbols": "🎉👍🏽 ❤️‍🔥 ™ © ∑∫√ → ⇒ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "unusual spaces": "nbsp\u00a0here em\u2003space\u3000ideographic line\u2028sep",
        "literal end-of-text": "before <|endoftext|> after",
    }
    for name, text in cases.items():
        compare(name, text)
    # Random text: code points of categories L, N, M, P, S, Z assigned in this Python's Unicode
    # (characters a later Unicode assigns could be classed differently by tiktoken's tables).
    rng = random.Random(1234)
    pools = {}
    for cp in range(0x30000):
        cat = unicodedata.category(chr(cp))
        if cat[0] in "LNMPSZ":
            pools.setdefault(cat[0], []).append(chr(cp))
    ascii_pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'.,;:!? \n\t")
    for k in range(8):
        chars = []
        for _ in range(400):
            r = rng.random()
            if r < 0.5:
                chars.append(rng.choice(ascii_pool))
            else:
                chars.append(rng.choice(pools[rng.choice("LNMPSZ")]))
        compare(f"random text {k + 1} (400 code points)", "".join(chars))
    # Long pre-tokens (one word of many merges; equal ranks side by side), in a time limit: the merge
    # costs n log n, so 100,000 letters take well under a second.
    long_word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100000))
    for name, text in {"one word of 100,000 random letters": long_word, "'a' x 20,000": "a" * 20000,
                       "'ab' x 10,000 after a space": " " + "ab" * 10000, "digits x 30,000": "7" * 30000}.items():
        start = time.monotonic()
        compare(name, text)
        took = time.monotonic() - start
        check(f"  ... encoded within 10 s", took < 10.0, f"{took:.2f} s")
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
