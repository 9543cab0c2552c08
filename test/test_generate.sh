#!/usr/bin/env bash
# Your own text, trained on and generated from, on the GPU:
#   own text     data/prepare_text.py turns the project's docs/*.md (text that is not Shakespeare)
#                into validation and training shards; train_gpt_fp32 trains a small GPT-2 (C=256, 4
#                layers) on the shards through a glob, finding the validation shards beside them by
#                itself (no -j): its training loss must fall by more than 1 over 60 steps
#   greedy       generate_gpt_fp32 with temperature 0 from that run's folder gives exactly the tokens
#                gpt_reference.py generate gives for the same checkpoint and prompt (fp32, TF32 off);
#                also from an llm.c model file of the same weights (gpt_reference.py export --format llmc)
#   sampled      generate_gpt_fp32 with temperature 0.9, top-k 50 and a seed gives exactly the tokens
#                gpt_reference.py generate gives with the same seed (the sampler is the same, draw for
#                draw); at least 12 of the 48 are distinct, so the check compares real choices (greedy
#                decoding of so small a model mostly repeats one token)
#   sampling     generate_gpt_bf16 with the same seed twice: the same tokens; another seed: others
# Without a GPU every check is reported as skipped. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
checks=("own text: prepare_text.py" "own text: train_gpt on the shards" "greedy: CUDA = PyTorch" "greedy from an llm.c file"
        "sampled: CUDA = PyTorch" "sampling: seeded")
passed=0 failed=0 skipped=0
if ! nvidia-smi -L >/dev/null 2>&1; then
    for c in "${checks[@]}"; do echo "$c: skipped (no CUDA device)"; skipped=$((skipped + 1)); done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi
report() {
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-62s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-62s FAIL  %s\n' "$1" "$3"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ids_of() { sed -n 's/^tokens: //p' "$1"; }

# ---- own text: shards of the docs, small shards so that there are several
"$PYTHON" data/prepare_text.py docs --glob '*.md' --out-dir "$tmp/data" --name docs --val-tokens 4096 --shard-tokens 20000 \
    --tokenizer-out "$tmp/tok.bin" >"$tmp/prep.log" 2>&1
rc=$?
shards=$(ls "$tmp"/data/docs_train_*.bin 2>/dev/null | wc -l)
report "prepare_text.py: docs/*.md into shards" "$([[ $rc -eq 0 && $shards -ge 2 && -e $tmp/data/docs_val_000000.bin ]] && echo 1 || echo 0)" \
    "exit code $rc, $shards training shards; $(tail -n 1 "$tmp/prep.log")"
"$PYTHON" gpt_reference.py init --model L=4,NH=4,C=256,V=50257,maxT=256 --seed 3 --out "$tmp/init.ckpt" >/dev/null
timeout 300 ./train_gpt_fp32 -e "$tmp/init.ckpt" -i "$tmp/data/docs_train_*.bin" -z "$tmp/tok.bin" -b 8 -t 128 -x 60 -l 1e-3 -u 10 \
    -v 30 -m 2 -s 0 -o "$tmp/run" >"$tmp/train.log" 2>&1
rc=$?
first=$(sed -nE 's/^step +1\/60 \| loss ([^ ]+).*/\1/p' "$tmp/train.log")
last=$(sed -nE 's/^step +60\/60 \| loss ([^ ]+).*/\1/p' "$tmp/train.log")
vals=$(grep -c '^step .* | val loss' "$tmp/train.log")
ok=$(awk -v a="${first:-0}" -v b="${last:-99}" 'BEGIN { print (a - b > 1.0) ? 1 : 0 }')
report "train_gpt_fp32 on the shards (glob -i, validation found beside)" "$([[ $rc -eq 0 && $ok -eq 1 && $vals -ge 2 ]] && echo 1 || echo 0)" \
    "exit code $rc, loss $first -> $last, $vals validations"

# ---- greedy: ours (fp32) against PyTorch, same checkpoint and prompt
model=$tmp/run/model_00000060.bin
prompt="The LayerNorm"
timeout 120 ./generate_gpt_fp32 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0 -ids 1 >"$tmp/ours.txt" 2>"$tmp/ours.err"
rc1=$?
GPT_MIRROR=${GPT_MIRROR:-} timeout 300 "$PYTHON" gpt_reference.py generate -e "$model" --prompt "$prompt" -n 48 --temperature 0 \
    --device cuda >"$tmp/torch.txt" 2>"$tmp/torch.err"
rc2=$?
ours=$(ids_of "$tmp/ours.txt") theirs=$(ids_of "$tmp/torch.txt")
report "greedy, 48 tokens: generate_gpt_fp32 = gpt_reference.py" "$([[ $rc1 -eq 0 && $rc2 -eq 0 && -n $ours && $ours == "$theirs" ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; ours: ${ours:0:60}...; PyTorch: ${theirs:0:60}...; $(tail -n 1 "$tmp/ours.err")"
"$PYTHON" gpt_reference.py export "$model" --format llmc --dtype fp32 --out "$tmp/llmc.bin" >/dev/null 2>&1
timeout 120 ./generate_gpt_fp32 -e "$tmp/llmc.bin" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0 -ids 1 >"$tmp/llmc.txt" 2>&1
report "greedy from the llm.c model file of the same weights" "$([[ -n $ours && $(ids_of "$tmp/llmc.txt") == "$ours" ]] && echo 1 || echo 0)" ""

# ---- sampled: ours (fp32) against PyTorch, same seed
timeout 120 ./generate_gpt_fp32 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0.9 -k 50 -sd 5 -ids 1 \
    >"$tmp/ours_s.txt" 2>"$tmp/ours_s.err"
rc1=$?
GPT_MIRROR=${GPT_MIRROR:-} timeout 300 "$PYTHON" gpt_reference.py generate -e "$model" --prompt "$prompt" -n 48 --temperature 0.9 \
    --top-k 50 --seed 5 --device cuda >"$tmp/torch_s.txt" 2>"$tmp/torch_s.err"
rc2=$?
ours=$(ids_of "$tmp/ours_s.txt") theirs=$(ids_of "$tmp/torch_s.txt")
distinct=$(tr ' ' '\n' <<<"$ours" | grep . | sort -u | wc -l)
report "sampled, 48 tokens, seed 5: generate_gpt_fp32 = gpt_reference.py" \
    "$([[ $rc1 -eq 0 && $rc2 -eq 0 && -n $ours && $ours == "$theirs" && $distinct -ge 12 ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; $distinct distinct; ours: ${ours:0:60}...; PyTorch: ${theirs:0:60}..."

# ---- seeded sampling
n=0
for s in 5 5 6; do
    n=$((n + 1))
    timeout 120 ./generate_gpt_bf16 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 32 -tp 0.9 -k 50 -sd $s -ids 1 >"$tmp/s$s.$n.txt" 2>/dev/null
done
mapfile -t runs < <(for f in "$tmp"/s5.*.txt; do ids_of "$f"; done)
other=$(for f in "$tmp"/s6.*.txt; do ids_of "$f"; done)
report "sampling: seed 5 twice gives the same tokens, seed 6 others" \
    "$([[ ${#runs[@]} -eq 2 && -n ${runs[0]} && ${runs[0]} == "${runs[1]}" && -n $other && $other != "${runs[0]}" ]] && echo 1 || echo 0)" \
    "${runs[0]:0:50}..."
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
