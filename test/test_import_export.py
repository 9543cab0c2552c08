"""gpt_reference.py import / export: our checkpoint <-> Hugging Face files and llm.c model files.

CPU only, a few seconds. Round trips compare whole checkpoint files byte for byte (header, crc32 and
every parameter); the formats are also checked against layouts this test builds itself with numpy
(Hugging Face's Conv1D (in, out) weights, llm.c's header and bf16 rounding), not only against our
writer. Then broken, truncated and mismatched inputs (also a FIFO, config.json values of the wrong
type, non-finite parameters) must fail with one `error:` line, exit code 1. Also: config.json settings
that change the maths are refused by name (the harmless ones imported); files shorter than a header,
of any size; damaged safetensors files never reach PyTorch's pickle reader; sharded weights (an index
and its shards) import; a GPT-2-vocabulary export holds the tokenizer's files; and no output replaces
an input, nor an existing file without --force, nor leaves a temporary file.
Ends with `N passed, N failed, N skipped`.
"""

import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import ROOT, check, finish, one_line_error, ref_cli, ref_process  # noqa: E402

import torch  # noqa: E402
import gpt_reference as ref  # noqa: E402

CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def payload(path):
    return np.frombuffer(read(path)[1024:], dtype=np.float32)


def header(path):
    return np.frombuffer(read(path)[:1024], dtype=np.int32)


def hf_state_dict(ckpt, prefix="transformer."):
    """The Hugging Face state dict of a checkpoint, built here from the file's bytes and the
    documented layout (not with gpt_reference's writer)."""
    cfg, params = ref.read_checkpoint_params(ckpt)
    sd = {prefix + "wte.weight": params["wte"][:cfg.V], prefix + "wpe.weight": params["wpe"],
          prefix + "ln_f.weight": params["lnfw"], prefix + "ln_f.bias": params["lnfb"]}
    names = {"ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
             "attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w",
             "ln_2.bias": "ln2b", "mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw",
             "mlp.c_proj.bias": "fcprojb"}
    for i in range(cfg.L):
        for hf, ours in names.items():
            sd[f"{prefix}h.{i}.{hf}"] = params[ours][i].T if hf in CONV1D else params[ours][i]
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def bf16_round(a):
    """fp32 -> bf16 -> fp32 with round to nearest even, by bit arithmetic (finite values)."""
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def expect_error(what, args, mention=""):
    rc, _, err = ref_cli(args)
    ok, line = one_line_error(rc, err, mention)
    check(what, ok and "Traceback" not in err, line)


