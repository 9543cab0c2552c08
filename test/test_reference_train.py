"""gpt_reference.py train (train_gpt's recipe in PyTorch) against a training loop written here.

CPU only, a few seconds, on a small model and synthetic tokens. The loop written here follows the
recipe's words with PyTorch's own pieces (torch.optim.AdamW with decay on 2-D tensors,
torch.nn.utils.clip_grad_norm_, the schedule in float64, its own splitmix64 Fisher-Yates order over
epochs); every step's loss and gradient norm, every validation loss and the final parameters must
agree within 1e-5 relative. A run of 150 steps with the outlier guard (-sl, -sg) must skip the
updates of the same steps as the loop's own guard (numpy's mean and std over a list of the last 128
finite values; torch.optim.AdamW's step count set to the step number, skipped steps counted), the
z it prints within a rounding of the loop's. Also: a glob of shards equals the one concatenated file, metrics.csv and
the checkpoint of -o, train_gpt's own random init (-e d12 and friends) against a scalar
transcription, non-finite steps skipped and the third one fatal, and bad flags rejected in one line.
-o never writes over another run's metrics.csv, and Ctrl-C keeps the rows written (exit code 130).
`state` and `loss` too: --clip 0 is off (as train's -gc 0), and bad inputs (a FIFO, a truncated
token file, out-of-range flags, model configs beyond train_gpt's limits, non-finite parameters) give
one `error:` line. Ends with `N passed, N failed, N skipped`.
"""

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish, one_line_error, ref_cli, splitmix64  # noqa: E402

import torch  # noqa: E402
import gpt_reference as ref  # noqa: E402

# fp32 on both sides, the same operations in other orders (PyTorch's clip_grad_norm_ and AdamW against
# the loop written here): measured at most 6.3e-7 relative (gradient norms) and 3.3e-6 of a tensor's
# largest value (the checkpoint after AdamW); 1e-5 leaves 3x.
BOUND = 1e-5
MODEL = "L=2,NH=2,C=32,V=500,maxT=16"
STEP_LINE = re.compile(r"^step +(\d+)/(\d+) \| loss (\S+) \| norm (\S+) \| lr (\S+) \| \S+ ms \| \S+ tok/s"
                       r"(?: \| skipped: (.*))?$")
SKIP_REASON = re.compile(r"(loss|norm) z (\S+) > (\S+)")
VAL_LINE = re.compile(r"^step +(\d+) \| val loss (\S+)$")


def token_file(path, tokens):
    h = np.zeros(256, np.int32)
    h[:3] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(tokens, "<u2").tobytes())
    return path


def outlier_z(window, x):
    """The outlier guard's z of x, from its description: x joins `window` (the last 128 finite values),
    z = (x - mean) / std over the window with it, when the window was full before it; else nan."""
    if not math.isfinite(x):
        return math.nan
    full = len(window) == 128
    window.append(x)
    del window[:-128]
    if not full:
        return math.nan
    values = np.array(window)
    std = values.std()
    return float((x - values.mean()) / std) if std > 0 else 0.0


