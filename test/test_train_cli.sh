#!/usr/bin/env bash
# train_gpt's command line and input validation, in both builds, without a GPU: every bad flag,
# checkpoint (-e), token file (-i, -j), tokenizer (-z) and output folder (-o) must end in exit code 1
# (not 0, not a signal or core dump), within 60 s (a FIFO or a device within 5 s), with exactly one
# line on stderr that starts with `error:` and names the flag or file, and leave no output folder
# behind. Validation happens before any GPU use; the test hides
# every GPU (CUDA_VISIBLE_DEVICES=), so a fully valid configuration ends with `error: no CUDA device
# found ...`, and the checks that an input is accepted assert exactly that. Also checks, on the host
# side, how -y 1 picks a checkpoint from the output folder (skips corrupt or partial ones, one warning
# each). Inputs are tiny synthetic files from test/train_inputs.py and gpt_reference.py in a temp
# folder. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export CUDA_VISIBLE_DEVICES=  # the same result with or without a GPU in the machine
passed=0 failed=0 skipped=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
NO_CUDA="error: no CUDA device found"

gen() { "$PYTHON" test/train_inputs.py "$@"; }
edit() { gen edit "$@"; }

# ---- inputs: a model with V=1237, maxT=50 (PyTorch-written) and files that fit it
if ! "$PYTHON" gpt_reference.py init --model L=2,NH=3,C=39,V=1237,maxT=50 --seed 1 --out "$tmp/pt.ckpt" >/dev/null; then
    echo "FAIL: gpt_reference.py init could not write the test checkpoint"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
set -e
M=$tmp/pt.ckpt  # 256 x int32 header + 87789 fp32 parameters
"$PYTHON" gpt_reference.py init --model L=2,NH=3,C=48,V=1237,maxT=50 --seed 1 --out "$tmp/c48.ckpt" >/dev/null  # for -f8 1
gen model-crc "$M" "$tmp/ours.ckpt"  # as train_gpt writes it: with crc32
edit "$tmp/ours.ckpt" "$tmp/ours_flip.ckpt" --flip 5000
edit "$M" "$tmp/pt_trunc.ckpt" --drop 4
edit "$M" "$tmp/pt_long.ckpt" --append 4
edit "$M" "$tmp/short.ckpt" --drop $(($(stat -c %s "$M") - 100))
: >"$tmp/empty.ckpt"
edit "$M" "$tmp/magic.ckpt" --set-int 0=20240520
edit "$M" "$tmp/version.ckpt" --set-int 1=2
edit "$M" "$tmp/badcfg.ckpt" --set-int 3=5  # NH=5 does not divide C=39
edit "$M" "$tmp/hugecfg.ckpt" --set-int 2=1000 --set-int 4=65536  # L=1000 C=65536: size check, no allocation
edit "$M" "$tmp/nan.ckpt" --set-float 77=nan --set-int 8=0  # crc32 0 (none): the NaN check, not the crc, must catch it
edit "$tmp/ours.ckpt" "$tmp/ours_badcrc.ckpt" --set-int 8=12345
edit "$M" "$tmp/nocrc.ckpt" --set-int 8=0  # crc32 0: none recorded

gen tokens "$tmp/train.bin" 3000
gen tokens "$tmp/val.bin" 800 --seed 1
: >"$tmp/empty.bin"
edit "$tmp/train.bin" "$tmp/short.bin" --drop $(($(stat -c %s "$tmp/train.bin") - 100))
edit "$tmp/train.bin" "$tmp/trunc.bin" --drop 2
edit "$tmp/train.bin" "$tmp/long.bin" --append 2
edit "$tmp/train.bin" "$tmp/magic.bin" --set-int 0=20251101
edit "$tmp/train.bin" "$tmp/version.bin" --set-int 1=2
edit "$tmp/train.bin" "$tmp/count0.bin" --set-int 2=0
edit "$tmp/train.bin" "$tmp/countneg.bin" --set-int 2=-5
# a flipped bit in the payload: the top bit of token 500 (ids < 1237 fit in 11 bits) -> id >= 32768
edit "$tmp/train.bin" "$tmp/flip.bin" --flip $((1024 + 2 * 500 + 1)) --xor 128
"$PYTHON" - "$tmp/train.bin" "$tmp/badtok.bin" <<'EOF'
import sys
import numpy as np
data = bytearray(open(sys.argv[1], "rb").read())
data[1024 + 2 * 1234:1024 + 2 * 1234 + 2] = np.array([1237], np.uint16).tobytes()  # == V
open(sys.argv[2], "wb").write(bytes(data))
EOF
gen tokens "$tmp/tiny.bin" 32  # at -b 2 -t 16 (-d 32) a step's 2 sequences span 33 tokens: one short

