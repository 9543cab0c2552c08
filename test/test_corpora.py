"""Corpora into token files (data/prepare_text.py): JSON lines, Parquet, Arrow, Hugging Face `datasets`
folders, gzip, folders and glob patterns of them; several workers; bad files.

CPU only, about half a minute. Makes up documents (accents, CJK, emoji, CRLF, a literal
"<|endoftext|>", long ones, empty, whitespace-only and null records), writes them in each format,
prepares each, and decodes nothing: the token stream (validation file, then the shards) must equal
tiktoken's own GPT-2 encoding (built independently of data/gpt2_bpe.py) of the same documents, EOT
then the document's tokens, for each non-blank document in input order. Then: 1 worker and 3 write
the same bytes (tasks of the real size and of 200 characters); --skip-bad-files gives the bytes of a
run without the bad files, naming each; the progress line; bad inputs give one `error:` line and exit
code 1. Checks that need pyarrow are counted `skipped (pyarrow not installed)` where it is missing.
Ends with `N passed, N failed, N skipped`.
"""

import gzip
import json
import os
import random
import re
import sys
import tempfile

import numpy as np

from checks import check, finish, skip  # noqa: E402  (test/checks.py: the count line every test ends with)
from test_prepare_text import (EOT, MIRROR, SCRIPT, load_script, one_line_error, outputs, quietly,  # noqa: E402
                               read_token_file, reference_encoding, run, write)

try:
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401
    import pyarrow.parquet as pq
except ImportError:
    pa = None
NO_PYARROW = "pyarrow not installed: scripts/setup_python.sh installs it"

WORDS = ["the", "quick", "brown", "fox", "café", "naïve", "Größe", "日本語の", "テキスト", "😀", "Καλημέρα",
         "don't", "it's", "we'll", "1234", "3.14159", "<|endoftext|>", "e-mail", "https://example.com/a?b=c",
         "(x)", "--", "¿qué?", "naïveté", "\u00a0", "Ω", "\\u00e9", '"quoted"', "{braces}"]


