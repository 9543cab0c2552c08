#!/usr/bin/env python3
"""test_data_order.py: which sequences each step, rank and micro-batch of a run reads (dataloader.h),
against a computation written here from the definition:

  sequence j is tokens [j*T, j*T + T + 1); an epoch has (tokens - 1) // T of them, in order, or with
  shuffling in the Fisher-Yates permutation of splitmix64(seed * 0x9E3779B97F4A7C15 + epoch); the
  epochs follow one another; step k takes the k-th run of d/T of them, and rank r's micro-batch m the
  (r * accum + m)-th run of B of those.

Through build/test/checkpoint_tool batches (no GPU), on a token file whose tokens are their own
positions, so every row says where it was read. Checks, with and without shuffling: the reads of
1 GPU at B=4 (accumulating), 2 GPUs at B=8 and 4 GPUs at B=2 with the same d, row by row; that every
step takes the same sequences in all three; that without shuffling a micro-batch is one read and is
the old window of B*T+1 tokens; that each epoch visits every sequence once, across the epoch ends;
the data positions where a checkpoint can be taken, after the read-ahead is put back (mark/rewind);
a run resumed with another B and number of GPUs from such a position; and a state file's position
as -y 1 reads it, an older file's windows of B*T tokens converted to sequences (in order) or refused
(shuffled). Ends with `N passed, N failed, N skipped`.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, splitmix64  # noqa: E402
import file_formats as ff  # noqa: E402

TOOL = os.path.join(ROOT, "build", "test", "checkpoint_tool")
TOKENS, T, D, SEED, STEPS = 1001, 8, 128, 7, 20  # 125 sequences an epoch; a step takes 16: 2.56 epochs
N, S = (TOKENS - 1) // T, D // T
SPLITS = [(4, 1), (8, 2), (2, 4)]  # (B, GPUs): 4, 1 and 2 micro-batches per GPU


def epoch_order(epoch, shuffle):
    order = list(range(N))
    if shuffle:
        draws = splitmix64(SEED * 0x9E3779B97F4A7C15 + epoch)
        for i in range(N - 1, 0, -1):
            j = next(draws) % (i + 1)
            order[i], order[j] = order[j], order[i]
    return order


def sequences(shuffle, count):
    """The first `count` sequences of the endless list: epoch after epoch."""
    out = []
    for epoch in range(count // N + 1):
        out += epoch_order(epoch, shuffle)
    return out[:count]


def expected(B, world, shuffle, steps, start=0):
    """{(step, rank, micro): [sequence, ...]} of a run from `start` sequences into the list."""
    accum = D // (B * T * world)
    seq = sequences(shuffle, start + steps * S)
    return {(k, r, m): seq[start + k * S + (r * accum + m) * B:start + k * S + (r * accum + m + 1) * B]
            for k in range(steps) for r in range(world) for m in range(accum)}


def tool(*args):
    """checkpoint_tool batches ...: ({(step, rank, micro): (reads, [first token of each row])},
    [(step, epoch, cursor)], stdout, stderr, exit code)."""
    r = subprocess.run([TOOL, "batches"] + [str(a) for a in args], capture_output=True, text=True)
    batches, positions = {}, []
    for line in r.stdout.splitlines():
        w = line.split()
        if w[0] == "batch":
            batches[tuple(map(int, w[1:4]))] = (int(w[4]), [int(x) for x in w[5:]])
        elif w[0] == "position":
            positions.append(tuple(map(int, w[1:4])))
    return batches, positions, r.stdout, r.stderr, r.returncode


def as_sequences(firsts):
    """Rows' first tokens to sequence numbers (None: a row that is not a whole sequence)."""
    return [f // T if f >= 0 and f % T == 0 else None for f in firsts]


def runs(seqs):
    """Runs of consecutive sequence numbers: the reads a batch should take."""
    return 1 + sum(1 for a, b in zip(seqs, seqs[1:]) if b != a + 1)


def position_ok(positions, start):
    """Every position (step, epoch, cursor) is the step's own: start + step * S sequences into the list."""
    bad = [(k, e, c) for k, e, c in positions if not (0 <= c <= N and e * N + c == start + k * S)]
    return not bad and bool(positions), bad[:3]


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"error: {TOOL} is not built (make build/test/checkpoint_tool)", file=sys.stderr)
        sys.exit(1)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "tokens.bin")
        with open(data, "wb") as f:
            f.write(ff.TOKEN_FILE.pack(count=TOKENS).tobytes() + np.arange(TOKENS, dtype="<u2").tobytes())
        for shuffle in (0, 1):
            how = "shuffled" if shuffle else "in order"
            print(f"{how}: {TOKENS} tokens, T={T} ({N} sequences an epoch), d={D} ({S} sequences a step), {STEPS} steps")
            taken = {}
            for B, world in SPLITS:
                got, positions, _, err, rc = tool(data, T, D, B, world, SEED, shuffle, STEPS)
                want = expected(B, world, shuffle, STEPS)
                seen = {key: as_sequences(firsts) for key, (_, firsts) in got.items()}
                wrong = [key for key in want if seen.get(key) != want[key]]
                check(f"{how}, B={B} on {world} GPU(s): every micro-batch's rows are the sequences of the definition",
                      rc == 0 and len(got) == len(want) and not wrong,
                      err.strip()[:100] or (f"first wrong (step, rank, micro) {wrong[0]}: read {seen.get(wrong[0])}, "
                                            f"expected {want[wrong[0]]}" if wrong else f"{len(want)} micro-batches"))
                bad_reads = [key for key in want if key in got and got[key][0] != runs(want[key])]
                check(f"{how}, B={B} on {world} GPU(s): one read per run of consecutive sequences", not bad_reads,
                      f"(step, rank, micro) {bad_reads[0]}: {got[bad_reads[0]][0]} reads" if bad_reads else "")
                ok, bad = position_ok(positions, 0)
                check(f"{how}, B={B} on {world} GPU(s): where no batch is read ahead, the position is the step's own",
                      ok, f"{len(positions)} positions" + (f"; wrong (step, epoch, cursor): {bad}" if bad else ""))
                taken[(B, world)] = [sorted(x for (k, _, _), rows in seen.items() if k == step for x in rows if x is not None)
                                     for step in range(STEPS)]
            same = all(taken[split] == taken[SPLITS[0]] for split in SPLITS)
            check(f"{how}: every step takes the same multiset of sequences at B=4 x 1, B=8 x 2 and B=2 x 4", same)
            one = tool(data, T, D, 4, 1, SEED, shuffle, STEPS)[0]
            order = [x for k in range(STEPS) for m in range(D // (4 * T)) for x in as_sequences(one[(k, 0, m)][1])]
            whole = [order[i:i + N] for i in range(0, len(order) - N + 1, N)]
            check(f"{how}: across the epoch ends, each epoch visits every sequence once",
                  len(whole) == STEPS * S // N and all(sorted(e) == list(range(N)) for e in whole)
                  and (not shuffle or whole[0] != whole[1]),
                  f"{len(whole)} whole epochs in {len(order)} sequences" + (", each in another order" if shuffle else ""))

        # In order, a micro-batch is the window of B*T+1 tokens the loader read before sequences: the
        # g-th micro-batch of the run (step after step, rank after rank) is window g, as long as the
        # first epoch lasts (the older loader dropped the epoch's last (tokens-1) // T % B sequences).
        for B, world in SPLITS:
            accum = D // (B * T * world)
            got = tool(data, T, D, B, world, SEED, 0, STEPS)[0]
            windows = (TOKENS - 1) // (B * T)
            same = [((k * world + r) * accum + m, got[(k, r, m)]) for k, r, m in got
                    if (k * world + r) * accum + m < windows]
            ok = all(reads == 1 and firsts == [g * B * T + i * T for i in range(B)] for g, (reads, firsts) in same)
            check(f"in order, B={B} on {world} GPU(s): micro-batch g is one read of window g's B*T+1 tokens",
                  ok and len(same) == windows, f"{len(same)} windows of the first epoch")

        # Resumed with another B and number of GPUs from a position a run recorded (after a rewind).
        _, positions, _, _, _ = tool(data, T, D, 4, 1, SEED, 1, STEPS)
        k, epoch, cursor = next(p for p in positions if p[0] >= 8)
        for B, world in SPLITS[1:]:
            got, _, _, err, rc = tool(data, T, D, B, world, SEED, 1, STEPS - k, epoch, cursor)
            want = expected(B, world, 1, STEPS - k, start=k * S)
            check(f"shuffled, resumed at step {k} (epoch {epoch}, cursor {cursor}) with B={B} on {world} GPUs: "
                  f"the sequences of the run never stopped",
                  rc == 0 and {key: as_sequences(f) for key, (_, f) in got.items()} == want, err.strip()[:100])

        # A state file's position, as -y 1 reads it (state_from_header). An older file counts windows of
        # B*T tokens: in order, window 7 of epoch 1 at B=4 is sequence 28 of epoch 1; shuffled, refused.
        def state(name, **fields):
            path = os.path.join(tmp, name)
            base = dict(step=10, B=4, T=T, loader_epoch=1, loader_cursor=7, seed=SEED, shuffle=0)
            ff.TRAIN_STATE.pack(**{**base, **fields}).tofile(path)
            return path

        for name, fields, start in (("old.bin", {}, N + 28),
                                    ("new.bin", {"cursor_unit": ff.CURSOR_SEQUENCES}, N + 7)):
            got, _, _, err, rc = tool(data, T, D, 8, 2, SEED, 0, 3, state(name, **fields))
            want = expected(8, 2, 0, 3, start=start)
            check(f"state file, cursor 7 of epoch 1 in {'windows of B=4' if name == 'old.bin' else 'sequences'}: "
                  f"resumes at sequence {start - N} of epoch 1",
                  rc == 0 and {key: as_sequences(f) for key, (_, f) in got.items()} == want, err.strip()[:100])
        windows = (TOKENS - 1) // (4 * T)  # an older file at its epoch's end: its next read was epoch 2's first window
        got, _, _, err, rc = tool(data, T, D, 8, 2, SEED, 0, 3, state("old_end.bin", loader_cursor=windows, data_tokens=TOKENS))
        check(f"state file in windows at the epoch's end (window {windows} of epoch 1): resumes at epoch 2's first sequence",
              rc == 0 and {key: as_sequences(f) for key, (_, f) in got.items()} == expected(8, 2, 0, 3, start=2 * N),
              err.strip()[:100])
        got, _, _, _, _ = tool(data, T, D, 4, 1, SEED, 0, 1, state("old.bin"))
        check("state file in windows: B=4's first micro-batch is one read of the old window 7 (tokens 224..256)",
              got.get((0, 0, 0)) == (1, [224 + 8 * i for i in range(4)]), str(got.get((0, 0, 0))))
        _, _, out, err, rc = tool(data, T, D, 4, 1, SEED, 1, 1, state("old_shuffled.bin", shuffle=1))
        check("state file in shuffled windows: no sequence position continues it", rc == 0 and out == "shuffled windows\n",
              (out + err).strip()[:100])
    finish()


if __name__ == "__main__":
    main()
