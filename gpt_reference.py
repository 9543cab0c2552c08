#!/usr/bin/env python3
"""gpt_reference.py: the PyTorch reference for train_gpt.cu / test_gpt.cu.

A short, literal GPT-2 (nanoGPT-style) whose tensor names match the CUDA side, plus the two file
formats the CUDA programs read:

  checkpoint  (magic 20251101): the model config and every parameter, fp32
  reference   (magic 20251102): one batch, the logits, loss and every parameter gradient after one
              forward/backward, and the losses of K AdamW steps on that batch

Subcommands (each has -h):
  init      write a checkpoint: a GPT-2-style random init from a seed (--model d12 | d6 | ... |
            L=2,NH=3,C=39,V=1237,maxT=50); `init --from-hf SOURCE` is `import SOURCE`
  state     write a reference-state file for a checkpoint (random tokens from a seed, or a window of a
            token file), computed in fp32 with TF32 off, on the CPU or a GPU
  loss      load checkpoints (ours, e.g. written by train_gpt) and print their losses on one batch
  import    our checkpoint from GPT-2 weights on disk: Hugging Face files (model.safetensors or
            pytorch_model.bin, their sharded form *.index.json + shards, or their folder; config.json
            read when beside them, a setting that changes the maths refused by name; 124M to 1.5B)
            or an llm.c model file (versions 3 = fp32 and 5 = bf16)
  export    our checkpoint to a Hugging Face folder (model.safetensors, config.json,
            generation_config.json and, for GPT-2's vocabulary, vocab.json, merges.txt, tokenizer.json
            and tokenizer_config.json: what AutoModelForCausalLM and AutoTokenizer.from_pretrained
            read) or to an llm.c model file
  generate  text from a prompt: the sampler train_gpt's sampling uses (see `sample_next`)
  train     a training run exactly as train_gpt does it (same flags, data order, schedule, clipping,
            AdamW, skipped steps, the outlier guard -sl/-sg, validation, printed lines), in fp32 with TF32
            off, to put beside one of train_gpt's runs
  eval      a model's HellaSwag score (acc, acc_norm) on llm.c's eval file, as train_gpt computes it
            (data/prepare_hellaswag.py writes the file; --scores: every completion's summed loss)

Checkpoint layout: 256 int32 header, then the parameters as fp32, tensor after tensor, each
row-major, every per-layer tensor stacked over layers (shape (L, ...)):
  header[0] = 20251101 (magic), [1] = 1 (version), [2] = L, [3] = NH, [4] = C, [5] = maxT, [6] = V,
  [7] = Vp (V padded up; rows V..Vp-1 of wte are zero), [8] = crc32 (0 = not recorded), the rest zero.
  The crc32 is zlib's over the 256-int32 header with [8] = 0, continued over the fp32 payload (as
  train_gpt.cu's header_and_payload_crc); readers verify it when it is not 0.
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
  gradient is clipped to global norm `clip` before each update (torch.nn.utils.clip_grad_norm_);
  clip 0 is off, as in adamw.cuh's clip_factor.

Outputs (init, state, import, export, train -o): an output that is one of the inputs is refused, and
an existing one is replaced only with --force (train -o: never over a run's checkpoints or
metrics.csv). Each file is written to a temporary file beside it and renamed into place.

Interchange formats (import / export):
  llm.c model file: 256 int32 header [0] = 20240326, [1] = 3 (fp32 parameters) or 5 (bf16), [2] = maxT,
    [3] = V, [4] = L, [5] = NH, [6] = C, [7] = Vp, then the parameters in our order and shapes.
  Hugging Face GPT-2: h.N.attn.c_attn / attn.c_proj / mlp.c_fc / mlp.c_proj are Conv1D, weights
    (in, out): transposed to and from our (out, in); the LM head is tied to wte (exported once);
    wte has V rows (our padding rows are dropped on export, zero on import).
"""
import argparse
import glob
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
import zlib
from fractions import Fraction

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # a Python without them: one line naming the one make found, no traceback
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
    from python_check import exit_wrong_python
    exit_wrong_python(e, "gpt_reference.py")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))
import file_formats  # noqa: E402  (every file header and the parameter list, as the C++ side declares them)
from file_formats import (HEADER_INTS, LLMC_MODEL_MAGIC, LLMC_MODEL_VERSIONS, MODEL_FILE_MAGIC,  # noqa: E402
                          MODEL_FILE_VERSION, REFERENCE_MAGIC, REFERENCE_VERSION, TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION)
EOT = 50256  # GPT-2's <|endoftext|>
GPT2_DESCRIPTORS = {"d6": (6, 6, 384), "d12": (12, 12, 768), "d24": (24, 16, 1024),
                    "d36": (36, 20, 1280), "d48": (48, 25, 1600)}  # L, NH, C


class Error(Exception):
    """A bad input: reported as one line on stderr and exit code 1."""


def padded_vocab(V, multiple=128):
    return (V + multiple - 1) // multiple * multiple


class Config:
    """A model's shape, within train_gpt.cu's config_error limits (so a file one side reads, the other
    reads too, and an absurd size is an error rather than an allocator failure)."""

    def __init__(self, L, NH, C, maxT, V, Vp=None):
        self.L, self.NH, self.C, self.maxT, self.V = L, NH, C, maxT, V
        self.Vp = padded_vocab(V) if Vp is None else Vp
        if (not 1 <= L <= 1024 or NH < 1 or not 1 <= C <= 65536 or not 1 <= maxT <= 65536 or not 1 <= V <= 1 << 20
                or not V <= self.Vp <= (1 << 20) + 128 or C % NH):
            raise Error(f"invalid model config {self} (limits: L 1..1024, C 1..65536 and a multiple of NH, "
                        f"maxT 1..65536, V 1..2^20)")
        largest = max(L * 4 * C * C, self.Vp * C, maxT * C)  # fcw/fcprojw, wte, wpe
        if largest >= 1 << 31:
            raise Error(f"model config {self}: a tensor of {largest} elements, the limit is 2^31")

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


def param_shapes(cfg):
    """(name, shape) in checkpoint order: data/file_formats.py's PARAMETER_TENSORS, which is
    model_config.h's list (test/test_formats.py checks it)."""
    return file_formats.param_shapes(cfg)


DECAYED = file_formats.DECAYED      # weight decay (model_config.h's list)
PER_LAYER = file_formats.PER_LAYER  # stacked over layers: (L, ...)


def num_checkpoint_floats(cfg):
    return sum(math.prod(shape) for _, shape in param_shapes(cfg))


def flatten(tensors):
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors]).numpy()


def model_params(model):
    """{name: fp32 numpy array of the checkpoint shape}, in checkpoint order."""
    shapes = dict(param_shapes(model.cfg))
    return {name: flatten(ts).reshape(shapes[name]) for name, ts in checkpoint_tensors(model)}


def model_from_params(cfg, params):
    model = GPT(cfg)
    with torch.no_grad():
        for name, tensors in checkpoint_tensors(model):
            stacked = torch.from_numpy(np.ascontiguousarray(params[name], dtype=np.float32))
            for i, t in enumerate(tensors):
                t.copy_(stacked[i] if name in PER_LAYER else stacked)
    return model


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
# train_gpt's random numbers: splitmix64 (struct Rng in train_gpt.cu). One generator serves
# sampling, the data loader's shuffle and train_gpt's own init (`train -e d12`).

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


class Rng:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):  # [0, 1), 53 random bits
        return (self.next() >> 11) * 2.0**-53


def splitmix64_block(seed, first, count):
    """Outputs first .. first+count-1 (counting from 0) of Rng(seed).next(), vectorized."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed & MASK64) + np.arange(first + 1, first + count + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def cuda_random_init(cfg, seed):
    """train_gpt.cu's random_init (what `train_gpt -e d12 -sd SEED` trains): matrices and embeddings
    N(0, 0.02) drawn in checkpoint order from Rng(seed) by Box-Muller (two draws per value; wte's
    padding rows are not drawn), the residual projections N(0, 0.02/sqrt(2L)), LayerNorm weights 1,
    biases 0. Same formulas in double, rounded to float at the same places; numpy's log and cos may
    differ from glibc's in a last bit, so a few values can differ by one float ulp."""
    params, drawn = {}, 0
    for name, shape in param_shapes(cfg):
        p = np.zeros(shape, dtype=np.float32)
        if name in DECAYED:
            std = (np.float32(0.02) / np.sqrt(np.float32(2.0) * np.float32(cfg.L))
                   if name in ("attprojw", "fcprojw") else np.float32(0.02))
            flat = p.reshape(-1)
            n = cfg.V * cfg.C if name == "wte" else flat.size
            for at in range(0, n, 1 << 22):
                k = min(n - at, 1 << 22)
                bits = splitmix64_block(seed, 2 * (drawn + at), 2 * k).reshape(k, 2) >> np.uint64(11)
                u1 = 1.0 - bits[:, 0].astype(np.float64) * 2.0**-53
                u2 = bits[:, 1].astype(np.float64) * 2.0**-53
                normal = (np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)).astype(np.float32)
                flat[at:at + k] = normal * std
            drawn += n
        elif name in ("ln1w", "ln2w", "lnfw"):
            p[:] = 1.0
        params[name] = p
    return params


# ------------------------------------------------------------------------------------------------
# Files. Every write goes to a temporary file in the target folder, then os.replace: a reader never
# sees half a file.

