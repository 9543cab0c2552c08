#!/usr/bin/env python3
"""Plots training runs side by side: loss, HellaSwag and tokens/s against step, one colour per run.

    $(cat build/python) scripts/plot_runs.py RUN_DIR [RUN_DIR ...] -o runs.png   (or .svg, .pdf)

Each RUN_DIR holds the metrics.csv that train_gpt (and `gpt_reference.py train -o`) write into their
output folder:
    step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,hellaswag_acc_norm,hellaswag_acc
(or without the last two columns, as runs without -he and gpt_reference.py train write it): one row
per training step, one per validation (only step and val_loss filled) and one per HellaSwag
evaluation (only step and the two hellaswag columns filled).
Top panel: training loss (solid) and validation loss (dashed, dots); where a run has evaluations, a
panel of HellaSwag's acc_norm; bottom panel: tokens/s. The
legend names each run by its folder. The extension of -o names the image type: .png, .svg or .pdf
(anything else is refused). The image is written atomically (temporary file, then rename); an
existing image of that name is replaced (a plot is redrawn as a run goes on), a folder or a
metrics.csv never.
"""

import argparse
import math
import os
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_check import wrong_python_line  # noqa: E402  (beside this file)

COLUMNS = ["step", "train_loss", "val_loss", "lr", "grad_norm", "step_ms", "tokens_per_s"]
EVAL_COLUMNS = ["hellaswag_acc_norm", "hellaswag_acc"]  # after COLUMNS, in runs with -he
FORMATS = ("png", "svg", "pdf")  # -o's extension -> matplotlib's savefig format


class Error(Exception):
    """A bad input: one `error: ...` line on stderr, exit code 1."""


