"""Side by side, in one process on the GPU: PyTorch's LayerNorm (eager and torch.compile) and ours
(layernorm.cuh through build/liblayernorm_capi.so and ctypes, on the same tensors and stream).

For each shape and dtype: checks that ours agrees with PyTorch eager (forward out/mean/rstd, backward
dx/dweight/dbias), then times forward and backward of all three and prints one table.

Timing: each measurement is a CUDA-event pair around 20 back-to-back calls (so Python's launch cost
hides behind the GPU's work); the six contestants of a shape take turns, 15 rounds, and each reports
its median (taking turns keeps clock or thermal drift from favouring whoever ran first).

Backward, two comparisons. PyTorch's backward (aten.native_layer_norm_backward, what autograd runs for
F.layer_norm) writes a fresh dx; ours ACCUMULATES into dx/dweight/dbias (the contract: in GPT-2 the
LayerNorm input is the residual stream, whose gradient already holds the skip connection's part), so it
reads dx as well and moves 4/3 the bytes. The same job in PyTorch is that backward plus the add into the
residual gradient: eager runs it as the backward and then add_ kernels; torch.compile fuses the add into
its backward kernel, as it does when it compiles a whole model. The table shows both: "bwd" is PyTorch
writing a fresh dx (less work than ours), "bwd +=" is PyTorch doing our job; the speedups are given
against both.
GB/s = each side's minimal bytes / time:
  forward       N*C*s read + N*C*s written + 8*N (mean, rstd)                  (s = sizeof(dtype))
  backward      read x, dy + write dx = 3*N*C*s + 8*N
  backward +=   and ours: also reads dx = 4*N*C*s + 8*N

usage: python dev/cuda/layernorm_vs_torch.py [-N rows] [-C c1,c2,...] [--dtype fp32|bf16] [--no-compile] [--forward-only]
"""
import argparse
import ctypes
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "dev/cuda/layernorm_vs_torch.py")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.path.join(ROOT, "build", "liblayernorm_capi.so")
EPS = 1e-5


def time_ms(fn, calls=20, reps=15, warmup=3):
    return time_all_ms({"fn": fn}, calls, reps, warmup)["fn"]


