#!/usr/bin/env python3
"""test_fp8_history_file.py: the state file's FP8 amax history (train_gpt -f8 1's delayed scales,
checkpoint.h's fp8_history_bytes section after the outlier windows), on the host, no GPU.

Through build/test/checkpoint_tool, which calls the real writer (write_checkpoint) and reader
(load_checkpoint):
  - a history of N floats and its step count, written and read back: the same count, every value
    the same bits, the header's fp8_history_bytes and fp8_history_steps as data/file_formats.py reads
    them, the section the file's last 4 N bytes;
  - a state file without the section (fp8_history_bytes 0: a run without -f8 1, or a file from before
    the history) loads with none and step count 0;
  - refused with one error line: a section size that is not whole floats, a size claimed with no
    section after the windows, a negative step count; and the crc covers the section (one flipped bit
    of a value fails the checksum).
Needs build/test/checkpoint_tool. Ends with `N passed, N failed, N skipped`.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "data"))
import file_formats as ff  # noqa: E402

TOOL = os.path.join(ROOT, "build", "test", "checkpoint_tool")
STEP, N, STEPS = 12, 4 * 2 * 16, 37  # N: 4 tensors x 2 blocks x 16 steps, as a two-block model's


def tool(*args):
    r = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def state_file(d):
    return os.path.join(d, f"state_{STEP:08d}.bin")


def rewrite(path, history=None, fields_over=None):
    """The state file with its history section replaced (None: kept), header fields set, the crc right."""
    fields, arrays, outliers, old = ff.split_train_state(open(path, "rb").read())
    section = old if history is None else history
    fields["fp8_history_bytes"] = len(section)
    fields.update(fields_over or {})
    with open(path, "wb") as f:
        f.write(ff.join_train_state(fields, arrays, outliers, section))


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"error: {TOOL} is not built (make build/test/checkpoint_tool)", file=sys.stderr)
        sys.exit(1)
    want = (0.5 + 0.25 * np.arange(N)).astype("<f4")
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "run")
        os.makedirs(d)
        rc, _, err = tool("fp8history", d, STEP, N, STEPS)
        check(f"written: a history of {N} floats after {STEPS} steps", rc == 0, err.strip()[:120])
        if rc != 0:
            finish()
        data = open(state_file(d), "rb").read()
        fields = ff.TRAIN_STATE.unpack(data)
        tail = np.frombuffer(data[-4 * N:], "<f4")
        check("  the header says its bytes and steps; the section is the file's last bytes",
              fields["fp8_history_bytes"] == 4 * N and fields["fp8_history_steps"] == STEPS and tail.tobytes() == want.tobytes(),
              f"{fields['fp8_history_bytes']} bytes, {fields['fp8_history_steps']} steps")
        rc, out, err = tool("history", d, STEP)
        lines = out.splitlines()
        got = np.array([float(x) for x in lines[1:]], "<f4") if rc == 0 else np.zeros(0, "<f4")
        check("  read back: the same steps and every value the same bits",
              rc == 0 and lines[0] == f"steps {STEPS} values {N}" and got.tobytes() == want.tobytes(),
              (lines[0] if lines else err.strip())[:120])

        def copy(name):
            e = os.path.join(tmp, name)
            shutil.copytree(d, e)
            return e

        e = copy("without")
        rewrite(state_file(e), history=b"", fields_over={"fp8_history_steps": 0})
        rc, out, err = tool("history", e, STEP)
        check("a state file without the section loads with no history", rc == 0 and out.strip() == "steps 0 values 0",
              (out.strip() or err.strip())[:120])

        cases = [("a section of 6 bytes (not whole floats)", bytes(6), {}, "whole floats"),
                 ("512 bytes claimed, no section after the windows", b"", {"fp8_history_bytes": 512}, "bytes, expected"),
                 ("a step count of -1", None, {"fp8_history_steps": -1}, "steps >= 0")]
        for i, (what, history, over, needle) in enumerate(cases):
            e = copy(f"bad{i}")
            rewrite(state_file(e), history=history, fields_over=over)
            rc, _, err = tool("history", e, STEP)
            lines = err.strip().splitlines()
            check(f"refused: {what}", rc == 1 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0],
                  lines[-1][:140] if lines else f"exit code {rc}")

        e = copy("flipped")
        raw = bytearray(open(state_file(e), "rb").read())
        raw[-3] ^= 1  # a bit of the last history value
        open(state_file(e), "wb").write(bytes(raw))
        rc, _, err = tool("history", e, STEP)
        check("the crc covers the section: one flipped bit fails the checksum", rc == 1 and "checksum" in err, err.strip()[:120])
    finish()


if __name__ == "__main__":
    main()
