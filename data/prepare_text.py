"""Tokenizes your own text or a corpus with GPT-2's BPE into llm.c's token files, ready for train_gpt.

    python data/prepare_text.py INPUT [INPUT ...] [--out-dir DIR] [--name NAME] [--glob PATTERN ...]
        [--text-field FIELD] [--split-docs file|blankline|line | --doc-separator STRING]
        [--val-fraction F | --val-tokens N] [--shard-tokens N] [--workers N] [--skip-bad-files]
        [--tokenizer-out FILE]

INPUT: a file; a folder, searched recursively for files named like --glob (default *.txt; repeat
--glob for several patterns), taken in sorted path order; or a quoted glob pattern ("data/*.jsonl").
A path that exists is always taken as itself, even if it holds glob characters. The file's name says
what it holds:
  *.txt, any other name      UTF-8 text
  *.jsonl, *.json, *.ndjson  JSON lines: an object a line, whose --text-field (default "text") is one
                             document; other fields are ignored
  *.parquet                  Parquet: the --text-field column, a row a document, read a row batch at a
                             time (needs pyarrow)
  *.arrow                    Arrow IPC, stream or file format: the --text-field column, a row a document
                             (needs pyarrow)
  *.gz                       gzip of text or of JSON lines (*.txt.gz, *.jsonl.gz), decompressed as read
A folder that Hugging Face `datasets` wrote with save_to_disk (state.json, dataset_info.json,
data-*.arrow) is that dataset: its Arrow files in its own order, the `datasets` package not needed.
A DatasetDict's folder (dataset_dict.json) holds one such folder per split: give the split's folder.
GPT-2's BPE files come from $GPT_MIRROR/gpt2/ if set, else data/mirror/gpt2/ (where
data/prepare_tinyshakespeare.py puts them); nothing is downloaded.

Documents: every document is preceded by <|endoftext|> (50256). A record (a JSON line, a Parquet or
Arrow row) is one document. A text file always ends a document, and within it:
  --split-docs file       each file is one document (default)
  --split-docs blankline  each blank-line ("\\n\\n") separated section is one, its "\\n\\n" kept at its
                          end (Tiny Shakespeare's recipe: data/prepare_tinyshakespeare.py)
  --split-docs line       each line is one, its "\\n" kept (plain text, one document a line)
  --doc-separator STRING  documents separated by STRING, which is dropped (e.g. '<|endoftext|>';
                          in bash $'\\n---\\n' for a newline)
Documents that are empty or whitespace only (a null field too) are skipped. Text is encoded as
ordinary text: a literal "<|endoftext|>" inside a document stays text, it does not become token 50256.
A file holding NUL characters is read, with a warning: it is likely not text.

Bad files: a file that is not what its name says (not UTF-8, a line that is not a JSON object, no
--text-field, damaged gzip, Parquet or Arrow) ends the run with one error line naming it. With
--skip-bad-files it is skipped instead, named in a warning, and whatever of it was already encoded is
taken back out: the files are those of a run without it.

Split: validation = the FIRST tokens of the stream (deterministic; a document may straddle the
boundary), --val-tokens N exactly, or --val-fraction F (default 0.05): round(F * all tokens), at
least 1 (0 = no validation file). The rest is training data, in shards of --shard-tokens (default
100M) tokens. train_gpt validates with T+1 tokens: a validation split shorter than GPT-2's 1025 is
written with a warning that names the largest -t it supports.

Outputs (llm.c's naming, so a glob like DIR/NAME_train_*.bin takes every shard):
  DIR/NAME_val_000000.bin, DIR/NAME_train_000001.bin, DIR/NAME_train_000002.bin, ...
      256 x int32 header (magic 20240520, version 1, token count), then the tokens as uint16.
      DIR defaults to data/NAME, NAME to the first input's name without its extensions, with any of
      the glob characters [ ] * ? made "_" (so that the glob takes these files and no other). An
      earlier run's files are replaced as a set (its shards beyond this run's count deleted), so the
      glob sees one run only; if the run is stopped while replacing them, NAME_train_000001.bin is a
      placeholder that train_gpt rejects (not a token file): run the script again.
  data/gpt2_tokenizer.bin (--tokenizer-out), if missing: the tokenizer file train_gpt prints with.

Streams: files are read in blocks (text), lines (JSON lines) or row batches (Parquet, Arrow); a long
document is cut into pieces where GPT-2's pre-tokenizer cuts anyway (the tokens equal those of the
whole text at once). --workers N processes (default: the cores this process may use) encode tasks of
about 1M characters while this process reads, and their tokens are written in input order: the files
are the same bytes for any N. The token stream goes to a temporary file in DIR (2 bytes a token), then
into the new files, under temporary names until all are written. Memory stays bounded whatever the
input size: about 2 tasks a worker in flight, a read block, a row batch (a Parquet row group's text
column at most), and the longest JSON line. A progress line gives the share of the input bytes
read, tokens/s and the time left. Temporary files of an earlier run that was killed are removed.
"""

