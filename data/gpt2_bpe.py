"""gpt2_bpe.py: what the data scripts and gpt_reference.py share about GPT-2's tokenizer and llm.c's files.

  gpt2_encoding(encoder_json, vocab_bpe)   a tiktoken Encoding built from OpenAI's two GPT-2 files
  local_encoding()                         the same, from the files on disk ($GPT_MIRROR/gpt2/ or
                                           data/mirror/gpt2/, sha256-checked); never downloads
  local_bpe_files()                        those two files' bytes (Hugging Face's vocab.json, merges.txt)
  write_tokenizer(enc, path)               llm.c's tokenizer file (magic 20240328, version 2)
  token_file_header(count)                 llm.c's token-file header (magic 20240520, version 1)
  atomic_write(path, chunks)               temp file in the same folder, fsync, rename, fsync the folder
  regular_file(path)                       exists as a regular file? (a FIFO or a device is an error)
  Parser, exit_on_signals()                the scripts' one-line argument errors; SIGTERM/SIGHUP clean up
  utf8_line(path, n, line, error)          line n of a file as text (its BOM dropped), or `error` naming where
  plural(n, word)                          "1 file", "2,048 files"

Not a program: imported by data/prepare_tinyshakespeare.py, data/prepare_text.py, data/prepare_hellaswag.py and
gpt_reference.py.
"""

import argparse
import errno
import hashlib
import json
import os
import signal
import stat
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from file_formats import HEADER_BYTES, TOKEN_FILE, TOKENIZER  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# name in the mirror -> (canonical URL, sha256). The hashes are the ones tiktoken pins.
BPE_FILES = {
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


class PrepError(Exception):
    """A bad input: the scripts print it as one `error: ...` line and exit 1."""


def utf8_line(path, n, line, error=PrepError):
    """Line n (from 1) of `path`, bytes, as text without the byte-order mark a first line may carry;
    bytes that are not UTF-8 raise `error` naming the line, byte and column."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"'{path}' line {n:,} is not UTF-8: byte 0x{line[e.start]:02x} at column {e.start + 1:,} ({e.reason})")
    return text[1:] if n == 1 and text.startswith("\ufeff") else text


def plural(n, word):
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def error_text(e):
    """An OSError as the path it concerns and the system's words, without errno numbers."""
    if isinstance(e, OSError) and e.strerror:
        path = e.filename2 if e.filename2 is not None else e.filename
        return f"'{path}': {e.strerror}" if path is not None else e.strerror
    return str(e)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 1 (argparse's own is usage + exit 2)
        raise PrepError(f"{message} (-h for usage)")


def exit_on_signals():
    """SIGTERM and SIGHUP end the program through SystemExit, so that `finally` blocks remove its
    temporary files (by default these signals end it on the spot)."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's ignored SIGHUP stays ignored
            signal.signal(sig, handler)


def regular_file(path):
    """True if `path` (links followed) is a regular file, False if nothing is there. Anything else is
    a PrepError: opening a FIFO blocks, and reading a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise PrepError(f"'{path}' is not a regular file")
    return True


def fsync_folder(folder):
    """A rename or a removal is an entry of the folder: syncing the folder puts it on disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot sync a folder
            raise
    finally:
        os.close(fd)


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
        fsync_folder(folder)  # the new name on disk before anything relies on it
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def sha256(data):
    return hashlib.sha256(data).hexdigest()


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
    try:
        import tiktoken
    except ImportError as e:  # one line naming the Python make found (scripts/python_check.py)
        sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
        from python_check import wrong_python_line
        raise PrepError(wrong_python_line(e)[len("error: "):])
    ranks = gpt2_mergeable_ranks(encoder_json, vocab_bpe)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)


def local_encoding():
    """GPT-2's encoding from $GPT_MIRROR/gpt2/ if set, else data/mirror/gpt2/ (where
    prepare_tinyshakespeare.py downloads them); each file sha256-checked. Never downloads."""
    return gpt2_encoding(*local_bpe_files().values())


def local_bpe_files():
    """{name: bytes} of BPE_FILES, read as local_encoding reads them."""
    mirror = os.environ.get("GPT_MIRROR") or os.path.join(HERE, "mirror")
    contents = {}
    for name, (_, want) in BPE_FILES.items():
        path = os.path.join(mirror, name)
        try:
            if not regular_file(path):
                raise FileNotFoundError(path)
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            raise PrepError(f"GPT-2's BPE file {path} not found: set GPT_MIRROR to a folder holding "
                            f"{' and '.join(BPE_FILES)}, or run data/prepare_tinyshakespeare.py once "
                            f"(it downloads them into data/mirror/)")
        if sha256(data) != want:
            raise PrepError(f"{path}: sha256 {sha256(data)}, expected {want} (corrupt or different file)")
        contents[name] = data
    return contents


def token_file_header(count):
    return TOKEN_FILE.pack(count=count).tobytes()


def token_file_ok(path):
    """Header magic/version right and the token count matches the file size."""
    try:
        if not regular_file(path):
            return False
        with open(path, "rb") as f:
            h = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
        size = os.path.getsize(path)
    except OSError:
        return False
    if len(h) != 256:
        return False
    f = TOKEN_FILE.unpack(h)
    return (f["magic"] == TOKEN_FILE.magic and f["version"] == TOKEN_FILE.version and f["count"] >= 1
            and size == HEADER_BYTES + 2 * f["count"])


def tokenizer_file_ok(path):
    try:
        if not regular_file(path):
            return False
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if len(data) < HEADER_BYTES:
        return False
    f = TOKENIZER.unpack(data[:HEADER_BYTES])
    if (f["magic"], f["version"], f["vocab_size"], f["eot_token"]) != (TOKENIZER.magic, TOKENIZER.version, VOCAB_SIZE, EOT):
        return False
    pos = HEADER_BYTES
    for _ in range(VOCAB_SIZE):
        if pos >= len(data):
            return False
        pos += 1 + data[pos]
    return pos == len(data)


def write_tokenizer(enc, path):
    """file_formats.py's TOKENIZER header (version 2: vocab size, eot token), then for each token id
    a uint8 length and that many raw bytes."""
    pieces = [enc.decode_single_token_bytes(i) for i in range(VOCAB_SIZE)]
    if not all(0 < len(p) < 256 for p in pieces):  # the uint8 length field; true of GPT-2's vocab
        raise PrepError("a token's bytes do not fit the tokenizer file's uint8 length field")
    atomic_write(path, [TOKENIZER.pack(vocab_size=VOCAB_SIZE, eot_token=EOT).tobytes()]
                 + [bytes([len(p)]) + p for p in pieces])
