"""Checks the LayerNorm laboratories' CPU reference (dev/cuda/layernorm_reference.cuh, the very
C++ code dev/cuda/layernorm_forward.cu and layernorm_backward.cu validate against) against PyTorch's
F.layer_norm forward and autograd backward, in float64 on the CPU.

The C++ reference is reached through build/liblayernorm_capi.so (built by `make`; its reference
functions are host code and need no GPU). Ends with `N passed, N failed, N skipped`.

usage: python test/test_layernorm_reference.py [-h]
"""
import ctypes
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "build", "liblayernorm_capi.so")
EPS = 1e-5
# Both sides compute in float64 with the same formulas in different orders: agreement to a few
# float64 ulps times the row length's log, far below anything the labs' fp32 bounds could hide.
RTOL = ATOL = 1e-12

# (N, C): a single row, C = 1 (variance 0), odd and GPT-2 sizes.
SHAPES = [(1, 1), (5, 1), (1, 768), (3, 33), (16, 768), (7, 1000), (2, 4100)]


def ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))


def main():
    if len(sys.argv) > 1:
        print(__doc__)
        return 0 if sys.argv[1] in ("-h", "--help") else 1
    passed = failed = 0
    if not os.path.exists(LIB):
        print(f"FAIL: {LIB} not built (run `make build/liblayernorm_capi.so`)")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    lib = ctypes.CDLL(LIB)
    lib.ln_reference_forward.restype = None
    lib.ln_reference_backward.restype = None
    rng = np.random.default_rng(0)
    for N, C in SHAPES:
        offset = rng.uniform(-2, 2, size=(N, 1))
        x = offset + rng.uniform(1, 2, size=(N, 1)) * rng.uniform(-1, 1, size=(N, C))
        w = rng.uniform(0.5, 1.5, size=C)
        b = rng.uniform(-0.5, 0.5, size=C)
        dy = rng.uniform(-1, 1, size=(N, C))

        out = np.empty((N, C)); mean = np.empty(N); rstd = np.empty(N)
        lib.ln_reference_forward(ptr(out), ptr(mean), ptr(rstd), ptr(x), ptr(w), ptr(b), N, C)
        dx = np.zeros((N, C)); dw = np.zeros(C); db = np.zeros(C)  # the reference accumulates
        lib.ln_reference_backward(ptr(dx), ptr(dw), ptr(db), ptr(dy), ptr(x), ptr(w), ptr(mean), ptr(rstd), N, C)

        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(w, requires_grad=True)
        bt = torch.tensor(b, requires_grad=True)
        yt = F.layer_norm(xt, (C,), wt, bt, EPS)
        yt.backward(torch.tensor(dy))
        tmean = xt.detach().mean(-1)
        trstd = 1.0 / torch.sqrt(xt.detach().var(-1, unbiased=False) + EPS)

        for name, got, ref in [("out", out, yt.detach()), ("mean", mean, tmean), ("rstd", rstd, trstd),
                               ("dx", dx, xt.grad), ("dweight", dw, wt.grad), ("dbias", db, bt.grad)]:
            ref = ref.numpy()
            err = np.abs(got - ref)
            bound = ATOL + RTOL * np.abs(ref)
            ok = bool(np.all(np.isfinite(got)) and np.all(err <= bound))
            worst = float(err.max()) if err.size else 0.0
            print(f"  N={N:<3} C={C:<5} {name:<8} {'ok  ' if ok else 'FAIL'}  max|err| {worst:.3e}  "
                  f"bound {ATOL:.0e} + {RTOL:.0e}|ref|")
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
