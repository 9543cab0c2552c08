"""The d12 step's GEMMs in PyTorch (bf16, cuBLAS through torch), timed like dev/cuda/matmul: the
side-by-side for that lab's table. Run on the same GPU right after the lab, so both see the same clocks.

    python dev/cuda/matmul_vs_torch.py [--rows 65536]
"""
import argparse
import os
import sys

try:
    import torch
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "dev/cuda/matmul_vs_torch.py")


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return times[reps // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=65536)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    N, C, Vp = args.rows, 768, 50304
    dev, dt = "cuda", torch.bfloat16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16, N = {N} (median of 20 after 3 warm-ups)")
    layers = [("qkv", C, 3 * C, True), ("attproj", C, C, True), ("fc", C, 4 * C, True), ("fcproj", 4 * C, C, True),
              ("lmhead", C, Vp, False)]
    total = 0.0
    for name, cin, cout, has_bias in layers:
        x = torch.rand(N, cin, device=dev, dtype=dt) * 2 - 1
        w = (torch.rand(cout, cin, device=dev, dtype=dt) - 0.5) * 0.1
        b = torch.rand(cout, device=dev, dtype=dt) if has_bias else None
        dy = (torch.rand(N, cout, device=dev, dtype=dt) - 0.5) * 0.02
        flops = 2.0 * N * cin * cout
        f = median_ms(lambda: torch.nn.functional.linear(x, w, b))
        dx = median_ms(lambda: dy @ w)
        dw = median_ms(lambda: dy.t() @ x)
        db = median_ms(lambda: dy.sum(0)) if has_bias else 0.0
        for what, ms in (("fwd", f), ("dinp", dx), ("dweight", dw)):
            print(f"{name:8s} {what:8s} torch {ms:9.4f} ms {flops / ms / 1e9:8.1f} TFLOP/s")
        if has_bias:
            print(f"{name:8s} dbias    torch {db:9.4f} ms ({N * cout * 2 / db / 1e6:.0f} GB/s)")
        total += (f + dx + dw + db) * (1 if name == "lmhead" else 12)
        del x, w, b, dy
        torch.cuda.empty_cache()
    print(f"per step (12 layers + LM head): torch {total:.2f} ms")


if __name__ == "__main__":
    main()
