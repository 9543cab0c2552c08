"""gpt_reference.py export --format hf, loaded by Hugging Face transformers itself.

For a small odd model (C=39, 3 heads of 13, V=1237) and GPT-2 124M's shape (d12, random init):
export to a folder, AutoModelForCausalLM.from_pretrained(folder) on the CPU in fp32 (a
GPT2LMHeadModel, no missing or unexpected keys), and compare its logits with gpt_reference's on a
random batch (worst |difference| over the largest |logit|, bound 1e-5). For d12 (GPT-2's vocabulary)
the folder also holds the tokenizer: AutoTokenizer.from_pretrained(folder), fast and slow, must give
tiktoken's ids for hand-written edge cases and 100 KB of Tiny Shakespeare and decode them back to the
text; then the tokenizer's ids of a prompt, greedy-decoded by transformers' generate(), must be
gpt_reference.py generate's tokens, and the tokenizer's decoding of them its text. Needs transformers
(the GPU machines have it); without it every check is reported skipped. Ends with
`N passed, N failed, N skipped`.
"""

import os
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import MIRROR, check, finish, ref_cli, skip  # noqa: E402

CONFIGS = [("L=2,NH=3,C=39,V=1237,maxT=50", 3, 37), ("d12", 2, 64)]  # model, B, T
# fp32 on both sides: transformers' GPT2LMHeadModel and gpt_reference.py compute the same functions
# with other kernels (Conv1D's addmm, their own GELU and softmax), so logits differ by float32 roundings
# in other orders, each ~6e-8 relative, a few per layer over 2-12 layers: 1e-5 relative to the largest.
BOUND = 1e-5
GREEDY_TOKENS = 16
PROMPT = "The meaning of life is"
TEXTS = {"a prompt": PROMPT,
         "contractions and whitespace runs": "It's, we'll, they've 'tis o'clock'  a  b \n\n x\r\n  y   ",
         "only whitespace": " \n\t  ",
         "non-Latin scripts and emoji": "Ünïcödé Straße 中文字符 日本語 한국어 🎉👍🏽 ❤️‍🔥 ½ ²",
         "literal <|endoftext|> (a special token)": "before <|endoftext|> after"}
CHECKS = [f"{m}: {what}" for m, _, _ in CONFIGS for what in
          ("init + export", "export + AutoModelForCausalLM: a GPT2LMHeadModel, no missing or unexpected keys",
           "logits equal ours")]
CHECKS += [f"d12: AutoTokenizer ({kind}) == tiktoken's ids, decodes back: {name}" for kind in ("fast", "slow")
           for name in list(TEXTS) + ["100 KB of Tiny Shakespeare"]]
CHECKS += [f"d12: AutoTokenizer's prompt, greedy generate() of {GREEDY_TOKENS} tokens == gpt_reference.py generate",
           "d12: AutoTokenizer.decode of the tokens == gpt_reference.py generate's text"]


