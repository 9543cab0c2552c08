"""scripts/plot_runs.py: a PNG (or SVG, PDF) from run folders' metrics.csv, and one-line errors on bad ones.

CPU only, a few seconds. Two synthetic runs (one with validation rows, one resumed-looking with a gap)
and gpt_reference.py train's own metrics.csv format: the output must be a PNG (signature, IHDR of the
expected size), depend on the data, and be written without leaving a temporary file; -o's extension
names the type (.svg and .pdf give those, others are refused), a folder or an input is never written.
Malformed files must fail with one `error:` line naming the file and line, exit code 1; a metrics.csv
that is a FIFO or a folder fails at once (opening a FIFO would block). Without matplotlib the drawing
checks are skipped (the CSV and -o checks run before any plotting). Ends with
`N passed, N failed, N skipped`.
"""

import importlib.util
import os
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish, one_line_error, skip  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "plot_runs.py")
HEADER = "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s"


def run(args, timeout=None):
    try:
        r = subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"still running after {timeout} s"
    return r.returncode, r.stdout, r.stderr


def run_dir(root, name, lines):
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return folder


def synthetic(steps, val_every, scale, speed):
    lines = [HEADER]
    for s in range(steps + 1):
        if val_every and s % val_every == 0:
            lines.append(f"{s},,{scale * (5.0 / (1 + 0.1 * s)) + 0.05:.6f},,,,")
        if s < steps:
            lines.append(f"{s + 1},{scale * 5.0 / (1 + 0.1 * s):.6f},,{6e-4 * min(1, (s + 1) / 10):.6e},"
                         f"{1.5 / (1 + 0.05 * s):.6f},{100 + s % 3:.3f},{speed + 100 * (s % 5):.1f}")
    return lines


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, or None if the file is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    holder = tempfile.TemporaryDirectory(prefix="test_plot_runs.")
    tmp = holder.name
    a = run_dir(tmp, "bf16_B64", synthetic(40, 10, 1.0, 550000))
    b = run_dir(tmp, "fp32_B16", synthetic(30, 0, 1.1, 120000))
    c = run_dir(os.path.join(tmp, "other"), "bf16_B64", synthetic(25, 5, 0.9, 500000))  # same name as a
    have_mpl = importlib.util.find_spec("matplotlib") is not None

    print("drawing")
    out_dir = os.path.join(tmp, "plots")
    if have_mpl:
        out = os.path.join(out_dir, "runs.png")
        rc, stdout, err = run([a, b, c, "-o", out])
        size = png_size(out) if rc == 0 and os.path.exists(out) else None
        check("three runs (two with the same folder name) -> a PNG", rc == 0 and size is not None,
              f"{os.path.getsize(out) if size else 0} bytes, {size[0]}x{size[1]}" if size else err.strip()[:80])
        check("1000x800 pixels (figure 10x8 inches at 100 dpi)", size == (1000, 800), str(size))
        check("the summary names every run (the shared name by its path)",
              all(s in stdout for s in ("fp32_B16: 30 steps, 0 validations", os.path.normpath(c) + ": 25 steps, 6 validations")),
              stdout.splitlines()[0] if stdout else "")
        check("no temporary file left beside it", os.listdir(out_dir) == ["runs.png"], str(os.listdir(out_dir)))
        other = os.path.join(out_dir, "b_only.png")
        rc, _, err = run([b, "-o", other])
        check("another input draws another image", rc == 0 and open(other, "rb").read() != open(out, "rb").read())
        # A run with HellaSwag evaluations (train_gpt -he): the header's two more columns, a panel more.
        lines = [HEADER + ",hellaswag_acc_norm,hellaswag_acc"] + [
            line + ",," for line in synthetic(20, 10, 1.0, 500000)[1:]] + [f"{s},,,,,,,{0.25 + s / 1000:.6f},0.25" for s in (0, 10, 20)]
        e = run_dir(tmp, "with_eval", lines)
        evald = os.path.join(out_dir, "eval.png")
        rc, stdout, err = run([e, a, "-o", evald])
        check("a run with HellaSwag rows beside one without: three panels (1000x1000), acc_norm in the summary",
              rc == 0 and png_size(evald) == (1000, 1000) and "3 evaluations" in stdout and "acc_norm 0.2700" in stdout,
              (stdout or err).strip().splitlines()[0][:100] if (stdout or err) else "")
        ref = os.path.join(tmp, "ref_run")
        rc1 = subprocess.run([sys.executable, os.path.join(ROOT, "test", "train_inputs.py"), "tokens",
                              os.path.join(tmp, "t.bin"), "2000"]).returncode
        rc2 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt_reference.py"), "init", "--model",
                              "L=1,NH=1,C=8,V=1237,maxT=16", "--out", os.path.join(tmp, "m.ckpt")],
                             capture_output=True).returncode
        rc3 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt_reference.py"), "train", "-e",
                              os.path.join(tmp, "m.ckpt"), "-i", os.path.join(tmp, "t.bin"), "-j",
                              os.path.join(tmp, "t.bin"), "-b", "2", "-t", "16", "-x", "4", "-v", "2", "-m", "1",
                              "-o", ref, "--device", "cpu"], capture_output=True).returncode
        rc, stdout, err = run([ref, "-o", os.path.join(out_dir, "ref.png")])
        check("gpt_reference.py train -o's metrics.csv plots", rc1 == rc2 == rc3 == rc == 0
              and png_size(os.path.join(out_dir, "ref.png")) is not None, (stdout or err).strip().splitlines()[0][:80])
        for what, name, starts in (("-o runs.svg: an SVG file", "runs.svg", (b"<?xml", b"<svg")),
                                   ("-o runs.pdf: a PDF file", "runs.pdf", (b"%PDF-",)),
                                   ("-o RUNS.PNG: a PNG (the extension in any case)", "RUNS.PNG", (b"\x89PNG",))):
            path = os.path.join(out_dir, name)
            rc, _, err = run([a, "-o", path])
            head = open(path, "rb").read(300) if rc == 0 and os.path.exists(path) else b""
            check(what, head.startswith(starts[0]) and all(s in head for s in starts), (err.strip() or repr(head[:20]))[:80])
        rc, _, err = run([a, "-o", out])
        check("an existing image is redrawn in place (no --force for a plot)", rc == 0, err.strip()[:80])
        check("no temporary file left after the other formats", sorted(os.listdir(out_dir)) == sorted(
            ["runs.png", "b_only.png", "eval.png", "ref.png", "runs.svg", "runs.pdf", "RUNS.PNG"]), str(sorted(os.listdir(out_dir))))
    else:
        for what in ("three runs -> a PNG", "1000x800 pixels", "the summary names every run",
                     "no temporary file left beside it", "another input draws another image",
                     "gpt_reference.py train -o's metrics.csv plots", "a run with HellaSwag rows: three panels",
                     "-o runs.svg: an SVG file",
                     "-o runs.pdf: a PDF file", "-o RUNS.PNG: a PNG", "an existing image is redrawn in place",
                     "no temporary file left after the other formats"):
            skip(what, "matplotlib not installed")

    print("-o: the image type from its extension; never a folder or an input; errors name what was asked")
    for what, name, mention in (("-o loss.jpg: refused (not .png, .svg or .pdf)", "loss.jpg", ".jpg"),
                                ("-o loss (no extension): refused", "loss", ".png, .svg or .pdf")):
        rc, _, err = run([a, "-o", os.path.join(tmp, name)])
        ok, line = one_line_error(rc, err, mention)
        check(what, ok and not os.path.exists(os.path.join(tmp, name)), line)
    os.makedirs(os.path.join(tmp, "a_folder.png"))
    for what, target, mention in (("-o an existing folder", os.path.join(tmp, "a_folder.png"), "is a folder"),
                                  ("-o an existing folder without an extension", tmp, "is a folder"),
                                  ("-o under a file", os.path.join(a, "metrics.csv", "x.png"), "is a file, not a folder")):
        rc, _, err = run([a, "-o", target])
        ok, line = one_line_error(rc, err, mention)
        check(f"{what}: one line, no errno, no temporary name", ok and "Errno" not in err and ".tmp_" not in err, line)
    os.symlink(os.path.join(a, "metrics.csv"), os.path.join(tmp, "input.png"))
    before = open(os.path.join(a, "metrics.csv")).read()
    rc, _, err = run([a, "-o", os.path.join(tmp, "input.png")])
    ok, line = one_line_error(rc, err, "is the input")
    check("-o a link to a run's metrics.csv: refused, the file untouched",
          ok and open(os.path.join(a, "metrics.csv")).read() == before, line)

    print("bad inputs: one `error:` line naming the file and line, exit code 1")
    good = synthetic(5, 2, 1.0, 1000)
    bad_runs = {
        "wrong header": (["step,loss"] + good[1:], "line 1"),
        "a row with 6 fields": (good[:3] + ["3,4.1,,6e-4,1.2,100"] + good[3:], "line 4: 6 fields"),
        "a field that is not a number": (good[:2] + ["1,abc,,6e-4,1.2,100,500"] + good[2:], "line 3: train_loss 'abc'"),
        "a row with both losses": (good[:2] + ["1,4.0,4.1,6e-4,1.2,100,500"], "line 3"),
        "a row with neither loss": (good[:2] + ["1,,,6e-4,1.2,100,500"], "line 3"),
        "an evaluation row in a file without its columns": (good[:2] + ["1,,,,,,,0.3,0.3"], "line 3: 9 fields"),
        "a row without a step": (good[:2] + [",4.0,,6e-4,1.2,100,500"], "line 3: no step"),
        "header only": ([HEADER], "no rows"),
        "empty file": ([""], "line 1"),
    }
    for what, (lines, mention) in bad_runs.items():
        folder = run_dir(os.path.join(tmp, "bad"), what.replace(" ", "_"), lines)
        rc, _, err = run([a, folder, "-o", os.path.join(tmp, "bad.png")])
        ok, line = one_line_error(rc, err, mention)
        check(what, ok and os.path.join(folder, "metrics.csv") in err, line)
    rc, _, err = run([os.path.join(tmp, "nope"), "-o", os.path.join(tmp, "bad.png")])
    ok, line = one_line_error(rc, err, "nope")
    check("a missing run folder", ok, line)
    os.makedirs(os.path.join(tmp, "empty_run"))
    rc, _, err = run([os.path.join(tmp, "empty_run"), "-o", os.path.join(tmp, "bad.png")])
    ok, line = one_line_error(rc, err, "metrics.csv")
    check("a folder without metrics.csv", ok, line)
    for what, make in (("a FIFO", os.mkfifo), ("a folder", os.makedirs)):
        folder = os.path.join(tmp, "odd", what.split()[-1])
        os.makedirs(folder)
        make(os.path.join(folder, "metrics.csv"))
        rc, _, err = run([a, folder, "-o", os.path.join(tmp, "bad.png")], timeout=60)
        ok, line = one_line_error(rc, err, "not a regular file")
        check(f"metrics.csv {what}: returns at once, one line", ok, line)
    rc, _, err = run([a])
    ok, line = one_line_error(rc, err, "-o")
    check("no -o", ok, line)
    check("failed runs wrote no image", not os.path.exists(os.path.join(tmp, "bad.png")))
    rc, out, _ = run(["-h"])
    check("-h: usage, exit code 0", rc == 0 and out.startswith("usage:"))
    holder.cleanup()
    finish()


if __name__ == "__main__":
    main()
