"""Shared by the Python tests: counting checks and the count line, running gpt_reference.py's command
line in-process, the one-line error rule, and the random numbers of the data order's shuffle.

Not a test itself (run_tests.sh runs test_*.py only).
"""

import contextlib
import io
import os
import subprocess
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.dont_write_bytecode = True  # importing gpt_reference must not leave __pycache__ in the checkout
MIRROR = os.path.abspath(os.environ.get("GPT_MIRROR") or os.path.join(ROOT, "..", "shared", "mirror"))

counts = {"passed": 0, "failed": 0, "skipped": 0}


def check(name, ok, detail=""):
    counts["passed" if ok else "failed"] += 1
    print(f"  {name:<68} {'ok' if ok else 'FAIL'}{'  ' + detail if detail else ''}")
    return ok


def skip(name, why):
    counts["skipped"] += 1
    print(f"  {name:<68} skipped ({why})")


def finish():
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    sys.exit(1 if counts["failed"] else 0)


def ref_cli(args):
    """gpt_reference.py ARGS run in this process (torch is imported once, not per call), as its
    __main__ does it: (exit code, stdout, stderr). An unexpected exception gives exit code 99 and its
    traceback on stderr: what the user would see."""
    import gpt_reference
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            gpt_reference.main(args)
        except (gpt_reference.Error, OSError) as e:
            print(gpt_reference.error_line(e), file=sys.stderr)
            rc = 1
        except SystemExit as e:  # -h
            rc = e.code or 0
        except BaseException:
            traceback.print_exc()
            rc = 99
    return rc, out.getvalue(), err.getvalue()


def ref_process(args, env=None):
    """gpt_reference.py ARGS as its own process: (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt_reference.py")] + args, capture_output=True,
                       text=True, env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout, r.stderr


def one_line_error(rc, stderr, must_mention=""):
    """(ok, what was seen): exit code 1 and exactly one `error: ...` line on stderr, naming must_mention."""
    lines = stderr.strip().splitlines()
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and must_mention in lines[0]
    return ok, (lines[-1][:150] if lines else f"no stderr, exit code {rc}")


# The data order's shuffle draws from common.cuh's Rng (SplitMix64), written here from its definition.
def splitmix64(seed):
    state = seed % 2**64
    while True:
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        yield z ^ (z >> 31)
