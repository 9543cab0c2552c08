#!/usr/bin/env python3
"""test_formats.py: the C++ and Python declarations of the file formats and of the parameter list agree.

  - every header: checkpoint_tool formats writes each format's header with every field set to a value
    of its own; data/file_formats.py must pack the same values into the same 1024 bytes, unpack the
    C++ file into the same values, and know the same fields (no more, no fewer);
  - the eval file (HellaSwag): data/eval_file.py writes examples that evaluation.h reads back the same
    (checkpoint_tool evalfile), and a truncated copy is refused by both;
  - a run folder's logs (checkpoint_tool logs): an older metrics.csv upgraded, cut-short rows dropped;
  - the parameter list: checkpoint_tool layout prints model_config.h's GPT_PARAMETER_TENSORS for a few
    configs; data/file_formats.py's PARAMETER_TENSORS (which gpt_reference.py uses) must give the same
    names, order, shapes, decay, stacking and init.
Needs build/test/checkpoint_tool (no GPU). Ends with `N passed, N failed, N skipped`.
"""
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
import file_formats as ff  # noqa: E402

TOOL = os.path.join(ROOT, "build", "test", "checkpoint_tool")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"error: {TOOL} is not built (make build/test/checkpoint_tool)", file=sys.stderr)
        sys.exit(1)
    with tempfile.TemporaryDirectory() as tmp:
        lines = subprocess.run([TOOL, "formats", tmp], check=True, capture_output=True, text=True).stdout.splitlines()
        written = {}
        for line in lines:
            fmt, field, value = line.split()
            written.setdefault(fmt, {})[field] = float(value)
        by_name = {h.name: h for h in ff.FORMATS}
        check("the same formats on both sides", set(written) == set(by_name),
              f"C++ {sorted(written)}, Python {sorted(by_name)}")
        for name, values in written.items():
            header = by_name.get(name)
            if header is None:
                continue
            fields = {f for f, _, _ in header.fields}
            check(f"{name}: the same fields", set(values) == fields,
                  f"only C++: {sorted(set(values) - fields)}, only Python: {sorted(fields - set(values))}")
            with open(os.path.join(tmp, name + ".bin"), "rb") as f:
                cpp = f.read()
            typed = {f: (v if kind == "f4" else int(v)) for f, _, kind in header.fields for g, v in values.items() if g == f}
            py = header.pack(**typed).tobytes()
            first = next((i for i in range(len(cpp)) if cpp[i] != py[i]), None) if len(cpp) == len(py) else 0
            check(f"{name}: Python packs the bytes C++ wrote", cpp == py,
                  "" if cpp == py else f"first difference at byte {first} (slot {first // 4})")
            got = header.unpack(cpp)
            check(f"{name}: Python reads the values C++ wrote", all(got[f] == typed[f] for f in typed), "")
            check(f"{name}: magic and version are the module's names for them",
                  got["magic"] == header.magic and got["version"] == header.version, "")
    # The eval file: data/eval_file.py writes, evaluation.h (checkpoint_tool evalfile) reads the same
    # examples; a damaged copy is refused by both.
    import eval_file as ef
    rng = np.random.default_rng(3)
    examples = []
    for i in range(40):
        context = rng.integers(0, 50257, int(rng.integers(1, 60))).tolist()
        completions = [rng.integers(0, 50257, int(rng.integers(1, 30))).tolist() for _ in range(4)]
        examples.append((i, int(rng.integers(0, 4)), context, completions))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "eval.bin")
        with open(path, "wb") as f:
            for chunk in ef.eval_file_chunks([ef.example_words(*e) for e in examples]):
                f.write(chunk)
        out = subprocess.run([TOOL, "evalfile", path, "50257"], capture_output=True, text=True)
        want = [f"examples {len(examples)}"] + [
            " ".join([str(i), str(label), str(len(c))] + [str(t) for t in c] +
                     [x for comp in comps for x in ["|", str(len(comp))] + [str(t) for t in comp]])
            for i, label, c, comps in examples]
        check("eval file: evaluation.h reads the examples data/eval_file.py wrote",
              out.returncode == 0 and out.stdout.splitlines() == want, out.stderr.strip()[:100])
        py = ef.read_eval_file(path, 50257)
        check("eval file: data/eval_file.py reads them back", [(e.index, e.label, e.context, e.completions) for e in py]
              == [(i, label, c, comps) for i, label, c, comps in examples])
        data = bytearray(open(path, "rb").read())
        cut = os.path.join(tmp, "cut.bin")
        open(cut, "wb").write(bytes(data[:-3]))
        out = subprocess.run([TOOL, "evalfile", cut, "50257"], capture_output=True, text=True)
        try:
            ef.read_eval_file(cut, 50257)
            py_refused = False
        except (ef.EvalFileError, ValueError, OSError):
            py_refused = True
        check("eval file: a truncated copy is refused by both, one error line from C++",
              out.returncode == 1 and out.stderr.count("\n") == 1 and out.stderr.startswith("error:") and py_refused,
              out.stderr.strip()[:100])
    # A run folder's logs as a run starting there finds them: metrics.csv of an older version (7
    # columns) is given the evaluation columns; a row a kill cut short is dropped; so is a temp file
    # of an upgrade cut short; a header cut before its newline starts the file over.
    old = "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s"
    new = old + ",hellaswag_acc_norm,hellaswag_acc"
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "metrics.csv"), "w") as f:
            f.write(old + "\n1,5.0,,6e-04,1.0,100.000,1000.0\n1,,4.9,,,,\n2,4.8,,6e-04,0.9,10")
        with open(os.path.join(tmp, "main.log"), "w") as f:
            f.write("s:1 trl:5.000000\ns:2 trl:4.8")
        open(os.path.join(tmp, "metrics.csv.tmp.Ab12Cd"), "w").write("half")
        rc = subprocess.run([TOOL, "logs", tmp]).returncode
        lines = open(os.path.join(tmp, "metrics.csv")).read().split("\n")
        check("run logs: an older metrics.csv gets the two columns, its rows two empty fields",
              rc == 0 and lines == [new, "1,5.0,,6e-04,1.0,100.000,1000.0,,", "1,,4.9,,,,,,", ""], repr(lines)[:120])
        check("run logs: main.log's cut-short row is dropped", open(os.path.join(tmp, "main.log")).read() == "s:1 trl:5.000000\n")
        check("run logs: an upgrade's leftover temp file is removed", sorted(os.listdir(tmp)) == ["main.log", "metrics.csv"],
              str(sorted(os.listdir(tmp))))
        with open(os.path.join(tmp, "metrics.csv"), "w") as f:
            f.write(old[:20])
        subprocess.run([TOOL, "logs", tmp])
        check("run logs: a header cut short starts the file over", open(os.path.join(tmp, "metrics.csv")).read() == new + "\n")
    for cfg in [(2, 3, 39, 50, 1237, 1280), (12, 12, 768, 1024, 50257, 50304), (1, 1, 1, 1, 1, 1)]:
        out = subprocess.run([TOOL, "layout", ",".join(map(str, cfg))], check=True, capture_output=True,
                             text=True).stdout.split("\n")
        cpp = [line.split() for line in out if line]
        c = SimpleNamespace(**dict(zip(["L", "NH", "C", "maxT", "V", "Vp"], cfg)))
        py = []
        for (name, rows, cols, decay, per_layer, init), (_, shape) in zip(ff.PARAMETER_TENSORS, ff.param_shapes(c)):
            layers = c.L if per_layer else 1
            py.append([name, str(layers), str(rows(c)), str(cols(c) if cols else 1), str(int(decay)), str(int(per_layer)),
                       init])
            want = ((c.L,) if per_layer else ()) + ((rows(c),) if cols is None else (rows(c), cols(c)))
            if shape != want:
                py[-1].append("shape?")
        check(f"parameter list for L,NH,C,maxT,V,Vp = {cfg}", cpp == py,
              "" if cpp == py else f"C++ {cpp[:3]}... Python {py[:3]}...")
    finish()


if __name__ == "__main__":
    main()