def train_here(ckpt, tokens, val, a):
    """The recipe, written from its description. Returns per-step losses and norms, {step: val loss},
    the final parameters and {step: (loss z, norm z, skipped)} of the outlier guard from step 129 on."""
    model = ref.read_checkpoint(ckpt)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": a["c"]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a["l"], betas=(0.9, 0.95), eps=1e-8)
    B, T = a["b"], a["t"]
    sequences = (len(tokens) - 1) // T  # sequence j: tokens [j*T, j*T + T + 1)

    def sequence_ids():
        epoch = 0
        while True:
            order = list(range(sequences))
            if a["sh"]:
                draws = splitmix64(a["sd"] * 0x9E3779B97F4A7C15 + epoch)
                for i in range(sequences - 1, 0, -1):
                    j = next(draws) % (i + 1)
                    order[i], order[j] = order[j], order[i]
            yield from order
            epoch += 1

    def batch(data, ids):
        rows = torch.from_numpy(np.stack([data[j * T:j * T + T + 1] for j in ids]).astype(np.int64))
        return rows[:, :-1], rows[:, 1:]

    def val_loss():  # the mean loss of the first -m * d/T sequences, or of all there are
        n = min(a["m"] * a["d"] // T, (len(val) - 1) // T)
        with torch.no_grad():
            return model(*batch(val, range(n)))[1].item()

    def lr_at(step):
        if step < a["u"]:
            return a["l"] * (step + 1) / a["u"]
        progress = min(1.0, (step - a["u"]) / max(1, a["x"] - a["u"]))
        low = a["l"] * a["q"]
        return low + 0.5 * (a["l"] - low) * (1 + math.cos(math.pi * progress))

    ids, accum = sequence_ids(), a["d"] // (B * T)
    losses, norms, lrs, vals, guard = [], [], [], {}, {}
    loss_window, norm_window = [], []
    for step in range(a["x"]):
        if a["v"] and step % a["v"] == 0:
            vals[step] = val_loss()
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            _, loss = model(*batch(tokens, [next(ids) for _ in range(B)]))
            (loss / accum).backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, a["gc"] if a["gc"] > 0 else float("inf"))
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        zl, zg = outlier_z(loss_window, total / accum), outlier_z(norm_window, float(norm))
        skip = a.get("sl", 0) > 0 and zl > a["sl"] or a.get("sg", 0) > 0 and zg > a["sg"]
        if not math.isnan(zl):
            guard[step + 1] = (zl, zg, skip)
        for p in params:  # AdamW's t is the step number: skipped steps count
            if opt.state[p]:
                opt.state[p]["step"].fill_(step)
        if not skip:
            opt.step()
        losses.append(total / accum)
        norms.append(float(norm))
        lrs.append(lr_at(step))
    if a["v"]:
        vals[a["x"]] = val_loss()
    return losses, norms, lrs, vals, ref.model_params(model), guard


def process(args, timeout=120):
    """gpt_reference.py ARGS as its own process, given `timeout` seconds (an input that blocks would
    hang the test in-process): (exit code, stderr), exit code None if it did not return."""
    try:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt_reference.py")] + args, capture_output=True,
                           text=True, timeout=timeout)
        return r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout} s"


def interrupted_run(args, csv, rows=4, timeout=120):
    """Starts gpt_reference.py ARGS, sends SIGINT (Ctrl-C) once `csv` holds `rows` lines: (exit code,
    stderr). SIGINT is set back to its default in the child: a shell's background job ignores it."""
    child = subprocess.Popen([sys.executable, os.path.join(ROOT, "gpt_reference.py")] + args, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + timeout
    while time.time() < deadline and child.poll() is None:
        if os.path.exists(csv):
            with open(csv) as f:
                if f.read().count("\n") >= rows:
                    break
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    try:
        _, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        return None, "did not stop on SIGINT"
    return child.returncode, err


def flags(a):
    return [x for k, v in a.items() for x in ("-" + k, str(v))]


def parse(out):
    steps = [m.groups() for m in map(STEP_LINE.match, out.splitlines()) if m]
    vals = {int(m.group(1)): float(m.group(2)) for m in map(VAL_LINE.match, out.splitlines()) if m}
    return steps, vals


def worst_rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))) if a.shape == b.shape and a.size else float("inf")


def check_guard(steps, want, a):
    """The reference's skipped steps and printed z against the loop's own guard."""
    got = {int(s[0]): s[5] for s in steps if s[5]}
    want_skips = sorted(s for s, (_, _, skip) in want.items() if skip)
    check(f"-sl {a['sl']} -sg {a['sg']}: the same steps skipped as the loop's guard (from step 129)",
          sorted(got) == want_skips and want_skips and min(want_skips) >= 129,
          f"reference {sorted(got)}, here {want_skips}")
    worst, margin = 0.0, min((min(abs(zl - a["sl"]), abs(zg - a["sg"])) for zl, zg, _ in want.values()), default=0.0)
    for step, text in got.items():
        for name, z, limit in SKIP_REASON.findall(text):
            here = want.get(step, (math.nan, math.nan))[0 if name == "loss" else 1]
            worst = max(worst, abs(float(z) - here)) if math.isfinite(here) else math.inf
    check("  ... each printed z (3 decimals) within 1e-3 of the loop's", worst <= 1e-3,
          f"worst {worst:.1e}; the loop's z come no closer than {margin:.3f} to the limits")


