"""The Python tools run by a Python that lacks their packages: one line naming the Python to use.

`make` writes the path of the Python with PyTorch, numpy, tiktoken, safetensors and matplotlib to
build/python; the `python3` first on PATH may be another one. Each tool a user runs (gpt_reference.py,
scripts/*.py, data/prepare_*.py, dev/cuda/*.py) is run here by a bare virtual
environment of this Python (no packages at all) and must print one `error:` line naming that Python,
the missing module and the Python to use (build/python's, or `make build/python` where there is none),
then exit with code 1: no traceback. The how-tos (README.md, docs/reference_training.md,
dev/cuda/README.md) must run the tools that way too. CPU only, a few seconds. Ends with
`N passed, N failed, N skipped`.
"""

import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish, one_line_error, skip  # noqa: E402

# Each tool with arguments that get it to its first import of a missing package.
TOOLS = [("gpt_reference.py", ["-h"], "numpy"),
         ("scripts/bench_torch_gpt.py", ["-h"], "numpy"),
         ("data/prepare_tinyshakespeare.py", ["-h"], "numpy"),
         ("data/prepare_text.py", ["-h"], "numpy"),
         ("data/prepare_hellaswag.py", ["-h"], "numpy"),
         ("dev/cuda/attention_vs_torch.py", ["-h"], "torch"),
         ("dev/cuda/layernorm_inductor_probe.py", ["-h"], "torch"),
         ("dev/cuda/layernorm_vs_torch.py", ["-h"], "torch"),
         ("dev/cuda/matmul_vs_torch.py", ["-h"], "torch")]


def main():
    build_python = os.path.join(ROOT, "build", "python")
    chosen = open(build_python).read().strip() if os.path.isfile(build_python) else None
    want = chosen if chosen else "make build/python"
    print(f"a bare Python (venv, no packages); the Python to name: {want}")
    with tempfile.TemporaryDirectory(prefix="test_python_tools.") as tmp:
        venv = os.path.join(tmp, "bare")
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], capture_output=True, text=True)
        bare = os.path.join(venv, "bin", "python3")
        names = [t for t, _, _ in TOOLS] + ["scripts/plot_runs.py (drawing)"]
        if made.returncode != 0 or not os.access(bare, os.X_OK):
            for name in names:
                skip(f"{name} under a bare Python", f"no venv: {(made.stderr.strip().splitlines() or ['?'])[-1][:60]}")
            finish()
        if subprocess.run([bare, "-c", "import numpy"], capture_output=True).returncode == 0:
            for name in names:
                skip(f"{name} under a bare Python", "the venv sees numpy (not bare)")
            finish()
        for tool, args, module in TOOLS:
            r = subprocess.run([bare, os.path.join(ROOT, tool)] + args, capture_output=True, text=True, cwd=tmp)
            ok, line = one_line_error(r.returncode, r.stderr, f"no module '{module}'")
            check(f"{tool}: one line, names {module}, the bare Python and the one to use",
                  ok and bare in r.stderr and want in r.stderr and not r.stdout and "Traceback" not in r.stderr, line)
        run = os.path.join(tmp, "run")
        os.makedirs(run)
        with open(os.path.join(run, "metrics.csv"), "w") as f:
            f.write("step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s\n1,5.0,,1e-4,1.0,100,1000\n")
        r = subprocess.run([bare, os.path.join(ROOT, "scripts", "plot_runs.py"), run, "-o", os.path.join(tmp, "x.png")],
                           capture_output=True, text=True)
        ok, line = one_line_error(r.returncode, r.stderr, "no module 'matplotlib'")
        check("scripts/plot_runs.py: reads the CSV, then one line for matplotlib naming the one to use",
              ok and want in r.stderr and "Traceback" not in r.stderr, line)
        # The how-tos show the form that works: the tools run by build/python's Python, not a bare python3.
        for doc in ("README.md", "docs/reference_training.md", "dev/cuda/README.md"):
            with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
                bare_runs = [ln.strip() for ln in f if re.search(r"(^|[\s`(])python3? +[\w./-]+\.py\b", ln)]
            check(f"{doc}: every Python tool is run as $(cat build/python) TOOL", not bare_runs,
                  bare_runs[0][:80] if bare_runs else "")
        if chosen:
            r = subprocess.run([chosen, os.path.join(ROOT, "gpt_reference.py"), "-h"], capture_output=True, text=True)
            check("build/python's Python runs gpt_reference.py -h", r.returncode == 0 and r.stdout.startswith("usage:"),
                  r.stderr.strip()[-80:])
        else:
            skip("build/python's Python runs gpt_reference.py -h", "no build/python")
    finish()


if __name__ == "__main__":
    main()
