"""Our flash attention (flash_attention.cuh) side by side with PyTorch's scaled_dot_product_attention
on each of its fused backends (flash, cuDNN, memory-efficient), in one process on one GPU: timing,
agreement and determinism, forward and backward.

    make build/libattention_capi.so
    python3 dev/cuda/attention_vs_torch.py [-b 64] [-n 12] [-t 1024] [-s 64] [--backends flash,cudnn,efficient]
                                           [--lib build/libattention_capi.so]

Both sides get the same bf16 qkv (B, T, 3C). Ours reads it in place and writes out (B, T, C); PyTorch
gets q, k, v as strided (B, NH, T, HS) views of the same memory (its kernels take strides, so no copy
is timed on either side). Backward: ours writes dqkv (B, T, 3C); PyTorch's is torch.autograd.grad of
the SDPA output w.r.t. the three views (the backend's backward kernels, including its dq accumulation
and conversion). Times are medians of CUDA-event timed runs after warm-up, each side timed in turn.
TFLOP/s use the useful causal FLOP count: forward 4*B*NH*T*T*HS/2, backward 2.5x that.

cuDNN's fused attention on Hopper is the kernel llm.c trains with (its cuDNN build). A backend this
GPU or PyTorch build does not offer is reported as such and left out.

Agreement: every side is compared with a float64 math reference on the first sequence of the batch
(max |error| of out, dq, dk, dv); ours must be within 4x the error of the first backend that ran.
Determinism: each side's backward is run twice more on the same inputs (ours into a NaN-poisoned
dqkv) and its dq, dk, dv compared bit for bit; ours must give the same bits (the others are
reported, not judged).
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
    exit_wrong_python(e, "dev/cuda/attention_vs_torch.py")
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    sys.exit(f"error: PyTorch {torch.__version__} has no torch.nn.attention (its SDPA backends): this script needs 2.3 or later")

# None: this PyTorch has no such backend
BACKENDS = {name: getattr(SDPBackend, attr, None) for name, attr in
            (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"))}


def median_ms(fn, warmup=10, reps=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-b", type=int, default=64, help="batch size (default 64)")
    p.add_argument("-n", type=int, default=12, help="heads (default 12)")
    p.add_argument("-t", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("-s", type=int, default=64, help="head size (default 64)")
    p.add_argument("--backends", default="flash,cudnn,efficient",
                   help="PyTorch SDPA backends to run, comma-separated, of " + ", ".join(BACKENDS))
    p.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "libattention_capi.so"))
    a = p.parse_args()
    names = list(dict.fromkeys(n for n in a.backends.split(",") if n))  # in order, each once
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        sys.exit(f"error: --backends: unknown '{','.join(unknown)}' (choose from {', '.join(BACKENDS)})")
    if not names:
        sys.exit(f"error: --backends: none given (choose from {', '.join(BACKENDS)})")
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    if not os.path.exists(a.lib):
        sys.exit(f"error: {a.lib} not found (make build/libattention_capi.so)")
    lib = ctypes.CDLL(a.lib)
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.attn_forward.argtypes = [vp, vp, vp, ci, ci, ci, ci, vp]
    lib.attn_backward.argtypes = [vp, vp, vp, vp, vp, vp, ci, ci, ci, ci, vp]
    lib.attn_backward_scratch_bytes.argtypes = [ci, ci, ci, ci]
    lib.attn_backward_scratch_bytes.restype = ctypes.c_size_t

    B, NH, T, HS = a.b, a.n, a.t, a.s
    C = NH * HS
    dev = torch.device("cuda")
    torch.manual_seed(0)
    qkv = torch.empty(B, T, 3 * C, device=dev)
    qkv[..., : 2 * C].uniform_(-2, 2)
    qkv[..., 2 * C :].uniform_(-1, 1)
    qkv = qkv.bfloat16()
    dout = (torch.rand(B, T, C, device=dev) * 2 - 1).bfloat16()
    stream = torch.cuda.current_stream().cuda_stream

    # ours
    out = torch.empty(B, T, C, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(B, NH, T, device=dev, dtype=torch.float32)
    dqkv = torch.empty_like(qkv)
    scratch = torch.empty(lib.attn_backward_scratch_bytes(B, T, NH, HS), device=dev, dtype=torch.uint8)

    def ours_fwd():
        lib.attn_forward(out.data_ptr(), lse.data_ptr(), qkv.data_ptr(), B, T, NH, HS, stream)

    def ours_bwd():
        lib.attn_backward(dqkv.data_ptr(), scratch.data_ptr(), dout.data_ptr(), out.data_ptr(), lse.data_ptr(),
                          qkv.data_ptr(), B, T, NH, HS, stream)

    # PyTorch: strided (B, NH, T, HS) views of the same qkv
    def heads(x):
        return x.view(x.shape[0], T, NH, HS).transpose(1, 2)

    def as_btc(x):  # (B, NH, T, HS) -> (B, T, C)
        return x.transpose(1, 2).reshape(x.shape[0], T, C)

    q, k, v = (heads(x).detach().requires_grad_() for x in qkv.split(C, dim=-1))
    dy = heads(dout)

    fwd_flops = 4.0 * B * NH * T * T * HS / 2
    bwd_flops = 2.5 * fwd_flops
    rows = []  # (name, forward ms, backward ms)
    results = {}  # name -> {"out", "dq", "dk", "dv"} over the whole batch, (B, T, C)
    same_bits = {}  # name -> whether two more backward runs gave the first one's bits

    ours_fwd(), ours_bwd()
    torch.cuda.synchronize()
    rows.append(("ours", median_ms(ours_fwd), median_ms(ours_bwd)))
    first = dqkv.clone()
    same = True
    for _ in range(2):  # poisoned first: a value a run leaves unwritten fails the comparison
        dqkv.fill_(float("nan"))
        ours_fwd(), ours_bwd()
        same = same and torch.equal(dqkv, first)
    same_bits["ours"] = same
    results["ours"] = {"out": out, "dq": dqkv[..., :C], "dk": dqkv[..., C : 2 * C], "dv": dqkv[..., 2 * C :]}

    for name in names:
        if BACKENDS[name] is None:
            print(f"torch SDPA {name}: not in PyTorch {torch.__version__}")
            continue
        try:
            with sdpa_kernel(BACKENDS[name]):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def torch_fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def torch_bwd():
                    return torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)

                grads = torch_bwd()
                torch.cuda.synchronize()
                t_f, t_b = median_ms(torch_fwd), median_ms(torch_bwd)
                again = [torch_bwd(), torch_bwd()]
        except RuntimeError as e:  # not offered for this GPU, dtype, shape or build (or out of memory)
            print(f"torch SDPA {name}: did not run ({(str(e).splitlines() or [type(e).__name__])[0][:120]})")
            continue
        rows.append((f"torch SDPA {name}", t_f, t_b))
        same_bits[f"torch SDPA {name}"] = all(torch.equal(g, h) for run in again for g, h in zip(run, grads))
        results[f"torch SDPA {name}"] = {"out": as_btc(y.detach()), "dq": as_btc(grads[0]), "dk": as_btc(grads[1]),
                                         "dv": as_btc(grads[2])}
        del y, grads, again

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"causal attention, bf16, B={B} NH={NH} T={T} HS={HS}")
    print(f"FLOPs: forward 4*B*NH*T*T*HS/2 = {fwd_flops:.4g}, backward 2.5x = {bwd_flops:.4g}")
    print(f"{'':26s} {'forward ms':>10s} {'TFLOP/s':>8s} {'backward ms':>11s} {'TFLOP/s':>8s} {'same bits':>9s}")
    for name, f_ms, b_ms in rows:
        print(f"{name:26s} {f_ms:10.4f} {fwd_flops / (f_ms * 1e-3) / 1e12:8.1f} {b_ms:11.4f} "
              f"{bwd_flops / (b_ms * 1e-3) / 1e12:8.1f} {'yes' if same_bits[name] else 'no':>9s}")
    for name, f_ms, b_ms in rows[1:]:
        print(f"ours / {name} time: forward {rows[0][1] / f_ms:.3f}, backward {rows[0][2] / b_ms:.3f}")

    # agreement with a float64 reference on sequence 0
    q64, k64, v64 = (heads(x[:1]).double().requires_grad_() for x in qkv.split(C, dim=-1))
    with sdpa_kernel(SDPBackend.MATH):
        y64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    g64 = torch.autograd.grad(y64, (q64, k64, v64), heads(dout[:1]).double())
    ref = {"out": as_btc(y64)}
    for name, g in zip(("dq", "dk", "dv"), g64):
        ref[name] = as_btc(g)
    sides = list(results)
    print("\nmax |error| vs float64 math reference (sequence 0):")
    print(f"  {'':4s} " + " ".join(f"{s[11:] if s.startswith('torch') else s:>10s}" for s in sides) + f" {'max|ref|':>10s}")
    ok = True
    for t in ("out", "dq", "dk", "dv"):
        err = [(results[s][t][:1].double() - ref[t]).abs().max().item() for s in sides]
        print(f"  {t:4s} " + " ".join(f"{e:10.3e}" for e in err) + f" {ref[t].abs().max().item():10.3e}")
        if len(err) > 1:
            ok &= err[0] <= 4 * err[1] + 1e-3  # ours no worse than a few times the first backend's bf16 error
    for s in sides[1:]:
        print(f"max |ours - {s}| over the whole batch: " +
              ", ".join(f"{t} {(results['ours'][t].float() - results[s][t].float()).abs().max().item():.3e}"
                        for t in ("out", "dq", "dk", "dv")))
    if len(sides) == 1:
        print("agreement: no PyTorch backend ran, so ours was not compared")
        ok = False
    else:
        print("agreement:", "ok" if ok else f"FAIL (ours more than 4x {sides[1]}'s error)")
    print("ours deterministic:", "ok" if same_bits["ours"] else "FAIL (two backward runs differ)")
    return 0 if ok and same_bits["ours"] else 1


if __name__ == "__main__":
    sys.exit(main())
