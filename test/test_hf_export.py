"""gpt_reference.py export --format hf, loaded by Hugging Face transformers itself.

For a small odd model (C=39, 3 heads of 13, V=1237) and GPT-2 124M's shape (d12, random init):
export to a folder, GPT2LMHeadModel.from_pretrained(folder) on the CPU in fp32, and compare its
logits with gpt_reference's on a random batch (worst |difference| over the largest |logit|, bound
1e-5), then greedy decoding of d12 by transformers' generate() with ours. Needs transformers
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


def main():
    try:
        import transformers
    except ImportError:
        for model, B, T in CONFIGS:
            for what in ("export + from_pretrained: no missing or unexpected keys", f"logits on B={B} T={T}"):
                skip(f"{model}: {what}", "transformers not installed")
        skip(f"d12: greedy decoding of {GREEDY_TOKENS} tokens == transformers' generate()", "transformers not installed")
        finish()
    import torch
    import gpt_reference as ref
    ref.pick_device("cpu")  # TF32 off (it would not matter on the CPU)
    print(f"transformers {transformers.__version__}, PyTorch {torch.__version__}, on the CPU in fp32")
    holder = tempfile.TemporaryDirectory(prefix="test_hf_export.")
    tmp = holder.name
    for model_name, B, T in CONFIGS:
        print(model_name)
        ckpt, folder = os.path.join(tmp, "model.ckpt"), os.path.join(tmp, "hf_" + model_name.replace(",", "_"))
        rc1, _, err1 = ref_cli(["init", "--model", model_name, "--seed", "7", "--out", ckpt])
        rc2, _, err2 = ref_cli(["export", ckpt, "--out", folder])
        if not check(f"{model_name}: init + export", rc1 == rc2 == 0, (err1 + err2).strip()[:80]):
            continue
        try:
            hf, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
            hf = hf.float().eval()
            loaded = not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
            detail = "" if loaded else str({k: v for k, v in info.items() if v})[:120]
        except Exception as e:  # a failure to load is this test's finding, reported in one line
            check(f"{model_name}: export + from_pretrained: no missing or unexpected keys", False,
                  f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        check(f"{model_name}: export + from_pretrained: no missing or unexpected keys", loaded, detail)
        ours = ref.read_checkpoint(ckpt).eval()
        g = torch.Generator().manual_seed(11)
        x = torch.randint(0, ours.cfg.V, (B, T), generator=g)
        with torch.no_grad():
            a = ours(x)[0]
            b = hf(input_ids=x).logits
        worst = float((a - b).abs().max() / a.abs().max()) if a.shape == b.shape else float("inf")
        check(f"{model_name}: logits on B={B} T={T} equal gpt_reference's", worst <= BOUND,
              f"shape {tuple(b.shape)}, worst {worst:.2e}, bound {BOUND:.0e}")
        if model_name == "d12":
            if not os.path.isfile(os.path.join(MIRROR, "gpt2", "encoder.json")):
                check("d12: greedy decoding (needs the GPT-2 BPE files)", False, f"none at {MIRROR}")
                continue
            prompt = "The meaning of life is"
            rc, out, err = ref_cli(["generate", "-e", ckpt, "--prompt", prompt, "-n", str(GREEDY_TOKENS),
                                    "--temperature", "0", "--device", "cpu"])
            line = [ln for ln in out.splitlines() if ln.startswith("tokens: ")]
            mine = [int(t) for t in line[0].split()[1:]] if rc == 0 and line else None
            context = [ref.EOT] + ref.gpt2_tokenizer().encode_ordinary(prompt)
            with torch.no_grad():
                ids = torch.tensor([context])
                out_ids = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY_TOKENS,
                                      do_sample=False, pad_token_id=ref.EOT)
            theirs = out_ids[0, len(context):].tolist()
            check(f"d12: greedy decoding of {GREEDY_TOKENS} tokens == transformers' generate()", mine == theirs,
                  f"ours {mine[:6] if mine else err.strip()[:60]}..., theirs {theirs[:6]}...")
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