import argparse
import collections
import fnmatch
import glob
import gzip
import json
import multiprocessing
import os
import re
import shlex
import signal
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

try:
    import numpy as np
except ImportError as e:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "data/prepare_text.py")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bpe import (EOT, Parser, PrepError, atomic_write, error_text, exit_on_signals, fsync_folder,  # noqa: E402
                      local_encoding, plural, regular_file, token_file_header, tokenizer_file_ok, utf8_line,
                      write_tokenizer)

READ_BYTES = 1 << 20        # bytes read from a text file at a time
PIECE_CHARS = 1 << 20       # a document longer than this is encoded in pieces of about this size
TASK_CHARS = 1 << 20        # characters handed to a worker at a time
TASKS_PER_WORKER = 2        # tasks in flight per worker: it never waits for the next, memory stays bounded
ROWS_PER_BATCH = 1024       # Parquet / Arrow rows turned into Python strings at a time
COPY_TOKENS = 1 << 24       # tokens copied from the stream into a shard at a time
MAX_FILE_TOKENS = 2**31 - 1  # the int32 token count of the header
GPT2_T = 1024               # GPT-2's context: train_gpt's default -t
GLOB_CHARS = "[]*?"
PROGRESS_SECONDS = 1.0 if sys.stdout.isatty() else 30.0  # between progress lines


class BadFile(PrepError):
    """A file that is not what its name says: --skip-bad-files skips it, else the run ends."""


# ---------------------------------------------------------------------------------------------------
# Inputs: which files, in which order, and what each holds

class Input:
    """One file to read: its path, what it holds (text, jsonl, parquet, arrow) and whether gzipped."""
    def __init__(self, path, kind, gz):
        self.path, self.kind, self.gz = path, kind, gz
        self.size = os.path.getsize(path)


def file_kind(path):
    """(kind, gzipped) from the file's name."""
    name = os.path.basename(path).lower()
    gz = name.endswith(".gz")
    base = name[:-3] if gz else name
    if base.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl", gz
    for ext in (".parquet", ".arrow"):
        if base.endswith(ext):
            if gz:
                raise PrepError(f"'{path}': a gzipped {ext[1:].title()} file is not read (it compresses "
                                f"itself): decompress it first")
            return ext[1:], False
    return "text", gz


def stem(path):
    """The file's or folder's name without its extensions (.txt, .jsonl.gz, ...); for a glob pattern,
    that of the folder above its first glob character (the current folder's if none)."""
    if not os.path.lexists(path):
        while any(c in path for c in GLOB_CHARS):
            path = os.path.dirname(path)
        path = path or os.getcwd()
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        return name
    if name.lower().endswith(".gz"):
        name = name[:-3]
    return os.path.splitext(name)[0]


def hf_dataset_files(folder):
    """The Arrow files of a folder written by `datasets`' save_to_disk, in the dataset's order; None if
    the folder is not one. A DatasetDict's folder is an error that names its splits."""
    state = os.path.join(folder, "state.json")
    info = os.path.join(folder, "dataset_info.json")
    dict_json = os.path.join(folder, "dataset_dict.json")
    if not (os.path.isfile(state) and os.path.isfile(info)):
        if os.path.isfile(dict_json):
            try:
                with open(dict_json, encoding="utf-8") as f:
                    splits = [str(s) for s in json.load(f)["splits"]]
            except (OSError, ValueError, KeyError, TypeError):
                splits = []
            raise PrepError(f"'{folder}' is a Hugging Face DatasetDict (splits: {', '.join(splits) or '?'}): "
                            f"give one split's folder, e.g. '{os.path.join(folder, (splits or ['train'])[0])}'")
        return None
    try:
        with open(state, encoding="utf-8") as f:
            names = [d["filename"] for d in json.load(f)["_data_files"]]
        if not all(isinstance(n, str) and n and os.sep not in n for n in names):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise PrepError(f"'{state}' is not a `datasets` state file (expected a list _data_files of "
                        f"{{\"filename\": ...}})")
    return [os.path.join(folder, n) for n in names]


