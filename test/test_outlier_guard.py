#!/usr/bin/env python3
"""test_outlier_guard.py: the outlier guard (outlier_guard.h: train_gpt -sl, -sg) on the host, no GPU.

  - decisions: checkpoint_tool outliers runs the guard over sequences of (loss, norm) made here:
    random ones with outliers, NaN and inf (some while the windows fill), the window-filling edge
    (the 128th value has no z, the 129th has one), constant values (std 0: z 0), values near 1e6,
    both checks off, and a Z above sqrt(127) (never reached). Against a computation of this test's
    own (a list of the last 128 finite values, numpy's mean and std): the same steps with a z, every
    z within 1e-9, the same skips; against gpt_reference.py's OutlierGuard (what `train` uses): every
    z the same bits and the same reasons text;
  - checkpoints: the windows saved after step K by the real train-state writer (write_checkpoint) and
    loaded back by the real reader (load_checkpoint), for K before, at and after the window fills:
    the run goes on with exactly the decisions of the run never stopped; the file's section is what
    data/file_formats.py's OUTLIER_WINDOWS reads, and holds the reference's windows after K steps;
  - older files: a state file without the section (outlier_bytes 0, as written before the guard)
    loads with empty windows; a section with a count, position or value out of range, or of another
    size, is refused with one error line, and the crc covers it.
Needs build/test/checkpoint_tool. Ends with `N passed, N failed, N skipped`.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "data"))
import file_formats as ff  # noqa: E402
import gpt_reference as ref  # noqa: E402

TOOL = os.path.join(ROOT, "build", "test", "checkpoint_tool")
WINDOW = 128


def tool(*args):
    r = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def write_values(path, steps):
    with open(path, "w") as f:
        f.write("\n".join(f"{float(loss)!r} {float(norm)!r}" for loss, norm in steps))  # numpy 2 scalars repr as np.float64(..)


def parse_run(out):
    """{step: (loss z, norm z, loss skip, norm skip, reasons)} of checkpoint_tool outliers' lines."""
    rows = {}
    for line in out.splitlines():
        head, reasons = line.split(" | ", 1) if " | " in line else (line.rstrip(" |"), "")
        step, zl, zg, sl, sg = head.split()
        rows[int(step)] = (float(zl), float(zg), sl == "1", sg == "1", reasons)
    return rows


def own_guard(steps, sl, sg):
    """This test's own reading of the guard: {step: (loss z, norm z, loss skip, norm skip)}."""
    windows, out = ([], []), {}
    for i, values in enumerate(steps):
        z = []
        for window, x in zip(windows, values):
            if not math.isfinite(x):
                z.append(math.nan)
                continue
            full = len(window) == WINDOW
            window.append(x)
            del window[:-WINDOW]
            std = np.std(window)
            z.append(math.nan if not full else float((x - np.mean(window)) / std) if std > 0 else 0.0)
        out[i + 1] = (z[0], z[1], sl > 0 and z[0] > sl, sg > 0 and z[1] > sg)
    return out


def reference_guard(steps, sl, sg, upto=None):
    """gpt_reference.py's OutlierGuard over the steps (the first `upto`): ({step: verdict + (reasons,)}, guard)."""
    guard, out = ref.OutlierGuard(sl, sg), {}
    for i, (loss, norm) in enumerate(steps[:upto]):
        verdict = guard.observe(loss, norm)
        out[i + 1] = verdict + (guard.reasons(verdict),)
    return out, guard


def same_bits(a, b):
    return np.float64(a).tobytes() == np.float64(b).tobytes() or (math.isnan(a) and math.isnan(b))


def sequences(rng):
    """(name, steps, -sl, -sg): the cases the guard must get right."""
    def noisy(n, loss=3.0, norm=1.0):
        return [(loss + rng.normal(0, 0.05), abs(norm + rng.normal(0, 0.2))) for _ in range(n)]

    out = []
    steps = noisy(400)
    for i in rng.choice(np.arange(130, 400), 25, replace=False):  # outliers of either value, or both
        loss, norm = steps[i]
        steps[i] = (loss + rng.choice([0, 0.3, 1.0]), norm * rng.choice([1, 2.5, 6]))
    for i in rng.choice(np.arange(0, 400), 20, replace=False):  # non-finite values, filling or not
        loss, norm = steps[i]
        bad = rng.choice([math.nan, math.inf, -math.inf])
        steps[i] = (loss, bad) if i % 2 else (bad, norm)
    out.append(("random with outliers, NaN and inf", steps, 2.5, 3.0))
    out.append(("the window-filling edge: 128, 129, 130 values", noisy(130), 0.5, 0.5))
    edge = noisy(126) + [(math.nan, math.inf)] * 3 + noisy(4)
    out.append(("non-finite values while filling do not count: z from the 129th finite one", edge, 0.5, 0.5))
    out.append(("constant values: std 0, z 0, no skip", [(2.5, 1.25)] * 140 + [(2.5, 9.0)], 0.1, 0.1))
    big = [(1e6 + rng.normal(0, 1), 1e6 + rng.normal(0, 1)) for _ in range(200)]
    out.append(("values near 1e6 (two passes: no cancellation)", big, 2.0, 2.0))
    out.append(("both checks off (0): z computed, nothing skipped", noisy(160), 0.0, 0.0))
    spike = [(3.0, 1.0)] * 200 + [(30.0, 50.0)] + noisy(20)
    out.append(("Z = 12 > sqrt(127): a huge spike is still no skip", spike, 12.0, 12.0))
    return out