gen tokenizer "$tmp/tok.bin" 1237
gen tokenizer "$tmp/tok_v1.bin" 1237 --version 1
gen tokenizer "$tmp/tok_1000.bin" 1000
: >"$tmp/tok_empty.bin"
edit "$tmp/tok.bin" "$tmp/tok_short.bin" --drop $(($(stat -c %s "$tmp/tok.bin") - 100))
edit "$tmp/tok.bin" "$tmp/tok_trunc.bin" --drop 3
edit "$tmp/tok.bin" "$tmp/tok_long.bin" --append 1
edit "$tmp/tok.bin" "$tmp/tok_magic.bin" --set-int 0=20240520
edit "$tmp/tok.bin" "$tmp/tok_version.bin" --set-int 1=3
edit "$tmp/tok.bin" "$tmp/tok_eot.bin" --set-int 3=1237
edit "$tmp/tok.bin" "$tmp/tok_huge.bin" --set-int 2=2147483647
"$PYTHON" - "$tmp/tok.bin" "$tmp/tok_zero.bin" <<'EOF'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[1024] = 0  # token 0 claims length 0: the rest no longer parses as tokens
open(sys.argv[2], "wb").write(bytes(data))
EOF
: >"$tmp/regular_file"
mkfifo "$tmp/fifo"
# Shards of one's own data as data/prepare_text.py names them, and a token file with no validation data beside it.
mkdir -p "$tmp/own" "$tmp/own_noval"
gen tokens "$tmp/own/own_train_000001.bin" 2000 --seed 3
gen tokens "$tmp/own/own_train_000002.bin" 1500 --seed 4
gen tokens "$tmp/own/own_val_000000.bin" 600 --seed 5
gen tokens "$tmp/own_noval/mine.bin" 3000 --seed 6
# llm.c's model files (magic 20240326; version 3 fp32, 5 bf16) holding the test model.
"$PYTHON" - "$M" "$tmp/llmc" <<'EOF'
import sys
import numpy as np
src, out = sys.argv[1], sys.argv[2]
h = np.fromfile(src, dtype="<i4", count=256)
params = np.fromfile(src, dtype="<f4", offset=1024)
L, NH, C, maxT, V, Vp = (int(x) for x in h[2:8])
for version, payload in ((3, params.tobytes()), (5, (params.view("<u4") >> 16).astype("<u2").tobytes()), (4, params.tobytes())):
    g = np.zeros(256, dtype="<i4")
    g[:8] = [20240326, version, maxT, V, L, NH, C, Vp]
    open(f"{out}_v{version}.bin", "wb").write(g.tobytes() + payload)
EOF
set +e

