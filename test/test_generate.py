"""gpt_reference.py generate: the sampler the CUDA side uses, against implementations written here.

CPU only, a few seconds, on a small model with GPT-2's vocabulary (maxT = 16, so generation slides
its window past maxT). Checks: splitmix64 against its published values; greedy decoding against an
argmax loop written here (with tiktoken's own GPT-2 loader for the prompt); top-k 1 == greedy;
sampled tokens against a plain-Python transcription of the algorithm (temperature, top-k with ties,
the walk over ids); one seed reproduces, two seeds differ; a model read from a Hugging Face folder
or an llm.c file generates the same; bad arguments and a model with a non-finite parameter (as
generate_gpt refuses it) fail in one line. Ends with
`N passed, N failed, N skipped`.
"""

import math
import os
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import MIRROR, check, finish, one_line_error, ref_cli, ref_process  # noqa: E402

import torch  # noqa: E402
import gpt_reference as ref  # noqa: E402

EOT, V = 50256, 50257
PROMPT = "Il était une fois, in a land far away"


class SplitMix64:
    """Written here from the definition (not gpt_reference's Rng)."""

    def __init__(self, seed):
        self.s = seed % 2**64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) % 2**64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) / 2.0**53


def sample_here(logits, temperature, top_k, rng):
    """The algorithm as specified, one id at a time in plain Python."""
    s = [float(x) / temperature for x in logits]
    kept = list(range(len(s)))
    if top_k > 0:
        kth = sorted(s, reverse=True)[min(top_k, len(s)) - 1]
        kept = [i for i in kept if s[i] >= kth]
    top = max(s[i] for i in kept)
    p = {i: math.exp(s[i] - top) for i in kept}
    total = 0.0
    for i in kept:
        total += p[i]
    r = rng.uniform() * total
    for i in kept:
        r -= p[i]
        if r < 0:
            return i
    return kept[-1]


def tokens_of(out):
    lines = [ln for ln in out.splitlines() if ln.startswith("tokens: ")]
    return [int(t) for t in lines[-1].split()[1:]] if lines else None