def check_decisions(tmp, rng):
    print("decisions: checkpoint_tool outliers against this test's guard and gpt_reference.py's")
    for name, steps, sl, sg in sequences(rng):
        path = os.path.join(tmp, "values.txt")
        write_values(path, steps)
        rc, out, err = tool("outliers", path, sl, sg)
        if not check(f"{name}: runs", rc == 0 and len(out.splitlines()) == len(steps), err.strip()[:100]):
            continue
        got, own = parse_run(out), own_guard(steps, sl, sg)
        refs, _ = reference_guard(steps, sl, sg)
        with_z = [s for s in got if not math.isnan(got[s][0])]
        same_nan = all(math.isnan(got[s][i]) == math.isnan(own[s][i]) for s in got for i in (0, 1))
        worst = max((abs(got[s][i] - own[s][i]) for s in got for i in (0, 1) if not math.isnan(own[s][i])), default=0.0)
        skips = sorted(s for s in got if got[s][2] or got[s][3])
        check(f"  z where this test has one (first at step {min(with_z, default='-')}), within 1e-9",
              same_nan and worst <= 1e-9, f"worst {worst:.1e}")
        margin = min((abs(own[s][i] - limit) for s in own for i, limit in ((0, sl), (1, sg))
                      if limit > 0 and not math.isnan(own[s][i])), default=math.inf)
        losses, norms = sum(got[s][2] for s in got), sum(got[s][3] for s in got)
        check(f"  the same skips ({len(skips)}: loss {losses}, norm {norms})",
              all(got[s][2:4] == own[s][2:4] for s in got), f"closest z to a limit: {margin:.1e} away")
        bits = all(same_bits(got[s][i], refs[s][i]) for s in got for i in (0, 1))
        texts = all(got[s][2:] == refs[s][2:] for s in got)
        check("  gpt_reference.py's OutlierGuard: the same z bits, skips and reasons", bits and texts,
              next((f"step {s}: {got[s]} vs {refs[s]}" for s in got if got[s][2:] != refs[s][2:]), ""))
        if name.startswith("the window-filling edge"):
            check("  no z for steps 1..128, a z for steps 129 and 130",
                  all(math.isnan(got[s][0]) and math.isnan(got[s][1]) for s in range(1, 129))
                  and not any(math.isnan(got[s][i]) for s in (129, 130) for i in (0, 1)))
        if name.startswith("non-finite values while filling"):
            check("  no z up to step 131 (127-129 non-finite, 131 the 128th finite value), a z at 132",
                  all(math.isnan(got[s][0]) for s in range(1, 132)) and not math.isnan(got[132][0]),
                  f"first z at step {min(with_z, default='-')}")
        if name.startswith("constant"):
            check("  z = 0 at std 0, and the norm's spike at step 141 is seen", got[140][:2] == (0.0, 0.0)
                  and got[141][3] and not got[141][2], str(got[141]))
        if name.startswith("Z = 12"):
            bound = math.sqrt(WINDOW - 1)
            top = max(got[s][i] for s in with_z for i in (0, 1))
            check("  the spike's z is the largest a z can be, sqrt(127) = 11.269, and not above it",
                  not skips and abs(top - bound) < 1e-9 and top <= bound + 1e-12, f"largest z {top!r}")


def state_file(d, step):
    return os.path.join(d, f"state_{step:08d}.bin")


def rewrite(path, section=None, outlier_bytes=None):
    """The state file with its outlier section replaced (None: kept), outlier_bytes its size or the one
    claimed, and the crc made right again."""
    fields, arrays, old, history = ff.split_train_state(open(path, "rb").read())
    section = old if section is None else section
    fields["outlier_bytes"] = len(section) if outlier_bytes is None else outlier_bytes
    with open(path, "wb") as f:
        f.write(ff.join_train_state(fields, arrays, section, history))


