"""Your own text -> token files (data/prepare_text.py), and Tiny Shakespeare's outputs unchanged.

CPU only, a few seconds. Builds a small corpus that is not Shakespeare (several files and a folder,
accents, CJK, emoji, CRLF line ends, a byte-order mark, a literal "<|endoftext|>"), prepares it in each
document mode with tiny shards, and decodes the shards back with tiktoken's own GPT-2 loader (an
encoding built independently of data/gpt2_bpe.py): every document must come back as EOT followed by
exactly the tokens of its text. Then: streaming (tiny read blocks and pieces) gives the tokens of the
whole text, Tiny Shakespeare's files are byte-identical to the recipe's, stale shards go, a kill at any
step of replacing an earlier run's files leaves the old set, the new set or a file train_gpt rejects,
temporary files go (SIGTERM now, a SIGKILL's at the next start), and bad inputs (FIFOs and devices
too) fail quickly with one `error:` line and exit code 1. Ends with `N passed, N failed, N skipped`.
"""

import glob
import hashlib
import importlib.util
import io
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout

import numpy as np

from checks import check, finish, skip  # noqa: E402  (test/checks.py: the count line every test ends with)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
sys.dont_write_bytecode = True
SCRIPT = os.path.join("data", "prepare_text.py")
TOOL = os.path.join("build", "test", "token_file_tool")
MIRROR = os.path.abspath(os.environ.get("GPT_MIRROR") or os.path.join("..", "shared", "mirror"))
EOT = 50256

# The outputs of data/prepare_tinyshakespeare.py as the recipe stood before data/gpt2_bpe.py was split
# out of it (computed from that unmodified script on the mirror's files): any change to them is a
# change of the recipe.
TINY_SHAKESPEARE_SHA256 = {
    "tiny_shakespeare_val.bin": "fe99db720dc7c83e694806d4e047a952909411da1daccde4ccc2e55f40882a62",
    "tiny_shakespeare_train.bin": "8a70606be574040c26d225694f5f9759973b419852d22f7fe5c118e1b359dcc8",
    "gpt2_tokenizer.bin": "6f3abc21e444e4e8300e225f4e03da48ea121cf17e30f67009b8dad7a66c2f13",
}



def run(args, mirror=MIRROR, script=SCRIPT, timeout=None):
    env = dict(os.environ, GPT_MIRROR=mirror)
    try:
        return subprocess.run([sys.executable, script] + args, capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -1, "", f"hung: killed after {timeout} s")