def write_atomic(path, chunks, crc_slot=None, replace=True):
    """Writes the chunks (numpy arrays or bytes). With crc_slot, the first chunk is a 256-int32
    header whose slot crc_slot is 0; it is set to the crc32 of everything written before the rename.
    replace=False never replaces a file that is there (see publish). A failure is one Error naming
    `path` (never the temporary file), and the temporary file is gone."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        make_folder(folder, path)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
        with os.fdopen(fd, "wb") as f:
            crc = 0
            for chunk in chunks:
                data = chunk if isinstance(chunk, bytes) else np.ascontiguousarray(chunk).tobytes()
                crc = zlib.crc32(data, crc)
                f.write(data)
            if crc_slot is not None:
                f.seek(4 * crc_slot)
                f.write(np.array([crc], dtype=np.uint32).tobytes())
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path, replace)
    except OSError as e:
        raise Error(f"cannot write '{path}': {e.strerror or one_line(e)}")
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def existing_above(folder):
    """`folder` (absolute) or the nearest folder above it that exists."""
    while not os.path.lexists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def make_folder(folder, path):
    """Makes `path`'s folder where it is missing; a file where a folder of it should be is an Error
    naming that file (os.makedirs would say only "File exists")."""
    above = existing_above(folder)
    if not os.path.isdir(above):
        raise Error(f"cannot write '{path}': '{above}' is a file, not a folder")
    os.makedirs(folder, exist_ok=True)


def publish(tmp, path, replace=True):
    """Gives the temporary file ordinary permissions (mkstemp makes 0600) and renames it to path.
    replace=False: as a hard link, which fails where path exists, so a file that appeared since the
    command's checks is never replaced (a plain rename where the file system has no hard links)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    if replace:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise Error(f"'{path}' appeared while it was being written: not replaced (--force replaces it)")
    except OSError:
        if os.path.lexists(path):
            raise Error(f"'{path}' appeared while it was being written: not replaced (--force replaces it)")
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def same_file(a, b):
    """Do two paths name one file (links, '..' and hard links seen through)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def model_inputs(source):
    """The files that reading the model `source` opens: its weights (for a folder, the file
    read_model_params picks there), and for Hugging Face weights the config.json beside them and,
    for a sharded index, its shards."""
    weights = source
    if os.path.isdir(source):
        weights = next((os.path.join(source, n) for n in HF_WEIGHTS if os.path.lexists(os.path.join(source, n))), None)
        if weights is None:
            return []
    ours = (MODEL_FILE_MAGIC.to_bytes(4, "little"), LLMC_MODEL_MAGIC.to_bytes(4, "little"))
    if not weights.endswith((".safetensors", ".index.json")) and read_head(weights, 4) in ours:
        return [weights]
    folder = os.path.dirname(weights)
    files = [weights, os.path.join(folder, "config.json")]
    if weights.endswith(".index.json"):
        try:
            with open(weights, encoding="utf-8") as f:
                files += [os.path.join(folder, str(shard)) for shard in set(json.load(f)["weight_map"].values())]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # reading it will say what is wrong with it
    return files


def check_outputs(flag, value, outputs, inputs, force):
    """Before any work: an output is never one of the inputs (not even with --force: the input would
    be gone), nor a folder; an output that exists is replaced only with --force, as Hugging Face's
    and llm.c's users expect of a converter. `outputs` are paths (value itself, or files in it)."""
    for out in outputs:
        where = f"{flag} '{value}'" if out == value else f"{flag} '{value}': '{out}'"
        for path in inputs:
            if os.path.lexists(out) and os.path.lexists(path) and same_file(out, path):
                raise Error(f"{where} is the input '{path}': write to another path")
        if os.path.isdir(out):
            raise Error(f"{where} is a folder")
        above = existing_above(os.path.dirname(os.path.abspath(out)))
        if not os.path.isdir(above):
            raise Error(f"{where} cannot be written: '{above}' is a file, not a folder")
        if os.path.lexists(out) and not force:
            raise Error(f"{where} already exists: add --force to replace it")


def write_checkpoint_params(cfg, params, path, replace=True):
    header = file_formats.MODEL_FILE.pack(L=cfg.L, NH=cfg.NH, C=cfg.C, maxT=cfg.maxT, V=cfg.V, Vp=cfg.Vp)
    data = []
    for name, shape in param_shapes(cfg):
        if params[name].shape != shape:
            raise Error(f"{name}: shape {params[name].shape}, expected {shape} for {cfg}")
        data.append(np.ascontiguousarray(params[name], dtype=np.float32))
    write_atomic(path, [header] + data, crc_slot=file_formats.MODEL_FILE.slot("crc"), replace=replace)


def write_checkpoint(model, path, replace=True):
    write_checkpoint_params(model.cfg, model_params(model), path, replace)


def regular_file(path, what="file"):
    """`path` must be a regular file (links followed): opening a FIFO blocks forever, and a device
    may never end."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise Error(f"cannot read {what} '{path}': {e.strerror}")
    if not stat.S_ISREG(st.st_mode):
        raise Error(f"{what} '{path}' is not a regular file")


def check_finite(path, cfg, params):
    """As train_gpt's reader: a non-finite parameter is an error, not a model that prints garbage."""
    at = 0
    for name, _ in param_shapes(cfg):
        flat = np.asarray(params[name]).reshape(-1)
        for lo in range(0, flat.size, 1 << 24):  # in chunks: no mask the size of the model
            bad = np.flatnonzero(~np.isfinite(flat[lo:lo + (1 << 24)]))
            if bad.size:
                i = lo + int(bad[0])
                raise Error(f"'{path}' holds a non-finite parameter: {flat[i]} in {name} (its element {i}, "
                            f"index {at + i} of all parameters)")
        at += flat.size
    return cfg, params


def header_ints(f, path, magic, what):
    """The 256 int32 of the header at f's start. A file too short for it is an error that names the
    file: as a truncated `what` where its first bytes are `what`'s magic, else as not a `what`."""
    data = f.read(HEADER_INTS * 4)
    if len(data) < HEADER_INTS * 4:
        if len(data) >= 4 and int.from_bytes(data[:4], "little", signed=True) == magic:
            raise Error(f"{what} '{path}': {len(data)} bytes, shorter than its {HEADER_INTS * 4}-byte header "
                        f"(truncated?)")
        raise Error(f"'{path}' is not a {what} ({len(data)} bytes, shorter than a {what}'s "
                    f"{HEADER_INTS * 4}-byte header)")
    return np.frombuffer(data, dtype=np.int32)


def read_header(path, magic, version, what):
    regular_file(path, what)
    try:
        with open(path, "rb") as f:
            header = header_ints(f, path, magic, what)
    except OSError as e:
        raise Error(f"cannot read {what} '{path}': {e.strerror}")
    if header[0] != magic:
        raise Error(f"'{path}' is not a {what} (bad magic number)")
    if header[1] != version:
        raise Error(f"'{path}': {what} version {header[1]}, expected {version}")
    return header


def config_of(path, *fields):
    try:
        return Config(*fields)
    except Error as e:
        raise Error(f"'{path}': {e}")


def split_params(cfg, flat):
    """{name: view of `flat` with the checkpoint shape}."""
    params, at = {}, 0
    for name, shape in param_shapes(cfg):
        n = math.prod(shape)
        params[name] = flat[at:at + n].reshape(shape)
        at += n
    return params


def read_checkpoint_params(path):
    h = read_header(path, MODEL_FILE_MAGIC, MODEL_FILE_VERSION, "checkpoint")
    f = file_formats.MODEL_FILE.unpack(h)
    cfg = config_of(path, f["L"], f["NH"], f["C"], f["maxT"], f["V"], f["Vp"])
    n = num_checkpoint_floats(cfg)
    expected = HEADER_INTS * 4 + 4 * n
    if os.path.getsize(path) != expected:
        raise Error(f"checkpoint '{path}': {os.path.getsize(path)} bytes, expected {expected} for {cfg}")
    data = np.fromfile(path, dtype=np.float32, offset=HEADER_INTS * 4)
    if f["crc"] != 0:
        zeroed = file_formats.MODEL_FILE.pack(**{**f, "crc": 0})
        if zlib.crc32(data, zlib.crc32(zeroed.tobytes())) != f["crc"]:
            raise Error(f"checkpoint '{path}' fails its crc32 check (corrupt or partly written)")
    return check_finite(path, cfg, split_params(cfg, data))


def read_checkpoint(path, device="cpu"):
    return model_from_params(*read_checkpoint_params(path)).to(device)


def token_count(path):
    """The number of tokens of a token file whose size matches its header."""
    n = int(read_header(path, TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION, "token file")[2])
    size = os.path.getsize(path)
    if n < 1 or size != HEADER_INTS * 4 + 2 * n:
        raise Error(f"token file '{path}': its header says {n} tokens, its size is {size} bytes (truncated?)")
    return n


def read_tokens(path, count, offset=0):
    ntok = token_count(path)
    if offset + count > ntok:
        raise Error(f"token file '{path}' has {ntok} tokens; {count} from offset {offset} would end at "
                    f"{offset + count}")
    return np.fromfile(path, dtype=np.uint16, offset=HEADER_INTS * 4 + 2 * offset, count=count)


# ------------------------------------------------------------------------------------------------
# Other programs' model files. Each reader returns (Config, {name: fp32 array of the checkpoint shape}).

