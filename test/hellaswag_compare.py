"""hellaswag_compare.py: helpers of test/test_generate.sh's HellaSwag checks (not a test itself).

  make OUT N                         N made-up HellaSwag examples (JSON lines) from the sentences of
                                     docs/*.md: the context a sentence, the right ending the next one,
                                     the other three endings sentences drawn elsewhere
  compare CUDA.tsv TORCH.tsv N       eval_gpt's -scores against gpt_reference.py eval's --scores: every
                                     completion's summed loss within 1e-4 relative, and the same choice
                                     (lowest loss per token) wherever PyTorch's two best differ by more
                                     than 1e-4; prints `agree: ...` or `DISAGREE: ...` and the counts
"""
import glob
import json
import random
import re
import sys


def make(out, n):
    text = " ".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob("docs/*.md")))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)) if 20 <= len(s.strip()) <= 160]
    rng = random.Random(1)
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(n):
            a = rng.randrange(len(sentences) - 1)
            right = sentences[a + 1]
            endings = [right] + [sentences[rng.randrange(len(sentences))] for _ in range(3)]
            rng.shuffle(endings)
            f.write(json.dumps({"ctx": sentences[a], "endings": endings, "label": endings.index(right)}) + "\n")


def compare(cuda_path, torch_path, n):
    cuda = {}
    for line in open(cuda_path).read().splitlines()[1:]:  # index, label, the completions' sums
        f = line.split("\t")
        cuda[int(f[0])] = [float(x) for x in f[2:]]
    rows = [line.split("\t") for line in open(torch_path).read().splitlines()]
    col = {name: i for i, name in enumerate(rows[0])}
    sums, counts = {}, {}
    for r in rows[1:]:
        i, k = int(r[col["index"]]), int(r[col["completion"]])
        sums.setdefault(i, {})[k] = float(r[col["loss_sum"]])
        counts.setdefault(i, {})[k] = int(r[col["tokens"]])
    worst, agree, disagree, near = 0.0, 0, 0, 0
    for i, cs in cuda.items():
        ts = [sums[i][k] for k in range(len(cs))]
        tokens = [counts[i][k] for k in range(len(cs))]
        worst = max(worst, max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(cs, ts)))
        mean_cuda = [a / c for a, c in zip(cs, tokens)]
        mean_torch = [b / c for b, c in zip(ts, tokens)]
        order = sorted(range(len(mean_torch)), key=lambda k: (mean_torch[k], k))
        gap = (mean_torch[order[1]] - mean_torch[order[0]]) / abs(mean_torch[order[0]])
        same = min(range(len(mean_cuda)), key=lambda k: (mean_cuda[k], k)) == order[0]
        if gap <= 1e-4:
            near += 1
        elif same:
            agree += 1
        else:
            disagree += 1
    ok = len(cuda) == n == len(sums) and worst <= 1e-4 and disagree == 0
    print(f"{'agree' if ok else 'DISAGREE'}: {len(cuda)} examples, worst relative difference of a sum {worst:.1e} "
          f"(bound 1e-4), {agree} clear choices the same, {disagree} different, {near} near-ties")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("usage: hellaswag_compare.py make OUT N | compare CUDA.tsv TORCH.tsv N")
