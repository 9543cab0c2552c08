"""Our flash attention (flash_attention.cuh) side by side with PyTorch's scaled_dot_product_attention
on its flash backend, in one process on one GPU: timing and agreement, forward and backward.

    make build/libattention_capi.so
    python3 dev/cuda/attention_vs_torch.py [-b 64] [-n 12] [-t 1024] [-s 64] [--lib build/libattention_capi.so]

Both sides get the same bf16 qkv (B, T, 3C). Ours reads it in place and writes out (B, T, C); PyTorch
gets q, k, v as strided (B, NH, T, HS) views of the same memory (its flash kernels take strides, so no
copy is timed on either side). Backward: ours writes dqkv (B, T, 3C); PyTorch's is
torch.autograd.grad of the SDPA output w.r.t. the three views (its flash backward kernels, including
its dq accumulation and conversion). Times are medians of CUDA-event timed runs after warm-up.
TFLOP/s use the useful causal FLOP count: forward 4*B*NH*T*T*HS/2, backward 2.5x that.

Agreement: both are compared with a float64 math reference on the first sequence of the batch
(max |error| of out, dq, dk, dv), and with each other on the whole batch.
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
from torch.nn.attention import SDPBackend, sdpa_kernel


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
    p.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "libattention_capi.so"))
    a = p.parse_args()
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

    q, k, v = (heads(x).detach().requires_grad_() for x in qkv.split(C, dim=-1))
    dy = heads(dout)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def torch_fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def torch_bwd():
            torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)

        ours_fwd(), ours_bwd()
        torch.cuda.synchronize()
        t_of, t_ob = median_ms(ours_fwd), median_ms(ours_bwd)
        t_tf, t_tb = median_ms(torch_fwd), median_ms(torch_bwd)
        tdq, tdk, tdv = torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)

    ours_fwd(), ours_bwd()
    torch.cuda.synchronize()
    fwd_flops = 4.0 * B * NH * T * T * HS / 2
    bwd_flops = 2.5 * fwd_flops
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"causal attention, bf16, B={B} NH={NH} T={T} HS={HS}")
    print(f"FLOPs: forward 4*B*NH*T*T*HS/2 = {fwd_flops:.4g}, backward 2.5x = {bwd_flops:.4g}")
    print(f"{'':26s} {'time (ms)':>10s} {'TFLOP/s':>9s}")
    for name, ms, fl in (("ours forward", t_of, fwd_flops), ("torch SDPA flash forward", t_tf, fwd_flops),
                         ("ours backward", t_ob, bwd_flops), ("torch SDPA flash backward", t_tb, bwd_flops)):
        print(f"{name:26s} {ms:10.4f} {fl / (ms * 1e-3) / 1e12:9.1f}")
    print(f"ours / torch time: forward {t_of / t_tf:.3f}, backward {t_ob / t_tb:.3f}")

    # agreement with a float64 reference on sequence 0
    q64, k64, v64 = (heads(x[:1]).double().requires_grad_() for x in qkv.split(C, dim=-1))
    with sdpa_kernel(SDPBackend.MATH):
        y64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    g64 = torch.autograd.grad(y64, (q64, k64, v64), heads(dout[:1]).double())
    ref = {"out": y64.transpose(1, 2).reshape(1, T, C)}
    for name, g in zip(("dq", "dk", "dv"), g64):
        ref[name] = g.transpose(1, 2).reshape(1, T, C)
    ours = {"out": out[:1]}
    for i, name in enumerate(("dq", "dk", "dv")):
        ours[name] = dqkv[:1, :, i * C : (i + 1) * C]
    theirs = {"out": y.detach()[:1].transpose(1, 2).reshape(1, T, C)}
    for name, g in zip(("dq", "dk", "dv"), (tdq, tdk, tdv)):
        theirs[name] = g[:1].transpose(1, 2).reshape(1, T, C)
    print("\nmax |error| vs float64 math reference (sequence 0):")
    print(f"  {'':4s} {'ours':>10s} {'torch':>10s} {'max|ref|':>10s}")
    ok = True
    for name in ("out", "dq", "dk", "dv"):
        r = ref[name]
        eo = (ours[name].double() - r).abs().max().item()
        et = (theirs[name].double() - r).abs().max().item()
        print(f"  {name:4s} {eo:10.3e} {et:10.3e} {r.abs().max().item():10.3e}")
        ok &= eo <= 4 * et + 1e-3  # ours no worse than a few times PyTorch's own bf16 error
    full_t = {"out": y.detach().transpose(1, 2).reshape(B, T, C)}
    for name, g in zip(("dq", "dk", "dv"), (tdq, tdk, tdv)):
        full_t[name] = g.transpose(1, 2).reshape(B, T, C)
    full_o = {"out": out, "dq": dqkv[..., :C], "dk": dqkv[..., C : 2 * C], "dv": dqkv[..., 2 * C :]}
    print("max |ours - torch| over the whole batch: " +
          ", ".join(f"{n} {(full_o[n].float() - full_t[n].float()).abs().max().item():.3e}" for n in full_o))
    print("agreement:", "ok" if ok else "FAIL (ours more than 4x PyTorch's error)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