def main():
    try:
        import transformers
    except ImportError:
        for name in CHECKS:
            skip(name, "transformers not installed")
        finish()
    import torch
    import gpt_reference as ref
    ref.pick_device("cpu")  # TF32 off (it would not matter on the CPU)
    print(f"transformers {transformers.__version__}, PyTorch {torch.__version__}, on the CPU in fp32")
    if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
        check(f"GPT-2 BPE files at {MIRROR}", False, "set GPT_MIRROR to the folder of public inputs")
        finish()
    os.environ["GPT_MIRROR"] = MIRROR  # where export finds the tokenizer's files
    holder = tempfile.TemporaryDirectory(prefix="test_hf_export.")
    tmp = holder.name
    for model_name, B, T in CONFIGS:
        print(model_name)
        name = model_name.replace(",", "_").replace("=", "")
        ckpt, folder = os.path.join(tmp, name + ".ckpt"), os.path.join(tmp, "hf_" + name)
        rc1, _, err1 = ref_cli(["init", "--model", model_name, "--seed", "7", "--out", ckpt])
        rc2, _, err2 = ref_cli(["export", ckpt, "--out", folder])
        if not check(f"{model_name}: init + export", rc1 == rc2 == 0, (err1 + err2).strip()[:80]):
            continue
        what = "export + AutoModelForCausalLM: a GPT2LMHeadModel, no missing or unexpected keys"
        try:
            hf, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
            hf = hf.float().eval()
            loaded = type(hf).__name__ == "GPT2LMHeadModel" and not any(
                info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
            detail = type(hf).__name__ + ("" if loaded else " " + str({k: v for k, v in info.items() if v})[:120])
        except Exception as e:  # a failure to load is this test's finding, reported in one line
            check(f"{model_name}: {what}", False, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        check(f"{model_name}: {what}", loaded, detail)
        ours = ref.read_checkpoint(ckpt).eval()
        g = torch.Generator().manual_seed(11)
        x = torch.randint(0, ours.cfg.V, (B, T), generator=g)
        with torch.no_grad():
            a = ours(x)[0]
            b = hf(input_ids=x).logits
        worst = float((a - b).abs().max() / a.abs().max()) if a.shape == b.shape else float("inf")
        check(f"{model_name}: logits on B={B} T={T} equal ours", worst <= BOUND,
              f"shape {tuple(b.shape)}, worst {worst:.2e}, bound {BOUND:.0e}")
        if model_name == "d12":
            tokenizer_checks(transformers, torch, ref, hf, folder, ckpt)
    holder.cleanup()
    finish()


def tokenizer_checks(transformers, torch, ref, hf, folder, ckpt):
    enc = ref.gpt2_tokenizer()
    texts = dict(TEXTS)
    with open(os.path.join(MIRROR, "tinyshakespeare.txt"), encoding="utf-8") as f:
        texts["100 KB of Tiny Shakespeare"] = f.read()[:100000]
    tokenizers = {}
    for kind in ("fast", "slow"):
        try:
            tok = transformers.AutoTokenizer.from_pretrained(folder, use_fast=kind == "fast")
        except Exception as e:
            for name in texts:
                check(f"d12: AutoTokenizer ({kind}) == tiktoken's ids, decodes back: {name}", False,
                      f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        tokenizers[kind] = tok
        for name, text in texts.items():
            want = enc.encode(text, allowed_special="all")
            got = tok(text)["input_ids"]
            back = tok.decode(got)
            check(f"d12: AutoTokenizer ({kind}) == tiktoken's ids, decodes back: {name}",
                  got == want and back == text, f"{type(tok).__name__}, {len(got)} ids" if got == want else
                  f"{len(got)} vs {len(want)} ids, first {got[:5]} vs {want[:5]}; decodes back: {back == text}")
    tok = tokenizers.get("fast") or tokenizers.get("slow")
    what = f"d12: AutoTokenizer's prompt, greedy generate() of {GREEDY_TOKENS} tokens == gpt_reference.py generate"
    if tok is None:
        check(what, False, "no tokenizer loaded")
        return
    rc, out, err = ref_cli(["generate", "-e", ckpt, "--prompt", PROMPT, "-n", str(GREEDY_TOKENS),
                            "--temperature", "0", "--device", "cpu"])
    line = [ln for ln in out.splitlines() if ln.startswith("tokens: ")]
    mine = [int(t) for t in line[0].split()[1:]] if rc == 0 and line else None
    ids = torch.tensor([[tok.bos_token_id] + tok(PROMPT)["input_ids"]])  # ours starts after <|endoftext|>
    with torch.no_grad():
        out_ids = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY_TOKENS,
                              do_sample=False, pad_token_id=tok.eos_token_id)
    theirs = out_ids[0, ids.shape[1]:].tolist()
    check(what, mine == theirs, f"ours {mine[:6] if mine else err.strip()[:60]}..., theirs {theirs[:6]}...")
    text = out.split("\n---\n")[0] if rc == 0 else None
    check("d12: AutoTokenizer.decode of the tokens == gpt_reference.py generate's text",
          text is not None and PROMPT + tok.decode(theirs) == text, repr(tok.decode(theirs)[:60]))


if __name__ == "__main__":
    main()
