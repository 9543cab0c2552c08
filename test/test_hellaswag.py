"""HellaSwag as llm.c scores it, on the CPU: data/prepare_hellaswag.py and gpt_reference.py eval.

Writes a made-up HellaSwag file (a few hundred items of random words with accents, CJK, emoji,
combining marks and odd spacing, ragged lengths, rowanz/hellaswag's fields, a blank line, CRLF line
ends, labels as integers and as digit strings), prepares it plain and gzipped, and checks:
  - every example's tokens are tiktoken's own GPT-2 encoding (built by tiktoken's loader from the
    mirror) of ctx and of " " + each ending, as llm.c's dev/data/hellaswag.py encodes them; labels
    and indices (the example's position) right;
  - the file is byte for byte llm.c's format packed here from its description (header, example
    words, longest_example_bytes), and the gzipped input gives the same bytes;
  - data/eval_file.py reads it back, and refuses damaged files as evaluation.h does;
  - bad inputs and outputs fail with one `error:` line, exit code 1, and nothing written;
  - gpt_reference.py eval on a tiny random model with GPT-2's vocabulary: every completion's loss sum
    (--scores) equals one computed here from the JSON text (one row at a time, from the model's blocks,
    log_softmax, fsum), and acc and acc_norm equal those chosen here from these sums, on the first 80
    examples with -B 16 and the first 24 with -B 5 (--limit: every position costs a 50257-wide LM head
    on the CPU); ties go to the lowest index; bad models, files and flags fail in one line.
About 35 s on 2 cores. Ends with `N passed, N failed, N skipped`.
"""

import gzip
import importlib.util
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import MIRROR, ROOT, check, finish, one_line_error, ref_cli  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "data"))
import eval_file  # noqa: E402

SCRIPT = os.path.join(ROOT, "data", "prepare_hellaswag.py")
EXAMPLES = 300
EVAL_EXAMPLES, EVAL_EXAMPLES_B5 = 80, 24  # the first ones, scored (V = 50257 makes every position cost)
ROUNDING = 1e-6  # relative: scores closer than this may be ordered either way by two fp32 computations
MAXT = 256  # the tiny model's; every made-up row fits
WORDS = ["the", "a", "man", "woman", "is", "holding", "rope", "and", "then", "jumps", "over", "into", "water",
         "slowly", "don't", "U.S.", "3.14", "1,000", "(see", "below)", "\"quoted\"", "it's", "WikiHow:", "step",
         "café", "naïve", "Größe", "Ελληνικά", "русский", "日本語の", "テキスト", "中文", "한국어", "مرحبا",
         "😀", "👩‍💻", "e\u0301", "ﬁne", "—", "…", "  double", "tab\there", "new\nline", " ", "ß", "Œuvre"]


def random_text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def made_up_items(rng, n):
    items = []
    for i in range(n):
        ctx_a = random_text(rng, 1, 40 if i % 37 == 2 else 8)
        ctx_b = random_text(rng, 0, 2)
        endings = [random_text(rng, 0, 20 if i % 41 == 4 and k == 1 else 6) + rng.choice(["", ".", "!", " ?"])
                   for k in range(4)]
        label = rng.randrange(4)
        items.append({"ind": 1000 + 3 * i, "activity_label": rng.choice(["Roof shingle removal", "Cooking"]),
                      "ctx_a": ctx_a, "ctx_b": ctx_b, "ctx": (ctx_a + " " + ctx_b) if ctx_b else ctx_a,
                      "split": "val", "split_type": rng.choice(["indomain", "zeroshot"]),
                      "label": str(label) if i % 7 == 3 else label, "endings": endings,
                      "source_id": f"activitynet~v_{i}"})
    items[5]["endings"][2] = ""       # an empty ending: " " is one token
    items[6]["ctx"] = "x"             # a one-token context
    return items


def jsonl(items):
    """JSON lines as the user's file might hold them: a blank line, some CRLF line ends, raw UTF-8."""
    lines = [json.dumps(item, ensure_ascii=i % 2 == 0) + ("\r\n" if i % 5 == 0 else "\n")
             for i, item in enumerate(items)]
    lines.insert(10, "\n")
    return "".join(lines).encode("utf-8")


