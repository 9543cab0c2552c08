#!/usr/bin/env python3
"""gpt_reference.py: the PyTorch reference for train_gpt.cu / test_gpt.cu.

A short, literal GPT-2 (nanoGPT-style) whose tensor names match the CUDA side, plus the two file
formats the CUDA programs read:

  checkpoint  (magic 20251101): the model config and every parameter, fp32
  reference   (magic 20251102): one batch, the logits, loss and every parameter gradient after one
              forward/backward, and the losses of K AdamW steps on that batch

Subcommands:
  init   write a checkpoint: a GPT-2-style random init from a seed (--model d12 | d6 | ... |
         L=2,NH=3,C=39,V=1237,maxT=50), or GPT-2 weights from a local Hugging Face state dict
         (--from-hf pytorch_model.bin; optional, nothing is downloaded)
  state  write a reference-state file for a checkpoint (random tokens from a seed, or a window of a
         token file), computed in fp32 with TF32 off, on the CPU or a GPU
  loss   load a checkpoint (ours, e.g. written by train_gpt) and print its loss on one batch

Checkpoint layout: 256 int32 header, then the parameters as fp32, tensor after tensor, each
row-major, every per-layer tensor stacked over layers (shape (L, ...)):
  header[0] = 20251101 (magic), [1] = 1 (version), [2] = L, [3] = NH, [4] = C, [5] = maxT, [6] = V,
  [7] = Vp (V padded up; rows V..Vp-1 of wte are zero), the rest zero.
  wte (Vp, C)  wpe (maxT, C)  ln1w (L, C)  ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)
  attprojw (L, C, C)  attprojb (L, C)  ln2w (L, C)  ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
  fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw (C)  lnfb (C)
  Linear weights are (out, in), as in torch.nn.Linear; qkvw rows are q, then k, then v, each split
  into NH heads of C/NH rows.

Reference-state layout: 256 int32 header, then int32 inputs (B, T), int32 targets (B, T), fp32 logits
(B, T, V) (padded columns dropped), fp32 loss, fp32 gradients in checkpoint order (same sizes), fp32
losses of steps 0..K-1 (loss before each update; step 0's is the loss above).
  header[0] = 20251102, [1] = 1, [2] = B, [3] = T, [4] = K, [5] = L, [6] = NH, [7] = C, [8] = maxT,
  [9] = V, [10] = Vp; header[16..21] hold fp32 bit patterns: lr, beta1, beta2, eps, weight decay,
  grad-norm clip. AdamW decays 2-D tensors only (wte, wpe and the four matrices per layer); the
  gradient is clipped to global norm `clip` before each update (torch.nn.utils.clip_grad_norm_).
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CHECKPOINT_MAGIC, CHECKPOINT_VERSION = 20251101, 1
STATE_MAGIC, STATE_VERSION = 20251102, 1
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1  # llm.c token files, written by data/
HEADER_INTS = 256
GPT2_DESCRIPTORS = {"d6": (6, 6, 384), "d12": (12, 12, 768), "d24": (24, 16, 1024),
                    "d36": (36, 20, 1280), "d48": (48, 25, 1600)}  # L, NH, C


class Error(Exception):
    """A bad input: reported as one line on stderr and exit code 1."""


def padded_vocab(V, multiple=128):
    return (V + multiple - 1) // multiple * multiple


class Config:
    def __init__(self, L, NH, C, maxT, V, Vp=None):
        self.L, self.NH, self.C, self.maxT, self.V = L, NH, C, maxT, V
        self.Vp = padded_vocab(V) if Vp is None else Vp
        if min(L, NH, C, maxT, V) < 1 or C % NH or self.Vp < V:
            raise Error(f"invalid model config {self}")

    def __str__(self):
        return f"L={self.L} NH={self.NH} C={self.C} maxT={self.maxT} V={self.V} Vp={self.Vp}"


def parse_model(text):
    """`d12`-style GPT-2 descriptor, or `L=2,NH=3,C=39,V=1237,maxT=50[,Vp=1280]`."""
    if text in GPT2_DESCRIPTORS:
        L, NH, C = GPT2_DESCRIPTORS[text]
        return Config(L, NH, C, maxT=1024, V=50257)
    try:
        fields = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
        if set(fields) - {"Vp"} == {"L", "NH", "C", "maxT", "V"}:
            return Config(fields["L"], fields["NH"], fields["C"], fields["maxT"], fields["V"],
                          fields.get("Vp"))
    except ValueError:
        pass
    raise Error(f"--model: expected one of {', '.join(GPT2_DESCRIPTORS)} or "
                f"L=..,NH=..,C=..,V=..,maxT=..[,Vp=..], got '{text}'")


# ------------------------------------------------------------------------------------------------
# The model. Same names as the CUDA side: wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2,
# mlp.c_fc, mlp.c_proj}, ln_f. The LM head is wte itself (tied).

class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.NH = cfg.NH
        self.c_attn = nn.Linear(cfg.C, 3 * cfg.C)
        self.c_proj = nn.Linear(cfg.C, cfg.C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.C, 4 * cfg.C)
        self.c_proj = nn.Linear(4 * cfg.C, cfg.C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.C)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.C)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.Vp, cfg.C)  # rows V..Vp-1 are padding, zero
        self.wpe = nn.Embedding(cfg.maxT, cfg.C)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.L))
        self.ln_f = nn.LayerNorm(cfg.C)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        # Padded vocabulary columns are cut before the loss, so they get no gradient.
        logits = (self.ln_f(x) @ self.wte.weight.t())[:, :, :self.cfg.V]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.cfg.V), targets.reshape(-1))
        return logits, loss


def checkpoint_tensors(model):
    """(name, [torch tensors stacked in this order]) in checkpoint order."""
    h = model.h
    return [
        ("wte", [model.wte.weight]), ("wpe", [model.wpe.weight]),
        ("ln1w", [b.ln_1.weight for b in h]), ("ln1b", [b.ln_1.bias for b in h]),
        ("qkvw", [b.attn.c_attn.weight for b in h]), ("qkvb", [b.attn.c_attn.bias for b in h]),
        ("attprojw", [b.attn.c_proj.weight for b in h]), ("attprojb", [b.attn.c_proj.bias for b in h]),
        ("ln2w", [b.ln_2.weight for b in h]), ("ln2b", [b.ln_2.bias for b in h]),
        ("fcw", [b.mlp.c_fc.weight for b in h]), ("fcb", [b.mlp.c_fc.bias for b in h]),
        ("fcprojw", [b.mlp.c_proj.weight for b in h]), ("fcprojb", [b.mlp.c_proj.bias for b in h]),
        ("lnfw", [model.ln_f.weight]), ("lnfb", [model.ln_f.bias]),
    ]


def num_checkpoint_floats(cfg):
    L, C = cfg.L, cfg.C
    return (cfg.Vp * C + cfg.maxT * C + 2 * L * C + L * 3 * C * C + L * 3 * C + L * C * C + L * C
            + 2 * L * C + L * 4 * C * C + L * 4 * C + L * C * 4 * C + L * C + 2 * C)


def flatten(tensors):
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors]).numpy()


def random_init(model, seed):
    """GPT-2 init: N(0, 0.02) matrices and embeddings, residual projections N(0, 0.02/sqrt(2L)),
    zero biases, LayerNorm weight 1 / bias 0. Drawn on the CPU so every device gets the same model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * model.cfg.L) if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "ln_" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
        model.wte.weight[model.cfg.V:].zero_()


