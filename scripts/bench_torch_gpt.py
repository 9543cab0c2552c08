#!/usr/bin/env python3
"""PyTorch side of the training-throughput comparison: the reference GPT-2 (gpt_reference.py) with
attention through F.scaled_dot_product_attention (flash backend, causal), bf16 autocast, fused AdamW,
under torch.compile, trained on the same token file at the same B and T as train_gpt.

Prints, per B: median step time after warm-up, tokens/s, and peak memory (torch.cuda.max_memory_allocated).
"""
import argparse
import os
import statistics
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "scripts/bench_torch_gpt.py")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpt_reference as ref  # noqa: E402


def sdpa_forward(self, x):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="d12", help="GPT-2 descriptor: d12 (124M), d24, d36, d48 (as train_gpt -e)")
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30, help="steps per B; the first third are warm-up")
    p.add_argument("--tokens", default="data/tinyshakespeare/tiny_shakespeare_train.bin")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_torch_gpt: skipped (no CUDA device)")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    ref.CausalSelfAttention.forward = sdpa_forward
    tokens = torch.from_numpy(ref.read_tokens(args.tokens, 300_000).astype(np.int64))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, compile={not args.no_compile}")
    for B in args.batch:
        torch.manual_seed(0)
        model = ref.GPT(ref.parse_model(args.model))
        ref.random_init(model, 1337)
        model = model.cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        step_fn = model if args.no_compile else torch.compile(model)
        torch.cuda.reset_peak_memory_stats()
        n = B * args.seq
        times = []
        for step in range(args.steps):
            start = (step * n) % (len(tokens) - n - 1)
            x = tokens[start:start + n].view(B, args.seq).cuda(non_blocking=True)
            y = tokens[start + 1:start + n + 1].view(B, args.seq).cuda(non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = step_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        steady = statistics.median(times[args.steps // 3:])
        print(f"pytorch {args.model} B={B} T={args.seq}: median step {steady * 1e3:.1f} ms = {n / steady:,.0f} tok/s, "
              f"loss {loss.item():.4f}, peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
        del model, opt, step_fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
