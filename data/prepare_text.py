"""Tokenizes your own text with GPT-2's BPE into llm.c's token files, ready for train_gpt.

    python data/prepare_text.py INPUT [INPUT ...] [--out-dir DIR] [--name NAME] [--glob PATTERN]
        [--split-docs file|blankline|line | --doc-separator STRING]
        [--val-fraction F | --val-tokens N] [--shard-tokens N] [--tokenizer-out FILE]

INPUT: UTF-8 text files, or folders searched recursively for files named like --glob (default
*.txt), taken in sorted path order. GPT-2's BPE files come from $GPT_MIRROR/gpt2/ if set, else
data/mirror/gpt2/ (where data/prepare_tinyshakespeare.py puts them); nothing is downloaded.

Documents: every document is preceded by <|endoftext|> (50256), and a file always ends a document.
  --split-docs file       each file is one document (default)
  --split-docs blankline  each blank-line ("\\n\\n") separated section is one, its "\\n\\n" kept at its
                          end (Tiny Shakespeare's recipe: data/prepare_tinyshakespeare.py)
  --split-docs line       each line is one, its "\\n" kept (one document per line corpora, e.g. JSONL)
  --doc-separator STRING  documents separated by STRING, which is dropped (e.g. '<|endoftext|>';
                          in bash $'\\n---\\n' for a newline)
Empty documents are skipped. Text is encoded as ordinary text: a literal "<|endoftext|>" inside a
document stays text, it does not become token 50256.

Split: validation = the FIRST tokens of the stream (deterministic; a document may straddle the
boundary), --val-tokens N exactly, or --val-fraction F (default 0.05): round(F * all tokens), at
least 1 (0 = no validation file). The rest is training data, in shards of --shard-tokens (default
100M) tokens.

Outputs (llm.c's naming, so a glob like DIR/NAME_train_*.bin takes every shard):
  DIR/NAME_val_000000.bin, DIR/NAME_train_000001.bin, DIR/NAME_train_000002.bin, ...
      256 x int32 header (magic 20240520, version 1, token count), then the tokens as uint16.
      DIR defaults to data/NAME, NAME to the first input's name without its extension. An earlier
      run's files are replaced as a set (its shards beyond this run's count deleted), so the glob
      sees one run only; if the run is stopped while replacing them, NAME_train_000001.bin is a
      placeholder that train_gpt rejects (not a token file): run the script again.
  data/gpt2_tokenizer.bin (--tokenizer-out), if missing: the tokenizer file train_gpt prints with.
Streams: text is read in blocks and encoded in pieces cut where GPT-2's pre-tokenizer cuts anyway
(the tokens equal those of the whole text at once); the token stream goes to a temporary file in
DIR (2 bytes a token), then into the new files, under temporary names until all are written. Memory
stays small for any input size. Temporary files of an earlier run that was killed are removed.
"""

import argparse
import fnmatch
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bpe import (EOT, Parser, PrepError, atomic_write, exit_on_signals, fsync_folder,  # noqa: E402
                      local_encoding, regular_file, token_file_header, tokenizer_file_ok, write_tokenizer)

READ_BYTES = 1 << 22        # bytes read from a file at a time
PIECE_CHARS = 1 << 20       # a document longer than this is encoded in pieces of about this size
BATCH_CHARS = 1 << 23       # pieces encoded together, in groups on several threads
COPY_TOKENS = 1 << 24       # tokens copied from the stream into a shard at a time
MAX_FILE_TOKENS = 2**31 - 1  # the int32 token count of the header


def input_files(inputs, pattern):
    """Files in argument order; a folder contributes its files named like `pattern`, recursively,
    sorted by path. The same file twice counts once. Each must be a regular file (links followed)."""
    files, seen = [], set()
    for path in inputs:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs.sort()
                found += [os.path.join(root, n) for n in names if fnmatch.fnmatch(n, pattern)]
            if not found:
                raise PrepError(f"folder '{path}' holds no file named like '{pattern}' (see --glob)")
            chosen = sorted(found)
        else:
            chosen = [path]
        for f in chosen:
            if not regular_file(f):
                raise PrepError(f"input '{f}' not found")
            if os.path.realpath(f) not in seen:
                seen.add(os.path.realpath(f))
                files.append(f)
    return files


