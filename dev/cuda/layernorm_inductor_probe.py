"""What torch.compile runs for F.layer_norm's forward, and how it compares with ours under Nsight Compute.

Compiles the forward at N rows and each C (fp32 and bf16), with TorchInductor's cache in --cache-dir,
then copies the generated Triton kernels (*.py) and the configurations its autotuner kept
(*.best_config) to --save-dir, so the kernel we race can be read. With --ncu-shape C (under
`ncu`), runs compile's forward and ours (build/liblayernorm_capi.so) once each at that C, after a
warm-up, so the profiler sees one launch of each.

usage: python dev/cuda/layernorm_inductor_probe.py --save-dir DIR [--cache-dir DIR] [-N rows] [-C c1,c2,..]
       python dev/cuda/layernorm_inductor_probe.py --ncu-shape C [--dtype fp32|bf16] [-N rows]
"""
import argparse
import ctypes
import glob
import os
import shutil
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "dev/cuda/layernorm_inductor_probe.py")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compiled_forward(C):
    return torch.compile(lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5), dynamic=False)


def inputs(N, C, dtype):
    x = torch.randn(N, C, device="cuda", dtype=dtype)
    w = torch.randn(C, device="cuda", dtype=dtype)
    b = torch.randn(C, device="cuda", dtype=dtype)
    return x, w, b


def dump(args):
    for dt in args.dtype.split(","):
        for C in args.C:
            x, w, b = inputs(args.N, C, DTYPES[dt])
            f = compiled_forward(C)
            for _ in range(3):
                f(x, w, b)
            torch.cuda.synchronize()
    os.makedirs(args.save_dir, exist_ok=True)
    kept = 0
    for path in glob.glob(os.path.join(args.cache_dir, "**", "*"), recursive=True):
        if not os.path.isfile(path):
            continue
        if path.endswith(".best_config") or (path.endswith(".py") and "triton" in open(path, errors="ignore").read()):
            rel = os.path.relpath(path, args.cache_dir).replace(os.sep, "__")
            shutil.copy(path, os.path.join(args.save_dir, rel))
            kept += 1
    print(f"kept {kept} files from {args.cache_dir} in {args.save_dir}")


def ncu_shape(args):
    C, dtype = args.ncu_shape, DTYPES[args.dtype]
    x, w, b = inputs(args.N, C, dtype)
    f = compiled_forward(C)
    for _ in range(3):
        f(x, w, b)
    lib = ctypes.CDLL(os.path.join(ROOT, "build", "liblayernorm_capi.so"))
    P, I = ctypes.c_void_p, ctypes.c_int
    fn = lib.ln_forward_f32 if args.dtype == "fp32" else lib.ln_forward_bf16
    fn.argtypes = [P, P, P, P, P, P, I, I, P]
    fn.restype = I
    y = torch.empty_like(x)
    mean = torch.empty(args.N, device="cuda", dtype=torch.float32)
    rstd = torch.empty_like(mean)
    stream = torch.cuda.current_stream().cuda_stream

    def ours():
        if fn(y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), x.data_ptr(), w.data_ptr(), b.data_ptr(), args.N, C, stream):
            sys.exit("error: ours failed")

    for _ in range(3):
        ours()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    f(x, w, b)
    ours()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled compile and ours once each, N={args.N} C={C} {args.dtype}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-N", type=int, default=65536)
    p.add_argument("-C", type=lambda s: [int(c) for c in s.split(",")], default=[768, 1024, 1600, 2048, 4096])
    p.add_argument("--dtype", default="fp32,bf16")
    p.add_argument("--save-dir")
    p.add_argument("--cache-dir", default=os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
    p.add_argument("--ncu-shape", type=int)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    if args.N < 1 or any(c < 1 for c in args.C):
        sys.exit("error: -N and -C must be >= 1")
    if args.ncu_shape:
        if args.dtype not in DTYPES:
            sys.exit("error: --ncu-shape takes one --dtype, fp32 or bf16")
        ncu_shape(args)
    else:
        if not args.save_dir or not args.cache_dir:
            sys.exit("error: --save-dir and a cache dir (--cache-dir or TORCHINDUCTOR_CACHE_DIR) are needed")
        if any(d not in DTYPES for d in args.dtype.split(",")):
            sys.exit("error: --dtype takes fp32 and/or bf16")
        dump(args)


if __name__ == "__main__":
    main()