def read_llmc(path):
    """llm.c's model file (gpt2_write_to_checkpoint): version 3 holds fp32 parameters, 5 bf16."""
    regular_file(path, "llm.c model file")
    with open(path, "rb") as f:
        h = header_ints(f, path, LLMC_MODEL_MAGIC, "llm.c model file")
        if h[0] != LLMC_MODEL_MAGIC:
            raise Error(f"'{path}' is not an llm.c model file (bad magic number)")
        if int(h[1]) not in LLMC_MODEL_VERSIONS:
            raise Error(f"llm.c model file '{path}': version {h[1]}, expected 3 (fp32) or 5 (bf16)")
        fl = file_formats.LLMC_MODEL.unpack(h)
        cfg = config_of(path, fl["L"], fl["NH"], fl["C"], fl["maxT"], fl["V"], fl["Vp"])
        n, width = num_checkpoint_floats(cfg), 4 if h[1] == 3 else 2
        if os.path.getsize(path) != HEADER_INTS * 4 + width * n:
            raise Error(f"llm.c model file '{path}': {os.path.getsize(path)} bytes, expected "
                        f"{HEADER_INTS * 4 + width * n} for {cfg} ({LLMC_MODEL_VERSIONS[int(h[1])]}; truncated?)")
        data = np.fromfile(f, dtype=np.float32 if width == 4 else np.uint16, count=n)
    if width == 2:  # bf16 is the top half of an fp32
        data = (data.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return check_finite(path, cfg, split_params(cfg, data))


def to_bf16_bits(a):
    """fp32 -> bf16 (round to nearest even, as torch and train_gpt round), as uint16 bit patterns."""
    bf16 = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return bf16.view(torch.int16).numpy().view(np.uint16)


def write_llmc(cfg, params, path, dtype, replace=True):
    header = file_formats.LLMC_MODEL.pack(version=3 if dtype == "fp32" else 5, maxT=cfg.maxT, V=cfg.V, L=cfg.L,
                                          NH=cfg.NH, C=cfg.C, Vp=cfg.Vp)
    convert = (lambda a: np.ascontiguousarray(a, dtype=np.float32)) if dtype == "fp32" else to_bf16_bits
    write_atomic(path, [header] + [convert(params[name]) for name, _ in param_shapes(cfg)], replace=replace)


# Hugging Face GPT-2 keys (without "transformer."); {} is the layer. Conv1D weights are (in, out).
HF_KEYS = {"wte": "wte.weight", "wpe": "wpe.weight", "ln1w": "h.{}.ln_1.weight", "ln1b": "h.{}.ln_1.bias",
           "qkvw": "h.{}.attn.c_attn.weight", "qkvb": "h.{}.attn.c_attn.bias",
           "attprojw": "h.{}.attn.c_proj.weight", "attprojb": "h.{}.attn.c_proj.bias",
           "ln2w": "h.{}.ln_2.weight", "ln2b": "h.{}.ln_2.bias", "fcw": "h.{}.mlp.c_fc.weight",
           "fcb": "h.{}.mlp.c_fc.bias", "fcprojw": "h.{}.mlp.c_proj.weight", "fcprojb": "h.{}.mlp.c_proj.bias",
           "lnfw": "ln_f.weight", "lnfb": "ln_f.bias"}
HF_CONV1D = {"qkvw", "attprojw", "fcw", "fcprojw"}


def one_line(e):
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def load_safetensors(path):
    """{key: torch tensor} of a safetensors file. A file named *.safetensors, or laid out as one, is
    read by the safetensors library only, never by PyTorch's pickle reader: a damaged one is reported
    as such."""
    regular_file(path, "safetensors file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise Error(f"cannot read safetensors file '{path}': {e.strerror}")
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    if not safetensors_layout(head):
        raise Error(f"safetensors file '{path}' is damaged: it does not start with a safetensors header "
                    f"({size} bytes)")
    if n > size - 8:
        raise Error(f"safetensors file '{path}' is truncated or damaged: its header says {n} bytes, the file "
                    f"has {size - 8} after the length")
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise Error(f"'{path}' is a safetensors file: install the safetensors package to read it")
    try:
        return load_file(path)
    except Exception as e:  # the library's own errors: header, size and dtype problems
        raise Error(f"safetensors file '{path}' is truncated or damaged ({one_line(e)})")


def load_hf_state_dict(path):
    """{key: torch tensor} of a model.safetensors or a pytorch_model.bin."""
    if path.endswith(".safetensors") or safetensors_layout(read_head(path)):
        return load_safetensors(path)
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and unpickling errors alike
        detail = one_line(e)
        if re.search(r"weights.only", str(e), re.IGNORECASE):
            # PyTorch's message suggests unpickling arbitrary objects (weights_only=False): never ours
            # to give. What it found is after "WeightsUnpickler error:".
            found = str(e).rsplit("WeightsUnpickler error:", 1)
            detail = "it holds objects other than tensors" + (
                f": {found[1].strip().splitlines()[0]}" if len(found) == 2 and found[1].strip() else "")
        raise Error(f"cannot read '{path}' as a PyTorch state dict ({detail})")
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise Error(f"'{path}' holds a {type(sd).__name__}, not a state dict of tensors")
    return sd


def load_sharded(index_path):
    """{key: torch tensor} of Hugging Face's sharded weights: model.safetensors.index.json (or
    pytorch_model.bin.index.json), whose "weight_map" names the shard file of every tensor, and
    those shards, beside it. Every tensor must be in the shard the index names, and only there."""
    regular_file(index_path, "sharded-weights index")
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not an object of file names")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Error(f"cannot read '{index_path}' as a sharded-weights index ({one_line(e)})")
    folder, sd = os.path.dirname(index_path), {}
    for shard in sorted(set(weight_map.values())):
        if shard != os.path.basename(shard) or shard in ("", ".", ".."):
            raise Error(f"'{index_path}': shard '{shard}' is not a file name in its folder")
        path = os.path.join(folder, shard)
        if not os.path.lexists(path):
            raise Error(f"'{index_path}' names shard '{shard}', which is not in {folder or '.'}")
        for key, t in load_hf_state_dict(path).items():
            if weight_map.get(key) != shard:
                where = f"in '{weight_map[key]}'" if key in weight_map else "nowhere"
                raise Error(f"'{path}' holds {key}, which the index places {where}")
            sd[key] = t
    missing = sorted(set(weight_map) - set(sd))
    if missing:
        raise Error(f"'{index_path}': {missing[0]} is not in its shard '{weight_map[missing[0]]}'"
                    f"{f' (nor {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    return sd


def read_hf(path):
    """GPT-2 weights of Hugging Face's GPT2Model / GPT2LMHeadModel (124M ... 1.5B), any float dtype."""
    sd = load_sharded(path) if path.endswith(".index.json") else load_hf_state_dict(path)
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    for k in [k for k in sd if k.endswith((".attn.bias", ".attn.masked_bias"))]:
        del sd[k]  # causal-mask buffers of older transformers versions, not parameters
    head = sd.pop("lm_head.weight", None)
    if "wte.weight" not in sd or "wpe.weight" not in sd:
        raise Error(f"'{path}' holds no GPT-2 weights (no wte.weight / wpe.weight among {len(sd)} keys)")
    if head is not None and not torch.equal(head, sd["wte.weight"]):
        raise Error(f"'{path}': lm_head.weight differs from wte.weight (an untied head; ours is tied)")
    layers = [k.split(".")[1] for k in sd if k.startswith("h.")]
    (V, C), maxT = sd["wte.weight"].shape, sd["wpe.weight"].shape[0]
    L = 1 + max(int(i) for i in layers) if layers else 0
    NH = C // 64 if C % 64 == 0 else 0  # every GPT-2 has heads of 64 channels
    config_path = os.path.join(os.path.dirname(path), "config.json")
    if os.path.lexists(config_path):
        regular_file(config_path, "config")
        try:
            with open(config_path) as f:
                hf = json.load(f)
            if not isinstance(hf, dict):
                raise TypeError(f"a JSON {type(hf).__name__}, not an object")
            L, NH, C, maxT, V = (json_int(hf, k) for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"))
            eps = hf.get("layer_norm_epsilon", 1e-5)
            if isinstance(eps, bool) or not isinstance(eps, (int, float)):
                raise TypeError(f"layer_norm_epsilon {eps!r} is not a number")
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as e:
            raise Error(f"cannot read '{config_path}' as a GPT-2 config ({one_line(e)})")
        check_hf_maths(hf, config_path, C)
    if NH < 1:
        raise Error(f"'{path}': n_embd {C} is not a multiple of 64 and no config.json gives n_head")
    cfg = config_of(path, L, NH, C, maxT, V)
    params = {}
    for name, shape in param_shapes(cfg):
        per_layer = name in PER_LAYER
        keys = [HF_KEYS[name].format(i) for i in range(L)] if per_layer else [HF_KEYS[name]]
        want = (V, C) if name == "wte" else shape[1:] if per_layer else shape
        want = want[::-1] if name in HF_CONV1D else want
        stacked = []
        for key in keys:
            if key not in sd:
                raise Error(f"'{path}': no tensor {key} (expected for {cfg})")
            t = sd.pop(key)
            if tuple(t.shape) != tuple(want):
                raise Error(f"'{path}': {key} has shape {tuple(t.shape)}, expected {tuple(want)} for {cfg}")
            t = t.float()
            stacked.append((t.t() if name in HF_CONV1D else t).contiguous().numpy())
        array = np.stack(stacked) if per_layer else stacked[0]
        if name == "wte":  # the padding rows
            array = np.concatenate([array, np.zeros((cfg.Vp - V, C), np.float32)])
        params[name] = array
    if sd:
        raise Error(f"'{path}': {len(sd)} tensors that GPT-2 does not have (first: {sorted(sd)[0]}; "
                    f"more layers than config.json's n_layer={L}?)")
    return check_finite(path, cfg, params)


# GPT2Model's settings that change what the model computes, with the value that computes ours (and
# transformers' default). reorder_and_upcast_attn is not among them: it computes the attention scores
# and softmax in fp32 whatever the model's dtype, the same function (ours computes them in fp32 too);
# it changes rounding only in fp16 / bf16 inference, so it is accepted.
HF_MATHS = {
    "scale_attn_weights": (True, "scores scaled by 1/sqrt(head size)"),
    "scale_attn_by_inverse_layer_idx": (False, "no extra 1/(layer index + 1) scaling of the scores"),
    "add_cross_attention": (False, "no cross-attention"),
}
# Activations that are GPT-2's tanh GELU: gelu_fast is the same formula with sqrt(2/pi) to 10 digits.
HF_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def check_hf_maths(hf, config_path, C):
    """Refuses, by name, every config.json setting under which transformers' GPT-2 computes another
    function than ours (layernorm.cuh's epsilon 1e-5, the tanh GELU, an MLP of 4C, plain scaled
    attention): imported, such a model would run and be silently wrong."""
    def refuse(setting, ours):
        raise Error(f"'{config_path}': {setting} changes the model's maths; ours computes {ours}: not imported")

    if hf.get("model_type", "gpt2") != "gpt2":
        refuse(f"model_type {json.dumps(hf['model_type'])}", "GPT-2 (model_type \"gpt2\")")
    for key, (value, ours) in HF_MATHS.items():
        if key in hf and hf[key] is not value:
            refuse(f"{key} {json.dumps(hf[key])}", ours)
    activation = hf.get("activation_function", "gelu_new")
    if activation not in HF_TANH_GELUS:
        refuse(f"activation_function {json.dumps(activation)}", "GPT-2's tanh GELU (gelu_new)")
    n_inner = hf.get("n_inner")
    if n_inner is not None and (isinstance(n_inner, bool) or n_inner != 4 * C):
        refuse(f"n_inner {json.dumps(n_inner)}", f"an MLP of 4 * n_embd = {4 * C}")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if not abs(eps - 1e-5) <= 1e-12:  # written so that NaN fails too
        refuse(f"layer_norm_epsilon {eps}", "LayerNorm with epsilon 1e-5 (layernorm.cuh)")


def json_int(hf, key):
    """config.json's integer `key`; 12.0 passes, 12.5, true and "12" do not (no silent rounding)."""
    value = hf[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{key} {value!r} is not an integer")
    return value


def hf_config(cfg, dtype):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": cfg.V, "n_positions": cfg.maxT, "n_ctx": cfg.maxT, "n_embd": cfg.C,
            "n_layer": cfg.L, "n_head": cfg.NH, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,  # ours trains without dropout
            "bos_token_id": min(EOT, cfg.V - 1), "eos_token_id": min(EOT, cfg.V - 1),
            "tie_word_embeddings": True, "use_cache": True,
            "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype]}


# What export --format hf writes: the weights, the model's config and generation defaults, and for
# GPT-2's vocabulary its tokenizer as Hugging Face's gpt2 repository ships it (vocab.json and
# merges.txt are OpenAI's encoder.json and vocab.bpe, byte for byte). config.json comes last: a
# folder whose export was cut short has none, and no loader takes it for a model.
HF_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
HF_FILES = ("model.safetensors",) + HF_TOKENIZER_FILES + ("generation_config.json", "config.json")


def hf_tokenizer_files(cfg):
    """{file name: bytes} of GPT-2's tokenizer for AutoTokenizer.from_pretrained, or (None, why not)."""
    if cfg.V != 50257:
        return None, f"V={cfg.V} is not GPT-2's vocabulary (50257)"
    sys.path.insert(0, os.path.join(HERE, "data"))
    import gpt2_bpe
    try:
        bpe = gpt2_bpe.local_bpe_files()
    except gpt2_bpe.PrepError as e:
        return None, str(e)
    # decode(encode(text)) == text, as tiktoken's: no clean-up of spaces before punctuation.
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": cfg.maxT, "add_prefix_space": False,
              "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "clean_up_tokenization_spaces": False, "errors": "replace"}
    # The fast tokenizer's one file (the `tokenizers` library's format), as in Hugging Face's gpt2:
    # byte-level BPE over the same vocabulary and merges (vocab.bpe's lines after its version line).
    merges = [line for line in bpe["gpt2/vocab.bpe"].decode("utf-8").split("\n")[1:] if line]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    fast = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": EOT, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": True, "special": True}],
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": dict(byte_level, trim_offsets=False),
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "vocab": json.loads(bpe["gpt2/encoder.json"]), "merges": merges}}
    return {"vocab.json": bpe["gpt2/encoder.json"], "merges.txt": bpe["gpt2/vocab.bpe"],
            "tokenizer.json": (json.dumps(fast, ensure_ascii=False) + "\n").encode(),
            "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode()}, None


def write_hf(cfg, params, folder, dtype, replace=True):
    """model.safetensors (keys as GPT2LMHeadModel.save_pretrained writes them: with "transformer.",
    Conv1D weights (in, out), the tied lm_head.weight left out, wte cut to V rows), the tokenizer files
    where the vocabulary is GPT-2's, generation_config.json and config.json. Returns the names
    written, and why there is no tokenizer (None where there is one)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise Error("export to Hugging Face needs the safetensors package (pip install safetensors)")
    tensors = {}
    for name, _ in param_shapes(cfg):
        array = params[name][:cfg.V] if name == "wte" else params[name]
        per_layer = name in PER_LAYER
        for i in range(cfg.L if per_layer else 1):
            t = torch.from_numpy(np.ascontiguousarray(array[i] if per_layer else array, dtype=np.float32))
            t = t.t() if name in HF_CONV1D else t
            key = "transformer." + HF_KEYS[name].format(i)
            tensors[key] = t.contiguous().to(torch.float32 if dtype == "fp32" else torch.bfloat16)
    target, tmp = os.path.join(folder, "model.safetensors"), None
    try:
        make_folder(os.path.abspath(folder), target)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_model.safetensors")
        os.close(fd)
        save_file(tensors, tmp, metadata={"format": "pt"})
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        publish(tmp, target, replace)
    except Error:
        raise
    except Exception as e:  # OSError, or the library's own error for a full disk
        raise Error(f"cannot write '{target}': {getattr(e, 'strerror', None) or one_line(e)}")
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
    files, no_tokenizer = hf_tokenizer_files(cfg)
    files = dict(files or {})
    for name in HF_TOKENIZER_FILES:  # a replaced export's tokenizer is not this model's
        stale = os.path.join(folder, name)
        if replace and name not in files and os.path.lexists(stale):
            try:
                os.unlink(stale)
            except OSError as e:
                raise Error(f"cannot remove '{stale}' (another model's tokenizer): {e.strerror}")
    eot = min(EOT, cfg.V - 1)
    files["generation_config.json"] = (json.dumps({"bos_token_id": eot, "eos_token_id": eot}, indent=2) + "\n").encode()
    files["config.json"] = (json.dumps(hf_config(cfg, dtype), indent=2) + "\n").encode()
    for name in HF_FILES[1:]:
        if name in files:
            write_atomic(os.path.join(folder, name), [files[name]], replace=replace)
    return ["model.safetensors"] + [name for name in HF_FILES[1:] if name in files], no_tokenizer


SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors format's own limit on its JSON header


def safetensors_layout(head):
    """Do a file's first 9 bytes start a safetensors file: an 8-byte little-endian header length in
    the format's range, then the JSON header's '{'?"""
    return (len(head) >= 9 and head[8:9] == b"{"
            and 2 <= int.from_bytes(head[:8], "little") <= SAFETENSORS_MAX_HEADER)


def read_head(path, n=9):
    """The first n bytes of a regular file."""
    regular_file(path, "model file")
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise Error(f"cannot read '{path}': {e.strerror}")


# A Hugging Face folder's weights, in the order transformers prefers them.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def read_model_params(source):
    """(Config, params) of any model file we read: ours, llm.c's, Hugging Face's (a file or its
    folder). Told apart by content, not by name (llm.c's and PyTorch's are both *.bin)."""
    if os.path.isdir(source):
        for name in HF_WEIGHTS:
            if os.path.lexists(os.path.join(source, name)):
                return read_hf(os.path.join(source, name))
        raise Error(f"folder '{source}' holds no {', '.join(HF_WEIGHTS[:-1])} or {HF_WEIGHTS[-1]}")
    if source.endswith((".safetensors", ".index.json")):  # by name: never handed to the pickle reader
        return read_hf(source)
    head = read_head(source)
    magic = int.from_bytes(head[:4], "little", signed=True) if len(head) >= 4 else None
    if magic == MODEL_FILE_MAGIC:
        return read_checkpoint_params(source)
    if magic == LLMC_MODEL_MAGIC:
        return read_llmc(source)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80" or safetensors_layout(head):  # torch.save: zip or pickle
        return read_hf(source)
    raise Error(f"'{source}' is not a model file we read (ours, llm.c's, a Hugging Face "
                f"model.safetensors / pytorch_model.bin, their sharded index, or their folder)")


def load_model(source, device="cpu"):
    return model_from_params(*read_model_params(source)).to(device)


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


def num_real_params(cfg):
    return num_checkpoint_floats(cfg) - (cfg.Vp - cfg.V) * cfg.C


def cmd_init(args):
    if args.from_hf:
        check_outputs("--out", args.out, [args.out], model_inputs(args.from_hf), args.force)
        cfg, params = read_model_params(args.from_hf)
        write_checkpoint_params(cfg, params, args.out, replace=args.force)
        print(f"wrote {args.out}: {cfg}, {num_real_params(cfg)} parameters")
        return
    model_cfg = parse_model(args.model)
    check_outputs("--out", args.out, [args.out], [], args.force)
    torch.manual_seed(args.seed)
    model = GPT(model_cfg)
    random_init(model, args.seed)
    write_checkpoint(model, args.out, replace=args.force)
    print(f"wrote {args.out}: {model.cfg}, {num_real_params(model.cfg)} parameters")


def cmd_import(args):
    check_outputs("--out", args.out, [args.out], model_inputs(args.source), args.force)
    cfg, params = read_model_params(args.source)
    write_checkpoint_params(cfg, params, args.out, replace=args.force)
    print(f"wrote {args.out}: {cfg}, {num_real_params(cfg)} parameters (from {args.source})")


def cmd_export(args):
    inputs = model_inputs(args.checkpoint)
    if args.format == "hf":
        if os.path.lexists(args.out) and not os.path.isdir(args.out):
            raise Error(f"--out '{args.out}' is a file; --format hf writes a folder ({', '.join(HF_FILES)})")
        outputs = [os.path.join(args.out, name) for name in HF_FILES]
    else:
        outputs = [args.out]
    check_outputs("--out", args.out, outputs, inputs, args.force)
    cfg, params = read_model_params(args.checkpoint)
    if args.format == "hf":
        written, no_tokenizer = write_hf(cfg, params, args.out, args.dtype, replace=args.force)
        if no_tokenizer:
            print(f"warning: no tokenizer files in {args.out}: {no_tokenizer}", file=sys.stderr)
        print(f"wrote {args.out}/: {', '.join(written)} ({args.dtype}): {cfg}")
    else:
        write_llmc(cfg, params, args.out, args.dtype, replace=args.force)
        print(f"wrote {args.out}: llm.c model file version {3 if args.dtype == 'fp32' else 5} "
              f"({args.dtype}): {cfg}")


def cmd_state(args):
    check_outputs("--out", args.out, [args.out], [args.checkpoint] + ([args.tokens] if args.tokens else []),
                  args.force)
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
        if args.clip > 0:  # 0 is off, as adamw.cuh's clip_factor (clip_grad_norm_ would zero the gradient)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.6f}")
    header = file_formats.REFERENCE.pack(B=args.batch, T=args.seq, K=args.steps, L=cfg.L, NH=cfg.NH, C=cfg.C,
                                         maxT=cfg.maxT, V=cfg.V, Vp=cfg.Vp, lr=args.lr, beta1=args.beta1,
                                         beta2=args.beta2, eps=args.eps, weight_decay=args.weight_decay,
                                         clip=args.clip)
    write_atomic(args.out, [header, x.cpu().numpy().astype(np.int32), y.cpu().numpy().astype(np.int32),
                            logits0, np.float32([loss0])] + grads + [np.float32(losses)], replace=args.force)
    print(f"wrote {args.out}: B={args.batch} T={args.seq} K={args.steps} on {device}, loss {loss0:.6f}")


def cmd_loss(args):
    device = pick_device(args.device)
    for path in args.checkpoint:  # one process for many checkpoints: PyTorch starts once
        model = read_checkpoint(path, device)
        x, y = make_batch(model.cfg, args.batch, args.seq, args.seed, args.tokens, args.offset, device)
        with torch.no_grad():
            _, loss = model(x, y)
        print(f"loss {loss.item():.6f}")


# ------------------------------------------------------------------------------------------------
# Evaluation: multiple-choice files in llm.c's eval format (HellaSwag, written by
# data/prepare_hellaswag.py; layout in data/eval_file.py), scored as evaluation.h scores them: the
# model reads each completion's row (context + completion), the fp32 loss of each completion token
# given everything before it is summed in float64 in position order, and the example counts for acc
# where the right completion has the smallest sum, for acc_norm where it has the smallest sum per token.

def read_eval_examples(path, cfg, limit=None):
    """The eval file's examples (the first `limit`), checked as evaluation.h checks them, and those
    taken against the model: every token below its V, every row within its maxT."""
    sys.path.insert(0, os.path.join(HERE, "data"))
    import eval_file
    regular_file(path, "eval file")
    try:
        examples = eval_file.read_eval_file(path)
    except eval_file.EvalFileError as e:
        raise Error(str(e))
    except OSError as e:
        raise Error(f"cannot read eval file '{path}': {e.strerror}")
    examples = examples[:limit]
    largest = max(max(max(c) for c in ex.completions + [ex.context]) for ex in examples)
    if largest >= cfg.V:
        raise Error(f"eval file '{path}' holds token {largest}, the model's V is {cfg.V}"
                    + (": it needs GPT-2's vocabulary (V=50257)" if largest < 50257 else ""))
    longest = max(range(len(examples)), key=lambda i: examples[i].longest_row())
    if examples[longest].longest_row() > cfg.maxT:
        raise Error(f"eval file '{path}': example {longest} has a row of {examples[longest].longest_row()} "
                    f"tokens (context + completion), more than the model's maxT={cfg.maxT}")
    return examples


def row_losses(model, rows, device):
    """Per-position fp32 losses of rows of tokens (lists, any lengths), in one forward pass: row i's
    position t holds the loss of its token t + 1 given tokens 0..t. Rows are padded with token 0 at
    the end, which the causal model's earlier positions never see."""
    T = max(len(r) for r in rows)
    x = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(r)
    x = x.to(device)
    logits, _ = model(x)
    V = logits.shape[-1]
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1), reduction="none")
    return losses.view(len(rows), T - 1).cpu().numpy()


