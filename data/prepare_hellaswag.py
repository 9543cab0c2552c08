"""Turns HellaSwag's JSON lines (hellaswag_val.jsonl, which you download) into llm.c's eval file.

    python data/prepare_hellaswag.py INPUT [--out FILE] [--force]

INPUT: the format of github.com/rowanz/hellaswag's data/hellaswag_{train,val}.jsonl, one JSON object a
line, gzipped if its name ends in .gz (hellaswag_val.jsonl.gz). Each object's fields:
  ctx      the context, a non-empty string
  endings  its 4 candidate endings, strings
  label    the right ending's index, 0 to 3 (an integer, or its digits as a string as Hugging Face's
           copy stores it)
Other fields (ind, activity_label, ctx_a, ctx_b, split, ...) are ignored; blank lines are passed over.
The test split has no labels: it cannot be scored. Nothing is downloaded, not even GPT-2's BPE files:
they come from $GPT_MIRROR/gpt2/ if set, else data/mirror/gpt2/ (where
data/prepare_tinyshakespeare.py puts them).

Tokens as llm.c's dev/data/hellaswag.py makes them: the context is GPT-2's BPE of ctx, each completion
that of " " + ending (a space first: in the text an ending follows the context after a space). Text is
encoded as ordinary text (a literal "<|endoftext|>" stays text). Example i (its position among the
examples, from 0) gets index i.

Output (default data/hellaswag/NAME.bin, NAME the input's name without .jsonl / .gz): llm.c's eval
file, data/eval_file.py's layout (magic 20240522, version 1), written to a temporary file and renamed
into place. An existing output is replaced only with --force; the input itself never. train_gpt and
`gpt_reference.py eval -e CHECKPOINT --hellaswag FILE` score it.

Every bad input (a line that is not a JSON object, a missing or ill-typed field, a label out of range,
an example too long for the format's uint16 sizes, damaged gzip, text that is not UTF-8) ends the run
with one `error:` line naming the line, and exit code 1; no output is written.
"""

import gzip
import json
import os
import shlex
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:  # both need numpy
    from eval_file import EvalFileError, eval_file_chunks, example_words
    from gpt2_bpe import (Parser, PrepError, atomic_write, error_text, exit_on_signals, local_encoding, plural,
                          regular_file, utf8_line)
except ImportError as e:  # a Python without it: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "data/prepare_hellaswag.py")

COMPLETIONS = 4  # HellaSwag's endings; llm.c's readers of this format expect 4


def default_out(path):
    name = os.path.basename(path)
    for ext in (".gz", ".jsonl", ".json", ".ndjson"):
        if name.lower().endswith(ext) and len(name) > len(ext):
            name = name[:-len(ext)]
    return os.path.join(HERE, "hellaswag", name + ".bin")


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def read_lines(path):
    """Yields (line number, text) for each line, decompressed where the name ends in .gz; damaged
    gzip or bytes that are not UTF-8 are an error naming the line."""
    raw = open(path, "rb")
    f = gzip.GzipFile(fileobj=raw, mode="rb") if path.lower().endswith(".gz") else raw
    with raw, f:
        n = 0
        while True:
            try:
                line = f.readline()
            except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                raise PrepError(f"'{path}' is not valid gzip data ({e})")
            if not line:
                return
            n += 1
            yield n, utf8_line(path, n, line)


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
              bool: "a boolean", type(None): "null"}


def kind(value):
    return JSON_TYPES.get(type(value), "a value")