def main():
    if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
        check(f"GPT-2 BPE files at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    os.environ["GPT_MIRROR"] = MIRROR
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    enc = tiktoken.Encoding(name="gpt2-ref", pat_str=r50k_pat_str, special_tokens={"<|endoftext|>": EOT},
                            mergeable_ranks=data_gym_to_mergeable_bpe_ranks(
                                os.path.join(MIRROR, "gpt2", "vocab.bpe"), os.path.join(MIRROR, "gpt2", "encoder.json")))
    holder = tempfile.TemporaryDirectory(prefix="test_generate.")
    tmp = holder.name
    ckpt = os.path.join(tmp, "small.ckpt")
    # A small random model with its embeddings scaled up (token std 0.2, position std 2): logits of
    # std ~1 that depend on the context, so greedy and sampled tokens vary from step to step.
    cfg = ref.Config(L=2, NH=2, C=32, maxT=16, V=V)
    model = ref.GPT(cfg)
    ref.random_init(model, 5)
    params = ref.model_params(model)
    params["wte"][:V] *= 10.0
    params["wpe"] *= 100.0
    ref.write_checkpoint_params(cfg, params, ckpt)
    model = ref.read_checkpoint(ckpt).eval()

    def logits_of(context):
        with torch.no_grad():
            return model(torch.tensor([context[-cfg.maxT:]]))[0][0, -1].numpy()

    def generate(*args):
        rc, out, err = ref_cli(["generate", "-e", ckpt, "--prompt", PROMPT, "--device", "cpu"] + list(args))
        return rc, out, err, tokens_of(out)

    print("splitmix64")
    r = ref.Rng(0)
    got = [r.next() for _ in range(3)]
    check("Rng(0): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f (published)",
          got == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F], " ".join(f"{x:016x}" for x in got))
    mine, theirs = SplitMix64(2**64 - 3), ref.Rng(2**64 - 3)
    same = all(mine.uniform() == theirs.uniform() for _ in range(1000))
    block = ref.splitmix64_block(99, 5, 100)
    rng = ref.Rng(99)
    seq = [rng.next() for _ in range(105)][5:]
    check("uniform() == (next() >> 11) * 2^-53; the vectorized block == next()",
          same and [int(x) for x in block] == seq, "1000 + 100 draws")

    print(f"greedy decoding (maxT = {cfg.maxT}; the prompt is {len(enc.encode_ordinary(PROMPT))} tokens)")
    n = 30
    context = [EOT] + enc.encode_ordinary(PROMPT)
    greedy = []
    for _ in range(n):
        greedy.append(int(np.argmax(logits_of(context))))
        context.append(greedy[-1])
    rc, out, err, got = generate("-n", str(n), "--temperature", "0")
    check(f"--temperature 0, {n} tokens (past maxT) == argmax loop over the last maxT tokens", got == greedy,
          f"{len(set(greedy))} distinct ids; {err.strip()[:60]}")
    text = out.split("\n---\n")[0] if rc == 0 else ""
    check("prints the prompt and the decoded continuation", text == PROMPT + enc.decode(greedy))
    speed = [ln for ln in out.splitlines() if "tokens/s" in ln]
    check("prints the speed (tokens/s)", bool(speed), speed[0] if speed else "")
    rc, out, err, got = generate("-n", str(n), "--top-k", "1")
    check("--top-k 1 (temperature 1) == greedy", got == greedy)

    print("sampling")
    for temperature, top_k, seed in ((1.0, 0, 7), (0.8, 40, 1), (1.7, 3, 2**63 + 5)):
        rng, context, want = SplitMix64(seed), [EOT] + enc.encode_ordinary(PROMPT), []
        for _ in range(20):
            want.append(sample_here(logits_of(context), temperature, top_k, rng))
            context.append(want[-1])
        rc, out, err, got = generate("-n", "20", "--temperature", str(temperature), "--top-k", str(top_k),
                                     "--seed", str(seed))
        check(f"temperature {temperature}, top-k {top_k}, seed {seed}: == the algorithm written here", got == want,
              f"{len(set(want))} distinct ids")
    logits = np.array([1.0, 3.0, 3.0, 2.0, 3.0, -1.0], dtype=np.float32)
    picks = {ref.sample_next(logits, 1.0, 2, ref.Rng(s)) for s in range(200)}
    check("top-k 2 with a three-way tie at the top keeps all three tied ids", picks == {1, 2, 4}, f"picked {sorted(picks)}")
    check("temperature 0 takes the lowest id of a tie", ref.sample_next(logits, 0.0, 0, ref.Rng(0)) == 1)
    a = generate("-n", "24", "--seed", "11")[3]
    b = generate("-n", "24", "--seed", "11")[3]
    c = generate("-n", "24", "--seed", "12")[3]
    check("the same seed twice: the same tokens", a is not None and a == b)
    check("another seed: other tokens", a is not None and c is not None and a != c, f"{sum(x != y for x, y in zip(a or [], c or []))} of 24 differ")

    print("other model files")
    ref_cli(["export", ckpt, "--out", os.path.join(tmp, "hf")])
    ref_cli(["export", ckpt, "--out", os.path.join(tmp, "m.llmc"), "--format", "llmc"])
    for what, path in (("a Hugging Face folder", os.path.join(tmp, "hf")), ("an llm.c model file", os.path.join(tmp, "m.llmc"))):
        rc, out, err = ref_cli(["generate", "-e", path, "--prompt", PROMPT, "-n", "12", "--seed", "3", "--device", "cpu"])
        check(f"-e {what}: the same tokens as the checkpoint", rc == 0 and tokens_of(out) == generate("-n", "12", "--seed", "3")[3],
              err.strip()[:60])

    print("bad arguments: one `error:` line, exit code 1")
    odd = os.path.join(tmp, "odd.ckpt")
    ref_cli(["init", "--model", "L=1,NH=1,C=8,V=300,maxT=8", "--out", odd])
    broken = {k: v.copy() for k, v in params.items()}
    broken["lnfb"][5] = np.nan
    ref.write_checkpoint_params(cfg, broken, os.path.join(tmp, "nan.ckpt"))
    ref.write_llmc(cfg, broken, os.path.join(tmp, "nan.llmc"), "fp32")
    for what, args, mention in (
            ("--temperature -1", ["-e", ckpt, "--temperature", "-1"], "--temperature"),
            ("--temperature nan", ["-e", ckpt, "--temperature", "nan"], "--temperature"),
            ("--top-k -2", ["-e", ckpt, "--top-k", "-2"], "--top-k"),
            ("-n 0", ["-e", ckpt, "-n", "0"], "--tokens"),
            ("--seed x", ["-e", ckpt, "--seed", "x"], "--seed"),
            ("a model without GPT-2's vocabulary", ["-e", odd], "V=300"),
            ("a checkpoint holding NaN", ["-e", os.path.join(tmp, "nan.ckpt")], "non-finite parameter: nan in lnfb"),
            ("an llm.c file holding NaN", ["-e", os.path.join(tmp, "nan.llmc")], "non-finite parameter: nan in lnfb"),
            ("a missing checkpoint", ["-e", os.path.join(tmp, "none.ckpt")], "none.ckpt"),
            ("no -e", [], "--checkpoint")):
        rc, _, err = ref_cli(["generate"] + args)
        ok, line = one_line_error(rc, err, mention)
        check(what, ok, line)
    rc, out, err = ref_process(["generate", "-e", odd], env={"GPT_MIRROR": MIRROR})
    ok, line = one_line_error(rc, err, "V=300")
    check("as its own process: exit code 1, one line, no traceback", ok and "Traceback" not in err, line)
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