def regular_file(path, hint=""):
    """`path` must be a regular file (links followed): opening a FIFO would block forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise Error(f"'{path}' not found{hint}")
    except OSError as e:
        raise Error(f"cannot read '{path}': {e.strerror}")
    if not stat.S_ISREG(mode):
        raise Error(f"'{path}' is not a regular file")


def read_metrics(run_dir):
    """{column: [value or None per row]} of RUN_DIR/metrics.csv, every field checked."""
    if not os.path.isdir(run_dir):
        raise Error(f"run folder '{run_dir}' not found")
    path = os.path.join(run_dir, "metrics.csv")
    regular_file(path, " (train_gpt writes it into its -o folder)")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"cannot read '{path}': {e}")
    header = [c.strip() for c in lines[0].split(",")] if lines else []
    if header not in (COLUMNS, COLUMNS + EVAL_COLUMNS):
        raise Error(f"{path} line 1: expected the header '{','.join(COLUMNS + EVAL_COLUMNS)}' (or without its "
                    f"last two), got '{lines[0] if lines else ''}'")
    columns = header
    table = {c: [] for c in COLUMNS + EVAL_COLUMNS}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != len(columns):
            raise Error(f"{path} line {number}: {len(fields)} fields, expected {len(columns)}")
        fields += [""] * (len(COLUMNS + EVAL_COLUMNS) - len(columns))
        for column, text in zip(COLUMNS + EVAL_COLUMNS, fields):
            try:
                value = None if text == "" else (int(text) if column == "step" else float(text))
            except ValueError:
                raise Error(f"{path} line {number}: {column} '{text}' is not a number")
            table[column].append(value)
        if table["step"][-1] is None or table["step"][-1] < 0:
            raise Error(f"{path} line {number}: no step")
        kinds = [table[c][-1] is not None for c in ("train_loss", "val_loss", "hellaswag_acc_norm")]
        if sum(kinds) != 1:
            raise Error(f"{path} line {number}: a row holds one of train_loss (a step), val_loss (a validation) or "
                        f"hellaswag_acc_norm (an evaluation)")
    if not table["step"]:
        raise Error(f"{path}: no rows after the header")
    return table


def points(table, column):
    """(steps, values) of the rows where `column` is filled."""
    pairs = [(s, v) for s, v in zip(table["step"], table[column]) if v is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def image_format(out, run_dirs):
    """The format -o's extension names, checked before any work: a known type, not a folder, not one
    of the inputs."""
    if os.path.isdir(out):
        raise Error(f"-o {out} is a folder: give an image file's name (e.g. {os.path.join(out, 'runs.png')})")
    ext = os.path.splitext(out)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise Error(f"-o {out}: the extension names the image type: .png, .svg or .pdf"
                    f"{f', not .{ext}' if ext else ''}")
    above = os.path.dirname(os.path.abspath(out))
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise Error(f"-o {out} cannot be written: '{above}' is a file, not a folder")
    for run in run_dirs:
        csv = os.path.join(run, "metrics.csv")
        if os.path.lexists(out) and os.path.lexists(csv) and os.path.samefile(out, csv):
            raise Error(f"-o {out} is the input '{csv}'")
    return ext


def plot(runs, out, fmt):
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise Error(wrong_python_line(e, "scripts/plot_runs.py")[len("error: "):])
    evaluated = any(points(table, "hellaswag_acc_norm")[0] for _, table in runs)
    if evaluated:
        fig, (loss_ax, eval_ax, speed_ax) = plt.subplots(3, 1, figsize=(10, 10), sharex=True,
                                                         gridspec_kw={"height_ratios": [2, 1, 1]})
    else:
        fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(10, 8), sharex=True,
                                                gridspec_kw={"height_ratios": [2, 1]})
    for i, (name, table) in enumerate(runs):
        colour = f"C{i % 10}"
        steps, values = points(table, "train_loss")
        loss_ax.plot(steps, values, color=colour, linewidth=1.2, label=name)
        steps, values = points(table, "val_loss")
        loss_ax.plot(steps, values, color=colour, linestyle="--", marker="o", markersize=3)
        steps, values = points(table, "tokens_per_s")
        speed_ax.plot(steps, values, color=colour, linewidth=1.0)
        if evaluated:
            steps, values = points(table, "hellaswag_acc_norm")
            eval_ax.plot(steps, values, color=colour, marker="o", markersize=3)
    if evaluated:
        eval_ax.set_ylabel("HellaSwag acc_norm")
        eval_ax.grid(alpha=0.3)
    loss_ax.set_ylabel("loss (solid: train, dashed: val)")
    loss_ax.legend()
    loss_ax.grid(alpha=0.3)
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    speed_ax.grid(alpha=0.3)
    fig.tight_layout()
    folder, tmp = os.path.dirname(os.path.abspath(out)), None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(out), suffix="." + fmt)
        os.close(fd)
        fig.savefig(tmp, format=fmt, dpi=100)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        os.replace(tmp, out)
    except OSError as e:  # named by the image asked for, never by the temporary file
        raise Error(f"cannot write '{out}': {e.strerror or e}")
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
        plt.close(fig)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 1
        raise Error(f"{message} (-h for usage)")


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="Details: the top of scripts/plot_runs.py.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="folders holding a metrics.csv")
    p.add_argument("-o", "--out", required=True, metavar="IMAGE", help="image to write: .png, .svg or .pdf")
    args = p.parse_args(argv)
    fmt = image_format(args.out, args.runs)
    names = [os.path.basename(os.path.normpath(r)) for r in args.runs]
    # The folder names are the legend; where two runs share one, their paths tell them apart.
    names = [n if names.count(n) == 1 else os.path.normpath(r) for n, r in zip(names, args.runs)]
    runs = [(name, read_metrics(r)) for name, r in zip(names, args.runs)]
    plot(runs, args.out, fmt)
    for name, table in runs:
        steps, losses = points(table, "train_loss")
        _, val = points(table, "val_loss")
        last = f"step {steps[-1]} train loss {losses[-1]:.4f}" if steps else "no training rows"
        if val and not math.isnan(val[-1]):
            last += f", val loss {val[-1]:.4f}"
        _, acc = points(table, "hellaswag_acc_norm")
        if acc:
            last += f", HellaSwag acc_norm {acc[-1]:.4f}"
        print(f"{name}: {len(steps)} steps, {len(val)} validations, {len(acc)} evaluations; {last}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # what failed and where, without Python's [Errno N]
        print(f"error: {e.strerror or e}" + (f": '{e.filename}'" if e.filename else ""), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: the PNG's temporary file is removed on the way out
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