def read_text(path):
    """Yields the file's text in blocks, decoded as strict UTF-8; a bad byte is an error that says
    where. A leading byte-order mark is dropped."""
    consumed, lines, carry = 0, 0, b""  # bytes before `carry`, newlines in them, an unfinished char
    with open(path, "rb") as f:
        while True:
            data = f.read(READ_BYTES)
            buf = carry + data
            cut = len(buf)
            if data:  # keep a character cut by the block end for the next block
                while cut > 0 and len(buf) - cut < 3 and buf[cut - 1] & 0xC0 == 0x80:
                    cut -= 1
                if cut > 0 and buf[cut - 1] >= 0xC0:
                    cut -= 1
            try:
                text = buf[:cut].decode("utf-8")
            except UnicodeDecodeError as e:
                line = lines + buf[:e.start].count(b"\n") + 1
                raise PrepError(f"'{path}' is not UTF-8 text: byte 0x{buf[e.start]:02x} at offset "
                                f"{consumed + e.start:,} (line {line:,}) ({e.reason})")
            if consumed == 0 and text.startswith("\ufeff"):
                text = text[1:]
            if text:
                yield text
            if not data:
                return
            consumed += cut
            lines += buf[:cut].count(b"\n")
            carry = buf[cut:]


def split_documents(blocks, separator, keep):
    """Yields (document starts here, text) for the text blocks of one file: a new document after
    each `separator` (None: the file is one document); the separator stays at the end of its
    document when `keep`."""
    if separator is None:
        for i, block in enumerate(blocks):
            yield i == 0, block
        return
    pending, start = "", True
    for block in blocks:
        pending += block
        begin = 0  # of the current document in `pending`
        while True:
            at = pending.find(separator, begin)
            if at < 0:
                break
            end = at + len(separator)
            yield start, pending[begin:end] if keep else pending[begin:at]
            begin, start = end, True
        pending = pending[begin:]
        # What cannot hold the start of a separator is passed on now.
        ready = len(pending) - (len(separator) - 1)
        if ready > 0:
            yield start, pending[:ready]
            pending, start = pending[ready:], False
    yield start, pending


def safe_cut(text):
    """The last place in `text` (within its last PIECE_CHARS characters) where GPT-2's
    pre-tokenizer cuts anyway, so that encoding the two sides separately gives the tokens of the
    whole; 0 if none. That is after a "\\n", else before a " ", with non-whitespace on both sides:
    the regex keeps a whitespace run whole or splits it before its last character, so a lone space
    or newline between two non-space characters always ends (newline) or starts (space) a piece."""
    lo = max(1, len(text) - PIECE_CHARS)
    for ch, after in (("\n", 1), (" ", 0)):
        at = len(text) - 1
        while True:
            at = text.rfind(ch, lo, at)
            if at < lo:
                break
            if not text[at - 1].isspace() and not text[at + 1].isspace():
                return at + after
    return 0


