"""Small input files for the train_gpt tests (test/test_train_cli.sh, test/test_resume.sh).

Not a test itself (run_tests.sh runs test_*.py only). numpy only, so it starts fast. Subcommands:

  tokens OUT N [--vocab V] [--seed S]      token file (data/file_formats.py's TOKEN_FILE header,
                                            then uint16 tokens): N learnable tokens below V
  tokenizer OUT V [--version 1|2]          tokenizer file (TOKENIZER: version, V, eot = V-1; then
                                            per token a uint8 length and its bytes)
  model-crc IN OUT                         a model checkpoint as train_gpt writes it: IN (e.g. from
                                            gpt_reference.py, crc 0) with its crc field set
  state OUT MODEL STEP B T --data TOKENS [--epoch E] [--cursor K] [--seed S] [--shuffle 0|1] [--ge G] [--r R]
        [--f8 F] [--total-batch D] [--windows]
                                            a training-state file for the model checkpoint MODEL, as
                                            train_gpt writes it (master = MODEL's parameters, AdamW
                                            m = v = 0, its crc field set; no outlier windows, as before
                                            the outlier guard: they load empty) for a run of -b B -t T
                                            -sd S (default 1337) -sh (default 1) -ge G -r R -f8 F (defaults: the
                                            bf16 build's, 2, 0 and 0) -d D (default B*T) on the token file
                                            TOKENS, at data position (E, K) in sequences; --windows: as
                                            an older train_gpt wrote it, K in windows of B*T tokens
  edit IN OUT [--flip OFFSET [--xor MASK]] [--drop N] [--append N] [--set-int SLOT=VALUE] [--set-float I=VALUE]
                                            a damaged copy: XOR MASK (default 1) into the byte at OFFSET (negative
                                            counts from the end), drop the last N bytes, append N zero
                                            bytes, set header int32 SLOT, set float I of the payload
"""

import argparse
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
import file_formats as ff  # noqa: E402

HEADER_INTS, HEADER_BYTES = ff.HEADER_INTS, ff.HEADER_BYTES


def write(path, *chunks):
    with open(path, "wb") as f:
        for c in chunks:
            f.write(np.ascontiguousarray(c).tobytes())


def cmd_tokens(a):
    # A noisy repeating sequence: a model can learn it, so losses move from step to step.
    rng = np.random.default_rng(a.seed)
    period = min(97, a.vocab)
    base = (np.arange(a.n) * 7919 % period) * (a.vocab // period)
    noise = rng.integers(0, a.vocab, a.n)
    tokens = np.where(rng.random(a.n) < 0.1, noise, base).astype(np.uint16)
    write(a.out, ff.TOKEN_FILE.pack(count=a.n), tokens)


def cmd_tokenizer(a):
    header = ff.TOKENIZER.pack(version=a.version, vocab_size=a.vocab, eot_token=a.vocab - 1 if a.version == 2 else 0)
    body = bytearray()
    for i in range(a.vocab):
        piece = (" t%d" % i).encode()
        body += bytes([len(piece)]) + piece
    write(a.out, header, np.frombuffer(bytes(body), np.uint8))


def cmd_model_crc(a):
    data = bytearray(open(a.inp, "rb").read())
    fields = ff.MODEL_FILE.unpack(data)
    fields["crc"] = 0
    header = ff.MODEL_FILE.pack(**fields)
    fields["crc"] = zlib.crc32(bytes(data[HEADER_BYTES:]), zlib.crc32(header.tobytes()))
    write(a.out, ff.MODEL_FILE.pack(**fields), np.frombuffer(bytes(data[HEADER_BYTES:]), np.uint8))


def cmd_state(a):
    data = open(a.model, "rb").read()
    params = np.frombuffer(data[HEADER_BYTES:], np.float32)
    n = params.size
    tokens = open(a.data, "rb").read()[HEADER_BYTES:]
    fields = dict(step=a.step, B=a.B, T=a.T, num_params=n, loader_epoch=a.epoch, loader_cursor=a.cursor,
                  sampler_rng=12345, seed=a.seed, shuffle=a.shuffle, data_crc=zlib.crc32(tokens),
                  data_tokens=len(tokens) // 2, gelu_fusion=a.ge, recompute=a.r, fp8=a.f8, total_batch=a.total_batch or a.B * a.T,
                  cursor_unit=ff.CURSOR_WINDOWS if a.windows else ff.CURSOR_SEQUENCES)
    zeros = np.zeros(n, np.float32)
    data = ff.join_train_state(fields, params.tobytes() + zeros.tobytes() + zeros.tobytes())
    write(a.out, np.frombuffer(data, np.uint8))


def cmd_edit(a):
    data = bytearray(open(a.inp, "rb").read())
    for spec in a.set_int or []:
        slot, value = (int(x) for x in spec.split("="))
        data[4 * slot:4 * slot + 4] = np.array([value], np.int32).tobytes()
    for spec in a.set_float or []:
        i, value = spec.split("=")
        at = HEADER_BYTES + 4 * int(i)
        data[at:at + 4] = np.array([float(value)], np.float32).tobytes()
    if a.flip is not None:
        data[a.flip] ^= a.xor
    if a.drop:
        del data[len(data) - a.drop:]
    if a.append:
        data += bytes(a.append)
    open(a.out, "wb").write(bytes(data))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("tokens")
    q.add_argument("out")
    q.add_argument("n", type=int)
    q.add_argument("--vocab", type=int, default=1237)
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(fn=cmd_tokens)
    q = sub.add_parser("tokenizer")
    q.add_argument("out")
    q.add_argument("vocab", type=int)
    q.add_argument("--version", type=int, default=2)
    q.set_defaults(fn=cmd_tokenizer)
    q = sub.add_parser("model-crc")
    q.add_argument("inp")
    q.add_argument("out")
    q.set_defaults(fn=cmd_model_crc)
    q = sub.add_parser("state")
    q.add_argument("out")
    q.add_argument("model")
    for name in ("step", "B", "T"):
        q.add_argument(name, type=int)
    q.add_argument("--epoch", type=int, default=0)
    q.add_argument("--cursor", type=int, default=0)
    q.add_argument("--data", required=True)
    q.add_argument("--seed", type=int, default=1337)
    q.add_argument("--shuffle", type=int, default=1)
    q.add_argument("--ge", type=int, default=2)
    q.add_argument("--r", type=int, default=0)
    q.add_argument("--f8", type=int, default=0)
    q.add_argument("--total-batch", type=int, default=0)
    q.add_argument("--windows", action="store_true")
    q.set_defaults(fn=cmd_state)
    q = sub.add_parser("edit")
    q.add_argument("inp")
    q.add_argument("out")
    q.add_argument("--flip", type=int)
    q.add_argument("--xor", type=int, default=1)
    q.add_argument("--drop", type=int, default=0)
    q.add_argument("--append", type=int, default=0)
    q.add_argument("--set-int", action="append")
    q.add_argument("--set-float", action="append")
    q.set_defaults(fn=cmd_edit)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