def parse_example(record, where):
    """(ctx, endings, label) of one JSON object; PrepError naming `where` if a field is missing or
    not what HellaSwag's format says."""
    if not isinstance(record, dict):
        raise PrepError(f"{where} is {kind(record)}, not a JSON object")
    for field in ("ctx", "endings", "label"):
        if field not in record:
            keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
            hint = " (HellaSwag's test split has no labels: it cannot be scored)" if field == "label" else ""
            raise PrepError(f"{where} has no field {field!r} (its fields: {keys}){hint}")
    ctx, endings, label = record["ctx"], record["endings"], record["label"]
    if not isinstance(ctx, str):
        raise PrepError(f"{where}: ctx is {kind(ctx)}, not a string")
    if not ctx:
        raise PrepError(f"{where}: ctx is empty (the completions' scores need a context to follow)")
    if not isinstance(endings, list) or not all(isinstance(e, str) for e in endings):
        what = kind(endings) if not isinstance(endings, list) else "a list holding " + next(
            kind(e) for e in endings if not isinstance(e, str))
        raise PrepError(f"{where}: endings is {what}, expected a list of {COMPLETIONS} strings")
    if len(endings) != COMPLETIONS:
        raise PrepError(f"{where}: {plural(len(endings), 'ending')}, expected {COMPLETIONS}")
    if isinstance(label, str) and label.isascii() and label.isdigit():
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int):
        raise PrepError(f"{where}: label is {kind(label) if not isinstance(label, str) else repr(label)}, "
                        f"expected an integer 0 to {COMPLETIONS - 1}")
    if not 0 <= label < COMPLETIONS:
        raise PrepError(f"{where}: label {label} is out of range (0 to {COMPLETIONS - 1}: the index of the "
                        f"right ending)")
    return ctx, endings, label


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="Details: the top of data/prepare_hellaswag.py.")
    p.add_argument("input", metavar="INPUT", help="HellaSwag JSON lines: hellaswag_val.jsonl (or .jsonl.gz)")
    p.add_argument("--out", "-o", metavar="FILE",
                   help="eval file to write (default: data/hellaswag/NAME.bin, NAME the input's name)")
    p.add_argument("--force", action="store_true", help="replace an existing output")
    args = p.parse_args(argv)

    path = args.input
    if not regular_file(path):
        raise PrepError(f"input '{path}' not found")
    out = args.out if args.out is not None else default_out(path)
    if not out:
        raise PrepError("--out must not be empty")
    if os.path.lexists(out) and same_file(out, path):
        raise PrepError(f"--out '{out}' is the input: write to another path")
    if os.path.isdir(out):
        raise PrepError(f"--out '{out}' is a folder")
    if os.path.lexists(out) and not args.force:
        raise PrepError(f"--out '{out}' already exists: add --force to replace it")
    above = os.path.dirname(os.path.abspath(out))
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise PrepError(f"--out '{out}' cannot be written: '{above}' is a file, not a folder")
    print(f"input: {path} ({plural(os.path.getsize(path), 'byte')})")

    enc = local_encoding()
    started = time.time()
    examples, labels = [], [0] * COMPLETIONS
    context_tokens = completion_tokens = longest_row = 0
    for n, text in read_lines(path):
        if not text.strip():
            continue
        where = f"'{path}' line {n:,}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise PrepError(f"{where} is not JSON ({e.msg} at column {e.colno:,})")
        ctx, endings, label = parse_example(record, where)
        context = enc.encode_ordinary(ctx)
        completions = [enc.encode_ordinary(" " + ending) for ending in endings]
        try:
            examples.append(example_words(len(examples), label, context, completions))
        except EvalFileError as e:
            raise PrepError(f"{where}: the example does not fit llm.c's eval file: {e}")
        labels[label] += 1
        context_tokens += len(context)
        completion_tokens += sum(len(c) for c in completions)
        longest_row = max(longest_row, len(context) + max(len(c) for c in completions))
    if not examples:
        raise PrepError(f"'{path}' holds no example (no line that is not blank)")
    try:
        chunks = eval_file_chunks(examples)
    except EvalFileError as e:
        raise PrepError(f"'{path}': {e}")
    atomic_write(out, chunks)

    longest = max(2 * len(w) for w in examples)
    print(f"  {plural(len(examples), 'example')} of {COMPLETIONS} completions; labels 0/1/2/3: "
          f"{' / '.join(f'{c:,}' for c in labels)}")
    print(f"  tokens: {context_tokens:,} of context, {completion_tokens:,} of completions; rows (context + "
          f"completion) up to {longest_row:,} tokens; examples up to {longest:,} bytes")
    shown = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else out
    print(f"done: {plural(len(examples), 'example')} -> {shown} "
          f"({plural(sum(len(c) for c in chunks), 'byte')}, {time.time() - started:.1f} s)")
    print(f"score a model on it: $(cat build/python) gpt_reference.py eval -e CHECKPOINT --hellaswag "
          f"{shlex.quote(shown)}")


if __name__ == "__main__":
    exit_on_signals()
    try:
        main()
    except (PrepError, OSError) as e:
        print(f"error: {error_text(e)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: atomic_write has removed its temporary file
        sys.exit(130)