def check_checkpoints(tmp, rng):
    print("checkpoints: the windows through write_checkpoint and load_checkpoint")
    steps = [(3.0 + rng.normal(0, 0.05), abs(1.0 + rng.normal(0, 0.3))) for _ in range(300)]
    for i in (20, 140, 141, 230):
        steps[i] = (math.nan, steps[i][1]) if i % 2 else (steps[i][0], math.inf)
    for i in (150, 170, 171, 260):
        steps[i] = (steps[i][0] + 0.5, steps[i][1] * 4)
    path = os.path.join(tmp, "run.txt")
    write_values(path, steps)
    rc, straight, err = tool("outliers", path, 2.0, 2.0)
    check("the run never stopped", rc == 0 and len(straight.splitlines()) == len(steps), err.strip()[:100])
    for k in (60, 128, 129, 200):
        d = os.path.join(tmp, f"k{k}")
        os.makedirs(d)
        rc, resumed, err = tool("outliers", path, 2.0, 2.0, d, k)
        skips_after = sum(1 for s, v in parse_run(resumed).items() if s > k and (v[2] or v[3])) if rc == 0 else 0
        check(f"saved after step {k}, resumed: every later line as the run never stopped ({skips_after} skips after)",
              rc == 0 and resumed == straight, err.strip()[:100])
        _, guard = reference_guard(steps, 2.0, 2.0, upto=k)
        data = open(state_file(d, k), "rb").read()
        fields = ff.TRAIN_STATE.unpack(data)
        section = np.frombuffer(data[-ff.OUTLIER_WINDOWS.itemsize:], ff.OUTLIER_WINDOWS)[0]
        held = all(int(section[name]["count"]) == w.count and int(section[name]["next"]) == w.next
                   and section[name]["values"].tobytes() == np.array(w.values, "<f8").tobytes()
                   for name, w in zip(("loss", "norm"), guard.windows))
        check(f"  its state file: outlier_bytes {fields['outlier_bytes']}, the section the reference's windows "
              f"(counts {guard.windows[0].count}, {guard.windows[1].count})",
              fields["outlier_bytes"] == ff.OUTLIER_WINDOWS.itemsize and held)
        rc, out, err = tool("windows", d, k)
        printed = [line.split() for line in out.splitlines()]
        same = rc == 0 and len(printed) == 2 and all(
            p[0] == name and int(p[1]) == w.count and int(p[2]) == w.next and
            all(same_bits(float(x), y) for x, y in zip(p[3:], w.values)) and len(p) == 3 + WINDOW
            for p, name, w in zip(printed, ("loss", "norm"), guard.windows))
        check("  checkpoint_tool windows prints them back", same, err.strip()[:100])

    print("older and damaged state files")
    d = os.path.join(tmp, "k200")
    older = os.path.join(tmp, "older")
    os.makedirs(older)
    for name in os.listdir(d):
        open(os.path.join(older, name), "wb").write(open(os.path.join(d, name), "rb").read())
    rewrite(state_file(older, 200), section=b"")
    rc, out, err = tool("windows", older, 200)
    empty = ["loss 0 0" + " 0" * WINDOW, "norm 0 0" + " 0" * WINDOW]
    check("a state file without the section (outlier_bytes 0, as before the guard) loads with empty windows",
          rc == 0 and out.splitlines() == empty, err.strip()[:100])
    rc, out, _ = tool("resume", older)
    check("  ... and -y 1 takes it", out.strip() == "resume 200", out.strip())
    section = bytearray(open(state_file(d, 200), "rb").read()[-ff.OUTLIER_WINDOWS.itemsize:])
    cases = []
    bad = np.frombuffer(bytes(section), ff.OUTLIER_WINDOWS).copy()
    bad["loss"]["count"] = 200
    cases.append(("a count of 200", bad.tobytes(), None, "outlier windows"))
    bad = np.frombuffer(bytes(section), ff.OUTLIER_WINDOWS).copy()
    bad["norm"]["next"] = 128
    cases.append(("a position of 128", bad.tobytes(), None, "outlier windows"))
    bad = np.frombuffer(bytes(section), ff.OUTLIER_WINDOWS).copy()
    bad["norm"]["values"][0, 5] = math.nan
    cases.append(("a NaN among the values held", bad.tobytes(), None, "outlier windows"))
    bad = np.frombuffer(bytes(section), ff.OUTLIER_WINDOWS).copy()
    bad["loss"]["count"], bad["loss"]["next"] = 50, 7
    cases.append(("a window filling whose next slot is not its count", bad.tobytes(), None, "outlier windows"))
    cases.append(("outlier_bytes 1000 (another size)", bytes(section[:1000]), None, "1000 bytes"))
    cases.append(("outlier_bytes saying 2064 with no section after the arrays", b"", 2064, "bytes, expected"))
    for what, new, claimed, needle in cases:
        e = os.path.join(tmp, "bad")
        os.makedirs(e, exist_ok=True)
        for name in os.listdir(d):
            open(os.path.join(e, name), "wb").write(open(os.path.join(d, name), "rb").read())
        rewrite(state_file(e, 200), section=new, outlier_bytes=claimed)
        rc, _, err = tool("windows", e, 200)
        lines = err.strip().splitlines()
        check(f"refused: {what}", rc == 1 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0],
              lines[-1][:120] if lines else f"exit code {rc}")
    e = os.path.join(tmp, "bad")
    data = bytearray(open(state_file(d, 200), "rb").read())
    data[-9] ^= 1  # a bit of the norm window's last value: the crc must catch it
    open(state_file(e, 200), "wb").write(bytes(data))
    rc, _, err = tool("windows", e, 200)
    check("the crc covers the section: one flipped bit fails the checksum", rc == 1 and "checksum" in err,
          err.strip()[:120])


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"error: {TOOL} is not built (make build/test/checkpoint_tool)", file=sys.stderr)
        sys.exit(1)
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as tmp:
        check_decisions(tmp, rng)
        check_checkpoints(tmp, rng)
    finish()


if __name__ == "__main__":
    main()