def main():
    holder = tempfile.TemporaryDirectory(prefix="test_reference_train.")
    tmp = holder.name
    p = lambda *names: os.path.join(tmp, *names)  # noqa: E731
    ckpt = p("model.ckpt")
    ref_cli(["init", "--model", MODEL, "--seed", "3", "--out", ckpt])
    rng = np.random.default_rng(0)
    stream = np.where(rng.random(2200) < 0.2, rng.integers(0, 500, 2200), np.arange(2200) * 7 % 97 * 5)
    os.makedirs(p("data"))
    token_file(p("data", "all.bin"), stream)
    token_file(p("data", "x_train_000001.bin"), stream[:1000])
    token_file(p("data", "x_train_000002.bin"), stream[1000:])
    val = np.where(rng.random(700) < 0.2, rng.integers(0, 500, 700), np.arange(700) * 7 % 97 * 5)
    token_file(p("data", "val.bin"), val)

    runs = [  # the first rolls over into epoch 1 (137 sequences, 6 steps of 32) and clips (norms > 0.5)
        ("shuffled, 2 micro-batches, clip 0.5, epoch rollover",
         dict(b=16, t=16, d=512, x=6, u=2, l=3e-3, q=0.1, c=0.1, gc=0.5, v=3, m=2, sd=7, sh=1)),
        ("in order, no accumulation, clip off, no warm-up",
         dict(b=4, t=16, d=64, x=5, u=0, l=1e-3, q=0.5, c=0.0, gc=0.0, v=2, m=3, sd=1, sh=0)),
        ("the outlier guard: 150 steps, its windows full from step 129",
         dict(b=4, t=16, d=64, x=150, u=3, l=1e-3, q=1.0, c=0.1, gc=0.0, v=50, m=1, sd=1, sh=1, sl=1.5, sg=1.5)),
    ]
    for what, a in runs:
        print(what + ": " + " ".join(flags(a)))
        out_dir = p("out_" + str(a["sh"]) + ("_guard" if "sl" in a else ""))
        rc, out, err = ref_cli(["train", "-e", ckpt, "-i", p("data", "x_train_*.bin"), "-j", p("data", "val.bin"),
                                "-o", out_dir, "--device", "cpu"] + flags(a))
        steps, vals = parse(out)
        if not check("runs; one line per step and per validation", rc == 0 and len(steps) == a["x"]
                     and sorted(vals) == sorted(set(list(range(0, a["x"], a["v"])) + [a["x"]])),
                     err.strip()[-100:] or f"{len(steps)} step lines, validations at {sorted(vals)}"):
            continue
        rows = [ln.split(",") for ln in open(os.path.join(out_dir, "metrics.csv")).read().splitlines()]
        train_rows = [r for r in rows[1:] if r[1]]
        check("metrics.csv: header, a row per step and per validation",
              rows[0] == "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s".split(",")
              and all(len(r) == 7 for r in rows) and len(train_rows) == a["x"] and len(rows) == 1 + a["x"] + len(vals))
        loss = [float(r[1]) for r in train_rows]
        norm = [float(r[4]) for r in train_rows]
        lr = [float(r[3]) for r in train_rows]
        want_loss, want_norm, want_lr, want_vals, want_params, want_guard = train_here(p("model.ckpt"), stream, val, a)
        if "sl" in a:
            check_guard(steps, want_guard, a)
        e = worst_rel(loss, want_loss)
        check("every step's loss == the loop written here", e <= BOUND, f"worst {e:.1e}, bound {BOUND:.0e}")
        e = worst_rel(norm, want_norm)
        check("every step's gradient norm (before clipping) == clip_grad_norm_'s", e <= BOUND,
              f"worst {e:.1e}, bound {BOUND:.0e}; norms {min(norm):.3f}..{max(norm):.3f}")
        e = worst_rel(lr, want_lr)
        check("every step's learning rate == warm-up + cosine in float64", e <= 1e-6, f"worst {e:.1e}, bound 1e-06")
        e = worst_rel([vals[s] for s in sorted(vals)], [want_vals[s] for s in sorted(want_vals)])
        check(f"validation losses at steps {sorted(vals)}", sorted(vals) == sorted(want_vals) and e <= BOUND,
              f"worst {e:.1e}, bound {BOUND:.0e}")
        saved = os.path.join(out_dir, f"model_{a['x']:08d}.bin")
        cfg, got = ref.read_checkpoint_params(saved) if os.path.exists(saved) else (None, {})
        # The key bias (qkvb[:, C:2C]) is left out: it shifts every score of a query alike, so its true
        # gradient is 0 and the computed one is rounding noise, which AdamW scales up to steps of ~lr
        # in directions that differ between any two implementations.
        for params in (got, want_params):
            if params:
                params["qkvb"] = np.delete(params["qkvb"], np.s_[cfg.C:2 * cfg.C], axis=1)
        e = max((float(np.max(np.abs(got[k] - v)) / float(np.max(np.abs(v)) or 1)) for k, v in want_params.items()),
                default=float("inf")) if got else float("inf")
        check("-o: final checkpoint == torch.optim.AdamW's (all but the key bias)", e <= BOUND,
              f"worst {e:.1e} of a tensor's largest value, bound {BOUND:.0e}")
        if a["sh"]:
            rc, out2, _ = ref_cli(["train", "-e", ckpt, "-i", p("data", "all.bin"), "-j", p("data", "val.bin"),
                                   "--device", "cpu"] + flags(a))
            check("the same run on the one concatenated file: the same lines",
                  rc == 0 and parse(out2) == (steps, vals), f"{len(parse(out2)[0])} step lines")
            # The same sequences whatever B: -b 4 (8 micro-batches a step) trains as -b 16 (2) did.
            rc, out3, err3 = ref_cli(["train", "-e", ckpt, "-i", p("data", "all.bin"), "-j", p("data", "val.bin"),
                                      "--device", "cpu"] + flags(dict(a, b=4)))
            steps4, vals4 = parse(out3)
            e = max(worst_rel([float(x) for s in steps4 for x in s[2:4]], [float(x) for s in steps for x in s[2:4]]),
                    worst_rel([vals4[k] for k in sorted(vals4)], [vals[k] for k in sorted(vals)]))
            check("the same run at -b 4: every loss, norm and validation loss within the bound", rc == 0 and
                  sorted(vals4) == sorted(vals) and e <= BOUND, err3.strip()[-100:] or f"worst {e:.1e}, bound {BOUND:.0e}")

    print("train_gpt's random init (-e d6 / d12 / ...)")
    cfg = ref.Config(L=2, NH=2, C=8, maxT=6, V=37)
    got = ref.cuda_random_init(cfg, 42)
    draws = splitmix64(42)
    uniform = lambda: (next(draws) >> 11) * 2.0**-53  # noqa: E731
    want, stds = {}, {"wte": 0.02, "wpe": 0.02, "qkvw": 0.02, "fcw": 0.02}
    stds["attprojw"] = stds["fcprojw"] = float(np.float32(0.02) / np.sqrt(np.float32(2 * cfg.L)))
    for name, shape in ref.param_shapes(cfg):
        w = np.zeros(shape, np.float32)
        if name in stds:
            flat = w.reshape(-1)
            for i in range(cfg.V * cfg.C if name == "wte" else flat.size):
                u1, u2 = 1.0 - uniform(), uniform()
                flat[i] = np.float32(math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)) * np.float32(stds[name])
        elif name in ("ln1w", "ln2w", "lnfw"):
            w[:] = 1
        want[name] = w
    check("cuda_random_init == Box-Muller over splitmix64 written here, bit for bit",
          all(np.array_equal(got[k], want[k]) for k in want), f"{sum(v.size for v in want.values())} values")

    print("non-finite steps")
    cfg, params = ref.read_checkpoint_params(ckpt)
    params = {k: v.copy() for k, v in params.items()}
    params["wte"][:] = np.where(np.random.default_rng(1).random(params["wte"].shape) < 0.5, -3e38, 3e38)
    params["lnfw"][:] = 3e38
    ref.write_checkpoint_params(cfg, params, p("blowup.ckpt"))
    rc, out, err = ref_cli(["train", "-e", p("blowup.ckpt"), "-i", p("data", "all.bin"), "-b", "4", "-t", "16",
                            "-x", "5", "-v", "0", "--device", "cpu"])
    lines = err.strip().splitlines()
    ok = (rc == 1 and len(lines) == 4 and all(ln.startswith(f"warning: step {i + 1}: non-finite") and "update skipped" in ln
                                               for i, ln in enumerate(lines[:3]))
          and lines[3].startswith("error: stopping at step 3") and len(parse(out)[0]) == 2)
    check("steps 1-3 warn (update skipped); the third in a row stops the run", ok, lines[-1] if lines else "")

    print("bad flags: one `error:` line, exit code 1")
    base = ["train", "-e", ckpt, "-i", p("data", "all.bin"), "-j", p("data", "val.bin"), "-b", "4", "-t", "16",
            "-x", "1", "--device", "cpu"]
    token_file(p("data", "big_id.bin"), np.full(100, 500))
    token_file(p("data", "short.bin"), np.arange(10))
    with open(p("data", "tiny.bin"), "wb") as f:  # not a multiple of the header's 4-byte ints
        f.write(np.int32(20240520).tobytes() + bytes(197))
    for what, extra, mention in (
            ("-i a 201-byte file (shorter than a header)", ["-i", p("data", "tiny.bin")], "201 bytes"),
            ("-d not a multiple of B*T", ["-d", "100"], "-d 100"),
            ("-t above the model's maxT", ["-t", "17"], "-t 17"),
            ("-i matching no file", ["-i", p("data", "nope_*.bin")], "nope_"),
            ("-i token id >= V", ["-i", p("data", "big_id.bin")], "V=500"),
            ("-i fewer tokens than a step's sequences span", ["-i", p("data", "short.bin")], "sequences of T+1"),
            ("-j fewer than T+1 tokens", ["-j", p("data", "short.bin")], "T+1"),
            ("-sh 2", ["-sh", "2"], "-sh"),
            ("-l -1", ["-l", "-1"], "-l"),
            ("-sl -1 (the outlier guard's Z)", ["-sl", "-1"], "-sl"),
            ("-sg nan", ["-sg", "nan"], "-sg"),
            ("-sg inf", ["-sg", "inf"], "-sg"),
            ("-e missing", ["-e", p("none.ckpt")], "none.ckpt"),
            ("an unknown flag (-ge, train_gpt's GPU flag)", ["-ge", "1"], "-ge")):
        rc, _, err = ref_cli(base + extra)
        ok, line = one_line_error(rc, err, mention)
        check(what, ok, line)
    rc, out, _ = ref_cli(["train", "-h"])
    check("train -h: usage with train_gpt's flag letters",
          rc == 0 and all(f in out for f in ("-gc", "-sd", "-sh", "-sl", "-sg", "-o DIR")))

    print("-o: metrics.csv of another run is kept; Ctrl-C keeps the rows written")
    csv = os.path.join(p("out_0"), "metrics.csv")
    before = open(csv).read() if os.path.exists(csv) else None
    rc, _, err = ref_cli(base + ["-o", p("out_0")])
    ok, line = one_line_error(rc, err, "metrics.csv")
    check("-o DIR with a metrics.csv: one line, the file untouched",
          ok and before is not None and open(csv).read() == before, line)
    rc, _, err = ref_cli(base + ["-o", p("data", "all.bin")])
    ok, line = one_line_error(rc, err, "not a folder")
    check("-o a file: one line", ok, line)
    os.makedirs(p("held"))
    token_file(p("held", "model_00000001.bin"), [1, 2, 3])
    kept = open(p("held", "model_00000001.bin"), "rb").read()
    rc, _, err = ref_cli(base + ["-o", p("held")])
    ok, line = one_line_error(rc, err, "holds checkpoints")
    check("-o DIR holding a checkpoint (as train_gpt): one line, the checkpoint untouched, no metrics.csv",
          ok and open(p("held", "model_00000001.bin"), "rb").read() == kept
          and not os.path.exists(p("held", "metrics.csv")), line)

    print("-i: a path that exists is itself, before it is read as a glob")
    os.makedirs(p("run[1]"))
    token_file(p("run[1]", "x_train_000001.bin"), stream)
    token_file(p("run[1]", "x_val_000001.bin"), val)
    rc, out, err = ref_cli(["train", "-e", ckpt, "-i", p("run[1]", "x_train_000001.bin"), "-b", "4", "-t", "16",
                            "-x", "1", "-v", "1", "-m", "1", "--device", "cpu"])
    check("-i run[1]/x_train_000001.bin (and -j found beside it: run[1]/x_val_000001.bin)",
          rc == 0 and "val loss" in out, err.strip()[-100:])
    rc, out, err = ref_cli(["train", "-e", ckpt, "-i", p("run[1]", "x_train_*.bin"), "-j", p("data", "val.bin"),
                            "-b", "4", "-t", "16", "-x", "1", "--device", "cpu"])
    ok, line = one_line_error(rc, err, "no file matches")
    check("  ... while the glob run[1]/x_train_*.bin is a glob (a class of one character '1'): no match", ok, line)
    csv = p("stopped", "metrics.csv")
    rc, err = interrupted_run(["train", "-e", ckpt, "-i", p("data", "all.bin"), "-b", "4", "-t", "16",
                               "-x", str(99999999), "-v", "0", "-o", p("stopped"), "--device", "cpu"], csv)
    rows = open(csv).read().splitlines() if os.path.exists(csv) else []
    check("SIGINT: exit code 130, one line `error: interrupted`", rc == 130 and err.strip() == "error: interrupted",
          f"exit code {rc}: {err.strip()[-100:]}")
    check("SIGINT: metrics.csv keeps its header and whole rows", len(rows) >= 4 and
          rows[0].startswith("step,") and all(len(r.split(",")) == 7 for r in rows), f"{len(rows)} lines")

    print("state and loss")
    cfg, params = ref.read_checkpoint_params(ckpt)

    def state(*extra):
        rc, out, err = ref_cli(["state", "--checkpoint", ckpt, "-B", "2", "-T", "8", "-K", "4", "--device", "cpu"]
                               + list(extra))
        return rc, [ln for ln in out.splitlines() if ln.startswith("step ")], err

    rc0, off, err = state("--clip", "0", "--out", p("clip0.state"))
    rc1, huge, _ = state("--clip", "1e6", "--out", p("clip1e6.state"))
    # A clip of 1e-30 scales the gradient to nothing (AdamW then barely moves): what clip 0 did when
    # clip_grad_norm_ ran with it.
    rc2, tiny, _ = state("--clip", "1e-30", "--out", p("clip_tiny.state"))
    stored = np.fromfile(p("clip0.state"), np.float32, count=22)[21] if rc0 == 0 else None
    check("--clip 0 is off: the losses of --clip 1e6 (no norm near it), not of a vanishing clip",
          rc0 == rc1 == rc2 == 0 and len(off) == 4 and off == huge and off[1:] != tiny[1:] and stored == 0,
          err.strip()[-80:] or f"header clip {stored}")
    check("train -gc 0 is off alike (clip_factor 1 for any norm)",
          ref.clip_factor(np.float32(1e6), 0.0) == 1 and ref.clip_factor(np.float32(1e6), 1.0) < 1)
    os.mkfifo(p("fifo"))
    rc, err = process(["loss", "--checkpoint", p("fifo")])
    ok, line = one_line_error(rc, err, "not a regular file")
    check("loss --checkpoint a FIFO: returns at once, one line", ok, line)
    rc, err = process(["state", "--checkpoint", ckpt, "-T", "8", "--tokens", p("fifo"), "--out", p("x.state")])
    ok, line = one_line_error(rc, err, "not a regular file")
    check("state --tokens a FIFO: returns at once, one line", ok, line)
    whole = open(p("data", "all.bin"), "rb").read()
    with open(p("data", "cut.bin"), "wb") as f:
        f.write(whole[:len(whole) // 2])
    token_file(p("data", "empty.bin"), [])
    params["fcb"][1, 3] = np.inf
    ref.write_checkpoint_params(cfg, params, p("inf.ckpt"))
    loss = ["loss", "--checkpoint", ckpt, "-B", "2", "-T", "8", "--device", "cpu"]
    state_args = ["state", "--checkpoint", ckpt, "-T", "8", "--out", p("bad.state"), "--device", "cpu"]
    for what, args, mention in (
            ("loss --tokens truncated", loss + ["--tokens", p("data", "cut.bin")], "truncated"),
            ("state --tokens truncated", state_args + ["--tokens", p("data", "cut.bin")], "truncated"),
            ("loss --tokens with 0 tokens", loss + ["--tokens", p("data", "empty.bin")], "0 tokens"),
            ("loss --offset past the data", loss + ["--tokens", p("data", "all.bin"), "--offset", "2190"],
             "offset 2190"),
            ("loss --offset 2^80", loss + ["--tokens", p("data", "all.bin"), "--offset", str(2**80)], "--offset"),
            ("loss -B 100000000", loss + ["-B", "100000000"], "--batch"),
            ("loss -T 0", loss + ["-T", "0"], "--seq"),
            ("loss -T above maxT", loss + ["-T", "17"], "maxT=16"),
            ("loss --seed 2^70", loss + ["--seed", str(2**70)], "--seed"),
            ("loss: a checkpoint holding inf", ["loss", "--checkpoint", p("inf.ckpt"), "-T", "8", "--device", "cpu"],
             "fcb"),
            ("state --clip -1", state_args + ["--clip", "-1"], "--clip"),
            ("state --clip nan", state_args + ["--clip", "nan"], "--clip"),
            ("state --lr -1", state_args + ["--lr", "-1"], "--lr"),
            ("state --beta1 2", state_args + ["--beta1", "2"], "--beta1"),
            ("state --beta2 1", state_args + ["--beta2", "1"], "--beta2"),
            ("state --eps 0", state_args + ["--eps", "0"], "--eps"),
            ("state --weight-decay -0.1", state_args + ["--weight-decay", "-0.1"], "--weight-decay"),
            ("state --steps 0", state_args + ["--steps", "0"], "--steps"),
            ("init --seed 1e23", ["init", "--seed", "1e23", "--out", p("bad.ckpt")], "--seed"),
            ("init --seed 2^64", ["init", "--seed", str(2**64), "--out", p("bad.ckpt")], "--seed"),
            ("init --model C=100000000", ["init", "--model", "L=1,NH=1,C=100000000,V=50257,maxT=64", "--out",
                                          p("bad.ckpt")], "C=100000000"),
            ("init --model L=2000", ["init", "--model", "L=2000,NH=1,C=8,V=50,maxT=8", "--out", p("bad.ckpt")],
             "L=2000"),
            ("init --model V=2^21", ["init", "--model", f"L=1,NH=1,C=8,V={2**21},maxT=8", "--out", p("bad.ckpt")],
             "V="),
            ("init --model with a tensor of 2^31 elements (fcw: 4 C^2)",
             ["init", "--model", "L=1,NH=1,C=32768,V=50,maxT=8", "--out", p("bad.ckpt")], "2^31")):
        rc, _, err = ref_cli(args)
        ok, line = one_line_error(rc, err, mention)
        check(what, ok and "Traceback" not in err, line)
    check("no failed command wrote a file", not any(os.path.exists(p(f)) for f in ("bad.state", "bad.ckpt", "x.state")))
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
