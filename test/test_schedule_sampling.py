#!/usr/bin/env python3
"""test_schedule_sampling.py: train_gpt's learning-rate schedules (schedule.h) and its sampler
(train_gpt.cu's sample_token) against gpt_reference.py's, value for value, on the host.

  - every schedule (cosine, linear, constant, wsd) for several warm-ups, lengths, final fractions and
    wsd decay fractions: the float32 learning rate of every step is the same bits on both sides
    (cosine: within peak * 2^-22, the two libraries' cosines);
  - the sampler on made-up logits (ties included) at several temperatures, top-k and top-p: the same
    ids, draw after draw from one generator (greedy, top-k alone, top-p alone, both); and what top-p
    keeps of a distribution whose nucleus is known.
Needs build/test/checkpoint_tool (no GPU). Ends with `N passed, N failed, N skipped`.
"""
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402  (it also puts the checkout on sys.path)
import gpt_reference as ref  # noqa: E402

TOOL = os.path.join(ROOT, "build", "test", "checkpoint_tool")


def tool(*args):
    return subprocess.run([TOOL, *map(str, args)], check=True, capture_output=True, text=True).stdout.split()


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"error: {TOOL} is not built (make build/test/checkpoint_tool)", file=sys.stderr)
        sys.exit(1)
    print("schedules: the learning rate of every step, schedule.h against gpt_reference.py train")
    for kind in ("cosine", "linear", "constant", "wsd"):
        for peak, final, warmup, steps, decay in ((6e-4, 0.1, 10, 100, 0.2), (1e-3, 0.0, 0, 37, 0.25),
                                                 (3e-4, 0.5, 40, 40, 0.5), (6e-4, 0.0, 700, 18865, 0.2),
                                                 (1.0, 0.3, 3, 11, 1.0), (1.0, 0.3, 0, 7, 0.0)):
            cpp = tool("schedule", kind, peak, final, warmup, steps, decay)
            a = SimpleNamespace(k=kind, l=peak, q=final, u=warmup, x=steps, wd=decay)
            py = ["%.9g" % ref.learning_rate(a, s) for s in range(steps)]
            # cosine goes through the cosine of each side's library (glibc's cosf, numpy's), which may
            # differ in the last bit of a value near 1: at most peak * 2^-22 apart once scaled and
            # added; every other schedule is the same arithmetic, bit for bit.
            diff = np.abs(np.float64(np.float32(cpp)) - np.float64(np.float32(py)))
            bound = peak * 2.0**-22 if kind == "cosine" else 0.0
            worst = float(diff.max()) if diff.size else 0.0
            check(f"-k {kind} -l {peak:g} -q {final:g} -u {warmup} -x {steps} -wd {decay:g}: apart by at most {bound:.1e}",
                  len(cpp) == len(py) == steps and worst <= bound, f"worst {worst:.2e}")
    print("sampling: sample_token against sample_next, 200 draws from one generator each")
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        for case in range(6):
            V = [50257, 1000, 17, 1000, 3000, 64][case]
            logits = (rng.standard_normal(V) * [1, 3, 0.5, 8, 2, 1][case]).astype(np.float32)
            if case == 4:
                logits[::7] = logits[3]  # many ties, at the top-k and top-p borders too
            path = os.path.join(tmp, f"logits{case}.bin")
            logits.tofile(path)
            for temp, top_k, top_p in ((0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 40, 1.0), (1.0, 0, 0.9), (0.7, 200, 0.5),
                                       (1.3, 5, 0.999), (1.0, 0, 1e-6)):
                seed = 1000 * case + 17
                cpp = [int(x) for x in tool("sample", path, temp, top_k, top_p, seed, 200)]
                r = ref.Rng(seed)
                py = [ref.sample_next(logits, temp, top_k, r, top_p) for _ in range(200)]
                check(f"V={V} temperature {temp:g} top-k {top_k} top-p {top_p:g}: the same 200 ids", cpp == py,
                      "" if cpp == py else f"first difference at draw {next(i for i in range(200) if cpp[i] != py[i])}")
        # What top-p keeps, on a distribution whose nucleus is known: p = 0.5, 0.3, 0.15, 0.05.
        logits = np.log(np.float32([0.5, 0.3, 0.15, 0.05]))
        path = os.path.join(tmp, "known.bin")
        logits.tofile(path)
        for top_p, allowed in ((0.45, {0}), (0.75, {0, 1}), (0.9, {0, 1, 2}), (1.0, {0, 1, 2, 3})):
            ids = [int(x) for x in tool("sample", path, 1.0, 0, top_p, 5, 2000)]
            check(f"top-p {top_p:g} of (0.5, 0.3, 0.15, 0.05): draws {sorted(allowed)} only, each of them",
                  set(ids) == allowed, f"drew {sorted(set(ids))}")
    finish()


if __name__ == "__main__":
    main()
