"""Prepares Tiny Shakespeare for training: GPT-2 tokens in llm.c's .bin format, plus the tokenizer.

    python data/prepare_tinyshakespeare.py [--out-dir DIR] [--tokenizer-out FILE]

Inputs (the text and GPT-2's BPE files) come from the folder named by $GPT_MIRROR (offline machines;
same layout as the mirror: tinyshakespeare.txt, gpt2/encoder.json, gpt2/vocab.bpe), or are downloaded
once into data/mirror/. Either way their sha256 must match the pinned values below.

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

import argparse
import hashlib
import json
import os
import sys
import tempfile
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# name in the mirror -> (canonical URL, sha256). The GPT-2 hashes are the ones tiktoken pins.
INPUTS = {
    "tinyshakespeare.txt": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    "gpt2/encoder.json": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "gpt2/vocab.bpe": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}

# GPT-2's pre-tokenizer regex (tiktoken's r50k/gpt2 pat_str).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = 50256
VOCAB_SIZE = 50257
VAL_TOKENS = 32768
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
HEADER_BYTES = 256 * 4


class PrepError(Exception):
    pass


def atomic_write(path, chunks):
    """Temp file in the same folder, fsync, rename: a reader never sees a half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp.")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; outputs are ordinary shared files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def fetch_inputs():
    """Returns {mirror name: bytes} for every input, each verified against its pinned sha256."""
    mirror = os.environ.get("GPT_MIRROR")
    contents = {}
    for name, (url, want) in INPUTS.items():
        if mirror:
            path = os.path.join(mirror, name)
            if not os.path.isfile(path):
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


def gpt2_mergeable_ranks(encoder_json, vocab_bpe):
    """GPT-2's BPE ranks (token bytes -> id) from the two OpenAI files.

    Parsed here rather than with tiktoken.load, whose loader goes through a download cache in the
    temp folder. GPT-2's files spell bytes as printable characters: printable non-space bytes stand
    for themselves, the other 68 bytes are mapped in order to chr(256), chr(257), ...
    """
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    char_to_byte = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in char_to_byte.values()]
    char_to_byte.update({chr(256 + i): b for i, b in enumerate(others)})
    to_bytes = lambda s: bytes(char_to_byte[c] for c in s)

    # Ranks are the merge order: the 256 single bytes (printable ones first), then one per merge.
    ranks = {bytes([b]): i for i, b in enumerate(printable + others)}
    for line in vocab_bpe.decode("utf-8").split("\n")[1:-1]:  # first line is a version comment
        first, second = line.split()
        ranks[to_bytes(first) + to_bytes(second)] = len(ranks)

    # tiktoken assumes id == merge rank; the encoder must agree, or tokens would be silently wrong.
    encoder = {to_bytes(k): v for k, v in json.loads(encoder_json).items() if k != "<|endoftext|>"}
    if encoder != ranks:
        raise PrepError("gpt2/encoder.json and gpt2/vocab.bpe disagree on token ids")
    return ranks


def gpt2_encoding(encoder_json, vocab_bpe):
    import tiktoken
    ranks = gpt2_mergeable_ranks(encoder_json, vocab_bpe)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)


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


def header(magic, version, count, extra=0):
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2], h[3] = magic, version, count, extra
    return h.tobytes()


def token_file_ok(path):
    """Header magic/version right and the token count matches the file size."""
    try:
        with open(path, "rb") as f:
            h = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
        size = os.path.getsize(path)
    except OSError:
        return False
    return (len(h) == 256 and h[0] == TOKENS_MAGIC and h[1] == TOKENS_VERSION and h[2] >= 1
            and size == HEADER_BYTES + 2 * int(h[2]))


def tokenizer_file_ok(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if len(data) < HEADER_BYTES:
        return False
    h = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    if h[0] != TOKENIZER_MAGIC or h[1] != TOKENIZER_VERSION or h[2] != VOCAB_SIZE or h[3] != EOT:
        return False
    pos = HEADER_BYTES
    for _ in range(VOCAB_SIZE):
        if pos >= len(data):
            return False
        pos += 1 + data[pos]
    return pos == len(data)


def main():
    parser = argparse.ArgumentParser(
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
    if token_file_ok(val_path) and token_file_ok(train_path) and tokenizer_file_ok(args.tokenizer_out):
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
        atomic_write(path, [header(TOKENS_MAGIC, TOKENS_VERSION, len(split)), split.astype("<u2").tobytes()])
        print(f"  {len(split):,} tokens -> {path}")
    pieces = [enc.decode_single_token_bytes(i) for i in range(VOCAB_SIZE)]
    if not all(0 < len(p) < 256 for p in pieces):  # the uint8 length field; true of GPT-2's vocab
        raise PrepError("a token's bytes do not fit the tokenizer file's uint8 length field")
    atomic_write(args.tokenizer_out, [header(TOKENIZER_MAGIC, TOKENIZER_VERSION, VOCAB_SIZE, EOT)]
                 + [bytes([len(p)]) + p for p in pieces])
    print(f"  {VOCAB_SIZE:,} tokens -> {args.tokenizer_out}")
    print(f"val {len(val):,} tokens, train {len(train):,} tokens")


if __name__ == "__main__":
    try:
        main()
    except (PrepError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