def folder_files(folder, patterns):
    """Files under `folder` named like any of `patterns`, recursively, sorted by path."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, n) for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
    if not found:
        kinds = collections.Counter()
        for root, dirs, names in os.walk(folder):
            for n in names:
                ext = ".".join(n.split(".")[-2:]) if n.endswith(".gz") else n.rsplit(".", 1)[-1]
                if ext != n:
                    kinds["*." + ext] += 1
        seen = ", ".join(f"{c} {k}" for k, c in kinds.most_common(4))
        hint = f"; it holds {seen} (--glob '{kinds.most_common(1)[0][0]}' takes those)" if kinds else ""
        raise PrepError(f"folder '{folder}' holds no file named like "
                        f"{' or '.join(repr(p) for p in patterns)}{hint}")
    return sorted(found)


def input_files(inputs, patterns):
    """Inputs in argument order; a folder contributes its files (or a `datasets` folder its Arrow
    files), a glob pattern that is not a path its matches. The same file twice counts once. Each
    must be a regular file (links followed)."""
    files, seen = [], set()
    for arg in inputs:
        if os.path.lexists(arg) or not any(c in arg for c in GLOB_CHARS):
            paths = [arg]
        else:
            paths = sorted(glob.glob(arg))
            if not paths:
                raise PrepError(f"input '{arg}' not found, and as a glob pattern it matches nothing")
        for path in paths:
            if os.path.isdir(path):
                chosen = hf_dataset_files(path) or folder_files(path, patterns)
            else:
                chosen = [path]
            for f in chosen:
                if not regular_file(f):
                    raise PrepError(f"input '{f}' not found")
                if os.path.realpath(f) not in seen:
                    seen.add(os.path.realpath(f))
                    files.append(Input(f, *file_kind(f)))
    return files


# ---------------------------------------------------------------------------------------------------
# Reading: each kind of file as fragments (a new document starts here, text)

def open_binary(inp):
    """(raw file, the stream to read): the raw file's position is the bytes read, for progress."""
    try:
        raw = open(inp.path, "rb")
    except OSError as e:
        raise BadFile(f"'{inp.path}' cannot be read ({e.strerror})")
    return raw, (gzip.GzipFile(fileobj=raw, mode="rb") if inp.gz else raw)


def read_guarded(inp, read):
    """read() with a damaged gzip stream or a read error reported as this file's fault."""
    try:
        return read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise BadFile(f"'{inp.path}' is not valid gzip data ({e})")
    except OSError as e:
        raise BadFile(f"'{inp.path}' cannot be read ({e.strerror or e})")


def read_text(inp, progress):
    """Yields the file's text in blocks, decoded as strict UTF-8; a bad byte is an error that says
    where. A leading byte-order mark is dropped."""
    consumed, lines, carry = 0, 0, b""  # bytes before `carry`, newlines in them, an unfinished char
    raw, f = open_binary(inp)
    with raw, f:
        while True:
            data = read_guarded(inp, lambda: f.read(READ_BYTES))
            progress.at(raw.tell())
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
                where = " of the decompressed text" if inp.gz else ""
                raise BadFile(f"'{inp.path}' is not UTF-8 text: byte 0x{buf[e.start]:02x} at offset "
                              f"{consumed + e.start:,}{where} (line {line:,}) ({e.reason})")
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


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