def time_all_ms(fns, calls=20, reps=15, warmup=3):
    """Median ms per call of each of `fns` (name -> callable); they take turns, one event pair each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / calls)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def load_lib():
    lib = ctypes.CDLL(LIB)
    P, I = ctypes.c_void_p, ctypes.c_int
    for name in ("ln_forward_f32", "ln_forward_bf16"):
        getattr(lib, name).argtypes = [P, P, P, P, P, P, I, I, P]
        getattr(lib, name).restype = I
    for name in ("ln_backward_f32", "ln_backward_bf16"):
        getattr(lib, name).argtypes = [P, P, P, P, P, P, P, P, P, I, I, P]
        getattr(lib, name).restype = I
    lib.ln_backward_scratch_bytes.argtypes = [I, I]
    lib.ln_backward_scratch_bytes.restype = ctypes.c_size_t
    return lib


def agree(name, got, ref, rtol, atol):
    got, ref = got.float(), ref.float()
    err = (got - ref).abs()
    bound = atol + rtol * ref.abs()
    ok = bool(torch.isfinite(got).all()) and bool((err <= bound).all())
    print(f"    {name:<8} {'ok  ' if ok else 'FAIL'}  max|err| {err.max().item():.3e}  bound {atol:.0e} + {rtol:.0e}|ref|")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-N", type=int, default=65536)
    ap.add_argument("-C", default="768,1024,1600,2048,4096")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: both")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--forward-only", action="store_true", help="time the forward only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("layernorm_vs_torch: skipped (no CUDA device)")
        return 0
    if not os.path.exists(LIB):
        print(f"error: {LIB} not built (run `make build/liblayernorm_capi.so`)", file=sys.stderr)
        return 1
    lib = load_lib()
    # One compiled graph per shape and dtype: raise dynamo's recompile limit (default 8) so no shape
    # falls back to eager silently.
    from torch import _dynamo  # binds _dynamo only (a plain `import torch._dynamo` here would make torch local)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(_dynamo.config, name):
            setattr(_dynamo.config, name, 64)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    Cs = [int(c) for c in args.C.split(",")]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    names = [args.dtype] if args.dtype else ["fp32", "bf16"]
    N = args.N
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    # Copy bandwidth in this process, for the % column.
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() / (time_ms(lambda: dst.copy_(src), calls=5, reps=10) * 1e-3) / 1e9
    del src, dst
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + written)")

    aten_bwd = torch.ops.aten.native_layer_norm_backward
    rows, all_ok = [], True
    for dname in names:
        dt = dtypes[dname]
        s = torch.finfo(dt).bits // 8
        fwd_c = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS)
        bwd_c = lambda dy, x, mean, rstd, w, b: aten_bwd(dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])

        def bwd_acc_c(dx0, dw0, db0, dy, x, mean, rstd, w, b):  # our job: the gradients added to what is there
            dx, dw, db = aten_bwd(dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])
            return dx0 + dx, dw0 + dw, db0 + db

        if not args.no_compile:
            fwd_c = torch.compile(fwd_c, dynamic=False)
            bwd_c = torch.compile(bwd_c, dynamic=False)
            bwd_acc_c = torch.compile(bwd_acc_c, dynamic=False)
        for C in Cs:
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            x = (torch.randn(N, 1, device=dev) + (0.5 + torch.rand(N, 1, device=dev)) * torch.randn(N, C, device=dev)).to(dt)
            w = (1 + 0.5 * torch.randn(C, device=dev)).to(dt)
            b = (0.5 * torch.randn(C, device=dev)).to(dt)
            dy = torch.randn(N, C, device=dev).to(dt)
            # torch eager
            y_t, mean_t, rstd_t = torch.ops.aten.native_layer_norm(x, [C], w, b, EPS)
            dx_t, dw_t, db_t = aten_bwd(dy, x, [C], mean_t, rstd_t, w, b, [True, True, True])
            # ours
            y = torch.empty_like(x)
            mean = torch.empty(N, device=dev, dtype=torch.float32)
            rstd = torch.empty_like(mean)
            dx, dw, db = torch.zeros_like(x), torch.zeros_like(w), torch.zeros_like(b)  # ours accumulates
            scratch = torch.empty(lib.ln_backward_scratch_bytes(N, C), dtype=torch.uint8, device=dev)
            fwd_ours_fn = lib.ln_forward_f32 if dt == torch.float32 else lib.ln_forward_bf16
            bwd_ours_fn = lib.ln_backward_f32 if dt == torch.float32 else lib.ln_backward_bf16
            fwd_ours = lambda: fwd_ours_fn(y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), x.data_ptr(), w.data_ptr(),
                                           b.data_ptr(), N, C, stream)
            bwd_ours = lambda: bwd_ours_fn(dx.data_ptr(), dw.data_ptr(), db.data_ptr(), scratch.data_ptr(), dy.data_ptr(),
                                           x.data_ptr(), w.data_ptr(), mean.data_ptr(), rstd.data_ptr(), N, C, stream)
            fwd_ours()
            bwd_ours()
            torch.cuda.synchronize()
            print(f"\n  agreement, ours vs torch eager, {dname} N={N} C={C}")
            # fp32: both are fp32 reductions in different orders. bf16: both round to bf16 (1 ulp = 2^-8
            # relative, either side may round the other way) plus the fp32 difference. dweight/dbias are
            # sums over N rows: bf16 storage gives them 2^-8 relative, fp32 a few 1e-5 of the sum's size.
            r = 1e-4 if dt == torch.float32 else 2 ** -7
            ok = agree("out", y, y_t, r, r)
            ok &= agree("mean", mean, mean_t.reshape(-1), 1e-5, 1e-5)
            ok &= agree("rstd", rstd, rstd_t.reshape(-1), 1e-5, 1e-5)
            ok &= agree("dx", dx, dx_t, r, r)
            red = 1e-3 if dt == torch.float32 else 2 ** -6
            ok &= agree("dweight", dw, dw_t, red, red * (dw_t.float().abs().max().item() + 1))
            ok &= agree("dbias", db, db_t, red, red * (db_t.float().abs().max().item() + 1))
            all_ok &= ok
            # the compiled versions once more for agreement (the += one adds into a random dx0), then timings
            y_c = fwd_c(x, w, b)
            all_ok &= agree("compiled out", y_c, y_t, r, r)
            dx0, dw0, db0 = torch.randn_like(x), torch.randn_like(w), torch.randn_like(b)
            if not args.forward_only:
                dx_c = bwd_c(dy, x, mean_t, rstd_t, w, b)[0]
                all_ok &= agree("compiled dx", dx_c, dx_t, r, r)
                dx_acc = bwd_acc_c(dx0, dw0, db0, dy, x, mean_t, rstd_t, w, b)[0]
                all_ok &= agree("compiled dx +=", dx_acc, (dx0.float() + dx_t.float()).to(dt), 2 * r, 2 * r)
                del dx_c, dx_acc

            def bwd_acc_eager():
                dx_e, dw_e, db_e = aten_bwd(dy, x, [C], mean_t, rstd_t, w, b, [True, True, True])
                dx0.add_(dx_e), dw0.add_(dw_e), db0.add_(db_e)

            t = time_all_ms({
                "fwd eager": lambda: torch.ops.aten.native_layer_norm(x, [C], w, b, EPS),
                "fwd compile": lambda: fwd_c(x, w, b),
                # y from the caching allocator on every call, as torch.compile's output is: where the
                # output lies relative to x moves the bandwidth by up to 7% (the lab's --out-offset), so
                # both sides get the same placement policy.
                "fwd ours": lambda: fwd_ours_fn(torch.empty_like(x).data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                                x.data_ptr(), w.data_ptr(), b.data_ptr(), N, C, stream)})
            if args.forward_only:
                t.update({k: float("nan") for k in ("bwd eager", "bwd compile", "bwd+= eager", "bwd+= compile", "bwd ours")})
            else:
                t.update(time_all_ms({
                    "bwd eager": lambda: aten_bwd(dy, x, [C], mean_t, rstd_t, w, b, [True, True, True]),
                    "bwd compile": lambda: bwd_c(dy, x, mean_t, rstd_t, w, b),
                    "bwd+= eager": bwd_acc_eager,
                    "bwd+= compile": lambda: bwd_acc_c(dx0, dw0, db0, dy, x, mean_t, rstd_t, w, b),
                    "bwd ours": bwd_ours}))
            fb = 2 * N * C * s + 8 * N
            rows.append((dname, C, t, fb, 3 * N * C * s + 8 * N, 4 * N * C * s + 8 * N))
            del x, dy, y, dx, y_t, dx_t, scratch, y_c, dx0
            torch.cuda.empty_cache()

    print(f"\nN = {N}; time in us, GB/s (each side's minimal bytes, see the top of this file), % of copy {copy_gbs:.0f} GB/s")

    def cell(ms, nbytes, pct=False):
        gbs = nbytes / (ms * 1e-3) / 1e9
        return f"{ms * 1e3:7.1f} {gbs:5.0f} GB/s" + (f" {100 * gbs / copy_gbs:3.0f}%" if pct else "")

    hdr = f"{'dtype':<5} {'C':>5} | {'fwd eager':>17} {'fwd compile':>17} {'fwd ours':>22}"
    print("\nforward\n" + hdr + "\n" + "-" * len(hdr))
    for dname, C, t, fb, _, _ in rows:
        print(f"{dname:<5} {C:>5} | {cell(t['fwd eager'], fb):>17} {cell(t['fwd compile'], fb):>17} {cell(t['fwd ours'], fb, True):>22}")
    hdr = (f"{'dtype':<5} {'C':>5} | {'bwd eager':>17} {'bwd compile':>17} | {'bwd += eager':>17} {'bwd += compile':>17}"
           f" {'bwd ours (+=)':>22}")
    print("\nbackward (bwd: PyTorch writes a fresh dx; bwd +=: PyTorch does our job, adding into dx/dweight/dbias)\n"
          + hdr + "\n" + "-" * len(hdr))
    for dname, C, t, _, bb_t, bb_o in rows:
        print(f"{dname:<5} {C:>5} | {cell(t['bwd eager'], bb_t):>17} {cell(t['bwd compile'], bb_t):>17} | "
              f"{cell(t['bwd+= eager'], bb_o):>17} {cell(t['bwd+= compile'], bb_o):>17} {cell(t['bwd ours'], bb_o, True):>22}")
    print("\nspeedup of ours (torch time / our time):")
    for dname, C, t, *_ in rows:
        print(f"  {dname} C={C:<5} fwd: {t['fwd eager'] / t['fwd ours']:.2f}x eager, {t['fwd compile'] / t['fwd ours']:.2f}x compile;"
              f"  bwd, same job (+=): {t['bwd+= eager'] / t['bwd ours']:.2f}x eager, {t['bwd+= compile'] / t['bwd ours']:.2f}x compile;"
              f"  against a fresh dx: {t['bwd eager'] / t['bwd ours']:.2f}x eager, {t['bwd compile'] / t['bwd ours']:.2f}x compile")
    print("\nagreement:", "all ok" if all_ok else "SOME FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