def eval_choice(sums, counts):
    """(acc's choice, acc_norm's choice): the completion with the smallest sum, and with the smallest
    sum per token; ties to the lowest index (evaluation.h's eval_score, comparison for comparison)."""
    best = best_norm = 0
    best_sum = best_mean = 0.0
    for k, (total, count) in enumerate(zip(sums, counts)):
        mean = total / count
        if k == 0 or total < best_sum:
            best, best_sum = k, total
        if k == 0 or mean < best_mean:
            best_norm, best_mean = k, mean
    return best, best_norm


def cmd_eval(args):
    if args.scores is not None:
        check_outputs("--scores", args.scores, [args.scores],
                      [args.hellaswag] + model_inputs(args.checkpoint), args.force)
    device = pick_device(args.device)
    model = load_model(args.checkpoint, device).eval()
    examples = read_eval_examples(args.hellaswag, model.cfg, args.limit)
    rows = [(e, k) for e, ex in enumerate(examples) for k in range(len(ex.completions))]
    # Shortest rows first, so that the rows of a pass have about the same length and little padding.
    rows.sort(key=lambda r: len(examples[r[0]].context) + len(examples[r[0]].completions[r[1]]))
    print(f"eval: {len(examples):,} examples of '{args.hellaswag}' ({len(rows):,} rows of up to "
          f"{max(ex.longest_row() for ex in examples)} tokens), {model.cfg} on {device}, {args.batch} rows a pass")
    sums = [[0.0] * len(ex.completions) for ex in examples]
    start = shown = time.time()
    with torch.no_grad():
        for lo in range(0, len(rows), args.batch):
            chunk = rows[lo:lo + args.batch]
            losses = row_losses(model, [examples[e].context + examples[e].completions[k] for e, k in chunk], device)
            for (e, k), row in zip(chunk, losses):
                first = len(examples[e].context) - 1
                total = 0.0
                for loss in row[first:first + len(examples[e].completions[k])].tolist():
                    total += loss  # float64, in position order, as evaluation.h adds them
                sums[e][k] = total
            if time.time() - shown >= (1.0 if sys.stdout.isatty() else 30.0):
                shown = time.time()
                done = min(lo + args.batch, len(rows))
                print(f"  {done:,} of {len(rows):,} rows, {done / (shown - start):.1f} rows/s", flush=True)
    correct = correct_norm = 0
    lines = ["example\tindex\tlabel\tcompletion\ttokens\tloss_sum\tloss_mean\n"]
    for e, ex in enumerate(examples):
        counts = [len(c) for c in ex.completions]
        best, best_norm = eval_choice(sums[e], counts)
        correct += best == ex.label
        correct_norm += best_norm == ex.label
        for k in range(len(counts)):
            lines.append(f"{e}\t{ex.index}\t{ex.label}\t{k}\t{counts[k]}\t{sums[e][k]!r}\t{sums[e][k] / counts[k]!r}\n")
    n = len(examples)
    print(f"acc {correct / n:.6f} ({correct}/{n})")
    print(f"acc_norm {correct_norm / n:.6f} ({correct_norm}/{n})")
    print(f"{n:,} examples in {time.time() - start:.1f} s")
    if args.scores is not None:
        write_atomic(args.scores, ["".join(lines).encode("utf-8")], replace=args.force)
        print(f"wrote {args.scores}: a line per completion ({len(rows):,})")


