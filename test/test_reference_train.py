"""gpt_reference.py train (train_gpt's recipe in PyTorch) against a training loop written here.

CPU only, a few seconds, on a small model and synthetic tokens. The loop written here follows the
recipe's words with PyTorch's own pieces (torch.optim.AdamW with decay on 2-D tensors,
torch.nn.utils.clip_grad_norm_, the schedule in float64, its own splitmix64 Fisher-Yates order over
epochs); every step's loss and gradient norm, every validation loss and the final parameters must
agree within 1e-5 relative. Also: a glob of shards equals the one concatenated file, metrics.csv and
the checkpoint of -o, train_gpt's own random init (-e d12 and friends) against a scalar
transcription, non-finite steps skipped and the third one fatal, and bad flags rejected in one line.
Ends with `N passed, N failed, N skipped`.
"""

import math
import os
import re
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, one_line_error, ref_cli  # noqa: E402

import torch  # noqa: E402
import gpt_reference as ref  # noqa: E402

# fp32 on both sides, the same operations in other orders (PyTorch's clip_grad_norm_ and AdamW against
# the loop written here): measured at most 6.3e-7 relative (gradient norms) and 3.3e-6 of a tensor's
# largest value (the checkpoint after AdamW); 1e-5 leaves 3x.
BOUND = 1e-5
MODEL = "L=2,NH=2,C=32,V=500,maxT=16"
STEP_LINE = re.compile(r"^step +(\d+)/(\d+) \| loss (\S+) \| norm (\S+) \| lr (\S+) \| \S+ ms \| \S+ tok/s$")
VAL_LINE = re.compile(r"^step +(\d+) \| val loss (\S+)$")


def token_file(path, tokens):
    h = np.zeros(256, np.int32)
    h[:3] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(tokens, "<u2").tobytes())
    return path


def splitmix64(seed):
    state = seed % 2**64
    while True:
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        yield z ^ (z >> 31)


def train_here(ckpt, tokens, val, a):
    """The recipe, written from its description. Returns per-step losses and norms, {step: val loss}
    and the final parameters."""
    model = ref.read_checkpoint(ckpt)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": a["c"]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a["l"], betas=(0.9, 0.95), eps=1e-8)
    B, T = a["b"], a["t"]
    windows = (len(tokens) - 1) // (B * T)

    def window_ids():
        epoch = 0
        while True:
            order = list(range(windows))
            if a["sh"]:
                draws = splitmix64(a["sd"] * 0x9E3779B97F4A7C15 + epoch)
                for i in range(windows - 1, 0, -1):
                    j = next(draws) % (i + 1)
                    order[i], order[j] = order[j], order[i]
            yield from order
            epoch += 1

    def batch(data, rows, w):
        chunk = torch.from_numpy(data[w * rows * T:w * rows * T + rows * T + 1].astype(np.int64))
        return chunk[:-1].view(rows, T), chunk[1:].view(rows, T)

    def val_loss():
        rows = min(B, (len(val) - 1) // T)
        n = min(a["m"], (len(val) - 1) // (rows * T))
        with torch.no_grad():
            return sum(model(*batch(val, rows, w))[1].item() for w in range(n)) / n

    def lr_at(step):
        if step < a["u"]:
            return a["l"] * (step + 1) / a["u"]
        progress = min(1.0, (step - a["u"]) / max(1, a["x"] - a["u"]))
        low = a["l"] * a["q"]
        return low + 0.5 * (a["l"] - low) * (1 + math.cos(math.pi * progress))

    ids, accum = window_ids(), a["d"] // (B * T)
    losses, norms, lrs, vals = [], [], [], {}
    for step in range(a["x"]):
        if a["v"] and step % a["v"] == 0:
            vals[step] = val_loss()
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            _, loss = model(*batch(tokens, B, next(ids)))
            (loss / accum).backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, a["gc"] if a["gc"] > 0 else float("inf"))
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.step()
        losses.append(total / accum)
        norms.append(float(norm))
        lrs.append(lr_at(step))
    if a["v"]:
        vals[a["x"]] = val_loss()
    return losses, norms, lrs, vals, ref.model_params(model)


def flags(a):
    return [x for k, v in a.items() for x in ("-" + k, str(v))]


def parse(out):
    steps = [m.groups() for m in map(STEP_LINE.match, out.splitlines()) if m]
    vals = {int(m.group(1)): float(m.group(2)) for m in map(VAL_LINE.match, out.splitlines()) if m}
    return steps, vals


def worst_rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))) if a.shape == b.shape and a.size else float("inf")


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

    runs = [  # the first rolls over into epoch 1 (8 windows of 16x16, 12 micro-batches) and clips (norms > 0.5)
        ("shuffled, 2 micro-batches, clip 0.5, epoch rollover",
         dict(b=16, t=16, d=512, x=6, u=2, l=3e-3, q=0.1, c=0.1, gc=0.5, v=3, m=2, sd=7, sh=1)),
        ("in order, no accumulation, clip off, no warm-up",
         dict(b=4, t=16, d=64, x=5, u=0, l=1e-3, q=0.5, c=0.0, gc=0.0, v=2, m=3, sd=1, sh=0)),
    ]
    for what, a in runs:
        print(what + ": " + " ".join(flags(a)))
        out_dir = p("out_" + str(a["sh"]))
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
        want_loss, want_norm, want_lr, want_vals, want_params = train_here(p("model.ckpt"), stream, val, a)
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
    for what, extra, mention in (
            ("-d not a multiple of B*T", ["-d", "100"], "-d 100"),
            ("-t above the model's maxT", ["-t", "17"], "-t 17"),
            ("-i matching no file", ["-i", p("data", "nope_*.bin")], "nope_"),
            ("-i token id >= V", ["-i", p("data", "big_id.bin")], "V=500"),
            ("-i fewer than B*T+1 tokens", ["-i", p("data", "short.bin")], "B*T+1"),
            ("-j fewer than T+1 tokens", ["-j", p("data", "short.bin")], "T+1"),
            ("-sh 2", ["-sh", "2"], "-sh"),
            ("-l -1", ["-l", "-1"], "-l"),
            ("-e missing", ["-e", p("none.ckpt")], "none.ckpt"),
            ("an unknown flag (-ge, train_gpt's GPU flag)", ["-ge", "1"], "-ge")):
        rc, _, err = ref_cli(base + extra)
        ok, line = one_line_error(rc, err, mention)
        check(what, ok, line)
    rc, out, _ = ref_cli(["train", "-h"])
    check("train -h: usage with train_gpt's flag letters", rc == 0 and all(f in out for f in ("-gc", "-sd", "-sh", "-o DIR")))
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