def pack_llmc(examples):
    """llm.c's eval file from its description (dev/data/data_common.py's write_evalfile): 256 int32
    (20240522, 1, examples, longest example in bytes), then per example the uint16 words 65535, its
    bytes, its index, label, completions, context length + tokens, each completion's length + tokens."""
    body, longest = [], 0
    for i, (label, ctx, ends) in enumerate(examples):
        words = [65535, 0, i, label, len(ends), len(ctx)] + list(ctx)
        for e in ends:
            words += [len(e)] + list(e)
        words[1] = 2 * len(words)
        longest = max(longest, words[1])
        body += words
    return struct.pack("<256i", 20240522, 1, len(examples), longest, *[0] * 252) + struct.pack(
        f"<{len(body)}H", *body)


def reference_encoding():
    """GPT-2's encoding built by tiktoken's own loader from the mirror's files (independently of
    data/gpt2_bpe.py)."""
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(MIRROR, "gpt2", "vocab.bpe"),
                                            os.path.join(MIRROR, "gpt2", "encoder.json"))
    return tiktoken.Encoding(name="gpt2-ref", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def prepare(args):
    r = subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                       env=dict(os.environ, GPT_MIRROR=MIRROR))
    return r.returncode, r.stdout, r.stderr


def write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def check_prepare(tmp, enc, items):
    """The good file: tokens, labels, indices, bytes. Returns the eval file's path."""
    src = write(os.path.join(tmp, "hellaswag_val.jsonl"), jsonl(items))
    out = os.path.join(tmp, "out", "hellaswag_val.bin")
    rc, stdout, stderr = prepare([src, "--out", out])
    done = [ln for ln in stdout.splitlines() if ln.startswith("done:")]
    if not check("prepare_hellaswag.py on the made-up file runs", rc == 0,
                 (done[0].replace(tmp, "TMP") if rc == 0 and done else stderr.strip()[-200:])):
        return None
    labels = [int(item["label"]) for item in items]
    counts = " / ".join(f"{labels.count(k):,}" for k in range(4))
    check("it prints the example count and the labels' counts",
          f"{EXAMPLES:,} examples of 4 completions; labels 0/1/2/3: {counts}" in stdout,
          stdout.splitlines()[1].strip() if len(stdout.splitlines()) > 1 else stdout)

    want = [(int(item["label"]), enc.encode(item["ctx"]), [enc.encode(" " + e) for e in item["endings"]])
            for item in items]
    got = eval_file.read_eval_file(out, 50257)
    check("data/eval_file.py reads it: one example per item", len(got) == len(items), f"{len(got)} of {len(items)}")
    ctx_ok = sum(g.context == w[1] for g, w in zip(got, want))
    end_ok = sum(g.completions[k] == w[2][k] for g, w in zip(got, want) for k in range(4))
    check("contexts are tiktoken's encoding of ctx", ctx_ok == len(items), f"{ctx_ok} of {len(items)} equal")
    check("completions are tiktoken's encoding of \" \" + ending", end_ok == 4 * len(items),
          f"{end_ok} of {4 * len(items)} equal")
    check("labels are the items' (integers and digit strings)", [g.label for g in got] == labels, "")
    check("indices are the examples' positions 0..N-1", [g.index for g in got] == list(range(len(items))), "")
    with open(out, "rb") as f:
        data = f.read()
    expected = pack_llmc(want)
    first = next((i for i in range(min(len(data), len(expected))) if data[i] != expected[i]), None)
    check("the file is llm.c's layout, byte for byte (packed here)", data == expected,
          f"{len(data):,} bytes" if data == expected else
          f"{len(data):,} vs {len(expected):,} bytes, first difference at byte {first}")
    longest = struct.unpack_from("<i", data, 12)[0]
    rows = max(len(w[1]) + max(len(e) for e in w[2]) for w in want)
    check("header: longest_example_bytes, and the ragged rows", longest == max(
        2 * (6 + len(w[1]) + sum(1 + len(e) for e in w[2])) for w in want) and rows <= MAXT,
        f"longest example {longest} bytes, rows up to {rows} tokens (the model's maxT {MAXT})")

    gz = write(os.path.join(tmp, "hellaswag_val.jsonl.gz"), gzip.compress(jsonl(items)))
    out_gz = os.path.join(tmp, "out", "from_gz.bin")
    rc, stdout, stderr = prepare([gz, "-o", out_gz])
    same = rc == 0 and open(out_gz, "rb").read() == data
    check("a .jsonl.gz input gives the same bytes", same, stderr.strip()[-150:])
    spec = importlib.util.spec_from_file_location("prepare_hellaswag", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    default = module.default_out("/somewhere/hellaswag_val.jsonl.gz")
    check("default output: data/hellaswag/NAME.bin", default == os.path.join(ROOT, "data", "hellaswag",
                                                                             "hellaswag_val.bin"), default)
    return out


def check_bad_inputs(tmp, items):
    good = json.dumps(items[0])

    def line(**changes):
        item = dict(items[1])
        for k, v in changes.items():
            if v is None:
                del item[k]
            else:
                item[k] = v
        return json.dumps(item)

    long_ctx = " ".join(["word"] * 33000)
    cases = [  # (what, file name, content, what the error line must name)
        ("a line that is not JSON", "a.jsonl", f"{good}\n{good}\n{{\"ctx\": oops}}\n", "line 3 is not JSON"),
        ("a line that is an array", "b.jsonl", f"{good}\n[1, 2]\n", "line 2 is an array"),
        ("no ctx", "c.jsonl", f"{good}\n{line(ctx=None)}\n", "line 2 has no field 'ctx'"),
        ("no endings", "d.jsonl", f"{line(endings=None)}\n", "line 1 has no field 'endings'"),
        ("no label (the test split)", "e.jsonl", f"{good}\n{line(label=None)}\n", "test split has no labels"),
        ("label 4", "f.jsonl", f"{good}\n{line(label=4)}\n", "line 2: label 4 is out of range"),
        ("label -1", "g.jsonl", f"{line(label=-1)}\n", "label -1 is out of range"),
        ("label \"x\"", "h.jsonl", f"{line(label='x')}\n", "label is 'x'"),
        ("label true", "i.jsonl", f"{line(label=True)}\n", "label is a boolean"),
        ("label 1.0", "i2.jsonl", f"{line(label=1.0)}\n", "label is a number"),
        ("3 endings", "j.jsonl", f"{line(endings=['a', 'b', 'c'])}\n", "3 endings, expected 4"),
        ("an ending that is a number", "k.jsonl", f"{line(endings=['a', 'b', 'c', 5])}\n", "a list holding an integer"),
        ("ctx a number", "l.jsonl", f"{line(ctx=7)}\n", "ctx is an integer"),
        ("ctx empty", "m.jsonl", f"{good}\n{line(ctx='')}\n", "line 2: ctx is empty"),
        ("an example too long for uint16 sizes", "n.jsonl", f"{good}\n{line(ctx=long_ctx)}\n",
         "line 2: the example does not fit"),
        ("no example (blank lines only)", "o.jsonl", "\n\n", "holds no example"),
        ("bytes that are not UTF-8", "p.jsonl", b"{\"ctx\": \"caf\xe9\"}\n", "line 1 is not UTF-8"),
        ("damaged gzip", "q.jsonl.gz", gzip.compress(good.encode())[:-12] + b"garbage12345", "gzip"),
        ("a file of one JSON array", "r.jsonl", json.dumps(items[:2]), "line 1 is an array"),
    ]
    out_dir = os.path.join(tmp, "bad_out")
    os.makedirs(out_dir)
    for what, name, content, mention in cases:
        src = write(os.path.join(tmp, name), content)
        out = os.path.join(out_dir, name + ".bin")
        rc, stdout, stderr = prepare([src, "-o", out])
        ok, seen = one_line_error(rc, stderr, mention)
        check(f"bad input, {what}: one error line", ok and not os.path.lexists(out),
              seen.replace(tmp, "TMP")[:110])
    check("nothing left in the output folder after the failures", os.listdir(out_dir) == [],
          " ".join(os.listdir(out_dir)[:4]))

    src = write(os.path.join(tmp, "ok.jsonl"), good + "\n")
    out = os.path.join(tmp, "exists.bin")
    write(out, b"old")
    rc, stdout, stderr = prepare([src, "-o", out])
    ok, seen = one_line_error(rc, stderr, "already exists: add --force")
    check("an existing output is refused without --force", ok and open(out, "rb").read() == b"old",
          seen.replace(tmp, "TMP")[:110])
    rc, stdout, stderr = prepare([src, "-o", out, "--force"])
    check("... and replaced with --force", rc == 0 and len(eval_file.read_eval_file(out)) == 1, stderr.strip()[-100:])
    link = os.path.join(tmp, "link.jsonl")
    os.symlink(src, link)
    for what, target in (("itself", src), ("a link to it", link)):
        rc, stdout, stderr = prepare([src, "-o", target, "--force"])
        ok, seen = one_line_error(rc, stderr, "is the input")
        check(f"the output may not be the input ({what}), even with --force",
              ok and open(src).read() == good + "\n", seen.replace(tmp, "TMP")[:110])
    for what, args, mention in (
            ("a folder as output", [src, "-o", tmp], "is a folder"),
            ("an output under a file", [src, "-o", os.path.join(out, "x.bin")], "is a file, not a folder"),
            ("a missing input", [os.path.join(tmp, "missing.jsonl")], "not found"),
            ("an unknown flag", [src, "--nope"], "-h for usage"),
            ("no input", [], "-h for usage")):
        rc, stdout, stderr = prepare(args)
        ok, seen = one_line_error(rc, stderr, mention)
        check(f"{what}: one error line", ok, seen.replace(tmp, "TMP")[:110])
    rc, stdout, stderr = prepare(["-h"])
    check("-h prints the usage, exit 0", rc == 0 and stdout.startswith("usage: prepare_hellaswag.py"),
          stdout.splitlines()[0] if stdout else stderr.strip()[-100:])


def check_reader(tmp, path):
    """Damaged copies of a good file: data/eval_file.py refuses each with evaluation.h's words."""
    data = bytearray(open(path, "rb").read())
    n = struct.unpack_from("<i", data, 8)[0]
    ctx_len = struct.unpack_from("<H", data, 1024 + 10)[0]

    def changed(offset, fmt, value):
        d = bytearray(data)
        struct.pack_into(fmt, d, offset, value)
        return bytes(d)

    cases = [
        ("a cut header", bytes(data[:1000]), "no complete header (1000 bytes)"),
        ("a bad magic", changed(0, "<i", 20240520), "bad magic 20240520"),
        ("version 2", changed(4, "<i", 2), "version 2, expected 1"),
        ("0 examples", changed(8, "<i", 0), "says 0 examples"),
        ("an odd byte at the end", bytes(data) + b"\0", "odd number of bytes"),
        ("one example more in the header", changed(8, "<i", n + 1), f"example {n}: no example starts"),
        ("one example fewer in the header", changed(8, "<i", n - 1), "words after the last example"),
        ("label 4 of 4", changed(1024 + 6, "<H", 4), "example 0: label 4 of 4 completions"),
        ("a size word too large", changed(1024 + 2, "<H", 65534), "example 0: its size 65534 does not fit"),
        ("a context length past the example", changed(1024 + 10, "<H", 5000), "example 0: a damaged context"),
        ("a token id >= vocab", changed(1024 + 12 + 2 * (ctx_len - 1), "<H", 50257),
         "a damaged context (or a token id >= 50257)"),
        ("a truncated file", bytes(data[:-2]), "does not fit the file"),
    ]
    for what, content, mention in cases:
        bad = write(os.path.join(tmp, "damaged.bin"), content)
        try:
            eval_file.read_eval_file(bad, 50257)
            ok, seen = False, "read without an error"
        except eval_file.EvalFileError as e:
            ok, seen = mention in str(e), str(e)
        check(f"read_eval_file refuses {what}", ok, seen.replace(bad, "F")[:100])


def losses_here(model, rows):
    """Each completion's loss sum, one row at a time, from the model's blocks: the fp32 logits of
    the positions that predict the completion's tokens only (the LM head is wte), -log_softmax in
    float64, added exactly (fsum)."""
    import torch
    sums = []
    with torch.no_grad():
        for ctx, end in rows:
            x = torch.tensor([ctx + end])
            h = model.wte(x) + model.wpe(torch.arange(x.shape[1]))
            for block in model.h:
                h = block(h)
            at = model.ln_f(h[0, len(ctx) - 1:len(ctx) - 1 + len(end)])  # position t predicts token t + 1
            logp = torch.log_softmax((at @ model.wte.weight[:50257].t()).double(), dim=-1)
            sums.append(math.fsum(-logp[j, t].item() for j, t in enumerate(end)))
    return sums


def read_scores(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return lines[0].split("\t"), [line.split("\t") for line in lines[1:]]


def check_eval(tmp, enc, items, eval_path):
    import gpt_reference as ref
    ckpt = os.path.join(tmp, "tiny.ckpt")
    rc, out, err = ref_cli(["init", "--model", f"L=2,NH=3,C=39,V=50257,maxT={MAXT}", "--seed", "7", "--out", ckpt])
    if not check("a tiny random model with GPT-2's vocabulary", rc == 0,
                 (err or out).strip().replace(tmp, "TMP")[-100:]):
        return
    model = ref.read_checkpoint(ckpt).eval()

    items = items[:EVAL_EXAMPLES]
    rows = [(enc.encode(item["ctx"]), enc.encode(" " + e)) for item in items for e in item["endings"]]
    here = np.array(losses_here(model, rows)).reshape(len(items), 4)
    lengths = np.array([len(e) for _, e in rows]).reshape(len(items), 4)
    labels = np.array([int(item["label"]) for item in items])
    longest = max(len(c) + len(e) for c, e in rows)
    means = here / lengths
    acc_here = int((here.argmin(1) == labels).sum())
    norm_here = int((means.argmin(1) == labels).sum())

    def margin(v):  # relative gap between the two best scores of each example
        s = np.sort(v, axis=1)
        return (s[:, 1] - s[:, 0]) / np.abs(s[:, 0])
    close = int(((margin(here) < ROUNDING) | (margin(means) < ROUNDING)).sum())

    def run_eval(batch, limit, name):
        scores = os.path.join(tmp, name)
        args = ["eval", "-e", ckpt, "--hellaswag", eval_path, "-B", str(batch), "--scores", scores, "--device", "cpu"]
        rc, out, err = ref_cli(args + (["--limit", str(limit)] if limit else []))
        shown = [ln for ln in (err or out).strip().splitlines() if ln.startswith(("acc_norm", "error"))]
        if not check(f"gpt_reference.py eval -B {batch}{f' --limit {limit}' if limit else ''} runs", rc == 0,
                     (shown or (err or out).strip().splitlines() or [""])[-1][:150]):
            return None
        lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()[:1] in (["acc"], ["acc_norm"])}
        header, table = read_scores(scores)
        return lines, header, table

    for batch, limit in ((16, EVAL_EXAMPLES), (5, EVAL_EXAMPLES_B5)):
        got = run_eval(batch, limit, f"scores_{batch}.tsv")
        if got is None:
            continue
        lines, header, table = got
        n = limit
        want_header = ["example", "index", "label", "completion", "tokens", "loss_sum", "loss_mean"]
        check(f"-B {batch}: --scores has the columns and a line per completion",
              header == want_header and len(table) == 4 * n, f"{header}, {len(table)} lines")
        if header != want_header or len(table) != 4 * n:
            continue
        ids = np.array([[int(c) for c in r[:5]] for r in table])
        sums = np.array([float(r[5]) for r in table]).reshape(n, 4)
        expect_ids = np.array([[e, e, labels[e], k, lengths[e, k]] for e in range(n) for k in range(4)])
        check(f"-B {batch}: examples, indices, labels and token counts of the scores", (ids == expect_ids).all(), "")
        worst = float(np.max(np.abs(sums - here[:n]) / np.abs(here[:n])))
        check(f"-B {batch}: every loss sum equals this test's (one row at a time)", worst < 2e-6,
              f"{4 * n} sums, worst relative difference {worst:.1e} (bound 2e-6)")
        mean_col = np.array([float(r[6]) for r in table]).reshape(n, 4)
        check(f"-B {batch}: loss_mean is loss_sum / tokens", np.array_equal(mean_col, sums / lengths[:n]), "")
        acc = int((here[:n].argmin(1) == labels[:n]).sum())
        norm = int((means[:n].argmin(1) == labels[:n]).sum())
        c = int(((margin(here[:n]) < ROUNDING) | (margin(means[:n]) < ROUNDING)).sum())
        for key, want in (("acc", acc), ("acc_norm", norm)):
            seen = lines.get(key)
            ok = seen is not None and seen[2] == f"({want}/{n})" and abs(float(seen[1]) - want / n) < 1e-6
            if c and seen is not None and not ok:  # an example whose two best are within rounding may go either way
                got_count = int(seen[2][1:].split("/")[0])
                ok = abs(got_count - want) <= c
            check(f"-B {batch}: {key} equals this test's", ok,
                  f"{' '.join(seen) if seen else 'no line'}, here {want}/{n}"
                  + (f" ({c} whose two best are within {ROUNDING:g})" if c else ""))
    print(f"  (the first {len(items)} examples, rows of up to {longest} tokens: acc {acc_here}, acc_norm "
          f"{norm_here}; {close} whose two best scores are within {ROUNDING:g} relative)")

    ties = [(([1.0, 1.0, 0.5, 0.5], [1, 1, 1, 1]), (2, 2)), (([2.0] * 4, [2] * 4), (0, 0)),
            (([3.0, 2.0, 9.0, 9.0], [3, 1, 9, 9]), (1, 0)), (([4.0, 2.0, 2.0, 8.0], [4, 2, 1, 8]), (1, 0))]
    bad = [(a, ref.eval_choice(*a), want) for a, want in ties if ref.eval_choice(*a) != want]
    check("choices: smallest sum (acc), smallest sum per token (acc_norm), ties to the lowest index",
          not bad, f"{len(ties)} cases" if not bad else f"{bad[0]}")

    # Errors: one line each.
    small_v = os.path.join(tmp, "small_v.ckpt")
    short_t = os.path.join(tmp, "short_t.ckpt")
    ref_cli(["init", "--model", "L=1,NH=1,C=8,V=1237,maxT=64", "--out", small_v])
    ref_cli(["init", "--model", "L=1,NH=1,C=8,V=50257,maxT=16", "--out", short_t])
    damaged = write(os.path.join(tmp, "damaged_eval.bin"), open(eval_path, "rb").read()[:-2])
    existing = write(os.path.join(tmp, "existing.tsv"), "old")
    for what, args, mention in (
            ("a model without GPT-2's vocabulary", ["-e", small_v, "--hellaswag", eval_path], "V=50257"),
            ("a model whose maxT is below the longest row", ["-e", short_t, "--hellaswag", eval_path], "maxT=16"),
            ("a damaged eval file", ["-e", ckpt, "--hellaswag", damaged], "eval file"),
            ("a missing eval file", ["-e", ckpt, "--hellaswag", os.path.join(tmp, "nope.bin")], "nope.bin"),
            ("no --hellaswag", ["-e", ckpt], "-h for usage"),
            ("--scores over the checkpoint", ["-e", ckpt, "--hellaswag", eval_path, "--scores", ckpt, "--force"],
             "is the input"),
            ("--scores over an existing file", ["-e", ckpt, "--hellaswag", eval_path, "--scores", existing],
             "already exists"),
            ("-B 0", ["-e", ckpt, "--hellaswag", eval_path, "-B", "0"], "-h for usage")):
        rc, out, err = ref_cli(["eval"] + args)
        ok, seen = one_line_error(rc, err, mention)
        check(f"eval, {what}: one error line", ok, seen.replace(tmp, "TMP")[:110])
    check("... and the existing --scores file is untouched", open(existing).read() == "old", "")


def main():
    if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
        check(f"GPT-2 BPE files at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    enc = reference_encoding()
    items = made_up_items(random.Random(39), EXAMPLES)
    with tempfile.TemporaryDirectory(prefix="test_hellaswag.") as tmp:
        print("prepare_hellaswag.py: tokens, labels, bytes")
        eval_path = check_prepare(tmp, enc, items)
        print("prepare_hellaswag.py: bad inputs and outputs")
        check_bad_inputs(tmp, items)
        if eval_path:
            print("data/eval_file.py: damaged files")
            check_reader(tmp, eval_path)
            print("gpt_reference.py eval")
            check_eval(tmp, enc, items, eval_path)
    finish()


if __name__ == "__main__":
    main()
