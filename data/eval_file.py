"""eval_file.py: llm.c's eval file (magic 20240522, version 1), the format of multiple-choice evaluations
such as HellaSwag. data/prepare_hellaswag.py writes it, train_gpt (evaluation.h) and gpt_reference.py
eval read it.

  example_words(index, label, context, completions)  one example as its uint16 words
  eval_file_chunks(examples_words)                   the header, then the examples: what a file holds
  read_eval_file(path, vocab=None)                   [EvalExample], checked as evaluation.h checks it

Layout: data/file_formats.py's EVAL_FILE header (256 int32: magic, version, examples,
longest_example_bytes), then each example as a run of uint16 words:
  65535 (start), the example's size in bytes (these words included), its index, its label (the right
  completion), the number of completions K, the context's length and tokens, then K times a
  completion's length and tokens.
A size is a uint16, so an example holds at most 32,767 words; a token is below 65535. numpy only.
"""
import os
import stat

import numpy as np

from file_formats import EVAL_FILE, HEADER_BYTES

START = 65535                   # the word that starts every example
MAX_EXAMPLE_BYTES = 65534       # the largest even size a uint16 holds
MAX_EXAMPLES = 65535            # indices are uint16 words: 0..65534
MAX_FILE_BYTES = 1 << 30        # what evaluation.h reads (fileio.h's read_whole_file bound)


class EvalFileError(ValueError):
    """A damaged eval file, or an example that does not fit the format."""


class EvalExample:
    def __init__(self, index, label, context, completions):
        self.index, self.label = index, label
        self.context = context          # [int]
        self.completions = completions  # [[int]] * K

    def longest_row(self):
        """Tokens of the context and the longest completion: the longest row the model reads."""
        return len(self.context) + max(len(c) for c in self.completions)


def example_words(index, label, context, completions):
    """The example's words (uint16 array). EvalFileError where it does not fit the format: a size
    over MAX_EXAMPLE_BYTES, a token or an index that is not a uint16 below 65535, an empty context
    or completion, a label that is not one of the completions."""
    if not 0 <= index < MAX_EXAMPLES:
        raise EvalFileError(f"example index {index} is not in [0, {MAX_EXAMPLES})")
    if not completions or not 0 <= label < len(completions):
        raise EvalFileError(f"label {label} of {len(completions)} completions")
    parts = [context] + list(completions)
    if not all(len(p) for p in parts):
        raise EvalFileError("an empty context or completion (the score needs at least one token of each)")
    size = 2 * (5 + sum(1 + len(p) for p in parts))
    if size > MAX_EXAMPLE_BYTES:
        raise EvalFileError(f"{size:,} bytes ({sum(len(p) for p in parts):,} tokens), more than the "
                            f"{MAX_EXAMPLE_BYTES:,} bytes an example's uint16 size field holds")
    words = [START, size, index, label, len(completions)]
    for p in parts:
        words.append(len(p))
        words.extend(p)
    words = np.asarray(words, dtype=np.int64)
    if words[5:].min() < 0 or words[5:].max() >= START:
        raise EvalFileError(f"a token id outside [0, {START})")
    return words.astype("<u2")


def eval_file_chunks(examples_words):
    """The file's bytes, as chunks: the header, then every example's words. EvalFileError where there
    is no example, too many, or more bytes than the readers take."""
    if not 1 <= len(examples_words) <= MAX_EXAMPLES:
        raise EvalFileError(f"{len(examples_words):,} examples; the format holds 1 to {MAX_EXAMPLES:,}")
    sizes = [2 * len(w) for w in examples_words]
    if HEADER_BYTES + sum(sizes) > MAX_FILE_BYTES:
        raise EvalFileError(f"{HEADER_BYTES + sum(sizes):,} bytes, more than the {MAX_FILE_BYTES:,} "
                            f"train_gpt reads")
    header = EVAL_FILE.pack(examples=len(examples_words), longest_example_bytes=max(sizes))
    return [header.tobytes()] + [w.tobytes() for w in examples_words]


def read_eval_file(path, vocab=None):
    """[EvalExample] of the whole file, with evaluation.h's read_eval_file's checks (and its words
    for what is wrong); with `vocab`, every token id must be below it. EvalFileError names the file;
    OSError where it cannot be read."""
    def bad(what):
        return EvalFileError(f"eval file '{path}': {what}")

    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise bad("not a regular file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise bad(f"{size:,} bytes, more than the {MAX_FILE_BYTES:,} this kind of file can have")
        data = f.read()
    if len(data) < HEADER_BYTES:
        raise bad(f"no complete header ({len(data)} bytes)")
    h = EVAL_FILE.unpack(data)
    if h["magic"] != EVAL_FILE.magic:
        raise bad(f"bad magic {h['magic']}, expected {EVAL_FILE.magic}")
    if h["version"] != EVAL_FILE.version:
        raise bad(f"version {h['version']}, expected {EVAL_FILE.version}")
    if h["examples"] < 1:
        raise bad(f"its header says {h['examples']} examples")
    if (len(data) - HEADER_BYTES) % 2:
        raise bad("an odd number of bytes after the header (truncated?)")
    w = np.frombuffer(data, dtype="<u2", offset=HEADER_BYTES).astype(np.int64)
    n = len(w)
    limit = vocab if vocab is not None else START + 1
    out, at = [], 0
    for e in range(h["examples"]):
        which = f"example {e}"
        if at + 5 > n or w[at] != START:
            raise bad(f"{which}: no example starts at word {at} (truncated or damaged)")
        words = int(w[at + 1]) // 2
        if w[at + 1] % 2 or words < 6 or at + words > n:
            raise bad(f"{which}: its size {int(w[at + 1])} does not fit the file")
        end = at + words
        index, label, K = int(w[at + 2]), int(w[at + 3]), int(w[at + 4])
        if K < 1 or label >= K:
            raise bad(f"{which}: label {label} of {K} completions")
        p = at + 5

        def take():
            nonlocal p
            if p >= end or p + 1 + w[p] > end:
                return None
            length = int(w[p])
            tokens = w[p + 1:p + 1 + length]
            p += 1 + length
            if length and tokens.max() >= limit:
                return None
            return tokens.tolist()

        context = take()
        if not context:
            raise bad(f"{which}: a damaged context (or a token id >= {limit})")
        completions = []
        for _ in range(K):
            c = take()
            if not c:
                raise bad(f"{which}: a damaged completion (or a token id >= {limit})")
            completions.append(c)
        if p != end:
            raise bad(f"{which}: {end - p} words beyond its completions")
        out.append(EvalExample(index, label, context, completions))
        at = end
    if at != n:
        raise bad(f"{n - at} words after the last example")
    return out