def read_jsonl(inp, field, counts, progress):
    """Yields (True, text) for each line's `field`. Blank lines are passed over; a null or empty field
    is an empty document (counted, skipped)."""
    raw, f = open_binary(inp)
    with raw, f:
        lines = iter(lambda: read_guarded(inp, f.readline), b"")
        for n, line in enumerate(lines, 1):
            if n % 1024 == 0:
                progress.at(raw.tell())
            text = utf8_line(inp.path, n, line, BadFile)
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                hint = (": the file holds one JSON array, not JSON lines (an object a line)"
                        if n == 1 and text.lstrip().startswith("[") else f" ({e.msg} at column {e.colno:,})")
                raise BadFile(f"'{inp.path}' line {n:,} is not JSON{hint}")
            if not isinstance(record, dict):
                raise BadFile(f"'{inp.path}' line {n:,} is {JSON_TYPES.get(type(record), 'a value')}, "
                              f"not a JSON object")
            if field not in record:
                keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
                raise BadFile(f"'{inp.path}' line {n:,} has no field {field!r} (its fields: {keys}; "
                              f"--text-field names the text's)")
            value = record[field]
            if not isinstance(value, (str, type(None))):
                raise BadFile(f"'{inp.path}' line {n:,}: field {field!r} is {JSON_TYPES.get(type(value), 'a value')}, "
                              f"not a string")
            if value:
                yield True, value
            else:
                counts["skipped"] += 1
        progress.at(raw.tell())


def import_pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise PrepError("reading Parquet or Arrow files needs pyarrow: pip install pyarrow "
                        "(scripts/setup_python.sh installs it)")
    return pyarrow


def text_column(pa, schema, field, inp):
    """Index of the string column `field` in `schema`."""
    if field not in schema.names:
        names = ", ".join(repr(n) for n in schema.names[:8]) or "none"
        raise BadFile(f"'{inp.path}' has no column {field!r} (its columns: {names}; --text-field names "
                      f"the text's)")
    t = schema.field(field).type
    strings = (pa.types.is_string(t) or pa.types.is_large_string(t)
               or getattr(pa.types, "is_string_view", lambda t: False)(t))
    if not strings:
        raise BadFile(f"'{inp.path}': column {field!r} holds {t}, not strings")
    return schema.get_field_index(field)


def records_of(batches, column, counts):
    """(True, text) for each row of the record batches; a null or empty value is skipped, counted."""
    for batch in batches:
        for value in batch.column(column).to_pylist():
            if value:
                yield True, value
            else:
                counts["skipped"] += 1


