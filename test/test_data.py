"""Data preparation and the C++ file readers, end to end. No GPU, no internet.

Prepares Tiny Shakespeare from the offline mirror ($GPT_MIRROR, default ../shared/mirror beside the
repo) into a temp folder, then checks the files against an independent reference (tiktoken's own
GPT-2 loader and llm.c's tokenization), and checks that fileio.h (through build/test/token_file_tool)
reads the good files and rejects broken ones with a one-line error. Ends with `N passed, N failed,
N skipped`.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402  (test/checks.py: the count line every test ends with)
from checks import check, finish  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
sys.dont_write_bytecode = True  # importing the prepare script must not leave __pycache__ in data/
SCRIPT = os.path.join("data", "prepare_tinyshakespeare.py")
TOOL = os.path.join("build", "test", "token_file_tool")
MIRROR = os.path.abspath(os.environ.get("GPT_MIRROR") or os.path.join("..", "shared", "mirror"))
EOT, VOCAB, VAL_TOKENS = 50256, 50257, 32768



def run(args, mirror=MIRROR):
    env = dict(os.environ, GPT_MIRROR=mirror)
    return subprocess.run(args, capture_output=True, text=True, env=env)


def prepare(out, mirror=MIRROR):
    return run([sys.executable, SCRIPT, "--out-dir", out, "--tokenizer-out", os.path.join(out, "tok.bin")], mirror)


def one_line_error(r, must_mention=""):
    """Exit code 1 (not a signal, not a traceback) and exactly one `error: ...` line on stderr."""
    return checks.one_line_error(r.returncode, r.stderr, must_mention)


def header(magic, version, count, extra=0):
    h = np.zeros(256, dtype="<i4")
    h[:4] = magic, version, count, extra
    return h.tobytes()


def read_header(path):
    with open(path, "rb") as f:
        return [int(x) for x in np.frombuffer(f.read(1024), dtype="<i4")[:4]]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def main():
    if not os.path.isfile(os.path.join(MIRROR, "tinyshakespeare.txt")):
        check(f"mirror present at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    if not os.access(TOOL, os.X_OK):
        check(f"{TOOL} built", False, "run `make build/test/token_file_tool`")
        finish()
    tmp_holder = tempfile.TemporaryDirectory(prefix="test_data.")
    tmp = tmp_holder.name
    out = os.path.join(tmp, "out")
    val_path = os.path.join(out, "tiny_shakespeare_val.bin")
    train_path = os.path.join(out, "tiny_shakespeare_train.bin")
    tok_path = os.path.join(out, "tok.bin")

    print("prepare script")
    r = prepare(out)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
    if not check("prepares from the mirror into a temp folder", r.returncode == 0, last):
        finish()

    # The reference: tiktoken's own GPT-2 loader on the mirror files (TIKTOKEN_CACHE_DIR="" turns its
    # cache off, so it only reads the local paths), and llm.c's tokenization of the text.
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ref_ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(MIRROR, "gpt2", "vocab.bpe"),
                                                os.path.join(MIRROR, "gpt2", "encoder.json"))
    ref = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ref_ranks,
                            special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB)
    with open(os.path.join(MIRROR, "tinyshakespeare.txt"), "rb") as f:
        text_bytes = f.read()
    text = text_bytes.decode("utf-8")
    ref_tokens = ref.encode("<|endoftext|>" + text.replace("\n\n", "\n\n<|endoftext|>"),
                            allowed_special={"<|endoftext|>"})

    spec = importlib.util.spec_from_file_location("prep", SCRIPT)
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    with open(os.path.join(MIRROR, "gpt2", "encoder.json"), "rb") as f, \
            open(os.path.join(MIRROR, "gpt2", "vocab.bpe"), "rb") as g:
        ours = prep.gpt2_mergeable_ranks(f.read(), g.read())
    check("our BPE ranks == tiktoken's data_gym loader", ours == ref_ranks, f"{len(ours)} ranks")

    print("token files (llm.c format)")
    splits = {}
    for name, path in (("val", val_path), ("train", train_path)):
        magic, version, count, _ = read_header(path)
        size = os.path.getsize(path)
        check(f"{name}: magic 20240520, version 1, size == 1024 + 2*count",
              magic == 20240520 and version == 1 and size == 1024 + 2 * count,
              f"magic {magic} version {version} count {count} size {size}")
        splits[name] = np.fromfile(path, dtype="<u2", offset=1024)
    val, train = splits["val"], splits["train"]
    check("val has 32,768 tokens", len(val) == VAL_TOKENS, f"{len(val):,}")
    check("train has the rest", len(val) + len(train) == len(ref_tokens),
          f"train {len(train):,}, total {len(val) + len(train):,}, corpus {len(ref_tokens):,}")
    both = np.concatenate([val, train])
    check("tokens == llm.c's tokenization (EOT before each section)",
          len(both) == len(ref_tokens) and bool(np.all(both == np.array(ref_tokens, dtype=np.uint16))))
    # Every EOT was inserted by the preparation, so dropping them must give back the exact text.
    decoded = ref.decode_bytes([int(t) for t in both if t != EOT])
    check("decode(tokens minus EOT) == the corpus, byte for byte", decoded == text_bytes,
          f"{len(decoded):,} of {len(text_bytes):,} bytes")
    check("one EOT per blank-line-separated section", int(np.sum(both == EOT)) == len(text.split("\n\n")),
          f"{int(np.sum(both == EOT)):,} documents")

    print("C++ token reader (fileio.h read_token_file)")
    for name, arr, path in (("val", val, val_path), ("train", train, train_path)):
        r = run([TOOL, "read-tokens", path, str(VOCAB)])
        want = f"tokens {len(arr)} first {arr[0]} last {arr[-1]}"
        check(f"accepts {name}", r.returncode == 0 and r.stdout.strip() == want, r.stdout.strip() or r.stderr.strip())
    good = open(val_path, "rb").read()
    bad_tokens = np.frombuffer(good[1024:], dtype="<u2").copy()
    bad_tokens[123] = VOCAB
    broken = {
        "truncated by one byte": good[:-1],
        "one byte too long": good + b"\0",
        "header cut short": good[:100],
        "wrong magic": header(20240521, 1, VAL_TOKENS) + good[1024:],
        "wrong version": header(20240520, 2, VAL_TOKENS) + good[1024:],
        "header only (count 0)": header(20240520, 1, 0),
        "header only (count 1)": header(20240520, 1, 1),
        "negative count": header(20240520, 1, -5) + good[1024:],
        "empty file": b"",
        "token id == vocab size": good[:1024] + bad_tokens.tobytes(),
    }
    for what, data in broken.items():
        path = write(os.path.join(tmp, "broken.bin"), data)
        ok, line = one_line_error(run([TOOL, "read-tokens", path, str(VOCAB)]), path)
        check(f"rejects {what}", ok, line)
    missing = os.path.join(tmp, "no_such_file.bin")
    ok, line = one_line_error(run([TOOL, "read-tokens", missing, str(VOCAB)]), missing)
    check("rejects a missing file", ok, line)

    print("C++ token streams (fileio.h expand_glob, TokenStream: train_gpt's -i / -j)")
    for folder in ("run[1]", "plain"):
        os.makedirs(os.path.join(tmp, folder))
        for k in (1, 2):
            write(os.path.join(tmp, folder, f"x_train_00000{k}.bin"), good)
    literal = os.path.join(tmp, "run[1]", "x_train_000001.bin")
    r = run([TOOL, "read-stream", literal, str(VOCAB)])
    check("a path that exists is itself, '[' and all: run[1]/x_train_000001.bin",
          r.returncode == 0 and r.stdout.splitlines() == [f"files 1 tokens {len(val)}", literal],
          (r.stdout or r.stderr).strip().replace("\n", " | ")[:100])
    for what, pattern in (("a glob: x_train_*.bin", "x_train_*.bin"), ("a glob with a class: x_train_00000[12].bin",
                                                                      "x_train_00000[12].bin")):
        r = run([TOOL, "read-stream", os.path.join(tmp, "plain", pattern), str(VOCAB)])
        check(f"{what} -> both shards, in order", r.returncode == 0 and r.stdout.splitlines() == [
            f"files 2 tokens {2 * len(val)}"] + [os.path.join(tmp, "plain", f"x_train_00000{k}.bin") for k in (1, 2)],
              (r.stdout or r.stderr).strip().replace("\n", " | ")[:100])
    nothing = os.path.join(tmp, "plain", "y_*.bin")
    ok, line = one_line_error(run([TOOL, "read-stream", nothing, str(VOCAB)]), "no file matches")
    check("a glob matching nothing: one line", ok, line)

    print("tokenizer file")
    magic, version, vocab, eot = read_header(tok_path)
    check("header: magic 20240328, version 2, vocab 50257, eot 50256",
          (magic, version, vocab, eot) == (20240328, 2, VOCAB, EOT), f"{magic} {version} {vocab} {eot}")
    r = run([TOOL, "decode", tok_path])
    lines = r.stdout.splitlines()
    mismatches = [i for i in range(VOCAB)
                  if len(lines) != VOCAB + 1 or lines[i + 1] != ref.decode_single_token_bytes(i).hex()]
    check("C++ decode == tiktoken decode_single_token_bytes, all ids",
          r.returncode == 0 and lines[:1] == [f"vocab {VOCAB} eot {EOT}"] and not mismatches,
          f"{len(mismatches)} of {VOCAB} differ" if mismatches else f"{VOCAB} ids")
    tok = open(tok_path, "rb").read()
    v1 = write(os.path.join(tmp, "tok_v1.bin"), header(20240328, 1, VOCAB) + tok[1024:])
    r = run([TOOL, "decode", v1])
    check("accepts version 1 (no eot recorded: eot -1)", r.returncode == 0 and r.stdout.startswith(f"vocab {VOCAB} eot -1\n"))
    broken = {
        "truncated": tok[:-3],
        "header cut short": tok[:512],
        "wrong magic": header(20240329, 2, VOCAB, EOT) + tok[1024:],
        "wrong version": header(20240328, 3, VOCAB, EOT) + tok[1024:],
        "trailing bytes": tok + b"x",
        "eot out of range": header(20240328, 2, VOCAB, VOCAB) + tok[1024:],
    }
    for what, data in broken.items():
        path = write(os.path.join(tmp, "broken_tok.bin"), data)
        ok, line = one_line_error(run([TOOL, "decode", path]), path)
        check(f"rejects tokenizer: {what}", ok, line)

    print("prepare script: idempotence and bad inputs")
    before = [os.stat(p).st_mtime_ns for p in (val_path, train_path, tok_path)]
    r = prepare(out)
    after = [os.stat(p).st_mtime_ns for p in (val_path, train_path, tok_path)]
    check("second run skips the work", r.returncode == 0 and "up to date" in r.stdout and before == after,
          r.stdout.strip().splitlines()[-1][:60] if r.stdout.strip() else r.stderr.strip())
    bad_mirror = os.path.join(tmp, "bad_mirror")
    os.makedirs(os.path.join(bad_mirror, "gpt2"))
    for name in ("tinyshakespeare.txt", "gpt2/encoder.json", "gpt2/vocab.bpe"):
        data = bytearray(open(os.path.join(MIRROR, name), "rb").read())
        if name == "tinyshakespeare.txt":
            data[1000] ^= 1
        write(os.path.join(bad_mirror, name), data)
    ok, line = one_line_error(prepare(os.path.join(tmp, "out_bad"), bad_mirror), "sha256")
    check("altered mirror byte: one-line sha256 error, exit 1", ok, line)
    no_mirror = os.path.join(tmp, "no_mirror")
    ok, line = one_line_error(prepare(os.path.join(tmp, "out_none"), no_mirror), "GPT_MIRROR")
    check("missing mirror: one-line error naming GPT_MIRROR, exit 1", ok, line)
    check("failed runs wrote nothing", not os.path.exists(os.path.join(tmp, "out_bad"))
          and not os.path.exists(os.path.join(tmp, "out_none")))

    print("fileio.h helpers")
    for data in (b"123456789", b"The quick brown fox jumps over the lazy dog", good):
        path = write(os.path.join(tmp, "crc.bin"), data)
        r = run([TOOL, "crc32", path])
        want = f"{zlib.crc32(data):08x}"
        check(f"crc32 of {len(data)} bytes == zlib.crc32", r.stdout.strip() == want, f"{r.stdout.strip()} vs {want}")
    copy_dir = os.path.join(tmp, "copy")
    os.makedirs(copy_dir)
    r = run([TOOL, "copy", train_path, os.path.join(copy_dir, "x.bin")])
    same = r.returncode == 0 and open(os.path.join(copy_dir, "x.bin"), "rb").read() == open(train_path, "rb").read()
    check("write_file_atomic: exact copy, no temp file left", same and os.listdir(copy_dir) == ["x.bin"])
    target = os.path.join(tmp, "no_such_dir", "x.bin")
    ok, line = one_line_error(run([TOOL, "copy", train_path, target]), target)
    check("write_file_atomic into a missing folder: error, not a crash", ok, line)
    for value, want in (("42", "42"), ("1024", "1024"), ("1", "1")):
        r = run([TOOL, "parse-int", value, "1", "1024"])
        check(f"parse_int_flag accepts '{value}'", r.returncode == 0 and r.stdout.strip() == want, r.stdout.strip())
    for value in ("12x", "", " 5", "0x10", "1025", "0", "1.5", "99999999999999999999"):
        ok, line = one_line_error(run([TOOL, "parse-int", value, "1", "1024"]), "[1, 1024]")
        check(f"parse_int_flag rejects '{value}'", ok, line)
    r = run([TOOL, "parse-float", "3e-4", "0", "1"])
    check("parse_float_flag accepts '3e-4'", r.returncode == 0 and float(r.stdout) == 3e-4, r.stdout.strip())
    for value in ("nan", "inf", "-inf", "1.5x", "", "2", "1e999"):
        ok, line = one_line_error(run([TOOL, "parse-float", value, "0", "1"]))
        check(f"parse_float_flag rejects '{value}'", ok, line)

    tmp_holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