def add_eval_parser(sub):
    ev = sub.add_parser("eval", help="score a model on a multiple-choice eval file (HellaSwag), as train_gpt does",
                        description="Scores a model on llm.c's eval file (data/prepare_hellaswag.py writes "
                                    "HellaSwag's) in fp32, TF32 off, as train_gpt scores it: acc and acc_norm.")
    ev.add_argument("--checkpoint", "-e", required=True, metavar="FILE",
                    help="checkpoint (or any file import reads)")
    ev.add_argument("--hellaswag", required=True, metavar="FILE", help="eval file (data/prepare_hellaswag.py)")
    ev.add_argument("--batch", "-B", type=ranged(int, 1, 65536), default=16, metavar="ROWS",
                    help="completion rows per forward pass (default 16); changes nothing but fp32 rounding")
    ev.add_argument("--limit", type=ranged(int, 1, 1 << 30), default=None, metavar="N",
                    help="the first N examples only (default: all)")
    ev.add_argument("--scores", metavar="FILE",
                    help="write a tab-separated line per completion: example, index, label, completion, tokens, "
                         "loss_sum, loss_mean (floats as Python's repr: exact)")
    ev.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")
    force_arg(ev)



# ------------------------------------------------------------------------------------------------
# Generation: the sampler is train_gpt's, step for step, so one seed gives the same tokens on both
# sides (as long as the two sides' logits agree to the last bits that decide).

def gpt2_tokenizer():
    """GPT-2's BPE from the local files (data/gpt2_bpe.py: $GPT_MIRROR/gpt2 or data/mirror/gpt2)."""
    sys.path.insert(0, os.path.join(HERE, "data"))
    try:
        import gpt2_bpe
        return gpt2_bpe.local_encoding()
    except ImportError as e:
        raise Error(f"the GPT-2 tokenizer needs tiktoken ({one_line(e)})")
    except gpt2_bpe.PrepError as e:
        raise Error(str(e))


def sample_next(logits, temperature, top_k, rng, top_p=1.0):
    """The next token from the fp32 logits of the last position over the real vocabulary (V,), as
    train_gpt.cu's sample_token draws it. Temperature 0: argmax (the lowest id on ties). Else in
    float64: s = logits / temperature; with top_k > 0 only the ids whose s >= the top_k-th largest s
    stay (ties included); p = exp(s - max s) over them; top_p < 1 keeps the fewest of those ids, taken
    by p downwards (ties by id upwards), whose p added in that order reach top_p times the sum of p
    (added in id order), the others get p = 0; r = rng.uniform() * sum(p), summed in id order; walking
    the ids upwards, subtracting p[id] from r, the first id where r < 0 (the last id with p > 0 if
    rounding never gets there)."""
    if temperature == 0:
        return int(np.argmax(logits))
    s = logits.astype(np.float64) / temperature
    keep = np.ones(s.size, dtype=bool)
    if 0 < top_k < s.size:
        keep = s >= np.partition(s, s.size - top_k)[s.size - top_k]
    p = np.where(keep, np.exp(s - s.max()), 0.0)  # an excluded id adds 0: the sums are unchanged
    total = np.cumsum(p)[-1]  # cumsum and accumulate add one term at a time, in order
    if top_p < 1.0:
        ids = np.flatnonzero(p > 0)
        order = ids[np.argsort(-p[ids], kind="stable")]
        reached = np.flatnonzero(np.cumsum(p[order]) >= float(np.float32(top_p)) * total)
        if reached.size:
            p[order[reached[0] + 1:]] = 0.0
        total = np.cumsum(p)[-1]
    r = rng.uniform() * total
    below = np.flatnonzero(np.subtract.accumulate(np.concatenate([[r], p]))[1:] < 0)
    return int(below[0]) if below.size else int(np.flatnonzero(p > 0)[-1])