def made_up_documents(seed, n, long_words=0):
    """n documents of words, spaces, newlines, tabs and CRLFs; among them an empty one, a
    whitespace-only one and None (a null record; an empty document in text), and, with long_words,
    one that long."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = rng.choice([1, 3, 12, 40, 150])
        text = ""
        for _ in range(words):
            text += rng.choice(WORDS) + rng.choice([" ", " ", " ", "\n", "  ", "\t", "\r\n", ". ", ",\n\n"])
        docs.append(text)
    docs[1], docs[3], docs[5] = "", " \n\t\r\n  ", None
    if long_words:
        docs[7] = " ".join(rng.choice(WORDS) for _ in range(long_words)) + "\n"
    return docs


def expected_stream(ref, docs):
    out = []
    for d in docs:
        if d and d.strip():
            out += [EOT] + ref.encode_ordinary(d)
    return out


def prepared_stream(out, name):
    val, shards = outputs(out, name)
    files = ([val] if val else []) + shards
    return np.concatenate([read_token_file(p)[1] for p in files]).tolist() if files else []


def why(rc, stderr):
    """A failed run's last line, for a check's detail."""
    return stderr.strip().splitlines()[-1][:100] if rc and stderr.strip() else ""


def file_bytes(out):
    return {f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out))}


def write_jsonl(path, docs, field="text", compress=False):
    lines = []
    for i, d in enumerate(docs):
        record = {"id": i, field: d, "meta": {"source": "made-up", "text": "not this one"}}
        lines.append(json.dumps(record, ensure_ascii=i % 2 == 0) + ("\r\n" if i % 3 == 0 else "\n"))
        if i == 2:
            lines.append("\n")  # a blank line is passed over
    data = "".join(lines).encode("utf-8")
    return write(path, data=gzip.compress(data) if compress else data)


def write_parquet(path, docs, field="text", row_group=7, large=False):
    texts = pa.array(docs, pa.large_string() if large else pa.string())
    table = pa.table({"id": pa.array(range(len(docs)), pa.int64()), field: texts,
                      "url": pa.array([f"https://example.com/{i}" for i in range(len(docs))])})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_arrow(path, docs, field="text", batch=5, file_format=False):
    schema = pa.schema([("id", pa.int64()), (field, pa.string())])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with (pa.ipc.new_file if file_format else pa.ipc.new_stream)(path, schema) as w:
        for at in range(0, len(docs), batch):
            part = docs[at:at + batch]
            w.write_batch(pa.record_batch([pa.array(range(at, at + len(part)), pa.int64()), pa.array(part, pa.string())],
                                          schema=schema))
    return path


def write_hf_dataset(folder, docs, shards=2):
    """A folder as `datasets`' save_to_disk writes it: data-0000i-of-0000n.arrow (Arrow IPC streams),
    state.json listing them in order, dataset_info.json. The state lists the shards in reverse
    name order, so that reading them sorted by name would give the wrong order."""
    per = -(-len(docs) // shards)
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    order = names[::-1]
    for k, name in enumerate(order):
        write_arrow(os.path.join(folder, name), docs[k * per:(k + 1) * per], batch=4)
    state = {"_data_files": [{"filename": n} for n in order], "_fingerprint": "0123456789abcdef",
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": "train"}
    write(os.path.join(folder, "state.json"), json.dumps(state, indent=2, sort_keys=True))
    info = {"builder_name": None, "citation": "", "description": "", "features": {
        "id": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}}
    write(os.path.join(folder, "dataset_info.json"), json.dumps(info, indent=2))
    return folder


def main():
    if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
        check(f"mirror present at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    ref = reference_encoding()
    os.environ["GPT_MIRROR"] = MIRROR
    holder = tempfile.TemporaryDirectory(prefix="test_corpora.")
    tmp = holder.name
    tok = os.path.join(tmp, "tok.bin")
    prep = load_script(SCRIPT)
    enc = prep.local_encoding()
    prep.local_encoding = lambda: enc  # built once, not once per run

    def prepare(args, workers=1):
        """prep.main in this process, as its __main__ runs it: (exit code, stdout, stderr)."""
        def call():
            try:
                prep.main(args + ["--tokenizer-out", tok, "--workers", str(workers)])
                return 0
            except (prep.PrepError, OSError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
        return quietly(call)

    docs = made_up_documents(1, 40, long_words=3000)
    want = expected_stream(ref, docs)
    blank = sum(1 for d in docs if not (d and d.strip()))
    text_docs = ["" if d is None else d for d in docs]

    print("each format: tokens == tiktoken's for the same documents, EOT before each")
    formats = [  # what, file name, writer, flags, needs pyarrow
        ("JSON lines", "c.jsonl", lambda p: write_jsonl(p, docs), [], False),
        ("JSON lines, gzip", "c.jsonl.gz", lambda p: write_jsonl(p, docs, compress=True), [], False),
        ("JSON lines named .json, --text-field body", "c.json", lambda p: write_jsonl(p, docs, field="body"),
         ["--text-field", "body"], False),
        ("Parquet, row groups of 7", "c.parquet", lambda p: write_parquet(p, docs), [], True),
        ("Parquet, large_string column 'content'", "c.parquet",
         lambda p: write_parquet(p, docs, field="content", large=True, row_group=100), ["--text-field", "content"], True),
        ("Arrow IPC stream", "c.arrow", lambda p: write_arrow(p, docs), [], True),
        ("Arrow IPC file format", "c.arrow", lambda p: write_arrow(p, docs, file_format=True), [], True),
        ("Hugging Face save_to_disk folder", "hf_ds", lambda p: write_hf_dataset(p, docs), [], True),
    ]
    for i, (what, name, make, extra, needs_pyarrow) in enumerate(formats):
        if needs_pyarrow and pa is None:
            skip(f"{what}: tokens == tiktoken's", NO_PYARROW)
            continue
        path = make(os.path.join(tmp, f"f{i}", name))
        out = os.path.join(tmp, f"f{i}_out")
        rc, stdout, stderr = prepare([path, "--out-dir", out, "--val-tokens", "50", "--shard-tokens", "700"] + extra)
        got = prepared_stream(out, prep.stem(path)) if rc == 0 else []
        summary = re.search(r"(\d+) documents, (\d+) empty or whitespace-only skipped", stdout)
        check(f"{what}: tokens == tiktoken's", rc == 0 and got == want,
              f"{len(got):,} tokens of {len(want):,}" if rc == 0 else stderr.strip()[-100:])
        check(f"{what}: {len(docs) - blank} documents, {blank} blank skipped",
              summary is not None and summary.groups() == (str(len(docs) - blank), str(blank)),
              summary.group(0) if summary else stdout.strip()[-80:])

    print("gzip text, folders, glob patterns")
    body = "".join(d for d in text_docs if d)
    gz_text = write(os.path.join(tmp, "gz", "book.txt.gz"), data=gzip.compress(body.encode("utf-8")))
    out = os.path.join(tmp, "gz_out")
    rc, stdout, stderr = prepare([gz_text, "--out-dir", out, "--val-tokens", "10"])
    check("book.txt.gz: one document, NAME 'book'", rc == 0 and prepared_stream(out, "book") == [EOT] + ref.encode_ordinary(body),
          why(rc, stderr))
    rc, stdout, stderr = prepare([gz_text, "--out-dir", out, "--val-tokens", "10", "--split-docs", "blankline"])
    sections = [s + "\n\n" for s in body.split("\n\n")[:-1]] + [body.split("\n\n")[-1]]
    check("book.txt.gz --split-docs blankline: its sections", rc == 0 and prepared_stream(out, "book") ==
          expected_stream(ref, sections), why(rc, stderr))

    folder = os.path.join(tmp, "mixed")
    parts = [docs[:12], docs[12:25], docs[25:33], docs[33:]]
    write_jsonl(os.path.join(folder, "a", "1.jsonl"), parts[0])
    write_jsonl(os.path.join(folder, "a", "2.jsonl.gz"), parts[1], compress=True)
    write(os.path.join(folder, "b", "3.txt"), "".join(d for d in parts[2] if d))
    write(os.path.join(folder, "b", "notes.md"), "not taken\n")
    layout = [parts[0], parts[1], ["".join(d for d in parts[2] if d)]]
    patterns = ["--glob", "*.jsonl", "--glob", "*.jsonl.gz", "--glob", "*.txt"]
    if pa is not None:
        write_parquet(os.path.join(folder, "c", "4.parquet"), parts[3])
        layout.append(parts[3])
        patterns += ["--glob", "*.parquet"]
    mixed_want = expected_stream(ref, [d for part in layout for d in part])
    out = os.path.join(tmp, "mixed_out")
    rc, stdout, stderr = prepare([folder, "--out-dir", out, "--val-tokens", "40", "--shard-tokens", "300"] + patterns)
    check(f"a folder, --glob {len(patterns) // 2} times: its files in path order, .md left out",
          rc == 0 and prepared_stream(out, "mixed") == mixed_want, why(rc, stderr))
    out = os.path.join(tmp, "pattern_out")
    rc, stdout, stderr = prepare([os.path.join(folder, "a", "*.json*"), "--out-dir", out, "--val-tokens", "5"])
    check("a glob pattern as INPUT ('a/*.json*'): its matches, NAME from its folder ('a')",
          rc == 0 and prepared_stream(out, "a") == expected_stream(ref, parts[0] + parts[1]), why(rc, stderr))
    if pa is None:
        skip("a DatasetDict's split folder (dict/train)", NO_PYARROW)
    else:
        dd = os.path.join(tmp, "dict")
        write_hf_dataset(os.path.join(dd, "train"), docs[:20])
        write_hf_dataset(os.path.join(dd, "test"), docs[20:])
        write(os.path.join(dd, "dataset_dict.json"), json.dumps({"splits": ["train", "test"]}))
        out = os.path.join(tmp, "dict_out")
        rc, stdout, stderr = prepare([os.path.join(dd, "train"), "--out-dir", out, "--val-tokens", "5"])
        check("a DatasetDict's split folder (dict/train)", rc == 0 and prepared_stream(out, "train") ==
              expected_stream(ref, docs[:20]), why(rc, stderr))

    print("workers: the same bytes for any number")
    # Real task sizes: a corpus of about 2.6M characters is 3 tasks; then tasks of 200 characters.
    big_docs = made_up_documents(2, 1500) * 2
    big = os.path.join(tmp, "big")
    write_jsonl(os.path.join(big, "1.jsonl"), big_docs[:1200])
    write(os.path.join(big, "2.txt"), "".join(d for d in big_docs[1200:2000] if d))
    write_jsonl(os.path.join(big, "3.jsonl.gz"), big_docs[2000:], compress=True)
    glob_args = ["--glob", "*.jsonl", "--glob", "*.txt", "--glob", "*.jsonl.gz"]
    if pa is not None:
        write_parquet(os.path.join(big, "4.parquet"), big_docs, row_group=300)
        glob_args += ["--glob", "*.parquet"]
    outs = {}
    for workers in (1, 3):
        out = os.path.join(tmp, f"big_{workers}")
        r = run([big, "--out-dir", out, "--shard-tokens", "100000", "--workers", str(workers),
                 "--tokenizer-out", tok] + glob_args)
        outs[workers] = file_bytes(out) if r.returncode == 0 else {}
        check(f"--workers {workers}: runs", r.returncode == 0, why(r.returncode, r.stderr))
    chars = sum(len(d) for d in big_docs if d) * (2 if pa is not None else 1)
    check(f"{chars:,} characters: 3 workers write the same bytes as 1",
          outs[1] and outs[1] == outs[3], f"{len(outs[1])} files, {sum(map(len, outs[1].values())):,} bytes")
    prep.TASK_CHARS, prep.PIECE_CHARS = 200, 100
    tiny = {}
    for workers in (1, 2):
        out = os.path.join(tmp, f"mixed_tiny_{workers}")
        rc, _, stderr = prepare([folder, "--out-dir", out, "--val-tokens", "40", "--shard-tokens", "300"] + patterns,
                                workers)
        tiny[workers] = file_bytes(out) if rc == 0 else {}
    check("tasks of 200 characters, the mixed folder: 2 workers write the same bytes as 1",
          tiny[1] and tiny[1] == tiny[2] and prepared_stream(os.path.join(tmp, "mixed_tiny_1"), "mixed") == mixed_want,
          f"{len(tiny[1])} files")

    print("--skip-bad-files")
    # A bad file in the middle, found after some of its tasks went to the workers: its tokens come
    # back out. The run must give the bytes of a run on the good files alone.
    bad = os.path.join(tmp, "bad_files")
    good = os.path.join(tmp, "good_files")
    files = [("01.jsonl", lambda p: write_jsonl(p, docs[:15]), True),
             ("02_not_utf8.jsonl", lambda p: write(p, data=open(write_jsonl(p, docs[15:30]), "rb").read() +
                                                    b'{"text": "caf\xe9"}\n'), False),
             ("03.txt", lambda p: write(p, "".join(d for d in docs[30:36] if d)), True),
             ("04_truncated.jsonl.gz", lambda p: write(p, data=gzip.compress(
                 open(write_jsonl(p, docs), "rb").read())[:-30]), False),
             ("05_no_field.jsonl", lambda p: write(p, '{"text": "fine"}\n{"body": "no text field"}\n'), False),
             ("06.jsonl.gz", lambda p: write_jsonl(p, docs[36:], compress=True), True)]
    if pa is not None:
        files += [("07_garbage.parquet", lambda p: write(p, data=b"PAR1" + os.urandom(100)), False),
                  ("08.parquet", lambda p: write_parquet(p, docs[:9]), True)]
    for name, make, ok in files:
        make(os.path.join(bad, name))
        if ok:
            make(os.path.join(good, name))
    globs = ["--glob", "*.jsonl", "--glob", "*.txt", "--glob", "*.jsonl.gz", "--glob", "*.parquet"]
    bad_names = [n for n, _, ok in files if not ok]
    common = ["--val-tokens", "30", "--shard-tokens", "400", "--name", "c"] + globs
    for workers in (1, 2):
        rc, stdout, stderr = prepare([good, "--out-dir", os.path.join(tmp, f"good_out_{workers}")] + common, workers)
        want_files = file_bytes(os.path.join(tmp, f"good_out_{workers}")) if rc == 0 else {"good run failed": b""}
        rc, stdout, stderr = prepare([bad, "--out-dir", os.path.join(tmp, f"bad_out_{workers}"), "--skip-bad-files"]
                                     + common, workers)
        got_files = file_bytes(os.path.join(tmp, f"bad_out_{workers}")) if rc == 0 else {}
        warned = [line for line in stderr.splitlines() if line.startswith("warning: skipped")]
        check(f"tasks of 200 characters, {workers} worker{'s' * (workers > 1)}: the files of a run without the "
              f"{len(bad_names)} bad ones", rc == 0 and got_files == want_files, why(rc, stderr))
        check("  a warning naming each, in order; the summary counts them",
              len(warned) == len(bad_names) and all(n in w for n, w in zip(bad_names, warned))
              and f"{len(bad_names)} bad files of {len(files)} skipped" in stdout, f"{len(warned)} warnings")
    prep.TASK_CHARS, prep.PIECE_CHARS = 1 << 20, 1 << 20
    r = run([bad, "--out-dir", os.path.join(tmp, "bad_out_sub"), "--skip-bad-files", "--tokenizer-out", tok]
            + common)
    check("as a program, default task sizes and workers: the same files",
          r.returncode == 0 and file_bytes(os.path.join(tmp, "bad_out_sub")) == want_files, why(r.returncode, r.stderr))
    ok, line = one_line_error(run([bad, "--out-dir", os.path.join(tmp, "never"), "--tokenizer-out", tok] + common),
                              "02_not_utf8.jsonl' line 17 is not UTF-8")
    check("without it: one error line naming the first bad file and the flag",
          ok and "--skip-bad-files" in line and not os.path.exists(os.path.join(tmp, "never")), line)

    print("progress")
    prep.PROGRESS_SECONDS = 0
    rc, stdout, _ = prepare([os.path.join(big, "1.jsonl"), "--out-dir", os.path.join(tmp, "progress"),
                             "--val-tokens", "10"])
    prep.PROGRESS_SECONDS = 30
    lines = [line for line in stdout.splitlines() if re.fullmatch(
        r"\s+\d+\.\d% of [\d,]+ bytes read, [\d,]+ tokens, [\d,]+ tokens/s, (\d+h)?(\d+m)?\d+s left", line)]
    check("a line with the share read, tokens/s and the time left", rc == 0 and lines,
          lines[-1].strip() if lines else stdout.strip()[:80])

    print("bad inputs: one `error:` line, exit code 1")
    b = os.path.join(tmp, "bad")
    never = os.path.join(tmp, "never")
    base = ["--out-dir", never, "--tokenizer-out", tok]
    cases = [
        ("a line that is not JSON", [write(os.path.join(b, "x.jsonl"), '{"text": "a"}\n{"text": "b"\n')],
         "line 2 is not JSON"),
        ("a .json file holding one JSON array", [write(os.path.join(b, "arr.json"), '[{"text": "a"},\n{"text": "b"}]\n')],
         "one JSON array, not JSON lines"),
        ("a line without --text-field: names the fields", [write(os.path.join(b, "nofield.jsonl"),
                                                                 '{"id": 1, "content": "a"}\n')],
         "line 1 has no field 'text' (its fields: 'id', 'content'; --text-field"),
        ("a field that is a number", [write(os.path.join(b, "num.jsonl"), '{"text": 5}\n')],
         "field 'text' is a number, not a string"),
        ("a line that is an array", [write(os.path.join(b, "list.jsonl"), '["a"]\n')], "is an array, not a JSON object"),
        ("a line that is not UTF-8", [write(os.path.join(b, "latin.jsonl"), data=b'{"text": "a"}\n{"text": "\xe9"}\n')],
         "line 2 is not UTF-8"),
        ("a .gz that is not gzip", [write(os.path.join(b, "plain.txt.gz"), "plain text\n")], "is not valid gzip data"),
        ("a truncated .gz", [write(os.path.join(b, "cut.jsonl.gz"), data=gzip.compress(b'{"text": "a"}\n' * 100)[:-12])],
         "is not valid gzip data"),
        ("a .parquet.gz", [write(os.path.join(b, "x.parquet.gz"), data=b"x")], "decompress it first"),
        ("--workers 0", [os.path.join(b, "x.jsonl"), "--workers", "0"], "--workers"),
        ("--split-docs with no text file", [os.path.join(b, "nofield.jsonl"), "--split-docs", "line"],
         "--split-docs splits text files"),
        ("--text-field ''", [os.path.join(b, "x.jsonl"), "--text-field", ""], "--text-field"),
        ("a glob pattern that matches nothing", [os.path.join(b, "*.none")], "matches nothing"),
        ("a folder of other files: the --glob that takes them", [os.path.join(tmp, "f0")], "--glob '*.jsonl'"),
    ]
    def broken_state(folder):
        write_hf_dataset(folder, docs[:4])
        write(os.path.join(folder, "state.json"), "{}")
        return folder

    # These need pyarrow: their inputs are made only when it is there (a callable).
    cases += [
        ("a .parquet that is not Parquet", lambda: [write(os.path.join(b, "junk.parquet"), "junk")],
         "not a readable Parquet"),
        ("a Parquet file without the column: names the columns", lambda: [os.path.join(tmp, "f4", "c.parquet")],
         "has no column 'text' (its columns: 'id', 'content', 'url'"),
        ("a Parquet column that is not text", lambda: [os.path.join(tmp, "f3", "c.parquet"), "--text-field", "id"],
         "column 'id' holds int64, not strings"),
        ("an .arrow that is not Arrow", lambda: [write(os.path.join(b, "junk.arrow"), "junk" * 10)],
         "not a readable Arrow"),
        ("a DatasetDict's folder: names its splits", lambda: [os.path.join(tmp, "dict")], "splits: train, test"),
        ("a datasets folder with a broken state.json", lambda: [broken_state(os.path.join(b, "hf_broken"))],
         "not a `datasets` state file"),
    ]
    for what, args, mention in cases:
        if callable(args):
            if pa is None:
                skip(what, NO_PYARROW)
                continue
            args = args()
        ok, line = one_line_error(run(args + base, timeout=60), mention)
        check(what, ok, line)
    # Without pyarrow (hidden behind a package that fails to import): a clear line for Parquet, and
    # text still works.
    fake = write(os.path.join(tmp, "no_pyarrow", "pyarrow", "__init__.py"), "raise ImportError('hidden by the test')\n")
    env_path = os.path.dirname(os.path.dirname(fake))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    try:
        parquet = os.path.join(tmp, "f3", "c.parquet") if pa is not None else write(os.path.join(b, "y.parquet"), "x")
        ok, line = one_line_error(run([parquet] + base), "needs pyarrow: pip install pyarrow")
        check("pyarrow missing: a Parquet input says what to install", ok, line)
        r = run([os.path.join(b, "nofield.jsonl"), "--text-field", "content", "--out-dir", os.path.join(tmp, "np"),
                 "--tokenizer-out", tok, "--val-tokens", "0"])
        check("pyarrow missing: JSON lines still work", r.returncode == 0, why(r.returncode, r.stderr))
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    check("failed runs wrote nothing (no output folder)", not os.path.exists(never))

    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