# ------------------------------------------------------------------------------------------------
# Files. Every write goes to a temporary file in the target folder, then os.replace: a reader never
# sees half a file.

def write_atomic(path, chunks):
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(np.ascontiguousarray(chunk).tobytes())
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_checkpoint(model, path):
    cfg = model.cfg
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [CHECKPOINT_MAGIC, CHECKPOINT_VERSION, cfg.L, cfg.NH, cfg.C, cfg.maxT, cfg.V, cfg.Vp]
    data = [flatten(ts) for _, ts in checkpoint_tensors(model)]
    assert sum(d.size for d in data) == num_checkpoint_floats(cfg)
    write_atomic(path, [header] + data)


def read_header(path, magic, version, what):
    try:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
    except OSError as e:
        raise Error(f"cannot read {what} '{path}': {e.strerror}")
    if header.size != HEADER_INTS or header[0] != magic:
        raise Error(f"'{path}' is not a {what} (bad magic number)")
    if header[1] != version:
        raise Error(f"'{path}': {what} version {header[1]}, expected {version}")
    return header


def read_checkpoint(path, device="cpu"):
    h = read_header(path, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, "checkpoint")
    cfg = Config(*(int(x) for x in h[2:8]))
    n = num_checkpoint_floats(cfg)
    expected = HEADER_INTS * 4 + 4 * n
    if os.path.getsize(path) != expected:
        raise Error(f"checkpoint '{path}': {os.path.getsize(path)} bytes, expected {expected} for {cfg}")
    data = torch.from_numpy(np.fromfile(path, dtype=np.float32, offset=HEADER_INTS * 4))
    model = GPT(cfg)
    offset = 0
    with torch.no_grad():
        for _, tensors in checkpoint_tensors(model):
            for t in tensors:
                t.copy_(data[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
    return model.to(device)


def read_tokens(path, count, offset=0):
    h = read_header(path, TOKENS_MAGIC, TOKENS_VERSION, "token file")
    ntok = int(h[2])
    if offset + count > ntok:
        raise Error(f"token file '{path}' has {ntok} tokens; need {offset + count}")
    return np.fromfile(path, dtype=np.uint16, offset=HEADER_INTS * 4 + 2 * offset, count=count)


def load_hf_gpt2(path):
    """GPT-2 124M..1.5B weights from a local Hugging Face pytorch_model.bin (Conv1D weights are
    (in, out), so they are transposed)."""
    sd = torch.load(path, map_location="cpu")
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
    V, C = sd["wte.weight"].shape
    cfg = Config(L, C // 64, C, sd["wpe.weight"].shape[0], V)
    model = GPT(cfg)
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            src = sd[name]
            if name.endswith(transposed):
                src = src.t()
            if name == "wte.weight":
                p.zero_()
                p[:V].copy_(src)
            else:
                p.copy_(src)
    return model


# ------------------------------------------------------------------------------------------------

def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise Error("--device cuda: no CUDA device visible to PyTorch")
    # fp32 means fp32: no TF32 in matmuls or convolutions (PyTorch 1.13 and 2.x spellings).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    return name


def make_batch(cfg, B, T, seed, tokens_path, offset, device):
    if T > cfg.maxT:
        raise Error(f"T={T} exceeds the model's maxT={cfg.maxT}")
    if tokens_path:
        window = read_tokens(tokens_path, B * T + 1, offset).astype(np.int64)
        if window.max() >= cfg.V:
            raise Error(f"token file '{tokens_path}' holds token {window.max()} >= V={cfg.V}")
        x, y = torch.from_numpy(window[:-1]).view(B, T), torch.from_numpy(window[1:]).view(B, T)
    else:
        g = torch.Generator().manual_seed(seed)
        both = torch.randint(0, cfg.V, (2, B, T), generator=g)
        x, y = both[0], both[1]
    return x.to(device), y.to(device)


def cmd_init(args):
    if args.from_hf:
        model = load_hf_gpt2(args.from_hf)
    else:
        torch.manual_seed(args.seed)
        model = GPT(parse_model(args.model))
        random_init(model, args.seed)
    write_checkpoint(model, args.out)
    n = sum(p.numel() for p in model.parameters()) - (model.cfg.Vp - model.cfg.V) * model.cfg.C
    print(f"wrote {args.out}: {model.cfg}, {n} parameters")


def cmd_state(args):
    device = pick_device(args.device)
    model = read_checkpoint(args.checkpoint, device)
    cfg = model.cfg
    x, y = make_batch(cfg, args.batch, args.seq, args.seed, args.tokens, args.offset, device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    losses = []
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        loss.backward()
        if step == 0:
            logits0, loss0 = logits.detach().float().cpu().numpy(), loss.item()
            grads = [flatten([t.grad for t in ts]) for _, ts in checkpoint_tensors(model)]
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.6f}")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:11] = [STATE_MAGIC, STATE_VERSION, args.batch, args.seq, args.steps,
                   cfg.L, cfg.NH, cfg.C, cfg.maxT, cfg.V, cfg.Vp]
    header.view(np.float32)[16:22] = [args.lr, args.beta1, args.beta2, args.eps, args.weight_decay,
                                      args.clip]
    write_atomic(args.out, [header, x.cpu().numpy().astype(np.int32), y.cpu().numpy().astype(np.int32),
                            logits0, np.float32([loss0])] + grads + [np.float32(losses)])
    print(f"wrote {args.out}: B={args.batch} T={args.seq} K={args.steps} on {device}, loss {loss0:.6f}")


def cmd_loss(args):
    device = pick_device(args.device)
    model = read_checkpoint(args.checkpoint, device)
    x, y = make_batch(model.cfg, args.batch, args.seq, args.seed, args.tokens, args.offset, device)
    with torch.no_grad():
        _, loss = model(x, y)
    print(f"loss {loss.item():.6f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init", help="write a checkpoint (random init or local GPT-2 weights)")
    init.add_argument("--model", default="d12", help="d6|d12|d24|d36|d48 or L=..,NH=..,C=..,V=..,maxT=.. (default d12)")
    init.add_argument("--seed", type=int, default=1337, help="init seed (default 1337)")
    init.add_argument("--from-hf", metavar="FILE", help="local Hugging Face GPT-2 pytorch_model.bin instead of random init")
    init.add_argument("--out", required=True, help="checkpoint to write")

    def batch_args(q):
        q.add_argument("--checkpoint", required=True, help="checkpoint to load")
        q.add_argument("--batch", "-B", type=int, default=4, help="batch size B (default 4)")
        q.add_argument("--seq", "-T", type=int, default=64, help="sequence length T (default 64)")
        q.add_argument("--seed", type=int, default=42, help="seed of the random batch (default 42)")
        q.add_argument("--tokens", metavar="FILE", help="take the batch from this token file instead")
        q.add_argument("--offset", type=int, default=0, help="first token of the batch in --tokens (default 0)")
        q.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")

    state = sub.add_parser("state", help="write a reference-state file for test_gpt")
    batch_args(state)
    state.add_argument("--steps", "-K", type=int, default=10, help="AdamW steps (default 10)")
    state.add_argument("--lr", type=float, default=1e-4, help="learning rate (default 1e-4)")
    state.add_argument("--beta1", type=float, default=0.9)
    state.add_argument("--beta2", type=float, default=0.95)
    state.add_argument("--eps", type=float, default=1e-8)
    state.add_argument("--weight-decay", type=float, default=0.1, help="on 2-D tensors (default 0.1)")
    state.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (default 1.0)")
    state.add_argument("--out", required=True, help="reference-state file to write")

    loss = sub.add_parser("loss", help="print a checkpoint's loss on one batch")
    batch_args(loss)

    args = p.parse_args(argv)
    for name in ("batch", "seq", "steps"):
        if getattr(args, name, 1) < 1:
            raise Error(f"--{name} must be >= 1")
    if getattr(args, "offset", 0) < 0:
        raise Error("--offset must be >= 0")
    {"init": cmd_init, "state": cmd_state, "loss": cmd_loss}[args.command](args)


if __name__ == "__main__":
    try:
        main()
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