# The valid configuration every check starts from (-b 2 -t 16: 32 tokens per micro-batch).
base=(-e "$tmp/pt.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok.bin" -b 2 -t 16 -x 3 -u 1)
nobase_e=(-i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok.bin" -b 2 -t 16 -x 3 -u 1)  # base without -e

report() {  # name ok detail
    if [[ $2 -eq 1 ]]; then
        passed=$((passed + 1))
        printf '  %-68s ok\n' "$1"
    else
        failed=$((failed + 1))
        printf '  %-68s FAIL  %s\n' "$1" "$3"
        sed 's/^/      stderr: /' "$tmp/stderr" | head -n 5
    fi
}

# The runs give the valid configuration first and then the flags under test, which replace the
# configuration's own (train_gpt refuses a flag given twice: that is tested with run_raw).
dedupe() {  # prints the NUL-separated arguments with each flag's last value only
    local -a args=("$@") out=()
    local -A last=()
    local i
    if (($# % 2)); then printf '%s\0' "$@"; return; fi  # not all flag-value pairs: as given
    for ((i = 0; i < $#; i += 2)); do last[${args[i]}]=$i; done
    for ((i = 0; i < $#; i += 2)); do [[ ${last[${args[i]}]} == "$i" ]] && out+=("${args[i]}" "${args[i + 1]}"); done
    printf '%s\0' "${out[@]}"
}
run_raw() {  # runs the binary with a time limit; sets rc, nerr (stderr lines), err1 (first stderr line)
    timeout 60 "./$bin" "$@" >"$tmp/stdout" 2>"$tmp/stderr" </dev/null
    rc=$?
    nerr=$(grep -c '' "$tmp/stderr")
    err1=$(head -n 1 "$tmp/stderr")
}
run() {
    local -a args
    mapfile -d '' args < <(dedupe "$@")
    run_raw "${args[@]}"
}

# expect_error NAME NEEDLE ARGS...: exit code 1, stderr exactly one line, `error: ...NEEDLE...`
expect_error() {
    local name=$1 needle=$2
    shift 2
    run "$@"
    local why=""
    if [[ $rc -eq 124 ]]; then why="hung (killed after 60 s)"
    elif [[ $rc -ne 1 ]]; then why="exit code $rc, expected 1"
    elif [[ $nerr -ne 1 ]]; then why="$nerr lines on stderr, expected 1"
    elif [[ $err1 != error:* ]]; then why="stderr does not start with 'error:'"
    elif [[ $err1 != *"$needle"* ]]; then why="the error does not name '$needle'"
    fi
    report "[$prec] $name" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
}

# expect_valid NAME ARGS...: every input accepted: the run gets to the GPU and finds none
expect_valid() {
    local name=$1
    shift
    run "$@"
    local why=""
    if [[ $rc -ne 1 || $nerr -ne 1 || $err1 != "$NO_CUDA"* ]]; then why="exit code $rc, expected 1 with only '$NO_CUDA ...'"; fi
    report "[$prec] $name" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
}

# warnings_then_error NWARN: why the last run did not exit 1 with NWARN `warning:` lines and one
# final line on stderr (nothing when it did)
warnings_then_error() {
    local w
    w=$(grep -c '^warning: ' "$tmp/stderr")
    if [[ $rc -ne 1 ]]; then echo "exit code $rc, expected 1"
    elif [[ $w -ne $1 || $nerr -ne $(($1 + 1)) ]]; then echo "$w warnings in $nerr stderr lines, expected $1 warnings + 1 error"
    fi
}

# expect_warn_valid NAME NWARN STDOUT_NEEDLE ARGS...: NWARN `warning:` lines, then the no-GPU error;
# stdout has STDOUT_NEEDLE
expect_warn_valid() {
    local name=$1 nwarn=$2 out_needle=$3
    shift 3
    run "$@"
    local why
    why=$(warnings_then_error "$nwarn")
    if [[ -n $why ]]; then :
    elif [[ $(tail -n 1 "$tmp/stderr") != "$NO_CUDA"* ]]; then why="last stderr line is not '$NO_CUDA ...'"
    elif ! grep -qF -- "$out_needle" "$tmp/stdout"; then why="stdout lacks '$out_needle'"
    fi
    report "[$prec] $name" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
    [[ -n $why ]] && sed 's/^/      stdout: /' "$tmp/stdout" | head -n 3
    return 0
}

# expect_error_after_warnings NAME NWARN NEEDLE ARGS...: NWARN `warning:` lines, then an error naming NEEDLE
expect_error_after_warnings() {
    local name=$1 nwarn=$2 needle=$3
    shift 3
    run "$@"
    local why
    why=$(warnings_then_error "$nwarn")
    if [[ -z $why && $(tail -n 1 "$tmp/stderr") != error:*"$needle"* ]]; then why="the last stderr line is not an error naming '$needle'"; fi
    report "[$prec] $name" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
}

# expect_warning_no_gpu NAME PATTERN ARGS...: one `warning:` line matching PATTERN, then the no-GPU error
expect_warning_no_gpu() {
    local name=$1 pattern=$2
    shift 2
    run "$@"
    local why
    why=$(warnings_then_error 1)
    if [[ -z $why && $(tail -n 1 "$tmp/stderr") != "$NO_CUDA"* ]]; then why="last stderr line is not '$NO_CUDA ...'"
    elif [[ -z $why ]] && ! grep -qE -- "^warning: .*$pattern" "$tmp/stderr"; then why="no warning matches '$pattern'"; fi
    report "[$prec] $name" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
}

# expect_stderr_has PATTERN: the last run's stderr has a line matching PATTERN (grep -E)
expect_stderr_has() {
    local name=$1 pattern=$2
    if grep -qE -- "$pattern" "$tmp/stderr"; then report "[$prec] $name" 1 ""
    else report "[$prec] $name" 0 "no stderr line matches '$pattern'"; fi
}

for prec in fp32 bf16; do
    bin=train_gpt_$prec
    echo "=== ./$bin"
    if [[ ! -x $bin ]]; then
        echo "  FAIL: ./$bin is not built (make $bin)"
        failed=$((failed + 1))
        continue
    fi

    # ---- the valid configuration, and boundary values that are valid
    expect_valid "valid configuration gets to the GPU" "${base[@]}"
    expect_valid "-v 0 (never validate) is accepted" "${base[@]}" -v 0
    expect_valid "-s 0 (never sample) is accepted" "${base[@]}" -s 0
    expect_valid "-n 0 -u 0 -gc 0 -c 0 -q 0 -l 0 -sd 0 -sh 0 -y 0 accepted" "${base[@]}" -n 0 -u 0 -gc 0 -c 0 -q 0 -l 0 -sd 0 -sh 0 -y 0
    expect_valid "-q 1 -sh 1 -nk 1 -m 1 -g 1 -pf 1 -fa 0 accepted" "${base[@]}" -q 1 -sh 1 -nk 1 -m 1 -g 1 -pf 1 -fa 0
    expect_valid "-ge 0 -r 1 accepted" "${base[@]}" -ge 0 -r 1
    expect_valid "-ge 1 -r 0 accepted" "${base[@]}" -ge 1 -r 0
    expect_valid "-ge 2 -r 1 accepted" "${base[@]}" -ge 2 -r 1
    expect_valid "-ov 0 -tw 1 -lx 0 accepted" "${base[@]}" -ov 0 -tw 1 -lx 0
    expect_valid "-f8 0 accepted" "${base[@]}" -f8 0
    # -f8 1: FP8 linear layers, bf16 builds only, C and T multiples of 16 (the GPU is checked on the GPU)
    if [[ $prec == bf16 ]]; then
        expect_valid "-f8 1 -t 16, C = 48 accepted" -e "$tmp/c48.ckpt" "${base[@]:2}" -f8 1
        expect_valid "-f8 1 -t 48 -ov 0 -r 1, C = 48 accepted" -e "$tmp/c48.ckpt" "${base[@]:2}" -f8 1 -t 48 -ov 0 -r 1
        expect_error "-f8 1 with C = 39: refused before the GPU" "C = 39 is not a multiple of 16" "${base[@]}" -f8 1
        expect_error "-f8 1 -t 24: T not a multiple of 16" "-t 24 is not a multiple of 16" "${base[@]}" -f8 1 -t 24
    else
        expect_error "-f8 1 in the fp32 build" "flag -f8 1: FP8 linear layers need the bf16 build" "${base[@]}" -f8 1
        expect_error "-f8 1 -t 24 in the fp32 build: the build named first" "bf16 build" "${base[@]}" -f8 1 -t 24
    fi
    expect_valid "-sl 3 -sg 11.26 accepted (the outlier guard)" "${base[@]}" -sl 3 -sg 11.26
    expect_valid "-sl 0 -sg 0 accepted (the guard off)" "${base[@]}" -sl 0 -sg 0
    expect_warning_no_gpu "-sl 11.27 (at least sqrt(127), never reached): one warning" "-sl 11.27: .*never skips" "${base[@]}" -sl 11.27
    expect_warning_no_gpu "-sg 1e6 (never reached): one warning" "-sg 1e\+06: .*never skips" "${base[@]}" -sg 1e6
    expect_valid "-d 64 = 2*B*T (accumulation) accepted" "${base[@]}" -d 64
    expect_valid "-t 50 = maxT accepted" "${base[@]}" -t 50
    expect_valid "-e with crc32 (our model file) accepted" "${base[@]}" -e "$tmp/ours.ckpt"
    expect_valid "-e with crc32 0 (none recorded) accepted" "${base[@]}" -e "$tmp/nocrc.ckpt"
    expect_valid "-z version 1 tokenizer accepted" "${base[@]}" -z "$tmp/tok_v1.bin"
    expect_valid "-o new folder accepted" "${base[@]}" -o "$tmp/out_$prec"

    # ---- numeric flags: non-numeric, trailing garbage, out of range, non-positive, empty, space
    int_flags=("-b 1 4096" "-t 1 65536" "-d 1 1073741824" "-x 1 99999999" "-u 0 1073741824" "-v 0 1073741824"
               "-m 1 1048576" "-s 0 1073741824" "-g 1 65536" "-n 0 1073741824" "-nk 1 1048576" "-y 0 1"
               "-sd 0 4611686018427387904" "-sh 0 1" "-pf 0 1" "-fa 0 1" "-ge 0 2" "-r 0 1" "-ov 0 1" "-tw 0 1" "-lx 0 1" "-f8 0 1")
    for spec in "${int_flags[@]}"; do
        read -r f lo hi <<<"$spec"
        for v in abc 12x 1.5 "" " 1" 0x10 99999999999999999999 "$((hi + 1))" "$((lo - 1))" -5; do
            expect_error "$f '$v'" "flag $f:" "${base[@]}" "$f" "$v"
        done
    done
    float_flags=("-l 0 10" "-q 0 1" "-c 0 10" "-gc 0 1000000" "-sl 0 1000000" "-sg 0 1000000")
    for spec in "${float_flags[@]}"; do
        read -r f lo hi <<<"$spec"
        for v in abc 1e-3x "" " 1" nan inf -inf 1e999 -1 -0.001 "$((hi + 1))"; do
            expect_error "$f '$v'" "flag $f:" "${base[@]}" "$f" "$v"
        done
    done

    # ---- flags themselves
    expect_error "unknown flag -foo" "-foo" "${base[@]}" -foo 1
    expect_error "unknown flag --batch" "--batch" "${base[@]}" --batch 4
    expect_error "unknown flag -B (flags are case-sensitive)" "-B" "${base[@]}" -B 4
    expect_error "stray argument" "stray" "${base[@]}" stray
    expect_error "-x -h: a value, not a request for help" "flag -x:" "${base[@]}" -x -h
    expect_error "-p not UTF-8 (0xff)" "flag -p:" "${base[@]}" -p $'\xff\xfe abc'
    expect_error "-p not UTF-8 (a cut sequence)" "flag -p:" "${base[@]}" -p $'caf\xc3\xa9 \xe2\x82'
    expect_error "-p not UTF-8 (a surrogate)" "flag -p:" "${base[@]}" -p $'a\xed\xa0\x80b'
    expect_error "-p not UTF-8 (overlong)" "flag -p:" "${base[@]}" -p $'a\xc0\xafb'
    expect_error "-b without a value" "-b" "${base[@]}" -b
    expect_error "-e without a value" "-e" "${base[@]}" -e
    expect_error "-o without a value" "-o" "${base[@]}" -o
    expect_error "-d 48 not a multiple of B*T = 32" "-d 48" "${base[@]}" -d 48
    expect_error "-d 16 smaller than B*T = 32" "-d 16" "${base[@]}" -d 16
    expect_error "-b 4096 -t 8192: B*T above 16M" "-b 4096" "${base[@]}" -b 4096 -t 8192
    expect_error "-t 51 > the model's maxT 50" "-t 51" "${base[@]}" -t 51
    expect_error "-t 1025 > maxT of d6" "-t 1025" "${base[@]}" -e d6 -t 1025
    expect_error "-y 1 without -o" "-y 1" "${base[@]}" -y 1

    # ---- checkpoint (-e)
    expect_error "-e missing file" "$tmp/missing.ckpt" "${base[@]}" -e "$tmp/missing.ckpt"
    expect_error "-e unknown descriptor d7 (taken as a file)" "d7" "${base[@]}" -e d7
    # A Hugging Face folder or safetensors file: one line saying how to convert it.
    mkdir -p "$tmp/hf_$prec"
    echo '{"model_type": "gpt2"}' >"$tmp/hf_$prec/config.json"
    printf '\x10\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{}}' >"$tmp/hf_$prec/model.safetensors"
    expect_error "-e a Hugging Face folder: convert it with gpt_reference.py import" "gpt_reference.py import" "${nobase_e[@]}" -e "$tmp/hf_$prec"
    expect_error "-e a safetensors file: convert it with gpt_reference.py import" "gpt_reference.py import" "${nobase_e[@]}" -e "$tmp/hf_$prec/model.safetensors"
    expect_error "-e a folder" "$tmp" "${base[@]}" -e "$tmp"
    expect_error "-e empty file" "$tmp/empty.ckpt" "${base[@]}" -e "$tmp/empty.ckpt"
    expect_error "-e 100 bytes (truncated header)" "$tmp/short.ckpt" "${base[@]}" -e "$tmp/short.ckpt"
    expect_error "-e truncated by 4 bytes (size)" "$tmp/pt_trunc.ckpt" "${base[@]}" -e "$tmp/pt_trunc.ckpt"
    expect_error "-e 4 bytes too long" "$tmp/pt_long.ckpt" "${base[@]}" -e "$tmp/pt_long.ckpt"
    expect_error "-e flipped payload byte (crc32)" "$tmp/ours_flip.ckpt" "${base[@]}" -e "$tmp/ours_flip.ckpt"
    expect_error "-e wrong crc32 in the header" "$tmp/ours_badcrc.ckpt" "${base[@]}" -e "$tmp/ours_badcrc.ckpt"
    expect_error "-e wrong magic" "$tmp/magic.ckpt" "${base[@]}" -e "$tmp/magic.ckpt"
    expect_error "-e wrong version" "$tmp/version.ckpt" "${base[@]}" -e "$tmp/version.ckpt"
    expect_error "-e invalid config (C % NH != 0)" "$tmp/badcfg.ckpt" "${base[@]}" -e "$tmp/badcfg.ckpt"
    expect_error "-e huge config, small file" "$tmp/hugecfg.ckpt" "${base[@]}" -e "$tmp/hugecfg.ckpt"
    expect_error "-e NaN parameter" "$tmp/nan.ckpt" "${base[@]}" -e "$tmp/nan.ckpt"
    expect_error "-e a token file" "$tmp/train.bin" "${base[@]}" -e "$tmp/train.bin"

    # ---- token files (-i, -j)
    for f in -i -j; do
        expect_error "$f missing file" "$tmp/missing.bin" "${base[@]}" $f "$tmp/missing.bin"
        expect_error "$f a folder" "$tmp" "${base[@]}" $f "$tmp"
        expect_error "$f empty file" "$tmp/empty.bin" "${base[@]}" $f "$tmp/empty.bin"
        expect_error "$f 100 bytes (truncated header)" "$tmp/short.bin" "${base[@]}" $f "$tmp/short.bin"
        expect_error "$f truncated by one token" "$tmp/trunc.bin" "${base[@]}" $f "$tmp/trunc.bin"
        expect_error "$f one token too long" "$tmp/long.bin" "${base[@]}" $f "$tmp/long.bin"
        expect_error "$f wrong magic" "$tmp/magic.bin" "${base[@]}" $f "$tmp/magic.bin"
        expect_error "$f wrong version" "$tmp/version.bin" "${base[@]}" $f "$tmp/version.bin"
        expect_error "$f header count 0" "$tmp/count0.bin" "${base[@]}" $f "$tmp/count0.bin"
        expect_error "$f header count -5" "$tmp/countneg.bin" "${base[@]}" $f "$tmp/countneg.bin"
        expect_error "$f flipped byte -> token id >= V" "$tmp/flip.bin" "${base[@]}" $f "$tmp/flip.bin"
        expect_error "$f token id == V (1237)" "$tmp/badtok.bin" "${base[@]}" $f "$tmp/badtok.bin"
        expect_error "$f a checkpoint" "$tmp/pt.ckpt" "${base[@]}" $f "$tmp/pt.ckpt"
    done
    expect_error "-i 32 tokens, fewer than the 33 a step's 2 sequences span" "$tmp/tiny.bin" "${base[@]}" -i "$tmp/tiny.bin"
    expect_error "  ... so at -b 1 -d 32 too (a step's sequences depend on -d, not -b)" "$tmp/tiny.bin" "${base[@]}" -b 1 -d 32 -i "$tmp/tiny.bin"
    # Validation takes the sequences the data holds, up to -m * d/T: 32 tokens hold one of T=16; fewer
    # than T+1 hold none.
    expect_valid "-j 32 tokens: validation with 1 row of T at -b 2 -t 16" "${base[@]}" -j "$tmp/tiny.bin"
    expect_error "-j 32 tokens < T+1 = 33 at -t 32" "$tmp/tiny.bin" "${base[@]}" -t 32 -j "$tmp/tiny.bin"
    expect_valid "-v 0 never reads the validation file" "${base[@]}" -v 0 -j "$tmp/missing_val.bin"
    expect_valid "-i 32 tokens is enough at -b 1 -t 16" "${base[@]}" -b 1 -i "$tmp/tiny.bin" -j "$tmp/tiny.bin"
    expect_warning_no_gpu "-m 100: the validation data holds fewer sequences (warning)" "validating on those" "${base[@]}" -m 100

    # ---- tokenizer (-z)
    expect_error "-z missing file" "$tmp/missing_tok.bin" "${base[@]}" -z "$tmp/missing_tok.bin"
    expect_error "-z a folder" "$tmp" "${base[@]}" -z "$tmp"
    expect_error "-z empty file" "$tmp/tok_empty.bin" "${base[@]}" -z "$tmp/tok_empty.bin"
    expect_error "-z 100 bytes (truncated header)" "$tmp/tok_short.bin" "${base[@]}" -z "$tmp/tok_short.bin"
    expect_error "-z truncated inside the last token" "$tmp/tok_trunc.bin" "${base[@]}" -z "$tmp/tok_trunc.bin"
    expect_error "-z a byte after the last token" "$tmp/tok_long.bin" "${base[@]}" -z "$tmp/tok_long.bin"
    expect_error "-z corrupt (token of length 0)" "$tmp/tok_zero.bin" "${base[@]}" -z "$tmp/tok_zero.bin"
    expect_error "-z wrong magic" "$tmp/tok_magic.bin" "${base[@]}" -z "$tmp/tok_magic.bin"
    expect_error "-z wrong version" "$tmp/tok_version.bin" "${base[@]}" -z "$tmp/tok_version.bin"
    expect_error "-z eot token >= vocab size" "$tmp/tok_eot.bin" "${base[@]}" -z "$tmp/tok_eot.bin"
    expect_error "-z vocab size 2^31-1 in the header" "$tmp/tok_huge.bin" "${base[@]}" -z "$tmp/tok_huge.bin"
    expect_error "-z 1000 tokens, the model 1237" "$tmp/tok_1000.bin" "${base[@]}" -z "$tmp/tok_1000.bin"
    expect_error "-z a token file" "$tmp/train.bin" "${base[@]}" -z "$tmp/train.bin"

    # ---- output folder (-o); root ignores chmod, so: paths under a regular file, /proc, /sys
    expect_error "-o under a regular file" "$tmp/regular_file/out" "${base[@]}" -o "$tmp/regular_file/out"
    expect_error "-o a regular file" "$tmp/regular_file" "${base[@]}" -o "$tmp/regular_file"
    expect_error "-o /proc/train_gpt_test (cannot create)" "/proc/train_gpt_test" "${base[@]}" -o /proc/train_gpt_test
    expect_error "-o /proc/self (exists, not writable)" "/proc/self" "${base[@]}" -o /proc/self
    expect_error "-o /proc/self -y 1 (not writable)" "/proc/self" "${base[@]}" -o /proc/self -y 1

    # ---- -y 1: which checkpoint in the output folder is taken (host side; training needs the GPU).
    # Checkpoints written at -b 2 -t 16 like the runs; -x 100 goes past their steps.
    rbase=("${base[@]}" -x 100)
    ge=$([[ $prec == fp32 ]] && echo 0 || echo 2)  # the build's default -ge, as its checkpoints record it
    d=$tmp/resume_$prec
    mkdir -p "$d"
    gen model-crc "$M" "$d/model_00000010.bin"
    gen state "$d/state_00000010.bin" "$d/model_00000010.bin" 10 2 16 --data "$tmp/train.bin" --ge "$ge" --cursor 5
    expect_warn_valid "-y 1 resumes from the valid checkpoint" 0 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1
    expect_error "-x 5 below the checkpoint's step 10" "-x 5" "${rbase[@]}" -o "$d" -y 1 -x 5
    expect_warn_valid "-x 10 = the checkpoint's step (nothing to train) accepted" 0 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1 -x 10
    expect_warn_valid "-y 1 in an empty folder starts from -e" 0 "no checkpoint in" "${rbase[@]}" -o "$tmp/empty_out_$prec" -y 1
    expect_error "a new run (no -y 1) into a folder with checkpoints" "$d" "${rbase[@]}" -o "$d"
    cp "$d/model_00000010.bin" "$d/model_00000020.bin"
    edit "$d/state_00000010.bin" "$d/state_00000020.bin" --set-int 2=20 >/dev/null  # crc no longer matches
    expect_warn_valid "-y 1 skips a corrupt newest state file" 1 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1
    expect_stderr_has "  ... the warning names state_00000020.bin" '^warning: .*state_00000020\.bin'
    head -c 5000 "$d/state_00000010.bin" >"$d/state_00000030.bin.tmp.Ab12Cd"  # a write killed midway
    head -c 5000 "$d/model_00000010.bin" >"$d/model_00000030.bin.tmp.Xy34Zw"
    expect_warn_valid "-y 1 ignores temp files of a killed write" 1 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1
    gen state "$d/state_00000040.bin" "$d/model_00000010.bin" 40 2 16 --data "$tmp/train.bin" --ge "$ge"  # killed between the two files
    expect_warn_valid "-y 1 skips a state file without its model file" 2 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1
    expect_stderr_has "  ... the warning names model_00000040.bin" '^warning: .*model_00000040\.bin'
    edit "$d/model_00000010.bin" "$d/model_00000050.bin" --flip 3000
    gen state "$d/state_00000050.bin" "$d/model_00000010.bin" 50 2 16 --data "$tmp/train.bin" --ge "$ge"
    expect_warn_valid "-y 1 skips a corrupt newest model file" 3 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1
    expect_stderr_has "  ... the warning names model_00000050.bin" '^warning: .*model_00000050\.bin'
    expect_warn_valid "-y 1 -r 1 (checkpoint written at -r 0) resumes, warning" 4 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1 -r 1
    expect_stderr_has "  ... the warning names -r 0 and -r 1" "^warning: .*-ge $ge -r 0 -f8 0, this run has -ge $ge -r 1 -f8 0"
    if [[ $prec == bf16 ]]; then  # a checkpoint of an -f8 1 run, resumed in bf16: a warning (C = 39 takes no -f8 1 itself)
        d6=$tmp/resume_fp8
        mkdir -p "$d6"
        gen model-crc "$M" "$d6/model_00000010.bin"
        gen state "$d6/state_00000010.bin" "$d6/model_00000010.bin" 10 2 16 --data "$tmp/train.bin" --ge "$ge" --f8 1
        expect_warn_valid "-y 1 -f8 0 (checkpoint written at -f8 1) resumes, warning" 1 "resuming from step 10" "${rbase[@]}" -o "$d6" -y 1
        expect_stderr_has "  ... the warning names -f8 1 and -f8 0, and FP8" "^warning: .*-f8 1, this run has .*-f8 0: .*FP8's roundings"
    fi
    # Another run setup than the checkpoint's: an error (after the 3 warnings), never a fresh start
    # that would overwrite the run's checkpoints. Another -b is not one: with the same -d it resumes.
    expect_error_after_warnings "-y 1 -b 1 (written at -b 2, -d 32; -d now B*T = 16): error" 3 "resume with -d 32" "${rbase[@]}" -o "$d" -y 1 -b 1
    expect_warn_valid "-y 1 -b 1 -d 32 (another -b, the same -d) resumes" 3 "resuming from step 10" "${rbase[@]}" -o "$d" -y 1 -b 1 -d 32
    expect_error_after_warnings "-y 1 -t 8 (checkpoint written at -t 16): error" 3 "-t 16 -sd 1337 -sh 1: resume with the same flags" "${rbase[@]}" -o "$d" -y 1 -t 8
    expect_error_after_warnings "-y 1 -sd 7 (checkpoint written at -sd 1337): error" 3 "-sd 7" "${rbase[@]}" -o "$d" -y 1 -sd 7
    expect_error_after_warnings "-y 1 -sh 0 (checkpoint written at -sh 1): error" 3 "-sh 0" "${rbase[@]}" -o "$d" -y 1 -sh 0
    gen tokens "$tmp/train_other.bin" 3000 --seed 5
    expect_error_after_warnings "-y 1 -i other data of the same size: error" 3 "is not the training data" "${rbase[@]}" -o "$d" -y 1 -i "$tmp/train_other.bin"
    # The model the folder holds is the first thing to agree on: another -e is refused, naming both;
    # no -e, or an -e of the same model, resumes.
    ybase=(-i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok.bin" -t 16 -x 100 -u 1)
    expect_error_after_warnings "-y 1 -e d24 (the folder holds L=2 C=39): error naming both models" 3 \
        "holds the model L=2 NH=3 C=39 maxT=50 V=1237 Vp=1280; -e d24 is L=24 NH=16 C=1024" "${ybase[@]}" -b 2 -o "$d" -y 1 -e d24
    expect_error_after_warnings "-y 1 -e d24 -b 1: the model is refused first" 3 "-e d24 is L=24" "${ybase[@]}" -b 1 -o "$d" -y 1 -e d24
    gen tokens "$tmp/wide.bin" 3000 --seed 2
    "$PYTHON" gpt_reference.py init --model L=2,NH=3,C=42,V=1237,maxT=50 --seed 1 --out "$tmp/other_$prec.ckpt" >/dev/null
    expect_error_after_warnings "-y 1 -e another model file: error naming both models" 3 "is L=2 NH=3 C=42" "${ybase[@]}" -b 2 -o "$d" -y 1 -e "$tmp/other_$prec.ckpt"
    expect_warn_valid "-y 1 without -e resumes" 3 "resuming from step 10" "${ybase[@]}" -b 2 -o "$d" -y 1
    d3=$tmp/resume_broken_$prec
    mkdir -p "$d3"
    edit "$d/model_00000010.bin" "$d3/model_00000010.bin" --flip 3000
    cp "$d/state_00000010.bin" "$d3/state_00000010.bin"
    expect_error_after_warnings "-y 1 with no loadable checkpoint: error, not a fresh start" 1 "move them away" "${rbase[@]}" -o "$d3" -y 1
    # ---- an interrupted save: only a model file without its state file and a temp file remain
    d4=$tmp/resume_interrupted_$prec
    mkdir -p "$d4"
    gen model-crc "$M" "$d4/model_00000010.bin"
    head -c 3000 "$d4/model_00000010.bin" >"$d4/state_00000010.bin.tmp.Qw12Er"
    expect_warning_no_gpu "-y 1 after a first save cut short: starts over, warning" "no complete checkpoint" "${rbase[@]}" -o "$d4" -y 1
    expect_valid "a new run in a folder holding only what a cut-short save left" "${rbase[@]}" -o "$d4"

    d2=$tmp/resume_cursor_$prec
    mkdir -p "$d2"
    gen model-crc "$M" "$d2/model_00000010.bin"
    gen state "$d2/state_00000010.bin" "$d2/model_00000010.bin" 10 2 16 --data "$tmp/train.bin" --ge "$ge" --cursor 1000
    expect_error "-y 1: data position beyond the token file" "$tmp/train.bin" "${rbase[@]}" -o "$d2" -y 1
    # State files of an older train_gpt count windows of B*T tokens: in order they resume (window k is
    # sequence k*B; at 93, the end of the 93 windows of 32 tokens, the next epoch's start; 94 is past
    # them: a damaged file); shuffled they are refused.
    for case in "93 0" "94 0" "5 1"; do
        read -r cursor shuffle <<<"$case"
        d5=$tmp/resume_windows_${cursor}_$prec
        mkdir -p "$d5"
        gen model-crc "$M" "$d5/model_00000010.bin"
        gen state "$d5/state_00000010.bin" "$d5/model_00000010.bin" 10 2 16 --data "$tmp/train.bin" --ge "$ge" --windows \
            --cursor "$cursor" --shuffle "$shuffle"
    done
    expect_warn_valid "-y 1, an older file (windows) in order at its epoch end (93): resumes" 0 "resuming from step 10" \
        "${rbase[@]}" -sh 0 -o "$tmp/resume_windows_93_$prec" -y 1
    expect_error "-y 1, an older file in order at window 94 = sequence 188: beyond the data" "beyond the 187 sequences" \
        "${rbase[@]}" -sh 0 -o "$tmp/resume_windows_94_$prec" -y 1
    expect_error "-y 1, an older file with shuffled windows: refused, saying what to do" "start a new run from its model" \
        "${rbase[@]}" -o "$tmp/resume_windows_5_$prec" -y 1

    # ---- quiet traps made loud
    run_raw "${base[@]}" -b 8 -b 2
    why=""; [[ $rc -ne 1 || $nerr -ne 1 || $err1 != error:*"-b is given twice"* ]] && why="exit $rc: $err1"
    report "[$prec] a flag given twice (-b 8 -b 2): error" "$([[ -z $why ]] && echo 1 || echo 0)" "$why"
    for f in -o -i -j -e -z; do
        expect_error "$f '' (an empty path)" "flag $f: expected a path" "${base[@]}" $f ""
    done
    expect_error "-e d13 names the models there are" "d6, d12, d24, d36, d48" "${base[@]}" -e d13
    for f in -i -j -e -z; do
        for special in /dev/zero /dev/urandom "$tmp/fifo"; do
            started=$SECONDS
            expect_error "$f $special: not a regular file" "not a regular file" "${base[@]}" $f "$special"
            ((SECONDS - started > 5)) && report "[$prec]   ... $f $special took $((SECONDS - started)) s (at most 5)" 0 ""
        done
    done
    expect_warning_no_gpu "-u 1000 -x 3: the learning rate never peaks (warning)" "never reaches -l" "${base[@]}" -u 1000
    nbase=(-e "$tmp/pt.ckpt" -z "$tmp/tok.bin" -b 2 -t 16 -x 3 -u 1)  # no -i, no -j
    expect_valid "-i own shards (a glob) without -j: their validation shards are found" "${nbase[@]}" -i "$tmp/own/own_train_*.bin"
    expect_error "-i a file without -j and nothing beside it: error, not Tiny Shakespeare" "-j" "${nbase[@]}" -i "$tmp/own_noval/mine.bin"
    expect_valid "  ... accepted with -v 0" "${nbase[@]}" -i "$tmp/own_noval/mine.bin" -v 0
    expect_error "-i a glob that matches nothing" "no file matches" "${nbase[@]}" -i "$tmp/own/none_*.bin" -v 0
    expect_valid "-e an llm.c model file (version 3, fp32)" "${base[@]}" -e "$tmp/llmc_v3.bin"
    expect_valid "-e an llm.c model file (version 5, bf16)" "${base[@]}" -e "$tmp/llmc_v5.bin"
    expect_error "-e an llm.c model file of version 4" "version 4" "${base[@]}" -e "$tmp/llmc_v4.bin"
    expect_error "bad input with -o a new folder" "$tmp/missing.ckpt" "${base[@]}" -e "$tmp/missing.ckpt" -o "$tmp/new_$prec/run"
    report "[$prec]   ... leaves no folder behind" "$([[ ! -e $tmp/new_$prec ]] && echo 1 || echo 0)" "$tmp/new_$prec exists"
    expect_valid "-o a new folder, no GPU" "${base[@]}" -o "$tmp/new2_$prec/run"
    report "[$prec]   ... leaves no folder behind" "$([[ ! -e $tmp/new2_$prec ]] && echo 1 || echo 0)" "$tmp/new2_$prec exists"
    expect_error "-p with a missing tokenizer file" "$tmp/no_tokenizer.bin" "${base[@]}" -z "$tmp/no_tokenizer.bin" -p "hello"
done

echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
