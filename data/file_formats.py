"""file_formats.py: every binary file's 256-int32 header, field by field, as the C++ side declares it
(checkpoint.h: ModelFileHeader, LlmcModelHeader, TrainStateHeader, ReferenceHeader; fileio.h:
TokenFileHeader, TokenizerHeader; evaluation.h: EvalFileHeader). numpy only, so the data scripts need
no torch.

    header = MODEL_FILE.pack(L=12, NH=12, ...)   # an int32 array of 256, magic and version filled in
    fields = MODEL_FILE.unpack(data)             # {field: value} from 1024 bytes (or more)

test/test_formats.py checks that both sides write the same bytes for the same values
(test/checkpoint_tool.cu formats) and that the parameter list below is model_config.h's.
"""
import zlib

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS

MODEL_FILE_MAGIC, MODEL_FILE_VERSION = 20251101, 1
TRAIN_STATE_MAGIC, TRAIN_STATE_VERSION = 20251103, 2
REFERENCE_MAGIC, REFERENCE_VERSION = 20251102, 1
LLMC_MODEL_MAGIC, LLMC_MODEL_VERSIONS = 20240326, {3: "fp32", 5: "bf16"}
TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
EVAL_FILE_MAGIC, EVAL_FILE_VERSION = 20240522, 1

_WIDTH = {"i4": 1, "u4": 1, "f4": 1, "i8": 2, "u8": 2}  # int32 slots


class Header:
    """A header's fields: (name, slot, type), the type a numpy dtype code; 8-byte fields take two slots."""

    def __init__(self, name, magic, version, fields):
        self.name, self.magic, self.version = name, magic, version
        self.fields = [("magic", 0, "i4"), ("version", 1, "i4")] + list(fields)
        taken = set()
        for field, slot, kind in self.fields:
            for s in range(slot, slot + _WIDTH[kind]):
                assert s < HEADER_INTS and s not in taken, f"{name}.{field} overlaps"
                taken.add(s)

    def slot(self, field):
        return next(slot for name, slot, _ in self.fields if name == field)

    def pack(self, **values):
        """The header as 256 int32, every field not given 0 (magic and version: this format's)."""
        values = {"magic": self.magic, "version": self.version, **values}
        unknown = set(values) - {name for name, _, _ in self.fields}
        assert not unknown, f"{self.name} has no field {sorted(unknown)}"
        raw = bytearray(HEADER_BYTES)
        for field, slot, kind in self.fields:
            if field in values:
                raw[4 * slot:4 * (slot + _WIDTH[kind])] = np.array([values[field]], dtype="<" + kind).tobytes()
        return np.frombuffer(bytes(raw), dtype=np.int32).copy()

    def unpack(self, data):
        """{field: value} of the first HEADER_BYTES of `data` (bytes or a numpy array)."""
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        if len(raw) < HEADER_BYTES:
            raise ValueError(f"{self.name} header: {len(raw)} bytes, expected {HEADER_BYTES}")
        out = {}
        for field, slot, kind in self.fields:
            value = np.frombuffer(raw, dtype="<" + kind, count=1, offset=4 * slot)[0]
            out[field] = float(value) if kind == "f4" else int(value)
        return out


MODEL_FILE = Header("model", MODEL_FILE_MAGIC, MODEL_FILE_VERSION, [
    ("L", 2, "i4"), ("NH", 3, "i4"), ("C", 4, "i4"), ("maxT", 5, "i4"), ("V", 6, "i4"), ("Vp", 7, "i4"),
    ("crc", 8, "u4")])  # crc32 of the header (with crc 0) and the parameters; 0 = not recorded
LLMC_MODEL = Header("llmc_model", LLMC_MODEL_MAGIC, 3, [
    ("maxT", 2, "i4"), ("V", 3, "i4"), ("L", 4, "i4"), ("NH", 5, "i4"), ("C", 6, "i4"), ("Vp", 7, "i4")])
TRAIN_STATE = Header("train_state", TRAIN_STATE_MAGIC, TRAIN_STATE_VERSION, [
    ("step", 2, "i4"), ("B", 3, "i4"), ("T", 4, "i4"), ("crc", 5, "u4"), ("num_params", 8, "u8"),
    ("loader_epoch", 10, "u8"), ("loader_cursor", 12, "u8"), ("sampler_rng", 14, "u8"), ("seed", 16, "i8"),
    ("shuffle", 18, "i4"), ("data_crc", 19, "u4"), ("data_tokens", 20, "u8"), ("gelu_fusion", 22, "i4"),
    ("recompute", 23, "i4"), ("total_batch", 24, "u8"), ("head", 26, "i4"),
    ("outlier_bytes", 27, "u4"), ("fp8", 28, "i4"),  # bytes of OUTLIER_WINDOWS after the three arrays (0: a file from before them)
    ("fp8_history_bytes", 29, "u4"), ("fp8_history_steps", 30, "i8"),  # -f8 1's amax history (fp32) after the windows, and its steps
    ("cursor_unit", 255, "i4")])