def main():
    from safetensors.torch import load_file, save_file
    holder = tempfile.TemporaryDirectory(prefix="test_import_export.")
    tmp = holder.name
    p = lambda *names: os.path.join(tmp, *names)  # noqa: E731
    odd = p("odd.ckpt")      # C=39, 3 heads of 13: only config.json can say NH
    wide = p("wide.ckpt")    # C=128: NH=2 is inferred from heads of 64 without config.json
    ref_cli(["init", "--model", "L=2,NH=3,C=39,V=1237,maxT=50", "--seed", "1", "--out", odd])
    ref_cli(["init", "--model", "L=2,NH=2,C=128,V=1000,maxT=32", "--seed", "2", "--out", wide])

    print("our checkpoints carry a crc32")
    h = header(odd).copy()
    stored = int(h.view(np.uint32)[8])
    h[8] = 0
    want = zlib.crc32(read(odd)[1024:], zlib.crc32(h.tobytes()))
    check("header[8] == zlib.crc32(header with [8] = 0, then the payload)", stored == want and stored != 0,
          f"{stored:08x} vs {want:08x}")
    flipped = bytearray(read(odd))
    flipped[5000] ^= 1
    write(p("flipped.ckpt"), bytes(flipped))
    expect_error("a flipped payload byte fails the crc32 check", ["export", p("flipped.ckpt"), "--out", p("x")], "crc32")
    nocrc = bytearray(read(odd))
    nocrc[32:36] = bytes(4)
    write(p("nocrc.ckpt"), bytes(nocrc))
    rc, _, err = ref_cli(["import", p("nocrc.ckpt"), "--out", p("nocrc2.ckpt")])
    check("crc32 0 (not recorded) is accepted; rewriting records it", rc == 0 and read(p("nocrc2.ckpt")) == read(odd),
          err.strip()[:80])

    print("Hugging Face: export")
    rc, out, err = ref_cli(["export", odd, "--out", p("hf_odd")])
    check("export to a folder: config.json, generation_config.json, model.safetensors",
          rc == 0 and sorted(os.listdir(p("hf_odd"))) == ["config.json", "generation_config.json", "model.safetensors"],
          (out + err).strip()[:80])
    check("  V=1237 is not GPT-2's vocabulary: no tokenizer files, and a warning says so",
          "warning: no tokenizer files" in err and "V=1237" in err, err.strip()[:80])
    config = json.load(open(p("hf_odd", "config.json")))
    want = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 3, "n_embd": 39,
            "n_positions": 50, "n_ctx": 50, "vocab_size": 1237, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    bad = {k: config.get(k) for k, v in want.items() if config.get(k) != v}
    check("config.json: GPT2LMHeadModel, n_layer 2, n_head 3, n_embd 39, ...", not bad, f"differs: {bad}" if bad else "")
    got, expected = load_file(p("hf_odd", "model.safetensors")), hf_state_dict(odd)
    same = sorted(got) == sorted(expected) and all(
        got[k].dtype == torch.float32 and torch.equal(got[k], expected[k]) for k in expected)
    check("model.safetensors == the layout built here (transformer., Conv1D (in, out))", same,
          f"{len(got)} tensors; wte {tuple(got['transformer.wte.weight'].shape)}, c_attn "
          f"{tuple(got['transformer.h.0.attn.c_attn.weight'].shape)}")
    check("no lm_head.weight (tied to wte: saved once)", not any("lm_head" in k for k in got))

    print("Hugging Face: import")
    rc, _, err = ref_cli(["import", p("hf_odd"), "--out", p("back.ckpt")])
    check("folder (model.safetensors + config.json) -> identical checkpoint", rc == 0 and read(p("back.ckpt")) == read(odd),
          err.strip()[:80])
    os.makedirs(p("plain"))
    sd = hf_state_dict(odd, prefix="")
    sd.update({f"h.{i}.attn.bias": torch.tril(torch.ones(1, 1, 50, 50)) for i in range(2)})  # older files' buffers
    save_file(sd, p("plain", "model.safetensors"), metadata={"format": "pt"})
    write(p("plain", "config.json"), read(p("hf_odd", "config.json")))
    rc, _, err = ref_cli(["import", p("plain", "model.safetensors"), "--out", p("plain.ckpt")])
    check("keys without transformer., attn.bias buffers ignored -> identical", rc == 0 and read(p("plain.ckpt")) == read(odd),
          err.strip()[:80])
    os.makedirs(p("bin"))
    sd = hf_state_dict(odd)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    sd.update({f"transformer.h.{i}.attn.masked_bias": torch.tensor(-1e4) for i in range(2)})
    torch.save(sd, p("bin", "pytorch_model.bin"))
    write(p("bin", "config.json"), read(p("hf_odd", "config.json")))
    rc, _, err = ref_cli(["import", p("bin"), "--out", p("bin.ckpt")])
    check("pytorch_model.bin (tied lm_head.weight, masked_bias) -> identical", rc == 0 and read(p("bin.ckpt")) == read(odd),
          err.strip()[:80])
    os.makedirs(p("noconfig"))
    torch.save(hf_state_dict(wide, prefix=""), p("noconfig", "pytorch_model.bin"))
    rc, _, err = ref_cli(["import", p("noconfig", "pytorch_model.bin"), "--out", p("noconfig.ckpt")])
    check("no config.json: L, C, maxT, V from shapes, NH = C/64 -> identical",
          rc == 0 and read(p("noconfig.ckpt")) == read(wide), err.strip()[:80])
    write(p("noconfig", "config.json"), json.dumps({"n_layer": 2, "n_head": 4, "n_embd": 128, "n_positions": 32,
                                                     "vocab_size": 1000}).encode())
    rc, _, err = ref_cli(["import", p("noconfig"), "--out", p("nh4.ckpt")])
    check("config.json beside it is read: n_head 4 (not the inferred 2)", rc == 0 and header(p("nh4.ckpt"))[3] == 4
          and read(p("nh4.ckpt"))[1024:] == read(wide)[1024:], f"header NH {header(p('nh4.ckpt'))[3] if rc == 0 else '?'}")
    rc, _, err = ref_cli(["export", odd, "--out", p("hf_bf16"), "--dtype", "bf16"])
    rc2, _, err2 = ref_cli(["import", p("hf_bf16"), "--out", p("hf_bf16.ckpt")])
    ok = rc == rc2 == 0 and np.array_equal(payload(p("hf_bf16.ckpt")), bf16_round(payload(odd)))
    check("bf16 safetensors: import == our parameters rounded to bf16", ok, (err + err2).strip()[:80])

    print("llm.c model files")
    rc, _, err = ref_cli(["export", odd, "--out", p("odd.v3.bin"), "--format", "llmc"])
    h = header(p("odd.v3.bin"))
    check("v3 header: 20240326, 3, maxT 50, V 1237, L 2, NH 3, C 39, Vp 1280",
          rc == 0 and list(h[:8]) == [20240326, 3, 50, 1237, 2, 3, 39, 1280] and not h[8:].any(), f"{list(h[:8])}")
    check("v3 parameters == ours, same order, bit for bit", read(p("odd.v3.bin"))[1024:] == read(odd)[1024:])
    rc, _, err = ref_cli(["import", p("odd.v3.bin"), "--out", p("v3.ckpt")])
    check("v3 -> import -> identical checkpoint", rc == 0 and read(p("v3.ckpt")) == read(odd), err.strip()[:80])
    made = np.zeros(256, np.int32)  # an llm.c file made here, from the documented header
    made[:8] = 20240326, 3, 32, 1000, 2, 2, 128, 1024
    write(p("made.v3.bin"), made.tobytes() + read(wide)[1024:])
    rc, _, err = ref_cli(["import", p("made.v3.bin"), "--out", p("made.ckpt")])
    check("an llm.c v3 file built here -> import -> identical", rc == 0 and read(p("made.ckpt")) == read(wide),
          err.strip()[:80])
    rc, _, err = ref_cli(["export", odd, "--out", p("odd.v5.bin"), "--format", "llmc", "--dtype", "bf16"])
    h = header(p("odd.v5.bin"))
    bits = np.frombuffer(read(p("odd.v5.bin"))[1024:], dtype=np.uint16)
    want = (bf16_round(payload(odd)).view(np.uint32) >> 16).astype(np.uint16)
    check("v5 header (version 5) and bf16 parameters == round to nearest even",
          rc == 0 and h[1] == 5 and list(h[2:8]) == [50, 1237, 2, 3, 39, 1280] and np.array_equal(bits, want),
          f"{bits.size} values")
    rc, _, err = ref_cli(["import", p("odd.v5.bin"), "--out", p("v5.ckpt")])
    a, b = payload(p("v5.ckpt")), payload(odd)
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))
    check("v5 -> import: within bf16 rounding (relative error <= 2^-8)", rc == 0 and rel <= 2.0**-8,
          f"worst {rel:.2e}, bound {2.0**-8:.2e}")
    rc, _, _ = ref_cli(["export", p("v5.ckpt"), "--out", p("again.v5.bin"), "--format", "llmc", "--dtype", "bf16"])
    rc2, _, _ = ref_cli(["import", p("again.v5.bin"), "--out", p("again.ckpt")])
    check("second round trip v5 -> ours -> v5 -> ours: bit for bit",
          rc == rc2 == 0 and read(p("again.v5.bin")) == read(p("odd.v5.bin")) and read(p("again.ckpt")) == read(p("v5.ckpt")))
    rc, out, err = ref_cli(["generate", "-e", p("hf_odd"), "-n", "1"])
    check("import's readers serve other subcommands (generate on a HF folder reads it)",
          rc == 1 and "V=1237" in err, err.strip()[:80])

    print("broken inputs: one `error:` line, exit code 1")
    good_st, good_bin, v3 = read(p("hf_odd", "model.safetensors")), read(p("bin", "pytorch_model.bin")), read(p("odd.v3.bin"))
    os.makedirs(p("broken"))
    b = lambda name, data: write(p("broken", name), data)  # noqa: E731
    expect_error("missing file", ["import", p("nope.bin"), "--out", p("x.ckpt")], "nope.bin")
    expect_error("garbage bytes", ["import", b("garbage.bin", os.urandom(3000)), "--out", p("x.ckpt")], "not a model file")
    expect_error("empty file", ["import", b("empty.bin", b""), "--out", p("x.ckpt")], "not a model file")
    expect_error("folder without model files", ["import", p("broken"), "--out", p("x.ckpt")], "model.safetensors")
    expect_error("llm.c v3 truncated", ["import", b("trunc.v3.bin", v3[:-4]), "--out", p("x.ckpt")], "truncated")
    expect_error("llm.c header only", ["import", b("hdr.v3.bin", v3[:1024]), "--out", p("x.ckpt")], "bytes")
    v7 = bytearray(v3)
    v7[4:8] = np.int32(7).tobytes()
    expect_error("llm.c version 7 (quantized)", ["import", b("v7.bin", bytes(v7)), "--out", p("x.ckpt")], "version 7")
    nh = bytearray(v3)
    nh[20:24] = np.int32(5).tobytes()  # NH=5 does not divide C=39
    expect_error("llm.c header with NH not dividing C", ["import", b("nh5.bin", bytes(nh)), "--out", p("x.ckpt")],
                 "invalid model config")
    os.makedirs(p("broken", "st"))
    write(p("broken", "st", "config.json"), read(p("hf_odd", "config.json")))
    expect_error("model.safetensors truncated",
                 ["import", write(p("broken", "st", "model.safetensors"), good_st[:-100]), "--out", p("x.ckpt")], "safetensors")
    expect_error("pytorch_model.bin truncated",
                 ["import", b("pytorch_model.bin", good_bin[: len(good_bin) // 2]), "--out", p("x.ckpt")], "state dict")
    torch.save([torch.zeros(3)], p("broken", "list.bin"))
    expect_error("a pickled list, not a state dict", ["import", p("broken", "list.bin"), "--out", p("x.ckpt")], "list")

    def variant(name, edit, config=None):
        os.makedirs(p("broken", name))
        sd = hf_state_dict(odd)
        edit(sd)
        save_file(sd, p("broken", name, "model.safetensors"), metadata={"format": "pt"})
        cfg = json.load(open(p("hf_odd", "config.json")))
        cfg.update(config or {})
        write(p("broken", name, "config.json"), json.dumps(cfg).encode())
        return p("broken", name)

    expect_error("a tensor missing", ["import", variant("missing", lambda sd: sd.pop("transformer.h.1.mlp.c_fc.bias")),
                                      "--out", p("x.ckpt")], "h.1.mlp.c_fc.bias")
    expect_error("a tensor of the wrong shape (not transposed)",
                 ["import", variant("shape", lambda sd: sd.update({"transformer.h.0.attn.c_attn.weight":
                                                                   sd["transformer.h.0.attn.c_attn.weight"].t().contiguous()})),
                  "--out", p("x.ckpt")], "shape")
    expect_error("config.json says 3 layers, the file has 2",
                 ["import", variant("layers3", lambda sd: None, {"n_layer": 3}), "--out", p("x.ckpt")], "h.2")
    expect_error("config.json says 1 layer, the file has 2",
                 ["import", variant("layers1", lambda sd: None, {"n_layer": 1}), "--out", p("x.ckpt")], "n_layer=1")
    expect_error("config.json with another activation",
                 ["import", variant("relu", lambda sd: None, {"activation_function": "relu"}), "--out", p("x.ckpt")], "relu")
    untied = lambda sd: sd.update({"lm_head.weight": sd["transformer.wte.weight"] + 1})  # noqa: E731
    expect_error("an untied lm_head.weight", ["import", variant("untied", untied), "--out", p("x.ckpt")], "lm_head")
    d = variant("badjson", lambda sd: None)
    write(os.path.join(d, "config.json"), b"{not json")
    expect_error("config.json not JSON", ["import", d, "--out", p("x.ckpt")], "config.json")
    for what, value, mention in (("layer_norm_epsilon a string", {"layer_norm_epsilon": "x"}, "layer_norm_epsilon"),
                                 ("layer_norm_epsilon NaN", {"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
                                 ("n_layer 2.5", {"n_layer": 2.5}, "n_layer"),
                                 ("n_embd 1e30 (beyond train_gpt's limits)", {"n_embd": 1e30}, "invalid model config")):
        name = "cfg_" + "".join(c for c in what if c.isalnum())
        expect_error(f"config.json {what}", ["import", variant(name, lambda sd: None, value), "--out", p("x.ckpt")],
                     mention)
    d = variant("cfg_list", lambda sd: None)
    write(os.path.join(d, "config.json"), b"[1, 2]")
    expect_error("config.json a list, not an object", ["import", d, "--out", p("x.ckpt")], "config.json")
    nan_bias = lambda sd: sd["transformer.h.1.mlp.c_fc.bias"].__setitem__(7, float("nan"))  # noqa: E731
    expect_error("a NaN parameter (Hugging Face)", ["import", variant("nan", nan_bias), "--out", p("x.ckpt")],
                 "non-finite parameter: nan in fcb")
    cfg, params = ref.read_checkpoint_params(odd)
    params = {k: v.copy() for k, v in params.items()}
    params["wpe"][3, 4] = -np.inf
    ref.write_llmc(cfg, params, p("broken", "inf.v3.bin"), "fp32")
    expect_error("an -inf parameter (llm.c v3)", ["import", p("broken", "inf.v3.bin"), "--out", p("x.ckpt")],
                 "non-finite parameter: -inf in wpe")
    ref.write_checkpoint_params(cfg, params, p("broken", "inf.ckpt"))
    expect_error("an -inf parameter (our checkpoint)", ["export", p("broken", "inf.ckpt"), "--out", p("y")],
                 f"its element {3 * 39 + 4}, index {1280 * 39 + 3 * 39 + 4} of all")
    os.mkfifo(p("broken", "fifo.bin"))
    try:  # its own process: a reader that opened the FIFO would block this test
        r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt_reference.py"), "import", p("broken", "fifo.bin"),
                            "--out", p("x.ckpt")], capture_output=True, text=True, timeout=120)
        ok, line = one_line_error(r.returncode, r.stderr, "not a regular file")
    except subprocess.TimeoutExpired:
        ok, line = False, "still running after 120 s"
    check("import a FIFO: returns at once, one line", ok, line)
    expect_error("export of a truncated checkpoint", ["export", b("t.ckpt", read(odd)[:-8]), "--out", p("y")], "bytes")
    expect_error("export --format zip", ["export", odd, "--out", p("y"), "--format", "zip"], "--format")
    check("no failed run left a checkpoint behind", not os.path.exists(p("x.ckpt")))
    rc, out, err = ref_process(["import", p("broken", "garbage.bin"), "--out", p("x.ckpt")])
    ok, line = one_line_error(rc, err, "not a model file")
    check("the same as its own process: exit code 1, one line, no traceback", ok and "Traceback" not in err, line)
    rc, out, err = ref_process(["import", "-h"])
    check("import -h and export -h print usage", rc == 0 and out.startswith("usage:") and
          ref_process(["export", "-h"])[1].startswith("usage:"))

    config_maths(p, odd, variant)
    short_files(p, odd)
    damaged_safetensors(p, good_st)
    sharded(p, odd)
    tokenizer_files(p)
    overwrites(p, odd)
    holder.cleanup()
    finish()


def config_maths(p, odd, variant):
    print("config.json settings that change the maths: refused by name; the others honoured")
    for what, value in (("scale_attn_by_inverse_layer_idx", {"scale_attn_by_inverse_layer_idx": True}),
                        ("scale_attn_weights", {"scale_attn_weights": False}),
                        ("activation_function", {"activation_function": "gelu"}),
                        ("layer_norm_epsilon", {"layer_norm_epsilon": 1e-6}),
                        ("n_inner", {"n_inner": 100}),
                        ("add_cross_attention", {"add_cross_attention": True}),
                        ("model_type", {"model_type": "gpt_neo"})):
        folder = variant("maths_" + what, lambda sd: None, value)
        rc, _, err = ref_cli(["import", folder, "--out", p("x.ckpt")])
        ok, line = one_line_error(rc, err, what)
        check(f"{what} {json.dumps(list(value.values())[0])}: refused by name", ok and "maths" in err, line)
    # reorder_and_upcast_attn computes the same function in fp32 (as ours does): accepted. The tanh
    # GELU under its other names, and the defaults written out, are ours.
    for what, value in (("reorder_and_upcast_attn true", {"reorder_and_upcast_attn": True}),
                        ("activation_function gelu_pytorch_tanh", {"activation_function": "gelu_pytorch_tanh"}),
                        ("activation_function gelu_fast", {"activation_function": "gelu_fast"}),
                        ("the defaults written out", {"scale_attn_weights": True, "n_inner": 4 * 39,
                                                      "scale_attn_by_inverse_layer_idx": False})):
        name = "ok_" + "".join(c for c in what if c.isalnum())
        out = p(name + ".ckpt")
        rc, _, err = ref_cli(["import", variant(name, lambda sd: None, value), "--out", out])
        check(f"{what}: imported, identical checkpoint", rc == 0 and read(out) == read(odd), err.strip()[:80])
    exported = json.load(open(p("hf_odd", "config.json")))
    check("export's config.json states scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn false",
          exported.get("scale_attn_by_inverse_layer_idx") is False and exported.get("reorder_and_upcast_attn") is False
          and exported.get("scale_attn_weights") is True)


def short_files(p, odd):
    print("files shorter than a header (any size, not only multiples of 4): one line, no traceback")
    os.makedirs(p("short"))
    magic = read(odd)[:4]
    for what, data, mention in (("13 bytes starting with our checkpoint's magic (ours)", magic + b"x" * 9, "truncated"),
                                ("13 bytes starting with llm.c's magic", np.int32(20240326).tobytes() + b"x" * 9,
                                 "truncated"),
                                ("1023 bytes of our checkpoint (ours)", read(odd)[:1023], "truncated"),
                                ("201 bytes of zeros", bytes(201), "not a model file")):
        path = write(p("short", "".join(c for c in what if c.isalnum()) + ".bin"), data)
        for command in (["import", path, "--out", p("x.ckpt")], ["export", path, "--out", p("y")],
                        ["loss", "--checkpoint", path]):
            rc, _, err = ref_cli(command)
            want = "not a checkpoint" if command[0] == "loss" and "ours" not in what else mention
            ok, line = one_line_error(rc, err, want)
            check(f"{command[0]}: {what}", ok and path in err and "Traceback" not in err, line)


def damaged_safetensors(p, good_st):
    print("damaged safetensors files are reported as such, never handed to PyTorch's pickle reader")
    os.makedirs(p("damaged"))
    for what, name, data in (("model.safetensors cut inside its header", "model.safetensors", good_st[:40]),
                             ("model.safetensors of 5 bytes", "five.safetensors", good_st[:5]),
                             ("the same cut file named weights.bin", "weights.bin", good_st[:40]),
                             ("model.safetensors whose header length is garbage", "garbage.safetensors",
                              b"\x80" + good_st[1:])):
        path = write(p("damaged", name), data)
        rc, _, err = ref_cli(["import", path, "--out", p("x.ckpt")])
        ok, line = one_line_error(rc, err, path)
        advice = any(s in err for s in ("weights_only", "torch.load", "arbitrary code", "pickle"))
        check(f"{what}: truncated or damaged, no unpickling advice",
              ok and ("truncated" in err or "damaged" in err) and not advice, line)
    torch.save({"w": np.zeros(3)}, p("damaged", "pytorch_model.bin"))  # a numpy array: not weights-only
    rc, _, err = ref_cli(["import", p("damaged", "pytorch_model.bin"), "--out", p("x.ckpt")])
    ok, line = one_line_error(rc, err, "state dict")
    check("pytorch_model.bin holding a numpy array: refused without advising weights_only=False",
          ok and "weights_only" not in err and "arbitrary code" not in err, line)


def sharded(p, odd):
    from safetensors.torch import save_file
    print("sharded Hugging Face weights: model.safetensors.index.json (or pytorch_model.bin's) + shards")
    sd = hf_state_dict(odd)
    keys = sorted(sd)
    parts = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
             "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}

    def shard_folder(name, parts, index_name="model.safetensors.index.json", edit=None):
        folder = p(name)
        os.makedirs(folder)
        weight_map = {k: shard for shard, ks in parts.items() for k in ks}
        if edit:
            edit(weight_map)
        for shard, ks in parts.items():
            tensors = {k: sd[k] for k in ks}
            if shard.endswith(".safetensors"):
                save_file(tensors, os.path.join(folder, shard), metadata={"format": "pt"})
            else:
                torch.save(tensors, os.path.join(folder, shard))
        write(os.path.join(folder, index_name), json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
        write(os.path.join(folder, "config.json"), read(p("hf_odd", "config.json")))
        return folder

    folder = shard_folder("sharded", parts)
    rc, _, err = ref_cli(["import", folder, "--out", p("sharded.ckpt")])
    check("folder with model.safetensors.index.json + 2 shards -> identical checkpoint",
          rc == 0 and read(p("sharded.ckpt")) == read(odd), err.strip()[:80])
    rc, _, err = ref_cli(["import", os.path.join(folder, "model.safetensors.index.json"), "--out", p("sharded2.ckpt")])
    check("the index file itself -> identical checkpoint", rc == 0 and read(p("sharded2.ckpt")) == read(odd),
          err.strip()[:80])
    bins = {"pytorch_model-00001-of-00002.bin": keys[:7], "pytorch_model-00002-of-00002.bin": keys[7:]}
    folder = shard_folder("sharded_bin", bins, "pytorch_model.bin.index.json")
    rc, _, err = ref_cli(["import", folder, "--out", p("sharded_bin.ckpt")])
    check("pytorch_model.bin.index.json + 2 .bin shards -> identical checkpoint",
          rc == 0 and read(p("sharded_bin.ckpt")) == read(odd), err.strip()[:80])
    folder = shard_folder("sharded_missing", parts)
    os.unlink(os.path.join(folder, "model-00002-of-00002.safetensors"))
    expect_error("a shard missing: named", ["import", folder, "--out", p("x.ckpt")], "model-00002-of-00002.safetensors")
    moved = keys[0]
    folder = shard_folder("sharded_misplaced", parts, edit=lambda m: m.update({moved: "model-00002-of-00002.safetensors"}))
    expect_error("a tensor in another shard than the index says: named", ["import", folder, "--out", p("x.ckpt")], moved)
    folder = shard_folder("sharded_path", parts, edit=lambda m: m.update({moved: "../model-00001-of-00002.safetensors"}))
    expect_error("an index naming a shard outside its folder", ["import", folder, "--out", p("x.ckpt")],
                 "not a file name in its folder")
    os.makedirs(p("sharded_badjson"))
    write(p("sharded_badjson", "model.safetensors.index.json"), b'{"weight_map": [1]}')
    expect_error("an index whose weight_map is not an object", ["import", p("sharded_badjson"), "--out", p("x.ckpt")],
                 "sharded-weights index")


def tokenizer_files(p):
    print("export of a GPT-2-vocabulary model: the tokenizer files AutoTokenizer reads, generation_config.json")
    from checks import MIRROR
    ckpt = p("gpt2vocab.ckpt")
    ref_cli(["init", "--model", "L=1,NH=1,C=8,V=50257,maxT=64", "--out", ckpt])
    old = os.environ.get("GPT_MIRROR")
    os.environ["GPT_MIRROR"] = MIRROR
    try:
        rc, out, err = ref_cli(["export", ckpt, "--out", p("hf_gpt2vocab")])
    finally:
        os.environ.pop("GPT_MIRROR") if old is None else os.environ.update(GPT_MIRROR=old)
    names = sorted(os.listdir(p("hf_gpt2vocab"))) if rc == 0 else []
    want = sorted(["config.json", "generation_config.json", "merges.txt", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json", "vocab.json"])
    check("export writes config, generation_config, model, vocab, merges, tokenizer, tokenizer_config",
          names == want and not err, f"{names} {err.strip()[:60]}")
    if names != want:
        return
    f = lambda name: read(p("hf_gpt2vocab", name))  # noqa: E731
    check("vocab.json is GPT-2's encoder.json, merges.txt its vocab.bpe (byte for byte)",
          f("vocab.json") == read(os.path.join(MIRROR, "gpt2", "encoder.json"))
          and f("merges.txt") == read(os.path.join(MIRROR, "gpt2", "vocab.bpe")))
    vocab = json.loads(f("vocab.json"))
    check("vocab.json: 50257 ids 0..50256, <|endoftext|> = 50256",
          sorted(vocab.values()) == list(range(50257)) and vocab.get("<|endoftext|>") == 50256)
    fast = json.loads(f("tokenizer.json"))
    merges = read(os.path.join(MIRROR, "gpt2", "vocab.bpe")).decode().split("\n")[1:-1]
    check("tokenizer.json: byte-level BPE with vocab.json's ids and vocab.bpe's 50000 merges, <|endoftext|> special",
          fast["model"]["type"] == "BPE" and fast["model"]["vocab"] == vocab and fast["model"]["merges"] == merges
          and len(merges) == 50000 and fast["pre_tokenizer"]["type"] == "ByteLevel"
          and fast["pre_tokenizer"]["add_prefix_space"] is False and fast["decoder"]["type"] == "ByteLevel"
          and [(t["id"], t["content"], t["special"]) for t in fast["added_tokens"]] == [(50256, "<|endoftext|>", True)])
    tok = json.loads(f("tokenizer_config.json"))
    check("tokenizer_config.json: GPT2Tokenizer, <|endoftext|> bos/eos/unk, model_max_length = maxT, no clean-up",
          tok.get("tokenizer_class") == "GPT2Tokenizer" and tok.get("model_max_length") == 64
          and tok.get("bos_token") == tok.get("eos_token") == tok.get("unk_token") == "<|endoftext|>"
          and tok.get("clean_up_tokenization_spaces") is False and tok.get("add_prefix_space") is False, str(tok)[:80])
    gen = json.loads(f("generation_config.json"))
    check("generation_config.json: bos and eos 50256", gen == {"bos_token_id": 50256, "eos_token_id": 50256}, str(gen))
    os.environ["GPT_MIRROR"] = p("no_mirror")
    try:
        rc, out, err = ref_cli(["export", ckpt, "--out", p("hf_nomirror")])
    finally:
        os.environ.pop("GPT_MIRROR") if old is None else os.environ.update(GPT_MIRROR=old)
    check("without the BPE files: the model exported, a one-line warning naming GPT_MIRROR",
          rc == 0 and err.count("\n") == 1 and err.startswith("warning: ") and "GPT_MIRROR" in err
          and not os.path.exists(p("hf_nomirror", "vocab.json")), err.strip()[:100])


def overwrites(p, odd):
    print("outputs: never an input, an existing one only with --force, no temporary file left")
    os.makedirs(p("ow"))
    o = lambda *names: p("ow", *names)  # noqa: E731
    original = read(odd)
    write(o("in.ckpt"), original)
    for extra in ([], ["--force"]):
        rc, _, err = ref_cli(["export", o("in.ckpt"), "--format", "llmc", "--dtype", "bf16", "--out", o("in.ckpt")] + extra)
        ok, line = one_line_error(rc, err, "is the input")
        check(f"export --out its own input{' --force' if extra else ''}: refused, input unchanged",
              ok and read(o("in.ckpt")) == original, line)
    os.symlink(o("in.ckpt"), o("link.ckpt"))
    for what, out in (("through a symbolic link", o("link.ckpt")), ("spelled with ..", p("ow", "..", "ow", "in.ckpt"))):
        rc, _, err = ref_cli(["import", o("in.ckpt"), "--out", out, "--force"])
        ok, line = one_line_error(rc, err, "is the input")
        check(f"import --out its own input {what} --force: refused", ok and read(o("in.ckpt")) == original, line)
    write(o("other.ckpt"), b"keep me")
    for command in (["init", "--model", "L=1,NH=1,C=8,V=64,maxT=8"], ["import", odd], ["export", odd, "--format", "llmc"],
                    ["state", "--checkpoint", odd, "-B", "1", "-T", "4", "-K", "1", "--device", "cpu"]):
        rc, _, err = ref_cli(command + ["--out", o("other.ckpt")])
        ok, line = one_line_error(rc, err, "add --force")
        check(f"{command[0]} --out an existing file: refused, file kept", ok and read(o("other.ckpt")) == b"keep me", line)
        rc, _, err = ref_cli(command + ["--out", o("other.ckpt"), "--force"])
        check(f"{command[0]} --out an existing file --force: replaced", rc == 0 and read(o("other.ckpt")) != b"keep me",
              err.strip()[:80])
        write(o("other.ckpt"), b"keep me")
    rc, _, err = ref_cli(["state", "--checkpoint", o("in.ckpt"), "--out", o("in.ckpt"), "--force"])
    ok, line = one_line_error(rc, err, "is the input")
    check("state --out its --checkpoint --force: refused", ok and read(o("in.ckpt")) == original, line)
    rc, _, err = ref_cli(["export", odd, "--out", o("hf")])
    config = read(o("hf", "config.json")) if rc == 0 else b""
    rc, _, err = ref_cli(["export", o("in.ckpt"), "--out", o("hf"), "--dtype", "bf16"])
    ok, line = one_line_error(rc, err, "already exists: add --force")
    check("export --format hf into a folder holding an export: refused, names the file",
          ok and "model.safetensors" in err and read(o("hf", "config.json")) == config, line)
    rc, _, err = ref_cli(["export", o("in.ckpt"), "--out", o("hf"), "--dtype", "bf16", "--force"])
    check("  ... with --force: replaced", rc == 0 and b"bfloat16" in read(o("hf", "config.json")), err.strip()[:80])
    for what, source in (("the folder", o("hf")), ("its model.safetensors", o("hf", "model.safetensors"))):
        before = {n: read(o("hf", n)) for n in os.listdir(o("hf"))}
        rc, _, err = ref_cli(["export", source, "--out", o("hf"), "--force"])
        ok, line = one_line_error(rc, err, "is the input")
        check(f"export of {what} into its own folder --force: refused, folder unchanged",
              ok and {n: read(o("hf", n)) for n in os.listdir(o("hf"))} == before, line)
    rc, _, err = ref_cli(["export", p("gpt2vocab.ckpt"), "--out", o("hf2")])
    rc2, _, err2 = ref_cli(["export", odd, "--out", o("hf2"), "--force"])
    check("export --force of a V=1237 model over a GPT-2 export: the old tokenizer files are gone",
          rc == rc2 == 0 and sorted(os.listdir(o("hf2"))) == ["config.json", "generation_config.json", "model.safetensors"],
          (err + err2).strip()[:80] or str(sorted(os.listdir(o("hf2")))))
    folder = o("elsewhere")  # an HF file read from a folder that also holds an unrelated file
    os.makedirs(folder)
    for name in ("model.safetensors", "config.json"):
        write(os.path.join(folder, name), read(o("hf", name)))
    write(os.path.join(folder, "unrelated.bin"), b"old")
    rc, _, err = ref_cli(["export", os.path.join(folder, "model.safetensors"), "--format", "llmc",
                          "--out", os.path.join(folder, "unrelated.bin"), "--force"])
    check("  ... a file beside the input that is not read is no input: --force replaces it", rc == 0, err.strip()[:80])
    rc, _, err = ref_cli(["export", odd, "--out", o("other.ckpt"), "--force"])
    ok, line = one_line_error(rc, err, "is a file")
    check("export --format hf --out an existing file: one line, no errno", ok and "Errno" not in err, line)
    os.makedirs(o("a_folder"))
    rc, _, err = ref_cli(["export", odd, "--format", "llmc", "--out", o("a_folder"), "--force"])
    ok, line = one_line_error(rc, err, "is a folder")
    check("export --format llmc --out an existing folder: one line", ok and "Errno" not in err, line)
    rc, _, err = ref_cli(["import", odd, "--out", os.path.join(o("other.ckpt"), "x.ckpt")])
    ok, line = one_line_error(rc, err, os.path.join(o("other.ckpt"), "x.ckpt"))
    check("--out under a file: one line naming the path and the file in its way, no errno",
          ok and "is a file, not a folder" in err and "Errno" not in err and ".tmp_" not in err, line)
    cfg, params = ref.read_checkpoint_params(odd)
    try:
        ref.write_checkpoint_params(cfg, params, os.path.join(o("other.ckpt"), "y.ckpt"))
        line = "no error"
    except Exception as e:  # anything but ref.Error fails the check below
        line = str(e) if isinstance(e, ref.Error) else f"{type(e).__name__}: {e}"
    check("  ... the writer itself (past the command's checks) says the same", "is a file, not a folder" in line, line)
    real_replace = os.replace

    def failing_replace(src, dst):  # what a rename onto a folder raises, naming the temporary file
        raise IsADirectoryError(21, "Is a directory", src, dst)
    os.replace = failing_replace
    try:
        ref.write_checkpoint_params(cfg, params, o("z.ckpt"))
        line = "no error"
    except Exception as e:  # anything but ref.Error fails the check below
        line = str(e) if isinstance(e, ref.Error) else f"{type(e).__name__}: {e}"
    finally:
        os.replace = real_replace
    check("a failed rename: 'cannot write' the path given, no errno, no temporary name, none left",
          line.startswith(f"cannot write '{o('z.ckpt')}'") and ".tmp_" not in line and "Errno" not in line
          and not [n for n in os.listdir(p("ow")) if n.startswith(".tmp_")], line)
    leftovers = [os.path.join(d, n) for d, _, names in os.walk(p("ow")) for n in names if n.startswith(".tmp_")]
    check("no temporary file left anywhere", not leftovers, str(leftovers[:2]))


if __name__ == "__main__":
    main()
