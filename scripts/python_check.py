"""python_check.py: what the Python tools say when run by a Python that lacks their packages.

`make` finds (or installs) a Python with PyTorch, numpy, tiktoken, safetensors and matplotlib and
writes its path to build/python (scripts/setup_python.sh); the `python3` first on PATH may be another
one. A tool whose import fails calls exit_wrong_python(error, "gpt_reference.py"), which prints one
line naming the Python to use and exits with code 1, instead of a traceback.

Not a program: imported by gpt_reference.py, scripts/*.py and data/prepare_tinyshakespeare.py. Uses
the standard library only, so it works under any Python 3.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_PYTHON = os.path.join(ROOT, "build", "python")


def found_python():
    """The path in build/python, or None where make has not written it yet."""
    try:
        with open(BUILD_PYTHON) as f:
            path = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return path or None


def wrong_python_line(error, tool=None):
    """One line: this Python lacks a package of `tool` (a path relative to the checkout; default: the
    program running); which one to use instead."""
    if tool is None:
        tool = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv and sys.argv[0] else "..."
    missing = getattr(error, "name", None) or str(error)
    here = sys.executable or "this Python"
    chosen = found_python()
    if chosen and chosen != here:
        return (f"error: {here} has no module '{missing}': use the Python make found, {chosen} "
                f"(kept in build/python): {chosen} {tool} ...")
    if chosen:  # build/python names this very Python: its packages went away since make wrote it
        return (f"error: {here} (build/python) has no module '{missing}': run `rm build/python && make "
                f"build/python` to find or install the packages again")
    return (f"error: {here} has no module '{missing}': run `make build/python` (it finds or installs a "
            f"Python with PyTorch, numpy, tiktoken, safetensors and matplotlib), then "
            f"`$(cat build/python) {tool} ...`")


def exit_wrong_python(error, tool=None):
    print(wrong_python_line(error, tool), file=sys.stderr)
    sys.exit(1)