# TRAIN_STATE's cursor_unit: what loader_cursor counts (0 in files written before it was recorded).
CURSOR_WINDOWS, CURSOR_SEQUENCES = 0, 1
REFERENCE = Header("reference", REFERENCE_MAGIC, REFERENCE_VERSION, [
    ("B", 2, "i4"), ("T", 3, "i4"), ("K", 4, "i4"), ("L", 5, "i4"), ("NH", 6, "i4"), ("C", 7, "i4"),
    ("maxT", 8, "i4"), ("V", 9, "i4"), ("Vp", 10, "i4"), ("lr", 16, "f4"), ("beta1", 17, "f4"),
    ("beta2", 18, "f4"), ("eps", 19, "f4"), ("weight_decay", 20, "f4"), ("clip", 21, "f4")])
TOKEN_FILE = Header("token_file", TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION, [("count", 2, "i4")])
TOKENIZER = Header("tokenizer", TOKENIZER_MAGIC, TOKENIZER_VERSION, [("vocab_size", 2, "i4"), ("eot_token", 3, "i4")])
# llm.c's eval file (data/eval_file.py); longest_example_bytes: the largest example's size in bytes.
EVAL_FILE = Header("eval_file", EVAL_FILE_MAGIC, EVAL_FILE_VERSION, [
    ("examples", 2, "i4"), ("longest_example_bytes", 3, "i4")])
FORMATS = [MODEL_FILE, LLMC_MODEL, TRAIN_STATE, REFERENCE, TOKEN_FILE, TOKENIZER, EVAL_FILE]

# The train-state file's last section (outlier_guard.h's OutlierWindows): the outlier guard's window of
# the loss, then of the gradient norm, each its count of values held, the slot of the next value and
# the 128 slots.
OUTLIER_WINDOW = 128
OUTLIER_WINDOWS = np.dtype([(name, [("count", "<i4"), ("next", "<i4"), ("values", "<f8", (OUTLIER_WINDOW,))])
                            for name in ("loss", "norm")])


def split_train_state(data):
    """A train-state file's bytes in its parts: (header fields, the three fp32 arrays, the outlier windows,
    the FP8 amax history), the last two located by the header's outlier_bytes and fp8_history_bytes."""
    fields = TRAIN_STATE.unpack(data)
    end = len(data) - fields["fp8_history_bytes"]
    start = end - fields["outlier_bytes"]
    return fields, bytes(data[HEADER_BYTES:start]), bytes(data[start:end]), bytes(data[end:])


def join_train_state(fields, arrays, outliers=b"", history=b"", fix_crc=True):
    """A train-state file's bytes from its parts, the header's fields as given (outlier_bytes and
    fp8_history_bytes too: a test may claim sizes the parts do not have) but its crc: checkpoint.h's, over
    the header with crc 0 and the rest (fix_crc; else 0)."""
    fields = dict(fields, crc=0)
    body = bytes(arrays) + bytes(outliers) + bytes(history)
    if fix_crc:
        fields["crc"] = zlib.crc32(body, zlib.crc32(TRAIN_STATE.pack(**fields).tobytes()))
    return TRAIN_STATE.pack(**fields).tobytes() + body

# The model's parameter tensors, as model_config.h's GPT_PARAMETER_TENSORS: (name, rows, cols as
# functions of the config (cols None: a vector), weight decay, per layer (stacked over L), init). The
# order is the flat buffer's and every file's.
PARAMETER_TENSORS = [
    ("wte", lambda c: c.Vp, lambda c: c.C, True, False, "normal"),
    ("wpe", lambda c: c.maxT, lambda c: c.C, True, False, "normal"),
    ("ln1w", lambda c: c.C, None, False, True, "ones"),
    ("ln1b", lambda c: c.C, None, False, True, "zeros"),
    ("qkvw", lambda c: 3 * c.C, lambda c: c.C, True, True, "normal"),
    ("qkvb", lambda c: 3 * c.C, None, False, True, "zeros"),
    ("attprojw", lambda c: c.C, lambda c: c.C, True, True, "residual_normal"),
    ("attprojb", lambda c: c.C, None, False, True, "zeros"),
    ("ln2w", lambda c: c.C, None, False, True, "ones"),
    ("ln2b", lambda c: c.C, None, False, True, "zeros"),
    ("fcw", lambda c: 4 * c.C, lambda c: c.C, True, True, "normal"),
    ("fcb", lambda c: 4 * c.C, None, False, True, "zeros"),
    ("fcprojw", lambda c: c.C, lambda c: 4 * c.C, True, True, "residual_normal"),
    ("fcprojb", lambda c: c.C, None, False, True, "zeros"),
    ("lnfw", lambda c: c.C, None, False, False, "ones"),
    ("lnfb", lambda c: c.C, None, False, False, "zeros"),
]


def param_shapes(cfg):
    """(name, shape) in file order: (L, rows[, cols]) for per-layer tensors, (rows[, cols]) else."""
    out = []
    for name, rows, cols, _, per_layer, _ in PARAMETER_TENSORS:
        shape = (rows(cfg),) if cols is None else (rows(cfg), cols(cfg))
        out.append((name, (cfg.L,) + shape if per_layer else shape))
    return out


DECAYED = {t[0] for t in PARAMETER_TENSORS if t[3]}
PER_LAYER = {t[0] for t in PARAMETER_TENSORS if t[4]}