def read_parquet(inp, field, counts, progress):
    """The `field` column, a row group at a time, ROWS_PER_BATCH rows of it at a time. (Iterating the
    whole file at once pre-buffers every row group's column chunk: the whole column in memory.)"""
    pa = import_pyarrow()
    try:
        pf = pa.parquet.ParquetFile(inp.path)
        text_column(pa, pf.schema_arrow, field, inp)
        rows, done = max(1, pf.metadata.num_rows), 0
        for group in range(pf.metadata.num_row_groups):
            for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=[field], row_groups=[group]):
                yield from records_of([batch], 0, counts)
                done += batch.num_rows
                progress.at(inp.size * done // rows)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BadFile(f"'{inp.path}' is not a readable Parquet file ({e})")


def read_arrow(inp, field, counts, progress):
    """The `field` column of an Arrow IPC file: the stream format (what `datasets` writes) batch by
    batch, or the file format ("ARROW1" magic)."""
    pa = import_pyarrow()
    try:
        with pa.OSFile(inp.path) as source:
            file_format = source.read(6) == b"ARROW1"
            source.seek(0)
            if file_format:
                reader = pa.ipc.open_file(source)
                n = reader.num_record_batches
                batches = (reader.get_batch(i) for i in range(n))
            else:
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
            column = text_column(pa, reader.schema, field, inp)
            for i, batch in enumerate(batches, 1):
                yield from records_of([batch], column, counts)
                progress.at(inp.size * i // n if file_format else source.tell())
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BadFile(f"'{inp.path}' is not a readable Arrow IPC file ({e})")


def fragments(inp, args, separator, keep, counts, progress):
    if inp.kind == "text":
        return split_documents(read_text(inp, progress), separator, keep)
    read = {"jsonl": read_jsonl, "parquet": read_parquet, "arrow": read_arrow}[inp.kind]
    return read(inp, args.text_field, counts, progress)


# ---------------------------------------------------------------------------------------------------
# Documents to pieces, pieces to tasks

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


def document_pieces(frags, counts):
    """Yields (document starts here, text) pieces to encode from one file's fragments: a document's
    text is held until it shows a non-whitespace character (a whitespace-only document is skipped,
    counted), then passed on in pieces cut where safe_cut finds a place."""
    piece, piece_starts, shown, in_doc = "", False, False, False

    def end_of_document():
        if shown and piece:
            return piece_starts, piece
        if in_doc and not shown and piece:
            counts["skipped"] += 1
        return None

    for starts, text in frags:
        counts["chars"] += len(text)
        counts["nuls"] += text.count("\0")
        if starts:
            done = end_of_document()
            if done:
                yield done
            piece, piece_starts, shown, in_doc = "", True, False, True
        piece += text
        if not shown:
            if not text or text.isspace():
                continue
            shown = True
            counts["documents"] += 1
        if len(piece) > PIECE_CHARS:
            cut = safe_cut(piece)
            if cut:
                yield piece_starts, piece[:cut]
                piece, piece_starts = piece[cut:], False
    done = end_of_document()
    if done:
        yield done


class Task:
    """Pieces encoded together by one worker; file_starts: (piece index, file index) for each file
    whose first piece is here (or would be: a file with no text ends at the same index)."""
    def __init__(self):
        self.pieces, self.chars, self.file_starts = [], 0, []


class Skipped:
    """A bad file skipped: the tokens written since its start are taken back out."""
    def __init__(self, index, reason):
        self.index, self.reason = index, reason


def tasks(files, args, separator, keep, counts, progress):
    """Yields Tasks of about TASK_CHARS characters in input order, and a Skipped after a bad file's
    last Task when --skip-bad-files."""
    task = Task()
    for index, inp in enumerate(files):
        progress.start_file(inp)
        task.file_starts.append((len(task.pieces), index))
        before = dict(counts)
        try:
            for piece in document_pieces(fragments(inp, args, separator, keep, counts, progress), counts):
                task.pieces.append(piece)
                task.chars += len(piece[1])
                if task.chars >= TASK_CHARS:
                    yield task
                    task = Task()
        except BadFile as e:
            if not args.skip_bad_files:
                if len(files) > 1:
                    raise BadFile(f"{e} (--skip-bad-files skips such files)")
                raise
            for key, value in before.items():  # as if the file had not been read
                counts[key] = value
            counts["bad_files"] += 1
            yield task
            task = Task()
            yield Skipped(index, str(e))
            continue
        if counts["nuls"] > before["nuls"]:
            progress.warn(f"'{inp.path}' holds {plural(counts['nuls'] - before['nuls'], 'NUL character')}: "
                          f"is it text? (encoded as it is)")
    if task.pieces or task.file_starts:
        yield task


# ---------------------------------------------------------------------------------------------------
# Encoding: in this process, or in worker processes with the results taken in input order

WORKER_ENCODING = None


def init_worker():
    global WORKER_ENCODING
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent cleans up
    WORKER_ENCODING = local_encoding()


def submit(pool, task):
    """pool.submit, which may start a worker process, shielded from signals. SIGINT is blocked in this
    thread meanwhile, and a worker started inherits the block: a Ctrl-C to the process group during
    its start-up (before init_worker) cannot end it with a traceback. And this process handles
    SIGINT, SIGTERM and SIGHUP only once the start is complete: cut short, it would leave the new
    process reading half of its start-up data (a traceback there too)."""
    caught = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s, handler in handlers.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(s, lambda signum, frame: caught.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(encode_pieces, task.pieces)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for s, handler in handlers.items():
            if handler not in (signal.SIG_IGN, None):
                signal.signal(s, handler)
        if caught:
            handler = handlers[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            else:  # SIG_DFL: the signal's own action
                os.kill(os.getpid(), caught[0])


def encode_pieces(pieces, enc=None):
    """(uint16 tokens, tokens per piece): EOT before each document's first piece, then its text
    encoded as ordinary text."""
    enc = enc or WORKER_ENCODING
    out, lengths = [], []
    for starts, text in pieces:
        if starts:
            out.append(EOT)
        tokens = enc.encode_ordinary(text)
        out.extend(tokens)
        lengths.append(len(tokens) + starts)
    return np.array(out, dtype="<u2"), lengths


def encoded(items, enc, workers):
    """Yields (item, tokens, tokens per piece) for each Task of `items` and (item, None, None) for a
    Skipped, in input order. With several workers the pool starts at the second task (a small input
    never starts one), and at most TASKS_PER_WORKER tasks a worker are in flight."""
    def here(item):
        return (item, *encode_pieces(item.pieces, enc)) if isinstance(item, Task) else (item, None, None)

    def taken(item, future):
        if future is None:
            return item, None, None
        try:
            return (item, *future.result())
        except BrokenProcessPool:
            raise PrepError("a worker process ended unexpectedly (out of memory? try fewer --workers)")

    if workers == 1:
        for item in items:
            yield here(item)
        return
    held, window, pool = [], collections.deque(), None  # held: items not yet handed to the pool
    try:
        for item in items:
            held.append(item)
            if pool is None:
                if sum(isinstance(i, Task) for i in held) < 2:
                    continue
                pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=init_worker)
            for i in held:
                window.append((i, submit(pool, i) if isinstance(i, Task) else None))
            held.clear()
            while len(window) > TASKS_PER_WORKER * workers:
                yield taken(*window.popleft())
        for item in held:  # the pool never started: one task at most
            yield here(item)
        while window:
            yield taken(*window.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------
# Progress

def duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """The share of the input bytes read, tokens/s and the time left: a line every PROGRESS_SECONDS,
    rewritten in place on a terminal."""
    def __init__(self, files):
        self.total = max(1, sum(f.size for f in files))
        self.base, self.pos, self.size = 0, 0, 0  # bytes of the files before this one; in this one
        self.started = self.last = time.time()
        self.tty = sys.stdout.isatty()
        self.open_line = False

    def start_file(self, inp):
        self.base += self.size
        self.pos, self.size = 0, inp.size

    def at(self, pos):
        self.pos = min(pos, self.size)

    def show(self, tokens):
        now = time.time()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        share = (self.base + self.pos) / self.total
        elapsed = now - self.started
        left = f"{duration(elapsed * (1 - share) / share)} left" if share > 0 else "time left unknown"
        line = (f"  {100 * share:5.1f}% of {self.total:,} bytes read, {tokens:,} tokens, "
                f"{tokens / max(elapsed, 1e-9):,.0f} tokens/s, {left}")
        if self.tty:
            print("\r" + line + "\x1b[K", end="", flush=True)
            self.open_line = True
        else:
            print(line, flush=True)

    def end_line(self):
        if self.open_line:
            print(flush=True)
            self.open_line = False

    def warn(self, message):
        self.end_line()
        print(f"warning: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Outputs

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
    """Tokens [begin, end) of the token stream (its file, open) as an llm.c token file, atomically,
    under its staged name. Read COPY_TOKENS at a time with pread: a memory map would count the whole
    stream in this process's resident memory."""
    def chunks():
        yield token_file_header(end - begin)
        for at in range(begin, end, COPY_TOKENS):
            size = 2 * (min(end, at + COPY_TOKENS) - at)
            data = os.pread(stream.fileno(), size, 2 * at)
            if len(data) != size:
                raise PrepError(f"the token stream {stream.name} is shorter than written (was it changed?)")
            yield data
    atomic_write(staged_path(path), chunks())
    print(f"  {plural(end - begin, 'token')} -> {path}")


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


def make_out_dir(out_dir):
    """Creates the output folder; a file in its place, or a folder that cannot be made, is a bad flag."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepError(f"--out-dir '{out_dir}' is a file, not a folder")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise PrepError(f"--out-dir '{out_dir}': cannot make the folder ({e.strerror})")


def validation_warning(val):
    """train_gpt validates on sequences of T+1 tokens: the largest -t a validation split supports."""
    if not 0 < val <= GPT2_T:
        return None
    fix = f"--val-tokens {GPT2_T + 1} or more gives -t {GPT2_T} (the default), or train with -v 0"
    if val == 1:
        return f"the validation split holds 1 token, too few for train_gpt's validation at any -t: {fix}"
    return (f"the validation split holds {val:,} tokens: train_gpt validates on it with -t {val - 1} at most "
            f"(it needs T+1 tokens); {fix}")


# ---------------------------------------------------------------------------------------------------

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


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="Details: the top of data/prepare_text.py.")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files (text, JSON lines, Parquet, Arrow, gzip), folders, or glob patterns")
    p.add_argument("--out-dir", metavar="DIR", help="output folder (default: data/NAME)")
    p.add_argument("--name", help="output file prefix (default: the first input's name without extensions)")
    p.add_argument("--glob", action="append", metavar="PATTERN",
                   help="file names taken from folders, in every subfolder; repeat for several (default: *.txt)")
    p.add_argument("--text-field", default="text", metavar="FIELD",
                   help="the field (JSON lines) or column (Parquet, Arrow) holding the text (default: text)")
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--split-docs", choices=["file", "blankline", "line"],
                      help="what one document of a text file is (default: file)")
    docs.add_argument("--doc-separator", metavar="STRING", help="text files' documents separated by STRING (dropped)")
    val = p.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=fraction, metavar="F",
                     help="validation = the first round(F * tokens) tokens, at least 1 (default 0.05)")
    val.add_argument("--val-tokens", type=positive_int, metavar="N", help="validation = the first N tokens")
    p.add_argument("--shard-tokens", type=positive_int, default=100_000_000, metavar="N",
                   help="tokens per training shard (default 100,000,000)")
    p.add_argument("--workers", type=positive_int, default=usable_cores(), metavar="N",
                   help=f"encoding processes; the files are the same for any N (default: the cores, {usable_cores()})")
    p.add_argument("--skip-bad-files", action="store_true",
                   help="skip a file that is not what its name says (named in a warning) instead of stopping")
    p.add_argument("--tokenizer-out", default=os.path.join(HERE, "gpt2_tokenizer.bin"), metavar="FILE",
                   help="tokenizer file, written if missing (default: data/gpt2_tokenizer.bin)")
    args = p.parse_args(argv)

    if not 1 <= args.shard_tokens <= MAX_FILE_TOKENS:
        raise PrepError(f"--shard-tokens must be in [1, {MAX_FILE_TOKENS}], got {args.shard_tokens}")
    if args.workers < 1:
        raise PrepError("--workers must be at least 1")
    if args.doc_separator == "":
        raise PrepError("--doc-separator must not be empty")
    if not args.text_field:
        raise PrepError("--text-field must not be empty")
    split_docs = args.split_docs or "file"
    separator, keep = {"file": (None, True), "blankline": ("\n\n", True), "line": ("\n", True)}[split_docs]
    if args.doc_separator is not None:
        separator, keep = args.doc_separator, False
    files = input_files(args.inputs, args.glob or ["*.txt"])
    if (args.split_docs or args.doc_separator is not None) and not any(f.kind == "text" for f in files):
        flag = "--split-docs" if args.split_docs else "--doc-separator"
        raise PrepError(f"{flag} splits text files, and no input is one: each record of a JSON lines, "
                        f"Parquet or Arrow file is a document already")
    if any(f.kind in ("parquet", "arrow") for f in files):
        import_pyarrow()  # checked now: a missing package fails before any work
    if args.name is not None:
        name = args.name
        if any(c in name for c in GLOB_CHARS):
            raise PrepError(f"--name '{name}' holds a glob character ({' '.join(GLOB_CHARS)}): the glob "
                            f"NAME_train_*.bin would not take its files; choose another")
    else:
        name = re.sub(r"[\[\]*?]", "_", stem(args.inputs[0]))
    if not name or os.sep in name or name in (".", ".."):
        raise PrepError(f"--name: '{name}' is not a file name")
    out_dir = args.out_dir or os.path.join(HERE, name)
    write_tok = not tokenizer_file_ok(args.tokenizer_out)  # checked now: a FIFO there fails before any work
    kinds = collections.Counter(f.kind + (".gz" if f.gz else "") for f in files)
    what = ", ".join(f"{c:,} {k}" for k, c in sorted(kinds.items()))
    how = (f"separated by {args.doc_separator!r}" if args.doc_separator is not None else
           {"file": "one per file", "blankline": "one per blank-line separated section",
            "line": "one per line"}[split_docs])
    records = "a record each" if any(f.kind != "text" for f in files) else ""
    how = ", ".join(x for x in (records, how if any(f.kind == "text" for f in files) else "") if x)
    print(f"inputs: {plural(len(files), 'file')} ({what}), {plural(sum(f.size for f in files), 'byte')}; "
          f"documents: {how}; {plural(args.workers, 'worker')}")

    enc = local_encoding()
    created = not os.path.isdir(out_dir)
    stream_path = None
    paths = []  # this run's outputs, staged until all are written
    try:  # everything from the folder's creation on, so that a failure or a signal cleans up after it
        make_out_dir(out_dir)
        for path in leftovers(out_dir, name):
            os.remove(path)
            print(f"  removed {path} (left by a killed run)")
        # Named before it is made, so that a signal at any instant leaves a path the cleanup knows.
        stream_path = os.path.join(out_dir, f".{name}.tokens.tmp.{os.getpid()}")
        fd = os.open(stream_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        counts = collections.Counter(documents=0, chars=0, skipped=0, nuls=0, bad_files=0)
        progress = Progress(files)
        total, file_begin, started = 0, 0, time.time()  # file_begin: stream offset where the current file began
        with os.fdopen(fd, "wb") as f:
            for item, tokens, lengths in encoded(tasks(files, args, separator, keep, counts, progress),
                                                 enc, args.workers):
                if isinstance(item, Skipped):
                    f.seek(2 * file_begin)
                    f.truncate()
                    total = file_begin
                    progress.warn(f"skipped {item.reason}")
                    continue
                offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
                for piece_index, _ in item.file_starts:
                    file_begin = total + int(offsets[piece_index])
                f.write(tokens.tobytes())
                total += len(tokens)
                progress.show(total)
        progress.end_line()
        skipped = f", {counts['skipped']:,} empty or whitespace-only skipped" if counts["skipped"] else ""
        print(f"  {plural(counts['documents'], 'document')}{skipped}, {plural(counts['chars'], 'character')}, "
              f"{plural(total, 'token')}")
        if counts["bad_files"]:
            print(f"  {plural(counts['bad_files'], 'bad file')} of {len(files):,} skipped (--skip-bad-files)")
        if total == 0:
            raise PrepError(f"no text in the input{'s' * (len(files) != 1)} ({plural(len(files), 'file')}, "
                            f"{plural(sum(f.size for f in files), 'byte')}"
                            f"{', ' + str(counts['bad_files']) + ' skipped as bad' if counts['bad_files'] else ''})")

        if args.val_tokens is not None:
            val = args.val_tokens
        else:
            frac = 0.05 if args.val_fraction is None else args.val_fraction
            val = max(1, round(frac * total)) if frac > 0 else 0
        if total - val < 2:  # a training window is at least one input and one target
            raise PrepError(f"the validation split ({plural(val, 'token')}) leaves "
                            f"{plural(max(0, total - val), 'training token')} of {total:,}; need at least 2 "
                            f"(lower --val-tokens or --val-fraction)")
        if val > MAX_FILE_TOKENS:
            raise PrepError(f"the validation split ({val:,} tokens) is more than a token file holds "
                            f"({MAX_FILE_TOKENS:,}); lower --val-tokens or --val-fraction")
        warning = validation_warning(val)
        if warning:
            progress.warn(warning)

        shards = (total - val + args.shard_tokens - 1) // args.shard_tokens
        print("writing")
        with open(stream_path, "rb") as stream:
            if val:
                paths.append(shard_path(out_dir, name, "val", 0))
                write_token_file(paths[-1], stream, 0, val)
            for i in range(shards):
                begin = val + i * args.shard_tokens
                paths.append(shard_path(out_dir, name, "train", i + 1))
                write_token_file(paths[-1], stream, begin, min(total, begin + args.shard_tokens))
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
    print(f"done: {plural(counts['documents'], 'document')}, {plural(total, 'token')}: val {val:,}, "
          f"train {total - val:,} in {plural(shards, 'shard')} ({time.time() - started:.1f} s)")
    shown_dir = os.path.relpath(out_dir) if not os.path.relpath(out_dir).startswith("..") else out_dir
    train_glob = os.path.join(glob.escape(shown_dir), f"{name}_train_*.bin")
    print(f"train on them: ./train_gpt_bf16 -i {shlex.quote(train_glob)}{' -v 0' if not val else ''} ...")


if __name__ == "__main__":
    exit_on_signals()
    try:
        main()
    except (PrepError, OSError) as e:
        print(f"error: {error_text(e)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: the temporary files are gone (the finally blocks ran)
        sys.exit(130)