def cmd_generate(args):
    device = pick_device(args.device)
    model = load_model(args.checkpoint, device).eval()
    cfg = model.cfg
    if cfg.V != 50257:
        raise Error(f"'{args.checkpoint}' has V={cfg.V}; generate needs GPT-2's vocabulary (V=50257)")
    enc = gpt2_tokenizer()
    if args.prompt_file is not None:
        if args.prompt:
            raise Error("give the prompt with --prompt or --prompt-file, not both")
        regular_file(args.prompt_file, "prompt file")
        try:
            with open(args.prompt_file, "rb") as f:
                args.prompt = f.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise Error(f"--prompt-file: '{args.prompt_file}' is not valid UTF-8 (at byte {e.start})")
        except OSError as e:
            raise Error(f"--prompt-file: cannot read '{args.prompt_file}': {e.strerror}")
    try:  # argv's bytes that are not UTF-8 arrive as surrogates: refused, as generate_gpt refuses them
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Error(f"--prompt: the prompt is not valid UTF-8 (at character {e.start})")
    context = [EOT] + enc.encode_ordinary(args.prompt)
    rng, new = Rng(args.seed), []
    start = time.time()
    with torch.no_grad():
        for _ in range(args.tokens):
            window = torch.tensor([context[-cfg.maxT:]], device=device)  # the last maxT tokens
            logits, _ = model(window)
            token = sample_next(logits[0, -1].float().cpu().numpy(), args.temperature, args.top_k, rng, args.top_p)
            if args.stop_at_eot and token == EOT:
                break
            context.append(token)
            new.append(token)
    seconds = time.time() - start
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")
    print(args.prompt + enc.decode(new))
    print("---")
    print(f"{len(new)} tokens in {seconds:.2f} s: {len(new) / max(seconds, 1e-9):.1f} tokens/s on {device} "
          f"(temperature {args.temperature:g}, top-k {args.top_k}, top-p {args.top_p:g}, seed {args.seed})")
    print("tokens: " + " ".join(str(t) for t in new))


# ------------------------------------------------------------------------------------------------
# Training as train_gpt.cu's run does it: its DataLoader (dataloader.h), the learning-rate schedule
# (schedule.h), micro-batch loop, gradient-norm clipping and AdamW (adamw.cuh), skipped non-finite
# steps, the outlier guard (outlier_guard.h) and validation.

class TokenStream:
    """Token files concatenated in path order, read where a sequence needs them (memory-mapped)."""

    def __init__(self, parts):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])  # of each file in the stream

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, span):  # stream[a:b], across file boundaries
        a, b = span.start, min(span.stop, len(self))
        out, i = [], int(np.searchsorted(self.starts, a, side="right")) - 1
        while a < b:
            lo, hi = a - self.starts[i], min(b, self.starts[i + 1]) - self.starts[i]
            out.append(self.parts[i][lo:hi])
            a, i = a + hi - lo, i + 1
        return np.concatenate(out) if out else np.zeros(0, np.uint16)


def expand_glob(pattern):
    """The paths of a -i / -j pattern, as fileio.h's expand_glob: a path that exists is itself (a
    folder named `run[1]` holds no glob), else the glob's matches, sorted."""
    return [pattern] if os.path.lexists(pattern) else sorted(glob.glob(pattern))


def read_token_files(pattern, V, flag):
    """The token files of a glob pattern, sorted by path, as one stream."""
    paths = expand_glob(pattern)
    if not paths:
        raise Error(f"{flag} '{pattern}': no such file")
    parts = []
    for path in paths:
        n = token_count(path)
        tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4, shape=(n,))
        top = max(int(tokens[i:i + (1 << 24)].max()) for i in range(0, n, 1 << 24))
        if top >= V:
            raise Error(f"token file '{path}' holds token {top} >= the model's V={V}")
        parts.append(tokens)
    return TokenStream(parts), paths


class DataLoader:
    """Sequence j = tokens [j*T, j*T + T + 1): inputs its first T, targets shifted by one. An epoch
    has (tokens - 1) // T of them and visits them in order, or with shuffling in a Fisher-Yates
    permutation drawn from Rng(seed * GOLDEN + epoch); the next epoch follows without a gap. A step
    takes the next d/T sequences, so which ones does not depend on B (dataloader.h)."""

    def __init__(self, tokens, T, shuffle, seed, what, min_sequences=1):
        need = min_sequences * T + 1
        if len(tokens) < need:
            raise Error(f"{what} has {len(tokens)} tokens, fewer than the {need} that a step's {min_sequences} "
                        f"sequences of T+1 = {T + 1} tokens span (use a smaller -t or -d; -d defaults to B*T)")
        self.tokens, self.T, self.shuffle, self.seed = tokens, T, shuffle, seed
        self.sequences = (len(tokens) - 1) // T
        self.seek(0, 0)

    def seek(self, epoch, cursor):
        self.epoch, self.cursor = epoch, cursor
        self.order = None  # in order: sequence i is the epoch's i-th
        if self.shuffle:
            self.order = list(range(self.sequences))
            rng = Rng(self.seed * GOLDEN + epoch)
            for i in range(self.sequences - 1, 0, -1):
                j = rng.next() % (i + 1)
                self.order[i], self.order[j] = self.order[j], self.order[i]

    def next(self, rows):
        """The next `rows` sequences as (rows, T) inputs and targets."""
        picked = []
        for _ in range(rows):
            if self.cursor >= self.sequences:
                self.seek(self.epoch + 1, 0)
            picked.append(self.order[self.cursor] if self.order else self.cursor)
            self.cursor += 1
        T = self.T
        batch = torch.from_numpy(np.stack([self.tokens[j * T:j * T + T + 1] for j in picked]).astype(np.int64))
        return batch[:, :-1], batch[:, 1:]


def learning_rate(a, step):
    """schedule.h's LearningRateSchedule::at (step from 0), in float32 as it computes it: a linear
    warm-up to -l over -u steps, then -k's schedule down to -l * -q at step -x (wsd: constant until
    the last -wd of the steps)."""
    f = np.float32
    if step < a.u:
        return f(a.l) * f(step + 1) / f(a.u)
    peak, min_lr = f(a.l), f(a.l) * f(a.q)
    if a.k == "constant":
        return peak
    if a.k == "wsd":
        v = f(a.wd) * f(a.x)  # std::lround: half away from zero
        decay_start = max(a.u, a.x - int(math.floor(abs(float(v)) + 0.5)) * (1 if v >= 0 else -1))
        if step < decay_start:
            return peak
        progress = min(f(1.0), f(step - decay_start) / f(max(1, a.x - decay_start)))
        return min_lr + (f(1.0) - np.sqrt(progress)) * (peak - min_lr)
    span = f(max(1, a.x - a.u))
    progress = min(f(1.0), f(step - a.u) / span)
    if a.k == "linear":
        return peak - progress * (peak - min_lr)
    return min_lr + f(0.5) * (peak - min_lr) * (f(1.0) + np.cos(f(3.14159265358979) * progress))


def clip_factor(norm_squared, clip):
    """adamw.cuh's clip_factor: PyTorch's clip_grad_norm_ factor min(1, clip / (norm + 1e-6)), in
    float32; clip <= 0 is off."""
    if clip <= 0:
        return np.float32(1.0)
    return min(np.float32(1.0), np.float32(clip) / (np.sqrt(np.float32(norm_squared)) + np.float32(1e-6)))


def adamw_update(params, lr, t, weight_decay, factor):
    """adamw.cuh's update of (param, m, v, decayed) with gradient grad * factor, t from 1."""
    beta1, beta2, eps = np.float32(0.9), np.float32(0.95), np.float32(1e-8)
    c1 = float(np.float32(1.0) - np.power(beta1, np.float32(t)))  # 1 - beta^t, in float as gpt_update
    c2 = float(np.float32(1.0) - np.power(beta2, np.float32(t)))
    lr, wd, factor = float(lr), float(np.float32(weight_decay)), float(factor)
    b1, b2, eps = float(beta1), float(beta2), float(eps)
    with torch.no_grad():
        for p, m, v, decayed in params:
            g = p.grad * factor
            m.copy_(b1 * m + (1 - b1) * g)
            v.copy_(b2 * v + (1 - b2) * g * g)
            if decayed:
                p.sub_(lr * wd * p)
            p.sub_(lr * (m / c1) / (torch.sqrt(v / c2) + eps))


def _exact_fma(a, b, c):
    """a * b + c rounded once (exact rational arithmetic, then one correctly rounded division)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


fma = getattr(math, "fma", _exact_fma)  # C's fma; math has it from Python 3.13


class OutlierWindow:
    """outlier_guard.h's OutlierWindow, operation for operation: a ring of the last 128 finite values
    (count held, next slot, the slots) and the z of each new value over the full window it joins."""

    def __init__(self):
        self.count, self.next, self.values = 0, 0, [0.0] * file_formats.OUTLIER_WINDOW

    def push(self, x):
        """Adds x and returns its z: nan while the window fills, and for a non-finite x (not added)."""
        n = file_formats.OUTLIER_WINDOW
        if not math.isfinite(x):
            return math.nan
        full = self.count == n
        self.values[self.next] = x
        self.next = (self.next + 1) % n
        if not full:
            self.count += 1
            return math.nan
        total = 0.0
        for v in self.values:  # slot order, one rounding an addition (not sum(): compensated from 3.12)
            total += v
        mean = total / n
        squares = 0.0
        for v in self.values:
            squares = fma(v - mean, v - mean, squares)
        std = math.sqrt(squares / n)
        return (x - mean) / std if std > 0 else 0.0


class OutlierGuard:
    """outlier_guard.h's OutlierGuard: -sl and -sg (0 = off) and a window each for the step's mean loss
    and its gradient norm, which take every step's finite values whether or not the update is skipped."""

    def __init__(self, loss_limit, norm_limit):
        self.limits = (loss_limit, norm_limit)
        self.windows = (OutlierWindow(), OutlierWindow())

    def observe(self, loss, norm):
        """The step's (loss z, norm z, loss skips, norm skips); z nan: none."""
        z = tuple(w.push(float(x)) for w, x in zip(self.windows, (loss, norm)))
        return z + tuple(limit > 0 and zi > limit for limit, zi in zip(self.limits, z))

    def reasons(self, verdict):
        """Why the update was skipped ("" if it was not), as train_gpt's step line says it."""
        return ", ".join(f"{name} z {z:.3f} > {limit:g}" for name, z, skip, limit in
                         zip(("loss", "norm"), verdict[:2], verdict[2:], self.limits) if skip)