def load_script(path):
    """The script as a fresh module, registered under its name so that worker processes, which
    import it by that name, find the same functions."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quietly(f, *args):
    """f(*args) with its stdout and stderr captured: (result, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        result = f(*args)
    return result, out.getvalue(), err.getvalue()


def one_line_error(r, must_mention=""):
    """Exit code 1, exactly one `error: ...` line on stderr (no traceback) naming must_mention."""
    lines = r.stderr.strip().splitlines()
    ok = r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and must_mention in lines[0]
    return ok, (lines[-1] if lines else f"no stderr, exit code {r.returncode}")


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_token_file(path):
    """(header is valid, tokens)."""
    data = open(path, "rb").read()
    h = np.frombuffer(data[:1024], dtype="<i4")
    ok = len(data) >= 1024 and h[0] == 20240520 and h[1] == 1 and len(data) == 1024 + 2 * int(h[2])
    return ok, np.frombuffer(data[1024:], dtype="<u2")


def outputs(out, name):
    """(val file or None, train shards in order) as the glob NAME_train_*.bin sees them."""
    files = sorted(os.listdir(out))
    val = [f for f in files if f.startswith(f"{name}_val_")]
    train = [os.path.join(out, f) for f in files if f.startswith(f"{name}_train_") and f.endswith(".bin")]
    return (os.path.join(out, val[0]) if val else None), train


def split_docs(tokens):
    """Documents of a token stream: each starts at an EOT."""
    starts = list(np.flatnonzero(tokens == EOT)) + [len(tokens)]
    return [tokens[a + 1:b] for a, b in zip(starts[:-1], starts[1:])], starts[0] == 0


def group_processes(pgid):
    """The live (not zombie) processes of a process group."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(pid))
    return found


def write(path, text=None, data=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if data is not None else text.encode("utf-8"))
    return path


def reference_encoding():
    """GPT-2's encoding built by tiktoken's own loader from the mirror's files (independently of
    data/gpt2_bpe.py)."""
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken only reads the local paths below
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(MIRROR, "gpt2", "vocab.bpe"),
                                            os.path.join(MIRROR, "gpt2", "encoder.json"))
    return tiktoken.Encoding(name="gpt2-ref", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=50257)


def main():
    if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
        check(f"mirror present at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    ref = reference_encoding()

    holder = tempfile.TemporaryDirectory(prefix="test_prepare_text.")
    tmp = holder.name
    corpus = os.path.join(tmp, "corpus")
    texts = {  # path -> text; the folder's files in sorted order, skip.md is not *.txt
        "a.txt": "Première ligne, café.\nDeuxième — ligne 😀\n\nNouvelle section: 日本語のテキスト。\n\n\n"
                 "A literal <|endoftext|> stays text.\n",
        "folder/b.txt": "Zweiter Text über Größe.\r\nMit CRLF.\r\n\r\nΚαλημέρα κόσμε\n",
        "folder/sub/c.txt": "last one\n\nno final newline",
        "folder/sub/d.txt": "\ufeffstarts with a byte-order mark\none\ntwo\n",
        "folder/skip.md": "not a .txt file\n",
    }
    for rel, text in texts.items():
        write(os.path.join(corpus, rel), text)
    order = ["a.txt", "folder/b.txt", "folder/sub/c.txt", "folder/sub/d.txt"]
    file_texts = [texts[f].lstrip("\ufeff") for f in order]  # the mark is dropped
    inputs = [os.path.join(corpus, "a.txt"), os.path.join(corpus, "folder")]

    def expected_docs(mode):
        docs = []
        for text in file_texts:
            if mode == "file":
                parts = [text]
            elif mode in ("blankline", "line"):
                sep = "\n\n" if mode == "blankline" else "\n"
                pieces = text.split(sep)
                parts = [p + sep for p in pieces[:-1]] + [pieces[-1]]
            else:
                parts = text.split(mode)
            docs += [p for p in parts if p.strip()]  # empty and whitespace-only ones are skipped
        return docs

    def prepare_and_compare(mode, extra, what, val_tokens=None, val_fraction=None):
        out = os.path.join(tmp, "out_" + what.replace(" ", "_"))
        args = inputs + ["--name", "mix", "--out-dir", out, "--shard-tokens", "13",
                         "--tokenizer-out", os.path.join(tmp, "tok.bin")] + extra
        r = run(args)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
        if not check(f"{what}: runs", r.returncode == 0, last):
            return
        val_path, shards = outputs(out, "mix")
        headers = [read_token_file(p) for p in ([val_path] if val_path else []) + shards]
        check(f"{what}: every file has a valid llm.c header", all(ok for ok, _ in headers), f"{len(headers)} files")
        stream = np.concatenate([t for _, t in headers])
        val = read_token_file(val_path)[1] if val_path else np.zeros(0, np.uint16)
        want_val = val_tokens if val_tokens is not None else max(1, round(val_fraction * len(stream)))
        check(f"{what}: validation holds the first {want_val} tokens", len(val) == want_val, f"{len(val)}")
        sizes = [len(read_token_file(p)[1]) for p in shards]
        want_shards = -(-(len(stream) - want_val) // 13)
        check(f"{what}: {want_shards} training shards of 13 tokens (the last the rest)",
              len(shards) == want_shards and all(s == 13 for s in sizes[:-1]) and 0 < sizes[-1] <= 13,
              f"{sizes}")
        names_ok = [os.path.basename(p) for p in shards] == [f"mix_train_{i:06d}.bin" for i in range(1, len(shards) + 1)]
        check(f"{what}: names mix_val_000000.bin, mix_train_000001.bin, ...",
              names_ok and os.path.basename(val_path or "mix_val_000000.bin") == "mix_val_000000.bin")
        docs, starts_with_eot = split_docs(stream)
        want = expected_docs(mode)
        same_tokens = starts_with_eot and len(docs) == len(want) and all(
            list(d) == ref.encode_ordinary(w) for d, w in zip(docs, want))
        check(f"{what}: {len(want)} documents, each EOT + its text's tokens", same_tokens,
              f"{len(docs)} documents decoded")
        decoded = [ref.decode_bytes([int(t) for t in d]).decode("utf-8", "replace") for d in docs]
        check(f"{what}: decoded documents == the input's", decoded == want)
        if mode == "file":  # train_gpt's reader (fileio.h) on the same files, where it is built
            if not os.access(TOOL, os.X_OK):
                skip(f"{what}: fileio.h's read_token_file accepts every file", f"{TOOL} not built")
            else:
                seen = [subprocess.run([TOOL, "read-tokens", f, "50257"], capture_output=True, text=True).stdout.strip()
                        for f in [val_path] + shards]
                expect = [f"tokens {len(t)} first {t[0]} last {t[-1]}" for _, t in headers]
                check(f"{what}: fileio.h's read_token_file accepts every file", seen == expect, f"{len(seen)} files")
        return stream

    print("documents: one per file (default)")
    stream = prepare_and_compare("file", ["--val-tokens", "7"], "file mode", val_tokens=7)
    if stream is not None:
        check("file mode: the literal <|endoftext|> is text (EOT only at the 4 starts)",
              int(np.sum(stream == EOT)) == 4, f"{int(np.sum(stream == EOT))} EOTs")
        check("file mode: skip.md left out (--glob *.txt)", b"not a .txt" not in ref.decode_bytes(
            [int(t) for t in stream if t != EOT]))
    print("documents: blank-line separated sections")
    prepare_and_compare("blankline", ["--split-docs", "blankline", "--val-fraction", "0.1"], "blankline mode",
                        val_fraction=0.1)
    print("documents: lines")
    prepare_and_compare("line", ["--split-docs", "line"], "line mode", val_fraction=0.05)  # the default fraction
    print("documents: a separator string")
    prepare_and_compare("<|endoftext|>", ["--doc-separator", "<|endoftext|>", "--val-tokens", "3"],
                        "separator mode", val_tokens=3)
    print("other file names")
    out = os.path.join(tmp, "glob_md")
    r = run([os.path.join(corpus, "folder"), "--glob", "*.md", "--out-dir", out, "--val-tokens", "1",
             "--tokenizer-out", os.path.join(tmp, "tok.bin")])
    _, shards = outputs(out, "folder")
    got = ref.decode_bytes([int(t) for t in np.concatenate([read_token_file(p)[1] for p in shards])]) if shards else b""
    check("--glob '*.md' takes skip.md only; NAME defaults to the folder's name",
          r.returncode == 0 and len(shards) == 1 and got.endswith(b".txt file\n"), r.stderr.strip()[:60])

    print("streaming")
    # In-process with tiny blocks: reads of 5 bytes cut characters of 2-4 bytes, pieces of 40
    # characters cut the text at safe places, tasks of 100 characters go to the workers; the tokens
    # must equal those of the whole text at once, and the files be the same bytes for 1 and 2 workers.
    prep = load_script(SCRIPT)
    with open(os.path.join(MIRROR, "tinyshakespeare.txt"), encoding="utf-8") as f:
        shakespeare = f.read()[:60000]
    long_text = shakespeare + "".join(file_texts) * 40 + "x" * 300 + " " + "y" * 300  # a long run without cuts
    big = write(os.path.join(tmp, "big", "long.txt"), long_text)
    os.environ["GPT_MIRROR"] = MIRROR
    prep.READ_BYTES, prep.PIECE_CHARS, prep.TASK_CHARS = 5, 40, 100
    cuts, pools = [], []
    safe_cut, pool_class = prep.safe_cut, prep.ProcessPoolExecutor
    prep.safe_cut = lambda text: cuts.append(safe_cut(text)) or cuts[-1]
    prep.ProcessPoolExecutor = lambda *a, **kw: pools.append(a[0]) or pool_class(*a, **kw)
    files = {}
    for workers in (1, 2):
        out = os.path.join(tmp, f"stream_{workers}")
        quietly(prep.main, [big, "--out-dir", out, "--val-tokens", "100", "--shard-tokens", "5000",
                            "--workers", str(workers), "--tokenizer-out", os.path.join(tmp, "tok.bin")])
        val_path, shards = outputs(out, "long")
        files[workers] = [open(p, "rb").read() for p in [val_path] + shards]
    stream = np.concatenate([np.frombuffer(b[1024:], dtype="<u2") for b in files[1]])
    want = [EOT] + ref.encode_ordinary(long_text)
    check("tiny reads and pieces: tokens == the whole text encoded at once",
          stream.tolist() == want, f"{len(stream):,} tokens, {sum(1 for c in cuts if c):,} pieces cut")
    check("tasks of 100 characters: 2 worker processes write the same bytes as 1",
          files[1] == files[2] and pools == [2], f"{len(files[2])} files, pools started: {pools}")

    print("Tiny Shakespeare")
    ts_out = os.path.join(tmp, "ts")
    r = subprocess.run([sys.executable, os.path.join("data", "prepare_tinyshakespeare.py"), "--out-dir", ts_out,
                        "--tokenizer-out", os.path.join(ts_out, "gpt2_tokenizer.bin")],
                       capture_output=True, text=True, env=dict(os.environ, GPT_MIRROR=MIRROR))
    check("prepare_tinyshakespeare.py runs", r.returncode == 0, r.stderr.strip()[-80:])
    for name, want in TINY_SHAKESPEARE_SHA256.items():
        path = os.path.join(ts_out, name)
        got = sha256_file(path) if os.path.exists(path) else "missing"
        check(f"{name}: sha256 == the recipe's", got == want, got[:16])
    got = sha256_file(os.path.join(tmp, "tok.bin"))
    check("prepare_text.py's tokenizer file == the recipe's", got == TINY_SHAKESPEARE_SHA256["gpt2_tokenizer.bin"],
          got[:16])
    out = os.path.join(tmp, "ts_text")
    r = run([os.path.join(MIRROR, "tinyshakespeare.txt"), "--split-docs", "blankline", "--val-tokens", "32768",
             "--shard-tokens", "100000", "--out-dir", out, "--tokenizer-out", os.path.join(tmp, "tok.bin")])
    val_path, shards = outputs(out, "tinyshakespeare")
    ok = r.returncode == 0 and val_path is not None and len(shards) == 4
    check("prepare_text.py --split-docs blankline --val-tokens 32768: 4 shards", ok, r.stderr.strip()[-80:])
    if ok:
        check("  its val file == tiny_shakespeare_val.bin", sha256_file(val_path) == TINY_SHAKESPEARE_SHA256[
            "tiny_shakespeare_val.bin"])
        train = np.concatenate([read_token_file(p)[1] for p in shards])
        as_one = np.zeros(256, "<i4")
        as_one[:3] = 20240520, 1, len(train)
        got = hashlib.sha256(as_one.tobytes() + train.tobytes()).hexdigest()
        check("  its train shards, concatenated == tiny_shakespeare_train.bin",
              got == TINY_SHAKESPEARE_SHA256["tiny_shakespeare_train.bin"], f"{len(train):,} tokens")

    print("a second run with fewer shards")
    r = run([os.path.join(MIRROR, "tinyshakespeare.txt"), "--split-docs", "blankline", "--val-tokens", "0",
             "--shard-tokens", "200000", "--out-dir", out, "--tokenizer-out", os.path.join(tmp, "tok.bin")])
    val_path, shards = outputs(out, "tinyshakespeare")
    left = sorted(os.listdir(out))
    check("old shards 3-4 and the val file removed; no temporary file left",
          r.returncode == 0 and val_path is None and left == ["tinyshakespeare_train_000001.bin",
                                                               "tinyshakespeare_train_000002.bin"], f"{left}")

    print("a kill at any step while replacing an earlier run's files")
    # In-process, with os.replace and os.remove (every step that changes what a glob sees) counted:
    # at step k the run is killed as by SIGKILL: it stops, and nothing after, not even its cleanup,
    # reaches the disk. What train_gpt's globs then take must be the old set, the new set, or include
    # a file it rejects. A normal run after it must give the new set, and no temporary file.
    prep = load_script(SCRIPT)
    enc = prep.local_encoding()
    prep.local_encoding = lambda: enc  # built once, not once per run

    class Killed(BaseException):
        pass

    def prepare_killed_at(k, args):
        """Runs prep.main(args), killed at its step k if it has that many; whether it was."""
        real = {f: getattr(os, f) for f in ("replace", "remove", "rmdir")}
        steps = [0]

        def step(f):
            def op(*a, **kw):
                steps[0] += 1
                if steps[0] > k:  # the kill; the cleanup's steps after it fail the same way
                    raise Killed
                return real[f](*a, **kw)
            return op
        for f in real:
            setattr(os, f, step(f))
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                prep.main(args)
        except Killed:
            pass
        finally:
            for f in real:
                setattr(os, f, real[f])
        return steps[0] > k

    def glob_state(out, name):
        """What train_gpt takes from NAME_train_*.bin and NAME_val_*.bin: "rejected" if a training file
        is not a token file (or there is none), else each file's tokens."""
        train = [read_token_file(p) for p in sorted(glob.glob(os.path.join(out, f"{name}_train_*.bin")))]
        if not train or not all(ok for ok, _ in train):
            return "rejected"
        val = [read_token_file(p)[1].tolist() for p in sorted(glob.glob(os.path.join(out, f"{name}_val_*.bin")))]
        return [t.tolist() for _, t in train], val

    old_text = "".join(file_texts) * 3
    new_text = ("A different corpus, shorter than the first one, about other things entirely. " * 12)
    tok_out = os.path.join(tmp, "tok.bin")
    for what, old_args, new_args in (
            ("more shards to fewer", ["--val-tokens", "5", "--shard-tokens", "60"],
             ["--val-tokens", "3", "--shard-tokens", "60"]),
            ("fewer shards to more, no val", ["--val-tokens", "5", "--shard-tokens", "200"],
             ["--val-tokens", "0", "--shard-tokens", "40"])):
        base = os.path.join(tmp, "kill_" + what.split(",")[0].replace(" ", "_"))
        old_in = write(os.path.join(base, "in", "old", "k.txt"), old_text)
        new_in = write(os.path.join(base, "in", "new", "k.txt"), new_text)
        sets = {}
        for which, text_in, args in (("old", old_in, old_args), ("new", new_in, new_args)):
            out = os.path.join(base, which)
            prepare_killed_at(10**9, [text_in, "--out-dir", out, "--tokenizer-out", tok_out] + args)
            sets[which] = glob_state(out, "k")
        new_files = sorted(os.listdir(os.path.join(base, "new")))
        new_run = [new_in, "--out-dir", os.path.join(base, "work"), "--tokenizer-out", tok_out] + new_args
        seen, bad, rerun_bad, k = {"old": 0, "new": 0, "rejected": 0}, [], [], 0
        while True:
            work = os.path.join(base, "work")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(os.path.join(base, "old"), work)
            killed = prepare_killed_at(k, new_run)
            got = glob_state(work, "k")
            which = "rejected" if got == "rejected" else next((w for w in sets if got == sets[w]), None)
            if which is None:
                bad.append(k)
            else:
                seen[which] += 1
            prepare_killed_at(10**9, new_run)
            if glob_state(work, "k") != sets["new"] or sorted(os.listdir(work)) != new_files:
                rerun_bad.append(k)
            if not killed:
                break
            k += 1
        check(f"{what}: a kill at each of {k} steps shows old, new or rejected", not bad and seen["rejected"] > 0,
              f"{seen}" + (f", a mix after steps {bad}" if bad else ""))
        check(f"{what}: a rerun after each gives the new set, no temp file", not rerun_bad,
              f"wrong after steps {rerun_bad}" if rerun_bad else "")
    placeholder = os.path.join(tmp, "placeholder.bin")
    with open(placeholder, "wb") as f:
        f.write(prep.PLACEHOLDER)
    if not os.access(TOOL, os.X_OK):
        skip("fileio.h's read_token_file rejects the placeholder", f"{TOOL} not built")
    else:
        r = subprocess.run([TOOL, "read-tokens", placeholder, "50257"], capture_output=True, text=True)
        check("fileio.h's read_token_file rejects the placeholder", r.returncode != 0, r.stderr.strip()[:70])

    print("temporary files")
    out = os.path.join(tmp, "leftovers")
    leftover = [".mix.tokens.tmp.ab_c12", ".mix_train_000002.bin.new", ".mix_val_000000.bin.new.tmp.x9y_z",
                "mix_train_000001.bin.tmp.q1w2e3"]
    others = [".other.tokens.tmp.ab_c12", "mixer_train_000001.bin.tmp.q1w2e3", ".mix_train_000002.bin.old", "notes.txt"]
    for f in leftover + others:
        write(os.path.join(out, f), "x")
    r = run([os.path.join(corpus, "a.txt"), "--name", "mix", "--out-dir", out, "--tokenizer-out", tok_out])
    left = set(os.listdir(out))
    check("a killed run's temporary files go at the next start, others stay",
          r.returncode == 0 and not left & set(leftover) and set(others) <= left,
          f"{sorted(left & set(leftover))} left" if left & set(leftover) else r.stderr.strip()[-60:])
    import gpt2_bpe  # beside the scripts (data/), on sys.path since they were loaded
    synced, real_fsync = [], os.fsync
    os.fsync = lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real_fsync(fd)
    try:
        gpt2_bpe.atomic_write(os.path.join(tmp, "atomic.bin"), [b"x"])
    finally:
        os.fsync = real_fsync
    check("atomic_write syncs the file, then its folder (the rename)", synced == [False, True], f"{synced}")
    big = write(os.path.join(tmp, "sig", "big.txt"), shakespeare * 400)  # encoding takes seconds
    for sig in (signal.SIGTERM, signal.SIGHUP):
        out = os.path.join(tmp, "sig", "out")
        p = subprocess.Popen([sys.executable, SCRIPT, big, "--out-dir", out, "--tokenizer-out", tok_out],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, GPT_MIRROR=MIRROR))
        deadline = time.time() + 60
        while not glob.glob(os.path.join(out, ".big.tokens.tmp.*")) and p.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        streaming = p.poll() is None
        p.send_signal(sig)
        try:
            err = p.communicate(timeout=60)[1].strip()
        except subprocess.TimeoutExpired:
            p.kill()
            err = "hung after the signal: killed"
        check(f"{sig.name} while encoding: exits {128 + sig}, temp stream and new folder gone",
              streaming and p.returncode == 128 + sig and not err and not os.path.exists(out),
              err[-60:] if err else f"exit code {p.returncode}, folder {'left' if os.path.exists(out) else 'gone'}")
        shutil.rmtree(out, ignore_errors=True)

    # Ctrl-C reaches the whole process group: the workers too. Sent once the 2 workers run.
    out = os.path.join(tmp, "sig", "out")
    p = subprocess.Popen([sys.executable, SCRIPT, big, "--out-dir", out, "--tokenizer-out", tok_out, "--workers", "2"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                         env=dict(os.environ, GPT_MIRROR=MIRROR))
    deadline = time.time() + 60
    while len(group_processes(p.pid)) < 3 and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    started = len(group_processes(p.pid)) >= 3
    os.killpg(p.pid, signal.SIGINT)
    try:
        err = p.communicate(timeout=60)[1].strip()
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        err = "hung after the signal: killed"
    deadline = time.time() + 10
    while group_processes(p.pid) and time.time() < deadline:
        time.sleep(0.05)
    left = group_processes(p.pid)
    check("SIGINT to the group (Ctrl-C) with 2 workers running: exits 130, no traceback, nothing left",
          started and p.returncode == 130 and not err and not os.path.exists(out) and not left,
          err[-60:] if err else f"workers seen: {started}, exit code {p.returncode}, processes left: {len(left)}")
    shutil.rmtree(out, ignore_errors=True)

    print("names with glob characters")
    # A folder named with glob characters: NAME gets "_" for them, so the glob of the README takes
    # its shards, and the -i the program prints (the folder escaped) takes exactly those.
    odd = os.path.join(tmp, "prep[1]")
    write(os.path.join(odd, "a.txt"), "one document of a folder named with brackets\n")
    write(os.path.join(odd, "b.txt"), "and another one, to have a few shards\n")
    out = os.path.join(tmp, "odd out[2]")
    r = run([odd, "--out-dir", out, "--val-tokens", "2", "--shard-tokens", "4", "--tokenizer-out", tok_out])
    on_disk = sorted(os.path.join(out, f) for f in os.listdir(out) if "_train_" in f) if os.path.isdir(out) else []
    taken = sorted(glob.glob(os.path.join(glob.escape(out), "prep_1__train_*.bin")))
    check("folder 'prep[1]': NAME 'prep_1_', every shard taken by the escaped glob",
          r.returncode == 0 and len(on_disk) > 1 and taken == on_disk, f"{len(taken)} of {len(on_disk)} shards")
    said = [line for line in r.stdout.splitlines() if line.startswith("train on them:")]
    words = shlex.split(said[0]) if said else []
    i_arg = words[words.index("-i") + 1] if "-i" in words else ""
    check("  the -i it prints takes the same shards", said and sorted(glob.glob(i_arg)) == on_disk, i_arg)
    write(os.path.join(tmp, "lit", "x[1].txt"), "the file named with brackets\n")
    write(os.path.join(tmp, "lit", "x1.txt"), "the file its name as a glob would match\n")
    out = os.path.join(tmp, "lit_out")
    r = run([os.path.join(tmp, "lit", "x[1].txt"), "--out-dir", out, "--val-tokens", "0", "--tokenizer-out", tok_out])
    _, shards = outputs(out, "x_1_") if os.path.isdir(out) else (None, [])
    got = read_token_file(shards[0])[1].tolist() if shards else []
    check("an INPUT that exists is itself, not a glob: x[1].txt, not x1.txt",
          r.returncode == 0 and got == [EOT] + ref.encode_ordinary("the file named with brackets\n"), r.stderr.strip()[-60:])

    print("what the run says")
    words = write(os.path.join(tmp, "say", "words.txt"), shakespeare[:20000])
    write(os.path.join(tmp, "say", "blank.txt"), " \n\t\n  \n")
    out = os.path.join(tmp, "say_out")
    r = run([os.path.join(tmp, "say"), "--out-dir", out, "--val-tokens", "1", "--tokenizer-out", tok_out])
    check("a whitespace-only file is a skipped document; '1 document', '1 token'",
          r.returncode == 0 and "  1 document, 1 empty or whitespace-only skipped," in r.stdout
          and "  1 token -> " in r.stdout and "1 documents" not in r.stdout and "1 tokens" not in r.stdout,
          r.stdout.strip().splitlines()[-4] if r.returncode == 0 else r.stderr.strip()[-60:])
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    check("--val-tokens 1: a warning that no -t validates on it", r.returncode == 0 and len(warned) == 1
          and "too few for train_gpt's validation at any -t" in warned[0], warned[0][:100] if warned else "no warning")
    for val, says in (("10", "with -t 9 at most"), ("1024", "with -t 1023 at most"), ("1025", None)):
        r = run([words, "--out-dir", out, "--val-tokens", val, "--tokenizer-out", tok_out])
        warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
        if says:
            ok = r.returncode == 0 and len(warned) == 1 and says in warned[0] and "--val-tokens 1025" in warned[0]
        else:
            ok = r.returncode == 0 and not warned
        check(f"--val-tokens {val}: " + (f"warns, names the largest -t ({says})" if says else "no warning"), ok,
              warned[0][:100] if warned else r.stderr.strip()[-60:])
    nul = write(os.path.join(tmp, "nul", "nul.txt"), data=b"\0" * 1000)
    r = run([nul, "--out-dir", os.path.join(tmp, "nul_out"), "--val-tokens", "0", "--tokenizer-out", tok_out])
    check("1,000 NUL bytes: encoded, with a warning that the file is likely not text",
          r.returncode == 0 and "warning: '" + nul + "' holds 1,000 NUL characters: is it text?" in r.stderr,
          r.stderr.strip()[:100])
    help_text = run(["-h"]).stdout + load_script(SCRIPT).__doc__
    advice = [line for line in help_text.splitlines() if "--split-docs line" in line and "JSON" in line]
    check("no advice to read JSON lines with --split-docs line", "--split-docs" in help_text and not advice,
          advice[0] if advice else "")

    print("--skip-bad-files in a folder of text")
    good_dir, mixed_dir = os.path.join(tmp, "text_good"), os.path.join(tmp, "text_mixed")
    for folder in (good_dir, mixed_dir):
        write(os.path.join(folder, "1.txt"), shakespeare[:3000])
        write(os.path.join(folder, "3.txt"), shakespeare[3000:5000])
    write(os.path.join(mixed_dir, "2.txt"), data=shakespeare[5000:9000].encode("utf-8") + "Größe\n".encode("latin-1"))
    same = ["--name", "t", "--val-tokens", "20", "--shard-tokens", "300", "--tokenizer-out", tok_out]
    r_good = run([good_dir, "--out-dir", os.path.join(tmp, "tg_out")] + same)
    r = run([mixed_dir, "--out-dir", os.path.join(tmp, "tm_out"), "--skip-bad-files"] + same)
    def folder_bytes(d):
        return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))} if os.path.isdir(d) else None
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: skipped")]
    check("a non-UTF-8 file among three: skipped, named, the files of the other two",
          r_good.returncode == 0 and r.returncode == 0 and folder_bytes(os.path.join(tmp, "tm_out")) ==
          folder_bytes(os.path.join(tmp, "tg_out")) and len(warned) == 1 and "2.txt' is not UTF-8" in warned[0],
          warned[0][:100] if warned else r.stderr.strip()[-80:])
    ok, line = one_line_error(run([mixed_dir, "--out-dir", os.path.join(tmp, "never_tm")] + same), "2.txt' is not UTF-8")
    check("without the flag: one error line that names the file and the flag", ok and "--skip-bad-files" in line, line)

    print("bad inputs: one `error:` line, exit code 1")
    bad = write(os.path.join(tmp, "bad", "latin1.txt"), data="first line\nzweite Zeile: Gr\xf6\xdfe\n".encode("latin-1"))
    empty = write(os.path.join(tmp, "bad", "empty.txt"), data=b"")
    tiny = write(os.path.join(tmp, "bad", "tiny.txt"), "hello world, hello")
    no_out = os.path.join(tmp, "never")
    base = ["--out-dir", no_out, "--tokenizer-out", os.path.join(no_out, "tok.bin")]
    cases = [
        ("missing input", [os.path.join(tmp, "nope.txt")] + base, "not found"),
        ("not UTF-8: says where (byte offset and line)", [bad] + base, "offset 27 (line 2)"),
        ("empty input", [empty] + base, "no text"),
        ("folder without matching files", [os.path.join(tmp, "bad"), "--glob", "*.rst"] + base, "--glob"),
        ("validation split leaves no training tokens", [tiny, "--val-tokens", "4"] + base, "leaves 1 training token of 5"),
        ("--val-fraction 1.5", [tiny, "--val-fraction", "1.5"] + base, "--val-fraction"),
        ("--val-fraction with --val-tokens", [tiny, "--val-fraction", "0.1", "--val-tokens", "1"] + base, "not allowed"),
        ("--shard-tokens 0", [tiny, "--shard-tokens", "0"] + base, "--shard-tokens"),
        ("--shard-tokens x", [tiny, "--shard-tokens", "x"] + base, "--shard-tokens"),
        ("--split-docs words", [tiny, "--split-docs", "words"] + base, "--split-docs"),
        ("empty --doc-separator", [tiny, "--doc-separator", ""] + base, "--doc-separator"),
        ("unknown flag", [tiny, "--bogus"] + base, "--bogus"),
        ("no input", base, "INPUT"),
        ("--name with a glob character", [tiny, "--name", "a[1]"] + base, "--name 'a[1]' holds a glob character"),
        ("--out-dir a file", [tiny, "--out-dir", tiny, "--tokenizer-out", os.path.join(no_out, "tok.bin")],
         f"--out-dir '{tiny}' is a file, not a folder"),
        ("--out-dir inside a file", [tiny, "--out-dir", os.path.join(tiny, "sub"),
                                     "--tokenizer-out", os.path.join(no_out, "tok.bin")],
         "cannot make the folder (Not a directory)"),
    ]
    pipes = os.path.join(tmp, "pipes")
    os.makedirs(pipes)
    os.mkfifo(os.path.join(pipes, "pipe.txt"))
    zero = os.path.join(tmp, "zero")
    os.makedirs(zero)
    os.symlink("/dev/zero", os.path.join(zero, "zero.txt"))
    cases += [
        ("a FIFO in an input folder", [pipes] + base, "pipe.txt' is not a regular file"),
        ("a link to /dev/zero in an input folder", [zero] + base, "zero.txt' is not a regular file"),
        ("a FIFO as an input", [os.path.join(pipes, "pipe.txt")] + base, "is not a regular file"),
        ("--tokenizer-out a FIFO", [tiny, "--out-dir", no_out, "--tokenizer-out", os.path.join(pipes, "pipe.txt")],
         "is not a regular file"),
    ]
    for what, args, mention in cases:
        ok, line = one_line_error(run(args, timeout=30), mention)
        check(what, ok, line)
    ts = os.path.join("data", "prepare_tinyshakespeare.py")
    ok, line = one_line_error(run(["--bogus"], script=ts), "--bogus")
    check("prepare_tinyshakespeare.py: unknown flag", ok, line)
    ok, line = one_line_error(run(["--out-dir", no_out, "--tokenizer-out", os.path.join(pipes, "pipe.txt")],
                                  script=ts, timeout=30), "is not a regular file")
    check("prepare_tinyshakespeare.py: --tokenizer-out a FIFO", ok, line)
    ok, line = one_line_error(run([tiny] + base, mirror=os.path.join(tmp, "no_mirror")), "GPT_MIRROR")
    check("no GPT-2 BPE files: names GPT_MIRROR", ok, line)
    check("failed runs wrote nothing (no output folder)", not os.path.exists(no_out))
    r = run(["-h"])
    check("-h: usage, exit code 0", r.returncode == 0 and r.stdout.startswith("usage:"))

    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