def encoded_documents(enc, files, separator, keep, stats):
    """Yields uint16 token arrays: for each document EOT, then its text encoded as ordinary text."""
    batch, batch_chars = [], 0  # (document starts here, text piece), encoded together
    workers = os.cpu_count() or 1
    pool = ThreadPoolExecutor(workers)  # tiktoken's encoder releases the GIL

    def encode_group(group):
        out = []
        for starts, text in group:
            if starts:
                out.append(EOT)
            out.extend(enc.encode_ordinary(text))
        return np.array(out, dtype="<u2")

    def flush():
        # Groups of consecutive pieces, a few per thread: one task per piece would cost more than
        # encoding a short line (one document per line corpora).
        size = -(-len(batch) // (4 * workers))
        tokens = np.concatenate(list(pool.map(encode_group, [batch[i:i + size] for i in range(0, len(batch), size)])))
        batch.clear()
        return tokens

    try:
        for path in files:
            piece, piece_starts, new_doc = "", False, False
            for starts, text in split_documents(read_text(path), separator, keep):
                stats["chars"] += len(text)
                new_doc = new_doc or starts
                if not text:
                    continue
                if new_doc:  # the document's first text: the piece before it is complete
                    if piece:
                        batch.append((piece_starts, piece))
                        batch_chars += len(piece)
                    piece, piece_starts, new_doc = "", True, False
                    stats["documents"] += 1
                piece += text
                cut = safe_cut(piece) if len(piece) > PIECE_CHARS else 0
                if cut:
                    batch.append((piece_starts, piece[:cut]))
                    batch_chars += cut
                    piece, piece_starts = piece[cut:], False
                if batch_chars > BATCH_CHARS:
                    yield flush()
                    batch_chars = 0
            if piece:
                batch.append((piece_starts, piece))
                batch_chars += len(piece)
        if batch:
            yield flush()
    finally:
        pool.shutdown()


def shard_path(out_dir, name, split, index):
    return os.path.join(out_dir, f"{name}_{split}_{index:06d}.bin")


def staged_path(path):
    """Where a new output waits, complete, until all are written: hidden, and not named *.bin."""
    folder, base = os.path.split(path)
    return os.path.join(folder, f".{base}.new")


def leftovers(out_dir, name):
    """Temporary files of earlier runs on NAME in out_dir that were killed (SIGKILL, power loss): the
    token stream, staged outputs, atomic_write's temp files."""
    n = re.escape(name)
    mine = re.compile(rf"\.{n}\.tokens\.tmp\.\w+|\.{n}_(train|val)_\d{{6}}\.bin\.new(\.tmp\.\w+)?"
                      rf"|{n}_(train|val)_\d{{6}}\.bin\.tmp\.\w+")
    return [os.path.join(out_dir, f) for f in sorted(os.listdir(out_dir)) if mine.fullmatch(f)]


def write_token_file(path, stream, begin, end):
    """Tokens [begin, end) of the token stream (a memmap) as an llm.c token file, atomically, under
    its staged name."""
    def chunks():
        yield token_file_header(end - begin)
        for at in range(begin, end, COPY_TOKENS):
            yield stream[at:min(end, at + COPY_TOKENS)].tobytes()
    atomic_write(staged_path(path), chunks())
    print(f"  {end - begin:,} tokens -> {path}")


# Not a token file (shorter than the header), so train_gpt rejects a glob that takes it.
PLACEHOLDER = b"incomplete: data/prepare_text.py was stopped while replacing these shards; run it again\n"


def install(out_dir, name, paths, keep_val, train_shards):
    """Moves the staged files onto `paths` and removes the earlier run's other files. Every step is
    one rename or removal, and a kill may come between any two; the glob NAME_train_*.bin must never
    then take a mix of two runs or part of one as valid. So shard 1's name first gets a placeholder
    that train_gpt rejects, the old files go and the new come in, and shard 1 comes last: each
    instant shows the old set, the new set, or the placeholder."""
    first = shard_path(out_dir, name, "train", 1)
    atomic_write(first, [PLACEHOLDER])
    for path in stale_shards(out_dir, name, keep_val, train_shards):
        os.remove(path)
        print(f"  removed {path} (an earlier run's)")
    for path in paths:
        if path != first:
            os.replace(staged_path(path), path)
    fsync_folder(out_dir)  # the rest on disk before shard 1 makes the set whole
    os.replace(staged_path(first), first)
    fsync_folder(out_dir)


def stale_shards(out_dir, name, keep_val, train_shards):
    """Files of an earlier run in out_dir that this run's shards do not replace."""
    stale = []
    for f in sorted(os.listdir(out_dir)):
        for split, first in (("val", 0 if not keep_val else 1), ("train", train_shards + 1)):
            prefix = f"{name}_{split}_"
            digits = f[len(prefix):-len(".bin")]
            if (f.startswith(prefix) and f.endswith(".bin") and len(digits) == 6 and digits.isdigit()
                    and int(digits) >= first):
                stale.append(os.path.join(out_dir, f))
    return stale


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def fraction(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="Details: the top of data/prepare_text.py.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files or folders")
    p.add_argument("--out-dir", metavar="DIR", help="output folder (default: data/NAME)")
    p.add_argument("--name", help="output file prefix (default: the first input's name without extension)")
    p.add_argument("--glob", default="*.txt", metavar="PATTERN",
                   help="file names taken from folders, in every subfolder (default: *.txt)")
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--split-docs", choices=["file", "blankline", "line"], default="file",
                      help="what one document is (default: file)")
    docs.add_argument("--doc-separator", metavar="STRING", help="documents separated by STRING (dropped)")
    val = p.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=fraction, metavar="F",
                     help="validation = the first round(F * tokens) tokens, at least 1 (default 0.05)")
    val.add_argument("--val-tokens", type=positive_int, metavar="N", help="validation = the first N tokens")
    p.add_argument("--shard-tokens", type=positive_int, default=100_000_000, metavar="N",
                   help="tokens per training shard (default 100,000,000)")
    p.add_argument("--tokenizer-out", default=os.path.join(HERE, "gpt2_tokenizer.bin"), metavar="FILE",
                   help="tokenizer file, written if missing (default: data/gpt2_tokenizer.bin)")
    args = p.parse_args(argv)

    if not 1 <= args.shard_tokens <= MAX_FILE_TOKENS:
        raise PrepError(f"--shard-tokens must be in [1, {MAX_FILE_TOKENS}], got {args.shard_tokens}")
    if args.doc_separator == "":
        raise PrepError("--doc-separator must not be empty")
    separator, keep = {"file": (None, True), "blankline": ("\n\n", True), "line": ("\n", True)}[args.split_docs]
    if args.doc_separator is not None:
        separator, keep = args.doc_separator, False
    files = input_files(args.inputs, args.glob)
    name = args.name or os.path.splitext(os.path.basename(os.path.normpath(args.inputs[0])))[0]
    if not name or os.sep in name or name in (".", ".."):
        raise PrepError(f"--name: '{name}' is not a file name")
    out_dir = args.out_dir or os.path.join(HERE, name)
    write_tok = not tokenizer_file_ok(args.tokenizer_out)  # checked now: a FIFO there fails before any work
    total_bytes = sum(os.path.getsize(f) for f in files)
    how = (f"separated by {args.doc_separator!r}" if args.doc_separator is not None else
           {"file": "one per file", "blankline": "one per blank-line separated section",
            "line": "one per line"}[args.split_docs])
    print(f"inputs: {len(files):,} file{'s' * (len(files) != 1)}, {total_bytes:,} bytes; documents: {how}")

    enc = local_encoding()
    created = not os.path.isdir(out_dir)
    stream_path = None
    paths = []  # this run's outputs, staged until all are written
    try:  # everything from the folder's creation on, so that a failure or a signal cleans up after it
        os.makedirs(out_dir, exist_ok=True)
        for path in leftovers(out_dir, name):
            os.remove(path)
            print(f"  removed {path} (left by a killed run)")
        # Named before it is made, so that a signal at any instant leaves a path the cleanup knows.
        stream_path = os.path.join(out_dir, f".{name}.tokens.tmp.{os.getpid()}")
        fd = os.open(stream_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        stats = {"documents": 0, "chars": 0}
        total, started, reported = 0, time.time(), 0
        with os.fdopen(fd, "wb") as f:
            for tokens in encoded_documents(enc, files, separator, keep, stats):
                f.write(tokens.tobytes())
                total += len(tokens)
                if stats["chars"] - reported >= 100_000_000:
                    reported = stats["chars"]
                    print(f"  {stats['chars']:,} characters, {total:,} tokens "
                          f"({stats['chars'] / (time.time() - started):,.0f} characters/s)")
        print(f"  {stats['documents']:,} documents, {stats['chars']:,} characters, {total:,} tokens")
        if total == 0:
            raise PrepError(f"no text in the input{'s' * (len(files) != 1)} ({len(files)} file"
                            f"{'s' * (len(files) != 1)}, {total_bytes:,} bytes)")

        if args.val_tokens is not None:
            val = args.val_tokens
        else:
            frac = 0.05 if args.val_fraction is None else args.val_fraction
            val = max(1, round(frac * total)) if frac > 0 else 0
        if total - val < 2:  # a training window is at least one input and one target
            raise PrepError(f"the validation split ({val:,} tokens) leaves {max(0, total - val):,} training "
                            f"tokens of {total:,}; need at least 2 (lower --val-tokens or --val-fraction)")
        if val > MAX_FILE_TOKENS:
            raise PrepError(f"the validation split ({val:,} tokens) is more than a token file holds "
                            f"({MAX_FILE_TOKENS:,}); lower --val-tokens or --val-fraction")

        stream = np.memmap(stream_path, dtype="<u2", mode="r")
        shards = (total - val + args.shard_tokens - 1) // args.shard_tokens
        print("writing")
        if val:
            paths.append(shard_path(out_dir, name, "val", 0))
            write_token_file(paths[-1], stream, 0, val)
        for i in range(shards):
            begin = val + i * args.shard_tokens
            paths.append(shard_path(out_dir, name, "train", i + 1))
            write_token_file(paths[-1], stream, begin, min(total, begin + args.shard_tokens))
        del stream
        install(out_dir, name, paths, val > 0, shards)
    finally:
        for path in ([stream_path] if stream_path else []) + [staged_path(p) for p in paths]:
            if os.path.exists(path):
                os.remove(path)
        if created and os.path.isdir(out_dir) and not os.listdir(out_dir):
            os.rmdir(out_dir)  # a failed run leaves no empty folder behind
    if write_tok:
        write_tokenizer(enc, args.tokenizer_out)
        print(f"  tokenizer -> {args.tokenizer_out}")
    print(f"done: {stats['documents']:,} documents, {total:,} tokens: val {val:,}, train {total - val:,} "
          f"in {shards:,} shard{'s' * (shards != 1)} ({time.time() - started:.1f} s)")


if __name__ == "__main__":
    exit_on_signals()
    try:
        main()
    except (PrepError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
