"""Prepares Tiny Shakespeare for training: GPT-2 tokens in llm.c's .bin format, plus the tokenizer.

    python data/prepare_tinyshakespeare.py [--out-dir DIR] [--tokenizer-out FILE]

Inputs (the text and GPT-2's BPE files) come from the folder named by $GPT_MIRROR (offline machines;
same layout as the mirror: tinyshakespeare.txt, gpt2/encoder.json, gpt2/vocab.bpe), or are downloaded
once into data/mirror/. Either way their sha256 must match the pinned values (below, and
BPE_FILES in data/gpt2_bpe.py, which this script shares with data/prepare_text.py).

Outputs, in llm.c's formats so files are interchangeable with llm.c's:
  DIR/tiny_shakespeare_val.bin, DIR/tiny_shakespeare_train.bin
      256 x int32 header (magic 20240520, version 1, token count), then the tokens as uint16.
      Each blank-line-separated section is one document, preceded by <|endoftext|> (50256): the same
      tokens as llm.c's dev/data/tinyshakespeare.py. Validation = the first 32,768 tokens.
  FILE (default data/gpt2_tokenizer.bin)
      256 x int32 header (magic 20240328, version 2, vocab size, eot token), then for each token id a
      uint8 length and that many raw bytes.
Every file is written atomically. A second run with valid outputs in place does nothing.
"""

import os
import sys
import urllib.request

try:
    import numpy as np
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "data/prepare_tinyshakespeare.py")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # gpt2_bpe beside this file, also when a test imports this script by path
from gpt2_bpe import (BPE_FILES, EOT, VOCAB_SIZE, Parser, PrepError, atomic_write, exit_on_signals,  # noqa: E402
                      gpt2_encoding, regular_file, sha256, token_file_header, token_file_ok, tokenizer_file_ok,
                      write_tokenizer)
from gpt2_bpe import gpt2_mergeable_ranks  # noqa: E402,F401  (test/test_data.py calls it from here)
__all__ = ["gpt2_mergeable_ranks"]

# name in the mirror -> (canonical URL, sha256).
INPUTS = {
    "tinyshakespeare.txt": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    **BPE_FILES,
}
VAL_TOKENS = 32768


def fetch_inputs():
    """Returns {mirror name: bytes} for every input, each verified against its pinned sha256."""
    mirror = os.environ.get("GPT_MIRROR")
    contents = {}
    for name, (url, want) in INPUTS.items():
        if mirror:
            path = os.path.join(mirror, name)
            if not regular_file(path):
                raise PrepError(f"GPT_MIRROR={mirror}: missing {name} (expected the mirror layout: "
                                + ", ".join(INPUTS) + ")")
            print(f"  reading {path}")
        else:
            path = os.path.join(HERE, "mirror", name)
            if not os.path.isfile(path):
                print(f"  downloading {url}")
                try:
                    with urllib.request.urlopen(url, timeout=60) as resp:
                        data = resp.read()
                except Exception as e:  # URLError, HTTPError, timeouts: all mean "cannot fetch"
                    raise PrepError(f"could not download {url}: {e} (offline? set GPT_MIRROR to a "
                                    f"folder holding {', '.join(INPUTS)})")
                # Verify before saving, so data/mirror/ only ever holds good copies.
                if sha256(data) != want:
                    raise PrepError(f"{url}: sha256 {sha256(data)}, expected {want}")
                atomic_write(path, [data])
            else:
                print(f"  reading {path}")
        with open(path, "rb") as f:
            data = f.read()
        got = sha256(data)
        if got != want:
            raise PrepError(f"{path}: sha256 {got}, expected {want} (corrupt or different file)")
        contents[name] = data
    return contents


def tokenize(enc, text):
    """Each blank-line-separated section is a document: EOT, then the section with its "\\n\\n".

    Equal to llm.c's encode("<|endoftext|>" + text.replace("\\n\\n", "\\n\\n<|endoftext|>")), since
    tiktoken encodes the text between special tokens independently. encode_ordinary per document
    keeps a literal "<|endoftext|>" in the text from becoming a special token.
    """
    sections = text.split("\n\n")
    docs = [s + "\n\n" for s in sections[:-1]] + [sections[-1]]
    tokens = []
    for doc in docs:
        tokens.append(EOT)
        tokens.extend(enc.encode_ordinary(doc))
    return tokens, len(docs)


def main():
    parser = Parser(
        description="Tokenize Tiny Shakespeare with GPT-2's BPE into llm.c's .bin format, and write "
                    "the tokenizer. Inputs come from $GPT_MIRROR if set, else are downloaded into "
                    "data/mirror/.")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "tinyshakespeare"),
                        help="folder for tiny_shakespeare_{val,train}.bin (default: data/tinyshakespeare)")
    parser.add_argument("--tokenizer-out", default=os.path.join(HERE, "gpt2_tokenizer.bin"),
                        help="tokenizer file to write (default: data/gpt2_tokenizer.bin)")
    args = parser.parse_args()

    val_path = os.path.join(args.out_dir, "tiny_shakespeare_val.bin")
    train_path = os.path.join(args.out_dir, "tiny_shakespeare_train.bin")
    tokenizer_ok = tokenizer_file_ok(args.tokenizer_out)  # first: a FIFO there is an error before any work
    if token_file_ok(val_path) and token_file_ok(train_path) and tokenizer_ok:
        print(f"up to date: {val_path}, {train_path} and {args.tokenizer_out} exist and are valid; "
              f"nothing to do (delete them to rebuild)")
        return

    print("[1/4] inputs (sha256-checked)")
    inputs = fetch_inputs()
    print("[2/4] GPT-2 tokenizer from gpt2/encoder.json and gpt2/vocab.bpe")
    enc = gpt2_encoding(inputs["gpt2/encoder.json"], inputs["gpt2/vocab.bpe"])
    print("[3/4] tokenizing")
    text = inputs["tinyshakespeare.txt"].decode("utf-8")
    tokens, num_docs = tokenize(enc, text)
    tokens = np.array(tokens, dtype=np.uint16)
    val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]
    print(f"  {len(text):,} characters, {num_docs:,} documents, {len(tokens):,} tokens")

    print("[4/4] writing")
    for path, split in ((val_path, val), (train_path, train)):
        atomic_write(path, [token_file_header(len(split)), split.astype("<u2").tobytes()])
        print(f"  {len(split):,} tokens -> {path}")
    write_tokenizer(enc, args.tokenizer_out)
    print(f"  {VOCAB_SIZE:,} tokens -> {args.tokenizer_out}")
    print(f"val {len(val):,} tokens, train {len(train):,} tokens")


if __name__ == "__main__":
    exit_on_signals()
    try:
        main()
    except (PrepError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