def validation_beside(train):
    """train_gpt's validation data beside -i's: "val" for the last "train" of the file name ("" if none)."""
    name = train.rfind("/") + 1
    at = train.rfind("train")
    return "" if at < name else train[:at] + "val" + train[at + 5:]


def cmd_train(a):
    if a.i is not None and not expand_glob(a.i):  # -i first, as train_gpt, before the -j it implies
        raise Error(f"-i {a.i}: no file matches")
    if a.v > 0 and a.j is None and a.i is not None:  # as train_gpt: the validation data beside -i's
        a.j = validation_beside(a.i)
        found = expand_glob(a.j) if a.j else []
        if not found:
            looked = f" (looked for '{a.j}')" if a.j else ""
            raise Error(f"-i {a.i}: no validation data beside it{looked}: give -j, or -v 0 to train without validation")
    a.i = a.i or "data/tinyshakespeare/tiny_shakespeare_train.bin"
    a.j = a.j or "data/tinyshakespeare/tiny_shakespeare_val.bin"
    if a.o:  # before any work; the open below ("x") still refuses one that appears meanwhile
        if os.path.exists(a.o) and not os.path.isdir(a.o):
            raise Error(f"-o {a.o}: not a folder")
        if os.path.lexists(os.path.join(a.o, "metrics.csv")):
            raise Error(f"-o {a.o}: '{os.path.join(a.o, 'metrics.csv')}' already exists (another run's): remove it "
                        f"or give another -o")
        held = sorted(glob.glob(os.path.join(glob.escape(a.o), "model_*.bin")))
        if held:  # as train_gpt: a run folder's checkpoints are never written over
            raise Error(f"-o {a.o}: the folder already holds checkpoints (newest: {os.path.basename(held[-1])}): "
                        f"give another -o")
    device = pick_device(a.device)
    if a.e in GPT2_DESCRIPTORS:
        cfg = parse_model(a.e)
        model = model_from_params(cfg, cuda_random_init(cfg, a.sd)).to(device)
    else:
        model = load_model(a.e, device)
        cfg = model.cfg
    if a.t > cfg.maxT:
        raise Error(f"-t {a.t} is larger than the model's maximum sequence length {cfg.maxT}")
    total_batch = a.d or a.b * a.t
    if total_batch % (a.b * a.t):
        raise Error(f"-d {a.d}: the total batch size must be a multiple of B*T = {a.b * a.t}")
    accum = total_batch // (a.b * a.t)
    train_tokens, train_paths = read_token_files(a.i, cfg.V, "-i")
    train = DataLoader(train_tokens, a.t, a.sh == 1, a.sd, f"-i '{a.i}'", total_batch // a.t)
    val, val_sequences = None, 0
    if a.v > 0:  # -v 0 never validates: the files are not needed
        val_tokens, _ = read_token_files(a.j, cfg.V, "-j")
        if len(val_tokens) < a.t + 1:
            raise Error(f"validation data '{a.j}' has {len(val_tokens)} tokens, fewer than T+1 = {a.t + 1} "
                        f"(use a smaller -t, or -v 0)")
        val = DataLoader(val_tokens, a.t, False, 0, f"-j '{a.j}'")
        val_sequences = min(a.m * (total_batch // a.t), val.sequences)  # the first ones; all if fewer
    if a.s:
        print("note: -s is accepted for train_gpt's command lines; the reference draws no samples "
              "(gpt_reference.py generate does)")
    print(f"reference: PyTorch {torch.__version__} on {device}, fp32 (TF32 off) | model {cfg}, "
          f"{num_real_params(cfg)} parameters")
    print(f"batch: B={a.b} T={a.t}, total {total_batch} tokens per step ({accum} micro-steps) | train "
          f"{len(train_tokens)} tokens ({train.sequences} sequences, {len(train_paths)} file"
          f"{'s' * (len(train_paths) != 1)}), val {len(val.tokens) if val else 0} tokens ({val_sequences} sequences)")
    params = []  # (parameter, AdamW m, AdamW v, decayed)
    for name, tensors in checkpoint_tensors(model):
        params += [(t, torch.zeros_like(t), torch.zeros_like(t), name in DECAYED) for t in tensors]
    metrics = None
    if a.o:
        os.makedirs(a.o, exist_ok=True)
        path = os.path.join(a.o, "metrics.csv")
        try:  # "x": another run's rows are never overwritten (and a FIFO there is never opened)
            metrics = open(path, "x")
        except FileExistsError:
            raise Error(f"-o {a.o}: '{path}' already exists (another run's): remove it or give another -o")
        metrics.write("step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s\n")
        metrics.flush()
    last_val, train_loss, bad_steps = float("nan"), float("nan"), 0
    guard = OutlierGuard(a.sl, a.sg)

    def validate(step):
        """The mean of the first val_sequences sequences' mean losses, in batches of up to B as train_gpt."""
        nonlocal last_val
        val.seek(0, 0)
        total = 0.0
        with torch.no_grad():
            for first in range(0, val_sequences, a.b):
                rows = min(a.b, val_sequences - first)
                x, y = val.next(rows)
                total += float(np.float32(model(x.to(device), y.to(device))[1].item())) * rows
        last_val = np.float32(total / val_sequences)
        print(f"step {step:5d} | val loss {last_val:.6f}")
        if metrics:
            metrics.write(f"{step},,{last_val:.6f},,,,\n")
            metrics.flush()

    try:
        start = time.time()
        for step in range(a.x):
            if a.v > 0 and step % a.v == 0:
                validate(step)
            t0 = time.time()
            for p, _, _, _ in params:
                p.grad = None
            loss_sum = 0.0  # the micro-batches' mean losses, each rounded to float, summed in double
            for _ in range(accum):
                x, y = train.next(a.b)
                _, loss = model(x.to(device), y.to(device))
                (loss / accum).backward()  # the gradient of the step's mean loss
                loss_sum += float(np.float32(loss.item()))
            norm_squared = np.float32(sum(float((p.grad.double() ** 2).sum()) for p, _, _, _ in params))
            lr = learning_rate(a, step)
            train_loss, norm = np.float32(loss_sum / accum), np.sqrt(norm_squared)
            skipped = guard.reasons(guard.observe(train_loss, norm))
            if math.isfinite(loss_sum) and math.isfinite(norm_squared):
                if not skipped:  # an outlier's update is skipped; AdamW's t stays the step number all the same
                    adamw_update(params, lr, step + 1, a.c, clip_factor(norm_squared, a.gc))
                bad_steps = 0
            else:  # as train_gpt: no update at all, and three in a row stop the run
                bad_steps += 1
                print(f"warning: step {step + 1}: non-finite {'grad norm' if math.isfinite(loss_sum) else 'loss'}, "
                      f"update skipped", file=sys.stderr)
                if bad_steps >= 3:
                    raise Error(f"stopping at step {step + 1}: {bad_steps} steps in a row had a non-finite loss "
                                f"or gradient norm")
            if device == "cuda":
                torch.cuda.synchronize()
            ms = (time.time() - t0) * 1e3
            print(f"step {step + 1:5d}/{a.x} | loss {train_loss:.6f} | norm {norm:.4f} | lr {lr:.2e} | "
                  f"{ms:.1f} ms | {total_batch / (ms * 1e-3):.0f} tok/s{' | skipped: ' + skipped if skipped else ''}")
            if metrics:
                tok_s = total_batch / (ms * 1e-3)
                metrics.write(f"{step + 1},{train_loss:.6f},,{lr:.6e},{norm:.6f},{ms:.3f},{tok_s:.1f}\n")
                metrics.flush()
        if a.v > 0:
            validate(a.x)
        if a.o:
            path = os.path.join(a.o, f"model_{a.x:08d}.bin")
            write_checkpoint(model, path, replace=False)
            print(f"checkpoint: wrote {path}")
        print(f"done: {a.x} steps in {time.time() - start:.1f} s | final train loss {train_loss:.6f} | "
              f"val loss {last_val:.6f}")
    finally:  # a stopped run keeps the rows it wrote, as train_gpt's metrics.csv does
        if metrics:
            metrics.close()


# ------------------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit code 1, as every other bad input
        raise Error(f"{message} (-h for usage)")


def ranged(kind, lo, hi, below_hi=False):
    """An argparse type: `kind` in [lo, hi], or [lo, hi) with below_hi."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got '{text}'")
        if not (lo <= value <= hi) or (below_hi and value == hi):  # also rejects nan
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}{')' if below_hi else ']'}, got {text}")
        return value
    return parse


SEED = ranged(int, 0, 2**64 - 1)  # what torch.manual_seed and splitmix64 take


def force_arg(q):
    q.add_argument("--force", action="store_true",
                   help="replace an output that exists (an output that is an input is refused all the same)")


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="Each subcommand has -h. Formats and details: the top of gpt_reference.py.")
    sub = p.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init", help="write a checkpoint (random init or local GPT-2 weights)")
    init.add_argument("--model", default="d12", help="d6|d12|d24|d36|d48 or L=..,NH=..,C=..,V=..,maxT=.. (default d12)")
    init.add_argument("--seed", type=SEED, default=1337, help="init seed (default 1337)")
    init.add_argument("--from-hf", metavar="SOURCE", help="same as `import SOURCE` (any file import reads)")
    init.add_argument("--out", required=True, help="checkpoint to write")
    force_arg(init)

    def batch_args(q, many=False):
        if many:
            q.add_argument("--checkpoint", required=True, nargs="+", help="checkpoints to score, each on the same batch")
        else:
            q.add_argument("--checkpoint", required=True, help="checkpoint to load")
        # B and T as train_gpt's -b and -t (T is also at most the model's maxT).
        q.add_argument("--batch", "-B", type=ranged(int, 1, 4096), default=4, help="batch size B (default 4)")
        q.add_argument("--seq", "-T", type=ranged(int, 1, 65536), default=64, help="sequence length T (default 64)")
        q.add_argument("--seed", type=SEED, default=42, help="seed of the random batch (default 42)")
        q.add_argument("--tokens", metavar="FILE", help="take the batch from this token file instead")
        q.add_argument("--offset", type=ranged(int, 0, 1 << 62), default=0,
                       help="first token of the batch in --tokens (default 0)")
        q.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")

    state = sub.add_parser("state", help="write a reference-state file for test_gpt")
    batch_args(state)
    state.add_argument("--steps", "-K", type=ranged(int, 1, 1 << 20), default=10, help="AdamW steps (default 10)")
    state.add_argument("--lr", type=ranged(float, 0.0, 10.0), default=1e-4, help="learning rate (default 1e-4)")
    state.add_argument("--beta1", type=ranged(float, 0.0, 1.0, below_hi=True), default=0.9)
    state.add_argument("--beta2", type=ranged(float, 0.0, 1.0, below_hi=True), default=0.95)
    # eps > 0: with 0, a parameter whose gradient is 0 (wte's padding rows) becomes 0/0 = NaN.
    state.add_argument("--eps", type=ranged(float, 1e-30, 1.0), default=1e-8)
    state.add_argument("--weight-decay", type=ranged(float, 0.0, 10.0), default=0.1,
                       help="on 2-D tensors (default 0.1)")
    state.add_argument("--clip", type=ranged(float, 0.0, 1e6), default=1.0,
                       help="global gradient-norm clip, 0 = off (default 1.0)")
    state.add_argument("--out", required=True, help="reference-state file to write")
    force_arg(state)

    loss = sub.add_parser("loss", help="print checkpoints' losses on one batch, a line `loss X` each, in order")
    batch_args(loss, many=True)

    imp = sub.add_parser("import", help="our checkpoint from Hugging Face GPT-2 files or an llm.c model file")
    imp.add_argument("source", metavar="SOURCE",
                     help="model.safetensors, pytorch_model.bin, a *.index.json of shards, their folder, "
                          "or an llm.c model file")
    imp.add_argument("--out", required=True, metavar="FILE", help="checkpoint to write")
    force_arg(imp)

    exp = sub.add_parser("export", help="a checkpoint to a Hugging Face folder or an llm.c model file")
    exp.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint (or any file import reads)")
    exp.add_argument("--out", required=True, metavar="PATH", help="folder (hf) or file (llmc) to write")
    exp.add_argument("--format", default="hf", choices=["hf", "llmc"],
                     help="hf: a folder of model.safetensors, config.json and the tokenizer's files; "
                          "llmc: llm.c model file (default hf)")
    exp.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                     help="parameter type; llmc: fp32 = version 3, bf16 = version 5 (default fp32)")
    force_arg(exp)

    gen = sub.add_parser("generate", help="sample text from a model")
    gen.add_argument("--checkpoint", "-e", required=True, metavar="FILE", help="checkpoint (or any file import reads)")
    gen.add_argument("--prompt", default="", metavar="TEXT",
                     help="text after <|endoftext|> to continue (default: none)")
    gen.add_argument("--tokens", "-n", type=ranged(int, 1, 1 << 20), default=64, metavar="N",
                     help="tokens to generate (default 64)")
    gen.add_argument("--temperature", type=ranged(float, 0.0, 1e6), default=1.0, metavar="T",
                     help="softmax temperature; 0 = greedy (default 1.0)")
    gen.add_argument("--top-k", type=ranged(int, 0, 1 << 30), default=0, metavar="K",
                     help="sample among the K most likely tokens; 0 = all (default 0)")
    gen.add_argument("--top-p", type=ranged(float, 1e-9, 1.0), default=1.0, metavar="P",
                     help="nucleus: the most likely tokens whose probabilities reach P; 1 = all (default 1)")
    gen.add_argument("--prompt-file", default=None, metavar="FILE", help="the prompt read from a UTF-8 file")
    gen.add_argument("--stop-at-eot", type=ranged(int, 0, 1), default=0, metavar="0|1",
                     help="1 = stop at <|endoftext|>, which is not printed (default 0)")
    gen.add_argument("--seed", type=SEED, default=1337, metavar="S",
                     help="sampler seed (default 1337)")
    gen.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")

    tr = sub.add_parser("train", allow_abbrev=False, help="train as train_gpt does (same flags), in fp32",
                        description="Trains the reference exactly as train_gpt does; the flags are train_gpt's.")
    tr.add_argument("-e", default="d12", metavar="MODEL",
                    help="checkpoint (or any file import reads), or d6|d12|d24|d36|d48 for train_gpt's own "
                         "random init from -sd (default d12)")
    tr.add_argument("-i", default=None, metavar="GLOB",
                    help="training token files: a glob, files sorted by path and concatenated (default: Tiny "
                         "Shakespeare's)")
    tr.add_argument("-j", default=None, metavar="GLOB",
                    help="validation token files, likewise (default: beside -i's, 'val' for the last 'train' of "
                         "its file name; without -i Tiny Shakespeare's)")
    tr.add_argument("-b", type=ranged(int, 1, 4096), default=16, metavar="B", help="micro-batch size (default 16)")
    tr.add_argument("-t", type=ranged(int, 1, 65536), default=1024, metavar="T", help="sequence length (default 1024)")
    tr.add_argument("-d", type=ranged(int, 1, 1 << 30), default=0, metavar="TOKENS",
                    help="total batch size in tokens, a multiple of B*T (default B*T)")
    tr.add_argument("-x", type=ranged(int, 1, 99999999), default=100, metavar="STEPS",
                    help="optimizer steps (default 100)")
    tr.add_argument("-l", type=ranged(float, 0.0, 10.0), default=6e-4, metavar="LR",
                    help="peak learning rate (default 6e-4)")
    tr.add_argument("-u", type=ranged(int, 0, 1 << 30), default=10, metavar="STEPS", help="warm-up steps (default 10)")
    tr.add_argument("-q", type=ranged(float, 0.0, 1.0), default=0.1, metavar="FRAC",
                    help="final learning rate as a fraction of -l (default 0.1)")
    tr.add_argument("-k", default="cosine", choices=["cosine", "linear", "constant", "wsd"],
                    help="schedule after the warm-up, as train_gpt's -k (default cosine)")
    tr.add_argument("-wd", type=ranged(float, 0.0, 1.0), default=0.2, metavar="FRAC",
                    help="wsd: the fraction of the steps that decays (default 0.2)")
    tr.add_argument("-c", type=ranged(float, 0.0, 10.0), default=0.1, metavar="WD", help="weight decay (default 0.1)")
    tr.add_argument("-gc", type=ranged(float, 0.0, 1e6), default=1.0, metavar="CLIP",
                    help="global gradient-norm clip, 0 = off (default 1.0)")
    tr.add_argument("-sl", type=ranged(float, 0.0, 1e6), default=0.0, metavar="Z",
                    help="skip the update of a step whose loss is more than Z standard deviations above the "
                         "mean of the last 128 steps' losses, its own included (from step 129), 0 = off "
                         "(default 0)")
    tr.add_argument("-sg", type=ranged(float, 0.0, 1e6), default=0.0, metavar="Z",
                    help="the same for the global gradient norm, 0 = off (default 0)")
    tr.add_argument("-v", type=ranged(int, 0, 1 << 30), default=20, metavar="N",
                    help="validation loss every N steps and at the end, 0 = never (default 20)")
    tr.add_argument("-m", type=ranged(int, 1, 1 << 20), default=20, metavar="N",
                    help="validation batches of -d tokens: the mean loss of the first N*d/T sequences of -j, or all it "
                         "holds (default 20)")
    tr.add_argument("-sd", type=ranged(int, 0, 1 << 62), default=1337, metavar="SEED",
                    help="seed of shuffling and of a -e d12-style init (default 1337)")
    tr.add_argument("-sh", type=ranged(int, 0, 1), default=1, metavar="0|1",
                    help="shuffle the sequences each epoch (default 1)")
    tr.add_argument("-s", type=ranged(int, 0, 1 << 30), default=0, metavar="N",
                    help="accepted for train_gpt's command lines; no samples are drawn")
    tr.add_argument("-o", metavar="DIR", help="write DIR/metrics.csv (not over an existing one) and, at the end, "
                                              "DIR/model_<steps>.bin")
    tr.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")

    add_eval_parser(sub)
    args = p.parse_args(argv)
    command = {"init": cmd_init, "state": cmd_state, "loss": cmd_loss, "import": cmd_import, "export": cmd_export,
               "generate": cmd_generate, "train": cmd_train, "eval": cmd_eval}[args.command]
    try:
        command(args)
    except (MemoryError, RuntimeError) as e:
        # A model or batch too large for this machine: PyTorch's allocators raise these (CPU and CUDA).
        if not isinstance(e, MemoryError) and not any(s in str(e) for s in ("out of memory", "allocate")):
            raise
        raise Error(f"{args.command}: out of memory ({one_line(e)}): use a smaller model or batch")


def error_line(e):
    """The one line an Error or an OSError ends the program with. An OSError says what failed on
    which path, without Python's `[Errno N]` and without a temporary file's name (its folder instead)."""
    if not isinstance(e, OSError):
        return f"error: {e}"
    name = e.filename
    if name is not None and os.path.basename(str(name)).startswith(".tmp_"):
        name = os.path.dirname(str(name)) or "."
    return f"error: {e.strerror or one_line(e)}" + (f": '{name}'" if name is not None else "")


if __name__ == "__main__":
    try:
        main()
    except (Error, OSError) as e:
        print(error_line(e), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: temporary files are removed on the way out, metrics.csv keeps its rows
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
